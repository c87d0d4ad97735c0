#!/bin/bash
# Session 59's call 3: the tree built as is and with -DFP4S_DIAG_TL; test_engine_cuda and test_golden; then for
# MODELS, with and without steps ahead (FP4S_LOOKAHEAD=1 / 0): replays 40-42 of the decode graph recorded
# (dev/timeline.py's layout; the bench's ms/token less the recorded span is what a token spends outside
# the graph), and `fp4serve run` greedy for 256 tokens (its tok/s as a user sees it).
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
L=$OUT/log; mkdir -p $L; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" | tee -a $S; }
git log -1 --format='%H %s' > $L/commit.txt 2>&1
MODELS=${MODELS:-llama3-8b}
bld() { cmake -S . -B /tmp/b-$1 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr \
	"-DCMAKE_CUDA_FLAGS=$2" > $L/build-$1.log 2>&1 && cmake --build /tmp/b-$1 -j16 --target $3 >> $L/build-$1.log 2>&1; ts "build $1 rc=$?"; }
bld base "" "fp4serve test_engine_cuda test_golden"
( for m in $MODELS; do /tmp/b-base/fp4serve gen --preset $m --format nvfp4 /dev/shm/$m > $L/gen-$m.log 2>&1; ts "gen $m rc=$?"; done ) &
bld tl "-DFP4S_DIAG_TL" "fp4serve" &
for t in test_engine_cuda test_golden; do x=$(find /tmp/b-base -name $t -type f | head -1)
	timeout 200 $x > $L/t-$t.txt 2>&1; ts "$t rc=$?"; grep -E "steps ahead|FAIL|passed" $L/t-$t.txt | tee -a $S; done
wait
for m in $MODELS; do for la in 1 0; do for c in 0 4096; do
	FP4S_LOOKAHEAD=$la FP4S_TL=/tmp/tl.bin FP4S_TL_STEP=40 FP4S_TL_COUNT=3 timeout 120 /tmp/b-tl/fp4serve bench -m /dev/shm/$m -p 0 --ctx $c -n 64 --reps 1 > $L/b-tl-$m-$la-$c.txt 2>&1
	ts "tl $m la=$la ctx=$c $(grep -E '^tg' $L/b-tl-$m-$la-$c.txt)"
	python3 dev/timeline.py /tmp/tl.bin 2>&1 | grep -E "replay|first entry" | tee -a $S
	done
	FP4S_LOOKAHEAD=$la timeout 120 /tmp/b-base/fp4serve run -m /dev/shm/$m -p "The history of the" -n 256 --temperature 0 --ignore-eos > $L/run-$m-$la.txt 2>$L/run-$m-$la.err
	ts "run $m la=$la $(grep -E 'generated' $L/run-$m-$la.err)"
done; done
(cd $OUT && tar czf logs.tgz log && rm -rf log)
