#!/bin/bash
# Session 53: session 52's failing test_mstep run again (the same seed, the three MoE presets in
# the same order, so gpt-oss-120b draws the same prompts): three times as it failed, then with
# FP4S_TEST_POOL_GEN moving the pool's first alone step from 36 to 35 and to 37.
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
S=$OUT/sum.txt; ts() { echo "$(date +%T) $*" | tee -a $S; }
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr > $OUT/b.log 2>&1 &&
	cmake --build build-gpu -j16 --target test_mstep >> $OUT/b.log 2>&1; ts "build rc=$? $(git log -1 --format=%h)"
x=$(find build-gpu -name test_mstep -type f | head -1)
i=0
for g in ${GENS:-12,24,36,48 12,24,36,48 12,24,36,48 12,24,35,48 12,24,37,48}; do i=$((i+1))
	FP4S_TEST_POOL_GEN=$g FP4S_TEST_SEED=${SEED:-0x18ecfadae998af58} timeout 120 $x ${PRESETS:-qwen3-30b-a3b gpt-oss-20b gpt-oss-120b} > $OUT/r$i.txt 2>&1
	ts "run $i gen $g rc=$?"; grep -E "^request|pool|passed|FAIL" $OUT/r$i.txt | tee -a $S
done
(cd $OUT && tar czf runs.tgz r*.txt && rm -f r*.txt)
