/* cuda_device.h: what the CUDA backend can tell C code about the GPUs and about this binary.
 * Available in every build: without CUDA the functions report that no backend was built. */
#ifndef FP4S_CUDA_DEVICE_H
#define FP4S_CUDA_DEVICE_H

#include <stddef.h>

#include "util/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How FP4 is handled on a device (formats.md §9-§10). Chosen from the compute capability, never
 * from __CUDA_ARCH__ == 1200-style equality (GB10 is 12.1). */
enum fp4s_fp4_path {
	FP4S_FP4_SOFTWARE = 0,   /* no FP4 hardware: E2M1 decoded/encoded in registers (SM80, SM90) */
	FP4S_FP4_NATIVE_SM100 = 1, /* 10.x/11.x: cvt e2m1x2 + tcgen05 block-scaled MMA */
	FP4S_FP4_NATIVE_SM120 = 2, /* 12.x (RTX 50xx, RTX PRO, GB10): cvt e2m1x2 + mma.sync block_scale */
};

struct fp4s_cuda_device_info {
	int index;
	char name[256];
	int cc_major, cc_minor;
	int sm_count;
	size_t mem_total, mem_free;
	size_t l2_bytes;
	int mem_bus_bits;
	int has_kernel_image;   /* this binary carries code that runs on it */
	enum fp4s_fp4_path fp4_path;   /* what the hardware offers */
	int native_fp4_compiled; /* the binary has the family-specific cubin that uses it */
};

/* 1 when this binary was built with the CUDA backend. */
int fp4s_cuda_built(void);
/* The CUDA architectures compiled in, e.g. "80 90a 100a 120a 121a"; "" without CUDA. */
const char *fp4s_cuda_archs(void);
/* Number of usable GPUs, 0 when there are none or no driver (the reason goes to err). */
int fp4s_cuda_device_count(struct fp4s_error *err);
int fp4s_cuda_device_query(int dev, struct fp4s_cuda_device_info *info, struct fp4s_error *err);
/* Device-to-device copy bandwidth of GPU dev in GB/s, counting bytes read plus written (the
 * roofline ceiling performance.md uses): median of timed 512 MiB copies after a warm-up. */
int fp4s_cuda_copy_bandwidth(int dev, double *gbs, struct fp4s_error *err);
enum fp4s_fp4_path fp4s_fp4_path_for(int cc_major, int cc_minor);
const char *fp4s_fp4_path_name(enum fp4s_fp4_path path);

#ifdef __cplusplus
}
#endif

#endif
