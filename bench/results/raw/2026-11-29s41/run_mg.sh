#!/bin/bash
# Session 41's kernel-lab calls: dev/mega_bench on the engine's layout (row-major weights, paged KV).
# Build, check against the CPU reference, then time 48 layers at ctx 128 and 4096 (CTXS).
mkdir -p $OUT/log
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $OUT/log/gpu.txt 2>&1
/usr/local/cuda/bin/nvcc -O3 -DNDEBUG --generate-code=arch=compute_90a,code=sm_90a -Isrc -I. -Idev -std=c++17 \
	dev/mega_bench.cu -o /tmp/mega_bench -lcuda > $OUT/log/build.txt 2>&1 || { cat $OUT/log/build.txt; exit 1; }
timeout 90 /tmp/mega_bench check > $OUT/log/check.txt 2>&1; echo "check rc=$?" >> $OUT/log/check.txt
grep -E "FAIL|DIFFER|check|HANG|experts" $OUT/log/check.txt | head -40
grep -q "check: PASS" $OUT/log/check.txt || { grep -B2 -A40 HANG $OUT/log/check.txt | head -80; exit 1; }
timeout 100 /tmp/mega_bench time 48 ${CTXS:-128 4096} 2>&1 | grep -v "^mega_bench" > $OUT/log/time.txt 2>&1
cat $OUT/log/time.txt
# variants (VARIANTS: ';'-separated nvcc flags), timed only
IFS=';' read -ra VV <<< "${VARIANTS:-}"
for v in "${VV[@]}"; do
	[ -z "$v" ] && continue
	/usr/local/cuda/bin/nvcc -O3 -DNDEBUG --generate-code=arch=compute_90a,code=sm_90a -Isrc -I. -Idev -std=c++17 $v \
		dev/mega_bench.cu -o /tmp/mega_bench_v -lcuda >> $OUT/log/build.txt 2>&1 || { echo "build $v failed"; continue; }
	echo "== $v"; timeout 90 /tmp/mega_bench_v check 2>&1 | grep -E "check:|FAIL|DIFFER|HANG"
	timeout 100 /tmp/mega_bench_v time 48 ${CTXS:-128 4096} 2>&1 | grep -v "^mega_bench"
done > $OUT/log/time_v.txt 2>&1
cat $OUT/log/time_v.txt
# environment variants (ENVS: ';'-separated settings) of the default build, timed only
IFS=';' read -ra EE <<< "${ENVS:-}"
for v in "${EE[@]}"; do
	[ -z "$v" ] && continue
	echo "== env $v"; env $v timeout 100 /tmp/mega_bench time 48 ${CTXS:-128 4096} 2>&1 | grep -v "^mega_bench"
done > $OUT/log/time_e.txt 2>&1
cat $OUT/log/time_e.txt
