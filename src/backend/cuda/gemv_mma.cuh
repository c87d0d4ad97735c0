/* gemv_mma.cuh: what the decode matmul's two kernels share (gemv_mma.cu: weights loaded into
 * registers by every warp; gemv_tma.cu: weights copied into shared memory by the bulk copy engine):
 * the argument block, the exact FP4 -> BF16 decode and MMA step, and the activation staging. The
 * layout and numerics are described at the top of gemv_mma.cu. */
#ifndef FP4S_GEMV_MMA_CUH
#define FP4S_GEMV_MMA_CUH

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/ld_stream.cuh"
#include "backend/cuda/swiglu.cuh"
#include "numerics/numerics.h"

#define GM_WARPS_MAX 8          /* warps per block of the largest variant */
#define GM_SMEM_MAX (112 * 1024) /* activation staging per block: two blocks an SM still fit */
#define GM_NV_C 112             /* NVFP4 scale exponent offset (see header comment) */
#define GM_WS_FLOATS (4 << 20)  /* split-K partials (16 MB) */
#define GM_CNT (1 << 18)        /* split-K tile counters */
#define GM_SU 2                 /* staging rounds whose loads are issued together */
#define GM_L2PF 0               /* default L2 prefetch distance in tiles (0: measured slower) */

enum { GM_NVFP4 = 0, GM_MXFP4 = 1 };

struct gm_args {
	const uint8_t *data;
	const uint8_t *scales;
	const float *x;
	const float *bias;
	float *y;
	float *ws;
	unsigned *cnt;
	int64_t rows;
	int K;
	int M;       /* tokens in this pass, 1..16 */
	int kb;      /* K elements per block (a multiple of 128) */
	int accumulate;
	int pexp;    /* epilogue: y = ldexp(sum, pexp) * post */
	float post;
	uint32_t ec; /* MXFP4: C, added to each scale exponent */
	/* experts (blockIdx.z = slot): W_{idx[slot]} at these strides, x row (slot / x_div) of
	 * x_stride floats, y row slot; NULL idx = one matrix, M tokens */
	const int32_t *idx;
	int64_t stride_data, stride_scales;
	const float *ws2e;
	int x_div;
	int64_t x_stride;
	int act; /* x is SwiGLU(h): 1 = gate half then up half, 2 = gpt-oss interleaved, clamped, 3 =
	          * interleaved, silu(gate) * up */
	float alpha, limit;
	int probe; /* benchmarks: loads only (results are garbage) */
	/* grouped experts (blockIdx.z = group): g_m[z] tokens (0 = an unused group) of expert
	 * g_expert[z], their x rows xrow[g_off[z] + i] of x (x_stride floats apart; NULL: rows
	 * g_off[z] + i), their y rows g_off[z] + i; M is then the largest group */
	const int32_t *g_expert, *g_off, *g_m, *xrow;
	const float *norm_w; /* x is RMSNorm(x; norm_w) over its K (the layer's input norm) */
	float eps;
	int zero_centred;
	int l2pf; /* tiles of this block prefetched into L2 ahead of the loads (0: none) */
	unsigned long long *stamps; /* benchmarks: per block [entry, after the wait, staged, done] */
	/* rows [0, R/2) are gate, [R/2, R) up (R % 32 == 0, K not split): each block takes a gate
	 * tile and then its up tile, and y[token][R/2] = SwiGLU(gate, up) (the dense MLP's gate|up
	 * projection writing what the down projection reads, with no kernel between them) */
	int pair;
	/* experts, one token: also h[row] += sum_slot cw[slot] * y[slot][row] (the MoE combine),
	 * by the last of the slots' blocks that share blockIdx.x, summing the slots in order */
	const float *cw;
	float *ch;
	/* gemv_tma.cu: ring stages; claim[0] counts tiles claimed after the first round and claim[1]
	 * the blocks done claiming (both back to 0 at the end; NULL: tiles strided, no claims) */
	int stages;
	int tkc;      /* K elements a stage (a multiple of 1024, or K: whole rows) */
	int tsps;     /* 128-element steps a consumer warp takes in a stage */
	int trs, tss; /* a stage's bytes from one row's codes / scales to the next */
	int tstage;   /* bytes a stage */
	int tflat;    /* whole rows, and one copy each for the tile's codes and scales */
	int tscl;     /* each stage holds the whole tile's scales (K's per-row slices not 16-byte units) */
	unsigned *claim;
	int tsu;    /* gemv_tma.cu: staging rounds in flight where x is plain (2 or 4) */
	int tevict; /* gemv_tma.cu: weight copies marked evict-first in L2 */
	/* gemv_tma.cu: a stage's codes and scales as two 2D tensor copies (ttensor), boxes of 16 rows
	 * of trs / tss bytes, i.e. with the padding the per-row copies leave (read from the next
	 * stage's bytes, or zero past the row) */
	int ttensor;
	CUtensorMap tm_codes, tm_scales;
	/* gemv_tma.cu: rows 2i and 2i + 1 are a (gate, up) pair and y (per slot or token) is their
	 * SwiGLU, rows / 2 wide: 1 gpt-oss's clamped form (alpha, limit; expert slots), 2 silu(gate) *
	 * up (a dense MLP's pairs matrix, cuda_upload.cu) */
	int pairact;
	int thold; /* gemv_tma.cu: after the PDL wait the producer copies nothing more until x is staged */
	int tpre;  /* gemv_tma.cu: rounds of tiles strided (and copied) before the PDL wait (-1: the
	            * producer waits first, diagnostics) */
	int twarm;  /* gemv_tma.cu: the norm weight prefetched into L2 before the PDL wait */
	int tprobe; /* gemv_tma.cu, benchmarks (FP4S_GEMV_TMA_PROBE): 1 = the consumers skip the MMA
	             * steps, 2 = the staging too (the copy pipeline alone; results are garbage) */
	/* gemv_tma.cu, one token (M = 1), K % 128 == 0: activations handed over already staged
	 * (gm_st_put's layout, the 2 * cs bytes of a token's hi and lo columns):
	 *  - st_in: x as the kernel before wrote it, taken by one bulk copy instead of gm_stage;
	 *    with norm_w, the values are x * norm weight already and st_ss holds the K / 16
	 *    partial sums of squares of x (summed here in a fixed order);
	 *  - st_out: this launch's outputs also written staged (the SwiGLU of a pairs epilogue, or
	 *    y after the add), times st_nw (+ 1 where st_zc) where set, with each 16-row tile's
	 *    sum of squares of y into st_ssout[tile]. */
	const uint8_t *st_in;
	const float *st_ss;
	uint8_t *st_out;
	const float *st_nw;
	float *st_ssout;
	int st_zc;
	/* gemv_tma.cu's kernel with tile groups (TG = 1): the consumer warps in 2^tgroups groups (0:
	 * one), each on its own tiles (every 2^tgroups-th stage of whole-row stages), tsps then the
	 * steps of a group's warp. Last, in the
	 * struct's padding: the other fields keep their offsets, so kernels that do not read it keep
	 * their code. */
	int tgroups;
};

static __device__ __forceinline__ unsigned long long gm_now(void)
{
	unsigned long long t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

/* One bulk prefetch of [p, p + bytes) into L2 (16-byte aligned, a multiple of 16 bytes): DRAM
 * sees one long sequential read instead of the warps' scattered 64-byte pieces. */
static __device__ __forceinline__ void gm_l2_prefetch(const void *p, uint32_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
	(void)p, (void)bytes;
#endif
}

static __device__ __forceinline__ uint32_t gm_word(const uint4 &v, int j)
{
	return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

/* Pair k of a word of 8 codes in the device's permuted layout (numerics.h): codes 3-k (low half)
 * and 7-k (high) as BF16 bits, each value * 2^-126; 11 operations a word where the stored layout
 * took 15 (llama3-8b decode +2.7-3.3 %, bench/results/2026-11-22-h100-session14.md). */
static __device__ __forceinline__ uint32_t gm_pair(uint32_t q, int k)
{
	return fp4s_e2m1_perm_pair(q, k);
}

static __device__ __forceinline__ uint32_t gm_hmul2(uint32_t a, uint32_t b)
{
	__nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162 *>(&a),
	                           *reinterpret_cast<const __nv_bfloat162 *>(&b));
	return *reinterpret_cast<uint32_t *>(&r);
}

static __device__ __forceinline__ uint32_t gm_bf16_bits(float f)
{
	__nv_bfloat16 b = __float2bfloat16_rn(f);
	return *reinterpret_cast<unsigned short *>(&b);
}

/* both halves = f (exact when f is representable) */
static __device__ __forceinline__ uint32_t gm_bcast(float f)
{
	const uint32_t b = gm_bf16_bits(f);
	return b | (b << 16);
}

/* NVFP4: the chunk's two E4M3 scales (low byte first) -> BF16 pairs of scale * 2^112 */
static __device__ __forceinline__ void gm_nv_scales(uint32_t s2, uint32_t &lo, uint32_t &hi)
{
	__half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)s2, __NV_E4M3);
	const float c = 5.192296858534828e33f; /* 2^112 */
	lo = gm_bcast(__half2float(__half(__half_raw{h.x})) * c);
	hi = gm_bcast(__half2float(__half(__half_raw{h.y})) * c);
}

static __device__ __forceinline__ void gm_mma(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1)
{
	asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
	    "{%8, %9}, {%0, %1, %2, %3};"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* bytes from one staged column to the next: >= the column, and 32 mod 128 */
static __host__ __device__ __forceinline__ int gm_col_stride(int nch)
{
	return nch * 64 + ((nch * 64) % 128 == 0 ? 32 : 96);
}

static __device__ __forceinline__ uint32_t gm_split(float a, float b, uint32_t &lo)
{
	const __nv_bfloat16 ha = __float2bfloat16_rn(a), hb = __float2bfloat16_rn(b);
	const __nv_bfloat16 la = __float2bfloat16_rn(a - __bfloat162float(ha));
	const __nv_bfloat16 lb = __float2bfloat16_rn(b - __bfloat162float(hb));
	lo = (uint32_t)*reinterpret_cast<const unsigned short *>(&la) |
	     ((uint32_t)*reinterpret_cast<const unsigned short *>(&lb) << 16);
	return (uint32_t)*reinterpret_cast<const unsigned short *>(&ha) |
	       ((uint32_t)*reinterpret_cast<const unsigned short *>(&hb) << 16);
}

/* x[ke..ke + 8) of SwiGLU(h) (from its loaded inputs) for a down projection, the same float math as
 * moe.cu's moe_act_kernel: act 1: h = [gate | up] halves of K each; act 2 (gpt-oss): gate and up
 * interleaved, gate clamped above at limit, up to [-limit, limit], gate * sigmoid(alpha gate) *
 * (up + 1); act 3: interleaved, silu(gate) * up. */
static __device__ __forceinline__ void gm_act8(const float4 r[4], int act, float alpha, float limit, float xe[8])
{
	if (act == 1) { /* r: gate[ke..ke + 8), up[ke..ke + 8) */
		const float4 g0 = r[0], g1 = r[1], u0 = r[2], u1 = r[3];
		const float g[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
		const float u[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
		for (int i = 0; i < 8; i++)
			xe[i] = silu_mul(g[i], u[i]);
	} else { /* r: (gate, up) pairs of ke..ke + 8 */
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const float4 q = r[i];
			xe[2 * i] = act == 2 ? swiglu_oai(q.x, q.y, alpha, limit) : silu_mul(q.x, q.y);
			xe[2 * i + 1] = act == 2 ? swiglu_oai(q.z, q.w, alpha, limit) : silu_mul(q.z, q.w);
		}
	}
}

/* Adds each lane's ssq to s_ss[tok] (tok < 0: nothing); every lane of the warp must call. When a
 * token spans >= 32 items of the pass (wide), a warp's 32 consecutive items hold at most two
 * tokens: two masked warp sums and two shared adds instead of 32 adds to one address. */
static __device__ __forceinline__ void gm_add_ss(float *s_ss, int tok, float ssq, bool wide)
{
	if (!wide) {
		if (tok >= 0)
			atomicAdd(&s_ss[tok], ssq);
		return;
	}
	const int lane = threadIdx.x & 31;
	const int t0 = __shfl_sync(0xFFFFFFFFu, tok, 0), t1 = __reduce_max_sync(0xFFFFFFFFu, tok);
	float v0 = tok == t0 ? ssq : 0.0f, v1 = tok == t0 ? 0.0f : ssq;
	for (int o = 16; o; o >>= 1) {
		v0 += __shfl_xor_sync(0xFFFFFFFFu, v0, o);
		v1 += __shfl_xor_sync(0xFFFFFFFFu, v1, o);
	}
	if (lane == 0 && t0 >= 0) {
		atomicAdd(&s_ss[t0], v0);
		if (t1 != t0)
			atomicAdd(&s_ss[t1], v1);
	}
}

/* Stages x[M][k0..k0 + 32 * nch) as (hi, lo) BF16 pairs in decode order, zero padded past k1,
 * into columns cs bytes apart (token n: columns 2n and 2n + 1), by threads tid < NT (every one
 * must call: the norm's warp sums need every lane). x is the token's row of xin (a.xrow: row
 * xrow[goff + tok] of x_stride floats), times a.norm_w when set, or SwiGLU of a [2K] row (a.act).
 * With ss, each token's sum of squares over the staged range is added into s_ss (the RMSNorm's,
 * applied in the epilogue: 1 / rms commutes with the dot product). Items (8 elements of one
 * token) go in batches of GM_SU rounds: every load of a batch is issued before the first is
 * used, so staging costs one L2 round trip a batch rather than one a round. */
/* x loads: through the read-only path, or (CG) from L2, for x written earlier in the same launch
 * by other blocks (moe_tma.cu), which the read-only path may not see */
template <bool CG>
static __device__ __forceinline__ float4 gm_ldx(const float4 *p)
{
	return CG ? __ldcg(p) : __ldg(p);
}

template <int NT, int SU = GM_SU, bool PLAIN = false, bool CG = false>
static __device__ __forceinline__ void gm_stage(const gm_args &a, uint8_t *sm, int cs, int M, int k0, int k1,
                                                int nch, const float *xin, int goff, float *s_ss, bool ss, int tid)
{
	/* PLAIN: the caller knows x is neither normalized nor SwiGLU's input, so only x's two float4
	 * an item are live and SU rounds of loads can be in flight at once */
	const int per_tok = nch * 4, total = M * per_tok;
	for (int base = 0; base < total; base += SU * NT) {
		float4 raw[SU][4]; /* x (2) and norm weight (2), or the 4 of SwiGLU's input */
		int tk[SU], ke_[SU];
#pragma unroll
		for (int u = 0; u < SU; u++) {
			const int it = base + u * NT + tid;
			tk[u] = -1;
			ke_[u] = k1;
			if (it >= total)
				continue;
			const int tok = it / per_tok, rem = it - tok * per_tok;
			tk[u] = tok;
			ke_[u] = k0 + 32 * (rem >> 2) + 8 * (rem & 3);
			if (ke_[u] >= k1)
				continue;
			const float4 *src;
			if (PLAIN || a.act == 0) {
				const float *xr = a.xrow ? xin + (size_t)a.xrow[goff + tok] * a.x_stride : xin + (size_t)tok * a.K;
				src = reinterpret_cast<const float4 *>(xr + ke_[u]);
				raw[u][0] = gm_ldx<CG>(src), raw[u][1] = gm_ldx<CG>(src + 1);
				if (!PLAIN && a.norm_w) {
					src = reinterpret_cast<const float4 *>(a.norm_w + ke_[u]);
					raw[u][2] = __ldg(src), raw[u][3] = __ldg(src + 1);
				}
			} else if (a.act == 1) { /* token rows of [gate | up], 2K floats */
				src = reinterpret_cast<const float4 *>(xin + (size_t)tok * 2 * a.K + ke_[u]);
				raw[u][0] = gm_ldx<CG>(src), raw[u][1] = gm_ldx<CG>(src + 1);
				src = reinterpret_cast<const float4 *>(xin + (size_t)tok * 2 * a.K + a.K + ke_[u]);
				raw[u][2] = gm_ldx<CG>(src), raw[u][3] = gm_ldx<CG>(src + 1);
			} else { /* gate and up interleaved */
				src = reinterpret_cast<const float4 *>(xin + (size_t)tok * 2 * a.K + 2 * (size_t)ke_[u]);
				raw[u][0] = gm_ldx<CG>(src), raw[u][1] = gm_ldx<CG>(src + 1);
				raw[u][2] = gm_ldx<CG>(src + 2), raw[u][3] = gm_ldx<CG>(src + 3);
			}
		}
#pragma unroll
		for (int u = 0; u < SU; u++) {
			const int tok = tk[u];
			float ssq = 0.0f;
			if (tok >= 0) {
				uint4 hi = make_uint4(0, 0, 0, 0), lo = make_uint4(0, 0, 0, 0);
				if (ke_[u] < k1) {
					float4 p = raw[u][0], q = raw[u][1];
					if (!PLAIN && a.act == 0 && a.norm_w) {
						const float c = a.zero_centred ? 1.0f : 0.0f;
						const float4 r = raw[u][2], t4 = raw[u][3];
						if (ss)
							ssq = p.x * p.x + p.y * p.y + p.z * p.z + p.w * p.w + q.x * q.x +
							      q.y * q.y + q.z * q.z + q.w * q.w;
						p = make_float4(p.x * (c + r.x), p.y * (c + r.y), p.z * (c + r.z), p.w * (c + r.w));
						q = make_float4(q.x * (c + t4.x), q.y * (c + t4.y), q.z * (c + t4.z), q.w * (c + t4.w));
					} else if (!PLAIN && a.act) {
						float xe[8];
						gm_act8(raw[u], a.act, a.alpha, a.limit, xe);
						p = make_float4(xe[0], xe[1], xe[2], xe[3]);
						q = make_float4(xe[4], xe[5], xe[6], xe[7]);
					}
					/* pair k = (x[3 - k], x[7 - k]) */
					hi.x = gm_split(p.w, q.w, lo.x);
					hi.y = gm_split(p.z, q.z, lo.y);
					hi.z = gm_split(p.y, q.y, lo.z);
					hi.w = gm_split(p.x, q.x, lo.w);
				}
				const int rem = base + u * NT + tid - tok * per_tok, lc = rem >> 2, j = rem & 3;
				const int off = lc * 64 + ((j ^ ((lc >> 1) & 1)) * 16);
				*reinterpret_cast<uint4 *>(sm + (size_t)(2 * tok) * cs + off) = hi;
				*reinterpret_cast<uint4 *>(sm + (size_t)(2 * tok + 1) * cs + off) = lo;
			}
			if (!PLAIN && ss)
				gm_add_ss(s_ss, tok, ssq, per_tok >= 32);
		}
	}
}

/* Element k of one token's activations, v, as gm_stage stages it (BF16 hi and lo, columns cs bytes
 * apart, decode order: pair w of item (k / 8) holds elements 3 - w and 7 - w), into st: what the
 * kernel after this one copies in with one bulk copy (gm_args.st_in). */
static __device__ __forceinline__ void gm_st_put(uint8_t *st, int cs, int k, float v)
{
	const int lc = k >> 5, j = (k >> 3) & 3, e = k & 7;
	const int off = lc * 64 + ((j ^ ((lc >> 1) & 1)) * 16) + (3 - (e & 3)) * 4 + (e >> 2) * 2;
	const __nv_bfloat16 hi = __float2bfloat16_rn(v), lo = __float2bfloat16_rn(v - __bfloat162float(hi));
	*reinterpret_cast<__nv_bfloat16 *>(st + off) = hi;
	*reinterpret_cast<__nv_bfloat16 *>(st + cs + off) = lo;
}

/* This lane's B column per token group: token 4gg + g/2, part g%2 (unused tokens read token 0),
 * in the staged activations at xs, columns cs bytes apart. */
template <int NG>
static __device__ __forceinline__ void gm_xcols(const uint8_t *(&xcol)[NG], const uint8_t *xs, int cs, int M, int g)
{
#pragma unroll
	for (int gg = 0; gg < NG; gg++) {
		const int col = 8 * gg + g < 2 * M ? 8 * gg + g : (g & 1);
		xcol[gg] = xs + (size_t)col * cs;
	}
}

/* The MoE combine of a one-token expert launch, by the last of the slots' blocks that share
 * blockIdx.x (they covered the same row tiles, blockIdx.x + i * gridDim.x): h[row] += sum over
 * slots of cw[slot] * y[slot][row], slots summed in order as moe.cu's combine kernel, by NT
 * threads; then the counter is left at 0 for the next launch. The tile count is recomputed
 * here rather than kept live through the main loop (that cost a register spill). */
template <int NT>
static __device__ __forceinline__ void gm_combine_rows(const gm_args &a)
{
	const int nt = (int)((((a.rows + 15) >> 4) - blockIdx.x + gridDim.x - 1) / gridDim.x);
	for (int i = threadIdx.x >> 4; i < nt; i += NT / 16) {
		const int64_t row = ((int64_t)blockIdx.x + (int64_t)i * gridDim.x) * 16 + (threadIdx.x & 15);
		if (row >= a.rows)
			continue;
		/* loads in groups of 4 (in flight together), sums in slot order */
		float acc = 0.0f;
		unsigned j = 0;
		for (; j + 4 <= gridDim.z; j += 4) {
			float o[4];
#pragma unroll
			for (int u = 0; u < 4; u++)
				o[u] = __ldcg(a.y + (size_t)(j + u) * a.rows + row);
#pragma unroll
			for (int u = 0; u < 4; u++)
				acc += __ldcg(a.cw + j + u) * o[u];
		}
		for (; j < gridDim.z; j++)
			acc += __ldcg(a.cw + j) * __ldcg(a.y + (size_t)j * a.rows + row);
		a.ch[row] = a.ch[row] + acc;
	}
	if (threadIdx.x == 0)
		a.cnt[blockIdx.x] = 0; /* ready for the next launch */
}

/* 16 bytes of shared memory by shared-space address (the bulk-copy kernels: gemv_tma.cuh's
 * gt_lds16 says why) */
static __device__ __forceinline__ uint4 gm_lds128(uint32_t sa)
{
	uint4 v;
	asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(sa));
	return v;
}

/* 16 bytes of staged activations, off bytes into a column: by a generic pointer (gemv_mma.cu), or
 * by a shared-space address (the bulk-copy kernels) */
static __device__ __forceinline__ uint4 gm_ldx(const uint8_t *col, int off)
{
	return *reinterpret_cast<const uint4 *>(col + off);
}

static __device__ __forceinline__ uint4 gm_ldx(uint32_t col, int off)
{
	return gm_lds128(col + (uint32_t)off);
}

/* One 128-element step of a lane: its 16 code bytes of rows g (wqa) and g + 8 (wqb) at chunk lc,
 * their scale bytes cai / cbi (NVFP4: two E4M3; MXFP4: one E8M0, 0x100 = a zero scale), decoded
 * to BF16 pairs and multiplied by the staged activations of each token group (xcol: columns as
 * gm_ldx takes them) into acc, the second MMA of each pair into acc2. Two accumulators make two
 * MMA chains of 4 a step, not one of 8: a one-token tile waits on its chain's latency (mstep.cuh's
 * mg_tile: +1.5-2.6 % on llama3-8b, session 51). gm_step passes acc for both. */
template <int F, int NG, typename XP>
static __device__ __forceinline__ void gm_step2(float (&acc)[NG][4], float (&acc2)[NG][4], const uint4 wqa,
                                                const uint4 wqb, uint32_t cai, uint32_t cbi, uint32_t ec,
                                                const XP (&xcol)[NG], int lc)
{
	uint32_t sca0, sca1, scb0, scb1;
	if (F == GM_NVFP4) {
		gm_nv_scales(cai, sca0, sca1);
		gm_nv_scales(cbi, scb0, scb1);
	} else {
		/* 2^(e - 127 + C) as BF16 bits: exponent field e + C (1..254 by the range check) */
		const uint32_t ea = cai & 0x100u ? 0u : ((cai + ec) << 7);
		const uint32_t eb = cbi & 0x100u ? 0u : ((cbi + ec) << 7);
		sca0 = sca1 = ea | (ea << 16);
		scb0 = scb1 = eb | (eb << 16);
	}
	const int sw = (lc >> 1) & 1;
#pragma unroll
	for (int j = 0; j < 4; j++) {
		const uint32_t w0 = gm_word(wqa, j), w1 = gm_word(wqb, j);
		const uint32_t s_a = j < 2 ? sca0 : sca1, s_b = j < 2 ? scb0 : scb1;
		uint32_t A0[4], A1[4];
#pragma unroll
		for (int k = 0; k < 4; k++) {
			A0[k] = gm_hmul2(gm_pair(w0, k), s_a);
			A1[k] = gm_hmul2(gm_pair(w1, k), s_b);
		}
		const int off = lc * 64 + ((j ^ sw) * 16);
#pragma unroll
		for (int gg = 0; gg < NG; gg++) {
			const uint4 xb = gm_ldx(xcol[gg], off);
			gm_mma(acc[gg], A0[0], A1[0], A0[1], A1[1], xb.x, xb.y);
			gm_mma(acc2[gg], A0[2], A1[2], A0[3], A1[3], xb.z, xb.w);
		}
	}
}

template <int F, int NG, typename XP>
static __device__ __forceinline__ void gm_step(float (&acc)[NG][4], const uint4 wqa, const uint4 wqb, uint32_t cai,
                                               uint32_t cbi, uint32_t ec, const XP (&xcol)[NG], int lc)
{
	gm_step2<F, NG, XP>(acc, acc, wqa, wqb, cai, cbi, ec, xcol, lc);
}

/* gemv_tma.cu (compute capability >= 9.0): the ring's geometry for an M-token matmul with K
 * columns into a (returns the stage count, 0 where that kernel does not take it), its launch,
 * and its shared-memory limits (once per device, outside capture). */
int gm_tma_plan(int nv, int64_t K, int M, gm_args *a);
size_t gm_tma_budget(void); /* the shared memory a block may take (after gm_tma_plan's first call) */

/* gemv_mma.cu: the arguments of a one-token expert launch (fp4s_gemv_mma_experts_ex's, pairact as
 * fp4s_gemv_mma_experts_pairact's kind) into *a, planned (a->stages: 0 where the bulk-copy kernel
 * does not take it), and the device's SM count; FP4S_EUNSUPPORTED where the launch would decline. */
struct fp4s_stacked;
struct fp4s_error;
int gm_expert_args(const struct fp4s_stacked *w, const int32_t *idx, int32_t n_slots, const float *x, int32_t x_div,
                   int64_t x_stride, int act, float alpha, float limit, const float *norm_w, float eps,
                   int zero_centred, const float *cw, float *ch, float *y, int pairact, cudaStream_t s, gm_args *a,
                   int *sms, struct fp4s_error *err);
cudaError_t gm_tma_launch(const gm_args &a, int nv, int sms, int nz, cudaStream_t s);
/* gemv_mma.cu: an FP4 matrix's BF16 scale offset C (ec) and its epilogue y = ldexp(sum, pexp) *
 * post (nv: NVFP4, with its tensor scale ws2; MXFP4 by its scales' range e8_range, as struct
 * fp4s_mat's); nonzero where MXFP4 scales span more than BF16 holds exactly or were not measured */
int gm_scale_params(int nv, float ws2, int32_t e8_range, uint32_t *ec, int *pexp, float *post);
cudaError_t gm_tma_attrs(void);

#endif
