/* f8step_bench.cu: a 128-element decode step on the FP8 tensor cores against gm_step's BF16 one,
 * with the weights in shared memory: the SM's decode rate (the bound of mega_bench's tiles and of
 * the decode GEMVs on the H200) and the precision against a CPU reference.
 *
 * The FP8 step (f8_step): an E2M1 code with its sign at bit 7 and its 3 magnitude bits at [4:2]
 * of a byte is exactly its value x 2^-6 as E4M3, so a word of 8 codes becomes two registers of 4
 * E4M3 in ~5 integer operations (the BF16 path: ~9-11 and a multiply a pair for the scale).
 * Layout (1152 bytes a step of 16 rows x 128 K, F8_STEP): codes [row half h][lane]
 * 16 bytes, lane = 4 g + t, row g + 8 h; word j covers K [32 j, 32 j + 32): byte i's low nibble
 * is K 32 j + 4 t + i, its high nibble K 32 j + 16 + 4 t + i, so one mma m16n8k32 (A = the low
 * nibbles at k 4t.., the high at 16 + 4t..) spans exactly two 16-element scale blocks. Scales:
 * 128 bytes [g][t / 2] 8 bytes, for j = 0..3 {row g's, row g + 8's} scale of block 2 j + t / 2.
 * B's 8 columns: x' = x 2^sigma in 4 E4M3 parts (x' ~ x1 + x2 + x3 + x4), column c = part c % 4
 * of block c / 4, zero outside its block; lane (g, t)'s accumulators (columns 2t, 2t + 1: block
 * t / 2) take the MMA's result times its rows' scale, and the quad adds them once at the end.
 *
 * Usage: f8step_bench [check | time] */
#include <cuda_fp8.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/gemv_mma.cuh"
#include "backend/cuda/gemv_tma.cuh"
#include "dev_util.h"
#include "numerics/numerics.h"

#define MG_STEP 1152           /* 16 rows x 128 K: 1024 code bytes + 128 scale bytes */
#define F8_TILE (16 * MG_STEP) /* 16 rows x 2048 K: 16 steps */
#define MG_CS_H 4128           /* gm_col_stride(2048 / 32) */
#define MG_W 8
#define F8_K 2048
#define F8_XQ (F8_K + 32) /* a part's row of staged x (bytes; 32 more: conflict-free reads) */

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
static __device__ __forceinline__ uint32_t mg_lds32(uint32_t sa)
{
	uint32_t v;
	asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(sa));
	return v;
}

static __device__ __forceinline__ void f8_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
	             "{%8, %9}, {%10, %10, %10, %10};"
	             : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
	             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

/* a word's low nibbles (lo) and high nibbles (hi) as 4 E4M3 each, value x 2^-6 */
static __device__ __forceinline__ uint32_t f8_lo(uint32_t w)
{
	return ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u);
}

static __device__ __forceinline__ uint32_t f8_hi(uint32_t w)
{
	return ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);
}

/* one step of a lane: rows g (wa) and g + 8 (wb), their scales (8 bytes), staged x at xq (this
 * step's K 0 of part 0; parts F8_XQ apart) */
static __device__ __forceinline__ void f8_step(float (&acc)[4], const uint4 wa, const uint4 wb, uint2 sc,
                                               uint32_t xq, int g, int t)
{
	const int blk = g >> 2;
	const uint32_t xa = xq + (uint32_t)((g & 3) * F8_XQ + 16 * blk + 4 * t);
#pragma unroll
	for (int j = 0; j < 4; j++) {
		const uint32_t w0 = gm_word(wa, j), w1 = gm_word(wb, j);
		const uint32_t xv = mg_lds32(xa + 32 * j);
		float d[4];
		f8_mma(d, f8_lo(w0), f8_lo(w1), f8_hi(w0), f8_hi(w1), blk ? 0u : xv, blk ? xv : 0u);
		const uint32_t pair = ((j < 2 ? sc.x : sc.y) >> (16 * (j & 1))) & 0xFFFFu;
		const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)pair, __NV_E4M3);
		const float sg = __half2float(__half(__half_raw{h.x})), s8 = __half2float(__half(__half_raw{h.y}));
		acc[0] += sg * d[0], acc[1] += sg * d[1], acc[2] += s8 * d[2], acc[3] += s8 * d[3];
	}
}
#endif

/* V 0: gm_step (BF16 MMAs, x as hi + lo); V 1: f8_step. Each block: its tiles copied into shared
 * memory, x staged, then reps passes over them (NW warps, 16 / NW steps a warp a tile; ILP
 * accumulators a warp, its steps alternating between them), the 16 row sums (of all passes) to
 * out[block] and the block's clocks to cyc. */
template <int V, int NW, int ILP, int SPIN>
__global__ void __launch_bounds__(NW * 32 + (SPIN ? 32 : 0), 1)
	f8_kernel(const uint8_t *w, const float *x, float sig, int ntiles, int reps, float *out, long long *cyc)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	extern __shared__ __align__(128) uint8_t sm[];
	__shared__ uint64_t spin_bar;
	__shared__ unsigned spin_done;
	if (threadIdx.x == 0) {
		gt_init(&spin_bar, 1); /* never completed: the spinning warp's try_wait always fails */
		spin_done = 0;
	}
	uint8_t *tiles = sm, *xs = sm + (size_t)ntiles * F8_TILE;
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
	const uint4 *src = reinterpret_cast<const uint4 *>(w + (size_t)blockIdx.x * ntiles * F8_TILE);
	for (int i = tid; i < ntiles * F8_TILE / 16; i += NW * 32)
		reinterpret_cast<uint4 *>(tiles)[i] = src[i];
	for (int k = tid; k < F8_K; k += NW * 32) {
		if (V == 0)
			gm_st_put(xs, MG_CS_H, k, x[k]);
		else { /* 4 E4M3 parts of x 2^sig */
			float r = ldexpf(x[k], (int)sig);
			for (int p = 0; p < 4; p++) {
				const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(r, __NV_SATFINITE, __NV_E4M3);
				xs[p * F8_XQ + k] = q;
				r -= __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3)));
			}
		}
	}
	__syncthreads();
	if (SPIN && warp == NW) {
		/* a producer-like warp waiting on an mbarrier (SPIN 1: try_wait in a loop; 2: with a
		 * 100 ns sleep between tries) until the consumer warps are done */
		while (*(volatile unsigned *)&spin_done < NW) {
			uint32_t ok;
			asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
			             "selp.u32 %0, 1, 0, p;\n\t}"
			             : "=r"(ok)
			             : "r"(gt_sa(&spin_bar)), "r"(0u)
			             : "memory");
			if (SPIN == 2)
				__nanosleep(100);
		}
		__syncthreads();
		return;
	}
	const uint32_t ts = gt_sa(tiles), xsa = gt_sa(xs);
	float acc[ILP][1][4];
#pragma unroll
	for (int i = 0; i < ILP; i++)
		acc[i][0][0] = acc[i][0][1] = acc[i][0][2] = acc[i][0][3] = 0.0f;
	const uint32_t xc[1] = {xsa + (uint32_t)((g < 2 ? g : (g & 1)) * MG_CS_H)};
	const long long c0 = clock64();
	for (int r = 0; r < reps; r++)
		for (int tl = 0; tl < ntiles; tl++)
#pragma unroll
			for (int q = 0; q < 16 / NW; q++) {
				const int s = warp + q * NW;
				const uint32_t sb = ts + (uint32_t)(tl * F8_TILE + s * MG_STEP);
				const uint4 wa = gm_lds128(sb + lane * 16), wb = gm_lds128(sb + 512 + lane * 16);
				if (V == 0) {
					const uint32_t sc = mg_lds32(sb + 1024 + lane * 4);
					gm_step<GM_NVFP4, 1>(acc[q % ILP], wa, wb, sc & 0xFFFFu, sc >> 16, 0u, xc, s * 4 + t);
				} else {
					uint32_t s0, s1;
					asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];"
					             : "=r"(s0), "=r"(s1)
					             : "r"(sb + 1024 + (uint32_t)(g * 2 + (t >> 1)) * 8));
					f8_step(acc[q % ILP][0], wa, wb, make_uint2(s0, s1), xsa + (uint32_t)(s * 128), g, t);
				}
			}
	const long long c1 = clock64();
	if (SPIN && lane == 0)
		atomicAdd(&spin_done, 1u);
#pragma unroll
	for (int i = 1; i < ILP; i++)
#pragma unroll
		for (int e = 0; e < 4; e++)
			acc[0][0][e] += acc[i][0][e];
	/* the row sums: V 0 lane (g, 0) holds them (columns 0, 1: hi, lo); V 1 the quad's 4 lanes
	 * hold parts of them (their blocks and parts) */
	float rg = acc[0][0][0] + acc[0][0][1], r8 = acc[0][0][2] + acc[0][0][3];
	if (V == 1) {
		for (int o = 1; o <= 2; o <<= 1) {
			rg += __shfl_xor_sync(0xFFFFFFFFu, rg, o);
			r8 += __shfl_xor_sync(0xFFFFFFFFu, r8, o);
		}
		const float f = ldexpf(1.0f, 6 - (int)sig);
		rg *= f, r8 *= f;
	} else {
		rg *= 16384.0f, r8 *= 16384.0f; /* gm_nv_scales' 2^112 times the codes' 2^-126 */
	}
	__shared__ float red[NW][16];
	if (t == 0)
		red[warp][g] = rg, red[warp][g + 8] = r8;
	__syncthreads();
	if (tid < 16) {
		float v = 0.0f;
		for (int q = 0; q < NW; q++)
			v += red[q][tid];
		out[blockIdx.x * 16 + tid] = v;
	}
	if (tid == 0)
		cyc[blockIdx.x] = c1 - c0;
#else
	(void)w, (void)x, (void)sig, (void)ntiles, (void)reps, (void)out, (void)cyc;
#endif
}

/* ---- host ---------------------------------------------------------------------------------- */

static uint64_t f8_rng = 0x9E3779B97F4A7C15ull;
static uint32_t f8_rand(void)
{
	f8_rng ^= f8_rng << 13, f8_rng ^= f8_rng >> 7, f8_rng ^= f8_rng << 17;
	return (uint32_t)(f8_rng >> 16);
}

/* n tiles of random codes and E4M3 scales in [2^-3, 2^-1): the logical codes [tile][16][K] and
 * scales [tile][16][K / 16], and both layouts */
static void f8_make(int n, std::vector<uint8_t> &code, std::vector<uint8_t> &scale, std::vector<uint8_t> &mega,
                    std::vector<uint8_t> &f8)
{
	code.resize((size_t)n * 16 * F8_K), scale.resize((size_t)n * 16 * F8_K / 16);
	for (auto &c : code)
		c = f8_rand() & 15;
	for (auto &s : scale)
		s = 0x20 + (f8_rand() & 15);
	mega.assign((size_t)n * F8_TILE, 0), f8.assign((size_t)n * F8_TILE, 0);
	for (int tl = 0; tl < n; tl++)
		for (int r = 0; r < 16; r++) {
			const int hh = r / 8, g = r % 8;
			const uint8_t *cr = &code[((size_t)tl * 16 + r) * F8_K];
			const uint8_t *sr = &scale[((size_t)tl * 16 + r) * (F8_K / 16)];
			for (int s = 0; s < 16; s++) {
				uint8_t *mb = &mega[(size_t)tl * F8_TILE + s * MG_STEP], *fb = &f8[(size_t)tl * F8_TILE + s * MG_STEP];
				for (int t4 = 0; t4 < 4; t4++)
					for (int j = 0; j < 4; j++) {
						/* mega: chunk t4 = K 32 t4 .., word j = K 32 t4 + 8 j + i, permuted */
						uint32_t wn = 0;
						for (int i = 0; i < 8; i++)
							wn |= (uint32_t)cr[s * 128 + 32 * t4 + 8 * j + i] << (4 * i);
						const uint32_t wp = fp4s_e2m1_permute_word(wn);
						memcpy(mb + hh * 512 + (g * 4 + t4) * 16 + j * 4, &wp, 4);
						/* f8: lane t = t4, word j = K 32 j + 4 t + i (low), + 16 (high) */
						uint32_t wf = 0;
						for (int i = 0; i < 4; i++)
							wf |= (uint32_t)(cr[s * 128 + 32 * j + 4 * t4 + i] | cr[s * 128 + 32 * j + 16 + 4 * t4 + i] << 4)
							      << (8 * i);
						memcpy(fb + hh * 512 + (g * 4 + t4) * 16 + j * 4, &wf, 4);
					}
				for (int t4 = 0; t4 < 4; t4++) /* mega: [lane] {row g's 2, row g + 8's 2} */
					for (int q = 0; q < 2; q++)
						mb[1024 + (g * 4 + t4) * 4 + hh * 2 + q] = sr[s * 8 + 2 * t4 + q];
				for (int hb = 0; hb < 2; hb++) /* f8: [g][hb] {row g, row g + 8} of block 2 j + hb */
					for (int j = 0; j < 4; j++)
						fb[1024 + (g * 2 + hb) * 8 + 2 * j + hh] = sr[s * 8 + 2 * j + hb];
			}
		}
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "check";
	int dev, G;
	CK(cudaGetDevice(&dev));
	CK(cudaDeviceGetAttribute(&G, cudaDevAttrMultiProcessorCount, dev));
	const int ntiles = strcmp(mode, "check") ? 8 : 1, reps = strcmp(mode, "check") ? 400 : 1;
	const size_t smem = (size_t)ntiles * F8_TILE + 4 * F8_XQ;
	std::vector<uint8_t> code, scale, mega, f8;
	f8_make(G * ntiles, code, scale, mega, f8);
	/* x with a spread of magnitudes (2^-6 .. 2^2) */
	std::vector<float> x(F8_K);
	float xmax = 0.0f;
	for (auto &v : x) {
		v = ldexpf(((int)(f8_rand() & 0xFFFF) - 32768) / 32768.0f, (int)(f8_rand() % 9) - 6);
		xmax = std::max(xmax, fabsf(v));
	}
	const float sig = floorf(log2f(224.0f / xmax)); /* x' = x 2^sig within E4M3's 448 */
	uint8_t *dw;
	float *dx, *dout;
	long long *dcyc;
	CK(cudaMalloc(&dw, mega.size()));
	CK(cudaMalloc(&dx, F8_K * 4));
	CK(cudaMalloc(&dout, (size_t)G * 16 * 4));
	CK(cudaMalloc(&dcyc, (size_t)G * 8));
	CK(cudaMemcpy(dx, x.data(), F8_K * 4, cudaMemcpyHostToDevice));
	int clk_khz;
	CK(cudaDeviceGetAttribute(&clk_khz, cudaDevAttrClockRate, dev));
	int ok = 1;
	/* the variants: (step, warps, accumulators a warp, a spinning 9th warp) and their kernels */
	typedef void (*f8_fn)(const uint8_t *, const float *, float, int, int, float *, long long *);
	const struct {
		int V, NW, ILP, SP;
		f8_fn fn;
	} vars[] = {{0, 8, 1, 0, f8_kernel<0, 8, 1, 0>},  {0, 8, 1, 1, f8_kernel<0, 8, 1, 1>},
	            {0, 8, 1, 2, f8_kernel<0, 8, 1, 2>},  {0, 16, 1, 0, f8_kernel<0, 16, 1, 0>},
	            {1, 8, 1, 0, f8_kernel<1, 8, 1, 0>},  {1, 8, 1, 1, f8_kernel<1, 8, 1, 1>}};
	for (const auto &vr : vars) {
		const int V = vr.V;
		CK(cudaFuncSetAttribute(vr.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
		char name[80];
		snprintf(name, sizeof name, "%s, %d warps, %d acc, %s", V ? "f8_step" : "gm_step", vr.NW, vr.ILP,
		         vr.SP == 0 ? "alone" : vr.SP == 1 ? "a 9th warp in try_wait" : "a 9th warp in try_wait + sleep");
		CK(cudaMemcpy(dw, V ? f8.data() : mega.data(), mega.size(), cudaMemcpyHostToDevice));
		const int threads = vr.NW * 32 + (vr.SP ? 32 : 0);
		auto launch = [&] { vr.fn<<<G, threads, smem>>>(dw, dx, sig, ntiles, reps, dout, dcyc); };
		launch();
		CK(cudaGetLastError());
		CK(cudaDeviceSynchronize());
		if (!strcmp(mode, "check")) {
			std::vector<float> got((size_t)G * 16);
			CK(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost));
			double e = 0.0, s = 0.0;
			for (int b = 0; b < G; b++)
				for (int r = 0; r < 16; r++) {
					double y = 0.0;
					for (int k = 0; k < F8_K; k++)
						y += (double)fp4s_e2m1_to_f32(code[((size_t)b * 16 + r) * F8_K + k]) *
						     fp4s_e4m3_to_f32(scale[((size_t)b * 16 + r) * (F8_K / 16) + k / 16]) * x[k];
					const double d = got[b * 16 + r] - y;
					e += d * d, s += y * y;
				}
			const double rel = sqrt(e / s);
			printf("check %s: rel L2 %.3e over %d rows (bound 1e-4) %s\n", name, rel, G * 16,
			       rel <= 1e-4 ? "ok" : "FAIL");
			ok &= rel <= 1e-4;
			continue;
		}
		/* time: 5 launches, the median by events; bytes = every block's passes over its tiles */
		cudaEvent_t e0, e1;
		CK(cudaEventCreate(&e0));
		CK(cudaEventCreate(&e1));
		std::vector<float> ms;
		for (int i = 0; i < 5; i++) {
			CK(cudaEventRecord(e0));
			launch();
			CK(cudaEventRecord(e1));
			CK(cudaEventSynchronize(e1));
			float m;
			CK(cudaEventElapsedTime(&m, e0, e1));
			ms.push_back(m);
		}
		std::sort(ms.begin(), ms.end());
		std::vector<long long> cyc(G);
		CK(cudaMemcpy(cyc.data(), dcyc, G * 8, cudaMemcpyDeviceToHost));
		std::sort(cyc.begin(), cyc.end());
		const double bytes = (double)reps * ntiles * F8_TILE;
		printf("time %s: %.3f ms (median of 5), %.1f GB/s an SM by the loop's clocks at %d MHz (median block), "
		       "%.2f TB/s over %d SMs by events (the tiles' copy and x's staging included)\n",
		       name, ms[2], bytes / (cyc[G / 2] / (clk_khz * 1e3)) / 1e9, clk_khz / 1000,
		       bytes * G / (ms[2] * 1e-3) / 1e12, G);
	}
	if (!strcmp(mode, "check"))
		printf("check: %s\n", ok ? "PASS" : "FAIL");
	return ok ? 0 : 1;
}
