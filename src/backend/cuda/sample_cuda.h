/* sample_cuda.h: the device sampler's kernel alone (sample.cu), for dev/sample_bench; the engine
 * reaches it through backend.h's sample. */
#ifndef FP4S_SAMPLE_CUDA_H
#define FP4S_SAMPLE_CUDA_H

#include <cuda_runtime.h>
#include <stdint.h>

struct fp4s_samp_row;
struct fp4s_samp_edit;
struct fp4s_samp_result;

/* a cluster (or one block) a row of logits [n, vocab] (overwritten, but rows with logprobs:
 * those sample in d_work[slot - slot0], vocab floats each, and write d_res[slot]); rows, edits,
 * out, work and res on the device */
cudaError_t fp4s_cuda_sample_launch(float *logits, int32_t n, int32_t vocab, const struct fp4s_samp_row *d_rows,
                                    const struct fp4s_samp_edit *d_edits, int32_t *d_out, float *d_work, int32_t slot0,
                                    struct fp4s_samp_result *d_res, cudaStream_t s);

#endif
