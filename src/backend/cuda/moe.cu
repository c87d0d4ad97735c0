/* moe.cu: routed experts on the device, with no host round trip (so MoE decode steps can be
 * replayed as CUDA graphs):
 *   route:   router logits [n, E] -> top-k expert ids and weights per token (Qwen3-MoE: softmax
 *            over all experts, top-k, optional renormalization; gpt-oss: top-k of the logits,
 *            softmax over the k), ties to the lower expert id as on the CPU;
 *   norm_route: for one token, the layer's RMSNorm, the router matmul and the route above in one
 *            launch (decode steps are bound by launches, not by the router's few hundred KB);
 *   matmul:  y[s] = W_{idx[s]} . x_row(s) for every selected slot s = token * k + j, experts
 *            stacked in one allocation at a fixed stride, one launch for all slots;
 *   combine: y[t] = sum_j w[t, j] * o[t * k + j] (expert biases were added by the matmul).
 *
 * The expert matmul streams only the selected experts' weights. A warp owns 4 output rows; lanes
 * take 16-byte chunks along K (32 FP4 codes or 8 BF16, each warp load 512 contiguous bytes a row),
 * load the matching activations once as float4s and use them for all 4 rows, with the 4 rows'
 * weight loads issued before any arithmetic. The grid (row groups x selected experts) holds
 * thousands of warps, which keeps enough loads in flight at batch 1. */
#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>

#include "backend/cuda/arrive.cuh"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/route.cuh"
#include "backend/cuda/swiglu.cuh"
#include "backend/cuda/moe_cuda.h"
#include "numerics/numerics.h"

/* One warp per token (blockIdx.x) over its row of router logits. */
static __global__ void moe_route_kernel(const float *__restrict__ logits, int32_t E, int32_t K,
                                        int kind, int norm, int32_t *__restrict__ idx,
                                        float *__restrict__ w)
{
	TL_SCOPE(TL_SMALL + 1, __LINE__);
	pdl_enter();
	TL_MARK(1);
	extern __shared__ float pr[]; /* [E] values, then [E] taken flags */
	uint8_t *taken = reinterpret_cast<uint8_t *>(pr + E);
	__shared__ int32_t sel[64];
	__shared__ float selv[64];
	const float *l = logits + (int64_t)blockIdx.x * E;
	for (int32_t e = threadIdx.x; e < E; e += 32) {
		pr[e] = l[e];
		taken[e] = 0;
	}
	route_warp(pr, taken, E, K, kind, norm, sel, selv, idx + blockIdx.x * K, w + blockIdx.x * K);
}

/* RMSNorm + router logits + top-k for one token in one launch (fp4s_cuda_norm_route). Block b's
 * NR_WARPS warps take router rows b * NR_WARPS + warp, one row a warp: lanes stride over 16-byte
 * chunks of the row, and up to PRE chunks of each lane (the whole row of the models we run) are
 * loaded before pdl_wait: the router weights depend on no earlier kernel, so they stream while
 * the previous one finishes, and nothing after the wait goes to DRAM. Every block normalizes the
 * token itself: h is one row of a few KB, read from L2 with all of a thread's loads in flight,
 * which costs less than a separate norm launch. The block stages h * norm weight in shared
 * memory and applies 1 / rms to each dot product (it commutes). The logits go to global memory;
 * the last block to finish (a counter, reset for the next launch, as gemv_mma.cu's split-K) reads
 * them back and routes them: with up to 256 experts by its warp 0 with the logits in registers
 * (route_reg), else by all its warps (route_block); both give route_warp's ids and weights, the
 * code moe_route_kernel runs, for the same logits. Nothing depends on arrival order. xn (may be NULL):
 * block 0 also writes the normalized token there. */
#define NR_WARPS 4
#define NR_NV 6 /* float4s of h a thread loads at once: H <= 3072 in one round */
#define NR_RANK_MAX 1024 /* experts route_block ranks (each thread compares against all E) */

/* FP4S_WF_BF16, FP4S_WF_F16, FP4S_WF_F32; chunks a lane preloads; C: fp4s_diag_clone's copy.
 * The bound of 1 block: with none, ptxas held PRE = 8 (qwen3-30b-a3b's) to 127 registers and
 * spilled around the warm-up call (140 without a spill; 32 blocks a launch, few an SM). */
template <int FMT, int PRE, int C = 0>
static __global__ void __launch_bounds__(NR_WARPS * 32, 1)
norm_route_kernel(const uint8_t *__restrict__ rw, const float *__restrict__ rb, int32_t E, int32_t H,
                  const float *__restrict__ h, const float *__restrict__ nw, float eps, int zc, int32_t K,
                  int kind, int norm, float *__restrict__ lg, unsigned *__restrict__ cnt,
                  int32_t *__restrict__ idx, float *__restrict__ w, float *__restrict__ xn, int warm)
{
	extern __shared__ __align__(16) float xs[]; /* [H] h * norm weight; the last block: logits, keys (route.cuh) */
	__shared__ float red[NR_WARPS];
	__shared__ int32_t sel[64];
	__shared__ float selv[64];
	__shared__ int last;
	pdl_trigger();
	TL_SCOPE(TL_NORM_ROUTE, rw);
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int32_t r = blockIdx.x * NR_WARPS + warp;
	constexpr int EPC = FMT == FP4S_WF_F32 ? 4 : 8; /* elements per 16-byte chunk */
	const int32_t nq = H / EPC;
	const uint4 *wr = reinterpret_cast<const uint4 *>(rw) + (size_t)min(r, E - 1) * nq;
	uint4 pre[PRE];
#pragma unroll
	for (int i = 0; i < PRE; i++)
		pre[i] = lane + 32 * i < nq ? __ldg(wr + lane + 32 * i) : make_uint4(0, 0, 0, 0);
	/* the top-k by route_reg, 4 or 8 experts a lane (0: route_block) */
	const int reg = !(warm & 2) ? 0 : E <= 128 ? 4 : E <= 256 ? 8 : 0;
	if ((warm & 1) && reg) { /* the top-k's code warm (route.cuh) */
		if (warp == 0 && reg == 4)
			route_warm_reg<4>(K, kind, norm, sel, selv);
		else if (warp == 0)
			route_warm_reg<8>(K, kind, norm, sel, selv);
	} else if ((warm & 1) && E <= NR_RANK_MAX)
		route_warm_block<NR_WARPS * 32>(K, kind, norm, sel, selv);
	else if ((warm & 1) && warp == 0)
		route_warm(K, kind, norm, sel, selv);
	pdl_wait(); /* h is the previous kernel's output */
	TL_MARK(1);
	const float c = zc ? 1.0f : 0.0f;
	float ss = 0.0f;
	for (int32_t base = 0; base < H; base += 4 * NR_WARPS * 32 * NR_NV) {
		float4 v[NR_NV], g[NR_NV];
#pragma unroll
		for (int u = 0; u < NR_NV; u++) {
			const int32_t i = base + 4 * (threadIdx.x + u * NR_WARPS * 32);
			if (i < H) {
				v[u] = *reinterpret_cast<const float4 *>(h + i);
				g[u] = __ldg(reinterpret_cast<const float4 *>(nw + i));
			}
		}
#pragma unroll
		for (int u = 0; u < NR_NV; u++) {
			const int32_t i = base + 4 * (threadIdx.x + u * NR_WARPS * 32);
			if (i < H) {
				ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
				*reinterpret_cast<float4 *>(xs + i) = make_float4(v[u].x * (c + g[u].x), v[u].y * (c + g[u].y),
				                                                  v[u].z * (c + g[u].z), v[u].w * (c + g[u].w));
			}
		}
	}
	for (int o = 16; o; o >>= 1)
		ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
	if (lane == 0)
		red[warp] = ss;
	__syncthreads();
	ss = 0.0f;
#pragma unroll
	for (int i = 0; i < NR_WARPS; i++)
		ss += red[i];
	const float inv = 1.0f / sqrtf(ss / (float)H + eps);
	if (xn && blockIdx.x == 0)
		for (int32_t i = threadIdx.x; i < H; i += NR_WARPS * 32)
			xn[i] = xs[i] * inv;
	float acc = 0.0f;
#pragma unroll
	for (int i = 0; i < PRE; i++)
		if (lane + 32 * i < nq)
			acc += nr_chunk_dot<FMT>(pre[i], xs + (size_t)(lane + 32 * i) * EPC);
	for (int32_t q = lane + 32 * PRE; q < nq; q += 32) /* rows longer than PRE chunks a lane */
		acc += nr_chunk_dot<FMT>(__ldg(wr + q), xs + (size_t)q * EPC);
	for (int o = 16; o; o >>= 1)
		acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);
	if (lane == 0 && r < E)
		lg[r] = acc * inv + (rb ? rb[r] : 0.0f);
	__syncthreads(); /* also: every warp is done with xs */
	if (threadIdx.x == 0)
		last = fp4s_arrive(cnt) == gridDim.x - 1;
	TL_MARK(2);
	__syncthreads();
	if (!last)
		return;
	if (reg) { /* the last block's warp 0, the logits in registers */
		if (threadIdx.x == 0)
			*cnt = 0; /* ready for the next launch */
		if (warp == 0 && reg == 4)
			route_reg<4>(lg, 0, E, K, kind, norm, sel, selv, idx, w, TL_REC());
		else if (warp == 0)
			route_reg<8>(lg, 0, E, K, kind, norm, sel, selv, idx, w, TL_REC());
		TL_MARK(5);
		return;
	}
	/* the last block: every warp takes part in the top-k (route_block) */
	float *pr = xs;
	for (int32_t e = threadIdx.x; e < E; e += NR_WARPS * 32)
		pr[e] = __ldcg(lg + e);
	if (threadIdx.x == 0)
		*cnt = 0; /* ready for the next launch */
	__syncthreads();
	TL_MARK(4);
	if (E <= NR_RANK_MAX) {
		route_block<NR_WARPS * 32>(pr, reinterpret_cast<uint32_t *>(xs + ROUTE_KEYS_AT(E)), E, K, kind, norm, sel, selv, idx, w,
		                           TL_REC());
	} else if (warp == 0) { /* more experts than any model has: the rounds of one warp */
		uint8_t *taken = reinterpret_cast<uint8_t *>(xs + E);
		for (int32_t e = lane; e < E; e += 32)
			taken[e] = 0;
		route_warp(pr, taken, E, K, kind, norm, sel, selv, idx, w);
	}
	TL_MARK(5);
}

template <int FMT>
static cudaError_t nr_launch(int32_t nq, dim3 grid, size_t smem, cudaStream_t s, const uint8_t *d, const float *rb,
                             int32_t E, int32_t H, const float *h, const float *nw, float eps, int zc, int32_t K,
                             int kind, int norm, float *lg, unsigned *cnt, int32_t *idx, float *w, float *xn,
                             int warm)
{
#ifdef FP4S_DIAG_CLONE
	if (fp4s_diag_clone(16))
		return nq <= 32 * 4 ? pdl_launch(norm_route_kernel<FMT, 4, 1>, grid, NR_WARPS * 32, smem, s, d, rb, E, H, h,
		                                 nw, eps, zc, K, kind, norm, lg, cnt, idx, w, xn, warm)
		       : nq <= 32 * 8 ? pdl_launch(norm_route_kernel<FMT, 8, 1>, grid, NR_WARPS * 32, smem, s, d, rb, E, H,
		                                   h, nw, eps, zc, K, kind, norm, lg, cnt, idx, w, xn, warm)
		                      : pdl_launch(norm_route_kernel<FMT, 16, 1>, grid, NR_WARPS * 32, smem, s, d, rb, E, H,
		                                   h, nw, eps, zc, K, kind, norm, lg, cnt, idx, w, xn, warm);
#endif
	if (nq <= 32 * 4)
		return pdl_launch(norm_route_kernel<FMT, 4>, grid, NR_WARPS * 32, smem, s, d, rb, E, H, h, nw, eps, zc, K,
			kind, norm, lg, cnt, idx, w, xn, warm);
	if (nq <= 32 * 8)
		return pdl_launch(norm_route_kernel<FMT, 8>, grid, NR_WARPS * 32, smem, s, d, rb, E, H, h, nw, eps, zc, K,
			kind, norm, lg, cnt, idx, w, xn, warm);
	return pdl_launch(norm_route_kernel<FMT, 16>, grid, NR_WARPS * 32, smem, s, d, rb, E, H, h, nw, eps, zc, K,
		kind, norm, lg, cnt, idx, w, xn, warm);
}

/* E2M1 code -> float via the FP16 bit trick (formats.md §2.2): value * 2^-14, exact */
static __device__ __forceinline__ float e2m1_scaled(uint32_t code)
{
	const unsigned short h = (unsigned short)(((code & 8u) << 12) | ((code & 7u) << 9));
	return __half2float(__ushort_as_half(h));
}

#define EXP_ROWS 4 /* rows per warp: one x chunk in registers feeds them all */

template <int FMT> /* FP4S_WF_NVFP4, FP4S_WF_MXFP4, FP4S_WF_BF16 */
static __global__ void expert_matmul_kernel(const uint8_t *__restrict__ data, const uint8_t *__restrict__ scales,
                                            const float *__restrict__ bias, int64_t rows, int64_t K,
                                            int64_t stride_data, int64_t stride_scales, float post,
                                            const float *__restrict__ ws2e, const int32_t *__restrict__ idx,
                                            const float *__restrict__ x, int32_t x_div, int64_t x_stride,
                                            float *__restrict__ y)
{
	TL_SCOPE(TL_SMALL + 1, __LINE__);
	pdl_enter();
	TL_MARK(1);
	const int32_t slot = blockIdx.y;
	const int64_t r0 = ((int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * EXP_ROWS;
	const int lane = threadIdx.x & 31;
	if (r0 >= rows)
		return;
	const int32_t e = idx[slot];
	const float *xr = x + (int64_t)(slot / x_div) * x_stride;
	const uint8_t *wd = data + (size_t)e * stride_data;
	const uint8_t *sc = scales ? scales + (size_t)e * stride_scales : NULL;
	constexpr int EPC = FMT == FP4S_WF_BF16 ? 8 : 32; /* elements per 16-byte chunk */
	float acc[EXP_ROWS];
#pragma unroll
	for (int q = 0; q < EXP_ROWS; q++)
		acc[q] = 0.0f;
	for (int64_t c = (int64_t)lane * EPC; c < K; c += 32 * EPC) {
		float xv[EPC];
#pragma unroll
		for (int v = 0; v < EPC / 4; v++) {
			const float4 f = __ldg((const float4 *)(xr + c) + v);
			xv[4 * v] = f.x, xv[4 * v + 1] = f.y, xv[4 * v + 2] = f.z, xv[4 * v + 3] = f.w;
		}
		uint4 wv[EXP_ROWS];
#pragma unroll
		for (int q = 0; q < EXP_ROWS; q++) { /* all rows' loads in flight before any math */
			const int64_t r = r0 + q < rows ? r0 + q : rows - 1;
			wv[q] = FMT == FP4S_WF_BF16 ? __ldg((const uint4 *)((const uint16_t *)wd + r * K + c))
			                            : __ldg((const uint4 *)(wd + r * (K / 2) + c / 2));
		}
#pragma unroll
		for (int q = 0; q < EXP_ROWS; q++) {
			const int64_t r = r0 + q < rows ? r0 + q : rows - 1;
			const uint32_t w4[4] = {wv[q].x, wv[q].y, wv[q].z, wv[q].w};
			if (FMT == FP4S_WF_BF16) {
#pragma unroll
				for (int u = 0; u < 4; u++)
					acc[q] += __uint_as_float(w4[u] << 16) * xv[2 * u] +
					          __uint_as_float(w4[u] & 0xFFFF0000u) * xv[2 * u + 1];
			} else {
				float part[2] = {0.0f, 0.0f};
#pragma unroll
				for (int u = 0; u < 4; u++)
#pragma unroll
					for (int b = 0; b < 8; b++)
						part[u / 2] += e2m1_scaled(fp4s_e2m1_perm_code(w4[u], b)) * xv[8 * u + b];
				if (FMT == FP4S_WF_NVFP4) {
					const uint8_t *s = sc + r * (K / 16) + c / 16;
					acc[q] += part[0] * fp4s_e4m3_to_f32(s[0]) + part[1] * fp4s_e4m3_to_f32(s[1]);
				} else {
					acc[q] += (part[0] + part[1]) * fp4s_e8m0_to_f32(sc[r * (K / 32) + c / 32]);
				}
			}
		}
	}
#pragma unroll
	for (int q = 0; q < EXP_ROWS; q++) {
		float v = acc[q];
		for (int o = 16; o > 0; o >>= 1)
			v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
		const int64_t r = r0 + q;
		if (lane == 0 && r < rows)
			y[(int64_t)slot * rows + r] = v * post * (ws2e ? ws2e[e] : 1.0f) + (bias ? bias[(size_t)e * rows + r] : 0.0f);
	}
}

static __global__ void moe_act_kernel(const float *__restrict__ h, int64_t inter, int form,
                                      float alpha, float limit, float *__restrict__ a)
{
	TL_SCOPE(TL_SMALL + 1, __LINE__);
	pdl_enter();
	TL_MARK(1);
	const int32_t slot = blockIdx.y;
	const float *hs = h + (int64_t)slot * 2 * inter;
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < inter; i += (int64_t)gridDim.x * blockDim.x) {
		float out;
		if (form == 1) /* gpt-oss: gate at even rows, up at odd; clamped SwiGLU */
			out = swiglu_oai(hs[2 * i], hs[2 * i + 1], alpha, limit);
		else if (form == 2) /* interleaved at upload */
			out = silu_mul(hs[2 * i], hs[2 * i + 1]);
		else /* gate half, then up half */
			out = silu_mul(hs[i], hs[inter + i]);
		a[(int64_t)slot * inter + i] = out;
	}
}

static __global__ void moe_combine_kernel(const float *__restrict__ o, const float *__restrict__ w,
                                          const int32_t *__restrict__ perm, int32_t K, int64_t H, int accumulate,
                                          float *__restrict__ y)
{
	TL_SCOPE(TL_SMALL + 1, __LINE__);
	pdl_enter();
	TL_MARK(1);
	const int32_t t = blockIdx.y;
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < H; i += (int64_t)gridDim.x * blockDim.x) {
		float acc = 0.0f;
		for (int32_t j = 0; j < K; j++) {
			const int64_t row = perm ? perm[t * K + j] : (int64_t)t * K + j;
			acc += w[t * K + j] * o[row * H + i];
		}
		y[(int64_t)t * H + i] = accumulate ? y[(int64_t)t * H + i] + acc : acc;
	}
}

extern "C" int fp4s_cuda_moe_route(const float *logits, int32_t n, int32_t E, int32_t K, int kind,
                                   int norm, int32_t *idx, float *w, cudaStream_t s,
                                   struct fp4s_error *err)
{
	if (K < 1 || K > 64 || K > E || E > 8192)
		return fp4s_error_set(err, FP4S_EINVAL, "moe: top-%d of %d experts", K, E);
	pdl_launch(moe_route_kernel, dim3(n), 32, (size_t)E * (sizeof(float) + 1), s, logits, E, K, kind, norm, idx, w);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

static int moe_fused_forced = -1;

extern "C" int fp4s_cuda_moe_fused(void)
{
	static int env = -1;
	if (moe_fused_forced >= 0)
		return moe_fused_forced;
	if (env < 0) {
		const char *ev = getenv("FP4S_MOE_FUSED");
		env = ev && *ev >= '0' && *ev <= '4' && !ev[1] ? *ev - '0' : 3;
	}
	return env;
}

extern "C" void fp4s_cuda_set_moe_fused(int mode) { moe_fused_forced = mode >= 0 && mode <= 4 ? mode : -1; }

extern "C" int fp4s_cuda_norm_route(const struct fp4s_mat *router, int32_t K, int kind, int norm, const float *h,
                                   const float *nw, float eps, int zero_centred, float *lg, unsigned *cnt,
                                   int32_t *idx, float *w, float *xn, cudaStream_t s, struct fp4s_error *err)
{
	const int64_t E = router->rows, H = router->cols;
	const int esz = router->fmt == FP4S_WF_F32 ? 4 : 2;
	const int64_t lb = E <= NR_RANK_MAX ? (int64_t)ROUTE_SCRATCH(E) : (E * 5 + 15) / 16 * 16; /* the last block's logits, keys/flags */
	const size_t smem = (size_t)(H * 4 > lb ? H * 4 : lb);
	if ((router->fmt != FP4S_WF_BF16 && router->fmt != FP4S_WF_F16 && router->fmt != FP4S_WF_F32) || K < 1 ||
	    K > 64 || K > E || E > 8192 || H < 4 || H % (16 / esz) || H > (1 << 20) || smem > 48 * 1024 ||
	    ((uintptr_t)router->data & 15) || ((uintptr_t)h & 15) || ((uintptr_t)nw & 15))
		return FP4S_EUNSUPPORTED;
	const dim3 grid((unsigned)((E + NR_WARPS - 1) / NR_WARPS));
	const uint8_t *d = (const uint8_t *)router->data;
	/* bit 0: the top-k's code warmed up (FP4S_ROUTE_WARM=0: not, A/B); bit 1: the top-k by
	 * route_reg where E <= 256 (FP4S_ROUTE_REG=0: by route_block, A/B) */
	static int warm_off = -1, reg_off = -1;
	const int warm = !fp4s_env_off("FP4S_ROUTE_WARM", &warm_off) | (!fp4s_env_off("FP4S_ROUTE_REG", &reg_off) << 1);
	const int32_t nq = (int32_t)(H * esz / 16);
	cudaError_t e;
	switch (router->fmt) {
	case FP4S_WF_BF16:
		e = nr_launch<FP4S_WF_BF16>(nq, grid, smem, s, d, router->bias, (int32_t)E, (int32_t)H, h, nw, eps,
		                            zero_centred, K, kind, norm, lg, cnt, idx, w, xn, warm);
		break;
	case FP4S_WF_F16:
		e = nr_launch<FP4S_WF_F16>(nq, grid, smem, s, d, router->bias, (int32_t)E, (int32_t)H, h, nw, eps,
		                           zero_centred, K, kind, norm, lg, cnt, idx, w, xn, warm);
		break;
	default:
		e = nr_launch<FP4S_WF_F32>(nq, grid, smem, s, d, router->bias, (int32_t)E, (int32_t)H, h, nw, eps,
		                           zero_centred, K, kind, norm, lg, cnt, idx, w, xn, warm);
	}
	FP4S_CUDA_TRY(err, e);
	return FP4S_OK;
}

extern "C" int fp4s_cuda_expert_matmul(const struct fp4s_stacked *w, const int32_t *idx, int32_t n_slots,
                                       const float *x, int32_t x_div, int64_t x_stride, float *y,
                                       cudaStream_t s, struct fp4s_error *err)
{
	const int warps = 8;
	const int64_t per_block = (int64_t)warps * EXP_ROWS;
	const dim3 grid((unsigned)((w->rows + per_block - 1) / per_block), (unsigned)n_slots);
	const float post = w->fmt == FP4S_WF_NVFP4 && !w->ws2e ? w->ws2 * 16384.0f : 16384.0f;
	/* 16-byte chunks of weights and activations: K a multiple of the chunk, x rows aligned */
	if (w->cols % (w->fmt == FP4S_WF_BF16 ? 8 : 32) || x_stride % 4 || ((uintptr_t)x & 15))
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "expert matmul: K = %lld", (long long)w->cols);
	switch (w->fmt) {
	case FP4S_WF_NVFP4:
		pdl_launch(expert_matmul_kernel<FP4S_WF_NVFP4>, dim3(grid), warps * 32, 0, s,
			(const uint8_t *)w->data, w->scales, w->bias, w->rows, w->cols, w->stride_data,
			w->stride_scales, post, w->ws2e, idx, x, x_div, x_stride, y);
		break;
	case FP4S_WF_MXFP4:
		pdl_launch(expert_matmul_kernel<FP4S_WF_MXFP4>, dim3(grid), warps * 32, 0, s,
			(const uint8_t *)w->data, w->scales, w->bias, w->rows, w->cols, w->stride_data,
			w->stride_scales, post, (const float *)NULL, idx, x, x_div, x_stride, y);
		break;
	case FP4S_WF_BF16:
		pdl_launch(expert_matmul_kernel<FP4S_WF_BF16>, dim3(grid), warps * 32, 0, s,
			(const uint8_t *)w->data, w->scales, w->bias, w->rows, w->cols, w->stride_data,
			w->stride_scales, 1.0f, (const float *)NULL, idx, x, x_div, x_stride, y);
		break;
	default:
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "expert matmul: weight format %d", (int)w->fmt);
	}
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

extern "C" int fp4s_cuda_moe_act(const float *h, int32_t n_slots, int64_t inter, int form,
                                 float alpha, float limit, float *a, cudaStream_t s,
                                 struct fp4s_error *err)
{
	pdl_launch(moe_act_kernel, dim3((unsigned)((inter + 255) / 256), (unsigned)n_slots), 256, 0, s,
		h, inter, form, alpha, limit, a);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

/* One block: counting sort of the slots by expert (positions within an expert in arrival
 * order; each token's result does not depend on it), then groups of <= gmax rows. */
static __global__ void moe_group_kernel(const int32_t *__restrict__ idx, int32_t nslots, int32_t K, int32_t E,
                                        int32_t gmax, int32_t zmax, int32_t *__restrict__ gpos,
                                        int32_t *__restrict__ src, int32_t *__restrict__ g_expert,
                                        int32_t *__restrict__ g_off, int32_t *__restrict__ g_m)
{
	TL_SCOPE(TL_SMALL + 1, __LINE__);
	pdl_enter();
	TL_MARK(1);
	extern __shared__ int32_t sh[]; /* cnt[E], off[E], gbase[E] */
	int32_t *cnt = sh, *off = sh + E, *gbase = sh + 2 * E;
	__shared__ int32_t total;
	for (int32_t e = threadIdx.x; e < E; e += blockDim.x)
		cnt[e] = 0;
	__syncthreads();
	for (int32_t i = threadIdx.x; i < nslots; i += blockDim.x)
		atomicAdd(&cnt[min(max(idx[i], 0), E - 1)], 1);
	__syncthreads();
	if (threadIdx.x == 0) {
		int32_t o = 0, gb = 0;
		for (int32_t e = 0; e < E; e++) {
			off[e] = o, gbase[e] = gb;
			o += cnt[e];
			gb += (cnt[e] + gmax - 1) / gmax;
		}
		total = gb;
	}
	__syncthreads();
	for (int32_t e = threadIdx.x; e < E; e += blockDim.x)
		for (int32_t q = 0; q * gmax < cnt[e]; q++) {
			const int32_t z = gbase[e] + q;
			g_expert[z] = e;
			g_off[z] = off[e] + q * gmax;
			g_m[z] = min(gmax, cnt[e] - q * gmax);
		}
	for (int32_t z = total + threadIdx.x; z < zmax; z += blockDim.x)
		g_m[z] = 0;
	__syncthreads();
	for (int32_t e = threadIdx.x; e < E; e += blockDim.x)
		cnt[e] = 0; /* now the fill count */
	__syncthreads();
	for (int32_t i = threadIdx.x; i < nslots; i += blockDim.x) {
		const int32_t e = min(max(idx[i], 0), E - 1);
		const int32_t p = off[e] + atomicAdd(&cnt[e], 1);
		gpos[i] = p;
		src[p] = i / K;
	}
}

extern "C" int32_t fp4s_cuda_moe_group_count(int32_t nslots, int32_t E, int32_t gmax)
{
	return nslots / gmax + (E < nslots ? E : nslots) + 1;
}

extern "C" int fp4s_cuda_moe_group(const int32_t *idx, int32_t nslots, int32_t K, int32_t E, int32_t gmax,
                                   int32_t *gpos, int32_t *src, int32_t *g_expert, int32_t *g_off, int32_t *g_m,
                                   cudaStream_t s, struct fp4s_error *err)
{
	if (E < 1 || E > 4096 || gmax < 1 || nslots < 1) /* 3 E counters in 48 KB of shared memory */
		return fp4s_error_set(err, FP4S_EINVAL, "moe: grouping %d slots over %d experts", nslots, E);
	pdl_launch(moe_group_kernel, dim3(1), 1024, (size_t)3 * E * sizeof(int32_t), s,
		idx, nslots, K, E, gmax, fp4s_cuda_moe_group_count(nslots, E, gmax), gpos, src, g_expert, g_off, g_m);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

extern "C" int fp4s_cuda_moe_combine(const float *o, const float *w, const int32_t *perm, int32_t n, int32_t K,
                                     int64_t H, int accumulate, float *y, cudaStream_t s, struct fp4s_error *err)
{
	pdl_launch(moe_combine_kernel, dim3((unsigned)((H + 255) / 256), (unsigned)n), 256, 0, s, o, w, perm, K, H,
		accumulate, y);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}
