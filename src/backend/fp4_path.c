/* fp4_path.c: the FP4 path rule, shared by CPU-only and CUDA builds (the report prints it). */
#include "backend/backend.h"
#include "backend/cuda/cuda_device.h"

enum fp4s_fp4_path fp4s_fp4_path_for(int cc_major, int cc_minor)
{
	(void)cc_minor;
	if (cc_major == 10 || cc_major == 11)
		return FP4S_FP4_NATIVE_SM100;
	if (cc_major == 12)
		return FP4S_FP4_NATIVE_SM120;
	return FP4S_FP4_SOFTWARE;
}

const char *fp4s_fp4_path_name(enum fp4s_fp4_path path)
{
	switch (path) {
	case FP4S_FP4_NATIVE_SM100: return "native FP4 (cvt e2m1x2, tcgen05 block-scaled MMA)";
	case FP4S_FP4_NATIVE_SM120: return "native FP4 (cvt e2m1x2, mma.sync block_scale)";
	default: return "software E2M1 (FP4 decoded in registers, BF16 tensor cores)";
	}
}

#ifndef FP4S_HAVE_CUDA
int fp4s_cuda_built(void) { return 0; }
const char *fp4s_cuda_archs(void) { return ""; }
int fp4s_cuda_device_count(struct fp4s_error *err)
{
	fp4s_error_set(err, FP4S_ENODEV, "this build has no CUDA backend (nvcc was not found)");
	return 0;
}
int fp4s_cuda_device_query(int dev, struct fp4s_cuda_device_info *info, struct fp4s_error *err)
{
	(void)info;
	return fp4s_error_set(err, FP4S_ENODEV, "device %d: this build has no CUDA backend", dev);
}
int fp4s_cuda_copy_bandwidth(int dev, double *gbs, struct fp4s_error *err)
{
	(void)gbs;
	return fp4s_error_set(err, FP4S_ENODEV, "device %d: this build has no CUDA backend", dev);
}

int fp4s_backend_cuda_create(int dev, struct fp4s_backend **out, struct fp4s_error *err)
{
	(void)out;
	return fp4s_error_set(err, FP4S_ENODEV, "device %d: this build has no CUDA backend (nvcc was "
	                      "not found when it was configured)", dev);
}
#endif
