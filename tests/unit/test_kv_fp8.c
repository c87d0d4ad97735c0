/* test_kv_fp8.c: the CPU backend's FP8 (E4M3) KV cache, the reference every GPU FP8 path is
 * tested against, on fresh random inputs through the backend's own kv_init and attention ops:
 *
 *   - storage: with one key, attention returns that key's value vector as the cache holds it,
 *     so out == e4m3(v) exactly shows every value is stored as fp4s_f32_to_e4m3 (RNE, saturating
 *     at +-448, tiny values to +-0) and read back exactly;
 *   - FP8 attention against a double-precision attention over the same E4M3-rounded K/V (tight:
 *     only summation order differs): GQA, sliding windows, sinks, shuffled block tables, several
 *     sequence lengths, a prompt step and then a decode step that reads what it cached;
 *   - FP8 attention against FP32-KV attention on the same inputs, within what E4M3 rounding
 *     costs (below).
 *
 * The FP8-vs-FP32 bound. E4M3 keeps 3 mantissa bits, so a rounded value is off by at most 2^-4
 * of itself (half an ulp; more only for subnormals, |x| < 2^-6); over Gaussian data the relative
 * L2 rounding error of K and V (eps_k, eps_v, measured per case) is ~2.7%. V's error reaches the
 * output directly (it is a weighted mean of V rows, so its relative error is about eps_v); K's
 * moves each score by about eps_k times the score's spread (qmag here: scores ~ N(0, qmag^2)),
 * and the softmax weights with it. So the expected relative L2 of the output is about
 * e = sqrt(eps_v^2 + (qmag eps_k)^2) (measured: 0.6-0.9 e, tokens up to 1.1 e); the case must
 * stay within 2 e, each token within 3 e. And above 0.2 e: an "FP8" cache that quietly kept more
 * bits would pass the bound. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "numerics/numerics.h"
#include "test_util.h"

struct kcase {
	const char *name;
	int32_t nh, nkv, d, window, sinks;
	int32_t nseq;
	const int32_t *len;  /* positions per sequence; the batch holds all of them */
	double qmag;
};

struct prob {
	int32_t n, stride, nblocks, max_ctx;
	int32_t *tok, *pos, *seq, *table;
	float *q, *k, *v, *sinks;
};

static void prob_make(struct prob *p, const struct kcase *c)
{
	const int32_t kvw = c->nkv * c->d;
	int32_t maxlen = 1;
	p->n = 0;
	for (int32_t s = 0; s < c->nseq; s++) {
		p->n += c->len[s];
		maxlen = c->len[s] > maxlen ? c->len[s] : maxlen;
	}
	p->max_ctx = maxlen;
	p->stride = (maxlen + FP4S_KV_BLOCK - 1) / FP4S_KV_BLOCK;
	p->nblocks = c->nseq * p->stride + 3;
	p->tok = calloc((size_t)p->n, 4), p->pos = malloc((size_t)p->n * 4), p->seq = malloc((size_t)p->n * 4);
	p->table = malloc((size_t)c->nseq * p->stride * 4);
	p->q = malloc((size_t)p->n * c->nh * c->d * 4);
	p->k = malloc((size_t)p->n * kvw * 4), p->v = malloc((size_t)p->n * kvw * 4);
	p->sinks = malloc((size_t)c->nh * 4);
	/* a shuffled pool */
	int32_t *perm = malloc((size_t)p->nblocks * 4);
	for (int32_t i = 0; i < p->nblocks; i++)
		perm[i] = i;
	for (int32_t i = p->nblocks - 1; i > 0; i--) {
		const int32_t j = (int32_t)(t_rand_u64() % (uint64_t)(i + 1)), t = perm[i];
		perm[i] = perm[j], perm[j] = t;
	}
	for (int32_t i = 0; i < c->nseq * p->stride; i++)
		p->table[i] = perm[i];
	free(perm);
	int32_t i = 0;
	for (int32_t s = 0; s < c->nseq; s++)
		for (int32_t t = 0; t < c->len[s]; t++, i++)
			p->pos[i] = t, p->seq[i] = s;
	for (int64_t x = 0; x < (int64_t)p->n * c->nh * c->d; x++)
		p->q[x] = (float)(t_rand_normal() * c->qmag);
	/* V with a per-head offset, as real V has; K plain Gaussian */
	for (int32_t t = 0; t < p->n; t++)
		for (int32_t j = 0; j < kvw; j++) {
			p->k[(int64_t)t * kvw + j] = (float)t_rand_normal();
			p->v[(int64_t)t * kvw + j] = (float)(t_rand_normal() + 0.3 * ((j / c->d) % 3 - 1));
		}
	for (int32_t h = 0; h < c->nh; h++)
		p->sinks[h] = (float)(t_rand_normal() + 1.0);
}

static void prob_free(struct prob *p)
{
	free(p->tok), free(p->pos), free(p->seq), free(p->table);
	free(p->q), free(p->k), free(p->v), free(p->sinks);
}

/* the CPU backend's attention, with the cache in dtype, in two steps: every sequence's prompt
 * but its last token (one batch), then those last tokens (a decode step reading the cache the
 * first step wrote) */
static int run_backend(const struct kcase *c, const struct prob *p, enum fp4s_kv_dtype dtype, float *out)
{
	struct fp4s_error err = {0};
	struct fp4s_backend *be;
	if (fp4s_backend_cpu_create(&be, &err)) {
		CHECK_MSG(0, "cpu backend: %s", err.msg);
		return -1;
	}
	const int32_t kvw = c->nkv * c->d, qw = c->nh * c->d;
	const struct fp4s_attn_params ap = {c->nh, c->nkv, c->d, c->window, c->sinks ? p->sinks : NULL,
	                                    1.0f / sqrtf((float)c->d)};
	int32_t *idx = malloc((size_t)p->n * 4), *pos = malloc((size_t)p->n * 4), *seq = malloc((size_t)p->n * 4);
	float *q = malloc((size_t)p->n * qw * 4), *k = malloc((size_t)p->n * kvw * 4);
	float *v = malloc((size_t)p->n * kvw * 4), *o = malloc((size_t)p->n * qw * 4);
	for (int64_t x = 0; x < (int64_t)p->n * qw; x++)
		out[x] = NAN;
	int rc = be->kv_init(be, 2, kvw, p->nblocks, c->nseq, p->max_ctx, dtype, &err);
	for (int step = 0; step < 2 && !rc; step++) {
		int32_t m = 0;
		for (int32_t i = 0; i < p->n; i++) {
			const int last = i + 1 == p->n || p->seq[i + 1] != p->seq[i];
			if (last == step)
				idx[m++] = i;
		}
		for (int32_t j = 0; j < m; j++) {
			const int32_t i = idx[j];
			pos[j] = p->pos[i], seq[j] = p->seq[i];
			memcpy(q + (int64_t)j * qw, p->q + (int64_t)i * qw, (size_t)qw * 4);
			memcpy(k + (int64_t)j * kvw, p->k + (int64_t)i * kvw, (size_t)kvw * 4);
			memcpy(v + (int64_t)j * kvw, p->v + (int64_t)i * kvw, (size_t)kvw * 4);
		}
		const struct fp4s_batch b = {m, p->tok, pos, seq, p->table, p->stride};
		if (m == 0)
			continue;
		rc = be->begin(be, &b, &err);
		if (!rc) /* layer 1: the layer offset is exercised too */
			rc = be->attention(be, 1, q, k, v, &b, &ap, o, &err);
		for (int32_t j = 0; j < m && !rc; j++)
			memcpy(out + (int64_t)idx[j] * qw, o + (int64_t)j * qw, (size_t)qw * 4);
	}
	if (rc)
		CHECK_MSG(0, "%s: attention: %s", c->name, err.msg);
	free(idx), free(pos), free(seq), free(q), free(k), free(v), free(o);
	be->destroy(be);
	return rc;
}

/* double-precision attention over K/V as fp8 (1) or FP32 (0) keeps them */
static void reference(const struct kcase *c, const struct prob *p, int fp8, double *out)
{
	const int32_t kvw = c->nkv * c->d, G = c->nh / c->nkv;
	const double scale = 1.0 / sqrt((double)c->d);
	double *s = malloc((size_t)p->max_ctx * sizeof *s);
	/* token index of (sequence, position): the batch holds sequence s's positions in order */
	int32_t *first = malloc((size_t)c->nseq * 4);
	for (int32_t sq = 0, i = 0; sq < c->nseq; i += c->len[sq], sq++)
		first[sq] = i;
#define KV(arr, t, j) (fp8 ? fp4s_e4m3_to_f32(fp4s_f32_to_e4m3((arr)[(int64_t)(t) * kvw + (j)])) : (arr)[(int64_t)(t) * kvw + (j)])
	for (int32_t i = 0; i < p->n; i++) {
		const int32_t pi = p->pos[i], t0 = first[p->seq[i]];
		const int32_t start = c->window > 0 && pi - c->window + 1 > 0 ? pi - c->window + 1 : 0;
		for (int32_t h = 0; h < c->nh; h++) {
			const int32_t g = h / G;
			const float *qh = p->q + ((int64_t)i * c->nh + h) * c->d;
			double m = c->sinks ? p->sinks[h] : -INFINITY;
			for (int32_t t = start; t <= pi; t++) {
				double a = 0;
				for (int32_t j = 0; j < c->d; j++)
					a += (double)qh[j] * KV(p->k, t0 + t, g * c->d + j);
				s[t] = a * scale;
				m = s[t] > m ? s[t] : m;
			}
			double l = c->sinks ? exp(p->sinks[h] - m) : 0;
			for (int32_t t = start; t <= pi; t++)
				l += exp(s[t] - m);
			double *o = out + ((int64_t)i * c->nh + h) * c->d;
			for (int32_t j = 0; j < c->d; j++) {
				double a = 0;
				for (int32_t t = start; t <= pi; t++)
					a += exp(s[t] - m) * KV(p->v, t0 + t, g * c->d + j);
				o[j] = a / l;
			}
		}
	}
#undef KV
	free(s);
	free(first);
}

/* relative L2 of got against want over everything, and the worst token */
static double rel_l2(const float *got, const double *want, int32_t n, int64_t w, double *worst_tok, int *nan)
{
	double num = 0, den = 0;
	*worst_tok = 0;
	*nan = 0;
	for (int32_t i = 0; i < n; i++) {
		double tn = 0, td = 0;
		for (int64_t j = 0; j < w; j++) {
			const double g = got[i * w + j], y = want[i * w + j];
			*nan |= isnan(g);
			tn += (g - y) * (g - y);
			td += y * y;
		}
		num += tn, den += td;
		const double r = sqrt(tn / td);
		*worst_tok = r > *worst_tok ? r : *worst_tok;
	}
	return sqrt(num / den);
}

static void run_case(const struct kcase *c)
{
	struct prob p;
	prob_make(&p, c);
	const int64_t w = (int64_t)c->nh * c->d, nout = (int64_t)p.n * w;
	float *o8 = malloc((size_t)nout * 4), *o32 = malloc((size_t)nout * 4);
	double *ref8 = malloc((size_t)nout * 8), *ref32 = malloc((size_t)nout * 8);
	if (run_backend(c, &p, FP4S_KV_FP8, o8) || run_backend(c, &p, FP4S_KV_F32, o32))
		goto done;
	reference(c, &p, 1, ref8);
	reference(c, &p, 0, ref32);
	double tok8, tok32, tokx;
	int nan8, nan32, nanx;
	/* FP8 cache vs exact attention over the same E4M3 values: summation order only */
	const double e8 = rel_l2(o8, ref8, p.n, w, &tok8, &nan8);
	/* the FP32 cache likewise, for scale */
	const double e32 = rel_l2(o32, ref32, p.n, w, &tok32, &nan32);
	/* FP8 vs FP32 cache: what E4M3 rounding costs */
	double *o32d = malloc((size_t)nout * 8);
	for (int64_t x = 0; x < nout; x++)
		o32d[x] = o32[x];
	const double ex = rel_l2(o8, o32d, p.n, w, &tokx, &nanx);
	free(o32d);
	/* the rounding error of the cached values, and what it should cost the output */
	double nk = 0, dk = 0, nv = 0, dv = 0;
	for (int64_t x = 0; x < (int64_t)p.n * c->nkv * c->d; x++) {
		const double k = p.k[x], v = p.v[x];
		const double kq = fp4s_e4m3_to_f32(fp4s_f32_to_e4m3(p.k[x])), vq = fp4s_e4m3_to_f32(fp4s_f32_to_e4m3(p.v[x]));
		nk += (kq - k) * (kq - k), dk += k * k, nv += (vq - v) * (vq - v), dv += v * v;
	}
	const double eps_k = sqrt(nk / dk), eps_v = sqrt(nv / dv);
	const double expect = sqrt(eps_v * eps_v + c->qmag * c->qmag * eps_k * eps_k);
	printf("%-24s n=%4d: fp8 vs exact-on-fp8 %.2e (token %.2e), fp32 vs exact %.2e; eps k/v %.4f/%.4f, "
	       "fp8 vs fp32 %.4f = %.2f e (token %.2f e)\n", c->name, p.n, e8, tok8, e32, eps_k, eps_v, ex,
	       ex / expect, tokx / expect);
	CHECK_MSG(!nan8 && e8 <= 1e-5 && tok8 <= 1e-4, "%s: FP8 cache vs exact attention on its values: %.3g "
	          "(worst token %.3g)%s", c->name, e8, tok8, nan8 ? ", NaN" : "");
	CHECK_MSG(!nan32 && e32 <= 1e-5, "%s: FP32 cache vs exact: %.3g", c->name, e32);
	CHECK_MSG(ex <= 2 * expect && tokx <= 3 * expect, "%s: FP8 vs FP32 cache: %.3g (worst token %.3g), "
	          "expected about %.3g", c->name, ex, tokx, expect);
	CHECK_MSG(ex > 0.2 * expect, "%s: FP8 cache output equals FP32's to %.3g: not quantized?", c->name, ex);
done:
	free(o8), free(o32), free(ref8), free(ref32);
	prob_free(&p);
}

/* one key per sequence: the output is that key's V row as the cache holds it */
static void test_storage(void)
{
	/* specials and edges of the E4M3 grid, then random values of every scale */
	const float special[] = {0.0f, -0.0f, 448.0f, -448.0f, 449.0f, 463.9f, 464.0f, 465.0f, -1000.0f, 1e30f,
	                         INFINITY, -INFINITY, 0x1p-6f, 0x1p-9f, -0x1p-9f, 0x1p-10f, 0x1.8p-10f, 0x1p-11f,
	                         0x1.1p-10f, 1.0625f, 1.0625001f, 1.1875f, -2.5f, 240.0f, 232.0f, 3.14159f};
	const int32_t d = 64, nseq = 8, n = nseq;
	const int32_t ns = (int32_t)(sizeof special / sizeof special[0]);
	struct fp4s_error err = {0};
	struct fp4s_backend *be;
	if (fp4s_backend_cpu_create(&be, &err)) {
		CHECK_MSG(0, "cpu backend: %s", err.msg);
		return;
	}
	int32_t tok[8] = {0}, pos[8] = {0}, seq[8], table[8];
	float q[8 * 64], k[8 * 64], v[8 * 64], out[8 * 64];
	for (int32_t i = 0; i < n; i++)
		seq[i] = i, table[i] = (i * 5 + 3) % 11;
	for (int32_t x = 0; x < n * d; x++) {
		q[x] = (float)t_rand_normal();
		k[x] = (float)t_rand_normal();
		/* every special once, the rest log-uniform magnitudes from 2^-12 to 2^10 and both signs */
		v[x] = x < ns ? special[x] : (float)((t_rand_u64() & 1 ? 1 : -1) * exp2(-12 + 22 * t_rand_uniform()));
	}
	CHECK(be->kv_init(be, 1, d, 11, nseq, 16, FP4S_KV_FP8, &err) == FP4S_OK);
	const struct fp4s_batch b = {n, tok, pos, seq, table, 1};
	const struct fp4s_attn_params ap = {1, 1, d, 0, NULL, 0.125f};
	CHECK(be->begin(be, &b, &err) == FP4S_OK);
	CHECK(be->attention(be, 0, q, k, v, &b, &ap, out, &err) == FP4S_OK);
	int bad = 0;
	for (int32_t x = 0; x < n * d; x++) {
		const float want = fp4s_e4m3_to_f32(fp4s_f32_to_e4m3(v[x]));
		if (out[x] != want && bad++ < 5) /* (a stored -0 reads back as +0: 0 + 1 x -0) */
			fprintf(stderr, "storage: v = %a came back %a, e4m3 gives %a\n", v[x], out[x], want);
	}
	CHECK_MSG(bad == 0, "%d values not stored as E4M3", bad);
	/* the spec's values (docs/numerics.md): saturation, the tie at 2^-10, ties to even */
	CHECK(out[2] == 448.0f && out[3] == -448.0f && out[4] == 448.0f && out[7] == 448.0f && out[8] == -448.0f);
	CHECK(out[9] == 448.0f && out[10] == 448.0f && out[11] == -448.0f);
	CHECK(out[15] == 0.0f && out[16] == 0x1p-9f && out[17] == 0.0f);
	CHECK(out[19] == 1.0f && out[20] == 1.125f && out[21] == 1.25f && out[24] == 224.0f);
	be->destroy(be);
}

int main(void)
{
	t_seed_from_env();
	test_storage();
	static const int32_t l_short[] = {1, 2, 17}, l_mixed[] = {40, 5, 129, 16}, l_long[] = {300, 33};
	const struct kcase cases[] = {
	    {"llama3 gqa 32/8 d128", 32, 8, 128, 0, 0, 3, l_short, 1.0},
	    {"llama3 gqa 32/8 d128", 32, 8, 128, 0, 0, 2, l_long, 1.0},
	    {"gpt-oss sinks 64/8 d64", 64, 8, 64, 0, 1, 4, l_mixed, 1.0},
	    {"gpt-oss swa20 sinks", 16, 2, 64, 20, 1, 2, l_long, 1.0},
	    {"qwen3 32/4 d128 q x2", 32, 4, 128, 0, 0, 4, l_mixed, 2.0},
	    {"g1 8/8 d64 win7", 8, 8, 64, 7, 0, 4, l_mixed, 1.0},
	    {"g3 d32", 6, 2, 32, 0, 1, 3, l_short, 0.5},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		run_case(&cases[i]);
	return TEST_DONE();
}
