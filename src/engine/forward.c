/* forward.c: the decoder forward pass (see forward.h). Layer order per architectures.md:
 *   h = embed(tokens)
 *   per layer: x = norm(h); q,k,v = proj(x) (+bias); [qwen3: per-head q/k norm]; RoPE;
 *              attention over the cache (GQA, causal, window, sinks); h += o_proj(attn) (+bias)
 *              x = norm(h); h += dense SwiGLU MLP or routed MoE
 *   logits = lm_head(norm(h)) for the rows asked for. */
#include "engine/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"
#include "numerics/numerics.h"

static int own(struct fp4s_fwd *f, void *p, struct fp4s_error *err)
{
	if (!p)
		return fp4s_error_set(err, FP4S_ENOMEM, "forward: out of memory");
	if (f->n_owned == f->cap_owned) {
		int32_t cap = f->cap_owned ? 2 * f->cap_owned : 64;
		void **n = realloc(f->owned, (size_t)cap * sizeof *n);
		if (!n) {
			free(p);
			return fp4s_error_set(err, FP4S_ENOMEM, "forward: out of memory");
		}
		f->owned = n, f->cap_owned = cap;
	}
	f->owned[f->n_owned++] = p;
	return FP4S_OK;
}

static int ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);
	return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* A stored weight as a matrix view: [shape[0], shape[1]] for a LINEAR. */
static struct fp4s_mat mat_of(const struct fp4s_weight *w)
{
	struct fp4s_mat m = {.fmt = w->fmt, .rows = w->spec->shape[0], .cols = w->spec->shape[1],
	                     .data = w->data, .scales = w->scales, .ws2 = w->ws2 > 0 ? w->ws2 : 1.0f};
	return m;
}

/* A float tensor (norm, bias, sinks) converted to FP32, owned by f. */
static int to_f32(struct fp4s_fwd *f, const struct fp4s_weight *w, float **out, struct fp4s_error *err)
{
	int64_t n = fp4s_weight_numel(w);
	float *p = malloc((size_t)n * sizeof *p);
	int rc = own(f, p, err);
	if (rc)
		return rc;
	struct fp4s_mat m = {.fmt = w->fmt, .rows = 1, .cols = n, .data = w->data, .ws2 = 1.0f};
	fp4s_cpu_mat_row(&m, 0, p);
	*out = p;
	return FP4S_OK;
}

/* gpt-oss packed experts: expert e's [out, in] slice of [E, out, in] (MXFP4 blocks), or a
 * transposed copy of the BF16 dequantized layout [E, in, out]. */
static int expert_mat(struct fp4s_fwd *f, const struct fp4s_weight *w, int32_t e, struct fp4s_mat *m,
                      struct fp4s_error *err)
{
	const int64_t out = w->spec->shape[1], in = w->spec->shape[2];
	memset(m, 0, sizeof *m);
	m->rows = out, m->cols = in, m->ws2 = 1.0f;
	if (w->fmt == FP4S_WF_MXFP4 || w->fmt == FP4S_WF_NVFP4) {
		const int64_t block = w->fmt == FP4S_WF_MXFP4 ? 32 : 16;
		m->fmt = w->fmt;
		m->data = (const uint8_t *)w->data + (size_t)e * (size_t)(out * in / 2);
		m->scales = w->scales + (size_t)e * (size_t)(out * in / block);
		m->ws2 = w->ws2 > 0 ? w->ws2 : 1.0f;
		return FP4S_OK;
	}
	float *t = malloc((size_t)(out * in) * sizeof *t), *row = malloc((size_t)out * sizeof *row);
	if (!row) {
		free(t);
		return fp4s_error_set(err, FP4S_ENOMEM, "forward: out of memory");
	}
	int rc = own(f, t, err);
	if (rc) {
		free(row);
		return rc;
	}
	const size_t esz = w->fmt == FP4S_WF_F32 ? 4 : 2;
	const uint8_t *base = (const uint8_t *)w->data + (size_t)e * (size_t)(out * in) * esz;
	if (w->transposed) {
		/* stored [in, out]: row i of the stored matrix is input feature i */
		struct fp4s_mat s = {.fmt = w->fmt, .rows = in, .cols = out, .data = base, .ws2 = 1.0f};
		for (int64_t i = 0; i < in; i++) {
			fp4s_cpu_mat_row(&s, i, row);
			for (int64_t o = 0; o < out; o++)
				t[o * in + i] = row[o];
		}
	} else {
		struct fp4s_mat s = {.fmt = w->fmt, .rows = out, .cols = in, .data = base, .ws2 = 1.0f};
		for (int64_t o = 0; o < out; o++)
			fp4s_cpu_mat_row(&s, o, t + o * in);
	}
	free(row);
	m->fmt = FP4S_WF_F32;
	m->data = t;
	return FP4S_OK;
}

static int layer_tensor(struct fp4s_fwd *f, const struct fp4s_weight *w, struct fp4s_error *err)
{
	const struct fp4s_config *c = f->cfg;
	const char *name = w->spec->name;
	struct fp4s_fwd_layer *L = &f->layers[w->spec->layer];
	const int32_t e = w->spec->expert;
	switch (w->spec->role) {
	case FP4S_ROLE_NORM:
		if (ends_with(name, "input_layernorm.weight"))
			return to_f32(f, w, &L->attn_norm, err);
		if (ends_with(name, "post_attention_layernorm.weight"))
			return to_f32(f, w, &L->ffn_norm, err);
		if (ends_with(name, "q_norm.weight"))
			return to_f32(f, w, &L->q_norm, err);
		if (ends_with(name, "k_norm.weight"))
			return to_f32(f, w, &L->k_norm, err);
		break;
	case FP4S_ROLE_ATTN_Q: L->q = mat_of(w); return FP4S_OK;
	case FP4S_ROLE_ATTN_K: L->k = mat_of(w); return FP4S_OK;
	case FP4S_ROLE_ATTN_V: L->v = mat_of(w); return FP4S_OK;
	case FP4S_ROLE_ATTN_O: L->o = mat_of(w); return FP4S_OK;
	case FP4S_ROLE_ATTN_BIAS:
		if (ends_with(name, "q_proj.bias"))
			return to_f32(f, w, &L->bq, err);
		if (ends_with(name, "k_proj.bias"))
			return to_f32(f, w, &L->bk, err);
		if (ends_with(name, "v_proj.bias"))
			return to_f32(f, w, &L->bv, err);
		if (ends_with(name, "o_proj.bias"))
			return to_f32(f, w, &L->bo, err);
		break;
	case FP4S_ROLE_ATTN_SINKS: return to_f32(f, w, &L->sinks, err);
	case FP4S_ROLE_MLP_GATE: L->gate = mat_of(w); return FP4S_OK;
	case FP4S_ROLE_MLP_UP: L->up = mat_of(w); return FP4S_OK;
	case FP4S_ROLE_MLP_DOWN: L->down = mat_of(w); return FP4S_OK;
	case FP4S_ROLE_ROUTER: L->moe.router = mat_of(w); return FP4S_OK;
	case FP4S_ROLE_ROUTER_BIAS: {
		float *b;
		int rc = to_f32(f, w, &b, err);
		L->moe.router.bias = b;
		return rc;
	}
	case FP4S_ROLE_EXPERT_GATE: L->experts[e].gate = mat_of(w); return FP4S_OK;
	case FP4S_ROLE_EXPERT_UP: L->experts[e].up = mat_of(w); return FP4S_OK;
	case FP4S_ROLE_EXPERT_DOWN: L->experts[e].down = mat_of(w); return FP4S_OK;
	case FP4S_ROLE_EXPERTS_GATE_UP:
	case FP4S_ROLE_EXPERTS_DOWN:
		for (int32_t x = 0; x < c->n_experts; x++) {
			struct fp4s_mat *m = w->spec->role == FP4S_ROLE_EXPERTS_GATE_UP ? &L->experts[x].gate_up
			                                                                : &L->experts[x].down;
			const float *bias = m->bias; /* biases may have been seen first */
			int rc = expert_mat(f, w, x, m, err);
			if (rc)
				return rc;
			m->bias = bias;
		}
		return FP4S_OK;
	case FP4S_ROLE_EXPERTS_BIAS: {
		float *b;
		int rc = to_f32(f, w, &b, err);
		if (rc)
			return rc;
		const int gu = ends_with(name, "gate_up_proj_bias");
		const int64_t width = w->spec->shape[1];
		for (int32_t x = 0; x < c->n_experts; x++)
			(gu ? &L->experts[x].gate_up : &L->experts[x].down)->bias = b + (int64_t)x * width;
		return FP4S_OK;
	}
	default:
		break;
	}
	return FP4S_OK; /* tensors the forward pass does not use */
}

/* Offers the model to the backend's whole-step kernel (backend.h step_prepare); f->step_ok when
 * it takes it. */
static int step_prepare(struct fp4s_fwd *f, int32_t max_ctx, struct fp4s_error *err)
{
	const struct fp4s_config *c = f->cfg;
	struct fp4s_backend *be = f->be;
	f->step_ok = 0;
	if (!be->step_prepare || !be->step_layers)
		return FP4S_OK;
	/* read during step_prepare only (the backend keeps what it needs) */
	struct fp4s_step_layer *sl = calloc((size_t)c->n_layers, sizeof *sl);
	if (!sl)
		return fp4s_error_set(err, FP4S_ENOMEM, "forward: out of host memory");
	for (int32_t l = 0; l < c->n_layers; l++) {
		const struct fp4s_fwd_layer *L = &f->layers[l];
		sl[l] = (struct fp4s_step_layer){.qkv = L->fused_qkv ? &L->qkv : NULL, .o = &L->o,
		                                 .attn_norm = L->attn_norm, .ffn_norm = L->ffn_norm,
		                                 .q_norm = L->q_norm, .k_norm = L->k_norm,
		                                 .has_bias = L->bq || L->bk || L->bv || L->bo, .window = L->window,
		                                 .sinks = L->sinks, .moe = L->is_moe ? &L->moe : NULL,
		                                 .gate_up = !L->is_moe && L->fused_gu && L->gu_pairs ? &L->gate_up : NULL,
		                                 .down = L->is_moe ? NULL : &L->down};
	}
	const struct fp4s_step_desc d = {.n_layers = c->n_layers, .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads,
	                                 .head_dim = c->head_dim, .rot_dim = f->rot_dim, .hidden = c->hidden,
	                                 .eps = (float)c->rms_eps, .attn_scale = 1.0f / sqrtf((float)c->head_dim),
	                                 .rope_mscale = f->rope_mscale, .inv_freq = f->inv_freq,
	                                 .norm_kind = f->norm_kind, .max_ctx = max_ctx, .layers = sl};
	const int rc = be->step_prepare(be, &d, err);
	free(sl);
	if (rc == FP4S_EUNSUPPORTED) {
		if (err)
			err->code = FP4S_OK, err->msg[0] = 0;
		return FP4S_OK;
	}
	f->step_ok = rc == FP4S_OK;
	return rc;
}

int fp4s_fwd_init(struct fp4s_fwd *f, const struct fp4s_model *m, struct fp4s_backend *be,
                  int32_t max_seqs, int32_t max_ctx, enum fp4s_kv_dtype kv, struct fp4s_error *err)
{
	return fp4s_fwd_init_pool(f, m, be, max_seqs, max_ctx, 0, kv, err);
}

int fp4s_fwd_init_pool(struct fp4s_fwd *f, const struct fp4s_model *m, struct fp4s_backend *be,
                       int32_t max_seqs, int32_t max_ctx, int32_t n_blocks, enum fp4s_kv_dtype kv,
                       struct fp4s_error *err)
{
	const struct fp4s_config *c = &m->cfg;
	int rc;
	memset(f, 0, sizeof *f);
	f->model = m, f->cfg = c, f->be = be, f->max_seqs = max_seqs, f->max_ctx = max_ctx;
	if (c->arch != FP4S_ARCH_LLAMA && c->arch != FP4S_ARCH_QWEN3 && c->arch != FP4S_ARCH_QWEN3_MOE &&
	    c->arch != FP4S_ARCH_GPT_OSS)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "forward pass for %s is not implemented yet",
		                      fp4s_arch_name(c->arch));
	f->norm_kind = FP4S_NORM_PLAIN;
	f->layers = calloc((size_t)c->n_layers, sizeof *f->layers);
	if ((rc = own(f, f->layers, err)))
		return rc;
	for (int32_t l = 0; l < c->n_layers; l++) {
		struct fp4s_fwd_layer *L = &f->layers[l];
		L->is_moe = c->layer_is_moe ? c->layer_is_moe[l] : 0;
		f->has_moe |= L->is_moe;
		L->window = c->layer_kind && c->layer_kind[l] == FP4S_LAYER_SLIDING ? c->sliding_window : 0;
		if (L->is_moe) {
			L->experts = calloc((size_t)c->n_experts, sizeof *L->experts);
			if ((rc = own(f, L->experts, err)))
				return rc;
			L->moe.n_experts = c->n_experts;
			L->moe.top_k = c->n_experts_per_tok;
			L->moe.hidden = c->hidden;
			L->moe.experts = L->experts;
			if (c->arch == FP4S_ARCH_GPT_OSS) {
				L->moe.router_kind = FP4S_ROUTER_TOPK_SOFTMAX;
				L->moe.oai_swiglu = 1;
				L->moe.swiglu_alpha = (float)(c->swiglu_alpha > 0 ? c->swiglu_alpha : 1.702);
				L->moe.swiglu_limit = (float)(c->swiglu_limit > 0 ? c->swiglu_limit : 7.0);
				L->moe.inter = c->intermediate;
			} else {
				L->moe.router_kind = FP4S_ROUTER_SOFTMAX_TOPK;
				L->moe.norm_topk = c->norm_topk_prob;
				L->moe.inter = c->moe_intermediate;
			}
		}
	}
	for (int32_t i = 0; i < m->n; i++) {
		const struct fp4s_weight *w = &m->w[i];
		if (!w->present)
			continue;
		switch (w->spec->role) {
		case FP4S_ROLE_EMBED: f->embed = mat_of(w); break;
		case FP4S_ROLE_LM_HEAD: f->lm_head = mat_of(w); break;
		case FP4S_ROLE_NORM:
			if (w->spec->layer < 0) {
				if ((rc = to_f32(f, w, &f->final_norm, err)))
					return rc;
				break;
			}
			/* fall through */
		default:
			if (w->spec->layer >= 0 && w->spec->layer < c->n_layers &&
			    (rc = layer_tensor(f, w, err)))
				return fp4s_error_prefix(err, "%s: ", w->spec->name);
		}
	}
	const int tied = !f->lm_head.data || f->lm_head.data == f->embed.data;
	if (!f->embed.data || !f->final_norm)
		return fp4s_error_set(err, FP4S_EFORMAT, "model lacks the embedding or the final norm");
	/* attention biases are applied by the matmul */
	for (int32_t l = 0; l < c->n_layers; l++) {
		struct fp4s_fwd_layer *L = &f->layers[l];
		L->q.bias = L->bq, L->k.bias = L->bk, L->v.bias = L->bv, L->o.bias = L->bo;
	}
	f->rot_dim = (int32_t)lround(c->head_dim * (c->rope.partial_rotary_factor > 0 ? c->rope.partial_rotary_factor : 1.0));
	f->rot_dim &= ~1;
	f->inv_freq = malloc((size_t)f->rot_dim / 2 * sizeof *f->inv_freq + 1);
	if ((rc = own(f, f->inv_freq, err)))
		return rc;
	if ((rc = fp4s_rope_inv_freq(&c->rope, f->rot_dim, f->inv_freq, &f->rope_mscale, err)))
		return rc;
	/* weights to the backend (a no-op on the CPU) */
	if ((rc = be->upload_mat(be, &f->embed, err)))
		return rc;
	if (tied)
		f->lm_head = f->embed;
	else if ((rc = be->upload_mat(be, &f->lm_head, err)))
		return rc;
	if ((rc = be->upload_f32(be, &f->final_norm, c->hidden, err)) ||
	    (rc = be->upload_f32(be, &f->inv_freq, f->rot_dim / 2, err)))
		return rc;
	for (int32_t l = 0; l < c->n_layers; l++) {
		struct fp4s_fwd_layer *L = &f->layers[l];
		/* q/k/v and gate/up in one allocation each where the backend can stream them in one
		 * matmul (same format and K, same NVFP4 per-tensor scale) */
		struct fp4s_mat *qkv[] = {&L->q, &L->k, &L->v}, *gu[] = {&L->gate, &L->up};
		rc = be->upload_fused(be, qkv, 3, &L->qkv, err);
		if (rc && rc != FP4S_EUNSUPPORTED)
			return fp4s_error_prefix(err, "layer %d: ", l);
		L->fused_qkv = rc == FP4S_OK;
		/* gate/up rows alternating where the backend takes it (its decode matmul then writes the
		 * SwiGLU), else gate then up */
		rc = L->gate.data && L->up.data && be->upload_gate_up && be->swiglu_pairs
		             ? be->upload_gate_up(be, &L->gate, &L->up, &L->gate_up, err)
		             : FP4S_EUNSUPPORTED;
		if (rc && rc != FP4S_EUNSUPPORTED)
			return fp4s_error_prefix(err, "layer %d: ", l);
		L->gu_pairs = rc == FP4S_OK;
		if (!L->gu_pairs)
			rc = L->gate.data ? be->upload_fused(be, gu, 2, &L->gate_up, err) : FP4S_EUNSUPPORTED;
		if (rc && rc != FP4S_EUNSUPPORTED)
			return fp4s_error_prefix(err, "layer %d: ", l);
		L->fused_gu = rc == FP4S_OK;
		struct fp4s_mat *mats[] = {&L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down};
		for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
			const int done = (L->fused_qkv && i < 3) || (L->fused_gu && (i == 4 || i == 5));
			if (mats[i]->data && !done && (rc = be->upload_mat(be, mats[i], err)))
				return fp4s_error_prefix(err, "layer %d: ", l);
		}
		rc = L->is_moe ? be->upload_moe(be, &L->moe, err) : FP4S_EUNSUPPORTED;
		if (rc && rc != FP4S_EUNSUPPORTED)
			return fp4s_error_prefix(err, "layer %d experts: ", l);
		if (L->is_moe && (rc = be->upload_mat(be, &L->moe.router, err)))
			return fp4s_error_prefix(err, "layer %d router: ", l);
		for (int32_t x = 0; L->is_moe && !L->moe.dev && x < L->moe.n_experts; x++) {
			struct fp4s_expert *ex = &L->experts[x];
			struct fp4s_mat *em[] = {&ex->gate, &ex->up, &ex->gate_up, &ex->down};
			for (size_t i = 0; i < 4; i++)
				if (em[i]->data && (rc = be->upload_mat(be, em[i], err)))
					return fp4s_error_prefix(err, "layer %d expert %d: ", l, x);
		}
		if ((L->attn_norm && (rc = be->upload_f32(be, &L->attn_norm, c->hidden, err))) ||
		    (L->ffn_norm && (rc = be->upload_f32(be, &L->ffn_norm, c->hidden, err))) ||
		    (L->q_norm && (rc = be->upload_f32(be, &L->q_norm, c->head_dim, err))) ||
		    (L->k_norm && (rc = be->upload_f32(be, &L->k_norm, c->head_dim, err))) ||
		    (L->sinks && (rc = be->upload_f32(be, &L->sinks, c->n_heads, err))))
			return fp4s_error_prefix(err, "layer %d: ", l);
	}
	f->moe_on_device = f->has_moe;
	for (int32_t l = 0; l < c->n_layers; l++)
		if (f->layers[l].is_moe && !f->layers[l].moe.dev)
			f->moe_on_device = 0;
	if (max_seqs <= 0 || max_ctx <= 0 || (int64_t)max_seqs * max_ctx > (1 << 30))
		return fp4s_error_set(err, FP4S_EINVAL, "forward: %d sequences of %d positions", max_seqs, max_ctx);
	f->table_stride = (max_ctx + FP4S_KV_BLOCK - 1) / FP4S_KV_BLOCK;
	f->n_blocks = n_blocks > 0 ? n_blocks : max_seqs * f->table_stride;
	f->ident_table = malloc((size_t)max_seqs * f->table_stride * sizeof *f->ident_table);
	if ((rc = own(f, f->ident_table, err)))
		return rc;
	for (int32_t i = 0; i < max_seqs * f->table_stride; i++)
		f->ident_table[i] = i < f->n_blocks ? i : 0;
	if ((rc = be->kv_init(be, c->n_layers, c->n_kv_heads * c->head_dim, f->n_blocks, max_seqs, max_ctx, kv, err)))
		return rc;
	return step_prepare(f, max_ctx, err);
}

static void scratch_free(struct fp4s_fwd *f)
{
	float **bufs[] = {&f->h, &f->x, &f->q, &f->k, &f->v, &f->att, &f->g, &f->u, &f->y, &f->last, &f->logits, &f->fused};
	for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
		if (*bufs[i] && f->be)
			f->be->free(f->be, *bufs[i]);
		*bufs[i] = NULL;
	}
	f->scratch_tokens = f->scratch_out = 0;
}

/* Activation buffers for n tokens and n_out logits rows, grown as needed and kept: a GPU
 * allocation per step would cost more than the step. */
static int scratch_reserve(struct fp4s_fwd *f, int32_t n, int32_t n_out, int64_t inter,
                           struct fp4s_error *err)
{
	const struct fp4s_config *c = f->cfg;
	if (n <= f->scratch_tokens && n_out <= f->scratch_out)
		return FP4S_OK;
	if (n < f->scratch_tokens)
		n = f->scratch_tokens;
	if (n_out < f->scratch_out)
		n_out = f->scratch_out;
	if (n_out < 1)
		n_out = 1;
	scratch_free(f);
	const int64_t H = c->hidden, qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
	struct {
		float **p;
		int64_t n;
	} want[] = {{&f->h, n * H},     {&f->x, n * H},     {&f->q, n * qd},  {&f->k, n * kvd},
	            {&f->v, n * kvd},   {&f->att, n * qd},  {&f->g, n * inter}, {&f->u, 2 * n * inter},
	            {&f->y, n * H},     {&f->last, n_out * H}, {&f->logits, n_out * c->vocab},
	            {&f->fused, qd + 2 * kvd > 2 * inter ? qd + 2 * kvd : 2 * inter}};
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
		int rc = f->be->alloc(f->be, (void **)want[i].p, want[i].n * (int64_t)sizeof(float), err);
		if (rc) {
			scratch_free(f);
			return rc;
		}
	}
	f->scratch_tokens = n, f->scratch_out = n_out;
	f->be->graph_reset(f->be); /* captured steps point at the old buffers */
	return FP4S_OK;
}

void fp4s_fwd_free(struct fp4s_fwd *f)
{
	scratch_free(f);
	for (int i = 0; i < FP4S_FWD_AHEAD; i++)
		free(f->held[i]);
	free(f->host_logits);
	if (f->samp_scratch)
		fp4s_samp_free(f->samp_scratch);
	free(f->samp_scratch);
	free(f->feed_tmp);
	for (int32_t i = 0; i < f->n_owned; i++)
		free(f->owned[i]);
	free(f->owned);
	memset(f, 0, sizeof *f);
}

struct step {
	struct fp4s_fwd *f;
	const struct fp4s_batch *b;
	const int32_t *out_rows;
	int32_t n_out;
};

/* out = W . rmsnorm(h) for one token, fused where the backend can, else through the scratch x */
static int norm_matmul(struct fp4s_backend *be, const float *h, const float *nw, float eps, enum fp4s_norm_kind kind,
                       int64_t H, const struct fp4s_mat *w, float *x, float *out, struct fp4s_error *err)
{
	int rc = be->norm_matmul ? be->norm_matmul(be, h, nw, eps, kind, 1, w, out, err) : FP4S_EUNSUPPORTED;
	if (rc != FP4S_EUNSUPPORTED)
		return rc;
	be->rmsnorm(be, h, nw, 1, H, eps, kind, x);
	return be->matmul(be, x, 1, w, out, err);
}

/* h += W . x, fused where the backend can, else through the scratch y */
static int matmul_add(struct fp4s_backend *be, const float *x, int64_t n, const struct fp4s_mat *w, float *h,
                      float *y, int64_t H, struct fp4s_error *err)
{
	int rc = be->matmul_add ? be->matmul_add(be, x, n, w, h, err) : FP4S_EUNSUPPORTED;
	if (rc != FP4S_EUNSUPPORTED)
		return rc;
	if ((rc = be->matmul(be, x, n, w, y, err)))
		return rc;
	be->add(be, h, y, n * H);
	return FP4S_OK;
}

/* q/k per-head RMSNorm (either may be absent) then RoPE, in one kernel where the backend can */
static int norm_rope(struct fp4s_backend *be, const struct fp4s_fwd *f, const struct fp4s_fwd_layer *L, float *q,
                     float *k, const struct fp4s_batch *b, int32_t nh, int32_t nkv, int32_t d, float eps,
                     struct fp4s_error *err)
{
	int rc = L->q_norm && L->k_norm && be->norm_rope
	             ? be->norm_rope(be, q, k, L->q_norm, L->k_norm, eps, f->norm_kind, b, nh, nkv, d, f->rot_dim,
	                             f->inv_freq, f->rope_mscale, err)
	             : FP4S_EUNSUPPORTED;
	if (rc != FP4S_EUNSUPPORTED)
		return rc;
	if (L->q_norm)
		be->rmsnorm(be, q, L->q_norm, (int64_t)b->n * nh, d, eps, f->norm_kind, q);
	if (L->k_norm)
		be->rmsnorm(be, k, L->k_norm, (int64_t)b->n * nkv, d, eps, f->norm_kind, k);
	be->rope(be, q, k, b, nh, nkv, d, f->rot_dim, f->inv_freq, f->rope_mscale);
	return FP4S_OK;
}

/* [Qwen3: per-head q/k RMSNorm over d], RoPE, then attention over the cache with this step's
 * k/v written into it: one kernel where the backend can */
static int rope_attention(struct fp4s_backend *be, const struct fp4s_fwd *f, const struct fp4s_fwd_layer *L,
                          int32_t l, float *q, float *k, float *v, const struct fp4s_batch *b,
                          const struct fp4s_attn_params *ap, float eps, float *att, struct fp4s_error *err)
{
	int rc = be->rope_attention ? be->rope_attention(be, l, q, k, v, L->q_norm, L->k_norm, eps, f->norm_kind, b,
	                                                 f->rot_dim, f->inv_freq, f->rope_mscale, ap, att, err)
	                            : FP4S_EUNSUPPORTED;
	if (rc != FP4S_EUNSUPPORTED)
		return rc;
	if ((rc = norm_rope(be, f, L, q, k, b, ap->n_heads, ap->n_kv_heads, ap->head_dim, eps, err)))
		return rc;
	return be->attention(be, l, q, k, v, b, ap, att, err);
}

/* h += moe(x), fused where the backend can, else through the scratch y */
static int moe_add(struct fp4s_backend *be, const struct fp4s_moe_params *p, const float *x, int64_t n, float *h,
                   float *y, int64_t H, struct fp4s_error *err)
{
	int rc = be->moe_add ? be->moe_add(be, p, x, n, h, err) : FP4S_EUNSUPPORTED;
	if (rc != FP4S_EUNSUPPORTED)
		return rc;
	if ((rc = be->moe(be, p, x, n, y, err)))
		return rc;
	be->add(be, h, y, n * H);
	return FP4S_OK;
}

/* h += moe(rmsnorm(h)), in fewer kernels where the backend can, else through the scratch x */
static int norm_moe_add(struct fp4s_backend *be, const struct fp4s_moe_params *p, float *h, const float *nw,
                        float eps, enum fp4s_norm_kind kind, int64_t n, float *x, float *y, int64_t H,
                        struct fp4s_error *err)
{
	int rc = be->norm_moe_add ? be->norm_moe_add(be, p, h, nw, eps, kind, n, err) : FP4S_EUNSUPPORTED;
	if (rc != FP4S_EUNSUPPORTED)
		return rc;
	be->rmsnorm(be, h, nw, n, H, eps, kind, x);
	return moe_add(be, p, x, n, h, y, H, err);
}

/* Enqueues a whole forward step on the backend; no host synchronization inside, so a GPU
 * backend can capture it as a graph (MoE routing is the exception, see fwd_run). */
static int record_step(void *ctx, struct fp4s_error *err)
{
	const struct step *st = (const struct step *)ctx;
	struct fp4s_fwd *f = st->f;
	const struct fp4s_batch *b = st->b;
	const struct fp4s_config *c = f->cfg;
	struct fp4s_backend *be = f->be;
	const int64_t n = b->n, H = c->hidden, nh = c->n_heads, nkv = c->n_kv_heads, d = c->head_dim;
	const float eps = (float)c->rms_eps;
	float *h = f->h, *x = f->x, *q = f->q, *k = f->k, *v = f->v, *att = f->att, *g = f->g, *u = f->u, *y = f->y;
	int rc;
	if ((rc = be->embed(be, &f->embed, b, h, err)))
		return rc;
	/* one token through the backend's whole-step kernel where it took the model; else layer by
	 * layer */
	const int whole = n == 1 && f->step_ok;
	if (whole && (rc = be->step_layers(be, h, err)))
		return rc;
	for (int32_t l = 0; l < (whole ? 0 : c->n_layers); l++) {
		struct fp4s_fwd_layer *L = &f->layers[l];
		if (n == 1 && L->fused_qkv) {
			/* one token: q|k|v come out of one matmul, back to back (the norm fused in where the
			 * backend can) */
			if ((rc = norm_matmul(be, h, L->attn_norm, eps, f->norm_kind, H, &L->qkv, x, f->fused, err)))
				return rc;
			q = f->fused, k = f->fused + nh * d, v = f->fused + (nh + nkv) * d;
		} else {
			be->rmsnorm(be, h, L->attn_norm, n, H, eps, f->norm_kind, x);
			q = f->q, k = f->k, v = f->v;
			if ((rc = be->matmul(be, x, n, &L->q, q, err)) || (rc = be->matmul(be, x, n, &L->k, k, err)) ||
			    (rc = be->matmul(be, x, n, &L->v, v, err)))
				return rc;
		}
		struct fp4s_attn_params ap = {.n_heads = (int32_t)nh, .n_kv_heads = (int32_t)nkv,
		                              .head_dim = (int32_t)d, .window = L->window,
		                              .sinks = L->sinks, .scale = 1.0f / sqrtf((float)d)};
		if ((rc = rope_attention(be, f, L, l, q, k, v, b, &ap, eps, att, err)))
			return rc;
		/* (a hint: the o projection's add may leave h ready for the MLP's norm) */
		if (be->norm_next && n == 1 && !L->is_moe && L->gu_pairs)
			be->norm_next(be, h, L->ffn_norm, f->norm_kind);
		if (be->moe_next && n == 1 && L->is_moe)
			be->moe_next(be, h, L->ffn_norm, f->norm_kind, &L->moe);
		if ((rc = matmul_add(be, att, n, &L->o, h, y, H, err)))
			return rc;
		if (L->is_moe) {
			if ((rc = norm_moe_add(be, &L->moe, h, L->ffn_norm, eps, f->norm_kind, n, x, y, H, err)))
				return rc;
		} else if (L->gu_pairs) {
			/* gate|up rows alternate: the one-token matmul writes the SwiGLU, else one matmul
			 * and the pairwise SwiGLU (f->u holds [n, 2 * inter]) */
			const int64_t I = L->gate.rows;
			rc = n == 1 && be->norm_matmul_swiglu
			             ? be->norm_matmul_swiglu(be, h, L->ffn_norm, eps, f->norm_kind, 1, &L->gate_up, g, err)
			             : FP4S_EUNSUPPORTED;
			if (rc == FP4S_EUNSUPPORTED) {
				if (n == 1)
					rc = norm_matmul(be, h, L->ffn_norm, eps, f->norm_kind, H, &L->gate_up, x, u, err);
				else {
					be->rmsnorm(be, h, L->ffn_norm, n, H, eps, f->norm_kind, x);
					rc = be->matmul(be, x, n, &L->gate_up, u, err);
				}
				if (!rc)
					be->swiglu_pairs(be, u, n, I, g);
			}
			/* (a hint: the down projection's add may leave h ready for the next layer's norm) */
			if (!rc && be->norm_next && n == 1 && l + 1 < c->n_layers && f->layers[l + 1].fused_qkv)
				be->norm_next(be, h, f->layers[l + 1].attn_norm, f->norm_kind);
			if (rc || (rc = matmul_add(be, g, n, &L->down, h, y, H, err)))
				return rc;
		} else if (n == 1 && L->fused_gu &&
		           (rc = be->norm_matmul_swiglu ? be->norm_matmul_swiglu(be, h, L->ffn_norm, eps, f->norm_kind, 1,
		                                                                 &L->gate_up, g, err)
		                                        : FP4S_EUNSUPPORTED) != FP4S_EUNSUPPORTED) {
			/* the SwiGLU came out of the gate|up projection */
			if (rc || (rc = matmul_add(be, g, n, &L->down, h, y, H, err)))
				return rc;
		} else if (n == 1 && L->fused_gu) {
			if ((rc = norm_matmul(be, h, L->ffn_norm, eps, f->norm_kind, H, &L->gate_up, x, f->fused, err)))
				return rc;
			if ((rc = (be->swiglu_matmul_add ? be->swiglu_matmul_add(be, f->fused, 1, &L->down, h, err)
			                                         : FP4S_EUNSUPPORTED)) == FP4S_EUNSUPPORTED) {
				be->swiglu(be, f->fused, f->fused + L->gate.rows, 1, L->gate.rows, g);
				rc = matmul_add(be, g, n, &L->down, h, y, H, err);
			}
			if (rc)
				return rc;
		} else {
			be->rmsnorm(be, h, L->ffn_norm, n, H, eps, f->norm_kind, x);
			if ((rc = be->matmul(be, x, n, &L->gate, g, err)) ||
			    (rc = be->matmul(be, x, n, &L->up, u, err)))
				return rc;
			be->swiglu(be, g, u, n, L->gate.rows, g);
			if ((rc = matmul_add(be, g, n, &L->down, h, y, H, err)))
				return rc;
		}
	}
	if (st->n_out == 0)
		return FP4S_OK;
	if ((rc = be->gather_rows(be, h, st->out_rows, st->n_out, H, f->last, err)))
		return rc;
	be->rmsnorm(be, f->last, f->final_norm, st->n_out, H, eps, f->norm_kind, f->last);
	return be->matmul(be, f->last, st->n_out, &f->lm_head, f->logits, err);
}

/* Runs the step; logits (or, when tokens is given, their argmax) for the rows asked for. */
struct samp_req {
	const struct fp4s_samp_row *rows;
	const struct fp4s_samp_edit *edits;
	int32_t n_edits;
	struct fp4s_samp_result *lp;
};

/* perplexity: the rows' negative log-likelihoods of targets, computed where the logits are */
struct nll_req {
	const int32_t *targets;
	double *out;
};

/* A sampled launch on a synchronous backend: the logits to the host, each row drawn there as the
 * device would (fp4s_samp_sample_row) into tokens. */
static int sample_on_host(struct fp4s_fwd *f, int32_t n_out, const struct samp_req *sr, const int32_t *fed,
                          int32_t *tokens, struct fp4s_error *err)
{
	const int64_t V = f->cfg->vocab, need = (int64_t)n_out * V;
	if (!f->samp_scratch) {
		struct fp4s_sampling p;
		fp4s_samp_defaults(&p);
		if (!(f->samp_scratch = calloc(1, sizeof *f->samp_scratch)))
			return fp4s_error_set(err, FP4S_ENOMEM, "forward: out of memory");
		int rc = fp4s_samp_init(f->samp_scratch, &p, (int32_t)V, NULL, 0, NULL, 0, err);
		if (rc) {
			fp4s_samp_free(f->samp_scratch);
			free(f->samp_scratch);
			f->samp_scratch = NULL;
			return rc;
		}
	}
	if (need > f->host_logits_n) {
		float *p = realloc(f->host_logits, (size_t)need * sizeof *p);
		if (!p)
			return fp4s_error_set(err, FP4S_ENOMEM, "forward: out of memory");
		f->host_logits = p, f->host_logits_n = need;
	}
	int rc = f->be->read(f->be, f->host_logits, f->logits, need * (int64_t)sizeof(float), err);
	for (int32_t i = 0; !rc && i < n_out; i++) {
		const struct fp4s_samp_row *r = &sr->rows[i];
		if (r->logprobs || r->edit0 < 0 || r->n_edits < 0 || r->edit0 > sr->n_edits - r->n_edits ||
		    (r->prev_fed && !fed))
			return fp4s_error_set(err, FP4S_EINVAL, "forward: sampled launch row %d is malformed", i);
		for (int32_t e = 0; e < r->n_edits; e++) /* so that EINVAL below means only: nothing to draw */
			if (sr->edits[r->edit0 + e].token < 0 || sr->edits[r->edit0 + e].token >= V)
				return fp4s_error_set(err, FP4S_EINVAL, "forward: sampled launch row %d edits token %d", i,
				                      sr->edits[r->edit0 + e].token);
		struct fp4s_samp_result res;
		struct fp4s_error e2;
		const int src = fp4s_samp_sample_row(f->samp_scratch, r, sr->edits + r->edit0, r->prev_fed ? fed[i] : -1,
		                                     f->host_logits + (size_t)i * V, (int32_t)V, &res, &e2);
		if (src && src != FP4S_EINVAL)
			return fp4s_error_set(err, src, "%s", e2.msg);
		tokens[i] = src ? -1 : res.token; /* EINVAL: nothing left to draw from, as the device says -1 */
	}
	return rc;
}

/* 1 when this step is replayed as the graph of its batch size (key n): a decode step of n = 2..
 * FP4S_FWD_GRAPH_ROWS sequences, one token each, every row's logits in order. Such a step is the
 * same launch sequence for every n (the positions, slots and block table are read on the device;
 * the attention's split count and the MoE's groups depend on n alone). The first step of each n
 * runs uncaptured: the backend's buffers for n grow then, outside a capture, and a growth drops
 * the captured graphs (they hold the old addresses). FP4S_BATCH_GRAPH=0: never (A/B). */
static int fwd_batch_graph(struct fp4s_fwd *f, const struct fp4s_batch *b, const int32_t *out_rows, int32_t n_out)
{
	static int off = -1;
	if (off < 0) {
		const char *e = getenv("FP4S_BATCH_GRAPH");
		off = (e && atoi(e) == 0) || getenv("FP4S_NO_GRAPH");
	}
	if (off || b->n < 2 || b->n > FP4S_FWD_GRAPH_ROWS || n_out != b->n || (f->has_moe && !f->moe_on_device))
		return 0;
	for (int32_t i = 0; i < b->n; i++) {
		if (out_rows[i] != i)
			return 0;
		for (int32_t j = 0; j < i; j++)
			if (b->seq[i] == b->seq[j])
				return 0;
	}
	const uint64_t bit = 1ull << (b->n - 1);
	if (!(f->batch_seen & bit)) {
		f->batch_seen |= bit;
		return 0;
	}
	return 1;
}

/* launch: the argmax is launched (tokens: a synchronous backend's tokens go there) */
static int run(struct fp4s_fwd *f, const struct fp4s_batch *b, const int32_t *out_rows, int32_t n_out,
               float *logits, int32_t *tokens, const struct samp_req *sr, const struct nll_req *nr,
               int launch, struct fp4s_error *err)
{
	const struct fp4s_config *c = f->cfg;
	struct fp4s_backend *be = f->be;
	int64_t inter = c->intermediate;
	if (c->n_experts > 0 && c->moe_intermediate > inter)
		inter = c->moe_intermediate;
	int rc;
	if (b->n <= 0)
		return fp4s_error_set(err, FP4S_EINVAL, "forward: empty batch");
	for (int32_t i = 0; i < n_out; i++)
		if (out_rows[i] < 0 || out_rows[i] >= b->n)
			return fp4s_error_set(err, FP4S_EINVAL, "forward: logits row %d outside the batch", out_rows[i]);
	/* without a block table, each slot owns a fixed range of blocks */
	struct fp4s_batch bt = *b;
	const int32_t fed = f->fed_n;
	f->fed_n = 0; /* this step's work replaces what fed it */
	if (!b->tokens) {
		/* the last launch's tokens: in range when the lm_head has no more rows than the embedding */
		if (b->n > fed || c->vocab > f->embed.rows)
			return fp4s_error_set(err, FP4S_EINVAL, "forward: a batch of %d fed tokens after a step that "
			                      "found %d (vocabulary %lld, embedding rows %lld)", b->n, fed,
			                      (long long)c->vocab, (long long)f->embed.rows);
		if (!be->argmax_launch) {
			/* a sampled row without a token (-1) feeds token 0, as sample.cu does */
			const int32_t *h = f->held[(f->launched_at + f->n_launched + FP4S_FWD_AHEAD - 1) % FP4S_FWD_AHEAD];
			if (!f->feed_tmp && !(f->feed_tmp = malloc(FP4S_FWD_LAUNCH_ROWS * sizeof *f->feed_tmp)))
				return fp4s_error_set(err, FP4S_ENOMEM, "forward: out of memory");
			for (int32_t i = 0; i < b->n; i++)
				f->feed_tmp[i] = h[i] < 0 ? 0 : h[i];
			bt.tokens = f->feed_tmp;
		}
	} else {
		for (int32_t i = 0; i < b->n; i++)
			if (b->tokens[i] < 0 || b->tokens[i] >= f->embed.rows)
				return fp4s_error_set(err, FP4S_EINVAL, "token id %d outside the vocabulary [0, %lld)",
				                      b->tokens[i], (long long)f->embed.rows);
	}
	if (!bt.block_table) {
		if (f->n_blocks < f->max_seqs * f->table_stride)
			return fp4s_error_set(err, FP4S_EINVAL, "forward: a pooled KV cache needs the batch's block table");
		bt.block_table = f->ident_table;
		bt.table_stride = f->table_stride;
	}
	b = &bt;
	if ((rc = scratch_reserve(f, b->n, n_out, inter, err)) || (rc = be->begin(be, b, err)))
		return rc;
	struct step st = {f, b, out_rows, n_out};
	/* A one-token step with one logits row is the same launch sequence every time: replay it as a
	 * graph. MoE layers read the router's choice on the host, which a graph cannot do yet. */
	const int graph = b->n == 1 && n_out == 1 && (!f->has_moe || f->moe_on_device) && !getenv("FP4S_NO_GRAPH");
	const int bgraph = !graph && fwd_batch_graph(f, b, out_rows, n_out);
	if (graph && launch && !nr) {
		/* the token's argmax or draw inside the step's graph, where the backend takes it */
		rc = FP4S_EUNSUPPORTED;
		if (!sr && be->graph_run_argmax && be->argmax_launch)
			rc = be->graph_run_argmax(be, 1, record_step, &st, f->logits, n_out, c->vocab, err);
		else if (sr && be->graph_run_sample && be->sample_launch)
			rc = be->graph_run_sample(be, 1, record_step, &st, f->logits, n_out, c->vocab, sr->rows, sr->edits,
			                          sr->n_edits, err);
		if (rc != FP4S_EUNSUPPORTED) {
			if (!rc)
				f->fed_n = n_out;
			return rc;
		}
	}
	rc = graph || bgraph ? be->graph_run(be, graph ? 1 : b->n, record_step, &st, err) : record_step(&st, err);
	if (rc || n_out == 0)
		return rc;
	if (nr)
		return be->token_nll(be, f->logits, n_out, c->vocab, nr->targets, nr->out, err);
	if (launch && sr) {
		rc = be->sample_launch ? be->sample_launch(be, f->logits, n_out, c->vocab, sr->rows, sr->edits, sr->n_edits, err)
		                       : sample_on_host(f, n_out, sr, b->tokens == f->feed_tmp ? f->feed_tmp : NULL, tokens, err);
		if (!rc)
			f->fed_n = n_out;
		return rc;
	}
	if (tokens && sr)
		return be->sample(be, f->logits, n_out, c->vocab, sr->rows, sr->edits, sr->n_edits, tokens, sr->lp, err);
	if (launch && be->argmax_launch)
		rc = be->argmax_launch(be, f->logits, n_out, c->vocab, err);
	else if (tokens)
		rc = be->argmax(be, f->logits, n_out, c->vocab, tokens, err);
	if (!rc && launch)
		f->fed_n = n_out;
	if (tokens || launch)
		return rc;
	return be->read(be, logits, f->logits, (int64_t)n_out * c->vocab * (int64_t)sizeof(float), err);
}

int fp4s_fwd_run(struct fp4s_fwd *f, const struct fp4s_batch *b, const int32_t *out_rows,
                 int32_t n_out, float *logits, struct fp4s_error *err)
{
	return run(f, b, out_rows, n_out, logits, NULL, NULL, NULL, 0, err);
}

int fp4s_fwd_run_argmax(struct fp4s_fwd *f, const struct fp4s_batch *b, const int32_t *out_rows,
                        int32_t n_out, int32_t *tokens, struct fp4s_error *err)
{
	return run(f, b, out_rows, n_out, NULL, tokens, NULL, NULL, 0, err);
}

int fp4s_fwd_async(const struct fp4s_fwd *f) { return f->be->argmax_launch != NULL && f->be->argmax_wait != NULL; }

/* fp4s_fwd_launch_argmax and fp4s_fwd_launch_sample (sr): the step enqueued in the next slot; a
 * synchronous backend's tokens are held there */
static int launch(struct fp4s_fwd *f, const struct fp4s_batch *b, const int32_t *out_rows, int32_t n_out,
                  const struct samp_req *sr, struct fp4s_error *err)
{
	if (f->n_launched >= FP4S_FWD_AHEAD)
		return fp4s_error_set(err, FP4S_EINVAL, "forward: %d launches not collected", f->n_launched);
	if (n_out <= 0 || n_out > FP4S_FWD_LAUNCH_ROWS)
		return fp4s_error_set(err, FP4S_EINVAL, "forward: %s launch of %d rows (1 to %d)",
		                      sr ? "a sampled" : "an argmax", n_out, FP4S_FWD_LAUNCH_ROWS);
	const int slot = (f->launched_at + f->n_launched) % FP4S_FWD_AHEAD;
	int32_t *held = NULL;
	if (!fp4s_fwd_async(f)) {
		if (!f->held[slot] && !(f->held[slot] = malloc(FP4S_FWD_LAUNCH_ROWS * sizeof(int32_t))))
			return fp4s_error_set(err, FP4S_ENOMEM, "forward: out of memory");
		held = f->held[slot];
	}
	const int rc = run(f, b, out_rows, n_out, NULL, held, sr, NULL, 1, err);
	if (rc)
		return rc;
	f->launch_n[slot] = n_out;
	f->n_launched++;
	return FP4S_OK;
}

int fp4s_fwd_launch_argmax(struct fp4s_fwd *f, const struct fp4s_batch *b, const int32_t *out_rows,
                           int32_t n_out, struct fp4s_error *err)
{
	return launch(f, b, out_rows, n_out, NULL, err);
}

int fp4s_fwd_collect(struct fp4s_fwd *f, int32_t *tokens, struct fp4s_error *err)
{
	if (f->n_launched == 0)
		return fp4s_error_set(err, FP4S_EINVAL, "forward: nothing launched to collect");
	const int slot = f->launched_at;
	const int32_t n = f->launch_n[slot];
	f->launched_at = (f->launched_at + 1) % FP4S_FWD_AHEAD;
	f->n_launched--;
	if (!fp4s_fwd_async(f)) {
		memcpy(tokens, f->held[slot], (size_t)n * sizeof(int32_t));
		return FP4S_OK;
	}
	return f->be->argmax_wait(f->be, tokens, n, err);
}

/* FP4S_DEVICE_SAMPLE=0: sampling and scoring on the host (A/B) */
static int device_sampling_off(void)
{
	const char *e = getenv("FP4S_DEVICE_SAMPLE");
	return e && !strcmp(e, "0");
}

int fp4s_fwd_can_launch_sample(const struct fp4s_fwd *f)
{
	return !fp4s_fwd_async(f) || (f->be->sample_launch != NULL && !device_sampling_off());
}

int fp4s_fwd_launch_sample(struct fp4s_fwd *f, const struct fp4s_batch *b, const int32_t *out_rows, int32_t n_out,
                           const struct fp4s_samp_row *rows, const struct fp4s_samp_edit *edits, int32_t n_edits,
                           struct fp4s_error *err)
{
	if (!fp4s_fwd_can_launch_sample(f))
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "forward: the backend does not launch sampling");
	for (int32_t i = 0; i < n_out && i < FP4S_FWD_LAUNCH_ROWS; i++) {
		if (rows[i].logprobs)
			return fp4s_error_set(err, FP4S_EINVAL, "forward: a sampled launch's row %d asks for logprobs", i);
		/* the fed token of row i is the one its out row i reads (sample.cu: feed[i]) */
		if (rows[i].prev_fed && (b->tokens || out_rows[i] != i))
			return fp4s_error_set(err, FP4S_EINVAL, "forward: sampled launch row %d counts a fed token, but "
			                      "the batch's row %d is not fed", i, out_rows[i]);
	}
	const struct samp_req sr = {rows, edits, n_edits, NULL};
	return launch(f, b, out_rows, n_out, &sr, err);
}

int fp4s_fwd_can_sample(const struct fp4s_fwd *f)
{
	return f->be->sample != NULL && !device_sampling_off();
}

int fp4s_fwd_run_sample(struct fp4s_fwd *f, const struct fp4s_batch *b, const int32_t *out_rows, int32_t n_out,
                        const struct fp4s_samp_row *rows, const struct fp4s_samp_edit *edits, int32_t n_edits,
                        int32_t *tokens, struct fp4s_samp_result *lp, struct fp4s_error *err)
{
	if (!f->be->sample)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "forward: the backend does not sample");
	const struct samp_req sr = {rows, edits, n_edits, lp};
	return run(f, b, out_rows, n_out, NULL, tokens, &sr, NULL, 0, err);
}

int fp4s_fwd_can_nll(const struct fp4s_fwd *f)
{
	return f->be->token_nll != NULL && !device_sampling_off();
}

int fp4s_fwd_run_nll(struct fp4s_fwd *f, const struct fp4s_batch *b, const int32_t *out_rows, int32_t n_out,
                     const int32_t *targets, double *nll, struct fp4s_error *err)
{
	if (!f->be->token_nll)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "forward: the backend does not score tokens");
	const struct nll_req nr = {targets, nll};
	return run(f, b, out_rows, n_out, NULL, NULL, NULL, &nr, 0, err);
}
