/* gemm_wgmma.cu: the Hopper (sm_90a) path of the W4A16 prefill GEMM, y[M, N] = x[M, K] . W[N, K]^T
 * * ws2 + bias, on warpgroup MMAs (wgmma). gemm_fp4.cu owns the API, the argument checks, the
 * scratch, the split-K reduction and the choice of kernel; this file holds the kernel, the
 * activation conversion it needs and their launches.
 *
 * Layout: the weights go on wgmma's M and the tokens on its N (y^T = W . x^T), so that
 *  - A (weights) comes from registers: each thread decodes its own FP4 codes straight into the A
 *    fragment (byte permutes, exact: formats.md §3.4) and the decoded weights never touch shared
 *    memory: no BF16 weight tile written, read back, fenced or bank-conflicted, and every code is
 *    decoded by exactly one thread of the block;
 *  - B (activations, BF16) is a [tokens][64] tile in shared memory, 128-byte rows with the 16-byte
 *    chunk index XORed by (row & 7): wgmma's K-major 128-byte swizzle, filled by cp.async;
 *  - wgmma's N (the token tile BT = 64, 128 or 256) can be small, so few tokens waste little.
 * A thread's A fragment holds, per k16 step, rows g and g+8 at k = 2c, 2c+1, 2c+8, 2c+9
 * (c = lane % 4): four scattered pairs. Since a dot product does not care about the order of its
 * terms, K is permuted inside every 64-wide step, identically for both operands: hardware position
 * p = 8q + 2c + e (q = 0..7, e = 0..1) holds logical k = 16c + 2q + e. Then thread c's 16 logical
 * k per row and step are 16c..16c+15: 8 consecutive bytes of codes (one 8-byte load) under one
 * NVFP4 scale (one E4M3 block of 16) or half an MXFP4 block. The permutation is applied to x when
 * it is converted FP32 -> BF16 (a launch that exists anyway), so the activation tiles stay plain
 * 16-byte copies.
 *
 * Block: WGS = 2 or 4 warpgroups, 64 weight rows each, x BT tokens (the activation tile is shared
 * by all of them: 4 halve its traffic per flop, but 2 x 256 tokens measured faster, so 4 is a tune
 * option only); K in steps of 64 through a
 * STAGES-deep cp.async ring (activations, raw codes, scale words), copies issued
 * STAGES-2 steps ahead by all threads, one barrier per step. Per half step (k32) a thread decodes
 * 8 A registers, and the warpgroup issues two wgmma m64nBTk16 on them; A is double-buffered so the
 * decode of the next half overlaps the MMAs of this one (wgmma.wait_group 1). FP32 accumulators in
 * registers; ws2 and bias in the epilogue, or raw sums to the split-K scratch.
 * Needs K % 64 == 0; built only for sm_90a (elsewhere the kernel is a stub that is never launched:
 * fp4s_gemm_wgmma_supported says so at run time).
 * Measured: bench/results/2026-11-22-h100-gemm-wgmma.md. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <string.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/e2m1_bf16.cuh"
#include "backend/cuda/gemm_cuda.h"
#include "backend/cuda/moe_cuda.h"
#include "backend/cuda/wgmma_act.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FP4S_WGMMA_DEVICE 1
#else
#define FP4S_WGMMA_DEVICE 0
#endif

namespace {

constexpr int WG_BK = 64; /* K per step: one 128-byte BF16 row of the activation tile */
constexpr int WG_NV = 0, WG_MX = 1;

/* BT tokens x ROWS = 64 WGS weight rows per block, WGS warpgroups, STAGES ring slots */
template <int BT, int WGS, int STAGES>
struct wg_cfg {
	static constexpr int THREADS = 128 * WGS;
	static constexpr int ROWS = 64 * WGS;
	static constexpr int ACT = BT * WG_BK * 2;       /* [BT][64] BF16, swizzled, 1024-aligned */
	static constexpr int CODES = ROWS * WG_BK / 2;   /* [ROWS][32 B] packed codes */
	static constexpr int SCALES = ROWS * 4;          /* one 4-byte scale word per row */
	static constexpr int CODES_OFF = STAGES * ACT;
	static constexpr int SCALES_OFF = CODES_OFF + STAGES * CODES;
	static constexpr int SMEM = SCALES_OFF + STAGES * SCALES + 1024; /* + slack to align to 1024 */
	/* blocks per SM the 64K registers allow at <= 128 per thread (BT / 2 accumulators each) */
	static constexpr int MINB = WGS == 2 && BT <= 128 ? 2 : 1;
	static_assert(ACT % 1024 == 0, "swizzle atoms are 8 rows x 128 bytes");
	static_assert((BT * 8) % THREADS == 0, "whole activation chunks per thread");
	static_assert(WGS * BT <= 512, "accumulators beyond 128 registers per thread at 512 threads");
};

/* The grouped form (MoE): group z holds m[z] <= BT tokens (0: unused) of expert exp[z], rows
 * off[z].. of the activations and the output; expert e's codes, scales and bias start
 * e * wstride, e * sstride bytes and e * N floats on, its NVFP4 scale is ws2e[e] (NULL: ws2).
 * m == NULL: the plain GEMM. */
struct wg_groups {
	const int32_t *exp, *off, *m;
	long long wstride, sstride;
	const float *ws2e;
};

/* Device helpers exist only where the kernel is real (unused functions are errors elsewhere). */
#if FP4S_WGMMA_DEVICE
__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp16(uint32_t dst, const void *src, int src_bytes)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp4(uint32_t dst, const void *src)
{
	asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b)
{
	__nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162 *>(&a), *reinterpret_cast<__nv_bfloat162 *>(&b));
	return *reinterpret_cast<uint32_t *>(&r);
}

/* Shared-memory matrix descriptor (PTX ISA, "matrix descriptor format"): start address >> 4,
 * leading byte offset 16 (unused by K-major swizzled layouts), stride byte offset 1024 (between
 * 8-row groups), 128-byte swizzle. */
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr)
{
	return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
	       ((uint64_t)1 << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

/* wgmma operand lists: accumulator registers %0.. in groups of 16 */
#define WG_S0 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
#define WG_S1 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define WG_S2 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47"
#define WG_S3 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define WG_S4 "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79"
#define WG_S5 "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95"
#define WG_S6 "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111"
#define WG_S7 "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
#define WG_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define WG_F16(i) WG_F4(i), WG_F4(i + 4), WG_F4(i + 8), WG_F4(i + 12)
#define WG_IN "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
/* "{...}, {A}, descB, p, 1, 1, 0": A from registers, B K-major; p = 1 adds to the accumulators */
#define WG_TAIL(a0, a1, a2, a3, dsc) \
	"}, {%" #a0 ",%" #a1 ",%" #a2 ",%" #a3 "}, %" #dsc ", p, 1, 1, 0;\n}\n"
#define WG_HEAD(n, one) "{\n.reg .pred p;\nsetp.ne.b32 p, %" #one ", 0;\nwgmma.mma_async.sync.aligned.m64n" #n "k16.f32.bf16.bf16 {"

/* D[64 x NT] += A[64 x 16] (registers) . B[16 x NT] (shared memory, descriptor) */
template <int NT>
__device__ __forceinline__ void wg_mma(float (&d)[NT / 2], const uint32_t (&a)[4], uint64_t desc);

template <>
__device__ __forceinline__ void wg_mma<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc)
{
	asm volatile(WG_HEAD(64, 37) WG_S0 "," WG_S1 WG_TAIL(32, 33, 34, 35, 36)
	             : WG_F16(0), WG_F16(16)
	             : WG_IN);
}
template <>
__device__ __forceinline__ void wg_mma<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc)
{
	asm volatile(WG_HEAD(128, 69) WG_S0 "," WG_S1 "," WG_S2 "," WG_S3 WG_TAIL(64, 65, 66, 67, 68)
	             : WG_F16(0), WG_F16(16), WG_F16(32), WG_F16(48)
	             : WG_IN);
}
template <>
__device__ __forceinline__ void wg_mma<256>(float (&d)[128], const uint32_t (&a)[4], uint64_t desc)
{
	asm volatile(WG_HEAD(256, 133) WG_S0 "," WG_S1 "," WG_S2 "," WG_S3 "," WG_S4 "," WG_S5 "," WG_S6
	             "," WG_S7 WG_TAIL(128, 129, 130, 131, 132)
	             : WG_F16(0), WG_F16(16), WG_F16(32), WG_F16(48), WG_F16(64), WG_F16(80), WG_F16(96),
	               WG_F16(112)
	             : WG_IN);
}
#endif

/* Keeps the compiler from moving reads or writes of accumulators across wgmma waits: the
 * registers are "modified" here as far as it knows. */
template <int N>
__device__ __forceinline__ void wg_touch(float (&d)[N])
{
#pragma unroll
	for (int i = 0; i < N; i++)
		asm volatile("" : "+f"(d[i])::"memory");
}

template <int BT, int WGS, int STAGES, int FMT>
__global__ void __launch_bounds__((wg_cfg<BT, WGS, STAGES>::THREADS), (wg_cfg<BT, WGS, STAGES>::MINB))
gemm_wgmma_kernel(const __nv_bfloat16 *__restrict__ xp, const uint8_t *__restrict__ wq,
                  const uint8_t *__restrict__ wsc, float ws2, const float *__restrict__ bias,
                  float *__restrict__ y, float *__restrict__ part, int M, int N, int K, int steps_per_split,
                  wg_groups grp)
{
#if FP4S_WGMMA_DEVICE
	using C = wg_cfg<BT, WGS, STAGES>;
	extern __shared__ uint8_t smem_raw[];
	/* the swizzle is a function of address bits 4-9: tiles start on 1024-byte boundaries */
	uint8_t *smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
	const int tid = threadIdx.x, lane = tid & 31;
	const int wg = tid >> 7, g = ((tid >> 5) & 3) * 16 + (lane >> 2), c = lane & 3;
	const int n0 = blockIdx.x * C::ROWS;
	int m0 = blockIdx.y * BT;
	if (grp.m) {
		/* grouped experts: blockIdx.y is group z, its M tokens are rows off.. of xp and y, and
		 * its weights expert e's slice of the stacked projection. Unused groups (m = 0) leave
		 * before any barrier, as a whole block. */
		const int z = blockIdx.y, e = grp.exp[z];
		M = grp.m[z];
		if (M <= 0)
			return;
		xp += (size_t)grp.off[z] * K;
		y += (size_t)grp.off[z] * N;
		wq += (size_t)e * grp.wstride;
		wsc += (size_t)e * grp.sstride;
		if (bias)
			bias += (size_t)e * N;
		if (grp.ws2e)
			ws2 = grp.ws2e[e];
		m0 = 0;
	}
	const int kt0 = blockIdx.z * steps_per_split;
	const int nk = min(steps_per_split, K / WG_BK - kt0);

	/* copy roles, with every address that does not change from step to step computed here (the
	 * per-step address arithmetic was most of the loop's instructions). Activations: a thread's
	 * chunks share one 16-byte column (tid & 7) of rows tid/8 + i RSTEP; rows past M are zero-filled
	 * (src-size 0 reads nothing). Codes: row tid/2, 16-byte half tid&1; rows past N copy row N-1
	 * (finite, never stored). Scales (tid < ROWS): one row's 4-byte word: NVFP4's 4 scales of the
	 * step, or for MXFP4 the aligned word holding the step's pair (wsc is 2-aligned and K/32 even:
	 * no straddle). */
	constexpr int ACH = BT * 8 / C::THREADS, RSTEP = C::THREADS / 8;
	const int ar = tid >> 3, ac = tid & 7;
	const char *a_src = reinterpret_cast<const char *>(xp + (size_t)(m0 + ar) * K + ac * 8);
	const size_t a_stride = (size_t)RSTEP * K * 2;
	const uint32_t sbase = smem_addr(smem);
	const uint32_t a_dst = sbase + ar * 128 + ((ac ^ (ar & 7)) << 4);
	uint32_t a_ok = 0;
#pragma unroll
	for (int i = 0; i < ACH; i++)
		a_ok |= (uint32_t)(m0 + ar + i * RSTEP < M) << i;
	const uint8_t *q_src = wq + (size_t)min(n0 + (tid >> 1), N - 1) * (size_t)(K / 2) + (tid & 1) * 16;
	const uint32_t q_dst = sbase + C::CODES_OFF + tid * 16;
	const uint8_t *s_src = wsc + (size_t)min(n0 + (tid % C::ROWS), N - 1) * (size_t)(FMT == WG_NV ? K / 16 : K / 32);
	const uint32_t s_dst = sbase + C::SCALES_OFF + tid * 4;

	auto issue = [&](int slot, int kt) { /* step kt into ring slot `slot` */
		const char *src = a_src + (size_t)kt * 128;
		const uint32_t dst = a_dst + slot * C::ACT;
#pragma unroll
		for (int i = 0; i < ACH; i++)
			cp16(dst + i * RSTEP * 128, src + i * a_stride, (a_ok >> i) & 1 ? 16 : 0);
		cp16(q_dst + slot * C::CODES, q_src + (size_t)kt * 32, 16);
		if (tid < C::ROWS) {
			const uint8_t *sp = FMT == WG_NV ? s_src + (size_t)kt * 4
			                                 : (const uint8_t *)((uintptr_t)(s_src + (size_t)kt * 2) & ~(uintptr_t)3);
			cp4(s_dst + slot * C::SCALES, sp);
		}
	};

	/* this thread's two weight rows (g, g + 8 of its warpgroup's 64) and, for MXFP4, where their
	 * scale pairs sit in the copied words: byte (row address + 2 kt) & 3, alternating 0 / 2 */
	const int ra = wg * 64 + g, rb = ra + 8;
	const int mxa = (int)((uintptr_t)(wsc + (size_t)min(n0 + ra, N - 1) * (size_t)(K / 32)) & 3);
	const int mxb = (int)((uintptr_t)(wsc + (size_t)min(n0 + rb, N - 1) * (size_t)(K / 32)) & 3);
	const uint8_t *q_rd = smem + C::CODES_OFF + ra * 32 + c * 8; /* row rb is 256 bytes on */
	const uint8_t *s_rd = smem + C::SCALES_OFF + ra * 4;         /* row rb is 32 bytes on */

	float acc[BT / 2];
#pragma unroll
	for (int i = 0; i < BT / 2; i++)
		acc[i] = 0.0f;

#pragma unroll
	for (int j = 0; j < STAGES - 2; j++) {
		if (j < nk)
			issue(j, kt0 + j);
		cp_commit(); /* empty groups keep the count */
	}

	int rslot = 0, wslot = STAGES - 2; /* ring slots of step j and of step j + STAGES - 2 */
	for (int j = 0; j < nk; j++) {
		/* groups committed: STAGES-2+j; group i = step i; step j must have landed */
		cp_wait<STAGES - 3>();
		/* cp.async wrote through the generic proxy; wgmma reads through the async proxy */
		asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
		__syncthreads();
		/* slot (j-2) % STAGES: step j-2's MMAs finished (wait_group 1 at the end of j-1 leaves
		 * only j-1's last group pending) before anyone passed the barrier above */
		if (j + STAGES - 2 < nk)
			issue(wslot, kt0 + j + STAGES - 2);
		cp_commit();
		wslot = wslot + 1 == STAGES ? 0 : wslot + 1;

		const int kt = kt0 + j;
		const uint8_t *qs = q_rd + rslot * C::CODES;
		const uint2 qa = *reinterpret_cast<const uint2 *>(qs);
		const uint2 qb = *reinterpret_cast<const uint2 *>(qs + 8 * 32);
		const uint8_t *ss = s_rd + rslot * C::SCALES;
		uint32_t sa, sb;
		if (FMT == WG_NV) {
			sa = scale_bf16x2<FMT>(ss[c]); /* logical k 16c..16c+15: NVFP4 block c */
			sb = scale_bf16x2<FMT>(ss[8 * 4 + c]);
		} else {
			sa = scale_bf16x2<FMT>(ss[((mxa + 2 * kt) & 3) + (c >> 1)]); /* MXFP4 block c/2 */
			sb = scale_bf16x2<FMT>(ss[8 * 4 + ((mxb + 2 * kt) & 3) + (c >> 1)]);
		}
		const uint64_t desc = wg_desc(sbase + rslot * C::ACT);
		rslot = rslot + 1 == STAGES ? 0 : rslot + 1;
#pragma unroll
		for (int h = 0; h < 2; h++) {
			/* half step h: k16 steps 2h, 2h+1 = bytes 4h..4h+3 of each row's 8 */
			uint32_t oa[4], ob[4];
			e2m1x8_to_bf16(h ? qa.y : qa.x, oa);
			e2m1x8_to_bf16(h ? qb.y : qb.x, ob);
#pragma unroll
			for (int i = 0; i < 4; i++) {
				oa[i] = bf16x2_mul(oa[i], sa);
				ob[i] = bf16x2_mul(ob[i], sb);
			}
			/* fragment: {row g, k 2c..}, {row g+8, k 2c..}, {row g, k 2c+8..}, {row g+8, k 2c+8..} */
			const uint32_t a0[4] = {oa[0], ob[0], oa[1], ob[1]};
			const uint32_t a1[4] = {oa[2], ob[2], oa[3], ob[3]};
			wg_fence();
			/* k16 step kk starts 32 bytes into the 128-byte row: +2 in the descriptor's address */
			wg_mma<BT>(acc, a0, desc + (uint64_t)(4 * h));
			wg_mma<BT>(acc, a1, desc + (uint64_t)(4 * h + 2));
			wg_commit();
			wg_wait<1>();
		}
	}
	wg_wait<0>();
	wg_touch(acc);
	cp_wait<0>();

	/* epilogue: acc[4i + e] = (weight row g + 8 (e >> 1), token 8i + 2c + (e & 1)) */
	float *dst = part ? part + (size_t)blockIdx.z * (size_t)M * (size_t)N : y;
	const float scale = part ? 1.0f : ws2;
	const int na = n0 + ra, nb = n0 + rb;
	const float ba = !part && bias && na < N ? bias[na] : 0.0f;
	const float bb = !part && bias && nb < N ? bias[nb] : 0.0f;
#pragma unroll
	for (int i = 0; i < BT / 8; i++)
#pragma unroll
		for (int e = 0; e < 4; e++) {
			const int t = m0 + 8 * i + 2 * c + (e & 1), n = e >> 1 ? nb : na;
			if (t < M && n < N)
				dst[(size_t)t * N + n] = acc[4 * i + e] * scale + (e >> 1 ? bb : ba);
		}
#else
	__trap(); /* never launched: fp4s_gemm_wgmma_supported() is 0 without an sm_90a image */
#endif
}

/* x FP32 -> BF16 (RNE) with K permuted inside each 64-block: output chunk q (8 values) of a block
 * holds logical k 16c + 2q + e at position 8q + 2c + e. A thread writes one 16-byte chunk from four
 * float pairs; neighbouring threads read neighbouring pairs. Needs K % 64 == 0. */
__global__ void wg_x_to_bf16_kernel(const float *__restrict__ x, __nv_bfloat16 *__restrict__ out, size_t nchunks,
                                    int vec)
{
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nchunks; i += stride)
		reinterpret_cast<uint4 *>(out)[i] = wg_chunk(x + wg_chunk_k(i), vec);
}

template <int BT, int WGS, int STAGES, int FMT>
int launch(const struct fp4s_mat *w, const __nv_bfloat16 *xp, int M, float *out, int partial, int splits,
           int steps, cudaStream_t s, struct fp4s_error *err)
{
	using C = wg_cfg<BT, WGS, STAGES>;
	FP4S_CUDA_TRY(err, cudaFuncSetAttribute(gemm_wgmma_kernel<BT, WGS, STAGES, FMT>,
	                                        cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
	const dim3 grid((unsigned)FP4S_CEIL_DIV(w->rows, C::ROWS), (unsigned)FP4S_CEIL_DIV(M, BT), (unsigned)splits);
	gemm_wgmma_kernel<BT, WGS, STAGES, FMT><<<grid, C::THREADS, C::SMEM, s>>>(
		xp, (const uint8_t *)w->data, w->scales, FMT == WG_NV ? w->ws2 : 1.0f, w->bias, out,
		partial ? out : nullptr, M, (int)w->rows, (int)w->cols, steps, wg_groups{});
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

/* the grouped form: one block row per group (nz of them), whole K per block */
template <int BT, int FMT>
int launch_grouped(const struct fp4s_stacked *w, const wg_groups &grp, int nz, const __nv_bfloat16 *xp, float *out,
                   cudaStream_t s, struct fp4s_error *err)
{
	constexpr int WGS = 2, STAGES = BT == 256 ? 4 : BT == 128 ? 5 : 6;
	using C = wg_cfg<BT, WGS, STAGES>;
	FP4S_CUDA_TRY(err, cudaFuncSetAttribute(gemm_wgmma_kernel<BT, WGS, STAGES, FMT>,
	                                        cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
	const dim3 grid((unsigned)FP4S_CEIL_DIV(w->rows, C::ROWS), (unsigned)nz, 1);
	const int steps = (int)(w->cols / WG_BK);
	gemm_wgmma_kernel<BT, WGS, STAGES, FMT><<<grid, C::THREADS, C::SMEM, s>>>(
		xp, (const uint8_t *)w->data, w->scales, FMT == WG_NV ? w->ws2 : 1.0f, w->bias, out, nullptr, 0,
		(int)w->rows, (int)w->cols, steps, grp);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

} // namespace

/* The sm_90a image is in this binary when the build's architecture list names 90a, and the driver
 * picks it on a device of compute capability 9.0 (an exact match beats PTX). */
int fp4s_gemm_wgmma_supported(void)
{
#ifdef FP4S_CUDA_ARCHS
	const char *archs = FP4S_CUDA_ARCHS;
#else
	const char *archs = "";
#endif
	int has = 0;
	for (const char *p = archs; (p = strstr(p, "90a")) != NULL; p += 3)
		if ((p == archs || p[-1] == ' ' || p[-1] == ';') && (p[3] == 0 || p[3] == ' ' || p[3] == ';' || p[3] == '-'))
			has = 1;
	int dev = 0, major = 0, minor = 0;
	if (!has || cudaGetDevice(&dev) != cudaSuccess ||
	    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
	    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
		return 0;
	return major == 9 && minor == 0;
}

int fp4s_gemm_wgmma_convert(const float *x, __nv_bfloat16 *xp, int M, int64_t K, cudaStream_t s,
                            struct fp4s_error *err)
{
	const size_t nchunks = (size_t)M * (size_t)K / 8;
	const unsigned blocks = (unsigned)(nchunks / 256 + 1 < 8192 ? nchunks / 256 + 1 : 8192);
	wg_x_to_bf16_kernel<<<blocks, 256, 0, s>>>(x, xp, nchunks, (uintptr_t)x % 8 == 0);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

namespace {

template <int FMT>
int launch_fmt(const struct fp4s_mat *w, const __nv_bfloat16 *xp, int M, float *out, int partial, int bt,
               int rows, int splits, int steps, cudaStream_t s, struct fp4s_error *err)
{
	if (rows == 256)
		return bt == 128 ? launch<128, 4, 5, FMT>(w, xp, M, out, partial, splits, steps, s, err)
		                 : launch<64, 4, 6, FMT>(w, xp, M, out, partial, splits, steps, s, err);
	return bt == 256   ? launch<256, 2, 4, FMT>(w, xp, M, out, partial, splits, steps, s, err)
	       : bt == 128 ? launch<128, 2, 5, FMT>(w, xp, M, out, partial, splits, steps, s, err)
	                   : launch<64, 2, 6, FMT>(w, xp, M, out, partial, splits, steps, s, err);
}

} // namespace

int fp4s_gemm_wgmma(const struct fp4s_mat *w, const __nv_bfloat16 *xp, int M, float *out, int partial, int bt,
                    int rows, int splits, int steps, cudaStream_t s, struct fp4s_error *err)
{
	return w->fmt == FP4S_WF_NVFP4 ? launch_fmt<WG_NV>(w, xp, M, out, partial, bt, rows, splits, steps, s, err)
	                               : launch_fmt<WG_MX>(w, xp, M, out, partial, bt, rows, splits, steps, s, err);
}

int fp4s_gemm_wgmma_grouped(const struct fp4s_stacked *w, const int32_t *g_expert, const int32_t *g_off,
                            const int32_t *g_m, int32_t n_groups, int bt, const __nv_bfloat16 *xp, float *y,
                            cudaStream_t s, struct fp4s_error *err)
{
	const wg_groups grp = {g_expert, g_off, g_m, (long long)w->stride_data, (long long)w->stride_scales,
	                       w->fmt == FP4S_WF_NVFP4 ? w->ws2e : nullptr};
	if (w->fmt == FP4S_WF_NVFP4)
		return bt == 256   ? launch_grouped<256, WG_NV>(w, grp, n_groups, xp, y, s, err)
		       : bt == 128 ? launch_grouped<128, WG_NV>(w, grp, n_groups, xp, y, s, err)
		                   : launch_grouped<64, WG_NV>(w, grp, n_groups, xp, y, s, err);
	return bt == 256   ? launch_grouped<256, WG_MX>(w, grp, n_groups, xp, y, s, err)
	       : bt == 128 ? launch_grouped<128, WG_MX>(w, grp, n_groups, xp, y, s, err)
	                   : launch_grouped<64, WG_MX>(w, grp, n_groups, xp, y, s, err);
}
