/* e2m1_bf16.cuh: eight E2M1 codes (a 32-bit word in the device's permuted layout, numerics.h) to
 * BF16, and a block scale to a BF16 pair: the decode shared by the prefill GEMMs (gemm_fp4.cu,
 * gemm_wgmma.cu). */
#ifndef FP4S_E2M1_BF16_CUH
#define FP4S_E2M1_BF16_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "numerics/numerics.h"

/* A word of 8 codes in the device's permuted layout (numerics.h) to o[i] = the BF16 values of
 * codes 2i (low half) and 2i + 1 (high half): the decode GEMVs' four pairs (codes 3-k, 7-k, each
 * value * 2^-126), regrouped by byte permutes and multiplied by 2^126 (exact: a power of two,
 * every result normal or zero). */
static __device__ __forceinline__ void e2m1x8_to_bf16(uint32_t w, uint32_t (&o)[4])
{
	const uint32_t d0 = fp4s_e2m1_perm_pair(w, 0), d1 = fp4s_e2m1_perm_pair(w, 1); /* (3, 7), (2, 6) */
	const uint32_t d2 = fp4s_e2m1_perm_pair(w, 2), d3 = fp4s_e2m1_perm_pair(w, 3); /* (1, 5), (0, 4) */
	const uint32_t g[4] = {__byte_perm(d3, d2, 0x5410), __byte_perm(d1, d0, 0x5410), __byte_perm(d3, d2, 0x7632),
	                       __byte_perm(d1, d0, 0x7632)};
	const uint32_t up = 0x7E807E80u; /* 2^126 in both halves */
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162 *>(&g[i]),
		                                 *reinterpret_cast<const __nv_bfloat162 *>(&up));
		o[i] = *reinterpret_cast<const uint32_t *>(&v);
	}
}

/* A block scale as a BF16 pair (both halves equal); FMT 0: an NVFP4 E4M3 byte, 1: an MXFP4 E8M0
 * byte. E4M3 and E8M0 values are exact in BF16. */
template <int FMT>
static __device__ __forceinline__ uint32_t scale_bf16x2(uint32_t s)
{
	uint32_t b;
	if (FMT == 0) {
		__half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)s, __NV_E4M3);
		__nv_bfloat16 v = __float2bfloat16_rn(__half2float(__half(h)));
		b = *reinterpret_cast<uint16_t *>(&v);
	} else {
		/* 2^(e-127): the exponent field itself; e = 0 is the subnormal 2^-127 */
		b = s ? (s & 0xFF) << 7 : 0x0040;
	}
	return b | (b << 16);
}

#endif
