/* kv_fp8.cuh: the device side of the FP8 KV cache (FP4S_KV_FP8, backend.h): E4M3 (e4m3fn) with
 * scale 1.0. One place for the two conversions every FP8 KV kernel uses, so the write
 * (cuda_backend.cu), the split-K decode (attention.cu, attention_mma.cuh) and the flash prefill
 * (attention_prefill.cu) cannot drift apart.
 *
 * Encode: cuda_fp8.h's __NV_SATFINITE conversion (cvt.rn.satfinite.e4m3x2.f32 on sm_89 and
 * later): round to nearest even, |x| > 448 and +-Inf -> +-448, NaN -> 0x7F. That is the CPU's
 * fp4s_f32_to_e4m3 bit for bit; tests/ops/test_attention.cu checks it on all 2^32 floats.
 *
 * Decode to BF16 for the tensor cores, exactly: every finite E4M3 value is a normal FP16 or zero
 * (cvt.rn.f16x2.e4m3x2 makes two at once), has at most 4 significant bits and lies in
 * [2^-9, 448], so FP16 -> FP32 -> BF16 changes no value. 0x7F/0xFF stay NaN. */
#ifndef FP4S_KV_FP8_CUH
#define FP4S_KV_FP8_CUH

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

static __device__ __forceinline__ uint8_t fp4s_kv_e4m3(float x)
{
	return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

/* two E4M3 bytes (the first in bits 0-7) -> two BF16 in one register (the first in the low half) */
static __device__ __forceinline__ uint32_t fp4s_kv_e4m3x2_bf16x2(uint32_t two)
{
	const __half2 h = __half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xFFFFu), __NV_E4M3));
	const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(h));
	return (uint32_t)__bfloat16_as_ushort(b.x) | (uint32_t)__bfloat16_as_ushort(b.y) << 16;
}

/* one E4M3 byte -> float (exact) */
static __device__ __forceinline__ float fp4s_kv_e4m3_f32(uint8_t b)
{
	return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3)));
}

#endif
