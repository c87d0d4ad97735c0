/* moe_tma.cu: a one-token MoE block in one launch on the bulk-copy decode kernel's machinery
 * (gemv_tma.cu): the layer's RMSNorm and router, the top-k, the selected experts' gate|up with
 * the SwiGLU, their down projection and the combine into the residual.
 *
 * Why. qwen3-30b-a3b streams ~32 MB a layer and spends ~57 us on it, six kernels in a chain;
 * most of that is what each kernel boundary costs (the PDL wait's release, staging x, the slowest
 * block's tail), not bytes (bench/results/2026-11-22-h100-session11.md). The MoE block was three
 * launches (router, gate|up, down): here it is one, and the boundaries inside it are narrower:
 *  - routing. Blocks 0 .. ceil(E / 8) - 1 take a router row a consumer warp (preloaded before
 *    the PDL wait, as moe.cu's norm_route_kernel), normalize the token themselves, and the last
 *    of them to finish (a counter) runs the top-k (route.cuh, the same code as moe.cu) and
 *    raises a flag. Every other block only waits for that flag: no grid has to drain and no
 *    launch to release;
 *  - or, by default where the residual add before is a dense one-token GEMV (gpt-oss's BF16 o
 *    projection), no block waits for another to route (local): that launch's blocks each add
 *    their rows' share of the logits (linear in h but for 1 / rms, which every block here takes
 *    from h itself), in fixed point so that the sums are the same bits in any order
 *    (fp4s_cuda_matmul_add_route), and every block runs the top-k on the sums. gpt-oss-20b:
 *    the launch 46 -> 42 us at depth 4096, the routing phase 6.5 -> 2.3 us, decode +0.5-0.7 %
 *    at 128 tokens and +2.2 % at depth 4096 (bench/results/2026-11-27-h100-session23.md);
 *  - down after gate|up. Each slot's blocks (blockIdx.z) wait for the slot's gate|up blocks
 *    alone (a counter), not for the whole grid, and their producer warps copy the down weights
 *    into the ring as soon as their gate|up stages are handed back, so the first down stages are
 *    in shared memory when the wait ends;
 *  - the gate|up's tiles after each block's first are claimed from a counter a slot (MT_CLAIM),
 *    so the blocks on less loaded SMs take more, and the slot's last gate|up block is done
 *    sooner (gpt-oss-20b's slot wait 5.4 -> 3.9 us a layer). Each claimed tile's bias is copied
 *    by the threads that add it as the tile starts. gpt-oss-20b +1.0-1.1 % against the commit
 *    before (+1.5-2.4 % against FP4S_MOE_CLAIM=0 in the same build), gpt-oss-120b +0.4 % at 128
 *    tokens and +1.2 % at depth 4096 (bench/results/2026-11-27-h100-session26.md). The down
 *    keeps its strided tiles: each block's producer copies up to the ring's depth (4 tiles)
 *    ahead, more than a block's share of the down (2.7), so claims there would be settled before
 *    its phase starts.
 * Blocks wait on other blocks of the same grid, so the grid is never larger than what is
 * resident at once (blocks an SM by the occupancy calculator, times the SMs): every block it
 * waits for is running. The counters are per layer and only grow (see MT_SLOT).
 *
 * Measured on the H100 (bench/results/2026-11-22-h100-session12.md): gpt-oss-20b decode 444 ->
 * 464 tok/s (417 -> 436 at depth 4096), gpt-oss-120b 310 -> 324 (291 -> 305); almost all of it
 * from the down projection inside the launch (routing here or in moe.cu's kernel measured the
 * same, routing here with the down apart 3 % slower); the expert bias copied ahead of the tiles
 * (mt_bias_copy) +1.2-2.2 % more (bench/results/2026-11-23-h100-session19.md, which also lays out
 * the launch's phases). qwen3-30b-a3b lost 5-7 %: its gate|up phase
 * alone here is 5 % slower than gemv_tma.cu's kernel with the same plan, grid and occupancy
 * (not the epoch load, the end-of-phase fences or the ring's depth, each measured); the cause
 * is not found, so NVFP4 experts keep the three launches unless FP4S_MOE_ONE=1.
 *
 * Numerics: the router logits, ids and weights are computed as norm_route_kernel's (its sum of
 * squares summed in another fixed order), the normalized token is written once by block 0 and
 * staged by every block as plain x (so results are bit-repeatable), and the GEMV steps, the
 * epilogues and the combine are gemv_tma.cu's and gemv_mma.cuh's. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/arrive.cuh"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/gemv_cuda.h"
#include "backend/cuda/gemv_mma.cuh"
#include "backend/cuda/gemv_mma.h"
#include "backend/cuda/gemv_tma.cuh"
#include "backend/cuda/moe_cuda.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/route.cuh"
#include "backend/cuda/swiglu.cuh"

#define MT_PRE 12   /* 16-byte router chunks a lane preloads (BF16 rows up to H = 3072) */
#define MT_EMAX 512 /* experts at most (the top-k's logits sit in the ring's bytes) */
#define MT_BPRE 8   /* row tiles a block whose bias is copied ahead of its tiles (mt_bias_copy) */

/* Sync counters (per layer, 64-bit, each on a 128-byte line of its own so that blocks polling
 * one do not queue behind atomics on another). They only grow, so nothing has to be reset, and
 * no block needs a second atomic to learn that all have seen a value:
 *  - slot z's counter gains gridDim.x arrivals a launch, so before a block's own arrival it
 *    holds L * gridDim.x, L = the launches of this layer so far;
 *  - the routing counter gains one a launch (the last router block's), so routing of launch L is
 *    done once it reaches L + 1;
 *  - the router blocks' counter gains nrb a launch.
 * (Word 0 stays moe.cu's norm_route counter, for the launches that route apart.) */
#define MT_RCNT 16               /* 64-bit words: router blocks done */
#define MT_FLAG FP4S_MOE_TMA_EPOCH /* routings done (launches of the layer) */
#define MT_SLOT(z) (48 + 16 * (z)) /* the slot's gate|up blocks done */
/* the slot's gate|up tiles claimed after the first round (gclaim): a launch adds exactly
 * max(tiles, gridDim.x) (its tiles - gridDim.x successful claims, if any, and each block's one
 * that fails), so a launch's claims start at the epoch times that */
#define MT_CLAIM(z) (48 + 16 * FP4S_MOE_TMA_KMAX + 16 * (z))

struct mt_args {
	gm_args gu, dn; /* gate|up (pairact, x = the normalized token) and down (with the combine) */
	const uint8_t *rw; /* router rows [E][H], rfmt */
	const float *rb;   /* router bias or NULL */
	const float *h, *nw;
	float eps;
	int zc, rfmt, E, H, topk, kind, norm;
	float *lg, *x1;
	int32_t *idx;
	float *w;
	unsigned long long *sync;
	int stages, stride; /* ring slots and their bytes */
	int phases;         /* 2: all; 1: up to the gate|up SwiGLU (the down GEMV launched after) */
	int route;          /* 1: route here; 0: idx, w and x1 come from the kernel before */
	int holdb;          /* diagnostics: no down copies before the slot's gate|up is done */
	int ahead;          /* copies in flight at most (mt_ahead; 0: the ring's depth) */
	int warm;           /* the router blocks run the top-k once before the PDL wait (route_warm) */
	int rblock;         /* the top-k by the last router block's every consumer warp (route_block);
	                     * 0: by its warp 0 (route_warp) */
	int spin;           /* ns between polls of a counter */
	int bpre;           /* the bias copied ahead of the tiles (mt_bias_copy; FP4S_MOE_ONE_BPRE=0: off, A/B) */
	int gclaim;         /* the gate|up's tiles after the first round claimed from a counter a slot (MT_CLAIM;
	                     * FP4S_MOE_CLAIM=0: strided, A/B) */
	/* The router's logits from the launch before (fp4s_cuda_matmul_add_route: the o projection's
	 * blocks each add their rows' share, unnormalized, in fixed point): racc[2][E], the half
	 * (epoch & 1). local: every block takes the logits from there and routes itself, so no
	 * block waits on another before its copies (route = 0). Every launch clears the other half,
	 * the one the next launch of this layer reads (racc may be NULL: no shares for this layer). */
	long long *racc;
	int local;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
static __device__ __forceinline__ unsigned long long mt_ld_acquire(const unsigned long long *p)
{
	unsigned long long v;
	asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
	return v;
}

/* adds 1, a release and an acquire at GPU scope (as arrive.cuh's), returning the old value */
static __device__ __forceinline__ unsigned long long mt_arrive(unsigned long long *p)
{
	unsigned long long old;
	asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], 1;" : "=l"(old) : "l"(p) : "memory");
	return old;
}

static __device__ __forceinline__ void mt_spin(const unsigned long long *p, unsigned long long target, int ns)
{
	while (mt_ld_acquire(p) < target)
		__nanosleep(ns);
}

/* One row of a stage's chunk sum (BF16 / F16 / F32 router rows) */
static __device__ __forceinline__ float mt_dot(int rfmt, const uint4 wv, const float *xs)
{
	return rfmt == FP4S_WF_BF16 ? nr_chunk_dot<FP4S_WF_BF16>(wv, xs)
	       : rfmt == FP4S_WF_F16 ? nr_chunk_dot<FP4S_WF_F16>(wv, xs)
	                             : nr_chunk_dot<FP4S_WF_F32>(wv, xs);
}

/* 1 / rms of a row of H from each thread's partial sum of squares: shuffles within the warps,
 * then the GT_W warps' sums through s_red (the router blocks and a locally routing block alike) */
static __device__ __forceinline__ float mt_inv_rms(float ss, float *s_red, int lane, int warp, int H, float eps)
{
	for (int o = 16; o; o >>= 1)
		ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
	if (lane == 0)
		s_red[warp] = ss;
	gt_sync();
	ss = 0.0f;
#pragma unroll
	for (int i = 0; i < GT_W; i++)
		ss += s_red[i];
	return 1.0f / sqrtf(ss / (float)H + eps);
}

/* The producer's copies of one matrix for expert e: tiles first + i * gridDim.x (strided: the
 * down's combine relies on it, first = blockIdx.x there; mt_first for the gate|up), each stage
 * into ring slot n % S once handed back, then a stage marked -1. The ring's position q (n, its slot
 * and parity) runs on across both matrices. (gemv_tma.cu's copies without the tensor maps.) */
template <int F>
static __device__ __forceinline__ void mt_produce(const gm_args &a, int64_t e, uint8_t *ring, int stride, int S,
                                                  uint64_t *full, uint64_t *empty, int *hdr, gt_pos &q,
                                                  uint64_t pol, int lane, int64_t first, unsigned long long *claim,
                                                  unsigned long long base, int ahead)
{
	const int K = a.K, KC = a.tkc, nkc = (K + KC - 1) / KC;
	const size_t rowb = (size_t)K / 2, spr = F == GM_NVFP4 ? K / 16 : K / 32;
	const int64_t tiles = (a.rows + 15) >> 4;
	const uint8_t *data = a.data + e * a.stride_data, *scales = a.scales + e * a.stride_scales;
	int64_t tile = first;
	int kc = 0;
	if (claim && tile >= tiles && lane == 0)
		atomicAdd(claim, 1ull); /* (the block's one failing claim: the launch's count stays exact) */
	for (;; gt_next(q, S)) {
		const int i = q.i;
		if (q.n >= (unsigned)S)
			gt_wait(&empty[i], q.ph ^ 1u);
		if (ahead && q.n >= (unsigned)ahead) {
			/* no more than `ahead` copies in flight: stage n - ahead has landed (its slot's phase
			 * cannot move on before stage n - ahead + S is issued, which comes after this one;
			 * ahead < S, so its slot is i - ahead, in this use or, below 0, the one before) */
			const int m = i - ahead;
			gt_wait(&full[m < 0 ? m + S : m], m < 0 ? q.ph ^ 1u : q.ph);
		}
		if (tile >= tiles) {
			if (lane == 0) {
				hdr[i] = -1;
				gt_arrive(&full[i]);
			}
			gt_next(q, S);
			return;
		}
		const int64_t r0 = tile * 16;
		const int nr = (int)min((int64_t)16, a.rows - r0);
		const int klen = min(KC, K - kc * KC);
		const unsigned cb = (unsigned)klen / 2, sb = F == GM_NVFP4 ? klen / 16 : klen / 32;
		uint8_t *st = ring + (size_t)i * stride;
		const unsigned sbytes = a.tscl ? (unsigned)(nr * spr) : (unsigned)nr * sb;
		if (lane == 0) {
			hdr[i] = (int)tile;
			gt_expect(&full[i], (unsigned)nr * cb + sbytes);
		}
		__syncwarp();
		if (a.tflat) {
			if (lane == 0)
				gt_copy_ef(st, data + (size_t)r0 * rowb, (unsigned)nr * cb, &full[i], pol);
			else if (lane == 1)
				gt_copy_ef(st + 16 * a.trs, scales + (size_t)r0 * spr, sbytes, &full[i], pol);
		} else if (lane < nr) {
			gt_copy_ef(st + lane * a.trs, data + (size_t)(r0 + lane) * rowb + (size_t)kc * (KC / 2), cb, &full[i],
			           pol);
		} else if (a.tscl) {
			if (lane == 16)
				gt_copy_ef(st + 16 * a.trs, scales + (size_t)r0 * spr, sbytes, &full[i], pol);
		} else if (lane >= 16 && lane - 16 < nr) {
			gt_copy_ef(st + 16 * a.trs + (lane - 16) * a.tss,
			           scales + (size_t)(r0 + lane - 16) * spr + (size_t)kc * (F == GM_NVFP4 ? KC / 16 : KC / 32),
			           sb, &full[i], pol);
		}
		if (++kc < nkc)
			continue;
		kc = 0;
		if (claim) {
			unsigned long long c = 0;
			if (lane == 0)
				c = atomicAdd(claim, 1ull);
			tile = (int64_t)gridDim.x + (int64_t)(__shfl_sync(0xFFFFFFFFu, c, 0) - base);
		} else {
			tile += gridDim.x;
		}
	}
}

/* one float from global into shared memory, in flight until mt_bias_wait */
static __device__ __forceinline__ void mt_cp4(float *dst, const float *src)
{
	asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src)
	             : "memory");
}

/* The bias of the block's first MT_BPRE row tiles (first + j * gridDim.x, the producer's
 * order) copied into sb, a value a thread of the first MT_BPRE * 16, by cp.async (no register held
 * through the loops: this kernel is at its 96), early enough that the copy's latency passes under
 * other waits; mt_consume waits for them before the barrier that precedes the first read. Read in each tile's
 * epilogue instead, the bias was an L2 round trip on warp 0 a tile; the down projection's tiles
 * are already in the ring when its phase starts, so there those trips were the phase's critical
 * path (gpt-oss: 3 tiles a block, ~7.5 us from its x staged to the combine done,
 * bench/results/2026-11-23-h100-session19.md). */
static __device__ __forceinline__ void mt_bias_copy(float *sb, const float *bias, int64_t rows, int64_t first)
{
	if (!bias || threadIdx.x >= MT_BPRE * 16)
		return;
	const int64_t row = (first + (int64_t)(threadIdx.x >> 4) * gridDim.x) * 16 + (threadIdx.x & 15);
	if (row < rows) /* rows past the matrix are never read */
		mt_cp4(sb + threadIdx.x, bias + row);
}

/* The gate|up's first tile of a block. The block scheduler puts blocks a few apart in launch
 * order on one SM (1 apart most often, up to ~6), and with tiles strided from blockIdx.x such
 * neighbours both take an extra tile of the last round or neither: gpt-oss-20b's 360 tiles a slot
 * over 66 blocks left 39 % of its blocks on SMs of 12 tiles (dev/moe_sm.py). Even blocks take
 * 0 .. h - 1 and odd ones h .., h = half the blocks rounded up, so that blocks an odd distance
 * apart hold at most one of the last round's tiles while they are at most h (12-tile SMs 18 %,
 * +0.5 %; the claims after the first tile, gclaim, then balance the rest). (The down keeps
 * blockIdx.x: the combine needs the slots' blocks of one blockIdx.x on the same rows.) */
static __device__ __forceinline__ int64_t mt_first(void)
{
	const unsigned h = (gridDim.x + 1) >> 1;
	return blockIdx.x & 1 ? h + (blockIdx.x >> 1) : blockIdx.x >> 1;
}

static __device__ __forceinline__ void mt_bias_wait(void) { asm volatile("cp.async.wait_all;" ::: "memory"); }

/* The consumers' side of one matrix, one token (gemv_tma.cu's loop at M = 1): steps from the ring
 * into acc, each tile's warps' partials summed in order by 16 threads, then y[row] = ldexp(sum,
 * pexp) * post (+ bias: from sb for the block's first MT_BPRE tiles where it was copied ahead,
 * NULL: none was; those copies are waited for at the first tile's end; or, with tb, each tile's
 * copied by its epilogue's threads into tb[parity] as the tile starts, for claimed tiles), or
 * with pairact the SwiGLU of (gate, up) rows into y[row / 2]. Ends on the stage marked -1,
 * handing that slot back too (the producer reuses it). */
template <int F>
static __device__ __forceinline__ void mt_consume(const gm_args &a, const uint8_t *ring, int stride, int S,
                                                  uint64_t *full, uint64_t *empty, const int *hdr, gt_pos &q,
                                                  const uint8_t *xs, int cs, float *red, float *yout,
                                                  const float *bias, const float *sb, float *tb, float post,
                                                  int warp, int lane)
{
	const int K = a.K, KC = a.tkc, nkc = (K + KC - 1) / KC, nsteps = (K + 127) >> 7, sps = a.tsps;
	const int g = lane >> 2, t = lane & 3;
	const uint8_t *xcol[1];
	gm_xcols<1>(xcol, xs, cs, 1, g);
	/* the codes and x by shared-space address (gm_lds128; gemv_tma.cuh's gt_lds16 says why). The
	 * scales stay generic: by address too, this kernel spills at its 96 registers (ptxas). With
	 * this, gpt-oss-20b decode +0.1-0.8 % (+0.8-1.9 % at depth 4096) on the H200,
	 * bench/results/2026-11-28-h200-session30.md. */
	const uint32_t xsa[1] = {gt_sa(xcol[0])};
	const uint32_t wa = gt_sa(ring) + (uint32_t)(g * a.trs + t * 16);
	float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
	int kc = 0, tile_it = 0;
	for (;; gt_next(q, S)) {
		const int i = q.i;
		gt_wait(&full[i], q.ph);
		const int tile = hdr[i];
		if (tile < 0) {
			__syncwarp();
			if (lane == 0)
				gt_arrive(&empty[i]);
			gt_next(q, S);
			return;
		}
		const uint8_t *st = ring + (size_t)i * stride, *sc = st + 16 * a.trs;
		if (tb && bias && kc == 0 && threadIdx.x < 16 && (int64_t)tile * 16 + threadIdx.x < a.rows)
			mt_cp4(tb + (tile_it & 1) * 16 + threadIdx.x, bias + (int64_t)tile * 16 + threadIdx.x);
		for (int j = 0; j < sps; j++) {
			const int u = warp * sps + j, s = kc * GT_W * sps + u;
			if (s >= nsteps)
				break;
			const uint32_t pw = wa + (uint32_t)i * (uint32_t)stride + u * 64;
			const uint4 wqa = gm_lds128(pw), wqb = gm_lds128(pw + 8 * a.trs);
			const int ch = a.tscl ? 4 * s + t : 4 * u + t;
			uint32_t cai, cbi;
			if (4 * s + t >= (K >> 5)) {
				cai = cbi = F == GM_NVFP4 ? 0u : 0x100u;
			} else if (F == GM_NVFP4) {
				cai = *reinterpret_cast<const uint16_t *>(sc + g * a.tss + ch * 2);
				cbi = *reinterpret_cast<const uint16_t *>(sc + (g + 8) * a.tss + ch * 2);
			} else {
				cai = sc[g * a.tss + ch];
				cbi = sc[(g + 8) * a.tss + ch];
			}
			gm_step<F, 1>(acc, wqa, wqb, cai, cbi, a.ec, xsa, 4 * s + t);
		}
		__syncwarp();
		if (lane == 0)
			gt_arrive(&empty[i]);
		if (++kc < nkc)
			continue;
		kc = 0;
		float *rp = red + (size_t)(tile_it & 1) * GT_W * 16;
		tile_it++;
		if (t == 0) {
			rp[warp * 16 + g] = acc[0][0] + acc[0][1];
			rp[warp * 16 + g + 8] = acc[0][2] + acc[0][3];
		}
		acc[0][0] = acc[0][1] = acc[0][2] = acc[0][3] = 0.0f;
		if (tile_it == 1 || tb)
			mt_bias_wait(); /* the bias copies (mt_bias_copy's, or this tile's into tb), read after the barrier */
		gt_sync();
		const int r = threadIdx.x & 15;
		const int64_t row = (int64_t)tile * 16 + r;
		const bool live = threadIdx.x < 16 && row < a.rows;
		float out = 0.0f;
		if (live) {
			float v = 0.0f;
			for (int w = 0; w < GT_W; w++)
				v += rp[w * 16 + r];
			out = ldexpf(v, a.pexp) * post;
			if (tb && bias) /* this thread's own copy (waited for above) */
				out += tb[((tile_it - 1) & 1) * 16 + r];
			else if (bias) /* tile_it - 1 = j: the producer's strided order; its bias copied ahead (sb) */
				out += sb && tile_it <= MT_BPRE ? sb[(tile_it - 1) * 16 + r] : bias[row];
		}
		if (a.pairact) {
			const float up = __shfl_down_sync(0xFFFFFFFFu, out, 1);
			if (live && !(r & 1))
				yout[row >> 1] = a.pairact == 1 ? swiglu_oai(out, up, a.alpha, a.limit) : silu_mul(out, up);
		} else if (live) {
			yout[row] = out;
		}
	}
}
#endif

template <int F>
static __global__ void __launch_bounds__(GT_THREADS, 2) moe_tma_kernel(const __grid_constant__ mt_args p)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	extern __shared__ __align__(128) uint8_t sm[];
	__shared__ __align__(8) uint64_t full[GT_SMAX], empty[GT_SMAX], bgo, rgo;
	__shared__ int hdr[GT_SMAX];
	__shared__ float s_red[GT_W];
	__shared__ int32_t sel[64];
	__shared__ float selv[64];
	__shared__ int s_last;
	__shared__ float s_bias[MT_BPRE * 16]; /* mt_bias_copy */
	__shared__ float s_tb[2 * 16];         /* the claimed gate|up tiles' bias (mt_consume's tb) */
	const int S = p.stages, stride = p.stride;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int slot = blockIdx.z, bl = blockIdx.z * gridDim.x + blockIdx.x;
	const int nrb = (p.E + GT_W - 1) / GT_W; /* router blocks: a row a consumer warp */
	pdl_trigger();
	TL_SCOPE(TL_MOE_TMA, p.gu.data);
	if (threadIdx.x < S) {
		gt_init(&full[threadIdx.x], 1);
		gt_init(&empty[threadIdx.x], GT_W);
		if (threadIdx.x == 0) {
			gt_init(&bgo, 1);
			gt_init(&rgo, 1);
		}
	}
	asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
	__syncthreads();

	/* this layer's launches so far: slot z's counter before any block of this launch arrives on
	 * it (read before the wait: the kernels it waits for do not touch it) */
	unsigned long long epoch0 = 0; /* the producer's lane 0 and the consumers' thread 0 (local: all) */
	if (threadIdx.x == 0 || threadIdx.x == GT_W * 32 || p.local)
		epoch0 = __ldcg(&p.sync[MT_SLOT(slot)]) / gridDim.x;
	if (warp == GT_W) {
		/* the producer: nothing to copy until the routing names this slot's expert */
		pdl_wait();
		int64_t e = 0;
		if (lane == 0) {
			if (p.local) { /* this block's own routing */
				gt_wait(&rgo, 0);
				e = sel[slot];
			} else {
				if (p.route)
					mt_spin(&p.sync[MT_FLAG], epoch0 + 1, p.spin);
				e = __ldcg(p.idx + slot);
			}
		}
		e = __shfl_sync(0xFFFFFFFFu, e, 0);
		uint64_t pol;
		asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
		gt_pos rq = {0, 0, 0};
		const unsigned long long inc = (unsigned long long)max((p.gu.rows + 15) / 16, (int64_t)gridDim.x);
		const unsigned long long base = __shfl_sync(0xFFFFFFFFu, epoch0, 0) * inc; /* (lane 0's epoch) */
		mt_produce<F>(p.gu, e, sm, stride, S, full, empty, hdr, rq, pol, lane, mt_first(),
		              p.gclaim ? &p.sync[MT_CLAIM(slot)] : NULL, base, p.ahead);
		if (p.phases == 2) {
			if (p.holdb)
				gt_wait(&bgo, 0);
			mt_produce<F>(p.dn, e, sm, stride, S, full, empty, hdr, rq, pol, lane, blockIdx.x, NULL, 0, p.ahead);
		}
		return;
	}
	/* thread 0's epoch, kept in shared memory past the gate|up staging (not in a register
	 * through the main loops, and not stored before the wait: that would stall thread 0, and
	 * with it the block's staging, on the load) */
	__shared__ unsigned long long s_epoch;

	/* the router: block bl's warps take rows bl * 8 + warp, preloaded before the wait */
	const bool router = p.route && bl < nrb;
	const int32_t r = bl * GT_W + warp;
	const int epc = p.rfmt == FP4S_WF_F32 ? 4 : 8;
	const int32_t nq = p.H / epc;
	const uint4 *wr = reinterpret_cast<const uint4 *>(p.rw) + (size_t)min(r, p.E - 1) * nq;
	uint4 pre[MT_PRE];
	if (router) {
#pragma unroll
		for (int i = 0; i < MT_PRE; i++)
			pre[i] = lane + 32 * i < nq ? __ldg(wr + lane + 32 * i) : make_uint4(0, 0, 0, 0);
		if (p.warm && p.rblock) /* the top-k's code warm (route.cuh) */
			route_warm_block<GT_W * 32>(p.topk, p.kind, p.norm, sel, selv);
		else if (p.warm && warp == 0)
			route_warm(p.topk, p.kind, p.norm, sel, selv);
	}
	if (p.local && p.warm) /* every block runs the top-k (route.cuh): its code warm */
		route_warm_block<GT_W * 32>(p.topk, p.kind, p.norm, sel, selv);
	pdl_wait(); /* h (or the routing) belongs to the kernels before this one */
	TL_MARK(1);
	if (threadIdx.x == 0)
		s_epoch = epoch0; /* thread 0 reads it back itself (its load issued long before) */
	if (router) {
		/* h * norm weight into the ring's bytes (free: this block's producer copies nothing
		 * before the routing is done, which waits for this block); all of a thread's loads in
		 * flight at once (H <= 4096, checked by the host), the sum of squares summed in a fixed
		 * order */
		float *hs = reinterpret_cast<float *>(sm);
		const float c = p.zc ? 1.0f : 0.0f;
		float4 v[4], g[4];
#pragma unroll
		for (int u = 0; u < 4; u++) {
			const int i = 4 * (threadIdx.x + u * GT_W * 32);
			if (i < p.H) {
				v[u] = *reinterpret_cast<const float4 *>(p.h + i);
				g[u] = __ldg(reinterpret_cast<const float4 *>(p.nw + i));
			}
		}
		float ss = 0.0f;
#pragma unroll
		for (int u = 0; u < 4; u++) {
			const int i = 4 * (threadIdx.x + u * GT_W * 32);
			if (i < p.H) {
				ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
				*reinterpret_cast<float4 *>(hs + i) = make_float4(v[u].x * (c + g[u].x), v[u].y * (c + g[u].y),
				                                                  v[u].z * (c + g[u].z), v[u].w * (c + g[u].w));
			}
		}
		const float inv = mt_inv_rms(ss, s_red, lane, warp, p.H, p.eps);
		if (bl == 0) /* the normalized token every block stages */
			for (int i = threadIdx.x; i < p.H; i += GT_W * 32)
				p.x1[i] = hs[i] * inv;
		float acc = 0.0f;
#pragma unroll
		for (int i = 0; i < MT_PRE; i++)
			if (lane + 32 * i < nq)
				acc += mt_dot(p.rfmt, pre[i], hs + (size_t)(lane + 32 * i) * epc);
		for (int32_t q = lane + 32 * MT_PRE; q < nq; q += 32)
			acc += mt_dot(p.rfmt, __ldg(wr + q), hs + (size_t)q * epc);
		for (int o = 16; o; o >>= 1)
			acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);
		if (lane == 0 && r < p.E)
			p.lg[r] = acc * inv + (p.rb ? p.rb[r] : 0.0f);
		gt_sync(); /* the block's logits (and x1) written; every warp done with hs */
		if (threadIdx.x == 0)
			s_last = mt_arrive(&p.sync[MT_RCNT]) % (unsigned)nrb == (unsigned)nrb - 1;
		gt_sync();
		if (s_last && p.rblock) {
			/* the last router block routes, every consumer warp (the ring's bytes again: logits,
			 * then keys; route.cuh) */
			float *pr = reinterpret_cast<float *>(sm);
			for (int32_t e = threadIdx.x; e < p.E; e += GT_W * 32)
				pr[e] = __ldcg(p.lg + e);
			gt_sync();
			TL_MARK(4);
			route_block<GT_W * 32>(pr, reinterpret_cast<uint32_t *>(pr + ROUTE_KEYS_AT(p.E)), p.E, p.topk, p.kind,
			                       p.norm, sel, selv, p.idx, p.w, TL_REC());
			TL_MARK(5);
			gt_sync(); /* idx and w are written by K threads: ordered before thread 0's release */
			if (threadIdx.x == 0) /* releases idx, w (and, through the router counter, x1) */
				asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(&p.sync[MT_FLAG]) : "memory");
		} else if (s_last && warp == 0) {
			/* the last router block routes (the ring's bytes again: logits, then taken flags) */
			float *pr = reinterpret_cast<float *>(sm);
			uint8_t *taken = sm + (size_t)p.E * 4;
			for (int32_t e = lane; e < p.E; e += 32) {
				pr[e] = __ldcg(p.lg + e);
				taken[e] = 0;
			}
			route_warp(pr, taken, p.E, p.topk, p.kind, p.norm, sel, selv, p.idx, p.w);
			__syncwarp();
			if (lane == 0) /* releases idx, w (and, through the router counter, x1) */
				asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(&p.sync[MT_FLAG]) : "memory");
		}
	}
	__shared__ float s_inv;
	if (p.local) {
		/* the logits' shares and h, all loads in flight at once; the sum of squares in the
		 * router blocks' order (below), then the top-k into sel / selv (and idx / w, the same
		 * values from every block), in the ring's bytes: the producer copies nothing before
		 * rgo */
		float *pr = reinterpret_cast<float *>(sm);
		const long long *acc = p.racc + (size_t)(epoch0 & 1) * p.E;
		long long q = 0;
		if ((int)threadIdx.x < p.E)
			q = __ldcg(acc + threadIdx.x);
		float4 v[4];
#pragma unroll
		for (int u = 0; u < 4; u++) {
			const int i = 4 * (threadIdx.x + u * GT_W * 32);
			if (i < p.H)
				v[u] = __ldcg(reinterpret_cast<const float4 *>(p.h + i));
		}
		float ss = 0.0f;
#pragma unroll
		for (int u = 0; u < 4; u++)
			if (4 * (threadIdx.x + u * GT_W * 32) < p.H)
				ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
		const float inv = mt_inv_rms(ss, s_red, lane, warp, p.H, p.eps);
		if ((int)threadIdx.x < p.E)
			pr[threadIdx.x] = __ll2float_rn(q) * 0x1p-32f * inv + (p.rb ? __ldg(p.rb + threadIdx.x) : 0.0f);
		if (threadIdx.x == 0)
			s_inv = inv;
		gt_sync();
		route_block<GT_W * 32>(pr, reinterpret_cast<uint32_t *>(pr + ROUTE_KEYS_AT(p.E)), p.E, p.topk, p.kind, p.norm,
		                       sel, selv, p.idx, p.w, TL_REC());
		/* sel is final and pr / keys read (route_block's last barrier): the ring is the producer's */
		if (threadIdx.x == 0)
			gt_arrive(&rgo);
	}
	if (p.route) {
		if (threadIdx.x == 0)
			mt_spin(&p.sync[MT_FLAG], s_epoch + 1, p.spin);
		gt_sync();
	} else if (bl == 0 && threadIdx.x == 0) { /* the routings' count stays the launches' */
		asm volatile("red.relaxed.gpu.global.add.u64 [%0], 1;" ::"l"(&p.sync[MT_FLAG]) : "memory");
	}
	/* the shares' other half, for this layer's next launch (the last reads of it were the launch
	 * before this one's), by thread 0 (its s_epoch), here: long before its next release (the
	 * slot's), whose fence would otherwise wait for these stores */
	if (bl == 0 && threadIdx.x == 0 && p.racc)
		for (int i = 0; i < p.E; i++)
			__stcg(p.racc + (size_t)((s_epoch + 1) & 1) * p.E + i, 0ll);
	/* phase marks (diagnostic build; dev/moe_marks.py), in the blocks that do not route (the last
	 * router block's marks 4-7 are its top-k's): 2 routed, 5 gate|up done, 6 the slot's gate|up all
	 * done, 7 down staged, 4 down tiles done */
	if (!router)
		TL_MARK(2);
	const int64_t e = p.local ? (int64_t)sel[slot] : __ldcg(p.idx + slot); /* in flight with the staging's loads */
	uint8_t *xs = sm + (size_t)S * stride;
	float s_ss[1];
	gt_pos rq = {0, 0, 0};

	/* gate|up: the normalized token as plain x (written in this launch: loads from L2) */
	{
		const gm_args &a = p.gu;
		const int nst = (a.K + 127) >> 7, cs = gm_col_stride(nst * 4);
		if (p.local) /* h times the norm weight; 1 / rms in the epilogue (post) */
			gm_stage<GT_W * 32, 2, false, true>(a, xs, cs, 1, 0, a.K, nst * 4, p.h, 0, s_ss, false, threadIdx.x);
		else
			gm_stage<GT_W * 32, 4, true, true>(a, xs, cs, 1, 0, a.K, nst * 4, p.x1, 0, s_ss, false, threadIdx.x);
		const float *bias = a.bias ? a.bias + e * a.rows : NULL;
		if (p.bpre && !p.gclaim)
			mt_bias_copy(s_bias, bias, a.rows, mt_first()); /* (e is known here: loaded with the staging) */
		gt_sync();
		const float post0 = a.ws2e ? a.post * __ldg(a.ws2e + e) : a.post;
		const float post = p.local ? post0 * s_inv : post0;
		mt_consume<F>(a, sm, stride, S, full, empty, hdr, rq, xs, cs, reinterpret_cast<float *>(xs + 2 * cs),
		              a.y + (size_t)slot * (a.rows / 2), bias, p.bpre && !p.gclaim ? s_bias : NULL,
		              p.gclaim ? s_tb : NULL, post, warp, lane);
		if (!router)
			TL_MARK(5);
	}
	/* the slot's gate|up blocks all done (their SwiGLU rows are the down projection's x) */
	gt_sync();
	if (threadIdx.x == 0) {
		/* no return wanted: the target comes from the epoch (also with the down apart: the
		 * count is the epoch) */
		if (p.phases == 2) {
			asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(&p.sync[MT_SLOT(slot)]) : "memory");
			mt_spin(&p.sync[MT_SLOT(slot)], (s_epoch + 1) * gridDim.x, p.spin);
		} else { /* nothing published: no release (its fence would hold the block's exit) */
			asm volatile("red.relaxed.gpu.global.add.u64 [%0], 1;" ::"l"(&p.sync[MT_SLOT(slot)]) : "memory");
		}
		if (p.holdb)
			gt_arrive(&bgo);
	}
	if (p.phases == 1)
		return;
	gt_sync();
	if (!router)
		TL_MARK(6);
	{
		const gm_args &a = p.dn;
		const int nst = (a.K + 127) >> 7, cs = gm_col_stride(nst * 4);
		const float *xin = a.x + (size_t)slot * a.x_stride;
		const float *dbias = a.bias ? a.bias + e * a.rows : NULL;
		/* (every thread is past the gate|up epilogues that read s_bias) */
		if (p.bpre)
			mt_bias_copy(s_bias, dbias, a.rows, blockIdx.x); /* in flight with the staging's loads */
		gm_stage<GT_W * 32, 4, true, true>(a, xs, cs, 1, 0, a.K, nst * 4, xin, 0, s_ss, false, threadIdx.x);
		gt_sync();
		if (!router)
			TL_MARK(7);
		const float post = a.ws2e ? a.post * __ldg(a.ws2e + e) : a.post;
		mt_consume<F>(a, sm, stride, S, full, empty, hdr, rq, xs, cs, reinterpret_cast<float *>(xs + 2 * cs),
		              a.y + (size_t)slot * a.rows, dbias, p.bpre ? s_bias : NULL, NULL, post, warp, lane);
		if (!router)
			TL_MARK(4);
	}
	/* the combine, as gemv_tma.cu's: the last of the slots' blocks with this blockIdx.x */
	gt_sync();
	if (threadIdx.x == 0)
		s_last = fp4s_arrive(&p.dn.cnt[blockIdx.x]) == gridDim.z - 1;
	gt_sync();
	if (s_last)
		gm_combine_rows<GT_W * 32>(p.dn);
#endif
}

cudaError_t mt_attrs(void)
{
	cudaError_t e = cudaFuncSetAttribute(moe_tma_kernel<GM_NVFP4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
	                                     GT_SMEM_CAP);
	if (e == cudaSuccess)
		e = cudaFuncSetAttribute(moe_tma_kernel<GM_MXFP4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
		                         GT_SMEM_CAP);
	if (e == cudaSuccess)
		e = fp4s_env_carveout((const void *)moe_tma_kernel<GM_NVFP4>, "FP4S_MOE_CARVEOUT");
	if (e == cudaSuccess)
		e = fp4s_env_carveout((const void *)moe_tma_kernel<GM_MXFP4>, "FP4S_MOE_CARVEOUT");
	return e;
}

static int mt_forced = -1;
static unsigned long long mt_launches, mt_local_launches;

extern "C" void fp4s_cuda_set_moe_tma(int on) { mt_forced = on >= 0 && on <= 4 ? on : -1; }
extern "C" unsigned long long fp4s_cuda_moe_tma_launches(void) { return mt_launches; }
extern "C" unsigned long long fp4s_cuda_moe_tma_local_launches(void) { return mt_local_launches; }

/* FP4S_MOE_ONE: unset: all in one launch for MXFP4 experts, off for NVFP4 ones (measured on the
 * H100, bench/results/2026-11-22-h100-session12.md: gpt-oss-20b +4-5 %; qwen3-30b-a3b -5 to
 * -7 %, where this kernel's gate|up phase alone is 5 % slower than gemv_tma.cu's, a cause not
 * found yet); 0 off; 1 on for both; 2 the down GEMV a launch of its own, 3 the routing a launch
 * of its own (moe.cu's norm_route), 4 both (A/B). FP4S_MOE_ONE_SPIN: ns between polls (default
 * 64); FP4S_MOE_ONE_HOLDB=1: no down copies before the slot's gate|up is done;
 * FP4S_MOE_ONE_DEBUG: the launch's shape on stderr, once (diagnostics). */
static int mt_mode(int nv, int *spin, int *holdb)
{
	static int env = -2, ns = 64, hb;
	if (env == -2) {
		const char *e = getenv("FP4S_MOE_ONE");
		env = e && *e >= '0' && *e <= '4' && !e[1] ? *e - '0' : -1;
		e = getenv("FP4S_MOE_ONE_SPIN");
		ns = e && atoi(e) >= 0 && atoi(e) <= 10000 ? atoi(e) : 64;
		e = getenv("FP4S_MOE_ONE_HOLDB");
		hb = e && atoi(e) == 1;
	}
	*spin = ns;
	*holdb = hb;
	return mt_forced >= 0 ? mt_forced : env >= 0 ? env : !nv;
}

/* The ring's depth: FP4S_MOE_STAGES (2-16; 0: as many stages as the shared-memory budget holds,
 * 4 for gpt-oss's 24.5 KB stages, the depth before session 28). Default 2.
 *
 * Why (bench/results/2026-11-27-h100-session28.md). ncu's warp samples of the launch with 4
 * stages showed the gate|up's step loop taking 42 % more samples a step than the down's loop of
 * the same code shape, with instruction-fetch stalls (no_inst) at every 256-byte boundary of the
 * loop: 31 % of its samples against 5 %. With 2 stages a block takes 62 instead of 111 KB of
 * shared memory (the SM runs it at a 135 KB shared / ~120 KB L1 split instead of 233 / ~20):
 * gpt-oss-20b decode +4.6-5.2 % at 128 tokens and +4.9-6.9 % at depth 4096, gpt-oss-120b +6.0 %
 * and +7.5 %, qwen3-30b-a3b's FP4S_MOE_ONE=1 +5.6 %. Not from fewer copies in flight (4 stages
 * with 2 in flight, FP4S_MOE_AHEAD=2, measured as 4 stages), and only ~1 point of it from this
 * launch's own L1 (2 stages run at the 233 KB split, FP4S_MOE_CARVEOUT=100: -0.7 to -1.2 %).
 * With 2 stages the gate|up's loop costs what the down's does, its no_inst down to 7 %; what ties
 * those stalls to the ring's depth is not known yet. The dense kernels (gemv_tma.cu) lost with smaller rings
 * (llama3-8b -10 % with its budget at 64 KB), so their budget stays. */
static int mt_depth(void)
{
	static int d = -1;
	if (d < 0) {
		const char *e = getenv("FP4S_MOE_STAGES");
		d = e && (atoi(e) == 0 || (atoi(e) >= 2 && atoi(e) <= GT_SMAX)) ? atoi(e) : 2;
	}
	return d;
}

/* FP4S_MOE_AHEAD (1-15; 0: the ring's depth; default 1): the producer copies at most that many
 * stages ahead of the last one landed, whatever the ring's depth. One copy in flight a block is
 * 6.5 MB for gpt-oss-20b's 264 blocks, about what the DRAM's latency needs at full rate; with 2
 * stages it measured +0.6-2.6 % at 128 tokens and +0.7-1.1 % at depth 4096 against both in flight
 * (two rounds, bench/results/2026-11-27-h100-session28.md). */
static int mt_ahead(void)
{
	static int d = -1;
	if (d < 0) {
		const char *e = getenv("FP4S_MOE_AHEAD");
		d = e && *e >= '0' && *e <= '9' && atoi(e) < GT_SMAX ? atoi(e) : 1;
	}
	return d;
}

/* the staged activations and tile sums of a K-column matmul (as gm_tma_plan) */
static size_t mt_xs(int64_t K)
{
	return (size_t)2 * gm_col_stride((int)((K + 127) / 128 * 4)) + (size_t)2 * GT_W * 16 * sizeof(float);
}

extern "C" int fp4s_cuda_moe_tma(const struct fp4s_stacked *gu, const struct fp4s_stacked *dn, int form,
                                 float alpha, float limit, const struct fp4s_mat *router, int32_t K, int kind,
                                 int norm, float *h, const float *nw, float eps, int zero_centred, float *lg,
                                 unsigned *sync, int32_t *idx, float *w, float *x1, float *a1, float *o1,
                                 long long *racc, int local, int dry, cudaStream_t s, struct fp4s_error *err)
{
	const int64_t E = router->rows, H = router->cols, I = dn->cols;
	const int esz = router->fmt == FP4S_WF_F32 ? 4 : 2;
	int spin, holdb;
	const int mode = mt_mode(gu->fmt == FP4S_WF_NVFP4, &spin, &holdb);
	if (!mode || (local && (mode != 1 || !racc || E > FP4S_GEMV_ROUTE_EMAX)) || (form != 1 && form != 2) || gu->fmt != dn->fmt ||
	    (router->fmt != FP4S_WF_BF16 && router->fmt != FP4S_WF_F16 && router->fmt != FP4S_WF_F32) || K < 1 ||
	    K > FP4S_MOE_TMA_KMAX || K > E || E > MT_EMAX || H % (16 / esz) || H % 4 || H > 16 * GT_W * 32 ||
	    gu->cols != H ||
	    dn->rows != H || gu->rows != 2 * I || ((uintptr_t)router->data & 15) || ((uintptr_t)h & 15) ||
	    ((uintptr_t)nw & 15))
		return FP4S_EUNSUPPORTED;
	gm_args A, B;
	int sms = 0;
	int rc = gm_expert_args(gu, idx, K, x1, K, H, 0, alpha, limit, NULL, 0.0f, 0, NULL, NULL, a1, form, s, &A, &sms,
	                        err);
	if (!rc)
		rc = gm_expert_args(dn, idx, K, a1, 1, I, 0, 0.0f, 0.0f, NULL, 0.0f, 0, w, h, o1, 0, s, &B, &sms, err);
	if (rc)
		return rc;
	if (!A.stages || !B.stages || A.ttensor || B.ttensor)
		return FP4S_EUNSUPPORTED;
	const int nv = gu->fmt == FP4S_WF_NVFP4;
	mt_args p = {};
	p.gu = A, p.dn = B;
	p.stride = A.tstage > B.tstage ? A.tstage : B.tstage;
	const size_t xs = mt_xs(H) > mt_xs(I) ? mt_xs(H) : mt_xs(I), budget = gm_tma_budget();
	if (xs >= budget)
		return FP4S_EUNSUPPORTED;
	size_t st = (budget - xs) / (size_t)p.stride;
	st = st > GT_SMAX ? GT_SMAX : st;
	/* at least two stages, and room in the ring for h (the router blocks) and the logits; then
	 * no more than mt_depth asks, where that still leaves this room */
	const size_t sb = (size_t)p.stride, room = (size_t)H * 4 > ROUTE_SCRATCH(E) ? (size_t)H * 4 : ROUTE_SCRATCH(E);
	const size_t need = (room + sb - 1) / sb > 2 ? (room + sb - 1) / sb : 2, want = (size_t)mt_depth();
	if (st < need)
		return FP4S_EUNSUPPORTED;
	if (want && st > want)
		st = want > need ? want : need;
	p.stages = (int)st;
	const size_t smem = st * (size_t)p.stride + xs;
	p.rw = (const uint8_t *)router->data, p.rb = router->bias, p.h = h, p.nw = nw, p.eps = eps;
	p.zc = zero_centred, p.rfmt = router->fmt, p.E = (int)E, p.H = (int)H, p.topk = K, p.kind = kind;
	p.norm = norm, p.lg = lg, p.x1 = x1, p.idx = idx, p.w = w;
	p.sync = reinterpret_cast<unsigned long long *>(sync);
	p.phases = mode == 2 || mode == 4 ? 1 : 2, p.spin = spin, p.route = !local && mode != 3 && mode != 4;
	p.racc = racc, p.local = local;
	if (local) { /* the gate|up stages h times the norm weight (gm_stage), 1 / rms in its epilogue */
		p.gu.norm_w = nw;
		p.gu.zero_centred = zero_centred;
	}
	p.holdb = holdb;
	p.ahead = mt_ahead() < (int)st ? mt_ahead() : 0;
	/* FP4S_ROUTE_WARM=0: no warm-up of the top-k's code; FP4S_MOE_ONE_RBLOCK=0: the top-k by one
	 * warp, route_warp (A/B: gpt-oss-20b +0-1.3 % with route_block, session 16) */
	static int warm_off = -1, rblock_off = -1;
	p.warm = !fp4s_env_off("FP4S_ROUTE_WARM", &warm_off);
	p.rblock = !fp4s_env_off("FP4S_MOE_ONE_RBLOCK", &rblock_off);
	static int bpre_off = -1;
	p.bpre = !fp4s_env_off("FP4S_MOE_ONE_BPRE", &bpre_off);
	static int claim_off = -1;
	p.gclaim = !fp4s_env_off("FP4S_MOE_CLAIM", &claim_off);
	int per_sm = 0;
	void (*kern)(mt_args) = nv ? moe_tma_kernel<GM_NVFP4> : moe_tma_kernel<GM_MXFP4>;
	FP4S_CUDA_TRY(err, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, GT_THREADS, smem));
	/* blocks wait for blocks of the same grid: all must be resident at once */
	/* (no more blocks a slot than the larger matrix has row tiles) */
	const int64_t bx = (int64_t)per_sm * sms / K, tiles = ((2 * I > H ? 2 * I : H) + 15) / 16;
	const dim3 grid((unsigned)(bx > tiles ? tiles : bx), 1, (unsigned)K);
	if (per_sm < 1 || bx < 1 || (int64_t)grid.x * K < (E + GT_W - 1) / GT_W)
		return FP4S_EUNSUPPORTED;
	if (dry)
		return FP4S_OK; /* (fp4s_cuda_moe_tma_local_ok) */
	if (!p.route && !local && (rc = fp4s_cuda_norm_route(router, K, kind, norm, h, nw, eps, zero_centred, lg, sync, idx, w, x1,
	                                           s, err)))
		return rc; /* FP4S_EUNSUPPORTED: nothing enqueued */
	static int told;
	if (!told && getenv("FP4S_MOE_ONE_DEBUG")) { /* diagnostics: the launch's shape, once */
		told = 1;
		fprintf(stderr, "moe_tma: grid %u x %u, %d blocks an SM, %zu B shared (%zu slots of %d), mode %d\n", grid.x,
		        grid.z, per_sm, smem, st, p.stride, mode);
	}
	struct pdl_launch l;
	FP4S_CUDA_TRY(err, cudaLaunchKernelEx(pdl_cfg(&l, grid, dim3(GT_THREADS), smem, s, 1), kern, p));
	mt_launches++;
	mt_local_launches += local != 0;
	if (p.phases == 1) /* the down GEMV with the combine, as the three-launch path */
		return fp4s_gemv_mma_experts_ex(dn, idx, K, a1, 1, I, 0, 0.0f, 0.0f, NULL, 0.0f, 0, w, h, o1, s, err);
	return FP4S_OK;
}
