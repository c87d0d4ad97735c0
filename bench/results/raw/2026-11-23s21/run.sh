#!/usr/bin/env bash
# device runs (git-ignored): cd .gpu && TAG=x bash run.sh PHASE...
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
G=$PWD; L=$OUT/logs; mkdir -p $L
A=/tmp/fa; B=/tmp/fb
build() { # src dir, build dir, log
  cmake -S $1 -B $2 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$1/.deps/root/usr > $3 2>&1 && cmake --build $2 -j16 >> $3 2>&1; echo "build $1 rc=$?" | tee -a $L/builds.txt; }
gen() { [ -d /tmp/$1 ] || { s=$(date +%s); $A/fp4serve gen --preset $2 --format nvfp4 /tmp/$1 > $L/gen-$1.log 2>&1; echo "gen $1 $(( $(date +%s)-s )) s rc=$?" >> $L/gens.txt; }; }
bench() { # label bin model args... (env via E=)
  local lab=$1 bin=$2 m=$3; shift 3
  echo "== $lab $* ${E:-}" >> $L/e2e.txt
  env ${E:-X=1} $bin/fp4serve bench -m /tmp/$m "$@" > $L/b-$lab.txt 2>&1; grep -E "^(tg|pp)" $L/b-$lab.txt >> $L/e2e.txt || tail -3 $L/b-$lab.txt >> $L/e2e.txt; }
pack() { (cd $OUT && tar -czf run-${TAG:-x}.tgz logs && rm -rf logs); }
for ph in "$@"; do case $ph in
build)
  nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $L/gpu.txt
  cat $G/tree/COMMIT > $L/commit.txt
  if [ "${REBUILD:-1}" = 1 ]; then build $G/tree $A $L/build.log & [ -d $G/treeB ] && build $G/treeB $B $L/build-b.log & wait; fi ;;
tests)
  cd $G/tree
  FP4S_TEST_VERBOSE=1 $A/tests/test_moe_router > $L/test_moe_router.txt 2>&1; echo "moe_router rc=$?" >> $L/tests.txt
  FP4S_TEST_VERBOSE=1 $A/tests/test_gemv LINK > $L/test_gemv-link.txt 2>&1; echo "gemv LINK rc=$?" >> $L/tests.txt
  $A/tests/test_gemv_experts > $L/test_gemv_experts.txt 2>&1; echo "gemv_experts rc=$?" >> $L/tests.txt
  $A/tests/test_engine_cuda > $L/test_engine_cuda.txt 2>&1; echo "engine_cuda rc=$?" >> $L/tests.txt
  FP4S_PRESTAGE=0 $A/tests/test_engine_cuda > $L/test_engine_cuda-off.txt 2>&1; echo "engine_cuda off rc=$?" >> $L/tests.txt
  $A/tests/test_golden > $L/test_golden.txt 2>&1; echo "golden rc=$?" >> $L/tests.txt
  for f in $L/test_*.txt; do echo "$f: $(grep -E 'passed|failed|FAIL' $f | tail -2 | tr '\n' ' ')" >> $L/tests.txt; done
  cd $G ;;
gens) gen qw "qwen3-30b-a3b"; gen ll "llama3-8b" ;;
ab)
  for r in 1 2; do
    bench qw-on$r $A qw -p 0 -n 128 --reps 3
    E=FP4S_PRESTAGE=0 bench qw-off$r $A qw -p 0 -n 128 --reps 3
    [ -d $B ] && bench qw-B$r $B qw -p 0 -n 128 --reps 3
  done
  bench qw-on-d $A qw -p 0 --ctx 4096 -n 64 --reps 2
  E=FP4S_PRESTAGE=0 bench qw-off-d $A qw -p 0 --ctx 4096 -n 64 --reps 2
  [ -d $B ] && bench qw-B-d $B qw -p 0 --ctx 4096 -n 64 --reps 2
  bench ll-on $A ll -p 0 -n 128 --reps 3
  [ -d $B ] && bench ll-B $B ll -p 0 -n 128 --reps 3 ;;
variants)
  mkdir -p /tmp/vA && cp $A/fp4serve /tmp/vA/
  cd $G/tree && mkdir -p /tmp/orig && cp src/backend/cuda/moe.cu src/backend/cuda/cuda_moe.cu src/backend/cuda/gemv_tma.cu src/backend/cuda/gemv_mma.cuh /tmp/orig/
  cp $G/v1/moe.cu $G/v1/cuda_moe.cu src/backend/cuda/ && cmake --build $A -j16 --target fp4serve > $L/build-v1.log 2>&1; echo "v1 rc=$?" >> $L/builds.txt; mkdir -p /tmp/v1 && cp $A/fp4serve /tmp/v1/
  cp /tmp/orig/moe.cu /tmp/orig/cuda_moe.cu src/backend/cuda/ && cp $G/v2/gemv_tma.cu $G/v2/gemv_mma.cuh src/backend/cuda/ && cmake --build $A -j16 --target fp4serve > $L/build-v2.log 2>&1; echo "v2 rc=$?" >> $L/builds.txt; mkdir -p /tmp/v2 && cp $A/fp4serve /tmp/v2/
  cp /tmp/orig/* src/backend/cuda/; cd $G ;;
vab)
  for r in 1 2; do
    bench qw-on$r /tmp/vA qw -p 0 -n 128 --reps 3
    E=FP4S_PRESTAGE=0 bench qw-off$r /tmp/vA qw -p 0 -n 128 --reps 3
    E=FP4S_PRESTAGE=0 bench qw-v1off$r /tmp/v1 qw -p 0 -n 128 --reps 3
    bench qw-v1on$r /tmp/v1 qw -p 0 -n 128 --reps 3
    E=FP4S_PRESTAGE=0 bench qw-v2off$r /tmp/v2 qw -p 0 -n 128 --reps 3
    bench qw-B$r $B qw -p 0 -n 128 --reps 3
  done
  bench qw-on-d /tmp/vA qw -p 0 --ctx 4096 -n 64 --reps 2
  E=FP4S_PRESTAGE=0 bench qw-off-d /tmp/vA qw -p 0 --ctx 4096 -n 64 --reps 2
  bench qw-B-d $B qw -p 0 --ctx 4096 -n 64 --reps 2
  bench ll-on /tmp/vA ll -p 0 -n 128 --reps 3
  bench ll-B $B ll -p 0 -n 128 --reps 3 ;;
qtests)
  cd $G/tree
  FP4S_TEST_VERBOSE=1 $A/tests/test_moe_router LINK > $L/test_moe_router-link.txt 2>&1; echo "moe_router LINK rc=$?" >> $L/tests.txt
  FP4S_TEST_VERBOSE=1 $A/tests/test_moe_router Q=1024 > $L/q1024.txt 2>&1; echo "Q=1024 alone rc=$?" >> $L/tests.txt
  FP4S_GEMV_TMA=0 FP4S_TEST_VERBOSE=1 $A/tests/test_moe_router Q=1024 > $L/q1024-notma.txt 2>&1; echo "Q=1024 no tma rc=$?" >> $L/tests.txt
  FP4S_TEST_VERBOSE=1 $A/tests/test_gemv LINK > $L/test_gemv-link.txt 2>&1; echo "gemv LINK rc=$?" >> $L/tests.txt
  for f in $L/test_*.txt $L/q1024*.txt; do echo "$f: $(grep -E 'passed|failed|FAIL|part from' $f | tail -3 | tr '\n' ' ')" >> $L/tests.txt; done
  cd $G ;;
final)
  cd $G/tree
  FP4S_TEST_VERBOSE=1 $B/tests/test_moe_router LINK > $L/branch-moe-link.txt 2>&1; echo "branch moe_router LINK rc=$?" >> $L/tests.txt
  FP4S_GEMV_TMA=0 FP4S_TEST_VERBOSE=1 $B/tests/test_moe_router Q=1024 > $L/branch-q1024-notma.txt 2>&1; echo "branch Q=1024 no tma rc=$?" >> $L/tests.txt
  $A/tests/test_gemv > $L/test_gemv.txt 2>&1; echo "main gemv rc=$?" >> $L/tests.txt
  $A/tests/test_moe_router > $L/test_moe_router.txt 2>&1; echo "main moe_router rc=$?" >> $L/tests.txt
  for f in $L/test_*.txt $L/branch*.txt; do echo "$f: $(grep -E 'passed|failed|FAIL|part from' $f | tail -3 | tr '\n' ' ')" >> $L/tests.txt; done
  cd $G
  gen qw "qwen3-30b-a3b"; gen ll "llama3-8b"
  bench qw $A qw -p 0 -n 128 --reps 3
  bench qw-d $A qw -p 0 --ctx 4096 -n 64 --reps 2
  bench ll $A ll -p 0 -n 128 --reps 3
  bench ll-d $A ll -p 0 --ctx 4096 -n 64 --reps 2 ;;
fix)
  cd $G/tree
  FP4S_TEST_VERBOSE=1 $A/tests/test_moe_router > $L/test_moe_router.txt 2>&1; echo "moe_router rc=$?" >> $L/tests.txt
  $A/tests/test_engine_cuda > $L/test_engine_cuda.txt 2>&1; echo "engine_cuda rc=$?" >> $L/tests.txt
  $A/tests/test_gemv_experts > $L/test_gemv_experts.txt 2>&1; echo "gemv_experts rc=$?" >> $L/tests.txt
  for f in $L/test_*.txt; do echo "$f: $(grep -E 'passed|failed|FAIL' $f | tail -2 | tr '\n' ' ')" >> $L/tests.txt; done
  grep UPLOAD $L/test_moe_router.txt >> $L/tests.txt; cd $G ;;
suite) cd $G/tree && ctest --test-dir $A -L gpu --output-on-failure > $L/ctest-gpu.txt 2>&1; echo "ctest gpu rc=$?" >> $L/tests.txt; tail -5 $L/ctest-gpu.txt; cd $G ;;
pack) pack ;;
esac; done
cat $L/builds.txt $L/tests.txt $L/gens.txt $L/e2e.txt 2>/dev/null
