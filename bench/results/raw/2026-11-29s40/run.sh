#!/bin/bash
# Session 40's device calls: dev/mega_bench (the persistent decode step prototype).
# Build, check against the CPU reference (default, and CHECK1: by default MG_POLL=1; MG_AMMA=0 in calls 3-7,
# while the CUDA-core attention existed), then time 48 layers at
# ctx 128 and 4096 for each variant in VARS (';'-separated environment settings, empty = default).
mkdir -p $OUT/log
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $OUT/log/gpu.txt 2>&1
/usr/local/cuda/bin/nvcc -O3 -DNDEBUG --generate-code=arch=compute_90a,code=sm_90a -Isrc -I. -std=c++17 \
	dev/mega_bench.cu -o /tmp/mega_bench -lcuda > $OUT/log/build.txt 2>&1 || { cat $OUT/log/build.txt; exit 1; }
timeout 60 /tmp/mega_bench check > $OUT/log/check.txt 2>&1; echo "check rc=$?" >> $OUT/log/check.txt
env ${CHECK1:-MG_POLL=1} timeout 60 /tmp/mega_bench check > $OUT/log/check1.txt 2>&1; echo "check (${CHECK1:-MG_POLL=1}) rc=$?" >> $OUT/log/check1.txt
grep -E "FAIL|DIFFER|check|HANG|experts" $OUT/log/check.txt $OUT/log/check1.txt | head -40
grep -q "check: PASS" $OUT/log/check.txt || { grep -B2 -A40 HANG $OUT/log/check.txt | head -80; exit 1; }
IFS=';' read -ra VV <<< "${VARS:-}"
[ ${#VV[@]} -eq 0 ] && VV=("")
for v in "${VV[@]}"; do
	echo "== ${v:-default}"
	env $v timeout 100 /tmp/mega_bench time 48 ${CTXS:-128 4096} 2>&1 | grep -v "^mega_bench"
done > $OUT/log/time.txt 2>&1
cat $OUT/log/time.txt
