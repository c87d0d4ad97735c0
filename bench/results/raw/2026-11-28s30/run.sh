#!/usr/bin/env bash
# Session 30 device runs. Trees: .gpu/treeC (main + next-gemv-step + next-moe-lds), .gpu/treeX (C + two
# accumulator chains in gemv_tma's step), .gpu/deps (scripts/gpu-deps.sh), .gpu/shared/realdata/stories260K.
#   cd .gpu && TAG=x timeout 560 bash run.sh PHASE; TAG=x bash run.sh pack
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
G=$PWD; L=$OUT/logs; mkdir -p $L; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" >> $S; }
bld() { local s0=$(date +%s) src=$1 dir=$2 log=$3; shift 3
  [ -x $dir/fp4serve ] && { ts "build $dir: kept"; return; }
  cmake -S $src -B $dir -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_FLAGS=-lineinfo -DCMAKE_PREFIX_PATH=$G/deps/root/usr > $log 2>&1 &&
  cmake --build $dir -j${J:-8} --target "$@" >> $log 2>&1; ts "build $dir rc=$? $(( $(date +%s)-s0 )) s"; }
bench() { local lab=$1 bin=$2 m=$3; shift 3
  $bin/fp4serve bench -m $m "$@" > $L/b-$lab.txt 2>&1; ts "$lab $(grep -E '^(tg|pp)' $L/b-$lab.txt | tail -1)"; }
gen() { [ -d /dev/shm/$1 ] || /tmp/fC/fp4serve gen --preset $1 --format $2 /dev/shm/$1 > $L/gen-$1.log 2>&1; }
prof() { local lab=$1 bin=$2 m=$3 re=$4 skip=$5
  FP4S_NO_GRAPH=1 timeout 150 ncu --clock-control none --cache-control none -k regex:$re --launch-skip $skip --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --section SchedulerStats --section ComputeWorkloadAnalysis \
    --section InstructionStats --import-source yes -o /tmp/p-$lab $bin/fp4serve bench -m /dev/shm/$m -p 0 -n 24 --reps 1 > $L/ncu-$lab.log 2>&1
  ts "ncu $lab rc=$?"
  ncu -i /tmp/p-$lab.ncu-rep --page details > $L/ncu-$lab-details.txt 2>&1
  ncu -i /tmp/p-$lab.ncu-rep --page source --csv --print-source sass > $L/ncu-$lab-sass.csv 2>&1; gzip -f $L/ncu-$lab-sass.csv
  grep -E "Duration|DRAM Throughput|Issued Warp|No Eligible|Registers" $L/ncu-$lab-details.txt | head -8 >> $S; }
TT="fp4serve stream_bench test_gemv test_gemm test_gemv_experts test_moe_router test_engine_cuda test_golden"
for ph in "$@"; do case $ph in
b31) # C = main (0841791), D = C + fp4s_e2m1_perm_pair by plain shifts (bit-identical, IMAD.SHL-able)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  J=8 bld $G/treeC /tmp/fC $L/build-C.log fp4serve stream_bench & J=8 bld $G/treeD /tmp/fD $L/build-D.log $TT & wait
  for v in C D; do timeout 60 /tmp/f$v/dev/stream_bench > $L/stream-$v.txt 2>&1; ts "stream $v: $(grep fit $L/stream-$v.txt)"; done
  gen llama3-8b nvfp4; gen qwen3-30b-a3b nvfp4; gen gpt-oss-20b mxfp4
  for v in C D; do
    bench llama3-8b-$v-1 /tmp/f$v /dev/shm/llama3-8b -p 0 -n 128 --reps 3; bench llama3-8b-d-$v-1 /tmp/f$v /dev/shm/llama3-8b -p 0 --ctx 4096 -n 64 --reps 2
    bench qwen3-30b-a3b-$v-1 /tmp/f$v /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3; bench qwen3-30b-a3b-d-$v-1 /tmp/f$v /dev/shm/qwen3-30b-a3b -p 0 --ctx 4096 -n 64 --reps 2
    bench gpt-oss-20b-$v-1 /tmp/f$v /dev/shm/gpt-oss-20b -p 0 -n 128 --reps 3; bench gpt-oss-20b-d-$v-1 /tmp/f$v /dev/shm/gpt-oss-20b -p 0 --ctx 4096 -n 64 --reps 2
    bench llama3-8b-pp-$v /tmp/f$v /dev/shm/llama3-8b -p 512 -n 0 --reps 3
  done
  cd $G/treeD
  (timeout 130 ctest --test-dir /tmp/fD -R "test_golden_cuda|test_engine_cuda|test_gemm|test_gemv_experts|test_moe_router" -j5 --output-on-failure > $L/ctest-D.txt 2>&1; ts "ctest D rc=$?") &
  (timeout 130 /tmp/fD/tests/test_gemv "M=1" > $L/test_gemv-M1-D.txt 2>&1; ts "test_gemv M=1 D rc=$? $(grep -c 'rel L2' $L/test_gemv-M1-D.txt) cases; $(tail -1 $L/test_gemv-M1-D.txt)") &
  wait; grep -E "Passed|Failed|tests passed|Timeout" $L/ctest-D.txt >> $S ;;
b30) # build C and X, stream_bench, e2e decode C vs X (2 rounds), C with 4096-K stages, ncu of the gate|up launch
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  J=8 bld $G/treeC /tmp/fC $L/build-C.log all & J=8 bld $G/treeX /tmp/fX $L/build-X.log all & wait
  for v in C X; do timeout 60 /tmp/f$v/dev/stream_bench > $L/stream-$v.txt 2>&1; ts "stream $v: $(grep fit $L/stream-$v.txt)"; done
  gen llama3-8b nvfp4; gen qwen3-30b-a3b nvfp4; gen gpt-oss-20b mxfp4
  for rr in 1 2; do
    for v in C X; do for m in llama3-8b qwen3-30b-a3b gpt-oss-20b; do
      bench $m-$v-$rr /tmp/f$v /dev/shm/$m -p 0 -n 128 --reps 3; bench $m-d-$v-$rr /tmp/f$v /dev/shm/$m -p 0 --ctx 4096 -n 64 --reps 2; done; done
  done
  for m in llama3-8b qwen3-30b-a3b; do FP4S_GEMV_TMA_KC=4096 bench $m-C-kc4096 /tmp/fC /dev/shm/$m -p 0 -n 128 --reps 3; done
  prof llguX /tmp/fX llama3-8b gemv_tma 42 ;;
t30) # the GPU tests of tree $T (default X)
  T=${T:-X}
  (cd $G/tree$T && timeout 400 ctest --test-dir /tmp/f$T -L gpu -j4 --output-on-failure > $L/ctest-$T.txt 2>&1; ts "ctest $T rc=$?")
  grep -E "tests passed|Failed|\*\*\*|Passed|Timeout" $L/ctest-$T.txt >> $S ;;
g30) # the GEMV table (graph chains) of tree $T
  T=${T:-X}; timeout 200 /tmp/f$T/dev/gemv_bench quick > $L/gemv-$T.txt 2>&1; ts "gemv_bench $T rc=$?"; tail -40 $L/gemv-$T.txt >> $S ;;
pack) (cd $OUT && tar -czf run-${TAG:-x}.tgz logs && rm -rf logs) ;;
esac; done
