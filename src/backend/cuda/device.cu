/* device.cu: GPU discovery for the build/device report and for backend start-up. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.h"

extern "C" int fp4s_cuda_native_fp4_compiled(int *compiled, struct fp4s_error *err);

static __global__ void image_probe_kernel(void) {}

extern "C" int fp4s_cuda_built(void) { return 1; }

extern "C" const char *fp4s_cuda_archs(void) { return FP4S_CUDA_ARCHS; }

extern "C" int fp4s_cuda_device_count(struct fp4s_error *err)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		fp4s_error_set(err, FP4S_ENODEV, "no CUDA device: %s (%s)", cudaGetErrorName(e),
		               cudaGetErrorString(e));
		cudaGetLastError(); /* clear the sticky-free error so later calls start clean */
		return 0;
	}
	return n;
}

extern "C" int fp4s_cuda_device_query(int dev, struct fp4s_cuda_device_info *info,
                                      struct fp4s_error *err)
{
	cudaDeviceProp p;
	memset(info, 0, sizeof *info);
	FP4S_CUDA_TRY(err, cudaGetDeviceProperties(&p, dev));
	info->index = dev;
	snprintf(info->name, sizeof info->name, "%s", p.name);
	info->cc_major = p.major;
	info->cc_minor = p.minor;
	info->sm_count = p.multiProcessorCount;
	info->mem_total = p.totalGlobalMem;
	info->l2_bytes = (size_t)p.l2CacheSize;
	info->mem_bus_bits = p.memoryBusWidth;
	info->fp4_path = fp4s_fp4_path_for(p.major, p.minor);
	FP4S_CUDA_TRY(err, cudaSetDevice(dev));
	size_t free_b = 0, total_b = 0;
	if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
		info->mem_free = free_b;
	cudaFuncAttributes attr;
	cudaError_t e = cudaFuncGetAttributes(&attr, image_probe_kernel);
	if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction) {
		cudaGetLastError();
		info->has_kernel_image = 0;
		return FP4S_OK;
	}
	FP4S_CUDA_TRY(err, e);
	info->has_kernel_image = 1;
	return fp4s_cuda_native_fp4_compiled(&info->native_fp4_compiled, err);
}

extern "C" int fp4s_cuda_copy_bandwidth(int dev, double *gbs, struct fp4s_error *err)
{
	const size_t bytes = (size_t)512 << 20;
	void *a = nullptr, *b = nullptr;
	cudaEvent_t e0 = nullptr, e1 = nullptr;
	float t[15];
	int rc = FP4S_OK;
	FP4S_CUDA_TRY(err, cudaSetDevice(dev));
	cudaError_t e = cudaMalloc(&a, bytes);
	if (e == cudaSuccess)
		e = cudaMalloc(&b, bytes);
	if (e == cudaSuccess)
		e = cudaMemset(a, 0x5A, bytes);
	if (e == cudaSuccess)
		e = cudaEventCreate(&e0);
	if (e == cudaSuccess)
		e = cudaEventCreate(&e1);
	for (int i = 0; i < 18 && e == cudaSuccess; i++) {
		e = cudaEventRecord(e0);
		if (e == cudaSuccess)
			e = cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
		if (e == cudaSuccess)
			e = cudaEventRecord(e1);
		if (e == cudaSuccess)
			e = cudaEventSynchronize(e1);
		if (e == cudaSuccess && i >= 3)
			e = cudaEventElapsedTime(&t[i - 3], e0, e1);
	}
	if (e != cudaSuccess) {
		rc = fp4s_error_set(err, FP4S_ECUDA, "copy bandwidth on device %d: %s", dev,
		                    cudaGetErrorString(e));
	} else {
		/* median of 15 by insertion sort */
		for (int i = 1; i < 15; i++)
			for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
				float x = t[j];
				t[j] = t[j - 1];
				t[j - 1] = x;
			}
		*gbs = 2.0 * (double)bytes / (t[7] * 1e-3) / 1e9;
	}
	if (e0)
		cudaEventDestroy(e0);
	if (e1)
		cudaEventDestroy(e1);
	cudaFree(a);
	cudaFree(b);
	return rc;
}

/* PDL policy (pdl.cuh): per device, from the compute capability, unless FP4S_PDL or a benchmark
 * picks a mode. The cache is written only with the value it would compute, so a race between
 * threads is harmless. */
#define FP4S_PDL_DEFAULT 2
static int pdl_mode = -1;
static signed char pdl_dev[64];

extern "C" void fp4s_cuda_set_pdl(int mode) { pdl_mode = mode; }

extern "C" int fp4s_cuda_pdl(void)
{
	static int env = -1;
	if (env < 0) {
		const char *v = getenv("FP4S_PDL");
		env = !v ? FP4S_PDL_DEFAULT : !strcmp(v, "0") ? 0 : !strcmp(v, "gemv") ? 1 : 2;
	}
	const int mode = pdl_mode >= 0 ? pdl_mode : env;
	if (mode == 0)
		return 0;
	int dev = 0;
	if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
		return 0;
	if (!pdl_dev[dev]) {
		int major = 0;
		if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
			return 0;
		pdl_dev[dev] = major >= 9 ? 1 : 2;
	}
	return pdl_dev[dev] == 1 ? mode : 0;
}

#ifdef FP4S_DIAG_TL
/* The step timeline (timeline.cuh; diagnostics). FP4S_TL=path records the replays
 * FP4S_TL_STEP .. FP4S_TL_STEP + FP4S_TL_COUNT - 1 of the decode graphs (defaults 40 and 3) and
 * writes every block's record to path as text, one replay after another ("# replay n"). */
#include "backend/cuda/timeline.cuh"

#define TL_BINDS 64
#define TL_CAP (1u << 19)
static void (*tl_binds[TL_BINDS])(const struct tl_state *);
static int tl_nbinds;
static struct tl_state tl_host; /* the armed buffers (rec NULL: none) */
static FILE *tl_out;

extern "C" int fp4s_tl_register(void (*bind)(const struct tl_state *st))
{
	if (tl_nbinds < TL_BINDS)
		tl_binds[tl_nbinds++] = bind;
	return tl_nbinds;
}

static void tl_bind_all(const struct tl_state *st)
{
	for (int i = 0; i < tl_nbinds; i++)
		tl_binds[i](st);
}

extern "C" void fp4s_tl_before(cudaStream_t s)
{
	static int n, first = -1, count;
	static const char *path;
	if (first < 0) {
		path = getenv("FP4S_TL");
		const char *e = getenv("FP4S_TL_STEP");
		first = e ? atoi(e) : 40;
		e = getenv("FP4S_TL_COUNT");
		count = e ? atoi(e) : 3;
	}
	n++;
	if (!path || n < first || n >= first + count)
		return;
	if (!tl_out && !(tl_out = fopen(path, "w")))
		return;
	if (cudaMalloc(&tl_host.rec, (size_t)TL_CAP * sizeof(struct tl_rec)) != cudaSuccess ||
	    cudaMalloc(&tl_host.cur, sizeof(unsigned)) != cudaSuccess) {
		tl_host.rec = NULL;
		return;
	}
	tl_host.cap = TL_CAP;
	cudaMemset(tl_host.cur, 0, sizeof(unsigned));
	cudaStreamSynchronize(s);
	tl_bind_all(&tl_host);
	fprintf(tl_out, "# replay %d\n", n);
}

extern "C" void fp4s_tl_after(cudaStream_t s)
{
	if (!tl_host.rec)
		return;
	cudaStreamSynchronize(s);
	struct tl_state none = {NULL, NULL, 0};
	tl_bind_all(&none);
	unsigned cnt = 0;
	cudaMemcpy(&cnt, tl_host.cur, sizeof cnt, cudaMemcpyDeviceToHost);
	cnt = cnt < TL_CAP ? cnt : TL_CAP;
	struct tl_rec *r = (struct tl_rec *)malloc((size_t)cnt * sizeof *r + 1);
	if (r && cudaMemcpy(r, tl_host.rec, (size_t)cnt * sizeof *r, cudaMemcpyDeviceToHost) == cudaSuccess) {
		for (unsigned i = 0; i < cnt; i++)
			fprintf(tl_out, "%u %llx %u %u %llu %llu %llu %llu %llu %llu %llu %llu\n", r[i].kid, r[i].tag,
			        r[i].where & 255u, r[i].where >> 8, r[i].t[0], r[i].t[1], r[i].t[2], r[i].t[3], r[i].t[4],
			        r[i].t[5], r[i].t[6], r[i].t[7]);
	}
	fflush(tl_out);
	free(r);
	cudaFree(tl_host.rec);
	cudaFree(tl_host.cur);
	tl_host.rec = NULL;
}
#endif
