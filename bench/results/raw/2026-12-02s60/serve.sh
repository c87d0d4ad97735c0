#!/bin/bash
# The server under more clients than slots (requests wait while every slot decodes): llama3-8b NVFP4,
# --max-num-seqs SEQS (16), CLIENTS (32) streaming clients of 128-token prompts and 128 new tokens,
# T 0.8 / top_p 0.9, SECS (15) s; steps ahead (the default) and FP4S_LOOKAHEAD=0, interleaved, ROUNDS (2).
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
L=$OUT/log; mkdir -p $L; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" | tee -a $S; }
git log -1 --format='%H %s' > $L/commit.txt; git status --short >> $L/commit.txt
cmake -S . -B /tmp/b-base -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr \
	> $L/build.log 2>&1 && cmake --build /tmp/b-base -j16 --target fp4serve >> $L/build.log 2>&1
ts "build rc=$?"
B=/tmp/b-base/fp4serve
[ -d /dev/shm/llama3-8b ] || $B gen --preset llama3-8b --format nvfp4 /dev/shm/llama3-8b > $L/gen.log 2>&1
for r in $(seq ${ROUNDS:-2}); do for v in la:1 nola:0; do n=${v%%:*}
	FP4S_LOOKAHEAD=${v#*:} $B serve -m /dev/shm/llama3-8b --port 0 --max-model-len 1024 --max-num-seqs ${SEQS:-16} \
		--threads-http 64 > $L/serve-$n-$r.log 2>&1 &
	pid=$!; port=
	for _ in $(seq 1 300); do
		port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' $L/serve-$n-$r.log | head -1 | sed 's/.*://')
		[ -n "$port" ] && python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health')" 2>/dev/null && break
		sleep 0.2
	done
	python3 bench/load_test.py --port "$port" --clients ${CLIENTS:-32} --seconds ${SECS:-15} --prompt-tokens 128 \
		--max-tokens 128 --temperature 0.8 --top-p 0.9 > $L/load-$n-$r.txt 2>&1
	ts "server $n $r: $(tr '\n' ' ' < $L/load-$n-$r.txt | cut -c1-400)"
	kill -TERM $pid; wait $pid
done; done
(cd $OUT && tar czf logs.tgz log && rm -rf log)
