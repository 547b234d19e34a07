#!/usr/bin/env python3
"""The batch-1 step's instrumented kernels in time order, from bench/decode_clocks.patch's rows.

A build with the patch, run with MOESERVE_CLOCKS_FILE=PREFIX, writes PREFIX.<file> (gemv, moe,
norm, combine): a row a block of each recorded launch ("slot label t0 block sm" and seven stamps
in µs after the launch's first pdl_wait return, -1 where not stamped). This prints the launches of
the last WINDOW µs (one replay of the step's graph: its layers' kernels), each with when its wait
returned, when its median and last block exited, its run (wait to last exit), the gap from the
kernel before (the boundary, where the two are adjacent in the layer) and its median stamps 2-5.

  python3 bench/clocks_timeline.py PREFIX [WINDOW]
"""
import statistics
import sys


def launches(prefix):
    found = {}
    for file in ("gemv", "moe", "norm", "combine"):
        try:
            lines = open(f"{prefix}.{file}").read().split("\n")
        except FileNotFoundError:
            continue
        for line in filter(None, lines):
            f = line.split()
            launch = found.setdefault((file, f[0]), {"name": f"{file}:{f[1]}", "t0": int(f[2]) / 1e3, "rows": []})
            launch["rows"].append([float(x) for x in f[5:12]])
    return sorted(found.values(), key=lambda d: d["t0"])


def main(prefix, window=120.0):
    all_launches = launches(prefix)
    end = all_launches[-1]["t0"]
    shown = [d for d in all_launches if d["t0"] > end - window]
    base, prev = shown[0]["t0"], None
    print(f"{'kernel':34s} {'blocks':>6s} {'waited':>8s} {'exit med':>8s} {'exit max':>8s} {'run':>6s} {'gap':>6s}  stamps 2-5 (median)")
    for d in shown:
        col = [[r[i] for r in d["rows"] if r[i] != -1.0] for i in range(7)]
        if not col[6]:
            continue
        at = d["t0"] - base
        gap = at - prev if prev is not None else 0.0
        stamps = " ".join(f"{statistics.median(c):.2f}" if c else "-" for c in col[2:6])
        print(f"{d['name'][:34]:34s} {len(d['rows']):6d} {at:8.2f} {at + statistics.median(col[6]):8.2f} "
              f"{at + max(col[6]):8.2f} {max(col[6]):6.2f} {gap:6.2f}  {stamps}")
        prev = at + max(col[6])


if __name__ == "__main__":
    main(sys.argv[1], *(float(a) for a in sys.argv[2:3]))
