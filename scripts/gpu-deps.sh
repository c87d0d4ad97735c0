#!/usr/bin/env bash
# gpu-deps.sh: unpack the Debian library packages fp4serve links against into .deps/root, for a
# GPU machine that has the CUDA toolkit but not these packages and no network. Build there with
#   cmake -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr ...
# (the build tree's rpath then points at .deps/root). Run here, where apt reaches Debian.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs="libjansson-dev libjansson4 libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2
      libcivetweb-dev libcivetweb1"
mkdir -p .deps/debs .deps/root
(cd .deps/debs && apt-get download $pkgs >/dev/null)
for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/root; done
# the -dev packages' lib*.so links are absolute (/usr/lib/...): point them inside the tree
for l in .deps/root/usr/lib/x86_64-linux-gnu/*.so; do
  t=$(readlink "$l" || true)
  case "$t" in /*) ln -sf "$(basename "$t")" "$l" ;; esac
done
du -sh .deps/root
