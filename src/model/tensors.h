/* tensors.h: the per-architecture tensor tables. One X-macro table per architecture lists every
 * tensor: its HF name pattern (%d = layer, a second %d = expert), role, class (which on-disk
 * formats it may take), logical shape as symbols resolved against the config, and when it must
 * exist. Loading, validation, `inspect`, `gen` and `quantize` all expand the same table.
 *
 * Shapes are logical, in nn.Linear orientation [out, in] (experts [E, out, in]). How a class is
 * stored per format is decided in model.c: a LINEAR may be BF16/F16/F32 [out, in] or NVFP4
 * (ModelOpt: weight U8 [out, in/2] + weight_scale F8_E4M3 [out, in/16] + weight_scale_2 F32;
 * compressed-tensors: weight_packed + weight_scale + weight_global_scale); PACKED_EXPERTS
 * (gpt-oss) is MXFP4 NAME_blocks U8 [E, out, in/32, 16] + NAME_scales U8 [E, out, in/32], or
 * BF16 NAME stored transposed [E, in, out] (the dequantized HF layout). */
#ifndef FP4S_TENSORS_H
#define FP4S_TENSORS_H

#include <stdint.h>

#include "model/cfg.h"

enum fp4s_role {
	FP4S_ROLE_EMBED = 0,
	FP4S_ROLE_LM_HEAD,
	FP4S_ROLE_NORM,
	FP4S_ROLE_ATTN_Q,
	FP4S_ROLE_ATTN_K,
	FP4S_ROLE_ATTN_V,
	FP4S_ROLE_ATTN_O,
	FP4S_ROLE_ATTN_BIAS,
	FP4S_ROLE_ATTN_SINKS,
	FP4S_ROLE_MLP_GATE,
	FP4S_ROLE_MLP_UP,
	FP4S_ROLE_MLP_DOWN,
	FP4S_ROLE_ROUTER,
	FP4S_ROLE_ROUTER_BIAS,
	FP4S_ROLE_EXPERT_GATE,
	FP4S_ROLE_EXPERT_UP,
	FP4S_ROLE_EXPERT_DOWN,
	FP4S_ROLE_EXPERTS_GATE_UP, /* gpt-oss packed [E, 2I, H], rows interleaved gate/up */
	FP4S_ROLE_EXPERTS_DOWN,
	FP4S_ROLE_EXPERTS_BIAS,
	FP4S_ROLE_SHARED_GATE,     /* Qwen3-Next shared expert: gate/up/down projections */
	FP4S_ROLE_SHARED_UP,
	FP4S_ROLE_SHARED_DOWN,
	FP4S_ROLE_SHARED_EXPERT_GATE, /* its sigmoid gate [1, H] */
	FP4S_ROLE_GDN_IN,          /* Gated DeltaNet in_proj_qkvz / in_proj_ba */
	FP4S_ROLE_GDN_OUT,
	FP4S_ROLE_GDN_PARAM,       /* conv1d, dt_bias, A_log */
	FP4S_ROLE_MTP,             /* MTP fc */
	FP4S_ROLE_EXPERTS_GATE_UP_CAT, /* transformers v5 fused [E, 2 I_e, H]: gate rows, then up */
	FP4S_ROLE_EXPERTS_DOWN_CAT,    /* transformers v5 fused [E, H, I_e] */
	FP4S_ROLE_COUNT
};

enum fp4s_tclass {
	FP4S_TC_FLOAT = 0,        /* BF16/F16/F32 only: norms, biases, sinks, embeddings */
	FP4S_TC_LINEAR,           /* [out, in]; plain or NVFP4 per the checkpoint */
	FP4S_TC_PACKED_EXPERTS,   /* gpt-oss experts; MXFP4 or BF16 transposed */
};

/* Shape symbols, resolved by fp4s_dim_value. */
enum fp4s_dim {
	FP4S_D_NONE = 0,
	FP4S_D_H,    /* hidden_size */
	FP4S_D_V,    /* vocab_size */
	FP4S_D_QD,   /* num_attention_heads * head_dim */
	FP4S_D_KVD,  /* num_key_value_heads * head_dim */
	FP4S_D_HD,   /* head_dim */
	FP4S_D_NH,   /* num_attention_heads */
	FP4S_D_I,    /* intermediate_size */
	FP4S_D_2I,   /* 2 * intermediate_size (gpt-oss gate_up) */
	FP4S_D_IE,   /* moe_intermediate_size */
	FP4S_D_E,    /* experts */
	FP4S_D_ONE,  /* 1 */
	FP4S_D_2QD,  /* 2 * num_attention_heads * head_dim (Qwen3-Next q_proj: query + gate) */
	FP4S_D_QKVZ, /* 2 * nk * dk + 2 * nv * dv (Qwen3-Next in_proj_qkvz) */
	FP4S_D_BA,   /* 2 * nv (in_proj_ba) */
	FP4S_D_CONV, /* 2 * nk * dk + nv * dv (conv1d channels) */
	FP4S_D_NV,   /* linear_num_value_heads */
	FP4S_D_DV,   /* linear_value_head_dim */
	FP4S_D_VD,   /* nv * dv */
	FP4S_D_KC,   /* linear_conv_kernel_dim */
	FP4S_D_SE,   /* shared_expert_intermediate_size */
	FP4S_D_2H,   /* 2 * hidden_size (MTP fc) */
	FP4S_D_2IE,  /* 2 * moe_intermediate_size */
};

/* When an entry applies. */
enum {
	FP4S_TF_REQ = 1 << 0,       /* required */
	FP4S_TF_OPT = 1 << 1,       /* optional */
	FP4S_TF_UNTIED = 1 << 2,    /* only when tie_word_embeddings is false */
	FP4S_TF_ATTN_BIAS = 1 << 3, /* only when attention_bias */
	FP4S_TF_MOE = 1 << 4,       /* only on MoE layers */
	FP4S_TF_DENSE = 1 << 5,     /* only on dense layers */
	FP4S_TF_MLP_BIAS = 1 << 6,  /* only when mlp_bias */
	FP4S_TF_LINEAR_ATTN = 1 << 7, /* only on Gated DeltaNet layers (Qwen3-Next) */
	FP4S_TF_FULL_ATTN = 1 << 8, /* only on attention layers (full or sliding) */
	FP4S_TF_MTP = 1 << 9,       /* only when num_nextn_predict_layers > 0 */
	FP4S_TF_PER_EXPERT = 1 << 10, /* only with per-expert tensors (the hub layout) */
	FP4S_TF_FUSED_EXPERTS = 1 << 11, /* only with transformers-v5 fused expert tensors */
};

enum fp4s_scope { FP4S_SCOPE_GLOBAL = 0, FP4S_SCOPE_LAYER, FP4S_SCOPE_EXPERT };

struct fp4s_tentry {
	enum fp4s_scope scope;
	const char *pattern;
	enum fp4s_role role;
	enum fp4s_tclass cls;
	uint32_t flags;
	enum fp4s_dim dims[3];
};

/* One expanded table row: a concrete tensor the checkpoint of this config must (or may) hold. */
struct fp4s_tspec {
	char name[160];
	enum fp4s_role role;
	enum fp4s_tclass cls;
	int32_t layer, expert; /* -1 when not applicable */
	int32_t required;
	int32_t ndim;
	int64_t shape[3];
};

const char *fp4s_role_name(enum fp4s_role r);
/* Fused group of a role: 1 = q/k/v, 2 = gate/up (dense or per expert), 0 = none. */
int fp4s_role_fuse_group(enum fp4s_role r);
int64_t fp4s_dim_value(const struct fp4s_config *c, enum fp4s_dim d);
/* The table of an architecture (NULL when there is none). */
const struct fp4s_tentry *fp4s_arch_table(enum fp4s_arch a, int32_t *n);
/* Expands the architecture's table against the config into *out (malloc'd, caller frees). */
int fp4s_tensors_expand(const struct fp4s_config *c, struct fp4s_tspec **out, int32_t *n,
                        struct fp4s_error *err);

#endif
