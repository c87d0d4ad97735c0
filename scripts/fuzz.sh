#!/usr/bin/env bash
# fuzz.sh: builds the safetensors header fuzz target with clang + libFuzzer + ASan + UBSan and
# runs it for a bounded time on the committed seed corpus (tests/fuzz/corpus, read only; new
# inputs go to a scratch corpus in the build folder). Exits non-zero on any finding; the crashing
# input is left as $OUT/crash-* (replay it with: $OUT/fuzz_safetensors FILE).
#
# usage: scripts/fuzz.sh [SECONDS]        default 60; env FP4S_FUZZ_DIR (default build-fuzz),
#                                         CC (default clang), FP4S_FUZZ_JOBS (default 1)
# needs: clang with libFuzzer (Debian: clang + libclang-rt-dev or the clang-N package), and the
#        jansson development package (libjansson-dev).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-60}
out=${FP4S_FUZZ_DIR:-$root/build-fuzz}
cc=${CC:-clang}
jobs=${FP4S_FUZZ_JOBS:-1}
mkdir -p "$out/corpus"
"$cc" -std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer \
	-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	-I"$root/src" "$root/tests/fuzz/fuzz_safetensors.c" "$root/src/model/st_read.c" \
	"$root/src/util/status.c" -ljansson -o "$out/fuzz_safetensors"
echo "fuzz.sh: running fuzz_safetensors for ${secs}s on $(ls "$root/tests/fuzz/corpus" | wc -l) seeds"
cd "$out"
par=()
if [ "$jobs" -gt 1 ]; then par=(-jobs="$jobs" -workers="$jobs"); fi
./fuzz_safetensors -max_total_time="$secs" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
	-dict="$root/tests/fuzz/safetensors.dict" -artifact_prefix="$out/" -print_final_stats=1 \
	"${par[@]}" "$out/corpus" "$root/tests/fuzz/corpus"
echo "fuzz.sh: no findings"
