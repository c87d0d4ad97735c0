#!/usr/bin/env bash
# install-deps.sh: the Debian 12 packages fp4serve builds and tests with (engineering.md §4).
# Installs only what is missing, so a prepared machine costs nothing. The CUDA toolkit is not a
# Debian main package: when /usr/local/cuda/bin/nvcc exists the build uses it, otherwise the
# CPU backend alone is built.
set -euo pipefail
pkgs=(build-essential cmake libjansson-dev libpcre2-dev libutf8proc-dev libcivetweb-dev
      clang libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# node and npm (test fixtures, the OpenAI client in server tests) may come from elsewhere than
# Debian; only a machine with neither gets Debian's
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null; then
  echo "install-deps: CUDA toolkit found ($( (command -v nvcc || echo /usr/local/cuda/bin/nvcc) ))"
else
  echo "install-deps: no CUDA toolkit: building the CPU backend only"
fi
