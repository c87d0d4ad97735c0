#!/usr/bin/env bash
# test_run_stories.sh FP4SERVE: the real stories260K model (llama2.c format, ../shared):
# greedy `run` from an empty prompt prints the story llama2.c prints, `perplexity` scores that
# story far lower than the same words shuffled, `bench --json` reports figures. Exit 77 without
# the shared data.
set -uo pipefail
bin=$1
dir=${FP4S_SHARED_DIR:-../shared}/realdata/stories260K
[ -f "$dir/stories260K.bin" ] || { echo "SKIP: $dir/stories260K.bin not found"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() { if eval "$2"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }

"$bin" run -m "$dir/stories260K.bin" -n 200 --temperature 0 > "$tmp/story.txt" 2> "$tmp/err.txt"
check "run exits 0" '[ $? = 0 ]'
check "the llama2.c story" 'head -c 53 "$tmp/story.txt" | grep -qx "Once upon a time, there was a little girl named Lily."'
check "stdout holds only the text (no log lines)" '! grep -q "tok/s" "$tmp/story.txt"'
check "200 tokens of text" '[ $(wc -c < "$tmp/story.txt") -gt 300 ]'

tr ' ' '\n' < "$tmp/story.txt" | awk 'BEGIN{srand(7)} {print rand() "\t" $0}' | sort | cut -f2 | tr '\n' ' ' > "$tmp/shuffled.txt"
p1=$("$bin" perplexity -m "$dir/stories260K.bin" -f "$tmp/story.txt" --ctx 256 2>/dev/null | awk '{print $2}')
p2=$("$bin" perplexity -m "$dir/stories260K.bin" -f "$tmp/shuffled.txt" --ctx 256 2>/dev/null | awk '{print $2}')
echo "perplexity: greedy story $p1, shuffled words $p2"
check "perplexity of its own greedy story is low" 'awk -v p="$p1" "BEGIN{exit !(p > 1 && p < 3)}"'
check "shuffled words score much worse" 'awk -v a="$p1" -v b="$p2" "BEGIN{exit !(b > 4 * a)}"'

"$bin" bench -m "$dir/stories260K.bin" -p 64 -n 32 --reps 2 --json > "$tmp/bench.json"
check "bench --json" 'grep -q "\"tg_tok_s\":[0-9]" "$tmp/bench.json" && grep -q "\"pp_tok_s\":[0-9]" "$tmp/bench.json"'
"$bin" bench -m "$dir/stories260K.bin" -p 16 -n 8 --reps 1 --batch 4 --json > "$tmp/bench4.json"
check "bench --batch 4" 'grep -q "\"batch\":4," "$tmp/bench4.json" && grep -q "\"tg_tok_s\":[1-9]" "$tmp/bench4.json"'
"$bin" bench -m "$dir/stories260K.bin" --batch 0 > /dev/null 2>&1
check "bench --batch 0: exit 2" '[ $? = 2 ]'

"$bin" run -m "$dir/stories260K.bin" --temperature 1.5 --top-p 2 -p hi > /dev/null 2> "$tmp/bad.txt"
check "bad flag value: exit 2 with a message" '[ $? = 2 ] && grep -q "top-p" "$tmp/bad.txt"'
"$bin" run -m /nonexistent > /dev/null 2> "$tmp/bad.txt"
check "missing model: exit 1 with a message" '[ $? = 1 ] && [ -s "$tmp/bad.txt" ]'
echo "$pass passed, $fail failed"
[ $fail = 0 ]
