#!/bin/bash
# Session 47's device calls (session 46's script): the tree built once (/tmp/b-base, with TESTS), the tests run (TARGS their
# arguments), then each of MODELS generated (/dev/shm; gpt-oss as MXFP4, the rest NVFP4) and benched
# with the whole-step kernel: tg128 (3 reps) and depth 4096 (-n 64, 2 reps), RUNS rounds; LAYERS=1
# adds the layer path's (FP4S_MSTEP=0) in each round, TL=l the step's phase marks at layer l (of build TLB, default base, or model=build entries; TLE the variables, default FP4S_OSTEP_TL). VARIANTS ("name:nvcc flags", commas between
# flags; name.patch in this folder applied to a copy of the tree) adds builds benched the same way;
# VTESTS (tests, TARGS their arguments) are built and run in each variant too (in those VT names, where
# set). A VARIANTS entry "name:flags:m1,m2" is benched on those models only (all of MODELS otherwise).
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
L=$OUT/log; mkdir -p $L; S=$OUT/sum.txt
ts() { echo "$(date +%T) $*" | tee -a $S; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader > $L/gpu.txt 2>&1
PD=$(cd "$(dirname "$0")" && pwd)
MODELS=${MODELS:-gpt-oss-20b}
bld() { # name, source, flags, targets
	cmake -S $2 -B /tmp/b-$1 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr \
		"-DCMAKE_CUDA_FLAGS=$3" > $L/build-$1.log 2>&1 && cmake --build /tmp/b-$1 -j16 --target $4 >> $L/build-$1.log 2>&1
	ts "build $1 ($3) rc=$?"; }
bld base . "" "fp4serve ${TESTS:-}"
grep -E 'error|ptxas.*os_kernel' -A2 $L/build-base.log | head -20 >> $S
( for m in $MODELS; do f=nvfp4; case $m in gpt-oss*) f=mxfp4;; esac
	[ -d /dev/shm/$m ] || /tmp/b-base/fp4serve gen --preset $m --format $f /dev/shm/$m > $L/gen-$m.log 2>&1; ts "gen $m rc=$?"; done ) &
V=base
declare -A VMOD
for v in ${VARIANTS:-}; do n=${v%%:*}; f=${v#*:}; case $f in *:*) VMOD[$n]=" ${f#*:} "; VMOD[$n]=${VMOD[$n]//,/ }; f=${f%%:*};; esac
	f=${f//,/ }; src=.
	if [ -f $PD/${n%%-*}.patch ]; then src=/tmp/src-$n; rm -rf $src; mkdir -p $src
		tar --exclude=./build --exclude=./.git -cf - . | (cd $src && tar xf -)
		(cd $src && patch -p1 < $PD/${n%%-*}.patch > /dev/null) || ts "patch $n failed"; fi
	bld $n $src "$f" "fp4serve ${VTESTS:-}"; grep -E "error" -A2 $L/build-$n.log | head -10 >> $S; V="$V $n"; done
for t in ${TESTS:-}; do
	x=$(find /tmp/b-base -name $t -type f | head -1)
	timeout ${TT:-300} $x ${TARGS:-} > $L/t-$t.txt 2>&1; ts "$t rc=$?"
	grep -E "pool:|requests equal|FAIL|differ|request|did not|error|stuck" $L/t-$t.txt | head -30 | tee -a $S
done
for n in $V; do [ $n = base ] && continue; [ -n "${VT:-}" ] && [[ " $VT " != *" $n "* ]] && continue; for t in ${VTESTS:-}; do
	x=$(find /tmp/b-$n -name $t -type f | head -1)
	timeout ${TT:-300} $x ${TARGS:-} > $L/t-$t-$n.txt 2>&1; ts "$t ($n) rc=$?"
	grep -E "pool:|requests equal|FAIL|differ|request|did not|error|stuck" $L/t-$t-$n.txt | head -30 | tee -a $S
done; done
wait
bench() { local lab=$1; shift; timeout 200 env "$@" > $L/b-$lab.txt 2>&1; echo "rc=$?" >> $L/b-$lab.txt; ts "$lab $(grep -E '^(tg|pp)|rc=' $L/b-$lab.txt | tr '\n' ' ' | tail -c 200)"; }
for r in $(seq ${RUNS:-1}); do
	for m in $MODELS; do
		for n in $V; do
			[ -n "${VMOD[$n]:-}" ] && [[ "${VMOD[$n]}" != *" $m "* ]] && continue
			bench $m-$n-$r /tmp/b-$n/fp4serve bench -m /dev/shm/$m -p 0 -n 128 --reps 3
			bench $m-$n-d$r /tmp/b-$n/fp4serve bench -m /dev/shm/$m -p 0 --ctx 4096 -n 64 --reps 2
		done
		if [ -n "${TL:-}" ]; then # FP4S_OSTEP_TL=$TL's phase marks, tg128 and depth 4096
			tb=${TLB:-base}; for x in ${TLB:-}; do case $x in $m=*) tb=${x#*=};; *=*) ;; *) tb=$x;; esac; done
			echo "$m timeline of build $tb" >> $S
			bench $m-tl-$r $(for e in ${TLE:-FP4S_OSTEP_TL}; do printf "%s=%s " $e $TL; done) /tmp/b-$tb/fp4serve bench -m /dev/shm/$m -p 0 -n 128 --reps 3
			bench $m-tl-d$r $(for e in ${TLE:-FP4S_OSTEP_TL}; do printf "%s=%s " $e $TL; done) /tmp/b-$tb/fp4serve bench -m /dev/shm/$m -p 0 --ctx 4096 -n 64 --reps 2
			for x in tl- tl-d; do echo "$m $x" >> $S; awk '/step timeline/{f=1} f && /^(model|ceiling)/{f=0} f' $L/b-$m-$x$r.txt >> $S; done
		fi
		if [ -n "${LAYERS:-}" ]; then
			bench $m-A-$r FP4S_MSTEP=0 /tmp/b-base/fp4serve bench -m /dev/shm/$m -p 0 -n 128 --reps 3
			bench $m-A-d$r FP4S_MSTEP=0 /tmp/b-base/fp4serve bench -m /dev/shm/$m -p 0 --ctx 4096 -n 64 --reps 2
		fi
	done
done
(cd $OUT && tar czf logs.tgz log && rm -rf log)
