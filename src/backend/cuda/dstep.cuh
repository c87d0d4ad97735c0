/* dstep.cuh: the one-launch decode step of a dense model of Llama-3-8B's or Qwen3-8B's attention
 * geometry (hidden 4096, 32 query heads over 8 kv heads of 128, NVFP4 weights, BF16 KV; the
 * MLP's width and the layer count are arguments, Qwen3's q / k norms optional). dstep.cu
 * launches it. It is the MoE step's form (mstep.cuh: one cooperative launch for all layers, a
 * layer's phases handing over through counters, a producer warp a block streaming weights into
 * a shared-memory ring in program order) with the dense layer's phases:
 *   qkv   384 tiles of 16 rows, K 4096 in two stages (x = RMSNorm(h)); v into the cache at pos,
 *         k to kraw (the last split of its kv head applies k_norm and rotary and writes it)
 *   attn  8 x S splits of T positions (ds_split_t: S <= G / 8, one round on the grid), a kv
 *         head's 4 query heads each, in chunks of MG_T; with S > 1 then 32 merges, one (kv
 *         head, query head) a block
 *   o     256 tiles (K 4096), h2 = h + o
 *   gu    2 FI / 16 tiles of (gate, up) row pairs (the backend's upload_gate_up), K 4096 (x =
 *         RMSNorm(h2)), SwiGLU out
 *   down  256 tiles, K = FI in FI / 2048 stages, h' = h2 + down
 * Why: a dense layer's four matmuls stream ~120 MB, so its decode is bound by bytes, but the
 * layer path pays ~4 us a launch besides (docs/status.md). Every copy's address is known before
 * the step, so the producer waits for nothing but a free slot. Measured on the H200 (llama3-8b
 * 465 -> 538 tok/s, bench/results/2026-11-30-h200-session42.md; FP4S_DSTEP_TL's marks), what
 * bounds it is the phase chain, not the math (without the tiles' math: +13 %): qkv, attention and
 * o take ~1/3 of a layer as latency while the full ring stops the copies; only gate|up and down
 * stream beyond it. A ninth stage and L2 prefetches of the stages ahead (a second producer warp)
 * did not help: the prefetches made it 6-14 % slower.
 *
 * Every matrix comes by 2-D tensor maps (dstep.cu ds_map): a stage is 16 rows x 2048 K, the
 * codes one box (16 rows of 1024 bytes) and the scales another (16 x 128 bytes, the 128-byte
 * swizzle mg_step reads), so mg_tile's loop serves every phase. The ring has 8 stages (not the
 * MoE step's 10): the down's x (FI <= 14336 values as BF16 hi / lo, 57 KB) takes the room. */
#ifndef FP4S_DSTEP_CUH
#define FP4S_DSTEP_CUH

#ifndef DS_NS
#define DS_NS 8 /* ring stages (9, the most that fits, measured no faster) */
#endif
#define MG_NS DS_NS
#ifndef DS_TMIN
#define DS_TMIN 128 /* an attention split's positions at least */
#endif
#define MG_HELPERS_ONLY
#include "backend/cuda/mstep_kernel.cuh"

#define DS_H 4096
#define DS_NQ 32
#define DS_NKV 8
#define DS_GQ (DS_NQ / DS_NKV) /* query heads a kv head */
#define DS_HD 128
#define DS_QR (DS_NQ * DS_HD)                  /* 4096 */
#define DS_QKV ((DS_NQ + 2 * DS_NKV) * DS_HD)  /* 6144 */
#define DS_FMAX 14336 /* the MLP's width at most (the down's x in shared memory) */
#define DS_QKV_TILES (DS_QKV / 16)
#define DS_O_TILES (DS_H / 16)
#define DS_D_TILES (DS_H / 16)
#define DS_NT 16 /* gate|up tiles a block at most (their row sums held until all are done) */
#define DS_QT 4  /* qkv tiles a block at most */
#define DS_XS (2 * 28704) /* 2 gm_col_stride(DS_FMAX / 32): the down's x */
#define DS_SMEM (MG_NS * MG_STAGE + DS_XS + 2 * MG_W * 16 * 4 + 2 * MG_NS * 8 + 64)

enum { D_QKV, D_ATT, D_O, D_GU, D_D, D_N };
/* timeline marks a block (FP4S_DSTEP_TL): the layer's start (the last one's down seen), qkv's x
 * staged, qkv published, the block's last attention task's q staged, its warp 0's first K stage
 * landed, that warp's first chunk done, its last, the split published, the merge's wait over
 * (blocks 0-31), the attention and merges done,
 * o's wait over, o published, gate|up's wait over, its x staged, gate|up published, the down's
 * wait over, its x staged, the down published */
enum {
	DT_START, DT_QX, DT_QKV, DT_AQ, DT_AK, DT_AC, DT_AL, DT_APUB, DT_MSEEN, DT_ATT,
	DT_OSEEN, DT_O, DT_GSEEN, DT_GX, DT_GU, DT_DSEEN, DT_DX, DT_D, DT_N
};
#define DS_CNT (D_N + DS_NKV) /* counters a layer: the phases', then each kv head's splits */

/* a layer: its NVFP4 tensor scales (the codes and scales come by the maps), the norms' weights
 * (qn, kn NULL: none) and its KV blocks */
struct ds_layer {
	float qkv_ws2, o_ws2, gu_ws2, dn_ws2;
	const float *n1, *n2, *qn, *kn;
	__nv_bfloat16 *kc, *vc; /* [block][MG_KVB][NKV][HD] */
};

enum { DM_QKV, DM_O, DM_GU, DM_DN, DM_N }; /* a layer's matrices; maps [L][DM_N][codes, scales] */

struct ds_args {
	const ds_layer *ly;
	int L, fi; /* layers, the MLP's width (a multiple of 2048, <= DS_FMAX) */
	float eps, scale, mscale;
	const float *inv_freq;
	const int32_t *pos, *seq, *table;
	int table_stride, nb;
	const CUtensorMap *maps;  /* [L][DM_N][2] */
	const CUtensorMap *kvmap; /* [2] (mg_map_kv) */
	const float *hin;
	float *hout;
	float *h, *h2, *q, *kraw, *att;
	float *part; /* [NKV][S][GQ][MG_PS] */
	float *act;  /* [L][fi] */
	unsigned *cnt; /* [L][DS_CNT], zero at launch */
	unsigned long long *tl; /* [G][DT_N] marks of layer tl_layer (NULL: none), zero at launch */
	int tl_layer;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
static __device__ __forceinline__ void ds_mark(const ds_args &a, int l, int ph, int tid)
{
	if (a.tl && l == a.tl_layer && tid == 0)
		a.tl[blockIdx.x * DT_N + ph] = gm_now();
}

/* x = v * rsqrt(mean(v^2) + eps) * nw over 4096, staged (hi, lo) into xs at MG_CS_Q (float4s
 * tid + 256 u a thread, every load in flight at once) */
static __device__ void ds_stage_norm(const float *v, const float *nw, float eps, uint8_t *xs, float *sred, int tid)
{
	float4 x[4], w[4];
#pragma unroll
	for (int u = 0; u < 4; u++) {
		x[u] = __ldcg(reinterpret_cast<const float4 *>(v) + tid + u * MG_W * 32);
		w[u] = __ldg(reinterpret_cast<const float4 *>(nw) + tid + u * MG_W * 32);
	}
	float ss = 0.0f;
#pragma unroll
	for (int u = 0; u < 4; u++)
		ss += x[u].x * x[u].x + x[u].y * x[u].y + x[u].z * x[u].z + x[u].w * x[u].w;
	const float tot = mg_block_sum(ss, sred, tid);
	const float r = 1.0f / sqrtf(tot / (float)DS_H + eps);
#pragma unroll
	for (int u = 0; u < 4; u++)
		mg_put4(xs, MG_CS_Q, 4 * (tid + u * MG_W * 32),
		        make_float4(x[u].x * r * w[u].x, x[u].y * r * w[u].y, x[u].z * r * w[u].z, x[u].w * r * w[u].w),
		        tid & 31);
	gt_sync();
}

/* n (a multiple of 1024, <= DS_FMAX) values of v staged at column stride cs, in rounds of 4
 * float4 loads a thread in flight (the caller's barrier follows). Whether float4 i0 + tid + 256 u
 * is in range is the same for all threads, so mg_put4's lanes all take part. */
static __device__ void ds_stage_plain(const float *v, int n, uint8_t *xs, int cs, int tid)
{
	const int n4 = n / 4;
#pragma unroll 1
	for (int i0 = 0; i0 < n4; i0 += 4 * MG_W * 32) {
		float4 r[4];
#pragma unroll
		for (int u = 0; u < 4; u++)
			if (i0 + u * MG_W * 32 < n4)
				r[u] = __ldcg(reinterpret_cast<const float4 *>(v) + i0 + tid + u * MG_W * 32);
#pragma unroll
		for (int u = 0; u < 4; u++)
			if (i0 + u * MG_W * 32 < n4)
				mg_put4(xs, cs, 4 * (i0 + tid + u * MG_W * 32), r[u], tid & 31);
	}
}

/* n <= NT tiles of nst stages each (x at xs_sa, column stride cs) in ring order, the warps going
 * on to their next tile without waiting for the others: one barrier for all (mg_tiles with
 * several stages a tile). mg_rowsum_k<NT> reads the sums. */
template <int NT>
static __device__ __forceinline__ void ds_tiles(int n, int nst, gt_pos &pos, uint64_t *full, uint64_t *empty,
                                                uint32_t ring_sa, uint32_t xs_sa, int cs, float *red, int warp,
                                                int lane)
{
#pragma unroll 1
	for (int k = 0; k < n; k++) {
		float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
		mg_tile(acc, pos, full, empty, ring_sa, xs_sa, cs, nst, 16, 0, warp, lane);
		if (mg_holds(lane)) {
			red[(warp * NT + k) * 16 + (lane >> 2)] = acc[0][0] + acc[0][1];
			red[(warp * NT + k) * 16 + 8 + (lane >> 2)] = acc[0][2] + acc[0][3];
		}
	}
	gt_sync();
}

/* rotary (and with norm, q_norm / k_norm first: mg_qk_norm_rope) of one head held by a warp, 4
 * dims a lane; norm is the same for the whole warp */
static __device__ __forceinline__ float4 ds_norm_rope(const float4 v, const float4 wv, const float4 c4, const float4 s4,
                                                      float eps, bool norm, int lane)
{
	return norm ? mg_qk_norm_rope(v, wv, c4, s4, eps, lane) : mg_rope4(v, c4, s4, lane);
}

/* positions a split: the context over G / 8 splits a kv head (so that the 8 x S tasks take the
 * grid once), a multiple of 16 (a KV block, the copies' unit) and at least DS_TMIN. S = ctx / T
 * rounded up is then at most G / 8 (dstep.cu sizes the partials so). */
static __device__ __forceinline__ int ds_split_t(int ctx, int G)
{
	const int s0 = G / DS_NKV;
	return max(DS_TMIN, ((ctx + s0 - 1) / s0 + 15) & ~15);
}

static_assert(DS_GQ == 4, "ds_attn_keys_t: the MMA's 8 columns are 4 heads' parts and residuals");

/* x rounded to BF16 and its BF16 residual, packed (x's part in the low half) */
static __device__ __forceinline__ uint32_t ds_hilo(float x)
{
	const __nv_bfloat16 h = __float2bfloat16_rn(x), r = __float2bfloat16_rn(x - __bfloat162float(h));
	return (uint32_t)__bfloat16_as_ushort(h) | ((uint32_t)__bfloat16_as_ushort(r) << 16);
}

/* an 8 x 8 BF16 matrix in the MMA's C / A fragment layout, transposed */
static __device__ __forceinline__ uint32_t ds_movt(uint32_t x)
{
	uint32_t y;
	asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
	return y;
}

/* q's B fragments for ds_attn_keys_t's S^T = K Q^T: column n is head n / 2's q rounded to BF16
 * (n even) or its residual (n odd). Warp w: step w (dims 16 w .. + 16); lane (g, c): column g's
 * dims 2c, 2c + 1 (x) and 2c + 8, 2c + 9 (y). */
static __device__ __forceinline__ void ds_attn_qfrag_t(const float *qs, uint2 *qft, int warp, int lane)
{
	const int g = lane >> 2, c = lane & 3;
	const float *qg = qs + (g >> 1) * DS_HD + 16 * warp + 2 * c;
	const float2 x0 = *reinterpret_cast<const float2 *>(qg), x1 = *reinterpret_cast<const float2 *>(qg + 8);
	uint32_t l0, l1;
	const uint32_t h0 = gm_split(x0.x, x0.y, l0), h1 = gm_split(x1.x, x1.y, l1);
	qft[warp * 32 + lane] = (g & 1) ? make_uint2(l0, l1) : make_uint2(h0, h1);
}

/* mg_attn_keys for 4 heads, transposed: S^T = K Q^T and O^T = V^T P^T, with the 16 keys (then 16
 * dims) as the MMA's rows and the heads' BF16 parts and residuals as its 8 columns. Every row and
 * column carries data, where mg_attn_keys's rows 4-7 and 12-15 are zeros with 4 heads: half the
 * MMAs, half the P V accumulators, and no spills (llama3-8b +1.1 % / +1.8 % at tg128 / depth 4096,
 * qwen3-8b +1.5 % / +1.1 %, session 56). The scores come out a head a lane group, the wrong way
 * round for P V's B fragment; movmatrix turns them (two a chunk). Lane (g, c) works on head c: the
 * scores of keys kw + g and kw + g + 8; m: head c's running max (the same in its 8 lanes); l: the
 * lane's part of head c's sum; o[dp]: dims 16 dp + g (0: part, 1: residual) and + 8 (2, 3). qb:
 * ds_attn_qfrag_t's fragments, held. The rest as mg_attn_keys. */
template <typename KAt, typename VAt, typename DoneK, typename WaitV>
static __device__ __forceinline__ void ds_attn_keys_t(const uint2 (&qb)[DS_HD / 16], int kw, int n, KAt kat, VAt vat,
                                                      DoneK done_k, WaitV wait_v, float &m, float &l,
                                                      float (&o)[DS_HD / 16][4], int lane)
{
	const int g = lane >> 2, j = lane >> 3, r = lane & 7;
	/* lane j * 8 + r: matrix j's row r = key kw + 8 (j >> 1) + r, chunk 2 s + (j & 1) (dims lo /
	 * hi of step s): K's matrices are A's fragments 0, 2, 1, 3, V's transposed 0, 1, 2, 3 */
	const int key = min(kw + 8 * (j >> 1) + r, n - 1);
	constexpr int NC = 4; /* independent accumulator chains (2 measured the same, session 56) */
	float s[NC][4];
#pragma unroll
	for (int u = 0; u < NC; u++)
		s[u][0] = s[u][1] = s[u][2] = s[u][3] = 0.0f;
#pragma unroll
	for (int kk = 0; kk < DS_HD / 16; kk++) {
		uint32_t a0, a1, a2, a3;
		mg_ldsm4(kat(key, 2 * kk + (j & 1)), a0, a2, a1, a3);
		gm_mma(s[kk % NC], a0, a1, a2, a3, qb[kk].x, qb[kk].y);
	}
	float y0 = s[0][0] + s[0][1], y1 = s[0][2] + s[0][3];
#pragma unroll
	for (int u = 1; u < NC; u++)
		y0 += s[u][0] + s[u][1], y1 += s[u][2] + s[u][3];
	const float x0 = kw + g < n ? y0 : -INFINITY, x1 = kw + g + 8 < n ? y1 : -INFINITY;
	done_k();
	float mx = fmaxf(x0, x1);
	mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 4));
	mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 8));
	mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 16));
	const float mn = fmaxf(m, mx); /* finite: key kw < n */
	const float al = exp2f(m - mn);
	const bool resc = __any_sync(0xFFFFFFFFu, al != 1.0f && m != -INFINITY);
	m = mn;
	const float p0 = exp2f(x0 - mn), p1 = exp2f(x1 - mn);
	l = l * al + (p0 + p1);
	if (resc)
#pragma unroll
		for (int t = 0; t < DS_HD / 16; t++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				o[t][e] *= al;
	/* P^T's B fragments: keys 2c, 2c + 1 (b0; + 8: b1) of column g */
	const uint32_t b0 = ds_movt(ds_hilo(p0)), b1 = ds_movt(ds_hilo(p1));
	wait_v();
#pragma unroll
	for (int dp = 0; dp < DS_HD / 16; dp++) {
		uint32_t a0, a1, a2, a3;
		mg_ldsm4t(vat(key, 2 * dp + (j & 1)), a0, a1, a2, a3);
		gm_mma(o[dp], a0, a1, a2, a3, b0, b1);
	}
}

/* ds_attn_keys_t's split into shared memory, as mg_attn_put's */
static __device__ __forceinline__ void ds_attn_put_t(float m, float l, const float (&o)[DS_HD / 16][4], float *mw,
                                                     float *lw, float *ow, int warp, int lane)
{
	const int g = lane >> 2, c = lane & 3;
	l += __shfl_xor_sync(0xFFFFFFFFu, l, 4);
	l += __shfl_xor_sync(0xFFFFFFFFu, l, 8);
	l += __shfl_xor_sync(0xFFFFFFFFu, l, 16);
	if (g == 0)
		mw[warp * DS_GQ + c] = m, lw[warp * DS_GQ + c] = l;
	float *row = ow + (warp * DS_GQ + c) * MG_OWS + g; /* MG_OWS % 32 = 8: conflict-free */
#pragma unroll
	for (int dp = 0; dp < DS_HD / 16; dp++)
		row[16 * dp] = o[dp][0] + o[dp][1], row[16 * dp + 8] = o[dp][2] + o[dp][3];
}

/* one attention split: kv head g's 4 query heads over positions [s T, min(ctx, (s + 1) T)), in
 * chunks of MG_T keys, a warp at a time (ds_attn_keys_t, mstep_kernel.cuh mg_attn_keys transposed).
 * Why chunks: a split of T > MG_T keys would hold its whole K and V in the ring (T = 272 at depth
 * 4096 on 132 SMs: 17 stages of the ring's 8); a chunk's stages go back to the producer as the
 * warps finish with them, so the next chunk's copies overlap this one's math. Why a warp at a time:
 * with the block-wide form (mg_attn: scores, softmax and P V each behind a barrier) a split of 272
 * keys took 9.7 us on the H200, this form 7.5 (llama3-8b at depth 4096, FP4S_DSTEP_TL;
 * bench/results/2026-11-30-h200-session43.md). */
static __device__ void ds_attn(const ds_args &a, const ds_layer &ly, int l, int g, int s, int ctx, int T, int S,
                               const int32_t *tab, const unsigned *qkv_cnt, float *scr, int tid, gt_pos &rp,
                               uint64_t *full, uint64_t *empty, uint32_t ring_sa)
{
	const int warp = tid >> 5, lane = tid & 31, pos = ctx - 1;
	const int t0 = s * T, t1 = min(ctx, t0 + T);
	/* scratch: q [8][128], pos's K and V rows (bf16), q's fragments [8][32] (uint2, in uint4's
	 * room), the warps' max and sum [8][4] each, their sums [8][4][MG_OWS] */
	float *qs = scr;
	uint4 *kvp = reinterpret_cast<uint4 *>(scr + 8 * DS_HD);
	uint2 *qfs = reinterpret_cast<uint2 *>(kvp + 32);
	float *mw = reinterpret_cast<float *>(kvp + 32 + MG_W * 32), *lw = mw + MG_W * DS_GQ, *ow = lw + MG_W * DS_GQ;
	const uint32_t kp_sa = gt_sa(kvp), vp_sa = kp_sa + DS_HD * 2;
	{
		/* warp h < 4: head h's q; the rest write zeros into rows 4-7 (not read); in the last split warp 7
		 * also finishes k at pos and threads 0-15 stage v's row (mg_attn) */
		const bool norm = ly.qn != nullptr, last = t1 == ctx, kw7 = last && warp == MG_W - 1;
		const float4 one = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
		const float4 qw = norm ? __ldg(reinterpret_cast<const float4 *>(ly.qn) + lane) : one;
		const float4 kw = norm && kw7 ? __ldg(reinterpret_cast<const float4 *>(ly.kn) + lane) : one;
		float4 c4, s4;
		mg_rope_ld(a.inv_freq, a.mscale, pos, lane, c4, s4);
		float4 kr = make_float4(0.0f, 0.0f, 0.0f, 0.0f), v = kr;
		mg_cwait(qkv_cnt, DS_QKV_TILES, tid);
		if (warp < DS_GQ)
			v = __ldcg(reinterpret_cast<const float4 *>(a.q + (size_t)l * DS_QR + g * DS_GQ * DS_HD) + tid);
		if (kw7)
			kr = __ldcg(reinterpret_cast<const float4 *>(a.kraw + ((size_t)l * DS_NKV + g) * DS_HD) + lane);
		if (last && tid < 16)
			kvp[16 + tid] = __ldcg(reinterpret_cast<const uint4 *>(mg_kvrow(ly.vc, tab, pos, g, DS_NKV)) + tid);
		if (warp < DS_GQ) {
			const float4 qr = ds_norm_rope(v, qw, c4, s4, a.eps, norm, lane);
			const float sc2 = a.scale * 1.4426950408889634f; /* log2 e: ds_attn_keys_t's exp2f */
			reinterpret_cast<float4 *>(qs)[tid] = make_float4(qr.x * sc2, qr.y * sc2, qr.z * sc2, qr.w * sc2);
		} else
			reinterpret_cast<float4 *>(qs)[tid] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		if (kw7) {
			mg_k_store(ds_norm_rope(kr, kw, c4, s4, a.eps, norm, lane), kvp, mg_kvrow(ly.kc, tab, pos, g, DS_NKV), lane);
		}
	}
	gt_sync();
	ds_mark(a, l, DT_AQ, tid); /* the block's last task's */
	ds_attn_qfrag_t(qs, qfs, warp, lane);
	gt_sync();
	uint2 qb[DS_HD / 16]; /* held: 16 registers, where mg_attn_keys loads a step's from shared memory */
#pragma unroll
	for (int kk = 0; kk < DS_HD / 16; kk++)
		qb[kk] = qfs[kk * 32 + lane];
	float m = -INFINITY, lsum = 0.0f, o[DS_HD / 16][4];
#pragma unroll
	for (int t = 0; t < DS_HD / 16; t++)
		o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
	const int kw = 16 * warp; /* the warp's keys in a chunk: kw .. + 16, in its stages kw / 64 */
#pragma unroll 1
	for (int a0 = t0; a0 < t1; a0 += MG_T) {
		const int n = min(t1, a0 + MG_T) - a0, mm = mg_ring_m(ctx, a0, a0 + n), nk = (mm + 63) / 64;
		/* the chunk's stages: K c at rp + c, V c at rp + nk + c. use: key kw (and so all of the
		 * warp's stage sk) came through the ring. The warp gives its K stage back to the producer
		 * once its scores are summed and its V stage after P V (both at the chunk's end measured
		 * within noise, session 43), the others at the chunk's start once landed: a warp's
		 * arrival on a stage not yet filled could count toward the slot's previous use while
		 * another warp still reads it. At the start, not after its keys: off the chain from the
		 * warp's last P V to its next chunk (llama3-8b +1.0 % at depth 4096, session 55; the
		 * stages have landed by then, their copies issued a chunk or more ahead). */
		const int sk = warp >> 2;
		const bool use = kw < mm;
		gt_pos kq = rp, vq = rp;
		gt_next_n(kq, MG_NS, sk);
		gt_next_n(vq, MG_NS, nk + sk);
		if (lane == 0)
			for (int c = 0; c < 2 * nk; c++) {
				if (!(use && (c == sk || c == nk + sk))) {
					mg_wbar(&full[rp.i], rp.ph, 2, rp.n);
					gt_arrive(&empty[rp.i]);
				}
				gt_next(rp, MG_NS);
			}
		else
			gt_next_n(rp, MG_NS, 2 * nk);
		if (kw < n) {
			if (use)
				mg_wbar(&full[kq.i], kq.ph, 2, kq.n);
			if (a0 == t0)
				ds_mark(a, l, DT_AK, tid);
			const uint32_t kst = ring_sa + (uint32_t)kq.i * MG_STAGE, vst = ring_sa + (uint32_t)vq.i * MG_STAGE;
			/* by selects (mg_kv_sa_or): ds_attn_keys_t asks for one key a lane, so its row is worked
			 * out once, not behind a branch in each step (llama3-8b +1 %, session 55) */
			ds_attn_keys_t(
				qb, kw, n,
				[&](int i, int c) -> uint32_t { return mg_kv_sa_or(a0 + i < pos, kst, kp_sa, i, c); },
				[&](int i, int c) -> uint32_t { return mg_kv_sa_or(a0 + i < pos, vst, vp_sa, i, c); },
				[&] {
					if (use && lane == 0)
						gt_arrive(&empty[kq.i]);
				},
				[&] {
					if (use)
						mg_wbar(&full[vq.i], vq.ph, 2, vq.n);
				},
				m, lsum, o, lane);
			if (use && lane == 0)
				gt_arrive(&empty[vq.i]);
			if (a0 == t0)
				ds_mark(a, l, DT_AC, tid);
		}
	}
	ds_mark(a, l, DT_AL, tid);
	ds_attn_put_t(m, lsum, o, mw, lw, ow, warp, lane);
	gt_sync();
	/* thread: head h = tid / 64's dims d, d + 1, the warps' sums weighed by exp(max_w - max) */
	const int h = tid >> 6, d = 2 * (tid & 63);
	/* mstep_kernel.cuh mg_attn_combine's loops written out: as its call this kernel's code
	 * changed, and no device time was left to measure that (session 45) */
	float M = -INFINITY;
#pragma unroll
	for (int w = 0; w < MG_W; w++)
		M = fmaxf(M, mw[w * DS_GQ + h]);
	float L = 0.0f, ox = 0.0f, oy = 0.0f;
#pragma unroll
	for (int w = 0; w < MG_W; w++) {
		const float f = exp2f(mw[w * DS_GQ + h] - M);
		const float2 v = *reinterpret_cast<const float2 *>(ow + (w * DS_GQ + h) * MG_OWS + d);
		L += f * lw[w * DS_GQ + h];
		ox += f * v.x, oy += f * v.y;
	}
	unsigned *cnt = a.cnt + (size_t)l * DS_CNT;
	if (S == 1) {
		const float inv = 1.0f / L;
		*reinterpret_cast<float2 *>(a.att + (size_t)l * DS_QR + (g * DS_GQ + h) * DS_HD + d) =
			make_float2(ox * inv, oy * inv);
		mg_cpub(cnt + D_ATT, DS_GQ, tid);
		return;
	}
	float *pp = a.part + (((size_t)g * S + s) * DS_GQ + h) * MG_PS;
	mg_put_ready(pp + d, ox), mg_put_ready(pp + d + 1, oy);
	if (d == 0) /* the max back in natural units for the merge; L >= 1 */
		mg_put_ready(pp + DS_HD, M * 0.6931471805599453f), mg_put_ready(pp + DS_HD + 1, L);
	gt_sync();
	if (tid == 0)
		mg_pub_hint(cnt + D_N + g, 1);
	ds_mark(a, l, DT_APUB, tid);
}

/* A split's partial carries its readiness (mg_put_ready: never all-zero bits) and its count is a
 * relaxed hint, as the MoE step's act: a release count waits until the block's stores are
 * acknowledged, and those queue behind the o tiles' copies landing (2.1 us a layer at depth 4096
 * on the H200; the merge's att reached o 0.8-1.2 us sooner this way, +0.8 % llama3-8b and +2.6 %
 * qwen3-8b tg@4096, bench/results/2026-12-01-h200-session57.md). The buffer is zero before every
 * layer's splits: cleared once when allocated, and each merge zeroes what it read before its
 * release of att (which orders that ahead of the next layer's splits). */
static __device__ __forceinline__ unsigned ds_ld_relaxed(const float *p)
{
	unsigned u;
	asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(u) : "l"(p) : "memory");
	return u;
}

/* mg_merge_rounds with ready loads, 16 splits a round (S <= SMs / 8: one round on 132 SMs), two
 * a warp: every load issued before any is checked (a check waits for its load). Only splits < S
 * are loaded, and each warp zeroes the sums it read; the max and sum words are read by every
 * warp, so the caller zeroes them after its barrier. */
static __device__ __forceinline__ float4 ds_merge_rounds_ready(float *p0, size_t ps, int S, float *Lsum_out, int warp,
                                                               int lane)
{
	float M = -INFINITY, Lsum = 0.0f;
	float4 O = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
	const float4 one = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
#pragma unroll 1
	for (int j0 = 0; j0 < S; j0 += 2 * MG_W) {
		const int ja = j0 + warp, jb = ja + MG_W, jm = j0 + (lane & 15);
		float4 va = ja < S ? mg_ld_ready4(p0 + ja * ps + 4 * lane) : one;
		float4 vb = jb < S ? mg_ld_ready4(p0 + jb * ps + 4 * lane) : one;
		unsigned mu = jm < S ? ds_ld_relaxed(p0 + jm * ps + DS_HD) : 1u;
		unsigned lu = jm < S ? ds_ld_relaxed(p0 + jm * ps + DS_HD + 1) : 1u;
		while (!mg_ready4(va))
			va = mg_ld_ready4(p0 + ja * ps + 4 * lane);
		while (!mg_ready4(vb))
			vb = mg_ld_ready4(p0 + jb * ps + 4 * lane);
		while (!mu)
			mu = ds_ld_relaxed(p0 + jm * ps + DS_HD);
		while (!lu)
			lu = ds_ld_relaxed(p0 + jm * ps + DS_HD + 1);
		const float mj = jm < S ? __uint_as_float(mu) : -INFINITY, lj = jm < S ? __uint_as_float(lu) : 0.0f;
		float Mn = mj; /* lanes 16-31 repeat lanes 0-15 */
		for (int o = 8; o; o >>= 1)
			Mn = fmaxf(Mn, __shfl_xor_sync(0xFFFFFFFFu, Mn, o));
		Mn = fmaxf(M, Mn);
		const float r = expf(M - Mn); /* 0 in the first round */
		M = Mn;
		const float f = jm < S ? expf(mj - M) : 0.0f;
		float Lr = f * lj;
		for (int o = 8; o; o >>= 1)
			Lr += __shfl_xor_sync(0xFFFFFFFFu, Lr, o);
		Lsum = Lsum * r + Lr;
		const float fa = __shfl_sync(0xFFFFFFFFu, f, warp), fb = __shfl_sync(0xFFFFFFFFu, f, warp + MG_W);
		const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		O.x *= r, O.y *= r, O.z *= r, O.w *= r;
		if (ja < S) {
			O.x += fa * va.x, O.y += fa * va.y, O.z += fa * va.z, O.w += fa * va.w;
			*reinterpret_cast<float4 *>(p0 + ja * ps + 4 * lane) = z;
		}
		if (jb < S) {
			O.x += fb * vb.x, O.y += fb * vb.y, O.z += fb * vb.z, O.w += fb * vb.w;
			*reinterpret_cast<float4 *>(p0 + jb * ps + 4 * lane) = z;
		}
	}
	*Lsum_out = Lsum;
	return O;
}

/* kv head g's query head h: its S splits merged (mg_merge with 4 heads a kv head) */
static __device__ void ds_merge(const ds_args &a, int l, int g, int h, int S, float *scr, int tid)
{
	const int warp = tid >> 5, lane = tid & 31;
	unsigned *cnt = a.cnt + (size_t)l * DS_CNT;
	mg_cwait(cnt + D_N + g, (unsigned)S, tid);
	ds_mark(a, l, DT_MSEEN, tid);
	float Lsum;
	float *p0 = a.part + ((size_t)g * S * DS_GQ + h) * MG_PS;
	const float4 O = ds_merge_rounds_ready(p0, (size_t)DS_GQ * MG_PS, S, &Lsum, warp, lane);
	float4 *red4 = reinterpret_cast<float4 *>(scr);
	red4[warp * 32 + lane] = O;
	gt_sync();
	if (warp == 1) /* every warp has read the max and sum words (the barrier above): zeroed */
		for (int j = lane; j < S; j += 32)
			*reinterpret_cast<float2 *>(p0 + (size_t)j * DS_GQ * MG_PS + DS_HD) = make_float2(0.0f, 0.0f);
	if (warp == 0) {
		float4 t = red4[lane];
#pragma unroll
		for (int w = 1; w < MG_W; w++) {
			const float4 q = red4[w * 32 + lane];
			t.x += q.x, t.y += q.y, t.z += q.z, t.w += q.w;
		}
		const float inv = 1.0f / Lsum;
		*reinterpret_cast<float4 *>(a.att + (size_t)l * DS_QR + (g * DS_GQ + h) * DS_HD + 4 * lane) =
			make_float4(t.x * inv, t.y * inv, t.z * inv, t.w * inv);
	}
	mg_cpub(cnt + D_ATT, 1, tid);
}

/* block b's stages in the order its consumers take them: tile(m, c, j) for stage c of tile j of
 * the matrix whose maps are m, m + 1; kvs(kv, g, blk, nblk) for a K (kv 0) or V stage of kv head
 * g: nblk cache blocks (their indices in the pools at blk) */
template <typename TileF, typename KvF>
static __device__ __forceinline__ void ds_walk(const ds_args &a, int b, int G, int ctx, int T, int S,
                                               const int32_t *tab, TileF tile, KvF kvs)
{
	const int gu_tiles = 2 * a.fi / 16, dst = a.fi / 2048;
	for (int l = 0; l < a.L; l++) {
		const CUtensorMap *m = a.maps + (size_t)l * DM_N * 2;
		for (int j = b; j < DS_QKV_TILES; j += G)
			for (int c = 0; c < 2; c++)
				tile(m + 2 * DM_QKV, c, j);
		for (int t = b; t < DS_NKV * S; t += G) {
			const int g = t / S, t0 = t % S * T, t1 = min(ctx, t0 + T);
			for (int a0 = t0; a0 < t1; a0 += MG_T) { /* ds_attn's chunks */
				const int mm = mg_ring_m(ctx, a0, min(t1, a0 + MG_T));
				for (int kv = 0; kv < 2; kv++)
					for (int c0 = 0; c0 < mm; c0 += 64) {
						const int nblk = (min(64, mm - c0) + MG_KVB - 1) / MG_KVB;
						int blk[4];
#pragma unroll
						for (int i = 0; i < 4; i++)
							blk[i] = i < nblk ? l * a.nb + __ldg(tab + (a0 + c0) / MG_KVB + i) : 0;
						kvs(kv, g, blk, nblk);
					}
			}
		}
		for (int j = b; j < DS_O_TILES; j += G)
			for (int c = 0; c < 2; c++)
				tile(m + 2 * DM_O, c, j);
		for (int j = b; j < gu_tiles; j += G)
			for (int c = 0; c < 2; c++)
				tile(m + 2 * DM_GU, c, j);
		for (int j = b; j < DS_D_TILES; j += G)
			for (int c = 0; c < dst; c++)
				tile(m + 2 * DM_DN, c, j);
	}
}

__global__ void __launch_bounds__(MG_THREADS, 1) ds_kernel(const ds_args a)
{
	extern __shared__ __align__(1024) uint8_t smem[];
	uint8_t *ring = smem;
	uint8_t *xs = ring + MG_NS * MG_STAGE;
	float *red = reinterpret_cast<float *>(xs + DS_XS); /* [2][8][16] */
	uint64_t *full = reinterpret_cast<uint64_t *>(red + 2 * MG_W * 16);
	uint64_t *empty = full + MG_NS;
	float *sred = reinterpret_cast<float *>(empty + MG_NS); /* [8] */
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
	const int b = blockIdx.x, G = gridDim.x;
	const int ctx = __ldg(a.pos) + 1, T = ds_split_t(ctx, G), S = (ctx + T - 1) / T;
	const int32_t *tab = a.table + (size_t)__ldg(a.seq) * a.table_stride;
	const int gu_tiles = 2 * a.fi / 16, dst = a.fi / 2048; /* the down's stages a tile */
	const int cs_f = gm_col_stride(a.fi / 32);
	if (tid == 0) {
		if (gt_sa(ring) & 1023) /* the K / V stages' swizzle counts lines from 1024-byte bounds */
			__trap();
		for (int i = 0; i < MG_NS; i++) {
			gt_init(&full[i], 1);
			gt_init(&empty[i], MG_W);
		}
		asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
	}
	__syncthreads();

	if (warp == MG_W) { /* the producer: every stage into the ring in the consumers' order */
		if (lane)
			return;
		uint64_t pol;
		asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
		gt_pos pp = {0, 0, 0};
		auto slot = [&](unsigned bytes) { /* the next ring slot, once free, expecting bytes */
			mg_wbar(&empty[pp.i], pp.ph ^ 1u, 3, pp.n);
			gt_expect(&full[pp.i], bytes);
			return ring + (size_t)pp.i * MG_STAGE;
		};
		ds_walk(a, b, G, ctx, T, S, tab,
		        [&](const CUtensorMap *m, int c, int j) {
			        uint8_t *d = slot(MG_STAGE);
			        gt_copy_2d(d, m, 128 * c, 16 * j, &full[pp.i], pol);
			        gt_copy_2d(d + 16 * MG_CB, m + 1, 128 * c, 16 * j, &full[pp.i], pol);
			        gt_next(pp, MG_NS);
		        },
		        [&](int kv, int g, const int *blk, int nblk) {
			        uint8_t *d = slot((unsigned)nblk * 4096);
			        for (int i = 0; i < nblk; i++)
				        mg_copy_5d(d + i * 4096, a.kvmap + kv, 0, 0, 0, g, blk[i], &full[pp.i], pol);
			        gt_next(pp, MG_NS);
		        });
		return;
	}

	gt_pos pos = {0, 0, 0};
	const uint32_t ring_sa = gt_sa(ring), xs_sa = gt_sa(xs);
	int rpar = 0;
	for (int l = 0; l < a.L; l++) {
		const ds_layer &ly = a.ly[l];
		unsigned *cnt = a.cnt + (size_t)l * DS_CNT;
		const float *h = l ? a.h + (size_t)l * DS_H : a.hin;
		float *h2 = a.h2 + (size_t)l * DS_H;
		if (l > 0)
			mg_cwait(a.cnt + (size_t)(l - 1) * DS_CNT + D_D, DS_D_TILES, tid);
		ds_mark(a, l, DT_START, tid);
		/* qkv: the block's <= 4 tiles, one barrier for all; row sums past x in xs */
		if (b < DS_QKV_TILES) {
			ds_stage_norm(h, ly.n1, a.eps, xs, sred, tid);
			ds_mark(a, l, DT_QX, tid);
			const int n = (DS_QKV_TILES - b + G - 1) / G;
			float *rq = reinterpret_cast<float *>(xs + 2 * MG_CS_Q);
			ds_tiles<DS_QT>(n, 2, pos, full, empty, ring_sa, xs_sa, MG_CS_Q, rq, warp, lane);
			if (tid < 16 * n) {
				const int k = tid >> 4, row = (b + k * G) * 16 + (tid & 15);
				const float y = ldexpf(mg_rowsum_k<DS_QT>(rq, k, tid & 15), 14) * ly.qkv_ws2;
				if (row < DS_QR)
					a.q[(size_t)l * DS_QR + row] = y;
				else {
					const int r = row - DS_QR, kv = r / (DS_NKV * DS_HD), rr = r % (DS_NKV * DS_HD);
					if (kv)
						mg_kvrow(ly.vc, tab, ctx - 1, rr / DS_HD, DS_NKV)[rr % DS_HD] = __float2bfloat16_rn(y);
					else
						a.kraw[(size_t)l * DS_NKV * DS_HD + rr] = y;
				}
			}
			mg_cpub(cnt + D_QKV, n, tid);
			ds_mark(a, l, DT_QKV, tid);
		}
		for (int t = b; t < DS_NKV * S; t += G) {
			ds_attn(a, ly, l, t / S, t % S, ctx, T, S, tab, cnt + D_QKV, reinterpret_cast<float *>(xs), tid, pos, full,
			        empty, ring_sa);
			gt_sync();
		}
		if (S > 1)
			for (int m = b; m < DS_NQ; m += G) {
				ds_merge(a, l, m / DS_GQ, m % DS_GQ, S, reinterpret_cast<float *>(xs), tid);
				gt_sync();
			}
		if (b < DS_NKV * S || (S > 1 && b < DS_NQ))
			ds_mark(a, l, DT_ATT, tid);
		/* o: h2 = h + o */
		if (b < DS_O_TILES) {
			mg_cwait(cnt + D_ATT, DS_NQ, tid);
			ds_mark(a, l, DT_OSEEN, tid);
			ds_stage_plain(a.att + (size_t)l * DS_QR, DS_QR, xs, MG_CS_Q, tid);
			gt_sync();
			int n = 0;
			for (int j = b; j < DS_O_TILES; j += G, n++) {
				const float hr = tid < 16 ? __ldcg(h + j * 16 + tid) : 0.0f;
				const float *rd = mg_tile_rows(pos, full, empty, ring_sa, xs_sa, MG_CS_Q, 2, red, rpar, warp, lane);
				if (tid < 16)
					h2[j * 16 + tid] = hr + ldexpf(mg_rowsum(rd, tid), 14) * ly.o_ws2;
			}
			mg_cpub(cnt + D_O, n, tid);
			ds_mark(a, l, DT_O, tid);
		}
		/* gate|up: x = RMSNorm(h2), the block's <= 16 tiles, SwiGLU of each row pair */
		if (b < gu_tiles) {
			mg_cwait(cnt + D_O, DS_O_TILES, tid);
			ds_mark(a, l, DT_GSEEN, tid);
			ds_stage_norm(h2, ly.n2, a.eps, xs, sred, tid);
			ds_mark(a, l, DT_GX, tid);
			const int n = (gu_tiles - b + G - 1) / G;
			float *rq = reinterpret_cast<float *>(xs + 2 * MG_CS_Q);
			ds_tiles<DS_NT>(n, 2, pos, full, empty, ring_sa, xs_sa, MG_CS_Q, rq, warp, lane);
			if (tid < 8 * n) {
				const int k = tid >> 3, i = tid & 7, j = b + k * G;
				const float gt = ldexpf(mg_rowsum_k<DS_NT>(rq, k, 2 * i), 14) * ly.gu_ws2;
				const float up = ldexpf(mg_rowsum_k<DS_NT>(rq, k, 2 * i + 1), 14) * ly.gu_ws2;
				a.act[(size_t)l * a.fi + j * 8 + i] = silu_mul(gt, up);
			}
			mg_cpub(cnt + D_GU, n, tid);
			ds_mark(a, l, DT_GU, tid);
		}
		/* down: h' = h2 + down(act) (h2 complete since the gate|up's wait) */
		if (b < DS_D_TILES) {
			float *ho = l == a.L - 1 ? a.hout : a.h + (size_t)(l + 1) * DS_H;
			mg_cwait(cnt + D_GU, (unsigned)gu_tiles, tid);
			ds_mark(a, l, DT_DSEEN, tid);
			ds_stage_plain(a.act + (size_t)l * a.fi, a.fi, xs, cs_f, tid);
			gt_sync();
			ds_mark(a, l, DT_DX, tid);
			int n = 0;
			for (int j = b; j < DS_D_TILES; j += G, n++) {
				const float hr = tid < 16 ? __ldcg(h2 + j * 16 + tid) : 0.0f;
				const float *rd = mg_tile_rows(pos, full, empty, ring_sa, xs_sa, cs_f, dst, red, rpar, warp, lane);
				if (tid < 16)
					ho[j * 16 + tid] = hr + ldexpf(mg_rowsum(rd, tid), 14) * ly.dn_ws2;
			}
			mg_cpub(cnt + D_D, n, tid);
			ds_mark(a, l, DT_D, tid);
		}
	}
}
#else
__global__ void ds_kernel(const ds_args a) { (void)a; }
#endif

#endif
