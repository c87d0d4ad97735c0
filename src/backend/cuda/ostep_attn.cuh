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

/* position t's row of kv head g in a layer's K or V blocks */
static __device__ __forceinline__ __nv_bfloat16 *os_kvrow(__nv_bfloat16 *base, const int32_t *tab, int t, int g)
{
	return base + ((size_t)(__ldg(tab + t / MG_KVB) * MG_KVB + t % MG_KVB) * OS_NKV + g) * OS_HD;
}

/* key i's (< 144) 16-byte chunk c (< 8) in a K or V slot: blocks of 16 rows of 128 bytes, the
 * 128-byte swizzle (chunk XOR row % 8) */
static __device__ __forceinline__ uint32_t os_kv_sa(uint32_t st, int i, int c)
{
	return st + (uint32_t)(i * 128 + ((c ^ (i & 7)) << 4));
}

/* q's A fragments for the 4 steps of 16 dims (warp w < 4: step w) into qfs[step][lane] */
static __device__ __forceinline__ void os_attn_qfrag(const float *qs, uint4 *qfs, int warp, int lane)
{
	if (warp >= OS_HD / 16)
		return;
	const float *qg = qs + (lane >> 2) * OS_HD + 2 * (lane & 3) + 16 * warp;
	const float2 x0 = *reinterpret_cast<const float2 *>(qg), x1 = *reinterpret_cast<const float2 *>(qg + 8);
	uint4 f;
	f.x = gm_split(x0.x, x0.y, f.y);
	f.z = gm_split(x1.x, x1.y, f.w);
	qfs[warp * 32 + lane] = f;
}

/* keys kw .. kw + 16 of a chunk (mstep_kernel.cuh mg_attn_keys for 64 dims and 8 heads): keys
 * outside [lo, n) are masked (the caller runs it only where one is inside), keys past n read key
 * n - 1's rows. Scores in log2 units. */
template <typename KAt, typename VAt, typename DoneK, typename WaitV>
static __device__ __forceinline__ void os_attn_keys(const uint4 *qfs, int kw, int lo, int n, KAt kat, VAt vat,
                                                    DoneK done_k, WaitV wait_v, float &m, float &l,
                                                    float (&o)[OS_HD / 8][4], int lane)
{
	const int c = lane & 3, j = lane >> 3, r = lane & 7;
	float sa[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
	float sb[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
	{
		const int key = min(kw + 8 * (j >> 1) + r, n - 1);
#pragma unroll
		for (int kk = 0; kk < OS_HD / 16; kk++) {
			uint32_t b0, b1, b2, b3;
			mg_ldsm4(kat(key, 2 * kk + (j & 1)), b0, b1, b2, b3);
			const uint4 f = qfs[kk * 32 + lane];
			float(&s)[2][4] = (kk & 1) ? sb : sa;
			gm_mma(s[0], f.x, f.y, f.z, f.w, b0, b1);
			gm_mma(s[1], f.x, f.y, f.z, f.w, b2, b3);
		}
	}
	float x[2][2], mx = -INFINITY;
#pragma unroll
	for (int t = 0; t < 2; t++)
#pragma unroll
		for (int e = 0; e < 2; e++) {
			const int kk = kw + 8 * t + 2 * c + e;
			const bool in = kk < n && kk >= lo;
			x[t][e] = in ? (sa[t][e] + sa[t][e + 2]) + (sb[t][e] + sb[t][e + 2]) : -INFINITY;
			mx = fmaxf(mx, x[t][e]);
		}
	done_k();
	mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
	mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
	const float mn = fmaxf(m, mx); /* finite: a key of the warp is in range */
	const float al = exp2f(m - mn);
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
		for (int t = 0; t < OS_HD / 8; t++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				o[t][e] *= al;
	uint32_t l0, l1;
	const uint32_t h0 = gm_split(p[0][0], p[0][1], l0), h1 = gm_split(p[1][0], p[1][1], l1);
	wait_v();
	const int key = min(kw + 8 * (j & 1) + r, n - 1);
#pragma unroll
	for (int dp = 0; dp < OS_HD / 16; dp++) {
		uint32_t b0, b1, b2, b3;
		mg_ldsm4t(vat(key, 2 * dp + (j >> 1)), b0, b1, b2, b3);
		gm_mma(o[2 * dp], h0, l0, h1, l1, b0, b1);
		gm_mma(o[2 * dp + 1], h0, l0, h1, l1, b2, b3);
	}
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
	 * max and sum [8][8] each, their sums [8][8][OS_OWS] */
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
			kvp[8 + tid] = __ldcg(reinterpret_cast<const uint4 *>(os_kvrow(ly.vc, tab, pos, g)) + tid);
		const float2 qr = os_rope2(v, c2, s2, lane);
		const float sc2 = a.scale * 1.4426950408889634f; /* log2 e: exp2f in os_attn_keys */
		reinterpret_cast<float2 *>(qs)[tid] = make_float2(qr.x * sc2, qr.y * sc2);
		if (kw7) {
			const float2 k2 = os_rope2(kr, c2, s2, lane);
			const __nv_bfloat162 kb = __floats2bfloat162_rn(k2.x, k2.y);
			reinterpret_cast<__nv_bfloat162 *>(kvp)[lane] = kb;
			reinterpret_cast<__nv_bfloat162 *>(os_kvrow(ly.kc, tab, pos, g))[lane] = kb;
		}
	}
	gt_sync();
	os_attn_qfrag(qs, qfs, warp, lane);
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
			os_attn_keys(
				qfs, kw, lo, n,
				[&](int i, int c) -> uint32_t { return a0 + i < pos ? os_kv_sa(kst, i, c) : kp_sa + (uint32_t)(c << 4); },
				[&](int i, int c) -> uint32_t { return a0 + i < pos ? os_kv_sa(vst, i, c) : vp_sa + (uint32_t)(c << 4); },
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
		}
		if (mm > 0) { /* the chunk's K and V slots: the warps that did not read them hand them back once landed */
			if (lane == 0 && !use)
				for (int c = 0; c < 2; c++) {
					gt_pos q = rp;
					gt_next_n(q, OS_NS, c);
					mg_wbar(&full[q.i], q.ph, 2, q.n);
					gt_arrive(&empty[q.i]);
				}
			gt_next_n(rp, OS_NS, 2);
		}
	}
	/* the warp's max, sum and sums into shared memory */
	{
		const int gg = lane >> 2, c = lane & 3;
		lsum += __shfl_xor_sync(0xFFFFFFFFu, lsum, 1);
		lsum += __shfl_xor_sync(0xFFFFFFFFu, lsum, 2);
		if (c == 0)
			mw[warp * OS_GQ + gg] = m, lw[warp * OS_GQ + gg] = lsum;
		float *row = ow + (warp * OS_GQ + gg) * OS_OWS + 2 * c;
#pragma unroll
		for (int t = 0; t < OS_HD / 8; t++)
			*reinterpret_cast<float2 *>(row + 8 * t) = make_float2(o[t][0] + o[t][2], o[t][1] + o[t][3]);
	}
	gt_sync();
	/* thread: head h = tid / 32's dims d, d + 1, the warps' sums weighed by exp2(max_w - max) */
	const int h = tid >> 5, d = 2 * (tid & 31);
	float M = -INFINITY;
#pragma unroll
	for (int w = 0; w < MG_W; w++)
		M = fmaxf(M, mw[w * OS_GQ + h]);
	float L = 0.0f, ox = 0.0f, oy = 0.0f;
#pragma unroll
	for (int w = 0; w < MG_W; w++) {
		const float f = exp2f(mw[w * OS_GQ + h] - M);
		const float2 v = *reinterpret_cast<const float2 *>(ow + (w * OS_GQ + h) * OS_OWS + d);
		L += f * lw[w * OS_GQ + h];
		ox += f * v.x, oy += f * v.y;
	}
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
