// stream_bench.cu: where the decode matmul's time goes, fixed cost against streaming rate.
//
// Build: part of the CMake build when nvcc exists (target stream_bench). Run: ./stream_bench
// (NVFP4, M = 1, the default kernel: on Hopper gemv_tma.cu's bulk-copy kernel; FP4S_BENCH_MX=1:
// MXFP4; FP4S_BENCH_EXPERTS=1: the expert GEMVs only; FP4S_BENCH_ICACHE=1: the instruction-cache
// experiment only). Set
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
#include "dev_util.h"

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

/* enqueue(slots)'s launches with their blocks' stamps (gemv_mma.h): [slot][block][4] */
template <typename E>
static std::vector<unsigned long long> stamps(E &enqueue, int slots, int blocks)
{
	unsigned long long *dst;
	CK(cudaMalloc(&dst, (size_t)slots * blocks * 4 * 8));
	CK(cudaMemset(dst, 0, (size_t)slots * blocks * 4 * 8));
	fp4s_gemv_mma_stamps(dst, slots, blocks);
	enqueue(slots);
	fp4s_gemv_mma_stamps(NULL, 0, 0);
	CK(cudaDeviceSynchronize());
	std::vector<unsigned long long> h((size_t)slots * blocks * 4);
	CK(cudaMemcpy(h.data(), dst, h.size() * 8, cudaMemcpyDeviceToHost));
	CK(cudaFree(dst));
	return h;
}

/* Copies of one rows x k matrix, random codes with realistic scales, enough that > 150 MB (3x the
 * L2) lie between two uses of one when launches rotate over them */
static std::vector<fp4s_mat> weight_copies(int64_t rows, int64_t k, int mx)
{
	const size_t db = (size_t)rows * k / 2, sb = (size_t)rows * k / (mx ? 32 : 16);
	const int copies = (int)std::max<size_t>(2, 150000000 / (db + sb) + 1);
	std::vector<fp4s_mat> w((size_t)copies);
	for (int c = 0; c < copies; c++) {
		void *d, *sc;
		CK(cudaMalloc(&d, db));
		CK(cudaMalloc(&sc, sb));
		fill_kernel<<<1024, 256>>>((uint8_t *)d, db, 11 + c, 0);
		fill_kernel<<<1024, 256>>>((uint8_t *)sc, sb, 101 + c, mx ? 2 : 1);
		w[(size_t)c] = fp4s_mat{mx ? FP4S_WF_MXFP4 : FP4S_WF_NVFP4, rows, k, d, (uint8_t *)sc, 1.0f / 1024, NULL};
		fp4s_error err = {};
		if (mx && fp4s_cuda_mx_scale_range(&w[(size_t)c], 0, &err)) {
			fprintf(stderr, "%s\n", err.msg);
			exit(1);
		}
	}
	CK(cudaDeviceSynchronize());
	return w;
}

static void free_copies(std::vector<fp4s_mat> &w)
{
	for (auto &m : w) {
		CK(cudaFree((void *)m.data));
		CK(cudaFree((void *)m.scales));
	}
}

/* Where a launch's time goes: the same 40 launches in a graph with each block's %globaltimer at
 * entry, after the PDL wait, with x staged and done (gemv_mma.h's stamps); medians over the
 * launches of the first / last block's readings, us after the previous launch's last block. */
template <typename E>
static void timeline(E &enqueue)
{
	const int slots = 40, blocks = 1024;
	const std::vector<unsigned long long> h = stamps(enqueue, slots, blocks);
	std::vector<float> v[6];
	unsigned long long prev = 0;
	for (int i = 0; i < slots; i++) {
		unsigned long long w0 = ~0ull, w1 = 0, s1 = 0, d0 = ~0ull, d1 = 0;
		std::vector<float> sd;
		for (int b = 0; b < blocks; b++) {
			const unsigned long long *t = &h[((size_t)i * blocks + b) * 4];
			if (!t[3])
				continue;
			w0 = std::min(w0, t[1]), w1 = std::max(w1, t[1]), s1 = std::max(s1, t[2]);
			d0 = std::min(d0, t[3]), d1 = std::max(d1, t[3]);
			sd.push_back((float)(t[2] - t[1]) * 1e-3f);
		}
		if (sd.empty())
			continue;
		if (prev) {
			auto rel = [&](unsigned long long x) { return (float)((long long)(x - prev)) * 1e-3f; };
			std::sort(sd.begin(), sd.end());
			v[0].push_back(rel(w0)), v[1].push_back(rel(w1)), v[2].push_back(sd[sd.size() / 2]);
			v[3].push_back(rel(s1)), v[4].push_back(rel(d0)), v[5].push_back(rel(d1));
		}
		prev = d1;
	}
	float m[6];
	for (int j = 0; j < 6; j++) {
		std::sort(v[j].begin(), v[j].end());
		m[j] = v[j].empty() ? 0.0f : v[j][v[j].size() / 2];
	}
	printf("   timeline (us after the previous launch's last block): wait done first %.2f last %.2f, staging "
	       "%.2f a block, last staged %.2f, first block done %.2f, last %.2f\n",
	       m[0], m[1], m[2], m[3], m[4], m[5]);
}

/* Instruction-cache experiment (FP4S_BENCH_ICACHE=1): before each GEMV launch, a kernel on every
 * SM whose code is 4N FMAs in a line (code_kernel<N>; ptxas unrolls some N only in part, the sizes
 * are listed where they run) or the same FMAs in a loop (code_kernel<0>: a few
 * hundred bytes). The GEMV after a long enough line finds none of its code cached; where its
 * cost sets in says how much code an SM holds. */
template <int N>
static __global__ void __launch_bounds__(128) code_kernel(float *out, float a)
{
	float v0 = threadIdx.x, v1 = v0 + 1.0f, v2 = v0 + 2.0f, v3 = v0 + 3.0f;
	if (N) {
#pragma unroll
		for (int i = 0; i < N; i++) {
			v0 = fmaf(v0, a, (float)i), v1 = fmaf(v1, a, (float)(i + 1)), v2 = fmaf(v2, a, (float)(i + 2));
			v3 = fmaf(v3, a, (float)(i + 3));
		}
	} else {
		for (int j = 0; j < 32; j++) {
#pragma unroll
			for (int i = 0; i < 64; i++) {
				v0 = fmaf(v0, a, (float)i), v1 = fmaf(v1, a, (float)(i + 1)), v2 = fmaf(v2, a, (float)(i + 2));
				v3 = fmaf(v3, a, (float)(i + 3));
			}
		}
	}
	if (v0 + v1 + v2 + v3 == 1234.5f)
		out[threadIdx.x] = v0;
}

/* Per launch of enqueue: the span from its first block's entry to its last block's end, and the
 * medians over its blocks of entry -> after the wait, staging, and staged -> done; medians over
 * the launches. */
static void spans(const unsigned long long *h, int slots, int blocks, float m[4])
{
	std::vector<float> v[4];
	for (int i = 0; i < slots; i++) {
		unsigned long long e0 = ~0ull, d1 = 0;
		std::vector<float> pb[3];
		for (int b = 0; b < blocks; b++) {
			const unsigned long long *t = &h[((size_t)i * blocks + b) * 4];
			if (!t[3])
				continue;
			e0 = std::min(e0, t[0]), d1 = std::max(d1, t[3]);
			for (int k = 0; k < 3; k++)
				pb[k].push_back((float)(t[k + 1] - t[k]) * 1e-3f);
		}
		if (pb[0].empty() || i < 4)
			continue;
		v[0].push_back((float)(d1 - e0) * 1e-3f);
		for (int k = 0; k < 3; k++) {
			std::sort(pb[k].begin(), pb[k].end());
			v[k + 1].push_back(pb[k][pb[k].size() / 2]);
		}
	}
	for (int j = 0; j < 4; j++) {
		std::sort(v[j].begin(), v[j].end());
		m[j] = v[j].empty() ? 0.0f : v[j][v[j].size() / 2];
	}
}

/* us a launch of enqueue(n)'s launches: 4 warm-up launches, then n captured in a CUDA graph (PDL
 * as in a decode step) and replayed 8 times, the first discarded; the median replay / n. */
template <typename E>
static double graph_us(E &enqueue, int n, cudaStream_t s)
{
	enqueue(4);
	CK(cudaStreamSynchronize(s));
	cudaGraph_t g;
	cudaGraphExec_t ge;
	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
	enqueue(n);
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
			t.push_back(ms * 1000.0f / (float)n);
	}
	CK(cudaEventDestroy(e0));
	CK(cudaEventDestroy(e1));
	CK(cudaGraphExecDestroy(ge));
	CK(cudaGraphDestroy(g));
	std::sort(t.begin(), t.end());
	return t[t.size() / 2];
}

/* The MoE decode step's expert GEMVs as the engine issues them (fp4s_gemv_mma_experts_ex): one
 * launch for a token's slots, each slot's expert read from a device index; the down projection
 * with its SwiGLU staged and the combine folded in. Launch i takes experts i * slots .. (mod E),
 * so > 100 MB of other experts pass between two uses of one. */
static void experts(const char *name, int mx, int E, int64_t rows, int64_t K, int slots, int act, cudaStream_t s)
{
	fp4s_error err = {};
	const size_t db = (size_t)rows * K / 2, sb = (size_t)rows * K / (mx ? 32 : 16);
	void *d, *sc;
	CK(cudaMalloc(&d, db * E));
	CK(cudaMalloc(&sc, sb * E));
	fill_kernel<<<1024, 256>>>((uint8_t *)d, db * E, 13, 0);
	fill_kernel<<<1024, 256>>>((uint8_t *)sc, sb * E, 103, mx ? 2 : 1);
	fp4s_stacked w = {};
	w.fmt = mx ? FP4S_WF_MXFP4 : FP4S_WF_NVFP4;
	w.rows = rows, w.cols = K, w.data = d, w.scales = (uint8_t *)sc;
	w.stride_data = (int64_t)db, w.stride_scales = (int64_t)sb, w.ws2 = 1.0f / 1024;
	if (mx && fp4s_cuda_mx_scale_range_stacked(&w, E, 0, &err)) {
		fprintf(stderr, "%s\n", err.msg);
		exit(1);
	}
	const int L = 40;
	std::vector<int32_t> hidx((size_t)L * slots);
	for (size_t i = 0; i < hidx.size(); i++)
		hidx[i] = (int32_t)(i % (size_t)E);
	int32_t *idx;
	float *x, *y, *cw = NULL, *ch = NULL;
	const int64_t xs = act ? 2 * K : K;
	CK(cudaMalloc(&idx, hidx.size() * 4));
	CK(cudaMemcpy(idx, hidx.data(), hidx.size() * 4, cudaMemcpyHostToDevice));
	CK(cudaMalloc(&x, (size_t)slots * xs * 4));
	CK(cudaMalloc(&y, (size_t)slots * rows * 4));
	fill_kernel<<<64, 256>>>((uint8_t *)x, (size_t)slots * xs * 4, 7, 1);
	if (act) {
		CK(cudaMalloc(&cw, (size_t)slots * 4));
		CK(cudaMalloc(&ch, (size_t)rows * 4));
		fill_kernel<<<1, 32>>>((uint8_t *)cw, (size_t)slots * 4, 9, 1);
		CK(cudaMemset(ch, 0, (size_t)rows * 4));
	}
	CK(cudaDeviceSynchronize());
	auto enqueue = [&](int n) {
		for (int i = 0; i < n; i++)
			if (fp4s_gemv_mma_experts_ex(&w, idx + (size_t)(i % L) * slots, slots, x, act ? 1 : slots, xs, act, 1.702f,
			                             7.0f, NULL, 0.0f, 0, cw, ch, y, s, &err)) {
				fprintf(stderr, "%s: %s\n", name, err.msg[0] ? err.msg : "not supported");
				exit(1);
			}
	};
	const double us = graph_us(enqueue, L, s), mb = (double)(db + sb) * slots;
	printf("%-14s %2d x %5lldx%-5lld %6.1f MB  %8.2f us  %5.2f TB/s\n", name, slots, (long long)rows, (long long)K,
	       mb / 1e6, us, mb / (us * 1e-6) / 1e12);
	timeline(enqueue);
	for (void *q : {d, sc, (void *)idx, (void *)x, (void *)y, (void *)cw, (void *)ch})
		CK(cudaFree(q));
}

/* The instruction-cache experiment: three GEMV shapes, each in a chain of launches alone, after
 * the loop kernel, and after code_kernel lines of 17-197 KB (the bigger ones for 4096x4096 only) */
static int icache(const cudaDeviceProp &p, int mx)
{
	fp4s_error err = {};
	cudaStream_t is;
	CK(cudaStreamCreateWithFlags(&is, cudaStreamNonBlocking));
	float *xo, *yo, *junk;
	CK(cudaMalloc(&xo, 16384 * sizeof(float)));
	CK(cudaMalloc(&yo, 131072 * sizeof(float)));
	CK(cudaMalloc(&junk, 128 * sizeof(float)));
	fill_kernel<<<64, 256>>>((uint8_t *)xo, 16384 * 4, 7, 1);
	const int64_t ish[][2] = {{4096, 4096}, {2048, 4096}, {14336, 4096}};
	for (auto &sh : ish) {
		const int64_t rows = sh[0], k = sh[1];
		std::vector<fp4s_mat> w = weight_copies(rows, k, mx);
		const int copies = (int)w.size();
		/* 0: GEMVs alone, 1: the loop kernel between, 2..: code_kernel<ICN[mode]> between */
		/* (code bytes with nvcc 13 for sm_90a: 17, 33, 66, 99, 132 and 197 KB; ptxas unrolls
		 * 3072 and 8192 partly) */
		static const int ICN[] = {0, 0, 256, 512, 1024, 3072, 2048, 8192};
		void (*ck[])(float *, float) = {code_kernel<0>,    code_kernel<0>,    code_kernel<256>,  code_kernel<512>,
		                                code_kernel<1024>, code_kernel<3072>, code_kernel<2048>, code_kernel<8192>};
		for (int mode = 0; mode < 8; mode++) {
			if (rows != 4096 && mode > 1 && mode != 7)
				continue;
			auto enqueue = [&](int n) {
				for (int i = 0; i < n; i++) {
					if (mode)
						ck[mode]<<<p.multiProcessorCount * 4, 128, 0, is>>>(junk, 0.999f);
					if (fp4s_cuda_matmul(&w[(size_t)(i % copies)], xo, 1, yo, is, &err)) {
						fprintf(stderr, "%s\n", err.msg);
						exit(1);
					}
				}
			};
			const double us = graph_us(enqueue, 40, is);
			const int slots = 40, blocks = 1024;
			float m[4];
			spans(stamps(enqueue, slots, blocks).data(), slots, blocks, m);
			printf("icache %6lldx%-6lld %-6s %5d FMAs %8.2f us a pair | GEMV span %6.2f us, a block: entry->wait "
			       "%5.2f, staging %5.2f, stream %6.2f\n",
			       (long long)rows, (long long)k, mode == 0 ? "alone" : mode == 1 ? "loop" : "line", ICN[mode], us,
			       m[0], m[1], m[2], m[3]);
		}
		free_copies(w);
	}
	return 0;
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
	const char *ic = getenv("FP4S_BENCH_ICACHE"); /* 1: the instruction-cache experiment only */
	if (ic && atoi(ic) == 1)
		return icache(p, mx);
	const char *ex = getenv("FP4S_BENCH_EXPERTS"); /* 1: the expert GEMVs only */
	if (ex && atoi(ex) == 1) {
		cudaStream_t es;
		CK(cudaStreamCreateWithFlags(&es, cudaStreamNonBlocking));
		experts("oss gate|up", 1, 32, 5760, 2880, 4, 0, es);
		experts("gate|up nvfp4", 0, 32, 5760, 2880, 4, 0, es); /* the same shape in NVFP4 (#6's row) */
		experts("oss down", 1, 32, 2880, 2880, 4, 2, es);
		experts("qwen3 gate|up", 0, 128, 1536, 2048, 8, 0, es);
		experts("qwen3 down", 0, 128, 2048, 768, 8, 1, es);
		return 0;
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
		const size_t mb = (size_t)rows * k / 2 + (size_t)rows * k / (mx ? 32 : 16);
		std::vector<fp4s_mat> w = weight_copies(rows, k, mx);
		const int copies = (int)w.size();
		auto enqueue = [&](int n) {
			for (int i = 0; i < n; i++)
				if (fp4s_cuda_matmul(&w[(size_t)(i % copies)], x, 1, y, s, &err)) {
					fprintf(stderr, "%s\n", err.msg);
					exit(1);
				}
		};
		const double us = graph_us(enqueue, 40, s);
		printf("%6lldx%-6lld %7.1f MB  %8.2f us  %5.2f TB/s\n", (long long)rows, (long long)k, mb / 1e6, us,
		       mb / (us * 1e-6) / 1e12);
		if (k == 4096)
			xs.push_back(mb / 1e6), ts.push_back(us);
		if ((rows == 4096 && k == 4096) || rows == 28672)
			timeline(enqueue);
		free_copies(w);
	}
	/* time = fixed + MB / rate, least squares over the K = 4096 shapes */
	double sx = 0, sy = 0, sxx = 0, sxy = 0, n = (double)xs.size();
	for (size_t i = 0; i < xs.size(); i++)
		sx += xs[i], sy += ts[i], sxx += xs[i] * xs[i], sxy += xs[i] * ts[i];
	const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx), icpt = (sy - slope * sx) / n;
	printf("K = 4096 fit: %.2f us fixed + streaming at %.2f TB/s\n", icpt, 1.0 / slope); /* MB / us = TB/s */
	return 0;
}
