/* gemv_fp4.cu: decode matmul (GEMV / skinny GEMM, M = 1..16 tokens) over packed NVFP4 / MXFP4 and
 * dense BF16 / F16 / F32 weights, FP32 activations and FP32 accumulation. See gemv_cuda.h.
 *
 * Decode is a pure weight stream: a token reads every byte of W once, so the kernel is judged in
 * weight bytes per second against the copy ceiling (performance.md §3). Hopper has no FP4
 * arithmetic, so codes are turned into floats in registers (formats.md §2.2, §9.3).
 *
 * Work split. A "row group" is R consecutive rows. Each row is cut into 16-byte chunks (32 FP4
 * elements, 8 BF16/F16, 4 F32). The S warps that share a row group (split-K, S = ksplit) stride over
 * the chunks: lane l of warp s takes chunks s*32 + l, + 32*S, ... of all R rows at once, so
 *   - every weight load is a 16-byte LDG, coalesced across the warp (512 contiguous bytes a row),
 *     with L1::no_allocate so the stream does not evict the activations from L1; the source
 *     loads the next chunk before using the current one, but ptxas moves those loads after the
 *     math (SASS, 2026-11-21), so latency is hidden by the other warps, not by the prefetch;
 *   - one activation load (x, FP32, L1-resident, 8 floats per LDG.128 pair) feeds R rows: x costs
 *     4*M/R bytes of L1 traffic per weight element, which stays well under L1 bandwidth;
 *   - block scales are loaded next to their chunk (NVFP4: the chunk's two E4M3 bytes as one u16;
 *     MXFP4: one E8M0 byte), coalesced across the warp as well.
 * A row's partial sums are reduced with warp shuffles, then across the S warps in shared memory.
 * S is chosen from the row count and K (launch_fast_r). R = 8 at M = 1 for FP4, else 4 (2 for
 * M > 4 tiles, which the default 4-token FP4 tiling does not use).
 *
 * FP4 now goes to the tensor-core kernel (gemv_mma.cu) by default; these kernels keep dense
 * weights, the shapes it declines, and FP4S_GEMV_KERNEL=fp32 (diagnostics).
 *
 * Where it stands (H100, 2026-11-21; bench/results/2026-11-21-h100-gemv.md): BF16 weights stream
 * at the copy ceiling; FP4 at M = 1 reaches 1.0-1.8 TB/s, short of the 2.2 TB/s floor. ncu shows
 * the FP4 kernel latency-bound (long-scoreboard stalls on the L1-resident x loads, ~23-35% of
 * warp slots occupied, ~42% issue utilisation) with ~5 instructions per weight element (decode
 * ~3.9). An L2 prefetch and a cp.async shared-memory ring for the weights (gemv_async, kept as
 * the opt-in `stages` knob) did not help: the stalls are on x, not on the weight stream. M > 1 is
 * FP32-FMA and L1 bound (x is re-read from L1 per row group); the fix is a tensor-core path.
 *
 * E2M1 -> FP32 with no table (the FP16 trick of formats.md §2.2): the 3 magnitude bits of a code go
 * to FP16 bits 11..9 and its sign to bit 15, which is exactly value * 2^-14 (code 1 is an FP16
 * subnormal; the F16 -> F32 conversion keeps it). Two codes of one 32-bit word decode together as a
 * half2 (elements k and k+4, 4 integer ops), then two conversions give FP32. Each scale block's
 * products are summed in FP32 (psum), then multiplied by the block scale (E4M3 -> F16 -> F32 via
 * the hardware FP8 conversion, exact; E8M0 -> 2^(e-127)) into the row accumulator; the 2^14 and
 * NVFP4's ws2 are applied once in the epilogue. Every product x * (e2m1 * 2^-14) is exact-rounded
 * FP32 and stays a normal number for |x| > 2^-110, so no flush-to-zero question arises (the build
 * does not use -ftz). Compared with multiplying each element by its scale this saves one FMUL per
 * element at M = 1.
 *
 * M > 16 runs as 16-token tiles (the weights are re-read per tile; large M belongs to a tensor-core
 * GEMM). Tokens in a tile beyond M compute on a clamped x row and are not stored.
 */
#include <stdlib.h>
#include <string.h>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/gemv_cuda.h"
#include "backend/cuda/gemv_mma.h"
#include "backend/cuda/ld_stream.cuh"
#include "numerics/numerics.h"

enum gemv_fmt { G_NVFP4 = 0, G_MXFP4 = 1, G_BF16 = 2, G_F16 = 3, G_F32 = 4 };

/* Elements per 16-byte chunk. */
template <int F>
struct gemv_fmt_traits {
	static constexpr int EPC = (F == G_NVFP4 || F == G_MXFP4) ? 32 : (F == G_F32 ? 4 : 8);
	static constexpr bool FP4 = F == G_NVFP4 || F == G_MXFP4;
};

struct gemv_args {
	const uint8_t *data;
	const uint8_t *scales;
	const float *x;
	const float *bias;
	float *y;
	int64_t rows;
	int K;
	int M;      /* tokens in this tile, 1..16 */
	int ksplit; /* warps per row group */
	float post; /* epilogue factor: ws2 * 2^14 folded as two multiplies, see store */
	int pfdist; /* L2 prefetch distance in chunk rounds, 0 = none */
	int accumulate;      /* gemv_fast: y += the product (a residual add) */
	const float *norm_w; /* gemv_fast, dense weights (NORM): x is RMSNorm(x; norm_w) over K */
	float eps;
	float zc;            /* 1: the norm weight is zero-centred (1 + w) */
	int prew;            /* gemv_fast: the first chunk's weight loads issued before the PDL wait */
};

/* gemv_fast_rt, one token, a residual add followed by a MoE block (fp4s_cuda_matmul_add_route):
 * each block's share of the next router's unnormalized logits, the sum over its rows i of
 * w[e][i] (zc + nw[i]) h[i], added in fixed point (2^32) into acc[(*epoch & 1) E + e]
 * (moe_tma.cu). A parameter of its own: a larger gemv_args changes every kernel's code. */
struct gemv_rt {
	const void *w;
	const float *nw;
	long long *acc;
	const unsigned long long *epoch;
	int fmt, E;
	float zc;
};

static __device__ __forceinline__ uint32_t word_of(const uint4 &v, int j)
{
	return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

/* Both halves of a packed half2 (given as bits) to FP32. */
static __device__ __forceinline__ float2 h2bits_to_f2(uint32_t h)
{
	float2 f;
	asm("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %2;\n\tcvt.f32.f16 %0, lo;\n\tcvt.f32.f16 %1, hi;\n}"
	    : "=f"(f.x), "=f"(f.y)
	    : "r"(h));
	return f;
}

/* 8 E2M1 codes of one word (element i in bits 4i..4i+3 once the device's permutation, numerics.h,
 * is undone) -> d[i] = value * 2^-14, exact. Pair k puts code k in the low half and code k+4 in
 * the high half of a half2. */
static __device__ __forceinline__ void e2m1x8_to_f32(uint32_t wp, float d[8])
{
	const uint32_t w = fp4s_e2m1_unpermute_word(wp);
	const uint32_t p0 = ((w << 9) & 0x0E000E00u) | ((w << 12) & 0x80008000u);
	const uint32_t p1 = ((w << 5) & 0x0E000E00u) | ((w << 8) & 0x80008000u);
	const uint32_t p2 = ((w << 1) & 0x0E000E00u) | ((w << 4) & 0x80008000u);
	const uint32_t p3 = ((w >> 3) & 0x0E000E00u) | (w & 0x80008000u);
	float2 f;
	f = h2bits_to_f2(p0);
	d[0] = f.x;
	d[4] = f.y;
	f = h2bits_to_f2(p1);
	d[1] = f.x;
	d[5] = f.y;
	f = h2bits_to_f2(p2);
	d[2] = f.x;
	d[6] = f.y;
	f = h2bits_to_f2(p3);
	d[3] = f.x;
	d[7] = f.y;
}

/* Two E4M3 bytes (low byte = first block) -> FP32, exact (E4M3 fits F16). */
static __device__ __forceinline__ float2 e4m3x2_to_f2(uint32_t s)
{
	__half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)s, __NV_E4M3);
	return make_float2(__half2float(__half(__half_raw{h.x})), __half2float(__half(__half_raw{h.y})));
}

/* Dense words: two BF16 / F16 elements or one F32 element per 32-bit word. */
template <int F>
static __device__ __forceinline__ void dense_to_f32(const uint4 &v, float *d)
{
	const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
	for (int j = 0; j < 4; j++) {
		if (F == G_BF16) {
			d[2 * j] = __uint_as_float(w[j] << 16);
			d[2 * j + 1] = __uint_as_float(w[j] & 0xFFFF0000u);
		} else if (F == G_F16) {
			const float2 f = h2bits_to_f2(w[j]);
			d[2 * j] = f.x;
			d[2 * j + 1] = f.y;
		} else {
			d[j] = __uint_as_float(w[j]);
		}
	}
}

/* L2 prefetch of chunk c of every row (codes and scales): no register is written, so nothing
 * can sink it, and the loads that follow hit L2 instead of DRAM. */
template <int F, int R>
static __device__ __forceinline__ void prefetch_chunk(const uint8_t *const wp[R],
                                                      const uint8_t *const sp[R], int c)
{
#pragma unroll
	for (int r = 0; r < R; r++) {
		asm volatile("prefetch.global.L2 [%0];" ::"l"(wp[r] + (size_t)c * 16));
		if (F == G_NVFP4)
			asm volatile("prefetch.global.L2 [%0];" ::"l"(sp[r] + (size_t)c * 2));
		else if (F == G_MXFP4)
			asm volatile("prefetch.global.L2 [%0];" ::"l"(sp[r] + c));
	}
}

template <int F, int R>
static __device__ __forceinline__ void load_chunk(const uint8_t *const wp[R], const uint8_t *const sp[R],
                                                  int c, uint4 v[R], uint32_t s[R])
{
#pragma unroll
	for (int r = 0; r < R; r++) {
		v[r] = ld_stream16(wp[r] + (size_t)c * 16);
		if (F == G_NVFP4)
			s[r] = ld_stream_u16(sp[r] + (size_t)c * 2);
		else if (F == G_MXFP4)
			s[r] = ld_stream_u8(sp[r] + c);
	}
}

/* One 16-byte chunk of R rows (codes cur, scale bytes cs) against x: acc[r][t] += ... */
template <int F, int R, int MT, bool NORM = false>
static __device__ __forceinline__ void compute_chunk(const uint4 cur[R], const uint32_t cs[R],
                                                     const float *const xt[MT], int c,
                                                     float acc[R][MT], const gemv_args *na = nullptr,
                                                     float *ss = nullptr)
{
	constexpr int EPC = gemv_fmt_traits<F>::EPC;
	if (gemv_fmt_traits<F>::FP4) {
		float ps[R][MT];
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int t = 0; t < MT; t++)
				ps[r][t] = 0.0f;
#pragma unroll
		for (int j = 0; j < 4; j++) {
			float d[R][8];
#pragma unroll
			for (int r = 0; r < R; r++)
				e2m1x8_to_f32(word_of(cur[r], j), d[r]);
#pragma unroll
			for (int t = 0; t < MT; t++) {
				const float4 *xp = reinterpret_cast<const float4 *>(xt[t] + (size_t)c * 32 + 8 * j);
				const float4 u = __ldg(xp), v = __ldg(xp + 1);
#pragma unroll
				for (int r = 0; r < R; r++) {
					float p = ps[r][t];
					p = fmaf(u.x, d[r][0], p);
					p = fmaf(u.y, d[r][1], p);
					p = fmaf(u.z, d[r][2], p);
					p = fmaf(u.w, d[r][3], p);
					p = fmaf(v.x, d[r][4], p);
					p = fmaf(v.y, d[r][5], p);
					p = fmaf(v.z, d[r][6], p);
					p = fmaf(v.w, d[r][7], p);
					ps[r][t] = p;
				}
			}
			/* end of a scale block: 16 elements (2 words) NVFP4, 32 (4 words) MXFP4 */
			if ((F == G_NVFP4 && (j & 1)) || (F == G_MXFP4 && j == 3)) {
#pragma unroll
				for (int r = 0; r < R; r++) {
					float sc;
					if (F == G_NVFP4) {
						const float2 s2 = e4m3x2_to_f2(cs[r]);
						sc = j == 1 ? s2.x : s2.y;
					} else {
						/* 2^(e-127): e = 0 is the FP32 subnormal 2^-127, 255 is NaN */
						const uint32_t e = cs[r];
						sc = __uint_as_float(e == 255 ? 0x7FC00000u : e ? e << 23 : 0x00400000u);
					}
#pragma unroll
					for (int t = 0; t < MT; t++) {
						acc[r][t] = fmaf(ps[r][t], sc, acc[r][t]);
						ps[r][t] = 0.0f;
					}
				}
			}
		}
	} else {
		float d[R][EPC];
#pragma unroll
		for (int r = 0; r < R; r++)
			dense_to_f32<F>(cur[r], d[r]);
		float gv[EPC]; /* NORM: the norm weight of these K (1 / rms is applied at the store) */
		if (NORM) {
			const float4 *gp = reinterpret_cast<const float4 *>(na->norm_w + (size_t)c * EPC);
#pragma unroll
			for (int q = 0; q < EPC / 4; q++) {
				const float4 u = __ldg(gp + q);
				gv[4 * q] = na->zc + u.x;
				gv[4 * q + 1] = na->zc + u.y;
				gv[4 * q + 2] = na->zc + u.z;
				gv[4 * q + 3] = na->zc + u.w;
			}
		}
#pragma unroll
		for (int t = 0; t < MT; t++) {
			const float4 *xp = reinterpret_cast<const float4 *>(xt[t] + (size_t)c * EPC);
			float xv[EPC];
#pragma unroll
			for (int q = 0; q < EPC / 4; q++) {
				const float4 u = __ldg(xp + q);
				xv[4 * q] = u.x;
				xv[4 * q + 1] = u.y;
				xv[4 * q + 2] = u.z;
				xv[4 * q + 3] = u.w;
			}
			if (NORM) {
#pragma unroll
				for (int e = 0; e < EPC; e++) {
					ss[t] = fmaf(xv[e], xv[e], ss[t]);
					xv[e] *= gv[e];
				}
			}
#pragma unroll
			for (int r = 0; r < R; r++)
#pragma unroll
				for (int e = 0; e < EPC; e++)
					acc[r][t] = fmaf(xv[e], d[r][e], acc[r][t]);
		}
	}
}

/* Reduce: across the warp by shuffles, then across the ksplit warps of the group; store with
 * the epilogue factors and bias. Every thread of the CTA must call it (barrier inside). */
template <int F, int R, int MT, bool NORM = false, bool RT = false>
static __device__ __forceinline__ void reduce_store(float acc[R][MT], const gemv_args &a, int64_t row0,
                                                    float *ss = nullptr, float *hrow = nullptr)
{
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int ksplit = a.ksplit;
	const int ngrp = blockDim.x / (32 * ksplit);
	/* NORM: each token's sum of squares over the lanes and the ksplit warps of the group (they
	 * walked all of K between them), then 1 / rms, as the CPU's rmsnorm */
	__shared__ float s_ss[8][16];
	if (NORM) {
#pragma unroll
		for (int t = 0; t < MT; t++) {
			float v = ss[t];
#pragma unroll
			for (int o = 16; o > 0; o >>= 1)
				v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
			ss[t] = v;
		}
		if (lane == 0)
#pragma unroll
			for (int t = 0; t < MT; t++)
				s_ss[warp][t] = ss[t];
		__syncthreads();
		const int g0 = (warp / ksplit) * ksplit;
#pragma unroll
		for (int t = 0; t < MT; t++) {
			float v = 0.0f;
			for (int k = 0; k < ksplit; k++)
				v += s_ss[g0 + k][t];
			ss[t] = 1.0f / sqrtf(v / (float)a.K + a.eps);
		}
	}
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int t = 0; t < MT; t++) {
			float v = acc[r][t];
#pragma unroll
			for (int o = 16; o > 0; o >>= 1)
				v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
			acc[r][t] = v;
		}
	constexpr int NV = R * MT;
	static_assert(NV <= 32, "one lane per (row, token) result");
	float mine = 0.0f;
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int t = 0; t < MT; t++)
			if (lane == r * MT + t)
				mine = NORM ? acc[r][t] * ss[t] : acc[r][t];
	int out_i = -1;
	int64_t out_row0 = row0;
	if (ksplit == 1) {
		out_i = lane < NV ? lane : -1;
	} else {
		__shared__ float red[8][32];
		if (lane < NV)
			red[warp][lane] = mine;
		__syncthreads();
		const int tid = threadIdx.x;
		if (tid < ngrp * NV) {
			const int g = tid / NV;
			out_i = tid % NV;
			float s = 0.0f;
			for (int k = 0; k < ksplit; k++)
				s += red[g * ksplit + k][out_i];
			mine = s;
			out_row0 = ((int64_t)blockIdx.x * ngrp + g) * R;
		}
	}
	if (out_i >= 0) {
		const int r = out_i / MT, t = out_i % MT;
		const int64_t row = out_row0 + r;
		if (row < a.rows && t < a.M) {
			/* the CPU reference computes dot * post + bias as two roundings; FP4's 2^14 is exact */
			float v = gemv_fmt_traits<F>::FP4 ? mine * 16384.0f : mine;
			v = __fmul_rn(v, a.post);
			if (a.bias)
				v = __fadd_rn(v, a.bias[row]);
			/* accumulate: h + (dot * post + bias), the CPU's matmul then add */
			float *yp = a.y + (size_t)t * a.rows + row;
			if constexpr (RT) { /* (M = 1) the block's rows in order, for the router's share */
				v = a.accumulate ? __fadd_rn(*yp, v) : v;
				*yp = v;
				hrow[row - (int64_t)blockIdx.x * ngrp * R] = v;
			} else {
				*yp = a.accumulate ? __fadd_rn(*yp, v) : v;
			}
		}
	}
}

/* Element (e, i) of a router matrix [E][H] (BF16 / F16 / F32) */
static __device__ __forceinline__ float rt_weight(const gemv_rt &rt, int64_t H, int e, int64_t i)
{
	const size_t at = (size_t)e * (size_t)H + (size_t)i;
	if (rt.fmt == G_F32)
		return __ldg((const float *)rt.w + at);
	const unsigned short u = __ldg((const unsigned short *)rt.w + at);
	return rt.fmt == G_BF16 ? __uint_as_float((uint32_t)u << 16) : __half2float(__ushort_as_half(u));
}

template <int F, int R, int MT, bool NORM, bool RT>
static __device__ __forceinline__ void gemv_fast_body(const gemv_args &a, const gemv_rt *rtp)
{
	/* the weights depend on no earlier kernel: with a.prew the first chunk's loads go out before
	 * the PDL wait, while the previous kernel finishes (x and y are read after it) */
	pdl_trigger();
	TL_SCOPE(TL_SMALL + 4, a.data);
	/* RT: thread e's router weights for the block's rows (at most 4 groups of R), times the norm
	 * weight, loaded before any wait (no kernel of the step writes them) */
	constexpr int RB = RT ? 4 * R : 1;
	float wg[RB];
	int rt_n = 0;
	if constexpr (RT) {
		const int64_t b0 = (int64_t)blockIdx.x * (blockDim.x / (32 * a.ksplit)) * R;
		rt_n = (int)min((int64_t)(blockDim.x / (32 * a.ksplit)) * R, a.rows - b0);
#pragma unroll
		for (int j = 0; j < RB; j++)
			wg[j] = (int)threadIdx.x < rtp->E && j < rt_n
			                ? rt_weight(*rtp, a.rows, (int)threadIdx.x, b0 + j) * (rtp->zc + __ldg(rtp->nw + b0 + j))
			                : 0.0f;
	}
	if (!a.prew)
		pdl_wait();
	constexpr int EPC = gemv_fmt_traits<F>::EPC;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int ksplit = a.ksplit;
	const int grp = warp / ksplit, ks = warp % ksplit;
	const int ngrp = blockDim.x / (32 * ksplit);
	const int64_t row0 = ((int64_t)blockIdx.x * ngrp + grp) * R;
	const int C = a.K / EPC;
	const size_t rb = F == G_F32 ? (size_t)a.K * 4 : gemv_fmt_traits<F>::FP4 ? (size_t)a.K / 2 : (size_t)a.K * 2;
	const size_t sb = F == G_NVFP4 ? (size_t)a.K / 16 : (size_t)a.K / 32;

	/* Rows past the end read the last row (valid memory) and are not stored: the warp stays
	 * converged and every thread reaches the barrier. */
	const uint8_t *wp[R];
	const uint8_t *sp[R];
#pragma unroll
	for (int r = 0; r < R; r++) {
		const int64_t rr = row0 + r < a.rows ? row0 + r : a.rows - 1;
		wp[r] = a.data + (size_t)rr * rb;
		sp[r] = gemv_fmt_traits<F>::FP4 ? a.scales + (size_t)rr * sb : nullptr;
	}
	const float *xt[MT];
#pragma unroll
	for (int t = 0; t < MT; t++)
		xt[t] = a.x + (size_t)(t < a.M ? t : a.M - 1) * a.K;

	float acc[R][MT], ss[NORM ? MT : 1];
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int t = 0; t < MT; t++)
			acc[r][t] = 0.0f;
#pragma unroll
	for (int t = 0; t < (NORM ? MT : 1); t++)
		ss[t] = 0.0f;

	const int step = 32 * ksplit;
	int c = ks * 32 + lane;
	/* ptxas places the register loads of the next chunk after the current chunk's math (seen in
	 * the SASS, whatever the source order), so DRAM latency is hidden by L2 prefetches running
	 * a.pfdist rounds ahead instead; the first rounds are prefetched before anything waits. */
	const int pf = a.pfdist;
	for (int i = 0; i < pf; i++)
		if (c + i * step < C)
			prefetch_chunk<F, R>(wp, sp, c + i * step);
	uint4 cur[R];
	uint32_t cs[R];
	if (c < C)
		load_chunk<F, R>(wp, sp, c, cur, cs);
	if (a.prew)
		pdl_wait();
	while (c < C) {
		const int cn = c + step;
		if (pf > 0 && c + pf * step < C)
			prefetch_chunk<F, R>(wp, sp, c + pf * step);
		uint4 nx[R];
		uint32_t ns[R];
#pragma unroll
		for (int r = 0; r < R; r++) {
			nx[r] = make_uint4(0, 0, 0, 0);
			ns[r] = 0;
		}
		if (cn < C) /* the next chunk's loads are in flight while this one is computed */
			load_chunk<F, R>(wp, sp, cn, nx, ns);

		compute_chunk<F, R, MT, NORM>(cur, cs, xt, c, acc, &a, ss);
#pragma unroll
		for (int r = 0; r < R; r++) {
			cur[r] = nx[r];
			cs[r] = ns[r];
		}
		c = cn;
	}

	if constexpr (!RT) {
		reduce_store<F, R, MT, NORM>(acc, a, row0, ss);
	} else {
		/* the router's share: this block's new h rows, each expert's products summed in row order,
		 * then one fixed-point add (integer sums do not depend on the blocks' order: the logits
		 * are the same bits every run) */
		__shared__ float s_h[RB];
		unsigned long long ep = 0;
		if ((int)threadIdx.x < rtp->E) /* (read after the wait: the MoE launch before wrote it) */
			ep = __ldcg(rtp->epoch);
		reduce_store<F, R, MT, NORM, RT>(acc, a, row0, ss, s_h);
		__syncthreads();
		if ((int)threadIdx.x < rtp->E) {
			float p = 0.0f;
#pragma unroll
			for (int j = 0; j < RB; j++)
				if (j < rt_n)
					p += wg[j] * s_h[j];
			const long long q = __float2ll_rn(p * 4294967296.0f);
			atomicAdd(reinterpret_cast<unsigned long long *>(rtp->acc + (size_t)(ep & 1) * rtp->E + threadIdx.x),
			          (unsigned long long)q);
		}
	}
}

template <int F, int R, int MT, bool NORM = false>
__global__ void __launch_bounds__(256) gemv_fast(gemv_args a)
{
	gemv_fast_body<F, R, MT, NORM, false>(a, nullptr);
}

template <int F, int R, int MT>
__global__ void __launch_bounds__(256) gemv_fast_rt(gemv_args a, const __grid_constant__ gemv_rt rt)
{
	gemv_fast_body<F, R, MT, false, true>(a, &rt);
}

/* The same work split as gemv_fast, but the weight stream goes through a per-warp ring of ST
 * shared-memory stages filled by cp.async (LDGSTS), ST-1 chunk rounds ahead. ncu on gemv_fast
 * (14336x4096 NVFP4, M = 1) showed 5.3 of ~7 cycles between issues stalled on long scoreboard
 * with 23% of warp slots occupied: the register prefetch was placed after the math by ptxas, so
 * each round waited on DRAM. Asynchronous copies hold no registers, cannot be sunk, and let the
 * prefetch depth grow without costing occupancy. Each lane copies and later reads back only its
 * own bytes, so cp.async.wait_group alone orders them (no barrier). Scales are copied as the
 * aligned 4-byte word holding the chunk's byte(s) (cp.async moves 4, 8 or 16 bytes), which needs
 * the scale array's size to be a multiple of 4 (checked by the host). */
static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
static __device__ __forceinline__ void cp_async4(uint32_t dst, const void *src)
{
	asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src));
}
static __device__ __forceinline__ void cp_async_commit()
{
	asm volatile("cp.async.commit_group;");
}
template <int N>
static __device__ __forceinline__ void cp_async_wait()
{
	asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

template <int F, int R, int MT, int ST>
__global__ void __launch_bounds__(256) gemv_async(gemv_args a)
{
	TL_SCOPE(TL_SMALL + 3, __LINE__);
	pdl_enter();
	TL_MARK(1);
	constexpr int EPC = gemv_fmt_traits<F>::EPC;
	constexpr bool FP4 = gemv_fmt_traits<F>::FP4;
	/* per warp and stage: R rows x 32 lanes x 16 code bytes, then R x 32 scale words */
	constexpr int STAGE_BYTES = R * 32 * 16 + (FP4 ? R * 32 * 4 : 0);
	extern __shared__ __align__(16) uint8_t smem[];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int ksplit = a.ksplit;
	const int grp = warp / ksplit, ks = warp % ksplit;
	const int ngrp = blockDim.x / (32 * ksplit);
	const int64_t row0 = ((int64_t)blockIdx.x * ngrp + grp) * R;
	const int C = a.K / EPC;
	const size_t rb = F == G_F32 ? (size_t)a.K * 4 : FP4 ? (size_t)a.K / 2 : (size_t)a.K * 2;
	const size_t sb = F == G_NVFP4 ? (size_t)a.K / 16 : (size_t)a.K / 32;
	const uint8_t *wp[R];
	size_t so[R]; /* byte offset of the row's scales */
#pragma unroll
	for (int r = 0; r < R; r++) {
		const int64_t rr = row0 + r < a.rows ? row0 + r : a.rows - 1;
		wp[r] = a.data + (size_t)rr * rb;
		so[r] = (size_t)rr * sb;
	}
	const float *xt[MT];
#pragma unroll
	for (int t = 0; t < MT; t++)
		xt[t] = a.x + (size_t)(t < a.M ? t : a.M - 1) * a.K;
	uint8_t *wbuf = smem + (size_t)warp * ST * STAGE_BYTES;
	const uint32_t wbase = (uint32_t)__cvta_generic_to_shared(wbuf);

	auto issue = [&](int cc, int stage) {
		if (cc < C) {
			const uint32_t st = wbase + stage * STAGE_BYTES;
#pragma unroll
			for (int r = 0; r < R; r++) {
				cp_async16(st + (r * 32 + lane) * 16, wp[r] + (size_t)cc * 16);
				if (FP4) {
					const size_t o = so[r] + (F == G_NVFP4 ? (size_t)cc * 2 : (size_t)cc);
					cp_async4(st + R * 512 + (r * 32 + lane) * 4, a.scales + (o & ~(size_t)3));
				}
			}
		}
		cp_async_commit(); /* empty groups keep the wait count uniform */
	};

	float acc[R][MT];
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int t = 0; t < MT; t++)
			acc[r][t] = 0.0f;

	const int step = 32 * ksplit;
	const int c0 = ks * 32 + lane;
#pragma unroll
	for (int i = 0; i < ST - 1; i++)
		issue(c0 + i * step, i);
	int stage = 0;
	for (int c = c0; c < C; c += step) {
		issue(c + (ST - 1) * step, (stage + ST - 1) % ST);
		cp_async_wait<ST - 1>();
		const uint8_t *sbuf = wbuf + stage * STAGE_BYTES;
		uint4 cur[R];
		uint32_t cs[R];
#pragma unroll
		for (int r = 0; r < R; r++) {
			cur[r] = *reinterpret_cast<const uint4 *>(sbuf + (r * 32 + lane) * 16);
			if (FP4) {
				const uint32_t wv = *reinterpret_cast<const uint32_t *>(sbuf + R * 512 + (r * 32 + lane) * 4);
				const size_t o = so[r] + (F == G_NVFP4 ? (size_t)c * 2 : (size_t)c);
				cs[r] = wv >> (8 * (o & 3)); /* low bits: the chunk's scale byte(s) */
				if (F == G_MXFP4)
					cs[r] &= 0xFF;
				else
					cs[r] &= 0xFFFF;
			} else {
				cs[r] = 0;
			}
		}
		compute_chunk<F, R, MT>(cur, cs, xt, c, acc);
		stage = stage + 1 == ST ? 0 : stage + 1;
	}
	cp_async_wait<0>();
	reduce_store<F, R, MT>(acc, a, row0);
}

/* Any shape, any alignment: one CTA per (row, token), elements decoded one at a time with the
 * shared numerics helpers. Slow, and the reference the fast path must agree with too. */
__global__ void __launch_bounds__(128) gemv_generic(gemv_args a, int fmt)
{
	TL_SCOPE(TL_SMALL + 3, __LINE__);
	pdl_enter();
	TL_MARK(1);
	const int64_t row = blockIdx.x;
	const int t = blockIdx.y;
	const int K = a.K;
	const float *x = a.x + (size_t)t * K;
	float sum = 0.0f;
	for (int k = threadIdx.x; k < K; k += blockDim.x) {
		float w;
		if (fmt == G_NVFP4 || fmt == G_MXFP4) {
			/* code k of the row: code k % 8 of its (permuted, numerics.h) word; rows are whole
			 * words (K % 8 == 0) */
			const uint32_t wd = reinterpret_cast<const uint32_t *>(a.data)[((size_t)row * K + k) / 8];
			const float e = fp4s_e2m1_to_f32(fp4s_e2m1_perm_code(wd, k & 7));
			const float s = fmt == G_NVFP4 ? fp4s_e4m3_to_f32(a.scales[(size_t)row * (K / 16) + k / 16])
			                               : fp4s_e8m0_to_f32(a.scales[(size_t)row * (K / 32) + k / 32]);
			w = e * s;
		} else if (fmt == G_BF16) {
			w = fp4s_bf16_to_f32(reinterpret_cast<const uint16_t *>(a.data)[(size_t)row * K + k]);
		} else if (fmt == G_F16) {
			w = fp4s_f16_to_f32(reinterpret_cast<const uint16_t *>(a.data)[(size_t)row * K + k]);
		} else {
			w = reinterpret_cast<const float *>(a.data)[(size_t)row * K + k];
		}
		sum = fmaf(x[k], w, sum);
	}
	for (int o = 16; o > 0; o >>= 1)
		sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
	__shared__ float red[4];
	if ((threadIdx.x & 31) == 0)
		red[threadIdx.x >> 5] = sum;
	__syncthreads();
	if (threadIdx.x == 0) {
		float v = 0.0f;
		for (int i = 0; i < (int)(blockDim.x >> 5); i++)
			v += red[i];
		v = __fmul_rn(v, a.post);
		if (a.bias)
			v = __fadd_rn(v, a.bias[row]);
		a.y[(size_t)t * a.rows + row] = v;
	}
}

/* Tokens per pass over the weights by default. Past L1's reach (x is M*K*4 bytes, read from L1
 * R times less often than the weights) more tokens per pass stop paying. */
#ifndef FP4S_GEMV_DEFAULT_PREFETCH
#define FP4S_GEMV_DEFAULT_PREFETCH 0 /* measured: prefetching lost 5-15% (2026-11-21) */
#endif
#ifndef FP4S_GEMV_DEFAULT_STAGES
#define FP4S_GEMV_DEFAULT_STAGES 0
#endif
#ifndef FP4S_GEMV_DEFAULT_ROWS
#define FP4S_GEMV_DEFAULT_ROWS 4
#endif
#ifndef FP4S_GEMV_DEFAULT_TILE_FP4
#define FP4S_GEMV_DEFAULT_TILE_FP4 4
#endif

/* Rows per group: more rows share each x load and each lane's loop overhead; fewer leave more
 * registers free, so more warps fit on an SM to hide latency. acc + psum are 2*R*MT registers. */
template <int MT>
struct gemv_rows {
	static constexpr int R = MT <= 4 ? 4 : 2;
};

template <int F, int R, int MT, int ST>
static cudaError_t launch_async(gemv_args a, int64_t grid, dim3 block, size_t smem, cudaStream_t s)
{
	/* above 48 KB of shared memory per block (the dynamic ring plus the 1 KB static reduction
	 * buffer) the kernel must opt in; the first GPU run failed two BF16 cases at exactly 48 KB */
	if (smem + sizeof(float) * 8 * 32 > 48 * 1024) {
		cudaError_t e = cudaFuncSetAttribute(gemv_async<F, R, MT, ST>,
		                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
		if (e != cudaSuccess)
			return e;
	}
	pdl_launch(gemv_async<F, R, MT, ST>, dim3((unsigned)grid), block, smem, s, a);
	return cudaGetLastError();
}

template <int F, int MT, int R>
static cudaError_t launch_fast_r(gemv_args a, cudaStream_t s, int ksplit_req, int stages, const gemv_rt *rt)
{
	const int C = a.K / gemv_fmt_traits<F>::EPC;
	const int64_t nrg = (a.rows + R - 1) / R;
	int S = ksplit_req;
	if (S <= 0) {
		/* Split K when rows are few (aim for >= 1024 warps: 8 per SM) or rows are long (a lane
		 * should not walk more than 8 chunks alone); measured on the H100 2026-11-21 (sweep in
		 * dev/gemv_bench: more splitting than this lost 5-25% to the cross-warp reduction). */
		const int by_rows = (int)((1024 + nrg - 1) / nrg);
		const int by_len = (C + 255) / 256;
		S = by_rows > by_len ? by_rows : by_len;
		const int cap = (C + 31) / 32;
		S = S > cap ? cap : S;
	}
	S = S < 1 ? 1 : S > 8 ? 8 : S;
	if (rt && S == 3)
		S = 4; /* gemv_fast_rt: blocks of at least 128 threads, a thread an expert */
	const int ngrp = S >= 4 ? 1 : 4 / S;
	a.ksplit = S;
	const dim3 block(32 * S * ngrp);
	const int64_t grid = (nrg + ngrp - 1) / ngrp;
	if (grid > 0x7FFFFFFF)
		return cudaErrorInvalidConfiguration;
	if (stages >= 2) {
		/* cp.async ring: bytes per warp as in gemv_async */
		const int stage_bytes = R * 32 * 16 + (gemv_fmt_traits<F>::FP4 ? R * 32 * 4 : 0);
		const size_t smem = (size_t)(block.x / 32) * (size_t)stages * stage_bytes;
		cudaError_t e;
		switch (stages) {
		case 2:
			e = launch_async<F, R, MT, 2>(a, grid, block, smem, s);
			break;
		case 3:
			e = launch_async<F, R, MT, 3>(a, grid, block, smem, s);
			break;
		default:
			e = launch_async<F, R, MT, 4>(a, grid, block, smem, s);
			break;
		}
		return e;
	}
	if constexpr (!gemv_fmt_traits<F>::FP4) {
		if (a.norm_w) {
			pdl_launch(gemv_fast<F, R, MT, true>, dim3((unsigned)grid), block, 0, s, a);
			return cudaGetLastError();
		}
	}
	if constexpr (MT == 1 && !gemv_fmt_traits<F>::FP4) {
		if (rt) {
			if ((int)block.x < rt->E)
				return cudaErrorInvalidConfiguration; /* (fp4s_cuda_matmul_add_route bounds E) */
			pdl_launch(gemv_fast_rt<F, R, MT>, dim3((unsigned)grid), block, 0, s, a, *rt);
			return cudaGetLastError();
		}
	}
	pdl_launch(gemv_fast<F, R, MT>, dim3((unsigned)grid), block, 0, s, a);
	return cudaGetLastError();
}

template <int F, int MT>
static cudaError_t launch_fast_mt(gemv_args a, cudaStream_t s, int ksplit, int rows, int stages,
                                  const gemv_rt *rt = nullptr)
{
	if constexpr (MT <= 4) {
		if (rows == 2)
			return launch_fast_r<F, MT, 2>(a, s, ksplit, stages, rt);
	}
	if constexpr (MT == 1) {
		if (rows == 8)
			return launch_fast_r<F, MT, 8>(a, s, ksplit, stages, rt);
	}
	return launch_fast_r<F, MT, gemv_rows<MT>::R>(a, s, ksplit, stages, rt);
}

template <int F>
static cudaError_t launch_fast(gemv_args a, cudaStream_t s, int ksplit, int rows, int stages,
                               const gemv_rt *rt = nullptr)
{
	if (a.M <= 1)
		return launch_fast_mt<F, 1>(a, s, ksplit, rows, stages, rt);
	if (a.M <= 2)
		return launch_fast_mt<F, 2>(a, s, ksplit, rows, stages);
	if (a.M <= 4)
		return launch_fast_mt<F, 4>(a, s, ksplit, rows, stages);
	if (a.M <= 8)
		return launch_fast_mt<F, 8>(a, s, ksplit, rows, stages);
	return launch_fast_mt<F, 16>(a, s, ksplit, rows, stages);
}

/* model.h has no extern "C" block, so its fp4s_wformat_name cannot be called from C++ here. */
static const char *fmt_name(enum fp4s_wformat f)
{
	return f == FP4S_WF_NVFP4 ? "nvfp4" : f == FP4S_WF_MXFP4 ? "mxfp4" : f == FP4S_WF_BF16 ? "bf16"
	     : f == FP4S_WF_F16 ? "f16" : f == FP4S_WF_F32 ? "f32" : "?";
}

static int is_aligned(const void *p, size_t n)
{
	return ((uintptr_t)p % n) == 0;
}

static int matmul_impl(const struct fp4s_mat *w, const float *x, int32_t M, float *y, int accumulate,
                       const float *norm_w, float eps, int zc, const struct fp4s_gemv_tune *tune,
                       const struct fp4s_gemv_route *rt, cudaStream_t s, struct fp4s_error *err);

extern "C" int fp4s_cuda_matmul_ex(const struct fp4s_mat *w, const float *x, int32_t M, float *y,
                                   const struct fp4s_gemv_tune *tune, cudaStream_t s,
                                   struct fp4s_error *err)
{
	return matmul_impl(w, x, M, y, 0, NULL, 0.0f, 0, tune, NULL, s, err);
}

static int dense_fast_ok(const struct fp4s_mat *w, const float *x, int32_t M, float *y)
{
	return w && x && y && w->data && M >= 1 && M <= 16 && w->rows > 0 && w->cols > 0 && w->cols <= (1 << 30) &&
	       (w->fmt == FP4S_WF_BF16 || w->fmt == FP4S_WF_F16 || w->fmt == FP4S_WF_F32) &&
	       w->cols % (w->fmt == FP4S_WF_F32 ? 4 : 8) == 0 && is_aligned(w->data, 16) && is_aligned(x, 16);
}

/* y[M][rows] += W x for BF16 / F16 / F32 weights on gemv_fast (the residual add of a projection
 * without a kernel of its own); FP4S_EUNSUPPORTED, with nothing enqueued, for anything else. */
extern "C" int fp4s_cuda_matmul_add(const struct fp4s_mat *w, const float *x, int32_t M, float *y, cudaStream_t s,
                                    struct fp4s_error *err)
{
	if (!dense_fast_ok(w, x, M, y))
		return FP4S_EUNSUPPORTED;
	return matmul_impl(w, x, M, y, 1, NULL, 0.0f, 0, NULL, NULL, s, err);
}


/* fp4s_cuda_matmul_add for one token, plus the next MoE router's share (gemv_cuda.h) */
extern "C" int fp4s_cuda_matmul_add_route(const struct fp4s_mat *w, const float *x, float *y,
                                          const struct fp4s_gemv_route *rt, cudaStream_t s, struct fp4s_error *err)
{
	if (!dense_fast_ok(w, x, 1, y) || !rt || !rt->w || !rt->nw || !rt->acc || !rt->epoch || rt->E < 1 ||
	    rt->E > FP4S_GEMV_ROUTE_EMAX || (rt->fmt != FP4S_WF_BF16 && rt->fmt != FP4S_WF_F16 && rt->fmt != FP4S_WF_F32))
		return FP4S_EUNSUPPORTED;
	return matmul_impl(w, x, 1, y, 1, NULL, 0.0f, 0, NULL, rt, s, err);
}

/* y[M][rows] = W RMSNorm(x; norm_w) for dense weights on gemv_fast, the norm's sums of squares
 * taken in the same pass over x (gpt-oss's BF16 qkv without an rmsnorm kernel);
 * FP4S_EUNSUPPORTED, with nothing enqueued, for anything else. */
extern "C" int fp4s_cuda_norm_matmul(const struct fp4s_mat *w, const float *x, int32_t M, float *y,
                                     const float *norm_w, float eps, int zero_centred, cudaStream_t s,
                                     struct fp4s_error *err)
{
	if (!dense_fast_ok(w, x, M, y) || !norm_w || !is_aligned(norm_w, 16))
		return FP4S_EUNSUPPORTED;
	return matmul_impl(w, x, M, y, 0, norm_w, eps, zero_centred, NULL, NULL, s, err);
}

static int matmul_impl(const struct fp4s_mat *w, const float *x, int32_t M, float *y, int accumulate,
                       const float *norm_w, float eps, int zc, const struct fp4s_gemv_tune *tune,
                       const struct fp4s_gemv_route *rt, cudaStream_t s, struct fp4s_error *err)
{
	const int ksplit = tune ? tune->ksplit : 0, generic = tune ? tune->generic : 0;
	const int fp4fmt = w->fmt == FP4S_WF_NVFP4 || w->fmt == FP4S_WF_MXFP4;
	/* FP4 at M = 1: 8 rows per group (each x load and each lane's loop step serve 8 rows; 0-25%
	 * faster than 4 on every bench shape, H100 2026-11-21); 4 otherwise (M > 1 has no R = 8) */
	const int rows = tune && tune->rows ? tune->rows : fp4fmt && M == 1 ? 8 : FP4S_GEMV_DEFAULT_ROWS;
	int stages = tune && tune->stages ? tune->stages : FP4S_GEMV_DEFAULT_STAGES;
	const int pfdist = tune && tune->prefetch ? (tune->prefetch < 0 ? 0 : tune->prefetch)
	                                          : FP4S_GEMV_DEFAULT_PREFETCH;
	/* FP4 passes of 4 tokens: at M = 16 four M = 4 passes beat one 16-token pass 1.6x (x no longer
	 * fits L1); dense BF16 is the other way round (lm_head 1.31 ms vs 1.52 ms), 2026-11-21. */
	int tile = tune && tune->max_tile ? tune->max_tile
	         : (w->fmt == FP4S_WF_NVFP4 || w->fmt == FP4S_WF_MXFP4) ? FP4S_GEMV_DEFAULT_TILE_FP4 : 16;
	if (!w || !x || !y || !w->data)
		return fp4s_error_set(err, FP4S_EINVAL, "cuda matmul: null pointer");
	if (M < 0 || w->rows <= 0 || w->cols <= 0 || w->cols > (1 << 30))
		return fp4s_error_set(err, FP4S_EINVAL, "cuda matmul: bad shape [%lld, %lld] x %d tokens",
		                      (long long)w->rows, (long long)w->cols, (int)M);
	if (ksplit < 0 || ksplit > 8)
		return fp4s_error_set(err, FP4S_EINVAL, "cuda matmul: ksplit %d not in 0..8", ksplit);
	if (rows != 2 && rows != 4 && rows != 8)
		return fp4s_error_set(err, FP4S_EINVAL, "cuda matmul: rows per group %d is not 2, 4 or 8", rows);
	if (stages < 0 || stages > 4)
		return fp4s_error_set(err, FP4S_EINVAL, "cuda matmul: %d stages not in 0..4", stages);
	if (tile < 1 || tile > 16)
		return fp4s_error_set(err, FP4S_EINVAL, "cuda matmul: token tile %d not in 1..16", tile);
	int fmt;
	switch (w->fmt) {
	case FP4S_WF_NVFP4: fmt = G_NVFP4; break;
	case FP4S_WF_MXFP4: fmt = G_MXFP4; break;
	case FP4S_WF_BF16: fmt = G_BF16; break;
	case FP4S_WF_F16: fmt = G_F16; break;
	case FP4S_WF_F32: fmt = G_F32; break;
	default:
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "cuda matmul: weight format %d", (int)w->fmt);
	}
	const int64_t K = w->cols;
	if ((fmt == G_NVFP4 && K % FP4S_NVFP4_BLOCK) || (fmt == G_MXFP4 && K % FP4S_MXFP4_BLOCK))
		return fp4s_error_set(err, FP4S_EINVAL, "cuda matmul: K = %lld is not a multiple of the %s block",
		                      (long long)K, fmt_name(w->fmt));
	if ((fmt == G_NVFP4 || fmt == G_MXFP4) && !w->scales)
		return fp4s_error_set(err, FP4S_EINVAL, "cuda matmul: %s weight without scales",
		                      fmt_name(w->fmt));
	if (M == 0)
		return FP4S_OK;
	/* FP4: the tensor-core kernel (gemv_mma.cu) unless told otherwise or it declines the shape */
	const int mma = tune && tune->mma ? tune->mma : fp4s_gemv_mma_allowed() ? 0 : -1;
	if ((fmt == G_NVFP4 || fmt == G_MXFP4) && mma >= 0 && !generic) {
		const int l2pf = !tune || !tune->l2pf ? -1 : tune->l2pf < 0 ? 0 : tune->l2pf;
		int rc = fp4s_gemv_mma_ex(w, x, M, y, 0, tune ? tune->kblocks : 0, tune ? tune->variant : 0,
		                          tune ? tune->probe : 0, l2pf, s, err);
		if (rc != FP4S_EUNSUPPORTED)
			return rc;
		if (mma > 0)
			return fp4s_error_set(err, FP4S_EUNSUPPORTED, "cuda matmul: the tensor-core kernel "
			                      "declines %s [%lld, %lld]", fmt_name(w->fmt), (long long)w->rows,
			                      (long long)K);
	}
	const int epc = fmt <= G_MXFP4 ? 32 : fmt == G_F32 ? 4 : 8;
	const int fp4 = fmt == G_NVFP4 || fmt == G_MXFP4;
	/* the cp.async path copies scale words: the scale array must be whole 4-byte words */
	if (stages >= 2 && fp4 &&
	    (!is_aligned(w->scales, 4) || (w->rows * (K / (fmt == G_NVFP4 ? 16 : 32))) % 4))
		stages = 1;
	const int fast = !generic && K % epc == 0 && is_aligned(w->data, 16) && is_aligned(x, 16) &&
	                 (fmt != G_NVFP4 || is_aligned(w->scales, 2));
	if ((accumulate || norm_w) && (!fast || stages >= 2))
		return FP4S_EUNSUPPORTED; /* gemv_fast only; nothing enqueued */
	gemv_args a;
	a.data = (const uint8_t *)w->data;
	a.scales = w->scales;
	a.bias = w->bias;
	a.rows = w->rows;
	a.K = (int)K;
	a.ksplit = 1;
	a.post = fmt == G_NVFP4 ? w->ws2 : 1.0f;
	a.pfdist = pfdist;
	a.accumulate = accumulate;
	a.norm_w = norm_w;
	a.eps = eps;
	a.zc = zc ? 1.0f : 0.0f;
	static int prew_off = -1; /* FP4S_GEMV_FAST_PREW=0: gemv_fast waits before its first weight loads */
	a.prew = !fp4s_env_off("FP4S_GEMV_FAST_PREW", &prew_off);
	gemv_rt grt = {};
	if (rt) {
		if (M != 1 || fmt == G_NVFP4 || fmt == G_MXFP4)
			return FP4S_EUNSUPPORTED; /* one token, dense weights (nothing enqueued) */
		grt.w = rt->w, grt.nw = rt->nw, grt.acc = rt->acc, grt.epoch = rt->epoch;
		grt.fmt = rt->fmt == FP4S_WF_BF16 ? G_BF16 : rt->fmt == FP4S_WF_F16 ? G_F16 : G_F32;
		grt.E = rt->E, grt.zc = rt->zc ? 1.0f : 0.0f;
	}
	for (int32_t t0 = 0; t0 < M; t0 += tile) {
		a.M = M - t0 < tile ? M - t0 : tile;
		a.x = x + (size_t)t0 * K;
		a.y = y + (size_t)t0 * w->rows;
		cudaError_t e;
		if (!fast) {
			if (w->rows > 0x7FFFFFFF)
				return fp4s_error_set(err, FP4S_EINVAL, "cuda matmul: %lld rows", (long long)w->rows);
			pdl_launch(gemv_generic, dim3((unsigned)w->rows, (unsigned)a.M), 128, 0, s, a, fmt);
			e = cudaGetLastError();
		} else {
			switch (fmt) {
			case G_NVFP4: e = launch_fast<G_NVFP4>(a, s, ksplit, rows, stages); break;
			case G_MXFP4: e = launch_fast<G_MXFP4>(a, s, ksplit, rows, stages); break;
			case G_BF16: e = launch_fast<G_BF16>(a, s, ksplit, rows, stages, rt ? &grt : nullptr); break;
			case G_F16: e = launch_fast<G_F16>(a, s, ksplit, rows, stages, rt ? &grt : nullptr); break;
			default: e = launch_fast<G_F32>(a, s, ksplit, rows, stages, rt ? &grt : nullptr); break;
			}
		}
		FP4S_CUDA_TRY(err, e);
	}
	return FP4S_OK;
}

extern "C" int fp4s_cuda_matmul(const struct fp4s_mat *w, const float *x, int32_t M, float *y,
                                cudaStream_t s, struct fp4s_error *err)
{
	return fp4s_cuda_matmul_ex(w, x, M, y, NULL, s, err);
}
