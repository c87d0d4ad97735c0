#!/usr/bin/env bash
# Session 33's device runs. Layout: .gpu/run.sh (this file), .gpu/treeA (main), .gpu/treeT2
# (main + ../2026-11-29s32/next-route-twice.patch), .gpu/treeW (main + next-route-w4.patch), each
# `git archive HEAD | tar -x` and `patch -p1`, .gpu/deps (scripts/gpu-deps.sh),
# .gpu/shared/realdata/stories260K. Phases c and w are session 32's run-next.sh as run (call 1).
#   call 2: cd .gpu && TAG=d2 timeout 570 bash run.sh dt; TAG=d2 bash run.sh pack
# Phase dt: main's whole GPU suite (test_gemv's SwiGLU-out bound of 5e-5 first runs here), and
# beside its build a timeline build of main: qwen3-30b-a3b at depth 4096 and at tg, the decode
# attention's marks (dev/attn_marks.py) and the launches a layer (dev/timeline.py).
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
G=$PWD; L=$OUT/logs; mkdir -p $L $OUT/tl; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" >> $S; }
bld() { local s0=$(date +%s) src=$1 dir=$2 log=$3; shift 3
  cmake -S $src -B $dir -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$G/deps/root/usr ${XF:+"$XF"} > $log 2>&1 &&
  cmake --build $dir -j${J:-8} --target "$@" >> $log 2>&1; ts "build $dir rc=$? $(( $(date +%s)-s0 )) s"; }
bench() { local lab=$1 bin=$2 m=$3; shift 3
  eval "$bin/fp4serve" bench -m $m "$@" > $L/b-$lab.txt 2>&1; ts "$lab $(grep -E '^(tg|pp)' $L/b-$lab.txt | tail -1)"; }
# call 3: cd .gpu && TAG=d3 timeout 400 bash run.sh dd; TAG=d3 bash run.sh pack
# Phase dd: the same timeline at depth 4096 (FP4S_TL_STEP=6: a depth run replays fewer graphs than
# the default step 40), qwen3-30b-a3b and llama3-8b.
# call 4: cd .gpu && TAG=p4 timeout 560 bash run.sh p; TAG=p4 bash run.sh pack
# Phase p: pmerge.patch (.gpu/treeP: main + it): the decode attention's merge by the last
# min(G, splits) blocks, a head each (FP4S_ATTN_PMERGE=0: the last block alone, in the same
# binary), qwen3-30b-a3b and llama3-8b at depth 4096 and tg128, the attention's marks at depth,
# then test_attention.
# call 5: cd .gpu && TAG=v5 timeout 200 bash run.sh v; TAG=v5 bash run.sh pack
# Phase v: pmerge.patch's own test_attention cases (call 4's whole run passed its timeout), verbose.
# call 6: cd .gpu && TAG=x6 timeout 240 bash run.sh x; TAG=x6 bash run.sh pack
# Phase x: treeP = main + pmerge-diag.patch (pmerge.patch and FP4S_ATTN_PMDIAG=1: the waiting
# blocks leave after their wait and the last merges alone). Does the experts' gate|up work longer
# because more SMs run the merge's code, or because of the wait itself?
# tl LAB BIN "BENCH ARGS" [ENV...]: one recorded run; summaries into logs, the recording dropped
tl() { local lab=$1 bin=$2 args=$3; shift 3
  env "$@" FP4S_TL=$OUT/tl/tl-$lab.txt $bin/fp4serve bench -m /dev/shm/${MOD:-qwen3-30b-a3b} $args --reps 1 > $L/tlbench-$lab.txt 2>&1
  (cd $G/treeA/dev && python3 timeline.py $OUT/tl/tl-$lab.txt > $L/tlsum-$lab.txt 2>&1
   python3 attn_marks.py $OUT/tl/tl-$lab.txt > $L/am-$lab.txt 2>&1; python3 router_marks.py $OUT/tl/tl-$lab.txt > $L/rm-$lab.txt 2>&1)
  rm -f $OUT/tl/tl-$lab.txt; ts "$lab: $(grep -E '^(tg|pp)' $L/tlbench-$lab.txt | tail -1)"
  grep -m1 -A8 "per position" $L/tlsum-$lab.txt | tail -7 >> $S; tail -12 $L/am-$lab.txt >> $S; }
for ph in "$@"; do case $ph in
dt)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  J=11 bld $G/treeA /tmp/fallA $L/build-allA.log all & 
  XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" J=5 bld $G/treeA /tmp/fT $L/build-T.log fp4serve
  [ -d /dev/shm/qwen3-30b-a3b ] || /tmp/fT/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1
  tl Td /tmp/fT "-p 0 --ctx 4096 -n 16"; tl Tg /tmp/fT "-p 0 -n 32"
  wait
  (cd $G/treeA && timeout 400 ctest --test-dir /tmp/fallA -L gpu -j4 --output-on-failure > $L/ctest-A.txt 2>&1; ts "ctest A rc=$?")
  grep -E "tests passed|Failed|FAIL|\*\*\*|Passed|Timeout" $L/ctest-A.txt >> $S ;;
dd)
  XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" J=16 bld $G/treeA /tmp/fT $L/build-T.log fp4serve
  /tmp/fT/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1 &
  /tmp/fT/fp4serve gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen-l.log 2>&1 & wait
  for rr in 1 2; do tl Td-$rr /tmp/fT "-p 0 --ctx 4096 -n 16" FP4S_TL_STEP=6; done
  MOD=llama3-8b tl Ld /tmp/fT "-p 0 --ctx 4096 -n 16" FP4S_TL_STEP=6; MOD=llama3-8b tl Lg /tmp/fT "-p 0 -n 64" ;;
p)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  J=10 bld $G/treeP /tmp/fP $L/build-P.log fp4serve test_attention &
  XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" J=6 bld $G/treeP /tmp/fTP $L/build-TP.log fp4serve & wait
  /tmp/fP/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1 &
  /tmp/fP/fp4serve gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen-l.log 2>&1 & wait
  for rr in 1 2; do for v in P P0; do
    b=/tmp/fP; [ $v = P0 ] && b="env FP4S_ATTN_PMERGE=0 /tmp/fP"
    bench qd-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 --ctx 4096 -n 64 --reps 2
    bench ld-$v-$rr "$b" /dev/shm/llama3-8b -p 0 --ctx 4096 -n 64 --reps 2
  done; done
  for v in P P0; do b=/tmp/fP; [ $v = P0 ] && b="env FP4S_ATTN_PMERGE=0 /tmp/fP"
    bench q-$v "$b" /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3; done
  tl TPd /tmp/fTP "-p 0 --ctx 4096 -n 16" FP4S_TL_STEP=6; tl TP0d /tmp/fTP "-p 0 --ctx 4096 -n 16" FP4S_TL_STEP=6 FP4S_ATTN_PMERGE=0
  (cd $G/treeP && timeout 240 $(find /tmp/fP -name test_attention -type f | head -1) > $L/tatt-P.txt 2>&1; ts "test_attention P rc=$?"; tail -3 $L/tatt-P.txt >> $S; grep -c FAIL $L/tatt-P.txt >> $S) ;;
v)
  J=16 bld $G/treeP /tmp/fP $L/build-P.log test_attention
  (cd $G/treeP && FP4S_TEST_VERBOSE=1 timeout 100 $(find /tmp/fP -name test_attention -type f | head -1) pmerge > $L/tatt-pm.txt 2>&1; ts "test_attention pmerge rc=$?"; tail -2 $L/tatt-pm.txt >> $S; grep -c "pmerge" $L/tatt-pm.txt >> $S; grep FAIL $L/tatt-pm.txt | head -5 >> $S) ;;
x)
  XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" J=16 bld $G/treeP /tmp/fTP $L/build-TP.log fp4serve
  /tmp/fTP/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1
  for v in on diag off; do e=FP4S_X=0; [ $v = diag ] && e=FP4S_ATTN_PMDIAG=1; [ $v = off ] && e=FP4S_ATTN_PMERGE=0
    tl X$v /tmp/fTP "-p 0 --ctx 4096 -n 16" FP4S_TL_STEP=6 $e; grep -A9 "per position" $L/tlsum-X$v.txt | grep -E "^(0|3) " >> $S; done ;;
pack) (cd $OUT && rm -rf tl && tar -czf run-${TAG:-x}.tgz logs && rm -rf logs) ;;
esac; done
