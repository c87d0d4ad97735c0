#!/usr/bin/env python3
"""Where the one-launch MoE block's gate|up phase ends late, by SM (timeline.cuh records, FP4S_TL;
moe_tma.cu's marks): for each launch of the first replay, the blocks that share an SM, their
(slot, blockIdx.x), and when their gate|up tiles were done (mark 5, us after the launch's first
release). Prints how often an SM holds two blocks with the same blockIdx.x, and the gate|up done
time by the SM's tile count (strided tiles: slot rows / 16 over gridDim.x blocks).
--pairs: the gate|up's first tiles as moe_tma.cu's mt_first (even blocks the first half, odd ones
the second), else blockIdx.x. Tiles claimed after the first (FP4S_MOE_CLAIM, the default) are not
modelled: with claims on, the counts are the static order's, not what the blocks took.
usage: moe_sm.py FILE[.gz] ROWS_GU (rows of a slot's gate|up, e.g. 5760) [--pairs]"""
import collections
import statistics
import sys

from timeline import first_replay


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    recs = first_replay(sys.argv[1], 2)
    rows = int(sys.argv[2])
    pairs = "--pairs" in sys.argv
    by = collections.defaultdict(list)
    for r in recs:
        by[r["tag"]].append(r)
    same = total = 0
    done_by_load = collections.defaultdict(list)
    for tag, rs in by.items():
        n = len(rs)
        gx = n // 4  # gridDim.x = blocks a slot: 4 slots (gpt-oss)
        tiles = (rows + 15) // 16
        t0 = min(r["t"][1] for r in rs if r["t"][1])
        sm = collections.defaultdict(list)
        for r in rs:
            sm[r["sm"]].append(r)
        for s, bl in sm.items():
            xs = [r["blk"] % gx for r in bl]
            if pairs:
                xs = [(gx + 1) // 2 + x // 2 if x & 1 else x // 2 for x in xs]
            if len(bl) == 2:
                total += 1
                same += xs[0] == xs[1]
            load = sum((tiles - x + gx - 1) // gx for x in xs)
            for r in bl:
                if r["t"][5]:
                    done_by_load[load].append((r["t"][5] - t0) / 1000)
    print("SMs with two blocks: %d, of them with the same blockIdx.x: %d" % (total, same))
    for load in sorted(done_by_load):
        v = done_by_load[load]
        print("SM's gate|up tiles %2d: %4d blocks, done median %.2f us, max %.2f" %
              (load, len(v), statistics.median(v), max(v)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
