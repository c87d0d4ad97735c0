#!/usr/bin/env bash
# Sessions 34 and 35's device runs (session 35: phases a, b, c, d, f run, x prepared; its patches
# are in raw/2026-11-29s35/ and .gpu/, against main 112a7c5, applied with patch -p1).
# Session 34's device runs. Layout: .gpu/run.sh (this file), .gpu/treeA (main, 2f12ed8),
# .gpu/treeR (main + rdy.patch), each `git archive HEAD | tar -x` (+ `patch -p1`), .gpu/deps
# (scripts/gpu-deps.sh).
#   call 1: cd .gpu && TAG=r1 timeout 570 bash run.sh r; TAG=r1 bash run.sh pack
# Phase r: rdy.patch, the router's ready flag: qwen3-30b-a3b's gate|up and down launches copy
# the routed experts' weights before their PDL wait. Its tests (test_moe_router, whose BLOCK
# cases chain 16 blocks with and without the flag; test_engine_cuda; test_golden_cuda;
# test_gemv_experts), then qwen3-30b-a3b tg128 and depth 4096 for main (A), the patch (R) and the
# patch with FP4S_MOE_RDY=0 (R0: the same binary, the flag off), two rounds; llama3-8b tg128 A / R
# (gemv_tma.cu's code changed for every matrix); timelines of R and R0 at tg32.
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
G=$PWD; L=$OUT/logs; mkdir -p $L $OUT/tl; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" >> $S; }
bld() { local s0=$(date +%s) src=$1 dir=$2 log=$3; shift 3
  cmake -S $src -B $dir -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$G/deps/root/usr ${XF:+"$XF"} > $log 2>&1 &&
  cmake --build $dir -j${J:-8} --target "$@" >> $log 2>&1; ts "build $dir rc=$? $(( $(date +%s)-s0 )) s"; }
bench() { local lab=$1 bin=$2 m=$3; shift 3
  eval "$bin/fp4serve" bench -m $m "$@" > $L/b-$lab.txt 2>&1; ts "$lab $(grep -E '^(tg|pp)' $L/b-$lab.txt | tail -1)"; }
# tl LAB BIN "BENCH ARGS" [ENV...]: one recorded run; summaries into logs, the recording dropped
tl() { local lab=$1 bin=$2 args=$3; shift 3
  env "$@" FP4S_TL=$OUT/tl/tl-$lab.txt $bin/fp4serve bench -m /dev/shm/${MOD:-qwen3-30b-a3b} $args --reps 1 > $L/tlbench-$lab.txt 2>&1
  (cd $G/treeA/dev && python3 timeline.py $OUT/tl/tl-$lab.txt > $L/tlsum-$lab.txt 2>&1)
  if [ -n "${KEEP:-}" ]; then mv $OUT/tl/tl-$lab.txt $OUT/tl/keep-$lab.txt; else rm -f $OUT/tl/tl-$lab.txt; fi; ts "$lab: $(grep -E '^(tg|pp)' $L/tlbench-$lab.txt | tail -1)"
  grep -A8 "all .* recorded steps" $L/tlsum-$lab.txt | tail -8 >> $S; }
tst() { local t=$(find /tmp/fR -name $1 -type f | head -1); shift
  (cd $G/treeR && timeout 200 env FP4S_TEST_VERBOSE=1 $t "$@" > $L/t-$(basename $t).txt 2>&1; ts "$(basename $t) rc=$?")
  tail -2 $L/t-$(basename $t).txt >> $S; }
# call 2: cd .gpu && TAG=m2 timeout 400 bash run.sh m; TAG=m2 bash run.sh pack
# Phase m: .gpu/treeM = main + marks.patch (gemv_tma.cu's tiles marked in the timeline build:
# 4 the first stage's bytes, 5 / 6 the first / second tile's epilogue done, 7 the last's; read by
# dev/tile_marks.py): qwen3-30b-a3b at tg32 and depth 4096, llama3-8b at tg64.
tm() { tl "$@"; (cd $G/treeM/dev && python3 tile_marks.py $OUT/tl/keep-$1.txt > $L/tm-$1.txt 2>&1); cat $L/tm-$1.txt >> $S; rm -f $OUT/tl/keep-$1.txt; }
# call 3: cd .gpu && TAG=g3 timeout 570 bash run.sh g; TAG=g3 bash run.sh pack
# Phase g: .gpu/treeG = main + groups.patch (gemv_tma.cu's tile groups: a block's consumer warps
# in 2 or 4 groups, each on its own tiles, where a block has 2 or more tiles of whole-row stages,
# one token; FP4S_GEMV_TMA_GROUPS=0 off, 2 expert slots only; with the tile marks). Its tests
# (test_gemv, test_gemv_experts, test_moe_router, test_engine_cuda, test_golden), then
# qwen3-30b-a3b tg128 and depth 4096 for main (A), the patch (G), G2 and G0, two rounds,
# llama3-8b tg128 A / G (its matrices take no groups), and a tile-marked timeline of G at tg32.
tg() { local t=$(find /tmp/fG -name $1 -type f | head -1); shift
  (cd $G/treeG && timeout 240 $t "$@" > $L/t-$(basename $t).txt 2>&1; ts "$(basename $t) rc=$?")
  tail -2 $L/t-$(basename $t).txt >> $S; grep -m5 FAIL $L/t-$(basename $t).txt >> $S; }
# call 4: cd .gpu && TAG=g4 timeout 570 bash run.sh g4; TAG=g4 bash run.sh pack
# Phase g4: call 3 crashed in the expert launches (test_gemv_experts hung, test_moe_router hit an
# illegal instruction, qwen3-30b-a3b's G runs printed nothing): group 0's tile barrier was named
# barrier 1, which the MoE combine's gt_sync also takes with all 256 consumer threads. groups.patch
# now numbers the groups' barriers from 2. The same tests (test_golden passed in call 3) and runs.
# call 5: cd .gpu && TAG=q5 timeout 200 bash run.sh q; TAG=q5 bash run.sh pack
# Phase q: .gpu/treeG = main + groups-rt.patch: the tile groups at run time in the one kernel
# instance (gm_args.tgroups, in the struct's padding; groups <= the ring's stages, so no group's
# end stage needs a slot back), not as instances of their own, which cost the step their code
# fetched (call 4). test_gemv_experts (call 4's hang), then qwen3-30b-a3b tg128 and depth 4096,
# main (A), the patch (RT) and the patch with FP4S_GEMV_TMA_GROUPS=0 (RT0), one round.
# Prepared for the next session (not run): cd .gpu && TAG=s6 timeout 300 bash run.sh s; TAG=s6 bash run.sh pack
# Phase s: where main's and groups-rt.patch's step loops sit against 128- and 256-byte lines
# (treeA = main at or after this session's commit, which has dev/sass_loops.py; treeG = main +
# groups-rt.patch): both builds' SASS by cuobjdump, dev/sass_loops.py on gemv_tma's kernels.
# Prepared for the next session (not run): cd .gpu && TAG=a7 timeout 570 bash run.sh a; TAG=a7 bash run.sh pack
# Phase a: does the step loop's place against 256-byte lines decide ~6 %? .gpu/treeA = main at
# or after this session's last commit. Five builds of fp4serve from that one tree, each with one
# patch (against main as of this commit) applied in turn, so only gemv_tma.cu and its headers
# recompile:
#   A     main: NVFP4 M = 1 kernel's step loop at 0xc400 (0 mod 256)
#   P4    pad-main-4.patch: a never-taken block before the loop moves it to 0xc380 (128 mod 256)
#   P20   pad-main-20.patch: to 0xc600 (0 mod 256), the pad's own cost
#   RT    groups-rt-head.patch (groups-rt.patch on this main): loop at 0xc980 (128 mod 256)
#   RT20  groups-rt-pad20.patch: loop at 0xcd00 (0 mod 256)
# (offsets from dev/sass_loops.py's rule on this machine's nvcc 13.0 cubins; phase s checks them on
# the GPU machine's). qwen3-30b-a3b tg128 and depth 4096 for A, P4, P20, RT, RT with groups off,
# RT20 and RT20 with groups off, two rounds; llama3-8b tg128 for A, P4, P20.
# Session 35, call 2: cd .gpu && TAG=b2 timeout 560 bash run.sh b; TAG=b2 bash run.sh pack
# Phase b: groups-rt.patch's register-named group barrier (bar.sync %r) made ptxas reserve all 16
# of the block's barriers (main: 2). Is that its 6 %? A = main, B16 = main + bar16.patch (a
# never-taken register-named bar.sync: only the reservation), RB = groups-rt-bar.patch (the groups
# with immediate ids: 6 barriers), RB0 = the same with FP4S_GEMV_TMA_GROUPS=0. qwen3-30b-a3b tg128
# and depth 4096, two rounds; llama3-8b tg128; then RB's tests (test_moe_router with tolerances).
tt() { local t=$(find /tmp/ft -name $1 -type f | head -1); shift
  (cd $G/treeT && timeout 240 env FP4S_TEST_VERBOSE=1 $t "$@" > $L/t-$(basename $t).txt 2>&1; ts "$(basename $t) rc=$?")
  tail -2 $L/t-$(basename $t).txt >> $S; grep -m5 FAIL $L/t-$(basename $t).txt >> $S; }
# Session 35, call 3: cd .gpu && TAG=c3 timeout 560 bash run.sh c; TAG=c3 bash run.sh pack
# Phase c: RB stayed 2 % under main with groups and 6 % with them off (llama3-8b, which takes no
# groups, -4 %): the cost is the code, not the barriers. groups-rt-c.patch = RB with the epilogue's
# sum over the group's warps unrolled over GT_W (a loop to a run-time WG) and gt_next_n unrolled.
# Where the rest is: KP = main + only the producer's part (empty count, end stages), KC = main +
# only the consumer's (both with groups never set). llama3-8b and qwen3-30b-a3b tg128 A, C, (C0),
# KP, KC, two rounds; depth 4096 A, C; C's tests.
# Session 35, call 4: cd .gpu && TAG=d4 timeout 470 bash run.sh d; TAG=d4 bash run.sh pack
# Phase d: C cost more than RB (llama3-8b -7.5 %, KC alone the same; KP, the producer's part, 0):
# the consumer's added code, run once a tile, is the cost. d1 = RB with gt_next_n one add and
# compare (no loop), dr = d1 with one register-named bar.sync instead of a branch a group. llama3-8b
# and qwen3-30b-a3b tg128, A / d1 / dr (and groups off), two rounds; the better one's tests.
# Session 35, call 5 (the budget's last ~220 s): cd .gpu && TAG=f5 timeout 190 bash run.sh f; TAG=f5 bash run.sh pack
# Phase f: e5.patch = dr with the epilogue's sum as main's (all GT_W warps' partials, unrolled, the
# other groups' selected out; partials at the warp's own index): the stage loop 9904 B against
# main's 9408 (dr 11376). llama3-8b and qwen3-30b-a3b tg128, A / E5 (/ groups off), two rounds.
# Prepared for the next session (not run): cd .gpu && TAG=x1 timeout 500 bash run.sh x; TAG=x1 bash run.sh pack
# Phase x: which of E5's consumer changes costs llama3-8b (which takes no groups) its 2.5 %? Each
# alone on main (a.tgroups, never set, in gm_args): x1 = e3.patch (the stage advance as one add
# and compare), x2 (u0 from the warp's place in its group), x3 (a group's first stage before the
# loop), x4 (bar.sync with a register id and count: 16 barriers), x5 (the epilogue thread's place
# in its group), x6 (the select sum), x7 = kp.patch (the producer's part: 0 in call 3), and E5
# whole. llama3-8b tg128 each, two rounds; qwen3-30b-a3b A / E5. .gpu/treeA = main.
for ph in "$@"; do case $ph in
r)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  J=5 bld $G/treeA /tmp/fA $L/build-A.log fp4serve &
  J=6 bld $G/treeR /tmp/fR $L/build-R.log fp4serve test_moe_router test_engine_cuda test_golden_cuda test_gemv_experts &
  XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" J=5 bld $G/treeR /tmp/fT $L/build-T.log fp4serve & wait
  /tmp/fA/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1 &
  /tmp/fA/fp4serve gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen-l.log 2>&1 &
  tst test_moe_router; grep -E "chained|FAIL" $L/t-test_moe_router.txt | head -12 >> $S
  tst test_engine_cuda; tst test_golden_cuda; tst test_gemv_experts
  wait
  for rr in 1 2; do for v in A R R0; do
    b=/tmp/fR; [ $v = A ] && b=/tmp/fA; [ $v = R0 ] && b="env FP4S_MOE_RDY=0 /tmp/fR"
    bench q-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3
    bench qd-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 --ctx 4096 -n 64 --reps 2
  done; done
  for v in A R; do b=/tmp/fR; [ $v = A ] && b=/tmp/fA; bench l-$v "$b" /dev/shm/llama3-8b -p 0 -n 128 --reps 3; done
  tl TR /tmp/fT "-p 0 -n 32"; tl TR0 /tmp/fT "-p 0 -n 32" FP4S_MOE_RDY=0 ;;
m)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" J=16 bld $G/treeM /tmp/fTM $L/build-TM.log fp4serve
  /tmp/fTM/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1 &
  /tmp/fTM/fp4serve gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen-l.log 2>&1 & wait
  KEEP=1 tm Mg /tmp/fTM "-p 0 -n 32"; KEEP=1 tm Md /tmp/fTM "-p 0 --ctx 4096 -n 16" FP4S_TL_STEP=6
  MOD=llama3-8b KEEP=1 tm Lg /tmp/fTM "-p 0 -n 64" ;;
g)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  J=5 bld $G/treeA /tmp/fA $L/build-A.log fp4serve &
  J=7 bld $G/treeG /tmp/fG $L/build-G.log fp4serve test_gemv test_gemv_experts test_moe_router test_engine_cuda test_golden &
  XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" J=4 bld $G/treeG /tmp/fTG $L/build-TG.log fp4serve & wait
  /tmp/fA/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1 &
  /tmp/fA/fp4serve gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen-l.log 2>&1 &
  tg test_gemv; tg test_gemv_experts; tg test_moe_router; tg test_engine_cuda; tg test_golden
  wait
  for rr in 1 2; do for v in A G G2 G0; do
    b=/tmp/fG; [ $v = A ] && b=/tmp/fA; [ $v = G2 ] && b="env FP4S_GEMV_TMA_GROUPS=2 /tmp/fG"; [ $v = G0 ] && b="env FP4S_GEMV_TMA_GROUPS=0 /tmp/fG"
    bench q-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3
    bench qd-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 --ctx 4096 -n 64 --reps 2
  done; done
  for v in A G; do b=/tmp/fG; [ $v = A ] && b=/tmp/fA; bench l-$v "$b" /dev/shm/llama3-8b -p 0 -n 128 --reps 3; done
  rm -rf $G/treeM; cp -r $G/treeG $G/treeM; KEEP=1 tm Gg /tmp/fTG "-p 0 -n 32" ;;
g4)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  J=5 bld $G/treeA /tmp/fA $L/build-A.log fp4serve &
  J=7 bld $G/treeG /tmp/fG $L/build-G.log fp4serve test_gemv test_gemv_experts test_moe_router test_engine_cuda &
  XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" J=4 bld $G/treeG /tmp/fTG $L/build-TG.log fp4serve & wait
  /tmp/fA/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1 &
  /tmp/fA/fp4serve gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen-l.log 2>&1 &
  tg test_gemv_experts; tg test_moe_router; tg test_engine_cuda; tg test_gemv
  wait
  for rr in 1 2; do for v in A G G0 G2; do
    [ $v = G2 ] && [ $rr = 2 ] && continue
    b=/tmp/fG; [ $v = A ] && b=/tmp/fA; [ $v = G2 ] && b="env FP4S_GEMV_TMA_GROUPS=2 /tmp/fG"; [ $v = G0 ] && b="env FP4S_GEMV_TMA_GROUPS=0 /tmp/fG"
    bench q-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3
    bench qd-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 --ctx 4096 -n 64 --reps 2
  done; done
  for v in A G; do b=/tmp/fG; [ $v = A ] && b=/tmp/fA; bench l-$v "$b" /dev/shm/llama3-8b -p 0 -n 128 --reps 3; done
  rm -rf $G/treeM; cp -r $G/treeG $G/treeM; KEEP=1 tm Gg /tmp/fTG "-p 0 -n 32" ;;
q)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  J=6 bld $G/treeA /tmp/fA $L/build-A.log fp4serve &
  J=10 bld $G/treeG /tmp/fG $L/build-G.log fp4serve test_gemv_experts & wait
  /tmp/fA/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1 &
  t=$(find /tmp/fG -name test_gemv_experts -type f | head -1)
  (cd $G/treeG && timeout 50 $t > $L/t-gx.txt 2>&1; ts "test_gemv_experts rc=$?"; tail -1 $L/t-gx.txt >> $S; grep -m3 FAIL $L/t-gx.txt >> $S)
  wait
  for v in A RT RT0; do
    b=/tmp/fG; [ $v = A ] && b=/tmp/fA; [ $v = RT0 ] && b="env FP4S_GEMV_TMA_GROUPS=0 /tmp/fG"
    bench q-$v "$b" /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3
    bench qd-$v "$b" /dev/shm/qwen3-30b-a3b -p 0 --ctx 4096 -n 64 --reps 2
  done ;;
s)
  J=8 bld $G/treeA /tmp/fA $L/build-A.log fp4serve & J=8 bld $G/treeG /tmp/fG $L/build-G.log fp4serve & wait
  for v in A G; do cuobjdump -sass /tmp/f$v/fp4serve > $L/sass-$v.txt 2>&1; done
  python3 $G/treeA/dev/sass_loops.py $L/sass-A.txt $L/sass-G.txt --fun gemv_tma_kernel >> $S
  gzip $L/sass-*.txt ;;
x)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  R=$G/treeA; P=$G/../bench/results/raw/2026-11-29s35
  J=16 bld $R /tmp/fa $L/build-a.log fp4serve; mkdir -p /tmp/bins/A; cp /tmp/fa/fp4serve /tmp/bins/A/
  /tmp/bins/A/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1 &
  /tmp/bins/A/fp4serve gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen-l.log 2>&1 &
  for v in x1:e3 x2:x2 x3:x3 x4:x4 x5:x5 x6:x6 x7:kp E5:e5; do
    (cd $R && patch -p1 -s < $P/${v#*:}.patch) && cmake --build /tmp/fa -j16 --target fp4serve >> $L/build-a.log 2>&1 &&
      mkdir -p /tmp/bins/${v%%:*} && cp /tmp/fa/fp4serve /tmp/bins/${v%%:*}/; ts "built ${v%%:*} rc=$?"; (cd $R && patch -p1 -R -s < $P/${v#*:}.patch)
  done
  wait
  for rr in 1 2; do for v in A x1 x2 x3 x4 x5 x6 x7 E5; do bench l-$v-$rr /tmp/bins/$v /dev/shm/llama3-8b -p 0 -n 128 --reps 3; done
    for v in A E5; do bench q-$v-$rr /tmp/bins/$v /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3; done; done ;;
f)
  R=$G/treeA; rm -rf $G/tree-e5; cp -r $R $G/tree-e5; (cd $G/tree-e5 && patch -p1 -s < $G/e5.patch)
  J=8 bld $G/tree-e5 /tmp/fe5 $L/build-e5.log fp4serve &
  J=8 bld $R /tmp/fa $L/build-a.log fp4serve; mkdir -p /tmp/bins/A; cp /tmp/fa/fp4serve /tmp/bins/A/
  /tmp/bins/A/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1 &
  /tmp/bins/A/fp4serve gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen-l.log 2>&1 &
  wait; mkdir -p /tmp/bins/E5; cp /tmp/fe5/fp4serve /tmp/bins/E5/
  for rr in 1 2; do for v in A E5; do bench l-$v-$rr /tmp/bins/$v /dev/shm/llama3-8b -p 0 -n 128 --reps 3; done
    for v in A E5 E50; do b=/tmp/bins/$v; [ $v = E50 ] && b="env FP4S_GEMV_TMA_GROUPS=0 /tmp/bins/E5"
      bench q-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3; done; done ;;
d)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  R=$G/treeA; for v in d1 dr; do rm -rf $G/tree-$v; cp -r $R $G/tree-$v; (cd $G/tree-$v && patch -p1 -s < $G/groups-rt-$v.patch)
    J=5 bld $G/tree-$v /tmp/f$v $L/build-$v.log fp4serve test_gemv test_gemv_experts test_moe_router & done
  J=6 bld $R /tmp/fa $L/build-a.log fp4serve; mkdir -p /tmp/bins/A; cp /tmp/fa/fp4serve /tmp/bins/A/
  /tmp/bins/A/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1 &
  /tmp/bins/A/fp4serve gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen-l.log 2>&1 &
  wait; for v in d1 dr; do mkdir -p /tmp/bins/$v; cp /tmp/f$v/fp4serve /tmp/bins/$v/; done
  for rr in 1 2; do for v in A d1 dr; do bench l-$v-$rr /tmp/bins/$v /dev/shm/llama3-8b -p 0 -n 128 --reps 3; done
    for v in A d1 d10 dr dr0; do
      b=/tmp/bins/$v; [ $v = d10 ] && b="env FP4S_GEMV_TMA_GROUPS=0 /tmp/bins/d1"; [ $v = dr0 ] && b="env FP4S_GEMV_TMA_GROUPS=0 /tmp/bins/dr"
      bench q-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3
    done; done
  sc() { cat $L/b-l-$1-1.txt $L/b-l-$1-2.txt $L/b-q-$1-1.txt $L/b-q-$1-2.txt | awk '/^tg/{s+=$3} END{print s}'; }
  w=$(awk -v a="$(sc d1)" -v b="$(sc dr)" 'BEGIN{print (b > a) ? "dr" : "d1"}'); ts "scores d1 $(sc d1) dr $(sc dr) A $(sc A): tests of $w"
  tw() { local t=/tmp/f$w/tests/$1; [ -x $t ] || t=$(find /tmp/f$w -name $1 -type f | head -1)
    (cd $G/tree-$w && timeout 150 env FP4S_TEST_VERBOSE=1 $t > $L/t-$w-$1.txt 2>&1; ts "$w $1 rc=$?"); tail -1 $L/t-$w-$1.txt >> $S; grep -m5 FAIL $L/t-$w-$1.txt >> $S; }
  tw test_moe_router; tw test_gemv_experts; tw test_gemv ;;
c)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  R=$G/treeA; rm -rf $G/treeT; cp -r $R $G/treeT; (cd $G/treeT && patch -p1 -s < $G/groups-rt-c.patch)
  J=8 bld $G/treeT /tmp/ft $L/build-t.log fp4serve test_gemv test_gemv_experts test_moe_router test_engine_cuda test_golden &
  J=8 bld $R /tmp/fa $L/build-a.log fp4serve; mkdir -p /tmp/bins/A; cp /tmp/fa/fp4serve /tmp/bins/A/
  /tmp/bins/A/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1 &
  /tmp/bins/A/fp4serve gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen-l.log 2>&1 &
  for v in KP:kp KC:kc; do
    (cd $R && patch -p1 -s < $G/${v#*:}.patch) && cmake --build /tmp/fa -j8 --target fp4serve >> $L/build-a.log 2>&1 &&
      mkdir -p /tmp/bins/${v%%:*} && cp /tmp/fa/fp4serve /tmp/bins/${v%%:*}/; ts "built ${v%%:*} rc=$?"; (cd $R && patch -p1 -R -s < $G/${v#*:}.patch)
  done
  wait; mkdir -p /tmp/bins/C; cp /tmp/ft/fp4serve /tmp/bins/C/
  for rr in 1 2; do for v in A C KP KC; do bench l-$v-$rr /tmp/bins/$v /dev/shm/llama3-8b -p 0 -n 128 --reps 3; done
    for v in A C C0 KP KC; do
      b=/tmp/bins/$v; [ $v = C0 ] && b="env FP4S_GEMV_TMA_GROUPS=0 /tmp/bins/C"
      bench q-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3
    done; done
  for v in A C; do bench qd-$v /tmp/bins/$v /dev/shm/qwen3-30b-a3b -p 0 --ctx 4096 -n 64 --reps 2; done
  tt test_moe_router; tt test_gemv_experts; tt test_gemv; tt test_engine_cuda; tt test_golden ;;
b)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  R=$G/treeA; rm -rf $G/treeT; cp -r $R $G/treeT; (cd $G/treeT && patch -p1 -s < $G/groups-rt-bar.patch)
  J=8 bld $G/treeT /tmp/ft $L/build-t.log fp4serve test_gemv test_gemv_experts test_moe_router test_engine_cuda test_golden &
  J=8 bld $R /tmp/fa $L/build-a.log fp4serve; mkdir -p /tmp/bins/A; cp /tmp/fa/fp4serve /tmp/bins/A/
  /tmp/bins/A/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1 &
  /tmp/bins/A/fp4serve gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen-l.log 2>&1 &
  (cd $R && patch -p1 -s < $G/bar16.patch) && cmake --build /tmp/fa -j8 --target fp4serve >> $L/build-a.log 2>&1 &&
    mkdir -p /tmp/bins/B16 && cp /tmp/fa/fp4serve /tmp/bins/B16/; ts "built B16 rc=$?"; (cd $R && patch -p1 -R -s < $G/bar16.patch)
  wait; mkdir -p /tmp/bins/RB; cp /tmp/ft/fp4serve /tmp/bins/RB/
  for rr in 1 2; do for v in A B16 RB RB0; do
    b=/tmp/bins/$v; [ $v = RB0 ] && b="env FP4S_GEMV_TMA_GROUPS=0 /tmp/bins/RB"
    bench q-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3
    bench qd-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 --ctx 4096 -n 64 --reps 2
  done; done
  for v in A B16 RB; do bench l-$v /tmp/bins/$v /dev/shm/llama3-8b -p 0 -n 128 --reps 3; done
  tt test_moe_router; tt test_gemv_experts; tt test_gemv; tt test_engine_cuda; tt test_golden ;;
a)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  R=$G/treeA; P=$G/../bench/results/raw/2026-11-29s34
  J=16 bld $R /tmp/fa $L/build-a.log fp4serve; mkdir -p /tmp/bins/A; cp /tmp/fa/fp4serve /tmp/bins/A/
  /tmp/bins/A/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1 &
  /tmp/bins/A/fp4serve gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen-l.log 2>&1 &
  for v in P4:pad-main-4 P20:pad-main-20 RT:groups-rt-head RT20:groups-rt-pad20; do
    (cd $R && patch -p1 -s < $P/${v#*:}.patch) && cmake --build /tmp/fa -j16 --target fp4serve >> $L/build-a.log 2>&1 &&
      mkdir -p /tmp/bins/${v%%:*} && cp /tmp/fa/fp4serve /tmp/bins/${v%%:*}/; ts "built ${v%%:*} rc=$?"; (cd $R && patch -p1 -R -s < $P/${v#*:}.patch)
  done
  wait
  for v in A P4 P20 RT RT20; do cuobjdump -sass -fun gemv_tma_kernel /tmp/bins/$v/fp4serve > $L/sass-$v.txt 2>&1 || cuobjdump -sass /tmp/bins/$v/fp4serve > $L/sass-$v.txt 2>&1
    echo "== $v" >> $S; python3 $R/dev/sass_loops.py $L/sass-$v.txt --fun gemv_tma_kernel 2>&1 | head -30 >> $S; gzip -f $L/sass-$v.txt; done &
  for rr in 1 2; do for v in A P4 P20 RT RT0 RT20 RT200; do
    b=/tmp/bins/$v; [ $v = RT0 ] && b="env FP4S_GEMV_TMA_GROUPS=0 /tmp/bins/RT"; [ $v = RT200 ] && b="env FP4S_GEMV_TMA_GROUPS=0 /tmp/bins/RT20"
    bench q-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3
    bench qd-$v-$rr "$b" /dev/shm/qwen3-30b-a3b -p 0 --ctx 4096 -n 64 --reps 2
  done; done
  for v in A P4 P20; do bench l-$v /tmp/bins/$v /dev/shm/llama3-8b -p 0 -n 128 --reps 3; done ;;
pack) (cd $OUT && rm -rf tl && tar -czf run-${TAG:-x}.tgz logs && rm -rf logs) ;;
esac; done
