#!/usr/bin/env python3
"""The MoE router's last block in a timeline recording (timeline.cuh, FP4S_TL): per layer, when it
arrived on the counter, read the logits back, finished the top-k and left, against the other blocks.
usage: router_marks.py FILE[.gz]"""
import collections
import gzip
import sys

recs=[]
for line in (gzip.open(sys.argv[1],"rt") if sys.argv[1].endswith(".gz") else open(sys.argv[1])):
    if line.startswith('#'):
        if recs: break
        continue
    f=line.split()
    if f[0]=='5': recs.append(dict(tag=f[1],blk=int(f[3]),t=[int(x) for x in f[4:]]))
g=collections.defaultdict(list)
for r in recs: g[r['tag']].append(r)
print("router launches (kid 5), times in us from the first block's release; marks: 2 arrive on the counter, 4 logits read back, 5 top-k done, 3 exit; 6/7 around the warm-up before the wait")
for tag,rs in list(g.items())[3:12]:
    rs.sort(key=lambda r:r['t'][3]); t0=min(r['t'][1] for r in rs); L=rs[-1]
    f=lambda t: (t-t0)/1000 if t else float('nan')
    wu=sorted((r['t'][7]-r['t'][6])/1000 for r in rs if r['t'][6] and r['t'][7])
    print("last blk %2d: arrive %.2f lg-read %.2f routed %.2f exit %.2f | 2nd-last exit %.2f | warm-up med %s"%(L['blk'],f(L['t'][2]),f(L['t'][4]),f(L['t'][5]),f(L['t'][3]),f(rs[-2]['t'][3]), "%.2f"%wu[len(wu)//2] if wu else "-"))
