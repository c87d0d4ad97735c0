/* mega_bench.cu: a persistent decode step for qwen3-30b-a3b's geometry, one launch for all 48
 * layers, to measure what a layer costs when its phases hand over through counters instead of
 * kernel boundaries (issue #6: the MoE model is bound by six launches' latency chains a layer,
 * docs/status.md). A prototype in the kernel lab, not an engine path: weights in a layout of its
 * own, the router in NVFP4 (the model's is BF16), no q/k norm or rotary, a contiguous KV cache.
 *
 * One block an SM (a cooperative launch, so all are resident), 8 consumer warps and a producer
 * warp. Every block runs the same program over the layers and takes its share of each phase by
 * its index:
 *   qkv   320 tiles of 16 rows (x = RMSNorm(h)), k and v written into the cache at pos
 *   attn  NKV x S splits of <= MG_T positions, the last split of a kv head merging
 *   o     128 tiles, K 4096 in two stages, h2 = h + o
 *   route 8 tiles on the last 8 blocks (x = RMSNorm(h2)), the logits
 *   gu    8 slots x 96 tiles of (gate, up) row pairs, SwiGLU out
 *   down  128 tiles, each the 8 slots' rows in order, h' = h2 + sum_s w_s down_s
 * A phase's blocks add their task count to a counter of the layer (release); a phase waits for
 * the counts it needs (acquire), so no phase waits for a launch. The producer copies each task's
 * weights into a ring of shared memory in program order as soon as a slot is free, across phase
 * and layer boundaries: the static matrices of the next phases stream while a phase waits. Only
 * the experts' copies wait, for the router's logits (every block's producer runs the top-k).
 *
 * Weight layout (a tile's stage: <= 2048 K of 16 rows), a 128-element step at a time: 1024 code
 * bytes as [row half h][lane] 16 bytes (lane = 4 g + t: row g + 8 h, chunk t of the step, each
 * 32-bit word in the device's permuted E2M1 order), then 128 scale bytes as [lane] {row g's two
 * E4M3, row g + 8's}. A warp's loads of a step are 512 contiguous bytes, conflict-free, and the
 * step's math is gemv_mma.cuh's gm_step.
 *
 * Usage: mega_bench [check | time [layers] [ctx...]]. check runs 2 layers at two contexts against
 * a CPU reference (every phase's output); time runs the 48-layer step at each context (default
 * 128 and 4096): median us a step and a layer over 20 launches, GB/s of the bytes a step reads,
 * and one layer's phase ends (max over blocks, from its start). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/arrive.cuh"
#include "backend/cuda/gemv_mma.cuh"
#include "backend/cuda/gemv_tma.cuh"
#include "dev_util.h"
#include "numerics/numerics.h"

#define MG_H 2048
#define MG_NQ 32
#define MG_NKV 4
#define MG_HD 128
#define MG_QR (MG_NQ * MG_HD)                    /* 4096 */
#define MG_QKV ((MG_NQ + 2 * MG_NKV) * MG_HD)    /* 5120 */
#define MG_E 128
#define MG_K 8
#define MG_FI 768
#define MG_STEP 1152           /* 16 rows x 128 K: 1024 code bytes + 128 scale bytes */
#define MG_STAGE (16 * MG_STEP) /* 16 rows x 2048 K */
#define MG_DSTAGE (6 * MG_STEP) /* 16 rows x 768 K */
#define MG_NS 10
#define MG_W 8
#define MG_THREADS ((MG_W + 1) * 32)
#define MG_T 128
#define MG_QKV_TILES (MG_QKV / 16)
#define MG_O_TILES (MG_H / 16)
#define MG_R_TILES (MG_E / 16)
#define MG_GU_TILES (2 * MG_FI / 16) /* a slot's */
#define MG_D_TILES (MG_H / 16)
#define MG_CS_H 4128  /* gm_col_stride(2048 / 32) */
#define MG_CS_Q 8224  /* gm_col_stride(4096 / 32) */
#define MG_CS_F 1568  /* gm_col_stride(768 / 32) */
#define MG_XS (MG_K * 2 * MG_CS_F)
#define MG_SMEM (MG_NS * MG_STAGE + MG_XS + 2 * MG_W * 16 * 4 + 64 * 8 + 256)

enum { C_QKV, C_ATT, C_O, C_R, C_GU, C_D, C_N };
#define MG_CNT (C_N + 4 * MG_NKV) /* counters a layer: the phases', then each (kv head, head group)'s splits */
#define MG_TL (C_N + 5) /* timeline entries a block: the consumers' 7 marks, the producer's top-k, last
                         * expert copy, top-k entry and count seen */

struct mg_layer {
	const uint8_t *qkv, *o, *r, *gu, *dn;
	const float *n1, *n2;
	__nv_bfloat16 *kc, *vc; /* [NKV][ctx_max][HD] */
};

struct mg_args {
	const mg_layer *ly;
	int L, ctx, ctx_max, S, T;
	float post, eps;
	const float *h0;
	float *h;      /* [L + 1][H]: h[0] = h0 copied by the host */
	float *h2;     /* [L][H] */
	float *q;      /* [L][QR] */
	float *att;    /* [L][QR] */
	float *part;   /* [L][NKV][S][8][HD + 2] */
	float *logits; /* [L][E] */
	float *act;    /* [L][K][FI] */
	int32_t *sel;  /* [L][K] */
	unsigned *cnt; /* [L][MG_CNT], zero at launch */
	unsigned long long *tl; /* [G][C_N + 1] for layer tl_layer (NULL: none) */
	int tl_layer;
	size_t gu_stride, dn_stride;
	/* experiments (time mode only, MG_* environment variables): */
	int csplit;   /* MG_CSPLIT: copies a stage (1: one bulk copy; 2, 4, 8, 16: by step groups) */
	int exstatic; /* MG_EXSTATIC=1: the producer copies experts (8 l + slot) % 128 before the top-k
	               * (results wrong: what the routing dependency costs) */
	int expool;   /* MG_EXPOOL=1: every layer's experts are layer 0's (TLB / locality) */
	int poll;     /* MG_POLL: mg_poll's form */
	int aring;    /* MG_ARING (default 1): attention's K and V rows before pos through the ring */
	int dwarp;    /* MG_DWARP (default 1): the down's 8 slots a warp each, in one round */
	int hgn;      /* head groups a kv head's attention is split in (1, 2, 4; MG_HGN, default: the most
	               * with NKV x S x hgn <= G / 4) */
};

__device__ int *mg_dg; /* mg_stuck's records (host-mapped), NULL: none */
__device__ unsigned mg_hint; /* MG_HINT: try_wait's suspend-time hint in ns (0: none) */
/* the split merges' records (host-mapped): per (layer, kv head * 4 + head group) MG_DS ints: each
 * split's counter value + 1 at its arrival [0, 64), the merging block's warps at entry [64, 72),
 * published [72], the merging block + 1 [73] */
#define MG_DS 80 /* [74] the published counter's offset from a.cnt, [75] its value before the add */
__device__ int *mg_ds;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
static __device__ __forceinline__ unsigned mg_ld_acq(const unsigned *c)
{
	unsigned v;
	asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
	return v;
}

static __device__ __forceinline__ unsigned mg_ld_rlx(const unsigned *c)
{
	unsigned v;
	asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
	return v;
}

/* hang diagnostics: a wait that lasts over a second records (what, aux, value) in host-mapped
 * memory at [block][warp], which the host prints when the launch does not finish */
static __device__ __noinline__ void mg_stuck(int what, unsigned aux, unsigned v)
{
	if (!mg_dg)
		return;
	volatile int *d = mg_dg + 4 * (blockIdx.x * (MG_W + 1) + (threadIdx.x >> 5));
	d[1] = (int)aux, d[2] = (int)v, d[3] = threadIdx.x & 31;
	__threadfence_system();
	d[0] = what;
	__threadfence_system();
}

/* mbarrier wait with the diagnostics */
static __device__ __forceinline__ void mg_wbar(uint64_t *b, unsigned parity, int what, unsigned aux)
{
	uint32_t ok;
	unsigned long long t0 = 0;
	for (unsigned it = 0;; it++) {
		if (mg_hint)
			asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n\t"
			             "selp.u32 %0, 1, 0, p;\n\t}"
			             : "=r"(ok)
			             : "r"(gt_sa(b)), "r"(parity), "r"(mg_hint)
			             : "memory");
		else
			asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
			             "selp.u32 %0, 1, 0, p;\n\t}"
			             : "=r"(ok)
			             : "r"(gt_sa(b)), "r"(parity)
			             : "memory");
		if (ok)
			return;
		if ((it & 1023) == 0) {
			const unsigned long long t = gm_now();
			if (!t0)
				t0 = t;
			else if (t - t0 > 1000000000ull && t0 != ~0ull) {
				mg_stuck(what, aux, parity);
				t0 = ~0ull;
			}
		}
	}
}

/* waits until *c >= target: acquire loads (poll 0), or relaxed loads and one fence after (1), the
 * same with a pause between loads (2) */
static __device__ __forceinline__ void mg_poll(const unsigned *c, unsigned target, int poll)
{
	if (poll == 0) {
		unsigned long long t0 = 0;
		for (unsigned it = 0;; it++) {
			const unsigned v = mg_ld_acq(c);
			if (v >= target)
				return;
			if ((it & 1023) == 0) {
				const unsigned long long t = gm_now();
				if (!t0)
					t0 = t;
				else if (t - t0 > 1000000000ull && t0 != ~0ull) {
					mg_stuck(100, (unsigned)(uintptr_t)c, (v << 16) | target);
					t0 = ~0ull;
				}
			}
		}
	}
	while (mg_ld_rlx(c) < target)
		if (poll == 2)
			__nanosleep(64);
	asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

static __device__ __forceinline__ void mg_pub(unsigned *c, unsigned n)
{
	asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(c), "r"(n) : "memory");
}

/* the consumers wait until *c >= target (thread 0 polls; the barrier orders the others' loads) */
static __device__ __forceinline__ void mg_cwait(const unsigned *c, unsigned target, int tid, int poll)
{
	if (tid == 0)
		mg_poll(c, target, poll);
	gt_sync();
}

static __device__ __forceinline__ uint32_t mg_lds32(uint32_t sa)
{
	uint32_t v;
	asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(sa));
	return v;
}

static __device__ __forceinline__ void mg_mark(const mg_args &a, int l, int ph, int tid)
{
	if (a.tl && l == a.tl_layer && tid == 0)
		a.tl[blockIdx.x * MG_TL + ph] = gm_now();
}

/* x = v * rsqrt(mean(v^2) + eps) * nw over H, staged (hi, lo) into xs (column stride MG_CS_H) */
static __device__ void mg_stage_norm(const float *v, const float *nw, float eps, uint8_t *xs, float *sred, int tid)
{
	const int k0 = tid * 8;
	const float4 a = __ldcg(reinterpret_cast<const float4 *>(v + k0));
	const float4 b = __ldcg(reinterpret_cast<const float4 *>(v + k0 + 4));
	const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
	float ss = 0.0f;
#pragma unroll
	for (int i = 0; i < 8; i++)
		ss += x[i] * x[i];
	for (int o = 16; o; o >>= 1)
		ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
	if ((tid & 31) == 0)
		sred[tid >> 5] = ss;
	gt_sync();
	float tot = 0.0f;
#pragma unroll
	for (int w = 0; w < MG_W; w++)
		tot += sred[w];
	const float r = 1.0f / sqrtf(tot / (float)MG_H + eps);
#pragma unroll
	for (int i = 0; i < 8; i++)
		gm_st_put(xs, MG_CS_H, k0 + i, x[i] * r * __ldg(nw + k0 + i));
	gt_sync();
}

/* n plain values of v (n % 4 == 0, n <= 4 * 4 * 256) staged into xs at column stride cs: every
 * thread's loads issued before the first is used (one L2 round trip, not one a round) */
static __device__ void mg_stage_plain(const float *v, int n, uint8_t *xs, int cs, int tid)
{
	float4 r[4];
#pragma unroll
	for (int u = 0; u < 4; u++) {
		const int i = tid + u * MG_W * 32;
		if (4 * i < n)
			r[u] = __ldcg(reinterpret_cast<const float4 *>(v) + i);
	}
#pragma unroll
	for (int u = 0; u < 4; u++) {
		const int i = tid + u * MG_W * 32;
		if (4 * i < n) {
			gm_st_put(xs, cs, 4 * i, r[u].x);
			gm_st_put(xs, cs, 4 * i + 1, r[u].y);
			gm_st_put(xs, cs, 4 * i + 2, r[u].z);
			gm_st_put(xs, cs, 4 * i + 3, r[u].w);
		}
	}
}

/* the down projection's x: the 8 slots' SwiGLU outputs (8 x 768 floats: 6 float4 a thread, all in
 * flight together), slot s at xs + s * 2 * MG_CS_F */
static __device__ void mg_stage_act(const float *v, uint8_t *xs, int tid)
{
	float4 r[6];
#pragma unroll
	for (int u = 0; u < 6; u++)
		r[u] = __ldcg(reinterpret_cast<const float4 *>(v) + tid + u * MG_W * 32);
#pragma unroll
	for (int u = 0; u < 6; u++) {
		const int i = 4 * (tid + u * MG_W * 32), slot = i / MG_FI, k = i - slot * MG_FI;
		uint8_t *x = xs + slot * 2 * MG_CS_F;
		gm_st_put(x, MG_CS_F, k, r[u].x);
		gm_st_put(x, MG_CS_F, k + 1, r[u].y);
		gm_st_put(x, MG_CS_F, k + 2, r[u].z);
		gm_st_put(x, MG_CS_F, k + 3, r[u].w);
	}
}

/* nst stages of a tile from the ring into acc (this lane's MMA accumulator), x staged at xs_sa
 * (the lane's column picked here), chunk base cb0 + 64 a stage; steps a stage: nsteps */
static __device__ __forceinline__ void mg_tile(float (&acc)[1][4], gt_pos &pos, uint64_t *full, uint64_t *empty,
                                               uint32_t ring_sa, uint32_t xs_sa, int cs, int nst, int nsteps,
                                               int cb0, int warp, int lane)
{
	const int g = lane >> 2, t4 = lane & 3;
	const uint32_t xc[1] = {xs_sa + (uint32_t)((g < 2 ? g : (g & 1)) * cs)};
	for (int c = 0; c < nst; c++) {
		mg_wbar(&full[pos.i], pos.ph, 1, pos.n);
		const uint32_t st = ring_sa + (uint32_t)pos.i * MG_STAGE;
		for (int s = warp; s < nsteps; s += MG_W) {
			const uint32_t sb = st + (uint32_t)s * MG_STEP;
			const uint4 wa = gm_lds128(sb + lane * 16), wb = gm_lds128(sb + 512 + lane * 16);
			const uint32_t sc = mg_lds32(sb + 1024 + lane * 4);
			gm_step<GM_NVFP4, 1>(acc, wa, wb, sc & 0xFFFFu, sc >> 16, 0u, xc, cb0 + c * 64 + s * 4 + t4);
		}
		__syncwarp();
		if (lane == 0)
			gt_arrive(&empty[pos.i]);
		gt_next(pos, MG_NS);
	}
}

/* the tile's 16 row sums (in order over the warps) into red, after the barrier */
static __device__ __forceinline__ void mg_rows(const float (&acc)[4], float *red, int warp, int lane)
{
	if ((lane & 3) == 0) {
		red[warp * 16 + (lane >> 2)] = acc[0] + acc[1];
		red[warp * 16 + 8 + (lane >> 2)] = acc[2] + acc[3];
	}
	gt_sync();
}

static __device__ __forceinline__ float mg_rowsum(const float *red, int r)
{
	float v = 0.0f;
#pragma unroll
	for (int w = 0; w < MG_W; w++)
		v += red[w * 16 + r];
	return v;
}

/* one attention split: kv head g, positions [t0, t1), by the 256 consumer threads */
/* the attention's scores for HP local heads a lane (qs: the group's first head), position t0 +
 * 32 (warp & 3) + lane; K rows before pos from the ring stages ks0 / ks1 (aring) */
template <int HP>
static __device__ __forceinline__ void mg_scores(const float *qs, float *sc, const __nv_bfloat16 *kc, int t0, int n,
                                                 int pos, bool aring, uint32_t ks0, uint32_t ks1, int warp, int lane)
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
	const bool ring = t < pos && aring;
	const uint32_t ks = ((tl >> 6) ? ks1 : ks0) + (uint32_t)(tl & 63) * 256;
	/* lane's chunks in a rotated order: 8 lanes' 16-byte reads of 8 rows 256 bytes apart would
	 * all fall on the same banks */
	const int rot = lane & 7;
#pragma unroll
	for (int half = 0; half < 2; half++) {
		uint4 kv[8];
#pragma unroll
		for (int c = 0; c < 8; c++) {
			const int ch = half * 8 + ((c + rot) & 7);
			kv[c] = ring ? gm_lds128(ks + ch * 16) : t == pos ? __ldcg(kr + ch) : __ldg(kr + ch);
		}
#pragma unroll
		for (int c = 0; c < 8; c++) {
			const __nv_bfloat162 *k2 = reinterpret_cast<const __nv_bfloat162 *>(&kv[c]);
			const int d0 = (half * 8 + ((c + rot) & 7)) * 8;
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

/* positions of split s (of T) before pos = ctx - 1: the ones whose K and V rows exist before the
 * step, copied through the ring (aring) in stages of up to 64 rows, K's then V's */
static __device__ __forceinline__ int mg_attn_m(const mg_args &a, int s)
{
	const int t0 = s * a.T, t1 = min(a.ctx, t0 + a.T);
	return max(0, min(t1, a.ctx - 1) - t0);
}

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
	const float qscale = 0.08838834764831845f; /* 1 / sqrt(128) */
	{
		const float4 v = __ldcg(reinterpret_cast<const float4 *>(a.q + (size_t)l * MG_QR + g * 8 * MG_HD) + tid);
		reinterpret_cast<float4 *>(qs)[tid] = make_float4(v.x * qscale, v.y * qscale, v.z * qscale, v.w * qscale);
	}
	gt_sync();
	/* scores: warp w takes local heads hp (w >> 2) .. +hp, position t0 + 32 (w & 3) + lane (hp
	 * compiled in: a run-time head count's guards cost the depth-4096 attention ~3 us) */
	{
		const uint32_t ks0 = kst[0], ks1 = kst[1];
		const __nv_bfloat16 *kc = ly.kc + (size_t)g * a.ctx_max * MG_HD;
		const bool aring = a.aring;
		if (hp == 4)
			mg_scores<4>(qs + hq0 * MG_HD, sc, kc, t0, n, pos, aring, ks0, ks1, warp, lane);
		else if (hp == 2)
			mg_scores<2>(qs + hq0 * MG_HD, sc, kc, t0, n, pos, aring, ks0, ks1, warp, lane);
		else
			mg_scores<1>(qs + hq0 * MG_HD, sc, kc, t0, n, pos, aring, ks0, ks1, warp, lane);
	}
	gt_sync();
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
			const uint2 *vr = reinterpret_cast<const uint2 *>(ly.vc + ((size_t)g * a.ctx_max + t) * MG_HD) + lane;
			if (t < pos && a.aring) {
				const int i = t - t0;
				uint32_t lo, hi;
				asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];"
				             : "=r"(lo), "=r"(hi)
				             : "r"(((i >> 6) ? vst[1] : vst[0]) + (uint32_t)(i & 63) * 256 + lane * 8));
				vv[u] = make_uint2(lo, hi);
			} else
				vv[u] = t == pos ? __ldcg(vr) : __ldg(vr);
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
	float4 *tree = reinterpret_cast<float4 *>(lstat + 16); /* [4 warps][8 heads][32 lanes] */
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
		gt_sync();
		if (tid == 0)
			mg_pub(cnt + C_ATT, 1);
		return;
	}
	float *pp = a.part + ((((size_t)l * MG_NKV + g) * a.S + s) * 8 + hq0 + warp) * (MG_HD + 2);
	if (warp < nh) {
		*reinterpret_cast<float2 *>(pp + 4 * lane) = make_float2(o4[0], o4[1]);
		*reinterpret_cast<float2 *>(pp + 4 * lane + 2) = make_float2(o4[2], o4[3]);
		if (lane == 0)
			pp[MG_HD] = mstat[warp], pp[MG_HD + 1] = lstat[warp];
	}
	gt_sync();
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
	if (rec && lane == 0)
		rec[64 + warp] = 1;
	if (warp >= nh) {
		gt_sync();
		return;
	}
	/* the merge: warp h. The splits' (max, sum) pairs a lane each (S <= 64), then the lane's 4
	 * dims of the S partials, 8 splits' loads in flight at a time, summed in split order */
	const float *p0 = a.part + (((size_t)l * MG_NKV + g) * a.S * 8 + hq0 + warp) * (MG_HD + 2);
	const size_t ps = (size_t)8 * (MG_HD + 2);
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
	for (int j0 = 0; j0 < a.S; j0 += 8) {
		float2 va[8], vb[8];
#pragma unroll
		for (int u = 0; u < 8; u++) {
			const float *pj = p0 + min(j0 + u, a.S - 1) * ps + 4 * lane;
			va[u] = __ldcg(reinterpret_cast<const float2 *>(pj));
			vb[u] = __ldcg(reinterpret_cast<const float2 *>(pj + 2));
		}
#pragma unroll
		for (int u = 0; u < 8; u++) {
			const int j = j0 + u;
			const float fj = __shfl_sync(0xFFFFFFFFu, (j & 32) ? f[1] : f[0], j & 31);
			if (j < a.S)
				O[0] += fj * va[u].x, O[1] += fj * va[u].y, O[2] += fj * vb[u].x, O[3] += fj * vb[u].y;
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

/* the producer warp's top-k of layer l: softmax over the 128 logits, the 8 largest (lower index on
 * ties), weights renormalized over the 8 (Qwen3's norm_topk_prob) */
static __device__ void mg_topk(const mg_args &a, int l, int *sel, float *selw, int lane)
{
	const bool mk = a.tl && l == a.tl_layer && lane == 0;
	if (mk)
		a.tl[blockIdx.x * MG_TL + C_N + 3] = gm_now();
	if (lane == 0)
		mg_poll(a.cnt + (size_t)l * MG_CNT + C_R, MG_R_TILES, a.poll);
	if (mk)
		a.tl[blockIdx.x * MG_TL + C_N + 4] = gm_now();
	__syncwarp();
	const float4 v = __ldcg(reinterpret_cast<const float4 *>(a.logits + (size_t)l * MG_E) + lane);
	/* a round: the lane's best (lowest index among equals), then the warp's by shuffles. By
	 * selects: an array indexed at run time went to local memory (14 us a top-k). A form with
	 * order keys, one redux and a ballot a round measured 4.6 us against these 3.3 (call 12). */
	float x[4] = {v.x, v.y, v.z, v.w};
	float m = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
	for (int o = 16; o; o >>= 1)
		m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
	float tot = 0.0f;
	for (int k = 0; k < MG_K; k++) {
		float bv = x[0];
		int bidx = 4 * lane;
#pragma unroll
		for (int i = 1; i < 4; i++)
			if (x[i] > bv)
				bv = x[i], bidx = 4 * lane + i;
		for (int o = 16; o; o >>= 1) {
			const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, o);
			const int oi = __shfl_xor_sync(0xFFFFFFFFu, bidx, o);
			if (ov > bv || (ov == bv && oi < bidx))
				bv = ov, bidx = oi;
		}
#pragma unroll
		for (int i = 0; i < 4; i++)
			if (bidx == 4 * lane + i)
				x[i] = -INFINITY;
		const float w = expf(bv - m);
		tot += w;
		if (lane == 0)
			sel[k] = bidx, selw[k] = w;
	}
	__syncwarp();
	if (lane < MG_K)
		selw[lane] /= tot;
	if (lane < MG_K && a.sel)
		a.sel[(size_t)l * MG_K + lane] = sel[lane];
	__syncwarp();
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
	const int rb = G - MG_R_TILES; /* the router's blocks: rb .. G - 1 */

	if (warp == MG_W) { /* the producer */
		uint64_t pol;
		asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
		gt_pos pp = {0, 0, 0};
		auto issue = [&](const uint8_t *src, unsigned bytes) {
			if (lane == 0) {
				mg_wbar(&empty[pp.i], pp.ph ^ 1u, 3, pp.n);
				gt_expect(&full[pp.i], bytes);
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
			}
			if (b >= rb)
				issue(ly.r + (size_t)(b - rb) * MG_STAGE, MG_STAGE);
			int *sl = sel + (l & 1) * MG_K;
			float *sw = selw + (l & 1) * MG_K;
			const uint8_t *gub = a.expool ? a.ly[0].gu : ly.gu, *dnb = a.expool ? a.ly[0].dn : ly.dn;
			if (!a.exstatic) {
				mg_topk(a, l, sl, sw, lane);
				if (lane == 0)
					gt_arrive(&selbar[l & 1]);
				if (a.tl && l == a.tl_layer && lane == 0)
					a.tl[blockIdx.x * MG_TL + C_N + 1] = gm_now();
			}
			for (int j = b; j < MG_K * MG_GU_TILES; j += G) {
				const int slot = j / MG_GU_TILES, t = j - slot * MG_GU_TILES;
				const int e = a.exstatic ? (8 * l + slot) % MG_E : sl[slot];
				issue(gub + (size_t)e * a.gu_stride + (size_t)t * MG_STAGE, MG_STAGE);
			}
			if (b < MG_D_TILES)
				for (int slot = 0; slot < MG_K; slot++) {
					const int e = a.exstatic ? (8 * l + slot) % MG_E : sl[slot];
					issue(dnb + (size_t)e * a.dn_stride + (size_t)b * MG_DSTAGE, MG_DSTAGE);
				}
			if (a.tl && l == a.tl_layer && lane == 0)
				a.tl[blockIdx.x * MG_TL + C_N + 2] = gm_now();
			if (a.exstatic) {
				mg_topk(a, l, sl, sw, lane);
				if (lane == 0)
					gt_arrive(&selbar[l & 1]);
				if (a.tl && l == a.tl_layer && lane == 0)
					a.tl[blockIdx.x * MG_TL + C_N + 1] = gm_now();
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
		mg_mark(a, l, 0, tid);
		/* qkv */
		if (b < MG_QKV_TILES) {
			mg_stage_norm(h, ly.n1, a.eps, xs, sred, tid);
			int n = 0;
			for (int j = b; j < MG_QKV_TILES; j += G, n++) {
				float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
				mg_tile(acc, pos, full, empty, ring_sa, xs_sa, MG_CS_H, 1, 16, 0, warp, lane);
				float *rd = red + rpar * MG_W * 16;
				rpar ^= 1;
				mg_rows(acc[0], rd, warp, lane);
				if (tid < 16) {
					const int row = j * 16 + tid;
					const float y = ldexpf(mg_rowsum(rd, tid), 14) * a.post;
					if (row < MG_QR)
						a.q[(size_t)l * MG_QR + row] = y;
					else {
						const int r = row - MG_QR, kv = r / (MG_NKV * MG_HD), rr = r % (MG_NKV * MG_HD);
						__nv_bfloat16 *dst = (kv ? ly.vc : ly.kc) +
						                     ((size_t)(rr / MG_HD) * a.ctx_max + (a.ctx - 1)) * MG_HD + rr % MG_HD;
						*dst = __float2bfloat16_rn(y);
					}
				}
			}
			gt_sync();
			if (tid == 0)
				mg_pub(cnt + C_QKV, n);
		}
		mg_mark(a, l, 1, tid);
		/* attention */
		for (int t = b; t < MG_NKV * a.S * a.hgn; t += G) {
			mg_cwait(cnt + C_QKV, MG_QKV_TILES, tid, a.poll);
			const int gs = t / a.hgn;
			mg_attn(a, ly, l, gs / a.S, gs % a.S, t % a.hgn, reinterpret_cast<float *>(xs), tid, pos, full, empty,
			        ring_sa);
			gt_sync();
		}
		mg_mark(a, l, 2, tid);
		/* o */
		if (b < MG_O_TILES) {
			mg_cwait(cnt + C_ATT, MG_NKV * a.hgn, tid, a.poll);
			mg_stage_plain(a.att + (size_t)l * MG_QR, MG_QR, xs, MG_CS_Q, tid);
			gt_sync();
			float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
			mg_tile(acc, pos, full, empty, ring_sa, xs_sa, MG_CS_Q, 2, 16, 0, warp, lane);
			float *rd = red + rpar * MG_W * 16;
			rpar ^= 1;
			mg_rows(acc[0], rd, warp, lane);
			if (tid < 16) {
				const int row = b * 16 + tid;
				h2[row] = __ldcg(h + row) + ldexpf(mg_rowsum(rd, tid), 14) * a.post;
			}
			gt_sync();
			if (tid == 0)
				mg_pub(cnt + C_O, 1);
		}
		mg_mark(a, l, 3, tid);
		/* the router, and x of the experts' gate|up: RMSNorm(h2) */
		const bool gu = b < MG_K * MG_GU_TILES;
		if (b >= rb || gu) {
			mg_cwait(cnt + C_O, MG_O_TILES, tid, a.poll);
			mg_stage_norm(h2, ly.n2, a.eps, xs, sred, tid);
		}
		if (b >= rb) {
			float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
			mg_tile(acc, pos, full, empty, ring_sa, xs_sa, MG_CS_H, 1, 16, 0, warp, lane);
			float *rd = red + rpar * MG_W * 16;
			rpar ^= 1;
			mg_rows(acc[0], rd, warp, lane);
			if (tid < 16)
				a.logits[(size_t)l * MG_E + (b - rb) * 16 + tid] = ldexpf(mg_rowsum(rd, tid), 14) * a.post;
			gt_sync();
			if (tid == 0)
				mg_pub(cnt + C_R, 1);
		}
		mg_mark(a, l, 4, tid);
		/* the experts' gate|up (their copies wait for the producer's top-k) */
		if (gu) {
			int n = 0;
			for (int j = b; j < MG_K * MG_GU_TILES; j += G, n++) {
				const int slot = j / MG_GU_TILES, t = j - slot * MG_GU_TILES;
				float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
				mg_tile(acc, pos, full, empty, ring_sa, xs_sa, MG_CS_H, 1, 16, 0, warp, lane);
				float *rd = red + rpar * MG_W * 16;
				rpar ^= 1;
				mg_rows(acc[0], rd, warp, lane);
				if (tid < 8) {
					const float gt = ldexpf(mg_rowsum(rd, 2 * tid), 14) * a.post;
					const float up = ldexpf(mg_rowsum(rd, 2 * tid + 1), 14) * a.post;
					a.act[((size_t)l * MG_K + slot) * MG_FI + t * 8 + tid] = silu_mul(gt, up);
				}
			}
			gt_sync();
			if (tid == 0)
				mg_pub(cnt + C_GU, n);
		}
		mg_mark(a, l, 5, tid);
		/* down, the 8 slots of a row tile summed in order */
		if (b < MG_D_TILES) {
			mg_cwait(cnt + C_GU, MG_K * MG_GU_TILES, tid, a.poll);
			mg_wbar(&selbar[l & 1], (l >> 1) & 1, 4, l);
			mg_stage_act(a.act + (size_t)l * MG_K * MG_FI, xs, tid);
			gt_sync();
			const float *sw = selw + (l & 1) * MG_K;
			float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
			if (a.dwarp) {
				/* warp w takes slot w's stage whole (its 6 steps), then hands every slot's stage
				 * back (a stage is free once all 8 warps arrived, its reader among them): one
				 * round instead of 8 rounds of one step a warp */
				gt_pos q = pos;
				gt_next_n(q, MG_NS, warp);
				mg_wbar(&full[q.i], q.ph, 1, q.n);
				float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
				const int g8 = lane >> 2, t4 = lane & 3;
				const uint32_t xc[1] = {xs_sa + warp * 2 * MG_CS_F + (uint32_t)((g8 < 2 ? g8 : (g8 & 1)) * MG_CS_F)};
				const uint32_t st = ring_sa + (uint32_t)q.i * MG_STAGE;
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
				for (int slot = 0; slot < MG_K; slot++) {
					if (lane == 0)
						gt_arrive(&empty[pos.i]);
					gt_next(pos, MG_NS);
				}
			} else
			for (int slot = 0; slot < MG_K; slot++) {
				float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
				mg_tile(acc, pos, full, empty, ring_sa, xs_sa + slot * 2 * MG_CS_F, MG_CS_F, 1, 6, 0, warp, lane);
				const float c = sw[slot] * 16384.0f * a.post;
#pragma unroll
				for (int e = 0; e < 4; e++)
					tot[e] += c * acc[0][e];
			}
			float *rd = red + rpar * MG_W * 16;
			rpar ^= 1;
			mg_rows(tot, rd, warp, lane);
			if (tid < 16) {
				const int row = b * 16 + tid;
				a.h[(size_t)(l + 1) * MG_H + row] = __ldcg(h2 + row) + mg_rowsum(rd, tid);
			}
			gt_sync();
			if (tid == 0)
				mg_pub(cnt + C_D, 1);
		}
		mg_mark(a, l, 6, tid);
	}
}
#else
__global__ void mg_kernel(const mg_args a) { (void)a; }
#endif

/* ---- host ---------------------------------------------------------------------------------- */

static __device__ __forceinline__ uint32_t mg_hash(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return (uint32_t)x;
}

/* random tiled weights: code bytes random, scale bytes E4M3 in [2^-3, 2^-1) */
__global__ void mg_fill_w(uint8_t *p, size_t n, uint64_t seed)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		const uint32_t r = mg_hash(seed * 0x9E3779B97F4A7C15ull + i);
		p[i] = (i % MG_STEP) >= 1024 ? (uint8_t)(0x20 + (r & 15)) : (uint8_t)r;
	}
}

__global__ void mg_fill_f(float *p, size_t n, uint64_t seed, float lo, float hi)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = lo + (hi - lo) * (float)(mg_hash(seed * 0x9E3779B97F4A7C15ull + i) >> 8) * (1.0f / 16777216.0f);
}

__global__ void mg_fill_bf(__nv_bfloat16 *p, size_t n, uint64_t seed)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = __float2bfloat16_rn(-1.0f + 2.0f * (float)(mg_hash(seed * 0x9E3779B97F4A7C15ull + i) >> 8) *
		                                       (1.0f / 16777216.0f));
}

struct mg_model {
	int L, ctx_max;
	std::vector<mg_layer> ly;
	mg_layer *d_ly;
	size_t qkv_b, o_b, r_b, gu_b, dn_b, kv_b;
	std::vector<void *> bufs;
};

static void *mg_alloc(mg_model &m, size_t bytes)
{
	void *p;
	CK(cudaMalloc(&p, bytes));
	m.bufs.push_back(p);
	return p;
}

static void mg_model_make(mg_model &m, int L, int ctx_max)
{
	m.L = L, m.ctx_max = ctx_max;
	m.qkv_b = (size_t)MG_QKV_TILES * MG_STAGE;
	m.o_b = (size_t)MG_O_TILES * 2 * MG_STAGE;
	m.r_b = (size_t)MG_R_TILES * MG_STAGE;
	m.gu_b = (size_t)MG_GU_TILES * MG_STAGE;
	m.dn_b = (size_t)MG_D_TILES * MG_DSTAGE;
	m.kv_b = (size_t)MG_NKV * ctx_max * MG_HD;
	m.ly.resize(L);
	for (int l = 0; l < L; l++) {
		mg_layer &y = m.ly[l];
		uint8_t *w = (uint8_t *)mg_alloc(m, m.qkv_b + m.o_b + m.r_b + MG_E * (m.gu_b + m.dn_b));
		const size_t nw = m.qkv_b + m.o_b + m.r_b + MG_E * (m.gu_b + m.dn_b);
		mg_fill_w<<<1024, 256>>>(w, nw, 1000 + l);
		y.qkv = w, y.o = w + m.qkv_b, y.r = y.o + m.o_b, y.gu = y.r + m.r_b, y.dn = y.gu + MG_E * m.gu_b;
		float *n = (float *)mg_alloc(m, 2 * MG_H * sizeof(float));
		mg_fill_f<<<16, 256>>>(n, 2 * MG_H, 2000 + l, 0.8f, 1.2f);
		y.n1 = n, y.n2 = n + MG_H;
		__nv_bfloat16 *kv = (__nv_bfloat16 *)mg_alloc(m, 2 * m.kv_b * sizeof(__nv_bfloat16));
		mg_fill_bf<<<256, 256>>>(kv, 2 * m.kv_b, 3000 + l);
		y.kc = kv, y.vc = kv + m.kv_b;
	}
	CK(cudaGetLastError());
	CK(cudaMalloc(&m.d_ly, L * sizeof(mg_layer)));
	CK(cudaMemcpy(m.d_ly, m.ly.data(), L * sizeof(mg_layer), cudaMemcpyHostToDevice));
	CK(cudaDeviceSynchronize());
}

struct mg_run {
	mg_args a;
	int G;
	float *d_h0;
};

static void mg_run_make(mg_run &r, const mg_model &m, int L, int ctx, int T, int G)
{
	memset(&r.a, 0, sizeof r.a);
	mg_args &a = r.a;
	r.G = G;
	a.ly = m.d_ly, a.L = L, a.ctx = ctx, a.ctx_max = m.ctx_max, a.T = T, a.S = (ctx + T - 1) / T;
	a.post = 1.0f / 16.0f, a.eps = 1e-6f;
	a.gu_stride = m.gu_b, a.dn_stride = m.dn_b;
	CK(cudaMalloc(&a.h, (size_t)(L + 1) * MG_H * 4));
	CK(cudaMalloc(&a.h2, (size_t)L * MG_H * 4));
	CK(cudaMalloc(&a.q, (size_t)L * MG_QR * 4));
	CK(cudaMalloc(&a.att, (size_t)L * MG_QR * 4));
	CK(cudaMalloc(&a.part, (size_t)L * MG_NKV * a.S * 8 * (MG_HD + 2) * 4));
	CK(cudaMalloc(&a.logits, (size_t)L * MG_E * 4));
	CK(cudaMalloc(&a.act, (size_t)L * MG_K * MG_FI * 4));
	CK(cudaMalloc(&a.sel, (size_t)L * MG_K * 4));
	CK(cudaMalloc(&a.cnt, (size_t)L * MG_CNT * 4));
	CK(cudaMalloc(&a.tl, (size_t)G * MG_TL * 8));
	a.csplit = getenv("MG_CSPLIT") ? atoi(getenv("MG_CSPLIT")) : 1;
	a.exstatic = getenv("MG_EXSTATIC") ? atoi(getenv("MG_EXSTATIC")) : 0;
	a.expool = getenv("MG_EXPOOL") ? atoi(getenv("MG_EXPOOL")) : 0;
	a.poll = getenv("MG_POLL") ? atoi(getenv("MG_POLL")) : 0;
	a.aring = getenv("MG_ARING") ? atoi(getenv("MG_ARING")) : 1;
	a.dwarp = getenv("MG_DWARP") ? atoi(getenv("MG_DWARP")) : 1;
	a.hgn = 1;
	while (a.hgn < 4 && MG_NKV * a.S * a.hgn * 2 <= G / 2)
		a.hgn *= 2;
	if (getenv("MG_HGN"))
		a.hgn = atoi(getenv("MG_HGN"));
	a.tl_layer = L / 2;
	mg_fill_f<<<8, 256>>>(a.h, MG_H, 7, -1.0f, 1.0f);
	CK(cudaGetLastError());
	a.h0 = a.h;
}

static int *mg_dg_host, *mg_ds_host;
static int mg_L, mg_S, mg_hgn;
static unsigned mg_cnt_lo; /* the counters' address, low 32 bits, for the dump */
static int mg_G;

/* waits for the stream up to 20 s; then prints every recorded wait and ends the program */
static void mg_finish(cudaStream_t s)
{
	for (int i = 0; i < 20000; i++) {
		const cudaError_t e = cudaStreamQuery(s);
		if (e == cudaSuccess)
			return;
		if (e != cudaErrorNotReady)
			CK(e);
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	if (!mg_dg_host) {
		printf("HANG: the launch did not finish in 20 s (MG_DIAG=1 says where)\n");
		exit(2);
	}
	printf("HANG: the launch did not finish in 20 s; each block's last wait over 1 s (consumer warp 0, "
	       "then the producer):\n");
	for (int b = 0; b < mg_G; b++)
		for (int w = 0; w <= MG_W; w += MG_W) {
			const volatile int *d = mg_dg_host + 4 * (b * (MG_W + 1) + w);
			if (!d[0]) {
				printf("  block %d %s: none\n", b, w ? "producer" : "consumers");
				continue;
			}
			if (d[0] == 100) {
				const unsigned off = ((unsigned)d[1] - mg_cnt_lo) / 4;
				printf("  block %d %s: counter layer %u index %u at %u of %u\n", b, w ? "producer" : "consumers",
				       off / MG_CNT, off % MG_CNT, (unsigned)d[2] >> 16, (unsigned)d[2] & 0xFFFF);
			} else
				printf("  block %d %s: barrier kind %d (1 full/tile, 2 full/attn, 3 empty, 4 selbar) n %d "
				       "parity %d\n",
				       b, w ? "producer" : "consumers", d[0], d[1], d[2]);
		}
	printf("split merges (layer, kv head, head group): published where, or arrivals, the largest "
	       "value seen, the merging warps:\n");
	for (int l = 0; l < mg_L; l++)
		for (int gh = 0; gh < 16; gh++) {
			if ((gh & 3) >= mg_hgn || mg_S < 2)
				continue;
			const volatile int *r = mg_ds_host + ((size_t)l * 16 + gh) * MG_DS;
			if (r[72]) {
				printf("  layer %d head %d group %d: published by block %d to counter %d (layer %d index %d), "
				       "value before %d\n",
				       l, gh / 4, gh & 3, r[73] - 1, r[74], r[74] / MG_CNT, r[74] % MG_CNT, r[75]);
				continue;
			}
			int n = 0, mx = 0;
			for (int i = 0; i < mg_S && i < 64; i++)
				if (r[i])
					n++, mx = r[i] > mx ? r[i] : mx;
			printf("  layer %d head %d group %d: %d of %d arrivals, largest %d (S %d), warps in merge:", l, gh / 4,
			       gh & 3, n, mg_S, mx, mg_S);
			for (int w = 0; w < MG_W; w++)
				printf(" %d", r[64 + w]);
			printf("\n");
		}
	fflush(stdout);
	exit(2);
}

static void mg_launch(mg_run &r, cudaStream_t s)
{
	if (mg_ds_host)
		memset(mg_ds_host, 0, (size_t)48 * 16 * MG_DS * sizeof(int));
	mg_L = r.a.L, mg_S = r.a.S, mg_hgn = r.a.hgn;
	CK(cudaMemsetAsync(r.a.cnt, 0, (size_t)r.a.L * MG_CNT * 4, s));
	void *args[] = {(void *)&r.a};
	CK(cudaLaunchCooperativeKernel((void *)mg_kernel, r.G, MG_THREADS, args, MG_SMEM, s));
}

/* ---- the CPU reference ---------------------------------------------------------------------- */

/* rows [r0, r1) of a tiled matrix (K columns) decoded to floats (times post) */
static void mg_decode(const uint8_t *t, int K, int r0, int r1, float post, float *out)
{
	const int KS = K < 2048 ? K : 2048, nch = K / KS, SB = KS / 128 * MG_STEP;
	for (int r = r0; r < r1; r++) {
		const int tile = r / 16, rr = r % 16, hh = rr / 8, g = rr % 8;
		for (int k = 0; k < K; k++) {
			const int c = k / KS, kk = k % KS, s = kk / 128, t4 = (kk % 128) / 32, j = (kk % 32) / 8, i = kk % 8;
			const uint8_t *base = t + ((size_t)tile * nch + c) * SB + (size_t)s * MG_STEP;
			uint32_t word;
			memcpy(&word, base + hh * 512 + (g * 4 + t4) * 16 + j * 4, 4);
			const uint32_t code = fp4s_e2m1_perm_code(word, i);
			const uint8_t sc = base[1024 + (g * 4 + t4) * 4 + hh * 2 + (j >= 2)];
			out[(size_t)(r - r0) * K + k] = fp4s_e2m1_to_f32(code) * fp4s_e4m3_to_f32(sc) * post;
		}
	}
}

static std::vector<uint8_t> mg_get(const void *d, size_t bytes)
{
	std::vector<uint8_t> v(bytes);
	CK(cudaMemcpy(v.data(), d, bytes, cudaMemcpyDeviceToHost));
	return v;
}

static std::vector<float> mg_getf(const float *d, size_t n)
{
	std::vector<float> v(n);
	CK(cudaMemcpy(v.data(), d, n * 4, cudaMemcpyDeviceToHost));
	return v;
}

static void mg_matvec(const std::vector<uint8_t> &t, int N, int K, float post, const float *x, float *y)
{
	std::vector<float> w((size_t)16 * K);
	for (int r0 = 0; r0 < N; r0 += 16) {
		mg_decode(t.data(), K, r0, r0 + 16, post, w.data());
		for (int r = 0; r < 16; r++) {
			double s = 0.0;
			for (int k = 0; k < K; k++)
				s += (double)w[(size_t)r * K + k] * x[k];
			y[r0 + r] = (float)s;
		}
	}
}

static void mg_norm(const float *h, const float *nw, float eps, float *x)
{
	double ss = 0.0;
	for (int k = 0; k < MG_H; k++)
		ss += (double)h[k] * h[k];
	const float r = (float)(1.0 / sqrt(ss / MG_H + eps));
	for (int k = 0; k < MG_H; k++)
		x[k] = h[k] * r * nw[k];
}

/* relative L2 error of got against want; prints and returns whether within tol */
static int mg_cmp(const char *what, int l, const float *got, const float *want, int n, double tol)
{
	double e = 0.0, s = 0.0;
	for (int i = 0; i < n; i++) {
		const double d = (double)got[i] - want[i];
		e += d * d;
		s += (double)want[i] * want[i];
	}
	const double rel = sqrt(e / (s > 0 ? s : 1.0));
	const int ok = rel <= tol && rel == rel;
	printf("  layer %d %-7s rel L2 %.3e %s\n", l, what, rel, ok ? "ok" : "FAIL");
	return ok;
}

static int mg_check(const mg_model &m, int ctx, int T, int G)
{
	const int L = 2;
	mg_run r;
	mg_run_make(r, m, L, ctx, T, G);
	printf("check: ctx %d, %d splits of %d a kv head, %d head groups, %d blocks\n", ctx, r.a.S, T, r.a.hgn, G);
	/* the cache rows before the launch (the kernel writes position ctx - 1) */
	std::vector<std::vector<uint8_t>> kc(L), vc(L);
	for (int l = 0; l < L; l++) {
		kc[l] = mg_get(m.ly[l].kc, m.kv_b * 2);
		vc[l] = mg_get(m.ly[l].vc, m.kv_b * 2);
	}
	std::vector<float> h = mg_getf(r.a.h, MG_H);
	mg_cnt_lo = (unsigned)(uintptr_t)r.a.cnt;
	mg_launch(r, 0);
	mg_finish(0);
	CK(cudaDeviceSynchronize());
	const float post = r.a.post;
	int ok = 1;
	const std::vector<float> gq = mg_getf(r.a.q, (size_t)L * MG_QR), gatt = mg_getf(r.a.att, (size_t)L * MG_QR);
	const std::vector<float> gh2 = mg_getf(r.a.h2, (size_t)L * MG_H), gh = mg_getf(r.a.h, (size_t)(L + 1) * MG_H);
	const std::vector<float> glog = mg_getf(r.a.logits, (size_t)L * MG_E);
	const std::vector<float> gact = mg_getf(r.a.act, (size_t)L * MG_K * MG_FI);
	std::vector<int32_t> gsel((size_t)L * MG_K);
	CK(cudaMemcpy(gsel.data(), r.a.sel, gsel.size() * 4, cudaMemcpyDeviceToHost));
	for (int l = 0; l < L; l++) {
		const mg_layer &y = m.ly[l];
		const std::vector<float> n = mg_getf(y.n1, 2 * MG_H);
		std::vector<float> x(MG_H), qkv(MG_QKV), att(MG_QR), h2(MG_H), lg(MG_E), hn(MG_H);
		mg_norm(h.data(), n.data(), r.a.eps, x.data());
		mg_matvec(mg_get(y.qkv, m.qkv_b), MG_QKV, MG_H, post, x.data(), qkv.data());
		ok &= mg_cmp("q", l, &gq[(size_t)l * MG_QR], qkv.data(), MG_QR, 1e-4);
		/* the cache at pos holds the kernel's bf16(k), bf16(v): compared with the reference's k and
		 * v (to bf16's precision), then the attention reference reads the kernel's rows, so a
		 * rounding that went the other way is not counted against the attention */
		uint16_t *kb = (uint16_t *)kc[l].data(), *vb = (uint16_t *)vc[l].data();
		{
			const std::vector<uint8_t> ka = mg_get(y.kc, m.kv_b * 2), va = mg_get(y.vc, m.kv_b * 2);
			std::vector<float> got(2 * MG_NKV * MG_HD);
			for (int g = 0; g < MG_NKV; g++)
				for (int d = 0; d < MG_HD; d++) {
					const size_t at = ((size_t)g * m.ctx_max + ctx - 1) * MG_HD + d;
					kb[at] = ((const uint16_t *)ka.data())[at];
					vb[at] = ((const uint16_t *)va.data())[at];
					got[g * MG_HD + d] = fp4s_bf16_to_f32(kb[at]);
					got[MG_NKV * MG_HD + g * MG_HD + d] = fp4s_bf16_to_f32(vb[at]);
				}
			ok &= mg_cmp("k, v", l, got.data(), &qkv[MG_QR], 2 * MG_NKV * MG_HD, 4e-3);
		}
		for (int hq = 0; hq < MG_NQ; hq++) {
			const int g = hq / 8;
			std::vector<double> p(ctx);
			double mx = -INFINITY;
			for (int t = 0; t < ctx; t++) {
				double s = 0.0;
				for (int d = 0; d < MG_HD; d++)
					s += (double)qkv[hq * MG_HD + d] * fp4s_bf16_to_f32(kb[((size_t)g * m.ctx_max + t) * MG_HD + d]);
				p[t] = s / sqrt(128.0);
				mx = std::max(mx, p[t]);
			}
			double sum = 0.0;
			for (int t = 0; t < ctx; t++)
				sum += p[t] = exp(p[t] - mx);
			for (int d = 0; d < MG_HD; d++) {
				double o = 0.0;
				for (int t = 0; t < ctx; t++)
					o += p[t] * fp4s_bf16_to_f32(vb[((size_t)g * m.ctx_max + t) * MG_HD + d]);
				att[hq * MG_HD + d] = (float)(o / sum);
			}
		}
		ok &= mg_cmp("att", l, &gatt[(size_t)l * MG_QR], att.data(), MG_QR, 1e-4);
		mg_matvec(mg_get(y.o, m.o_b), MG_H, MG_QR, post, att.data(), h2.data());
		for (int k = 0; k < MG_H; k++)
			h2[k] += h[k];
		ok &= mg_cmp("h2", l, &gh2[(size_t)l * MG_H], h2.data(), MG_H, 1e-4);
		mg_norm(h2.data(), n.data() + MG_H, r.a.eps, x.data());
		mg_matvec(mg_get(y.r, m.r_b), MG_E, MG_H, post, x.data(), lg.data());
		ok &= mg_cmp("logits", l, &glog[(size_t)l * MG_E], lg.data(), MG_E, 1e-4);
		/* top-k on the CPU's logits */
		std::vector<int> idx(MG_E);
		for (int e = 0; e < MG_E; e++)
			idx[e] = e;
		std::stable_sort(idx.begin(), idx.end(), [&](int p1, int p2) { return lg[p1] > lg[p2]; });
		double wsum = 0.0, w[MG_K];
		for (int k = 0; k < MG_K; k++)
			wsum += w[k] = exp((double)lg[idx[k]] - lg[idx[0]]);
		int same = 1;
		for (int k = 0; k < MG_K; k++)
			same &= gsel[(size_t)l * MG_K + k] == idx[k];
		printf("  layer %d experts %s (", l, same ? "equal" : "DIFFER");
		for (int k = 0; k < MG_K; k++)
			printf("%d%s", gsel[(size_t)l * MG_K + k], k + 1 < MG_K ? " " : ")\n");
		ok &= same;
		for (int k = 0; k < MG_H; k++)
			hn[k] = h2[k];
		for (int k = 0; k < MG_K; k++) {
			const int e = idx[k];
			std::vector<float> gu(2 * MG_FI), act(MG_FI), dn(MG_H);
			mg_matvec(mg_get(y.gu + (size_t)e * m.gu_b, m.gu_b), 2 * MG_FI, MG_H, post, x.data(), gu.data());
			for (int i = 0; i < MG_FI; i++) {
				const float g = gu[2 * i], u = gu[2 * i + 1];
				act[i] = g / (1.0f + expf(-g)) * u;
			}
			char what[16];
			snprintf(what, sizeof what, "act%d", k);
			ok &= mg_cmp(what, l, &gact[((size_t)l * MG_K + k) * MG_FI], act.data(), MG_FI, 1e-4);
			mg_matvec(mg_get(y.dn + (size_t)e * m.dn_b, m.dn_b), MG_H, MG_FI, post, act.data(), dn.data());
			for (int i = 0; i < MG_H; i++)
				hn[i] += (float)(w[k] / wsum) * dn[i];
		}
		ok &= mg_cmp("h out", l, &gh[(size_t)(l + 1) * MG_H], hn.data(), MG_H, 1e-4);
		h = hn;
	}
	return ok;
}

static void mg_time(const mg_model &m, int L, int ctx, int G)
{
	mg_run r;
	mg_run_make(r, m, L, ctx, getenv("MG_TT") ? atoi(getenv("MG_TT")) : MG_T, G);
	cudaStream_t s;
	CK(cudaStreamCreate(&s));
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	mg_cnt_lo = (unsigned)(uintptr_t)r.a.cnt;
	for (int i = 0; i < 3; i++) {
		mg_launch(r, s);
		mg_finish(s);
	}
	std::vector<float> us;
	for (int i = 0; i < 20; i++) {
		if (mg_ds_host)
			memset(mg_ds_host, 0, (size_t)48 * 16 * MG_DS * sizeof(int));
		CK(cudaMemsetAsync(r.a.cnt, 0, (size_t)L * MG_CNT * 4, s));
		CK(cudaEventRecord(e0, s));
		void *args[] = {(void *)&r.a};
		CK(cudaLaunchCooperativeKernel((void *)mg_kernel, r.G, MG_THREADS, args, MG_SMEM, s));
		CK(cudaEventRecord(e1, s));
		mg_finish(s);
		CK(cudaEventSynchronize(e1));
		float ms;
		CK(cudaEventElapsedTime(&ms, e0, e1));
		us.push_back(ms * 1000.0f);
	}
	std::sort(us.begin(), us.end());
	const double med = us[us.size() / 2];
	const double bytes = (double)L * (m.qkv_b + m.o_b + m.r_b + MG_K * (m.gu_b + m.dn_b) +
	                                  2.0 * MG_NKV * ctx * MG_HD * 2);
	printf("time: %d layers, ctx %d (%d splits, %d head groups): step %.1f us (min %.1f, max %.1f), %.2f us a layer, %.0f GB/s "
	       "(%.1f MB a step)\n",
	       L, ctx, r.a.S, r.a.hgn, med, us.front(), us.back(), med / L, bytes / med / 1e3, bytes / 1e6);
	/* one layer's phase ends, max over blocks, from the earliest start */
	std::vector<unsigned long long> tl((size_t)G * MG_TL);
	CK(cudaMemcpy(tl.data(), r.a.tl, tl.size() * 8, cudaMemcpyDeviceToHost));
	unsigned long long t0 = ~0ull;
	for (int b = 0; b < G; b++)
		t0 = std::min(t0, tl[(size_t)b * MG_TL]);
	const char *names[MG_TL] = {"start", "qkv", "attn", "o", "route", "gu", "down", "topk", "excopied", "tk-in", "tk-seen"};
	printf("  layer %d phase ends (us from its first start, max / median over blocks):", r.a.tl_layer);
	for (int p = 0; p < MG_TL; p++) {
		std::vector<double> v;
		for (int b = 0; b < G; b++)
			v.push_back((double)(long long)(tl[(size_t)b * MG_TL + p] - t0) / 1e3);
		std::sort(v.begin(), v.end());
		printf(" %s %.2f/%.2f", names[p], v.back(), v[v.size() / 2]);
	}
	printf("\n");
	CK(cudaStreamDestroy(s));
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "check";
	int dev, G;
	CK(cudaGetDevice(&dev));
	CK(cudaDeviceGetAttribute(&G, cudaDevAttrMultiProcessorCount, dev));
	CK(cudaFuncSetAttribute(mg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, MG_SMEM));
	int per_sm = 0;
	CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mg_kernel, MG_THREADS, MG_SMEM));
	printf("mega_bench: %d SMs, %d block(s) an SM, %d B shared a block\n", G, per_sm, MG_SMEM);
	if (per_sm < 1)
		return 1;
	setvbuf(stdout, NULL, _IOLBF, 0);
	mg_G = G;
	{
		const unsigned hint = getenv("MG_HINT") ? (unsigned)atoi(getenv("MG_HINT")) : 0u;
		CK(cudaMemcpyToSymbol(mg_hint, &hint, sizeof hint));
	}
	/* the hang diagnostics: on for check, for time with MG_DIAG=1 (host-mapped stores and an
	 * atom a merge) */
	if (!strcmp(mode, "check") || (getenv("MG_DIAG") && atoi(getenv("MG_DIAG")))) {
		const size_t bytes = (size_t)G * (MG_W + 1) * 4 * sizeof(int);
		CK(cudaHostAlloc((void **)&mg_dg_host, bytes, cudaHostAllocMapped));
		memset(mg_dg_host, 0, bytes);
		int *dp;
		CK(cudaHostGetDevicePointer((void **)&dp, mg_dg_host, 0));
		CK(cudaMemcpyToSymbol(mg_dg, &dp, sizeof dp));
		const size_t dsb = (size_t)48 * 16 * MG_DS * sizeof(int);
		CK(cudaHostAlloc((void **)&mg_ds_host, dsb, cudaHostAllocMapped));
		memset(mg_ds_host, 0, dsb);
		CK(cudaHostGetDevicePointer((void **)&dp, mg_ds_host, 0));
		CK(cudaMemcpyToSymbol(mg_ds, &dp, sizeof dp));
	}
	if (!strcmp(mode, "check")) {
		mg_model m;
		mg_model_make(m, 2, 512);
		int ok = mg_check(m, 40, 16, G);
		ok &= mg_check(m, 300, MG_T, G);
		ok &= mg_check(m, 1, MG_T, G);
		printf("check: %s\n", ok ? "PASS" : "FAIL");
		return ok ? 0 : 1;
	}
	const int L = argc > 2 ? atoi(argv[2]) : 48;
	mg_model m;
	mg_model_make(m, L, 4096);
	if (argc > 3)
		for (int i = 3; i < argc; i++)
			mg_time(m, L, atoi(argv[i]), G);
	else {
		mg_time(m, L, 128, G);
		mg_time(m, L, 4096, G);
	}
	return 0;
}
