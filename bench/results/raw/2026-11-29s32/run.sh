#!/usr/bin/env bash
# Session 32's device runs (H200). The router's last block routes by its warp 0 with the logits
# in registers (route.cuh's route_reg; route-reg.patch of this folder, landed) against main, and
# against route_block in the same binary (FP4S_ROUTE_REG=0). Also session 31's prepared
# next-route-in-gu.patch (raw/2026-11-28s31/; variant R, run with the b phase of that folder's
# run-next.sh).
# Layout: .gpu/run.sh (this file), .gpu/treeA (main), .gpu/treeN (main + route-reg.patch),
# .gpu/deps (scripts/gpu-deps.sh), .gpu/shared/realdata/stories260K. A tree is `git archive HEAD | tar -x`
# plus the patch by `patch -p1` (`git apply` run inside the checkout's ignored .gpu skips every path
# and says nothing: run aa1's "R" was main). Then
#   cd .gpu && TAG=n1 timeout 570 bash run.sh b tl; TAG=n1 bash run.sh pack   (builds, router test, benches, timeline)
#   cd .gpu && TAG=n2 timeout 570 bash run.sh t; TAG=n2 bash run.sh pack      (N's whole GPU suite)
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
G=$PWD; L=$OUT/logs; mkdir -p $L; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" >> $S; }
bld() { local s0=$(date +%s) src=$1 dir=$2 log=$3; shift 3
  [ -x $dir/fp4serve ] && { ts "build $dir: kept"; return; }
  cmake -S $src -B $dir -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$G/deps/root/usr ${XF:-} > $log 2>&1 &&
  cmake --build $dir -j${J:-8} --target "$@" >> $log 2>&1; ts "build $dir rc=$? $(( $(date +%s)-s0 )) s"; }
bench() { local lab=$1 bin=$2 m=$3; shift 3
  eval "$bin/fp4serve" bench -m $m "$@" > $L/b-$lab.txt 2>&1; ts "$lab $(grep -E '^(tg|pp)' $L/b-$lab.txt | tail -1)"; }
gen() { [ -d /dev/shm/$1 ] || /tmp/fA/fp4serve gen --preset $1 --format $2 /dev/shm/$1 > $L/gen-$1.log 2>&1; }
for ph in "$@"; do case $ph in
b)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  J=6 bld $G/treeA /tmp/fA $L/build-A.log fp4serve & J=10 bld $G/treeN /tmp/fN $L/build-N.log fp4serve test_moe_router & wait
  (cd $G/treeN && timeout 90 $(find /tmp/fN -name test_moe_router -type f | head -1) > $L/tmr.txt 2>&1; ts "test_moe_router N rc=$?"; tail -3 $L/tmr.txt >> $S)
  gen qwen3-30b-a3b nvfp4; gen llama3-8b nvfp4; gen gpt-oss-20b mxfp4
  for rr in 1 2; do for v in A N N0; do
    b=/tmp/f${v:0:1}; [ $v = N0 ] && b="env FP4S_ROUTE_REG=0 /tmp/fN"
    bench q-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3; bench qd-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 --ctx 4096 -n 64 --reps 2
    [ $v = N0 ] && continue
    bench l-$v-$rr "$b" /dev/shm/llama3-8b -p 0 -n 128 --reps 3; bench o-$v-$rr "$b" /dev/shm/gpt-oss-20b -p 0 -n 128 --reps 3
  done; done ;;
t)
  J=12 bld $G/treeN /tmp/fN $L/build-N.log all
  (cd $G/treeN && timeout 480 ctest --test-dir /tmp/fN -L gpu -j4 --output-on-failure > $L/ctest-N.txt 2>&1; ts "ctest N rc=$?")
  grep -E "tests passed|Failed|\*\*\*|Passed|Timeout" $L/ctest-N.txt >> $S ;;
tl)
  XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" J=16 bld $G/treeN /tmp/tlN $L/build-tl.log fp4serve
  [ -d /dev/shm/qwen3-30b-a3b ] || /tmp/tlN/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1
  for e in 1 0; do FP4S_ROUTE_REG=$e FP4S_TL=$L/tl-q$e.txt /tmp/tlN/fp4serve bench -m /dev/shm/qwen3-30b-a3b -p 0 -n 64 --reps 1 > $L/tlbench-q$e.txt 2>&1
    (cd $G/treeN/dev && python3 timeline.py $L/tl-q$e.txt > $L/tlsum-q$e.txt 2>&1); gzip $L/tl-q$e.txt
    ts "tl route_reg=$e: $(grep -E '^(tg|pp)' $L/tlbench-q$e.txt | tail -1)"; grep -m1 -A9 "per position" $L/tlsum-q$e.txt >> $S; done ;;
pack) (cd $OUT && tar -czf run-${TAG:-x}.tgz logs && rm -rf logs) ;;
esac; done
