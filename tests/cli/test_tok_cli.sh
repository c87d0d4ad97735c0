#!/usr/bin/env bash
# test_tok_cli.sh: `fp4serve tokenize` / `detokenize` end to end: ids on one line and nothing else on
# stdout, text from arguments, -f and stdin, --add-special, round trip, errors. Uses stories260K's
# tok512.bin (realdata) and, when fetched, the Llama 3 tokenizer.json. Usage: test_tok_cli.sh FP4SERVE
set -u
bin=$1
shared=${FP4S_SHARED_DIR:-../shared}
cache=${FP4S_CACHE_DIR:-.cache}
tok=$shared/realdata/stories260K/tok512.bin
[ -f "$tok" ] || { echo "SKIP: $tok missing"; exit 77; }
fail=0
check() { # name, got, want
  if [ "$2" == "$3" ]; then echo "ok   $1"; else echo "FAIL $1: got [$2] want [$3]"; fail=1; fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ids=$("$bin" tokenize --tokenizer "$tok" "Once upon a time, there was a little girl.")
[[ "$ids" =~ ^[0-9]+(\ [0-9]+)*$ ]] && echo "ok   ids format" || { echo "FAIL ids format: [$ids]"; fail=1; }
check "round trip" "$("$bin" detokenize --tokenizer "$tok" $ids)" "Once upon a time, there was a little girl."
check "detokenize stdin" "$(echo "$ids" | "$bin" detokenize --tokenizer "$tok")" "Once upon a time, there was a little girl."
check "add-special BOS" "$("$bin" tokenize --tokenizer "$tok" --add-special "Once" | cut -d' ' -f1)" "1"
check "skip-special" "$("$bin" detokenize --tokenizer "$tok" --skip-special 1 $ids)" "Once upon a time, there was a little girl."
printf 'Lily\nwent' >"$tmp/in.txt"
check "-f file" "$("$bin" tokenize --tokenizer "$tok" -f "$tmp/in.txt")" "$(printf 'Lily\nwent' | "$bin" tokenize --tokenizer "$tok")"
check "-f round trip" "$("$bin" detokenize --tokenizer "$tok" $("$bin" tokenize --tokenizer "$tok" -f "$tmp/in.txt"))" "$(cat "$tmp/in.txt")"
check "empty text" "$("$bin" tokenize --tokenizer "$tok" "")" ""
out=$("$bin" tokenize --tokenizer "$tmp/nope.json" "x" 2>/dev/null); rc=$?
check "missing tokenizer: exit code" "$rc" "1"
check "missing tokenizer: stdout empty" "$out" ""
"$bin" detokenize --tokenizer "$tok" 99999 >/dev/null 2>&1; check "bad id: exit code" "$?" "2"
"$bin" tokenize "x" >/dev/null 2>&1; check "no tokenizer given: exit code" "$?" "2"

l3=$cache/npm/tokenizer-llama3/package/models/tokenizer.json
if [ -f "$l3" ]; then
  check "llama3 Hello world" "$("$bin" tokenize --tokenizer "$l3" "Hello world")" "9906 1917"
  check "llama3 model dir" "$("$bin" tokenize -m "$(dirname "$l3")" "<|eot_id|>")" "128009"
  ids=$("$bin" tokenize -m "$(dirname "$l3")" --no-parse-special "<|eot_id|>")
  [[ " $ids " != *" 128009 "* && $(echo $ids | wc -w) -gt 1 ]] && echo "ok   llama3 no-parse-special" ||
    { echo "FAIL llama3 no-parse-special: [$ids]"; fail=1; }
  check "llama3 detokenize specials" "$("$bin" detokenize -m "$(dirname "$l3")" 128000 9906 128009)" "<|begin_of_text|>Hello<|eot_id|>"
else
  echo "note: $l3 missing (scripts/fetch-testdata.sh); Llama 3 checks not run"
fi
exit $fail
