#!/usr/bin/env bash
# The next device runs (prepared in session 29, not run): two patches of this folder against main.
#   next-moe-lds.patch    moe_tma.cu's mt_consume loads the stage's codes and x by shared-space
#                         address (as gemv_tma.cu since 1418d10; its scales stay generic: with them
#                         too the kernel spills at its 96 registers). For gpt-oss.
#   next-gemv-step.patch  gemv_tma.cu's step loop with the per-step index arithmetic, the scale
#                         chunk select, the K-range test and the FP4S_GEMV_TMA_PROBE test moved to
#                         the stage (the loop carries only j); ptxas: 86 registers, no spills, the
#                         M = 16 kernel's 28-byte spill gone. For llama3-8b and qwen3-30b-a3b.
# Layout: .gpu/run.sh (this file), .gpu/treeA (main), .gpu/treeM (main + moe), .gpu/treeE (main +
# gemv-step), each with .deps/ (scripts/gpu-deps.sh), and .gpu/shared/realdata/stories260K. Then
#   cd .gpu && TAG=n1 timeout 560 bash run.sh t30; TAG=n1 bash run.sh pack     (builds, all tests)
#   cd .gpu && TAG=n2 timeout 560 bash run.sh b30; TAG=n2 bash run.sh pack     (benchmarks)
# (the second right after the first, while the machine is warm, finds the builds in /tmp).
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
G=$PWD; L=$OUT/logs; mkdir -p $L; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" >> $S; }
bld() { local s0=$(date +%s) src=$1 dir=$2 log=$3; shift 3
  cmake -S $src -B $dir -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$src/.deps/root/usr > $log 2>&1 &&
  cmake --build $dir -j${J:-8} --target "$@" >> $log 2>&1; ts "build $dir rc=$? $(( $(date +%s)-s0 )) s"; }
bench() { local lab=$1 bin=$2 m=$3; shift 3
  $bin/fp4serve bench -m $m "$@" > $L/b-$lab.txt 2>&1; ts "$lab $(grep -E '^(tg|pp)' $L/b-$lab.txt | tail -1)"; }
for ph in "$@"; do case $ph in
t30)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  J=4 bld $G/treeA /tmp/fA $L/build-A.log fp4serve stream_bench gemv_bench &
  J=6 bld $G/treeM /tmp/fM $L/build-M.log all &
  J=6 bld $G/treeE /tmp/fE $L/build-E.log all & wait
  (cd $G/treeE && timeout 330 ctest --test-dir /tmp/fE -L gpu -j3 --output-on-failure > $L/ctest-E.txt 2>&1; ts "ctest E rc=$?") &
  (cd $G/treeM && for t in test_moe_router test_gemv_experts test_engine_cuda; do timeout 150 /tmp/fM/tests/$t > $L/$t-M.txt 2>&1; ts "$t M rc=$? $(grep -E 'passed|failed' $L/$t-M.txt | tail -1)"; done
   timeout 120 ctest --test-dir /tmp/fM -R test_golden_cuda > $L/golden-M.txt 2>&1; ts "golden M rc=$?") & wait
  grep -E "tests passed|Failed|\*\*\*" $L/ctest-E.txt >> $S ;;
b30)
  for v in A E; do timeout 60 /tmp/f$v/dev/stream_bench > $L/stream-$v.txt 2>&1; ts "stream $v: $(grep fit $L/stream-$v.txt)"; done
  for v in A M; do FP4S_BENCH_EXPERTS=1 timeout 60 /tmp/f$v/dev/stream_bench > $L/stream-experts-$v.txt 2>&1; ts "stream experts $v rc=$?"; done
  for p in "llama3-8b nvfp4" "qwen3-30b-a3b nvfp4" "gpt-oss-20b mxfp4"; do set -- $p; /tmp/fA/fp4serve gen --preset $1 --format $2 /dev/shm/$1 > $L/gen-$1.log 2>&1; done
  for rr in 1 2; do
    for v in A E; do for m in llama3-8b qwen3-30b-a3b; do
      bench $m-$v-$rr /tmp/f$v /dev/shm/$m -p 0 -n 128 --reps 3; bench $m-d-$v-$rr /tmp/f$v /dev/shm/$m -p 0 --ctx 4096 -n 64 --reps 2; done; done
    for v in A M; do
      bench go-$v-$rr /tmp/f$v /dev/shm/gpt-oss-20b -p 0 -n 128 --reps 3; bench go-d-$v-$rr /tmp/f$v /dev/shm/gpt-oss-20b -p 0 --ctx 4096 -n 64 --reps 2; done
  done ;;
pack) (cd $OUT && tar -czf run-${TAG:-x}.tgz logs && rm -rf logs) ;;
esac; done
