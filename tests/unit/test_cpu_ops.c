/* test_cpu_ops.c: the CPU reference ops against independent double-precision computations on
 * fresh random inputs: matmul for every weight format (weights quantized by the numerics module
 * and dequantized by its own decoder), RMSNorm, RoPE frequency tables (llama3, yarn) and
 * rotation, the SwiGLU variants. */
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu_ops.h"
#include "numerics/numerics.h"
#include "numerics/quant.h"
#include "test_util.h"

static void test_matmul(enum fp4s_wformat fmt, int64_t rows, int64_t cols, int64_t ntok, int bias)
{
	struct fp4s_error err = {0};
	const int64_t n = rows * cols;
	float *wf = malloc((size_t)n * sizeof *wf), *deq = malloc((size_t)n * sizeof *deq);
	float *x = malloc((size_t)(ntok * cols) * sizeof *x), *y = malloc((size_t)(ntok * rows) * sizeof *y);
	float *b = malloc((size_t)rows * sizeof *b);
	uint8_t *q = malloc((size_t)n), *sf = malloc((size_t)n / 16 + 1);
	uint16_t *h = malloc((size_t)n * 2);
	for (int64_t i = 0; i < n; i++)
		wf[i] = (float)(t_rand_normal() * 0.02);
	for (int64_t i = 0; i < ntok * cols; i++)
		x[i] = (float)t_rand_normal();
	for (int64_t i = 0; i < rows; i++)
		b[i] = (float)t_rand_normal();
	struct fp4s_mat m = {.fmt = fmt, .rows = rows, .cols = cols, .ws2 = 1.0f, .bias = bias ? b : NULL};
	switch (fmt) {
	case FP4S_WF_NVFP4:
		CHECK(fp4s_nvfp4_tensor_scale(wf, (size_t)n, &m.ws2, &err) == 0);
		CHECK(fp4s_nvfp4_quantize(wf, rows, cols, m.ws2, q, sf, &err) == 0);
		CHECK(fp4s_nvfp4_dequantize(q, sf, m.ws2, rows, cols, deq, &err) == 0);
		m.data = q, m.scales = sf;
		break;
	case FP4S_WF_MXFP4:
		CHECK(fp4s_mxfp4_quantize(wf, rows, cols, q, sf, &err) == 0);
		CHECK(fp4s_mxfp4_dequantize(q, sf, rows, cols, deq, &err) == 0);
		m.data = q, m.scales = sf;
		break;
	case FP4S_WF_BF16:
	case FP4S_WF_F16:
		for (int64_t i = 0; i < n; i++) {
			h[i] = fmt == FP4S_WF_BF16 ? fp4s_f32_to_bf16(wf[i]) : fp4s_f32_to_f16(wf[i]);
			deq[i] = fmt == FP4S_WF_BF16 ? fp4s_bf16_to_f32(h[i]) : fp4s_f16_to_f32(h[i]);
		}
		m.data = h;
		break;
	default:
		memcpy(deq, wf, (size_t)n * sizeof *wf);
		m.data = wf;
	}
	for (int64_t i = 0; i < ntok * rows; i++)
		y[i] = NAN; /* poison: every output must be written */
	CHECK(fp4s_cpu_matmul(x, ntok, &m, y, &err) == 0);
	double num = 0, den = 0;
	int64_t unwritten = 0;
	for (int64_t t = 0; t < ntok; t++)
		for (int64_t r = 0; r < rows; r++) {
			double ref = bias ? b[r] : 0;
			for (int64_t k = 0; k < cols; k++)
				ref += (double)x[t * cols + k] * deq[r * cols + k];
			double d = y[t * rows + r] - ref;
			unwritten += isnan(y[t * rows + r]);
			num += d * d;
			den += ref * ref;
		}
	CHECK_EQ_INT(unwritten, 0);
	CHECK_MSG(sqrt(num / den) < 1e-5, "matmul %s [%lld,%lld] x %lld: rel L2 %.3g",
	          fp4s_wformat_name(fmt), (long long)rows, (long long)cols, (long long)ntok,
	          sqrt(num / den));
	/* row decode agrees with the numerics module's dequantizer exactly */
	float *row = malloc((size_t)cols * sizeof *row);
	fp4s_cpu_mat_row(&m, rows - 1, row);
	int64_t diff = 0;
	for (int64_t k = 0; k < cols; k++)
		diff += row[k] != deq[(rows - 1) * cols + k];
	CHECK_EQ_INT(diff, 0);
	free(row), free(wf), free(deq), free(x), free(y), free(b), free(q), free(sf), free(h);
}

static void test_rmsnorm(void)
{
	const int64_t ntok = 3, n = 2880;
	float *x = malloc(ntok * n * sizeof *x), *w = malloc(n * sizeof *w), *y = malloc(ntok * n * sizeof *y);
	for (int64_t i = 0; i < ntok * n; i++)
		x[i] = (float)(t_rand_normal() * 5);
	for (int64_t i = 0; i < n; i++)
		w[i] = (float)(1 + 0.1 * t_rand_normal());
	for (int kind = 0; kind < 2; kind++) {
		fp4s_cpu_rmsnorm(x, w, ntok, n, 1e-5f, (enum fp4s_norm_kind)kind, y);
		double worst = 0;
		for (int64_t t = 0; t < ntok; t++) {
			double ss = 0;
			for (int64_t i = 0; i < n; i++)
				ss += (double)x[t * n + i] * x[t * n + i];
			double inv = 1 / sqrt(ss / n + 1e-5);
			for (int64_t i = 0; i < n; i++) {
				double ref = x[t * n + i] * inv * (kind ? 1 + w[i] : w[i]);
				worst = fmax(worst, fabs(y[t * n + i] - ref) / (fabs(ref) + 1e-3));
			}
		}
		CHECK_MSG(worst < 1e-5, "rmsnorm kind %d worst rel error %.3g", kind, worst);
	}
	free(x), free(w), free(y);
}

static void test_rope(void)
{
	struct fp4s_error err = {0};
	float inv[64], ms;
	/* Llama 3.1 8B: base 500000, d 128, factor 8: 29 unchanged, 29 divided by 8, 6 smoothed */
	struct fp4s_rope l3 = {.type = FP4S_ROPE_LLAMA3, .theta = 500000, .factor = 8,
	                       .low_freq_factor = 1, .high_freq_factor = 4,
	                       .original_max_position_embeddings = 8192};
	struct fp4s_rope plain = l3;
	plain.type = FP4S_ROPE_DEFAULT;
	float base[64];
	CHECK(fp4s_rope_inv_freq(&plain, 128, base, &ms, &err) == 0 && ms == 1.0f);
	CHECK(fp4s_rope_inv_freq(&l3, 128, inv, &ms, &err) == 0);
	int same = 0, div8 = 0, smooth = 0;
	for (int i = 0; i < 64; i++) {
		if (inv[i] == base[i])
			same++;
		else if (fabsf(inv[i] - base[i] / 8) <= 1e-7f * base[i])
			div8++;
		else
			smooth++;
	}
	CHECK_EQ_INT(same, 29);
	CHECK_EQ_INT(div8, 29);
	CHECK_EQ_INT(smooth, 6);
	/* gpt-oss yarn: base 150000, r 64, factor 32, L0 4096, no truncation: the ramp runs from
	 * 8.0928 to 17.3980, so dims 0..8 keep the base frequency and 18..31 are divided by 32;
	 * attention factor 0.1 ln 32 + 1 = 1.34657 */
	struct fp4s_rope y = {.type = FP4S_ROPE_YARN, .theta = 150000, .factor = 32,
	                      .original_max_position_embeddings = 4096, .beta_fast = 32,
	                      .beta_slow = 1, .truncate = 0};
	struct fp4s_rope yb = y;
	yb.type = FP4S_ROPE_DEFAULT;
	CHECK(fp4s_rope_inv_freq(&yb, 64, base, &ms, &err) == 0);
	CHECK(fp4s_rope_inv_freq(&y, 64, inv, &ms, &err) == 0);
	CHECK_NEAR(ms, 1.34657, 1e-5);
	int ok_lo = 1, ok_hi = 1, ok_mid = 1;
	for (int i = 0; i <= 8; i++)
		ok_lo &= inv[i] == base[i];
	for (int i = 18; i < 32; i++)
		ok_hi &= fabsf(inv[i] - base[i] / 32) <= 1e-6f * base[i];
	for (int i = 9; i <= 17; i++)
		ok_mid &= inv[i] < base[i] && inv[i] > base[i] / 32;
	CHECK(ok_lo && ok_hi && ok_mid);
	/* rotation: position 0 is the identity (times mscale); norms scale by mscale; the pair
	 * (i, i + r/2) rotates by pos * inv_freq[i] */
	float v[2 * 64], v0[2 * 64];
	for (int i = 0; i < 128; i++)
		v0[i] = v[i] = (float)t_rand_normal();
	fp4s_cpu_rope(v, 2, 64, 64, base, 1.0f, 0);
	CHECK(memcmp(v, v0, sizeof v) == 0);
	fp4s_cpu_rope(v, 2, 64, 64, base, 1.0f, 1234);
	double a = 1234.0 * base[5];
	CHECK_NEAR(v[64 + 5], v0[64 + 5] * cos(a) - v0[64 + 37] * sin(a), 2e-3);
	CHECK_NEAR(v[64 + 37], v0[64 + 37] * cos(a) + v0[64 + 5] * sin(a), 2e-3);
	struct fp4s_rope bad = {.theta = 10000};
	CHECK_EQ_INT(fp4s_rope_inv_freq(&bad, 63, inv, &ms, &err), FP4S_EINVAL);
}

static void test_swiglu(void)
{
	float gu[8] = {10.0f, 10.0f, -3.0f, -9.0f, 1.0f, 0.5f, 7.5f, -7.5f}, out[4];
	fp4s_cpu_swiglu_oai(gu, 4, 1.702f, 7.0f, out);
	/* g clamped above at 7, u clamped to [-7, 7] */
	CHECK_NEAR(out[0], 7.0 / (1 + exp(-1.702 * 7.0)) * 8.0, 1e-5);
	CHECK_NEAR(out[1], -3.0 / (1 + exp(1.702 * 3.0)) * (-6.0), 1e-5);
	CHECK_NEAR(out[2], 1.0 / (1 + exp(-1.702)) * 1.5, 1e-6);
	CHECK_NEAR(out[3], 7.0 / (1 + exp(-1.702 * 7.0)) * (-6.0), 1e-5);
	float g[3] = {-2.0f, 0.0f, 3.0f}, u[3] = {1.0f, 5.0f, -2.0f}, o[3];
	fp4s_cpu_swiglu(g, u, 3, o);
	CHECK_NEAR(o[0], -2.0 / (1 + exp(2.0)), 1e-6);
	CHECK_NEAR(o[1], 0.0, 0);
	CHECK_NEAR(o[2], 3.0 / (1 + exp(-3.0)) * -2.0, 1e-5);
}

int main(void)
{
	t_seed_from_env();
	const enum fp4s_wformat fmts[] = {FP4S_WF_F32, FP4S_WF_BF16, FP4S_WF_F16, FP4S_WF_NVFP4,
	                                  FP4S_WF_MXFP4};
	for (size_t f = 0; f < 5; f++) {
		test_matmul(fmts[f], 96, 256, 1, 0);
		test_matmul(fmts[f], 37, 2880, 5, 1);
	}
	{
		struct fp4s_error err = {0};
		float x[48] = {0}, yv[2];
		uint8_t q[48] = {0}, sf[4] = {0x38, 0x38, 0x38, 0x38};
		struct fp4s_mat m = {.fmt = FP4S_WF_NVFP4, .rows = 1, .cols = 40, .data = q, .scales = sf,
		                     .ws2 = 1};
		CHECK_EQ_INT(fp4s_cpu_matmul(x, 1, &m, yv, &err), FP4S_EINVAL);
		CHECK(strstr(err.msg, "multiple") != NULL);
	}
	test_rmsnorm();
	test_rope();
	test_swiglu();
	return TEST_DONE();
}
