#!/usr/bin/env bash
# Session 37's device runs, from the repository root (the working tree as sent), with .gpu/deps
# (scripts/gpu-deps.sh) and .gpu/shared carried. Each call:
#   TAG=T timeout N bash bench/results/raw/2026-11-29s37/run.sh PHASE; TAG=T bash ... pack
# Phase n (tile-group policies) ran from raw/2026-11-29s36/run.sh (call 1).
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
R=$PWD; L=$OUT/logs; mkdir -p $L; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" >> $S; }
bld() { local s0=$(date +%s) dir=$1 log=$2; shift 2
  cmake -S $R -B $dir -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$R/.gpu/deps/root/usr > $log 2>&1 &&
  cmake --build $dir -j${J:-16} --target "$@" >> $log 2>&1; ts "build $dir $* rc=$? $(( $(date +%s)-s0 )) s"; }
# bench LAB MODEL ARGS (env passes through)
bench() { local lab=$1 m=$2; shift 2
  $B bench -m $m "$@" > $L/b-$lab.txt 2>&1
  ts "$lab $(grep -E '^(tg|sampling)' $L/b-$lab.txt | tr '\n' ' ')"; }
tt() { local x=$1 t; shift; t=$(find $BD -name $x -type f | head -1)
  (cd $R && timeout ${TT:-300} env FP4S_TEST_VERBOSE=1 $t "$@" > $L/t-$x.txt 2>&1; ts "$x rc=$?")
  tail -2 $L/t-$x.txt >> $S; grep -m8 -E "FAIL|differ" $L/t-$x.txt >> $S; }
# setupS [TARGETS]: fp4serve (and TARGETS) built, llama3-8b and gpt-oss-20b generated while the
# two GPU tests build (phases s, b, c)
setupS() {
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  BD=/tmp/fs; B=$BD/fp4serve
  bld $BD $L/build.log fp4serve "$@"
  $B gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen-l.log 2>&1 &
  $B gen --preset gpt-oss-20b --format mxfp4 /dev/shm/gpt-oss-20b > $L/gen-o.log 2>&1 &
  J=10 bld $BD $L/build-t.log test_sample test_engine_cuda
  wait; }
sbench() { $(find $BD -name sample_bench -type f | head -1) > $L/sample_bench.txt 2>&1; ts "sample_bench rc=$?"
  cat $L/sample_bench.txt >> $S; }
# benchS: decode greedy against sampled on the device (phases b, c)
benchS() { local l=/dev/shm/llama3-8b o=/dev/shm/gpt-oss-20b rr
  for rr in 1 2; do
    bench l-greedy-$rr $l -p 0 -n 128 --reps 3
    bench l-p9-dev-$rr $l -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9
  done
  bench l-t1-dev $l -p 0 -n 128 --reps 3 --temp 1.0
  bench l-k40-dev $l -p 0 -n 128 --reps 3 --temp 0.7 --top-k 40
  bench lb-greedy $l -p 128 -n 32 --reps 2 --batch 64
  bench lb-p9-dev $l -p 128 -n 32 --reps 2 --batch 64 --temp 0.7 --top-p 0.9
  bench o-greedy $o -p 0 -n 128 --reps 3
  bench o-p9-dev $o -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9; }
for ph in "$@"; do case $ph in
# Phase s: sampling on the device (sample.cu). The op test against the CPU sampler, the engine's
# device-vs-host check, then decode with --temp on the device against the host path
# (FP4S_DEVICE_SAMPLE=0: logits copied back, sampler.c), greedy as the reference.
s)
  setupS
  tt test_sample
  TT=240 tt test_engine_cuda
  l=/dev/shm/llama3-8b; o=/dev/shm/gpt-oss-20b
  for rr in 1 2; do
    bench l-greedy-$rr $l -p 0 -n 128 --reps 3
    bench l-p9-dev-$rr $l -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9
    FP4S_DEVICE_SAMPLE=0 bench l-p9-host-$rr $l -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9
  done
  bench l-t1-dev $l -p 0 -n 128 --reps 3 --temp 1.0
  FP4S_DEVICE_SAMPLE=0 bench l-t1-host $l -p 0 -n 128 --reps 3 --temp 1.0
  bench l-k40-dev $l -p 0 -n 128 --reps 3 --temp 0.7 --top-k 40
  FP4S_DEVICE_SAMPLE=0 bench l-k40-host $l -p 0 -n 128 --reps 3 --temp 0.7 --top-k 40
  bench lb-greedy $l -p 128 -n 32 --reps 2 --batch 64
  bench lb-p9-dev $l -p 128 -n 32 --reps 2 --batch 64 --temp 0.7 --top-p 0.9
  FP4S_DEVICE_SAMPLE=0 bench lb-p9-host $l -p 128 -n 32 --reps 2 --batch 64 --temp 0.7 --top-p 0.9
  bench o-greedy $o -p 0 -n 128 --reps 3
  bench o-p9-dev $o -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9
  FP4S_DEVICE_SAMPLE=0 bench o-p9-host $o -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9 ;;
# Phase b: s2's kernel with pinned staging (one copy up), warps with no token of a radix pass's
# prefix skipping it, and dev/sample_bench (the kernel alone, CUDA events) to split a token's
# sampling cost between the kernel and the op around it.
b)
  setupS sample_bench
  sbench
  tt test_sample
  TT=240 tt test_engine_cuda
  benchS ;;
# Phase c: a row on a thread block cluster of up to 8 (b measured one block a row compute bound:
# 396 us for llama3-8b's vocabulary with top_p). sample_bench, the tests with clusters and with
# one block a row (FP4S_SAMPLE_BLOCKS=1), decode as in b.
c)
  setupS sample_bench
  sbench
  tt test_sample
  cp $L/t-test_sample.txt $L/t-test_sample-cluster.txt
  FP4S_SAMPLE_BLOCKS=1 tt test_sample
  TT=240 tt test_engine_cuda
  benchS ;;
# Phase v: the server with 64 streaming clients (512-token prompts, 256 new, 20 s each) sampling
# at temperature 0.7, top_p 0.9: drawn on the device, then on the host (FP4S_DEVICE_SAMPLE=0),
# then greedy (the load the recorded server figures used).
v)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  BD=/tmp/fs; B=$BD/fp4serve
  bld $BD $L/build.log fp4serve
  $B gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen-l.log 2>&1
  for v in "dev 0.7 1" "host 0.7 0" "greedy 0 1"; do set -- $v
    FP4S_DEVICE_SAMPLE=$3 $B serve -m /dev/shm/llama3-8b --port 0 --max-model-len 1024 --max-num-seqs 64 \
      --threads-http 96 > $L/serve-$1.log 2>&1 &
    pid=$!; port=
    for _ in $(seq 1 300); do
      port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' $L/serve-$1.log | head -1 | sed 's/.*://')
      [ -n "$port" ] && python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health')" 2>/dev/null && break
      sleep 0.2
    done
    python3 bench/load_test.py --port "$port" --clients 64 --seconds ${SECS:-20} --prompt-tokens 512 --max-tokens 256 \
      --temperature $2 --top-p 0.9 > $L/load-$1.txt 2>&1
    ts "server $1 (T $2): $(tr '\n' ' ' < $L/load-$1.txt | cut -c1-400)"
    kill -TERM $pid; wait $pid
  done ;;
pack) (cd $OUT && tar -czf run-${TAG:-x}.tgz logs && rm -rf logs) ;;
esac; done
