#!/bin/bash
# Session 52: the whole GPU test label (ctest -L gpu) on HEAD, in two device calls on one warm
# machine. PH=1 configures and builds every target into build-gpu (kept between calls while the
# machine stays warm; rebuilt otherwise), then runs the shorter GPU tests; PH=2 the four long ones.
# stories260K comes from .gpu-shared (carried; ../shared does not travel).
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
S=$OUT/sum.txt; ts() { echo "$(date +%T) $*" | tee -a $S; }
LONG="test_gemv|test_attention|test_engine_cuda|test_mstep"
[ -f build-gpu/CMakeCache.txt ] || cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
	-DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr -DFP4S_SHARED_DIR=$PWD/.gpu-shared > $OUT/cmake.log 2>&1
cmake --build build-gpu -j16 > $OUT/build-$PH.log 2>&1; ts "build rc=$? $(git log -1 --format=%h) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
if [ "$PH" = 1 ]; then sel=(-L gpu -E "^($LONG)\$"); else sel=(-L gpu -R "^($LONG)\$"); fi
ctest --test-dir build-gpu "${sel[@]}" -j4 --output-on-failure --timeout ${TMO:-400} > $OUT/ctest-$PH.log 2>&1
ts "ctest rc=$?"; grep -E "Test +#|tests passed|tests failed|Failed|\*\*\*" $OUT/ctest-$PH.log | tee -a $S
