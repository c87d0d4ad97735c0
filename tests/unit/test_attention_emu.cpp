// test_attention_emu.cpp: runs the tensor-core decode attention of
// src/backend/cuda/attention_mma.cuh (BF16 and FP8 E4M3 caches) on the CPU, one host thread per
// GPU thread, with the warp primitives (mma.sync m16n8k16 in its documented fragment layouts,
// shuffles, barriers, byte permutes, the E4M3 -> BF16 conversion) emulated, and compares it with
// an exact double-precision attention over the cache's values. It checks the kernel's indexing
// (fragment layouts, the permuted k orders, masking, the block and split merges, FP8 pieces)
// where no GPU is, so CI covers it; tests/ops/test_attention.cu checks the real thing.
#include <atomic>
#include <condition_variable>
#include <math.h>
#include <mutex>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "numerics/numerics.h"
#include "test_util.h"

#define FP4S_ATTN_EMU 1
#define ATT_DEV static inline
#define ATT_HD static inline

struct att_u4 {
	uint32_t x, y, z, w;
};
struct att_u2 {
	uint32_t x, y;
};
struct float4 {
	float x, y, z, w;
};
struct float2 {
	float x, y;
};

namespace {

class barrier {
public:
	explicit barrier(int n) : n_(n) {}
	void wait()
	{
		std::unique_lock<std::mutex> lk(mu_);
		const unsigned gen = gen_;
		if (++count_ == n_) {
			count_ = 0;
			gen_++;
			cv_.notify_all();
		} else {
			cv_.wait(lk, [&] { return gen != gen_; });
		}
	}

private:
	std::mutex mu_;
	std::condition_variable cv_;
	int n_, count_ = 0;
	unsigned gen_ = 0;
};

struct emu_block {
	explicit emu_block(int nwarps) : block(nwarps * 32)
	{
		for (int w = 0; w < nwarps; w++)
			warp.push_back(new barrier(32));
	}
	~emu_block()
	{
		for (barrier *b : warp)
			delete b;
	}
	barrier block;
	std::vector<barrier *> warp;
	float xchg[8][32];
	uint32_t a[8][32][4], b[8][32][2];
};

emu_block *emu_cur;
thread_local int emu_tid;

float bf16_half(uint32_t v, int hi) { return fp4s_bf16_to_f32((uint16_t)(hi ? v >> 16 : v & 0xFFFF)); }

} // namespace

/* the copy lands at once: waits have nothing to wait for */
ATT_DEV void att_cp16(att_u4 *dst, const uint16_t *src) { memcpy(dst, src, 16); }
ATT_DEV att_u4 att_ld16(const uint16_t *p)
{
	att_u4 r;
	memcpy(&r, p, 16);
	return r;
}
ATT_DEV void att_cp8(att_u2 *dst, const uint8_t *src) { memcpy(dst, src, 8); }
ATT_DEV att_u2 att_ld8(const uint8_t *p)
{
	att_u2 r;
	memcpy(&r, p, 8);
	return r;
}
/* the CPU's decoder, then BF16 (exact for every E4M3 value) */
ATT_DEV uint32_t att_e4m3x2(uint32_t two)
{
	return fp4s_f32_to_bf16(fp4s_e4m3_to_f32(two & 0xFF)) |
	       (uint32_t)fp4s_f32_to_bf16(fp4s_e4m3_to_f32((two >> 8) & 0xFF)) << 16;
}
ATT_DEV void att_cp_commit(void) {}
ATT_DEV void att_cp_wait_all(void) {}
ATT_DEV void att_mark(void *, int) {}
ATT_DEV void att_cp_wait(int n) {}

/* d += A B with A 16x16 (a0..a3: rows g / g + 8, k 2c.. / 2c + 8..), B 16x8 (b0, b1: k 2c.. /
 * 2c + 8.., column g), C rows g / g + 8, columns 2c, 2c + 1 (PTX ISA, mma.m16n8k16 .bf16) */
ATT_DEV void att_mma(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1)
{
	const int w = emu_tid >> 5, lane = emu_tid & 31;
	emu_block *e = emu_cur;
	e->a[w][lane][0] = a0, e->a[w][lane][1] = a1, e->a[w][lane][2] = a2, e->a[w][lane][3] = a3;
	e->b[w][lane][0] = b0, e->b[w][lane][1] = b1;
	e->warp[w]->wait();
	for (int k = 0; k < 4; k++) {
		const int row = (lane >> 2) + (k >= 2 ? 8 : 0), col = 2 * (lane & 3) + (k & 1);
		float acc = 0.0f;
		for (int kk = 0; kk < 16; kk++) {
			const int al = (row % 8) * 4 + (kk % 8) / 2, ar = (row >= 8 ? 1 : 0) + (kk >= 8 ? 2 : 0);
			const int bl = col * 4 + (kk % 8) / 2, br = kk >= 8 ? 1 : 0;
			acc += bf16_half(e->a[w][al][ar], kk & 1) * bf16_half(e->b[w][bl][br], kk & 1);
		}
		d[k] += acc;
	}
	e->warp[w]->wait();
}

ATT_DEV float att_shfl_xor(float v, int m)
{
	const int w = emu_tid >> 5, lane = emu_tid & 31;
	emu_cur->xchg[w][lane] = v;
	emu_cur->warp[w]->wait();
	const float r = emu_cur->xchg[w][lane ^ m];
	emu_cur->warp[w]->wait();
	return r;
}

ATT_DEV void att_sync(void) { emu_cur->block.wait(); }
ATT_DEV float att_ex2(float x) { return exp2f(x); }
ATT_DEV uint32_t att_prmt(uint32_t a, uint32_t b, uint32_t s)
{
	const uint64_t x = ((uint64_t)b << 32) | a;
	uint32_t r = 0;
	for (int i = 0; i < 4; i++)
		r |= (uint32_t)((x >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
	return r;
}
ATT_DEV uint32_t att_pack(float lo, float hi) { return fp4s_f32_to_bf16(lo) | (uint32_t)fp4s_f32_to_bf16(hi) << 16; }
ATT_DEV float att_lo_f(uint32_t v) { return fp4s_bits_f32(v << 16); }
ATT_DEV float att_hi_f(uint32_t v) { return fp4s_bits_f32(v & 0xFFFF0000u); }
ATT_DEV float att_ldcg(const float *p) { return *(volatile const float *)p; }
ATT_DEV float4 att_ldcg4(const float *p)
{
	float4 v;
	memcpy(&v, (const void *)p, 16);
	return v;
}
ATT_DEV float2 att_ldcg2(const float *p)
{
	float2 v;
	memcpy(&v, (const void *)p, 8);
	return v;
}
ATT_DEV void att_fence(void) { std::atomic_thread_fence(std::memory_order_seq_cst); }
ATT_DEV unsigned att_atomic_inc(unsigned *p) { return __atomic_fetch_add(p, 1u, __ATOMIC_SEQ_CST); }
ATT_DEV unsigned att_atomic_inc_ar(unsigned *p) { return __atomic_fetch_add(p, 1u, __ATOMIC_SEQ_CST); }
ATT_DEV void att_grid_wait(void) {}
ATT_DEV void att_grid_trigger(void) {}
ATT_DEV void att_kv_put(uint16_t *p, float x) { *p = fp4s_f32_to_bf16(x); }
ATT_DEV void att_kv_put(uint8_t *p, float x) { *p = fp4s_f32_to_e4m3(x); }

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunknown-pragmas"
#include "backend/cuda/attention_mma.cuh"
#pragma GCC diagnostic pop

namespace {

struct ecase {
	int nh, nkv, d, window, sinks, warps, min_tiles, fused, stages;
	int splits;
	std::vector<int> seqlen; /* tokens: one per sequence, at position seqlen - 1 */
	int fp8;                 /* the cache holds E4M3 bytes */
	int pro;                 /* the fused prologue: 1 = RoPE of rot dims, 2 = q/k RMSNorm too */
	int rot;
	int oldmerge;            /* the forms before att_merge_regs and kpatch (late) */
};

template <int D, int W, bool F8>
void emu_launch(const att_mma_args &a, int n, bool fused)
{
	for (int bx = 0; bx < n; bx++)
		for (int by = 0; by < a.nkv; by++)
			for (int bz = 0; bz < a.splits; bz++) {
				emu_block blk(W);
				emu_cur = &blk;
				/* garbage, as shared memory starts */
				std::vector<float4> sm((a.kraw ? att_smem_bytes_pro<D, W, F8>(a.stages) : att_smem_bytes<D, W, F8>(a.stages)) / 16 + 1);
				memset(sm.data(), 0xFF, sm.size() * 16);
				std::vector<std::thread> th;
				for (int t = 0; t < 32 * W; t++)
					th.emplace_back([&, t] {
						emu_tid = t;
						if (a.stages > 1)
							att_mma_block<D, W, true, F8>(a, t, bx, by, bz, (unsigned char *)sm.data());
						else
							att_mma_block<D, W, false, F8>(a, t, bx, by, bz, (unsigned char *)sm.data());
					});
				for (auto &x : th)
					x.join();
			}
	if (fused)
		return;
	/* the merge kernel: 4 warps per (token, KV head) */
	for (int bx = 0; bx < n; bx++)
		for (int by = 0; by < a.nkv; by++) {
			const att_range r = att_range_of(a.pos[bx], a.window, a.splits, a.min_tiles);
			if (r.nact <= 1)
				continue;
			emu_block blk(8);
			emu_cur = &blk;
			static float wt[8][ATT_MERGE_MAX], wl[8][ATT_MERGE_MAX];
			static float4 red[256];
			const int G = a.nh / a.nkv;
			const float *part = a.work + ((size_t)bx * a.nkv + by) * a.region;
			std::vector<std::thread> th;
			for (int t = 0; t < 256; t++)
				th.emplace_back([&, t] {
					emu_tid = t;
					att_merge_group<D>(part, part + (size_t)a.splits * G * D, r.nact, G,
					                   a.sinks ? a.sinks + (size_t)by * G : nullptr,
					                   a.out + ((size_t)bx * a.nh + (size_t)by * G) * D, t, 256, wt, wl, red);
				});
			for (auto &x : th)
				x.join();
		}
}

int run_case(const ecase &c)
{
	const int n = (int)c.seqlen.size(), kvw = c.nkv * c.d, G = c.nh / c.nkv;
	int maxlen = 0;
	for (int L : c.seqlen)
		maxlen = L > maxlen ? L : maxlen;
	const int stride = (maxlen + FP4S_KV_BLOCK - 1) / FP4S_KV_BLOCK;
	const int nblocks = n * stride + 3;
	/* a shuffled pool: block ids scattered over the table */
	std::vector<int32_t> perm(nblocks), table((size_t)n * stride), pos(n), seq(n);
	for (int i = 0; i < nblocks; i++)
		perm[i] = i;
	for (int i = nblocks - 1; i > 0; i--)
		std::swap(perm[i], perm[t_rand_u64() % (i + 1)]);
	for (size_t i = 0; i < table.size(); i++)
		table[i] = perm[i];
	const size_t pool = (size_t)nblocks * FP4S_KV_BLOCK * kvw;
	/* the cache's values (kf, vf) and its bytes: BF16 (kc, vc) or E4M3 (k8, v8) */
	std::vector<uint16_t> kc(pool), vc(pool);
	std::vector<uint8_t> k8(pool), v8(pool);
	std::vector<float> kf(pool), vf(pool);
	for (size_t i = 0; i < pool; i++) {
		const float x = (float)t_rand_normal(), y = (float)t_rand_normal();
		kc[i] = fp4s_f32_to_bf16(x);
		vc[i] = fp4s_f32_to_bf16(y);
		k8[i] = fp4s_f32_to_e4m3(x);
		v8[i] = fp4s_f32_to_e4m3(y);
		kf[i] = c.fp8 ? fp4s_e4m3_to_f32(k8[i]) : fp4s_bf16_to_f32(kc[i]);
		vf[i] = c.fp8 ? fp4s_e4m3_to_f32(v8[i]) : fp4s_bf16_to_f32(vc[i]);
	}
	for (int s = 0; s < n; s++) {
		pos[s] = c.seqlen[s] - 1;
		seq[s] = s;
		/* rows past the last position of its block: NaN, which must never reach the output */
		for (int t = pos[s] + 1; t % FP4S_KV_BLOCK; t++) {
			const size_t row = (size_t)table[(size_t)s * stride + t / FP4S_KV_BLOCK] * FP4S_KV_BLOCK + t % FP4S_KV_BLOCK;
			for (int j = 0; j < kvw; j++) {
				kc[row * kvw + j] = vc[row * kvw + j] = 0x7FC0;
				k8[row * kvw + j] = v8[row * kvw + j] = 0x7F;
			}
		}
	}
	std::vector<float> q((size_t)n * c.nh * c.d), sinks(c.nh), out((size_t)n * c.nh * c.d, NAN);
	for (auto &x : q)
		x = (float)(t_rand_normal() * 1.5);
	/* the fused prologue: raw q, k, v of each token; its own row of the cache starts as NaN and
	 * must be written by the kernel */
	std::vector<float> kraw((size_t)n * kvw), vraw((size_t)n * kvw), qn(c.d), kn(c.d), inv_freq(c.d / 2 + 1);
	const float mscale = 1.125f, eps = 1e-6f;
	if (c.pro) {
		for (auto &x : kraw)
			x = (float)t_rand_normal();
		for (auto &x : vraw)
			x = (float)t_rand_normal();
		for (int j = 0; j < c.d; j++) {
			qn[j] = (float)(0.5 + t_rand_uniform());
			kn[j] = (float)(0.5 + t_rand_uniform());
		}
		for (int j = 0; j < c.rot / 2; j++)
			inv_freq[j] = powf(10000.0f, -2.0f * (float)j / (float)c.rot);
		for (int s = 0; s < n; s++) {
			const size_t row = (size_t)table[(size_t)s * stride + pos[s] / FP4S_KV_BLOCK] * FP4S_KV_BLOCK + pos[s] % FP4S_KV_BLOCK;
			for (int j = 0; j < kvw; j++) {
				kc[row * kvw + j] = vc[row * kvw + j] = 0x7FC0;
				k8[row * kvw + j] = v8[row * kvw + j] = 0x7F;
			}
		}
	}
	/* the prologue's float math on the host: per-head RMSNorm (c.pro == 2), then RoPE */
	auto prep = [&](float *x, const float *w) {
		if (c.pro == 2) {
			float ss = 0.0f;
			for (int j = 0; j < c.d; j++)
				ss += x[j] * x[j];
			const float inv = 1.0f / sqrtf(ss / (float)c.d + eps);
			for (int j = 0; j < c.d; j++)
				x[j] = x[j] * inv * w[j];
		}
		return x;
	};
	auto rope = [&](float *x, int p) {
		for (int j = 0; j < c.rot / 2; j++) {
			const float ang = (float)p * inv_freq[j], cs = cosf(ang) * mscale, sn = sinf(ang) * mscale;
			const float x1 = x[j], x2 = x[j + c.rot / 2];
			x[j] = x1 * cs - x2 * sn;
			x[j + c.rot / 2] = x2 * cs + x1 * sn;
		}
	};
	std::vector<float> qref = q;
	for (auto &x : sinks)
		x = (float)(t_rand_normal() * 2.0);
	const float scale = 1.0f / sqrtf((float)c.d);
	const int region = (c.splits * G * (c.d + 2) + 3) & ~3;
	std::vector<float> work((size_t)n * c.nkv * region, NAN);
	std::vector<unsigned> counters((size_t)n * c.nkv, 0u);

	att_mma_args a{};
	a.q = q.data();
	a.kc = c.fp8 ? (const void *)k8.data() : (const void *)kc.data();
	a.vc = c.fp8 ? (const void *)v8.data() : (const void *)vc.data();
	a.pos = pos.data();
	a.seq = seq.data();
	a.table = table.data();
	a.table_stride = stride;
	a.nh = c.nh;
	a.nkv = c.nkv;
	a.window = c.window;
	a.splits = c.splits;
	a.min_tiles = c.min_tiles;
	a.stages = c.stages;
	a.region = region;
	a.sinks = c.sinks ? sinks.data() : nullptr;
	a.qscale = scale * ATT_LOG2E;
	a.work = work.data();
	a.out = out.data();
	a.counters = c.fused ? counters.data() : nullptr;
	a.oldmerge = c.oldmerge;
	a.late = c.oldmerge;
	a.kraw = a.vraw = nullptr;
	if (c.pro) {
		a.kraw = kraw.data();
		a.vraw = vraw.data();
		a.kw = c.fp8 ? (void *)k8.data() : (void *)kc.data();
		a.vw = c.fp8 ? (void *)v8.data() : (void *)vc.data();
		a.qn = c.pro == 2 ? qn.data() : nullptr;
		a.kn = c.pro == 2 ? kn.data() : nullptr;
		a.eps = eps;
		a.zero_centred = 0;
		a.rot = c.rot;
		a.inv_freq = inv_freq.data();
		a.mscale = mscale;
	}
	if (c.fp8 && c.d == 64)
		c.warps == 2 ? emu_launch<64, 2, true>(a, n, c.fused) : c.warps == 4 ? emu_launch<64, 4, true>(a, n, c.fused)
		                                                                     : emu_launch<64, 8, true>(a, n, c.fused);
	else if (c.fp8)
		c.warps == 2 ? emu_launch<128, 2, true>(a, n, c.fused) : c.warps == 4 ? emu_launch<128, 4, true>(a, n, c.fused)
		                                                                       : emu_launch<128, 8, true>(a, n, c.fused);
	else if (c.d == 64)
		c.warps == 2 ? emu_launch<64, 2, false>(a, n, c.fused) : c.warps == 4 ? emu_launch<64, 4, false>(a, n, c.fused)
		                                                                       : emu_launch<64, 8, false>(a, n, c.fused);
	else
		c.warps == 2 ? emu_launch<128, 2, false>(a, n, c.fused) : c.warps == 4 ? emu_launch<128, 4, false>(a, n, c.fused)
		                                                                        : emu_launch<128, 8, false>(a, n, c.fused);

	int bad = 0;
	if (c.pro) {
		/* q as the prologue leaves it; the token's own row: written, and within BF16 / E4M3
		 * rounding of the host's k and v (the reference then reads what was written) */
		int bad_rows = 0;
		for (int i = 0; i < n; i++) {
			for (int h = 0; h < c.nh; h++)
				rope(prep(&qref[((size_t)i * c.nh + h) * c.d], qn.data()), pos[i]);
			const size_t row = (size_t)table[(size_t)i * stride + pos[i] / FP4S_KV_BLOCK] * FP4S_KV_BLOCK + pos[i] % FP4S_KV_BLOCK;
			for (int g0 = 0; g0 < c.nkv; g0++) {
				float *kh = &kraw[(size_t)i * kvw + g0 * c.d];
				rope(prep(kh, kn.data()), pos[i]);
				for (int j = 0; j < c.d; j++) {
					const size_t at = row * kvw + g0 * c.d + j;
					kf[at] = c.fp8 ? fp4s_e4m3_to_f32(k8[at]) : fp4s_bf16_to_f32(kc[at]);
					vf[at] = c.fp8 ? fp4s_e4m3_to_f32(v8[at]) : fp4s_bf16_to_f32(vc[at]);
					const float tol = c.fp8 ? 0.07f : 0.008f;
					const float wk = kh[j], wv = vraw[(size_t)i * kvw + g0 * c.d + j];
					if (!(fabsf(kf[at] - wk) <= tol * fabsf(wk) + 1e-3f) || !(fabsf(vf[at] - wv) <= tol * fabsf(wv) + 1e-3f))
						bad_rows++;
				}
			}
		}
		CHECK_MSG(bad_rows == 0, "%d values of the written rows differ from the host's", bad_rows);
	}
	double num = 0, den = 0;
	for (int i = 0; i < n; i++)
		for (int h = 0; h < c.nh; h++) {
			const int p = pos[i], g0 = h / G;
			const int start = c.window > 0 && p - c.window + 1 > 0 ? p - c.window + 1 : 0;
			std::vector<double> s(p + 1);
			double m = c.sinks ? sinks[h] : -INFINITY;
			for (int t = start; t <= p; t++) {
				const size_t row = (size_t)table[(size_t)i * stride + t / FP4S_KV_BLOCK] * FP4S_KV_BLOCK + t % FP4S_KV_BLOCK;
				double acc = 0;
				for (int j = 0; j < c.d; j++)
					acc += (double)qref[((size_t)i * c.nh + h) * c.d + j] * kf[row * kvw + g0 * c.d + j];
				s[t] = acc * scale;
				m = s[t] > m ? s[t] : m;
			}
			double l = c.sinks ? exp(sinks[h] - m) : 0;
			for (int t = start; t <= p; t++)
				l += exp(s[t] - m);
			for (int j = 0; j < c.d; j++) {
				double o = 0;
				for (int t = start; t <= p; t++) {
					const size_t row = (size_t)table[(size_t)i * stride + t / FP4S_KV_BLOCK] * FP4S_KV_BLOCK + t % FP4S_KV_BLOCK;
					o += exp(s[t] - m) / l * vf[row * kvw + g0 * c.d + j];
				}
				const float got = out[((size_t)i * c.nh + h) * c.d + j];
				if (isnan(got))
					bad++;
				num += (got - o) * (got - o);
				den += o * o;
			}
		}
	const double rel = sqrt(num / den);
	printf("emu %s nh=%d nkv=%d d=%d window=%d sinks=%d warps=%d min_tiles=%d stages=%d splits=%d %s n=%d%s: rel L2 %.3g%s\n",
	       c.fp8 ? "fp8" : "bf16", c.nh, c.nkv, c.d, c.window, c.sinks, c.warps, c.min_tiles, c.stages, c.splits,
	       c.fused ? "fused" : "merge-kernel", n, c.pro == 2 ? " norm+rope+write" : c.pro ? " rope+write" : "", rel,
	       bad ? " NaN!" : "");
	CHECK_MSG(!bad && rel <= 1e-5, "rel L2 %.3g, %d NaN", rel, bad);
	for (unsigned v : counters)
		CHECK_EQ_INT(v, 0);
	return 0;
}

} // namespace

int main(void)
{
	t_seed_from_env();
	/* nh, nkv, d, window, sinks, warps, min_tiles, fused, stages, splits, sequence lengths */
	run_case({8, 2, 64, 0, 0, 2, 1, 1, 2, 3, {1, 17, 40}});
	run_case({16, 2, 64, 0, 1, 4, 1, 0, 3, 4, {33, 5, 70}});
	run_case({8, 2, 128, 0, 0, 2, 2, 1, 4, 2, {64, 16, 95}});
	run_case({6, 2, 128, 23, 1, 2, 1, 1, 3, 3, {60, 23, 24, 9}});
	run_case({16, 2, 64, 20, 1, 4, 1, 0, 2, 5, {81, 19}});
	run_case({4, 4, 128, 0, 1, 4, 1, 1, 3, 1, {50}});
	run_case({24, 8, 128, 0, 1, 8, 1, 1, 3, 3, {180, 33}});
	run_case({5, 1, 64, 0, 0, 2, 1, 1, 4, 7, {150}});
	/* stages 1: tiles straight into registers */
	run_case({8, 2, 64, 0, 1, 2, 1, 1, 1, 3, {1, 17, 100}});
	run_case({16, 2, 128, 30, 1, 4, 1, 0, 1, 4, {33, 5, 120}});
	run_case({8, 8, 64, 0, 0, 4, 2, 1, 1, 2, {64, 16, 95}});
	run_case({32, 8, 128, 0, 0, 4, 1, 1, 1, 1, {70}});
	/* FP8 (E4M3) cache: ring and registers, both head dims, windows, sinks, both merges */
	run_case({8, 2, 64, 0, 0, 2, 1, 1, 2, 3, {1, 17, 40}, 1});
	run_case({16, 2, 64, 20, 1, 4, 1, 0, 3, 5, {81, 19}, 1});
	run_case({6, 2, 128, 23, 1, 2, 1, 1, 3, 3, {60, 23, 24, 9}, 1});
	run_case({24, 8, 128, 0, 1, 8, 1, 1, 3, 3, {180, 33}, 1});
	run_case({8, 2, 64, 0, 1, 2, 1, 1, 1, 3, {1, 17, 100}, 1});
	run_case({16, 2, 128, 30, 1, 4, 1, 0, 1, 4, {33, 5, 120}, 1});
	run_case({32, 8, 128, 0, 0, 4, 1, 1, 1, 1, {70}, 1});
	/* the fused decode prologue (RoPE, q/k RMSNorm, the token's row written by the block that
	 * reads it): positions at the start, the end and inside a tile, partial rotary, windows,
	 * sinks, both caches, ring and registers */
	run_case({8, 2, 128, 0, 0, 4, 1, 1, 3, 3, {1, 17, 40}, 0, 1, 128});
	run_case({8, 2, 128, 0, 1, 2, 1, 1, 2, 4, {16, 33, 90}, 0, 2, 128});
	run_case({16, 2, 64, 20, 1, 4, 1, 0, 3, 5, {81, 19}, 0, 2, 32});
	run_case({8, 1, 64, 0, 1, 8, 1, 1, 3, 3, {65, 2}, 1, 1, 64});
	run_case({6, 2, 128, 23, 0, 2, 1, 1, 3, 3, {60, 23, 24, 9}, 1, 2, 64});
	run_case({8, 2, 64, 0, 1, 2, 1, 1, 1, 3, {1, 17, 100}, 0, 1, 64});
	/* the writer's row taken from registers on the register path too, with q/k norm and FP8;
	 * more splits than a thread's share of the fast merge holds in one pass (then the merge of
	 * the separate kernel's form), and the fast merge's predecessor */
	run_case({8, 2, 128, 0, 1, 8, 1, 1, 1, 4, {16, 33, 90}, 1, 2, 128});
	run_case({16, 2, 64, 0, 0, 2, 1, 1, 1, 40, {700, 650}, 0, 1, 64});
	run_case({16, 2, 128, 0, 0, 8, 1, 1, 1, 64, {1300}, 0, 1, 128});
	run_case({8, 2, 128, 0, 1, 4, 1, 1, 3, 4, {16, 33, 90}, 0, 2, 128, 1});
	run_case({24, 8, 128, 0, 1, 8, 1, 1, 3, 3, {180, 33}, 1, 0, 0, 1});
	return TEST_DONE();
}
