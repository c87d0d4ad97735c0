/* attention_prefill_cuda.h: flash attention for prompt tokens on tensor cores (see
 * attention_prefill.cu). Same arguments and meaning as fp4s_cuda_attention (attention_cuda.h):
 * q [n, nh * d] FP32, RoPE applied; kc/vc one layer's block pool [blocks][FP4S_KV_BLOCK][nkv * d]
 * holding the batch's K/V already; sequence s's position t in block table[s * table_stride +
 * t / FP4S_KV_BLOCK]; pos/seq device arrays of the batch (the tokens of one sequence consecutive,
 * positions increasing); window > 0 keeps keys > pos - window; sinks [nh] or NULL; out [n, nh * d]
 * FP32. Everything is enqueued on s with no host synchronisation or allocation, so a call can be
 * captured in a CUDA graph; its launches depend on n and the shape only.
 *
 * Supported: BF16 or FP8 (E4M3) KV (kv_dtype FP4S_KV_BF16, FP4S_KV_FP8), d = 64 or 128, G = nh /
 * nkv query heads per KV head with 1 <= G <= 64. Anything else (the exact FP32 KV mode included)
 * is FP4S_EUNSUPPORTED and the caller keeps fp4s_cuda_attention.
 *
 * Numerics: q is rounded to BF16 (RNE) once; E4M3 K/V become BF16 exactly; Q.K^T and P.V run as
 * BF16 MMAs with FP32 sums, the
 * online softmax in FP32. P is rounded to BF16 for P.V, as in FlashAttention-2, which costs
 * ~1.7e-3 relative (rms) against a double reference fed the same BF16 q/K/V; the `precise` knob
 * splits P into two BF16 terms (hi + lo) and lands near 1e-5 at the price of a second P.V MMA.
 *
 * work is device scratch of fp4s_cuda_attention_prefill_work_bytes(n) bytes, 4-byte aligned: a
 * tile list built on the device from seq (tiles of consecutive tokens of one sequence).
 *
 * Speed (H100, bench/results/2026-11-21-h100-attention-prefill.md): 30-40x the split-K kernel on
 * 512-token prompts, ~100x at 8192; it also wins on any batch of >= 4 tokens measured, mixed
 * prompt/decode batches included, but loses to split-K on 1-2 tokens at long context (one block
 * per KV head then walks the whole context). */
#ifndef FP4S_ATTENTION_PREFILL_CUDA_H
#define FP4S_ATTENTION_PREFILL_CUDA_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "util/status.h"

#ifdef __cplusplus
extern "C" {
#endif

int64_t fp4s_cuda_attention_prefill_work_bytes(int32_t n);

int fp4s_cuda_attention_prefill(const float *q, const void *kc, const void *vc, int kv_dtype,
                                const int32_t *pos, const int32_t *seq, const int32_t *table,
                                int32_t table_stride, int32_t n, int32_t nh, int32_t nkv, int32_t d,
                                int32_t window, const float *sinks, float scale, void *work, float *out,
                                cudaStream_t s, struct fp4s_error *err);

/* Test and benchmark knobs; zeros give what fp4s_cuda_attention_prefill does. */
struct fp4s_attn_prefill_tune {
	int precise;    /* 1: P.V with P split into BF16 hi + lo (two MMAs) */
	int reuse_plan; /* 1: work already holds the tile list of this batch, made by an earlier
	                 * call on the same device with the same n, nh, nkv, d and knobs (layer 0 of
	                 * this step, say; window and sinks may differ): skip the planning kernel,
	                 * 4 us at 512 tokens to 17 us at 8192 on an H100 */
	int bn;         /* keys per tile (d 64: 64, 128; d 128: 32, 64); 0 with mt 0: automatic */
	int mt;         /* 16-row MMA tiles per warp (1, 2): 64 or 128 query rows per block; 0 with
	                 * bn 0: 2 where the batch makes >= 2 blocks of 128 rows per SM, else 1 */
};

int fp4s_cuda_attention_prefill_ex(const float *q, const void *kc, const void *vc, int kv_dtype,
                                   const int32_t *pos, const int32_t *seq, const int32_t *table,
                                   int32_t table_stride, int32_t n, int32_t nh, int32_t nkv, int32_t d,
                                   int32_t window, const float *sinks, float scale, void *work,
                                   float *out, const struct fp4s_attn_prefill_tune *tune,
                                   cudaStream_t s, struct fp4s_error *err);

/* Raises the kernels' shared-memory limit; the first call of fp4s_cuda_attention_prefill does it
 * too, so calling this at start-up only moves that work out of the first step. */
int fp4s_cuda_attention_prefill_setup(struct fp4s_error *err);

#ifdef __cplusplus
}
#endif

#endif
