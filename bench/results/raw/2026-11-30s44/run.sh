#!/bin/bash
# Session 44's variant calls (session 43's run.sh): fp4serve built per VARIANTS entry ("name:nvcc flags", commas between flags, e.g.
# "ns9:-DDS_NS=9"; "base:" the default) in /tmp/b-name, each benched on MODELS (gen, /dev/shm)
# (VARIANT name.patch in PD, by default this script's folder: built from the tree with it applied) with the whole-step kernel: tg128 (3 reps) and depth 4096 (-n 64, 2 reps); LAYERS=1 adds
# FP4S_MSTEP=0 runs of the base build; TL=1 the first variant's timeline at layer 16; TESTS (e.g. test_mstep) built and run with the first variant.
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
L=$OUT/log; mkdir -p $L; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" | tee -a $S; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader > $L/gpu.txt 2>&1
MODELS=${MODELS:-llama3-8b}
PD=$(cd "${PD:-$(dirname "$0")}" && pwd) # the variants' patches (a later session's folder: PD=its folder, no copy of this script)
first=""
for v in ${VARIANTS:-base:}; do
	n=${v%%:*}; f=${v#*:}; f=${f//,/ } # flags comma-separated
	src=.
	if [ -f $PD/${n%%-*}.patch ]; then # a variant as a patch on the tree (name-x: x.patch too)
		src=/tmp/src-$n; rm -rf $src; mkdir -p $src
		tar --exclude=./build --exclude=./.git -cf - . | (cd $src && tar xf -)
		(cd $src && patch -p1 < $PD/${n%%-*}.patch > /dev/null) || ts "patch $n failed"
	fi
	cmake -S $src -B /tmp/b-$n -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr \
		"-DCMAKE_CUDA_FLAGS=$f" > $L/build-$n.log 2>&1 && cmake --build /tmp/b-$n -j16 --target fp4serve $([ -z "$first" ] && echo ${TESTS:-}) >> $L/build-$n.log 2>&1
	ts "build $n ($f) rc=$?"
	if [ -z "$first" ]; then first=$n
		( for m in $MODELS; do /tmp/b-$n/fp4serve gen --preset $m --format nvfp4 /dev/shm/$m > $L/gen-$m.log 2>&1; ts "gen $m rc=$?"; done ) &
	fi
done
for t in ${TESTS:-}; do
	x=$(find /tmp/b-$first -name $t -type f | head -1)
	timeout ${TT:-300} $x > $L/t-$t.txt 2>&1; ts "$t rc=$?"; grep -E "pool:|requests equal|FAIL|differ|request|did not" $L/t-$t.txt | head -30 | tee -a $S
done
wait
bench() { local lab=$1; shift; timeout 150 env "$@" > $L/b-$lab.txt 2>&1; echo "rc=$?" >> $L/b-$lab.txt; ts "$lab $(grep -E '^(tg|pp)|rc=' $L/b-$lab.txt | tr '\n' ' ' | tail -c 200)"; }
for r in $(seq ${RUNS:-1}); do
	for m in $MODELS; do
		for v in ${VARIANTS:-base:}; do n=${v%%:*}
			bench $m-$n-$r /tmp/b-$n/fp4serve bench -m /dev/shm/$m -p 0 -n 128 --reps 3
			bench $m-$n-d$r /tmp/b-$n/fp4serve bench -m /dev/shm/$m -p 0 --ctx 4096 -n 64 --reps 2
		done
		if [ -n "${TL:-}" ]; then # FP4S_DSTEP_TL=16's phase marks, tg128 and depth 4096
			bench $m-tl-$r FP4S_DSTEP_TL=16 /tmp/b-$first/fp4serve bench -m /dev/shm/$m -p 0 -n 128 --reps 3
			bench $m-tl-d$r FP4S_DSTEP_TL=16 /tmp/b-$first/fp4serve bench -m /dev/shm/$m -p 0 --ctx 4096 -n 64 --reps 2
			for x in tl- tl-d; do echo "$m $x" >> $S; awk '/dstep timeline/{f=1} f && /^(model|ceiling)/{f=0} f' $L/b-$m-$x$r.txt >> $S; done
		fi
		if [ -n "${LAYERS:-}" ]; then
			bench $m-A-$r FP4S_MSTEP=0 /tmp/b-$first/fp4serve bench -m /dev/shm/$m -p 0 -n 128 --reps 3
			bench $m-A-d$r FP4S_MSTEP=0 /tmp/b-$first/fp4serve bench -m /dev/shm/$m -p 0 --ctx 4096 -n 64 --reps 2
		fi
	done
done
(cd $OUT && tar czf logs.tgz log && rm -rf log)
