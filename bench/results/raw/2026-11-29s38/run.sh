#!/usr/bin/env bash
# Session 38's device runs, from the repository root (the working tree as sent), with .gpu/deps
# (scripts/gpu-deps.sh) carried. Each call:
#   TAG=T timeout N bash bench/results/raw/2026-11-29s38/run.sh PHASE; TAG=T bash ... pack
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
setup() {
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  BD=/tmp/fs; B=$BD/fp4serve
  bld $BD $L/build.log fp4serve "$@"
  $B gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen-l.log 2>&1 &
  $B gen --preset gpt-oss-20b --format mxfp4 /dev/shm/gpt-oss-20b > $L/gen-o.log 2>&1 &
  J=10 bld $BD $L/build-t.log test_sample test_engine_cuda sample_bench
  wait; }
# serve LAB DEVSAMPLE LOADARGS...: 64 streaming clients (512-token prompts, 256 new) on llama3-8b
serve() { local lab=$1 ds=$2 pid port; shift 2
  FP4S_DEVICE_SAMPLE=$ds $B serve -m /dev/shm/llama3-8b --port 0 --max-model-len 1024 --max-num-seqs 64 \
    --threads-http 96 ${SARGS:-} > $L/serve-$lab.log 2>&1 &
  pid=$!; port=
  for _ in $(seq 1 300); do
    port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' $L/serve-$lab.log | head -1 | sed 's/.*://')
    [ -n "$port" ] && python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health')" 2>/dev/null && break
    sleep 0.2
  done
  python3 bench/load_test.py --port "$port" --clients 64 --seconds ${SECS:-20} --prompt-tokens 512 --max-tokens 256 \
    "$@" > $L/load-$lab.txt 2>&1
  ts "server $lab: $(tr '\n' ' ' < $L/load-$lab.txt | cut -c1-420)"
  kill -TERM $pid; wait $pid; }
for ph in "$@"; do case $ph in
# Phase l: raw logprobs on the device. sample_bench (the kernel alone, with a logprobs row
# setting), the op test against the CPU sampler, the engine's device-vs-host check (now with
# logprobs on half the sampled requests, and the greedy runs' logprobs on the device), decode
# with --logprobs 5 on the device against the host path, greedy and top_p as references.
l)
  setup
  $(find $BD -name sample_bench -type f | head -1) > $L/sample_bench.txt 2>&1; ts "sample_bench rc=$?"
  cat $L/sample_bench.txt >> $S
  tt test_sample
  TT=240 tt test_engine_cuda
  grep -E "sampled:" $L/t-test_engine_cuda.txt >> $S
  l=/dev/shm/llama3-8b; o=/dev/shm/gpt-oss-20b
  for rr in 1 2; do
    bench l-greedy-$rr $l -p 0 -n 128 --reps 3
    bench l-greedy-lp5-$rr $l -p 0 -n 128 --reps 3 --logprobs 5
    bench l-p9-$rr $l -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9
    bench l-p9-lp5-$rr $l -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9 --logprobs 5
  done
  bench l-p9-lp20 $l -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9 --logprobs 20
  FP4S_DEVICE_SAMPLE=0 bench l-p9-lp5-host $l -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9 --logprobs 5
  bench lb-p9 $l -p 128 -n 32 --reps 2 --batch 64 --temp 0.7 --top-p 0.9
  bench lb-p9-lp5 $l -p 128 -n 32 --reps 2 --batch 64 --temp 0.7 --top-p 0.9 --logprobs 5
  FP4S_DEVICE_SAMPLE=0 bench lb-p9-lp5-host $l -p 128 -n 32 --reps 2 --batch 64 --temp 0.7 --top-p 0.9 --logprobs 5
  bench o-p9 $o -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9
  bench o-p9-lp5 $o -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9 --logprobs 5 ;;
# Phase v: the server, 64 clients at T 0.7 / top_p 0.9, 8 of them asking logprobs 5: on the
# device, then on the host (FP4S_DEVICE_SAMPLE=0); then greedy (never measured on the H200).
v)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  BD=/tmp/fs; B=$BD/fp4serve
  [ -x $B ] || bld $BD $L/build.log fp4serve
  [ -d /dev/shm/llama3-8b ] || $B gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen-l.log 2>&1
  serve lp8-dev 1 --temperature 0.7 --top-p 0.9 --logprobs 5 --logprobs-clients 8
  serve lp8-host 0 --temperature 0.7 --top-p 0.9 --logprobs 5 --logprobs-clients 8
  serve greedy 1 ;;
# Phase w: the sampler's fixed costs. Warp 0 takes the serial steps (the radix passes' digit
# select, samp_find's warp select, the block reductions: aeab24c, "A"), then the cluster
# exchanges double buffered, one cluster barrier each (a9563b7, "B", the tree as sent; A is B
# with dbuf.patch reversed, its sample_bench alone). sample_bench A and B, B's tests (with
# clusters, and one block a row on the 32000 cases), decode sampled.
w)
  setup
  rm -rf /tmp/srcA && mkdir -p /tmp/srcA && (cd $R && tar --exclude=./.gpu -cf - .) | tar -xf - -C /tmp/srcA &&
    (cd /tmp/srcA && patch -R -p1 < $R/bench/results/raw/2026-11-29s38/dbuf.patch > $L/patchA.log 2>&1) &&
    cmake -S /tmp/srcA -B /tmp/fsA -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DCMAKE_PREFIX_PATH=$R/.gpu/deps/root/usr > $L/buildA.log 2>&1 &&
    cmake --build /tmp/fsA -j16 --target sample_bench >> $L/buildA.log 2>&1; ts "build A rc=$?"
  for v in A B; do
    if [ $v = A ]; then sb=$(find /tmp/fsA -name sample_bench -type f | head -1); else sb=$(find $BD -name sample_bench -type f | head -1); fi
    $sb > $L/sample_bench-$v.txt 2>&1; ts "sample_bench $v rc=$?"
    grep -E "^(128256|201088) +(1|64) +flat|differing" $L/sample_bench-$v.txt >> $S
  done
  tt test_sample
  cp $L/t-test_sample.txt $L/t-test_sample-cluster.txt
  FP4S_SAMPLE_BLOCKS=1 tt test_sample V=32000
  TT=240 tt test_engine_cuda
  grep -E "sampled:" $L/t-test_engine_cuda.txt >> $S
  l=/dev/shm/llama3-8b; o=/dev/shm/gpt-oss-20b
  for rr in 1 2; do
    bench l-greedy-$rr $l -p 0 -n 128 --reps 3
    bench l-p9-$rr $l -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9
    bench o-p9-$rr $o -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9
  done
  bench l-t1 $l -p 0 -n 128 --reps 3 --temp 1.0
  bench l-p9-lp5 $l -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9 --logprobs 5
  bench o-greedy $o -p 0 -n 128 --reps 3
  bench lb-p9 $l -p 128 -n 32 --reps 2 --batch 64 --temp 0.7 --top-p 0.9 ;;
# Phase p: processed logprobs on the device too (tests now draw both modes), the kernel alone
# and decode against call w1, then the server with 8 of 64 clients asking logprobs 5 under
# --logprobs-mode processed_logprobs.
p)
  setup
  $(find $BD -name sample_bench -type f | head -1) > $L/sample_bench.txt 2>&1; ts "sample_bench rc=$?"
  grep -E "^(128256|201088) +(1|64) +flat|differing" $L/sample_bench.txt >> $S
  tt test_sample
  cp $L/t-test_sample.txt $L/t-test_sample-cluster.txt
  FP4S_SAMPLE_BLOCKS=1 tt test_sample V=32000
  TT=240 tt test_engine_cuda
  grep -E "sampled:" $L/t-test_engine_cuda.txt >> $S
  l=/dev/shm/llama3-8b; o=/dev/shm/gpt-oss-20b
  bench l-greedy $l -p 0 -n 128 --reps 3
  bench l-p9 $l -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9
  bench l-p9-lp5 $l -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9 --logprobs 5
  bench o-p9 $o -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9
  SARGS="--logprobs-mode processed_logprobs" serve lp8-proc 1 --temperature 0.7 --top-p 0.9 --logprobs 5 --logprobs-clients 8 ;;
# Phase c: clusters of 16 blocks a row (non-portable; the device's limit read at set-up) against 8
# (FP4S_SAMPLE_BLOCKS=8), the kernel alone for one row, decode sampled; the tests with 16.
c)
  setup
  sb=$(find $BD -name sample_bench -type f | head -1)
  for v in 8 16; do
    FP4S_SAMPLE_BLOCKS=$v $sb 1 > $L/sample_bench-$v.txt 2>&1; ts "sample_bench P=$v rc=$?"
    grep -E "flat|differing" $L/sample_bench-$v.txt >> $S
  done
  tt test_sample
  TT=240 tt test_engine_cuda
  grep -E "sampled:" $L/t-test_engine_cuda.txt | head -4 >> $S
  l=/dev/shm/llama3-8b; o=/dev/shm/gpt-oss-20b
  for rr in 1 2; do
    for v in 8 16; do
      FP4S_SAMPLE_BLOCKS=$v bench l-p9-P$v-$rr $l -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9
      FP4S_SAMPLE_BLOCKS=$v bench o-p9-P$v-$rr $o -p 0 -n 128 --reps 3 --temp 0.7 --top-p 0.9
    done
  done
  bench l-greedy $l -p 0 -n 128 --reps 3
  bench o-greedy $o -p 0 -n 128 --reps 3 ;;
# Phase n: perplexity scored on the device (nll.cu) against the host loop (FP4S_DEVICE_SAMPLE=0):
# test_engine_cuda's check, then `fp4serve perplexity` on llama3-8b over the repository's docs
# (8 KB for both paths, all of them on the device).
n)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  BD=/tmp/fs; B=$BD/fp4serve
  bld $BD $L/build.log fp4serve
  $B gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen-l.log 2>&1 &
  J=10 bld $BD $L/build-t.log test_engine_cuda
  wait
  TT=240 tt test_engine_cuda
  grep -E "perplexity:" $L/t-test_engine_cuda.txt >> $S
  cat $R/docs/*.md > /tmp/all.txt; head -c 8192 /tmp/all.txt > /tmp/small.txt
  for v in "dev-small 1 /tmp/small.txt" "host-small 0 /tmp/small.txt" "dev-all 1 /tmp/all.txt"; do set -- $v
    FP4S_DEVICE_SAMPLE=$2 $B perplexity -m /dev/shm/llama3-8b -f $3 --ctx 512 > $L/ppl-$1.txt 2>&1
    ts "perplexity $1 rc=$? $(tr '\n' ' ' < $L/ppl-$1.txt | grep -o 'perplexity: .*' | cut -c1-200)"
  done ;;
# Phase r: the review mend (host code only; the kernels' cubins are byte-identical): the sampler
# and perplexity ops now share one pinned staging. The engine test (sampling, logprobs,
# perplexity device against host) and test_sample's 32000 cases.
r)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  BD=/tmp/fs; B=$BD/fp4serve
  bld $BD $L/build-t.log test_engine_cuda test_sample
  TT=120 tt test_engine_cuda
  grep -E "sampled:|perplexity:" $L/t-test_engine_cuda.txt | head -8 >> $S
  TT=60 tt test_sample V=32000 ;;
pack) (cd $OUT && tar -czf run-${TAG:-x}.tgz logs && rm -rf logs) ;;
esac; done
