#!/usr/bin/env bash
# device runs (git-ignored copy in .gpu/): cd .gpu && TAG=x bash run.sh PHASE...
# tree/ = the change, treeB/ = the baseline (fp4serve only)
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
G=$PWD; L=$OUT/logs; mkdir -p $L; S=$OUT/sum.txt
A=/tmp/fa; B=/tmp/fb; T=/tmp/tlA; k=0
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
pack() { (cd $OUT && tar -czf run-${TAG:-x}.tgz logs && rm -rf logs); }
# ncu of one kernel (regex) in a decode run: label bin model regex skip
prof() {
  local lab=$1 bin=$2 m=$3 re=$4 skip=$5
  FP4S_NO_GRAPH=1 timeout 240 ncu --clock-control none --cache-control none -k regex:$re --launch-skip $skip --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SourceCounters \
    --section SchedulerStats --section Occupancy --section LaunchStats --import-source yes -o /tmp/p-$lab \
    $bin/fp4serve bench -m /tmp/$m -p 0 -n 24 --reps 1 > $L/ncu-$lab.log 2>&1
  echo "ncu $lab rc=$?" >> $S
  ncu -i /tmp/p-$lab.ncu-rep --page details > $L/ncu-$lab-details.txt 2>&1
  ncu -i /tmp/p-$lab.ncu-rep --page source --csv --print-source cuda > $L/ncu-$lab-cuda.csv 2>&1
  ncu -i /tmp/p-$lab.ncu-rep --page source --csv --print-source sass > $L/ncu-$lab-sass.csv 2>&1
  gzip -f $L/ncu-$lab-sass.csv $L/ncu-$lab-cuda.csv
  grep -E "Duration|DRAM Throughput|Memory Throughput|Stall|Warp Cycles|Issued Warp|No Eligible" $L/ncu-$lab-details.txt | head -30 >> $S; }
for ph in "$@"; do case $ph in
d28) # the baseline and where the MoE launch's warps wait (gpt-oss-20b)
  nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader >> $S; echo "A $(cat $G/tree/COMMIT)" >> $S
  J=14 XF="-DCMAKE_CUDA_FLAGS=-lineinfo" bld $G/tree $A $L/build.log fp4serve
  gen go gpt-oss-20b mxfp4
  bench go-1 $A go -p 0 -n 128 --reps 3; bench god-1 $A go -p 0 --ctx 4096 -n 64 --reps 2
  prof moe $A go moe_tma 40

  bench go-2 $A go -p 0 -n 128 --reps 3 ;;
e28) # the ring's depth (FP4S_GEMV_TMA_SMEM: stages of the one-launch MoE) on gpt-oss-20b
  echo "A $(cat $G/tree/COMMIT)" >> $S
  [ -x $A/fp4serve ] || J=14 XF="-DCMAKE_CUDA_FLAGS=-lineinfo" bld $G/tree $A $L/build.log fp4serve
  gen go gpt-oss-20b mxfp4
  for rr in 1 2; do for kb in 112 64 88; do
    E="FP4S_GEMV_TMA_SMEM=$kb" bench go-$kb-$rr $A go -p 0 -n 128 --reps 3
    E="FP4S_GEMV_TMA_SMEM=$kb" bench god-$kb-$rr $A go -p 0 --ctx 4096 -n 64 --reps 2
  done; done
  FP4S_GEMV_TMA_SMEM=64 prof moe64 $A go moe_tma 40 ;;
l28) # the same on the dense kernels (gemv_tma): llama3-8b and qwen3-30b-a3b
  echo "A $(cat $G/tree/COMMIT)" >> $S
  [ -x $A/fp4serve ] || J=14 XF="-DCMAKE_CUDA_FLAGS=-lineinfo" bld $G/tree $A $L/build.log fp4serve
  gen ll llama3-8b; gen qw qwen3-30b-a3b
  for rr in 1 2; do for kb in 112 64 88; do
    E="FP4S_GEMV_TMA_SMEM=$kb" bench ll-$kb-$rr $A ll -p 0 -n 128 --reps 3
    E="FP4S_GEMV_TMA_SMEM=$kb" bench lld-$kb-$rr $A ll -p 0 --ctx 4096 -n 64 --reps 2
    E="FP4S_GEMV_TMA_SMEM=$kb" bench qw-$kb-$rr $A qw -p 0 -n 128 --reps 3
    E="FP4S_GEMV_TMA_SMEM=$kb" bench qwd-$kb-$rr $A qw -p 0 --ctx 4096 -n 64 --reps 2
  done; done ;;
f28) # the change (FP4S_MOE_STAGES, default 2): tests, then A/B against FP4S_MOE_STAGES=0 (main's depth)
  nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader >> $S; echo "A $(cat $G/tree/COMMIT)" >> $S
  J=14 bld $G/tree $A $L/build.log fp4serve test_moe_router test_engine_cuda test_golden test_gemv_experts
  cd $G/tree
  timeout 150 $A/tests/test_moe_router > $L/test_moe_router.txt 2>&1; echo "moe_router rc=$? $(grep -E 'passed|failed' $L/test_moe_router.txt | tail -1)" >> $S
  timeout 60 $A/tests/test_gemv_experts > $L/test_gemv_experts.txt 2>&1; echo "gemv_experts rc=$? $(grep -E 'passed|failed' $L/test_gemv_experts.txt | tail -1)" >> $S
  timeout 120 ctest --test-dir $A -R test_golden_cuda --output-on-failure > $L/test_golden_cuda.txt 2>&1; echo "golden_cuda rc=$? $(grep -E 'tests passed' $L/test_golden_cuda.txt | tail -1)" >> $S
  cd $G
  gen go gpt-oss-20b mxfp4
  for rr in 1 2; do for st in 2 0; do
    E="FP4S_MOE_STAGES=$st" bench go-$st-$rr $A go -p 0 -n 128 --reps 3
    E="FP4S_MOE_STAGES=$st" bench god-$st-$rr $A go -p 0 --ctx 4096 -n 64 --reps 2
  done; done
  gen qw qwen3-30b-a3b
  for st in 2 0; do E="FP4S_MOE_ONE=1 FP4S_MOE_STAGES=$st" bench qw1-$st $A qw -p 0 -n 128 --reps 3; done
  bench qw $A qw -p 0 -n 128 --reps 3 ;;
g28) # the CUDA tests not run in f28 (test_gemv_experts prints only at its end: 60 s were too few)
  echo "A $(cat $G/tree/COMMIT)" >> $S
  [ -x $A/tests/test_engine_cuda ] || J=14 bld $G/tree $A $L/build.log fp4serve test_engine_cuda test_gemv_experts
  cd $G/tree
  s0=$(date +%s); timeout 250 $A/tests/test_gemv_experts > $L/test_gemv_experts.txt 2>&1; echo "gemv_experts rc=$? $(( $(date +%s)-s0 )) s $(grep -E 'passed|failed' $L/test_gemv_experts.txt | tail -1)" >> $S
  s0=$(date +%s); timeout 300 $A/tests/test_engine_cuda > $L/test_engine_cuda.txt 2>&1; echo "engine_cuda rc=$? $(( $(date +%s)-s0 )) s $(grep -E 'passed|failed' $L/test_engine_cuda.txt | tail -1)" >> $S
  cd $G ;;
h28) # gpt-oss-120b A/B
  echo "A $(cat $G/tree/COMMIT)" >> $S
  rm -rf /tmp/qw /tmp/go /tmp/ll; gen o120 gpt-oss-120b mxfp4
  for st in 2 0; do
    E="FP4S_MOE_STAGES=$st" bench o-$st $A o120 -p 0 -n 128 --reps 3
    E="FP4S_MOE_STAGES=$st" bench od-$st $A o120 -p 0 --ctx 4096 -n 64 --reps 2
  done ;;
i28) # FP4S_MOE_AHEAD (copies in flight apart from the ring's depth): tests, gpt-oss-20b round 1
  nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader >> $S; echo "A $(cat $G/tree/COMMIT)" >> $S
  J=14 bld $G/tree $A $L/build.log fp4serve test_moe_router test_engine_cuda test_golden test_gemv_experts
  cd $G/tree
  for cf in "X=1" "FP4S_MOE_STAGES=4 FP4S_MOE_AHEAD=2" "FP4S_MOE_AHEAD=1"; do
    env $cf timeout 150 $A/tests/test_moe_router > $L/test_moe_router.txt 2>&1; echo "moe_router $cf rc=$? $(grep -E 'passed|failed' $L/test_moe_router.txt | tail -1)" >> $S; done
  timeout 120 ctest --test-dir $A -R test_golden_cuda --output-on-failure > $L/test_golden_cuda.txt 2>&1; echo "golden_cuda rc=$? $(grep -E 'tests passed' $L/test_golden_cuda.txt | tail -1)" >> $S
  timeout 100 $A/tests/test_engine_cuda > $L/test_engine_cuda.txt 2>&1; echo "engine_cuda rc=$? $(grep -E 'passed|failed' $L/test_engine_cuda.txt | tail -1)" >> $S
  cd $G
  gen go gpt-oss-20b mxfp4
  for cf in "FP4S_MOE_STAGES=2" "FP4S_MOE_STAGES=4 FP4S_MOE_AHEAD=2" "FP4S_MOE_STAGES=4 FP4S_MOE_AHEAD=1" "FP4S_MOE_STAGES=2 FP4S_MOE_AHEAD=1"; do
    k=$((k+1)); E="$cf" bench go-1-$k $A go -p 0 -n 128 --reps 3; E="$cf" bench god-1-$k $A go -p 0 --ctx 4096 -n 64 --reps 2; done ;;
j28) # gpt-oss-20b round 2; qwen3-30b-a3b with a smaller ring for gemv_tma's expert launches (FP4S_GEMV_TMA_ESMEM)
  echo "A $(cat $G/tree/COMMIT)" >> $S
  gen go gpt-oss-20b mxfp4
  for cf in "FP4S_MOE_STAGES=4 FP4S_MOE_AHEAD=1" "FP4S_MOE_STAGES=2 FP4S_MOE_AHEAD=1" "FP4S_MOE_STAGES=4 FP4S_MOE_AHEAD=2" "FP4S_MOE_STAGES=2"; do
    k=$((k+1)); E="$cf" bench go-2-$k $A go -p 0 -n 128 --reps 3; E="$cf" bench god-2-$k $A go -p 0 --ctx 4096 -n 64 --reps 2; done
  gen qw qwen3-30b-a3b
  for cf in "X=1" "FP4S_GEMV_TMA_ESMEM=64" "FP4S_GEMV_TMA_ESMEM=88"; do
    k=$((k+1)); E="$cf" bench qw-$k $A qw -p 0 -n 128 --reps 3; E="$cf" bench qwd-$k $A qw -p 0 --ctx 4096 -n 64 --reps 2; done ;;
k28) # the device's preferred L1 / shared split (FP4S_CACHE_CONFIG): is it the kernels' differing splits that keep them apart?
  nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader >> $S; echo "A $(cat $G/tree/COMMIT)" >> $S
  J=14 bld $G/tree $A $L/build.log fp4serve
  gen go gpt-oss-20b mxfp4
  for cc in none shared; do for re in gemv_fast attn_mma moe_tma; do
    env FP4S_CACHE_CONFIG=$cc FP4S_NO_GRAPH=1 timeout 120 ncu --section LaunchStats -k regex:$re --launch-skip 30 --launch-count 1 $A/fp4serve bench -m /tmp/go -p 0 -n 8 --reps 1 > $L/ncu-cfg-$cc-$re.txt 2>&1
    echo "$cc $re: $(grep -E 'Shared Memory Configuration Size' $L/ncu-cfg-$cc-$re.txt | tr -s ' ')" >> $S; done; done
  for rr in 1 2; do for cf in "FP4S_MOE_AHEAD=1" "FP4S_MOE_AHEAD=1 FP4S_CACHE_CONFIG=shared" "FP4S_MOE_STAGES=0" "FP4S_MOE_STAGES=0 FP4S_CACHE_CONFIG=shared"; do
    k=$((k+1)); E="$cf" bench go-$k $A go -p 0 -n 128 --reps 3; E="$cf" bench god-$k $A go -p 0 --ctx 4096 -n 64 --reps 2; done; done
  gen ll llama3-8b
  for cf in "X=1" "FP4S_CACHE_CONFIG=shared"; do
    k=$((k+1)); E="$cf" bench ll-$k $A ll -p 0 -n 128 --reps 3; E="$cf" bench lld-$k $A ll -p 0 --ctx 4096 -n 64 --reps 2; done ;;
m28) # the final defaults (2 stages, 1 copy ahead): tests, gpt-oss-20b against main's depth in the same binary
  nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader >> $S; echo "A $(cat $G/tree/COMMIT)" >> $S
  J=14 bld $G/tree $A $L/build.log fp4serve test_moe_router test_engine_cuda test_golden test_gemv_experts
  cd $G/tree
  for cf in "X=1" "FP4S_MOE_STAGES=0 FP4S_MOE_AHEAD=0" "FP4S_MOE_STAGES=4 FP4S_MOE_AHEAD=2"; do
    env $cf timeout 150 $A/tests/test_moe_router > $L/test_moe_router.txt 2>&1; echo "moe_router $cf rc=$? $(grep -E 'passed|failed' $L/test_moe_router.txt | tail -1)" >> $S; done
  timeout 120 ctest --test-dir $A -R test_golden_cuda --output-on-failure > $L/test_golden_cuda.txt 2>&1; echo "golden_cuda rc=$? $(grep -E 'tests passed' $L/test_golden_cuda.txt | tail -1)" >> $S
  timeout 100 $A/tests/test_engine_cuda > $L/test_engine_cuda.txt 2>&1; echo "engine_cuda rc=$? $(grep -E 'passed|failed' $L/test_engine_cuda.txt | tail -1)" >> $S
  s0=$(date +%s); timeout 150 $A/tests/test_gemv_experts > $L/test_gemv_experts.txt 2>&1; echo "gemv_experts rc=$? $(( $(date +%s)-s0 )) s $(grep -E 'passed|failed' $L/test_gemv_experts.txt | tail -1)" >> $S
  cd $G
  gen go gpt-oss-20b mxfp4
  for rr in 1 2; do for cf in "X=1" "FP4S_MOE_STAGES=0 FP4S_MOE_AHEAD=0"; do
    k=$((k+1)); E="$cf" bench go-$k $A go -p 0 -n 128 --reps 3; E="$cf" bench god-$k $A go -p 0 --ctx 4096 -n 64 --reps 2; done; done ;;
n28) # gpt-oss-120b, final defaults against main's depth
  echo "A $(cat $G/tree/COMMIT)" >> $S
  rm -rf /tmp/qw /tmp/go /tmp/ll; gen o120 gpt-oss-120b mxfp4
  for cf in "X=1" "FP4S_MOE_STAGES=0 FP4S_MOE_AHEAD=0"; do
    k=$((k+1)); E="$cf" bench o-$k $A o120 -p 0 -n 128 --reps 3; E="$cf" bench od-$k $A o120 -p 0 --ctx 4096 -n 64 --reps 2; done ;;
p28) # the dense kernels: a 64 or 88 KB ring for matrices under 16 MB only (FP4S_GEMV_TMA_SMALL)
  echo "A $(cat $G/tree/COMMIT)" >> $S
  J=14 bld $G/tree $A $L/build.log fp4serve
  rm -rf /tmp/o120; gen ll llama3-8b; gen qw qwen3-30b-a3b
  for cf in "X=1" "FP4S_GEMV_TMA_SMALL=64:16" "FP4S_GEMV_TMA_SMALL=88:16"; do
    k=$((k+1)); E="$cf" bench ll-$k $A ll -p 0 -n 128 --reps 3; E="$cf" bench lld-$k $A ll -p 0 --ctx 4096 -n 64 --reps 2
    E="$cf" bench qw-$k $A qw -p 0 -n 128 --reps 3; E="$cf" bench qwd-$k $A qw -p 0 --ctx 4096 -n 64 --reps 2; done
  for cf in "X=1" "FP4S_GEMV_TMA_SMALL=64:16"; do
    k=$((k+1)); E="$cf" bench ll-$k $A ll -p 0 -n 128 --reps 3; E="$cf" bench lld-$k $A ll -p 0 --ctx 4096 -n 64 --reps 2; done ;;
q28) # one kernel's split at a time: the MoE launch at the largest (is the gain its own L1?), the attention at a smaller one
  nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader >> $S; echo "A $(cat $G/tree/COMMIT)" >> $S
  J=14 bld $G/tree $A $L/build.log fp4serve
  gen go gpt-oss-20b mxfp4; gen ll llama3-8b
  for cf in "FP4S_MOE_CARVEOUT=100" "FP4S_ATTN_CARVEOUT=40"; do for re in attn_mma moe_tma; do
    env $cf FP4S_NO_GRAPH=1 timeout 120 ncu --section LaunchStats -k regex:$re --launch-skip 30 --launch-count 1 $A/fp4serve bench -m /tmp/go -p 0 -n 8 --reps 1 > $L/ncu-cfg-$re.txt 2>&1
    echo "$cf $re: $(grep -E 'Shared Memory Configuration Size' $L/ncu-cfg-$re.txt | tr -s ' ')" >> $S; done; done
  for cf in "X=1" "FP4S_MOE_CARVEOUT=100" "FP4S_ATTN_CARVEOUT=40" "FP4S_ATTN_CARVEOUT=40 FP4S_MOE_CARVEOUT=0"; do
    k=$((k+1)); E="$cf" bench go-$k $A go -p 0 -n 128 --reps 3; E="$cf" bench god-$k $A go -p 0 --ctx 4096 -n 64 --reps 2; done
  for cf in "X=1" "FP4S_ATTN_CARVEOUT=40"; do
    k=$((k+1)); E="$cf" bench god-$k $A go -p 0 --ctx 4096 -n 64 --reps 2; E="$cf" bench lld-$k $A ll -p 0 --ctx 4096 -n 64 --reps 2; done ;;
r28) # where the 2-stage ring's gain sits in a layer: timelines (FP4S_DIAG_TL build) of 2 against 4 stages, depth 4096
  echo "A $(cat $G/tree/COMMIT)" >> $S
  J=14 XF="-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" bld $G/tree $T $L/build-tl.log fp4serve
  A=$T; gen go gpt-oss-20b mxfp4
  for cf in "X=1" "FP4S_MOE_STAGES=0 FP4S_MOE_AHEAD=0"; do
    k=$((k+1)); env $cf FP4S_TL=$L/tl-$k.txt $T/fp4serve bench -m /tmp/go -p 0 --ctx 4096 -n 64 --reps 1 > $L/tlbench-$k.txt 2>&1
    (cd $G/tree/dev && python3 timeline.py $L/tl-$k.txt > $L/tlsum-$k.txt 2>&1; python3 moe_marks.py $L/tl-$k.txt > $L/moe-$k.txt 2>&1); rm -f $L/tl-$k.txt
    echo "== tl $cf $(grep -E '^tg' $L/tlbench-$k.txt)" >> $S; grep -m1 -A9 "per position" $L/tlsum-$k.txt | tail -8 >> $S; tail -10 $L/moe-$k.txt >> $S; done ;;
s28) # ncu of the 2-stage launch (defaults), as d28 read the 4-stage one
  echo "A $(cat $G/tree/COMMIT)" >> $S
  J=14 XF="-DCMAKE_CUDA_FLAGS=-lineinfo" bld $G/tree $A $L/build.log fp4serve
  gen go gpt-oss-20b mxfp4
  prof moe2 $A go moe_tma 40 ;;
pack) pack ;;
esac; done
