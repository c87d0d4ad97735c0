#!/bin/bash
# Session 42's last call: build fp4serve and test_mstep (sm_90a), test_mstep on the dense presets,
# fp4serve bench on llama3-8b (gen, /dev/shm) with the whole-step kernel, then the same with
# FP4S_DSTEP_TL=16 (layer 16's phase marks of the last step, printed at exit); Q8=1 adds the
# layer path's figures and qwen3-8b's.
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
L=$OUT/log; mkdir -p $L; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" | tee -a $S; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader > $L/gpu.txt 2>&1
cmake -S . -B /tmp/b -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr \
	> $L/build.log 2>&1 && cmake --build /tmp/b -j16 --target fp4serve test_mstep >> $L/build.log 2>&1
rc=$?; ts "build rc=$rc"; [ $rc = 0 ] || { tail -40 $L/build.log; exit 1; }
B=/tmp/b/fp4serve
( $B gen --preset llama3-8b --format nvfp4 /dev/shm/m > $L/gen.log 2>&1; ts "gen rc=$?"
  [ -n "${Q8:-}" ] && { $B gen --preset qwen3-8b --format nvfp4 /dev/shm/q8 > $L/gen-q8.log 2>&1; ts "gen q8 rc=$?"; } ) &
timeout 200 $(find /tmp/b -name test_mstep -type f | head -1) llama3-8b qwen3-8b > $L/t-test_mstep.txt 2>&1
ts "test_mstep rc=$?"; grep -E "pool:|requests equal|FAIL|differ|request|did not" $L/t-test_mstep.txt | head -20 | tee -a $S
wait
bench() { local lab=$1; shift; timeout 150 env "$@" > $L/b-$lab.txt 2>&1; echo "rc=$?" >> $L/b-$lab.txt; ts "$lab $(grep -E '^(tg|pp)|rc=' $L/b-$lab.txt | tr '\n' ' ' | tail -c 200)"; }
bench M $B bench -m /dev/shm/m -p 0 -n 128 --reps 3
bench dM $B bench -m /dev/shm/m -p 0 --ctx 4096 -n 64 --reps 2
bench tl FP4S_DSTEP_TL=16 $B bench -m /dev/shm/m -p 0 -n 128 --reps 3
bench dtl FP4S_DSTEP_TL=16 $B bench -m /dev/shm/m -p 0 --ctx 4096 -n 64 --reps 2
if [ -n "${Q8:-}" ]; then
	bench A FP4S_MSTEP=0 $B bench -m /dev/shm/m -p 0 -n 128 --reps 3
	bench dA FP4S_MSTEP=0 $B bench -m /dev/shm/m -p 0 --ctx 4096 -n 64 --reps 2
	bench q8M $B bench -m /dev/shm/q8 -p 0 -n 128 --reps 3
	bench q8dM $B bench -m /dev/shm/q8 -p 0 --ctx 4096 -n 64 --reps 2
	bench q8A FP4S_MSTEP=0 $B bench -m /dev/shm/q8 -p 0 -n 128 --reps 3
	bench q8dA FP4S_MSTEP=0 $B bench -m /dev/shm/q8 -p 0 --ctx 4096 -n 64 --reps 2
fi
grep -A14 "dstep timeline" $L/b-tl.txt $L/b-dtl.txt | tee -a $S
(cd $OUT && tar czf logs.tgz log && rm -rf log)
