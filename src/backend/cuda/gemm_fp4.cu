/* gemm_fp4.cu: W4A16 tensor-core GEMM for prefill (M >= 16 tokens) on GPUs without FP4 MMA
 * (Hopper, Ampere): y[M, N] = x[M, K] . W[N, K]^T * ws2 + bias.
 *
 * Two launches (three with split-K):
 *  1. x FP32 -> BF16 (RNE) into scratch, once, so that the GEMM's activation tiles are plain
 *     16-byte cp.async copies and each activation byte crossing L2 is half as many as in FP32.
 *  2. The GEMM. Block tile BM (64 or 128) tokens x 128 weight rows x 64 K, 256 threads = 8 warps
 *     laid 2 (M) x 4 (N); a warp owns BM/2 x 32 outputs in FP32 registers and issues mma.sync
 *     m16n8k16 BF16. The weights are decoded FP4 -> BF16 into shared memory (exact: formats.md
 *     §3.4) in the MMA fragment layout; the per-tensor FP32 ws2 and the bias are applied to the
 *     FP32 sums in the epilogue. Shared tiles are [rows][64] BF16 (128-byte rows) with the 16-byte
 *     chunk index XORed by (row & 7), so the ldmatrix reads (8 rows, same chunk) and the decode
 *     stores hit 8 distinct bank groups.
 *     - v2 (the default, K % 64 == 0): a cp.async ring keeps 2-3 K steps of raw codes, scale words
 *       and activations in flight; step j+1 is decoded shared -> shared (byte permutes, or a byte
 *       table) beside step j's MMAs, one barrier per step; split-K when the grid is small.
 *     - v1 (K % 64 == 32, or forced): next step's codes held in registers, one step in flight.
 *  3. With split-K: partial sums reduced in fixed order (deterministic), ws2 and bias applied.
 * Measured: bench/results/2026-11-21-gemm.md.
 * On Hopper with an sm_90a image, gemm_wgmma.cu's warpgroup-MMA kernel replaces step 2 (and
 * step 1 converts x into its K-permuted order) where wgmma_auto says it is faster, or when asked
 * for (tune->kernel = 3); FP4S_GEMM_WGMMA=0 in the environment keeps the mma.sync kernels.
 * BF16 weights (lm_head, gpt-oss attention) go to cuBLAS after the same conversion of x. */
#include <cublas_v2.h>
#include <dlfcn.h>

#define FP4S_STR2(x) #x
#define FP4S_STR(x) FP4S_STR2(x)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/e2m1_bf16.cuh"
#include "backend/cuda/gemm_cuda.h"

/* gemm_wgmma.cu (C++ linkage: a mismatch with the definitions fails at link time) */
int fp4s_gemm_wgmma_supported(void);
int fp4s_gemm_wgmma_convert(const float *x, __nv_bfloat16 *xp, int M, int64_t K, cudaStream_t s,
                            struct fp4s_error *err);
int fp4s_gemm_wgmma(const struct fp4s_mat *w, const __nv_bfloat16 *xp, int M, float *out, int partial, int bt,
                    int rows, int splits, int steps, cudaStream_t s, struct fp4s_error *err);

namespace {

constexpr int BN = 128;     /* weight rows per block */
constexpr int BK = 64;      /* K per pipeline step: 128-byte BF16 rows in shared memory */
constexpr int THREADS = 256;
constexpr int FMT_NV = 0, FMT_MX = 1;
/* v2's decode: 0 = shared byte table, 1 = byte permutes (tune->decode overrides). The permutes
 * measured 2-20 % faster at every shape and M on an H200 (bench/results/2026-11-21-gemm.md). */
#define FP4S_GEMM_PRMT_DEFAULT 1
/* wgmma kernel (gemm_wgmma.cu): the smallest M it runs at by default (it measured faster than v2
 * at every M on an H100, bench/results/2026-11-22-h100-gemm-wgmma.md), and its token tile by M:
 * 64 up to 64 tokens, 128 up to 128, above that 256 unless 128-token tiles pad less */
#define FP4S_GEMM_WGMMA_MIN_M 1
#define FP4S_GEMM_WGMMA_BT64_MAX 64
#define FP4S_GEMM_WGMMA_BT128_MAX 128

template <int BM>
struct tile_cfg {
	static constexpr int A_BYTES = BM * BK * 2;
	static constexpr int W_BYTES = BN * BK * 2;
	static constexpr int STAGE = A_BYTES + W_BYTES;
	static constexpr int LUT_OFF = 2 * STAGE;
	static constexpr int SMEM = 2 * STAGE + 256 * 4;
	static constexpr int WM = BM / 2; /* tokens per warp */
	static constexpr int MT = WM / 16; /* m16 tiles per warp */
};

/* Byte offset of 16-byte chunk c (0..7) of row r in a [rows][64] BF16 tile, XOR-swizzled. */
__device__ __forceinline__ uint32_t swz(int r, int c) { return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)); }

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes)
{
	/* src_bytes = 0 zero-fills the chunk (rows past M, K past the end) without reading src */
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
	             : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
	             : "r"(addr));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
	             "{%8,%9}, {%0,%1,%2,%3};\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* BF16 bit patterns of the 16 E2M1 codes (bit 3 = sign); code 8 is -0. */
__device__ __forceinline__ uint32_t e2m1_bf16_bits(uint32_t c)
{
	/* magnitude eem: 0 -> 0, 1 -> 0.5 (0x3F00), else 2^(ee-1) x 1.m: exponent field ee + 126 */
	const uint32_t m = c & 7;
	const uint32_t v = m == 0 ? 0u : m == 1 ? 0x3F00u : (((m >> 1) + 126u) << 7) | ((m & 1) << 6);
	return v | ((c & 8) << 12);
}

/* Decodes one thread's 32 codes (one weight row, 32 consecutive k) into 4 swizzled chunks. */
template <int FMT>
__device__ __forceinline__ void store_w(uint8_t *sw, const uint32_t *lut, int r, int half, uint4 q, uint32_t s)
{
	uint32_t sc[2];
	if (FMT == FMT_NV) {
		sc[0] = scale_bf16x2<FMT>(s & 0xFF); /* codes 0..15 */
		sc[1] = scale_bf16x2<FMT>(s >> 8);   /* codes 16..31 */
	} else {
		sc[0] = sc[1] = scale_bf16x2<FMT>(s);
	}
	const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
	for (int j = 0; j < 4; j++) {
		const __nv_bfloat162 s2 = *reinterpret_cast<const __nv_bfloat162 *>(&sc[j >> 1]);
		uint32_t o[4];
		/* the table is indexed by a byte of two stored codes; the device's words are permuted
		 * (numerics.h), so they are put back in order first */
		const uint32_t w = fp4s_e2m1_unpermute_word(words[j]);
#pragma unroll
		for (int b = 0; b < 4; b++) {
			uint32_t pair = lut[(w >> (8 * b)) & 0xFF];
			__nv_bfloat162 v = __hmul2(*reinterpret_cast<__nv_bfloat162 *>(&pair), s2);
			o[b] = *reinterpret_cast<uint32_t *>(&v);
		}
		*reinterpret_cast<uint4 *>(sw + swz(r, half * 4 + j)) = make_uint4(o[0], o[1], o[2], o[3]);
	}
}

/* The same decode without the shared table: e2m1x8_to_bf16 (e2m1_bf16.cuh). */
template <int FMT>
__device__ __forceinline__ void store_w_prmt(uint8_t *sw, int r, int half, uint4 q, uint32_t s)
{
	uint32_t sc[2];
	if (FMT == FMT_NV) {
		sc[0] = scale_bf16x2<FMT>(s & 0xFF);
		sc[1] = scale_bf16x2<FMT>(s >> 8);
	} else {
		sc[0] = sc[1] = scale_bf16x2<FMT>(s);
	}
	const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
	for (int j = 0; j < 4; j++) {
		const __nv_bfloat162 s2 = *reinterpret_cast<const __nv_bfloat162 *>(&sc[j >> 1]);
		uint32_t o[4];
		e2m1x8_to_bf16(words[j], o);
#pragma unroll
		for (int b = 0; b < 4; b++) {
			__nv_bfloat162 v = __hmul2(*reinterpret_cast<__nv_bfloat162 *>(&o[b]), s2);
			o[b] = *reinterpret_cast<uint32_t *>(&v);
		}
		*reinterpret_cast<uint4 *>(sw + swz(r, half * 4 + j)) = make_uint4(o[0], o[1], o[2], o[3]);
	}
}

template <int BM, int FMT>
__global__ void __launch_bounds__(THREADS, 2)
gemm_w4a16_kernel(const __nv_bfloat16 *__restrict__ xb, const uint8_t *__restrict__ wq,
                  const uint8_t *__restrict__ wsc, float ws2, const float *__restrict__ bias,
                  float *__restrict__ y, int M, int N, int K, int y_vec2)
{
	using C = tile_cfg<BM>;
	extern __shared__ __align__(128) uint8_t smem[];
	uint32_t *lut = reinterpret_cast<uint32_t *>(smem + C::LUT_OFF);
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int wm = warp >> 2, wn = warp & 3;
	const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
	const int nk = (K + BK - 1) / BK;

	/* byte b -> BF16 pair {code(b & 15), code(b >> 4)}: the low nibble is element 2i (§4.7),
	 * which lands in the low half, i.e. the lower address, as the MMA expects */
	lut[tid] = e2m1_bf16_bits(tid & 15) | (e2m1_bf16_bits(tid >> 4) << 16);

	/* weight loader role: one row, one half (32 codes) of the 64-wide K step */
	const int wr = tid >> 1, wh = tid & 1;
	const bool wrow_ok = n0 + wr < N;
	const uint8_t *wq_row = wq + (size_t)(wrow_ok ? n0 + wr : 0) * (size_t)(K / 2) + wh * 16;
	const uint8_t *ws_row = FMT == FMT_NV ? wsc + (size_t)(wrow_ok ? n0 + wr : 0) * (size_t)(K / 16) + wh * 2
	                                      : wsc + (size_t)(wrow_ok ? n0 + wr : 0) * (size_t)(K / 32) + wh;
	uint4 wreg = make_uint4(0, 0, 0, 0);
	uint32_t sreg = 0;
	auto load_w = [&](int kt) {
		if (wrow_ok && kt * BK + wh * 32 < K) {
			wreg = __ldg(reinterpret_cast<const uint4 *>(wq_row + (size_t)kt * 32));
			sreg = FMT == FMT_NV ? (uint32_t)__ldg(reinterpret_cast<const uint16_t *>(ws_row + (size_t)kt * 4))
			                     : (uint32_t)__ldg(ws_row + (size_t)kt * 2);
		} else {
			wreg = make_uint4(0, 0, 0, 0); /* zero codes decode to zeros whatever the scale */
			sreg = 0;
		}
	};
	/* activation tile: BM rows x 8 chunks of 16 bytes, BM / 32 chunks per thread */
	auto load_a = [&](int stage, int kt) {
		uint8_t *sa = smem + stage * C::STAGE;
#pragma unroll
		for (int i = 0; i < BM / 32; i++) {
			const int c = tid + i * THREADS, r = c >> 3, ch = c & 7;
			const int k = kt * BK + ch * 8;
			const bool ok = m0 + r < M && k < K;
			const __nv_bfloat16 *src = ok ? xb + (size_t)(m0 + r) * K + k : xb;
			cp_async16(smem_u32(sa + swz(r, ch)), src, ok ? 16 : 0);
		}
		cp_async_commit();
	};

	float acc[C::MT][4][4];
#pragma unroll
	for (int i = 0; i < C::MT; i++)
#pragma unroll
		for (int j = 0; j < 4; j++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				acc[i][j][e] = 0.0f;

	load_a(0, 0);
	load_w(0);
	__syncthreads(); /* the table */
	store_w<FMT>(smem + C::A_BYTES, lut, wr, wh, wreg, sreg);
	cp_async_wait_all();
	__syncthreads();

	for (int kt = 0; kt < nk; kt++) {
		const int cur = kt & 1;
		const bool more = kt + 1 < nk;
		if (more) {
			/* issued before the MMAs so their latency hides behind this step's math */
			load_a(cur ^ 1, kt + 1);
			load_w(kt + 1);
		}
		const uint8_t *sa = smem + cur * C::STAGE;
		const uint8_t *sw = sa + C::A_BYTES;
#pragma unroll
		for (int kk = 0; kk < BK / 16; kk++) {
			uint32_t a[C::MT][4], b[4][2];
#pragma unroll
			for (int mt = 0; mt < C::MT; mt++) {
				/* lanes 0-15: rows 0-15 at k 0-7; lanes 16-31: rows 0-15 at k 8-15 */
				const int r = wm * C::WM + mt * 16 + (lane & 15);
				ldmatrix_x4(smem_u32(sa + swz(r, kk * 2 + (lane >> 4))), a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
			}
#pragma unroll
			for (int np = 0; np < 2; np++) {
				/* matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15):
				 * W rows are K-contiguous, which is the col-major B fragment as it stands */
				const int r = wn * 32 + np * 16 + (lane & 7) + ((lane >> 4) << 3);
				ldmatrix_x4(smem_u32(sw + swz(r, kk * 2 + ((lane >> 3) & 1))), b[2 * np][0], b[2 * np][1],
				            b[2 * np + 1][0], b[2 * np + 1][1]);
			}
#pragma unroll
			for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
				for (int nt = 0; nt < 4; nt++)
					mma_bf16(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
		}
		if (more) {
			store_w<FMT>(smem + (cur ^ 1) * C::STAGE + C::A_BYTES, lut, wr, wh, wreg, sreg);
			cp_async_wait_all();
		}
		__syncthreads();
	}

	/* epilogue: c0,c1 at token lane/4, rows 2*(lane%4)+{0,1}; c2,c3 at token + 8 */
#pragma unroll
	for (int nt = 0; nt < 4; nt++) {
		const int n = n0 + wn * 32 + nt * 8 + (lane & 3) * 2;
		const float b0 = bias && n < N ? bias[n] : 0.0f;
		const float b1 = bias && n + 1 < N ? bias[n + 1] : 0.0f;
#pragma unroll
		for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
			for (int h = 0; h < 2; h++) {
				const int t = m0 + wm * C::WM + mt * 16 + (lane >> 2) + h * 8;
				if (t >= M)
					continue;
				float *yr = y + (size_t)t * N;
				const float v0 = acc[mt][nt][2 * h] * ws2 + b0, v1 = acc[mt][nt][2 * h + 1] * ws2 + b1;
				if (y_vec2 && n + 1 < N) {
					*reinterpret_cast<float2 *>(yr + n) = make_float2(v0, v1);
				} else {
					if (n < N)
						yr[n] = v0;
					if (n + 1 < N)
						yr[n + 1] = v1;
				}
			}
	}
}

/* ---- v2: a cp.async ring of STAGES steps for everything a step needs ----
 * v1 above keeps one step of weights in flight per block (registers), which measured ~1.1 us per
 * K step at every M on an H200: the step is bound by DRAM latency, not math (32-256 blocks x 4.5 KB
 * in flight is far below the ~3 MB that Little's law asks of 3 TB/s at ~1 us). v2 copies the raw
 * packed codes, their scales and the BF16 activations of STAGES steps ahead into shared memory
 * with cp.async (nothing held in registers), decodes a step's codes shared -> shared into a
 * double-buffered BF16 tile right before its MMAs, and splits K over gridDim.z when the grid is
 * too small to fill the GPU (partial sums to scratch, reduced in fixed order by a second kernel:
 * deterministic). Needs K % 64 == 0 (4-byte scale words per row and step); else v1 runs. */
template <int BM, int STAGES>
struct ring_cfg {
	static constexpr int A_BYTES = BM * BK * 2;  /* BF16 activations, swizzled */
	static constexpr int Q_BYTES = BN * BK / 2;  /* packed codes [128][32 B] */
	static constexpr int S_BYTES = BN * 4;       /* one 4-byte scale word per row */
	static constexpr int SLOT = A_BYTES + Q_BYTES + S_BYTES;
	static constexpr int WB_OFF = STAGES * SLOT; /* two decoded BF16 weight tiles */
	static constexpr int WB_BYTES = BN * BK * 2;
	static constexpr int LUT_OFF = WB_OFF + 2 * WB_BYTES;
	static constexpr int SMEM = LUT_OFF + 256 * 4;
	static constexpr int WM = BM / 2;
	static constexpr int MT = WM / 16;
};

__device__ __forceinline__ void cp_async4(uint32_t dst, const void *src)
{
	asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

template <int BM, int STAGES, int FMT, int PRMT>
__global__ void __launch_bounds__(THREADS, 2)
gemm_w4a16_ring_kernel(const __nv_bfloat16 *__restrict__ xb, const uint8_t *__restrict__ wq,
                       const uint8_t *__restrict__ wsc, float ws2, const float *__restrict__ bias,
                       float *__restrict__ y, float *__restrict__ part, int M, int N, int K,
                       int steps_per_split, int y_vec2)
{
	using C = ring_cfg<BM, STAGES>;
	extern __shared__ __align__(128) uint8_t smem[];
	uint32_t *lut = reinterpret_cast<uint32_t *>(smem + C::LUT_OFF);
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int wm = warp >> 2, wn = warp & 3;
	const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
	const int nk_all = K / BK;
	const int kt0 = blockIdx.z * steps_per_split;
	const int nk = min(steps_per_split, nk_all - kt0);

	lut[tid] = e2m1_bf16_bits(tid & 15) | (e2m1_bf16_bits(tid >> 4) << 16);

	/* copy roles: codes: thread = (row tid/2, 16-byte half tid&1); scales: threads < 128, one row */
	const int wr = tid >> 1, wh = tid & 1;
	const int wrow = min(n0 + wr, N - 1); /* rows past N copy row N-1: finite, never stored */
	const uint8_t *q_src = wq + (size_t)wrow * (size_t)(K / 2) + wh * 16;
	const int srow = min(n0 + (tid & 127), N - 1);
	/* NVFP4: 4 scales per row and step, a 4-byte word; MXFP4: 2 scales, the aligned word holding
	 * them (K / 32 is even, so the pair never straddles a word) */
	const uint8_t *s_src = FMT == FMT_NV ? wsc + (size_t)srow * (size_t)(K / 16)
	                                     : wsc + (size_t)srow * (size_t)(K / 32);

	auto issue = [&](int j) { /* local step j into ring slot j % STAGES */
		uint8_t *slot = smem + (j % STAGES) * C::SLOT;
		const int kt = kt0 + j;
#pragma unroll
		for (int i = 0; i < BM / 32; i++) {
			const int c = tid + i * THREADS, r = c >> 3, ch = c & 7;
			const bool ok = m0 + r < M;
			const __nv_bfloat16 *src = ok ? xb + (size_t)(m0 + r) * K + (size_t)kt * BK + ch * 8 : xb;
			cp_async16(smem_u32(slot + swz(r, ch)), src, ok ? 16 : 0);
		}
		cp_async16(smem_u32(slot + C::A_BYTES + tid * 16), q_src + (size_t)kt * 32, 16);
		if (tid < 128) {
			/* MXFP4: the 4-byte aligned word (by absolute address) holding the pair */
			const uint8_t *sp = FMT == FMT_NV ? s_src + (size_t)kt * 4
			                                  : (const uint8_t *)((uintptr_t)(s_src + (size_t)kt * 2) & ~(uintptr_t)3);
			cp_async4(smem_u32(slot + C::A_BYTES + C::Q_BYTES + tid * 4), sp);
		}
	};

	float acc[C::MT][4][4];
#pragma unroll
	for (int i = 0; i < C::MT; i++)
#pragma unroll
		for (int j = 0; j < 4; j++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				acc[i][j][e] = 0.0f;

	/* Step j's codes are decoded during iteration j-1, next to step j-1's MMAs, so one barrier
	 * per step separates everything and warps overlap decode with other warps' MMAs. Hazards:
	 * the copy issued in iteration j goes to slot (j-1) % STAGES (step j-1: its A read by MMAs in
	 * iteration j-1, its codes by the decode in j-2); the decode of j+1 writes the BF16 tile that
	 * step j-1's MMAs read; both are behind iteration j's barrier. */
	auto decode = [&](int j) {
		const uint8_t *slot = smem + (j % STAGES) * C::SLOT;
		uint8_t *wb = smem + C::WB_OFF + (j & 1) * C::WB_BYTES;
		const uint4 q = *reinterpret_cast<const uint4 *>(slot + C::A_BYTES + tid * 16);
		const uint32_t sw = *reinterpret_cast<const uint32_t *>(slot + C::A_BYTES + C::Q_BYTES + wr * 4);
		/* this thread's 32 codes use scales 2*wh, 2*wh+1 (NVFP4) or, of the word holding step
		 * kt's pair, element wh (MXFP4) */
		uint32_t sv;
		if (FMT == FMT_NV) {
			sv = (sw >> (16 * wh)) & 0xFFFF;
		} else {
			const uintptr_t at = (uintptr_t)(wsc + (size_t)min(n0 + wr, N - 1) * (size_t)(K / 32) +
			                                 (size_t)(kt0 + j) * 2);
			sv = (sw >> ((int)(at & 3) * 8 + wh * 8)) & 0xFF;
		}
		if (PRMT)
			store_w_prmt<FMT>(wb, wr, wh, q, sv);
		else
			store_w<FMT>(wb, lut, wr, wh, q, sv);
	};

	/* prologue: STAGES-1 steps in flight, one commit group each (empty groups keep the count) */
#pragma unroll
	for (int j = 0; j < STAGES - 1; j++) {
		if (j < nk)
			issue(j);
		cp_async_commit();
	}
	cp_async_wait<STAGES - 2>(); /* step 0 */
	__syncthreads();             /* everyone's copies, and the table */
	decode(0);

	for (int j = 0; j < nk; j++) {
		/* groups committed: STAGES-1+j, group g = step g; steps <= j+1 must have landed */
		cp_async_wait<STAGES - 3>();
		__syncthreads();
		if (j + STAGES - 1 < nk)
			issue(j + STAGES - 1);
		cp_async_commit();
		if (j + 1 < nk)
			decode(j + 1);

		const uint8_t *sa = smem + (j % STAGES) * C::SLOT;
		const uint8_t *wb = smem + C::WB_OFF + (j & 1) * C::WB_BYTES;
#pragma unroll
		for (int kk = 0; kk < BK / 16; kk++) {
			uint32_t a[C::MT][4], b[4][2];
#pragma unroll
			for (int mt = 0; mt < C::MT; mt++) {
				const int r = wm * C::WM + mt * 16 + (lane & 15);
				ldmatrix_x4(smem_u32(sa + swz(r, kk * 2 + (lane >> 4))), a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
			}
#pragma unroll
			for (int np = 0; np < 2; np++) {
				const int r = wn * 32 + np * 16 + (lane & 7) + ((lane >> 4) << 3);
				ldmatrix_x4(smem_u32(wb + swz(r, kk * 2 + ((lane >> 3) & 1))), b[2 * np][0], b[2 * np][1],
				            b[2 * np + 1][0], b[2 * np + 1][1]);
			}
#pragma unroll
			for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
				for (int nt = 0; nt < 4; nt++)
					mma_bf16(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
		}
	}
	cp_async_wait<0>();

	/* epilogue: straight to y (one split), or raw sums to part[z][M][N] for the reduction */
	float *dst = part ? part + (size_t)blockIdx.z * (size_t)M * (size_t)N : y;
	const float scale = part ? 1.0f : ws2;
#pragma unroll
	for (int nt = 0; nt < 4; nt++) {
		const int n = n0 + wn * 32 + nt * 8 + (lane & 3) * 2;
		const float b0 = !part && bias && n < N ? bias[n] : 0.0f;
		const float b1 = !part && bias && n + 1 < N ? bias[n + 1] : 0.0f;
#pragma unroll
		for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
			for (int h = 0; h < 2; h++) {
				const int t = m0 + wm * C::WM + mt * 16 + (lane >> 2) + h * 8;
				if (t >= M)
					continue;
				float *yr = dst + (size_t)t * N;
				const float v0 = acc[mt][nt][2 * h] * scale + b0, v1 = acc[mt][nt][2 * h + 1] * scale + b1;
				if (y_vec2 && n + 1 < N) {
					*reinterpret_cast<float2 *>(yr + n) = make_float2(v0, v1);
				} else {
					if (n < N)
						yr[n] = v0;
					if (n + 1 < N)
						yr[n + 1] = v1;
				}
			}
	}
}

/* y = (sum over splits, in split order) * ws2 + bias */
__global__ void splitk_reduce_kernel(const float *__restrict__ part, int splits, size_t mn, int N, float ws2,
                                     const float *__restrict__ bias, float *__restrict__ y)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < mn; i += (size_t)gridDim.x * blockDim.x) {
		float acc = 0.0f;
		for (int z = 0; z < splits; z++)
			acc += part[(size_t)z * mn + i];
		y[i] = acc * ws2 + (bias ? bias[i % (size_t)N] : 0.0f);
	}
}

/* x FP32 -> BF16 (RNE), 8 elements per thread; vector loads when x is 16-byte aligned. */
__global__ void f32_to_bf16_kernel(const float *__restrict__ x, __nv_bfloat16 *__restrict__ out, size_t n, int vec)
{
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i * 8 < n; i += stride) {
		float v[8];
		if (vec) {
			const float4 p = reinterpret_cast<const float4 *>(x)[2 * i];
			const float4 q = reinterpret_cast<const float4 *>(x)[2 * i + 1];
			v[0] = p.x, v[1] = p.y, v[2] = p.z, v[3] = p.w, v[4] = q.x, v[5] = q.y, v[6] = q.z, v[7] = q.w;
		} else {
#pragma unroll
			for (int j = 0; j < 8; j++)
				v[j] = x[i * 8 + j];
		}
		uint32_t o[4];
#pragma unroll
		for (int j = 0; j < 4; j++) {
			__nv_bfloat162 b = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
			o[j] = *reinterpret_cast<uint32_t *>(&b);
		}
		reinterpret_cast<uint4 *>(out)[i] = make_uint4(o[0], o[1], o[2], o[3]);
	}
}

__global__ void add_bias_kernel(float *__restrict__ y, const float *__restrict__ bias, size_t n, int rows)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		y[i] += bias[i % (size_t)rows];
}

template <int BM, int FMT>
int launch_gemm(const struct fp4s_mat *w, const __nv_bfloat16 *xb, int M, float *y, cudaStream_t s,
                struct fp4s_error *err)
{
	using C = tile_cfg<BM>;
	/* > 48 KB of dynamic shared memory needs the opt-in; cheap, so done on every call rather
	 * than cached (a static flag would be per-device state we do not track) */
	FP4S_CUDA_TRY(err, cudaFuncSetAttribute(gemm_w4a16_kernel<BM, FMT>,
	                                        cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
	const dim3 grid((unsigned)FP4S_CEIL_DIV(w->rows, BN), (unsigned)FP4S_CEIL_DIV(M, BM));
	gemm_w4a16_kernel<BM, FMT><<<grid, THREADS, C::SMEM, s>>>(
		xb, (const uint8_t *)w->data, w->scales, FMT == FMT_NV ? w->ws2 : 1.0f, w->bias, y, M,
		(int)w->rows, (int)w->cols, w->rows % 2 == 0 && (uintptr_t)y % 8 == 0);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

/* Split-K plan for v2: enough blocks for about two per SM, each split at least 8 steps of 64. */
struct ring_plan {
	int bm, splits, steps;
};

ring_plan plan_ring(int M, int64_t N, int64_t K, int bm_forced, int sms)
{
	const long long nk = K / BK, nb = FP4S_CEIL_DIV(N, BN);
	/* 128-token tiles run ~1.5x faster per flop than 64 (v1/v2 measured 235 vs 150 TFLOP/s on an
	 * H200); split-K, not smaller tiles, fills the GPU when there are few of them */
	int bm = bm_forced;
	if (!bm)
		bm = M > 64 ? 128 : 64;
	const long long blocks = FP4S_CEIL_DIV((long long)M, bm) * nb;
	int splits = 1;
	/* double while the grid stays under ~2.5 blocks per SM (2 fit at once; partial sums cost
	 * M x N x 8 bytes of traffic per split, so no more than filling the GPU needs) */
	while (splits < 8 && blocks * splits * 2 <= 5LL * sms / 2 && nk / (splits * 2) >= 8)
		splits *= 2;
	const int steps = (int)FP4S_CEIL_DIV(nk, (long long)splits);
	splits = (int)FP4S_CEIL_DIV(nk, (long long)steps); /* no empty split */
	return {bm, splits, steps};
}

template <int BM, int STAGES, int FMT, int PRMT>
int launch_ring(const struct fp4s_mat *w, const __nv_bfloat16 *xb, int M, float *y, float *part,
                const ring_plan &pl, cudaStream_t s, struct fp4s_error *err)
{
	using C = ring_cfg<BM, STAGES>;
	FP4S_CUDA_TRY(err, cudaFuncSetAttribute(gemm_w4a16_ring_kernel<BM, STAGES, FMT, PRMT>,
	                                        cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
	const dim3 grid((unsigned)FP4S_CEIL_DIV(w->rows, BN), (unsigned)FP4S_CEIL_DIV(M, BM), (unsigned)pl.splits);
	const int N = (int)w->rows;
	float *out = pl.splits > 1 ? part : y;
	gemm_w4a16_ring_kernel<BM, STAGES, FMT, PRMT><<<grid, THREADS, C::SMEM, s>>>(
		xb, (const uint8_t *)w->data, w->scales, FMT == FMT_NV ? w->ws2 : 1.0f, w->bias, y,
		pl.splits > 1 ? part : nullptr, M, N, (int)w->cols, pl.steps,
		N % 2 == 0 && (uintptr_t)out % 8 == 0);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	if (pl.splits > 1) {
		const size_t mn = (size_t)M * (size_t)N;
		splitk_reduce_kernel<<<(unsigned)(mn / 256 + 1 < 8192 ? mn / 256 + 1 : 8192), 256, 0, s>>>(
			part, pl.splits, mn, N, FMT == FMT_NV ? w->ws2 : 1.0f, w->bias, y);
		FP4S_CUDA_TRY(err, cudaGetLastError());
	}
	return FP4S_OK;
}

/* cuBLAS is opened with dlopen on first use instead of being linked: libcublasLt carries ~94 KB
 * of thread-local storage, and a linked library's TLS is carved out of every thread's stack, which
 * made the HTTP server's small-stack worker threads fail to start. A dlopen'ed library's TLS is
 * allocated lazily, only in the threads that use it. */
struct cublas_api {
	cublasStatus_t (*create)(cublasHandle_t *);
	cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
	cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
	                          const void *, const void *, cudaDataType, int, const void *, cudaDataType,
	                          int, const void *, void *, cudaDataType, int, cublasComputeType_t,
	                          cublasGemmAlgo_t);
	const char *(*status_string)(cublasStatus_t);
};

int cublas_load(const struct cublas_api **api, struct fp4s_error *err)
{
	static struct cublas_api a;
	static int state; /* 0 not tried, 1 loaded, -1 failed (benign race: every thread agrees) */
	if (state == 0) {
		void *h = dlopen("libcublas.so." FP4S_STR(CUBLAS_VER_MAJOR), RTLD_NOW | RTLD_LOCAL);
#ifdef FP4S_CUBLAS_PATH
		if (!h)
			h = dlopen(FP4S_CUBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
#endif
		if (h) {
			a.create = (cublasStatus_t(*)(cublasHandle_t *))dlsym(h, "cublasCreate_v2");
			a.set_stream = (cublasStatus_t(*)(cublasHandle_t, cudaStream_t))dlsym(h, "cublasSetStream_v2");
			*(void **)&a.gemm_ex = dlsym(h, "cublasGemmEx");
			a.status_string = (const char *(*)(cublasStatus_t))dlsym(h, "cublasGetStatusString");
		}
		state = h && a.create && a.set_stream && a.gemm_ex && a.status_string ? 1 : -1;
	}
	if (state < 0)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "gemm: cuBLAS (libcublas.so.%d) could not be "
		                      "loaded for BF16 weights", CUBLAS_VER_MAJOR);
	*api = &a;
	return FP4S_OK;
}

/* One cuBLAS handle per host thread: handles are not safe to share across threads that set
 * different streams. Created on first use, kept for the thread's life. */
int cublas_handle(const struct cublas_api *api, cublasHandle_t *h, struct fp4s_error *err)
{
	static thread_local cublasHandle_t handle = nullptr;
	if (!handle) {
		const cublasStatus_t st = api->create(&handle);
		if (st != CUBLAS_STATUS_SUCCESS) {
			handle = nullptr;
			return fp4s_error_set(err, FP4S_ECUDA, "cublasCreate failed: %s", api->status_string(st));
		}
	}
	*h = handle;
	return FP4S_OK;
}

int gemm_bf16_cublas(const struct fp4s_mat *w, const __nv_bfloat16 *xb, int M, float *y, cudaStream_t s,
                     struct fp4s_error *err)
{
	const struct cublas_api *api = nullptr;
	cublasHandle_t h = nullptr;
	int rc = cublas_load(&api, err);
	if (!rc)
		rc = cublas_handle(api, &h, err);
	if (rc)
		return rc;
	/* column-major view: y^T [rows, M] = W [rows, K] (row-major = K x rows col-major, transposed)
	 * times x^T [K, M] (row-major x = K x M col-major) */
	const float one = 1.0f, zero = 0.0f;
	cublasStatus_t st = api->set_stream(h, s);
	if (st == CUBLAS_STATUS_SUCCESS)
		st = api->gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, M, (int)w->cols, &one, w->data,
		                  CUDA_R_16BF, (int)w->cols, xb, CUDA_R_16BF, (int)w->cols, &zero, y, CUDA_R_32F,
		                  (int)w->rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	if (st != CUBLAS_STATUS_SUCCESS)
		return fp4s_error_set(err, FP4S_ECUDA, "cublasGemmEx (BF16, %lld x %lld, M = %d) failed: %s",
		                      (long long)w->rows, (long long)w->cols, M, api->status_string(st));
	if (w->bias) {
		const size_t n = (size_t)M * (size_t)w->rows;
		add_bias_kernel<<<(unsigned)(n / 256 + 1 < 4096 ? n / 256 + 1 : 4096), 256, 0, s>>>(y, w->bias, n,
		                                                                                  (int)w->rows);
		FP4S_CUDA_TRY(err, cudaGetLastError());
	}
	return FP4S_OK;
}

} // namespace

static int device_sms(void)
{
	int dev = 0, sms = 132;
	if (cudaGetDevice(&dev) == cudaSuccess)
		cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
	return sms;
}

/* v2 runs for FP4 weights with K % 64 == 0 and a 4-byte aligned NVFP4 scale array, unless v1 is
 * asked for. */
static int use_ring(const struct fp4s_mat *w, const struct fp4s_gemm_tune *tune)
{
	if (tune && tune->kernel == 1)
		return 0;
	return w->fmt != FP4S_WF_BF16 && w->cols % BK == 0 &&
	       (w->fmt == FP4S_WF_MXFP4 || (uintptr_t)w->scales % 4 == 0);
}

/* Whether the wgmma kernel runs: asked for (tune->kernel 3), or automatic (kernel 0) where it
 * measured faster and FP4S_GEMM_WGMMA is not 0; only where it applies (an sm_90a image on a
 * compute capability 9.0 device, FP4 weights, K % 64 == 0, 4-byte aligned NVFP4 scales or 2-byte
 * aligned MXFP4 scales); else v2 / v1 as before. */
static int wgmma_auto(int32_t M)
{
	static int env = -1; /* benign race: every thread computes the same value */
	if (env < 0) {
		const char *e = getenv("FP4S_GEMM_WGMMA");
		env = e && e[0] == '0' ? 0 : 1;
	}
	return env && M >= FP4S_GEMM_WGMMA_MIN_M;
}

static int use_wgmma(const struct fp4s_mat *w, int32_t M, const struct fp4s_gemm_tune *tune)
{
	const int kernel = tune ? tune->kernel : 0;
	if (kernel == 1 || kernel == 2 || (kernel == 0 && !wgmma_auto(M)))
		return 0;
	if (w->fmt == FP4S_WF_BF16 || w->cols % BK ||
	    (uintptr_t)w->scales % (w->fmt == FP4S_WF_NVFP4 ? 4 : 2))
		return 0;
	static int supported = -1; /* per process: every device of one build is assumed alike */
	if (supported < 0)
		supported = fp4s_gemm_wgmma_supported();
	return supported;
}

/* Tiles and split-K for the wgmma kernel: bt tokens x rows weight rows per block (128 rows: two
 * warpgroups, two blocks per SM up to 128 tokens; 256 rows: four warpgroups, one block). Split K
 * only while the grid is under one block per SM (partials cost M x N x 8 bytes of traffic per
 * split), each split >= 8 steps. */
struct wg_plan {
	int bt, rows, splits, steps;
};

static wg_plan plan_wgmma(int M, int64_t N, int64_t K, const struct fp4s_gemm_tune *tune, int sms)
{
	int bt = tune ? tune->bm : 0, rows = tune ? tune->rows : 0;
	if (!rows)
		rows = 128;
	if (!bt) {
		/* 256-token tiles amortize each thread's decode over twice the MMA work: on an H100 they
		 * ran up to 30 % faster than 128 from M = 256 up, split-K included (M = 512 with 4096
		 * rows: 64 blocks, two splits), but not where they pad a whole 128 more */
		bt = M <= FP4S_GEMM_WGMMA_BT64_MAX                               ? 64
		     : M <= FP4S_GEMM_WGMMA_BT128_MAX || rows == 256             ? 128
		     : FP4S_CEIL_DIV(M, 256) * 256 > FP4S_CEIL_DIV(M, 128) * 128 ? 128
		                                                                 : 256;
	}
	if (bt == 256)
		rows = 128; /* 4 warpgroups x 128 accumulators would not fit the registers (forced 256 x 256) */
	const long long nk = K / BK, blocks = FP4S_CEIL_DIV((long long)M, bt) * FP4S_CEIL_DIV(N, (long long)rows);
	int splits = 1;
	while (splits < 8 && blocks * splits * 2 <= sms && nk / (splits * 2) >= 8)
		splits *= 2;
	const int steps = (int)FP4S_CEIL_DIV(nk, (long long)splits);
	splits = (int)FP4S_CEIL_DIV(nk, (long long)steps);
	return {bt, rows, splits, steps};
}

static size_t xb_bytes(int32_t M, int64_t K) { return ((size_t)M * (size_t)K * 2 + 255) & ~(size_t)255; }

extern "C" int fp4s_cuda_gemm_has_wgmma(void) { return fp4s_gemm_wgmma_supported(); }

extern "C" size_t fp4s_cuda_gemm_workspace_bytes(const struct fp4s_mat *w, int32_t M,
                                                 const struct fp4s_gemm_tune *tune)
{
	if (!w || M <= 0 || w->cols <= 0 || w->rows <= 0)
		return 0;
	size_t b = xb_bytes(M, w->cols);
	if (use_wgmma(w, M, tune)) {
		const wg_plan pl = plan_wgmma(M, w->rows, w->cols, tune, device_sms());
		if (pl.splits > 1)
			b += (size_t)pl.splits * (size_t)M * (size_t)w->rows * sizeof(float);
	} else if (use_ring(w, tune)) {
		const ring_plan pl = plan_ring(M, w->rows, w->cols, tune ? tune->bm : 0, device_sms());
		if (pl.splits > 1)
			b += (size_t)pl.splits * (size_t)M * (size_t)w->rows * sizeof(float);
	}
	return b;
}

extern "C" int fp4s_cuda_gemm_ex(const struct fp4s_mat *w, const float *x, int32_t M, float *y, void *ws,
                                 size_t ws_bytes, const struct fp4s_gemm_tune *tune, cudaStream_t s,
                                 struct fp4s_error *err)
{
	if (!w || M < 0 || w->rows <= 0 || w->cols <= 0 || w->rows > INT32_MAX || w->cols > INT32_MAX)
		return fp4s_error_set(err, FP4S_EINVAL, "gemm: bad shape [%lld, %lld] x %d tokens",
		                      w ? (long long)w->rows : 0LL, w ? (long long)w->cols : 0LL, (int)M);
	if (w->fmt != FP4S_WF_NVFP4 && w->fmt != FP4S_WF_MXFP4 && w->fmt != FP4S_WF_BF16)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "gemm: weight format %d (NVFP4, MXFP4, BF16 only)",
		                      (int)w->fmt);
	if (w->cols % 32)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "gemm: K = %lld is not a multiple of 32",
		                      (long long)w->cols);
	if (!w->data || (w->fmt != FP4S_WF_BF16 && !w->scales) || (M > 0 && (!x || !y)))
		return fp4s_error_set(err, FP4S_EINVAL, "gemm: missing weight data, scales, x or y");
	if ((uintptr_t)x % 4 || (uintptr_t)w->data % 16 || (w->fmt == FP4S_WF_NVFP4 && (uintptr_t)w->scales % 2))
		return fp4s_error_set(err, FP4S_EINVAL, "gemm: x, data or scales misaligned");
	if (tune && ((tune->bm != 0 && tune->bm != 64 && tune->bm != 128 && tune->bm != 256) || tune->kernel < 0 ||
	             tune->kernel > 3 || tune->decode < 0 || tune->decode > 2 ||
	             (tune->rows != 0 && tune->rows != 128 && tune->rows != 256)))
		return fp4s_error_set(err, FP4S_EINVAL, "gemm: tile of %d tokens (64, 128, 256) x %d rows (128, 256), "
		                      "kernel %d (1, 2, 3)", tune->bm, tune->rows, tune->kernel);
	if (M == 0)
		return FP4S_OK;
	const int wgmma = use_wgmma(w, M, tune);
	if (tune && tune->bm == 256 && !wgmma)
		return fp4s_error_set(err, FP4S_EINVAL, "gemm: a tile of 256 tokens needs the wgmma kernel");
	const size_t need = fp4s_cuda_gemm_workspace_bytes(w, M, tune);
	if (ws && (ws_bytes < need || (uintptr_t)ws % 256))
		return fp4s_error_set(err, FP4S_EINVAL, "gemm: workspace of %zu bytes (need %zu, 256-aligned)",
		                      ws_bytes, need);
	void *scratch = ws;
	if (!scratch)
		FP4S_CUDA_TRY(err, cudaMallocAsync(&scratch, need, s));
	__nv_bfloat16 *xb = (__nv_bfloat16 *)scratch;
	float *part = (float *)((uint8_t *)scratch + xb_bytes(M, w->cols));

	int rc = FP4S_OK;
	if (wgmma) {
		rc = fp4s_gemm_wgmma_convert(x, xb, M, w->cols, s, err);
	} else {
		const size_t n = (size_t)M * (size_t)w->cols, groups = n / 8;
		const unsigned blocks = (unsigned)(groups / 256 + 1 < 8192 ? groups / 256 + 1 : 8192);
		f32_to_bf16_kernel<<<blocks, 256, 0, s>>>(x, xb, n, (uintptr_t)x % 16 == 0);
		const cudaError_t e = cudaGetLastError();
		if (e != cudaSuccess)
			rc = fp4s_error_set(err, FP4S_ECUDA, "f32_to_bf16_kernel launch failed: %s", cudaGetErrorString(e));
	}
	if (!rc) {
		const int sms = device_sms();
		if (w->fmt == FP4S_WF_BF16) {
			rc = gemm_bf16_cublas(w, xb, M, y, s, err);
		} else if (wgmma) {
			const wg_plan pl = plan_wgmma(M, w->rows, w->cols, tune, sms);
			rc = fp4s_gemm_wgmma(w, xb, M, pl.splits > 1 ? part : y, pl.splits > 1, pl.bt, pl.rows, pl.splits,
			                     pl.steps, s, err);
			if (!rc && pl.splits > 1) {
				const size_t mn = (size_t)M * (size_t)w->rows;
				splitk_reduce_kernel<<<(unsigned)(mn / 256 + 1 < 8192 ? mn / 256 + 1 : 8192), 256, 0, s>>>(
					part, pl.splits, mn, (int)w->rows, w->fmt == FP4S_WF_NVFP4 ? w->ws2 : 1.0f, w->bias, y);
				const cudaError_t e = cudaGetLastError();
				if (e != cudaSuccess)
					rc = fp4s_error_set(err, FP4S_ECUDA, "splitk_reduce_kernel launch failed: %s",
					                    cudaGetErrorString(e));
			}
		} else if (use_ring(w, tune)) {
			const ring_plan pl = plan_ring(M, w->rows, w->cols, tune ? tune->bm : 0, sms);
			const int prmt = tune && tune->decode ? tune->decode == 2 : FP4S_GEMM_PRMT_DEFAULT;
			if (w->fmt == FP4S_WF_NVFP4 && prmt)
				rc = pl.bm == 128 ? launch_ring<128, 3, FMT_NV, 1>(w, xb, M, y, part, pl, s, err)
				                  : launch_ring<64, 4, FMT_NV, 1>(w, xb, M, y, part, pl, s, err);
			else if (w->fmt == FP4S_WF_NVFP4)
				rc = pl.bm == 128 ? launch_ring<128, 3, FMT_NV, 0>(w, xb, M, y, part, pl, s, err)
				                  : launch_ring<64, 4, FMT_NV, 0>(w, xb, M, y, part, pl, s, err);
			else if (prmt)
				rc = pl.bm == 128 ? launch_ring<128, 3, FMT_MX, 1>(w, xb, M, y, part, pl, s, err)
				                  : launch_ring<64, 4, FMT_MX, 1>(w, xb, M, y, part, pl, s, err);
			else
				rc = pl.bm == 128 ? launch_ring<128, 3, FMT_MX, 0>(w, xb, M, y, part, pl, s, err)
				                  : launch_ring<64, 4, FMT_MX, 0>(w, xb, M, y, part, pl, s, err);
		} else {
			int bm = tune && tune->bm ? tune->bm : 0;
			if (!bm) {
				/* 128-token tiles halve the activation re-reads but need enough blocks to fill
				 * the GPU twice over (two blocks per SM); otherwise 64-token tiles */
				const long long blocks128 = FP4S_CEIL_DIV((long long)M, 128) * FP4S_CEIL_DIV(w->rows, BN);
				bm = blocks128 >= 2LL * sms ? 128 : 64;
			}
			if (w->fmt == FP4S_WF_NVFP4)
				rc = bm == 128 ? launch_gemm<128, FMT_NV>(w, xb, M, y, s, err)
				               : launch_gemm<64, FMT_NV>(w, xb, M, y, s, err);
			else
				rc = bm == 128 ? launch_gemm<128, FMT_MX>(w, xb, M, y, s, err)
				               : launch_gemm<64, FMT_MX>(w, xb, M, y, s, err);
		}
	}
	if (!ws) {
		const cudaError_t e = cudaFreeAsync(scratch, s);
		if (e != cudaSuccess && !rc)
			rc = fp4s_error_set(err, FP4S_ECUDA, "cudaFreeAsync failed: %s", cudaGetErrorString(e));
	}
	return rc;
}

extern "C" int fp4s_cuda_gemm(const struct fp4s_mat *w, const float *x, int32_t M, float *y, cudaStream_t s,
                              struct fp4s_error *err)
{
	return fp4s_cuda_gemm_ex(w, x, M, y, NULL, 0, NULL, s, err);
}
