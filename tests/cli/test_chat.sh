#!/usr/bin/env bash
# test_chat.sh FP4SERVE: `fp4serve chat` on a `gen` tiny model (CPU backend): two turns from
# stdin each print a reply, the session ends on an empty line, and greedy replies are the same
# run to run. A model without a chat format would be an error message, not a crash.
set -u
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() { if eval "$2"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
"$bin" gen --preset tiny-llama3 --seed 3 "$tmp/m" > /dev/null 2>&1
check "gen tiny-llama3" '[ -f "$tmp/m/config.json" ]'
printf 'hello there\nand again\n\n' | "$bin" chat -m "$tmp/m" --backend cpu -n 8 --temperature 0 \
  > "$tmp/out1" 2> "$tmp/err1"
check "chat exits 0" '[ $? = 0 ]'
check "two replies (two lines)" '[ $(wc -l < "$tmp/out1") -ge 2 ]'
check "the prompt marker went to stderr, not stdout" '! grep -q "^> " "$tmp/out1" && grep -q "> " "$tmp/err1"'
printf 'hello there\nand again\n\n' | "$bin" chat -m "$tmp/m" --backend cpu -n 8 --temperature 0 \
  > "$tmp/out2" 2> /dev/null
check "greedy chat is reproducible" 'cmp -s "$tmp/out1" "$tmp/out2"'
printf 'hi\n' | "$bin" chat -m "$tmp/nonexistent" > /dev/null 2> "$tmp/err3"
check "missing model: exit 1 with a message" '[ $? = 1 ] && [ -s "$tmp/err3" ]'
echo "$pass passed, $fail failed"
[ $fail = 0 ]
