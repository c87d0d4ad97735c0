#!/usr/bin/env bash
# Session 35's device runs (bench/results/2026-11-29-h200-session35.md). Layout: .gpu/run.sh (this
# file), .gpu/treeA (main, 112a7c5: `git archive HEAD | tar -x`, bench/results removed), .gpu/deps
# (scripts/gpu-deps.sh), .gpu/shared/realdata/stories260K; the patches are read from this folder
# ($P, the working tree travels). Patches apply with `patch -p1`: `git apply` in a tree copied under a
# git checkout silently skips every file. Each call: cd .gpu && TAG=T timeout N bash run.sh PHASE;
# TAG=T bash run.sh pack. Session 34's phases are in raw/2026-11-29s34/run.sh.
#   call 1  a  (TAG=a7, timeout 560)
#   call 2  b  (TAG=b2, timeout 560)
#   call 3  c  (TAG=c3, timeout 560)
#   call 4  d  (TAG=d4, timeout 470)
#   call 5  f  (TAG=f5, timeout 185: the budget's last ~220 s)
#   x  ran in session 36 (TAG=x1, timeout 500: raw/2026-11-29s36/sum-x1.txt, run-x1.tgz)
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
G=$PWD; L=$OUT/logs; mkdir -p $L; S=$OUT/sum.txt; R=$G/treeA; P=$G/../bench/results/raw/2026-11-29s35
ts() { echo "$(date +%T) $*" >> $S; }
bld() { local s0=$(date +%s) src=$1 dir=$2 log=$3; shift 3
  cmake -S $src -B $dir -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$G/deps/root/usr > $log 2>&1 &&
  cmake --build $dir -j${J:-8} --target "$@" >> $log 2>&1; ts "build $dir rc=$? $(( $(date +%s)-s0 )) s"; }
# bench LAB VARIANT ARGS: fp4serve bench of /tmp/bins/VARIANT; a variant in OFF is its base's
# binary with the tile groups off (FP4S_GEMV_TMA_GROUPS=0)
OFF="RT0:RT RT200:RT20 RB0:RB C0:C d10:d1 dr0:dr E50:E5"
bench() { local lab=$1 v=$2 m=$3 b; shift 3
  b=$(for p in $OFF; do [ ${p%%:*} = $v ] && echo ${p#*:}; done)
  if [ -n "$b" ]; then env FP4S_GEMV_TMA_GROUPS=0 /tmp/bins/$b/fp4serve bench -m $m "$@"; else /tmp/bins/$v/fp4serve bench -m $m "$@"; fi > $L/b-$lab.txt 2>&1
  ts "$lab $(grep -E '^(tg|pp)' $L/b-$lab.txt | tail -1)"; }
qtg() { bench q-$1 $2 /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3; }
qdp() { bench qd-$1 $2 /dev/shm/qwen3-30b-a3b -p 0 --ctx 4096 -n 64 --reps 2; }
ltg() { bench l-$1 $2 /dev/shm/llama3-8b -p 0 -n 128 --reps 3; }
# main: A from treeA in /tmp/fa, then both models' weights in the background (wait for them)
mainA() { nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  J=${1:-8} bld $R /tmp/fa $L/build-a.log fp4serve; mkdir -p /tmp/bins/A; cp /tmp/fa/fp4serve /tmp/bins/A/
  /tmp/bins/A/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1 &
  /tmp/bins/A/fp4serve gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen-l.log 2>&1 & }
# pb DIR V:PATCH...: each patch (DIR/PATCH.patch) applied to treeA in turn, /tmp/fa rebuilt (only
# gemv_tma.cu and its headers recompile), the binary kept as /tmp/bins/V, the patch taken back
pb() { local d=$1 v; shift
  for v in "$@"; do
    (cd $R && patch -p1 -s --no-backup-if-mismatch < $d/${v#*:}.patch) && cmake --build /tmp/fa -j${J:-8} --target fp4serve >> $L/build-a.log 2>&1 &&
      mkdir -p /tmp/bins/${v%%:*} && cp /tmp/fa/fp4serve /tmp/bins/${v%%:*}/; ts "built ${v%%:*} rc=$?"
    (cd $R && patch -p1 -R -s --no-backup-if-mismatch < $d/${v#*:}.patch)
  done; }
# tree NAME PATCH: $G/NAME = treeA + $P/PATCH.patch (a build with tests of its own)
tree() { rm -rf $G/$1; cp -r $R $G/$1; (cd $G/$1 && patch -p1 -s --no-backup-if-mismatch < $P/$2.patch); }
TESTS="test_gemv test_gemv_experts test_moe_router"
# tt NAME BUILD TEST...: tests run from $G/NAME's root, their last lines and failures to the summary
tt() { local n=$1 b=$2 x t; shift 2
  for x in "$@"; do t=$(find $b -name $x -type f | head -1)
    (cd $G/$n && timeout 240 env FP4S_TEST_VERBOSE=1 $t > $L/t-$n-$x.txt 2>&1; ts "$n $x rc=$?")
    tail -2 $L/t-$n-$x.txt >> $S; grep -m5 FAIL $L/t-$n-$x.txt >> $S
  done; }
for ph in "$@"; do case $ph in
# Phase a: does the step loop's place against 256-byte lines decide ~6 %? Session 34's patches:
#   A     main: NVFP4 M = 1 kernel's step loop at 0xc400 (0 mod 256)
#   P4    pad-main-4.patch: a never-taken block before the loop moves it to 0xc380 (128 mod 256)
#   P20   pad-main-20.patch: to 0xc600 (0 mod 256), the pad's own cost
#   RT    groups-rt-head.patch (groups-rt.patch on this main): loop at 0xc980 (128 mod 256)
#   RT20  groups-rt-pad20.patch: loop at 0xcd00 (0 mod 256)
# (offsets from dev/sass_loops.py on nvcc 13.0 cubins, the GPU machine's version too). qwen3-30b-a3b
# tg128 and depth 4096 for each and RT / RT20 with groups off, two rounds; llama3-8b A, P4, P20.
# (Run with `cuobjdump -sass -fun gemv_tma_kernel`, which wants the mangled name and dumped
# nothing; the whole binary's SASS is read now.)
a)
  mainA 16; J=16 pb $G/../bench/results/raw/2026-11-29s34 P4:pad-main-4 P20:pad-main-20 RT:groups-rt-head RT20:groups-rt-pad20
  wait
  for v in A P4 P20 RT RT20; do cuobjdump -sass /tmp/bins/$v/fp4serve > $L/sass-$v.txt 2>&1
    echo "== $v" >> $S; python3 $R/dev/sass_loops.py $L/sass-$v.txt --fun gemv_tma_kernel 2>&1 | head -30 >> $S; gzip -f $L/sass-$v.txt; done &
  for rr in 1 2; do for v in A P4 P20 RT RT0 RT20 RT200; do qtg $v-$rr $v; qdp $v-$rr $v; done; done
  for v in A P4 P20; do ltg $v $v; done
  wait ;;
# Phase b: groups-rt.patch's register-named group barrier (bar.sync %r) made ptxas reserve all 16
# of the block's barriers (main: 2). Is that its 6 %? B16 = main + bar16.patch (a never-taken
# register-named bar.sync: only the reservation), RB = groups-rt-bar.patch (immediate ids: 6
# barriers; test_moe_router's bit equalities between the MoE's forms 1e-5), RB0 = RB with groups
# off. qwen3-30b-a3b tg128 and depth 4096, two rounds; llama3-8b tg128; RB's tests.
b)
  tree treeT groups-rt-bar; J=8 bld $G/treeT /tmp/ft $L/build-t.log fp4serve $TESTS test_engine_cuda test_golden &
  mainA; pb $P B16:bar16
  wait; mkdir -p /tmp/bins/RB; cp /tmp/ft/fp4serve /tmp/bins/RB/
  for rr in 1 2; do for v in A B16 RB RB0; do qtg $v-$rr $v; qdp $v-$rr $v; done; done
  for v in A B16 RB; do ltg $v $v; done
  tt treeT /tmp/ft test_moe_router test_gemv_experts test_gemv test_engine_cuda test_golden ;;
# Phase c: RB stayed 2 % under main with groups and 6 % with them off (llama3-8b, which takes no
# groups, -4 %): the cost is the code, not the barriers. C = groups-rt-c.patch: RB with the
# epilogue's sum over the group's warps unrolled over GT_W (it looped to a run-time WG) and
# gt_next_n unrolled. KP = main + only the producer's part (empty count, end stages), KC = main +
# only the consumer's (both never set groups). llama3-8b and qwen3-30b-a3b tg128, two rounds;
# depth 4096 A, C; C's tests.
c)
  tree treeT groups-rt-c; J=8 bld $G/treeT /tmp/ft $L/build-t.log fp4serve $TESTS test_engine_cuda test_golden &
  mainA; pb $P KP:kp KC:kc
  wait; mkdir -p /tmp/bins/C; cp /tmp/ft/fp4serve /tmp/bins/C/
  for rr in 1 2; do for v in A C KP KC; do ltg $v-$rr $v; done
    for v in A C C0 KP KC; do qtg $v-$rr $v; done; done
  for v in A C; do qdp $v $v; done
  tt treeT /tmp/ft test_moe_router test_gemv_experts test_gemv test_engine_cuda test_golden ;;
# Phase d: C cost more than RB (llama3-8b -7.2 %, KC alone the same; KP 0): the consumer's added
# code is the cost. d1 = groups-rt-d1.patch: RB with gt_next_n one add and compare (no loop);
# dr = groups-rt-dr.patch: d1 with one register-named bar.sync instead of a branch a group.
# llama3-8b and qwen3-30b-a3b tg128 (and groups off), two rounds; the better one's tests.
d)
  for v in d1 dr; do tree tree-$v groups-rt-$v; J=5 bld $G/tree-$v /tmp/f$v $L/build-$v.log fp4serve $TESTS & done
  mainA 6
  wait; for v in d1 dr; do mkdir -p /tmp/bins/$v; cp /tmp/f$v/fp4serve /tmp/bins/$v/; done
  for rr in 1 2; do for v in A d1 dr; do ltg $v-$rr $v; done
    for v in A d1 d10 dr dr0; do qtg $v-$rr $v; done; done
  sc() { cat $L/b-l-$1-1.txt $L/b-l-$1-2.txt $L/b-q-$1-1.txt $L/b-q-$1-2.txt | awk '/^tg/{s+=$3} END{print s}'; }
  w=$(awk -v a="$(sc d1)" -v b="$(sc dr)" 'BEGIN{print (b > a) ? "dr" : "d1"}'); ts "scores d1 $(sc d1) dr $(sc dr) A $(sc A): tests of $w"
  tt tree-$w /tmp/f$w test_moe_router test_gemv_experts test_gemv ;;
# Phase f: E5 = e5.patch: dr with the epilogue's sum as main's (all GT_W warps' partials, unrolled,
# the other groups' selected out; partials at the warp's own index): the stage loop 9904 B against
# main's 9408 (dr 11376). llama3-8b and qwen3-30b-a3b tg128, A / E5 (/ E5 with groups off), two
# rounds.
f)
  tree tree-e5 e5; J=8 bld $G/tree-e5 /tmp/fe5 $L/build-e5.log fp4serve &
  mainA
  wait; mkdir -p /tmp/bins/E5; cp /tmp/fe5/fp4serve /tmp/bins/E5/
  for rr in 1 2; do for v in A E5; do ltg $v-$rr $v; done
    for v in A E5 E50; do qtg $v-$rr $v; done; done ;;
# Phase x (prepared for the next session): which of E5's consumer changes costs llama3-8b (which
# takes no groups) its 2.4 %? Each alone on main (a.tgroups, never set, in gm_args): x1 = e3.patch
# (the stage advance as one add and compare), x2 (u0 from the warp's place in its group), x3 (a
# group's first stage before the loop), x4 (bar.sync with a register id and count: 16 barriers),
# x5 (the epilogue thread's place in its group), x6 (the select sum), x7 = kp.patch (the
# producer's part: 0 in call 3), and E5 whole. llama3-8b tg128 each, two rounds; qwen3-30b-a3b
# A / E5.
x)
  mainA 16; J=16 pb $P x1:e3 x2:x2 x3:x3 x4:x4 x5:x5 x6:x6 x7:kp E5:e5
  wait
  for rr in 1 2; do for v in A x1 x2 x3 x4 x5 x6 x7 E5; do ltg $v-$rr $v; done
    for v in A E5; do qtg $v-$rr $v; done; done ;;
pack) (cd $OUT && tar -czf run-${TAG:-x}.tgz logs && rm -rf logs) ;;
esac; done
