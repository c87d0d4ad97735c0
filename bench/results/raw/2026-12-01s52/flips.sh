#!/bin/bash
# Session 52: how many of test_mstep's 14 requests a MoE preset has beyond the tolerance, run after
# run on fresh prompts (the router's near-tie allowance, MOE_FLIPS = 3). N runs of the three MoE
# presets on HEAD's kernels.
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
S=$OUT/sum.txt; ts() { echo "$(date +%T) $*" | tee -a $S; }
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr > $OUT/b.log 2>&1 &&
	cmake --build build-gpu -j16 --target test_mstep >> $OUT/b.log 2>&1; ts "build rc=$? $(git log -1 --format=%h)"
x=$(find build-gpu -name test_mstep -type f | head -1)
for r in $(seq ${N:-10}); do
	timeout 120 $x qwen3-30b-a3b gpt-oss-20b gpt-oss-120b > $OUT/r$r.txt 2>&1; rc=$?
	ts "run $r rc=$rc $(grep -o 'FP4S_TEST_SEED=[0-9a-fx]*' $OUT/r$r.txt) $(grep -E 'requests equal to the layer path for' $OUT/r$r.txt | sed -E 's/: ([0-9]+) of 14.*, ([0-9]+) part at a near tie, ([0-9]+) beyond.*within ([0-9.e-]+).*/ eq=\1 tie=\2 bad=\3 lp=\4/' | tr '\n' ' ')"
done
(cd $OUT && tar czf runs.tgz r*.txt && rm -f r*.txt)
