/* arrive.cuh: the counter behind "the last block to finish does the rest" (split-K sums, the MoE
 * combine, the router's top-k, attention's split merge).
 *
 * Each block leaves its partial results in global memory, then
 *     barrier of the block; thread 0: last = fp4s_arrive(cnt) == blocks - 1; barrier;
 * and the last block reads every partial back. The atom is a release and an acquire at GPU
 * scope: after the barrier, thread 0's release covers the writes of all the block's threads (PTX
 * release is cumulative over what the barrier ordered before it), and its acquire, followed by
 * the barrier, orders the last block's reads after every other block's release. That replaces a
 * __threadfence() by every thread on both sides, each of which waits for all of the thread's
 * outstanding writes. Measured with it (bench/results/2026-11-22-h100-session9.md): qwen3-30b-a3b
 * and gpt-oss-20b decode 1-2 % faster (router and MoE combine), llama3-8b unchanged. */
#ifndef FP4S_ARRIVE_CUH
#define FP4S_ARRIVE_CUH

static __device__ __forceinline__ unsigned fp4s_arrive(unsigned *cnt)
{
	unsigned old;
	asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(cnt) : "memory");
	return old;
}

#endif
