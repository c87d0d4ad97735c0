/* dev_util.h: what the kernel benchmarks in dev/ share. */
#ifndef FP4S_DEV_UTIL_H
#define FP4S_DEV_UTIL_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

/* a CUDA call that must succeed: a failure ends the benchmark with where and why */
#define CK(call)                                                                              \
	do {                                                                                  \
		cudaError_t e_ = (call);                                                      \
		if (e_ != cudaSuccess) {                                                      \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,         \
			        cudaGetErrorString(e_));                                      \
			exit(1);                                                              \
		}                                                                             \
	} while (0)

#endif
