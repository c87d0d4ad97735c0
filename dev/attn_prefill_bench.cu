// attn_prefill_bench.cu: prefill attention on tensor cores (fp4s_cuda_attention_prefill) against
// the split-K kernel the engine uses today (fp4s_cuda_attention), BF16 KV cache.
//
// Build: part of the CMake build when nvcc exists (target attn_prefill_bench). Run:
// ./attn_prefill_bench [quick], or ./attn_prefill_bench one GEOM TOKENS [BN MT] for a profiler
//
// Method (performance.md §7, METHOD.md): per case, random inputs (q FP32 normal, K/V BF16 normal,
// sinks; never zeros) in a paged cache whose blocks are scattered over a shuffled pool; the
// prefill kernel is validated against the split-K kernel on the same inputs first (relative L2
// <= 1e-2: the prefill kernel rounds q and P to BF16, ~2e-3 each; tests/ops has the tight
// check against a double reference). Then each kernel is warmed up (2 calls) and timed with a
// CUDA event pair around each call, 5..30 calls (until ~1 s), and the median is reported. The
// inputs of the 512-token cases fit in L2, as they would in the model right after the K/V write.
//
// FLOPs: 4 d per (query head, visible key) pair: 2 d for q.k and 2 d for p.v, counting only the
// pairs the causal mask and the window leave (the prefill kernel also computes part of the
// diagonal tiles it then masks; that is not counted). The split-K kernel gets the engine's
// split count (cu_attention's attn_splits: ~8 blocks per SM, a context of 8192).
//
// Sections: (1) the three models' geometries (gpt-oss both layer kinds) at 512 / 2048 / 8192
// token prompts; (2) tile-shape variants and the planning kernel's cost (reuse_plan); (3) batch
// shapes for the dispatch rule: decode-only batches, short chunks after a prefix, and prompt
// chunks mixed with decode tokens.
#include <algorithm>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <functional>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attention_cuda.h"
#include "backend/cuda/attention_prefill_cuda.h"
#include "numerics/numerics.h"
#include "dev_util.h"

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

struct geom {
	const char *name;
	int nh, nkv, d, window, sinks;
};

struct seg {
	int slot, p0, len;
};

static int g_sms;
static const int MAX_CTX = 8192; /* the context the engine's split count is computed for */

/* cu_attention's split count (cuda_backend.cu attn_splits) */
static int engine_splits(int n, int nkv)
{
	int want = (8 * g_sms + n * nkv - 1) / (n * nkv), most = (MAX_CTX + 31) / 32;
	want = want < most ? want : most;
	return want < 1 ? 1 : (want > 128 ? 128 : want);
}

struct prob {
	geom g;
	int n, table_stride, splits;
	double flops;
	int32_t *pos, *seq, *table;
	float *q, *out, *ref, *sinks, *work_sk;
	uint16_t *kc, *vc;
	void *work;
};

static prob make(const geom &g, const std::vector<seg> &segs)
{
	prob p;
	p.g = g;
	std::vector<int32_t> pos, seq;
	int slots = 0;
	for (const seg &s : segs) {
		for (int t = 0; t < s.len; t++)
			pos.push_back(s.p0 + t), seq.push_back(s.slot);
		slots = std::max(slots, s.slot + 1);
	}
	p.n = (int)pos.size();
	std::vector<int> last(slots, -1);
	for (int i = 0; i < p.n; i++)
		last[seq[i]] = std::max(last[seq[i]], pos[i]);
	int used = 0;
	p.table_stride = 1;
	for (int s = 0; s < slots; s++) {
		const int nb = last[s] / FP4S_KV_BLOCK + 1;
		used += nb;
		p.table_stride = std::max(p.table_stride, nb);
	}
	std::vector<int> perm(used);
	for (int i = 0; i < used; i++)
		perm[i] = i;
	for (int i = used - 1; i > 0; i--)
		std::swap(perm[i], perm[rnd() % (uint64_t)(i + 1)]);
	std::vector<int32_t> table((size_t)slots * p.table_stride, 0);
	int next = 0;
	for (int s = 0; s < slots; s++)
		for (int b = 0; b <= last[s] / FP4S_KV_BLOCK; b++)
			table[(size_t)s * p.table_stride + b] = perm[next++];
	const size_t kvn = (size_t)used * FP4S_KV_BLOCK * g.nkv * g.d, qn = (size_t)p.n * g.nh * g.d;
	std::vector<uint16_t> kv(kvn);
	std::vector<float> q(qn), sinks(g.nh);
	CK(cudaMalloc(&p.kc, kvn * 2));
	CK(cudaMalloc(&p.vc, kvn * 2));
	for (int m = 0; m < 2; m++) {
		for (size_t i = 0; i < kvn; i++)
			kv[i] = fp4s_f32_to_bf16(rnd_normal());
		CK(cudaMemcpy(m ? p.vc : p.kc, kv.data(), kvn * 2, cudaMemcpyHostToDevice));
	}
	for (size_t i = 0; i < qn; i++)
		q[i] = rnd_normal() * 1.5f;
	for (int h = 0; h < g.nh; h++)
		sinks[h] = rnd_normal();
	p.flops = 0;
	for (int i = 0; i < p.n; i++) {
		const int keys = g.window > 0 ? std::min(pos[i] + 1, g.window) : pos[i] + 1;
		p.flops += (double)keys * g.nh * 4.0 * g.d;
	}
	p.splits = engine_splits(p.n, g.nkv);
	CK(cudaMalloc(&p.pos, (size_t)p.n * 4));
	CK(cudaMalloc(&p.seq, (size_t)p.n * 4));
	CK(cudaMalloc(&p.table, table.size() * 4));
	CK(cudaMalloc(&p.q, qn * 4));
	CK(cudaMalloc(&p.out, qn * 4));
	CK(cudaMalloc(&p.ref, qn * 4));
	CK(cudaMalloc(&p.sinks, (size_t)g.nh * 4));
	CK(cudaMalloc(&p.work, (size_t)fp4s_cuda_attention_prefill_work_bytes(p.n)));
	CK(cudaMalloc(&p.work_sk, (size_t)fp4s_cuda_attention_work_floats(p.n, g.nh, g.nkv, g.d, p.splits) * 4));
	CK(cudaMemcpy(p.pos, pos.data(), (size_t)p.n * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(p.seq, seq.data(), (size_t)p.n * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(p.table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(p.q, q.data(), qn * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(p.sinks, sinks.data(), (size_t)g.nh * 4, cudaMemcpyHostToDevice));
	return p;
}

static void destroy(prob &p)
{
	void *b[] = {p.pos, p.seq, p.table, p.q, p.out, p.ref, p.sinks, p.work, p.work_sk, p.kc, p.vc};
	for (void *x : b)
		CK(cudaFree(x));
}

static int prefill(prob &p, const fp4s_attn_prefill_tune *tune)
{
	struct fp4s_error err = {0};
	const geom &g = p.g;
	const int rc = fp4s_cuda_attention_prefill_ex(p.q, p.kc, p.vc, 1, p.pos, p.seq, p.table, p.table_stride, p.n,
	                                              g.nh, g.nkv, g.d, g.window, g.sinks ? p.sinks : NULL,
	                                              1.0f / sqrtf((float)g.d), p.work, p.out, tune, 0, &err);
	if (rc) {
		fprintf(stderr, "prefill: %s\n", err.msg);
		exit(1);
	}
	return rc;
}

static void splitk(prob &p)
{
	struct fp4s_error err = {0};
	const geom &g = p.g;
	if (fp4s_cuda_attention(p.q, p.kc, p.vc, 1, p.pos, p.seq, p.table, p.table_stride, p.n, g.nh, g.nkv, g.d,
	                        g.window, g.sinks ? p.sinks : NULL, 1.0f / sqrtf((float)g.d), p.splits, p.work_sk,
	                        p.ref, 0, &err)) {
		fprintf(stderr, "split-K: %s\n", err.msg);
		exit(1);
	}
}

/* median ms of fn over 5..30 timed calls after 2 warm-up calls */
static double time_ms(const std::function<void()> &fn)
{
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	for (int i = 0; i < 2; i++)
		fn();
	CK(cudaDeviceSynchronize());
	std::vector<float> t;
	double total = 0;
	while (t.size() < 30 && (t.size() < 5 || total < 1000.0)) {
		CK(cudaEventRecord(e0));
		fn();
		CK(cudaEventRecord(e1));
		CK(cudaEventSynchronize(e1));
		float ms;
		CK(cudaEventElapsedTime(&ms, e0, e1));
		t.push_back(ms);
		total += ms;
	}
	CK(cudaGetLastError());
	CK(cudaEventDestroy(e0));
	CK(cudaEventDestroy(e1));
	std::sort(t.begin(), t.end());
	return t[t.size() / 2];
}

/* prefill (with tune) against split-K: relative L2, NaN = fail */
static bool validate(prob &p, const fp4s_attn_prefill_tune *tune, double *rel)
{
	const size_t qn = (size_t)p.n * p.g.nh * p.g.d;
	CK(cudaMemset(p.out, 0xFF, qn * 4));
	prefill(p, tune);
	splitk(p);
	CK(cudaDeviceSynchronize());
	std::vector<float> a(qn), b(qn);
	CK(cudaMemcpy(a.data(), p.out, qn * 4, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(b.data(), p.ref, qn * 4, cudaMemcpyDeviceToHost));
	double num = 0, den = 0;
	bool nan = false;
	for (size_t i = 0; i < qn; i++) {
		nan |= isnan(a[i]) || isnan(b[i]);
		num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
		den += (double)b[i] * b[i];
	}
	*rel = sqrt(num / den);
	return !nan && *rel <= 1e-2;
}

static int failed;

static void check(prob &p, const fp4s_attn_prefill_tune *tune, const char *what)
{
	double rel;
	if (!validate(p, tune, &rel)) {
		fprintf(stderr, "MISMATCH %s %s n=%d: rel L2 %.3g (or NaN)\n", p.g.name, what, p.n, rel);
		failed = 1;
	}
}

int main(int argc, char **argv)
{
	const bool quick = argc > 1 && !strcmp(argv[1], "quick");
	cudaDeviceProp dp;
	CK(cudaGetDeviceProperties(&dp, 0));
	g_sms = dp.multiProcessorCount;
	int clk = 0;
	cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
	printf("device: %s, %d SMs, %.2f GHz max, L2 %d MB\n", dp.name, g_sms, clk / 1e6, dp.l2CacheSize >> 20);
	struct fp4s_error err = {0};
	if (fp4s_cuda_attention_setup(&err) || fp4s_cuda_attention_prefill_setup(&err)) {
		fprintf(stderr, "setup: %s\n", err.msg);
		return 1;
	}
	const geom geoms[] = {{"llama3-8b", 32, 8, 128, 0, 0},
	                      {"gpt-oss-20b full", 64, 8, 64, 0, 1},
	                      {"gpt-oss-20b win128", 64, 8, 64, 128, 1},
	                      {"qwen3-30b-a3b", 32, 4, 128, 0, 0}};
	const int lens[] = {512, 2048, 8192};
	const fp4s_attn_prefill_tune def = {0, 0, 0, 0}, prec = {1, 0, 0, 0}, reuse = {0, 1, 0, 0};
	if (argc > 3 && !strcmp(argv[1], "one")) {
		/* one geometry and prompt length, a few calls: for a profiler (ncu -k regex:attn_prefill) */
		prob p = make(geoms[atoi(argv[2]) & 3], {{0, 0, atoi(argv[3])}});
		const fp4s_attn_prefill_tune t = {0, 0, argc > 5 ? atoi(argv[4]) : 0, argc > 5 ? atoi(argv[5]) : 0};
		for (int i = 0; i < 3; i++)
			prefill(p, &t);
		CK(cudaDeviceSynchronize());
		destroy(p);
		return 0;
	}

	printf("\n(1) prompt from position 0, one sequence: median us per call and TFLOP/s (causal FLOPs)\n");
	printf("%-20s %6s | %9s %7s | %9s %7s | %9s %7s %6s | %8s\n", "geometry", "tokens", "prefill", "TFLOP/s",
	       "precise", "TFLOP/s", "split-K", "TFLOP/s", "splits", "speedup");
	for (const geom &g : geoms)
		for (int L : lens) {
			if (quick && L > 2048)
				continue;
			prob p = make(g, {{0, 0, L}});
			check(p, &def, "default");
			check(p, &prec, "precise");
			const double tp = time_ms([&] { prefill(p, &def); });
			const double tq = time_ms([&] { prefill(p, &prec); });
			const double ts = time_ms([&] { splitk(p); });
			printf("%-20s %6d | %9.1f %7.1f | %9.1f %7.1f | %9.1f %7.2f %6d | %7.1fx\n", g.name, L, tp * 1e3,
			       p.flops / (tp * 1e-3) / 1e12, tq * 1e3, p.flops / (tq * 1e-3) / 1e12, ts * 1e3,
			       p.flops / (ts * 1e-3) / 1e12, p.splits, ts / tp);
			fflush(stdout);
			destroy(p);
		}

	printf("\n(2) tile shapes (keys per tile bn / 16-row tiles per warp mt) and the planning kernel "
	       "(default shape with reuse_plan): median us\n");
	const int alts[][2] = {{64, 1}, {64, 2}, {128, 1}, {64, 1}, {64, 2}, {32, 2}}; /* d 64 x3, d 128 x3 */
	printf("%-20s %6s | %12s %12s %12s | %9s\n", "geometry", "tokens", "variant a", "variant b", "variant c",
	       "no plan");
	for (const geom &g : geoms)
		for (int L : lens) {
			if (quick && L > 2048)
				continue;
			prob p = make(g, {{0, 0, L}});
			printf("%-20s %6d |", g.name, L);
			for (int v = 0; v < 3; v++) {
				const int *a = alts[(g.d == 64 ? 0 : 3) + v];
				const fp4s_attn_prefill_tune t = {0, 0, a[0], a[1]};
				check(p, &t, "variant");
				const double ms = time_ms([&] { prefill(p, &t); });
				char lab[48];
				snprintf(lab, sizeof lab, "%.1f %d/%d", ms * 1e3, a[0], a[1]);
				printf(" %12s", lab);
			}
			prefill(p, &def); /* the plan for reuse */
			const double tr = time_ms([&] { prefill(p, &reuse); });
			printf(" | %9.1f\n", tr * 1e3);
			fflush(stdout);
			destroy(p);
		}

	printf("\n(3) batch shapes for the dispatch rule: median us, prefill kernel vs split-K\n");
	printf("%-20s %-44s %6s | %9s %9s %6s\n", "geometry", "batch", "tokens", "prefill", "split-K", "ratio");
	for (const geom &g : {geoms[0], geoms[1]}) {
		auto row = [&](const char *what, const std::vector<seg> &segs) {
			prob p = make(g, segs);
			check(p, &def, what);
			const double tp = time_ms([&] { prefill(p, &def); });
			const double ts = time_ms([&] { splitk(p); });
			printf("%-20s %-44s %6d | %9.1f %9.1f %5.2fx\n", g.name, what, p.n, tp * 1e3, ts * 1e3, ts / tp);
			fflush(stdout);
			destroy(p);
		};
		char what[64];
		/* decode only: B sequences of one token at context C */
		for (int C : {1024, 8192})
			for (int B : {1, 4, 16, 64}) {
				std::vector<seg> s;
				for (int b = 0; b < B; b++)
					s.push_back({b, C - 1 - (int)(rnd() % 64), 1});
				snprintf(what, sizeof what, "decode %d seqs x 1 token, ctx %d", B, C);
				row(what, s);
			}
		/* one chunk of m tokens after a prefix of P */
		for (int P : {0, 4096})
			for (int m : {2, 4, 8, 16, 32, 64, 128, 256}) {
				snprintf(what, sizeof what, "chunk of %d after prefix %d", m, P);
				row(what, {{0, P, m}});
			}
		/* a prompt chunk with decode tokens of other sequences */
		for (int B : {4, 16, 64}) {
			std::vector<seg> s = {{0, 0, 512}};
			for (int b = 0; b < B; b++)
				s.push_back({b + 1, 2047 - (int)(rnd() % 64), 1});
			snprintf(what, sizeof what, "chunk 512 + %d decode at ctx 2048", B);
			row(what, s);
		}
		{
			std::vector<seg> s = {{0, 1536, 512}};
			for (int b = 0; b < 16; b++)
				s.push_back({b + 1, 8191 - (int)(rnd() % 64), 1});
			row("chunk 512 at 1536 + 16 decode at ctx 8192", s);
		}
		{
			std::vector<seg> s;
			for (int b = 0; b < 8; b++)
				s.push_back({b, 0, 64});
			row("8 prompts x 64 tokens", s);
		}
	}
	if (failed)
		fprintf(stderr, "validation FAILED\n");
	return failed;
}
