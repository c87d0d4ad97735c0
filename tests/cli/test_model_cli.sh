#!/usr/bin/env bash
# test_model_cli.sh: gen / quantize / inspect through the binary: every tiny preset in every
# format it supports, gen --format F == gen bf16 + quantize --format F (byte-equal files), inspect
# on a checkpoint and on a preset, usage errors exit 2, bad input exits 1 with a message.
set -u
bin=$1
tmp=$(mktemp -d /tmp/fp4s-cli-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

for p in tiny-llama3 tiny-qwen3 tiny-qwen3-moe tiny-qwen3-next tiny-gpt-oss; do
	"$bin" gen --preset $p --format bf16 --seed 3 --shard-mb 1 "$tmp/$p-bf16" 2>/dev/null || bad "gen $p bf16"
	fmts="nvfp4 nvfp4-ct"
	[ $p = tiny-gpt-oss ] && fmts=mxfp4
	for f in $fmts; do
		"$bin" quantize "$tmp/$p-bf16" "$tmp/$p-q-$f" --format $f --shard-mb 1 2>/dev/null || bad "quantize $p $f"
		"$bin" gen --preset $p --format $f --seed 3 --shard-mb 1 "$tmp/$p-g-$f" 2>/dev/null || bad "gen $p $f"
		if diff -r "$tmp/$p-q-$f" "$tmp/$p-g-$f" >/dev/null; then ok "$p $f: gen == gen bf16 + quantize"; else bad "$p $f differs"; fi
		out=$("$bin" inspect -m "$tmp/$p-q-$f") || bad "inspect $p $f"
		echo "$out" | grep -q "^decode " || bad "inspect $p $f: no decode line"
		echo "$out" | grep -q " $([ $f = mxfp4 ] && echo mxfp4 || echo nvfp4) " || bad "inspect $p $f: no quantized tensor listed"
	done
done
# gpt-oss defaults to mxfp4
"$bin" gen --preset tiny-gpt-oss "$tmp/go-default" 2>/dev/null && grep -q '"mxfp4"' "$tmp/go-default/config.json" \
	&& ok "gpt-oss defaults to mxfp4" || bad "gpt-oss default format"
# tokenizer.json is there and names the family's specials
grep -q '<|eot_id|>' "$tmp/tiny-llama3-bf16/tokenizer.json" && ok "llama3 tokenizer specials" || bad "tokenizer"
grep -q '<|im_end|>' "$tmp/tiny-qwen3-bf16/tokenizer.json" && ok "qwen3 tokenizer specials" || bad "tokenizer"
# inspect a preset without files: llama3-8b nvfp4 reads ~4.98 GB per token
out=$("$bin" inspect --preset llama3-8b --format nvfp4 --brief --bandwidth 3350)
echo "$out" | grep -q "^decode      4.97[0-9] GB" && ok "llama3-8b nvfp4 4.98 GB/token" || { echo "$out"; bad "llama3-8b bytes"; }
echo "$out" | grep -q "^roofline    67[0-9] tok/s at 3350" && ok "roofline at 3350 GB/s" || bad "roofline"
# --layers: the first N layers (per-layer lists cut too), loadable; more than the preset has is an error
for p in tiny-qwen3-moe tiny-gpt-oss; do
	"$bin" gen --preset $p --layers 1 --shard-mb 1 "$tmp/$p-l1" 2>/dev/null && grep -q '"num_hidden_layers": 1' "$tmp/$p-l1/config.json" \
		&& "$bin" inspect -m "$tmp/$p-l1" >/dev/null && ok "$p --layers 1" || bad "$p --layers 1"
done
"$bin" gen --preset tiny-qwen3 --layers 5 "$tmp/l5" 2>"$tmp/err"; [ $? = 1 ] && grep -q "has 2" "$tmp/err" && ok "--layers past the preset's" || bad "--layers 5"
"$bin" gen --preset tiny-qwen3 --layers 0 "$tmp/l0" 2>/dev/null; [ $? = 2 ] && ok "--layers 0 is a usage error" || bad "--layers 0"
# errors
"$bin" gen --preset nope "$tmp/x" 2>"$tmp/err"; [ $? = 2 ] && grep -q "unknown preset" "$tmp/err" && ok "unknown preset" || bad "unknown preset"
"$bin" gen 2>/dev/null; [ $? = 2 ] && ok "gen usage" || bad "gen usage"
"$bin" quantize "$tmp/tiny-llama3-q-nvfp4" "$tmp/y" 2>"$tmp/err"; [ $? = 1 ] && grep -q "already quantized" "$tmp/err" && ok "quantize refuses quantized input" || bad "requantize"
"$bin" inspect -m "$tmp/missing" 2>"$tmp/err"; [ $? = 1 ] && ok "inspect missing dir" || bad "inspect missing"
"$bin" gen --help | grep -q "presets:" && ok "gen --help" || bad "gen --help"
"$bin" quantize --help | grep -q "W4A16_NVFP4" && ok "quantize --help" || bad "quantize --help"
"$bin" inspect --help | grep -q "bandwidth" && ok "inspect --help" || bad "inspect --help"
exit $fail
