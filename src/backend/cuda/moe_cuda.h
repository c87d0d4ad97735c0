/* moe_cuda.h: routed experts on the device (see moe.cu). */
#ifndef FP4S_MOE_CUDA_H
#define FP4S_MOE_CUDA_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cpu/cpu_ops.h"
#include "model/model.h"
#include "util/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One projection of all experts, stacked in one device allocation: expert e's [rows, cols]
 * weights start stride_data bytes after expert e-1's (scales: stride_scales bytes; bias: rows
 * floats). NVFP4 experts must share ws2. */
struct fp4s_stacked {
	enum fp4s_wformat fmt;
	int64_t rows, cols;
	const void *data;
	const uint8_t *scales;
	const float *bias;
	int64_t stride_data, stride_scales;
	float ws2;          /* NVFP4 per-tensor scale shared by all experts, or */
	const float *ws2e;  /* NVFP4 per-expert scales [E] (device), when not NULL */
	int32_t e8_range;   /* MXFP4: as struct fp4s_mat's, over all experts (0 = not measured) */
};

/* kind 0: softmax over all experts then top-k (renormalized when norm); kind 1: top-k of the
 * logits, softmax over the k. idx/w are [n, K] device arrays. */
int fp4s_cuda_moe_route(const float *logits, int32_t n, int32_t E, int32_t K, int kind, int norm,
                        int32_t *idx, float *w, cudaStream_t s, struct fp4s_error *err);
/* How far a one-token MoE block is fused (the backend's norm_moe_add): 0 not at all (rmsnorm,
 * router matmul, route, gate|up, down, combine: 6 launches), 1 norm + router + route in one
 * kernel and the norm inside the gate|up GEMV (4), 2 also the combine inside the down GEMV (3),
 * 3 (default) as 2 but the router kernel writes the normalized token for a plain gate|up GEMV
 * (3; the fastest on the H100 and bit-repeatable, where the GEMV's fused norm sums its squares
 * with shared-memory atomics: bench/results/2026-11-22-h100-moe-router.md), 4 as 3 with the
 * SwiGLU as a kernel of its own before the down GEMV (4 launches; each down block then stages I
 * floats rather than 2 I and the exponentials). FP4S_MOE_FUSED = 0..4 picks (A/B comparisons);
 * set_moe_fused forces a mode (tests), -1 back to that. */
int fp4s_cuda_moe_fused(void);

/* The one-token MoE block in one launch (moe_tma.cu): RMSNorm of h, router, top-k into idx / w,
 * the normalized token into x1, gate|up (interleaved pairs, form 1: gpt-oss's clamped SwiGLU, 2:
 * silu(gate) * up) into a1, down into o1 and h += the combine. sync: FP4S_MOE_TMA_SYNC words,
 * zero at upload, then the layer's alone (counters that only grow; word 0 is left to
 * fp4s_cuda_norm_route). FP4S_EUNSUPPORTED (nothing enqueued) where it declines: off by default
 * for NVFP4 experts, and where FP4S_MOE_ONE=0 or set_moe_tma(0) turns it off; 1 on; 2 launches
 * the down GEMV on its own, 3 the routing, 4 both (set_moe_tma(-1): back to the environment). */
#define FP4S_MOE_TMA_KMAX 64
#define FP4S_MOE_TMA_SYNC (2 * (48 + 32 * FP4S_MOE_TMA_KMAX))
int fp4s_cuda_moe_tma(const struct fp4s_stacked *gu, const struct fp4s_stacked *dn, int form, float alpha,
                      float limit, const struct fp4s_mat *router, int32_t K, int kind, int norm, float *h,
                      const float *nw, float eps, int zero_centred, float *lg, unsigned *sync, int32_t *idx, float *w,
                      float *x1, float *a1, float *o1, long long *racc, int local, int dry, cudaStream_t s,
                      struct fp4s_error *err);
/* (racc, local, dry) above: racc[2 * E] (zero at upload, or NULL) the router logits' shares that
 * fp4s_cuda_matmul_add_route adds (gemv_cuda.h; epoch: sync as unsigned long long, word MT_FLAG,
 * FP4S_MOE_TMA_EPOCH); every launch clears the half the layer's next one reads. local: the
 * launch before added them, so every block routes itself from them (mode 1 only: with local set,
 * FP4S_EUNSUPPORTED means the shares were left unread). dry: the checks alone, nothing enqueued
 * (FP4S_OK: a launch with these arguments would run). */
#define FP4S_MOE_TMA_EPOCH 32
void fp4s_cuda_set_moe_tma(int on);
unsigned long long fp4s_cuda_moe_tma_launches(void); /* tests: launches so far */
unsigned long long fp4s_cuda_moe_tma_local_launches(void); /* tests: of those, local ones */
void fp4s_cuda_set_moe_fused(int mode);
/* One token's routing straight from the residual, in one launch: logits lg[E] = router .
 * RMSNorm(h; nw) (+ router bias; eps, zero_centred: 1 + nw), then idx/w [K] as
 * fp4s_cuda_moe_route (kind, norm); xn (may be NULL): RMSNorm(h; nw) itself [H]. cnt: one device
 * counter, zero before the first launch and left zero by each. Router weights BF16, F16 or F32 (E = rows, H = cols); FP4S_EUNSUPPORTED
 * with nothing enqueued for other formats, shapes or alignments. */
int fp4s_cuda_norm_route(const struct fp4s_mat *router, int32_t K, int kind, int norm, const float *h,
                         const float *nw, float eps, int zero_centred, float *lg, unsigned *cnt, int32_t *idx,
                         float *w, float *xn, cudaStream_t s, struct fp4s_error *err);
/* y[slot] = W_{idx[slot]} . x[(slot / x_div) * x_stride] (+ bias) for slot < n_slots */
int fp4s_cuda_expert_matmul(const struct fp4s_stacked *w, const int32_t *idx, int32_t n_slots,
                            const float *x, int32_t x_div, int64_t x_stride, float *y,
                            cudaStream_t s, struct fp4s_error *err);
/* a[slot] = SwiGLU of h[slot] ([2 * inter]; form 0: gate half then up half, 1: gpt-oss's interleaved
 * rows, clamped, 2: interleaved, silu(gate) * up) */
int fp4s_cuda_moe_act(const float *h, int32_t n_slots, int64_t inter, int form, float alpha,
                      float limit, float *a, cudaStream_t s, struct fp4s_error *err);
/* y[t] = sum_j w[t, j] * o[perm[t * K + j]] (perm NULL: o[t * K + j]); accumulate: y[t] += that */
int fp4s_cuda_moe_combine(const float *o, const float *w, const int32_t *perm, int32_t n, int32_t K, int64_t H,
                          int accumulate, float *y, cudaStream_t s, struct fp4s_error *err);
/* Groups a batch's nslots = n * K selected (token, expert) slots by expert: gpos[slot] = its row
 * in expert order, src[row] = its token; groups of <= gmax rows of one expert in g_expert /
 * g_off / g_m, g_m = 0 past the last, over fp4s_cuda_moe_group_count(...) entries. One block,
 * no host synchronisation. */
int32_t fp4s_cuda_moe_group_count(int32_t nslots, int32_t E, int32_t gmax);
int fp4s_cuda_moe_group(const int32_t *idx, int32_t nslots, int32_t K, int32_t E, int32_t gmax, int32_t *gpos,
                        int32_t *src, int32_t *g_expert, int32_t *g_off, int32_t *g_m, cudaStream_t s,
                        struct fp4s_error *err);

/* Prompts and large batches on the Hopper wgmma GEMM (moe_gemm.cu). fp4s_moe_gemm_tile: the
 * token tile (64, 128, 256) to group by for n_slots slots over E experts, 0 where the grouped
 * GEMV should run instead (mode 0: always 0; 1: the default rule; 2: wherever the shapes
 * allow). fp4s_moe_gemm, after fp4s_cuda_moe_group with gmax = that tile:
 * h[row] = gate|up of x[src[row]], then o[row] = down of SwiGLU(h[row]), rows in expert order
 * (n_slots of them); xb: fp4s_moe_gemm_scratch_bytes of device scratch. */
int fp4s_moe_gemm_tile(const struct fp4s_stacked *gu, const struct fp4s_stacked *down, int32_t n_slots, int32_t E,
                       int mode);
size_t fp4s_moe_gemm_scratch_bytes(int32_t n_slots, int64_t hidden, int64_t inter);
int fp4s_moe_gemm(const struct fp4s_stacked *gu, const struct fp4s_stacked *down, const int32_t *g_expert,
                  const int32_t *g_off, const int32_t *g_m, int32_t n_groups, int bt, const float *x,
                  const int32_t *src, int32_t n_slots, int form, float alpha, float limit, float *h,
                  void *xb, float *o, cudaStream_t s, struct fp4s_error *err);

#ifdef __cplusplus
}
#endif

#endif
