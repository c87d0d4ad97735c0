#!/bin/bash
# Session 62: issue #6's whole measurement on an H100, HEAD, in three calls on one warm machine.
#   PH=A: build every target (build-gpu, sm_90a), generate llama3-8b, qwen3-30b-a3b (NVFP4) and
#         gpt-oss-20b (MXFP4) into /dev/shm while the shorter GPU tests run (ctest -L gpu -j4).
#   PH=B: the four long GPU tests, then gemv_bench quick (the GEMV floors), then each model
#         tg128 (-p 0 -n 128 --reps 3) and depth 4096 (-p 0 --ctx 4096 -n 64 --reps 2), RUNS rounds,
#         pp512 once, and `fp4serve run` to its first token (llama3-8b from disk, page cache dropped, then warm).
#   PH=D (a fresh machine): fp4serve and stream_bench built, the three models generated again; each
#         one-launch step kernel's phase marks for a middle layer (FP4S_DSTEP_TL / FP4S_MSTEP_TL /
#         FP4S_OSTEP_TL) at tg128 and depth 4096; sampled decode (T 0.8, top_p 0.9); the engine's
#         expert GEMVs (stream_bench, FP4S_BENCH_EXPERTS=1).
#   PH=E (a fresh machine): fp4serve and gemv_bench built, the three models generated; gemv_bench
#         quick a second time (run-to-run spread of the GEMV figures), then small-batch decode:
#         --batch 1, 2, 4, 8, 16 (-p 0 -n 64 --reps 3) on each model.
#   PH=F (a fresh machine): decode batches replayed as graphs (forward.c's fwd_batch_graph): fp4serve
#         and the tests built, test_engine_cuda, test_golden_cuda and test_mstep, then --batch 2, 4,
#         16 (-p 0 -n 64 --reps 3) with the graphs (new) and with FP4S_BATCH_GRAPH=0 (as before),
#         alternately, on the three models.
#   PH=C: gpt-oss-120b (MXFP4) generated once the others are gone, tg128 and depth 4096, RUNS rounds.
# stories260K comes from .gpu-shared (carried). Logs: $OUT/sum.txt and $OUT/logs.tgz.
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
L=$OUT/log; mkdir -p $L; S=$OUT/sum.txt; F=$PWD/build-gpu/fp4serve
ts() { echo "$(date +%T) $*" | tee -a $S; }
LONG="test_gemv|test_attention|test_engine_cuda|test_mstep"
bench() { local lab=$1; shift; timeout 240 "$@" > $L/b-$lab.txt 2>&1; echo "rc=$?" >> $L/b-$lab.txt
	ts "$lab $(grep -E '^(tg|pp|roofline)|rc=' $L/b-$lab.txt | tr -s ' ' | tr '\n' ' ')"; }
gen() { [ -d /dev/shm/$1 ] || { timeout 300 $F gen --preset $1 --format $2 /dev/shm/$1 > $L/gen-$1.log 2>&1; ts "gen $1 rc=$? $(tail -1 $L/gen-$1.log)"; }; }
case $PH in
A)
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit --format=csv | tee -a $S
	git log -1 --format='commit %H %s' | tee -a $S; git status --short | head >> $S
	ts "configure"
	cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr \
		-DFP4S_SHARED_DIR=$PWD/.gpu-shared > $L/cmake.log 2>&1 && cmake --build build-gpu -j16 > $L/build.log 2>&1
	ts "build rc=$?"; grep -E 'error' -A2 $L/build.log | head -20 >> $S
	( gen llama3-8b nvfp4; gen qwen3-30b-a3b nvfp4; gen gpt-oss-20b mxfp4 ) &
	ctest --test-dir build-gpu -L gpu -E "^($LONG)\$" -j4 --output-on-failure --timeout 400 > $L/ctest-A.log 2>&1
	ts "ctest A rc=$?"; grep -E "Test +#|tests passed|tests failed|Failed|\*\*\*" $L/ctest-A.log | tee -a $S
	wait ;;
B)
	ctest --test-dir build-gpu -L gpu -R "^($LONG)\$" -j4 -V --timeout 400 > $L/ctest-B.log 2>&1
	ts "ctest B rc=$?"; grep -E "Test +#|tests passed|tests failed|Failed|\*\*\*| passed, | failed" $L/ctest-B.log | tail -30 | tee -a $S
	timeout 200 build-gpu/dev/gemv_bench quick > $L/gemv.txt 2>&1; ts "gemv_bench rc=$?"; grep -E "ceiling|^[0-9]+x" $L/gemv.txt | grep -E "ceiling| 1 \|" >> $S
	for r in $(seq ${RUNS:-2}); do for m in llama3-8b qwen3-30b-a3b gpt-oss-20b; do
		bench $m-tg-$r $F bench -m /dev/shm/$m -p 0 -n 128 --reps 3
		bench $m-d-$r $F bench -m /dev/shm/$m -p 0 --ctx 4096 -n 64 --reps 2; done; done
	for m in llama3-8b qwen3-30b-a3b gpt-oss-20b; do bench $m-pp $F bench -m /dev/shm/$m -p 512 -n 0 --reps 3; done
	cp -r /dev/shm/llama3-8b /tmp/ll; sync; echo 3 > /proc/sys/vm/drop_caches
	for w in cold warm; do s0=$(date +%s%N)
		timeout 60 $F run -m /tmp/ll -p "Once upon a time" -n 1 --temperature 0 > $L/ttft-$w.txt 2>&1
		ts "ttft $w rc=$? $(( ($(date +%s%N)-s0)/1000000 )) ms"; done ;;
D)
	nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee -a $S; git log -1 --format='commit %H' | tee -a $S
	cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr \
		> $L/cmake.log 2>&1 && cmake --build build-gpu -j16 --target fp4serve > $L/build.log 2>&1; ts "build rc=$?"
	( gen llama3-8b nvfp4; gen gpt-oss-20b mxfp4; gen qwen3-30b-a3b nvfp4 ) &
	cmake --build build-gpu -j8 --target stream_bench >> $L/build.log 2>&1; ts "build stream_bench rc=$?"
	wait
	FP4S_BENCH_EXPERTS=1 timeout 120 build-gpu/dev/stream_bench > $L/experts.txt 2>&1
	ts "stream_bench experts rc=$?"; grep -E "TB/s|timeline" $L/experts.txt >> $S
	for m in llama3-8b:FP4S_DSTEP_TL=16 qwen3-30b-a3b:FP4S_MSTEP_TL=24 gpt-oss-20b:FP4S_OSTEP_TL=12; do n=${m%%:*}; e=${m#*:}
		bench $n-tl env $e $F bench -m /dev/shm/$n -p 0 -n 128 --reps 3; sed -n '/timeline/,$p' $L/b-$n-tl.txt >> $S
		bench $n-tld env $e $F bench -m /dev/shm/$n -p 0 --ctx 4096 -n 64 --reps 2; sed -n '/timeline/,$p' $L/b-$n-tld.txt >> $S
		bench $n-s $F bench -m /dev/shm/$n -p 0 -n 128 --reps 3 --temp 0.8 --top-p 0.9
		bench $n-sd $F bench -m /dev/shm/$n -p 0 --ctx 4096 -n 64 --reps 2 --temp 0.8 --top-p 0.9; done ;;
E)
	nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee -a $S
	cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr \
		> $L/cmake.log 2>&1 && cmake --build build-gpu -j16 --target fp4serve > $L/build.log 2>&1; ts "build rc=$?"
	( gen llama3-8b nvfp4; gen gpt-oss-20b mxfp4; gen qwen3-30b-a3b nvfp4 ) &
	cmake --build build-gpu -j8 --target gemv_bench >> $L/build.log 2>&1; ts "build gemv_bench rc=$?"
	wait
	timeout 200 build-gpu/dev/gemv_bench quick > $L/gemv.txt 2>&1; ts "gemv_bench rc=$?"; grep -E "ceiling|^[0-9]+x" $L/gemv.txt | grep -E "ceiling| 1 \|" >> $S
	for m in llama3-8b qwen3-30b-a3b gpt-oss-20b; do for b in 1 2 4 8 16; do
		bench $m-b$b $F bench -m /dev/shm/$m -p 0 -n 64 --reps 3 --batch $b; done; done ;;
F)
	nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee -a $S
	cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr \
		-DFP4S_SHARED_DIR=$PWD/.gpu-shared > $L/cmake.log 2>&1 && cmake --build build-gpu -j16 --target fp4serve test_engine_cuda test_golden test_mstep > $L/build.log 2>&1
	ts "build rc=$?"; grep -E 'error' -A2 $L/build.log | head -20 >> $S
	( gen llama3-8b nvfp4; gen gpt-oss-20b mxfp4; gen qwen3-30b-a3b nvfp4 ) &
	ctest --test-dir build-gpu -R "^(test_engine_cuda|test_golden_cuda|test_mstep)\$" -j3 -V --timeout 200 > $L/ctest-F.log 2>&1
	ts "ctest F rc=$?"; grep -E "Test +#|tests passed|tests failed| passed, | failed|FAIL" $L/ctest-F.log | tail -20 | tee -a $S
	wait
	for m in llama3-8b qwen3-30b-a3b gpt-oss-20b; do for b in 2 4 16; do
		bench $m-b$b-new $F bench -m /dev/shm/$m -p 0 -n 64 --reps 3 --batch $b
		bench $m-b$b-old env FP4S_BATCH_GRAPH=0 $F bench -m /dev/shm/$m -p 0 -n 64 --reps 3 --batch $b; done; done ;;
C)
	rm -rf /dev/shm/llama3-8b /dev/shm/qwen3-30b-a3b /dev/shm/gpt-oss-20b /tmp/ll
	gen gpt-oss-120b mxfp4
	for r in $(seq ${RUNS:-2}); do
		bench gpt-oss-120b-tg-$r $F bench -m /dev/shm/gpt-oss-120b -p 0 -n 128 --reps 3
		bench gpt-oss-120b-d-$r $F bench -m /dev/shm/gpt-oss-120b -p 0 --ctx 4096 -n 64 --reps 2; done
	bench gpt-oss-120b-pp $F bench -m /dev/shm/gpt-oss-120b -p 512 -n 0 --reps 3 ;;
esac
(cd $OUT && tar czf logs-$PH.tgz log && rm -rf log)
