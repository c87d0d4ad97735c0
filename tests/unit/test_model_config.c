/* test_model_config.c: config.json parsing (every architecture, rope scaling variants, layer
 * kinds), exclusion matching, table expansion, and the decode byte accounting of the presets
 * against performance.md §3.3-§3.5 (within 3 %), computed from config + tables, no files. */
#include <math.h>

#include "model/model.h"
#include "model/mwrite.h"
#include "test_util.h"

static double bytes_per_token(const char *preset, enum fp4s_qformat f, double *active)
{
	struct fp4s_config c;
	struct fp4s_error err = {0};
	struct fp4s_tspec *specs;
	struct fp4s_weight *w;
	int32_t n;
	CHECK_EQ_INT(fp4s_preset_config(preset, NULL, &c, &err), 0);
	CHECK_EQ_INT(fp4s_plan(&c, f, &specs, &w, &n, &err), 0);
	struct fp4s_model_stats s;
	fp4s_model_stats(&c, w, n, &s);
	if (active)
		*active = s.params_active;
	free(specs), free(w);
	fp4s_config_free(&c);
	return s.bytes_per_token;
}

static void check_within(const char *what, double got, double want, double tol)
{
	double rel = fabs(got - want) / want;
	printf("%-40s %.3f GB (performance.md %.2f GB, %+.2f %%)\n", what, got / 1e9, want / 1e9,
	       100.0 * (got - want) / want);
	CHECK_MSG(rel <= tol, "%s: %.4g vs %.4g", what, got, want);
}

static void test_bytes(void)
{
	double act;
	check_within("llama3-8b nvfp4 (BF16 lm_head)", bytes_per_token("llama3-8b", FP4S_QF_NVFP4, NULL),
	             4.98e9, 0.03);
	check_within("llama3-8b nvfp4-ct", bytes_per_token("llama3-8b", FP4S_QF_NVFP4_CT, NULL), 4.98e9,
	             0.03);
	check_within("llama3-8b bf16", bytes_per_token("llama3-8b", FP4S_QF_BF16, NULL), 15.0e9, 0.03);
	check_within("gpt-oss-20b mxfp4 (HF-native)", bytes_per_token("gpt-oss-20b", FP4S_QF_MXFP4, &act),
	             3.71e9, 0.03);
	CHECK_NEAR(act / 1e9, 3.6, 0.1); /* "≈ 3.6 B active" */
	check_within("gpt-oss-120b mxfp4 (HF-native)", bytes_per_token("gpt-oss-120b", FP4S_QF_MXFP4, NULL),
	             5.00e9, 0.03);
	check_within("qwen3-30b-a3b nvfp4 (BF16 lm_head)",
	             bytes_per_token("qwen3-30b-a3b", FP4S_QF_NVFP4, NULL), 2.18e9, 0.03);
	check_within("qwen3-30b-a3b bf16", bytes_per_token("qwen3-30b-a3b", FP4S_QF_BF16, &act), 6.08e9,
	             0.03);
	CHECK_NEAR(act / 1e9, 3.0, 0.1);
	check_within("qwen3-next-80b-a3b nvfp4 (all linears)",
	             bytes_per_token("qwen3-next-80b-a3b", FP4S_QF_NVFP4, NULL), 2.5e9, 0.03);
	check_within("qwen3-next-80b-a3b bf16", bytes_per_token("qwen3-next-80b-a3b", FP4S_QF_BF16, &act),
	             7.1e9, 0.03);
	CHECK_NEAR(act / 1e9, 3.5, 0.1);
	/* KV: 4K context of llama3-8b is 0.54 GB (performance.md §3.4) */
	struct fp4s_config c;
	struct fp4s_error err;
	CHECK_EQ_INT(fp4s_preset_config("llama3-8b", NULL, &c, &err), 0);
	check_within("llama3-8b KV at 4096", fp4s_kv_bytes(&c, 4096), 0.54e9, 0.03);
	fp4s_config_free(&c);
}

static int parse(const char *json, struct fp4s_config *c, struct fp4s_error *err)
{
	return fp4s_config_parse(json, strlen(json), "config.json", c, err);
}

static void test_configs(void)
{
	struct fp4s_config c;
	struct fp4s_error err = {0};
	/* llama with llama3 rope scaling, eos list, tied */
	CHECK_EQ_INT(parse("{\"model_type\":\"llama\",\"hidden_size\":2048,\"num_hidden_layers\":16,"
	                   "\"num_attention_heads\":32,\"num_key_value_heads\":8,\"head_dim\":64,"
	                   "\"intermediate_size\":8192,\"vocab_size\":128256,\"rope_theta\":500000.0,"
	                   "\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":32.0,\"low_freq_factor\":1.0,"
	                   "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192},"
	                   "\"tie_word_embeddings\":true,\"eos_token_id\":[128001,128008,128009],"
	                   "\"bos_token_id\":128000}",
	                   &c, &err),
	             0);
	CHECK_EQ_INT(c.rope.type, FP4S_ROPE_LLAMA3);
	CHECK_NEAR(c.rope.factor, 32.0, 0);
	CHECK_EQ_INT(c.rope.original_max_position_embeddings, 8192);
	CHECK_EQ_INT(c.tie_embeddings, 1);
	CHECK_EQ_INT(c.n_eos, 3);
	CHECK_EQ_INT(c.eos_token_ids[2], 128009);
	CHECK_NEAR(c.rms_eps, 1e-5, 0);
	struct fp4s_tspec *s;
	int32_t n;
	CHECK_EQ_INT(fp4s_tensors_expand(&c, &s, &n, &err), 0);
	CHECK_EQ_INT(n, 2 + 16 * 9); /* tied: no lm_head */
	free(s);
	fp4s_config_free(&c);
	/* gpt-oss: yarn, truncate false, explicit layer_types, aliases */
	CHECK_EQ_INT(fp4s_preset_config("gpt-oss-20b", NULL, &c, &err), 0);
	CHECK_EQ_INT(c.rope.type, FP4S_ROPE_YARN);
	CHECK_EQ_INT(c.rope.truncate, 0);
	CHECK_NEAR(c.rope.beta_fast, 32.0, 0);
	CHECK_EQ_INT(c.layer_kind[0], FP4S_LAYER_SLIDING);
	CHECK_EQ_INT(c.layer_kind[1], FP4S_LAYER_FULL);
	CHECK_EQ_INT(c.sliding_window, 128);
	CHECK_EQ_INT(c.n_experts, 32);
	CHECK_EQ_INT(c.attention_bias, 1);
	CHECK_NEAR(c.swiglu_limit, 7.0, 0);
	fp4s_config_free(&c);
	/* transformers v5 rope_parameters */
	CHECK_EQ_INT(parse("{\"model_type\":\"qwen3\",\"hidden_size\":1024,\"num_hidden_layers\":2,"
	                   "\"num_attention_heads\":16,\"num_key_value_heads\":8,\"head_dim\":128,"
	                   "\"intermediate_size\":3072,\"vocab_size\":151936,\"rope_parameters\":"
	                   "{\"rope_type\":\"yarn\",\"rope_theta\":1000000.0,\"factor\":4.0,"
	                   "\"original_max_position_embeddings\":32768}}",
	                   &c, &err),
	             0);
	CHECK_EQ_INT(c.rope.type, FP4S_ROPE_YARN);
	CHECK_NEAR(c.rope.theta, 1e6, 0);
	CHECK_NEAR(c.rms_eps, 1e-6, 0);
	fp4s_config_free(&c);
	/* qwen3_moe: mlp_only_layers and decoder_sparse_step decide MoE layers */
	CHECK_EQ_INT(parse("{\"model_type\":\"qwen3_moe\",\"hidden_size\":256,\"num_hidden_layers\":4,"
	                   "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":64,"
	                   "\"intermediate_size\":512,\"vocab_size\":1000,\"num_experts\":8,"
	                   "\"num_experts_per_tok\":2,\"moe_intermediate_size\":128,"
	                   "\"decoder_sparse_step\":2,\"mlp_only_layers\":[3]}",
	                   &c, &err),
	             0);
	CHECK(!c.layer_is_moe[0] && c.layer_is_moe[1] && !c.layer_is_moe[2] && !c.layer_is_moe[3]);
	CHECK_EQ_INT(fp4s_tensors_expand(&c, &s, &n, &err), 0);
	int dense = 0, experts = 0;
	for (int32_t i = 0; i < n; i++)
		dense += s[i].role == FP4S_ROLE_MLP_GATE, experts += s[i].role == FP4S_ROLE_EXPERT_GATE;
	CHECK_EQ_INT(dense, 3);
	CHECK_EQ_INT(experts, 8);
	free(s);
	fp4s_config_free(&c);
	/* qwen3_next: interval-derived layer kinds; GDN tensors only on linear layers */
	CHECK_EQ_INT(parse("{\"model_type\":\"qwen3_next\",\"hidden_size\":2048,\"num_hidden_layers\":8,"
	                   "\"num_attention_heads\":16,\"num_key_value_heads\":2,\"head_dim\":256,"
	                   "\"intermediate_size\":5120,\"vocab_size\":151936,\"num_experts\":512,"
	                   "\"num_experts_per_tok\":10,\"moe_intermediate_size\":512,"
	                   "\"shared_expert_intermediate_size\":512,\"full_attention_interval\":4,"
	                   "\"linear_num_key_heads\":16,\"linear_num_value_heads\":32,"
	                   "\"linear_key_head_dim\":128,\"linear_value_head_dim\":128,"
	                   "\"linear_conv_kernel_dim\":4,\"partial_rotary_factor\":0.25,"
	                   "\"rope_theta\":10000000}",
	                   &c, &err),
	             0);
	CHECK_EQ_INT(c.layer_kind[0], FP4S_LAYER_LINEAR);
	CHECK_EQ_INT(c.layer_kind[3], FP4S_LAYER_FULL);
	CHECK_NEAR(c.rope.partial_rotary_factor, 0.25, 0);
	CHECK_EQ_INT(c.linear_num_value_heads, 32);
	CHECK_EQ_INT(c.shared_expert_intermediate, 512);
	CHECK_EQ_INT(fp4s_tensors_expand(&c, &s, &n, &err), 0);
	int gdn = 0, gated_q = 0, mtp = 0;
	for (int32_t i = 0; i < n; i++) {
		gdn += s[i].role == FP4S_ROLE_GDN_OUT;
		gated_q += s[i].role == FP4S_ROLE_ATTN_Q && s[i].shape[0] == 2 * 16 * 256;
		mtp += s[i].role == FP4S_ROLE_MTP;
	}
	CHECK_EQ_INT(gdn, 6);     /* layers 0,1,2,4,5,6 */
	CHECK_EQ_INT(gated_q, 2); /* layers 3, 7: q_proj carries query and gate */
	CHECK_EQ_INT(mtp, 1);     /* num_nextn_predict_layers absent: 1, as vLLM assumes */
	free(s);
	fp4s_config_free(&c);
	/* bad values are rejected with the field named */
	CHECK_EQ_INT(parse("{\"model_type\":\"llama\",\"hidden_size\":-5,\"num_hidden_layers\":2,"
	                   "\"num_attention_heads\":4,\"vocab_size\":10}",
	                   &c, &err),
	             FP4S_EFORMAT);
	CHECK(strstr(err.msg, "config.json") && strstr(err.msg, "hidden_size"));
	CHECK_EQ_INT(parse("{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,"
	                   "\"num_attention_heads\":4,\"num_key_value_heads\":3,\"vocab_size\":10}",
	                   &c, &err),
	             FP4S_EFORMAT);
	CHECK(strstr(err.msg, "not a multiple"));
	CHECK_EQ_INT(parse("{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,"
	                   "\"num_attention_heads\":4,\"vocab_size\":10,\"rope_scaling\":{\"type\":\"longrope\"}}",
	                   &c, &err),
	             FP4S_EUNSUPPORTED);
	CHECK(strstr(err.msg, "longrope"));
	CHECK_EQ_INT(parse("{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,"
	                   "\"num_attention_heads\":4,\"vocab_size\":10,\"layer_types\":[\"full_attention\"]}",
	                   &c, &err),
	             FP4S_EFORMAT);
	CHECK(strstr(err.msg, "layer_types"));
}

static void test_exclusions(void)
{
	char *pats[] = {"lm_head", "model.layers.*.self_attn", "*.mlp.gate", "model.embed_tokens"};
	struct fp4s_qscheme q = {.method = FP4S_QM_MODELOPT, .exclude = pats, .n_exclude = 4};
	CHECK(fp4s_qscheme_excluded(&q, "lm_head"));
	CHECK(fp4s_qscheme_excluded(&q, "model.layers.3.self_attn.q_proj"));
	CHECK(fp4s_qscheme_excluded(&q, "model.layers.3.mlp.gate"));
	CHECK(!fp4s_qscheme_excluded(&q, "model.layers.3.mlp.gate_proj"));
	CHECK(!fp4s_qscheme_excluded(&q, "model.layers.3.mlp.experts.1.up_proj"));
	CHECK(fp4s_qscheme_excluded(&q, "model.embed_tokens"));
}

int main(void)
{
	test_bytes();
	test_configs();
	test_exclusions();
	return TEST_DONE();
}
