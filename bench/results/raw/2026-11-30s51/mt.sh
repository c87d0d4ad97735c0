set -uo pipefail; export PATH="$PATH:/usr/local/cuda/bin"; L=$OUT; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" | tee -a $S; }
cmake -S . -B /tmp/b -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr > $L/build.log 2>&1 && cmake --build /tmp/b -j16 --target fp4serve test_gemv_experts >> $L/build.log 2>&1; ts "build rc=$?"
/tmp/b/fp4serve gen --preset qwen3-30b-a3b --format nvfp4 /dev/shm/q > $L/gen.log 2>&1; ts "gen rc=$?"
FP4S_MSTEP=0 timeout 60 /tmp/b/fp4serve bench -m /dev/shm/q -p 0 -n 128 --reps 3 > $L/b1.txt 2>&1; ts "$(grep -E '^tg' $L/b1.txt)"
FP4S_MSTEP=0 timeout 60 /tmp/b/fp4serve bench -m /dev/shm/q -p 0 --ctx 4096 -n 64 --reps 2 > $L/b2.txt 2>&1; ts "$(grep -E '^tg' $L/b2.txt)"
x=$(find /tmp/b -name test_gemv_experts -type f | head -1); timeout 60 $x > $L/t.txt 2>&1; ts "test_gemv_experts rc=$? $(tail -1 $L/t.txt)"
