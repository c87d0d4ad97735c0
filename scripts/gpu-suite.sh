#!/usr/bin/env bash
# gpu-suite.sh: the whole GPU run in one command, for a machine with a GPU and the CUDA toolkit:
# build for its architecture, run every test (GPU ones included), the SASS check, the report and
# the kernel benchmarks. Logs go to $OUT (default ./out). Prints a summary table last.
#   OUT=/path scripts/gpu-suite.sh [cuda-arch, default 90a]
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
arch=${1:-90a}
out=${OUT:-$PWD/out}
mkdir -p "$out"
prefix=""
[ -d .deps/root/usr ] && prefix="-DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr"
{
  date -u
  git log -1 --format='commit %H %s' 2>/dev/null || echo "commit (no git)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit --format=csv
  nvcc --version | tail -1
  cmake --version | head -1
} 2>&1 | tee "$out/env.txt"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" $prefix \
  > "$out/build.log" 2>&1 && cmake --build build-gpu -j"$(nproc)" >> "$out/build.log" 2>&1
build_rc=$?
[ $build_rc = 0 ] || { tail -40 "$out/build.log"; echo "BUILD FAILED"; exit 1; }
ctest --test-dir build-gpu --output-on-failure -j4 > "$out/ctest.log" 2>&1
ctest_rc=$?
./build-gpu/tests/test_quant > "$out/test_quant.log" 2>&1
./build-gpu/fp4serve report > "$out/report.txt" 2>&1
scripts/check-sass.sh > "$out/check-sass.log" 2>&1
sass_rc=$?
./build-gpu/dev/quant_bench > "$out/quant_bench.txt" 2>&1
bench_rc=$?
echo "== report"; cat "$out/report.txt"
echo "== ctest (rc $ctest_rc)"; grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/ctest.log" | head -20
echo "== test_quant"; tail -4 "$out/test_quant.log"
echo "== check-sass (rc $sass_rc)"; cat "$out/check-sass.log"
echo "== quant_bench (rc $bench_rc)"; cat "$out/quant_bench.txt"
[ $ctest_rc = 0 ] && [ $sass_rc = 0 ] && [ $bench_rc = 0 ]
