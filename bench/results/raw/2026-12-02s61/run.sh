#!/bin/bash
# Session 61's device calls: the tree built (.gpu-b/new: fp4serve and TESTS), and with HEAD=1 the same tree with
# src/ as .gpu-base/src.tgz has it (.gpu-b/head, fp4serve only, built while the tests run); the tests run
# (TARGS their arguments) while MODELS are generated (/dev/shm; gpt-oss as MXFP4, the rest NVFP4), then each
# model benched tg128 (3 reps) and at depth 4096 (-n 64, 2 reps) under each of ENVS ("name:VAR=value,..."; a
# name starting "head" runs the HEAD build), RUNS rounds, the ENVS interleaved within a round; BARGS: more
# bench arguments (e.g. "--temp 0.8 --top-p 0.9"). RUNV=1 adds `fp4serve run -v` under each of ENVS (RARGS), RUNVS
# rounds of it (each line with the graphs' capture times where FP4S_GRAPH_LOG=1).
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
L=$OUT/log; mkdir -p $L; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" | tee -a $S; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader > $L/gpu.txt 2>&1
git log -1 --format='%H %s' > $L/commit.txt 2>&1; git status --short >> $L/commit.txt 2>&1
MODELS=${MODELS:-llama3-8b}; B=$PWD/.gpu-b
cfg() { cmake -S $1 -B $2 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr; }
cfg . $B/new > $L/build.log 2>&1 && cmake --build $B/new -j16 --target fp4serve ${TESTS:-} >> $L/build.log 2>&1
ts "build rc=$?"; grep -E 'error' -A2 $L/build.log | head -20 >> $S
if [ -n "${HEAD:-}" ]; then ( rm -rf /tmp/hs && mkdir -p /tmp/hs && cp -r CMakeLists.txt tests dev tools scripts /tmp/hs/ &&
	tar xzf .gpu-base/src.tgz -C /tmp/hs && cfg /tmp/hs $B/head > $L/build-head.log 2>&1 &&
	cmake --build $B/head -j12 --target fp4serve >> $L/build-head.log 2>&1; ts "build head rc=$?" ) & fi
( for m in $MODELS; do f=nvfp4; case $m in gpt-oss*) f=mxfp4;; esac
	[ -d /dev/shm/$m ] || $B/new/fp4serve gen --preset $m --format $f /dev/shm/$m > $L/gen-$m.log 2>&1; ts "gen $m rc=$?"; done ) &
for t in ${TESTS:-}; do
	x=$(find $B/new -name $t -type f | head -1)
	timeout ${TT:-300} env FP4S_TEST_BACKEND=cuda FP4S_SOURCE_DIR=$PWD $x ${TARGS:-} > $L/t-$t.txt 2>&1; ts "$t rc=$?"
	grep -E "launched|steps ahead|pool:|requests equal|FAIL|differ|did not|error|stuck|passed|failed" $L/t-$t.txt | head -40 | tee -a $S
done
wait
bench() { local lab=$1; shift; timeout 200 env "$@" > $L/b-$lab.txt 2>&1; echo "rc=$?" >> $L/b-$lab.txt; ts "$lab $(grep -E '^(tg|pp)|rc=' $L/b-$lab.txt | tr '\n' ' ' | tail -c 200)"; }
bin() { case $1 in head*) echo $B/head/fp4serve;; *) echo $B/new/fp4serve;; esac; }
for r in $(seq ${RUNS:-1}); do
	for m in $MODELS; do
		for v in ${ENVS:-base:X=1}; do n=${v%%:*}; e=${v#*:}; e=${e//,/ }
			bench $m-$n-$r $e $(bin $n) bench -m /dev/shm/$m -p 0 -n 128 --reps 3 ${BARGS:-}
			bench $m-$n-d$r $e $(bin $n) bench -m /dev/shm/$m -p 0 --ctx 4096 -n 64 --reps 2 ${BARGS:-}
		done
	done
done
for rr in $(seq ${RUNVS:-1}); do for m in ${RUNV:+$MODELS}; do for v in ${ENVS:-base:X=1}; do n=${v%%:*}; e=${v#*:}; e=${e//,/ }
	timeout 120 env $e $(bin $n) run -v -m /dev/shm/$m -p "The history of the" -n 256 ${RARGS:---temperature 0} \
		--ignore-eos > $L/run-$m-$n-$rr.txt 2> $L/run-$m-$n-$rr.err
	ts "run $m $n $(grep -a 'generated' $L/run-$m-$n-$rr.err | tail -1) $(grep -a 'graph .* captured' $L/run-$m-$n-$rr.err | sed 's/cuda: graph //' | tr '\n' ' ')"; done; done; done
(cd $OUT && tar czf logs.tgz log && rm -rf log)
