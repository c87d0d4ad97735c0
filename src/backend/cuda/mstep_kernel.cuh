/* mstep_kernel.cuh: the one-launch decode step's attention split on the tensor cores (K and V
 * rows before pos through the ring) and the splits' merge, the route and the kernel (mstep.cuh
 * describes the design). */
#ifndef FP4S_MSTEP_KERNEL_CUH
#define FP4S_MSTEP_KERNEL_CUH

#include "backend/cuda/mstep.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
static __device__ __forceinline__ void mg_ldsm4(uint32_t sa, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
	             : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
	             : "r"(sa));
}

static __device__ __forceinline__ void mg_ldsm4t(uint32_t sa, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
	             : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
	             : "r"(sa));
}

/* The attention's two products on the tensor cores (a task: the 8 query heads of a kv head). mma
 * m16n8k16 with M = 16 rows: rows 0-7 the 8 heads' q (or P) rounded to BF16, rows 8-15 the BF16
 * residual, so that the row g + row g + 8 sum carries them to ~16 bits; K and V are BF16 already.
 * The stages' swizzle (mg_kv_sa) makes the ldmatrix reads conflict-free.
 * S = Q K^T: warp w takes keys 16 w .. + 16 (two n-tiles), K = the 128 dims in 8 steps; one
 * ldmatrix.x4 a step gives both n-tiles' B fragments. at(i, c): key i's 16-byte chunk c in shared
 * memory. The scores go to sc[head][MG_SCS]. */
template <typename AtF>
static __device__ __forceinline__ void mg_qk_mma(const float *qs, float *sc, int n, AtF at, int warp, int lane)
{
	if (16 * warp >= n)
		return;
	const int g = lane >> 2, c = lane & 3, j = lane >> 3, r = lane & 7;
	/* lane j * 8 + r: matrix j's row r = key 16 w + 8 (j >> 1) + r, chunk 2 kk + (j & 1) */
	const int key = min(16 * warp + 8 * (j >> 1) + r, n - 1);
	const float *qg = qs + g * MG_HD + 2 * c;
	float s0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, s1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 2
	for (int kk = 0; kk < MG_HD / 16; kk++) {
		uint32_t b0, b1, b2, b3;
		mg_ldsm4(at(key, 2 * kk + (j & 1)), b0, b1, b2, b3);
		const float2 x0 = *reinterpret_cast<const float2 *>(qg + 16 * kk);
		const float2 x1 = *reinterpret_cast<const float2 *>(qg + 16 * kk + 8);
		uint32_t l0, l1;
		const uint32_t h0 = gm_split(x0.x, x0.y, l0), h1 = gm_split(x1.x, x1.y, l1);
		gm_mma(s0, h0, l0, h1, l1, b0, b1);
		gm_mma(s1, h0, l0, h1, l1, b2, b3);
	}
	float *sg = sc + g * MG_SCS + 16 * warp + 2 * c;
	*reinterpret_cast<float2 *>(sg) = make_float2(s0[0] + s0[2], s0[1] + s0[3]);
	*reinterpret_cast<float2 *>(sg + 8) = make_float2(s1[0] + s1[2], s1[1] + s1[3]);
}

/* O = P V: warp w takes dims 16 w .. + 16 (two n-tiles), K = the keys in steps of 16 (P past n
 * is zero, and the rows past n read key n - 1's, finite); ldmatrix.x4.trans gives both n-tiles'
 * B fragments a step. Head h's sums land in ot[h][128]. */
template <typename AtF>
static __device__ __forceinline__ void mg_pv_mma(const float *sc, float *ot, int n, AtF at, int warp, int lane)
{
	const int g = lane >> 2, c = lane & 3, j = lane >> 3, r = lane & 7;
	float o0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, o1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
	for (int kb = 0; kb < n; kb += 16) {
		/* P's pairs as float2 loads: rows MG_SCS apart put a half-warp's on 16 different banks */
		const int k0 = kb + 2 * c;
		const float2 pa = *reinterpret_cast<const float2 *>(sc + g * MG_SCS + k0);
		const float2 pb = *reinterpret_cast<const float2 *>(sc + g * MG_SCS + k0 + 8);
		uint32_t l0, l1;
		const uint32_t h0 = gm_split(k0 < n ? pa.x : 0.0f, k0 + 1 < n ? pa.y : 0.0f, l0);
		const uint32_t h1 = gm_split(k0 + 8 < n ? pb.x : 0.0f, k0 + 9 < n ? pb.y : 0.0f, l1);
		/* lane j * 8 + r: matrix j's row r = key kb + 8 (j & 1) + r, chunk 2 w + (j >> 1) */
		const int key = min(kb + 8 * (j & 1) + r, n - 1);
		uint32_t b0, b1, b2, b3;
		mg_ldsm4t(at(key, 2 * warp + (j >> 1)), b0, b1, b2, b3);
		gm_mma(o0, h0, l0, h1, l1, b0, b1);
		gm_mma(o1, h0, l0, h1, l1, b2, b3);
	}
	float *og = ot + g * MG_HD + 16 * warp + 2 * c;
	*reinterpret_cast<float2 *>(og) = make_float2(o0[0] + o0[2], o0[1] + o0[3]);
	*reinterpret_cast<float2 *>(og + 8) = make_float2(o1[0] + o1[2], o1[1] + o1[3]);
}

/* The attention a warp at a time (gpt-oss's splits; the dense step's 4 heads take it transposed,
 * dstep.cuh ds_attn_keys_t; flash decoding with the warps as splits): warp w takes keys 16 w .. +
 * 16 of each chunk of MG_T, runs both products for them on the tensor cores with the scores kept in
 * registers (the S = Q K^T accumulators are the P V product's A fragments: keys 2c, 2c + 1 and 2c +
 * 8, 2c + 9 of row g either way), an online softmax over its chunks, and all 128 dims of P V (16
 * n-tiles of accumulators). The warps meet once a split (mg_attn_put, then the caller sums them),
 * not three times a chunk as mg_qk_mma, the softmax and mg_pv_mma do. Rows 0-7 of the MMA are the
 * heads (GQ of them; rows past GQ have q zero and P zero), rows 8-15 their BF16 residual parts. */

/* q's A fragments (rows g: q[g] split into BF16 hi / lo) for the HD / 16 steps of 16 dims, once
 * a split into qfs[step][lane] (warp w: step w), so that mg_attn_keys loads a step's with one
 * 16-byte load rather than holding all 32 registers (the kernels' cap is 168 a thread) */
template <int HD = MG_HD>
static __device__ __forceinline__ void mg_attn_qfrag(const float *qs, uint4 *qfs, int warp, int lane)
{
	if (HD < MG_HD && warp >= HD / 16)
		return;
	const float *qg = qs + (lane >> 2) * HD + 2 * (lane & 3) + 16 * warp;
	const float2 x0 = *reinterpret_cast<const float2 *>(qg), x1 = *reinterpret_cast<const float2 *>(qg + 8);
	uint4 f;
	f.x = gm_split(x0.x, x0.y, f.y);
	f.z = gm_split(x1.x, x1.y, f.w);
	qfs[warp * 32 + lane] = f;
}

/* keys kw .. kw + 16 (< n, clamped: P past n is 0 and those rows read key n - 1's) of a chunk:
 * kat / vat (i, c) key i's 16-byte chunk c of K / V in shared memory; wait_v() before V is read
 * (its copy may land after K's). m: the row's running max (the same in its 4 lanes), l: the
 * lane's part of the running sum, o: the sums (n-tile t: dims 8 t + 2c, + 1). The scores are
 * in log2 units (q scaled by log2 e): exp2f is one instruction, expf ~10. done_k() once K's
 * reads are over (the scores summed: every ldmatrix of K has landed). HD: the head's dims; LO:
 * keys below lo are masked too (a sliding window's start; the caller runs it only where one of
 * the warp's keys is in range). */
template <int GQ, int HD = MG_HD, bool LO = false, typename KAt, typename VAt, typename DoneK, typename WaitV>
static __device__ __forceinline__ void mg_attn_keys(const uint4 *qfs, int kw, int n, KAt kat, VAt vat, DoneK done_k,
                                                    WaitV wait_v, float &m, float &l, float (&o)[HD / 8][4], int lane,
                                                    int lo = 0)
{
	const int g = lane >> 2, c = lane & 3, j = lane >> 3, r = lane & 7;
	/* two accumulator chains an n-tile (even and odd steps): half the dependent MMAs (one chain
	 * measured 1.6 % slower at depth 4096, session 43) */
	float sa[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
	float sb[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
	{
		/* lane j * 8 + r: matrix j's row r = key kw + 8 (j >> 1) + r, chunk 2 kk + (j & 1) */
		const int key = min(kw + 8 * (j >> 1) + r, n - 1);
#pragma unroll
		for (int kk = 0; kk < HD / 16; kk++) {
			uint32_t b0, b1, b2, b3;
			mg_ldsm4(kat(key, 2 * kk + (j & 1)), b0, b1, b2, b3);
			const uint4 f = qfs[kk * 32 + lane];
			float(&s)[2][4] = (kk & 1) ? sb : sa;
			gm_mma(s[0], f.x, f.y, f.z, f.w, b0, b1);
			gm_mma(s[1], f.x, f.y, f.z, f.w, b2, b3);
		}
	}
	/* x[t][e]: key kw + 8 t + 2c + e of row g (hi row + residual row, both chains) */
	float x[2][2], mx = -INFINITY;
#pragma unroll
	for (int t = 0; t < 2; t++)
#pragma unroll
		for (int e = 0; e < 2; e++) {
			const int kk = kw + 8 * t + 2 * c + e;
			const bool in = kk < n && (!LO || kk >= lo) && g < GQ;
			x[t][e] = in ? (sa[t][e] + sa[t][e + 2]) + (sb[t][e] + sb[t][e + 2]) : -INFINITY;
			mx = fmaxf(mx, x[t][e]);
		}
	done_k();
	mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
	mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
	const float mn = g < GQ ? fmaxf(m, mx) : 0.0f; /* finite: key kw < n */
	const float al = exp2f(m - mn);
	/* the sums need rescaling only where a row's max rose after its first chunk (o is 0 before) */
	const bool resc = __any_sync(0xFFFFFFFFu, al != 1.0f && m != -INFINITY);
	m = mn;
	float p[2][2], ps = 0.0f;
#pragma unroll
	for (int t = 0; t < 2; t++)
#pragma unroll
		for (int e = 0; e < 2; e++) {
			p[t][e] = exp2f(x[t][e] - mn);
			ps += p[t][e];
		}
	l = l * al + ps;
	if (resc)
#pragma unroll
		for (int t = 0; t < HD / 8; t++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				o[t][e] *= al;
	uint32_t l0, l1;
	const uint32_t h0 = gm_split(p[0][0], p[0][1], l0), h1 = gm_split(p[1][0], p[1][1], l1);
	wait_v();
	/* lane j * 8 + r: matrix j's row r = key kw + 8 (j & 1) + r, chunk 2 dp + (j >> 1) */
	const int key = min(kw + 8 * (j & 1) + r, n - 1);
#pragma unroll
	for (int dp = 0; dp < HD / 16; dp++) {
		uint32_t b0, b1, b2, b3;
		mg_ldsm4t(vat(key, 2 * dp + (j >> 1)), b0, b1, b2, b3);
		gm_mma(o[2 * dp], h0, l0, h1, l1, b0, b1);
		gm_mma(o[2 * dp + 1], h0, l0, h1, l1, b2, b3);
	}
}

#define MG_OWS (MG_HD + 8) /* a warp's head row in mg_attn_put's sums (floats): float2 stores conflict-free */

/* the warp's split of the split into shared memory: mw, lw [warp][GQ] the rows' max and sum, ow
 * [warp][GQ][HD + 8] the sums. The caller syncs, then mg_attn_combine weighs them. */
template <int GQ, int HD = MG_HD>
static __device__ __forceinline__ void mg_attn_put(float m, float l, const float (&o)[HD / 8][4], float *mw, float *lw,
                                                   float *ow, int warp, int lane)
{
	const int g = lane >> 2, c = lane & 3;
	l += __shfl_xor_sync(0xFFFFFFFFu, l, 1);
	l += __shfl_xor_sync(0xFFFFFFFFu, l, 2);
	if (g < GQ) {
		if (c == 0)
			mw[warp * GQ + g] = m, lw[warp * GQ + g] = l;
		float *row = ow + (warp * GQ + g) * (HD + 8) + 2 * c;
#pragma unroll
		for (int t = 0; t < HD / 8; t++)
			*reinterpret_cast<float2 *>(row + 8 * t) = make_float2(o[t][0] + o[t][2], o[t][1] + o[t][3]);
	}
}

/* head h's dims d, d + 1 of a split: the warps' sums (mg_attn_put's) weighed by exp2(max_w - M),
 * into M (the max over the warps, log2 units), L (the sum) and ox, oy */
template <int GQ, int HD = MG_HD>
static __device__ __forceinline__ void mg_attn_combine(const float *mw, const float *lw, const float *ow, int h, int d,
                                                       float &M, float &L, float &ox, float &oy)
{
	M = -INFINITY;
#pragma unroll
	for (int w = 0; w < MG_W; w++)
		M = fmaxf(M, mw[w * GQ + h]);
	L = 0.0f, ox = 0.0f, oy = 0.0f;
#pragma unroll
	for (int w = 0; w < MG_W; w++) {
		const float f = exp2f(mw[w * GQ + h] - M);
		const float2 v = *reinterpret_cast<const float2 *>(ow + (w * GQ + h) * (HD + 8) + d);
		L += f * lw[w * GQ + h];
		ox += f * v.x, oy += f * v.y;
	}
}

/* the lane's rotary cos (c) and sin (s) for dims 4 lane .. + 4 at position p: angle p x
 * inv_freq[i], times mscale (as attention_mma.cuh's prologue) */
static __device__ __forceinline__ void mg_rope_ld(const float *inv_freq, float mscale, int p, int lane, float4 &c,
                                                  float4 &s)
{
	const int i0 = (4 * lane) & (MG_HD / 2 - 1);
	const float4 f = __ldg(reinterpret_cast<const float4 *>(inv_freq + i0));
	const float an[4] = {(float)p * f.x, (float)p * f.y, (float)p * f.z, (float)p * f.w};
	c = make_float4(cosf(an[0]) * mscale, cosf(an[1]) * mscale, cosf(an[2]) * mscale, cosf(an[3]) * mscale);
	s = make_float4(sinf(an[0]) * mscale, sinf(an[1]) * mscale, sinf(an[2]) * mscale, sinf(an[3]) * mscale);
}

/* row i's (< 64) 16-byte chunk c (< 16) in a K or V stage at st: 4 blocks of 4 KB, each [half
 * of the row][position][128 bytes] with the 128-byte swizzle (chunk c % 8 XOR the line's index %
 * 8, which is the position's % 8: 8 consecutive rows' same chunk on 8 different bank groups).
 * mg_kv_sa_or below writes the same layout out by selects: a change here goes there too. */
static __device__ __forceinline__ uint32_t mg_kv_sa(uint32_t st, int i, int c)
{
	return st + (uint32_t)((i >> 4) * 4096 + (c >> 3) * 2048 + (i & 15) * 128 + (((c & 7) ^ (i & 7)) << 4));
}

/* mg_kv_sa(st, i & 63, c) where ring, else chunk c of a linear row at ps (pos's row, staged
 * apart): the row's base, a half's stride and the XOR chosen by selects. With i the same in a
 * caller's unrolled steps they are worked out once, where a ternary of the two addresses
 * compiled to a branch around each step's (the dense step, session 55) */
static __device__ __forceinline__ uint32_t mg_kv_sa_or(bool ring, uint32_t st, uint32_t ps, int i, int c)
{
	const uint32_t b = ring ? st + (uint32_t)((i & 63) >> 4) * 4096u + (uint32_t)(i & 15) * 128u : ps;
	const uint32_t hs = ring ? 2048u : 128u, x = ring ? (uint32_t)(i & 7) : 0u;
	return b + (uint32_t)(c >> 3) * hs + ((((uint32_t)c & 7u) ^ x) << 4);
}

/* position t's row of kv head g (of nkv, HD dims each) in a layer's K or V blocks (tab: the
 * sequence's block table) */
template <int HD = MG_HD>
static __device__ __forceinline__ __nv_bfloat16 *mg_kvrow(__nv_bfloat16 *base, const int32_t *tab, int t, int g,
                                                          int nkv)
{
	return base + ((size_t)(__ldg(tab + t / MG_KVB) * MG_KVB + t % MG_KVB) * nkv + g) * HD;
}

/* rotary (rotate-half: dims d and d + 64 a pair; c4, s4 from mg_rope_ld) of one head held by a
 * warp, 4 dims a lane (4 lane .. + 4) */
static __device__ __forceinline__ float4 mg_rope4(const float4 v, const float4 c4, const float4 s4, int lane)
{
	const float x[4] = {v.x, v.y, v.z, v.w};
	const float cs[4] = {c4.x, c4.y, c4.z, c4.w}, sn[4] = {s4.x, s4.y, s4.z, s4.w};
	float y[4];
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const float p = __shfl_xor_sync(0xFFFFFFFFu, x[i], 16); /* dims d +- 64 */
		y[i] = lane < 16 ? x[i] * cs[i] - p * sn[i] : x[i] * cs[i] + p * sn[i];
	}
	return make_float4(y[0], y[1], y[2], y[3]);
}

/* q_norm or k_norm (RMSNorm over the head's 128 dims, the lane's weights wv) and rotary
 * (rotate-half: dims d and d + 64 a pair; c4, s4 from mg_rope_ld) of one head held by a warp, 4
 * dims a lane (4 lane .. + 4). The caller loads wv, c4 and s4 with v: one round trip for all. */
static __device__ __forceinline__ float4 mg_qk_norm_rope(const float4 v, const float4 wv, const float4 c4,
                                                         const float4 s4, float eps, int lane)
{
	float ss = v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
	for (int o = 16; o; o >>= 1)
		ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
	const float r = 1.0f / sqrtf(ss / (float)MG_HD + eps);
	return mg_rope4(make_float4(v.x * r * wv.x, v.y * r * wv.y, v.z * r * wv.z, v.w * r * wv.w), c4, s4, lane);
}

/* k at pos (4 dims a lane) rounded to BF16 into the staged row kvp and the cache row kc */
static __device__ __forceinline__ void mg_k_store(const float4 k4, uint4 *kvp, __nv_bfloat16 *kc, int lane)
{
	const int at = 4 * lane;
	const __nv_bfloat162 k01 = __floats2bfloat162_rn(k4.x, k4.y), k23 = __floats2bfloat162_rn(k4.z, k4.w);
	uint2 kb;
	kb.x = *reinterpret_cast<const uint32_t *>(&k01), kb.y = *reinterpret_cast<const uint32_t *>(&k23);
	*reinterpret_cast<uint2 *>(reinterpret_cast<__nv_bfloat16 *>(kvp) + at) = kb;
	*reinterpret_cast<uint2 *>(kc + at) = kb;
}

/* a warp's softmax over its head's n scores sh (max, weights in place, sum into *m, *l by lane 0) */
static __device__ __forceinline__ void mg_softmax_row(float *sh, int n, float *mo, float *lo, int lane)
{
	float m = -INFINITY;
	for (int i = lane; i < n; i += 32)
		m = fmaxf(m, sh[i]);
	for (int o = 16; o; o >>= 1)
		m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
	float sum = 0.0f;
	for (int i = lane; i < n; i += 32) {
		const float p = expf(sh[i] - m);
		sh[i] = p;
		sum += p;
	}
	for (int o = 16; o; o >>= 1)
		sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
	if (lane == 0)
		*mo = m, *lo = sum;
}

/* a merge's rounds over S split partials (p0 + j ps: 128 sums, max, sum): in rounds of 64 splits
 * (one at contexts <= 8192), all of a round's loads in flight at once, warp w summing splits w,
 * w + 8, .. of the lane's 4 dims weighted by exp(m_j - M), lane j holding split j's (max, sum); a
 * later round rescales what the earlier ones summed. Returns the warp's sums; *Lsum the total. */
static __device__ __forceinline__ float4 mg_merge_rounds(const float *p0, size_t ps, int S, float *Lsum_out, int warp,
                                                         int lane)
{
	float M = -INFINITY, Lsum = 0.0f;
	float4 O = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
	for (int j0 = 0; j0 < S; j0 += 64) {
		float4 v[8];
#pragma unroll
		for (int u = 0; u < 8; u++)
			v[u] = __ldcg(reinterpret_cast<const float4 *>(p0 + min(j0 + warp + 8 * u, S - 1) * ps) + lane);
		float mj[2], lj[2];
#pragma unroll
		for (int u = 0; u < 2; u++) {
			const int j = j0 + lane + 32 * u;
			mj[u] = j < S ? __ldcg(p0 + j * ps + MG_HD) : -INFINITY;
			lj[u] = j < S ? __ldcg(p0 + j * ps + MG_HD + 1) : 0.0f;
		}
		float Mn = fmaxf(mj[0], mj[1]);
		for (int o = 16; o; o >>= 1)
			Mn = fmaxf(Mn, __shfl_xor_sync(0xFFFFFFFFu, Mn, o));
		Mn = fmaxf(M, Mn);
		const float r = expf(M - Mn); /* 0 in the first round */
		M = Mn;
		float f[2], Lr = 0.0f;
#pragma unroll
		for (int u = 0; u < 2; u++) {
			f[u] = j0 + lane + 32 * u < S ? expf(mj[u] - M) : 0.0f;
			Lr += f[u] * lj[u];
		}
		for (int o = 16; o; o >>= 1)
			Lr += __shfl_xor_sync(0xFFFFFFFFu, Lr, o);
		Lsum = Lsum * r + Lr;
		O.x *= r, O.y *= r, O.z *= r, O.w *= r;
#pragma unroll
		for (int u = 0; u < 8; u++) {
			const int j = warp + 8 * u;
			const float fj = __shfl_sync(0xFFFFFFFFu, (j & 32) ? f[1] : f[0], j & 31);
			if (j0 + j < S)
				O.x += fj * v[u].x, O.y += fj * v[u].y, O.z += fj * v[u].z, O.w += fj * v[u].w;
		}
	}
	*Lsum_out = Lsum;
	return O;
}

/* positions of [a0, a1) before pos = ctx - 1: the ones whose K and V rows exist before the step,
 * copied through the ring in stages of up to 64 rows, K's then V's */
static __device__ __forceinline__ int mg_ring_m(int ctx, int a0, int a1)
{
	return max(0, min(a1, ctx - 1) - a0);
}

/* those of split s (of MG_T positions) */
static __device__ __forceinline__ int mg_attn_m(int ctx, int s)
{
	return mg_ring_m(ctx, s * MG_T, min(ctx, s * MG_T + MG_T));
}

/* one attention split: kv head g's 8 query heads over positions [s T, min(ctx, (s + 1) T)), by
 * the 256 consumer threads. K and V rows before pos come through the ring, pos's (this step's)
 * are staged with q. With one split (S = 1) the heads' outputs are written and counted (8);
 * otherwise the split leaves (unnormalized sums, max, sum) a head for mg_merge and counts itself
 * on its kv head's split counter. */
static __device__ void mg_attn(const mg_args &a, const mg_layer &ly, int l, int g, int s, int ctx, int S,
                              const int32_t *tab, const unsigned *qkv_cnt, float *scr, int tid, gt_pos &rp,
                              uint64_t *full, uint64_t *empty, uint32_t ring_sa)
{
	const int warp = tid >> 5, lane = tid & 31, pos = ctx - 1;
	const int t0 = s * MG_T, t1 = min(ctx, t0 + MG_T), n = t1 - t0;
	/* the ring's K and V stages of this split, landed long before */
	const int nk = (mg_attn_m(ctx, s) + 63) / 64;
	uint32_t kst[2] = {0, 0}, vst[2] = {0, 0};
	{
		gt_pos q = rp;
		auto landed = [&] { /* the next stage's address, once its copy has landed */
			mg_wbar(&full[q.i], q.ph, 2, q.n);
			const uint32_t sa = ring_sa + (uint32_t)q.i * MG_STAGE;
			gt_next(q, MG_NS);
			return sa;
		};
#pragma unroll
		for (int c = 0; c < 2; c++)
			if (c < nk)
				kst[c] = landed();
#pragma unroll
		for (int c = 0; c < 2; c++)
			if (c < nk)
				vst[c] = landed();
	}
	/* scratch: q [8][128], scores [8][MG_SCS], max [8], sum [8], pos's K and V rows (bf16), the
	 * heads' sums [8][128] */
	float *qs = scr, *sc = scr + 8 * MG_HD, *mstat = sc + 8 * MG_SCS, *lstat = mstat + 8;
	uint4 *kvp = reinterpret_cast<uint4 *>(lstat + 8);
	float *ot = lstat + 8 + MG_HD;
	const uint32_t kp_sa = gt_sa(kvp), vp_sa = kp_sa + MG_HD * 2;
	{
		/* warp h: head h's q (lane: dims 4 lane .. + 4), normed and rotated, times 1 / sqrt(128).
		 * In the last split the last warp also finishes k at pos (normed, rotated, rounded to
		 * bf16 into the cache and kvp), and threads 0-15 stage v's row into kvp. The norms'
		 * weights and rotary's cos / sin before the wait for the qkv tiles (on the path from
		 * the last of them to the attention otherwise) */
		const float4 qw = __ldg(reinterpret_cast<const float4 *>(ly.qn) + lane);
		float4 c4, s4;
		mg_rope_ld(a.inv_freq, a.mscale, pos, lane, c4, s4);
		const bool last = t1 == ctx;
		float4 kr = make_float4(0.0f, 0.0f, 0.0f, 0.0f), kw = kr;
		if (last && warp == MG_W - 1)
			kw = __ldg(reinterpret_cast<const float4 *>(ly.kn) + lane);
		mg_cwait(qkv_cnt, MG_QKV_TILES, tid);
		const float4 v = __ldcg(reinterpret_cast<const float4 *>(a.q + (size_t)l * MG_QR + g * 8 * MG_HD) + tid);
		if (last && warp == MG_W - 1)
			kr = __ldcg(reinterpret_cast<const float4 *>(a.kraw + ((size_t)l * MG_NKV + g) * MG_HD) + lane);
		if (last && tid < 16)
			kvp[16 + tid] = __ldcg(reinterpret_cast<const uint4 *>(mg_kvrow(ly.vc, tab, pos, g, MG_NKV)) + tid);
		const float4 qr = mg_qk_norm_rope(v, qw, c4, s4, a.eps, lane);
		reinterpret_cast<float4 *>(qs)[tid] = make_float4(qr.x * a.scale, qr.y * a.scale, qr.z * a.scale, qr.w * a.scale);
		if (last && warp == MG_W - 1) {
			mg_k_store(mg_qk_norm_rope(kr, kw, c4, s4, a.eps, lane), kvp, mg_kvrow(ly.kc, tab, pos, g, MG_NKV), lane);
		}
	}
	gt_sync();
	mg_mark(a, l, T_AQ, tid);
	/* key i's 16-byte chunk c of K and V in shared memory */
	auto kat = [&](int i, int c) -> uint32_t {
		return t0 + i < pos ? mg_kv_sa((i >> 6) ? kst[1] : kst[0], i & 63, c) : kp_sa + (uint32_t)(c << 4);
	};
	auto vat = [&](int i, int c) -> uint32_t {
		return t0 + i < pos ? mg_kv_sa((i >> 6) ? vst[1] : vst[0], i & 63, c) : vp_sa + (uint32_t)(c << 4);
	};
	mg_qk_mma(qs, sc, n, kat, warp, lane);
	gt_sync();
	mg_mark(a, l, T_AS, tid);
	/* warp h: the softmax's max, weights and sum over the split */
	mg_softmax_row(sc + warp * MG_SCS, n, &mstat[warp], &lstat[warp], lane);
	gt_sync();
	mg_mark(a, l, T_ASM, tid);
	mg_pv_mma(sc, ot, n, vat, warp, lane);
	mg_mark(a, l, T_APV, tid);
	/* the K and V stages go back to the producer (this warp is past its reads) */
	for (int c = 0; c < 2 * nk; c++) {
		if (lane == 0)
			gt_arrive(&empty[rp.i]);
		gt_next(rp, MG_NS);
	}
	gt_sync();
	/* warp h: head h's dims 4 lane .. + 4 */
	const float4 o4 = reinterpret_cast<const float4 *>(ot + warp * MG_HD)[lane];
	unsigned *cnt = a.cnt + (size_t)l * MG_CNT;
	if (S == 1) {
		const float inv = 1.0f / lstat[warp];
		*reinterpret_cast<float4 *>(a.att + (size_t)l * MG_QR + (g * 8 + warp) * MG_HD + 4 * lane) =
			make_float4(o4.x * inv, o4.y * inv, o4.z * inv, o4.w * inv);
		mg_cpub(cnt + C_ATT, 8, tid);
		return;
	}
	float *pp = a.part + (((size_t)g * S + s) * 8 + warp) * MG_PS;
	*reinterpret_cast<float4 *>(pp + 4 * lane) = o4;
	if (lane == 0)
		pp[MG_HD] = mstat[warp], pp[MG_HD + 1] = lstat[warp];
	mg_cpub(cnt + C_N + g, 1, tid);
	mg_mark(a, l, T_APW, tid);
}

/* kv head g's query head h: its S splits' partials merged once all are in, by one block (blocks
 * 0 .. 31 take these after their own splits, so no wait here holds up a split), in rounds
 * (mg_merge_rounds). The 8 warps' sums are added in order
 * through shared memory (scr: 4 KB). The partials are the layer's only while its o tiles wait for
 * the merges, so one buffer serves every layer. */
static __device__ void mg_merge(const mg_args &a, int l, int g, int h, int S, float *scr, int tid)
{
	const int warp = tid >> 5, lane = tid & 31;
	unsigned *cnt = a.cnt + (size_t)l * MG_CNT;
	mg_cwait(cnt + C_N + g, (unsigned)S, tid);
	mg_mark(a, l, T_MSEEN, tid);
	float Lsum;
	const float4 O = mg_merge_rounds(a.part + ((size_t)g * S * 8 + h) * MG_PS, (size_t)8 * MG_PS, S, &Lsum, warp, lane);
	float4 *red4 = reinterpret_cast<float4 *>(scr);
	red4[warp * 32 + lane] = O;
	gt_sync();
	mg_mark(a, l, T_MLD, tid);
	if (warp == 0) {
		float4 t = red4[lane];
#pragma unroll
		for (int w = 1; w < MG_W; w++) {
			const float4 q = red4[w * 32 + lane];
			t.x += q.x, t.y += q.y, t.z += q.z, t.w += q.w;
		}
		const float inv = 1.0f / Lsum;
		*reinterpret_cast<float4 *>(a.att + (size_t)l * MG_QR + (g * 8 + h) * MG_HD + 4 * lane) =
			make_float4(t.x * inv, t.y * inv, t.z * inv, t.w * inv);
	}
	mg_cpub(cnt + C_ATT, 1, tid);
}

/* the route, by every block's consumers once the o tiles are all in: x = RMSNorm(h2) staged for
 * the gate|up, the router's logits as the sum of the 128 o tiles' parts, and the top-k. The parts
 * are summed in one fixed order: every block gets the same bits, so all choose the same experts. Each part is
 * sum_r W[e][r] n2[r] h2[r] over the tile's rows, so the logits are 1 / rms times the sum; the
 * order does not depend on that factor and the weights take it in the softmax. The top-k by
 * ranks: thread e counts the logits above its own (lower index first on ties, as a stable sort),
 * and the 8 of rank < 8 write themselves to sel. Softmax over the 8 (Qwen3's norm_topk_prob: the
 * full softmax's denominator cancels). scr: 10 E + 16 floats. */
static __device__ void mg_route(const mg_args &a, int l, const float *h2, const float *nw, uint8_t *xs, float *sred,
                                float *scr, int *sel, float *selw, int tid)
{
	const int warp = tid >> 5, lane = tid & 31;
	/* warp w sums tiles 16 w .. + 16 of experts 4 lane .. + 4 (16 float4 loads a thread in flight,
	 * with the norm's); then thread e adds the 8 warps' sums in order */
	const float4 *rp = reinterpret_cast<const float4 *>(a.rpart + ((size_t)l * MG_O_TILES + 16 * warp) * MG_E) + lane;
	float4 pv[MG_O_TILES / MG_W];
#pragma unroll
	for (int u = 0; u < MG_O_TILES / MG_W; u++)
		pv[u] = __ldcg(rp + u * (MG_E / 4));
	/* h2's loads in flight with the parts'; the parts summed before the norm (their 64 registers
	 * held across it made the kernel spill) */
	const float4 ha = __ldcg(reinterpret_cast<const float4 *>(h2 + tid * 8));
	const float4 hb = __ldcg(reinterpret_cast<const float4 *>(h2 + tid * 8 + 4));
	const float4 na = __ldg(reinterpret_cast<const float4 *>(nw + tid * 8));
	const float4 nb = __ldg(reinterpret_cast<const float4 *>(nw + tid * 8 + 4));
	float4 s4 = pv[0];
#pragma unroll
	for (int u = 1; u < MG_O_TILES / MG_W; u++)
		s4.x += pv[u].x, s4.y += pv[u].y, s4.z += pv[u].z, s4.w += pv[u].w;
	float *lg = scr, *sv = scr + MG_E, *ws = sv + 16; /* ws: [8][E], then the rank halves [E] */
	int *rk = reinterpret_cast<int *>(ws + MG_W * MG_E);
	/* the warps' sums written before the norm's first barrier, which then covers them too */
	reinterpret_cast<float4 *>(ws + warp * MG_E)[lane] = s4;
	const float r = mg_stage_norm_x(ha, hb, na, nb, a.eps, xs, sred, tid);
	if (tid < MG_E) {
		float v = 0.0f;
#pragma unroll
		for (int w = 0; w < MG_W; w++)
			v += ws[w * MG_E + tid];
		lg[tid] = v;
	}
	gt_sync();
	mg_mark(a, l, T_RSUM, tid);
	/* thread (e, half) counts the logits of its half above logit e (lower index first on ties) */
	const int e = tid & (MG_E - 1), j0 = (tid >> 7) * (MG_E / 2);
	const float x = lg[e];
	int rank = 0;
#pragma unroll 4
	for (int j = j0; j < j0 + MG_E / 2; j += 4) {
		const float4 v = *reinterpret_cast<const float4 *>(lg + j);
		rank += (v.x > x || (v.x == x && j < e)) + (v.y > x || (v.y == x && j + 1 < e)) +
		        (v.z > x || (v.z == x && j + 2 < e)) + (v.w > x || (v.w == x && j + 3 < e));
	}
	if (tid >= MG_E)
		rk[e] = rank;
	gt_sync();
	if (tid < MG_E) {
		rank += rk[e];
		if (rank < MG_K)
			sel[rank] = e, sv[rank] = x;
		if (blockIdx.x == 0)
			a.logits[(size_t)l * MG_E + e] = x * r;
	}
	gt_sync();
	if (tid < 32) {
		const float w = tid < MG_K ? expf((sv[tid] - sv[0]) * r) : 0.0f;
		float tot = w;
		for (int o = 4; o; o >>= 1)
			tot += __shfl_xor_sync(0xFFFFFFFFu, tot, o);
		if (tid < MG_K) {
			selw[tid] = w / tot;
			if (blockIdx.x == 0)
				a.sel[(size_t)l * MG_K + tid] = sel[tid];
		}
	}
	gt_sync();
}

/* an o tile's share of the router's logits for expert tid / 2: its 16 columns of the router at st
 * ([E][16] BF16: thread t reads expert t / 2's half t % 2, 16 contiguous bytes) times hs (n2 h2 of
 * the tile's 16 rows); both threads of the pair get the sum (whole warps call it) */
static __device__ __forceinline__ float mg_router_part(uint32_t st, const float *hs, int tid)
{
	const uint4 wv = gm_lds128(st + tid * 16);
	const __nv_bfloat162 *w2 = reinterpret_cast<const __nv_bfloat162 *>(&wv);
	const float *hh = hs + 8 * (tid & 1);
	float p = 0.0f;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const float2 wf = __bfloat1622float2(w2[i]);
		p += wf.x * hh[2 * i] + wf.y * hh[2 * i + 1];
	}
	return p + __shfl_xor_sync(0xFFFFFFFFu, p, 1);
}

/* a 5-D tensor-map copy (the K / V blocks) */
static __device__ __forceinline__ void mg_copy_5d(void *dst, const CUtensorMap *map, int c0, int c1, int c2, int c3,
                                                  int c4, uint64_t *b, uint64_t pol)
{
	asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
	             "[%1, {%2, %3, %4, %5, %6}], [%7], %8;" ::"r"(gt_sa(dst)),
	             "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(gt_sa(b)),
	             "l"(pol)
	             : "memory");
}

/* MG_HELPERS_ONLY: a file that takes the helpers above without this kernel (dstep.cuh) */
#ifndef MG_HELPERS_ONLY
__global__ void __launch_bounds__(MG_THREADS, 1) mg_kernel(const mg_args a)
{
	extern __shared__ __align__(128) uint8_t smem[];
	uint8_t *ring = smem;
	uint8_t *xs = ring + MG_NS * MG_STAGE;
	float *red = reinterpret_cast<float *>(xs + MG_XS); /* [2][8][16] */
	uint64_t *full = reinterpret_cast<uint64_t *>(red + 2 * MG_W * 16);
	uint64_t *empty = full + MG_NS;
	uint64_t *selbar = empty + MG_NS; /* [2] */
	int *sel = reinterpret_cast<int *>(selbar + 2);       /* [2][8] */
	float *selw = reinterpret_cast<float *>(sel + 2 * MG_K); /* [2][8] */
	float *sred = selw + 2 * MG_K;                          /* [8] */
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
	const int b = blockIdx.x, G = gridDim.x;
	/* the step's token: its context (pos + 1), the attention's splits, its block table row (read
	 * here, not passed: a graph replays the launch with new contents) */
	const int ctx = __ldg(a.pos) + 1, S = (ctx + MG_T - 1) / MG_T;
	const int32_t *tab = a.table + (size_t)__ldg(a.seq) * a.table_stride;
	if (tid == 0) {
		if (gt_sa(ring) & 1023) /* the K / V stages' swizzle (mg_kv_sa) counts lines from 1024-byte bounds */
			__trap();
		for (int i = 0; i < MG_NS; i++) {
			gt_init(&full[i], 1);
			gt_init(&empty[i], MG_W);
		}
		gt_init(&selbar[0], 1);
		gt_init(&selbar[1], 1);
		asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
	}
	__syncthreads();

	if (warp == MG_W) { /* the producer */
		uint64_t pol;
		asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
		gt_pos pp = {0, 0, 0};
		/* lane 0: the next slot, once free, expecting bytes */
		auto take = [&](unsigned bytes) {
			mg_wbar(&empty[pp.i], pp.ph ^ 1u, 3, pp.n);
			gt_expect(&full[pp.i], bytes);
			return ring + (size_t)pp.i * MG_STAGE;
		};
		/* a tile of 16 contiguous rows: codes cb bytes a row from src, scales sb a row from ssrc,
		 * at d (one bulk copy each) */
		auto tile = [&](uint8_t *d, const uint8_t *src, unsigned cb, const uint8_t *ssrc, unsigned sb) {
			gt_copy_ef(d, src, 16 * cb, &full[pp.i], pol);
			gt_copy_ef(d + 16 * cb, ssrc, 16 * sb, &full[pp.i], pol);
		};
		/* a 2048-K tile of 16 contiguous rows: the codes a bulk copy from src, the scales rows y .. +
		 * 16 of a swizzling map */
		auto tilem = [&](uint8_t *d, const uint8_t *src, const CUtensorMap *smap, int y) {
			gt_copy_ef(d, src, 16 * MG_CB, &full[pp.i], pol);
			gt_copy_2d(d + 16 * MG_CB, smap, 0, y, &full[pp.i], pol);
		};
		const int l0 = lane == 0 ? 0 : a.L; /* lane 0 issues; the others go to the end */
		for (int l = l0; l < a.L; l++) {
			const mg_layer &ly = a.ly[l];
			for (int j = b; j < MG_QKV_TILES; j += G) {
				tilem(take(MG_STAGE), ly.qkv + (size_t)j * 16 * MG_CB, a.maps + 4 * l + 2, 16 * j);
				gt_next(pp, MG_NS);
			}
			/* the attention's K and V rows before pos, 64 a stage: a kv head's 16 rows of a block
			 * a copy (the stage's last block may hold rows at and past pos: not read) */
			for (int t = b; t < MG_NKV * S; t += G) {
				const int g = t / S, s = t % S, m = mg_attn_m(ctx, s);
				for (int kv = 0; kv < 2; kv++)
					for (int c0 = 0; c0 < m; c0 += 64) {
						const int nblk = (min(64, m - c0) + MG_KVB - 1) / MG_KVB;
						uint8_t *d = take((unsigned)nblk * 4096);
						for (int i = 0; i < nblk; i++)
							mg_copy_5d(d + i * 4096, a.kvmap + kv, 0, 0, 0, g,
							           l * a.nb + __ldg(tab + (s * MG_T + c0) / MG_KVB + i), &full[pp.i], pol);
						gt_next(pp, MG_NS);
					}
			}
			if (b < MG_O_TILES) {
				for (int c = 0; c < 2; c++) {
					uint8_t *d = take(MG_STAGE);
					gt_copy_2d(d, a.maps + 4 * l, 128 * c, 16 * b, &full[pp.i], pol);
					gt_copy_2d(d + 16 * MG_CB, a.maps + 4 * l + 1, 128 * c, 16 * b, &full[pp.i], pol);
					gt_next(pp, MG_NS);
				}
				gt_copy_ef(take(MG_RT_BYTES), reinterpret_cast<const uint8_t *>(ly.rt) + (size_t)b * MG_RT_BYTES,
				           MG_RT_BYTES, &full[pp.i], pol);
				gt_next(pp, MG_NS);
			}
			const int *sl = sel + (l & 1) * MG_K;
			/* the consumers' top-k */
			mg_wbar(&selbar[l & 1], (l >> 1) & 1, 4, l);
			if (a.tl && l == a.tl_layer)
				a.tl[blockIdx.x * MG_TL + T_PSEL] = gm_now();
			for (int j = b; j < MG_K * MG_GU_TILES; j += G) {
				const int slot = j / MG_GU_TILES, t = j - slot * MG_GU_TILES, e = sl[slot];
				tilem(take(MG_STAGE), ly.gu + (size_t)e * a.gu_stride + (size_t)t * 16 * MG_CB, a.maps + 4 * l + 3,
				      e * 2 * MG_FI + 16 * t);
				gt_next(pp, MG_NS);
			}
			/* the down's stages two to a ring slot: with the block's <= 6 gate|up tiles, all its
			 * expert copies fit in the 10 slots at once */
			if (b < MG_D_TILES)
				for (int slot = 0; slot < MG_K; slot += 2) {
					uint8_t *d = take(2 * MG_DSTAGE);
					for (int h = 0; h < 2; h++) {
						const int e = sl[slot + h];
						tile(d + h * MG_DSTAGE, ly.dn + (size_t)e * a.dn_stride + (size_t)b * 16 * MG_DCB, MG_DCB,
						     ly.dn_s + (size_t)e * a.dns_stride + (size_t)b * 16 * MG_DSB, MG_DSB);
					}
					gt_next(pp, MG_NS);
				}
			if (a.tl && l == a.tl_layer)
				a.tl[blockIdx.x * MG_TL + T_PCOPIED] = gm_now();
		}
		return;
	}

	/* the consumers */
	gt_pos pos = {0, 0, 0};
	const uint32_t ring_sa = gt_sa(ring), xs_sa = gt_sa(xs);
	int rpar = 0;
	for (int l = 0; l < a.L; l++) {
		const mg_layer &ly = a.ly[l];
		unsigned *cnt = a.cnt + (size_t)l * MG_CNT;
		const float *h = l ? a.h + (size_t)l * MG_H : a.hin;
		float *h2 = a.h2 + (size_t)l * MG_H;
		if (l > 0)
			mg_cwait(a.cnt + (size_t)(l - 1) * MG_CNT + C_D, MG_D_TILES, tid);
		mg_mark(a, l, T_START, tid);
		/* qkv */
		if (b < MG_QKV_TILES) {
			mg_stage_norm(h, ly.n1, a.eps, xs, sred, tid);
			mg_mark(a, l, T_QX, tid);
			/* the block's <= 3 tiles (G >= 107), one barrier for all; row sums past x in xs */
			const int n = (MG_QKV_TILES - b + G - 1) / G;
			float *rq = reinterpret_cast<float *>(xs + 2 * MG_CS_H);
			mg_tiles<3>(n, pos, full, empty, ring_sa, xs_sa, rq, warp, lane);
			mg_mark(a, l, T_QT, tid);
			if (tid < 16 * n) {
				const int k = tid >> 4, row = (b + k * G) * 16 + (tid & 15);
				const float y = ldexpf(mg_rowsum_k<3>(rq, k, tid & 15), 14) * ly.qkv_ws2;
				if (row < MG_QR)
					a.q[(size_t)l * MG_QR + row] = y;
				else {
					const int r = row - MG_QR, kv = r / (MG_NKV * MG_HD), rr = r % (MG_NKV * MG_HD);
					if (kv)
						mg_kvrow(ly.vc, tab, ctx - 1, rr / MG_HD, MG_NKV)[rr % MG_HD] = __float2bfloat16_rn(y);
					else
						a.kraw[(size_t)l * MG_NKV * MG_HD + rr] = y;
				}
			}
			mg_cpub(cnt + C_QKV, n, tid);
		}
		mg_mark(a, l, T_QKV, tid);
		/* attention */
		for (int t = b; t < MG_NKV * S; t += G) {
			mg_attn(a, ly, l, t / S, t % S, ctx, S, tab, cnt + C_QKV, reinterpret_cast<float *>(xs), tid, pos, full,
			        empty, ring_sa);
			gt_sync();
		}
		/* the merges, (kv head, query head) m on block m, after its splits */
		if (S > 1)
			for (int m = b; m < MG_NKV * 8; m += G) {
				mg_merge(a, l, m / 8, m % 8, S, reinterpret_cast<float *>(xs), tid);
				gt_sync();
			}
		mg_mark(a, l, T_ATT, tid);
		/* o */
		if (b < MG_O_TILES) {
			/* the residual's and norm's rows loaded before the wait (not after the tile) */
			const float hr = tid < 16 ? __ldcg(h + b * 16 + tid) : 0.0f, nr = tid < 16 ? __ldg(ly.n2 + b * 16 + tid) : 0.0f;
			mg_cwait(cnt + C_ATT, MG_NKV * 8, tid);
			mg_stage_plain(a.att + (size_t)l * MG_QR, MG_QR, xs, MG_CS_Q, tid);
			gt_sync();
			const float *rd = mg_tile_rows(pos, full, empty, ring_sa, xs_sa, MG_CS_Q, 2, red, rpar, warp, lane);
			/* the tile's part of the router's logits: n2 h2 of its 16 rows (hs, past the staged
			 * attention) times its 16 columns of the router (the ring's third stage, [E][16] BF16:
			 * thread t reads expert t / 2's half t % 2, 16 contiguous bytes) */
			float *hs = reinterpret_cast<float *>(xs + 2 * MG_CS_Q);
			if (tid < 16) {
				const int row = b * 16 + tid;
				const float y = hr + ldexpf(mg_rowsum(rd, tid), 14) * ly.o_ws2;
				h2[row] = y;
				hs[tid] = y * nr;
			}
			gt_sync();
			mg_wbar(&full[pos.i], pos.ph, 1, pos.n);
			{
				const float p = mg_router_part(ring_sa + (uint32_t)pos.i * MG_STAGE, hs, tid);
				if (!(tid & 1))
					a.rpart[((size_t)l * MG_O_TILES + b) * MG_E + (tid >> 1)] = p;
			}
			__syncwarp();
			if (lane == 0)
				gt_arrive(&empty[pos.i]);
			gt_next(pos, MG_NS);
			mg_cpub(cnt + C_O, 1, tid);
		}
		mg_mark(a, l, T_O, tid);
		/* the route: x of the experts' gate|up = RMSNorm(h2), the logits and the top-k (every
		 * block; its producer waits on selbar for the experts' copies) */
		mg_cwait(cnt + C_O, MG_O_TILES, tid);
		mg_mark(a, l, T_OSEEN, tid);
		mg_route(a, l, h2, ly.n2, xs, sred, reinterpret_cast<float *>(xs + 2 * MG_CS_H), sel + (l & 1) * MG_K,
		         selw + (l & 1) * MG_K, tid);
		if (tid == 0)
			gt_arrive(&selbar[l & 1]);
		mg_mark(a, l, T_TOPK, tid);
		const int *sl = sel + (l & 1) * MG_K;
		/* the experts' gate|up (their copies wait for the top-k) */
		if (b < MG_K * MG_GU_TILES) {
			/* the block's <= 6 tiles (G >= 128), one barrier for all (the route's scratch past x
			 * is free again) */
			const int n = (MG_K * MG_GU_TILES - b + G - 1) / G;
			float *rq = reinterpret_cast<float *>(xs + 2 * MG_CS_H);
			mg_tiles<6>(n, pos, full, empty, ring_sa, xs_sa, rq, warp, lane);
			if (tid < 8 * n) {
				const int k = tid >> 3, i = tid & 7, j = b + k * G, slot = j / MG_GU_TILES, t = j - slot * MG_GU_TILES;
				const float ws = __ldg(ly.gu_ws2 + sl[slot]);
				const float gt = ldexpf(mg_rowsum_k<6>(rq, k, 2 * i), 14) * ws;
				const float up = ldexpf(mg_rowsum_k<6>(rq, k, 2 * i + 1), 14) * ws;
				mg_put_ready(a.act + ((size_t)l * MG_K + slot) * MG_FI + t * 8 + i, silu_mul(gt, up));
			}
			gt_sync(); /* the row sums read (the down stages its x over them) */
			if (tid == 0)
				mg_pub_hint(cnt + C_GU, n);
		}
		mg_mark(a, l, T_GU, tid);
		/* down, the 8 slots of a row tile summed in order */
		if (b < MG_D_TILES) {
			const float h2r = tid < 16 ? __ldcg(h2 + b * 16 + tid) : 0.0f; /* complete since the route */
			const float dws = __ldg(ly.dn_ws2 + sl[warp]);
			mg_cwait(cnt + C_GU, MG_K * MG_GU_TILES, tid); /* a hint: mg_stage_act waits for the values */
			mg_mark(a, l, T_DSEEN, tid);
			mg_stage_act(a.act + (size_t)l * MG_K * MG_FI, xs, tid);
			gt_sync();
			mg_mark(a, l, T_DACT, tid);
			const float *sw = selw + (l & 1) * MG_K;
			float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
			{
				/* warp w takes slot w's stage whole (its 6 steps: ring slot w / 2, half w % 2),
				 * then hands the 4 slots back (a slot is free once all 8 warps arrived, its
				 * readers among them): one round, not 8 rounds of one step a warp */
				gt_pos q = pos;
				gt_next_n(q, MG_NS, warp >> 1);
				mg_wbar(&full[q.i], q.ph, 1, q.n);
				mg_mark(a, l, T_DLAND, tid);
				/* two MMA chains of 24 (mg_step). Four chains of 12 (steps by parity as well)
				 * measured the same with this loop, and 5-7 % slower with it unrolled whole
				 * (session 51) */
				float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}}, acc2[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
				const uint32_t xc[1] = {xs_sa + warp * 2 * MG_CS_F + (uint32_t)(((lane >> 2) & 1) * MG_CS_F)};
				const uint32_t st = ring_sa + (uint32_t)q.i * MG_STAGE + (uint32_t)(warp & 1) * MG_DSTAGE;
#pragma unroll 2
				for (int s6 = 0; s6 < 6; s6++)
					mg_step<MG_DCB, MG_DSB, false>(acc, acc2, st, s6, xc, 0, lane);
				const float c = sw[warp] * 16384.0f * dws;
#pragma unroll
				for (int e = 0; e < 4; e++)
					tot[e] = c * (acc[0][e] + acc2[0][e]);
				__syncwarp();
				for (int p = 0; p < MG_K / 2; p++) {
					if (lane == 0)
						gt_arrive(&empty[pos.i]);
					gt_next(pos, MG_NS);
				}
			}
			float *rd = mg_red_next(red, rpar);
			mg_rows(tot, rd, warp, lane);
			if (tid < 16) {
				const int row = b * 16 + tid;
				(l == a.L - 1 ? a.hout : a.h + (size_t)(l + 1) * MG_H)[row] = h2r + mg_rowsum(rd, tid);
			}
			mg_cpub(cnt + C_D, 1, tid);
		}
		mg_mark(a, l, T_D, tid);
	}
}
#endif /* MG_HELPERS_ONLY */
#else
#ifndef MG_HELPERS_ONLY
__global__ void mg_kernel(const mg_args a) { (void)a; }
#endif
#endif

#endif
