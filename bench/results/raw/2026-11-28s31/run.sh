#!/usr/bin/env bash
# Session 31's device calls. Run i1 was session 30's raw/2026-11-28s30/run-next.sh, phase b (treeA
# main, treeI + next-imad.patch, treeF + next-defer.patch), cited rather than copied here; the
# helpers below are that script's, bench taking an env prefix in its binary ("env X=1 /tmp/fA").
# Phases (one call each, run TAG): q (q1: qwen3-30b-a3b's FP4S_MOE_ONE modes, time to first token,
# gpt-oss-120b), s (s1: moe_tma's ring for qwen3), m (m1: treeM = main + not-kept-moe-lean-loop.patch),
# v (v1: treeV = main + not-kept-moe-tma-instances.patch), tl (tl1: step timelines of qwen3's three
# launches and mode 4), tl1 (tl2: the timeline of mode 1).
# Layout: .gpu/run.sh (this file), .gpu/tree{A,M,V}, .gpu/deps (scripts/gpu-deps.sh); then
#   cd .gpu && TAG=q1 timeout 570 bash run.sh q; TAG=q1 bash run.sh pack
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
G=$PWD; L=$OUT/logs; mkdir -p $L; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" >> $S; }
bld() { local s0=$(date +%s) src=$1 dir=$2 log=$3; shift 3
  [ -x $dir/fp4serve ] && { ts "build $dir: kept"; return; }
  cmake -S $src -B $dir -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$G/deps/root/usr > $log 2>&1 &&
  cmake --build $dir -j${J:-8} --target "$@" >> $log 2>&1; ts "build $dir rc=$? $(( $(date +%s)-s0 )) s"; }
bench() { local lab=$1 bin=$2 m=$3; shift 3
  eval "$bin/fp4serve" bench -m $m "$@" > $L/b-$lab.txt 2>&1; ts "$lab $(grep -E '^(tg|pp)' $L/b-$lab.txt | tail -1)"; }
gen() { [ -d /dev/shm/$1 ] || /tmp/fA/fp4serve gen --preset $1 --format $2 /dev/shm/$1 > $L/gen-$1.log 2>&1; }
for ph in "$@"; do case $ph in
q) # qwen3-30b-a3b's MoE block: the one-launch kernel (FP4S_MOE_ONE) against the three launches on main's kernels; TTFT; gpt-oss-120b
  J=10 bld $G/treeA /tmp/fA $L/build-A.log fp4serve stream_bench gemv_bench
  gen qwen3-30b-a3b nvfp4
  for rr in 1 2; do for e in def 1 1L0 2 3 4; do
    case $e in def) ev="";; 1L0) ev="FP4S_MOE_ONE=1 FP4S_MOE_LOCAL=0";; *) ev="FP4S_MOE_ONE=$e";; esac
    env $ev true; bench q-$e-$rr "env $ev /tmp/fA" /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3
    ts "  ($ev)"; done; done
  for e in def 1; do ev=""; [ $e = 1 ] && ev="FP4S_MOE_ONE=1"; bench qd-$e "env $ev /tmp/fA" /dev/shm/qwen3-30b-a3b -p 0 --ctx 4096 -n 64 --reps 2; done
  rm -rf /dev/shm/qwen3-30b-a3b
  [ -d /tmp/ll ] || /tmp/fA/fp4serve gen --preset llama3-8b --format nvfp4 /tmp/ll > $L/gen-ll.log 2>&1
  sync; echo 3 > /proc/sys/vm/drop_caches; s0=$(date +%s%N)
  /tmp/fA/fp4serve run -m /tmp/ll -p "Once upon a time" -n 1 --temperature 0 > $L/ttft-cold.txt 2>&1; ts "ttft cold rc=$? $(( ($(date +%s%N)-s0)/1000000 )) ms"
  s0=$(date +%s%N); /tmp/fA/fp4serve run -m /tmp/ll -p "Once upon a time" -n 1 --temperature 0 > $L/ttft-warm.txt 2>&1; ts "ttft warm rc=$? $(( ($(date +%s%N)-s0)/1000000 )) ms"
  free -g | head -2 >> $S; df -h /dev/shm | tail -1 >> $S
  gen gpt-oss-120b mxfp4; ts "gen 120b rc=$?"
  bench o120 /tmp/fA /dev/shm/gpt-oss-120b -p 0 -n 128 --reps 3; bench o120d /tmp/fA /dev/shm/gpt-oss-120b -p 0 --ctx 4096 -n 64 --reps 2 ;;
s) # qwen3-30b-a3b's one-launch MoE: its ring (FP4S_MOE_STAGES, FP4S_MOE_AHEAD) against the three launches
  J=12 bld $G/treeA /tmp/fA $L/build-A.log fp4serve
  gen qwen3-30b-a3b nvfp4
  for rr in 1 2; do for ev in "" "FP4S_MOE_ONE=1" "FP4S_MOE_ONE=1 FP4S_MOE_AHEAD=0" "FP4S_MOE_ONE=1 FP4S_MOE_STAGES=3 FP4S_MOE_AHEAD=0" \
      "FP4S_MOE_ONE=1 FP4S_MOE_STAGES=4 FP4S_MOE_AHEAD=0" "FP4S_MOE_ONE=1 FP4S_MOE_STAGES=0 FP4S_MOE_AHEAD=0" "FP4S_MOE_ONE=1 FP4S_MOE_STAGES=4 FP4S_MOE_AHEAD=2" \
      "FP4S_MOE_ONE=4 FP4S_MOE_AHEAD=0" "FP4S_MOE_ONE=4 FP4S_MOE_STAGES=4 FP4S_MOE_AHEAD=0"; do
    bench "s-$rr" "env $ev /tmp/fA" /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3; ts "  ($ev)"; done; done
  FP4S_MOE_ONE=1 FP4S_MOE_ONE_DEBUG=1 /tmp/fA/fp4serve bench -m /dev/shm/qwen3-30b-a3b -p 0 -n 8 --reps 1 2>&1 | grep moe_tma >> $S ;;
m) # moe_tma.cu's step loop as gemv_tma.cu's (treeM) against main (treeA): gpt-oss-20b (one launch by default), qwen3-30b-a3b's FP4S_MOE_ONE
  J=8 bld $G/treeA /tmp/fA $L/build-A.log fp4serve & J=8 bld $G/treeM /tmp/fM $L/build-M.log fp4serve & wait
  o=/tmp/fM/CMakeFiles/fp4s.dir/src/backend/cuda/moe_tma.cu.o
  for k in 0 1; do cuobjdump -sass -fun "_Z14moe_tma_kernelILi${k}EEv7mt_args" $o > $L/sass-M$k.txt 2>&1
    cuobjdump -sass -fun "_Z14moe_tma_kernelILi${k}EEv7mt_args" /tmp/fA/CMakeFiles/fp4s.dir/src/backend/cuda/moe_tma.cu.o > $L/sass-A$k.txt 2>&1
    ts "sass $k: lines A $(wc -l < $L/sass-A$k.txt) M $(wc -l < $L/sass-M$k.txt); LDL/STL M: $(grep -cE 'LDL|STL' $L/sass-M$k.txt)"; done
  gen gpt-oss-20b mxfp4; gen qwen3-30b-a3b nvfp4
  for rr in 1 2; do for v in A M; do
    bench go-$v-$rr /tmp/f$v /dev/shm/gpt-oss-20b -p 0 -n 128 --reps 3; bench god-$v-$rr /tmp/f$v /dev/shm/gpt-oss-20b -p 0 --ctx 4096 -n 64 --reps 2
    for ev in "FP4S_MOE_ONE=1" "FP4S_MOE_ONE=4" "FP4S_MOE_ONE=4 FP4S_MOE_CLAIM=0"; do
      bench "q-$v-$rr" "env $ev /tmp/f$v" /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3; ts "  ($ev)"; done
  done; done
  bench q-def /tmp/fA /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3 ;;
v) # moe_tma.cu's kernel instanced without the routing code (V & 1 = 0) or the down (V & 2 = 0) (treeV) against main (treeA): qwen3-30b-a3b's FP4S_MOE_ONE 3 / 4
  J=8 bld $G/treeA /tmp/fA $L/build-A.log fp4serve & J=8 bld $G/treeV /tmp/fV $L/build-V.log fp4serve & wait
  gen qwen3-30b-a3b nvfp4
  for rr in 1 2; do for v in A V; do for ev in "FP4S_MOE_ONE=0" "FP4S_MOE_ONE=3" "FP4S_MOE_ONE=4"; do
      bench "q-$v-$rr" "env $ev /tmp/f$v" /dev/shm/qwen3-30b-a3b -p 0 -n 128 --reps 3; ts "  ($ev)"; done
  done; done
  for v in A V; do bench qd-$v "env FP4S_MOE_ONE=3 /tmp/f$v" /dev/shm/qwen3-30b-a3b -p 0 --ctx 4096 -n 64 --reps 2; done ;;
tl) # step timelines (timeline.cuh) of qwen3-30b-a3b: the three-launch MoE against FP4S_MOE_ONE=4 (moe_tma's gate|up)
  s0=$(date +%s); cmake -S $G/treeA -B /tmp/tlA -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$G/deps/root/usr "-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" > $L/build-tl.log 2>&1 &&
  cmake --build /tmp/tlA -j16 --target fp4serve >> $L/build-tl.log 2>&1; ts "tl build rc=$? $(( $(date +%s)-s0 )) s"
  [ -d /dev/shm/qwen3-30b-a3b ] || /tmp/tlA/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1
  for e in 0 4; do FP4S_MOE_ONE=$e FP4S_TL=$L/tl-q$e.txt /tmp/tlA/fp4serve bench -m /dev/shm/qwen3-30b-a3b -p 0 -n 64 --reps 1 > $L/tlbench-q$e.txt 2>&1
    (cd $G/treeA/dev && python3 timeline.py $L/tl-q$e.txt --launches 20 > $L/tlsum-q$e.txt 2>&1); gzip $L/tl-q$e.txt
    ts "tl q$e: $(grep -E '^(tg|pp)' $L/tlbench-q$e.txt | tail -1)"; grep -A12 "per position" $L/tlsum-q$e.txt >> $S; done ;;
tl1) # the step timeline of qwen3-30b-a3b with FP4S_MOE_ONE=1 (the one-launch MoE, local routing): its phases (dev/moe_marks.py)
  s0=$(date +%s); cmake -S $G/treeA -B /tmp/tlA -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$G/deps/root/usr "-DCMAKE_CUDA_FLAGS=-DFP4S_DIAG_TL" > $L/build-tl.log 2>&1 &&
  cmake --build /tmp/tlA -j16 --target fp4serve >> $L/build-tl.log 2>&1; ts "tl build rc=$? $(( $(date +%s)-s0 )) s"
  [ -d /dev/shm/qwen3-30b-a3b ] || /tmp/tlA/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/qwen3-30b-a3b > $L/gen-q.log 2>&1
  FP4S_MOE_ONE=1 FP4S_TL=$L/tl-q1.txt /tmp/tlA/fp4serve bench -m /dev/shm/qwen3-30b-a3b -p 0 -n 48 --reps 1 > $L/tlbench-q1.txt 2>&1
  (cd $G/treeA/dev && python3 moe_marks.py $L/tl-q1.txt > $L/moe-q1.txt 2>&1; python3 timeline.py $L/tl-q1.txt > $L/tlsum-q1.txt 2>&1); gzip $L/tl-q1.txt
  ts "tl q1: $(grep -E '^(tg|pp)' $L/tlbench-q1.txt | tail -1)"; cat $L/moe-q1.txt >> $S; grep -m1 -A10 "per position" $L/tlsum-q1.txt >> $S ;;
pack) (cd $OUT && tar -czf run-${TAG:-x}.tgz logs && rm -rf logs) ;;
esac; done
