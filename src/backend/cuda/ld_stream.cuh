/* ld_stream.cuh: streaming loads for the decode GEMVs (gemv_fp4.cu, gemv_mma.cu, gemv_tma.cu).
 * Weights are read once a step, so they are kept out of L1 (x lives there). volatile keeps the
 * loads where the source puts them: without it the compiler sank the next chunk's prefetch to the
 * end of the loop body (shorter live ranges), so every iteration waited a full DRAM latency
 * (measured: 1.3-1.5 TB/s at M = 1, 2026-11-21). */
#ifndef FP4S_LD_STREAM_CUH
#define FP4S_LD_STREAM_CUH

#include <stdint.h>

static __device__ __forceinline__ uint4 ld_stream16(const void *p)
{
	uint4 v;
	asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
	             : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
	             : "l"(p));
	return v;
}

static __device__ __forceinline__ uint32_t ld_stream_u16(const void *p)
{
	unsigned short v;
	asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
	return v;
}

static __device__ __forceinline__ uint32_t ld_stream_u8(const void *p)
{
	uint32_t v;
	asm volatile("ld.global.nc.L1::no_allocate.u8 %0, [%1];" : "=r"(v) : "l"(p));
	return v;
}

#endif
