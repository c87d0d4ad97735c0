// test_quant.cu (label gpu): the CUDA activation quantizers against the CPU reference, bit for
// bit, on fresh random inputs of many shapes: BF16 and FP16, linear and swizzled scale layouts,
// padded row strides, misaligned inputs (the scalar-load path), and blocks seeded with NaN, +-Inf,
// +-0, subnormals and saturating values. Outputs are poisoned before each run so an unwritten byte
// shows up. `test_quant [filter]` runs only cases whose name contains filter.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/quant_cuda.h"
#include "numerics/numerics.h"
#include "numerics/quant.h"
#include "ops_test.h"
#include "test_util.h"

static uint16_t special_value(int dt, int which)
{
	const int bf = dt == FP4S_ACT_BF16;
	switch (which) {
	case 0: return bf ? 0x7FC0 : 0x7E00;            /* NaN */
	case 1: return bf ? 0xFFC1 : 0xFE01;            /* -NaN with payload */
	case 2: return bf ? 0x7F80 : 0x7C00;            /* +Inf */
	case 3: return bf ? 0xFF80 : 0xFC00;            /* -Inf */
	case 4: return 0x8000;                          /* -0 */
	case 5: return 0x0000;                          /* +0 */
	case 6: return bf ? 0x0001 : 0x0001;            /* smallest subnormal */
	case 7: return bf ? 0x807F : 0x83FF;            /* largest negative subnormal */
	case 8: return bf ? 0x7F7F : 0x7BFF;            /* largest finite */
	default: return bf ? 0xC7C3 : 0xF800;           /* large negative: saturates elements */
	}
}

static void fill(uint16_t *x, int64_t n, int dt, int specials, double scale)
{
	for (int64_t i = 0; i < n; i++) {
		float v = (float)(t_rand_normal() * scale);
		x[i] = dt == FP4S_ACT_BF16 ? fp4s_f32_to_bf16(v) : fp4s_f32_to_f16(v);
		if (specials && t_rand_u64() % 23 == 0)
			x[i] = special_value(dt, (int)(t_rand_u64() % 10));
	}
	/* some whole blocks of zeros and of subnormals: scale 0 and tiny-scale paths */
	if (specials && n >= 64) {
		memset(x, 0, 32 * sizeof *x);
		for (int i = 32; i < 64; i++)
			x[i] = (uint16_t)(t_rand_u64() % 64);
	}
}

struct qcase {
	int mx; /* 0 NVFP4, 1 MXFP4 */
	int dt;
	int64_t rows, k, ldx;
	int layout;
	int misalign; /* input pointer offset by one element: scalar-load path */
	int specials;
	double scale;
	int impl;
};

static int run_case(const struct qcase *c, const char *filter)
{
	char name[256];
	snprintf(name, sizeof name, "QUANT(%s,%s,rows=%lld,k=%lld,ldx=%lld,%s%s%s,scale=%g,%s)",
	         c->mx ? "mxfp4" : "nvfp4", c->dt == FP4S_ACT_BF16 ? "bf16" : "f16",
	         (long long)c->rows, (long long)c->k, (long long)c->ldx,
	         c->layout ? "swizzled" : "linear", c->misalign ? ",misaligned" : "",
	         c->specials ? ",specials" : "", c->scale, c->impl == FP4S_E2M1_SOFTWARE ? "sw" : "auto");
	if (filter && !strstr(name, filter))
		return 0;
	const int block = c->mx ? 32 : 16;
	const int64_t nb = c->k / block, nx = c->rows * c->ldx + c->misalign;
	const size_t qbytes = (size_t)(c->rows * c->k / 2);
	const size_t sfbytes = fp4s_sf_bytes(c->rows, nb, (enum fp4s_sf_layout)c->layout);
	uint16_t *x = (uint16_t *)malloc((size_t)nx * 2);
	uint8_t *q_ref = (uint8_t *)malloc(qbytes + 1), *q_gpu = (uint8_t *)malloc(qbytes + 1);
	uint8_t *s_ref = (uint8_t *)malloc(sfbytes + 1), *s_gpu = (uint8_t *)malloc(sfbytes + 1);
	fill(x, nx, c->dt, c->specials, c->scale);
	/* a realistic global scale from the data, as calibration would give */
	float amax = 0;
	for (int64_t i = 0; i < nx; i++) {
		float v = c->dt == FP4S_ACT_BF16 ? fp4s_bf16_to_f32(x[i]) : fp4s_f16_to_f32(x[i]);
		if (isfinite(v))
			amax = fmaxf(amax, fabsf(v));
	}
	const float gs = amax > 0 ? 2688.0f / amax : 1.0f;
	struct fp4s_error err = {0};
	const uint16_t *xin = x + c->misalign;
	int rc = c->mx ? fp4s_mxfp4_quantize_act(xin, (enum fp4s_act_dtype)c->dt, c->rows, c->k, c->ldx,
	                                         q_ref, s_ref, (enum fp4s_sf_layout)c->layout, &err)
	               : fp4s_nvfp4_quantize_act(xin, (enum fp4s_act_dtype)c->dt, c->rows, c->k, c->ldx,
	                                         gs, q_ref, s_ref, (enum fp4s_sf_layout)c->layout, &err);
	if (rc) {
		fprintf(stderr, "%s: CPU reference failed: %s\n", name, err.msg);
		t_fail++;
		return 1;
	}
	uint16_t *dx;
	uint8_t *dq, *ds;
	CK(cudaMalloc(&dx, (size_t)nx * 2 + 16));
	CK(cudaMalloc(&dq, qbytes + 16));
	CK(cudaMalloc(&ds, sfbytes + 16));
	CK(cudaMemcpy(dx, x, (size_t)nx * 2, cudaMemcpyHostToDevice));
	CK(cudaMemset(dq, 0xAB, qbytes + 16));
	CK(cudaMemset(ds, 0xAB, sfbytes + 16));
	rc = c->mx ? fp4s_cuda_mxfp4_quantize_act(dx + c->misalign, (enum fp4s_act_dtype)c->dt, c->rows,
	                                          c->k, c->ldx, dq, ds, (enum fp4s_sf_layout)c->layout,
	                                          (enum fp4s_e2m1_impl)c->impl, 0, &err)
	           : fp4s_cuda_nvfp4_quantize_act(dx + c->misalign, (enum fp4s_act_dtype)c->dt, c->rows,
	                                          c->k, c->ldx, gs, dq, ds,
	                                          (enum fp4s_sf_layout)c->layout,
	                                          (enum fp4s_e2m1_impl)c->impl, 0, &err);
	CK(cudaDeviceSynchronize());
	/* one byte past each output must still hold the poison: nothing written out of bounds */
	CK(cudaMemcpy(q_gpu, dq, qbytes + 1, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(s_gpu, ds, sfbytes + 1, cudaMemcpyDeviceToHost));
	int failed = 0;
	if (rc) {
		fprintf(stderr, "%s: CUDA quantizer failed: %s\n", name, err.msg);
		failed = 1;
	} else {
		size_t bad_q = 0, bad_s = 0, first_q = 0, first_s = 0;
		for (size_t i = 0; i < qbytes; i++)
			if (q_gpu[i] != q_ref[i] && bad_q++ == 0)
				first_q = i;
		for (size_t i = 0; i < sfbytes; i++)
			if (s_gpu[i] != s_ref[i] && bad_s++ == 0)
				first_s = i;
		if (bad_q || bad_s || q_gpu[qbytes] != 0xAB || s_gpu[sfbytes] != 0xAB) {
			failed = 1;
			fprintf(stderr, "%s: %zu/%zu element bytes differ (first %zu: gpu 0x%02x cpu 0x%02x), "
			        "%zu/%zu scale bytes differ (first %zu: gpu 0x%02x cpu 0x%02x), guard %02x %02x\n",
			        name, bad_q, qbytes, first_q, q_gpu[first_q], q_ref[first_q], bad_s, sfbytes,
			        first_s, s_gpu[first_s], s_ref[first_s], q_gpu[qbytes], s_gpu[sfbytes]);
		}
	}
	printf("%-90s %s\n", name, failed ? "FAIL" : "OK");
	failed ? t_fail++ : t_pass++;
	CK(cudaFree(dx));
	CK(cudaFree(dq));
	CK(cudaFree(ds));
	free(x), free(q_ref), free(q_gpu), free(s_ref), free(s_gpu);
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
	printf("device: %s (compute capability %d.%d)\n", p.name, p.major, p.minor);
	const int64_t shapes[][2] = {{1, 32},   {1, 4096}, {3, 96},     {7, 2880},  {16, 4096},
	                             {33, 640}, {128, 512}, {130, 1024}, {257, 128}, {512, 14336}};
	for (int mx = 0; mx < 2; mx++)
		for (int dt = 0; dt < 2; dt++)
			for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
				for (int variant = 0; variant < 4; variant++) {
					struct qcase c;
					c.mx = mx;
					c.dt = dt;
					c.rows = shapes[s][0];
					c.k = shapes[s][1];
					c.ldx = c.k + (variant == 2 ? 64 : 0);
					c.layout = variant & 1;
					c.misalign = variant == 3;
					c.specials = variant != 0;
					/* magnitudes from tiny (scale underflow) to huge (saturation) */
					const double scales[] = {1e-6, 0.02, 1.0, 3e3};
					c.scale = scales[(s + variant) % 4];
					c.impl = (variant & 1) ? FP4S_E2M1_AUTO : FP4S_E2M1_SOFTWARE;
					run_case(&c, filter);
				}
	/* bad arguments come back as errors, not crashes */
	{
		struct fp4s_error err = {0};
		uint8_t *dq;
		CK(cudaMalloc(&dq, 1024));
		CHECK(fp4s_cuda_nvfp4_quantize_act(dq, FP4S_ACT_BF16, 2, 40, 40, 1.0f, dq, dq,
		                                   FP4S_SF_LINEAR, FP4S_E2M1_AUTO, 0, &err) == FP4S_EINVAL);
		CHECK(strstr(err.msg, "multiple") != NULL);
		CHECK(fp4s_cuda_nvfp4_quantize_act(dq, FP4S_ACT_BF16, 2, 32, 32, NAN, dq, dq,
		                                   FP4S_SF_LINEAR, FP4S_E2M1_AUTO, 0, &err) == FP4S_EINVAL);
		CHECK(fp4s_cuda_mxfp4_quantize_act(dq, FP4S_ACT_BF16, 2, 64, 32, dq, dq, FP4S_SF_LINEAR,
		                                   FP4S_E2M1_AUTO, 0, &err) == FP4S_EINVAL);
		enum fp4s_e2m1_impl got;
		int rc = fp4s_cuda_e2m1_resolve(FP4S_E2M1_AUTO, &got, &err);
		CHECK(rc == 0);
		printf("E2M1 encoder on this device: %s\n", got == FP4S_E2M1_NATIVE ? "native cvt" : "software");
		if (p.major < 10)
			CHECK(fp4s_cuda_e2m1_resolve(FP4S_E2M1_NATIVE, &got, &err) == FP4S_EUNSUPPORTED);
		CK(cudaFree(dq));
	}
	return TEST_DONE();
}
