/* sample.cu: sampling where the logits are. A thread block cluster (or one block) a row runs
 * sampler.h's pipeline on the row's logits in place: the row's edits (logit bias, the min_tokens
 * mask, penalties), greedy argmax, or temperature, min_p, top_k, top_p and the draw, with
 * samp_math.h's arithmetic, so the token is the one the CPU sampler (sampler.c) draws for the same
 * random number. Only the token leaves the device (4 bytes a row instead of the vocabulary's
 * logits), and the logprobs asked for (sampler.h's fp4s_samp_result). The row-wide building
 * blocks (cluster exchanges, reductions, radix passes, the id-order scan) are sample_row.cuh.
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

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_impl.h"
#include "backend/cuda/sample_cuda.h"
#include "backend/cuda/sample_row.cuh"
#include "engine/samp_math.h"
#include "engine/sampler.h"

#define SAMP_LP_ROWS 64 /* rows with logprobs a launch: each samples in a copy of its row */
#define SAMP_TOP_HI 0x1p-10f /* top_p's first candidates: w >= 2^-10 of the max's */

/* sampler.h's pipeline on the row l (overwritten): the token, -1 if no logit is finite; *ko the
 * kept set when the token is drawn */
/* one edit to x, each operation rounded once (sampler.c's fp4s_samp_process_logits, step by step) */
static __device__ __forceinline__ float samp_edit(float x, const fp4s_samp_row &r, bool has_bias, float bias,
                                                  bool mask, bool seen, unsigned n_out)
{
	if (has_bias)
		x = __fadd_rn(x, bias);
	if (mask)
		x = -INFINITY;
	if (seen) {
		if (r.rep != 1.0f)
			x = x > 0.0f ? __fdiv_rn(x, r.rep) : __fmul_rn(x, r.rep);
		if (n_out > 0) {
			x = __fsub_rn(x, __fmul_rn(r.freq, __uint2float_rn(n_out)));
			x = __fsub_rn(x, r.pres);
		}
	}
	return x;
}

/* prev: the token fed to this step, generated once more (r.prev_fed; else -1) */
static __device__ int samp_pick(float *l, int32_t V, const fp4s_samp_row &r, const fp4s_samp_edit *edits, int32_t prev,
                                samp_keep *ko, unsigned long long *samp_wh, samp_shared &sh, samp_grid &g)
{
	/* 1. edits, one a token */
	for (int32_t e = g.t0; e < r.n_edits; e += g.T) {
		const fp4s_samp_edit d = edits[r.edit0 + e];
		const bool again = d.token == prev;
		l[d.token] = samp_edit(l[d.token], r, d.has_bias, d.bias, d.mask, d.seen || again, d.n_out + again);
	}
	if (prev >= 0 && g.t0 == 0) {
		/* no edit names it (they are sorted by token): its own, as a token generated once */
		int32_t lo = 0, hi = r.n_edits;
		while (lo < hi) {
			const int32_t mid = (lo + hi) / 2;
			if (edits[r.edit0 + mid].token < prev)
				lo = mid + 1;
			else
				hi = mid;
		}
		if (lo == r.n_edits || edits[r.edit0 + lo].token != prev)
			l[prev] = samp_edit(l[prev], r, false, 0.0f, false, true, 1u);
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
	/* top_p without top_k: also the mass at or above hi (SAMP_TOP_HI, or thr if higher). For a
	 * trained model's peaked rows it already holds top_p of the mass, and the crossing's radix
	 * passes then see only those tokens (warps without one skip): the same crossing, as every
	 * token at or above it is there (sampler.c's first round of candidates, the same way). */
	const bool hi_path = r.top_p < 1.0f && r.top_k == 0;
	const float hi = hi_path ? fmaxf(k.thr, SAMP_TOP_HI) : INFINITY; /* w <= 1: none otherwise */
	unsigned long long mass = 0, mass_hi = 0;
	for (int32_t i0 = g.t0; i0 < V; i0 += g.T * SAMP_U) {
		float v[SAMP_U];
		samp_load(v, l, i0, g.T, V, -INFINITY);
#pragma unroll
		for (int j = 0; j < SAMP_U; j++) {
			float w = fp4s_samp_exp(__fsub_rn(v[j], m));
			w = w == w ? w : 0.0f;
			if (i0 + j * g.T < V)
				l[i0 + j * g.T] = w;
			const unsigned long long f = fp4s_samp_fix(w);
			mass += w >= k.thr ? f : 0ull;
			mass_hi += w >= hi ? f : 0ull;
		}
	}
	if (hi_path) /* the same branch in every block of the row */
		samp_sum2(&mass, &mass_hi, sh, g);
	else
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
		const float sel = hi_path && !fp4s_samp_below(mass_hi, target) ? hi : k.thr;
		k.cut_w = samp_crossing(l, V, sel, target, &above, samp_wh, sh, g);
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
/* feed, host (launches, cu_sample_launch): the token also to feed[row] for row < n_feed (the
 * next step's token; 0 for none, which keeps its embedding in range) and to host[row] (mapped);
 * adv (NULL: none): the next step's positions, advanced by one for those rows. */
static __global__ void __launch_bounds__(SAMP_THREADS)
	samp_kernel(float *logits, int32_t V, const fp4s_samp_row *rows, const fp4s_samp_edit *edits, int32_t *out,
	            float *work, int32_t slot0, fp4s_samp_result *res, int32_t *feed, int32_t n_feed, int32_t *host,
	            int32_t *adv)
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
	/* read before any block's writer replaces it (after samp_pick's cluster barriers) */
	const int32_t prev = rows[row].prev_fed && row < n_feed ? feed[row] : -1;
	float *s = l; /* what the row samples from */
	const int32_t lp = rows[row].logprobs;
	if (lp == FP4S_SAMP_ROW_LP_RAW) {
		const int32_t slot = rows[row].slot;
		s = work + (size_t)(slot - slot0) * V;
		samp_lp_head(l, s, V, rows[row].n_top, res + slot, writer, samp_wh, sh, g);
	}
	const fp4s_samp_row r = rows[row]; /* loaded after the head: none of it held through its call */
	samp_keep k;
	const int t = samp_pick(s, V, r, edits, prev, &k, samp_wh, sh, g);
	if (writer) {
		out[row] = t;
		if (row < n_feed) {
			feed[row] = t < 0 ? 0 : t;
			if (adv)
				adv[row] += 1; /* the next step's position (cuda_io.cu's argmax_kernel) */
		}
		if (host) {
			host[row] = t;
			__threadfence_system(); /* before the event that tells the host to read it */
		}
	}
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

static cudaError_t samp_enqueue(float *logits, int32_t n, int32_t vocab, const struct fp4s_samp_row *d_rows,
                                const struct fp4s_samp_edit *d_edits, int32_t *d_out, float *d_work, int32_t slot0,
                                struct fp4s_samp_result *d_res, int32_t *feed, int32_t n_feed, int32_t *host,
                                cudaStream_t s, int32_t *adv = NULL)
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
		if (cudaLaunchKernelEx(&cfg, samp_kernel, logits, vocab, d_rows, d_edits, d_out, d_work, slot0, d_res, feed,
		                       n_feed, host, adv) == cudaSuccess)
			return cudaSuccess;
		cudaGetLastError(); /* no such cluster here: a smaller one, at last one block a row */
	}
	samp_kernel<<<n, SAMP_THREADS, SAMP_DYN_SMEM, s>>>(logits, vocab, d_rows, d_edits, d_out, d_work, slot0, d_res,
	                                                   feed, n_feed, host, adv);
	return cudaGetLastError();
}

/* dev/sample_bench and the backend op: the kernel alone (rows, edits, out, work and res on the
 * device; work and res only for rows with logprobs) */
cudaError_t fp4s_cuda_sample_launch(float *logits, int32_t n, int32_t vocab, const struct fp4s_samp_row *d_rows,
                                    const struct fp4s_samp_edit *d_edits, int32_t *d_out, float *d_work, int32_t slot0,
                                    struct fp4s_samp_result *d_res, cudaStream_t s)
{
	return samp_enqueue(logits, n, vocab, d_rows, d_edits, d_out, d_work, slot0, d_res, NULL, 0, NULL, s);
}

int cu_stage_reserve(struct cuda_impl *c, size_t need, struct fp4s_error *err)
{
	if (need <= c->samp_bytes)
		return FP4S_OK;
	cudaFree(c->d_samp), cudaFreeHost(c->h_samp);
	c->d_samp = c->h_samp = NULL;
	c->samp_bytes = 0;
	const size_t cap = need < 65536 ? 65536 : need + need / 2;
	FP4S_CUDA_TRY(err, cudaMalloc(&c->d_samp, cap));
	FP4S_CUDA_TRY(err, cudaMallocHost(&c->h_samp, cap));
	c->samp_bytes = cap;
	return FP4S_OK;
}

/* The rows and edits as the kernel may read them; *nl: the rows with logprobs (lp: room for them) */
static int samp_check(int32_t n, int64_t vocab, const struct fp4s_samp_row *rows, const struct fp4s_samp_edit *edits,
                      int32_t n_edits, bool lp, bool fed, int32_t *nl, struct fp4s_error *err)
{
	if (n < 1 || n > 1024)
		return fp4s_error_set(err, FP4S_EINVAL, "sample: %d rows", n);
	if (vocab < 1 || vocab > FP4S_SAMP_MAX_VOCAB)
		return fp4s_error_set(err, FP4S_EINVAL, "sample: vocabulary of %lld (at most %d)", (long long)vocab,
		                      FP4S_SAMP_MAX_VOCAB);
	if (n_edits < 0 || (n_edits > 0 && !edits))
		return fp4s_error_set(err, FP4S_EINVAL, "sample: %d edits", n_edits);
	*nl = 0;
	for (int32_t i = 0; i < n; i++) {
		const fp4s_samp_row *r = &rows[i];
		if (r->edit0 < 0 || r->n_edits < 0 || r->edit0 > n_edits - r->n_edits || r->top_k < 0 ||
		    r->top_k >= vocab || (!r->greedy && !(r->temperature > 0.0f)) || r->n_top < 0 ||
		    r->n_top > FP4S_SAMP_MAX_TOP_LOGPROBS || r->logprobs < FP4S_SAMP_ROW_LP_NONE ||
		    r->logprobs > FP4S_SAMP_ROW_LP_PROCESSED || (r->logprobs && !lp) || (r->prev_fed && !fed))
			return fp4s_error_set(err, FP4S_EINVAL, "sample: row %d is malformed", i);
		*nl += r->logprobs != 0;
	}
	for (int32_t i = 0; i < n_edits; i++)
		if (edits[i].token < 0 || edits[i].token >= vocab)
			return fp4s_error_set(err, FP4S_EINVAL, "sample: edit of token %d outside the vocabulary",
			                      edits[i].token);
	return FP4S_OK;
}

/* The backend op (backend.h): rows and edits staged in pinned memory and copied up in one piece
 * with the token slots (and logprob records) behind them, one launch (one per SAMP_LP_ROWS rows
 * with logprobs: each needs a copy of its row), the tokens and records read back. */
int cu_sample(struct fp4s_backend *be, float *logits, int32_t n, int64_t vocab, const struct fp4s_samp_row *rows,
              const struct fp4s_samp_edit *edits, int32_t n_edits, int32_t *out, struct fp4s_samp_result *lp,
              struct fp4s_error *err)
{
	struct cuda_impl *c = (struct cuda_impl *)be->impl;
	int32_t nl = 0; /* rows with logprobs (raw or processed; only raw ones use their work copy) */
	int rc0 = samp_check(n, vocab, rows, edits, n_edits, lp != NULL, false, &nl, err);
	if (rc0)
		return rc0;
	const size_t rb = (size_t)n * sizeof *rows, eb = (size_t)n_edits * sizeof *edits;
	const size_t ob = ((size_t)n * sizeof(int32_t) + 15) & ~(size_t)15, lb = (size_t)nl * sizeof *lp;
	const int rc = cu_stage_reserve(c, rb + eb + ob + lb + 16, err); /* outside any capture: after the step's graph */
	if (rc)
		return rc;
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
		FP4S_CUDA_TRY(err, samp_enqueue(logits + (size_t)a * (size_t)vocab, b - a, (int32_t)vocab, d_rows + a,
		                                (const fp4s_samp_edit *)(d + rb), d_out + a, (float *)c->d_samp_work, slot,
		                                d_res, NULL, 0, NULL, c->s));
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

/* sample_launch's staging: d_sl and the pinned h_sl[2] of need bytes at least. A graph holds
 * d_sl's address (cu_graph_run_sample), so a move drops the graphs. */
static int sl_reserve(struct fp4s_backend *be, size_t need, struct fp4s_error *err)
{
	struct cuda_impl *c = (struct cuda_impl *)be->impl;
	if (need <= c->sl_bytes)
		return FP4S_OK;
	/* grown while no launch reads the old buffers */
	FP4S_CUDA_TRY(err, cudaStreamSynchronize(c->s));
	if (c->d_sl)
		cu_graph_reset(be);
	cu_sample_free(c);
	const size_t cap = need < 65536 ? 65536 : need + need / 2;
	FP4S_CUDA_TRY(err, cudaMalloc(&c->d_sl, cap));
	for (int i = 0; i < 2; i++) {
		FP4S_CUDA_TRY(err, cudaMallocHost(&c->h_sl[i], cap));
		FP4S_CUDA_TRY(err, cudaEventCreateWithFlags(&c->sl_done[i], cudaEventDisableTiming));
	}
	c->sl_bytes = cap;
	return FP4S_OK;
}

/* backend.h's sample_launch: as cu_sample for rows without logprobs, but nothing waits. The rows
 * and edits go up from the pinned slot not used by the launch before (its copy done), the
 * tokens to d_tok (the next step's, where it is fed) and to the mapped slot argmax_wait reads,
 * in the turns argmax launches take. */
int cu_sample_launch(struct fp4s_backend *be, float *logits, int32_t n, int64_t vocab,
                     const struct fp4s_samp_row *rows, const struct fp4s_samp_edit *edits, int32_t n_edits,
                     struct fp4s_error *err)
{
	struct cuda_impl *c = (struct cuda_impl *)be->impl;
	int32_t nl = 0;
	int rc = samp_check(n, vocab, rows, edits, n_edits, false, n <= c->batch_cap, &nl, err);
	if (rc)
		return rc;
	const size_t rb = (size_t)n * sizeof *rows, eb = (size_t)n_edits * sizeof *edits;
	const size_t o_at = (rb + eb + 15) & ~(size_t)15, need = o_at + (size_t)n * sizeof(int32_t);
	if ((rc = sl_reserve(be, need, err)))
		return rc;
	int k = 0;
	if ((rc = cu_tok_slot(c, &k, err)))
		return rc;
	const int h = c->sl_next;
	c->sl_next ^= 1;
	FP4S_CUDA_TRY(err, cudaEventSynchronize(c->sl_done[h])); /* the copy out of this slot is done */
	char *hs = (char *)c->h_sl[h], *d = (char *)c->d_sl;
	memcpy(hs, rows, rb);
	if (eb)
		memcpy(hs + rb, edits, eb);
	FP4S_CUDA_TRY(err, cudaMemcpyAsync(d, hs, rb + eb, cudaMemcpyHostToDevice, c->s));
	FP4S_CUDA_TRY(err, cudaEventRecord(c->sl_done[h], c->s));
	const int32_t n_feed = n < c->batch_cap ? n : c->batch_cap;
	FP4S_CUDA_TRY(err, samp_enqueue(logits, n, (int32_t)vocab, (const fp4s_samp_row *)d,
	                                (const fp4s_samp_edit *)(d + rb), (int32_t *)(d + o_at), NULL, 0, NULL, c->d_tok,
	                                n_feed, c->dh_tok[k], c->s));
	return cu_tok_launched(c, k, n, err);
}

/* backend.h's graph_run_sample: the step and sample_launch's kernel as one graph, as
 * cuda_io.cu's cu_graph_run_argmax does for the argmax, for one row and up to SAMP_TAIL_EDITS
 * edits (more take graph_run and sample_launch). The row and its edits go up from their pinned
 * slot by a copy node on a branch of the graph of its own, beside the step's kernels, so it costs
 * no boundary between two steps (sample_launch's copy sits between them). The copy is of a fixed
 * SAMP_TAIL_COPY bytes (a graph's copy has one size; 32 KB cross PCIe in ~2 us, beside a step of
 * ~1.5 ms), the token goes past it. A graph a token slot and staging slot (the kernel's and the
 * copy's addresses are the graph's). */
#define SAMP_TAIL_COPY 32768
#define SAMP_TAIL_EDITS ((int32_t)((SAMP_TAIL_COPY - sizeof(fp4s_samp_row)) / sizeof(fp4s_samp_edit)))
struct samp_tail {
	int (*record)(void *ctx, struct fp4s_error *err);
	void *ctx;
	struct cuda_impl *c;
	float *logits;
	int32_t vocab;
	int h, k;
};

static int samp_tail_record(void *p, struct fp4s_error *err)
{
	const struct samp_tail *t = (const struct samp_tail *)p;
	struct cuda_impl *c = t->c;
	const size_t rb = sizeof(fp4s_samp_row);
	FP4S_CUDA_TRY(err, cudaEventRecord(c->sl_fork, c->s));
	FP4S_CUDA_TRY(err, cudaStreamWaitEvent(c->s2, c->sl_fork, 0));
	FP4S_CUDA_TRY(err, cudaMemcpyAsync(c->d_sl, c->h_sl[t->h], SAMP_TAIL_COPY, cudaMemcpyHostToDevice, c->s2));
	FP4S_CUDA_TRY(err, cudaEventRecord(c->sl_join, c->s2));
	int rc = t->record(t->ctx, err);
	if (rc)
		return rc;
	FP4S_CUDA_TRY(err, cudaStreamWaitEvent(c->s, c->sl_join, 0));
	char *d = (char *)c->d_sl;
	FP4S_CUDA_TRY(err, samp_enqueue(t->logits, 1, t->vocab, (const fp4s_samp_row *)d, (const fp4s_samp_edit *)(d + rb),
	                                (int32_t *)(d + SAMP_TAIL_COPY), NULL, 0, NULL, c->d_tok, 1, c->dh_tok[t->k], c->s,
	                                c->d_pos));
	return FP4S_OK;
}

#define SAMP_TAIL_KEY 1024 /* graph keys key + SAMP_TAIL_KEY (1 + k + 2 h), above cuda_io.cu's */

int cu_graph_run_sample(struct fp4s_backend *be, int key, int (*record)(void *ctx, struct fp4s_error *err), void *ctx,
                        float *logits, int32_t n, int64_t vocab, const struct fp4s_samp_row *rows,
                        const struct fp4s_samp_edit *edits, int32_t n_edits, struct fp4s_error *err)
{
	struct cuda_impl *c = (struct cuda_impl *)be->impl;
	if (!cu_tail_ok(c, key, n) || n_edits > SAMP_TAIL_EDITS)
		return FP4S_EUNSUPPORTED;
	int32_t nl = 0;
	int rc = samp_check(n, vocab, rows, edits, n_edits, false, n <= c->batch_cap, &nl, err);
	if (rc)
		return rc;
	cudaError_t ce = cudaSuccess;
	if (!samp_setup(&ce)) /* the kernel's attributes set outside the capture */
		return fp4s_error_set(err, FP4S_ECUDA, "sample: %s", cudaGetErrorString(ce));
	if ((rc = sl_reserve(be, SAMP_TAIL_COPY + 16, err)))
		return rc;
	if (!c->s2) {
		FP4S_CUDA_TRY(err, cudaStreamCreateWithFlags(&c->s2, cudaStreamNonBlocking));
		FP4S_CUDA_TRY(err, cudaEventCreateWithFlags(&c->sl_fork, cudaEventDisableTiming));
		FP4S_CUDA_TRY(err, cudaEventCreateWithFlags(&c->sl_join, cudaEventDisableTiming));
	}
	int k = 0;
	if ((rc = cu_tok_slot(c, &k, err)))
		return rc;
	const int h = c->sl_next;
	c->sl_next ^= 1;
	FP4S_CUDA_TRY(err, cudaEventSynchronize(c->sl_done[h])); /* the graph that copied out of it is done */
	memcpy(c->h_sl[h], rows, sizeof *rows);
	if (n_edits) /* after the row, as sample_launch lays them out (the row's edit0 is checked) */
		memcpy((char *)c->h_sl[h] + sizeof *rows, edits, (size_t)n_edits * sizeof *edits);
	cu_tail_begin(c);
	struct samp_tail t = {record, ctx, c, logits, (int32_t)vocab, h, k};
	if ((rc = cu_graph_run(be, key + SAMP_TAIL_KEY * (1 + k + 2 * h), samp_tail_record, &t, err)))
		return rc;
	FP4S_CUDA_TRY(err, cudaEventRecord(c->sl_done[h], c->s));
	if ((rc = cu_tok_launched(c, k, 1, err)))
		return rc;
	cu_tail_done(c);
	return FP4S_OK;
}

void cu_sample_free(struct cuda_impl *c)
{
	cudaFree(c->d_sl);
	c->d_sl = NULL;
	for (int i = 0; i < 2; i++) {
		cudaFreeHost(c->h_sl[i]);
		c->h_sl[i] = NULL;
		if (c->sl_done[i])
			cudaEventDestroy(c->sl_done[i]);
		c->sl_done[i] = NULL;
	}
	c->sl_bytes = 0;
	c->sl_next = 0;
}
