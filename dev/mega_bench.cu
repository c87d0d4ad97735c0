/* mega_bench.cu: the persistent decode step of mega_step.cuh / mega_kernel.cuh (qwen3-30b-a3b's
 * geometry, one launch for all 48 layers) against a CPU reference, and its timing.
 *
 * Usage: mega_bench [check | time [layers] [ctx...]]. check runs 2 layers at three contexts against
 * a CPU reference (every phase's output); time runs the 48-layer step at each context (default
 * 128 and 4096): median us a step and a layer over 20 launches, GB/s of the bytes a step reads,
 * and one layer's phase ends (max over blocks, from its start). */
#include <time.h>

#include <algorithm>
#include <vector>

#include "mega_kernel.cuh"

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

/* random tiled weights: code bytes random, scale bytes E4M3 in [2^-3, 2^-1) */
__global__ void mg_fill_w(uint8_t *p, size_t n, uint64_t seed)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		const uint32_t r = mg_hash(seed * 0x9E3779B97F4A7C15ull + i);
		p[i] = (i % MG_STEP) >= 1024 ? (uint8_t)(0x20 + (r & 15)) : (uint8_t)r;
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

struct mg_model {
	int L, ctx_max;
	std::vector<mg_layer> ly;
	mg_layer *d_ly;
	size_t qkv_b, o_b, rt_b, gu_b, dn_b, kv_b;
	std::vector<void *> bufs;
};

static void *mg_alloc(mg_model &m, size_t bytes)
{
	void *p;
	CK(cudaMalloc(&p, bytes));
	m.bufs.push_back(p);
	return p;
}

static void mg_model_make(mg_model &m, int L, int ctx_max)
{
	m.L = L, m.ctx_max = ctx_max;
	m.qkv_b = (size_t)MG_QKV_TILES * MG_STAGE;
	m.o_b = (size_t)MG_O_TILES * 2 * MG_STAGE;
	m.rt_b = (size_t)MG_E * MG_H * 2;
	m.gu_b = (size_t)MG_GU_TILES * MG_STAGE;
	m.dn_b = (size_t)MG_D_TILES * MG_DSTAGE;
	m.kv_b = (size_t)MG_NKV * ctx_max * MG_HD;
	m.ly.resize(L);
	for (int l = 0; l < L; l++) {
		mg_layer &y = m.ly[l];
		const size_t nw = m.qkv_b + m.o_b + MG_E * (m.gu_b + m.dn_b);
		uint8_t *w = (uint8_t *)mg_alloc(m, nw);
		mg_fill_w<<<1024, 256>>>(w, nw, 1000 + l);
		y.qkv = w, y.o = w + m.qkv_b, y.gu = y.o + m.o_b, y.dn = y.gu + MG_E * m.gu_b;
		/* the router: logits of a few units, as trained routers' (a spread that makes the
		 * top-k's weights matter in the check) */
		__nv_bfloat16 *rt = (__nv_bfloat16 *)mg_alloc(m, m.rt_b);
		mg_fill_bf<<<256, 256>>>(rt, m.rt_b / 2, 4000 + l, 0.05f);
		y.rt = rt;
		float *n = (float *)mg_alloc(m, (2 * MG_H + 2 * MG_HD) * sizeof(float));
		mg_fill_f<<<16, 256>>>(n, 2 * MG_H + 2 * MG_HD, 2000 + l, 0.8f, 1.2f);
		y.n1 = n, y.n2 = n + MG_H, y.qn = n + 2 * MG_H, y.kn = y.qn + MG_HD;
		__nv_bfloat16 *kv = (__nv_bfloat16 *)mg_alloc(m, 2 * m.kv_b * sizeof(__nv_bfloat16));
		mg_fill_bf<<<256, 256>>>(kv, 2 * m.kv_b, 3000 + l, 1.0f);
		y.kc = kv, y.vc = kv + m.kv_b;
	}
	CK(cudaGetLastError());
	CK(cudaMalloc(&m.d_ly, L * sizeof(mg_layer)));
	CK(cudaMemcpy(m.d_ly, m.ly.data(), L * sizeof(mg_layer), cudaMemcpyHostToDevice));
	CK(cudaDeviceSynchronize());
}

/* rotary's cos and sin at position p: [i] and [HD / 2 + i] for theta^(-2i / HD), theta 1e6
 * (Qwen3's), in double */
static void mg_rope(int p, float *t)
{
	for (int i = 0; i < MG_HD / 2; i++) {
		const double ang = (double)p * pow(1e6, -2.0 * i / MG_HD);
		t[i] = (float)cos(ang), t[MG_HD / 2 + i] = (float)sin(ang);
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
	int G;
};

static void mg_run_make(mg_run &r, const mg_model &m, int L, int ctx, int T, int G)
{
	memset(&r.a, 0, sizeof r.a);
	mg_args &a = r.a;
	r.G = G;
	a.ly = m.d_ly, a.L = L, a.ctx = ctx, a.ctx_max = m.ctx_max, a.T = T, a.S = (ctx + T - 1) / T;
	a.post = 1.0f / 16.0f, a.eps = 1e-6f;
	a.gu_stride = m.gu_b, a.dn_stride = m.dn_b;
	CK(cudaMalloc(&a.h, (size_t)(L + 1) * MG_H * 4));
	CK(cudaMalloc(&a.h2, (size_t)L * MG_H * 4));
	CK(cudaMalloc(&a.q, (size_t)L * MG_QR * 4));
	CK(cudaMalloc(&a.kraw, (size_t)L * MG_NKV * MG_HD * 4));
	{
		float rope[MG_HD];
		mg_rope(ctx - 1, rope);
		float *d;
		CK(cudaMalloc(&d, sizeof rope));
		CK(cudaMemcpy(d, rope, sizeof rope, cudaMemcpyHostToDevice));
		a.rope = d;
	}
	CK(cudaMalloc(&a.att, (size_t)L * MG_QR * 4));
	CK(cudaMalloc(&a.part, (size_t)L * MG_NKV * a.S * 8 * MG_PS * 4));
	CK(cudaMalloc(&a.rpart, (size_t)L * MG_O_TILES * MG_E * 4));
	CK(cudaMalloc(&a.logits, (size_t)L * MG_E * 4));
	CK(cudaMalloc(&a.act, (size_t)L * MG_K * MG_FI * 4));
	CK(cudaMalloc(&a.sel, (size_t)L * MG_K * 4));
	CK(cudaMalloc(&a.cnt, (size_t)L * MG_CNT * 4));
	CK(cudaMalloc(&a.tl, (size_t)G * MG_TL * 8));
	CK(cudaMemset(a.tl, 0, (size_t)G * MG_TL * 8));
	a.csplit = getenv("MG_CSPLIT") ? atoi(getenv("MG_CSPLIT")) : 1;
	a.exstatic = getenv("MG_EXSTATIC") ? atoi(getenv("MG_EXSTATIC")) : 0;
	a.expool = getenv("MG_EXPOOL") ? atoi(getenv("MG_EXPOOL")) : 0;
	a.poll = getenv("MG_POLL") ? atoi(getenv("MG_POLL")) : 0;
	a.tl_layer = L / 2;
	mg_fill_f<<<8, 256>>>(a.h, MG_H, 7, -1.0f, 1.0f);
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

/* one step: the records and counters cleared, then the launch (e0, when given, recorded between
 * the two so that it times the kernel alone) */
static void mg_launch(mg_run &r, cudaStream_t s, cudaEvent_t e0 = NULL)
{
	mg_cnt_lo = (unsigned)(uintptr_t)r.a.cnt;
	CK(cudaMemsetAsync(r.a.cnt, 0, (size_t)r.a.L * MG_CNT * 4, s));
	if (e0)
		CK(cudaEventRecord(e0, s));
	void *args[] = {(void *)&r.a};
	CK(cudaLaunchCooperativeKernel((void *)mg_kernel, r.G, MG_THREADS, args, MG_SMEM, s));
}

/* ---- the CPU reference ---------------------------------------------------------------------- */

/* rows [r0, r1) of a tiled matrix (K columns) decoded to floats (times post) */
static void mg_decode(const uint8_t *t, int K, int r0, int r1, float post, float *out)
{
	const int KS = K < 2048 ? K : 2048, nch = K / KS, SB = KS / 128 * MG_STEP;
	for (int r = r0; r < r1; r++) {
		const int tile = r / 16, rr = r % 16, hh = rr / 8, g = rr % 8;
		for (int k = 0; k < K; k++) {
			const int c = k / KS, kk = k % KS, s = kk / 128, t4 = (kk % 128) / 32, j = (kk % 32) / 8, i = kk % 8;
			const uint8_t *base = t + ((size_t)tile * nch + c) * SB + (size_t)s * MG_STEP;
			uint32_t word;
			memcpy(&word, base + hh * 512 + (g * 4 + t4) * 16 + j * 4, 4);
			const uint32_t code = fp4s_e2m1_perm_code(word, i);
			const uint8_t sc = base[1024 + (g * 4 + t4) * 4 + hh * 2 + (j >= 2)];
			out[(size_t)(r - r0) * K + k] = fp4s_e2m1_to_f32(code) * fp4s_e4m3_to_f32(sc) * post;
		}
	}
}

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

static void mg_matvec(const std::vector<uint8_t> &t, int N, int K, float post, const float *x, float *y)
{
	std::vector<float> w((size_t)16 * K);
	for (int r0 = 0; r0 < N; r0 += 16) {
		mg_decode(t.data(), K, r0, r0 + 16, post, w.data());
		for (int r = 0; r < 16; r++) {
			double s = 0.0;
			for (int k = 0; k < K; k++)
				s += (double)w[(size_t)r * K + k] * x[k];
			y[r0 + r] = (float)s;
		}
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

static int mg_check(const mg_model &m, int ctx, int T, int G)
{
	const int L = 2;
	mg_run r;
	mg_run_make(r, m, L, ctx, T, G);
	printf("check: ctx %d, %d splits of %d a kv head, %d blocks\n", ctx, r.a.S, T, G);
	/* the cache rows before the launch (the kernel writes position ctx - 1) */
	std::vector<std::vector<uint8_t>> kc(L), vc(L);
	for (int l = 0; l < L; l++) {
		kc[l] = mg_get(m.ly[l].kc, m.kv_b * 2);
		vc[l] = mg_get(m.ly[l].vc, m.kv_b * 2);
	}
	std::vector<float> h = mg_getf(r.a.h, MG_H);
	mg_launch(r, 0);
	mg_finish(0);
	CK(cudaDeviceSynchronize());
	const float post = r.a.post;
	int ok = 1;
	const std::vector<float> gq = mg_getf(r.a.q, (size_t)L * MG_QR), gatt = mg_getf(r.a.att, (size_t)L * MG_QR);
	const std::vector<float> gh2 = mg_getf(r.a.h2, (size_t)L * MG_H), gh = mg_getf(r.a.h, (size_t)(L + 1) * MG_H);
	const std::vector<float> glog = mg_getf(r.a.logits, (size_t)L * MG_E);
	const std::vector<float> gact = mg_getf(r.a.act, (size_t)L * MG_K * MG_FI);
	std::vector<int32_t> gsel((size_t)L * MG_K);
	CK(cudaMemcpy(gsel.data(), r.a.sel, gsel.size() * 4, cudaMemcpyDeviceToHost));
	for (int l = 0; l < L; l++) {
		const mg_layer &y = m.ly[l];
		const std::vector<float> n = mg_getf(y.n1, 2 * MG_H + 2 * MG_HD);
		std::vector<float> x(MG_H), qkv(MG_QKV), att(MG_QR), h2(MG_H), lg(MG_E), hn(MG_H);
		mg_norm(h.data(), n.data(), r.a.eps, x.data());
		mg_matvec(mg_get(y.qkv, m.qkv_b), MG_QKV, MG_H, post, x.data(), qkv.data());
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
					const size_t at = ((size_t)g * m.ctx_max + ctx - 1) * MG_HD + MG_KVSW(d, ctx - 1);
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
				double s = 0.0;
				for (int d = 0; d < MG_HD; d++)
					s += (double)qkv[hq * MG_HD + d] *
					     fp4s_bf16_to_f32(kb[((size_t)g * m.ctx_max + t) * MG_HD + MG_KVSW(d, t)]);
				p[t] = s / sqrt(128.0);
				mx = std::max(mx, p[t]);
			}
			double sum = 0.0;
			for (int t = 0; t < ctx; t++)
				sum += p[t] = exp(p[t] - mx);
			for (int d = 0; d < MG_HD; d++) {
				double o = 0.0;
				for (int t = 0; t < ctx; t++)
					o += p[t] * fp4s_bf16_to_f32(vb[((size_t)g * m.ctx_max + t) * MG_HD + MG_KVSW(d, t)]);
				att[hq * MG_HD + d] = (float)(o / sum);
			}
		}
		ok &= mg_cmp("att", l, &gatt[(size_t)l * MG_QR], att.data(), MG_QR, 1e-4);
		mg_matvec(mg_get(y.o, m.o_b), MG_H, MG_QR, post, att.data(), h2.data());
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
		for (int k = 0; k < MG_H; k++)
			hn[k] = h2[k];
		for (int k = 0; k < MG_K; k++) {
			const int e = idx[k];
			std::vector<float> gu(2 * MG_FI), act(MG_FI), dn(MG_H);
			mg_matvec(mg_get(y.gu + (size_t)e * m.gu_b, m.gu_b), 2 * MG_FI, MG_H, post, x.data(), gu.data());
			for (int i = 0; i < MG_FI; i++) {
				const float g = gu[2 * i], u = gu[2 * i + 1];
				act[i] = g / (1.0f + expf(-g)) * u;
			}
			char what[16];
			snprintf(what, sizeof what, "act%d", k);
			ok &= mg_cmp(what, l, &gact[((size_t)l * MG_K + k) * MG_FI], act.data(), MG_FI, 1e-4);
			mg_matvec(mg_get(y.dn + (size_t)e * m.dn_b, m.dn_b), MG_H, MG_FI, post, act.data(), dn.data());
			for (int i = 0; i < MG_H; i++)
				hn[i] += (float)(w[k] / wsum) * dn[i];
		}
		ok &= mg_cmp("h out", l, &gh[(size_t)(l + 1) * MG_H], hn.data(), MG_H, 1e-4);
		h = hn;
	}
	return ok;
}

static void mg_time(const mg_model &m, int L, int ctx, int G)
{
	mg_run r;
	mg_run_make(r, m, L, ctx, getenv("MG_TT") ? atoi(getenv("MG_TT")) : MG_T, G);
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
	const double bytes = (double)L * (m.qkv_b + m.o_b + m.rt_b + MG_K * (m.gu_b + m.dn_b) +
	                                  2.0 * MG_NKV * ctx * MG_HD * 2);
	printf("time: %d layers, ctx %d (%d splits): step %.1f us (min %.1f, max %.1f), %.2f us a layer, %.0f GB/s "
	       "(%.1f MB a step)\n",
	       L, ctx, r.a.S, med, us.front(), us.back(), med / L, bytes / med / 1e3, bytes / 1e6);
	/* one layer's phase ends, max over blocks, from the earliest start */
	std::vector<unsigned long long> tl((size_t)G * MG_TL);
	CK(cudaMemcpy(tl.data(), r.a.tl, tl.size() * 8, cudaMemcpyDeviceToHost));
	unsigned long long t0 = ~0ull;
	for (int b = 0; b < G; b++)
		t0 = std::min(t0, tl[(size_t)b * MG_TL]);
	const char *names[MG_TL] = {"start", "q-x",  "q-t",    "qkv",   "a-q",   "a-s",  "a-sm",   "a-pv",
	                            "a-pw",  "m-seen", "m-sums", "attn", "o",   "o-seen", "rsum", "topk",
	                            "gu",    "d-seen", "d-act",  "down", "p-sel", "p-copied"};
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
		mg_model_make(m, 2, 512);
		int ok = mg_check(m, 40, 16, G);
		ok &= mg_check(m, 300, MG_T, G);
		ok &= mg_check(m, 1, MG_T, G);
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
