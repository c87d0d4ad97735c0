// test_gemm.cu (label gpu): the prefill GEMM fp4s_cuda_gemm against the CPU reference
// fp4s_cpu_matmul on fresh random inputs. NVFP4 / MXFP4 weights come from the real quantizers
// (numerics/quant.h): a pool of up to 1024 distinct Gaussian rows (magnitudes varying by 2^+-4 from
// row to row, 1% outliers) is quantized and row r of W is pool row (r * 7919 + salt) % pool, so
// neighbouring rows differ and a row or tile mix-up shows. Shapes: M in {16, 17, 64, 512, 1000},
// K in {2880, 4096, 14336}, rows in {2880, 4096, 5760, 14336}, bias on and off, both token tiles
// (64, 128), split-K (small grids), the v1 kernel forced, both FP4 decodes (table, prmt), tails (rows % 128, K % 64 == 32, M = 1),
// BF16 weights (cuBLAS), bad arguments. The Hopper wgmma kernel (gemm_wgmma.cu, the default there)
// is forced on its own cases: a one-block, one-step case first (descriptor and swizzle), then
// M in {16, 64, 512, 1000} x K in {2880, 4096, 14336}, all three token tiles (64, 128, 256),
// both block heights (128, 256 weight rows), split-K, rows not a multiple of 128, bias; where the device has no wgmma path those cases run
// the default kernel. The mma.sync v2 kernel is forced on the decode cases.
// Outputs are poisoned with NaN; every output is checked for NaN, and the values of up to 192
// rows (first, middle, last 64) against two CPU references over all tokens:
//   - x rounded to BF16 first (what the kernel multiplies): relative L2 <= 3e-5 (order of sums and
//     the tensor cores' FP32 accumulation, which is not IEEE round-to-nearest: 8e-6 seen at
//     K = 14336 on an H200);
//   - x in FP32 (the model's reference): relative L2 <= 5e-3, the W4A16 rounding of activations
//     (~2e-3 expected; a wrong layout gives ~1.4).
// `test_gemm [filter]` runs the cases whose name contains filter.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/e2m1_device.h"
#include "backend/cuda/gemm_cuda.h"
#include "numerics/numerics.h"
#include "numerics/quant.h"
#include "model/model.h"
#include "ops_test.h"
#include "test_util.h"

struct gcase {
	enum fp4s_wformat fmt;
	int64_t rows, k;
	int m;
	int bias;
	int bm;    /* 0 = automatic */
	int own_ws; /* 1: pass a workspace, 0: the stream-ordered allocation */
	int kernel; /* 0 = automatic, 1 = v1, 2 = v2, 3 = wgmma forced */
	int decode; /* 0 = automatic, 1 = byte table, 2 = byte permutes */
	int wrows;  /* wgmma's weight rows per block: 0 = automatic, 128, 256 */
};

struct hw {
	uint8_t *data, *scales;
	size_t data_b, scales_b;
	float ws2;
};

static int make_weights(const struct gcase *c, struct hw *h)
{
	const int64_t pool = c->rows < 1024 ? c->rows : 1024, k = c->k, n = pool * k;
	float *w = (float *)malloc((size_t)n * sizeof *w);
	for (int64_t r = 0; r < pool; r++) {
		const double mag = 0.02 * pow(2.0, (double)(t_rand_u64() % 9) - 4.0);
		for (int64_t i = 0; i < k; i++) {
			double v = t_rand_normal() * mag;
			if (t_rand_u64() % 97 == 0)
				v *= 8;
			w[r * k + i] = (float)v;
		}
	}
	struct fp4s_error err = {0};
	int rc = 0;
	const int64_t sb = c->fmt == FP4S_WF_NVFP4 ? k / 16 : c->fmt == FP4S_WF_MXFP4 ? k / 32 : 0;
	const int64_t db = c->fmt == FP4S_WF_BF16 ? k * 2 : k / 2; /* bytes per row */
	uint8_t *pq = (uint8_t *)malloc((size_t)(pool * db)), *ps = (uint8_t *)malloc((size_t)(pool * sb + 1));
	h->ws2 = 1.0f;
	if (c->fmt == FP4S_WF_NVFP4) {
		rc = fp4s_nvfp4_tensor_scale(w, (size_t)n, &h->ws2, &err);
		if (!rc)
			rc = fp4s_nvfp4_quantize(w, pool, k, h->ws2, pq, ps, &err);
	} else if (c->fmt == FP4S_WF_MXFP4) {
		rc = fp4s_mxfp4_quantize(w, pool, k, pq, ps, &err);
	} else {
		uint16_t *d = (uint16_t *)pq;
		for (int64_t i = 0; i < n; i++)
			d[i] = fp4s_f32_to_bf16(w[i]);
	}
	free(w);
	if (rc) {
		fprintf(stderr, "quantize failed: %s\n", err.msg);
		free(pq), free(ps);
		return rc;
	}
	h->data_b = (size_t)(c->rows * db);
	h->scales_b = (size_t)(c->rows * sb);
	h->data = (uint8_t *)malloc(h->data_b);
	h->scales = sb ? (uint8_t *)malloc(h->scales_b) : NULL;
	const uint64_t salt = t_rand_u64() % 1000;
	for (int64_t r = 0; r < c->rows; r++) {
		const int64_t p = (int64_t)(((uint64_t)r * 7919u + salt) % (uint64_t)pool);
		memcpy(h->data + r * db, pq + p * db, (size_t)db);
		if (sb)
			memcpy(h->scales + r * sb, ps + p * sb, (size_t)sb);
	}
	free(pq), free(ps);
	return 0;
}

/* CPU reference for rows [r0, r0 + nr) over all tokens, into ref [m, nr]. */
static int cpu_ref_rows(const struct gcase *c, const struct hw *h, const float *x, const float *bias,
                        int64_t r0, int64_t nr, float *ref)
{
	const int64_t db = c->fmt == FP4S_WF_BF16 ? c->k * 2 : c->k / 2;
	const int64_t sb = c->fmt == FP4S_WF_NVFP4 ? c->k / 16 : c->fmt == FP4S_WF_MXFP4 ? c->k / 32 : 0;
	struct fp4s_mat wc = {c->fmt, nr, c->k, h->data + r0 * db, sb ? h->scales + r0 * sb : NULL, h->ws2,
	                      bias ? bias + r0 : NULL};
	struct fp4s_error err = {0};
	if (fp4s_cpu_matmul(x, c->m, &wc, ref, &err)) {
		fprintf(stderr, "CPU reference failed: %s\n", err.msg);
		return 1;
	}
	return 0;
}

static int run_case(const struct gcase *c, const char *filter)
{
	char name[256];
	snprintf(name, sizeof name, "GEMM(%s,rows=%lld,K=%lld,M=%d%s,bm=%d%s%s%s)", fp4s_wformat_name(c->fmt),
	         (long long)c->rows, (long long)c->k, c->m, c->bias ? ",bias" : "", c->bm,
	         c->wrows == 256 ? ",r256" : c->wrows == 128 ? ",r128" : "",
	         c->own_ws ? ",ws" : "",
	         c->kernel == 1   ? ",v1"
	         : c->kernel == 3 ? ",wgmma"
	         : c->decode == 1 ? ",lut"
	         : c->decode == 2 ? ",prmt"
	         : c->kernel == 2 ? ",v2"
	                          : "");
	if (filter && !strstr(name, filter))
		return 0;
	struct hw h;
	if (make_weights(c, &h)) {
		t_fail++;
		return 1;
	}
	const int64_t nx = (int64_t)c->m * c->k, ny = (int64_t)c->m * c->rows;
	float *x = (float *)malloc((size_t)nx * sizeof *x + 4);
	float *xr = (float *)malloc((size_t)nx * sizeof *x + 4); /* x rounded to BF16 */
	float *bias = (float *)malloc((size_t)c->rows * sizeof *bias);
	float *ygpu = (float *)malloc((size_t)ny * sizeof *ygpu + 4);
	for (int64_t i = 0; i < nx; i++) {
		x[i] = (float)(t_rand_normal() * (t_rand_u64() % 50 == 0 ? 10.0 : 1.0));
		xr[i] = fp4s_bf16_to_f32(fp4s_f32_to_bf16(x[i]));
	}
	for (int64_t i = 0; i < c->rows; i++)
		bias[i] = (float)(t_rand_normal() * 0.1);

	uint8_t *dd, *ds = NULL;
	float *dx, *db, *dy;
	void *dws = NULL;
	CK(cudaMalloc(&dd, h.data_b));
	CK(cudaMemcpy(dd, h.data, h.data_b, cudaMemcpyHostToDevice));
	if (h.scales) {
		CK(fp4s_cuda_e2m1_permute(dd, h.data_b, 0)); /* the device's code layout */
		CK(cudaMalloc(&ds, h.scales_b));
		CK(cudaMemcpy(ds, h.scales, h.scales_b, cudaMemcpyHostToDevice));
	}
	CK(cudaMalloc(&dx, (size_t)nx * sizeof(float) + 4));
	CK(cudaMemcpy(dx, x, (size_t)nx * sizeof(float), cudaMemcpyHostToDevice));
	CK(cudaMalloc(&db, (size_t)c->rows * sizeof(float)));
	CK(cudaMemcpy(db, bias, (size_t)c->rows * sizeof(float), cudaMemcpyHostToDevice));
	CK(cudaMalloc(&dy, (size_t)ny * sizeof(float) + 4));
	struct fp4s_mat wd = {c->fmt, c->rows, c->k, dd, ds, h.ws2, c->bias ? db : NULL};
	struct fp4s_gemm_tune tune = {c->bm, c->kernel, c->decode, c->wrows};
	const size_t wsb = fp4s_cuda_gemm_workspace_bytes(&wd, c->m, &tune);
	if (c->own_ws)
		CK(cudaMalloc(&dws, wsb));
	for (int64_t i = 0; i < ny; i++)
		ygpu[i] = NAN;
	CK(cudaMemcpy(dy, ygpu, (size_t)ny * sizeof(float), cudaMemcpyHostToDevice));

	struct fp4s_error err = {0};
	int rc = fp4s_cuda_gemm_ex(&wd, dx, c->m, dy, dws, wsb, &tune, 0, &err);
	if (!rc)
		CK(cudaDeviceSynchronize());
	int failed = 0;
	if (rc) {
		fprintf(stderr, "%s: fp4s_cuda_gemm failed: %s\n", name, err.msg);
		failed = 1;
	} else {
		CK(cudaMemcpy(ygpu, dy, (size_t)ny * sizeof(float), cudaMemcpyDeviceToHost));
		int64_t nan_at = -1;
		for (int64_t i = 0; i < ny && nan_at < 0; i++)
			if (isnan(ygpu[i]))
				nan_at = i;
		/* row ranges to check: everything when small, else first / middle / last 64 */
		int64_t ranges[3][2];
		int nrange = 0;
		if (c->rows <= 192) {
			ranges[nrange][0] = 0, ranges[nrange++][1] = c->rows;
		} else {
			ranges[nrange][0] = 0, ranges[nrange++][1] = 64;
			ranges[nrange][0] = c->rows / 2 - 37, ranges[nrange++][1] = 64; /* not tile-aligned */
			ranges[nrange][0] = c->rows - 64, ranges[nrange++][1] = 64;
		}
		double n32 = 0, d32 = 0, nbf = 0, dbf = 0, worst = -1, wg = 0, wb = 0;
		int64_t wt = 0, wr = 0, nbad = 0;
		for (int ri = 0; ri < nrange && !failed; ri++) {
			const int64_t r0 = ranges[ri][0], nr = ranges[ri][1];
			float *ref = (float *)malloc((size_t)(c->m * nr) * sizeof *ref + 4);
			float *refb = (float *)malloc((size_t)(c->m * nr) * sizeof *ref + 4);
			if (cpu_ref_rows(c, &h, x, c->bias ? bias : NULL, r0, nr, ref) ||
			    cpu_ref_rows(c, &h, xr, c->bias ? bias : NULL, r0, nr, refb)) {
				failed = 1;
			} else {
				for (int64_t t = 0; t < c->m; t++)
					for (int64_t r = 0; r < nr; r++) {
						const double g = ygpu[t * c->rows + r0 + r];
						const double a = ref[t * nr + r], b = refb[t * nr + r];
						n32 += (g - a) * (g - a), d32 += a * a;
						nbf += (g - b) * (g - b), dbf += b * b;
						/* where it is worst, and how many are off by more than 1e-3 relative
						 * to the row's scale: a layout error shows as a pattern */
						const double ad = fabs(g - b);
						if (!(ad <= 1e-3 * (fabs(b) + 1e-2)))
							nbad++;
						if (!(ad <= worst))
							worst = ad, wg = g, wb = b, wt = t, wr = r0 + r;
					}
			}
			free(ref), free(refb);
		}
		const double rel32 = d32 > 0 ? sqrt(n32 / d32) : sqrt(n32);
		const double relbf = dbf > 0 ? sqrt(nbf / dbf) : sqrt(nbf);
		if (failed || nan_at >= 0 || !(rel32 <= 5e-3) || !(relbf <= 3e-5)) {
			fprintf(stderr, "%s: FAIL rel L2 %.3g vs FP32 x, %.3g vs BF16 x", name, rel32, relbf);
			if (nan_at >= 0)
				fprintf(stderr, ", NaN at token %lld row %lld", (long long)(nan_at / c->rows),
				        (long long)(nan_at % c->rows));
			fprintf(stderr, "; worst at token %lld row %lld: %.6g vs %.6g; %lld of %lld off", (long long)wt,
			        (long long)wr, wg, wb, (long long)nbad, (long long)c->m * (c->rows <= 192 ? c->rows : 192));
			fputc('\n', stderr);
			failed = 1;
		} else if (getenv("FP4S_TEST_VERBOSE")) {
			printf("%s: rel L2 %.3g vs FP32 x, %.3g vs BF16 x\n", name, rel32, relbf);
		}
	}
	if (failed)
		t_fail++;
	else
		t_pass++;
	CK(cudaFree(dd));
	if (ds)
		CK(cudaFree(ds));
	if (dws)
		CK(cudaFree(dws));
	CK(cudaFree(dx));
	CK(cudaFree(db));
	CK(cudaFree(dy));
	free(h.data), free(h.scales), free(x), free(xr), free(bias), free(ygpu);
	return failed;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0); /* a run cut off by a time limit still shows how far it got */
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)
		TEST_SKIP("no CUDA device");
	t_seed_from_env();
	const char *filter = argc > 1 ? argv[1] : NULL;
	cudaDeviceProp p;
	CK(cudaGetDeviceProperties(&p, 0));
	printf("device: %s (compute capability %d.%d); wgmma kernel: %s\n", p.name, p.major, p.minor,
	       fp4s_cuda_gemm_has_wgmma() ? "yes" : "no");

	const enum fp4s_wformat fmts[] = {FP4S_WF_NVFP4, FP4S_WF_MXFP4};
	const int ms[] = {16, 17, 64, 512, 1000};
	const int64_t ks[] = {2880, 4096, 14336};
	const int64_t rows[] = {2880, 4096, 5760, 14336};
	/* every (format, M, K), rows cycling, bias alternating: 30 cases */
	int i = 0;
	for (size_t f = 0; f < 2; f++)
		for (size_t mi = 0; mi < 5; mi++)
			for (size_t ki = 0; ki < 3; ki++, i++) {
				struct gcase c = {fmts[f], rows[(mi + ki + f) % 4], ks[ki], ms[mi], i & 1, 0, i % 3 == 0};
				run_case(&c, filter);
			}
	/* both token tiles forced on each format; every rows value */
	for (size_t f = 0; f < 2; f++)
		for (int bm = 64; bm <= 128; bm *= 2)
			for (size_t ri = 0; ri < 4; ri++) {
				struct gcase c = {fmts[f], rows[ri], ri & 1 ? 4096 : 2880, ri & 1 ? 200 : 64, (int)(ri & 1),
				                  bm, 1};
				run_case(&c, filter);
			}
	/* tails: rows not a multiple of 128, K % 64 == 32 (MXFP4 and NVFP4), M = 1 and 0..few */
	for (size_t f = 0; f < 2; f++) {
		const struct gcase tails[] = {{fmts[f], 130, 4096, 33, 1, 0, 1},  {fmts[f], 77, 96, 19, 0, 128, 1},
		                              {fmts[f], 300, 2880, 1, 1, 64, 0}, {fmts[f], 129, 160, 129, 1, 128, 1},
		                              {fmts[f], 5, 32, 70, 0, 64, 1}};
		for (size_t t = 0; t < sizeof tails / sizeof tails[0]; t++)
			run_case(&tails[t], filter);
	}
	/* v1 (one step in registers) forced: it is what K % 64 == 32 gets, and the fallback */
	for (size_t f = 0; f < 2; f++) {
		const struct gcase v1[] = {{fmts[f], 4096, 4096, 512, 1, 0, 1, 1}, {fmts[f], 2880, 2880, 64, 0, 0, 0, 1},
		                           {fmts[f], 5760, 14336, 17, 1, 128, 1, 1}};
		for (size_t t = 0; t < sizeof v1 / sizeof v1[0]; t++)
			run_case(&v1[t], filter);
	}
	/* v2 with both decodes forced (the default is one of them) on both formats, with split-K and
	 * without */
	for (size_t f = 0; f < 2; f++)
		for (int dec = 1; dec <= 2; dec++) {
			const struct gcase d[] = {{fmts[f], 4096, 4096, 512, 1, 0, 1, 2, dec},
			                          {fmts[f], 2880, 2880, 40, 0, 0, 0, 2, dec},
			                          {fmts[f], 14336, 4096, 1000, 1, 0, 1, 2, dec},
			                          {fmts[f], 130, 14336, 70, 1, 64, 1, 2, dec}};
			for (size_t t = 0; t < sizeof d / sizeof d[0]; t++)
				run_case(&d[t], filter);
		}
	/* wgmma forced. First one block and one K step (descriptor, swizzle, fragment layouts), one
	 * block and several steps (the ring), then the shapes; token tiles 64 / 128 / 256 forced and
	 * automatic; rows % 128 != 0; split-K (few blocks) and M not a multiple of the tile */
	for (size_t f = 0; f < 2; f++) {
		const struct gcase wgc[] = {
			{fmts[f], 128, 64, 64, 0, 64, 1, 3},        {fmts[f], 128, 64, 256, 1, 256, 1, 3},
			{fmts[f], 128, 640, 128, 0, 128, 1, 3},     {fmts[f], 200, 2880, 77, 1, 0, 1, 3},
			{fmts[f], 4096, 4096, 16, 1, 0, 1, 3},      {fmts[f], 4096, 4096, 64, 0, 0, 0, 3},
			{fmts[f], 4096, 4096, 512, 1, 0, 1, 3},     {fmts[f], 4096, 14336, 512, 0, 0, 1, 3},
			{fmts[f], 14336, 4096, 1000, 1, 0, 1, 3},   {fmts[f], 2880, 2880, 1000, 0, 0, 0, 3},
			{fmts[f], 5760, 2880, 16, 1, 0, 1, 3},      {fmts[f], 2880, 14336, 64, 1, 0, 1, 3},
			{fmts[f], 2880, 4096, 512, 1, 64, 1, 3},    {fmts[f], 2880, 4096, 512, 1, 128, 1, 3},
			{fmts[f], 2880, 4096, 512, 1, 256, 1, 3},   {fmts[f], 4100, 2880, 1000, 1, 256, 1, 3},
			{fmts[f], 5, 4096, 300, 1, 0, 1, 3},        {fmts[f], 300, 2880, 1, 1, 0, 0, 3},
			/* 256 weight rows per block (four warpgroups) */
			{fmts[f], 256, 64, 128, 1, 128, 1, 3, 0, 256}, {fmts[f], 4096, 4096, 512, 1, 64, 1, 3, 0, 256},
			{fmts[f], 14336, 4096, 1000, 0, 128, 1, 3, 0, 256}, {fmts[f], 2880, 14336, 16, 1, 64, 0, 3, 0, 256},
			{fmts[f], 300, 2880, 200, 1, 0, 1, 3, 0, 256},
		};
		for (size_t t = 0; t < sizeof wgc / sizeof wgc[0]; t++) {
			struct gcase c = wgc[t];
			if (c.bm == 256 && !fp4s_cuda_gemm_has_wgmma())
				c.bm = 0; /* 256-token tiles exist only in the wgmma kernel */
			run_case(&c, filter);
		}
	}
	/* the mma.sync v2 kernel forced on a few of the same shapes (the wgmma kernel is the default
	 * where it runs) */
	for (size_t f = 0; f < 2; f++) {
		const struct gcase v2[] = {{fmts[f], 4096, 4096, 16, 1, 0, 1, 2}, {fmts[f], 2880, 14336, 512, 0, 0, 1, 2},
		                           {fmts[f], 5760, 2880, 1000, 1, 0, 0, 2}};
		for (size_t t = 0; t < sizeof v2 / sizeof v2[0]; t++)
			run_case(&v2[t], filter);
	}
	/* BF16 weights through cuBLAS */
	{
		const struct gcase bf[] = {{FP4S_WF_BF16, 2880, 2880, 64, 1, 0, 1},
		                           {FP4S_WF_BF16, 4096, 4096, 17, 0, 0, 0},
		                           {FP4S_WF_BF16, 1000, 2880, 512, 1, 0, 1}};
		for (size_t t = 0; t < sizeof bf / sizeof bf[0]; t++)
			run_case(&bf[t], filter);
	}
	/* bad arguments are errors, not launches */
	{
		struct fp4s_error err = {0};
		float *d;
		CK(cudaMalloc(&d, 1 << 16));
		struct fp4s_mat w = {FP4S_WF_NVFP4, 4, 48, d, (uint8_t *)d, 1.0f, NULL};
		CHECK(fp4s_cuda_gemm(&w, d, 16, d + 512, 0, &err) == FP4S_EUNSUPPORTED); /* K % 32 */
		CHECK(strstr(err.msg, "multiple") != NULL);
		w.cols = 64;
		w.scales = NULL;
		CHECK(fp4s_cuda_gemm(&w, d, 16, d + 512, 0, &err) == FP4S_EINVAL);
		w.scales = (uint8_t *)d;
		w.fmt = FP4S_WF_F16;
		CHECK(fp4s_cuda_gemm(&w, d, 16, d + 512, 0, &err) == FP4S_EUNSUPPORTED);
		w.fmt = FP4S_WF_MXFP4;
		CHECK(fp4s_cuda_gemm(&w, d, 0, d + 512, 0, &err) == FP4S_OK);
		CHECK(fp4s_cuda_gemm(&w, d, -1, d + 512, 0, &err) == FP4S_EINVAL);
		struct fp4s_gemm_tune bad = {96, 0, 0};
		CHECK(fp4s_cuda_gemm_ex(&w, d, 16, d + 512, NULL, 0, &bad, 0, &err) == FP4S_EINVAL);
		bad.bm = 0;
		bad.kernel = 4;
		CHECK(fp4s_cuda_gemm_ex(&w, d, 16, d + 512, NULL, 0, &bad, 0, &err) == FP4S_EINVAL);
		bad.kernel = 0;
		bad.decode = 3;
		CHECK(fp4s_cuda_gemm_ex(&w, d, 16, d + 512, NULL, 0, &bad, 0, &err) == FP4S_EINVAL);
		bad.decode = 0;
		bad.bm = 256; /* the wgmma kernel's tile only */
		bad.kernel = 2;
		CHECK(fp4s_cuda_gemm_ex(&w, d, 16, d + 512, NULL, 0, &bad, 0, &err) == FP4S_EINVAL);
		bad.bm = 0;
		bad.kernel = 0;
		bad.rows = 192;
		CHECK(fp4s_cuda_gemm_ex(&w, d, 16, d + 512, NULL, 0, &bad, 0, &err) == FP4S_EINVAL);
		CHECK(fp4s_cuda_gemm_ex(&w, d, 16, d + 512, d + 2048, 16, NULL, 0, &err) == FP4S_EINVAL);
		CK(cudaFree(d));
	}
	return TEST_DONE();
}
