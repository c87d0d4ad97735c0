/* route.cuh: a token's router logits to its experts, shared by moe.cu's route kernels and
 * moe_tma.cu's one-launch MoE block so that all give the same ids and weights for the same
 * logits: a 16-byte chunk of a router row (BF16, FP16 or FP32) against staged activations, and
 * the top-k of a row of logits, by one warp (route_warp; route_reg with the logits in
 * registers) or by a block (route_block), with the same choices and the same weights. */
#ifndef FP4S_ROUTE_CUH
#define FP4S_ROUTE_CUH

#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/moe_cuda.h"
#include "backend/cuda/timeline.cuh"

/* route_block's shared scratch for E experts: the logits (pr, E floats from 0) and the keys (from
 * ROUTE_KEYS_AT(E) floats, 16-byte aligned, padded with zeros to a multiple of 8) */
#define ROUTE_KEYS_AT(E) (((E) + 3) & ~3)
#define ROUTE_SCRATCH(E) ((size_t)(ROUTE_KEYS_AT(E) + (((E) + 7) & ~7)) * 4)

/* A float as a key whose unsigned order is the float's: NaN 1 (below every number, above 0, which
 * stands for "nothing"), -0 as +0. */
static __device__ __forceinline__ uint32_t route_key(float v)
{
	if (v != v)
		return 1u;
	const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
	return u & 0x80000000u ? ~u : u | 0x80000000u;
}

/* The softmax of pr[E] in place (kind 0; kind 1 leaves pr), by one warp: the caller has filled
 * pr[e] for e = lane + 32 i. Ends with __syncwarp. */
static __device__ __forceinline__ void route_softmax(float *pr, int32_t E, int kind)
{
	const int lane = threadIdx.x & 31;
	if (kind == 0) {
		/* softmax over all experts, in FP32 as transformers does */
		float m = -INFINITY;
		for (int32_t e = lane; e < E; e += 32)
			m = fmaxf(m, pr[e]);
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
}

/* Pick j of the K picks sel[], selv[] (largest first) -> idx[j] and its weight w[j]. Each pick's
 * thread sums all K in one order, so the bits do not depend on which threads take the picks, and
 * no thread waits on another's divisions. */
static __device__ __forceinline__ void route_weight(int32_t j, int32_t K, int kind, int norm, const int32_t *sel,
                                                    const float *selv, int32_t *__restrict__ idx,
                                                    float *__restrict__ w)
{
	float sum = 0.0f, v;
	if (kind == 0) {
		for (int32_t i = 0; i < K; i++)
			sum += selv[i];
		v = norm ? selv[j] / sum : selv[j];
	} else {
		const float mx = selv[0];
		for (int32_t i = 0; i < K; i++)
			sum += expf(selv[i] - mx);
		v = expf(selv[j] - mx) / sum;
	}
	w[j] = v;
	idx[j] = sel[j];
}

/* Top-k of pr[E] and its weights by one warp (the other threads of the block take no part).
 * The caller has filled pr[e] and cleared taken[e] for e = lane + 32 i, so until the first
 * __syncwarp a lane only reads what it wrote. idx/w: this token's K results (global or shared),
 * written by lanes 0..K-1 (a caller that publishes them synchronizes the warp first).
 * Not inlined: one copy of the code, which route_warm runs early so that the real call finds it
 * in the SM's instruction caches. */
static __device__ __noinline__ void route_warp(float *pr, uint8_t *taken, int32_t E, int32_t K, int kind, int norm,
                                               int32_t *sel, float *selv, int32_t *__restrict__ idx,
                                               float *__restrict__ w)
{
	const int lane = threadIdx.x & 31;
	route_softmax(pr, E, kind);
	/* K rounds of a warp argmax over the untaken experts. Each lane keeps to its own experts
	 * (e = lane + 32 i: only it reads and sets their taken flags) and offers its best one as an
	 * order-preserving key; two warp reductions (redux.sync) find the largest key and then the
	 * lowest expert id holding it. That is the CPU's choice: the largest value, ties to the lower
	 * id, -0 equal to +0, NaN (key 1) only once nothing else is left, and then the lowest id.
	 * (It replaced five dependent pairs of shuffles a round: bench/results/2026-11-23-h100-session15.md.) */
	for (int32_t j = 0; j < K; j++) {
		uint32_t kb = 0u, bi = 0xFFFFFFFFu;
		for (int32_t e = lane; e < E; e += 32)
			if (!taken[e]) {
				const uint32_t k = route_key(pr[e]);
				if (k > kb)
					kb = k, bi = (uint32_t)e;
			}
		const uint32_t km = __reduce_max_sync(0xFFFFFFFFu, kb);
		const uint32_t id = __reduce_min_sync(0xFFFFFFFFu, kb == km ? bi : 0xFFFFFFFFu);
		if ((int)(id & 31u) == lane)
			taken[id] = 1;
		if (lane == 0) {
			sel[j] = (int32_t)id;
			selv[j] = pr[id];
		}
	}
	__syncwarp();
	for (int32_t j = lane; j < K; j += 32)
		route_weight(j, K, kind, norm, sel, selv, idx, w);
}

/* A barrier of the NT threads that call route_block (named barrier 1: in moe_tma.cu the producer
 * warp has left, and the consumers' own barrier there is this one, gt_sync) */
template <int NT>
static __device__ __forceinline__ void route_bar(void)
{
	asm volatile("bar.sync 1, %0;" ::"n"(NT) : "memory");
}

/* The same choices and weights by all NT threads of a block (every one must call): warp 0 takes
 * the softmax as route_warp, then every expert is ranked by one thread against all the others
 * (the number that come before it: a larger key, or an equal key and a lower id), the ranks
 * below K are the picks, in route_warp's order, and K threads take a weight each. pr[E] filled by
 * the caller (any thread, then a barrier); keys: shared scratch (ROUTE_SCRATCH); idx/w written
 * by threads 0..K-1 (a caller that publishes them synchronizes first). Not inlined,
 * for route_warm_block. Why: route_warp's K dependent rounds in one warp took ~5 us a layer on
 * qwen3-30b-a3b (128 experts, top 8), the router's last block's tail
 * (bench/results/2026-11-23-h100-session15.md). A softmax by the whole block (the same sums in
 * the same order) measured no faster than warp 0's (bench/results/2026-11-23-h100-session16.md).
 * tl: timeline marks (timeline.cuh). */
template <int NT>
static __device__ __noinline__ void route_block(float *pr, uint32_t *keys, int32_t E, int32_t K, int kind,
                                                   int norm, int32_t *sel, float *selv, int32_t *__restrict__ idx,
                                                   float *__restrict__ w, void *tl)
{
	const int tid = threadIdx.x;
	const int32_t E8 = (E + 7) & ~7;
	if (tid < 32)
		route_softmax(pr, E, kind);
	route_bar<NT>();
	for (int32_t e = tid; e < E8; e += NT)
		keys[e] = e < E ? route_key(pr[e]) : 0u;
	route_bar<NT>();
	tl_mark_at(tl, 6);
	/* Expert e's rank: the keys before it are those larger, and those equal at a lower id, i.e.
	 * key o > k - 1 for o < e (every real key is >= 1) and > k after. Eight keys a step from
	 * two 16-byte loads, all issued ahead of the compares (the padding's zeros count for none):
	 * one load and compare at a time left ~20 cycles of shared-memory latency a key. */
	for (int32_t e = tid; e < E; e += NT) {
		const uint32_t k = keys[e];
		int32_t rank = 0;
		for (int32_t o = 0; o < E8; o += 8) {
			const uint4 a = *reinterpret_cast<const uint4 *>(keys + o);
			const uint4 b = *reinterpret_cast<const uint4 *>(keys + o + 4);
			const uint32_t ko[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
			for (int u = 0; u < 8; u++)
				rank += ko[u] > k - (uint32_t)(o + u < e);
		}
		if (rank < K) {
			sel[rank] = e;
			selv[rank] = pr[e];
		}
	}
	route_bar<NT>();
	tl_mark_at(tl, 7);
	for (int32_t j = tid; j < K; j += NT)
		route_weight(j, K, kind, norm, sel, selv, idx, w);
}

/* The same choices and weights, bit for bit, by one warp with the logits in registers, for
 * E <= 32 * EPL: lane l holds experts l + 32 i (i < EPL), route_softmax's order, so the max,
 * the exponentials, the sum (each lane's in i order, then the same xor butterfly) and the
 * divisions are route_warp's operations on the same values. The K rounds are route_warp's (the
 * largest key, ties to the lowest id, by two warp reductions), a taken expert's key zeroed in
 * its lane's registers, and the owner of a pick writes sel[j], selv[j]; then route_weight.
 * lg: the logits (global, read past L1: other blocks of the launch wrote them); dry: no loads
 * and no globals written (idx, w must then be shared scratch), for route_warm_reg.
 * Why: route_block's shared-memory passes, barriers and the rank loop took ~2.8 us a layer as
 * the router's last block's tail on qwen3-30b-a3b (128 experts, top 8; timeline marks: logits
 * read back 0.4, softmax and keys 1.4, ranks 1.1, weights 0.4). Here the chain is the loads,
 * two reductions, one division each, and K rounds of two warp reductions.
 * tl: timeline marks (timeline.cuh): 4 logits loaded, 6 keys made, 7 picks made. */
template <int EPL>
static __device__ __noinline__ void route_reg(const float *lg, int dry, int32_t E, int32_t K, int kind, int norm,
                                              int32_t *sel, float *selv, int32_t *__restrict__ idx,
                                              float *__restrict__ w, void *tl)
{
	const int lane = threadIdx.x & 31;
	float v[EPL];
#pragma unroll
	for (int i = 0; i < EPL; i++) {
		const int32_t e = lane + 32 * i;
		v[i] = e >= E ? 0.0f : dry ? (float)((e * 7) & 31) * 0.125f : __ldcg(lg + e);
	}
	tl_mark_at(tl, 4);
	if (kind == 0) {
		float m = -INFINITY;
#pragma unroll
		for (int i = 0; i < EPL; i++)
			if (lane + 32 * i < E)
				m = fmaxf(m, v[i]);
		for (int o = 16; o; o >>= 1)
			m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
		float sum = 0.0f;
#pragma unroll
		for (int i = 0; i < EPL; i++)
			if (lane + 32 * i < E)
				sum += v[i] = expf(v[i] - m);
		for (int o = 16; o; o >>= 1)
			sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
#pragma unroll
		for (int i = 0; i < EPL; i++)
			if (lane + 32 * i < E)
				v[i] /= sum;
	}
	uint32_t key[EPL];
#pragma unroll
	for (int i = 0; i < EPL; i++)
		key[i] = lane + 32 * i < E ? route_key(v[i]) : 0u;
	tl_mark_at(tl, 6);
	for (int32_t j = 0; j < K; j++) {
		uint32_t kb = 0u, bi = 0xFFFFFFFFu;
#pragma unroll
		for (int i = 0; i < EPL; i++) /* strict: the lowest i, so the lowest id, among equal keys */
			if (key[i] > kb)
				kb = key[i], bi = (uint32_t)(lane + 32 * i);
		const uint32_t km = __reduce_max_sync(0xFFFFFFFFu, kb);
		const uint32_t id = __reduce_min_sync(0xFFFFFFFFu, kb == km ? bi : 0xFFFFFFFFu);
#pragma unroll
		for (int i = 0; i < EPL; i++)
			if (id == (uint32_t)(lane + 32 * i)) {
				key[i] = 0u;
				sel[j] = (int32_t)id;
				selv[j] = v[i];
			}
	}
	__syncwarp();
	tl_mark_at(tl, 7);
	for (int32_t j = lane; j < K; j += 32)
		route_weight(j, K, kind, norm, sel, selv, idx, w);
}

/* route_reg's code warm (see route_warm below), by one warp (K <= 64) */
template <int EPL>
static __device__ __forceinline__ void route_warm_reg(int32_t K, int kind, int norm, int32_t *sel, float *selv)
{
	__shared__ int32_t ids[64];
	__shared__ float ws[64];
	route_reg<EPL>(nullptr, 1, 32 * EPL, K < 64 ? K : 64, kind, norm, sel, selv, ids, ws, nullptr);
	__syncwarp();
}

/* The top-k runs once a layer, by the router's last block, on the critical path of the step,
 * with its code cold by then. Every router block runs it once on scratch in shared memory while
 * it waits for the previous kernel anyway (before its PDL wait, writing nothing global), so
 * whichever block is last finds the code in its SM's instruction caches. route_warm: warp 0,
 * for route_warp; route_warm_block below: the whole block, for route_block. Measured with the
 * step's timeline (timeline.cuh) on qwen3-30b-a3b, for route_warp: the last block's tail 0.8 us
 * shorter, decode +1.2-1.6 % (bench/results/2026-11-23-h100-session15.md). */
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

/* The same for route_block, by all NT threads of the block (every one must call). */
template <int NT>
static __device__ __forceinline__ void route_warm_block(int32_t K, int kind, int norm, int32_t *sel, float *selv)
{
	__shared__ float pr[32];
	__shared__ __align__(16) uint32_t keys[32];
	__shared__ int32_t ids[32];
	__shared__ float ws[32];
	if (threadIdx.x < 32)
		pr[threadIdx.x] = (float)((threadIdx.x * 7) & 31) * 0.125f;
	route_bar<NT>();
	route_block<NT>(pr, keys, 32, K < 32 ? K : 32, kind, norm, sel, selv, ids, ws, nullptr);
	route_bar<NT>();
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
