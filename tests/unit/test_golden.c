/* test_golden.c: end-to-end logits against Hugging Face transformers (tools/make_golden.py) for
 * every fixture in tests/fixtures/golden: tiny random llama, qwen3, qwen3_moe, gpt_oss models in
 * BF16, NVFP4 (ModelOpt and compressed-tensors layouts) and MXFP4 (gpt-oss), and stories260K
 * converted to HF. For each prompt the whole prompt runs as one batch and every position's
 * logits must match with relative L2 error <= 1e-4 (the issue asks 1e-3); then greedy decoding, one token per step
 * through the KV cache, must reproduce transformers' 32 tokens (a step whose top two logits are
 * closer than the tolerance may differ: the test then requires the logits to agree instead).
 * The real stories260K.bin (llama2.c format, ../shared) must give the converted checkpoint's
 * logits too. `test_golden [filter]` runs the fixtures whose name contains filter.
 * FP4S_TEST_BACKEND=cuda runs the same checks on the GPU backend and also requires its greedy
 * decoding to equal the CPU backend's for 64 tokens, with FP32, BF16 and FP8 KV caches (CTest:
 * test_golden_cuda, label gpu). On the CPU, the FP8 KV cache is checked against transformers
 * within what E4M3 rounding costs (check_fp8). Decode steps of 3 sequences replayed as graphs must
 * give the logits the same steps give uncaptured (batch_graph_check). */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/forward.h"
#include "test_util.h"

/* the issue asks for 1e-3; FP32 on both sides lands near 1e-6, so 1e-4 keeps a margin and still
 * catches a wrong rounding step */
#define TOL 1e-4
/* the W4A16 GEMM's BF16 activations: ~2e-3 */
#define GEMM_TOL 5e-3

static float *read_floats(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long sz = ftell(f);
	fseek(f, 0, SEEK_SET);
	float *p = malloc((size_t)sz);
	*n = fread(p, 1, (size_t)sz, f) / sizeof(float);
	fclose(f);
	return p;
}

static double rel_l2(const float *a, const float *b, int64_t n)
{
	double num = 0, den = 0;
	for (int64_t i = 0; i < n; i++) {
		num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
		den += (double)b[i] * b[i];
	}
	return sqrt(num / (den > 0 ? den : 1));
}

static int argmax(const float *v, int64_t n)
{
	int best = 0;
	for (int64_t i = 1; i < n; i++)
		if (v[i] > v[best])
			best = (int)i;
	return best;
}

/* Runs the fixture's prompts and greedy decode on model m; returns the worst rel L2 error. */
/* The GPU's prompt GEMM rounds activations to BF16 (W4A16): off for the strict checks, on for
 * the looser pass (g_gemm). */
static int g_gemm;

static int make_backend(const char *name, struct fp4s_backend **be, struct fp4s_error *err)
{
	int rc = !strcmp(name, "cuda") ? fp4s_backend_cuda_create(0, be, err) : fp4s_backend_cpu_create(be, err);
	if (!rc)
		(*be)->gemm_min_tokens = g_gemm ? 1 : 0;
	return rc;
}

/* Greedy tokens after prompt p on the named backend, one token per step. */
static int greedy(struct fp4s_model *m, const char *backend, enum fp4s_kv_dtype kv, const int32_t *p,
                  int32_t n, int32_t count, int32_t *out, float *gap_at_end)
{
	struct fp4s_error err = {0};
	struct fp4s_backend *be;
	struct fp4s_fwd f;
	const int64_t V = m->cfg.vocab;
	if (make_backend(backend, &be, &err))
		return -1;
	if (fp4s_fwd_init(&f, m, be, 1, n + count + 1, kv, &err)) {
		be->destroy(be);
		return -1;
	}
	float *lg = malloc((size_t)V * sizeof *lg);
	int rc = 0;
	for (int32_t i = 0; i < n + count - 1 && !rc; i++) {
		int32_t t = i < n ? p[i] : out[i - n], pos = i, s = 0, r = 0;
		struct fp4s_batch b = {1, &t, &pos, &s, NULL, 0};
		rc = fp4s_fwd_run(&f, &b, &r, 1, lg, &err);
		if (!rc && i >= n - 1) {
			out[i - n + 1] = argmax(lg, V);
			/* margin of the choice: how far the best is above the runner-up */
			float second = -INFINITY;
			for (int64_t v = 0; v < V; v++)
				if (v != out[i - n + 1] && lg[v] > second)
					second = lg[v];
			gap_at_end[i - n + 1] = lg[out[i - n + 1]] - second;
		}
	}
	free(lg);
	fp4s_fwd_free(&f);
	be->destroy(be);
	return rc;
}

/* greedy's tokens again, the way the engine decodes: each step's argmax launched and its token
 * fed to the next step on the device (fp4s_fwd_launch_argmax, tokens NULL), two steps in flight;
 * halfway the tokens go up from the host again (a collected token given back). On a GPU a step of
 * one token then has its argmax in its graph, which advances the device's position, and the next
 * step copies nothing up: any position or token off by one shows as other tokens here. */
static int greedy_launched(struct fp4s_model *m, const char *backend, enum fp4s_kv_dtype kv, const int32_t *p,
                           int32_t n, int32_t count, int32_t *out)
{
	struct fp4s_error err = {0};
	struct fp4s_backend *be;
	struct fp4s_fwd f;
	if (make_backend(backend, &be, &err))
		return -1;
	if (fp4s_fwd_init(&f, m, be, 1, n + count + 1, kv, &err)) {
		be->destroy(be);
		return -1;
	}
	float *lg = malloc((size_t)m->cfg.vocab * sizeof *lg);
	int rc = 0;
	int32_t s = 0, r = 0, got = 0;
	for (int32_t i = 0; i < n - 1 && !rc; i++) {
		int32_t t = p[i], pos = i;
		struct fp4s_batch b = {1, &t, &pos, &s, NULL, 0};
		rc = fp4s_fwd_run(&f, &b, &r, 1, lg, &err);
	}
	for (int32_t j = 0; j < count && !rc; j++) {
		int32_t pos = n - 1 + j, t = j == 0 ? p[n - 1] : -1;
		if (j == count / 2) {
			while (got < j && !rc) /* all collected: the last token goes up from here */
				rc = fp4s_fwd_collect(&f, &out[got++], &err);
			t = out[j - 1];
		}
		struct fp4s_batch b = {1, t >= 0 ? &t : NULL, &pos, &s, NULL, 0};
		if (!rc)
			rc = fp4s_fwd_launch_argmax(&f, &b, &r, 1, &err);
		if (!rc && j - got >= 1)
			rc = fp4s_fwd_collect(&f, &out[got++], &err);
	}
	while (got < count && !rc)
		rc = fp4s_fwd_collect(&f, &out[got++], &err);
	if (rc)
		fprintf(stderr, "greedy (launched): %s\n", err.msg);
	free(lg);
	fp4s_fwd_free(&f);
	be->destroy(be);
	return rc;
}

/* greedy_launched on backend against want, greedy's tokens on the same backend: equal throughout
 * (the same step's logits, argmax ties to the lowest id either way) */
static void launched_check(struct fp4s_model *m, const char *name, const char *backend, enum fp4s_kv_dtype kv,
                           const char *kvn, const int32_t *p, int32_t n, const int32_t *want)
{
	int32_t got[64];
	if (greedy_launched(m, backend, kv, p, n, 64, got)) {
		CHECK_MSG(0, "%s: %s greedy (launched, %s KV) failed", name, backend, kvn);
		return;
	}
	int32_t first = -1;
	for (int32_t i = 0; i < 64 && first < 0; i++)
		if (got[i] != want[i])
			first = i;
	CHECK_MSG(first < 0, "%s: %s greedy launched (%s KV) differs from its greedy at token %d (%d, not %d)", name,
	          backend, kvn, first, first >= 0 ? got[first] : 0, first >= 0 ? want[first] : 0);
	if (first < 0)
		printf("%-22s %s greedy launched = greedy for 64 of 64 tokens (%s KV)\n", name, backend, kvn);
}

/* graph_run's calls by key, on a backend whose graph_run batch_graph_check wrapped */
static int g_gkeys[FP4S_FWD_GRAPH_ROWS + 1];
static int (*g_graph_run)(struct fp4s_backend *be, int key, int (*record)(void *ctx, struct fp4s_error *err),
                          void *ctx, struct fp4s_error *err);

static int counting_graph_run(struct fp4s_backend *be, int key, int (*record)(void *ctx, struct fp4s_error *err),
                              void *ctx, struct fp4s_error *err)
{
	if (key >= 0 && key <= FP4S_FWD_GRAPH_ROWS)
		g_gkeys[key]++;
	return g_graph_run(be, key, record, ctx, err);
}

/* Decode steps of 3 sequences at once, as the engine batches them: from the second such step on,
 * the forward pass replays them as the graph of their row count (forward.c's fwd_batch_graph).
 * The same steps asking for the logits rows in reverse order never are, and run the same kernels:
 * the two must give the same logits row for row, and graph_run must have been asked for key 3
 * at every step but the first. A graph holding a buffer that moved, or a step whose launches
 * depend on more than its row count, shows as other logits. */
static void batch_graph_check(struct fp4s_model *m, const char *name, const char *backend, enum fp4s_kv_dtype kv)
{
	enum { NS = 3, STEPS = 8 };
	struct fp4s_error err = {0};
	struct fp4s_backend *be[2] = {NULL, NULL};
	struct fp4s_fwd f[2];
	int live[2] = {0, 0}, rc = 0;
	const int64_t V = m->cfg.vocab;
	float *lg[2] = {malloc((size_t)(NS * V) * sizeof(float)), malloc((size_t)(NS * V) * sizeof(float))};
	for (int k = 0; k < 2 && !rc; k++)
		if (!(rc = make_backend(backend, &be[k], &err)) && !(rc = fp4s_fwd_init(&f[k], m, be[k], NS, 64, kv, &err)))
			live[k] = 1;
	if (!rc) {
		g_graph_run = be[0]->graph_run;
		be[0]->graph_run = counting_graph_run;
		memset(g_gkeys, 0, sizeof g_gkeys);
	}
	/* prompts of 3, 5 and 7 tokens, each its own step */
	int32_t tok[NS], pos[NS], seq[NS];
	for (int32_t s = 0; s < NS && !rc; s++) {
		int32_t n = 3 + 2 * s, t[7], p[7], q[7], r = n - 1;
		for (int32_t i = 0; i < n; i++)
			t[i] = (int32_t)(((uint32_t)(s + 1) * 2654435761u + (uint32_t)i * 40503u) % (uint32_t)V), p[i] = i, q[i] = s;
		struct fp4s_batch b = {n, t, p, q, NULL, 0};
		for (int k = 0; k < 2 && !rc; k++)
			rc = fp4s_fwd_run(&f[k], &b, &r, 1, lg[k], &err);
		tok[s] = argmax(lg[0], V), pos[s] = n, seq[s] = s;
	}
	const int32_t fwd_rows[NS] = {0, 1, 2}, rev_rows[NS] = {2, 1, 0};
	double worst = 0;
	for (int32_t j = 0; j < STEPS && !rc; j++) {
		struct fp4s_batch b = {NS, tok, pos, seq, NULL, 0};
		if (!(rc = fp4s_fwd_run(&f[0], &b, fwd_rows, NS, lg[0], &err)))
			rc = fp4s_fwd_run(&f[1], &b, rev_rows, NS, lg[1], &err);
		for (int32_t s = 0; s < NS && !rc; s++) {
			const double e = rel_l2(lg[1] + (size_t)(NS - 1 - s) * V, lg[0] + (size_t)s * V, V);
			worst = e > worst ? e : worst;
			tok[s] = argmax(lg[0] + (size_t)s * V, V), pos[s]++;
		}
	}
	if (rc) {
		CHECK_MSG(0, "%s: %s decode batch steps failed: %s", name, backend, err.msg);
	} else {
		const char *bg = getenv("FP4S_BATCH_GRAPH");
		/* (a backend routing MoE on the host, the CPU's, runs such steps uncaptured) */
		const int want = getenv("FP4S_NO_GRAPH") || (bg && atoi(bg) == 0) || (f[0].has_moe && !f[0].moe_on_device)
		                         ? 0
		                         : STEPS - 1;
		CHECK_MSG(g_gkeys[NS] == want, "%s: %s: %d decode steps of %d rows went to graph_run %d times, not %d", name,
		          backend, STEPS, NS, g_gkeys[NS], want);
		CHECK_MSG(worst <= 1e-5, "%s: %s: decode batch steps as graphs against uncaptured: rel L2 %.3g", name,
		          backend, worst);
		printf("%-22s %s decode batch of %d rows: %d of %d steps through graph_run, logits = the uncaptured "
		       "steps' (rel L2 %.2g)\n", name, backend, NS, g_gkeys[NS], STEPS, worst);
	}
	for (int k = 0; k < 2; k++) {
		if (live[k])
			fp4s_fwd_free(&f[k]);
		if (be[k])
			be[k]->destroy(be[k]);
		free(lg[k]);
	}
}

static const char *g_backend = "cpu";

/* FP8 (E4M3, scale 1.0) KV cache on the CPU reference. Rounding K/V to 3 mantissa bits moves the
 * logits by far more than the FP32 tolerance, so the checks are looser and say why:
 *   - every prompt position's logits within FP8_TOL (rel L2) of transformers' (FP32 KV);
 *   - greedy decoding through the FP8 cache follows transformers' tokens. Where it first turns
 *     away, the step must be a near-tie that K/V rounding can flip: an FP32-KV run fed the same
 *     tokens (it is transformers' greedy to 1e-4) has its two candidates closer than FLIP_RMS
 *     times the rms difference between the two runs' logits at that step. */
#define FP8_TOL 5e-2
#define FLIP_RMS 4.0
static void check_fp8(const char *name, struct fp4s_model *m, json_t *g, const float *ref, size_t nref)
{
	struct fp4s_error err = {0};
	struct fp4s_backend *be8 = NULL, *be32 = NULL;
	struct fp4s_fwd f8, f32;
	const int64_t V = m->cfg.vocab;
	json_t *pr = json_array_get(json_object_get(g, "prompts"), 0), *want = json_object_get(g, "greedy");
	const int32_t n = (int32_t)json_array_size(pr), ng = (int32_t)json_array_size(want);
	if (n < 1 || n > 64 || ng < 1 || ng > 64 || (size_t)(n * V) > nref) {
		CHECK_MSG(0, "%s: fixture shape (prompt %d, greedy %d)", name, n, ng);
		return;
	}
	if (make_backend("cpu", &be8, &err) || make_backend("cpu", &be32, &err) ||
	    fp4s_fwd_init(&f8, m, be8, 1, 128, FP4S_KV_FP8, &err)) {
		CHECK_MSG(0, "%s: FP8 KV: %s", name, err.msg);
		return;
	}
	if (fp4s_fwd_init(&f32, m, be32, 1, 128, FP4S_KV_F32, &err)) {
		CHECK_MSG(0, "%s: FP32 KV: %s", name, err.msg);
		return;
	}
	int32_t tok[64], pos[64], seq[64], rows[64];
	for (int32_t i = 0; i < n; i++)
		tok[i] = (int32_t)json_integer_value(json_array_get(pr, (size_t)i)), pos[i] = i, seq[i] = 0, rows[i] = i;
	float *lg = malloc((size_t)(n * V) * sizeof *lg), *l32 = malloc((size_t)(n * V) * sizeof *l32);
	double worst = 0;
	struct fp4s_batch b = {n, tok, pos, seq, NULL, 0};
	int rc = fp4s_fwd_run(&f8, &b, rows, n, lg, &err);
	if (!rc)
		rc = fp4s_fwd_run(&f32, &b, rows, n, l32, &err);
	CHECK_MSG(rc == 0, "%s: forward: %s", name, err.msg);
	for (int32_t i = 0; i < n && !rc; i++)
		worst = fmax(worst, rel_l2(lg + (int64_t)i * V, ref + (size_t)i * V, V));
	CHECK_MSG(worst <= FP8_TOL, "%s: FP8 KV prompt logits: rel L2 %.3g (tolerance %.0e)", name, worst, FP8_TOL);
	/* greedy through both caches in lockstep on the agreed tokens, from the prompt's last logits */
	const float *p8 = lg + (int64_t)(n - 1) * V, *p32 = l32 + (int64_t)(n - 1) * V;
	int32_t t = argmax(p8, V), p = n, s = 0, r = 0, agree = 0;
	double margin = 0, rms = 0;
	for (int32_t k = 0; k < ng && !rc; k++) {
		const int32_t w = (int32_t)json_integer_value(json_array_get(want, (size_t)k));
		if (t != w) {
			margin = (double)p32[w] - p32[t];
			for (int64_t v = 0; v < V; v++)
				rms += ((double)p8[v] - p32[v]) * ((double)p8[v] - p32[v]);
			rms = sqrt(rms / (double)V);
			CHECK_MSG(argmax(p32, V) == w && margin <= FLIP_RMS * rms, "%s: FP8 KV greedy token %d is %d, "
			          "transformers %d: FP32-KV margin %.3g, logits moved by %.3g rms", name, k, t, w, margin, rms);
			break;
		}
		agree++;
		struct fp4s_batch one = {1, &t, &p, &s, NULL, 0};
		if ((rc = fp4s_fwd_run(&f8, &one, &r, 1, lg, &err)) || (rc = fp4s_fwd_run(&f32, &one, &r, 1, l32, &err)))
			CHECK_MSG(0, "%s: decode: %s", name, err.msg);
		p8 = lg, p32 = l32;
		t = argmax(lg, V);
		p++;
	}
	if (agree < ng)
		printf("%-22s FP8 KV (CPU): prompt logits rel L2 %.2e; greedy = transformers for %d of %d tokens, then a "
		       "near-tie (FP32-KV margin %.3g, FP8 moved the logits by %.3g rms)\n", name, worst, agree, ng, margin,
		       rms);
	else
		printf("%-22s FP8 KV (CPU): prompt logits rel L2 %.2e; greedy = transformers for all %d tokens\n", name,
		       worst, ng);
	free(lg);
	free(l32);
	fp4s_fwd_free(&f8);
	fp4s_fwd_free(&f32);
	be8->destroy(be8);
	be32->destroy(be32);
}

static double check_model(const char *name, struct fp4s_model *m, json_t *g, const float *ref,
                          size_t nref)
{
	struct fp4s_error err = {0};
	struct fp4s_backend *be;
	struct fp4s_fwd f;
	const int64_t V = json_integer_value(json_object_get(g, "vocab"));
	json_t *prompts = json_object_get(g, "prompts");
	double worst = 0;
	if (make_backend(g_backend, &be, &err)) {
		CHECK_MSG(0, "%s backend: %s", g_backend, err.msg);
		return INFINITY;
	}
	if (fp4s_fwd_init(&f, m, be, (int32_t)json_array_size(prompts), 128, FP4S_KV_F32, &err)) {
		CHECK_MSG(0, "%s: forward init: %s", name, err.msg);
		be->destroy(be);
		return INFINITY;
	}
	CHECK_EQ_INT(V, m->cfg.vocab);
	size_t off = 0;
	for (size_t pi = 0; pi < json_array_size(prompts); pi++) {
		json_t *pr = json_array_get(prompts, pi);
		const int32_t n = (int32_t)json_array_size(pr);
		int32_t *tok = malloc((size_t)n * 4), *pos = malloc((size_t)n * 4), *seq = malloc((size_t)n * 4),
		        *rows = malloc((size_t)n * 4);
		float *lg = malloc((size_t)(n * V) * sizeof *lg);
		for (int32_t i = 0; i < n; i++) {
			tok[i] = (int32_t)json_integer_value(json_array_get(pr, (size_t)i));
			pos[i] = i, seq[i] = (int32_t)pi, rows[i] = i;
		}
		struct fp4s_batch b = {n, tok, pos, seq, NULL, 0};
		if (fp4s_fwd_run(&f, &b, rows, n, lg, &err)) {
			CHECK_MSG(0, "%s: forward: %s", name, err.msg);
		} else if (off + (size_t)(n * V) > nref) {
			CHECK_MSG(0, "%s: logits.bin too short", name);
		} else {
			for (int32_t i = 0; i < n; i++) {
				double e = rel_l2(lg + (int64_t)i * V, ref + off + (size_t)i * V, V);
				worst = fmax(worst, e);
				CHECK_MSG(e <= (g_gemm ? GEMM_TOL : TOL), "%s: prompt %zu position %d: rel L2 %.3g%s", name,
				          pi, i, e, g_gemm ? " (BF16 activations in the GEMM)" : "");
			}
		}
		/* greedy continuation of prompt 0 through the KV cache, one token per step */
		if (pi == 0) {
			json_t *greedy = json_object_get(g, "greedy");
			int32_t t = argmax(lg + (int64_t)(n - 1) * V, V), p = n, s = 0, r = 0;
			int mismatch = 0, close_calls = 0;
			for (size_t k = 0; k < json_array_size(greedy) && !mismatch; k++) {
				const int32_t want = (int32_t)json_integer_value(json_array_get(greedy, k));
				if (t != want) {
					/* a near-tie flips under rounding; anything else is a real difference */
					float *prev = lg + (int64_t)(n - 1) * V;
					if (k > 0)
						prev = lg;
					double gap = fabs((double)prev[t] - prev[want]);
					if (gap <= TOL * (fabs(prev[t]) + 1))
						close_calls++;
					else
						mismatch = 1;
					CHECK_MSG(!mismatch, "%s: greedy token %zu is %d, transformers %d (gap %.3g)",
					          name, k, t, want, gap);
					break;
				}
				struct fp4s_batch one = {1, &t, &p, &s, NULL, 0};
				if (fp4s_fwd_run(&f, &one, &r, 1, lg, &err)) {
					CHECK_MSG(0, "%s: decode: %s", name, err.msg);
					break;
				}
				t = argmax(lg, V);
				p++;
			}
			if (!mismatch)
				t_pass++;
			if (close_calls)
				fprintf(stderr, "%s: greedy stopped at a near-tie\n", name);
		}
		off += (size_t)(n * V);
		free(tok), free(pos), free(seq), free(rows), free(lg);
	}
	fp4s_fwd_free(&f);
	be->destroy(be);
	if (strcmp(g_backend, "cpu") != 0 && !g_gemm) {
		/* 64 greedy tokens must equal the CPU backend's; a flip is tolerated only where the
		 * CPU's own choice was a near-tie */
		json_t *pr = json_array_get(prompts, 0);
		int32_t n = (int32_t)json_array_size(pr), p[64], a[64], b[64];
		float ga[64], gb[64];
		for (int32_t i = 0; i < n && i < 64; i++)
			p[i] = (int32_t)json_integer_value(json_array_get(pr, (size_t)i));
		for (int kv = 0; kv < 3; kv++) {
			/* FP32 KV, then BF16 and FP8 KV (the CPU rounds K/V exactly as the GPU does). FP8:
			 * a K/V value whose FP32 value differs in its last bits between the two backends
			 * (their matmuls sum in other orders) can round to neighbouring E4M3 values, 2^-3
			 * apart, so a near-tie there is 1e-3 of the logit rather than 1e-4 */
			static const enum fp4s_kv_dtype kds[3] = {FP4S_KV_F32, FP4S_KV_BF16, FP4S_KV_FP8};
			static const char *const kvn[3] = {"FP32", "BF16", "FP8"};
			const float tie = kv == 2 ? 1e-3f : 1e-4f;
			if (greedy(m, "cpu", kds[kv], p, n, 64, a, ga) || greedy(m, g_backend, kds[kv], p, n, 64, b, gb)) {
				CHECK_MSG(0, "%s: greedy runs failed", name);
				continue;
			}
			int32_t first = -1;
			for (int32_t i = 0; i < 64 && first < 0; i++)
				if (a[i] != b[i])
					first = i;
			CHECK_MSG(first < 0 || ga[first] < tie * (1 + fabsf(ga[first])),
			          "%s: %s greedy (%s KV) differs from the CPU's at token %d (CPU margin %.3g)",
			          name, g_backend, kvn[kv], first, first >= 0 ? ga[first] : 0.0f);
			printf("%-22s %s greedy = CPU greedy for %d of 64 tokens (%s KV)\n", name, g_backend,
			       first < 0 ? 64 : first, kvn[kv]);
			launched_check(m, name, g_backend, kds[kv], kvn[kv], p, n, b);
		}
		batch_graph_check(m, name, g_backend, FP4S_KV_BF16);
	} else if (!g_gemm) {
		json_t *pr = json_array_get(prompts, 0);
		int32_t n = (int32_t)json_array_size(pr), p[64], a[64];
		float ga[64];
		for (int32_t i = 0; i < n && i < 64; i++)
			p[i] = (int32_t)json_integer_value(json_array_get(pr, (size_t)i));
		if (greedy(m, "cpu", FP4S_KV_F32, p, n, 64, a, ga))
			CHECK_MSG(0, "%s: greedy run failed", name);
		else
			launched_check(m, name, "cpu", FP4S_KV_F32, "FP32", p, n, a);
		batch_graph_check(m, name, "cpu", FP4S_KV_F32);
	}
	return worst;
}

int main(int argc, char **argv)
{
	const char *src = getenv("FP4S_SOURCE_DIR");
	if (getenv("FP4S_TEST_BACKEND"))
		g_backend = getenv("FP4S_TEST_BACKEND");
	if (!strcmp(g_backend, "cuda")) {
		struct fp4s_backend *be;
		struct fp4s_error err = {0};
		if (fp4s_backend_cuda_create(0, &be, &err))
			TEST_SKIP("%s", err.msg);
		be->destroy(be);
	}
	const char *filter = argc > 1 ? argv[1] : NULL;
	char dir[1024], path[1600];
	snprintf(dir, sizeof dir, "%.900s/tests/fixtures/golden", src ? src : ".");
	DIR *d = opendir(dir);
	if (!d)
		TEST_SKIP("no fixtures at %s", dir);
	struct dirent *de;
	char names[64][256];
	int nn = 0;
	while ((de = readdir(d)) && nn < 64)
		if (de->d_name[0] != '.' && (!filter || strstr(de->d_name, filter)))
			snprintf(names[nn++], sizeof names[0], "%s", de->d_name);
	closedir(d);
	for (int i = 0; i < nn; i++) {
		struct fp4s_error err = {0};
		struct fp4s_model m;
		json_error_t je;
		snprintf(path, sizeof path, "%.1000s/%.255s/golden.json", dir, names[i]);
		json_t *g = json_load_file(path, 0, &je);
		size_t nref = 0;
		snprintf(path, sizeof path, "%.1000s/%.255s/logits.bin", dir, names[i]);
		float *ref = read_floats(path, &nref);
		if (!g || !ref) {
			CHECK_MSG(0, "%s: fixture incomplete", names[i]);
			continue;
		}
		snprintf(path, sizeof path, "%.1000s/%.255s", dir, names[i]);
		if (fp4s_model_open(path, &m, &err)) {
			CHECK_MSG(0, "%s: open: %s", names[i], err.msg);
		} else {
			double w = check_model(names[i], &m, g, ref, nref);
			printf("%-22s worst rel L2 %.2e  (oracle: %s)\n", names[i], w,
			       json_string_value(json_object_get(g, "oracle")));
			if (!strcmp(g_backend, "cpu"))
				check_fp8(names[i], &m, g, ref, nref);
			if (strcmp(g_backend, "cpu") != 0) {
				/* again with the tensor-core GEMM on every prompt */
				g_gemm = 1;
				w = check_model(names[i], &m, g, ref, nref);
				g_gemm = 0;
				printf("%-22s worst rel L2 %.2e  with the W4A16 prompt GEMM\n", names[i], w);
			}
			fp4s_model_close(&m);
		}
		/* the real llama2.c file must match its HF conversion */
		const char *shared = getenv("FP4S_SHARED_DIR");
		if (strstr(names[i], "stories260K")) {
			char bin[1600];
			snprintf(bin, sizeof bin, "%.1000s/realdata/stories260K/stories260K.bin", shared ? shared : "../shared");
			if (fp4s_llama2c_open(bin, &m, &err)) {
				fprintf(stderr, "SKIP stories260K.bin (llama2.c format): %s\n", err.msg);
			} else {
				double w = check_model("stories260K.bin", &m, g, ref, nref);
				printf("%-22s worst rel L2 %.2e  (llama2.c file vs its HF conversion)\n",
				       "stories260K.bin", w);
				fp4s_model_close(&m);
			}
		}
		json_decref(g);
		free(ref);
	}
	if (nn == 0)
		TEST_SKIP("no fixture matches");
	return TEST_DONE();
}
