/* gemv_tma.cuh: what the bulk-copy decode kernels share (gemv_tma.cu's matmul and moe_tma.cu's
 * one-launch MoE block): their shape, and the mbarrier, bulk-copy and barrier instructions they
 * are built from (compute capability 9.0 and later). */
#ifndef FP4S_GEMV_TMA_CUH
#define FP4S_GEMV_TMA_CUH

#include <cuda.h>
#include <stdint.h>

#define GT_W 8                /* consumer warps */
#define GT_SMAX 16            /* stages at most */
#define GT_SMEM_CAP (220 * 1024) /* the largest budget FP4S_GEMV_TMA_SMEM may ask for */
#define GT_THREADS ((GT_W + 1) * 32)
#define GT_SU 4               /* staging rounds in flight for plain x (FP4S_GEMV_TMA_SU=2: as the
                                 * register kernel) */

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
static __device__ __forceinline__ uint32_t gt_sa(const void *p)
{
	return (uint32_t)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void gt_init(uint64_t *b, unsigned count)
{
	asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(gt_sa(b)), "r"(count) : "memory");
}

static __device__ __forceinline__ void gt_expect(uint64_t *b, unsigned bytes)
{
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(gt_sa(b)), "r"(bytes) : "memory");
}

static __device__ __forceinline__ void gt_arrive(uint64_t *b)
{
	asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(gt_sa(b)) : "memory");
}

/* n arrivals at once (a warp that arrives for others too) */
static __device__ __forceinline__ void gt_arrive_n(uint64_t *b, unsigned n)
{
	asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(gt_sa(b)), "r"(n) : "memory");
}

static __device__ __forceinline__ void gt_wait(uint64_t *b, unsigned parity)
{
	uint32_t ok;
	do {
		asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
		             "selp.u32 %0, 1, 0, p;\n\t}"
		             : "=r"(ok)
		             : "r"(gt_sa(b)), "r"(parity)
		             : "memory");
	} while (!ok);
}

static __device__ __forceinline__ void gt_copy(void *dst, const void *src, unsigned bytes, uint64_t *b)
{
	asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
	                 gt_sa(dst)),
	             "l"(src), "r"(bytes), "r"(gt_sa(b))
	             : "memory");
}

/* the same, the lines marked first to go from L2 (weights are read once a step) */
static __device__ __forceinline__ void gt_copy_ef(void *dst, const void *src, unsigned bytes, uint64_t *b,
                                                  uint64_t pol)
{
	asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, "
	             "[%3], %4;" ::"r"(gt_sa(dst)),
	             "l"(src), "r"(bytes), "r"(gt_sa(b)), "l"(pol)
	             : "memory");
}

/* the 2D tensor form: the box at (x, y) of the map (kernel parameter space) */
static __device__ __forceinline__ void gt_copy_2d(void *dst, const CUtensorMap *map, int x, int y, uint64_t *b,
                                                  uint64_t pol)
{
	asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
	             "[%1, {%2, %3}], [%4], %5;" ::"r"(gt_sa(dst)),
	             "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(gt_sa(b)), "l"(pol)
	             : "memory");
}

/* A position in the ring: stage n (its count), its slot n % S and the parity of that slot's use
 * (n / S) & 1, kept by increments. With the stage count a run-time value, the division was ~30
 * dependent instructions a stage on every warp: about a tenth of the warp samples of
 * llama3-8b's gate|up launch on the H200 (ncu, bench/results/2026-11-28-h200-session29.md). */
struct gt_pos {
	unsigned n; /* stages so far */
	int i;      /* its slot */
	unsigned ph; /* its use's parity (the full barrier's; the empty one's previous use: ph ^ 1) */
};

static __device__ __forceinline__ void gt_next(gt_pos &q, int S)
{
	q.n++;
	if (++q.i == S) {
		q.i = 0;
		q.ph ^= 1u;
	}
}

/* n stages on, 0 <= n <= S (gemv_tma.cu's tile groups: a group takes every G-th stage). One add
 * and one compare as gt_next: a loop of gt_next calls made the consumers' stage loop ~2 KB larger
 * (session 35). */
static __device__ __forceinline__ void gt_next_n(gt_pos &q, int S, int n)
{
	q.n += n;
	q.i += n;
	if (q.i >= S) {
		q.i -= S;
		q.ph ^= 1u;
	}
}

/* Loads from a stage by shared-space address (and gemv_mma.cuh's gm_lds128 for 16 bytes).
 * Through generic pointers into the ring, ptxas rebuilt the ring's window address from the
 * CTA's id (S2R SR_CgaCtaId and three dependent instructions) at every step, on the path to the
 * step's first loads, and recomputed each lane's offsets from the kernel arguments; addresses
 * kept as 32-bit values avoid both. Volatile: they stay after the mbarrier wait that hands the
 * stage over. */
static __device__ __forceinline__ uint32_t gt_lds16(uint32_t sa)
{
	unsigned short v;
	asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(sa));
	return v;
}

static __device__ __forceinline__ uint32_t gt_lds8(uint32_t sa)
{
	unsigned short v;
	asm volatile("ld.shared.u8 %0, [%1];" : "=h"(v) : "r"(sa));
	return v;
}

/* the consumer warps only (the producer never joins) */
static __device__ __forceinline__ void gt_sync(void)
{
	asm volatile("bar.sync 1, %0;" ::"n"(GT_W * 32) : "memory");
}
#endif

/* moe_tma.cu's kernels' shared-memory limits (with gm_tma_attrs, once per device) */
cudaError_t mt_attrs(void);

#endif
