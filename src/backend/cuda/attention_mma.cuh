/* attention_mma.cuh: decode attention over a BF16 paged KV cache on the tensor cores (mma.sync
 * m16n8k16, BF16 in, FP32 accumulate), for head_dim D = 64 or 128 and up to 8 query heads per
 * KV head. Included by attention.cu; written against a handful of primitives (att_ld16, att_mma,
 * att_shfl_xor, att_sync, ...) so that a host emulator (tests/unit/test_attention_emu.cpp) can
 * run this very code with one host thread per GPU thread.
 *
 * One block = one (token, KV head, split) of W warps. A split is a range of whole KV blocks
 * (FP4S_KV_BLOCK = 16 positions: one "tile"); warp w takes tiles w, w + W, ... of it. Per tile:
 *
 *   S = Q K^T   M = 16 rows: rows 0-7 the G <= 8 heads' scaled q rounded to BF16 (hi), rows
 *               8-15 the BF16 residual q - hi (lo); N = 8 keys (two n-tiles per tile); K = the
 *               dims. Score = row g + row g + 8: q is carried to ~16 bits, K is exact in BF16.
 *               A lane (g, c) = (lane / 4, lane % 4) supplies, as the B operand, 16-byte loads of
 *               key row g (n-tile 0) and 8 + g (n-tile 1), dims [32j + 8c, 32j + 8c + 8): the
 *               mma's k order is a permutation of the dims, and q's A fragment uses the same one.
 *   softmax     online, per head, in log2 units (q carries scale * log2(e)); a quad of lanes
 *               holds one head's 16 scores.
 *   O += P V    M = rows 0-7 P rounded to BF16, rows 8-15 its residual (same trick); K = the 16
 *               keys; N = 8 dims. The score C fragment is already P's A fragment. V's B fragment
 *               needs two keys of one dim per register: lane (g, c) loads rows 2c, 2c+1, 2c+8,
 *               2c+9 at dims [64h + 8g, 64h + 8g + 8) and pairs them with byte permutes; n-tile
 *               (h, t) then holds dims 64h + 8n + t, so lane (g, c) ends with head g's dims
 *               [64h + 16c, 64h + 16c + 16) in its accumulators (rows g and g + 8 summed).
 *
 * Per tile a warp issues d/16 + d/16 16-byte loads per lane for K and V (the whole tile, 2 x 16 x
 * d x 2 bytes), 2d/16 + d/8 mma; the next tile's K is loaded as soon as the scores are out of
 * the K registers and its V once P.V is done, so a warp always has about a tile in flight.
 * Keys outside [start, pos] in the first and last tile score -inf and their V rows are zeroed
 * (the pool may hold anything there, NaN included). The warps of a block merge through shared
 * memory; a block with the whole range writes the output, otherwise it leaves (max, sum,
 * unnormalized output) per head and the last block of the (token, KV head) to finish, found by
 * an atomic counter, merges them (or a separate merge kernel does, see attention.cu). */
#ifndef FP4S_ATTENTION_MMA_CUH
#define FP4S_ATTENTION_MMA_CUH

#include <stdint.h>

#ifndef FP4S_ATTN_EMU
#include <cuda_bf16.h>

#define ATT_DEV static __device__ __forceinline__

struct att_u4 {
	uint32_t x, y, z, w;
};

/* 16 bytes of the cache: read once per step, keep it out of L1 */
ATT_DEV att_u4 att_ld16(const uint16_t *p)
{
	att_u4 r;
	asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
	             : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
	             : "l"(p));
	return r;
}

/* d += A B, A 16x16 row-major, B 16x8 column-major, BF16 in, FP32 accumulate */
ATT_DEV void att_mma(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1)
{
	asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
	    "{%8, %9}, {%0, %1, %2, %3};"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

ATT_DEV float att_shfl_xor(float v, int m) { return __shfl_xor_sync(0xFFFFFFFFu, v, m); }
ATT_DEV void att_sync(void) { __syncthreads(); }
ATT_DEV float att_ex2(float x) { return exp2f(x); }
ATT_DEV uint32_t att_prmt(uint32_t a, uint32_t b, uint32_t s) { return __byte_perm(a, b, s); }
/* (lo, hi) rounded to BF16 (RNE) in one register, lo in the low half */
ATT_DEV uint32_t att_pack(float lo, float hi)
{
	__nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
	return *(uint32_t *)&v;
}
ATT_DEV float att_lo_f(uint32_t v) { return __uint_as_float(v << 16); }
ATT_DEV float att_hi_f(uint32_t v) { return __uint_as_float(v & 0xFFFF0000u); }
ATT_DEV float att_ldcg(const float *p) { return __ldcg(p); }
ATT_DEV void att_fence(void) { __threadfence(); }
ATT_DEV unsigned att_atomic_inc(unsigned *p) { return atomicAdd(p, 1u); }
#endif

struct att_mma_args {
	const float *q;           /* [n][nh * D], FP32, pre-RoPE'd */
	const uint16_t *kc, *vc;  /* the layer's pool, BF16 [blocks][16][nkv * D] */
	const int32_t *pos, *seq, *table;
	int32_t table_stride, nh, nkv, window;
	int32_t splits;           /* blocks per (token, KV head) in the grid */
	int32_t min_tiles;        /* fewest tiles per block */
	const float *sinks;       /* [nh] natural-log logits, or NULL */
	float qscale;             /* scale * log2(e) */
	float *work;              /* [n][nkv][splits][G][D + 2] partials: max (log2), sum, output */
	float *out;               /* [n][nh * D] */
	unsigned *counters;       /* [n * nkv], zero between calls; NULL: the merge kernel merges */
};

#define ATT_LOG2E 1.4426950408889634f
#define ATT_MERGE_MAX 128 /* most splits a merge handles (the host caps the grid) */

/* A token's keys [start, p] as KV blocks [b_lo, b_lo + nb), cut into chunks of per >= min_tiles
 * blocks; nact chunks are non-empty. Every block and the merge derive the same numbers. */
struct att_range {
	int32_t start, b_lo, nb, per, nact;
};

ATT_DEV att_range att_range_of(int32_t p, int32_t window, int32_t splits, int32_t min_tiles)
{
	att_range r;
	r.start = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
	r.b_lo = r.start / FP4S_KV_BLOCK;
	r.nb = p / FP4S_KV_BLOCK - r.b_lo + 1;
	r.per = (r.nb + splits - 1) / splits;
	if (r.per < min_tiles)
		r.per = min_tiles;
	r.nact = (r.nb + r.per - 1) / r.per;
	return r;
}

template <int D, int W>
struct att_mma_smem {
	float m[W][8], l[W][8];
	float o[W][8][D];
	float wt[8][ATT_MERGE_MAX];
	int last;
};

/* Merges the nact partials of one (token, KV head): part points at split 0's head 0, stride
 * G * (D + 2) floats per split; out at the group's first head. nthr threads, wt >= G x nact. */
template <int D>
ATT_DEV void att_merge_group(const float *part, int32_t nact, int32_t G, const float *sinks, float *out,
                             int tid, int nthr, float (*wt)[ATT_MERGE_MAX])
{
	const size_t stride = (size_t)G * (D + 2);
	const int lane = tid & 31, warp = tid >> 5, nw = nthr >> 5;
	for (int32_t g = warp; g < G; g += nw) {
		float mx = sinks ? sinks[g] * ATT_LOG2E : -INFINITY;
		for (int32_t s = lane; s < nact; s += 32)
			mx = fmaxf(mx, att_ldcg(part + s * stride + (size_t)g * (D + 2)));
		for (int o = 16; o > 0; o >>= 1)
			mx = fmaxf(mx, att_shfl_xor(mx, o));
		float l = 0.0f;
		for (int32_t s = lane; s < nact; s += 32) {
			const float *w = part + s * stride + (size_t)g * (D + 2);
			const float ms = att_ldcg(w);
			const float f = ms == -INFINITY ? 0.0f : att_ex2(ms - mx);
			wt[g][s] = f;
			l += f * att_ldcg(w + 1);
		}
		for (int o = 16; o > 0; o >>= 1)
			l += att_shfl_xor(l, o);
		if (sinks)
			l += att_ex2(sinks[g] * ATT_LOG2E - mx);
		const float inv = 1.0f / l;
		for (int32_t s = lane; s < nact; s += 32)
			wt[g][s] *= inv;
	}
	att_sync();
	for (int32_t x = tid; x < G * D; x += nthr) {
		const int32_t g = x / D, j = x - g * D;
		const float *w = part + (size_t)g * (D + 2) + 2 + j;
		float a0 = 0.0f, a1 = 0.0f;
		int32_t s = 0;
		for (; s + 1 < nact; s += 2) {
			a0 += wt[g][s] * att_ldcg(w + s * stride);
			a1 += wt[g][s + 1] * att_ldcg(w + (s + 1) * stride);
		}
		if (s < nact)
			a0 += wt[g][s] * att_ldcg(w + s * stride);
		out[x] = a0 + a1;
	}
}

/* One block's work; tid in [0, 32 W), (bx, by, bz) = (token, KV head, split). */
template <int D, int W>
ATT_DEV void att_mma_block(const att_mma_args &a, int tid, int bx, int by, int bz, att_mma_smem<D, W> &sm)
{
	constexpr int NJ = D / 32;  /* 32-dim chunks of a K row (one 16-byte load each per lane) */
	constexpr int NH = D / 64;  /* 64-dim chunks of a V row */
	const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
	const int32_t i = bx, g0 = by, split = bz;
	const int32_t G = a.nh / a.nkv, kvw = a.nkv * D;

	/* q of head g (zero rows past G): scaled, split into BF16 hi and lo, in this lane's dims */
	uint32_t qh[NJ][4], ql[NJ][4];
	{
		const float4 *qp = (const float4 *)(a.q + ((size_t)i * a.nh + (size_t)g0 * G + (g < G ? g : 0)) * D + 8 * c);
#pragma unroll
		for (int j = 0; j < NJ; j++) {
			const float4 u = qp[8 * j], v = qp[8 * j + 1];
			const float sc = g < G ? a.qscale : 0.0f;
			const float x[8] = {u.x * sc, u.y * sc, u.z * sc, u.w * sc, v.x * sc, v.y * sc, v.z * sc, v.w * sc};
#pragma unroll
			for (int w = 0; w < 4; w++) {
				const uint32_t h = att_pack(x[2 * w], x[2 * w + 1]);
				qh[j][w] = h;
				ql[j][w] = att_pack(x[2 * w] - att_lo_f(h), x[2 * w + 1] - att_hi_f(h));
			}
		}
	}
	const int32_t p = a.pos[bx];
	const att_range r = att_range_of(p, a.window, a.splits, a.min_tiles);
	if (split >= r.nact)
		return; /* the whole block: nothing to do */
	const int32_t *trow = a.table + (size_t)a.seq[i] * a.table_stride;
	const int32_t b_begin = r.b_lo + split * r.per;
	const int32_t b_end = b_begin + r.per < r.b_lo + r.nb ? b_begin + r.per : r.b_lo + r.nb;
	const uint16_t *kb = a.kc + (size_t)g0 * D + 8 * c;     /* + row * kvw + 32 j */
	const uint16_t *vb = a.vc + (size_t)g0 * D + 8 * g;     /* + row * kvw + 64 h */
	const int vrow[4] = {2 * c, 2 * c + 1, 2 * c + 8, 2 * c + 9};

	float o[NH * 8][4];
#pragma unroll
	for (int t = 0; t < NH * 8; t++)
		o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
	float m = -INFINITY, l = 0.0f;

	int32_t b = b_begin + warp;
	att_u4 kr[2][NJ], vr[4][NH];
	if (b < b_end) {
		const size_t row0 = (size_t)trow[b] * FP4S_KV_BLOCK;
#pragma unroll
		for (int nt = 0; nt < 2; nt++)
#pragma unroll
			for (int j = 0; j < NJ; j++)
				kr[nt][j] = att_ld16(kb + (row0 + 8 * nt + g) * kvw + 32 * j);
#pragma unroll
		for (int rr = 0; rr < 4; rr++)
#pragma unroll
			for (int h = 0; h < NH; h++)
				vr[rr][h] = att_ld16(vb + (row0 + vrow[rr]) * kvw + 64 * h);
	}
	for (; b < b_end; b += W) {
		const int32_t bn = b + W;
		const size_t rown = bn < b_end ? (size_t)trow[bn] * FP4S_KV_BLOCK : 0;
		/* scores: s[nt] rows g (hi) and g + 8 (lo) for keys 8 nt + 2c, 8 nt + 2c + 1 */
		float s[2][4];
#pragma unroll
		for (int nt = 0; nt < 2; nt++) {
			s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
			for (int j = 0; j < NJ; j++) {
				att_mma(s[nt], qh[j][0], ql[j][0], qh[j][1], ql[j][1], kr[nt][j].x, kr[nt][j].y);
				att_mma(s[nt], qh[j][2], ql[j][2], qh[j][3], ql[j][3], kr[nt][j].z, kr[nt][j].w);
			}
		}
		if (bn < b_end) {
#pragma unroll
			for (int nt = 0; nt < 2; nt++)
#pragma unroll
				for (int j = 0; j < NJ; j++)
					kr[nt][j] = att_ld16(kb + (rown + 8 * nt + g) * kvw + 32 * j);
		}
		/* key r of this tile is position 16 b + r; valid in [start, p] */
		const int32_t t0 = b * FP4S_KV_BLOCK;
		const bool full = t0 >= r.start && t0 + FP4S_KV_BLOCK - 1 <= p;
		float x[2][2];
#pragma unroll
		for (int nt = 0; nt < 2; nt++)
#pragma unroll
			for (int e = 0; e < 2; e++) {
				const int32_t kp = t0 + 8 * nt + 2 * c + e;
				const float v = s[nt][e] + s[nt][e + 2];
				x[nt][e] = full || (kp >= r.start && kp <= p) ? v : -INFINITY;
			}
		float mt = fmaxf(fmaxf(x[0][0], x[0][1]), fmaxf(x[1][0], x[1][1]));
		mt = fmaxf(mt, att_shfl_xor(mt, 1));
		mt = fmaxf(mt, att_shfl_xor(mt, 2));
		const float mn = fmaxf(m, mt); /* finite: every tile holds a valid key */
		const float alpha = att_ex2(m - mn);
		m = mn;
		float pr[2][2];
#pragma unroll
		for (int nt = 0; nt < 2; nt++)
#pragma unroll
			for (int e = 0; e < 2; e++)
				pr[nt][e] = att_ex2(x[nt][e] - mn);
		l = l * alpha + ((pr[0][0] + pr[0][1]) + (pr[1][0] + pr[1][1]));
#pragma unroll
		for (int t = 0; t < NH * 8; t++)
			o[t][0] *= alpha, o[t][1] *= alpha, o[t][2] *= alpha, o[t][3] *= alpha;
		uint32_t ph[2], pl[2];
#pragma unroll
		for (int nt = 0; nt < 2; nt++) {
			ph[nt] = att_pack(pr[nt][0], pr[nt][1]);
			pl[nt] = att_pack(pr[nt][0] - att_lo_f(ph[nt]), pr[nt][1] - att_hi_f(ph[nt]));
		}
		if (!full) {
#pragma unroll
			for (int rr = 0; rr < 4; rr++) {
				const int32_t kp = t0 + vrow[rr];
				if (kp < r.start || kp > p)
#pragma unroll
					for (int h = 0; h < NH; h++)
						vr[rr][h].x = vr[rr][h].y = vr[rr][h].z = vr[rr][h].w = 0u;
			}
		}
#pragma unroll
		for (int h = 0; h < NH; h++) {
			const uint32_t v0[4] = {vr[0][h].x, vr[0][h].y, vr[0][h].z, vr[0][h].w};
			const uint32_t v1[4] = {vr[1][h].x, vr[1][h].y, vr[1][h].z, vr[1][h].w};
			const uint32_t v2[4] = {vr[2][h].x, vr[2][h].y, vr[2][h].z, vr[2][h].w};
			const uint32_t v3[4] = {vr[3][h].x, vr[3][h].y, vr[3][h].z, vr[3][h].w};
#pragma unroll
			for (int t = 0; t < 8; t++) {
				const uint32_t sel = (t & 1) ? 0x7632u : 0x5410u;
				const uint32_t b0 = att_prmt(v0[t >> 1], v1[t >> 1], sel);
				const uint32_t b1 = att_prmt(v2[t >> 1], v3[t >> 1], sel);
				att_mma(o[h * 8 + t], ph[0], pl[0], ph[1], pl[1], b0, b1);
			}
		}
		if (bn < b_end) {
#pragma unroll
			for (int rr = 0; rr < 4; rr++)
#pragma unroll
				for (int h = 0; h < NH; h++)
					vr[rr][h] = att_ld16(vb + (rown + vrow[rr]) * kvw + 64 * h);
		}
	}
	l += att_shfl_xor(l, 1);
	l += att_shfl_xor(l, 2);

	/* merge the block's warps: scale each warp's output to the block max, sum through smem */
	if (c == 0) {
		sm.m[warp][g] = m;
		sm.l[warp][g] = l;
	}
	att_sync();
	float mb = -INFINITY;
#pragma unroll
	for (int w = 0; w < W; w++)
		mb = fmaxf(mb, sm.m[w][g]);
	const float f = m == -INFINITY ? 0.0f : att_ex2(m - mb);
#pragma unroll
	for (int h = 0; h < NH; h++) {
		float *dst = &sm.o[warp][g][64 * h + 16 * c];
#pragma unroll
		for (int t = 0; t < 8; t++) {
			dst[t] = (o[h * 8 + t][0] + o[h * 8 + t][2]) * f;
			dst[8 + t] = (o[h * 8 + t][1] + o[h * 8 + t][3]) * f;
		}
	}
	att_sync();
	const bool whole = r.nact == 1;
	float *part = a.work + (((size_t)i * a.nkv + g0) * a.splits) * G * (D + 2);
	for (int32_t x = tid; x < G * D; x += 32 * W) {
		const int32_t gg = x / D, j = x - gg * D;
		float mx = -INFINITY;
#pragma unroll
		for (int w = 0; w < W; w++)
			mx = fmaxf(mx, sm.m[w][gg]);
		float acc = 0.0f, den = 0.0f;
#pragma unroll
		for (int w = 0; w < W; w++) {
			acc += sm.o[w][gg][j];
			den += sm.m[w][gg] == -INFINITY ? 0.0f : sm.l[w][gg] * att_ex2(sm.m[w][gg] - mx);
		}
		if (whole) {
			const int32_t h = g0 * G + gg;
			if (a.sinks) {
				const float s2 = a.sinks[h] * ATT_LOG2E, mm = fmaxf(mx, s2), sc = att_ex2(mx - mm);
				acc *= sc;
				den = den * sc + att_ex2(s2 - mm);
			}
			a.out[((size_t)i * a.nh + h) * D + j] = acc / den;
		} else {
			float *w = part + ((size_t)split * G + gg) * (D + 2);
			if (j == 0) {
				w[0] = mx;
				w[1] = den;
			}
			w[2 + j] = acc;
		}
	}
	if (whole || !a.counters)
		return;
	/* the last block of this (token, KV head) to get here merges every split's partial */
	att_fence();
	att_sync();
	if (tid == 0)
		sm.last = att_atomic_inc(a.counters + (size_t)i * a.nkv + g0) == (unsigned)r.nact - 1;
	att_sync();
	if (!sm.last)
		return;
	att_fence();
	att_merge_group<D>(part, r.nact, G, a.sinks ? a.sinks + (size_t)g0 * G : nullptr,
	                   a.out + ((size_t)i * a.nh + (size_t)g0 * G) * D, tid, 32 * W, sm.wt);
	if (tid == 0)
		a.counters[(size_t)i * a.nkv + g0] = 0u; /* ready for the next call */
}

#endif
