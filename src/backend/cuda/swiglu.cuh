/* swiglu.cuh: the two SwiGLU forms, one expression each, for every kernel that computes one (the
 * backend's and the MoE kernels, the GEMVs' fused inputs and epilogues, the MoE GEMM's input):
 * all paths then round the same FP32 values the same way. */
#ifndef FP4S_SWIGLU_CUH
#define FP4S_SWIGLU_CUH

#include <math.h>

/* silu(gate) * up */
static __device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* gpt-oss: gate clamped above at limit, up to [-limit, limit]; gate * sigmoid(alpha gate) * (up + 1) */
static __device__ __forceinline__ float swiglu_oai(float g, float u, float alpha, float limit)
{
	g = fminf(g, limit);
	u = fminf(fmaxf(u, -limit), limit);
	return g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
}

#endif
