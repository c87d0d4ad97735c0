/* cuda_common.h: error checking for CUDA calls in host glue. A failed call becomes an
 * FP4S_ECUDA status whose message names the statement, the CUDA error and the place; launches
 * are followed by FP4S_CUDA_TRY(err, cudaGetLastError()). */
#ifndef FP4S_CUDA_COMMON_H
#define FP4S_CUDA_COMMON_H

#include <cuda_runtime.h>

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

#endif
