/* cuda_io.cu: what crosses between the host and a step: the batch's arrays copied up (cu_begin),
 * reads to the host (cu_read), and the argmax, read at once (cu_argmax) or later
 * (cu_argmax_launch / cu_argmax_wait, backend.h's argmax_launch).
 *
 * Why the later read. A greedy decode step ends in a token the host needs only to stream it and
 * check for a stop; the next step needs it on the device. The argmax therefore also leaves each
 * row's token in d_tok (where the next step's embedding reads it), and writes it to pinned host
 * memory the host reads when an event says it is there. The engine enqueues step k + 1 before it
 * waits for step k's tokens, so the GPU never idles for the read, the host's work and the launch
 * (21-44 us a token measured on an H200).
 *
 * For that, nothing here may wait for the GPU while a step is queued: the uploads come from
 * pinned staging (a copy from pageable memory may hold the host until the stream drains), the
 * block table goes up only when a batch row changed, and tok | pos | seq alternate between two
 * staging slots so that filling one never waits for the copy out of the other. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/cuda_impl.h"

/* ---- argmax ------------------------------------------------------------------------------- */

/* Two stages, ties to the lowest index as on the CPU: ARGMAX_PARTS blocks per row each reduce a
 * slice (a 128k vocabulary is 512 KB: one block alone would take ~200 us), then one block per
 * row reduces the parts. */
#define ARGMAX_PARTS 64
#define ARGMAX_ROWS 1024 /* rows a call (the engine's batches are far smaller) */

static __device__ __forceinline__ void argmax_merge(float &bv, int32_t &bi, float v, int32_t i)
{
	if (v > bv || (v == bv && i < bi))
		bv = v, bi = i;
}

static __device__ void argmax_block(float &bv, int32_t &bi)
{
	__shared__ float sv[32];
	__shared__ int32_t si[32];
	for (int o = 16; o > 0; o >>= 1)
		argmax_merge(bv, bi, __shfl_xor_sync(0xFFFFFFFFu, bv, o), __shfl_xor_sync(0xFFFFFFFFu, bi, o));
	if ((threadIdx.x & 31) == 0)
		sv[threadIdx.x / 32] = bv, si[threadIdx.x / 32] = bi;
	__syncthreads();
	if (threadIdx.x < 32) {
		bv = threadIdx.x < blockDim.x / 32 ? sv[threadIdx.x] : -INFINITY;
		bi = threadIdx.x < blockDim.x / 32 ? si[threadIdx.x] : 0x7FFFFFFF;
		for (int o = 16; o > 0; o >>= 1)
			argmax_merge(bv, bi, __shfl_xor_sync(0xFFFFFFFFu, bv, o), __shfl_xor_sync(0xFFFFFFFFu, bi, o));
	}
}

/* Row blockIdx.y's token, in one launch: each of ARGMAX_PARTS blocks reduces its slice to a
 * (value, id) partial and takes a ticket; the block that takes the last one reduces the partials
 * (the pattern of the CUDA samples' threadFenceReduction) and resets the row's ticket for the
 * next launch. One kernel, not a partial pass and a final one: a launch boundary fewer in the
 * token's tail (~1-3 us, on every decode step). The token goes to out[row] (device memory), to
 * host[row] (mapped pinned memory; NULL: none) and, for row < n_feed, to feed[row]: the next
 * step's token row (d_tok). adv (NULL: none): the next step's position row (d_pos), advanced by
 * one for row < n_feed, so that a one-token step replayed after this one needs nothing copied
 * up (cu_begin's mirror). */
static __global__ void argmax_kernel(const float *logits, int64_t vocab, float *pv, int32_t *pi, unsigned *ticket,
                                     int32_t *out, int32_t *host, int32_t *feed, int32_t n_feed, int32_t *adv)
{
	TL_SCOPE(TL_ARGMAX, __LINE__);
	pdl_enter();
	TL_MARK(1);
	const int32_t row = (int32_t)blockIdx.y;
	const float *l = logits + (int64_t)row * vocab;
	const int64_t per = (vocab + ARGMAX_PARTS - 1) / ARGMAX_PARTS;
	const int64_t b = (int64_t)blockIdx.x * per, e = b + per < vocab ? b + per : vocab;
	float bv = -INFINITY;
	int32_t bi = 0x7FFFFFFF;
	for (int64_t v = b + threadIdx.x; v < e; v += blockDim.x)
		argmax_merge(bv, bi, l[v], (int32_t)v);
	argmax_block(bv, bi);
	__shared__ bool last;
	if (threadIdx.x == 0) {
		pv[row * ARGMAX_PARTS + blockIdx.x] = bv, pi[row * ARGMAX_PARTS + blockIdx.x] = bi;
		__threadfence(); /* the partial is visible before the ticket says so */
		last = atomicAdd(&ticket[row], 1u) == ARGMAX_PARTS - 1;
	}
	__syncthreads();
	if (!last)
		return;
	__threadfence();
	bv = -INFINITY, bi = 0x7FFFFFFF;
	for (int j = threadIdx.x; j < ARGMAX_PARTS; j += blockDim.x) /* past L1: other SMs wrote them */
		argmax_merge(bv, bi, __ldcg(pv + row * ARGMAX_PARTS + j), __ldcg(pi + row * ARGMAX_PARTS + j));
	argmax_block(bv, bi);
	if (threadIdx.x == 0) {
		ticket[row] = 0;
		const int32_t t = bi == 0x7FFFFFFF ? 0 : bi;
		out[row] = t;
		if (row < n_feed) {
			feed[row] = t;
			if (adv)
				adv[row] += 1;
		}
		if (host) {
			host[row] = t;
			__threadfence_system(); /* before the event that tells the host to read it */
		}
	}
}

/* d_argmax: [ARGMAX_ROWS] results, [ARGMAX_ROWS * PARTS] values and indices, [ARGMAX_ROWS]
 * tickets; made outside any capture (cu_graph_run_argmax makes it first) */
static int argmax_alloc(struct cuda_impl *c, struct fp4s_error *err)
{
	if (c->d_argmax)
		return FP4S_OK;
	const size_t bytes = (size_t)ARGMAX_ROWS * (2 + 2 * ARGMAX_PARTS) * sizeof(int32_t);
	int rc = cu_dev_alloc(c, (void **)&c->d_argmax, bytes, err);
	if (rc)
		return rc;
	/* the tickets start at 0; on the stream, so the host does not wait for the GPU here */
	FP4S_CUDA_TRY(err, cudaMemsetAsync(c->d_argmax, 0, bytes, c->s));
	return FP4S_OK;
}

/* adv: d_pos advanced for the fed rows (argmax_kernel) */
static int argmax_enqueue(struct cuda_impl *c, const float *logits, int32_t n, int64_t vocab, int32_t *host, bool adv,
                          struct fp4s_error *err)
{
	if (n <= 0 || n > ARGMAX_ROWS)
		return fp4s_error_set(err, FP4S_EINVAL, "argmax: %d rows (1 to %d)", n, ARGMAX_ROWS);
	int rc = argmax_alloc(c, err);
	if (rc)
		return rc;
	float *pv = (float *)(c->d_argmax + ARGMAX_ROWS);
	int32_t *pi = c->d_argmax + ARGMAX_ROWS + ARGMAX_ROWS * ARGMAX_PARTS;
	unsigned *ticket = (unsigned *)(pi + ARGMAX_ROWS * ARGMAX_PARTS);
	const int32_t n_feed = n < c->batch_cap ? n : c->batch_cap;
	pdl_launch(argmax_kernel, dim3(ARGMAX_PARTS, (unsigned)n), 256, 0, c->s, logits, vocab, pv, pi, ticket,
	           c->d_argmax, host, c->d_tok, n_feed, adv ? c->d_pos : (int32_t *)NULL);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

int cu_argmax(struct fp4s_backend *be, const float *logits, int32_t n, int64_t vocab, int32_t *out,
              struct fp4s_error *err)
{
	cu_link_clear(impl_of(be));
	struct cuda_impl *c = impl_of(be);
	int rc = argmax_enqueue(c, logits, n, vocab, NULL, false, err);
	return rc ? rc : cu_read(be, out, c->d_argmax, (int64_t)n * (int64_t)sizeof(int32_t), err);
}

/* Launches in turn write h_tok[0] and h_tok[1] (the forward pass keeps at most two
 * outstanding: the one being waited for and the one enqueued after it); sample.cu's launches
 * take the same turns. *k: the slot the next launch writes (its mapped buffer made once). */
int cu_tok_slot(struct cuda_impl *c, int *k, struct fp4s_error *err)
{
	if (c->n_tok >= 2)
		return fp4s_error_set(err, FP4S_EINVAL, "token launches: two not waited for");
	*k = (c->tok_at + c->n_tok) % 2;
	if (!c->h_tok[*k]) {
		void *p = NULL;
		FP4S_CUDA_TRY(err, cudaHostAlloc(&p, ARGMAX_ROWS * sizeof(int32_t), cudaHostAllocMapped));
		c->h_tok[*k] = (int32_t *)p;
		cudaError_t e = cudaHostGetDevicePointer((void **)&c->dh_tok[*k], p, 0);
		if (e == cudaSuccess && !c->tok_done[*k])
			e = cudaEventCreateWithFlags(&c->tok_done[*k], cudaEventDisableTiming);
		if (e != cudaSuccess) {
			cudaFreeHost(p);
			c->h_tok[*k] = NULL;
			return fp4s_error_set(err, FP4S_ECUDA, "token launches: pinned buffer: %s", cudaGetErrorString(e));
		}
	}
	return FP4S_OK;
}

/* Slot k's n tokens are enqueued: the event the wait syncs on */
int cu_tok_launched(struct cuda_impl *c, int k, int32_t n, struct fp4s_error *err)
{
	FP4S_CUDA_TRY(err, cudaEventRecord(c->tok_done[k], c->s));
	c->tok_n[k] = n;
	c->n_tok++;
	return FP4S_OK;
}

int cu_argmax_launch(struct fp4s_backend *be, const float *logits, int32_t n, int64_t vocab,
                     struct fp4s_error *err)
{
	cu_link_clear(impl_of(be));
	struct cuda_impl *c = impl_of(be);
	int k = 0;
	int rc = cu_tok_slot(c, &k, err);
	if (!rc)
		rc = argmax_enqueue(c, logits, n, vocab, c->dh_tok[k], false, err);
	return rc ? rc : cu_tok_launched(c, k, n, err);
}

/* backend.h's graph_run_argmax. The argmax is captured with the step, so it follows the lm_head
 * inside the graph (a programmatic edge) rather than as launches after it; each token slot has
 * its graph (the mapped buffer is a kernel argument). The argmax advances d_pos, so the next
 * one-token step at the next position copies nothing up (cu_begin): between two decode steps
 * there is then only the graph's own launch. FP4S_GRAPH_TAIL=0 turns it off (A/B). */
struct tail_rec {
	int (*record)(void *ctx, struct fp4s_error *err);
	void *ctx;
	struct cuda_impl *c;
	const float *logits;
	int64_t vocab;
	int32_t *host;
};

static int tail_record(void *p, struct fp4s_error *err)
{
	const struct tail_rec *t = (const struct tail_rec *)p;
	int rc = t->record(t->ctx, err);
	return rc ? rc : argmax_enqueue(t->c, t->logits, 1, t->vocab, t->host, true, err);
}

/* The graph tail's shared part (this file's argmax, sample.cu's draw). ok: a token launch may go
 * into key's graph: FP4S_GRAPH_TAIL is not 0, key is forward.c's (below CU_TAIL_KEY), and the
 * launch is of one row, the step's one token as cu_begin's mirror has it (the kernel advances that
 * position). begin, before the capture or launch: the mirror is not known until the launch is in;
 * done, once it is: the kernel's advance, mirrored. */
int cu_tail_ok(const struct cuda_impl *c, int key, int32_t n)
{
	static int off = -1;
	return !fp4s_env_off("FP4S_GRAPH_TAIL", &off) && n == 1 && c->m_n == 1 && key > 0 && key < CU_TAIL_KEY;
}

void cu_tail_begin(struct cuda_impl *c) { c->m_n = 0; }

void cu_tail_done(struct cuda_impl *c)
{
	c->m_pos[0]++;
	c->m_n = 1;
}

int cu_graph_run_argmax(struct fp4s_backend *be, int key, int (*record)(void *ctx, struct fp4s_error *err), void *ctx,
                        const float *logits, int32_t n, int64_t vocab, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	if (!cu_tail_ok(c, key, n))
		return FP4S_EUNSUPPORTED;
	int k = 0;
	int rc = argmax_alloc(c, err);
	if (rc || (rc = cu_tok_slot(c, &k, err)))
		return rc;
	cu_tail_begin(c);
	struct tail_rec t = {record, ctx, c, logits, vocab, c->dh_tok[k]};
	/* graph keys key + CU_TAIL_KEY (1 + slot) */
	if ((rc = cu_graph_run(be, key + CU_TAIL_KEY * (1 + k), tail_record, &t, err)) ||
	    (rc = cu_tok_launched(c, k, 1, err)))
		return rc;
	cu_tail_done(c);
	return FP4S_OK;
}

int cu_argmax_wait(struct fp4s_backend *be, int32_t *out, int32_t n, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	const int k = c->tok_at;
	if (c->n_tok <= 0 || n > c->tok_n[k])
		return fp4s_error_set(err, FP4S_EINVAL, "argmax: %d tokens asked, %d launched", n,
		                      c->n_tok > 0 ? c->tok_n[k] : 0);
	c->tok_at = (k + 1) % 2;
	c->n_tok--;
	FP4S_CUDA_TRY(err, cudaEventSynchronize(c->tok_done[k]));
	FP4S_CUDA_TRY(err, cudaGetLastError());
	memcpy(out, c->h_tok[k], (size_t)n * sizeof(int32_t));
	return FP4S_OK;
}

/* ---- a step's inputs ---------------------------------------------------------------------- */

/* d_tps (tok | pos | seq rows of batch_cap) and its two pinned staging slots, for n tokens; the
 * graphs hold the old arrays' addresses, so they go (and are captured again) */
static int tps_reserve(struct fp4s_backend *be, int32_t n, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	if (n <= c->batch_cap)
		return FP4S_OK;
	FP4S_CUDA_TRY(err, cudaStreamSynchronize(c->s));
	cu_graph_reset(be);
	cudaFree(c->d_tps);
	c->d_tps = c->d_tok = c->d_pos = c->d_seq = NULL;
	for (int i = 0; i < 2; i++) {
		cudaFreeHost(c->h_tps[i]);
		c->h_tps[i] = NULL;
	}
	free(c->m_pos);
	c->m_pos = c->m_seq = NULL;
	c->m_n = 0;
	c->batch_cap = 0;
	const int32_t cap = n < 256 ? 256 : n;
	int rc = cu_dev_alloc(c, (void **)&c->d_tps, (size_t)cap * 12, err);
	if (rc)
		return rc;
	for (int i = 0; i < 2; i++) {
		FP4S_CUDA_TRY(err, cudaMallocHost((void **)&c->h_tps[i], (size_t)cap * 12));
		if (!c->tps_done[i])
			FP4S_CUDA_TRY(err, cudaEventCreateWithFlags(&c->tps_done[i], cudaEventDisableTiming));
	}
	if (!(c->m_pos = (int32_t *)malloc((size_t)cap * 8)))
		return fp4s_error_set(err, FP4S_ENOMEM, "begin: out of memory");
	c->m_seq = c->m_pos + cap;
	c->d_tok = c->d_tps, c->d_pos = c->d_tps + cap, c->d_seq = c->d_tps + 2 * (size_t)cap;
	c->batch_cap = cap;
	return FP4S_OK;
}

/* The block table's batch rows up to the device when one differs from h_tab (the device's
 * table as copied up); one 2-D copy of the rows up to the highest slot, the columns up to the
 * furthest block read. Rows of other slots go up as h_tab has them: unchanged. */
static int table_upload(struct cuda_impl *c, const struct fp4s_batch *b, struct fp4s_error *err)
{
	const size_t tab = (size_t)c->max_seqs * c->table_stride;
	if (!c->h_tab) {
		FP4S_CUDA_TRY(err, cudaMallocHost((void **)&c->h_tab, tab * sizeof(int32_t)));
		memset(c->h_tab, 0, tab * sizeof(int32_t)); /* as kv_init left d_table */
		if (!c->tab_done)
			FP4S_CUDA_TRY(err, cudaEventCreateWithFlags(&c->tab_done, cudaEventDisableTiming));
	}
	int32_t smax = -1, wmax = 0, changed = 0;
	for (int32_t i = 0; i < b->n; i++) {
		const int32_t s = b->seq[i];
		int32_t w = b->pos[i] / FP4S_KV_BLOCK + 1;
		for (; i + 1 < b->n && b->seq[i + 1] == s; i++) /* a prompt chunk: one row */
			w = b->pos[i + 1] / FP4S_KV_BLOCK + 1 > w ? b->pos[i + 1] / FP4S_KV_BLOCK + 1 : w;
		const size_t at = (size_t)s * c->table_stride;
		if (memcmp(c->h_tab + at, b->block_table + at, (size_t)w * sizeof(int32_t))) {
			if (!changed)
				FP4S_CUDA_TRY(err, cudaEventSynchronize(c->tab_done)); /* the last copy read h_tab */
			changed = 1;
			memcpy(c->h_tab + at, b->block_table + at, (size_t)w * sizeof(int32_t));
		}
		smax = s > smax ? s : smax, wmax = w > wmax ? w : wmax;
	}
	if (!changed)
		return FP4S_OK;
	const size_t row = (size_t)c->table_stride * sizeof(int32_t);
	FP4S_CUDA_TRY(err, cudaMemcpy2DAsync(c->d_table, row, c->h_tab, row, (size_t)wmax * sizeof(int32_t),
	                                     (size_t)smax + 1, cudaMemcpyHostToDevice, c->s));
	FP4S_CUDA_TRY(err, cudaEventRecord(c->tab_done, c->s));
	return FP4S_OK;
}

/* The table went back to zeros (kv_init): so does its mirror. */
void cu_io_table_reset(struct cuda_impl *c)
{
	if (c->h_tab) {
		cudaEventSynchronize(c->tab_done);
		cudaFreeHost(c->h_tab);
		c->h_tab = NULL;
	}
}

int cu_begin(struct fp4s_backend *be, const struct fp4s_batch *b, struct fp4s_error *err)
{
	cu_link_clear(impl_of(be));
	struct cuda_impl *c = impl_of(be);
	/* Prompt chunks (runs of >= 16 tokens of one sequence) go to the flash kernel, which shares
	 * each K/V tile among a tile of queries; decode tokens alone stay on the split-K kernel
	 * (the flash kernel walks a lone token's whole context with one block). */
	c->pf_plan_valid = 0;
	c->pf_step = 0;
	for (int32_t i = 0, run = 0; i < b->n && !c->pf_step; i++) {
		run = i > 0 && b->seq[i] == b->seq[i - 1] ? run + 1 : 1;
		c->pf_step = run >= 16;
	}
	/* (checked for the small batches the fused decode attention takes; larger ones say no) */
	c->one_per_seq = !c->pf_step && b->n <= 64;
	for (int32_t i = 1; i < b->n && c->one_per_seq; i++)
		for (int32_t j = 0; j < i && c->one_per_seq; j++)
			c->one_per_seq = b->seq[i] != b->seq[j];
	for (int32_t i = 0; i < b->n; i++)
		if (b->pos[i] < 0 || b->pos[i] >= c->max_ctx || b->seq[i] < 0 || b->seq[i] >= c->max_seqs)
			return fp4s_error_set(err, FP4S_EINVAL, "token %d: position %d / slot %d outside the "
			                      "KV cache (%d positions, %d slots)", i, b->pos[i], b->seq[i],
			                      c->max_ctx, c->max_seqs);
	if (!b->block_table || b->table_stride != c->table_stride)
		return fp4s_error_set(err, FP4S_EINVAL, "batch block table stride %d, the cache has %d",
		                      b->table_stride, c->table_stride);
	for (int32_t i = 0; i < b->n; i++)
		for (int32_t t = 0; t <= b->pos[i]; t += FP4S_KV_BLOCK) {
			const int32_t blk = b->block_table[(size_t)b->seq[i] * b->table_stride + t / FP4S_KV_BLOCK];
			if (blk < 0 || blk >= c->n_blocks)
				return fp4s_error_set(err, FP4S_EINVAL, "slot %d position %d: block %d outside the "
				                      "pool of %d", b->seq[i], t, blk, c->n_blocks);
		}
	/* tokens NULL: the last argmax left them in d_tok (backend.h), which a regrowth would lose */
	if (!b->tokens && b->n > c->batch_cap)
		return fp4s_error_set(err, FP4S_EINVAL, "a step of %d fed tokens, %d held", b->n, c->batch_cap);
	int rc = tps_reserve(be, b->n, err);
	if (rc || (rc = table_upload(c, b, err)))
		return rc;
	/* fed tokens at the positions the device already holds (the last step's argmax advanced
	 * them): nothing to copy, and no copy between the two steps' kernels */
	const size_t n = (size_t)b->n;
	if (!b->tokens && b->n == c->m_n && !memcmp(b->pos, c->m_pos, n * 4) && !memcmp(b->seq, c->m_seq, n * 4))
		return FP4S_OK;
	/* tok | pos | seq (pos | seq when fed) as one 2-D copy of 3 (2) rows of n */
	c->m_n = 0; /* until the copy is enqueued */
	const int k = c->tps_next;
	c->tps_next ^= 1;
	FP4S_CUDA_TRY(err, cudaEventSynchronize(c->tps_done[k])); /* the copy out of this slot is done */
	int32_t *h = c->h_tps[k];
	const size_t cap = (size_t)c->batch_cap;
	if (b->tokens)
		memcpy(h, b->tokens, n * 4);
	memcpy(h + cap, b->pos, n * 4);
	memcpy(h + 2 * cap, b->seq, n * 4);
	const int r0 = b->tokens ? 0 : 1;
	FP4S_CUDA_TRY(err, cudaMemcpy2DAsync(c->d_tps + r0 * cap, cap * 4, h + r0 * cap, cap * 4, n * 4, (size_t)(3 - r0),
	                                     cudaMemcpyHostToDevice, c->s));
	FP4S_CUDA_TRY(err, cudaEventRecord(c->tps_done[k], c->s));
	memcpy(c->m_pos, b->pos, n * 4);
	memcpy(c->m_seq, b->seq, n * 4);
	c->m_n = b->n;
	return FP4S_OK;
}

int cu_read(struct fp4s_backend *be, void *host, const void *src, int64_t bytes, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	FP4S_CUDA_TRY(err, cudaMemcpyAsync(host, src, (size_t)bytes, cudaMemcpyDeviceToHost, c->s));
	FP4S_CUDA_TRY(err, cudaStreamSynchronize(c->s));
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

void cu_io_free(struct cuda_impl *c)
{
	free(c->m_pos);
	cudaFree(c->d_tps);
	cudaFree(c->d_argmax);
	for (int i = 0; i < 2; i++) {
		cudaFreeHost(c->h_tps[i]);
		if (c->tps_done[i])
			cudaEventDestroy(c->tps_done[i]);
	}
	cudaFreeHost(c->h_tab);
	if (c->tab_done)
		cudaEventDestroy(c->tab_done);
	for (int i = 0; i < 2; i++) {
		cudaFreeHost(c->h_tok[i]);
		if (c->tok_done[i])
			cudaEventDestroy(c->tok_done[i]);
	}
}
