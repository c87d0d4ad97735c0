/* dstep.cu: the whole-step kernel for dense models (dstep.cuh): whether a model is one it takes
 * (Llama-3-8B's or Qwen3-8B's attention geometry, NVFP4 fused qkv and gate|up pairs, BF16 KV),
 * its buffers and tensor maps, and the launch. mstep.cu's step_prepare and step_layers hand
 * dense models here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_impl.h"
#include "backend/cuda/dstep.cuh"

struct cu_dstep {
	ds_args a;
	unsigned cnt_bytes;
};

static int ds_fits(const struct fp4s_mat *m, int64_t rows, int64_t cols)
{
	return m && m->fmt == FP4S_WF_NVFP4 && m->rows == rows && m->cols == cols && !m->bias && m->data &&
	       m->scales && cols % 2048 == 0 && (uintptr_t)m->data % 16 == 0 && (uintptr_t)m->scales % 16 == 0;
}

/* the model's MLP width where the kernel takes it, else 0 */
static int ds_takes(const struct cuda_impl *c, const struct fp4s_step_desc *d)
{
	if (d->hidden != DS_H || d->n_heads != DS_NQ || d->n_kv_heads != DS_NKV || d->head_dim != DS_HD ||
	    d->rot_dim != DS_HD || d->norm_kind != FP4S_NORM_PLAIN || d->n_layers < 1 || !d->inv_freq)
		return 0;
	if (c->kv_dtype != FP4S_KV_BF16 || c->kv_width != DS_NKV * DS_HD || c->n_layers != d->n_layers || !c->kc ||
	    !c->vc || c->n_blocks < 1)
		return 0;
	const struct fp4s_mat *gu0 = d->layers[0].gate_up;
	if (!gu0 || gu0->rows % 4096 != 0 || gu0->rows / 2 > DS_FMAX)
		return 0;
	const int64_t fi = gu0->rows / 2;
	const int qkn = d->layers[0].q_norm != NULL;
	for (int32_t l = 0; l < d->n_layers; l++) {
		const struct fp4s_step_layer *L = &d->layers[l];
		if (L->moe || !ds_fits(L->qkv, DS_QKV, DS_H) || !ds_fits(L->o, DS_H, DS_QR) ||
		    !ds_fits(L->gate_up, 2 * fi, DS_H) || !L->gate_up->pairs || !ds_fits(L->down, DS_H, fi) ||
		    L->has_bias || L->window || L->sinks || !L->attn_norm || !L->ffn_norm || (L->q_norm != NULL) != qkn ||
		    (L->k_norm != NULL) != qkn)
			return 0;
	}
	return (int)fi;
}

/* a matrix's two maps: codes ([rows] of K / 16 u64, a box 128 x 16: 2048 K of 16 rows) and scales
 * ([rows] of K / 16 bytes, a box 128 x 16 with the 128-byte swizzle mg_step reads). 0 on success. */
static int ds_map(mg_encode_fn enc, const struct fp4s_mat *w, CUtensorMap *m)
{
	const cuuint64_t K = (cuuint64_t)w->cols, R = (cuuint64_t)w->rows;
	const cuuint64_t cd[2] = {K / 16, R}, cs[1] = {K / 2}, sd[2] = {K / 16, R}, ss[1] = {K / 16};
	const cuuint32_t box[2] = {128, 16}, one[2] = {1, 1};
	return enc(&m[0], CU_TENSOR_MAP_DATA_TYPE_UINT64, 2, (void *)w->data, cd, cs, box, one,
	           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
	           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS ||
	       enc(&m[1], CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)w->scales, sd, ss, box, one,
	           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
	           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS;
}

int cu_dstep_prepare(struct cuda_impl *c, const struct fp4s_step_desc *d, struct fp4s_error *err)
{
	int major = 0, smem = 0;
	cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->dev);
	cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->dev);
	const int fi = ds_takes(c, d);
	/* Hopper only; a block <= 4 qkv tiles and <= 16 gate|up tiles */
	if (!fi || major != 9 || smem < DS_SMEM || c->sm_count < 96 || 2 * fi / 16 > DS_NT * c->sm_count)
		return FP4S_EUNSUPPORTED;
	const mg_encode_fn enc = mg_encoder();
	if (!enc)
		return FP4S_EUNSUPPORTED;
	const int L = d->n_layers, smax = c->sm_count / DS_NKV; /* splits a kv head at most (ds_split_t) */
	const size_t nmaps = (size_t)L * DM_N * 2 + 2;
	struct cu_dstep *ds = (struct cu_dstep *)calloc(1, sizeof *ds);
	ds_layer *hl = (ds_layer *)calloc((size_t)L, sizeof *hl);
	CUtensorMap *om = (CUtensorMap *)calloc(nmaps, sizeof *om);
	if (!ds || !hl || !om) {
		free(ds), free(hl), free(om);
		return fp4s_error_set(err, FP4S_ENOMEM, "dstep: out of host memory");
	}
	int rc = FP4S_OK;
	ds_args &a = ds->a;
	ds_layer *dly = NULL;
	struct {
		void **p;
		size_t bytes;
	} bufs[] = {
		{(void **)&a.h, (size_t)L * DS_H * 4},
		{(void **)&a.h2, (size_t)L * DS_H * 4},
		{(void **)&a.q, (size_t)L * DS_QR * 4},
		{(void **)&a.kraw, (size_t)L * DS_NKV * DS_HD * 4},
		{(void **)&a.att, (size_t)L * DS_QR * 4},
		{(void **)&a.part, (size_t)DS_NKV * smax * DS_GQ * MG_PS * 4},
		{(void **)&a.act, (size_t)L * fi * 4},
		{(void **)&a.cnt, (size_t)L * DS_CNT * 4},
		{(void **)&dly, (size_t)L * sizeof(ds_layer)},
		{(void **)&a.maps, nmaps * sizeof(CUtensorMap)},
	};
	for (size_t i = 0; !rc && i < sizeof bufs / sizeof bufs[0]; i++)
		if (!(rc = cu_dev_alloc(c, bufs[i].p, bufs[i].bytes, err)))
			rc = cu_track(c, *bufs[i].p, err);
	/* the partials' readiness: zero before the first step (dstep.cuh ds_merge_rounds_ready) */
	if (!rc && cudaMemset(a.part, 0, (size_t)DS_NKV * smax * DS_GQ * MG_PS * 4) != cudaSuccess)
		rc = fp4s_error_set(err, FP4S_ECUDA, "dstep: clearing the attention partials failed");
	const size_t layer_kv = (size_t)c->n_blocks * MG_KVB * DS_NKV * DS_HD;
	for (int l = 0; !rc && l < L; l++) {
		const struct fp4s_step_layer *S = &d->layers[l];
		ds_layer &y = hl[l];
		y.qkv_ws2 = S->qkv->ws2, y.o_ws2 = S->o->ws2, y.gu_ws2 = S->gate_up->ws2, y.dn_ws2 = S->down->ws2;
		y.n1 = S->attn_norm, y.n2 = S->ffn_norm, y.qn = S->q_norm, y.kn = S->k_norm;
		y.kc = (__nv_bfloat16 *)c->kc + (size_t)l * layer_kv, y.vc = (__nv_bfloat16 *)c->vc + (size_t)l * layer_kv;
		const struct fp4s_mat *mats[DM_N] = {S->qkv, S->o, S->gate_up, S->down};
		for (int k = 0; k < DM_N; k++)
			if (ds_map(enc, mats[k], &om[((size_t)l * DM_N + k) * 2]))
				rc = FP4S_EUNSUPPORTED; /* a driver that will not encode them: the layer path */
	}
	if (!rc && (mg_map_kv(enc, c->kc, (int64_t)L * c->n_blocks, DS_NKV, &om[nmaps - 2]) ||
	            mg_map_kv(enc, c->vc, (int64_t)L * c->n_blocks, DS_NKV, &om[nmaps - 1])))
		rc = FP4S_EUNSUPPORTED;
	if (!rc) {
		const cudaError_t e1 = cudaMemcpy(dly, hl, (size_t)L * sizeof(ds_layer), cudaMemcpyHostToDevice);
		const cudaError_t e2 = cudaMemcpy((void *)a.maps, om, nmaps * sizeof(CUtensorMap), cudaMemcpyHostToDevice);
		const cudaError_t e3 = cudaFuncSetAttribute(ds_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, DS_SMEM);
		FP4S_CUDA_TRY(err, e1 != cudaSuccess ? e1 : e2 != cudaSuccess ? e2 : e3);
	}
	free(hl);
	free(om);
	if (rc) {
		free(ds); /* device buffers stay tracked, freed with the backend */
		return rc;
	}
	a.ly = dly, a.L = L, a.fi = fi;
	a.eps = d->eps, a.scale = d->attn_scale, a.mscale = d->rope_mscale, a.inv_freq = d->inv_freq;
	a.nb = c->n_blocks;
	a.kvmap = a.maps + nmaps - 2;
	ds->cnt_bytes = (unsigned)((size_t)L * DS_CNT * 4);
	/* FP4S_DSTEP_TL=L: the phase marks of layer L (a diagnostic: cu_dstep_report prints them) */
	a.tl = cu_step_tl_alloc(c, "FP4S_DSTEP_TL", L, DT_N, &a.tl_layer);
	free(c->ds);
	c->ds = ds;
	return FP4S_OK;
}

int cu_dstep_launch(struct cuda_impl *c, float *h, struct fp4s_error *err)
{
	ds_args a = c->ds->a;
	a.pos = c->d_pos, a.seq = c->d_seq, a.table = c->d_table, a.table_stride = c->table_stride;
	a.hin = h, a.hout = h;
	FP4S_CUDA_TRY(err, cu_step_run(c, (const void *)ds_kernel, &a, MG_THREADS, DS_SMEM, a.cnt, c->ds->cnt_bytes, a.tl, DT_N));
	return FP4S_OK;
}

unsigned long long *cu_step_tl_alloc(struct cuda_impl *c, const char *env, int L, int n, int *layer)
{
	const char *tl = getenv(env);
	unsigned long long *t = NULL;
	*layer = -1;
	if (!tl || !*tl)
		return NULL;
	const int tll = atoi(tl);
	struct fp4s_error e = {}; /* a diagnostic: failing to get it changes nothing else */
	if (tll >= 0 && tll < L && !cu_dev_alloc(c, (void **)&t, (size_t)c->sm_count * n * 8, &e) && !cu_track(c, t, &e))
		*layer = tll;
	else
		t = NULL;
	return t;
}

cudaError_t cu_step_run(struct cuda_impl *c, const void *kernel, void *args, unsigned threads, size_t smem, void *cnt,
                        size_t cnt_bytes, void *tl, int n_marks)
{
	cudaError_t e = cudaMemsetAsync(cnt, 0, cnt_bytes, c->s);
	if (e == cudaSuccess && tl)
		e = cudaMemsetAsync(tl, 0, (size_t)c->sm_count * (size_t)n_marks * 8, c->s);
	if (e != cudaSuccess)
		return e;
	cudaLaunchConfig_t cfg = {};
	cudaLaunchAttribute at[1];
	at[0].id = cudaLaunchAttributeCooperative;
	at[0].val.cooperative = 1;
	cfg.gridDim = dim3((unsigned)c->sm_count), cfg.blockDim = dim3(threads);
	cfg.dynamicSmemBytes = smem, cfg.stream = c->s;
	cfg.attrs = at, cfg.numAttrs = 1;
	void *argv[1] = {args};
	return cudaLaunchKernelExC(&cfg, kernel, argv);
}

static int ds_cmp(const void *x, const void *y)
{
	const double a = *(const double *)x, b = *(const double *)y;
	return (a > b) - (a < b);
}

void cu_step_tl_print(const char *kind, const unsigned long long *dev_tl, int G, int n, const char *const *names,
                      int layer)
{
	unsigned long long *t = (unsigned long long *)malloc((size_t)G * n * 8);
	double *v = (double *)malloc((size_t)G * sizeof(double));
	if (!t || !v || cudaMemcpy(t, dev_tl, (size_t)G * n * 8, cudaMemcpyDeviceToHost) != cudaSuccess) {
		free(t), free(v);
		return;
	}
	unsigned long long t0 = ~0ull;
	for (int b = 0; b < G; b++)
		if (t[(size_t)b * n] && t[(size_t)b * n] < t0)
			t0 = t[(size_t)b * n];
	fprintf(stderr, "%s timeline, layer %d of the last step (us from its first start: median / max over the "
	        "blocks that mark it, count)\n", kind, layer);
	for (int p = 0; p < n; p++) {
		int k = 0;
		for (int b = 0; b < G; b++)
			if (t[(size_t)b * n + p] >= t0 && t0 != ~0ull) /* blocks without the phase leave it 0 */
				v[k++] = (double)(t[(size_t)b * n + p] - t0) / 1e3;
		if (!k)
			continue;
		qsort(v, (size_t)k, sizeof *v, ds_cmp);
		fprintf(stderr, "  %-9s %7.2f / %7.2f  (%d)\n", names[p], v[k / 2], v[k - 1], k);
	}
	free(t), free(v);
}

void cu_dstep_report(struct cuda_impl *c)
{
	if (!c->ds || !c->ds->a.tl)
		return;
	static const char *const names[DT_N] = {"start",   "qkv x",  "qkv",      "attn q",    "attn k", "attn c1",
	                                         "attn cl", "attn pub", "merge seen", "attn",   "o seen", "o",
	                                         "gu seen", "gu x",   "gu",       "down seen", "down x", "down"};
	cu_step_tl_print("dstep", c->ds->a.tl, c->sm_count, DT_N, names, c->ds->a.tl_layer);
}
