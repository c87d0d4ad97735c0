/* sampler.h: per-request sampling parameters and the per-sequence sampler (CPU reference).
 *
 * Semantics follow vLLM's v1 sampler, so that a client moving between vLLM and fp4serve sees the
 * same behaviour for the same request:
 *
 *   1. logit_bias is added; while fewer than min_tokens tokens have been generated, every stop id
 *      (and every EOS id unless ignore_eos) is set to -inf;
 *   2. penalties: repetition (prompt + generated tokens, HF/vLLM form: l > 0 ? l / r : l * r), then
 *      frequency (l -= f * count) and presence (l -= p * [count > 0]) over GENERATED tokens only;
 *   3. temperature < 1e-5: greedy argmax, ties to the lowest id; no random number is drawn;
 *   4. otherwise logits /= temperature, then min_p (drop p < min_p * p_max), then top_k (keep every
 *      token whose logit is >= the k-th largest, so ties with the k-th are kept, as vLLM's
 *      `logits < kth` mask does), then top_p on the renormalised survivors, then a draw from the
 *      renormalised distribution with the sequence's own RNG (exactly one 64-bit draw per token,
 *      taken first). The draw scans the kept tokens in id order with their masses in
 *      samp_math.h's fixed point, so a GPU that draws the same number picks the same token.
 *
 * top_p keeps the smallest prefix of the survivors, ranked by (probability desc, id asc), whose mass
 * reaches top_p: a token is kept iff the mass ranked strictly above it is < top_p (vLLM's
 * ascending-cumsum `<= 1 - p` mask, with its first-kept token included). Among equal
 * probabilities at the boundary the lower id is kept.
 *
 * Logprobs: vLLM's default `logprobs_mode` is "raw_logprobs" (vllm/config/model.py LogprobsMode;
 * its Sampler computes them before logit bias, penalties and temperature), so that is our default
 * too (FP4S_SAMP_LOGPROBS_RAW): the log-softmax of the logits exactly as the model produced them.
 * FP4S_SAMP_LOGPROBS_PROCESSED gives vLLM's "processed_logprobs": the log-probabilities of the
 * distribution actually sampled from (after bias, penalties, temperature, min_p, top_k, top_p);
 * tokens removed by the filters are not listed. In greedy mode "processed" is the log-softmax of
 * the biased/penalised logits (no temperature is applied there, as in vLLM).
 *
 * Engine contract: one struct fp4s_sampler per sequence; call fp4s_samp_accept for every token
 * the sequence emits (penalties and min_tokens count from it); check fp4s_samp_is_stop and
 * max_tokens yourself. Requests with a seed and n > 1 must give each choice its own seed (e.g.
 * seed + index), or all choices come out identical. Not thread-safe per sampler; different
 * samplers may run on different threads (the unseeded counter is atomic).
 */
#ifndef FP4S_SAMPLER_H
#define FP4S_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "util/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FP4S_SAMP_MAX_TOP_LOGPROBS 20 /* OpenAI's top_logprobs limit */
#define FP4S_SAMP_MAX_LOGIT_BIAS 512  /* entries of logit_bias per request */
#define FP4S_SAMP_MAX_STOP_IDS 32     /* explicit stop token ids per request */
#define FP4S_SAMP_MAX_EOS 8           /* model EOS ids (gpt-oss has 3, Llama 3.1 has 3) */
#define FP4S_SAMP_MAX_TEMPERATURE 100.0f
#define FP4S_SAMP_GREEDY_EPS 1e-5f /* vLLM's _SAMPLING_EPS: below it, temperature means greedy */

enum fp4s_samp_logprobs_mode {
	FP4S_SAMP_LOGPROBS_RAW = 0,       /* vLLM default: log-softmax of the unmodified logits */
	FP4S_SAMP_LOGPROBS_PROCESSED = 1, /* log-probabilities of the distribution sampled from */
};

struct fp4s_samp_bias {
	int32_t token;
	float bias; /* added to the logit; [-100, 100] as OpenAI. -100 bans, +100 all but forces */
};

/* Per-request parameters. fp4s_samp_defaults() fills the vLLM/OpenAI defaults (noted per field);
 * a zeroed struct is NOT the default (it means temperature 0 and an invalid top_p 0). */
struct fp4s_sampling {
	float temperature;        /* 1.0; [0, 100]; < 1e-5 = greedy */
	float top_p;              /* 1.0; (0, 1] */
	int32_t top_k;            /* 0; 0 or -1 = off, else >= 1 (values >= vocab are off too) */
	float min_p;              /* 0; [0, 1] */
	float presence_penalty;   /* 0; [-2, 2], generated tokens only */
	float frequency_penalty;  /* 0; [-2, 2], generated tokens only */
	float repetition_penalty; /* 1.0; > 0 (and <= 100), prompt + generated tokens */
	uint64_t seed;            /* used only when has_seed */
	bool has_seed;            /* false: seeded from a process-wide counter mixed with the clock */
	bool logprobs;            /* return the chosen token's logprob (OpenAI chat `logprobs`) */
	int32_t top_logprobs;     /* 0; 0..20 alternatives (needs logprobs; completions' int maps here) */
	enum fp4s_samp_logprobs_mode logprobs_mode; /* RAW */
	int32_t min_tokens;       /* 0; stop ids / EOS masked until this many tokens were generated */
	int32_t max_tokens;       /* 0 = no limit of the request's own (the context still bounds it) */
	bool ignore_eos;          /* false; EOS neither stops nor is masked; stop_ids still apply */
	int32_t n_logit_bias;
	struct fp4s_samp_bias logit_bias[FP4S_SAMP_MAX_LOGIT_BIAS];
	int32_t n_stop_ids;
	int32_t stop_ids[FP4S_SAMP_MAX_STOP_IDS];
};

struct fp4s_samp_logprob {
	int32_t token;
	float logprob;
};

struct fp4s_samp_result {
	int32_t token;
	float logprob; /* chosen token's logprob when params.logprobs, else 0 */
	int32_t rank;  /* 1 + tokens with a strictly larger logprob (vLLM's rank), when logprobs */
	int32_t n_top; /* <= top_logprobs; fewer when fewer tokens have a finite logprob */
	struct fp4s_samp_logprob top[FP4S_SAMP_MAX_TOP_LOGPROBS]; /* descending, ties: lower id first */
};

/* Token counts for penalties: an open-addressing hash map keyed by token id, so memory grows with
 * the distinct tokens seen (prompt + output), not with the vocabulary. Allocated only when a
 * penalty is active. */
struct fp4s_samp_count {
	int32_t token;   /* -1 = empty slot */
	uint32_t n_out;  /* times generated */
	uint32_t prompt; /* 1 if the token appears in the prompt */
};

struct fp4s_samp_cand {
	float w; /* exp(logit/T - max): the unnormalised probability */
	int32_t id;
};

struct fp4s_sampler {
	struct fp4s_sampling p; /* validated copy */
	int32_t vocab;
	uint64_t rng[4];       /* xoshiro256** state */
	int32_t n_generated;   /* tokens passed to fp4s_samp_accept */
	int32_t n_eos;
	int32_t eos[FP4S_SAMP_MAX_EOS];
	bool penalties;        /* any penalty differs from its neutral value */
	struct fp4s_samp_count *counts; /* [counts_cap], power of two; NULL without penalties */
	uint32_t counts_cap, counts_used;
	struct fp4s_samp_cand *cand; /* scratch for top_k/top_p candidates; grows up to vocab */
	int32_t cand_cap;
	float *raw;  /* [vocab] copy of the unmodified logits, only for RAW logprobs */
	float *heap; /* [k] scratch for the k-th largest value, k <= FP4S_SAMP_HEAP_K */
};

/* Fills the vLLM/OpenAI defaults: temperature 1, top_p 1, top_k off, min_p 0, penalties neutral,
 * no seed, no logprobs, RAW mode, no bias, no stop ids, no token limits. */
void fp4s_samp_defaults(struct fp4s_sampling *p);

/* Checks every field against the ranges above. vocab > 0 also checks token ids (logit_bias and
 * stop ids) are < vocab. Returns 0 or FP4S_EINVAL with a message naming the field, in the words
 * an OpenAI-style error body can carry ("top_p must be in (0, 1], got 0"). */
int fp4s_samp_validate(const struct fp4s_sampling *p, int32_t vocab, struct fp4s_error *err);

/* Validates p, copies it and sets up the per-sequence state. eos lists the model's EOS ids
 * (n_eos <= FP4S_SAMP_MAX_EOS; ids outside the vocabulary are an error). The prompt is read only
 * to mark tokens for the repetition penalty and is not kept. Free with fp4s_samp_free, also after
 * a failed init. */
int fp4s_samp_init(struct fp4s_sampler *s, const struct fp4s_sampling *p, int32_t vocab,
                   const int32_t *prompt, int32_t n_prompt, const int32_t *eos, int32_t n_eos,
                   struct fp4s_error *err);
void fp4s_samp_free(struct fp4s_sampler *s);

/* Chooses the next token from logits[vocab] (modified in place; afterwards they hold scratch
 * values, not logits). Does not record the token: call fp4s_samp_accept with the token actually
 * emitted. Returns 0, or FP4S_EINVAL when vocab differs from init or no token has a finite
 * logit after bias and masking, or FP4S_ENOMEM. */
int fp4s_samp_sample(struct fp4s_sampler *s, float *logits, int32_t vocab,
                     struct fp4s_samp_result *out, struct fp4s_error *err);

/* Records an emitted token: counts it for the penalties and for min_tokens. Returns 0 or
 * FP4S_ENOMEM (the counts map grows) / FP4S_EINVAL (token outside the vocabulary). */
int fp4s_samp_accept(struct fp4s_sampler *s, int32_t token);

/* 1 if token ends the sequence: an explicit stop id, or an EOS id unless ignore_eos. */
int fp4s_samp_is_stop(const struct fp4s_sampler *s, int32_t token);

/* A row sampled where the logits are (a GPU backend): what fp4s_samp_sample does, as data.
 * The device applies the edits (one a token: bias, then the min_tokens mask, then the penalties
 * of a token seen in the prompt or the output), then the steps 3-4 above with samp_math.h's
 * arithmetic, and draws with u: the same token fp4s_samp_sample gives for the same state.
 * Logprobs are the chosen token's, its rank and the top n_top, as fp4s_samp_sample gives them
 * (the sums and the logs in double; within ~1e-6): raw (the default mode), the log-softmax of
 * the row before its edits; processed, of the edited row (greedy) or of the kept tokens' weights
 * (drawn). */
struct fp4s_samp_edit {
	int32_t token;
	float bias;     /* added when has_bias */
	uint32_t n_out; /* times generated (frequency and presence penalties when > 0) */
	uint8_t has_bias, mask, seen, pad; /* seen: in the counts (the repetition penalty applies) */
};

enum { FP4S_SAMP_ROW_LP_NONE = 0, FP4S_SAMP_ROW_LP_RAW = 1, FP4S_SAMP_ROW_LP_PROCESSED = 2 };

struct fp4s_samp_row {
	float temperature, top_p, min_p;
	float rep, freq, pres; /* neutral (1, 0, 0) when no penalty is active */
	int32_t top_k;         /* 0: off */
	int32_t greedy;        /* temperature < FP4S_SAMP_GREEDY_EPS: argmax, no draw */
	int32_t n_edits;
	int32_t edit0; /* where this row's edits start in the batch's array (the caller's) */
	int32_t logprobs; /* FP4S_SAMP_ROW_LP_*: logprobs of the chosen token (and n_top alternatives) */
	int32_t n_top;    /* 0 .. FP4S_SAMP_MAX_TOP_LOGPROBS */
	int32_t slot;     /* the backend's own (where the row's logprobs go); plan sets -1 */
	/* 1: planned before the token this step is fed was read (a step enqueued ahead); that token
	 * counts as generated once more in the penalties (seen, n_out + 1). Plan sets 0. */
	int32_t prev_fed;
	double u; /* the draw, uniform in [0, 1) */
};

/* Upper bound of the edits fp4s_samp_plan writes for s now. */
int32_t fp4s_samp_plan_edits(const struct fp4s_sampler *s);

/* Fills row (but edit0) and edits[0 .. *n_edits) for the next token and draws its random number
 * from the sequence's RNG, exactly as fp4s_samp_sample would. cap: room in edits. */
int fp4s_samp_plan(struct fp4s_sampler *s, struct fp4s_samp_row *row, struct fp4s_samp_edit *edits,
                   int32_t cap, int32_t *n_edits, struct fp4s_error *err);

/* What the device does with a row, on the host: the edits applied one a token (with prev, the
 * token fed to the step, counted once more when row->prev_fed), then the draw with row->u
 * (fp4s_samp_sample's token and logprobs for the state the row was planned from, with prev
 * accepted when prev_fed). s gives only scratch and the vocabulary (any sampler of this vocab;
 * its parameters and RNG are not used); logits are overwritten. For a backend that runs the
 * forward pass on the host but is handed planned rows (the engine's steps enqueued ahead). */
int fp4s_samp_sample_row(struct fp4s_sampler *s, const struct fp4s_samp_row *row,
                         const struct fp4s_samp_edit *edits, int32_t prev, float *logits, int32_t vocab,
                         struct fp4s_samp_result *out, struct fp4s_error *err);

/* Step 1-2 of the pipeline alone (bias, min_tokens masking, penalties), in place. Exposed for
 * tests and for a GPU backend that wants the same reference transform. */
void fp4s_samp_process_logits(const struct fp4s_sampler *s, float *logits, int32_t vocab);

#ifdef __cplusplus
}
#endif

#endif
