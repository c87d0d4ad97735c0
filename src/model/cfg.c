/* cfg.c: config.json parsing (jansson). Every integer is range-checked, so later size
 * arithmetic on the config (shape expressions, byte counts) cannot overflow. */
#include "model/cfg.h"

#include <jansson.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const arch_names[FP4S_ARCH_COUNT] = {
	[FP4S_ARCH_LLAMA] = "llama",         [FP4S_ARCH_QWEN3] = "qwen3",
	[FP4S_ARCH_QWEN3_MOE] = "qwen3_moe", [FP4S_ARCH_GPT_OSS] = "gpt_oss",
	[FP4S_ARCH_QWEN3_NEXT] = "qwen3_next",
};

const char *fp4s_arch_name(enum fp4s_arch a)
{
	return (unsigned)a < FP4S_ARCH_COUNT ? arch_names[a] : "?";
}

struct ctx {
	json_t *root;
	const char *path;
	struct fp4s_error *err;
	int rc;
};

/* Reads an integer field into *out when present; absent keeps the default. Sets ctx->rc on a
 * wrong type or a value outside [lo, hi]. */
static void get_int(struct ctx *x, json_t *obj, const char *key, int64_t lo, int64_t hi,
                    int64_t *out)
{
	json_t *v = json_object_get(obj, key);
	if (x->rc || !v || json_is_null(v))
		return;
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
		x->rc = fp4s_error_set(x->err, FP4S_EFORMAT,
		                       "%s: \"%s\" must be an integer in [%lld, %lld]", x->path, key,
		                       (long long)lo, (long long)hi);
		return;
	}
	*out = json_integer_value(v);
}

static void get_i32(struct ctx *x, json_t *obj, const char *key, int64_t lo, int64_t hi,
                    int32_t *out)
{
	int64_t v = *out;
	get_int(x, obj, key, lo, hi, &v);
	*out = (int32_t)v;
}

static void get_num(struct ctx *x, json_t *obj, const char *key, double *out)
{
	json_t *v = json_object_get(obj, key);
	if (x->rc || !v || json_is_null(v))
		return;
	if (!json_is_number(v) || !isfinite(json_number_value(v))) {
		x->rc = fp4s_error_set(x->err, FP4S_EFORMAT, "%s: \"%s\" must be a finite number",
		                       x->path, key);
		return;
	}
	*out = json_number_value(v);
}

static void get_bool(struct ctx *x, json_t *obj, const char *key, int32_t *out)
{
	json_t *v = json_object_get(obj, key);
	if (x->rc || !v || json_is_null(v))
		return;
	if (!json_is_boolean(v)) {
		x->rc = fp4s_error_set(x->err, FP4S_EFORMAT, "%s: \"%s\" must be true or false", x->path,
		                       key);
		return;
	}
	*out = json_is_true(v);
}

static void parse_rope(struct ctx *x, struct fp4s_config *c)
{
	json_t *r = x->root;
	struct fp4s_rope *p = &c->rope;
	get_num(x, r, "rope_theta", &p->theta);
	get_num(x, r, "partial_rotary_factor", &p->partial_rotary_factor);
	/* transformers v5 folds theta, the factor and the scaling into rope_parameters. */
	json_t *s = json_object_get(r, "rope_scaling");
	json_t *rp = json_object_get(r, "rope_parameters");
	if (json_is_object(rp)) {
		get_num(x, rp, "rope_theta", &p->theta);
		get_num(x, rp, "partial_rotary_factor", &p->partial_rotary_factor);
		if (!json_is_object(s))
			s = rp;
	}
	if (!json_is_object(s))
		return;
	json_t *t = json_object_get(s, "rope_type");
	if (!json_is_string(t))
		t = json_object_get(s, "type");
	const char *ty = json_is_string(t) ? json_string_value(t) : "default";
	if (!strcmp(ty, "llama3"))
		p->type = FP4S_ROPE_LLAMA3;
	else if (!strcmp(ty, "yarn"))
		p->type = FP4S_ROPE_YARN;
	else if (!strcmp(ty, "default"))
		p->type = FP4S_ROPE_DEFAULT;
	else {
		x->rc = fp4s_error_set(x->err, FP4S_EUNSUPPORTED,
		                       "%s: rope_scaling type \"%.40s\" is not supported (expected "
		                       "default, llama3 or yarn)",
		                       x->path, ty);
		return;
	}
	get_num(x, s, "factor", &p->factor);
	get_num(x, s, "low_freq_factor", &p->low_freq_factor);
	get_num(x, s, "high_freq_factor", &p->high_freq_factor);
	get_int(x, s, "original_max_position_embeddings", 1, 1ll << 32,
	        &p->original_max_position_embeddings);
	get_num(x, s, "beta_fast", &p->beta_fast);
	get_num(x, s, "beta_slow", &p->beta_slow);
	get_num(x, s, "attention_factor", &p->attention_factor);
	get_bool(x, s, "truncate", &p->truncate);
	if (!x->rc && p->type != FP4S_ROPE_DEFAULT && !(p->factor > 0))
		x->rc = fp4s_error_set(x->err, FP4S_EFORMAT, "%s: rope_scaling.factor must be > 0",
		                       x->path);
}

static void parse_layers(struct ctx *x, struct fp4s_config *c)
{
	int32_t L = c->n_layers;
	c->layer_kind = calloc((size_t)L, 1);
	c->layer_is_moe = calloc((size_t)L, 1);
	if (!c->layer_kind || !c->layer_is_moe) {
		x->rc = fp4s_error_set(x->err, FP4S_ENOMEM, "out of memory");
		return;
	}
	for (int32_t i = 0; i < L; i++) {
		if (c->arch == FP4S_ARCH_GPT_OSS)
			c->layer_kind[i] = i % 2 == 0 ? FP4S_LAYER_SLIDING : FP4S_LAYER_FULL;
		else if (c->arch == FP4S_ARCH_QWEN3_NEXT)
			c->layer_kind[i] = (i + 1) % c->full_attention_interval == 0 ? FP4S_LAYER_FULL
			                                                              : FP4S_LAYER_LINEAR;
		else if (c->use_sliding_window && c->sliding_window > 0 && i >= c->max_window_layers)
			c->layer_kind[i] = FP4S_LAYER_SLIDING;
	}
	json_t *lt = json_object_get(x->root, "layer_types");
	if (lt && !json_is_null(lt)) {
		if (!json_is_array(lt) || json_array_size(lt) != (size_t)L) {
			x->rc = fp4s_error_set(x->err, FP4S_EFORMAT,
			                       "%s: \"layer_types\" must be an array of %d strings "
			                       "(num_hidden_layers)",
			                       x->path, L);
			return;
		}
		for (int32_t i = 0; i < L; i++) {
			const char *s = json_string_value(json_array_get(lt, (size_t)i));
			if (s && !strcmp(s, "full_attention"))
				c->layer_kind[i] = FP4S_LAYER_FULL;
			else if (s && !strcmp(s, "sliding_attention"))
				c->layer_kind[i] = FP4S_LAYER_SLIDING;
			else if (s && !strcmp(s, "linear_attention"))
				c->layer_kind[i] = FP4S_LAYER_LINEAR;
			else {
				x->rc = fp4s_error_set(x->err, FP4S_EFORMAT,
				                       "%s: layer_types[%d] = \"%.40s\", expected "
				                       "full_attention, sliding_attention or linear_attention",
				                       x->path, i, s ? s : "(not a string)");
				return;
			}
		}
	}
	/* MoE layers (architectures.md §4.1): i not in mlp_only_layers, experts > 0, and
	 * (i+1) % decoder_sparse_step == 0. gpt-oss is MoE everywhere. */
	int moe_arch = c->arch == FP4S_ARCH_QWEN3_MOE || c->arch == FP4S_ARCH_GPT_OSS ||
	               c->arch == FP4S_ARCH_QWEN3_NEXT;
	for (int32_t i = 0; i < L; i++)
		c->layer_is_moe[i] = moe_arch && c->n_experts > 0 &&
		                     (i + 1) % (c->decoder_sparse_step ? c->decoder_sparse_step : 1) == 0;
	json_t *mo = json_object_get(x->root, "mlp_only_layers");
	if (json_is_array(mo)) {
		size_t k;
		json_t *v;
		json_array_foreach(mo, k, v) {
			if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= L) {
				x->rc = fp4s_error_set(x->err, FP4S_EFORMAT,
				                       "%s: mlp_only_layers[%zu] must be a layer index < %d",
				                       x->path, k, L);
				return;
			}
			c->layer_is_moe[json_integer_value(v)] = 0;
		}
	}
}

static void parse_tokens(struct ctx *x, struct fp4s_config *c)
{
	get_int(x, x->root, "bos_token_id", 0, c->vocab - 1, &c->bos_token_id);
	get_int(x, x->root, "pad_token_id", 0, c->vocab - 1, &c->pad_token_id);
	json_t *e = json_object_get(x->root, "eos_token_id");
	if (json_is_integer(e)) {
		get_int(x, x->root, "eos_token_id", 0, c->vocab - 1, &c->eos_token_ids[0]);
		c->n_eos = 1;
	} else if (json_is_array(e)) {
		size_t k;
		json_t *v;
		json_array_foreach(e, k, v) {
			if (!json_is_integer(v) || json_integer_value(v) < 0 ||
			    json_integer_value(v) >= c->vocab) {
				x->rc = fp4s_error_set(x->err, FP4S_EFORMAT,
				                       "%s: eos_token_id[%zu] must be a token id < %lld", x->path,
				                       k, (long long)c->vocab);
				return;
			}
			if (c->n_eos < 8)
				c->eos_token_ids[c->n_eos++] = json_integer_value(v);
		}
	}
}

int fp4s_config_parse(const char *text, size_t len, const char *path, struct fp4s_config *c,
                      struct fp4s_error *err)
{
	memset(c, 0, sizeof *c);
	json_error_t jerr;
	json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return fp4s_error_set(err, FP4S_EFORMAT, "%s: invalid JSON at line %d: %s", path,
		                      jerr.line, jerr.text);
	struct ctx x = {root, path, err, FP4S_OK};
	if (!json_is_object(root)) {
		x.rc = fp4s_error_set(err, FP4S_EFORMAT, "%s: not a JSON object", path);
		goto out;
	}
	const char *mt = json_string_value(json_object_get(root, "model_type"));
	int found = 0;
	for (int a = 0; mt && a < FP4S_ARCH_COUNT; a++)
		if (!strcmp(mt, arch_names[a])) {
			c->arch = (enum fp4s_arch)a;
			found = 1;
		}
	if (!found) {
		x.rc = fp4s_error_set(err, FP4S_EUNSUPPORTED,
		                      "%s: model_type \"%.60s\" is not supported (expected llama, qwen3, "
		                      "qwen3_moe, gpt_oss or qwen3_next)",
		                      path, mt ? mt : "(missing)");
		goto out;
	}
	/* Defaults: transformers' configuration_*.py values where a field may be absent. */
	c->rms_eps = c->arch == FP4S_ARCH_LLAMA || c->arch == FP4S_ARCH_GPT_OSS ? 1e-5 : 1e-6;
	c->rope.theta = 10000.0;
	c->rope.partial_rotary_factor = c->arch == FP4S_ARCH_QWEN3_NEXT ? 0.25 : 1.0;
	c->rope.beta_fast = 32.0;
	c->rope.beta_slow = 1.0;
	c->rope.truncate = 1;
	c->bos_token_id = c->pad_token_id = -1;
	c->decoder_sparse_step = 1;
	c->norm_topk_prob = c->arch == FP4S_ARCH_QWEN3_NEXT;
	c->swiglu_limit = 7.0;
	c->swiglu_alpha = 1.702;
	c->full_attention_interval = 4;
	c->linear_conv_kernel_dim = 4;
	/* vLLM assumes one MTP layer for Qwen3-Next when the field is absent */
	c->num_nextn_predict_layers = c->arch == FP4S_ARCH_QWEN3_NEXT;
	c->attention_bias = c->arch == FP4S_ARCH_GPT_OSS;
	c->max_window_layers = 0;
	int64_t v;
	v = 0, get_int(&x, root, "hidden_size", 1, 1 << 20, &v), c->hidden = v;
	v = 0, get_int(&x, root, "num_hidden_layers", 1, 4096, &v), c->n_layers = (int32_t)v;
	v = 0, get_int(&x, root, "num_attention_heads", 1, 4096, &v), c->n_heads = (int32_t)v;
	v = c->n_heads, get_int(&x, root, "num_key_value_heads", 1, 4096, &v), c->n_kv_heads = (int32_t)v;
	get_int(&x, root, "intermediate_size", 0, 1 << 22, &c->intermediate);
	get_int(&x, root, "vocab_size", 1, 1 << 24, &c->vocab);
	if (x.rc)
		goto out;
	if ((!c->hidden || !c->n_layers || !c->n_heads || !c->vocab)) {
		x.rc = fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: hidden_size, num_hidden_layers, num_attention_heads and "
		                      "vocab_size are required",
		                      path);
		goto out;
	}
	c->head_dim = (int32_t)(c->hidden / c->n_heads);
	get_i32(&x, root, "head_dim", 1, 4096, &c->head_dim);
	if (!x.rc && c->n_heads % c->n_kv_heads) {
		x.rc = fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: num_attention_heads %d is not a multiple of "
		                      "num_key_value_heads %d",
		                      path, c->n_heads, c->n_kv_heads);
		goto out;
	}
	get_num(&x, root, "rms_norm_eps", &c->rms_eps);
	get_int(&x, root, "max_position_embeddings", 1, 1ll << 32, &c->max_pos);
	get_bool(&x, root, "tie_word_embeddings", &c->tie_embeddings);
	get_bool(&x, root, "attention_bias", &c->attention_bias);
	get_bool(&x, root, "mlp_bias", &c->mlp_bias);
	get_i32(&x, root, "sliding_window", 0, 1 << 30, &c->sliding_window);
	get_bool(&x, root, "use_sliding_window", &c->use_sliding_window);
	get_i32(&x, root, "max_window_layers", 0, 4096, &c->max_window_layers);
	get_i32(&x, root, "num_local_experts", 0, 1 << 16, &c->n_experts);
	get_i32(&x, root, "num_experts", 0, 1 << 16, &c->n_experts);
	get_i32(&x, root, "experts_per_token", 0, 1 << 16, &c->n_experts_per_tok);
	get_i32(&x, root, "num_experts_per_tok", 0, 1 << 16, &c->n_experts_per_tok);
	get_int(&x, root, "moe_intermediate_size", 0, 1 << 22, &c->moe_intermediate);
	get_bool(&x, root, "norm_topk_prob", &c->norm_topk_prob);
	get_i32(&x, root, "decoder_sparse_step", 1, 4096, &c->decoder_sparse_step);
	get_num(&x, root, "swiglu_limit", &c->swiglu_limit);
	get_num(&x, root, "swiglu_alpha", &c->swiglu_alpha);
	get_i32(&x, root, "full_attention_interval", 1, 4096, &c->full_attention_interval);
	get_i32(&x, root, "linear_num_key_heads", 0, 4096, &c->linear_num_key_heads);
	get_i32(&x, root, "linear_num_value_heads", 0, 4096, &c->linear_num_value_heads);
	get_i32(&x, root, "linear_key_head_dim", 0, 4096, &c->linear_key_head_dim);
	get_i32(&x, root, "linear_value_head_dim", 0, 4096, &c->linear_value_head_dim);
	get_i32(&x, root, "linear_conv_kernel_dim", 1, 64, &c->linear_conv_kernel_dim);
	get_int(&x, root, "shared_expert_intermediate_size", 0, 1 << 22, &c->shared_expert_intermediate);
	get_i32(&x, root, "num_nextn_predict_layers", 0, 64, &c->num_nextn_predict_layers);
	const char *td = json_string_value(json_object_get(root, "torch_dtype"));
	if (!td)
		td = json_string_value(json_object_get(root, "dtype"));
	if (td)
		snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", td);
	if (x.rc)
		goto out;
	if (c->n_experts_per_tok > c->n_experts) {
		x.rc = fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: num_experts_per_tok %d exceeds the %d experts", path,
		                      c->n_experts_per_tok, c->n_experts);
		goto out;
	}
	if ((c->arch == FP4S_ARCH_QWEN3_MOE || c->arch == FP4S_ARCH_GPT_OSS) &&
	    (c->n_experts < 1 || c->n_experts_per_tok < 1)) {
		x.rc = fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: %s needs num_experts and num_experts_per_tok >= 1", path,
		                      mt);
		goto out;
	}
	parse_rope(&x, c);
	if (!x.rc)
		parse_layers(&x, c);
	if (!x.rc)
		parse_tokens(&x, c);
out:
	json_decref(root);
	if (x.rc)
		fp4s_config_free(c);
	return x.rc;
}

int fp4s_config_load(const char *path, struct fp4s_config *c, struct fp4s_error *err)
{
	/* config.json files are a few KB; anything past 16 MB is not one. */
	FILE *f = fopen(path, "rb");
	if (!f)
		return fp4s_error_set(err, FP4S_EIO, "%s: cannot open", path);
	long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
	if (size < 0 || size > (16l << 20) || fseek(f, 0, SEEK_SET)) {
		fclose(f);
		return fp4s_error_set(err, FP4S_EFORMAT, "%s: not a readable file under 16 MB", path);
	}
	char *buf = malloc((size_t)size + 1);
	size_t n = buf ? fread(buf, 1, (size_t)size, f) : 0;
	fclose(f);
	if (!buf)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	int rc = fp4s_config_parse(buf, n, path, c, err);
	free(buf);
	return rc;
}

void fp4s_config_free(struct fp4s_config *c)
{
	free(c->layer_kind);
	free(c->layer_is_moe);
	c->layer_kind = c->layer_is_moe = NULL;
}
