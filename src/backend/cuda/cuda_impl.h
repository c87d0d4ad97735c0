/* cuda_impl.h: the CUDA backend's private state and the helpers its files share
 * (cuda_backend.cu: the backend and its ops; cuda_moe.cu: the MoE ops). Not an API. */
#ifndef FP4S_CUDA_IMPL_H
#define FP4S_CUDA_IMPL_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "util/status.h"

struct cu_moe;   /* cuda_moe.cu */
struct cu_mstep; /* mstep.cu */
struct cu_dstep; /* dstep.cu */
struct cu_ostep; /* ostep.cu */
struct fp4s_stacked;

/* The growable buffers of MoE batches (n > 1), one set for all layers: the layers run one after
 * another on the backend's stream, and graphs capture only one-token steps, which use each
 * layer's fixed buffers. A set per layer cost 36 x 755 MB on gpt-oss-120b at 4096 tokens, more
 * than its 62 GB of weights left on an 80 GB GPU. Order: enum moe_buf. */
enum moe_buf { MB_IDX, MB_W, MB_H, MB_A, MB_O, MB_LG, MB_XB, MB_GPOS, MB_GSRC, MB_GEXP, MB_GOFF, MB_GM, MB_COUNT };
struct cu_moe_bufs {
	void *p[MB_COUNT];
	size_t bytes[MB_COUNT];
};

#define CU_GRAPHS_MAX 96

struct cuda_impl {
	int dev;
	cudaStream_t s;
	void **allocs; /* weights and scratch owned by the backend */
	int32_t n_allocs, cap_allocs;
	void *kc, *vc; /* FP32, BF16 or E4M3 bytes, [layer][block][FP4S_KV_BLOCK][kv_width] */
	enum fp4s_kv_dtype kv_dtype;
	int32_t n_layers, kv_width, n_blocks, max_seqs, max_ctx;
	int32_t *d_table; /* [max_seqs][table_stride] block table, its changed rows copied at begin */
	int32_t table_stride;
	int32_t *d_tok, *d_pos, *d_seq; /* rows of d_tps: tok | pos | seq, batch_cap each */
	int32_t *d_tps;
	int32_t batch_cap;
	/* cuda_io.cu's pinned staging: h_tab mirrors d_table (tab_done: its last copy up), h_tps[2]
	 * tok | pos | seq for alternate steps (tps_done[i]: slot i's copy up); h_tok[i] the tokens
	 * of argmax launches in turn (mapped: dh_tok[i] is the device's address; tok_done[i]: written;
	 * tok_n[i] rows), n_tok of them not waited for, the oldest at tok_at */
	int32_t *h_tab, *h_tps[2], *h_tok[2], *dh_tok[2];
	/* what d_pos and d_seq hold once the work enqueued so far has run: m_n rows of m_pos, m_seq
	 * (host memory, batch_cap each; m_n 0: not known). A step whose rows are these (with their
	 * tokens fed) copies nothing up: after a one-token step whose argmax advanced d_pos (a graph
	 * with the token's launch in it, cu_tail_done), that is the next decode step. */
	int32_t *m_pos, *m_seq, m_n;
	cudaEvent_t tab_done, tps_done[2], tok_done[2];
	int tps_next, tok_at, n_tok;
	int32_t tok_n[2];
	float *moe_logits, *moe_h1, *moe_h2, *moe_a, *moe_o;
	int64_t moe_cap_tokens, moe_cap_inter, moe_cap_hidden;
	int32_t moe_cap_experts;
	float *host_logits;
	/* captured steps: a one-token step (and its token tails, cuda_io.cu / sample.cu), and a
	 * decode batch for each row count 2..64 (forward.c's fwd_batch_graph) */
	struct {
		int key;
		cudaGraphExec_t exec;
	} graphs[CU_GRAPHS_MAX];
	int32_t n_graphs;
	int32_t *d_argmax;
	void *d_samp, *h_samp; /* cu_stage_reserve: a host op's device buffer and its pinned staging
	                        * (sample.cu's rows, edits and tokens; nll.cu's targets and results) */
	size_t samp_bytes;
	/* sample.cu's launches (cu_sample_launch): rows and edits staged in pinned h_sl[i] for
	 * alternate launches (sl_done[i]: its copy up), one device copy d_sl; sl_bytes each */
	void *d_sl, *h_sl[2];
	cudaEvent_t sl_done[2];
	size_t sl_bytes;
	int sl_next;
	/* cu_graph_run_sample: the row's copy up on s2, a branch of the graph (sl_fork, sl_join) */
	cudaStream_t s2;
	cudaEvent_t sl_fork, sl_join;
	float *d_samp_work; /* sample.cu: rows with logprobs sample in a copy */
	size_t samp_work_bytes;
	int32_t sm_count;
	float *work1, *workn; /* attention partials: one-token steps (fixed: graphs hold it), others */
	void *pf_work;        /* prompt attention's tile list (attention_prefill.cu) */
	int64_t pf_work_bytes;
	int pf_plan_valid;    /* pf_work holds this step's tiles (made by layer 0) */
	int pf_step;          /* this step has a prompt chunk: the flash kernel takes its attention */
	int one_per_seq;      /* no two tokens of this step share a sequence (decode) */
	int64_t workn_floats;
	int32_t splits1;
	struct cu_moe *moes;
	struct cu_mstep *ms; /* the whole-step kernel's state (mstep.cu), NULL: not prepared */
	struct cu_dstep *ds; /* the dense models' (dstep.cu), NULL: not prepared */
	struct cu_ostep *os; /* gpt-oss models' (ostep.cu), NULL: not prepared */
	struct cu_moe_bufs moeb;
	/* Activations handed staged from one one-token matmul to the next (gemv_mma.h's
	 * fp4s_gemv_link): two buffers in turn, what the last launch left in buf[1 - next]
	 * (valid: x's K elements, times nw where set), and the forward pass's hint (norm_next) of
	 * the norm that reads h after the next residual add. Valid only from one op to the next:
	 * every other op clears it (cu_link_clear). */
	struct {
		uint8_t *buf[2];
		float *ss[2];
		int next, valid, zc, hint_zc;
		const float *x, *nw, *hint_h, *hint_nw;
		int64_t K;
	} lk;
	/* The forward pass's hint (moe_next): the next residual add into mh_h is read by
	 * norm_moe_add(mh_p, mh_h, mh_nw) after it, so that add may also take the router's share
	 * (cu_moe_matmul_add_route). The add clears it. */
	const float *mh_h, *mh_nw;
	const struct fp4s_moe_params *mh_p;
	int mh_zc;
};

/* the staged hand-over's limit (buffers sized for it at kv_init) */
#define CU_LINK_KMAX 32768

static inline void cu_link_clear(struct cuda_impl *c)
{
	c->lk.valid = 0;
	c->lk.hint_h = NULL;
	c->mh_h = NULL;
}

static inline struct cuda_impl *impl_of(struct fp4s_backend *be) { return (struct cuda_impl *)be->impl; }

/* one 256-thread block per 256 elements, at most 4096 blocks (grid-stride loops) */
static inline int grid1(int64_t n) { return (int)(n / 256 + 1 < 4096 ? n / 256 + 1 : 4096); }

/* cuda_backend.cu */
int cu_track(struct cuda_impl *c, void *p, struct fp4s_error *err); /* freed with the backend */
int cu_dev_alloc(struct cuda_impl *c, void **p, size_t bytes, struct fp4s_error *err);
size_t cu_mat_data_bytes(const struct fp4s_mat *m, size_t *scale_b);
void cu_graph_reset(struct fp4s_backend *be);
/* A buffer that captured graphs may hold is about to move: FP4S_EINVAL while the stream is being
 * captured (the caller grows nothing: forward.c runs each batch size once uncaptured first, so
 * this is a fault), else the stream drained and the graphs dropped. */
int cu_graph_before_move(struct cuda_impl *c, const char *what, struct fp4s_error *err);
/* backend.h's graph_run (cuda_backend.cu): key's graph, captured from record(ctx) the first time */
int cu_graph_run(struct fp4s_backend *be, int key, int (*record)(void *ctx, struct fp4s_error *err), void *ctx,
                 struct fp4s_error *err);

/* cuda_io.cu: backend.h's begin, read, argmax, argmax_launch / argmax_wait, graph_run_argmax; cu_io_table_reset
 * after d_table was zeroed, cu_io_free at destroy */
int cu_begin(struct fp4s_backend *be, const struct fp4s_batch *b, struct fp4s_error *err);
int cu_read(struct fp4s_backend *be, void *host, const void *src, int64_t bytes, struct fp4s_error *err);
int cu_argmax(struct fp4s_backend *be, const float *logits, int32_t n, int64_t vocab, int32_t *out,
              struct fp4s_error *err);
int cu_argmax_launch(struct fp4s_backend *be, const float *logits, int32_t n, int64_t vocab,
                     struct fp4s_error *err);
int cu_argmax_wait(struct fp4s_backend *be, int32_t *out, int32_t n, struct fp4s_error *err);
int cu_graph_run_argmax(struct fp4s_backend *be, int key, int (*record)(void *ctx, struct fp4s_error *err), void *ctx,
                        const float *logits, int32_t n, int64_t vocab, struct fp4s_error *err);
/* the graph tail's shared checks and mirror updates (cu_graph_run_argmax, cu_graph_run_sample);
 * forward.c's graph keys are below CU_TAIL_KEY, the tails' above it */
#define CU_TAIL_KEY 256
int cu_tail_ok(const struct cuda_impl *c, int key, int32_t n);
void cu_tail_begin(struct cuda_impl *c);
void cu_tail_done(struct cuda_impl *c);
/* the token slot of the next argmax or sample launch (*k; mapped h_tok[*k], dh_tok[*k]), and its
 * n tokens enqueued (the event argmax_wait syncs on) */
int cu_tok_slot(struct cuda_impl *c, int *k, struct fp4s_error *err);
int cu_tok_launched(struct cuda_impl *c, int k, int32_t n, struct fp4s_error *err);
void cu_io_table_reset(struct cuda_impl *c);
void cu_io_free(struct cuda_impl *c);
int cu_matmul(struct fp4s_backend *be, const float *x, int64_t n, const struct fp4s_mat *w, float *y,
              struct fp4s_error *err);
void cu_rmsnorm(struct fp4s_backend *be, const float *x, const float *w, int64_t rows, int64_t width, float eps,
                enum fp4s_norm_kind kind, float *y);
void cu_swiglu(struct fp4s_backend *be, const float *gate, const float *up, int64_t n, int64_t inter, float *out);

/* sample.cu: c->d_samp and c->h_samp of at least need bytes each (kept, grown by half again).
 * For ops that copy up, launch and read back on c->s, synchronously: outside any capture. */
int cu_stage_reserve(struct cuda_impl *c, size_t need, struct fp4s_error *err);

/* nll.cu: backend.h's token_nll */
int cu_token_nll(struct fp4s_backend *be, const float *logits, int32_t n, int64_t vocab, const int32_t *targets,
                 double *out, struct fp4s_error *err);

/* sample.cu: backend.h's sample */
int cu_sample(struct fp4s_backend *be, float *logits, int32_t n, int64_t vocab, const struct fp4s_samp_row *rows,
              const struct fp4s_samp_edit *edits, int32_t n_edits, int32_t *out, struct fp4s_samp_result *lp,
              struct fp4s_error *err);
/* sample.cu: backend.h's sample_launch (read by cu_argmax_wait); cu_sample_free at destroy */
int cu_sample_launch(struct fp4s_backend *be, float *logits, int32_t n, int64_t vocab,
                     const struct fp4s_samp_row *rows, const struct fp4s_samp_edit *edits, int32_t n_edits,
                     struct fp4s_error *err);
void cu_sample_free(struct cuda_impl *c);
int cu_graph_run_sample(struct fp4s_backend *be, int key, int (*record)(void *ctx, struct fp4s_error *err), void *ctx,
                        float *logits, int32_t n, int64_t vocab, const struct fp4s_samp_row *rows,
                        const struct fp4s_samp_edit *edits, int32_t n_edits, struct fp4s_error *err);

/* cuda_upload.cu: sets be's weight uploads (upload_mat, upload_f32, upload_fused, upload_gate_up) */
void cu_upload_install(struct fp4s_backend *be);
/* a's and b's rows (codes rd, scales rs bytes a row) to alternating rows from d / sc / bias on,
 * through the device buffer tmp (>= a part's codes and its rows' floats); sc, bias NULL: none */
cudaError_t cu_put_pairs(const struct fp4s_mat *a, const struct fp4s_mat *b, size_t rd, size_t rs, uint8_t *d,
                         uint8_t *sc, float *bias, void *tmp);
/* m's format is FP4: its codes at d (bytes, whole rows, already copied) to the device's permuted
 * word layout (e2m1_device.h), done before it returns; other formats: nothing */
int cu_permute_codes(const struct fp4s_mat *m, void *d, size_t bytes, cudaStream_t s, struct fp4s_error *err);

/* cuda_moe.cu: sets be's MoE ops (upload_moe, moe, moe_add, norm_moe_add); frees their state */
void cu_moe_install(struct fp4s_backend *be);
void cu_moe_free(struct cuda_impl *c);
/* upload_moe's stacked experts (p->dev): which 0 gate|up, 1 down; *form its gate|up row order
 * (cuda_moe.cu's struct cu_moe) */
const struct fp4s_stacked *cu_moe_stacked(const void *dev, int which, int *form);
void cu_mstep_install(struct fp4s_backend *be); /* mstep.cu */
/* dstep.cu: the dense models' whole-step kernel (mstep.cu's hooks call these) */
int cu_dstep_prepare(struct cuda_impl *c, const struct fp4s_step_desc *d, struct fp4s_error *err);
int cu_dstep_launch(struct cuda_impl *c, float *h, struct fp4s_error *err);
/* ostep.cu: gpt-oss models' whole-step kernel (mstep.cu's hooks call these) */
int cu_ostep_prepare(struct cuda_impl *c, const struct fp4s_step_desc *d, struct fp4s_error *err);
int cu_ostep_launch(struct cuda_impl *c, float *h, struct fp4s_error *err);
/* FP4S_DSTEP_TL=L: layer L's phase marks of the last step, to stderr (at the backend's end) */
void cu_dstep_report(struct cuda_impl *c);
/* FP4S_MSTEP_TL=L: the same for mstep.cu (the MoE step) */
void cu_mstep_report(struct cuda_impl *c);
/* FP4S_OSTEP_TL=L: the same for ostep.cu */
void cu_ostep_report(struct cuda_impl *c);
/* a step kernel's marks (dev_tl: [G][n] globaltimer ns, 0 where a block has none) as the median and
 * max over the blocks of each, from the earliest first mark */
void cu_step_tl_print(const char *kind, const unsigned long long *dev_tl, int G, int n, const char *const *names,
                      int layer);
/* the marks' buffer ([SMs][n], backend memory) where the environment variable env names a layer
 * below L (*layer: it, else -1); NULL otherwise or where it cannot be had */
unsigned long long *cu_step_tl_alloc(struct cuda_impl *c, const char *env, int L, int n, int *layer);
/* a step kernel over all SMs, one block each, all resident at once (they wait on each other): its
 * phase counters (cnt_bytes at cnt) and its timeline (n_marks a block at tl, where kept) zeroed,
 * then a cooperative launch on the backend's stream; args: the kernel's one argument block */
cudaError_t cu_step_run(struct cuda_impl *c, const void *kernel, void *args, unsigned threads, size_t smem, void *cnt,
                        size_t cnt_bytes, void *tl, int n_marks);
/* h += W x for one token, p the MoE block the hint (mh_*) names next: also the next MoE router's
 * logits, added in the add's blocks, for a one-launch MoE block that routes in every block
 * (moe_tma.cu, local); FP4S_EUNSUPPORTED (nothing enqueued) where that path is not taken. Reads
 * mh_nw / mh_zc; the caller (cu_matmul_add) has already cleared mh_h. */
int cu_moe_matmul_add_route(struct cuda_impl *c, const struct fp4s_moe_params *p, const struct fp4s_mat *w,
                            const float *x, float *h, struct fp4s_error *err);

#endif
