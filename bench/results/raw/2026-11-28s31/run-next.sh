#!/usr/bin/env bash
# The next device runs (prepared in session 31, not run: no device time left), for
# next-route-in-gu.patch of this folder: norm_route writes the router logits alone and the
# gate|up experts GEMV (gemv_tma.cu's routing instance, R) routes inside every block from them,
# so the router's last block (its counter, the logits read back, the top-k and its tail: 3.3-3.6 us
# of norm_route's 6.4 us a layer on qwen3-30b-a3b, run tl1) leaves the chain. Checked here: it
# compiles; gemv_tma.cu's other kernels and gemv_mma.cu's are byte for byte as main's
# (dev/cubin_diff.py); the R instances take 83 registers, no spills, 2 KB static shared memory
# (a stage fewer where that would leave one block an SM). FP4S_MOE_GU_ROUTE=0 turns it off in the
# same binary (the A/B that leaves the code layout alone). test_moe_router's BLOCK cases check that
# mode 3 takes it on both launches and gives the bits of the router kernel's own top-k; ROUTE
# cases check the logits-only launch.
# Layout: .gpu/run.sh (this file), .gpu/treeA (main), .gpu/treeR (main + next-route-in-gu.patch),
# .gpu/deps (scripts/gpu-deps.sh), .gpu/shared/realdata/stories260K. Then
#   cd .gpu && TAG=r1 timeout 560 bash run.sh b; TAG=r1 bash run.sh pack      (builds, tests R, benches)
#   cd .gpu && TAG=r2 timeout 560 bash run.sh t; TAG=r2 bash run.sh pack      (R's whole GPU suite)
#   cd .gpu && TAG=r3 timeout 300 bash run.sh tl; TAG=r3 bash run.sh pack     (R's step timeline)
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
  J=6 bld $G/treeA /tmp/fA $L/build-A.log fp4serve & J=10 bld $G/treeR /tmp/fR $L/build-R.log fp4serve test_moe_router & wait
  (cd $G/treeR && timeout 90 $(find /tmp/fR -name test_moe_router -type f | head -1) > $L/tmr.txt 2>&1; ts "test_moe_router R rc=$?"; tail -3 $L/tmr.txt >> $S)
  gen qwen3-30b-a3b nvfp4; gen llama3-8b nvfp4; gen gpt-oss-20b mxfp4
  for rr in 1 2; do for v in A R R0; do
    b=/tmp/f${v:0:1}; [ $v = R0 ] && b="env FP4S_MOE_GU_ROUTE=0 /tmp/fR"
    bench q-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3; bench qd-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 --ctx 4096 -n 64 --reps 2
    [ $v = R0 ] && continue
    bench l-$v-$rr "$b" /dev/shm/llama3-8b -p 0 -n 128 --reps 3; bench o-$v-$rr "$b" /dev/shm/gpt-oss-20b -p 0 -n 128 --reps 3
  done; done ;;
t)
  J=12 bld $G/treeR /tmp/fR $L/build-R.log all
  (cd $G/treeR && timeout 480 ctest --test-dir /tmp/fR -L gpu -j4 --output-on-failure > $L/ctest-R.txt 2>&1; ts "ctest R rc=$?")
  grep -E "tests passed|Failed|\*\*\*|Passed|Timeout" $L/ctest-R.txt >> $S ;;
tl)
  XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" J=16 bld $G/treeR /tmp/tlR $L/build-tl.log fp4serve
  [ -d /dev/shm/qwen3-30b-a3b ] || /tmp/tlR/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1
  for e in 1 0; do FP4S_MOE_GU_ROUTE=$e FP4S_TL=$L/tl-q$e.txt /tmp/tlR/fp4serve bench -m /dev/shm/qwen3-30b-a3b -p 0 -n 64 --reps 1 > $L/tlbench-q$e.txt 2>&1
    (cd $G/treeR/dev && python3 timeline.py $L/tl-q$e.txt > $L/tlsum-q$e.txt 2>&1); gzip $L/tl-q$e.txt
    ts "tl gu_route=$e: $(grep -E '^(tg|pp)' $L/tlbench-q$e.txt | tail -1)"; grep -m1 -A9 "per position" $L/tlsum-q$e.txt >> $S; done ;;
pack) (cd $OUT && tar -czf run-${TAG:-x}.tgz logs && rm -rf logs) ;;
esac; done
