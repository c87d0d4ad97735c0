/* tensors.c: the tensor tables (architectures.md §2.2, §3.2, §4.2, §5.2) and their expansion. */
#include "model/tensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* X(scope, pattern, role, class, flags, d0, d1, d2) */
#define G FP4S_SCOPE_GLOBAL
#define L FP4S_SCOPE_LAYER
#define EX FP4S_SCOPE_EXPERT
#define R(x) FP4S_ROLE_##x
#define C(x) FP4S_TC_##x
#define F(x) FP4S_TF_##x
#define D(x) FP4S_D_##x
#define N0 FP4S_D_NONE

/* Shared by every architecture: embeddings, final norm, untied head. */
#define T_GLOBALS(X)                                                                        \
	X(G, "model.embed_tokens.weight", R(EMBED), C(FLOAT), F(REQ), D(V), D(H), N0)       \
	X(G, "model.norm.weight", R(NORM), C(FLOAT), F(REQ), D(H), N0, N0)                  \
	X(G, "lm_head.weight", R(LM_HEAD), C(LINEAR), F(REQ) | F(UNTIED), D(V), D(H), N0)

#define T_ATTN(X)                                                                                  \
	X(L, "model.layers.%d.input_layernorm.weight", R(NORM), C(FLOAT), F(REQ), D(H), N0, N0)        \
	X(L, "model.layers.%d.self_attn.q_proj.weight", R(ATTN_Q), C(LINEAR), F(REQ), D(QD), D(H), N0) \
	X(L, "model.layers.%d.self_attn.k_proj.weight", R(ATTN_K), C(LINEAR), F(REQ), D(KVD), D(H), N0) \
	X(L, "model.layers.%d.self_attn.v_proj.weight", R(ATTN_V), C(LINEAR), F(REQ), D(KVD), D(H), N0) \
	X(L, "model.layers.%d.self_attn.o_proj.weight", R(ATTN_O), C(LINEAR), F(REQ), D(H), D(QD), N0) \
	X(L, "model.layers.%d.self_attn.q_proj.bias", R(ATTN_BIAS), C(FLOAT), F(REQ) | F(ATTN_BIAS), D(QD), N0, N0) \
	X(L, "model.layers.%d.self_attn.k_proj.bias", R(ATTN_BIAS), C(FLOAT), F(REQ) | F(ATTN_BIAS), D(KVD), N0, N0) \
	X(L, "model.layers.%d.self_attn.v_proj.bias", R(ATTN_BIAS), C(FLOAT), F(REQ) | F(ATTN_BIAS), D(KVD), N0, N0) \
	X(L, "model.layers.%d.self_attn.o_proj.bias", R(ATTN_BIAS), C(FLOAT), F(REQ) | F(ATTN_BIAS), D(H), N0, N0) \
	X(L, "model.layers.%d.post_attention_layernorm.weight", R(NORM), C(FLOAT), F(REQ), D(H), N0, N0)

#define T_QK_NORM(X)                                                                               \
	X(L, "model.layers.%d.self_attn.q_norm.weight", R(NORM), C(FLOAT), F(REQ), D(HD), N0, N0)      \
	X(L, "model.layers.%d.self_attn.k_norm.weight", R(NORM), C(FLOAT), F(REQ), D(HD), N0, N0)

#define T_DENSE_MLP(X, when)                                                                       \
	X(L, "model.layers.%d.mlp.gate_proj.weight", R(MLP_GATE), C(LINEAR), F(REQ) | when, D(I), D(H), N0) \
	X(L, "model.layers.%d.mlp.up_proj.weight", R(MLP_UP), C(LINEAR), F(REQ) | when, D(I), D(H), N0) \
	X(L, "model.layers.%d.mlp.down_proj.weight", R(MLP_DOWN), C(LINEAR), F(REQ) | when, D(H), D(I), N0)

/* Routed experts: per-expert tensors as on the hub, or the transformers-v5 fused pair
 * (architectures.md §4.2, §14 item 10); the loader picks one by probing the checkpoint. */
#define T_ROUTED_EXPERTS(X)                                                                        \
	X(EX, "model.layers.%d.mlp.experts.%d.gate_proj.weight", R(EXPERT_GATE), C(LINEAR), F(REQ) | F(MOE) | F(PER_EXPERT), D(IE), D(H), N0) \
	X(EX, "model.layers.%d.mlp.experts.%d.up_proj.weight", R(EXPERT_UP), C(LINEAR), F(REQ) | F(MOE) | F(PER_EXPERT), D(IE), D(H), N0) \
	X(EX, "model.layers.%d.mlp.experts.%d.down_proj.weight", R(EXPERT_DOWN), C(LINEAR), F(REQ) | F(MOE) | F(PER_EXPERT), D(H), D(IE), N0) \
	X(L, "model.layers.%d.mlp.experts.gate_up_proj", R(EXPERTS_GATE_UP_CAT), C(FLOAT), F(REQ) | F(MOE) | F(FUSED_EXPERTS), D(E), D(2IE), D(H)) \
	X(L, "model.layers.%d.mlp.experts.down_proj", R(EXPERTS_DOWN_CAT), C(FLOAT), F(REQ) | F(MOE) | F(FUSED_EXPERTS), D(E), D(H), D(IE))

#define FP4S_TENSORS_LLAMA(X) T_GLOBALS(X) T_ATTN(X) T_DENSE_MLP(X, 0)

#define FP4S_TENSORS_QWEN3(X) T_GLOBALS(X) T_ATTN(X) T_QK_NORM(X) T_DENSE_MLP(X, 0)

/* Hub layout: one tensor per expert (architectures.md §4.2). */
#define FP4S_TENSORS_QWEN3_MOE(X)                                                                  \
	T_GLOBALS(X) T_ATTN(X) T_QK_NORM(X) T_DENSE_MLP(X, F(DENSE))                               \
	X(L, "model.layers.%d.mlp.gate.weight", R(ROUTER), C(LINEAR), F(REQ) | F(MOE), D(E), D(H), N0) \
	T_ROUTED_EXPERTS(X)

/* gpt-oss (architectures.md §5.2): packed experts, attention biases and sinks. */
#define FP4S_TENSORS_GPT_OSS(X)                                                                    \
	T_GLOBALS(X) T_ATTN(X)                                                                     \
	X(L, "model.layers.%d.self_attn.sinks", R(ATTN_SINKS), C(FLOAT), F(REQ), D(NH), N0, N0)    \
	X(L, "model.layers.%d.mlp.router.weight", R(ROUTER), C(LINEAR), F(REQ), D(E), D(H), N0)    \
	X(L, "model.layers.%d.mlp.router.bias", R(ROUTER_BIAS), C(FLOAT), F(REQ), D(E), N0, N0)    \
	X(L, "model.layers.%d.mlp.experts.gate_up_proj", R(EXPERTS_GATE_UP), C(PACKED_EXPERTS), F(REQ), D(E), D(2I), D(H)) \
	X(L, "model.layers.%d.mlp.experts.gate_up_proj_bias", R(EXPERTS_BIAS), C(FLOAT), F(REQ), D(E), D(2I), N0) \
	X(L, "model.layers.%d.mlp.experts.down_proj", R(EXPERTS_DOWN), C(PACKED_EXPERTS), F(REQ), D(E), D(H), D(I)) \
	X(L, "model.layers.%d.mlp.experts.down_proj_bias", R(EXPERTS_BIAS), C(FLOAT), F(REQ), D(E), D(H), N0)

/* Qwen3-Next (architectures.md §6.2-§6.7): Gated DeltaNet or gated attention per layer, MoE with a
 * shared expert everywhere, optional MTP head (its decoder layer, mtp.layers.0.*, is not in the
 * table yet and is reported as unused). Norms are zero-centred (1 + w) except linear_attn.norm. */
#define FP4S_TENSORS_QWEN3_NEXT(X)                                                                 \
	T_GLOBALS(X)                                                                               \
	X(L, "model.layers.%d.input_layernorm.weight", R(NORM), C(FLOAT), F(REQ), D(H), N0, N0)    \
	X(L, "model.layers.%d.self_attn.q_proj.weight", R(ATTN_Q), C(LINEAR), F(REQ) | F(FULL_ATTN), D(2QD), D(H), N0) \
	X(L, "model.layers.%d.self_attn.k_proj.weight", R(ATTN_K), C(LINEAR), F(REQ) | F(FULL_ATTN), D(KVD), D(H), N0) \
	X(L, "model.layers.%d.self_attn.v_proj.weight", R(ATTN_V), C(LINEAR), F(REQ) | F(FULL_ATTN), D(KVD), D(H), N0) \
	X(L, "model.layers.%d.self_attn.o_proj.weight", R(ATTN_O), C(LINEAR), F(REQ) | F(FULL_ATTN), D(H), D(QD), N0) \
	X(L, "model.layers.%d.self_attn.q_norm.weight", R(NORM), C(FLOAT), F(REQ) | F(FULL_ATTN), D(HD), N0, N0) \
	X(L, "model.layers.%d.self_attn.k_norm.weight", R(NORM), C(FLOAT), F(REQ) | F(FULL_ATTN), D(HD), N0, N0) \
	X(L, "model.layers.%d.linear_attn.in_proj_qkvz.weight", R(GDN_IN), C(LINEAR), F(REQ) | F(LINEAR_ATTN), D(QKVZ), D(H), N0) \
	X(L, "model.layers.%d.linear_attn.in_proj_ba.weight", R(GDN_IN), C(LINEAR), F(REQ) | F(LINEAR_ATTN), D(BA), D(H), N0) \
	X(L, "model.layers.%d.linear_attn.conv1d.weight", R(GDN_PARAM), C(FLOAT), F(REQ) | F(LINEAR_ATTN), D(CONV), D(ONE), D(KC)) \
	X(L, "model.layers.%d.linear_attn.dt_bias", R(GDN_PARAM), C(FLOAT), F(REQ) | F(LINEAR_ATTN), D(NV), N0, N0) \
	X(L, "model.layers.%d.linear_attn.A_log", R(GDN_PARAM), C(FLOAT), F(REQ) | F(LINEAR_ATTN), D(NV), N0, N0) \
	X(L, "model.layers.%d.linear_attn.norm.weight", R(NORM), C(FLOAT), F(REQ) | F(LINEAR_ATTN), D(DV), N0, N0) \
	X(L, "model.layers.%d.linear_attn.out_proj.weight", R(GDN_OUT), C(LINEAR), F(REQ) | F(LINEAR_ATTN), D(H), D(VD), N0) \
	X(L, "model.layers.%d.post_attention_layernorm.weight", R(NORM), C(FLOAT), F(REQ), D(H), N0, N0) \
	T_DENSE_MLP(X, F(DENSE))                                                                   \
	X(L, "model.layers.%d.mlp.gate.weight", R(ROUTER), C(LINEAR), F(REQ) | F(MOE), D(E), D(H), N0) \
	T_ROUTED_EXPERTS(X) \
	X(L, "model.layers.%d.mlp.shared_expert.gate_proj.weight", R(SHARED_GATE), C(LINEAR), F(REQ) | F(MOE), D(SE), D(H), N0) \
	X(L, "model.layers.%d.mlp.shared_expert.up_proj.weight", R(SHARED_UP), C(LINEAR), F(REQ) | F(MOE), D(SE), D(H), N0) \
	X(L, "model.layers.%d.mlp.shared_expert.down_proj.weight", R(SHARED_DOWN), C(LINEAR), F(REQ) | F(MOE), D(H), D(SE), N0) \
	X(L, "model.layers.%d.mlp.shared_expert_gate.weight", R(SHARED_EXPERT_GATE), C(LINEAR), F(REQ) | F(MOE), D(ONE), D(H), N0) \
	X(G, "mtp.pre_fc_norm_embedding.weight", R(NORM), C(FLOAT), F(OPT) | F(MTP), D(H), N0, N0) \
	X(G, "mtp.pre_fc_norm_hidden.weight", R(NORM), C(FLOAT), F(OPT) | F(MTP), D(H), N0, N0)   \
	X(G, "mtp.fc.weight", R(MTP), C(LINEAR), F(OPT) | F(MTP), D(H), D(2H), N0)                 \
	X(G, "mtp.norm.weight", R(NORM), C(FLOAT), F(OPT) | F(MTP), D(H), N0, N0)

#define ENTRY(scope, pat, role, cls, flags, d0, d1, d2) {scope, pat, role, cls, flags, {d0, d1, d2}},

static const struct fp4s_tentry llama_table[] = {FP4S_TENSORS_LLAMA(ENTRY)};
static const struct fp4s_tentry qwen3_table[] = {FP4S_TENSORS_QWEN3(ENTRY)};
static const struct fp4s_tentry qwen3_moe_table[] = {FP4S_TENSORS_QWEN3_MOE(ENTRY)};
static const struct fp4s_tentry gpt_oss_table[] = {FP4S_TENSORS_GPT_OSS(ENTRY)};
static const struct fp4s_tentry qwen3_next_table[] = {FP4S_TENSORS_QWEN3_NEXT(ENTRY)};

static const struct {
	const struct fp4s_tentry *t;
	int32_t n;
} tables[FP4S_ARCH_COUNT] = {
	[FP4S_ARCH_LLAMA] = {llama_table, sizeof llama_table / sizeof llama_table[0]},
	[FP4S_ARCH_QWEN3] = {qwen3_table, sizeof qwen3_table / sizeof qwen3_table[0]},
	[FP4S_ARCH_QWEN3_MOE] = {qwen3_moe_table, sizeof qwen3_moe_table / sizeof qwen3_moe_table[0]},
	[FP4S_ARCH_GPT_OSS] = {gpt_oss_table, sizeof gpt_oss_table / sizeof gpt_oss_table[0]},
	[FP4S_ARCH_QWEN3_NEXT] = {qwen3_next_table, sizeof qwen3_next_table / sizeof qwen3_next_table[0]},
};

static const char *const role_names[FP4S_ROLE_COUNT] = {
	[FP4S_ROLE_EMBED] = "embed",          [FP4S_ROLE_LM_HEAD] = "lm_head",
	[FP4S_ROLE_NORM] = "norm",            [FP4S_ROLE_ATTN_Q] = "attn_q",
	[FP4S_ROLE_ATTN_K] = "attn_k",        [FP4S_ROLE_ATTN_V] = "attn_v",
	[FP4S_ROLE_ATTN_O] = "attn_o",        [FP4S_ROLE_ATTN_BIAS] = "attn_bias",
	[FP4S_ROLE_ATTN_SINKS] = "attn_sinks", [FP4S_ROLE_MLP_GATE] = "mlp_gate",
	[FP4S_ROLE_MLP_UP] = "mlp_up",        [FP4S_ROLE_MLP_DOWN] = "mlp_down",
	[FP4S_ROLE_ROUTER] = "router",        [FP4S_ROLE_ROUTER_BIAS] = "router_bias",
	[FP4S_ROLE_EXPERT_GATE] = "expert_gate", [FP4S_ROLE_EXPERT_UP] = "expert_up",
	[FP4S_ROLE_EXPERT_DOWN] = "expert_down", [FP4S_ROLE_EXPERTS_GATE_UP] = "experts_gate_up",
	[FP4S_ROLE_EXPERTS_DOWN] = "experts_down", [FP4S_ROLE_EXPERTS_BIAS] = "experts_bias",
	[FP4S_ROLE_SHARED_GATE] = "shared_gate", [FP4S_ROLE_SHARED_UP] = "shared_up",
	[FP4S_ROLE_SHARED_DOWN] = "shared_down", [FP4S_ROLE_SHARED_EXPERT_GATE] = "shared_expert_gate",
	[FP4S_ROLE_GDN_IN] = "gdn_in", [FP4S_ROLE_GDN_OUT] = "gdn_out",
	[FP4S_ROLE_GDN_PARAM] = "gdn_param", [FP4S_ROLE_MTP] = "mtp",
	[FP4S_ROLE_EXPERTS_GATE_UP_CAT] = "experts_gate_up", [FP4S_ROLE_EXPERTS_DOWN_CAT] = "experts_down",
};

const char *fp4s_role_name(enum fp4s_role r)
{
	return (unsigned)r < FP4S_ROLE_COUNT && role_names[r] ? role_names[r] : "?";
}

int fp4s_role_fuse_group(enum fp4s_role r)
{
	switch (r) {
	case FP4S_ROLE_ATTN_Q:
	case FP4S_ROLE_ATTN_K:
	case FP4S_ROLE_ATTN_V: return 1;
	case FP4S_ROLE_MLP_GATE:
	case FP4S_ROLE_MLP_UP:
	case FP4S_ROLE_EXPERT_GATE:
	case FP4S_ROLE_EXPERT_UP:
	case FP4S_ROLE_SHARED_GATE:
	case FP4S_ROLE_SHARED_UP: return 2;
	default: return 0;
	}
}

int64_t fp4s_dim_value(const struct fp4s_config *c, enum fp4s_dim d)
{
	switch (d) {
	case FP4S_D_NONE: return 0;
	case FP4S_D_H: return c->hidden;
	case FP4S_D_V: return c->vocab;
	case FP4S_D_QD: return (int64_t)c->n_heads * c->head_dim;
	case FP4S_D_KVD: return (int64_t)c->n_kv_heads * c->head_dim;
	case FP4S_D_HD: return c->head_dim;
	case FP4S_D_NH: return c->n_heads;
	case FP4S_D_I: return c->intermediate;
	case FP4S_D_2I: return 2 * c->intermediate;
	case FP4S_D_IE: return c->moe_intermediate;
	case FP4S_D_E: return c->n_experts;
	case FP4S_D_ONE: return 1;
	case FP4S_D_2QD: return 2 * (int64_t)c->n_heads * c->head_dim;
	case FP4S_D_QKVZ:
		return 2 * (int64_t)c->linear_num_key_heads * c->linear_key_head_dim +
		       2 * (int64_t)c->linear_num_value_heads * c->linear_value_head_dim;
	case FP4S_D_BA: return 2 * (int64_t)c->linear_num_value_heads;
	case FP4S_D_CONV:
		return 2 * (int64_t)c->linear_num_key_heads * c->linear_key_head_dim +
		       (int64_t)c->linear_num_value_heads * c->linear_value_head_dim;
	case FP4S_D_NV: return c->linear_num_value_heads;
	case FP4S_D_DV: return c->linear_value_head_dim;
	case FP4S_D_VD: return (int64_t)c->linear_num_value_heads * c->linear_value_head_dim;
	case FP4S_D_KC: return c->linear_conv_kernel_dim;
	case FP4S_D_SE: return c->shared_expert_intermediate;
	case FP4S_D_2H: return 2 * c->hidden;
	case FP4S_D_2IE: return 2 * c->moe_intermediate;
	}
	return 0;
}

const struct fp4s_tentry *fp4s_arch_table(enum fp4s_arch a, int32_t *n)
{
	if ((unsigned)a >= FP4S_ARCH_COUNT) {
		*n = 0;
		return NULL;
	}
	*n = tables[a].n;
	return tables[a].t;
}

static int applies(const struct fp4s_config *c, const struct fp4s_tentry *e, int32_t layer)
{
	if ((e->flags & FP4S_TF_UNTIED) && c->tie_embeddings)
		return 0;
	if ((e->flags & FP4S_TF_ATTN_BIAS) && !c->attention_bias)
		return 0;
	if ((e->flags & FP4S_TF_MLP_BIAS) && !c->mlp_bias)
		return 0;
	if (layer >= 0 && (e->flags & FP4S_TF_MOE) && !c->layer_is_moe[layer])
		return 0;
	if (layer >= 0 && (e->flags & FP4S_TF_DENSE) && c->layer_is_moe[layer])
		return 0;
	if (layer >= 0 && (e->flags & FP4S_TF_LINEAR_ATTN) && c->layer_kind[layer] != FP4S_LAYER_LINEAR)
		return 0;
	if (layer >= 0 && (e->flags & FP4S_TF_FULL_ATTN) && c->layer_kind[layer] == FP4S_LAYER_LINEAR)
		return 0;
	if ((e->flags & FP4S_TF_MTP) && c->num_nextn_predict_layers <= 0)
		return 0;
	if ((e->flags & FP4S_TF_PER_EXPERT) && c->experts_fused)
		return 0;
	if ((e->flags & FP4S_TF_FUSED_EXPERTS) && !c->experts_fused)
		return 0;
	return 1;
}

static int push(const struct fp4s_config *c, const struct fp4s_tentry *e, int32_t layer,
                int32_t expert, struct fp4s_tspec *s)
{
	memset(s, 0, sizeof *s);
	if (e->scope == FP4S_SCOPE_EXPERT)
		snprintf(s->name, sizeof s->name, e->pattern, layer, expert);
	else if (e->scope == FP4S_SCOPE_LAYER)
		snprintf(s->name, sizeof s->name, e->pattern, layer);
	else
		snprintf(s->name, sizeof s->name, "%s", e->pattern);
	s->role = e->role;
	s->cls = e->cls;
	s->layer = layer;
	s->expert = expert;
	s->required = !!(e->flags & FP4S_TF_REQ);
	for (int i = 0; i < 3 && e->dims[i] != FP4S_D_NONE; i++) {
		s->shape[i] = fp4s_dim_value(c, e->dims[i]);
		s->ndim = i + 1;
	}
	return 1;
}

int fp4s_tensors_expand(const struct fp4s_config *c, struct fp4s_tspec **out, int32_t *n,
                        struct fp4s_error *err)
{
	int32_t nt;
	const struct fp4s_tentry *t = fp4s_arch_table(c->arch, &nt);
	*out = NULL;
	*n = 0;
	if (!t)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED,
		                      "architecture %s: tensor table not implemented yet (config only)",
		                      fp4s_arch_name(c->arch));
	/* Count first so the array is sized exactly. */
	int64_t count = 0;
	for (int32_t i = 0; i < nt; i++) {
		if (t[i].scope == FP4S_SCOPE_GLOBAL)
			count++;
		else
			count += (int64_t)c->n_layers * (t[i].scope == FP4S_SCOPE_EXPERT ? c->n_experts : 1);
	}
	struct fp4s_tspec *s = calloc((size_t)(count ? count : 1), sizeof *s);
	if (!s)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory for %lld tensor specs",
		                      (long long)count);
	int32_t k = 0;
	/* File order: embeddings, then each layer (its experts together), then the rest. */
	for (int32_t i = 0; i < nt; i++)
		if (t[i].scope == FP4S_SCOPE_GLOBAL && t[i].role == FP4S_ROLE_EMBED && applies(c, &t[i], -1))
			k += push(c, &t[i], -1, -1, &s[k]);
	for (int32_t l = 0; l < c->n_layers; l++)
		for (int32_t i = 0; i < nt; i++) {
			if (t[i].scope == FP4S_SCOPE_GLOBAL || !applies(c, &t[i], l))
				continue;
			if (t[i].scope == FP4S_SCOPE_LAYER)
				k += push(c, &t[i], l, -1, &s[k]);
			else
				for (int32_t e = 0; e < c->n_experts; e++)
					k += push(c, &t[i], l, e, &s[k]);
		}
	for (int32_t i = 0; i < nt; i++)
		if (t[i].scope == FP4S_SCOPE_GLOBAL && t[i].role != FP4S_ROLE_EMBED && applies(c, &t[i], -1))
			k += push(c, &t[i], -1, -1, &s[k]);
	*out = s;
	*n = k;
	return FP4S_OK;
}
