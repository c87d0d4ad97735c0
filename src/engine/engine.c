/* engine.c: requests, scheduling and the step loop (see engine.h).
 *
 * Scheduling per step, within max_batch_tokens: first one decode token for every running request
 * that has finished its prompt (so streams keep flowing while prompts arrive), then prefill
 * chunks, oldest request first; waiting requests take free KV slots in arrival order. A request
 * gets logits only for the last token it contributes, and only once its whole prompt is in. */
#include "engine/engine.h"
#include "engine/kv_pool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

enum req_state { REQ_FREE = 0, REQ_WAITING, REQ_RUNNING, REQ_DONE };

struct req {
	enum req_state state;
	int64_t id, order;
	int32_t slot;
	int32_t *tokens; /* prompt then generated */
	int32_t n_prompt, n_tokens, cap;
	int32_t n_computed; /* tokens whose KV is in the cache */
	struct fp4s_sampler samp;
	int32_t max_tokens;
	int32_t n_stop;
	char *stop[FP4S_ENGINE_MAX_STOP_STRINGS];
	size_t max_stop_len;
	struct fp4s_tok_stream stream;
	struct fp4s_tok_text text;  /* generated text so far */
	size_t emitted;             /* bytes of text already reported */
	int cancelled;
	int32_t *blocks;            /* its KV blocks, in position order ([table_stride]) */
	int32_t n_blocks;
	int32_t n_hashed;           /* leading full blocks registered in (or taken from) the prefix cache */
	uint64_t last_hash;         /* hash of block n_hashed - 1 */
	int64_t skip_step;          /* the step in which it found no free block */
};

struct fp4s_engine {
	struct fp4s_model model;
	struct fp4s_tokenizer *tok;
	struct fp4s_backend *be;
	struct fp4s_fwd fwd;
	int32_t max_seqs, max_ctx, max_batch;
	enum fp4s_kv_dtype kv_dtype;
	int32_t vocab;
	int32_t eos[FP4S_SAMP_MAX_EOS], n_eos;
	struct req *reqs; /* max_seqs * 4 request records (running + queued) */
	int32_t n_reqs;
	int64_t next_id, next_order;
	int32_t *slot_used;
	struct fp4s_kv_pool pool;
	int32_t *table;       /* [max_seqs][stride]: the block table the backend reads */
	int32_t stride;
	int prefix_caching;
	int64_t preemptions;
	int64_t step_no;
	/* step scratch */
	int32_t *b_tok, *b_pos, *b_seq, *b_rows;
	struct req **b_req;
	int32_t *b_live; /* a step taken from ahead: row j's request still runs */
	float *logits;
	struct fp4s_event *events;
	int32_t n_events_cap;
	/* sampling on the backend (fp4s_fwd_run_sample): a row a sampled sequence, their edits */
	int dev_sample; /* fp4s_fwd_can_sample, at open */
	struct fp4s_samp_row *s_rows;
	int32_t *s_tok;
	struct fp4s_samp_result *s_lp; /* the rows' logprobs, where asked */
	struct fp4s_samp_edit *s_edits;
	int32_t s_edits_cap;
	/* the step enqueued ahead (launch_ahead): ahead_n rows, row j request a_req[j] (id a_id[j])
	 * at position a_pos[j] of slot a_seq[j]; 0 rows: none */
	int lookahead;
	int64_t ahead_taken, ahead_dropped; /* steps enqueued ahead that were used / dropped */
	int32_t ahead_n;
	struct req **a_req;
	int64_t *a_id;
	int32_t *a_pos, *a_seq, *a_rows;
	/* a step ahead with sampled rows (its plans drew from the requests' RNGs): each row's RNG
	 * before that draw, put back when the step is dropped while its request goes on */
	int launch_sample; /* fp4s_fwd_can_launch_sample, at open */
	int a_sampled;
	uint64_t (*a_rng)[4];
};

void fp4s_request_defaults(struct fp4s_request *r)
{
	memset(r, 0, sizeof *r);
	fp4s_samp_defaults(&r->sampling);
	r->detok_flags = FP4S_TOK_SKIP_SPECIAL;
}

static int ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);
	return a >= b && strcmp(s + a - b, suffix) == 0;
}

int fp4s_engine_open(const struct fp4s_engine_opts *o, struct fp4s_engine **out,
                     struct fp4s_error *err)
{
	struct fp4s_engine *e = calloc(1, sizeof *e);
	int rc;
	if (!e)
		return fp4s_error_set(err, FP4S_ENOMEM, "engine: out of memory");
	*out = NULL;
	if (o->backend && strcmp(o->backend, "cpu") && strcmp(o->backend, "cuda") && strcmp(o->backend, "auto")) {
		free(e);
		return fp4s_error_set(err, FP4S_EINVAL, "unknown backend '%s' (auto, cpu or cuda)", o->backend);
	}
	rc = ends_with(o->model, ".bin") ? fp4s_llama2c_open(o->model, &e->model, err)
	                                 : fp4s_model_open(o->model, &e->model, err);
	if (rc) {
		free(e);
		return rc;
	}
	/* a llama2.c .bin keeps its tokenizer (tokenizer.bin, tok512.bin) in the same folder */
	char dirbuf[4096];
	const char *tpath = o->tokenizer ? o->tokenizer : o->model;
	if (!o->tokenizer && ends_with(o->model, ".bin")) {
		const char *slash = strrchr(o->model, '/');
		snprintf(dirbuf, sizeof dirbuf, "%.*s", slash ? (int)(slash - o->model) : 1,
		         slash ? o->model : ".");
		tpath = dirbuf;
	}
	if ((rc = fp4s_tok_open(&e->tok, tpath, err))) {
		fp4s_error_prefix(err, "tokenizer: ");
		goto fail;
	}
	const struct fp4s_config *c = &e->model.cfg;
	e->vocab = (int32_t)c->vocab;
	if (fp4s_tok_n_vocab(e->tok) > e->vocab) {
		rc = fp4s_error_set(err, FP4S_EFORMAT, "tokenizer has %d tokens but the model only %d",
		                    fp4s_tok_n_vocab(e->tok), e->vocab);
		goto fail;
	}
	/* EOS: the tokenizer's stop ids (generation_config.json) plus the config's */
	size_t ns = 0;
	const int32_t *stops = fp4s_tok_stop_ids(e->tok, &ns);
	for (size_t i = 0; i < ns && e->n_eos < FP4S_SAMP_MAX_EOS; i++)
		if (stops[i] >= 0 && stops[i] < e->vocab)
			e->eos[e->n_eos++] = stops[i];
	for (int32_t i = 0; i < c->n_eos && e->n_eos < FP4S_SAMP_MAX_EOS; i++) {
		int dup = 0;
		for (int32_t j = 0; j < e->n_eos; j++)
			dup |= e->eos[j] == c->eos_token_ids[i];
		if (!dup && c->eos_token_ids[i] >= 0 && c->eos_token_ids[i] < e->vocab)
			e->eos[e->n_eos++] = (int32_t)c->eos_token_ids[i];
	}
	if (e->n_eos == 0 && fp4s_tok_eos(e->tok) >= 0)
		e->eos[e->n_eos++] = fp4s_tok_eos(e->tok);
	e->max_seqs = o->max_seqs > 0 ? o->max_seqs : 4;
	e->max_ctx = o->max_ctx > 0 ? o->max_ctx : (int32_t)(c->max_pos > 0 && c->max_pos < 4096 ? c->max_pos : 4096);
	e->max_batch = o->max_batch_tokens > 0 ? o->max_batch_tokens : 512;
	if (e->max_batch < e->max_seqs)
		e->max_batch = e->max_seqs;
	/* auto (the default): the GPU when there is one, else the CPU */
	if (!o->backend || !strcmp(o->backend, "auto")) {
		struct fp4s_error e2 = {0};
		rc = fp4s_backend_cuda_create(0, &e->be, &e2);
		if (rc == FP4S_ENODEV)
			rc = fp4s_backend_cpu_create(&e->be, err);
		else if (rc)
			*err = e2;
	} else {
		rc = !strcmp(o->backend, "cuda") ? fp4s_backend_cuda_create(0, &e->be, err)
		                                 : fp4s_backend_cpu_create(&e->be, err);
	}
	if (rc)
		goto fail;
	enum fp4s_kv_dtype kv = strcmp(e->be->name, "cpu") ? FP4S_KV_BF16 : FP4S_KV_F32;
	if (o->kv_cache_dtype && strcmp(o->kv_cache_dtype, "auto")) {
		if (!strcmp(o->kv_cache_dtype, "fp32") || !strcmp(o->kv_cache_dtype, "float32"))
			kv = FP4S_KV_F32;
		else if (!strcmp(o->kv_cache_dtype, "bf16") || !strcmp(o->kv_cache_dtype, "bfloat16"))
			kv = FP4S_KV_BF16;
		else if (!strcmp(o->kv_cache_dtype, "fp8") || !strcmp(o->kv_cache_dtype, "fp8_e4m3"))
			kv = FP4S_KV_FP8; /* vLLM's names; E4M3 with scale 1.0 (backend.h) */
		else {
			rc = fp4s_error_set(err, FP4S_EINVAL, "--kv-cache-dtype must be auto, fp32, bf16 or fp8 "
			                    "(fp8_e4m3), got '%s'", o->kv_cache_dtype);
			goto fail;
		}
	}
	e->kv_dtype = kv;
	e->stride = (e->max_ctx + FP4S_KV_BLOCK - 1) / FP4S_KV_BLOCK;
	const int32_t n_blocks = o->kv_blocks > 0 ? o->kv_blocks : e->max_seqs * e->stride;
	e->prefix_caching = !o->no_prefix_caching;
	if ((rc = fp4s_kv_pool_init(&e->pool, n_blocks, err)))
		goto fail;
	e->table = calloc((size_t)e->max_seqs * e->stride, sizeof *e->table);
	if (!e->table) {
		rc = fp4s_error_set(err, FP4S_ENOMEM, "engine: out of memory");
		goto fail;
	}
	if ((rc = fp4s_fwd_init_pool(&e->fwd, &e->model, e->be, e->max_seqs, e->max_ctx, n_blocks, kv, err)))
		goto fail;
	e->n_reqs = e->max_seqs * 4;
	e->reqs = calloc((size_t)e->n_reqs, sizeof *e->reqs);
	e->slot_used = calloc((size_t)e->max_seqs, sizeof *e->slot_used);
	e->b_tok = malloc((size_t)e->max_batch * 4);
	e->b_pos = malloc((size_t)e->max_batch * 4);
	e->b_seq = malloc((size_t)e->max_batch * 4);
	e->b_rows = malloc((size_t)e->max_batch * 4);
	e->b_req = malloc((size_t)e->max_batch * sizeof *e->b_req);
	e->b_live = malloc((size_t)e->max_batch * 4);
	e->logits = malloc((size_t)e->max_seqs * (size_t)e->vocab * sizeof *e->logits);
	e->s_rows = malloc((size_t)e->max_seqs * sizeof *e->s_rows);
	e->s_tok = malloc((size_t)e->max_seqs * sizeof *e->s_tok);
	e->s_lp = malloc((size_t)e->max_seqs * sizeof *e->s_lp);
	e->dev_sample = fp4s_fwd_can_sample(&e->fwd);
	{
		const char *la = getenv("FP4S_LOOKAHEAD");
		const int want = la && *la ? (atoi(la) ? 1 : -1) : o->lookahead;
		e->lookahead = want > 0 || (want == 0 && fp4s_fwd_async(&e->fwd));
	}
	e->a_req = malloc((size_t)e->max_seqs * sizeof *e->a_req);
	e->a_id = malloc((size_t)e->max_seqs * sizeof *e->a_id);
	e->a_pos = malloc((size_t)e->max_seqs * 4);
	e->a_seq = malloc((size_t)e->max_seqs * 4);
	e->a_rows = malloc((size_t)e->max_seqs * 4);
	e->a_rng = malloc((size_t)e->max_seqs * sizeof *e->a_rng);
	e->launch_sample = fp4s_fwd_can_launch_sample(&e->fwd);
	e->n_events_cap = e->n_reqs;
	e->events = calloc((size_t)e->n_events_cap, sizeof *e->events);
	if (!e->reqs || !e->slot_used || !e->b_tok || !e->b_pos || !e->b_seq || !e->b_rows ||
	    !e->b_req || !e->logits || !e->events || !e->s_rows || !e->s_tok || !e->s_lp || !e->a_req || !e->a_id || !e->b_live ||
	    !e->a_pos || !e->a_seq || !e->a_rows || !e->a_rng) {
		rc = fp4s_error_set(err, FP4S_ENOMEM, "engine: out of memory");
		goto fail;
	}
	e->next_id = 1;
	*out = e;
	return FP4S_OK;
fail:
	fp4s_engine_close(e);
	return rc;
}

static void blocks_release(struct fp4s_engine *e, struct req *r)
{
	for (int32_t j = 0; j < r->n_blocks; j++)
		fp4s_kv_pool_release(&e->pool, r->blocks[j]);
	r->n_blocks = 0;
	r->n_hashed = 0;
	r->last_hash = 0;
}

static void req_release(struct fp4s_engine *e, struct req *r)
{
	if (r->slot >= 0 && r->slot < e->max_seqs && r->state == REQ_RUNNING)
		e->slot_used[r->slot] = 0;
	blocks_release(e, r);
	free(r->blocks);
	free(r->tokens);
	for (int32_t i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	fp4s_samp_free(&r->samp);
	fp4s_tok_text_free(&r->text);
	memset(r, 0, sizeof *r);
}

static int ahead_live(const struct fp4s_engine *e, int32_t j)
{
	const struct req *r = e->a_req[j];
	return r->state == REQ_RUNNING && r->id == e->a_id[j];
}

/* The step enqueued ahead is not wanted (its requests ended, a step failed, or the forward pass
 * is needed for something else): every launch still out is read and dropped. Its KV rows lie past
 * what their requests count as computed, so they are written again before anything reads them.
 * Its sampled rows' requests that go on get back their RNGs as they were before its draws, so
 * a seeded request draws the same numbers whether or not a step went ahead. */
static void ahead_drop(struct fp4s_engine *e)
{
	int32_t tok[FP4S_FWD_LAUNCH_ROWS];
	struct fp4s_error ignored;
	e->ahead_dropped += e->ahead_n > 0;
	while (e->fwd.n_launched > 0)
		(void)fp4s_fwd_collect(&e->fwd, tok, &ignored);
	for (int32_t j = 0; e->a_sampled && j < e->ahead_n; j++)
		if (ahead_live(e, j))
			memcpy(e->a_req[j]->samp.rng, e->a_rng[j], sizeof e->a_rng[j]);
	e->ahead_n = 0;
	e->a_sampled = 0;
}

void fp4s_engine_close(struct fp4s_engine *e)
{
	if (!e)
		return;
	ahead_drop(e);
	for (int32_t i = 0; e->reqs && i < e->n_reqs; i++)
		if (e->reqs[i].state != REQ_FREE)
			req_release(e, &e->reqs[i]);
	free(e->reqs);
	fp4s_fwd_free(&e->fwd);
	if (e->be)
		e->be->destroy(e->be);
	if (e->tok)
		fp4s_tok_close(e->tok);
	fp4s_model_close(&e->model);
	fp4s_kv_pool_free(&e->pool);
	free(e->table);
	free(e->slot_used), free(e->b_tok), free(e->b_pos), free(e->b_seq), free(e->b_rows);
	free(e->b_req), free(e->b_live), free(e->logits), free(e->events);
	free(e->s_rows), free(e->s_tok), free(e->s_lp), free(e->s_edits);
	free(e->a_req), free(e->a_id), free(e->a_pos), free(e->a_seq), free(e->a_rows), free(e->a_rng);
	free(e);
}

const struct fp4s_model *fp4s_engine_model(const struct fp4s_engine *e) { return &e->model; }
struct fp4s_tokenizer *fp4s_engine_tokenizer(struct fp4s_engine *e) { return e->tok; }
int32_t fp4s_engine_max_ctx(const struct fp4s_engine *e) { return e->max_ctx; }
struct fp4s_fwd *fp4s_engine_fwd(struct fp4s_engine *e) { return &e->fwd; }
int fp4s_engine_lookahead(const struct fp4s_engine *e, int64_t *taken, int64_t *dropped)
{
	if (taken)
		*taken = e->ahead_taken;
	if (dropped)
		*dropped = e->ahead_dropped;
	return e->lookahead;
}
const char *fp4s_engine_backend_name(const struct fp4s_engine *e) { return e->be->name; }
enum fp4s_kv_dtype fp4s_engine_kv_dtype(const struct fp4s_engine *e) { return e->kv_dtype; }

int fp4s_engine_submit(struct fp4s_engine *e, const struct fp4s_request *rq, int64_t *id,
                       struct fp4s_error *err)
{
	if (rq->n_prompt <= 0)
		return fp4s_error_set(err, FP4S_EINVAL, "the prompt is empty");
	if (rq->n_prompt >= e->max_ctx)
		return fp4s_error_set(err, FP4S_EINVAL, "the prompt has %d tokens; the context length is "
		                      "%d (room is needed for at least one new token)", rq->n_prompt, e->max_ctx);
	for (int32_t i = 0; i < rq->n_prompt; i++)
		if (rq->prompt[i] < 0 || rq->prompt[i] >= e->vocab)
			return fp4s_error_set(err, FP4S_EINVAL, "prompt token %d at index %d is outside the "
			                      "vocabulary [0, %d)", rq->prompt[i], i, e->vocab);
	if (rq->n_stop < 0 || rq->n_stop > FP4S_ENGINE_MAX_STOP_STRINGS)
		return fp4s_error_set(err, FP4S_EINVAL, "at most %d stop strings", FP4S_ENGINE_MAX_STOP_STRINGS);
	for (int32_t i = 0; i < rq->n_stop; i++)
		if (!rq->stop[i] || !rq->stop[i][0] || strlen(rq->stop[i]) > FP4S_ENGINE_MAX_STOP_LEN)
			return fp4s_error_set(err, FP4S_EINVAL, "stop string %d must have 1 to %d bytes", i,
			                      FP4S_ENGINE_MAX_STOP_LEN);
	/* a request that could not fit the whole pool even alone would wait forever */
	const int64_t most = rq->sampling.max_tokens > 0 && rq->n_prompt + (int64_t)rq->sampling.max_tokens < e->max_ctx
	                         ? rq->n_prompt + (int64_t)rq->sampling.max_tokens : e->max_ctx;
	if ((most + FP4S_KV_BLOCK - 1) / FP4S_KV_BLOCK > e->pool.n_blocks)
		return fp4s_error_set(err, FP4S_EINVAL, "the request may need %lld KV blocks; the cache has %d",
		                      (long long)((most + FP4S_KV_BLOCK - 1) / FP4S_KV_BLOCK), e->pool.n_blocks);
	struct req *r = NULL;
	for (int32_t i = 0; i < e->n_reqs && !r; i++)
		if (e->reqs[i].state == REQ_FREE)
			r = &e->reqs[i];
	if (!r)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "too many requests queued (%d)", e->n_reqs);
	memset(r, 0, sizeof *r);
	r->slot = -1;
	int rc = fp4s_samp_init(&r->samp, &rq->sampling, e->vocab, rq->prompt, rq->n_prompt, e->eos,
	                        e->n_eos, err);
	if (rc) {
		fp4s_samp_free(&r->samp);
		memset(r, 0, sizeof *r);
		return rc;
	}
	r->cap = e->max_ctx;
	r->tokens = malloc((size_t)r->cap * sizeof *r->tokens);
	r->blocks = malloc((size_t)e->stride * sizeof *r->blocks);
	if (!r->tokens || !r->blocks) {
		req_release(e, r);
		return fp4s_error_set(err, FP4S_ENOMEM, "engine: out of memory");
	}
	memcpy(r->tokens, rq->prompt, (size_t)rq->n_prompt * sizeof *r->tokens);
	r->n_prompt = r->n_tokens = rq->n_prompt;
	r->max_tokens = rq->sampling.max_tokens;
	for (int32_t i = 0; i < rq->n_stop; i++) {
		r->stop[i] = strdup(rq->stop[i]);
		if (!r->stop[i]) {
			req_release(e, r);
			return fp4s_error_set(err, FP4S_ENOMEM, "engine: out of memory");
		}
		r->n_stop = i + 1;
		if (strlen(rq->stop[i]) > r->max_stop_len)
			r->max_stop_len = strlen(rq->stop[i]);
	}
	fp4s_tok_stream_init(&r->stream, e->tok, rq->detok_flags);
	/* The text continues the prompt, so SentencePiece's leading space of the first new piece is
	 * kept, except after a lone BOS, where llama2.c and Hugging Face drop it. */
	r->stream.started = !(rq->n_prompt == 1 && rq->prompt[0] == fp4s_tok_bos(e->tok));
	r->state = REQ_WAITING;
	r->id = e->next_id++;
	r->order = e->next_order++;
	*id = r->id;
	return FP4S_OK;
}

int fp4s_engine_cancel(struct fp4s_engine *e, int64_t id)
{
	for (int32_t i = 0; i < e->n_reqs; i++)
		if (e->reqs[i].state != REQ_FREE && e->reqs[i].id == id) {
			e->reqs[i].cancelled = 1;
			return 0;
		}
	return -1;
}

int32_t fp4s_engine_pending(const struct fp4s_engine *e)
{
	int32_t n = 0;
	for (int32_t i = 0; i < e->n_reqs; i++)
		n += e->reqs[i].state == REQ_WAITING || e->reqs[i].state == REQ_RUNNING;
	return n;
}

/* Greedy with nothing that changes the logits first (bias, penalties, EOS masking for
 * min_tokens) and no logprobs: the argmax of the raw logits is the answer. */
static int pure_greedy(const struct req *r)
{
	const struct fp4s_sampling *p = &r->samp.p;
	return p->temperature < FP4S_SAMP_GREEDY_EPS && !p->logprobs && p->top_logprobs == 0 &&
	       p->n_logit_bias == 0 && !r->samp.penalties && r->n_tokens - r->n_prompt >= p->min_tokens;
}

/* A request whose next token a launch can find, so that the step after it may be enqueued
 * before it is read: plain greedy (the argmax), or drawn where the logits are without logprobs
 * (which a launch does not return). */
static int launchable(const struct fp4s_engine *e, const struct req *r)
{
	const struct fp4s_sampling *p = &r->samp.p;
	return pure_greedy(r) || (e->launch_sample && !p->logprobs && p->top_logprobs == 0);
}

/* The rows of this step's sampled sequences for the backend (fp4s_samp_plan: each draws its
 * random number now, as its host sampler would); *n_edits: the edits written. ahead: for the
 * step after this one (launch_ahead), whose token follows the one this step finds: the plan
 * then counts that token as generated (min_tokens), and the penalties add it where it is fed
 * (prev_fed: the counts here do not have it yet). */
static int plan_rows(struct fp4s_engine *e, int32_t nout, int ahead, int32_t *n_edits, struct fp4s_error *err)
{
	int64_t need = 0;
	for (int32_t o = 0; o < nout; o++)
		need += fp4s_samp_plan_edits(&e->b_req[e->b_rows[o]]->samp);
	if (need > INT32_MAX / 2)
		return fp4s_error_set(err, FP4S_EINVAL, "sampler: %lld edits in one step", (long long)need);
	if (need > e->s_edits_cap) {
		const int32_t cap = (int32_t)(need + need / 2 + 64);
		struct fp4s_samp_edit *p = realloc(e->s_edits, (size_t)cap * sizeof *p);
		if (!p)
			return fp4s_error_set(err, FP4S_ENOMEM, "engine: out of memory");
		e->s_edits = p;
		e->s_edits_cap = cap;
	}
	int32_t ne = 0;
	for (int32_t o = 0; o < nout; o++) {
		int32_t k = 0;
		struct fp4s_sampler *sp = &e->b_req[e->b_rows[o]]->samp;
		sp->n_generated += ahead;
		int rc = fp4s_samp_plan(sp, &e->s_rows[o], e->s_edits + ne, e->s_edits_cap - ne, &k, err);
		sp->n_generated -= ahead;
		if (rc)
			return rc;
		e->s_rows[o].prev_fed = ahead && sp->penalties;
		e->s_rows[o].edit0 = ne;
		ne += k;
	}
	*n_edits = ne;
	return FP4S_OK;
}

static struct fp4s_event *new_event(struct fp4s_engine *e, int32_t *n, struct req *r)
{
	struct fp4s_event *ev = &e->events[(*n)++];
	memset(ev, 0, sizeof *ev);
	ev->id = r->id;
	ev->token = -1;
	ev->n_prompt = r->n_prompt;
	ev->n_generated = r->n_tokens - r->n_prompt;
	return ev;
}

/* How far the request's text may be reported: everything, but a tail that could still grow into
 * a stop string is held back until it can't (or the request ends). *stopped is set when a stop
 * string was found; the limit is then its start. */
static size_t text_limit(const struct req *r, int final, int *stopped)
{
	size_t limit = r->text.n;
	*stopped = 0;
	for (int32_t i = 0; i < r->n_stop; i++) {
		/* a match cannot start before `emitted`: that text was checked with the stop in full view;
		 * memmem, not strstr, because generated bytes may include NUL */
		const size_t from = r->emitted, len = strlen(r->stop[i]);
		const char *hit = r->text.n > from ? memmem(r->text.s + from, r->text.n - from, r->stop[i], len)
		                                   : NULL;
		if (hit && (size_t)(hit - r->text.s) < limit) {
			limit = (size_t)(hit - r->text.s);
			*stopped = 1;
		}
	}
	if (!*stopped && !final && r->max_stop_len > 1) {
		const size_t hold = r->max_stop_len - 1;
		limit = r->text.n > r->emitted + hold ? r->text.n - hold : r->emitted;
		/* never split a UTF-8 sequence: back up to a character start */
		while (limit > r->emitted && ((unsigned char)r->text.s[limit] & 0xC0) == 0x80)
			limit--;
	}
	return limit < r->emitted ? r->emitted : limit;
}

/* Ends a request: its event reports the rest of its text (none when cancelled). */
static void finish(struct fp4s_engine *e, struct req *r, struct fp4s_event *ev, enum fp4s_finish why)
{
	const size_t start = r->emitted;
	size_t limit = start;
	if (why != FP4S_FINISH_CANCELLED) {
		int stopped;
		fp4s_tok_stream_flush(&r->stream, &r->text); /* an unfinished UTF-8 tail becomes U+FFFD */
		limit = text_limit(r, 1, &stopped);
		if (stopped)
			why = FP4S_FINISH_STOP;
	}
	ev->text = r->text.s ? r->text.s + start : "";
	ev->text_len = limit - start;
	r->emitted = limit;
	ev->finish = why;
	if (r->slot >= 0)
		e->slot_used[r->slot] = 0;
	r->slot = -1;
	r->state = REQ_DONE;
	blocks_release(e, r);
}

/* Prefix caching at admission: the leading full blocks of the request's tokens that are
 * registered already are taken as they are, and their positions count as computed. The last
 * token is always left to compute: its logits are what the request samples from. */
static void prefix_match(struct fp4s_engine *e, struct req *r)
{
	if (!e->prefix_caching || r->n_computed || r->n_blocks)
		return;
	while ((r->n_blocks + 1) * FP4S_KV_BLOCK < r->n_tokens) {
		const int32_t *toks = r->tokens + (size_t)r->n_blocks * FP4S_KV_BLOCK;
		const int32_t b = fp4s_kv_pool_lookup(&e->pool, r->last_hash, toks);
		if (b < 0)
			break;
		r->last_hash = fp4s_kv_hash(r->last_hash, toks);
		r->blocks[r->n_blocks++] = b;
		r->n_hashed = r->n_blocks;
		r->n_computed = r->n_blocks * FP4S_KV_BLOCK;
	}
}

/* Gives a running request's blocks back and sends it to the waiting queue; it keeps its tokens
 * (prompt and generated) and recomputes them when readmitted (vLLM's recompute preemption). */
static void preempt(struct fp4s_engine *e, struct req *r)
{
	blocks_release(e, r);
	r->n_computed = 0;
	if (r->slot >= 0)
		e->slot_used[r->slot] = 0;
	r->slot = -1;
	r->state = REQ_WAITING;
	e->preemptions++;
}

/* Makes sure r holds blocks for its next `take` positions, preempting the newest running
 * request that has nothing in this step's batch when the pool is empty. Returns how many
 * positions are covered (<= take). */
static int32_t reserve_blocks(struct fp4s_engine *e, struct req *r, int32_t take, int32_t nb)
{
	const int32_t need = (r->n_computed + take + FP4S_KV_BLOCK - 1) / FP4S_KV_BLOCK;
	while (r->n_blocks < need) {
		int32_t b = fp4s_kv_pool_alloc(&e->pool);
		if (b < 0) {
			struct req *victim = NULL;
			for (int32_t i = 0; i < e->n_reqs; i++) {
				struct req *v = &e->reqs[i];
				if (v == r || v->state != REQ_RUNNING || v->n_blocks == 0)
					continue;
				int queued = 0;
				for (int32_t j = 0; j < nb && !queued; j++)
					queued = e->b_req[j] == v;
				if (!queued && (!victim || v->order > victim->order))
					victim = v;
			}
			/* only a newer request is preempted for an older one (first come, first served) */
			if (!victim || victim->order < r->order)
				break;
			preempt(e, victim);
			continue;
		}
		r->blocks[r->n_blocks++] = b;
	}
	const int32_t covered = r->n_blocks * FP4S_KV_BLOCK - r->n_computed;
	return covered < take ? covered : take;
}

/* Registers the request's newly completed full blocks in the prefix cache. */
static void register_blocks(struct fp4s_engine *e, struct req *r)
{
	while (e->prefix_caching && (r->n_hashed + 1) * FP4S_KV_BLOCK <= r->n_computed &&
	       r->n_hashed < r->n_blocks) {
		const int32_t *toks = r->tokens + (size_t)r->n_hashed * FP4S_KV_BLOCK;
		fp4s_kv_pool_register(&e->pool, r->blocks[r->n_hashed], r->last_hash, toks);
		r->last_hash = fp4s_kv_hash(r->last_hash, toks);
		r->n_hashed++;
	}
}

void fp4s_engine_kv_usage(const struct fp4s_engine *e, int32_t *used, int32_t *total, int64_t *preemptions,
                          int64_t *prefix_hits, int64_t *prefix_lookups)
{
	*used = fp4s_kv_pool_used(&e->pool);
	*total = e->pool.n_blocks;
	*preemptions = e->preemptions;
	*prefix_hits = e->pool.hits;
	*prefix_lookups = e->pool.lookups;
}

/* Enqueues the next decode step of this step's nb requests before this step's tokens are read
 * (engine_opts' lookahead), when every row is the one decode token of a launchable request
 * (greedy, or sampled on the device without logprobs) that cannot reach a length limit with
 * this token, no request waits for a free slot, and each
 * request gets a block for its next position without preempting anyone. Row j then takes the
 * token this step finds for its row j (out row j: b_rows[j] == j), where it was found. A request
 * that stops at this token leaves its row behind, dropped when the step is collected. */
static int launch_ahead(struct fp4s_engine *e, int32_t nb, int32_t nout, struct fp4s_error *err)
{
	if (!e->lookahead || nb != nout || nb > e->max_seqs)
		return FP4S_OK;
	/* A waiting request is admitted by the next step when a slot is free for it; with every slot
	 * taken (a full server) the next step could not admit it, so the step goes ahead. A request
	 * that ends at this step's token frees its slot only once the token is read: the waiting one
	 * then comes in a step later than it would without the step ahead. */
	int waiting = 0, free_slot = 0;
	for (int32_t i = 0; i < e->n_reqs; i++)
		waiting |= e->reqs[i].state == REQ_WAITING;
	for (int32_t s = 0; s < e->max_seqs; s++)
		free_slot |= !e->slot_used[s];
	if (waiting && free_slot)
		return FP4S_OK;
	for (int32_t j = 0; j < nb; j++) {
		const struct req *r = e->b_req[j];
		const int32_t n_next = r->n_tokens + 1; /* with this step's token */
		if (e->b_rows[j] != j || r->state != REQ_RUNNING || r->cancelled || !launchable(e, r) ||
		    r->n_computed != r->n_tokens || n_next >= e->max_ctx ||
		    (r->max_tokens > 0 && n_next - r->n_prompt >= r->max_tokens))
			return FP4S_OK;
	}
	for (int32_t j = 0; j < nb; j++) {
		struct req *r = e->b_req[j];
		while (r->n_blocks * FP4S_KV_BLOCK <= r->n_computed) {
			const int32_t blk = fp4s_kv_pool_alloc(&e->pool);
			if (blk < 0)
				return FP4S_OK; /* the next step's scheduling may preempt for it */
			r->blocks[r->n_blocks++] = blk;
		}
	}
	for (int32_t j = 0; j < nb; j++) {
		struct req *r = e->b_req[j];
		e->a_req[j] = r, e->a_id[j] = r->id;
		e->a_pos[j] = r->n_computed, e->a_seq[j] = r->slot, e->a_rows[j] = j;
		memcpy(e->table + (size_t)r->slot * e->stride, r->blocks, (size_t)r->n_blocks * sizeof *r->blocks);
	}
	struct fp4s_batch b = {nb, NULL, e->a_pos, e->a_seq, e->table, e->stride};
	int greedy = 1;
	for (int32_t j = 0; j < nb; j++)
		greedy &= pure_greedy(e->b_req[j]);
	int rc;
	if (greedy) {
		rc = fp4s_fwd_launch_argmax(&e->fwd, &b, e->a_rows, nb, err);
	} else {
		for (int32_t j = 0; j < nb; j++)
			memcpy(e->a_rng[j], e->b_req[j]->samp.rng, sizeof e->a_rng[j]);
		int32_t ne = 0;
		rc = plan_rows(e, nb, 1, &ne, err); /* b_rows[j] == j: row j is request j */
		if (!rc)
			rc = fp4s_fwd_launch_sample(&e->fwd, &b, e->a_rows, nb, e->s_rows, e->s_edits, ne, err);
		if (rc) /* not launched: the draws go back */
			for (int32_t j = 0; j < nb; j++)
				memcpy(e->b_req[j]->samp.rng, e->a_rng[j], sizeof e->a_rng[j]);
	}
	if (!rc)
		e->ahead_n = nb, e->a_sampled = !greedy;
	return rc;
}

int fp4s_engine_step(struct fp4s_engine *e, const struct fp4s_event **events, struct fp4s_error *err)
{
	int32_t nev = 0, nb = 0, nout = 0;
	*events = e->events;
	e->step_no++;
	/* last step's finished requests are freed now (their text stayed valid until this call) */
	for (int32_t i = 0; i < e->n_reqs; i++)
		if (e->reqs[i].state == REQ_DONE)
			req_release(e, &e->reqs[i]);
	/* cancellations */
	for (int32_t i = 0; i < e->n_reqs; i++) {
		struct req *r = &e->reqs[i];
		if ((r->state == REQ_WAITING || r->state == REQ_RUNNING) && r->cancelled)
			finish(e, r, new_event(e, &nev, r), FP4S_FINISH_CANCELLED);
	}
	/* The step enqueued ahead is this one, unless none of its requests runs any more (they ended
	 * or were cancelled); its rows' requests then count their token as computed, as the
	 * scheduling below does for the tokens it takes. Waiting requests are admitted next time. */
	int ahead = 0;
	for (int32_t j = 0; j < e->ahead_n && !ahead; j++)
		ahead = ahead_live(e, j);
	if (!ahead)
		ahead_drop(e);
	for (int32_t j = 0; ahead && j < e->ahead_n; j++) {
		struct req *r = e->a_req[j];
		e->b_req[j] = r, e->b_pos[j] = e->a_pos[j], e->b_seq[j] = e->a_seq[j], e->b_rows[j] = j;
		e->b_live[j] = ahead_live(e, j);
		if (e->b_live[j] && (r->n_computed != e->a_pos[j] || r->n_tokens != e->a_pos[j] + 1)) {
			ahead_drop(e);
			return fp4s_error_set(err, FP4S_EINVAL, "engine: request %lld at %d tokens (%d computed) "
			                      "for a step ahead at position %d", (long long)r->id, r->n_tokens,
			                      r->n_computed, e->a_pos[j]);
		}
		if (e->b_live[j])
			r->n_computed++;
	}
	if (ahead) {
		nb = nout = e->ahead_n;
		e->ahead_n = 0;
		e->a_sampled = 0;
		e->ahead_taken++;
	}
	/* admit waiting requests into free slots, oldest first */
	for (; !ahead;) {
		struct req *oldest = NULL;
		for (int32_t i = 0; i < e->n_reqs; i++)
			if (e->reqs[i].state == REQ_WAITING && (!oldest || e->reqs[i].order < oldest->order))
				oldest = &e->reqs[i];
		int32_t slot = -1;
		for (int32_t s = 0; s < e->max_seqs && slot < 0; s++)
			if (!e->slot_used[s])
				slot = s;
		if (!oldest || slot < 0)
			break;
		oldest->slot = slot;
		oldest->state = REQ_RUNNING;
		e->slot_used[slot] = 1;
		e->be->kv_clear(e->be, slot);
		prefix_match(e, oldest);
	}
	/* decode tokens first, then prefill chunks, oldest first */
	for (int pass = 0; pass < 2 && !ahead; pass++) {
		for (;;) {
			struct req *pick = NULL;
			for (int32_t i = 0; i < e->n_reqs; i++) {
				struct req *r = &e->reqs[i];
				if (r->state != REQ_RUNNING || r->n_computed >= r->n_tokens)
					continue;
				const int decode = r->n_computed >= r->n_prompt;
				int queued = 0;
				for (int32_t j = 0; j < nb; j++)
					queued |= e->b_req[j] == r;
				if (queued || decode != (pass == 0) || r->skip_step == e->step_no)
					continue;
				if (!pick || r->order < pick->order)
					pick = r;
			}
			if (!pick || nb >= e->max_batch)
				break;
			int32_t take = pick->n_tokens - pick->n_computed;
			if (take > e->max_batch - nb)
				take = e->max_batch - nb;
			take = reserve_blocks(e, pick, take, nb);
			if (take <= 0) {
				/* no room for it this step: it waits (running, keeping its blocks) */
				pick->skip_step = e->step_no;
				continue;
			}
			for (int32_t j = 0; j < take; j++) {
				e->b_tok[nb] = pick->tokens[pick->n_computed + j];
				e->b_pos[nb] = pick->n_computed + j;
				e->b_seq[nb] = pick->slot;
				e->b_req[nb] = pick;
				nb++;
			}
			pick->n_computed += take;
			if (pick->n_computed == pick->n_tokens)
				e->b_rows[nout++] = nb - 1; /* its last token: sample from it */
		}
	}
	if (nb == 0)
		return nev;
	/* the block table rows of the sequences in this batch */
	for (int32_t j = 0; j < nb && !ahead; j++) {
		const struct req *r = e->b_req[j];
		memcpy(e->table + (size_t)r->slot * e->stride, r->blocks, (size_t)r->n_blocks * sizeof *r->blocks);
	}
	struct fp4s_batch b = {nb, e->b_tok, e->b_pos, e->b_seq, e->table, e->stride};
	/* When every request sampled this step is plain greedy, only the argmax leaves the backend
	 * (a GPU then moves 4 bytes per sequence instead of the vocabulary's logits). */
	int all_greedy = 1, all_launch = 1, dev = e->dev_sample && nout <= 1024; /* the backend's rows a call */
	for (int32_t o = 0; o < nout && !ahead; o++) {
		all_greedy &= pure_greedy(e->b_req[e->b_rows[o]]);
		all_launch &= launchable(e, e->b_req[e->b_rows[o]]);
	}
	/* Otherwise the backend draws the tokens where the logits are (the same tokens and logprobs
	 * as the host's sampler: sampler.h) when it can; else the logits come here. */
	int32_t greedy_tok[64];
	int rc = FP4S_OK, launched = 0;
	if (ahead || (all_launch && nout > 0 && nout <= 64 && e->lookahead)) {
		/* launched (or taken from ahead); the next step may go in before its tokens are read */
		dev = 0, launched = 1;
		if (!ahead && all_greedy) {
			rc = fp4s_fwd_launch_argmax(&e->fwd, &b, e->b_rows, nout, err);
		} else if (!ahead) {
			int32_t ne = 0;
			rc = plan_rows(e, nout, 0, &ne, err);
			if (!rc)
				rc = fp4s_fwd_launch_sample(&e->fwd, &b, e->b_rows, nout, e->s_rows, e->s_edits, ne, err);
		}
		if (!rc)
			rc = launch_ahead(e, nb, nout, err);
		if (!rc)
			rc = fp4s_fwd_collect(&e->fwd, greedy_tok, err);
		if (rc)
			ahead_drop(e); /* nothing stays in flight */
	} else if (all_greedy && nout <= 64) {
		dev = 0;
		rc = fp4s_fwd_run_argmax(&e->fwd, &b, e->b_rows, nout, greedy_tok, err);
	} else if (dev) {
		int32_t ne = 0;
		rc = plan_rows(e, nout, 0, &ne, err);
		if (!rc)
			rc = fp4s_fwd_run_sample(&e->fwd, &b, e->b_rows, nout, e->s_rows, e->s_edits, ne, e->s_tok, e->s_lp,
			                         err);
	} else {
		rc = fp4s_fwd_run(&e->fwd, &b, e->b_rows, nout, e->logits, err);
	}
	if (rc)
		return rc;
	for (int32_t j = 0; j < nb; j++)
		if ((j == 0 || e->b_req[j] != e->b_req[j - 1]) && (!ahead || e->b_live[j]))
			register_blocks(e, e->b_req[j]);
	for (int32_t o = 0; o < nout; o++) {
		struct req *r = e->b_req[e->b_rows[o]];
		if (ahead && !e->b_live[e->b_rows[o]])
			continue; /* it ended after this step was enqueued */
		if (launched && greedy_tok[o] < 0) { /* a sampled row: nothing left to draw from */
			ahead_drop(e);
			return fp4s_error_set(err, FP4S_EINVAL, "sampler: no token has a finite logit after masking");
		}
		struct fp4s_event *ev = new_event(e, &nev, r);
		if (launched || (all_greedy && nout <= 64))
			ev->sample.token = greedy_tok[o];
		else if (dev && e->s_tok[o] < 0)
			return fp4s_error_set(err, FP4S_EINVAL, "sampler: no token has a finite logit after masking");
		else if (dev && e->s_rows[o].logprobs)
			ev->sample = e->s_lp[o];
		else if (dev)
			ev->sample.token = e->s_tok[o];
		else if ((rc = fp4s_samp_sample(&r->samp, e->logits + (size_t)o * e->vocab, e->vocab, &ev->sample, err)))
			return rc;
		const int32_t t = ev->sample.token;
		ev->token = t;
		if (fp4s_samp_is_stop(&r->samp, t)) {
			ev->n_generated = r->n_tokens - r->n_prompt + 1;
			finish(e, r, ev, FP4S_FINISH_STOP);
			continue;
		}
		if ((rc = fp4s_samp_accept(&r->samp, t)))
			return fp4s_error_set(err, rc, "sampler: cannot record token %d", t);
		r->tokens[r->n_tokens++] = t;
		ev->n_generated = r->n_tokens - r->n_prompt;
		if ((rc = fp4s_tok_stream_push(&r->stream, t, &r->text, err)))
			return rc;
		const int at_limit = (r->max_tokens > 0 && r->n_tokens - r->n_prompt >= r->max_tokens) ||
		                     r->n_tokens >= e->max_ctx;
		int stopped;
		const size_t start = r->emitted, limit = text_limit(r, 0, &stopped);
		if (at_limit || stopped) {
			finish(e, r, ev, stopped ? FP4S_FINISH_STOP : FP4S_FINISH_LENGTH);
		} else {
			ev->text = r->text.s + start;
			ev->text_len = limit - start;
			r->emitted = limit;
		}
	}
	return nev;
}

int fp4s_engine_score(struct fp4s_engine *e, const int32_t *tokens, int64_t n, int32_t ctx,
                      double *nll_sum, double *nll_sq_sum, int64_t *n_scored, struct fp4s_error *err)
{
	*nll_sum = 0, *nll_sq_sum = 0, *n_scored = 0;
	ahead_drop(e);
	if (ctx < 2 || ctx > e->max_ctx)
		return fp4s_error_set(err, FP4S_EINVAL, "perplexity context %d must be in [2, %d]", ctx, e->max_ctx);
	if (ctx > e->max_batch)
		ctx = e->max_batch; /* one forward per chunk */
	/* scored where the logits are when the backend can (8 bytes a row come back), else the
	 * logits come here */
	const int dev = fp4s_fwd_can_nll(&e->fwd);
	float *lg = dev ? NULL : malloc((size_t)ctx * (size_t)e->vocab * sizeof *lg);
	double *nlls = malloc((size_t)ctx * sizeof *nlls);
	int32_t *rows = malloc((size_t)ctx * sizeof *rows);
	if ((!dev && !lg) || !nlls || !rows) {
		free(lg), free(nlls), free(rows);
		return fp4s_error_set(err, FP4S_ENOMEM, "perplexity: out of memory");
	}
	/* slot 0's table row, from the pool (the caller runs no requests meanwhile) */
	const int32_t nblk = (ctx + FP4S_KV_BLOCK - 1) / FP4S_KV_BLOCK;
	int32_t got = 0, rc = FP4S_OK;
	for (; got < nblk; got++) {
		const int32_t blk = fp4s_kv_pool_alloc(&e->pool);
		if (blk < 0)
			break;
		e->table[got] = blk;
	}
	if (got < nblk)
		rc = fp4s_error_set(err, FP4S_ENOMEM, "perplexity: the KV pool has no room for %d positions", ctx);
	for (int64_t start = 0; !rc && start + 1 < n; start += ctx) {
		int32_t len = (int32_t)(n - start < ctx ? n - start : ctx);
		if (len < 2)
			break;
		for (int32_t i = 0; i < len; i++) {
			e->b_tok[i] = tokens[start + i];
			e->b_pos[i] = i;
			e->b_seq[i] = 0;
			rows[i] = i;
		}
		struct fp4s_batch b = {len, e->b_tok, e->b_pos, e->b_seq, e->table, e->stride};
		if (dev) {
			rc = fp4s_fwd_run_nll(&e->fwd, &b, rows, len - 1, tokens + start + 1, nlls, err);
		} else if (!(rc = fp4s_fwd_run(&e->fwd, &b, rows, len - 1, lg, err))) {
			for (int32_t i = 0; i + 1 < len; i++) { /* what nll.cu computes */
				const float *l = lg + (size_t)i * e->vocab;
				float m = l[0];
				for (int32_t v = 1; v < e->vocab; v++)
					m = fmaxf(m, l[v]);
				double s = 0;
				for (int32_t v = 0; v < e->vocab; v++)
					s += exp((double)l[v] - m);
				nlls[i] = log(s) + m - l[e->b_tok[i + 1]];
			}
		}
		if (rc)
			break;
		for (int32_t i = 0; i + 1 < len; i++) {
			*nll_sum += nlls[i];
			*nll_sq_sum += nlls[i] * nlls[i];
			(*n_scored)++;
		}
	}
	for (int32_t j = 0; j < got; j++)
		fp4s_kv_pool_release(&e->pool, e->table[j]);
	free(lg), free(nlls), free(rows);
	return rc;
}
