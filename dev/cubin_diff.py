#!/usr/bin/env python3
"""Which kernels of two cubins differ: each .text.<kernel> section's size and an MD5 of its bytes.

Why: code added to a CUDA module, or a kernel argument struct made larger, can change kernels
that never run the new code, and in decode chains such changes have measured 1-4 % slower
(docs/status.md, sessions 18, 21 and 23). Comparing cubins shows whether a change left the other
kernels byte for byte as they were, without a GPU.

  nvcc -O3 -DNDEBUG --generate-code=arch=compute_90a,code=sm_90a -Isrc -I. -std=c++17 -cubin \\
       -o /tmp/new.cubin src/backend/cuda/gemv_fp4.cu     (and the same from the old tree)
  dev/cubin_diff.py /tmp/new.cubin /tmp/old.cubin [name filter]

Prints DIFF / NEW / GONE a kernel (and SAME for one renamed with the same bytes), then the
counts."""
import hashlib
import struct
import sys


def texts(path):
    """a cubin's kernels: {name: the bytes of its .text.<name> section} (dev/sass_loops.py too)"""
    d = open(path, 'rb').read()
    if d[:4] != b'\x7fELF' or d[4] != 2:
        sys.exit(f"{path}: not a 64-bit ELF cubin")
    shoff = struct.unpack_from('<Q', d, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', d, 0x3a)
    hdrs = [struct.unpack_from('<IIQQQQIIQQ', d, shoff + i * shentsize) for i in range(shnum)]
    stro = hdrs[shstrndx][4]
    out = {}
    for h in hdrs:
        name = d[stro + h[0]:d.index(b'\0', stro + h[0])].decode()
        if name.startswith('.text.'):
            out[name[6:]] = d[h[4]:h[4] + h[5]]
    return out


def sections(path):
    return {k: (len(t), hashlib.md5(t).hexdigest()[:10]) for k, t in texts(path).items()}


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    a, b = sections(sys.argv[1]), sections(sys.argv[2])
    flt = sys.argv[3] if len(sys.argv) > 3 else ''
    counts = {}
    # a kernel whose name changed (a template argument added) but whose bytes did not: GONE and
    # NEW with the same size and hash are reported as one SAME (renamed)
    gone = {b[k]: k for k in b if k not in a and flt in k}
    renamed = {k: gone.pop(a[k]) for k in a if k not in b and flt in k and a[k] in gone}
    for k in sorted(set(a) | set(b)):
        if flt not in k or k in renamed.values():
            continue
        x, y = a.get(k), b.get(k)
        if k in renamed:
            tag, y = 'SAME', x
            print(f"SAME {k} (renamed from {renamed[k]})")
        else:
            tag = 'NEW' if y is None else 'GONE' if x is None else 'SAME' if x == y else 'DIFF'
        counts[tag] = counts.get(tag, 0) + 1
        if tag != 'SAME':
            print(f"{tag:4} {k} {x} {y}")
    print(' '.join(f"{t} {n}" for t, n in sorted(counts.items())))


if __name__ == '__main__':
    main()
