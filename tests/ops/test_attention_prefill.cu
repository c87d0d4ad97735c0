// test_attention_prefill.cu (label gpu): fp4s_cuda_attention_prefill against a double-precision
// CPU reference fed the same BF16 values (q rounded to BF16 on the host, K/V stored as BF16, or as
// FP8 E4M3: values rounded by the CPU's encoder, which BF16 holds exactly), on fresh random
// inputs: the three model geometries (llama3-8b 32/8/128, gpt-oss-20b 64/8/64 with
// sinks and a 128-key window, qwen3-30b-a3b 32/4/128) and odd ones (G = 1, 3, 16, 64); prompts of
// 1..3000 tokens; chunks that start at nonzero positions (on and off 16- and 64-key boundaries);
// mixed batches of prompt chunks and decode tokens, in any slot order, more tiles than grid
// slots; block tables that scatter each sequence over a shuffled pool.
//
// Poison: every cache position that no token of the batch may see (past each sequence's last
// position, unused pool blocks, and the block unused table entries point at) holds NaN, and the
// output is NaN before each call, so a read outside [first key, own position] or an unwritten
// output shows as NaN.
//
// Tolerances. The reference gets exactly the BF16 q/K/V the kernel multiplies, so the only error
// left is the kernel's own: FP32 sums of exact BF16 products (~1e-6), ex2.approx (~2^-22), and P
// rounded to BF16 before P.V (FlashAttention-2's choice). The last dominates: a BF16 rounding has
// relative error up to 2^-8, rms 2^-8 / sqrt(6) = 1.6e-3 over a binade; the output is a
// p-weighted mean of V rows, so with zero-mean V its relative error is at most about that rms
// (E|sum p d v|^2 / E|sum p v|^2 = E d^2), and less where V has a common component (here a
// per-head offset, as real V has). Measured on an H100 (2026-11-21, 100+ cases): 2.8e-4..7.4e-4
// over a case, <= 2.8e-3 for the worst (token, head) row. Bounds: 2e-3 over the case (the
// zero-mean rms plus margin) and 1e-2 per row (3.5x the worst row seen). The `precise` kernel
// (P = hi + lo, both BF16) removes that term: measured <= 3e-6 over a case and 8e-6 per row;
// bounds 2e-5 and 1e-4. A key let in or left out by one position changes a row by ~1/sqrt(keys)
// (>= 1.5% at 3000 keys); a wrong scale, head or block shifts everything. Each case prints its
// errors. Long prompts check a sample of tokens against the CPU (every k-th plus each segment's
// ends); all rows are also compared with the exact split-K kernel (fp4s_cuda_attention, FP32 P)
// under the same bounds.
//
// FP8 caches run every case with the same bounds: E4M3 values become BF16 exactly in the kernel,
// so its error is the BF16 kernel's (the precise kernel's 2e-5 shows nothing else is lost).
//
// Also: graph capture and replay on new batch contents, bitwise repeatability, reuse_plan, and
// FP4S_EUNSUPPORTED for the shapes it leaves to the exact kernel. `test_attention_prefill
// [filter]` runs cases whose name contains filter.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attention_cuda.h"
#include "backend/cuda/attention_prefill_cuda.h"
#include "numerics/numerics.h"
#include "ops_test.h"
#include "test_util.h"

struct seg {
	int slot, p0, len; /* len tokens of slot at positions p0 .. p0 + len - 1 */
};

struct acase {
	const char *name;
	int nh, nkv, d, window, sinks;
	std::vector<seg> segs;
};

static const uint16_t BF16_NAN = 0x7FC0;

/* One batch on host and device. */
struct prob {
	int n, nh, nkv, d, window, table_stride, n_blocks, max_slot;
	int kv; /* FP4S_KV_BF16 or FP4S_KV_FP8: what the device cache holds (kc/vc: its values in BF16) */
	float scale;
	std::vector<int32_t> pos, seq, table;
	std::vector<float> q, sinks; /* q holds BF16 values */
	std::vector<uint16_t> kc, vc; /* [block][16][nkv * d] */
	int32_t *d_pos, *d_seq, *d_table;
	float *d_q, *d_sinks, *d_out;
	uint16_t *d_kc, *d_vc;
	void *d_work;
};

static float rbf16(double x) { return fp4s_bf16_to_f32(fp4s_f32_to_bf16((float)x)); }

/* a K/V value as the cache of type kv holds it, in BF16 (exact for E4M3 values) */
static uint16_t cache_val(double x, int kv)
{
	const float f = (float)x;
	return fp4s_f32_to_bf16(kv == FP4S_KV_FP8 ? fp4s_e4m3_to_f32(fp4s_f32_to_e4m3(f)) : f);
}

static void prob_fill(prob &p, const acase &c, int min_stride = 0, int min_blocks = 0, int kv = FP4S_KV_BF16)
{
	p.nh = c.nh, p.nkv = c.nkv, p.d = c.d, p.window = c.window, p.kv = kv;
	p.scale = 1.0f / sqrtf((float)c.d);
	p.n = 0;
	p.max_slot = 0;
	for (const seg &s : c.segs) {
		p.n += s.len;
		p.max_slot = s.slot > p.max_slot ? s.slot : p.max_slot;
	}
	const int slots = p.max_slot + 1, kvw = c.nkv * c.d;
	std::vector<int> last(slots, -1); /* each slot's last position in the batch */
	p.pos.clear(), p.seq.clear();
	for (const seg &s : c.segs)
		for (int t = 0; t < s.len; t++) {
			p.pos.push_back(s.p0 + t);
			p.seq.push_back(s.slot);
			last[s.slot] = s.p0 + t;
		}
	int used = 0, stride = min_stride > 1 ? min_stride : 1;
	for (int s = 0; s < slots; s++) {
		const int nb = last[s] < 0 ? 0 : last[s] / FP4S_KV_BLOCK + 1;
		used += nb;
		stride = nb + 2 > stride ? nb + 2 : stride;
	}
	p.table_stride = stride;
	p.n_blocks = used + 3 + (int)(t_rand_u64() % 5); /* spare blocks: NaN, never referenced */
	p.n_blocks = p.n_blocks > min_blocks ? p.n_blocks : min_blocks;
	/* shuffled pool: slot s's blocks are scattered */
	std::vector<int> perm(p.n_blocks);
	for (int i = 0; i < p.n_blocks; i++)
		perm[i] = i;
	for (int i = p.n_blocks - 1; i > 0; i--) {
		const int j = (int)(t_rand_u64() % (uint64_t)(i + 1));
		const int t = perm[i];
		perm[i] = perm[j], perm[j] = t;
	}
	const int poison_block = perm[p.n_blocks - 1]; /* unused table entries point here */
	p.kc.assign((size_t)p.n_blocks * FP4S_KV_BLOCK * kvw, BF16_NAN);
	p.vc.assign(p.kc.size(), BF16_NAN);
	p.table.assign((size_t)slots * stride, poison_block);
	int next = 0;
	std::vector<double> vmean(c.nkv);
	for (int h = 0; h < c.nkv; h++)
		vmean[h] = 0.3 * t_rand_normal();
	for (int s = 0; s < slots; s++)
		for (int t = 0; t <= last[s]; t++) {
			if (t % FP4S_KV_BLOCK == 0)
				p.table[(size_t)s * stride + t / FP4S_KV_BLOCK] = perm[next++];
			const size_t row = ((size_t)p.table[(size_t)s * stride + t / FP4S_KV_BLOCK] * FP4S_KV_BLOCK +
			                    t % FP4S_KV_BLOCK) * kvw;
			for (int j = 0; j < kvw; j++) {
				p.kc[row + j] = cache_val(t_rand_normal(), kv);
				p.vc[row + j] = cache_val(t_rand_normal() + vmean[j / c.d], kv);
			}
		}
	/* q: BF16 values, a per-(token, head) gain so that some rows are peaked, some flat */
	p.q.resize((size_t)p.n * c.nh * c.d);
	for (int i = 0; i < p.n; i++)
		for (int h = 0; h < c.nh; h++) {
			const double gain = 0.3 + 3.7 * t_rand_uniform();
			for (int j = 0; j < c.d; j++)
				p.q[((size_t)i * c.nh + h) * c.d + j] = rbf16(t_rand_normal() * gain);
		}
	p.sinks.resize(c.nh);
	for (int h = 0; h < c.nh; h++)
		p.sinks[h] = (float)(1.5 * t_rand_normal() + 1.0);
}

static void prob_upload(prob &p, int alloc)
{
	const size_t nq = (size_t)p.n * p.nh * p.d;
	if (alloc) {
		CK(cudaMalloc(&p.d_pos, (size_t)p.n * 4));
		CK(cudaMalloc(&p.d_seq, (size_t)p.n * 4));
		CK(cudaMalloc(&p.d_table, p.table.size() * 4));
		CK(cudaMalloc(&p.d_q, nq * 4));
		CK(cudaMalloc(&p.d_out, nq * 4));
		CK(cudaMalloc(&p.d_sinks, (size_t)p.nh * 4));
		CK(cudaMalloc(&p.d_kc, p.kc.size() * 2)); /* room for BF16; E4M3 takes half */
		CK(cudaMalloc(&p.d_vc, p.vc.size() * 2));
		CK(cudaMalloc(&p.d_work, (size_t)fp4s_cuda_attention_prefill_work_bytes(p.n)));
	}
	CK(cudaMemcpy(p.d_pos, p.pos.data(), (size_t)p.n * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(p.d_seq, p.seq.data(), (size_t)p.n * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(p.d_table, p.table.data(), p.table.size() * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(p.d_q, p.q.data(), nq * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(p.d_sinks, p.sinks.data(), (size_t)p.nh * 4, cudaMemcpyHostToDevice));
	if (p.kv == FP4S_KV_FP8) {
		/* the E4M3 bytes of the values (exact; BF16 NaN -> 0x7F) */
		std::vector<uint8_t> k8(p.kc.size()), v8(p.vc.size());
		for (size_t i = 0; i < k8.size(); i++) {
			k8[i] = fp4s_f32_to_e4m3(fp4s_bf16_to_f32(p.kc[i]));
			v8[i] = fp4s_f32_to_e4m3(fp4s_bf16_to_f32(p.vc[i]));
		}
		CK(cudaMemcpy(p.d_kc, k8.data(), k8.size(), cudaMemcpyHostToDevice));
		CK(cudaMemcpy(p.d_vc, v8.data(), v8.size(), cudaMemcpyHostToDevice));
		return;
	}
	CK(cudaMemcpy(p.d_kc, p.kc.data(), p.kc.size() * 2, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(p.d_vc, p.vc.data(), p.vc.size() * 2, cudaMemcpyHostToDevice));
}

static void prob_free(prob &p)
{
	void *bufs[] = {p.d_pos, p.d_seq, p.d_table, p.d_q, p.d_out, p.d_sinks, p.d_kc, p.d_vc, p.d_work};
	for (void *b : bufs)
		CK(cudaFree(b));
}

static void poison_out(prob &p)
{
	CK(cudaMemset(p.d_out, 0xFF, (size_t)p.n * p.nh * p.d * 4)); /* 0xFFFFFFFF: a NaN */
	CK(cudaDeviceSynchronize());
}

static int call(prob &p, int use_sinks, const struct fp4s_attn_prefill_tune *tune, cudaStream_t s)
{
	struct fp4s_error err = {0};
	const int rc = fp4s_cuda_attention_prefill_ex(p.d_q, p.d_kc, p.d_vc, p.kv, p.d_pos, p.d_seq, p.d_table,
	                                              p.table_stride, p.n, p.nh, p.nkv, p.d, p.window,
	                                              use_sinks ? p.d_sinks : NULL, p.scale, p.d_work, p.d_out,
	                                              tune, s, &err);
	if (rc)
		fprintf(stderr, "fp4s_cuda_attention_prefill: %s\n", err.msg);
	return rc;
}

/* the reference row (token i, head h) in double */
static void ref_row(const prob &p, int use_sinks, int i, int h, std::vector<double> &o, std::vector<double> &sc)
{
	const int G = p.nh / p.nkv, g0 = h / G, kvw = p.nkv * p.d, pi = p.pos[i], s = p.seq[i];
	const int t0 = p.window > 0 && pi - p.window + 1 > 0 ? pi - p.window + 1 : 0;
	const float *qr = &p.q[((size_t)i * p.nh + h) * p.d];
	sc.resize((size_t)(pi - t0 + 1));
	double m = use_sinks ? (double)p.sinks[h] : -INFINITY;
	for (int t = t0; t <= pi; t++) {
		const size_t row = ((size_t)p.table[(size_t)s * p.table_stride + t / FP4S_KV_BLOCK] * FP4S_KV_BLOCK +
		                    t % FP4S_KV_BLOCK) * kvw + (size_t)g0 * p.d;
		double a = 0;
		for (int j = 0; j < p.d; j++)
			a += (double)qr[j] * fp4s_bf16_to_f32(p.kc[row + j]);
		a *= p.scale;
		sc[t - t0] = a;
		m = a > m ? a : m;
	}
	double l = use_sinks ? exp((double)p.sinks[h] - m) : 0.0;
	o.assign(p.d, 0.0);
	for (int t = t0; t <= pi; t++) {
		const double e = exp(sc[t - t0] - m);
		l += e;
		const size_t row = ((size_t)p.table[(size_t)s * p.table_stride + t / FP4S_KV_BLOCK] * FP4S_KV_BLOCK +
		                    t % FP4S_KV_BLOCK) * kvw + (size_t)g0 * p.d;
		for (int j = 0; j < p.d; j++)
			o[j] += e * fp4s_bf16_to_f32(p.vc[row + j]);
	}
	for (int j = 0; j < p.d; j++)
		o[j] /= l;
}

struct errs {
	double rel, row_max;
	int rows;
	long nan_at;
};

/* relative L2 of got against want over all rows, the worst (token, head) row, NaNs */
static errs compare(const float *got, const double *want, const std::vector<int> &rows, int width, int d)
{
	errs e = {0, 0, 0, -1};
	double num = 0, den = 0;
	for (size_t k = 0; k < rows.size(); k++) {
		const int i = rows[k];
		for (int h = 0; h < width / d; h++) {
			double rn = 0, rd = 0;
			for (int j = 0; j < d; j++) {
				const double g = got[(size_t)i * width + h * d + j], w = want[(k * width) + h * d + j];
				if (isnan(g) && e.nan_at < 0)
					e.nan_at = (long)i * width + h * d + j;
				rn += (g - w) * (g - w);
				rd += w * w;
			}
			num += rn, den += rd;
			const double r = sqrt(rn / (rd > 1e-30 ? rd : 1e-30));
			e.row_max = r > e.row_max || isnan(r) ? r : e.row_max;
		}
		e.rows++;
	}
	e.rel = sqrt(num / (den > 1e-30 ? den : 1e-30));
	return e;
}

static int run_case(const acase &c, int precise, int bn, int mt, const char *filter, int kv = FP4S_KV_BF16)
{
	char name[160];
	snprintf(name, sizeof name, "%s%s%s", c.name, kv == FP4S_KV_FP8 ? ",fp8" : "", precise ? ",precise" : "");
	if (bn || mt)
		snprintf(name + strlen(name), sizeof name - strlen(name), ",bn%d,mt%d", bn, mt);
	if (filter && !strstr(name, filter))
		return 0;
	prob p;
	prob_fill(p, c, 0, 0, kv);
	prob_upload(p, 1);
	poison_out(p);
	struct fp4s_attn_prefill_tune tune = {precise, 0, bn, mt};
	const int width = p.nh * p.d;
	std::vector<float> out((size_t)p.n * width);
	int failed = 0;
	if (call(p, c.sinks, &tune, 0)) {
		t_fail++;
		prob_free(p);
		return 1;
	}
	CK(cudaDeviceSynchronize());
	CK(cudaMemcpy(out.data(), p.d_out, out.size() * 4, cudaMemcpyDeviceToHost));

	/* tokens checked on the CPU: all while cheap, else every k-th plus each segment's ends */
	double work = 0;
	for (int i = 0; i < p.n; i++)
		work += (double)(p.window > 0 && p.pos[i] + 1 > p.window ? p.window : p.pos[i] + 1) * width;
	const int every = work > 3e8 ? (int)(work / 3e8) + 1 : 1;
	std::vector<int> rows;
	for (int i = 0; i < p.n; i++) {
		const bool edge = i < 2 || i >= p.n - 2 || p.seq[i] != p.seq[i - 1] || p.seq[i] != p.seq[i + 1] ||
		                  p.seq[i] != p.seq[i - 2] || p.seq[i] != p.seq[i + 2];
		if (edge || i % every == 0)
			rows.push_back(i);
	}
	std::vector<double> want(rows.size() * width), o, sc;
	std::vector<float> got(rows.size() * width);
	for (size_t k = 0; k < rows.size(); k++)
		for (int h = 0; h < p.nh; h++) {
			ref_row(p, c.sinks, rows[k], h, o, sc);
			memcpy(&want[k * width + (size_t)h * p.d], o.data(), (size_t)p.d * sizeof(double));
		}
	std::vector<int> ident(rows.size());
	for (size_t k = 0; k < rows.size(); k++) {
		ident[k] = (int)k;
		memcpy(&got[k * width], &out[(size_t)rows[k] * width], (size_t)width * 4);
	}
	const errs e = compare(got.data(), want.data(), ident, width, p.d);
	const double tol = precise ? 2e-5 : 2e-3, row_tol = precise ? 1e-4 : 1e-2;

	/* every row: no NaN, and the exact split-K kernel agrees (G <= 16: its limit) */
	errs ex = {0, 0, 0, -1};
	const int G = p.nh / p.nkv;
	long nan_any = -1;
	for (size_t x = 0; x < out.size() && nan_any < 0; x++)
		if (isnan(out[x]))
			nan_any = (long)x;
	if (G <= 16) {
		struct fp4s_error err = {0};
		CHECK(fp4s_cuda_attention_setup(&err) == FP4S_OK);
		const int splits = 2;
		float *work, *dref;
		CK(cudaMalloc(&work, (size_t)fp4s_cuda_attention_work_floats(p.n, p.nh, p.nkv, p.d, splits) * 4));
		CK(cudaMalloc(&dref, out.size() * 4));
		const int rc = fp4s_cuda_attention(p.d_q, p.d_kc, p.d_vc, p.kv, p.d_pos, p.d_seq, p.d_table,
		                                   p.table_stride, p.n, p.nh, p.nkv, p.d, p.window,
		                                   c.sinks ? p.d_sinks : NULL, p.scale, splits, work, dref, 0, &err);
		CHECK_MSG(rc == FP4S_OK, "%s: split-K: %s", name, err.msg);
		CK(cudaDeviceSynchronize());
		std::vector<float> ref(out.size());
		CK(cudaMemcpy(ref.data(), dref, ref.size() * 4, cudaMemcpyDeviceToHost));
		std::vector<double> refd(ref.begin(), ref.end());
		std::vector<int> all(p.n);
		for (int i = 0; i < p.n; i++)
			all[i] = i;
		ex = compare(out.data(), refd.data(), all, width, p.d);
		CK(cudaFree(work));
		CK(cudaFree(dref));
	}
	const bool ok = nan_any < 0 && e.rel <= tol && e.row_max <= row_tol &&
	                (G > 16 || (ex.rel <= tol && ex.row_max <= row_tol));
	printf("%-44s n=%5d cpu rows %5d: rel %.2e row max %.2e | all rows vs split-K: rel %.2e row max %.2e %s\n",
	       name, p.n, e.rows, e.rel, e.row_max, ex.rel, ex.row_max, ok ? "ok" : "FAIL");
	if (!ok) {
		if (nan_any >= 0)
			fprintf(stderr, "%s: NaN at token %ld head %ld dim %ld\n", name, nan_any / width,
			        (nan_any % width) / p.d, nan_any % p.d);
		failed = 1;
	}
	if (failed)
		t_fail++;
	else
		t_pass++;
	prob_free(p);
	return failed;
}

static acase one(const char *name, int nh, int nkv, int d, int window, int sinks, int p0, int len)
{
	acase c = {name, nh, nkv, d, window, sinks, {{0, p0, len}}};
	return c;
}

/* graph capture, then replay on new contents of the same-sized batch; repeatability; reuse_plan */
static void graph_and_repeat(const char *filter)
{
	if (filter && !strstr("graph", filter))
		return;
	acase a = {"graph", 32, 8, 128, 0, 0, {{2, 0, 200}, {0, 500, 1}, {1, 33, 90}, {3, 7, 1}}};
	acase b = {"graph", 32, 8, 128, 0, 0, {{0, 60, 150}, {3, 0, 100}, {1, 1200, 1}, {2, 70, 41}}};
	/* the same sizes for both (n, table stride, pool), so b's contents fit a's buffers */
	prob p, p2;
	prob_fill(p, a, 100, 300);
	prob_fill(p2, b, 100, 300);
	if (p.n_blocks != p2.n_blocks || p.table_stride != p2.table_stride || p.n != p2.n ||
	    p.table.size() != p2.table.size()) {
		CHECK_MSG(0, "graph case: the two batches differ in size");
		return;
	}
	prob_upload(p, 1);
	cudaStream_t s;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	cudaGraph_t g;
	cudaGraphExec_t ge;
	/* the first call outside capture: the one-time shared-memory setup */
	CHECK(call(p, 0, NULL, s) == FP4S_OK);
	CK(cudaStreamSynchronize(s));
	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	const int rc = call(p, 0, NULL, s);
	CK(cudaStreamEndCapture(s, &g));
	CHECK(rc == FP4S_OK);
	CK(cudaGraphInstantiate(&ge, g, 0));
	const int width = p.nh * p.d;
	std::vector<float> o1((size_t)p.n * width), o2(o1.size());
	poison_out(p);
	CK(cudaGraphLaunch(ge, s));
	CK(cudaStreamSynchronize(s));
	CK(cudaMemcpy(o1.data(), p.d_out, o1.size() * 4, cudaMemcpyDeviceToHost));
	/* repeat: bitwise the same */
	poison_out(p);
	CK(cudaGraphLaunch(ge, s));
	CK(cudaStreamSynchronize(s));
	CK(cudaMemcpy(o2.data(), p.d_out, o2.size() * 4, cudaMemcpyDeviceToHost));
	CHECK_MSG(memcmp(o1.data(), o2.data(), o1.size() * 4) == 0, "graph replay not bitwise repeatable");
	/* new batch contents (b) through the same graph */
	p2.d_pos = p.d_pos, p2.d_seq = p.d_seq, p2.d_table = p.d_table, p2.d_q = p.d_q, p2.d_out = p.d_out;
	p2.d_sinks = p.d_sinks, p2.d_kc = p.d_kc, p2.d_vc = p.d_vc, p2.d_work = p.d_work;
	prob_upload(p2, 0);
	poison_out(p);
	CK(cudaGraphLaunch(ge, s));
	CK(cudaStreamSynchronize(s));
	CK(cudaMemcpy(o1.data(), p.d_out, o1.size() * 4, cudaMemcpyDeviceToHost));
	std::vector<int> rows;
	for (int i = 0; i < p2.n; i++)
		rows.push_back(i);
	std::vector<double> want((size_t)p2.n * width), o, sc;
	for (int i = 0; i < p2.n; i++)
		for (int h = 0; h < p2.nh; h++) {
			ref_row(p2, 0, i, h, o, sc);
			memcpy(&want[(size_t)i * width + (size_t)h * p2.d], o.data(), (size_t)p2.d * sizeof(double));
		}
	const errs e = compare(o1.data(), want.data(), rows, width, p2.d);
	printf("%-44s n=%5d replay on new batch: rel %.2e row max %.2e\n", "graph", p2.n, e.rel, e.row_max);
	CHECK_MSG(e.nan_at < 0 && e.rel <= 2e-3 && e.row_max <= 1e-2, "graph replay on a new batch: rel %.3g row %.3g",
	          e.rel, e.row_max);
	/* reuse_plan: the plan of this batch is in work from the replay; same result bitwise */
	struct fp4s_attn_prefill_tune reuse = {0, 1, 0, 0};
	poison_out(p);
	CHECK(call(p2, 0, &reuse, s) == FP4S_OK);
	CK(cudaStreamSynchronize(s));
	CK(cudaMemcpy(o2.data(), p.d_out, o2.size() * 4, cudaMemcpyDeviceToHost));
	CHECK_MSG(memcmp(o1.data(), o2.data(), o1.size() * 4) == 0, "reuse_plan changed the output");
	CK(cudaGraphExecDestroy(ge));
	CK(cudaGraphDestroy(g));
	CK(cudaStreamDestroy(s));
	prob_free(p);
}

static void unsupported(const char *filter)
{
	if (filter && !strstr("unsupported", filter))
		return;
	struct fp4s_error err = {0};
	float *d;
	CK(cudaMalloc(&d, 1 << 16));
	int32_t *ip = (int32_t *)d;
	/* shape: d 96 / 256 / 32, G 65, nh % nkv, FP32 KV, no such KV type, FP8 at d 96: all left to
	 * the exact kernel */
	const int shapes[][4] = {{32, 8, 96, 1}, {32, 8, 256, 1}, {8, 8, 32, 1}, {65, 1, 64, 1},
	                         {30, 8, 128, 1}, {32, 8, 128, 0}, {32, 0, 128, 1}, {32, 8, 128, 3}, {32, 8, 96, 2}};
	for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
		const int rc = fp4s_cuda_attention_prefill(d, d, d, shapes[k][3], ip, ip, ip, 1, 4, shapes[k][0],
		                                           shapes[k][1], shapes[k][2], 0, NULL, 0.1f, d, d, 0, &err);
		CHECK_MSG(rc == FP4S_EUNSUPPORTED, "shape %zu: rc %d", k, rc);
	}
	/* misaligned q */
	CHECK(fp4s_cuda_attention_prefill(d + 1, d, d, 1, ip, ip, ip, 1, 4, 32, 8, 128, 0, NULL, 0.1f, d, d, 0, &err) ==
	      FP4S_EUNSUPPORTED);
	/* zero tokens: nothing to do */
	CHECK(fp4s_cuda_attention_prefill(d, d, d, 1, ip, ip, ip, 1, 0, 32, 8, 128, 0, NULL, 0.1f, d, d, 0, &err) ==
	      FP4S_OK);
	CK(cudaFree(d));
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0); /* a run cut off by a time limit still shows how far it got */
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)
		TEST_SKIP("no CUDA device");
	t_seed_from_env();
	const char *filter = argc > 1 ? argv[1] : NULL;
	cudaDeviceProp dp;
	CK(cudaGetDeviceProperties(&dp, 0));
	printf("device: %s (compute capability %d.%d)\n", dp.name, dp.major, dp.minor);

	std::vector<acase> cs;
	char *names = (char *)calloc(256, 64); /* case names live to the end */
	int nn = 0;
#define NAME(...) (snprintf(names + 64 * nn, 64, __VA_ARGS__), names + 64 * nn++)
	/* llama3-8b: prompts from position 0 */
	const int lens[] = {1, 2, 7, 16, 17, 63, 64, 65, 200, 1000, 3000};
	for (int L : lens)
		cs.push_back(one(NAME("llama3 prompt %d", L), 32, 8, 128, 0, 0, 0, L));
	/* gpt-oss-20b: sinks, full and 128-key window layers */
	const int glens[] = {1, 100, 128, 129, 500, 2000};
	for (int L : glens) {
		cs.push_back(one(NAME("gptoss win128 prompt %d", L), 64, 8, 64, 128, 1, 0, L));
		cs.push_back(one(NAME("gptoss full prompt %d", L), 64, 8, 64, 0, 1, 0, L));
	}
	cs.push_back(one(NAME("gptoss win128 chunk 300+250"), 64, 8, 64, 128, 1, 300, 250));
	cs.push_back(one(NAME("gptoss win128 chunk 1000+1"), 64, 8, 64, 128, 1, 1000, 1));
	cs.push_back(one(NAME("gptoss win128 chunk 129+70"), 64, 8, 64, 128, 1, 129, 70));
	cs.push_back(one(NAME("gptoss nosink prompt 300"), 64, 8, 64, 0, 0, 0, 300));
	/* qwen3-30b-a3b */
	const int qlens[] = {9, 513, 2048};
	for (int L : qlens)
		cs.push_back(one(NAME("qwen3 prompt %d", L), 32, 4, 128, 0, 0, 0, L));
	/* chunks at nonzero positions (prefix in the cache) */
	const int starts[] = {1, 15, 16, 63, 64, 1000};
	const int clens[] = {1, 5, 16, 100, 500};
	for (size_t si = 0; si < 6; si++)
		for (size_t li = 0; li < 5; li++)
			if ((si + li) % 2 == 0 || li == 3)
				cs.push_back(one(NAME("llama3 chunk %d+%d", starts[si], clens[li]), 32, 8, 128, 0, 0, starts[si],
				                 clens[li]));
	cs.push_back(one(NAME("qwen3 chunk 777+300"), 32, 4, 128, 0, 0, 777, 300));
	/* mixed batches: prompt chunks and decode tokens of several slots, in any slot order */
	{
		acase m = {NAME("llama3 mixed"), 32, 8, 128, 0, 0,
		           {{3, 40, 300}, {0, 10, 1}, {5, 700, 1}, {7, 1999, 1}, {1, 0, 17}, {2, 63, 64}, {4, 0, 1}}};
		cs.push_back(m);
		acase g = {NAME("gptoss win128 mixed"), 64, 8, 64, 128, 1,
		           {{1, 0, 33}, {6, 900, 1}, {0, 120, 200}, {2, 5, 1}, {3, 130, 9}, {4, 0, 1}}};
		cs.push_back(g);
		acase q = {NAME("qwen3 mixed"), 32, 4, 128, 0, 0, {{2, 1500, 1}, {0, 0, 129}, {1, 64, 64}, {3, 2, 1}}};
		cs.push_back(q);
		acase d = {NAME("llama3 decode only 8 slots"), 32, 8, 128, 0, 0, {}};
		for (int k = 0; k < 8; k++)
			d.segs.push_back({7 - k, (int)(t_rand_u64() % 1500), 1});
		cs.push_back(d);
		/* 70 sequences of 2 tokens: more tiles than the grid's slots (blocks loop) */
		acase s2 = {NAME("llama3 70 slots x 2 tokens"), 32, 8, 128, 0, 0, {}};
		for (int k = 0; k < 70; k++)
			s2.segs.push_back({(k * 37) % 70, (int)(t_rand_u64() % 300), 2});
		cs.push_back(s2);
		acase s3 = {NAME("gptoss win128 40 slots x 3 tokens"), 64, 8, 64, 128, 1, {}};
		for (int k = 0; k < 40; k++)
			s3.segs.push_back({k, (int)(t_rand_u64() % 400), 3});
		cs.push_back(s3);
	}
	/* other head groupings: G = 1, 2, 3, 16, 64 */
	cs.push_back(one(NAME("G1 d64 prompt 150"), 4, 4, 64, 0, 0, 0, 150));
	cs.push_back(one(NAME("G2 d128 win50 sinks chunk 30+120"), 8, 4, 128, 50, 1, 30, 120));
	cs.push_back(one(NAME("G3 d128 prompt 100"), 12, 4, 128, 0, 0, 0, 100));
	cs.push_back(one(NAME("G16 d128 prompt 77"), 16, 1, 128, 0, 1, 0, 77));
	cs.push_back(one(NAME("G64 d64 chunk 10+40"), 64, 1, 64, 0, 0, 10, 40));
	{
		acase m = {NAME("G3 d64 win20 mixed"), 6, 2, 64, 20, 1, {{1, 0, 50}, {0, 7, 1}, {2, 19, 30}}};
		cs.push_back(m);
	}

	for (int kv = FP4S_KV_BF16; kv <= FP4S_KV_FP8; kv++) {
		for (const acase &c : cs)
			run_case(c, 0, 0, 0, filter, kv);
		/* the precise kernel on a spread of cases */
		for (size_t k = 0; k < cs.size(); k += 3)
			run_case(cs[k], 1, 0, 0, filter, kv);
		/* the other tile shapes (dev/attn_prefill_bench compares them) on a spread of cases */
		const int alts[][3] = {{64, 64, 1}, {64, 128, 1}, {128, 64, 2}, {128, 32, 2}}; /* d, bn, mt */
		for (size_t k = 0; k < cs.size(); k += 2)
			for (size_t v = 0; v < 4; v++)
				if (cs[k].d == alts[v][0] && (k / 2 + v + kv - FP4S_KV_BF16) % 2 == 0)
					run_case(cs[k], 0, alts[v][1], alts[v][2], filter, kv);
	}
	graph_and_repeat(filter);
	unsupported(filter);
	free(names);
	return TEST_DONE();
}
