#!/usr/bin/env bash
# gpu-e2e.sh OUT [BUILD]: end-to-end figures on a GPU machine for real-geometry models made by
# `fp4serve gen` (random weights): start-up to first token, `fp4serve bench` (pp512; decode at
# short context and at 4096; 64 sequences decoded together), and the server under load (64 and
# 200 streaming clients on loopback). Logs to OUT. BUILD is a build folder with fp4serve (default
# build).
set -u
out=${1:?usage: bench/gpu-e2e.sh OUT [BUILD]}
b=${2:-build}
bin=$b/fp4serve
mkdir -p "$out"
models=${FP4S_E2E_MODELS-"llama3-8b:nvfp4 gpt-oss-20b:mxfp4 qwen3-30b-a3b:nvfp4"}
for m in $models; do
  preset=${m%%:*} fmt=${m##*:}
  dir=/tmp/fp4s-$preset-$fmt
  [ -d "$dir" ] || "$bin" gen --preset "$preset" --format "$fmt" "$dir" > /dev/null 2>&1
  echo "== $preset ($fmt)" | tee -a "$out/e2e.txt"
  TIMEFORMAT="start to first token: %R s (fp4serve run, 1 new token, whole process, page cache warm)"
  { time "$bin" run -m "$dir" -p "Hello" -n 1 --temperature 0 > /dev/null 2>&1; } 2>&1 | tee -a "$out/e2e.txt"
  "$bin" bench -m "$dir" -p 512 -n 128 --reps 3 2>&1 | tail -5 | tee -a "$out/e2e.txt"
  "$bin" bench -m "$dir" -p 0 --ctx 4096 -n 64 --reps 2 2>&1 | tail -3 | tee -a "$out/e2e.txt"
  "$bin" bench -m "$dir" -p 512 -n 64 --reps 2 --batch 64 2>&1 | grep "^tg" | tee -a "$out/e2e.txt"
done
if [ "${FP4S_E2E_SERVER:-1}" = 1 ]; then
  dir=${FP4S_E2E_SERVE_MODEL:-/tmp/fp4s-llama3-8b-nvfp4}
  for run in "64 ${FP4S_E2E_SECONDS64:-30}" "200 ${FP4S_E2E_SECONDS:-60}"; do
    set -- $run
    clients=$1 secs=$2
    log=$out/server-$clients.log
    "$bin" serve -m "$dir" --backend ${FP4S_E2E_BACKEND:-cuda} --port 0 --max-model-len 1024 --max-num-seqs 64 \
      --threads-http $((clients + 32)) > "$log" 2>&1 &
    pid=$!
    port=
    for _ in $(seq 1 600); do
      port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | head -1 | sed 's/.*://')
      [ -n "$port" ] && python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/health')" 2>/dev/null && break
      sleep 0.2
    done
    echo "== server load, llama3-8b nvfp4, $clients clients" | tee -a "$out/e2e.txt"
    python3 bench/load_test.py --port "$port" --clients "$clients" --seconds "$secs" \
      --prompt-tokens 512 --max-tokens 256 2>&1 | tee -a "$out/e2e.txt"
    python3 -c "import urllib.request; print(''.join(l for l in urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode().splitlines(True) if l.startswith(('fp4serve:num_requests','fp4serve:kv_cache'))))" | tee -a "$out/e2e.txt"
    kill -TERM $pid; wait $pid
    echo "server exit status $?" | tee -a "$out/e2e.txt"
  done
fi
