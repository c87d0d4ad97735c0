/* mstep.cu: the CUDA backend's whole-step kernel (backend.h step_prepare, step_layers): one
 * launch for every layer of a qwen3-moe model of qwen3-30b-a3b's geometry (mstep.cuh; dense
 * models go to dstep.cu, gpt-oss models to ostep.cu). The
 * kernel reads the backend's own weights and paged KV cache; step_prepare checks that the model
 * is that one and makes the step's buffers, the router in the kernel's column order and the
 * tensor maps. FP4S_MSTEP=0 turns it off (the layer-by-layer path then runs). */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_impl.h"
#include "backend/cuda/moe_cuda.h"
#include "backend/cuda/mstep_kernel.cuh"

struct cu_mstep {
	mg_args a;            /* everything but the batch's arrays, which step_layers fills */
	mg_layer *ly;         /* [L] (device) */
	unsigned cnt_bytes;   /* the counters and act, cleared before each launch */
};

/* act's offset past the counters of L layers (256-byte aligned), and the bytes cleared before
 * each launch: the counters, then act */
#define MG_ACT_OFF(L) ((((size_t)(L) * MG_CNT * 4) + 255) & ~(size_t)255)
#define MG_CLEAR_BYTES(L) (MG_ACT_OFF(L) + (size_t)(L) * MG_K * MG_FI * 4)

/* the router [E][H] BF16 to [H / 16][E][16]: an o tile's 16 columns together */
static __global__ void mg_router_cols(const __nv_bfloat16 *w, __nv_bfloat16 *out)
{
	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < MG_E * MG_H; i += gridDim.x * blockDim.x) {
		const int e = i / MG_H, k = i % MG_H;
		out[((size_t)(k / 16) * MG_E + e) * 16 + k % 16] = w[i];
	}
}

static int fits_nv(const struct fp4s_mat *m, int64_t rows, int64_t cols)
{
	return m && m->fmt == FP4S_WF_NVFP4 && m->rows == rows && m->cols == cols && !m->bias && m->data &&
	       m->scales && (uintptr_t)m->data % 16 == 0 && (uintptr_t)m->scales % 16 == 0;
}

static int fits_stacked(const struct fp4s_stacked *s, int64_t rows, int64_t cols)
{
	return s->fmt == FP4S_WF_NVFP4 && s->rows == rows && s->cols == cols && !s->bias && s->data && s->scales &&
	       (uintptr_t)s->data % 16 == 0 && (uintptr_t)s->scales % 16 == 0 && s->stride_data % 16 == 0 &&
	       s->stride_scales % 16 == 0;
}

/* whether the model is one the kernel takes (its geometry is compiled in) */
static int mg_takes(const struct cuda_impl *c, const struct fp4s_step_desc *d)
{
	if (d->hidden != MG_H || d->n_heads != MG_NQ || d->n_kv_heads != MG_NKV || d->head_dim != MG_HD ||
	    d->rot_dim != MG_HD || d->norm_kind != FP4S_NORM_PLAIN || d->n_layers < 1 || !d->inv_freq)
		return 0;
	if (c->kv_dtype != FP4S_KV_BF16 || c->kv_width != MG_NKV * MG_HD || c->n_layers != d->n_layers || !c->kc ||
	    !c->vc || c->n_blocks < 1)
		return 0;
	for (int32_t l = 0; l < d->n_layers; l++) {
		const struct fp4s_step_layer *L = &d->layers[l];
		const struct fp4s_moe_params *p = L->moe;
		if (!fits_nv(L->qkv, MG_QKV, MG_H) || !fits_nv(L->o, MG_H, MG_QR) || L->has_bias || L->window ||
		    L->sinks || !L->attn_norm || !L->ffn_norm || !L->q_norm || !L->k_norm || !p || !p->dev)
			return 0;
		if (p->router_kind != FP4S_ROUTER_SOFTMAX_TOPK || !p->norm_topk || p->oai_swiglu || p->n_experts != MG_E ||
		    p->top_k != MG_K || p->inter != MG_FI || p->hidden != MG_H || p->router.fmt != FP4S_WF_BF16 ||
		    p->router.rows != MG_E || p->router.cols != MG_H || p->router.bias || p->router.ws2 != 1.0f ||
		    !p->router.data)
			return 0;
		int form = -1;
		const struct fp4s_stacked *gu = cu_moe_stacked(p->dev, 0, &form), *dn = cu_moe_stacked(p->dev, 1, &form);
		if (form != 2 || !fits_stacked(gu, 2 * MG_FI, MG_H) || !fits_stacked(dn, MG_H, MG_FI))
			return 0;
	}
	return 1;
}

/* a device copy of [E] tensor scales: the stack's own, or its one scale repeated */
static int mg_expert_scales(struct cuda_impl *c, const struct fp4s_stacked *s, const float **out,
                            struct fp4s_error *err)
{
	if (s->ws2e) {
		*out = s->ws2e;
		return FP4S_OK;
	}
	float h[MG_E], *d;
	for (int e = 0; e < MG_E; e++)
		h[e] = s->ws2;
	int rc = cu_dev_alloc(c, (void **)&d, sizeof h, err);
	if (rc || (rc = cu_track(c, d, err)))
		return rc;
	FP4S_CUDA_TRY(err, cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice));
	*out = d;
	return FP4S_OK;
}

static int cu_step_prepare(struct fp4s_backend *be, const struct fp4s_step_desc *d, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	const char *env = getenv("FP4S_MSTEP"); /* read at each prepare: a process may open both kinds */
	if (env && !strcmp(env, "0"))
		return FP4S_EUNSUPPORTED;
	free(c->ms), free(c->ds), free(c->os);
	c->ms = NULL, c->ds = NULL, c->os = NULL;
	if (d->n_layers > 0 && !d->layers[0].moe)
		return cu_dstep_prepare(c, d, err);
	if (d->n_layers > 0 && d->layers[0].moe->oai_swiglu)
		return cu_ostep_prepare(c, d, err);
	int major = 0, smem = 0;
	cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->dev);
	cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->dev);
	/* Hopper only (the kernel was measured there); a block an o tile and a down tile, <= 3 qkv
	 * tiles and <= 6 gate|up tiles a block: >= 128 SMs */
	if (major != 9 || smem < MG_SMEM || c->sm_count < MG_O_TILES || !mg_takes(c, d))
		return FP4S_EUNSUPPORTED;
	const mg_encode_fn enc = mg_encoder();
	if (!enc)
		return FP4S_EUNSUPPORTED;
	const int L = d->n_layers;
	const int smax = (d->max_ctx + MG_T - 1) / MG_T;
	struct cu_mstep *ms = (struct cu_mstep *)calloc(1, sizeof *ms);
	mg_layer *hl = (mg_layer *)calloc((size_t)L, sizeof *hl);
	CUtensorMap *om = (CUtensorMap *)calloc((size_t)4 * L + 2, sizeof *om);
	if (!ms || !hl || !om) {
		free(ms), free(hl), free(om);
		return fp4s_error_set(err, FP4S_ENOMEM, "mstep: out of host memory");
	}
	int rc = FP4S_OK;
	mg_args &a = ms->a;
	struct {
		void **p;
		size_t bytes;
	} bufs[] = {
		{(void **)&a.h, (size_t)L * MG_H * 4},
		{(void **)&a.h2, (size_t)L * MG_H * 4},
		{(void **)&a.q, (size_t)L * MG_QR * 4},
		{(void **)&a.kraw, (size_t)L * MG_NKV * MG_HD * 4},
		{(void **)&a.att, (size_t)L * MG_QR * 4},
		{(void **)&a.part, (size_t)MG_NKV * smax * 8 * MG_PS * 4},
		{(void **)&a.rpart, (size_t)L * MG_O_TILES * MG_E * 4},
		{(void **)&a.logits, (size_t)L * MG_E * 4},
		{(void **)&a.sel, (size_t)L * MG_K * 4},
		/* the counters, then act: cleared together before each launch (mg_put_ready) */
		{(void **)&a.cnt, MG_CLEAR_BYTES(L)},
		{(void **)&ms->ly, (size_t)L * sizeof(mg_layer)},
		{(void **)&a.maps, ((size_t)4 * L + 2) * sizeof(CUtensorMap)},
	};
	for (size_t i = 0; !rc && i < sizeof bufs / sizeof bufs[0]; i++)
		if (!(rc = cu_dev_alloc(c, bufs[i].p, bufs[i].bytes, err)))
			rc = cu_track(c, *bufs[i].p, err);
	const size_t layer_kv = (size_t)c->n_blocks * MG_KVB * MG_NKV * MG_HD; /* elements */
	for (int l = 0; !rc && l < L; l++) {
		const struct fp4s_step_layer *S = &d->layers[l];
		const struct fp4s_moe_params *p = S->moe;
		int form;
		const struct fp4s_stacked *gu = cu_moe_stacked(p->dev, 0, &form), *dn = cu_moe_stacked(p->dev, 1, &form);
		mg_layer &y = hl[l];
		y.qkv = (const uint8_t *)S->qkv->data, y.qkv_s = S->qkv->scales, y.qkv_ws2 = S->qkv->ws2;
		y.o = (const uint8_t *)S->o->data, y.o_s = S->o->scales, y.o_ws2 = S->o->ws2;
		y.gu = (const uint8_t *)gu->data, y.gu_s = gu->scales, y.dn = (const uint8_t *)dn->data, y.dn_s = dn->scales;
		if ((rc = mg_expert_scales(c, gu, &y.gu_ws2, err)) || (rc = mg_expert_scales(c, dn, &y.dn_ws2, err)))
			break;
		__nv_bfloat16 *rt;
		if ((rc = cu_dev_alloc(c, (void **)&rt, (size_t)MG_E * MG_H * 2, err)) || (rc = cu_track(c, rt, err)))
			break;
		mg_router_cols<<<256, 256, 0, c->s>>>((const __nv_bfloat16 *)p->router.data, rt);
		y.rt = rt;
		y.n1 = S->attn_norm, y.n2 = S->ffn_norm, y.qn = S->q_norm, y.kn = S->k_norm;
		y.kc = (__nv_bfloat16 *)c->kc + (size_t)l * layer_kv, y.vc = (__nv_bfloat16 *)c->vc + (size_t)l * layer_kv;
		/* a driver that will not encode these maps: the layer path instead */
		if (mg_map_w(enc, y.o, y.o_s, y.qkv_s, y.gu_s, (int64_t)MG_E * 2 * MG_FI, &om[4 * l]))
			rc = FP4S_EUNSUPPORTED;
		a.gu_stride = (size_t)gu->stride_data, a.gus_stride = (size_t)gu->stride_scales;
		a.dn_stride = (size_t)dn->stride_data, a.dns_stride = (size_t)dn->stride_scales;
	}
	if (!rc && (mg_map_kv(enc, c->kc, (int64_t)L * c->n_blocks, MG_NKV, &om[4 * L]) ||
	            mg_map_kv(enc, c->vc, (int64_t)L * c->n_blocks, MG_NKV, &om[4 * L + 1])))
		rc = FP4S_EUNSUPPORTED;
	if (!rc) {
		const cudaError_t e1 = cudaMemcpy(ms->ly, hl, (size_t)L * sizeof(mg_layer), cudaMemcpyHostToDevice);
		const cudaError_t e2 = cudaMemcpy((void *)a.maps, om, ((size_t)4 * L + 2) * sizeof(CUtensorMap),
		                                  cudaMemcpyHostToDevice);
		const cudaError_t e3 = cudaFuncSetAttribute(mg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, MG_SMEM);
		const cudaError_t e4 = cudaStreamSynchronize(c->s); /* the routers' reorder */
		FP4S_CUDA_TRY(err, e1 != cudaSuccess ? e1 : e2 != cudaSuccess ? e2 : e3 != cudaSuccess ? e3 : e4);
	}
	free(hl);
	free(om);
	if (rc) {
		free(ms); /* device buffers stay tracked, freed with the backend */
		return rc;
	}
	a.ly = ms->ly, a.L = L;
	a.eps = d->eps, a.scale = d->attn_scale, a.mscale = d->rope_mscale, a.inv_freq = d->inv_freq;
	a.nb = c->n_blocks;
	a.kvmap = a.maps + 4 * L;
	/* FP4S_MSTEP_TL=L: the phase marks of layer L (a diagnostic: cu_mstep_report prints them) */
	a.tl = cu_step_tl_alloc(c, "FP4S_MSTEP_TL", L, MG_TL, &a.tl_layer);
	a.act = (float *)((char *)a.cnt + MG_ACT_OFF(L));
	ms->cnt_bytes = (unsigned)MG_CLEAR_BYTES(L);
	c->ms = ms;
	return FP4S_OK;
}

static int cu_step_layers(struct fp4s_backend *be, float *h, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	struct cu_mstep *ms = c->ms;
	if (!ms && !c->ds && !c->os)
		return fp4s_error_set(err, FP4S_EINVAL, "mstep: step_layers before step_prepare");
	cu_link_clear(c);
	if (c->os)
		return cu_ostep_launch(c, h, err);
	if (!ms)
		return cu_dstep_launch(c, h, err);
	mg_args a = ms->a;
	a.pos = c->d_pos, a.seq = c->d_seq, a.table = c->d_table, a.table_stride = c->table_stride;
	a.hin = h, a.hout = h;
	FP4S_CUDA_TRY(err, cu_step_run(c, (const void *)mg_kernel, &a, MG_THREADS, MG_SMEM, a.cnt, ms->cnt_bytes, a.tl, MG_TL));
	return FP4S_OK;
}

void cu_mstep_report(struct cuda_impl *c)
{
	if (!c->ms || !c->ms->a.tl)
		return;
	/* mstep.cuh's T_ marks; the attention's are the block's last task's, p: the producer's */
	static const char *const names[MG_TL] = {
		"start",    "qkv x",      "qkv tiles", "qkv",    "attn q",   "attn s",    "attn sm", "attn pv",
		"attn pw",  "merge seen", "merge ld",  "attn",   "o",        "o seen",    "r sum",   "topk",
		"gu",       "down seen",  "down act",  "down land", "down",    "p topk",    "p copied"};
	cu_step_tl_print("mstep", c->ms->a.tl, c->sm_count, MG_TL, names, c->ms->a.tl_layer);
}

void cu_mstep_install(struct fp4s_backend *be)
{
	be->step_prepare = cu_step_prepare;
	be->step_layers = cu_step_layers;
}
