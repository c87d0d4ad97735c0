#!/usr/bin/env python3
"""ncu_step.py: one decode step's kernels, from an ncu raw CSV of `fp4serve bench`.

Take the CSV on the GPU machine (the kernels isolated, so PDL overlap is lost, but the caches and
clocks left alone):

  FP4S_NO_GRAPH=1 ncu --cache-control none --clock-control none \
      --metrics gpu__time_duration.sum,launch__grid_size --csv --page raw \
      --launch-count 2500 fp4serve bench -m MODEL -p 0 -n 5 --reps 1 > step.csv

then `dev/ncu_step.py step.csv`: a step starts at each embed_kernel; for the second-to-last
complete step it prints every kernel's median and total us by (name, grid), then the step's first
and last kernels in order. The sum of a step is the isolated time; compare it with the tg ms/token
of the same build to see what the chain overlaps.
"""
import collections
import csv
import re
import statistics
import sys


def load(fn):
    lines = open(fn).read().splitlines()
    head = [k for k, line in enumerate(lines) if line.startswith('"ID"')]
    if not head:
        sys.exit(f"{fn}: no ncu CSV header (\"ID\",...) found")
    rows = list(csv.reader(lines[head[0]:]))
    h = rows[0]
    body = [x for x in rows[2:] if x and x[0].isdigit()]
    ki, gi, ti = h.index("Kernel Name"), h.index("Grid Size"), h.index("gpu__time_duration.sum")
    name = lambda s: re.sub(r"\(.*", "", s).replace("void ", "")
    return [(name(x[ki]), x[gi], float(x[ti].replace(",", "")) / 1000) for x in body]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for fn in sys.argv[1:]:
        k = load(fn)
        starts = [i for i, x in enumerate(k) if x[0].startswith("embed")]
        if len(starts) < 3:
            sys.exit(f"{fn}: fewer than 3 steps (embed_kernel launches)")
        steps = [k[a:b] for a, b in zip(starts, starts[1:])]
        print(fn, "steps", len(steps), "kernels", [len(s) for s in steps],
              "isolated us", [round(sum(t for _, _, t in s), 1) for s in steps])
        s = steps[-2]
        agg = collections.OrderedDict()
        for n, g, t in s:
            agg.setdefault((n, g), []).append(t)
        print(f"{'kernel':60s} {'grid':14s} {'n':>4s} {'med us':>8s} {'sum us':>8s}")
        for (n, g), ts in sorted(agg.items(), key=lambda kv: -sum(kv[1])):
            print(f"{n[:60]:60s} {g:14s} {len(ts):4d} {statistics.median(ts):8.2f} {sum(ts):8.1f}")
        print("first kernels of the step:")
        for n, g, t in s[:16]:
            print(f"  {n[:40]:40s} {g:14s} {t:7.2f}")
        print("last kernels of the step:")
        for n, g, t in s[-6:]:
            print(f"  {n[:40]:40s} {g:14s} {t:7.2f}")


if __name__ == "__main__":
    main()
