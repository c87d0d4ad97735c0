/* quant.c: CPU reference block quantizers (see quant.h for the formulas and layouts). */
#include "numerics/quant.h"

#include <math.h>
#include <string.h>

#include "numerics/numerics.h"

static int check_shape(int64_t rows, int64_t k, int block, struct fp4s_error *err)
{
	if (rows < 0 || k < 0)
		return fp4s_error_set(err, FP4S_EINVAL, "negative shape [%lld, %lld]", (long long)rows,
		                      (long long)k);
	if (k % block != 0)
		return fp4s_error_set(err, FP4S_EINVAL,
		                      "K = %lld is not a multiple of the block size %d", (long long)k, block);
	return FP4S_OK;
}

size_t fp4s_sf_bytes(int64_t rows, int64_t cols, enum fp4s_sf_layout layout)
{
	if (layout == FP4S_SF_SWIZZLED_128X4)
		return (size_t)((rows + 127) / 128 * 128) * (size_t)((cols + 3) / 4 * 4);
	return (size_t)rows * (size_t)cols;
}

static int64_t sf_index(int64_t r, int64_t c, int64_t cols, enum fp4s_sf_layout layout)
{
	return layout == FP4S_SF_SWIZZLED_128X4 ? fp4s_sf_swizzled_offset(r, c, cols) : r * cols + c;
}

int fp4s_nvfp4_tensor_scale(const float *x, size_t n, float *ws2, struct fp4s_error *err)
{
	float amax = 0.0f;
	for (size_t i = 0; i < n; i++) {
		if (!isfinite(x[i]))
			return fp4s_error_set(err, FP4S_EINVAL, "non-finite value %g at index %zu",
			                      (double)x[i], i);
		amax = fmaxf(amax, fabsf(x[i]));
	}
	*ws2 = amax > 0.0f ? amax / FP4S_NVFP4_GLOBAL_DENOM : 1.0f;
	return FP4S_OK;
}

int fp4s_nvfp4_quantize(const float *x, int64_t rows, int64_t k, float ws2, uint8_t *q,
                        uint8_t *sf, struct fp4s_error *err)
{
	int rc = check_shape(rows, k, FP4S_NVFP4_BLOCK, err);
	if (rc)
		return rc;
	if (!(ws2 > 0.0f) || !isfinite(ws2))
		return fp4s_error_set(err, FP4S_EINVAL, "per-tensor scale %g must be positive and finite",
		                      (double)ws2);
	const float denom = 6.0f * ws2;
	const int64_t nb = k / FP4S_NVFP4_BLOCK;
#pragma omp parallel for schedule(static) if (rows * k > (1 << 16))
	for (int64_t r = 0; r < rows; r++) {
		for (int64_t b = 0; b < nb; b++) {
			const float *v = x + r * k + b * FP4S_NVFP4_BLOCK;
			float amax = 0.0f;
			for (int i = 0; i < FP4S_NVFP4_BLOCK; i++)
				amax = fmaxf(amax, fabsf(v[i]));
			/* A zero block keeps scale 1.0 (ModelOpt). A nonzero block whose scale rounds to
			 * E4M3 zero would divide by zero; it also takes 1.0 and its elements round to 0. */
			uint8_t s = fp4s_f32_to_e4m3(amax / denom);
			if ((s & 0x7F) == 0)
				s = 0x38;
			sf[r * nb + b] = s;
			const float div = fp4s_e4m3_to_f32(s) * ws2;
			uint8_t *out = q + (r * k + b * FP4S_NVFP4_BLOCK) / 2;
			for (int i = 0; i < FP4S_NVFP4_BLOCK; i += 2)
				out[i / 2] = (uint8_t)(fp4s_f32_to_e2m1(v[i] / div) |
				                       (fp4s_f32_to_e2m1(v[i + 1] / div) << 4));
		}
	}
	return FP4S_OK;
}

int fp4s_nvfp4_dequantize(const uint8_t *q, const uint8_t *sf, float ws2, int64_t rows,
                          int64_t k, float *out, struct fp4s_error *err)
{
	int rc = check_shape(rows, k, FP4S_NVFP4_BLOCK, err);
	if (rc)
		return rc;
	const int64_t nb = k / FP4S_NVFP4_BLOCK;
	for (int64_t r = 0; r < rows; r++) {
		const uint8_t *row = q + r * (k / 2);
		for (int64_t i = 0; i < k; i++) {
			float s = fp4s_e4m3_to_f32(sf[r * nb + i / FP4S_NVFP4_BLOCK]);
			/* (e2m1 * s) is exact in FP32; ws2 is applied last, as kernels do in the epilogue */
			out[r * k + i] = fp4s_e2m1_to_f32(fp4s_fp4_get(row, i)) * s * ws2;
		}
	}
	return FP4S_OK;
}

/* Quantizes one MXFP4 block of 32 values already converted to float. */
static void mxfp4_block(const float *v, uint8_t *q, uint8_t *scale)
{
	float amax = 0.0f;
	int nonfinite = 0;
	for (int i = 0; i < FP4S_MXFP4_BLOCK; i++) {
		amax = fmaxf(amax, fabsf(v[i]));
		nonfinite |= !isfinite(v[i]);
	}
	uint8_t e = nonfinite ? 0xFF : fp4s_mx_scale_floor(amax);
	/* x * 2^(127-e) is x / 2^(e-127) exactly (a power of two); e = 0xFF uses 2^-128. */
	const float inv = fp4s_pow2i(127 - (int)e);
	*scale = e;
	for (int i = 0; i < FP4S_MXFP4_BLOCK; i += 2)
		q[i / 2] = (uint8_t)(fp4s_f32_to_e2m1(v[i] * inv) | (fp4s_f32_to_e2m1(v[i + 1] * inv) << 4));
}

int fp4s_mxfp4_quantize(const float *x, int64_t rows, int64_t k, uint8_t *q, uint8_t *sf,
                        struct fp4s_error *err)
{
	int rc = check_shape(rows, k, FP4S_MXFP4_BLOCK, err);
	if (rc)
		return rc;
	const int64_t nb = k / FP4S_MXFP4_BLOCK;
#pragma omp parallel for schedule(static) if (rows * k > (1 << 16))
	for (int64_t r = 0; r < rows; r++)
		for (int64_t b = 0; b < nb; b++)
			mxfp4_block(x + r * k + b * FP4S_MXFP4_BLOCK, q + (r * k + b * FP4S_MXFP4_BLOCK) / 2,
			            &sf[r * nb + b]);
	return FP4S_OK;
}

int fp4s_mxfp4_dequantize(const uint8_t *q, const uint8_t *sf, int64_t rows, int64_t k,
                          float *out, struct fp4s_error *err)
{
	int rc = check_shape(rows, k, FP4S_MXFP4_BLOCK, err);
	if (rc)
		return rc;
	const int64_t nb = k / FP4S_MXFP4_BLOCK;
	size_t bad;
	if (fp4s_check_e8m0_scales(sf, (size_t)(rows * nb), 0, &bad))
		return fp4s_error_set(err, FP4S_EFORMAT,
		                      "E8M0 scale at index %zu (row %lld, block %lld) is 0xFF (NaN)", bad,
		                      (long long)(bad / (size_t)(nb ? nb : 1)),
		                      (long long)(bad % (size_t)(nb ? nb : 1)));
	for (int64_t r = 0; r < rows; r++) {
		const uint8_t *row = q + r * (k / 2);
		for (int64_t i = 0; i < k; i++)
			out[r * k + i] = fp4s_e2m1_to_f32(fp4s_fp4_get(row, i)) *
			                 fp4s_e8m0_to_f32(sf[r * nb + i / FP4S_MXFP4_BLOCK]);
	}
	return FP4S_OK;
}

static inline float act_load(const uint16_t *x, enum fp4s_act_dtype dt, int64_t i)
{
	return dt == FP4S_ACT_BF16 ? fp4s_bf16_to_f32(x[i]) : fp4s_f16_to_f32(x[i]);
}

static int check_act(enum fp4s_act_dtype dt, int64_t rows, int64_t k, int64_t ldx, int block,
                     struct fp4s_error *err)
{
	int rc = check_shape(rows, k, block, err);
	if (rc)
		return rc;
	if (dt != FP4S_ACT_BF16 && dt != FP4S_ACT_F16)
		return fp4s_error_set(err, FP4S_EINVAL, "activation dtype %d is not BF16 or F16", (int)dt);
	if (ldx < k)
		return fp4s_error_set(err, FP4S_EINVAL, "row stride %lld is smaller than K = %lld",
		                      (long long)ldx, (long long)k);
	return FP4S_OK;
}

int fp4s_nvfp4_quantize_act(const uint16_t *x, enum fp4s_act_dtype dt, int64_t rows, int64_t k,
                            int64_t ldx, float gs, uint8_t *q, uint8_t *sf,
                            enum fp4s_sf_layout layout, struct fp4s_error *err)
{
	int rc = check_act(dt, rows, k, ldx, FP4S_NVFP4_BLOCK, err);
	if (rc)
		return rc;
	const int64_t nb = k / FP4S_NVFP4_BLOCK;
	const float inv_gs = 1.0f / gs;
	if (layout == FP4S_SF_SWIZZLED_128X4)
		memset(sf, 0, fp4s_sf_bytes(rows, nb, layout));
#pragma omp parallel for schedule(static) if (rows * k > (1 << 16))
	for (int64_t r = 0; r < rows; r++) {
		for (int64_t b = 0; b < nb; b++) {
			float v[FP4S_NVFP4_BLOCK], vmax = 0.0f;
			for (int i = 0; i < FP4S_NVFP4_BLOCK; i++) {
				v[i] = act_load(x, dt, r * ldx + b * FP4S_NVFP4_BLOCK + i);
				vmax = fmaxf(vmax, fabsf(v[i]));
			}
			uint8_t s = fp4s_f32_to_e4m3(gs * (vmax / 6.0f));
			float sv = fp4s_e4m3_to_f32(s);
			float scale = sv != 0.0f ? 1.0f / (sv * inv_gs) : 0.0f;
			sf[sf_index(r, b, nb, layout)] = s;
			uint8_t *out = q + r * (k / 2) + b * (FP4S_NVFP4_BLOCK / 2);
			for (int i = 0; i < FP4S_NVFP4_BLOCK; i += 2)
				out[i / 2] = (uint8_t)(fp4s_f32_to_e2m1(v[i] * scale) |
				                       (fp4s_f32_to_e2m1(v[i + 1] * scale) << 4));
		}
	}
	return FP4S_OK;
}

int fp4s_mxfp4_quantize_act(const uint16_t *x, enum fp4s_act_dtype dt, int64_t rows, int64_t k,
                            int64_t ldx, uint8_t *q, uint8_t *sf, enum fp4s_sf_layout layout,
                            struct fp4s_error *err)
{
	int rc = check_act(dt, rows, k, ldx, FP4S_MXFP4_BLOCK, err);
	if (rc)
		return rc;
	const int64_t nb = k / FP4S_MXFP4_BLOCK;
	if (layout == FP4S_SF_SWIZZLED_128X4)
		memset(sf, 0, fp4s_sf_bytes(rows, nb, layout));
#pragma omp parallel for schedule(static) if (rows * k > (1 << 16))
	for (int64_t r = 0; r < rows; r++) {
		for (int64_t b = 0; b < nb; b++) {
			float v[FP4S_MXFP4_BLOCK];
			for (int i = 0; i < FP4S_MXFP4_BLOCK; i++)
				v[i] = act_load(x, dt, r * ldx + b * FP4S_MXFP4_BLOCK + i);
			mxfp4_block(v, q + r * (k / 2) + b * (FP4S_MXFP4_BLOCK / 2), &sf[sf_index(r, b, nb, layout)]);
		}
	}
	return FP4S_OK;
}

int fp4s_check_e4m3_scales(const uint8_t *sf, size_t n, size_t *bad_index)
{
	for (size_t i = 0; i < n; i++) {
		if ((sf[i] & 0x80) || sf[i] == 0x7F) {
			*bad_index = i;
			return FP4S_EFORMAT;
		}
	}
	return FP4S_OK;
}

int fp4s_check_e8m0_scales(const uint8_t *sf, size_t n, int strict, size_t *bad_index)
{
	const uint8_t limit = strict ? 253 : 255;
	for (size_t i = 0; i < n; i++) {
		if (sf[i] >= limit) {
			*bad_index = i;
			return FP4S_EFORMAT;
		}
	}
	return FP4S_OK;
}
