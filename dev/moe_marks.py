#!/usr/bin/env python3
"""The one-launch MoE block's phases in a timeline recording (timeline.cuh, FP4S_TL; marks from
moe_tma.cu, in its blocks that do not route): per launch, times in us from its first block's
release from the PDL wait, the median and the latest block, then medians over the launches:
  1 past the PDL wait, 2 routing seen, 5 gate|up done (x staged and tiles), 6 the slot's gate|up
  blocks all done, 7 down x staged, 4 down tiles done, 3 exit (the combine done, by the last
  of a row tile's slots).
Then the median block's phase lengths.
usage: moe_marks.py FILE[.gz]"""
import collections
import statistics
import sys

from timeline import first_replay

recs = first_replay(sys.argv[1], 2)
by = collections.defaultdict(list)
for r in recs:
    by[r['tag']].append(r)
med = lambda v: statistics.median(v) if v else float('nan')
names = [(0, "entry"), (1, "wait"), (2, "routed"), (5, "gu done"), (6, "slot done"), (7, "dn staged"),
         (4, "dn done"), (3, "exit")]
agg = collections.defaultdict(list)
phases = collections.defaultdict(list)
for tag, rs in by.items():
    t0 = min(r['t'][1] for r in rs if r['t'][1])
    work = [r for r in rs if r['t'][7]]  # blocks that ran both phases without routing
    for k, n in names:
        v = [(r['t'][k] - t0) / 1000 for r in work if r['t'][k]]
        if v:
            agg["med " + n].append(med(v))
            agg["max " + n].append(max(v))
    for a, b, n in [(1, 2, "wait->routed"), (2, 5, "gu staging+tiles"), (5, 6, "slot wait"), (6, 7, "dn staging"),
                    (7, 4, "dn tiles"), (4, 3, "arrive+combine")]:
        phases[n].append(med([(r['t'][b] - r['t'][a]) / 1000 for r in work if r['t'][a] and r['t'][b]]))
print("moe_tma launches: %d, blocks a launch %s" % (len(by), sorted(set(len(r) for r in by.values()))))
for k, n in names:
    if agg["med " + n]:
        print("%-10s median block %6.2f   latest block %6.2f" % (n, med(agg["med " + n]), med(agg["max " + n])))
print("phases of a block (medians):", "  ".join("%s %.2f" % (n, med(v)) for n, v in phases.items()))
