/* device.cu: GPU discovery for the build/device report and for backend start-up. */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.h"

extern "C" int fp4s_cuda_native_fp4_compiled(int *compiled, struct fp4s_error *err);

static __global__ void image_probe_kernel(void) {}

extern "C" int fp4s_cuda_built(void) { return 1; }

extern "C" const char *fp4s_cuda_archs(void) { return FP4S_CUDA_ARCHS; }

extern "C" int fp4s_cuda_device_count(struct fp4s_error *err)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		fp4s_error_set(err, FP4S_ENODEV, "no CUDA device: %s (%s)", cudaGetErrorName(e),
		               cudaGetErrorString(e));
		cudaGetLastError(); /* clear the sticky-free error so later calls start clean */
		return 0;
	}
	return n;
}

extern "C" int fp4s_cuda_device_query(int dev, struct fp4s_cuda_device_info *info,
                                      struct fp4s_error *err)
{
	cudaDeviceProp p;
	memset(info, 0, sizeof *info);
	FP4S_CUDA_TRY(err, cudaGetDeviceProperties(&p, dev));
	info->index = dev;
	snprintf(info->name, sizeof info->name, "%s", p.name);
	info->cc_major = p.major;
	info->cc_minor = p.minor;
	info->sm_count = p.multiProcessorCount;
	info->mem_total = p.totalGlobalMem;
	info->l2_bytes = (size_t)p.l2CacheSize;
	info->mem_bus_bits = p.memoryBusWidth;
	info->fp4_path = fp4s_fp4_path_for(p.major, p.minor);
	FP4S_CUDA_TRY(err, cudaSetDevice(dev));
	size_t free_b = 0, total_b = 0;
	if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
		info->mem_free = free_b;
	cudaFuncAttributes attr;
	cudaError_t e = cudaFuncGetAttributes(&attr, image_probe_kernel);
	if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction) {
		cudaGetLastError();
		info->has_kernel_image = 0;
		return FP4S_OK;
	}
	FP4S_CUDA_TRY(err, e);
	info->has_kernel_image = 1;
	return fp4s_cuda_native_fp4_compiled(&info->native_fp4_compiled, err);
}
