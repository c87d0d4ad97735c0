/* test_sampler.c: the sampler against its specification (sampler.h).
 *
 * Distribution checks draw many samples with a fixed sampler seed and compare the counts with the
 * exact expected probabilities (computed in double) by Pearson's chi-square. The threshold for
 * d degrees of freedom is the 1 - 1e-6 quantile of chi2(d), so a correct sampler fails a given
 * check about once in a million runs; the seeds are fixed, so a pass is in fact repeatable, and
 * the threshold says how surprising a failure with another seed would be:
 *   upper 1e-6 quantile of chi2(d): d=1: 23.93, 2: 27.63, 3: 30.66, 4: 33.38, ..., 9: 44.81
 *   (bisection on the closed-form chi2 survival function for integer d; chi2_crit below).
 * A broken sampler (e.g. a temperature applied as a multiply, or an off-by-one in the cumulative
 * scan) gives statistics in the thousands at 200k samples. */
#include "engine/sampler.h"
#include "test_util.h"

#include <float.h>
#include <stdint.h>

static double chi2_crit(int dof)
{
	switch (dof) {
	case 1: return 23.93;
	case 2: return 27.63;
	case 3: return 30.66;
	case 4: return 33.38;
	case 5: return 35.89;
	case 6: return 38.26;
	case 7: return 40.52;
	case 8: return 42.70;
	case 9: return 44.81;
	default: return -1.0;
	}
}

/* Samples n times from logits (copied each time, as the engine passes fresh logits) and counts. */
static int draw(struct fp4s_sampler *s, const float *logits, int32_t V, long n, long *counts)
{
	float *buf = malloc((size_t)V * sizeof *buf);
	struct fp4s_samp_result r;
	struct fp4s_error err = {0};
	for (int32_t i = 0; i < V; i++)
		counts[i] = 0;
	for (long k = 0; k < n; k++) {
		memcpy(buf, logits, (size_t)V * sizeof *buf);
		if (fp4s_samp_sample(s, buf, V, &r, &err) != 0 || r.token < 0 || r.token >= V) {
			free(buf);
			fprintf(stderr, "sample failed: %s\n", err.msg);
			return -1;
		}
		counts[r.token]++;
	}
	free(buf);
	return 0;
}

/* Pearson's statistic over the tokens with expected probability > 0; tokens with p = 0 must
 * have count 0 (checked separately). dof = (#support - 1). */
static double chi2(const long *counts, const double *p, int32_t V, long n, int *dof)
{
	double x = 0.0;
	int support = 0;
	for (int32_t i = 0; i < V; i++) {
		if (p[i] <= 0.0)
			continue;
		double e = p[i] * (double)n;
		x += ((double)counts[i] - e) * ((double)counts[i] - e) / e;
		support++;
	}
	*dof = support - 1;
	return x;
}

static void softmax_d(const float *l, int32_t V, double T, double *p)
{
	double m = -INFINITY, z = 0.0;
	for (int32_t i = 0; i < V; i++)
		if (l[i] / T > m)
			m = l[i] / T;
	for (int32_t i = 0; i < V; i++)
		z += (p[i] = exp((double)l[i] / T - m));
	for (int32_t i = 0; i < V; i++)
		p[i] /= z;
}

/* The exact top_p set of (unnormalised) probabilities p[V]: rank by (p desc, id asc), keep while the mass
 * strictly above is < top_p. Marks in[] and returns the count. Shell sort: no comparator through
 * a global is needed. */
static int32_t exact_nucleus(const double *p, int32_t V, double top_p, char *in)
{
	if (V <= 0)
		return 0;
	struct pr {
		double p;
		int32_t id;
	} *ps = malloc((size_t)V * sizeof *ps);
	for (int32_t i = 0; i < V; i++)
		ps[i] = (struct pr){p[i], i};
	for (int32_t gap = V / 2; gap > 0; gap /= 2)
		for (int32_t i = gap; i < V; i++) {
			struct pr t = ps[i];
			int32_t j = i;
			while (j >= gap &&
			       (ps[j - gap].p < t.p || (ps[j - gap].p == t.p && ps[j - gap].id > t.id))) {
				ps[j] = ps[j - gap];
				j -= gap;
			}
			ps[j] = t;
		}
	/* p need not be normalised: the target scales with the total, which keeps all-equal
	 * weights exact (sixths of 1 summed in double are not) */
	double cum = 0.0, total = 0.0;
	for (int32_t i = 0; i < V; i++)
		total += p[i];
	int32_t n = 0;
	memset(in, 0, (size_t)V);
	for (int32_t i = 0; i < V && cum < top_p * total; i++) {
		cum += ps[i].p;
		in[ps[i].id] = 1;
		n++;
	}
	free(ps);
	return n;
}

static int init(struct fp4s_sampler *s, const struct fp4s_sampling *p, int32_t V)
{
	struct fp4s_error err = {0};
	int rc = fp4s_samp_init(s, p, V, NULL, 0, NULL, 0, &err);
	if (rc)
		fprintf(stderr, "init: %s\n", err.msg);
	return rc;
}

static const float L10[10] = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f, 2.5f, -0.5f, 1.2f, 0.8f};

/* (1) same seed, same sequence; different seeds, different sequences */
static void test_reproducible(void)
{
	struct fp4s_sampling p;
	fp4s_samp_defaults(&p);
	p.has_seed = true;
	int32_t seq[3][200];
	uint64_t seeds[3] = {42, 42, 43};
	for (int k = 0; k < 3; k++) {
		struct fp4s_sampler s;
		p.seed = seeds[k];
		CHECK(init(&s, &p, 10) == 0);
		for (int i = 0; i < 200; i++) {
			float buf[10];
			struct fp4s_samp_result r;
			memcpy(buf, L10, sizeof buf);
			CHECK(fp4s_samp_sample(&s, buf, 10, &r, NULL) == 0);
			seq[k][i] = r.token;
			fp4s_samp_accept(&s, r.token);
		}
		fp4s_samp_free(&s);
	}
	CHECK(memcmp(seq[0], seq[1], sizeof seq[0]) == 0);
	int differ = 0;
	for (int i = 0; i < 200; i++)
		differ += seq[0][i] != seq[2][i];
	/* Two independent streams over a 10-token distribution agree at a position with
	 * probability sum p_i^2 < 0.3; 200 positions all agreeing is impossible in practice. */
	CHECK_MSG(differ > 50, "seeds 42 and 43 differ at only %d of 200 positions", differ);

	/* Unseeded samplers draw from different streams. */
	p.has_seed = false;
	int32_t a[64], b[64];
	struct fp4s_sampler s1, s2;
	CHECK(init(&s1, &p, 10) == 0);
	CHECK(init(&s2, &p, 10) == 0);
	for (int i = 0; i < 64; i++) {
		float buf[10];
		struct fp4s_samp_result r;
		memcpy(buf, L10, sizeof buf);
		fp4s_samp_sample(&s1, buf, 10, &r, NULL);
		a[i] = r.token;
		memcpy(buf, L10, sizeof buf);
		fp4s_samp_sample(&s2, buf, 10, &r, NULL);
		b[i] = r.token;
	}
	CHECK(memcmp(a, b, sizeof a) != 0);
	fp4s_samp_free(&s1);
	fp4s_samp_free(&s2);
}

/* (2) temperature 0.7 over 10 tokens, 200k draws, chi-square */
static void test_temperature_distribution(void)
{
	struct fp4s_sampling p;
	fp4s_samp_defaults(&p);
	p.temperature = 0.7f;
	p.has_seed = true;
	p.seed = 7;
	struct fp4s_sampler s;
	CHECK(init(&s, &p, 10) == 0);
	long counts[10];
	double e[10];
	const long N = 200000;
	CHECK(draw(&s, L10, 10, N, counts) == 0);
	softmax_d(L10, 10, 0.7, e);
	int dof;
	double x = chi2(counts, e, 10, N, &dof);
	CHECK_EQ_INT(dof, 9);
	CHECK_MSG(x < chi2_crit(dof), "T=0.7: chi2 = %.2f >= %.2f (dof %d)", x, chi2_crit(dof), dof);
	/* The same counts against the T = 1 distribution must fail: the test has power. */
	double e1[10];
	softmax_d(L10, 10, 1.0, e1);
	double x1 = chi2(counts, e1, 10, N, &dof);
	CHECK_MSG(x1 > 1000.0, "T=0.7 samples look like T=1 (chi2 %.1f)", x1);
	fp4s_samp_free(&s);
}

/* (3) top_k = 3: only the top 3, in renormalised proportions */
static void test_top_k(void)
{
	struct fp4s_sampling p;
	fp4s_samp_defaults(&p);
	p.top_k = 3;
	p.has_seed = true;
	p.seed = 11;
	struct fp4s_sampler s;
	CHECK(init(&s, &p, 10) == 0);
	long counts[10];
	double e[10];
	const long N = 200000;
	CHECK(draw(&s, L10, 10, N, counts) == 0);
	/* top 3 of L10: ids 6 (2.5), 1 (2.0), 4 (1.5) */
	float masked[10];
	for (int i = 0; i < 10; i++)
		masked[i] = (i == 6 || i == 1 || i == 4) ? L10[i] : -INFINITY;
	softmax_d(masked, 10, 1.0, e);
	long outside = 0;
	for (int i = 0; i < 10; i++)
		if (e[i] == 0.0)
			outside += counts[i];
	CHECK_EQ_INT(outside, 0);
	int dof;
	double x = chi2(counts, e, 10, N, &dof);
	CHECK_EQ_INT(dof, 2);
	CHECK_MSG(x < chi2_crit(dof), "top_k=3: chi2 = %.2f (dof %d)", x, dof);
	fp4s_samp_free(&s);

	/* Large vocabulary, large k (quickselect path) and small k (heap path): never outside. */
	const int32_t V = 50000;
	float *l = malloc((size_t)V * sizeof *l), *buf = malloc((size_t)V * sizeof *buf);
	for (int32_t i = 0; i < V; i++)
		l[i] = (float)t_rand_normal() * 3.0f;
	int32_t ks[2] = {40, 1000};
	for (int kk = 0; kk < 2; kk++) {
		int32_t k = ks[kk];
		/* the k-th largest value, by sorting a copy */
		memcpy(buf, l, (size_t)V * sizeof *buf);
		for (int32_t i = 0; i < k; i++) { /* partial selection sort: k is small enough */
			int32_t b = i;
			for (int32_t j = i + 1; j < V; j++)
				if (buf[j] > buf[b])
					b = j;
			float t = buf[i]; buf[i] = buf[b]; buf[b] = t;
		}
		float vk = buf[k - 1];
		p.top_k = k;
		p.temperature = 3.0f; /* flat enough that low-ranked survivors get drawn */
		CHECK(init(&s, &p, V) == 0);
		int bad = 0;
		for (int it = 0; it < 1000; it++) {
			struct fp4s_samp_result r;
			memcpy(buf, l, (size_t)V * sizeof *buf);
			CHECK(fp4s_samp_sample(&s, buf, V, &r, NULL) == 0);
			bad += !(l[r.token] >= vk);
		}
		CHECK_MSG(bad == 0, "top_k=%d: %d draws outside the top k", (int)k, bad);
		fp4s_samp_free(&s);
	}
	free(l);
	free(buf);
}

/* (4) top_p = 0.8 keeps exactly the smallest prefix reaching 0.8 */
static void test_top_p(void)
{
	/* probabilities 0.4, 0.3, 0.15, 0.1, 0.05 (shuffled ids): the prefix 0.4+0.3 = 0.7 < 0.8,
	 * adding 0.15 reaches 0.85, so exactly ids of 0.4, 0.3, 0.15 survive. */
	const double pr[5] = {0.1, 0.4, 0.05, 0.15, 0.3};
	float l[5];
	for (int i = 0; i < 5; i++)
		l[i] = (float)log(pr[i]);
	struct fp4s_sampling p;
	fp4s_samp_defaults(&p);
	p.top_p = 0.8f;
	p.has_seed = true;
	p.seed = 5;
	struct fp4s_sampler s;
	CHECK(init(&s, &p, 5) == 0);
	long counts[5];
	const long N = 200000;
	CHECK(draw(&s, l, 5, N, counts) == 0);
	CHECK_EQ_INT(counts[0], 0);
	CHECK_EQ_INT(counts[2], 0);
	double e[5] = {0, 0.4 / 0.85, 0, 0.15 / 0.85, 0.3 / 0.85};
	int dof;
	double x = chi2(counts, e, 5, N, &dof);
	CHECK_EQ_INT(dof, 2);
	CHECK_MSG(x < chi2_crit(dof), "top_p=0.8: chi2 = %.2f", x);
	fp4s_samp_free(&s);

	/* Ties at the boundary: four tokens of 0.25 each, top_p = 0.5 keeps the two lowest ids
	 * (0.25 above the second is < 0.5; 0.5 above the third is not). */
	float tie[4] = {0.0f, 0.0f, 0.0f, 0.0f};
	p.top_p = 0.5f;
	CHECK(init(&s, &p, 4) == 0);
	long c4[4];
	CHECK(draw(&s, tie, 4, 20000, c4) == 0);
	CHECK(c4[0] > 0 && c4[1] > 0);
	CHECK_EQ_INT(c4[2] + c4[3], 0);
	fp4s_samp_free(&s);

	/* Large vocabulary without top_k (the adaptive-threshold path), compared with a full sort:
	 * every draw lies in the exact nucleus. */
	const int32_t V = 100000;
	float *lv = malloc((size_t)V * sizeof *lv), *buf = malloc((size_t)V * sizeof *buf);
	double *pv = malloc((size_t)V * sizeof *pv);
	for (int32_t i = 0; i < V; i++)
		lv[i] = (float)t_rand_normal() * 2.0f;
	softmax_d(lv, V, 1.0, pv);
	char *in = calloc((size_t)V, 1);
	int32_t nucleus = exact_nucleus(pv, V, 0.9, in);
	p.top_p = 0.9f;
	CHECK(init(&s, &p, V) == 0);
	int bad = 0;
	for (int it = 0; it < 1000; it++) {
		struct fp4s_samp_result r;
		memcpy(buf, lv, (size_t)V * sizeof *buf);
		CHECK(fp4s_samp_sample(&s, buf, V, &r, NULL) == 0);
		bad += !in[r.token];
	}
	CHECK_MSG(bad == 0, "top_p=0.9 over %d tokens: %d draws outside the nucleus of %d", (int)V,
	          bad, (int)nucleus);
	fp4s_samp_free(&s);
	free(in);
	free(pv);
	free(lv);
	free(buf);
}

/* (5) min_p: tokens below min_p * p_max never appear; the rest in proportion */
static void test_min_p(void)
{
	/* p = 0.5, 0.25, 0.15, 0.06, 0.04; min_p = 0.2 -> threshold 0.1: keep the first three */
	const double pr[5] = {0.15, 0.04, 0.5, 0.06, 0.25};
	float l[5];
	for (int i = 0; i < 5; i++)
		l[i] = (float)log(pr[i]);
	struct fp4s_sampling p;
	fp4s_samp_defaults(&p);
	p.min_p = 0.2f;
	p.has_seed = true;
	p.seed = 99;
	struct fp4s_sampler s;
	CHECK(init(&s, &p, 5) == 0);
	long counts[5];
	const long N = 200000;
	CHECK(draw(&s, l, 5, N, counts) == 0);
	CHECK_EQ_INT(counts[1] + counts[3], 0);
	double e[5] = {0.15 / 0.9, 0, 0.5 / 0.9, 0, 0.25 / 0.9};
	int dof;
	double x = chi2(counts, e, 5, N, &dof);
	CHECK_MSG(x < chi2_crit(dof), "min_p=0.2: chi2 = %.2f", x);
	fp4s_samp_free(&s);
}

/* (6) greedy = argmax, ties to the lowest id, no randomness consumed */
static void test_greedy(void)
{
	struct fp4s_sampling p;
	fp4s_samp_defaults(&p);
	p.temperature = 0.0f;
	struct fp4s_sampler s;
	CHECK(init(&s, &p, 6) == 0);
	float l[6] = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f, 3.0f};
	struct fp4s_samp_result r;
	CHECK(fp4s_samp_sample(&s, l, 6, &r, NULL) == 0);
	CHECK_EQ_INT(r.token, 1);
	float l2[6] = {-INFINITY, -INFINITY, -5.0f, -INFINITY, -6.0f, -INFINITY};
	CHECK(fp4s_samp_sample(&s, l2, 6, &r, NULL) == 0);
	CHECK_EQ_INT(r.token, 2);
	/* all masked: an error, not a token */
	float l3[6] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
	struct fp4s_error err = {0};
	CHECK(fp4s_samp_sample(&s, l3, 6, &r, &err) == FP4S_EINVAL);
	fp4s_samp_free(&s);
	/* temperature below 1e-5 is greedy too */
	p.temperature = 1e-6f;
	CHECK(init(&s, &p, 6) == 0);
	float l4[6] = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f, 3.0f};
	CHECK(fp4s_samp_sample(&s, l4, 6, &r, NULL) == 0);
	CHECK_EQ_INT(r.token, 1);
	fp4s_samp_free(&s);
}

/* (7) penalties transform logits exactly as the formulas say */
static void test_penalties(void)
{
	struct fp4s_sampling p;
	fp4s_samp_defaults(&p);
	p.repetition_penalty = 1.3f;
	p.frequency_penalty = 0.5f;
	p.presence_penalty = 0.25f;
	const int32_t prompt[4] = {0, 1, 1, 7};
	struct fp4s_sampler s;
	struct fp4s_error err = {0};
	CHECK(fp4s_samp_init(&s, &p, 10, prompt, 4, NULL, 0, &err) == 0);
	/* output: 2 twice, 1 once, 5 three times */
	const int32_t outp[6] = {2, 5, 2, 1, 5, 5};
	for (int i = 0; i < 6; i++)
		CHECK(fp4s_samp_accept(&s, outp[i]) == 0);
	float l[10] = {2.0f, -1.0f, 3.0f, 4.0f, 0.0f, -2.0f, 1.0f, 0.5f, 9.0f, -3.0f};
	float e[10];
	memcpy(e, l, sizeof e);
	const float rep = 1.3f;
	int out_count[10] = {0, 1, 2, 0, 0, 3, 0, 0, 0, 0};
	int seen[10] = {1, 1, 1, 0, 0, 1, 0, 1, 0, 0}; /* prompt or output */
	for (int i = 0; i < 10; i++) {
		float v = e[i];
		if (seen[i])
			v = v > 0.0f ? v / rep : v * rep;
		if (out_count[i] > 0) {
			v -= 0.5f * (float)out_count[i];
			v -= 0.25f;
		}
		e[i] = v;
	}
	fp4s_samp_process_logits(&s, l, 10);
	for (int i = 0; i < 10; i++)
		CHECK_MSG(l[i] == e[i], "token %d: %.9g, expected %.9g", i, (double)l[i], (double)e[i]);
	/* spot values written out: token 2: 3/1.3 - 2*0.5 - 0.25; token 5: -2*1.3 - 1.5 - 0.25 */
	CHECK_NEAR(l[2], 3.0 / 1.3 - 1.25, 1e-6);
	CHECK_NEAR(l[5], -2.6 - 1.75, 1e-6);
	CHECK_NEAR(l[7], 0.5 / 1.3, 1e-6); /* prompt only: repetition, no presence/frequency */
	CHECK_NEAR(l[3], 4.0, 0.0);
	fp4s_samp_free(&s);

	/* presence/frequency alone do not look at the prompt */
	fp4s_samp_defaults(&p);
	p.presence_penalty = 1.0f;
	CHECK(fp4s_samp_init(&s, &p, 10, prompt, 4, NULL, 0, &err) == 0);
	CHECK(fp4s_samp_accept(&s, 3) == 0);
	float l2[10] = {0};
	fp4s_samp_process_logits(&s, l2, 10);
	for (int i = 0; i < 10; i++)
		CHECK_NEAR(l2[i], i == 3 ? -1.0 : 0.0, 0.0);
	fp4s_samp_free(&s);

	/* Penalties steer greedy decoding: with a strong frequency penalty the argmax moves off a
	 * repeated token. */
	fp4s_samp_defaults(&p);
	p.temperature = 0.0f;
	p.frequency_penalty = 2.0f;
	CHECK(fp4s_samp_init(&s, &p, 3, NULL, 0, NULL, 0, &err) == 0);
	float g[3] = {1.0f, 0.0f, -5.0f};
	struct fp4s_samp_result r;
	CHECK(fp4s_samp_sample(&s, g, 3, &r, NULL) == 0);
	CHECK_EQ_INT(r.token, 0);
	fp4s_samp_accept(&s, 0);
	float g2[3] = {1.0f, 0.0f, -5.0f};
	CHECK(fp4s_samp_sample(&s, g2, 3, &r, NULL) == 0);
	CHECK_EQ_INT(r.token, 1);
	fp4s_samp_free(&s);
}

/* (8) logit_bias -100 bans, +100 forces */
static void test_logit_bias(void)
{
	struct fp4s_sampling p;
	fp4s_samp_defaults(&p);
	p.has_seed = true;
	p.seed = 3;
	p.n_logit_bias = 1;
	p.logit_bias[0] = (struct fp4s_samp_bias){.token = 6, .bias = -100.0f};
	struct fp4s_sampler s;
	CHECK(init(&s, &p, 10) == 0);
	long counts[10];
	CHECK(draw(&s, L10, 10, 50000, counts) == 0);
	CHECK_EQ_INT(counts[6], 0); /* the most likely token, e^-100 relative: never */
	CHECK(counts[1] > 0);
	fp4s_samp_free(&s);

	p.logit_bias[0] = (struct fp4s_samp_bias){.token = 3, .bias = 100.0f};
	CHECK(init(&s, &p, 10) == 0);
	CHECK(draw(&s, L10, 10, 50000, counts) == 0);
	CHECK_EQ_INT(counts[3], 50000); /* the least likely token, now e^96 ahead */
	fp4s_samp_free(&s);
}

/* (9) min_tokens masks EOS and stop ids until reached; ignore_eos; is_stop */
static void test_min_tokens(void)
{
	struct fp4s_sampling p;
	fp4s_samp_defaults(&p);
	p.temperature = 0.0f;
	p.min_tokens = 3;
	p.n_stop_ids = 1;
	p.stop_ids[0] = 4;
	const int32_t eos[2] = {0, 9};
	struct fp4s_sampler s;
	struct fp4s_error err = {0};
	CHECK(fp4s_samp_init(&s, &p, 10, NULL, 0, eos, 2, &err) == 0);
	float l[10] = {5, 1, 1, 1, 4.5f, 1, 1, 1, 1, 6};
	for (int step = 0; step < 4; step++) {
		float buf[10];
		struct fp4s_samp_result r;
		memcpy(buf, l, sizeof buf);
		CHECK(fp4s_samp_sample(&s, buf, 10, &r, NULL) == 0);
		if (step < 3) {
			CHECK_MSG(r.token == 1, "step %d: token %d while min_tokens masks 9, 0, 4", step,
			          (int)r.token);
			CHECK(!fp4s_samp_is_stop(&s, r.token));
		} else {
			CHECK_EQ_INT(r.token, 9);
			CHECK(fp4s_samp_is_stop(&s, r.token));
		}
		fp4s_samp_accept(&s, r.token);
	}
	CHECK(fp4s_samp_is_stop(&s, 0));
	CHECK(fp4s_samp_is_stop(&s, 4));
	CHECK(!fp4s_samp_is_stop(&s, 5));
	fp4s_samp_free(&s);

	/* ignore_eos: EOS is neither a stop nor masked; stop ids still stop and are still masked */
	p.ignore_eos = true;
	CHECK(fp4s_samp_init(&s, &p, 10, NULL, 0, eos, 2, &err) == 0);
	CHECK(!fp4s_samp_is_stop(&s, 9));
	CHECK(fp4s_samp_is_stop(&s, 4));
	float buf[10];
	memcpy(buf, l, sizeof buf);
	fp4s_samp_process_logits(&s, buf, 10);
	CHECK(buf[9] == 6.0f && buf[0] == 5.0f && buf[4] == -INFINITY);
	fp4s_samp_free(&s);
}

/* (10) logprobs against a double-precision log-softmax */
static void test_logprobs(void)
{
	const int32_t V = 1000;
	float *l = malloc((size_t)V * sizeof *l), *buf = malloc((size_t)V * sizeof *buf);
	double *lp = malloc((size_t)V * sizeof *lp);
	for (int32_t i = 0; i < V; i++)
		l[i] = (float)t_rand_normal() * 4.0f;
	float lmax = -INFINITY;
	for (int32_t i = 0; i < V; i++)
		lmax = l[i] > lmax ? l[i] : lmax;
	l[17] = l[18] = lmax + 2.0f; /* a tie at the top: lower id first */
	l[3] = lmax;                 /* + bias 7 below: leads the processed distribution */

	struct fp4s_sampling p;
	fp4s_samp_defaults(&p);
	p.logprobs = true;
	p.top_logprobs = 5;
	p.temperature = 0.8f;
	p.top_k = 50;
	p.has_seed = true;
	p.seed = 1234;
	p.n_logit_bias = 1;
	p.logit_bias[0] = (struct fp4s_samp_bias){.token = 3, .bias = 7.0f};
	struct fp4s_sampler s;
	CHECK(init(&s, &p, V) == 0);

	/* RAW: the unmodified logits at T = 1, whatever the bias, temperature and top_k. */
	double m = -INFINITY, z = 0.0;
	for (int32_t i = 0; i < V; i++)
		m = l[i] > m ? l[i] : m;
	for (int32_t i = 0; i < V; i++)
		z += exp((double)l[i] - m);
	for (int32_t i = 0; i < V; i++)
		lp[i] = (double)l[i] - m - log(z);
	for (int it = 0; it < 20; it++) {
		struct fp4s_samp_result r;
		memcpy(buf, l, (size_t)V * sizeof *buf);
		CHECK(fp4s_samp_sample(&s, buf, V, &r, NULL) == 0);
		CHECK_NEAR(r.logprob, lp[r.token], 1e-5);
		int32_t rank = 1;
		for (int32_t i = 0; i < V; i++)
			rank += l[i] > l[r.token];
		CHECK_EQ_INT(r.rank, rank);
		CHECK_EQ_INT(r.n_top, 5);
		CHECK_EQ_INT(r.top[0].token, 17);
		CHECK_EQ_INT(r.top[1].token, 18);
		for (int j = 0; j < r.n_top; j++) {
			CHECK_NEAR(r.top[j].logprob, lp[r.top[j].token], 1e-5);
			if (j > 0)
				CHECK(r.top[j].logprob <= r.top[j - 1].logprob);
		}
		/* no token outside the list beats its last entry */
		int beats = 0;
		for (int32_t i = 0; i < V; i++) {
			int listed = 0;
			for (int j = 0; j < r.n_top; j++)
				listed |= r.top[j].token == i;
			beats += !listed && lp[i] > r.top[r.n_top - 1].logprob + 1e-6;
		}
		CHECK_EQ_INT(beats, 0);
	}
	fp4s_samp_free(&s);

	/* PROCESSED: the distribution actually sampled: bias, T = 0.8, top_k = 50, renormalised. */
	p.logprobs_mode = FP4S_SAMP_LOGPROBS_PROCESSED;
	CHECK(init(&s, &p, V) == 0);
	float *q = malloc((size_t)V * sizeof *q);
	memcpy(q, l, (size_t)V * sizeof *q);
	q[3] += 7.0f;
	for (int32_t i = 0; i < V; i++)
		q[i] /= 0.8f;
	memcpy(buf, q, (size_t)V * sizeof *buf);
	/* threshold: 50th largest of q */
	for (int32_t i = 0; i < 50; i++) {
		int32_t b = i;
		for (int32_t j = i + 1; j < V; j++)
			if (buf[j] > buf[b])
				b = j;
		float t = buf[i]; buf[i] = buf[b]; buf[b] = t;
	}
	float q50 = buf[49];
	m = -INFINITY;
	z = 0.0;
	for (int32_t i = 0; i < V; i++)
		if (q[i] >= q50 && q[i] > m)
			m = q[i];
	for (int32_t i = 0; i < V; i++)
		if (q[i] >= q50)
			z += exp((double)q[i] - m);
	for (int it = 0; it < 20; it++) {
		struct fp4s_samp_result r;
		memcpy(buf, l, (size_t)V * sizeof *buf);
		CHECK(fp4s_samp_sample(&s, buf, V, &r, NULL) == 0);
		CHECK(q[r.token] >= q50);
		CHECK_NEAR(r.logprob, (double)q[r.token] - m - log(z), 1e-5);
		CHECK_EQ_INT(r.n_top, 5);
		CHECK_EQ_INT(r.top[0].token, 3); /* the biased token leads */
		for (int j = 0; j < r.n_top; j++)
			CHECK_NEAR(r.top[j].logprob, (double)q[r.top[j].token] - m - log(z), 1e-5);
	}
	fp4s_samp_free(&s);

	/* Greedy with RAW logprobs, logprobs without top-n */
	fp4s_samp_defaults(&p);
	p.temperature = 0.0f;
	p.logprobs = true;
	CHECK(init(&s, &p, V) == 0);
	struct fp4s_samp_result r;
	memcpy(buf, l, (size_t)V * sizeof *buf);
	CHECK(fp4s_samp_sample(&s, buf, V, &r, NULL) == 0);
	CHECK_EQ_INT(r.token, 17);
	CHECK_EQ_INT(r.n_top, 0);
	CHECK_NEAR(r.logprob, lp[17], 1e-5);
	fp4s_samp_free(&s);
	free(q);
	free(lp);
	free(l);
	free(buf);
}

/* (11) validation errors name the field */
static void test_validation(void)
{
	int n = 0;
#define CASE(name, stmt)                                                                 \
	do {                                                                             \
		struct fp4s_sampling p;                                                  \
		struct fp4s_error err = {0};                                             \
		fp4s_samp_defaults(&p);                                                  \
		stmt;                                                                    \
		int rc = fp4s_samp_validate(&p, 1000, &err);                             \
		CHECK_MSG(rc == FP4S_EINVAL, "%s: rc %d", #stmt, rc);                    \
		CHECK_MSG(strstr(err.msg, name) != NULL, "%s: message \"%s\" lacks %s", #stmt, \
		          err.msg, name);                                                \
		n++;                                                                     \
	} while (0)
	CASE("temperature", p.temperature = -0.1f);
	CASE("temperature", p.temperature = 101.0f);
	CASE("temperature", p.temperature = NAN);
	CASE("top_p", p.top_p = 0.0f);
	CASE("top_p", p.top_p = 1.01f);
	CASE("top_k", p.top_k = -2);
	CASE("min_p", p.min_p = 1.5f);
	CASE("presence_penalty", p.presence_penalty = 2.5f);
	CASE("frequency_penalty", p.frequency_penalty = -2.01f);
	CASE("repetition_penalty", p.repetition_penalty = 0.0f);
	CASE("top_logprobs", (p.logprobs = true, p.top_logprobs = 21));
	CASE("top_logprobs", p.top_logprobs = 3);
	CASE("min_tokens", p.min_tokens = -1);
	CASE("max_tokens", p.max_tokens = -5);
	CASE("min_tokens", (p.min_tokens = 10, p.max_tokens = 5));
	CASE("logit_bias", (p.n_logit_bias = 1, p.logit_bias[0] = (struct fp4s_samp_bias){5, 101.0f}));
	CASE("logit_bias", (p.n_logit_bias = 1, p.logit_bias[0] = (struct fp4s_samp_bias){1000, 1.0f}));
	CASE("logit_bias", p.n_logit_bias = FP4S_SAMP_MAX_LOGIT_BIAS + 1);
	CASE("stop_token_ids", (p.n_stop_ids = 1, p.stop_ids[0] = -3));
#undef CASE
	CHECK_EQ_INT(n, 19);
	/* the defaults and the edges of each range are valid */
	struct fp4s_sampling p;
	fp4s_samp_defaults(&p);
	CHECK(fp4s_samp_validate(&p, 1000, NULL) == 0);
	p.temperature = 0.0f;
	p.top_p = 1.0f;
	p.top_k = -1;
	p.min_p = 1.0f;
	p.presence_penalty = -2.0f;
	p.frequency_penalty = 2.0f;
	p.logprobs = true;
	p.top_logprobs = 20;
	CHECK(fp4s_samp_validate(&p, 1000, NULL) == 0);
}

/* top_k + top_p + min_p together on a small vocabulary: exact support and proportions */
static void test_combined(void)
{
	/* p: 0.3, 0.25, 0.2, 0.1, 0.08, 0.07; min_p 0.3 -> drop p < 0.09 (ids 4, 5); top_k 4 keeps
	 * ids 0..3 (mass 0.85); renormalised 0.353, 0.294, 0.235, 0.118; top_p 0.6: 0.353 < 0.6,
	 * 0.647 >= 0.6 -> keep ids 0, 1. */
	const double pr[6] = {0.3, 0.25, 0.2, 0.1, 0.08, 0.07};
	float l[6];
	for (int i = 0; i < 6; i++)
		l[i] = (float)log(pr[i]);
	struct fp4s_sampling p;
	fp4s_samp_defaults(&p);
	p.min_p = 0.3f;
	p.top_k = 4;
	p.top_p = 0.6f;
	p.has_seed = true;
	p.seed = 2024;
	struct fp4s_sampler s;
	CHECK(init(&s, &p, 6) == 0);
	long counts[6];
	const long N = 100000;
	CHECK(draw(&s, l, 6, N, counts) == 0);
	CHECK_EQ_INT(counts[2] + counts[3] + counts[4] + counts[5], 0);
	double e[6] = {0.3 / 0.55, 0.25 / 0.55, 0, 0, 0, 0};
	int dof;
	double x = chi2(counts, e, 6, N, &dof);
	CHECK_MSG(x < chi2_crit(dof), "combined: chi2 = %.2f (dof %d)", x, dof);
	fp4s_samp_free(&s);
}

/* top_k keeps every token tied with the k-th largest (vLLM masks logits < kth only) */
static void test_top_k_ties(void)
{
	const float l[6] = {3.0f, 2.0f, 2.0f, 2.0f, 1.0f, 0.0f};
	struct fp4s_sampling p;
	fp4s_samp_defaults(&p);
	p.top_k = 2;
	p.has_seed = true;
	p.seed = 77;
	struct fp4s_sampler s;
	CHECK(init(&s, &p, 6) == 0);
	long counts[6];
	const long N = 100000;
	CHECK(draw(&s, l, 6, N, counts) == 0);
	CHECK_EQ_INT(counts[4] + counts[5], 0);
	float masked[6] = {3.0f, 2.0f, 2.0f, 2.0f, -INFINITY, -INFINITY};
	double e[6];
	softmax_d(masked, 6, 1.0, e);
	int dof;
	double x = chi2(counts, e, 6, N, &dof);
	CHECK_EQ_INT(dof, 3);
	CHECK_MSG(x < chi2_crit(dof), "top_k ties: chi2 = %.2f", x);
	fp4s_samp_free(&s);
}

/* top_p over many repeated values: the kept set is exactly the (p desc, id asc) prefix, which
 * exercises the tie handling of the weighted selection; all-equal logits keep the lowest ids. */
static void test_top_p_ties(void)
{
	const int32_t V = 6000;
	float *l = malloc((size_t)V * sizeof *l), *buf = malloc((size_t)V * sizeof *buf);
	double *pv = malloc((size_t)V * sizeof *pv);
	char *in = malloc((size_t)V);
	struct fp4s_sampling p;
	fp4s_samp_defaults(&p);
	p.has_seed = true;
	p.seed = 31337;
	struct fp4s_sampler s;
	for (int round = 0; round < 2; round++) {
		for (int32_t i = 0; i < V; i++)
			l[i] = round == 0 ? (float)(t_rand_u64() % 4) : 0.0f;
		for (int32_t i = 0; i < V; i++)
			pv[i] = exp((double)l[i]); /* unnormalised; exact ones in the all-equal round */
		p.top_p = round == 0 ? 0.7f : 0.5f;
		int32_t n = exact_nucleus(pv, V, p.top_p, in);
		if (round == 1)
			CHECK_EQ_INT(n, V / 2);
		CHECK(init(&s, &p, V) == 0);
		int bad = 0, hi = -1;
		for (int it = 0; it < 5000; it++) {
			struct fp4s_samp_result r;
			memcpy(buf, l, (size_t)V * sizeof *buf);
			CHECK(fp4s_samp_sample(&s, buf, V, &r, NULL) == 0);
			bad += !in[r.token];
			hi = r.token > hi ? r.token : hi;
		}
		CHECK_MSG(bad == 0, "round %d: %d draws outside the nucleus of %d", round, bad, (int)n);
		if (round == 1) /* P(no draw among ids 2900..2999) = 0.95^5000: never */
			CHECK_MSG(hi >= 2900, "all-equal top_p: highest id drawn %d", hi);
		fp4s_samp_free(&s);
	}
	free(in);
	free(pv);
	free(buf);
	free(l);
}

/* PROCESSED logprobs with top_p: log of the renormalised nucleus probability */
static void test_processed_top_p(void)
{
	const double pr[5] = {0.1, 0.4, 0.05, 0.15, 0.3};
	float l[5];
	for (int i = 0; i < 5; i++)
		l[i] = (float)log(pr[i]);
	struct fp4s_sampling p;
	fp4s_samp_defaults(&p);
	p.top_p = 0.8f;
	p.logprobs = true;
	p.top_logprobs = 4;
	p.logprobs_mode = FP4S_SAMP_LOGPROBS_PROCESSED;
	p.has_seed = true;
	p.seed = 8;
	struct fp4s_sampler s;
	CHECK(init(&s, &p, 5) == 0);
	for (int it = 0; it < 50; it++) {
		float buf[5];
		struct fp4s_samp_result r;
		memcpy(buf, l, sizeof buf);
		CHECK(fp4s_samp_sample(&s, buf, 5, &r, NULL) == 0);
		CHECK(r.token == 1 || r.token == 3 || r.token == 4);
		CHECK_NEAR(r.logprob, log(pr[r.token] / 0.85), 1e-5);
		CHECK_EQ_INT(r.rank, r.token == 1 ? 1 : r.token == 4 ? 2 : 3);
		CHECK_EQ_INT(r.n_top, 3); /* only the nucleus has finite processed logprobs */
		CHECK_EQ_INT(r.top[0].token, 1);
		CHECK_EQ_INT(r.top[1].token, 4);
		CHECK_EQ_INT(r.top[2].token, 3);
		CHECK_NEAR(r.top[2].logprob, log(0.15 / 0.85), 1e-5);
	}
	fp4s_samp_free(&s);
}

/* bad calls come back as errors */
static void test_bad_calls(void)
{
	struct fp4s_sampling p;
	fp4s_samp_defaults(&p);
	struct fp4s_sampler s;
	struct fp4s_error err = {0};
	const int32_t eos_bad[1] = {10};
	CHECK(fp4s_samp_init(&s, &p, 10, NULL, 0, eos_bad, 1, &err) == FP4S_EINVAL);
	CHECK(strstr(err.msg, "EOS") != NULL);
	fp4s_samp_free(&s);
	p.repetition_penalty = 1.2f;
	const int32_t prompt_bad[2] = {1, 12};
	CHECK(fp4s_samp_init(&s, &p, 10, prompt_bad, 2, NULL, 0, &err) == FP4S_EINVAL);
	fp4s_samp_free(&s);
	CHECK(fp4s_samp_init(&s, &p, 10, NULL, 0, NULL, 0, &err) == 0);
	CHECK(fp4s_samp_accept(&s, 10) == FP4S_EINVAL);
	CHECK(fp4s_samp_accept(&s, -1) == FP4S_EINVAL);
	float l[10] = {0};
	struct fp4s_samp_result r;
	CHECK(fp4s_samp_sample(&s, l, 9, &r, &err) == FP4S_EINVAL);
	/* the counts map grows past its first size without losing counts */
	for (int i = 0; i < 2000; i++)
		CHECK(fp4s_samp_accept(&s, i % 10) == 0);
	CHECK_EQ_INT(s.n_generated, 2000);
	fp4s_samp_free(&s);
	/* a vocabulary larger than the initial map: 3000 distinct tokens, each seen once */
	fp4s_samp_defaults(&p);
	p.frequency_penalty = 1.0f;
	CHECK(fp4s_samp_init(&s, &p, 5000, NULL, 0, NULL, 0, &err) == 0);
	for (int32_t i = 0; i < 3000; i++)
		fp4s_samp_accept(&s, i);
	fp4s_samp_accept(&s, 7);
	float *big = calloc(5000, sizeof *big);
	fp4s_samp_process_logits(&s, big, 5000);
	int wrong = 0;
	for (int32_t i = 0; i < 5000; i++)
		wrong += big[i] != (i == 7 ? -2.0f : i < 3000 ? -1.0f : 0.0f);
	CHECK_EQ_INT(wrong, 0);
	free(big);
	fp4s_samp_free(&s);
}

int main(void)
{
	t_seed_from_env();
	test_reproducible();
	test_temperature_distribution();
	test_top_k();
	test_top_p();
	test_min_p();
	test_greedy();
	test_penalties();
	test_logit_bias();
	test_min_tokens();
	test_logprobs();
	test_validation();
	test_combined();
	test_top_k_ties();
	test_top_p_ties();
	test_processed_top_p();
	test_bad_calls();
	return TEST_DONE();
}
