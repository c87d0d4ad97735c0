/* pdl.cuh: programmatic dependent launch (PDL, compute capability 9.0 and later).
 *
 * Why. A decode step is a chain of ~200 short kernels (llama3-8b: 6 a layer). Between two of them
 * the GPU normally drains the first grid, flushes, then launches and ramps up the second: a few
 * microseconds each time, on kernels that stream 5-60 MB in 2-20 us. With PDL the next kernel is
 * launched while the previous one still runs; its blocks take SMs as they free up and issue the
 * work that depends on nothing earlier (the weight loads of a GEMV, L2 prefetches) before they
 * wait for the previous grid to finish and its writes to be visible.
 *
 * The contract, for every kernel that a launch with pdl_cfg() may start early:
 *  - pdl_wait() before its first read of anything an earlier kernel wrote, and before its first
 *    global write (an earlier kernel may still read what it would overwrite); every block must
 *    reach it or exit without touching such memory;
 *  - pdl_trigger() anywhere (we put it first): the next kernel may launch once every block of
 *    this one has called it or exited. It only lets that kernel start its independent prologue:
 *    its pdl_wait() still waits for this whole grid to complete.
 * Kernels launched the ordinary way may call both: without the launch attribute they do nothing.
 * A kernel launched without the attribute waits for its predecessor as usual, so a chain may mix
 * the two. Inside stream capture the attribute becomes a programmatic graph edge. */
#ifndef FP4S_PDL_CUH
#define FP4S_PDL_CUH

#include <cuda_runtime.h>

#include "backend/cuda/timeline.cuh"

static __device__ __forceinline__ void pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static __device__ __forceinline__ void pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Both, first thing: for kernels with nothing to do before their inputs are ready (their gain
 * is the launch and ramp-up hidden behind the previous kernel). */
static __device__ __forceinline__ void pdl_enter(void)
{
	pdl_trigger();
	pdl_wait();
}

extern "C" {
/* Which launches on the current device carry the PDL attribute: 0 none, 1 the decode GEMV's
 * (gemv_mma.cu) only, 2 every pdl_launch too. Compute capability >= 9.0 only; FP4S_PDL=0 / gemv /
 * all picks (diagnostics), the default is FP4S_PDL_DEFAULT. */
int fp4s_cuda_pdl(void);
/* Benchmarks: force a mode (0..2), or back to the default (-1). */
void fp4s_cuda_set_pdl(int mode);
}

struct pdl_launch {
	cudaLaunchConfig_t cfg;
	cudaLaunchAttribute attr[1];
};

/* A launch configuration for cudaLaunchKernelEx, with the PDL attribute where fp4s_cuda_pdl() is at
 * least `level` (1: the decode GEMV, 2: other kernels). */
static inline cudaLaunchConfig_t *pdl_cfg(struct pdl_launch *l, dim3 grid, dim3 block, size_t smem,
                                          cudaStream_t s, int level)
{
	l->cfg = cudaLaunchConfig_t{};
	l->cfg.gridDim = grid;
	l->cfg.blockDim = block;
	l->cfg.dynamicSmemBytes = smem;
	l->cfg.stream = s;
	l->cfg.attrs = l->attr;
	l->cfg.numAttrs = 0;
	if (fp4s_cuda_pdl() >= level) {
		l->attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
		l->attr[0].val.programmaticStreamSerializationAllowed = 1;
		l->cfg.numAttrs = 1;
	}
	return &l->cfg;
}

/* kernel<<<grid, block, smem, s>>>(args...) with the PDL attribute where fp4s_cuda_pdl(); the
 * kernel must follow the contract above. Returns the launch status. */
template <typename... K, typename... A>
static inline cudaError_t pdl_launch(void (*kernel)(K...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                     A... args)
{
	struct pdl_launch l;
	return cudaLaunchKernelEx(pdl_cfg(&l, grid, block, smem, s, 2), kernel, args...);
}

#endif
