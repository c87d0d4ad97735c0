#!/bin/bash
# Session 41's engine calls: build fp4serve and test_mstep for sm_90a (deps from .deps, carried),
# run test_mstep (the whole-step kernel against the layer path), then fp4serve bench on
# qwen3-30b-a3b NVFP4 (gen, /dev/shm) with the whole-step kernel and with FP4S_MSTEP=0:
# tg128 (3 reps) and depth 4096 (-n 64, 2 reps), RUNS times each (default 2).
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
L=$OUT/log; mkdir -p $L; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" | tee -a $S; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader > $L/gpu.txt 2>&1
cmake -S . -B /tmp/b -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr \
	> $L/build.log 2>&1 && cmake --build /tmp/b -j16 --target fp4serve ${TESTS:-test_mstep} >> $L/build.log 2>&1
rc=$?; ts "build rc=$rc"; [ $rc = 0 ] || { tail -40 $L/build.log; exit 1; }
[ -n "${MG:-}" ] && { OUT=$OUT/mg bash bench/results/raw/2026-11-29s41/run_mg.sh 2>&1 | tail -4 | tee -a $S; }
B=/tmp/b/fp4serve
( $B gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/q > $L/gen.log 2>&1; ts "gen rc=$?" ) &
for t in ${TESTS:-test_mstep}; do
	x=$(find /tmp/b -name $t -type f | head -1)
	timeout ${TT:-300} $x > $L/t-$t.txt 2>&1; ts "$t rc=$?"; grep -E "mstep:|FAIL|differ|request" $L/t-$t.txt | head -20 | tee -a $S
done
wait
[ -n "${NOBENCH:-}" ] && { (cd $OUT && tar czf logs.tgz log $([ -d mg ] && echo mg) && rm -rf log mg); exit 0; }
bench() { local lab=$1; shift; env "$@" > $L/b-$lab.txt 2>&1; ts "$lab $(grep -E '^(tg|pp)' $L/b-$lab.txt | tail -1)"; }
for r in $(seq ${RUNS:-2}); do
	bench q-M-$r $B bench -m /dev/shm/q -p 0 -n 128 --reps 3
	bench q-A-$r FP4S_MSTEP=0 $B bench -m /dev/shm/q -p 0 -n 128 --reps 3
	bench qd-M-$r $B bench -m /dev/shm/q -p 0 --ctx 4096 -n 64 --reps 2
	bench qd-A-$r FP4S_MSTEP=0 $B bench -m /dev/shm/q -p 0 --ctx 4096 -n 64 --reps 2
done
(cd $OUT && tar czf logs.tgz log $([ -d mg ] && echo mg) && rm -rf log mg)
