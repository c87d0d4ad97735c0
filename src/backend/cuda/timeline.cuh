/* timeline.cuh: where a decode step's time goes, block by block (diagnostics; builds with
 * -DFP4S_DIAG_TL only, nothing otherwise).
 *
 * Why. A one-token step is ~300 dependent launches whose costs are mostly not bytes: the PDL
 * wait's release, staging x, the slowest block's tail. Removing a kernel and timing the step
 * (FP4S_DIAG_SKIP_ATTN) gives one number; this gives every block's entry, release from its PDL
 * wait, start of its main work and exit in one replay of the step's graph, so the gaps between
 * launches and inside them can be read off (dev/timeline.py).
 *
 * How. Each translation unit that includes this (through pdl.cuh) has its own copy of the
 * device-side state, bound by the host when a recording starts (fp4s_tl_register at static
 * initialization, fp4s_tl_before in device.cu). Thread 0 of a block takes a record with one
 * atomic at entry (before its PDL wait, where the block would wait anyway) and writes
 * %globaltimer into it at the marks: TL_SCOPE(kid, tag) at a kernel's top (entry; exit when
 * thread 0 leaves the kernel), TL_MARK(1) past its PDL wait and TL_MARK(2) where its own work
 * starts. With no recording armed a block's cost is one load of a null pointer. */
#ifndef FP4S_TIMELINE_CUH
#define FP4S_TIMELINE_CUH

#ifdef FP4S_DIAG_TL
#include <cuda_runtime.h>
#include <stdint.h>

/* kernel ids (kid) as dev/timeline.py names them */
enum {
	TL_GEMV_TMA = 1,
	TL_MOE_TMA,
	TL_ATTN,
	TL_ATTN_MERGE,
	TL_NORM_ROUTE,
	TL_EMBED,
	TL_RMSNORM,
	TL_ARGMAX,
	TL_ARGMAX_FINAL,
	TL_GEMV_MMA,
	TL_SMALL, /* the other small kernels of cuda_backend.cu / cuda_moe.cu */
};

struct tl_rec {
	unsigned long long tag; /* what tells launches of one kernel apart (a weight's address) */
	unsigned kid, where;    /* where: SM id | linear block index << 8 */
	unsigned long long t[8]; /* entry, after the PDL wait, work started, exit, then a kernel's own
	                          * marks 4-7 (0: not reached) */
};

struct tl_state {
	struct tl_rec *rec;
	unsigned *cur;
	unsigned cap;
};

static __device__ struct tl_state tl_dev;

extern "C" int fp4s_tl_register(void (*bind)(const struct tl_state *st));

static void tl_bind(const struct tl_state *st) { cudaMemcpyToSymbol(tl_dev, st, sizeof *st); }
static const int tl_registered = fp4s_tl_register(tl_bind);

static __device__ __forceinline__ unsigned long long tl_now(void)
{
	unsigned long long t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

static __device__ __forceinline__ bool tl_thread0(void) { return !(threadIdx.x | threadIdx.y | threadIdx.z); }

/* thread 0: a record for this block, its times (NULL: none) */
static __device__ __forceinline__ unsigned long long *tl_begin(int kid, const void *tag)
{
	struct tl_rec *r = tl_dev.rec;
	if (!tl_thread0() || !r)
		return NULL;
	const unsigned long long t = tl_now();
	const unsigned i = atomicAdd(tl_dev.cur, 1u);
	if (i >= tl_dev.cap)
		return NULL;
	unsigned smid;
	asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
	const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
	r[i].tag = (unsigned long long)(uintptr_t)tag;
	r[i].kid = (unsigned)kid;
	r[i].where = (smid & 255u) | (b << 8);
	r[i].t[0] = t;
	for (int k = 1; k < 8; k++)
		r[i].t[k] = 0;
	return r[i].t;
}

/* A mark: the record's address stays in registers of the kernel (not shared memory: the
 * attention kernel's blocks take all of it there), passed down to the functions it calls
 * (TL_REC()). Not its index: the record array's address is then a global load at every mark,
 * which the barriers and memory clobbers between marks keep the compiler from reusing, and which
 * misses L1 once a block has streamed a few KB; under a step's load that is ~1 us of L2 latency
 * on thread 0 at each mark (session 16: the router's top-k measured 3.5 us that way). */
static __device__ __forceinline__ void tl_mark_at(void *rec, int k)
{
	if (rec)
		static_cast<unsigned long long *>(rec)[k] = tl_now();
}

struct tl_scope {
	unsigned long long *t;
	__device__ __forceinline__ tl_scope(int kid, const void *tag) : t(tl_begin(kid, tag)) {}
	__device__ __forceinline__ void mark(int k) const { tl_mark_at(t, k); }
	__device__ __forceinline__ ~tl_scope() { mark(3); }
};

#define TL_SCOPE(kid, tag) tl_scope tl_scope_(kid, (const void *)(tag))
#define TL_MARK(k) tl_scope_.mark(k)
#define TL_REC() (static_cast<void *>(tl_scope_.t))
#else
/* marks passed down to called functions (TL_REC) cost nothing outside the diagnostic build */
static __device__ __forceinline__ void tl_mark_at(void *, int) {}
#define TL_SCOPE(kid, tag) ((void)0)
#define TL_MARK(k) ((void)0)
#define TL_REC() (static_cast<void *>(0))
#endif

#endif
