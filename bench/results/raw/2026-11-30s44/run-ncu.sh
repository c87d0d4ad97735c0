#!/bin/bash
# Session 44 (prepared in session 43): ncu's warp samples of the dense
# whole-step kernel (ds_kernel) at depth 4096, per SASS instruction, to see where a warp's
# attention chunk (~700 instructions, ~1.5 us) and the phase chain spend their cycles.
#   bash bench/results/raw/2026-11-30s44/run-ncu.sh        (carry .deps)
# Writes $OUT/sum.txt and $OUT/ncu.tgz (details, the SASS page as CSV with -lineinfo's source lines).
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
L=$OUT/ncu; mkdir -p $L; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" | tee -a $S; }
B=/tmp/b-ncu
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr \
	"-DCMAKE_CUDA_FLAGS=-lineinfo" > $L/build.log 2>&1 && cmake --build $B -j16 --target fp4serve >> $L/build.log 2>&1
ts "build rc=$?"
[ -f /dev/shm/llama3-8b/config.json ] || $B/fp4serve gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen.log 2>&1; ts "gen rc=$?"
for ctx in ${NCU_CTX:-4096 0}; do
	lab=ctx$ctx; args="-p 0 -n 8 --reps 1"; [ $ctx -gt 0 ] && args="-p 0 --ctx $ctx -n 8 --reps 1"
	timeout ${NT:-280} ncu --clock-control none --cache-control none -k regex:ds_kernel --launch-skip 4 --launch-count 1 \
		--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SourceCounters \
		--section SchedulerStats --section LaunchStats --import-source yes -o /tmp/p-$lab \
		$B/fp4serve bench -m /dev/shm/llama3-8b $args > $L/ncu-$lab.log 2>&1
	ts "ncu $lab rc=$?"
	ncu -i /tmp/p-$lab.ncu-rep --page details > $L/details-$lab.txt 2>&1
	ncu -i /tmp/p-$lab.ncu-rep --page source --csv --print-source sass > $L/sass-$lab.csv 2>&1
	gzip -f $L/sass-$lab.csv
	grep -E "Duration|DRAM Throughput|Stall|Warp Cycles|Issued Warp|No Eligible|Registers" $L/details-$lab.txt | head -20 >> $S
done
(cd $OUT && tar czf ncu.tgz ncu && rm -rf ncu)
