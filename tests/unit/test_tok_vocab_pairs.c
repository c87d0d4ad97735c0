/* test_tok_vocab_pairs: llama.cpp's tokenizer test pairs against the tokenizers in ../shared/realdata
 * (test_tok_vocab_llama3 runs llama-bpe with the npm Llama 3 tokenizer.json).
 *   llama-spm  Llama 2 (realdata llama2-tokenizer/tokenizer.bin, llama2.c's export; and the GGUF)
 *   gpt-2      GPT-2 (the vocab-only ggml-vocab-gpt-2.gguf's tokenizer metadata)
 * The .inp files hold 46 strings, each followed by the separator (so splitting gives 46 + an empty
 * remainder). Every pair found must pass all its cases; the test skips only when no pair's data is present. */
#include "test_tok_common.h"
#include "test_util.h"

int main(void)
{
	char p[1024];
	int ran = 0;
	tt_vocab_pair("llama-spm", tt_shared_path(p, sizeof p, "realdata/llama2-tokenizer/tokenizer.bin"), &ran);
	/* the same pairs through the vocab-only GGUF files' tokenizer metadata */
	tt_vocab_pair("llama-spm", tt_shared_path(p, sizeof p, "realdata/tokenizer-tests/ggml-vocab-llama-spm.gguf"), &ran);
	/* Phi-3's pair is byte-identical to llama-spm's (Phi-3 uses the Llama 2 vocabulary) */
	tt_vocab_pair("phi-3", tt_shared_path(p, sizeof p, "realdata/llama2-tokenizer/tokenizer.bin"), &ran);
	tt_vocab_pair("gpt-2", tt_shared_path(p, sizeof p, "realdata/tokenizer-tests/ggml-vocab-gpt-2.gguf"), &ran);
	if (!ran)
		TEST_SKIP("no tokenizer test data in $FP4S_SHARED_DIR/realdata");
	return TEST_DONE();
}
