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
  r=$(grep -E "^(tg|pp)" $L/b-$lab.txt | tail -1); echo "$r" >> $L/e2e.txt; printf "%-14s %-22s %s\n" "$lab" "${E:-}" "$r" >> $S; }
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
pack) pack ;;
esac; done
