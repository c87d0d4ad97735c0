/* attention_mma.cuh: decode attention over a BF16 or FP8 (E4M3) paged KV cache on the tensor
 * cores (mma.sync m16n8k16, BF16 in, FP32 accumulate), for head_dim D = 64 or 128 and up to 8
 * query heads per KV head. Included by attention.cu; written against a handful of primitives
 * (att_ld16, att_mma, att_shfl_xor, att_sync, ...) so that a host emulator
 * (tests/unit/test_attention_emu.cpp) can run this very code with one host thread per GPU thread.
 *
 * FP8 (the F8 instances): every load below moves the same 8 elements, as 8 bytes instead of 16,
 * into the same lanes; they stay E4M3 in registers (and in the ring) until the mma needs them,
 * then become the very BF16 registers the BF16 cache would have given (exact: kv_fp8.cuh), so
 * the fragment logic is shared and half the bytes stream.
 *
 * One block = one (token, KV head, split) of W warps. A split is a range of whole KV blocks
 * (FP4S_KV_BLOCK = 16 positions: one "tile"); warp w takes tiles w, w + W, ... of it. Per tile:
 *
 *   S = Q K^T   M = 16 rows: rows 0-7 the G <= 8 heads' scaled q rounded to BF16 (hi), rows
 *               8-15 the BF16 residual q - hi (lo); N = 8 keys (two n-tiles per tile); K = the
 *               dims. Score = row g + row g + 8: q is carried to ~16 bits, K is exact in BF16.
 *               A lane (g, c) = (lane / 4, lane % 4) supplies, as the B operand, 16-byte loads of
 *               key row g (n-tile 0) and 8 + g (n-tile 1), dims [32j + 8c, 32j + 8c + 8): the
 *               mma's k order is a permutation of the dims, and q's A fragment uses the same one.
 *   softmax     online, per head, in log2 units (q carries scale * log2(e)); a quad of lanes
 *               holds one head's 16 scores.
 *   O += P V    M = rows 0-7 P rounded to BF16, rows 8-15 its residual (same trick); K = the 16
 *               keys; N = 8 dims. The score C fragment is already P's A fragment. V's B fragment
 *               needs two keys of one dim per register: lane (g, c) loads rows 2c, 2c+1, 2c+8,
 *               2c+9 at dims [64h + 8g, 64h + 8g + 8) and pairs them with byte permutes; n-tile
 *               (h, t) then holds dims 64h + 8n + t, so lane (g, c) ends with head g's dims
 *               [64h + 16c, 64h + 16c + 16) in its accumulators (rows g and g + 8 summed).
 *
 * Loads: each lane copies its own 16-byte pieces of a tile (2 x 16 x d x 2 bytes for the warp,
 * d/16 pieces of K and d/16 of V per lane) with cp.async into its own slots of a ring of
 * `stages` tiles in shared memory, and reads back only those, so the warp needs no barrier: up
 * to `stages` tiles per warp are in flight without holding registers. Per tile a warp then runs
 * 2d/16 + d/8 mma.
 * Keys outside [start, pos] in the first and last tile score -inf and their V rows are zeroed
 * (the pool may hold anything there, NaN included). The warps of a block merge through shared
 * memory; a block with the whole range writes the output, otherwise it leaves (max, sum,
 * unnormalized output) per head and the last block of the (token, KV head) to finish, found by
 * an atomic counter, merges them (or a separate merge kernel does, see attention.cu). */
#ifndef FP4S_ATTENTION_MMA_CUH
#define FP4S_ATTENTION_MMA_CUH

#include <stdint.h>

#ifndef FP4S_ATTN_EMU
#include <cuda_bf16.h>

#include "backend/cuda/arrive.cuh"
#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/pdl.cuh"
#include "numerics/numerics.h"

#define ATT_DEV static __device__ __forceinline__
#define ATT_HD static __host__ __device__ __forceinline__

struct att_u4 {
	uint32_t x, y, z, w;
};
struct att_u2 {
	uint32_t x, y;
};

/* 16 bytes of the cache into registers: read once per step, kept out of L1 */
ATT_DEV att_u4 att_ld16(const uint16_t *p)
{
	att_u4 r;
	asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
	             : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
	             : "l"(p));
	return r;
}

/* 8 bytes of an FP8 cache, likewise */
ATT_DEV att_u2 att_ld8(const uint8_t *p)
{
	att_u2 r;
	asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
	return r;
}

/* 16 bytes of the cache (or of the merge's partials) into this lane's shared-memory slot, through L2 only */
ATT_DEV void att_cp16(att_u4 *dst, const uint16_t *src)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src)
	             : "memory");
}
/* 8 bytes (an FP8 piece): cp.async.cg takes 16 only, .ca any of 4, 8, 16 */
ATT_DEV void att_cp8(att_u2 *dst, const uint8_t *src)
{
	asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src)
	             : "memory");
}
ATT_DEV void att_cp_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
ATT_DEV void att_cp_wait_all(void) { asm volatile("cp.async.wait_all;" ::: "memory"); }
/* waits until at most n of this thread's groups are in flight (n = 1..3) */
ATT_DEV void att_cp_wait(int n)
{
	if (n <= 1)
		asm volatile("cp.async.wait_group 1;" ::: "memory");
	else if (n == 2)
		asm volatile("cp.async.wait_group 2;" ::: "memory");
	else
		asm volatile("cp.async.wait_group 3;" ::: "memory");
}

/* d += A B, A 16x16 row-major, B 16x8 column-major, BF16 in, FP32 accumulate */
ATT_DEV void att_mma(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1)
{
	asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
	    "{%8, %9}, {%0, %1, %2, %3};"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

ATT_DEV float att_shfl_xor(float v, int m) { return __shfl_xor_sync(0xFFFFFFFFu, v, m); }
ATT_DEV void att_sync(void) { __syncthreads(); }
ATT_DEV float att_ex2(float x) { return exp2f(x); }
ATT_DEV uint32_t att_prmt(uint32_t a, uint32_t b, uint32_t s) { return __byte_perm(a, b, s); }
/* (lo, hi) rounded to BF16 (RNE) in one register, lo in the low half */
ATT_DEV uint32_t att_pack(float lo, float hi)
{
	__nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
	return *(uint32_t *)&v;
}
ATT_DEV float att_lo_f(uint32_t v) { return __uint_as_float(v << 16); }
ATT_DEV float att_hi_f(uint32_t v) { return __uint_as_float(v & 0xFFFF0000u); }
ATT_DEV float att_ldcg(const float *p) { return __ldcg(p); }
ATT_DEV float4 att_ldcg4(const float *p) { return __ldcg((const float4 *)p); }
ATT_DEV float2 att_ldcg2(const float *p) { return __ldcg((const float2 *)p); }
ATT_DEV void att_fence(void) { __threadfence(); }
ATT_DEV unsigned att_atomic_inc(unsigned *p) { return atomicAdd(p, 1u); }
/* the same with release and acquire at GPU scope, between barriers of the block (arrive.cuh) */
ATT_DEV unsigned att_atomic_inc_ar(unsigned *p) { return fp4s_arrive(p); }
/* programmatic dependent launch (pdl.cuh): no-ops where the launch did not ask for it */
ATT_DEV void att_grid_wait(void) { pdl_wait(); }
ATT_DEV void att_grid_trigger(void) { pdl_trigger(); }
/* a mark in the step's timeline (timeline.cuh; nothing outside -DFP4S_DIAG_TL builds) */
ATT_DEV void att_mark(void *tl, int k) { tl_mark_at(tl, k); }
/* one value into the cache, encoded as kv_write_kernel (cuda_backend.cu) encodes it */
ATT_DEV void att_kv_put(uint16_t *p, float x) { *p = fp4s_f32_to_bf16(x); }
ATT_DEV void att_kv_put(uint8_t *p, float x) { *p = fp4s_kv_e4m3(x); }
/* two E4M3 bytes (bits 0-15) -> two BF16, exactly */
ATT_DEV uint32_t att_e4m3x2(uint32_t two) { return fp4s_kv_e4m3x2_bf16x2(two); }
#endif

/* The cache's element type, by F8: a "piece" is what a lane loads at once, 8 consecutive
 * elements of one row (16 bytes of BF16 or 8 of E4M3); att_bf16x8 makes its 8 BF16 (4 registers,
 * element 2i in the low half of register i) whichever it is. */
template <bool F8>
struct att_kv {
	typedef uint16_t elem;
	typedef att_u4 piece;
};
template <>
struct att_kv<true> {
	typedef uint8_t elem;
	typedef att_u2 piece;
};
ATT_DEV att_u4 att_ld(const uint16_t *p) { return att_ld16(p); }
ATT_DEV att_u2 att_ld(const uint8_t *p) { return att_ld8(p); }
ATT_DEV void att_cp(att_u4 *dst, const uint16_t *src) { att_cp16(dst, src); }
ATT_DEV void att_cp(att_u2 *dst, const uint8_t *src) { att_cp8(dst, src); }
ATT_DEV att_u4 att_bf16x8(const att_u4 &v) { return v; }
ATT_DEV att_u4 att_bf16x8(const att_u2 &v)
{
	att_u4 r;
	r.x = att_e4m3x2(v.x);
	r.y = att_e4m3x2(v.x >> 16);
	r.z = att_e4m3x2(v.y);
	r.w = att_e4m3x2(v.y >> 16);
	return r;
}

/* 8 floats as the cache stores them (att_kv_put's rounding), as the piece a lane would load */
ATT_DEV att_u4 att_piece_of(const float *x, const uint16_t *)
{
	uint16_t e[8];
	for (int i = 0; i < 8; i++)
		att_kv_put(&e[i], x[i]);
	att_u4 r;
	r.x = e[0] | (uint32_t)e[1] << 16, r.y = e[2] | (uint32_t)e[3] << 16;
	r.z = e[4] | (uint32_t)e[5] << 16, r.w = e[6] | (uint32_t)e[7] << 16;
	return r;
}
ATT_DEV att_u2 att_piece_of(const float *x, const uint8_t *)
{
	uint8_t e[8];
	for (int i = 0; i < 8; i++)
		att_kv_put(&e[i], x[i]);
	att_u2 r;
	r.x = e[0] | (uint32_t)e[1] << 8 | (uint32_t)e[2] << 16 | (uint32_t)e[3] << 24;
	r.y = e[4] | (uint32_t)e[5] << 8 | (uint32_t)e[6] << 16 | (uint32_t)e[7] << 24;
	return r;
}

struct att_mma_args {
	const float *q;           /* [n][nh * D], FP32, pre-RoPE'd */
	const void *kc, *vc;      /* the layer's pool, BF16 or E4M3 (F8) [blocks][16][nkv * D] */
	const int32_t *pos, *seq, *table;
	int32_t table_stride, nh, nkv, window;
	int32_t splits;           /* blocks per (token, KV head) in the grid */
	int32_t min_tiles;        /* fewest tiles per block */
	int32_t stages;           /* tiles in flight per warp in the shared-memory ring, 2..4; 1: none */
	int32_t region;           /* work floats per (token, KV head), a multiple of 4 */
	const float *sinks;       /* [nh] natural-log logits, or NULL */
	float qscale;             /* scale * log2(e) */
	float *work;              /* per (token, KV head) a region: outputs [splits][G][D], then
	                           * [splits][G] (max in log2 units, sum) */
	float *out;               /* [n][nh * D] */
	unsigned *counters;       /* [n * nkv], zero between calls; NULL: the merge kernel merges */
	/* The decode prologue, fused in when kraw is set: q then holds the step's raw projections,
	 * kraw/vraw [n][nkv * D] its k and v. Each block takes RMSNorm (qn, kn: per-head weights
	 * over D, either may be NULL; zero_centred adds 1 to them) and RoPE (rot dims, pairs
	 * (j, j + rot/2), angle pos * inv_freq[j], cos and sin times mscale) of its heads itself, as
	 * norm_rope_kernel and rope_kernel do, and the block whose range holds the token's own
	 * position writes its k and v row into the cache (kw, vw: the pool kc, vc point at) for the
	 * steps to come and takes this step's row from its own registers (kpatch). Only that block
	 * needs the row, so no other kernel is needed between the projections and attention; but a
	 * sequence must not have two tokens in the batch (each would need the other's row). */
	const float *kraw, *vraw;
	void *kw, *vw;
	const float *qn, *kn;
	float eps;
	int32_t zero_centred, rot;
	const float *inv_freq;
	float mscale;
	int32_t trigger; /* PDL: let the next kernel launch once the tiles are done (1, see there) or
	                  * once they are requested (2) */
	int32_t oldmerge; /* the last block's merge as before att_merge_regs (fences, two round trips) */
	int32_t late;     /* the writer loads its tiles after writing the row (the form before kpatch) */
};

#define ATT_LOG2E 1.4426950408889634f
#define ATT_MERGE_MAX 128 /* most splits a merge handles (the host caps the grid) */

/* A token's keys [start, p] as KV blocks [b_lo, b_lo + nb), cut into chunks of per >= min_tiles
 * blocks; nact chunks are non-empty. Every block and the merge derive the same numbers. */
struct att_range {
	int32_t start, b_lo, nb, per, nact;
};

ATT_DEV att_range att_range_of(int32_t p, int32_t window, int32_t splits, int32_t min_tiles)
{
	att_range r;
	r.start = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
	r.b_lo = r.start / FP4S_KV_BLOCK;
	r.nb = p / FP4S_KV_BLOCK - r.b_lo + 1;
	r.per = (r.nb + splits - 1) / splits;
	if (r.per < min_tiles)
		r.per = min_tiles;
	r.nact = (r.nb + r.per - 1) / r.per;
	return r;
}

/* Shared memory of a block: the ring [W][stages][D / 8 chunks][32 lanes] of pieces (16 bytes,
 * 8 for FP8; each lane reads back only what it copied itself), reused after the tile loop for the
 * warps' outputs [W][8][D] floats (so never smaller than those); then per-warp max/sum [2][W][8],
 * the merge's weights and sums [2][8][MAX] and a flag. */
template <int D, int W, bool F8>
ATT_HD size_t att_smem_ring(int stages)
{
	const size_t ring = (size_t)W * stages * (D / 8) * 32 * (F8 ? 8 : 16), outs = (size_t)W * 8 * D * sizeof(float);
	return ring > outs ? ring : outs;
}
template <int D, int W, bool F8>
ATT_HD size_t att_smem_bytes(int stages)
{
	return att_smem_ring<D, W, F8>(stages) + sizeof(float) * (2 * W * 8 + 2 * 8 * ATT_MERGE_MAX + 4);
}
/* with the fused prologue: then the group's q rows, the token's k and v row [8 + 2][D] floats,
 * apart from the ring (which fills while they are computed) */
ATT_HD size_t att_smem_pro_off(size_t base) { return (base + 15) & ~(size_t)15; }
template <int D, int W, bool F8>
ATT_HD size_t att_smem_bytes_pro(int stages)
{
	return att_smem_pro_off(att_smem_bytes<D, W, F8>(stages)) + sizeof(float) * 10 * D;
}

/* The merge's weights: the nact (max, sum) pairs of each of the G heads at ml into wt, wl
 * ([8][ATT_MERGE_MAX] floats of shared memory), then wt[g][s] = the weight of split s's output
 * in head g's result, the sink in the denominator. nthr threads, barriers inside. */
ATT_DEV void att_merge_weights(const float *ml, int32_t nact, int32_t G, const float *sinks, int tid, int nthr,
                               float (*wt)[ATT_MERGE_MAX], float (*wl)[ATT_MERGE_MAX])
{
	const int lane = tid & 31, warp = tid >> 5, nw = nthr >> 5;
	/* every pair's loads in flight together (one L2 round trip: qwen3-30b-a3b's 264 pairs over
	 * 256 threads took two in a rolled loop) */
#pragma unroll 1
	for (int32_t x0 = tid; x0 < G * nact; x0 += 2 * nthr) {
		float2 v[2];
#pragma unroll
		for (int u = 0; u < 2; u++)
			if (x0 + u * nthr < G * nact)
				v[u] = att_ldcg2(ml + 2 * (size_t)(x0 + u * nthr));
#pragma unroll
		for (int u = 0; u < 2; u++) {
			const int32_t x = x0 + u * nthr, s = x / G, g = x - s * G;
			if (x < G * nact) {
				wt[g][s] = v[u].x;
				wl[g][s] = v[u].y;
			}
		}
	}
	att_sync();
	for (int32_t g = warp; g < G; g += nw) {
		float mx = sinks ? sinks[g] * ATT_LOG2E : -INFINITY;
		for (int32_t s = lane; s < nact; s += 32)
			mx = fmaxf(mx, wt[g][s]);
		for (int o = 16; o > 0; o >>= 1)
			mx = fmaxf(mx, att_shfl_xor(mx, o));
		float l = 0.0f;
		for (int32_t s = lane; s < nact; s += 32)
			l += wt[g][s] == -INFINITY ? 0.0f : wl[g][s] * att_ex2(wt[g][s] - mx);
		for (int o = 16; o > 0; o >>= 1)
			l += att_shfl_xor(l, o);
		if (sinks)
			l += att_ex2(sinks[g] * ATT_LOG2E - mx);
		const float inv = 1.0f / l;
		for (int32_t s = lane; s < nact; s += 32)
			wt[g][s] = wt[g][s] == -INFINITY ? 0.0f : att_ex2(wt[g][s] - mx) * inv;
	}
	att_sync();
}

/* Merges the nact partials of one (token, KV head): part points at its region (outputs
 * [nact][G][D], then [nact][G] (max, sum) pairs at ml); out at the group's first head. nthr
 * threads; wt, wl: [8][ATT_MERGE_MAX] floats of shared memory; red: nthr float4 of shared memory.
 * All loads of a phase are independent, so they are in flight together. */
template <int D>
ATT_DEV void att_merge_group(const float *part, const float *ml, int32_t nact, int32_t G, const float *sinks,
                             float *out, int tid, int nthr, float (*wt)[ATT_MERGE_MAX], float (*wl)[ATT_MERGE_MAX],
                             float4 *red)
{
	att_merge_weights(ml, nact, G, sinks, tid, nthr, wt, wl);
	/* output quads: nq of them, tpo threads each summing every tpo-th partial */
	const int32_t nq = G * D / 4;
	const int tpo = nthr >= 2 * nq ? nthr / nq : 1;
	const size_t stride = (size_t)G * D;
	for (int32_t x = tpo > 1 ? tid % nq : tid; x < nq && tid < tpo * nq; x += tpo > 1 ? nq : nthr) {
		const int32_t g = x / (D / 4), part0 = tpo > 1 ? tid / nq : 0;
		const float *src = part + 4 * (size_t)x;
		float4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 8
		for (int32_t s = part0; s < nact; s += tpo) {
			const float4 v = att_ldcg4(src + s * stride);
			const float w = wt[g][s];
			acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
		}
		if (tpo > 1)
			red[tid] = acc;
		else
			((float4 *)out)[x] = acc;
	}
	if (tpo > 1) {
		att_sync();
		for (int32_t x = tid; x < nq; x += nthr) {
			float4 acc = red[x];
			for (int k = 1; k < tpo; k++) {
				const float4 v = red[k * nq + x];
				acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
			}
			((float4 *)out)[x] = acc;
		}
	}
}

/* att_merge_group for the last block of a split (nthr = NT threads, G D / 4 <= NT output quads):
 * a thread's partial outputs go into registers, ATT_MERGE_REGS at a time, and the first of them
 * are loaded together with the (max, sum) pairs, all in flight at once. att_merge_group loads
 * the pairs first, then the outputs 8 at a time: llama3-8b's 16 partials a head took 3 round
 * trips to L2, qwen3-30b-a3b's 32 took 5; here 1 and 2. Same arithmetic, same order of sums
 * per thread as att_merge_group with tpo = NT / nq. */
#define ATT_MERGE_REGS 16
template <int D, int NT>
ATT_DEV void att_merge_regs(const float *part, const float *ml, int32_t nact, int32_t G, const float *sinks, float *out,
                            int tid, float (*wt)[ATT_MERGE_MAX], float (*wl)[ATT_MERGE_MAX], float4 *red)
{
	const int32_t nq = G * D / 4, tpo = NT / nq;
	const int32_t x = tid % nq, part0 = tid / nq, g = x / (D / 4);
	const bool act = part0 < tpo;
	const size_t stride = (size_t)G * D;
	float4 v[ATT_MERGE_REGS];
	auto load = [&](int32_t s0) {
#pragma unroll
		for (int k = 0; k < ATT_MERGE_REGS; k++) {
			const int32_t s = s0 + part0 + k * tpo;
			if (act && s < nact)
				v[k] = att_ldcg4(part + s * stride + 4 * (size_t)x);
		}
	};
	load(0); /* in flight with the pairs' loads */
	att_merge_weights(ml, nact, G, sinks, tid, NT, wt, wl);
	float4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
	for (int32_t s0 = 0; s0 < nact; s0 += ATT_MERGE_REGS * tpo) {
		if (s0 > 0)
			load(s0);
#pragma unroll
		for (int k = 0; k < ATT_MERGE_REGS; k++) {
			const int32_t s = s0 + part0 + k * tpo;
			if (act && s < nact) {
				const float w = wt[g][s];
				acc.x += w * v[k].x, acc.y += w * v[k].y, acc.z += w * v[k].z, acc.w += w * v[k].w;
			}
		}
	}
	if (tpo == 1) {
		if (act)
			((float4 *)out)[x] = acc;
		return;
	}
	if (act)
		red[tid] = acc;
	att_sync();
	for (int32_t y = tid; y < nq; y += NT) {
		float4 t = red[y];
		for (int k = 1; k < tpo; k++) {
			const float4 u = red[k * nq + y];
			t.x += u.x, t.y += u.y, t.z += u.z, t.w += u.w;
		}
		((float4 *)out)[y] = t;
	}
}

/* att_merge_regs's sums (same order: partial 0 first, one output quad a thread) in a fraction of
 * its code. Why: the last block runs the merge once per launch, after ~10 us of other code on its
 * SM, so its instructions come from L2 behind the step's weight traffic; code added to it measured
 * ~0.3 us a KB at depth 4096 (session 22: 2.7 KB of staged stores cost qwen3-30b-a3b 1.5 %), and
 * warming it had cut a merge from 4.5 to 2.6 us (session 17). So the partials go into shared
 * memory by cp.async in a rolled loop (all of a round in flight, as the registers' unrolled loads
 * were), the weights are computed meanwhile, and a rolled loop sums them. buf: nbuf float4 of
 * shared memory (the ring's bytes, free by now); each thread reads back only what it copied.
 * Rounds: nbuf / nq partials, at least W (the ring holds the warps' outputs, 32 W D bytes, and a
 * round needs 4 G D with G <= 8), so the loop always advances. */
template <int D, int NT>
ATT_DEV void att_merge_cp(const float *part, const float *ml, int32_t nact, int32_t G, const float *sinks, float *out,
                          int tid, float (*wt)[ATT_MERGE_MAX], float (*wl)[ATT_MERGE_MAX], float4 *buf, int32_t nbuf)
{
	const int32_t nq = G * D / 4, x = tid, g = x / (D / 4), R = nbuf / nq;
	const bool act = x < nq;
	const size_t stride = (size_t)G * D;
	float4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
	for (int32_t s0 = 0; s0 < nact; s0 += R) {
		const int32_t n = nact - s0 < R ? nact - s0 : R;
		if (act) {
#pragma unroll 1
			for (int32_t k = 0; k < n; k++)
				att_cp16(reinterpret_cast<att_u4 *>(buf + (size_t)k * nq + x),
				         reinterpret_cast<const uint16_t *>(part + (size_t)(s0 + k) * stride + 4 * (size_t)x));
		}
		att_cp_commit();
		if (s0 == 0) /* in flight with the first round */
			att_merge_weights(ml, nact, G, sinks, tid, NT, wt, wl);
		att_cp_wait_all();
		if (act) {
#pragma unroll 1
			for (int32_t k = 0; k < n; k++) {
				const float4 v = buf[(size_t)k * nq + x];
				const float w = wt[g][s0 + k];
				acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
			}
		}
	}
	if (act)
		((float4 *)out)[x] = acc;
}

/* the last block's merge: att_merge_cp (1, the default) or att_merge_regs (0; A/B builds). An
 * FP8 cache's register path keeps att_merge_regs: its ring (8-byte pieces) holds half the
 * partials a round, so qwen3-30b-a3b's 33 would take 5 rounds instead of 3 (not measured). */
#ifndef ATT_MERGE_CP
#define ATT_MERGE_CP 1
#endif

/* One block's work; tid in [0, 32 W), (bx, by, bz) = (token, KV head, split), smem as above.
 * RING: tiles stream through the shared-memory ring, a.stages deep (the decode default: few
 * blocks, each must keep many bytes in flight); otherwise straight into registers, the next
 * tile's K loaded once the scores are out of the K registers and its V once P.V is done (many
 * blocks per SM: the batch default, where that streams faster). */
template <int D, int W, bool RING, bool F8>
ATT_DEV void att_mma_block(const att_mma_args &a, int tid, int bx, int by, int bz, unsigned char *smem,
                           void *tl = nullptr)
{
	typedef typename att_kv<F8>::elem E;
	typedef typename att_kv<F8>::piece P;
	constexpr int NJ = D / 32; /* 32-dim chunks of a K row (one piece each per lane) */
	constexpr int NH = D / 64; /* 64-dim chunks of a V row */
	constexpr int NC = D / 8;  /* ring slots (pieces) per lane per tile: K then V */
	const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
	const int32_t i = bx, g0 = by, split = bz;
	const int32_t G = a.nh / a.nkv, kvw = a.nkv * D;
	const int S = RING ? a.stages : 1;

	const int32_t p = a.pos[bx];
	const att_range r = att_range_of(p, a.window, a.splits, a.min_tiles);
	if (split >= r.nact)
		return; /* the whole block: nothing to do */
	const int32_t *trow = a.table + (size_t)a.seq[i] * a.table_stride;
	const int32_t b_begin = r.b_lo + split * r.per;
	const int32_t b_end = b_begin + r.per < r.b_lo + r.nb ? b_begin + r.per : r.b_lo + r.nb;
	const E *kb = (const E *)a.kc + (size_t)g0 * D + 8 * c; /* + row * kvw + 32 j */
	const E *vb = (const E *)a.vc + (size_t)g0 * D + 8 * g; /* + row * kvw + 64 h */
	/* V rows 2c, 2c + 1, 2c + 8, 2c + 9 (a function, not an array: lambdas take arrays by
	 * reference, which puts them on the stack) */
	auto vrow = [c](int rr) { return 2 * c + (rr & 1) + 8 * (rr >> 1); };
	P *ring = (P *)smem + (size_t)warp * S * NC * 32 + lane; /* slot (stage, k) at [(stage NC + k) 32] */
	float *sm_m = (float *)(smem + att_smem_ring<D, W, F8>(S)), *sm_l = sm_m + W * 8;
	float(*wt)[ATT_MERGE_MAX] = (float(*)[ATT_MERGE_MAX])(sm_l + W * 8);
	float(*wl)[ATT_MERGE_MAX] = wt + 8;
	int *last = (int *)(wl + 8);
	const bool pro = a.kraw != nullptr;
	/* The block whose range ends at the token's own position p writes that row into the cache.
	 * It loads its tiles as early as every other block, before the row is there: the warp whose
	 * tile holds p puts the row's new values into its registers itself (kpatch: that tile's
	 * index k among the warp's tiles; rpatch: the row in the tile), whatever the load saw. */
	const bool writer = pro && split == r.nact - 1, late = writer && a.late;
	const int32_t bp = p / FP4S_KV_BLOCK;
	const int32_t kpatch = writer && !late && (bp - b_begin) % W == warp ? (bp - b_begin) / W : -1;
	const int rpatch = p % FP4S_KV_BLOCK;

	/* this warp's tiles: b_begin + warp + k W, k < nt; tile k streams into stage k % S */
	const int32_t nt = b_end - b_begin > warp ? (b_end - b_begin - warp + W - 1) / W : 0;
	auto issue = [&](int32_t k, int32_t blk) {
		P *dst = ring + (size_t)(k % S) * NC * 32;
		const size_t row0 = (size_t)blk * FP4S_KV_BLOCK;
#pragma unroll
		for (int nt2 = 0; nt2 < 2; nt2++)
#pragma unroll
			for (int j = 0; j < NJ; j++)
				att_cp(dst + (nt2 * NJ + j) * 32, kb + (row0 + 8 * nt2 + g) * kvw + 32 * j);
#pragma unroll
		for (int rr = 0; rr < 4; rr++)
#pragma unroll
			for (int h = 0; h < NH; h++)
				att_cp(dst + (2 * NJ + rr * NH + h) * 32, vb + (row0 + vrow(rr)) * kvw + 64 * h);
	};
	/* the tile as loaded (E4M3 pieces stay bytes here: half the registers, and no wait on a
	 * prefetch before its tile is used) */
	P kr[2][NJ], vr[4][NH];
	auto load_k = [&](int32_t blk) {
		const size_t row0 = (size_t)blk * FP4S_KV_BLOCK;
#pragma unroll
		for (int nt2 = 0; nt2 < 2; nt2++)
#pragma unroll
			for (int j = 0; j < NJ; j++)
				kr[nt2][j] = att_ld(kb + (row0 + 8 * nt2 + g) * kvw + 32 * j);
	};
	auto load_v = [&](int32_t blk) {
		const size_t row0 = (size_t)blk * FP4S_KV_BLOCK;
#pragma unroll
		for (int rr = 0; rr < 4; rr++)
#pragma unroll
			for (int h = 0; h < NH; h++)
				vr[rr][h] = att_ld(vb + (row0 + vrow(rr)) * kvw + 64 * h);
	};
	int32_t tb_next = 0;
	/* the first tiles: S into the ring, or one into registers */
	auto start = [&]() {
		if (RING) {
			int32_t tb[4];
#pragma unroll
			for (int k = 0; k < 4; k++)
				tb[k] = k < S && k < nt ? trow[b_begin + warp + k * W] : 0;
#pragma unroll
			for (int k = 0; k < 4; k++)
				if (k < S) {
					if (k < nt)
						issue(k, tb[k]);
					att_cp_commit();
				}
			tb_next = S < nt ? trow[b_begin + warp + S * W] : 0;
		} else if (nt > 0) {
			const int32_t blk = trow[b_begin + warp];
			load_k(blk);
			load_v(blk);
		}
	};
	/* Cached keys and values of earlier steps depend on no kernel of this step: they start
	 * streaming before the wait (with PDL, behind the projections' tail). */
	if (!late)
		start();
	/* So does what the prologue needs besides the new rows: the q/k norm weights (one vector
	 * each, shared by the heads), this thread's rotary pair's cos and sin (where a thread keeps
	 * one pair: 32 W a multiple of rot / 2) and the block table entry of the token's own row.
	 * After the wait the prologue is then one round of loads, not one a row plus these. */
	const int half = a.rot / 2;
	const bool jfix = half > 0 && (32 * W) % half == 0;
	float qnw[D / 32], knw[D / 32], cs0 = 0.0f, sn0 = 0.0f;
	int32_t tbp = 0;
	if (pro) {
#pragma unroll
		for (int e = 0; e < D / 32; e++) {
			qnw[e] = a.qn ? a.qn[lane + 32 * e] : 0.0f;
			knw[e] = a.kn ? a.kn[lane + 32 * e] : 0.0f;
		}
		if (jfix) {
			const float ang = (float)p * a.inv_freq[tid % half];
			cs0 = cosf(ang) * a.mscale, sn0 = sinf(ang) * a.mscale;
		}
		if (writer)
			tbp = trow[bp];
	}
	if (a.trigger == 2) /* diagnostics: the next kernel may launch once the tiles are requested */
		att_grid_trigger();
	att_grid_wait();
	att_mark(tl, 1);

	float *qs = (float *)(smem + att_smem_pro_off(att_smem_bytes<D, W, F8>(S))); /* [G + 2][D] */
	if (pro) {
		/* rows 0..G-1: the group's q heads; G, G + 1 (writer only): the token's k and v. A warp
		 * a row: load (all the warp's rows at once), RMSNorm over D (the sum of squares by
		 * shuffles) */
		const int nrows = writer ? G + 2 : G;
		constexpr int R = (8 + 2 + W - 1) / W; /* rows a warp at most (G <= 8) */
		float xr[R][D / 32];
#pragma unroll
		for (int rr = 0; rr < R; rr++) {
			const int row = warp + rr * W;
			if (row < nrows) {
				const float *src = row < G ? a.q + ((size_t)i * a.nh + (size_t)g0 * G + row) * D
				                           : (row == G ? a.kraw : a.vraw) + ((size_t)i * a.nkv + g0) * D;
#pragma unroll
				for (int e = 0; e < D / 32; e++)
					xr[rr][e] = src[lane + 32 * e];
			}
		}
#pragma unroll
		for (int rr = 0; rr < R; rr++) {
			const int row = warp + rr * W;
			if (row >= nrows)
				break;
			float *x = xr[rr];
			const bool nw = row < G ? a.qn != nullptr : row == G && a.kn != nullptr;
			float ss = 0.0f;
#pragma unroll
			for (int e = 0; e < D / 32; e++)
				ss += x[e] * x[e];
			if (nw) {
				for (int o = 16; o > 0; o >>= 1)
					ss += att_shfl_xor(ss, o);
				const float inv = 1.0f / sqrtf(ss / (float)D + a.eps), z = a.zero_centred ? 1.0f : 0.0f;
#pragma unroll
				for (int e = 0; e < D / 32; e++)
					x[e] = x[e] * inv * (z + (row < G ? qnw[e] : knw[e]));
			}
#pragma unroll
			for (int e = 0; e < D / 32; e++)
				qs[row * D + lane + 32 * e] = x[e];
		}
		att_sync();
		/* RoPE of the q rows and the k row: a thread a rotary pair */
		const int nrot = writer ? G + 1 : G;
		for (int x = tid; x < nrot * half; x += 32 * W) {
			const int row = x / half, j = x - row * half;
			float cs = cs0, sn = sn0;
			if (!jfix) {
				const float ang = (float)p * a.inv_freq[j];
				cs = cosf(ang) * a.mscale, sn = sinf(ang) * a.mscale;
			}
			float *v = qs + row * D;
			const float x1 = v[j], x2 = v[j + half];
			v[j] = x1 * cs - x2 * sn;
			v[j + half] = x2 * cs + x1 * sn;
		}
		att_sync();
		if (writer) {
			/* for the steps to come; this one takes the row from qs (kpatch) */
			const size_t off = ((size_t)tbp * FP4S_KV_BLOCK + rpatch) * kvw + (size_t)g0 * D;
			for (int x = tid; x < 2 * D; x += 32 * W)
				att_kv_put((E *)(x < D ? a.kw : a.vw) + off + (x % D), qs[(G + x / D) * D + x % D]);
			if (late) {
				/* read back through L2 by the block's own loads */
				att_fence();
				att_sync();
				start();
			}
		}
	}

	/* q of head g (zero rows past G): scaled, split into BF16 hi and lo, in this lane's dims */
	uint32_t qh[NJ][4], ql[NJ][4];
	{
		const float *qrow = pro ? qs + (size_t)(g < G ? g : 0) * D
		                        : a.q + ((size_t)i * a.nh + (size_t)g0 * G + (g < G ? g : 0)) * D;
		const float4 *qp = (const float4 *)(qrow + 8 * c);
#pragma unroll
		for (int j = 0; j < NJ; j++) {
			const float4 u = qp[8 * j], v = qp[8 * j + 1];
			const float sc = g < G ? a.qscale : 0.0f;
			const float x[8] = {u.x * sc, u.y * sc, u.z * sc, u.w * sc, v.x * sc, v.y * sc, v.z * sc, v.w * sc};
#pragma unroll
			for (int w = 0; w < 4; w++) {
				const uint32_t h = att_pack(x[2 * w], x[2 * w + 1]);
				qh[j][w] = h;
				ql[j][w] = att_pack(x[2 * w] - att_lo_f(h), x[2 * w + 1] - att_hi_f(h));
			}
		}
	}
	float o[NH * 8][4];
#pragma unroll
	for (int t = 0; t < NH * 8; t++)
		o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
	float m = -INFINITY, l = 0.0f;
	att_mark(tl, 2);

	for (int32_t k = 0; k < nt; k++) {
		const int32_t b = b_begin + warp + k * W;
		/* the table entry used next: tile k + S + 1 (ring) or k + 1 (registers) */
		const int32_t tb_after = k + S + (RING ? 1 : 0) < nt ? trow[b_begin + warp + (k + S + (RING ? 1 : 0)) * W] : 0;
		if (RING) {
			att_cp_wait(S - 1);
			const P *src = ring + (size_t)(k % S) * NC * 32;
#pragma unroll
			for (int nt2 = 0; nt2 < 2; nt2++)
#pragma unroll
				for (int j = 0; j < NJ; j++)
					kr[nt2][j] = src[(nt2 * NJ + j) * 32];
#pragma unroll
			for (int rr = 0; rr < 4; rr++)
#pragma unroll
				for (int h = 0; h < NH; h++)
					vr[rr][h] = src[(2 * NJ + rr * NH + h) * 32];
		}
		if (k == kpatch) {
			/* the token's own row: k and v as the prologue left them in qs (rows G, G + 1) */
			const float *kn = qs + (size_t)G * D, *vn = kn + D;
#pragma unroll
			for (int nt2 = 0; nt2 < 2; nt2++)
				if (8 * nt2 + g == rpatch)
#pragma unroll
					for (int j = 0; j < NJ; j++)
						kr[nt2][j] = att_piece_of(kn + 32 * j + 8 * c, (const E *)nullptr);
#pragma unroll
			for (int rr = 0; rr < 4; rr++)
				if (vrow(rr) == rpatch)
#pragma unroll
					for (int h = 0; h < NH; h++)
						vr[rr][h] = att_piece_of(vn + 64 * h + 8 * g, (const E *)nullptr);
		}
		/* scores: s[nt] rows g (hi) and g + 8 (lo) for keys 8 nt + 2c, 8 nt + 2c + 1 */
		float s[2][4];
#pragma unroll
		for (int nt2 = 0; nt2 < 2; nt2++) {
			s[nt2][0] = s[nt2][1] = s[nt2][2] = s[nt2][3] = 0.0f;
#pragma unroll
			for (int j = 0; j < NJ; j++) {
				const att_u4 kk = att_bf16x8(kr[nt2][j]);
				att_mma(s[nt2], qh[j][0], ql[j][0], qh[j][1], ql[j][1], kk.x, kk.y);
				att_mma(s[nt2], qh[j][2], ql[j][2], qh[j][3], ql[j][3], kk.z, kk.w);
			}
		}
		if (!RING && k + 1 < nt)
			load_k(tb_after); /* the scores are out of the K registers */
		/* key r of this tile is position 16 b + r; valid in [start, p] */
		const int32_t t0 = b * FP4S_KV_BLOCK;
		const bool full = t0 >= r.start && t0 + FP4S_KV_BLOCK - 1 <= p;
		float x[2][2];
#pragma unroll
		for (int nt2 = 0; nt2 < 2; nt2++)
#pragma unroll
			for (int e = 0; e < 2; e++) {
				const int32_t kp = t0 + 8 * nt2 + 2 * c + e;
				const float v = s[nt2][e] + s[nt2][e + 2];
				x[nt2][e] = full || (kp >= r.start && kp <= p) ? v : -INFINITY;
			}
		float mt = fmaxf(fmaxf(x[0][0], x[0][1]), fmaxf(x[1][0], x[1][1]));
		mt = fmaxf(mt, att_shfl_xor(mt, 1));
		mt = fmaxf(mt, att_shfl_xor(mt, 2));
		const float mn = fmaxf(m, mt); /* finite: every tile holds a valid key */
		const float alpha = att_ex2(m - mn);
		m = mn;
		float pr[2][2];
#pragma unroll
		for (int nt2 = 0; nt2 < 2; nt2++)
#pragma unroll
			for (int e = 0; e < 2; e++)
				pr[nt2][e] = att_ex2(x[nt2][e] - mn);
		l = l * alpha + ((pr[0][0] + pr[0][1]) + (pr[1][0] + pr[1][1]));
#pragma unroll
		for (int t = 0; t < NH * 8; t++)
			o[t][0] *= alpha, o[t][1] *= alpha, o[t][2] *= alpha, o[t][3] *= alpha;
		uint32_t ph[2], pl[2];
#pragma unroll
		for (int nt2 = 0; nt2 < 2; nt2++) {
			ph[nt2] = att_pack(pr[nt2][0], pr[nt2][1]);
			pl[nt2] = att_pack(pr[nt2][0] - att_lo_f(ph[nt2]), pr[nt2][1] - att_hi_f(ph[nt2]));
		}
		if (!full) {
#pragma unroll
			for (int rr = 0; rr < 4; rr++) {
				const int32_t kp = t0 + vrow(rr);
				if (kp < r.start || kp > p)
#pragma unroll
					for (int h = 0; h < NH; h++)
						vr[rr][h] = P{}; /* zero bytes: +0 in either format */
			}
		}
#pragma unroll
		for (int h = 0; h < NH; h++) {
			const att_u4 w0 = att_bf16x8(vr[0][h]), w1 = att_bf16x8(vr[1][h]), w2 = att_bf16x8(vr[2][h]),
			             w3 = att_bf16x8(vr[3][h]);
			const uint32_t v0[4] = {w0.x, w0.y, w0.z, w0.w};
			const uint32_t v1[4] = {w1.x, w1.y, w1.z, w1.w};
			const uint32_t v2[4] = {w2.x, w2.y, w2.z, w2.w};
			const uint32_t v3[4] = {w3.x, w3.y, w3.z, w3.w};
#pragma unroll
			for (int t = 0; t < 8; t++) {
				const uint32_t sel = (t & 1) ? 0x7632u : 0x5410u;
				const uint32_t b0 = att_prmt(v0[t >> 1], v1[t >> 1], sel);
				const uint32_t b1 = att_prmt(v2[t >> 1], v3[t >> 1], sel);
				att_mma(o[h * 8 + t], ph[0], pl[0], ph[1], pl[1], b0, b1);
			}
		}
		if (RING) {
			/* the stage is consumed: refill it with tile k + S */
			if (k + S < nt)
				issue(k + S, tb_next);
			att_cp_commit();
			tb_next = tb_after;
		} else if (k + 1 < nt) {
			load_v(tb_after);
		}
	}
	/* The tiles are done: the next kernel (the o-projection, which wants whole SMs) may launch
	 * now and start its weight loads while the merges run (the default since session 11: +0.7 to
	 * +1.5 % decode, bench/results/2026-11-22-h100-session11.md). Triggering at the top, before
	 * the tiles stream, cost 10 % in session 3 and 4 % on qwen3-30b-a3b and gpt-oss-20b now. */
	if (a.trigger == 1)
		att_grid_trigger();
	att_mark(tl, 4);
	l += att_shfl_xor(l, 1);
	l += att_shfl_xor(l, 2);

	/* merge the block's warps: scale each warp's output to the block max, sum through smem
	 * (the outputs reuse the ring: every warp is past its tiles after the first barrier) */
	if (c == 0) {
		sm_m[warp * 8 + g] = m;
		sm_l[warp * 8 + g] = l;
	}
	att_sync();
	float *sm_o = (float *)smem; /* [W][8][D] */
	float mb = -INFINITY;
#pragma unroll
	for (int w = 0; w < W; w++)
		mb = fmaxf(mb, sm_m[w * 8 + g]);
	const float f = m == -INFINITY ? 0.0f : att_ex2(m - mb);
	const bool whole = r.nact == 1;
	/* per head, once (not per output element): the warps' maximum and the denominator, with
	 * the sink's part for a whole range (wt[0..2][head]: free until the merge below) */
	if (tid < G) {
		float mx = -INFINITY;
#pragma unroll
		for (int w = 0; w < W; w++)
			mx = fmaxf(mx, sm_m[w * 8 + tid]);
		float den = 0.0f, sc = 1.0f;
#pragma unroll
		for (int w = 0; w < W; w++)
			den += sm_m[w * 8 + tid] == -INFINITY ? 0.0f : sm_l[w * 8 + tid] * att_ex2(sm_m[w * 8 + tid] - mx);
		if (whole && a.sinks) {
			const float s2 = a.sinks[g0 * G + tid] * ATT_LOG2E, mm = fmaxf(mx, s2);
			sc = att_ex2(mx - mm);
			den = den * sc + att_ex2(s2 - mm);
		}
		wt[0][tid] = mx, wt[1][tid] = den, wt[2][tid] = sc;
	}
	/* 16-byte stores: the lanes' rows are D floats apart, all on the same banks, so scalar
	 * stores were 16-way conflicts */
#pragma unroll
	for (int h = 0; h < NH; h++) {
		float *dst = sm_o + ((size_t)warp * 8 + g) * D + 64 * h + 16 * c;
#pragma unroll
		for (int t = 0; t < 8; t += 4) {
			float4 lo, hi;
			lo.x = (o[h * 8 + t][0] + o[h * 8 + t][2]) * f, hi.x = (o[h * 8 + t][1] + o[h * 8 + t][3]) * f;
			lo.y = (o[h * 8 + t + 1][0] + o[h * 8 + t + 1][2]) * f;
			hi.y = (o[h * 8 + t + 1][1] + o[h * 8 + t + 1][3]) * f;
			lo.z = (o[h * 8 + t + 2][0] + o[h * 8 + t + 2][2]) * f;
			hi.z = (o[h * 8 + t + 2][1] + o[h * 8 + t + 2][3]) * f;
			lo.w = (o[h * 8 + t + 3][0] + o[h * 8 + t + 3][2]) * f;
			hi.w = (o[h * 8 + t + 3][1] + o[h * 8 + t + 3][3]) * f;
			*(float4 *)(dst + t) = lo;
			*(float4 *)(dst + 8 + t) = hi;
		}
	}
	att_sync();
	if (whole)
		att_mark(tl, 6);
	float *part = a.work + ((size_t)i * a.nkv + g0) * a.region;
	float *ml = part + (size_t)a.splits * G * D;
	for (int32_t x = tid; x < G * D; x += 32 * W) {
		const int32_t gg = x / D, j = x - gg * D;
		const float den = wt[1][gg];
		float acc = 0.0f;
#pragma unroll
		for (int w = 0; w < W; w++)
			acc += sm_o[((size_t)w * 8 + gg) * D + j];
		if (whole) {
			const int32_t h = g0 * G + gg;
			if (a.sinks)
				acc *= wt[2][gg];
			a.out[((size_t)i * a.nh + h) * D + j] = acc / den;
		} else {
			part[((size_t)split * G + gg) * D + j] = acc;
			if (j == 0) {
				ml[2 * ((size_t)split * G + gg)] = wt[0][gg];
				ml[2 * ((size_t)split * G + gg) + 1] = den;
			}
		}
	}
	if (whole)
		att_mark(tl, 5);
	if (whole || !a.counters)
		return;
	/* the last block of this (token, KV head) to get here merges every split's partial */
	const float *sk = a.sinks ? a.sinks + (size_t)g0 * G : nullptr;
	float *og = a.out + ((size_t)i * a.nh + (size_t)g0 * G) * D;
	unsigned *cnt = a.counters + (size_t)i * a.nkv + g0;
	if (a.oldmerge)
		att_fence();
	att_sync();
	att_mark(tl, 5);
	if (tid == 0)
		*last = (a.oldmerge ? att_atomic_inc(cnt) : att_atomic_inc_ar(cnt)) == (unsigned)r.nact - 1;
	att_sync();
	if (!*last)
		return;
	att_mark(tl, 6);
	if (a.oldmerge)
		att_fence();
	if (!a.oldmerge && G * D / 4 <= 32 * W) {
		if (ATT_MERGE_CP && !(F8 && !RING))
			att_merge_cp<D, 32 * W>(part, ml, r.nact, G, sk, og, tid, wt, wl, (float4 *)smem,
			                        (int32_t)(att_smem_ring<D, W, F8>(S) / 16));
		else
			att_merge_regs<D, 32 * W>(part, ml, r.nact, G, sk, og, tid, wt, wl, (float4 *)smem);
	} else
		att_merge_group<D>(part, ml, r.nact, G, sk, og, tid, 32 * W, wt, wl, (float4 *)smem);
	if (tid == 0)
		*cnt = 0u; /* ready for the next call */
	att_mark(tl, 7);
}

#endif
