#!/usr/bin/env bash
# device runs (git-ignored copy in .gpu/): cd .gpu && TAG=x bash run.sh PHASE...
# tree/ = the change, treeB/ = the baseline (fp4serve only)
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
G=$PWD; L=$OUT/logs; mkdir -p $L; S=$OUT/sum.txt
A=/tmp/fa; B=/tmp/fb; T=/tmp/tlA
cfg() { cmake -S $1 -B $2 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$1/.deps/root/usr "${@:3}"; }
bld() { # src build log targets...
  local s0=$(date +%s) src=$1 dir=$2 log=$3; shift 3
  cfg $src $dir ${XF:+"$XF"} > $log 2>&1 && cmake --build $dir -j6 --target "$@" >> $log 2>&1; echo "build $dir rc=$? $(( $(date +%s)-s0 )) s" >> $S; }
gen() { [ -d /tmp/$1 ] || { s0=$(date +%s); $A/fp4serve gen --preset $2 --format ${3:-nvfp4} /tmp/$1 > $L/gen-$1.log 2>&1; echo "gen $1 rc=$? $(( $(date +%s)-s0 )) s" >> $S; }; }
bench() { # label bin model args... (env via E=)
  local lab=$1 bin=$2 m=$3; shift 3
  echo "== $lab $* ${E:-}" >> $L/e2e.txt
  env ${E:-X=1} $bin/fp4serve bench -m /tmp/$m "$@" > $L/b-$lab.txt 2>&1
  local res=$(grep -E "^(tg|pp)" $L/b-$lab.txt | tail -1); echo "$res" >> $L/e2e.txt; printf "%-14s %-22s %s\n" "$lab" "${E:-}" "$res" >> $S; }
pack() { (cd $OUT && tar -czf run-${TAG:-x}.tgz logs && rm -rf logs); }
for ph in "$@"; do case $ph in
c25build)
  nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader >> $S; echo "A $(cat $G/tree/COMMIT) B $(cat $G/treeB/COMMIT)" >> $S
  bld $G/tree $A $L/build.log fp4serve test_attention test_engine_cuda &
  bld $G/treeB $B $L/build-b.log fp4serve &
  XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" bld $G/tree $T $L/build-tl.log fp4serve &
  wait ;;
c25test)
  cd $G/tree
  ( s0=$(date +%s); FP4S_ATTN_CLUSTER_INFO=1 FP4S_TEST_VERBOSE=1 $A/tests/test_attention ${TF:-} > $L/test_attention.txt 2>&1; echo "attention rc=$? $(( $(date +%s)-s0 )) s $(grep -E 'passed|failed' $L/test_attention.txt | tail -1)" >> $S
    grep -E "cluster form taken|clusters of" $L/test_attention.txt | sort | uniq -c | head -20 >> $S
    FP4S_ATTN_CLUSTER=1 $A/tests/test_engine_cuda > $L/test_engine_cuda1.txt 2>&1; echo "engine_cuda CLUSTER=1 rc=$? $(grep -E 'passed|failed' $L/test_engine_cuda1.txt | tail -1)" >> $S ) &
  cd $G; gen ll llama3-8b; gen qw qwen3-30b-a3b; gen go gpt-oss-20b mxfp4; wait ;;
c25ab)
  for r in 1 2; do
    for m in ll qw go; do
      E="FP4S_ATTN_CLUSTER=0" bench ${m}d-0-$r $A $m -p 0 --ctx 4096 -n 64 --reps 2
      E="FP4S_ATTN_CLUSTER=1" bench ${m}d-1-$r $A $m -p 0 --ctx 4096 -n 64 --reps 2
    done
  done
  bench god-B $B go -p 0 --ctx 4096 -n 64 --reps 2
  for m in ll qw go; do
    E="FP4S_ATTN_CLUSTER=0" bench $m-0 $A $m -p 0 -n 128 --reps 3
    E="FP4S_ATTN_CLUSTER=1" bench $m-1 $A $m -p 0 -n 128 --reps 3
  done
  bench go-B $B go -p 0 -n 128 --reps 3 ;;
c25tl)
  for v in 1 0; do
    FP4S_ATTN_CLUSTER=$v FP4S_TL=$L/tl-ll-$v.txt $T/fp4serve bench -m /tmp/ll -p 0 --ctx 4096 -n 64 --reps 1 > $L/tlbench-ll-$v.txt 2>&1
    (cd $G/tree/dev && python3 timeline.py $L/tl-ll-$v.txt > $L/tlsum-ll-$v.txt 2>&1; python3 attn_marks.py $L/tl-ll-$v.txt > $L/attn-ll-$v.txt 2>&1)
    rm -f $L/tl-ll-$v.txt
    echo "== llama CLUSTER=$v" >> $S; grep -m1 -A8 "per position" $L/tlsum-ll-$v.txt | tail -7 >> $S; cat $L/attn-ll-$v.txt >> $S
  done ;;
c25d)
  bld $G/tree $A $L/build.log fp4serve
  gen ll llama3-8b; gen qw qwen3-30b-a3b; gen go gpt-oss-20b mxfp4
  for rr in 1 2; do
    for m in ll qw go; do
      E="FP4S_ATTN_CLUSTER=0" bench ${m}d-0-$rr $A $m -p 0 --ctx 4096 -n 64 --reps 2
      E="FP4S_ATTN_CLUSTER=1" bench ${m}d-1-$rr $A $m -p 0 --ctx 4096 -n 64 --reps 2
    done
  done ;;
k25)
  echo "A $(cat $G/tree/COMMIT)" >> $S
  bld $G/tree $A $L/build.log fp4serve test_moe_router test_engine_cuda &
  XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" bld $G/tree $T $L/build-tl.log fp4serve &
  wait
  cd $G/tree
  ( FP4S_TEST_VERBOSE=1 $A/tests/test_moe_router BLOCK > $L/test_moe_router.txt 2>&1; echo "moe_router BLOCK rc=$? $(grep -E 'passed|failed' $L/test_moe_router.txt | tail -1)" >> $S
    grep -o "BLOCK([^)]*).*slots as one matrix.*" $L/test_moe_router.txt | sed 's/: vs CPU.*slots/ slots/' >> $S
    FP4S_MOE_CAT=1 $A/tests/test_engine_cuda > $L/test_engine_cuda1.txt 2>&1; echo "engine_cuda CAT=1 rc=$? $(grep -E 'passed|failed' $L/test_engine_cuda1.txt | tail -1)" >> $S ) &
  cd $G; gen qw qwen3-30b-a3b; wait
  for rr in 1 2; do
    for v in 0 1; do E="FP4S_MOE_CAT=$v" bench qw-$v-$rr $A qw -p 0 -n 128 --reps 3; done
    for v in 0 1; do E="FP4S_MOE_CAT=$v" bench qwd-$v-$rr $A qw -p 0 --ctx 4096 -n 64 --reps 2; done
  done
  for v in 1 0; do
    FP4S_MOE_CAT=$v FP4S_TL=$L/tl-qw-$v.txt $T/fp4serve bench -m /tmp/qw -p 0 --ctx 4096 -n 64 --reps 1 > $L/tlbench-qw-$v.txt 2>&1
    (cd $G/tree/dev && python3 timeline.py $L/tl-qw-$v.txt > $L/tlsum-qw-$v.txt 2>&1); rm -f $L/tl-qw-$v.txt
    echo "== qwen3 CAT=$v" >> $S; grep -m1 -A9 "per position" $L/tlsum-qw-$v.txt | tail -8 >> $S
  done ;;
f25)
  nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader >> $S; echo "A $(cat $G/tree/COMMIT) B $(cat $G/treeB/COMMIT)" >> $S
  bld $G/tree $A $L/build.log fp4serve test_moe_router test_engine_cuda test_golden test_gemv_experts &
  bld $G/treeB $B $L/build-b.log fp4serve &
  wait
  cd $G/tree
  ( $A/tests/test_moe_router > $L/test_moe_router.txt 2>&1; echo "moe_router rc=$? $(grep -E 'passed|failed' $L/test_moe_router.txt | tail -1)" >> $S
    $A/tests/test_engine_cuda > $L/test_engine_cuda.txt 2>&1; echo "engine_cuda rc=$? $(grep -E 'passed|failed' $L/test_engine_cuda.txt | tail -1)" >> $S
    $A/tests/test_gemv_experts > $L/test_gemv_experts.txt 2>&1; echo "gemv_experts rc=$? $(grep -E 'passed|failed' $L/test_gemv_experts.txt | tail -1)" >> $S
    timeout 200 ctest --test-dir $A -R test_golden_cuda --output-on-failure > $L/test_golden_cuda.txt 2>&1; echo "golden_cuda rc=$? $(grep -E 'tests passed' $L/test_golden_cuda.txt | tail -1)" >> $S ) &
  cd $G; gen go gpt-oss-20b mxfp4; gen ll llama3-8b; gen qw qwen3-30b-a3b; wait
  for rr in 1 2; do
    bench go-A$rr $A go -p 0 -n 128 --reps 3; bench go-B$rr $B go -p 0 -n 128 --reps 3
    bench god-A$rr $A go -p 0 --ctx 4096 -n 64 --reps 2; bench god-B$rr $B go -p 0 --ctx 4096 -n 64 --reps 2
  done
  bench ll-A $A ll -p 0 -n 128 --reps 3; bench lld-A $A ll -p 0 --ctx 4096 -n 64 --reps 2
  bench qw-A $A qw -p 0 -n 128 --reps 3; bench qwd-A $A qw -p 0 --ctx 4096 -n 64 --reps 2 ;;
s25)
  echo "A $(cat $G/tree/COMMIT)" >> $S
  bld $G/tree $A $L/build.log fp4serve &
  XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" bld $G/tree $T $L/build-tl.log fp4serve &
  wait
  gen qw qwen3-30b-a3b; gen ll llama3-8b; gen go gpt-oss-20b mxfp4
  for rr in 1 2; do
    for v in "X=1" "FP4S_ATTN_SPLITS=16" "FP4S_ATTN_SPLITS=16 FP4S_ATTN_TRIGGER=2" "FP4S_ATTN_SPLITS=8 FP4S_ATTN_TRIGGER=2" "FP4S_ATTN_TRIGGER=2"; do
      E="$v" bench "qwd-$rr-${v// /_}" $A qw -p 0 --ctx 4096 -n 64 --reps 2; done
    for v in "X=1" "FP4S_ATTN_SPLITS=8" "FP4S_ATTN_SPLITS=8 FP4S_ATTN_TRIGGER=2"; do
      E="$v" bench "lld-$rr-${v// /_}" $A ll -p 0 --ctx 4096 -n 64 --reps 2; done
    for v in "X=1" "FP4S_ATTN_SPLITS=8 FP4S_ATTN_TRIGGER=2"; do
      E="$v" bench "god-$rr-${v// /_}" $A go -p 0 --ctx 4096 -n 64 --reps 2; done
  done
  for v in "X=1" "FP4S_ATTN_SPLITS=16 FP4S_ATTN_TRIGGER=2"; do E="$v" bench "qw-${v// /_}" $A qw -p 0 -n 128 --reps 3; done
  for v in "X=1" "FP4S_ATTN_SPLITS=8 FP4S_ATTN_TRIGGER=2"; do E="$v" bench "ll-${v// /_}" $A ll -p 0 -n 128 --reps 3; done
  for v in "X=1" "FP4S_ATTN_SPLITS=16 FP4S_ATTN_TRIGGER=2"; do
    env $v FP4S_TL=$L/tl-qw.txt $T/fp4serve bench -m /tmp/qw -p 0 --ctx 4096 -n 64 --reps 1 > $L/tlbench-qw-${v// /_}.txt 2>&1
    (cd $G/tree/dev && python3 timeline.py $L/tl-qw.txt > $L/tlsum-qw-${v// /_}.txt 2>&1; python3 attn_marks.py $L/tl-qw.txt > $L/attn-qw-${v// /_}.txt 2>&1); rm -f $L/tl-qw.txt
    echo "== qwen3 $v" >> $S; grep -m1 -A9 "per position" $L/tlsum-qw-${v// /_}.txt | tail -8 >> $S; tail -4 $L/attn-qw-${v// /_}.txt >> $S
  done ;;
p25)
  echo "A $(cat $G/tree/COMMIT) B $(cat $G/treeB/COMMIT)" >> $S
  bld $G/tree $A $L/build.log fp4serve test_gemv test_engine_cuda test_golden &
  bld $G/treeB $B $L/build-b.log fp4serve &
  wait
  cd $G/tree
  ( timeout 150 $A/tests/test_gemv > $L/test_gemv.txt 2>&1; echo "gemv rc=$? $(grep -E 'passed|failed' $L/test_gemv.txt | tail -1)" >> $S
    $A/tests/test_engine_cuda > $L/test_engine_cuda.txt 2>&1; echo "engine_cuda rc=$? $(grep -E 'passed|failed' $L/test_engine_cuda.txt | tail -1)" >> $S
    timeout 200 ctest --test-dir $A -R test_golden_cuda --output-on-failure > $L/test_golden_cuda.txt 2>&1; echo "golden_cuda rc=$? $(grep -E 'tests passed' $L/test_golden_cuda.txt | tail -1)" >> $S ) &
  cd $G; gen qw qwen3-30b-a3b; gen ll llama3-8b; wait
  for rr in 1 2; do
    bench qw-A$rr $A qw -p 0 -n 128 --reps 3; bench qw-B$rr $B qw -p 0 -n 128 --reps 3
    bench ll-A$rr $A ll -p 0 -n 128 --reps 3; bench ll-B$rr $B ll -p 0 -n 128 --reps 3
    bench qwd-A$rr $A qw -p 0 --ctx 4096 -n 64 --reps 2; bench qwd-B$rr $B qw -p 0 --ctx 4096 -n 64 --reps 2
    bench lld-A$rr $A ll -p 0 --ctx 4096 -n 64 --reps 2; bench lld-B$rr $B ll -p 0 --ctx 4096 -n 64 --reps 2
  done ;;
pack) pack ;;
esac; done
