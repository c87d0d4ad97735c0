/* test_engine_cuda.cu: the scheduler's guarantees on the CUDA backend, on `gen` tiny models of
 * each family (label gpu). 64 requests with random prompts of 5-120 tokens, greedy, 24 new
 * tokens each, are compared against the same requests run one at a time:
 *  - batch invariance: all 64 in flight together, prompts chunked (64 tokens a step) and mixed
 *    with decode steps;
 *  - prefix caching: the same 64 again on that engine, their full prompt blocks now cache hits;
 *  - preemption: a KV pool of a third of what the batch needs, so the newest requests are
 *    preempted and recomputed; every request must still finish with its full length.
 * On the GPU these runs take different kernels (a decode step of one token and one of 64, a
 * prompt whole or in chunks, recomputed or read from cache), and the prompt GEMM rounds its
 * activations to BF16 (gemm_cuda.h), so logits agree within a tolerance, not bit for bit. So
 * greedy tokens must agree until any first difference, and a difference is accepted only at a
 * near tie: the token the other run chose must be among the alone run's NTOP best, within TIE
 * nats of its first (random tiny models have flat distributions: several tokens can tie).
 * Every logprob of the agreeing prefix must match within TOL. (On the CPU
 * backend these runs are bit-identical; tests/unit/test_engine.c checks that.)
 * MoE models: their router picks experts by top-k; where two experts' router logits nearly tie,
 * the same rounding differences can pick another expert, and that token's logits then differ by
 * more than TOL (measured on the H100: 2-4 of 64 requests of tiny-qwen3-moe and tiny-gpt-oss,
 * none of the dense models; bench/results/2026-11-22-h100-session5.md). Up to MOE_FLIPS of 64
 * such requests are allowed there; all the rest must hold to the rules above, and 3/4 of the
 * requests not allowed to differ must be equal throughout. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern "C" {
#include "engine/engine.h"
#include "model/mwrite.h"
}
#include "ops_test.h"
#include "test_util.h"

#define NREQ 64
#define NGEN 24
#define TOL 0.05f /* logprob agreement, nats */
#define TIE 0.05f /* a greedy difference is a near tie when the two logprobs are this close */
#define NTOP 5    /* alternatives recorded a step */
#define MOE_FLIPS 6 /* MoE: requests allowed to differ beyond the tolerance (see above) */

struct outs {
	int32_t tok[NREQ][NGEN];
	float lp[NREQ][NGEN];     /* the chosen token's logprob */
	int32_t alt[NREQ][NGEN][NTOP]; /* the best NTOP tokens and their logprobs */
	float altlp[NREQ][NGEN][NTOP];
	int32_t n[NREQ];
	enum fp4s_finish fin[NREQ];
};

static int32_t prompts[NREQ][128];
static int32_t plen[NREQ];

/* Runs requests [first, first + count) together; returns 0 or -1. sampled 1: temperature 0.8,
 * top_p 0.9, top_k 40 and penalties, seeded, logprobs for the even requests (raw, processed for
 * every other one; drawn on the device by default); 2: greedy without logprobs; 3: sampled (top_p,
 * top_k, min_p, a bias, seeded) without logprobs, penalties for every other request; 4: as 3 without
 * the bias and the penalties. */
static int run(struct fp4s_engine *e, int first, int count, struct outs *o, int sampled = 0)
{
	struct fp4s_error err = {0};
	int64_t ids[NREQ];
	struct fp4s_request r;
	fp4s_request_defaults(&r);
	r.sampling.temperature = 0;
	r.sampling.max_tokens = NGEN;
	r.sampling.ignore_eos = true;
	r.sampling.logprobs = true;
	r.sampling.top_logprobs = NTOP;
	if (sampled == 2) { /* plain greedy: what steps enqueued ahead take */
		r.sampling.logprobs = false;
		r.sampling.top_logprobs = 0;
	} else if (sampled >= 3) { /* drawn on the device without logprobs or penalties: steps ahead take them too */
		r.sampling.temperature = 0.8f;
		r.sampling.top_p = 0.9f;
		r.sampling.top_k = 40;
		r.sampling.min_p = 0.01f;
		r.sampling.logprobs = false;
		r.sampling.top_logprobs = 0;
		r.sampling.has_seed = true;
		/* 4: no bias either (no edits at all) */
		r.sampling.n_logit_bias = sampled == 3;
		r.sampling.logit_bias[0] = (struct fp4s_samp_bias){prompts[0][0], 1.5f};
	} else if (sampled) {
		r.sampling.temperature = 0.8f;
		r.sampling.top_p = 0.9f;
		r.sampling.top_k = 40;
		r.sampling.repetition_penalty = 1.1f;
		r.sampling.frequency_penalty = 0.2f;
		r.sampling.logprobs = false;
		r.sampling.top_logprobs = 0;
		r.sampling.has_seed = true;
	}
	for (int i = first; i < first + count; i++) {
		r.prompt = prompts[i];
		r.n_prompt = plen[i];
		r.sampling.seed = 1000 + (uint64_t)i;
		if (sampled == 3) { /* penalties for every other request: a step ahead counts its fed token */
			r.sampling.presence_penalty = i % 2 ? 0.8f : 0.0f;
			r.sampling.frequency_penalty = i % 2 ? 0.5f : 0.0f;
			r.sampling.repetition_penalty = i % 4 == 1 ? 1.3f : 1.0f;
		}
		if (sampled == 1) {
			r.sampling.logprobs = i % 2 == 0;
			r.sampling.top_logprobs = i % 2 == 0 ? NTOP : 0;
			r.sampling.logprobs_mode = i % 4 == 2 ? FP4S_SAMP_LOGPROBS_PROCESSED : FP4S_SAMP_LOGPROBS_RAW;
		}
		if (fp4s_engine_submit(e, &r, &ids[i], &err)) {
			fprintf(stderr, "submit: %s\n", err.msg);
			return -1;
		}
		o->n[i] = 0;
		o->fin[i] = FP4S_FINISH_NONE;
	}
	for (int guard = 0; fp4s_engine_pending(e) > 0; guard++) {
		const struct fp4s_event *ev;
		const int n = fp4s_engine_step(e, &ev, &err);
		if (n < 0 || guard > 100000) {
			fprintf(stderr, "step: %s\n", n < 0 ? err.msg : "no progress");
			return -1;
		}
		for (int k = 0; k < n; k++)
			for (int i = first; i < first + count; i++) {
				if (ev[k].id != ids[i])
					continue;
				if (ev[k].token >= 0 && o->n[i] < NGEN) {
					const int t = o->n[i]++;
					o->tok[i][t] = ev[k].token;
					o->lp[i][t] = ev[k].sample.logprob;
					for (int q = 0; q < NTOP; q++) {
						const int have = q < ev[k].sample.n_top;
						o->alt[i][t][q] = have ? ev[k].sample.top[q].token : -1;
						o->altlp[i][t][q] = have ? ev[k].sample.top[q].logprob : -INFINITY;
					}
				}
				if (ev[k].finish)
					o->fin[i] = ev[k].finish;
			}
	}
	const struct fp4s_event *ev;
	fp4s_engine_step(e, &ev, &err); /* frees the finished requests */
	return 0;
}

/* b against the alone run a: see the header. Counts requests equal throughout and near ties. */
static void compare(const char *what, const char *preset, const struct outs *a, const struct outs *b, int allow)
{
	int equal = 0, ties = 0, bad = 0;
	for (int i = 0; i < NREQ; i++) {
		if (b->n[i] != NGEN || b->fin[i] != FP4S_FINISH_LENGTH) {
			fprintf(stderr, "%s %s request %d: %d tokens, finish %d\n", preset, what, i, b->n[i], (int)b->fin[i]);
			bad++;
			continue;
		}
		int t = 0;
		for (; t < NGEN && a->tok[i][t] == b->tok[i][t]; t++)
			if (!(fabsf(a->lp[i][t] - b->lp[i][t]) <= TOL)) {
				fprintf(stderr, "%s %s request %d step %d: logprob %.4f alone, %.4f here\n", preset, what, i, t,
				        a->lp[i][t], b->lp[i][t]);
				bad++;
				break;
			}
		if (t == NGEN) {
			equal++;
			continue;
		}
		if (t < NGEN && a->tok[i][t] != b->tok[i][t]) {
			/* the other run's token must be one of the alone run's best, within TIE */
			int q = 0;
			while (q < NTOP && a->alt[i][t][q] != b->tok[i][t])
				q++;
			if (q < NTOP && a->lp[i][t] - a->altlp[i][t][q] <= TIE) {
				ties++;
			} else {
				fprintf(stderr, "%s %s request %d step %d: token %d alone (logprob %.4f), %d here (%s)\n", preset,
				        what, i, t, a->tok[i][t], a->lp[i][t], b->tok[i][t],
				        q < NTOP ? "further than the tie tolerance" : "not among the alone run's best");
				bad++;
			}
		}
	}
	printf("%s %s: %d of %d requests equal to their alone run, %d part at a near tie, %d wrong\n", preset, what,
	       equal, NREQ, ties, bad);
	CHECK_MSG(bad <= allow, "%s %s: %d requests differ beyond the tolerance (%d allowed)", preset, what, bad, allow);
	/* a check that passed only through ties would say little. The requests allowed to differ
	 * (MoE: an expert flipped at a router near-tie) cannot be equal throughout either, so they
	 * come off the count (FP4S_TEST_SEED=0x18ebf5bb988baa1c: tiny-qwen3-moe prefix-cached, 47
	 * equal, 11 near ties, 6 flips on the H100) */
	CHECK_MSG(equal >= (NREQ - allow) * 3 / 4, "%s %s: only %d of %d requests equal throughout (%d allowed to differ)",
	          preset, what, equal, NREQ, allow);
}

static void test_preset(const char *preset, const char *format)
{
	char dir[256];
	struct fp4s_error err = {0};
	struct fp4s_write_opts wo = {};
	wo.seed = 11;
	snprintf(dir, sizeof dir, "/tmp/fp4s-test-engine-cuda-%d-%s", (int)getpid(), preset);
	CHECK(fp4s_qformat_parse(format, &wo.format) == 0);
	if (fp4s_gen(preset, dir, &wo, &err)) {
		CHECK_MSG(0, "gen %s: %s", preset, err.msg);
		return;
	}
	struct fp4s_engine_opts o = {};
	o.model = dir;
	o.backend = "cuda";
	o.max_seqs = 1;
	o.max_ctx = 256;
	struct fp4s_engine *alone = NULL, *batch = NULL, *tight = NULL;
	if (fp4s_engine_open(&o, &alone, &err)) {
		CHECK_MSG(0, "open %s: %s", preset, err.msg);
		return;
	}
	const int32_t V = (int32_t)fp4s_engine_model(alone)->cfg.vocab;
	for (int i = 0; i < NREQ; i++) {
		plen[i] = 5 + (int32_t)(t_rand_u64() % 116);
		for (int j = 0; j < plen[i]; j++)
			prompts[i][j] = 3 + (int32_t)(t_rand_u64() % (uint64_t)(V - 3));
	}
	static struct outs a, b;
	for (int i = 0; i < NREQ; i++)
		CHECK(run(alone, i, 1, &a) == 0);
	/* perplexity: scored where the logits are and on the host (FP4S_DEVICE_SAMPLE=0), the same
	 * forward passes: the sums agree to their order */
	{
		int32_t toks[300];
		for (int i = 0; i < 300; i++)
			toks[i] = 3 + (int32_t)(t_rand_u64() % (uint64_t)(V - 3));
		double sd = 0, qd = 0, sh = 0, qh = 0;
		int64_t nd = 0, nh = 0;
		CHECK(fp4s_engine_score(alone, toks, 300, 128, &sd, &qd, &nd, &err) == 0);
		setenv("FP4S_DEVICE_SAMPLE", "0", 1);
		CHECK(fp4s_engine_score(alone, toks, 300, 128, &sh, &qh, &nh, &err) == 0);
		unsetenv("FP4S_DEVICE_SAMPLE");
		printf("%s perplexity: %lld tokens, mean nll %.9f on the device, %.9f on the host\n", preset, (long long)nd,
		       nd ? sd / (double)nd : 0.0, nh ? sh / (double)nh : 0.0);
		CHECK_MSG(nd > 250 && nh == nd && fabs(sd - sh) <= 1e-6 * fabs(sh) && fabs(qd - qh) <= 1e-6 * fabs(qh),
		          "%s perplexity: %lld / %lld tokens, nll sum %.9g on the device, %.9g on the host", preset,
		          (long long)nd, (long long)nh, sd, sh);
	}
	const int flips = strstr(preset, "moe") || strstr(preset, "gpt-oss") ? MOE_FLIPS : 0;

	/* 64 in flight, chunked prefill mixed with decode */
	o.max_seqs = NREQ;
	o.max_batch_tokens = 64;
	CHECK(fp4s_engine_open(&o, &batch, &err) == 0);
	int32_t used, total;
	int64_t pre, hits, looks;
	if (batch) {
		CHECK(run(batch, 0, NREQ, &b) == 0);
		compare("batched", preset, &a, &b, flips);
		/* the same requests again: their full prompt blocks are in the cache now */
		int64_t hits0;
		fp4s_engine_kv_usage(batch, &used, &total, &pre, &hits0, &looks);
		CHECK(run(batch, 0, NREQ, &b) == 0);
		fp4s_engine_kv_usage(batch, &used, &total, &pre, &hits, &looks);
		printf("%s prefix cache: %lld hits on the second pass\n", preset, (long long)(hits - hits0));
		CHECK_MSG(hits - hits0 >= NREQ / 2, "%s: %lld prefix-cache hits", preset, (long long)(hits - hits0));
		compare("prefix-cached", preset, &a, &b, flips);
		CHECK_EQ_INT(used, 0);
		/* sampled requests: drawn on the device (this engine) and on the host (an engine opened
		 * with FP4S_DEVICE_SAMPLE=0) from the same logits, the tokens must be the same */
		static struct outs d, h;
		CHECK(run(batch, 0, NREQ, &d, 1) == 0);
		setenv("FP4S_DEVICE_SAMPLE", "0", 1);
		struct fp4s_engine *host = NULL;
		CHECK(fp4s_engine_open(&o, &host, &err) == 0);
		unsetenv("FP4S_DEVICE_SAMPLE");
		if (host) {
			CHECK(run(host, 0, NREQ, &h, 1) == 0);
			CHECK(run(host, 0, NREQ, &h, 1) == 0); /* as d's: prompt blocks from the prefix cache */
			int same = 0, lp_bad = 0;
			float lp_max = 0.0f;
			for (int i = 0; i < NREQ; i++) {
				const int eq = d.n[i] == NGEN && h.n[i] == NGEN && !memcmp(d.tok[i], h.tok[i], sizeof d.tok[i]);
				same += eq;
				/* the same logits: the raw logprobs agree to the sums' rounding, the alternatives
				 * exactly */
				for (int t = 0; eq && t < NGEN; t++) {
					float dl = fabsf(d.lp[i][t] - h.lp[i][t]);
					int alt_eq = 1;
					for (int q = 0; q < NTOP; q++) {
						alt_eq &= d.alt[i][t][q] == h.alt[i][t][q];
						if (d.alt[i][t][q] >= 0)
							dl = fmaxf(dl, fabsf(d.altlp[i][t][q] - h.altlp[i][t][q]));
					}
					lp_max = fmaxf(lp_max, dl);
					lp_bad += !alt_eq || !(dl <= 1e-5f) || (i % 2 == 0) != (d.alt[i][t][0] >= 0);
				}
			}
			printf("%s sampled: %d of %d requests drew the same tokens on the device and on the host; logprobs "
			       "within %.2g, %d steps differ\n",
			       preset, same, NREQ, (double)lp_max, lp_bad);
			CHECK_MSG(lp_bad == 0, "%s: %d sampled steps' logprobs differ between device and host", preset, lp_bad);
			CHECK_MSG(same >= NREQ - flips, "%s: %d of %d sampled requests differ between device and host", preset,
			          NREQ - same, NREQ);
		}
		fp4s_engine_close(host);
	}

	/* Steps enqueued ahead (engine_opts' lookahead, on by default on a GPU) take plain greedy
	 * requests (no logprobs) and ones drawn on the device without logprobs (penalties too): the
	 * same kernels run, the tokens fed on the device, so the tokens must be the same as without,
	 * one request at a time; 64 together, where the batches' rows may differ at their ends, all
	 * but MoE flips. Alone, a step's argmax or draw (its row and edits copied up inside the
	 * graph) runs inside the step's graph and advances the position there, so the next step
	 * copies nothing up (the backend's graph_run_argmax / graph_run_sample); without steps
	 * ahead, neither. */
	for (int pass = 0; pass < 6; pass++) {
		/* greedy, sampled, sampled without edits; alone or 64 */
		const int kind = pass >= 4 ? 4 : pass >= 2 ? 3 : 2, together = pass % 2;
		const char *kn = kind == 4 ? ", sampled plain" : kind == 3 ? ", sampled" : "";
		struct fp4s_engine_opts lo = o;
		lo.max_seqs = together ? NREQ : 1;
		lo.max_batch_tokens = together ? 64 : 0;
		lo.lookahead = -1;
		struct fp4s_engine *plain = NULL, *la = NULL;
		CHECK(fp4s_engine_open(&lo, &plain, &err) == 0);
		lo.lookahead = 0; /* the default: on, the backend being asynchronous */
		CHECK(fp4s_engine_open(&lo, &la, &err) == 0);
		if (plain && la) {
			static struct outs p1, q1;
			for (int i = 0; i < NREQ; i += together ? NREQ : 1) {
				CHECK(run(plain, i, together ? NREQ : 1, &p1, kind) == 0);
				CHECK(run(la, i, together ? NREQ : 1, &q1, kind) == 0);
			}
			int same = 0;
			for (int i = 0; i < NREQ; i++)
				same += p1.n[i] == NGEN && q1.n[i] == NGEN && !memcmp(p1.tok[i], q1.tok[i], sizeof p1.tok[i]);
			int64_t taken = 0, dropped = 0;
			CHECK_EQ_INT(fp4s_engine_lookahead(la, &taken, &dropped), 1);
			printf("%s steps ahead%s%s: %d of %d requests the same as without; %lld steps taken ahead, %lld "
			       "dropped\n", preset, kn, together ? " (64 together)" : "", same, NREQ,
			       (long long)taken, (long long)dropped);
			CHECK_MSG(same >= NREQ - (together ? flips : 0), "%s: %d of %d requests differ with steps ahead%s%s",
			          preset, NREQ - same, NREQ, kn, together ? " (64 together)" : "");
			CHECK_MSG(taken >= (together ? 1 : NREQ * (NGEN - 2)), "%s: %lld steps taken ahead", preset,
			          (long long)taken);
		}
		fp4s_engine_close(plain);
		fp4s_engine_close(la);
	}

	/* memory pressure: an eighth of the blocks the batch needs at its end, and steps of 16
	 * tokens (a request outside the step's batch is what can be preempted; with a third of the
	 * blocks, the 16 oldest requests a step always fitted and none was) */
	int need = 0, most = 0;
	for (int i = 0; i < NREQ; i++) {
		const int nb = (plen[i] + NGEN + 15) / 16;
		need += nb;
		most = nb > most ? nb : most;
	}
	o.kv_blocks = need / 8 > 2 * most ? need / 8 : 2 * most;
	o.max_batch_tokens = 16;
	o.no_prefix_caching = 1;
	CHECK(fp4s_engine_open(&o, &tight, &err) == 0);
	if (tight) {
		CHECK(run(tight, 0, NREQ, &b) == 0);
		fp4s_engine_kv_usage(tight, &used, &total, &pre, &hits, &looks);
		printf("%s KV pressure: %d blocks for %d needed, %lld preemptions\n", preset, total, need, (long long)pre);
		CHECK_MSG(pre > 0, "%s: no preemption with %d blocks", preset, total);
		compare("preempted", preset, &a, &b, flips);
		CHECK_EQ_INT(used, 0);
	}
	fp4s_engine_close(tight);
	fp4s_engine_close(batch);
	fp4s_engine_close(alone);
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	CHECK(system(cmd) == 0);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0); /* a run cut off by a time limit still shows how far it got */
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)
		TEST_SKIP("no CUDA device");
	t_seed_from_env();
	const char *filter = argc > 1 ? argv[1] : NULL;
	const char *presets[][2] = {{"tiny-llama3", "nvfp4"}, {"tiny-qwen3", "nvfp4"}, {"tiny-qwen3-moe", "nvfp4"},
	                            {"tiny-gpt-oss", "mxfp4"}};
	for (int p = 0; p < 4; p++)
		if (!filter || strstr(presets[p][0], filter))
			test_preset(presets[p][0], presets[p][1]);
	return TEST_DONE();
}
