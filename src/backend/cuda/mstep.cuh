/* mstep.cuh: the one-launch decode step of a qwen3-moe model of qwen3-30b-a3b's geometry (all
 * its layers for one token; mstep.cu launches it, mstep_kernel.cuh holds the attention, the
 * merge, the route and the kernel): the geometry, the argument block, the counters between
 * phases, the hang diagnostics, staging and the tile loops.
 *
 * Why: that model's decode is bound by the latency chains of six launches a layer, not by its
 * bytes (issue #6, docs/status.md). The step runs all layers in one launch, so a layer's phases
 * hand over through counters instead of kernel boundaries (dev/mega_bench.cu measures it).
 *
 * One block an SM (a cooperative launch, so all are resident), 8 consumer warps and a producer
 * warp. Every block runs the same program over the layers and takes its share of each phase by
 * its index:
 *   qkv   320 tiles of 16 rows (x = RMSNorm(h)), v written into the cache at pos (k, before its
 *         norm and rotary, to kraw: the last split of its kv head finishes it)
 *   attn  NKV x S splits of <= MG_T positions, a kv head's 8 query heads each (q_norm and
 *         rotary as q is staged; the last split also k's, and writes it to the cache), on the
 *         tensor cores; with S > 1, then 32 merges, one (kv head, query head) a block
 *   o     128 tiles, K 4096 in two stages, h2 = h + o; then the tile's part of the router's logits
 *         (BF16, as the model has it): its 16 columns of the router times n2 * h2 of its 16 rows
 *   route every block, once the o tiles are in: x = RMSNorm(h2), the logits as the sum of the
 *         128 parts (scaled by the norm's 1 / rms, the same for all), the top-k
 *   gu    8 slots x 96 tiles of (gate, up) row pairs, SwiGLU out
 *   down  128 tiles, each the 8 slots' rows in order, h' = h2 + sum_s w_s down_s
 * A phase's blocks add their task count to a counter of the layer (release); a phase waits for
 * the counts it needs (acquire), so no phase waits for a launch. The producer copies each task's
 * weights into a ring of shared memory in program order as soon as a slot is free, across phase
 * and layer boundaries: the static matrices of the next phases stream while a phase waits. Only
 * the experts' copies wait, for the top-k (every block's consumers run it from the o tiles' parts:
 * no router phase between the o and the top-k).
 *
 * The weights are the backend's own (cuda_upload.cu, cuda_moe.cu): row-major FP4 codes (each
 * 32-bit word in the device's permuted E2M1 order) and E4M3 scales a row, the experts stacked with
 * gate and up rows alternating. A stage is 16 rows of <= 2048 K as they lie in memory: qkv's,
 * gate|up's and down's tiles are contiguous (one bulk copy for the codes, one for the scales), o's
 * half rows come by a 2-D tensor map. mg_step reads them conflict-free without padding (odd rows
 * a step apart from even ones), with gemv_mma.cuh's gm_step for the math. (Copying a stage a row
 * at a time into padded rows measured 43.5 us a layer against 27: the copy engine takes ~30 ns a
 * bulk copy, and the experts' 448 copies a block sat between the top-k and the down.) The KV
 * cache is the backend's paged one ([block][16][NKV x 128] BF16); a K or V stage is 4 blocks of
 * a kv head, one tensor-map copy a block with the 128-byte swizzle (the ldmatrix reads of 8 rows
 * then conflict-free; mg_kv_sa).
 */
#ifndef FP4S_MSTEP_CUH
#define FP4S_MSTEP_CUH

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/arrive.cuh"
#include "backend/cuda/gemv_mma.cuh"
#include "backend/cuda/gemv_tma.cuh"
#include "backend/cuda/swiglu.cuh"

#define MG_H 2048
#define MG_NQ 32
#define MG_NKV 4
#define MG_HD 128
#define MG_QR (MG_NQ * MG_HD)                    /* 4096 */
#define MG_QKV ((MG_NQ + 2 * MG_NKV) * MG_HD)    /* 5120 */
#define MG_E 128
#define MG_K 8
#define MG_FI 768
#define MG_CB 1024 /* a stage's code bytes a row (2048 K) */
#define MG_SB 128  /* its scale bytes a row */
#define MG_STAGE (16 * (MG_CB + MG_SB)) /* a multiple of 1024 (the K / V stages' swizzled copies) */
#define MG_DCB 384 /* the down's (768 K) */
#define MG_DSB 48
#define MG_DSTAGE (16 * (MG_DCB + MG_DSB)) /* two to a ring slot */
#define MG_KVB 16  /* positions a KV cache block (backend.h FP4S_KV_BLOCK) */
#ifndef MG_NS
#define MG_NS 10 /* ring stages */
#endif
#define MG_W 8
#define MG_THREADS ((MG_W + 1) * 32)
#define MG_T 128
#define MG_SCS (MG_T + 8) /* the attention's score rows' stride (floats): P's float2 loads conflict-free */
#define MG_PS (MG_HD + 4) /* an attention split's partial a head: 128 sums, max, sum, 2 spare (16-byte rows) */
#define MG_QKV_TILES (MG_QKV / 16)
#define MG_O_TILES (MG_H / 16)
#define MG_RT_BYTES (MG_E * 16 * 2) /* an o tile's router columns: [E][16] BF16 */
#define MG_GU_TILES (2 * MG_FI / 16) /* a slot's */
#define MG_D_TILES (MG_H / 16)
#define MG_CS_H 4128  /* gm_col_stride(2048 / 32) */
#define MG_CS_Q 8224  /* gm_col_stride(4096 / 32) */
#define MG_CS_F 1568  /* gm_col_stride(768 / 32) */
#define MG_XS (MG_K * 2 * MG_CS_F + 512) /* the down's x; the attention's scratch is 512 B more */
#define MG_SMEM (MG_NS * MG_STAGE + MG_XS + 2 * MG_W * 16 * 4 + 64 * 8 + 256)

enum { C_QKV, C_ATT, C_O, C_GU, C_D, C_N };
#define MG_CNT (C_N + MG_NKV) /* counters a layer: the phases', then each kv head's splits */
/* timeline entries a block: the consumers' marks (start, qkv's x staged, its tiles done, qkv; the
 * attention's q staged, scores, softmax, P V summed, partials written; the merge's splits seen, its
 * sums; end; o, o seen, the route's logits summed, top-k, gu, the
 * down's count seen, its act staged, warp 0's stage landed, down), then the producer's (top-k
 * seen, last expert copy issued) */
enum {
	T_START, T_QX, T_QT, T_QKV, T_AQ, T_AS, T_ASM, T_APV, T_APW, T_MSEEN, T_MLD, T_ATT, T_O, T_OSEEN, T_RSUM,
	T_TOPK, T_GU, T_DSEEN, T_DACT, T_DLAND, T_D, T_PSEL, T_PCOPIED, MG_TL
};

/* a layer's weights: codes and scales of each matrix (qkv [5120][2048], o [2048][4096], the
 * experts' gate|up [E][1536][2048] and down [E][2048][768], stacked at gu_stride / dn_stride code
 * bytes and gus_stride / dns_stride scale bytes), their NVFP4 tensor scales (a float, or one an
 * expert) */
struct mg_layer {
	const uint8_t *qkv, *qkv_s, *o, *o_s, *gu, *gu_s, *dn, *dn_s;
	float qkv_ws2, o_ws2;
	const float *gu_ws2, *dn_ws2; /* [E] */
	const __nv_bfloat16 *rt; /* the router, [H / 16][E][16]: an o tile's 16 columns together */
	const float *n1, *n2;
	const float *qn, *kn; /* q_norm's and k_norm's weights [HD] */
	__nv_bfloat16 *kc, *vc; /* the layer's KV blocks, [block][MG_KVB][NKV][HD] */
};

struct mg_args {
	const mg_layer *ly;
	int L;
	float eps, scale, mscale; /* RMSNorm's eps, the attention's scale, rotary's factor */
	const float *inv_freq;   /* rotary's [HD / 2] */
	const int32_t *pos, *seq, *table; /* the token's position and sequence, the block table */
	int table_stride;
	int nb; /* KV blocks a layer */
	const CUtensorMap *maps;  /* [L][4]: o's codes and scales, qkv's and gate|up's scales (mg_map_w) */
	const CUtensorMap *kvmap; /* [2]: the K and V pools as {64, pos 16, half 2, kv head, block}, box
	                           * {64, 16, 2, 1, 1}, 128-byte swizzle */
	const float *hin; /* layer 0's input */
	float *hout;      /* the last layer's output (may be hin) */
	float *h;      /* [L][H]: layer l's input at h + l H for l > 0 */
	float *h2;     /* [L][H] */
	float *q;      /* [L][QR] (before q_norm and rotary) */
	float *kraw;   /* [L][NKV][HD] k at pos before k_norm and rotary (v goes to the cache directly) */
	float *att;    /* [L][QR] */
	float *part;   /* [NKV][S][8][MG_PS] (S of this step's context; one layer's at a time, mg_merge) */
	float *rpart;  /* [L][O tiles][E]: each o tile's part of the router's logits */
	float *logits; /* [L][E] (block 0's, for checks) */
	float *act;    /* [L][K][FI] */
	int32_t *sel;  /* [L][K] */
	unsigned *cnt; /* [L][MG_CNT], zero at launch */
	unsigned long long *tl; /* [G][MG_TL] marks of layer tl_layer (NULL: none) */
	int tl_layer;
	size_t gu_stride, dn_stride, gus_stride, dns_stride;
};

/* ---- host: the step's tensor maps ---------------------------------------------------------- */

typedef CUresult (*mg_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                 const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* the driver's encoder (NULL where the driver has none) */
static inline mg_encode_fn mg_encoder(void)
{
	void *fn = NULL;
	cudaDriverEntryPointQueryResult q;
	if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
	    q != cudaDriverEntryPointSuccess)
		return NULL;
	return (mg_encode_fn)fn;
}

/* a layer's maps (mg_args.maps): m[0] o's codes ([H] rows of QR / 16 u64, a box 128 x 16: half
 * a row's K), m[1] o's scales, m[2] qkv's scales, m[3] the stacked experts' gate|up scales (gus:
 * their rows), each a box of 16 rows of 128 bytes with the 128-byte swizzle (mg_step). 0 on
 * success. */
static inline int mg_map_w(mg_encode_fn enc, const uint8_t *o, const uint8_t *o_s, const uint8_t *qkv_s,
                           const uint8_t *gu_s, int64_t gus, CUtensorMap *m)
{
	const cuuint64_t cd[2] = {MG_QR / 16, MG_H}, cs[1] = {MG_QR / 2}; /* u64: 16 codes each */
	const cuuint32_t box[2] = {128, 16}, one[2] = {1, 1};
	const struct {
		const uint8_t *p;
		cuuint64_t w, rows;
	} sc[3] = {{o_s, MG_QR / 16, MG_H}, {qkv_s, MG_H / 16, MG_QKV}, {gu_s, MG_H / 16, (cuuint64_t)gus}};
	if (enc(&m[0], CU_TENSOR_MAP_DATA_TYPE_UINT64, 2, (void *)o, cd, cs, box, one, CU_TENSOR_MAP_INTERLEAVE_NONE,
	        CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) !=
	    CUDA_SUCCESS)
		return 1;
	for (int i = 0; i < 3; i++) {
		const cuuint64_t d[2] = {sc[i].w, sc[i].rows}, st[1] = {sc[i].w};
		if (enc(&m[1 + i], CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)sc[i].p, d, st, box, one,
		        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
		        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
			return 1;
	}
	return 0;
}

/* a K or V pool's map: blocks ([blocks][16][nkv][HD] BF16, all layers') as {64 dims, position 16,
 * half 2, kv head, block}, a box one kv head's 16 rows of a block, swizzled (mg_kv_sa). */
static inline int mg_map_kv(mg_encode_fn enc, void *pool, int64_t blocks, int nkv, CUtensorMap *m)
{
	const cuuint64_t d[5] = {64, MG_KVB, 2, (cuuint64_t)nkv, (cuuint64_t)blocks};
	const cuuint64_t st[4] = {(cuuint64_t)nkv * MG_HD * 2, 128, MG_HD * 2, (cuuint64_t)MG_KVB * nkv * MG_HD * 2};
	const cuuint32_t box[5] = {64, MG_KVB, 2, 1, 1}, one[5] = {1, 1, 1, 1, 1};
	return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, pool, d, st, box, one, CU_TENSOR_MAP_INTERLEAVE_NONE,
	           CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) !=
	       CUDA_SUCCESS;
}

/* mg_stuck's records (host-mapped), NULL: none. Static: every file that includes this has its own */
static __device__ int *mg_dg;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
static __device__ __forceinline__ unsigned mg_ld_acq(const unsigned *c)
{
	unsigned v;
	asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
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

/* whether a wait at its it-th try has just passed a second (once a wait; t0 starts at 0): the
 * clock is read every 1024 tries */
static __device__ __forceinline__ bool mg_overdue(unsigned it, unsigned long long &t0)
{
	if ((it & 1023) != 0)
		return false;
	const unsigned long long t = gm_now();
	if (!t0) {
		t0 = t;
		return false;
	}
	if (t - t0 > 1000000000ull && t0 != ~0ull) {
		t0 = ~0ull;
		return true;
	}
	return false;
}

/* mbarrier wait with the diagnostics */
static __device__ __forceinline__ void mg_wbar(uint64_t *b, unsigned parity, int what, unsigned aux)
{
	uint32_t ok;
	unsigned long long t0 = 0;
	for (unsigned it = 0;; it++) {
		asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
		             "selp.u32 %0, 1, 0, p;\n\t}"
		             : "=r"(ok)
		             : "r"(gt_sa(b)), "r"(parity)
		             : "memory");
		if (ok)
			return;
		if (mg_overdue(it, t0))
			mg_stuck(what, aux, parity);
	}
}

/* waits until *c >= target (acquire loads; a relaxed poll with one fence after, or with pauses,
 * measured no faster) */
static __device__ __forceinline__ void mg_poll(const unsigned *c, unsigned target)
{
	unsigned long long t0 = 0;
	for (unsigned it = 0;; it++) {
		const unsigned v = mg_ld_acq(c);
		if (v >= target)
			return;
		if (mg_overdue(it, t0))
			mg_stuck(100, (unsigned)(uintptr_t)c, (v << 16) | target);
	}
}

static __device__ __forceinline__ void mg_pub(unsigned *c, unsigned n)
{
	asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(c), "r"(n) : "memory");
}

/* A value that carries its own readiness (the gate|up's outputs, act): the buffer is cleared with
 * the counters before each launch, a written value is never all-zero bits (+0 goes as -0, the same
 * in every product), and its count is added relaxed, a hint for the readers, who load until no
 * value is zero. A release count waits for the block's stores to be acknowledged, and on the SM
 * those acknowledgements queue behind the expert copies landing: FP4S_MSTEP_TL measured 1.1-1.8
 * us from the gate|up's last row sums to its count, 0.1 us this way (qwen3-30b-a3b on the H200:
 * +1.5 % tg128, +3 % at depth 4096, bench/results/2026-11-30-h200-session48.md). */
static __device__ __forceinline__ void mg_put_ready(float *p, float v)
{
	const unsigned u = __float_as_uint(v);
	asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(u ? u : 0x80000000u) : "memory");
}

static __device__ __forceinline__ void mg_pub_hint(unsigned *c, unsigned n)
{
	asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" ::"l"(c), "r"(n) : "memory");
}

static __device__ __forceinline__ float4 mg_ld_ready4(const float *p)
{
	float4 r;
	asm volatile("ld.relaxed.gpu.global.v4.f32 {%0, %1, %2, %3}, [%4];"
	             : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w)
	             : "l"(p)
	             : "memory");
	return r;
}

static __device__ __forceinline__ bool mg_ready4(const float4 &r)
{
	return __float_as_uint(r.x) && __float_as_uint(r.y) && __float_as_uint(r.z) && __float_as_uint(r.w);
}

/* the consumers' outputs written, thread 0 adds n to *c for them (the barrier orders the others'
 * writes before its release) */
static __device__ __forceinline__ void mg_cpub(unsigned *c, unsigned n, int tid)
{
	gt_sync();
	if (tid == 0)
		mg_pub(c, n);
}

/* the consumers wait until *c >= target (thread 0 polls; the barrier orders the others' loads) */
static __device__ __forceinline__ void mg_cwait(const unsigned *c, unsigned target, int tid)
{
	if (tid == 0)
		mg_poll(c, target);
	gt_sync();
}

static __device__ __forceinline__ void mg_mark(const mg_args &a, int l, int ph, int tid)
{
	if (a.tl && l == a.tl_layer && tid == 0)
		a.tl[blockIdx.x * MG_TL + ph] = gm_now();
}

/* the (hi, lo) words of 2 values (BF16 each, the low half the first: gm_st_put's rounding) */
static __device__ __forceinline__ void mg_hilo2(float a, float b, uint32_t &hi, uint32_t &lo)
{
	const __nv_bfloat16 h0 = __float2bfloat16_rn(a), h1 = __float2bfloat16_rn(b);
	const __nv_bfloat16 l0 = __float2bfloat16_rn(a - __bfloat162float(h0));
	const __nv_bfloat16 l1 = __float2bfloat16_rn(b - __bfloat162float(h1));
	hi = (uint32_t)*reinterpret_cast<const unsigned short *>(&h0) |
	     ((uint32_t)*reinterpret_cast<const unsigned short *>(&h1) << 16);
	lo = (uint32_t)*reinterpret_cast<const unsigned short *>(&l0) |
	     ((uint32_t)*reinterpret_cast<const unsigned short *>(&l1) << 16);
}

/* the byte of x's 16-byte group holding values k .. k + 8 (k % 8 == 0) in gm_st_put's layout,
 * where value e of the group sits at byte (3 - e % 4) 4 + (e / 4) 2: e and e + 4 share a word */
static __device__ __forceinline__ uint32_t mg_group(int k)
{
	const int lc = k >> 5, j = (k >> 3) & 3;
	return (uint32_t)(lc * 64 + ((j ^ ((lc >> 1) & 1)) * 16));
}

/* values k .. k + 8 (k % 8 == 0, a thread's own) staged (hi, lo at column stride cs): words
 * (e3, e7), (e2, e6), (e1, e5), (e0, e4), one 16-byte store each. (gm_st_put a value at a time,
 * a thread's values 32 bytes from the next thread's, made 8- to 16-way bank conflicts: 1.9-2.7
 * us to stage 4096 values in the dense step, bench/results/2026-11-30-h200-session42.md.) */
static __device__ __forceinline__ void mg_put8(uint8_t *xs, int cs, int k, const float4 a, const float4 b)
{
	uint32_t hi[4], lo[4];
	mg_hilo2(a.w, b.w, hi[0], lo[0]);
	mg_hilo2(a.z, b.z, hi[1], lo[1]);
	mg_hilo2(a.y, b.y, hi[2], lo[2]);
	mg_hilo2(a.x, b.x, hi[3], lo[3]);
	const uint32_t off = gt_sa(xs) + mg_group(k);
	asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(off), "r"(hi[0]), "r"(hi[1]), "r"(hi[2]),
	             "r"(hi[3])
	             : "memory");
	asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(off + (uint32_t)cs), "r"(lo[0]), "r"(lo[1]),
	             "r"(lo[2]), "r"(lo[3])
	             : "memory");
}

/* values k .. k + 4 (k % 4 == 0) staged, by the lane pair (2p, 2p + 1) holding k and k ^ 4 (one
 * 16-byte group): after two shuffles the even lane writes bytes 8-15 ((e1, e5), (e0, e4)) and the
 * odd lane bytes 0-7 ((e3, e7), (e2, e6)), one 8-byte store each for hi and lo. All 32 lanes
 * call it. */
static __device__ __forceinline__ void mg_put4(uint8_t *xs, int cs, int k, const float4 r, int lane)
{
	const bool odd = lane & 1;
	const float p0 = __shfl_xor_sync(0xFFFFFFFFu, odd ? r.x : r.z, 1);
	const float p1 = __shfl_xor_sync(0xFFFFFFFFu, odd ? r.y : r.w, 1);
	uint32_t hi[2], lo[2];
	mg_hilo2(odd ? p1 : r.y, odd ? r.w : p1, hi[0], lo[0]);
	mg_hilo2(odd ? p0 : r.x, odd ? r.z : p0, hi[1], lo[1]);
	const uint32_t off = gt_sa(xs) + mg_group(k & ~7) + (odd ? 0u : 8u);
	asm volatile("st.shared.v2.b32 [%0], {%1, %2};" ::"r"(off), "r"(hi[0]), "r"(hi[1]) : "memory");
	asm volatile("st.shared.v2.b32 [%0], {%1, %2};" ::"r"(off + (uint32_t)cs), "r"(lo[0]), "r"(lo[1]) : "memory");
}

/* the consumers' sum of their v (each warp's, then the warps' in order through sred[8]; the
 * barrier is the caller's last before it reads sred again) */
static __device__ __forceinline__ float mg_block_sum(float v, float *sred, int tid)
{
	for (int o = 16; o; o >>= 1)
		v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
	if ((tid & 31) == 0)
		sred[tid >> 5] = v;
	gt_sync();
	float tot = 0.0f;
#pragma unroll
	for (int w8 = 0; w8 < MG_W; w8++)
		tot += sred[w8];
	return tot;
}

/* x = v * rsqrt(mean(v^2) + eps) * nw over H, staged (hi, lo) into xs (column stride MG_CS_H);
 * returns the 1 / rms. The thread's 8 values of v given (a, b: v[8 tid .. + 8)). */
static __device__ float mg_stage_norm_x(const float4 a, const float4 b, const float4 na, const float4 nb, float eps,
                                       uint8_t *xs, float *sred, int tid)
{
	const int k0 = tid * 8;
	const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
	const float w[8] = {na.x, na.y, na.z, na.w, nb.x, nb.y, nb.z, nb.w};
	float ss = 0.0f;
#pragma unroll
	for (int i = 0; i < 8; i++)
		ss += x[i] * x[i];
	const float tot = mg_block_sum(ss, sred, tid);
	const float r = 1.0f / sqrtf(tot / (float)MG_H + eps);
	mg_put8(xs, MG_CS_H, k0, make_float4(x[0] * r * w[0], x[1] * r * w[1], x[2] * r * w[2], x[3] * r * w[3]),
	        make_float4(x[4] * r * w[4], x[5] * r * w[5], x[6] * r * w[6], x[7] * r * w[7]));
	gt_sync();
	return r;
}

/* the same from v (its loads and the weights' issued together: one round trip) */
static __device__ float mg_stage_norm(const float *v, const float *nw, float eps, uint8_t *xs, float *sred, int tid)
{
	const float4 a = __ldcg(reinterpret_cast<const float4 *>(v + tid * 8));
	const float4 b = __ldcg(reinterpret_cast<const float4 *>(v + tid * 8 + 4));
	const float4 na = __ldg(reinterpret_cast<const float4 *>(nw + tid * 8));
	const float4 nb = __ldg(reinterpret_cast<const float4 *>(nw + tid * 8 + 4));
	return mg_stage_norm_x(a, b, na, nb, eps, xs, sred, tid);
}

/* n plain values of v (n % 2048 == 0, n <= 4 * 4 * 256: whether a round is in range is the same
 * for all lanes, as mg_put4 needs) staged into xs at column stride cs: every thread's loads issued
 * before the first is used (one L2 round trip, not one a round) */
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
		if (4 * i < n)
			mg_put4(xs, cs, 4 * i, r[u], tid & 31);
	}
}

/* the down projection's x: the 8 slots' SwiGLU outputs (8 x 768 floats: 6 float4 a thread, all in
 * flight together), slot s at xs + s * 2 * MG_CS_F */
static __device__ void mg_stage_act(const float *v, uint8_t *xs, int tid)
{
	float4 r[6];
	/* act's values carry their readiness (mg_put_ready): its count is a hint, a zero not landed yet */
#pragma unroll
	for (int u = 0; u < 6; u++)
		r[u] = mg_ld_ready4(v + 4 * (tid + u * MG_W * 32));
#pragma unroll
	for (int u = 0; u < 6; u++)
		while (!mg_ready4(r[u]))
			r[u] = mg_ld_ready4(v + 4 * (tid + u * MG_W * 32));
#pragma unroll
	for (int u = 0; u < 6; u++) {
		/* a lane pair's 8 values in one slot (MG_FI % 8 == 0) */
		const int i = 4 * (tid + u * MG_W * 32), slot = i / MG_FI, k = i - slot * MG_FI;
		mg_put4(xs + slot * 2 * MG_CS_F, MG_CS_F, k, r[u], tid & 31);
	}
}

/* one 128-K step s of a stage at st (16 code rows of RB bytes, then their scale rows of SB bytes,
 * as in memory: one bulk copy each) into acc. Rows of a 128-byte multiple fall on the same banks,
 * so odd rows take step s ^ 1 where even rows take s: a quarter warp's loads (rows 2p, 2p + 1,
 * chunks t) then cover the 8 chunks of a 128-byte span, conflict-free. The MMA's B columns carry
 * x (hi, lo) for both: columns 0-1 at step s (lanes g < 2), 2-3 at step s ^ 1 (g = 2, 3), so even
 * rows' sums land in columns 0-1 (lane t = 0) and odd rows' in 2-3 (t = 1): mg_rows and mg_tiles
 * read those. c0: the stage's first 32-K chunk in x (a step is 4). Each MMA pair's second goes into
 * acc2 (gm_step2: two chains); the caller adds acc2 to acc once its tile is done. */
template <int RB, int SB, bool SWZ>
static __device__ __forceinline__ void mg_step(float (&acc)[1][4], float (&acc2)[1][4], uint32_t st, int s,
                                               const uint32_t (&xc)[1], int c0, int lane)
{
	const int g = lane >> 2, t4 = lane & 3, sp = s ^ (g & 1);
	const uint32_t cb = st + (uint32_t)(g * RB + sp * 64 + t4 * 16);
	/* SWZ: the scale rows (128 bytes) came by a tensor map with the 128-byte swizzle (chunk XOR
	 * row % 8): the 8 rows' same byte on 8 bank groups. Plain rows 128 bytes apart put them on one
	 * (4-way conflicts: a quarter of the loads' wavefronts). */
	const int sbyte = sp * 8 + t4 * 2;
	const uint32_t sb = st + (uint32_t)(16 * RB + g * SB +
	                                    (SWZ ? ((((sbyte >> 4) ^ (g & 7)) << 4) | (sbyte & 15)) : sbyte));
	const uint4 wa = gm_lds128(cb), wb = gm_lds128(cb + 8 * RB);
	const uint32_t sa = gt_lds16(sb), sc = gt_lds16(sb + 8 * SB);
	gm_step2<GM_NVFP4, 1>(acc, acc2, wa, wb, sa, sc, 0u, xc, c0 + (((g >> 1) == 1 ? s ^ 1 : s) << 2) + t4);
}

/* whether this lane holds its rows' sums (mg_step): t = 0 for even rows, t = 1 for odd */
static __device__ __forceinline__ bool mg_holds(int lane)
{
	return (lane & 3) == ((lane >> 2) & 1);
}

/* nst stages of a tile from the ring into acc (this lane's MMA accumulator), x staged at xs_sa
 * (the lane's column picked here), chunk base cb0 + 64 a stage; steps a stage: nsteps */
static __device__ __forceinline__ void mg_tile(float (&acc)[1][4], gt_pos &pos, uint64_t *full, uint64_t *empty,
                                               uint32_t ring_sa, uint32_t xs_sa, int cs, int nst, int nsteps,
                                               int cb0, int warp, int lane)
{
	const int g = lane >> 2;
	const uint32_t xc[1] = {xs_sa + (uint32_t)((g & 1) * cs)};
	/* the second MMA chain (mg_step). Four chains (a stage's two steps a warp apart as well)
	 * measured the same on llama3-8b as two (session 51) */
	float acc2[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
	for (int c = 0; c < nst; c++) {
		mg_wbar(&full[pos.i], pos.ph, 1, pos.n);
		const uint32_t st = ring_sa + (uint32_t)pos.i * MG_STAGE;
		/* a fixed count of steps a warp, unrolled: the loop from warp to nsteps by MG_W was not,
		 * and the warp's two steps then ran one after the other (f8step_bench: 32 against 40
		 * GB/s an SM with the weights in shared memory) */
#ifndef MG_NOMATH /* a measurement build: the ring and the phases without the tiles' math */
#pragma unroll
		for (int q = 0; q < nsteps / MG_W; q++) {
			const int s = warp + q * MG_W;
			mg_step<MG_CB, MG_SB, true>(acc, acc2, st, s, xc, cb0 + c * 64, lane);
		}
#else
		(void)st, (void)xc;
#endif
		__syncwarp();
		if (lane == 0)
			gt_arrive(&empty[pos.i]);
		gt_next(pos, MG_NS);
	}
#pragma unroll
	for (int e = 0; e < 4; e++)
		acc[0][e] += acc2[0][e];
}

/* the tile's 16 row sums (in order over the warps) into red, after the barrier */
static __device__ __forceinline__ void mg_rows(const float (&acc)[4], float *red, int warp, int lane)
{
	if (mg_holds(lane)) {
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

/* the next of the two row-sum buffers in red (alternated: a tile's epilogue may still read one
 * while the warps write the next tile's sums) */
static __device__ __forceinline__ float *mg_red_next(float *red, int &rpar)
{
	float *rd = red + rpar * MG_W * 16;
	rpar ^= 1;
	return rd;
}

/* a tile of nst stages of 16 steps with x staged at xs_sa (column stride cs): its 16 row sums,
 * in order over the warps, in the returned buffer (mg_rowsum reads them) */
static __device__ __forceinline__ const float *mg_tile_rows(gt_pos &pos, uint64_t *full, uint64_t *empty,
                                                            uint32_t ring_sa, uint32_t xs_sa, int cs, int nst,
                                                            float *red, int &rpar, int warp, int lane)
{
	float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
	mg_tile(acc, pos, full, empty, ring_sa, xs_sa, cs, nst, 16, 0, warp, lane);
	float *rd = mg_red_next(red, rpar);
	mg_rows(acc[0], rd, warp, lane);
	return rd;
}

/* n <= NT tiles of one 16-step stage each (x staged at xs_sa, column stride MG_CS_H), taken in
 * ring order with every warp going on to its next tile's steps without waiting for the others:
 * one barrier for all the tiles, not one a tile. Tile k's row r's partial of warp w lands in
 * red[(w NT + k) 16 + r] (mg_rowsum_k adds them in warp order). */
template <int NT>
static __device__ __forceinline__ void mg_tiles(int n, gt_pos &pos, uint64_t *full, uint64_t *empty, uint32_t ring_sa,
                                                uint32_t xs_sa, float *red, int warp, int lane)
{
#pragma unroll 1
	for (int k = 0; k < n; k++) {
		float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
		mg_tile(acc, pos, full, empty, ring_sa, xs_sa, MG_CS_H, 1, 16, 0, warp, lane);
		if (mg_holds(lane)) { /* the warp's own slots: no barrier until all tiles are done */
			red[(warp * NT + k) * 16 + (lane >> 2)] = acc[0][0] + acc[0][1];
			red[(warp * NT + k) * 16 + 8 + (lane >> 2)] = acc[0][2] + acc[0][3];
		}
	}
	gt_sync();
}

template <int NT, int W = MG_W>
static __device__ __forceinline__ float mg_rowsum_k(const float *red, int k, int r)
{
	float v = 0.0f;
#pragma unroll
	for (int w = 0; w < W; w++)
		v += red[(w * NT + k) * 16 + r];
	return v;
}

#endif

#endif
