/* cpu_ops.c: CPU reference ops (see cpu_ops.h). */
#include "backend/cpu/cpu_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "numerics/numerics.h"

/* Decoded E4M3 and E2M1 values, built once: a table lookup per element is what keeps the
 * on-the-fly decode cheap enough for the CPU backend. Both decodes are exact. */
static float g_e4m3[256];
static float g_e2m1[16];
static int g_tables_ready;

static void tables_init(void)
{
	if (g_tables_ready)
		return;
	for (int i = 0; i < 256; i++)
		g_e4m3[i] = fp4s_e4m3_to_f32((uint32_t)i);
	for (int i = 0; i < 16; i++)
		g_e2m1[i] = fp4s_e2m1_to_f32((uint32_t)i);
	g_tables_ready = 1;
}

/* Row r without the NVFP4 per-tensor factor: (e2m1 * block scale) products are exact in FP32,
 * and ws2 multiplies the finished dot product, as GPU kernels apply it in the epilogue. */
static void decode_row_raw(const struct fp4s_mat *w, int64_t r, float *out)
{
	const int64_t k = w->cols;
	switch (w->fmt) {
	case FP4S_WF_F32:
		memcpy(out, (const float *)w->data + r * k, (size_t)k * sizeof *out);
		break;
	case FP4S_WF_BF16: {
		const uint16_t *row = (const uint16_t *)w->data + r * k;
		for (int64_t i = 0; i < k; i++)
			out[i] = fp4s_bf16_to_f32(row[i]);
		break;
	}
	case FP4S_WF_F16: {
		const uint16_t *row = (const uint16_t *)w->data + r * k;
		for (int64_t i = 0; i < k; i++)
			out[i] = fp4s_f16_to_f32(row[i]);
		break;
	}
	case FP4S_WF_NVFP4:
	case FP4S_WF_MXFP4: {
		const int nv = w->fmt == FP4S_WF_NVFP4;
		const int64_t block = nv ? FP4S_NVFP4_BLOCK : FP4S_MXFP4_BLOCK, nb = k / block;
		const uint8_t *row = (const uint8_t *)w->data + r * (k / 2);
		const uint8_t *sc = w->scales + r * nb;
		for (int64_t b = 0; b < nb; b++) {
			const float s = nv ? g_e4m3[sc[b]] : fp4s_e8m0_to_f32(sc[b]);
			const uint8_t *p = row + b * block / 2;
			float *o = out + b * block;
			for (int64_t j = 0; j < block / 2; j++) {
				o[2 * j] = g_e2m1[p[j] & 15] * s;
				o[2 * j + 1] = g_e2m1[p[j] >> 4] * s;
			}
		}
		break;
	}
	default:
		memset(out, 0, (size_t)k * sizeof *out);
	}
}

void fp4s_cpu_mat_row(const struct fp4s_mat *w, int64_t r, float *out)
{
	tables_init();
	decode_row_raw(w, r, out);
	if (w->fmt == FP4S_WF_NVFP4)
		for (int64_t i = 0; i < w->cols; i++)
			out[i] *= w->ws2;
}

/* Dot product with 8 independent partial sums: vectorizes, and its rounding is as good as a
 * sequential sum's. */
static float dot(const float *a, const float *b, int64_t n)
{
	float acc[8] = {0};
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			acc[j] += a[i + j] * b[i + j];
	for (; i < n; i++)
		acc[0] += a[i] * b[i];
	return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

int fp4s_cpu_matmul(const float *x, int64_t ntok, const struct fp4s_mat *w, float *y,
                    struct fp4s_error *err)
{
	if (w->rows <= 0 || w->cols <= 0 || ntok < 0)
		return fp4s_error_set(err, FP4S_EINVAL, "matmul: bad shape [%lld, %lld] x %lld tokens",
		                      (long long)w->rows, (long long)w->cols, (long long)ntok);
	if ((w->fmt == FP4S_WF_NVFP4 && w->cols % FP4S_NVFP4_BLOCK) ||
	    (w->fmt == FP4S_WF_MXFP4 && w->cols % FP4S_MXFP4_BLOCK))
		return fp4s_error_set(err, FP4S_EINVAL, "matmul: K = %lld is not a multiple of the %s block",
		                      (long long)w->cols, fp4s_wformat_name(w->fmt));
	if (w->fmt != FP4S_WF_F32 && w->fmt != FP4S_WF_BF16 && w->fmt != FP4S_WF_F16 &&
	    w->fmt != FP4S_WF_NVFP4 && w->fmt != FP4S_WF_MXFP4)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "matmul: weight format %d", (int)w->fmt);
	tables_init();
	const float post = w->fmt == FP4S_WF_NVFP4 ? w->ws2 : 1.0f;
	int failed = 0;
	/* threads only pay off past ~1 M multiply-adds: small models decode faster on one core */
	const int par = (double)w->rows * (double)w->cols * (double)(ntok > 0 ? ntok : 1) > 1e6;
#pragma omp parallel if (par)
	{
		float *row = malloc((size_t)w->cols * sizeof *row);
		if (!row) {
#pragma omp atomic write
			failed = 1;
		}
#pragma omp for schedule(static)
		for (int64_t r = 0; r < w->rows; r++) {
			if (!row)
				continue;
			decode_row_raw(w, r, row);
			const float b = w->bias ? w->bias[r] : 0.0f;
			for (int64_t t = 0; t < ntok; t++)
				y[t * w->rows + r] = dot(x + t * w->cols, row, w->cols) * post + b;
		}
		free(row);
	}
	if (failed)
		return fp4s_error_set(err, FP4S_ENOMEM, "matmul: out of memory for a %lld-wide row",
		                      (long long)w->cols);
	return FP4S_OK;
}

void fp4s_cpu_rmsnorm(const float *x, const float *w, int64_t ntok, int64_t n, float eps,
                      enum fp4s_norm_kind kind, float *y)
{
	for (int64_t t = 0; t < ntok; t++) {
		const float *xr = x + t * n;
		float *yr = y + t * n;
		double ss = 0;
		for (int64_t i = 0; i < n; i++)
			ss += (double)xr[i] * xr[i];
		const float inv = 1.0f / sqrtf((float)(ss / (double)n) + eps);
		for (int64_t i = 0; i < n; i++)
			yr[i] = xr[i] * inv * (kind == FP4S_NORM_ZERO_CENTRED ? 1.0f + w[i] : w[i]);
	}
}

int fp4s_rope_inv_freq(const struct fp4s_rope *p, int32_t rot_dim, float *inv_freq, float *mscale,
                       struct fp4s_error *err)
{
	const int r = rot_dim;
	const double l0 = (double)p->original_max_position_embeddings;
	if (r <= 0 || r % 2 || !(p->theta > 0))
		return fp4s_error_set(err, FP4S_EINVAL, "rope: rotary dim %d and theta %g must be positive "
		                      "(dim even)", r, p->theta);
	*mscale = 1.0f;
	for (int i = 0; i < r / 2; i++) {
		/* the base frequency in double, rounded once: HF builds it from a float exponent table,
		 * which agrees to the last bit or one ulp */
		double f = 1.0 / pow(p->theta, (2.0 * i) / r);
		if (p->type == FP4S_ROPE_LLAMA3) {
			const double wl = 2.0 * M_PI / f, lo = l0 / p->low_freq_factor,
			             hi = l0 / p->high_freq_factor;
			if (wl > lo) {
				f = f / p->factor;
			} else if (wl >= hi) {
				const double s = (l0 / wl - p->low_freq_factor) /
				                 (p->high_freq_factor - p->low_freq_factor);
				f = (1 - s) * f / p->factor + s * f;
			}
		}
		inv_freq[i] = (float)f;
	}
	if (p->type == FP4S_ROPE_YARN) {
		if (!(p->factor > 0) || !(l0 > 0))
			return fp4s_error_set(err, FP4S_EINVAL, "rope: yarn needs factor and "
			                      "original_max_position_embeddings");
		const double lb = log(p->theta);
		double lo = r * log(l0 / (p->beta_fast * 2 * M_PI)) / (2 * lb);
		double hi = r * log(l0 / (p->beta_slow * 2 * M_PI)) / (2 * lb);
		if (p->truncate) {
			lo = floor(lo);
			hi = ceil(hi);
		}
		lo = fmax(lo, 0);
		hi = fmin(hi, r - 1);
		if (lo == hi)
			hi += 0.001;
		for (int i = 0; i < r / 2; i++) {
			const double base = 1.0 / pow(p->theta, (2.0 * i) / r);
			double ramp = (i - lo) / (hi - lo);
			ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
			/* ramp 0 (fast-rotating dims) keeps the original frequency, ramp 1 interpolates */
			inv_freq[i] = (float)(base / p->factor * ramp + base * (1 - ramp));
		}
		*mscale = (float)(p->attention_factor > 0 ? p->attention_factor : 0.1 * log(p->factor) + 1.0);
	}
	return FP4S_OK;
}

void fp4s_cpu_rope(float *x, int32_t nheads, int32_t head_dim, int32_t rot_dim,
                   const float *inv_freq, float mscale, int64_t pos)
{
	const int half = rot_dim / 2;
	for (int i = 0; i < half; i++) {
		const float ang = (float)pos * inv_freq[i];
		const float c = cosf(ang) * mscale, s = sinf(ang) * mscale;
		for (int h = 0; h < nheads; h++) {
			float *v = x + (int64_t)h * head_dim;
			const float x1 = v[i], x2 = v[i + half];
			v[i] = x1 * c - x2 * s;
			v[i + half] = x2 * c + x1 * s;
		}
	}
}

static float silu(float v) { return v / (1.0f + expf(-v)); }

void fp4s_cpu_swiglu(const float *gate, const float *up, int64_t n, float *out)
{
	for (int64_t i = 0; i < n; i++)
		out[i] = silu(gate[i]) * up[i];
}

void fp4s_cpu_swiglu_oai(const float *gu, int64_t n, float alpha, float limit, float *out)
{
	for (int64_t i = 0; i < n; i++) {
		const float g = fminf(gu[2 * i], limit);
		const float u = fminf(fmaxf(gu[2 * i + 1], -limit), limit);
		out[i] = g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
	}
}

/* Picks the k largest of v[n] into idx (descending; ties to the lower index). */
static void topk(const float *v, int32_t n, int32_t k, int32_t *idx)
{
	for (int32_t j = 0; j < k; j++) {
		int32_t best = -1;
		for (int32_t e = 0; e < n; e++) {
			int taken = 0;
			for (int32_t q = 0; q < j; q++)
				taken |= idx[q] == e;
			if (!taken && (best < 0 || v[e] > v[best]))
				best = e;
		}
		idx[j] = best;
	}
}

void fp4s_cpu_moe_route(const float *logits, int32_t E, int32_t K, int softmax_first, int norm, float *prob,
                        int32_t *idx, float *w)
{
	if (softmax_first) {
		float m = -INFINITY, s = 0;
		for (int32_t e = 0; e < E; e++)
			m = fmaxf(m, logits[e]);
		for (int32_t e = 0; e < E; e++)
			s += prob[e] = expf(logits[e] - m);
		for (int32_t e = 0; e < E; e++)
			prob[e] /= s;
		topk(prob, E, K, idx);
		float sum = 0;
		for (int32_t j = 0; j < K; j++)
			sum += w[j] = prob[idx[j]];
		if (norm)
			for (int32_t j = 0; j < K; j++)
				w[j] /= sum;
	} else {
		topk(logits, E, K, idx);
		float m = logits[idx[0]], s = 0;
		for (int32_t j = 0; j < K; j++)
			s += w[j] = expf(logits[idx[j]] - m);
		for (int32_t j = 0; j < K; j++)
			w[j] /= s;
	}
}
