/* cuda_moe.cu: the CUDA backend's MoE ops (backend.h upload_moe, moe, moe_add, norm_moe_add):
 * the experts stacked on the device, one-token MoE blocks in three launches, batches grouped by
 * expert through the grouped GEMM (moe_gemm.cu) or the grouped GEMV, and the host-routed path
 * for weights the device path declines. Kernels live in moe.cu, moe_gemm.cu and the GEMV files;
 * the backend's state in cuda_impl.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_impl.h"
#include "backend/cuda/gemv_cuda.h"
#include "backend/cuda/gemv_mma.h"
#include "backend/cuda/moe_cuda.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/swiglu.cuh"

/* the host-routed path's per-token SwiGLU (gpt-oss) and weighted sum */
static __global__ void swiglu_oai_kernel(const float *gu, int64_t n, float alpha, float limit, float *out)
{
	TL_SCOPE(TL_SMALL + 2, __LINE__);
	pdl_enter();
	TL_MARK(1);
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
		out[i] = swiglu_oai(gu[2 * i], gu[2 * i + 1], alpha, limit);
}

static __global__ void axpy_kernel(float *y, const float *x, float a, int64_t n, int first)
{
	TL_SCOPE(TL_SMALL + 2, __LINE__);
	pdl_enter();
	TL_MARK(1);
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
		y[i] = first ? a * x[i] : y[i] + a * x[i];
}

/* A MoE layer on the device: gate|up and down, each stacked over all experts, plus the step's
 * buffers. */
struct cu_moe {
	struct fp4s_stacked gu, down;
	/* an expert's gate|up rows: 0 gate rows then up rows, 1 gpt-oss's interleaved gate_up (clamped
	 * SwiGLU), 2 gate and up interleaved at upload (silu(gate) * up), so that the gate|up GEMV's
	 * epilogue can write the SwiGLU (FP4S_MOE_PAIRS=0: form 0) */
	int form;
	/* one-token buffers (fixed: graphs hold them) and, for larger batches, views of the
	 * backend's shared growable set (moe_batch_bufs) */
	int32_t *idx1, *idxn;
	float *w1, *wn, *h1, *hn, *a1, *an, *o1, *on, *lg1, *lgn;
	float *x1;     /* norm_moe_add: the normalized token, where the gate|up GEMV declines the norm */
	long long *racc; /* the router logits' shares from the o projection ([2][E], moe_tma.cu), or NULL */
	int lr_pending;  /* the add before norm_moe_add took the shares: it must route from them */
	unsigned *cnt; /* norm_moe_add: word 0 the fused router's block counter (left zero by each
	                * launch), the rest the one-launch block's counters (moe_tma.cu; they only
	                * grow) */
	int32_t *gpos, *gsrc, *gexp, *goff, *gm; /* batches: the slots grouped by expert */
	void *xbn;                               /* batches on the GEMM: BF16 activations */
	struct cu_moe *next; /* all layers' records, freed with the backend */
};

/* Stacks one projection of every expert (parts[e], each a [rows, cols] view, in order) into one
 * allocation; parts2 (may be NULL) are appended to each expert's block (gate then up), or with
 * pairs (equal rows) alternate with parts' rows (row 2i gate i, 2i + 1 up i: each part copied to
 * the device once, then to every other row by a strided device copy). */
static int stack_experts(struct cuda_impl *c, const struct fp4s_mat *const *parts, const struct fp4s_mat *const *parts2,
                         int32_t E, int pairs, struct fp4s_stacked *out, struct fp4s_error *err)
{
	const struct fp4s_mat *m0 = parts[0];
	size_t sb, db = cu_mat_data_bytes(m0, &sb);
	const int64_t rows = m0->rows + (parts2 ? parts2[0]->rows : 0);
	int any_bias = 0, per_expert_ws2 = 0;
	for (int32_t e = 0; e < E; e++) {
		const struct fp4s_mat *ms[2] = {parts[e], parts2 ? parts2[e] : NULL};
		for (int k = 0; k < 2; k++) {
			if (!ms[k])
				continue;
			if (!ms[k]->data || ms[k]->fmt != m0->fmt || ms[k]->cols != m0->cols || ms[k]->rows != (k ? parts2[0] : m0)->rows)
				return FP4S_EUNSUPPORTED;
			any_bias |= ms[k]->bias != NULL;
		}
		if (m0->fmt == FP4S_WF_NVFP4) {
			if (parts2 && parts2[e]->ws2 != parts[e]->ws2)
				return FP4S_EUNSUPPORTED; /* gate and up of one expert must share a scale */
			per_expert_ws2 |= parts[e]->ws2 != m0->ws2;
		}
	}
	if (m0->fmt != FP4S_WF_NVFP4 && m0->fmt != FP4S_WF_MXFP4 && m0->fmt != FP4S_WF_BF16)
		return FP4S_EUNSUPPORTED;
	const size_t row_d = db / (size_t)m0->rows, row_s = sb / (size_t)m0->rows;
	if (pairs && (!parts2 || parts2[0]->rows != m0->rows))
		return FP4S_EUNSUPPORTED;
	uint8_t *d = NULL, *sc = NULL, *tmp = NULL;
	float *bias = NULL, *ws2e = NULL;
	int rc;
	if (pairs && (rc = cu_dev_alloc(c, (void **)&tmp, db > (size_t)m0->rows * 4 ? db : (size_t)m0->rows * 4, err)))
		return rc;
	if ((rc = cu_dev_alloc(c, (void **)&d, row_d * (size_t)rows * (size_t)E, err)) || (rc = cu_track(c, d, err)) ||
	    (row_s && ((rc = cu_dev_alloc(c, (void **)&sc, row_s * (size_t)rows * (size_t)E, err)) ||
	               (rc = cu_track(c, sc, err)))) ||
	    (any_bias && ((rc = cu_dev_alloc(c, (void **)&bias, sizeof(float) * (size_t)rows * (size_t)E, err)) ||
	                  (rc = cu_track(c, bias, err))))) {
		cudaFree(tmp);
		return rc;
	}
	for (int32_t e = 0; pairs && e < E; e++) {
		const size_t at = (size_t)e * (size_t)rows; /* the expert's first row */
		const cudaError_t ce = cu_put_pairs(parts[e], parts2[e], row_d, row_s, d + row_d * at,
		                                    sc ? sc + row_s * at : NULL, bias ? bias + at : NULL, tmp);
		if (ce != cudaSuccess) {
			cudaFree(tmp);
			FP4S_CUDA_TRY(err, ce);
		}
	}
	cudaFree(tmp);
	for (int32_t e = 0; !pairs && e < E; e++) {
		int64_t r0 = 0;
		const struct fp4s_mat *ms[2] = {parts[e], parts2 ? parts2[e] : NULL};
		for (int k = 0; k < 2; k++) {
			const struct fp4s_mat *m = ms[k];
			if (!m)
				continue;
			const size_t at = (size_t)e * (size_t)rows + (size_t)r0;
			FP4S_CUDA_TRY(err, cudaMemcpy(d + row_d * at, m->data, row_d * (size_t)m->rows, cudaMemcpyHostToDevice));
			if (row_s)
				FP4S_CUDA_TRY(err, cudaMemcpy(sc + row_s * at, m->scales, row_s * (size_t)m->rows,
				                              cudaMemcpyHostToDevice));
			if (any_bias) {
				if (m->bias)
					FP4S_CUDA_TRY(err, cudaMemcpy(bias + at, m->bias, sizeof(float) * (size_t)m->rows,
					                              cudaMemcpyHostToDevice));
				else
					FP4S_CUDA_TRY(err, cudaMemset(bias + at, 0, sizeof(float) * (size_t)m->rows));
			}
			r0 += m->rows;
		}
	}
	if ((rc = cu_permute_codes(m0, d, row_d * (size_t)rows * (size_t)E, c->s, err)))
		return rc;
	if (per_expert_ws2) {
		float *h = (float *)malloc((size_t)E * sizeof(float));
		if (!h)
			return fp4s_error_set(err, FP4S_ENOMEM, "moe: out of host memory");
		for (int32_t e = 0; e < E; e++)
			h[e] = parts[e]->ws2;
		rc = cu_dev_alloc(c, (void **)&ws2e, (size_t)E * sizeof(float), err);
		if (!rc)
			rc = cu_track(c, ws2e, err);
		if (!rc && cudaMemcpy(ws2e, h, (size_t)E * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
			rc = fp4s_error_set(err, FP4S_ECUDA, "moe: copying per-expert scales failed");
		free(h);
		if (rc)
			return rc;
	}
	out->fmt = m0->fmt;
	out->rows = rows, out->cols = m0->cols;
	out->data = d, out->scales = sc, out->bias = bias;
	out->stride_data = (int64_t)(row_d * (size_t)rows);
	out->stride_scales = (int64_t)(row_s * (size_t)rows);
	out->ws2 = m0->ws2, out->ws2e = ws2e;
	out->e8_range = 0;
	/* the per-expert scales' copy (pageable, legacy stream) landed before s reads anything */
	FP4S_CUDA_TRY(err, cudaStreamSynchronize(cudaStreamLegacy));
	return fp4s_cuda_mx_scale_range_stacked(out, E, c->s, err);
}

const struct fp4s_stacked *cu_moe_stacked(const void *dev, int which, int *form)
{
	const struct cu_moe *m = (const struct cu_moe *)dev;
	*form = m->form;
	return which ? &m->down : &m->gu;
}

static int cu_upload_moe(struct fp4s_backend *be, struct fp4s_moe_params *p, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	const int32_t E = p->n_experts;
	if (E <= 0 || E > 8192 || !p->experts || p->top_k > 64)
		return FP4S_EUNSUPPORTED;
	const struct fp4s_mat **a = (const struct fp4s_mat **)malloc(3 * (size_t)E * sizeof *a);
	if (!a)
		return fp4s_error_set(err, FP4S_ENOMEM, "moe: out of host memory");
	const struct fp4s_mat **b = a + E, **dn = a + 2 * E;
	const int inter = p->oai_swiglu;
	static int pairs_off = -1;
	const int pairs = !inter && !fp4s_env_off("FP4S_MOE_PAIRS", &pairs_off);
	for (int32_t e = 0; e < E; e++) {
		a[e] = inter ? &p->experts[e].gate_up : &p->experts[e].gate;
		b[e] = &p->experts[e].up;
		dn[e] = &p->experts[e].down;
	}
	struct cu_moe *m = (struct cu_moe *)calloc(1, sizeof *m);
	int rc = m ? FP4S_OK : fp4s_error_set(err, FP4S_ENOMEM, "moe: out of host memory");
	if (!rc)
		rc = stack_experts(c, a, inter ? NULL : b, E, pairs, &m->gu, err);
	if (!rc)
		rc = stack_experts(c, dn, NULL, E, 0, &m->down, err);
	free(a);
	const int64_t K = p->top_k, I = p->inter, H = p->hidden;
	if (!rc && (m->gu.rows != 2 * I || m->down.rows != H || m->down.cols != I))
		rc = FP4S_EUNSUPPORTED;
	void **bufs[] = {(void **)&m->idx1, (void **)&m->w1, (void **)&m->h1, (void **)&m->a1, (void **)&m->o1,
	                 (void **)&m->lg1, (void **)&m->x1, (void **)&m->cnt};
	const size_t sizes[] = {(size_t)K * 4, (size_t)K * 4, (size_t)(K * 2 * I) * 4, (size_t)(K * I) * 4,
	                        (size_t)(K * H) * 4, (size_t)E * 4, (size_t)H * 4, FP4S_MOE_TMA_SYNC * sizeof(unsigned)};
	for (int i = 0; !rc && i < 8; i++)
		if (!(rc = cu_dev_alloc(c, bufs[i], sizes[i], err)))
			rc = cu_track(c, *bufs[i], err);
	if (!rc && cudaMemset(m->cnt, 0, FP4S_MOE_TMA_SYNC * sizeof(unsigned)) != cudaSuccess)
		rc = fp4s_error_set(err, FP4S_ECUDA, "moe: clearing the router counter failed");
	if (!rc && E <= FP4S_GEMV_ROUTE_EMAX && !(rc = cu_dev_alloc(c, (void **)&m->racc, 2 * (size_t)E * 8, err)) &&
	    !(rc = cu_track(c, m->racc, err)) && cudaMemset(m->racc, 0, 2 * (size_t)E * 8) != cudaSuccess)
		rc = fp4s_error_set(err, FP4S_ECUDA, "moe: clearing the router shares failed");
	if (rc) {
		free(m); /* stacked weights stay tracked and are freed with the backend */
		return rc;
	}
	m->form = inter ? 1 : pairs ? 2 : 0;
	m->next = c->moes;
	c->moes = m;
	p->dev = m;
	return FP4S_OK;
}

static int moe_reserve(struct cuda_impl *c, int64_t n, int32_t E, int64_t I, int64_t H,
                       struct fp4s_error *err)
{
	if (n <= c->moe_cap_tokens && E <= c->moe_cap_experts && I <= c->moe_cap_inter && H <= c->moe_cap_hidden)
		return FP4S_OK;
	cudaFree(c->moe_logits), cudaFree(c->moe_h1), cudaFree(c->moe_h2), cudaFree(c->moe_a), cudaFree(c->moe_o);
	free(c->host_logits);
	c->moe_logits = c->moe_h1 = c->moe_h2 = c->moe_a = c->moe_o = NULL;
	c->host_logits = (float *)malloc((size_t)(n * E) * sizeof(float));
	int rc;
	if (!c->host_logits)
		return fp4s_error_set(err, FP4S_ENOMEM, "moe: out of host memory");
	if ((rc = cu_dev_alloc(c, (void **)&c->moe_logits, (size_t)(n * E) * 4, err)) ||
	    (rc = cu_dev_alloc(c, (void **)&c->moe_h1, (size_t)(2 * I) * 4, err)) ||
	    (rc = cu_dev_alloc(c, (void **)&c->moe_h2, (size_t)(2 * I) * 4, err)) ||
	    (rc = cu_dev_alloc(c, (void **)&c->moe_a, (size_t)I * 4, err)) ||
	    (rc = cu_dev_alloc(c, (void **)&c->moe_o, (size_t)H * 4, err)))
		return rc;
	c->moe_cap_tokens = n, c->moe_cap_experts = E, c->moe_cap_inter = I, c->moe_cap_hidden = H;
	return FP4S_OK;
}

/* gate|up of the selected experts: tensor cores where the format allows */
static int expert_gu(struct cuda_impl *c, struct cu_moe *m, const int32_t *idx, int32_t slots, const float *x,
                     int32_t x_div, int64_t x_stride, float *h, struct fp4s_error *err)
{
	int rc = fp4s_gemv_mma_experts(&m->gu, idx, slots, x, x_div, x_stride, 0, 0.0f, 0.0f, h, c->s, err);
	if (rc == FP4S_EUNSUPPORTED)
		rc = fp4s_cuda_expert_matmul(&m->gu, idx, slots, x, x_div, x_stride, h, c->s, err);
	return rc;
}

/* down of the selected experts, then y (+)= their weighted sum: the tensor-core kernel computes
 * SwiGLU while staging its input; else act + matmul */
static int expert_down(struct cuda_impl *c, struct cu_moe *m, const struct fp4s_moe_params *p, const int32_t *idx,
                       const float *w, int32_t slots, const float *h, float *a, float *o, int32_t n, int accumulate,
                       float *y, struct fp4s_error *err)
{
	const int64_t I = p->inter, H = p->hidden;
	int rc = fp4s_gemv_mma_experts(&m->down, idx, slots, h, 1, 2 * I, m->form + 1, p->swiglu_alpha,
	                               p->swiglu_limit, o, c->s, err);
	if (rc == FP4S_EUNSUPPORTED &&
	    (!(rc = fp4s_cuda_moe_act(h, slots, I, m->form, p->swiglu_alpha, p->swiglu_limit, a, c->s, err))))
		rc = fp4s_cuda_expert_matmul(&m->down, idx, slots, a, 1, I, o, c->s, err);
	if (rc)
		return rc;
	return fp4s_cuda_moe_combine(o, w, NULL, n, p->top_k, H, accumulate, y, c->s, err);
}

/* Grows the shared batch buffers to n tokens where needed and points m's batch fields at them. */
static int moe_batch_bufs(struct cuda_impl *c, struct cu_moe *m, const struct fp4s_moe_params *p, int64_t n,
                          struct fp4s_error *err)
{
	const int64_t K = p->top_k, I = p->inter, H = p->hidden, E = p->n_experts, nk = n * K;
	const int64_t nz = fp4s_cuda_moe_group_count((int32_t)nk, (int32_t)E, 1);
	size_t need[MB_COUNT];
	need[MB_IDX] = need[MB_W] = need[MB_GPOS] = need[MB_GSRC] = (size_t)nk * 4;
	need[MB_H] = (size_t)(nk * 2 * I) * 4;
	need[MB_A] = (size_t)(nk * I) * 4;
	need[MB_O] = (size_t)(nk * H) * 4;
	need[MB_LG] = (size_t)(n * E) * 4;
	need[MB_XB] = fp4s_moe_gemm_scratch_bytes((int32_t)nk, H, I);
	need[MB_GEXP] = need[MB_GOFF] = need[MB_GM] = (size_t)nz * 4;
	struct cu_moe_bufs *b = &c->moeb;
	for (int i = 0; i < MB_COUNT; i++) {
		if (need[i] <= b->bytes[i])
			continue;
		int rc = cu_graph_before_move(c, "moe", err); /* decode batches' graphs hold them */
		if (rc)
			return rc;
		cudaFree(b->p[i]);
		b->p[i] = NULL;
		b->bytes[i] = 0;
		if ((rc = cu_dev_alloc(c, &b->p[i], need[i], err)))
			return rc;
		b->bytes[i] = need[i];
	}
	m->idxn = (int32_t *)b->p[MB_IDX], m->wn = (float *)b->p[MB_W], m->hn = (float *)b->p[MB_H];
	m->an = (float *)b->p[MB_A], m->on = (float *)b->p[MB_O], m->lgn = (float *)b->p[MB_LG];
	m->xbn = b->p[MB_XB];
	m->gpos = (int32_t *)b->p[MB_GPOS], m->gsrc = (int32_t *)b->p[MB_GSRC], m->gexp = (int32_t *)b->p[MB_GEXP];
	m->goff = (int32_t *)b->p[MB_GOFF], m->gm = (int32_t *)b->p[MB_GM];
	return FP4S_OK;
}

static int moe_on_device(struct fp4s_backend *be, const struct fp4s_moe_params *p, const float *x, int64_t n,
                         int accumulate, float *y, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	struct cu_moe *m = (struct cu_moe *)p->dev;
	const int64_t K = p->top_k, I = p->inter, H = p->hidden, E = p->n_experts;
	int32_t *idx = m->idx1;
	float *w = m->w1, *h = m->h1, *a = m->a1, *o = m->o1, *lg = m->lg1;
	int rc;
	if (n > 1) {
		/* larger batches: the shared growable buffers (one-token steps keep theirs fixed for graphs) */
		if ((rc = moe_batch_bufs(c, m, p, n, err)))
			return rc;
		idx = m->idxn, w = m->wn, h = m->hn, a = m->an, o = m->on, lg = m->lgn;
	}
	const int32_t slots = (int32_t)(n * K);
	if ((rc = fp4s_cuda_matmul(&p->router, x, (int32_t)n, lg, c->s, err)) ||
	    (rc = fp4s_cuda_moe_route(lg, (int32_t)n, (int32_t)E, (int32_t)K,
	                              p->router_kind == FP4S_ROUTER_SOFTMAX_TOPK ? 0 : 1, p->norm_topk, idx, w,
	                              c->s, err)))
		return rc;
	/* prompts and large batches: slots grouped by expert in tiles of the tensor-core GEMM, each
	 * expert read once per tile of up to 256 tokens (moe_gemm.cu). As for the dense GEMM: never
	 * where the backend must keep activations exact (gemm_min_tokens 0), every batch at 1. */
	const int gmode = be->gemm_min_tokens <= 0 ? 0 : be->gemm_min_tokens == 1 ? 2 : 1;
	const int bt = n > 1 && E <= 4096 ? fp4s_moe_gemm_tile(&m->gu, &m->down, slots, (int32_t)E, gmode) : 0;
	if (bt > 0) {
		const int32_t nz = fp4s_cuda_moe_group_count(slots, (int32_t)E, bt);
		if ((rc = fp4s_cuda_moe_group(idx, slots, (int32_t)K, (int32_t)E, bt, m->gpos, m->gsrc, m->gexp, m->goff,
		                              m->gm, c->s, err)) ||
		    (rc = fp4s_moe_gemm(&m->gu, &m->down, m->gexp, m->goff, m->gm, nz, bt, x, m->gsrc, slots, m->form,
		                        p->swiglu_alpha, p->swiglu_limit, h, m->xbn, o, c->s, err)))
			return rc;
		return fp4s_cuda_moe_combine(o, w, m->gpos, (int32_t)n, (int32_t)K, H, accumulate, y, c->s, err);
	}
	/* batches: slots grouped by expert, so each expert's weights are read once per group of up to
	 * 8 tokens rather than once per token (decode of many sequences) */
	const int gmax = n > 1 && E <= 4096 && fp4s_gemv_mma_allowed() ? fp4s_gemv_mma_group_max(&m->gu, &m->down) : 0;
	if (gmax > 0) {
		const int32_t nz = fp4s_cuda_moe_group_count(slots, (int32_t)E, gmax);
		if ((rc = fp4s_cuda_moe_group(idx, slots, (int32_t)K, (int32_t)E, gmax, m->gpos, m->gsrc, m->gexp, m->goff,
		                              m->gm, c->s, err)))
			return rc;
		rc = fp4s_gemv_mma_grouped(&m->gu, m->gexp, m->goff, m->gm, nz, gmax, x, m->gsrc, H, 0, 0.0f, 0.0f, h, c->s,
		                           err);
		if (rc == FP4S_OK)
			rc = fp4s_gemv_mma_grouped(&m->down, m->gexp, m->goff, m->gm, nz, gmax, h, NULL, 2 * I,
			                           m->form + 1, p->swiglu_alpha, p->swiglu_limit, o, c->s, err);
		if (rc == FP4S_OK)
			return fp4s_cuda_moe_combine(o, w, m->gpos, (int32_t)n, (int32_t)K, H, accumulate, y, c->s, err);
		if (rc != FP4S_EUNSUPPORTED)
			return rc;
		/* declined (format, shape): the per-slot kernels below; the gate|up launch, if it ran,
		 * is simply redone */
	}
	if ((rc = expert_gu(c, m, idx, slots, x, (int32_t)K, H, h, err)))
		return rc;
	return expert_down(c, m, p, idx, w, slots, h, a, o, (int32_t)n, accumulate, y, err);
}

/* norm_moe_add's one launch (moe_tma.cu) takes pairs (gate, up) SwiGLU'd in the gate|up epilogue */
static int moe_pairact(const struct cu_moe *m, int mode)
{
	static int pairact_off = -1; /* FP4S_MOE_PAIRACT=0: the SwiGLU back in the down GEMV's staging */
	return mode >= 3 && m->form && !fp4s_env_off("FP4S_MOE_PAIRACT", &pairact_off);
}

/* the layer's one-launch block (moe_tma.cu) on h with its buffers; local / dry as there */
static int moe_tma_launch(struct cuda_impl *c, const struct fp4s_moe_params *p, struct cu_moe *m, float *h,
                          const float *nw, float eps, int zc, int local, int dry, struct fp4s_error *err)
{
	return fp4s_cuda_moe_tma(&m->gu, &m->down, m->form, p->swiglu_alpha, p->swiglu_limit, &p->router, p->top_k,
	                         p->router_kind == FP4S_ROUTER_SOFTMAX_TOPK ? 0 : 1, p->norm_topk, h, nw, eps, zc, m->lg1,
	                         m->cnt, m->idx1, m->w1, m->x1, m->a1, m->o1, m->racc, local, dry, c->s, err);
}

static void cu_moe_next(struct fp4s_backend *be, const float *h, const float *nw, enum fp4s_norm_kind kind,
                        const struct fp4s_moe_params *p)
{
	struct cuda_impl *c = impl_of(be);
	c->mh_h = nw && p ? h : NULL;
	c->mh_nw = nw;
	c->mh_zc = kind == FP4S_NORM_ZERO_CENTRED;
	c->mh_p = p;
}

/* The router logits added by the o projection and every MoE block routing from them (moe_tma.cu
 * local; FP4S_MOE_LOCAL=0: off): its one launch then has no block waiting on others before its
 * weight copies (the router blocks' norm, logits, counter, top-k and flag took ~6 us of
 * gpt-oss-20b's 45 us MoE launch, bench/results/2026-11-23-h100-session19.md). */
int cu_moe_matmul_add_route(struct cuda_impl *c, const struct fp4s_moe_params *p, const struct fp4s_mat *w,
                            const float *x, float *h, struct fp4s_error *err)
{
	static int off = -1;
	struct cu_moe *m = p ? (struct cu_moe *)p->dev : NULL;
	const int mode = fp4s_cuda_moe_fused();
	if (!m || !m->racc || fp4s_env_off("FP4S_MOE_LOCAL", &off) || mode != 3 || !moe_pairact(m, mode) ||
	    !fp4s_gemv_mma_allowed() || p->router.rows != p->n_experts || p->router.cols != p->hidden ||
	    p->router.cols != w->rows || !p->router.data)
		return FP4S_EUNSUPPORTED;
	struct fp4s_error e0;
	if (moe_tma_launch(c, p, m, h, c->mh_nw, 1e-6f, c->mh_zc, 1, 1, &e0) != FP4S_OK) /* (dry: eps unused) */
		return FP4S_EUNSUPPORTED;
	const struct fp4s_gemv_route rt = {p->router.data, (int)p->router.fmt, (int)p->n_experts, c->mh_zc, c->mh_nw,
	                                   m->racc, (const unsigned long long *)m->cnt + FP4S_MOE_TMA_EPOCH};
	const int rc = fp4s_cuda_matmul_add_route(w, x, h, &rt, c->s, err);
	if (rc == FP4S_OK)
		m->lr_pending = 1;
	return rc;
}

/* h += moe(rmsnorm(h; nw)) for one token (backend.h norm_moe_add): all in one launch where
 * moe_tma.cu takes it (by default MXFP4 experts); else norm, router and top-k in one kernel (which also writes the normalized
 * token, or leaves the norm to the gate|up GEMV), the gate|up GEMV, the down GEMV doing the
 * combine (FP4S_MOE_FUSED, moe_cuda.h): 3 launches instead of 6. The small kernels it replaces
 * move little; what they cost is their place in the chain. */
static int cu_norm_moe_add(struct fp4s_backend *be, const struct fp4s_moe_params *p, float *h, const float *nw,
                           float eps, enum fp4s_norm_kind kind, int64_t n, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	cu_link_clear(c);
	struct cu_moe *m = (struct cu_moe *)p->dev;
	/* the add before took the router's shares (cu_moe_matmul_add_route): only the one launch
	 * that reads them may follow, or they would be added to at the next step */
	const int local = m && m->lr_pending;
	if (m)
		m->lr_pending = 0;
	const int mode = fp4s_cuda_moe_fused();
	const int32_t K = p->top_k;
	const int64_t I = p->inter, H = p->hidden;
	const int zc = kind == FP4S_NORM_ZERO_CENTRED;
	int rc;
	if (local) {
		rc = n == 1 ? moe_tma_launch(c, p, m, h, nw, eps, zc, 1, 0, err) : FP4S_EUNSUPPORTED;
		if (rc == FP4S_EUNSUPPORTED)
			rc = fp4s_error_set(err, FP4S_EINVAL, "moe: the router's shares were taken for a block that "
			                                      "does not read them (%lld tokens)", (long long)n);
		return rc;
	}
	if (!m || n != 1 || mode == 0 || !fp4s_gemv_mma_allowed() || p->router.rows != p->n_experts ||
	    p->router.cols != p->hidden)
		return FP4S_EUNSUPPORTED;
	const int pairact = moe_pairact(m, mode);
	if (pairact && mode == 3) {
		/* all of it in one launch (moe_tma.cu; where it declines: the three below) */
		rc = moe_tma_launch(c, p, m, h, nw, eps, zc, 0, 0, err);
		if (rc != FP4S_EUNSUPPORTED)
			return rc;
	}
	rc = fp4s_cuda_norm_route(&p->router, K, p->router_kind == FP4S_ROUTER_SOFTMAX_TOPK ? 0 : 1, p->norm_topk,
	                              h, nw, eps, zc, m->lg1, m->cnt, m->idx1, m->w1, mode >= 3 ? m->x1 : NULL, c->s, err);
	if (rc)
		return rc; /* FP4S_EUNSUPPORTED: nothing enqueued yet */
	if (pairact) {
		/* interleaved gate|up: the GEMV's epilogue writes SwiGLU of its (gate, up) row pairs, so
		 * the down GEMV stages I plain floats a block instead of 2 I and their exponentials */
		rc = fp4s_gemv_mma_experts_pairact(&m->gu, m->idx1, K, m->x1, K, H, m->form, p->swiglu_alpha,
		                                   p->swiglu_limit, m->a1, c->s, err);
		if (rc != FP4S_EUNSUPPORTED) {
			if (!rc)
				rc = fp4s_gemv_mma_experts_ex(&m->down, m->idx1, K, m->a1, 1, I, 0, 0.0f, 0.0f, NULL, 0.0f, 0,
				                              m->w1, h, m->o1, c->s, err);
			if (rc == FP4S_EUNSUPPORTED && !(rc = fp4s_cuda_expert_matmul(&m->down, m->idx1, K, m->a1, 1, I,
			                                                              m->o1, c->s, err)))
				rc = fp4s_cuda_moe_combine(m->o1, m->w1, NULL, 1, K, H, 1, h, c->s, err);
			return rc;
		}
	}
	if (mode >= 3)
		rc = expert_gu(c, m, m->idx1, K, m->x1, K, H, m->h1, err);
	else
		rc = fp4s_gemv_mma_experts_ex(&m->gu, m->idx1, K, h, K, H, 0, 0.0f, 0.0f, nw, eps, zc, NULL, NULL, m->h1,
		                              c->s, err);
	if (rc == FP4S_EUNSUPPORTED) {
		/* the routing is enqueued: go on through a normalized copy */
		cu_rmsnorm(be, h, nw, 1, H, eps, kind, m->x1);
		rc = expert_gu(c, m, m->idx1, K, m->x1, K, H, m->h1, err);
	}
	if (rc)
		return rc;
	if (mode == 4) {
		/* the SwiGLU as a kernel of its own, so each down block stages I floats, not 2 I plus
		 * the exponentials (as the dense MLP, where that measured faster) */
		rc = fp4s_cuda_moe_act(m->h1, K, I, m->form, p->swiglu_alpha, p->swiglu_limit, m->a1, c->s, err);
		if (!rc)
			rc = fp4s_gemv_mma_experts_ex(&m->down, m->idx1, K, m->a1, 1, I, 0, 0.0f, 0.0f, NULL, 0.0f, 0, m->w1, h,
			                              m->o1, c->s, err);
		if (rc != FP4S_EUNSUPPORTED)
			return rc;
		return expert_down(c, m, p, m->idx1, m->w1, K, m->h1, m->a1, m->o1, 1, 1, h, err);
	}
	if (mode >= 2) {
		rc = fp4s_gemv_mma_experts_ex(&m->down, m->idx1, K, m->h1, 1, 2 * I, m->form + 1,
		                              p->swiglu_alpha, p->swiglu_limit, NULL, 0.0f, 0, m->w1, h, m->o1, c->s, err);
		if (rc != FP4S_EUNSUPPORTED)
			return rc;
	}
	return expert_down(c, m, p, m->idx1, m->w1, K, m->h1, m->a1, m->o1, 1, 1, h, err);
}

/* h += moe(x): the combine adds into the residual (experts on the device only) */
static int cu_moe_add(struct fp4s_backend *be, const struct fp4s_moe_params *p, const float *x, int64_t n, float *h,
                      struct fp4s_error *err)
{
	cu_link_clear(impl_of(be));
	if (!p->dev)
		return FP4S_EUNSUPPORTED;
	return moe_on_device(be, p, x, n, 1, h, err);
}

static int cu_moe(struct fp4s_backend *be, const struct fp4s_moe_params *p, const float *x, int64_t n,
                  float *y, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	cu_link_clear(c);
	if (p->dev)
		return moe_on_device(be, p, x, n, 0, y, err);
	const int32_t E = p->n_experts, K = p->top_k;
	const int64_t H = p->hidden, I = p->inter;
	if (K <= 0 || K > E || K > 64 || E > 4096)
		return fp4s_error_set(err, FP4S_EINVAL, "moe: top-k %d of %d experts", K, E);
	int rc = moe_reserve(c, n, E, I, H, err);
	if (rc || (rc = cu_matmul(be, x, n, &p->router, c->moe_logits, err)) ||
	    (rc = cu_read(be, c->host_logits, c->moe_logits, n * E * (int64_t)sizeof(float), err)))
		return rc;
	float *prob = (float *)malloc((size_t)E * sizeof(float));
	if (!prob)
		return fp4s_error_set(err, FP4S_ENOMEM, "moe: out of host memory");
	for (int64_t t = 0; t < n && !rc; t++) {
		int32_t idx[64];
		float w[64];
		/* the CPU's routing itself, so both backends pick the same experts from the same logits */
		fp4s_cpu_moe_route(c->host_logits + t * E, E, K, p->router_kind == FP4S_ROUTER_SOFTMAX_TOPK, p->norm_topk,
		                   prob, idx, w);
		for (int32_t j = 0; j < K && !rc; j++) {
			const struct fp4s_expert *ex = &p->experts[idx[j]];
			if (p->oai_swiglu) {
				if ((rc = cu_matmul(be, x + t * H, 1, &ex->gate_up, c->moe_h1, err)))
					break;
				pdl_launch(swiglu_oai_kernel, dim3(grid1(I)), 256, 0, c->s, c->moe_h1, I, p->swiglu_alpha,
					p->swiglu_limit, c->moe_a);
			} else {
				if ((rc = cu_matmul(be, x + t * H, 1, &ex->gate, c->moe_h1, err)) ||
				    (rc = cu_matmul(be, x + t * H, 1, &ex->up, c->moe_h2, err)))
					break;
				cu_swiglu(be, c->moe_h1, c->moe_h2, 1, I, c->moe_a);
			}
			if ((rc = cu_matmul(be, c->moe_a, 1, &ex->down, c->moe_o, err)))
				break;
			pdl_launch(axpy_kernel, dim3(grid1(H)), 256, 0, c->s, y + t * H, c->moe_o, w[j], H, j == 0);
		}
	}
	free(prob);
	if (rc)
		return rc;
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

void cu_moe_install(struct fp4s_backend *be)
{
	be->upload_moe = cu_upload_moe;
	be->moe = cu_moe;
	be->moe_add = cu_moe_add;
	be->norm_moe_add = cu_norm_moe_add;
	be->moe_next = cu_moe_next;
}

void cu_moe_free(struct cuda_impl *c)
{
	cudaFree(c->moe_logits), cudaFree(c->moe_h1), cudaFree(c->moe_h2), cudaFree(c->moe_a), cudaFree(c->moe_o);
	free(c->host_logits);
	for (struct cu_moe *m = c->moes, *nx; m; m = nx) {
		nx = m->next;
		free(m); /* its batch buffers are views of c->moeb */
	}
	for (int i = 0; i < MB_COUNT; i++)
		cudaFree(c->moeb.p[i]);
}
