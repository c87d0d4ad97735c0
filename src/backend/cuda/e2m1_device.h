/* e2m1_device.h: FP4 (E2M1) codes on the device are kept with the bits of each 32-bit word
 * permuted (numerics.h, fp4s_e2m1_permute_word), which makes the decode GEMVs' BF16 conversion
 * cheaper; every CUDA kernel reads them that way. Whatever copies codes to the device (the
 * backend's uploads, tests, benchmarks) permutes them there with this call. */
#ifndef FP4S_E2M1_DEVICE_H
#define FP4S_E2M1_DEVICE_H

#include <cuda_runtime.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Permutes the words of codes[0, bytes) in place, enqueued on s. codes 4-byte aligned, bytes a
 * multiple of 4 (rows of K % 8 == 0 codes are whole words); cudaErrorInvalidValue otherwise. */
cudaError_t fp4s_cuda_e2m1_permute(void *codes, size_t bytes, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
