/* test_engine.c: the engine API on `gen` tiny models (random weights, real tokenizers of byte
 * BPE): batch invariance (a request's greedy tokens are the same alone and among others, with
 * chunked prefill), seeded sampling reproducibility under concurrency, max_tokens, stop strings,
 * cancellation, bad requests, scoring, preemption under KV-pool pressure (same outputs, blocks
 * all returned), prefix-cache hits (same output as a miss) and the FP8 KV cache option. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/forward.h"
#include "model/mwrite.h"
#include "test_util.h"

#define NREQ 4
#define NGEN 20

struct run_out {
	int32_t tokens[NREQ][NGEN + 1];
	int32_t n[NREQ];
	enum fp4s_finish finish[NREQ];
	char text[NREQ][4096];
	size_t text_len[NREQ];
};

/* engine_opts' lookahead for every engine of a pass: the second pass enqueues each greedy
 * decode step before the last one's tokens are read, which the CPU backend then runs at once */
static int g_la = -1;

static int32_t prompts[NREQ][40];
static int32_t prompt_len[NREQ] = {5, 17, 33, 9};

/* Runs requests [first, first+count) together on an engine; fills out. */
static int run_batch(struct fp4s_engine *e, int first, int count, const struct fp4s_request *tmpl,
                     struct run_out *out)
{
	struct fp4s_error err = {0};
	int64_t ids[NREQ];
	for (int i = first; i < first + count; i++) {
		struct fp4s_request r = *tmpl;
		r.prompt = prompts[i];
		r.n_prompt = prompt_len[i];
		if (fp4s_engine_submit(e, &r, &ids[i], &err)) {
			fprintf(stderr, "submit: %s\n", err.msg);
			return -1;
		}
		out->n[i] = 0;
		out->text_len[i] = 0;
		out->finish[i] = FP4S_FINISH_NONE;
	}
	int guard = 0;
	while (fp4s_engine_pending(e) > 0 && guard++ < 10000) {
		const struct fp4s_event *ev;
		int n = fp4s_engine_step(e, &ev, &err);
		if (n < 0) {
			fprintf(stderr, "step: %s\n", err.msg);
			return -1;
		}
		for (int k = 0; k < n; k++)
			for (int i = first; i < first + count; i++)
				if (ev[k].id == ids[i]) {
					if (ev[k].token >= 0 && out->n[i] <= NGEN)
						out->tokens[i][out->n[i]++] = ev[k].token;
					if (out->text_len[i] + ev[k].text_len < sizeof out->text[i]) {
						memcpy(out->text[i] + out->text_len[i], ev[k].text, ev[k].text_len);
						out->text_len[i] += ev[k].text_len;
					}
					if (ev[k].finish)
						out->finish[i] = ev[k].finish;
				}
	}
	/* one more step frees the finished requests */
	const struct fp4s_event *ev;
	fp4s_engine_step(e, &ev, &err);
	return 0;
}

/* With steps enqueued ahead: the same greedy tokens as an engine without (alone: `a`, from
 * the caller's engine of one slot; batched; a request joining another mid-decode; a stop string
 * that ends a request with a step in flight), and steps were taken ahead and dropped. */
static void lookahead_checks(const char *dir, const struct fp4s_engine_opts *o, const struct fp4s_request *req,
                             const struct run_out *a)
{
	struct fp4s_error err = {0};
	struct fp4s_engine_opts po = *o;
	po.lookahead = -1;
	po.max_seqs = NREQ;
	struct fp4s_engine *plain, *la;
	CHECK(fp4s_engine_open(&po, &plain, &err) == 0);
	po.lookahead = 1;
	CHECK(fp4s_engine_open(&po, &la, &err) == 0);
	CHECK_EQ_INT(fp4s_engine_lookahead(plain, NULL, NULL), 0);
	CHECK_EQ_INT(fp4s_engine_lookahead(la, NULL, NULL), 1);
	static struct run_out b, c;
	CHECK(run_batch(la, 0, NREQ, req, &b) == 0);
	CHECK(run_batch(plain, 0, NREQ, req, &c) == 0);
	for (int i = 0; i < NREQ; i++)
		CHECK_MSG(b.n[i] == NGEN && a->n[i] == NGEN && !memcmp(a->tokens[i], b.tokens[i], sizeof(int32_t) * NGEN) &&
		          !memcmp(c.tokens[i], b.tokens[i], sizeof(int32_t) * NGEN) && b.finish[i] == FP4S_FINISH_LENGTH &&
		          b.text_len[i] == a->text_len[i] && !memcmp(b.text[i], a->text[i], b.text_len[i]),
		          "%s: request %d: greedy tokens differ with steps ahead", dir, i);
	int64_t taken = 0, dropped = 0;
	fp4s_engine_lookahead(la, &taken, &dropped);
	CHECK_MSG(taken >= NGEN / 2, "%s: %lld steps taken ahead", dir, (long long)taken);
	/* two slots for the four requests: while two wait, every slot is taken, so steps still go
	 * ahead; each request gets its alone tokens, the waiting ones coming in as slots free */
	{
		struct fp4s_engine_opts o2 = po;
		o2.max_seqs = 2;
		struct fp4s_engine *la2 = NULL;
		CHECK(fp4s_engine_open(&o2, &la2, &err) == 0);
		if (la2) {
			CHECK(run_batch(la2, 0, NREQ, req, &b) == 0);
			int64_t t2 = 0;
			fp4s_engine_lookahead(la2, &t2, NULL);
			for (int i = 0; i < NREQ; i++)
				CHECK_MSG(b.n[i] == NGEN && !memcmp(a->tokens[i], b.tokens[i], sizeof(int32_t) * NGEN),
				          "%s: request %d of 4 on 2 slots differs with steps ahead", dir, i);
			CHECK_MSG(t2 >= NGEN, "%s: 4 requests on 2 slots: %lld steps taken ahead", dir, (long long)t2);
			fp4s_engine_close(la2);
		}
	}
	/* request 1 decodes alone for 5 tokens, then request 3 joins (its prompt in chunks) */
	{
		int64_t id1, id3;
		struct fp4s_request r1 = *req, r3 = *req;
		r1.prompt = prompts[1], r1.n_prompt = prompt_len[1];
		r3.prompt = prompts[3], r3.n_prompt = prompt_len[3];
		CHECK(fp4s_engine_submit(la, &r1, &id1, &err) == 0);
		int32_t t1[NGEN + 1], t3[NGEN + 1], n1 = 0, n3 = 0;
		for (int step = 0; step < 400 && fp4s_engine_pending(la) > 0; step++) {
			if (n1 == 5 && !n3 && step < 200) {
				CHECK(fp4s_engine_submit(la, &r3, &id3, &err) == 0);
				n3 = -1; /* submitted */
			}
			const struct fp4s_event *ev;
			const int n = fp4s_engine_step(la, &ev, &err);
			CHECK_MSG(n >= 0, "step: %s", err.msg);
			for (int k = 0; k < n; k++) {
				if (ev[k].id == id1 && ev[k].token >= 0 && n1 <= NGEN)
					t1[n1++] = ev[k].token;
				if (n3 != 0 && ev[k].id == id3 && ev[k].token >= 0 && n3 <= NGEN)
					n3 = n3 < 0 ? 0 : n3, t3[n3++] = ev[k].token;
			}
		}
		const struct fp4s_event *ev;
		fp4s_engine_step(la, &ev, &err);
		CHECK_MSG(n1 == NGEN && !memcmp(t1, a->tokens[1], sizeof(int32_t) * NGEN) && n3 == NGEN &&
		          !memcmp(t3, a->tokens[3], sizeof(int32_t) * NGEN),
		          "%s: a request joining one that decodes ahead: %d and %d tokens, or other ones", dir, n1, n3);
	}
	/* a stop string at the 8th token's text: the request ends with its next step in flight */
	if (a->text_len[0] >= 12) {
		struct fp4s_request rs = *req;
		char stop[8];
		size_t at = a->text_len[0] / 2;
		while (at + 3 <= a->text_len[0] && memchr(a->text[0] + at, 0, 3))
			at++;
		if (at + 3 <= a->text_len[0]) {
			memcpy(stop, a->text[0] + at, 3);
			stop[3] = 0;
			rs.n_stop = 1;
			rs.stop[0] = stop;
			CHECK(run_batch(la, 0, 1, &rs, &b) == 0);
			CHECK(run_batch(plain, 0, 1, &rs, &c) == 0);
			CHECK_EQ_INT(b.finish[0], FP4S_FINISH_STOP);
			CHECK_MSG(b.n[0] == c.n[0] && b.text_len[0] == c.text_len[0] &&
			          !memcmp(b.text[0], c.text[0], b.text_len[0]),
			          "%s: a stop with a step ahead: %d tokens / %zu bytes, %d / %zu without", dir, b.n[0],
			          b.text_len[0], c.n[0], c.text_len[0]);
			int32_t used, total;
			int64_t pre, hits, looks, dropped2 = 0;
			fp4s_engine_kv_usage(la, &used, &total, &pre, &hits, &looks);
			fp4s_engine_lookahead(la, NULL, &dropped2);
			CHECK_MSG(dropped2 > dropped, "%s: no step ahead dropped at a stop", dir);
			CHECK_EQ_INT(used, 0);
		}
	}
	/* sampled requests (seeded; top_p, a bias, min_tokens with EOS masked, and greedy with a
	 * bias): drawn where the logits are with the next step enqueued before the token is read,
	 * the same tokens as one step at a time, batched; requests with penalties too (the step
	 * ahead counts the token fed to it) */
	for (int variant = 0; variant < 5; variant++) {
		struct fp4s_request rq = *req;
		rq.sampling.temperature = variant == 2 ? 0.0f : 0.8f;
		rq.sampling.top_p = variant == 0 ? 0.9f : 1.0f;
		rq.sampling.min_p = variant == 1 ? 0.05f : 0.0f;
		rq.sampling.min_tokens = 3;
		rq.sampling.has_seed = true;
		rq.sampling.seed = 1000 + (uint64_t)variant;
		rq.sampling.n_logit_bias = 1;
		rq.sampling.logit_bias[0] = (struct fp4s_samp_bias){(int32_t)(prompts[0][1] % 64), 2.5f};
		if (variant >= 3) {
			/* a likely stop id, masked for the first 3 tokens: the requests end soon after (or at)
			 * the 3rd, and a step ahead must plan the mask for the token after the one in flight */
			rq.sampling.temperature = variant == 3 ? 0.8f : 0.0f;
			rq.sampling.n_stop_ids = 1;
			rq.sampling.stop_ids[0] = rq.sampling.logit_bias[0].token;
			rq.sampling.logit_bias[0].bias = 7.0f;
		}
		int64_t taken0 = 0, taken1 = 0;
		fp4s_engine_lookahead(la, &taken0, NULL);
		CHECK(run_batch(la, 0, NREQ, &rq, &b) == 0);
		CHECK(run_batch(plain, 0, NREQ, &rq, &c) == 0);
		fp4s_engine_lookahead(la, &taken1, NULL);
		for (int i = 0; i < NREQ; i++)
			CHECK_MSG(b.n[i] == c.n[i] && b.n[i] > 0 && !memcmp(c.tokens[i], b.tokens[i], sizeof(int32_t) * b.n[i]) &&
			              b.finish[i] == c.finish[i],
			          "%s: sampled variant %d request %d: %d tokens, %d without steps ahead, or other ones", dir,
			          variant, i, b.n[i], c.n[i]);
		CHECK_MSG(taken1 - taken0 >= (variant >= 3 ? 1 : NGEN / 2), "%s: sampled variant %d: %lld steps taken ahead",
		          dir, variant, (long long)(taken1 - taken0));
		if (variant <= 2) {
			/* strong penalties, so that the token fed to a step changes what it draws */
			rq.sampling.presence_penalty = 1.5f;
			rq.sampling.frequency_penalty = 2.0f;
			rq.sampling.repetition_penalty = variant == 1 ? 3.0f : 1.0f;
			fp4s_engine_lookahead(la, &taken0, NULL);
			CHECK(run_batch(la, 0, NREQ, &rq, &b) == 0);
			CHECK(run_batch(plain, 0, NREQ, &rq, &c) == 0);
			fp4s_engine_lookahead(la, &taken1, NULL);
			for (int i = 0; i < NREQ; i++)
				CHECK_MSG(b.n[i] == c.n[i] && b.n[i] > 0 && !memcmp(c.tokens[i], b.tokens[i], sizeof(int32_t) * b.n[i]),
				          "%s: penalised variant %d request %d differs with steps ahead", dir, variant, i);
			CHECK_MSG(taken1 - taken0 >= NGEN / 2, "%s: penalised variant %d: %lld steps taken ahead", dir, variant,
			          (long long)(taken1 - taken0));
		}
	}
	/* the forward pass alone (slot 0, no requests): greedy from a prompt token one step at a time,
	 * against launches fed from the last one, read one behind and at once, and a fed launch
	 * after its feeder was read; the fed batch of more rows than found is refused */
	{
		struct fp4s_fwd *f = fp4s_engine_fwd(plain);
		int32_t want[8], got[8], t = prompts[0][0], pos = 0, seq = 0, row = 0, t2 = 0;
		for (int i = 0; i < 8; i++) {
			const struct fp4s_batch b1 = {1, &t, &pos, &seq, NULL, 0};
			pos = i;
			CHECK(fp4s_fwd_run_argmax(f, &b1, &row, 1, &want[i], &err) == 0);
			t = want[i];
		}
		t = prompts[0][0], pos = 0;
		const struct fp4s_batch b0 = {1, &t, &pos, &seq, NULL, 0};
		CHECK(fp4s_fwd_launch_argmax(f, &b0, &row, 1, &err) == 0);
		for (int i = 1; i < 8; i++) {
			pos = i;
			const struct fp4s_batch bf = {1, NULL, &pos, &seq, NULL, 0};
			CHECK(fp4s_fwd_launch_argmax(f, &bf, &row, 1, &err) == 0);
			CHECK(fp4s_fwd_collect(f, &got[i - 1], &err) == 0);
			if (i == 4) { /* the last read too: nothing outstanding, then a fed launch */
				CHECK(fp4s_fwd_collect(f, &got[i], &err) == 0);
				pos = ++i;
				CHECK(fp4s_fwd_launch_argmax(f, &bf, &row, 1, &err) == 0);
			}
		}
		CHECK(fp4s_fwd_collect(f, &got[7], &err) == 0);
		CHECK_MSG(!memcmp(want, got, sizeof want), "%s: launched and fed steps differ from one at a time", dir);
		CHECK(fp4s_fwd_collect(f, &t2, &err) != 0); /* nothing launched */
		int32_t p2[2] = {8, 8}, s2[2] = {0, 1}, r2[2] = {0, 1};
		const struct fp4s_batch b2 = {2, NULL, p2, s2, NULL, 0};
		CHECK(fp4s_fwd_launch_argmax(f, &b2, r2, 2, &err) == FP4S_EINVAL);
	}
	fp4s_engine_close(plain);
	fp4s_engine_close(la);
}

static void test_model(const char *preset, const char *format)
{
	char dir[256];
	struct fp4s_error err = {0};
	struct fp4s_write_opts wo = {.seed = 7};
	snprintf(dir, sizeof dir, "/tmp/fp4s-test-engine-%d-%s-%s", (int)getpid(), preset, format);
	CHECK(fp4s_qformat_parse(format, &wo.format) == 0);
	if (fp4s_gen(preset, dir, &wo, &err)) {
		CHECK_MSG(0, "gen %s: %s", preset, err.msg);
		return;
	}
	/* the CPU reference: batch invariance is exact there by construction */
	struct fp4s_engine_opts o = {.model = dir, .backend = "cpu", .max_seqs = 1, .max_ctx = 128, .lookahead = g_la};
	struct fp4s_engine *alone, *together;
	if (fp4s_engine_open(&o, &alone, &err)) {
		CHECK_MSG(0, "open %s: %s", preset, err.msg);
		return;
	}
	o.max_seqs = NREQ;
	o.max_batch_tokens = 7; /* forces chunked prefill mixed with decode */
	CHECK(fp4s_engine_open(&o, &together, &err) == 0);
	const int32_t V = (int32_t)fp4s_engine_model(alone)->cfg.vocab;
	for (int i = 0; i < NREQ; i++)
		for (int j = 0; j < prompt_len[i]; j++)
			prompts[i][j] = 3 + (int32_t)(t_rand_u64() % (uint64_t)(V - 3));
	struct fp4s_request req;
	fp4s_request_defaults(&req);
	req.sampling.temperature = 0;
	req.sampling.max_tokens = NGEN;
	req.sampling.ignore_eos = true;
	static struct run_out a, b;
	for (int i = 0; i < NREQ; i++)
		CHECK(run_batch(alone, i, 1, &req, &a) == 0);
	CHECK(run_batch(together, 0, NREQ, &req, &b) == 0);
	for (int i = 0; i < NREQ; i++) {
		CHECK_EQ_INT(a.n[i], NGEN);
		CHECK_EQ_INT(a.finish[i], FP4S_FINISH_LENGTH);
		CHECK_MSG(a.n[i] == b.n[i] && memcmp(a.tokens[i], b.tokens[i], sizeof(int32_t) * (size_t)a.n[i]) == 0,
		          "%s/%s request %d: greedy tokens differ alone and batched", preset, format, i);
		CHECK(a.text_len[i] == b.text_len[i] && memcmp(a.text[i], b.text[i], a.text_len[i]) == 0);
	}
	if (g_la > 0)
		lookahead_checks(dir, &o, &req, &a);
	/* seeded sampling: the same under concurrency, different for another seed */
	req.sampling.temperature = 1.0f;
	req.sampling.has_seed = true;
	req.sampling.seed = 42;
	for (int i = 0; i < NREQ; i++)
		CHECK(run_batch(alone, i, 1, &req, &a) == 0);
	CHECK(run_batch(together, 0, NREQ, &req, &b) == 0);
	int same = 1;
	for (int i = 0; i < NREQ; i++)
		same &= a.n[i] == b.n[i] && !memcmp(a.tokens[i], b.tokens[i], sizeof(int32_t) * (size_t)a.n[i]);
	CHECK_MSG(same, "%s: seeded sampling differs under concurrency", preset);
	req.sampling.seed = 43;
	CHECK(run_batch(together, 0, NREQ, &req, &b) == 0);
	int differ = 0;
	for (int i = 0; i < NREQ; i++)
		differ |= memcmp(a.tokens[i], b.tokens[i], sizeof(int32_t) * NGEN) != 0;
	CHECK(differ);
	/* a stop string cut from the middle of the greedy text ends the request right before it */
	req.sampling.temperature = 0;
	req.sampling.has_seed = false;
	CHECK(run_batch(alone, 1, 1, &req, &a) == 0);
	/* A stop is a C string, so the 4 bytes are taken where the text has no NUL
	 * (random tiny models do emit byte 0x00; a cut one would be a shorter stop). */
	size_t at = a.text_len[1] / 2;
	while (at + 4 <= a.text_len[1] && memchr(a.text[1] + at, 0, 4))
		at++;
	if (a.text_len[1] >= 12 && at + 4 <= a.text_len[1]) {
		char stop[8];
		memcpy(stop, a.text[1] + at, 4);
		stop[4] = 0;
		/* the first occurrence decides */
		char *first = memmem(a.text[1], a.text_len[1], stop, 4);
		const size_t want = first ? (size_t)(first - a.text[1]) : at;
		struct fp4s_request rs = req;
		rs.n_stop = 1;
		rs.stop[0] = stop;
		CHECK(run_batch(alone, 1, 1, &rs, &b) == 0);
		CHECK_EQ_INT(b.finish[1], FP4S_FINISH_STOP);
		CHECK_MSG(b.text_len[1] == want && memcmp(b.text[1], a.text[1], want) == 0,
		          "%s: stop string: got %zu bytes, want %zu", preset, b.text_len[1], want);
	}
	/* cancel one of two: it ends CANCELLED, the other runs to its length */
	{
		int64_t id1, id2;
		struct fp4s_request r1 = req, r2 = req;
		r1.prompt = prompts[0], r1.n_prompt = prompt_len[0];
		r2.prompt = prompts[1], r2.n_prompt = prompt_len[1];
		CHECK(fp4s_engine_submit(together, &r1, &id1, &err) == 0);
		CHECK(fp4s_engine_submit(together, &r2, &id2, &err) == 0);
		const struct fp4s_event *ev;
		int cancelled = 0, n2 = 0, fin2 = 0;
		for (int step = 0; step < 200 && fp4s_engine_pending(together) > 0; step++) {
			if (step == 3)
				CHECK(fp4s_engine_cancel(together, id1) == 0);
			int n = fp4s_engine_step(together, &ev, &err);
			for (int k = 0; k < n; k++) {
				if (ev[k].id == id1 && ev[k].finish == FP4S_FINISH_CANCELLED)
					cancelled = 1;
				if (ev[k].id == id2 && ev[k].token >= 0)
					n2++;
				if (ev[k].id == id2 && ev[k].finish)
					fin2 = ev[k].finish;
			}
		}
		fp4s_engine_step(together, &ev, &err);
		CHECK(cancelled);
		CHECK_EQ_INT(n2, NGEN);
		CHECK_EQ_INT(fin2, FP4S_FINISH_LENGTH);
		CHECK_EQ_INT(fp4s_engine_pending(together), 0);
		CHECK_EQ_INT(fp4s_engine_cancel(together, id1), -1);
	}
	/* bad requests */
	{
		int64_t id;
		struct fp4s_request bad = req;
		int32_t big[200] = {0}, oov = V;
		bad.n_prompt = 0;
		CHECK_EQ_INT(fp4s_engine_submit(alone, &bad, &id, &err), FP4S_EINVAL);
		bad.prompt = big, bad.n_prompt = 200;
		CHECK_EQ_INT(fp4s_engine_submit(alone, &bad, &id, &err), FP4S_EINVAL);
		CHECK(strstr(err.msg, "context length") != NULL);
		bad.prompt = &oov, bad.n_prompt = 1;
		CHECK_EQ_INT(fp4s_engine_submit(alone, &bad, &id, &err), FP4S_EINVAL);
		CHECK(strstr(err.msg, "vocabulary") != NULL);
		bad.prompt = prompts[0], bad.n_prompt = 3;
		bad.sampling.top_p = 0;
		CHECK_EQ_INT(fp4s_engine_submit(alone, &bad, &id, &err), FP4S_EINVAL);
		CHECK(strstr(err.msg, "top_p") != NULL);
	}
	/* scoring: finite, and a random-weight model is near-uniform: perplexity near V */
	{
		double nll, nll2;
		int64_t n;
		CHECK(fp4s_engine_score(alone, prompts[2], prompt_len[2], 16, &nll, &nll2, &n, &err) == 0);
		CHECK_EQ_INT(n, 30); /* chunks of 16, 16 and 1 tokens: 15 + 15 + 0 scored */
		double ppl = exp(nll / (double)n);
		CHECK_MSG(ppl > V / 4.0 && ppl < V * 4.0, "%s: perplexity %.1f for vocab %d", preset, ppl, V);
	}
	/* memory pressure: a KV pool far smaller than the batch needs; the newest requests are
	 * preempted and recomputed, and every request still gives its alone-greedy output */
	{
		struct fp4s_engine_opts po = o;
		po.kv_blocks = 9; /* the 4 requests need 3-4 blocks each at their end */
		po.max_batch_tokens = 16;
		po.no_prefix_caching = 1;
		struct fp4s_engine *tight;
		CHECK(fp4s_engine_open(&po, &tight, &err) == 0);
		req.sampling.temperature = 0;
		for (int i = 0; i < NREQ; i++)
			CHECK(run_batch(alone, i, 1, &req, &a) == 0);
		CHECK(run_batch(tight, 0, NREQ, &req, &b) == 0);
		int same_out = 1;
		for (int i = 0; i < NREQ; i++)
			same_out &= a.n[i] == b.n[i] && !memcmp(a.tokens[i], b.tokens[i], sizeof(int32_t) * (size_t)a.n[i]) &&
			            b.finish[i] == FP4S_FINISH_LENGTH;
		int32_t used, total;
		int64_t pre, hits, looks;
		fp4s_engine_kv_usage(tight, &used, &total, &pre, &hits, &looks);
		CHECK_MSG(same_out, "%s: outputs differ under KV pressure", preset);
		CHECK_MSG(pre > 0, "%s: no preemption happened with %d blocks", preset, total);
		CHECK_EQ_INT(used, 0);
		fp4s_engine_close(tight);
	}
	/* prefix caching: a prompt that extends an earlier one reuses its full blocks, and the
	 * output is the same as without the cache */
	{
		int32_t base[40], ext[45];
		for (int j = 0; j < 40; j++)
			base[j] = ext[j] = 3 + (int32_t)(t_rand_u64() % (uint64_t)(V - 3));
		for (int j = 40; j < 45; j++)
			ext[j] = 3 + (int32_t)(t_rand_u64() % (uint64_t)(V - 3));
		struct fp4s_engine_opts co = o;
		co.max_seqs = 2;
		struct fp4s_engine *cached, *plain;
		CHECK(fp4s_engine_open(&co, &cached, &err) == 0);
		co.no_prefix_caching = 1;
		CHECK(fp4s_engine_open(&co, &plain, &err) == 0);
		memcpy(prompts[0], base, sizeof base);
		memcpy(prompts[1], ext, sizeof ext);
		const int32_t save0 = prompt_len[0], save1 = prompt_len[1];
		prompt_len[0] = 40, prompt_len[1] = 45;
		CHECK(run_batch(cached, 0, 1, &req, &a) == 0);  /* fills the cache */
		CHECK(run_batch(cached, 1, 1, &req, &a) == 0);  /* hits it */
		CHECK(run_batch(plain, 1, 1, &req, &b) == 0);
		int32_t used, total;
		int64_t pre, hits, looks;
		fp4s_engine_kv_usage(cached, &used, &total, &pre, &hits, &looks);
		CHECK_MSG(hits >= 2, "%s: prefix cache hits %lld of %lld lookups", preset, (long long)hits,
		          (long long)looks);
		CHECK_MSG(a.n[1] == b.n[1] && !memcmp(a.tokens[1], b.tokens[1], sizeof(int32_t) * (size_t)a.n[1]),
		          "%s: a prefix-cache hit changed the output", preset);
		CHECK_EQ_INT(used, 0);
		prompt_len[0] = save0, prompt_len[1] = save1;
		fp4s_engine_close(cached);
		fp4s_engine_close(plain);
	}
	/* FP8 KV cache, by both of vLLM's names: greedy tokens are the same alone and batched with
	 * chunked prefill (E4M3 rounding is per element, so chunking caches the same bytes); an
	 * unknown type is refused with the choices named */
	{
		struct fp4s_engine_opts fo = o;
		struct fp4s_engine *f1, *fn;
		fo.kv_cache_dtype = "fp8";
		fo.max_seqs = 1;
		fo.max_batch_tokens = 0;
		CHECK(fp4s_engine_open(&fo, &f1, &err) == 0);
		fo.kv_cache_dtype = "fp8_e4m3";
		fo.max_seqs = NREQ;
		fo.max_batch_tokens = 7;
		CHECK(fp4s_engine_open(&fo, &fn, &err) == 0);
		req.sampling.temperature = 0;
		for (int i = 0; i < NREQ; i++)
			CHECK(run_batch(f1, i, 1, &req, &a) == 0);
		CHECK(run_batch(fn, 0, NREQ, &req, &b) == 0);
		for (int i = 0; i < NREQ; i++)
			CHECK_MSG(a.n[i] == NGEN && a.n[i] == b.n[i] &&
			          !memcmp(a.tokens[i], b.tokens[i], sizeof(int32_t) * (size_t)a.n[i]),
			          "%s/%s FP8 KV request %d: greedy tokens differ alone and batched", preset, format, i);
		fp4s_engine_close(f1);
		fp4s_engine_close(fn);
		fo.kv_cache_dtype = "fp8_e5m2";
		CHECK_EQ_INT(fp4s_engine_open(&fo, &f1, &err), FP4S_EINVAL);
		CHECK(strstr(err.msg, "fp8_e4m3") != NULL);
	}
	fp4s_engine_close(alone);
	fp4s_engine_close(together);
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	CHECK(system(cmd) == 0);
}

int main(void)
{
	t_seed_from_env();
	unsetenv("FP4S_LOOKAHEAD"); /* the passes set engine_opts' lookahead themselves */
	test_model("tiny-llama3", "bf16");
	test_model("tiny-qwen3", "nvfp4");
	test_model("tiny-qwen3-moe", "nvfp4-ct");
	test_model("tiny-gpt-oss", "mxfp4");
	g_la = 1;
	test_model("tiny-llama3", "bf16");
	test_model("tiny-qwen3-moe", "nvfp4-ct");
	return TEST_DONE();
}
