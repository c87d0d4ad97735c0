#!/bin/bash
# Calls 16-17: dev/f8step_bench (the FP8-MMA decode step against gm_step, weights in shared memory;
# call 17 with 8 or 16 warps and 1 or 2 accumulators a warp; call 18 with a 9th warp spinning in
# mbarrier try_wait, as mega_bench's producer does; call 21 after the review mend: the same figures).
mkdir -p $OUT/log
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $OUT/log/gpu.txt 2>&1
/usr/local/cuda/bin/nvcc -O3 -DNDEBUG --generate-code=arch=compute_90a,code=sm_90a -Isrc -I. -std=c++17 \
	dev/f8step_bench.cu -o /tmp/f8step_bench -lcuda > $OUT/log/build.txt 2>&1 || { cat $OUT/log/build.txt; exit 1; }
timeout 60 /tmp/f8step_bench check > $OUT/log/check.txt 2>&1; echo "check rc=$?" >> $OUT/log/check.txt
cat $OUT/log/check.txt
timeout 120 /tmp/f8step_bench time > $OUT/log/time.txt 2>&1; echo "time rc=$?" >> $OUT/log/time.txt
cat $OUT/log/time.txt
