/* ostep_attn.cuh: the gpt-oss decode step's attention (ostep.cuh, which includes this where its
 * kernel needs it, after its geometry, argument block and staging): a split of a kv head's 8
 * query heads over [t0, t1) on the tensor cores a warp at a time, and the splits' merge, both
 * with the heads' sinks in the denominator. */
#ifndef FP4S_OSTEP_ATTN_CUH
#define FP4S_OSTEP_ATTN_CUH

/* ---- the attention ------------------------------------------------------------------------- */

/* positions a full layer's split: the context over G / 8 splits a kv head, a multiple of 16, at
 * least OS_T (dstep.cuh ds_split_t) */
static __device__ __forceinline__ int os_split_t(int ctx, int G)
{
	const int s0 = G / OS_NKV;
	return max(OS_T, ((ctx + s0 - 1) / s0 + 15) & ~15);
}

/* layer ly's splits a kv head and split s's positions [t0, t1) */
static __device__ __forceinline__ void os_range(int window, int ctx, int T, int s, int &t0, int &t1)
{
	if (window) {
		t0 = max(0, ctx - window), t1 = ctx;
	} else {
		t0 = s * T, t1 = min(ctx, t0 + T);
	}
}

/* key i's (< 144) 16-byte chunk c (< 8) in a K or V slot: blocks of 16 rows of 128 bytes, the
 * 128-byte swizzle (chunk XOR row % 8) */
static __device__ __forceinline__ uint32_t os_kv_sa(uint32_t st, int i, int c)
{
	return st + (uint32_t)(i * 128 + ((c ^ (i & 7)) << 4));
}

/* the lane's rotary cos / sin for its dims 2 lane, + 1 (rotate-half over 64: dims d, d + 32) */
static __device__ __forceinline__ void os_rope_ld(const float *inv_freq, float mscale, int p, int lane, float2 &c,
                                                  float2 &s)
{
	const int i0 = (2 * lane) & (OS_HD / 2 - 1);
	const float2 f = __ldg(reinterpret_cast<const float2 *>(inv_freq + i0));
	const float a0 = (float)p * f.x, a1 = (float)p * f.y;
	c = make_float2(cosf(a0) * mscale, cosf(a1) * mscale);
	s = make_float2(sinf(a0) * mscale, sinf(a1) * mscale);
}

static __device__ __forceinline__ float2 os_rope2(const float2 v, const float2 c, const float2 s, int lane)
{
	const float p0 = __shfl_xor_sync(0xFFFFFFFFu, v.x, 16), p1 = __shfl_xor_sync(0xFFFFFFFFu, v.y, 16);
	return lane < 16 ? make_float2(v.x * c.x - p0 * s.x, v.y * c.y - p1 * s.y)
	                 : make_float2(v.x * c.x + p0 * s.x, v.y * c.y + p1 * s.y);
}

/* one attention split: kv head g's 8 query heads over [t0, t1), in chunks of OS_T keys from the
 * block-aligned t0 (a sliding window's start masked), a warp at a time (dstep.cuh ds_attn's
 * form). S == 1: the heads' outputs (the sink in the denominator) and 8 counted; otherwise the
 * partials for os_merge and one on the kv head's split counter. */
static __device__ void os_attn(const os_args &a, const os_layer &ly, int l, int g, int s, int ctx, int t0, int t1,
                               int S, const int32_t *tab, float *scr, int tid, gt_pos &rp, uint64_t *full,
                               uint64_t *empty, uint32_t ring_sa)
{
	const int warp = tid >> 5, lane = tid & 31, pos = ctx - 1;
	/* scratch: q [8][64], pos's K and V rows (128 bytes each), q's fragments [4][32], the warps'
	 * max and sum [8][8] each, their sums [8][8][OS_HD + 8] (mg_attn_put) */
	float *qs = scr;
	uint4 *kvp = reinterpret_cast<uint4 *>(scr + OS_GQ * OS_HD), *qfs = kvp + 16;
	float *mw = reinterpret_cast<float *>(qfs + 4 * 32), *lw = mw + MG_W * OS_GQ, *ow = lw + MG_W * OS_GQ;
	const uint32_t kp_sa = gt_sa(kvp), vp_sa = kp_sa + OS_HD * 2;
	unsigned *cnt = a.cnt + (size_t)l * OS_CNT;
	{
		const bool last = t1 == ctx, kw7 = last && warp == MG_W - 1;
		float2 c2, s2;
		os_rope_ld(a.inv_freq, a.mscale, pos, lane, c2, s2);
		mg_cwait(cnt + O_QKV, OS_QKV_TILES, tid);
		const float2 v = __ldcg(reinterpret_cast<const float2 *>(a.q + (size_t)l * OS_QR + (g * OS_GQ + warp) * OS_HD) + lane);
		float2 kr = make_float2(0.0f, 0.0f);
		if (kw7)
			kr = __ldcg(reinterpret_cast<const float2 *>(a.kraw + ((size_t)l * OS_NKV + g) * OS_HD) + lane);
		if (last && tid < 8)
			kvp[8 + tid] = __ldcg(reinterpret_cast<const uint4 *>(mg_kvrow<OS_HD>(ly.vc, tab, pos, g, OS_NKV)) + tid);
		const float2 qr = os_rope2(v, c2, s2, lane);
		const float sc2 = a.scale * 1.4426950408889634f; /* log2 e: mg_attn_keys's exp2f */
		reinterpret_cast<float2 *>(qs)[tid] = make_float2(qr.x * sc2, qr.y * sc2);
		if (kw7) {
			const float2 k2 = os_rope2(kr, c2, s2, lane);
			const __nv_bfloat162 kb = __floats2bfloat162_rn(k2.x, k2.y);
			reinterpret_cast<__nv_bfloat162 *>(kvp)[lane] = kb;
			reinterpret_cast<__nv_bfloat162 *>(mg_kvrow<OS_HD>(ly.kc, tab, pos, g, OS_NKV))[lane] = kb;
		}
	}
	gt_sync();
	mg_attn_qfrag<OS_HD>(qs, qfs, warp, lane);
	gt_sync();
	float m = -INFINITY, lsum = 0.0f, o[OS_HD / 8][4];
#pragma unroll
	for (int t = 0; t < OS_HD / 8; t++)
		o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
	const int kw = 16 * warp;
#pragma unroll 1
	for (int a0 = t0 & ~15; a0 < t1; a0 += OS_T) {
		const int n = min(t1, a0 + OS_T) - a0, mm = mg_ring_m(ctx, a0, a0 + n), lo = t0 - a0;
		const bool run = kw < n && kw + 16 > lo, use = run && kw < mm;
		gt_pos kq = rp, vq = rp;
		gt_next_n(vq, OS_NS, 1);
		if (run) {
			if (use)
				mg_wbar(&full[kq.i], kq.ph, 2, kq.n);
			const uint32_t kst = ring_sa + (uint32_t)kq.i * OS_SLOT, vst = ring_sa + (uint32_t)vq.i * OS_SLOT;
			mg_attn_keys<OS_GQ, OS_HD, true>(
				qfs, kw, n,
				[&](int i, int c) -> uint32_t { return a0 + i < pos ? os_kv_sa(kst, i, c) : kp_sa + (uint32_t)(c << 4); },
				[&](int i, int c) -> uint32_t { return a0 + i < pos ? os_kv_sa(vst, i, c) : vp_sa + (uint32_t)(c << 4); },
				[&] {
					if (use && lane == 0)
						os_arrive(&empty[kq.i], warp);
				},
				[&] {
					if (use)
						mg_wbar(&full[vq.i], vq.ph, 2, vq.n);
				},
				m, lsum, o, lane, lo);
			if (use && lane == 0)
				os_arrive(&empty[vq.i], warp);
		}
		if (mm > 0) { /* the chunk's K and V slots: the warps that did not read them hand them back once landed */
			if (lane == 0 && !use)
				for (int c = 0; c < 2; c++) {
					gt_pos q = rp;
					gt_next_n(q, OS_NS, c);
					mg_wbar(&full[q.i], q.ph, 2, q.n);
					os_arrive(&empty[q.i], warp);
				}
			gt_next_n(rp, OS_NS, 2);
		}
	}
	mg_attn_put<OS_GQ, OS_HD>(m, lsum, o, mw, lw, ow, warp, lane);
	gt_sync();
	/* thread: head h = tid / 32's dims d, d + 1, the warps' sums weighed by exp2(max_w - max) */
	const int h = tid >> 5, d = 2 * (tid & 31);
	float M, L, ox, oy;
	mg_attn_combine<OS_GQ, OS_HD>(mw, lw, ow, h, d, M, L, ox, oy);
	if (S == 1) {
		/* the sink: a key of zero value whose score is the sink's logit */
		L += exp2f(__ldg(ly.sinks + g * OS_GQ + h) * 1.4426950408889634f - M);
		const float inv = 1.0f / L;
		*reinterpret_cast<float2 *>(a.att + (size_t)l * OS_QR + (g * OS_GQ + h) * OS_HD + d) =
			make_float2(ox * inv, oy * inv);
		mg_cpub(cnt + O_ATT, OS_GQ, tid);
		return;
	}
	float *pp = a.part + (((size_t)g * S + s) * OS_GQ + h) * OS_PS;
	*reinterpret_cast<float2 *>(pp + d) = make_float2(ox, oy);
	if (d == 0) /* the max in natural units for the merge */
		pp[OS_HD] = M * 0.6931471805599453f, pp[OS_HD + 1] = L;
	mg_cpub(cnt + O_N + g, 1, tid);
}

/* query head q (kv head q / 8): its S splits merged, the sink in the denominator. Warp w sums
 * splits w, w + 8, .. (lane: dims 2 lane, + 1), then the warps' sums in order. */
static __device__ void os_merge(const os_args &a, const os_layer &ly, int l, int q, int S, float *scr, int tid)
{
	const int warp = tid >> 5, lane = tid & 31, g = q / OS_GQ, h = q % OS_GQ;
	unsigned *cnt = a.cnt + (size_t)l * OS_CNT;
	mg_cwait(cnt + O_N + g, (unsigned)S, tid);
	const float *p0 = a.part + ((size_t)g * S * OS_GQ + h) * OS_PS;
	const size_t ps = (size_t)OS_GQ * OS_PS;
	/* every lane: the max over the splits' maxes */
	float M = -INFINITY;
	for (int j = lane; j < S; j += 32)
		M = fmaxf(M, __ldcg(p0 + j * ps + OS_HD));
	for (int o = 16; o; o >>= 1)
		M = fmaxf(M, __shfl_xor_sync(0xFFFFFFFFu, M, o));
	float L = 0.0f, ox = 0.0f, oy = 0.0f;
	for (int j = warp; j < S; j += MG_W) {
		const float2 v = __ldcg(reinterpret_cast<const float2 *>(p0 + j * ps) + lane);
		const float f = expf(__ldcg(p0 + j * ps + OS_HD) - M);
		L += f * __ldcg(p0 + j * ps + OS_HD + 1);
		ox += f * v.x, oy += f * v.y;
	}
	float4 *red4 = reinterpret_cast<float4 *>(scr);
	red4[warp * 32 + lane] = make_float4(ox, oy, L, 0.0f);
	gt_sync();
	if (warp == 0) {
		float4 t = red4[lane];
#pragma unroll
		for (int w = 1; w < MG_W; w++) {
			const float4 v = red4[w * 32 + lane];
			t.x += v.x, t.y += v.y, t.z += v.z;
		}
		const float inv = 1.0f / (t.z + expf(__ldg(ly.sinks + q) - M));
		*reinterpret_cast<float2 *>(a.att + (size_t)l * OS_QR + q * OS_HD + 2 * lane) = make_float2(t.x * inv, t.y * inv);
	}
	mg_cpub(cnt + O_ATT, 1, tid);
}

#endif
