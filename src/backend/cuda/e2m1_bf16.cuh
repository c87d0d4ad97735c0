/* e2m1_bf16.cuh: eight E2M1 codes (a 32-bit word, code i in bits 4i..4i+3) to BF16 with byte
 * permutes, and a block scale to a BF16 pair: the decode shared by the prefill GEMMs
 * (gemm_fp4.cu, gemm_wgmma.cu). */
#ifndef FP4S_E2M1_BF16_CUH
#define FP4S_E2M1_BF16_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

/* No shared table (whose random indices cost ~3-4 way bank conflicts): a word's 8 magnitudes
 * are 4-bit nibbles already, i.e. prmt selectors, so two byte permutes against 8-byte tables
 * give the low and high bytes of 4 BF16 values, two more interleave them, and the sign bits are
 * moved into place with shifts. o[i] = the codes of byte i, the low nibble in the low half. */
static __device__ __forceinline__ void e2m1x8_to_bf16(uint32_t w, uint32_t (&o)[4])
{
	/* low / high byte of the BF16 of magnitudes 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6 */
	const uint32_t L0 = 0xC0800000u, L1 = 0xC0804000u, H0 = 0x3F3F3F00u, H1 = 0x40404040u;
	const uint32_t s0 = w & 0x7777u, s1 = (w >> 16) & 0x7777u; /* bit 3 clear: no sign mode */
	const uint32_t l0 = __byte_perm(L0, L1, s0), h0 = __byte_perm(H0, H1, s0);
	const uint32_t l1 = __byte_perm(L0, L1, s1), h1 = __byte_perm(H0, H1, s1);
	o[0] = __byte_perm(l0, h0, 0x5140) | ((w & 0x8u) << 12) | ((w & 0x80u) << 24);
	o[1] = __byte_perm(l0, h0, 0x7362) | ((w & 0x800u) << 4) | ((w & 0x8000u) << 16);
	o[2] = __byte_perm(l1, h1, 0x5140) | ((w & 0x80000u) >> 4) | ((w & 0x800000u) << 8);
	o[3] = __byte_perm(l1, h1, 0x7362) | ((w & 0x8000000u) >> 12) | (w & 0x80000000u);
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
