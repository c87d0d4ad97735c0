// test_moe_gemm.cu (label gpu): the MoE batch path on the wgmma GEMM (moe_gemm.cu) against the
// CPU reference on fresh random inputs: n tokens pick K distinct experts each (one expert takes
// about half the tokens, so it spans several groups; the last expert none), the slots are grouped
// by fp4s_cuda_moe_group in tiles of 64 / 128 / 256 tokens, then fp4s_moe_gemm runs gate|up and
// the down projection with the SwiGLU between. NVFP4 (per-expert tensor scales, gate and up
// halves) and MXFP4 (biases, gpt-oss's interleaved clamped SwiGLU), weights from the real
// quantizers with row magnitudes spread by 2^+-4. Outputs are poisoned with NaN first.
// Checked: every row of h and o for NaN, and three windows of 64 output rows (first, middle,
// last) of every slot against fp4s_cpu_matmul:
//   - h with x rounded to BF16 (what the kernel multiplies): relative L2 <= 3e-5; with x in FP32
//     (the model): <= 5e-3 (the W4A16 rounding, ~2e-3; a wrong row, expert or layout gives ~1);
//   - o from the GPU's own h: SwiGLU in FP32 then BF16: <= 1e-4 (the CPU's expf may differ from
//     the GPU's by an ulp, which can move a BF16 rounding); without the BF16 rounding: <= 5e-3.
// Also: fp4s_moe_gemm_tile's rule, and bad shapes refused. `test_moe_gemm [filter]`.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/e2m1_device.h"
#include "backend/cuda/gemm_cuda.h"
#include "backend/cuda/moe_cuda.h"
#include "numerics/numerics.h"
#include "numerics/quant.h"
#include "model/model.h"
#include "ops_test.h"
#include "test_util.h"

struct mcase {
	enum fp4s_wformat fmt;
	int64_t H, I;
	int E, n, K;
	int interleaved; /* form: 1 gpt-oss SwiGLU on interleaved gate/up rows, 2 silu(gate) * up on
	                  * interleaved rows (qwen3 as uploaded), 0 gate half / up half */
	int bias;
	int per_expert_ws2;
	int bt;
};

/* One expert's [rows, k] projection in the format (host). */
struct hmat {
	uint8_t *data, *scales;
	float ws2;
};

/* shared_ws2: the NVFP4 tensor scale to use (experts of one stacked projection share it), or
 * NULL to compute this expert's own */
static int quantize(enum fp4s_wformat fmt, int64_t rows, int64_t k, const float *shared_ws2, struct hmat *m)
{
	float *w = (float *)malloc(sizeof(float) * (size_t)(rows * k));
	for (int64_t r = 0; r < rows; r++) {
		const double mag = 0.02 * pow(2.0, (double)(t_rand_u64() % 9) - 4.0);
		for (int64_t i = 0; i < k; i++)
			w[r * k + i] = (float)(t_rand_normal() * mag);
	}
	struct fp4s_error err = {0};
	m->data = (uint8_t *)malloc((size_t)(rows * k / 2));
	m->scales = (uint8_t *)malloc((size_t)(rows * k / 16));
	m->ws2 = 1.0f;
	int rc = 0;
	if (fmt == FP4S_WF_NVFP4) {
		if (shared_ws2)
			m->ws2 = *shared_ws2;
		else
			rc = fp4s_nvfp4_tensor_scale(w, (size_t)(rows * k), &m->ws2, &err);
		if (!rc)
			rc = fp4s_nvfp4_quantize(w, rows, k, m->ws2, m->data, m->scales, &err);
	} else {
		rc = fp4s_mxfp4_quantize(w, rows, k, m->data, m->scales, &err);
	}
	free(w);
	if (rc)
		fprintf(stderr, "quantize failed: %s\n", err.msg);
	return rc;
}

static float bf16_round(float v) { return fp4s_bf16_to_f32(fp4s_f32_to_bf16(v)); }

static float swiglu(const float *h, int64_t I, int64_t i, int interleaved)
{
	const float alpha = 1.702f, limit = 7.0f;
	if (interleaved == 1) {
		const float g = fminf(h[2 * i], limit), u = fminf(fmaxf(h[2 * i + 1], -limit), limit);
		return g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
	}
	if (interleaved == 2)
		return h[2 * i] / (1.0f + expf(-h[2 * i])) * h[2 * i + 1];
	return h[i] / (1.0f + expf(-h[i])) * h[I + i];
}

/* Stacked device copy of E experts' [rows, k] projections (+ bias [E][rows], ws2e). */
struct dstack {
	struct fp4s_stacked st;
	uint8_t *d, *s;
	float *b, *ws2e;
};

static void upload(const struct mcase *c, struct hmat *m, int64_t rows, int64_t k, const float *bias,
                   struct dstack *o)
{
	const size_t db = (size_t)(rows * k / 2), sb = (size_t)(rows * k / (c->fmt == FP4S_WF_NVFP4 ? 16 : 32));
	CK(cudaMalloc(&o->d, db * c->E));
	CK(cudaMalloc(&o->s, sb * c->E));
	o->b = NULL, o->ws2e = NULL;
	float ws2[64];
	for (int e = 0; e < c->E; e++) {
		CK(cudaMemcpy(o->d + db * e, m[e].data, db, cudaMemcpyHostToDevice));
		CK(fp4s_cuda_e2m1_permute(o->d + db * e, db, 0)); /* the device's code layout */
		CK(cudaMemcpy(o->s + sb * e, m[e].scales, sb, cudaMemcpyHostToDevice));
		ws2[e] = m[e].ws2;
	}
	if (bias) {
		CK(cudaMalloc(&o->b, sizeof(float) * (size_t)(rows * c->E)));
		CK(cudaMemcpy(o->b, bias, sizeof(float) * (size_t)(rows * c->E), cudaMemcpyHostToDevice));
	}
	if (c->per_expert_ws2) {
		CK(cudaMalloc(&o->ws2e, sizeof(float) * c->E));
		CK(cudaMemcpy(o->ws2e, ws2, sizeof(float) * c->E, cudaMemcpyHostToDevice));
	}
	const struct fp4s_stacked st = {c->fmt, rows, k, o->d, o->s, o->b, (int64_t)db, (int64_t)sb, m[0].ws2,
	                                o->ws2e, 0};
	o->st = st;
}

static void free_stack(struct dstack *o)
{
	CK(cudaFree(o->d));
	CK(cudaFree(o->s));
	CK(cudaFree(o->b));
	CK(cudaFree(o->ws2e));
}

/* rel L2 of got (rows of stride ld at gpos of each slot) against ref [slots][windows], over the
 * three 64-row windows; NaN anywhere in got counts as infinite */
struct win {
	int64_t r0[3], nr;
};

static struct win windows(int64_t rows)
{
	struct win w;
	w.nr = rows < 64 ? rows : 64;
	w.r0[0] = 0, w.r0[1] = (rows / 2) - w.nr / 2, w.r0[2] = rows - w.nr;
	if (w.r0[1] < 0)
		w.r0[1] = 0;
	return w;
}

/* CPU reference of rows [window] of expert e's projection for the cnt rows of xs ([cnt][k]) */
static void ref_rows(const struct mcase *c, const struct hmat *m, int64_t k, const float *bias, int64_t r0,
                     int64_t nr, const float *xs, int cnt, float *out)
{
	const int64_t db = k / 2, sb = k / (c->fmt == FP4S_WF_NVFP4 ? 16 : 32);
	struct fp4s_mat wc = {c->fmt, nr, k, m->data + r0 * db, m->scales + r0 * sb,
	                      m->ws2, bias ? bias + r0 : NULL};
	struct fp4s_error err = {0};
	if (fp4s_cpu_matmul(xs, cnt, &wc, out, &err))
		fprintf(stderr, "CPU reference failed: %s\n", err.msg);
}

static void run_case(const struct mcase *c, const char *filter)
{
	char name[200];
	snprintf(name, sizeof name, "MOE_GEMM(%s,H=%lld,I=%lld,E=%d,n=%d,K=%d,%s%s%s,bt=%d)", fp4s_wformat_name(c->fmt),
	         (long long)c->H, (long long)c->I, c->E, c->n, c->K, c->interleaved == 1 ? "interleaved" : c->interleaved ? "pairs-silu" : "halves",
	         c->bias ? ",bias" : "", c->per_expert_ws2 ? ",ws2e" : "", c->bt);
	if (filter && !strstr(name, filter))
		return;
	const int E = c->E, n = c->n, K = c->K, slots = n * K;
	const int64_t H = c->H, I = c->I;
	struct hmat *gu = (struct hmat *)calloc((size_t)E, sizeof *gu), *dn = (struct hmat *)calloc((size_t)E, sizeof *dn);
	int bad = 0;
	for (int e = 0; e < E; e++) {
		bad |= quantize(c->fmt, 2 * I, H, c->per_expert_ws2 || !e ? NULL : &gu[0].ws2, &gu[e]);
		bad |= quantize(c->fmt, H, I, c->per_expert_ws2 || !e ? NULL : &dn[0].ws2, &dn[e]);
	}
	float *bgu = NULL, *bdn = NULL;
	if (c->bias) {
		bgu = (float *)malloc(sizeof(float) * (size_t)(2 * I * E));
		bdn = (float *)malloc(sizeof(float) * (size_t)(H * E));
		for (int64_t i = 0; i < 2 * I * E; i++)
			bgu[i] = (float)(t_rand_normal() * 0.1);
		for (int64_t i = 0; i < H * E; i++)
			bdn[i] = (float)(t_rand_normal() * 0.1);
	}
	/* routing: K distinct experts a token; expert 1 in about half the tokens, expert E-1 never */
	int32_t *idx = (int32_t *)malloc(sizeof(int32_t) * (size_t)slots);
	for (int t = 0; t < n; t++) {
		int used[64] = {0};
		used[E - 1] = 1;
		int j = 0;
		if (t_rand_u64() % 2)
			idx[t * K + j++] = 1, used[1] = 1;
		while (j < K) {
			const int e = (int)(t_rand_u64() % (uint64_t)(E - 1));
			if (!used[e])
				idx[t * K + j++] = e, used[e] = 1;
		}
	}
	float *x = (float *)malloc(sizeof(float) * (size_t)(n * H));
	for (int64_t i = 0; i < n * H; i++)
		x[i] = (float)t_rand_normal();

	struct dstack sgu, sdn;
	upload(c, gu, 2 * I, H, bgu, &sgu);
	upload(c, dn, H, I, bdn, &sdn);
	struct fp4s_error err = {0};
	const int32_t nz = fp4s_cuda_moe_group_count(slots, E, c->bt);
	int32_t *didx, *dgpos, *dsrc, *dgexp, *dgoff, *dgm;
	float *dx, *dh, *doo;
	void *dxb;
	CK(cudaMalloc(&didx, sizeof(int32_t) * slots));
	CK(cudaMalloc(&dgpos, sizeof(int32_t) * slots));
	CK(cudaMalloc(&dsrc, sizeof(int32_t) * slots));
	CK(cudaMalloc(&dgexp, sizeof(int32_t) * nz));
	CK(cudaMalloc(&dgoff, sizeof(int32_t) * nz));
	CK(cudaMalloc(&dgm, sizeof(int32_t) * nz));
	CK(cudaMalloc(&dx, sizeof(float) * (size_t)(n * H)));
	CK(cudaMalloc(&dh, sizeof(float) * (size_t)(slots * 2 * I)));
	CK(cudaMalloc(&doo, sizeof(float) * (size_t)(slots * H)));
	CK(cudaMalloc(&dxb, fp4s_moe_gemm_scratch_bytes(slots, H, I)));
	CK(cudaMemcpy(didx, idx, sizeof(int32_t) * slots, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dx, x, sizeof(float) * (size_t)(n * H), cudaMemcpyHostToDevice));
	CK(cudaMemset(dh, 0xFF, sizeof(float) * (size_t)(slots * 2 * I))); /* NaN */
	CK(cudaMemset(doo, 0xFF, sizeof(float) * (size_t)(slots * H)));
	int rc = fp4s_cuda_moe_group(didx, slots, K, E, c->bt, dgpos, dsrc, dgexp, dgoff, dgm, 0, &err);
	if (!rc)
		rc = fp4s_moe_gemm(&sgu.st, &sdn.st, dgexp, dgoff, dgm, nz, c->bt, dx, dsrc, slots, c->interleaved, 1.702f,
		                   7.0f, dh, dxb, doo, 0, &err);
	CK(cudaDeviceSynchronize());
	if (rc) {
		fprintf(stderr, "%s: failed: %d %s\n", name, rc, err.msg);
		bad = 1;
	}
	float *h = (float *)malloc(sizeof(float) * (size_t)(slots * 2 * I)), *o = (float *)malloc(sizeof(float) * (size_t)(slots * H));
	int32_t *gpos = (int32_t *)malloc(sizeof(int32_t) * slots);
	CK(cudaMemcpy(h, dh, sizeof(float) * (size_t)(slots * 2 * I), cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(o, doo, sizeof(float) * (size_t)(slots * H), cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(gpos, dgpos, sizeof(int32_t) * slots, cudaMemcpyDeviceToHost));
	int nan = 0;
	for (int64_t i = 0; i < slots * 2 * I; i++)
		nan += isnan(h[i]);
	for (int64_t i = 0; i < slots * H; i++)
		nan += isnan(o[i]);
	if (nan) {
		fprintf(stderr, "%s: %d outputs not written (NaN)\n", name, nan);
		bad = 1;
	}
	/* per expert: its slots' inputs, the references over the windows, compared row by row */
	double e2[4] = {0}, r2[4] = {0}; /* h bf16, h fp32, o bf16, o fp32 */
	const struct win wh = windows(2 * I), wo = windows(H);
	float *xb = (float *)malloc(sizeof(float) * (size_t)(slots * H)), *xf = (float *)malloc(sizeof(float) * (size_t)(slots * H));
	float *ab = (float *)malloc(sizeof(float) * (size_t)(slots * I)), *af = (float *)malloc(sizeof(float) * (size_t)(slots * I));
	int32_t *sl = (int32_t *)malloc(sizeof(int32_t) * slots);
	float *ref = (float *)malloc(sizeof(float) * (size_t)slots * 64);
	for (int e = 0; e < E && !bad; e++) {
		int cnt = 0;
		for (int s = 0; s < slots; s++)
			if (idx[s] == e)
				sl[cnt++] = s;
		if (!cnt)
			continue;
		for (int i = 0; i < cnt; i++) {
			const float *xr = x + (int64_t)(sl[i] / K) * H;
			const float *hr = h + (int64_t)gpos[sl[i]] * 2 * I;
			for (int64_t k = 0; k < H; k++)
				xf[i * H + k] = xr[k], xb[i * H + k] = bf16_round(xr[k]);
			for (int64_t k = 0; k < I; k++) {
				af[i * I + k] = swiglu(hr, I, k, c->interleaved);
				ab[i * I + k] = bf16_round(af[i * I + k]);
			}
		}
		for (int pass = 0; pass < 4; pass++) {
			const int down = pass >= 2;
			const struct win w = down ? wo : wh;
			for (int wi = 0; wi < 3; wi++) {
				ref_rows(c, down ? &dn[e] : &gu[e], down ? I : H,
				         down ? (bdn ? bdn + H * e : NULL) : (bgu ? bgu + 2 * I * e : NULL), w.r0[wi], w.nr,
				         pass == 0 ? xb : pass == 1 ? xf : pass == 2 ? ab : af, cnt, ref);
				for (int i = 0; i < cnt; i++)
					for (int64_t r = 0; r < w.nr; r++) {
						const double g = down ? o[(int64_t)gpos[sl[i]] * H + w.r0[wi] + r]
						                      : h[(int64_t)gpos[sl[i]] * 2 * I + w.r0[wi] + r];
						const double d = g - ref[i * w.nr + r];
						e2[pass] += d * d;
						r2[pass] += (double)ref[i * w.nr + r] * ref[i * w.nr + r];
					}
			}
		}
	}
	const double lim[4] = {3e-5, 5e-3, 1e-4, 5e-3};
	for (int p = 0; p < 4 && !bad; p++) {
		const double rel = sqrt(e2[p] / r2[p]);
		if (!(rel <= lim[p])) {
			fprintf(stderr, "%s: FAIL %s rel L2 %.3g (limit %.0e)\n", name,
			        p == 0 ? "h (BF16 x)" : p == 1 ? "h (FP32 x)" : p == 2 ? "o (BF16 act)" : "o (FP32 act)", rel,
			        lim[p]);
			bad = 1;
		}
	}
	if (!bad)
		printf("%s: rel L2 h %.2e / %.2e, o %.2e / %.2e\n", name, sqrt(e2[0] / r2[0]), sqrt(e2[1] / r2[1]),
		       sqrt(e2[2] / r2[2]), sqrt(e2[3] / r2[3]));
	if (bad)
		t_fail++;
	else
		t_pass++;
	free_stack(&sgu);
	free_stack(&sdn);
	CK(cudaFree(didx));
	CK(cudaFree(dgpos));
	CK(cudaFree(dsrc));
	CK(cudaFree(dgexp));
	CK(cudaFree(dgoff));
	CK(cudaFree(dgm));
	CK(cudaFree(dx));
	CK(cudaFree(dh));
	CK(cudaFree(doo));
	CK(cudaFree(dxb));
	for (int e = 0; e < E; e++)
		free(gu[e].data), free(gu[e].scales), free(dn[e].data), free(dn[e].scales);
	free(gu), free(dn), free(bgu), free(bdn), free(idx), free(x), free(h), free(o), free(gpos);
	free(xb), free(xf), free(ab), free(af), free(sl), free(ref);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0); /* a run cut off by a time limit still shows how far it got */
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)
		TEST_SKIP("no CUDA device");
	t_seed_from_env();
	const char *filter = argc > 1 ? argv[1] : NULL;
	if (!fp4s_cuda_gemm_has_wgmma())
		TEST_SKIP("no wgmma kernel on this device/build (sm_90a image on compute capability 9.0)");

	const struct mcase cases[] = {
		/* gpt-oss-like: MXFP4, biases, interleaved; every token tile */
		{FP4S_WF_MXFP4, 2880, 2880, 8, 150, 4, 1, 1, 0, 64},
		{FP4S_WF_MXFP4, 2880, 2880, 8, 150, 4, 1, 1, 0, 128},
		{FP4S_WF_MXFP4, 2880, 2880, 8, 300, 4, 1, 1, 0, 256},
		/* qwen3-moe-like: NVFP4, per-expert scales, halves */
		{FP4S_WF_NVFP4, 2048, 768, 16, 120, 8, 0, 0, 1, 64},
		{FP4S_WF_NVFP4, 2048, 768, 16, 200, 8, 0, 0, 1, 256},
		/* the same with gate and up rows interleaved at upload */
		{FP4S_WF_NVFP4, 2048, 768, 16, 120, 8, 2, 0, 1, 128},
		/* the other pairings, and small groups (most tiles mostly empty) */
		{FP4S_WF_NVFP4, 1024, 512, 6, 90, 2, 1, 1, 1, 128},
		{FP4S_WF_MXFP4, 256, 128, 4, 5, 2, 0, 0, 0, 64},
		{FP4S_WF_NVFP4, 256, 256, 5, 3, 3, 0, 1, 1, 256},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		run_case(&cases[i], filter);

	/* the tile rule and the refusals */
	if ((!filter || strstr("RULE", filter)) && !getenv("FP4S_MOE_GEMM_MIN") && !getenv("FP4S_MOE_GEMM_BT") &&
	    !getenv("FP4S_MOE_GEMM")) {
		struct fp4s_stacked gu = {FP4S_WF_MXFP4, 5760, 2880, (void *)256, (uint8_t *)256, NULL, 0, 0, 1.0f, NULL, 0};
		struct fp4s_stacked dn = {FP4S_WF_MXFP4, 2880, 2880, (void *)256, (uint8_t *)256, NULL, 0, 0, 1.0f, NULL, 0};
		CHECK(fp4s_moe_gemm_tile(&gu, &dn, 2048, 32, 1) == 128); /* 64 an expert: 80 -> 128 */
		CHECK(fp4s_moe_gemm_tile(&gu, &dn, 32768, 32, 1) == 256);
		CHECK(fp4s_moe_gemm_tile(&gu, &dn, 1024, 32, 1) == 64);
		CHECK(fp4s_moe_gemm_tile(&gu, &dn, 8, 32, 1) == 64); /* a quarter of a token an expert */
		CHECK(fp4s_moe_gemm_tile(&gu, &dn, 64, 32, 2) == 64);
		CHECK(fp4s_moe_gemm_tile(&gu, &dn, 32768, 32, 0) == 0);
		dn.cols = 2848;                                    /* K % 64 != 0 */
		CHECK(fp4s_moe_gemm_tile(&gu, &dn, 2048, 32, 1) == 0);
		dn.cols = 2880;
		dn.fmt = FP4S_WF_BF16;
		CHECK(fp4s_moe_gemm_tile(&gu, &dn, 2048, 32, 1) == 0);
		dn.fmt = FP4S_WF_MXFP4;
		struct fp4s_error err = {0};
		CHECK(fp4s_moe_gemm(&gu, &dn, NULL, NULL, NULL, 1, 96, NULL, NULL, 1, 1, 1.0f, 1.0f, NULL, NULL, NULL, 0,
		                    &err) == FP4S_EINVAL);
		CHECK(strstr(err.msg, "tile 96") != NULL);
	}
	return TEST_DONE();
}
