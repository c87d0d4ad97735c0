#!/usr/bin/env bash
# test_server.sh: `fp4serve serve` end to end on loopback with the --demo model (CPU backend):
# the official openai npm client (if scripts/fetch-server-testdata.sh installed it), every bad
# input over raw HTTP, a short load run (32 streaming clients, 8 s; the 60 s / 200-client run is
# scripts/server-load.sh), API key from the environment and from a file, SIGTERM draining a
# live stream, --logprobs-mode. Needs node (skips with 77 without it) and curl.
set -u
bin=$1
src=${FP4S_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
cache=${FP4S_CACHE_DIR:-$src/.cache}
command -v node >/dev/null 2>&1 || { echo "skip: node not found"; exit 77; }
command -v curl >/dev/null 2>&1 || { echo "skip: curl not found"; exit 77; }
tmp=$(mktemp -d /tmp/fp4s-srv-XXXXXX)
ldd "$bin" 2>/dev/null | grep -q libasan && export FP4S_LOAD_NO_RSS=1 # RSS means nothing under ASan
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

# start_server LOG ARGS...: starts a server on a free port; sets $port and $pid
start_server() {
	local log=$1
	shift
	"$bin" serve --demo --port 0 "$@" >"$log" 2>&1 &
	pid=$!
	pids+=("$pid")
	port=
	for _ in $(seq 1 300); do
		port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | head -1 | sed 's/.*://')
		[ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	echo "server did not start:"; cat "$log"
	return 1
}

# 1. main server: key from the environment, short read timeout for the slow-client cases
key=test-key-$RANDOM$RANDOM
FP4SERVE_API_KEY=$key start_server "$tmp/main.log" --read-timeout 3 --max-model-len 4096 --max-num-seqs 32 || exit 1
main_pid=$pid main_port=$port
curl -s "http://127.0.0.1:$port/v1/models" | grep -q '"code":401' && ok "FP4SERVE_API_KEY protects /v1/models" || bad "env key"
curl -s -H "Authorization: Bearer $key" "http://127.0.0.1:$port/v1/models" | grep -q '"demo":true' \
	&& ok "/v1/models says it is a random demo model" || bad "/v1/models demo flag"
node "$src/tests/server/raw_http.mjs" "$port" "$key" 3 4096 || bad "raw_http.mjs"
if [ -f "$cache/npm/openai/.done" ]; then
	node "$src/tests/server/openai_client.mjs" "$cache/npm/openai" "$port" "$key" || bad "openai_client.mjs"
else
	echo "skip: openai npm client not installed (scripts/fetch-server-testdata.sh)"
fi
node "$src/tests/server/load.mjs" "$port" "$key" 32 "${FP4S_SERVER_LOAD_S:-8}" "$main_pid" || bad "load.mjs"
# the decode steps enqueued ahead: some under FP4S_LOOKAHEAD=1 (the load's sampled requests too);
# otherwise the count is there (0 on the CPU backend, whose default is off)
taken=$(curl -s -H "Authorization: Bearer $key" "http://127.0.0.1:$port/metrics" |
	sed -n 's/^fp4serve:decode_steps_ahead_total{.*outcome="taken"} \([0-9]*\)$/\1/p')
if [ "${FP4S_LOOKAHEAD:-0}" = 1 ]; then
	[ -n "$taken" ] && [ "$taken" -gt 0 ] && ok "metrics: $taken decode steps taken ahead" || bad "steps ahead: '$taken'"
else
	[ -n "$taken" ] && ok "metrics: $taken decode steps taken ahead" || bad "steps ahead: no metric"
fi
kill -0 "$main_pid" 2>/dev/null && ok "server still running after all of it" || bad "server died"
grep -qiE "AddressSanitizer|runtime error" "$tmp/main.log" && { bad "sanitizer report"; cat "$tmp/main.log"; }

# 2. SIGTERM drains: a live stream gets its end ([DONE]), the server exits 0
printf '%s\n' "  $key-file  " >"$tmp/keyfile"
start_server "$tmp/drain.log" --api-key-file "$tmp/keyfile" --drain-timeout 2 --max-model-len 4096 || exit 1
curl -sN -H "Authorization: Bearer $key-file" -H 'Content-Type: application/json' \
	-d '{"prompt":"Once","max_tokens":4000,"ignore_eos":true,"stream":true}' \
	"http://127.0.0.1:$port/v1/completions" >"$tmp/stream.out" 2>/dev/null &
cpid=$!
for _ in $(seq 1 100); do grep -q '^data: {' "$tmp/stream.out" && break; sleep 0.05; done
curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/models" | grep -q 401 \
	&& ok "--api-key-file protects /v1/models" || bad "key file"
kill -TERM "$pid"
wait "$pid"
rc=$?
wait "$cpid"
[ $rc = 0 ] && ok "SIGTERM: exit 0" || bad "SIGTERM exit $rc"
tail -c 200 "$tmp/stream.out" | grep -q 'data: \[DONE\]' && ok "SIGTERM: the live stream ended with [DONE]" \
	|| { bad "stream not finished"; tail -c 300 "$tmp/stream.out"; }
grep -q '"finish_reason":"length"\|unavailable_error' "$tmp/stream.out" && ok "SIGTERM: the stream got a final event" || bad "no final event"
grep -qiE "AddressSanitizer|LeakSanitizer|runtime error" "$tmp/drain.log" && { bad "sanitizer report"; cat "$tmp/drain.log"; }

# 3. gpt-oss demo: harmony chat format, reasoning_content field present (a server with no
# --timeout: under ASan on a loaded 2-core machine this short chat took more than 1 s)
start_server "$tmp/oss0.log" --demo-preset tiny-gpt-oss --max-model-len 4096 || exit 1
out=$(curl -s -H 'Content-Type: application/json' -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":8,"reasoning_effort":"low"}' \
	"http://127.0.0.1:$port/v1/chat/completions")
echo "$out" | grep -q '"reasoning_content"' && ok "gpt-oss: harmony response has reasoning_content" || bad "gpt-oss chat: $out"
kill -TERM "$pid"; wait "$pid" && ok "gpt-oss server: clean exit" || bad "gpt-oss exit"
grep -qiE "AddressSanitizer|LeakSanitizer|runtime error" "$tmp/oss0.log" && { bad "sanitizer report"; cat "$tmp/oss0.log"; }
# with a 1 s --timeout: a long generation is cut and answered 503 / an error event
start_server "$tmp/oss.log" --demo-preset tiny-gpt-oss --max-model-len 4096 --timeout 1 || exit 1
out=$(curl -s -w ' %{http_code}' -H 'Content-Type: application/json' -d '{"prompt":"a","max_tokens":4000,"ignore_eos":true}' \
	"http://127.0.0.1:$port/v1/completions")
echo "$out" | grep -q 'timed out.* 503$' && ok "--timeout: a long request is cut with 503" || bad "timeout: ${out:0:200}"
out=$(curl -sN -H 'Content-Type: application/json' -d '{"prompt":"a","max_tokens":4000,"ignore_eos":true,"stream":true}' \
	"http://127.0.0.1:$port/v1/completions")
echo "$out" | tail -c 300 | grep -q 'timed out' && echo "$out" | tail -c 20 | grep -q 'data: \[DONE\]' \
	&& ok "--timeout: a long stream ends with an error event and [DONE]" || bad "stream timeout: $(echo "$out" | tail -c 200)"
kill -TERM "$pid"; wait "$pid" && ok "gpt-oss server: clean exit" || bad "gpt-oss exit"
grep -qiE "AddressSanitizer|LeakSanitizer|runtime error" "$tmp/oss.log" && { bad "sanitizer report"; cat "$tmp/oss.log"; }

# 4. --logprobs-mode: processed logprobs are of the distribution sampled from, so with top_k 1
# every token's is log 1 = 0 (raw ones, the default, are the model's log-softmax: below 0)
lpq='{"prompt":"Once","max_tokens":3,"ignore_eos":true,"temperature":1,"top_k":1,"logprobs":2}'
lpcheck='let d="";process.stdin.on("data",c=>d+=c).on("end",()=>{const l=JSON.parse(d).choices[0].logprobs;
const v=l.token_logprobs;process.exit(v.length===3&&v.every(x=>process.argv[1]==="0"?x===0:x<0)&&l.top_logprobs.length===3?0:1)})'
curl -s -H "Authorization: Bearer $key" -H 'Content-Type: application/json' -d "$lpq" \
	"http://127.0.0.1:$main_port/v1/completions" | node -e "$lpcheck" neg \
	&& ok "raw logprobs (default) with top_k 1 are below 0" || bad "raw logprobs"
start_server "$tmp/lp.log" --logprobs-mode processed_logprobs || exit 1
curl -s -H 'Content-Type: application/json' -d "$lpq" "http://127.0.0.1:$port/v1/completions" | node -e "$lpcheck" 0 \
	&& ok "--logprobs-mode processed_logprobs: top_k 1 gives logprob 0" || bad "processed logprobs"
kill -TERM "$pid"; wait "$pid" && ok "logprobs-mode server: clean exit" || bad "logprobs-mode exit"
"$bin" serve --demo --port 0 --logprobs-mode logits >"$tmp/lpbad.log" 2>&1 \
	&& bad "--logprobs-mode logits accepted" || { grep -q "raw_logprobs or processed_logprobs" "$tmp/lpbad.log" \
	&& ok "--logprobs-mode rejects an unknown mode" || bad "lpbad: $(cat "$tmp/lpbad.log")"; }

# the main server drains too
kill -TERM "$main_pid"; wait "$main_pid" && ok "main server: clean exit after the tests" || { bad "main server exit"; tail -20 "$tmp/main.log"; }
grep -qiE "LeakSanitizer" "$tmp/main.log" && { bad "leaks"; grep -A20 LeakSanitizer "$tmp/main.log"; }
[ $fail = 0 ] && echo "test_server: all passed" || echo "test_server: FAILED"
exit $fail
