#!/usr/bin/env bash
# fuzz.sh: builds a fuzz target (default: the safetensors header parser; FP4S_FUZZ_TARGET=config:
# config.json parsing + table expansion; request: the server's request parser, chat formats,
# tokenizer and harmony channel parser; tokenizer: tokenizer.json, GGUF and llama2.c tokenizer
# files, then encoding, decoding and chat rendering with them; encode: text through the real
# Llama 3, Qwen3 and gpt-oss tokenizers, decode(encode(x)) == x) with clang + libFuzzer + ASan + UBSan and
# runs it for a bounded time on the committed seed corpus (tests/fuzz/corpus, read only; new
# inputs go to a scratch corpus in the build folder). Exits non-zero on any finding; the crashing
# input is left as $OUT/crash-* (replay it with: $OUT/fuzz_safetensors FILE).
#
# usage: scripts/fuzz.sh [SECONDS]        default 60; env FP4S_FUZZ_DIR (default build-fuzz),
#                                         CC (default clang), FP4S_FUZZ_JOBS (default 1),
#                                         FP4S_FUZZ_TARGET (safetensors | config | request | tokenizer |
#                                         encode)
# needs: clang with libFuzzer (Debian: clang + libclang-rt-dev or the clang-N package), and the
#        jansson development package (libjansson-dev); request also PCRE2, utf8proc, civetweb.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-60}
out=${FP4S_FUZZ_DIR:-$root/build-fuzz}
cc=${CC:-clang}
jobs=${FP4S_FUZZ_JOBS:-1}
target=${FP4S_FUZZ_TARGET:-safetensors}
libs=()
case $target in
safetensors) srcs=("$root/src/model/st_read.c"); seeds=$root/tests/fuzz/corpus ;;
config)
	srcs=("$root/src/model/cfg.c" "$root/src/model/tensors.c" "$root/src/model/model_stats.c"
	      "$root/src/model/model.c" "$root/src/model/qscheme.c" "$root/src/model/st_read.c"
	      "$root/src/util/progress.c" "$root/src/util/log.c" "$root/src/numerics/quant.c")
	seeds=$root/tests/fuzz/corpus-config ;;
request)
	# the whole library but the CUDA backend: the parser reaches the tokenizer, the chat
	# formats and (in its set-up) the checkpoint writer
	mapfile -t srcs < <(ls "$root"/src/{util,numerics,model,tokenizer,backend,backend/cpu,engine,server}/*.c |
	                    grep -v "/util/status.c$")
	libs=(-lpcre2-8 -lutf8proc -lcivetweb -lpthread)
	seeds=$root/tests/fuzz/corpus-request ;;
tokenizer)
	mapfile -t srcs < <(ls "$root"/src/{util,tokenizer}/*.c | grep -v "/util/status.c$")
	libs=(-lpcre2-8 -lutf8proc -lpthread)
	seeds=$root/tests/fuzz/corpus-tokenizer ;;
encode)
	# the real tokenizer.json files of scripts/fetch-testdata.sh
	cache=${FP4S_CACHE_DIR:-$root/.cache}
	if [ ! -f "$cache/npm/tokenizer-qwen3/package/models/tokenizer.json" ]; then
		echo "fuzz.sh: skip encode: no npm tokenizers in $cache/npm (run scripts/fetch-testdata.sh)"
		exit 0
	fi
	export FP4S_CACHE_DIR=$cache
	mapfile -t srcs < <(ls "$root"/src/{util,tokenizer}/*.c | grep -v "/util/status.c$")
	libs=(-lpcre2-8 -lutf8proc -lpthread)
	seeds=$root/tests/fuzz/corpus-encode ;;
*) echo "fuzz.sh: unknown FP4S_FUZZ_TARGET $target" >&2; exit 2 ;;
esac
mkdir -p "$out/corpus-$target"
"$cc" -std=c11 -D_GNU_SOURCE -DFP4S_VERSION='"fuzz"' -DFP4S_GIT_COMMIT='"fuzz"' -g -O1 -fno-omit-frame-pointer \
	-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -fopenmp \
	-I"$root/src" "$root/tests/fuzz/fuzz_$target.c" "${srcs[@]}" \
	"$root/src/util/status.c" -ljansson "${libs[@]}" -lm -o "$out/fuzz_$target"
echo "fuzz.sh: running fuzz_$target for ${secs}s on $(ls "$seeds" | wc -l) seeds"
cd "$out"
par=()
if [ "$jobs" -gt 1 ]; then par=(-jobs="$jobs" -workers="$jobs"); fi
dict=()
if [ -f "$root/tests/fuzz/$target.dict" ]; then dict=(-dict="$root/tests/fuzz/$target.dict"); fi
./fuzz_$target -max_total_time="$secs" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
	"${dict[@]}" -artifact_prefix="$out/$target-" -print_final_stats=1 \
	"${par[@]}" "$out/corpus-$target" "$seeds"
echo "fuzz.sh: no findings"
