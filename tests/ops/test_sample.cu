// test_sample.cu (label gpu): the CUDA backend's sampling (backend.h's sample, sample.cu) against
// the CPU sampler (sampler.c) on fresh random logits. Two samplers of each sequence start from the
// same seed: one samples on the host (fp4s_samp_sample), the other plans the row for the device
// (fp4s_samp_plan draws the same random number), and the tokens must be equal, draw after draw.
// Both sides do the same arithmetic (samp_math.h), so equality is exact, not statistical.
// Vocabularies 3 to 201088; logits from narrow to wide normals, peaked rows, rows of few distinct
// values (ties at every cut), rows with -inf and NaN; every filter alone and together (greedy,
// temperature, min_p, top_k, top_p down to 1e-6), logit bias (a token listed twice), the
// min_tokens mask and all three penalties over a prompt and the tokens drawn so far; batches of
// up to 48 rows with different settings each; a row with no finite logit must give -1. Rows with
// raw or processed logprobs (0 to 20 alternatives) must give the host's rank and alternatives exactly and its
// logprobs within 1e-5 (+1e-6 relative; NaN where the host's are: a NaN logit); batches of up to
// 150 such rows (the backend launches 64 a time).
// `test_sample [filter]` runs cases whose name contains filter.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "backend/backend.h"
#include "engine/sampler.h"
#include "ops_test.h"
#include "test_util.h"

enum dist { D_NORMAL, D_WIDE, D_PEAKED, D_TIES, D_HOLES };
static const char *dist_name[] = {"normal", "wide", "peaked", "ties", "holes"};

static void fill(std::vector<float> &l, int V, int d)
{
	for (int i = 0; i < V; i++) {
		const double z = t_rand_normal();
		switch (d) {
		case D_NORMAL: l[i] = (float)(2.0 * z); break;
		case D_WIDE: l[i] = (float)(12.0 * z); break;
		case D_PEAKED: l[i] = (float)z + (t_rand_u64() % 97 == 0 ? 9.0f : 0.0f); break;
		case D_TIES: l[i] = (float)(floor(z * 2.0) / 2.0); break; /* ~10 distinct values */
		default:
			l[i] = t_rand_u64() % 3 == 0 ? -INFINITY : t_rand_u64() % 50 == 0 ? NAN : (float)(3.0 * z);
		}
	}
	if (d == D_HOLES)
		l[t_rand_u64() % V] = 1.0f; /* at least one finite logit */
}

/* a device logprob against the host's (the sums' order and expf differ by an ulp or two) */
static bool lp_near(float got, float want)
{
	if (isnan(want))
		return isnan(got);
	return fabsf(got - want) <= 1e-5f + 1e-6f * fabsf(want);
}

struct seqcase {
	struct fp4s_sampling p;
	std::vector<int32_t> prompt;
	struct fp4s_sampler host, dev;
	int dist;
};

static void make_params(struct fp4s_sampling *p, int V, int mode)
{
	fp4s_samp_defaults(p);
	static const float temps[] = {0.0f, 0.3f, 0.7f, 1.0f, 1.7f};
	static const float tops[] = {1.0f, 0.9f, 0.5f, 0.95f, 0.999f, 1e-6f};
	p->temperature = temps[t_rand_u64() % 5];
	if (mode & 1)
		p->top_p = tops[t_rand_u64() % 6];
	if (mode & 2) {
		static const int ks[] = {1, 2, 5, 50, 1000};
		p->top_k = ks[t_rand_u64() % 5];
	}
	if (mode & 4)
		p->min_p = t_rand_u64() % 2 ? 0.05f : 0.5f;
	if (mode & 8) {
		p->repetition_penalty = t_rand_u64() % 2 ? 1.3f : 0.8f;
		p->frequency_penalty = 0.4f;
		p->presence_penalty = -0.3f;
	}
	if (mode & 16) {
		p->n_logit_bias = 6;
		for (int i = 0; i < 6; i++)
			p->logit_bias[i] = (fp4s_samp_bias){(int32_t)(t_rand_u64() % V), (float)(t_rand_uniform() * 20 - 10)};
		p->logit_bias[5].token = p->logit_bias[2].token; /* listed twice: the sum applies */
		p->logit_bias[4].bias = 100.0f;
	}
	if (mode & 64) {
		p->logprobs = true;
		p->top_logprobs = (int32_t)(t_rand_u64() % 21);
		p->logprobs_mode = t_rand_u64() % 3 ? FP4S_SAMP_LOGPROBS_RAW : FP4S_SAMP_LOGPROBS_PROCESSED;
	}
	if (mode & 32) {
		p->min_tokens = 3;
		p->n_stop_ids = 2;
		p->stop_ids[0] = (int32_t)(t_rand_u64() % V);
		p->stop_ids[1] = (int32_t)(t_rand_u64() % V);
	}
}

/* n rows of vocabulary V, `draws` tokens each; mode: the filters (bit flags), or -1 for a mix */
static void run_case(struct fp4s_backend *gpu, int V, int n, int d, int mode, int draws, const char *filter)
{
	char name[160];
	snprintf(name, sizeof name, "SAMPLE(V=%d,rows=%d,%s,mode=%d)", V, n, dist_name[d], mode);
	if (filter && !strstr(name, filter))
		return;
	struct fp4s_error err = {};
	std::vector<seqcase> sc(n);
	const int32_t eos[2] = {0, V - 1};
	for (int r = 0; r < n; r++) {
		make_params(&sc[r].p, V, mode < 0 ? (int)(t_rand_u64() % 128) : mode);
		sc[r].p.has_seed = true;
		sc[r].p.seed = t_rand_u64();
		sc[r].prompt.resize(1 + t_rand_u64() % 40);
		for (auto &t : sc[r].prompt)
			t = (int32_t)(t_rand_u64() % V);
		int rc = fp4s_samp_init(&sc[r].host, &sc[r].p, V, sc[r].prompt.data(), (int32_t)sc[r].prompt.size(), eos,
		                        V > 1 ? 2 : 1, &err);
		rc |= fp4s_samp_init(&sc[r].dev, &sc[r].p, V, sc[r].prompt.data(), (int32_t)sc[r].prompt.size(), eos,
		                     V > 1 ? 2 : 1, &err);
		CHECK_MSG(rc == 0, "%s: init: %s", name, err.msg);
		if (rc)
			return;
	}
	std::vector<float> lg((size_t)n * V), row(V);
	std::vector<fp4s_samp_row> rows(n);
	std::vector<fp4s_samp_edit> edits;
	std::vector<int32_t> tok(n);
	std::vector<fp4s_samp_result> lp(n);
	float *d_lg;
	CK(cudaMalloc(&d_lg, lg.size() * sizeof(float)));
	int mismatches = 0, errors = 0, lp_bad = 0;
	for (int k = 0; k < draws; k++) {
		std::vector<float> one(V);
		for (int r = 0; r < n; r++) {
			fill(one, V, d);
			memcpy(&lg[(size_t)r * V], one.data(), (size_t)V * sizeof(float));
		}
		edits.clear();
		for (int r = 0; r < n; r++) {
			const int32_t cap = fp4s_samp_plan_edits(&sc[r].dev);
			const size_t at = edits.size();
			edits.resize(at + (size_t)cap + 1);
			int32_t ne = 0;
			if (fp4s_samp_plan(&sc[r].dev, &rows[r], edits.data() + at, cap, &ne, &err)) {
				CHECK_MSG(0, "%s: plan: %s", name, err.msg);
				return;
			}
			edits.resize(at + (size_t)ne);
			rows[r].edit0 = (int32_t)at;
		}
		CK(cudaMemcpy(d_lg, lg.data(), lg.size() * sizeof(float), cudaMemcpyHostToDevice));
		CK(cudaDeviceSynchronize()); /* a pageable copy may still be landing; the backend's stream does not wait */
		if (gpu->sample(gpu, d_lg, n, V, rows.data(), edits.data(), (int32_t)edits.size(), tok.data(), lp.data(),
		                &err)) {
			CHECK_MSG(0, "%s: sample: %s", name, err.msg);
			return;
		}
		for (int r = 0; r < n; r++) {
			memcpy(row.data(), &lg[(size_t)r * V], (size_t)V * sizeof(float));
			struct fp4s_samp_result res;
			const int rc = fp4s_samp_sample(&sc[r].host, row.data(), V, &res, &err);
			const int want = rc ? -1 : res.token;
			if (want >= 0 && want == tok[r] && sc[r].p.logprobs) {
				const fp4s_samp_result &g = lp[r];
				int ok = g.token == want && g.rank == res.rank && g.n_top == res.n_top && lp_near(g.logprob, res.logprob);
				for (int j = 0; ok && j < res.n_top; j++)
					ok = g.top[j].token == res.top[j].token && lp_near(g.top[j].logprob, res.top[j].logprob);
				if (!ok && lp_bad++ < 5)
					fprintf(stderr,
					        "%s: draw %d row %d: logprobs: host %d %.7g rank %d top %d (%d %.7g), device %d %.7g rank %d "
					        "top %d (%d %.7g)\n",
					        name, k, r, res.token, (double)res.logprob, res.rank, res.n_top, res.top[0].token,
					        (double)res.top[0].logprob, g.token, (double)g.logprob, g.rank, g.n_top, g.top[0].token,
					        (double)g.top[0].logprob);
			}
			if (want != tok[r]) {
				if (mismatches++ < 5)
					fprintf(stderr, "%s: draw %d row %d: host %d, device %d (T %g top_p %g top_k %d min_p %g)\n", name,
					        k, r, want, tok[r], (double)sc[r].p.temperature, (double)sc[r].p.top_p, sc[r].p.top_k,
					        (double)sc[r].p.min_p);
			}
			if (want >= 0) {
				fp4s_samp_accept(&sc[r].host, want);
				fp4s_samp_accept(&sc[r].dev, want);
			} else {
				errors++;
			}
		}
	}
	cudaFree(d_lg);
	for (auto &s : sc)
		fp4s_samp_free(&s.host), fp4s_samp_free(&s.dev);
	CHECK_MSG(mismatches == 0, "%s: %d of %d tokens differ", name, mismatches, n * draws);
	CHECK_MSG(lp_bad == 0, "%s: %d rows' logprobs differ", name, lp_bad);
	if (getenv("FP4S_TEST_VERBOSE"))
		printf("%s: %d draws equal (%d rows without a finite logit)\n", name, n * draws, errors);
}

/* a row with every logit -inf (or NaN) gives -1, as the host sampler's error */
static void run_empty(struct fp4s_backend *gpu, const char *filter)
{
	const char *name = "SAMPLE(no finite logit)";
	if (filter && !strstr(name, filter))
		return;
	const int V = 1000, n = 3;
	std::vector<float> lg((size_t)n * V, -INFINITY);
	lg[V + 5] = NAN;
	lg[2 * V + 7] = 2.0f; /* row 2 has one: its token is 7 */
	std::vector<fp4s_samp_row> rows(n);
	for (int r = 0; r < n; r++)
		rows[r] = fp4s_samp_row{r == 1 ? 0.0f : 0.8f, 0.9f, 0.0f, 1.0f, 0.0f, 0.0f, 0, r == 1, 0, 0, 0, 0, -1, 0, 0.5};
	float *d_lg;
	CK(cudaMalloc(&d_lg, lg.size() * sizeof(float)));
	CK(cudaMemcpy(d_lg, lg.data(), lg.size() * sizeof(float), cudaMemcpyHostToDevice));
	CK(cudaDeviceSynchronize());
	int32_t tok[3] = {9, 9, 9};
	struct fp4s_error err = {};
	const int rc = gpu->sample(gpu, d_lg, n, V, rows.data(), NULL, 0, tok, NULL, &err);
	cudaFree(d_lg);
	CHECK_MSG(rc == 0 && tok[0] == -1 && tok[1] == -1 && tok[2] == 7, "%s: rc %d tokens %d %d %d", name, rc, tok[0],
	          tok[1], tok[2]);
}

int main(int argc, char **argv)
{
	const char *filter = argc > 1 ? argv[1] : NULL;
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)
		TEST_SKIP("no CUDA device");
	t_seed_from_env();
	struct fp4s_error err = {};
	struct fp4s_backend *gpu = NULL;
	if (fp4s_backend_cuda_create(0, &gpu, &err)) {
		fprintf(stderr, "cuda backend: %s\n", err.msg);
		return 1;
	}
	static const int vocabs[] = {3, 512, 32000, 151936, 201088};
	for (int v = 0; v < 5; v++)
		for (int d = 0; d < 5; d++) {
			/* each filter alone, all of them, and a mix of rows */
			static const int modes[] = {0, 1, 2, 4, 8, 16, 32, 64, 127, -1};
			for (int m = 0; m < 10; m++)
				run_case(gpu, vocabs[v], m == 9 ? 48 : 4, d, modes[m], vocabs[v] > 100000 ? 6 : 12, filter);
		}
	/* more rows with logprobs than one launch takes */
	run_case(gpu, 512, 150, D_TIES, 64 | 1, 3, filter);
	run_case(gpu, 32000, 70, D_NORMAL, -1, 3, filter);
	run_case(gpu, 32000, 70, D_PEAKED, 64, 3, filter);
	run_empty(gpu, filter);
	gpu->destroy(gpu);
	return TEST_DONE();
}
