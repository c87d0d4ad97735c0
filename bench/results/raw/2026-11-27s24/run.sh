#!/usr/bin/env bash
# device runs (git-ignored): cd .gpu && TAG=x bash run.sh PHASE...
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
G=$PWD; L=$OUT/logs; mkdir -p $L
A=/tmp/fa; B=/tmp/fb
build() { # src dir, build dir, log
  cmake -S $1 -B $2 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$1/.deps/root/usr > $3 2>&1 && cmake --build $2 -j16 >> $3 2>&1; echo "build $1 rc=$?" | tee -a $L/builds.txt; }
gen() { [ -d /tmp/$1 ] || { s=$(date +%s); $A/fp4serve gen --preset $2 --format ${3:-nvfp4} /tmp/$1 > $L/gen-$1.log 2>&1; echo "gen $1 $(( $(date +%s)-s )) s rc=$?" >> $L/gens.txt; }; }
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
  s=$(date +%s); $A/tests/test_attention > $L/test_attention.txt 2>&1; echo "attention rc=$? $(( $(date +%s)-s )) s" >> $L/tests.txt
  s=$(date +%s); $A/tests/test_engine_cuda > $L/test_engine_cuda.txt 2>&1; echo "engine_cuda rc=$? $(( $(date +%s)-s )) s" >> $L/tests.txt
  FP4S_TEST_VERBOSE=1 $A/tests/test_gemv LINK > $L/test_gemv-link.txt 2>&1; echo "gemv LINK rc=$?" >> $L/tests.txt
  for f in $L/test_*.txt; do echo "$f: $(grep -E 'passed|failed|FAIL|staged' $f | tail -3 | tr '\n' ' ')" >> $L/tests.txt; done
  cd $G ;;
gens) gen qw "qwen3-30b-a3b"; gen ll "llama3-8b" ;;
gengo) gen go "gpt-oss-20b" mxfp4 ;;
ab)
  for r in 1 2; do
    bench qw-A$r $A qw -p 0 -n 128 --reps 3
    bench qw-B$r $B qw -p 0 -n 128 --reps 3
    bench ll-A$r $A ll -p 0 -n 128 --reps 3
    bench ll-B$r $B ll -p 0 -n 128 --reps 3
  done ;;
abd)
  for r in 1 2; do
    bench qw-Ad$r $A qw -p 0 --ctx 4096 -n 64 --reps 2
    bench qw-Bd$r $B qw -p 0 --ctx 4096 -n 64 --reps 2
    bench ll-Ad$r $A ll -p 0 --ctx 4096 -n 64 --reps 2
    bench ll-Bd$r $B ll -p 0 --ctx 4096 -n 64 --reps 2
  done ;;
abgo)
  bench go-A $A go -p 0 -n 128 --reps 3
  bench go-B $B go -p 0 -n 128 --reps 3
  bench go-Ad $A go -p 0 --ctx 4096 -n 64 --reps 2
  bench go-Bd $B go -p 0 --ctx 4096 -n 64 --reps 2 ;;
buildA) build $G/tree $A $L/build.log ;;
wv)
  for r in 1 2; do
    for v in "X=1" "FP4S_ATTN_WARPS=4" "FP4S_ATTN_WARPS=4 FP4S_ATTN_BPS=2" "FP4S_ATTN_WARPS=8 FP4S_ATTN_BPS=2"; do
      E="$v" bench "qwd-$r-${v// /_}" $A qw -p 0 --ctx 4096 -n 64 --reps 2
      E="$v" bench "lld-$r-${v// /_}" $A ll -p 0 --ctx 4096 -n 64 --reps 2
    done
  done
  for v in "X=1" "FP4S_ATTN_WARPS=4" "FP4S_ATTN_WARPS=4 FP4S_ATTN_BPS=2"; do
    E="$v" bench "qw-${v// /_}" $A qw -p 0 -n 128 --reps 3
    E="$v" bench "ll-${v// /_}" $A ll -p 0 -n 128 --reps 3
  done ;;
env2)
  for r in 1 2; do
    for v in "X=1" "FP4S_ATTN_TRIGGER=0" "FP4S_GEMV_TMA_PRE=2"; do
      E="$v" bench "qwd-$r-${v// /_}" $A qw -p 0 --ctx 4096 -n 64 --reps 2
      E="$v" bench "lld-$r-${v// /_}" $A ll -p 0 --ctx 4096 -n 64 --reps 2
    done
    bench "qwd-$r-fp8" $A qw -p 0 --ctx 4096 -n 64 --reps 2 --kv-cache-dtype fp8
    bench "lld-$r-fp8" $A ll -p 0 --ctx 4096 -n 64 --reps 2 --kv-cache-dtype fp8
  done
  bench "god" $A go -p 0 --ctx 4096 -n 64 --reps 2
  bench "god-fp8" $A go -p 0 --ctx 4096 -n 64 --reps 2 --kv-cache-dtype fp8
  bench "go" $A go -p 0 -n 128 --reps 3 ;;
env3)
  for r in 1 2; do
    for v in "X=1" "FP4S_MOE_ONE=3" "FP4S_MOE_ONE=1" "FP4S_ATTN_STAGES=3"; do
      E="$v" bench "qwd-$r-${v// /_}" $A qw -p 0 --ctx 4096 -n 64 --reps 2
      E="$v" bench "qw-$r-${v// /_}" $A qw -p 0 -n 128 --reps 3
    done
    for v in "X=1" "FP4S_ATTN_STAGES=3" "FP4S_ATTN_STAGES=3 FP4S_ATTN_BPS=2"; do
      E="$v" bench "lld-$r-${v// /_}" $A ll -p 0 --ctx 4096 -n 64 --reps 2
    done
  done ;;
abm)
  for r in 1 2; do
    bench qwd-A$r $A qw -p 0 --ctx 4096 -n 64 --reps 2
    bench qwd-B$r $B qw -p 0 --ctx 4096 -n 64 --reps 2
    bench lld-A$r $A ll -p 0 --ctx 4096 -n 64 --reps 2
    bench lld-B$r $B ll -p 0 --ctx 4096 -n 64 --reps 2
    bench god-A$r $A go -p 0 --ctx 4096 -n 64 --reps 2
    bench god-B$r $B go -p 0 --ctx 4096 -n 64 --reps 2
  done
  bench qw-A $A qw -p 0 -n 128 --reps 3
  bench qw-B $B qw -p 0 -n 128 --reps 3
  bench ll-A $A ll -p 0 -n 128 --reps 3
  bench ll-B $B ll -p 0 -n 128 --reps 3 ;;
final)
  cd $G/tree
  ( s=$(date +%s); $A/tests/test_attention > $L/test_attention.txt 2>&1; echo "attention rc=$? $(( $(date +%s)-s )) s" >> $L/tests.txt ) &
  cd $G; gen qw "qwen3-30b-a3b"; gen ll "llama3-8b"; gen go "gpt-oss-20b" mxfp4; wait
  cd $G/tree; $A/tests/test_engine_cuda > $L/test_engine_cuda.txt 2>&1; echo "engine_cuda rc=$?" >> $L/tests.txt
  for f in $L/test_*.txt; do echo "$f: $(grep -E 'passed|failed|FAIL' $f | tail -2 | tr '\n' ' ')" >> $L/tests.txt; done
  cd $G
  for x in A B; do eval d=\$$x; bench qwd-$x $d qw -p 0 --ctx 4096 -n 64 --reps 2; bench lld-$x $d ll -p 0 --ctx 4096 -n 64 --reps 2; bench god-$x $d go -p 0 --ctx 4096 -n 64 --reps 2; done
  bench go-A $A go -p 0 -n 128 --reps 3; bench go-B $B go -p 0 -n 128 --reps 3 ;;
abx)
  cd $G/tree
  ( s=$(date +%s); $A/tests/test_gemv > $L/test_gemv.txt 2>&1; echo "gemv rc=$? $(( $(date +%s)-s )) s" >> $L/tests.txt
    $A/tests/test_gemv_experts > $L/test_gemv_experts.txt 2>&1; echo "gemv_experts rc=$?" >> $L/tests.txt
    $A/tests/test_moe_router > $L/test_moe_router.txt 2>&1; echo "moe_router rc=$?" >> $L/tests.txt ) &
  cd $G; gen qw "qwen3-30b-a3b"; gen ll "llama3-8b"; wait
  cd $G/tree; $A/tests/test_engine_cuda > $L/test_engine_cuda.txt 2>&1; echo "engine_cuda rc=$?" >> $L/tests.txt
  for f in $L/test_*.txt; do echo "$f: $(grep -E 'passed|failed|FAIL' $f | tail -2 | tr '\n' ' ')" >> $L/tests.txt; done
  cd $G
  for r in 1 2; do
    bench qw-A$r $A qw -p 0 -n 128 --reps 3; bench qw-B$r $B qw -p 0 -n 128 --reps 3
    bench ll-A$r $A ll -p 0 -n 128 --reps 3; bench ll-B$r $B ll -p 0 -n 128 --reps 3
    bench qwd-A$r $A qw -p 0 --ctx 4096 -n 64 --reps 2; bench qwd-B$r $B qw -p 0 --ctx 4096 -n 64 --reps 2
    bench lld-A$r $A ll -p 0 --ctx 4096 -n 64 --reps 2; bench lld-B$r $B ll -p 0 --ctx 4096 -n 64 --reps 2
  done ;;
tl)
  tlb() { cmake -S $G/tree -B $1 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$G/tree/.deps/root/usr "-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL $2" > $L/build-$(basename $1).log 2>&1 && cmake --build $1 -j8 --target fp4serve >> $L/build-$(basename $1).log 2>&1; echo "tl build $1 rc=$?" >> $L/builds.txt; }
  tlb /tmp/tlA "" & tlb /tmp/tlB "-DATT_MERGE_CP=0" & wait
  cd $G; A=/tmp/tlA; gen qw "qwen3-30b-a3b"; gen ll "llama3-8b"; gen go "gpt-oss-20b" mxfp4; A=/tmp/fa
  for m in qw ll go; do [ -d /tmp/$m ] || continue; for v in A B; do
    FP4S_TL=$L/tl-$m-$v.txt /tmp/tl$v/fp4serve bench -m /tmp/$m -p 0 --ctx 4096 -n 64 --reps 1 > $L/tlbench-$m-$v.txt 2>&1
    (cd $G/tree/dev && python3 attn_marks.py $L/tl-$m-$v.txt > $L/attn-$m-$v.txt 2>&1; python3 timeline.py $L/tl-$m-$v.txt > $L/tlsum-$m-$v.txt 2>&1)
    echo "== $m $v"; cat $L/attn-$m-$v.txt; rm -f $L/tl-$m-$v.txt
  done; done ;;
suite) cd $G/tree && ctest --test-dir $A -L gpu --output-on-failure > $L/ctest-gpu.txt 2>&1; echo "ctest gpu rc=$?" >> $L/tests.txt; tail -5 $L/ctest-gpu.txt; cd $G ;;
s23)
  cd $G/tree
  ( s=$(date +%s); FP4S_TEST_VERBOSE=1 $A/tests/test_moe_router > $L/test_moe_router.txt 2>&1; echo "moe_router rc=$? $(( $(date +%s)-s )) s" >> $L/tests.txt
    s=$(date +%s); $A/tests/test_engine_cuda > $L/test_engine_cuda.txt 2>&1; echo "engine_cuda rc=$? $(( $(date +%s)-s )) s" >> $L/tests.txt ) &
  cd $G; gen go "gpt-oss-20b" mxfp4; gen ll "llama3-8b"; wait
  cd $G/tree; for f in $L/test_*.txt; do echo "$f: $(grep -E 'passed|failed|FAIL' $f | tail -3 | tr '\n' ' ')" >> $L/tests.txt; done; cd $G
  for r in 1 2; do
    bench go-A$r $A go -p 0 -n 128 --reps 3; bench go-B$r $B go -p 0 -n 128 --reps 3
    E="FP4S_MOE_LOCAL=0" bench go-A0$r $A go -p 0 -n 128 --reps 3
    bench god-A$r $A go -p 0 --ctx 4096 -n 64 --reps 2; bench god-B$r $B go -p 0 --ctx 4096 -n 64 --reps 2
  done
  bench ll-A $A ll -p 0 -n 128 --reps 3; bench ll-B $B ll -p 0 -n 128 --reps 3 ;;
tl2)
  tlb2() { cmake -S $2 -B $1 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$2/.deps/root/usr "-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" > $L/build-$(basename $1).log 2>&1 && cmake --build $1 -j8 --target fp4serve >> $L/build-$(basename $1).log 2>&1; echo "tl build $1 rc=$?" >> $L/builds.txt; }
  tlb2 /tmp/tlA $G/tree & tlb2 /tmp/tlB $G/treeB & wait
  gen go "gpt-oss-20b" mxfp4
  for v in A B A0; do b=/tmp/tl${v:0:1}; ev=X=1; [ $v = A0 ] && ev=FP4S_MOE_LOCAL=0
    env $ev FP4S_TL=$L/tl-go-$v.txt $b/fp4serve bench -m /tmp/go -p 0 --ctx 4096 -n 64 --reps 1 > $L/tlbench-go-$v.txt 2>&1
    (cd $G/tree/dev && python3 timeline.py $L/tl-go-$v.txt > $L/tlsum-go-$v.txt 2>&1; python3 moe_marks.py $L/tl-go-$v.txt > $L/moe-go-$v.txt 2>&1)
    echo "== $v"; grep -A8 "per position" $L/tlsum-go-$v.txt | head -9; head -30 $L/moe-go-$v.txt; rm -f $L/tl-go-$v.txt
  done ;;
w23)
  gen go "gpt-oss-20b" mxfp4
  for r in 1 2; do
    bench go-A$r $A go -p 0 -n 128 --reps 3; E="FP4S_ROUTE_WARM=0" bench go-Aw$r $A go -p 0 -n 128 --reps 3; bench go-B$r $B go -p 0 -n 128 --reps 3
    bench god-A$r $A go -p 0 --ctx 4096 -n 64 --reps 2; E="FP4S_ROUTE_WARM=0" bench god-Aw$r $A go -p 0 --ctx 4096 -n 64 --reps 2; bench god-B$r $B go -p 0 --ctx 4096 -n 64 --reps 2
  done ;;
v23)
  cd $G/tree
  ( s=$(date +%s); FP4S_TEST_VERBOSE=1 $A/tests/test_moe_router > $L/test_moe_router.txt 2>&1; echo "moe_router rc=$? $(( $(date +%s)-s )) s" >> $L/tests.txt
    s=$(date +%s); $A/tests/test_engine_cuda > $L/test_engine_cuda.txt 2>&1; echo "engine_cuda rc=$? $(( $(date +%s)-s )) s" >> $L/tests.txt ) &
  cd $G; gen go "gpt-oss-20b" mxfp4; gen ll "llama3-8b"; gen qw "qwen3-30b-a3b"; wait
  cd $G/tree; for f in $L/test_*.txt; do echo "$f: $(grep -E 'passed|failed|FAIL' $f | tail -3 | tr '\n' ' ')" >> $L/tests.txt; done; cd $G
  for r in 1 2; do
    bench go-A$r $A go -p 0 -n 128 --reps 3; bench go-B$r $B go -p 0 -n 128 --reps 3
    E="FP4S_MOE_LOCAL=0" bench go-A0$r $A go -p 0 -n 128 --reps 3
    bench god-A$r $A go -p 0 --ctx 4096 -n 64 --reps 2; bench god-B$r $B go -p 0 --ctx 4096 -n 64 --reps 2
  done
  bench ll-A $A ll -p 0 -n 128 --reps 3; bench ll-B $B ll -p 0 -n 128 --reps 3
  bench qw-A $A qw -p 0 -n 128 --reps 3; bench qw-B $B qw -p 0 -n 128 --reps 3
  cd $G/tree; s=$(date +%s); timeout 100 $A/tests/test_gemv > $L/test_gemv.txt 2>&1; echo "gemv rc=$? $(( $(date +%s)-s )) s $(grep -E 'passed|failed' $L/test_gemv.txt | tail -1)" >> $L/tests.txt; cd $G ;;
fin)
  S=$OUT/sum.txt
  cd $G/tree
  ( s=$(date +%s); $A/tests/test_moe_router > $L/test_moe_router.txt 2>&1; echo "moe_router rc=$? $(( $(date +%s)-s )) s $(grep -E 'passed|failed' $L/test_moe_router.txt | tail -1)" >> $S
    s=$(date +%s); $A/tests/test_engine_cuda > $L/test_engine_cuda.txt 2>&1; echo "engine_cuda rc=$? $(( $(date +%s)-s )) s $(grep -E 'passed|failed' $L/test_engine_cuda.txt | tail -1)" >> $S ) &
  cd $G; gen go "gpt-oss-20b" mxfp4; wait
  bench go-A $A go -p 0 -n 128 --reps 3; tail -1 $L/e2e.txt >> $S
  bench god-A $A go -p 0 --ctx 4096 -n 64 --reps 2; tail -1 $L/e2e.txt >> $S
  ;;
build2)
  nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/sum.txt; cat $G/tree/COMMIT >> $OUT/sum.txt
  s=$(date +%s); cmake -S $G/tree -B $A -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$G/tree/.deps/root/usr > $L/build.log 2>&1 && cmake --build $A -j16 --target fp4serve test_moe_router test_engine_cuda ${XT:-} >> $L/build.log 2>&1; echo "build rc=$? $(( $(date +%s)-s )) s" >> $OUT/sum.txt ;;
q24)
  S=$OUT/sum.txt
  cd $G/tree
  ( s=$(date +%s); FP4S_TEST_VERBOSE=1 $A/tests/test_moe_router > $L/test_moe_router.txt 2>&1; echo "moe_router rc=$? $(( $(date +%s)-s )) s $(grep -E 'passed|failed' $L/test_moe_router.txt | tail -1)" >> $S
    $A/tests/test_engine_cuda > $L/test_engine_cuda.txt 2>&1; echo "engine_cuda rc=$? $(grep -E 'passed|failed' $L/test_engine_cuda.txt | tail -1)" >> $S
    FP4S_MOE_LOCAL=2 $A/tests/test_engine_cuda > $L/test_engine_cuda2.txt 2>&1; echo "engine_cuda LOCAL=2 rc=$? $(grep -E 'passed|failed' $L/test_engine_cuda2.txt | tail -1)" >> $S ) &
  cd $G; gen qw "qwen3-30b-a3b"; wait
  for r in 1 2; do
    bench qw-A$r $A qw -p 0 -n 128 --reps 3; tail -1 $L/e2e.txt >> $S
    E="FP4S_MOE_LOCAL=2" bench qw-L$r $A qw -p 0 -n 128 --reps 3; tail -1 $L/e2e.txt >> $S
    bench qwd-A$r $A qw -p 0 --ctx 4096 -n 64 --reps 2; tail -1 $L/e2e.txt >> $S
    E="FP4S_MOE_LOCAL=2" bench qwd-L$r $A qw -p 0 --ctx 4096 -n 64 --reps 2; tail -1 $L/e2e.txt >> $S
  done ;;
o120)
  S=$OUT/sum.txt
  rm -rf /tmp/qw /tmp/ll /tmp/go; df -h /tmp /dev/shm >> $S
  s=$(date +%s); [ -d /tmp/o120 ] || $A/fp4serve gen --preset gpt-oss-120b --format mxfp4 /tmp/o120 > $L/gen-o120.log 2>&1; echo "gen o120 rc=$? $(( $(date +%s)-s )) s" >> $S
  for r in 1 2; do
    bench o-A$r $A o120 -p 0 -n 128 --reps 3; tail -1 $L/e2e.txt >> $S
    E="FP4S_MOE_LOCAL=0" bench o-0$r $A o120 -p 0 -n 128 --reps 3; tail -1 $L/e2e.txt >> $S
  done
  bench od-A $A o120 -p 0 --ctx 4096 -n 64 --reps 2; tail -1 $L/e2e.txt >> $S
  E="FP4S_MOE_LOCAL=0" bench od-0 $A o120 -p 0 --ctx 4096 -n 64 --reps 2; tail -1 $L/e2e.txt >> $S ;;
t24)
  S=$OUT/sum.txt
  cd $G/tree
  ( s=$(date +%s); FP4S_TEST_VERBOSE=1 $A/tests/test_moe_router > $L/test_moe_router.txt 2>&1; echo "moe_router rc=$? $(( $(date +%s)-s )) s $(grep -E 'passed|failed' $L/test_moe_router.txt | tail -1)" >> $S
    $A/tests/test_engine_cuda > $L/test_engine_cuda.txt 2>&1; echo "engine_cuda rc=$? $(grep -E 'passed|failed' $L/test_engine_cuda.txt | tail -1)" >> $S
    FP4S_MOE_TAIL=0 $A/tests/test_engine_cuda > $L/test_engine_cuda0.txt 2>&1; echo "engine_cuda TAIL=0 rc=$? $(grep -E 'passed|failed' $L/test_engine_cuda0.txt | tail -1)" >> $S
    s=$(date +%s); timeout 200 ctest --test-dir $A -R test_golden_cuda --output-on-failure > $L/test_golden_cuda.txt 2>&1; echo "golden_cuda rc=$? $(( $(date +%s)-s )) s $(grep -E 'tests passed|Passed|Failed' $L/test_golden_cuda.txt | tail -2 | tr '\n' ' ')" >> $S ) &
  cd $G; gen qw "qwen3-30b-a3b"; wait
  for r in 1 2; do
    bench qw-A$r $A qw -p 0 -n 128 --reps 3; tail -1 $L/e2e.txt >> $S
    E="FP4S_MOE_TAIL=0" bench qw-T$r $A qw -p 0 -n 128 --reps 3; tail -1 $L/e2e.txt >> $S
    bench qwd-A$r $A qw -p 0 --ctx 4096 -n 64 --reps 2; tail -1 $L/e2e.txt >> $S
    E="FP4S_MOE_TAIL=0" bench qwd-T$r $A qw -p 0 --ctx 4096 -n 64 --reps 2; tail -1 $L/e2e.txt >> $S
  done ;;
tl24)
  S=$OUT/sum.txt
  s=$(date +%s); cmake -S $G/tree -B /tmp/tlA -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$G/tree/.deps/root/usr "-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" > $L/build-tl.log 2>&1 && cmake --build /tmp/tlA -j16 --target fp4serve >> $L/build-tl.log 2>&1; echo "tl build rc=$? $(( $(date +%s)-s )) s" >> $S
  gen qw "qwen3-30b-a3b"
  for v in 1 0; do
    env FP4S_MOE_TAIL=$v FP4S_TL=$L/tl-qw-$v.txt /tmp/tlA/fp4serve bench -m /tmp/qw -p 0 --ctx 4096 -n 64 --reps 1 > $L/tlbench-qw-$v.txt 2>&1
    (cd $G/tree/dev && python3 timeline.py $L/tl-qw-$v.txt > $L/tlsum-qw-$v.txt 2>&1)
    echo "== TAIL=$v" >> $S; grep -A12 "per position" $L/tlsum-qw-$v.txt >> $S; rm -f $L/tl-qw-$v.txt
  done ;;
w24)
  S=$OUT/sum.txt; cat $G/tree/COMMIT >> $S
  ( s=$(date +%s); cmake -S $G/tree -B $A -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$G/tree/.deps/root/usr > $L/build.log 2>&1 && cmake --build $A -j8 --target fp4serve test_moe_router >> $L/build.log 2>&1; echo "build rc=$? $(( $(date +%s)-s )) s" >> $S ) &
  ( s=$(date +%s); cmake -S $G/tree -B /tmp/tlA -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$G/tree/.deps/root/usr "-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" > $L/build-tl.log 2>&1 && cmake --build /tmp/tlA -j8 --target fp4serve >> $L/build-tl.log 2>&1; echo "tl build rc=$? $(( $(date +%s)-s )) s" >> $S ) &
  wait
  [ -d /tmp/qw ] || /tmp/tlA/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /tmp/qw > $L/gen-qw.log 2>&1
  cd $G/tree; $A/tests/test_moe_router TAIL > $L/test_moe_router.txt 2>&1; echo "moe_router TAIL rc=$? $(grep -E 'passed|failed' $L/test_moe_router.txt | tail -1)" >> $S; cd $G
  bench qw-A $A qw -p 0 -n 128 --reps 3; tail -1 $L/e2e.txt >> $S
  E="FP4S_MOE_TAIL=0" bench qw-T $A qw -p 0 -n 128 --reps 3; tail -1 $L/e2e.txt >> $S
  bench qwd-A $A qw -p 0 --ctx 4096 -n 64 --reps 2; tail -1 $L/e2e.txt >> $S
  E="FP4S_MOE_TAIL=0" bench qwd-T $A qw -p 0 --ctx 4096 -n 64 --reps 2; tail -1 $L/e2e.txt >> $S
  FP4S_TL=$L/tl-qw-1.txt /tmp/tlA/fp4serve bench -m /tmp/qw -p 0 --ctx 4096 -n 64 --reps 1 > $L/tlbench-qw-1.txt 2>&1
  (cd $G/tree/dev && python3 timeline.py $L/tl-qw-1.txt > $L/tlsum-qw-1.txt 2>&1); rm -f $L/tl-qw-1.txt
  grep -m1 -A9 "per position" $L/tlsum-qw-1.txt >> $S ;;
tlm24)
  S=$OUT/sum.txt; cat $G/tree/COMMIT >> $S
  s=$(date +%s); cmake -S $G/tree -B /tmp/tlA -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$G/tree/.deps/root/usr "-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" > $L/build-tl.log 2>&1 && cmake --build /tmp/tlA -j16 --target fp4serve >> $L/build-tl.log 2>&1; echo "tl build rc=$? $(( $(date +%s)-s )) s" >> $S
  [ -d /tmp/qw ] || /tmp/tlA/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /tmp/qw > $L/gen-qw.log 2>&1
  FP4S_TL=$L/tl-qw-1.txt /tmp/tlA/fp4serve bench -m /tmp/qw -p 0 --ctx 4096 -n 64 --reps 1 > $L/tlbench-qw-1.txt 2>&1
  (cd $G/tree/dev && python3 timeline.py $L/tl-qw-1.txt > $L/tlsum-qw-1.txt 2>&1; python3 router_marks.py $L/tl-qw-1.txt --kid 15 > $L/rmarks-qw-1.txt 2>&1)
  rm -f $L/tl-qw-1.txt
  grep -m1 -A9 "per position" $L/tlsum-qw-1.txt >> $S; cat $L/rmarks-qw-1.txt >> $S ;;
fx24)
  S=$OUT/sum.txt; cat $G/tree/COMMIT >> $S
  ( s=$(date +%s); cmake -S $G/tree -B $A -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$G/tree/.deps/root/usr > $L/build.log 2>&1 && cmake --build $A -j8 --target fp4serve test_moe_router >> $L/build.log 2>&1; echo "build rc=$? $(( $(date +%s)-s )) s" >> $S ) &
  ( s=$(date +%s); cmake -S $G/tree -B /tmp/tlA -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$G/tree/.deps/root/usr "-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" > $L/build-tl.log 2>&1 && cmake --build /tmp/tlA -j8 --target fp4serve >> $L/build-tl.log 2>&1; echo "tl build rc=$? $(( $(date +%s)-s )) s" >> $S ) &
  wait
  [ -d /tmp/qw ] || /tmp/tlA/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /tmp/qw > $L/gen-qw.log 2>&1
  cd $G/tree; $A/tests/test_moe_router TAIL > $L/test_moe_router.txt 2>&1; echo "moe_router TAIL rc=$? $(grep -E 'passed|failed' $L/test_moe_router.txt | tail -1)" >> $S; cd $G
  bench qw-A $A qw -p 0 -n 128 --reps 3; tail -1 $L/e2e.txt >> $S
  E="FP4S_MOE_TAIL=0" bench qw-T $A qw -p 0 -n 128 --reps 3; tail -1 $L/e2e.txt >> $S
  FP4S_TL=$L/tl-qw-1.txt /tmp/tlA/fp4serve bench -m /tmp/qw -p 0 --ctx 4096 -n 64 --reps 1 > $L/tlbench-qw-1.txt 2>&1
  (cd $G/tree/dev && python3 timeline.py $L/tl-qw-1.txt > $L/tlsum-qw-1.txt 2>&1; python3 router_marks.py $L/tl-qw-1.txt --kid 15 > $L/rmarks-qw-1.txt 2>&1)
  rm -f $L/tl-qw-1.txt
  grep -m1 -A9 "per position" $L/tlsum-qw-1.txt >> $S; tail -3 $L/rmarks-qw-1.txt >> $S ;;
pack) pack ;;
esac; done
cat $L/builds.txt $L/tests.txt $L/gens.txt $L/e2e.txt 2>/dev/null
