/* cpu_backend.c: the CPU implementation of backend.h. Host memory, FP32 activations, a KV cache
 * that is a pool of blocks [layer][block][FP4S_KV_BLOCK][kv_width] addressed through the batch's
 * block table (FP32, BF16-rounded FP32, or E4M3 bytes), attention computed exactly (two passes:
 * scores, then a max-subtracted softmax in FP32), MoE by looping over each token's selected
 * experts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "numerics/numerics.h"

struct cpu_impl {
	float *k, *v;      /* FP32 and BF16 caches */
	uint8_t *k8, *v8;  /* FP8 cache: the E4M3 bytes themselves, as the GPU keeps them */
	float e4m3[256];   /* their values (0x7F/0xFF: NaN) */
	int32_t n_layers, kv_width, n_blocks, max_seqs, max_ctx;
	enum fp4s_kv_dtype kv_dtype; /* BF16 is emulated: FP32 storage of BF16-rounded values */
};

static struct cpu_impl *impl_of(struct fp4s_backend *be) { return (struct cpu_impl *)be->impl; }

static int cpu_kv_init(struct fp4s_backend *be, int32_t n_layers, int32_t kv_width, int32_t n_blocks,
                       int32_t max_seqs, int32_t max_ctx, enum fp4s_kv_dtype dtype,
                       struct fp4s_error *err)
{
	struct cpu_impl *c = impl_of(be);
	c->kv_dtype = dtype;
	free(c->k), free(c->v), free(c->k8), free(c->v8);
	c->k = c->v = NULL;
	c->k8 = c->v8 = NULL;
	if (n_layers <= 0 || kv_width <= 0 || n_blocks <= 0 || max_seqs <= 0 || max_ctx <= 0)
		return fp4s_error_set(err, FP4S_EINVAL, "kv cache: bad geometry %d layers x %d blocks x %d",
		                      n_layers, n_blocks, kv_width);
	const size_t n = (size_t)n_layers * (size_t)n_blocks * FP4S_KV_BLOCK * (size_t)kv_width;
	const int fp8 = dtype == FP4S_KV_FP8;
	if (fp8) {
		c->k8 = calloc(n, 1);
		c->v8 = calloc(n, 1);
		for (int b = 0; b < 256; b++)
			c->e4m3[b] = fp4s_e4m3_to_f32((uint32_t)b);
	} else {
		c->k = calloc(n, sizeof(float));
		c->v = calloc(n, sizeof(float));
	}
	if (fp8 ? !c->k8 || !c->v8 : !c->k || !c->v)
		return fp4s_error_set(err, FP4S_ENOMEM, "kv cache: cannot allocate 2 x %.1f MB (lower the "
		                      "context length or the number of sequences)",
		                      (double)n * (fp8 ? 1 : 4) / 1e6);
	c->n_layers = n_layers, c->kv_width = kv_width, c->n_blocks = n_blocks;
	c->max_seqs = max_seqs, c->max_ctx = max_ctx;
	return FP4S_OK;
}

/* Row of the pool that holds slot seq's position pos (the caller checked both). */
static size_t kv_row(const struct cpu_impl *c, const struct fp4s_batch *b, int32_t layer, int32_t seq,
                     int32_t pos)
{
	const int32_t blk = b->block_table[(size_t)seq * b->table_stride + pos / FP4S_KV_BLOCK];
	return ((size_t)layer * c->n_blocks + (size_t)blk) * FP4S_KV_BLOCK + (size_t)(pos % FP4S_KV_BLOCK);
}

static void cpu_kv_clear(struct fp4s_backend *be, int32_t seq) { (void)be, (void)seq; }

/* Elements [off, off + d) of the K (v = 0) or V cache as floats: a pointer into the FP32
 * storage, or the E4M3 bytes decoded into tmp[d]. */
static const float *kv_elems(const struct cpu_impl *c, int v, size_t off, int32_t d, float *tmp)
{
	if (c->kv_dtype != FP4S_KV_FP8)
		return (v ? c->v : c->k) + off;
	const uint8_t *b = (v ? c->v8 : c->k8) + off;
	for (int32_t j = 0; j < d; j++)
		tmp[j] = c->e4m3[b[j]];
	return tmp;
}

static int cpu_alloc(struct fp4s_backend *be, void **p, int64_t bytes, struct fp4s_error *err)
{
	*p = bytes > 0 ? malloc((size_t)bytes) : NULL;
	if (bytes > 0 && !*p)
		return fp4s_error_set(err, FP4S_ENOMEM, "cannot allocate %lld bytes", (long long)bytes);
	return FP4S_OK;
}

static void cpu_free(struct fp4s_backend *be, void *p) { free(p); }

static void cpu_destroy(struct fp4s_backend *be)
{
	if (!be)
		return;
	struct cpu_impl *c = impl_of(be);
	if (c) {
		free(c->k), free(c->v), free(c->k8), free(c->v8);
		free(c);
	}
	free(be);
}

static int cpu_upload_mat(struct fp4s_backend *be, struct fp4s_mat *m, struct fp4s_error *err)
{
	return FP4S_OK;
}

static int cpu_upload_f32(struct fp4s_backend *be, float **p, int64_t n, struct fp4s_error *err)
{
	return FP4S_OK;
}

static int cpu_upload_fused(struct fp4s_backend *be, struct fp4s_mat **parts, int n,
                            struct fp4s_mat *fused, struct fp4s_error *err)
{
	return FP4S_EUNSUPPORTED;
}

static int cpu_upload_moe(struct fp4s_backend *be, struct fp4s_moe_params *p, struct fp4s_error *err)
{
	return FP4S_EUNSUPPORTED;
}

static int cpu_begin(struct fp4s_backend *be, const struct fp4s_batch *b, struct fp4s_error *err)
{
	return FP4S_OK;
}

static int cpu_read(struct fp4s_backend *be, void *host, const void *src, int64_t bytes,
                    struct fp4s_error *err)
{
	memcpy(host, src, (size_t)bytes);
	return FP4S_OK;
}

static int cpu_graph_run(struct fp4s_backend *be, int key,
                         int (*record)(void *ctx, struct fp4s_error *err), void *ctx,
                         struct fp4s_error *err)
{
	return record(ctx, err);
}

static void cpu_graph_reset(struct fp4s_backend *be) {}

static int cpu_argmax(struct fp4s_backend *be, const float *logits, int32_t n, int64_t vocab,
                      int32_t *out, struct fp4s_error *err)
{
	for (int32_t i = 0; i < n; i++) {
		const float *l = logits + (int64_t)i * vocab;
		int64_t best = 0;
		for (int64_t v = 1; v < vocab; v++)
			if (l[v] > l[best])
				best = v;
		out[i] = (int32_t)best;
	}
	return FP4S_OK;
}

static int cpu_gather_rows(struct fp4s_backend *be, const float *src, const int32_t *rows, int32_t n,
                           int64_t width, float *dst, struct fp4s_error *err)
{
	for (int32_t i = 0; i < n; i++)
		memcpy(dst + (int64_t)i * width, src + (int64_t)rows[i] * width, (size_t)width * sizeof *dst);
	return FP4S_OK;
}

static int cpu_embed(struct fp4s_backend *be, const struct fp4s_mat *emb, const struct fp4s_batch *b,
                     float *out, struct fp4s_error *err)
{
	for (int32_t i = 0; i < b->n; i++) {
		if (b->tokens[i] < 0 || b->tokens[i] >= emb->rows)
			return fp4s_error_set(err, FP4S_EINVAL, "token id %d outside the vocabulary [0, %lld)",
			                      b->tokens[i], (long long)emb->rows);
		fp4s_cpu_mat_row(emb, b->tokens[i], out + (int64_t)i * emb->cols);
	}
	return FP4S_OK;
}

static int cpu_matmul(struct fp4s_backend *be, const float *x, int64_t n, const struct fp4s_mat *w,
                      float *y, struct fp4s_error *err)
{
	return fp4s_cpu_matmul(x, n, w, y, err);
}

static void cpu_rmsnorm(struct fp4s_backend *be, const float *x, const float *w, int64_t rows,
                        int64_t width, float eps, enum fp4s_norm_kind kind, float *y)
{
	fp4s_cpu_rmsnorm(x, w, rows, width, eps, kind, y);
}

static void cpu_add(struct fp4s_backend *be, float *x, const float *y, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		x[i] += y[i];
}

static void cpu_rope(struct fp4s_backend *be, float *q, float *k, const struct fp4s_batch *b,
                     int32_t nh, int32_t nkv, int32_t head_dim, int32_t rot_dim,
                     const float *inv_freq, float mscale)
{
	for (int32_t i = 0; i < b->n; i++) {
		fp4s_cpu_rope(q + (int64_t)i * nh * head_dim, nh, head_dim, rot_dim, inv_freq, mscale, b->pos[i]);
		fp4s_cpu_rope(k + (int64_t)i * nkv * head_dim, nkv, head_dim, rot_dim, inv_freq, mscale, b->pos[i]);
	}
}

static int cpu_attention(struct fp4s_backend *be, int32_t layer, const float *q, const float *k,
                         const float *v, const struct fp4s_batch *b, const struct fp4s_attn_params *p,
                         float *out, struct fp4s_error *err)
{
	struct cpu_impl *c = impl_of(be);
	const int32_t kvw = p->n_kv_heads * p->head_dim, d = p->head_dim;
	const int32_t group = p->n_heads / p->n_kv_heads;
	if (!(c->k || c->k8) || kvw != c->kv_width || layer < 0 || layer >= c->n_layers)
		return fp4s_error_set(err, FP4S_EINVAL, "attention: KV cache not set up for layer %d", layer);
	for (int32_t i = 0; i < b->n; i++) {
		if (b->seq[i] < 0 || b->seq[i] >= c->max_seqs)
			return fp4s_error_set(err, FP4S_EINVAL, "sequence slot %d outside [0, %d)", b->seq[i],
			                      c->max_seqs);
		if (b->pos[i] < 0 || b->pos[i] >= c->max_ctx)
			return fp4s_error_set(err, FP4S_EINVAL, "position %d is past the context length %d",
			                      b->pos[i], c->max_ctx);
		for (int32_t t = 0; t <= b->pos[i]; t += FP4S_KV_BLOCK) {
			const int32_t blk = b->block_table[(size_t)b->seq[i] * b->table_stride + t / FP4S_KV_BLOCK];
			if (blk < 0 || blk >= c->n_blocks)
				return fp4s_error_set(err, FP4S_EINVAL, "slot %d position %d: block %d outside the "
				                      "pool of %d", b->seq[i], t, blk, c->n_blocks);
		}
		const size_t base = kv_row(c, b, layer, b->seq[i], b->pos[i]) * kvw;
		const float *ki = k + (int64_t)i * kvw, *vi = v + (int64_t)i * kvw;
		if (c->kv_dtype == FP4S_KV_FP8) {
			for (int32_t j = 0; j < kvw; j++) {
				c->k8[base + j] = fp4s_f32_to_e4m3(ki[j]);
				c->v8[base + j] = fp4s_f32_to_e4m3(vi[j]);
			}
			continue;
		}
		memcpy(c->k + base, ki, (size_t)kvw * sizeof(float));
		memcpy(c->v + base, vi, (size_t)kvw * sizeof(float));
		if (c->kv_dtype == FP4S_KV_BF16)
			for (int32_t j = 0; j < kvw; j++) {
				c->k[base + j] = fp4s_bf16_to_f32(fp4s_f32_to_bf16(c->k[base + j]));
				c->v[base + j] = fp4s_bf16_to_f32(fp4s_f32_to_bf16(c->v[base + j]));
			}
	}
	int failed = 0;
	double work = 0;
	for (int32_t i = 0; i < b->n; i++)
		work += (double)(b->pos[i] + 1) * p->n_heads * p->head_dim;
#pragma omp parallel if (work > 1e6)
	{
		/* scores, then one decoded K or V row (FP8) */
		float *s = malloc(((size_t)c->max_ctx + (size_t)d) * sizeof *s);
		if (!s)
			failed = 1;
#pragma omp for collapse(2) schedule(dynamic, 4)
		for (int32_t i = 0; i < b->n; i++) {
			for (int32_t h = 0; h < p->n_heads; h++) {
				if (!s)
					continue;
				const int32_t pos = b->pos[i], g = h / group;
				const int32_t start = p->window > 0 && pos - p->window + 1 > 0 ? pos - p->window + 1 : 0;
				const float *qh = q + (int64_t)i * p->n_heads * d + (int64_t)h * d;
				float m = p->sinks ? p->sinks[h] : -INFINITY;
				for (int32_t t = start; t <= pos; t++) {
					const float *kt = kv_elems(c, 0, kv_row(c, b, layer, b->seq[i], t) * kvw + (size_t)g * d, d,
					                           s + c->max_ctx);
					float acc = 0;
					for (int32_t j = 0; j < d; j++)
						acc += qh[j] * kt[j];
					s[t] = acc * p->scale;
					m = fmaxf(m, s[t]);
				}
				/* the sink joins the denominator as a key with a zero value vector */
				float denom = p->sinks ? expf(p->sinks[h] - m) : 0.0f;
				for (int32_t t = start; t <= pos; t++) {
					s[t] = expf(s[t] - m);
					denom += s[t];
				}
				float *o = out + (int64_t)i * p->n_heads * d + (int64_t)h * d;
				for (int32_t j = 0; j < d; j++)
					o[j] = 0;
				for (int32_t t = start; t <= pos; t++) {
					const float w = s[t] / denom;
					const float *vt = kv_elems(c, 1, kv_row(c, b, layer, b->seq[i], t) * kvw + (size_t)g * d, d,
					                           s + c->max_ctx);
					for (int32_t j = 0; j < d; j++)
						o[j] += w * vt[j];
				}
			}
		}
		free(s);
	}
	if (failed)
		return fp4s_error_set(err, FP4S_ENOMEM, "attention: out of memory");
	return FP4S_OK;
}

static void cpu_swiglu(struct fp4s_backend *be, const float *gate, const float *up, int64_t n,
                       int64_t inter, float *out)
{
	fp4s_cpu_swiglu(gate, up, n * inter, out);
}

/* (the CPU never uploads a pairs matrix; the op is here for callers that build one) */
static void cpu_swiglu_pairs(struct fp4s_backend *be, const float *gu, int64_t n, int64_t inter, float *out)
{
	(void)be;
	for (int64_t t = 0; t < n; t++)
		for (int64_t i = 0; i < inter; i++)
			fp4s_cpu_swiglu(gu + t * 2 * inter + 2 * i, gu + t * 2 * inter + 2 * i + 1, 1, out + t * inter + i);
}

static int cpu_moe(struct fp4s_backend *be, const struct fp4s_moe_params *p, const float *x,
                   int64_t n, float *y, struct fp4s_error *err)
{
	const int32_t E = p->n_experts, K = p->top_k;
	const int64_t H = p->hidden, I = p->inter;
	if (K <= 0 || K > E || E > 4096)
		return fp4s_error_set(err, FP4S_EINVAL, "moe: top-k %d of %d experts", K, E);
	float *logits = malloc((size_t)(n * E) * sizeof *logits);
	float *h1 = malloc((size_t)(2 * I) * sizeof *h1), *h2 = malloc((size_t)(2 * I) * sizeof *h2);
	float *a = malloc((size_t)I * sizeof *a), *o = malloc((size_t)H * sizeof *o);
	float *prob = malloc((size_t)E * sizeof *prob);
	int32_t idx[64];
	int rc = FP4S_OK;
	if (!logits || !h1 || !h2 || !a || !o || !prob || K > 64) {
		rc = fp4s_error_set(err, FP4S_ENOMEM, "moe: out of memory");
		goto done;
	}
	if ((rc = fp4s_cpu_matmul(x, n, &p->router, logits, err)))
		goto done;
	for (int64_t t = 0; t < n; t++) {
		const float *l = logits + t * E;
		float w[64];
		fp4s_cpu_moe_route(l, E, K, p->router_kind == FP4S_ROUTER_SOFTMAX_TOPK, p->norm_topk, prob, idx, w);
		float *yt = y + t * H;
		memset(yt, 0, (size_t)H * sizeof *yt);
		for (int32_t j = 0; j < K; j++) {
			const struct fp4s_expert *ex = &p->experts[idx[j]];
			if (p->oai_swiglu) {
				if ((rc = fp4s_cpu_matmul(x + t * H, 1, &ex->gate_up, h1, err)))
					goto done;
				fp4s_cpu_swiglu_oai(h1, I, p->swiglu_alpha, p->swiglu_limit, a);
			} else {
				if ((rc = fp4s_cpu_matmul(x + t * H, 1, &ex->gate, h1, err)) ||
				    (rc = fp4s_cpu_matmul(x + t * H, 1, &ex->up, h2, err)))
					goto done;
				fp4s_cpu_swiglu(h1, h2, I, a);
			}
			if ((rc = fp4s_cpu_matmul(a, 1, &ex->down, o, err)))
				goto done;
			for (int64_t i = 0; i < H; i++)
				yt[i] += w[j] * o[i];
		}
	}
done:
	free(logits), free(h1), free(h2), free(a), free(o), free(prob);
	return rc;
}

int fp4s_backend_cpu_create(struct fp4s_backend **out, struct fp4s_error *err)
{
	struct fp4s_backend *be = calloc(1, sizeof *be);
	struct cpu_impl *c = calloc(1, sizeof *c);
	if (!be || !c) {
		free(be);
		free(c);
		return fp4s_error_set(err, FP4S_ENOMEM, "cpu backend: out of memory");
	}
	be->name = "cpu";
	be->impl = c;
	be->kv_init = cpu_kv_init;
	be->kv_clear = cpu_kv_clear;
	be->alloc = cpu_alloc;
	be->free = cpu_free;
	be->destroy = cpu_destroy;
	be->upload_mat = cpu_upload_mat;
	be->upload_f32 = cpu_upload_f32;
	be->upload_fused = cpu_upload_fused;
	be->upload_moe = cpu_upload_moe;
	be->begin = cpu_begin;
	be->read = cpu_read;
	be->gather_rows = cpu_gather_rows;
	be->graph_run = cpu_graph_run;
	be->graph_reset = cpu_graph_reset;
	be->argmax = cpu_argmax;
	be->embed = cpu_embed;
	be->matmul = cpu_matmul;
	be->rmsnorm = cpu_rmsnorm;
	be->add = cpu_add;
	be->rope = cpu_rope;
	be->attention = cpu_attention;
	be->swiglu = cpu_swiglu;
	be->swiglu_pairs = cpu_swiglu_pairs;
	be->moe = cpu_moe;
	*out = be;
	return FP4S_OK;
}
