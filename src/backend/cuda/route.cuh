/* route.cuh: a token's router logits to its experts, shared by moe.cu's route kernels and
 * moe_tma.cu's one-launch MoE block so that all give the same ids and weights for the same
 * logits: a 16-byte chunk of a router row (BF16, FP16 or FP32) against staged activations, and
 * the top-k of a row of logits by one warp. */
#ifndef FP4S_ROUTE_CUH
#define FP4S_ROUTE_CUH

#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/moe_cuda.h"

/* One warp per token: softmax and k rounds of a warp argmax (ties to the lower expert id, NaN
 * never chosen unless nothing else is left, as in the CPU's loop). */
static __device__ __forceinline__ void argmax_pick(float &bv, int32_t &bi, float v, int32_t i)
{
	if (v > bv || (v == bv && i < bi))
		bv = v, bi = i;
}

/* Top-k of pr[E] and its weights by one warp (the other threads of the block take no part).
 * The caller has filled pr[e] and cleared taken[e] for e = lane + 32 i, so until the first
 * __syncwarp a lane only reads what it wrote. idx/w: this token's K results (global or shared).
 * Not inlined: one copy of the code, which route_warm runs early so that the real call finds it
 * in the SM's instruction caches. */
static __device__ __noinline__ void route_warp(float *pr, uint8_t *taken, int32_t E, int32_t K, int kind, int norm,
                                  int32_t *sel, float *selv, int32_t *__restrict__ idx, float *__restrict__ w)
{
	const int lane = threadIdx.x & 31;
	float m = -INFINITY;
	for (int32_t e = lane; e < E; e += 32)
		m = fmaxf(m, pr[e]);
	if (kind == 0) {
		/* softmax over all experts, in FP32 as transformers does */
		for (int o = 16; o; o >>= 1)
			m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
		float sum = 0.0f;
		for (int32_t e = lane; e < E; e += 32)
			sum += pr[e] = expf(pr[e] - m);
		for (int o = 16; o; o >>= 1)
			sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
		for (int32_t e = lane; e < E; e += 32)
			pr[e] /= sum;
	}
	__syncwarp();
	for (int32_t j = 0; j < K; j++) {
		float bv = -INFINITY;
		int32_t bi = INT32_MAX;
		for (int32_t e = lane; e < E; e += 32)
			if (!taken[e])
				argmax_pick(bv, bi, pr[e], e);
		for (int o = 16; o; o >>= 1) {
			const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, o);
			const int32_t oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
			argmax_pick(bv, bi, ov, oi);
		}
		if (lane == 0) {
			if (bi == INT32_MAX) /* only NaN left: the lowest untaken id, as the CPU */
				for (bi = 0; taken[bi]; bi++)
					;
			taken[bi] = 1;
			sel[j] = bi;
			selv[j] = pr[bi];
		}
		__syncwarp();
	}
	if (lane == 0) {
		if (kind == 0) {
			float sum = 0.0f;
			for (int32_t j = 0; j < K; j++)
				sum += selv[j];
			for (int32_t j = 0; j < K; j++)
				w[j] = norm ? selv[j] / sum : selv[j];
		} else {
			const float mx = selv[0];
			float sum = 0.0f;
			for (int32_t j = 0; j < K; j++)
				sum += selv[j] = expf(selv[j] - mx);
			for (int32_t j = 0; j < K; j++)
				w[j] = selv[j] / sum;
		}
		for (int32_t j = 0; j < K; j++)
			idx[j] = sel[j];
	}
}

/* Why. The top-k runs once a layer, by one warp of the router's last block, on the critical path
 * of the step, and its code is cold by then: the step's timeline (timeline.cuh) showed that
 * block leaving 6.5-7 us after the router's other blocks on qwen3-30b-a3b, for a few hundred
 * instructions. Every router block runs route_warp once on scratch in shared memory while it
 * waits for the previous kernel anyway (before its PDL wait, writing nothing global), so
 * whichever block is last finds the code in its SM's instruction caches. Warp 0 only. */
static __device__ __forceinline__ void route_warm(int32_t K, int kind, int norm, int32_t *sel, float *selv)
{
	__shared__ float pr[32];
	__shared__ uint8_t taken[32];
	__shared__ int32_t ids[32];
	__shared__ float ws[32];
	const int lane = threadIdx.x & 31;
	pr[lane] = (float)((lane * 7) & 31) * 0.125f;
	taken[lane] = 0;
	route_warp(pr, taken, 32, K < 32 ? K : 32, kind, norm, sel, selv, ids, ws);
	__syncwarp();
}

template <int FMT>
static __device__ __forceinline__ float nr_chunk_dot(const uint4 wv, const float *xs)
{
	const float4 a = *reinterpret_cast<const float4 *>(xs);
	if (FMT == FP4S_WF_F32)
		return __uint_as_float(wv.x) * a.x + __uint_as_float(wv.y) * a.y + __uint_as_float(wv.z) * a.z +
		       __uint_as_float(wv.w) * a.w;
	const float4 b = *reinterpret_cast<const float4 *>(xs + 4);
	const uint32_t w4[4] = {wv.x, wv.y, wv.z, wv.w};
	const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
	float acc = 0.0f;
#pragma unroll
	for (int u = 0; u < 4; u++) {
		float lo, hi;
		if (FMT == FP4S_WF_BF16) {
			lo = __uint_as_float(w4[u] << 16);
			hi = __uint_as_float(w4[u] & 0xFFFF0000u);
		} else {
			lo = __half2float(__ushort_as_half((unsigned short)(w4[u] & 0xFFFFu)));
			hi = __half2float(__ushort_as_half((unsigned short)(w4[u] >> 16)));
		}
		acc += lo * xv[2 * u] + hi * xv[2 * u + 1];
	}
	return acc;
}

#endif
