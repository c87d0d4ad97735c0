#!/bin/bash
# Session 42's call 7: the MoE step's staging without bank conflicts (mg_put8 / mg_put4). Build,
# test_mstep on qwen3-30b-a3b and llama3-8b, bench qwen3-30b-a3b (tg128, depth 4096) and
# llama3-8b (tg128) with the whole-step kernels.
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
L=$OUT/log; mkdir -p $L; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" | tee -a $S; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader > $L/gpu.txt 2>&1
cmake -S . -B /tmp/b -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr \
	> $L/build.log 2>&1 && cmake --build /tmp/b -j16 --target fp4serve test_mstep >> $L/build.log 2>&1
rc=$?; ts "build rc=$rc"; [ $rc = 0 ] || { tail -40 $L/build.log; exit 1; }
B=/tmp/b/fp4serve
( $B gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/q > $L/gen.log 2>&1; ts "gen q rc=$?" ) &
( $B gen --preset llama3-8b --format nvfp4 /dev/shm/m > $L/gen-m.log 2>&1; ts "gen m rc=$?" ) &
timeout 150 $(find /tmp/b -name test_mstep -type f | head -1) qwen3-30b-a3b llama3-8b > $L/t-test_mstep.txt 2>&1
ts "test_mstep rc=$?"; grep -E "pool:|requests equal|FAIL|differ|request|did not" $L/t-test_mstep.txt | head -20 | tee -a $S
wait
bench() { local lab=$1; shift; timeout 100 env "$@" > $L/b-$lab.txt 2>&1; echo "rc=$?" >> $L/b-$lab.txt; ts "$lab $(grep -E '^(tg|pp)|rc=' $L/b-$lab.txt | tr '\n' ' ' | tail -c 200)"; }
bench qM $B bench -m /dev/shm/q -p 0 -n 128 --reps 3
bench qdM $B bench -m /dev/shm/q -p 0 --ctx 4096 -n 64 --reps 2
bench mM $B bench -m /dev/shm/m -p 0 -n 128 --reps 3
(cd $OUT && tar czf logs.tgz log && rm -rf log)
