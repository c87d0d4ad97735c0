/* gemm_cuda.h: prefill matmul on the GPU, y[M, rows] = x[M, K] . W^T * ws2 (+ bias), for M >= 16
 * tokens, on tensor cores (W4A16: weights decoded to BF16 in shared memory, BF16 MMA, FP32 sums).
 *
 * W is a struct fp4s_mat (backend/cpu/cpu_ops.h) with device pointers in the checkpoint layout:
 * NVFP4 packed E2M1 [rows, K/2] + E4M3 [rows, K/16] + ws2; MXFP4 packed E2M1 + E8M0 [rows, K/32];
 * BF16 [rows, K] (through cuBLAS). x [M, K] and y [M, rows] are FP32 device arrays that must not
 * overlap; bias is a device float[rows] or NULL.
 *
 * Numerics: the FP4 x scale products are exact in BF16 (formats.md §3.4), so the weights lose
 * nothing; the activations are rounded FP32 -> BF16 (RNE) once, which is the W4A16 contract and
 * the only difference from the FP32 CPU reference fp4s_cpu_matmul besides summation order: expect
 * a relative L2 error of ~2e-3 against it (tests allow 5e-3).
 *
 * Shapes: K must be a multiple of 32 (NVFP4 too: the kernel takes 32 codes per load); anything
 * else is FP4S_EUNSUPPORTED and the caller should use fp4s_cuda_matmul (gemv_cuda.h). Any M >= 0,
 * any rows. x must be 4-byte aligned (a 16-byte aligned x takes the vector conversion path). */
#ifndef FP4S_GEMM_CUDA_H
#define FP4S_GEMM_CUDA_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/cpu_ops.h"
#include "util/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueues the matmul on stream s. The BF16 copy of x lives in stream-ordered scratch
 * (cudaMallocAsync/cudaFreeAsync on s); pass your own through fp4s_cuda_gemm_ex to avoid that. */
int fp4s_cuda_gemm(const struct fp4s_mat *w, const float *x, int32_t M, float *y, cudaStream_t s,
                   struct fp4s_error *err);

/* Tuning and test knobs; zeros mean automatic. */
struct fp4s_gemm_tune {
	int bm;     /* token rows per block tile: 64 or 128 (256: the wgmma kernel only) */
	int kernel; /* 1: v1 (one step of weights in registers; what K % 64 == 32 always gets),
	             * 2: v2 (cp.async ring, split-K for small grids) where it applies,
	             * 3: wgmma (Hopper, sm_90a build) where it applies, else as 0,
	             * 0: wgmma where it applies and measured faster (FP4S_GEMM_WGMMA=0 in the
	             *    environment turns that off), else v2, else v1 */
	int decode; /* v2's FP4 -> BF16 decode: 1 = shared byte table, 2 = byte permutes (prmt) */
	int rows;   /* wgmma: weight rows per block tile, 128 or 256 (256 with 64- or 128-token tiles) */
};

/* 1 when the Hopper wgmma kernel (tune->kernel 3) can run on the current device: an sm_90a image
 * in this build and a device of compute capability 9.0; else 0 and kernel 3 runs as kernel 0. */
int fp4s_cuda_gemm_has_wgmma(void);

/* Bytes of scratch fp4s_cuda_gemm_ex needs for this matmul on the current device: the BF16
 * activations, plus split-K partial sums when the grid is small. tune may be NULL. */
size_t fp4s_cuda_gemm_workspace_bytes(const struct fp4s_mat *w, int32_t M,
                                      const struct fp4s_gemm_tune *tune);

/* As fp4s_cuda_gemm; ws (256-byte aligned, >= fp4s_cuda_gemm_workspace_bytes) may be NULL, and
 * tune may be NULL. Results are deterministic (split-K partials are reduced in a fixed order). */
int fp4s_cuda_gemm_ex(const struct fp4s_mat *w, const float *x, int32_t M, float *y, void *ws,
                      size_t ws_bytes, const struct fp4s_gemm_tune *tune, cudaStream_t s,
                      struct fp4s_error *err);

#ifdef __cplusplus
}
#endif

#endif
