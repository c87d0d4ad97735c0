// attn_bench.cu: decode attention (fp4s_cuda_attention) over a BF16 paged KV cache: time, GB/s
// of KV bytes read and % of the copy ceiling, old kernel (dev/attn_bench_old.cuh) vs new; and the
// new kernel over an FP8 (E4M3) cache of the same values, next to BF16.
//
// Build: part of the CMake build when nvcc exists (target attn_bench).
// Run: ./attn_bench [sweep]   (sweep: also time the tensor-core kernel's tunings: warps / blocks
// per SM / shared-memory ring stages or "regs" (tiles straight into registers))
//      FP4S_AB_ONLY=GEO/N/CTX[/VARIANT] runs that one case alone (to profile it with ncu)
//
// Method (performance.md §7): first the device-to-device copy ceiling (bytes read + written);
// then per geometry (llama3-8b 32/8 x 128; gpt-oss 64/8 x 64 with sinks, full and 128-window
// layers; qwen3-30b-a3b 32/4 x 128), context (512 / 4096 / 16384) and batch (1, or 64 tokens of
// 64 different sequences of that length): validate a couple of tokens against a double-precision
// reference on the host, warm up, time 40 calls with a CUDA event pair around each (10
// discarded; "iso", median), and one CUDA graph of 20 calls replayed 5 times ("graph": what a
// decode step replayed as a graph sees; per-call median). K/V are deterministic hash values
// (never all zeros), the pool's blocks are shuffled, and the calls rotate over enough copies of
// the cache (other slots of one pool) that the set cycled through is > 3x the L2: every call
// streams from DRAM. Bytes counted: K and V rows read (keys x nkv x d x 2 B x 2, FP8: 1 B); q,
// the table and the output are < 1% and not counted. The split count is the engine's (attn_splits
// in cuda_backend.cu, max_ctx 32768). The FP8 cache holds the same hash values rounded to E4M3
// (its reference reads those), in a pool of its own with the same blocks and rotation.
#include <algorithm>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "attn_bench_old.cuh"
#include "backend/backend.h"
#include "backend/cuda/attention_cuda.h"
#include "numerics/numerics.h"
#include "dev_util.h"

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
	std::sort(t.begin(), t.end());
	CK(cudaFree(a));
	CK(cudaFree(b));
	CK(cudaEventDestroy(e0));
	CK(cudaEventDestroy(e1));
	return 2.0 * (double)bytes / (t[t.size() / 2] * 1e-3) / 1e9;
}

/* K/V element idx of the pool: a hash turned into a value in [-3, 3) with unit variance, the same
 * float on host and device (sums of integers, a power-of-two scale), then rounded to BF16 */
static __host__ __device__ float hval(uint64_t idx, uint64_t seed)
{
	uint64_t z = idx * 0x9E3779B97F4A7C15ull + seed;
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	z ^= z >> 31;
	const int32_t s = (int32_t)(z & 0xFFFFF) + (int32_t)((z >> 20) & 0xFFFFF) + (int32_t)((z >> 40) & 0xFFFFF);
	return (float)(s - 3 * (1 << 19)) * (2.0f / (float)(1 << 20));
}

static __global__ void fill_kernel(uint16_t *p, size_t n, uint64_t seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = fp4s_f32_to_bf16(hval(i, seed));
}

static __global__ void fill8_kernel(uint8_t *p, size_t n, uint64_t seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = fp4s_f32_to_e4m3(hval(i, seed));
}

/* element idx of the pool as the cache of type kv holds it */
static float cache_val(uint64_t idx, uint64_t seed, int kv)
{
	const float x = hval(idx, seed);
	return kv == FP4S_KV_FP8 ? fp4s_e4m3_to_f32(fp4s_f32_to_e4m3(x)) : fp4s_bf16_to_f32(fp4s_f32_to_bf16(x));
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

struct geo {
	const char *name;
	int nh, nkv, d, window, sinks;
};

struct variant {
	const char *name;
	int old;
	fp4s_attn_tune tune;
	int kv; /* FP4S_KV_BF16 (0 taken as that) or FP4S_KV_FP8 */
};

struct timing {
	float iso_us, graph_us;
};

static const uint64_t KSEED = 0x1234, VSEED = 0x5678;

/* engine's attn_splits for a cache of max_ctx positions */
static int engine_splits(int sms, int n, int nkv, int max_ctx)
{
	int want = (8 * sms + n * nkv - 1) / (n * nkv), most = (max_ctx + 31) / 32;
	want = want < most ? want : most;
	return want < 1 ? 1 : (want > 128 ? 128 : want);
}

struct setup {
	const geo *g;
	int n, ctx, sets, stride, splits;
	size_t call_bytes; /* BF16; FP8 reads half */
	uint16_t *kc, *vc;
	uint8_t *k8, *v8;  /* the same values as E4M3 */
	float *q, *sinks, *out, *work;
	int32_t *pos, *table, *seq; /* seq: sets x n */
	std::vector<int32_t> htable;
	std::vector<float> hq, hsinks;
};

/* the exact attention of the checked tokens (the first and last of set 0), all heads, over the
 * values the cache of type kv holds */
static std::vector<double> reference(const setup &s, int kv)
{
	const geo &g = *s.g;
	const int G = g.nh / g.nkv, kvw = g.nkv * g.d;
	const float scale = 1.0f / sqrtf((float)g.d);
	std::vector<double> want;
	const int toks[2] = {0, s.n - 1};
	for (int ti = 0; ti < (s.n > 1 ? 2 : 1); ti++) {
		const int i = toks[ti], p = s.ctx - 1, sq = i; /* set 0: slot i */
		const int start = g.window > 0 && p - g.window + 1 > 0 ? p - g.window + 1 : 0;
		std::vector<double> sc(p + 1);
		for (int h = 0; h < g.nh; h++) {
			const size_t off = (size_t)(h / G) * g.d;
			double m = g.sinks ? s.hsinks[h] : -INFINITY;
			for (int t = start; t <= p; t++) {
				const size_t row = (size_t)s.htable[(size_t)sq * s.stride + t / FP4S_KV_BLOCK] * FP4S_KV_BLOCK +
				                   t % FP4S_KV_BLOCK;
				double a = 0;
				for (int j = 0; j < g.d; j++)
					a += (double)s.hq[((size_t)i * g.nh + h) * g.d + j] * cache_val(row * kvw + off + j, KSEED, kv);
				sc[t] = a * scale;
				m = sc[t] > m ? sc[t] : m;
			}
			double l = g.sinks ? exp(s.hsinks[h] - m) : 0;
			std::vector<double> o(g.d, 0.0);
			for (int t = start; t <= p; t++) {
				const size_t row = (size_t)s.htable[(size_t)sq * s.stride + t / FP4S_KV_BLOCK] * FP4S_KV_BLOCK +
				                   t % FP4S_KV_BLOCK;
				const double e = exp(sc[t] - m);
				l += e;
				for (int j = 0; j < g.d; j++)
					o[j] += e * cache_val(row * kvw + off + j, VSEED, kv);
			}
			for (int j = 0; j < g.d; j++)
				want.push_back(o[j] / l);
		}
	}
	return want;
}

/* one call on set 0 (output poisoned first) against the reference: relative L2 */
static double check(const setup &s, const variant &v, const std::vector<double> &want, cudaStream_t st)
{
	const geo &g = *s.g;
	const bool f8 = v.kv == FP4S_KV_FP8;
	std::vector<float> got((size_t)s.n * g.nh * g.d, NAN);
	CK(cudaMemcpy(s.out, got.data(), got.size() * 4, cudaMemcpyHostToDevice));
	CK(cudaDeviceSynchronize()); /* the pageable copy may still be landing; st does not wait */
	struct fp4s_error err = {0};
	const float scale = 1.0f / sqrtf((float)g.d);
	if (v.old)
		old_attn::launch(s.q, s.kc, s.vc, s.pos, s.seq, s.table, s.stride, s.n, g.nh, g.nkv, g.d, g.window,
		                 g.sinks ? s.sinks : NULL, scale, s.splits, s.work, s.out, st);
	else if (fp4s_cuda_attention_ex(s.q, f8 ? (const void *)s.k8 : s.kc, f8 ? (const void *)s.v8 : s.vc,
	                                f8 ? FP4S_KV_FP8 : FP4S_KV_BF16, s.pos, s.seq, s.table, s.stride, s.n, g.nh,
	                                g.nkv, g.d, g.window, g.sinks ? s.sinks : NULL, scale, s.splits, s.work, s.out,
	                                &v.tune, st, &err)) {
		fprintf(stderr, "attention: %s\n", err.msg);
		exit(1);
	}
	CK(cudaStreamSynchronize(st));
	CK(cudaGetLastError());
	CK(cudaMemcpy(got.data(), s.out, got.size() * 4, cudaMemcpyDeviceToHost));
	double num = 0, den = 0;
	const size_t w = (size_t)g.nh * g.d;
	const int toks[2] = {0, s.n - 1};
	for (int ti = 0; ti < (s.n > 1 ? 2 : 1); ti++)
		for (size_t j = 0; j < w; j++) {
			const double x = got[(size_t)toks[ti] * w + j], y = want[ti * w + j];
			num += std::isnan(x) ? INFINITY : (x - y) * (x - y);
			den += y * y;
		}
	return sqrt(num / den);
}

static timing time_variant(const setup &s, const variant &v, cudaStream_t st)
{
	const geo &g = *s.g;
	const float scale = 1.0f / sqrtf((float)g.d);
	const bool f8 = v.kv == FP4S_KV_FP8;
	int next = 0;
	struct fp4s_error err = {0};
	auto call = [&]() {
		const int32_t *seq = s.seq + (size_t)next * s.n;
		next = (next + 1) % s.sets;
		if (v.old)
			old_attn::launch(s.q, s.kc, s.vc, s.pos, seq, s.table, s.stride, s.n, g.nh, g.nkv, g.d, g.window,
			                 g.sinks ? s.sinks : NULL, scale, s.splits, s.work, s.out, st);
		else if (fp4s_cuda_attention_ex(s.q, f8 ? (const void *)s.k8 : s.kc, f8 ? (const void *)s.v8 : s.vc,
		                                f8 ? FP4S_KV_FP8 : FP4S_KV_BF16, s.pos, seq, s.table, s.stride, s.n, g.nh,
		                                g.nkv, g.d, g.window, g.sinks ? s.sinks : NULL, scale, s.splits, s.work,
		                                s.out, &v.tune, st, &err)) {
			fprintf(stderr, "attention: %s\n", err.msg);
			exit(1);
		}
	};
	cudaEvent_t ev[82];
	for (auto &e : ev)
		CK(cudaEventCreate(&e));
	for (int i = 0; i < 5; i++)
		call();
	for (int i = 0; i < 40; i++) {
		CK(cudaEventRecord(ev[2 * i], st));
		call();
		CK(cudaEventRecord(ev[2 * i + 1], st));
	}
	CK(cudaStreamSynchronize(st));
	CK(cudaGetLastError());
	std::vector<float> t;
	for (int i = 10; i < 40; i++) {
		float ms;
		CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
		t.push_back(ms);
	}
	std::sort(t.begin(), t.end());
	timing r;
	r.iso_us = t[t.size() / 2] * 1e3f;
	/* a graph of 20 calls, replayed */
	const int per_graph = 20;
	cudaGraph_t gr;
	cudaGraphExec_t ex;
	CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
	for (int i = 0; i < per_graph; i++)
		call();
	CK(cudaStreamEndCapture(st, &gr));
	CK(cudaGraphInstantiate(&ex, gr, 0));
	CK(cudaGraphLaunch(ex, st)); /* warm-up */
	std::vector<float> tg;
	for (int i = 0; i < 5; i++) {
		CK(cudaEventRecord(ev[80], st));
		CK(cudaGraphLaunch(ex, st));
		CK(cudaEventRecord(ev[81], st));
		CK(cudaEventSynchronize(ev[81]));
		float ms;
		CK(cudaEventElapsedTime(&ms, ev[80], ev[81]));
		tg.push_back(ms);
	}
	std::sort(tg.begin(), tg.end());
	r.graph_us = tg[tg.size() / 2] * 1e3f / per_graph;
	CK(cudaGraphExecDestroy(ex));
	CK(cudaGraphDestroy(gr));
	for (auto &e : ev)
		CK(cudaEventDestroy(e));
	return r;
}

int main(int argc, char **argv)
{
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
		fprintf(stderr, "no CUDA device\n");
		return 1;
	}
	const bool sweep = argc > 1 && !strcmp(argv[1], "sweep");
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
	       p.name, p.multiProcessorCount, p.l2CacheSize / 1e6, sm_clock / 1000, mem_clock / 1000, drv, rt,
	       FP4S_GIT_COMMIT);
	printf("copy ceiling (1 GiB device-to-device, read+write): %.0f GB/s\n", ceiling);
	struct fp4s_error err = {0};
	if (fp4s_cuda_attention_setup(&err)) {
		fprintf(stderr, "setup: %s\n", err.msg);
		return 1;
	}
	CK(old_attn::setup());
	cudaStream_t st;
	CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

	const geo geos[] = {
	    {"llama3-8b", 32, 8, 128, 0, 0},
	    {"gpt-oss", 64, 8, 64, 0, 1},
	    {"gpt-oss-swa128", 64, 8, 64, 128, 1},
	    {"qwen3-30b-a3b", 32, 4, 128, 0, 0},
	};
	const int ctxs[] = {512, 4096, 16384};
	const int batches[] = {1, 64};
	std::vector<variant> vars = {{"old", 1, {0, 0, 0, 0, 0, 0}, FP4S_KV_BF16},
	                             {"new", 0, {0, 0, 0, 0, 0, 0}, FP4S_KV_BF16},
	                             {"new-fp8", 0, {0, 0, 0, 0, 0, 0}, FP4S_KV_FP8}};
	if (sweep) {
		/* warps / blocks per SM / stages, fused or a separate merge, fewest tiles per block */
		static char names[64][32];
		int k = 0;
		for (int w = 4; w <= 8; w *= 2)
			for (int bps = 1; bps <= 3; bps++)
				for (int st = 2; st <= 4; st++) {
					if (w == 8 && st == 4)
						continue; /* does not fit for d = 128 */
					snprintf(names[k], sizeof names[k], "w%d/b%d/s%d", w, bps, st);
					vars.push_back({names[k], 0, {w, bps, 0, 0, 0, st}, FP4S_KV_BF16});
					k++;
				}
		vars.push_back({"w8/b1/s3/unf", 0, {8, 1, 0, 1, 0, 3}, FP4S_KV_BF16});
		vars.push_back({"w8/b1/s3/mt4", 0, {8, 1, 4, 0, 0, 3}, FP4S_KV_BF16});
		vars.push_back({"w8/b2/s2/mt2", 0, {8, 2, 2, 0, 0, 2}, FP4S_KV_BF16});
		for (int w = 4; w <= 8; w *= 2)
			for (int bps = 1; bps <= 2; bps++) {
				snprintf(names[k], sizeof names[k], "w%d/b%d/regs", w, bps);
				vars.push_back({names[k], 0, {w, bps, 0, 0, 0, 1}, FP4S_KV_BF16});
				k++;
			}
	}
	std::vector<char *> table_lines, fp8_lines;
	int failed = 0;
	char only_geo[32] = "", only_var[32] = "";
	int only_n = 0, only_ctx = 0;
	if (const char *o = getenv("FP4S_AB_ONLY"))
		if (sscanf(o, "%31[^/]/%d/%d/%31s", only_geo, &only_n, &only_ctx, only_var) < 3) {
			fprintf(stderr, "FP4S_AB_ONLY: GEO/N/CTX[/VARIANT], not %s\n", o);
			return 1;
		}
	for (const geo &g : geos)
		for (int n : batches)
			for (int ctx : ctxs) {
				if (g.window && ctx != 4096)
					continue; /* a window layer reads 128 keys whatever the context */
				if (only_geo[0] && (strcmp(only_geo, g.name) || n != only_n || ctx != only_ctx))
					continue;
				setup s;
				s.g = &g;
				s.n = n;
				s.ctx = ctx;
				const int keys = g.window && g.window < ctx ? g.window : ctx;
				s.call_bytes = (size_t)n * keys * g.nkv * g.d * 2 * 2;
				/* sets: the pool holds enough slots that the rotation exceeds 3x L2, for the FP8
				 * cache too (half the bytes a call) */
				const size_t seq_bytes = (size_t)ctx * g.nkv * g.d * 2 * 2;
				s.sets = (int)std::max<size_t>(2, 3 * (size_t)p.l2CacheSize / (s.call_bytes / 2) + 2);
				s.stride = (ctx + FP4S_KV_BLOCK - 1) / FP4S_KV_BLOCK;
				const int slots = s.sets * n;
				const size_t nblocks = (size_t)slots * s.stride;
				const size_t pool = nblocks * FP4S_KV_BLOCK * g.nkv * g.d;
				(void)seq_bytes;
				s.splits = engine_splits(p.multiProcessorCount, n, g.nkv, 32768);
				CK(cudaMalloc(&s.kc, pool * 2));
				CK(cudaMalloc(&s.vc, pool * 2));
				CK(cudaMalloc(&s.k8, pool));
				CK(cudaMalloc(&s.v8, pool));
				fill_kernel<<<4096, 256>>>(s.kc, pool, KSEED);
				fill_kernel<<<4096, 256>>>(s.vc, pool, VSEED);
				fill8_kernel<<<4096, 256>>>(s.k8, pool, KSEED);
				fill8_kernel<<<4096, 256>>>(s.v8, pool, VSEED);
				CK(cudaGetLastError());
				/* scattered blocks */
				std::vector<int32_t> perm(nblocks);
				for (size_t i = 0; i < nblocks; i++)
					perm[i] = (int32_t)i;
				for (size_t i = nblocks - 1; i > 0; i--)
					std::swap(perm[i], perm[rnd() % (i + 1)]);
				s.htable = perm; /* slot x stride */
				std::vector<int32_t> hpos(n, ctx - 1), hseq((size_t)slots);
				for (int i = 0; i < slots; i++)
					hseq[i] = i;
				s.hq.resize((size_t)n * g.nh * g.d);
				for (auto &x : s.hq)
					x = rnd_normal();
				s.hsinks.resize(g.nh);
				for (auto &x : s.hsinks)
					x = rnd_normal() + 1.0f;
				CK(cudaMalloc(&s.table, nblocks * 4));
				CK(cudaMemcpy(s.table, s.htable.data(), nblocks * 4, cudaMemcpyHostToDevice));
				CK(cudaMalloc(&s.pos, n * 4));
				CK(cudaMemcpy(s.pos, hpos.data(), n * 4, cudaMemcpyHostToDevice));
				CK(cudaMalloc(&s.seq, slots * 4));
				CK(cudaMemcpy(s.seq, hseq.data(), slots * 4, cudaMemcpyHostToDevice));
				CK(cudaMalloc(&s.q, s.hq.size() * 4));
				CK(cudaMemcpy(s.q, s.hq.data(), s.hq.size() * 4, cudaMemcpyHostToDevice));
				CK(cudaMalloc(&s.sinks, g.nh * 4));
				CK(cudaMemcpy(s.sinks, s.hsinks.data(), g.nh * 4, cudaMemcpyHostToDevice));
				CK(cudaMalloc(&s.out, s.hq.size() * 4));
				const int64_t wf = fp4s_cuda_attention_work_floats(n, g.nh, g.nkv, g.d, s.splits);
				CK(cudaMalloc(&s.work, (size_t)wf * 4));
				timing base = {0, 0}, bf16 = {0, 0};
				const std::vector<double> want = reference(s, FP4S_KV_BF16), want8 = reference(s, FP4S_KV_FP8);
				const bool sweep_here = sweep && ((n == 1 && ctx >= 4096) || (n == 64 && ctx == 4096));
				for (const variant &v : vars) {
					const bool main_row = v.old || !strcmp(v.name, "new") || !strcmp(v.name, "new-fp8");
					if (!main_row && !sweep_here)
						continue;
					if (only_var[0] && strcmp(only_var, v.name))
						continue;
					const bool f8 = v.kv == FP4S_KV_FP8;
					const double rel = check(s, v, f8 ? want8 : want, st);
					const double tol = v.old ? 1e-5 : 2e-5;
					if (!(rel <= tol)) {
						fprintf(stderr, "MISMATCH %s n=%d ctx=%d %s: rel L2 %.3g\n", g.name, n, ctx, v.name, rel);
						failed = 1;
					}
					const timing t = time_variant(s, v, st);
					if (v.old)
						base = t;
					if (!strcmp(v.name, "new"))
						bf16 = t;
					const size_t bytes = f8 ? s.call_bytes / 2 : s.call_bytes;
					const double gbs = (double)bytes / (t.graph_us * 1e-6) / 1e9;
					char *line = (char *)malloc(256);
					snprintf(line, 256, "%-15s %3d %6d %-12s | %8.1f %8.1f | %7.0f %5.1f%% | %5.2fx | %.1e%s",
					         g.name, n, ctx, v.name, t.iso_us, t.graph_us, gbs, 100 * gbs / ceiling,
					         base.graph_us / t.graph_us, rel,
					         (size_t)s.sets * bytes < 3 * (size_t)p.l2CacheSize ? " (L2!)" : "");
					if (f8 && bf16.graph_us > 0) {
						/* FP8 next to BF16: graph us, % of copy, speed-up */
						const double gb16 = (double)s.call_bytes / (bf16.graph_us * 1e-6) / 1e9;
						char *l8 = (char *)malloc(256);
						snprintf(l8, 256, "%-15s %3d %6d | %8.1f %5.1f%% | %8.1f %5.1f%% | %5.2fx", g.name, n, ctx,
						         bf16.graph_us, 100 * gb16 / ceiling, t.graph_us, 100 * gbs / ceiling,
						         bf16.graph_us / t.graph_us);
						fp8_lines.push_back(l8);
					}
					fprintf(stderr, "%s\n", line);
					if (!sweep || main_row)
						table_lines.push_back(line);
					else
						free(line);
				}
				CK(cudaFree(s.kc));
				CK(cudaFree(s.vc));
				CK(cudaFree(s.k8));
				CK(cudaFree(s.v8));
				CK(cudaFree(s.table));
				CK(cudaFree(s.pos));
				CK(cudaFree(s.seq));
				CK(cudaFree(s.q));
				CK(cudaFree(s.sinks));
				CK(cudaFree(s.out));
				CK(cudaFree(s.work));
			}
	printf("\n%-15s %3s %6s %-12s | %8s %8s | %7s %6s | %6s | %s\n", "geometry", "n", "ctx", "kernel", "iso us",
	       "graph us", "GB/s", "%copy", "speed", "rel err");
	for (char *l : table_lines) {
		printf("%s\n", l);
		free(l);
	}
	printf("\nFP8 (E4M3) KV next to BF16, new kernel, graph us per call; %%copy = KV bytes read / time / "
	       "copy ceiling\n%-15s %3s %6s | %8s %6s | %8s %6s | %s\n", "geometry", "n", "ctx", "BF16 us", "%copy",
	       "FP8 us", "%copy", "FP8 speed-up");
	for (char *l : fp8_lines) {
		printf("%s\n", l);
		free(l);
	}
	if (failed)
		printf("VALIDATION FAILED\n");
	return failed;
}
