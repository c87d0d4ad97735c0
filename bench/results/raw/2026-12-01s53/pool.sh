#!/bin/bash
# Session 53: test_mstep with the pool check that tells a router flip from a fault at the
# hand-over (it reruns both pools with the last request alone from 2 steps earlier). Session 52's
# failing seed as it failed and with the part at the first alone step (gen 37), then RUNS fresh
# runs of all five presets.
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
S=$OUT/sum.txt; ts() { echo "$(date +%T) $*" | tee -a $S; }
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr > $OUT/b.log 2>&1 &&
	cmake --build build-gpu -j16 --target test_mstep >> $OUT/b.log 2>&1; ts "build rc=$? $(git log -1 --format=%h) $(git status --short | wc -l) changed"
x=$(find build-gpu -name test_mstep -type f | head -1)
one() { local n=$1; shift; timeout 150 env "$@" > $OUT/r$n.txt 2>&1; ts "run $n ($*) rc=$?"; grep -E "FP4S_TEST_SEED|^request|pool|passed|FAIL|CHECK" $OUT/r$n.txt | tee -a $S; }
one 1 FP4S_TEST_SEED=0x18ecfadae998af58 $x qwen3-30b-a3b gpt-oss-20b gpt-oss-120b
one 2 FP4S_TEST_POOL_GEN=12,24,37,48 FP4S_TEST_SEED=0x18ecfadae998af58 $x qwen3-30b-a3b gpt-oss-20b gpt-oss-120b
for r in $(seq ${RUNS:-2}); do one $((r + 2)) $x; done
(cd $OUT && tar czf runs.tgz r*.txt && rm -f r*.txt)
