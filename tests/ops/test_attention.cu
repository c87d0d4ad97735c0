// test_attention.cu (label gpu): fp4s_cuda_attention against an exact double-precision attention
// on fresh random inputs. K/V are Gaussian, stored FP32, BF16 or FP8 E4M3 (the reference reads
// the same rounded values: the CPU's encoders); q is Gaussian with a per-case spread, sinks
// random. The pool's blocks are shuffled (each sequence's table row scatters), rows past a
// sequence's last position and blocks no table uses hold NaN, and the output is poisoned with NaN
// before each call. Geometries: llama3-8b (32/8 x 128), gpt-oss (64/8 x 64, sinks, window 128),
// qwen3-30b-a3b (32/4 x 128), G = 1, 3 and 16, head dims 16, 32 and 256 (generic path); contexts
// 1 to 6000; batches of decode tokens of different lengths and prefill chunks mixed with decodes;
// caller split counts 1 to 128; every tuning of the tensor-core kernel (2/4/8 warps, blocks per
// SM, shared-memory ring or registers, fused or separate merge); and a graph captured once and
// replayed with new positions, slots and block tables. The check: relative L2 error over the
// output <= 1e-5 (FP32 cache) / 2e-5 (BF16 and FP8 caches, tensor cores: E4M3 values enter the
// MMA exactly, so FP8 has BF16's error), <= 1e-4 for each token, and no NaN.
//
// The FP8 cache's own pieces are checked too (fp8_checks): the device E4M3 encoder the KV write
// uses against the CPU's on all 2^32 floats, the E4M3 -> BF16 decode on all byte pairs, and the
// CUDA backend's attention op (KV write, flash prefill, split-K decode) against the CPU
// backend's with the same cache type (FP8 and BF16) over a prompt step and a decode step.
// The fused decode form (fp4s_cuda_attention_fused: q/k RMSNorm and RoPE in the kernel, the
// token's K/V row written by the block that reads it) is checked the same way, plus the written
// rows against the host's normed and rotated k and v to the cache type's rounding.
// `test_attention [filter]` runs cases whose name contains filter.
#include <algorithm>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attention_cuda.h"
#include "backend/cuda/kv_fp8.cuh"
#include "numerics/numerics.h"
#include "ops_test.h"
#include "test_util.h"

struct seqspec {
	int len;  /* positions in the cache */
	int ntok; /* the batch's tokens of this sequence: positions len - ntok .. len - 1 */
};

struct acase {
	const char *geo;
	int nh, nkv, d, kv, window, sinks; /* kv: enum fp4s_kv_dtype */
	std::vector<seqspec> seqs;
	int splits;
	fp4s_attn_tune tune;
	int graph; /* capture once, replay with new positions (needs the same token count) */
	double qmag;
	int pro;   /* fp4s_cuda_attention_fused: 1 = RoPE of rot dims and the KV write, 2 = q/k RMSNorm too */
	int rot;
};

static double worst_mma, worst_generic, worst_mma8, worst_generic8;

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
				if (c.kv == FP4S_KV_BF16) {
					x = fp4s_bf16_to_f32(fp4s_f32_to_bf16(x));
					y = fp4s_bf16_to_f32(fp4s_f32_to_bf16(y));
				} else if (c.kv == FP4S_KV_FP8) {
					x = fp4s_e4m3_to_f32(fp4s_f32_to_e4m3(x));
					y = fp4s_e4m3_to_f32(fp4s_f32_to_e4m3(y));
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

/* the pool's values as the cache of type kv holds them (they are representable already; NaN
 * stays NaN: 0x7FC0 in BF16, 0x7F in E4M3) */
static void to_cache(const std::vector<float> &x, int kv, std::vector<uint8_t> &out)
{
	const size_t es = (size_t)fp4s_kv_dtype_bytes((enum fp4s_kv_dtype)kv);
	out.resize(x.size() * es);
	for (size_t i = 0; i < x.size(); i++) {
		if (kv == FP4S_KV_FP8) {
			out[i] = fp4s_f32_to_e4m3(x[i]);
		} else if (kv == FP4S_KV_BF16) {
			const uint16_t h = fp4s_f32_to_bf16(x[i]);
			memcpy(&out[2 * i], &h, 2);
		} else {
			memcpy(&out[4 * i], &x[i], 4);
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
	double &worst = c.kv == FP4S_KV_FP8 ? (mma ? worst_mma8 : worst_generic8) : mma ? worst_mma : worst_generic;
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
	                   c.d, c.kv == FP4S_KV_FP8 ? "fp8" : c.kv == FP4S_KV_BF16 ? "bf16" : "f32", c.sinks ? ",sinks" : "",
	                   c.graph ? ",graph" : "", c.window,
	                   c.splits);
	if (c.tune.warps || c.tune.blocks_per_sm || c.tune.min_tiles || c.tune.unfused || c.tune.generic)
		off += snprintf(name + off, sizeof name - off, ",tune=%d/%d/%d/%d/%d", c.tune.warps, c.tune.blocks_per_sm,
		                c.tune.min_tiles, c.tune.unfused, c.tune.generic);
	if (c.tune.stages)
		off += snprintf(name + off, sizeof name - off, ",stages=%d", c.tune.stages);
	off += snprintf(name + off, sizeof name - off, ",seqs=");
	for (size_t s = 0; s < c.seqs.size() && off < 440; s++)
		off += snprintf(name + off, sizeof name - off, "%s%d%s", s ? "/" : "", c.seqs[s].len,
		                c.seqs[s].ntok > 1 ? "p" : "");
	if (c.pro)
		off += snprintf(name + off, sizeof name - off, ",fused-%s,rot=%d", c.pro == 2 ? "norm-rope" : "rope", c.rot);
	snprintf(name + off, sizeof name - off, ")");
	if (filter && !strstr(name, filter))
		return 0;
	const int G = c.nh / c.nkv, kvw = c.nkv * c.d;
	const int mma = c.kv != FP4S_KV_F32 && (c.d == 64 || c.d == 128) && G <= 8 && !c.tune.generic;
	batch b = make_batch(c);
	std::vector<float> k, v;
	fill_pool(c, b, k, v);
	std::vector<float> q((size_t)b.n * c.nh * c.d), sinks(c.nh);
	for (auto &x : q)
		x = (float)(t_rand_normal() * c.qmag);
	for (auto &x : sinks)
		x = (float)(t_rand_normal() * 2.0 + 1.0);
	const float scale = 1.0f / sqrtf((float)c.d);
	/* the fused prologue's inputs: raw k, v of each token, norm weights, frequencies; each
	 * token's own row of the pool starts as NaN and must be written by the call */
	std::vector<float> kraw((size_t)b.n * kvw), vraw((size_t)b.n * kvw), qn(c.d), kn(c.d), inv_freq(c.d / 2 + 1);
	const float mscale = 1.0625f, eps = 1e-6f;
	float *dkraw = NULL, *dvraw = NULL, *dqn = NULL, *dkn = NULL, *dfreq = NULL;
	auto fresh_pro = [&]() {
		for (auto &x : kraw)
			x = (float)t_rand_normal();
		for (auto &x : vraw)
			x = (float)t_rand_normal();
		for (int i = 0; i < b.n; i++)
			for (int j = 0; j < kvw; j++)
				k[row_of(b, b.seq[i], b.pos[i]) * kvw + j] = v[row_of(b, b.seq[i], b.pos[i]) * kvw + j] = NAN;
	};
	if (c.pro) {
		fresh_pro();
		for (int j = 0; j < c.d; j++) {
			qn[j] = (float)(0.5 + t_rand_uniform());
			kn[j] = (float)(0.5 + t_rand_uniform());
		}
		for (int j = 0; j < c.rot / 2; j++)
			inv_freq[j] = powf(500000.0f, -2.0f * (float)j / (float)c.rot);
		CK(cudaMalloc(&dkraw, kraw.size() * 4));
		CK(cudaMalloc(&dvraw, vraw.size() * 4));
		CK(cudaMalloc(&dqn, c.d * 4));
		CK(cudaMalloc(&dkn, c.d * 4));
		CK(cudaMalloc(&dfreq, inv_freq.size() * 4));
		CK(cudaMemcpy(dqn, qn.data(), c.d * 4, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(dkn, kn.data(), c.d * 4, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(dfreq, inv_freq.data(), inv_freq.size() * 4, cudaMemcpyHostToDevice));
	}
	/* the prologue's math on the host (norm_rope_kernel's): q as attention sees it, k rows */
	auto prep = [&](float *x, const float *w, int p) {
		if (c.pro == 2) {
			float ss = 0.0f;
			for (int j = 0; j < c.d; j++)
				ss += x[j] * x[j];
			const float inv = 1.0f / sqrtf(ss / (float)c.d + eps);
			for (int j = 0; j < c.d; j++)
				x[j] = x[j] * inv * w[j];
		}
		for (int j = 0; j < c.rot / 2; j++) {
			const float ang = (float)p * inv_freq[j], cs = cosf(ang) * mscale, sn = sinf(ang) * mscale;
			const float x1 = x[j], x2 = x[j + c.rot / 2];
			x[j] = x1 * cs - x2 * sn;
			x[j + c.rot / 2] = x2 * cs + x1 * sn;
		}
	};

	/* device copies */
	const size_t pool = k.size(), esz = (size_t)fp4s_kv_dtype_bytes((enum fp4s_kv_dtype)c.kv);
	std::vector<uint8_t> kb, vb;
	to_cache(k, c.kv, kb);
	to_cache(v, c.kv, vb);
	const void *kh = kb.data(), *vh = vb.data();
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
	const struct fp4s_attn_prologue pro = {dkraw, dvraw, c.pro == 2 ? dqn : NULL, c.pro == 2 ? dkn : NULL, eps, 0,
	                                       c.rot, dfreq, mscale};
	auto call = [&]() {
		if (c.pro)
			return fp4s_cuda_attention_fused(dq, dk, dv, c.kv, dpos, dseq, dtable, b.stride, b.n, c.nh, c.nkv, c.d,
			                                 c.window, c.sinks ? dsinks : NULL, scale, c.splits, dwork, dout, &pro,
			                                 &c.tune, st, &err);
		return fp4s_cuda_attention_ex(dq, dk, dv, c.kv, dpos, dseq, dtable, b.stride, b.n, c.nh, c.nkv, c.d,
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
			if (c.pro)
				fresh_pro();
			to_cache(k, c.kv, kb);
			to_cache(v, c.kv, vb);
			CK(cudaMemcpy(dk, kh, pool * esz, cudaMemcpyHostToDevice));
			CK(cudaMemcpy(dv, vh, pool * esz, cudaMemcpyHostToDevice));
			upload_batch(b);
		}
		if (c.pro) {
			CK(cudaMemcpy(dkraw, kraw.data(), kraw.size() * 4, cudaMemcpyHostToDevice));
			CK(cudaMemcpy(dvraw, vraw.data(), vraw.size() * 4, cudaMemcpyHostToDevice));
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
		std::vector<float> qref = q;
		if (c.pro) {
			/* the rows the call wrote: within the cache type's rounding of the host's k (normed,
			 * rotated) and v; the reference then reads them as written */
			std::vector<uint8_t> kb2(pool * esz), vb2(pool * esz);
			CK(cudaMemcpy(kb2.data(), dk, pool * esz, cudaMemcpyDeviceToHost));
			CK(cudaMemcpy(vb2.data(), dv, pool * esz, cudaMemcpyDeviceToHost));
			auto val = [&](const std::vector<uint8_t> &x, size_t at) {
				if (c.kv == FP4S_KV_FP8)
					return fp4s_e4m3_to_f32(x[at]);
				uint16_t h;
				memcpy(&h, &x[2 * at], 2);
				return fp4s_bf16_to_f32(h);
			};
			int bad_rows = 0;
			const float tol = c.kv == FP4S_KV_FP8 ? 0.07f : 0.008f;
			for (int i = 0; i < b.n; i++) {
				for (int h = 0; h < c.nh; h++)
					prep(&qref[((size_t)i * c.nh + h) * c.d], qn.data(), b.pos[i]);
				const size_t row = row_of(b, b.seq[i], b.pos[i]);
				for (int g0 = 0; g0 < c.nkv; g0++) {
					std::vector<float> kh(&kraw[(size_t)i * kvw + g0 * c.d], &kraw[(size_t)i * kvw + g0 * c.d] + c.d);
					prep(kh.data(), kn.data(), b.pos[i]);
					for (int j = 0; j < c.d; j++) {
						const size_t at = row * kvw + g0 * c.d + j;
						k[at] = val(kb2, at);
						v[at] = val(vb2, at);
						const float wv = vraw[(size_t)i * kvw + g0 * c.d + j];
						if (!(fabsf(k[at] - kh[j]) <= tol * fabsf(kh[j]) + 1e-3f) ||
						    !(fabsf(v[at] - wv) <= tol * fabsf(wv) + 1e-3f))
							bad_rows++;
					}
				}
			}
			if (bad_rows) {
				fprintf(stderr, "%s: FAIL %d values of the written K/V rows differ from the host's\n", name,
				        bad_rows);
				failed = 1;
				break;
			}
		}
		reference(c, b, qref, k, v, sinks, scale, want);
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
	cudaFree(dkraw), cudaFree(dvraw), cudaFree(dqn), cudaFree(dkn), cudaFree(dfreq);
	(void)kvw;
	return failed;
}

/* ---- the FP8 cache's own pieces ----------------------------------------------------------- */

/* every float through the KV write's encoder and through the CPU's (compiled for the device:
 * the same IEEE operations): non-NaN inputs must give the same byte, NaN a NaN byte */
static __global__ void e4m3_encode_all_kernel(unsigned long long *bad, unsigned long long *nan_ff,
                                              unsigned *first_bad)
{
	const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
	unsigned long long nb = 0, nf = 0;
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < (1ull << 32); i += stride) {
		const float x = __uint_as_float((uint32_t)i);
		const uint8_t got = fp4s_kv_e4m3(x), want = fp4s_f32_to_e4m3(x);
		const bool nan = (i & 0x7FFFFFFFu) > 0x7F800000u;
		if (nan ? (got & 0x7F) != 0x7F : got != want) {
			nb++;
			atomicMin(first_bad, (unsigned)i);
		}
		nf += nan && got == 0xFF;
	}
	atomicAdd(bad, nb);
	atomicAdd(nan_ff, nf);
}

/* every byte pair through the tensor-core decode, every byte through the generic one */
static __global__ void e4m3_decode_all_kernel(uint32_t *pairs, float *singles)
{
	const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < 65536)
		pairs[i] = fp4s_kv_e4m3x2_bf16x2(i);
	if (i < 256)
		singles[i] = fp4s_kv_e4m3_f32((uint8_t)i);
}

static void fp8_codec_checks(void)
{
	unsigned long long *d_cnt;
	unsigned *d_first;
	CK(cudaMalloc(&d_cnt, 16));
	CK(cudaMalloc(&d_first, 4));
	CK(cudaMemset(d_cnt, 0, 16));
	CK(cudaMemset(d_first, 0xFF, 4));
	e4m3_encode_all_kernel<<<132 * 16, 256>>>(d_cnt, d_cnt + 1, d_first);
	CK(cudaGetLastError());
	unsigned long long cnt[2];
	unsigned first;
	CK(cudaMemcpy(cnt, d_cnt, 16, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(&first, d_first, 4, cudaMemcpyDeviceToHost));
	printf("E4M3 encode (KV write) vs fp4s_f32_to_e4m3 on all 2^32 floats: %llu mismatches (NaN inputs that "
	       "gave 0xFF: %llu)\n", cnt[0], cnt[1]);
	CHECK_MSG(cnt[0] == 0, "%llu floats encode differently, the first %#x", cnt[0], first);
	CK(cudaFree(d_cnt));
	CK(cudaFree(d_first));

	uint32_t *d_pairs;
	float *d_single;
	CK(cudaMalloc(&d_pairs, 65536 * 4));
	CK(cudaMalloc(&d_single, 256 * 4));
	e4m3_decode_all_kernel<<<256, 256>>>(d_pairs, d_single);
	CK(cudaGetLastError());
	std::vector<uint32_t> pairs(65536);
	std::vector<float> single(256);
	CK(cudaMemcpy(pairs.data(), d_pairs, 65536 * 4, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(single.data(), d_single, 256 * 4, cudaMemcpyDeviceToHost));
	int bad = 0;
	for (uint32_t i = 0; i < 65536; i++)
		for (int h = 0; h < 2; h++) {
			const float want = fp4s_e4m3_to_f32((i >> (8 * h)) & 0xFF);
			const uint16_t got = (uint16_t)(pairs[i] >> (16 * h));
			const bool ok = isnan(want) ? (got & 0x7FFF) > 0x7F80 : got == fp4s_f32_to_bf16(want);
			if (!ok && bad++ < 4)
				fprintf(stderr, "E4M3 pair %#06x half %d: BF16 %#06x, want %#06x\n", i, h, got, fp4s_f32_to_bf16(want));
		}
	for (uint32_t b = 0; b < 256; b++) {
		const float want = fp4s_e4m3_to_f32(b);
		if (!(isnan(want) ? isnan(single[b]) : single[b] == want) && bad++ < 8)
			fprintf(stderr, "E4M3 %#04x: %a, want %a\n", b, single[b], want);
	}
	printf("E4M3 decode (BF16 pairs, floats) vs the CPU's on every byte: %d mismatches\n", bad);
	CHECK_MSG(bad == 0, "%d E4M3 decodes differ", bad);
	CK(cudaFree(d_pairs));
	CK(cudaFree(d_single));
}

/* The CUDA backend's attention op against the CPU backend's, both with a kv cache, over two
 * steps: every sequence's prompt but its last token (runs of >= 16 tokens send the CUDA step
 * to the flash prefill kernel), then the last tokens (a decode step: split-K). The KV write
 * rounds on each side with its own encoder, so equal bytes are part of what is compared. Bounds:
 * decode 2e-5 over the step and 1e-4 a token (as above); the prompt step 2e-3 and 1e-2, the
 * flash kernel's own (it rounds q and P to BF16: test_attention_prefill.cu). Sequences of one
 * token see one key, whose V row is then the output: with no sinks, bit-exact on both sides,
 * and (FP8) their V rows hold edge values (saturation, subnormals, ties). */
static void backend_case(const char *geo, int nh, int nkv, int d, int window, int sinks, std::vector<int> lens,
                         int kv, const char *filter)
{
	char name[160];
	snprintf(name, sizeof name, "BACKEND(%s,%s,seqs=%zu,max=%d)", geo, kv == FP4S_KV_FP8 ? "fp8" : "bf16",
	         lens.size(), *std::max_element(lens.begin(), lens.end()));
	if (filter && !strstr(name, filter))
		return;
	static const float edge[] = {448.0f, -449.0f, 464.0f, 1e9f, -INFINITY, 0x1p-9f, 0x1p-10f, 0x1.8p-10f,
	                             1.0625f, 1.1875f, -232.0f, 0x1p-6f, 0x1.1p-7f, -0.0f, 3.0f};
	const int nseq = (int)lens.size(), kvw = nkv * d, qw = nh * d;
	const int maxlen = *std::max_element(lens.begin(), lens.end());
	const int stride = (maxlen + FP4S_KV_BLOCK - 1) / FP4S_KV_BLOCK, nblocks = nseq * stride + 3;
	std::vector<int32_t> perm(nblocks), table((size_t)nseq * stride);
	for (int i = 0; i < nblocks; i++)
		perm[i] = i;
	for (int i = nblocks - 1; i > 0; i--)
		std::swap(perm[i], perm[t_rand_u64() % (i + 1)]);
	for (size_t i = 0; i < table.size(); i++)
		table[i] = perm[i];
	int total = 0;
	for (int l : lens)
		total += l;
	std::vector<float> q((size_t)total * qw), k((size_t)total * kvw), v((size_t)total * kvw), hs(nh);
	std::vector<int32_t> tpos, tseq, tlast;
	for (int s = 0; s < nseq; s++)
		for (int t = 0; t < lens[s]; t++) {
			tpos.push_back(t), tseq.push_back(s), tlast.push_back(t == lens[s] - 1);
			const size_t i = tpos.size() - 1;
			for (int j = 0; j < qw; j++)
				q[i * qw + j] = (float)t_rand_normal();
			for (int j = 0; j < kvw; j++) {
				k[i * kvw + j] = (float)t_rand_normal();
				/* (BF16 keeps an infinity, which the kernel's zero lo-half of P turns into NaN) */
				const bool one_key_fp8 = lens[s] == 1 && kv == FP4S_KV_FP8;
				v[i * kvw + j] = one_key_fp8 ? (j < 15 ? edge[j] : (float)((t_rand_u64() & 1 ? 1 : -1) *
				                                                          exp2(-12 + 22 * t_rand_uniform())))
				                             : (float)t_rand_normal();
			}
		}
	for (auto &x : hs)
		x = (float)(t_rand_normal() + 1.0);
	struct fp4s_error err = {0};
	struct fp4s_backend *cpu = NULL, *gpu = NULL;
	if (fp4s_backend_cpu_create(&cpu, &err) || fp4s_backend_cuda_create(0, &gpu, &err)) {
		CHECK_MSG(0, "%s: backends: %s", name, err.msg);
		return;
	}
	const enum fp4s_kv_dtype dt = (enum fp4s_kv_dtype)kv;
	CHECK(cpu->kv_init(cpu, 2, kvw, nblocks, nseq, maxlen, dt, &err) == FP4S_OK);
	CHECK(gpu->kv_init(gpu, 2, kvw, nblocks, nseq, maxlen, dt, &err) == FP4S_OK);
	float *dq, *dk, *dv, *dout, *dsinks;
	CK(cudaMalloc(&dq, q.size() * 4));
	CK(cudaMalloc(&dk, k.size() * 4));
	CK(cudaMalloc(&dv, v.size() * 4));
	CK(cudaMalloc(&dout, q.size() * 4));
	CK(cudaMalloc(&dsinks, (size_t)nh * 4));
	CK(cudaMemcpy(dsinks, hs.data(), (size_t)nh * 4, cudaMemcpyHostToDevice));
	for (int step = 0; step < 2; step++) {
		std::vector<int32_t> pos, seq, tok, idx;
		for (int i = 0; i < total; i++)
			if (tlast[i] == step)
				idx.push_back(i), pos.push_back(tpos[i]), seq.push_back(tseq[i]), tok.push_back(0);
		const int n = (int)idx.size();
		if (n == 0)
			continue;
		std::vector<float> sq((size_t)n * qw), sk((size_t)n * kvw), sv((size_t)n * kvw), oc((size_t)n * qw),
		    og((size_t)n * qw, NAN);
		for (int j = 0; j < n; j++) {
			memcpy(&sq[(size_t)j * qw], &q[(size_t)idx[j] * qw], (size_t)qw * 4);
			memcpy(&sk[(size_t)j * kvw], &k[(size_t)idx[j] * kvw], (size_t)kvw * 4);
			memcpy(&sv[(size_t)j * kvw], &v[(size_t)idx[j] * kvw], (size_t)kvw * 4);
		}
		CK(cudaMemcpy(dq, sq.data(), sq.size() * 4, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(dk, sk.data(), sk.size() * 4, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(dv, sv.data(), sv.size() * 4, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(dout, og.data(), og.size() * 4, cudaMemcpyHostToDevice));
		CK(cudaDeviceSynchronize());
		const struct fp4s_batch b = {n, tok.data(), pos.data(), seq.data(), table.data(), stride};
		const float scale = 1.0f / sqrtf((float)d);
		const struct fp4s_attn_params pc = {nh, nkv, d, window, sinks ? hs.data() : NULL, scale};
		const struct fp4s_attn_params pg = {nh, nkv, d, window, sinks ? dsinks : NULL, scale};
		int rc = cpu->begin(cpu, &b, &err);
		if (!rc)
			rc = cpu->attention(cpu, 1, sq.data(), sk.data(), sv.data(), &b, &pc, oc.data(), &err);
		if (!rc)
			rc = gpu->begin(gpu, &b, &err);
		if (!rc)
			rc = gpu->attention(gpu, 1, dq, dk, dv, &b, &pg, dout, &err);
		if (!rc)
			rc = gpu->read(gpu, og.data(), dout, (int64_t)og.size() * 4, &err);
		if (rc) {
			CHECK_MSG(0, "%s step %d: %s", name, step, err.msg);
			break;
		}
		double num = 0, den = 0, worst = 0;
		int nan = 0, inexact = 0;
		for (int j = 0; j < n; j++) {
			double tn = 0, td = 0;
			for (int x = 0; x < qw; x++) {
				const double gx = og[(size_t)j * qw + x], cx = oc[(size_t)j * qw + x];
				nan |= isnan(gx);
				tn += (gx - cx) * (gx - cx), td += cx * cx;
				if (lens[seq[j]] == 1 && !sinks && gx != cx)
					inexact++;
			}
			num += tn, den += td;
			worst = fmax(worst, sqrt(tn / td));
		}
		const double rel = sqrt(num / den), tol = step ? 2e-5 : 2e-3, ttol = step ? 1e-4 : 1e-2;
		printf("%s %s step (%d tokens): CUDA vs CPU rel L2 %.2e, worst token %.2e%s\n", name,
		       step ? "decode" : "prompt", n, rel, worst, inexact ? ", ONE-KEY ROWS INEXACT" : "");
		CHECK_MSG(!nan && rel <= tol && worst <= ttol && !inexact, "%s %s step: rel %.3g (tol %.0e), token %.3g, "
		          "%d one-key outputs not exact%s", name, step ? "decode" : "prompt", rel, tol, worst, inexact,
		          nan ? ", NaN" : "");
	}
	CK(cudaFree(dq));
	CK(cudaFree(dk));
	CK(cudaFree(dv));
	CK(cudaFree(dout));
	CK(cudaFree(dsinks));
	cpu->destroy(cpu);
	gpu->destroy(gpu);
}

static void fp8_checks(const char *filter)
{
	if (!filter || strstr("E4M3 fp8 codec", filter))
		fp8_codec_checks();
	for (int kv = FP4S_KV_BF16; kv <= FP4S_KV_FP8; kv++) {
		/* GQA at the three geometries (sinks and the window in gpt-oss), one-key sequences,
		 * prompts on and off 16/64 boundaries; G = 16 (the generic kernel); a batch of 64 */
		backend_case("llama3-8b", 32, 8, 128, 0, 0, {300, 1, 40, 17, 129, 1, 2}, kv, filter);
		backend_case("gpt-oss", 64, 8, 64, 0, 1, {200, 1, 65, 16}, kv, filter);
		backend_case("gpt-oss-swa", 64, 8, 64, 128, 1, {700, 130, 1, 33}, kv, filter);
		backend_case("qwen3-moe", 32, 4, 128, 0, 0, {1000, 1, 64}, kv, filter);
		backend_case("g16", 32, 2, 64, 0, 0, {90, 1, 20}, kv, filter);
		std::vector<int> many;
		for (int i = 0; i < 64; i++)
			many.push_back(1 + (int)(t_rand_u64() % 300));
		backend_case("llama3-8b", 32, 8, 128, 0, 0, many, kv, filter);
	}
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
	setvbuf(stdout, NULL, _IOLBF, 0); /* a run cut off by a time limit still shows how far it got */
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
	/* the FP8 cache's encoder, decoder and the backends' attention ops */
	fp8_checks(filter);
	/* decode at every context class, every cache type, the engine's split counts */
	for (const geo &g : main_geos)
		for (int kv = 0; kv <= 2; kv++) {
			const int lens[] = {1, 2, 15, 16, 17, 33, 100, 129, 513, 4096, 5003};
			for (int l : lens) {
				const int splits = l % 3 == 0 ? 7 : 128;
				run_case({g.name, g.nh, g.nkv, g.d, kv, g.window, g.sinks, decode({l}), splits, dflt, 0, 1.0},
				         filter);
			}
			/* a batch of decodes of different lengths; prefill chunks mixed with decodes */
			run_case({g.name, g.nh, g.nkv, g.d, kv, g.window, g.sinks, random_decode(9, 6000), 14, dflt, 0, 1.0},
			         filter);
			run_case({g.name, g.nh, g.nkv, g.d, kv, g.window, g.sinks,
			          {{40, 40}, {316, 17}, {1, 1}, {77, 1}, {2100, 3}, {18, 1}}, 2, dflt, 0, 2.0},
			         filter);
			/* sharper softmax: q x 4 */
			run_case({g.name, g.nh, g.nkv, g.d, kv, g.window, g.sinks, decode({1000, 37}), 128, dflt, 0, 4.0},
			         filter);
		}
	/* batch 64 decode (the engine's split count for it is 1 or 2) and a 300-token prefill, BF16
	 * and FP8 */
	for (int kv = 1; kv <= 2; kv++) {
		run_case({"llama3-8b", 32, 8, 128, kv, 0, 0, random_decode(64, 3000), 2, dflt, 0, 1.0}, filter);
		run_case({"gpt-oss-swa", 64, 8, 64, kv, 128, 1, random_decode(64, 3000), 2, dflt, 0, 1.0}, filter);
		run_case({"qwen3-moe", 32, 4, 128, kv, 0, 0, {{300, 300}}, 1, dflt, 0, 1.0}, filter);
		run_case({"gpt-oss", 64, 8, 64, kv, 0, 1, {{300, 300}, {20, 1}}, 1, dflt, 0, 1.0}, filter);
	}
	/* the fused decode prologue (fp4s_cuda_attention_fused): RoPE, Qwen3's q/k norm, partial
	 * rotary, the KV write by the reading block; one token and batches, graph replay */
	for (int kv = 1; kv <= 2; kv++)
		for (const geo &g : main_geos) {
			const int pro = strcmp(g.name, "qwen3-moe") == 0 ? 2 : 1;
			const int lens[] = {1, 2, 16, 17, 100, 4096};
			for (int l : lens)
				run_case({g.name, g.nh, g.nkv, g.d, kv, g.window, g.sinks, decode({l}), 128, dflt, 0, 1.0, pro, g.d},
				         filter);
			run_case({g.name, g.nh, g.nkv, g.d, kv, g.window, g.sinks, decode({300}), 128, dflt, 0, 1.0, 3 - pro,
			          g.d / 2},
			         filter);
			run_case({g.name, g.nh, g.nkv, g.d, kv, g.window, g.sinks, random_decode(9, 3000), 14, dflt, 1, 1.0, pro,
			          g.d},
			         filter);
			run_case({g.name, g.nh, g.nkv, g.d, kv, g.window, g.sinks, decode({1000}), 128, dflt, 1, 1.0, pro, g.d},
			         filter);
			/* tiles straight into registers (the writer's row then comes from registers too) and
			 * the ring, whichever FP4S_ATTN_STAGES makes the default */
			for (int st = 1; st <= 3; st += 2) {
				const fp4s_attn_tune t = {0, 0, 0, 0, 0, st};
				for (int l : {2, 17, 4096})
					run_case({g.name, g.nh, g.nkv, g.d, kv, g.window, g.sinks, decode({l}), 128, t, 0, 1.0, pro, g.d},
					         filter);
				run_case({g.name, g.nh, g.nkv, g.d, kv, g.window, g.sinks, random_decode(9, 3000), 14, t, 1, 1.0, pro,
				          g.d},
				         filter);
			}
		}
	/* other geometries: the generic path (G > 8, d 16/32/256, FP32) and G = 1, 2, 3 */
	for (const geo &g : other_geos)
		for (int kv = 0; kv <= 2; kv++) {
			run_case({g.name, g.nh, g.nkv, g.d, kv, g.window, g.sinks, decode({1, 31, 700}), 128, dflt, 0, 1.0},
			         filter);
			run_case({g.name, g.nh, g.nkv, g.d, kv, g.window, g.sinks, {{50, 20}, {5200, 1}, {3, 1}}, 3, dflt, 0, 1.0},
			         filter);
		}
	/* every tuning of the tensor-core kernel (FP8: every other one, each shape twice) */
	for (int w = 2; w <= 8; w *= 2)
		for (int bps = 1; bps <= 8; bps *= 2)
			for (int uf = 0; uf <= 1; uf++)
				for (int kv = 1; kv <= 2; kv++) {
					if (kv == 2 && (bps + uf) % 2)
						continue;
					const fp4s_attn_tune t = {w, bps, (w + bps + uf) % 3 == 0 ? 1 : 0, uf, 0, 1 + (w + bps + uf) % 4};
					run_case({"llama3-8b", 32, 8, 128, kv, 0, 0, decode({4096, 17, 1500}), 128, t, 0, 1.0}, filter);
					run_case({"gpt-oss-swa", 64, 8, 64, kv, 128, 1, decode({4000, 130}), 128, t, 0, 1.0}, filter);
					run_case({"gpt-oss", 64, 8, 64, kv, 0, 1, decode({6000, 1}), 64, t, 0, 1.0}, filter);
				}
	/* the generic kernel forced on the main geometries */
	for (int kv = 1; kv <= 2; kv++) {
		const fp4s_attn_tune t = {0, 0, 0, 0, 1, 0};
		run_case({"llama3-8b", 32, 8, 128, kv, 0, 0, decode({4096, 200}), 128, t, 0, 1.0}, filter);
		run_case({"gpt-oss-swa", 64, 8, 64, kv, 128, 1, decode({999}), 128, t, 0, 1.0}, filter);
	}
	/* more tokens x KV heads than the counters: the separate merge kernel by default */
	for (int kv = 1; kv <= 2; kv++) {
		const fp4s_attn_tune t = {4, 400, 1, 0, 0, 0};
		run_case({"many", 8, 8, 64, kv, 0, 1, random_decode(1100, 200), 4, t, 0, 1.0}, filter);
		run_case({"many", 8, 8, 64, kv, 0, 1, random_decode(1100, 200), 1, dflt, 0, 1.0}, filter);
	}
	/* graphs: captured once, replayed with new positions, slots and tables (the counters too) */
	for (int kv = 1; kv <= 2; kv++) {
		run_case({"llama3-8b", 32, 8, 128, kv, 0, 0, decode({3000}), 128, dflt, 1, 1.0}, filter);
		run_case({"gpt-oss", 64, 8, 64, kv, 0, 1, random_decode(5, 2000), 16, dflt, 1, 1.0}, filter);
		run_case({"gpt-oss-swa", 64, 8, 64, kv, 128, 1, random_decode(3, 500), 128, dflt, 1, 1.0}, filter);
	}
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
		CHECK(fp4s_cuda_attention(d, d, d, 3, (int32_t *)d, (int32_t *)d, (int32_t *)d, 1, 1, 8, 8, 64, 0, NULL,
		                          1.0f, 1, d, d, 0, &err) == FP4S_EINVAL); /* no such KV type */
		CK(cudaFree(d));
	}
	printf("worst relative L2: tensor-core path %.3g (FP8 cache %.3g), generic path %.3g (FP8 cache %.3g)\n",
	       worst_mma, worst_mma8, worst_generic, worst_generic8);
	return TEST_DONE();
}
