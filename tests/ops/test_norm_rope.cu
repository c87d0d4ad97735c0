// test_norm_rope.cu (label gpu): the CUDA backend's fused norm_rope op (Qwen3's per-head q/k
// RMSNorm, then RoPE, in one kernel) against the CPU backend's plain sequence (rmsnorm of q,
// rmsnorm of k, rope) on fresh random inputs: head sizes 64 and 128, full and partial rotary
// (rot < d, the tail passes through normalized), both norm kinds, positions up to 4000 (large
// angles, where sinf/cosf differ most), 1 to 37 tokens of several sequences, heads whose sizes
// differ by 2^+-3. The GPU output is poisoned with NaN first. Bounds: relative L2 per head 2e-6
// (both sides do the same float math in the same order but for cosf / sinf, ~1 ulp apart) and
// no NaN. `test_norm_rope [filter]` runs cases whose name contains filter.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "backend/backend.h"
#include "ops_test.h"
#include "test_util.h"

static void run_case(int nh, int nkv, int d, int rot, int zc, int n, const char *filter)
{
	char name[128];
	snprintf(name, sizeof name, "NORM_ROPE(nh=%d,nkv=%d,d=%d,rot=%d,%s,n=%d)", nh, nkv, d, rot,
	         zc ? "zero-centred" : "plain", n);
	if (filter && !strstr(name, filter))
		return;
	const int qw = nh * d, kw = nkv * d, max_ctx = 4096, nseq = 3;
	const int stride = max_ctx / FP4S_KV_BLOCK;
	std::vector<float> q((size_t)n * qw), k((size_t)n * kw), qn(d), kn(d), inv(rot / 2);
	std::vector<int32_t> pos(n), seq(n), tok(n, 0), table((size_t)nseq * stride);
	for (size_t i = 0; i < table.size(); i++)
		table[i] = (int32_t)i;
	for (int i = 0; i < n; i++) {
		seq[i] = i % nseq;
		pos[i] = i == 0 ? 0 : i == 1 ? max_ctx - 1 : (int32_t)(t_rand_u64() % max_ctx);
	}
	for (int i = 0; i < n * (nh + nkv); i++) {
		const double mag = exp2((double)(t_rand_u64() % 7) - 3.0); /* heads of different size */
		float *h = i < n * nh ? &q[(size_t)i * d] : &k[(size_t)(i - n * nh) * d];
		for (int j = 0; j < d; j++)
			h[j] = (float)(t_rand_normal() * mag);
	}
	for (int j = 0; j < d; j++) {
		qn[j] = (float)(zc ? 0.2 * t_rand_normal() : 1.0 + 0.2 * t_rand_normal());
		kn[j] = (float)(zc ? 0.2 * t_rand_normal() : 1.0 + 0.2 * t_rand_normal());
	}
	for (int j = 0; j < rot / 2; j++)
		inv[j] = (float)pow(1000000.0, -2.0 * j / rot);
	const float eps = 1e-6f, mscale = 1.0f;
	const enum fp4s_norm_kind kind = zc ? FP4S_NORM_ZERO_CENTRED : FP4S_NORM_PLAIN;

	struct fp4s_error err = {0};
	struct fp4s_backend *cpu = NULL, *gpu = NULL;
	if (fp4s_backend_cpu_create(&cpu, &err) || fp4s_backend_cuda_create(0, &gpu, &err)) {
		CHECK_MSG(0, "%s: backends: %s", name, err.msg);
		return;
	}
	CHECK(cpu->kv_init(cpu, 1, kw, nseq * stride, nseq, max_ctx, FP4S_KV_F32, &err) == FP4S_OK);
	CHECK(gpu->kv_init(gpu, 1, kw, nseq * stride, nseq, max_ctx, FP4S_KV_BF16, &err) == FP4S_OK);
	CHECK_MSG(gpu->norm_rope != NULL, "%s: the CUDA backend has no norm_rope", name);
	const struct fp4s_batch b = {n, tok.data(), pos.data(), seq.data(), table.data(), stride};

	/* CPU: the plain sequence the forward pass runs without the fused op */
	std::vector<float> qc = q, kc = k;
	int rc = cpu->begin(cpu, &b, &err);
	if (!rc) {
		cpu->rmsnorm(cpu, qc.data(), qn.data(), (int64_t)n * nh, d, eps, kind, qc.data());
		cpu->rmsnorm(cpu, kc.data(), kn.data(), (int64_t)n * nkv, d, eps, kind, kc.data());
		cpu->rope(cpu, qc.data(), kc.data(), &b, nh, nkv, d, rot, inv.data(), mscale);
	}
	/* GPU: the fused op */
	float *dq, *dk, *dqn, *dkn, *dinv;
	CK(cudaMalloc(&dq, q.size() * 4));
	CK(cudaMalloc(&dk, k.size() * 4));
	CK(cudaMalloc(&dqn, (size_t)d * 4));
	CK(cudaMalloc(&dkn, (size_t)d * 4));
	CK(cudaMalloc(&dinv, inv.size() * 4 + 4));
	CK(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dk, k.data(), k.size() * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dqn, qn.data(), (size_t)d * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dkn, kn.data(), (size_t)d * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dinv, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
	std::vector<float> qg(q.size(), NAN), kg(k.size(), NAN);
	if (!rc)
		rc = gpu->begin(gpu, &b, &err);
	if (!rc)
		rc = gpu->norm_rope(gpu, dq, dk, dqn, dkn, eps, kind, &b, nh, nkv, d, rot, dinv, mscale, &err);
	if (!rc)
		rc = gpu->read(gpu, qg.data(), dq, (int64_t)qg.size() * 4, &err);
	if (!rc)
		rc = gpu->read(gpu, kg.data(), dk, (int64_t)kg.size() * 4, &err);
	if (rc) {
		CHECK_MSG(0, "%s: %s", name, err.msg);
	} else {
		double worst = 0;
		int nan = 0;
		for (int i = 0; i < n * (nh + nkv); i++) {
			const float *g = i < n * nh ? &qg[(size_t)i * d] : &kg[(size_t)(i - n * nh) * d];
			const float *c = i < n * nh ? &qc[(size_t)i * d] : &kc[(size_t)(i - n * nh) * d];
			double num = 0, den = 0;
			for (int j = 0; j < d; j++) {
				nan |= isnan(g[j]);
				num += ((double)g[j] - c[j]) * ((double)g[j] - c[j]);
				den += (double)c[j] * c[j];
			}
			worst = fmax(worst, sqrt(num / den));
		}
		if (getenv("FP4S_TEST_VERBOSE"))
			printf("%s: worst head rel L2 %.2e\n", name, worst);
		CHECK_MSG(!nan && worst <= 2e-6, "%s: worst head rel L2 %.3g%s", name, worst, nan ? ", NaN" : "");
	}
	CK(cudaFree(dq));
	CK(cudaFree(dk));
	CK(cudaFree(dqn));
	CK(cudaFree(dkn));
	CK(cudaFree(dinv));
	cpu->destroy(cpu);
	gpu->destroy(gpu);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0); /* a run cut off by a time limit still shows how far it got */
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)
		TEST_SKIP("no CUDA device");
	t_seed_from_env();
	const char *filter = argc > 1 ? argv[1] : NULL;
	const int ns[] = {1, 2, 7, 37};
	for (int zc = 0; zc <= 1; zc++)
		for (int ni = 0; ni < 4; ni++) {
			run_case(32, 4, 128, 128, zc, ns[ni], filter); /* qwen3-30b-a3b */
			run_case(16, 8, 64, 64, zc, ns[ni], filter);
			run_case(8, 2, 128, 64, zc, ns[ni], filter); /* partial rotary */
		}
	return TEST_DONE();
}
