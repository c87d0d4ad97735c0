#!/usr/bin/env python3
"""The loops of each kernel in `cuobjdump -sass` output that hold tensor-core instructions (HMMA):
where each starts and ends, its size, and where it falls against 128- and 256-byte boundaries.

Why: qwen3-30b-a3b decoded ~6 % slower on two builds whose gemv_tma kernels differed from main's
only in code outside the step loop (bench/results/2026-11-29-h200-session34.md). Session 28 saw
instruction-fetch stalls at every 256-byte boundary of a step loop. This shows whether the
builds' step loops sit differently against those boundaries.

  cuobjdump -sass build/fp4serve > a.sass   (or a library, or a cubin)
  dev/sass_loops.py a.sass [b.sass] [--fun SUBSTRING]   (two files: each kernel side by side;
                                                          --fun: kernels whose name holds it)

A loop is a backward branch: the branch at B to a label at T < B covers [T, B].

A cubin (nvcc -cubin, as dev/cubin_diff.py compiles one) is read without cuobjdump, from the
instruction words of its .text sections: sm_90's 16-byte instructions, the opcode in the low 12
bits (0x23c HMMA, 0x947 BRA), a branch's offset in 4-byte units in bits 16-23 (low 8) and 34-63
of the first word and 0-17 of the second, from the next instruction. Checked against loops of
known size and HMMA count (nvcc 13.0, sm_90a), not against a disassembler: where cuobjdump is at
hand, use its text."""
import os
import re
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cubin_diff import texts  # noqa: E402

FUNC = re.compile(r"^\s*Function\s*:\s*(\S+)")
LABEL = re.compile(r"^\s*(\.L_x_\d+):")
INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
TARGET = re.compile(r"`\((\.L_x_\d+)\)")


def parse(path):
    """path -> {kernel: [(start, branch, insns, hmma), ...]} for the loops holding HMMA"""
    out, fn, labels, insns = {}, None, {}, []

    def close():
        if fn is None:
            return
        loops = []
        for addr, text in insns:
            m = TARGET.search(text)
            if not m or "BRA" not in text:
                continue
            t = labels.get(m.group(1))
            if t is None or t >= addr:
                continue
            body = [x for x in insns if t <= x[0] <= addr]
            h = sum(1 for _, s in body if "HMMA" in s)
            if h:
                loops.append((t, addr, len(body), h))
        out[fn] = loops

    pending = []
    for line in open(path, errors="replace"):
        m = FUNC.match(line)
        if m:
            close()
            fn, labels, insns, pending = m.group(1), {}, [], []
            continue
        m = LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = INSN.match(line)
        if m and fn is not None:
            addr = int(m.group(1), 16)
            for lb in pending:
                labels[lb] = addr
            pending = []
            insns.append((addr, m.group(2)))
    close()
    return out


def parse_cubin(path):
    """the same from a cubin's instruction words (sm_90; see above)"""
    out = {}
    for name, t in texts(path).items():
        ins = [struct.unpack_from("<QQ", t, i) for i in range(0, len(t) - 15, 16)]
        loops = []
        for i, (w0, w1) in enumerate(ins):
            if w0 & 0xfff != 0x947:
                continue
            v = ((w0 >> 16) & 0xff) | (((w0 >> 34) & 0x3fffffff) << 8) | ((w1 & 0x3ffff) << 38)
            if v >> 55:
                v -= 1 << 56
            tgt = 16 * (i + 1) + 4 * v
            if not 0 <= tgt < 16 * i:
                continue
            hm = sum(1 for j in range(tgt // 16, i + 1) if ins[j][0] & 0xfff == 0x23c)
            if hm:
                loops.append((tgt, 16 * i, i + 1 - tgt // 16, hm))
        out[name] = loops
    return out


def describe(loop):
    t, b, n, h = loop
    end = b + 16  # the branch's own 16 bytes
    return "[%#07x, %#07x) %5d B, %4d insns, %3d HMMA, start %% 128 = %3d, %% 256 = %3d, 128-B lines %d" % (
        t, end, end - t, n, h, t % 128, t % 256, (end - 1) // 128 - t // 128 + 1)


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    args = sys.argv[1:]
    fun = None
    if "--fun" in args:
        i = args.index("--fun")
        fun = args[i + 1]
        del args[i:i + 2]
    files = args[:2]
    runs = [parse_cubin(p) if open(p, "rb").read(4) == b"\x7fELF" else parse(p) for p in files]
    names = sorted(k for k in set().union(*[set(r) for r in runs]) if not fun or fun in k)
    for k in names:
        print(k)
        for i, r in enumerate(runs):
            loops = r.get(k)
            if loops is None:
                print("  %s: (not there)" % files[i])
                continue
            for lp in sorted(loops, key=lambda lp: lp[1] - lp[0]):  # innermost first
                print("  %s: %s" % (files[i], describe(lp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
