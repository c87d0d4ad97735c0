#!/usr/bin/env bash
# device runs of session 29 (H200), from a git-ignored copy in .gpu/: cd .gpu && TAG=x bash run.sh PHASE...
# tree/ = the commit under test (with .deps/ for the Debian libraries), built in /tmp/fa
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
G=$PWD; L=$OUT/logs; mkdir -p $L; S=$OUT/sum.txt
A=/tmp/fa; k=0
ts() { echo "$(date +%T) $*" >> $S; }
cfg() { cmake -S $1 -B $2 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$1/.deps/root/usr "${@:3}"; }
bld() { # src build log targets...
  local s0=$(date +%s) src=$1 dir=$2 log=$3; shift 3
  cfg $src $dir ${XF:+"$XF"} > $log 2>&1 && cmake --build $dir -j${J:-16} --target "$@" >> $log 2>&1; ts "build $dir rc=$? $(( $(date +%s)-s0 )) s"; }
gen() { [ -d /tmp/$1 ] || { s0=$(date +%s); $A/fp4serve gen --preset $2 --format ${3:-nvfp4} /tmp/$1 > $L/gen-$1.log 2>&1; ts "gen $1 rc=$? $(( $(date +%s)-s0 )) s"; }; }
bench() { # label bin model args... (env via E=)
  local lab=$1 bin=$2 m=$3; shift 3
  echo "== $lab $* ${E:-}" >> $L/e2e.txt
  env ${E:-X=1} $bin/fp4serve bench -m /tmp/$m "$@" > $L/b-$lab.txt 2>&1
  local res=$(grep -E "^(tg|pp)" $L/b-$lab.txt | tail -1) c=$(grep -E "^ceiling" $L/b-$lab.txt | awk '{print $2}')
  echo "$res" >> $L/e2e.txt; printf "%s %-14s %-22s %s (ceil %s)\n" "$(date +%T)" "$lab" "${E:-}" "$res" "$c" >> $S; }
pack() { (cd $OUT && tar -czf run-${TAG:-x}.tgz logs && rm -rf logs); }
# ncu of one kernel (regex) in a decode run: label bin model regex skip
prof() {
  local lab=$1 bin=$2 m=$3 re=$4 skip=$5
  FP4S_NO_GRAPH=1 timeout 200 ncu --clock-control none --cache-control none -k regex:$re --launch-skip $skip --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SourceCounters \
    --section SchedulerStats --section Occupancy --section LaunchStats --import-source yes -o /tmp/p-$lab \
    $bin/fp4serve bench -m /tmp/$m -p 0 -n 24 --reps 1 > $L/ncu-$lab.log 2>&1
  ts "ncu $lab rc=$?"
  ncu -i /tmp/p-$lab.ncu-rep --page details > $L/ncu-$lab-details.txt 2>&1
  ncu -i /tmp/p-$lab.ncu-rep --page source --csv --print-source sass > $L/ncu-$lab-sass.csv 2>&1
  gzip -f $L/ncu-$lab-sass.csv
  grep -E "Duration|DRAM Throughput|Memory Throughput|Stall|Warp Cycles|Issued Warp|No Eligible|Grid Size|Registers" $L/ncu-$lab-details.txt | head -30 >> $S; }
hw() { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,memory.total --format=csv,noheader >> $S; echo "A $(cat $G/tree/COMMIT)" >> $S; }
for ph in "$@"; do case $ph in
b29) # the H200 baseline of main: build, copy ceiling and the decode GEMV's fixed cost / streaming rate, e2e decode
  hw
  J=16 XF="-DCMAKE_CUDA_FLAGS=-lineinfo" bld $G/tree $A $L/build.log fp4serve stream_bench gemv_bench
  timeout 120 $A/dev/stream_bench > $L/stream.txt 2>&1; ts "stream_bench rc=$?"; grep -iE "ceiling|fixed|fit|rate" $L/stream.txt | head -12 >> $S
  gen ll llama3-8b; gen qw qwen3-30b-a3b; gen go gpt-oss-20b mxfp4
  for m in ll qw go; do bench $m-1 $A $m -p 0 -n 128 --reps 3; bench ${m}d-1 $A $m -p 0 --ctx 4096 -n 64 --reps 2; done
  hw ;;
c29) # the GEMV table of #6 (graph chains), ncu of llama3-8b's gate|up launch (dense gemv_tma loops: instruction fetch?)
  [ -x $A/fp4serve ] || J=16 XF="-DCMAKE_CUDA_FLAGS=-lineinfo" bld $G/tree $A $L/build.log fp4serve stream_bench gemv_bench
  timeout 200 $A/dev/gemv_bench quick > $L/gemv.txt 2>&1; ts "gemv_bench rc=$?"; tail -22 $L/gemv.txt >> $S
  gen ll llama3-8b
  prof llgu $A ll gemv_tma 42 ;;
d29) # the ring cursor (B: no division a stage) and B with the step loop hoisted and unrolled by 2 (C) against main (A)
  hw
  for v in A B C; do J=6 XF="-DCMAKE_CUDA_FLAGS=-lineinfo" bld $G/tree$v /tmp/f$v $L/build-$v.log fp4serve stream_bench & done; wait; ts "builds done"
  for v in A B C; do timeout 60 /tmp/f$v/dev/stream_bench > $L/stream-$v.txt 2>&1; ts "stream $v: $(grep fit $L/stream-$v.txt)"; done
  FP4S_GEMV_TMA_PROBE=1 timeout 60 /tmp/fA/dev/stream_bench > $L/stream-A-probe1.txt 2>&1; ts "stream A probe1: $(grep fit $L/stream-A-probe1.txt)"
  FP4S_GEMV_TMA_PROBE=2 timeout 60 /tmp/fA/dev/stream_bench > $L/stream-A-probe2.txt 2>&1; ts "stream A probe2: $(grep fit $L/stream-A-probe2.txt)"
  A=/tmp/fA; gen ll llama3-8b; gen qw qwen3-30b-a3b; gen go gpt-oss-20b mxfp4
  for rr in 1 2; do for v in A B C; do for m in ll qw go; do
    bench $m-$v-$rr /tmp/f$v $m -p 0 -n 128 --reps 3; bench ${m}d-$v-$rr /tmp/f$v $m -p 0 --ctx 4096 -n 64 --reps 2; done; done; done
  hw ;;
e29) # shared-space addresses in gemv_tma's step loop (D, on B) against B: speed, then every GPU test on D
  hw
  J=6 XF="-DCMAKE_CUDA_FLAGS=-lineinfo" bld $G/treeB /tmp/fB $L/build-B.log fp4serve stream_bench &
  J=10 XF="-DCMAKE_CUDA_FLAGS=-lineinfo" bld $G/treeD /tmp/fD $L/build-D.log all & wait; ts "builds done"
  cuobjdump -sass -fun '_Z15gemv_tma_kernelILi0ELi1ELi0EEv7gm_args' /tmp/fD/CMakeFiles/fp4s.dir/src/backend/cuda/gemv_tma.cu.o > $L/sass-D.txt 2>&1
  cuobjdump -sass -fun '_Z15gemv_tma_kernelILi0ELi1ELi0EEv7gm_args' /tmp/fB/CMakeFiles/fp4s.dir/src/backend/cuda/gemv_tma.cu.o > $L/sass-B.txt 2>&1
  ts "sass: S2R B $(grep -c S2R $L/sass-B.txt) D $(grep -c S2R $L/sass-D.txt); lines B $(wc -l < $L/sass-B.txt) D $(wc -l < $L/sass-D.txt)"
  for v in B D; do timeout 60 /tmp/f$v/dev/stream_bench > $L/stream-$v.txt 2>&1; ts "stream $v: $(grep fit $L/stream-$v.txt)"; done
  A=/tmp/fB; gen ll llama3-8b; gen qw qwen3-30b-a3b
  for v in B D; do for m in ll qw; do
    bench $m-$v-1 /tmp/f$v $m -p 0 -n 128 --reps 3; bench ${m}d-$v-1 /tmp/f$v $m -p 0 --ctx 4096 -n 64 --reps 2; done; done
  cd $G/treeD; s0=$(date +%s)
  timeout 330 ctest --test-dir /tmp/fD -L gpu -j4 --output-on-failure > $L/ctest-D.txt 2>&1; ts "ctest D rc=$? $(( $(date +%s)-s0 )) s"
  grep -E "tests passed|Passed|Failed|Timeout|\*\*\*" $L/ctest-D.txt | head -20 >> $S; cd $G
  hw ;;
f29) # final: the session's kernels (treeN) against main (treeA): the #6 GEMV table (M = 1 / 4 / 16), decode figures, gpt-oss-120b where the disk holds it, time to first token
  hw; df -h /tmp /dev/shm >> $S 2>&1; free -g | head -2 >> $S
  J=8 bld $G/treeN /tmp/fN $L/build-N.log fp4serve stream_bench gemv_bench &
  J=8 bld $G/treeA /tmp/fA $L/build-A.log fp4serve stream_bench gemv_bench & wait; ts "builds done"
  for v in N A; do timeout 100 /tmp/f$v/dev/gemv_bench quick > $L/gemv-$v.txt 2>&1; ts "gemv_bench $v rc=$?"; done
  for v in N A; do timeout 60 /tmp/f$v/dev/stream_bench > $L/stream-$v.txt 2>&1; ts "stream $v: $(grep fit $L/stream-$v.txt)"; done
  A=/tmp/fN; gen ll llama3-8b; gen qw qwen3-30b-a3b; gen go gpt-oss-20b mxfp4
  sync; echo 3 > /proc/sys/vm/drop_caches; s0=$(date +%s%N)
  /tmp/fN/fp4serve run -m /tmp/ll -p "Once upon a time" -n 1 --temperature 0 > $L/ttft-cold.txt 2>&1; ts "ttft cold rc=$? $(( ($(date +%s%N)-s0)/1000000 )) ms"
  s0=$(date +%s%N); /tmp/fN/fp4serve run -m /tmp/ll -p "Once upon a time" -n 1 --temperature 0 > $L/ttft-warm.txt 2>&1; ts "ttft warm rc=$? $(( ($(date +%s%N)-s0)/1000000 )) ms"
  for rr in 1 2; do for v in N A; do for m in ll qw go; do
    bench $m-$v-$rr /tmp/f$v $m -p 0 -n 128 --reps 3; bench ${m}d-$v-$rr /tmp/f$v $m -p 0 --ctx 4096 -n 64 --reps 2; done; done; done
  bench llpp-N /tmp/fN ll -p 512 -n 0 --reps 3
  rm -rf /tmp/ll /tmp/qw /tmp/go
  free=$(df --output=avail -B1G /tmp | tail -1); ts "free for 120b: $free GB"
  if [ "$free" -gt 68 ]; then gen o120 gpt-oss-120b mxfp4; for v in N A; do bench o-$v /tmp/f$v o120 -p 0 -n 128 --reps 3; bench od-$v /tmp/f$v o120 -p 0 --ctx 4096 -n 64 --reps 2; done; fi
  hw ;;
pack) pack ;;
esac; done
