// stream_bench.cu: where the decode matmul's time goes, fixed cost against streaming rate.
//
// Build: part of the CMake build when nvcc exists (target stream_bench). Run: ./stream_bench
// (NVFP4, M = 1, the default kernel: on Hopper gemv_tma.cu's bulk-copy kernel; FP4S_BENCH_MX=1:
// MXFP4). Set
// FP4S_GEMV_TMA_PROBE=1 (consumers skip the MMA steps) or =2 (and the staging of x) to time the
// copy pipeline alone (results are then garbage).
//
// Method: per shape, a CUDA graph of 40 launches back to back (PDL as in a decode step), the
// weights rotating over enough copies that > 150 MB lie between two uses of one (3x the L2),
// replayed 7 times after a warm-up; the median us a launch and weight bytes / time. The shapes
// run from 4 MB to 264 MB at K = 4096 (and llama3-8b's K = 14336 down projection): a launch's time
// is about fixed + bytes / rate, so a least-squares line over the K = 4096 shapes gives both.
// Weights are random codes with realistic scale bytes (never zeros: METHOD.md).
#include <algorithm>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#include "backend/cuda/gemv_cuda.h"
#include "backend/cuda/gemv_mma.h"

#define CK(call)                                                                              \
	do {                                                                                  \
		cudaError_t e_ = (call);                                                      \
		if (e_ != cudaSuccess) {                                                      \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,         \
			        cudaGetErrorString(e_));                                      \
			exit(1);                                                              \
		}                                                                             \
	} while (0)

static __global__ void fill_kernel(uint8_t *p, size_t n, uint64_t seed, int scales)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
		x ^= x >> 31;
		x *= 0xBF58476D1CE4E5B9ull;
		x ^= x >> 29;
		/* scales 1: E4M3 2^-3 .. 1.94; 2: E8M0 2^-12 .. 2^-3; codes: any byte */
		p[i] = scales == 1 ? (uint8_t)(0x20 + (x & 0x1F)) : scales == 2 ? (uint8_t)(115 + x % 10) : (uint8_t)x;
	}
}

int main(void)
{
	cudaDeviceProp p;
	CK(cudaGetDeviceProperties(&p, 0));
	const char *pr = getenv("FP4S_GEMV_TMA_PROBE"), *mxe = getenv("FP4S_BENCH_MX");
	const int mx = mxe && atoi(mxe) == 1;
	printf("device: %s, %d SMs; %s M = 1; FP4S_GEMV_TMA_PROBE=%s\n", p.name, p.multiProcessorCount,
	       mx ? "MXFP4" : "NVFP4", pr ? pr : "0");
	fp4s_error err = {};
	if (fp4s_gemv_mma_setup(0, &err)) {
		fprintf(stderr, "%s\n", err.msg);
		return 1;
	}
	const int64_t shapes[][2] = {{4096, 4096},   {6144, 4096},  {14336, 4096}, {28672, 4096},
	                             {57344, 4096}, {114688, 4096}, {4096, 14336}};
	cudaStream_t s;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	float *x, *y;
	CK(cudaMalloc(&x, 16384 * sizeof(float)));
	CK(cudaMalloc(&y, 131072 * sizeof(float)));
	fill_kernel<<<64, 256>>>((uint8_t *)x, 16384 * 4, 7, 1); /* small positive floats */
	std::vector<double> xs, ts;
	for (auto &sh : shapes) {
		const int64_t rows = sh[0], k = sh[1];
		const size_t db = (size_t)rows * k / 2, sb = (size_t)rows * k / (mx ? 32 : 16), mb = db + sb;
		const int copies = (int)std::max<size_t>(2, 150000000 / mb + 1);
		std::vector<fp4s_mat> w((size_t)copies);
		for (int c = 0; c < copies; c++) {
			void *d, *sc;
			CK(cudaMalloc(&d, db));
			CK(cudaMalloc(&sc, sb));
			fill_kernel<<<1024, 256>>>((uint8_t *)d, db, 11 + c, 0);
			fill_kernel<<<1024, 256>>>((uint8_t *)sc, sb, 101 + c, mx ? 2 : 1);
			w[(size_t)c] = fp4s_mat{mx ? FP4S_WF_MXFP4 : FP4S_WF_NVFP4, rows, k, d, (uint8_t *)sc, 1.0f / 1024, NULL};
			if (mx && fp4s_cuda_mx_scale_range(&w[(size_t)c], 0, &err)) {
				fprintf(stderr, "%s\n", err.msg);
				return 1;
			}
		}
		CK(cudaDeviceSynchronize());
		auto enqueue = [&](int n) {
			for (int i = 0; i < n; i++)
				if (fp4s_cuda_matmul(&w[(size_t)(i % copies)], x, 1, y, s, &err)) {
					fprintf(stderr, "%s\n", err.msg);
					exit(1);
				}
		};
		enqueue(4);
		CK(cudaStreamSynchronize(s));
		cudaGraph_t g;
		cudaGraphExec_t ge;
		CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
		enqueue(40);
		CK(cudaStreamEndCapture(s, &g));
		CK(cudaGraphInstantiate(&ge, g, 0));
		cudaEvent_t e0, e1;
		CK(cudaEventCreate(&e0));
		CK(cudaEventCreate(&e1));
		std::vector<float> t;
		for (int r = 0; r < 8; r++) {
			CK(cudaEventRecord(e0, s));
			CK(cudaGraphLaunch(ge, s));
			CK(cudaEventRecord(e1, s));
			CK(cudaEventSynchronize(e1));
			float ms;
			CK(cudaEventElapsedTime(&ms, e0, e1));
			if (r)
				t.push_back(ms * 1000.0f / 40);
		}
		std::sort(t.begin(), t.end());
		const double us = t[t.size() / 2];
		printf("%6lldx%-6lld %7.1f MB  %8.2f us  %5.2f TB/s\n", (long long)rows, (long long)k, mb / 1e6, us,
		       mb / (us * 1e-6) / 1e12);
		if (k == 4096)
			xs.push_back(mb / 1e6), ts.push_back(us);
		CK(cudaGraphExecDestroy(ge));
		CK(cudaGraphDestroy(g));
		for (auto &m : w) {
			CK(cudaFree((void *)m.data));
			CK(cudaFree((void *)m.scales));
		}
	}
	/* time = fixed + MB / rate, least squares over the K = 4096 shapes */
	double sx = 0, sy = 0, sxx = 0, sxy = 0, n = (double)xs.size();
	for (size_t i = 0; i < xs.size(); i++)
		sx += xs[i], sy += ts[i], sxx += xs[i] * xs[i], sxy += xs[i] * ts[i];
	const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx), icpt = (sy - slope * sx) / n;
	printf("K = 4096 fit: %.2f us fixed + streaming at %.2f TB/s\n", icpt, 1.0 / slope); /* MB / us = TB/s */
	return 0;
}
