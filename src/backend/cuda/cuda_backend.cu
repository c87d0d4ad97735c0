/* cuda_backend.cu: backend.h on one GPU. Weights are uploaded in their checkpoint format (packed
 * E2M1 + scales stay packed); activations are FP32 in device memory; the KV cache is a pool of
 * blocks [layer][block][FP4S_KV_BLOCK][kv_width] of FP32, BF16 or E4M3 (fp4s_kv_dtype).
 *
 * Matmuls go through fp4s_cuda_matmul (gemv_cuda.h, bandwidth-bound decode kernels). The other
 * ops are plain kernels checked end to end against the CPU reference (test_golden_cuda). A decode
 * step of one token is captured once as a CUDA graph and replayed (graph_run); the MoE router's
 * top-k still runs on the host (one small device-to-host copy per MoE layer), so MoE models run
 * without the graph for now. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/attention_cuda.h"
#include "backend/cuda/attention_prefill_cuda.h"
#include "backend/cuda/gemv_mma.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/gemm_cuda.h"
#include "backend/cuda/gemv_cuda.h"
#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/moe_cuda.h"
#include "numerics/numerics.h"

/* The growable buffers of MoE batches (n > 1), one set for all layers: the layers run one after
 * another on the backend's stream, and graphs capture only one-token steps, which use each
 * layer's fixed buffers. A set per layer cost 36 x 755 MB on gpt-oss-120b at 4096 tokens, more
 * than its 62 GB of weights left on an 80 GB GPU. Order: enum moe_buf. */
enum moe_buf { MB_IDX, MB_W, MB_H, MB_A, MB_O, MB_LG, MB_XB, MB_GPOS, MB_GSRC, MB_GEXP, MB_GOFF, MB_GM, MB_COUNT };
struct cu_moe_bufs {
	void *p[MB_COUNT];
	size_t bytes[MB_COUNT];
};

struct cuda_impl {
	int dev;
	cudaStream_t s;
	void **allocs; /* weights and scratch owned by the backend */
	int32_t n_allocs, cap_allocs;
	void *kc, *vc; /* FP32, BF16 or E4M3 bytes, [layer][block][FP4S_KV_BLOCK][kv_width] */
	enum fp4s_kv_dtype kv_dtype;
	int32_t n_layers, kv_width, n_blocks, max_seqs, max_ctx;
	int32_t *d_table; /* [max_seqs][table_stride] block table, copied at every step's begin */
	int32_t table_stride;
	int32_t *d_tok, *d_pos, *d_seq;
	int32_t batch_cap;
	float *moe_logits, *moe_h1, *moe_h2, *moe_a, *moe_o;
	int64_t moe_cap_tokens, moe_cap_inter, moe_cap_hidden;
	int32_t moe_cap_experts;
	float *host_logits;
	struct {
		int key;
		cudaGraphExec_t exec;
	} graphs[8];
	int32_t n_graphs;
	int32_t *d_argmax;
	int32_t sm_count;
	float *work1, *workn; /* attention partials: one-token steps (fixed: graphs hold it), others */
	void *pf_work;        /* prompt attention's tile list (attention_prefill.cu) */
	int64_t pf_work_bytes;
	int pf_plan_valid;    /* pf_work holds this step's tiles (made by layer 0) */
	int pf_step;          /* this step has a prompt chunk: the flash kernel takes its attention */
	int one_per_seq;      /* no two tokens of this step share a sequence (decode) */
	int64_t workn_floats;
	int32_t splits1;
	struct cu_moe *moes;
	struct cu_moe_bufs moeb;
};

static struct cuda_impl *impl_of(struct fp4s_backend *be) { return (struct cuda_impl *)be->impl; }

/* ---- kernels ----------------------------------------------------------------------------- */

/* Element (r, c) of a weight in its stored format, without the NVFP4 per-tensor factor. */
static __device__ __forceinline__ float w_elem(int fmt, const void *data, const uint8_t *scales,
                                               int64_t K, int64_t r, int64_t c)
{
	const int64_t i = r * K + c;
	switch (fmt) {
	case FP4S_WF_F32: return ((const float *)data)[i];
	case FP4S_WF_BF16: return fp4s_bf16_to_f32(((const uint16_t *)data)[i]);
	case FP4S_WF_F16: return fp4s_f16_to_f32(((const uint16_t *)data)[i]);
	case FP4S_WF_NVFP4: {
		const uint32_t code = (((const uint8_t *)data)[i >> 1] >> ((i & 1) * 4)) & 15u;
		return fp4s_e2m1_to_f32(code) * fp4s_e4m3_to_f32(scales[r * (K / 16) + c / 16]);
	}
	default: {
		const uint32_t code = (((const uint8_t *)data)[i >> 1] >> ((i & 1) * 4)) & 15u;
		return fp4s_e2m1_to_f32(code) * fp4s_e8m0_to_f32(scales[r * (K / 32) + c / 32]);
	}
	}
}

static __global__ void embed_kernel(int fmt, const void *data, const uint8_t *scales, float ws2,
                                    int64_t K, const int32_t *tok, float *out)
{
	pdl_enter();
	const int32_t i = blockIdx.x;
	for (int64_t c = threadIdx.x; c < K; c += blockDim.x)
		out[(int64_t)i * K + c] = w_elem(fmt, data, scales, K, tok[i], c) * ws2;
}

/* One block per row, the row held in registers (float4 per thread, up to 4 each): a decode step
 * normalizes a single 4096-wide row, so latency, not bandwidth, decides; one pass of wide loads
 * with many threads in flight keeps it a few microseconds. */
#define NORM_VEC 4
static __global__ void rmsnorm_kernel(const float *x, const float *w, int64_t width, float eps,
                                      int zero_centred, float *y)
{
	pdl_enter();
	__shared__ float red[32];
	const float *xr = x + (int64_t)blockIdx.x * width;
	float *yr = y + (int64_t)blockIdx.x * width;
	const bool vec = (width & 3) == 0 && width <= (int64_t)blockDim.x * 4 * NORM_VEC;
	float4 v[NORM_VEC];
	float ss = 0.0f;
	if (vec) {
#pragma unroll
		for (int r = 0; r < NORM_VEC; r++) {
			const int64_t i = 4 * ((int64_t)threadIdx.x + (int64_t)r * blockDim.x);
			v[r] = i < width ? *(const float4 *)(xr + i) : make_float4(0, 0, 0, 0);
			ss += v[r].x * v[r].x + v[r].y * v[r].y + v[r].z * v[r].z + v[r].w * v[r].w;
		}
	} else {
		for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
			ss += xr[i] * xr[i];
	}
	for (int o = 16; o > 0; o >>= 1)
		ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
	if ((threadIdx.x & 31) == 0)
		red[threadIdx.x / 32] = ss;
	__syncthreads();
	if (threadIdx.x < 32) {
		ss = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
		for (int o = 16; o > 0; o >>= 1)
			ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
		if (threadIdx.x == 0)
			red[0] = ss;
	}
	__syncthreads();
	const float inv = 1.0f / sqrtf(red[0] / (float)width + eps);
	if (vec) {
#pragma unroll
		for (int r = 0; r < NORM_VEC; r++) {
			const int64_t i = 4 * ((int64_t)threadIdx.x + (int64_t)r * blockDim.x);
			if (i < width) {
				const float4 wv = *(const float4 *)(w + i);
				const float a = zero_centred ? 1.0f : 0.0f;
				*(float4 *)(yr + i) = make_float4(v[r].x * inv * (a + wv.x), v[r].y * inv * (a + wv.y),
				                                  v[r].z * inv * (a + wv.z), v[r].w * inv * (a + wv.w));
			}
		}
	} else {
		for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
			yr[i] = xr[i] * inv * (zero_centred ? 1.0f + w[i] : w[i]);
	}
}

static __global__ void add_kernel(float *x, const float *y, int64_t n)
{
	pdl_enter();
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
		x[i] += y[i];
}

/* grid: (tokens, heads of q then k); one thread per rotary pair */
static __global__ void rope_kernel(float *q, float *k, const int32_t *pos, int32_t nh, int32_t nkv,
                                   int32_t d, int32_t rot, const float *inv_freq, float mscale)
{
	pdl_enter();
	const int32_t i = blockIdx.x, h = blockIdx.y;
	float *v = h < nh ? q + ((int64_t)i * nh + h) * d : k + ((int64_t)i * nkv + (h - nh)) * d;
	const int half = rot / 2;
	for (int j = threadIdx.x; j < half; j += blockDim.x) {
		const float ang = (float)pos[i] * inv_freq[j];
		const float c = cosf(ang) * mscale, s = sinf(ang) * mscale;
		const float x1 = v[j], x2 = v[j + half];
		v[j] = x1 * c - x2 * s;
		v[j + half] = x2 * c + x1 * s;
	}
}

/* norm_rope: grid (tokens, heads of q then k), one block a head of d <= 512: RMSNorm of the
 * head over d with its weight (qn or kn), then the rotary pairs, in one pass through shared
 * memory (Qwen3's q_norm / k_norm before RoPE; the same float math as rmsnorm_kernel and
 * rope_kernel). */
static __global__ void norm_rope_kernel(float *q, float *k, const float *qn, const float *kn, float eps,
                                        int zero_centred, const int32_t *pos, int32_t nh, int32_t nkv, int32_t d,
                                        int32_t rot, const float *inv_freq, float mscale)
{
	pdl_enter();
	__shared__ float s_v[512], red[32];
	const int32_t i = blockIdx.x, h = blockIdx.y;
	float *v = h < nh ? q + ((int64_t)i * nh + h) * d : k + ((int64_t)i * nkv + (h - nh)) * d;
	const float *w = h < nh ? qn : kn;
	float ss = 0.0f;
	for (int j = threadIdx.x; j < d; j += blockDim.x) {
		s_v[j] = v[j];
		ss += s_v[j] * s_v[j];
	}
	for (int o = 16; o > 0; o >>= 1)
		ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
	if ((threadIdx.x & 31) == 0)
		red[threadIdx.x / 32] = ss;
	__syncthreads();
	float tot = 0.0f;
	for (int r = 0; r < (int)(blockDim.x / 32); r++)
		tot += red[r];
	const float inv = 1.0f / sqrtf(tot / (float)d + eps), a = zero_centred ? 1.0f : 0.0f;
	for (int j = threadIdx.x; j < d; j += blockDim.x)
		s_v[j] = s_v[j] * inv * (a + w[j]);
	__syncthreads();
	const int half = rot / 2;
	for (int j = threadIdx.x; j < d; j += blockDim.x) {
		if (j < half) {
			const float ang = (float)pos[i] * inv_freq[j];
			const float c = cosf(ang) * mscale, s = sinf(ang) * mscale;
			v[j] = s_v[j] * c - s_v[j + half] * s;
		} else if (j < rot) {
			const float ang = (float)pos[i] * inv_freq[j - half];
			const float c = cosf(ang) * mscale, s = sinf(ang) * mscale;
			v[j] = s_v[j] * c + s_v[j - half] * s;
		} else {
			v[j] = s_v[j];
		}
	}
}

static __global__ void kv_write_kernel(void *kc, void *vc, int dtype, const float *k, const float *v,
                                       const int32_t *pos, const int32_t *seq, const int32_t *table,
                                       int32_t table_stride, int32_t layer, int32_t n_blocks, int32_t kvw)
{
	pdl_enter();
	const int32_t i = blockIdx.x;
	const int32_t blk = table[(size_t)seq[i] * table_stride + pos[i] / FP4S_KV_BLOCK];
	const size_t base = (((size_t)layer * n_blocks + blk) * FP4S_KV_BLOCK + pos[i] % FP4S_KV_BLOCK) * kvw;
	for (int32_t j = threadIdx.x; j < kvw; j += blockDim.x) {
		const float kv = k[(int64_t)i * kvw + j], vv = v[(int64_t)i * kvw + j];
		if (dtype == FP4S_KV_BF16) {
			/* the same RNE rounding as the CPU's emulation */
			((uint16_t *)kc)[base + j] = fp4s_f32_to_bf16(kv);
			((uint16_t *)vc)[base + j] = fp4s_f32_to_bf16(vv);
		} else if (dtype == FP4S_KV_FP8) {
			/* the CPU's fp4s_f32_to_e4m3, bit for bit (kv_fp8.cuh) */
			((uint8_t *)kc)[base + j] = fp4s_kv_e4m3(kv);
			((uint8_t *)vc)[base + j] = fp4s_kv_e4m3(vv);
		} else {
			((float *)kc)[base + j] = kv;
			((float *)vc)[base + j] = vv;
		}
	}
}

static __global__ void swiglu_kernel(const float *g, const float *u, int64_t n, float *out)
{
	pdl_enter();
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
		out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static __global__ void swiglu_oai_kernel(const float *gu, int64_t n, float alpha, float limit, float *out)
{
	pdl_enter();
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		const float g = fminf(gu[2 * i], limit), u = fminf(fmaxf(gu[2 * i + 1], -limit), limit);
		out[i] = g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
	}
}

static __global__ void axpy_kernel(float *y, const float *x, float a, int64_t n, int first)
{
	pdl_enter();
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
		y[i] = first ? a * x[i] : y[i] + a * x[i];
}

/* Argmax in two stages, ties to the lowest index as on the CPU: ARGMAX_PARTS blocks per row each
 * reduce a slice (a 128k vocabulary is 512 KB: one block alone would take ~200 us), then one
 * block per row reduces the parts. */
#define ARGMAX_PARTS 64
static __device__ __forceinline__ void argmax_merge(float &bv, int32_t &bi, float v, int32_t i)
{
	if (v > bv || (v == bv && i < bi))
		bv = v, bi = i;
}

static __device__ void argmax_block(float &bv, int32_t &bi)
{
	__shared__ float sv[32];
	__shared__ int32_t si[32];
	for (int o = 16; o > 0; o >>= 1)
		argmax_merge(bv, bi, __shfl_xor_sync(0xFFFFFFFFu, bv, o), __shfl_xor_sync(0xFFFFFFFFu, bi, o));
	if ((threadIdx.x & 31) == 0)
		sv[threadIdx.x / 32] = bv, si[threadIdx.x / 32] = bi;
	__syncthreads();
	if (threadIdx.x < 32) {
		bv = threadIdx.x < blockDim.x / 32 ? sv[threadIdx.x] : -INFINITY;
		bi = threadIdx.x < blockDim.x / 32 ? si[threadIdx.x] : 0x7FFFFFFF;
		for (int o = 16; o > 0; o >>= 1)
			argmax_merge(bv, bi, __shfl_xor_sync(0xFFFFFFFFu, bv, o), __shfl_xor_sync(0xFFFFFFFFu, bi, o));
	}
}

static __global__ void argmax_part_kernel(const float *logits, int64_t vocab, float *pv, int32_t *pi)
{
	pdl_enter();
	const float *l = logits + (int64_t)blockIdx.y * vocab;
	const int64_t per = (vocab + ARGMAX_PARTS - 1) / ARGMAX_PARTS;
	const int64_t b = (int64_t)blockIdx.x * per, e = b + per < vocab ? b + per : vocab;
	float bv = -INFINITY;
	int32_t bi = 0x7FFFFFFF;
	for (int64_t v = b + threadIdx.x; v < e; v += blockDim.x)
		argmax_merge(bv, bi, l[v], (int32_t)v);
	argmax_block(bv, bi);
	if (threadIdx.x == 0)
		pv[blockIdx.y * ARGMAX_PARTS + blockIdx.x] = bv, pi[blockIdx.y * ARGMAX_PARTS + blockIdx.x] = bi;
}

static __global__ void argmax_final_kernel(const float *pv, const int32_t *pi, int32_t *out)
{
	pdl_enter();
	float bv = -INFINITY;
	int32_t bi = 0x7FFFFFFF;
	for (int j = threadIdx.x; j < ARGMAX_PARTS; j += blockDim.x)
		argmax_merge(bv, bi, pv[blockIdx.x * ARGMAX_PARTS + j], pi[blockIdx.x * ARGMAX_PARTS + j]);
	argmax_block(bv, bi);
	if (threadIdx.x == 0)
		out[blockIdx.x] = bi == 0x7FFFFFFF ? 0 : bi;
}

/* ---- host glue ---------------------------------------------------------------------------- */

static int grid1(int64_t n) { return (int)(n / 256 + 1 < 4096 ? n / 256 + 1 : 4096); }

static int track(struct cuda_impl *c, void *p, struct fp4s_error *err)
{
	if (c->n_allocs == c->cap_allocs) {
		int32_t cap = c->cap_allocs ? 2 * c->cap_allocs : 256;
		void **n = (void **)realloc(c->allocs, (size_t)cap * sizeof *n);
		if (!n) {
			cudaFree(p);
			return fp4s_error_set(err, FP4S_ENOMEM, "cuda backend: out of host memory");
		}
		c->allocs = n, c->cap_allocs = cap;
	}
	c->allocs[c->n_allocs++] = p;
	return FP4S_OK;
}

static int dev_alloc(struct cuda_impl *c, void **p, size_t bytes, struct fp4s_error *err)
{
	cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
	if (e != cudaSuccess)
		return fp4s_error_set(err, FP4S_ENOMEM, "cuda: cannot allocate %.1f MB on the GPU: %s",
		                      (double)bytes / 1e6, cudaGetErrorString(e));
	return FP4S_OK;
}

static int cu_alloc(struct fp4s_backend *be, void **p, int64_t bytes, struct fp4s_error *err)
{
	return dev_alloc(impl_of(be), p, (size_t)bytes, err);
}

static void cu_free(struct fp4s_backend *be, void *p) { cudaFree(p); }

static int upload(struct cuda_impl *c, const void *host, size_t bytes, void **dev, struct fp4s_error *err)
{
	int rc = dev_alloc(c, dev, bytes, err);
	if (rc || (rc = track(c, *dev, err)))
		return rc;
	FP4S_CUDA_TRY(err, cudaMemcpy(*dev, host, bytes, cudaMemcpyHostToDevice));
	return FP4S_OK;
}

static int cu_upload_mat(struct fp4s_backend *be, struct fp4s_mat *m, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	const size_t n = (size_t)m->rows * (size_t)m->cols;
	size_t data_b = 0, scale_b = 0;
	switch (m->fmt) {
	case FP4S_WF_F32: data_b = n * 4; break;
	case FP4S_WF_BF16:
	case FP4S_WF_F16: data_b = n * 2; break;
	case FP4S_WF_NVFP4: data_b = n / 2, scale_b = n / 16; break;
	case FP4S_WF_MXFP4: data_b = n / 2, scale_b = n / 32; break;
	default: return fp4s_error_set(err, FP4S_EUNSUPPORTED, "cuda: weight format %d", (int)m->fmt);
	}
	void *d;
	int rc;
	if ((rc = upload(c, m->data, data_b, &d, err)))
		return rc;
	m->data = d;
	if (scale_b) {
		if ((rc = upload(c, m->scales, scale_b, &d, err)))
			return rc;
		m->scales = (const uint8_t *)d;
	}
	if (m->bias) {
		if ((rc = upload(c, m->bias, (size_t)m->rows * sizeof(float), &d, err)))
			return rc;
		m->bias = (const float *)d;
	}
	return fp4s_cuda_mx_scale_range(m, c->s, err); /* MXFP4: what the tensor-core GEMV needs */
}

static int cu_upload_f32(struct fp4s_backend *be, float **p, int64_t n, struct fp4s_error *err)
{
	void *d;
	int rc = upload(impl_of(be), *p, (size_t)n * sizeof(float), &d, err);
	if (!rc)
		*p = (float *)d;
	return rc;
}

static void cu_graph_reset(struct fp4s_backend *be);

static size_t mat_data_bytes(const struct fp4s_mat *m, size_t *scale_b)
{
	const size_t n = (size_t)m->rows * (size_t)m->cols;
	*scale_b = 0;
	switch (m->fmt) {
	case FP4S_WF_F32: return n * 4;
	case FP4S_WF_BF16:
	case FP4S_WF_F16: return n * 2;
	case FP4S_WF_NVFP4: *scale_b = n / 16; return n / 2;
	case FP4S_WF_MXFP4: *scale_b = n / 32; return n / 2;
	default: return 0;
	}
}

static int cu_upload_fused(struct fp4s_backend *be, struct fp4s_mat **parts, int n, struct fp4s_mat *fused,
                           struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	int64_t rows = 0;
	int any_bias = 0;
	for (int i = 0; i < n; i++) {
		const struct fp4s_mat *m = parts[i];
		if (!m->data || m->fmt != parts[0]->fmt || m->cols != parts[0]->cols ||
		    (m->fmt == FP4S_WF_NVFP4 && m->ws2 != parts[0]->ws2))
			return FP4S_EUNSUPPORTED;
		rows += m->rows;
		any_bias |= m->bias != NULL;
	}
	size_t sb0, db0 = mat_data_bytes(parts[0], &sb0);
	if (!db0)
		return FP4S_EUNSUPPORTED;
	const size_t per_row_d = db0 / (size_t)parts[0]->rows, per_row_s = sb0 / (size_t)parts[0]->rows;
	uint8_t *d = NULL, *sc = NULL;
	float *bias = NULL;
	int rc;
	if ((rc = dev_alloc(c, (void **)&d, per_row_d * (size_t)rows, err)) || (rc = track(c, d, err)))
		return rc;
	if (per_row_s && ((rc = dev_alloc(c, (void **)&sc, per_row_s * (size_t)rows, err)) || (rc = track(c, sc, err))))
		return rc;
	if (any_bias && ((rc = dev_alloc(c, (void **)&bias, sizeof(float) * (size_t)rows, err)) ||
	                 (rc = track(c, bias, err))))
		return rc;
	*fused = *parts[0];
	fused->rows = rows;
	fused->data = d, fused->scales = sc, fused->bias = bias;
	int64_t r0 = 0;
	for (int i = 0; i < n; i++) {
		struct fp4s_mat *m = parts[i];
		FP4S_CUDA_TRY(err, cudaMemcpy(d + per_row_d * (size_t)r0, m->data, per_row_d * (size_t)m->rows,
		                              cudaMemcpyHostToDevice));
		m->data = d + per_row_d * (size_t)r0;
		if (per_row_s) {
			FP4S_CUDA_TRY(err, cudaMemcpy(sc + per_row_s * (size_t)r0, m->scales,
			                              per_row_s * (size_t)m->rows, cudaMemcpyHostToDevice));
			m->scales = sc + per_row_s * (size_t)r0;
		}
		if (any_bias) {
			if (m->bias)
				FP4S_CUDA_TRY(err, cudaMemcpy(bias + r0, m->bias, sizeof(float) * (size_t)m->rows,
				                              cudaMemcpyHostToDevice));
			else
				FP4S_CUDA_TRY(err, cudaMemset(bias + r0, 0, sizeof(float) * (size_t)m->rows));
			m->bias = bias + r0;
		}
		r0 += m->rows;
	}
	for (int i = 0; i < n; i++)
		if ((rc = fp4s_cuda_mx_scale_range(parts[i], c->s, err)))
			return rc;
	return fp4s_cuda_mx_scale_range(fused, c->s, err);
}

/* A MoE layer on the device: gate|up (per expert: gate rows then up rows, or gpt-oss's
 * interleaved gate_up) and down, each stacked over all experts, plus the step's buffers. */
struct cu_moe {
	struct fp4s_stacked gu, down;
	int interleaved;
	/* one-token buffers (fixed: graphs hold them) and, for larger batches, views of the
	 * backend's shared growable set (moe_batch_bufs) */
	int32_t *idx1, *idxn;
	float *w1, *wn, *h1, *hn, *a1, *an, *o1, *on, *lg1, *lgn;
	float *x1;     /* norm_moe_add: the normalized token, where the gate|up GEMV declines the norm */
	unsigned *cnt; /* norm_moe_add: the fused router's block counter (left zero by each launch) */
	int32_t *gpos, *gsrc, *gexp, *goff, *gm; /* batches: the slots grouped by expert */
	void *xbn;                               /* batches on the GEMM: BF16 activations */
	struct cu_moe *next; /* all layers' records, freed with the backend */
};

/* Stacks one projection of every expert (parts[e], each a [rows, cols] view, in order) into one
 * allocation; parts2 (may be NULL) are appended to each expert's block (gate then up). */
static int stack_experts(struct cuda_impl *c, const struct fp4s_mat *const *parts, const struct fp4s_mat *const *parts2,
                         int32_t E, struct fp4s_stacked *out, struct fp4s_error *err)
{
	const struct fp4s_mat *m0 = parts[0];
	size_t sb, db = mat_data_bytes(m0, &sb);
	const int64_t rows = m0->rows + (parts2 ? parts2[0]->rows : 0);
	int any_bias = 0, per_expert_ws2 = 0;
	for (int32_t e = 0; e < E; e++) {
		const struct fp4s_mat *ms[2] = {parts[e], parts2 ? parts2[e] : NULL};
		for (int k = 0; k < 2; k++) {
			if (!ms[k])
				continue;
			if (!ms[k]->data || ms[k]->fmt != m0->fmt || ms[k]->cols != m0->cols || ms[k]->rows != (k ? parts2[0] : m0)->rows)
				return FP4S_EUNSUPPORTED;
			any_bias |= ms[k]->bias != NULL;
		}
		if (m0->fmt == FP4S_WF_NVFP4) {
			if (parts2 && parts2[e]->ws2 != parts[e]->ws2)
				return FP4S_EUNSUPPORTED; /* gate and up of one expert must share a scale */
			per_expert_ws2 |= parts[e]->ws2 != m0->ws2;
		}
	}
	if (m0->fmt != FP4S_WF_NVFP4 && m0->fmt != FP4S_WF_MXFP4 && m0->fmt != FP4S_WF_BF16)
		return FP4S_EUNSUPPORTED;
	const size_t row_d = db / (size_t)m0->rows, row_s = sb / (size_t)m0->rows;
	uint8_t *d = NULL, *sc = NULL;
	float *bias = NULL, *ws2e = NULL;
	int rc;
	if ((rc = dev_alloc(c, (void **)&d, row_d * (size_t)rows * (size_t)E, err)) || (rc = track(c, d, err)))
		return rc;
	if (row_s && ((rc = dev_alloc(c, (void **)&sc, row_s * (size_t)rows * (size_t)E, err)) || (rc = track(c, sc, err))))
		return rc;
	if (any_bias && ((rc = dev_alloc(c, (void **)&bias, sizeof(float) * (size_t)rows * (size_t)E, err)) ||
	                 (rc = track(c, bias, err))))
		return rc;
	for (int32_t e = 0; e < E; e++) {
		int64_t r0 = 0;
		const struct fp4s_mat *ms[2] = {parts[e], parts2 ? parts2[e] : NULL};
		for (int k = 0; k < 2; k++) {
			const struct fp4s_mat *m = ms[k];
			if (!m)
				continue;
			const size_t at = (size_t)e * (size_t)rows + (size_t)r0;
			FP4S_CUDA_TRY(err, cudaMemcpy(d + row_d * at, m->data, row_d * (size_t)m->rows, cudaMemcpyHostToDevice));
			if (row_s)
				FP4S_CUDA_TRY(err, cudaMemcpy(sc + row_s * at, m->scales, row_s * (size_t)m->rows,
				                              cudaMemcpyHostToDevice));
			if (any_bias) {
				if (m->bias)
					FP4S_CUDA_TRY(err, cudaMemcpy(bias + at, m->bias, sizeof(float) * (size_t)m->rows,
					                              cudaMemcpyHostToDevice));
				else
					FP4S_CUDA_TRY(err, cudaMemset(bias + at, 0, sizeof(float) * (size_t)m->rows));
			}
			r0 += m->rows;
		}
	}
	if (per_expert_ws2) {
		float *h = (float *)malloc((size_t)E * sizeof(float));
		if (!h)
			return fp4s_error_set(err, FP4S_ENOMEM, "moe: out of host memory");
		for (int32_t e = 0; e < E; e++)
			h[e] = parts[e]->ws2;
		rc = dev_alloc(c, (void **)&ws2e, (size_t)E * sizeof(float), err);
		if (!rc)
			rc = track(c, ws2e, err);
		if (!rc && cudaMemcpy(ws2e, h, (size_t)E * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
			rc = fp4s_error_set(err, FP4S_ECUDA, "moe: copying per-expert scales failed");
		free(h);
		if (rc)
			return rc;
	}
	out->fmt = m0->fmt;
	out->rows = rows, out->cols = m0->cols;
	out->data = d, out->scales = sc, out->bias = bias;
	out->stride_data = (int64_t)(row_d * (size_t)rows);
	out->stride_scales = (int64_t)(row_s * (size_t)rows);
	out->ws2 = m0->ws2, out->ws2e = ws2e;
	out->e8_range = 0;
	return fp4s_cuda_mx_scale_range_stacked(out, E, c->s, err);
}

static int cu_upload_moe(struct fp4s_backend *be, struct fp4s_moe_params *p, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	const int32_t E = p->n_experts;
	if (E <= 0 || E > 8192 || !p->experts || p->top_k > 64)
		return FP4S_EUNSUPPORTED;
	const struct fp4s_mat **a = (const struct fp4s_mat **)malloc(3 * (size_t)E * sizeof *a);
	if (!a)
		return fp4s_error_set(err, FP4S_ENOMEM, "moe: out of host memory");
	const struct fp4s_mat **b = a + E, **dn = a + 2 * E;
	const int inter = p->oai_swiglu;
	for (int32_t e = 0; e < E; e++) {
		a[e] = inter ? &p->experts[e].gate_up : &p->experts[e].gate;
		b[e] = &p->experts[e].up;
		dn[e] = &p->experts[e].down;
	}
	struct cu_moe *m = (struct cu_moe *)calloc(1, sizeof *m);
	int rc = m ? FP4S_OK : fp4s_error_set(err, FP4S_ENOMEM, "moe: out of host memory");
	if (!rc)
		rc = stack_experts(c, a, inter ? NULL : b, E, &m->gu, err);
	if (!rc)
		rc = stack_experts(c, dn, NULL, E, &m->down, err);
	free(a);
	const int64_t K = p->top_k, I = p->inter, H = p->hidden;
	if (!rc && (m->gu.rows != 2 * I || m->down.rows != H || m->down.cols != I))
		rc = FP4S_EUNSUPPORTED;
	void **bufs[] = {(void **)&m->idx1, (void **)&m->w1, (void **)&m->h1, (void **)&m->a1, (void **)&m->o1,
	                 (void **)&m->lg1, (void **)&m->x1, (void **)&m->cnt};
	const size_t sizes[] = {(size_t)K * 4, (size_t)K * 4, (size_t)(K * 2 * I) * 4, (size_t)(K * I) * 4,
	                        (size_t)(K * H) * 4, (size_t)E * 4, (size_t)H * 4, sizeof(unsigned)};
	for (int i = 0; !rc && i < 8; i++)
		if (!(rc = dev_alloc(c, bufs[i], sizes[i], err)))
			rc = track(c, *bufs[i], err);
	if (!rc && cudaMemset(m->cnt, 0, sizeof(unsigned)) != cudaSuccess)
		rc = fp4s_error_set(err, FP4S_ECUDA, "moe: clearing the router counter failed");
	if (rc) {
		free(m); /* stacked weights stay tracked and are freed with the backend */
		return rc;
	}
	m->interleaved = inter;
	m->next = c->moes;
	c->moes = m;
	p->dev = m;
	return FP4S_OK;
}

static int cu_kv_init(struct fp4s_backend *be, int32_t n_layers, int32_t kv_width, int32_t n_blocks,
                      int32_t max_seqs, int32_t max_ctx, enum fp4s_kv_dtype dtype, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	cu_graph_reset(be);
	cudaFree(c->kc), cudaFree(c->vc), cudaFree(c->d_table);
	c->kc = c->vc = NULL;
	c->d_table = NULL;
	c->kv_dtype = dtype;
	c->table_stride = (max_ctx + FP4S_KV_BLOCK - 1) / FP4S_KV_BLOCK;
	/* 4, 2 or 1 bytes an element: an FP8 pool of the same blocks takes half BF16's memory */
	const size_t n = (size_t)n_layers * n_blocks * FP4S_KV_BLOCK * kv_width, es = (size_t)fp4s_kv_dtype_bytes(dtype);
	int rc = fp4s_cuda_attention_setup(err);
	if (!rc)
		rc = fp4s_cuda_attention_prefill_setup(err);
	if (!rc)
		rc = fp4s_gemv_mma_setup(c->s, err);
	if (!rc)
		rc = dev_alloc(c, (void **)&c->kc, n * es, err);
	if (!rc)
		rc = dev_alloc(c, (void **)&c->vc, n * es, err);
	if (!rc)
		rc = dev_alloc(c, (void **)&c->d_table, (size_t)max_seqs * c->table_stride * sizeof(int32_t), err);
	if (rc)
		return fp4s_error_prefix(err, "kv cache (%d layers x %d blocks of %d positions): ", n_layers,
		                         n_blocks, FP4S_KV_BLOCK);
	c->n_layers = n_layers, c->kv_width = kv_width, c->n_blocks = n_blocks;
	c->max_seqs = max_seqs, c->max_ctx = max_ctx;
	return FP4S_OK;
}

static void cu_kv_clear(struct fp4s_backend *be, int32_t seq) { (void)be, (void)seq; }

static int cu_begin(struct fp4s_backend *be, const struct fp4s_batch *b, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	/* Prompt chunks (runs of >= 16 tokens of one sequence) go to the flash kernel, which shares
	 * each K/V tile among a tile of queries; decode tokens alone stay on the split-K kernel
	 * (the flash kernel walks a lone token's whole context with one block). */
	c->pf_plan_valid = 0;
	c->pf_step = 0;
	for (int32_t i = 0, run = 0; i < b->n && !c->pf_step; i++) {
		run = i > 0 && b->seq[i] == b->seq[i - 1] ? run + 1 : 1;
		c->pf_step = run >= 16;
	}
	/* (checked for the small batches the fused decode attention takes; larger ones say no) */
	c->one_per_seq = !c->pf_step && b->n <= 64;
	for (int32_t i = 1; i < b->n && c->one_per_seq; i++)
		for (int32_t j = 0; j < i && c->one_per_seq; j++)
			c->one_per_seq = b->seq[i] != b->seq[j];
	if (b->n > c->batch_cap) {
		cudaFree(c->d_tok), cudaFree(c->d_pos), cudaFree(c->d_seq);
		c->d_tok = c->d_pos = c->d_seq = NULL;
		c->batch_cap = 0;
		int32_t cap = b->n < 256 ? 256 : b->n;
		int rc;
		if ((rc = dev_alloc(c, (void **)&c->d_tok, (size_t)cap * 4, err)) ||
		    (rc = dev_alloc(c, (void **)&c->d_pos, (size_t)cap * 4, err)) ||
		    (rc = dev_alloc(c, (void **)&c->d_seq, (size_t)cap * 4, err)))
			return rc;
		c->batch_cap = cap;
	}
	for (int32_t i = 0; i < b->n; i++)
		if (b->pos[i] < 0 || b->pos[i] >= c->max_ctx || b->seq[i] < 0 || b->seq[i] >= c->max_seqs)
			return fp4s_error_set(err, FP4S_EINVAL, "token %d: position %d / slot %d outside the "
			                      "KV cache (%d positions, %d slots)", i, b->pos[i], b->seq[i],
			                      c->max_ctx, c->max_seqs);
	if (!b->block_table || b->table_stride != c->table_stride)
		return fp4s_error_set(err, FP4S_EINVAL, "batch block table stride %d, the cache has %d",
		                      b->table_stride, c->table_stride);
	for (int32_t i = 0; i < b->n; i++)
		for (int32_t t = 0; t <= b->pos[i]; t += FP4S_KV_BLOCK) {
			const int32_t blk = b->block_table[(size_t)b->seq[i] * b->table_stride + t / FP4S_KV_BLOCK];
			if (blk < 0 || blk >= c->n_blocks)
				return fp4s_error_set(err, FP4S_EINVAL, "slot %d position %d: block %d outside the "
				                      "pool of %d", b->seq[i], t, blk, c->n_blocks);
		}
	/* the whole table each step: a few KB, and the graph's kernels read it from a fixed buffer */
	FP4S_CUDA_TRY(err, cudaMemcpyAsync(c->d_table, b->block_table,
	                                   (size_t)c->max_seqs * c->table_stride * sizeof(int32_t),
	                                   cudaMemcpyHostToDevice, c->s));
	FP4S_CUDA_TRY(err, cudaMemcpyAsync(c->d_tok, b->tokens, (size_t)b->n * 4, cudaMemcpyHostToDevice, c->s));
	FP4S_CUDA_TRY(err, cudaMemcpyAsync(c->d_pos, b->pos, (size_t)b->n * 4, cudaMemcpyHostToDevice, c->s));
	FP4S_CUDA_TRY(err, cudaMemcpyAsync(c->d_seq, b->seq, (size_t)b->n * 4, cudaMemcpyHostToDevice, c->s));
	return FP4S_OK;
}

static int cu_read(struct fp4s_backend *be, void *host, const void *src, int64_t bytes,
                   struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	FP4S_CUDA_TRY(err, cudaMemcpyAsync(host, src, (size_t)bytes, cudaMemcpyDeviceToHost, c->s));
	FP4S_CUDA_TRY(err, cudaStreamSynchronize(c->s));
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

static int cu_gather_rows(struct fp4s_backend *be, const float *src, const int32_t *rows, int32_t n,
                          int64_t width, float *dst, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	for (int32_t i = 0; i < n; i++)
		FP4S_CUDA_TRY(err, cudaMemcpyAsync(dst + (int64_t)i * width, src + (int64_t)rows[i] * width,
		                                   (size_t)width * sizeof(float), cudaMemcpyDeviceToDevice, c->s));
	return FP4S_OK;
}

static int cu_embed(struct fp4s_backend *be, const struct fp4s_mat *emb, const struct fp4s_batch *b,
                    float *out, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	const float ws2 = emb->fmt == FP4S_WF_NVFP4 ? emb->ws2 : 1.0f;
	pdl_launch(embed_kernel, dim3(b->n), 256, 0, c->s, (int)emb->fmt, emb->data, emb->scales, ws2, emb->cols,
		c->d_tok, out);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

static int cu_matmul(struct fp4s_backend *be, const float *x, int64_t n, const struct fp4s_mat *w,
                     float *y, struct fp4s_error *err)
{
	if (n > INT32_MAX)
		return fp4s_error_set(err, FP4S_EINVAL, "matmul: %lld tokens", (long long)n);
	/* prompts: tensor cores; decode steps: the bandwidth kernels (exact FP32 activations) */
	if (be->gemm_min_tokens > 0 && n >= be->gemm_min_tokens &&
	    (w->fmt == FP4S_WF_NVFP4 || w->fmt == FP4S_WF_MXFP4 || w->fmt == FP4S_WF_BF16)) {
		int rc = fp4s_cuda_gemm(w, x, (int32_t)n, y, impl_of(be)->s, err);
		if (rc != FP4S_EUNSUPPORTED)
			return rc;
	}
	return fp4s_cuda_matmul(w, x, (int32_t)n, y, impl_of(be)->s, err);
}

/* The fused decode ops (backend.h): the tensor-core FP4 GEMV with the norm, the SwiGLU or the
 * residual add folded in, for the token counts that take the GEMV path. */
static int fused_path(const struct fp4s_backend *be, int64_t n, const struct fp4s_mat *w)
{
	return n >= 1 && n <= 16 && (be->gemm_min_tokens <= 0 || n < be->gemm_min_tokens) &&
	       (w->fmt == FP4S_WF_NVFP4 || w->fmt == FP4S_WF_MXFP4) && fp4s_gemv_mma_allowed();
}

/* 1 when the environment variable is "0" (diagnostic switches that turn a fusion off), read once */
static int env_off(const char *name, int *cache)
{
	if (*cache < 0) {
		const char *e = getenv(name);
		*cache = e && strcmp(e, "0") == 0;
	}
	return *cache;
}

/* Where a dense MLP's decode SwiGLU runs (FP4S_FUSED_SWIGLU): 0 (default) its own kernel,
 * 1 ("gate") in the gate|up projection's epilogue, 2 ("down") in the down projection's staging.
 * Measured on llama3-8b decode (bench/results/2026-11-22-h100-session4.md): own kernel 288.5
 * tok/s, down 282.9, gate 279.9 (a block then walks gate and up tiles 29 MB apart). */
static int swiglu_mode(void)
{
	static int mode = -1;
	if (mode < 0) {
		const char *e = getenv("FP4S_FUSED_SWIGLU");
		mode = !e ? 0 : strcmp(e, "gate") == 0 ? 1 : strcmp(e, "down") == 0 ? 2 : 0;
	}
	return mode;
}

/* g = SwiGLU of W . rmsnorm(h), W = [gate | up] (fp4s_gemv_mma_norm_swiglu) */
static int cu_norm_matmul_swiglu(struct fp4s_backend *be, const float *h, const float *nw, float eps,
                                 enum fp4s_norm_kind kind, int64_t n, const struct fp4s_mat *w, float *g,
                                 struct fp4s_error *err)
{
	if (swiglu_mode() != 1 || !fused_path(be, n, w))
		return FP4S_EUNSUPPORTED;
	return fp4s_gemv_mma_norm_swiglu(w, h, (int32_t)n, g, nw, eps, kind == FP4S_NORM_ZERO_CENTRED, impl_of(be)->s,
	                                 err);
}

/* FP4S_FUSED_NORM=0: the norm as a kernel of its own (5 % slower on llama3-8b decode). */
static int cu_norm_matmul(struct fp4s_backend *be, const float *h, const float *nw, float eps,
                          enum fp4s_norm_kind kind, int64_t n, const struct fp4s_mat *w, float *y,
                          struct fp4s_error *err)
{
	static int off = -1;
	if (env_off("FP4S_FUSED_NORM", &off) || !fused_path(be, n, w))
		return FP4S_EUNSUPPORTED;
	return fp4s_gemv_mma_fused(w, h, (int32_t)n, y, 0, 0, nw, eps, kind == FP4S_NORM_ZERO_CENTRED, impl_of(be)->s,
	                           err);
}

static int cu_matmul_add(struct fp4s_backend *be, const float *x, int64_t n, const struct fp4s_mat *w, float *h,
                         struct fp4s_error *err)
{
	if (!fused_path(be, n, w))
		return FP4S_EUNSUPPORTED;
	return fp4s_gemv_mma_fused(w, x, (int32_t)n, h, 1, 0, NULL, 0.0f, 0, impl_of(be)->s, err);
}

static int cu_swiglu_matmul_add(struct fp4s_backend *be, const float *gu, int64_t n, const struct fp4s_mat *w,
                                float *h, struct fp4s_error *err)
{
	/* Only with FP4S_FUSED_SWIGLU=down: every block of the down projection reads both halves of
	 * [gate | up] (2 x 57 KB at llama3-8b's 14336) and takes 14336 exponentials while staging,
	 * which costs more than a SwiGLU kernel of its own (see swiglu_mode). */
	if (swiglu_mode() != 2 || !fused_path(be, n, w))
		return FP4S_EUNSUPPORTED;
	return fp4s_gemv_mma_fused(w, gu, (int32_t)n, h, 1, 1, NULL, 0.0f, 0, impl_of(be)->s, err);
}

/* enough threads that a row fits in NORM_VEC float4 registers each, in whole warps */
static int norm_threads(int64_t width)
{
	int64_t t = (width / 4 + NORM_VEC - 1) / NORM_VEC;
	t = (t + 31) / 32 * 32;
	return (int)(t < 32 ? 32 : (t > 1024 ? 1024 : t));
}

static void cu_rmsnorm(struct fp4s_backend *be, const float *x, const float *w, int64_t rows,
                       int64_t width, float eps, enum fp4s_norm_kind kind, float *y)
{
	if (rows > 0)
		pdl_launch(rmsnorm_kernel, dim3((unsigned)rows), norm_threads(width), 0, impl_of(be)->s, x, w, width, eps,
			kind == FP4S_NORM_ZERO_CENTRED, y);
}

static void cu_add(struct fp4s_backend *be, float *x, const float *y, int64_t n)
{
	pdl_launch(add_kernel, dim3(grid1(n)), 256, 0, impl_of(be)->s, x, y, n);
}

static void cu_rope(struct fp4s_backend *be, float *q, float *k, const struct fp4s_batch *b, int32_t nh,
                    int32_t nkv, int32_t head_dim, int32_t rot_dim, const float *inv_freq, float mscale)
{
	struct cuda_impl *c = impl_of(be);
	pdl_launch(rope_kernel, dim3((unsigned)b->n, (unsigned)(nh + nkv)), 64, 0, c->s,
		q, k, c->d_pos, nh, nkv, head_dim, rot_dim, inv_freq, mscale);
}

static int cu_norm_rope(struct fp4s_backend *be, float *q, float *k, const float *qn, const float *kn, float eps,
                        enum fp4s_norm_kind kind, const struct fp4s_batch *b, int32_t nh, int32_t nkv,
                        int32_t head_dim, int32_t rot_dim, const float *inv_freq, float mscale,
                        struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	if (head_dim > 512 || rot_dim > head_dim || (kind != FP4S_NORM_PLAIN && kind != FP4S_NORM_ZERO_CENTRED))
		return FP4S_EUNSUPPORTED;
	pdl_launch(norm_rope_kernel, dim3((unsigned)b->n, (unsigned)(nh + nkv)), 64, 0, c->s, q, k, qn, kn, eps,
		kind == FP4S_NORM_ZERO_CENTRED, c->d_pos, nh, nkv, head_dim, rot_dim, inv_freq, mscale);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

/* Key chunks per (token, KV head): a decode step has one token and a handful of KV heads, so
 * the chunks are what puts enough warps in flight: ~8 blocks per SM, chunks of >= 32 keys. */
#define ATT_MAX_SPLITS 128
static int32_t attn_splits(const struct cuda_impl *c, int32_t n, int32_t nkv, int32_t ctx)
{
	int32_t want = (8 * c->sm_count + n * nkv - 1) / (n * nkv);
	int32_t most = (ctx + 31) / 32;
	want = want < most ? want : most;
	return want < 1 ? 1 : (want > ATT_MAX_SPLITS ? ATT_MAX_SPLITS : want);
}

static int attn_work(struct cuda_impl *c, const struct fp4s_batch *b, const struct fp4s_attn_params *p,
                     int32_t *splits_out, float **work_out, struct fp4s_error *err);

/* 1 when the cache holds this layer with K/V rows of the attention's width */
static int kv_ready(const struct cuda_impl *c, int32_t layer, const struct fp4s_attn_params *p)
{
	return c->kc && p->n_kv_heads * p->head_dim == c->kv_width && layer >= 0 && layer < c->n_layers;
}

/* bytes from the pool's start to the layer's blocks */
static size_t kv_layer_off(const struct cuda_impl *c, int32_t layer)
{
	return (size_t)layer * c->n_blocks * FP4S_KV_BLOCK * c->kv_width * fp4s_kv_dtype_bytes(c->kv_dtype);
}

static int cu_attention(struct fp4s_backend *be, int32_t layer, const float *q, const float *k,
                        const float *v, const struct fp4s_batch *b, const struct fp4s_attn_params *p,
                        float *out, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	if (!kv_ready(c, layer, p))
		return fp4s_error_set(err, FP4S_EINVAL, "attention: KV cache not set up for layer %d", layer);
	pdl_launch(kv_write_kernel, dim3(b->n), 256, 0, c->s, c->kc, c->vc, c->kv_dtype, k, v, c->d_pos, c->d_seq,
		c->d_table, c->table_stride, layer, c->n_blocks, c->kv_width);
	const size_t layer_off = kv_layer_off(c, layer);
	if (c->pf_step && c->kv_dtype != FP4S_KV_F32) {
		const int64_t need = fp4s_cuda_attention_prefill_work_bytes(b->n);
		if (need > c->pf_work_bytes) {
			cudaFree(c->pf_work);
			c->pf_work = NULL;
			c->pf_work_bytes = 0;
			if (dev_alloc(c, &c->pf_work, (size_t)need, err))
				return err->code;
			c->pf_work_bytes = need;
			c->pf_plan_valid = 0;
		}
		/* the tile list depends on the batch only: layer 0 makes it, the others reuse it */
		const struct fp4s_attn_prefill_tune tune = {0, c->pf_plan_valid, 0, 0};
		int rc = fp4s_cuda_attention_prefill_ex(q, (const char *)c->kc + layer_off,
		                                        (const char *)c->vc + layer_off, c->kv_dtype, c->d_pos, c->d_seq,
		                                        c->d_table, c->table_stride, b->n, p->n_heads,
		                                        p->n_kv_heads, p->head_dim, p->window, p->sinks, p->scale,
		                                        c->pf_work, out, &tune, c->s, err);
		if (rc != FP4S_EUNSUPPORTED) {
			c->pf_plan_valid = rc == FP4S_OK;
			return rc;
		}
	}
	int32_t splits;
	float *work;
	int rc = attn_work(c, b, p, &splits, &work, err);
	if (rc)
		return rc;
	return fp4s_cuda_attention(q, (const char *)c->kc + layer_off, (const char *)c->vc + layer_off,
	                           c->kv_dtype, c->d_pos, c->d_seq, c->d_table, c->table_stride, b->n,
	                           p->n_heads, p->n_kv_heads, p->head_dim, p->window,
	                           p->sinks, p->scale, splits, work, out, c->s, err);
}

/* q/k per-head RMSNorm, RoPE, the KV write and attention in one kernel (decode steps; see
 * fp4s_cuda_attention_fused). FP4S_EUNSUPPORTED with nothing enqueued where it does not apply;
 * FP4S_FUSED_ATTN=0 turns it off (diagnostics). */
static int cu_rope_attention(struct fp4s_backend *be, int32_t layer, float *q, float *k, float *v, const float *qn,
                             const float *kn, float eps, enum fp4s_norm_kind kind, const struct fp4s_batch *b,
                             int32_t rot_dim, const float *inv_freq, float mscale, const struct fp4s_attn_params *p,
                             float *out, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	static int off = -1;
	if (env_off("FP4S_FUSED_ATTN", &off) || !kv_ready(c, layer, p) || c->pf_step || !c->one_per_seq ||
	    (c->kv_dtype != FP4S_KV_BF16 && c->kv_dtype != FP4S_KV_FP8) ||
	    (kind != FP4S_NORM_PLAIN && kind != FP4S_NORM_ZERO_CENTRED))
		return FP4S_EUNSUPPORTED;
	int32_t splits;
	float *work;
	int rc = attn_work(c, b, p, &splits, &work, err);
	if (rc)
		return rc;
	const size_t layer_off = kv_layer_off(c, layer);
	const struct fp4s_attn_prologue pro = {k, v, qn, kn, eps, kind == FP4S_NORM_ZERO_CENTRED, rot_dim, inv_freq, mscale};
	return fp4s_cuda_attention_fused(q, (char *)c->kc + layer_off, (char *)c->vc + layer_off, c->kv_dtype, c->d_pos,
	                                 c->d_seq, c->d_table, c->table_stride, b->n, p->n_heads, p->n_kv_heads,
	                                 p->head_dim, p->window, p->sinks, p->scale, splits, work, out, &pro, NULL, c->s,
	                                 err);
}

/* The split count and partials buffer of a split-K attention call. One-token steps use a split
 * count fixed by the cache size and a buffer that never moves, so a captured graph stays valid;
 * other shapes size both to the batch. */
static int attn_work(struct cuda_impl *c, const struct fp4s_batch *b, const struct fp4s_attn_params *p,
                     int32_t *splits_out, float **work_out, struct fp4s_error *err)
{
	int32_t splits;
	float *work;
	if (b->n == 1) {
		const int64_t need = fp4s_cuda_attention_work_floats(1, p->n_heads, p->n_kv_heads, p->head_dim,
		                                                     ATT_MAX_SPLITS);
		if (!c->work1 && dev_alloc(c, (void **)&c->work1, (size_t)need * sizeof(float), err))
			return err->code;
		splits = attn_splits(c, 1, p->n_kv_heads, c->max_ctx);
		work = c->work1;
	} else {
		splits = attn_splits(c, b->n, p->n_kv_heads, c->max_ctx);
		const int64_t need = fp4s_cuda_attention_work_floats(b->n, p->n_heads, p->n_kv_heads, p->head_dim, splits);
		if (need > c->workn_floats) {
			cudaFree(c->workn);
			c->workn = NULL;
			c->workn_floats = 0;
			if (dev_alloc(c, (void **)&c->workn, (size_t)need * sizeof(float), err))
				return err->code;
			c->workn_floats = need;
		}
		work = c->workn;
	}
	*splits_out = splits;
	*work_out = work;
	return FP4S_OK;
}

static void cu_swiglu(struct fp4s_backend *be, const float *gate, const float *up, int64_t n,
                      int64_t inter, float *out)
{
	pdl_launch(swiglu_kernel, dim3(grid1(n * inter)), 256, 0, impl_of(be)->s, gate, up, n * inter, out);
}

/* Picks the k largest of v[n] into idx (descending; ties to the lower index), as the CPU does. */
static void topk(const float *v, int32_t n, int32_t k, int32_t *idx)
{
	for (int32_t j = 0; j < k; j++) {
		int32_t best = -1;
		for (int32_t e = 0; e < n; e++) {
			int taken = 0;
			for (int32_t q = 0; q < j; q++)
				taken |= idx[q] == e;
			if (!taken && (best < 0 || v[e] > v[best]))
				best = e;
		}
		idx[j] = best;
	}
}

static int moe_reserve(struct cuda_impl *c, int64_t n, int32_t E, int64_t I, int64_t H,
                       struct fp4s_error *err)
{
	if (n <= c->moe_cap_tokens && E <= c->moe_cap_experts && I <= c->moe_cap_inter && H <= c->moe_cap_hidden)
		return FP4S_OK;
	cudaFree(c->moe_logits), cudaFree(c->moe_h1), cudaFree(c->moe_h2), cudaFree(c->moe_a), cudaFree(c->moe_o);
	free(c->host_logits);
	c->moe_logits = c->moe_h1 = c->moe_h2 = c->moe_a = c->moe_o = NULL;
	c->host_logits = (float *)malloc((size_t)(n * E) * sizeof(float));
	int rc;
	if (!c->host_logits)
		return fp4s_error_set(err, FP4S_ENOMEM, "moe: out of host memory");
	if ((rc = dev_alloc(c, (void **)&c->moe_logits, (size_t)(n * E) * 4, err)) ||
	    (rc = dev_alloc(c, (void **)&c->moe_h1, (size_t)(2 * I) * 4, err)) ||
	    (rc = dev_alloc(c, (void **)&c->moe_h2, (size_t)(2 * I) * 4, err)) ||
	    (rc = dev_alloc(c, (void **)&c->moe_a, (size_t)I * 4, err)) ||
	    (rc = dev_alloc(c, (void **)&c->moe_o, (size_t)H * 4, err)))
		return rc;
	c->moe_cap_tokens = n, c->moe_cap_experts = E, c->moe_cap_inter = I, c->moe_cap_hidden = H;
	return FP4S_OK;
}

/* gate|up of the selected experts: tensor cores where the format allows */
static int expert_gu(struct cuda_impl *c, struct cu_moe *m, const int32_t *idx, int32_t slots, const float *x,
                     int32_t x_div, int64_t x_stride, float *h, struct fp4s_error *err)
{
	int rc = fp4s_gemv_mma_experts(&m->gu, idx, slots, x, x_div, x_stride, 0, 0.0f, 0.0f, h, c->s, err);
	if (rc == FP4S_EUNSUPPORTED)
		rc = fp4s_cuda_expert_matmul(&m->gu, idx, slots, x, x_div, x_stride, h, c->s, err);
	return rc;
}

/* down of the selected experts, then y (+)= their weighted sum: the tensor-core kernel computes
 * SwiGLU while staging its input; else act + matmul */
static int expert_down(struct cuda_impl *c, struct cu_moe *m, const struct fp4s_moe_params *p, const int32_t *idx,
                       const float *w, int32_t slots, const float *h, float *a, float *o, int32_t n, int accumulate,
                       float *y, struct fp4s_error *err)
{
	const int64_t I = p->inter, H = p->hidden;
	int rc = fp4s_gemv_mma_experts(&m->down, idx, slots, h, 1, 2 * I, m->interleaved ? 2 : 1, p->swiglu_alpha,
	                               p->swiglu_limit, o, c->s, err);
	if (rc == FP4S_EUNSUPPORTED &&
	    (!(rc = fp4s_cuda_moe_act(h, slots, I, m->interleaved, p->swiglu_alpha, p->swiglu_limit, a, c->s, err))))
		rc = fp4s_cuda_expert_matmul(&m->down, idx, slots, a, 1, I, o, c->s, err);
	if (rc)
		return rc;
	return fp4s_cuda_moe_combine(o, w, NULL, n, p->top_k, H, accumulate, y, c->s, err);
}

/* Grows the shared batch buffers to n tokens where needed and points m's batch fields at them. */
static int moe_batch_bufs(struct cuda_impl *c, struct cu_moe *m, const struct fp4s_moe_params *p, int64_t n,
                          struct fp4s_error *err)
{
	const int64_t K = p->top_k, I = p->inter, H = p->hidden, E = p->n_experts, nk = n * K;
	const int64_t nz = fp4s_cuda_moe_group_count((int32_t)nk, (int32_t)E, 1);
	size_t need[MB_COUNT];
	need[MB_IDX] = need[MB_W] = need[MB_GPOS] = need[MB_GSRC] = (size_t)nk * 4;
	need[MB_H] = (size_t)(nk * 2 * I) * 4;
	need[MB_A] = (size_t)(nk * I) * 4;
	need[MB_O] = (size_t)(nk * H) * 4;
	need[MB_LG] = (size_t)(n * E) * 4;
	need[MB_XB] = fp4s_moe_gemm_scratch_bytes((int32_t)nk, H, I);
	need[MB_GEXP] = need[MB_GOFF] = need[MB_GM] = (size_t)nz * 4;
	struct cu_moe_bufs *b = &c->moeb;
	for (int i = 0; i < MB_COUNT; i++) {
		if (need[i] <= b->bytes[i])
			continue;
		cudaFree(b->p[i]);
		b->p[i] = NULL;
		b->bytes[i] = 0;
		int rc = dev_alloc(c, &b->p[i], need[i], err);
		if (rc)
			return rc;
		b->bytes[i] = need[i];
	}
	m->idxn = (int32_t *)b->p[MB_IDX], m->wn = (float *)b->p[MB_W], m->hn = (float *)b->p[MB_H];
	m->an = (float *)b->p[MB_A], m->on = (float *)b->p[MB_O], m->lgn = (float *)b->p[MB_LG];
	m->xbn = b->p[MB_XB];
	m->gpos = (int32_t *)b->p[MB_GPOS], m->gsrc = (int32_t *)b->p[MB_GSRC], m->gexp = (int32_t *)b->p[MB_GEXP];
	m->goff = (int32_t *)b->p[MB_GOFF], m->gm = (int32_t *)b->p[MB_GM];
	return FP4S_OK;
}

static int moe_on_device(struct fp4s_backend *be, const struct fp4s_moe_params *p, const float *x, int64_t n,
                         int accumulate, float *y, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	struct cu_moe *m = (struct cu_moe *)p->dev;
	const int64_t K = p->top_k, I = p->inter, H = p->hidden, E = p->n_experts;
	int32_t *idx = m->idx1;
	float *w = m->w1, *h = m->h1, *a = m->a1, *o = m->o1, *lg = m->lg1;
	int rc;
	if (n > 1) {
		/* larger batches: the shared growable buffers (one-token steps keep theirs fixed for graphs) */
		if ((rc = moe_batch_bufs(c, m, p, n, err)))
			return rc;
		idx = m->idxn, w = m->wn, h = m->hn, a = m->an, o = m->on, lg = m->lgn;
	}
	const int32_t slots = (int32_t)(n * K);
	if ((rc = fp4s_cuda_matmul(&p->router, x, (int32_t)n, lg, c->s, err)) ||
	    (rc = fp4s_cuda_moe_route(lg, (int32_t)n, (int32_t)E, (int32_t)K,
	                              p->router_kind == FP4S_ROUTER_SOFTMAX_TOPK ? 0 : 1, p->norm_topk, idx, w,
	                              c->s, err)))
		return rc;
	/* prompts and large batches: slots grouped by expert in tiles of the tensor-core GEMM, each
	 * expert read once per tile of up to 256 tokens (moe_gemm.cu). As for the dense GEMM: never
	 * where the backend must keep activations exact (gemm_min_tokens 0), every batch at 1. */
	const int gmode = be->gemm_min_tokens <= 0 ? 0 : be->gemm_min_tokens == 1 ? 2 : 1;
	const int bt = n > 1 && E <= 4096 ? fp4s_moe_gemm_tile(&m->gu, &m->down, slots, (int32_t)E, gmode) : 0;
	if (bt > 0) {
		const int32_t nz = fp4s_cuda_moe_group_count(slots, (int32_t)E, bt);
		if ((rc = fp4s_cuda_moe_group(idx, slots, (int32_t)K, (int32_t)E, bt, m->gpos, m->gsrc, m->gexp, m->goff,
		                              m->gm, c->s, err)) ||
		    (rc = fp4s_moe_gemm(&m->gu, &m->down, m->gexp, m->goff, m->gm, nz, bt, x, m->gsrc, slots, m->interleaved,
		                        p->swiglu_alpha, p->swiglu_limit, h, m->xbn, o, c->s, err)))
			return rc;
		return fp4s_cuda_moe_combine(o, w, m->gpos, (int32_t)n, (int32_t)K, H, accumulate, y, c->s, err);
	}
	/* batches: slots grouped by expert, so each expert's weights are read once per group of up to
	 * 8 tokens rather than once per token (decode of many sequences) */
	const int gmax = n > 1 && E <= 4096 && fp4s_gemv_mma_allowed() ? fp4s_gemv_mma_group_max(&m->gu, &m->down) : 0;
	if (gmax > 0) {
		const int32_t nz = fp4s_cuda_moe_group_count(slots, (int32_t)E, gmax);
		if ((rc = fp4s_cuda_moe_group(idx, slots, (int32_t)K, (int32_t)E, gmax, m->gpos, m->gsrc, m->gexp, m->goff,
		                              m->gm, c->s, err)))
			return rc;
		rc = fp4s_gemv_mma_grouped(&m->gu, m->gexp, m->goff, m->gm, nz, gmax, x, m->gsrc, H, 0, 0.0f, 0.0f, h, c->s,
		                           err);
		if (rc == FP4S_OK)
			rc = fp4s_gemv_mma_grouped(&m->down, m->gexp, m->goff, m->gm, nz, gmax, h, NULL, 2 * I,
			                           m->interleaved ? 2 : 1, p->swiglu_alpha, p->swiglu_limit, o, c->s, err);
		if (rc == FP4S_OK)
			return fp4s_cuda_moe_combine(o, w, m->gpos, (int32_t)n, (int32_t)K, H, accumulate, y, c->s, err);
		if (rc != FP4S_EUNSUPPORTED)
			return rc;
		/* declined (format, shape): the per-slot kernels below; the gate|up launch, if it ran,
		 * is simply redone */
	}
	if ((rc = expert_gu(c, m, idx, slots, x, (int32_t)K, H, h, err)))
		return rc;
	return expert_down(c, m, p, idx, w, slots, h, a, o, (int32_t)n, accumulate, y, err);
}

/* h += moe(rmsnorm(h; nw)) for one token (backend.h norm_moe_add): norm, router and top-k in one
 * kernel (which also writes the normalized token, or leaves the norm to the gate|up GEMV), the
 * gate|up GEMV, the down GEMV doing the combine (FP4S_MOE_FUSED, moe_cuda.h): 3 launches instead
 * of 6. The small kernels it replaces move little; what they cost is their place in the chain. */
static int cu_norm_moe_add(struct fp4s_backend *be, const struct fp4s_moe_params *p, float *h, const float *nw,
                           float eps, enum fp4s_norm_kind kind, int64_t n, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	struct cu_moe *m = (struct cu_moe *)p->dev;
	const int mode = fp4s_cuda_moe_fused();
	if (!m || n != 1 || mode == 0 || !fp4s_gemv_mma_allowed() || p->router.rows != p->n_experts ||
	    p->router.cols != p->hidden)
		return FP4S_EUNSUPPORTED;
	const int32_t K = p->top_k;
	const int64_t I = p->inter, H = p->hidden;
	const int zc = kind == FP4S_NORM_ZERO_CENTRED;
	int rc = fp4s_cuda_norm_route(&p->router, K, p->router_kind == FP4S_ROUTER_SOFTMAX_TOPK ? 0 : 1, p->norm_topk,
	                              h, nw, eps, zc, m->lg1, m->cnt, m->idx1, m->w1, mode >= 3 ? m->x1 : NULL, c->s, err);
	if (rc)
		return rc; /* FP4S_EUNSUPPORTED: nothing enqueued yet */
	if (mode >= 3)
		rc = expert_gu(c, m, m->idx1, K, m->x1, K, H, m->h1, err);
	else
		rc = fp4s_gemv_mma_experts_ex(&m->gu, m->idx1, K, h, K, H, 0, 0.0f, 0.0f, nw, eps, zc, NULL, NULL, m->h1,
		                              c->s, err);
	if (rc == FP4S_EUNSUPPORTED) {
		/* the routing is enqueued: go on through a normalized copy */
		cu_rmsnorm(be, h, nw, 1, H, eps, kind, m->x1);
		rc = expert_gu(c, m, m->idx1, K, m->x1, K, H, m->h1, err);
	}
	if (rc)
		return rc;
	if (mode == 4) {
		/* the SwiGLU as a kernel of its own, so each down block stages I floats, not 2 I plus
		 * the exponentials (as the dense MLP, where that measured faster) */
		rc = fp4s_cuda_moe_act(m->h1, K, I, m->interleaved, p->swiglu_alpha, p->swiglu_limit, m->a1, c->s, err);
		if (!rc)
			rc = fp4s_gemv_mma_experts_ex(&m->down, m->idx1, K, m->a1, 1, I, 0, 0.0f, 0.0f, NULL, 0.0f, 0, m->w1, h,
			                              m->o1, c->s, err);
		if (rc != FP4S_EUNSUPPORTED)
			return rc;
		return expert_down(c, m, p, m->idx1, m->w1, K, m->h1, m->a1, m->o1, 1, 1, h, err);
	}
	if (mode >= 2) {
		rc = fp4s_gemv_mma_experts_ex(&m->down, m->idx1, K, m->h1, 1, 2 * I, m->interleaved ? 2 : 1,
		                              p->swiglu_alpha, p->swiglu_limit, NULL, 0.0f, 0, m->w1, h, m->o1, c->s, err);
		if (rc != FP4S_EUNSUPPORTED)
			return rc;
	}
	return expert_down(c, m, p, m->idx1, m->w1, K, m->h1, m->a1, m->o1, 1, 1, h, err);
}

/* h += moe(x): the combine adds into the residual (experts on the device only) */
static int cu_moe_add(struct fp4s_backend *be, const struct fp4s_moe_params *p, const float *x, int64_t n, float *h,
                      struct fp4s_error *err)
{
	if (!p->dev)
		return FP4S_EUNSUPPORTED;
	return moe_on_device(be, p, x, n, 1, h, err);
}

static int cu_moe(struct fp4s_backend *be, const struct fp4s_moe_params *p, const float *x, int64_t n,
                  float *y, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	if (p->dev)
		return moe_on_device(be, p, x, n, 0, y, err);
	const int32_t E = p->n_experts, K = p->top_k;
	const int64_t H = p->hidden, I = p->inter;
	if (K <= 0 || K > E || K > 64 || E > 4096)
		return fp4s_error_set(err, FP4S_EINVAL, "moe: top-k %d of %d experts", K, E);
	int rc = moe_reserve(c, n, E, I, H, err);
	if (rc || (rc = cu_matmul(be, x, n, &p->router, c->moe_logits, err)) ||
	    (rc = cu_read(be, c->host_logits, c->moe_logits, n * E * (int64_t)sizeof(float), err)))
		return rc;
	for (int64_t t = 0; t < n; t++) {
		const float *l = c->host_logits + t * E;
		int32_t idx[64];
		float w[64];
		if (p->router_kind == FP4S_ROUTER_SOFTMAX_TOPK) {
			float m = -INFINITY, s = 0;
			float *prob = (float *)malloc((size_t)E * sizeof(float));
			if (!prob)
				return fp4s_error_set(err, FP4S_ENOMEM, "moe: out of host memory");
			for (int32_t e = 0; e < E; e++)
				m = fmaxf(m, l[e]);
			for (int32_t e = 0; e < E; e++)
				s += prob[e] = expf(l[e] - m);
			for (int32_t e = 0; e < E; e++)
				prob[e] /= s;
			topk(prob, E, K, idx);
			float sum = 0;
			for (int32_t j = 0; j < K; j++)
				sum += w[j] = prob[idx[j]];
			if (p->norm_topk)
				for (int32_t j = 0; j < K; j++)
					w[j] /= sum;
			free(prob);
		} else {
			topk(l, E, K, idx);
			float m = l[idx[0]], s = 0;
			for (int32_t j = 0; j < K; j++)
				s += w[j] = expf(l[idx[j]] - m);
			for (int32_t j = 0; j < K; j++)
				w[j] /= s;
		}
		for (int32_t j = 0; j < K; j++) {
			const struct fp4s_expert *ex = &p->experts[idx[j]];
			if (p->oai_swiglu) {
				if ((rc = cu_matmul(be, x + t * H, 1, &ex->gate_up, c->moe_h1, err)))
					return rc;
				pdl_launch(swiglu_oai_kernel, dim3(grid1(I)), 256, 0, c->s, c->moe_h1, I, p->swiglu_alpha,
					p->swiglu_limit, c->moe_a);
			} else {
				if ((rc = cu_matmul(be, x + t * H, 1, &ex->gate, c->moe_h1, err)) ||
				    (rc = cu_matmul(be, x + t * H, 1, &ex->up, c->moe_h2, err)))
					return rc;
				pdl_launch(swiglu_kernel, dim3(grid1(I)), 256, 0, c->s, c->moe_h1, c->moe_h2, I, c->moe_a);
			}
			if ((rc = cu_matmul(be, c->moe_a, 1, &ex->down, c->moe_o, err)))
				return rc;
			pdl_launch(axpy_kernel, dim3(grid1(H)), 256, 0, c->s, y + t * H, c->moe_o, w[j], H, j == 0);
		}
	}
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

static void cu_graph_reset(struct fp4s_backend *be)
{
	struct cuda_impl *c = impl_of(be);
	for (int32_t i = 0; i < c->n_graphs; i++)
		cudaGraphExecDestroy(c->graphs[i].exec);
	c->n_graphs = 0;
}

static int cu_graph_run(struct fp4s_backend *be, int key, int (*record)(void *ctx, struct fp4s_error *err),
                        void *ctx, struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	for (int32_t i = 0; i < c->n_graphs; i++)
		if (c->graphs[i].key == key) {
			FP4S_CUDA_TRY(err, cudaGraphLaunch(c->graphs[i].exec, c->s));
			return FP4S_OK;
		}
	if (c->n_graphs == 8)
		return record(ctx, err); /* no room: run uncaptured */
	/* relaxed: the kernels' first launches may set function attributes while capturing */
	FP4S_CUDA_TRY(err, cudaStreamBeginCapture(c->s, cudaStreamCaptureModeRelaxed));
	int rc = record(ctx, err);
	cudaGraph_t g = NULL;
	cudaError_t e = cudaStreamEndCapture(c->s, &g);
	if (rc) {
		if (g)
			cudaGraphDestroy(g);
		return rc;
	}
	if (e != cudaSuccess)
		return fp4s_error_set(err, FP4S_ECUDA, "graph capture: %s", cudaGetErrorString(e));
	cudaGraphExec_t exec;
	e = cudaGraphInstantiate(&exec, g, 0);
	cudaGraphDestroy(g);
	if (e != cudaSuccess)
		return fp4s_error_set(err, FP4S_ECUDA, "graph instantiate: %s", cudaGetErrorString(e));
	c->graphs[c->n_graphs].key = key;
	c->graphs[c->n_graphs++].exec = exec;
	FP4S_CUDA_TRY(err, cudaGraphLaunch(exec, c->s));
	return FP4S_OK;
}

static int cu_argmax(struct fp4s_backend *be, const float *logits, int32_t n, int64_t vocab, int32_t *out,
                     struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	if (n > 1024)
		return fp4s_error_set(err, FP4S_EINVAL, "argmax: %d rows", n);
	if (!c->d_argmax) {
		/* [1024] results, then [1024 * PARTS] values and indices */
		int rc = dev_alloc(c, (void **)&c->d_argmax, 1024 * (1 + 2 * ARGMAX_PARTS) * sizeof(int32_t), err);
		if (rc)
			return rc;
	}
	float *pv = (float *)(c->d_argmax + 1024);
	int32_t *pi = c->d_argmax + 1024 + 1024 * ARGMAX_PARTS;
	pdl_launch(argmax_part_kernel, dim3(ARGMAX_PARTS, (unsigned)n), 256, 0, c->s, logits, vocab, pv, pi);
	pdl_launch(argmax_final_kernel, dim3(n), 64, 0, c->s, pv, pi, c->d_argmax);
	return cu_read(be, out, c->d_argmax, (int64_t)n * (int64_t)sizeof(int32_t), err);
}

static void cu_destroy(struct fp4s_backend *be)
{
	if (!be)
		return;
	struct cuda_impl *c = impl_of(be);
	if (c) {
		for (int32_t i = 0; i < c->n_allocs; i++)
			cudaFree(c->allocs[i]);
		free(c->allocs);
		cudaFree(c->kc), cudaFree(c->vc), cudaFree(c->d_tok), cudaFree(c->d_pos), cudaFree(c->d_seq);
		cudaFree(c->moe_logits), cudaFree(c->moe_h1), cudaFree(c->moe_h2), cudaFree(c->moe_a),
			cudaFree(c->moe_o);
		free(c->host_logits);
		cudaFree(c->d_argmax);
		cudaFree(c->work1), cudaFree(c->workn), cudaFree(c->d_table), cudaFree(c->pf_work);
		for (struct cu_moe *m = c->moes, *nx; m; m = nx) {
			nx = m->next;
			free(m); /* its batch buffers are views of c->moeb */
		}
		for (int i = 0; i < MB_COUNT; i++)
			cudaFree(c->moeb.p[i]);
		cu_graph_reset(be);
		if (c->s)
			cudaStreamDestroy(c->s);
		free(c);
	}
	free(be);
}

extern "C" int fp4s_backend_cuda_create(int dev, struct fp4s_backend **out, struct fp4s_error *err)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		cudaGetLastError();
		return fp4s_error_set(err, FP4S_ENODEV, "no CUDA device (use --backend cpu)");
	}
	if (dev < 0 || dev >= n)
		return fp4s_error_set(err, FP4S_ENODEV, "CUDA device %d does not exist (%d found)", dev, n);
	FP4S_CUDA_TRY(err, cudaSetDevice(dev));
	struct fp4s_backend *be = (struct fp4s_backend *)calloc(1, sizeof *be);
	struct cuda_impl *c = (struct cuda_impl *)calloc(1, sizeof *c);
	if (!be || !c) {
		free(be), free(c);
		return fp4s_error_set(err, FP4S_ENOMEM, "cuda backend: out of memory");
	}
	c->dev = dev;
	cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, dev);
	cudaError_t e = cudaStreamCreateWithFlags(&c->s, cudaStreamNonBlocking);
	if (e != cudaSuccess) {
		free(be), free(c);
		return fp4s_error_set(err, FP4S_ECUDA, "cudaStreamCreate: %s", cudaGetErrorString(e));
	}
	be->name = "cuda";
	be->impl = c;
	be->gemm_min_tokens = 32;
	be->kv_init = cu_kv_init;
	be->kv_clear = cu_kv_clear;
	be->alloc = cu_alloc;
	be->free = cu_free;
	be->destroy = cu_destroy;
	be->upload_mat = cu_upload_mat;
	be->upload_f32 = cu_upload_f32;
	be->upload_fused = cu_upload_fused;
	be->upload_moe = cu_upload_moe;
	be->begin = cu_begin;
	be->read = cu_read;
	be->gather_rows = cu_gather_rows;
	be->graph_run = cu_graph_run;
	be->graph_reset = cu_graph_reset;
	be->argmax = cu_argmax;
	be->embed = cu_embed;
	be->matmul = cu_matmul;
	be->rmsnorm = cu_rmsnorm;
	be->add = cu_add;
	be->rope = cu_rope;
	be->attention = cu_attention;
	be->norm_matmul = cu_norm_matmul;
	be->matmul_add = cu_matmul_add;
	be->norm_rope = cu_norm_rope;
	be->rope_attention = cu_rope_attention;
	be->norm_matmul_swiglu = cu_norm_matmul_swiglu;
	be->moe_add = cu_moe_add;
	be->norm_moe_add = cu_norm_moe_add;
	be->swiglu_matmul_add = cu_swiglu_matmul_add;
	be->swiglu = cu_swiglu;
	be->moe = cu_moe;
	*out = be;
	return FP4S_OK;
}
