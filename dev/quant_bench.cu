// quant_bench.cu: activation quantization (BF16 -> NVFP4 / MXFP4) throughput.
//
// Build: part of the CMake build when nvcc exists (target quant_bench). Run: ./quant_bench
//
// Method (performance.md §7): first measure the device-to-device copy ceiling (bytes read +
// written); then for each shape validate the kernel against the CPU reference, warm up, and time
// 50 launches with CUDA events one by one, rotating over enough input/output buffers that the
// working set exceeds 3x the L2 (so the numbers are DRAM numbers, not cache hits). Bytes counted:
// the BF16 input read once plus the packed output and scales written once. Prints the median, min
// and spread, GB/s and % of the copy ceiling.
//
// Roofline: 2 bytes in and 0.5625 (NVFP4) or 0.53125 (MXFP4) bytes out per element; at the
// ~3.0 TB/s an H100 copies, 8192 x 8192 moves 171 MB: ~57 us.
#include <algorithm>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "backend/cuda/quant_cuda.h"
#include "numerics/numerics.h"
#include "numerics/quant.h"
#include "dev_util.h"

struct stats {
	float median, min, max;
};

static stats summarize(std::vector<float> &t)
{
	std::sort(t.begin(), t.end());
	return {t[t.size() / 2], t.front(), t.back()};
}

static double copy_ceiling_gbs(void)
{
	const size_t bytes = (size_t)1 << 30;
	void *a, *b;
	CK(cudaMalloc(&a, bytes));
	CK(cudaMalloc(&b, bytes));
	CK(cudaMemset(a, 1, bytes));
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	std::vector<float> t;
	for (int i = 0; i < 23; i++) {
		CK(cudaEventRecord(e0));
		CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
		CK(cudaEventRecord(e1));
		CK(cudaEventSynchronize(e1));
		float ms;
		CK(cudaEventElapsedTime(&ms, e0, e1));
		if (i >= 3)
			t.push_back(ms);
	}
	stats s = summarize(t);
	CK(cudaFree(a));
	CK(cudaFree(b));
	return 2.0 * (double)bytes / (s.median * 1e-3) / 1e9;
}

/* CPU check of one buffer set: returns 0 when identical. */
static int validate(int mx, const uint16_t *hx, const uint16_t *dx, int64_t rows, int64_t k, float gs,
                    uint8_t *dq, uint8_t *ds, enum fp4s_e2m1_impl impl)
{
	struct fp4s_error err = {0};
	const int64_t nb = k / (mx ? 32 : 16);
	std::vector<uint8_t> q((size_t)(rows * k / 2)), s((size_t)(rows * nb)), gq(q.size()), gsf(s.size());
	int rc = mx ? fp4s_mxfp4_quantize_act(hx, FP4S_ACT_BF16, rows, k, k, q.data(), s.data(),
	                                      FP4S_SF_LINEAR, &err)
	            : fp4s_nvfp4_quantize_act(hx, FP4S_ACT_BF16, rows, k, k, gs, q.data(), s.data(),
	                                      FP4S_SF_LINEAR, &err);
	if (!rc)
		rc = mx ? fp4s_cuda_mxfp4_quantize_act(dx, FP4S_ACT_BF16, rows, k, k, dq, ds, FP4S_SF_LINEAR,
		                                       impl, 0, &err)
		        : fp4s_cuda_nvfp4_quantize_act(dx, FP4S_ACT_BF16, rows, k, k, gs, dq, ds,
		                                       FP4S_SF_LINEAR, impl, 0, &err);
	if (rc) {
		fprintf(stderr, "quantize failed: %s\n", err.msg);
		return 1;
	}
	CK(cudaMemcpy(gq.data(), dq, gq.size(), cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(gsf.data(), ds, gsf.size(), cudaMemcpyDeviceToHost));
	return gq != q || gsf != s;
}

int main(void)
{
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
		fprintf(stderr, "no CUDA device\n");
		return 1;
	}
	cudaDeviceProp p;
	CK(cudaGetDeviceProperties(&p, 0));
	int sm_clock = 0, mem_clock = 0;
	cudaDeviceGetAttribute(&sm_clock, cudaDevAttrClockRate, 0);
	cudaDeviceGetAttribute(&mem_clock, cudaDevAttrMemoryClockRate, 0);
	const double ceiling = copy_ceiling_gbs();
	printf("gpu: %s, %d SMs, %.0f MB L2, max SM clock %d MHz, memory clock %d MHz\n", p.name,
	       p.multiProcessorCount, p.l2CacheSize / 1e6, sm_clock / 1000, mem_clock / 1000);
	printf("copy ceiling (1 GiB device-to-device, read+write): %.0f GB/s\n", ceiling);
	enum fp4s_e2m1_impl native;
	struct fp4s_error err = {0};
	fp4s_cuda_e2m1_resolve(FP4S_E2M1_AUTO, &native, &err);

	const int64_t shapes[][2] = {{16, 4096}, {512, 4096}, {4096, 4096}, {8192, 8192}, {16384, 14336}};
	printf("\n%-6s %-8s %-14s %10s %10s %10s %9s %7s\n", "format", "e2m1", "rows x k", "median us",
	       "min us", "max us", "GB/s", "% copy");
	for (int mx = 0; mx < 2; mx++) {
		for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
			const int64_t rows = shapes[si][0], k = shapes[si][1], n = rows * k;
			const int64_t nb = k / (mx ? 32 : 16);
			const size_t in_b = (size_t)n * 2, out_b = (size_t)n / 2 + (size_t)(rows * nb);
			const size_t set_b = in_b + out_b;
			int nsets = (int)std::min<size_t>(1024, std::max<size_t>(1, 3 * (size_t)p.l2CacheSize / set_b + 1));
			std::vector<uint16_t> hx((size_t)n);
			for (int64_t i = 0; i < n; i++)
				hx[(size_t)i] = fp4s_f32_to_bf16((float)((rand() / (double)RAND_MAX - 0.5) * 6.0));
			std::vector<uint16_t *> dx((size_t)nsets);
			std::vector<uint8_t *> dq((size_t)nsets), ds((size_t)nsets);
			for (int s = 0; s < nsets; s++) {
				CK(cudaMalloc(&dx[(size_t)s], in_b));
				CK(cudaMalloc(&dq[(size_t)s], (size_t)n / 2));
				CK(cudaMalloc(&ds[(size_t)s], (size_t)(rows * nb)));
				CK(cudaMemcpy(dx[(size_t)s], hx.data(), in_b, cudaMemcpyHostToDevice));
			}
			const float gs = 2688.0f / 3.0f;
			for (int impl = 0; impl < 2; impl++) {
				enum fp4s_e2m1_impl which = impl ? native : FP4S_E2M1_SOFTWARE;
				if (impl && native != FP4S_E2M1_NATIVE)
					continue;
				if (validate(mx, hx.data(), dx[0], rows, k, gs, dq[0], ds[0], which)) {
					fprintf(stderr, "MISMATCH against the CPU reference (%s %lldx%lld)\n",
					        mx ? "mxfp4" : "nvfp4", (long long)rows, (long long)k);
					return 1;
				}
				cudaEvent_t e0, e1;
				CK(cudaEventCreate(&e0));
				CK(cudaEventCreate(&e1));
				std::vector<float> t;
				for (int it = 0; it < 60; it++) {
					const size_t s = (size_t)(it % nsets);
					CK(cudaEventRecord(e0));
					int rc = mx ? fp4s_cuda_mxfp4_quantize_act(dx[s], FP4S_ACT_BF16, rows, k, k, dq[s],
					                                           ds[s], FP4S_SF_LINEAR, which, 0, &err)
					            : fp4s_cuda_nvfp4_quantize_act(dx[s], FP4S_ACT_BF16, rows, k, k, gs,
					                                           dq[s], ds[s], FP4S_SF_LINEAR, which, 0,
					                                           &err);
					CK(cudaEventRecord(e1));
					CK(cudaEventSynchronize(e1));
					if (rc) {
						fprintf(stderr, "%s\n", err.msg);
						return 1;
					}
					float ms;
					CK(cudaEventElapsedTime(&ms, e0, e1));
					if (it >= 10)
						t.push_back(ms);
				}
				stats st = summarize(t);
				const double gbs = (double)set_b / (st.median * 1e-3) / 1e9;
				char shape[32];
				snprintf(shape, sizeof shape, "%lldx%lld", (long long)rows, (long long)k);
				printf("%-6s %-8s %-14s %10.1f %10.1f %10.1f %9.0f %6.1f%%%s\n", mx ? "mxfp4" : "nvfp4",
				       impl ? "native" : "software", shape, st.median * 1e3, st.min * 1e3,
				       st.max * 1e3, gbs, 100.0 * gbs / ceiling,
				       set_b * (size_t)nsets < (size_t)p.l2CacheSize ? "  (L2-resident)" : "");
				CK(cudaEventDestroy(e0));
				CK(cudaEventDestroy(e1));
			}
			for (int s = 0; s < nsets; s++) {
				CK(cudaFree(dx[(size_t)s]));
				CK(cudaFree(dq[(size_t)s]));
				CK(cudaFree(ds[(size_t)s]));
			}
		}
	}
	return 0;
}
