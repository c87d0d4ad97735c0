/* sampler.c: the CPU reference sampler. See sampler.h for the order of operations and the vLLM
 * semantics it follows. Cost per token, vocab V: the bias/penalty stage touches only the biased,
 * masked and seen tokens; the random path makes about three passes over V (scale + max, exp +
 * sum, draw) and never sorts: top_k finds the k-th largest value (heap or quickselect), top_p
 * runs a mass-weighted quickselect over a candidate prefix. */
#include "engine/sampler.h"
#include "engine/samp_math.h"

#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* top_k up to this uses a k-element min-heap to find the k-th largest value (V log k with most
 * tokens rejected by one compare); larger k uses quickselect on a copy. */
#define FP4S_SAMP_HEAP_K 256

/* ------------------------------------------------------------------------------------------ */
/* RNG: xoshiro256** (Blackman & Vigna), seeded through splitmix64 so that nearby seeds (0, 1, 2)
 * give unrelated streams and the state is never all zero. */

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t st[4])
{
	uint64_t r = rotl64(st[1] * 5, 7) * 9;
	uint64_t t = st[1] << 17;
	st[2] ^= st[0];
	st[3] ^= st[1];
	st[1] ^= st[2];
	st[0] ^= st[3];
	st[2] ^= t;
	st[3] = rotl64(st[3], 45);
	return r;
}

/* Unseeded requests must differ from each other even when started in the same nanosecond, so a
 * process-wide counter is mixed with the clock. */
static atomic_uint_fast64_t g_unseeded_counter;

static uint64_t unseeded_seed(void)
{
	struct timespec ts;
	timespec_get(&ts, TIME_UTC);
	uint64_t c = (uint64_t)atomic_fetch_add(&g_unseeded_counter, 1);
	uint64_t x = c * 0xD1B54A32D192ED03ull;
	return splitmix64(&x) ^ ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec);
}

static void rng_seed(uint64_t st[4], uint64_t seed)
{
	uint64_t x = seed;
	for (int i = 0; i < 4; i++)
		st[i] = splitmix64(&x);
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t st[4]) { return (double)(rng_next(st) >> 11) * 0x1.0p-53; }

/* ------------------------------------------------------------------------------------------ */
/* Parameters */

void fp4s_samp_defaults(struct fp4s_sampling *p)
{
	memset(p, 0, sizeof *p);
	p->temperature = 1.0f;
	p->top_p = 1.0f;
	p->top_k = 0;
	p->repetition_penalty = 1.0f;
	p->logprobs_mode = FP4S_SAMP_LOGPROBS_RAW;
}

/* Comparisons are written so that NaN fails them: `!(x >= lo && x <= hi)` rejects NaN. */
int fp4s_samp_validate(const struct fp4s_sampling *p, int32_t vocab, struct fp4s_error *err)
{
	if (!p)
		return fp4s_error_set(err, FP4S_EINVAL, "sampling parameters missing");
	if (!(p->temperature >= 0.0f && p->temperature <= FP4S_SAMP_MAX_TEMPERATURE))
		return fp4s_error_set(err, FP4S_EINVAL, "temperature must be between 0 and %g, got %g",
		                      (double)FP4S_SAMP_MAX_TEMPERATURE, (double)p->temperature);
	if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
		return fp4s_error_set(err, FP4S_EINVAL, "top_p must be in (0, 1], got %g",
		                      (double)p->top_p);
	if (p->top_k < -1)
		return fp4s_error_set(err, FP4S_EINVAL,
		                      "top_k must be -1 or 0 (disabled) or at least 1, got %d",
		                      (int)p->top_k);
	if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
		return fp4s_error_set(err, FP4S_EINVAL, "min_p must be in [0, 1], got %g",
		                      (double)p->min_p);
	if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
		return fp4s_error_set(err, FP4S_EINVAL,
		                      "presence_penalty must be in [-2, 2], got %g",
		                      (double)p->presence_penalty);
	if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
		return fp4s_error_set(err, FP4S_EINVAL,
		                      "frequency_penalty must be in [-2, 2], got %g",
		                      (double)p->frequency_penalty);
	if (!(p->repetition_penalty > 0.0f && p->repetition_penalty <= 100.0f))
		return fp4s_error_set(err, FP4S_EINVAL,
		                      "repetition_penalty must be in (0, 100], got %g",
		                      (double)p->repetition_penalty);
	if (p->top_logprobs < 0 || p->top_logprobs > FP4S_SAMP_MAX_TOP_LOGPROBS)
		return fp4s_error_set(err, FP4S_EINVAL, "top_logprobs must be in [0, %d], got %d",
		                      FP4S_SAMP_MAX_TOP_LOGPROBS, (int)p->top_logprobs);
	if (p->top_logprobs > 0 && !p->logprobs)
		return fp4s_error_set(err, FP4S_EINVAL,
		                      "top_logprobs requires logprobs to be true");
	if (p->logprobs_mode != FP4S_SAMP_LOGPROBS_RAW &&
	    p->logprobs_mode != FP4S_SAMP_LOGPROBS_PROCESSED)
		return fp4s_error_set(err, FP4S_EINVAL, "logprobs_mode %d is not known",
		                      (int)p->logprobs_mode);
	if (p->min_tokens < 0)
		return fp4s_error_set(err, FP4S_EINVAL, "min_tokens must be >= 0, got %d",
		                      (int)p->min_tokens);
	if (p->max_tokens < 0)
		return fp4s_error_set(err, FP4S_EINVAL, "max_tokens must be >= 0, got %d",
		                      (int)p->max_tokens);
	if (p->max_tokens > 0 && p->min_tokens > p->max_tokens)
		return fp4s_error_set(err, FP4S_EINVAL,
		                      "min_tokens (%d) must be <= max_tokens (%d)",
		                      (int)p->min_tokens, (int)p->max_tokens);
	if (p->n_logit_bias < 0 || p->n_logit_bias > FP4S_SAMP_MAX_LOGIT_BIAS)
		return fp4s_error_set(err, FP4S_EINVAL, "logit_bias has %d entries, at most %d allowed",
		                      (int)p->n_logit_bias, FP4S_SAMP_MAX_LOGIT_BIAS);
	for (int32_t i = 0; i < p->n_logit_bias; i++) {
		const struct fp4s_samp_bias *b = &p->logit_bias[i];
		if (b->token < 0 || (vocab > 0 && b->token >= vocab))
			return fp4s_error_set(err, FP4S_EINVAL,
			                      "logit_bias: token id %d is out of vocabulary (size %d)",
			                      (int)b->token, (int)vocab);
		if (!(b->bias >= -100.0f && b->bias <= 100.0f))
			return fp4s_error_set(err, FP4S_EINVAL,
			                      "logit_bias: bias for token %d must be in [-100, 100], got %g",
			                      (int)b->token, (double)b->bias);
	}
	if (p->n_stop_ids < 0 || p->n_stop_ids > FP4S_SAMP_MAX_STOP_IDS)
		return fp4s_error_set(err, FP4S_EINVAL,
		                      "stop_token_ids has %d entries, at most %d allowed",
		                      (int)p->n_stop_ids, FP4S_SAMP_MAX_STOP_IDS);
	for (int32_t i = 0; i < p->n_stop_ids; i++)
		if (p->stop_ids[i] < 0 || (vocab > 0 && p->stop_ids[i] >= vocab))
			return fp4s_error_set(err, FP4S_EINVAL,
			                      "stop_token_ids: token id %d is out of vocabulary (size %d)",
			                      (int)p->stop_ids[i], (int)vocab);
	return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Token counts (hash map, linear probing, load <= 1/2) */

static uint32_t count_hash(int32_t token)
{
	uint32_t x = (uint32_t)token * 0x9E3779B1u;
	return x ^ (x >> 15);
}

static struct fp4s_samp_count *count_slot(struct fp4s_samp_count *t, uint32_t cap, int32_t token)
{
	uint32_t i = count_hash(token) & (cap - 1);
	while (t[i].token != -1 && t[i].token != token)
		i = (i + 1) & (cap - 1);
	return &t[i];
}

static int counts_grow(struct fp4s_sampler *s)
{
	uint32_t cap = s->counts_cap ? s->counts_cap * 2 : 64;
	struct fp4s_samp_count *t = malloc((size_t)cap * sizeof *t);
	if (!t)
		return FP4S_ENOMEM;
	for (uint32_t i = 0; i < cap; i++)
		t[i] = (struct fp4s_samp_count){.token = -1};
	for (uint32_t i = 0; i < s->counts_cap; i++)
		if (s->counts[i].token != -1)
			*count_slot(t, cap, s->counts[i].token) = s->counts[i];
	free(s->counts);
	s->counts = t;
	s->counts_cap = cap;
	return 0;
}

/* The map never holds more than vocab distinct tokens, so its size is bounded by 4 * vocab
 * entries (next power of two of 2 * vocab). */
static struct fp4s_samp_count *counts_get(struct fp4s_sampler *s, int32_t token)
{
	if ((s->counts_used + 1) * 2 > s->counts_cap && counts_grow(s) != 0)
		return NULL;
	struct fp4s_samp_count *c = count_slot(s->counts, s->counts_cap, token);
	if (c->token == -1) {
		c->token = token;
		s->counts_used++;
	}
	return c;
}

/* ------------------------------------------------------------------------------------------ */
/* Lifetime */

int fp4s_samp_init(struct fp4s_sampler *s, const struct fp4s_sampling *p, int32_t vocab,
                   const int32_t *prompt, int32_t n_prompt, const int32_t *eos, int32_t n_eos,
                   struct fp4s_error *err)
{
	memset(s, 0, sizeof *s);
	if (vocab <= 0)
		return fp4s_error_set(err, FP4S_EINVAL, "sampler: vocab size %d", (int)vocab);
	int rc = fp4s_samp_validate(p, vocab, err);
	if (rc)
		return rc;
	if (n_eos < 0 || n_eos > FP4S_SAMP_MAX_EOS || (n_eos > 0 && !eos))
		return fp4s_error_set(err, FP4S_EINVAL, "sampler: %d EOS ids, at most %d", (int)n_eos,
		                      FP4S_SAMP_MAX_EOS);
	for (int32_t i = 0; i < n_eos; i++) {
		if (eos[i] < 0 || eos[i] >= vocab)
			return fp4s_error_set(err, FP4S_EINVAL,
			                      "sampler: EOS id %d is out of vocabulary (size %d)",
			                      (int)eos[i], (int)vocab);
		s->eos[i] = eos[i];
	}
	if (n_prompt < 0 || (n_prompt > 0 && !prompt))
		return fp4s_error_set(err, FP4S_EINVAL, "sampler: prompt of %d tokens", (int)n_prompt);
	s->p = *p;
	/* A token listed twice in logit_bias gets one entry with the sum, so that every consumer
	 * (fp4s_samp_process_logits, a GPU's plan) adds one number per token. */
	int32_t nb = 0;
	for (int32_t i = 0; i < s->p.n_logit_bias; i++) {
		int32_t j = 0;
		while (j < nb && s->p.logit_bias[j].token != s->p.logit_bias[i].token)
			j++;
		if (j < nb)
			s->p.logit_bias[j].bias += s->p.logit_bias[i].bias;
		else
			s->p.logit_bias[nb++] = s->p.logit_bias[i];
	}
	s->p.n_logit_bias = nb;
	s->vocab = vocab;
	s->n_eos = n_eos;
	rng_seed(s->rng, p->has_seed ? p->seed : unseeded_seed());
	s->penalties = p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
	               p->frequency_penalty != 0.0f;
	/* Only the repetition penalty looks at the prompt (vLLM: presence/frequency count output
	 * tokens only), so without it the prompt is not recorded at all. */
	if (s->penalties && p->repetition_penalty != 1.0f) {
		for (int32_t i = 0; i < n_prompt; i++) {
			if (prompt[i] < 0 || prompt[i] >= vocab)
				return fp4s_error_set(err, FP4S_EINVAL,
				                      "sampler: prompt token %d at %d is out of vocabulary",
				                      (int)prompt[i], (int)i);
			struct fp4s_samp_count *c = counts_get(s, prompt[i]);
			if (!c)
				return fp4s_error_set(err, FP4S_ENOMEM, "sampler: out of memory");
			c->prompt = 1;
		}
	}
	return 0;
}

void fp4s_samp_free(struct fp4s_sampler *s)
{
	if (!s)
		return;
	free(s->counts);
	free(s->cand);
	free(s->raw);
	free(s->heap);
	s->counts = NULL;
	s->cand = NULL;
	s->raw = NULL;
	s->heap = NULL;
	s->counts_cap = s->counts_used = 0;
	s->cand_cap = 0;
}

int fp4s_samp_accept(struct fp4s_sampler *s, int32_t token)
{
	if (token < 0 || token >= s->vocab)
		return FP4S_EINVAL;
	if (s->n_generated < INT32_MAX)
		s->n_generated++;
	if (s->penalties) {
		struct fp4s_samp_count *c = counts_get(s, token);
		if (!c)
			return FP4S_ENOMEM;
		if (c->n_out < UINT32_MAX)
			c->n_out++;
	}
	return 0;
}

static int is_eos(const struct fp4s_sampler *s, int32_t token)
{
	for (int32_t i = 0; i < s->n_eos; i++)
		if (s->eos[i] == token)
			return 1;
	return 0;
}

int fp4s_samp_is_stop(const struct fp4s_sampler *s, int32_t token)
{
	for (int32_t i = 0; i < s->p.n_stop_ids; i++)
		if (s->p.stop_ids[i] == token)
			return 1;
	return !s->p.ignore_eos && is_eos(s, token);
}

/* ------------------------------------------------------------------------------------------ */
/* Stage 1-2: bias, min_tokens, penalties */

void fp4s_samp_process_logits(const struct fp4s_sampler *s, float *logits, int32_t vocab)
{
	const struct fp4s_sampling *p = &s->p;
	if (vocab != s->vocab)
		return;
	for (int32_t i = 0; i < p->n_logit_bias; i++)
		logits[p->logit_bias[i].token] += p->logit_bias[i].bias;
	if (s->n_generated < p->min_tokens) {
		for (int32_t i = 0; i < p->n_stop_ids; i++)
			logits[p->stop_ids[i]] = -INFINITY;
		if (!p->ignore_eos)
			for (int32_t i = 0; i < s->n_eos; i++)
				logits[s->eos[i]] = -INFINITY;
	}
	if (!s->penalties || !s->counts)
		return;
	const float rep = p->repetition_penalty;
	const float freq = p->frequency_penalty, pres = p->presence_penalty;
	for (uint32_t i = 0; i < s->counts_cap; i++) {
		const struct fp4s_samp_count *c = &s->counts[i];
		if (c->token == -1)
			continue;
		float l = logits[c->token];
		/* Order as vLLM's apply_penalties: repetition first, then frequency and presence. */
		if (rep != 1.0f)
			l = l > 0.0f ? l / rep : l * rep;
		if (c->n_out > 0) {
			l -= freq * (float)c->n_out;
			l -= pres;
		}
		logits[c->token] = l;
	}
}

/* ------------------------------------------------------------------------------------------ */
/* Selection helpers */

/* "a ranks above b": larger value, then lower id. */
static inline int ranks_above(float va, int32_t ia, float vb, int32_t ib)
{
	return va > vb || (va == vb && ia < ib);
}

/* The n (<= 20) best (value, id) pairs of x with x[i] >= floor, sorted descending (ties: lower
 * id first). A sorted insertion array: n is tiny and most elements fail the first compare. */
static int32_t top_n(const float *x, int32_t V, int32_t n, float floor,
                     struct fp4s_samp_logprob *out)
{
	int32_t m = 0;
	for (int32_t i = 0; i < V && n > 0; i++) {
		float v = x[i];
		if (!(v >= floor))
			continue;
		if (m == n && !ranks_above(v, i, out[m - 1].logprob, out[m - 1].token))
			continue;
		int32_t j = m < n ? m++ : n - 1;
		while (j > 0 && ranks_above(v, i, out[j - 1].logprob, out[j - 1].token)) {
			out[j] = out[j - 1];
			j--;
		}
		out[j] = (struct fp4s_samp_logprob){.token = i, .logprob = v};
	}
	return m;
}

static void heap_sift_down(float *h, int32_t n, int32_t i)
{
	for (;;) {
		int32_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < n && h[l] < h[m])
			m = l;
		if (r < n && h[r] < h[m])
			m = r;
		if (m == i)
			return;
		float t = h[i];
		h[i] = h[m];
		h[m] = t;
		i = m;
	}
}

/* k-th largest of the n values in a (reordered), 1 <= k <= n: iterative quickselect with a
 * median-of-three pivot and a three-way partition, so runs of equal values (the many exact zeros
 * of masked tokens) cost one pass instead of degenerating. */
static float quickselect_kth_largest(float *a, int32_t n, int32_t k)
{
	int32_t lo = 0, hi = n - 1, want = k - 1; /* index in descending order */
	while (lo < hi) {
		float x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi];
		float piv = x > y ? (y > z ? y : (x > z ? z : x)) : (x > z ? x : (y > z ? z : y));
		int32_t lt = lo, i = lo, gt = hi; /* [lo,lt) > piv, [lt,i) == piv, (gt,hi] < piv */
		while (i <= gt) {
			if (a[i] > piv) {
				float t = a[i]; a[i] = a[lt]; a[lt] = t;
				lt++, i++;
			} else if (a[i] < piv) {
				float t = a[i]; a[i] = a[gt]; a[gt] = t;
				gt--;
			} else {
				i++;
			}
		}
		if (want < lt)
			hi = lt - 1;
		else if (want > gt)
			lo = gt + 1;
		else
			return piv;
	}
	return a[lo];
}

/* The k-th largest of w[0..V) (k < V). */
static int kth_largest(struct fp4s_sampler *s, const float *w, int32_t V, int32_t k, float *out)
{
	if (k <= FP4S_SAMP_HEAP_K) {
		if (!s->heap && !(s->heap = malloc(FP4S_SAMP_HEAP_K * sizeof *s->heap)))
			return FP4S_ENOMEM;
		float *h = s->heap;
		for (int32_t i = 0; i < k; i++)
			h[i] = w[i];
		for (int32_t i = k / 2 - 1; i >= 0; i--)
			heap_sift_down(h, k, i);
		for (int32_t i = k; i < V; i++) {
			if (w[i] > h[0]) {
				h[0] = w[i];
				heap_sift_down(h, k, 0);
			}
		}
		*out = h[0];
		return 0;
	}
	/* Large k is rare; a temporary copy keeps w intact for the later passes. */
	float *a = malloc((size_t)V * sizeof *a);
	if (!a)
		return FP4S_ENOMEM;
	memcpy(a, w, (size_t)V * sizeof *a);
	*out = quickselect_kth_largest(a, V, k);
	free(a);
	return 0;
}

static int cand_reserve(struct fp4s_sampler *s, int32_t n)
{
	if (n <= s->cand_cap)
		return 0;
	int32_t cap = s->cand_cap ? s->cand_cap : 1024;
	while (cap < n)
		cap = cap > s->vocab / 2 ? s->vocab : cap * 2;
	struct fp4s_samp_cand *c = realloc(s->cand, (size_t)cap * sizeof *c);
	if (!c)
		return FP4S_ENOMEM;
	s->cand = c;
	s->cand_cap = cap;
	return 0;
}

/* Collects {w >= thr} into s->cand; returns the count or a negative status. */
static int32_t collect(struct fp4s_sampler *s, const float *w, int32_t V, float thr)
{
	int32_t n = 0;
	for (int32_t i = 0; i < V; i++) {
		if (w[i] >= thr) {
			if (n == s->cand_cap && cand_reserve(s, n + 1) != 0)
				return FP4S_ENOMEM;
			s->cand[n++] = (struct fp4s_samp_cand){.w = w[i], .id = i};
		}
	}
	return n;
}

static int cand_cmp(const void *a, const void *b)
{
	const struct fp4s_samp_cand *x = a, *y = b;
	if (x->w != y->w)
		return x->w > y->w ? -1 : 1;
	return (x->id > y->id) - (x->id < y->id);
}

static inline void cand_swap(struct fp4s_samp_cand *a, struct fp4s_samp_cand *b)
{
	struct fp4s_samp_cand t = *a;
	*a = *b;
	*b = t;
}

/* top_p without sorting: reorders c[0..n) so that the kept tokens come first and returns their
 * count. A token is kept iff the mass ranked strictly above it (rank: w desc, id asc) is below
 * target (masses in samp_math.h's fixed point, so the sums are exact in any order). Quickselect
 * weighted by mass: a three-way partition around a median-of-three pivot tells whether the
 * crossing token lies among the larger values (recurse there) or not (keep them all, walk the
 * equal ones in id order, continue with the smaller). Expected O(n), where a full sort of a flat
 * 100k-token distribution cost milliseconds per token. */
static int32_t nucleus_select(struct fp4s_samp_cand *c, int32_t n, double target)
{
	int32_t lo = 0, hi = n;
	uint64_t above = 0; /* mass of the kept tokens before lo */
	while (lo < hi) {
		float x = c[lo].w, y = c[lo + (hi - lo) / 2].w, z = c[hi - 1].w;
		float piv = x > y ? (y > z ? y : (x > z ? z : x)) : (x > z ? x : (y > z ? z : y));
		int32_t lt = lo, i = lo, gt = hi - 1; /* [lo,lt) > piv, [lt,i) == piv, (gt,hi) < piv */
		uint64_t mass_gt = 0;
		while (i <= gt) {
			if (c[i].w > piv) {
				mass_gt += fp4s_samp_fix(c[i].w);
				cand_swap(&c[i], &c[lt]);
				lt++, i++;
			} else if (c[i].w < piv) {
				cand_swap(&c[i], &c[gt]);
				gt--;
			} else {
				i++;
			}
		}
		if (lt > lo && !fp4s_samp_below(above + mass_gt, target)) {
			hi = lt; /* the crossing token is among the larger values; [lt, hi) is dropped */
			continue;
		}
		above += mass_gt;
		/* equal values: lower id ranks first. Runs are usually one token, but logits of a
		 * small or quantized model can repeat a value thousands of times. */
		if (gt - lt < 16) {
			for (int32_t a = lt + 1; a <= gt; a++)
				for (int32_t b = a; b > lt && c[b - 1].id > c[b].id; b--)
					cand_swap(&c[b - 1], &c[b]);
		} else {
			qsort(c + lt, (size_t)(gt - lt + 1), sizeof *c, cand_cmp);
		}
		for (int32_t a = lt; a <= gt; a++) {
			if (!fp4s_samp_below(above, target))
				return a;
			above += fp4s_samp_fix(c[a].w);
		}
		lo = gt + 1;
	}
	return lo;
}

/* log-softmax of x at `chosen` and the top-n, in double. */
static void logsoftmax_result(const float *x, int32_t V, int32_t chosen, int32_t n,
                              struct fp4s_samp_result *out)
{
	float m = -INFINITY;
	for (int32_t i = 0; i < V; i++)
		if (x[i] > m)
			m = x[i];
	/* expf of a float difference (exact for differences of nearby floats) is accurate to an
	 * ulp; the double sum keeps the 1e-5 logprob accuracy over 260k terms at half the cost of
	 * double exp. */
	double sum = 0.0;
	for (int32_t i = 0; i < V; i++)
		sum += (double)expf(x[i] - m);
	double lse = (double)m + log(sum);
	out->logprob = (float)((double)x[chosen] - lse);
	int32_t above = 0;
	for (int32_t i = 0; i < V; i++)
		above += x[i] > x[chosen];
	out->rank = above + 1;
	out->n_top = top_n(x, V, n, -FLT_MAX, out->top);
	for (int32_t i = 0; i < out->n_top; i++)
		out->top[i].logprob = (float)((double)out->top[i].logprob - lse);
}

/* ------------------------------------------------------------------------------------------ */
/* Sampling */

/* Steps 3-4 of the pipeline on logits already edited (steps 1-2), as p says, with the draw u
 * (unused when greedy); s gives the scratch and, for raw logprobs, the unedited row in s->raw. */
static int samp_draw(struct fp4s_sampler *s, const struct fp4s_sampling *p, double u, float *logits, int32_t V,
                     struct fp4s_samp_result *out, struct fp4s_error *err)
{
	const bool raw_lp = p->logprobs && p->logprobs_mode == FP4S_SAMP_LOGPROBS_RAW;
	const bool proc_lp = p->logprobs && p->logprobs_mode == FP4S_SAMP_LOGPROBS_PROCESSED;
	if (p->temperature < FP4S_SAMP_GREEDY_EPS) {
		/* Greedy: strict > keeps the first (lowest) id among ties, as torch.argmax. */
		int32_t best = -1;
		float bv = -INFINITY;
		for (int32_t i = 0; i < V; i++) {
			if (logits[i] > bv) {
				bv = logits[i];
				best = i;
			}
		}
		if (best < 0)
			return fp4s_error_set(err, FP4S_EINVAL,
			                      "sampler: no token has a finite logit after masking");
		out->token = best;
		if (raw_lp)
			logsoftmax_result(s->raw, V, best, p->top_logprobs, out);
		else if (proc_lp)
			logsoftmax_result(logits, V, best, p->top_logprobs, out);
		return 0;
	}

	/* Temperature as vLLM (a division, not a multiply by 1/T), then the max. */
	const float T = p->temperature;
	float m = -INFINITY;
	for (int32_t i = 0; i < V; i++) {
		float l = logits[i] / T;
		logits[i] = l;
		if (l > m)
			m = l;
	}
	if (!(m > -INFINITY) || !isfinite(m))
		return fp4s_error_set(err, FP4S_EINVAL,
		                      "sampler: no token has a finite logit after masking");
	/* From here logits[] holds w = exp(l - m) in [0, 1] (samp_math.h's exp: the bits a GPU
	 * computes too): the max token has w = 1, so min_p is a plain threshold on w (p_i < min_p *
	 * p_max <=> w_i < min_p). NaN logits become 0. Smallest positive float: tokens at w = 0
	 * (masked, or far below the max) are never candidates. */
	float floor = p->min_p > 0.0f ? p->min_p : FLT_TRUE_MIN;
	if (floor > 1.0f)
		floor = 1.0f;
	float *w = logits;
	uint64_t mass_floor = 0; /* mass of the min_p survivors {w >= floor} (samp_math.h's fixed point) */
	for (int32_t i = 0; i < V; i++) {
		float e = fp4s_samp_exp(w[i] - m);
		e = e == e ? e : 0.0f;
		w[i] = e;
		if (e >= floor)
			mass_floor += fp4s_samp_fix(e);
	}

	/* The survivors are {w >= thr}; top_p then keeps those ranked (w desc, id asc) at or before
	 * (cut_w, cut_id). */
	float thr = floor, cut_w = 0.0f;
	int32_t cut_id = INT32_MAX, n_cand = -1; /* -1: no candidate list (the survivors are all of V) */
	bool cut = false;
	if (p->top_k > 0 && p->top_k < V) {
		float vk;
		if (kth_largest(s, w, V, p->top_k, &vk) != 0)
			return fp4s_error_set(err, FP4S_ENOMEM, "sampler: out of memory");
		thr = vk > floor ? vk : floor;
		n_cand = collect(s, w, V, thr);
		if (n_cand < 0)
			return fp4s_error_set(err, FP4S_ENOMEM, "sampler: out of memory");
	}
	if (p->top_p < 1.0f) {
		/* Mass of the survivors, to know when a candidate prefix already holds top_p. */
		uint64_t total = mass_floor;
		if (n_cand >= 0) {
			total = 0;
			for (int32_t i = 0; i < n_cand; i++)
				total += fp4s_samp_fix(s->cand[i].w);
		}
		const double target = fp4s_samp_target(p->top_p, total);
		/* Without top_k, first collect only {w >= 1e-3} (a prefix of the ranking): for the
		 * peaked distributions of real models it already holds top_p of the mass, so a few
		 * hundred candidates go through the selection instead of the vocabulary. Otherwise
		 * the second round takes every survivor (t = floor); an intermediate 1e-6 round was
		 * tried and cost more than it saved, as a distribution flat enough to miss at 1e-3
		 * mostly misses at 1e-6 too. */
		for (float t_min = 1e-3f; n_cand < 0; t_min = 0.0f) {
			float t = t_min > floor ? t_min : floor;
			int32_t n = collect(s, w, V, t);
			if (n < 0)
				return fp4s_error_set(err, FP4S_ENOMEM, "sampler: out of memory");
			uint64_t mass = 0;
			for (int32_t i = 0; i < n; i++)
				mass += fp4s_samp_fix(s->cand[i].w);
			if (!fp4s_samp_below(mass, target) || t <= floor)
				n_cand = n;
		}
		/* >= 1 kept whenever n_cand >= 1: the top token has no mass above it */
		const int32_t kept = nucleus_select(s->cand, n_cand, target);
		if (kept < 1)
			return fp4s_error_set(err, FP4S_EINVAL, "sampler: no token left to sample from");
		cut = true;
		cut_w = s->cand[0].w;
		cut_id = s->cand[0].id;
		for (int32_t i = 1; i < kept; i++)
			if (s->cand[i].w < cut_w || (s->cand[i].w == cut_w && s->cand[i].id > cut_id))
				cut_w = s->cand[i].w, cut_id = s->cand[i].id;
	}
#define KEPT(i) (w[i] >= thr && (!cut || w[i] > cut_w || (w[i] == cut_w && (i) <= cut_id)))

	/* The draw: one 53-bit uniform scaled to the kept mass, then a cumulative scan of the kept
	 * tokens in id order, all in fixed point (a GPU gets the same token: samp_math.h). */
	uint64_t mass = 0;
	double total = 0.0; /* the same in floating point, for logprobs */
	for (int32_t i = 0; i < V; i++)
		if (KEPT(i))
			mass += fp4s_samp_fix(w[i]), total += (double)w[i];
	if (mass == 0)
		return fp4s_error_set(err, FP4S_EINVAL, "sampler: no token left to sample from");
	const uint64_t x = fp4s_samp_point(u, mass);
	uint64_t cum = 0;
	int32_t chosen = -1;
	for (int32_t i = 0; i < V && chosen < 0; i++)
		if (KEPT(i) && x < (cum += fp4s_samp_fix(w[i])))
			chosen = i;
	if (chosen < 0)
		return fp4s_error_set(err, FP4S_EINVAL, "sampler: no token left to sample from");
	out->token = chosen;

	if (raw_lp) {
		logsoftmax_result(s->raw, V, chosen, p->top_logprobs, out);
	} else if (proc_lp) {
		double lt = log(total);
		out->logprob = (float)(log((double)w[chosen]) - lt);
		/* rank within the sampled distribution: kept tokens with a larger w */
		int32_t above = 0;
		for (int32_t i = 0; i < V; i++)
			above += KEPT(i) && w[i] > w[chosen];
		out->rank = above + 1;
		const int32_t n = p->top_logprobs;
		if (!cut) {
			out->n_top = top_n(w, V, n, thr, out->top);
		} else {
			int32_t k = 0;
			for (int32_t i = 0; i < V && n > 0; i++)
				if (KEPT(i))
					s->cand[k++] = (struct fp4s_samp_cand){.w = w[i], .id = i};
			qsort(s->cand, (size_t)k, sizeof *s->cand, cand_cmp);
			out->n_top = n < k ? n : k;
			for (int32_t i = 0; i < out->n_top; i++)
				out->top[i] = (struct fp4s_samp_logprob){.token = s->cand[i].id, .logprob = s->cand[i].w};
		}
		for (int32_t i = 0; i < out->n_top; i++)
			out->top[i].logprob = (float)(log((double)out->top[i].logprob) - lt);
	}
#undef KEPT
	return 0;
}

/* The unedited row for raw logprobs, in s->raw. */
static int keep_raw(struct fp4s_sampler *s, const float *logits, int32_t V, struct fp4s_error *err)
{
	if (!s->raw && !(s->raw = malloc((size_t)V * sizeof *s->raw)))
		return fp4s_error_set(err, FP4S_ENOMEM, "sampler: out of memory");
	memcpy(s->raw, logits, (size_t)V * sizeof *logits);
	return 0;
}

static void result_clear(struct fp4s_samp_result *out)
{
	out->token = -1;
	out->logprob = 0.0f;
	out->rank = 0;
	out->n_top = 0;
}

int fp4s_samp_sample(struct fp4s_sampler *s, float *logits, int32_t vocab,
                     struct fp4s_samp_result *out, struct fp4s_error *err)
{
	const struct fp4s_sampling *p = &s->p;
	const int32_t V = vocab;
	if (V != s->vocab || !logits || !out)
		return fp4s_error_set(err, FP4S_EINVAL, "sampler: vocab %d, expected %d", (int)V,
		                      (int)s->vocab);
	result_clear(out);
	int rc;
	if (p->logprobs && p->logprobs_mode == FP4S_SAMP_LOGPROBS_RAW && (rc = keep_raw(s, logits, V, err)))
		return rc;
	fp4s_samp_process_logits(s, logits, V);
	/* Exactly one draw a sampled token, taken first so that a row that then fails (no finite
	 * logit) still advances the RNG as fp4s_samp_plan does. */
	const double u = p->temperature < FP4S_SAMP_GREEDY_EPS ? 0.0 : rng_uniform(s->rng);
	return samp_draw(s, p, u, logits, V, out, err);
}

/* one edit to x, each operation rounded once (sample.cu's samp_edit) */
static float edit_apply(float x, const struct fp4s_samp_row *row, bool has_bias, float bias, bool mask, bool seen,
                        uint32_t n_out)
{
	if (has_bias)
		x = x + bias;
	if (mask)
		x = -INFINITY;
	if (seen) {
		if (row->rep != 1.0f)
			x = x > 0.0f ? x / row->rep : x * row->rep;
		if (n_out > 0) {
			x = x - row->freq * (float)n_out;
			x = x - row->pres;
		}
	}
	return x;
}

int fp4s_samp_sample_row(struct fp4s_sampler *s, const struct fp4s_samp_row *row,
                         const struct fp4s_samp_edit *edits, int32_t prev, float *logits, int32_t vocab,
                         struct fp4s_samp_result *out, struct fp4s_error *err)
{
	const int32_t V = vocab;
	if (V != s->vocab || !logits || !out || !row || row->n_edits < 0 || (row->n_edits > 0 && !edits) ||
	    (row->prev_fed && (prev < 0 || prev >= V)))
		return fp4s_error_set(err, FP4S_EINVAL, "sampler: a row of vocab %d (%d edits, fed %d), expected %d",
		                      (int)V, row ? (int)row->n_edits : 0, row && row->prev_fed ? (int)prev : -1,
		                      (int)s->vocab);
	result_clear(out);
	struct fp4s_sampling p = s->p;
	p.temperature = row->greedy ? 0.0f : row->temperature;
	p.top_p = row->top_p, p.top_k = row->top_k, p.min_p = row->min_p;
	p.logprobs = row->logprobs != FP4S_SAMP_ROW_LP_NONE;
	p.logprobs_mode = row->logprobs == FP4S_SAMP_ROW_LP_PROCESSED ? FP4S_SAMP_LOGPROBS_PROCESSED
	                                                              : FP4S_SAMP_LOGPROBS_RAW;
	p.top_logprobs = row->logprobs ? row->n_top : 0;
	int rc;
	if (row->logprobs == FP4S_SAMP_ROW_LP_RAW && (rc = keep_raw(s, logits, V, err)))
		return rc;
	/* step 1, one edit a token (sample.cu's samp_pick); the fed token generated once more */
	bool prev_listed = false;
	for (int32_t e = 0; e < row->n_edits; e++) {
		const struct fp4s_samp_edit *d = &edits[e];
		if (d->token < 0 || d->token >= V)
			return fp4s_error_set(err, FP4S_EINVAL, "sampler: edit of token %d outside the vocabulary",
			                      d->token);
		const bool again = row->prev_fed && d->token == prev;
		prev_listed |= again;
		logits[d->token] = edit_apply(logits[d->token], row, d->has_bias, d->bias, d->mask, d->seen || again,
		                              d->n_out + again);
	}
	if (row->prev_fed && !prev_listed)
		logits[prev] = edit_apply(logits[prev], row, false, 0.0f, false, true, 1);
	return samp_draw(s, &p, row->u, logits, V, out, err);
}

/* ------------------------------------------------------------------------------------------ */
/* A row for a GPU backend */

int32_t fp4s_samp_plan_edits(const struct fp4s_sampler *s)
{
	int64_t n = (int64_t)s->p.n_logit_bias + s->p.n_stop_ids + s->n_eos;
	if (s->penalties && s->counts)
		n += s->counts_used;
	return n > INT32_MAX ? INT32_MAX : (int32_t)n;
}

static int edit_cmp(const void *a, const void *b)
{
	const struct fp4s_samp_edit *x = a, *y = b;
	return (x->token > y->token) - (x->token < y->token);
}

int fp4s_samp_plan(struct fp4s_sampler *s, struct fp4s_samp_row *row, struct fp4s_samp_edit *edits,
                   int32_t cap, int32_t *n_edits, struct fp4s_error *err)
{
	const struct fp4s_sampling *p = &s->p;
	int32_t n = 0;
#define EDIT(tok) (n < cap ? (edits[n] = (struct fp4s_samp_edit){.token = (tok)}, &edits[n++]) : NULL)
	for (int32_t i = 0; i < p->n_logit_bias; i++) {
		struct fp4s_samp_edit *e = EDIT(p->logit_bias[i].token);
		if (!e)
			return fp4s_error_set(err, FP4S_EINVAL, "sampler: more than %d edits", cap);
		e->bias = p->logit_bias[i].bias;
		e->has_bias = 1;
	}
	if (s->n_generated < p->min_tokens) {
		for (int32_t i = 0; i < p->n_stop_ids + (p->ignore_eos ? 0 : s->n_eos); i++) {
			struct fp4s_samp_edit *e = EDIT(i < p->n_stop_ids ? p->stop_ids[i] : s->eos[i - p->n_stop_ids]);
			if (!e)
				return fp4s_error_set(err, FP4S_EINVAL, "sampler: more than %d edits", cap);
			e->mask = 1;
		}
	}
	if (s->penalties && s->counts) {
		for (uint32_t i = 0; i < s->counts_cap; i++) {
			if (s->counts[i].token == -1)
				continue;
			struct fp4s_samp_edit *e = EDIT(s->counts[i].token);
			if (!e)
				return fp4s_error_set(err, FP4S_EINVAL, "sampler: more than %d edits", cap);
			e->seen = 1;
			e->n_out = s->counts[i].n_out;
		}
	}
#undef EDIT
	/* one edit a token (the device applies them in parallel): merge by token */
	qsort(edits, (size_t)n, sizeof *edits, edit_cmp);
	int32_t k = 0;
	for (int32_t i = 0; i < n; i++) {
		if (k > 0 && edits[k - 1].token == edits[i].token) {
			struct fp4s_samp_edit *d = &edits[k - 1];
			if (edits[i].has_bias)
				d->bias = edits[i].bias, d->has_bias = 1; /* one bias entry a token (init) */
			d->mask |= edits[i].mask;
			if (edits[i].seen)
				d->seen = 1, d->n_out = edits[i].n_out;
		} else {
			edits[k++] = edits[i];
		}
	}
	*n_edits = k;
	*row = (struct fp4s_samp_row){
		.temperature = p->temperature,
		.top_p = p->top_p,
		.min_p = p->min_p,
		.rep = s->penalties ? p->repetition_penalty : 1.0f,
		.freq = s->penalties ? p->frequency_penalty : 0.0f,
		.pres = s->penalties ? p->presence_penalty : 0.0f,
		.top_k = p->top_k > 0 && p->top_k < s->vocab ? p->top_k : 0,
		.n_edits = k,
		.greedy = p->temperature < FP4S_SAMP_GREEDY_EPS,
		.logprobs = !p->logprobs                                     ? FP4S_SAMP_ROW_LP_NONE
		            : p->logprobs_mode == FP4S_SAMP_LOGPROBS_PROCESSED ? FP4S_SAMP_ROW_LP_PROCESSED
		                                                               : FP4S_SAMP_ROW_LP_RAW,
		.n_top = p->logprobs ? p->top_logprobs : 0,
		.slot = -1,
	};
	/* exactly the draw fp4s_samp_sample would make (none for greedy) */
	if (!row->greedy)
		row->u = rng_uniform(s->rng);
	return 0;
}
