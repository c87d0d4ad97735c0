/* sample_row.cuh: the row-wide building blocks of sample.cu's kernel (included there only): a
 * row's blocks as a thread block cluster and their exchanges through distributed shared memory,
 * the reductions, the id-order scan (samp_find), the radix passes and their selects (samp_kth,
 * samp_crossing). Every function is called by all threads of all the row's blocks alike. */
#ifndef FP4S_SAMPLE_ROW_CUH
#define FP4S_SAMPLE_ROW_CUH

#include <cuda_runtime.h>
#include <float.h>
#include <limits.h>
#include <stdint.h>

#include <cooperative_groups.h>

#include "engine/samp_math.h"
#include "engine/sampler.h"

#define SAMP_THREADS 1024
#define SAMP_WARPS (SAMP_THREADS / 32) /* 32: warp 0 reduces the warps' values a lane each */
#define SAMP_U 8 /* tokens a thread loads at once: a pass is a few rounds of loads in flight, not
                  * ~150 dependent trips to L2 */
#define SAMP_FULL 0xFFFFFFFFu
static_assert(SAMP_WARPS == 32, "warp 0 reduces the block's warps a lane each");
#define SAMP_MAX_P 16 /* blocks a row at most (a cluster of 16 is non-portable: Hopper has it) */

/* A row's blocks form a thread block cluster (Hopper and later; one block elsewhere): each block
 * takes every P-th stretch of the row, and the values the pipeline needs whole (max, masses,
 * histograms, the draw's warp sums) are combined through distributed shared memory behind a
 * cluster barrier (double buffered: samp_shared). One block a row is compute bound on its SM (a division and an exp a token,
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
	unsigned long long red[SAMP_WARPS], red2[SAMP_WARPS]; /* red2, part2: samp_sum2's second value */
	unsigned long long all[SAMP_MAX_P * SAMP_WARPS]; /* samp_find: every warp's sum of the row */
	float fred[SAMP_WARPS];
	int ired[SAMP_WARPS];
	unsigned long long part[2], part2[2], b0, b1; /* this block's partial; values warp 0 hands on */
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

/* two sums in one exchange (one cluster barrier): *a and *b become the row's */
static __device__ void samp_sum2(unsigned long long *a, unsigned long long *b, samp_shared &sh, samp_grid &g)
{
	unsigned long long x = *a, y = *b;
	for (int o = 16; o > 0; o >>= 1) {
		x += __shfl_xor_sync(SAMP_FULL, x, o);
		y += __shfl_xor_sync(SAMP_FULL, y, o);
	}
	__syncthreads();
	if ((threadIdx.x & 31) == 0)
		sh.red[threadIdx.x >> 5] = x, sh.red2[threadIdx.x >> 5] = y;
	__syncthreads();
	if (threadIdx.x < 32) { /* warp 0 sums the warps' values (SAMP_WARPS == 32) */
		unsigned long long s = sh.red[threadIdx.x], t = sh.red2[threadIdx.x];
		for (int o = 16; o > 0; o >>= 1) {
			s += __shfl_xor_sync(SAMP_FULL, s, o);
			t += __shfl_xor_sync(SAMP_FULL, t, o);
		}
		if (threadIdx.x == 0)
			sh.part[g.ph] = s, sh.part2[g.ph] = t;
	}
	samp_csync();
	unsigned long long s = 0, t = 0;
	for (unsigned r = 0; r < g.P; r++)
		s += *samp_at(&sh.part[g.ph], r), t += *samp_at(&sh.part2[g.ph], r);
	g.ph ^= 1;
	*a = s, *b = t;
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

#endif
