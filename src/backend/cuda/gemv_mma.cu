/* gemv_mma.cu: the decode matmul for FP4 weights on tensor cores, y[M, rows] = x[M, K] . W^T,
 * M = 1..16 tokens a pass (see gemv_cuda.h for the contract; gemv_fp4.cu keeps the FP32 kernels
 * for dense weights and for the shapes this one declines).
 *
 * Why tensor cores for a GEMV. The FP32 kernel spent ~5 instructions per weight element (decode to
 * FP32, one FFMA per element per token) and ran out of issue slots at 1.0-1.8 TB/s on the H100
 * (bench/results/2026-11-21-h100-gemv.md). Here codes are decoded two at a time into a BF16 pair
 * and the multiply-adds go to mma.sync m16n8k16 (FP32 accumulate): ~2 instructions per element,
 * and tokens 2..4 ride along for free in the MMA's 8 columns.
 *
 * Exactness (formats.md §2.4). The shift trick puts a code's sign at bit 15 and its 3 magnitude
 * bits at BF16 bits 8..6, which is exactly value * 2^-126 (code 1 is a BF16 subnormal). One BF16
 * multiply by the block scale times 2^C (NVFP4: E4M3 * 2^112; MXFP4: 2^(e - 127 + C) with C from
 * the tensor's scale range, mx_scale_range below) gives value * scale * 2^(C - 126), exact in BF16
 * because E2M1 x E4M3 products have at most 8 significant bits and C keeps them in range; the
 * epilogue multiplies by 2^(126 - C) (and NVFP4's ws2). Activations are split x = hi + lo, both
 * BF16, in two MMA columns, so the product keeps ~16 bits of x (relative error ~2^-17 a term,
 * ~2e-6 a dot product): close to the FP32 reference, unlike the prefill GEMM's plain BF16 x.
 *
 * Layout. A block (8 warps) owns 16 rows and a range of K; its warps split that range into steps
 * of 128 elements. In a step, lane (g, t) (g = lane / 4, t = lane % 4) loads 16 bytes (32 codes)
 * of rows g and g + 8 at chunk 4 * step + t, with the 2 NVFP4 / 1 MXFP4 scale bytes beside them.
 * Word j of the chunk gives four BF16 pairs (codes 3-k and 7-k of the word, k = 0..3); MMA 2j + h
 * takes pairs 2h and 2h+1 as its a0/a2 (row g) and a1/a3 (row g + 8). The K order inside an MMA
 * is therefore permuted, and the activations are staged in shared memory in the same permuted
 * order (pairs in decode order, 64 bytes per chunk and column), so each lane's B fragment is 4
 * 16-byte shared loads per step. Column n of the MMA is token n / 2, part n % 2 (hi, lo): four
 * tokens per MMA, and the C fragment of lane (g, t) holds token t's hi and lo sums for rows g and
 * g + 8. Shared-memory columns are padded to 32 mod 128 bytes and the 16-byte units of odd chunk
 * pairs swapped, so a quarter warp's loads hit 8 different bank groups.
 *
 * Memory. Weights and scales are read once with L1::no_allocate loads, four steps ahead per lane
 * (128 bytes in flight a lane, ~64 KB an SM). The activations are read once per block from L2.
 * Blocks that share rows but cover different K ranges (when the row tiles alone would not fill
 * the GPU) leave partial sums in a workspace; the last to finish adds them in a fixed order, so
 * results do not depend on timing.
 *
 * PDL (pdl.cuh). The weight loads and any L2 prefetches are issued before pdl_wait: they depend
 * on no earlier kernel, so in a decode chain they overlap the previous kernel's tail.
 *
 * On compute capability 9.0 and later, gemv_tma.cu takes the single-matrix and expert forms with
 * K unsplit where its ring fits (its weights copied into shared memory by the bulk copy engine:
 * 4-27 % faster end to end, bench/results/2026-11-22-h100-session5.md); this kernel keeps the
 * rest (split K, groups too large for the ring, the gate|up pairing, the variants and probes,
 * older GPUs).
 *
 * Where it stands (H100, bench/results/2026-11-21-h100-session3.md and 2026-11-22-h100-session4.md):
 * in graph replay with PDL, 0.8-2.1 TB/s at M = 1 (floor 2.2 large, 1.5 small). Once running it
 * streams at ~2.6 TB/s, but per-block timestamps (gemv_bench's timeline) show 3-7 us before the
 * first MMA (the PDL wait, then every block staging x from L2: 1.5 us at K = 4096, 4.8 us at
 * 14336) and blocks finishing 1.5-7 us apart (row tiles do not divide evenly over the blocks,
 * and a lone block in the last round cannot keep its SM's share of bytes in flight). Measured and not taken:
 * bulk L2 prefetch of upcoming tiles (slower at every distance), a cp.async shared-memory ring
 * with one block an SM so the next kernel's block fits beside it (slower), K splits to even out
 * the last round of tiles (1.4-2x slower: a fence and counter round trip per tile). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/gemv_cuda.h"
#include "backend/cuda/gemv_mma.h"
#include "backend/cuda/moe_cuda.h"
#include "backend/cuda/arrive.cuh"
#include "backend/cuda/pdl.cuh"

#include "backend/cuda/gemv_mma.cuh"
#include "backend/cuda/swiglu.cuh"

/* W warps a block, D steps in flight a lane; the default is W = 8, D = 4 (two blocks an SM) */
template <int F, int NG, int W, int D>
static __global__ void __launch_bounds__(W * 32, (D == 4 ? 16 : 8) / W) gemv_mma_kernel(const gm_args a)
{
	extern __shared__ __align__(16) uint8_t sm[];
	__shared__ int last;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	/* benchmarks: stamps go out as they are taken (held in registers, they cost spills) */
	auto stamp = [&](int k) {
		if (a.stamps && threadIdx.x == 0)
			a.stamps[4 * ((size_t)blockIdx.x + gridDim.x * ((size_t)blockIdx.y + gridDim.y * blockIdx.z)) + k] = gm_now();
	};
	stamp(0);
	pdl_trigger();
	TL_SCOPE(TL_GEMV_MMA, a.data);
	/* the MoE forms learn their experts from the router's output: wait for it first */
	if (a.idx || a.g_m)
		pdl_wait();
	const uint8_t *data = a.data, *scales = a.scales;
	const float *xin = a.x, *bias = a.bias;
	float *yout = a.y;
	float post = a.post;
	if (a.idx) {
		const int slot = blockIdx.z;
		const int64_t e = a.idx[slot];
		data += e * a.stride_data;
		scales += e * a.stride_scales;
		if (bias)
			bias += e * a.rows;
		if (a.ws2e)
			post *= a.ws2e[e];
		xin += (int64_t)(slot / a.x_div) * a.x_stride;
		yout += (int64_t)slot * a.rows;
	}
	int M = a.M; /* tokens of this block (a.M: of the shared-memory layout) */
	int goff = 0;
	if (a.g_m) {
		const int z = blockIdx.z;
		M = a.g_m[z];
		if (M == 0)
			return;
		const int64_t e = a.g_expert[z];
		goff = a.g_off[z];
		data += e * a.stride_data;
		scales += e * a.stride_scales;
		if (bias)
			bias += e * a.rows;
		if (a.ws2e)
			post *= a.ws2e[e];
		if (!a.xrow)
			xin += (int64_t)goff * a.x_stride;
		yout += (int64_t)goff * a.rows;
	}
	const int g = lane >> 2, t = lane & 3;
	const int k0 = blockIdx.y * a.kb;
	const int k1 = min(a.K, k0 + a.kb);
	const int nsteps = (k1 - k0 + 127) >> 7;
	const int nch = nsteps * 4;
	const int cs = gm_col_stride(nch);
	/* every warp walks the same number of steps a tile (steps past the end are empty), so all
	 * reach the per-tile barrier at the same point of the loop */
	const int spw = (nsteps + W - 1) / W;
	const int s0 = warp * spw;
	const int64_t tiles = (a.rows + 15) >> 4;
	/* this block's tiles (pair: two per unit of 16 gate rows) */
	const int ntile = (int)(((a.pair ? tiles / 2 : tiles) - blockIdx.x + gridDim.x - 1) / gridDim.x) * (a.pair ? 2 : 1);
	const int nitems = ntile * spw;
	const size_t rowb = (size_t)a.K / 2;
	const int spr = F == GM_NVFP4 ? a.K / 16 : a.K / 32;
	float *red = reinterpret_cast<float *>(sm + (size_t)2 * a.M * cs); /* [2][warps][M][16] */

	uint4 qa[D], qb[D];
	uint32_t ca[D], cb[D];
	/* The load cursor walks this block's items in order: (tile blockIdx.x + i * gridDim.x, step
	 * s0 + j) for j < spw, with pointers advanced in place (no divisions in the loop). Chunks past
	 * k1 (and steps past the range) load as zero codes with zero scales: their staged x is zero
	 * too, and a NaN scale byte of the next row stays out. Rows past the end read the last row;
	 * their sums are never stored. */
	int nvalid = 0; /* this lane's steps of a tile that hold data */
	for (int j = 0; j < spw; j++)
		nvalid += s0 + j < nsteps && k0 + 32 * (4 * (s0 + j) + t) < k1;
	const int64_t tile_rows = (int64_t)16 * gridDim.x;
	int64_t l_r0 = (int64_t)blockIdx.x * 16;
	int l_sit = 0, l_par = 0;
	const uint8_t *pa, *pb, *qsa, *qsb;
	/* probe >= 2 (benchmarks, results garbage): the same bytes read as if tiles were stored
	 * step-major with each warp step's 1 KB (and its scales) contiguous */
	auto aim = [&]() { /* pointers for the tile at l_r0, step s0 */
		const int64_t ra = min(l_r0 + g, a.rows - 1), rb = min(l_r0 + g + 8, a.rows - 1);
		const int c = (k0 >> 5) + 4 * s0 + t;
		if (a.probe >= 2 && (a.K & 127) == 0) {
			const size_t at = (size_t)(min(l_r0, a.rows - 1) >> 4) * (a.K >> 7) + (size_t)((k0 >> 7) + s0);
			pa = data + at * 1024 + lane * 32;
			pb = pa + 16;
			qsa = scales + at * (F == GM_NVFP4 ? 128 : 64) + lane * (F == GM_NVFP4 ? 4 : 2);
			qsb = qsa + (F == GM_NVFP4 ? 2 : 1);
			return;
		}
		pa = data + (size_t)ra * rowb + (size_t)c * 16;
		pb = data + (size_t)rb * rowb + (size_t)c * 16;
		qsa = scales + (size_t)ra * spr + (size_t)c * (F == GM_NVFP4 ? 2 : 1);
		qsb = scales + (size_t)rb * spr + (size_t)c * (F == GM_NVFP4 ? 2 : 1);
	};
	aim();
	auto load = [&](int i) {
		if (l_r0 < a.rows && l_sit < nvalid) {
			qa[i] = ld_stream16(pa);
			qb[i] = ld_stream16(pb);
			if (F == GM_NVFP4) {
				ca[i] = ld_stream_u16(qsa);
				cb[i] = ld_stream_u16(qsb);
			} else {
				ca[i] = ld_stream_u8(qsa);
				cb[i] = ld_stream_u8(qsb);
			}
		} else {
			qa[i] = qb[i] = make_uint4(0, 0, 0, 0);
			ca[i] = cb[i] = F == GM_NVFP4 ? 0u : 0x100u; /* MXFP4: flag for a zero scale */
		}
		/* next step: 4 chunks on (the probe's strides read from the parameters: no registers) */
		const bool contig = a.probe >= 2 && (a.K & 127) == 0;
		pa += contig ? 1024 : 64, pb += contig ? 1024 : 64;
		qsa += contig ? (F == GM_NVFP4 ? 128 : 64) : (F == GM_NVFP4 ? 8 : 4);
		qsb += contig ? (F == GM_NVFP4 ? 128 : 64) : (F == GM_NVFP4 ? 8 : 4);
		if (++l_sit == spw) {
			l_sit = 0;
			if (a.pair) { /* gate tile -> its up tile -> the next unit's gate tile */
				l_r0 += l_par ? tile_rows - a.rows / 2 : a.rows / 2;
				l_par ^= 1;
			} else {
				l_r0 += tile_rows;
			}
			aim();
		}
	};
#pragma unroll
	for (int i = 0; i < D; i++)
		load(i);
	/* L2 prefetch of tile i of this block: each row's [k0, k1) codes (16 lanes, one row each)
	 * and, when the block covers whole rows, the tile's scales (contiguous; the ends rounded
	 * inwards to 16 bytes, the loads fetch the rest). Issued before pdl_wait: weights depend on
	 * no earlier kernel, so with PDL they stream while the previous kernel finishes. */
	auto l2_tile = [&](int i) {
		const int64_t r0 = ((int64_t)blockIdx.x + (int64_t)i * gridDim.x) * 16;
		if (warp != 0 || r0 >= a.rows)
			return;
		if (lane < 16 && r0 + lane < a.rows)
			gm_l2_prefetch(data + (size_t)(r0 + lane) * rowb + (size_t)k0 / 2, (uint32_t)(k1 - k0) / 2);
		if (lane == 16 && gridDim.y == 1) {
			const int64_t r1 = min(r0 + 16, a.rows);
			const uintptr_t b0 = ((uintptr_t)(scales + (size_t)r0 * spr) + 15) & ~(uintptr_t)15;
			const uintptr_t b1 = (uintptr_t)(scales + (size_t)r1 * spr) & ~(uintptr_t)15;
			if (b1 > b0)
				gm_l2_prefetch((const void *)b0, (uint32_t)(b1 - b0));
		}
	};
	for (int i = 0; i < a.l2pf && i < ntile; i++)
		l2_tile(i);
	pdl_wait(); /* x, y and the workspace belong to the kernels before this one */
	stamp(1);

	/* RMSNorm of x (norm_w): x is staged times the norm weight only, and each token's sum of
	 * squares, taken by the same pass, scales its sums in the epilogue (1 / rms commutes with
	 * the dot product). Every block takes the norm over the whole K itself: the rows are short
	 * and L2-resident, and it saves a separate norm kernel and its launch. */
	__shared__ float s_ss[16];
	__shared__ float s_gate[16 * 16]; /* pair: the gate tile's outputs [token][row] */
	if (a.norm_w) {
		if (threadIdx.x < 16)
			s_ss[threadIdx.x] = 0.0f;
		__syncthreads();
		if (gridDim.y > 1) {
			/* this block stages part of K only: the sums of squares take a pass of their own */
			const int q4 = a.K / 4, tot4 = M * q4;
#pragma unroll 4
			for (int base = 0; base < tot4; base += W * 32) {
				const int it = base + threadIdx.x;
				int tok = -1;
				float ssq = 0.0f;
				if (it < tot4) {
					tok = it / q4;
					const float4 v = __ldg(reinterpret_cast<const float4 *>(xin + (size_t)tok * a.K) + (it - tok * q4));
					ssq = v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
				}
				gm_add_ss(s_ss, tok, ssq, q4 >= 32);
			}
		}
	}
	/* stage x[M][k0..k0 + 128 * nsteps) (gm_stage) */
	gm_stage<W * 32>(a, sm, cs, M, k0, k1, nch, xin, goff, s_ss, a.norm_w && gridDim.y == 1, threadIdx.x);
	__syncthreads();
	stamp(2);

	const uint8_t *xcol[NG];
	gm_xcols<NG>(xcol, sm, cs, M, g);
	float acc[NG][4];
#pragma unroll
	for (int gg = 0; gg < NG; gg++)
		acc[gg][0] = acc[gg][1] = acc[gg][2] = acc[gg][3] = 0.0f;

	int sit = 0, tile_it = 0; /* step within the tile, tile count */
	for (int q0 = 0; q0 < nitems; q0 += D) {
#pragma unroll
		for (int i = 0; i < D; i++) {
			const int q = q0 + i;
			if (q >= nitems)
				break;
			const int s = s0 + sit;
			const uint4 wqa = qa[i], wqb = qb[i];
			const uint32_t cai = ca[i], cbi = cb[i];
			load(i);
			if (s < nsteps && (a.probe == 1 || a.probe == 2)) {
				/* bandwidth probe (benchmarks only): the same loads, no decode or MMA */
				acc[0][0] += __uint_as_float((wqa.x ^ wqa.y ^ wqa.z ^ wqa.w ^ wqb.x ^ wqb.y ^ wqb.z ^ wqb.w ^
				                              cai ^ cbi) & 0x007FFFFFu);
			} else if (s < nsteps) {
				gm_step<F, NG>(acc, wqa, wqb, cai, cbi, a.ec, xcol, 4 * s + t);
			}
			if (++sit < spw)
				continue;
			/* end of a tile: warps' partials -> red[parity][warp][token][row], one barrier,
			 * then one thread per (token, row) sums the warps in order */
			sit = 0;
			float *rp = red + (size_t)(tile_it & 1) * W * a.M * 16;
#pragma unroll
			for (int gg = 0; gg < NG; gg++) {
				const int tok = 4 * gg + t;
				if (tok < M) {
					rp[(warp * a.M + tok) * 16 + g] = acc[gg][0] + acc[gg][1];
					rp[(warp * a.M + tok) * 16 + g + 8] = acc[gg][2] + acc[gg][3];
				}
				acc[gg][0] = acc[gg][1] = acc[gg][2] = acc[gg][3] = 0.0f;
			}
			__syncthreads();
			const int par = tile_it & 1; /* pair: 0 gate tile, 1 up tile */
			const int64_t tile = a.pair ? (int64_t)blockIdx.x + (int64_t)(tile_it >> 1) * gridDim.x + (par ? tiles / 2 : 0)
			                            : (int64_t)blockIdx.x + (int64_t)tile_it * gridDim.x;
			tile_it++;
			if (a.l2pf)
				l2_tile(tile_it - 1 + a.l2pf);
			const int tid = threadIdx.x, tok = tid >> 4, r = tid & 15;
			const int64_t row = tile * 16 + r;
			const bool mine = tok < M && row < a.rows;
			float v = 0.0f;
			if (mine)
				for (int w = 0; w < W; w++)
					v += rp[(w * a.M + tok) * 16 + r];
			if (gridDim.y > 1) {
				/* split K: leave the partial; the block that arrives last sums all in order */
				if (mine)
					a.ws[((size_t)blockIdx.y * a.M + tok) * a.rows + row] = v;
				__syncthreads();
				if (tid == 0)
					last = fp4s_arrive(&a.cnt[tile]) == gridDim.y - 1;
				__syncthreads();
				if (last) {
					if (mine) {
						v = 0.0f;
						for (unsigned ks = 0; ks < gridDim.y; ks++)
							v += __ldcg(&a.ws[((size_t)ks * a.M + tok) * a.rows + row]);
					}
					if (tid == 0)
						a.cnt[tile] = 0; /* ready for the next launch */
				}
				if (!last)
					continue;
			}
			if (mine) {
				float out = ldexpf(v, a.pexp) * post;
				if (a.norm_w)
					out *= 1.0f / sqrtf(s_ss[tok] / (float)a.K + a.eps);
				if (bias)
					out += bias[row];
				if (a.pair) {
					/* the same thread holds (token, row r) of the gate tile and of its up tile */
					if (!par) {
						s_gate[tok * 16 + r] = out;
						continue;
					}
					const float gv = s_gate[tok * 16 + r];
					out = silu_mul(gv, out); /* as swiglu_kernel */
					yout[(size_t)tok * (a.rows / 2) + (row - a.rows / 2)] = out;
					continue;
				}
				float *yp = yout + (size_t)tok * a.rows + row;
				*yp = a.accumulate ? *yp + out : out;
			}
		}
	}
	stamp(3);
	if (a.cw) {
		/* the combine: blocks of every slot with this blockIdx.x covered the same row tiles;
		 * the last of them to finish (one fence and counter a block, not a tile) sums the
		 * slots' rows in slot order, as moe.cu's combine kernel, and adds them into h */
		__syncthreads();
		if (threadIdx.x == 0)
			last = fp4s_arrive(&a.cnt[blockIdx.x]) == gridDim.z - 1;
		__syncthreads();
		if (!last)
			return;
		gm_combine_rows<W * 32>(a);
	}
}

/* Benchmarks: where launches of gm_run leave their blocks' timestamps (fp4s_gemv_mma_stamps). */
static struct {
	unsigned long long *buf;
	int slots, blocks, next;
} gm_stamp;

extern "C" void fp4s_gemv_mma_stamps(unsigned long long *buf, int slots, int blocks)
{
	gm_stamp.buf = buf;
	gm_stamp.slots = slots;
	gm_stamp.blocks = blocks;
	gm_stamp.next = 0;
}

/* The split-K workspace and tile counters, one set per device, allocated outside graph capture. */
static pthread_mutex_t gm_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	float *ws;
	unsigned *cnt;
	int sms;
	int cc; /* compute capability major */
	int ready;
} gm_dev[64];

template <int F, int NG, int W, int D>
static cudaError_t gm_attr(void)
{
	return cudaFuncSetAttribute(gemv_mma_kernel<F, NG, W, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
	                            GM_SMEM_MAX);
}

template <int F>
static cudaError_t gm_attrs(void)
{
	cudaError_t e = gm_attr<F, 1, 8, 4>();
	if (e == cudaSuccess)
		e = gm_attr<F, 2, 8, 4>();
	if (e == cudaSuccess)
		e = gm_attr<F, 4, 8, 4>();
	if (e == cudaSuccess)
		e = gm_attr<F, 1, 8, 8>();
	if (e == cudaSuccess)
		e = gm_attr<F, 1, 4, 4>();
	if (e == cudaSuccess)
		e = gm_attr<F, 1, 4, 8>();
	if (e == cudaSuccess)
		e = gm_attr<F, 1, 16, 4>();
	return e;
}

/* Per-device setup (shared-memory limit, workspace); 1 when ready, 0 when it could not be done
 * now (inside a stream capture). */
static int gm_setup(cudaStream_t s, int *dev_out, struct fp4s_error *err, int *rc)
{
	int dev;
	*rc = FP4S_OK;
	if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
		return 0;
	*dev_out = dev;
	pthread_mutex_lock(&gm_lock);
	int ready = gm_dev[dev].ready;
	if (!ready) {
		cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
		if (cudaStreamIsCapturing(s, &cap) == cudaSuccess && cap == cudaStreamCaptureStatusNone) {
			cudaError_t e = cudaDeviceGetAttribute(&gm_dev[dev].sms, cudaDevAttrMultiProcessorCount, dev);
			if (e == cudaSuccess)
				e = cudaDeviceGetAttribute(&gm_dev[dev].cc, cudaDevAttrComputeCapabilityMajor, dev);
			if (e == cudaSuccess && gm_dev[dev].cc >= 9)
				e = gm_tma_attrs();
			if (e == cudaSuccess)
				e = gm_attrs<GM_NVFP4>();
			if (e == cudaSuccess)
				e = gm_attrs<GM_MXFP4>();
			if (e == cudaSuccess)
				e = cudaMalloc((void **)&gm_dev[dev].ws, (size_t)GM_WS_FLOATS * sizeof(float));
			if (e == cudaSuccess)
				e = cudaMalloc((void **)&gm_dev[dev].cnt, (size_t)(GM_CNT + 2) * sizeof(unsigned));
			if (e == cudaSuccess)
				e = cudaMemset(gm_dev[dev].cnt, 0, (size_t)(GM_CNT + 2) * sizeof(unsigned));
			if (e != cudaSuccess) {
				*rc = fp4s_error_set(err, FP4S_ECUDA, "gemv setup: %s", cudaGetErrorString(e));
			} else {
				gm_dev[dev].ready = ready = 1;
			}
		}
	}
	pthread_mutex_unlock(&gm_lock);
	return ready;
}

extern "C" int fp4s_gemv_mma_setup(cudaStream_t s, struct fp4s_error *err)
{
	int dev, rc;
	if (!gm_setup(s, &dev, err, &rc) && !rc)
		return fp4s_error_set(err, FP4S_EINVAL, "gemv setup: called inside a stream capture");
	return rc;
}

/* Launches variant `var` (0: 8 warps, 4 steps in flight; 1: 8/8; 2: 4/4; 3: 4/8; 4: 16/4, one
 * block an SM, so each SM stages the activations once and the row tiles are shared out in
 * half the blocks; the others exist for M <= 4 only) with blocks enough for every SM to hold as
 * many as fit. */
template <int F, int NG, int W, int D>
static cudaError_t gm_go(gm_args a, int64_t units, int per_z, int ks, int nz, int sms, size_t smem, cudaStream_t s)
{
	int per_sm = 0;
	cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_mma_kernel<F, NG, W, D>, W * 32, smem);
	if (e != cudaSuccess)
		return e;
	if (per_sm < 1)
		return cudaErrorInvalidConfiguration;
	/* persistent blocks strided over the row tiles; the K blocks and expert slots share them */
	int64_t bx = ((int64_t)per_sm * sms + (int64_t)ks * nz - 1) / ((int64_t)ks * nz);
	(void)per_z;
	bx = bx < 1 ? 1 : bx > units ? units : bx;
	struct pdl_launch l;
	return cudaLaunchKernelEx(pdl_cfg(&l, dim3((unsigned)bx, (unsigned)ks, (unsigned)nz), dim3(W * 32), smem, s, 1),
	                          gemv_mma_kernel<F, NG, W, D>, a);
}

template <int F>
static cudaError_t gm_launch(const gm_args &a, int64_t tiles, int ks, int nz, int sms, int var, cudaStream_t s,
                             size_t (*smem_of)(int, int, int))
{
	if (a.M <= 4) {
		switch (var) {
		case 1: return gm_go<F, 1, 8, 8>(a, tiles, 0, ks, nz, sms, smem_of(a.M, a.kb, 8), s);
		case 2: return gm_go<F, 1, 4, 4>(a, tiles, 0, ks, nz, sms, smem_of(a.M, a.kb, 4), s);
		case 3: return gm_go<F, 1, 4, 8>(a, tiles, 0, ks, nz, sms, smem_of(a.M, a.kb, 4), s);
		case 4:
			if (smem_of(a.M, a.kb, 16) <= GM_SMEM_MAX)
				return gm_go<F, 1, 16, 4>(a, tiles, 0, ks, nz, sms, smem_of(a.M, a.kb, 16), s);
			return gm_go<F, 1, 8, 4>(a, tiles, 0, ks, nz, sms, smem_of(a.M, a.kb, 8), s);
		default: return gm_go<F, 1, 8, 4>(a, tiles, 0, ks, nz, sms, smem_of(a.M, a.kb, 8), s);
		}
	}
	if (a.M <= 8)
		return gm_go<F, 2, 8, 4>(a, tiles, 0, ks, nz, sms, smem_of(a.M, a.kb, 8), s);
	return gm_go<F, 4, 8, 4>(a, tiles, 0, ks, nz, sms, smem_of(a.M, a.kb, 8), s);
}

static size_t gm_smem(int M, int kb, int w)
{
	return (size_t)2 * M * gm_col_stride(kb / 32) + (size_t)2 * w * M * 16 * sizeof(float);
}

/* The kernel the plan chose: the bulk-copy one where gm_tma_plan gave a.stages, else the register
 * kernel of the format. */
static cudaError_t gm_launch_planned(const gm_args &a, int nv, int64_t tiles, int ks, int nz, int sms, int var,
                                     cudaStream_t s)
{
	if (a.stages)
		return gm_tma_launch(a, nv, sms, nz, s);
	return nv ? gm_launch<GM_NVFP4>(a, tiles, ks, nz, sms, var, s, gm_smem)
	          : gm_launch<GM_MXFP4>(a, tiles, ks, nz, sms, var, s, gm_smem);
}

/* The BF16 scale offset C and the epilogue factors (see the header comment); nonzero when MXFP4
 * scales span more than BF16 can hold exactly (or were not measured). */
int gm_scale_params(int nv, float ws2, int32_t e8_range, uint32_t *ec, int *pexp, float *post)
{
	if (nv) {
		*ec = 0;
		*pexp = 126 - GM_NV_C;
		*post = ws2;
		return 0;
	}
	/* C = 254 - e_max keeps every scaled code large (no FP32 underflow in the MMA) and the
	 * smallest still exact in BF16 when e_max - e_min <= 133 */
	if (!e8_range)
		return 1;
	const int lo = (e8_range - 1) & 0xFF, hi = ((e8_range - 1) >> 8) & 0xFF;
	if (hi >= 255 || hi - lo > 133)
		return 1;
	*ec = (uint32_t)(254 - hi);
	*pexp = 126 - (int)*ec;
	*post = 1.0f;
	return 0;
}

/* FP4S_GEMV_TMA: 0 = never the bulk-copy kernel (gemv_tma.cu), 1 = it with tiles strided over the
 * blocks, 2 (default) = it with tiles after the first round claimed from a counter */
static int gm_tma_mode(void)
{
	static int tma = -1;
	if (tma < 0) {
		const char *e = getenv("FP4S_GEMV_TMA");
		tma = e ? atoi(e) : 2;
		tma = tma < 0 || tma > 2 ? 2 : tma;
	}
	return tma;
}

static int gm_run(const struct fp4s_mat *w, const float *x, int32_t M, float *y, int accumulate, int kblocks,
                  int variant, int probe, int l2pf, int act, const float *norm_w, float eps, int zero_centred, int pair,
                  struct fp4s_gemv_link *lk, cudaStream_t s, struct fp4s_error *err)
{
	const int nv = w->fmt == FP4S_WF_NVFP4;
	if (!nv && w->fmt != FP4S_WF_MXFP4)
		return FP4S_EUNSUPPORTED;
	static int dflt = -1; /* FP4S_GEMV_VARIANT: the variant the decode uses (diagnostics, A/B) */
	if (dflt < 0) {
		const char *e = getenv("FP4S_GEMV_VARIANT");
		dflt = e ? atoi(e) : 0;
		dflt = dflt < 0 || dflt > 4 ? 0 : dflt;
	}
	if (variant == 0)
		variant = dflt;
	const int tma = gm_tma_mode();
	const int64_t K = w->cols;
	if (K % 32 || K > (1 << 30) || w->rows <= 0 || M < 1 || ((uintptr_t)w->data % 16) ||
	    ((uintptr_t)x % 16) || (nv && ((uintptr_t)w->scales % 2)) || !w->scales)
		return FP4S_EUNSUPPORTED;
	uint32_t ec;
	int pexp;
	float post;
	if (gm_scale_params(nv, w->ws2, w->e8_range, &ec, &pexp, &post))
		return FP4S_EUNSUPPORTED;
	int dev = 0, rc;
	const int ready = gm_setup(s, &dev, err, &rc);
	if (rc)
		return rc;
	if (!ready)
		return FP4S_EUNSUPPORTED; /* first use inside a capture: the FP32 kernel runs this time */
	const int64_t tiles = (w->rows + 15) / 16;
	if (tiles > 0x7FFFFFFF)
		return FP4S_EUNSUPPORTED;
	const int nsteps = (int)((K + 127) / 128);
	for (int32_t t0 = 0; t0 < M; t0 += 16) {
		const int m = M - t0 < 16 ? M - t0 : 16;
		/* K split only where the staged activations would not fit (large M x K), or asked for:
		 * blocks loop over row tiles instead, so each keeps loads in flight across tiles. (Splits
		 * that only even out the last round of tiles measured 1.4-2x slower on the H100: each
		 * tile then pays a fence and a counter round trip.) */
		int ks = kblocks > 0 ? kblocks : 1;
		if (ks > nsteps)
			ks = nsteps;
		int kb = (nsteps + ks - 1) / ks * 128;
		while (gm_smem(m, kb, GM_WARPS_MAX) > GM_SMEM_MAX && ks < nsteps) {
			ks++;
			kb = (nsteps + ks - 1) / ks * 128;
		}
		ks = (int)((K + kb - 1) / kb);
		if (gm_smem(m, kb, GM_WARPS_MAX) > GM_SMEM_MAX)
			return FP4S_EUNSUPPORTED;
		if (pair && (ks > 1 || M > 16))
			return FP4S_EUNSUPPORTED; /* (nothing launched yet: one pass) */
		if (ks > 1 && ((int64_t)ks * m * w->rows > GM_WS_FLOATS || tiles > GM_CNT || ks > 65535))
			return FP4S_EUNSUPPORTED;
		gm_args a = {};
		a.data = (const uint8_t *)w->data;
		a.scales = w->scales;
		a.x = x + (size_t)t0 * K;
		a.bias = w->bias;
		a.y = y + (size_t)t0 * (pair ? w->rows / 2 : w->rows);
		a.ws = gm_dev[dev].ws;
		a.cnt = gm_dev[dev].cnt;
		a.rows = w->rows;
		a.K = (int)K;
		a.M = m;
		a.kb = kb;
		a.accumulate = accumulate;
		a.pexp = pexp;
		a.post = post;
		a.ec = ec;
		a.probe = probe;
		a.act = act;
		a.alpha = 1.0f;
		a.limit = INFINITY;
		a.norm_w = norm_w;
		a.eps = eps;
		a.zero_centred = zero_centred;
		a.l2pf = pair ? 0 : l2pf;
		a.pair = pair == 1;
		if (gm_stamp.buf) {
			a.stamps = gm_stamp.buf + (size_t)(gm_stamp.next % gm_stamp.slots) * gm_stamp.blocks * 4;
			gm_stamp.next++;
		}
		if (act)
			a.x = x + (size_t)t0 * 2 * K;
		const int sms = gm_dev[dev].sms;
		/* the bulk-copy kernel where it applies (gemv_tma.cu), unless a variant, a probe or an
		 * L2 prefetch was asked for (benchmarks) */
		a.stages = tma && gm_dev[dev].cc >= 9 && ks == 1 && pair != 1 && !probe && !a.l2pf && variant == 0
		                   ? gm_tma_plan(nv, K, m, &a)
		                   : 0;
		if (pair == 2) {
			if (!a.stages) /* the bulk-copy kernel's epilogue alone (M <= 16: one pass, nothing launched) */
				return FP4S_EUNSUPPORTED;
			a.pairact = 2;
		}
		if (a.stages)
			a.claim = tma == 2 ? gm_dev[dev].cnt + GM_CNT : NULL;
		if (lk && a.stages && M == 1 && !a.tprobe) {
			/* staged activations in (x plain or normalized, not SwiGLU's input) and out (the
			 * pairs' SwiGLU, or the rows after the add; whole tiles for the sums of squares) */
			if (lk->in && !act && K % 128 == 0 && (!norm_w || lk->in_ss)) {
				a.st_in = lk->in;
				a.st_ss = norm_w ? lk->in_ss : NULL;
				lk->used_in = 1;
			}
			const int64_t n_out = pair == 2 ? w->rows / 2 : w->rows;
			if (lk->out && lk->out != lk->in && n_out % 128 == 0 && (!lk->out_nw || (pair != 2 && lk->out_ss))) {
				a.st_out = lk->out;
				a.st_nw = lk->out_nw;
				a.st_ssout = lk->out_nw ? lk->out_ss : NULL;
				a.st_zc = lk->out_zc;
				lk->made_out = 1;
			}
		}
		FP4S_CUDA_TRY(err, gm_launch_planned(a, nv, tiles, ks, 1, sms, variant, s));
	}
	return FP4S_OK;
}

extern "C" int fp4s_gemv_mma_experts(const struct fp4s_stacked *w, const int32_t *idx, int32_t n_slots,
                                     const float *x, int32_t x_div, int64_t x_stride, int act, float alpha,
                                     float limit, float *y, cudaStream_t s, struct fp4s_error *err)
{
	return fp4s_gemv_mma_experts_ex(w, idx, n_slots, x, x_div, x_stride, act, alpha, limit, NULL, 0.0f, 0, NULL,
	                                NULL, y, s, err);
}

static int gm_experts(const struct fp4s_stacked *w, const int32_t *idx, int32_t n_slots, const float *x, int32_t x_div,
                      int64_t x_stride, int act, float alpha, float limit, const float *norm_w, float eps,
                      int zero_centred, const float *cw, float *ch, float *y, int pairact, cudaStream_t s,
                      struct fp4s_error *err);

extern "C" int fp4s_gemv_mma_experts_ex(const struct fp4s_stacked *w, const int32_t *idx, int32_t n_slots,
                                        const float *x, int32_t x_div, int64_t x_stride, int act, float alpha,
                                        float limit, const float *norm_w, float eps, int zero_centred,
                                        const float *cw, float *ch, float *y, cudaStream_t s,
                                        struct fp4s_error *err)
{
	return gm_experts(w, idx, n_slots, x, x_div, x_stride, act, alpha, limit, norm_w, eps, zero_centred, cw, ch, y,
	                  0, s, err);
}

extern "C" int fp4s_gemv_mma_experts_pairact(const struct fp4s_stacked *w, const int32_t *idx, int32_t n_slots,
                                            const float *x, int32_t x_div, int64_t x_stride, int kind,
                                            float alpha, float limit, float *y, cudaStream_t s,
                                            struct fp4s_error *err)
{
	if (kind != 1 && kind != 2)
		return FP4S_EUNSUPPORTED;
	return gm_experts(w, idx, n_slots, x, x_div, x_stride, 0, alpha, limit, NULL, 0.0f, 0, NULL, NULL, y, kind, s,
	                  err);
}

static int gm_experts(const struct fp4s_stacked *w, const int32_t *idx, int32_t n_slots, const float *x, int32_t x_div,
                      int64_t x_stride, int act, float alpha, float limit, const float *norm_w, float eps,
                      int zero_centred, const float *cw, float *ch, float *y, int pairact, cudaStream_t s,
                      struct fp4s_error *err)
{
	gm_args a;
	int sms;
	const int rc = gm_expert_args(w, idx, n_slots, x, x_div, x_stride, act, alpha, limit, norm_w, eps, zero_centred,
	                              cw, ch, y, pairact, s, &a, &sms, err);
	if (rc)
		return rc;
	const int64_t tiles = (w->rows + 15) / 16;
	FP4S_CUDA_TRY(err, gm_launch_planned(a, w->fmt == FP4S_WF_NVFP4, tiles, 1, n_slots, sms, 0, s));
	return FP4S_OK;
}

int gm_expert_args(const struct fp4s_stacked *w, const int32_t *idx, int32_t n_slots, const float *x, int32_t x_div,
                   int64_t x_stride, int act, float alpha, float limit, const float *norm_w, float eps,
                   int zero_centred, const float *cw, float *ch, float *y, int pairact, cudaStream_t s, gm_args *out,
                   int *sms_out, struct fp4s_error *err)
{
	const int nv = w->fmt == FP4S_WF_NVFP4;
	if (!nv && w->fmt != FP4S_WF_MXFP4)
		return FP4S_EUNSUPPORTED;
	const int64_t K = w->cols;
	if (K % 32 || K > (1 << 28) || w->rows <= 0 || n_slots < 1 || n_slots > 65535 || x_div < 1 ||
	    ((uintptr_t)w->data % 16) || ((uintptr_t)x % 16) || x_stride % 4 || w->stride_data % 16 ||
	    (nv && ((uintptr_t)w->scales % 2 || w->stride_scales % 2)) || !w->scales || act < 0 || act > 3 ||
	    (norm_w && (act || (uintptr_t)norm_w % 16)) || (!cw != !ch))
		return FP4S_EUNSUPPORTED;
	uint32_t ec;
	int pexp;
	float post;
	if (gm_scale_params(nv, w->ws2e ? 1.0f : w->ws2, w->e8_range, &ec, &pexp, &post))
		return FP4S_EUNSUPPORTED;
	int dev = 0, rc;
	const int ready = gm_setup(s, &dev, err, &rc);
	if (rc)
		return rc;
	if (!ready)
		return FP4S_EUNSUPPORTED;
	const int64_t tiles = (w->rows + 15) / 16;
	const int nsteps = (int)((K + 127) / 128), kb = nsteps * 128;
	if (gm_smem(1, kb, GM_WARPS_MAX) > GM_SMEM_MAX || (cw && tiles > GM_CNT))
		return FP4S_EUNSUPPORTED;
	gm_args a = {};
	a.data = (const uint8_t *)w->data;
	a.scales = w->scales;
	a.x = x;
	a.bias = w->bias;
	a.y = y;
	a.rows = w->rows;
	a.K = (int)K;
	a.M = 1;
	a.kb = kb;
	a.pexp = pexp;
	a.post = post;
	a.ec = ec;
	a.idx = idx;
	a.stride_data = w->stride_data;
	a.stride_scales = w->stride_scales;
	a.ws2e = w->ws2e;
	a.x_div = x_div;
	a.x_stride = x_stride;
	a.act = act;
	a.alpha = alpha;
	a.limit = limit;
	a.norm_w = norm_w;
	a.eps = eps;
	a.zero_centred = zero_centred;
	a.cw = cw;
	a.ch = ch;
	a.cnt = gm_dev[dev].cnt; /* the combine's counters, one per blockIdx.x */
	a.l2pf = GM_L2PF;
	const int sms = gm_dev[dev].sms;
	if (gm_stamp.buf) {
		a.stamps = gm_stamp.buf + (size_t)(gm_stamp.next % gm_stamp.slots) * gm_stamp.blocks * 4;
		gm_stamp.next++;
	}
	/* the bulk-copy kernel where it applies, its tiles strided (the combine relies on it) */
	a.stages = gm_tma_mode() && gm_dev[dev].cc >= 9 ? gm_tma_plan(nv, K, 1, &a) : 0;
	if (pairact) {
		/* the paired SwiGLU epilogue is the bulk-copy kernel's alone; whole tiles of pairs */
		if (!a.stages || w->rows % 16 || act || norm_w || cw)
			return FP4S_EUNSUPPORTED;
		a.pairact = pairact;
	}
	*out = a;
	*sms_out = sms;
	return FP4S_OK;
}

extern "C" int fp4s_gemv_mma_allowed(void)
{
	/* FP4S_GEMV_KERNEL=fp32 keeps FP4 on the FP32 kernels and unfused ops (diagnostics) */
	static int allowed = -1;
	if (allowed < 0) {
		const char *ev = getenv("FP4S_GEMV_KERNEL");
		allowed = !(ev && !strcmp(ev, "fp32"));
	}
	return allowed;
}

extern "C" int fp4s_gemv_mma_ex(const struct fp4s_mat *w, const float *x, int32_t M, float *y, int accumulate,
                                int kblocks, int variant, int probe, int l2pf, cudaStream_t s,
                                struct fp4s_error *err)
{
	return gm_run(w, x, M, y, accumulate, kblocks, variant, probe, l2pf < 0 ? GM_L2PF : l2pf, 0, NULL, 0.0f, 0, 0,
	              NULL, s, err);
}

extern "C" int fp4s_gemv_mma(const struct fp4s_mat *w, const float *x, int32_t M, float *y, int accumulate,
                             int kblocks, cudaStream_t s, struct fp4s_error *err)
{
	return gm_run(w, x, M, y, accumulate, kblocks, 0, 0, GM_L2PF, 0, NULL, 0.0f, 0, 0, NULL, s, err);
}

extern "C" int fp4s_gemv_mma_fused(const struct fp4s_mat *w, const float *x, int32_t M, float *y, int accumulate,
                                   int act, const float *norm_w, float eps, int zero_centred, cudaStream_t s,
                                   struct fp4s_error *err)
{
	if (act < 0 || act > 1 || (act && norm_w) || (norm_w && ((uintptr_t)norm_w % 16 || M > 16)))
		return FP4S_EUNSUPPORTED;
	return gm_run(w, x, M, y, accumulate, 0, 0, 0, GM_L2PF, act, norm_w, eps, zero_centred, 0, NULL, s, err);
}

extern "C" int fp4s_gemv_mma_fused_link(const struct fp4s_mat *w, const float *x, int32_t M, float *y,
                                        int accumulate, const float *norm_w, float eps, int zero_centred,
                                        struct fp4s_gemv_link *lk, cudaStream_t s, struct fp4s_error *err)
{
	if (norm_w && ((uintptr_t)norm_w % 16 || M > 16))
		return FP4S_EUNSUPPORTED;
	return gm_run(w, x, M, y, accumulate, 0, 0, 0, GM_L2PF, 0, norm_w, eps, zero_centred, 0, lk, s, err);
}

extern "C" int fp4s_gemv_mma_norm_swiglu(const struct fp4s_mat *w, const float *x, int32_t M, float *y,
                                         const float *norm_w, float eps, int zero_centred, cudaStream_t s,
                                         struct fp4s_error *err)
{
	if (w->rows % 32 || w->bias)
		return FP4S_EUNSUPPORTED;
	return gm_run(w, x, M, y, 0, 0, 0, 0, 0, 0, norm_w, eps, zero_centred, 1, NULL, s, err);
}

extern "C" int fp4s_gemv_mma_norm_pairs(const struct fp4s_mat *w, const float *x, int32_t M, float *y,
                                        const float *norm_w, float eps, int zero_centred, cudaStream_t s,
                                        struct fp4s_error *err)
{
	if (!w->pairs || w->rows % 16 || M < 1 || M > 16 || (norm_w && (uintptr_t)norm_w % 16))
		return FP4S_EUNSUPPORTED;
	return gm_run(w, x, M, y, 0, 0, 0, 0, 0, 0, norm_w, eps, zero_centred, 2, NULL, s, err);
}

extern "C" int fp4s_gemv_mma_norm_pairs_link(const struct fp4s_mat *w, const float *x, int32_t M, float *y,
                                             const float *norm_w, float eps, int zero_centred,
                                             struct fp4s_gemv_link *lk, cudaStream_t s, struct fp4s_error *err)
{
	if (!w->pairs || w->rows % 16 || M < 1 || M > 16 || (norm_w && (uintptr_t)norm_w % 16))
		return FP4S_EUNSUPPORTED;
	return gm_run(w, x, M, y, 0, 0, 0, 0, 0, 0, norm_w, eps, zero_centred, 2, lk, s, err);
}

extern "C" int fp4s_gemv_mma_group_max(const struct fp4s_stacked *gu, const struct fp4s_stacked *down)
{
	for (int m = 8; m >= 1; m /= 2)
		if (gm_smem(m, (int)((gu->cols + 127) / 128 * 128), GM_WARPS_MAX) <= GM_SMEM_MAX &&
		    gm_smem(m, (int)((down->cols + 127) / 128 * 128), GM_WARPS_MAX) <= GM_SMEM_MAX)
			return m;
	return 0;
}

extern "C" int fp4s_gemv_mma_grouped(const struct fp4s_stacked *w, const int32_t *g_expert, const int32_t *g_off,
                                     const int32_t *g_m, int32_t n_groups, int32_t gmax, const float *x,
                                     const int32_t *xrow, int64_t x_stride, int act, float alpha, float limit,
                                     float *y, cudaStream_t s, struct fp4s_error *err)
{
	const int nv = w->fmt == FP4S_WF_NVFP4;
	if (!nv && w->fmt != FP4S_WF_MXFP4)
		return FP4S_EUNSUPPORTED;
	const int64_t K = w->cols;
	if (K % 32 || K > (1 << 28) || w->rows <= 0 || n_groups < 1 || n_groups > 65535 || gmax < 1 || gmax > 8 ||
	    ((uintptr_t)w->data % 16) || ((uintptr_t)x % 16) || x_stride % 4 || w->stride_data % 16 ||
	    (nv && ((uintptr_t)w->scales % 2 || w->stride_scales % 2)) || !w->scales || act < 0 || act > 3 ||
	    (act && xrow))
		return FP4S_EUNSUPPORTED;
	uint32_t ec;
	int pexp;
	float post;
	if (gm_scale_params(nv, w->ws2e ? 1.0f : w->ws2, w->e8_range, &ec, &pexp, &post))
		return FP4S_EUNSUPPORTED;
	int dev = 0, rc;
	const int ready = gm_setup(s, &dev, err, &rc);
	if (rc)
		return rc;
	if (!ready)
		return FP4S_EUNSUPPORTED;
	const int64_t tiles = (w->rows + 15) / 16;
	const int nsteps = (int)((K + 127) / 128), kb = nsteps * 128;
	if (gm_smem(gmax, kb, GM_WARPS_MAX) > GM_SMEM_MAX)
		return FP4S_EUNSUPPORTED;
	gm_args a = {};
	a.data = (const uint8_t *)w->data;
	a.scales = w->scales;
	a.x = x;
	a.bias = w->bias;
	a.y = y;
	a.rows = w->rows;
	a.K = (int)K;
	a.M = gmax;
	a.kb = kb;
	a.pexp = pexp;
	a.post = post;
	a.ec = ec;
	a.stride_data = w->stride_data;
	a.stride_scales = w->stride_scales;
	a.ws2e = w->ws2e;
	a.x_div = 1;
	a.x_stride = x_stride;
	a.act = act;
	a.alpha = alpha;
	a.limit = limit;
	a.g_expert = g_expert;
	a.g_off = g_off;
	a.g_m = g_m;
	a.xrow = xrow;
	a.l2pf = GM_L2PF;
	const int sms = gm_dev[dev].sms;
	/* the bulk-copy kernel where it applies (FP4S_GEMV_TMA_GROUPED=0: not for this form) */
	static int tg = -1;
	if (tg < 0) {
		const char *ev = getenv("FP4S_GEMV_TMA_GROUPED");
		tg = !(ev && !strcmp(ev, "0"));
	}
	a.stages = tg && gm_tma_mode() && gm_dev[dev].cc >= 9 ? gm_tma_plan(nv, K, gmax, &a) : 0;
	FP4S_CUDA_TRY(err, gm_launch_planned(a, nv, tiles, 1, n_groups, sms, 0, s));
	return FP4S_OK;
}

/* E8M0 range of a device scale array: min and max byte */
static __global__ void e8_range_kernel(const uint8_t *s, int64_t n, unsigned *mm)
{
	unsigned lo = 255, hi = 0;
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		const unsigned v = s[i];
		lo = v < lo ? v : lo;
		hi = v > hi ? v : hi;
	}
	for (int o = 16; o; o >>= 1) {
		lo = min(lo, __shfl_xor_sync(0xFFFFFFFFu, lo, o));
		hi = max(hi, __shfl_xor_sync(0xFFFFFFFFu, hi, o));
	}
	if ((threadIdx.x & 31) == 0) {
		atomicMin(&mm[0], lo);
		atomicMax(&mm[1], hi);
	}
}

static int mx_range(const uint8_t *scales, int64_t n, int32_t *out, cudaStream_t s, struct fp4s_error *err)
{
	unsigned init[2] = {255, 0}, mm[2];
	unsigned *d = NULL;
	FP4S_CUDA_TRY(err, cudaMalloc((void **)&d, sizeof init));
	cudaError_t e = cudaMemcpyAsync(d, init, sizeof init, cudaMemcpyHostToDevice, s);
	if (e == cudaSuccess) {
		const int64_t blocks = (n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024;
		e8_range_kernel<<<(unsigned)(blocks > 0 ? blocks : 1), 256, 0, s>>>(scales, n, d);
		e = cudaGetLastError();
	}
	if (e == cudaSuccess)
		e = cudaMemcpyAsync(mm, d, sizeof mm, cudaMemcpyDeviceToHost, s);
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(s);
	cudaFree(d);
	FP4S_CUDA_TRY(err, e);
	*out = n > 0 ? (int32_t)(1 + mm[0] + 256 * mm[1]) : 0;
	return FP4S_OK;
}

extern "C" int fp4s_cuda_mx_scale_range(struct fp4s_mat *w, cudaStream_t s, struct fp4s_error *err)
{
	if (w->fmt != FP4S_WF_MXFP4 || !w->scales)
		return FP4S_OK;
	return mx_range(w->scales, w->rows * (w->cols / 32), &w->e8_range, s, err);
}

extern "C" int fp4s_cuda_mx_scale_range_stacked(struct fp4s_stacked *w, int32_t n_experts, cudaStream_t s,
                                                struct fp4s_error *err)
{
	if (w->fmt != FP4S_WF_MXFP4 || !w->scales)
		return FP4S_OK;
	/* the stack is contiguous at stride_scales per expert: measure the whole span */
	return mx_range(w->scales, w->stride_scales * (n_experts - 1) + w->rows * (w->cols / 32), &w->e8_range, s,
	                err);
}
