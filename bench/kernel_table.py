#!/usr/bin/env python3
"""Per-kernel GPU time of one bench-one-batch run under Nsight Compute (bench/cuda_kernel_profile.sh).

    bench/kernel_table.py ncu-qwen3-b1.csv [more.csv ...]

The run's launches split into steps at each embedding launch (every step starts with the token
embedding): the warm-up prefill, the timed prefill, then decode steps. Prints, for the timed
prefill and the mean decode step, each kernel's launches, total time and share of the step,
with the grid of its longest launch."""
import csv
import re
import sys
from collections import defaultdict

UNIT = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}


def short_name(name):
    name = re.sub(r"\(.*$", "", name)  # drop the argument list
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"ms::(cuda::)?(<unnamed>::|\(anonymous namespace\)::)?", "", name)
    return name[:70]


def launches(path):
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own notes before the table
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        us = float(r["Metric Value"].replace(",", "")) * UNIT[r["Metric Unit"]]
        rows.append((short_name(r["Kernel Name"]), us, r["Grid Size"], r["Block Size"]))
    return rows


def steps(rows):
    out = []
    for row in rows:
        if row[0].startswith("embedding_kernel") or not out:
            out.append([])
        out[-1].append(row)
    return out


def table(title, step_list):
    per = defaultdict(lambda: [0, 0.0, 0.0, ""])
    for s in step_list:
        for name, us, grid, block in s:
            e = per[name]
            e[0] += 1
            e[1] += us
            if us > e[2]:
                e[2], e[3] = us, f"{grid}x{block}"
    n = len(step_list)
    total = sum(e[1] for e in per.values()) / n
    print(f"\n## {title}: {total:.1f} us of kernels per step ({n} step(s) averaged)")
    print(f"| kernel | launches/step | us/step | share | longest launch us (grid x block) |")
    print("|---|---|---|---|---|")
    for name, (cnt, us, mx, cfg) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"| {name} | {cnt / n:g} | {us / n:.1f} | {100 * us / n / total:.1f}% | {mx:.1f} ({cfg}) |")


def main():
    for path in sys.argv[1:]:
        s = steps(launches(path))
        print(f"# {path}: {len(s)} steps")
        if len(s) >= 3:
            table("prefill (timed)", [s[1]])
            table("decode", s[2:])
        else:
            table("all", s)


if __name__ == "__main__":
    main()
