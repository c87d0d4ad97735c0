/* test_samp_plan.c: what a GPU's sampler shares with the CPU sampler (sampler.h's fp4s_samp_plan
 * and samp_math.h), checked where no GPU is: the shared exp, the fixed point and the draw point;
 * the plan's edits against fp4s_samp_process_logits, bit for bit; the plan's random number. The
 * device side (sample.cu) is tests/ops/test_sample.cu. */
#include "engine/samp_math.h"
#include "engine/sampler.h"
#include "test_util.h"

#include <float.h>
#include <stdint.h>

/* samp_math.h's exp, shared with the GPU sampler: within 3 ulp of e^x over [-87, 0], exactly
 * 1 at 0, 0 (never subnormal) below, NaN kept; its fixed point and draw point. */
static void test_samp_math(void)
{
	double worst = 0.0;
	int subnormal = 0, n = 0;
	for (float x = -90.0f; x < 0.0f; x += 1.37e-3f + (float)(t_rand_uniform() * 1e-4)) {
		const float e = fp4s_samp_exp(x);
		const double t = exp((double)x);
		subnormal += e != 0.0f && e < FLT_MIN;
		if (t > 1e-37) {
			const double r = fabs((double)e - t) / t;
			worst = r > worst ? r : worst;
		}
		n++;
	}
	CHECK_MSG(worst < 3.0 * 5.97e-8, "exp: worst relative error %.3g over %d points", worst, n);
	CHECK_EQ_INT(subnormal, 0);
	CHECK(fp4s_samp_exp(0.0f) == 1.0f && fp4s_samp_exp(-0.0f) == 1.0f && fp4s_samp_exp(-1e-30f) == 1.0f);
	CHECK(fp4s_samp_exp(-88.0f) == 0.0f && fp4s_samp_exp(-INFINITY) == 0.0f);
	CHECK(isnan(fp4s_samp_exp(NAN)));
	CHECK(fp4s_samp_fix(1.0f) == 1ull << 44 && fp4s_samp_fix(0.5f) == 1ull << 43 && fp4s_samp_fix(0x1p-45f) == 0);
	CHECK(fp4s_samp_point(0.0, 10) == 0 && fp4s_samp_point(0.999999, 10) == 9 &&
	      fp4s_samp_point(0.9999999999999999, (1ull << 62) + 1) < (1ull << 62) + 1);
}

/* fp4s_samp_plan: the edits, applied one a token as a GPU does (sample.cu's step 1, each
 * operation rounded once), give fp4s_samp_process_logits's logits bit for bit, over random
 * prompts, outputs, biases (a token listed twice), stop ids and EOS under min_tokens, and all
 * penalties; the plan draws the same random number as fp4s_samp_sample (next draws agree). */
static void test_plan(void)
{
	struct fp4s_error err = {0};
	for (int it = 0; it < 200; it++) {
		const int32_t V = 2 + (int32_t)(t_rand_u64() % 300);
		struct fp4s_sampling p;
		fp4s_samp_defaults(&p);
		p.temperature = it % 5 == 0 ? 0.0f : 0.9f;
		if (it % 2) {
			p.repetition_penalty = it % 4 == 1 ? 1.25f : 0.75f;
			p.frequency_penalty = 0.3f;
		}
		if (it % 3)
			p.presence_penalty = -0.7f;
		p.n_logit_bias = (int32_t)(t_rand_u64() % 8);
		for (int32_t i = 0; i < p.n_logit_bias; i++)
			p.logit_bias[i] = (struct fp4s_samp_bias){(int32_t)(t_rand_u64() % (uint64_t)V),
			                                          (float)(t_rand_uniform() * 10.0 - 5.0)};
		if (p.n_logit_bias > 2)
			p.logit_bias[1].token = p.logit_bias[0].token;
		p.min_tokens = (int32_t)(t_rand_u64() % 4);
		p.n_stop_ids = (int32_t)(t_rand_u64() % 3);
		for (int32_t i = 0; i < p.n_stop_ids; i++)
			p.stop_ids[i] = (int32_t)(t_rand_u64() % (uint64_t)V);
		p.ignore_eos = it % 7 == 0;
		p.has_seed = true;
		p.seed = t_rand_u64();
		int32_t prompt[24], eos[2] = {0, V - 1};
		const int32_t np = (int32_t)(t_rand_u64() % 24);
		for (int32_t i = 0; i < np; i++)
			prompt[i] = (int32_t)(t_rand_u64() % (uint64_t)V);
		struct fp4s_sampler a, b;
		CHECK(fp4s_samp_init(&a, &p, V, prompt, np, eos, 2, &err) == 0);
		CHECK(fp4s_samp_init(&b, &p, V, prompt, np, eos, 2, &err) == 0);
		const int32_t outs = (int32_t)(t_rand_u64() % 6);
		for (int32_t i = 0; i < outs; i++) {
			const int32_t t = (int32_t)(t_rand_u64() % (uint64_t)V);
			fp4s_samp_accept(&a, t);
			fp4s_samp_accept(&b, t);
		}
		float *want = malloc((size_t)V * sizeof *want), *got = malloc((size_t)V * sizeof *got);
		for (int32_t i = 0; i < V; i++)
			want[i] = got[i] = (float)(t_rand_normal() * 3.0);
		fp4s_samp_process_logits(&a, want, V);
		const int32_t cap = fp4s_samp_plan_edits(&b);
		struct fp4s_samp_edit *ed = malloc(((size_t)cap + 1) * sizeof *ed);
		struct fp4s_samp_row row;
		int32_t ne = -1;
		CHECK(fp4s_samp_plan(&b, &row, ed, cap, &ne, &err) == 0);
		int unique = 1;
		for (int32_t e = 0; e < ne; e++) {
			unique &= e == 0 || ed[e].token > ed[e - 1].token;
			float x = got[ed[e].token];
			if (ed[e].has_bias)
				x = x + ed[e].bias;
			if (ed[e].mask)
				x = -INFINITY;
			if (ed[e].seen) {
				if (row.rep != 1.0f)
					x = x > 0.0f ? x / row.rep : x * row.rep;
				if (ed[e].n_out > 0) {
					x = x - row.freq * (float)ed[e].n_out;
					x = x - row.pres;
				}
			}
			got[ed[e].token] = x;
		}
		CHECK_MSG(unique, "plan %d: edits not one a token", it);
		int same = 1;
		for (int32_t i = 0; i < V; i++)
			same &= memcmp(&want[i], &got[i], sizeof(float)) == 0;
		CHECK_MSG(same, "plan %d (V %d, %d edits): edited logits differ from process_logits", it, V, ne);
		CHECK_EQ_INT(row.greedy, p.temperature < FP4S_SAMP_GREEDY_EPS);
		/* the plan drew the draw a's sample would: from here both RNGs agree (a row that finds
		 * no finite logit, all of a tiny vocabulary masked, still takes its draw) */
		if (!row.greedy) {
			struct fp4s_samp_result r;
			for (int32_t i = 0; i < V; i++)
				want[i] = 0.0f;
			fp4s_samp_sample(&a, want, V, &r, &err); /* a draws now */
			for (int32_t i = 0; i < V; i++)
				got[i] = want[i] = 0.0f;
			struct fp4s_samp_result ra, rb;
			const int rca = fp4s_samp_sample(&a, want, V, &ra, &err), rcb = fp4s_samp_sample(&b, got, V, &rb, &err);
			CHECK_MSG(rca == rcb && (rca != 0 || ra.token == rb.token), "plan %d: the RNGs no longer agree", it);
		}
		free(want), free(got), free(ed);
		fp4s_samp_free(&a), fp4s_samp_free(&b);
	}
	/* logprobs go to the device with the row, raw or processed */
	for (int mode = 0; mode < 2; mode++) {
		struct fp4s_sampling p;
		fp4s_samp_defaults(&p);
		p.logprobs = true;
		p.top_logprobs = 7;
		p.logprobs_mode = mode ? FP4S_SAMP_LOGPROBS_PROCESSED : FP4S_SAMP_LOGPROBS_RAW;
		struct fp4s_sampler s;
		CHECK(fp4s_samp_init(&s, &p, 10, NULL, 0, NULL, 0, &err) == 0);
		struct fp4s_samp_row row;
		struct fp4s_samp_edit ed[1];
		int32_t ne = 0;
		const int rc = fp4s_samp_plan(&s, &row, ed, 1, &ne, &err);
		CHECK_MSG(rc == 0 && row.logprobs == (mode ? FP4S_SAMP_ROW_LP_PROCESSED : FP4S_SAMP_ROW_LP_RAW) &&
		              row.n_top == 7 && row.slot == -1,
		          "logprobs plan (mode %d): rc %d logprobs %d n_top %d", mode, rc, row.logprobs, row.n_top);
		fp4s_samp_free(&s);
	}
	/* no logprobs: none asked of the device */
	{
		struct fp4s_sampling p;
		fp4s_samp_defaults(&p);
		struct fp4s_sampler s;
		CHECK(fp4s_samp_init(&s, &p, 10, NULL, 0, NULL, 0, &err) == 0);
		struct fp4s_samp_row row;
		struct fp4s_samp_edit ed[1];
		int32_t ne = 0;
		CHECK(fp4s_samp_plan(&s, &row, ed, 1, &ne, &err) == 0 && row.logprobs == 0 && row.n_top == 0);
		fp4s_samp_free(&s);
	}
}

/* fp4s_samp_sample_row (a planned row drawn on the host) against fp4s_samp_sample on the same
 * state and logits: the same token, rank and logprobs bit for bit, for random filters,
 * temperatures (greedy too), logprobs modes, biases, min_tokens masks and penalties; a scratch
 * sampler of other parameters does the row's work. Tokens drawn go back to both samplers; at
 * odd steps b's plan is made before it takes the last token (prev_fed, as a step enqueued
 * ahead: the row counts that token itself). */
static void test_sample_row(void)
{
	struct fp4s_error err = {0};
	int bad = 0, n = 0;
	for (int it = 0; it < 300; it++) {
		const int32_t V = 2 + (int32_t)(t_rand_u64() % (it % 3 ? 400 : 5000));
		struct fp4s_sampling p;
		fp4s_samp_defaults(&p);
		p.temperature = it % 6 == 0 ? 0.0f : (float)(0.3 + t_rand_uniform() * 1.4);
		p.top_p = it % 2 ? (float)(0.2 + t_rand_uniform() * 0.8) : 1.0f;
		p.top_k = it % 3 == 1 ? 1 + (int32_t)(t_rand_u64() % (uint64_t)V) : 0;
		p.min_p = it % 5 == 2 ? (float)(t_rand_uniform() * 0.3) : 0.0f;
		if (it % 4 == 3) {
			p.repetition_penalty = 1.3f;
			p.presence_penalty = 0.4f;
		}
		if (it % 7 < 3) {
			p.logprobs = true;
			p.top_logprobs = (int32_t)(t_rand_u64() % 6);
			p.logprobs_mode = it % 2 ? FP4S_SAMP_LOGPROBS_PROCESSED : FP4S_SAMP_LOGPROBS_RAW;
		}
		p.n_logit_bias = (int32_t)(t_rand_u64() % 4);
		for (int32_t i = 0; i < p.n_logit_bias; i++)
			p.logit_bias[i] = (struct fp4s_samp_bias){(int32_t)(t_rand_u64() % (uint64_t)V),
			                                          (float)(t_rand_uniform() * 6.0 - 3.0)};
		p.min_tokens = (int32_t)(t_rand_u64() % 3);
		p.has_seed = true;
		p.seed = t_rand_u64();
		int32_t eos[1] = {V - 1}, prompt[8];
		for (int32_t i = 0; i < 8; i++)
			prompt[i] = (int32_t)(t_rand_u64() % (uint64_t)V);
		struct fp4s_sampler a, b, scratch;
		struct fp4s_sampling q;
		fp4s_samp_defaults(&q);
		q.top_k = 3; /* parameters the row must not take */
		CHECK(fp4s_samp_init(&a, &p, V, prompt, 8, eos, 1, &err) == 0);
		CHECK(fp4s_samp_init(&b, &p, V, prompt, 8, eos, 1, &err) == 0);
		CHECK(fp4s_samp_init(&scratch, &q, V, NULL, 0, NULL, 0, &err) == 0);
		float *la = malloc((size_t)V * sizeof *la), *lb = malloc((size_t)V * sizeof *lb);
		const int32_t cap = fp4s_samp_plan_edits(&b) + V; /* the counts grow as tokens are drawn */
		struct fp4s_samp_edit *ed = malloc(((size_t)cap + 1) * sizeof *ed);
		int32_t last = -1;
		for (int step = 0; step < 4; step++) {
			const double scale = it % 4 == 0 ? 8.0 : 2.0; /* peaked or flat */
			for (int32_t i = 0; i < V; i++)
				la[i] = lb[i] = (float)(t_rand_normal() * scale);
			struct fp4s_samp_row row;
			int32_t ne = 0;
			const int defer = step % 2 == 1 && last >= 0;
			if (defer)
				b.n_generated++; /* as the engine plans a step ahead */
			CHECK(fp4s_samp_plan(&b, &row, ed, cap, &ne, &err) == 0);
			if (defer) {
				b.n_generated--;
				fp4s_samp_accept(&b, last);
				row.prev_fed = b.penalties;
			}
			row.edit0 = 0;
			struct fp4s_samp_result ra, rb;
			const int rca = fp4s_samp_sample(&a, la, V, &ra, &err);
			const int rcb = fp4s_samp_sample_row(&scratch, &row, ed, last, lb, V, &rb, &err);
			int same = rca == rcb && (rca || (ra.token == rb.token && ra.rank == rb.rank && ra.n_top == rb.n_top &&
			                                  !memcmp(&ra.logprob, &rb.logprob, sizeof ra.logprob)));
			for (int32_t k = 0; same && !rca && k < ra.n_top; k++)
				same = ra.top[k].token == rb.top[k].token &&
				       !memcmp(&ra.top[k].logprob, &rb.top[k].logprob, sizeof(float));
			bad += !same;
			n++;
			if (!same)
				fprintf(stderr, "row %d step %d (V %d): rc %d / %d, token %d / %d\n", it, step, V, rca, rcb, ra.token,
				         rb.token);
			if (rca || fp4s_samp_is_stop(&a, ra.token))
				break;
			fp4s_samp_accept(&a, ra.token);
			last = ra.token;
			if (step % 2 == 1 || step == 3) /* else b takes it when planning the next step */
				fp4s_samp_accept(&b, ra.token);
		}
		free(la), free(lb), free(ed);
		fp4s_samp_free(&a), fp4s_samp_free(&b), fp4s_samp_free(&scratch);
	}
	CHECK_MSG(bad == 0 && n > 300, "sample_row: %d of %d draws differ from fp4s_samp_sample", bad, n);
	/* a row of another vocabulary, or an edit outside it, is refused */
	{
		struct fp4s_sampling p;
		fp4s_samp_defaults(&p);
		struct fp4s_sampler s;
		CHECK(fp4s_samp_init(&s, &p, 10, NULL, 0, NULL, 0, &err) == 0);
		struct fp4s_samp_row row;
		struct fp4s_samp_edit ed[1];
		int32_t ne = 0;
		CHECK(fp4s_samp_plan(&s, &row, ed, 1, &ne, &err) == 0);
		float l[11] = {0};
		struct fp4s_samp_result r;
		CHECK(fp4s_samp_sample_row(&s, &row, ed, -1, l, 11, &r, &err) == FP4S_EINVAL);
		row.prev_fed = 1; /* a fed token outside the vocabulary */
		CHECK(fp4s_samp_sample_row(&s, &row, ed, 10, l, 10, &r, &err) == FP4S_EINVAL);
		row.prev_fed = 0;
		row.n_edits = 1;
		ed[0] = (struct fp4s_samp_edit){.token = 10, .has_bias = 1, .bias = 1.0f};
		CHECK(fp4s_samp_sample_row(&s, &row, ed, -1, l, 10, &r, &err) == FP4S_EINVAL);
		fp4s_samp_free(&s);
	}
}

int main(void)
{
	t_seed_from_env();
	test_samp_math();
	test_plan();
	test_sample_row();
	return TEST_DONE();
}
