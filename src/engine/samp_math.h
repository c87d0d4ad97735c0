/* samp_math.h: the arithmetic the sampler does the same way on the CPU (sampler.c) and on a GPU
 * (backend/cuda/sample.cu), so that one sequence draws the same token on either for the same
 * random number. Included by C11 and by CUDA; every operation is one IEEE-rounded step written
 * out (no fused multiply-add anywhere), because nvcc contracts a * b + c by default and the
 * host build does not (-ffp-contract=off).
 *
 * - fp4s_samp_exp: e^x for the x <= 0 the sampler needs (w = exp(l / T - max)). Cody-Waite
 *   reduction by ln 2 and a degree-7 polynomial: within a few ulp of expf, exactly 1 at 0 (the most
 *   likely token has w = 1), and 0 below 2^-125 so that no subnormal is ever produced (a GPU
 *   built with flush-to-zero and a CPU would otherwise disagree there).
 * - Probability mass in fixed point: fp4s_samp_fix(w) = floor(w * 2^44) as a 64-bit integer.
 *   Sums of those are exact in any order (V * 2^44 < 2^62 for V < 2^18), so the top_p crossing
 *   and the draw's cumulative scan do not depend on how a GPU block splits the vocabulary.
 *   Tokens below 2^-44 of the most likely one carry no mass: they can be ranked but never drawn.
 */
#ifndef FP4S_SAMP_MATH_H
#define FP4S_SAMP_MATH_H

#include <stdint.h>

#include "numerics/numerics.h" /* FP4S_HD, fp4s_pow2i */

#define FP4S_SAMP_HD static FP4S_HD
#define FP4S_SAMP_MAX_VOCAB (1 << 18) /* fixed-point sums of w <= 1 stay below 2^62 */

FP4S_SAMP_HD float fp4s_samp_mul(float a, float b)
{
#if defined(__CUDA_ARCH__)
	return __fmul_rn(a, b);
#else
	return a * b;
#endif
}

FP4S_SAMP_HD float fp4s_samp_sub(float a, float b)
{
#if defined(__CUDA_ARCH__)
	return __fsub_rn(a, b);
#else
	return a - b;
#endif
}

FP4S_SAMP_HD float fp4s_samp_add(float a, float b)
{
#if defined(__CUDA_ARCH__)
	return __fadd_rn(a, b);
#else
	return a + b;
#endif
}

/* e^x for x <= 0 (x > 0 is clamped to 1: the caller subtracts the maximum first); NaN stays NaN */
FP4S_SAMP_HD float fp4s_samp_exp(float x)
{
	if (x != x)
		return x;
	if (!(x < 0.0f))
		return 1.0f;
	if (x < -87.0f) /* e^-87 < 2^-125 */
		return 0.0f;
	/* n = round(x / ln 2) (adding and taking away 1.5 * 2^23 rounds to an integer, ties to even);
	 * r = x - n ln 2 in two steps (ln 2 = hi + lo, hi with 9 trailing zero bits, so n * hi and
	 * x - n * hi are exact) */
	const float n = fp4s_samp_sub(fp4s_samp_add(fp4s_samp_mul(x, 1.44269502f), 12582912.0f), 12582912.0f);
	float r = fp4s_samp_sub(x, fp4s_samp_mul(n, 0.693145751953125f));
	r = fp4s_samp_sub(r, fp4s_samp_mul(n, 1.42860677e-06f));
	/* e^r on |r| <= ln 2 / 2: Taylor to degree 7 (truncation < 6e-9 relative), Horner's steps
	 * each rounded (no fused multiply-add: the host's would be a library call) */
	float p = 1.98412698e-04f;
	p = fp4s_samp_add(fp4s_samp_mul(p, r), 1.38888889e-03f);
	p = fp4s_samp_add(fp4s_samp_mul(p, r), 8.33333333e-03f);
	p = fp4s_samp_add(fp4s_samp_mul(p, r), 4.16666667e-02f);
	p = fp4s_samp_add(fp4s_samp_mul(p, r), 1.66666667e-01f);
	p = fp4s_samp_add(fp4s_samp_mul(p, r), 0.5f);
	p = fp4s_samp_add(fp4s_samp_mul(p, r), 1.0f);
	p = fp4s_samp_add(fp4s_samp_mul(p, r), 1.0f);
	const int32_t e = (int32_t)n; /* in [-126, 0] */
	if (e < -125)
		return 0.0f;
	return fp4s_samp_mul(p, fp4s_pow2i(e));
}

/* w in [0, 1] as mass: floor(w * 2^44) */
FP4S_SAMP_HD uint64_t fp4s_samp_fix(float w)
{
	const float s = fp4s_samp_mul(w, 17592186044416.0f); /* exact: a power of two */
#if defined(__CUDA_ARCH__)
	return __float2ull_rz(s);
#else
	return (uint64_t)s;
#endif
}

/* the draw: the point u in [0, 1) of the kept mass total (> 0), below total */
FP4S_SAMP_HD uint64_t fp4s_samp_point(double u, uint64_t total)
{
#if defined(__CUDA_ARCH__)
	uint64_t x = __double2ull_rz(__dmul_rn(u, __ull2double_rn(total)));
#else
	uint64_t x = (uint64_t)(u * (double)total);
#endif
	return x < total ? x : total - 1;
}

/* top_p: a token is kept while the mass ranked strictly above it is below top_p of the total */
FP4S_SAMP_HD double fp4s_samp_target(float top_p, uint64_t total)
{
#if defined(__CUDA_ARCH__)
	return __dmul_rn((double)top_p, __ull2double_rn(total));
#else
	return (double)top_p * (double)total;
#endif
}

FP4S_SAMP_HD int fp4s_samp_below(uint64_t above, double target)
{
#if defined(__CUDA_ARCH__)
	return __ull2double_rn(above) < target;
#else
	return (double)above < target;
#endif
}

#endif
