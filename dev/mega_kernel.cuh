/* mega_kernel.cuh: dev/mega_bench.cu's persistent decode step: the attention split (K and V
 * rows before pos through the ring, the last split of a kv head merging), the producer's top-k
 * and the kernel (mega_step.cuh describes the design). */
#ifndef FP4S_MEGA_KERNEL_CUH
#define FP4S_MEGA_KERNEL_CUH

#include "mega_step.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* the attention's scores for HP local heads a lane (qs: the group's first head), position t0 +
 * 32 (warp & 3) + lane; K rows before pos from the ring stages ks0 / ks1 (aring), pos's from
 * kp_sa (staged with q) */
template <int HP>
static __device__ __forceinline__ void mg_scores(const float *qs, float *sc, const __nv_bfloat16 *kc, int t0, int n,
                                                 int pos, bool aring, uint32_t ks0, uint32_t ks1, uint32_t kp_sa,
                                                 int warp, int lane)
{
	const int tl = 32 * (warp & 3) + lane, h0 = HP * (warp >> 2);
	if (tl >= n)
		return;
	const int t = t0 + tl;
	const uint4 *kr = reinterpret_cast<const uint4 *>(kc + (size_t)t * MG_HD);
	float d[HP];
#pragma unroll
	for (int h = 0; h < HP; h++)
		d[h] = 0.0f;
	const bool ring = t < pos && aring, sm = ring || t == pos; /* from shared memory */
	const uint32_t ks = ring ? ((tl >> 6) ? ks1 : ks0) + (uint32_t)(tl & 63) * 256 : kp_sa;
	/* chunk ch of the row is stored at ch ^ (t & 7) (MG_KVSW): the 8 rows a quarter-warp reads
	 * fall on 8 different banks */
	const int sw = t & 7;
#pragma unroll
	for (int half = 0; half < 2; half++) {
		uint4 kv[8];
#pragma unroll
		for (int c = 0; c < 8; c++) {
			const int ch = (half * 8 + c) ^ sw;
			kv[c] = sm ? gm_lds128(ks + ch * 16) : __ldg(kr + ch);
		}
#pragma unroll
		for (int c = 0; c < 8; c++) {
			const __nv_bfloat162 *k2 = reinterpret_cast<const __nv_bfloat162 *>(&kv[c]);
			const int d0 = (half * 8 + c) * 8;
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const float2 kf = __bfloat1622float2(k2[e]);
#pragma unroll
				for (int h = 0; h < HP; h++) {
					const float2 q = *reinterpret_cast<const float2 *>(qs + (h0 + h) * MG_HD + d0 + 2 * e);
					d[h] += q.x * kf.x + q.y * kf.y;
				}
			}
		}
	}
#pragma unroll
	for (int h = 0; h < HP; h++)
		sc[(h0 + h) * MG_T + tl] = d[h];
}

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

/* The attention's two products on the tensor cores (a.amma; 8 heads a task, K and V through the
 * ring). mma m16n8k16 with M = 16 rows: rows 0-7 the 8 heads' q (or P) rounded to BF16, rows
 * 8-15 the BF16 residual, so that the row g + row g + 8 sum carries them to ~16 bits; K and V are
 * BF16 already. The swizzled rows (MG_KVSW) make the ldmatrix reads conflict-free.
 * S = Q K^T: warp w takes keys 16 w .. + 16 (two n-tiles), K = the 128 dims in 8 steps; one
 * ldmatrix.x4 a step gives both n-tiles' B fragments. row(i): key i's row in shared memory. */
template <typename RowF>
static __device__ __forceinline__ void mg_qk_mma(const float *qs, float *sc, int t0, int n, RowF row, int warp,
                                                 int lane)
{
	if (16 * warp >= n)
		return;
	const int g = lane >> 2, c = lane & 3, j = lane >> 3, r = lane & 7;
	/* lane j * 8 + r: matrix j's row r = key 16 w + 8 (j >> 1) + r, chunk 2 kk + (j & 1) */
	const int key = min(16 * warp + 8 * (j >> 1) + r, n - 1);
	const uint32_t ra = row(key);
	const int swz = (t0 + key) & 7;
	const float *qg = qs + g * MG_HD + 2 * c;
	float s0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, s1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 2
	for (int kk = 0; kk < MG_HD / 16; kk++) {
		uint32_t b0, b1, b2, b3;
		mg_ldsm4(ra + (uint32_t)(((2 * kk + (j & 1)) ^ swz) << 4), b0, b1, b2, b3);
		const float2 x0 = *reinterpret_cast<const float2 *>(qg + 16 * kk);
		const float2 x1 = *reinterpret_cast<const float2 *>(qg + 16 * kk + 8);
		uint32_t l0, l1;
		const uint32_t h0 = gm_split(x0.x, x0.y, l0), h1 = gm_split(x1.x, x1.y, l1);
		gm_mma(s0, h0, l0, h1, l1, b0, b1);
		gm_mma(s1, h0, l0, h1, l1, b2, b3);
	}
	float *sg = sc + g * MG_T + 16 * warp + 2 * c;
	*reinterpret_cast<float2 *>(sg) = make_float2(s0[0] + s0[2], s0[1] + s0[3]);
	*reinterpret_cast<float2 *>(sg + 8) = make_float2(s1[0] + s1[2], s1[1] + s1[3]);
}

/* O = P V: warp w takes dims 16 w .. + 16 (two n-tiles), K = the keys in steps of 16 (P past n
 * is zero, and the rows past n read key n - 1's, finite); ldmatrix.x4.trans gives both n-tiles'
 * B fragments a step. Head h's sums land in ot[h][128]. */
template <typename RowF>
static __device__ __forceinline__ void mg_pv_mma(const float *sc, float *ot, int t0, int n, RowF row, int warp,
                                                 int lane)
{
	const int g = lane >> 2, c = lane & 3, j = lane >> 3, r = lane & 7;
	float o0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, o1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
	for (int kb = 0; kb < n; kb += 16) {
		const float *pg = sc + g * MG_T + kb + 2 * c;
		const int k0 = kb + 2 * c;
		const float p0 = k0 < n ? pg[0] : 0.0f, p1 = k0 + 1 < n ? pg[1] : 0.0f;
		const float p2 = k0 + 8 < n ? pg[8] : 0.0f, p3 = k0 + 9 < n ? pg[9] : 0.0f;
		uint32_t l0, l1;
		const uint32_t h0 = gm_split(p0, p1, l0), h1 = gm_split(p2, p3, l1);
		/* lane j * 8 + r: matrix j's row r = key kb + 8 (j & 1) + r, chunk 2 w + (j >> 1) */
		const int key = min(kb + 8 * (j & 1) + r, n - 1);
		uint32_t b0, b1, b2, b3;
		mg_ldsm4t(row(key) + (uint32_t)(((2 * warp + (j >> 1)) ^ ((t0 + key) & 7)) << 4), b0, b1, b2, b3);
		gm_mma(o0, h0, l0, h1, l1, b0, b1);
		gm_mma(o1, h0, l0, h1, l1, b2, b3);
	}
	float *og = ot + g * MG_HD + 16 * warp + 2 * c;
	*reinterpret_cast<float2 *>(og) = make_float2(o0[0] + o0[2], o0[1] + o0[3]);
	*reinterpret_cast<float2 *>(og + 8) = make_float2(o1[0] + o1[2], o1[1] + o1[3]);
}

/* positions of split s (of T) before pos = ctx - 1: the ones whose K and V rows exist before the
 * step, copied through the ring (aring) in stages of up to 64 rows, K's then V's */
static __device__ __forceinline__ int mg_attn_m(const mg_args &a, int s)
{
	const int t0 = s * a.T, t1 = min(a.ctx, t0 + a.T);
	return max(0, min(t1, a.ctx - 1) - t0);
}

/* splits a merge round loads at once (16 made the kernel spill at its 168 registers) */
#define MG_MR 12

/* one attention split: kv head g, head group hg, positions [s T, min(ctx, (s + 1) T)), by the
 * 256 consumer threads */
static __device__ void mg_attn(const mg_args &a, const mg_layer &ly, int l, int g, int s, int hg, float *scr,
                              int tid, gt_pos &rp, uint64_t *full, uint64_t *empty, uint32_t ring_sa)
{
	/* head group hg: nh = 8 / hgn of the kv head's 8 query heads, from hq0 (hp a lane in the
	 * scores) */
	const int nh = 8 / a.hgn, hq0 = hg * nh, hp = nh / 2;
	const int warp = tid >> 5, lane = tid & 31, pos = a.ctx - 1;
	const int t0 = s * a.T, t1 = min(a.ctx, t0 + a.T), n = t1 - t0;
	/* the ring's K and V stages of this split (aring), all landed long before */
	const int nk = a.aring ? (mg_attn_m(a, s) + 63) / 64 : 0;
	uint32_t kst[2] = {0, 0}, vst[2] = {0, 0};
	{
		gt_pos q = rp;
#pragma unroll
		for (int c = 0; c < 2; c++)
			if (c < nk) {
				mg_wbar(&full[q.i], q.ph, 2, q.n);
				kst[c] = ring_sa + (uint32_t)q.i * MG_STAGE;
				gt_next(q, MG_NS);
			}
#pragma unroll
		for (int c = 0; c < 2; c++)
			if (c < nk) {
				mg_wbar(&full[q.i], q.ph, 2, q.n);
				vst[c] = ring_sa + (uint32_t)q.i * MG_STAGE;
				gt_next(q, MG_NS);
			}
	}
	float *qs = scr, *sc = scr + 8 * MG_HD, *mstat = sc + 8 * MG_T, *lstat = mstat + 8;
	/* pos's K and V rows (bf16, written by this step's qkv) staged with q: one L2 round trip for
	 * all, not one in the scores and another in P V */
	uint4 *kvp = reinterpret_cast<uint4 *>(lstat + 16);
	const uint32_t kp_sa = gt_sa(kvp), vp_sa = kp_sa + MG_HD * 2;
	const float qscale = 0.08838834764831845f; /* 1 / sqrt(128) */
	{
		const float4 v = __ldcg(reinterpret_cast<const float4 *>(a.q + (size_t)l * MG_QR + g * 8 * MG_HD) + tid);
		if (t1 == a.ctx && tid < 32)
			kvp[tid] = __ldcg(reinterpret_cast<const uint4 *>((tid < 16 ? ly.kc : ly.vc) +
			                                                 ((size_t)g * a.ctx_max + pos) * MG_HD) + (tid & 15));
		reinterpret_cast<float4 *>(qs)[tid] = make_float4(v.x * qscale, v.y * qscale, v.z * qscale, v.w * qscale);
	}
	gt_sync();
	mg_mark(a, l, T_AQ, tid);
	/* scores: warp w takes local heads hp (w >> 2) .. +hp, position t0 + 32 (w & 3) + lane (hp
	 * compiled in: a run-time head count's guards cost the depth-4096 attention ~3 us) */
	/* key i's K and V rows in shared memory (a.amma, which needs a.aring) */
	auto krow = [&](int i) -> uint32_t {
		return t0 + i < pos ? ((i >> 6) ? kst[1] : kst[0]) + (uint32_t)(i & 63) * 256 : kp_sa;
	};
	auto vrow = [&](int i) -> uint32_t {
		return t0 + i < pos ? ((i >> 6) ? vst[1] : vst[0]) + (uint32_t)(i & 63) * 256 : vp_sa;
	};
	if (a.amma)
		mg_qk_mma(qs, sc, t0, n, krow, warp, lane);
	else {
		const uint32_t ks0 = kst[0], ks1 = kst[1];
		const __nv_bfloat16 *kc = ly.kc + (size_t)g * a.ctx_max * MG_HD;
		const bool aring = a.aring;
		if (hp == 4)
			mg_scores<4>(qs + hq0 * MG_HD, sc, kc, t0, n, pos, aring, ks0, ks1, kp_sa, warp, lane);
		else if (hp == 2)
			mg_scores<2>(qs + hq0 * MG_HD, sc, kc, t0, n, pos, aring, ks0, ks1, kp_sa, warp, lane);
		else
			mg_scores<1>(qs + hq0 * MG_HD, sc, kc, t0, n, pos, aring, ks0, ks1, kp_sa, warp, lane);
	}
	gt_sync();
	mg_mark(a, l, T_AS, tid);
	if (warp < nh) { /* warp h: the softmax's max, weights and sum over the split */
		float m = -INFINITY;
		for (int i = lane; i < n; i += 32)
			m = fmaxf(m, sc[warp * MG_T + i]);
		for (int o = 16; o; o >>= 1)
			m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
		float sum = 0.0f;
		for (int i = lane; i < n; i += 32) {
			const float p = expf(sc[warp * MG_T + i] - m);
			sc[warp * MG_T + i] = p;
			sum += p;
		}
		for (int o = 16; o; o >>= 1)
			sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
		if (lane == 0)
			mstat[warp] = m, lstat[warp] = sum;
	}
	gt_sync();
	mg_mark(a, l, T_ASM, tid);
	float4 *tree = reinterpret_cast<float4 *>(lstat + 16 + MG_HD); /* [4 warps][8 heads][32 lanes] */
	if (a.amma) {
		mg_pv_mma(sc, reinterpret_cast<float *>(tree), t0, n, vrow, warp, lane);
		mg_mark(a, l, T_APV, tid);
		/* the K and V stages go back to the producer (this warp is past its reads) */
		for (int c = 0; c < 2 * nk; c++) {
			if (lane == 0)
				gt_arrive(&empty[rp.i]);
			gt_next(rp, MG_NS);
		}
	} else {
		/* warp w: positions w, w + 8, .. (their v loads all in flight), every head's dims 4 lane .. +4;
		 * then the warps' sums added in a tree through shared memory (warp w + 4 into w, then + 2,
		 * + 1: the same order every run) */
		float o8[8][4];
#pragma unroll
		for (int h = 0; h < 8; h++)
			o8[h][0] = o8[h][1] = o8[h][2] = o8[h][3] = 0.0f;
		for (int i0 = warp; i0 < n; i0 += 8 * 8) {
			uint2 vv[8];
#pragma unroll
			for (int u = 0; u < 8; u++) {
				const int t = t0 + min(i0 + 8 * u, n - 1);
				const int pc = (((lane >> 1) ^ (t & 7)) << 1) | (lane & 1); /* the lane's 8 bytes, swizzled */
				const uint2 *vr = reinterpret_cast<const uint2 *>(ly.vc + ((size_t)g * a.ctx_max + t) * MG_HD) + pc;
				const bool ring = t < pos && a.aring;
				if (ring || t == pos) {
					const int i = t - t0;
					const uint32_t at = ring ? ((i >> 6) ? vst[1] : vst[0]) + (uint32_t)(i & 63) * 256 : vp_sa;
					uint32_t lo, hi;
					asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(lo), "=r"(hi) : "r"(at + pc * 8));
					vv[u] = make_uint2(lo, hi);
				} else
					vv[u] = __ldg(vr);
			}
#pragma unroll
			for (int u = 0; u < 8; u++) {
				const int i = i0 + 8 * u;
				if (i >= n)
					break;
				const float2 v01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&vv[u].x));
				const float2 v23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&vv[u].y));
#pragma unroll
				for (int h = 0; h < 8; h++) {
					if (h >= nh)
						break;
					const float p = sc[h * MG_T + i];
					o8[h][0] += p * v01.x, o8[h][1] += p * v01.y, o8[h][2] += p * v23.x, o8[h][3] += p * v23.y;
				}
			}
		}
		for (int half = 4; half >= 1; half >>= 1) {
			if (warp >= half && warp < 2 * half)
#pragma unroll
				for (int h = 0; h < 8; h++)
					if (h < nh)
					tree[((warp - half) * 8 + h) * 32 + lane] = make_float4(o8[h][0], o8[h][1], o8[h][2], o8[h][3]);
			gt_sync();
			if (warp < half)
#pragma unroll
				for (int h = 0; h < 8; h++) {
					if (h >= nh)
						break;
					const float4 v = tree[(warp * 8 + h) * 32 + lane];
					o8[h][0] += v.x, o8[h][1] += v.y, o8[h][2] += v.z, o8[h][3] += v.w;
				}
			gt_sync();
		}
		mg_mark(a, l, T_APV, tid);
		/* the K and V stages go back to the producer (every warp is past its reads) */
		for (int c = 0; c < 2 * nk; c++) {
			if (lane == 0)
				gt_arrive(&empty[rp.i]);
			gt_next(rp, MG_NS);
		}
		/* warp 0 holds every head's sums: hand head h to warp h */
		if (warp == 0)
#pragma unroll
			for (int h = 0; h < 8; h++)
				if (h < nh)
				tree[h * 32 + lane] = make_float4(o8[h][0], o8[h][1], o8[h][2], o8[h][3]);
	}
	gt_sync();
	float o4[4];
	{
		const float4 v = tree[warp * 32 + lane];
		o4[0] = v.x, o4[1] = v.y, o4[2] = v.z, o4[3] = v.w;
	}
	float *att = a.att + (size_t)l * MG_QR + (g * 8 + hq0 + warp) * MG_HD + 4 * lane;
	unsigned *cnt = a.cnt + (size_t)l * MG_CNT;
	if (a.S == 1) {
		if (warp < nh) {
			const float inv = 1.0f / lstat[warp];
			*reinterpret_cast<float4 *>(att) = make_float4(o4[0] * inv, o4[1] * inv, o4[2] * inv, o4[3] * inv);
		}
		mg_cpub(cnt + C_ATT, 1, tid);
		return;
	}
	float *pp = a.part + ((((size_t)l * MG_NKV + g) * a.S + s) * 8 + hq0 + warp) * MG_PS;
	if (warp < nh) {
		*reinterpret_cast<float4 *>(pp + 4 * lane) = make_float4(o4[0], o4[1], o4[2], o4[3]);
		if (lane == 0)
			pp[MG_HD] = mstat[warp], pp[MG_HD + 1] = lstat[warp];
	}
	gt_sync();
	mg_mark(a, l, T_APW, tid);
	int *last = reinterpret_cast<int *>(lstat + 8);
	volatile int *rec = mg_ds ? mg_ds + ((size_t)l * 16 + g * 4 + hg) * MG_DS : NULL;
	if (tid == 0) {
		const unsigned old = fp4s_arrive(cnt + C_N + g * 4 + hg);
		*last = old == (unsigned)a.S - 1;
		if (rec && s < 64)
			rec[s] = (int)old + 1;
	}
	gt_sync();
	if (!*last)
		return;
	mg_mark(a, l, T_ALAST, tid);
	if (rec && lane == 0)
		rec[64 + warp] = 1;
	if (warp >= nh) {
		gt_sync();
		return;
	}
	/* the merge: warp h. The lane's 4 dims of the first MG_MR splits' partials are loaded with the
	 * splits' (max, sum) pairs (a lane each, S <= 64): one L2 round trip for them all, not one for
	 * the pairs and one for each 8 splits. Summed in split order. */
	const float *p0 = a.part + (((size_t)l * MG_NKV + g) * a.S * 8 + hq0 + warp) * MG_PS;
	const size_t ps = (size_t)8 * MG_PS;
	float4 v[MG_MR];
#pragma unroll
	for (int u = 0; u < MG_MR; u++)
		v[u] = __ldcg(reinterpret_cast<const float4 *>(p0 + min(u, a.S - 1) * ps) + lane);
	float mj[2], lj[2];
#pragma unroll
	for (int u = 0; u < 2; u++) {
		const int j = lane + 32 * u;
		mj[u] = j < a.S ? __ldcg(p0 + j * ps + MG_HD) : -INFINITY;
		lj[u] = j < a.S ? __ldcg(p0 + j * ps + MG_HD + 1) : 0.0f;
	}
	float M = fmaxf(mj[0], mj[1]);
	for (int o = 16; o; o >>= 1)
		M = fmaxf(M, __shfl_xor_sync(0xFFFFFFFFu, M, o));
	float f[2], Lsum = 0.0f, O[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
	for (int u = 0; u < 2; u++) {
		f[u] = lane + 32 * u < a.S ? expf(mj[u] - M) : 0.0f;
		Lsum += f[u] * lj[u];
	}
	for (int o = 16; o; o >>= 1)
		Lsum += __shfl_xor_sync(0xFFFFFFFFu, Lsum, o);
	mg_mark(a, l, T_AML, tid);
	for (int j0 = 0; j0 < a.S; j0 += MG_MR) {
		if (j0 > 0)
#pragma unroll
			for (int u = 0; u < MG_MR; u++)
				v[u] = __ldcg(reinterpret_cast<const float4 *>(p0 + min(j0 + u, a.S - 1) * ps) + lane);
#pragma unroll
		for (int u = 0; u < MG_MR; u++) {
			const int j = j0 + u;
			const float fj = __shfl_sync(0xFFFFFFFFu, (j & 32) ? f[1] : f[0], j & 31);
			if (j < a.S)
				O[0] += fj * v[u].x, O[1] += fj * v[u].y, O[2] += fj * v[u].z, O[3] += fj * v[u].w;
		}
	}
	const float inv = 1.0f / Lsum;
	*reinterpret_cast<float4 *>(att) = make_float4(O[0] * inv, O[1] * inv, O[2] * inv, O[3] * inv);
	gt_sync();
	if (tid == 0) {
		if (rec) {
			unsigned old;
			asm volatile("atom.release.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(cnt + C_ATT) : "memory");
			rec[74] = (int)(cnt + C_ATT - a.cnt), rec[75] = (int)old;
			rec[72] = 1, rec[73] = blockIdx.x + 1;
		} else
			mg_pub(cnt + C_ATT, 1);
	}
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
	float4 s4 = pv[0];
#pragma unroll
	for (int u = 1; u < MG_O_TILES / MG_W; u++)
		s4.x += pv[u].x, s4.y += pv[u].y, s4.z += pv[u].z, s4.w += pv[u].w;
	const float r = mg_stage_norm_x(ha, hb, nw, a.eps, xs, sred, tid);
	float *lg = scr, *sv = scr + MG_E, *ws = sv + 16; /* ws: [8][E], then the rank halves [E] */
	int *rk = reinterpret_cast<int *>(ws + MG_W * MG_E);
	reinterpret_cast<float4 *>(ws + warp * MG_E)[lane] = s4;
	gt_sync();
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
	if (tid == 0) {
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
		/* a slot's copy: bytes from src (and as many from src2 after them, when given) */
		auto issue = [&](const uint8_t *src, unsigned bytes, const uint8_t *src2 = NULL) {
			if (lane == 0) {
				mg_wbar(&empty[pp.i], pp.ph ^ 1u, 3, pp.n);
				gt_expect(&full[pp.i], src2 ? 2 * bytes : bytes);
				if (src2)
					gt_copy_ef(ring + (size_t)pp.i * MG_STAGE + bytes, src2, bytes, &full[pp.i], pol);
				const unsigned steps = bytes / MG_STEP, per = (steps + a.csplit - 1) / a.csplit;
				if (a.csplit <= 1 || bytes % MG_STEP)
					gt_copy_ef(ring + (size_t)pp.i * MG_STAGE, src, bytes, &full[pp.i], pol);
				else
				for (unsigned s0 = 0; s0 < steps; s0 += per) {
					const unsigned n = min(per, steps - s0) * MG_STEP;
					gt_copy_ef(ring + (size_t)pp.i * MG_STAGE + s0 * MG_STEP, src + s0 * MG_STEP, n, &full[pp.i],
					           pol);
				}
			}
			gt_next(pp, MG_NS);
		};
		for (int l = 0; l < a.L; l++) {
			const mg_layer &ly = a.ly[l];
			for (int j = b; j < MG_QKV_TILES; j += G)
				issue(ly.qkv + (size_t)j * MG_STAGE, MG_STAGE);
			if (a.aring)
				for (int t = b; t < MG_NKV * a.S * a.hgn; t += G) {
					const int g = t / a.hgn / a.S, s = t / a.hgn % a.S, m = mg_attn_m(a, s);
					for (int kv = 0; kv < 2; kv++)
						for (int c0 = 0; c0 < m; c0 += 64)
							issue(reinterpret_cast<const uint8_t *>((kv ? ly.vc : ly.kc) + ((size_t)g * a.ctx_max + s * a.T + c0) *
							                                                       MG_HD),
							      (unsigned)min(64, m - c0) * MG_HD * 2);
				}
			if (b < MG_O_TILES) {
				issue(ly.o + (size_t)(2 * b) * MG_STAGE, MG_STAGE);
				issue(ly.o + (size_t)(2 * b + 1) * MG_STAGE, MG_STAGE);
				issue(reinterpret_cast<const uint8_t *>(ly.rt) + (size_t)b * MG_RT_BYTES, MG_RT_BYTES);
			}
			const int *sl = sel + (l & 1) * MG_K;
			const uint8_t *gub = a.expool ? a.ly[0].gu : ly.gu, *dnb = a.expool ? a.ly[0].dn : ly.dn;
			if (!a.exstatic) {
				/* the consumers' top-k */
				mg_wbar(&selbar[l & 1], (l >> 1) & 1, 4, l);
				if (a.tl && l == a.tl_layer && lane == 0)
					a.tl[blockIdx.x * MG_TL + T_PSEL] = gm_now();
			}
			for (int j = b; j < MG_K * MG_GU_TILES; j += G) {
				const int slot = j / MG_GU_TILES, t = j - slot * MG_GU_TILES;
				const int e = a.exstatic ? (8 * l + slot) % MG_E : sl[slot];
				issue(gub + (size_t)e * a.gu_stride + (size_t)t * MG_STAGE, MG_STAGE);
			}
			/* the down's stages two to a ring slot (6912 bytes each): with the block's <= 6 gate|up
			 * tiles, all its expert copies fit in the 10 slots at once */
			if (b < MG_D_TILES)
				for (int slot = 0; slot < MG_K; slot += 2) {
					const int e0 = a.exstatic ? (8 * l + slot) % MG_E : sl[slot];
					const int e1 = a.exstatic ? (8 * l + slot + 1) % MG_E : sl[slot + 1];
					issue(dnb + (size_t)e0 * a.dn_stride + (size_t)b * MG_DSTAGE, MG_DSTAGE,
					      dnb + (size_t)e1 * a.dn_stride + (size_t)b * MG_DSTAGE);
				}
			if (a.tl && l == a.tl_layer && lane == 0)
				a.tl[blockIdx.x * MG_TL + T_PCOPIED] = gm_now();
			if (a.exstatic) {
				mg_wbar(&selbar[l & 1], (l >> 1) & 1, 4, l);
				if (a.tl && l == a.tl_layer && lane == 0)
					a.tl[blockIdx.x * MG_TL + T_PSEL] = gm_now();
			}
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
		const float *h = a.h + (size_t)l * MG_H;
		float *h2 = a.h2 + (size_t)l * MG_H;
		if (l > 0)
			mg_cwait(a.cnt + (size_t)(l - 1) * MG_CNT + C_D, MG_D_TILES, tid, a.poll);
		mg_mark(a, l, T_START, tid);
		/* qkv */
		if (b < MG_QKV_TILES) {
			mg_stage_norm(h, ly.n1, a.eps, xs, sred, tid);
			mg_mark(a, l, T_QX, tid);
			/* the block's <= 3 tiles (G >= 107), one barrier for all; row sums past x in xs */
			const int n = (MG_QKV_TILES - b + G - 1) / G;
			float *rq = reinterpret_cast<float *>(xs + 2 * MG_CS_H);
			mg_tiles<3>(n, pos, full, empty, ring_sa, xs_sa, rq, warp, lane);
			mg_mark(a, l, T_Q1, tid);
			if (tid < 16 * n) {
				const int k = tid >> 4, row = (b + k * G) * 16 + (tid & 15);
				const float y = ldexpf(mg_rowsum_k<3>(rq, k, tid & 15), 14) * a.post;
				if (row < MG_QR)
					a.q[(size_t)l * MG_QR + row] = y;
				else {
					const int r = row - MG_QR, kv = r / (MG_NKV * MG_HD), rr = r % (MG_NKV * MG_HD);
					__nv_bfloat16 *dst = (kv ? ly.vc : ly.kc) +
					                     ((size_t)(rr / MG_HD) * a.ctx_max + (a.ctx - 1)) * MG_HD +
					                     MG_KVSW(rr % MG_HD, a.ctx - 1);
					*dst = __float2bfloat16_rn(y);
				}
			}
			mg_cpub(cnt + C_QKV, n, tid);
		}
		mg_mark(a, l, T_QKV, tid);
		/* attention */
		for (int t = b; t < MG_NKV * a.S * a.hgn; t += G) {
			mg_cwait(cnt + C_QKV, MG_QKV_TILES, tid, a.poll);
			const int gs = t / a.hgn;
			mg_attn(a, ly, l, gs / a.S, gs % a.S, t % a.hgn, reinterpret_cast<float *>(xs), tid, pos, full, empty,
			        ring_sa);
			gt_sync();
		}
		mg_mark(a, l, T_ATT, tid);
		/* o */
		if (b < MG_O_TILES) {
			mg_cwait(cnt + C_ATT, MG_NKV * a.hgn, tid, a.poll);
			/* the residual's and norm's rows loaded with the staging (not after the tile) */
			const float hr = tid < 16 ? __ldcg(h + b * 16 + tid) : 0.0f, nr = tid < 16 ? __ldg(ly.n2 + b * 16 + tid) : 0.0f;
			mg_stage_plain(a.att + (size_t)l * MG_QR, MG_QR, xs, MG_CS_Q, tid);
			gt_sync();
			const float *rd = mg_tile_rows(pos, full, empty, ring_sa, xs_sa, MG_CS_Q, 2, red, rpar, warp, lane);
			/* the tile's part of the router's logits: n2 h2 of its 16 rows (hs, past the staged
			 * attention) times its 16 columns of the router (the ring's third stage, [E][16] BF16:
			 * thread t reads expert t / 2's half t % 2, 16 contiguous bytes) */
			float *hs = reinterpret_cast<float *>(xs + 2 * MG_CS_Q);
			if (tid < 16) {
				const int row = b * 16 + tid;
				const float y = hr + ldexpf(mg_rowsum(rd, tid), 14) * a.post;
				h2[row] = y;
				hs[tid] = y * nr;
			}
			gt_sync();
			mg_wbar(&full[pos.i], pos.ph, 1, pos.n);
			{
				const uint4 wv = gm_lds128(ring_sa + (uint32_t)pos.i * MG_STAGE + tid * 16);
				const __nv_bfloat162 *w2 = reinterpret_cast<const __nv_bfloat162 *>(&wv);
				const float *hh = hs + 8 * (tid & 1);
				float p = 0.0f;
#pragma unroll
				for (int i = 0; i < 4; i++) {
					const float2 wf = __bfloat1622float2(w2[i]);
					p += wf.x * hh[2 * i] + wf.y * hh[2 * i + 1];
				}
				p += __shfl_xor_sync(0xFFFFFFFFu, p, 1);
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
		mg_cwait(cnt + C_O, MG_O_TILES, tid, a.poll);
		mg_mark(a, l, T_OSEEN, tid);
		mg_route(a, l, h2, ly.n2, xs, sred, reinterpret_cast<float *>(xs + 2 * MG_CS_H), sel + (l & 1) * MG_K,
		         selw + (l & 1) * MG_K, tid);
		if (tid == 0)
			gt_arrive(&selbar[l & 1]);
		mg_mark(a, l, T_TOPK, tid);
		/* the experts' gate|up (their copies wait for the top-k) */
		if (b < MG_K * MG_GU_TILES) {
			/* the block's <= 6 tiles (G >= 128), one barrier for all (the route's scratch past x
			 * is free again) */
			const int n = (MG_K * MG_GU_TILES - b + G - 1) / G;
			float *rq = reinterpret_cast<float *>(xs + 2 * MG_CS_H);
			mg_tiles<6>(n, pos, full, empty, ring_sa, xs_sa, rq, warp, lane);
			if (tid < 8 * n) {
				const int k = tid >> 3, i = tid & 7, j = b + k * G, slot = j / MG_GU_TILES, t = j - slot * MG_GU_TILES;
				const float gt = ldexpf(mg_rowsum_k<6>(rq, k, 2 * i), 14) * a.post;
				const float up = ldexpf(mg_rowsum_k<6>(rq, k, 2 * i + 1), 14) * a.post;
				a.act[((size_t)l * MG_K + slot) * MG_FI + t * 8 + i] = silu_mul(gt, up);
			}
			mg_cpub(cnt + C_GU, n, tid);
		}
		mg_mark(a, l, T_GU, tid);
		/* down, the 8 slots of a row tile summed in order */
		if (b < MG_D_TILES) {
			const float h2r = tid < 16 ? __ldcg(h2 + b * 16 + tid) : 0.0f; /* complete since the route */
			mg_cwait(cnt + C_GU, MG_K * MG_GU_TILES, tid, a.poll);
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
				float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
				const int g8 = lane >> 2, t4 = lane & 3;
				const uint32_t xc[1] = {xs_sa + warp * 2 * MG_CS_F + (uint32_t)((g8 < 2 ? g8 : (g8 & 1)) * MG_CS_F)};
				const uint32_t st = ring_sa + (uint32_t)q.i * MG_STAGE + (uint32_t)(warp & 1) * MG_DSTAGE;
#pragma unroll 2
				for (int s6 = 0; s6 < 6; s6++) {
					const uint32_t sb = st + (uint32_t)s6 * MG_STEP;
					const uint4 wa = gm_lds128(sb + lane * 16), wb = gm_lds128(sb + 512 + lane * 16);
					const uint32_t sc = mg_lds32(sb + 1024 + lane * 4);
					gm_step<GM_NVFP4, 1>(acc, wa, wb, sc & 0xFFFFu, sc >> 16, 0u, xc, s6 * 4 + t4);
				}
				const float c = sw[warp] * 16384.0f * a.post;
#pragma unroll
				for (int e = 0; e < 4; e++)
					tot[e] = c * acc[0][e];
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
				a.h[(size_t)(l + 1) * MG_H + row] = h2r + mg_rowsum(rd, tid);
			}
			mg_cpub(cnt + C_D, 1, tid);
		}
		mg_mark(a, l, T_D, tid);
	}
}
#else
__global__ void mg_kernel(const mg_args a) { (void)a; }
#endif

#endif
