/* cpu_ops.h: the CPU reference implementations of the forward-pass building blocks
 * (architectures.md §1). FP32 activations, FP32 accumulation; weights stay in their checkpoint
 * format and are decoded on the fly, a block at a time (no dequantized copy of the model).
 * These are what every CUDA op is tested against, so they favour exactness and clarity; OpenMP
 * spreads the matmul's output rows over cores. */
#ifndef FP4S_CPU_OPS_H
#define FP4S_CPU_OPS_H

#include <stdint.h>

#include "model/model.h"
#include "util/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A weight matrix as the matmul sees it: nn.Linear orientation [rows = out, cols = in].
 * NVFP4: data = packed E2M1 [rows, cols/2], scales = E4M3 [rows, cols/16], ws2 applied to the
 * FP32 sum (the epilogue factor; formats.md §1.3). MXFP4: scales = E8M0 [rows, cols/32].
 * BF16/F16/F32: data = [rows, cols]. bias optional, [rows]. */
struct fp4s_mat {
	enum fp4s_wformat fmt;
	int64_t rows, cols;
	const void *data;
	const uint8_t *scales;
	float ws2;
	const float *bias;
	/* MXFP4 on a GPU: 1 + min + 256 * max of the E8M0 scale bytes (0 = not measured), which the
	 * tensor-core decode needs to place scales in BF16's range (cuda/gemv_mma.cu) */
	int32_t e8_range;
	/* rows alternate gate and up (row 2i: gate row i, 2i + 1: up row i): a backend's gate|up of a
	 * dense MLP (backend.h upload_gate_up); to a matmul it is just a matrix */
	int pairs;
};

/* y[t, r] = sum_k x[t, k] * W[r, k] (+ bias[r]) for t < ntok; x is [ntok, cols], y [ntok, rows]. */
int fp4s_cpu_matmul(const float *x, int64_t ntok, const struct fp4s_mat *w, float *y,
                    struct fp4s_error *err);

/* Decodes row r of W into out[cols] (FP32, exact for every format; ws2 included). */
void fp4s_cpu_mat_row(const struct fp4s_mat *w, int64_t r, float *out);

enum fp4s_norm_kind {
	FP4S_NORM_PLAIN = 0,     /* y = x_hat * w (Llama, Qwen3, gpt-oss in FP32) */
	FP4S_NORM_ZERO_CENTRED,  /* y = x_hat * (1 + w) (Qwen3-Next) */
};

/* RMSNorm over the last dim of x [ntok, n] into y (may alias x); w is [n] FP32. */
void fp4s_cpu_rmsnorm(const float *x, const float *w, int64_t ntok, int64_t n, float eps,
                      enum fp4s_norm_kind kind, float *y);

/* Rotary embedding tables (architectures.md §1.3-§1.4), from the config's rope block. */
/* inv_freq[r/2] and the cos/sin multiplier (yarn's attention factor; 1 otherwise). */
int fp4s_rope_inv_freq(const struct fp4s_rope *p, int32_t rot_dim, float *inv_freq, float *mscale,
                       struct fp4s_error *err);

/* Rotate-half RoPE in place on x [nheads, head_dim] for one token at position pos. The angle is
 * computed in FP32 as pos * inv_freq (as HF does), the tail past rot_dim is left alone. */
void fp4s_cpu_rope(float *x, int32_t nheads, int32_t head_dim, int32_t rot_dim,
                   const float *inv_freq, float mscale, int64_t pos);

/* out[i] = silu(gate[i]) * up[i] for a [ntok, n] pair laid out as separate arrays. */
void fp4s_cpu_swiglu(const float *gate, const float *up, int64_t n, float *out);

/* gpt-oss: gu is [2n] interleaved (gate at even, up at odd indices); out[n] =
 * min(g, limit) * sigmoid(alpha * min(g, limit)) * (clamp(u, -limit, limit) + 1). */
void fp4s_cpu_swiglu_oai(const float *gu, int64_t n, float alpha, float limit, float *out);
/* MoE routing of one token: its K experts (K <= E) from logits[E] into idx (descending; ties to
 * the lower id) and their weights into w. softmax_first (Qwen3-MoE): softmax over all E, top-k,
 * the k renormalized when norm; else (gpt-oss): top-k of the logits, softmax over the k.
 * prob: scratch of E floats (softmax_first only). */
void fp4s_cpu_moe_route(const float *logits, int32_t E, int32_t K, int softmax_first, int norm, float *prob,
                        int32_t *idx, float *w);

#ifdef __cplusplus
}
#endif

#endif
