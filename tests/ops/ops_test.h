/* ops_test.h: what the GPU op tests (tests/ops, label gpu) share beside tests/test_util.h; the
 * benchmarks in dev/ take CK from here too (dev/dev_util.h). */
#ifndef FP4S_OPS_TEST_H
#define FP4S_OPS_TEST_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

/* a CUDA call that must succeed: a failure ends the program with where and why */
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
