/* ostep.cuh: the one-launch decode step of a gpt-oss model (gpt-oss-20b's and -120b's geometry:
 * hidden 2880, 64 query heads over 8 kv heads of 64, BF16 attention weights with biases, sinks,
 * a sliding window of <= 128 positions on the layers that have one; MXFP4 experts, top-4 of 32 or
 * 128, gpt-oss's clamped SwiGLU; BF16 KV). ostep.cu launches it. It is the MoE step's form
 * (mstep.cuh: one cooperative launch for all layers, phases handing over through counters, a
 * producer warp a block streaming weights into a shared-memory ring in program order) with
 * gpt-oss's phases:
 *   qkv   320 tiles of 16 rows, K 2880 in 5 BF16 stages of 576 (x = RMSNorm(h), plain BF16 hi /
 *         lo); + bias; q to q, k to kraw, v into the cache at pos
 *   attn  8 x S splits (S = 1 on a sliding layer: its window is one or two chunks), a kv head's 8
 *         query heads each, in chunks of 128 keys a warp at a time (mg_attn_keys); with S > 1
 *         then 64 merges; the sink joins each head's denominator
 *   o     180 tiles, K 4096 in 8 BF16 stages of 512, h2 = h + o + bias; then the tile's share of
 *         the router's logits (mstep's fold), added in fixed point (the same bits in any order)
 *   route every block: logits = the shares / rms + bias, the top-4 (the producer's expert copies
 *         go), then x = RMSNorm(h2) staged, softmax over the 4
 *   gu    4 slots x 360 tiles (the experts' interleaved gate / up rows), one ring slot a tile
 *         (codes and scales by two bulk copies), + bias, the clamped SwiGLU
 *   down  4 slots x 180 tiles, yd[slot] = w_slot (down + bias): one slot a task, so the 720 tasks
 *         spread evenly (a row tile's 4 slots a task would leave 48 of 132 blocks twice the work);
 *         a block's 5-6 tasks are consecutive (os_d0), so they need 1 or 2 slots' x, not 4
 * The layer's output h' = h2 + yd[0] + .. + yd[3] is never written: whoever reads it sums it in
 * one order (os_h4, os_h1), and the last layer's is written once all its down tasks are in.
 *
 * Why: gpt-oss-120b's layer path spends ~64 us a layer on the H200 for ~106 MB (1.7 TB/s; four
 * launches a layer in a chain), and the two earlier step kernels took qwen3-30b-a3b from 476 to
 * 672 tok/s and llama3-8b from 465 to 538 (docs/status.md). Measured on the H200
 * (bench/results/2026-11-30-h200-session45.md): gpt-oss-120b 404 -> 475 tok/s (388 -> 450 at
 * depth 4096), gpt-oss-20b 605-610 -> 680-689 (573-577 -> 647-649). FP4S_OSTEP_TL's marks put a
 * layer of gpt-oss-20b at ~47 us: qkv ~9 (at the copy ceiling once x is staged), the attention 3
 * (7-8 on a full layer at depth 4096), o ~7, the route ~1.7, gate|up ~15 and the down ~8.5. The
 * expert tiles are bound by their decode: ~1.2-1.4 us a 24 KB tile with every stage in shared
 * memory, where the copy ceiling would take 0.8; so 7 more warps join those phases (OS_XW,
 * session 46: gpt-oss-120b 482 -> 501 tok/s, 456 -> 475 at depth; gpt-oss-20b 707 -> 733, 660 ->
 * 697). Not kept: the o tiles past the grid in K halves (the o phase ended no sooner).
 *
 * Shared memory: 7 ring slots of 24 KB (a 16-row MXFP4 expert tile is 23,040 code bytes and 1,440
 * scale bytes; a BF16 stage 18,432 or 16,384; a chunk's K or V <= 144 rows of 128 bytes) and the
 * down's x for 4 slots (4 x 2 x 5920 bytes) with room for the tiles' row sums. */
#ifndef FP4S_OSTEP_CUH
#define FP4S_OSTEP_CUH

#define OS_NS 7 /* ring slots */
#define MG_NS OS_NS
#define MG_HELPERS_ONLY
#include "backend/cuda/mstep_kernel.cuh"

#define OS_H 2880
#define OS_NQ 64
#define OS_NKV 8
#define OS_GQ 8 /* query heads a kv head */
#define OS_HD 64
#define OS_QR (OS_NQ * OS_HD)                 /* 4096 */
#define OS_KVW (OS_NKV * OS_HD)               /* 512 */
#define OS_QKV (OS_QR + 2 * OS_KVW)           /* 5120 */
#define OS_FI 2880
#define OS_K 4      /* experts a token */
#define OS_EMAX 128 /* experts at most */
#define OS_WMAX 128 /* a sliding window's positions at most */
#define OS_SLOT 24576 /* ring slot bytes (a 1024 multiple: the swizzled copies count lines from 1024-byte bounds) */
#define OS_QKV_TILES (OS_QKV / 16)
#define OS_O_TILES (OS_H / 16)
#define OS_GU_TILES (2 * OS_FI / 16) /* a slot's */
#define OS_D_TILES (OS_H / 16)       /* a slot's */
#define OS_QCH 9 /* qkv: 64-K chunks a stage (576 K: 18,432 bytes) */
#define OS_QST 5 /* its stages a tile */
#define OS_OCH 8 /* o: 512 K a stage */
#define OS_OST 8
#define OS_MXC 1440 /* an MXFP4 row's code bytes (2880 K) */
#define OS_MXS 90   /* its E8M0 scale bytes */
#define OS_MXSTEPS 23 /* 128-K steps a row: 22, and half of one (its last 64 K zero-padded) */
#define OS_CSX 5920   /* gm_col_stride(92): a staged MXFP4 x column (2944 K, zeros past 2880) */
#define OS_XLO_H (2 * OS_H + 16)   /* a plain x's lo half after its hi (banks 4 apart) */
#define OS_XLO_Q (2 * OS_QR + 16)
#define OS_T 128  /* the attention's chunk */
#define OS_PS (OS_HD + 4) /* a split's partial a head: 64 sums, max, sum, 2 spare */
#define OS_NTQ 3  /* qkv tiles a block at most (G >= 107) */
#define OS_NTG 12 /* gate|up tiles (G >= 120) */
#define OS_NTD 6  /* down tasks (G >= 120) */
#define OS_GMIN 120
/* consumer warps of the expert phases only (gate|up, down): the expert tiles are bound by their
 * decode with 8 warps (session 45), so more join there; the other phases keep warps 0-7. 13 or
 * 16 warps a block cap a thread at 128 registers (4 warps on a scheduler's 16K), 12 at 168.
 * Measured in one call (H200, session 46) against the kernel before these warps: 7 (16 warps,
 * 16 bytes of spills) gpt-oss-20b +3.6 % at tg128 and +5.5 % at depth 4096, gpt-oss-120b +4.1 /
 * +4.2 %; 4 +0.9-2.9 %; 0 (this code, 8 warps) +1.8-4.0 %; 3 (no spills) slower than none. */
#ifndef OS_XW
#define OS_XW 7
#endif
#define OS_CW (MG_W + OS_XW)
#define OS_THREADS ((OS_CW + 1) * 32)
#define OS_MXQ ((OS_MXSTEPS + OS_CW - 1) / OS_CW) /* an expert tile's steps a warp at most */
#define OS_XS (4 * 2 * OS_CSX + OS_CW * OS_NTD * 16 * 4 + 1024) /* the down's x, its row sums, spare */
#define OS_SMEM (OS_NS * OS_SLOT + OS_XS + 256)

enum { O_QKV, O_ATT, O_O, O_GU, O_D, O_N };
/* timeline marks a block (FP4S_OSTEP_TL): the layer's start (the last one's down seen), qkv's x
 * staged, qkv published, the attention and merges done, o's wait over, o published, the route's
 * wait over, the top-k, gate|up published, the down's wait over, its x staged, the down published;
 * the producer's: the top-k seen, its last expert copy issued */
enum { OT_START, OT_QX, OT_QKV, OT_ATT, OT_OSEEN, OT_O, OT_RSEEN, OT_TOPK, OT_GU, OT_DSEEN, OT_DX, OT_D, OT_PSEL,
       OT_PEND, OT_N };
#define OS_CNT (O_N + OS_NKV) /* counters a layer: the phases', then each kv head's splits */

/* a layer: biases (qkv [5120], o [2880], the experts' gate|up [E][5760] and down [E][2880]),
 * sinks [64], norms, the router (reordered [180][E][16] BF16) and its bias [E], the experts'
 * codes and scales (stacked at the args' strides), the KV blocks */
struct os_layer {
	const float *bqkv, *bo, *bgu, *bdn, *sinks, *n1, *n2, *rb;
	const __nv_bfloat16 *rt;
	const uint8_t *gu, *gu_s, *dn, *dn_s;
	__nv_bfloat16 *kc, *vc; /* [block][MG_KVB][NKV][HD] */
	int window;             /* 0: full attention */
};

enum { OM_QKV, OM_O, OM_N }; /* a layer's tensor maps */

struct os_args {
	const os_layer *ly;
	int L, E;
	float eps, scale, mscale, alpha, limit;
	int pexp_gu, pexp_dn; /* MXFP4: y = ldexp(sum, pexp) (gemv_mma.cu gm_scale_params) */
	uint32_t ec_gu, ec_dn;
	const float *inv_freq; /* [HD / 2] */
	const int32_t *pos, *seq, *table;
	int table_stride, nb;
	size_t gu_stride, gus_stride, dn_stride, dns_stride;
	const CUtensorMap *maps;  /* [L][OM_N] */
	const CUtensorMap *kvmap; /* [2]: K, V pools as {64, pos 16, kv head, block}, box {64, 16, 1, 1} */
	const float *hin;
	float *hout;
	float *h2;    /* [L][H] */
	float *yd;    /* [L][K][H] each slot's weighted down output */
	float *q, *kraw, *att;
	float *part;  /* [NKV][S][GQ][OS_PS] */
	long long *lacc; /* [L][E] the router's unnormalized logits in fixed point (2^32), zero at launch */
	float *act;   /* [L][K][FI] */
	unsigned *cnt; /* [L][OS_CNT], zero at launch */
	unsigned long long *tl; /* [G][OT_N] marks of layer tl_layer (NULL: none), zero at launch */
	int tl_layer;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
static __device__ __forceinline__ void os_mark(const os_args &a, int l, int ph, int tid)
{
	if (a.tl && l == a.tl_layer && tid == 0)
		a.tl[blockIdx.x * OT_N + ph] = gm_now();
}

/* layer l's input, 4 values at float4 i: the layer before's h2 plus its 4 slots' outputs, summed
 * in this one order wherever it is read */
static __device__ __forceinline__ float4 os_h4(const os_args &a, int l, int i)
{
	if (l == 0)
		return __ldcg(reinterpret_cast<const float4 *>(a.hin) + i);
	const float4 *h2 = reinterpret_cast<const float4 *>(a.h2 + (size_t)(l - 1) * OS_H);
	const float4 *y = reinterpret_cast<const float4 *>(a.yd + (size_t)(l - 1) * OS_K * OS_H);
	float4 v = __ldcg(h2 + i);
	float4 d[OS_K];
#pragma unroll
	for (int s = 0; s < OS_K; s++)
		d[s] = __ldcg(y + s * (OS_H / 4) + i);
#pragma unroll
	for (int s = 0; s < OS_K; s++)
		v.x += d[s].x, v.y += d[s].y, v.z += d[s].z, v.w += d[s].w;
	return v;
}

static __device__ __forceinline__ float os_h1(const os_args &a, int l, int r)
{
	if (l == 0)
		return __ldcg(a.hin + r);
	const float *y = a.yd + (size_t)(l - 1) * OS_K * OS_H + r;
	float v = __ldcg(a.h2 + (size_t)(l - 1) * OS_H + r);
	float d[OS_K];
#pragma unroll
	for (int s = 0; s < OS_K; s++)
		d[s] = __ldcg(y + s * OS_H);
#pragma unroll
	for (int s = 0; s < OS_K; s++)
		v += d[s];
	return v;
}

/* 4 values at k (k % 4 == 0) as plain BF16 hi (at xs) and lo (at xs + xlo) */
static __device__ __forceinline__ void os_put_plain(uint8_t *xs, int xlo, int k, const float4 v)
{
	uint32_t hi[2], lo[2];
	hi[0] = gm_split(v.x, v.y, lo[0]);
	hi[1] = gm_split(v.z, v.w, lo[1]);
	*reinterpret_cast<uint2 *>(xs + 2 * k) = make_uint2(hi[0], hi[1]);
	*reinterpret_cast<uint2 *>(xs + xlo + 2 * k) = make_uint2(lo[0], lo[1]);
}

/* 720 float4s of a 2880 vector by 256 threads: rounds u of float4 tid + 256 u */
#define OS_R4 3

/* x = RMSNorm(v; nw) over H into xs, plain (BF16 hi / lo: the qkv's). v's float4s given (vin[u]:
 * float4 tid + 256 u, zeros past 720). Returns 1 / rms. */
static __device__ float os_stage_norm(const float4 (&vin)[OS_R4], const float *nw, float eps, uint8_t *xs, float *sred,
                                      int tid)
{
	float4 w[OS_R4];
	float ss = 0.0f;
#pragma unroll
	for (int u = 0; u < OS_R4; u++) {
		const int i = tid + 256 * u;
		w[u] = i < OS_H / 4 ? __ldg(reinterpret_cast<const float4 *>(nw) + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		ss += vin[u].x * vin[u].x + vin[u].y * vin[u].y + vin[u].z * vin[u].z + vin[u].w * vin[u].w;
	}
	const float tot = mg_block_sum(ss, sred, tid);
	const float r = 1.0f / sqrtf(tot / (float)OS_H + eps);
#pragma unroll
	for (int u = 0; u < OS_R4; u++) {
		const int i = tid + 256 * u;
		const float4 x = make_float4(vin[u].x * r * w[u].x, vin[u].y * r * w[u].y, vin[u].z * r * w[u].z,
		                             vin[u].w * r * w[u].w);
		if (i < OS_H / 4)
			os_put_plain(xs, OS_XLO_H, 4 * i, x);
	}
	gt_sync();
	return r;
}

/* the first of block b's down tasks (b = G: their count): consecutive tasks a block, so that its
 * 5-6 tasks fall in 1 or 2 slots (b + k G touched all 4, and every block staged all 4 slots' x:
 * 132 x 46 KB of L2 reads, ~1.4 us a layer) */
static __device__ __forceinline__ int os_d0(int b, int G)
{
	return b * (OS_K * OS_D_TILES) / G;
}

/* the down's x: slots s0 .. s0 + ns - 1 (ns <= 2) of the SwiGLU outputs (v: [4][2880] floats)
 * staged in the MXFP4 tiles' layout, slot s at xs + s 2 OS_CSX (zeros past 2880), by the 256
 * consumer threads; all loads a thread in flight before the first is used (a slot at a time: 2.2
 * us a layer of gpt-oss-120b) */
static __device__ __forceinline__ void os_stage_act(const float *v, uint8_t *xs, int s0, int ns, int tid)
{
	float4 r[2][OS_R4];
#pragma unroll
	for (int s = 0; s < 2; s++)
#pragma unroll
		for (int u = 0; u < OS_R4; u++) {
			const int i = tid + 256 * u;
			r[s][u] = s < ns && i < OS_H / 4 ? __ldcg(reinterpret_cast<const float4 *>(v + (s0 + s) * OS_FI) + i)
			                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		}
#pragma unroll
	for (int s = 0; s < 2; s++)
		if (s < ns)
#pragma unroll
			for (int u = 0; u < OS_R4; u++) {
				const int i = tid + 256 * u;
				if ((i & ~31) < OS_H / 4 + 16) /* warp-uniform: warps past the padding skip */
					mg_put4(xs + (s0 + s) * 2 * OS_CSX, OS_CSX, 4 * i, r[s][u], tid & 31);
			}
}

/* ---- the tiles ----------------------------------------------------------------------------- */

/* a consumer warp's hand-back of a stage the expert-only warps do not read: warp 0 arrives for
 * them too (the empty barriers count OS_CW arrivals) */
static __device__ __forceinline__ void os_arrive(uint64_t *b, int warp)
{
	gt_arrive_n(b, warp == 0 ? 1 + OS_XW : 1);
}

/* the expert phases' barrier: all OS_CW consumer warps */
static __device__ __forceinline__ void os_xsync(void)
{
	asm volatile("bar.sync 2, %0;" ::"n"(OS_CW * 32) : "memory");
}

static __device__ __forceinline__ uint32_t os_lds32(uint32_t sa)
{
	uint32_t v;
	asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(sa));
	return v;
}

/* one BF16 stage (16 rows of NCH chunks of 64 K, [chunk][row][128 bytes] with the 128-byte
 * swizzle) at st into acc, x plain at xcol (this lane's column: hi or lo, offset to K kb + 2c):
 * the warp's 16-K steps w, w + 8, ... A (the weights) by ldmatrix, B x's hi / lo columns, so
 * that lane c = 0 ends with rows g and g + 8 (columns 0 + 1) */
template <int NCH>
static __device__ __forceinline__ void os_bf_stage(float (&acc)[4], uint32_t st, uint32_t xcol, int warp, int lane)
{
	const int r = (lane & 7) + ((lane >> 3) & 1) * 8, hu = lane >> 4;
	const uint32_t rb = st + (uint32_t)(r * 128);
#pragma unroll
	for (int s = warp; s < 4 * NCH; s += MG_W) {
		const int ch = s >> 2, u = ((s & 3) << 1) | hu;
		uint32_t a0, a1, a2, a3;
		mg_ldsm4(rb + (uint32_t)(ch * 2048 + ((u ^ (r & 7)) << 4)), a0, a1, a2, a3);
		const uint32_t b0 = os_lds32(xcol + (uint32_t)(32 * s)), b1 = os_lds32(xcol + (uint32_t)(32 * s + 16));
		gm_mma(acc, a0, a1, a2, a3, b0, b1);
	}
}

/* n <= NT tiles of nst BF16 stages (NCH chunks each) from the ring, x plain at xs_sa (lo at
 * xlo); the warps' row sums into red[(w NT + k) 16 + row] (one barrier at the end) */
template <int NCH, int NT>
static __device__ __forceinline__ void os_bf_tiles(int n, int nst, gt_pos &pos, uint64_t *full, uint64_t *empty,
                                                   uint32_t ring_sa, uint32_t xs_sa, int xlo, float *red, int warp,
                                                   int lane)
{
	const int g = lane >> 2, c = lane & 3;
#pragma unroll 1
	for (int k = 0; k < n; k++) {
		float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
		for (int cs = 0; cs < nst; cs++) {
			mg_wbar(&full[pos.i], pos.ph, 1, pos.n);
			const uint32_t xcol = xs_sa + (uint32_t)((g & 1) * xlo + 2 * (cs * NCH * 64 + 2 * c));
			os_bf_stage<NCH>(acc, ring_sa + (uint32_t)pos.i * OS_SLOT, xcol, warp, lane);
			__syncwarp();
			if (lane == 0)
				os_arrive(&empty[pos.i], warp);
			gt_next(pos, OS_NS);
		}
		if (c == 0) {
			red[(warp * NT + k) * 16 + g] = acc[0] + acc[1];
			red[(warp * NT + k) * 16 + 8 + g] = acc[2] + acc[3];
		}
	}
	gt_sync();
}

/* MMA row g of an MXFP4 tile is its row os_pi(g) (bits 0 and 1 swapped): rows 1,440 bytes apart
 * put a quarter warp's two rows (g = 2q, 2q + 1) on overlapping banks; rows 2 apart (2,880 bytes,
 * 64 mod 128) fall on complementary halves of the 128 bytes, so the code loads are conflict-free */
static __device__ __forceinline__ int os_pi(int g)
{
	return (g & 4) | ((g & 1) << 1) | ((g >> 1) & 1);
}

/* gm_step<GM_MXFP4, 1> with its 8 MMAs in two accumulator chains (j even, odd): one chain measured
 * 0.8-1.7 % slower on gpt-oss-20b at 128 tokens, the same at depth 4096 (session 45) */
static __device__ __forceinline__ void os_gm_mx2(float (&acc)[2][4], const uint4 wqa, const uint4 wqb, uint32_t cai,
                                                 uint32_t cbi, uint32_t ec, uint32_t xcol, int lc)
{
	const uint32_t ea = cai & 0x100u ? 0u : ((cai + ec) << 7), eb = cbi & 0x100u ? 0u : ((cbi + ec) << 7);
	const uint32_t s_a = ea | (ea << 16), s_b = eb | (eb << 16);
	const int sw = (lc >> 1) & 1;
#pragma unroll
	for (int j = 0; j < 4; j++) {
		const uint32_t w0 = gm_word(wqa, j), w1 = gm_word(wqb, j);
		uint32_t A0[4], A1[4];
#pragma unroll
		for (int k = 0; k < 4; k++) {
			A0[k] = gm_hmul2(gm_pair(w0, k), s_a);
			A1[k] = gm_hmul2(gm_pair(w1, k), s_b);
		}
		const uint4 xb = gm_lds128(xcol + (uint32_t)(lc * 64 + ((j ^ sw) * 16)));
		gm_mma(acc[j & 1], A0[0], A1[0], A0[1], A1[1], xb.x, xb.y);
		gm_mma(acc[j & 1], A0[2], A1[2], A0[3], A1[3], xb.z, xb.w);
	}
}

/* n <= NT MXFP4 tiles, one ring slot each, by all OS_CW consumer warps (steps w, w + OS_CW), x staged
 * at xcol(k) for tile k (this lane's column); the warps' row sums (memory row order) into red[(w NT
 * + k) 16 + row], mg_rowsum_k<NT, OS_CW> adds them */
template <int NT, typename XcolF>
static __device__ __forceinline__ void os_mx_tiles(int n, gt_pos &pos, uint64_t *full, uint64_t *empty,
                                                   uint32_t ring_sa, XcolF xcol, uint32_t ec, float *red, int warp,
                                                   int lane)
{
	const int g = lane >> 2;
#pragma unroll 1
	for (int k = 0; k < n; k++) {
		float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
		const uint32_t xc[1] = {xcol(k) + (uint32_t)((g & 1) * OS_CSX)};
		mg_wbar(&full[pos.i], pos.ph, 1, pos.n);
		const uint32_t st = ring_sa + (uint32_t)pos.i * OS_SLOT;
		{
			float a2[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
			const int t4 = lane & 3, row = os_pi(g);
			/* every step's codes and scales loaded before the first decode (step by step measured
			 * 1.3-1.4 % slower on gpt-oss-120b, session 45) */
			uint4 wa[OS_MXQ], wb[OS_MXQ];
			uint32_t sa[OS_MXQ], sc[OS_MXQ];
#pragma unroll
			for (int q = 0; q < OS_MXQ; q++) {
				const int s = min(warp + OS_CW * q, OS_MXSTEPS - 1), ch = 4 * s + t4;
				const uint32_t cb = st + (uint32_t)(row * OS_MXC + s * 64 + t4 * 16);
				wa[q] = gm_lds128(cb), wb[q] = gm_lds128(cb + 8 * OS_MXC);
				const uint32_t sb = st + (uint32_t)(16 * OS_MXC + row * OS_MXS + min(ch, OS_H / 32 - 1));
				sa[q] = gt_lds8(sb), sc[q] = gt_lds8(sb + 8 * OS_MXS);
				if (ch >= OS_H / 32)
					sa[q] = sc[q] = 0x100u;
			}
#pragma unroll
			for (int q = 0; q < OS_MXQ; q++)
				if (warp + OS_CW * q < OS_MXSTEPS)
					os_gm_mx2(a2, wa[q], wb[q], sa[q], sc[q], ec, xc[0], 4 * (warp + OS_CW * q) + t4);
#pragma unroll
			for (int e = 0; e < 4; e++)
				acc[0][e] = a2[0][e] + a2[1][e];
		}
		__syncwarp();
		if (lane == 0)
			gt_arrive(&empty[pos.i]);
		gt_next(pos, OS_NS);
		if ((lane & 3) == 0) {
			const int row = os_pi(g);
			red[(warp * NT + k) * 16 + row] = acc[0][0] + acc[0][1];
			red[(warp * NT + k) * 16 + 8 + row] = acc[0][2] + acc[0][3];
		}
	}
	os_xsync();
}

#include "backend/cuda/ostep_attn.cuh"

/* ---- the route ----------------------------------------------------------------------------- */

/* every block once the o tiles are in: the logits (the o tiles' fixed-point sums) / rms + bias,
 * the top-4 by ranks (lower index first on ties), after_sel() once sel is final, then x =
 * RMSNorm(h2) staged for the gate|up (MXFP4 layout) and the softmax over the 4. The logits are
 * the layer path's (moe_tma.cu) but for the shares' row grouping. scr: E + 8 floats, then 256
 * ints (the ranks' parts). (The o tiles' parts summed here from [180][E] floats took 4.7 us a
 * layer of gpt-oss-120b: 92 KB of L2 reads a block.) */
template <typename AfterSel>
static __device__ void os_route(const os_args &a, const os_layer &ly, int l, uint8_t *xs, float *sred, float *scr,
                                int *sel, float *selw, int tid, AfterSel after_sel)
{
	const int E = a.E;
	const float *h2 = a.h2 + (size_t)l * OS_H;
	float4 hv[OS_R4];
#pragma unroll
	for (int u = 0; u < OS_R4; u++) {
		const int i = tid + 256 * u;
		hv[u] = i < OS_H / 4 ? __ldcg(reinterpret_cast<const float4 *>(h2) + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
	}
	const long long q = tid < E ? __ldcg(a.lacc + (size_t)l * E + tid) : 0;
	const float rb = tid < E ? __ldg(ly.rb + tid) : 0.0f;
	float *lg = scr, *sv = scr + OS_EMAX;
	int *rk = reinterpret_cast<int *>(sv + 8);
	/* the top-k first, x staged once the producer has it (x staged first measured 0.5-1.0 % slower
	 * on gpt-oss-120b, session 45) */
	float4 w[OS_R4];
	float ss = 0.0f;
#pragma unroll
	for (int u = 0; u < OS_R4; u++) {
		const int i = tid + 256 * u;
		w[u] = i < OS_H / 4 ? __ldg(reinterpret_cast<const float4 *>(ly.n2) + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		ss += hv[u].x * hv[u].x + hv[u].y * hv[u].y + hv[u].z * hv[u].z + hv[u].w * hv[u].w;
	}
	const float r = 1.0f / sqrtf(mg_block_sum(ss, sred, tid) / (float)OS_H + a.eps);
	if (tid < E)
		lg[tid] = (float)q * 2.3283064365386963e-10f * r + rb; /* 2^-32 */
	gt_sync();
	/* thread (e, part): the logits of part's share above logit e, read 4 at a time (span >= 4).
	 * Why: one load a logit, not unrolled, took ~1.5 us a layer more with 128 experts than with 32
	 * (gpt-oss-120b's timeline, session 46: 64 dependent loads a thread) */
	const int P = min(256 / E, E / 4), e = tid % E, part = tid / E, span = E / P;
	const float x = lg[e];
	if (part < P) {
		int rank = 0;
		const float4 *l4 = reinterpret_cast<const float4 *>(lg + part * span);
#pragma unroll 4
		for (int j4 = 0; j4 < span / 4; j4++) {
			const float4 v = l4[j4];
			const int j = part * span + 4 * j4;
			rank += (v.x > x || (v.x == x && j < e)) + (v.y > x || (v.y == x && j + 1 < e)) +
			        (v.z > x || (v.z == x && j + 2 < e)) + (v.w > x || (v.w == x && j + 3 < e));
		}
		rk[part * E + e] = rank;
	}
	gt_sync();
	if (tid < E) {
		int rt = 0;
		for (int p = 0; p < P; p++)
			rt += rk[p * E + tid];
		if (rt < OS_K)
			sel[rt] = tid, sv[rt] = x;
	}
	gt_sync();
	after_sel();
#pragma unroll
	for (int u = 0; u < OS_R4; u++) {
		const int i = tid + 256 * u;
		if ((i & ~31) < OS_H / 4 + 16)
			mg_put4(xs, OS_CSX, 4 * i,
			        make_float4(hv[u].x * r * w[u].x, hv[u].y * r * w[u].y, hv[u].z * r * w[u].z, hv[u].w * r * w[u].w),
			        tid & 31);
	}
	if (tid < 32) {
		const float w = tid < OS_K ? expf(sv[tid] - sv[0]) : 0.0f;
		float tot = w;
		for (int o = 2; o; o >>= 1)
			tot += __shfl_xor_sync(0xFFFFFFFFu, tot, o);
		if (tid < OS_K)
			selw[tid] = w / tot;
	}
	gt_sync();
}

/* a 4-D tensor-map copy (a K / V block) and a 3-D one (a BF16 stage) */
static __device__ __forceinline__ void os_copy_4d(void *dst, const CUtensorMap *map, int c2, int c3, uint64_t *b,
                                                  uint64_t pol)
{
	asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
	             "[%1, {%2, %3, %4, %5}], [%6], %7;" ::"r"(gt_sa(dst)),
	             "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(0), "r"(c2), "r"(c3), "r"(gt_sa(b)), "l"(pol)
	             : "memory");
}

static __device__ __forceinline__ void os_copy_3d(void *dst, const CUtensorMap *map, int c1, int c2, uint64_t *b,
                                                  uint64_t pol)
{
	asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
	             "[%1, {%2, %3, %4}], [%5], %6;" ::"r"(gt_sa(dst)),
	             "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(c1), "r"(c2), "r"(gt_sa(b)), "l"(pol)
	             : "memory");
}

__global__ void __launch_bounds__(OS_THREADS, 1) os_kernel(const os_args a)
{
	extern __shared__ __align__(1024) uint8_t smem[];
	uint8_t *ring = smem;
	uint8_t *xs = ring + OS_NS * OS_SLOT;
	uint64_t *full = reinterpret_cast<uint64_t *>(xs + OS_XS);
	uint64_t *empty = full + OS_NS;
	uint64_t *selbar = empty + OS_NS; /* [2] */
	int *sel = reinterpret_cast<int *>(selbar + 2);          /* [2][4] */
	float *selw = reinterpret_cast<float *>(sel + 2 * OS_K); /* [2][4] */
	float *sred = selw + 2 * OS_K;                           /* [8] */
	gt_pos *spos = reinterpret_cast<gt_pos *>(sred + MG_W); /* the ring position at an expert phase's start */
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
	const int b = blockIdx.x, G = gridDim.x, E = a.E;
	const int ctx = __ldg(a.pos) + 1, T = os_split_t(ctx, G), SF = (ctx + T - 1) / T;
	const int32_t *tab = a.table + (size_t)__ldg(a.seq) * a.table_stride;
	if (tid == 0) {
		if (gt_sa(ring) & 1023)
			__trap();
		for (int i = 0; i < OS_NS; i++) {
			gt_init(&full[i], 1);
			gt_init(&empty[i], OS_CW);
		}
		gt_init(&selbar[0], 1);
		gt_init(&selbar[1], 1);
		asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
	}
	__syncthreads();

	if (warp == OS_CW) { /* the producer: every stage in the consumers' order */
		if (lane)
			return;
		uint64_t pol;
		asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
		gt_pos pp = {0, 0, 0};
		auto slot = [&](unsigned bytes) {
			mg_wbar(&empty[pp.i], pp.ph ^ 1u, 3, pp.n);
			gt_expect(&full[pp.i], bytes);
			return ring + (size_t)pp.i * OS_SLOT;
		};
		for (int l = 0; l < a.L; l++) {
			const os_layer &ly = a.ly[l];
			const CUtensorMap *m = a.maps + (size_t)l * OM_N;
			for (int j = b; j < OS_QKV_TILES; j += G)
				for (int c = 0; c < OS_QST; c++) {
					os_copy_3d(slot(16 * OS_QCH * 128), m + OM_QKV, 16 * j, OS_QCH * c, &full[pp.i], pol);
					gt_next(pp, OS_NS);
				}
			const int S = ly.window ? 1 : SF;
			for (int t = b; t < OS_NKV * S; t += G) {
				const int g = t / S;
				int t0, t1;
				os_range(ly.window, ctx, T, t % S, t0, t1);
				for (int a0 = t0 & ~15; a0 < t1; a0 += OS_T) {
					const int mm = mg_ring_m(ctx, a0, min(t1, a0 + OS_T));
					if (mm <= 0)
						continue;
					const int nblk = (mm + MG_KVB - 1) / MG_KVB;
					for (int kv = 0; kv < 2; kv++) {
						uint8_t *d = slot((unsigned)nblk * 2048);
						for (int i = 0; i < nblk; i++)
							os_copy_4d(d + i * 2048, a.kvmap + kv, g, l * a.nb + __ldg(tab + a0 / MG_KVB + i),
							           &full[pp.i], pol);
						gt_next(pp, OS_NS);
					}
				}
			}
			for (int j = b; j < OS_O_TILES; j += G) {
				for (int c = 0; c < OS_OST; c++) {
					os_copy_3d(slot(16 * OS_OCH * 128), m + OM_O, 16 * j, OS_OCH * c, &full[pp.i], pol);
					gt_next(pp, OS_NS);
				}
				gt_copy_ef(slot((unsigned)E * 32), reinterpret_cast<const uint8_t *>(ly.rt) + (size_t)j * E * 32,
				           (unsigned)E * 32, &full[pp.i], pol);
				gt_next(pp, OS_NS);
			}
			const int *sl = sel + (l & 1) * OS_K;
			mg_wbar(&selbar[l & 1], (l >> 1) & 1, 4, l);
			if (a.tl && l == a.tl_layer)
				a.tl[blockIdx.x * OT_N + OT_PSEL] = gm_now();
			for (int j = b; j < OS_K * OS_GU_TILES; j += G) {
				const int e = sl[j / OS_GU_TILES], t = j % OS_GU_TILES;
				uint8_t *d = slot(16 * (OS_MXC + OS_MXS));
				gt_copy_ef(d, ly.gu + (size_t)e * a.gu_stride + (size_t)t * 16 * OS_MXC, 16 * OS_MXC, &full[pp.i], pol);
				gt_copy_ef(d + 16 * OS_MXC, ly.gu_s + (size_t)e * a.gus_stride + (size_t)t * 16 * OS_MXS, 16 * OS_MXS,
				           &full[pp.i], pol);
				gt_next(pp, OS_NS);
			}
			for (int j = os_d0(b, G); j < os_d0(b + 1, G); j++) {
				const int e = sl[j / OS_D_TILES], t = j % OS_D_TILES;
				uint8_t *d = slot(16 * (OS_MXC + OS_MXS));
				gt_copy_ef(d, ly.dn + (size_t)e * a.dn_stride + (size_t)t * 16 * OS_MXC, 16 * OS_MXC, &full[pp.i], pol);
				gt_copy_ef(d + 16 * OS_MXC, ly.dn_s + (size_t)e * a.dns_stride + (size_t)t * 16 * OS_MXS, 16 * OS_MXS,
				           &full[pp.i], pol);
				gt_next(pp, OS_NS);
			}
			if (a.tl && l == a.tl_layer)
				a.tl[blockIdx.x * OT_N + OT_PEND] = gm_now();
		}
		return;
	}

	gt_pos pos = {0, 0, 0};
	const uint32_t ring_sa = gt_sa(ring), xs_sa = gt_sa(xs);
	/* the down's x for task k of this block: its slot's columns */
	const int dj0 = os_d0(b, G), dn = os_d0(b + 1, G) - dj0; /* the block's down tasks */
	auto dcol = [&](int k) { return xs_sa + (uint32_t)((dj0 + k) / OS_D_TILES * 2 * OS_CSX); };
	if (warp >= MG_W) { /* the expert-only warps: each layer's gate|up and down tiles, at the ring
	                     * position warps 0-7 share at each phase's start */
		for (int l = 0; l < a.L; l++) {
			if (b < OS_K * OS_GU_TILES) {
				os_xsync();
				gt_pos p = *spos;
				os_mx_tiles<OS_NTG>((OS_K * OS_GU_TILES - b + G - 1) / G, p, full, empty, ring_sa,
				                    [&](int) { return xs_sa; }, a.ec_gu, reinterpret_cast<float *>(xs + 2 * OS_CSX),
				                    warp, lane);
			}
			if (dn > 0) {
				os_xsync();
				gt_pos p = *spos;
				os_mx_tiles<OS_NTD>(dn, p, full, empty, ring_sa, dcol, a.ec_dn,
				                    reinterpret_cast<float *>(xs + OS_K * 2 * OS_CSX), warp, lane);
			}
		}
		return;
	}
	for (int l = 0; l < a.L; l++) {
		const os_layer &ly = a.ly[l];
		unsigned *cnt = a.cnt + (size_t)l * OS_CNT;
		float *h2 = a.h2 + (size_t)l * OS_H;
		if (l > 0)
			mg_cwait(a.cnt + (size_t)(l - 1) * OS_CNT + O_D, OS_K * OS_D_TILES, tid);
		os_mark(a, l, OT_START, tid);
		/* qkv: x = RMSNorm(h) plain; the block's <= 3 tiles; + bias; q, k (raw), v into the cache */
		if (b < OS_QKV_TILES) {
			float4 hv[OS_R4];
#pragma unroll
			for (int u = 0; u < OS_R4; u++) {
				const int i = tid + 256 * u;
				hv[u] = i < OS_H / 4 ? os_h4(a, l, i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			}
			os_stage_norm(hv, ly.n1, a.eps, xs, sred, tid);
			os_mark(a, l, OT_QX, tid);
			const int n = (OS_QKV_TILES - b + G - 1) / G;
			float *rq = reinterpret_cast<float *>(xs + 2 * OS_XLO_H);
			os_bf_tiles<OS_QCH, OS_NTQ>(n, OS_QST, pos, full, empty, ring_sa, xs_sa, OS_XLO_H, rq, warp, lane);
			if (tid < 16 * n) {
				const int k = tid >> 4, row = (b + k * G) * 16 + (tid & 15);
				const float y = mg_rowsum_k<OS_NTQ>(rq, k, tid & 15) + __ldg(ly.bqkv + row);
				if (row < OS_QR)
					a.q[(size_t)l * OS_QR + row] = y;
				else if (row < OS_QR + OS_KVW)
					a.kraw[(size_t)l * OS_KVW + row - OS_QR] = y;
				else {
					const int r = row - OS_QR - OS_KVW;
					mg_kvrow<OS_HD>(ly.vc, tab, ctx - 1, r / OS_HD, OS_NKV)[r % OS_HD] = __float2bfloat16_rn(y);
				}
			}
			mg_cpub(cnt + O_QKV, n, tid);
			os_mark(a, l, OT_QKV, tid);
		}
		/* attention */
		const int S = ly.window ? 1 : SF;
		for (int t = b; t < OS_NKV * S; t += G) {
			int t0, t1;
			os_range(ly.window, ctx, T, t % S, t0, t1);
			os_attn(a, ly, l, t / S, t % S, ctx, t0, t1, S, tab, reinterpret_cast<float *>(xs), tid, pos, full, empty,
			        ring_sa);
			gt_sync();
		}
		if (S > 1)
			for (int q = b; q < OS_NQ; q += G) {
				os_merge(a, ly, l, q, S, reinterpret_cast<float *>(xs), tid);
				gt_sync();
			}
		if (b < OS_NKV * S || (S > 1 && b < OS_NQ))
			os_mark(a, l, OT_ATT, tid);
		/* o: h2 = h + o + bias; the tile's part of the router's logits */
		if (b < OS_O_TILES) {
			mg_cwait(cnt + O_ATT, OS_NQ, tid);
			os_mark(a, l, OT_OSEEN, tid);
			for (int i = tid; i < OS_QR / 4; i += 256)
				os_put_plain(xs, OS_XLO_Q, 4 * i, __ldcg(reinterpret_cast<const float4 *>(a.att + (size_t)l * OS_QR) + i));
			gt_sync();
			float *ro = reinterpret_cast<float *>(xs + 2 * OS_XLO_Q), *hs = ro + MG_W * 16;
			for (int j = b; j < OS_O_TILES; j += G) {
				const float hr = tid < 16 ? os_h1(a, l, j * 16 + tid) : 0.0f;
				const float br = tid < 16 ? __ldg(ly.bo + j * 16 + tid) : 0.0f, nr = tid < 16 ? __ldg(ly.n2 + j * 16 + tid) : 0.0f;
				os_bf_tiles<OS_OCH, 1>(1, OS_OST, pos, full, empty, ring_sa, xs_sa, OS_XLO_Q, ro, warp, lane);
				if (tid < 16) {
					const float y = hr + (mg_rowsum_k<1>(ro, 0, tid) + br);
					h2[j * 16 + tid] = y;
					hs[tid] = y * nr;
				}
				gt_sync();
				/* the router's 16 columns of this tile ([E][16] BF16): thread t, expert t / 2's half t % 2 */
				mg_wbar(&full[pos.i], pos.ph, 1, pos.n);
				if (tid < 2 * E) {
					const float p = mg_router_part(ring_sa + (uint32_t)pos.i * OS_SLOT, hs, tid);
					/* integer sums do not depend on the tiles' order: every block reads the same
					 * bits (gemv_fp4.cu's fold, the same 2^32) */
					if (!(tid & 1))
						atomicAdd(reinterpret_cast<unsigned long long *>(a.lacc + (size_t)l * E + (tid >> 1)),
						          (unsigned long long)__float2ll_rn(p * 4294967296.0f));
				}
				__syncwarp();
				if (lane == 0)
					os_arrive(&empty[pos.i], warp);
				gt_next(pos, OS_NS);
			}
			mg_cpub(cnt + O_O, (OS_O_TILES - b + G - 1) / G, tid);
			os_mark(a, l, OT_O, tid);
		}
		/* the route (every block; its producer waits on selbar for the experts' copies) */
		mg_cwait(cnt + O_O, OS_O_TILES, tid);
		os_mark(a, l, OT_RSEEN, tid);
		int *sl = sel + (l & 1) * OS_K;
		float *sw = selw + (l & 1) * OS_K;
		os_route(a, ly, l, xs, sred, reinterpret_cast<float *>(xs + 2 * OS_CSX), sl, sw, tid, [&] {
			if (tid == 0) /* sel is final: the producer's expert copies may go */
				gt_arrive(&selbar[l & 1]);
		});
		os_mark(a, l, OT_TOPK, tid);
		/* gate|up: the block's <= 12 tiles, + bias, the clamped SwiGLU of each (gate, up) pair */
		if (b < OS_K * OS_GU_TILES) {
			const int n = (OS_K * OS_GU_TILES - b + G - 1) / G;
			float *rq = reinterpret_cast<float *>(xs + 2 * OS_CSX);
			if (tid == 0)
				*spos = pos;
			os_xsync(); /* x staged, the ring position shared: the expert-only warps go */
			os_mx_tiles<OS_NTG>(n, pos, full, empty, ring_sa, [&](int) { return xs_sa; }, a.ec_gu, rq, warp, lane);
			if (tid < 8 * n) {
				const int k = tid >> 3, i = tid & 7, j = b + k * G, slot = j / OS_GU_TILES, t = j % OS_GU_TILES;
				const float *bg = ly.bgu + (size_t)sl[slot] * 2 * OS_FI + t * 16;
				const float gt = ldexpf(mg_rowsum_k<OS_NTG, OS_CW>(rq, k, 2 * i), a.pexp_gu) + __ldg(bg + 2 * i);
				const float up = ldexpf(mg_rowsum_k<OS_NTG, OS_CW>(rq, k, 2 * i + 1), a.pexp_gu) + __ldg(bg + 2 * i + 1);
				a.act[((size_t)l * OS_K + slot) * OS_FI + t * 8 + i] = swiglu_oai(gt, up, a.alpha, a.limit);
			}
			mg_cpub(cnt + O_GU, n, tid);
			os_mark(a, l, OT_GU, tid);
		}
		/* down: slot s's tile t a task, yd[s] = w_s (down + bias) */
		if (dn > 0) {
			const int n = dn, s0 = dj0 / OS_D_TILES;
			mg_cwait(cnt + O_GU, OS_K * OS_GU_TILES, tid);
			os_mark(a, l, OT_DSEEN, tid);
			os_stage_act(a.act + (size_t)l * OS_K * OS_FI, xs, s0, (dj0 + n - 1) / OS_D_TILES - s0 + 1, tid);
			gt_sync();
			os_mark(a, l, OT_DX, tid);
			float *rd = reinterpret_cast<float *>(xs + OS_K * 2 * OS_CSX);
			if (tid == 0)
				*spos = pos;
			os_xsync();
			os_mx_tiles<OS_NTD>(n, pos, full, empty, ring_sa, dcol, a.ec_dn, rd, warp, lane);
			if (tid < 16 * n) {
				const int k = tid >> 4, r = tid & 15, j = dj0 + k, slot = j / OS_D_TILES, t = j % OS_D_TILES;
				const int row = t * 16 + r;
				const float y = ldexpf(mg_rowsum_k<OS_NTD, OS_CW>(rd, k, r), a.pexp_dn) +
				                __ldg(ly.bdn + (size_t)sl[slot] * OS_H + row);
				a.yd[((size_t)l * OS_K + slot) * OS_H + row] = sw[slot] * y;
			}
			mg_cpub(cnt + O_D, n, tid);
			os_mark(a, l, OT_D, tid);
		}
	}
	/* the last layer's output, once all its down tasks are in */
	mg_cwait(a.cnt + (size_t)(a.L - 1) * OS_CNT + O_D, OS_K * OS_D_TILES, tid);
	for (int i = b * 256 + tid; i < OS_H / 4; i += G * 256)
		reinterpret_cast<float4 *>(a.hout)[i] = os_h4(a, a.L, i);
}
#else
__global__ void os_kernel(const os_args a) { (void)a; }
#endif

#endif
