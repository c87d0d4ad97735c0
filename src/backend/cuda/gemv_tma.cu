/* gemv_tma.cu: the decode matmul with its weights streamed into shared memory by the bulk copy
 * engine (compute capability 9.0 and later); the same contract, numerics and activation layout as
 * gemv_mma.cu's kernel, which stays for the shapes and forms this one does not take.
 *
 * Why. In gemv_mma.cu every warp loads its own weights into registers, four steps ahead: about
 * 64 KB in flight an SM, bounded by registers. In a decode chain that kernel streams at ~2.2-2.6
 * TB/s once running and loses 3-7 us at each end (bench/results/2026-11-22-h100-session4.md):
 * the loads issued before the PDL wait cover only four steps, and the last round of row tiles
 * runs on a fraction of the SMs. Here one producer warp a block copies stages of 16 weight rows
 * (codes and scales) into a ring of shared memory with cp.async.bulk, each stage's arrival
 * counted in bytes by an mbarrier; eight consumer warps decode and multiply from shared memory
 * with the same step as gemv_mma.cu (gm_step) and hand the stage back through a second mbarrier.
 * So:
 *  - bytes in flight are bounded by the ring (2-16 stages a block, two blocks an SM), not by
 *    registers, and cost no issue slots;
 *  - the first stages of a block's first tile are copied before the PDL wait, while the previous
 *    kernel finishes (not for experts: which expert comes from the router);
 *  - after the first round, each block's producer claims its next tile from a counter, so blocks
 *    on faster SMs take more tiles (single matrices only). Which block computes a tile changes
 *    nothing in its arithmetic: results stay bit-identical from run to run.
 * Measured on the H100 (bench/results/2026-11-22-h100-session5.md): decode +8 % llama3-8b, +4 %
 * gpt-oss-20b, +27 % qwen3-30b-a3b against the register kernel; qwen3's pp512 +9 %.
 *
 * What a launch's fixed cost is made of (bench/results/2026-11-22-h100-l2prefetch.md): the phases
 * between streams (the PDL wait, staging x, a kernel between two matmuls) are bound by L2 latency,
 * not DRAM. So the weight copies are marked evict-first in L2 (a step streams 5 GB through it,
 * which otherwise pushes out the activations, norm weights and outputs the next phase reads:
 * +2 % llama3-8b decode), and plain x is staged four rounds of loads at a time (the down
 * projection's 7 rounds took 4 L2 round trips: staging 4.7 -> 3.2 us). Prefetching weights into
 * L2 in those phases, the next matmul's or a block's own, made decode 1-7 % slower: the extra
 * misses delay the L2 hits those phases wait for (measured, not kept).
 *
 * After the PDL wait the producer of a single matrix copies nothing more until the consumers have
 * staged x (HOLD, FP4S_GEMV_TMA_HOLD=0 turns it off): staging is one L2 round trip, and copies
 * issued in front of it made that trip wait behind their misses (28672x4096 in a chain of
 * launches: staging 3.2 -> 1.8 us a block; decode +0.5-1 % on llama3-8b and qwen3-30b-a3b,
 * bench/results/2026-11-22-h100-session11.md). Copying two rounds of tiles before the wait
 * (FP4S_GEMV_TMA_PRE=2) helped qwen3-30b-a3b's small matrices and cost llama3-8b 2 %, and doing so
 * only below 16 MB measured as noise; one round stays the default.
 *
 * Copies: one matrix of >= 20 MB takes each stage as two 2D tensor copies (cp.async.bulk.tensor,
 * the codes and the scales, maps made once per matrix and cached), issued by one lane; the rest a
 * bulk copy a row (up to 32 a stage). The per-row copies' producer work, on a warp that shares the
 * SM's issue slots with 16 consumer warps, held the stream at 2.2 TB/s once running, 3.1 with
 * the consumers idle; the tensor copies run at 2.7 but start ~1.5 us later, which pays above
 * ~21 MB (bench/results/2026-11-22-h100-stream.md: llama3-8b decode +2 %).
 *
 * A stage (gm_tma_plan) is either 2048 (or 1024) K of each row, a bulk copy a row with padded
 * rows in shared memory so a quarter warp's rows sit on different banks, or whole rows (K <=
 * 2048): the tile's codes and its scales as stored, one copy each. Scales go by row slices where
 * every slice is whole 16-byte units, else the tile's at once (short rows). Consumer warp w takes
 * steps w * sps .. w * sps + sps - 1 of the stage; lane (g, t) the 16 bytes of chunk t of rows g
 * and g + 8, as in gemv_mma.cu. A partial last step (K % 128 != 0) gets zero scales past K.
 *
 * Staged hand-over (gm_args.st_in / st_out, gemv_mma.h's fp4s_gemv_link). Between two one-token
 * launches of a dense layer the activations go over already in the staged layout: the gate|up
 * pairs' epilogue writes the SwiGLU it stores also as the down projection's BF16 hi / lo columns,
 * and the o and down projections' adds write h times the next RMSNorm's weight the same way, with
 * each 16-row tile's sum of squares. The next launch then takes x with one bulk copy issued by a
 * consumer thread (the producer may be blocked on a full ring) and, for the norm, sums K / 16
 * partials in a fixed order, instead of every block loading, normalizing and splitting x from
 * L2 (the down's 57 KB took two batches of rounds, 3.8 us; the fused norm's 2.6-2.8 us). llama3-8b
 * decode +4.8 % (392 against 374 tok/s, 348 against 334 at depth 4096; FP4S_PRESTAGE=0 turns it
 * off; bench/results/2026-11-23-h100-session20.md). Values are the same as gm_stage's; the sum of
 * squares is summed in another order (relative differences ~1e-6 in the norm's output).
 *
 * Takes M <= 16 tokens, K unsplit (K % 32 == 0), one matrix, one token's expert slots (with the
 * fused norm, SwiGLU input and combine) or the grouped expert form, where the activations leave
 * room for at least 2 stages at two blocks an SM. */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

#include "backend/cuda/arrive.cuh"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/gemv_mma.cuh"
#include "backend/cuda/gemv_mma.h"
#include "backend/cuda/gemv_tma.cuh"
#include "backend/cuda/pdl.cuh"

/* C: a second copy of the code (diagnostics: fp4s_diag_clone in cuda_common.h). TG = 1: the kernel
 * with tile groups (a.tgroups, below; 0 compiles them out: the plain kernel). */
template <int F, int NG, int C = 0, int TG = 0>
static __global__ void __launch_bounds__(GT_THREADS, 2) gemv_tma_kernel(const __grid_constant__ gm_args a)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	extern __shared__ __align__(128) uint8_t sm[];
	__shared__ __align__(8) uint64_t full[GT_SMAX], empty[GT_SMAX], xrdy, xbar;
	__shared__ int hdr[GT_SMAX]; /* the stage's tile (-1: no more) */
	__shared__ float s_ss[16];
	const int S = a.stages;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	auto stamp = [&](int k) {
		if (a.stamps && threadIdx.x == 0)
			a.stamps[4 * ((size_t)blockIdx.x + gridDim.x * (size_t)blockIdx.z) + k] = gm_now();
	};
	stamp(0);
	pdl_trigger();
	TL_SCOPE(TL_GEMV_TMA, a.data);
	/* steps: the last may be partial (K % 128 == 32, 64, 96): its staged x is zero and the
	 * chunks past K get zero scales, so the stale shared bytes beside them add nothing */
	const int K = a.K, KC = a.tkc, nkc = (K + KC - 1) / KC, nsteps = (K + 127) >> 7, sps = a.tsps;
	const int64_t tiles = (a.rows + 15) >> 4;
	const int tgroups = TG ? a.tgroups : 0;
	if (threadIdx.x < S) {
		gt_init(&full[threadIdx.x], 1);
		gt_init(&empty[threadIdx.x], GT_W >> tgroups);
		if (threadIdx.x == 0) {
			gt_init(&xrdy, 1);
			gt_init(&xbar, 1);
		}
	}
	if (threadIdx.x < 16)
		s_ss[threadIdx.x] = 0.0f;
	asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
	__syncthreads();

	if (warp == GT_W) {
		/* The producer: stage n goes to slot n % S (q.n, q.i) once the consumers have handed back its
		 * previous use. Tiles: blockIdx.x, then claimed (a.claim) or strided. */
		const size_t rowb = (size_t)K / 2, spr = F == GM_NVFP4 ? K / 16 : K / 32;
		int64_t tile = blockIdx.x;
		int kc = 0, round = 0, ends = 0;
		const int tpre = a.tpre > 1 ? a.tpre : 1;
		bool waited = false;
		const uint8_t *data = a.data, *scales = a.scales;
		if (a.tpre < 0 && !a.idx && !a.g_m) { /* diagnostics: no copies before the wait */
			pdl_wait();
			waited = true;
		}
		if (a.idx || a.g_m) { /* the expert comes from the router: nothing to copy before it */
			pdl_wait();
			waited = true;
			if (a.g_m && a.g_m[blockIdx.z] == 0)
				return; /* an unused group (the consumers leave too) */
			const int64_t e = a.idx ? a.idx[blockIdx.z] : a.g_expert[blockIdx.z];
			data += e * a.stride_data;
			scales += e * a.stride_scales;
		}
		if (a.ttensor && lane == 0) { /* the maps' descriptors, ahead of their first copy */
			asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&a.tm_codes)) : "memory");
			asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&a.tm_scales)) : "memory");
		}
		uint64_t pol = 0; /* evict-first for the weights (FP4S_GEMV_TMA_EVICT=0: the default policy) */
		if (a.tevict)
			asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
		else
			asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol));
		auto copy = [&](void *dst, const void *src, unsigned bytes, uint64_t *b) {
			if (a.tevict)
				gt_copy_ef(dst, src, bytes, b, pol);
			else
				gt_copy(dst, src, bytes, b);
		};
		for (gt_pos q = {0, 0, 0};; gt_next(q, S)) {
			const int i = q.i;
			if (q.n >= (unsigned)S)
				gt_wait(&empty[i], q.ph ^ 1u);
			if (tile >= tiles) {
				if (lane == 0) {
					hdr[i] = -1;
					gt_arrive(&full[i]);
				}
				if (++ends < (1 << tgroups))
					continue; /* each group's next stage says so (gt_go keeps the groups <= S) */
				break;
			}
			const int64_t r0 = tile * 16;
			const int nr = (int)min((int64_t)16, a.rows - r0);
			const int klen = min(KC, K - kc * KC);
			const unsigned cb = (unsigned)klen / 2, sb = F == GM_NVFP4 ? klen / 16 : klen / 32;
			uint8_t *st = sm + (size_t)i * a.tstage;
			/* scales: the stage's slice of each row, or (tscl) the whole tile's, one run */
			const unsigned sbytes = a.tscl ? (unsigned)(nr * spr) : (unsigned)nr * sb;
			if (a.ttensor) {
				/* two tensor copies by one lane: the boxes' full bytes arrive (rows past the
				 * matrix and bytes past the row as zeros) */
				if (lane == 0) {
					hdr[i] = (int)tile;
					gt_expect(&full[i], 16u * (unsigned)(a.trs + a.tss));
					gt_copy_2d(st, &a.tm_codes, kc * (KC / 16), (int)r0, &full[i], pol);
					gt_copy_2d(st + 16 * a.trs, &a.tm_scales, kc * (F == GM_NVFP4 ? KC / 16 : KC / 32), (int)r0,
					           &full[i], pol);
				}
				__syncwarp();
			} else {
				if (lane == 0) {
					hdr[i] = (int)tile;
					gt_expect(&full[i], (unsigned)nr * cb + sbytes);
				}
				__syncwarp();
				if (a.tflat) { /* whole rows: the tile's codes and scales are two contiguous runs */
					if (lane == 0)
						copy(st, data + (size_t)r0 * rowb, (unsigned)nr * cb, &full[i]);
					else if (lane == 1)
						copy(st + 16 * a.trs, scales + (size_t)r0 * spr, sbytes, &full[i]);
				} else if (lane < nr) {
					copy(st + lane * a.trs, data + (size_t)(r0 + lane) * rowb + (size_t)kc * (KC / 2), cb,
					     &full[i]);
				} else if (a.tscl) {
					if (lane == 16)
						copy(st + 16 * a.trs, scales + (size_t)r0 * spr, sbytes, &full[i]);
				} else if (lane >= 16 && lane - 16 < nr) {
					copy(st + 16 * a.trs + (lane - 16) * a.tss,
					     scales + (size_t)(r0 + lane - 16) * spr +
					             (size_t)kc * (F == GM_NVFP4 ? KC / 16 : KC / 32),
					     sb, &full[i]);
				}
			}
			if (++kc < nkc)
				continue;
			kc = 0;
			if (!waited && ++round < tpre) { /* another round strided before the wait */
				tile += gridDim.x;
				continue;
			}
			if (!waited) {
				pdl_wait(); /* the claim counter belongs to the kernels before this one */
				waited = true;
				if (a.thold)
					gt_wait(&xrdy, 0); /* no more copies until the consumers have x */
			}
			if (a.claim) {
				unsigned c = 0;
				if (lane == 0)
					c = atomicAdd(&a.claim[0], 1u);
				tile = (int64_t)gridDim.x * tpre + __shfl_sync(0xFFFFFFFFu, c, 0);
			} else {
				tile += gridDim.x;
			}
		}
		if (!waited)
			pdl_wait();
		if (a.claim && lane == 0) {
			/* the last block to finish claiming leaves the counter at 0 for the next launch */
			__threadfence();
			if (atomicAdd(&a.claim[1], 1u) == gridDim.x - 1) {
				atomicExch(&a.claim[0], 0u);
				atomicExch(&a.claim[1], 0u);
			}
		}
		return;
	}

	/* the consumers */
	int M = a.M, goff = 0; /* tokens of this block (a.M: of the shared-memory layout) */
	const float *xin = a.x, *bias = a.bias;
	float *yout = a.y;
	float post = a.post;
	const int cs = gm_col_stride(nsteps * 4);
	uint8_t *xs = sm + (size_t)S * a.tstage;
	float *red = reinterpret_cast<float *>(xs + (size_t)2 * a.M * cs); /* [2][warps][M][16] */
	/* The norm weight (a.twarm): a few KB a layer, read by every block right after the wait, and
	 * long out of L2 by then (its last use was a step ago); fetched now, while the block waits
	 * anyway, by a few blocks for all. */
	if (a.twarm && a.norm_w && threadIdx.x == 0 && blockIdx.x < 4 && blockIdx.z == 0)
		gm_l2_prefetch(a.norm_w, (uint32_t)K * 4u);
	pdl_wait(); /* x and y belong to the kernels before this one */
	stamp(1);
	TL_MARK(1);
	if (a.g_m) { /* group blockIdx.z: g_m[z] tokens of expert g_expert[z], rows g_off[z] + i */
		const int z = blockIdx.z;
		M = a.g_m[z];
		if (M == 0)
			return;
		const int64_t e = a.g_expert[z];
		goff = a.g_off[z];
		if (bias)
			bias += e * a.rows;
		if (a.ws2e)
			post *= a.ws2e[e];
		if (!a.xrow)
			xin += (int64_t)goff * a.x_stride;
		yout += (int64_t)goff * a.rows;
	}
	if (a.idx) { /* expert slot blockIdx.z */
		const int slot = blockIdx.z;
		const int64_t e = a.idx[slot];
		if (bias)
			bias += e * a.rows;
		if (a.ws2e)
			post *= a.ws2e[e];
		xin += (int64_t)(slot / a.x_div) * a.x_stride;
		yout += (int64_t)slot * (a.pairact ? a.rows / 2 : a.rows);
	}
	if (a.tprobe == 2)
		;
	else if (a.st_in) {
		/* x staged by the kernel before: one bulk copy by one thread (not the producer, which
		 * may be waiting for a slot of the ring), and with the norm the sum of its partial sums
		 * of squares by warp 0, in a fixed order, while the bytes come in */
		if (threadIdx.x == 0) {
			gt_expect(&xbar, 2u * (unsigned)cs);
			gt_copy(xs, a.st_in, 2u * (unsigned)cs, &xbar);
		}
		if (a.st_ss && warp == 0) {
			float v = 0.0f;
			for (int b0 = 0; b0 < (K >> 4); b0 += 256) {
				float part[8];
#pragma unroll
				for (int u = 0; u < 8; u++)
					part[u] = b0 + 32 * u + lane < (K >> 4) ? __ldcg(a.st_ss + b0 + 32 * u + lane) : 0.0f;
#pragma unroll
				for (int u = 0; u < 8; u++)
					v += part[u];
			}
			for (int o = 16; o; o >>= 1)
				v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
			if (lane == 0)
				s_ss[0] = v;
		}
		gt_wait(&xbar, 0);
	} else if (a.tsu == 4 && !a.norm_w && !a.act)
		gm_stage<GT_W * 32, 4, true>(a, xs, cs, M, 0, K, nsteps * 4, xin, goff, s_ss, false, threadIdx.x);
	else
		gm_stage<GT_W * 32>(a, xs, cs, M, 0, K, nsteps * 4, xin, goff, s_ss, a.norm_w != NULL, threadIdx.x);
	gt_sync();
	if (a.thold && threadIdx.x == 0)
		gt_arrive(&xrdy);
	stamp(2);
	TL_MARK(2);
	const int g = lane >> 2, t = lane & 3;
	const uint8_t *xcol[NG];
	gm_xcols<NG>(xcol, xs, cs, M, g);
	uint32_t xsa[NG]; /* the same, as shared-space addresses (gm_lds128) */
#pragma unroll
	for (int gg = 0; gg < NG; gg++)
		xsa[gg] = gt_sa(xcol[gg]);
	/* this lane's bytes in a stage: row g's 16 code bytes of a step and its scales (row g + 8's
	 * are 8 rows further) */
	const uint32_t ring = gt_sa(sm), wa = (uint32_t)(g * a.trs + t * 16), ska = (uint32_t)(16 * a.trs + g * a.tss);
	/* The stage loop, one copy per count of tile groups (tgroups: 2^TGC of them; one token,
	 * whole-row stages, gt_go picks it): the consumer warps split into groups of WG = GT_W >> TGC,
	 * each on its own tiles, so a block with only 2-4 tiles (qwen3-30b-a3b's qkv and experts)
	 * has them in flight at once instead of one after another. Copies with the count compiled in:
	 * with a run-time count in one copy, its code cost every launch, grouped or not (llama3-8b
	 * -2.4 %; a group's first stage as a run-time value alone -1.5 %). */
	auto stages = [&](auto tgc) {
		constexpr int TGC = decltype(tgc)::value, G = 1 << TGC, WG = GT_W >> TGC;
		float acc[NG][4];
#pragma unroll
		for (int gg = 0; gg < NG; gg++)
			acc[gg][0] = acc[gg][1] = acc[gg][2] = acc[gg][3] = 0.0f;
		int kc = 0, tile_it = 0;
		/* group gi of WG warps (wg: the warp's place in it) takes stages gi, gi + G, ... */
		const int gi = TGC ? warp / WG : 0, wg = TGC ? warp % WG : warp;
		gt_pos q = {0, 0, 0};
		if (TGC)
			gt_next_n(q, S, gi);
		for (;; TGC ? gt_next_n(q, S, G) : gt_next(q, S)) {
			const int i = q.i;
			gt_wait(&full[i], q.ph);
			const int tile = hdr[i];
			if (tile < 0)
				break;
#ifdef FP4S_DIAG_TL
			if (q.n == 0)
				TL_MARK(4); /* the first stage's bytes are here (dev/tile_marks.py) */
#endif
			/* this warp's steps of the stage: u0 + j in it, s0 + j in the row, jn of them (fewer at
			 * the row's end, none past it). What a step needs is the stage's value plus j times a
			 * constant, so the loop carries no per-step index arithmetic or argument tests. */
			const int u0 = wg * sps, s0 = kc * GT_W * sps + u0, jn = min(sps, nsteps - s0);
			const uint32_t pw = ring + (uint32_t)i * (uint32_t)a.tstage + wa + 64u * (uint32_t)u0; /* step j: + 64 j */
			const int sbytes = F == GM_NVFP4 ? 2 : 1; /* a chunk's scale bytes */
			const uint32_t ps = pw - 64u * (uint32_t)u0 - wa + ska + /* step j: + 4 j chunks */
			                    (uint32_t)(sbytes * (a.tscl ? 4 * s0 + t : 4 * u0 + t));
			const int kr = (K >> 5) - (4 * s0 + t); /* step j's chunk is past K where 4 j >= kr */
			const uint32_t w8 = 8u * (uint32_t)a.trs, s8 = 8u * (uint32_t)a.tss;
			if (!a.tprobe) {
#pragma unroll 1
				for (int j = 0; j < jn; j++) {
					const uint4 wqa = gm_lds128(pw + 64 * j), wqb = gm_lds128(pw + w8 + 64 * j);
					uint32_t cai, cbi;
					if (4 * j >= kr) {
						cai = cbi = F == GM_NVFP4 ? 0u : 0x100u; /* past K (0x100: MXFP4's zero scale) */
					} else if (F == GM_NVFP4) {
						cai = gt_lds16(ps + 8 * j);
						cbi = gt_lds16(ps + s8 + 8 * j);
					} else {
						cai = gt_lds8(ps + 4 * j);
						cbi = gt_lds8(ps + s8 + 4 * j);
					}
					gm_step<F, NG>(acc, wqa, wqb, cai, cbi, a.ec, xsa, 4 * (s0 + j) + t);
				}
			} else { /* diagnostics (FP4S_GEMV_TMA_PROBE): the loads alone */
#pragma unroll 1
				for (int j = 0; j < jn; j++) {
					const uint4 wqa = gm_lds128(pw + 64 * j), wqb = gm_lds128(pw + w8 + 64 * j);
					const uint32_t c = 4 * j >= kr ? 0u : gt_lds8(ps + sbytes * 4 * j) ^ gt_lds8(ps + s8 + sbytes * 4 * j);
					acc[0][0] += __uint_as_float(wqa.x ^ wqb.y ^ c); /* keep the loads */
				}
			}
			__syncwarp();
			if (lane == 0)
				gt_arrive(&empty[i]); /* this warp is done with the slot */
			if (++kc < nkc)
				continue;
			/* end of a tile: warps' partials -> red[parity][warp][token][row], one barrier, then one
			 * thread per (token, row) sums the warps in order (as gemv_mma.cu). (Handing the sums to
			 * one warp through mbarriers instead, so the others go on, measured slower: the last
			 * tile's sums then wait for that warp; bench/results/2026-11-22-h100-session8.md.) */
			kc = 0;
			float *rp = red + (size_t)(tile_it & 1) * GT_W * M * 16;
			tile_it++;
#pragma unroll
			for (int gg = 0; gg < NG; gg++) {
				const int tok = 4 * gg + t;
				if (tok < M) {
					rp[(warp * M + tok) * 16 + g] = acc[gg][0] + acc[gg][1];
					rp[(warp * M + tok) * 16 + g + 8] = acc[gg][2] + acc[gg][3];
				}
				acc[gg][0] = acc[gg][1] = acc[gg][2] = acc[gg][3] = 0.0f;
			}
			/* the group's own barrier, 2 + gi (1 is gt_sync's, the MoE combine's after the loop).
			 * Immediate ids: with the id in a register, ptxas reserves all 16 of a block's
			 * barriers, which alone cost ~1 % (session 35). */
			if (!TGC)
				gt_sync();
			else if (gi == 0)
				asm volatile("bar.sync 2, %0;" ::"n"(WG * 32) : "memory");
			else if (TGC == 1 || gi == 1)
				asm volatile("bar.sync 3, %0;" ::"n"(WG * 32) : "memory");
			else if (gi == 2)
				asm volatile("bar.sync 4, %0;" ::"n"(WG * 32) : "memory");
			else
				asm volatile("bar.sync 5, %0;" ::"n"(WG * 32) : "memory");
			const unsigned lt = threadIdx.x - (unsigned)(gi * WG * 32); /* the thread's place in its group */
			const int tok = lt >> 4, r = lt & 15;
			const int64_t row = (int64_t)tile * 16 + r;
			const bool live = tok < M && row < a.rows;
			float out = 0.0f;
			if (live) {
				float v = 0.0f;
				for (int w = 0; w < WG; w++)
					v += rp[((gi * WG + w) * M + tok) * 16 + r];
				out = ldexpf(v, a.pexp) * post;
				if (a.norm_w)
					out *= 1.0f / sqrtf(s_ss[tok] / (float)K + a.eps);
				if (bias)
					out += bias[row];
			}
			if (a.pairact) {
				/* (gate, up) = rows (2i, 2i + 1), neighbouring lanes: the even lane writes SwiGLU
				 * (as moe.cu's moe_act_kernel, the SwiGLU kernels and the down GEMV's staging compute
				 * it): 1 gpt-oss's clamped form, 2 silu(gate) * up */
				const float up = __shfl_down_sync(0xFFFFFFFFu, out, 1);
				if (live && !(r & 1)) {
					const float v = a.pairact == 1 ? swiglu_oai(out, up, a.alpha, a.limit) : silu_mul(out, up);
					yout[(size_t)tok * (a.rows / 2) + (row >> 1)] = v;
					if (a.st_out)
						gm_st_put(a.st_out, gm_col_stride((int)((a.rows >> 1) >> 7) * 4), (int)(row >> 1), v);
				}
			} else {
				float v = 0.0f;
				if (live) {
					float *yp = yout + (size_t)tok * a.rows + row;
					v = a.accumulate ? *yp + out : out;
					*yp = v;
					if (a.st_out)
						gm_st_put(a.st_out, gm_col_stride((int)(a.rows >> 7) * 4), (int)row,
						          a.st_nw ? v * ((a.st_zc ? 1.0f : 0.0f) + a.st_nw[row]) : v);
				}
				if (a.st_ssout && wg == 0) { /* the tile's sum of squares, one token: lanes 0-15 */
					v *= v;
					for (int o = 8; o; o >>= 1)
						v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
					if (lane == 0)
						a.st_ssout[tile] = v;
				}
			}
#ifdef FP4S_DIAG_TL
			if (tile_it <= 2)
				TL_MARK(4 + tile_it); /* the first and second tiles' epilogues done */
#endif
		}
	};
	if (TG && NG == 1 && tgroups == 2)
		stages(std::integral_constant<int, 2>());
	else if (TG && NG == 1 && tgroups == 1)
		stages(std::integral_constant<int, 1>());
	else
		stages(std::integral_constant<int, 0>());
	TL_MARK(7); /* the last tile's epilogue done (a combine may follow) */
	stamp(3);
	if (a.cw) {
		/* the MoE combine, as gemv_mma.cu: the slots' blocks with this blockIdx.x covered the same
		 * row tiles (tiles strided, never claimed, for experts); the last of them to finish sums
		 * the slots' rows in slot order and adds them into h */
		__shared__ int last;
		gt_sync();
		if (threadIdx.x == 0)
			last = fp4s_arrive(&a.cnt[blockIdx.x]) == gridDim.z - 1;
		gt_sync();
		if (!last)
			return;
		gm_combine_rows<GT_W * 32>(a);
	}
#endif
}

/* the staged hand-over's bytes for K elements of one token (its hi and lo columns) */
extern "C" size_t fp4s_gemv_link_bytes(int64_t K)
{
	return (size_t)2 * gm_col_stride((int)((K + 127) / 128 * 4));
}

/* ---- the 2D tensor form's maps ---- */

typedef CUresult (*gt_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                 const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

#define GT_MAPS 1024 /* cached matrices (a model's decode matmuls, and room to spare) */
/* The tensor copies stream faster (2.66-2.71 TB/s against 2.21-2.26 once running, K = 4096) but
 * start later (~5.0 against ~3.4 us fixed a launch): they pay from ~21 MB of weights
 * (bench/results/2026-11-22-h100-stream.md), so smaller matrices keep a copy a row. */
#define GT_TENSOR_MIN ((int64_t)20 << 20)

/* a's two tensor maps (codes as 8-byte units, boxes of 16 rows x trs bytes; scales as bytes,
 * 16 rows x tss; L2 promotion 256 B: none, 128 B and 256 B measured the same), from a cache
 * keyed by everything they encode (weights do not move, so a decode step finds them there); 0
 * where the driver's encoder is not reachable or refuses them. */
static int gt_maps(gm_args *a, int nv, int64_t K)
{
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	static gt_encode_fn enc;
	static int tried;
	static struct {
		const void *data, *scales;
		int64_t rows, K;
		int trs, tss, nv;
		CUtensorMap c, s;
	} cache[GT_MAPS];
	const int64_t spr = K / (nv ? 16 : 32);
	if (K / 16 < a->trs / 8 || spr < a->tss || (K / 2) % 16 || spr % 16)
		return 0;
	pthread_mutex_lock(&lock);
	if (!tried) {
		tried = 1;
		void *fn = NULL;
		cudaDriverEntryPointQueryResult q;
		if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) ==
		            cudaSuccess &&
		    q == cudaDriverEntryPointSuccess)
			enc = (gt_encode_fn)fn;
	}
	int ok = 0;
	const size_t h = ((uintptr_t)a->data >> 8) % GT_MAPS;
	for (size_t j = 0; j < 8 && enc; j++) {
		auto &e = cache[(h + j) % GT_MAPS];
		if (e.data == a->data && e.scales == a->scales && e.rows == a->rows && e.K == K && e.trs == a->trs &&
		    e.tss == a->tss && e.nv == nv) {
			a->tm_codes = e.c, a->tm_scales = e.s;
			ok = 1;
			break;
		}
		if (e.data && j < 7)
			continue;
		/* an empty entry, or the last of the probe (replaced) */
		const cuuint64_t cd[2] = {(cuuint64_t)K / 16, (cuuint64_t)a->rows}, cs[1] = {(cuuint64_t)K / 2};
		const cuuint64_t sd[2] = {(cuuint64_t)spr, (cuuint64_t)a->rows}, ss[1] = {(cuuint64_t)spr};
		const cuuint32_t cb[2] = {(cuuint32_t)a->trs / 8, 16}, sbx[2] = {(cuuint32_t)a->tss, 16}, one[2] = {1, 1};
		if (enc(&e.c, CU_TENSOR_MAP_DATA_TYPE_UINT64, 2, (void *)a->data, cd, cs, cb, one,
		        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
		        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS ||
		    enc(&e.s, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)a->scales, sd, ss, sbx, one,
		        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
		        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
			e.data = NULL;
			break;
		}
		e.data = a->data, e.scales = a->scales, e.rows = a->rows, e.K = K, e.trs = a->trs, e.tss = a->tss;
		e.nv = nv;
		a->tm_codes = e.c, a->tm_scales = e.s;
		ok = 1;
		break;
	}
	pthread_mutex_unlock(&lock);
	return ok;
}

/* The ring for this matmul. A stage is either whole rows (flat: the tile's codes and scales as
 * stored, one copy each) or KC = 1024 / 2048 / 4096 K of each row (a copy a row, with padding so
 * the 8 rows a quarter warp reads sit on different banks: codes KC / 2 + 64 bytes apart, scales
 * KC / 16 or / 32 + 16). FP4S_GEMV_TMA_KC = flat / 1024 / 2048 / 4096 forces one; by default whole
 * rows up to K = 2048 (qwen3-30b-a3b's experts and attention: few, larger copies, +14 % end to end
 * against 2048-K stages) and 2048-K stages above (llama3-8b: 1024 measured 23 % slower, 4096 or
 * whole rows 6 % slower; gpt-oss-20b's K = 2880: whole rows 1 % slower); see
 * bench/results/2026-11-22-h100-session5.md. Stages: as many as fit beside the activations
 * (at least 2). */
static size_t gt_budget = GM_SMEM_MAX;

size_t gm_tma_budget(void)
{
	return gt_budget;
}

int gm_tma_plan(int nv, int64_t K, int M, gm_args *a)
{
	static int tsu, tevict, tprobe, tscl_env, ttensor, guflat; /* FP4S_GEMV_TMA_SU, _EVICT, _PROBE, _TSCL,
	                                                          * _TENSOR, _GUFLAT */
	static int thold, tpre, twarm; /* FP4S_GEMV_TMA_HOLD, _PRE, _WARM */
	static int want = -1;   /* 0 auto, 1 flat, else KC */
	static size_t budget; /* shared memory a block (FP4S_GEMV_TMA_SMEM, KB) */
	static int64_t maxk;  /* FP4S_GEMV_TMA_MAXK: longer rows go to gemv_mma.cu (diagnostics) */
	if (want < 0) {
		const char *mk = getenv("FP4S_GEMV_TMA_MAXK");
		maxk = mk && atoll(mk) > 0 ? atoll(mk) : ((int64_t)1 << 24);
		const char *e = getenv("FP4S_GEMV_TMA_KC");
		want = !e ? 0 : !strcmp(e, "flat") ? 1 : atoi(e);
		if (want != 0 && want != 1 && want != 1024 && want != 2048 && want != 4096)
			want = 0;
		e = getenv("FP4S_GEMV_TMA_SMEM");
		const int kb = e ? atoi(e) : 0;
		budget = kb >= 32 && kb <= GT_SMEM_CAP / 1024 ? (size_t)kb * 1024 : GM_SMEM_MAX;
		gt_budget = budget;
		e = getenv("FP4S_GEMV_TMA_SU");
		tsu = e ? atoi(e) : GT_SU;
		e = getenv("FP4S_GEMV_TMA_EVICT");
		tevict = !(e && atoi(e) == 0);
		e = getenv("FP4S_GEMV_TMA_PROBE");
		tprobe = e ? atoi(e) : 0;
		e = getenv("FP4S_GEMV_TMA_TSCL"); /* diagnostics: every stage takes its tile's scales in one copy */
		tscl_env = e && atoi(e) == 1;
		e = getenv("FP4S_GEMV_TMA_TENSOR"); /* 0 never, 1 always, else by size */
		ttensor = e && (atoi(e) == 0 || atoi(e) == 1) ? atoi(e) : 2;
		e = getenv("FP4S_GEMV_TMA_GUFLAT"); /* 0: expert gate|up rows above K = 2048 in 2048-K stages */
		guflat = !(e && atoi(e) == 0);
		e = getenv("FP4S_GEMV_TMA_HOLD");
		thold = !(e && atoi(e) == 0);
		e = getenv("FP4S_GEMV_TMA_WARM"); /* 0: no norm weight prefetch before the PDL wait (A/B) */
		twarm = !(e && atoi(e) == 0);
		e = getenv("FP4S_GEMV_TMA_PRE"); /* -1: nothing copied before the PDL wait */
		tpre = e && atoi(e) >= -1 && atoi(e) <= 4 && atoi(e) != 0 ? atoi(e) : 1;
	}
	a->tsu = tsu, a->tevict = tevict, a->tprobe = tprobe, a->twarm = twarm;
	a->thold = thold && !a->idx && !a->g_m;
	a->tpre = tpre;
	const int div = nv ? 16 : 32;
	const int64_t spr = K / div, part = a->rows % 16;
	if (M < 1 || M > 16 || K < 128 || K % 32 || K > maxk || (uintptr_t)a->data % 16 ||
	    (uintptr_t)a->scales % 16 || (a->idx && (a->stride_data % 16 || a->stride_scales % 16)))
		return 0;
	/* row slices: scales by slices where each is whole 16-byte units, else the tile's at once
	 * (tscl: short rows only). Any whole-tile scale run of a ragged last tile must be whole
	 * units too. */
	const int tscl = K % (nv ? 256 : 512) != 0 || tscl_env;
	const size_t xs = (size_t)2 * M * gm_col_stride((int)((K + 127) / 128 * 4)) + (size_t)2 * GT_W * M * 16 * sizeof(float);
	/* (the grouped form with gpt-oss-20b's 8 tokens at K = 2880 leaves no ring beside the
	 * activations at two blocks an SM; at one block an SM it measured 21 % slower on pp512 than
	 * the register kernel, which it is then left to) */
	const size_t room = budget;
	if (xs >= room)
		return 0;
	int cand[3], nc = 0;
	/* whole rows also for expert slots on plain x up to K = 4096 (gpt-oss-20b's gate|up, K =
	 * 2880: 2048 + 832-K stages leave half the consumer warps idle in the second) */
	if (want == 1 || (want == 0 && (K <= 2048 || (guflat && a->idx && !a->act && !a->norm_w && K <= 4096))))
		cand[nc++] = 0; /* flat */
	if (want > 1)
		cand[nc++] = want;
	else if (want == 0)
		cand[nc++] = 2048, cand[nc++] = 1024;
	for (int ci = 0; ci < nc; ci++) {
		const int kc = cand[ci], flat = kc == 0;
		if (!flat && kc > K && kc != 1024)
			continue;
		if ((flat || tscl) && (part * spr) % 16)
			continue;
		if (!flat && tscl && 16 * spr > 4096)
			continue;
		const int rs = flat ? (int)K / 2 : kc / 2 + 64;
		const int ss = flat || tscl ? (int)spr : kc / div + 16;
		const int stage = (16 * rs + 16 * ss + 127) / 128 * 128;
		size_t n = (room - xs) / (size_t)stage;
		n = n > GT_SMAX ? GT_SMAX : n;
		if (n < 2)
			continue;
		a->tkc = flat ? (int)K : kc;
		a->tsps = flat ? (int)(((K + 127) / 128 + GT_W - 1) / GT_W) : kc / 1024;
		a->trs = rs, a->tss = ss, a->tstage = stage, a->tflat = flat, a->tscl = tscl;
		/* 2D tensor copies for one matrix's K-sliced stages where it holds >= GT_TENSOR_MIN bytes
		 * (FP4S_GEMV_TMA_TENSOR=0 / 1: never / always) */
		const int tt = ttensor == 2 ? a->rows * K / 2 >= GT_TENSOR_MIN : ttensor;
		a->ttensor = tt && !flat && !tscl && !a->idx && !a->g_m && gt_maps(a, nv, K);
		return (int)n;
	}
	return 0;
}

/* Every one-token launch on the kernel with tile groups (fp4s_gemv_tma_groups). */
static int gt_all;

extern "C" void fp4s_gemv_tma_groups(int all)
{
	gt_all = all != 0;
}

template <int F, int NG, int C = 0>
static cudaError_t gt_go(const gm_args &a, int64_t tiles, int sms, int nz, cudaStream_t s)
{
	const size_t smem = (size_t)a.stages * a.tstage + (size_t)2 * a.M * gm_col_stride((a.K + 127) / 128 * 4) +
	                    (size_t)2 * GT_W * a.M * 16 * sizeof(float);
	int per_sm = 0;
	cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_tma_kernel<F, NG, C>, GT_THREADS, smem);
	if (e != cudaSuccess)
		return e;
	if (per_sm < 1)
		return cudaErrorInvalidConfiguration;
	/* every SM full; expert slots (blockIdx.z) share the blocks */
	int64_t bx = ((int64_t)per_sm * sms + nz - 1) / nz;
	bx = bx > tiles ? tiles : bx < 1 ? 1 : bx;
	struct pdl_launch l;
	pdl_cfg(&l, dim3((unsigned)bx, 1, (unsigned)nz), dim3(GT_THREADS), smem, s, 1);
	/* tile groups (a.tgroups): as many as a block has tiles, up to 4 and the ring's stages (a
	 * group's end-of-tiles stage is never handed back), one token, whole-row stages, on the
	 * kernel with groups (TG = 1); with gt_all every one-token launch runs that kernel, the
	 * others on its copy of the loop without groups. FP4S_GEMV_TMA_GROUPS: 0 off, 1 on (default),
	 * 2 for expert slots only. */
	static int gmode = -1;
	if (gmode < 0) {
		const char *e = getenv("FP4S_GEMV_TMA_GROUPS");
		gmode = e && (*e == '0' || *e == '2') && !e[1] ? *e - '0' : 1;
	}
	const int64_t tpb = (tiles + bx - 1) / bx;
	int lg = 0;
	if (NG == 1 && C == 0 && a.M == 1 && a.tflat && (gmode == 1 || (gmode == 2 && a.idx)))
		lg = tpb >= 4 && a.stages >= 4 ? 2 : tpb >= 2 ? 1 : 0;
	if (NG == 1 && C == 0 && a.M == 1 && (lg || (gt_all && gmode))) {
		gm_args b = a;
		b.tgroups = lg;
		if (lg)
			b.tsps = (int)(((a.K + 127) / 128 + (GT_W >> lg) - 1) / (GT_W >> lg)); /* a group's warp's steps */
		return cudaLaunchKernelEx(&l.cfg, gemv_tma_kernel<F, 1, 0, 1>, b);
	}
	return cudaLaunchKernelEx(&l.cfg, gemv_tma_kernel<F, NG, C>, a);
}

cudaError_t gm_tma_launch(const gm_args &a, int nv, int sms, int nz, cudaStream_t s)
{
	const int64_t tiles = (a.rows + 15) >> 4;
#ifdef FP4S_DIAG_CLONE
	if (a.M == 1 && ((fp4s_diag_clone(1) && a.idx) || (fp4s_diag_clone(2) && !a.idx && !a.g_m && a.accumulate) ||
	                 (fp4s_diag_clone(4) && !a.idx && !a.g_m && a.norm_w)))
		return nv ? gt_go<GM_NVFP4, 1, 1>(a, tiles, sms, nz, s) : gt_go<GM_MXFP4, 1, 1>(a, tiles, sms, nz, s);
#endif
	if (nv)
		return a.M <= 4 ? gt_go<GM_NVFP4, 1>(a, tiles, sms, nz, s)
		       : a.M <= 8 ? gt_go<GM_NVFP4, 2>(a, tiles, sms, nz, s)
		                  : gt_go<GM_NVFP4, 4>(a, tiles, sms, nz, s);
	return a.M <= 4 ? gt_go<GM_MXFP4, 1>(a, tiles, sms, nz, s)
	       : a.M <= 8 ? gt_go<GM_MXFP4, 2>(a, tiles, sms, nz, s)
	                  : gt_go<GM_MXFP4, 4>(a, tiles, sms, nz, s);
}

cudaError_t gm_tma_attrs(void)
{
	cudaError_t e = cudaSuccess;
#define GT_ATTR(F, ...)                                                                                    \
	if (e == cudaSuccess)                                                                              \
		e = cudaFuncSetAttribute(gemv_tma_kernel<F, __VA_ARGS__>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
		                         GT_SMEM_CAP);
	GT_ATTR(GM_NVFP4, 1)
	GT_ATTR(GM_NVFP4, 2)
	GT_ATTR(GM_NVFP4, 4)
	GT_ATTR(GM_MXFP4, 1)
	GT_ATTR(GM_MXFP4, 2)
	GT_ATTR(GM_MXFP4, 4)
	GT_ATTR(GM_NVFP4, 1, 0, 1)
	GT_ATTR(GM_MXFP4, 1, 0, 1)
#ifdef FP4S_DIAG_CLONE
	GT_ATTR(GM_NVFP4, 1, 1)
	GT_ATTR(GM_MXFP4, 1, 1)
#endif
#undef GT_ATTR
	if (e == cudaSuccess)
		e = mt_attrs();
	return e;
}
