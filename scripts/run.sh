#!/usr/bin/env bash
# run.sh [arguments]: install, build and run the main job on a fresh machine: the
# OpenAI-compatible server on 127.0.0.1:8000.
#   scripts/run.sh                      serve a tiny random-weight demo model (fp4serve serve --demo)
#   scripts/run.sh -m DIR [serve flags] serve that model
#   scripts/run.sh --port 9000 ...      serve flags without -m: the demo model with them
#   scripts/run.sh report | run | ...   any fp4serve command as it is (report: build/device report)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh build
case "${1:-}" in
report | run | chat | perplexity | inspect | gen | quantize | tokenize | detokenize | serve | bench | help | --help | -h | --version)
  exec ./build/fp4serve "$@" ;;
esac
for a in "$@"; do
  case "$a" in
  -m | --model | --model=*) exec ./build/fp4serve serve "$@" ;;
  esac
done
exec ./build/fp4serve serve --demo "$@"
