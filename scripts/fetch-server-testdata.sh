#!/usr/bin/env bash
# fetch-server-testdata.sh: install the official `openai` npm client into the git-ignored test
# cache ($FP4S_CACHE_DIR, default <repo>/.cache)/npm/openai, for tests/server/*.mjs. Idempotent.
# Fails softly: without npm or the registry it says so and exits 0; the client part of
# tests/cli/test_server.sh then skips and the raw-HTTP part still runs.
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${FP4S_CACHE_DIR:-$repo/.cache}
dir=$cache/npm/openai
spec=openai@5.23.2
if [ -f "$dir/.done" ] && [ "$(cat "$dir/.done")" = "$spec" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "fetch-server-testdata: npm not found; the openai-client server tests will skip"
  exit 0
fi
rm -rf "$dir"
mkdir -p "$dir" || exit 0
if (cd "$dir" && echo '{"private":true}' >package.json &&
  npm install --silent --no-audit --no-fund "$spec" >/dev/null 2>&1); then
  echo "$spec" >"$dir/.done"
  echo "fetch-server-testdata: $spec -> $dir"
else
  rm -rf "$dir"
  echo "fetch-server-testdata: could not install $spec (no registry?); the openai-client tests will skip"
fi
exit 0
