/* gemv_cuda.h: decode matmul on the GPU, y[M, rows] = x[M, K] . W^T (+ bias), for M = 1..16 tokens
 * a pass (larger M loops over 16-token passes; the tensor-core GEMM is for prompts).
 *
 * W is a struct fp4s_mat (backend/cpu/cpu_ops.h) whose pointers are device pointers, in the
 * checkpoint layout: NVFP4 packed E2M1 [rows, K/2] + E4M3 [rows, K/16] + ws2; MXFP4 packed E2M1 +
 * E8M0 [rows, K/32] (w->e8_range measured, see gemv_mma.h); BF16 / F16 / F32 [rows, K]. bias is a
 * device float[rows] or NULL. x [M, K] and y [M, rows] are FP32 device arrays that must not
 * overlap. The CPU reference fp4s_cpu_matmul defines the result.
 *
 * FP4 goes to the tensor-core kernel (gemv_mma.cu: activations kept as two BF16 halves, ~2e-6
 * relative, tests allow 3e-5) wherever it takes the shape; dense weights and declined FP4 shapes
 * to the FP32 kernels here (FP32 sums in another order, tests allow 1e-5). Fast-path conditions
 * of the FP32 kernels (else a slower generic kernel runs, with the same results): data, scales
 * and x 16-byte aligned and K a multiple of 32 (FP4) or of 16 bytes / element size (dense). No
 * repacked device layout is needed: the kernels read the checkpoint layout directly. */
#ifndef FP4S_GEMV_CUDA_H
#define FP4S_GEMV_CUDA_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cpu/cpu_ops.h"
#include "util/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueues the matmul on stream s; returns FP4S_OK or an error (bad shape/format, CUDA launch). */
int fp4s_cuda_matmul(const struct fp4s_mat *w, const float *x, int32_t M, float *y, cudaStream_t s,
                     struct fp4s_error *err);

/* Tuning and test knobs; zeros mean automatic. */
struct fp4s_gemv_tune {
	int ksplit;   /* warps that share one group of rows along K, 1..8 */
	int max_tile; /* most tokens per pass over the weights, 1..16 (more passes re-read W) */
	int generic;  /* 1: the slow generic kernel (the test uses it as a second opinion) */
	int prefetch; /* L2 prefetch distance in 32-lane chunk rounds; < 0 = none */
	int rows;     /* rows per warp group for M <= 4: 2 or 4 (8: M = 1 only) */
	int stages;   /* >= 2: weights staged through shared memory by cp.async, this deep; 1 = not */
	int mma;      /* FP4: 1 = the tensor-core kernel only (an error where it declines), -1 = the
	               * FP32 kernels only, 0 = the tensor-core kernel wherever it takes the shape */
	int kblocks;  /* tensor-core kernel: blocks along K (0 = automatic) */
	int variant;  /* tensor-core kernel shape (gemv_mma.h), 0 = default */
	int probe;    /* benchmarks (wrong results): 1 the tensor-core kernel's loads without the math, 2 the
	               * same as if each warp step's bytes were contiguous, 3 the whole kernel on that */
	int l2pf;     /* tensor-core kernel: row tiles prefetched into L2 ahead (0 = default, < 0 = none) */
};

/* y[M][rows] += W x (M <= 16; BF16 / F16 / F32 weights): FP4S_EUNSUPPORTED, with nothing
 * enqueued, for other formats or shapes. */
int fp4s_cuda_matmul_add(const struct fp4s_mat *w, const float *x, int32_t M, float *y, cudaStream_t s,
                         struct fp4s_error *err);

/* The next MoE router's share of one token's residual add (fp4s_cuda_matmul_add_route): the
 * router rows w [E][H] (fmt BF16 / F16 / F32, H = the add's rows), the MoE's norm weight nw
 * (zc: 1 + nw), and where the shares go: acc[(*epoch & 1) * E + e] += round(2^32 * sum over the
 * launch's block of w[e][i] (zc + nw[i]) h[i]), h the updated residual. moe_tma.cu reads and
 * clears them (its epoch counter). */
#define FP4S_GEMV_ROUTE_EMAX 128
struct fp4s_gemv_route {
	const void *w;
	int fmt; /* enum fp4s_wformat */
	int E, zc;
	const float *nw;
	long long *acc;
	const unsigned long long *epoch;
};

/* y[rows] += W x for one token (as fp4s_cuda_matmul_add), each block also adding its share of the
 * router logits (above); FP4S_EUNSUPPORTED, with nothing enqueued, where that kernel declines. */
int fp4s_cuda_matmul_add_route(const struct fp4s_mat *w, const float *x, float *y, const struct fp4s_gemv_route *rt,
                               cudaStream_t s, struct fp4s_error *err);

/* y[M][rows] = W RMSNorm(x; norm_w, eps; zero_centred: 1 + norm_w) (M <= 16; BF16 / F16 / F32
 * weights): FP4S_EUNSUPPORTED, with nothing enqueued, for other formats or shapes. */
int fp4s_cuda_norm_matmul(const struct fp4s_mat *w, const float *x, int32_t M, float *y, const float *norm_w,
                          float eps, int zero_centred, cudaStream_t s, struct fp4s_error *err);

int fp4s_cuda_matmul_ex(const struct fp4s_mat *w, const float *x, int32_t M, float *y,
                        const struct fp4s_gemv_tune *tune, cudaStream_t s, struct fp4s_error *err);

/* all = 1: every one-token launch of the bulk-copy FP4 GEMV (gemv_tma.cu) runs its kernel with
 * tile groups, where it takes none too; 0 (the default): only the launches that take groups.
 * For a model where some launches take groups (MoE experts: a block's 2-4 tiles at once), one
 * kernel for the step's every GEMV keeps its code in the instruction caches (with a kernel a
 * group count, qwen3-30b-a3b decoded 5.6 % slower than with no groups at all); dense models, which
 * take none, keep the plain kernel (the groups' code in it cost llama3-8b 1.7 %). Process-wide; the CUDA
 * backend sets it when it sets up the KV cache, after the weights (session 36). */
void fp4s_gemv_tma_groups(int all);

#ifdef __cplusplus
}
#endif

#endif
