#!/usr/bin/env bash
# The next device runs (prepared in session 30, not run): next-imad.patch and next-defer.patch of this
# folder, each against main.
#   next-imad.patch  gemv_tma.cu's and moe_tma.cu's consumers decode the E2M1 pairs with their left
#                    shifts as multiplies by run-time powers of two (gm_pair_m; 2 and 8 read from
#                    shared memory, so ptxas cannot turn them back into SHF): every left shift an
#                    IMAD on the FMA pipe. Step loop (opcode counts of the cubins, M = 1): SHF
#                    25 -> 9, IMAD by register 0 -> 32; registers as main (gemv_tma 84-96,
#                    moe_tma 96), no spills; gemv_mma.cu's kernels byte for byte the same.
#   next-defer.patch gemv_tma.cu's tile end without the block barrier: each warp writes tile n's
#                    partials, arrives on an mbarrier (rfull) and sums tile n - 1's, whose
#                    partials are then almost always complete; tile n + 1's writes wait on rfree.
#                    Same sums in the same order (bit for bit); one call site for the sums
#                    (+1.4-1.7 KB a kernel); registers 84-96, no spills.
# Layout: .gpu/run.sh (this file), .gpu/treeA (main), .gpu/treeI (main + next-imad.patch), .gpu/treeF
# (main + next-defer.patch), .gpu/deps
# (scripts/gpu-deps.sh), .gpu/shared/realdata/stories260K. Then
#   cd .gpu && TAG=i1 timeout 560 bash run.sh b; TAG=i1 bash run.sh pack   (builds, stream, benches)
#   cd .gpu && TAG=i2 T=I timeout 560 bash run.sh t; TAG=i2 bash run.sh pack   (I's GPU tests, gemv table;
#   then T=F for F's, in a call of its own)
# (the second right after the first, while the machine is warm, finds the builds in /tmp).
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
G=$PWD; L=$OUT/logs; mkdir -p $L; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" >> $S; }
bld() { local s0=$(date +%s) src=$1 dir=$2 log=$3; shift 3
  [ -x $dir/fp4serve ] && { ts "build $dir: kept"; return; }
  cmake -S $src -B $dir -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$G/deps/root/usr > $log 2>&1 &&
  cmake --build $dir -j${J:-8} --target "$@" >> $log 2>&1; ts "build $dir rc=$? $(( $(date +%s)-s0 )) s"; }
bench() { local lab=$1 bin=$2 m=$3; shift 3
  $bin/fp4serve bench -m $m "$@" > $L/b-$lab.txt 2>&1; ts "$lab $(grep -E '^(tg|pp)' $L/b-$lab.txt | tail -1)"; }
gen() { [ -d /dev/shm/$1 ] || /tmp/fA/fp4serve gen --preset $1 --format $2 /dev/shm/$1 > $L/gen-$1.log 2>&1; }
for ph in "$@"; do case $ph in
b)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  J=4 bld $G/treeA /tmp/fA $L/build-A.log fp4serve stream_bench & J=6 bld $G/treeI /tmp/fI $L/build-I.log all &
  J=6 bld $G/treeF /tmp/fF $L/build-F.log all & wait
  for v in A I F; do timeout 60 /tmp/f$v/dev/stream_bench > $L/stream-$v.txt 2>&1; ts "stream $v: $(grep fit $L/stream-$v.txt)"; done
  gen llama3-8b nvfp4; gen qwen3-30b-a3b nvfp4; gen gpt-oss-20b mxfp4
  for rr in 1 2; do for v in A I F; do for m in llama3-8b qwen3-30b-a3b gpt-oss-20b; do
    bench $m-$v-$rr /tmp/f$v /dev/shm/$m -p 0 -n 128 --reps 3; bench $m-d-$v-$rr /tmp/f$v /dev/shm/$m -p 0 --ctx 4096 -n 64 --reps 2
  done; done; done ;;
t)
  T=${T:-I}
  (cd $G/tree$T && timeout 420 ctest --test-dir /tmp/f$T -L gpu -j4 --output-on-failure > $L/ctest-$T.txt 2>&1; ts "ctest $T rc=$?")
  grep -E "tests passed|Failed|\*\*\*|Passed|Timeout" $L/ctest-$T.txt >> $S
  timeout 120 /tmp/f$T/dev/gemv_bench quick > $L/gemv-$T.txt 2>&1; ts "gemv_bench $T rc=$?"; tail -22 $L/gemv-$T.txt >> $S ;;
pack) (cd $OUT && tar -czf run-${TAG:-x}.tgz logs && rm -rf logs) ;;
esac; done
