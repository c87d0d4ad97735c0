// test_gemv_experts.cu (label gpu): the MoE forms of the tensor-core FP4 GEMV against the CPU
// reference fp4s_cpu_matmul on fresh random inputs: one token's expert slots
// (fp4s_gemv_mma_experts, with SwiGLU of h staged on the fly in its three forms, and the row-pair
// SwiGLU epilogues) and batches grouped by expert (fp4s_gemv_mma_grouped). Weights come from the
// real quantizers (gemv_test_util.h); outputs are poisoned with NaN; the check is relative L2
// error <= 3e-5 and repeated launches bit-identical. `test_gemv_experts [filter]` runs cases whose
// name contains filter.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/e2m1_device.h"
#include "backend/cuda/gemv_cuda.h"
#include "backend/cuda/gemv_mma.h"
#include "backend/cuda/moe_cuda.h"
#include "gemv_test_util.h"
#include "ops_test.h"
#include "test_util.h"

/* The MoE form (fp4s_gemv_mma_experts): E experts stacked at a stride, slots choosing experts
 * (repeats included), x rows shared by x_div slots, SwiGLU of h staged on the fly (act 1: halves,
 * act 2: gpt-oss interleaved and clamped, 3: interleaved silu(gate) * up), per-expert bias and
 * NVFP4 per-expert ws2; pair 1 / 2: the SwiGLU (clamped / silu) of row pairs in the epilogue. */
static void run_experts(enum fp4s_wformat fmt, int64_t rows, int64_t k, int act, int per_expert_ws2, int shared,
                        const char *filter, int pair = 0)
{
	char name[160];
	snprintf(name, sizeof name, "EXPERTS(%s,rows=%lld,K=%lld,act=%d%s%s%s)", fp4s_wformat_name(fmt), (long long)rows,
	         (long long)k, act, per_expert_ws2 ? ",ws2e" : "", shared ? ",shared x" : "",
	         pair == 1 ? ",pairact (gate, up rows -> clamped SwiGLU)" : pair ? ",pairact (gate, up rows -> silu * up)" : "");
	if (filter && !strstr(name, filter))
		return;
	/* shared: every slot reads the one x row (a token's gate|up projection, as the engine
	 * issues it) */
	const int E = 5, slots = 7, x_div = act ? 1 : shared ? slots : 2;
	struct gcase c = {fmt, rows, k, 1, 1};
	struct hw h[5];
	for (int e = 0; e < E; e++)
		if (make_weights(&c, &h[e])) {
			t_fail++;
			return;
		}
	const size_t db = h[0].data_b, sb = h[0].scales_b;
	uint8_t *hd = (uint8_t *)malloc(db * E), *hs = (uint8_t *)malloc(sb * E);
	float *bias = (float *)malloc(sizeof(float) * rows * E), ws2[5];
	for (int e = 0; e < E; e++) {
		memcpy(hd + db * e, h[e].data, db);
		memcpy(hs + sb * e, h[e].scales, sb);
		ws2[e] = per_expert_ws2 ? h[e].ws2 : h[0].ws2;
	}
	for (int64_t i = 0; i < rows * E; i++)
		bias[i] = (float)(t_rand_normal() * 0.1);
	int32_t idx[7];
	for (int i = 0; i < slots; i++)
		idx[i] = i == 3 ? idx[1] : (int32_t)(t_rand_u64() % E);
	const int64_t xs = act ? 2 * k : k, nrows_x = act ? slots : (slots + x_div - 1) / x_div;
	float *x = (float *)malloc(sizeof(float) * xs * nrows_x), *xa = (float *)malloc(sizeof(float) * k);
	for (int64_t i = 0; i < xs * nrows_x; i++)
		x[i] = (float)(t_rand_normal() * (act ? 2.0 : 1.0));
	float *yref = (float *)malloc(sizeof(float) * rows * slots), *ygpu = (float *)malloc(sizeof(float) * rows * slots);
	struct fp4s_error err = {0};
	const float alpha = 1.702f, limit = 7.0f;
	for (int sl = 0; sl < slots; sl++) {
		const float *xr = x + (int64_t)(sl / x_div) * xs;
		for (int64_t i = 0; i < k; i++) {
			if (act == 0) {
				xa[i] = xr[i];
			} else if (act == 1) {
				xa[i] = xr[i] / (1.0f + expf(-xr[i])) * xr[k + i];
			} else if (act == 2) {
				const float g = fminf(xr[2 * i], limit), u = fminf(fmaxf(xr[2 * i + 1], -limit), limit);
				xa[i] = g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
			} else { /* interleaved, silu(gate) * up */
				xa[i] = xr[2 * i] / (1.0f + expf(-xr[2 * i])) * xr[2 * i + 1];
			}
		}
		const int e = idx[sl];
		struct fp4s_mat wc = {fmt, rows, k, h[e].data, h[e].scales, ws2[e], bias + rows * e};
		fp4s_cpu_matmul(xa, 1, &wc, yref + rows * sl, &err);
	}
	/* pair: slot sl's output is rows / 2 wide, SwiGLU of its rows (2i, 2i + 1) as moe_act */
	const int64_t yw = pair ? rows / 2 : rows;
	if (pair)
		for (int sl = 0; sl < slots; sl++)
			for (int64_t i = 0; i < yw; i++) {
				const float gv = yref[rows * sl + 2 * i], uv = yref[rows * sl + 2 * i + 1];
				const float g = pair == 1 ? fminf(gv, limit) : gv;
				const float u = pair == 1 ? fminf(fmaxf(uv, -limit), limit) : uv;
				yref[yw * sl + i] = pair == 1 ? g / (1.0f + expf(-alpha * g)) * (u + 1.0f) : g / (1.0f + expf(-g)) * u;
			}
	uint8_t *dd, *ds;
	float *db_, *dx, *dy, *dws;
	int32_t *didx;
	CK(cudaMalloc(&dd, db * E));
	CK(cudaMalloc(&ds, sb * E));
	CK(cudaMalloc(&db_, sizeof(float) * rows * E));
	CK(cudaMalloc(&dx, sizeof(float) * xs * nrows_x));
	CK(cudaMalloc(&dy, sizeof(float) * rows * slots));
	CK(cudaMalloc(&dws, sizeof ws2));
	CK(cudaMalloc(&didx, sizeof idx));
	CK(cudaMemcpy(dd, hd, db * E, cudaMemcpyHostToDevice));
	CK(fp4s_cuda_e2m1_permute(dd, db * E, 0)); /* the device's code layout */
	CK(cudaMemcpy(ds, hs, sb * E, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(db_, bias, sizeof(float) * rows * E, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dx, x, sizeof(float) * xs * nrows_x, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dws, ws2, sizeof ws2, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(didx, idx, sizeof idx, cudaMemcpyHostToDevice));
	for (int64_t i = 0; i < rows * slots; i++)
		ygpu[i] = NAN;
	CK(cudaMemcpy(dy, ygpu, sizeof(float) * rows * slots, cudaMemcpyHostToDevice));
	struct fp4s_stacked st = {fmt, rows, k, dd, ds, db_, (int64_t)db, (int64_t)sb, ws2[0],
	                          per_expert_ws2 ? dws : NULL, 0};
	int rc = fp4s_cuda_mx_scale_range_stacked(&st, E, 0, &err);
	if (!rc)
		rc = pair ? fp4s_gemv_mma_experts_pairact(&st, didx, slots, dx, x_div, xs, pair, alpha, limit, dy, 0, &err)
		          : fp4s_gemv_mma_experts(&st, didx, slots, dx, x_div, xs, act, alpha, limit, dy, 0, &err);
	int failed = rc != 0;
	if (rc) {
		fprintf(stderr, "%s: failed: %d %s\n", name, rc, err.msg);
	} else {
		CK(cudaMemcpy(ygpu, dy, sizeof(float) * rows * slots, cudaMemcpyDeviceToHost));
		double num = 0, den = 0;
		for (int64_t i = 0; i < yw * slots; i++) {
			const double d = (double)ygpu[i] - yref[i];
			num += isnan(d) ? INFINITY : d * d;
			den += (double)yref[i] * yref[i];
		}
		const double rel = sqrt(num / den);
		if (!(rel <= 3e-5)) {
			fprintf(stderr, "%s: FAIL rel L2 %.3g\n", name, rel);
			failed = 1;
		}
		/* again, twice: not a bit may change (the combine's counters, too, must be back at zero
		 * for the next launch) */
		float *y2 = (float *)malloc(sizeof(float) * rows * slots);
		for (int rep = 0; rep < 2 && !failed; rep++) {
			CK(cudaMemset(dy, 0xFF, sizeof(float) * rows * slots));
			rc = pair ? fp4s_gemv_mma_experts_pairact(&st, didx, slots, dx, x_div, xs, pair, alpha, limit, dy, 0, &err)
			          : fp4s_gemv_mma_experts(&st, didx, slots, dx, x_div, xs, act, alpha, limit, dy, 0, &err);
			if (!rc)
				CK(cudaMemcpy(y2, dy, sizeof(float) * rows * slots, cudaMemcpyDeviceToHost));
			if (rc || memcmp(y2, ygpu, sizeof(float) * yw * slots)) {
				fprintf(stderr, "%s: FAIL repeat %d differs (rc %d)\n", name, rep, rc);
				failed = 1;
			}
		}
		free(y2);
	}
	if (failed)
		t_fail++;
	else
		t_pass++;
	CK(cudaFree(dd));
	CK(cudaFree(ds));
	CK(cudaFree(db_));
	CK(cudaFree(dx));
	CK(cudaFree(dy));
	CK(cudaFree(dws));
	CK(cudaFree(didx));
	for (int e = 0; e < E; e++)
		free(h[e].data), free(h[e].scales);
	free(hd), free(hs), free(bias), free(x), free(xa), free(yref), free(ygpu);
}

/* The grouped MoE form (fp4s_cuda_moe_group + fp4s_gemv_mma_grouped): n tokens x K slots over E
 * experts (one expert crowded, so it spans several groups; some experts unused), the gate|up
 * projection reading token rows through the group's row list, the down projection with the
 * SwiGLU staged; each slot's output row (at gpos) against the CPU. */
static void run_grouped(enum fp4s_wformat fmt, int64_t rows, int64_t k, int act, const char *filter)
{
	char name[160];
	snprintf(name, sizeof name, "GROUPED(%s,rows=%lld,K=%lld,act=%d)", fp4s_wformat_name(fmt), (long long)rows,
	         (long long)k, act);
	if (filter && !strstr(name, filter))
		return;
	const int E = 6, n = 37, K = 3, slots = n * K, gmax = 8;
	struct gcase c = {fmt, rows, k, 1, 1};
	struct hw h[6];
	for (int e = 0; e < E; e++)
		if (make_weights(&c, &h[e])) {
			t_fail++;
			return;
		}
	const size_t db = h[0].data_b, sb = h[0].scales_b;
	uint8_t *hd = (uint8_t *)malloc(db * E), *hs = (uint8_t *)malloc(sb * E);
	float *bias = (float *)malloc(sizeof(float) * rows * E);
	for (int e = 0; e < E; e++) {
		memcpy(hd + db * e, h[e].data, db);
		memcpy(hs + sb * e, h[e].scales, sb);
	}
	for (int64_t i = 0; i < rows * E; i++)
		bias[i] = (float)(t_rand_normal() * 0.1);
	int32_t idx[111];
	static const int32_t others[4] = {0, 2, 3, 5};
	for (int i = 0; i < slots; i++) /* expert 1 takes about half the slots; expert 4 none */
		idx[i] = t_rand_u64() % 2 ? 1 : others[t_rand_u64() % 4];
	const int64_t xs = act ? 2 * k : k, nrows_x = act ? slots : n;
	float *x = (float *)malloc(sizeof(float) * xs * nrows_x), *xa = (float *)malloc(sizeof(float) * k);
	for (int64_t i = 0; i < xs * nrows_x; i++)
		x[i] = (float)(t_rand_normal() * (act ? 2.0 : 1.0));
	float *yref = (float *)malloc(sizeof(float) * rows * slots), *ygpu = (float *)malloc(sizeof(float) * rows * slots);
	struct fp4s_error err = {0};
	const float alpha = 1.702f, limit = 7.0f;
	int32_t *dgpos, *dsrc, *dgexp, *dgoff, *dgm, *didx, gpos[111];
	const int32_t nz = fp4s_cuda_moe_group_count(slots, E, gmax);
	CK(cudaMalloc(&dgpos, sizeof gpos));
	CK(cudaMalloc(&dsrc, sizeof gpos));
	CK(cudaMalloc(&didx, sizeof idx));
	CK(cudaMalloc(&dgexp, sizeof(int32_t) * nz));
	CK(cudaMalloc(&dgoff, sizeof(int32_t) * nz));
	CK(cudaMalloc(&dgm, sizeof(int32_t) * nz));
	CK(cudaMemcpy(didx, idx, sizeof idx, cudaMemcpyHostToDevice));
	int rc = fp4s_cuda_moe_group(didx, slots, K, E, gmax, dgpos, dsrc, dgexp, dgoff, dgm, 0, &err);
	CK(cudaDeviceSynchronize());
	CK(cudaMemcpy(gpos, dgpos, sizeof gpos, cudaMemcpyDeviceToHost));
	/* act: x rows are already in expert order (the down projection's input): row gpos[s] */
	float *xg = (float *)malloc(sizeof(float) * xs * nrows_x);
	if (act)
		for (int sl = 0; sl < slots; sl++)
			memcpy(xg + (size_t)gpos[sl] * xs, x + (size_t)sl * xs, sizeof(float) * xs);
	for (int sl = 0; sl < slots; sl++) {
		const float *xr = act ? x + (int64_t)sl * xs : x + (int64_t)(sl / K) * xs;
		for (int64_t i = 0; i < k; i++) {
			if (act == 0) {
				xa[i] = xr[i];
			} else if (act == 1) {
				xa[i] = xr[i] / (1.0f + expf(-xr[i])) * xr[k + i];
			} else if (act == 2) {
				const float g = fminf(xr[2 * i], limit), u = fminf(fmaxf(xr[2 * i + 1], -limit), limit);
				xa[i] = g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
			} else { /* interleaved, silu(gate) * up */
				xa[i] = xr[2 * i] / (1.0f + expf(-xr[2 * i])) * xr[2 * i + 1];
			}
		}
		const int e = idx[sl];
		struct fp4s_mat wc = {fmt, rows, k, h[e].data, h[e].scales, h[0].ws2, bias + rows * e};
		fp4s_cpu_matmul(xa, 1, &wc, yref + rows * sl, &err);
	}
	uint8_t *dd, *ds;
	float *db_, *dx, *dy;
	CK(cudaMalloc(&dd, db * E));
	CK(cudaMalloc(&ds, sb * E));
	CK(cudaMalloc(&db_, sizeof(float) * rows * E));
	CK(cudaMalloc(&dx, sizeof(float) * xs * nrows_x));
	CK(cudaMalloc(&dy, sizeof(float) * rows * slots));
	CK(cudaMemcpy(dd, hd, db * E, cudaMemcpyHostToDevice));
	CK(fp4s_cuda_e2m1_permute(dd, db * E, 0)); /* the device's code layout */
	CK(cudaMemcpy(ds, hs, sb * E, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(db_, bias, sizeof(float) * rows * E, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dx, act ? xg : x, sizeof(float) * xs * nrows_x, cudaMemcpyHostToDevice));
	for (int64_t i = 0; i < rows * slots; i++)
		ygpu[i] = NAN;
	CK(cudaMemcpy(dy, ygpu, sizeof(float) * rows * slots, cudaMemcpyHostToDevice));
	struct fp4s_stacked st = {fmt, rows, k, dd, ds, db_, (int64_t)db, (int64_t)sb, h[0].ws2, NULL, 0};
	if (!rc)
		rc = fp4s_cuda_mx_scale_range_stacked(&st, E, 0, &err);
	if (!rc)
		rc = fp4s_gemv_mma_grouped(&st, dgexp, dgoff, dgm, nz, gmax, dx, act ? NULL : dsrc, xs, act, alpha, limit,
		                           dy, 0, &err);
	int failed = rc != 0;
	if (rc) {
		fprintf(stderr, "%s: failed: %d %s\n", name, rc, err.msg);
	} else {
		CK(cudaMemcpy(ygpu, dy, sizeof(float) * rows * slots, cudaMemcpyDeviceToHost));
		double num = 0, den = 0;
		for (int sl = 0; sl < slots; sl++)
			for (int64_t r = 0; r < rows; r++) {
				const double d = (double)ygpu[(size_t)gpos[sl] * rows + r] - yref[(size_t)sl * rows + r];
				num += isnan(d) ? INFINITY : d * d;
				den += (double)yref[(size_t)sl * rows + r] * yref[(size_t)sl * rows + r];
			}
		const double rel = sqrt(num / den);
		if (!(rel <= 3e-5)) {
			fprintf(stderr, "%s: FAIL rel L2 %.3g\n", name, rel);
			failed = 1;
		}
	}
	if (failed)
		t_fail++;
	else
		t_pass++;
	CK(cudaFree(dd));
	CK(cudaFree(ds));
	CK(cudaFree(db_));
	CK(cudaFree(dx));
	CK(cudaFree(dy));
	CK(cudaFree(dgpos));
	CK(cudaFree(dsrc));
	CK(cudaFree(didx));
	CK(cudaFree(dgexp));
	CK(cudaFree(dgoff));
	CK(cudaFree(dgm));
	for (int e = 0; e < E; e++)
		free(h[e].data), free(h[e].scales);
	free(hd), free(hs), free(bias), free(x), free(xa), free(xg), free(yref), free(ygpu);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0); /* a run cut off by a time limit still shows how far it got */
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)
		TEST_SKIP("no CUDA device");
	t_seed_from_env();
	const char *filter = argc > 1 ? argv[1] : NULL;
	const enum fp4s_wformat fmts[] = {FP4S_WF_NVFP4, FP4S_WF_MXFP4};
	for (size_t f = 0; f < 2; f++)
		for (int act = 0; act <= 3; act++) {
			run_experts(fmts[f], act ? 768 : 1536, act ? 768 : 2048, act, act == 1, 0, filter);
			run_experts(fmts[f], 5760 / (act == 2 ? 2 : 1) - (act == 2 ? 0 : 37), 2880, act, 0, 0, filter);
			if (act == 0) {
				run_experts(fmts[f], 1536, 2048, 0, 1, 1, filter);
				run_experts(fmts[f], 5760 - 37, 2880, 0, 0, 1, filter);
				run_experts(fmts[f], 5760, 2880, 0, 0, 1, filter, 1); /* gpt-oss gate|up */
				run_experts(fmts[f], 1536, 2048, 0, 1, 1, filter, 1);
				run_experts(fmts[f], 1536, 2048, 0, 1, 1, filter, 2); /* qwen3 gate|up as pairs */
				run_experts(fmts[f], 96, 2880, 0, 0, 0, filter, 2);
			}
		}
	for (size_t f = 0; f < 2; f++)
		for (int act = 0; act <= 3; act++)
			run_grouped(fmts[f], act ? 768 : 1536, act ? 768 : 2048, act, filter);
	run_grouped(FP4S_WF_MXFP4, 5760, 2880, 0, filter);
	run_grouped(FP4S_WF_MXFP4, 2880, 2880, 2, filter);
	return TEST_DONE();
}
