#!/bin/bash
# Session 51, call 4: the layer path's one-token matmuls (gemv_tma.cu NG = 1, moe_tma.cu) with each
# step's MMA pairs in two chains (gt.patch, -DGT_2CH): the tree and the variant built, test_gemv and
# test_gemv_experts on the variant, then llama3-8b and qwen3-30b-a3b benched on the layer path
# (FP4S_MSTEP=0), tg128 and depth 4096, RUNS rounds. P (patch name in this folder, default gt) and
# F (its nvcc flags, commas between, default -DGT_2CH) pick another variant.
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
L=$OUT/log; mkdir -p $L; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" | tee -a $S; }
PD=$(cd "$(dirname "$0")" && pwd)
bld() { cmake -S $2 -B /tmp/b-$1 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr \
	"-DCMAKE_CUDA_FLAGS=$3" > $L/build-$1.log 2>&1 && cmake --build /tmp/b-$1 -j16 --target $4 >> $L/build-$1.log 2>&1; ts "build $1 ($3) rc=$?"; }
bld base . "" fp4serve
( for m in llama3-8b qwen3-30b-a3b; do [ -d /dev/shm/$m ] || /tmp/b-base/fp4serve gen --preset $m --format nvfp4 /dev/shm/$m > $L/gen-$m.log 2>&1; ts "gen $m rc=$?"; done ) &
P=${P:-gt}; F=${F:--DGT_2CH}; F=${F//,/ }
src=/tmp/src-$P; rm -rf $src; mkdir -p $src; tar --exclude=./build --exclude=./.git -cf - . | (cd $src && tar xf -)
(cd $src && patch -p1 < $PD/$P.patch > /dev/null) || ts "patch failed"
bld $P $src "$F" "fp4serve test_gemv test_gemv_experts"
for t in test_gemv test_gemv_experts; do x=$(find /tmp/b-$P -name $t -type f | head -1)
	timeout 200 $x > $L/t-$t.txt 2>&1; ts "$t ($P) rc=$?"; grep -E "FAIL|failed|checks|SKIP" $L/t-$t.txt | tail -4 | tee -a $S; done
wait
bench() { local lab=$1; shift; timeout 200 env "$@" > $L/b-$lab.txt 2>&1; echo "rc=$?" >> $L/b-$lab.txt; ts "$lab $(grep -E '^(tg|pp)|rc=' $L/b-$lab.txt | tr '\n' ' ' | tail -c 200)"; }
for r in $(seq ${RUNS:-2}); do for m in llama3-8b qwen3-30b-a3b; do for n in base $P; do
	bench $m-$n-$r FP4S_MSTEP=0 /tmp/b-$n/fp4serve bench -m /dev/shm/$m -p 0 -n 128 --reps 3
	bench $m-$n-d$r FP4S_MSTEP=0 /tmp/b-$n/fp4serve bench -m /dev/shm/$m -p 0 --ctx 4096 -n 64 --reps 2
done; done; done
(cd $OUT && tar czf logs.tgz log && rm -rf log)
