/* attention_cuda.h: split-K attention over a per-slot KV cache (see attention.cu).
 * kc/vc point at one layer's block pool, [blocks][FP4S_KV_BLOCK][nkv * d] FP32 or BF16; sequence s's
 * position t is in block table[s * table_stride + t / FP4S_KV_BLOCK]; q [n, nh * d] is
 * pre-RoPE'd; pos/seq are device arrays of the batch; out [n, nh * d]. work holds
 * fp4s_cuda_attention_work_floats(n, nh, nkv, d, splits) floats. */
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
/* kc/vc hold FP32, or BF16 when kv_bf16 */
int fp4s_cuda_attention(const void *q, const void *kc, const void *vc, int kv_bf16, const int32_t *pos,
                        const int32_t *seq, const int32_t *table, int32_t table_stride, int32_t n,
                        int32_t nh, int32_t nkv,
                        int32_t d, int32_t window, const float *sinks, float scale, int32_t splits,
                        float *work, float *out, cudaStream_t s, struct fp4s_error *err);
/* once per process: raises the kernels' shared-memory limit */
int fp4s_cuda_attention_setup(struct fp4s_error *err);

#ifdef __cplusplus
}
#endif

#endif
