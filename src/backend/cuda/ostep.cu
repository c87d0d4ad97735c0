/* ostep.cu: the whole-step kernel for gpt-oss models (ostep.cuh): whether a model is one it takes
 * (gpt-oss-20b's or -120b's geometry: BF16 fused qkv and o with biases, sinks, windows of <= 128,
 * MXFP4 experts stacked by upload_moe with gpt-oss's interleaved gate / up and biases, a BF16
 * router with a bias, BF16 KV), its buffers and tensor maps, and the launch. mstep.cu's
 * step_prepare and step_layers hand gpt-oss models here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_impl.h"
#include "backend/cuda/moe_cuda.h"
#include "backend/cuda/ostep.cuh"

struct cu_ostep {
	os_args a;
	unsigned cnt_bytes;
};

/* the router [E][H] BF16 to [H / 16][E][16]: an o tile's 16 columns together */
static __global__ void os_router_cols(const __nv_bfloat16 *w, int E, __nv_bfloat16 *out)
{
	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < E * OS_H; i += gridDim.x * blockDim.x) {
		const int e = i / OS_H, k = i % OS_H;
		out[((size_t)(k / 16) * E + e) * 16 + k % 16] = w[i];
	}
}

static int os_bf(const struct fp4s_mat *m, int64_t rows, int64_t cols)
{
	return m && m->fmt == FP4S_WF_BF16 && m->rows == rows && m->cols == cols && m->bias && m->data &&
	       (uintptr_t)m->data % 16 == 0;
}

static int os_mx(const struct fp4s_stacked *s, int64_t rows, int64_t cols)
{
	return s->fmt == FP4S_WF_MXFP4 && s->rows == rows && s->cols == cols && s->bias && s->data && s->scales &&
	       s->e8_range && (uintptr_t)s->data % 16 == 0 && (uintptr_t)s->scales % 16 == 0 && s->stride_data % 16 == 0 &&
	       s->stride_scales % 16 == 0;
}

/* whether the model is one the kernel takes: its expert count, else 0 */
static int os_takes(const struct cuda_impl *c, const struct fp4s_step_desc *d)
{
	if (d->hidden != OS_H || d->n_heads != OS_NQ || d->n_kv_heads != OS_NKV || d->head_dim != OS_HD ||
	    d->rot_dim != OS_HD || d->norm_kind != FP4S_NORM_PLAIN || d->n_layers < 1 || !d->inv_freq)
		return 0;
	if (c->kv_dtype != FP4S_KV_BF16 || c->kv_width != OS_KVW || c->n_layers != d->n_layers || !c->kc || !c->vc ||
	    c->n_blocks < 1)
		return 0;
	/* a power of two 16 .. 128: os_route splits the E logits over min(256 / E, E / 4) threads an
	 * expert, 4 at a time */
	const int E = d->layers[0].moe ? d->layers[0].moe->n_experts : 0;
	if (E < 16 || E > OS_EMAX || (E & (E - 1)))
		return 0;
	for (int32_t l = 0; l < d->n_layers; l++) {
		const struct fp4s_step_layer *L = &d->layers[l];
		const struct fp4s_moe_params *p = L->moe;
		if (!os_bf(L->qkv, OS_QKV, OS_H) || !os_bf(L->o, OS_H, OS_QR) || !L->sinks || L->window < 0 ||
		    L->window > OS_WMAX || !L->attn_norm || !L->ffn_norm || L->q_norm || L->k_norm || !p || !p->dev)
			return 0;
		if (p->router_kind != FP4S_ROUTER_TOPK_SOFTMAX || !p->oai_swiglu || p->n_experts != E || p->top_k != OS_K ||
		    p->inter != OS_FI || p->hidden != OS_H || p->router.fmt != FP4S_WF_BF16 || p->router.rows != E ||
		    p->router.cols != OS_H || !p->router.bias || !p->router.data)
			return 0;
		int form = -1;
		const struct fp4s_stacked *gu = cu_moe_stacked(p->dev, 0, &form), *dn = cu_moe_stacked(p->dev, 1, &form);
		if (form != 1 || !os_mx(gu, 2 * OS_FI, OS_H) || !os_mx(dn, OS_H, OS_FI))
			return 0;
	}
	return E;
}

/* a BF16 matrix's map: [rows][K] as {64, rows, K / 64} (strides K 2 and 128 bytes), a box of nch
 * chunks of 16 rows ([chunk][row][128 bytes], the 128-byte swizzle os_bf_stage reads). 0 on success. */
static int os_map_bf(mg_encode_fn enc, const struct fp4s_mat *w, int nch, CUtensorMap *m)
{
	const cuuint64_t K = (cuuint64_t)w->cols, R = (cuuint64_t)w->rows;
	const cuuint64_t dim[3] = {64, R, K / 64}, st[2] = {K * 2, 128};
	const cuuint32_t box[3] = {64, 16, (cuuint32_t)nch}, one[3] = {1, 1, 1};
	return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)w->data, dim, st, box, one,
	           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
	           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS;
}

/* a K or V pool's map: [blocks][16][8][64] BF16 as {64, position 16, kv head, block}, a box one kv
 * head's 16 rows of a block (2 KB), swizzled (os_kv_sa) */
static int os_map_kv(mg_encode_fn enc, void *pool, int64_t blocks, CUtensorMap *m)
{
	const cuuint64_t dim[4] = {64, MG_KVB, OS_NKV, (cuuint64_t)blocks};
	const cuuint64_t st[3] = {OS_KVW * 2, OS_HD * 2, (cuuint64_t)MG_KVB * OS_KVW * 2};
	const cuuint32_t box[4] = {64, MG_KVB, 1, 1}, one[4] = {1, 1, 1, 1};
	return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, pool, dim, st, box, one, CU_TENSOR_MAP_INTERLEAVE_NONE,
	           CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) !=
	       CUDA_SUCCESS;
}

int cu_ostep_prepare(struct cuda_impl *c, const struct fp4s_step_desc *d, struct fp4s_error *err)
{
	int major = 0, smem = 0;
	cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->dev);
	cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->dev);
	const int E = os_takes(c, d);
	/* Hopper only; a block <= 3 qkv tiles, 2 o tiles, 12 gate|up tiles, 6 down tasks */
	if (!E || major != 9 || smem < OS_SMEM || c->sm_count < OS_GMIN)
		return FP4S_EUNSUPPORTED;
	const struct fp4s_moe_params *p0 = d->layers[0].moe;
	int form;
	const struct fp4s_stacked *gu0 = cu_moe_stacked(p0->dev, 0, &form), *dn0 = cu_moe_stacked(p0->dev, 1, &form);
	const mg_encode_fn enc = mg_encoder();
	if (!enc)
		return FP4S_EUNSUPPORTED;
	const int L = d->n_layers, smax = c->sm_count / OS_NKV;
	const size_t nmaps = (size_t)L * OM_N + 2;
	struct cu_ostep *os = (struct cu_ostep *)calloc(1, sizeof *os);
	os_layer *hl = (os_layer *)calloc((size_t)L, sizeof *hl);
	CUtensorMap *om = (CUtensorMap *)calloc(nmaps, sizeof *om);
	if (!os || !hl || !om) {
		free(os), free(hl), free(om);
		return fp4s_error_set(err, FP4S_ENOMEM, "ostep: out of host memory");
	}
	int rc = FP4S_OK;
	os_args &a = os->a;
	/* one MXFP4 scale offset for every layer's stack (the kernel takes one a matrix kind): the
	 * widest range over the layers */
	int32_t lo_gu = 255, hi_gu = 0, lo_dn = 255, hi_dn = 0;
	for (int l = 0; l < L; l++) {
		const struct fp4s_stacked *gu = cu_moe_stacked(d->layers[l].moe->dev, 0, &form);
		const struct fp4s_stacked *dn = cu_moe_stacked(d->layers[l].moe->dev, 1, &form);
		lo_gu = min(lo_gu, (gu->e8_range - 1) & 0xFF), hi_gu = max(hi_gu, ((gu->e8_range - 1) >> 8) & 0xFF);
		lo_dn = min(lo_dn, (dn->e8_range - 1) & 0xFF), hi_dn = max(hi_dn, ((dn->e8_range - 1) >> 8) & 0xFF);
	}
	float post; /* 1 for MXFP4 */
	if (gm_scale_params(0, 1.0f, 1 + (lo_gu | hi_gu << 8), &a.ec_gu, &a.pexp_gu, &post) ||
	    gm_scale_params(0, 1.0f, 1 + (lo_dn | hi_dn << 8), &a.ec_dn, &a.pexp_dn, &post))
		rc = FP4S_EUNSUPPORTED;
	os_layer *dly = NULL;
	const size_t cntb = ((size_t)L * OS_CNT * 4 + 15) & ~(size_t)15;
	struct {
		void **p;
		size_t bytes;
	} bufs[] = {
		{(void **)&a.h2, (size_t)L * OS_H * 4},
		{(void **)&a.yd, (size_t)L * OS_K * OS_H * 4},
		{(void **)&a.q, (size_t)L * OS_QR * 4},
		{(void **)&a.kraw, (size_t)L * OS_KVW * 4},
		{(void **)&a.att, (size_t)L * OS_QR * 4},
		{(void **)&a.part, (size_t)OS_NKV * smax * OS_GQ * OS_PS * 4},
		{(void **)&a.act, (size_t)L * OS_K * OS_FI * 4},
		{(void **)&a.cnt, cntb + (size_t)L * E * 8}, /* the counters, then the router's sums (one clear) */
		{(void **)&dly, (size_t)L * sizeof(os_layer)},
		{(void **)&a.maps, nmaps * sizeof(CUtensorMap)},
	};
	for (size_t i = 0; !rc && i < sizeof bufs / sizeof bufs[0]; i++)
		if (!(rc = cu_dev_alloc(c, bufs[i].p, bufs[i].bytes, err)))
			rc = cu_track(c, *bufs[i].p, err);
	const size_t layer_kv = (size_t)c->n_blocks * MG_KVB * OS_KVW;
	for (int l = 0; !rc && l < L; l++) {
		const struct fp4s_step_layer *S = &d->layers[l];
		const struct fp4s_moe_params *p = S->moe;
		const struct fp4s_stacked *gu = cu_moe_stacked(p->dev, 0, &form), *dn = cu_moe_stacked(p->dev, 1, &form);
		os_layer &y = hl[l];
		y.bqkv = S->qkv->bias, y.bo = S->o->bias, y.bgu = gu->bias, y.bdn = dn->bias, y.sinks = S->sinks;
		y.n1 = S->attn_norm, y.n2 = S->ffn_norm, y.rb = p->router.bias;
		y.gu = (const uint8_t *)gu->data, y.gu_s = gu->scales, y.dn = (const uint8_t *)dn->data, y.dn_s = dn->scales;
		y.kc = (__nv_bfloat16 *)c->kc + (size_t)l * layer_kv, y.vc = (__nv_bfloat16 *)c->vc + (size_t)l * layer_kv;
		y.window = S->window;
		__nv_bfloat16 *rt;
		if ((rc = cu_dev_alloc(c, (void **)&rt, (size_t)E * OS_H * 2, err)) || (rc = cu_track(c, rt, err)))
			break;
		os_router_cols<<<256, 256, 0, c->s>>>((const __nv_bfloat16 *)p->router.data, E, rt);
		y.rt = rt;
		if (os_map_bf(enc, S->qkv, OS_QCH, &om[(size_t)l * OM_N + OM_QKV]) ||
		    os_map_bf(enc, S->o, OS_OCH, &om[(size_t)l * OM_N + OM_O]))
			rc = FP4S_EUNSUPPORTED; /* a driver that will not encode them: the layer path */
		if (gu->stride_data != gu0->stride_data || gu->stride_scales != gu0->stride_scales ||
		    dn->stride_data != dn0->stride_data || dn->stride_scales != dn0->stride_scales)
			rc = FP4S_EUNSUPPORTED;
	}
	if (!rc && (os_map_kv(enc, c->kc, (int64_t)L * c->n_blocks, &om[nmaps - 2]) ||
	            os_map_kv(enc, c->vc, (int64_t)L * c->n_blocks, &om[nmaps - 1])))
		rc = FP4S_EUNSUPPORTED;
	if (!rc) {
		const cudaError_t e1 = cudaMemcpy(dly, hl, (size_t)L * sizeof(os_layer), cudaMemcpyHostToDevice);
		const cudaError_t e2 = cudaMemcpy((void *)a.maps, om, nmaps * sizeof(CUtensorMap), cudaMemcpyHostToDevice);
		const cudaError_t e3 = cudaFuncSetAttribute(os_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, OS_SMEM);
		const cudaError_t e4 = cudaStreamSynchronize(c->s); /* the routers' reorder */
		FP4S_CUDA_TRY(err, e1 != cudaSuccess ? e1 : e2 != cudaSuccess ? e2 : e3 != cudaSuccess ? e3 : e4);
	}
	free(hl);
	free(om);
	if (rc) {
		free(os); /* device buffers stay tracked, freed with the backend */
		return rc;
	}
	a.ly = dly, a.L = L, a.E = E;
	a.eps = d->eps, a.scale = d->attn_scale, a.mscale = d->rope_mscale, a.inv_freq = d->inv_freq;
	a.alpha = p0->swiglu_alpha, a.limit = p0->swiglu_limit;
	a.nb = c->n_blocks;
	a.gu_stride = (size_t)gu0->stride_data, a.gus_stride = (size_t)gu0->stride_scales;
	a.dn_stride = (size_t)dn0->stride_data, a.dns_stride = (size_t)dn0->stride_scales;
	a.kvmap = a.maps + nmaps - 2;
	a.lacc = reinterpret_cast<long long *>(reinterpret_cast<uint8_t *>(a.cnt) + cntb);
	os->cnt_bytes = (unsigned)(cntb + (size_t)L * E * 8);
	/* FP4S_OSTEP_TL=L: the phase marks of layer L (a diagnostic: cu_ostep_report prints them) */
	a.tl = cu_step_tl_alloc(c, "FP4S_OSTEP_TL", L, OT_N, &a.tl_layer);
	free(c->os);
	c->os = os;
	return FP4S_OK;
}

int cu_ostep_launch(struct cuda_impl *c, float *h, struct fp4s_error *err)
{
	os_args a = c->os->a;
	a.pos = c->d_pos, a.seq = c->d_seq, a.table = c->d_table, a.table_stride = c->table_stride;
	a.hin = h, a.hout = h;
	FP4S_CUDA_TRY(err, cu_step_run(c, (const void *)os_kernel, &a, OS_THREADS, OS_SMEM, a.cnt, c->os->cnt_bytes, a.tl, OT_N));
	return FP4S_OK;
}

void cu_ostep_report(struct cuda_impl *c)
{
	if (!c->os || !c->os->a.tl)
		return;
	static const char *const names[OT_N] = {"start", "qkv x",  "qkv",     "attn",      "o seen", "o",        "r seen",
	                                         "topk",  "gu",     "down seen", "down x", "down", "p topk", "p copied"};
	cu_step_tl_print("ostep", c->os->a.tl, c->sm_count, OT_N, names, c->os->a.tl_layer);
}
