#!/usr/bin/env python3
"""ncu_sass.py: where one kernel's warps spend their samples, from ncu's SASS page as CSV.

Take the page on the GPU machine (bench/results/raw/2026-11-30s44/run-ncu.sh does both steps):

  ncu --clock-control none --cache-control none -k regex:ds_kernel --launch-skip 4 --launch-count 1 \
      --section WarpStateStats --section SourceCounters --import-source yes -o prof fp4serve bench ...
  ncu -i prof.ncu-rep --page source --csv --print-source sass > sass.csv

then `dev/ncu_sass.py sass.csv[.gz] [--top N]` prints:
  - the warp-state samples of the whole kernel by reason;
  - its runs of >= 8 consecutive instructions executed the same number of times (a loop body, or
    a phase's straight code), the most sampled first: their share of the samples, the executed
    count (iterations times the warps that ran them), the instruction mix and the main reasons.
    Executed counts tell phases apart: a tile loop's body runs once a ring stage a warp;
  - the N instructions with the most samples and their two main reasons.

Why: session 44 found by these counts that a dense step's tile-loop iteration (346 instructions,
16 HMMA) takes ~0.52 us at the issue rate ncu measured, against the 0.69-0.75 us a stage the weight
streams pace (bench/results/2026-11-30-h200-session44.md).
"""
import argparse
import collections
import csv
import gzip
import sys

ALL = "Warp Stall Sampling (All Samples)"
EXE = "Instructions Executed"


def load(fn):
    op = gzip.open if fn.endswith(".gz") else open
    with op(fn, "rt") as f:
        lines = f.read().splitlines()
    head = [k for k, line in enumerate(lines) if line.startswith('"Address"')]
    if not head:
        sys.exit(f"{fn}: no SASS page header (\"Address\",...) found")
    return list(csv.DictReader(lines[head[0]:]))


def num(r, k):
    try:
        return int(r.get(k) or 0)
    except ValueError:
        return 0


def opcode(src):
    w = src.split()
    if w and w[0].startswith("@"):
        w = w[1:]
    return w[0].rstrip(";") if w else "?"


def runs(rows, least=8):
    """runs of at least `least` consecutive instructions executed the same number of times (> 0):
    a loop body between its waits and branches, or a phase's straight code"""
    out, i = [], 0
    while i < len(rows):
        j, e = i, num(rows[i], EXE)
        while j + 1 < len(rows) and num(rows[j + 1], EXE) == e:
            j += 1
        if e > 0 and j - i + 1 >= least:
            out.append((i, j, e))
        i = j + 1
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="ncu's SASS page as CSV (.gz read as gzip)")
    ap.add_argument("--top", type=int, default=20, help="runs and instructions listed (default 20)")
    args = ap.parse_args()
    top = args.top
    rows = load(args.csv)
    keys = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
    tot = sum(num(r, ALL) for r in rows) or 1
    print(f"{len(rows)} instructions, {tot} samples")
    agg = {k[6:]: sum(num(r, k) for r in rows) for k in keys}
    for k, v in sorted(agg.items(), key=lambda x: -x[1]):
        if v:
            print(f"  {k:20s} {100 * v / tot:5.1f} %")
    print("runs (rows, samples, executed, instructions: mix [reasons])")
    rs = runs(rows)
    rs.sort(key=lambda x: -sum(num(rows[k], ALL) for k in range(x[0], x[1] + 1)))
    for i, j, e in rs[:top]:
        seg = rows[i:j + 1]
        s = sum(num(r, ALL) for r in seg)
        mix = collections.Counter(opcode(r["Source"]) for r in seg).most_common(6)
        why = collections.Counter()
        for r in seg:
            for k in keys:
                why[k[6:]] += num(r, k)
        w = ", ".join(f"{k} {100 * v / max(s, 1):.0f} %" for k, v in why.most_common(3))
        print(f"  {i:5d}-{j:5d} {100 * s / tot:5.1f} % x{e:<9d} {j - i + 1:4d} insns: "
              + " ".join(f"{o} {n}" for o, n in mix) + f"  [{w}]")
    print(f"top {top} instructions")
    for i in sorted(range(len(rows)), key=lambda i: -num(rows[i], ALL))[:top]:
        r = rows[i]
        why = sorted(((num(r, k), k[6:]) for k in keys), reverse=True)[:2]
        print(f"  {i:5d} {100 * num(r, ALL) / tot:4.1f} % x{num(r, EXE):<8d} {r['Source'].strip()[:56]:56s} "
              + ", ".join(f"{k} {v}" for v, k in why if v))


if __name__ == "__main__":
    main()
