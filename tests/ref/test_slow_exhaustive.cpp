// test_slow_exhaustive.cpp: our encoders against the CUDA toolkit's own host reference
// conversions on all 2^32 float bit patterns: E2M1 (__nv_cvt_float_to_fp4, RNE), E4M3
// (__nv_cvt_float_to_fp8, SATFINITE), BF16 (__float2bfloat16) and FP16 (__float2half).
// Expect 0 mismatches for each. C++ only because the reference headers are C++; the code under
// test is the C header numerics.h. Uses every core (OpenMP).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "numerics/numerics.h"

int main()
{
	unsigned long long bad_e2m1 = 0, bad_e4m3 = 0, bad_bf16 = 0, bad_f16 = 0;
	unsigned first_e2m1 = 0, first_e4m3 = 0, first_bf16 = 0, first_f16 = 0;
	const long long N = 1LL << 32;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
#pragma omp parallel for schedule(static, 1 << 20) reduction(+ : bad_e2m1, bad_e4m3, bad_bf16, bad_f16)
	for (long long i = 0; i < N; i++) {
		const uint32_t u = (uint32_t)i;
		const float x = fp4s_bits_f32(u);
		const unsigned ref4 = __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest);
		const unsigned ref8 = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
		const unsigned refb = __bfloat16_as_ushort(__float2bfloat16(x));
		const unsigned refh = __half_as_ushort(__float2half(x));
		if (fp4s_f32_to_e2m1(x) != ref4 && bad_e2m1++ == 0)
			first_e2m1 = u;
		if (fp4s_f32_to_e4m3(x) != ref8 && bad_e4m3++ == 0)
			first_e4m3 = u;
		if (fp4s_f32_to_bf16(x) != refb && bad_bf16++ == 0)
			first_bf16 = u;
		if (fp4s_f32_to_f16(x) != refh && bad_f16++ == 0)
			first_f16 = u;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	int pass = 0, fail = 0;
	struct {
		const char *name;
		unsigned long long bad;
		unsigned first;
	} rows[] = {{"E2M1 (RNE)", bad_e2m1, first_e2m1},
	            {"E4M3 (SATFINITE)", bad_e4m3, first_e4m3},
	            {"BF16", bad_bf16, first_bf16},
	            {"FP16", bad_f16, first_f16}};
	for (auto &r : rows) {
		// 'first' is only meaningful with a mismatch: reductions make it racy, not wrong
		printf("%-18s %llu mismatches of 2^32%s", r.name, r.bad, r.bad ? ", e.g. bits " : "\n");
		if (r.bad)
			printf("0x%08x\n", r.first);
		(r.bad ? fail : pass)++;
	}
	printf("threads %d, %.1f s\n", omp_get_max_threads(),
	       (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
	printf("%d passed, %d failed\n", pass, fail);
	return fail ? 1 : 0;
}
