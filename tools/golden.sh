#!/usr/bin/env bash
# golden.sh OUT: the whole golden-fixture pipeline where torch + transformers are installed:
# tiny HF models (BF16), their NVFP4 (ModelOpt, compressed-tensors) and MXFP4 (gpt-oss) copies
# made by fp4serve quantize, then transformers' logits for each. FP4SERVE names the binary.
set -euo pipefail
out=${1:?usage: tools/golden.sh OUT}
bin=${FP4SERVE:-./build/fp4serve}
python3 tools/make_golden.py models "$out"
for a in llama qwen3 qwen3_moe; do
  "$bin" quantize "$out/$a-bf16" "$out/$a-nvfp4" --format nvfp4
  "$bin" quantize "$out/$a-bf16" "$out/$a-nvfp4ct" --format nvfp4-ct
done
"$bin" quantize "$out/gpt_oss-bf16" "$out/gpt_oss-mxfp4" --format mxfp4
python3 tools/make_golden.py logits "$out"
