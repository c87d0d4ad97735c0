/* model.c: opening a checkpoint folder and validating it against the architecture's table. */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "numerics/quant.h"
#include "util/log.h"

const char *fp4s_wformat_name(enum fp4s_wformat f)
{
	static const char *const n[FP4S_WF_COUNT] = {"bf16", "f16", "f32", "nvfp4", "mxfp4"};
	return (unsigned)f < FP4S_WF_COUNT ? n[f] : "?";
}

int64_t fp4s_weight_numel(const struct fp4s_weight *w)
{
	int64_t n = 1;
	for (int32_t i = 0; i < w->spec->ndim; i++)
		n *= w->spec->shape[i];
	return n;
}

uint64_t fp4s_weight_bytes(const struct fp4s_weight *w)
{
	uint64_t n = (uint64_t)fp4s_weight_numel(w);
	switch (w->fmt) {
	case FP4S_WF_BF16:
	case FP4S_WF_F16: return 2 * n;
	case FP4S_WF_F32: return 4 * n;
	case FP4S_WF_NVFP4: return n / 2 + n / 16 + 4 + (w->input_scale > 0 ? 4 : 0);
	case FP4S_WF_MXFP4: return n / 2 + n / 32;
	default: return 0;
	}
}

static void shape_str(char *buf, size_t cap, int32_t ndim, const int64_t *shape)
{
	size_t k = (size_t)snprintf(buf, cap, "[");
	for (int32_t i = 0; i < ndim && k < cap; i++)
		k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
	if (k < cap)
		snprintf(buf + k, cap - k, "]");
}

/* Looks a tensor up and checks its dtype (one of allowed, a bitmask over enum fp4s_dtype) and
 * shape. ndim < 0 accepts a scalar stored as [] or [1]. Returns NULL with err set on failure,
 * or NULL with err untouched when it is absent and not required. */
static const struct fp4s_st_tensor *expect(const struct fp4s_model *m, const char *name,
                                           uint32_t allowed, int32_t ndim, const int64_t *shape,
                                           int required, int *rc, struct fp4s_error *err)
{
	const struct fp4s_st_tensor *t = fp4s_st_find(&m->st, name);
	if (!t) {
		if (required)
			*rc = fp4s_error_set(err, FP4S_EFORMAT,
			                     "%s: tensor %s is missing (required by the %s table)", m->dir,
			                     name, fp4s_arch_name(m->cfg.arch));
		return NULL;
	}
	const char *file = fp4s_st_file_of(&m->st, t);
	if (!(allowed & (1u << t->dtype))) {
		char want[96] = "";
		for (int d = 0; d < FP4S_DT_COUNT; d++)
			if (allowed & (1u << d)) {
				size_t k = strlen(want);
				snprintf(want + k, sizeof want - k, "%s%s", k ? " or " : "",
				         fp4s_dtype_name((enum fp4s_dtype)d));
			}
		*rc = fp4s_error_set(err, FP4S_EFORMAT, "%s: tensor %s: dtype %s, expected %s", file, name,
		                     fp4s_dtype_name(t->dtype), want);
		return NULL;
	}
	int ok;
	if (ndim < 0) {
		ok = t->ndim == 0 || (t->ndim == 1 && t->shape[0] == 1);
	} else {
		ok = t->ndim == ndim;
		for (int32_t i = 0; ok && i < ndim; i++)
			ok = t->shape[i] == shape[i];
	}
	if (!ok) {
		char want[96], got[96];
		if (ndim < 0)
			snprintf(want, sizeof want, "[] or [1]");
		else
			shape_str(want, sizeof want, ndim, shape);
		shape_str(got, sizeof got, t->ndim, t->shape);
		*rc = fp4s_error_set(err, FP4S_EFORMAT, "%s: tensor %s: shape %s, expected %s", file, name,
		                     got, want);
		return NULL;
	}
	return t;
}

#define DT(x) (1u << FP4S_DT_##x)
#define DT_FLOAT (DT(BF16) | DT(F16) | DT(F32))

static enum fp4s_wformat float_fmt(enum fp4s_dtype d)
{
	return d == FP4S_DT_BF16 ? FP4S_WF_BF16 : d == FP4S_DT_F16 ? FP4S_WF_F16 : FP4S_WF_F32;
}

static int scalar_value(const struct fp4s_st_tensor *t, const char *file, float *v,
                        struct fp4s_error *err)
{
	memcpy(v, t->data, sizeof *v);
	if (!isfinite(*v) || !(*v > 0))
		return fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: tensor %s: value %g, expected a positive finite scale", file,
		                      t->name, (double)*v);
	return FP4S_OK;
}

static void set_data(struct fp4s_weight *w, const struct fp4s_model *m,
                     const struct fp4s_st_tensor *t)
{
	w->data = t->data;
	w->data_bytes = t->end - t->begin;
	w->file = fp4s_st_file_of(&m->st, t);
}

/* A LINEAR: NVFP4 when its scale tensor exists (and it is not excluded), else plain. */
static int load_linear(struct fp4s_model *m, struct fp4s_weight *w, struct fp4s_error *err)
{
	const struct fp4s_tspec *s = w->spec;
	char pre[200], nm[240];
	int rc = FP4S_OK;
	size_t pl = strlen(s->name) - strlen(".weight");
	snprintf(pre, sizeof pre, "%.*s", (int)pl, s->name);
	int64_t out = s->shape[0], in = s->shape[1];
	snprintf(nm, sizeof nm, "%s.weight_scale", pre);
	const struct fp4s_st_tensor *sc = fp4s_st_find(&m->st, nm);
	int nv = m->qs.method == FP4S_QM_MODELOPT || m->qs.method == FP4S_QM_CT;
	if (sc && !nv)
		return fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: tensor %s exists but the checkpoint declares no NVFP4 "
		                      "quantization (quantization_config / hf_quant_config.json)",
		                      fp4s_st_file_of(&m->st, sc), nm);
	if (sc && fp4s_qscheme_excluded(&m->qs, pre))
		return fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: tensor %s: module %s is excluded from quantization in %s but "
		                      "has block scales",
		                      fp4s_st_file_of(&m->st, sc), nm, pre, m->qs.source);
	if (!sc) {
		const struct fp4s_st_tensor *t =
			expect(m, s->name, DT_FLOAT, 2, s->shape, s->required, &rc, err);
		if (t) {
			set_data(w, m, t);
			w->fmt = float_fmt(t->dtype);
			w->present = 1;
		}
		return rc;
	}
	if (in % 16)
		return fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: tensor %s: in_features %lld is not a multiple of 16 (NVFP4)",
		                      m->dir, s->name, (long long)in);
	int ct = m->qs.method == FP4S_QM_CT;
	snprintf(nm, sizeof nm, "%s.%s", pre, ct ? "weight_packed" : "weight");
	const struct fp4s_st_tensor *q = expect(m, nm, DT(U8), 2, (int64_t[]){out, in / 2}, 1, &rc, err);
	if (!q)
		return rc;
	if (!expect(m, sc->name, DT(F8_E4M3), 2, (int64_t[]){out, in / 16}, 1, &rc, err))
		return rc;
	snprintf(nm, sizeof nm, "%s.%s", pre, ct ? "weight_global_scale" : "weight_scale_2");
	const struct fp4s_st_tensor *g = expect(m, nm, DT(F32), -1, NULL, 1, &rc, err);
	if (!g)
		return rc;
	const char *gfile = fp4s_st_file_of(&m->st, g);
	if ((rc = scalar_value(g, gfile, &w->ws2, err)))
		return rc;
	if (ct)
		w->ws2 = 1.0f / w->ws2;
	snprintf(nm, sizeof nm, "%s.%s", pre, ct ? "input_global_scale" : "input_scale");
	const struct fp4s_st_tensor *is = expect(m, nm, DT(F32), -1, NULL, 0, &rc, err);
	if (rc)
		return rc;
	if (is) {
		if ((rc = scalar_value(is, fp4s_st_file_of(&m->st, is), &w->input_scale, err)))
			return rc;
		if (ct)
			w->input_scale = 1.0f / w->input_scale;
	}
	set_data(w, m, q);
	w->scales = sc->data;
	w->scale_bytes = sc->end - sc->begin;
	w->fmt = FP4S_WF_NVFP4;
	w->present = 1;
	return FP4S_OK;
}

/* gpt-oss experts: NAME_blocks + NAME_scales (MXFP4) or NAME in BF16, transposed. */
static int load_packed(struct fp4s_model *m, struct fp4s_weight *w, struct fp4s_error *err)
{
	const struct fp4s_tspec *s = w->spec;
	int64_t E = s->shape[0], out = s->shape[1], in = s->shape[2];
	char nm[240];
	int rc = FP4S_OK;
	snprintf(nm, sizeof nm, "%s_blocks", s->name);
	const struct fp4s_st_tensor *b = fp4s_st_find(&m->st, nm);
	if (!b) {
		const struct fp4s_st_tensor *t =
			expect(m, s->name, DT_FLOAT, 3, (int64_t[]){E, in, out}, 1, &rc, err);
		if (!t)
			return rc;
		set_data(w, m, t);
		w->fmt = float_fmt(t->dtype);
		w->transposed = 1;
		w->present = 1;
		return FP4S_OK;
	}
	if (m->qs.method != FP4S_QM_MXFP4)
		return fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: tensor %s exists but config.json declares no mxfp4 "
		                      "quantization_config",
		                      fp4s_st_file_of(&m->st, b), nm);
	if (in % 32)
		return fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: tensor %s: in_features %lld is not a multiple of 32 (MXFP4)",
		                      m->dir, s->name, (long long)in);
	if (!expect(m, nm, DT(U8), 4, (int64_t[]){E, out, in / 32, 16}, 1, &rc, err))
		return rc;
	snprintf(nm, sizeof nm, "%s_scales", s->name);
	const struct fp4s_st_tensor *sc = expect(m, nm, DT(U8), 3, (int64_t[]){E, out, in / 32}, 1, &rc, err);
	if (!sc)
		return rc;
	set_data(w, m, b);
	w->scales = sc->data;
	w->scale_bytes = sc->end - sc->begin;
	w->fmt = FP4S_WF_MXFP4;
	w->present = 1;
	return FP4S_OK;
}

static int check_scales(const struct fp4s_model *m, const struct fp4s_weight *w,
                        struct fp4s_error *err)
{
	size_t bad = 0;
	if (w->fmt == FP4S_WF_NVFP4 && fp4s_check_e4m3_scales(w->scales, w->scale_bytes, &bad)) {
		uint8_t b = w->scales[bad];
		int pl = (int)(strlen(w->spec->name) - strlen(".weight"));
		return fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: tensor %.*s.weight_scale: byte 0x%02X at index %zu (row %zu, "
		                      "block %zu) is %s, expected a non-negative finite E4M3 scale",
		                      w->file, pl, w->spec->name, b, bad,
		                      bad / (size_t)(w->spec->shape[1] / 16),
		                      bad % (size_t)(w->spec->shape[1] / 16),
		                      (b & 0x7F) == 0x7F ? "NaN" : "negative");
	}
	if (w->fmt == FP4S_WF_MXFP4 && fp4s_check_e8m0_scales(w->scales, w->scale_bytes, 0, &bad))
		return fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: tensor %s_scales: byte 0x%02X at index %zu is the E8M0 NaN "
		                      "encoding, expected an exponent in 0..254",
		                      w->file, w->spec->name, w->scales[bad], bad);
	/* 253/254 are legal but large elements overflow BF16 there (formats.md §1 item 6): warn. */
	if (w->fmt == FP4S_WF_MXFP4 && fp4s_check_e8m0_scales(w->scales, w->scale_bytes, 1, &bad))
		FP4S_WARN("%s: tensor %s_scales: byte 0x%02X at index %zu: elements up to 6 x 2^%d "
		          "overflow BF16",
		          w->file, w->spec->name, w->scales[bad], bad, (int)w->scales[bad] - 127);
	return FP4S_OK;
}

static const struct fp4s_weight *g_sort_w;
static int cmp_sibling(const void *a, const void *b)
{
	const struct fp4s_tspec *x = g_sort_w[*(const int32_t *)a].spec,
	                        *y = g_sort_w[*(const int32_t *)b].spec;
	int64_t kx[3] = {x->layer, x->expert, fp4s_role_fuse_group(x->role)},
	        ky[3] = {y->layer, y->expert, fp4s_role_fuse_group(y->role)};
	for (int i = 0; i < 3; i++)
		if (kx[i] != ky[i])
			return kx[i] < ky[i] ? -1 : 1;
	return 0;
}

/* Sets group_scale_shared: 1 unless a fused sibling (same layer, expert and fuse group) carries
 * a different ws2. Tensors outside a fused group are trivially shared. */
static int mark_shared_scales(struct fp4s_model *m, struct fp4s_error *err)
{
	int32_t *ord = malloc((size_t)(m->n ? m->n : 1) * sizeof *ord), k = 0;
	if (!ord)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	for (int32_t i = 0; i < m->n; i++) {
		m->w[i].group_scale_shared = 1;
		if (m->w[i].fmt == FP4S_WF_NVFP4 && fp4s_role_fuse_group(m->w[i].spec->role))
			ord[k++] = i;
	}
	g_sort_w = m->w;
	qsort(ord, (size_t)k, sizeof *ord, cmp_sibling);
	for (int32_t a = 0; a < k;) {
		int32_t b = a + 1, same = 1;
		while (b < k && !cmp_sibling(&ord[a], &ord[b]))
			b++;
		for (int32_t j = a + 1; j < b; j++)
			same &= m->w[ord[j]].ws2 == m->w[ord[a]].ws2;
		for (int32_t j = a; j < b; j++)
			m->w[ord[j]].group_scale_shared = same;
		if (!same)
			FP4S_INFO("%s: %s and its fused siblings carry different per-tensor scales; "
			          "keeping one per shard",
			          m->dir, m->w[ord[a]].spec->name);
		a = b;
	}
	free(ord);
	return FP4S_OK;
}

static int validate(struct fp4s_model *m, struct fp4s_error *err)
{
	int rc = FP4S_OK;
	for (int32_t i = 0; i < m->n && !rc; i++) {
		struct fp4s_weight *w = &m->w[i];
		const struct fp4s_tspec *s = w->spec;
		w->ws2 = 0;
		switch (s->cls) {
		case FP4S_TC_FLOAT: {
			const struct fp4s_st_tensor *t =
				expect(m, s->name, DT_FLOAT, s->ndim, s->shape, s->required, &rc, err);
			if (t) {
				set_data(w, m, t);
				w->fmt = float_fmt(t->dtype);
				w->present = 1;
			}
			break;
		}
		case FP4S_TC_LINEAR: rc = load_linear(m, w, err); break;
		case FP4S_TC_PACKED_EXPERTS: rc = load_packed(m, w, err); break;
		}
	}
	if (rc)
		return rc;
	/* Block scales: one pass over every scale byte, in parallel over tensors. */
	int first = -1;
	struct fp4s_error e1 = {0};
#pragma omp parallel for schedule(dynamic, 1)
	for (int32_t i = 0; i < m->n; i++) {
		struct fp4s_error e = {0};
		if (m->w[i].present && check_scales(m, &m->w[i], &e)) {
#pragma omp critical
			if (first < 0 || i < first) {
				first = i;
				e1 = e;
			}
		}
	}
	if (first >= 0) {
		if (err)
			*err = e1;
		return e1.code;
	}
	/* Fused siblings: note whether their per-tensor scales agree. They keep one each anyway. */
	return mark_shared_scales(m, err);
}

const struct fp4s_weight *fp4s_model_find(const struct fp4s_model *m, const char *name)
{
	for (int32_t i = 0; i < m->n; i++)
		if (!strcmp(m->w[i].spec->name, name))
			return &m->w[i];
	return NULL;
}

int fp4s_model_open(const char *dir, struct fp4s_model *m, struct fp4s_error *err)
{
	memset(m, 0, sizeof *m);
	m->dir = strdup(dir);
	if (!m->dir)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	char path[4096];
	snprintf(path, sizeof path, "%s/config.json", dir);
	int rc = fp4s_config_load(path, &m->cfg, err);
	if (!rc)
		rc = fp4s_qscheme_load(dir, &m->qs, err);
	if (!rc && m->qs.method == FP4S_QM_MXFP4 && m->cfg.arch != FP4S_ARCH_GPT_OSS)
		rc = fp4s_error_set(err, FP4S_EUNSUPPORTED,
		                    "%s: quant_method mxfp4 is only defined for gpt_oss, not %s", path,
		                    fp4s_arch_name(m->cfg.arch));
	if (!rc)
		rc = fp4s_st_open(dir, &m->st, err);
	if (!rc) {
		/* transformers-v5 re-saves carry fused routed experts; probe the first MoE layer */
		for (int32_t l = 0; l < m->cfg.n_layers; l++)
			if (m->cfg.layer_is_moe[l] && m->cfg.arch != FP4S_ARCH_GPT_OSS) {
				char nm[96];
				snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.gate_up_proj", l);
				m->cfg.experts_fused = fp4s_st_find(&m->st, nm) != NULL;
				break;
			}
		rc = fp4s_tensors_expand(&m->cfg, &m->specs, &m->n, err);
	}
	if (!rc) {
		m->w = calloc((size_t)(m->n ? m->n : 1), sizeof *m->w);
		if (!m->w)
			rc = fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	}
	if (!rc) {
		for (int32_t i = 0; i < m->n; i++)
			m->w[i].spec = &m->specs[i];
		rc = validate(m, err);
	}
	if (!rc) {
		/* Tensors nobody claimed are reported, not fatal (e.g. rotary inv_freq buffers). */
		int64_t used = 0;
		for (int32_t i = 0; i < m->n; i++)
			if (m->w[i].present)
				used += m->w[i].fmt == FP4S_WF_NVFP4
				                ? 3 + (m->w[i].input_scale > 0)
				                : m->w[i].fmt == FP4S_WF_MXFP4 ? 2 : 1;
		m->n_unused = (int32_t)(m->st.n - used);
		if (m->n_unused > 0)
			FP4S_WARN("%s: %d tensors in the checkpoint are not used by the %s table", dir,
			          m->n_unused, fp4s_arch_name(m->cfg.arch));
	}
	if (rc)
		fp4s_model_close(m);
	return rc;
}

void fp4s_model_close(struct fp4s_model *m)
{
	fp4s_st_close(&m->st);
	fp4s_qscheme_free(&m->qs);
	fp4s_config_free(&m->cfg);
	free(m->specs);
	free(m->w);
	free(m->dir);
	free(m->owned);
	if (m->owned_map)
		munmap(m->owned_map, m->owned_map_size);
	memset(m, 0, sizeof *m);
}
