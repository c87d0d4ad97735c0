/* sample.cu: sampling where the logits are. A thread block cluster (or one block) a row runs
 * sampler.h's pipeline on the row's logits in place: the row's edits (logit bias, the min_tokens
 * mask, penalties), greedy argmax, or temperature, min_p, top_k, top_p and the draw, with
 * samp_math.h's arithmetic, so the token is the one the CPU sampler (sampler.c) draws for the same
 * random number. Only the token leaves the device (4 bytes a row instead of the vocabulary's
 * logits).
 *
 * How the filters are found without sorting: w = exp(l / T - max) is in [0, 1], where a float's
 * bits order as an unsigned integer does. top_k's k-th largest w is a radix select on those bits
 * (four passes of 8 bits, a histogram of counts a pass). top_p's crossing is the same select
 * weighted by mass: the largest w* whose survivors at or above it hold top_p of the mass, then
 * among the tokens equal to w* the first c in id order. Masses are samp_math.h's 2^-44 fixed
 * point, so every sum is exact and the same in any order. The draw scans the kept tokens in id
 * order: each warp sums a contiguous chunk, then the warp whose chunk holds the point scans it 32
 * tokens at a time. A row makes 3 passes over its logits (scale and max, exp, draw) plus 1 for
 * top_k's mass, 4 each for the selects and 2 for top_p's ties; the row stays in L2 between them. */
#include <cuda_runtime.h>
#include <float.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cooperative_groups.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_impl.h"
#include "backend/cuda/sample_cuda.h"
#include "engine/samp_math.h"
#include "engine/sampler.h"

#define SAMP_THREADS 1024
#define SAMP_WARPS (SAMP_THREADS / 32) /* 32: warp 0 reduces the warps' values a lane each */
#define SAMP_U 8 /* tokens a thread loads at once: a pass is a few rounds of loads in flight, not
                  * ~150 dependent trips to L2 */
#define SAMP_FULL 0xFFFFFFFFu
static_assert(SAMP_WARPS == 32, "warp 0 reduces the block's warps a lane each");
#define SAMP_MAX_P 16 /* blocks a row at most (a cluster of 16 is non-portable: Hopper has it) */
#define SAMP_LP_ROWS 64 /* rows with logprobs a launch: each samples in a copy of its row */

/* A row's blocks form a thread block cluster (Hopper and later; one block elsewhere): each block
 * takes every P-th stretch of the row, and the values the pipeline needs whole (max, masses,
 * histograms, the draw's warp sums) are combined through distributed shared memory between two
 * cluster barriers. One block a row is compute bound on its SM (a division and an exp a token,
 * then the radix passes): 0.4 ms for a 128k vocabulary with top_p, against a 2.2 ms step. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SAMP_CLUSTER 1
namespace cg = cooperative_groups;
#endif

static __device__ __forceinline__ unsigned samp_rank(void)
{
#ifdef SAMP_CLUSTER
	return cg::this_cluster().block_rank();
#else
	return 0;
#endif
}

static __device__ __forceinline__ unsigned samp_nblocks(void)
{
#ifdef SAMP_CLUSTER
	return cg::this_cluster().num_blocks();
#else
	return 1;
#endif
}

/* a barrier of the row's blocks, ordering their shared and global memory */
static __device__ __forceinline__ void samp_csync(void)
{
#ifdef SAMP_CLUSTER
	cg::this_cluster().sync();
#else
	__syncthreads();
#endif
}

/* p in the shared memory of the row's block r */
template <typename T> static __device__ __forceinline__ T *samp_at(T *p, unsigned r)
{
#ifdef SAMP_CLUSTER
	return cg::this_cluster().map_shared_rank(p, r);
#else
	return p;
#endif
}

/* The values other blocks of the row read (through distributed shared memory) are double
 * buffered by g.ph, which every exchange flips: a buffer is written again two exchanges later,
 * after a cluster barrier that every block passes only once it has read it. So an exchange
 * takes one cluster barrier, not two; the kernel's last barrier covers the last reads. */
struct samp_shared {
	unsigned long long hist[2][256]; /* a radix pass's mass (or count) a digit: this block's */
	unsigned long long tot[256];  /* ... and the row's */
	unsigned long long red[SAMP_WARPS];
	unsigned long long all[SAMP_MAX_P * SAMP_WARPS]; /* samp_find: every warp's sum of the row */
	float fred[SAMP_WARPS];
	int ired[SAMP_WARPS];
	unsigned long long part[2], b0, b1; /* this block's partial; values warp 0 hands on */
	float fpart[2];
	int ipart[2], i0;
	double dred[SAMP_WARPS], dpart[2]; /* logprobs: the row's sum of exp */
	float top_v[FP4S_SAMP_MAX_TOP_LOGPROBS]; /* logprobs: this block's share of the top n */
	int top_i[FP4S_SAMP_MAX_TOP_LOGPROBS];
	int ntop;
	double lse; /* logprobs: the row's log-sum-exp */
};
/* dynamic shared memory: a histogram of 256 64-bit digits for each warp (radix passes) */
#define SAMP_DYN_SMEM (SAMP_WARPS * 256 * sizeof(unsigned long long))

/* where a thread's tokens are: t0, t0 + T, ... (T = the row's threads) */
struct samp_grid {
	unsigned q, P; /* this block's rank in the row, the row's blocks */
	int32_t t0, T;
	unsigned ph; /* which of the double-buffered exchange values is next (samp_shared) */
};

/* v[j] = l[i0 + j * step] for the SAMP_U tokens a thread takes at once, fill past end: the loads
 * go out together */
static __device__ __forceinline__ void samp_load(float (&v)[SAMP_U], const float *l, int32_t i0, int32_t step,
                                                 int32_t end, float fill)
{
#pragma unroll
	for (int j = 0; j < SAMP_U; j++)
		v[j] = i0 + j * step < end ? l[i0 + j * step] : fill;
}

/* the row's sum of v: counts and fixed-point masses (exact), or logprobs' doubles */
template <typename T> static __device__ T samp_sum(T v, T *red, T *part, samp_grid &g)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(SAMP_FULL, v, o);
	__syncthreads();
	if ((threadIdx.x & 31) == 0)
		red[threadIdx.x >> 5] = v;
	__syncthreads();
	if (threadIdx.x < 32) { /* warp 0 sums the warps' values (SAMP_WARPS == 32) */
		T s = red[threadIdx.x];
		for (int o = 16; o > 0; o >>= 1)
			s += __shfl_xor_sync(SAMP_FULL, s, o);
		if (threadIdx.x == 0)
			part[g.ph] = s;
	}
	samp_csync();
	T s = 0;
	for (unsigned r = 0; r < g.P; r++)
		s += *samp_at(&part[g.ph], r);
	g.ph ^= 1;
	return s;
}

static __device__ __forceinline__ unsigned long long samp_sum(unsigned long long v, samp_shared &sh,
                                                              samp_grid &g)
{
	return samp_sum<unsigned long long>(v, sh.red, sh.part, g);
}

/* A logit's bits as an unsigned integer in the logits' order (negatives' bits flipped, -0 as +0):
 * the radix select of the top logprobs runs on these. w's keys are their bits (w >= 0). */
static __device__ __forceinline__ unsigned samp_key(float x)
{
	const unsigned b = __float_as_uint(x == 0.0f ? 0.0f : x);
	return b & 0x80000000u ? ~b : b | 0x80000000u;
}

static __device__ __forceinline__ float samp_unkey(unsigned k)
{
	return __uint_as_float(k & 0x80000000u ? k & 0x7FFFFFFFu : ~k);
}

/* the largest value (NaN never wins) */
static __device__ float samp_max(float v, samp_shared &sh, samp_grid &g)
{
	for (int o = 16; o > 0; o >>= 1) {
		const float u = __shfl_xor_sync(SAMP_FULL, v, o);
		v = u > v ? u : v;
	}
	__syncthreads();
	if ((threadIdx.x & 31) == 0)
		sh.fred[threadIdx.x >> 5] = v;
	__syncthreads();
	if (threadIdx.x < 32) {
		float m = sh.fred[threadIdx.x];
		for (int o = 16; o > 0; o >>= 1) {
			const float u = __shfl_xor_sync(SAMP_FULL, m, o);
			m = u > m ? u : m;
		}
		if (threadIdx.x == 0)
			sh.fpart[g.ph] = m;
	}
	samp_csync();
	float m = -INFINITY;
	for (unsigned r = 0; r < g.P; r++) {
		const float u = *samp_at(&sh.fpart[g.ph], r);
		m = u > m ? u : m;
	}
	g.ph ^= 1;
	return m;
}

/* argmax as the CPU's greedy loop: a value beats -inf and ties go to the lower id; -1 if none */
static __device__ int samp_argmax(const float *l, int32_t V, samp_shared &sh, samp_grid &g)
{
	float bv = -INFINITY;
	int bi = INT_MAX;
	for (int32_t i0 = g.t0; i0 < V; i0 += g.T * SAMP_U) {
		float v[SAMP_U];
		samp_load(v, l, i0, g.T, V, -INFINITY);
#pragma unroll
		for (int j = 0; j < SAMP_U; j++)
			if (v[j] > bv)
				bv = v[j], bi = i0 + j * g.T; /* a thread's indices grow: a tie keeps the lower */
	}
	for (int o = 16; o > 0; o >>= 1) {
		const float v = __shfl_xor_sync(SAMP_FULL, bv, o);
		const int i = __shfl_xor_sync(SAMP_FULL, bi, o);
		if (v > bv || (v == bv && i < bi))
			bv = v, bi = i;
	}
	__syncthreads();
	if ((threadIdx.x & 31) == 0)
		sh.fred[threadIdx.x >> 5] = bv, sh.ired[threadIdx.x >> 5] = bi;
	__syncthreads();
	if (threadIdx.x < 32) { /* the larger value, then the lower id: the same in any order */
		float v = sh.fred[threadIdx.x];
		int i = sh.ired[threadIdx.x];
		for (int o = 16; o > 0; o >>= 1) {
			const float u = __shfl_xor_sync(SAMP_FULL, v, o);
			const int j = __shfl_xor_sync(SAMP_FULL, i, o);
			if (u > v || (u == v && j < i))
				v = u, i = j;
		}
		if (threadIdx.x == 0)
			sh.fpart[g.ph] = v, sh.ipart[g.ph] = i;
	}
	samp_csync();
	bv = -INFINITY, bi = INT_MAX;
	for (unsigned r = 0; r < g.P; r++) {
		const float v = *samp_at(&sh.fpart[g.ph], r);
		const int i = *samp_at(&sh.ipart[g.ph], r);
		if (v > bv || (v == bv && i < bi))
			bv = v, bi = i;
	}
	g.ph ^= 1;
	return bi == INT_MAX ? -1 : bi;
}

/* the kept tokens: survivors (w >= thr), and with top_p's cut those ranked at or before
 * (cut_w, cut_id) */
struct samp_keep {
	float thr, cut_w;
	int cut_id;
	bool cut;
};

static __device__ __forceinline__ bool samp_kept(const samp_keep &k, float w, int32_t i)
{
	return w >= k.thr && (!k.cut || w > k.cut_w || (w == k.cut_w && i <= k.cut_id));
}

/* a token's weight in samp_find: 1 for a token equal to cut_w (ties: count), or its mass if kept */
static __device__ __forceinline__ unsigned long long samp_weight(const samp_keep &k, bool ties, float w, int32_t i)
{
	if (ties)
		return w == k.cut_w ? 1ull : 0ull;
	return samp_kept(k, w, i) ? fp4s_samp_fix(w) : 0ull;
}

/* The first i whose weights summed in id order over [0, i] exceed x (-1 if none). The row's
 * warps (P x 32) each sum a contiguous chunk; the warp whose chunk holds x then scans it 32
 * tokens at a time (SAMP_U groups loaded at once). */
static __device__ int samp_find(const float *l, int32_t V, const samp_keep &k, bool ties, unsigned long long x,
                                samp_shared &sh, samp_grid &g)
{
	const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	const int nw = (int)g.P * SAMP_WARPS, gw = (int)g.q * SAMP_WARPS + wid;
	const int32_t chunk = ((V + nw - 1) / nw + 31) & ~31;
	const int32_t lo = min(V, gw * chunk), hi = min(V, lo + chunk);
	unsigned long long s = 0;
	for (int32_t i0 = lo + lane; i0 < hi; i0 += 32 * SAMP_U) {
		float v[SAMP_U];
		samp_load(v, l, i0, 32, hi, 0.0f);
#pragma unroll
		for (int j = 0; j < SAMP_U; j++)
			s += i0 + 32 * j < hi ? samp_weight(k, ties, v[j], i0 + 32 * j) : 0ull;
	}
	for (int o = 16; o > 0; o >>= 1)
		s += __shfl_xor_sync(SAMP_FULL, s, o);
	if (lane == 0)
		sh.red[wid] = s;
	samp_csync();
	for (int i = threadIdx.x; i < nw; i += SAMP_THREADS)
		sh.all[i] = *samp_at(&sh.red[i % SAMP_WARPS], (unsigned)(i / SAMP_WARPS));
	__syncthreads();
	if (threadIdx.x < 32) {
		/* the first warp (in id order) whose running sum passes x: warp 0's lanes take g.P warps
		 * each, prefix sums by shuffles, then the lane that holds it scans its own */
		const int per = (int)g.P, w0 = lane * per;
		unsigned long long c = 0;
		for (int w = w0; w < w0 + per; w++)
			c += sh.all[w];
		unsigned long long incl = c;
		for (int o = 1; o < 32; o <<= 1) {
			const unsigned long long u = __shfl_up_sync(SAMP_FULL, incl, o);
			if (lane >= o)
				incl += u;
		}
		const unsigned hit = __ballot_sync(SAMP_FULL, x < incl);
		const int L = hit ? __ffs(hit) - 1 : 31;
		if (lane == L) {
			unsigned long long pre = incl - c;
			int sel = -1;
			for (int w = w0; w < w0 + per && sel < 0; w++) {
				if (x < pre + sh.all[w])
					sel = w;
				else
					pre += sh.all[w];
			}
			sh.i0 = sel;
			sh.b0 = x - pre;
			sh.b1 = (unsigned long long)-1;
		}
	}
	__syncthreads();
	const int sel = sh.i0;
	if (sel == gw) {
		const unsigned long long xr = sh.b0;
		unsigned long long cum = 0;
		bool found = false;
		for (int32_t i0 = lo; i0 < hi && !found; i0 += 32 * SAMP_U) {
			float v[SAMP_U];
			samp_load(v, l, i0 + lane, 32, hi, 0.0f);
#pragma unroll
			for (int j = 0; j < SAMP_U; j++) {
				const int32_t i = i0 + 32 * j + lane;
				unsigned long long inc = !found && i < hi ? samp_weight(k, ties, v[j], i) : 0ull;
				for (int o = 1; o < 32; o <<= 1) { /* inclusive scan over the lanes */
					const unsigned long long u = __shfl_up_sync(SAMP_FULL, inc, o);
					if (lane >= o)
						inc += u;
				}
				const unsigned hit = __ballot_sync(SAMP_FULL, !found && xr < cum + inc);
				if (hit && !found) {
					if (lane == __ffs(hit) - 1)
						sh.b1 = (unsigned long long)i;
					found = true;
				}
				cum += __shfl_sync(SAMP_FULL, inc, 31);
			}
		}
	}
	samp_csync();
	/* b1 is next written after another cluster barrier (the next samp_find's, or a radix
	 * pass's), which every block passes only once it has read this one */
	const unsigned long long r = sel < 0 ? (unsigned long long)-1 : *samp_at(&sh.b1, (unsigned)(sel / SAMP_WARPS));
	return r == (unsigned long long)-1 ? -1 : (int)r;
}

/* One radix pass over the row's tokens whose bits (raw: samp_key of the logit) above `shift + 8`
 * equal prefix (and w >= thr):
 * the count (mass: false) or mass (true) of each 8-bit digit at shift, into sh.tot. Lanes with
 * the same digit are found with __match_any_sync and summed by their first lane into its warp's
 * own histogram: no atomics, which for 64-bit shared memory values are compare-and-swap loops
 * that a few crowded digits (w's exponents) turned into a millisecond a row. */
static __device__ void samp_hist(const float *l, int32_t V, float thr, unsigned prefix, int shift, bool mass,
                                 bool raw, unsigned long long *wh, samp_shared &sh, samp_grid &g)
{
	const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	unsigned long long *h = wh + wid * 256;
	for (int d = lane; d < 256; d += 32)
		h[d] = 0;
	__syncwarp();
	const unsigned hi_mask = shift == 24 ? 0u : 0xFFFFFFFFu << (shift + 8);
	for (int32_t i0 = g.t0; i0 - lane < V; i0 += g.T * SAMP_U) {
		float v[SAMP_U];
		samp_load(v, l, i0, g.T, V, raw ? -INFINITY : -1.0f);
#pragma unroll
		for (int j = 0; j < SAMP_U; j++) {
			const unsigned b = raw ? samp_key(v[j]) : __float_as_uint(v[j]);
			const bool act = v[j] >= thr && (b & hi_mask) == prefix;
			if (!__any_sync(SAMP_FULL, act))
				continue; /* past the first pass most warps hold no token of the prefix */
			const unsigned key = act ? (b >> shift) & 255u : 256u;
			const unsigned peers = __match_any_sync(SAMP_FULL, key);
			if (act) {
				unsigned long long add = __popc(peers);
				if (mass) {
					/* fixed-point masses are < 2^45: two halves that 32 lanes sum in 32 bits */
					const unsigned long long m = fp4s_samp_fix(v[j]);
					const unsigned s_lo = __reduce_add_sync(peers, (unsigned)(m & 0x3FFFFFu));
					const unsigned s_hi = __reduce_add_sync(peers, (unsigned)(m >> 22));
					add = ((unsigned long long)s_hi << 22) + s_lo;
				}
				if (lane == __ffs(peers) - 1)
					h[key] += add;
			}
			__syncwarp();
		}
	}
	__syncthreads();
	for (int d = threadIdx.x; d < 256; d += SAMP_THREADS) {
		unsigned long long t = 0;
		for (int w = 0; w < SAMP_WARPS; w++)
			t += wh[w * 256 + d];
		sh.hist[g.ph][d] = t;
	}
	samp_csync();
	for (int d = threadIdx.x; d < 256; d += SAMP_THREADS) {
		unsigned long long t = 0;
		for (unsigned r = 0; r < g.P; r++)
			t += samp_at(sh.hist[g.ph], r)[d];
		sh.tot[d] = t;
	}
	g.ph ^= 1;
	__syncthreads(); /* sh.tot whole for warp 0's select */
}

/* a radix select's stop (samp_digit): count >= k, or mass not below target */
static __device__ __forceinline__ bool samp_reach(unsigned long long s, bool mass, unsigned long long k, double target)
{
	return mass ? !fp4s_samp_below(s, target) : s >= k;
}

/* A radix pass's digit, by warp 0: scanning sh.tot's 256 digits from the top with base (the
 * count or mass above the prefix's range) added, the first d >= 1 whose sum at or above it
 * reaches the select, else 0; sh.b0 = the prefix with d, sh.b1 = the sum strictly above d.
 * A lane holds 8 digits: its suffix sums by shuffles, then the lane where the sum first reaches
 * the select scans its own (thread 0 walking up to 255 digits took microseconds a pass). */
static __device__ void samp_digit(samp_shared &sh, unsigned long long base, bool mass, unsigned long long k,
                                  double target, unsigned prefix, int shift)
{
	const int lane = threadIdx.x & 31;
	unsigned long long c = 0;
	for (int e = 0; e < 8; e++)
		c += sh.tot[lane * 8 + e];
	unsigned long long incl = c; /* digits of this lane and the lanes above */
	for (int o = 1; o < 32; o <<= 1) {
		const unsigned long long u = __shfl_down_sync(SAMP_FULL, incl, o);
		if (lane + o < 32)
			incl += u;
	}
	/* the sums only grow downwards: the lanes that reach are 0 .. L */
	const unsigned hit = __ballot_sync(SAMP_FULL, samp_reach(base + incl, mass, k, target));
	const int L = hit ? 31 - __clz((int)hit) : 0;
	if (lane == L) {
		unsigned long long above = base + incl - c;
		int d = 8 * L + 7;
		for (; d > 0 && !samp_reach(above + sh.tot[d], mass, k, target); d--)
			above += sh.tot[d];
		sh.b0 = prefix | (unsigned)d << shift;
		sh.b1 = above;
	}
}

/* top_k: the bits of the k-th largest w (1 <= k < V), counting equal values; raw: the key of the
 * k-th largest logit (k <= the finite ones), *above_out the logits strictly above it */
static __device__ unsigned samp_kth(const float *l, int32_t V, int32_t k, bool raw, unsigned long long *above_out,
                                    unsigned long long *wh, samp_shared &sh, samp_grid &g)
{
	unsigned prefix = 0;
	unsigned long long above = 0; /* tokens above the prefix's range */
	for (int shift = 24; shift >= 0; shift -= 8) {
		samp_hist(l, V, raw ? -FLT_MAX : 0.0f, prefix, shift, false, raw, wh, sh, g);
		if (threadIdx.x < 32)
			samp_digit(sh, above, false, (unsigned long long)k, 0.0, prefix, shift);
		__syncthreads();
		prefix = (unsigned)sh.b0;
		above = sh.b1;
	}
	if (above_out)
		*above_out = above;
	return prefix;
}

/* top_p: the largest w* among the survivors whose survivors at or above it hold at least target
 * of the mass; *above = the survivors' mass strictly above w* */
static __device__ float samp_crossing(const float *l, int32_t V, float thr, double target, unsigned long long *above_out,
                                      unsigned long long *wh, samp_shared &sh, samp_grid &g)
{
	unsigned prefix = 0;
	unsigned long long above = 0;
	for (int shift = 24; shift >= 0; shift -= 8) {
		samp_hist(l, V, thr, prefix, shift, true, false, wh, sh, g);
		if (threadIdx.x < 32)
			samp_digit(sh, above, true, 0, target, prefix, shift);
		__syncthreads();
		prefix = (unsigned)sh.b0;
		above = sh.b1;
	}
	*above_out = above;
	return __uint_as_float(prefix);
}

/* sampler.h's pipeline on the row l (overwritten): the token, -1 if no logit is finite; *ko the
 * kept set when the token is drawn */
static __device__ int samp_pick(float *l, int32_t V, const fp4s_samp_row &r, const fp4s_samp_edit *edits,
                                samp_keep *ko, unsigned long long *samp_wh, samp_shared &sh, samp_grid &g)
{
	/* 1. edits, one a token (sampler.c's fp4s_samp_process_logits, step by step) */
	for (int32_t e = g.t0; e < r.n_edits; e += g.T) {
		const fp4s_samp_edit d = edits[r.edit0 + e];
		float x = l[d.token];
		if (d.has_bias)
			x = __fadd_rn(x, d.bias);
		if (d.mask)
			x = -INFINITY;
		if (d.seen) {
			if (r.rep != 1.0f)
				x = x > 0.0f ? __fdiv_rn(x, r.rep) : __fmul_rn(x, r.rep);
			if (d.n_out > 0) {
				x = __fsub_rn(x, __fmul_rn(r.freq, __uint2float_rn(d.n_out)));
				x = __fsub_rn(x, r.pres);
			}
		}
		l[d.token] = x;
	}
	samp_csync();
	if (r.greedy) {
		return samp_argmax(l, V, sh, g);
	}
	/* 2. temperature (a division, as vLLM) and the max */
	float m = -INFINITY;
	for (int32_t i0 = g.t0; i0 < V; i0 += g.T * SAMP_U) {
		float v[SAMP_U];
		samp_load(v, l, i0, g.T, V, -INFINITY);
#pragma unroll
		for (int j = 0; j < SAMP_U; j++) {
			const float x = __fdiv_rn(v[j], r.temperature);
			m = x > m ? x : m;
			if (i0 + j * g.T < V)
				l[i0 + j * g.T] = x;
		}
	}
	m = samp_max(m, sh, g);
	if (!(m > -INFINITY) || isinf(m))
		return -1; /* no finite logit */
	/* 3. w = exp(l - m); min_p is a threshold on w (the max has w = 1) */
	samp_keep k;
	k.thr = r.min_p > 0.0f ? fminf(r.min_p, 1.0f) : FLT_TRUE_MIN;
	k.cut = false, k.cut_w = 0.0f, k.cut_id = INT_MAX;
	unsigned long long mass = 0;
	for (int32_t i0 = g.t0; i0 < V; i0 += g.T * SAMP_U) {
		float v[SAMP_U];
		samp_load(v, l, i0, g.T, V, -INFINITY);
#pragma unroll
		for (int j = 0; j < SAMP_U; j++) {
			float w = fp4s_samp_exp(__fsub_rn(v[j], m));
			w = w == w ? w : 0.0f;
			if (i0 + j * g.T < V)
				l[i0 + j * g.T] = w;
			mass += w >= k.thr ? fp4s_samp_fix(w) : 0ull;
		}
	}
	mass = samp_sum(mass, sh, g);
	/* 4. top_k: survivors at or above the k-th largest */
	if (r.top_k > 0) {
		const float vk = __uint_as_float(samp_kth(l, V, r.top_k, false, NULL, samp_wh, sh, g));
		if (vk > k.thr) {
			k.thr = vk;
			mass = 0;
			for (int32_t i0 = g.t0; i0 < V; i0 += g.T * SAMP_U) {
				float v[SAMP_U];
				samp_load(v, l, i0, g.T, V, 0.0f);
#pragma unroll
				for (int j = 0; j < SAMP_U; j++)
					mass += v[j] >= vk ? fp4s_samp_fix(v[j]) : 0ull;
			}
			mass = samp_sum(mass, sh, g);
		}
	}
	/* 5. top_p: the crossing value, then how many of the tokens equal to it are kept (while the
	 * mass ranked above one is below target), and the last of those in id order */
	if (r.top_p < 1.0f) {
		const double target = fp4s_samp_target(r.top_p, mass);
		unsigned long long above;
		k.cut_w = samp_crossing(l, V, k.thr, target, &above, samp_wh, sh, g);
		unsigned long long ties = 0;
		for (int32_t i0 = g.t0; i0 < V; i0 += g.T * SAMP_U) {
			float v[SAMP_U];
			samp_load(v, l, i0, g.T, V, -1.0f);
#pragma unroll
			for (int j = 0; j < SAMP_U; j++)
				ties += v[j] == k.cut_w;
		}
		ties = samp_sum(ties, sh, g);
		const unsigned long long wv = fp4s_samp_fix(k.cut_w);
		unsigned long long c = ties; /* tokens of the tie kept: j = 0 .. c - 1 */
		if (wv > 0) {
			double est = (target - __ull2double_rn(above)) / __ull2double_rn(wv);
			unsigned long long j = est <= 0.0 ? 0ull : est >= (double)ties ? ties - 1 : (unsigned long long)est;
			while (j + 1 < ties && fp4s_samp_below(above + (j + 1) * wv, target))
				j++;
			while (j > 0 && !fp4s_samp_below(above + j * wv, target))
				j--;
			c = j + 1;
		}
		k.cut = true;
		k.cut_id = samp_find(l, V, k, true, c - 1, sh, g);
		mass = above + c * wv;
	}
	/* 6. the draw: the kept tokens' mass in id order */
	*ko = k; /* processed logprobs: the kept set */
	return samp_find(l, V, k, false, fp4s_samp_point(r.u, mass), sh, g);
}

/* Logprobs' top n: raw, of the logits l (1 <= n <= the finite ones), each l - lse; else of the
 * weights w in l (1 <= n <= the kept ones: the kept set is a prefix of this order), each
 * log(w) - lse. The n-th largest by a radix select (on samp_key, or w's bits), the ties at it
 * taken in id order up to n (samp_find counting them), the n gathered through each block's
 * shared memory and sorted by the writer (value descending, then id: sampler.c's top_n). */
static __device__ void samp_top(const float *l, int32_t V, int32_t n, double lse, bool raw, fp4s_samp_result *res,
                                bool writer, unsigned long long *wh, samp_shared &sh, samp_grid &g)
{
	unsigned long long above;
	const unsigned key = samp_kth(l, V, n, raw, &above, wh, sh, g);
	const float kv = raw ? samp_unkey(key) : __uint_as_float(key);
	samp_keep k;
	k.thr = -FLT_MAX, k.cut = false, k.cut_w = kv, k.cut_id = INT_MAX;
	const int cut = samp_find(l, V, k, true, (unsigned long long)n - above - 1, sh, g); /* the last tie kept */
	for (int32_t i0 = g.t0; i0 < V; i0 += g.T * SAMP_U) {
		float v[SAMP_U];
		samp_load(v, l, i0, g.T, V, -INFINITY);
#pragma unroll
		for (int j = 0; j < SAMP_U; j++) {
			const int32_t i = i0 + j * g.T;
			if (v[j] > kv || (v[j] == kv && i <= cut)) {
				const int at = atomicAdd(&sh.ntop, 1);
				if (at < FP4S_SAMP_MAX_TOP_LOGPROBS)
					sh.top_v[at] = v[j], sh.top_i[at] = i;
			}
		}
	}
	samp_csync();
	if (writer) {
		int m = 0;
		for (unsigned q = 0; q < g.P; q++) {
			const samp_shared *o = samp_at(&sh, q);
			const int c = min(o->ntop, FP4S_SAMP_MAX_TOP_LOGPROBS);
			for (int a = 0; a < c && m < n; a++) {
				const float v = o->top_v[a];
				const int i = o->top_i[a];
				int j = m++;
				for (; j > 0 && (res->top[j - 1].logprob < v ||
				                 (res->top[j - 1].logprob == v && res->top[j - 1].token > i));
				     j--)
					res->top[j] = res->top[j - 1];
				res->top[j].token = i, res->top[j].logprob = v;
			}
		}
		for (int j = 0; j < m; j++) {
			const double v = (double)res->top[j].logprob;
			res->top[j].logprob = (float)((raw ? v : log(v)) - lse);
		}
		res->n_top = m;
	}
	samp_csync(); /* the writer has read every block's share before any exits */
}

/* A row's log-softmax (raw logprobs before it samples, with its copy into s, which the edits and
 * the pipeline then overwrite; processed greedy ones after its edits, s NULL): the max (NaN never
 * wins), the sum of exp in double (sampler.c's logsoftmax_result) into sh.lse, and the top n.
 * Kept out of samp_pick's registers: the kernel holds nothing of it across the pipeline but
 * sh.lse. */
static __device__ __noinline__ void samp_lp_head(const float *l, float *s, int32_t V, int32_t n_top,
                                                 fp4s_samp_result *rs, bool writer, unsigned long long *wh,
                                                 samp_shared &sh, samp_grid &g)
{
	if (threadIdx.x == 0)
		sh.ntop = 0;
	float m = -INFINITY;
	for (int32_t i0 = g.t0; i0 < V; i0 += g.T * SAMP_U) {
		float v[SAMP_U];
		samp_load(v, l, i0, g.T, V, -INFINITY);
#pragma unroll
		for (int j = 0; j < SAMP_U; j++) {
			m = v[j] > m ? v[j] : m;
			if (s && i0 + j * g.T < V)
				s[i0 + j * g.T] = v[j];
		}
	}
	m = samp_max(m, sh, g); /* its barriers also publish the copy */
	double sum = 0.0;
	unsigned long long fin = 0;
	for (int32_t i0 = g.t0; i0 < V; i0 += g.T * SAMP_U) {
		float v[SAMP_U];
		samp_load(v, l, i0, g.T, V, -INFINITY);
#pragma unroll
		for (int j = 0; j < SAMP_U; j++)
			if (i0 + j * g.T < V) {
				sum += (double)expf(v[j] - m);
				fin += v[j] >= -FLT_MAX;
			}
	}
	sum = samp_sum<double>(sum, sh.dred, sh.dpart, g);
	fin = samp_sum(fin, sh, g);
	const double lse = (double)m + log(sum);
	const int32_t n = (int32_t)min((unsigned long long)n_top, fin);
	if (n > 0)
		samp_top(l, V, n, lse, true, rs, writer, wh, sh, g);
	else if (writer)
		rs->n_top = 0;
	if (threadIdx.x == 0)
		sh.lse = lse; /* read after the pipeline's barriers */
}

/* Processed logprobs of a drawn token (sampler.c's proc_lp): over the kept set k of the weights
 * w, the total in double, the chosen token's log(w) - log(total) and rank among the kept, and the
 * top n of the kept. */
static __device__ __noinline__ void samp_lp_proc(const float *w, int32_t V, int t, samp_keep k, int32_t n_top,
                                                 fp4s_samp_result *rs, bool writer, unsigned long long *wh,
                                                 samp_shared &sh, samp_grid &g)
{
	if (threadIdx.x == 0)
		sh.ntop = 0;
	double tot = 0.0;
	unsigned long long cnt = 0;
	const float wt = t >= 0 ? w[t] : 0.0f;
	unsigned long long rank = 0;
	for (int32_t i0 = g.t0; i0 < V; i0 += g.T * SAMP_U) {
		float v[SAMP_U];
		samp_load(v, w, i0, g.T, V, 0.0f);
#pragma unroll
		for (int j = 0; j < SAMP_U; j++) {
			const int32_t i = i0 + j * g.T;
			if (i < V && samp_kept(k, v[j], i)) {
				tot += (double)v[j];
				cnt++;
				rank += v[j] > wt;
			}
		}
	}
	tot = samp_sum<double>(tot, sh.dred, sh.dpart, g);
	cnt = samp_sum(cnt, sh, g);
	rank = samp_sum(rank, sh, g);
	const double lt = log(tot);
	const int32_t n = (int32_t)min((unsigned long long)n_top, cnt);
	if (n > 0 && t >= 0)
		samp_top(w, V, n, lt, false, rs, writer, wh, sh, g);
	else if (writer)
		rs->n_top = 0;
	if (writer) {
		rs->token = t;
		rs->logprob = t >= 0 ? (float)(log((double)wt) - lt) : 0.0f;
		rs->rank = t >= 0 ? (int32_t)rank + 1 : 0;
	}
}

/* After the draw: the chosen token's raw logprob and rank (1 + the logits strictly above it) */
static __device__ __noinline__ void samp_lp_tail(const float *l, int32_t V, int t, fp4s_samp_result *rs, bool writer,
                                                 samp_shared &sh, samp_grid &g)
{
	unsigned long long rank = 0;
	float xt = 0.0f;
	if (t >= 0) {
		xt = l[t];
		for (int32_t i0 = g.t0; i0 < V; i0 += g.T * SAMP_U) {
			float v[SAMP_U];
			samp_load(v, l, i0, g.T, V, -INFINITY);
#pragma unroll
			for (int j = 0; j < SAMP_U; j++)
				rank += v[j] > xt;
		}
		rank = samp_sum(rank, sh, g);
	}
	if (writer) {
		rs->token = t;
		rs->logprob = t >= 0 ? (float)((double)xt - sh.lse) : 0.0f;
		rs->rank = t >= 0 ? (int32_t)rank + 1 : 0;
	}
}

/* grid: P blocks a row (a cluster of P, or P = 1). A row with raw logprobs is sampled in its own
 * copy work[slot - slot0] (its edits and the pipeline overwrite what they sample from), and its
 * logprobs come from the raw row: max, the sum of exp in double, the top n; after the draw the
 * chosen token's rank. Processed logprobs come after the pipeline, from what it leaves in the
 * row: the edited logits (greedy) or the weights and the kept set. They go to res[slot]; every
 * token to out. */
static __global__ void __launch_bounds__(SAMP_THREADS)
	samp_kernel(float *logits, int32_t V, const fp4s_samp_row *rows, const fp4s_samp_edit *edits, int32_t *out,
	            float *work, int32_t slot0, fp4s_samp_result *res)
{
	__shared__ samp_shared sh;
	extern __shared__ unsigned long long samp_wh[];
	samp_grid g;
	g.q = samp_rank(), g.P = samp_nblocks();
	g.t0 = (int32_t)(g.q * SAMP_THREADS + threadIdx.x), g.T = (int32_t)(g.P * SAMP_THREADS);
	g.ph = 0;
	const int32_t row = (int32_t)(blockIdx.x / g.P);
	float *l = logits + (size_t)row * V;
	const bool writer = g.q == 0 && threadIdx.x == 0;
	float *s = l; /* what the row samples from */
	const int32_t lp = rows[row].logprobs;
	if (lp == FP4S_SAMP_ROW_LP_RAW) {
		const int32_t slot = rows[row].slot;
		s = work + (size_t)(slot - slot0) * V;
		samp_lp_head(l, s, V, rows[row].n_top, res + slot, writer, samp_wh, sh, g);
	}
	const fp4s_samp_row r = rows[row]; /* loaded after the head: none of it held through its call */
	samp_keep k;
	const int t = samp_pick(s, V, r, edits, &k, samp_wh, sh, g);
	if (writer)
		out[row] = t;
	if (lp) {
		/* the row's values loaded again, not held through the pipeline's registers */
		const fp4s_samp_row *rv = rows + row;
		const int32_t slot = *(volatile const int32_t *)&rv->slot, n_top = *(volatile const int32_t *)&rv->n_top;
		float *l2 = logits + (size_t)row * V;
		fp4s_samp_result *rs = res + slot;
		if (lp == FP4S_SAMP_ROW_LP_RAW) {
			samp_lp_tail(l2, V, t, rs, writer, sh, g);
		} else if (*(volatile const int32_t *)&rv->greedy) { /* the edited logits' log-softmax */
			samp_lp_head(l2, NULL, V, n_top, rs, writer, samp_wh, sh, g);
			samp_lp_tail(l2, V, t, rs, writer, sh, g);
		} else {
			samp_lp_proc(l2, V, t, k, n_top, rs, writer, samp_wh, sh, g);
		}
	}
	samp_csync(); /* no block exits while another may still read its shared memory */
}

/* The kernel's attributes, once: its dynamic shared memory, and clusters of 16 where the device
 * runs them (cudaOccupancyMaxPotentialClusterSize says; 8 is the portable size). Returns the
 * most blocks a row, 1 without clusters. */
static int samp_setup(cudaError_t *err)
{
	static int max_p = 0;
	if (max_p)
		return max_p;
	int dev = 0, major = 0;
	cudaGetDevice(&dev);
	cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
	*err = cudaFuncSetAttribute(samp_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SAMP_DYN_SMEM);
	if (*err != cudaSuccess)
		return 0;
	int p = major >= 9 ? 8 : 1;
	if (major >= 9 && cudaFuncSetAttribute(samp_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) ==
	                      cudaSuccess) {
		cudaLaunchConfig_t cfg = {};
		cfg.gridDim = dim3(SAMP_MAX_P);
		cfg.blockDim = dim3(SAMP_THREADS);
		cfg.dynamicSmemBytes = SAMP_DYN_SMEM;
		int c = 0;
		if (cudaOccupancyMaxPotentialClusterSize(&c, samp_kernel, &cfg) == cudaSuccess && c >= SAMP_MAX_P)
			p = SAMP_MAX_P;
	}
	cudaGetLastError();
	return max_p = p;
}

/* blocks a row: a cluster of up to max_p where the rows leave SMs idle (Hopper and later: 16);
 * FP4S_SAMPLE_BLOCKS=N sets it (1: one block a row; A/B) */
static int samp_blocks_for(int32_t n, int max_p)
{
	static int sms = 0, force = -1;
	if (force < 0) {
		int dev = 0;
		cudaGetDevice(&dev);
		cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
		const char *e = getenv("FP4S_SAMPLE_BLOCKS");
		force = e ? atoi(e) : 0;
		force = force == 1 || force == 2 || force == 4 || force == 8 || force == 16 ? force : 0;
	}
	int p = force > 0 ? force : 1;
	if (force <= 0)
		while (p < max_p && (int64_t)n * p * 2 <= sms)
			p *= 2;
	return p <= max_p ? p : max_p;
}

/* dev/sample_bench and the backend op: the kernel alone (rows, edits, out, work and res on the
 * device; work and res only for rows with logprobs) */
cudaError_t fp4s_cuda_sample_launch(float *logits, int32_t n, int32_t vocab, const struct fp4s_samp_row *d_rows,
                                    const struct fp4s_samp_edit *d_edits, int32_t *d_out, float *d_work, int32_t slot0,
                                    struct fp4s_samp_result *d_res, cudaStream_t s)
{
	cudaError_t e = cudaSuccess;
	const int max_p = samp_setup(&e);
	if (!max_p)
		return e;
	for (int p = samp_blocks_for(n, max_p); p > 1; p /= 2) {
		cudaLaunchConfig_t cfg = {};
		cudaLaunchAttribute at[1];
		cfg.gridDim = dim3((unsigned)(n * p));
		cfg.blockDim = dim3(SAMP_THREADS);
		cfg.dynamicSmemBytes = SAMP_DYN_SMEM;
		cfg.stream = s;
		at[0].id = cudaLaunchAttributeClusterDimension;
		at[0].val.clusterDim.x = (unsigned)p, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
		cfg.attrs = at;
		cfg.numAttrs = 1;
		if (cudaLaunchKernelEx(&cfg, samp_kernel, logits, vocab, d_rows, d_edits, d_out, d_work, slot0, d_res) ==
		    cudaSuccess)
			return cudaSuccess;
		cudaGetLastError(); /* no such cluster here: a smaller one, at last one block a row */
	}
	samp_kernel<<<n, SAMP_THREADS, SAMP_DYN_SMEM, s>>>(logits, vocab, d_rows, d_edits, d_out, d_work, slot0, d_res);
	return cudaGetLastError();
}

/* The backend op (backend.h): rows and edits staged in pinned memory and copied up in one piece
 * with the token slots (and logprob records) behind them, one launch (one per SAMP_LP_ROWS rows
 * with logprobs: each needs a copy of its row), the tokens and records read back. */
int cu_sample(struct fp4s_backend *be, float *logits, int32_t n, int64_t vocab, const struct fp4s_samp_row *rows,
              const struct fp4s_samp_edit *edits, int32_t n_edits, int32_t *out, struct fp4s_samp_result *lp,
              struct fp4s_error *err)
{
	struct cuda_impl *c = (struct cuda_impl *)be->impl;
	if (n < 1 || n > 1024)
		return fp4s_error_set(err, FP4S_EINVAL, "sample: %d rows", n);
	if (vocab < 1 || vocab > FP4S_SAMP_MAX_VOCAB)
		return fp4s_error_set(err, FP4S_EINVAL, "sample: vocabulary of %lld (at most %d)", (long long)vocab,
		                      FP4S_SAMP_MAX_VOCAB);
	if (n_edits < 0 || (n_edits > 0 && !edits))
		return fp4s_error_set(err, FP4S_EINVAL, "sample: %d edits", n_edits);
	int32_t nl = 0; /* rows with logprobs (raw or processed; only raw ones use their work copy) */
	for (int32_t i = 0; i < n; i++) {
		const fp4s_samp_row *r = &rows[i];
		if (r->edit0 < 0 || r->n_edits < 0 || r->edit0 > n_edits - r->n_edits || r->top_k < 0 ||
		    r->top_k >= vocab || (!r->greedy && !(r->temperature > 0.0f)) || r->n_top < 0 ||
		    r->n_top > FP4S_SAMP_MAX_TOP_LOGPROBS || r->logprobs < FP4S_SAMP_ROW_LP_NONE ||
		    r->logprobs > FP4S_SAMP_ROW_LP_PROCESSED || (r->logprobs && !lp))
			return fp4s_error_set(err, FP4S_EINVAL, "sample: row %d is malformed", i);
		nl += r->logprobs != 0;
	}
	for (int32_t i = 0; i < n_edits; i++)
		if (edits[i].token < 0 || edits[i].token >= vocab)
			return fp4s_error_set(err, FP4S_EINVAL, "sample: edit of token %d outside the vocabulary",
			                      edits[i].token);
	const size_t rb = (size_t)n * sizeof *rows, eb = (size_t)n_edits * sizeof *edits;
	const size_t ob = ((size_t)n * sizeof(int32_t) + 15) & ~(size_t)15, lb = (size_t)nl * sizeof *lp;
	const size_t need = rb + eb + ob + lb + 16;
	if (need > c->samp_bytes) {
		/* outside any capture: sampling follows the step's graph */
		cudaFree(c->d_samp), cudaFreeHost(c->h_samp);
		c->d_samp = c->h_samp = NULL;
		c->samp_bytes = 0;
		const size_t cap = need < 65536 ? 65536 : need + need / 2;
		FP4S_CUDA_TRY(err, cudaMalloc(&c->d_samp, cap));
		FP4S_CUDA_TRY(err, cudaMallocHost(&c->h_samp, cap));
		c->samp_bytes = cap;
	}
	const size_t wb = (size_t)(nl < SAMP_LP_ROWS ? nl : SAMP_LP_ROWS) * (size_t)vocab * sizeof(float);
	if (wb > c->samp_work_bytes) {
		cudaFree(c->d_samp_work);
		c->d_samp_work = NULL;
		c->samp_work_bytes = 0;
		FP4S_CUDA_TRY(err, cudaMalloc(&c->d_samp_work, wb));
		c->samp_work_bytes = wb;
	}
	char *d = (char *)c->d_samp, *h = (char *)c->h_samp;
	fp4s_samp_row *hr = (fp4s_samp_row *)h;
	memcpy(h, rows, rb);
	for (int32_t i = 0, k = 0; i < n; i++)
		hr[i].slot = hr[i].logprobs ? k++ : -1;
	if (eb)
		memcpy(h + rb, edits, eb);
	FP4S_CUDA_TRY(err, cudaMemcpyAsync(d, h, rb + eb, cudaMemcpyHostToDevice, c->s));
	/* the records start 16-byte aligned past the tokens */
	const size_t o_at = rb + eb, l_at = (o_at + ob + 15) & ~(size_t)15;
	int32_t *d_out = (int32_t *)(d + o_at), *h_out = (int32_t *)(h + o_at);
	fp4s_samp_result *d_res = (fp4s_samp_result *)(d + l_at), *h_res = (fp4s_samp_result *)(h + l_at);
	const fp4s_samp_row *d_rows = (const fp4s_samp_row *)d;
	for (int32_t a = 0, slot = 0; a < n;) {
		int32_t b = a, k = 0; /* rows [a, b): at most SAMP_LP_ROWS with logprobs */
		while (b < n && (k < SAMP_LP_ROWS || !rows[b].logprobs))
			k += rows[b++].logprobs != 0;
		FP4S_CUDA_TRY(err, fp4s_cuda_sample_launch(logits + (size_t)a * (size_t)vocab, b - a, (int32_t)vocab,
		                                           d_rows + a, (const fp4s_samp_edit *)(d + rb), d_out + a,
		                                           (float *)c->d_samp_work, slot, d_res, c->s));
		slot += k;
		a = b;
	}
	FP4S_CUDA_TRY(err, cudaMemcpyAsync(h_out, d_out, (size_t)n * sizeof *out, cudaMemcpyDeviceToHost, c->s));
	if (nl)
		FP4S_CUDA_TRY(err, cudaMemcpyAsync(h_res, d_res, lb, cudaMemcpyDeviceToHost, c->s));
	FP4S_CUDA_TRY(err, cudaStreamSynchronize(c->s));
	memcpy(out, h_out, (size_t)n * sizeof *out);
	for (int32_t i = 0; i < n; i++)
		if (hr[i].logprobs)
			lp[i] = h_res[hr[i].slot];
	return FP4S_OK;
}
