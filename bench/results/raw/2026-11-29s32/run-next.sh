#!/usr/bin/env bash
# The next device runs (prepared in session 32, not run: no device time left). Does the router's
# top-k wait on its own code? Session 13 found a router launch on a cold copy of its code
# (FP4S_DIAG_CLONE=16) no slower than the default, i.e. its code is cold anyway, and session 32's
# marks put route_reg at ~3x the cycles its instructions need. Runs, on qwen3-30b-a3b, each with the
# step timeline (dev/router_marks.py: the last block's marks, medians over the layers):
#   T   main, -DFP4S_DIAG_TL -DFP4S_DIAG_CLONE: default; FP4S_DIAG_CLONE=16 (the router on a cold
#       copy); FP4S_ROUTE_WARM=0 (no warm-up before the PDL wait)
#   T2  main + next-route-twice.patch, -DFP4S_DIAG_TL -DFP4S_DIAG_ROUTE2: the last block runs the
#       top-k once unmarked, then marked, so the marks time it with its code warm
# If T2's marked top-k is far shorter than T's, the chain is instruction fetch, and the fix is
# fewer distinct instructions on it (or its code kept hot), not fewer operations.
# Phase w: the candidate fix, next-route-w4.patch (W): norm_route launched with a fifth warp, the
# router warp, which takes no row, runs the top-k dry right after the PDL wait (~2 us before the
# last block needs it, instead of the warm-up ~7-10 us before, ahead of the wait) and, in the last
# block, routes. FP4S_ROUTE_W4=0 gives main's form in the same binary. Checked here: compiles,
# 123-172 registers, no spills; the timeline build too. test_moe_router's ROUTE cases take it at
# E <= 256.
# Phase t: the whole GPU suite of T=A (main) or T=W (test_gemv's SwiGLU-out bound of 5e-5 has
# not run yet).
# Layout: .gpu/run.sh (this file), .gpu/treeA (main), .gpu/treeT2 (main + next-route-twice.patch),
# .gpu/treeW (main + next-route-w4.patch), each `git archive HEAD | tar -x` and `patch -p1`,
# .gpu/deps (scripts/gpu-deps.sh), .gpu/shared/realdata/stories260K. Then
#   cd .gpu && TAG=c1 timeout 570 bash run.sh c w; TAG=c1 bash run.sh pack
#   cd .gpu && TAG=c2 T=W timeout 570 bash run.sh t; TAG=c2 bash run.sh pack
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
G=$PWD; L=$OUT/logs; mkdir -p $L; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" >> $S; }
bld() { local s0=$(date +%s) src=$1 dir=$2 log=$3; shift 3
  cmake -S $src -B $dir -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$G/deps/root/usr ${XF:+"$XF"} > $log 2>&1 &&
  cmake --build $dir -j${J:-8} --target "$@" >> $log 2>&1; ts "build $dir rc=$? $(( $(date +%s)-s0 )) s"; }
bench() { local lab=$1 bin=$2 m=$3; shift 3
  eval "$bin/fp4serve" bench -m $m "$@" > $L/b-$lab.txt 2>&1; ts "$lab $(grep -E '^(tg|pp)' $L/b-$lab.txt | tail -1)"; }
tl() { local lab=$1 bin=$2; shift 2
  env "$@" FP4S_TL=$L/tl-$lab.txt $bin/fp4serve bench -m /dev/shm/qwen3-30b-a3b -p 0 -n 64 --reps 1 > $L/tlbench-$lab.txt 2>&1
  (cd $G/treeA/dev && python3 timeline.py $L/tl-$lab.txt > $L/tlsum-$lab.txt 2>&1; python3 router_marks.py $L/tl-$lab.txt > $L/rm-$lab.txt 2>&1)
  gzip $L/tl-$lab.txt; ts "$lab: $(grep -E '^(tg|pp)' $L/tlbench-$lab.txt | tail -1)"; tail -1 $L/rm-$lab.txt >> $S
  grep -m1 -A7 "per position" $L/tlsum-$lab.txt | tail -6 >> $S; }
for ph in "$@"; do case $ph in
c)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL -DFP4S_DIAG_CLONE" J=8 bld $G/treeA /tmp/fT $L/build-T.log fp4serve &
  XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL -DFP4S_DIAG_ROUTE2" J=8 bld $G/treeT2 /tmp/fT2 $L/build-T2.log fp4serve & wait
  [ -d /dev/shm/qwen3-30b-a3b ] || /tmp/fT/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1
  for rr in 1 2; do
    tl T-$rr /tmp/fT; tl Tclone-$rr /tmp/fT FP4S_DIAG_CLONE=16; tl Tnowarm-$rr /tmp/fT FP4S_ROUTE_WARM=0; tl T2-$rr /tmp/fT2
  done ;;
w)
  J=6 bld $G/treeA /tmp/fA $L/build-A.log fp4serve & J=10 bld $G/treeW /tmp/fW $L/build-W.log fp4serve test_moe_router & wait
  (cd $G/treeW && timeout 90 $(find /tmp/fW -name test_moe_router -type f | head -1) > $L/tmr-W.txt 2>&1; ts "test_moe_router W rc=$?"; tail -2 $L/tmr-W.txt >> $S)
  [ -d /dev/shm/qwen3-30b-a3b ] || /tmp/fA/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1
  for rr in 1 2; do for v in A W W0; do
    b=/tmp/f${v:0:1}; [ $v = W0 ] && b="env FP4S_ROUTE_W4=0 /tmp/fW"
    bench q-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3; bench qd-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 --ctx 4096 -n 64 --reps 2
  done; done
  XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" J=16 bld $G/treeW /tmp/fTW $L/build-TW.log fp4serve
  tl TW /tmp/fTW; tl TW0 /tmp/fTW FP4S_ROUTE_W4=0 ;;
t)
  T=${T:-A}; J=16 bld $G/tree$T /tmp/fall$T $L/build-all$T.log all
  (cd $G/tree$T && timeout 480 ctest --test-dir /tmp/fall$T -L gpu -j4 --output-on-failure > $L/ctest-$T.txt 2>&1; ts "ctest $T rc=$?")
  grep -E "tests passed|Failed|FAIL|\*\*\*|Passed|Timeout" $L/ctest-$T.txt >> $S ;;
pack) (cd $OUT && tar -czf run-${TAG:-x}.tgz logs && rm -rf logs) ;;
esac; done
