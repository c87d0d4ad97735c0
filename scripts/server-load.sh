#!/usr/bin/env bash
# server-load.sh [BINARY] [SECONDS] [CLIENTS] [serve flags...]: the bounded load test of
# `fp4serve serve --demo` on loopback (127.0.0.1 only): CLIENTS (default 200) concurrent
# streaming clients for SECONDS (default 60). Passes when there are 0 errors, /metrics is back
# to 0 running / 0 waiting / 0 KV blocks afterwards, the RSS does not grow after warm-up, the
# server exits 0 on SIGTERM and (sanitizer builds) its log holds no ASan/LSan/UBSan report.
# Prints p50/p99 time to first token and inter-token latency, and aggregate tok/s.
#   scripts/server-load.sh build/fp4serve 60            # the full run
#   scripts/server-load.sh build-asan/fp4serve 20       # the CI sanitizer variant
set -u
cd "$(dirname "$0")/.."
bin=${1:-build/fp4serve}
secs=${2:-60}
clients=${3:-200}
shift $(($# < 3 ? $# : 3))
command -v node >/dev/null 2>&1 || { echo "server-load: node not found"; exit 1; }
# a sanitizer build: RSS is not a leak signal there (ASan quarantine); LeakSanitizer is
ldd "$bin" 2>/dev/null | grep -q libasan && export FP4S_LOAD_NO_RSS=1
log=$(mktemp /tmp/fp4s-load-XXXXXX.log)
key=load-$RANDOM$RANDOM
# 200 clients: one HTTP thread each plus slack; the KV slots (max-num-seqs) bound the batch
"$bin" serve --demo --port 0 --api-key "$key" --max-model-len 512 --max-num-seqs 64 \
	--threads-http $((clients + 32)) "$@" >"$log" 2>&1 &
pid=$!
port=
for _ in $(seq 1 600); do
	port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | head -1 | sed 's/.*://')
	[ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
	kill -0 $pid 2>/dev/null || break
	sleep 0.1
done
[ -n "$port" ] || { echo "server-load: server did not start"; cat "$log"; exit 1; }
rc=0
node tests/server/load.mjs "$port" "$key" "$clients" "$secs" "$pid" || rc=1
kill -TERM $pid
wait $pid || { echo "server-load: server exit status $?"; rc=1; }
if grep -qE "AddressSanitizer|LeakSanitizer|runtime error" "$log"; then
	echo "server-load: sanitizer report:"; grep -A30 -E "AddressSanitizer|LeakSanitizer|runtime error" "$log" | head -60
	rc=1
fi
[ $rc = 0 ] && echo "server-load: passed" || { echo "server-load: FAILED (log $log)"; tail -20 "$log"; }
[ $rc = 0 ] && rm -f "$log"
exit $rc
