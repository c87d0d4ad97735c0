/* quant_cuda.h: activation quantization on the GPU (BF16/FP16 rows -> packed FP4 + block
 * scales). Bit-identical to fp4s_nvfp4_quantize_act / fp4s_mxfp4_quantize_act in
 * numerics/quant.h, which define the formulas. All pointers are device pointers. */
#ifndef FP4S_QUANT_CUDA_H
#define FP4S_QUANT_CUDA_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "numerics/quant.h"
#include "util/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which E2M1 encoder the kernel uses. AUTO takes the native cvt.rn.satfinite.e2m1x2 where the
 * current device has it and this binary carries its family-specific cubin, else software. */
enum fp4s_e2m1_impl { FP4S_E2M1_AUTO = -1, FP4S_E2M1_SOFTWARE = 0, FP4S_E2M1_NATIVE = 1 };

int fp4s_cuda_nvfp4_quantize_act(const void *x, enum fp4s_act_dtype dt, int64_t rows, int64_t k,
                                 int64_t ldx, float gs, uint8_t *q, uint8_t *sf,
                                 enum fp4s_sf_layout layout, enum fp4s_e2m1_impl impl,
                                 cudaStream_t stream, struct fp4s_error *err);
int fp4s_cuda_mxfp4_quantize_act(const void *x, enum fp4s_act_dtype dt, int64_t rows, int64_t k,
                                 int64_t ldx, uint8_t *q, uint8_t *sf, enum fp4s_sf_layout layout,
                                 enum fp4s_e2m1_impl impl, cudaStream_t stream,
                                 struct fp4s_error *err);

/* Resolves AUTO for the current device; NATIVE on a device or build without it is an error. */
int fp4s_cuda_e2m1_resolve(enum fp4s_e2m1_impl want, enum fp4s_e2m1_impl *out,
                           struct fp4s_error *err);

#ifdef __cplusplus
}
#endif

#endif
