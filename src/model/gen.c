/* gen.c: the `gen` presets (real geometry from architectures.md §2-§5, and tiny versions for
 * tests) and the byte-level BPE tokenizer.json that goes with a generated checkpoint. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/mwrite.h"

struct preset {
	const char *name;
	enum fp4s_arch arch;
	int64_t H, I, V, IE;
	int32_t L, nh, nkv, d, E, k;
};

/* tiny-* keep head_dim 64 and the family's features (GQA, q/k norm, MoE routing, biases, sinks,
 * sliding layers), with 2 layers, hidden 256 and a 1024-token vocab. */
static const struct preset presets[] = {
	{"llama3-8b", FP4S_ARCH_LLAMA, 4096, 14336, 128256, 0, 32, 32, 8, 128, 0, 0},
	{"qwen3-8b", FP4S_ARCH_QWEN3, 4096, 12288, 151936, 0, 36, 32, 8, 128, 0, 0},
	{"qwen3-30b-a3b", FP4S_ARCH_QWEN3_MOE, 2048, 6144, 151936, 768, 48, 32, 4, 128, 128, 8},
	{"gpt-oss-20b", FP4S_ARCH_GPT_OSS, 2880, 2880, 201088, 0, 24, 64, 8, 64, 32, 4},
	{"gpt-oss-120b", FP4S_ARCH_GPT_OSS, 2880, 2880, 201088, 0, 36, 64, 8, 64, 128, 4},
	{"tiny-llama3", FP4S_ARCH_LLAMA, 256, 512, 1024, 0, 2, 4, 2, 64, 0, 0},
	{"tiny-qwen3", FP4S_ARCH_QWEN3, 256, 512, 1024, 0, 2, 4, 2, 64, 0, 0},
	{"tiny-qwen3-moe", FP4S_ARCH_QWEN3_MOE, 256, 512, 1024, 128, 2, 4, 2, 64, 8, 2},
	{"tiny-gpt-oss", FP4S_ARCH_GPT_OSS, 256, 256, 1024, 0, 2, 4, 2, 64, 4, 2},
	/* Qwen3-Next: the linear-attention sizes are set in preset_json (80B: nk 16, nv 32,
	 * dk = dv = 128; tiny: nk 2, nv 4, dk = dv = 64), 4 layers so both layer kinds appear. */
	{"qwen3-next-80b-a3b", FP4S_ARCH_QWEN3_NEXT, 2048, 5120, 151936, 512, 48, 16, 2, 256, 512, 10},
	{"tiny-qwen3-next", FP4S_ARCH_QWEN3_NEXT, 256, 512, 1024, 64, 4, 4, 2, 64, 8, 2},
};
#define N_PRESETS ((int32_t)(sizeof presets / sizeof presets[0]))

const char *const *fp4s_preset_names(int32_t *n)
{
	static const char *names[N_PRESETS];
	for (int32_t i = 0; i < N_PRESETS; i++)
		names[i] = presets[i].name;
	*n = N_PRESETS;
	return names;
}

enum fp4s_qformat fp4s_preset_default_format(const struct fp4s_config *c)
{
	return c->arch == FP4S_ARCH_GPT_OSS ? FP4S_QF_MXFP4 : FP4S_QF_BF16;
}

/* Special tokens per family: (offset from the family's first special id, text). */
struct special {
	int32_t off;
	const char *text;
};
static const struct special llama3_sp[] = {
	{0, "<|begin_of_text|>"}, {1, "<|end_of_text|>"}, {4, "<|finetune_right_pad_id|>"},
	{6, "<|start_header_id|>"}, {7, "<|end_header_id|>"}, {8, "<|eom_id|>"},
	{9, "<|eot_id|>"}, {10, "<|python_tag|>"}, {-1, NULL}};
static const struct special qwen3_sp[] = {
	{0, "<|endoftext|>"}, {1, "<|im_start|>"}, {2, "<|im_end|>"}, {14, "<tool_call>"},
	{15, "</tool_call>"}, {24, "<think>"}, {25, "</think>"}, {-1, NULL}};
static const struct special gptoss_sp[] = {
	{0, "<|startoftext|>"}, {1, "<|endoftext|>"}, {4, "<|return|>"}, {5, "<|constrain|>"},
	{7, "<|channel|>"}, {8, "<|start|>"}, {9, "<|end|>"}, {10, "<|message|>"},
	{14, "<|call|>"}, {20, "<|endofprompt|>"}, {-1, NULL}};

/* The family's first special id: the real one at the real vocab size, else the top of the
 * vocab minus the family's span. */
static void family(enum fp4s_arch a, int64_t V, const struct special **sp, int64_t *base,
                   int64_t *span)
{
	if (a == FP4S_ARCH_LLAMA) {
		*sp = llama3_sp, *span = 256, *base = V == 128256 ? 128000 : V - 256;
	} else if (a == FP4S_ARCH_GPT_OSS) {
		*sp = gptoss_sp, *span = 1090, *base = V == 201088 ? 199998 : V - 64;
		if (V != 201088)
			*span = 64;
	} else {
		*sp = qwen3_sp, *span = 293, *base = V == 151936 ? 151643 : V - 64;
		if (V != 151936)
			*span = 64;
	}
}

static json_t *preset_json(const struct preset *p)
{
	json_t *j = json_object();
	static const char *const arch_cls[] = {"LlamaForCausalLM", "Qwen3ForCausalLM",
	                                      "Qwen3MoeForCausalLM", "GptOssForCausalLM",
	                                      "Qwen3NextForCausalLM"};
	const struct special *sp;
	int64_t base, span;
	family(p->arch, p->V, &sp, &base, &span);
	json_object_set_new(j, "architectures", json_pack("[s]", arch_cls[p->arch]));
	json_object_set_new(j, "model_type", json_string(fp4s_arch_name(p->arch)));
	json_object_set_new(j, "hidden_size", json_integer(p->H));
	json_object_set_new(j, "intermediate_size", json_integer(p->I));
	json_object_set_new(j, "num_hidden_layers", json_integer(p->L));
	json_object_set_new(j, "num_attention_heads", json_integer(p->nh));
	json_object_set_new(j, "num_key_value_heads", json_integer(p->nkv));
	json_object_set_new(j, "head_dim", json_integer(p->d));
	json_object_set_new(j, "vocab_size", json_integer(p->V));
	json_object_set_new(j, "hidden_act", json_string("silu"));
	json_object_set_new(j, "tie_word_embeddings", json_false());
	json_object_set_new(j, "torch_dtype", json_string("bfloat16"));
	switch (p->arch) {
	case FP4S_ARCH_LLAMA:
		json_object_set_new(j, "rms_norm_eps", json_real(1e-5));
		json_object_set_new(j, "rope_theta", json_real(500000.0));
		json_object_set_new(j, "rope_scaling",
		                    json_pack("{s:s,s:f,s:f,s:f,s:i}", "rope_type", "llama3", "factor", 8.0,
		                              "low_freq_factor", 1.0, "high_freq_factor", 4.0,
		                              "original_max_position_embeddings", 8192));
		json_object_set_new(j, "max_position_embeddings", json_integer(131072));
		json_object_set_new(j, "attention_bias", json_false());
		json_object_set_new(j, "mlp_bias", json_false());
		json_object_set_new(j, "bos_token_id", json_integer(base));
		json_object_set_new(j, "eos_token_id",
		                    json_pack("[I,I,I]", (json_int_t)(base + 1), (json_int_t)(base + 8),
		                              (json_int_t)(base + 9)));
		break;
	case FP4S_ARCH_QWEN3_NEXT: {
		int tiny = p->H < 1024;
		json_object_set_new(j, "rms_norm_eps", json_real(1e-6));
		json_object_set_new(j, "rope_theta", json_real(10000000.0));
		json_object_set_new(j, "partial_rotary_factor", json_real(0.25));
		json_object_set_new(j, "max_position_embeddings", json_integer(262144));
		json_object_set_new(j, "attention_bias", json_false());
		json_object_set_new(j, "full_attention_interval", json_integer(4));
		json_object_set_new(j, "linear_num_key_heads", json_integer(tiny ? 2 : 16));
		json_object_set_new(j, "linear_num_value_heads", json_integer(tiny ? 4 : 32));
		json_object_set_new(j, "linear_key_head_dim", json_integer(tiny ? 64 : 128));
		json_object_set_new(j, "linear_value_head_dim", json_integer(tiny ? 64 : 128));
		json_object_set_new(j, "linear_conv_kernel_dim", json_integer(4));
		json_object_set_new(j, "num_experts", json_integer(p->E));
		json_object_set_new(j, "num_experts_per_tok", json_integer(p->k));
		json_object_set_new(j, "moe_intermediate_size", json_integer(p->IE));
		json_object_set_new(j, "shared_expert_intermediate_size", json_integer(p->IE));
		json_object_set_new(j, "norm_topk_prob", json_true());
		json_object_set_new(j, "decoder_sparse_step", json_integer(1));
		json_object_set_new(j, "mlp_only_layers", json_array());
		json_object_set_new(j, "num_nextn_predict_layers", json_integer(0));
		json_object_set_new(j, "bos_token_id", json_integer(base));
		json_object_set_new(j, "eos_token_id", json_integer(base + 2));
		break;
	}
	case FP4S_ARCH_QWEN3:
	case FP4S_ARCH_QWEN3_MOE:
		json_object_set_new(j, "rms_norm_eps", json_real(1e-6));
		json_object_set_new(j, "rope_theta", json_real(1000000.0));
		json_object_set_new(j, "rope_scaling", json_null());
		json_object_set_new(j, "max_position_embeddings", json_integer(40960));
		json_object_set_new(j, "attention_bias", json_false());
		json_object_set_new(j, "use_sliding_window", json_false());
		json_object_set_new(j, "sliding_window", json_null());
		json_object_set_new(j, "max_window_layers", json_integer(p->L));
		json_object_set_new(j, "bos_token_id", json_integer(base));
		json_object_set_new(j, "eos_token_id", json_integer(base + 2));
		if (p->arch == FP4S_ARCH_QWEN3_MOE) {
			json_object_set_new(j, "num_experts", json_integer(p->E));
			json_object_set_new(j, "num_experts_per_tok", json_integer(p->k));
			json_object_set_new(j, "moe_intermediate_size", json_integer(p->IE));
			json_object_set_new(j, "norm_topk_prob", json_true());
			json_object_set_new(j, "decoder_sparse_step", json_integer(1));
			json_object_set_new(j, "mlp_only_layers", json_array());
		}
		break;
	default: {
		json_t *lt = json_array();
		for (int32_t i = 0; i < p->L; i++)
			json_array_append_new(lt, json_string(i % 2 ? "full_attention" : "sliding_attention"));
		json_object_set_new(j, "layer_types", lt);
		json_object_set_new(j, "num_local_experts", json_integer(p->E));
		json_object_set_new(j, "num_experts_per_tok", json_integer(p->k));
		json_object_set_new(j, "experts_per_token", json_integer(p->k));
		json_object_set_new(j, "sliding_window", json_integer(128));
		json_object_set_new(j, "rms_norm_eps", json_real(1e-5));
		json_object_set_new(j, "rope_theta", json_real(150000.0));
		json_object_set_new(j, "rope_scaling",
		                    json_pack("{s:s,s:f,s:f,s:f,s:i,s:b}", "rope_type", "yarn", "factor", 32.0,
		                              "beta_fast", 32.0, "beta_slow", 1.0,
		                              "original_max_position_embeddings", 4096, "truncate", 0));
		json_object_set_new(j, "max_position_embeddings", json_integer(131072));
		json_object_set_new(j, "initial_context_length", json_integer(4096));
		json_object_set_new(j, "attention_bias", json_true());
		json_object_set_new(j, "swiglu_limit", json_real(7.0));
		json_object_set_new(j, "bos_token_id", json_integer(base));
		json_object_set_new(j, "pad_token_id", json_integer(base + 1));
		json_object_set_new(j, "eos_token_id", json_integer(base + 4));
		break;
	}
	}
	return j;
}

int fp4s_preset_config(const char *name, char **json_text, struct fp4s_config *c,
                       struct fp4s_error *err)
{
	const struct preset *p = NULL;
	for (int32_t i = 0; i < N_PRESETS; i++)
		if (!strcmp(presets[i].name, name))
			p = &presets[i];
	if (!p) {
		char list[512] = "";
		for (int32_t i = 0; i < N_PRESETS; i++) {
			size_t k = strlen(list);
			snprintf(list + k, sizeof list - k, "%s%s", i ? ", " : "", presets[i].name);
		}
		return fp4s_error_set(err, FP4S_EINVAL, "unknown preset \"%.60s\" (presets: %s)", name,
		                      list);
	}
	json_t *j = preset_json(p);
	char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(j);
	if (!text)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	int rc = fp4s_config_parse(text, strlen(text), name, c, err);
	if (rc || !json_text)
		free(text);
	else
		*json_text = text;
	return rc;
}

/* ---- tokenizer.json ---- */

/* GPT-2 bytes_to_unicode: printable bytes map to themselves, the other 68 to U+0100... */
static void byte_unicode(int32_t map[256])
{
	int32_t n = 0;
	for (int32_t b = 0; b < 256; b++) {
		int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
		map[b] = printable ? b : 256 + n++;
	}
}

static int put_utf8(char *s, int32_t cp)
{
	if (cp < 0x80) {
		s[0] = (char)cp;
		return 1;
	}
	s[0] = (char)(0xC0 | (cp >> 6));
	s[1] = (char)(0x80 | (cp & 0x3F));
	return 2;
}

/* The byte-level string of a byte sequence. */
static void bl_string(const int32_t map[256], const unsigned char *b, int n, char *out)
{
	int k = 0;
	for (int i = 0; i < n; i++)
		k += put_utf8(out + k, map[b[i]]);
	out[k] = 0;
}

/* tokenizer_config.json and generation_config.json beside tokenizer.json: BOS/EOS the way each
 * family ships them (Llama adds BOS; Qwen and gpt-oss do not), stop ids from config.json. No
 * chat template: the tokenizer picks the chat format from the special tokens. */
static int write_tok_configs(const char *tok_path, const struct fp4s_config *c, int64_t base,
                             struct fp4s_error *err)
{
	char dir[4096], path[4200];
	snprintf(dir, sizeof dir, "%s", tok_path);
	char *slash = strrchr(dir, '/');
	if (slash)
		*slash = 0;
	else
		snprintf(dir, sizeof dir, ".");
	int llama = c->arch == FP4S_ARCH_LLAMA, oss = c->arch == FP4S_ARCH_GPT_OSS;
	const char *bos = llama ? "<|begin_of_text|>" : oss ? "<|startoftext|>" : NULL;
	const char *eos = llama ? "<|eot_id|>" : oss ? "<|return|>" : "<|im_end|>";
	json_t *tc = json_pack("{s:b,s:b,s:s?,s:s,s:I}", "add_bos_token", llama, "add_eos_token", 0,
	                       "bos_token", bos, "eos_token", eos, "model_max_length",
	                       (json_int_t)c->max_pos);
	json_t *eids = json_array();
	for (int32_t i = 0; i < c->n_eos; i++)
		json_array_append_new(eids, json_integer(c->eos_token_ids[i]));
	json_t *gc = json_pack("{s:I,s:o}", "bos_token_id",
	                       (json_int_t)(c->bos_token_id >= 0 ? c->bos_token_id : base),
	                       "eos_token_id", eids);
	if (c->pad_token_id >= 0)
		json_object_set_new(gc, "pad_token_id", json_integer(c->pad_token_id));
	int rc = FP4S_OK;
	snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
	if (!tc || json_dump_file(tc, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER))
		rc = fp4s_error_set(err, FP4S_EIO, "%s: cannot write", path);
	snprintf(path, sizeof path, "%s/generation_config.json", dir);
	if (!rc && (!gc || json_dump_file(gc, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER)))
		rc = fp4s_error_set(err, FP4S_EIO, "%s: cannot write", path);
	json_decref(tc);
	json_decref(gc);
	return rc;
}

int fp4s_gen_tokenizer(const char *path, const struct fp4s_config *c, struct fp4s_error *err)
{
	const struct special *sp;
	int64_t base, span;
	family(c->arch, c->vocab, &sp, &base, &span);
	int32_t map[256];
	byte_unicode(map);
	json_t *vocab = json_object(), *merges = json_array(), *added = json_array();
	char s[64], l[64], r[64];
	for (int32_t b = 0; b < 256; b++) {
		unsigned char ch = (unsigned char)b;
		bl_string(map, &ch, 1, s);
		json_object_set_new(vocab, s, json_integer(b));
	}
	/* Regular tokens 256..base-1: merges of printable ASCII pairs, then triples, so text
	 * tokenizes into multi-byte pieces like a trained vocabulary would. */
	int64_t id = 256;
	for (int32_t len = 2; len <= 3 && id < base; len++)
		for (int32_t x = 0; x < (len == 2 ? 95 * 95 : 95 * 95 * 95) && id < base; x++) {
			unsigned char t[3];
			int32_t v = x;
			for (int32_t i = len - 1; i >= 0; i--, v /= 95)
				t[i] = (unsigned char)(32 + v % 95);
			bl_string(map, t, len, s);
			bl_string(map, t, len - 1, l);
			bl_string(map, t + len - 1, 1, r);
			json_object_set_new(vocab, s, json_integer(id++));
			char m[140];
			snprintf(m, sizeof m, "%s %s", l, r);
			json_array_append_new(merges, json_string(m));
		}
	/* Specials at the family's ids; the rest of the span and any tail are reserved tokens. */
	for (int64_t t = base; t < c->vocab; t++) {
		const char *text = NULL;
		char buf[64];
		for (const struct special *q = sp; q->text; q++)
			if (base + q->off == t)
				text = q->text;
		if (!text) {
			snprintf(buf, sizeof buf, "<|reserved_special_token_%lld|>", (long long)(t - base));
			text = buf;
		}
		json_array_append_new(added, json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id", (json_int_t)t,
		                                       "content", text, "single_word", 0, "lstrip", 0,
		                                       "rstrip", 0, "normalized", 0, "special", 1));
		json_object_set_new(vocab, text, json_integer(t));
	}
	const char *pat =
		c->arch == FP4S_ARCH_QWEN3 || c->arch == FP4S_ARCH_QWEN3_MOE
			? "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
			: "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
	json_t *root = json_pack(
		"{s:s,s:n,s:n,s:o,s:n,s:{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b,s:b}]},s:n,"
		"s:{s:s,s:b,s:b,s:b},s:{s:s,s:n,s:n,s:n,s:b,s:b,s:b,s:o,s:o}}",
		"version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer",
		"pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex",
		pat, "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
		"trim_offsets", 1, "use_regex", 0, "post_processor", "decoder", "type", "ByteLevel",
		"add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1, "model", "type", "BPE",
		"dropout", "unk_token", "continuing_subword_prefix", "fuse_unk", 0, "byte_fallback", 0,
		"ignore_merges", 1, "vocab", vocab, "merges", merges);
	if (!root) {
		json_decref(vocab);
		json_decref(merges);
		return fp4s_error_set(err, FP4S_ENOMEM, "tokenizer.json: cannot build");
	}
	int rc = json_dump_file(root, path, JSON_PRESERVE_ORDER | JSON_COMPACT);
	json_decref(root);
	if (rc)
		return fp4s_error_set(err, FP4S_EIO, "%s: cannot write", path);
	return write_tok_configs(path, c, base, err);
}
