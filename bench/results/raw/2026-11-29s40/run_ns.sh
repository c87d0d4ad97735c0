#!/bin/bash
# Call 15: the ring's depth, MG_NS 10 (default) against 11, in one process pair on one machine:
# both built, the 11-stage one checked, then each timed twice, alternating.
mkdir -p $OUT/log
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $OUT/log/gpu.txt 2>&1
for ns in 10 11; do
	/usr/local/cuda/bin/nvcc -O3 -DNDEBUG -DMG_NS=$ns --generate-code=arch=compute_90a,code=sm_90a -Isrc -I. \
		-std=c++17 dev/mega_bench.cu -o /tmp/mb$ns -lcuda > $OUT/log/build$ns.txt 2>&1 || { cat $OUT/log/build$ns.txt; exit 1; }
done
timeout 60 /tmp/mb11 check > $OUT/log/check11.txt 2>&1; echo "check (MG_NS=11) rc=$?" >> $OUT/log/check11.txt
grep -E "FAIL|DIFFER|check|HANG" $OUT/log/check11.txt
for r in 1 2; do for ns in 10 11; do
	echo "== MG_NS=$ns round $r"
	timeout 100 /tmp/mb$ns time 48 128 4096 2>&1 | grep -v "^mega_bench"
done; done > $OUT/log/time.txt 2>&1
cat $OUT/log/time.txt
