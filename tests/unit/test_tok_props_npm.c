/* test_tok_props_npm: tokenizer properties (test_tok_props.h) for Llama 3, Qwen3 and gpt-oss, whose
 * tokenizer.json files scripts/fetch-testdata.sh puts in $FP4S_CACHE_DIR; skips without them. */
#include "test_tok_props.h"

int main(void)
{
	t_seed_from_env();
	char p[1024];
	int ran = 0;
	struct named_tok nt;

	if (open_named(&nt, "llama3", tt_cache_path(p, sizeof p, "tokenizer-llama3", "tokenizer.json"), 0)) {
		ran++;
		expect_ids(&nt, "Hello world", 0, (int32_t[]){9906, 1917}, 2);
		expect_ids(&nt, "<|begin_of_text|>hi<|eot_id|>", FP4S_TOK_PARSE_SPECIAL,
			   (int32_t[]){128000, 6151, 128009}, 3);
		CHECK_EQ_INT(fp4s_tok_bos(nt.tok), 128000);
		CHECK(has_stop(&nt, 128001) && has_stop(&nt, 128009)); /* 3.0 has no <|eom_id|> */
		CHECK_EQ_STR(fp4s_chat_format_name(fp4s_tok_chat(nt.tok)->format), "llama3");
		skip_special(&nt, "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", "user\n\nhi");
		random_props(&nt, 400);
		big_inputs(&nt);
		lookalikes(&nt, "<|eot_id|>", "<|eot_id");
		fp4s_tok_close(nt.tok);
	}
	if (open_named(&nt, "qwen3", tt_cache_path(p, sizeof p, "tokenizer-qwen3", "tokenizer.json"), 1)) {
		ran++;
		/* single digits; NFC: e + U+0301 encodes as é */
		expect_ids(&nt, "Hello world", 0, (int32_t[]){9707, 1879}, 2);
		struct fp4s_tok_ids a = {0}, b = {0};
		struct fp4s_error err = {0};
		fp4s_tok_encode(nt.tok, "caf\xC3\xA9", 5, 0, &a, &err);
		fp4s_tok_encode(nt.tok, "cafe\xCC\x81", 6, 0, &b, &err);
		CHECK(a.n == b.n && a.n && !memcmp(a.v, b.v, a.n * sizeof *a.v));
		fp4s_tok_ids_free(&a);
		fp4s_tok_ids_free(&b);
		expect_ids(&nt, "<tool_call>", 0, (int32_t[]){151657}, 1); /* non-special added token */
		CHECK_EQ_INT(fp4s_tok_bos(nt.tok), -1);
		CHECK_EQ_INT(fp4s_tok_adds_bos(nt.tok), 0);
		CHECK(has_stop(&nt, 151645) && has_stop(&nt, 151643));
		CHECK_EQ_STR(fp4s_chat_format_name(fp4s_tok_chat(nt.tok)->format), "qwen3");
		random_props(&nt, 400);
		big_inputs(&nt);
		lookalikes(&nt, "<|im_start|>", "<|im_start");
		fp4s_tok_close(nt.tok);
	}
	if (open_named(&nt, "gpt-oss", tt_cache_path(p, sizeof p, "tokenizer-gptoss", "tokenizer.json"), 0)) {
		ran++;
		CHECK(has_stop(&nt, 200002) && has_stop(&nt, 200012));
		CHECK_EQ_STR(fp4s_chat_format_name(fp4s_tok_chat(nt.tok)->format), "harmony");
		expect_ids(&nt, "<|start|>user<|message|>", FP4S_TOK_PARSE_SPECIAL, (int32_t[]){200006, 1428, 200008}, 3);
		random_props(&nt, 400);
		big_inputs(&nt);
		lookalikes(&nt, "<|channel|>", "<|channel");
		fp4s_tok_close(nt.tok);
	}
	if (!ran)
		TEST_SKIP("no npm tokenizer in $FP4S_CACHE_DIR/npm (run scripts/fetch-testdata.sh)");
	return TEST_DONE();
}
