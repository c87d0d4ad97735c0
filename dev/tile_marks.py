#!/usr/bin/env python3
"""gemv_tma.cu's tiles in a timeline recording (timeline.cuh, FP4S_TL; a build with
-DFP4S_DIAG_TL): per position in the layer, medians over the layers of each launch's median block:
  stage   x staged (mark 2) minus past the PDL wait (mark 1)
  bytes   the first stage's bytes seen by the consumers (mark 4) minus past the wait
  tile1   the first tile's epilogue done (mark 5) minus the later of marks 2 and 4
  tile2   the second tile's (mark 6) minus the first's
  rest    the last tile's (mark 7) minus the second's (or the first's), and the tiles after it
  exit    the block's exit (mark 3) minus mark 7 (the MoE combine, where the launch has one)
and blocks, the launch's recorded blocks. In microseconds.
usage: tile_marks.py FILE[.gz]"""
import statistics
import sys

from timeline import launches, replays


def med(v):
    v = [x for x in v if x == x]
    return statistics.median(v) if v else float("nan")


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    per = {}
    for _, recs in replays(sys.argv[1]):
        ls = [l["recs"] for l in launches(recs)]
        att = [i for i, b in enumerate(ls) if b[0]["kid"] == 3]
        if len(att) < 2:
            continue
        P = att[1] - att[0]
        for a in att:
            for off in range(-1, P - 1):
                if not 0 <= a + off < len(ls):
                    continue
                b = ls[a + off]
                if b[0]["kid"] != 1 or len(b[0]["t"]) != 8:
                    continue
                us = lambda x, y: (x - y) / 1e3 if x and y else float("nan")
                row = {
                    "stage": med([us(r["t"][2], r["t"][1]) for r in b]),
                    "bytes": med([us(r["t"][4], r["t"][1]) for r in b]),
                    "tile1": med([us(r["t"][5], max(r["t"][2], r["t"][4])) for r in b]),
                    "tile2": med([us(r["t"][6], r["t"][5]) for r in b]),
                    "rest": med([us(r["t"][7], r["t"][6] or r["t"][5]) for r in b]),
                    "exit": med([us(r["t"][3], r["t"][7]) for r in b]),
                    "blocks": len(b),
                }
                per.setdefault(off, []).append(row)
    print("%-6s %6s %7s %7s %7s %7s %7s %7s" % ("offset", "blocks", "stage", "bytes", "tile1", "tile2", "rest", "exit"))
    for off in sorted(per):
        v = per[off]
        print("%-6d %6d %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f  (n=%d)" % (
            off, int(med([x["blocks"] for x in v])), med([x["stage"] for x in v]), med([x["bytes"] for x in v]),
            med([x["tile1"] for x in v]), med([x["tile2"] for x in v]), med([x["rest"] for x in v]),
            med([x["exit"] for x in v]), len(v)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
