/* e2m1_bf16.cuh: eight E2M1 codes (a 32-bit word, code i in bits 4i..4i+3) to BF16 with byte
 * permutes, shared by the prefill GEMMs (gemm_fp4.cu, gemm_wgmma.cu). */
#ifndef FP4S_E2M1_BF16_CUH
#define FP4S_E2M1_BF16_CUH

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

#endif
