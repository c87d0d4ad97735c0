/* cfg.h: config.json of the supported architectures in one struct (architectures.md §1-§6).
 * Field names follow transformers; every spelling architectures.md mentions is accepted
 * (rope_scaling keyed by type or rope_type, transformers v5 rope_parameters, num_local_experts
 * or num_experts, ...). Per-layer facts (attention kind, MoE or dense) are precomputed arrays
 * sized from num_hidden_layers. */
#ifndef FP4S_CFG_H
#define FP4S_CFG_H

#include <stddef.h>
#include <stdint.h>

#include "util/status.h"

enum fp4s_arch {
	FP4S_ARCH_LLAMA = 0,
	FP4S_ARCH_QWEN3,
	FP4S_ARCH_QWEN3_MOE,
	FP4S_ARCH_GPT_OSS,
	FP4S_ARCH_QWEN3_NEXT,
	FP4S_ARCH_COUNT
};

enum fp4s_rope_type { FP4S_ROPE_DEFAULT = 0, FP4S_ROPE_LLAMA3, FP4S_ROPE_YARN };

enum fp4s_layer_kind {
	FP4S_LAYER_FULL = 0,    /* full causal attention */
	FP4S_LAYER_SLIDING,     /* sliding-window attention */
	FP4S_LAYER_LINEAR,      /* Qwen3-Next Gated DeltaNet */
};

struct fp4s_rope {
	enum fp4s_rope_type type;
	double theta;
	double partial_rotary_factor; /* 1.0 except Qwen3-Next (0.25) */
	double factor;
	double low_freq_factor, high_freq_factor;     /* llama3 */
	int64_t original_max_position_embeddings;     /* llama3, yarn */
	double beta_fast, beta_slow;                  /* yarn */
	double attention_factor;                      /* yarn; 0 = derive 0.1 ln(s) + 1 */
	int32_t truncate;                             /* yarn; default 1 */
};

struct fp4s_config {
	enum fp4s_arch arch;
	int64_t hidden;              /* H */
	int32_t n_layers;            /* L */
	int32_t n_heads, n_kv_heads; /* nh, nkv */
	int32_t head_dim;            /* d (H / nh when absent) */
	int64_t intermediate;        /* I: dense MLP width, or gpt-oss per-expert width */
	int64_t vocab;               /* V */
	double rms_eps;
	int64_t max_pos;
	struct fp4s_rope rope;
	int32_t tie_embeddings;
	int32_t attention_bias, mlp_bias;
	int32_t sliding_window;      /* 0 = none */
	int32_t use_sliding_window, max_window_layers; /* Qwen3 */
	/* MoE */
	int32_t n_experts, n_experts_per_tok;
	int64_t moe_intermediate;    /* I_e (Qwen3-MoE, Qwen3-Next) */
	int32_t norm_topk_prob, decoder_sparse_step;
	double swiglu_limit, swiglu_alpha; /* gpt-oss */
	/* Qwen3-Next */
	int32_t full_attention_interval;
	int32_t linear_num_key_heads, linear_num_value_heads;
	int32_t linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim;
	int64_t shared_expert_intermediate;
	int32_t num_nextn_predict_layers;
	/* Set by the loader, not config.json: routed experts stored fused per layer as transformers
	 * v5 re-saves them (mlp.experts.gate_up_proj [E, 2 I_e, H], gate half first, and
	 * mlp.experts.down_proj [E, H, I_e]) instead of the hub's per-expert tensors. */
	int32_t experts_fused;
	/* tokens */
	int64_t bos_token_id, pad_token_id; /* -1 when absent */
	int64_t eos_token_ids[8];
	int32_t n_eos;
	char torch_dtype[16];
	/* per layer, n_layers entries */
	uint8_t *layer_kind;         /* enum fp4s_layer_kind */
	uint8_t *layer_is_moe;
};

const char *fp4s_arch_name(enum fp4s_arch a);
int fp4s_config_load(const char *path, struct fp4s_config *c, struct fp4s_error *err);
/* Parses a config from a JSON text (path names it in messages). */
int fp4s_config_parse(const char *text, size_t len, const char *path, struct fp4s_config *c,
                      struct fp4s_error *err);
void fp4s_config_free(struct fp4s_config *c);

#endif
