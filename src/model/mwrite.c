/* mwrite.c: the streaming, parallel checkpoint writer behind `gen` and `quantize` (mwrite.h). */
#include "model/mwrite.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "numerics/numerics.h"
#include "numerics/quant.h"
#include "util/progress.h"

int fp4s_qformat_parse(const char *s, enum fp4s_qformat *f)
{
	static const char *const n[] = {"bf16", "nvfp4", "nvfp4-ct", "mxfp4"};
	for (int i = 0; i < 4; i++)
		if (!strcmp(s, n[i])) {
			*f = (enum fp4s_qformat)i;
			return 0;
		}
	return -1;
}

const char *fp4s_qformat_name(enum fp4s_qformat f)
{
	static const char *const n[] = {"bf16", "nvfp4", "nvfp4-ct", "mxfp4"};
	return (unsigned)f < 4 ? n[f] : "?";
}

/* ---- the generator ---- */

static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

uint64_t fp4s_gen_key(uint64_t seed, const char *name)
{
	uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a over the name, then mixed with the seed */
	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 0x100000001B3ull;
	return mix64(h ^ mix64(seed + 0x9E3779B97F4A7C15ull));
}

/* z = s / GEN_SIGMA with s = (sum of the four bytes of a 32-bit hash) - 510: Irwin-Hall(4) over
 * 0..255, standard deviation sqrt(4 (256^2 - 1) / 12) = 147.8, |z| <= 3.45. A 32-bit hash per
 * element (murmur3's finalizer over the counter) keeps the loop vectorizable; every tensor has
 * fewer than 2^32 elements. */
#define GEN_SIGMA 147.8005f
#define GEN_SMAX 510

static inline uint32_t gen_hash(uint32_t key, uint32_t idx)
{
	uint32_t x = key ^ (idx * 0x9E3779B9u);
	x ^= x >> 16;
	x *= 0x85EBCA6Bu;
	x ^= x >> 13;
	x *= 0xC2B2AE35u;
	return x ^ (x >> 16);
}

static inline int32_t gen_lanes(uint32_t key, uint32_t idx)
{
	uint32_t h = gen_hash(key, idx);
	return (int32_t)((h & 0xFF) + (h >> 8 & 0xFF) + (h >> 16 & 0xFF) + (h >> 24)) - GEN_SMAX;
}

/* One multiply by a positive constant (std / GEN_SIGMA, computed once per tensor) and one add
 * keep v monotone in s, and BF16 rounding (RNE; v is always finite) is monotone too, so element 0,
 * forced to s = +GEN_SMAX, holds the tensor's amax. */
static inline float gen_scaled(int32_t s, float mean, float scale)
{
	float v = mean + (float)s * scale;
	uint32_t u;
	memcpy(&u, &v, sizeof u);
	u = ((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) << 16;
	memcpy(&v, &u, sizeof v);
	return v;
}

float fp4s_gen_value(uint64_t key, uint64_t idx, float mean, float std)
{
	int32_t s = idx == 0 ? GEN_SMAX : gen_lanes((uint32_t)key, (uint32_t)idx);
	return gen_scaled(s, mean, std / GEN_SIGMA);
}

static void role_dist(enum fp4s_role r, float *mean, float *std)
{
	*mean = 0.0f;
	*std = 0.02f;
	if (r == FP4S_ROLE_NORM)
		*mean = 1.0f; /* RMSNorm weights near 1 */
}

/* ---- planning ---- */

static int quantized_role(enum fp4s_role r)
{
	/* Default exclusions: lm_head and routers stay high precision; embeddings, norms and
	 * biases are not Linear layers at all. */
	return r != FP4S_ROLE_LM_HEAD && r != FP4S_ROLE_ROUTER && r != FP4S_ROLE_SHARED_EXPERT_GATE &&
	       r != FP4S_ROLE_MTP; /* ModelOpt defaults; mtp.fc ships BF16 (architectures.md §6.7) */
}

static int check_format(const struct fp4s_config *c, enum fp4s_qformat f, struct fp4s_error *err)
{
	if (f == FP4S_QF_MXFP4 && c->arch != FP4S_ARCH_GPT_OSS)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED,
		                      "--format mxfp4 applies to gpt_oss experts (the published layout); "
		                      "use nvfp4 or nvfp4-ct for %s",
		                      fp4s_arch_name(c->arch));
	if ((f == FP4S_QF_NVFP4 || f == FP4S_QF_NVFP4_CT) && c->arch == FP4S_ARCH_GPT_OSS)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED,
		                      "--format %s is not supported for gpt_oss: its experts are "
		                      "published as mxfp4",
		                      fp4s_qformat_name(f));
	return FP4S_OK;
}

static enum fp4s_wformat planned_fmt(const struct fp4s_tspec *s, enum fp4s_qformat f)
{
	if (s->cls == FP4S_TC_LINEAR && (f == FP4S_QF_NVFP4 || f == FP4S_QF_NVFP4_CT) &&
	    quantized_role(s->role))
		return FP4S_WF_NVFP4;
	if (s->cls == FP4S_TC_PACKED_EXPERTS && f == FP4S_QF_MXFP4)
		return FP4S_WF_MXFP4;
	return FP4S_WF_BF16;
}

int fp4s_plan(const struct fp4s_config *c, enum fp4s_qformat f, struct fp4s_tspec **specs,
              struct fp4s_weight **w, int32_t *n, struct fp4s_error *err)
{
	int rc = check_format(c, f, err);
	if (rc)
		return rc;
	rc = fp4s_tensors_expand(c, specs, n, err);
	if (rc)
		return rc;
	*w = calloc((size_t)(*n ? *n : 1), sizeof **w);
	if (!*w) {
		free(*specs);
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	}
	for (int32_t i = 0; i < *n; i++) {
		(*w)[i].spec = &(*specs)[i];
		(*w)[i].fmt = planned_fmt(&(*specs)[i], f);
		(*w)[i].present = 1;
		(*w)[i].transposed = (*specs)[i].cls == FP4S_TC_PACKED_EXPERTS && (*w)[i].fmt != FP4S_WF_MXFP4;
	}
	return FP4S_OK;
}

/* ---- the pipeline ---- */

enum item_kind { K_PLAIN, K_COPY, K_NVFP4, K_MXFP4 };

struct item {
	const struct fp4s_tspec *spec;
	const struct fp4s_weight *in; /* quantize: the input weight; gen: NULL */
	enum item_kind kind;
	int32_t o_main, o_scale, o_scalar;
	enum fp4s_dtype out_dt;
	int32_t transposed;   /* packed experts stored [E, in, out] (plain output or input) */
	uint64_t key;
	float mean, std;
	int64_t rows, cols;   /* logical [rows, cols]; K_COPY: bytes in cols, rows = 1 */
	float amax, ws2;
};

struct job {
	int32_t item;
	int64_t r0, r1;
};

struct pipe {
	const struct fp4s_config *cfg;
	enum fp4s_qformat fmt;
	struct item *it;
	int32_t n;
	struct fp4s_st_writer w;
};

/* Element i of an input tensor. memcpy loads: safetensors offsets need not be aligned. */
static float in_value(const struct fp4s_weight *w, uint64_t i)
{
	const uint8_t *p = w->data;
	uint16_t h;
	float f;
	switch (w->fmt) {
	case FP4S_WF_BF16: memcpy(&h, p + 2 * i, 2); return fp4s_bf16_to_f32(h);
	case FP4S_WF_F16: memcpy(&h, p + 2 * i, 2); return fp4s_f16_to_f32(h);
	default: memcpy(&f, p + 4 * i, 4); return f;
	}
}

/* Logical rows [r0, r0+nr) of an item as floats. */
static void fill_rows(const struct item *it, int64_t r0, int64_t nr, float *x)
{
	const int64_t K = it->cols;
	if (!it->in) {
		const float scale = it->std / GEN_SIGMA, mean = it->mean;
		const uint32_t base = (uint32_t)(r0 * K), key = (uint32_t)it->key;
		const int64_t n = nr * K;
		for (int64_t i = 0; i < n; i++)
			x[i] = gen_scaled(gen_lanes(key, base + (uint32_t)i), mean, scale);
		if (r0 == 0)
			x[0] = gen_scaled(GEN_SMAX, mean, scale);
		return;
	}
	if (!it->in->transposed) {
		for (int64_t i = 0; i < nr * K; i++)
			x[i] = in_value(it->in, (uint64_t)(r0 * K + i));
		return;
	}
	/* Input stored [E, in=K, out]; logical row r = e*out + o. Walk the stored rows (c) in the
	 * outer loop so the reads stay contiguous along o, one expert's span at a time. */
	const int64_t out = it->spec->shape[1];
	for (int64_t r = 0; r < nr;) {
		int64_t e = (r0 + r) / out, o0 = (r0 + r) % out;
		int64_t span = out - o0 < nr - r ? out - o0 : nr - r;
		for (int64_t c = 0; c < K; c++) {
			uint64_t base = (uint64_t)((e * K + c) * out + o0);
			for (int64_t j = 0; j < span; j++)
				x[(r + j) * K + c] = in_value(it->in, base + (uint64_t)j);
		}
		r += span;
	}
}

static int add_t(struct pipe *p, const char *name, enum fp4s_dtype dt, int32_t ndim,
                 const int64_t *shape, int32_t *idx, struct fp4s_error *err)
{
	int r = fp4s_st_writer_add(&p->w, name, dt, ndim, shape, err);
	if (r < 0)
		return r;
	*idx = r;
	return FP4S_OK;
}

/* Declares the output tensors of one item. */
static int declare(struct pipe *p, struct item *it, struct fp4s_error *err)
{
	const struct fp4s_tspec *s = it->spec;
	char nm[240];
	int ct = p->fmt == FP4S_QF_NVFP4_CT;
	it->o_main = it->o_scale = it->o_scalar = -1;
	if (it->kind == K_NVFP4) {
		size_t pl = strlen(s->name) - strlen(".weight");
		int64_t R = s->shape[0], K = s->shape[1];
		snprintf(nm, sizeof nm, "%.*s.%s", (int)pl, s->name, ct ? "weight_packed" : "weight");
		int rc = add_t(p, nm, FP4S_DT_U8, 2, (int64_t[]){R, K / 2}, &it->o_main, err);
		snprintf(nm, sizeof nm, "%.*s.weight_scale", (int)pl, s->name);
		if (!rc)
			rc = add_t(p, nm, FP4S_DT_F8_E4M3, 2, (int64_t[]){R, K / 16}, &it->o_scale, err);
		snprintf(nm, sizeof nm, "%.*s.%s", (int)pl, s->name,
		         ct ? "weight_global_scale" : "weight_scale_2");
		/* ModelOpt stores a 0-d scalar, compressed-tensors a [1] tensor. */
		if (!rc)
			rc = add_t(p, nm, FP4S_DT_F32, ct ? 1 : 0, (int64_t[]){1}, &it->o_scalar, err);
		return rc;
	}
	if (it->kind == K_MXFP4) {
		int64_t E = s->shape[0], R = s->shape[1], K = s->shape[2];
		snprintf(nm, sizeof nm, "%s_blocks", s->name);
		int rc = add_t(p, nm, FP4S_DT_U8, 4, (int64_t[]){E, R, K / 32, 16}, &it->o_main, err);
		snprintf(nm, sizeof nm, "%s_scales", s->name);
		if (!rc)
			rc = add_t(p, nm, FP4S_DT_U8, 3, (int64_t[]){E, R, K / 32}, &it->o_scale, err);
		return rc;
	}
	int64_t shape[3];
	for (int32_t d = 0; d < s->ndim; d++)
		shape[d] = s->shape[d];
	if (it->transposed) { /* [E, out, in] stored as [E, in, out] */
		shape[1] = s->shape[2];
		shape[2] = s->shape[1];
	}
	return add_t(p, s->name, it->out_dt, s->ndim, shape, &it->o_main, err);
}

static int group_cmp_key(const struct item *it, int64_t *k)
{
	int g = fp4s_role_fuse_group(it->spec->role);
	k[0] = it->spec->layer;
	k[1] = it->spec->expert;
	k[2] = g;
	return g;
}

static const struct item *g_sort_items;
static int cmp_group(const void *a, const void *b)
{
	int64_t ka[3], kb[3];
	group_cmp_key(&g_sort_items[*(const int32_t *)a], ka);
	group_cmp_key(&g_sort_items[*(const int32_t *)b], kb);
	for (int i = 0; i < 3; i++)
		if (ka[i] != kb[i])
			return ka[i] < kb[i] ? -1 : 1;
	return 0;
}

/* Per-tensor scales: amax per item (generator: element 0; input: a parallel scan), then the
 * max over each fused group (formats.md §4.3: preprocess_linear_fusion), ws2 = amax / 2688. */
static int compute_scales(struct pipe *p, struct fp4s_error *err)
{
	for (int32_t i = 0; i < p->n; i++) {
		struct item *it = &p->it[i];
		if (it->kind != K_NVFP4)
			continue;
		if (!it->in) {
			it->amax = fabsf(fp4s_gen_value(it->key, 0, it->mean, it->std));
			continue;
		}
		float am = 0.0f;
		int bad = 0;
		const int64_t chunk = 64;
#pragma omp parallel for schedule(dynamic, 1) reduction(max : am) reduction(| : bad)
		for (int64_t r0 = 0; r0 < it->rows; r0 += chunk) {
			int64_t nr = it->rows - r0 < chunk ? it->rows - r0 : chunk;
			float *x = malloc((size_t)(nr * it->cols) * sizeof *x);
			if (!x) {
				bad = 1;
				continue;
			}
			fill_rows(it, r0, nr, x);
			for (int64_t j = 0; j < nr * it->cols; j++) {
				if (!isfinite(x[j]))
					bad = 1;
				am = fmaxf(am, fabsf(x[j]));
			}
			free(x);
		}
		if (bad)
			return fp4s_error_set(err, FP4S_EFORMAT,
			                      "%s: tensor %s holds NaN or Inf; cannot quantize it",
			                      it->in->file, it->spec->name);
		it->amax = am;
	}
	int32_t *ord = malloc((size_t)(p->n ? p->n : 1) * sizeof *ord);
	if (!ord)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	int32_t m = 0;
	for (int32_t i = 0; i < p->n; i++)
		if (p->it[i].kind == K_NVFP4)
			ord[m++] = i;
	g_sort_items = p->it;
	qsort(ord, (size_t)m, sizeof *ord, cmp_group);
	for (int32_t a = 0; a < m;) {
		int32_t b = a + 1;
		int64_t ka[3], kb[3];
		int g = group_cmp_key(&p->it[ord[a]], ka);
		while (g && b < m && (group_cmp_key(&p->it[ord[b]], kb), !memcmp(ka, kb, sizeof ka)))
			b++;
		float am = 0.0f;
		for (int32_t j = a; j < b; j++)
			am = fmaxf(am, p->it[ord[j]].amax);
		float ws2;
		int rc = fp4s_nvfp4_tensor_scale(&am, 1, &ws2, err);
		if (rc) {
			free(ord);
			return rc;
		}
		for (int32_t j = a; j < b; j++)
			p->it[ord[j]].ws2 = ws2;
		a = b;
	}
	free(ord);
	return FP4S_OK;
}

/* Per-thread buffers, grown on demand and reused across jobs: allocating the 4-12 MB of a job
 * afresh each time cost page faults and kernel zeroing comparable to the generator itself. */
struct scratch {
	float *x;
	uint8_t *q;
	size_t xcap, qcap;
};

static int scratch_reserve(struct scratch *s, size_t xn, size_t qn)
{
	if (xn > s->xcap) {
		free(s->x);
		s->x = malloc(xn * sizeof *s->x);
		s->xcap = s->x ? xn : 0;
	}
	if (qn > s->qcap) {
		free(s->q);
		s->q = malloc(qn);
		s->qcap = s->q ? qn : 0;
	}
	return s->x && s->q ? 0 : -1;
}

static int run_job(struct pipe *p, const struct job *j, struct scratch *sc,
                   struct fp4s_progress *pr, struct fp4s_error *err)
{
	struct item *it = &p->it[j->item];
	const int64_t nr = j->r1 - j->r0, K = it->cols;
	if (it->kind == K_COPY) {
		int rc = fp4s_st_write_at(&p->w, it->o_main, (uint64_t)j->r0,
		                          (const uint8_t *)it->in->data + j->r0, (size_t)nr, err);
		fp4s_progress_add(pr, (uint64_t)nr);
		return rc;
	}
	int rc = FP4S_OK;
	/* q holds BF16 output (2 bytes per element) or packed codes followed by block scales */
	if (scratch_reserve(sc, (size_t)(nr * K), (size_t)(nr * K) * 2 + 16)) {
		rc = fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
		goto out;
	}
	float *x = sc->x;
	uint8_t *q = sc->q;
	if (it->kind == K_PLAIN && it->transposed && !it->in) {
		/* gen, BF16 experts stored [E, in, out]: stored row (e, c) holds logical (e, o, c). */
		const int64_t in = it->spec->shape[2], out = it->spec->shape[1];
		uint16_t *h = (uint16_t *)q;
		for (int64_t r = 0; r < nr; r++) {
			int64_t e = (j->r0 + r) / in, c = (j->r0 + r) % in;
			for (int64_t o = 0; o < out; o++)
				h[r * out + o] = fp4s_f32_to_bf16(fp4s_gen_value(
					it->key, (uint64_t)((e * out + o) * in + c), it->mean, it->std));
		}
		rc = fp4s_st_write_at(&p->w, it->o_main, (uint64_t)(j->r0 * out * 2), h,
		                      (size_t)(nr * out * 2), err);
		fp4s_progress_add(pr, (uint64_t)(nr * out * 2));
		goto out;
	}
	fill_rows(it, j->r0, nr, x);
	if (it->kind == K_PLAIN) {
		uint16_t *h = (uint16_t *)q;
		for (int64_t i = 0; i < nr * K; i++)
			h[i] = fp4s_f32_to_bf16(x[i]);
		rc = fp4s_st_write_at(&p->w, it->o_main, (uint64_t)(j->r0 * K * 2), h,
		                      (size_t)(nr * K * 2), err);
		fp4s_progress_add(pr, (uint64_t)(nr * K * 2));
	} else if (it->kind == K_NVFP4) {
		uint8_t *sf = q + nr * K / 2;
		rc = fp4s_nvfp4_quantize(x, nr, K, it->ws2, q, sf, err);
		if (!rc)
			rc = fp4s_st_write_at(&p->w, it->o_main, (uint64_t)(j->r0 * K / 2), q,
			                      (size_t)(nr * K / 2), err);
		if (!rc)
			rc = fp4s_st_write_at(&p->w, it->o_scale, (uint64_t)(j->r0 * K / 16), sf,
			                      (size_t)(nr * K / 16), err);
		fp4s_progress_add(pr, (uint64_t)(nr * K / 2 + nr * K / 16));
	} else {
		uint8_t *sf = q + nr * K / 2;
		rc = fp4s_mxfp4_quantize(x, nr, K, q, sf, err);
		if (!rc)
			rc = fp4s_st_write_at(&p->w, it->o_main, (uint64_t)(j->r0 * K / 2), q,
			                      (size_t)(nr * K / 2), err);
		if (!rc)
			rc = fp4s_st_write_at(&p->w, it->o_scale, (uint64_t)(j->r0 * K / 32), sf,
			                      (size_t)(nr * K / 32), err);
		fp4s_progress_add(pr, (uint64_t)(nr * K / 2 + nr * K / 32));
	}
out:
	if (rc)
		fp4s_error_prefix(err, "tensor %s: ", it->spec->name);
	return rc;
}

/* Runs the planned pipeline into p->w (already initialised with the output folder). */
static int pipe_run(struct pipe *p, const struct fp4s_write_opts *o, struct fp4s_error *err)
{
	int rc = FP4S_OK;
	for (int32_t i = 0; i < p->n && !rc; i++)
		rc = declare(p, &p->it[i], err);
	if (!rc)
		rc = compute_scales(p, err);
	if (!rc)
		rc = fp4s_st_writer_begin(&p->w, err);
	if (rc)
		return rc;
	/* Scalars first (tiny), then row-chunk jobs of about 4 MB of input floats each. */
	int64_t njobs = 0;
	for (int32_t i = 0; i < p->n && !rc; i++) {
		struct item *it = &p->it[i];
		if (it->o_scalar >= 0) {
			float v = p->fmt == FP4S_QF_NVFP4_CT ? 1.0f / it->ws2 : it->ws2;
			rc = fp4s_st_write_at(&p->w, it->o_scalar, 0, &v, sizeof v, err);
		}
		int64_t rows = it->kind == K_COPY ? it->cols : it->rows;
		int64_t per = it->kind == K_COPY ? (8 << 20) : ((1 << 20) / (it->cols ? it->cols : 1));
		if (per < 1)
			per = 1;
		njobs += (rows + per - 1) / per;
	}
	if (rc)
		return rc;
	struct job *jobs = malloc((size_t)(njobs ? njobs : 1) * sizeof *jobs);
	if (!jobs)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	int64_t k = 0;
	for (int32_t i = 0; i < p->n; i++) {
		struct item *it = &p->it[i];
		int64_t rows = it->kind == K_COPY ? it->cols : it->rows;
		int64_t per = it->kind == K_COPY ? (8 << 20) : ((1 << 20) / (it->cols ? it->cols : 1));
		if (per < 1)
			per = 1;
		for (int64_t r = 0; r < rows; r += per)
			jobs[k++] = (struct job){i, r, r + per < rows ? r + per : rows};
	}
	struct fp4s_progress pr;
	fp4s_progress_init(&pr, "write", p->w.total_bytes);
	int failed = 0;
	struct fp4s_error e1 = {0};
	if (o->threads > 0)
		omp_set_num_threads(o->threads);
#pragma omp parallel
	{
		struct scratch sc = {0};
#pragma omp for schedule(dynamic, 1)
		for (int64_t j = 0; j < njobs; j++) {
			if (__atomic_load_n(&failed, __ATOMIC_RELAXED))
				continue;
			struct fp4s_error e = {0};
			if (run_job(p, &jobs[j], &sc, &pr, &e)) {
#pragma omp critical(fp4s_mwrite_err)
				if (!failed) {
					failed = 1;
					e1 = e;
				}
			}
		}
		free(sc.x);
		free(sc.q);
	}
	fp4s_progress_done(&pr);
	free(jobs);
	if (failed) {
		if (err)
			*err = e1;
		return e1.code;
	}
	return fp4s_st_writer_finish(&p->w, err);
}

/* Builds the items for a config: from the generator (in == NULL) or an input model. */
static int build_items(struct pipe *p, const struct fp4s_tspec *specs,
                       const struct fp4s_weight *in_w, int32_t n, uint64_t seed,
                       struct fp4s_error *err)
{
	p->it = calloc((size_t)(n ? n : 1), sizeof *p->it);
	if (!p->it)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	p->n = 0;
	for (int32_t i = 0; i < n; i++) {
		const struct fp4s_tspec *s = &specs[i];
		const struct fp4s_weight *iw = in_w ? &in_w[i] : NULL;
		if (iw && !iw->present)
			continue;
		struct item *it = &p->it[p->n++];
		it->spec = s;
		it->in = iw;
		enum fp4s_wformat f = planned_fmt(s, p->fmt);
		it->kind = f == FP4S_WF_NVFP4 ? K_NVFP4 : f == FP4S_WF_MXFP4 ? K_MXFP4 : K_PLAIN;
		it->out_dt = FP4S_DT_BF16;
		it->transposed = s->cls == FP4S_TC_PACKED_EXPERTS && it->kind == K_PLAIN;
		it->key = fp4s_gen_key(seed, s->name);
		role_dist(s->role, &it->mean, &it->std);
		/* Qwen3-Next norms are zero-centred (y = x̂ (1 + w)), except the gated linear_attn.norm */
		if (p->cfg->arch == FP4S_ARCH_QWEN3_NEXT && s->role == FP4S_ROLE_NORM &&
		    !strstr(s->name, "linear_attn.norm"))
			it->mean = 0.0f;
		it->cols = s->shape[s->ndim - 1];
		it->rows = 1;
		for (int32_t d = 0; d + 1 < s->ndim; d++)
			it->rows *= s->shape[d];
		if (it->transposed && !iw) { /* gen writes stored rows (e, c) of length out */
			it->rows = s->shape[0] * s->shape[2];
			it->cols = s->shape[1];
		}
		if (!iw && (uint64_t)it->rows * (uint64_t)it->cols >= (1ull << 32))
			return fp4s_error_set(err, FP4S_EUNSUPPORTED,
			                      "tensor %s: 2^32 elements or more (the generator's counter "
			                      "is 32-bit)",
			                      s->name);
		if (iw) {
			if (iw->fmt == FP4S_WF_NVFP4 || iw->fmt == FP4S_WF_MXFP4)
				return fp4s_error_set(err, FP4S_EUNSUPPORTED,
				                      "%s: tensor %s is already %s; quantize needs a "
				                      "BF16/F16/F32 checkpoint",
				                      iw->file, s->name, fp4s_wformat_name(iw->fmt));
			if (it->kind == K_PLAIN) { /* kept as is: a byte copy in its own dtype */
				it->kind = K_COPY;
				it->out_dt = iw->fmt == FP4S_WF_BF16  ? FP4S_DT_BF16
				             : iw->fmt == FP4S_WF_F16 ? FP4S_DT_F16
				                                      : FP4S_DT_F32;
				it->rows = 1;
				it->cols = (int64_t)iw->data_bytes;
			}
		}
	}
	return FP4S_OK;
}

/* ---- config files ---- */

static json_t *exclude_list(const struct fp4s_config *c, enum fp4s_qformat f)
{
	json_t *a = json_array();
	if (f == FP4S_QF_MXFP4) {
		json_array_append_new(a, json_string("model.layers.*.self_attn"));
		json_array_append_new(a, json_string("model.layers.*.mlp.router"));
		json_array_append_new(a, json_string("model.embed_tokens"));
		json_array_append_new(a, json_string("lm_head"));
		return a;
	}
	if (!c->tie_embeddings)
		json_array_append_new(a, json_string("lm_head"));
	if (c->arch == FP4S_ARCH_QWEN3_MOE || c->arch == FP4S_ARCH_QWEN3_NEXT)
		json_array_append_new(a, json_string("model.layers.*.mlp.gate"));
	if (c->arch == FP4S_ARCH_QWEN3_NEXT) {
		json_array_append_new(a, json_string("model.layers.*.mlp.shared_expert_gate"));
		json_array_append_new(a, json_string("mtp.fc"));
	}
	return a;
}

static json_t *quant_config(const struct fp4s_config *c, enum fp4s_qformat f)
{
	json_t *q = json_object();
	if (f == FP4S_QF_NVFP4) {
		json_object_set_new(q, "quant_method", json_string("modelopt"));
		json_object_set_new(q, "quant_algo", json_string("W4A16_NVFP4"));
		json_object_set_new(q, "producer", json_pack("{s:s,s:s}", "name", "fp4serve",
		                                             "version", FP4S_VERSION));
		json_object_set_new(q, "group_size", json_integer(16));
		json_object_set_new(q, "ignore", exclude_list(c, f));
		json_object_set_new(
			q, "config_groups",
			json_pack("{s:{s:{s:i,s:s,s:i,s:b},s:[s]}}", "group_0", "weights", "num_bits", 4,
			          "type", "float", "group_size", 16, "dynamic", 0, "targets", "Linear"));
	} else if (f == FP4S_QF_NVFP4_CT) {
		json_object_set_new(q, "quant_method", json_string("compressed-tensors"));
		json_object_set_new(q, "format", json_string("nvfp4-pack-quantized"));
		json_object_set_new(q, "quantization_status", json_string("compressed"));
		json_object_set_new(q, "ignore", exclude_list(c, f));
		json_object_set_new(q, "kv_cache_scheme", json_null());
		json_object_set_new(
			q, "config_groups",
			json_pack("{s:{s:[s],s:s,s:{s:i,s:s,s:s,s:i,s:b,s:b,s:s}}}", "group_0", "targets",
			          "Linear", "format", "nvfp4-pack-quantized", "weights", "num_bits", 4, "type",
			          "float", "strategy", "tensor_group", "group_size", 16, "symmetric", 1,
			          "dynamic", 0, "observer", "minmax"));
	} else {
		json_object_set_new(q, "quant_method", json_string("mxfp4"));
		json_object_set_new(q, "modules_to_not_convert", exclude_list(c, f));
	}
	return q;
}

static int write_json(json_t *j, const char *dir, const char *name, struct fp4s_error *err)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	if (json_dump_file(j, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER))
		return fp4s_error_set(err, FP4S_EIO, "%s: cannot write", path);
	return FP4S_OK;
}

/* config.json (+ hf_quant_config.json for ModelOpt) of the output. */
static int write_configs(json_t *cfg, const struct fp4s_config *c, enum fp4s_qformat f,
                         const char *dir, struct fp4s_error *err)
{
	json_object_del(cfg, "quantization_config");
	if (f != FP4S_QF_BF16)
		json_object_set_new(cfg, "quantization_config", quant_config(c, f));
	int rc = write_json(cfg, dir, "config.json", err);
	if (rc || f != FP4S_QF_NVFP4)
		return rc;
	json_t *h = json_pack("{s:{s:s,s:s},s:{s:s,s:n,s:i,s:o}}", "producer", "name", "fp4serve",
	                      "version", FP4S_VERSION, "quantization", "quant_algo", "W4A16_NVFP4",
	                      "kv_cache_quant_algo", "group_size", 16, "exclude_modules",
	                      exclude_list(c, f));
	rc = write_json(h, dir, "hf_quant_config.json", err);
	json_decref(h);
	return rc;
}

static int make_dir(const char *dir, struct fp4s_error *err)
{
	if (mkdir(dir, 0755) && errno != EEXIST)
		return fp4s_error_set(err, FP4S_EIO, "%s: cannot create: %s", dir, strerror(errno));
	return FP4S_OK;
}

/* The preset's config cut to its first L layers (its per-layer lists too): *text and *c
 * replaced. */
static int cut_layers(const char *preset, int32_t L, char **text, struct fp4s_config *c, struct fp4s_error *err)
{
	if (L > c->n_layers)
		return fp4s_error_set(err, FP4S_EINVAL, "gen: %d layers asked, the preset %s has %d", L, preset,
		                      c->n_layers);
	json_t *j = json_loads(*text, 0, NULL);
	if (!j)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	json_object_set_new(j, "num_hidden_layers", json_integer(L));
	json_t *lt = json_object_get(j, "layer_types");
	while (json_is_array(lt) && json_array_size(lt) > (size_t)L)
		json_array_remove(lt, json_array_size(lt) - 1);
	json_t *mw = json_object_get(j, "max_window_layers");
	if (json_is_integer(mw) && json_integer_value(mw) > L)
		json_object_set_new(j, "max_window_layers", json_integer(L));
	char *t = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(j);
	if (!t)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	fp4s_config_free(c);
	free(*text);
	*text = t;
	return fp4s_config_parse(t, strlen(t), preset, c, err);
}

int fp4s_gen(const char *preset, const char *out_dir, const struct fp4s_write_opts *o,
             struct fp4s_error *err)
{
	char *text = NULL;
	struct fp4s_config c;
	int rc = fp4s_preset_config(preset, &text, &c, err);
	if (rc)
		return rc;
	if (o->layers > 0 && (rc = cut_layers(preset, o->layers, &text, &c, err))) {
		free(text);
		fp4s_config_free(&c);
		return rc;
	}
	struct pipe p = {.cfg = &c, .fmt = o->format};
	struct fp4s_tspec *specs = NULL;
	json_t *cfg = NULL;
	rc = check_format(&c, o->format, err);
	if (!rc)
		rc = make_dir(out_dir, err);
	if (!rc)
		rc = fp4s_tensors_expand(&c, &specs, &p.n, err);
	fp4s_st_writer_init(&p.w, out_dir, o->shard_bytes ? o->shard_bytes : 5000000000ull);
	if (!rc)
		rc = build_items(&p, specs, NULL, p.n, o->seed, err);
	if (!rc)
		rc = pipe_run(&p, o, err);
	if (!rc) {
		cfg = json_loads(text, 0, NULL);
		rc = write_configs(cfg, &c, o->format, out_dir, err);
	}
	if (!rc) {
		char path[4096];
		snprintf(path, sizeof path, "%s/tokenizer.json", out_dir);
		rc = fp4s_gen_tokenizer(path, &c, err);
	}
	json_decref(cfg);
	fp4s_st_writer_free(&p.w);
	free(p.it);
	free(specs);
	free(text);
	fp4s_config_free(&c);
	return rc;
}

static int copy_file(const char *in_dir, const char *out_dir, const char *name)
{
	char a[4096], b[4096];
	snprintf(a, sizeof a, "%s/%s", in_dir, name);
	snprintf(b, sizeof b, "%s/%s", out_dir, name);
	FILE *fi = fopen(a, "rb");
	if (!fi)
		return 0; /* optional */
	FILE *fo = fopen(b, "wb");
	int rc = fo ? 0 : -1;
	char buf[1 << 16];
	size_t n;
	while (fo && (n = fread(buf, 1, sizeof buf, fi)) > 0)
		if (fwrite(buf, 1, n, fo) != n)
			rc = -1;
	fclose(fi);
	if (fo && fclose(fo))
		rc = -1;
	return rc;
}

int fp4s_quantize(const char *in_dir, const char *out_dir, const struct fp4s_write_opts *o,
                  struct fp4s_error *err)
{
	struct fp4s_model m;
	int rc = fp4s_model_open(in_dir, &m, err);
	if (rc)
		return rc;
	struct pipe p = {.cfg = &m.cfg, .fmt = o->format};
	json_t *cfg = NULL;
	if (o->format == FP4S_QF_BF16)
		rc = fp4s_error_set(err, FP4S_EINVAL, "quantize: --format must be nvfp4, nvfp4-ct or mxfp4");
	if (!rc && m.qs.method != FP4S_QM_NONE)
		rc = fp4s_error_set(err, FP4S_EUNSUPPORTED,
		                    "%s: already quantized (%s); quantize needs a BF16/F16/F32 checkpoint",
		                    in_dir, fp4s_qmethod_name(m.qs.method));
	if (!rc)
		rc = check_format(&m.cfg, o->format, err);
	if (!rc)
		rc = make_dir(out_dir, err);
	fp4s_st_writer_init(&p.w, out_dir, o->shard_bytes ? o->shard_bytes : 5000000000ull);
	if (!rc)
		rc = build_items(&p, m.specs, m.w, m.n, 0, err);
	if (!rc)
		rc = pipe_run(&p, o, err);
	if (!rc) {
		char path[4096];
		json_error_t je;
		snprintf(path, sizeof path, "%s/config.json", in_dir);
		cfg = json_load_file(path, 0, &je);
		rc = cfg ? write_configs(cfg, &m.cfg, o->format, out_dir, err)
		         : fp4s_error_set(err, FP4S_EFORMAT, "%s: %s", path, je.text);
	}
	static const char *const extra[] = {"tokenizer.json", "tokenizer_config.json",
	                                    "generation_config.json", "special_tokens_map.json"};
	for (size_t i = 0; !rc && i < sizeof extra / sizeof extra[0]; i++)
		if (copy_file(in_dir, out_dir, extra[i]))
			rc = fp4s_error_set(err, FP4S_EIO, "%s: cannot copy %s", out_dir, extra[i]);
	json_decref(cfg);
	fp4s_st_writer_free(&p.w);
	free(p.it);
	fp4s_model_close(&m);
	return rc;
}
