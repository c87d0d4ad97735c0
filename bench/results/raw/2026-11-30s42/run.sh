#!/bin/bash
# Session 42's calls: build fp4serve and test_mstep for sm_90a (deps from .deps, carried), run
# test_mstep on PRESETS (the whole-step kernels against the layer path), then fp4serve bench on
# the MODELS (gen, /dev/shm) with the whole-step kernel (M) and with FP4S_MSTEP=0 (A): tg128
# (3 reps) and depth 4096 (-n 64, 2 reps), RUNS times each (default 1).
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
L=$OUT/log; mkdir -p $L; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" | tee -a $S; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader > $L/gpu.txt 2>&1
cmake -S . -B /tmp/b -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr \
	> $L/build.log 2>&1 && cmake --build /tmp/b -j16 --target fp4serve ${TESTS:-test_mstep} >> $L/build.log 2>&1
rc=$?; ts "build rc=$rc"; [ $rc = 0 ] || { tail -40 $L/build.log; exit 1; }
B=/tmp/b/fp4serve
MODELS=${MODELS:-llama3-8b}
( for m in $MODELS; do $B gen --preset $m --format nvfp4 /dev/shm/$m > $L/gen-$m.log 2>&1; ts "gen $m rc=$?"; done ) &
for t in ${TESTS:-test_mstep}; do
	x=$(find /tmp/b -name $t -type f | head -1)
	timeout ${TT:-400} $x ${PRESETS:-} > $L/t-$t.txt 2>&1; ts "$t rc=$?"; grep -E "pool:|requests equal|FAIL|differ|request|did not" $L/t-$t.txt | head -30 | tee -a $S
done
wait
[ -n "${NOBENCH:-}" ] && { (cd $OUT && tar czf logs.tgz log && rm -rf log); exit 0; }
bench() { local lab=$1; shift; timeout 150 env "$@" > $L/b-$lab.txt 2>&1; echo "rc=$?" >> $L/b-$lab.txt; ts "$lab $(grep -E '^(tg|pp)|whole|rc=' $L/b-$lab.txt | tr '\n' ' ' | tail -c 300)"; }
for r in $(seq ${RUNS:-1}); do
	for m in $MODELS; do
		bench $m-M-$r $B bench -m /dev/shm/$m -p 0 -n 128 --reps 3
		bench $m-A-$r FP4S_MSTEP=0 $B bench -m /dev/shm/$m -p 0 -n 128 --reps 3
		bench $m-dM-$r $B bench -m /dev/shm/$m -p 0 --ctx 4096 -n 64 --reps 2
		bench $m-dA-$r FP4S_MSTEP=0 $B bench -m /dev/shm/$m -p 0 --ctx 4096 -n 64 --reps 2
	done
done
(cd $OUT && tar czf logs.tgz log && rm -rf log)
