#!/usr/bin/env python3
"""The decode attention's blocks in a timeline recording (timeline.cuh, FP4S_TL; marks from
attention_mma.cuh): per launch, times in us from its first block's release from the PDL wait, medians over the blocks
and the last block of each (token, KV head) to finish, then medians over the launches:
  1 past the PDL wait, 2 q ready (prologue: q/k norm, RoPE, the row written), 4 tiles done,
  then for a block that has the whole range (one split): 6 the warps' outputs in shared memory,
  5 the output written; for a split range: 5 partials written, 6 the last block's counter seen,
  7 its merge done; 3 exit.
usage: attn_marks.py FILE[.gz]"""
import collections
import statistics
import sys

from timeline import first_replay

recs = first_replay(sys.argv[1], 3)
launches = []
by = collections.defaultdict(list)
for r in sorted(recs, key=lambda r: r['t'][0]):
    by[r['tag']].append(r)
for tag, rs in by.items():  # a block index seen again starts the next launch of this tag
    seen, cur = set(), []
    for r in rs:
        if r['blk'] in seen:
            launches.append(cur)
            seen, cur = set(), []
        seen.add(r['blk'])
        cur.append(r)
    launches.append(cur)
med = lambda v: statistics.median(v) if v else float('nan')
names = [(1, "wait"), (2, "q"), (4, "tiles"), (5, "merged"), (6, "last"), (7, "mrg"), (3, "exit")]
agg = collections.defaultdict(list)
for rs in launches:
    t0 = min(r['t'][1] for r in rs if r['t'][1])
    for k, n in [(0, "entry")] + names:
        v = [(r['t'][k] - t0) / 1000 for r in rs if r['t'][k]]
        if v:
            agg["med " + n].append(med(v))
            agg["max " + n].append(max(v))
print("attention launches: %d, blocks a launch %s" % (len(launches), sorted(set(len(r) for r in launches))))
for k, n in [(0, "entry")] + names:
    if agg["med " + n]:
        print("%-6s median block %6.2f   latest block %6.2f" % (n, med(agg["med " + n]), med(agg["max " + n])))
