/* attention_prefill.cu: flash attention (FlashAttention-2 style) for the prompt tokens of a
 * flattened batch, over the paged BF16 or FP8 (E4M3) KV cache, on tensor cores (mma.sync
 * m16n8k16 BF16, FP32 accumulate: sm_80 and later). GQA, causal mask by absolute position,
 * sliding window, per-head sinks (architectures.md §1.5); the same function as
 * fp4s_cuda_attention, for batches with many tokens per sequence.
 *
 * Work split. A tile is up to T consecutive batch tokens of one sequence; the block of a (tile,
 * KV head) computes BM = 64 query rows, row r = token (r / G) x query head (r % G) of the G heads
 * that share the KV head (T = 64 / G tokens: 16 for llama3, 8 for gpt-oss and qwen3-moe), so each
 * K/V tile read serves the whole group; batches big enough to fill the GPU twice over get
 * BM = 128 rows (ap_default_mt). A small planning kernel cuts the batch into tiles on the
 * device (a new tile every T tokens and at every change of sequence), so any mix of prompt chunks
 * and decode tokens is handled and the launches depend on n alone (graph-capturable). Blocks take
 * tiles last-first: the last tokens of a prompt have the most keys, and starting them first
 * shortens the causal tail. A block loops when a batch has more tiles than the grid has slots.
 *
 * Per block: 4 warps of 16 (or 32) rows. Q is read once (FP32 -> BF16, RNE) and kept in registers
 * as MMA A fragments (at d 128 with 32 rows per warp, in shared memory, read once per key tile). Keys are walked in tiles of BN = 64 positions aligned to multiples of 64; K and V
 * tiles are copied with cp.async through the block table into a 2-stage shared-memory ring
 * (row = one position's d values, 16-byte chunks XOR-swizzled by row & 7 so the ldmatrix reads
 * are conflict-free; positions outside [first key, last key] are zero-filled, never read). Per
 * key tile each warp computes S = Q K^T (ldmatrix + MMA), masks it where the tile is not wholly
 * visible to every row (causal: key <= pos; window: key > pos - window), updates its rows'
 * running max and sum in FP32 (log2 domain, ex2.approx), rescales its output accumulators and
 * adds P V (P from the S registers packed to BF16: the C fragment of two 8-key MMAs is the A
 * fragment of one 16-key MMA; V through ldmatrix.trans). Key columns past the tile's last
 * position are skipped in whole MMAs. At the end the sum is reduced over the quad and the sink,
 * if any, joins the denominator as a key with a zero value vector.
 *
 * FP8 cache: the same kernel with E4M3 tiles. Each thread cp.asyncs its own 8-byte chunks of the
 * next tile (the 8 elements of a row the BF16 kernel copies as 16 bytes) into a staging area of
 * its own, and once they have landed turns them into BF16 (exact: kv_fp8.cuh) at the place in
 * the swizzled stage where the BF16 kernel's copy would have put them; everything after that is
 * the BF16 kernel's. Only the thread that copied a chunk reads it, so the staging needs no
 * barrier; a stage is filled one tile ahead, behind the loop's barrier, like the BF16 cp.async. */
#include <math.h>

#include <cuda_bf16.h>

#include "backend/backend.h"
#include "backend/cuda/attention_prefill_cuda.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/kv_fp8.cuh"

#define AP_THREADS 128 /* 4 warps */
#define AP_MAX_G 64    /* query heads per KV head: at most the rows of a block */
#define AP_SLACK 32    /* grid slots beyond ceil(n / T): tiles cut at sequence changes */
#define PLAN_THREADS 1024

static_assert(FP4S_KV_BLOCK == 16, "the loader splits positions as block * 16 + row");

static __device__ __forceinline__ uint32_t ap_smem_u32(const void *p)
{
	return (uint32_t)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void ap_cp_async16(uint32_t dst, const void *src, int src_bytes)
{
	/* src_bytes = 0 zero-fills the chunk without reading src */
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
/* 8 bytes (an FP8 chunk; cp.async.cg moves 16 only), src_bytes = 0 zero-fills likewise */
static __device__ __forceinline__ void ap_cp_async8(uint32_t dst, const void *src, int src_bytes)
{
	asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
static __device__ __forceinline__ void ap_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
static __device__ __forceinline__ void ap_cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

static __device__ __forceinline__ void ap_ldmatrix_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                                      uint32_t &r3)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
	             : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
	             : "r"(addr));
}

static __device__ __forceinline__ void ap_ldmatrix_x4_trans(uint32_t addr, uint32_t &r0, uint32_t &r1,
                                                            uint32_t &r2, uint32_t &r3)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
	             : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
	             : "r"(addr));
}

static __device__ __forceinline__ void ap_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
	             "{%8,%9}, {%0,%1,%2,%3};\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ float ap_ex2(float x)
{
	float y;
	asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
	return y;
}

/* two floats -> BF16 (RNE), x in the low half (the lower column of an MMA fragment) */
static __device__ __forceinline__ uint32_t ap_pack_bf16(float x, float y)
{
	const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
	return (uint32_t)__bfloat16_as_ushort(h.x) | (uint32_t)__bfloat16_as_ushort(h.y) << 16;
}

/* the BF16 residuals x - hi.x, y - hi.y of a pair packed by ap_pack_bf16 (exact in FP32) */
static __device__ __forceinline__ uint32_t ap_pack_bf16_lo(float x, float y, uint32_t hi)
{
	return ap_pack_bf16(x - __uint_as_float(hi << 16), y - __uint_as_float(hi & 0xFFFF0000u));
}

/* ---- planning: the batch's tiles -------------------------------------------------------- */

/* inclusive scan over the block (op: 0 sum, 1 max); *total gets the last element's value */
static __device__ int32_t ap_block_scan(int32_t v, int op, int32_t *ws, int32_t *total)
{
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	for (int o = 1; o < 32; o <<= 1) {
		const int32_t t = __shfl_up_sync(0xFFFFFFFFu, v, o);
		if (lane >= o)
			v = op ? max(v, t) : v + t;
	}
	if (lane == 31)
		ws[warp] = v;
	__syncthreads();
	if (warp == 0) {
		int32_t w = lane < nw ? ws[lane] : (op ? INT32_MIN : 0);
		for (int o = 1; o < 32; o <<= 1) {
			const int32_t t = __shfl_up_sync(0xFFFFFFFFu, w, o);
			if (lane >= o)
				w = op ? max(w, t) : w + t;
		}
		if (lane < nw)
			ws[lane] = w;
	}
	__syncthreads();
	if (warp > 0)
		v = op ? max(v, ws[warp - 1]) : v + ws[warp - 1];
	*total = ws[nw - 1];
	__syncthreads();
	return v;
}

/* plan[0] = tile count; plan[1 + k] = first batch token of tile k; plan[1 + count] = n. A tile
 * starts at every change of sequence and every T tokens within a run of one sequence. */
static __global__ void __launch_bounds__(PLAN_THREADS) attn_plan_kernel(const int32_t *__restrict__ seq, int32_t n,
                                                                        int32_t T, int32_t *__restrict__ plan)
{
	__shared__ int32_t ws[32];
	int32_t tiles = 0, run = 0; /* tiles so far; start of the run of the previous chunk's last token */
	for (int32_t base = 0; base < n; base += PLAN_THREADS) {
		const int32_t i = base + (int32_t)threadIdx.x;
		const bool in = i < n;
		const bool first = in && (i == 0 || seq[i] != seq[i - 1]);
		int32_t last;
		int32_t s0 = ap_block_scan(first ? i : run, 1, ws, &last);
		const bool start = in && (i - s0) % T == 0;
		int32_t count;
		const int32_t at = ap_block_scan(start ? 1 : 0, 0, ws, &count) - (start ? 1 : 0);
		if (start)
			plan[1 + tiles + at] = i;
		tiles += count;
		run = last;
	}
	if (threadIdx.x == 0) {
		plan[0] = tiles;
		plan[1 + tiles] = n;
	}
}

/* ---- the attention kernel --------------------------------------------------------------- */

/* BF16 elements of shared memory: two stages of [K tile][V tile], BN x D each, and Q as BF16
 * [BM][D]: behind the stages when it stays there (QS), else staged behind stage 0 (stage 1 is
 * not loaded before Q is in registers). An FP8 cache adds its E4M3 staging behind all that: one
 * K and one V tile of bytes, BN x D BF16 elements' worth. */
static __host__ __device__ constexpr int ap_smem_elems(int D, int BN, int MT, bool QS)
{
	return QS ? 4 * BN * D + 64 * MT * D
	          : (4 * BN * D > 2 * BN * D + 64 * MT * D ? 4 * BN * D : 2 * BN * D + 64 * MT * D);
}
static __host__ __device__ constexpr int ap_smem_bytes(int D, int BN, int MT, bool QS, bool F8)
{
	return (ap_smem_elems(D, BN, MT, QS) + (F8 ? BN * D : 0)) * 2;
}

/* D head dim; BN keys per tile; MT m16 row tiles per warp (BM = 64 MT rows per block); QS: Q
 * fragments read from shared memory per key tile instead of held in registers (room for the
 * accumulators of MT = 2 at D = 128); PRECISE: P.V as hi + lo; F8: the cache holds E4M3 */
template <int D, int BN, int MT, bool QS, bool PRECISE, bool F8>
static __global__ void __launch_bounds__(AP_THREADS, 2)
attn_prefill_kernel(const float *__restrict__ q, const void *__restrict__ kc,
                    const void *__restrict__ vc, const int32_t *__restrict__ pos,
                    const int32_t *__restrict__ seq, const int32_t *__restrict__ table, int32_t table_stride,
                    int32_t nh, int32_t nkv, int32_t G, int32_t T, int32_t window,
                    const float *__restrict__ sinks, float sl, const int32_t *__restrict__ plan,
                    float *__restrict__ out)
{
	constexpr int BM = 16 * MT * (AP_THREADS / 32); /* query rows per block */
	constexpr int TILE = BN * D;                    /* BF16 elements of one K or V tile */
	constexpr int CPR = D / 8;                      /* 16-byte chunks per row */
	constexpr int RSTEP = AP_THREADS / CPR;         /* rows one pass of the block copies */
	constexpr int NLD = BN / RSTEP;                 /* passes per tile */
	constexpr int NT = BN / 8;                      /* 8-key MMA columns of S */
	constexpr int DT = D / 8;                       /* 8-dim MMA columns of O */
	static_assert(BN % 16 == 0 && BN % RSTEP == 0 && D % 64 == 0, "tile shape");
	extern __shared__ __align__(16) unsigned char ap_smem[];
	__nv_bfloat16 *sm = (__nv_bfloat16 *)ap_smem; /* stage st: K at st * 2 TILE, V at + TILE */
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int32_t ntiles = plan[0], kvw = nkv * D;
	const int lch = tid % CPR, lr0 = tid / CPR; /* this thread's chunk column and first row */

	for (int32_t L = blockIdx.x; L < ntiles * nkv; L += gridDim.x) {
		const int32_t tile = ntiles - 1 - L / nkv, g0 = L % nkv;
		const int32_t i0 = plan[1 + tile], ntok = plan[2 + tile] - i0;
		const int32_t pmin = pos[i0], pmax = pos[i0 + ntok - 1];
		const int32_t kstart = window > 0 ? max(0, pmin - window + 1) : 0, kend = pmax + 1;
		const int32_t kt0 = kstart / BN * BN;
		const int32_t *trow = table + (size_t)seq[i0] * table_stride;
		const size_t kvo = (size_t)g0 * D + lch * 8; /* this thread's column of the layer's rows */

		/* K/V positions k0 .. k0 + BN - 1 into stage st (zeros outside [kstart, kend)) */
		auto load_tile = [&](int32_t k0, int st) {
#pragma unroll
			for (int i = 0; i < NLD; i++) {
				const int r = lr0 + i * RSTEP;
				const int32_t t = k0 + r;
				const bool ok = t >= kstart && t < kend;
				const size_t off = ok ? ((size_t)trow[(uint32_t)t / 16] * 16 + (uint32_t)t % 16) * kvw : 0;
				const uint32_t so = (uint32_t)(st * 2 * TILE + r * D + ((lch ^ (r & 7)) << 3)) * 2;
				ap_cp_async16(ap_smem_u32(sm) + so, (const __nv_bfloat16 *)kc + kvo + off, ok ? 16 : 0);
				ap_cp_async16(ap_smem_u32(sm) + so + TILE * 2, (const __nv_bfloat16 *)vc + kvo + off, ok ? 16 : 0);
			}
			ap_cp_async_commit();
		};
		/* FP8: the same chunks of positions k0 .. into this thread's staging slots ... */
		const unsigned char *stg = ap_smem + ap_smem_elems(D, BN, MT, QS) * 2 + tid * 8;
		auto fetch8 = [&](int32_t k0) {
#pragma unroll
			for (int i = 0; i < NLD; i++) {
				const int r = lr0 + i * RSTEP;
				const int32_t t = k0 + r;
				const bool ok = t >= kstart && t < kend;
				const size_t off = ok ? ((size_t)trow[(uint32_t)t / 16] * 16 + (uint32_t)t % 16) * kvw : 0;
				ap_cp_async8(ap_smem_u32(stg + 2 * i * AP_THREADS * 8), (const uint8_t *)kc + kvo + off, ok ? 8 : 0);
				ap_cp_async8(ap_smem_u32(stg + (2 * i + 1) * AP_THREADS * 8), (const uint8_t *)vc + kvo + off,
				             ok ? 8 : 0);
			}
			ap_cp_async_commit();
		};
		/* ... and, once landed, into stage st as BF16 where load_tile would have put them */
		auto convert8 = [&](int st) {
			ap_cp_async_wait_all();
#pragma unroll
			for (int i = 0; i < NLD; i++) {
				const int r = lr0 + i * RSTEP;
				__nv_bfloat16 *dst = sm + st * 2 * TILE + r * D + ((lch ^ (r & 7)) << 3);
#pragma unroll
				for (int kv = 0; kv < 2; kv++) {
					const uint2 u = *(const uint2 *)(stg + (2 * i + kv) * AP_THREADS * 8);
					uint4 w;
					w.x = fp4s_kv_e4m3x2_bf16x2(u.x);
					w.y = fp4s_kv_e4m3x2_bf16x2(u.x >> 16);
					w.z = fp4s_kv_e4m3x2_bf16x2(u.y);
					w.w = fp4s_kv_e4m3x2_bf16x2(u.y >> 16);
					*(uint4 *)(dst + kv * TILE) = w;
				}
			}
		};
		if (F8) {
			fetch8(kt0);
			convert8(0);
			if (kt0 + BN < kend)
				fetch8(kt0 + BN);
		} else {
			load_tile(kt0, 0);
		}

		/* Q rows as BF16 behind stage 0 (or both stages: QS), then to registers as A fragments */
		__nv_bfloat16 *qs = sm + (QS ? 4 : 2) * TILE;
		constexpr int F4 = D / 4;
		for (int x = tid; x < BM * F4; x += AP_THREADS) {
			const int r = x / F4, c4 = x % F4;
			const int tok = r / G, h = r - tok * G;
			float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			if (tok < ntok)
				v = *(const float4 *)(q + ((size_t)(i0 + tok) * nh + (size_t)g0 * G + h) * D + c4 * 4);
			uint2 pk;
			pk.x = ap_pack_bf16(v.x, v.y);
			pk.y = ap_pack_bf16(v.z, v.w);
			*(uint2 *)(qs + r * D + (((c4 >> 1) ^ (r & 7)) << 3) + (c4 & 1) * 4) = pk;
		}
		__syncthreads();
		/* A fragment (m16 tile mt, dims 16 kk .. 16 kk + 15) of this warp's Q rows */
		auto load_q = [&](int mt, int kk, uint32_t (&f)[4]) {
			ap_ldmatrix_x4(ap_smem_u32(qs + ((warp * MT + mt) * 16 + (lane & 15)) * D +
			                           (((kk * 2 + (lane >> 4)) ^ (lane & 7)) << 3)),
			               f[0], f[1], f[2], f[3]);
		};
		uint32_t qf[QS ? 1 : MT][QS ? 1 : D / 16][4];
		if (!QS)
#pragma unroll
			for (int mt = 0; mt < MT; mt++)
#pragma unroll
				for (int kk = 0; kk < D / 16; kk++)
					load_q(mt, kk, qf[QS ? 0 : mt][QS ? 0 : kk]);

		/* this thread's rows: lane / 4 and + 8 of each of the warp's m16 tiles; rows past the
		 * tile copy the last token's position so that they stay finite, and are not stored */
		int tk[MT][2];
		int32_t pr[MT][2], lo[MT][2];
		float m[MT][2], l[MT][2];
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int hf = 0; hf < 2; hf++) {
				const int r = (warp * MT + mt) * 16 + (lane >> 2) + 8 * hf;
				tk[mt][hf] = r / G;
				pr[mt][hf] = tk[mt][hf] < ntok ? pos[i0 + tk[mt][hf]] : pmax;
				lo[mt][hf] = window > 0 ? pr[mt][hf] - window : -1;
				m[mt][hf] = -INFINITY;
				l[mt][hf] = 0.0f;
			}
		float o[MT][DT][4];
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int j = 0; j < DT; j++)
				o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.0f;

		for (int32_t k0 = kt0; k0 < kend; k0 += BN) {
			const int st = ((k0 - kt0) / BN) & 1;
			if (!F8)
				ap_cp_async_wait_all();
			__syncthreads(); /* tile k0 landed for all; everyone is done with the other stage */
			if (!F8 && k0 + BN < kend)
				load_tile(k0 + BN, st ^ 1);
			const int32_t nval = min(BN, kend - k0); /* keys past kend: whole MMAs skipped */

			float s[MT][NT][4];
#pragma unroll
			for (int mt = 0; mt < MT; mt++)
#pragma unroll
				for (int j = 0; j < NT; j++)
					s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
			const __nv_bfloat16 *kt = sm + st * 2 * TILE;
			/* S = Q K^T: dims outer, so that QS reads each Q fragment once per tile */
#pragma unroll
			for (int kk = 0; kk < D / 16; kk++) {
				uint32_t qa[QS ? MT : 1][4];
				if (QS)
#pragma unroll
					for (int mt = 0; mt < MT; mt++)
						load_q(mt, kk, qa[QS ? mt : 0]);
#pragma unroll
				for (int jp = 0; jp < NT / 2; jp++) {
					if (jp * 16 >= nval)
						break;
					const int kr = jp * 16 + ((lane >> 4) << 3) + (lane & 7);
					uint32_t b0, b1, b2, b3;
					ap_ldmatrix_x4(ap_smem_u32(kt + kr * D + (((kk * 2 + ((lane >> 3) & 1)) ^ (lane & 7)) << 3)),
					               b0, b1, b2, b3);
#pragma unroll
					for (int mt = 0; mt < MT; mt++) {
						const uint32_t(&fa)[4] = QS ? qa[QS ? mt : 0] : qf[QS ? 0 : mt][QS ? 0 : kk];
						ap_mma(s[mt][2 * jp], fa, b0, b1);
						ap_mma(s[mt][2 * jp + 1], fa, b2, b3);
					}
				}
			}

			/* mask unless every key of the tile is visible to every row of the block */
			const bool full = k0 >= kstart && k0 + BN <= pmin + 1 && (window <= 0 || k0 > pmax - window);
			if (!full) {
#pragma unroll
				for (int mt = 0; mt < MT; mt++)
#pragma unroll
					for (int j = 0; j < NT; j++)
#pragma unroll
						for (int e = 0; e < 4; e++) {
							const int32_t t = k0 + j * 8 + (lane & 3) * 2 + (e & 1);
							if (!(t <= pr[mt][e >> 1] && t > lo[mt][e >> 1]))
								s[mt][j][e] = -INFINITY;
						}
			}

			/* online softmax in the log2 domain: x = S * scale * log2(e) */
#pragma unroll
			for (int mt = 0; mt < MT; mt++)
#pragma unroll
				for (int hf = 0; hf < 2; hf++) {
					float mx = -INFINITY;
#pragma unroll
					for (int j = 0; j < NT; j++)
						mx = fmaxf(mx, fmaxf(s[mt][j][2 * hf], s[mt][j][2 * hf + 1]));
					mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
					mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
					const float mn = fmaxf(m[mt][hf], mx * sl);
					/* a row with no visible key yet keeps max -inf: subtract 0 so nothing is NaN */
					const float mu = mn == -INFINITY ? 0.0f : mn;
					const float alpha = ap_ex2(m[mt][hf] - mu);
					m[mt][hf] = mn;
					float rs = 0.0f;
#pragma unroll
					for (int j = 0; j < NT; j++) {
						s[mt][j][2 * hf] = ap_ex2(fmaf(s[mt][j][2 * hf], sl, -mu));
						s[mt][j][2 * hf + 1] = ap_ex2(fmaf(s[mt][j][2 * hf + 1], sl, -mu));
						rs += s[mt][j][2 * hf] + s[mt][j][2 * hf + 1];
					}
					l[mt][hf] = l[mt][hf] * alpha + rs;
#pragma unroll
					for (int j = 0; j < DT; j++) {
						o[mt][j][2 * hf] *= alpha;
						o[mt][j][2 * hf + 1] *= alpha;
					}
				}

			/* O += P V, 16 keys per MMA */
			const __nv_bfloat16 *vt = kt + TILE;
#pragma unroll
			for (int kk = 0; kk < BN / 16; kk++) {
				if (kk * 16 >= nval)
					break;
				uint32_t a[MT][4], al[MT][4];
#pragma unroll
				for (int mt = 0; mt < MT; mt++) {
					a[mt][0] = ap_pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
					a[mt][1] = ap_pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
					a[mt][2] = ap_pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
					a[mt][3] = ap_pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
					if (PRECISE) {
						al[mt][0] = ap_pack_bf16_lo(s[mt][2 * kk][0], s[mt][2 * kk][1], a[mt][0]);
						al[mt][1] = ap_pack_bf16_lo(s[mt][2 * kk][2], s[mt][2 * kk][3], a[mt][1]);
						al[mt][2] = ap_pack_bf16_lo(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1], a[mt][2]);
						al[mt][3] = ap_pack_bf16_lo(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3], a[mt][3]);
					}
				}
				const int vr = kk * 16 + (((lane >> 3) & 1) << 3) + (lane & 7);
#pragma unroll
				for (int dp = 0; dp < D / 16; dp++) {
					uint32_t b0, b1, b2, b3;
					ap_ldmatrix_x4_trans(ap_smem_u32(vt + vr * D + (((dp * 2 + (lane >> 4)) ^ (lane & 7)) << 3)),
					                     b0, b1, b2, b3);
#pragma unroll
					for (int mt = 0; mt < MT; mt++) {
						ap_mma(o[mt][2 * dp], a[mt], b0, b1);
						ap_mma(o[mt][2 * dp + 1], a[mt], b2, b3);
						if (PRECISE) {
							ap_mma(o[mt][2 * dp], al[mt], b0, b1);
							ap_mma(o[mt][2 * dp + 1], al[mt], b2, b3);
						}
					}
				}
			}
			/* FP8: the next tile (fetched during this one) into the other stage, and the one
			 * after it on its way */
			if (F8 && k0 + BN < kend) {
				convert8(st ^ 1);
				if (k0 + 2 * BN < kend)
					fetch8(k0 + 2 * BN);
			}
		}

		/* the quad's partial sums; the sink joins the denominator with a zero value vector */
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int hf = 0; hf < 2; hf++) {
				float lt = l[mt][hf];
				lt += __shfl_xor_sync(0xFFFFFFFFu, lt, 1);
				lt += __shfl_xor_sync(0xFFFFFFFFu, lt, 2);
				const int r = (warp * MT + mt) * 16 + (lane >> 2) + 8 * hf, tok = tk[mt][hf];
				const int h = r - tok * G;
				float f = 1.0f / lt;
				if (sinks) {
					const float sk = sinks[g0 * G + h] * 1.4426950408889634f;
					const float mf = fmaxf(m[mt][hf], sk), e = ap_ex2(m[mt][hf] - mf);
					f = e / (lt * e + ap_ex2(sk - mf));
				}
				if (tok < ntok) {
					float *orow = out + ((size_t)(i0 + tok) * nh + (size_t)g0 * G + h) * D + (lane & 3) * 2;
#pragma unroll
					for (int j = 0; j < DT; j++)
						*(float2 *)(orow + j * 8) = make_float2(o[mt][j][2 * hf] * f, o[mt][j][2 * hf + 1] * f);
				}
			}
		__syncthreads(); /* the next tile of this block reuses the shared memory */
	}
}

/* ---- host ------------------------------------------------------------------------------- */

typedef void (*ap_kernel_fn)(const float *, const void *, const void *, const int32_t *, const int32_t *,
                             const int32_t *, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t,
                             const float *, float, const int32_t *, float *);

struct ap_variant {
	int d, bn, mt, precise, f8;
	ap_kernel_fn fn;
	int smem;
};

/* Q stays in shared memory where its fragments would not fit beside the accumulators (d 128,
 * 2 row tiles per warp: a few registers still spill there, and it is the fastest on long
 * prompts all the same). The precise kernel exists in one shape per d. Every shape comes for
 * BF16 and for FP8 caches. */
#define AP_V(D_, BN_, MT_, P_, F8_)                                                                   \
	{D_, BN_, MT_, P_, F8_, attn_prefill_kernel<D_, BN_, MT_, D_ * MT_ >= 256, P_, F8_>,             \
	 ap_smem_bytes(D_, BN_, MT_, D_ * MT_ >= 256, F8_)}
#define AP_V2(D_, BN_, MT_, P_) AP_V(D_, BN_, MT_, P_, false), AP_V(D_, BN_, MT_, P_, true)
static const struct ap_variant ap_variants[] = {
	AP_V2(64, 64, 1, false),  AP_V2(64, 64, 2, false),  AP_V2(64, 128, 1, false), AP_V2(64, 64, 2, true),
	AP_V2(128, 64, 1, false), AP_V2(128, 64, 2, false), AP_V2(128, 32, 2, false), AP_V2(128, 64, 1, true),
};
#undef AP_V2
#undef AP_V

/* Row tiles per warp when the caller does not say. Two (128 rows per block) halve the shared-
 * memory reads per MMA and give each warp twice the independent MMAs, which is what the kernel
 * is short of (latency-bound at 2 warps per scheduler): ~20% faster on long prompts (H100:
 * llama3 2048 tokens 214 -> 171 us, 8192 2707 -> 2112 us). With fewer than ~2 blocks per SM they
 * leave SMs idle instead: 512-token llama3 34 -> 47 us. So: 2 once the batch makes at least
 * 2 x SMs blocks of 128 rows. A function of (n, G, nkv) only, so every layer of a step picks the
 * same shape (reuse_plan stays valid across layers, sliding-window ones included). */
static int ap_default_mt(int32_t n, int32_t G, int32_t nkv, int sms)
{
	const int64_t blocks = ((int64_t)n * G + 127) / 128 * nkv;
	return blocks >= 2 * (int64_t)sms ? 2 : 1;
}
#define AP_NVARIANTS (int)(sizeof ap_variants / sizeof ap_variants[0])

extern "C" int64_t fp4s_cuda_attention_prefill_work_bytes(int32_t n)
{
	return ((int64_t)(n > 0 ? n : 0) + 2) * (int64_t)sizeof(int32_t);
}

extern "C" int fp4s_cuda_attention_prefill_setup(struct fp4s_error *err)
{
	for (int i = 0; i < AP_NVARIANTS; i++)
		FP4S_CUDA_TRY(err, cudaFuncSetAttribute(ap_variants[i].fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
		                                        ap_variants[i].smem));
	return FP4S_OK;
}

extern "C" int fp4s_cuda_attention_prefill_ex(const float *q, const void *kc, const void *vc, int kv_dtype,
                                              const int32_t *pos, const int32_t *seq, const int32_t *table,
                                              int32_t table_stride, int32_t n, int32_t nh, int32_t nkv,
                                              int32_t d, int32_t window, const float *sinks, float scale,
                                              void *work, float *out, const struct fp4s_attn_prefill_tune *tune,
                                              cudaStream_t s, struct fp4s_error *err)
{
	static int ready, sms; /* once per process: the shared-memory limit, the SM count */
	if (kv_dtype != FP4S_KV_BF16 && kv_dtype != FP4S_KV_FP8)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "prefill attention: KV cache type %d (the exact "
		                      "FP32 mode keeps fp4s_cuda_attention)", kv_dtype);
	if (nkv <= 0 || nh <= 0 || nh % nkv || nh / nkv > AP_MAX_G || (d != 64 && d != 128) || !(scale > 0.0f))
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "prefill attention: %d query heads over %d KV "
		                      "heads of dim %d (supported: dim 64 or 128, up to %d heads per KV head)",
		                      nh, nkv, d, AP_MAX_G);
	if (((uintptr_t)q | (uintptr_t)kc | (uintptr_t)vc) % 16 || (uintptr_t)out % 8 || (uintptr_t)work % 4)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "prefill attention: q, kc, vc need 16-byte and "
		                      "out 8-byte alignment");
	if (n < 0 || table_stride <= 0)
		return fp4s_error_set(err, FP4S_EINVAL, "prefill attention: %d tokens, table stride %d", n,
		                      table_stride);
	if (n == 0)
		return FP4S_OK;
	if (!ready) {
		int rc = fp4s_cuda_attention_prefill_setup(err), dev = 0;
		if (rc)
			return rc;
		FP4S_CUDA_TRY(err, cudaGetDevice(&dev));
		FP4S_CUDA_TRY(err, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
		ready = 1;
	}
	const int32_t G = nh / nkv;
	const int precise = tune && tune->precise;
	int bn = tune ? tune->bn : 0, mt = tune ? tune->mt : 0;
	if (!bn && !mt) {
		bn = 64;
		mt = precise ? (d == 64 ? 2 : 1) : ap_default_mt(n, G, nkv, sms);
	}
	const struct ap_variant *v = NULL;
	for (int i = 0; i < AP_NVARIANTS && !v; i++) {
		const struct ap_variant *c = &ap_variants[i];
		if (c->d == d && c->precise == precise && c->f8 == (kv_dtype == FP4S_KV_FP8) && (!bn || c->bn == bn) &&
		    (!mt || c->mt == mt))
			v = c;
	}
	if (!v)
		return fp4s_error_set(err, FP4S_EINVAL, "prefill attention: no kernel with dim %d, %d keys per "
		                      "tile, %d row tiles per warp%s", d, bn, mt, precise ? ", precise" : "");
	const int32_t T = 64 * v->mt / G;
	int32_t *plan = (int32_t *)work;
	if (!tune || !tune->reuse_plan)
		attn_plan_kernel<<<1, PLAN_THREADS, 0, s>>>(seq, n, T, plan);
	/* tiles <= ceil(n / T) + sequence changes; extra tiles, if any, are looped over */
	const int64_t slots_want = (int64_t)(n + T - 1) / T + AP_SLACK;
	const int64_t slots = slots_want < n ? slots_want : n;
	v->fn<<<(unsigned)(slots * nkv), AP_THREADS, v->smem, s>>>(q, kc, vc, pos, seq, table, table_stride, nh, nkv, G,
	                                                          T, window, sinks, scale * 1.4426950408889634f, plan,
	                                                          out);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

extern "C" int fp4s_cuda_attention_prefill(const float *q, const void *kc, const void *vc, int kv_dtype,
                                           const int32_t *pos, const int32_t *seq, const int32_t *table,
                                           int32_t table_stride, int32_t n, int32_t nh, int32_t nkv, int32_t d,
                                           int32_t window, const float *sinks, float scale, void *work,
                                           float *out, cudaStream_t s, struct fp4s_error *err)
{
	return fp4s_cuda_attention_prefill_ex(q, kc, vc, kv_dtype, pos, seq, table, table_stride, n, nh, nkv, d,
	                                      window, sinks, scale, work, out, NULL, s, err);
}
