#!/usr/bin/env python3
"""The MoE router's last block in a timeline recording (timeline.cuh, FP4S_TL): per layer, when it
arrived on the counter, read the logits back, had the softmax and keys, the ranks, the weights, and
left, against the other blocks. Kernel 5 (moe.cu's norm_route) or, with --kid 2, moe_tma.cu's
one-launch MoE (its last router block: the one with mark 4), or with --kid 15 gemv_fp4.cu's
gemv_fast_rt_tail (mark 2 there: every block's arrival on the counter; 4: the logits and x1 done).
usage: router_marks.py FILE[.gz] [--kid 5|2|15]"""
import collections
import statistics
import sys

from timeline import first_replay

kid = int(sys.argv[sys.argv.index("--kid") + 1]) if "--kid" in sys.argv else 5
recs = first_replay(sys.argv[1], kid)
g = collections.defaultdict(list)
for r in recs:
    g[r['tag']].append(r)
print("kernel %s, times in us from the first block's release; marks: 2 arrive on the counter, 4 logits read back,"
      " 6 softmax and keys, 7 ranked, 5 weights written, 3 exit" % kid)
cols = collections.defaultdict(list)
for tag, rs in list(g.items())[3:]:
    if not any(r['t'][1] for r in rs):  # a launch of the kernel without the marks (gemv_fast: lm_head)
        continue
    t0 = min(r['t'][1] for r in rs if r['t'][1])
    last = [r for r in rs if len(r['t']) > 4 and r['t'][4]]
    if not last:
        continue
    L = last[0]
    f = lambda t: (t - t0) / 1000 if t else float('nan')
    ex = sorted(r['t'][3] for r in rs)
    row = dict(arrive=f(L['t'][2]), lg=f(L['t'][4]), soft=f(L['t'][6]), rank=f(L['t'][7]), wts=f(L['t'][5]),
               exit=f(L['t'][3]), others=f(ex[-2] if ex[-1] == L['t'][3] else ex[-1]))
    for k, v in row.items():
        cols[k].append(v)
    if len(cols['arrive']) <= 8:
        print("blk %3d: " % L['blk'] + " ".join("%s %.2f" % (k, v) for k, v in row.items()))
if cols:
    print("median over %d layers: " % len(cols['arrive']) +
          " ".join("%s %.2f" % (k, statistics.median(v)) for k, v in cols.items()))
