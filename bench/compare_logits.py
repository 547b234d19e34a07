#!/usr/bin/env python3
"""Compares `moeserve logits` files (F32 [n, vocab], tensor `logits`) against a baseline file:
relative error ||a - b|| / ||b||, the share of positions whose argmax agrees, and the share of
positions whose argmax agrees where the baseline's top-2 margin is at least 5e-2 (what bf16 can
resolve). Reads safetensors with numpy only (the GPU machine has no safetensors package).
   compare_logits.py BASELINE OTHER [OTHER...]"""
import json
import struct
import sys

import numpy as np


def load(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        meta = header["logits"]
        assert meta["dtype"] == "F32", meta
        begin, end = meta["data_offsets"]
        f.seek(8 + n + begin)
        return np.frombuffer(f.read(end - begin), dtype=np.float32).reshape(meta["shape"])


def main():
    base = load(sys.argv[1])
    top2 = np.sort(base, axis=1)[:, -2:]
    resolvable = (top2[:, 1] - top2[:, 0]) >= 5e-2
    for path in sys.argv[2:]:
        other = load(path)
        rel = float(np.linalg.norm(other - base) / np.linalg.norm(base))
        same = base.argmax(1) == other.argmax(1)
        print(f"{path}: rel error {rel:.3e}, argmax equal at {same.mean():.1%} of {len(same)} positions, "
              f"{same[resolvable].mean() if resolvable.any() else float('nan'):.1%} of the {int(resolvable.sum())} "
              f"with a margin >= 5e-2")


if __name__ == "__main__":
    main()
