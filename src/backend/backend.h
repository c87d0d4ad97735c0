/* backend.h: the op interface the forward passes are written against (design.md). A backend owns
 * its activation buffers' memory kind (host for CPU, device for CUDA) and the KV cache; the
 * forward pass (engine/forward.c) only orchestrates ops over a flattened batch of tokens from
 * several sequences, so CPU and CUDA run the same layer order.
 *
 * Activations are FP32 [n_tokens, width] row-major in the CPU backend. Weights are struct
 * fp4s_mat views in their checkpoint format (backend/cpu/cpu_ops.h). */
#ifndef FP4S_BACKEND_H
#define FP4S_BACKEND_H

#include <stdint.h>

#include "backend/cpu/cpu_ops.h"
#include "util/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Positions per KV-cache block: the cache is a pool of blocks, and each sequence slot has a row
 * of the block table saying which blocks hold its positions (paged attention). */
#define FP4S_KV_BLOCK 16

/* One forward step's tokens: token i belongs to sequence slot seq[i] at absolute position pos[i].
 * Tokens of one sequence appear in increasing position order. block_table (host, max_seqs rows
 * of table_stride entries) maps slot s's position p to block block_table[s * table_stride +
 * p / FP4S_KV_BLOCK]; NULL lets the forward pass use its own fixed one (slot s owns a
 * contiguous range of blocks). */
struct fp4s_samp_row;  /* engine/sampler.h */
struct fp4s_samp_edit;
struct fp4s_samp_result;

struct fp4s_batch {
	int32_t n;
	/* NULL (backends with argmax_launch): token i is the one the last argmax_launch found for its
	 * row i, as it left it on the device (the next step enqueued before the host has it) */
	const int32_t *tokens;
	const int32_t *pos;
	const int32_t *seq;
	const int32_t *block_table;
	int32_t table_stride;
};

enum fp4s_kv_dtype {
	FP4S_KV_F32 = 0,  /* exact: what the golden tests compare */
	FP4S_KV_BF16 = 1, /* half the bytes per decode step; values rounded to BF16 when written */
	/* a quarter of FP32's bytes: E4M3 (e4m3fn) with scale 1.0, as vLLM's fp8_e4m3 cache without
	 * calibrated scales: round to nearest even, |x| >= 448 saturates to +-448 (fp4s_f32_to_e4m3,
	 * bit-exact with cuda_fp8's __NV_SATFINITE conversion); 3 mantissa bits, so each value is off
	 * by up to 2^-4 of itself (below 2^-6 they are subnormal and lose bits; at or below 2^-10 they become 0) */
	FP4S_KV_FP8 = 2,
};

/* Bytes of one cached K or V element. */
static inline int32_t fp4s_kv_dtype_bytes(enum fp4s_kv_dtype t)
{
	return t == FP4S_KV_FP8 ? 1 : t == FP4S_KV_BF16 ? 2 : 4;
}

struct fp4s_attn_params {
	int32_t n_heads, n_kv_heads, head_dim;
	int32_t window;      /* sliding window in keys including the current one; 0 = full */
	const float *sinks;  /* [n_heads] gpt-oss sink logits, or NULL */
	float scale;         /* 1/sqrt(head_dim) */
};

enum fp4s_router_kind {
	FP4S_ROUTER_SOFTMAX_TOPK = 0, /* Qwen3-MoE: softmax over all experts, top-k, renormalize */
	FP4S_ROUTER_TOPK_SOFTMAX,     /* gpt-oss: top-k of logits, softmax over the k */
};

/* One expert's projections. gate_up (interleaved rows, gpt-oss) or gate + up (SwiGLU halves). */
struct fp4s_expert {
	struct fp4s_mat gate, up, gate_up, down;
};

struct fp4s_moe_params {
	enum fp4s_router_kind router_kind;
	struct fp4s_mat router;
	int32_t n_experts, top_k;
	int32_t norm_topk;          /* Qwen3-MoE norm_topk_prob */
	int32_t oai_swiglu;         /* gpt-oss clamped SwiGLU on interleaved gate/up */
	float swiglu_alpha, swiglu_limit;
	int64_t hidden, inter;
	const struct fp4s_expert *experts;
	void *dev; /* the backend's own stacked copy of the experts, when upload_moe made one */
};

/* What step_prepare sees of a model: its geometry and every layer's uploaded weights (the
 * descriptor itself lives only for the call; the weights it points at for the model's life). */
struct fp4s_step_layer {
	const struct fp4s_mat *qkv; /* the fused q|k|v (NULL: not fused) */
	const struct fp4s_mat *o;
	const float *attn_norm, *ffn_norm, *q_norm, *k_norm;
	int32_t has_bias;  /* any of q, k, v, o has a bias */
	int32_t window;    /* sliding window (0: none) */
	const float *sinks;
	const struct fp4s_moe_params *moe; /* NULL: a dense MLP */
	/* a dense MLP's gate|up with rows alternating (upload_gate_up; NULL: not so uploaded) and
	 * down */
	const struct fp4s_mat *gate_up, *down;
};
struct fp4s_step_desc {
	int32_t n_layers, n_heads, n_kv_heads, head_dim, rot_dim;
	int64_t hidden;
	float eps, attn_scale, rope_mscale;
	const float *inv_freq; /* backend memory, rot_dim / 2 */
	enum fp4s_norm_kind norm_kind;
	int32_t max_ctx;
	const struct fp4s_step_layer *layers;
};

struct fp4s_backend {
	const char *name;
	void *impl;
	/* matmuls over at least this many tokens use the tensor-core W4A16 GEMM (activations rounded
	 * to BF16, ~2e-3 relative to the FP32 reference); fewer, or 0 = never, use the exact decode
	 * kernels. CUDA default 32. */
	int32_t gemm_min_tokens;
	/* KV cache: a pool of n_blocks blocks of FP4S_KV_BLOCK positions per layer, kv_width = nkv*d,
	 * for up to max_seqs sequence slots of up to max_ctx positions */
	int (*kv_init)(struct fp4s_backend *be, int32_t n_layers, int32_t kv_width, int32_t n_blocks,
	               int32_t max_seqs, int32_t max_ctx, enum fp4s_kv_dtype dtype, struct fp4s_error *err);
	void (*kv_clear)(struct fp4s_backend *be, int32_t seq);
	int (*alloc)(struct fp4s_backend *be, void **p, int64_t bytes, struct fp4s_error *err);
	void (*free)(struct fp4s_backend *be, void *p);
	void (*destroy)(struct fp4s_backend *be);
	/* Weight upload: rewrites m's data/scales/bias to backend memory (a no-op on the CPU, where
	 * the views point into the mapped checkpoint). *p of n floats likewise. */
	int (*upload_mat)(struct fp4s_backend *be, struct fp4s_mat *m, struct fp4s_error *err);
	int (*upload_f32)(struct fp4s_backend *be, float **p, int64_t n, struct fp4s_error *err);
	/* Uploads parts[0..n) (one format, one K, one NVFP4 per-tensor scale) into one allocation,
	 * rows in order, and points each part and *fused into it: one decode matmul then streams
	 * q/k/v or gate/up in a single launch. FP4S_EUNSUPPORTED where that buys nothing (the CPU)
	 * or the parts cannot share a launch; the caller then uploads them one by one. */
	int (*upload_fused)(struct fp4s_backend *be, struct fp4s_mat **parts, int n, struct fp4s_mat *fused,
	                    struct fp4s_error *err);
	/* Uploads a dense MLP's gate and up (one FP4 format, K and NVFP4 per-tensor scale) into one
	 * allocation with their rows alternating (fused->pairs): each (gate, up) pair then lands in
	 * one tile of the decode matmul, whose epilogue writes the SwiGLU (norm_matmul_swiglu), and
	 * prompts run one matmul on it and swiglu_pairs. gate and up are left without data. Optional;
	 * FP4S_EUNSUPPORTED: the caller tries upload_fused. */
	int (*upload_gate_up)(struct fp4s_backend *be, struct fp4s_mat *gate, struct fp4s_mat *up,
	                      struct fp4s_mat *fused, struct fp4s_error *err);
	/* Uploads a MoE layer's experts in the backend's own layout (p->dev), so that routing and
	 * expert matmuls stay on the device. FP4S_EUNSUPPORTED: upload the experts one by one. */
	int (*upload_moe)(struct fp4s_backend *be, struct fp4s_moe_params *p, struct fp4s_error *err);
	/* Start of a forward step: makes the batch's token/position/slot arrays visible to the ops
	 * (copied to the device on a GPU). */
	int (*begin)(struct fp4s_backend *be, const struct fp4s_batch *b, struct fp4s_error *err);
	/* Copies bytes of backend memory to the host (waits for the work that produced them). */
	int (*read)(struct fp4s_backend *be, void *host, const void *src, int64_t bytes,
	            struct fp4s_error *err);
	/* out[i] = row tokens[i] of the embedding matrix */
	int (*embed)(struct fp4s_backend *be, const struct fp4s_mat *emb, const struct fp4s_batch *b,
	             float *out, struct fp4s_error *err);
	int (*matmul)(struct fp4s_backend *be, const float *x, int64_t n, const struct fp4s_mat *w,
	              float *y, struct fp4s_error *err);
	void (*rmsnorm)(struct fp4s_backend *be, const float *x, const float *w, int64_t rows,
	                int64_t width, float eps, enum fp4s_norm_kind kind, float *y);
	/* Runs record(ctx), which enqueues the ops of one forward step. A backend that can (CUDA)
	 * captures it once per key as a graph and replays that afterwards; a key names a step shape
	 * whose launches are identical every time (the batch arrays live in buffers begin() fills).
	 * graph_reset drops the captured graphs (after buffers moved). */
	int (*graph_run)(struct fp4s_backend *be, int key, int (*record)(void *ctx, struct fp4s_error *err),
	                 void *ctx, struct fp4s_error *err);
	void (*graph_reset)(struct fp4s_backend *be);
	/* graph_run, then argmax_launch on the n rows of logits, as one graph (key's, a graph a token
	 * slot): the token's launch follows the step's last kernel inside the graph. For a step of one
	 * token whose row is the logits row; the launch also advances the device's copy of that
	 * position, so the next step of one fed token at the next position copies nothing up.
	 * FP4S_EUNSUPPORTED (nothing enqueued) where it does not apply; NULL where no backend has it. */
	int (*graph_run_argmax)(struct fp4s_backend *be, int key, int (*record)(void *ctx, struct fp4s_error *err),
	                        void *ctx, const float *logits, int32_t n, int64_t vocab, struct fp4s_error *err);
	/* The same for sample_launch's rows (its arguments after ctx); FP4S_EUNSUPPORTED (nothing
	 * enqueued) also for rows it does not take in a graph (CUDA: more edits than its copy holds). */
	int (*graph_run_sample)(struct fp4s_backend *be, int key, int (*record)(void *ctx, struct fp4s_error *err),
	                        void *ctx, float *logits, int32_t n, int64_t vocab, const struct fp4s_samp_row *rows,
	                        const struct fp4s_samp_edit *edits, int32_t n_edits, struct fp4s_error *err);
	/* out[i] = argmax of row i of logits [n, vocab] (ties: the lowest id), to the host */
	int (*argmax)(struct fp4s_backend *be, const float *logits, int32_t n, int64_t vocab,
	              int32_t *out, struct fp4s_error *err);
	/* The argmax split in two, so that the next step can be enqueued between them: launch finds
	 * each row's token and keeps it where a batch with tokens NULL reads it (row i: token i);
	 * wait copies the n (<= the launch's) tokens to the host once they are there. NULL where the
	 * backend runs synchronously (the CPU): the forward pass then holds the tokens itself. */
	int (*argmax_launch)(struct fp4s_backend *be, const float *logits, int32_t n, int64_t vocab,
	                     struct fp4s_error *err);
	int (*argmax_wait)(struct fp4s_backend *be, int32_t *out, int32_t n, struct fp4s_error *err);
	/* sample (below) split the same way, for rows without logprobs: launch draws each row's token
	 * and keeps it where a batch with tokens NULL reads it (a row without a finite logit: token
	 * 0 there, -1 to the host); argmax_wait reads the tokens. The launches of both kinds take
	 * their turns in one queue. NULL where argmax_launch is. */
	int (*sample_launch)(struct fp4s_backend *be, float *logits, int32_t n, int64_t vocab,
	                     const struct fp4s_samp_row *rows, const struct fp4s_samp_edit *edits, int32_t n_edits,
	                     struct fp4s_error *err);
	/* out[i] = a token drawn from row i of logits [n, vocab] as rows[i] says (sampler.h's
	 * fp4s_samp_row, its edits in edits[rows[i].edit0 ..]): the token sampler.c would draw for
	 * the same row; lp[i] (sampler.h's fp4s_samp_result: the raw logprobs fp4s_samp_sample gives)
	 * for each row with rows[i].logprobs (lp may be NULL when none has). The logits are
	 * overwritten. NULL where the logits are on the host anyway (the CPU backend): the engine
	 * samples them itself. */
	int (*sample)(struct fp4s_backend *be, float *logits, int32_t n, int64_t vocab, const struct fp4s_samp_row *rows,
	              const struct fp4s_samp_edit *edits, int32_t n_edits, int32_t *out, struct fp4s_samp_result *lp,
	              struct fp4s_error *err);
	/* out[i] = the negative log-likelihood of token targets[i] under row i of logits [n, vocab]:
	 * log(sum exp(l - max)) + max - l[target], the sum in double (perplexity). Host arrays.
	 * NULL where the logits are on the host anyway (the CPU backend). */
	int (*token_nll)(struct fp4s_backend *be, const float *logits, int32_t n, int64_t vocab,
	                 const int32_t *targets, double *out, struct fp4s_error *err);
	/* dst[i] = src[rows[i]] for rows of width floats (rows is a host array) */
	int (*gather_rows)(struct fp4s_backend *be, const float *src, const int32_t *rows, int32_t n,
	                   int64_t width, float *dst, struct fp4s_error *err);
	/* x += y */
	void (*add)(struct fp4s_backend *be, float *x, const float *y, int64_t n);
	/* rotate q [n, nh*d] and k [n, nkv*d] at each token's position */
	void (*rope)(struct fp4s_backend *be, float *q, float *k, const struct fp4s_batch *b,
	             int32_t nh, int32_t nkv, int32_t head_dim, int32_t rot_dim, const float *inv_freq,
	             float mscale);
	/* write k/v of the batch into the layer's cache, then causal attention for every token */
	int (*attention)(struct fp4s_backend *be, int32_t layer, const float *q, const float *k,
	                 const float *v, const struct fp4s_batch *b, const struct fp4s_attn_params *p,
	                 float *out, struct fp4s_error *err);
	/* out[n, inter] = silu(gate) * up, gate/up [n, inter] */
	void (*swiglu)(struct fp4s_backend *be, const float *gate, const float *up, int64_t n,
	               int64_t inter, float *out);
	/* out[n, inter] = silu(gu[t, 2i]) * gu[t, 2i + 1], gu [n, 2 * inter] from a pairs matrix */
	void (*swiglu_pairs)(struct fp4s_backend *be, const float *gu, int64_t n, int64_t inter, float *out);
	/* Fused decode ops, optional (NULL, or FP4S_EUNSUPPORTED with nothing enqueued where a shape
	 * is declined): the forward pass then runs the plain ops they replace, with the same result
	 * within the matmul tolerance. Each saves kernels and passes over the activations.
	 *   norm_matmul:       y = W . rmsnorm(h; nw)        (rmsnorm + matmul)
	 *   matmul_add:        h += W . x                    (matmul + add)
	 *   swiglu_matmul_add: h += W . swiglu(gu), gu [n, 2 * w->cols] = gate | up per token
	 *   norm_rope:         per-head rmsnorm of q (qn) and k (kn), then rope (rmsnorm x 2 + rope)
	 *   moe_add:           h += moe(x)                   (moe + add)
	 *   rope_attention:    norm_rope (qn, kn either NULL: no norm of that one) then attention;
	 *                      q and k may be left as they came (norm_rope + attention)
	 *   norm_matmul_swiglu: g = swiglu(gate, up) of W . rmsnorm(h; nw), W's rows [gate | up],
	 *                      or alternating where w->pairs (norm_matmul + swiglu or swiglu_pairs;
	 *                      g [n, w->rows / 2])
	 *   norm_moe_add:      h += moe(rmsnorm(h; nw))      (rmsnorm + moe + add; the CUDA backend takes
	 *                      one-token steps with the experts on the device) */
	int (*norm_matmul)(struct fp4s_backend *be, const float *h, const float *nw, float eps,
	                   enum fp4s_norm_kind kind, int64_t n, const struct fp4s_mat *w, float *y,
	                   struct fp4s_error *err);
	int (*matmul_add)(struct fp4s_backend *be, const float *x, int64_t n, const struct fp4s_mat *w, float *h,
	                  struct fp4s_error *err);
	int (*swiglu_matmul_add)(struct fp4s_backend *be, const float *gu, int64_t n, const struct fp4s_mat *w,
	                         float *h, struct fp4s_error *err);
	int (*norm_rope)(struct fp4s_backend *be, float *q, float *k, const float *qn, const float *kn, float eps,
	                 enum fp4s_norm_kind kind, const struct fp4s_batch *b, int32_t nh, int32_t nkv,
	                 int32_t head_dim, int32_t rot_dim, const float *inv_freq, float mscale,
	                 struct fp4s_error *err);
	int (*moe_add)(struct fp4s_backend *be, const struct fp4s_moe_params *p, const float *x, int64_t n,
	               float *h, struct fp4s_error *err);
	int (*rope_attention)(struct fp4s_backend *be, int32_t layer, float *q, float *k, float *v, const float *qn,
	                      const float *kn, float eps, enum fp4s_norm_kind kind, const struct fp4s_batch *b,
	                      int32_t rot_dim, const float *inv_freq, float mscale, const struct fp4s_attn_params *p,
	                      float *out, struct fp4s_error *err);
	int (*norm_matmul_swiglu)(struct fp4s_backend *be, const float *h, const float *nw, float eps,
	                          enum fp4s_norm_kind kind, int64_t n, const struct fp4s_mat *w, float *g,
	                          struct fp4s_error *err);
	int (*norm_moe_add)(struct fp4s_backend *be, const struct fp4s_moe_params *p, float *h, const float *nw,
	                    float eps, enum fp4s_norm_kind kind, int64_t n, struct fp4s_error *err);
	/* Optional, a hint (results are the same without it): the next op is a residual add into h
	 * (matmul_add), and the op after that normalizes h with nw (norm_matmul or
	 * norm_matmul_swiglu), so the add may leave h ready for it. */
	void (*norm_next)(struct fp4s_backend *be, const float *h, const float *nw, enum fp4s_norm_kind kind);
	/* Optional, a hint (results are the same within the router's rounding): the next op is a
	 * residual add into h (matmul_add), and the op after that is norm_moe_add(p, h, nw), so the
	 * add may also take the router's logits. */
	void (*moe_next)(struct fp4s_backend *be, const float *h, const float *nw, enum fp4s_norm_kind kind,
	                 const struct fp4s_moe_params *p);
	/* the whole routed MoE block: y[n, hidden] (overwritten) */
	int (*moe)(struct fp4s_backend *be, const struct fp4s_moe_params *p, const float *x, int64_t n,
	           float *y, struct fp4s_error *err);
	/* Optional: a one-token step's every layer in one call, where the backend has a kernel for
	 * the whole model (CUDA: qwen3-moe of qwen3-30b-a3b's geometry, cuda/mstep.cu; dense models
	 * of llama3-8b's or qwen3-8b's, cuda/dstep.cu). step_prepare
	 * runs once, after the uploads and kv_init; FP4S_EUNSUPPORTED (nothing kept) where the model
	 * is not one the backend takes, and step_layers is then never called. step_layers takes h
	 * [1, hidden] (the embedded token of a one-token batch begun with begin()) through all
	 * layers in place, writing the token's K and V into the cache as the layer ops would. */
	int (*step_prepare)(struct fp4s_backend *be, const struct fp4s_step_desc *d, struct fp4s_error *err);
	int (*step_layers)(struct fp4s_backend *be, float *h, struct fp4s_error *err);
};

/* The CPU reference backend. */
int fp4s_backend_cpu_create(struct fp4s_backend **out, struct fp4s_error *err);
/* The CUDA backend on GPU dev (FP4S_ENODEV without a GPU or a CUDA build). */
int fp4s_backend_cuda_create(int dev, struct fp4s_backend **out, struct fp4s_error *err);

#ifdef __cplusplus
}
#endif

#endif
