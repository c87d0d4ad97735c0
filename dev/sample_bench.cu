// sample_bench.cu: the device sampler (sample.cu) alone: microseconds a launch for one row (a
// single stream) and 64 rows (a server's batch), at the vocabularies of Llama 3, Qwen3 and
// gpt-oss, for temperature alone, top_k 40, top_p 0.9 and top_p 0.9 with raw logprobs and 5
// alternatives, on flat logits (a random model's) and peaked ones (a trained model's).
//
// Build: part of the CMake build when nvcc exists (target sample_bench). Run: ./sample_bench [ROWS]
// (ROWS: only the cases of that many rows, 1 or 64). FP4S_SAMPLE_BLOCKS=N: blocks a row.
//
// Method: each configuration is first checked against the CPU sampler (the tokens of 8 draws
// must be equal, as tests/ops/test_sample.cu demands, and the logprobs within 1e-5); then 30 launches, each on a fresh copy of
// the logits (the kernel overwrites them; the copy is outside the timed events), after 5 of
// warm-up. Prints the median and min of the CUDA-event times. The logits (at most 64 x 201088
// floats, 51 MB) sit in L2 after the copy, as they do after the lm_head in a decode step.
#include <algorithm>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "backend/cuda/sample_cuda.h"
#include "engine/sampler.h"
#include "dev_util.h"

static uint64_t rng = 0x5EED;
static double urand(void)
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return (double)(rng >> 11) * 0x1.0p-53;
}
static double nrand(void) { return sqrt(-2.0 * log(urand() + 1e-300)) * cos(6.283185307179586 * urand()); }

int main(int argc, char **argv)
{
	const int only_rows = argc > 1 ? atoi(argv[1]) : 0;
	static const int vocabs[] = {128256, 151936, 201088};
	static const int rows_of[] = {1, 64};
	static const char *setting[] = {"T=1", "top_k=40", "top_p=0.9", "top_p+lp5"};
	printf("%-8s %5s %-7s %-10s %10s %10s %12s\n", "vocab", "rows", "logits", "filter", "median us", "min us",
	       "us a row");
	int bad = 0;
	for (int vi = 0; vi < 3; vi++)
		for (int ri = 0; ri < 2; ri++)
			for (int peaked = 0; peaked < 2; peaked++)
				for (int si = 0; si < 4; si++) {
					const int V = vocabs[vi], n = rows_of[ri];
					if (only_rows && n != only_rows)
						continue;
					std::vector<float> lg((size_t)n * V);
					for (size_t i = 0; i < lg.size(); i++)
						lg[i] = (float)(2.0 * nrand()) + (peaked && urand() < 0.001 ? 12.0f : 0.0f);
					struct fp4s_sampling p;
					fp4s_samp_defaults(&p);
					p.temperature = si == 0 ? 1.0f : 0.7f;
					p.top_k = si == 1 ? 40 : 0;
					p.top_p = si >= 2 ? 0.9f : 1.0f;
					p.logprobs = si == 3;
					p.top_logprobs = si == 3 ? 5 : 0;
					p.has_seed = true;
					std::vector<fp4s_sampler> hs(n), ds(n);
					struct fp4s_error err = {};
					for (int r = 0; r < n; r++) {
						p.seed = 77 + (uint64_t)r;
						if (fp4s_samp_init(&hs[r], &p, V, NULL, 0, NULL, 0, &err) ||
						    fp4s_samp_init(&ds[r], &p, V, NULL, 0, NULL, 0, &err)) {
							fprintf(stderr, "init: %s\n", err.msg);
							return 1;
						}
					}
					float *d_src, *d_lg;
					fp4s_samp_row *d_rows;
					int32_t *d_out;
					float *d_work;
					fp4s_samp_result *d_res;
					CK(cudaMalloc(&d_work, lg.size() * sizeof(float)));
					CK(cudaMalloc(&d_res, (size_t)n * sizeof(fp4s_samp_result)));
					std::vector<fp4s_samp_result> lp(n);
					CK(cudaMalloc(&d_src, lg.size() * sizeof(float)));
					CK(cudaMalloc(&d_lg, lg.size() * sizeof(float)));
					CK(cudaMalloc(&d_rows, (size_t)n * sizeof(fp4s_samp_row)));
					CK(cudaMalloc(&d_out, (size_t)n * sizeof(int32_t)));
					CK(cudaMemcpy(d_src, lg.data(), lg.size() * sizeof(float), cudaMemcpyHostToDevice));
					std::vector<fp4s_samp_row> rows(n);
					std::vector<int32_t> tok(n);
					std::vector<float> row(V);
					cudaEvent_t e0, e1;
					CK(cudaEventCreate(&e0));
					CK(cudaEventCreate(&e1));
					std::vector<float> t;
					for (int it = 0; it < 8 + 5 + 30; it++) {
						for (int r = 0; r < n; r++) {
							fp4s_samp_edit none[1];
							int32_t ne = 0;
							fp4s_samp_plan(&ds[r], &rows[r], none, 1, &ne, &err);
							rows[r].edit0 = 0;
							rows[r].slot = rows[r].logprobs ? r : -1;
						}
						CK(cudaMemcpy(d_rows, rows.data(), (size_t)n * sizeof(fp4s_samp_row), cudaMemcpyHostToDevice));
						CK(cudaMemcpy(d_lg, d_src, lg.size() * sizeof(float), cudaMemcpyDeviceToDevice));
						CK(cudaEventRecord(e0));
						CK(fp4s_cuda_sample_launch(d_lg, n, V, d_rows, NULL, d_out, d_work, 0, d_res, 0));
						CK(cudaEventRecord(e1));
						CK(cudaEventSynchronize(e1));
						float ms = 0;
						CK(cudaEventElapsedTime(&ms, e0, e1));
						if (it >= 13)
							t.push_back(1e3f * ms);
						if (it < 8) { /* the CPU sampler on the same logits and random numbers */
							CK(cudaMemcpy(tok.data(), d_out, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost));
							CK(cudaMemcpy(lp.data(), d_res, (size_t)n * sizeof(fp4s_samp_result), cudaMemcpyDeviceToHost));
							for (int r = 0; r < n; r++) {
								memcpy(row.data(), &lg[(size_t)r * V], (size_t)V * sizeof(float));
								struct fp4s_samp_result res;
								fp4s_samp_sample(&hs[r], row.data(), V, &res, &err);
								bad += res.token != tok[r];
								if (p.logprobs) {
									bad += lp[r].token != res.token || lp[r].rank != res.rank || lp[r].n_top != res.n_top ||
									       !(fabsf(lp[r].logprob - res.logprob) <= 1e-5f);
									for (int j = 0; j < res.n_top && j < lp[r].n_top; j++)
										bad += lp[r].top[j].token != res.top[j].token ||
										       !(fabsf(lp[r].top[j].logprob - res.top[j].logprob) <= 1e-5f);
								}
								fp4s_samp_accept(&hs[r], res.token);
								fp4s_samp_accept(&ds[r], res.token);
							}
						}
					}
					std::sort(t.begin(), t.end());
					printf("%-8d %5d %-7s %-10s %10.1f %10.1f %12.2f\n", V, n, peaked ? "peaked" : "flat",
					       setting[si], t[t.size() / 2], t[0], t[t.size() / 2] / n);
					for (int r = 0; r < n; r++)
						fp4s_samp_free(&hs[r]), fp4s_samp_free(&ds[r]);
					cudaFree(d_src), cudaFree(d_lg), cudaFree(d_rows), cudaFree(d_out), cudaFree(d_work), cudaFree(d_res);
					cudaEventDestroy(e0), cudaEventDestroy(e1);
				}
	printf("tokens (and logprobs) differing from the CPU sampler: %d\n", bad);
	return bad ? 1 : 0;
}
