/* attention.cu: attention over the KV cache for a flattened batch (decode and prefill), GQA with
 * an optional sliding window and per-head sinks (architectures.md §1.5).
 *
 * Split-K ("flash decoding"): a token's keys [start, pos] are cut into `splits` chunks; one block
 * handles one (token, KV head, chunk) and all G = nh/nkv query heads that share that KV head, so
 * each K/V row is read once for the whole group. Inside a chunk the block walks tiles of 128 keys
 * with an online softmax: scores (one warp per key: a coalesced row load, G dot products reduced
 * with shuffles), then the running max/sum per head, then P.V with one thread per (head, dim)
 * output, V rows read coalesced across threads. Each block leaves (max, sum, unnormalized output)
 * per head; a second kernel merges the chunks (and the sink, which joins the denominator as a
 * key with a zero value vector). A decode step has few tokens and heads, so the splits are what
 * fills the GPU; their count is fixed per call shape so the step can be replayed as a graph, and
 * each block finds its key range from the position it reads on the device. */
#include <math.h>

#include "backend/cuda/attention_cuda.h"
#include "backend/cuda/cuda_common.h"

#define ATT_TILE 128
#define ATT_THREADS 128
#define ATT_MAX_OUT 32 /* outputs (head, dim) per thread: G * d <= 32 * 128 */

static __global__ void attn_partial_kernel(const float *__restrict__ q, const float *__restrict__ kc,
                                           const float *__restrict__ vc, const int32_t *pos,
                                           const int32_t *seq, int32_t max_ctx, int32_t nh,
                                           int32_t nkv, int32_t d, int32_t window, float scale,
                                           int32_t splits, float *__restrict__ work)
{
	extern __shared__ float sm[];
	const int32_t G = nh / nkv, kvw = nkv * d;
	float *qs = sm;                 /* [G][d] */
	float *sc = qs + G * d;         /* [G][ATT_TILE] */
	float *st = sc + G * ATT_TILE;  /* [G]: m, l, alpha */
	const int32_t i = blockIdx.x, g0 = blockIdx.y, split = blockIdx.z;
	const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
	const int32_t p = pos[i];
	const int32_t start = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
	const int32_t len = p - start + 1, chunk = (len + splits - 1) / splits;
	const int32_t c0 = start + split * chunk, c1 = min(p + 1, c0 + chunk);
	const float *kbase = kc + (size_t)seq[i] * max_ctx * kvw + (size_t)g0 * d;
	const float *vbase = vc + (size_t)seq[i] * max_ctx * kvw + (size_t)g0 * d;
	for (int32_t x = threadIdx.x; x < G * d; x += blockDim.x)
		qs[x] = q[((int64_t)i * nh + (int64_t)g0 * G) * d + x] * scale;
	for (int32_t g = threadIdx.x; g < G; g += blockDim.x) {
		st[g] = -INFINITY;      /* running max */
		st[G + g] = 0.0f;       /* running sum */
	}
	float acc[ATT_MAX_OUT];
#pragma unroll
	for (int r = 0; r < ATT_MAX_OUT; r++)
		acc[r] = 0.0f;
	__syncthreads();
	for (int32_t t0 = c0; t0 < c1; t0 += ATT_TILE) {
		const int32_t tn = min(ATT_TILE, c1 - t0);
		/* scores: warp per key */
		for (int32_t t = warp; t < tn; t += ATT_THREADS / 32) {
			const float *kt = kbase + (size_t)(t0 + t) * kvw;
			float part[16];
#pragma unroll
			for (int g = 0; g < 16; g++)
				part[g] = 0.0f;
			for (int32_t j = lane; j < d; j += 32) {
				const float kv = kt[j];
#pragma unroll
				for (int g = 0; g < 16; g++)
					if (g < G)
						part[g] += qs[g * d + j] * kv;
			}
#pragma unroll
			for (int g = 0; g < 16; g++) {
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
		/* online softmax bookkeeping: one thread per head */
		for (int32_t g = threadIdx.x; g < G; g += blockDim.x) {
			float m = st[g];
			for (int32_t t = 0; t < tn; t++)
				m = fmaxf(m, sc[g * ATT_TILE + t]);
			const float alpha = expf(st[g] - m); /* 0 on the first tile (st = -inf) */
			float l = st[G + g] * alpha;
			for (int32_t t = 0; t < tn; t++) {
				const float e = expf(sc[g * ATT_TILE + t] - m);
				sc[g * ATT_TILE + t] = e;
				l += e;
			}
			st[g] = m;
			st[G + g] = l;
			st[2 * G + g] = alpha;
		}
		__syncthreads();
		/* P.V: thread per (head, dim) output */
#pragma unroll
		for (int r = 0; r < ATT_MAX_OUT; r++) {
			const int32_t o = threadIdx.x + r * ATT_THREADS;
			if (o >= G * d)
				break;
			const int32_t g = o / d, j = o - g * d;
			float a = acc[r] * st[2 * G + g];
			const float *ps = sc + g * ATT_TILE;
			for (int32_t t = 0; t < tn; t++)
				a += ps[t] * vbase[(size_t)(t0 + t) * kvw + j];
			acc[r] = a;
		}
		__syncthreads();
	}
	/* leave (max, sum, outputs) for the merge; an empty chunk leaves max = -inf, sum = 0 */
	float *w = work + ((((size_t)i * nkv + g0) * splits + split) * G) * (size_t)(d + 2);
	for (int32_t g = threadIdx.x; g < G; g += blockDim.x) {
		w[(size_t)g * (d + 2)] = st[g];
		w[(size_t)g * (d + 2) + 1] = st[G + g];
	}
#pragma unroll
	for (int r = 0; r < ATT_MAX_OUT; r++) {
		const int32_t o = threadIdx.x + r * ATT_THREADS;
		if (o >= G * d)
			break;
		const int32_t g = o / d, j = o - g * d;
		w[(size_t)g * (d + 2) + 2 + j] = acc[r];
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

extern "C" int64_t fp4s_cuda_attention_work_floats(int32_t n, int32_t nh, int32_t nkv, int32_t d,
                                                   int32_t splits)
{
	return (int64_t)n * nkv * splits * (nh / nkv) * (d + 2);
}

extern "C" int fp4s_cuda_attention_smem(int32_t nh, int32_t nkv, int32_t d)
{
	const int32_t G = nh / nkv;
	return (int)sizeof(float) * (G * d + G * ATT_TILE + 3 * G);
}

extern "C" int fp4s_cuda_attention(const float *q, const float *kc, const float *vc, const int32_t *pos,
                                   const int32_t *seq, int32_t n, int32_t max_ctx, int32_t nh,
                                   int32_t nkv, int32_t d, int32_t window, const float *sinks,
                                   float scale, int32_t splits, float *work, float *out,
                                   cudaStream_t s, struct fp4s_error *err)
{
	if (nkv <= 0 || nh % nkv || nh / nkv > 16 || (nh / nkv) * d > ATT_MAX_OUT * ATT_THREADS || splits < 1)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "attention: %d query heads over %d KV heads of "
		                      "dim %d (supported: up to 16 heads per KV head, 4096 outputs a group)",
		                      nh, nkv, d);
	const int smem = fp4s_cuda_attention_smem(nh, nkv, d);
	attn_partial_kernel<<<dim3((unsigned)n, (unsigned)nkv, (unsigned)splits), ATT_THREADS, smem, s>>>(
		q, kc, vc, pos, seq, max_ctx, nh, nkv, d, window, scale, splits, work);
	attn_merge_kernel<<<dim3((unsigned)n, (unsigned)nh), d < 32 ? 32 : (d > 256 ? 256 : d), 0, s>>>(
		work, nh, nkv, d, splits, sinks, out);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}
