/* cuda_common.h: error checking for CUDA calls in host glue. A failed call becomes an
 * FP4S_ECUDA status whose message names the statement, the CUDA error and the place; launches
 * are followed by FP4S_CUDA_TRY(err, cudaGetLastError()). */
#ifndef FP4S_CUDA_COMMON_H
#define FP4S_CUDA_COMMON_H

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "util/status.h"

#define FP4S_CUDA_TRY(err, call)                                                              \
	do {                                                                                  \
		cudaError_t e_ = (call);                                                      \
		if (e_ != cudaSuccess)                                                        \
			return fp4s_error_set((err), FP4S_ECUDA, "%s failed: %s (%s) at %s:%d", #call, \
			                      cudaGetErrorName(e_), cudaGetErrorString(e_), __FILE__,  \
			                      __LINE__);                                      \
	} while (0)

#define FP4S_CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

/* Diagnostics, in builds with -DFP4S_DIAG_CLONE only: FP4S_DIAG_CLONE's bits pick launches that
 * run a second copy of their kernel's code (same instructions, other addresses), so they find
 * none of it in the SM's instruction caches: 1 expert GEMVs, 2 single matrices added into y,
 * 4 single matrices on normalized x, 8 decode attention, 16 the router (what a launch whose code
 * is not cached costs: bench/results/2026-11-22-h100-session13.md). 0 elsewhere. */
static inline int fp4s_diag_clone(int bit)
{
#ifdef FP4S_DIAG_CLONE
	static int v = -1;
	if (v < 0) {
		const char *e = getenv("FP4S_DIAG_CLONE");
		v = e ? atoi(e) & 31 : 0;
	}
	return v & bit;
#else
	(void)bit;
	return 0;
#endif
}

/* 1 when the environment variable `name` is "0" (the diagnostic switches that turn a fusion or a
 * kernel variant off for A/B), read once into *cache (-1 before) */
static inline int fp4s_env_off(const char *name, int *cache)
{
	if (*cache < 0) {
		const char *e = getenv(name);
		*cache = e && strcmp(e, "0") == 0;
	}
	return *cache;
}

/* Diagnostics (A/B): a kernel's preferred shared-memory carveout, in percent of the SM's 256 KB
 * (cudaFuncAttributePreferredSharedMemoryCarveout) from the environment variable name, 0-100;
 * unset or out of range: the driver's choice, nothing set. The split the SM runs a kernel with
 * decides its L1 (bench/results/2026-11-27-h100-session28.md). */
static inline cudaError_t fp4s_env_carveout(const void *fn, const char *name)
{
	const char *e = getenv(name);
	if (!e || !*e || atoi(e) < 0 || atoi(e) > 100)
		return cudaSuccess;
	return cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, atoi(e));
}

#endif
