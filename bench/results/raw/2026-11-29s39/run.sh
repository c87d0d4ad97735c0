#!/bin/bash
# Session 39's device calls: dev/mega_bench (persistent decode step prototype).
# Phase m: build mega_bench alone, check against the CPU reference, time 48 layers at ctx 128/4096.
R=$(pwd)
PH=${1:-m}
mkdir -p $OUT/log
case $PH in
m)
	nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $OUT/log/gpu.txt 2>&1
	/usr/local/cuda/bin/nvcc -O3 -DNDEBUG --generate-code=arch=compute_90a,code=sm_90a -Isrc -I. -std=c++17 \
		dev/mega_bench.cu -o /tmp/mega_bench -lcuda > $OUT/log/build.txt 2>&1 || { cat $OUT/log/build.txt; exit 1; }
	timeout 120 /tmp/mega_bench check > $OUT/log/check.txt 2>&1; echo "check rc=$?" >> $OUT/log/check.txt
	cat $OUT/log/check.txt
	timeout 200 /tmp/mega_bench time 48 ${CTXS:-128 4096} > $OUT/log/time.txt 2>&1; echo "time rc=$?" >> $OUT/log/time.txt
	cat $OUT/log/time.txt
	;;
esac
case $PH in
v)
	# the variants of call 2: attention loads unrolled; what the expert phase waits for
	/usr/local/cuda/bin/nvcc -O3 -DNDEBUG --generate-code=arch=compute_90a,code=sm_90a -Isrc -I. -std=c++17 \
		dev/mega_bench.cu -o /tmp/mega_bench -lcuda > $OUT/log/build.txt 2>&1 || { cat $OUT/log/build.txt; exit 1; }
	timeout 120 /tmp/mega_bench check > $OUT/log/check.txt 2>&1; echo "check rc=$?" >> $OUT/log/check.txt
	MG_HGN=1 timeout 120 /tmp/mega_bench check > $OUT/log/check1.txt 2>&1; echo "check (one head group) rc=$?" >> $OUT/log/check1.txt
	grep -E "FAIL|DIFFER|check" $OUT/log/check.txt $OUT/log/check1.txt
	IFS=';' read -ra VV <<< "${VARS:-;MG_CSPLIT=4;MG_CSPLIT=16;MG_EXSTATIC=1;MG_EXPOOL=1;MG_EXSTATIC=1 MG_EXPOOL=1;MG_TT=32}"
	for v in "${VV[@]}"; do
		echo "== $v"
		env $v timeout 100 /tmp/mega_bench time 48 128 4096 2>&1 | grep -v "^mega_bench"
	done > $OUT/log/time.txt 2>&1
	cat $OUT/log/time.txt
	;;
esac
case $PH in
h)
	# the hang of call v4 (head groups): the default check and one timed context under the watchdog
	/usr/local/cuda/bin/nvcc -O3 -DNDEBUG --generate-code=arch=compute_90a,code=sm_90a -Isrc -I. -std=c++17 \
		dev/mega_bench.cu -o /tmp/mega_bench -lcuda > $OUT/log/build.txt 2>&1 || { cat $OUT/log/build.txt; exit 1; }
	timeout 60 /tmp/mega_bench check > $OUT/log/check.txt 2>&1; echo "check rc=$?" >> $OUT/log/check.txt
	grep -E "FAIL|DIFFER|check|HANG" $OUT/log/check.txt; grep block $OUT/log/check.txt | sort -k3 | uniq -c -f2 | head -30
	IFS=';' read -ra VV <<< "${VARS:-MG_HGN=1}"
	for v in "${VV[@]}"; do
		echo "== $v"
		env $v timeout 60 /tmp/mega_bench time 48 128 2>&1 | grep -v "^mega_bench" | head -40
	done > $OUT/log/time.txt 2>&1
	cat $OUT/log/time.txt
	;;
esac
# Calls 9-16 ran their commands inline (see the session's results file), each: nvcc as in phase m,
# then `mega_bench check` (MG_HGN=4 for calls 9-10, the hang's records) and/or `mega_bench time
# 48 128 4096` with the variants named there. Call 15 built ecbc6dd's dev/mega_bench.cu (copied to
# the ignored .gpu/old/) beside HEAD's, to compare both on one machine.
