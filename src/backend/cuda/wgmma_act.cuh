/* wgmma_act.cuh: the order of gemm_wgmma.cu's BF16 activations (its header says why): inside each
 * 64-wide block of K, 16-byte chunk q holds logical k = 16 c + 2 q + e at position 8 q + 2 c + e
 * (c = 0..3, e = 0..1). Shared by the conversions that write it (gemm_wgmma.cu's FP32 -> BF16,
 * moe_gemm.cu's gather and SwiGLU). */
#ifndef FP4S_WGMMA_ACT_CUH
#define FP4S_WGMMA_ACT_CUH

#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

/* the logical k of the first value of chunk j of a row; the chunk's 4 pairs are at k + 16 c */
static __device__ __forceinline__ size_t wg_chunk_k(size_t j) { return (j >> 3) * 64 + (j & 7) * 2; }

/* two FP32 values as a BF16 pair (RNE), a in the low half */
static __device__ __forceinline__ uint32_t wg_pack_bf16(float a, float b)
{
	__nv_bfloat162 v = __floats2bfloat162_rn(a, b);
	return *reinterpret_cast<uint32_t *>(&v);
}

/* the chunk whose first value is p[0]: pairs p[16 c], p[16 c + 1] in BF16; vec: p is 8-byte
 * aligned (one float2 load a pair) */
static __device__ __forceinline__ uint4 wg_chunk(const float *p, int vec)
{
	uint32_t o[4];
#pragma unroll
	for (int c = 0; c < 4; c++) {
		float2 v;
		if (vec)
			v = *reinterpret_cast<const float2 *>(p + 16 * c);
		else
			v = make_float2(p[16 * c], p[16 * c + 1]);
		o[c] = wg_pack_bf16(v.x, v.y);
	}
	return make_uint4(o[0], o[1], o[2], o[3]);
}

#endif
