/* nll.cu: the negative log-likelihood of given tokens under rows of logits, where the logits are
 * (backend.h's token_nll): perplexity reads 8 bytes a row instead of the vocabulary's logits.
 * A block a row: the max (NaN never wins, as fmaxf), then the sum of exp(l - max) in double, as
 * the engine's host loop computes it (fp4s_engine_score), so both give the same figure to the
 * sums' order. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_impl.h"

#define NLL_THREADS 512

static __device__ double nll_block_sum(double v, double *red)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
	__syncthreads(); /* red free from the last use */
	if ((threadIdx.x & 31) == 0)
		red[threadIdx.x >> 5] = v;
	__syncthreads();
	double s = 0;
	for (int w = 0; w < NLL_THREADS / 32; w++)
		s += red[w];
	return s;
}

static __global__ void __launch_bounds__(NLL_THREADS)
	nll_kernel(const float *logits, int64_t vocab, const int32_t *targets, double *out)
{
	__shared__ double red[NLL_THREADS / 32];
	const float *l = logits + (size_t)blockIdx.x * (size_t)vocab;
	float m = -INFINITY;
	for (int64_t v = threadIdx.x; v < vocab; v += NLL_THREADS)
		m = fmaxf(m, l[v]);
	for (int o = 16; o > 0; o >>= 1)
		m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
	__shared__ float fred[NLL_THREADS / 32];
	if ((threadIdx.x & 31) == 0)
		fred[threadIdx.x >> 5] = m;
	__syncthreads();
	m = -INFINITY;
	for (int w = 0; w < NLL_THREADS / 32; w++)
		m = fmaxf(m, fred[w]);
	double s = 0;
	for (int64_t v = threadIdx.x; v < vocab; v += NLL_THREADS)
		s += exp((double)l[v] - (double)m);
	s = nll_block_sum(s, red);
	if (threadIdx.x == 0)
		out[blockIdx.x] = log(s) + (double)m - (double)l[targets[blockIdx.x]];
}

int cu_token_nll(struct fp4s_backend *be, const float *logits, int32_t n, int64_t vocab, const int32_t *targets,
                 double *out, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	cu_link_clear(c);
	if (n < 1 || vocab < 1)
		return fp4s_error_set(err, FP4S_EINVAL, "token_nll: %d rows of %lld", n, (long long)vocab);
	for (int32_t i = 0; i < n; i++)
		if (targets[i] < 0 || targets[i] >= vocab)
			return fp4s_error_set(err, FP4S_EINVAL, "token_nll: token %d outside the vocabulary [0, %lld)",
			                      targets[i], (long long)vocab);
	const int rc = cu_stage_reserve(c, (size_t)n * (sizeof(double) + sizeof(int32_t)), err);
	if (rc)
		return rc;
	/* [n] doubles, then [n] targets */
	double *d_out = (double *)c->d_samp, *h_out = (double *)c->h_samp;
	int32_t *d_t = (int32_t *)(d_out + n), *h_t = (int32_t *)(h_out + n);
	for (int32_t i = 0; i < n; i++)
		h_t[i] = targets[i];
	FP4S_CUDA_TRY(err, cudaMemcpyAsync(d_t, h_t, (size_t)n * sizeof *h_t, cudaMemcpyHostToDevice, c->s));
	nll_kernel<<<n, NLL_THREADS, 0, c->s>>>(logits, vocab, d_t, d_out);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	FP4S_CUDA_TRY(err, cudaMemcpyAsync(h_out, d_out, (size_t)n * sizeof *h_out, cudaMemcpyDeviceToHost, c->s));
	FP4S_CUDA_TRY(err, cudaStreamSynchronize(c->s));
	for (int32_t i = 0; i < n; i++)
		out[i] = h_out[i];
	return FP4S_OK;
}
