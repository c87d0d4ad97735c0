/* dev_util.h: what the kernel benchmarks in dev/ share: CK, the GPU op tests' check of a CUDA
 * call (one definition, tests/ops/ops_test.h). */
#ifndef FP4S_DEV_UTIL_H
#define FP4S_DEV_UTIL_H

#include "../tests/ops/ops_test.h"

#endif
