// gemm_bench.cu: prefill GEMM (fp4s_cuda_gemm) throughput, NVFP4 and MXFP4 weights, against
// cuBLAS BF16 on the same shapes.
//
// Build: part of the CMake build when nvcc exists (target gemm_bench).
// Run: ./gemm_bench [64|128|256] [v1|v2|wgmma] [r128|r256] [lut|prmt] [nobf16]: force the token tile,
// the kernel (register-staged v1, the cp.async ring v2, the Hopper wgmma kernel; 256-token tiles are
// wgmma's only), wgmma's weight rows per block, v2's decode (shared table or byte permutes); nobf16
// skips the cuBLAS rows; ms=64,512 times only those M.
//
// Method (performance.md §7): for each shape and format first validate against the CPU reference
// (64 rows x all tokens at M = 128, rel L2 <= 5e-3 vs FP32 x), then warm up and time 20 launches
// with CUDA events one by one, rotating over enough weight sets that they exceed 2x the L2 (the
// weights of the small-M cases stream from DRAM as they would in a model). Prints the median, min,
// TFLOP/s at the median (2 M N K flops) and the ratio to cuBLAS BF16 (cublasGemmEx, BF16 inputs
// already in BF16, FP32 output and accumulation) on the same shape. The FP4 timing includes the
// x FP32 -> BF16 conversion launch (into a caller workspace); cuBLAS gets BF16 x for free.
//
// Floors: at M = 512, N = K = 4096 the math is 17.2 GFLOP: 22 us at cuBLAS's ~780 TFLOP/s; the
// FP4 weights are 9.4 MB (3 us at 3 TB/s), so large M is compute-bound and small M (<= 64) is
// bound by the weight bytes.
#include <algorithm>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/e2m1_device.h"
#include "backend/cuda/gemm_cuda.h"
#include "numerics/numerics.h"
#include "numerics/quant.h"
#include "dev_util.h"

#define CB(call)                                                                              \
	do {                                                                                  \
		cublasStatus_t s_ = (call);                                                   \
		if (s_ != CUBLAS_STATUS_SUCCESS) {                                            \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,         \
			        cublasGetStatusString(s_));                                   \
			exit(1);                                                              \
		}                                                                             \
	} while (0)

static double frand(void) { return rand() / (double)RAND_MAX - 0.5; }

struct wset {
	uint8_t *data, *scales;
	float ws2;
};

int main(int argc, char **argv)
{
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
		fprintf(stderr, "no CUDA device\n");
		return 1;
	}
	/* arguments: a token tile (64, 128, 256), "v1" / "v2" / "wgmma", "lut" or "prmt" (decode),
	 * "nobf16" (skip cuBLAS) */
	int skip_bf16 = 0;
	const char *ms_arg = NULL;
	int force_bm = 0, force_kernel = 0, force_decode = 0, force_rows = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "v1"))
			force_kernel = 1;
		else if (!strcmp(argv[i], "v2"))
			force_kernel = 2;
		else if (!strcmp(argv[i], "wgmma"))
			force_kernel = 3;
		else if (!strcmp(argv[i], "r128") || !strcmp(argv[i], "r256"))
			force_rows = atoi(argv[i] + 1);
		else if (!strcmp(argv[i], "lut"))
			force_decode = 1;
		else if (!strcmp(argv[i], "prmt"))
			force_decode = 2;
		else if (!strcmp(argv[i], "nobf16"))
			skip_bf16 = 1;
		else if (!strncmp(argv[i], "ms=", 3))
			ms_arg = argv[i] + 3;
		else
			force_bm = atoi(argv[i]);
	}
	cudaDeviceProp p;
	CK(cudaGetDeviceProperties(&p, 0));
	int sm_clock = 0;
	cudaDeviceGetAttribute(&sm_clock, cudaDevAttrClockRate, 0);
	int cublas_ver = 0;
	cublasHandle_t cb;
	CB(cublasCreate(&cb));
	CB(cublasGetVersion(cb, &cublas_ver));
	printf("gpu: %s, %d SMs, %.0f MB L2, max SM clock %d MHz; cuBLAS %d; token tile %d, rows %d (0 = auto), "
	       "kernel %s (wgmma %s), decode %s\n", p.name, p.multiProcessorCount, p.l2CacheSize / 1e6,
	       sm_clock / 1000, cublas_ver, force_bm, force_rows,
	       force_kernel == 1 ? "v1" : force_kernel == 2 ? "v2" : force_kernel == 3 ? "wgmma" : "auto",
	       fp4s_cuda_gemm_has_wgmma() ? "available" : "not available",
	       force_decode == 1 ? "table" : force_decode == 2 ? "prmt" : "auto");

	const int64_t shapes[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}}; /* rows (N), K */
	std::vector<int> ms = {16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
	if (ms_arg) { /* "ms=64,512": only these M (each <= 4096) */
		ms.clear();
		for (const char *q = ms_arg; *q;) {
			const int v = atoi(q);
			if (v > 0 && v <= 4096)
				ms.push_back(v);
			q = strchr(q, ',');
			if (!q)
				break;
			q++;
		}
	}
	const int MMAX = 4096;
	printf("\n%-6s %-12s %6s %10s %10s %9s %9s\n", "format", "N x K", "M", "median us", "min us", "TFLOP/s",
	       "vs cuBLAS");
	for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
		const int64_t N = shapes[si][0], K = shapes[si][1];
		/* activations: FP32 for fp4s, BF16 for cuBLAS */
		std::vector<float> hx((size_t)(MMAX * K));
		for (auto &v : hx)
			v = (float)(frand() * 4.0);
		std::vector<uint16_t> hxb(hx.size());
		for (size_t i = 0; i < hx.size(); i++)
			hxb[i] = fp4s_f32_to_bf16(hx[i]);
		float *dx, *dy;
		void *dxb, *dws;
		CK(cudaMalloc(&dx, hx.size() * 4));
		CK(cudaMalloc(&dxb, hx.size() * 2));
		CK(cudaMalloc(&dy, (size_t)(MMAX * N) * 4));
		struct fp4s_gemm_tune tune = {force_bm, force_kernel, force_decode, force_rows};
		size_t wsb = 0;
		for (int fi = 0; fi < 2; fi++)
			for (size_t mi = 0; mi < ms.size(); mi++) {
				struct fp4s_mat probe = {fi ? FP4S_WF_MXFP4 : FP4S_WF_NVFP4, N, K, NULL, NULL, 1.0f, NULL};
				wsb = std::max(wsb, fp4s_cuda_gemm_workspace_bytes(&probe, ms[mi], &tune));
				/* and the validation's M = 128 */
				wsb = std::max(wsb, fp4s_cuda_gemm_workspace_bytes(&probe, 128, &tune));
			}
		CK(cudaMalloc(&dws, wsb));
		CK(cudaMemcpy(dx, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(dxb, hxb.data(), hxb.size() * 2, cudaMemcpyHostToDevice));
		/* one Gaussian-ish weight matrix, quantized both ways and kept as BF16 for cuBLAS */
		std::vector<float> hw((size_t)(N * K));
		for (int64_t r = 0; r < N; r++) {
			const double mag = 0.02 * pow(2.0, (double)(r % 9) - 4.0);
			for (int64_t i = 0; i < K; i++)
				hw[(size_t)(r * K + i)] = (float)(frand() * mag);
		}
		std::vector<double> t_cublas(ms.size());
		for (int f = 0; f < 3; f++) { /* 0 = cuBLAS BF16 first (the reference), 1 NVFP4, 2 MXFP4 */
			if (f == 0 && skip_bf16)
				continue;
			const char *fname = f == 0 ? "bf16" : f == 1 ? "nvfp4" : "mxfp4";
			const size_t data_b = f == 0 ? (size_t)(N * K) * 2 : (size_t)(N * K) / 2;
			const size_t sc_b = f == 0 ? 0 : (size_t)(N * K) / (f == 1 ? 16 : 32);
			const int nsets = (int)std::min<size_t>(8, std::max<size_t>(2, 2 * (size_t)p.l2CacheSize /
			                                                                   (data_b + sc_b) + 1));
			std::vector<uint8_t> q(data_b), s(sc_b + 1);
			float ws2 = 1.0f;
			struct fp4s_error err = {0};
			if (f == 0) {
				uint16_t *d = (uint16_t *)q.data();
				for (size_t i = 0; i < hw.size(); i++)
					d[i] = fp4s_f32_to_bf16(hw[i]);
			} else if (f == 1) {
				if (fp4s_nvfp4_tensor_scale(hw.data(), hw.size(), &ws2, &err) ||
				    fp4s_nvfp4_quantize(hw.data(), N, K, ws2, q.data(), s.data(), &err)) {
					fprintf(stderr, "quantize: %s\n", err.msg);
					return 1;
				}
			} else if (fp4s_mxfp4_quantize(hw.data(), N, K, q.data(), s.data(), &err)) {
				fprintf(stderr, "quantize: %s\n", err.msg);
				return 1;
			}
			std::vector<wset> sets((size_t)nsets);
			for (auto &w : sets) {
				CK(cudaMalloc(&w.data, data_b));
				CK(cudaMemcpy(w.data, q.data(), data_b, cudaMemcpyHostToDevice));
				w.scales = NULL;
				if (sc_b) {
					CK(fp4s_cuda_e2m1_permute(w.data, data_b, 0)); /* the device's code layout */
					CK(cudaMalloc(&w.scales, sc_b));
					CK(cudaMemcpy(w.scales, s.data(), sc_b, cudaMemcpyHostToDevice));
				}
				w.ws2 = ws2;
			}
			const enum fp4s_wformat wf = f == 0 ? FP4S_WF_BF16 : f == 1 ? FP4S_WF_NVFP4 : FP4S_WF_MXFP4;
			/* validate: M = 128, the first 64 rows, vs the CPU reference on FP32 x */
			{
				const int M = 128;
				struct fp4s_mat wd = {wf, N, K, sets[0].data, sets[0].scales, ws2, NULL};
				std::vector<float> y((size_t)(M * N)), ref((size_t)(M * 64));
				CK(cudaMemset(dy, 0xFF, (size_t)(M * N) * 4)); /* NaN poison */
				if (fp4s_cuda_gemm_ex(&wd, dx, M, dy, dws, wsb, &tune, 0, &err)) {
					fprintf(stderr, "gemm: %s\n", err.msg);
					return 1;
				}
				CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
				struct fp4s_mat wc = {wf, 64, K, q.data(), sc_b ? s.data() : NULL, ws2, NULL};
				if (fp4s_cpu_matmul(hx.data(), M, &wc, ref.data(), &err)) {
					fprintf(stderr, "cpu: %s\n", err.msg);
					return 1;
				}
				double num = 0, den = 0;
				int nan = 0;
				for (size_t i = 0; i < y.size(); i++)
					nan |= isnan(y[i]);
				for (int t = 0; t < M; t++)
					for (int r = 0; r < 64; r++) {
						const double d = (double)y[(size_t)(t * N + r)] - ref[(size_t)(t * 64 + r)];
						num += d * d;
						den += (double)ref[(size_t)(t * 64 + r)] * ref[(size_t)(t * 64 + r)];
					}
				const double rel = sqrt(num / den);
				if (nan || !(rel <= 5e-3)) {
					fprintf(stderr, "MISMATCH %s %lldx%lld: rel L2 %.3g%s\n", fname, (long long)N,
					        (long long)K, rel, nan ? ", NaN" : "");
					return 1;
				}
			}
			for (size_t mi = 0; mi < ms.size(); mi++) {
				const int M = ms[mi];
				cudaEvent_t e0, e1;
				CK(cudaEventCreate(&e0));
				CK(cudaEventCreate(&e1));
				std::vector<float> t;
				const float one = 1.0f, zero = 0.0f;
				for (int it = 0; it < 25; it++) {
					const wset &w = sets[(size_t)it % sets.size()];
					int rc = 0;
					CK(cudaEventRecord(e0));
					if (f == 0) {
						CB(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, M, (int)K, &one, w.data,
						                CUDA_R_16BF, (int)K, dxb, CUDA_R_16BF, (int)K, &zero, dy,
						                CUDA_R_32F, (int)N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
					} else {
						struct fp4s_mat wd = {wf, N, K, w.data, w.scales, w.ws2, NULL};
						rc = fp4s_cuda_gemm_ex(&wd, dx, M, dy, dws, wsb, &tune, 0, &err);
					}
					CK(cudaEventRecord(e1));
					CK(cudaEventSynchronize(e1));
					if (rc) {
						fprintf(stderr, "%s\n", err.msg);
						return 1;
					}
					float ms_;
					CK(cudaEventElapsedTime(&ms_, e0, e1));
					if (it >= 5)
						t.push_back(ms_);
				}
				std::sort(t.begin(), t.end());
				const double med = t[t.size() / 2], tf = 2.0 * M * (double)N * K / (med * 1e-3) / 1e12;
				if (f == 0)
					t_cublas[mi] = med;
				char shape[32];
				snprintf(shape, sizeof shape, "%lldx%lld", (long long)N, (long long)K);
				printf("%-6s %-12s %6d %10.1f %10.1f %9.1f %8.2fx\n", fname, shape, M, med * 1e3,
				       t.front() * 1e3, tf, t_cublas[mi] > 0 ? t_cublas[mi] / med : 0.0);
				CK(cudaEventDestroy(e0));
				CK(cudaEventDestroy(e1));
			}
			for (auto &w : sets) {
				CK(cudaFree(w.data));
				if (w.scales)
					CK(cudaFree(w.scales));
			}
		}
		CK(cudaFree(dx));
		CK(cudaFree(dxb));
		CK(cudaFree(dy));
		CK(cudaFree(dws));
	}
	CB(cublasDestroy(cb));
	return 0;
}
