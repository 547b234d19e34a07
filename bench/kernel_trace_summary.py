#!/usr/bin/env python3
"""Per-step timelines from bench/kernel_trace.cpp's lines (kernel start and end times on the GPU).

A CUDA graph's replays share its graph id; a replay ends where a node id comes round again. For
each graph with at least --min-replays replays (decode steps are one graph a batch size, replayed
each step) it prints the replays' GPU spans and, for the median one, each kernel in start order
with its duration and the gap since the kernels before it ended (negative: it overlapped them,
as programmatic dependent launch allows), then the kernels' time summed by name.

  python3 bench/kernel_trace_summary.py trace.tsv [--min-replays 3] [--timeline 60]
"""
import argparse
import re
import statistics
from collections import defaultdict


def short(name):
    # Namespaces off, template arguments kept (they tell variants apart), at most 80 characters:
    # "ms::cuda::(anonymous namespace)::gemv_kernel<true, ...>" -> "gemv_kernel<true, ...>"
    s = name.replace("(anonymous namespace)::", "")
    s = re.sub(r"\b[A-Za-z_]\w*::", "", s)
    return s if len(s) <= 80 else s[:77] + "..."


def read(path):
    rows = []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                continue
            p = line.rstrip("\n").split("\t")
            if len(p) < 9:
                continue
            rows.append({"start": int(p[0]), "end": int(p[1]), "graph": int(p[2]), "node": int(p[3]),
                         "grid": p[4], "block": p[5], "smem": p[6], "regs": int(p[7]), "name": p[8]})
    return rows


def replays(records):
    out, cur, seen = [], [], set()
    for r in sorted(records, key=lambda r: r["start"]):
        if r["node"] in seen:
            out.append(cur)
            cur, seen = [], set()
        cur.append(r)
        seen.add(r["node"])
    if cur:
        out.append(cur)
    return out


def busy_ns(rs):
    total, end = 0, None
    for r in sorted(rs, key=lambda r: r["start"]):
        if end is None or r["start"] >= end:
            total += r["end"] - r["start"]
            end = r["end"]
        elif r["end"] > end:
            total += r["end"] - end
            end = r["end"]
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--min-replays", type=int, default=3)
    ap.add_argument("--timeline", type=int, default=60, help="kernels of the median replay listed (0: all)")
    a = ap.parse_args()
    rows = read(a.trace)
    graphs = defaultdict(list)
    for r in rows:
        graphs[r["graph"]].append(r)
    eager = graphs.pop(0, [])
    print(f"{len(rows)} kernels: {len(eager)} launched directly, {len(rows) - len(eager)} from {len(graphs)} graphs")
    for gid, recs in sorted(graphs.items()):
        reps = replays(recs)
        if len(reps) < a.min_replays:
            continue
        spans = [(rep[-1]["end"] - rep[0]["start"]) / 1e3 for rep in reps]
        med = sorted(range(len(reps)), key=lambda i: spans[i])[len(reps) // 2]
        rep = reps[med]
        kern = sum(r["end"] - r["start"] for r in rep) / 1e3
        print(f"\ngraph {gid}: {len(reps)} replays of {len(rep)} kernels; GPU span µs min / median / max "
              f"{min(spans):.1f} / {statistics.median(spans):.1f} / {max(spans):.1f}")
        print(f"  median replay: span {spans[med]:.1f} µs, kernels busy {busy_ns(rep) / 1e3:.1f} µs, "
              f"sum of kernel durations {kern:.1f} µs")
        t0, end = rep[0]["start"], rep[0]["start"]
        n = len(rep) if a.timeline == 0 else min(a.timeline, len(rep))
        print(f"  {'#':>4} {'at µs':>8} {'dur µs':>8} {'gap µs':>8}  kernel (grid / block / smem)")
        for i, r in enumerate(rep):
            if i < n:
                print(f"  {i:4d} {(r['start'] - t0) / 1e3:8.2f} {(r['end'] - r['start']) / 1e3:8.2f} "
                      f"{(r['start'] - end) / 1e3:8.2f}  {short(r['name'])} ({r['grid']} / {r['block']} / {r['smem']})")
            end = max(end, r["end"])
        by = defaultdict(lambda: [0, 0.0])
        for r in rep:
            b = by[short(r["name"])]
            b[0] += 1
            b[1] += (r["end"] - r["start"]) / 1e3
        print(f"  {'calls':>6} {'µs':>9}  kernel (median replay, by total)")
        for name, (c, us) in sorted(by.items(), key=lambda kv: -kv[1][1]):
            print(f"  {c:6d} {us:9.1f}  {name}")
    if eager:
        by = defaultdict(lambda: [0, 0.0])
        for r in eager:
            b = by[short(r["name"])]
            b[0] += 1
            b[1] += (r["end"] - r["start"]) / 1e3
        print("\nlaunched directly (all of them), by total:")
        for name, (c, us) in sorted(by.items(), key=lambda kv: -kv[1][1])[:25]:
            print(f"  {c:6d} {us:11.1f} µs  {name}")


if __name__ == "__main__":
    main()
