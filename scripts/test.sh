#!/usr/bin/env bash
# test.sh: install, build and run the test suite on a fresh machine (no GPU needed: GPU tests
# carry the label `gpu` and run with scripts/gpu-suite.sh on a machine that has one).
#  1. the Release build (CUDA code compiled when nvcc exists) and every non-GPU test, including
#     the exhaustive 2^32 conversion checks and the SASS/PTX check;
#  2. the checkpoint and tokenizer parsers, the real tokenizers' encoders and the server's request
#     parser under libFuzzer for a bounded time
#     (60 s each; 0 findings);
#  3. an AddressSanitizer + UndefinedBehaviorSanitizer build of the host code and its tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
[ -x scripts/fetch-testdata.sh ] && scripts/fetch-testdata.sh
[ -x scripts/fetch-server-testdata.sh ] && scripts/fetch-server-testdata.sh
jobs=$(nproc)
scripts/build.sh build
ctest --test-dir build -LE gpu --output-on-failure -j"$jobs"
scripts/fuzz.sh 60
FP4S_FUZZ_TARGET=config scripts/fuzz.sh 60
FP4S_FUZZ_TARGET=request scripts/fuzz.sh 60
FP4S_FUZZ_TARGET=tokenizer scripts/fuzz.sh 60
FP4S_FUZZ_TARGET=encode scripts/fuzz.sh 60
# last, so the run ends on a test runner's summary
scripts/build.sh build-asan -DFP4S_CUDA=OFF -DFP4S_SANITIZE=address,undefined
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan -LE "gpu|slow" --output-on-failure -j"$jobs"
