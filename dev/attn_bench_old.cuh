/* attn_bench_old.cuh: the decode attention kernels as they were before the tensor-core path
 * (src/backend/cuda/attention.cu at 7227387), kept for dev/attn_bench's before/after table. */
#ifndef FP4S_ATTN_BENCH_OLD_CUH
#define FP4S_ATTN_BENCH_OLD_CUH

#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "backend/backend.h"

namespace old_attn {

constexpr int ATT_TILE = 128, ATT_THREADS = 128, ATT_MAX_G = 16;

static __device__ __forceinline__ float kv_load(const float *p) { return *p; }
static __device__ __forceinline__ float kv_load(const __nv_bfloat16 *p) { return __bfloat162float(*p); }

/* Partial attention of one (token, KV head, key chunk) for the G query heads of the group.
 *   scores: one warp per key, lanes over dims (coalesced row loads), G dot products reduced by
 *           shuffles;
 *   softmax: warp w handles heads w, w+4, ...: lanes over the tile's keys, shuffle max and sum;
 *   P.V:    thread = (dim j, key lane kl): it walks keys kl, kl+KP, ... reading V[t][j] once for
 *           all G heads (G accumulators), then the KP key lanes are summed through shared memory. */
template <typename KV>
static __global__ void attn_partial_kernel(const float *__restrict__ q, const KV *__restrict__ kc,
                                           const KV *__restrict__ vc, const int32_t *pos,
                                           const int32_t *seq, const int32_t *__restrict__ table,
                                           int32_t table_stride, int32_t nh,
                                           int32_t nkv, int32_t d, int32_t window, float scale,
                                           int32_t splits, float *__restrict__ work)
{
	extern __shared__ float sm[];
	const int32_t G = nh / nkv, kvw = nkv * d;
	float *qs = sm;                 /* [G][d] */
	float *sc = qs + G * d;         /* [G][ATT_TILE] */
	float *st = sc + G * ATT_TILE;  /* [3][G]: max, sum, rescale */
	float *red = st + 3 * G;        /* [ATT_THREADS][G] partial outputs for the final sum */
	const int32_t i = blockIdx.x, g0 = blockIdx.y, split = blockIdx.z;
	const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
	const int32_t p = pos[i];
	const int32_t start = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
	const int32_t len = p - start + 1, chunk = (len + splits - 1) / splits;
	const int32_t c0 = start + split * chunk, c1 = min(p + 1, c0 + chunk);
	/* key t lives in block table[t / BLOCK] of the pool, at row t % BLOCK */
	const int32_t *trow = table + (size_t)seq[i] * table_stride;
	const KV *kbase = kc + (size_t)g0 * d;
	const KV *vbase = vc + (size_t)g0 * d;
	/* P.V thread layout: KP key lanes of d dims (d <= 128 divides the block for 16/32/64/128) */
	const int32_t KP = d < ATT_THREADS ? ATT_THREADS / d : 1;
	const int32_t kl = threadIdx.x / d, j0 = threadIdx.x % d;
	for (int32_t x = threadIdx.x; x < G * d; x += blockDim.x)
		qs[x] = q[((int64_t)i * nh + (int64_t)g0 * G) * d + x] * scale;
	for (int32_t g = threadIdx.x; g < G; g += blockDim.x) {
		st[g] = -INFINITY;
		st[G + g] = 0.0f;
	}
	float acc[ATT_MAX_G][2]; /* [head][dim j0 and j0 + 128 for d = 256] */
#pragma unroll
	for (int g = 0; g < ATT_MAX_G; g++)
		acc[g][0] = acc[g][1] = 0.0f;
	__syncthreads();
	for (int32_t t0 = c0; t0 < c1; t0 += ATT_TILE) {
		const int32_t tn = min(ATT_TILE, c1 - t0);
		for (int32_t t = warp; t < tn; t += ATT_THREADS / 32) {
			const int32_t tt = t0 + t;
			const KV *kt = kbase + ((size_t)trow[tt / FP4S_KV_BLOCK] * FP4S_KV_BLOCK + tt % FP4S_KV_BLOCK) * kvw;
			float part[ATT_MAX_G];
#pragma unroll
			for (int g = 0; g < ATT_MAX_G; g++)
				part[g] = 0.0f;
			for (int32_t j = lane; j < d; j += 32) {
				const float kv = kv_load(kt + j);
#pragma unroll
				for (int g = 0; g < ATT_MAX_G; g++)
					if (g < G)
						part[g] += qs[g * d + j] * kv;
			}
#pragma unroll
			for (int g = 0; g < ATT_MAX_G; g++) {
				if (g >= G)
					break;
				float v = part[g];
				for (int o = 16; o > 0; o >>= 1)
					v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
				if (lane == 0)
					sc[g * ATT_TILE + t] = v;
			}
		}
		__syncthreads();
		for (int32_t g = warp; g < G; g += ATT_THREADS / 32) {
			float m = -INFINITY;
			for (int32_t t = lane; t < tn; t += 32)
				m = fmaxf(m, sc[g * ATT_TILE + t]);
			for (int o = 16; o > 0; o >>= 1)
				m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
			m = fmaxf(m, st[g]);
			float l = 0.0f;
			for (int32_t t = lane; t < tn; t += 32) {
				const float e = expf(sc[g * ATT_TILE + t] - m);
				sc[g * ATT_TILE + t] = e;
				l += e;
			}
			for (int o = 16; o > 0; o >>= 1)
				l += __shfl_xor_sync(0xFFFFFFFFu, l, o);
			if (lane == 0) {
				const float alpha = expf(st[g] - m); /* 0 on the first tile */
				st[2 * G + g] = alpha;
				st[G + g] = st[G + g] * alpha + l;
				st[g] = m;
			}
		}
		__syncthreads();
#pragma unroll
		for (int g = 0; g < ATT_MAX_G; g++)
			if (g < G) {
				acc[g][0] *= st[2 * G + g];
				acc[g][1] *= st[2 * G + g];
			}
		if (kl < KP) {
			for (int32_t t = kl; t < tn; t += KP) {
				const int32_t tt = t0 + t;
				const KV *vt = vbase + ((size_t)trow[tt / FP4S_KV_BLOCK] * FP4S_KV_BLOCK + tt % FP4S_KV_BLOCK) * kvw;
				const float v0 = kv_load(vt + j0);
				const float v1 = j0 + ATT_THREADS < d ? kv_load(vt + j0 + ATT_THREADS) : 0.0f;
#pragma unroll
				for (int g = 0; g < ATT_MAX_G; g++)
					if (g < G) {
						const float pr = sc[g * ATT_TILE + t];
						acc[g][0] += pr * v0;
						acc[g][1] += pr * v1;
					}
			}
		}
		__syncthreads();
	}
	/* (max, sum, outputs) for the merge; an empty chunk leaves max = -inf, sum = 0 */
	float *w = work + ((((size_t)i * nkv + g0) * splits + split) * G) * (size_t)(d + 2);
	for (int32_t g = threadIdx.x; g < G; g += blockDim.x) {
		w[(size_t)g * (d + 2)] = st[g];
		w[(size_t)g * (d + 2) + 1] = st[G + g];
	}
	for (int half = 0; half < 2; half++) {
		if (half == 1 && d <= ATT_THREADS)
			break;
		/* sum the KP key lanes of each (head, dim) */
		if (KP > 1) {
#pragma unroll
			for (int g = 0; g < ATT_MAX_G; g++)
				if (g < G)
					red[threadIdx.x * ATT_MAX_G + g] = acc[g][half];
			__syncthreads();
			if (kl == 0)
				for (int32_t o = 1; o < KP; o++)
#pragma unroll
					for (int g = 0; g < ATT_MAX_G; g++)
						if (g < G)
							acc[g][half] += red[(o * d + j0) * ATT_MAX_G + g];
			__syncthreads();
		}
		const int32_t j = j0 + half * ATT_THREADS;
		if (kl == 0 && j < d)
#pragma unroll
			for (int g = 0; g < ATT_MAX_G; g++)
				if (g < G)
					w[(size_t)g * (d + 2) + 2 + j] = acc[g][half];
	}
}

/* grid (tokens, heads): merges the chunks of one query head */
static __global__ void attn_merge_kernel(const float *__restrict__ work, int32_t nh, int32_t nkv,
                                         int32_t d, int32_t splits, const float *sinks,
                                         float *__restrict__ out)
{
	const int32_t i = blockIdx.x, h = blockIdx.y, G = nh / nkv, g0 = h / G, g = h - g0 * G;
	const size_t stride = (size_t)G * (d + 2);
	const float *w = work + (((size_t)i * nkv + g0) * splits) * stride + (size_t)g * (d + 2);
	float m = sinks ? sinks[h] : -INFINITY;
	for (int32_t s = 0; s < splits; s++)
		m = fmaxf(m, w[s * stride]);
	float l = sinks ? expf(sinks[h] - m) : 0.0f;
	for (int32_t s = 0; s < splits; s++)
		l += w[s * stride + 1] * expf(w[s * stride] - m);
	for (int32_t j = threadIdx.x; j < d; j += blockDim.x) {
		float a = 0.0f;
		for (int32_t s = 0; s < splits; s++)
			a += w[s * stride + 2 + j] * expf(w[s * stride] - m);
		out[((int64_t)i * nh + h) * d + j] = a / l;
	}
}

static int smem_bytes(int32_t nh, int32_t nkv, int32_t d)
{
	const int32_t G = nh / nkv;
	return (int)sizeof(float) * (G * d + G * ATT_TILE + 3 * G + ATT_THREADS * ATT_MAX_G);
}

static cudaError_t setup(void)
{
	const int smem = smem_bytes(16 * 8, 8, 256);
	cudaError_t e = cudaFuncSetAttribute(attn_partial_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
	if (e == cudaSuccess)
		e = cudaFuncSetAttribute(attn_partial_kernel<__nv_bfloat16>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
	return e;
}

/* BF16 cache only (what the bench times) */
static void launch(const float *q, const void *kc, const void *vc, const int32_t *pos, const int32_t *seq,
                   const int32_t *table, int32_t table_stride, int32_t n, int32_t nh, int32_t nkv, int32_t d,
                   int32_t window, const float *sinks, float scale, int32_t splits, float *work, float *out,
                   cudaStream_t s)
{
	const dim3 grid((unsigned)n, (unsigned)nkv, (unsigned)splits);
	attn_partial_kernel<__nv_bfloat16><<<grid, ATT_THREADS, smem_bytes(nh, nkv, d), s>>>(
		q, (const __nv_bfloat16 *)kc, (const __nv_bfloat16 *)vc, pos, seq, table, table_stride, nh, nkv, d, window,
		scale, splits, work);
	attn_merge_kernel<<<dim3((unsigned)n, (unsigned)nh), d < 32 ? 32 : (d > 256 ? 256 : d), 0, s>>>(
		work, nh, nkv, d, splits, sinks, out);
}

} // namespace old_attn

#endif
