/* attention_cuda.h: split-K attention over a per-slot KV cache (see attention.cu).
 * kc/vc point at one layer's block pool, [blocks][FP4S_KV_BLOCK][nkv * d] of kv_dtype (an enum
 * fp4s_kv_dtype: FP32, BF16 or FP8 E4M3); sequence s's
 * position t is in block table[s * table_stride + t / FP4S_KV_BLOCK]; q [n, nh * d] is
 * pre-RoPE'd; pos/seq are device arrays of the batch; out [n, nh * d]. work holds
 * fp4s_cuda_attention_work_floats(n, nh, nkv, d, splits) floats. The launches depend only on
 * (n, nh, nkv, d, splits, kv_dtype, whether sinks/window are set), never on the positions, so a
 * call can be captured in a graph and replayed with new pos/seq/table contents.
 * The tensor-core path (BF16 and FP8 KV) merges the splits in the last block to finish, through counters of
 * its own (a device array, zero between calls): two calls must not run concurrently on
 * different streams of one device. */
#ifndef FP4S_ATTENTION_CUDA_H
#define FP4S_ATTENTION_CUDA_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "util/status.h"

#ifdef __cplusplus
extern "C" {
#endif

int64_t fp4s_cuda_attention_work_floats(int32_t n, int32_t nh, int32_t nkv, int32_t d, int32_t splits);
int fp4s_cuda_attention_smem(int32_t nh, int32_t nkv, int32_t d);
/* kc/vc hold FP32, BF16 or E4M3 bytes, as kv_dtype (enum fp4s_kv_dtype) says */
int fp4s_cuda_attention(const void *q, const void *kc, const void *vc, int kv_dtype, const int32_t *pos,
                        const int32_t *seq, const int32_t *table, int32_t table_stride, int32_t n,
                        int32_t nh, int32_t nkv,
                        int32_t d, int32_t window, const float *sinks, float scale, int32_t splits,
                        float *work, float *out, cudaStream_t s, struct fp4s_error *err);
/* Tuning knobs for tests and dev/attn_bench; zero fields take the defaults. */
struct fp4s_attn_tune {
	int32_t warps;         /* warps per block of the tensor-core kernel: 2, 4 or 8 */
	int32_t blocks_per_sm; /* blocks per (token, KV head) = this x SMs / (n x nkv), <= splits */
	int32_t min_tiles;     /* fewest 16-key tiles per block (one per warp) */
	int32_t unfused;       /* merge the splits in a second kernel rather than in the last block */
	int32_t generic;       /* the CUDA-core kernel even where the tensor-core one applies */
	int32_t stages;        /* KV tiles per warp in a shared-memory ring, 2..4 (fewer where they
	                        * do not fit), or 1: straight into registers */
};
/* Defaults (attention.cu): n x nkv < SMs: 8 warps, 1 block per SM, registers (FP4S_ATTN_STAGES
 * = 2..4: a ring); else 4 warps, 2 blocks per SM, registers. */
int fp4s_cuda_attention_ex(const void *q, const void *kc, const void *vc, int kv_dtype, const int32_t *pos,
                           const int32_t *seq, const int32_t *table, int32_t table_stride, int32_t n,
                           int32_t nh, int32_t nkv, int32_t d, int32_t window, const float *sinks,
                           float scale, int32_t splits, float *work, float *out,
                           const struct fp4s_attn_tune *tune, cudaStream_t s, struct fp4s_error *err);
/* The decode step's attention with its prologue fused in (attention_mma.cuh): q [n, nh * d] and
 * k, v [n, nkv * d] as the projections left them; each block takes the per-head RMSNorm (qn, kn,
 * either NULL; zero_centred: weights + 1) and RoPE (rot of the d dims, pairs (j, j + rot/2),
 * angle pos * inv_freq[j], cos and sin times mscale) of its heads, and the token's k and v rows
 * go into the cache on the way. Launched with PDL where enabled (pdl.cuh). No two tokens of the
 * batch may belong to one sequence. FP4S_EUNSUPPORTED, nothing enqueued, where the tensor-core
 * kernel does not apply (FP32 cache, other head dims or groups) or for batches of as many
 * (token, KV head) pairs as SMs: run the rope and KV write kernels and fp4s_cuda_attention
 * instead. */
struct fp4s_attn_prologue {
	const float *k, *v;
	const float *qn, *kn;
	float eps;
	int32_t zero_centred;
	int32_t rot;
	const float *inv_freq;
	float mscale;
};
int fp4s_cuda_attention_fused(const float *q, void *kc, void *vc, int kv_dtype, const int32_t *pos,
                              const int32_t *seq, const int32_t *table, int32_t table_stride, int32_t n,
                              int32_t nh, int32_t nkv, int32_t d, int32_t window, const float *sinks,
                              float scale, int32_t splits, float *work, float *out,
                              const struct fp4s_attn_prologue *pro, const struct fp4s_attn_tune *tune,
                              cudaStream_t s, struct fp4s_error *err);
/* once per process: raises the kernels' shared-memory limit */
int fp4s_cuda_attention_setup(struct fp4s_error *err);

#ifdef __cplusplus
}
#endif

#endif
