/* quant.h: NVFP4 and MXFP4 block quantization and dequantization on the CPU. These are the
 * reference every GPU kernel is checked against, and what `fp4serve quantize`/`gen` write.
 *
 * Layouts (the checkpoint layouts of formats.md §4-§6): a row-major [rows, k] matrix quantizes to
 *   q  [rows, k/2]   packed E2M1, element 2i in the low nibble of byte i;
 *   sf [rows, k/16]  E4M3 block scales (NVFP4), or [rows, k/32] E8M0 (MXFP4), linear row-major,
 *                    unless a swizzled layout is asked for (activations feeding native Blackwell MMA).
 * k must be a multiple of the block size: anything else is rejected with FP4S_EINVAL.
 */
#ifndef FP4S_QUANT_H
#define FP4S_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "util/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum fp4s_act_dtype { FP4S_ACT_BF16 = 0, FP4S_ACT_F16 = 1 };

enum fp4s_sf_layout {
	FP4S_SF_LINEAR = 0,       /* [rows, cols] row-major, as checkpoints store them */
	FP4S_SF_SWIZZLED_128X4 = 1, /* formats.md §8; rows padded to 128, cols to 4, padding zeroed */
};

/* Bytes of a block-scale buffer for rows x cols scales in the given layout. */
size_t fp4s_sf_bytes(int64_t rows, int64_t cols, enum fp4s_sf_layout layout);

/* ---- weights (offline: quantize, gen) ---- */

/* ModelOpt per-tensor scale weight_scale_2 = amax(|x|) / 2688 over n values (FP32 division).
 * Returns 1.0 for an all-zero tensor (every block then stores code 0 with scale 1.0); a NaN or
 * Inf anywhere is an error. */
int fp4s_nvfp4_tensor_scale(const float *x, size_t n, float *ws2, struct fp4s_error *err);

/* ModelOpt NVFP4 weight quantization with a given ws2 (which lets fused siblings share one):
 *   s = e4m3(block_amax / (6 * ws2)), 0 -> 1.0;  q = e2m1(x / (fp32(s) * ws2)).
 * Dequantize: w = e2m1(q) * fp32(s) * ws2. */
int fp4s_nvfp4_quantize(const float *x, int64_t rows, int64_t k, float ws2, uint8_t *q,
                        uint8_t *sf, struct fp4s_error *err);
int fp4s_nvfp4_dequantize(const uint8_t *q, const uint8_t *sf, float ws2, int64_t rows,
                          int64_t k, float *out, struct fp4s_error *err);

/* MXFP4 (OCP floor rule, gpt-oss layout): e = floor(log2(block_amax)) - 2 + 127 (0 for a zero
 * block; 0xFF for a block holding NaN/Inf), q = e2m1(x * 2^(127-e)) saturating at +-6.
 * Dequantize: w = e2m1(q) * 2^(e-127); a 0xFF scale is rejected as malformed. */
int fp4s_mxfp4_quantize(const float *x, int64_t rows, int64_t k, uint8_t *q, uint8_t *sf,
                        struct fp4s_error *err);
int fp4s_mxfp4_dequantize(const uint8_t *q, const uint8_t *sf, int64_t rows, int64_t k,
                          float *out, struct fp4s_error *err);

/* ---- activations (run time; the CUDA kernels in backend/cuda/quant.cu must match bit for bit) ----
 * x is [rows, k] of BF16 or FP16 with row stride ldx elements. NVFP4, per 16-block, with
 * gs = the quant-direction global scale (1/input_scale, 2688/amax):
 *   vmax = max|x|;  sf = e4m3(gs * (vmax / 6));
 *   scale = sf != 0 ? 1 / (fp32(sf) * (1 / gs)) : 0;  q = e2m1(x * scale)
 * every operation a single IEEE FP32 operation (no FMA), so host and device agree exactly.
 * MXFP4: the MXFP4 weight rule above on the activation block. */
int fp4s_nvfp4_quantize_act(const uint16_t *x, enum fp4s_act_dtype dt, int64_t rows, int64_t k,
                            int64_t ldx, float gs, uint8_t *q, uint8_t *sf,
                            enum fp4s_sf_layout layout, struct fp4s_error *err);
int fp4s_mxfp4_quantize_act(const uint16_t *x, enum fp4s_act_dtype dt, int64_t rows, int64_t k,
                            int64_t ldx, uint8_t *q, uint8_t *sf, enum fp4s_sf_layout layout,
                            struct fp4s_error *err);

/* Checks block scales as loaded from a checkpoint: E4M3 bytes with the sign bit set or NaN
 * (0x7F/0xFF); E8M0 bytes 0xFF (NaN) and, with strict set, 253/254 (large elements overflow).
 * On the first bad byte returns FP4S_EFORMAT and puts its index in *bad_index. */
int fp4s_check_e4m3_scales(const uint8_t *sf, size_t n, size_t *bad_index);
int fp4s_check_e8m0_scales(const uint8_t *sf, size_t n, int strict, size_t *bad_index);

#ifdef __cplusplus
}
#endif

#endif
