/* numerics.h: every number format fp4serve touches, in one header for host and device code.
 *
 * E2M1 (FP4) elements, E4M3/UE4M3 and E8M0 scales, BF16/FP16. The encoders are bit-exact with the
 * CUDA 13 host references (__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest),
 * __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3), __float2bfloat16, __float2half) on all 2^32
 * float inputs; tests/ref/test_slow_exhaustive.cpp checks that. Spec: docs/formats.md in the shared
 * docs (§2-§3). Decoding is exact for every code.
 *
 * Special values, in one place (all conversions are total):
 *   E2M1 encode: round-to-nearest-even, saturate to +-6 (Inf too); NaN -> 0x7 (+6, sign cleared);
 *                -0 and tiny negatives -> 0x8 (-0).
 *   E4M3 encode: RNE, satfinite: |x| >= 448 and +-Inf -> +-448 (0x7E/0xFE); NaN -> 0x7F; -0 -> 0x80.
 *   E4M3 decode: 0x7F/0xFF -> NaN. E8M0 decode: 0xFF -> NaN (callers must reject it: a malformed
 *                scale), 0x00 -> 2^-127.
 *   BF16 encode: RNE, NaN -> 0x7FFF. FP16 encode: RNE, overflow -> Inf, NaN -> 0x7FFF.
 *
 * Packing: byte i of a row holds element 2i in its low nibble and 2i+1 in its high nibble (the
 * Hugging Face / ModelOpt / gpt-oss order; ggml differs).
 */
#ifndef FP4S_NUMERICS_H
#define FP4S_NUMERICS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define FP4S_HD __host__ __device__ __forceinline__
#else
#define FP4S_HD inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum {
	FP4S_NVFP4_BLOCK = 16, /* elements per E4M3 block scale, along K */
	FP4S_MXFP4_BLOCK = 32, /* elements per E8M0 block scale, along K */
};

/* 6 (E2M1 max) x 448 (E4M3 max): the NVFP4 per-tensor scale denominator. */
#define FP4S_NVFP4_GLOBAL_DENOM 2688.0f

/* The 16 E2M1 values in code order. */
static const float fp4s_e2m1_values[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                           -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static FP4S_HD uint32_t fp4s_f32_bits(float x)
{
#if defined(__CUDA_ARCH__)
	return __float_as_uint(x);
#else
	uint32_t u;
	memcpy(&u, &x, sizeof u);
	return u;
#endif
}

static FP4S_HD float fp4s_bits_f32(uint32_t u)
{
#if defined(__CUDA_ARCH__)
	return __uint_as_float(u);
#else
	float x;
	memcpy(&x, &u, sizeof x);
	return x;
#endif
}

/* 2^k as a float, exact for k in [-149, 127] (subnormal results included). */
static FP4S_HD float fp4s_pow2i(int k)
{
	return k >= -126 ? fp4s_bits_f32((uint32_t)(k + 127) << 23) : fp4s_bits_f32(1u << (k + 149));
}

/* ---- E2M1 ---------------------------------------------------------------------------------- */

/* Decode one code (low 4 bits). Arithmetic rather than the table so device code needs no memory. */
static FP4S_HD float fp4s_e2m1_to_f32(uint32_t code)
{
	uint32_t e = (code >> 1) & 3, m = code & 1;
	float mag = e ? fp4s_pow2i((int)e - 1) * (1.0f + 0.5f * (float)m) : 0.5f * (float)m;
	return (code & 8) ? -mag : mag;
}

/* float -> E2M1, RNE with saturation, in two ranges of |x| (a = its bits):
 *   |x| >= 1: E2M1 codes 2..7 are the float's exponent and first mantissa bit, (E << 1 | m) - 252.
 *     Rounding the float's bits to one mantissa bit, ties to even, is an integer add of
 *     0x1FFFFF plus the kept bit; saturation is a min with 7. NaN bits land past 7 as well.
 *   |x| < 1: codes 0..2 are |x| in units of 0.5, rounded to even. Adding 2^22 (whose float
 *     spacing is 0.5) makes the FPU do that rounding; the code is the result's low bits.
 * This is the spec's threshold rule (>0.25, >=0.75, >1.25, >=1.75, >2.5, >=3.5, >5.0) in
 * about half the integer instructions, which matters in the GPU quantizer (ALU-bound); the
 * exhaustive test checks all 2^32 inputs. NaN: code 7 with the sign cleared. */
static FP4S_HD uint8_t fp4s_f32_to_e2m1(float x)
{
	uint32_t u = fp4s_f32_bits(x);
	uint32_t a = u & 0x7FFFFFFFu;
	uint32_t hi = ((a + 0x1FFFFFu + ((a >> 22) & 1u)) >> 22) - 252u;
	uint32_t lo = fp4s_f32_bits(fp4s_bits_f32(a) + 4194304.0f) - 0x4A800000u;
	uint32_t code = a < 0x3F800000u ? lo : (hi < 7u ? hi : 7u);
	uint32_t sign = (a > 0x7F800000u) ? 0u : (u >> 28) & 8u;
	return (uint8_t)(code | sign);
}

/* ---- E4M3 (FP8 e4m3fn; UE4M3 block scales are the same bytes with the sign clear) ------------- */

static FP4S_HD float fp4s_e4m3_to_f32(uint32_t b)
{
	uint32_t e = (b >> 3) & 15, m = b & 7;
	float mag;
	if (e == 15 && m == 7)
		return fp4s_bits_f32(0x7FC00000u);
	mag = e ? fp4s_pow2i((int)e - 7) * (1.0f + 0.125f * (float)m) : fp4s_pow2i(-9) * (float)m;
	return (b & 0x80) ? -mag : mag;
}

static FP4S_HD uint8_t fp4s_f32_to_e4m3(float x)
{
	uint32_t u = fp4s_f32_bits(x);
	uint32_t a = u & 0x7FFFFFFFu, sign = (u >> 24) & 0x80u, r;
	if (a > 0x7F800000u)
		return 0x7F;
	if (a >= 0x43E00000u) { /* >= 448 and Inf: satfinite */
		r = 0x7E;
	} else if (a < 0x3C800000u) { /* below 2^-6: E4M3 subnormal m * 2^-9; rintf is RNE */
		r = (uint32_t)rintf(fp4s_bits_f32(a) * 512.0f);
	} else { /* normal: RNE on the 20 dropped mantissa bits, then rebias the exponent 127 -> 7 */
		uint32_t t = a + 0x7FFFFu + ((a >> 20) & 1u);
		r = (t >> 20) - (120u << 3);
		r = r > 0x7Eu ? 0x7Eu : r;
	}
	return (uint8_t)(sign | r);
}

/* ---- E8M0 (MX scale) ------------------------------------------------------------------------ */

/* 2^(e-127); 0x00 is 2^-127 (an FP32 subnormal), 0xFF is NaN. */
static FP4S_HD float fp4s_e8m0_to_f32(uint32_t e)
{
	return e == 0xFF ? fp4s_bits_f32(0x7FC00000u) : fp4s_pow2i((int)e - 127);
}

/* OCP MX v1.0 shared scale for a block whose max |x| is amax: floor(log2(amax)) - 2 (E2M1's emax),
 * clamped below at 2^-127; amax = 0 gives 0x00; non-finite amax gives 0xFF (NaN). */
static FP4S_HD uint8_t fp4s_mx_scale_floor(float amax)
{
	uint32_t a = fp4s_f32_bits(amax) & 0x7FFFFFFFu;
	uint32_t ef = a >> 23; /* biased exponent; 0 for zero and FP32 subnormals (log2 < -126) */
	if (ef == 0xFF)
		return 0xFF;
	return (uint8_t)(ef >= 2 ? ef - 2 : 0);
}

/* ---- BF16 / FP16 ---------------------------------------------------------------------------- */

static FP4S_HD uint16_t fp4s_f32_to_bf16(float x)
{
	uint32_t u = fp4s_f32_bits(x);
	if ((u & 0x7FFFFFFFu) > 0x7F800000u)
		return 0x7FFF;
	return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static FP4S_HD float fp4s_bf16_to_f32(uint16_t h)
{
	return fp4s_bits_f32((uint32_t)h << 16);
}

static FP4S_HD uint16_t fp4s_f32_to_f16(float x)
{
	uint32_t u = fp4s_f32_bits(x);
	uint32_t a = u & 0x7FFFFFFFu, sign = (u >> 16) & 0x8000u, r, rem, half;
	if (a > 0x7F800000u)
		return 0x7FFF;
	if (a >= 0x47800000u) /* >= 65536 (and Inf): beyond the last rounding boundary, Inf */
		return (uint16_t)(sign | 0x7C00u);
	if (a >= 0x38800000u) { /* normal FP16 range: drop 13 bits, rebias 127 -> 15 */
		r = (a - 0x38000000u) >> 13;
		rem = a & 0x1FFFu;
		half = 0x1000u;
	} else if (a < 0x33000001u) { /* <= 2^-25: rounds to zero (the tie at 2^-25 goes to even 0) */
		return (uint16_t)sign;
	} else { /* FP16 subnormal: shift the full significand */
		uint32_t shift = 0x7Eu - (a >> 23), mant = (a & 0x7FFFFFu) | 0x800000u;
		r = mant >> shift;
		rem = mant & ((1u << shift) - 1u);
		half = 1u << (shift - 1);
	}
	r += (rem > half || (rem == half && (r & 1u))) ? 1u : 0u; /* carries into the exponent (Inf) */
	return (uint16_t)(sign | r);
}

static FP4S_HD float fp4s_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31, m = h & 0x3FFu;
	if (e == 31)
		return fp4s_bits_f32(sign | 0x7F800000u | (m << 13));
	if (e == 0) {
		float v = (float)m * fp4s_pow2i(-24);
		return sign ? -v : v;
	}
	return fp4s_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* ---- packed nibbles -------------------------------------------------------------------------- */

/* Element i of a packed row (low nibble = even index). */
static FP4S_HD uint32_t fp4s_fp4_get(const uint8_t *row, int64_t i)
{
	return (row[i >> 1] >> ((i & 1) * 4)) & 15u;
}

/* Offset of block scale (r, c) in the 128x4 interleaved layout native Blackwell block-scaled MMA
 * reads (formats.md §8): 512-byte atoms of 128 rows x 4 scale columns, tiled K-major. */
static FP4S_HD int64_t fp4s_sf_swizzled_offset(int64_t r, int64_t c, int64_t cols)
{
	int64_t ktiles = (cols + 3) / 4;
	return ((r >> 7) * ktiles + (c >> 2)) * 512 + (r & 31) * 16 + ((r >> 5) & 3) * 4 + (c & 3);
}

/* ---- E2M1 words on the device: permuted for a cheap BF16 decode ---------------------------- */

/* The CUDA backend keeps FP4 codes with the bits of each 32-bit word (8 codes, code i in bits
 * 4i..4i+3 as stored) permuted once at upload (fp4s_cuda_e2m1_permute), because of the decode
 * GEMVs: they turn a word into four BF16 pairs, pair k = (code 3 - k, code 7 - k) as the value
 * times 2^-126 (magnitude bits at 6..8 and 22..24, signs at 15 and 31). From the stored layout
 * each pair costs two shifts, a mask and a merge (15 operations a word, plus the scale
 * multiplies), because a code's sign sits next to its magnitude while BF16 wants it 9 bits above.
 * Permuted, the pairs are a mask, a rotate and a mask, and two rotates, a mask and a merge twice:
 * 11 operations, the fewest any permutation allows (bench/results/2026-11-22-h100-session14.md).
 * Code i's magnitude goes to bits fp4s_e2m1_perm_mag(i)..+2, its sign to fp4s_e2m1_perm_sign(i):
 *   code       0   1   2   3   4   5   6   7
 *   magnitude  9   0   3   6  25  16  19  22
 *   sign      14  13  12  15  30  29  28  31 */
static FP4S_HD int fp4s_e2m1_perm_mag(int i)
{
	const int j = i & 3;
	return (j == 0 ? 9 : 3 * (j - 1)) + 16 * (i >> 2);
}

static FP4S_HD int fp4s_e2m1_perm_sign(int i)
{
	const int j = i & 3;
	return (j == 3 ? 15 : 14 - j) + 16 * (i >> 2);
}

/* stored word -> permuted word */
static FP4S_HD uint32_t fp4s_e2m1_permute_word(uint32_t w)
{
	uint32_t r = 0;
	for (int i = 0; i < 8; i++) {
		const uint32_t c = (w >> (4 * i)) & 15u;
		r |= (c & 7u) << fp4s_e2m1_perm_mag(i);
		r |= (c >> 3) << fp4s_e2m1_perm_sign(i);
	}
	return r;
}

/* code i (0..7) of a permuted word */
static FP4S_HD uint32_t fp4s_e2m1_perm_code(uint32_t r, int i)
{
	return ((r >> fp4s_e2m1_perm_mag(i)) & 7u) | (((r >> fp4s_e2m1_perm_sign(i)) & 1u) << 3);
}

/* permuted word -> stored word (the decode paths that want codes in order) */
static FP4S_HD uint32_t fp4s_e2m1_unpermute_word(uint32_t r)
{
	uint32_t w = 0;
	for (int i = 0; i < 8; i++)
		w |= fp4s_e2m1_perm_code(r, i) << (4 * i);
	return w;
}

/* Pair k (0..3) of a permuted word: codes 3 - k (low half) and 7 - k (high half) as BF16 bits of
 * value * 2^-126.
 * Plain shifts, not rotations: no bit that a rotation would carry round lands under a mask, so
 * the values are the same, and a left shift can go to the GPU's multiply-add pipe (IMAD.SHL)
 * where a rotation is a funnel shift on the integer pipe. The decode GEMV's consumers are bound
 * by that integer pipe on the H200 (bench/results/2026-11-28-h200-session30.md). */
static FP4S_HD uint32_t fp4s_e2m1_perm_pair(uint32_t r, int k)
{
	if (k == 0)
		return r & 0x81C081C0u;
	if (k == 1)
		return (r << 3) & 0x81C081C0u;
	if (k == 2)
		return ((r << 2) & 0x80008000u) | ((r << 6) & 0x01C001C0u);
	return ((r << 1) & 0x80008000u) | ((r >> 3) & 0x01C001C0u);
}

#ifdef __cplusplus
}
#endif

#endif
