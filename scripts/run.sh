#!/usr/bin/env bash
# run.sh [fp4serve arguments]: install, build and run the main job on a fresh machine.
# With no arguments: the build and device report (backends, GPUs, which FP4 path each uses).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh build
exec ./build/fp4serve "$@"
