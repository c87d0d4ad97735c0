#!/usr/bin/env bash
# device runs (git-ignored copy in .gpu/): cd .gpu && TAG=x bash run.sh PHASE...
# tree/ = the change, treeB/ = the baseline (fp4serve only)
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
G=$PWD; L=$OUT/logs; mkdir -p $L; S=$OUT/sum.txt
A=/tmp/fa; B=/tmp/fb; T=/tmp/tlA; TB=/tmp/tlB
cfg() { cmake -S $1 -B $2 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$1/.deps/root/usr "${@:3}"; }
bld() { # src build log targets...
  local s0=$(date +%s) src=$1 dir=$2 log=$3; shift 3
  cfg $src $dir ${XF:+"$XF"} > $log 2>&1 && cmake --build $dir -j${J:-5} --target "$@" >> $log 2>&1; echo "build $dir rc=$? $(( $(date +%s)-s0 )) s" >> $S; }
gen() { [ -d /tmp/$1 ] || { s0=$(date +%s); $A/fp4serve gen --preset $2 --format ${3:-nvfp4} /tmp/$1 > $L/gen-$1.log 2>&1; echo "gen $1 rc=$? $(( $(date +%s)-s0 )) s" >> $S; }; }
bench() { # label bin model args... (env via E=)
  local lab=$1 bin=$2 m=$3; shift 3
  echo "== $lab $* ${E:-}" >> $L/e2e.txt
  env ${E:-X=1} $bin/fp4serve bench -m /tmp/$m "$@" > $L/b-$lab.txt 2>&1
  local res=$(grep -E "^(tg|pp)" $L/b-$lab.txt | tail -1); echo "$res" >> $L/e2e.txt; printf "%-14s %-22s %s\n" "$lab" "${E:-}" "$res" >> $S; }
tl() { # label bin model args...
  local lab=$1 bin=$2 m=$3; shift 3
  FP4S_TL=$L/tl-$lab.txt $bin/fp4serve bench -m /tmp/$m "$@" > $L/tlbench-$lab.txt 2>&1
  (cd $G/tree/dev && python3 timeline.py $L/tl-$lab.txt > $L/tlsum-$lab.txt 2>&1
   [ $m = go ] && python3 moe_marks.py $L/tl-$lab.txt > $L/moe-$lab.txt 2>&1); rm -f $L/tl-$lab.txt
  echo "== tl $lab" >> $S; grep -m1 -A9 "per position" $L/tlsum-$lab.txt | tail -8 >> $S
  [ -f $L/moe-$lab.txt ] && tail -12 $L/moe-$lab.txt >> $S; }
pack() { (cd $OUT && tar -czf run-${TAG:-x}.tgz logs && rm -rf logs); }
for ph in "$@"; do case $ph in
e26)
  nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader >> $S; echo "A $(cat $G/tree/COMMIT) B $(cat $G/treeB/COMMIT)" >> $S
  bld $G/tree $A $L/build.log fp4serve test_gemv test_moe_router test_engine_cuda test_golden test_gemv_experts &
  bld $G/treeB $B $L/build-b.log fp4serve &
  J=3 XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" bld $G/tree $T $L/build-tl.log fp4serve &
  J=3 XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" bld $G/treeB $TB $L/build-tlb.log fp4serve &
  wait
  cd $G/tree
  ( $A/tests/test_moe_router > $L/test_moe_router.txt 2>&1; echo "moe_router rc=$? $(grep -E 'passed|failed' $L/test_moe_router.txt | tail -1)" >> $S
    $A/tests/test_gemv_experts > $L/test_gemv_experts.txt 2>&1; echo "gemv_experts rc=$? $(grep -E 'passed|failed' $L/test_gemv_experts.txt | tail -1)" >> $S
    $A/tests/test_engine_cuda > $L/test_engine_cuda.txt 2>&1; echo "engine_cuda rc=$? $(grep -E 'passed|failed' $L/test_engine_cuda.txt | tail -1)" >> $S
    timeout 200 ctest --test-dir $A -R test_golden_cuda --output-on-failure > $L/test_golden_cuda.txt 2>&1; echo "golden_cuda rc=$? $(grep -E 'tests passed' $L/test_golden_cuda.txt | tail -1)" >> $S
    s0=$(date +%s); timeout ${GT:-420} $A/tests/test_gemv > $L/test_gemv.txt 2>&1; echo "gemv rc=$? $(( $(date +%s)-s0 )) s $(grep -E 'passed|failed' $L/test_gemv.txt | tail -1)" >> $S ) &
  cd $G; gen go gpt-oss-20b mxfp4; gen qw qwen3-30b-a3b; gen ll llama3-8b
  for rr in 1 2 3; do
    bench go-A$rr $A go -p 0 -n 128 --reps 3; bench go-B$rr $B go -p 0 -n 128 --reps 3
    bench god-A$rr $A go -p 0 --ctx 4096 -n 64 --reps 2; bench god-B$rr $B go -p 0 --ctx 4096 -n 64 --reps 2
    bench qw-A$rr $A qw -p 0 -n 128 --reps 3; bench qw-B$rr $B qw -p 0 -n 128 --reps 3
    bench qwd-A$rr $A qw -p 0 --ctx 4096 -n 64 --reps 2; bench qwd-B$rr $B qw -p 0 --ctx 4096 -n 64 --reps 2
  done
  for rr in 1 2; do
    bench ll-A$rr $A ll -p 0 -n 128 --reps 3; bench ll-B$rr $B ll -p 0 -n 128 --reps 3
    bench lld-A$rr $A ll -p 0 --ctx 4096 -n 64 --reps 2; bench lld-B$rr $B ll -p 0 --ctx 4096 -n 64 --reps 2
  done
  tl go-A $T go -p 0 --ctx 4096 -n 64 --reps 1
  tl go-B $TB go -p 0 --ctx 4096 -n 64 --reps 1
  tl qw-A $T qw -p 0 --ctx 4096 -n 64 --reps 1
  tl qw-B $TB qw -p 0 --ctx 4096 -n 64 --reps 1
  wait ;;
sm26)
  bld $G/treeB $B $L/build-b.log fp4serve &
  J=8 XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" bld $G/treeB $TB $L/build-tlb.log fp4serve &
  wait; A=$B; gen go gpt-oss-20b mxfp4
  FP4S_TL=$L/tl-go.txt $TB/fp4serve bench -m /tmp/go -p 0 --ctx 4096 -n 64 --reps 1 > $L/tlbench-go.txt 2>&1
  (cd $G/tree/dev && python3 moe_sm.py $L/tl-go.txt 5760 >> $S 2>&1); gzip $L/tl-go.txt
  FP4S_TL=$L/tl-go1.txt $TB/fp4serve bench -m /tmp/go -p 0 -n 128 --reps 1 > $L/tlbench-go1.txt 2>&1
  (cd $G/tree/dev && python3 moe_sm.py $L/tl-go1.txt 5760 >> $S 2>&1); rm -f $L/tl-go1.txt
  wait ;;
m26)
  nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader >> $S; echo "A $(cat $G/tree/COMMIT) B $(cat $G/treeB/COMMIT)" >> $S
  bld $G/tree $A $L/build.log fp4serve test_moe_router test_engine_cuda test_golden test_gemv_experts &
  bld $G/treeB $B $L/build-b.log fp4serve &
  J=4 XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" bld $G/tree $T $L/build-tl.log fp4serve &
  wait
  gen go gpt-oss-20b mxfp4
  for rr in 1 2 3; do
    bench go-A$rr $A go -p 0 -n 128 --reps 3; bench go-B$rr $B go -p 0 -n 128 --reps 3
    bench god-A$rr $A go -p 0 --ctx 4096 -n 64 --reps 2; bench god-B$rr $B go -p 0 --ctx 4096 -n 64 --reps 2
  done
  FP4S_TL=$L/tl-goA.txt $T/fp4serve bench -m /tmp/go -p 0 --ctx 4096 -n 64 --reps 1 > $L/tlbench-goA.txt 2>&1
  (cd $G/tree/dev && python3 moe_sm.py $L/tl-goA.txt 5760 >> $S 2>&1; python3 moe_marks.py $L/tl-goA.txt > $L/moe-goA.txt 2>&1; tail -10 $L/moe-goA.txt >> $S); gzip $L/tl-goA.txt
  cd $G/tree
  $A/tests/test_moe_router > $L/test_moe_router.txt 2>&1; echo "moe_router rc=$? $(grep -E 'passed|failed' $L/test_moe_router.txt | tail -1)" >> $S
  $A/tests/test_gemv_experts > $L/test_gemv_experts.txt 2>&1; echo "gemv_experts rc=$? $(grep -E 'passed|failed' $L/test_gemv_experts.txt | tail -1)" >> $S
  FP4S_TEST_SEED=0x18ebf5bb988baa1c $A/tests/test_engine_cuda > $L/test_engine_cuda.txt 2>&1; echo "engine_cuda rc=$? $(grep -E 'passed|failed' $L/test_engine_cuda.txt | tail -1)" >> $S
  timeout 200 ctest --test-dir $A -R test_golden_cuda --output-on-failure > $L/test_golden_cuda.txt 2>&1; echo "golden_cuda rc=$? $(grep -E 'tests passed' $L/test_golden_cuda.txt | tail -1)" >> $S
  cd $G ;;
c26)
  nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader >> $S; echo "A $(cat $G/tree/COMMIT) B $(cat $G/treeB/COMMIT)" >> $S
  bld $G/tree $A $L/build.log fp4serve test_moe_router test_engine_cuda test_golden test_gemv_experts &
  bld $G/treeB $B $L/build-b.log fp4serve &
  J=4 XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" bld $G/tree $T $L/build-tl.log fp4serve &
  wait
  cd $G/tree
  $A/tests/test_moe_router > $L/test_moe_router.txt 2>&1; echo "moe_router rc=$? $(grep -E 'passed|failed' $L/test_moe_router.txt | tail -1)" >> $S
  FP4S_MOE_CLAIM=0 $A/tests/test_moe_router > $L/test_moe_router0.txt 2>&1; echo "moe_router CLAIM=0 rc=$? $(grep -E 'passed|failed' $L/test_moe_router0.txt | tail -1)" >> $S
  $A/tests/test_gemv_experts > $L/test_gemv_experts.txt 2>&1; echo "gemv_experts rc=$? $(grep -E 'passed|failed' $L/test_gemv_experts.txt | tail -1)" >> $S
  $A/tests/test_engine_cuda > $L/test_engine_cuda.txt 2>&1; echo "engine_cuda rc=$? $(grep -E 'passed|failed' $L/test_engine_cuda.txt | tail -1)" >> $S
  timeout 200 ctest --test-dir $A -R test_golden_cuda --output-on-failure > $L/test_golden_cuda.txt 2>&1; echo "golden_cuda rc=$? $(grep -E 'tests passed' $L/test_golden_cuda.txt | tail -1)" >> $S
  cd $G
  gen go gpt-oss-20b mxfp4
  for rr in 1 2 3; do
    bench go-A$rr $A go -p 0 -n 128 --reps 3; E="FP4S_MOE_CLAIM=0" bench go-A0$rr $A go -p 0 -n 128 --reps 3; bench go-B$rr $B go -p 0 -n 128 --reps 3
    bench god-A$rr $A go -p 0 --ctx 4096 -n 64 --reps 2; E="FP4S_MOE_CLAIM=0" bench god-A0$rr $A go -p 0 --ctx 4096 -n 64 --reps 2; bench god-B$rr $B go -p 0 --ctx 4096 -n 64 --reps 2
  done
  FP4S_TL=$L/tl-goA.txt $T/fp4serve bench -m /tmp/go -p 0 --ctx 4096 -n 64 --reps 1 > $L/tlbench-goA.txt 2>&1
  (cd $G/tree/dev && python3 moe_marks.py $L/tl-goA.txt > $L/moe-goA.txt 2>&1; tail -10 $L/moe-goA.txt >> $S); gzip $L/tl-goA.txt ;;
o26)
  echo "A $(cat $G/tree/COMMIT) B $(cat $G/treeB/COMMIT)" >> $S
  [ -n "${NOQW:-}" ] || { gen qw qwen3-30b-a3b
  bench qw-A $A qw -p 0 -n 128 --reps 3; bench qw-B $B qw -p 0 -n 128 --reps 3
  bench qwd-A $A qw -p 0 --ctx 4096 -n 64 --reps 2; bench qwd-B $B qw -p 0 --ctx 4096 -n 64 --reps 2; }
  rm -rf /tmp/qw /tmp/go /tmp/ll; df -h /tmp | tail -1 >> $S
  gen o120 gpt-oss-120b mxfp4
  for rr in 1 2; do
    bench o-A$rr $A o120 -p 0 -n 128 --reps 3; E="FP4S_MOE_CLAIM=0" bench o-A0$rr $A o120 -p 0 -n 128 --reps 3; bench o-B$rr $B o120 -p 0 -n 128 --reps 3
    bench od-A$rr $A o120 -p 0 --ctx 4096 -n 64 --reps 2; E="FP4S_MOE_CLAIM=0" bench od-A0$rr $A o120 -p 0 --ctx 4096 -n 64 --reps 2; bench od-B$rr $B o120 -p 0 --ctx 4096 -n 64 --reps 2
  done ;;
f26)
  nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader >> $S; echo "A $(cat $G/tree/COMMIT)" >> $S
  rm -rf /tmp/o120
  bld $G/tree $A $L/build.log fp4serve
  gen ll llama3-8b; gen qw qwen3-30b-a3b; gen go gpt-oss-20b mxfp4
  for rr in 1 2; do
    bench ll-$rr $A ll -p 0 -n 128 --reps 3; bench lld-$rr $A ll -p 0 --ctx 4096 -n 64 --reps 2
    bench qw-$rr $A qw -p 0 -n 128 --reps 3; bench qwd-$rr $A qw -p 0 --ctx 4096 -n 64 --reps 2
    E="FP4S_MOE_ONE=1" bench qw1-$rr $A qw -p 0 -n 128 --reps 3; E="FP4S_MOE_ONE=1" bench qwd1-$rr $A qw -p 0 --ctx 4096 -n 64 --reps 2
    bench go-$rr $A go -p 0 -n 128 --reps 3; bench god-$rr $A go -p 0 --ctx 4096 -n 64 --reps 2
  done ;;
q26)
  nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader >> $S; echo "A $(cat $G/tree/COMMIT) B $(cat $G/treeB/COMMIT)" >> $S
  bld $G/tree $A $L/build.log fp4serve test_gemv test_moe_router test_engine_cuda test_golden test_gemv_experts &
  bld $G/treeB $B $L/build-b.log fp4serve &
  wait
  cd $G/tree
  ( $A/tests/test_gemv_experts > $L/test_gemv_experts.txt 2>&1; echo "gemv_experts rc=$? $(grep -E 'passed|failed' $L/test_gemv_experts.txt | tail -1)" >> $S
    $A/tests/test_moe_router > $L/test_moe_router.txt 2>&1; echo "moe_router rc=$? $(grep -E 'passed|failed' $L/test_moe_router.txt | tail -1)" >> $S
    $A/tests/test_engine_cuda > $L/test_engine_cuda.txt 2>&1; echo "engine_cuda rc=$? $(grep -E 'passed|failed' $L/test_engine_cuda.txt | tail -1)" >> $S
    timeout 200 ctest --test-dir $A -R test_golden_cuda --output-on-failure > $L/test_golden_cuda.txt 2>&1; echo "golden_cuda rc=$? $(grep -E 'tests passed' $L/test_golden_cuda.txt | tail -1)" >> $S
    s0=$(date +%s); timeout 330 $A/tests/test_gemv > $L/test_gemv.txt 2>&1; echo "gemv rc=$? $(( $(date +%s)-s0 )) s $(grep -E 'passed|failed' $L/test_gemv.txt | tail -1)" >> $S ) &
  cd $G; gen qw qwen3-30b-a3b; gen ll llama3-8b; gen go gpt-oss-20b mxfp4
  for rr in 1 2 3; do
    bench qw-A$rr $A qw -p 0 -n 128 --reps 3; E="FP4S_GEMV_ECLAIM=0" bench qw-A0$rr $A qw -p 0 -n 128 --reps 3; bench qw-B$rr $B qw -p 0 -n 128 --reps 3
    bench qwd-A$rr $A qw -p 0 --ctx 4096 -n 64 --reps 2; E="FP4S_GEMV_ECLAIM=0" bench qwd-A0$rr $A qw -p 0 --ctx 4096 -n 64 --reps 2; bench qwd-B$rr $B qw -p 0 --ctx 4096 -n 64 --reps 2
  done
  bench ll-A $A ll -p 0 -n 128 --reps 3; bench ll-B $B ll -p 0 -n 128 --reps 3
  bench lld-A $A ll -p 0 --ctx 4096 -n 64 --reps 2; bench lld-B $B ll -p 0 --ctx 4096 -n 64 --reps 2
  bench go-A $A go -p 0 -n 128 --reps 3; bench go-B $B go -p 0 -n 128 --reps 3
  wait ;;
t26)
  bld $G/tree $A $L/build.log test_moe_router &
  bld $G/treeB $B $L/build-b.log test_moe_router &
  wait
  cd $G/tree
  for v in 1 0; do FP4S_GEMV_ECLAIM=$v FP4S_TEST_SEED=0x18ebf810e3079b49 $A/tests/test_moe_router BLOCK > $L/tmr-A$v.txt 2>&1; echo "A ECLAIM=$v rc=$? $(grep -E 'passed|failed' $L/tmr-A$v.txt | tail -1)" >> $S; done
  FP4S_TEST_SEED=0x18ebf810e3079b49 $B/tests/test_moe_router BLOCK > $L/tmr-B.txt 2>&1; echo "B rc=$? $(grep -E 'passed|failed' $L/tmr-B.txt | tail -1)" >> $S
  for r in 1 2 3; do $A/tests/test_moe_router BLOCK > $L/tmr-A-$r.txt 2>&1; echo "A random seed rc=$? $(grep -E 'passed|failed' $L/tmr-A-$r.txt | tail -1)" >> $S; grep "CHECK failed" $L/tmr-A-$r.txt | cut -c1-200 >> $S; done
  cd $G ;;
r26)
  echo "A $(cat $G/tree/COMMIT) B $(cat $G/treeB/COMMIT)" >> $S
  bld $G/tree $A $L/build.log test_moe_router &
  bld $G/treeB $B $L/build-b.log test_moe_router &
  wait
  cd $G/tree
  s0=$(date +%s); FP4S_TEST_SEED=0x18ebf810e3079b49 $A/tests/test_moe_router > $L/tmr-A.txt 2>&1; echo "A full seed rc=$? $(( $(date +%s)-s0 )) s $(grep -E 'passed|failed' $L/tmr-A.txt | tail -1)" >> $S; grep "CHECK failed" $L/tmr-A.txt | cut -c1-160 >> $S
  FP4S_GEMV_ECLAIM=0 FP4S_TEST_SEED=0x18ebf810e3079b49 $A/tests/test_moe_router > $L/tmr-A0.txt 2>&1; echo "A ECLAIM=0 full seed rc=$? $(grep -E 'passed|failed' $L/tmr-A0.txt | tail -1)" >> $S; grep "CHECK failed" $L/tmr-A0.txt | cut -c1-160 >> $S
  cd $G/treeB
  FP4S_TEST_SEED=0x18ebf810e3079b49 $B/tests/test_moe_router > $L/tmr-B.txt 2>&1; echo "B full seed rc=$? $(grep -E 'passed|failed' $L/tmr-B.txt | tail -1)" >> $S; grep "CHECK failed" $L/tmr-B.txt | cut -c1-160 >> $S
  cd $G ;;
pack) pack ;;
esac; done
