#!/bin/bash
# The sampler alone: dev/sample_bench and test_sample at the working tree (/tmp/b-new) and
# sample_bench at HEAD's sample.cu (/tmp/b-old), interleaved twice. Logs under $OUT.
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
L=$OUT/log; mkdir -p $L; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" | tee -a $S; }
git log -1 --format='%H %s' > $L/commit.txt; git status --short >> $L/commit.txt
rm -rf /tmp/old && cp -r . /tmp/old && (cd /tmp/old && git checkout -q -- src/backend/cuda/sample.cu)
for t in new:. old:/tmp/old; do n=${t%%:*}; d=${t#*:}
	(cmake -S $d -B /tmp/b-$n -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr \
		&& cmake --build /tmp/b-$n -j16 --target sample_bench test_sample) > $L/build-$n.log 2>&1 &
done; wait; ts "built"
timeout 200 $(find /tmp/b-new -name test_sample -type f | head -1) > $L/test_sample.txt 2>&1; ts "test_sample rc=$? $(tail -1 $L/test_sample.txt)"
for r in 1 2; do for n in new old; do
	timeout 200 $(find /tmp/b-$n -name sample_bench -type f | head -1) 1 > $L/sb-$n-$r.txt 2>&1; ts "sample_bench $n $r rc=$?"
done; done
cat $L/sb-new-1.txt >> $S
(cd $OUT && tar czf logs.tgz log && rm -rf log)
