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

static __global__ void argmax_part_kernel(const float *logits, int64_t vocab, float *pv, int32_t *pi)
{
	TL_SCOPE(TL_ARGMAX, __LINE__);
	pdl_enter();
	TL_MARK(1);
	const float *l = logits + (int64_t)blockIdx.y * vocab;
	const int64_t per = (vocab + ARGMAX_PARTS - 1) / ARGMAX_PARTS;
	const int64_t b = (int64_t)blockIdx.x * per, e = b + per < vocab ? b + per : vocab;
	float bv = -INFINITY;
	int32_t bi = 0x7FFFFFFF;
	for (int64_t v = b + threadIdx.x; v < e; v += blockDim.x)
		argmax_merge(bv, bi, l[v], (int32_t)v);
	argmax_block(bv, bi);
	if (threadIdx.x == 0)
		pv[blockIdx.y * ARGMAX_PARTS + blockIdx.x] = bv, pi[blockIdx.y * ARGMAX_PARTS + blockIdx.x] = bi;
}

/* Row i's token to out[i] (device memory), to host[i] (mapped pinned memory; NULL: none) and,
 * for i < n_feed, to feed[i]: the next step's token i (d_tok). */
static __global__ void argmax_final_kernel(const float *pv, const int32_t *pi, int32_t *out, int32_t *host,
                                           int32_t *feed, int32_t n_feed)
{
	TL_SCOPE(TL_ARGMAX_FINAL, __LINE__);
	pdl_enter();
	TL_MARK(1);
	float bv = -INFINITY;
	int32_t bi = 0x7FFFFFFF;
	for (int j = threadIdx.x; j < ARGMAX_PARTS; j += blockDim.x)
		argmax_merge(bv, bi, pv[blockIdx.x * ARGMAX_PARTS + j], pi[blockIdx.x * ARGMAX_PARTS + j]);
	argmax_block(bv, bi);
	if (threadIdx.x == 0) {
		const int32_t t = bi == 0x7FFFFFFF ? 0 : bi;
		out[blockIdx.x] = t;
		if ((int32_t)blockIdx.x < n_feed)
			feed[blockIdx.x] = t;
		if (host) {
			host[blockIdx.x] = t;
			__threadfence_system(); /* before the event that tells the host to read it */
		}
	}
}

static int argmax_enqueue(struct cuda_impl *c, const float *logits, int32_t n, int64_t vocab, int32_t *host,
                          struct fp4s_error *err)
{
	if (n <= 0 || n > ARGMAX_ROWS)
		return fp4s_error_set(err, FP4S_EINVAL, "argmax: %d rows (1 to %d)", n, ARGMAX_ROWS);
	if (!c->d_argmax) {
		/* [ARGMAX_ROWS] results, then [ARGMAX_ROWS * PARTS] values and indices */
		int rc = cu_dev_alloc(c, (void **)&c->d_argmax,
		                      (size_t)ARGMAX_ROWS * (1 + 2 * ARGMAX_PARTS) * sizeof(int32_t), err);
		if (rc)
			return rc;
	}
	float *pv = (float *)(c->d_argmax + ARGMAX_ROWS);
	int32_t *pi = c->d_argmax + ARGMAX_ROWS + ARGMAX_ROWS * ARGMAX_PARTS;
	const int32_t n_feed = n < c->batch_cap ? n : c->batch_cap;
	pdl_launch(argmax_part_kernel, dim3(ARGMAX_PARTS, (unsigned)n), 256, 0, c->s, logits, vocab, pv, pi);
	pdl_launch(argmax_final_kernel, dim3(n), 64, 0, c->s, pv, pi, c->d_argmax, host, c->d_tok, n_feed);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

int cu_argmax(struct fp4s_backend *be, const float *logits, int32_t n, int64_t vocab, int32_t *out,
              struct fp4s_error *err)
{
	cu_link_clear(impl_of(be));
	struct cuda_impl *c = impl_of(be);
	int rc = argmax_enqueue(c, logits, n, vocab, NULL, err);
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
		rc = argmax_enqueue(c, logits, n, vocab, c->dh_tok[k], err);
	return rc ? rc : cu_tok_launched(c, k, n, err);
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
	/* tok | pos | seq (pos | seq when fed) as one 2-D copy of 3 (2) rows of n */
	const int k = c->tps_next;
	c->tps_next ^= 1;
	FP4S_CUDA_TRY(err, cudaEventSynchronize(c->tps_done[k])); /* the copy out of this slot is done */
	int32_t *h = c->h_tps[k];
	const size_t cap = (size_t)c->batch_cap, n = (size_t)b->n;
	if (b->tokens)
		memcpy(h, b->tokens, n * 4);
	memcpy(h + cap, b->pos, n * 4);
	memcpy(h + 2 * cap, b->seq, n * 4);
	const int r0 = b->tokens ? 0 : 1;
	FP4S_CUDA_TRY(err, cudaMemcpy2DAsync(c->d_tps + r0 * cap, cap * 4, h + r0 * cap, cap * 4, n * 4, (size_t)(3 - r0),
	                                     cudaMemcpyHostToDevice, c->s));
	FP4S_CUDA_TRY(err, cudaEventRecord(c->tps_done[k], c->s));
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
