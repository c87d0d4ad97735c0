/* quant.cu: activation quantization kernels, BF16/FP16 rows -> packed E2M1 + block scales.
 *
 * One thread owns one scale block (16 elements for NVFP4, 32 for MXFP4): it loads the block with
 * 16-byte vector loads, takes max|x|, encodes the scale, and writes 8 (16) packed bytes plus one
 * scale byte. Neighbouring threads own neighbouring blocks, so a warp reads 1 KB (2 KB) of
 * contiguous input and writes contiguous output: the kernel is a single streaming pass.
 *
 * Bit-exactness with the CPU reference (numerics/quant.c) rests on two things: the element and
 * scale encoders are the shared ones from numerics.h, and every FP32 step is one IEEE operation
 * (__fmul_rn/__fdiv_rn/__frcp_rn, which nvcc never contracts into an FMA).
 *
 * E2M1 encoding has two implementations. The software one (integer compares, numerics.h) runs on
 * every GPU. The native cvt.rn.satfinite.e2m1x2.f32 exists only in family-specific Blackwell
 * targets (sm_100a/f, sm_120a/f, sm_121a/f); it is compiled only under the same guard cuda_fp8.h
 * uses, so the sm_80/sm_90a objects contain none of it (scripts/check-sass.sh verifies), and it is
 * chosen at run time from the device's compute capability.
 */
#include <cuda_fp16.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/quant_cuda.h"
#include "numerics/numerics.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && __CUDA_ARCH__ >= 1000
#define FP4S_NATIVE_E2M1 1
#endif

/* Two floats -> one byte, lo in the low nibble. */
template <bool NATIVE>
static __device__ __forceinline__ uint32_t e2m1x2(float lo, float hi)
{
#ifdef FP4S_NATIVE_E2M1
	if (NATIVE) {
		uint32_t out;
		/* The first source goes to the high nibble (PTX ISA; cuda_fp4.hpp does the same). */
		asm("{\n .reg .b8 t;\n cvt.rn.satfinite.e2m1x2.f32 t, %1, %2;\n cvt.u32.u8 %0, t;\n}"
		    : "=r"(out)
		    : "f"(hi), "f"(lo));
		return out;
	}
#endif
	return (uint32_t)fp4s_f32_to_e2m1(lo) | ((uint32_t)fp4s_f32_to_e2m1(hi) << 4);
}

template <bool IS_BF16>
static __device__ __forceinline__ float load_elem(uint32_t h)
{
	return IS_BF16 ? __uint_as_float(h << 16) : __half2float(__ushort_as_half((unsigned short)h));
}

/* Loads N consecutive 16-bit values as floats; VEC uses 16-byte loads (base 16-byte aligned). */
template <bool IS_BF16, bool VEC, int N>
static __device__ __forceinline__ void load_block(const uint16_t *p, float *v)
{
	if (VEC) {
#pragma unroll
		for (int j = 0; j < N / 8; j++) {
			uint4 w = __ldg(reinterpret_cast<const uint4 *>(p) + j);
			uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
			for (int i = 0; i < 4; i++) {
				v[8 * j + 2 * i] = load_elem<IS_BF16>(words[i] & 0xFFFFu);
				v[8 * j + 2 * i + 1] = load_elem<IS_BF16>(words[i] >> 16);
			}
		}
	} else {
#pragma unroll
		for (int i = 0; i < N; i++)
			v[i] = load_elem<IS_BF16>(__ldg(p + i));
	}
}

template <bool IS_BF16, bool VEC, bool NATIVE, bool SWIZZLE>
static __global__ void nvfp4_quant_kernel(const uint16_t *__restrict__ x, int64_t rows, int64_t nb,
                                          int64_t ldx, float gs, uint8_t *__restrict__ q,
                                          uint8_t *__restrict__ sf)
{
	const int64_t total = rows * nb;
	const float inv_gs = __frcp_rn(gs);
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
	     i += (int64_t)gridDim.x * blockDim.x) {
		/* a 64-bit division costs more than the block's encoding; contiguous rows skip it */
		int64_t r = 0, b = i;
		if (SWIZZLE || ldx != nb * 16) {
			r = i / nb;
			b = i - r * nb;
		}
		float v[16];
		load_block<IS_BF16, VEC, 16>(x + r * ldx + b * 16, v);
		float vmax = 0.0f;
#pragma unroll
		for (int j = 0; j < 16; j++)
			vmax = fmaxf(vmax, fabsf(v[j]));
		const uint8_t s = fp4s_f32_to_e4m3(__fmul_rn(gs, __fdiv_rn(vmax, 6.0f)));
		const float sv = fp4s_e4m3_to_f32(s);
		const float scale = sv != 0.0f ? __fdiv_rn(1.0f, __fmul_rn(sv, inv_gs)) : 0.0f;
		uint32_t packed[2];
#pragma unroll
		for (int w = 0; w < 2; w++) {
			uint32_t word = 0;
#pragma unroll
			for (int j = 0; j < 4; j++)
				word |= e2m1x2<NATIVE>(__fmul_rn(v[8 * w + 2 * j], scale),
				                       __fmul_rn(v[8 * w + 2 * j + 1], scale))
				        << (8 * j);
			packed[w] = word;
		}
		/* row r's packed bytes start at r*nb*8, so block i lands at byte 8*i: 8-byte aligned */
		reinterpret_cast<uint2 *>(q)[i] = make_uint2(packed[0], packed[1]);
		sf[SWIZZLE ? fp4s_sf_swizzled_offset(r, b, nb) : i] = s;
	}
}

template <bool IS_BF16, bool VEC, bool NATIVE, bool SWIZZLE>
static __global__ void mxfp4_quant_kernel(const uint16_t *__restrict__ x, int64_t rows, int64_t nb,
                                          int64_t ldx, uint8_t *__restrict__ q,
                                          uint8_t *__restrict__ sf)
{
	const int64_t total = rows * nb;
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
	     i += (int64_t)gridDim.x * blockDim.x) {
		/* a 64-bit division costs more than the block's encoding; contiguous rows skip it */
		int64_t r = 0, b = i;
		if (SWIZZLE || ldx != nb * 32) {
			r = i / nb;
			b = i - r * nb;
		}
		float v[32];
		load_block<IS_BF16, VEC, 32>(x + r * ldx + b * 32, v);
		float amax = 0.0f;
		bool nonfinite = false;
#pragma unroll
		for (int j = 0; j < 32; j++) {
			amax = fmaxf(amax, fabsf(v[j]));
			nonfinite |= !isfinite(v[j]);
		}
		const uint8_t e = nonfinite ? 0xFF : fp4s_mx_scale_floor(amax);
		const float inv = fp4s_pow2i(127 - (int)e);
		uint32_t packed[4];
#pragma unroll
		for (int w = 0; w < 4; w++) {
			uint32_t word = 0;
#pragma unroll
			for (int j = 0; j < 4; j++)
				word |= e2m1x2<NATIVE>(__fmul_rn(v[8 * w + 2 * j], inv),
				                       __fmul_rn(v[8 * w + 2 * j + 1], inv))
				        << (8 * j);
			packed[w] = word;
		}
		reinterpret_cast<uint4 *>(q)[i] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
		sf[SWIZZLE ? fp4s_sf_swizzled_offset(r, b, nb) : i] = e;
	}
}

/* Set by the probe kernel: 1 in code compiled for a target with the native FP4 cvt. */
static __global__ void native_probe_kernel(int *out)
{
#ifdef FP4S_NATIVE_E2M1
	*out = 1;
#else
	*out = 0;
#endif
}

extern "C" int fp4s_cuda_native_fp4_compiled(int *compiled, struct fp4s_error *err)
{
	int *d = nullptr, h = 0;
	FP4S_CUDA_TRY(err, cudaMalloc(&d, sizeof(int)));
	native_probe_kernel<<<1, 1>>>(d);
	cudaError_t e = cudaGetLastError();
	if (e == cudaSuccess)
		e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
	cudaFree(d);
	FP4S_CUDA_TRY(err, e);
	*compiled = h;
	return FP4S_OK;
}

extern "C" int fp4s_cuda_e2m1_resolve(enum fp4s_e2m1_impl want, enum fp4s_e2m1_impl *out,
                                      struct fp4s_error *err)
{
	if (want == FP4S_E2M1_SOFTWARE) {
		*out = want;
		return FP4S_OK;
	}
	/* The probe costs a launch and a sync, so its answer is kept per device (a benign race:
	 * every thread computes the same value). */
	static int cached[64] = {0}; /* 0 unknown, 1 software only, 2 native available */
	int dev = 0, major = 0, minor = 0, compiled = 0;
	FP4S_CUDA_TRY(err, cudaGetDevice(&dev));
	FP4S_CUDA_TRY(err, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
	FP4S_CUDA_TRY(err, cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
	if (dev < 64 && cached[dev]) {
		compiled = cached[dev] == 2;
	} else {
		int rc = fp4s_cuda_native_fp4_compiled(&compiled, err);
		if (rc)
			return rc;
		if (dev < 64)
			cached[dev] = compiled ? 2 : 1;
	}
	const bool hw = fp4s_fp4_path_for(major, minor) != FP4S_FP4_SOFTWARE;
	if (want == FP4S_E2M1_NATIVE && !(hw && compiled))
		return fp4s_error_set(err, FP4S_EUNSUPPORTED,
		                      "native E2M1 conversion unavailable on compute capability %d.%d "
		                      "(%s; this binary %s a family-specific cubin for it)",
		                      major, minor, hw ? "the hardware has it" : "no FP4 hardware",
		                      compiled ? "has" : "lacks");
	*out = (hw && compiled) ? FP4S_E2M1_NATIVE : FP4S_E2M1_SOFTWARE;
	return FP4S_OK;
}

static int grid_for(int64_t total, int threads)
{
	int64_t blocks = FP4S_CEIL_DIV(total, (int64_t)threads);
	/* grid-stride beyond ~64 waves of a 132-SM GPU: enough blocks to fill any device */
	return (int)(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

/* Instantiates KERNEL for the runtime flags (dtype, alignment, encoder, layout) and launches it. */
#define FP4S_QUANT_DISPATCH(KERNEL, GRID, THREADS, STREAM, ...)                                   \
	do {                                                                                       \
		const bool bf = dt == FP4S_ACT_BF16, nat = impl == FP4S_E2M1_NATIVE,               \
		           sw = layout == FP4S_SF_SWIZZLED_128X4;                                  \
		const int sel = (bf ? 8 : 0) | (vec ? 4 : 0) | (nat ? 2 : 0) | (sw ? 1 : 0);       \
		switch (sel) {                                                                     \
		case 0: KERNEL<false, false, false, false><<<GRID, THREADS, 0, STREAM>>>(__VA_ARGS__); break; \
		case 1: KERNEL<false, false, false, true><<<GRID, THREADS, 0, STREAM>>>(__VA_ARGS__); break; \
		case 2: KERNEL<false, false, true, false><<<GRID, THREADS, 0, STREAM>>>(__VA_ARGS__); break; \
		case 3: KERNEL<false, false, true, true><<<GRID, THREADS, 0, STREAM>>>(__VA_ARGS__); break; \
		case 4: KERNEL<false, true, false, false><<<GRID, THREADS, 0, STREAM>>>(__VA_ARGS__); break; \
		case 5: KERNEL<false, true, false, true><<<GRID, THREADS, 0, STREAM>>>(__VA_ARGS__); break; \
		case 6: KERNEL<false, true, true, false><<<GRID, THREADS, 0, STREAM>>>(__VA_ARGS__); break; \
		case 7: KERNEL<false, true, true, true><<<GRID, THREADS, 0, STREAM>>>(__VA_ARGS__); break; \
		case 8: KERNEL<true, false, false, false><<<GRID, THREADS, 0, STREAM>>>(__VA_ARGS__); break; \
		case 9: KERNEL<true, false, false, true><<<GRID, THREADS, 0, STREAM>>>(__VA_ARGS__); break; \
		case 10: KERNEL<true, false, true, false><<<GRID, THREADS, 0, STREAM>>>(__VA_ARGS__); break; \
		case 11: KERNEL<true, false, true, true><<<GRID, THREADS, 0, STREAM>>>(__VA_ARGS__); break; \
		case 12: KERNEL<true, true, false, false><<<GRID, THREADS, 0, STREAM>>>(__VA_ARGS__); break; \
		case 13: KERNEL<true, true, false, true><<<GRID, THREADS, 0, STREAM>>>(__VA_ARGS__); break; \
		case 14: KERNEL<true, true, true, false><<<GRID, THREADS, 0, STREAM>>>(__VA_ARGS__); break; \
		default: KERNEL<true, true, true, true><<<GRID, THREADS, 0, STREAM>>>(__VA_ARGS__); break; \
		}                                                                                  \
	} while (0)

static int check_args(const void *x, enum fp4s_act_dtype dt, int64_t rows, int64_t k, int64_t ldx,
                      int block, const uint8_t *q, const uint8_t *sf, struct fp4s_error *err)
{
	if (rows < 0 || k < 0)
		return fp4s_error_set(err, FP4S_EINVAL, "negative shape [%lld, %lld]", (long long)rows,
		                      (long long)k);
	if (k % block)
		return fp4s_error_set(err, FP4S_EINVAL,
		                      "K = %lld is not a multiple of the block size %d", (long long)k, block);
	if (ldx < k)
		return fp4s_error_set(err, FP4S_EINVAL, "row stride %lld is smaller than K = %lld",
		                      (long long)ldx, (long long)k);
	if (dt != FP4S_ACT_BF16 && dt != FP4S_ACT_F16)
		return fp4s_error_set(err, FP4S_EINVAL, "activation dtype %d is not BF16 or F16", (int)dt);
	if (rows * k > 0 && (!x || !q || !sf))
		return fp4s_error_set(err, FP4S_EINVAL, "null buffer");
	if (((uintptr_t)q) % 16)
		return fp4s_error_set(err, FP4S_EINVAL, "output buffer is not 16-byte aligned");
	return FP4S_OK;
}

extern "C" int fp4s_cuda_nvfp4_quantize_act(const void *x, enum fp4s_act_dtype dt, int64_t rows,
                                            int64_t k, int64_t ldx, float gs, uint8_t *q,
                                            uint8_t *sf, enum fp4s_sf_layout layout,
                                            enum fp4s_e2m1_impl impl, cudaStream_t stream,
                                            struct fp4s_error *err)
{
	int rc = check_args(x, dt, rows, k, ldx, 16, q, sf, err);
	if (rc)
		return rc;
	if (!(gs > 0.0f) || !isfinite(gs))
		return fp4s_error_set(err, FP4S_EINVAL, "global scale %g must be positive and finite",
		                      (double)gs);
	if ((rc = fp4s_cuda_e2m1_resolve(impl, &impl, err)))
		return rc;
	const int64_t nb = k / 16;
	if (layout == FP4S_SF_SWIZZLED_128X4)
		FP4S_CUDA_TRY(err, cudaMemsetAsync(sf, 0, fp4s_sf_bytes(rows, nb, layout), stream));
	if (rows * nb == 0)
		return FP4S_OK;
	const bool vec = ((uintptr_t)x % 16) == 0 && ldx % 8 == 0;
	const int threads = 256, grid = grid_for(rows * nb, threads);
	FP4S_QUANT_DISPATCH(nvfp4_quant_kernel, grid, threads, stream, (const uint16_t *)x, rows, nb,
	                    ldx, gs, q, sf);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

extern "C" int fp4s_cuda_mxfp4_quantize_act(const void *x, enum fp4s_act_dtype dt, int64_t rows,
                                            int64_t k, int64_t ldx, uint8_t *q, uint8_t *sf,
                                            enum fp4s_sf_layout layout, enum fp4s_e2m1_impl impl,
                                            cudaStream_t stream, struct fp4s_error *err)
{
	int rc = check_args(x, dt, rows, k, ldx, 32, q, sf, err);
	if (rc)
		return rc;
	if ((rc = fp4s_cuda_e2m1_resolve(impl, &impl, err)))
		return rc;
	const int64_t nb = k / 32;
	if (layout == FP4S_SF_SWIZZLED_128X4)
		FP4S_CUDA_TRY(err, cudaMemsetAsync(sf, 0, fp4s_sf_bytes(rows, nb, layout), stream));
	if (rows * nb == 0)
		return FP4S_OK;
	const bool vec = ((uintptr_t)x % 16) == 0 && ldx % 8 == 0;
	const int threads = 256, grid = grid_for(rows * nb, threads);
	FP4S_QUANT_DISPATCH(mxfp4_quant_kernel, grid, threads, stream, (const uint16_t *)x, rows, nb,
	                    ldx, q, sf);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}
