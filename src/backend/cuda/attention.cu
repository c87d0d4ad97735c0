/* attention.cu: attention over the KV cache for a flattened batch (decode and prefill), GQA with
 * an optional sliding window and per-head sinks (architectures.md §1.5).
 *
 * Split-K ("flash decoding"): a token's keys are cut into chunks; one block handles one (token,
 * KV head, chunk) and all G = nh/nkv query heads that share that KV head, so each K/V row is read
 * once for the whole group, with an online softmax. Each block leaves (max, sum, unnormalized
 * output) per head and the chunks are merged (the sink joins the denominator as a key with a zero
 * value vector). A decode step has few tokens and heads, so the chunks are what fills the GPU;
 * their count is fixed per call shape so the step can be replayed as a graph, and each block
 * finds its key range from the position it reads on the device. Two kernels:
 *
 *   attn_mma_kernel (attention_mma.cuh): BF16 or FP8 (E4M3) cache, head_dim 64 or 128, G <= 8:
 *     the decode path. Tensor cores (BF16 operands carried to ~16 bits by hi/lo splits of q and
 *     P; E4M3 values become BF16 exactly), 16-byte (FP8: 8-byte) loads of whole KV blocks
 *     (straight into registers by default, or through a per-lane cp.async ring in shared
 *     memory), chunks of whole KV blocks, W warps per block merged in shared
 *     memory, and the chunks merged by the last block to finish (one launch; att_merge_cp,
 *     in little code since it runs cold once a launch), or by attn_mma_merge_kernel for
 *     batches too large for the counters.
 *   attn_partial_kernel + attn_merge_kernel: everything else, FP32 cache (the exact mode the
 *     golden tests use) included: CUDA cores, one warp per key. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/attention_cuda.h"
#include "backend/backend.h"
#include "backend/cuda/cuda_common.h"

#include <cuda_bf16.h>

#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/pdl.cuh"

#define ATT_TILE 128
#define ATT_THREADS 128
#define ATT_MAX_G 16

static __device__ __forceinline__ float kv_load(const float *p) { return *p; }
static __device__ __forceinline__ float kv_load(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
static __device__ __forceinline__ float kv_load(const __nv_fp8_e4m3 *p) { return fp4s_kv_e4m3_f32(p->__x); }

/* ---- the generic CUDA-core path: FP32 KV (exact), other head dims, G > 8 (any KV type) ---- */

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

/* ---- the tensor-core path (BF16 and FP8 caches) ----------------------------------------------- */

/* counters for the merge by the last block: one per (token, KV head), zero between calls */
#define ATT_COUNTERS 8192
static __device__ unsigned att_counters[ATT_COUNTERS];

template <int D, int W, bool RING, bool F8, int C = 0> /* C: fp4s_diag_clone's copy */
static __global__ void __launch_bounds__(W * 32) attn_mma_kernel(const att_mma_args a)
{
	extern __shared__ float4 att_smem[];
	TL_SCOPE(TL_ATTN, a.kc);
	att_mma_block<D, W, RING, F8>(a, threadIdx.x, blockIdx.x, blockIdx.y, blockIdx.z, (unsigned char *)att_smem,
	                              TL_REC());
}

/* grid (tokens, KV heads): merges the partials of tokens whose range took several blocks */
#define ATT_MERGE_THREADS 256
template <int D>
static __global__ void __launch_bounds__(ATT_MERGE_THREADS) attn_mma_merge_kernel(const att_mma_args a)
{
	__shared__ float wt[8][ATT_MERGE_MAX], wl[8][ATT_MERGE_MAX];
	__shared__ float4 red[ATT_MERGE_THREADS];
	TL_SCOPE(TL_ATTN_MERGE, a.kc);
	const int32_t i = blockIdx.x, g0 = blockIdx.y, G = a.nh / a.nkv;
	const att_range r = att_range_of(a.pos[i], a.window, a.splits, a.min_tiles);
	if (r.nact <= 1)
		return; /* the block wrote the output itself */
	const float *part = a.work + ((size_t)i * a.nkv + g0) * a.region;
	att_merge_group<D>(part, part + (size_t)a.splits * G * D, r.nact, G, a.sinks ? a.sinks + (size_t)g0 * G : nullptr,
	                   a.out + ((size_t)i * a.nh + (size_t)g0 * G) * D, threadIdx.x, ATT_MERGE_THREADS, wt, wl, red);
}

/* the most dynamic shared memory a block may have (Hopper: 227 KB) */
#define ATT_SMEM_MAX (227 * 1024)

template <int D, int W>
static cudaError_t attn_mma_launch(const att_mma_args &a, int32_t n, bool fused, bool f8, cudaStream_t s)
{
	const bool pro = a.kraw != nullptr;
	const size_t smem = f8 ? (pro ? att_smem_bytes_pro<D, W, true>(a.stages) : att_smem_bytes<D, W, true>(a.stages))
	                       : (pro ? att_smem_bytes_pro<D, W, false>(a.stages) : att_smem_bytes<D, W, false>(a.stages));
	const dim3 grid((unsigned)n, (unsigned)a.nkv, (unsigned)a.splits);
	if (pro) {
		/* the fused decode form follows the projections directly: launched early (PDL), it
		 * streams the older keys and values while they finish (attention_mma.cuh) */
		struct pdl_launch l;
		cudaLaunchConfig_t *cfg = pdl_cfg(&l, grid, dim3(W * 32), smem, s, 2);
#ifdef FP4S_DIAG_CLONE
		if (fp4s_diag_clone(8) && a.stages <= 1 && !f8) {
			cudaError_t e = cudaFuncSetAttribute(attn_mma_kernel<D, W, false, false, 1>,
			                                     cudaFuncAttributeMaxDynamicSharedMemorySize, ATT_SMEM_MAX);
			if (e == cudaSuccess)
				e = cudaLaunchKernelEx(cfg, attn_mma_kernel<D, W, false, false, 1>, a);
			if (e == cudaSuccess && !fused)
				attn_mma_merge_kernel<D><<<dim3((unsigned)n, (unsigned)a.nkv), ATT_MERGE_THREADS, 0, s>>>(a);
			return e != cudaSuccess ? e : cudaGetLastError();
		}
#endif
		cudaError_t e = a.stages > 1 ? (f8 ? cudaLaunchKernelEx(cfg, attn_mma_kernel<D, W, true, true>, a)
		                                   : cudaLaunchKernelEx(cfg, attn_mma_kernel<D, W, true, false>, a))
		                             : (f8 ? cudaLaunchKernelEx(cfg, attn_mma_kernel<D, W, false, true>, a)
		                                   : cudaLaunchKernelEx(cfg, attn_mma_kernel<D, W, false, false>, a));
		if (e == cudaSuccess && !fused)
			attn_mma_merge_kernel<D><<<dim3((unsigned)n, (unsigned)a.nkv), ATT_MERGE_THREADS, 0, s>>>(a);
		return e != cudaSuccess ? e : cudaGetLastError();
	}
	if (a.stages > 1 && f8)
		attn_mma_kernel<D, W, true, true><<<grid, W * 32, smem, s>>>(a);
	else if (f8)
		attn_mma_kernel<D, W, false, true><<<grid, W * 32, smem, s>>>(a);
	else if (a.stages > 1)
		attn_mma_kernel<D, W, true, false><<<grid, W * 32, smem, s>>>(a);
	else
		attn_mma_kernel<D, W, false, false><<<grid, W * 32, smem, s>>>(a);
	if (!fused)
		attn_mma_merge_kernel<D><<<dim3((unsigned)n, (unsigned)a.nkv), ATT_MERGE_THREADS, 0, s>>>(a);
	return cudaGetLastError();
}

template <int D, int W>
static cudaError_t attn_mma_setup(void)
{
	void (*const fns[])(const att_mma_args) = {attn_mma_kernel<D, W, true, false>, attn_mma_kernel<D, W, false, false>,
	                                           attn_mma_kernel<D, W, true, true>, attn_mma_kernel<D, W, false, true>};
	cudaError_t e = cudaSuccess;
	for (int i = 0; i < 4 && e == cudaSuccess; i++) {
		e = cudaFuncSetAttribute(fns[i], cudaFuncAttributeMaxDynamicSharedMemorySize, ATT_SMEM_MAX);
		if (e == cudaSuccess)
			e = fp4s_env_carveout((const void *)fns[i], "FP4S_ATTN_CARVEOUT");
	}
	return e;
}

/* Stages of the decode default (few (token, KV head) pairs): 1, tiles straight into registers,
 * or FP4S_ATTN_STAGES = 2 .. 4, a shared-memory ring. On the H100 (2026-11-22, session 9) the
 * registers took 15.2 us against the ring's 17.2 for llama3-8b at context 4096 (attn_bench), and
 * decode at depth 4096 ran 2.5 % (llama3-8b) and 1.3 % (qwen3-30b-a3b) faster; the H200 runs of
 * 2026-11-21 that chose the ring had the writer's loads wait for its row (kpatch since). */
static int att_few_stages(void)
{
	static int st = -1;
	if (st < 0) {
		const char *e = getenv("FP4S_ATTN_STAGES");
		st = e && atoi(e) >= 1 && atoi(e) <= 4 ? atoi(e) : 1;
	}
	return st;
}

/* shared memory of a tensor-core block of this shape (with the fused prologue's rows: pro) */
static size_t att_smem_of(int32_t d, int W, bool f8, int stages, bool pro)
{
	if (pro)
		return att_smem_pro_off(att_smem_of(d, W, f8, stages, false)) + sizeof(float) * 10 * d;
	if (f8)
		return d == 64 ? (W == 2 ? att_smem_bytes<64, 2, true>(stages) : W == 4 ? att_smem_bytes<64, 4, true>(stages)
		                                                                       : att_smem_bytes<64, 8, true>(stages))
		               : (W == 2 ? att_smem_bytes<128, 2, true>(stages) : W == 4 ? att_smem_bytes<128, 4, true>(stages)
		                                                                        : att_smem_bytes<128, 8, true>(stages));
	return d == 64 ? (W == 2 ? att_smem_bytes<64, 2, false>(stages) : W == 4 ? att_smem_bytes<64, 4, false>(stages)
	                                                                        : att_smem_bytes<64, 8, false>(stages))
	               : (W == 2 ? att_smem_bytes<128, 2, false>(stages) : W == 4 ? att_smem_bytes<128, 4, false>(stages)
	                                                                         : att_smem_bytes<128, 8, false>(stages));
}

/* per device: SM count and the counters' address (looked up once, outside any graph capture
 * when fp4s_cuda_attention_setup ran first) */
static int att_device_info(int *sms, unsigned **counters, struct fp4s_error *err)
{
	static struct {
		int sms;
		unsigned *counters;
	} cache[64];
	int dev = 0;
	FP4S_CUDA_TRY(err, cudaGetDevice(&dev));
	if (dev >= 0 && dev < 64 && cache[dev].sms) {
		*sms = cache[dev].sms;
		*counters = cache[dev].counters;
		return FP4S_OK;
	}
	void *cnt = nullptr;
	FP4S_CUDA_TRY(err, cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev));
	FP4S_CUDA_TRY(err, cudaGetSymbolAddress(&cnt, att_counters));
	FP4S_CUDA_TRY(err, (attn_mma_setup<64, 2>()));
	FP4S_CUDA_TRY(err, (attn_mma_setup<64, 4>()));
	FP4S_CUDA_TRY(err, (attn_mma_setup<64, 8>()));
	FP4S_CUDA_TRY(err, (attn_mma_setup<128, 2>()));
	FP4S_CUDA_TRY(err, (attn_mma_setup<128, 4>()));
	FP4S_CUDA_TRY(err, (attn_mma_setup<128, 8>()));
	*counters = (unsigned *)cnt;
	if (dev >= 0 && dev < 64) {
		cache[dev].counters = *counters;
		cache[dev].sms = *sms;
	}
	return FP4S_OK;
}

extern "C" int64_t fp4s_cuda_attention_work_floats(int32_t n, int32_t nh, int32_t nkv, int32_t d,
                                                   int32_t splits)
{
	return (int64_t)n * nkv * splits * (nh / nkv) * (d + 2);
}

extern "C" int fp4s_cuda_attention_smem(int32_t nh, int32_t nkv, int32_t d)
{
	const int32_t G = nh / nkv;
	return (int)sizeof(float) * (G * d + G * ATT_TILE + 3 * G + ATT_THREADS * ATT_MAX_G);
}

static int attn_run(const void *q_, const void *kc, const void *vc, int kv_dtype, const int32_t *pos,
                    const int32_t *seq, const int32_t *table, int32_t table_stride, int32_t n, int32_t nh,
                    int32_t nkv, int32_t d, int32_t window, const float *sinks, float scale, int32_t splits,
                    float *work, float *out, const struct fp4s_attn_tune *tune,
                    const struct fp4s_attn_prologue *pro, cudaStream_t s, struct fp4s_error *err)
{
	const struct fp4s_attn_tune dflt = {0, 0, 0, 0, 0, 0};
	if (!tune)
		tune = &dflt;
	const float *q = (const float *)q_;
	/* d: 16..256 with 128 % d == 0 or d == 256 (every model here: 64, 128, 256; tests 16, 32) */
	const bool d_ok = d == 256 || (d >= 1 && d <= ATT_THREADS && ATT_THREADS % d == 0);
	if (nkv <= 0 || nh % nkv || nh / nkv > ATT_MAX_G || !d_ok || splits < 1)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "attention: %d query heads over %d KV heads of "
		                      "dim %d (supported: up to %d heads per KV head; dim 256 or a divisor of 128)",
		                      nh, nkv, d, ATT_MAX_G);
	if (kv_dtype != FP4S_KV_F32 && kv_dtype != FP4S_KV_BF16 && kv_dtype != FP4S_KV_FP8)
		return fp4s_error_set(err, FP4S_EINVAL, "attention: KV cache type %d", kv_dtype);
	if (pro && (!pro->k || !pro->v || pro->rot < 0 || pro->rot > d || pro->rot % 2 || (pro->rot && !pro->inv_freq)))
		return fp4s_error_set(err, FP4S_EINVAL, "attention: fused prologue with rotary dims %d of %d", pro ? pro->rot : 0, d);
	if (n <= 0)
		return FP4S_OK;
	const int32_t G = nh / nkv;
	const bool f8 = kv_dtype == FP4S_KV_FP8;
	const bool aligned = (((uintptr_t)kc | (uintptr_t)vc | (uintptr_t)q | (uintptr_t)work | (uintptr_t)out) & 15) == 0;
	if (kv_dtype != FP4S_KV_F32 && (d == 64 || d == 128) && G <= 8 && aligned && !tune->generic) {
		int sms = 0;
		unsigned *counters = nullptr;
		if (att_device_info(&sms, &counters, err))
			return err->code;
		/* Defaults, from dev/attn_bench (bench/results/2026-11-21-h100-attention.md, H200;
		 * bench/results/2026-11-22-h100-session9.md, H100): fewer (token, KV head) pairs than
		 * SMs (decode of a few sequences): 8 warps, about one block per SM, tiles straight into
		 * registers (att_few_stages); more (batches, prefill): 4 warps, registers, two blocks
		 * per SM. */
		const bool few = (int64_t)n * nkv < sms;
		/* FP4S_ATTN_WARPS, FP4S_ATTN_BPS: the few-sequence default's warps and blocks per SM
		 * (diagnostics, A/B in a decode step) */
		static int few_w = -1, few_bps = -1, few_cap = 0;
		if (few_w < 0) {
			const char *e = getenv("FP4S_ATTN_WARPS");
			few_w = e && (atoi(e) == 2 || atoi(e) == 4 || atoi(e) == 8) ? atoi(e) : 8;
			e = getenv("FP4S_ATTN_BPS");
			few_bps = e && atoi(e) >= 1 && atoi(e) <= 4 ? atoi(e) : 1;
			/* FP4S_ATTN_SPLITS: at most this many blocks a (token, KV head) (diagnostics: fewer
			 * attention blocks leave SMs to the next launch's blocks, which then copy their
			 * weights while the attention runs) */
			e = getenv("FP4S_ATTN_SPLITS");
			few_cap = e && atoi(e) >= 1 ? atoi(e) : 0;
		}
		const int W = tune->warps ? tune->warps : few ? few_w : 4;
		if (W != 2 && W != 4 && W != 8)
			return fp4s_error_set(err, FP4S_EINVAL, "attention: %d warps per block (2, 4 or 8)", W);
		int S = tune->stages ? tune->stages : few ? att_few_stages() : 1;
		if (S < 1 || S > 4)
			return fp4s_error_set(err, FP4S_EINVAL, "attention: %d stages (1 to 4)", S);
		/* a ring that does not fit takes fewer stages (8 warps of dim 128 BF16: 3) */
		while (S > 1 && att_smem_of(d, W, f8, S, pro != NULL) > ATT_SMEM_MAX)
			S--;
		/* batches (their default is the register path) keep the separate rope and KV write
		 * kernels: the fused form with registers is measured for decode of a few sequences */
		if (pro && !few && S < 2)
			return fp4s_error_set(err, FP4S_EUNSUPPORTED, "attention: the fused prologue of a batch needs the ring");
		/* blocks per (token, KV head): about blocks_per_sm blocks per SM in all (the kernel holds
		 * one or two blocks per SM), at most the caller's splits (the work buffer) and what one
		 * merge handles */
		const int64_t bps = tune->blocks_per_sm > 0 ? tune->blocks_per_sm : few ? few_bps : 2;
		int64_t nb = bps * sms / ((int64_t)n * nkv);
		if (nb > splits)
			nb = splits;
		if (few && few_cap && nb > few_cap)
			nb = few_cap;
		if (nb > ATT_MERGE_MAX)
			nb = ATT_MERGE_MAX;
		if (nb < 1)
			nb = 1;
		/* The last block merges up to nb partials in rounds of R (att_merge_cp, the ring's bytes
		 * a round), each an L2 round trip behind the next launch's weight copies, so a last round
		 * of a few partials costs what a full one does (qwen3-30b-a3b's 33 splits: rounds of 16,
		 * 16 and 1; bench/results/2026-11-27-h100-session22.md). Such blocks are dropped where
		 * they are at most a sixteenth of the grid. */
		if (!tune->unfused && (int64_t)n * nkv <= ATT_COUNTERS && G * d / 4 <= 32 * W) {
			const size_t ring = att_smem_of(d, W, f8, S, false) -
			                    sizeof(float) * (2 * W * 8 + 2 * 8 * ATT_MERGE_MAX + 4);
			const int64_t R = (int64_t)(ring / 16) / (G * d / 4);
			if (R > 0 && nb > R && nb % R && nb % R <= nb / 16)
				nb -= nb % R;
		}
		/* partials of a (token, KV head): a region of a multiple of 4 floats (16-byte loads) */
		int64_t region = (nb * G * (d + 2) + 3) & ~(int64_t)3;
		if (nb > 1 && region > (int64_t)splits * G * (d + 2)) {
			nb--;
			region = (nb * G * (d + 2) + 3) & ~(int64_t)3;
		}
		att_mma_args a{};
		a.q = q;
		a.kc = kc;
		a.vc = vc;
		a.pos = pos;
		a.seq = seq;
		a.table = table;
		a.table_stride = table_stride;
		a.nh = nh;
		a.nkv = nkv;
		a.window = window;
		a.splits = (int32_t)nb;
		a.min_tiles = tune->min_tiles > 0 ? tune->min_tiles : W;
		a.stages = S;
		a.region = (int32_t)region;
		a.sinks = sinks;
		a.qscale = scale * ATT_LOG2E;
		a.work = work;
		a.out = out;
		const bool fused = !tune->unfused && (int64_t)n * nkv <= ATT_COUNTERS;
		a.counters = fused ? counters : nullptr;
		static int oldmerge = -1, late = -1;
		a.oldmerge = fp4s_env_off("FP4S_ATTN_FASTMERGE", &oldmerge);
		a.late = fp4s_env_off("FP4S_ATTN_PATCH", &late);
		if (pro) {
			a.kraw = pro->k;
			a.vraw = pro->v;
			a.kw = const_cast<void *>(kc);
			a.vw = const_cast<void *>(vc);
			a.qn = pro->qn;
			a.kn = pro->kn;
			a.eps = pro->eps;
			a.zero_centred = pro->zero_centred;
			a.rot = pro->rot;
			a.inv_freq = pro->inv_freq;
			a.mscale = pro->mscale;
			static int trig = -1;
			if (trig < 0) {
				const char *e = getenv("FP4S_ATTN_TRIGGER");
				/* default 1: after the tiles (+0.7-1.5 % decode, session 11); 0 at the end; 2
				 * at the top (-4 % on qwen3-30b-a3b and gpt-oss-20b) */
				trig = e && (strcmp(e, "0") == 0 || strcmp(e, "2") == 0) ? atoi(e) : 1;
			}
			a.trigger = trig;
		}
		cudaError_t e;
		if (d == 64)
			e = W == 2   ? attn_mma_launch<64, 2>(a, n, fused, f8, s)
			    : W == 4 ? attn_mma_launch<64, 4>(a, n, fused, f8, s)
			             : attn_mma_launch<64, 8>(a, n, fused, f8, s);
		else
			e = W == 2   ? attn_mma_launch<128, 2>(a, n, fused, f8, s)
			    : W == 4 ? attn_mma_launch<128, 4>(a, n, fused, f8, s)
			             : attn_mma_launch<128, 8>(a, n, fused, f8, s);
		FP4S_CUDA_TRY(err, e);
		return FP4S_OK;
	}
	if (pro)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "attention: no fused prologue for this cache or shape");
	const int smem = fp4s_cuda_attention_smem(nh, nkv, d);
	const dim3 grid((unsigned)n, (unsigned)nkv, (unsigned)splits);
	if (kv_dtype == FP4S_KV_BF16)
		attn_partial_kernel<__nv_bfloat16><<<grid, ATT_THREADS, smem, s>>>(
			q, (const __nv_bfloat16 *)kc, (const __nv_bfloat16 *)vc, pos, seq, table, table_stride, nh, nkv, d,
			window, scale, splits, work);
	else if (f8)
		attn_partial_kernel<__nv_fp8_e4m3><<<grid, ATT_THREADS, smem, s>>>(
			q, (const __nv_fp8_e4m3 *)kc, (const __nv_fp8_e4m3 *)vc, pos, seq, table, table_stride, nh, nkv, d,
			window, scale, splits, work);
	else
		attn_partial_kernel<float><<<grid, ATT_THREADS, smem, s>>>(
			q, (const float *)kc, (const float *)vc, pos, seq, table, table_stride, nh, nkv, d, window, scale,
			splits, work);
	attn_merge_kernel<<<dim3((unsigned)n, (unsigned)nh), d < 32 ? 32 : (d > 256 ? 256 : d), 0, s>>>(
		work, nh, nkv, d, splits, sinks, out);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

extern "C" int fp4s_cuda_attention_ex(const void *q, const void *kc, const void *vc, int kv_dtype,
                                      const int32_t *pos, const int32_t *seq, const int32_t *table,
                                      int32_t table_stride, int32_t n, int32_t nh, int32_t nkv, int32_t d,
                                      int32_t window, const float *sinks, float scale, int32_t splits,
                                      float *work, float *out, const struct fp4s_attn_tune *tune,
                                      cudaStream_t s, struct fp4s_error *err)
{
	return attn_run(q, kc, vc, kv_dtype, pos, seq, table, table_stride, n, nh, nkv, d, window, sinks, scale, splits,
	                work, out, tune, NULL, s, err);
}

extern "C" int fp4s_cuda_attention_fused(const float *q, void *kc, void *vc, int kv_dtype, const int32_t *pos,
                                         const int32_t *seq, const int32_t *table, int32_t table_stride, int32_t n,
                                         int32_t nh, int32_t nkv, int32_t d, int32_t window, const float *sinks,
                                         float scale, int32_t splits, float *work, float *out,
                                         const struct fp4s_attn_prologue *pro, const struct fp4s_attn_tune *tune,
                                         cudaStream_t s, struct fp4s_error *err)
{
	return attn_run(q, kc, vc, kv_dtype, pos, seq, table, table_stride, n, nh, nkv, d, window, sinks, scale, splits,
	                work, out, tune, pro, s, err);
}

extern "C" int fp4s_cuda_attention(const void *q, const void *kc, const void *vc, int kv_dtype,
                                   const int32_t *pos, const int32_t *seq, const int32_t *table,
                                   int32_t table_stride, int32_t n, int32_t nh, int32_t nkv, int32_t d,
                                   int32_t window, const float *sinks, float scale, int32_t splits,
                                   float *work, float *out, cudaStream_t s, struct fp4s_error *err)
{
	return fp4s_cuda_attention_ex(q, kc, vc, kv_dtype, pos, seq, table, table_stride, n, nh, nkv, d, window,
	                              sinks, scale, splits, work, out, NULL, s, err);
}

extern "C" int fp4s_cuda_attention_setup(struct fp4s_error *err)
{
	/* the largest shape: 16 heads x 256 dims of q, 16 x 128 scores, partial sums */
	const int smem = fp4s_cuda_attention_smem(16 * 8, 8, 256);
	FP4S_CUDA_TRY(err, cudaFuncSetAttribute(attn_partial_kernel<float>,
	                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
	FP4S_CUDA_TRY(err, cudaFuncSetAttribute(attn_partial_kernel<__nv_bfloat16>,
	                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
	FP4S_CUDA_TRY(err, cudaFuncSetAttribute(attn_partial_kernel<__nv_fp8_e4m3>,
	                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
	int sms;
	unsigned *counters;
	return att_device_info(&sms, &counters, err);
}
