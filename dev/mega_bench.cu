/* mega_bench.cu: the one-launch decode step of src/backend/cuda/mstep.cuh / mstep_kernel.cuh
 * (qwen3-30b-a3b's geometry) against a CPU reference, and its timing.
 *
 * The weights are laid out as the backend uploads them (row-major codes and scales, the experts
 * stacked, gate and up rows alternating, per-expert tensor scales), and the KV cache is paged
 * through a shuffled block table, so the check covers the addressing the engine gives the kernel.
 *
 * Usage: mega_bench [check | time [layers] [ctx...]]. check runs 2 layers at contexts 300, 1 and
 * 9000 (71 splits: the merge's second round) against a CPU reference (every phase's output);
 * time runs the 48-layer step at each context (default 128 and 4096): median us a step and a
 * layer over 20 launches, GB/s of the bytes a step reads, and one layer's phase ends (max over
 * blocks, from its start). */
#include <time.h>

#include <algorithm>
#include <random>
#include <vector>

#include "backend/cuda/mstep_kernel.cuh"
#include "dev_util.h"
#include "numerics/numerics.h"

/* ---- host ---------------------------------------------------------------------------------- */

static __device__ __forceinline__ uint32_t mg_hash(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return (uint32_t)x;
}

/* random bytes (codes), or with sc E4M3 scales in [2^-3, 2^-1) */
__global__ void mg_fill_w(uint8_t *p, size_t n, uint64_t seed, int sc)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		const uint32_t r = mg_hash(seed * 0x9E3779B97F4A7C15ull + i);
		p[i] = sc ? (uint8_t)(0x20 + (r & 15)) : (uint8_t)r;
	}
}

__global__ void mg_fill_f(float *p, size_t n, uint64_t seed, float lo, float hi)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = lo + (hi - lo) * (float)(mg_hash(seed * 0x9E3779B97F4A7C15ull + i) >> 8) * (1.0f / 16777216.0f);
}

/* bf16 values in [-a, a) */
__global__ void mg_fill_bf(__nv_bfloat16 *p, size_t n, uint64_t seed, float a)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = __float2bfloat16_rn(a * (-1.0f + 2.0f * (float)(mg_hash(seed * 0x9E3779B97F4A7C15ull + i) >> 8) *
		                                            (1.0f / 16777216.0f)));
}

/* a matrix's bytes: rows x K codes and scales */
#define MB_C(rows, K) ((size_t)(rows) * (K) / 2)
#define MB_S(rows, K) ((size_t)(rows) * (K) / 16)

struct mg_model {
	int L, nb; /* layers, KV blocks a layer */
	std::vector<mg_layer> ly;
	mg_layer *d_ly;
	size_t gu_c, gu_s, dn_c, dn_s, rt_b, kv_b;
	int32_t *d_table; /* [nb]: a shuffled block order */
	CUtensorMap *d_maps, *d_kvmap; /* [L][4] (mg_map_w), [2] */
	std::vector<int32_t> table;
	float *d_inv;
	std::vector<void *> bufs;
};

static void *mg_alloc(mg_model &m, size_t bytes)
{
	void *p;
	CK(cudaMalloc(&p, bytes));
	m.bufs.push_back(p);
	return p;
}

static uint8_t *mg_rand(mg_model &m, size_t n, uint64_t seed, int sc)
{
	uint8_t *p = (uint8_t *)mg_alloc(m, n);
	mg_fill_w<<<1024, 256>>>(p, n, seed, sc);
	return p;
}

static void mg_model_make(mg_model &m, int L, int ctx_max)
{
	m.L = L, m.nb = (ctx_max + MG_KVB - 1) / MG_KVB;
	m.gu_c = MB_C(2 * MG_FI, MG_H), m.gu_s = MB_S(2 * MG_FI, MG_H);
	m.dn_c = MB_C(MG_H, MG_FI), m.dn_s = MB_S(MG_H, MG_FI);
	m.rt_b = (size_t)MG_E * MG_H * 2;
	m.kv_b = (size_t)m.nb * MG_KVB * MG_NKV * MG_HD; /* elements */
	m.ly.resize(L);
	std::mt19937 rng(12345);
	/* the K and V pools, every layer's blocks in one (one tensor map each, as the backend's) */
	__nv_bfloat16 *kp = (__nv_bfloat16 *)mg_alloc(m, 2 * L * m.kv_b * sizeof(__nv_bfloat16));
	__nv_bfloat16 *vp = kp + L * m.kv_b;
	mg_fill_bf<<<1024, 256>>>(kp, 2 * L * m.kv_b, 3000, 1.0f);
	const mg_encode_fn enc = mg_encoder();
	if (!enc) {
		printf("mega_bench: no cuTensorMapEncodeTiled\n");
		exit(1);
	}
	std::vector<CUtensorMap> om(4 * L), kvm(2);
	std::uniform_real_distribution<float> ud(0.5f, 2.0f);
	for (int l = 0; l < L; l++) {
		mg_layer &y = m.ly[l];
		const uint64_t sd = 1000 + 16 * l;
		y.qkv = mg_rand(m, MB_C(MG_QKV, MG_H), sd, 0), y.qkv_s = mg_rand(m, MB_S(MG_QKV, MG_H), sd + 1, 1);
		y.o = mg_rand(m, MB_C(MG_H, MG_QR), sd + 2, 0), y.o_s = mg_rand(m, MB_S(MG_H, MG_QR), sd + 3, 1);
		y.gu = mg_rand(m, MG_E * m.gu_c, sd + 4, 0), y.gu_s = mg_rand(m, MG_E * m.gu_s, sd + 5, 1);
		y.dn = mg_rand(m, MG_E * m.dn_c, sd + 6, 0), y.dn_s = mg_rand(m, MG_E * m.dn_s, sd + 7, 1);
		/* tensor scales of ~1 / 16 (the layer's outputs then of the inputs' size), one an expert */
		y.qkv_ws2 = ud(rng) / 16.0f, y.o_ws2 = ud(rng) / 16.0f;
		std::vector<float> ws(2 * MG_E);
		for (float &w : ws)
			w = ud(rng) / 16.0f;
		float *dws = (float *)mg_alloc(m, ws.size() * 4);
		CK(cudaMemcpy(dws, ws.data(), ws.size() * 4, cudaMemcpyHostToDevice));
		y.gu_ws2 = dws, y.dn_ws2 = dws + MG_E;
		/* the router: logits of a few units, as trained routers' (a spread that makes the
		 * top-k's weights matter in the check) */
		__nv_bfloat16 *rt = (__nv_bfloat16 *)mg_alloc(m, m.rt_b);
		mg_fill_bf<<<256, 256>>>(rt, m.rt_b / 2, 4000 + l, 0.05f);
		y.rt = rt;
		float *n = (float *)mg_alloc(m, (2 * MG_H + 2 * MG_HD) * sizeof(float));
		mg_fill_f<<<16, 256>>>(n, 2 * MG_H + 2 * MG_HD, 2000 + l, 0.8f, 1.2f);
		y.n1 = n, y.n2 = n + MG_H, y.qn = n + 2 * MG_H, y.kn = y.qn + MG_HD;
		y.kc = kp + l * m.kv_b, y.vc = vp + l * m.kv_b;
		/* MG_EXPOOL=1 (time only): every layer's experts are layer 0's (their pages' TLB entries
		 * and DRAM rows warm: what the experts' spread over memory costs) */
		if (l > 0 && getenv("MG_EXPOOL") && atoi(getenv("MG_EXPOOL")))
			y.gu = m.ly[0].gu, y.gu_s = m.ly[0].gu_s, y.dn = m.ly[0].dn, y.dn_s = m.ly[0].dn_s;
		if (mg_map_w(enc, y.o, y.o_s, y.qkv_s, y.gu_s, (int64_t)MG_E * 2 * MG_FI, &om[4 * l])) {
			printf("mega_bench: the weights' tensor maps failed\n");
			exit(1);
		}
	}
	if (mg_map_kv(enc, kp, (int64_t)L * m.nb, MG_NKV, &kvm[0]) || mg_map_kv(enc, vp, (int64_t)L * m.nb, MG_NKV, &kvm[1])) {
		printf("mega_bench: the KV tensor maps failed\n");
		exit(1);
	}
	m.d_maps = (CUtensorMap *)mg_alloc(m, om.size() * sizeof(CUtensorMap));
	m.d_kvmap = (CUtensorMap *)mg_alloc(m, kvm.size() * sizeof(CUtensorMap));
	CK(cudaMemcpy(m.d_maps, om.data(), om.size() * sizeof(CUtensorMap), cudaMemcpyHostToDevice));
	CK(cudaMemcpy(m.d_kvmap, kvm.data(), kvm.size() * sizeof(CUtensorMap), cudaMemcpyHostToDevice));
	m.table.resize(m.nb);
	for (int i = 0; i < m.nb; i++)
		m.table[i] = i;
	std::shuffle(m.table.begin(), m.table.end(), rng);
	m.d_table = (int32_t *)mg_alloc(m, m.nb * 4);
	CK(cudaMemcpy(m.d_table, m.table.data(), m.nb * 4, cudaMemcpyHostToDevice));
	float inv[MG_HD / 2];
	for (int i = 0; i < MG_HD / 2; i++)
		inv[i] = (float)pow(1e6, -2.0 * i / MG_HD); /* Qwen3's theta */
	m.d_inv = (float *)mg_alloc(m, sizeof inv);
	CK(cudaMemcpy(m.d_inv, inv, sizeof inv, cudaMemcpyHostToDevice));
	CK(cudaGetLastError());
	m.d_ly = (mg_layer *)mg_alloc(m, L * sizeof(mg_layer));
	CK(cudaMemcpy(m.d_ly, m.ly.data(), L * sizeof(mg_layer), cudaMemcpyHostToDevice));
	CK(cudaDeviceSynchronize());
}

/* position t's row of kv head g in a layer's blocks (elements from the pool's start) */
static size_t mg_kv_at(const mg_model &m, int t, int g)
{
	return ((size_t)(m.table[t / MG_KVB] * MG_KVB + t % MG_KVB) * MG_NKV + g) * MG_HD;
}

/* rotary's cos and sin at position p: [i] and [HD / 2 + i], of the kernel's float angle p x
 * inv_freq[i] (in double from there) */
static void mg_rope(int p, float *t)
{
	for (int i = 0; i < MG_HD / 2; i++) {
		const float ang = (float)p * (float)pow(1e6, -2.0 * i / MG_HD);
		t[i] = (float)cos((double)ang), t[MG_HD / 2 + i] = (float)sin((double)ang);
	}
}

/* q_norm / k_norm and rotary of one head (the reference) */
static void mg_ref_qk(const float *x, const float *w, const float *rope, float eps, float *y)
{
	double ss = 0.0;
	for (int d = 0; d < MG_HD; d++)
		ss += (double)x[d] * x[d];
	const double r = 1.0 / sqrt(ss / MG_HD + eps);
	double v[MG_HD];
	for (int d = 0; d < MG_HD; d++)
		v[d] = x[d] * r * w[d];
	for (int d = 0; d < MG_HD / 2; d++) {
		y[d] = (float)(v[d] * rope[d] - v[d + MG_HD / 2] * rope[MG_HD / 2 + d]);
		y[d + MG_HD / 2] = (float)(v[d + MG_HD / 2] * rope[d] + v[d] * rope[MG_HD / 2 + d]);
	}
}

struct mg_run {
	mg_args a;
	int G, ctx;
	int32_t *d_pos, *d_seq;
};

static void mg_run_make(mg_run &r, const mg_model &m, int L, int ctx, int G)
{
	memset(&r.a, 0, sizeof r.a);
	mg_args &a = r.a;
	r.G = G, r.ctx = ctx;
	a.ly = m.d_ly, a.L = L;
	a.eps = 1e-6f, a.scale = 1.0f / sqrtf((float)MG_HD), a.mscale = 1.0f;
	a.inv_freq = m.d_inv;
	const int32_t ps[2] = {ctx - 1, 0};
	CK(cudaMalloc(&r.d_pos, 8));
	CK(cudaMemcpy(r.d_pos, ps, 8, cudaMemcpyHostToDevice));
	r.d_seq = r.d_pos + 1;
	a.pos = r.d_pos, a.seq = r.d_seq, a.table = m.d_table, a.table_stride = m.nb;
	a.nb = m.nb, a.maps = m.d_maps, a.kvmap = m.d_kvmap;
	a.gu_stride = m.gu_c, a.gus_stride = m.gu_s, a.dn_stride = m.dn_c, a.dns_stride = m.dn_s;
	float *hin;
	CK(cudaMalloc(&hin, (size_t)MG_H * 4));
	mg_fill_f<<<8, 256>>>(hin, MG_H, 7, -1.0f, 1.0f);
	a.hin = hin;
	CK(cudaMalloc(&a.hout, (size_t)MG_H * 4));
	CK(cudaMalloc(&a.h, (size_t)L * MG_H * 4));
	CK(cudaMalloc(&a.h2, (size_t)L * MG_H * 4));
	CK(cudaMalloc(&a.q, (size_t)L * MG_QR * 4));
	CK(cudaMalloc(&a.kraw, (size_t)L * MG_NKV * MG_HD * 4));
	CK(cudaMalloc(&a.att, (size_t)L * MG_QR * 4));
	const int S = (ctx + MG_T - 1) / MG_T;
	CK(cudaMalloc(&a.part, (size_t)MG_NKV * S * 8 * MG_PS * 4));
	CK(cudaMalloc(&a.rpart, (size_t)L * MG_O_TILES * MG_E * 4));
	CK(cudaMalloc(&a.logits, (size_t)L * MG_E * 4));
	CK(cudaMalloc(&a.act, (size_t)L * MG_K * MG_FI * 4));
	CK(cudaMalloc(&a.sel, (size_t)L * MG_K * 4));
	CK(cudaMalloc(&a.cnt, (size_t)L * MG_CNT * 4));
	CK(cudaMalloc(&a.tl, (size_t)G * MG_TL * 8));
	CK(cudaMemset(a.tl, 0, (size_t)G * MG_TL * 8));
	a.tl_layer = L / 2;
	CK(cudaGetLastError());
}

#define MG_LAYERS 48 /* qwen3-30b-a3b's (time's layers are capped to it) */
static int *mg_dg_host;
static unsigned mg_cnt_lo; /* the counters' address, low 32 bits, for the dump */
static int mg_G;

/* waits for the stream up to 20 s; then prints every recorded wait and ends the program */
static void mg_finish(cudaStream_t s)
{
	for (int i = 0; i < 20000; i++) {
		const cudaError_t e = cudaStreamQuery(s);
		if (e == cudaSuccess)
			return;
		if (e != cudaErrorNotReady)
			CK(e);
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	if (!mg_dg_host) {
		printf("HANG: the launch did not finish in 20 s (MG_DIAG=1 says where)\n");
		exit(2);
	}
	printf("HANG: the launch did not finish in 20 s; each block's last wait over 1 s (consumer warp 0, "
	       "then the producer):\n");
	for (int b = 0; b < mg_G; b++)
		for (int w = 0; w <= MG_W; w += MG_W) {
			const volatile int *d = mg_dg_host + 4 * (b * (MG_W + 1) + w);
			if (!d[0]) {
				printf("  block %d %s: none\n", b, w ? "producer" : "consumers");
				continue;
			}
			if (d[0] == 100) {
				const unsigned off = ((unsigned)d[1] - mg_cnt_lo) / 4;
				printf("  block %d %s: counter layer %u index %u at %u of %u\n", b, w ? "producer" : "consumers",
				       off / MG_CNT, off % MG_CNT, (unsigned)d[2] >> 16, (unsigned)d[2] & 0xFFFF);
			} else
				printf("  block %d %s: barrier kind %d (1 full/tile, 2 full/attn, 3 empty, 4 selbar) n %d "
				       "parity %d\n",
				       b, w ? "producer" : "consumers", d[0], d[1], d[2]);
		}
	fflush(stdout);
	exit(2);
}

/* one step: the counters cleared, then the launch (e0, when given, recorded between the two so
 * that it times the kernel alone) */
static void mg_launch(mg_run &r, cudaStream_t s, cudaEvent_t e0 = NULL)
{
	mg_cnt_lo = (unsigned)(uintptr_t)r.a.cnt;
	CK(cudaMemsetAsync(r.a.cnt, 0, (size_t)r.a.L * MG_CNT * 4, s));
	/* act's values carry their readiness (mg_put_ready): zero until written */
	CK(cudaMemsetAsync(r.a.act, 0, (size_t)r.a.L * MG_K * MG_FI * 4, s));
	if (e0)
		CK(cudaEventRecord(e0, s));
	void *args[] = {(void *)&r.a};
	CK(cudaLaunchCooperativeKernel((void *)mg_kernel, r.G, MG_THREADS, args, MG_SMEM, s));
}

/* ---- the CPU reference ---------------------------------------------------------------------- */

static std::vector<uint8_t> mg_get(const void *d, size_t bytes)
{
	std::vector<uint8_t> v(bytes);
	CK(cudaMemcpy(v.data(), d, bytes, cudaMemcpyDeviceToHost));
	return v;
}

static std::vector<float> mg_getf(const float *d, size_t n)
{
	std::vector<float> v(n);
	CK(cudaMemcpy(v.data(), d, n * 4, cudaMemcpyDeviceToHost));
	return v;
}

/* y = ws2 W x for a row-major NVFP4 matrix (N rows, K columns; codes in the device's permuted
 * word order, as uploaded) */
static void mg_matvec(const uint8_t *codes, const uint8_t *scales, int N, int K, float ws2, const float *x, float *y)
{
	for (int r = 0; r < N; r++) {
		double s = 0.0;
		for (int k = 0; k < K; k += 8) {
			uint32_t word;
			memcpy(&word, codes + (size_t)r * K / 2 + k / 2, 4);
			const float sc = fp4s_e4m3_to_f32(scales[(size_t)r * K / 16 + k / 16]);
			for (int i = 0; i < 8; i++)
				s += (double)(fp4s_e2m1_to_f32(fp4s_e2m1_perm_code(word, i)) * sc) * x[k + i];
		}
		y[r] = (float)(s * ws2);
	}
}

static void mg_norm(const float *h, const float *nw, float eps, float *x)
{
	double ss = 0.0;
	for (int k = 0; k < MG_H; k++)
		ss += (double)h[k] * h[k];
	const float r = (float)(1.0 / sqrt(ss / MG_H + eps));
	for (int k = 0; k < MG_H; k++)
		x[k] = h[k] * r * nw[k];
}

/* relative L2 error of got against want; prints and returns whether within tol */
static int mg_cmp(const char *what, int l, const float *got, const float *want, int n, double tol)
{
	double e = 0.0, s = 0.0;
	for (int i = 0; i < n; i++) {
		const double d = (double)got[i] - want[i];
		e += d * d;
		s += (double)want[i] * want[i];
	}
	const double rel = sqrt(e / (s > 0 ? s : 1.0));
	const int ok = rel <= tol && rel == rel;
	printf("  layer %d %-7s rel L2 %.3e %s\n", l, what, rel, ok ? "ok" : "FAIL");
	return ok;
}

static int mg_check(const mg_model &m, int ctx, int G)
{
	const int L = 2;
	mg_run r;
	mg_run_make(r, m, L, ctx, G);
	printf("check: ctx %d, %d splits a kv head, %d blocks\n", ctx, (ctx + MG_T - 1) / MG_T, G);
	/* the cache before the launch (the kernel writes position ctx - 1) */
	std::vector<std::vector<uint8_t>> kc(L), vc(L);
	for (int l = 0; l < L; l++) {
		kc[l] = mg_get(m.ly[l].kc, m.kv_b * 2);
		vc[l] = mg_get(m.ly[l].vc, m.kv_b * 2);
	}
	std::vector<float> h = mg_getf(r.a.hin, MG_H);
	mg_launch(r, 0);
	mg_finish(0);
	CK(cudaDeviceSynchronize());
	int ok = 1;
	const std::vector<float> gq = mg_getf(r.a.q, (size_t)L * MG_QR), gatt = mg_getf(r.a.att, (size_t)L * MG_QR);
	const std::vector<float> gh2 = mg_getf(r.a.h2, (size_t)L * MG_H), gh = mg_getf(r.a.h, (size_t)L * MG_H);
	const std::vector<float> gout = mg_getf(r.a.hout, MG_H);
	const std::vector<float> glog = mg_getf(r.a.logits, (size_t)L * MG_E);
	const std::vector<float> gact = mg_getf(r.a.act, (size_t)L * MG_K * MG_FI);
	std::vector<int32_t> gsel((size_t)L * MG_K);
	CK(cudaMemcpy(gsel.data(), r.a.sel, gsel.size() * 4, cudaMemcpyDeviceToHost));
	for (int l = 0; l < L; l++) {
		const mg_layer &y = m.ly[l];
		const std::vector<float> n = mg_getf(y.n1, 2 * MG_H + 2 * MG_HD);
		std::vector<float> x(MG_H), qkv(MG_QKV), att(MG_QR), h2(MG_H), lg(MG_E), hn(MG_H);
		mg_norm(h.data(), n.data(), r.a.eps, x.data());
		mg_matvec(mg_get(y.qkv, MB_C(MG_QKV, MG_H)).data(), mg_get(y.qkv_s, MB_S(MG_QKV, MG_H)).data(), MG_QKV, MG_H,
		          y.qkv_ws2, x.data(), qkv.data());
		ok &= mg_cmp("q", l, &gq[(size_t)l * MG_QR], qkv.data(), MG_QR, 1e-4);
		/* q_norm, k_norm and rotary at pos, in place (v as it is) */
		{
			float rope[MG_HD], t[MG_HD];
			mg_rope(ctx - 1, rope);
			for (int hd = 0; hd < MG_NQ + MG_NKV; hd++) {
				mg_ref_qk(&qkv[hd * MG_HD], &n[2 * MG_H + (hd < MG_NQ ? 0 : MG_HD)], rope, r.a.eps, t);
				memcpy(&qkv[hd * MG_HD], t, sizeof t);
			}
		}
		/* the cache at pos holds the kernel's bf16(k) (normed, rotated), bf16(v): compared with the
		 * reference's k and v (to bf16's precision), then the attention reference reads the kernel's rows, so a
		 * rounding that went the other way is not counted against the attention */
		uint16_t *kb = (uint16_t *)kc[l].data(), *vb = (uint16_t *)vc[l].data();
		{
			const std::vector<uint8_t> ka = mg_get(y.kc, m.kv_b * 2), va = mg_get(y.vc, m.kv_b * 2);
			std::vector<float> got(2 * MG_NKV * MG_HD);
			for (int g = 0; g < MG_NKV; g++)
				for (int d = 0; d < MG_HD; d++) {
					const size_t at = mg_kv_at(m, ctx - 1, g) + d;
					kb[at] = ((const uint16_t *)ka.data())[at];
					vb[at] = ((const uint16_t *)va.data())[at];
					got[g * MG_HD + d] = fp4s_bf16_to_f32(kb[at]);
					got[MG_NKV * MG_HD + g * MG_HD + d] = fp4s_bf16_to_f32(vb[at]);
				}
			ok &= mg_cmp("k, v", l, got.data(), &qkv[MG_QR], 2 * MG_NKV * MG_HD, 4e-3);
		}
		for (int hq = 0; hq < MG_NQ; hq++) {
			const int g = hq / 8;
			std::vector<double> p(ctx);
			double mx = -INFINITY;
			for (int t = 0; t < ctx; t++) {
				const size_t at = mg_kv_at(m, t, g);
				double s = 0.0;
				for (int d = 0; d < MG_HD; d++)
					s += (double)qkv[hq * MG_HD + d] * fp4s_bf16_to_f32(kb[at + d]);
				p[t] = s / sqrt(128.0);
				mx = std::max(mx, p[t]);
			}
			double sum = 0.0;
			for (int t = 0; t < ctx; t++)
				sum += p[t] = exp(p[t] - mx);
			std::vector<double> o(MG_HD, 0.0);
			for (int t = 0; t < ctx; t++) {
				const size_t at = mg_kv_at(m, t, g);
				for (int d = 0; d < MG_HD; d++)
					o[d] += p[t] * fp4s_bf16_to_f32(vb[at + d]);
			}
			for (int d = 0; d < MG_HD; d++)
				att[hq * MG_HD + d] = (float)(o[d] / sum);
		}
		ok &= mg_cmp("att", l, &gatt[(size_t)l * MG_QR], att.data(), MG_QR, 1e-4);
		mg_matvec(mg_get(y.o, MB_C(MG_H, MG_QR)).data(), mg_get(y.o_s, MB_S(MG_H, MG_QR)).data(), MG_H, MG_QR, y.o_ws2,
		          att.data(), h2.data());
		for (int k = 0; k < MG_H; k++)
			h2[k] += h[k];
		ok &= mg_cmp("h2", l, &gh2[(size_t)l * MG_H], h2.data(), MG_H, 1e-4);
		mg_norm(h2.data(), n.data() + MG_H, r.a.eps, x.data());
		{
			const std::vector<uint8_t> rb = mg_get(y.rt, m.rt_b);
			const uint16_t *rw = (const uint16_t *)rb.data();
			for (int e = 0; e < MG_E; e++) {
				double s = 0.0;
				for (int k = 0; k < MG_H; k++)
					s += (double)fp4s_bf16_to_f32(rw[((size_t)(k / 16) * MG_E + e) * 16 + k % 16]) * x[k];
				lg[e] = (float)s;
			}
		}
		ok &= mg_cmp("logits", l, &glog[(size_t)l * MG_E], lg.data(), MG_E, 1e-4);
		/* top-k on the CPU's logits */
		std::vector<int> idx(MG_E);
		for (int e = 0; e < MG_E; e++)
			idx[e] = e;
		std::stable_sort(idx.begin(), idx.end(), [&](int p1, int p2) { return lg[p1] > lg[p2]; });
		double wsum = 0.0, w[MG_K];
		for (int k = 0; k < MG_K; k++)
			wsum += w[k] = exp((double)lg[idx[k]] - lg[idx[0]]);
		int same = 1;
		for (int k = 0; k < MG_K; k++)
			same &= gsel[(size_t)l * MG_K + k] == idx[k];
		printf("  layer %d experts %s (", l, same ? "equal" : "DIFFER");
		for (int k = 0; k < MG_K; k++)
			printf("%d%s", gsel[(size_t)l * MG_K + k], k + 1 < MG_K ? " " : ")\n");
		ok &= same;
		const std::vector<float> wsg = mg_getf(y.gu_ws2, MG_E), wsd = mg_getf(y.dn_ws2, MG_E);
		for (int k = 0; k < MG_H; k++)
			hn[k] = h2[k];
		for (int k = 0; k < MG_K; k++) {
			const int e = idx[k];
			std::vector<float> gu(2 * MG_FI), act(MG_FI), dn(MG_H);
			mg_matvec(mg_get(y.gu + (size_t)e * m.gu_c, m.gu_c).data(), mg_get(y.gu_s + (size_t)e * m.gu_s, m.gu_s).data(),
			          2 * MG_FI, MG_H, wsg[e], x.data(), gu.data());
			for (int i = 0; i < MG_FI; i++) {
				const float g = gu[2 * i], u = gu[2 * i + 1];
				act[i] = g / (1.0f + expf(-g)) * u;
			}
			char what[16];
			snprintf(what, sizeof what, "act%d", k);
			ok &= mg_cmp(what, l, &gact[((size_t)l * MG_K + k) * MG_FI], act.data(), MG_FI, 1e-4);
			mg_matvec(mg_get(y.dn + (size_t)e * m.dn_c, m.dn_c).data(), mg_get(y.dn_s + (size_t)e * m.dn_s, m.dn_s).data(),
			          MG_H, MG_FI, wsd[e], act.data(), dn.data());
			for (int i = 0; i < MG_H; i++)
				hn[i] += (float)(w[k] / wsum) * dn[i];
		}
		ok &= mg_cmp("h out", l, l + 1 < L ? &gh[(size_t)(l + 1) * MG_H] : gout.data(), hn.data(), MG_H, 1e-4);
		h = hn;
	}
	return ok;
}

static void mg_time(const mg_model &m, int L, int ctx, int G)
{
	mg_run r;
	mg_run_make(r, m, L, ctx, G);
	cudaStream_t s;
	CK(cudaStreamCreate(&s));
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	for (int i = 0; i < 3; i++) {
		mg_launch(r, s);
		mg_finish(s);
	}
	std::vector<float> us;
	for (int i = 0; i < 20; i++) {
		mg_launch(r, s, e0);
		CK(cudaEventRecord(e1, s));
		mg_finish(s);
		CK(cudaEventSynchronize(e1));
		float ms;
		CK(cudaEventElapsedTime(&ms, e0, e1));
		us.push_back(ms * 1000.0f);
	}
	std::sort(us.begin(), us.end());
	const double med = us[us.size() / 2];
	const double bytes = (double)L * (MB_C(MG_QKV, MG_H) + MB_S(MG_QKV, MG_H) + MB_C(MG_H, MG_QR) + MB_S(MG_H, MG_QR) +
	                                  m.rt_b + MG_K * (m.gu_c + m.gu_s + m.dn_c + m.dn_s) +
	                                  2.0 * MG_NKV * ctx * MG_HD * 2);
	printf("time: %d layers, ctx %d (%d splits): step %.1f us (min %.1f, max %.1f), %.2f us a layer, %.0f GB/s "
	       "(%.1f MB a step)\n",
	       L, ctx, (ctx + MG_T - 1) / MG_T, med, us.front(), us.back(), med / L, bytes / med / 1e3, bytes / 1e6);
	/* one layer's phase ends, max over blocks, from the earliest start */
	std::vector<unsigned long long> tl((size_t)G * MG_TL);
	CK(cudaMemcpy(tl.data(), r.a.tl, tl.size() * 8, cudaMemcpyDeviceToHost));
	unsigned long long t0 = ~0ull;
	for (int b = 0; b < G; b++)
		t0 = std::min(t0, tl[(size_t)b * MG_TL]);
	const char *names[MG_TL] = {"start", "q-x",  "q-t",    "qkv",   "a-q",   "a-s",  "a-sm",   "a-pv",
	                            "a-pw",  "m-seen", "m-sums", "attn", "o",   "o-seen", "rsum", "topk",
	                            "gu",    "d-seen", "d-act",  "d-land", "down", "p-sel", "p-copied"};
	printf("  layer %d phase ends (us from its first start, max / median over blocks):", r.a.tl_layer);
	for (int p = 0; p < MG_TL; p++) {
		std::vector<double> v;
		for (int b = 0; b < G; b++)
			if (tl[(size_t)b * MG_TL + p]) /* blocks without the phase leave it 0 */
				v.push_back((double)(long long)(tl[(size_t)b * MG_TL + p] - t0) / 1e3);
		if (v.empty())
			continue;
		std::sort(v.begin(), v.end());
		printf(" %s %.2f/%.2f", names[p], v.back(), v[v.size() / 2]);
	}
	printf("\n");
	CK(cudaStreamDestroy(s));
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "check";
	int dev, G;
	CK(cudaGetDevice(&dev));
	CK(cudaDeviceGetAttribute(&G, cudaDevAttrMultiProcessorCount, dev));
	CK(cudaFuncSetAttribute(mg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, MG_SMEM));
	int per_sm = 0;
	CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mg_kernel, MG_THREADS, MG_SMEM));
	printf("mega_bench: %d SMs, %d block(s) an SM, %d B shared a block\n", G, per_sm, MG_SMEM);
	if (per_sm < 1)
		return 1;
	if (G < MG_O_TILES) { /* a block an o tile and a down tile; <= 6 gate|up tiles a block */
		printf("mega_bench: needs >= %d SMs\n", MG_O_TILES);
		return 1;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	mg_G = G;
	/* the hang diagnostics: on for check, for time with MG_DIAG=1 (host-mapped stores) */
	if (!strcmp(mode, "check") || (getenv("MG_DIAG") && atoi(getenv("MG_DIAG")))) {
		const size_t bytes = (size_t)G * (MG_W + 1) * 4 * sizeof(int);
		CK(cudaHostAlloc((void **)&mg_dg_host, bytes, cudaHostAllocMapped));
		memset(mg_dg_host, 0, bytes);
		int *dp;
		CK(cudaHostGetDevicePointer((void **)&dp, mg_dg_host, 0));
		CK(cudaMemcpyToSymbol(mg_dg, &dp, sizeof dp));
	}
	if (!strcmp(mode, "check")) {
		mg_model m;
		mg_model_make(m, 2, 9216);
		int ok = mg_check(m, 300, G);
		ok &= mg_check(m, 1, G);
		ok &= mg_check(m, 9000, G);
		printf("check: %s\n", ok ? "PASS" : "FAIL");
		return ok ? 0 : 1;
	}
	/* 1..48: the model's layers */
	const int L = argc > 2 ? std::min(std::max(atoi(argv[2]), 1), MG_LAYERS) : MG_LAYERS;
	mg_model m;
	mg_model_make(m, L, 4096);
	if (argc > 3)
		for (int i = 3; i < argc; i++)
			mg_time(m, L, atoi(argv[i]), G);
	else {
		mg_time(m, L, 128, G);
		mg_time(m, L, 4096, G);
	}
	return 0;
}
