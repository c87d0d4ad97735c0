#!/usr/bin/env bash
# check-sass.sh: the native FP4 conversion must be compiled exactly where the hardware has it.
#   - sm_100a / sm_120a / sm_121a code of src/backend/cuda/quant.cu contains cvt.rn.satfinite.e2m1x2
#     (PTX) and the E2M1 conversion instruction (SASS);
#   - sm_80 / sm_90a code contains neither (Hopper/Ampere run the software encoder).
# PTX is always checked (needs only nvcc). SASS is checked where cuobjdump exists (the CUDA
# toolkit's full install; CI's minimal toolkit may lack it, and then says so).
# Usage: scripts/check-sass.sh        exit 0 pass, 1 fail, 77 skipped (no nvcc)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
if ! command -v nvcc >/dev/null; then
  echo "SKIP: nvcc not found"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
src=src/backend/cuda/quant.cu
have_cuobjdump=0
command -v cuobjdump >/dev/null && have_cuobjdump=1
pass=0
fail=0
check() { # name, condition (0/1)
  if [ "$2" = 1 ]; then pass=$((pass + 1)); echo "ok   $1"; else fail=$((fail + 1)); echo "FAIL $1"; fi
}
for arch in 80 90a 100a 120a 121a; do
  case $arch in 100a|120a|121a) want=1 ;; *) want=0 ;; esac
  nvcc -std=c++17 -Isrc -DFP4S_CUDA_ARCHS='""' --ptx \
    -gencode "arch=compute_${arch},code=compute_${arch}" -o "$tmp/$arch.ptx" "$src"
  n=$(grep -c 'cvt.rn.satfinite.e2m1x2' "$tmp/$arch.ptx" || true)
  check "compute_${arch} PTX: $n native e2m1x2 conversions (want $([ $want = 1 ] && echo '> 0' || echo 0))" \
    "$([ $want = 1 ] && [ "$n" -gt 0 ] || { [ $want = 0 ] && [ "$n" -eq 0 ]; } && echo 1 || echo 0)"
  # assembling the cubin proves ptxas accepts the instruction for this target
  nvcc -std=c++17 -Isrc -DFP4S_CUDA_ARCHS='""' --cubin \
    -gencode "arch=compute_${arch},code=sm_${arch}" -o "$tmp/$arch.cubin" "$src"
  if [ $have_cuobjdump = 1 ]; then
    cuobjdump -sass "$tmp/$arch.cubin" > "$tmp/$arch.sass"
    s=$(grep -cE 'F2FP[A-Z0-9_.]*E2M1' "$tmp/$arch.sass" || true)
    check "sm_${arch} SASS: $s E2M1 conversion instructions (want $([ $want = 1 ] && echo '> 0' || echo 0))" \
      "$([ $want = 1 ] && [ "$s" -gt 0 ] || { [ $want = 0 ] && [ "$s" -eq 0 ]; } && echo 1 || echo 0)"
    if [ $want = 1 ] && [ "$s" -gt 0 ]; then
      grep -oE 'F2FP[A-Z0-9_.]*E2M1[A-Z0-9_.]*' "$tmp/$arch.sass" | sort | uniq -c | sed 's/^/       /'
    fi
  fi
done
[ $have_cuobjdump = 1 ] || echo "note: cuobjdump not found: SASS not inspected, PTX checked"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
