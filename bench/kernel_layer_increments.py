#!/usr/bin/env python3
"""Mean time each kernel of a decoder layer adds to a graphed decode step.

Reads the median-replay timelines that bench/kernel_trace_summary.py prints (one file each) and,
taking the layers to start at each MoE combine+norm kernel (rms_norm_rows_kernel<..., MoeAddend...>,
or at batch 1 moe_slabs_add_rms_norm_kernel or moe_slabs_cluster_norm_kernel, unless it follows
merge_project_kernel: then it is the post-attention norm),
prints for each kernel of a layer its end minus the end of the kernel before it, averaged over the
whole layers of the replay: the time the chain spends on that kernel after its predecessor is done.

  python3 bench/kernel_layer_increments.py kts-after-qwen3-1.txt [more timelines ...]
"""
import re
import sys

ROW = re.compile(r"\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+(-?[\d.]+)\s+(.*)")


def kernels(path):
    rows = []
    with open(path) as f:
        for line in f:
            m = ROW.match(line)
            if m:
                rows.append((float(m.group(2)) + float(m.group(3)), m.group(5)))
    return rows


def main(paths):
    for path in paths:
        rows = kernels(path)
        # The slab norm after merge_project_kernel is the post-attention norm, not a layer's start.
        starts = [i for i, (_, name) in enumerate(rows)
                  if ("MoeAddend" in name or "moe_slabs_" in name)
                  and not (i > 0 and "merge_project" in rows[i - 1][1])]
        if len(starts) < 2:
            print(f"{path}: fewer than two MoE layers in the timeline")
            continue
        per = starts[1] - starts[0]
        sums = [0.0] * per
        for a in starts[:-1]:
            for j in range(1, per + 1):
                sums[j - 1] += rows[a + j][0] - rows[a + j - 1][0]
        n = len(starts) - 1
        print(f"{path}: {n} layers, {sum(sums) / n:.2f} us a layer")
        for j in range(per):
            print(f"  {sums[j] / n:7.2f} us  {rows[starts[0] + 1 + j][1][:90]}")


if __name__ == "__main__":
    main(sys.argv[1:])
