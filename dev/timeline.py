#!/usr/bin/env python3
"""Lays out a decode step block by block from a timeline recording (src/backend/cuda/timeline.cuh;
a build with -DFP4S_DIAG_TL, run with FP4S_TL=path).

Per replay: every launch (records grouped by kernel, tag and block repeats) in the order its last
block finished, and a summary per position in the layer (counted from the layer's attention
launch) with medians over the layers; then, where several steps were recorded, that summary over
the layers of all of them:
  span     last block's exit minus the previous launch's last exit (the launch's share of the step)
  release  first block past its PDL wait minus the previous launch's last exit
  stage    median block: work started (mark 2, where the kernel has one) minus past the wait
  work     median exit minus median past the wait
  tail     last exit minus median exit
All in microseconds.

usage: timeline.py FILE [--launches N]
"""
import statistics
import sys

KIDS = {1: "gemv_tma", 2: "moe_tma", 3: "attn", 4: "attn_merge", 5: "norm_route", 6: "embed", 7: "rmsnorm",
        8: "argmax", 9: "argmax_final", 10: "gemv_mma", 11: "small(backend)", 12: "small(moe)",
        13: "small(cuda_moe)", 14: "small(gemv_fp4)", 15: "gemv_fast"}
SMALL = {11, 12, 13, 14}


def med(v):
    return statistics.median(v) if v else float("nan")


def launches(recs):
    """records -> launches: (kid, tag) groups split where a block index repeats, in the order
    their last block exits; each keeps its records (recs: dev/tile_marks.py reads their marks)"""
    groups = {}
    for r in sorted(recs, key=lambda r: r["t0"]):
        groups.setdefault((r["kid"], r["tag"]), []).append(r)
    out = []
    for (kid, tag), rs in groups.items():
        seen = {}
        for r in rs:  # a block index seen again starts the next launch of this kernel and tag
            k = seen.get(r["blk"], 0)
            seen[r["blk"]] = k + 1
            r["_launch"] = k
        by = {}
        for r in rs:
            by.setdefault(r["_launch"], []).append(r)
        for key, b in by.items():
            name = KIDS.get(kid, str(kid))
            if kid in SMALL:
                name += "@%d" % tag
            t1 = [r["t1"] for r in b if r["t1"]]
            t2 = [r["t2"] for r in b if r["t2"]]
            t3 = [r["t3"] for r in b if r["t3"]]
            out.append({"name": name, "kid": kid, "nb": len(b), "t0": min(r["t0"] for r in b),
                        "t1min": min(t1) if t1 else None, "t1med": med(t1) if t1 else None,
                        "t2med": med(t2) if t2 else None, "t3med": med(t3) if t3 else None,
                        "end": max(t3) if t3 else max(r["t0"] for r in b), "recs": b})
    out.sort(key=lambda l: l["end"])
    return out


def analyse(recs, nshow):
    ls = launches(recs)
    if not ls:
        return
    base = min(l["t0"] for l in ls)
    prev = None
    for l in ls:
        pe = prev["end"] if prev else base
        l["span"] = (l["end"] - pe) / 1e3
        l["release"] = (l["t1min"] - pe) / 1e3 if l["t1min"] else float("nan")
        l["stage"] = (l["t2med"] - l["t1med"]) / 1e3 if l["t2med"] and l["t1med"] else float("nan")
        l["work"] = (l["t3med"] - l["t1med"]) / 1e3 if l["t3med"] and l["t1med"] else float("nan")
        l["tail"] = (l["end"] - l["t3med"]) / 1e3 if l["t3med"] else float("nan")
        prev = l
    total = (ls[-1]["end"] - base) / 1e3
    print("step: %d launches, %.1f us from the first entry to the last exit" % (len(ls), total))
    hdr = "%-22s %5s %8s %8s %8s %8s %8s %8s" % ("launch", "blocks", "end", "span", "release", "stage", "work",
                                                 "tail")
    print(hdr)
    for l in ls[:nshow]:
        print("%-22s %5d %8.1f %8.1f %8.2f %8.2f %8.2f %8.2f" % (l["name"], l["nb"], (l["end"] - base) / 1e3, l["span"],
                                                             l["release"], l["stage"], l["work"], l["tail"]))
    # per position from the layer's attention
    att = [i for i, l in enumerate(ls) if l["kid"] == 3]
    if len(att) < 2:
        return None
    P = att[1] - att[0]  # launches a layer
    pre = sum(1 for l in ls[:att[0]] if l["name"] == "embed")
    b = att[0] - pre  # launches of a layer before its attention
    per = {}
    for a in att:
        for off in range(-b, P - b):
            if 0 <= a + off < len(ls):
                per.setdefault(off, []).append(ls[a + off])
    print("\nper position in the layer (offset from the attention launch), medians over %d layers:" % len(att))
    print_per(per)
    head = ls[att[-1] + P - b:]
    if head:
        print("after the last layer: " + ", ".join("%s %.1f" % (l["name"], l["span"]) for l in head))
    return per


def print_per(per):
    """the per-position table: offset -> the launches at that offset (one a layer)"""
    print("%-6s %-22s %6s %8s %8s %8s %8s %8s" % ("offset", "launch", "blocks", "span", "release", "stage", "work", "tail"))
    tot = 0.0
    for off in sorted(per):
        v = per[off]
        names = sorted(set(l["name"] for l in v))
        s = med([l["span"] for l in v])
        tot += s
        print("%-6d %-22s %6d %8.2f %8.2f %8.2f %8.2f %8.2f  (n=%d)" % (
            off, "/".join(names)[:22], int(med([l["nb"] for l in v])), s,
            med([l["release"] for l in v]), med([l["stage"] for l in v]), med([l["work"] for l in v]),
            med([l["tail"] for l in v]), len(v)))
    print("sum of median spans a layer: %.1f us" % tot)


def replays(path):
    """a recording (path may be gzipped) -> (header, records) per replay, in file order; a record
    is a dict kid, tag, sm, blk, t (its times: 4, or 8 with the kernel's own marks) and t0..t3"""
    import gzip
    recs, rep = [], None
    for line in (gzip.open(path, "rt") if path.endswith(".gz") else open(path)):
        if line.startswith("#"):
            if recs:
                yield rep, recs
            recs, rep = [], line[1:].strip()
            continue
        f = line.split()
        if len(f) not in (8, 12):
            continue
        t = [int(x) for x in f[4:]]
        recs.append({"kid": int(f[0]), "tag": int(f[1], 16), "sm": int(f[2]), "blk": int(f[3]), "t": t,
                     "t0": t[0], "t1": t[1], "t2": t[2], "t3": t[3]})
    if recs:
        yield rep, recs


def first_replay(path, kid):
    """the records with marks (12 fields) of kernel kid in the first replay that has any, in file
    order (dev/router_marks.py, dev/attn_marks.py)"""
    for _, recs in replays(path):
        mine = [r for r in recs if r["kid"] == kid and len(r["t"]) == 8]
        if mine:
            return mine
    return []


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    nshow = int(sys.argv[sys.argv.index("--launches") + 1]) if "--launches" in sys.argv else 20
    pooled, nrep = {}, 0
    for i, (rep, recs) in enumerate(replays(sys.argv[1])):
        if i:
            print()
        print("== %s" % rep)
        per = analyse(recs, nshow)
        if per:
            nrep += 1
            for off, v in per.items():
                pooled.setdefault(off, []).extend(v)
    if nrep > 1:
        # One step's medians move by up to ~0.6 us a launch from one recording to the next
        # (bench/results/2026-11-29-h200-session33.md); the layers of every recorded step together
        # give steadier ones.
        print("\nall %d recorded steps: per position in the layer, medians over %d layers:" %
              (nrep, max(len(v) for v in pooled.values())))
        print_per(pooled)
    return 0


if __name__ == "__main__":
    sys.exit(main())
