// test_attention.cu (label gpu): fp4s_cuda_attention against an exact double-precision attention
// on fresh random inputs. K/V are Gaussian, stored FP32 or BF16 (the reference reads the same
// BF16-rounded values); q is Gaussian with a per-case spread, sinks random. The pool's blocks are
// shuffled (each sequence's table row scatters), rows past a sequence's last position and blocks
// no table uses hold NaN, and the output is poisoned with NaN before each call. Geometries:
// llama3-8b (32/8 x 128), gpt-oss (64/8 x 64, sinks, window 128), qwen3-30b-a3b (32/4 x 128),
// G = 1, 3 and 16, head dims 16, 32 and 256 (generic path); contexts 1 to 6000; batches of
// decode tokens of different lengths and prefill chunks mixed with decodes; caller split counts
// 1 to 128; every tuning of the tensor-core kernel (2/4/8 warps, blocks per SM, shared-memory ring
// or registers, fused or separate merge); and
// a graph captured once and replayed with new positions, slots and block tables. The check:
// relative L2 error over the output <= 1e-5 (FP32 cache) / 2e-5 (BF16 cache, tensor cores),
// <= 1e-4 for each token, and no NaN. `test_attention [filter]` runs cases whose name contains
// filter.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attention_cuda.h"
#include "numerics/numerics.h"
#include "test_util.h"

#define CK(call)                                                                              \
	do {                                                                                  \
		cudaError_t e_ = (call);                                                      \
		if (e_ != cudaSuccess) {                                                      \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,         \
			        cudaGetErrorString(e_));                                      \
			exit(1);                                                              \
		}                                                                             \
	} while (0)

struct seqspec {
	int len;  /* positions in the cache */
	int ntok; /* the batch's tokens of this sequence: positions len - ntok .. len - 1 */
};

struct acase {
	const char *geo;
	int nh, nkv, d, bf16, window, sinks;
	std::vector<seqspec> seqs;
	int splits;
	fp4s_attn_tune tune;
	int graph; /* capture once, replay with new positions (needs the same token count) */
	double qmag;
};

static double worst_mma, worst_generic;

/* The pool, tables and batch of one case on the host. */
struct batch {
	int n, stride, nblocks;
	std::vector<int32_t> pos, seq, table;
};

static batch make_batch(const acase &c)
{
	batch b;
	b.n = 0;
	int maxlen = 1;
	for (const seqspec &s : c.seqs) {
		b.n += s.ntok;
		maxlen = s.len > maxlen ? s.len : maxlen;
	}
	b.stride = (maxlen + FP4S_KV_BLOCK - 1) / FP4S_KV_BLOCK;
	const int ns = (int)c.seqs.size();
	b.nblocks = ns * b.stride + 5;
	std::vector<int32_t> perm(b.nblocks);
	for (int i = 0; i < b.nblocks; i++)
		perm[i] = i;
	for (int i = b.nblocks - 1; i > 0; i--)
		std::swap(perm[i], perm[t_rand_u64() % (i + 1)]);
	b.table.assign((size_t)ns * b.stride, 0);
	for (size_t i = 0; i < b.table.size(); i++)
		b.table[i] = perm[i];
	/* tokens interleaved across sequences, each sequence's in increasing position order */
	std::vector<int> next(ns, 0);
	for (int left = b.n; left > 0;) {
		const int s = (int)(t_rand_u64() % ns);
		if (next[s] >= c.seqs[s].ntok)
			continue;
		b.pos.push_back(c.seqs[s].len - c.seqs[s].ntok + next[s]++);
		b.seq.push_back(s);
		left--;
	}
	return b;
}

static size_t row_of(const batch &b, int s, int t)
{
	return (size_t)b.table[(size_t)s * b.stride + t / FP4S_KV_BLOCK] * FP4S_KV_BLOCK + t % FP4S_KV_BLOCK;
}

/* fills the host pool (floats: the values the cache holds) for the batch's sequences */
static void fill_pool(const acase &c, const batch &b, std::vector<float> &k, std::vector<float> &v)
{
	const int kvw = c.nkv * c.d;
	const size_t pool = (size_t)b.nblocks * FP4S_KV_BLOCK * kvw;
	k.assign(pool, NAN);
	v.assign(pool, NAN);
	for (size_t s = 0; s < c.seqs.size(); s++)
		for (int t = 0; t < c.seqs[s].len; t++) {
			const size_t row = row_of(b, (int)s, t);
			for (int j = 0; j < kvw; j++) {
				float x = (float)t_rand_normal(), y = (float)t_rand_normal();
				if (c.bf16) {
					x = fp4s_bf16_to_f32(fp4s_f32_to_bf16(x));
					y = fp4s_bf16_to_f32(fp4s_f32_to_bf16(y));
				}
				k[row * kvw + j] = x;
				v[row * kvw + j] = y;
			}
		}
}

static void reference(const acase &c, const batch &b, const std::vector<float> &q, const std::vector<float> &k,
                      const std::vector<float> &v, const std::vector<float> &sinks, float scale,
                      std::vector<double> &out)
{
	const int kvw = c.nkv * c.d, G = c.nh / c.nkv;
	out.assign((size_t)b.n * c.nh * c.d, 0.0);
	std::vector<double> s, acc(c.d);
	for (int i = 0; i < b.n; i++) {
		const int p = b.pos[i];
		const int start = c.window > 0 && p - c.window + 1 > 0 ? p - c.window + 1 : 0;
		s.assign(p + 1, 0.0);
		for (int h = 0; h < c.nh; h++) {
			const float *qh = &q[((size_t)i * c.nh + h) * c.d];
			const size_t off = (size_t)(h / G) * c.d;
			double m = c.sinks ? sinks[h] : -INFINITY;
			for (int t = start; t <= p; t++) {
				const float *kt = &k[row_of(b, b.seq[i], t) * kvw + off];
				double a = 0;
				for (int j = 0; j < c.d; j++)
					a += (double)qh[j] * kt[j];
				s[t] = a * scale;
				m = s[t] > m ? s[t] : m;
			}
			double l = c.sinks ? exp(sinks[h] - m) : 0.0;
			for (int j = 0; j < c.d; j++)
				acc[j] = 0;
			for (int t = start; t <= p; t++) {
				const double e = exp(s[t] - m);
				l += e;
				const float *vt = &v[row_of(b, b.seq[i], t) * kvw + off];
				for (int j = 0; j < c.d; j++)
					acc[j] += e * vt[j];
			}
			for (int j = 0; j < c.d; j++)
				out[((size_t)i * c.nh + h) * c.d + j] = acc[j] / l;
		}
	}
}

/* relative L2 over all and the worst token; returns 1 on failure */
static int compare(const char *name, const acase &c, const batch &b, const std::vector<float> &got,
                   const std::vector<double> &want, int mma)
{
	const size_t w = (size_t)c.nh * c.d;
	double num = 0, den = 0, worst_tok = 0;
	long nan_at = -1;
	for (int i = 0; i < b.n; i++) {
		double tn = 0, td = 0;
		for (size_t j = 0; j < w; j++) {
			const float x = got[i * w + j];
			if (isnan(x) && nan_at < 0)
				nan_at = (long)(i * w + j);
			const double e = x - want[i * w + j];
			tn += e * e;
			td += want[i * w + j] * want[i * w + j];
		}
		num += tn;
		den += td;
		const double r = sqrt(tn / td);
		worst_tok = r > worst_tok || isnan(r) ? r : worst_tok;
	}
	const double rel = sqrt(num / den);
	const double tol = mma ? 2e-5 : 1e-5;
	double &worst = mma ? worst_mma : worst_generic;
	worst = rel > worst ? rel : worst;
	if (nan_at >= 0 || !(rel <= tol) || !(worst_tok <= 1e-4)) {
		fprintf(stderr, "%s: FAIL rel L2 %.3g (tol %.0e), worst token %.3g", name, rel, tol, worst_tok);
		if (nan_at >= 0)
			fprintf(stderr, ", NaN at token %ld head %ld dim %ld", nan_at / (long)w,
			        nan_at % (long)w / c.d, nan_at % c.d);
		fputc('\n', stderr);
		/* where the error sits: per head and per dim of the first failing token */
		for (int i = 0; i < b.n; i++) {
			double tn = 0, td = 0;
			for (size_t j = 0; j < w; j++) {
				const double e = got[i * w + j] - want[i * w + j];
				tn += e * e;
				td += want[i * w + j] * want[i * w + j];
			}
			if (!(sqrt(tn / td) <= 1e-4)) {
				fprintf(stderr, "  token %d (pos %d, seq %d): rel %.3g; head errors:", i, b.pos[i], b.seq[i],
				        sqrt(tn / td));
				for (int h = 0; h < c.nh && h < 16; h++) {
					double hn = 0, hd = 0;
					for (int j = 0; j < c.d; j++) {
						const double e = got[i * w + h * c.d + j] - want[i * w + h * c.d + j];
						hn += e * e;
						hd += want[i * w + h * c.d + j] * want[i * w + h * c.d + j];
					}
					fprintf(stderr, " %.2g", sqrt(hn / hd));
				}
				fprintf(stderr, "\n  head 0 dims got/want:");
				for (int j = 0; j < c.d && j < 12; j++)
					fprintf(stderr, " %.4f/%.4f", got[i * w + j], want[i * w + j]);
				fputc('\n', stderr);
				break;
			}
		}
		return 1;
	}
	if (getenv("FP4S_TEST_VERBOSE"))
		printf("%s: rel L2 %.3g, worst token %.3g\n", name, rel, worst_tok);
	return 0;
}

static int run_case(const acase &c, const char *filter)
{
	char name[512];
	int off = snprintf(name, sizeof name, "ATT(%s,nh=%d,nkv=%d,d=%d,%s%s%s,win=%d,splits=%d", c.geo, c.nh, c.nkv,
	                   c.d, c.bf16 ? "bf16" : "f32", c.sinks ? ",sinks" : "", c.graph ? ",graph" : "", c.window,
	                   c.splits);
	if (c.tune.warps || c.tune.blocks_per_sm || c.tune.min_tiles || c.tune.unfused || c.tune.generic)
		off += snprintf(name + off, sizeof name - off, ",tune=%d/%d/%d/%d/%d", c.tune.warps, c.tune.blocks_per_sm,
		                c.tune.min_tiles, c.tune.unfused, c.tune.generic);
	off += snprintf(name + off, sizeof name - off, ",seqs=");
	for (size_t s = 0; s < c.seqs.size() && off < 440; s++)
		off += snprintf(name + off, sizeof name - off, "%s%d%s", s ? "/" : "", c.seqs[s].len,
		                c.seqs[s].ntok > 1 ? "p" : "");
	snprintf(name + off, sizeof name - off, ")");
	if (filter && !strstr(name, filter))
		return 0;
	const int G = c.nh / c.nkv, kvw = c.nkv * c.d;
	const int mma = c.bf16 && (c.d == 64 || c.d == 128) && G <= 8 && !c.tune.generic;
	batch b = make_batch(c);
	std::vector<float> k, v;
	fill_pool(c, b, k, v);
	std::vector<float> q((size_t)b.n * c.nh * c.d), sinks(c.nh);
	for (auto &x : q)
		x = (float)(t_rand_normal() * c.qmag);
	for (auto &x : sinks)
		x = (float)(t_rand_normal() * 2.0 + 1.0);
	const float scale = 1.0f / sqrtf((float)c.d);

	/* device copies */
	const size_t pool = k.size(), esz = c.bf16 ? 2 : 4;
	std::vector<uint16_t> kb, vb;
	const void *kh = k.data(), *vh = v.data();
	if (c.bf16) {
		kb.resize(pool);
		vb.resize(pool);
		for (size_t i = 0; i < pool; i++) {
			kb[i] = isnan(k[i]) ? 0x7FC0 : fp4s_f32_to_bf16(k[i]);
			vb[i] = isnan(v[i]) ? 0x7FC0 : fp4s_f32_to_bf16(v[i]);
		}
		kh = kb.data();
		vh = vb.data();
	}
	void *dk, *dv;
	float *dq, *dout, *dwork, *dsinks;
	int32_t *dpos, *dseq, *dtable;
	const int64_t wf = fp4s_cuda_attention_work_floats(b.n, c.nh, c.nkv, c.d, c.splits);
	CK(cudaMalloc(&dk, pool * esz));
	CK(cudaMalloc(&dv, pool * esz));
	CK(cudaMemcpy(dk, kh, pool * esz, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dv, vh, pool * esz, cudaMemcpyHostToDevice));
	CK(cudaMalloc(&dq, q.size() * 4));
	CK(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
	CK(cudaMalloc(&dsinks, sinks.size() * 4));
	CK(cudaMemcpy(dsinks, sinks.data(), sinks.size() * 4, cudaMemcpyHostToDevice));
	CK(cudaMalloc(&dout, q.size() * 4));
	CK(cudaMalloc(&dwork, (size_t)wf * 4));
	CK(cudaMemset(dwork, 0xFF, (size_t)wf * 4)); /* NaN: partials must be written before read */
	CK(cudaMalloc(&dpos, b.n * 4));
	CK(cudaMalloc(&dseq, b.n * 4));
	CK(cudaMalloc(&dtable, b.table.size() * 4));
	auto upload_batch = [&](const batch &x) {
		CK(cudaMemcpy(dpos, x.pos.data(), x.n * 4, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(dseq, x.seq.data(), x.n * 4, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(dtable, x.table.data(), x.table.size() * 4, cudaMemcpyHostToDevice));
	};
	upload_batch(b);
	std::vector<float> got(q.size());
	std::vector<double> want;
	struct fp4s_error err = {0};
	cudaStream_t st;
	CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	auto call = [&]() {
		return fp4s_cuda_attention_ex(dq, dk, dv, c.bf16, dpos, dseq, dtable, b.stride, b.n, c.nh, c.nkv, c.d,
		                              c.window, c.sinks ? dsinks : NULL, scale, c.splits, dwork, dout, &c.tune, st,
		                              &err);
	};
	int failed = 0;
	const int rounds = c.graph ? 3 : 1;
	cudaGraphExec_t exec = NULL;
	for (int round = 0; round < rounds && !failed; round++) {
		if (round > 0) {
			/* same shape, new contents: positions, slots, block tables, K/V */
			b = make_batch(c);
			fill_pool(c, b, k, v);
			if (!c.bf16) {
				kh = k.data();
				vh = v.data();
			}
			for (size_t i = 0; i < pool; i++) {
				if (c.bf16) {
					kb[i] = isnan(k[i]) ? 0x7FC0 : fp4s_f32_to_bf16(k[i]);
					vb[i] = isnan(v[i]) ? 0x7FC0 : fp4s_f32_to_bf16(v[i]);
				}
			}
			CK(cudaMemcpy(dk, kh, pool * esz, cudaMemcpyHostToDevice));
			CK(cudaMemcpy(dv, vh, pool * esz, cudaMemcpyHostToDevice));
			upload_batch(b);
		}
		std::vector<float> poison(q.size(), NAN);
		CK(cudaMemcpy(dout, poison.data(), poison.size() * 4, cudaMemcpyHostToDevice));
		/* pageable copies may still be landing when cudaMemcpy returns, and st does not wait
		 * for the legacy stream */
		CK(cudaDeviceSynchronize());
		int rc = 0;
		if (c.graph) {
			if (!exec) {
				cudaGraph_t gr;
				CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
				rc = call();
				CK(cudaStreamEndCapture(st, &gr));
				if (!rc) {
					CK(cudaGraphInstantiate(&exec, gr, 0));
				}
				CK(cudaGraphDestroy(gr));
			}
			if (!rc)
				CK(cudaGraphLaunch(exec, st));
		} else {
			rc = call();
		}
		if (rc) {
			fprintf(stderr, "%s: fp4s_cuda_attention failed: %s\n", name, err.msg);
			failed = 1;
			break;
		}
		CK(cudaStreamSynchronize(st));
		CK(cudaGetLastError());
		CK(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost));
		reference(c, b, q, k, v, sinks, scale, want);
		failed = compare(name, c, b, got, want, mma);
	}
	if (exec)
		CK(cudaGraphExecDestroy(exec));
	CK(cudaStreamDestroy(st));
	if (failed)
		t_fail++;
	else
		t_pass++;
	CK(cudaFree(dk));
	CK(cudaFree(dv));
	CK(cudaFree(dq));
	CK(cudaFree(dsinks));
	CK(cudaFree(dout));
	CK(cudaFree(dwork));
	CK(cudaFree(dpos));
	CK(cudaFree(dseq));
	CK(cudaFree(dtable));
	(void)kvw;
	return failed;
}

static std::vector<seqspec> decode(std::initializer_list<int> lens)
{
	std::vector<seqspec> v;
	for (int l : lens)
		v.push_back({l, 1});
	return v;
}

static std::vector<seqspec> random_decode(int n, int maxlen)
{
	std::vector<seqspec> v;
	for (int i = 0; i < n; i++)
		v.push_back({1 + (int)(t_rand_u64() % maxlen), 1});
	return v;
}

int main(int argc, char **argv)
{
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)
		TEST_SKIP("no CUDA device");
	t_seed_from_env();
	const char *filter = argc > 1 ? argv[1] : NULL;
	cudaDeviceProp p;
	CK(cudaGetDeviceProperties(&p, 0));
	printf("device: %s (compute capability %d.%d)\n", p.name, p.major, p.minor);
	struct fp4s_error err = {0};
	if (fp4s_cuda_attention_setup(&err)) {
		fprintf(stderr, "setup: %s\n", err.msg);
		return 1;
	}
	struct geo {
		const char *name;
		int nh, nkv, d, window, sinks;
	};
	const geo main_geos[] = {
	    {"llama3-8b", 32, 8, 128, 0, 0}, {"gpt-oss", 64, 8, 64, 0, 1}, {"gpt-oss-swa", 64, 8, 64, 128, 1},
	    {"qwen3-moe", 32, 4, 128, 0, 0},
	};
	const geo other_geos[] = {
	    {"g1", 8, 8, 64, 0, 0},          {"g3", 24, 8, 128, 0, 1},     {"g16", 32, 2, 64, 0, 0},
	    {"g16-d128", 16, 1, 128, 40, 1}, {"tiny16", 4, 2, 16, 0, 0},  {"tiny32", 8, 2, 32, 5, 1},
	    {"d256", 8, 2, 256, 0, 0},       {"g2-win", 4, 2, 128, 17, 0},
	};
	const fp4s_attn_tune dflt = {0, 0, 0, 0, 0, 0};
	/* decode at every context class, both cache types, the engine's split counts */
	for (const geo &g : main_geos)
		for (int bf16 = 0; bf16 <= 1; bf16++) {
			const int lens[] = {1, 2, 15, 16, 17, 33, 100, 129, 513, 4096, 5003};
			for (int l : lens) {
				const int splits = l % 3 == 0 ? 7 : 128;
				run_case({g.name, g.nh, g.nkv, g.d, bf16, g.window, g.sinks, decode({l}), splits, dflt, 0, 1.0},
				         filter);
			}
			/* a batch of decodes of different lengths; prefill chunks mixed with decodes */
			run_case({g.name, g.nh, g.nkv, g.d, bf16, g.window, g.sinks, random_decode(9, 6000), 14, dflt, 0, 1.0},
			         filter);
			run_case({g.name, g.nh, g.nkv, g.d, bf16, g.window, g.sinks,
			          {{40, 40}, {316, 17}, {1, 1}, {77, 1}, {2100, 3}, {18, 1}}, 2, dflt, 0, 2.0},
			         filter);
			/* sharper softmax: q x 4 */
			run_case({g.name, g.nh, g.nkv, g.d, bf16, g.window, g.sinks, decode({1000, 37}), 128, dflt, 0, 4.0},
			         filter);
		}
	/* batch 64 decode (the engine's split count for it is 1 or 2) and a 300-token prefill */
	run_case({"llama3-8b", 32, 8, 128, 1, 0, 0, random_decode(64, 3000), 2, dflt, 0, 1.0}, filter);
	run_case({"gpt-oss-swa", 64, 8, 64, 1, 128, 1, random_decode(64, 3000), 2, dflt, 0, 1.0}, filter);
	run_case({"qwen3-moe", 32, 4, 128, 1, 0, 0, {{300, 300}}, 1, dflt, 0, 1.0}, filter);
	run_case({"gpt-oss", 64, 8, 64, 1, 0, 1, {{300, 300}, {20, 1}}, 1, dflt, 0, 1.0}, filter);
	/* other geometries: the generic path (G > 8, d 16/32/256, FP32) and G = 1, 2, 3 */
	for (const geo &g : other_geos)
		for (int bf16 = 0; bf16 <= 1; bf16++) {
			run_case({g.name, g.nh, g.nkv, g.d, bf16, g.window, g.sinks, decode({1, 31, 700}), 128, dflt, 0, 1.0},
			         filter);
			run_case({g.name, g.nh, g.nkv, g.d, bf16, g.window, g.sinks, {{50, 20}, {5200, 1}, {3, 1}}, 3, dflt, 0, 1.0},
			         filter);
		}
	/* every tuning of the tensor-core kernel */
	for (int w = 2; w <= 8; w *= 2)
		for (int bps = 1; bps <= 8; bps *= 2)
			for (int uf = 0; uf <= 1; uf++) {
				const fp4s_attn_tune t = {w, bps, (w + bps + uf) % 3 == 0 ? 1 : 0, uf, 0, 1 + (w + bps + uf) % 4};
				run_case({"llama3-8b", 32, 8, 128, 1, 0, 0, decode({4096, 17, 1500}), 128, t, 0, 1.0}, filter);
				run_case({"gpt-oss-swa", 64, 8, 64, 1, 128, 1, decode({4000, 130}), 128, t, 0, 1.0}, filter);
				run_case({"gpt-oss", 64, 8, 64, 1, 0, 1, decode({6000, 1}), 64, t, 0, 1.0}, filter);
			}
	/* the generic kernel forced on the main geometries */
	{
		const fp4s_attn_tune t = {0, 0, 0, 0, 1, 0};
		run_case({"llama3-8b", 32, 8, 128, 1, 0, 0, decode({4096, 200}), 128, t, 0, 1.0}, filter);
		run_case({"gpt-oss-swa", 64, 8, 64, 1, 128, 1, decode({999}), 128, t, 0, 1.0}, filter);
	}
	/* more tokens x KV heads than the counters: the separate merge kernel by default */
	{
		const fp4s_attn_tune t = {4, 400, 1, 0, 0, 0};
		run_case({"many", 8, 8, 64, 1, 0, 1, random_decode(1100, 200), 4, t, 0, 1.0}, filter);
		run_case({"many", 8, 8, 64, 1, 0, 1, random_decode(1100, 200), 1, dflt, 0, 1.0}, filter);
	}
	/* graphs: captured once, replayed with new positions, slots and tables (the counters too) */
	run_case({"llama3-8b", 32, 8, 128, 1, 0, 0, decode({3000}), 128, dflt, 1, 1.0}, filter);
	run_case({"gpt-oss", 64, 8, 64, 1, 0, 1, random_decode(5, 2000), 16, dflt, 1, 1.0}, filter);
	run_case({"gpt-oss-swa", 64, 8, 64, 1, 128, 1, random_decode(3, 500), 128, dflt, 1, 1.0}, filter);
	run_case({"llama3-8b", 32, 8, 128, 0, 0, 0, decode({900}), 128, dflt, 1, 1.0}, filter);
	/* bad arguments are errors, not launches */
	{
		float *d;
		CK(cudaMalloc(&d, 4096));
		CHECK(fp4s_cuda_attention(d, d, d, 1, (int32_t *)d, (int32_t *)d, (int32_t *)d, 1, 1, 12, 8, 64, 0, NULL,
		                          1.0f, 1, d, d, 0, &err) == FP4S_EUNSUPPORTED);
		CHECK(fp4s_cuda_attention(d, d, d, 1, (int32_t *)d, (int32_t *)d, (int32_t *)d, 1, 1, 8, 8, 48, 0, NULL,
		                          1.0f, 1, d, d, 0, &err) == FP4S_EUNSUPPORTED);
		const fp4s_attn_tune bad = {3, 0, 0, 0, 0, 0}, bad_stages = {0, 0, 0, 0, 0, 5};
		CHECK(fp4s_cuda_attention_ex(d, d, d, 1, (int32_t *)d, (int32_t *)d, (int32_t *)d, 1, 1, 8, 8, 64, 0, NULL,
		                             1.0f, 1, d, d, &bad, 0, &err) == FP4S_EINVAL);
		CHECK(fp4s_cuda_attention_ex(d, d, d, 1, (int32_t *)d, (int32_t *)d, (int32_t *)d, 1, 1, 8, 8, 64, 0, NULL,
		                             1.0f, 1, d, d, &bad_stages, 0, &err) == FP4S_EINVAL);
		CK(cudaFree(d));
	}
	printf("worst relative L2: tensor-core path %.3g, generic path %.3g\n", worst_mma, worst_generic);
	return TEST_DONE();
}
