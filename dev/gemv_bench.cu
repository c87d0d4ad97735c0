// gemv_bench.cu: decode matmul (fp4s_cuda_matmul) bandwidth, NVFP4 / MXFP4 / BF16 weights.
//
// Build: part of the CMake build when nvcc exists (target gemv_bench). Run: ./gemv_bench [quick]
//
// Method (performance.md §7): first the device-to-device copy ceiling (bytes read + written); then
// per shape and format: validate every M against the CPU reference (fp4s_cpu_matmul, relative L2
// <= 1e-5), warm up, and time 60 iterations (10 discarded) with a CUDA event pair around each one,
// all enqueued without host synchronisation in between, so an event pair brackets GPU time only.
// Weight buffers rotate over enough copies that the set cycled through is > 3x the L2: every call
// streams from DRAM. "iso" is the median of those per-call times; "b2b" is one event pair around
// 50 back-to-back iterations divided by 50; "graph" is the same 50 iterations captured in a CUDA
// graph and replayed (median of 7 replays), which is how the decode step runs them: no host
// launch cost, and with programmatic dependent launch (pdl.cuh) each kernel's weight loads start
// while the previous one finishes (performance.md §4: isolated ~5 us kernels carry a per-call
// cost a sequence partly hides). The decode sweep shows graph time with PDL off and on and with
// the L2 prefetch distance of the tensor-core kernel (tiles a block prefetches ahead).
// Bytes counted (performance.md §3.1): the weight codes and scales, read once; x and y are not
// counted (they are < 1% at M <= 16 except for the small 2880 shapes, where they are ~1.5%).
// Weights are random codes with realistic scale bytes (never zeros: METHOD.md).
//
// The gpt-oss expert row runs four separate 5760x2880 matrices back to back inside one timed
// iteration (four launches). The engine's MoE takes a token's experts in one launch instead:
// stream_bench with FP4S_BENCH_EXPERTS=1 times that. A ksplit sweep at M = 1 comes first.
#include <algorithm>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/e2m1_device.h"
#include "backend/cuda/gemv_cuda.h"
#include "backend/cuda/gemv_mma.h"
#include "backend/cuda/pdl.cuh"
#include "numerics/numerics.h"
#include "dev_util.h"

/* model.h has no extern "C" block: its fp4s_wformat_name is not callable from C++. */
static const char *fmtname(enum fp4s_wformat f)
{
	return f == FP4S_WF_NVFP4 ? "nvfp4" : f == FP4S_WF_MXFP4 ? "mxfp4" : f == FP4S_WF_BF16 ? "bf16"
	     : f == FP4S_WF_F16 ? "f16" : f == FP4S_WF_F32 ? "f32" : "?";
}

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
	CK(cudaEventDestroy(e0));
	CK(cudaEventDestroy(e1));
	return 2.0 * (double)bytes / (s.median * 1e-3) / 1e9;
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}
static float rnd_normal(void)
{
	double u1 = ((rnd() >> 11) + 1) * 0x1.0p-53, u2 = (rnd() >> 11) * 0x1.0p-53;
	return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

struct shape {
	const char *name;
	int64_t rows, k;
	int nmat;    /* matrices per timed iteration */
	int formats; /* bit per fp4s_wformat */
};

struct result {
	char line[256];
};

static const int FP4 = (1 << FP4S_WF_NVFP4) | (1 << FP4S_WF_MXFP4);

/* One shape x format: allocate rotated sets, validate, time each M (and the ksplit sweep). */
static void run(const shape &sh, enum fp4s_wformat fmt, const cudaDeviceProp &p, double ceiling,
                bool sweep, std::vector<result> &out, int *failed)
{
	const int64_t rows = sh.rows, k = sh.k, n = rows * k;
	size_t data_b, sc_b;
	if (fmt == FP4S_WF_BF16) {
		data_b = (size_t)n * 2;
		sc_b = 0;
	} else {
		data_b = (size_t)n / 2;
		sc_b = (size_t)n / (fmt == FP4S_WF_NVFP4 ? 16 : 32);
	}
	const size_t mat_b = data_b + sc_b, iter_b = mat_b * (size_t)sh.nmat;
	const int nmats = (int)std::max<size_t>((size_t)sh.nmat * 2, 3 * (size_t)p.l2CacheSize / mat_b + 2);

	/* host weights: random codes (any nibble is a valid E2M1), realistic scale bytes */
	std::vector<uint8_t> hd(data_b), hs(sc_b);
	if (fmt == FP4S_WF_BF16) {
		uint16_t *w = (uint16_t *)hd.data();
		for (int64_t i = 0; i < n; i++)
			w[i] = fp4s_f32_to_bf16(rnd_normal() * 0.02f);
	} else {
		for (size_t i = 0; i < data_b; i++)
			hd[i] = (uint8_t)rnd();
		for (size_t i = 0; i < sc_b; i++)
			hs[i] = fmt == FP4S_WF_NVFP4 ? (uint8_t)(0x20 + rnd() % 0x20) /* 2^-3 .. 1.94 */
			                             : (uint8_t)(115 + rnd() % 10); /* 2^-12 .. 2^-3 */
	}
	const float ws2 = 0.0123f;
	std::vector<void *> dd((size_t)nmats);
	std::vector<uint8_t *> ds((size_t)nmats, nullptr);
	for (int i = 0; i < nmats; i++) {
		CK(cudaMalloc(&dd[(size_t)i], data_b));
		CK(cudaMemcpy(dd[(size_t)i], hd.data(), data_b, cudaMemcpyHostToDevice));
		if (sc_b) {
			CK(fp4s_cuda_e2m1_permute(dd[(size_t)i], data_b, 0)); /* the device's code layout */
			CK(cudaMalloc(&ds[(size_t)i], sc_b));
			CK(cudaMemcpy(ds[(size_t)i], hs.data(), sc_b, cudaMemcpyHostToDevice));
		}
	}
	const int MMAX = 16;
	std::vector<float> hx((size_t)(MMAX * k)), yref((size_t)(MMAX * rows)), ygpu(yref.size());
	for (auto &v : hx)
		v = rnd_normal();
	float *dx, *dy;
	CK(cudaMalloc(&dx, hx.size() * sizeof(float)));
	CK(cudaMemcpy(dx, hx.data(), hx.size() * sizeof(float), cudaMemcpyHostToDevice));
	CK(cudaMalloc(&dy, (size_t)sh.nmat * yref.size() * sizeof(float)));

	struct fp4s_error err = {0};
	struct fp4s_mat wh = {fmt, rows, k, hd.data(), sc_b ? hs.data() : nullptr, ws2, nullptr};
	if (fp4s_cpu_matmul(hx.data(), MMAX, &wh, yref.data(), &err)) {
		fprintf(stderr, "CPU reference: %s\n", err.msg);
		exit(1);
	}
	int32_t e8 = 0; /* every copy has the same scale bytes: measure the E8M0 range once */
	{
		struct fp4s_mat w0 = {fmt, rows, k, dd[0], ds[0], ws2, nullptr};
		if (fp4s_cuda_mx_scale_range(&w0, 0, &err)) {
			fprintf(stderr, "%s\n", err.msg);
			exit(1);
		}
		e8 = w0.e8_range;
	}
	auto mat = [&](int i) {
		struct fp4s_mat w = {fmt, rows, k, dd[(size_t)i], ds[(size_t)i], ws2, nullptr, e8};
		return w;
	};
	const int ms[] = {1, 4, 16};
	for (int m : ms) {
		std::vector<float> poison(yref.size(), NAN);
		CK(cudaMemcpy(dy, poison.data(), poison.size() * sizeof(float), cudaMemcpyHostToDevice));
		struct fp4s_mat w = mat(0);
		if (fp4s_cuda_matmul(&w, dx, m, dy, 0, &err)) {
			fprintf(stderr, "%s\n", err.msg);
			exit(1);
		}
		CK(cudaMemcpy(ygpu.data(), dy, (size_t)(m * rows) * sizeof(float), cudaMemcpyDeviceToHost));
		double num = 0, den = 0;
		for (int64_t i = 0; i < m * rows; i++) {
			const double d = (double)ygpu[(size_t)i] - yref[(size_t)i];
			num += std::isnan(d) ? INFINITY : d * d;
			den += (double)yref[(size_t)i] * yref[(size_t)i];
		}
		if (!(sqrt(num / den) <= (fmt == FP4S_WF_BF16 ? 1e-5 : 3e-5))) {
			fprintf(stderr, "MISMATCH %s %s M=%d: rel L2 %.3g\n", sh.name, fmtname(fmt), m,
			        sqrt(num / den));
			*failed = 1;
		}
	}

	cudaEvent_t ev[122];
	for (auto &e : ev)
		CK(cudaEventCreate(&e));
	cudaStream_t cs; /* capturable (the legacy default stream is not) */
	CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
	int next = 0;
	int l2pf = 0; /* tune.l2pf: 0 default, < 0 none */
	/* mma: 0 = the default (tensor cores for FP4), -1 = the FP32 kernels; st < 0: kblocks -st */
	int variant = 0, probe = 0; /* tensor-core kernel shape and load-only probe for the sweep */
	auto iteration = [&](int m, int mma, int tile, int pf, int rpg, int st) {
		struct fp4s_gemv_tune tune = {0,       tile, 0,     pf,   rpg, st > 0 ? st : 0, mma, st < 0 ? -st : 0,
		                              variant, probe, l2pf};
		for (int j = 0; j < sh.nmat; j++) {
			struct fp4s_mat w = mat(next);
			next = (next + 1) % nmats;
			if (fp4s_cuda_matmul_ex(&w, dx, m, dy + (size_t)j * yref.size(), &tune, cs, &err)) {
				fprintf(stderr, "%s\n", err.msg);
				exit(1);
			}
		}
	};
	/* returns the iso median (and fills st, b2b) */
	auto time_it = [&](int m, int ksplit, stats *st, float *b2b, int tile = 0, int pf = 0, int rpg = 0,
	                   int stg = 0) { /* ksplit: passed as the mma knob */
		for (int i = 0; i < 5; i++)
			iteration(m, ksplit, tile, pf, rpg, stg);
		for (int i = 0; i < 60; i++) {
			CK(cudaEventRecord(ev[2 * i], cs));
			iteration(m, ksplit, tile, pf, rpg, stg);
			CK(cudaEventRecord(ev[2 * i + 1], cs));
		}
		CK(cudaEventRecord(ev[120], cs));
		for (int i = 0; i < 50; i++)
			iteration(m, ksplit, tile, pf, rpg, stg);
		CK(cudaEventRecord(ev[121], cs));
		CK(cudaEventSynchronize(ev[121]));
		std::vector<float> t;
		for (int i = 10; i < 60; i++) {
			float ms_;
			CK(cudaEventElapsedTime(&ms_, ev[2 * i], ev[2 * i + 1]));
			t.push_back(ms_);
		}
		*st = summarize(t);
		float tot;
		CK(cudaEventElapsedTime(&tot, ev[120], ev[121]));
		*b2b = tot / 50;
	};
	/* 50 iterations captured once, replayed 8 times (the first discarded): median ms / iteration */
	auto graph_it = [&](int m, int mma, int kblocks = 0) {
		for (int i = 0; i < 3; i++)
			iteration(m, mma, 0, 0, 0, -kblocks);
		CK(cudaStreamSynchronize(cs));
		cudaGraph_t g;
		cudaGraphExec_t ge;
		CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
		for (int i = 0; i < 50; i++)
			iteration(m, mma, 0, 0, 0, -kblocks);
		CK(cudaStreamEndCapture(cs, &g));
		CK(cudaGraphInstantiate(&ge, g, 0));
		std::vector<float> t;
		for (int r = 0; r < 8; r++) {
			CK(cudaEventRecord(ev[0], cs));
			CK(cudaGraphLaunch(ge, cs));
			CK(cudaEventRecord(ev[1], cs));
			CK(cudaEventSynchronize(ev[1]));
			float ms_;
			CK(cudaEventElapsedTime(&ms_, ev[0], ev[1]));
			if (r)
				t.push_back(ms_ / 50);
		}
		CK(cudaGraphExecDestroy(ge));
		CK(cudaGraphDestroy(g));
		return summarize(t).median;
	};
	auto tbs = [&](float ms_) { return (double)iter_b / (ms_ * 1e-3) / 1e12; };
	char shp[64];
	snprintf(shp, sizeof shp, "%lldx%lld%s", (long long)rows, (long long)k, sh.nmat > 1 ? "x4" : "");
	/* Where a launch's time goes in the decode chain (PDL on): 50 launches in a graph, each
	 * block's %globaltimer at entry, after the PDL wait, with x staged and at the end; medians
	 * over the launches of (times from the previous launch's last block end, us) */
	auto timeline = [&]() {
		const int slots = 50, blocks = 4096;
		unsigned long long *dst;
		CK(cudaMalloc(&dst, (size_t)slots * blocks * 4 * 8));
		fp4s_cuda_set_pdl(1);
		l2pf = -1;
		for (int i = 0; i < 3; i++)
			iteration(1, 1, 0, 0, 0, 0);
		CK(cudaStreamSynchronize(cs));
		fp4s_gemv_mma_stamps(dst, slots, blocks);
		cudaGraph_t g;
		cudaGraphExec_t ge;
		CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
		for (int i = 0; i < slots; i++)
			iteration(1, 1, 0, 0, 0, 0);
		CK(cudaStreamEndCapture(cs, &g));
		fp4s_gemv_mma_stamps(NULL, 0, 0);
		CK(cudaGraphInstantiate(&ge, g, 0));
		for (int r = 0; r < 3; r++) {
			CK(cudaMemsetAsync(dst, 0, (size_t)slots * blocks * 4 * 8, cs));
			CK(cudaGraphLaunch(ge, cs));
		}
		CK(cudaStreamSynchronize(cs));
		std::vector<unsigned long long> h((size_t)slots * blocks * 4);
		CK(cudaMemcpy(h.data(), dst, h.size() * 8, cudaMemcpyDeviceToHost));
		CK(cudaGraphExecDestroy(ge));
		CK(cudaGraphDestroy(g));
		CK(cudaFree(dst));
		fp4s_cuda_set_pdl(-1);
		l2pf = 0;
		std::vector<float> first_in, last_in, wait_lo, wait_hi, staged, end_lo, end_hi, stage_med, nb;
		unsigned long long prev_end = 0, gran = 0;
		for (int i = 0; i < slots; i++) {
			unsigned long long e0 = ~0ull, e1 = 0, w0 = ~0ull, w1 = 0, s1 = 0, d0 = ~0ull, d1 = 0;
			std::vector<float> sd;
			for (int b = 0; b < blocks; b++) {
				const unsigned long long *t = &h[((size_t)i * blocks + b) * 4];
				if (!t[3])
					continue;
				e0 = std::min(e0, t[0]), e1 = std::max(e1, t[0]);
				w0 = std::min(w0, t[1]), w1 = std::max(w1, t[1]);
				s1 = std::max(s1, t[2]);
				d0 = std::min(d0, t[3]), d1 = std::max(d1, t[3]);
				sd.push_back((float)(t[2] - t[1]) * 1e-3f);
				gran |= t[0] | t[1] | t[2] | t[3];
			}
			if (sd.empty())
				continue;
			if (prev_end) {
				auto rel = [&](unsigned long long x) { return (float)((long long)(x - prev_end)) * 1e-3f; };
				first_in.push_back(rel(e0));
				last_in.push_back(rel(e1));
				wait_lo.push_back(rel(w0));
				wait_hi.push_back(rel(w1));
				staged.push_back(rel(s1));
				end_lo.push_back(rel(d0));
				end_hi.push_back(rel(d1));
				std::sort(sd.begin(), sd.end());
				stage_med.push_back(sd[sd.size() / 2]);
				nb.push_back((float)sd.size());
			}
			prev_end = d1;
		}
		auto med = [](std::vector<float> v) {
			if (v.empty())
				return 0.0f;
			std::sort(v.begin(), v.end());
			return v[v.size() / 2];
		};
		int tz = 0;
		while (tz < 20 && !(gran >> tz & 1))
			tz++;
		printf("\ntimeline%s %-14s %-6s M=1 (us after the previous launch's last block; %g blocks; timer step 2^%d ns):"
		       " first entry %.2f, last entry %.2f, first wait done %.2f, last %.2f, block staging %.2f, last staged "
		       "%.2f, first block done %.2f, last %.2f",
		       variant ? (variant == 2 ? "(v2)" : "(v?)") : "", shp, fmtname(fmt), med(nb), tz, med(first_in), med(last_in), med(wait_lo), med(wait_hi), med(stage_med),
		       med(staged), med(end_lo), med(end_hi));
	};
	if (sweep) {
		printf("sweep %-14s %-6s tensor-core b2b TB/s M/kblocks:", shp, fmtname(fmt));
		const int sw[][2] = {{1, 1}, {1, 2}, {1, 3}, {1, 4}, {1, 6}, {1, 8}, {4, 1}, {4, 2}, {4, 4}, {16, 2}, {16, 4}};
		for (auto &q : sw) {
			stats st;
			float b2b;
			time_it(q[0], 1, &st, &b2b, 0, 0, 0, -q[1]);
			printf(" %d/%d:%.2f", q[0], q[1], tbs(b2b));
		}
		printf("\n");
		/* M = 1: the kernel shapes (warps a block / steps in flight), and each one's loads alone */
		printf("sweep %-14s %-6s tensor-core M=1 variant(W/D) b2b TB/s [loads only]:", shp, fmtname(fmt));
		const char *vn[] = {"8/4", "8/8", "4/4", "4/8"};
		for (int v = 0; v < 4; v++) {
			stats st;
			float b2b, b2bp;
			variant = v;
			time_it(1, 1, &st, &b2b, 0, 0, 0, 0);
			probe = 1;
			time_it(1, 1, &st, &b2bp, 0, 0, 0, 0);
			probe = 0;
			printf(" %s:%.2f[%.2f]", vn[v], tbs(b2b), tbs(b2bp));
		}
		variant = 0;
		printf("\n");
		fflush(stdout);
	}
	if (fmt != FP4S_WF_BF16) {
		/* decode: graph replay at M = 1 and 4, PDL off / on, L2 prefetch distance (tiles) */
		for (int m : {1, 4}) {
			printf("decode %-14s %-6s M=%d graph TB/s:", shp, fmtname(fmt), m);
			/* pdl, l2pf, K blocks (0: automatic); splitting K and L2 prefetch measured slower */
			const int cfg[][4] = {{0, -1, 0, 0}, {1, -1, 0, 0}, {1, 2, 0, 0}, {1, -1, 2, 0},
			                      {1, -1, 0, 4}, {1, -1, 0, 2}, {1, -1, 0, 3}, {1, -1, 0, 1}};
			for (auto &c : cfg) {
				fp4s_cuda_set_pdl(c[0]);
				l2pf = c[1];
				variant = c[3];
				const float t = graph_it(m, 1, c[2]);
				static const char *const vn[] = {"", "/v1(8w,8 deep)", "/v2(4w)", "/v3(4w,8 deep)", "/v4(16w)"};
				printf(" pdl%d/l2pf%d/kb%d%s:%.2f(%.1fus)", c[0], c[1] < 0 ? 0 : c[1], c[2], vn[c[3]], tbs(t), t * 1e3);
			}
			variant = 0;
			if (m == 1) {
				/* loads only, in the stored layout and as if each warp step's bytes were
				 * contiguous; then the whole kernel on the contiguous pattern */
				fp4s_cuda_set_pdl(1);
				l2pf = -1;
				float t[3];
				for (int pr = 1; pr <= 3; pr++) {
					probe = pr;
					t[pr - 1] = graph_it(m, 1);
				}
				printf(" [loads only: %.2f, contiguous: %.2f; kernel on contiguous: %.2f(%.1fus)]", tbs(t[0]),
				       tbs(t[1]), tbs(t[2]), t[2] * 1e3);
				probe = 0;
				if (sh.nmat == 1) {
					timeline();
					variant = 2;
					timeline();
					variant = 0;
				}
			}
			fp4s_cuda_set_pdl(-1);
			l2pf = 0;
			printf("\n");
			fflush(stdout);
		}
	}
	/* the default (FP4: the tensor-core kernel) and the FP32 register kernel (library rows) */
	for (int m : ms) {
		stats st, st2;
		float b2b, b2b2;
		time_it(m, 0, &st, &b2b, 0, 0, 0, 0);
		const float gr = graph_it(m, 0);
		time_it(m, -1, &st2, &b2b2, 0, 0, 0, 1);
		const float gr2 = graph_it(m, -1);
		result r;
		snprintf(r.line, sizeof r.line,
		         "%-16s %-6s %3d | %7.1f %7.1f %7.1f %5.2f %5.1f%% | %7.1f %7.1f %5.2f %5.1f%%%s", shp,
		         fmtname(fmt), m, st.median * 1e3, b2b * 1e3, gr * 1e3, tbs(gr), 100 * tbs(gr) * 1e3 / ceiling,
		         b2b2 * 1e3, gr2 * 1e3, tbs(gr2), 100 * tbs(gr2) * 1e3 / ceiling,
		         iter_b * (size_t)nmats / (size_t)sh.nmat < 3 * (size_t)p.l2CacheSize ? " (L2!)" : "");
		out.push_back(r);
		fprintf(stderr, "%s  [iso TB/s %.2f / %.2f]\n", r.line, tbs(st.median), tbs(st2.median));
	}
	for (auto &e : ev)
		CK(cudaEventDestroy(e));
	CK(cudaStreamDestroy(cs));
	for (int i = 0; i < nmats; i++) {
		CK(cudaFree(dd[(size_t)i]));
		if (ds[(size_t)i])
			CK(cudaFree(ds[(size_t)i]));
	}
	CK(cudaFree(dx));
	CK(cudaFree(dy));
}

int main(int argc, char **argv)
{
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
		fprintf(stderr, "no CUDA device\n");
		return 1;
	}
	const bool quick = argc > 1 && !strcmp(argv[1], "quick");
	const char *only = argc > 2 ? argv[2] : NULL; /* a shape name: for profiling one kernel */
	cudaDeviceProp p;
	CK(cudaGetDeviceProperties(&p, 0));
	int sm_clock = 0, mem_clock = 0, drv = 0, rt = 0;
	cudaDeviceGetAttribute(&sm_clock, cudaDevAttrClockRate, 0);
	cudaDeviceGetAttribute(&mem_clock, cudaDevAttrMemoryClockRate, 0);
	cudaDriverGetVersion(&drv);
	cudaRuntimeGetVersion(&rt);
	const double ceiling = copy_ceiling_gbs();
	printf("gpu: %s, %d SMs, %.0f MB L2, max SM clock %d MHz, memory clock %d MHz, driver %d, "
	       "runtime %d, fp4serve %s\n",
	       p.name, p.multiProcessorCount, p.l2CacheSize / 1e6, sm_clock / 1000, mem_clock / 1000, drv,
	       rt, FP4S_GIT_COMMIT);
	printf("copy ceiling (1 GiB device-to-device, read+write): %.0f GB/s\n", ceiling);

	const int BF = 1 << FP4S_WF_BF16;
	const shape shapes[] = {
	    {"down-in", 14336, 4096, 1, FP4},  {"down", 4096, 14336, 1, FP4},
	    {"gate+up", 28672, 4096, 1, FP4},  {"experts", 5760, 2880, 4, FP4},
	    {"qkv", 6144, 4096, 1, FP4},       {"o", 4096, 4096, 1, FP4 | BF},
	    {"oss", 2880, 2880, 1, FP4},       {"lm_head", 128256, 4096, 1, BF},
	    {"tiny", 256, 4096, 1, 1 << FP4S_WF_NVFP4}, /* fixed cost per launch */
	};
	std::vector<result> out;
	int failed = 0;
	for (const shape &sh : shapes) {
		if ((quick && sh.rows == 128256) || (only && strcmp(only, sh.name)))
			continue;
		for (int f = 0; f < FP4S_WF_COUNT; f++)
			if (sh.formats & (1 << f))
				run(sh, (enum fp4s_wformat)f, p, ceiling, !quick && f != FP4S_WF_BF16, out, &failed);
	}
	printf("\n%-16s %-6s %3s | %-40s | %-32s\n", "", "", "", "default (FP4: tensor cores; TB/s of graph)",
	       "FP32 register kernel (TB/s of graph)");
	printf("%-16s %-6s %3s | %7s %7s %7s %5s %6s | %7s %7s %5s %6s\n", "rows x K", "format", "M",
	       "iso us", "b2b us", "graph", "TB/s", "%copy", "b2b us", "graph", "TB/s", "%copy");
	for (auto &r : out)
		printf("%s\n", r.line);
	if (failed)
		printf("VALIDATION FAILED\n");
	return failed;
}
