/* moe_gemm.cu: routed experts for prompts and large batches on the Hopper wgmma GEMM
 * (gemm_wgmma.cu), one grouped launch per projection.
 *
 * The grouped GEMV (gemv_mma.cu / gemv_tma.cu) reads each expert's weights once per group of up
 * to 8 tokens, so a 512-token gpt-oss prompt (64 tokens an expert) reads every expert 8 times
 * over. Here the slots, grouped by expert (fp4s_cuda_moe_group with groups of the GEMM's token
 * tile), go through the tensor-core GEMM: each block computes 128 weight rows of one expert for
 * up to 64 / 128 / 256 of its tokens, so an expert is read once per tile of tokens.
 *
 *   1. the tokens' rows, gathered into expert order (src[row] = token), FP32 -> BF16 with the K
 *      permutation the wgmma kernel wants (gemm_wgmma.cu's header);
 *   2. gate|up: h[row] = W_gu[e] . x + bias, in expert order;
 *   3. SwiGLU of h (gpt-oss's clamped, interleaved form, gate half / up half, or silu of
 *      interleaved rows as the upload pairs Qwen3's experts) straight into the
 *      permuted BF16 input of
 *   4. down: o[row] = W_down[e] . a + bias; the caller's combine reads o through gpos.
 *
 * Numerics: the W4A16 contract of the prefill GEMM (gemm_cuda.h): activations rounded to BF16
 * once per projection, FP32 sums. The grouped GEMV keeps ~16 bits of the activations, so a token
 * computed here and alone differ by that rounding (as dense prompts and decode steps do). */
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/moe_cuda.h"
#include "backend/cuda/swiglu.cuh"
#include "backend/cuda/wgmma_act.cuh"

/* gemm_wgmma.cu (C++ linkage: a mismatch with the definitions fails at link time) */
int fp4s_gemm_wgmma_supported(void);
int fp4s_gemm_wgmma_grouped(const struct fp4s_stacked *w, const int32_t *g_expert, const int32_t *g_off,
                            const int32_t *g_m, int32_t n_groups, int bt, const __nv_bfloat16 *xp, float *y,
                            cudaStream_t s, struct fp4s_error *err);

namespace {

/* out[row] = x[src[row]] (src NULL: x[row]) in BF16, K permuted; K % 64 == 0 */
__global__ void gather_bf16_kernel(const float *__restrict__ x, const int32_t *__restrict__ src, int64_t K,
                                   size_t nchunks, __nv_bfloat16 *__restrict__ out)
{
	const int64_t cpr = K / 8; /* chunks per row */
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nchunks; i += stride) {
		const int64_t r = (int64_t)(i / (size_t)cpr), j = (int64_t)(i % (size_t)cpr);
		reinterpret_cast<uint4 *>(out)[i] = wg_chunk(x + (src ? (int64_t)src[r] : r) * K + wg_chunk_k((size_t)j), 1);
	}
}

/* out[row] = SwiGLU(h[row]) in BF16, K (= inter) permuted (swiglu.cuh: the FP32 values moe.cu's
 * moe_act computes) */
__global__ void act_bf16_kernel(const float *__restrict__ h, int64_t inter, int form, float alpha,
                                float limit, size_t nchunks, __nv_bfloat16 *__restrict__ out)
{
	const int64_t cpr = inter / 8;
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nchunks; i += stride) {
		const int64_t r = (int64_t)(i / (size_t)cpr), j = (int64_t)(i % (size_t)cpr);
		const float *hr = h + r * 2 * inter;
		const int64_t k0 = (int64_t)wg_chunk_k((size_t)j);
		uint32_t o[4];
#pragma unroll
		for (int c = 0; c < 4; c++) {
			const int64_t k = k0 + 16 * c;
			float a0, a1;
			if (form) { /* gate at even rows, up at odd: g0 u0 g1 u1 (1: gpt-oss's clamped form) */
				const float4 v = *reinterpret_cast<const float4 *>(hr + 2 * k);
				a0 = form == 1 ? swiglu_oai(v.x, v.y, alpha, limit) : silu_mul(v.x, v.y);
				a1 = form == 1 ? swiglu_oai(v.z, v.w, alpha, limit) : silu_mul(v.z, v.w);
			} else {
				const float2 g = *reinterpret_cast<const float2 *>(hr + k);
				const float2 u = *reinterpret_cast<const float2 *>(hr + inter + k);
				a0 = silu_mul(g.x, u.x);
				a1 = silu_mul(g.y, u.y);
			}
			o[c] = wg_pack_bf16(a0, a1);
		}
		reinterpret_cast<uint4 *>(out)[i] = make_uint4(o[0], o[1], o[2], o[3]);
	}
}

unsigned grid_for(size_t nchunks)
{
	const size_t b = nchunks / 256 + 1;
	return (unsigned)(b < 8192 ? b : 8192);
}

int env_int(const char *name, int dflt)
{
	const char *e = getenv(name);
	return e && *e ? atoi(e) : dflt;
}

/* FP4 with K % 64 == 0 (whole wgmma steps; NVFP4 rows then hold whole 4-byte scale words and
 * MXFP4 rows an even count of scale bytes, as the kernel's copies need) */
int projection_ok(const struct fp4s_stacked *w)
{
	return (w->fmt == FP4S_WF_NVFP4 || w->fmt == FP4S_WF_MXFP4) && w->cols % 64 == 0 && w->cols <= INT32_MAX &&
	       w->rows <= INT32_MAX && (uintptr_t)w->scales % 4 == 0;
}

} // namespace

/* The token tile (64, 128 or 256) for a batch of n_slots slots over E experts, or 0 where the
 * grouped GEMV should run: no sm_90a kernel, or formats or shapes the GEMM does not take. Every
 * batch of two tokens or more takes the GEMM: on an H100 it beat the grouped GEMV (groups of up
 * to 8 tokens) from 4 streams (half a token an expert) to 64 and on every prompt
 * (bench/results/2026-11-22-h100-moe-gemm.md). FP4S_MOE_GEMM_MIN (an average of tokens an
 * expert below which the grouped GEMV runs; default 0) and FP4S_MOE_GEMM_BT override the rule,
 * FP4S_MOE_GEMM=0 turns the path off. mode 0: never, 1: that rule, 2: wherever the shapes allow
 * (the backend's gemm_min_tokens 0, default, 1). */
extern "C" int fp4s_moe_gemm_tile(const struct fp4s_stacked *gu, const struct fp4s_stacked *down, int32_t n_slots,
                                  int32_t E, int mode)
{
	static int on = -1, min_avg, bt_env; /* benign race: every thread computes the same values */
	if (on < 0) {
		min_avg = env_int("FP4S_MOE_GEMM_MIN", 0);
		bt_env = env_int("FP4S_MOE_GEMM_BT", 0);
		on = env_int("FP4S_MOE_GEMM", 1) != 0 && fp4s_gemm_wgmma_supported();
	}
	if (!on || mode == 0 || E < 1 || !projection_ok(gu) || !projection_ok(down) || gu->rows != 2 * down->cols)
		return 0;
	const double avg = (double)n_slots / E;
	if (mode == 1 && avg < min_avg)
		return 0;
	if (bt_env == 64 || bt_env == 128 || bt_env == 256)
		return bt_env;
	/* a tile a quarter larger than the average group: most experts in one group, little padding */
	return avg * 1.25 <= 64 ? 64 : avg * 1.25 <= 128 ? 128 : 256;
}

extern "C" size_t fp4s_moe_gemm_scratch_bytes(int32_t n_slots, int64_t hidden, int64_t inter)
{
	return (size_t)n_slots * (size_t)(hidden > inter ? hidden : inter) * 2;
}

extern "C" int fp4s_moe_gemm(const struct fp4s_stacked *gu, const struct fp4s_stacked *down, const int32_t *g_expert,
                             const int32_t *g_off, const int32_t *g_m, int32_t n_groups, int bt, const float *x,
                             const int32_t *src, int32_t n_slots, int form, float alpha, float limit, float *h,
                             void *xb, float *o, cudaStream_t s, struct fp4s_error *err)
{
	const int64_t H = gu->cols, I = down->cols;
	if (!projection_ok(gu) || !projection_ok(down) || gu->rows != 2 * I || down->rows != H || n_slots < 1 ||
	    (bt != 64 && bt != 128 && bt != 256))
		return fp4s_error_set(err, FP4S_EINVAL, "moe gemm: gate|up [%lld, %lld], down [%lld, %lld], tile %d",
		                      (long long)gu->rows, (long long)H, (long long)down->rows, (long long)I, bt);
	__nv_bfloat16 *xp = (__nv_bfloat16 *)xb;
	size_t nc = (size_t)n_slots * (size_t)H / 8;
	gather_bf16_kernel<<<grid_for(nc), 256, 0, s>>>(x, src, H, nc, xp);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	int rc = fp4s_gemm_wgmma_grouped(gu, g_expert, g_off, g_m, n_groups, bt, xp, h, s, err);
	if (rc)
		return rc;
	nc = (size_t)n_slots * (size_t)I / 8;
	act_bf16_kernel<<<grid_for(nc), 256, 0, s>>>(h, I, form, alpha, limit, nc, xp);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return fp4s_gemm_wgmma_grouped(down, g_expert, g_off, g_m, n_groups, bt, xp, o, s, err);
}
