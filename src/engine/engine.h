/* engine.h: the public engine API. Open a model, submit requests (prompt token ids + sampling
 * parameters + stop strings), call step() repeatedly: each step runs ONE forward pass over a
 * flattened batch that mixes prefill chunks of new requests with one decode token of every
 * running request (design.md), samples, detokenizes (UTF-8 safe) and reports events. cancel()
 * ends a request and frees its KV slot. The CLI (run, chat, perplexity) and the server are
 * clients of this API.
 *
 * Not thread-safe: one thread (the scheduler) owns an engine. */
#ifndef FP4S_ENGINE_H
#define FP4S_ENGINE_H

#include <stdint.h>

#include "engine/forward.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"

#define FP4S_ENGINE_MAX_STOP_STRINGS 8
#define FP4S_ENGINE_MAX_STOP_LEN 256

struct fp4s_engine_opts {
	const char *model;     /* Hugging Face folder, or a llama2.c .bin file */
	const char *tokenizer; /* NULL: from the model folder */
	const char *backend;   /* "auto" (NULL: the GPU when there is one), "cuda" or "cpu" */
	int32_t max_seqs;      /* sequences in flight (KV slots); 0 = 4 */
	int32_t max_ctx;       /* context length; 0 = min(max_position_embeddings, 4096) */
	int32_t max_batch_tokens; /* tokens per forward (chunked prefill); 0 = 512 */
	const char *kv_cache_dtype; /* "auto" (NULL: BF16 on the GPU, FP32 on the CPU), "fp32", "bf16",
	                             * "fp8" or "fp8_e4m3" (E4M3, scale 1.0, saturating: backend.h) */
	int32_t kv_blocks;     /* KV pool size in blocks of FP4S_KV_BLOCK positions; 0 = every slot at
	                        * full context (no pressure). Fewer blocks: requests take blocks as
	                        * they grow, and the newest are preempted (recomputed) when none is left */
	int32_t no_prefix_caching; /* 1 turns off reuse of shared prompt blocks */
	/* a decode step of plain greedy requests enqueues the next one before its tokens are read,
	 * each token fed to the next step where it was found, so that a GPU does not wait for the
	 * host between tokens (a request that stops has its extra row dropped): 0 = where the backend
	 * runs asynchronously (a GPU), 1 = everywhere (tests on the CPU), -1 = never;
	 * FP4S_LOOKAHEAD=0 / 1 in the environment overrides it */
	int32_t lookahead;
};

enum fp4s_finish {
	FP4S_FINISH_NONE = 0,
	FP4S_FINISH_STOP,      /* EOS, a stop id or a stop string */
	FP4S_FINISH_LENGTH,    /* max_tokens or the context length */
	FP4S_FINISH_CANCELLED,
};

struct fp4s_request {
	const int32_t *prompt;
	int32_t n_prompt;
	struct fp4s_sampling sampling;
	int32_t n_stop;                       /* stop strings, matched on the detokenized output */
	const char *stop[FP4S_ENGINE_MAX_STOP_STRINGS];
	unsigned detok_flags;                 /* FP4S_TOK_SKIP_SPECIAL by default (set by defaults) */
	int32_t want_prompt_logprobs;         /* perplexity: logprob of every prompt token */
};

/* One thing that happened to a request during a step. */
struct fp4s_event {
	int64_t id;
	int32_t token;           /* the sampled token, or -1 (finish-only events) */
	struct fp4s_samp_result sample; /* logprobs when asked for */
	const char *text;        /* new text (valid UTF-8, stop strings cut); valid until next step */
	size_t text_len;
	enum fp4s_finish finish; /* set on the request's last event */
	int32_t n_prompt, n_generated;
};

struct fp4s_engine;

void fp4s_request_defaults(struct fp4s_request *r);
int fp4s_engine_open(const struct fp4s_engine_opts *o, struct fp4s_engine **out,
                     struct fp4s_error *err);
void fp4s_engine_close(struct fp4s_engine *e);

const struct fp4s_model *fp4s_engine_model(const struct fp4s_engine *e);
struct fp4s_tokenizer *fp4s_engine_tokenizer(struct fp4s_engine *e);
int32_t fp4s_engine_max_ctx(const struct fp4s_engine *e);
/* The forward pass itself, for benchmarks that drive batches directly (KV slot 0..max_seqs-1;
 * do not mix with requests in flight). */
struct fp4s_fwd *fp4s_engine_fwd(struct fp4s_engine *e);
/* 1 when decode steps are enqueued ahead (engine_opts' lookahead); *taken: such steps used so
 * far, *dropped: those not used (their requests had all ended; either may be NULL) */
int fp4s_engine_lookahead(const struct fp4s_engine *e, int64_t *taken, int64_t *dropped);
/* "cpu" or "cuda": the backend the engine runs on */
const char *fp4s_engine_backend_name(const struct fp4s_engine *e);
/* the KV cache's element type (--kv-cache-dtype resolved) */
enum fp4s_kv_dtype fp4s_engine_kv_dtype(const struct fp4s_engine *e);

/* Queues a request. Errors (FP4S_EINVAL) name the problem: empty prompt, a prompt that does not
 * fit the context, token ids outside the vocabulary, bad sampling parameters. */
int fp4s_engine_submit(struct fp4s_engine *e, const struct fp4s_request *r, int64_t *id,
                       struct fp4s_error *err);
/* Ends a request now (its last event, CANCELLED, comes with the next step). 0, or -1 if unknown. */
int fp4s_engine_cancel(struct fp4s_engine *e, int64_t id);
/* KV pool blocks in use and in all, preemptions so far, prefix-cache block hits / lookups. */
void fp4s_engine_kv_usage(const struct fp4s_engine *e, int32_t *used, int32_t *total,
                          int64_t *preemptions, int64_t *prefix_hits, int64_t *prefix_lookups);
/* Requests waiting or running. */
int32_t fp4s_engine_pending(const struct fp4s_engine *e);
/* Runs one step; *events points at this step's events (engine-owned, valid until the next call).
 * Returns the number of events, or a negative error. */
int fp4s_engine_step(struct fp4s_engine *e, const struct fp4s_event **events,
                     struct fp4s_error *err);

/* Log-probabilities of tokens[1..n) given their prefixes, in chunks of the context length, as
 * perplexity tools do (no overlap between chunks; the first token of each chunk is context only).
 * Writes n_scored and the sum of -log p. */
int fp4s_engine_score(struct fp4s_engine *e, const int32_t *tokens, int64_t n, int32_t ctx,
                      double *nll_sum, double *nll_sq_sum, int64_t *n_scored,
                      struct fp4s_error *err);

#endif
