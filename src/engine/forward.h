/* forward.h: the decoder forward pass for llama, qwen3, qwen3_moe and gpt_oss (and llama2.c
 * checkpoints, which load as llama), written once against backend.h (architectures.md §1-§5).
 * A step takes a flattened batch of tokens from several sequences and returns logits for the
 * rows asked for. Weights are views into the loaded model; only norms, biases and sinks are
 * converted to FP32 once at set-up. */
#ifndef FP4S_FORWARD_H
#define FP4S_FORWARD_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/model.h"

struct fp4s_sampler; /* engine/sampler.h */

struct fp4s_fwd_layer {
	float *attn_norm, *ffn_norm, *q_norm, *k_norm;
	struct fp4s_mat q, k, v, o;
	float *bq, *bk, *bv, *bo;
	float *sinks;
	int32_t window;
	int32_t is_moe;
	struct fp4s_mat gate, up, down;
	struct fp4s_mat qkv, gate_up; /* fused views (rows concatenated) when the backend made them */
	int32_t fused_qkv, fused_gu;
	int32_t gu_pairs; /* gate_up's rows alternate gate, up (backend upload_gate_up); gate/up have no data */
	struct fp4s_moe_params moe;
	struct fp4s_expert *experts;
};

/* launches that may be outstanding (the one being collected and the one after it) */
#define FP4S_FWD_AHEAD 2
/* rows an argmax launch may have */
#define FP4S_FWD_LAUNCH_ROWS 1024

/* the most rows a decode batch replayed as a graph may have (a bit each in batch_seen) */
#define FP4S_FWD_GRAPH_ROWS 64

struct fp4s_fwd {
	const struct fp4s_model *model;
	const struct fp4s_config *cfg;
	struct fp4s_backend *be;
	struct fp4s_mat embed, lm_head;
	float *final_norm;
	struct fp4s_fwd_layer *layers;
	float *inv_freq;
	float rope_mscale;
	int32_t rot_dim;
	enum fp4s_norm_kind norm_kind;
	int32_t max_seqs, max_ctx;
	int32_t n_blocks, table_stride; /* KV pool size; block-table row length (max_ctx / block) */
	int32_t *ident_table; /* slot s owns blocks [s * table_stride, (s + 1) * table_stride) */
	void **owned; /* converted FP32 arrays, transposed expert weights */
	int32_t n_owned, cap_owned;
	/* activation buffers in backend memory, sized for scratch_tokens tokens */
	float *h, *x, *q, *k, *v, *att, *g, *u, *y, *last, *logits;
	float *fused; /* one token's fused q|k|v or gate|up output */
	int32_t scratch_tokens, scratch_out;
	int32_t has_moe;
	int32_t moe_on_device; /* every MoE layer routes on the backend (no host round trip) */
	int32_t step_ok; /* the backend's step_layers runs one-token steps (backend.h step_prepare) */
	/* decode batches of n = 2..FP4S_FWD_GRAPH_ROWS sequences already run once (bit n - 1): their
	 * next steps are captured as graphs (see fwd_batch_graph) */
	uint64_t batch_seen;
	/* fp4s_fwd_launch_argmax's launches not collected yet, oldest first (FP4S_FWD_AHEAD at
	 * most): the first at launched_at, their row counts; on a backend without argmax_launch, their
	 * tokens (held, found when launched) */
	int32_t n_launched, launched_at, launch_n[FP4S_FWD_AHEAD];
	int32_t *held[FP4S_FWD_AHEAD];
	int32_t fed_n; /* the last step's argmax rows still feed a batch with tokens NULL; 0: none */
	/* a sampled launch on a backend without sample_launch: the logits on the host, a sampler
	 * for scratch (sampler.h's fp4s_samp_sample_row), the fed tokens (a row without a token
	 * feeds token 0, as on a GPU) */
	float *host_logits;
	int64_t host_logits_n;
	struct fp4s_sampler *samp_scratch;
	int32_t *feed_tmp;
};


/* Builds the views and the KV cache: max_seqs sequences of up to max_ctx positions over a pool
 * of n_blocks blocks (0: enough for every slot at full length, and batches without a block
 * table then use a fixed table that gives each slot its own range). */
int fp4s_fwd_init(struct fp4s_fwd *f, const struct fp4s_model *m, struct fp4s_backend *be,
                  int32_t max_seqs, int32_t max_ctx, enum fp4s_kv_dtype kv, struct fp4s_error *err);
int fp4s_fwd_init_pool(struct fp4s_fwd *f, const struct fp4s_model *m, struct fp4s_backend *be,
                       int32_t max_seqs, int32_t max_ctx, int32_t n_blocks, enum fp4s_kv_dtype kv,
                       struct fp4s_error *err);
void fp4s_fwd_free(struct fp4s_fwd *f);

/* Runs the batch; writes logits [n_out, vocab] for batch rows out_rows[0..n_out). */
int fp4s_fwd_run(struct fp4s_fwd *f, const struct fp4s_batch *b, const int32_t *out_rows,
                 int32_t n_out, float *logits, struct fp4s_error *err);

/* The same, returning only the argmax token of each row (greedy decoding without moving the
 * logits off the device). */
int fp4s_fwd_run_argmax(struct fp4s_fwd *f, const struct fp4s_batch *b, const int32_t *out_rows,
                        int32_t n_out, int32_t *tokens, struct fp4s_error *err);

/* The same, split so that the next step can be enqueued before this one's tokens are read (the
 * GPU then does not wait for the host between them): launch enqueues the step and its argmax,
 * collect waits for the oldest launch's n_out tokens. Up to FP4S_FWD_AHEAD launches may be
 * outstanding. b->tokens may be NULL when the step before was a launch: token i is then the one
 * that launch found for its out row i (b->n <= its n_out), which on a GPU never left it. */
int fp4s_fwd_launch_argmax(struct fp4s_fwd *f, const struct fp4s_batch *b, const int32_t *out_rows,
                           int32_t n_out, struct fp4s_error *err);
int fp4s_fwd_collect(struct fp4s_fwd *f, int32_t *tokens, struct fp4s_error *err);
/* The same launch with a token drawn for each row as rows[i] says (fp4s_fwd_run_sample without
 * logprobs: no row may ask for them), collected by fp4s_fwd_collect; a token of -1 there: no
 * finite logit (the next step was fed token 0 for it). The rows' plans must be made before the
 * launch (their draws are taken then). A row with prev_fed (sampler.h) needs a fed batch and
 * out row i = batch row i: the token fed to row i is counted in its penalties. */
int fp4s_fwd_launch_sample(struct fp4s_fwd *f, const struct fp4s_batch *b, const int32_t *out_rows, int32_t n_out,
                           const struct fp4s_samp_row *rows, const struct fp4s_samp_edit *edits, int32_t n_edits,
                           struct fp4s_error *err);
/* 1 when fp4s_fwd_launch_sample keeps the GPU going (backend.h's sample_launch, device sampling
 * on); on a synchronous backend the launch samples on the host and this is 1 too */
int fp4s_fwd_can_launch_sample(const struct fp4s_fwd *f);
/* 1 when the step is queued on a GPU and the host free meanwhile (argmax_launch); 0: a launch
 * runs to its end first (the CPU backend; launch and collect still work, for tests) */
int fp4s_fwd_async(const struct fp4s_fwd *f);
/* 1 when the backend samples on its own (backend.h's sample) and FP4S_DEVICE_SAMPLE is not 0 (the
 * host's sampler instead, for A/B): fp4s_fwd_run_sample may be used */
int fp4s_fwd_can_sample(const struct fp4s_fwd *f);

/* The same, returning a token of each row drawn where the logits are, as rows[i] says
 * (sampler.h's fp4s_samp_plan; edits[rows[i].edit0 ..]), and lp[i] for the rows with raw
 * logprobs (lp may be NULL when none asks). A token of -1: no finite logit. */
int fp4s_fwd_run_sample(struct fp4s_fwd *f, const struct fp4s_batch *b, const int32_t *out_rows, int32_t n_out,
                        const struct fp4s_samp_row *rows, const struct fp4s_samp_edit *edits, int32_t n_edits,
                        int32_t *tokens, struct fp4s_samp_result *lp, struct fp4s_error *err);

/* 1 when the backend scores tokens where the logits are (backend.h's token_nll) and
 * FP4S_DEVICE_SAMPLE is not 0: fp4s_fwd_run_nll may be used */
int fp4s_fwd_can_nll(const struct fp4s_fwd *f);

/* The same, returning for each row asked for the negative log-likelihood of targets[i] (nats;
 * the log-sum-exp in double) instead of its logits (perplexity). */
int fp4s_fwd_run_nll(struct fp4s_fwd *f, const struct fp4s_batch *b, const int32_t *out_rows, int32_t n_out,
                     const int32_t *targets, double *nll, struct fp4s_error *err);

#endif
