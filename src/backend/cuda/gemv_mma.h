/* gemv_mma.h: the tensor-core FP4 decode matmul (gemv_mma.cu), reached through fp4s_cuda_matmul. */
#ifndef FP4S_GEMV_MMA_H
#define FP4S_GEMV_MMA_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/moe_cuda.h"
#include "util/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = x . W^T (accumulate: y += x . W^T) for NVFP4 / MXFP4 W, any M (16-token passes).
 * FP4S_EUNSUPPORTED (nothing enqueued) for shapes, alignments or scale ranges it does not take,
 * and on the first call of a device when that call is inside a stream capture. kblocks > 0 forces
 * the number of blocks along K (tests, benchmarks). */
int fp4s_gemv_mma(const struct fp4s_mat *w, const float *x, int32_t M, float *y, int accumulate, int kblocks,
                  cudaStream_t s, struct fp4s_error *err);

/* The same with the kernel variant (0 default; 1-3: other warps-per-block / loads-in-flight
 * shapes, M <= 4), the L2 prefetch distance in row tiles (< 0: the default, 0: none) and, for
 * benchmarks, probe = 1..3: see fp4s_gemv_tune (garbage results). */
int fp4s_gemv_mma_ex(const struct fp4s_mat *w, const float *x, int32_t M, float *y, int accumulate, int kblocks,
                     int variant, int probe, int l2pf, cudaStream_t s, struct fp4s_error *err);

/* Benchmarks: each following single-matrix launch writes, per block (up to `blocks`), its
 * %globaltimer readings [entry, after the PDL wait, activations staged, done] into the next of
 * `slots` regions of buf (slots x blocks x 4); buf NULL stops it. */
void fp4s_gemv_mma_stamps(unsigned long long *buf, int slots, int blocks);

/* 0 when FP4S_GEMV_KERNEL=fp32 asks for the FP32 kernels and unfused ops (diagnostics). */
int fp4s_gemv_mma_allowed(void);

/* Fused forms for the decode step: act = 1 makes x SwiGLU of [gate | up] rows of 2K floats per
 * token; norm_w makes x RMSNorm(x) with that weight (eps; zero_centred: 1 + w) over K, each
 * block computing the norm itself; accumulate adds into y (the residual). FP4S_EUNSUPPORTED
 * where it declines. */
int fp4s_gemv_mma_fused(const struct fp4s_mat *w, const float *x, int32_t M, float *y, int accumulate, int act,
                        const float *norm_w, float eps, int zero_centred, cudaStream_t s, struct fp4s_error *err);

/* Activations handed from one one-token decode matmul to the next already staged (gemv_tma.cu's
 * layout), so the next takes them with one bulk copy instead of every block loading and
 * splitting x (the kernel boundary's staging phase). The caller owns the buffers and vouches for
 * them: in, written by the launch just before this one for this x (and, with a norm, this norm
 * weight), in_ss its partial sums of squares (K / 16 floats, needed with a norm); out (never
 * in) receives this launch's output staged for the next, times out_nw (+ 1 where out_zc) when
 * that one normalizes it, with out_ss its partial sums of squares. used_in / made_out say what
 * the launch did (the bulk-copy kernel, one token, K % 128 == 0; otherwise plain x as always). */
struct fp4s_gemv_link {
	const uint8_t *in;
	const float *in_ss;
	uint8_t *out;
	const float *out_nw;
	float *out_ss;
	int out_zc;
	int used_in, made_out;
};

/* bytes a staged one-token activation of K elements takes (in or out above) */
size_t fp4s_gemv_link_bytes(int64_t K);

/* fp4s_gemv_mma_fused / fp4s_gemv_mma_norm_pairs with a link (NULL: none) */
int fp4s_gemv_mma_fused_link(const struct fp4s_mat *w, const float *x, int32_t M, float *y, int accumulate,
                             const float *norm_w, float eps, int zero_centred, struct fp4s_gemv_link *lk,
                             cudaStream_t s, struct fp4s_error *err);
int fp4s_gemv_mma_norm_pairs_link(const struct fp4s_mat *w, const float *x, int32_t M, float *y,
                                  const float *norm_w, float eps, int zero_centred, struct fp4s_gemv_link *lk,
                                  cudaStream_t s, struct fp4s_error *err);

/* y[M, rows / 2] = SwiGLU(gate, up) of W . RMSNorm(x), W's rows [gate | up] (a dense MLP's fused
 * gate|up projection): each block takes a tile of gate rows and then the matching up tile, so
 * the down projection reads the product with no kernel between. rows % 32 == 0, no bias, M <= 16
 * and K unsplit, else FP4S_EUNSUPPORTED with nothing enqueued. Measured slower on llama3-8b decode
 * than the plain projection and a SwiGLU kernel (FP4S_FUSED_SWIGLU=gate selects it). */
int fp4s_gemv_mma_norm_swiglu(const struct fp4s_mat *w, const float *x, int32_t M, float *y, const float *norm_w,
                              float eps, int zero_centred, cudaStream_t s, struct fp4s_error *err);

/* The same for w->pairs (rows alternate gate, up: cuda_upload.cu): y[M][rows / 2] = silu(gate) *
 * up of W . rmsnorm(x; norm_w) (norm_w may be NULL), written by the bulk-copy kernel's epilogue
 * from neighbouring rows of one tile. rows % 16 == 0, M <= 16, that kernel available, else
 * FP4S_EUNSUPPORTED with nothing enqueued. */
int fp4s_gemv_mma_norm_pairs(const struct fp4s_mat *w, const float *x, int32_t M, float *y, const float *norm_w,
                             float eps, int zero_centred, cudaStream_t s, struct fp4s_error *err);

/* The MoE form: y[slot] = W_{idx[slot]} . x_row(slot) for slot < n_slots (moe_cuda.h's
 * fp4s_cuda_expert_matmul), x_row(slot) = x + (slot / x_div) * x_stride; act 1/2 makes x_row
 * SwiGLU(h) of a [2K] row (halves / gpt-oss interleaved with alpha and limit); act 3 interleaved
 * with silu(gate) * up. FP4S_EUNSUPPORTED
 * where it declines (then nothing is enqueued). */
int fp4s_gemv_mma_experts(const struct fp4s_stacked *w, const int32_t *idx, int32_t n_slots, const float *x,
                          int32_t x_div, int64_t x_stride, int act, float alpha, float limit, float *y,
                          cudaStream_t s, struct fp4s_error *err);

/* The same with two fusions for a one-token decode step. norm_w (act 0 only): x_row is
 * RMSNorm(x_row; norm_w) over K (eps; zero_centred: 1 + w), as fp4s_gemv_mma_fused, each block
 * taking the norm itself, so the gate|up projection reads the raw residual. cw and ch (both or
 * neither): the slots are one token's, and after writing y the kernel also does the MoE combine
 * ch[r] += sum_slot cw[slot] * y[slot][r], slots summed in order (as fp4s_cuda_moe_combine). */
int fp4s_gemv_mma_experts_ex(const struct fp4s_stacked *w, const int32_t *idx, int32_t n_slots, const float *x,
                             int32_t x_div, int64_t x_stride, int act, float alpha, float limit, const float *norm_w,
                             float eps, int zero_centred, const float *cw, float *ch, float *y, cudaStream_t s,
                             struct fp4s_error *err);

/* The grouped MoE form for batches: group z (< n_groups, the grid) holds g_m[z] <= gmax tokens
 * (0: unused) of expert g_expert[z]; their x rows are xrow[g_off[z] + i] of x (x_stride floats
 * apart), or rows g_off[z] + i when xrow is NULL (act then as above); y rows g_off[z] + i. Each
 * expert's weights are read once per group instead of once per token. */
/* As fp4s_gemv_mma_experts with plain x, for interleaved gate|up experts: rows 2i and 2i + 1 are
 * (gate, up) and y[slot] (rows / 2 wide) is their SwiGLU (swiglu.cuh; kind 1: gpt-oss's clamped
 * form with alpha and limit, 2: silu(gate) * up), written by the GEMV's epilogue, so the down
 * projection reads plain activations. FP4S_EUNSUPPORTED, with nothing enqueued, where the
 * bulk-copy kernel does not take the shape. */
int fp4s_gemv_mma_experts_pairact(const struct fp4s_stacked *w, const int32_t *idx, int32_t n_slots,
                                  const float *x, int32_t x_div, int64_t x_stride, int kind, float alpha,
                                  float limit, float *y, cudaStream_t s, struct fp4s_error *err);

int fp4s_gemv_mma_grouped(const struct fp4s_stacked *w, const int32_t *g_expert, const int32_t *g_off,
                          const int32_t *g_m, int32_t n_groups, int32_t gmax, const float *x, const int32_t *xrow,
                          int64_t x_stride, int act, float alpha, float limit, float *y, cudaStream_t s,
                          struct fp4s_error *err);
/* The largest group (8, 4, 2, 1; 0 = none) whose staged activations fit for both projections. */
int fp4s_gemv_mma_group_max(const struct fp4s_stacked *gu, const struct fp4s_stacked *down);

/* Per-device setup (workspace, shared-memory limits); done by the first call otherwise, which
 * must then not be inside a stream capture. Call it where the backend is made. */
int fp4s_gemv_mma_setup(cudaStream_t s, struct fp4s_error *err);

/* Measures w's E8M0 scale range into w->e8_range (MXFP4 with device scales; else a no-op).
 * Synchronizes s. */
int fp4s_cuda_mx_scale_range(struct fp4s_mat *w, cudaStream_t s, struct fp4s_error *err);

/* The same over a stacked projection of n_experts experts, into w->e8_range. */
int fp4s_cuda_mx_scale_range_stacked(struct fp4s_stacked *w, int32_t n_experts, cudaStream_t s,
                                     struct fp4s_error *err);

#ifdef __cplusplus
}
#endif

#endif
