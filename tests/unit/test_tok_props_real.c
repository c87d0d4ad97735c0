/* test_tok_props_real: tokenizer properties (test_tok_props.h) for stories260K's tok512.bin and the
 * Llama 2 tokenizer.bin from ../shared/realdata; skips without them. */
#include "test_tok_props.h"

int main(void)
{
	t_seed_from_env();
	char p[1024];
	int ran = 0;
	struct named_tok nt;

	if (open_named(&nt, "stories260K", tt_shared_path(p, sizeof p, "realdata/stories260K/tok512.bin"), 0)) {
		ran++;
		CHECK_EQ_INT(fp4s_tok_n_vocab(nt.tok), 512);
		CHECK_EQ_INT(fp4s_tok_bos(nt.tok), 1);
		CHECK_EQ_INT(fp4s_tok_eos(nt.tok), 2);
		CHECK(has_stop(&nt, 2));
		spm_reference(&nt, p, 300);
		random_props(&nt, 300);
		big_inputs(&nt);
		fp4s_tok_close(nt.tok);
	}
	if (open_named(&nt, "llama2", tt_shared_path(p, sizeof p, "realdata/llama2-tokenizer/tokenizer.bin"), 0)) {
		ran++;
		/* BOS is added with --add-special; decode drops the dummy-prefix space */
		expect_ids(&nt, "Hello world", FP4S_TOK_ADD_SPECIAL, (int32_t[]){1, 15043, 3186}, 3);
		skip_special(&nt, "Hello world", "Hello world");
		CHECK_EQ_INT(fp4s_tok_find(nt.tok, "<s>"), 1);
		spm_reference(&nt, p, 60);
		random_props(&nt, 300);
		big_inputs(&nt);
		fp4s_tok_close(nt.tok);
	}
	if (!ran)
		TEST_SKIP("no tokenizer in $FP4S_SHARED_DIR/realdata");
	return TEST_DONE();
}
