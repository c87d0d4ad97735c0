/* cuda_backend.cu: backend.h on one GPU. Weights are uploaded in their checkpoint format (packed
 * E2M1 + scales stay packed); activations are FP32 in device memory; the KV cache is a pool of
 * blocks [layer][block][FP4S_KV_BLOCK][kv_width] of FP32, BF16 or E4M3 (fp4s_kv_dtype).
 *
 * Matmuls go through fp4s_cuda_matmul (gemv_cuda.h, bandwidth-bound decode kernels). The other
 * ops are plain kernels checked end to end against the CPU reference (test_golden_cuda). A decode
 * step of one token is captured once as a CUDA graph and replayed (graph_run). The MoE ops are in
 * cuda_moe.cu; the state both files share is in cuda_impl.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
extern "C" {
#include "util/progress.h"
}
#include "backend/cuda/attention_cuda.h"
#include "backend/cuda/attention_prefill_cuda.h"
#include "backend/cuda/gemv_mma.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/swiglu.cuh"
#include "backend/cuda/gemm_cuda.h"
#include "backend/cuda/gemv_cuda.h"
#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/moe_cuda.h"
#include "backend/cuda/cuda_impl.h"
#include "numerics/numerics.h"

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
	case FP4S_WF_NVFP4: { /* codes in the device's permuted words (numerics.h), rows whole words */
		const uint32_t code = fp4s_e2m1_perm_code(((const uint32_t *)data)[i >> 3], (int)(i & 7));
		return fp4s_e2m1_to_f32(code) * fp4s_e4m3_to_f32(scales[r * (K / 16) + c / 16]);
	}
	default: {
		const uint32_t code = fp4s_e2m1_perm_code(((const uint32_t *)data)[i >> 3], (int)(i & 7));
		return fp4s_e2m1_to_f32(code) * fp4s_e8m0_to_f32(scales[r * (K / 32) + c / 32]);
	}
	}
}

static __global__ void embed_kernel(int fmt, const void *data, const uint8_t *scales, float ws2,
                                    int64_t K, const int32_t *tok, float *out)
{
	TL_SCOPE(TL_EMBED, __LINE__);
	pdl_enter();
	TL_MARK(1);
	const int32_t i = blockIdx.x;
	for (int64_t c = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; c < K; c += (int64_t)gridDim.y * blockDim.x)
		out[(int64_t)i * K + c] = w_elem(fmt, data, scales, K, tok[i], c) * ws2;
}

/* One block per row, the row held in registers (float4 per thread, up to 4 each): a decode step
 * normalizes a single 4096-wide row, so latency, not bandwidth, decides; one pass of wide loads
 * with many threads in flight keeps it a few microseconds. */
#define NORM_VEC 4
static __global__ void rmsnorm_kernel(const float *x, const float *w, int64_t width, float eps,
                                      int zero_centred, float *y)
{
	TL_SCOPE(TL_RMSNORM, __LINE__);
	pdl_enter();
	TL_MARK(1);
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
	TL_SCOPE(TL_SMALL, __LINE__);
	pdl_enter();
	TL_MARK(1);
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
		x[i] += y[i];
}

/* grid: (tokens, heads of q then k); one thread per rotary pair */
static __global__ void rope_kernel(float *q, float *k, const int32_t *pos, int32_t nh, int32_t nkv,
                                   int32_t d, int32_t rot, const float *inv_freq, float mscale)
{
	TL_SCOPE(TL_SMALL, __LINE__);
	pdl_enter();
	TL_MARK(1);
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
	TL_SCOPE(TL_SMALL, __LINE__);
	pdl_enter();
	TL_MARK(1);
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
	TL_SCOPE(TL_SMALL, __LINE__);
	pdl_enter();
	TL_MARK(1);
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
	TL_SCOPE(TL_SMALL, __LINE__);
	pdl_enter();
	TL_MARK(1);
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
		out[i] = silu_mul(g[i], u[i]);
}

/* out[i] = silu(gu[2i]) * gu[2i + 1]: a pairs matrix's output (gate, up alternating) */
static __global__ void swiglu_pairs_kernel(const float2 *gu, int64_t n, float *out)
{
	TL_SCOPE(TL_SMALL, __LINE__);
	pdl_enter();
	TL_MARK(1);
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		const float2 p = gu[i];
		out[i] = silu_mul(p.x, p.y);
	}
}

/* ---- host glue ---------------------------------------------------------------------------- */

int cu_track(struct cuda_impl *c, void *p, struct fp4s_error *err)
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

int cu_dev_alloc(struct cuda_impl *c, void **p, size_t bytes, struct fp4s_error *err)
{
	cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
	if (e != cudaSuccess)
		return fp4s_error_set(err, FP4S_ENOMEM, "cuda: cannot allocate %.1f MB on the GPU: %s",
		                      (double)bytes / 1e6, cudaGetErrorString(e));
	return FP4S_OK;
}

static int cu_alloc(struct fp4s_backend *be, void **p, int64_t bytes, struct fp4s_error *err)
{
	return cu_dev_alloc(impl_of(be), p, (size_t)bytes, err);
}

static void cu_free(struct fp4s_backend *be, void *p) { cudaFree(p); }

#ifdef FP4S_DIAG_TL
extern "C" void fp4s_tl_before(cudaStream_t s);
extern "C" void fp4s_tl_after(cudaStream_t s);
#endif

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
	fp4s_gemv_tma_groups(c->moes != NULL); /* a model with device experts: every GEMV on one kernel */
	if (!rc)
		rc = cu_dev_alloc(c, (void **)&c->kc, n * es, err);
	if (!rc)
		rc = cu_dev_alloc(c, (void **)&c->vc, n * es, err);
	if (!rc)
		rc = cu_dev_alloc(c, (void **)&c->d_table, (size_t)max_seqs * c->table_stride * sizeof(int32_t), err);
	/* zeroed, as its host mirror starts (cuda_io.cu uploads only the rows that differ) */
	if (!rc && cudaMemset(c->d_table, 0, (size_t)max_seqs * c->table_stride * sizeof(int32_t)) != cudaSuccess)
		rc = fp4s_error_set(err, FP4S_ECUDA, "cuda: cannot clear the block table");
	cu_io_table_reset(c);
	for (int i = 0; i < 2 && !rc && !c->lk.buf[i]; i++) { /* zeroed: the padding stays zero */
		const size_t lb = fp4s_gemv_link_bytes(CU_LINK_KMAX);
		rc = cu_dev_alloc(c, (void **)&c->lk.buf[i], lb, err);
		if (!rc)
			rc = cu_dev_alloc(c, (void **)&c->lk.ss[i], CU_LINK_KMAX / 16 * sizeof(float), err);
		if (!rc && cudaMemset(c->lk.buf[i], 0, lb) != cudaSuccess)
			rc = fp4s_error_set(err, FP4S_ECUDA, "cuda: cannot clear the staging buffers");
	}
	cu_link_clear(c);
	if (rc)
		return fp4s_error_prefix(err, "kv cache (%d layers x %d blocks of %d positions): ", n_layers,
		                         n_blocks, FP4S_KV_BLOCK);
	c->n_layers = n_layers, c->kv_width = kv_width, c->n_blocks = n_blocks;
	c->max_seqs = max_seqs, c->max_ctx = max_ctx;
	return FP4S_OK;
}

static void cu_kv_clear(struct fp4s_backend *be, int32_t seq) { (void)be, (void)seq; }

static int cu_gather_rows(struct fp4s_backend *be, const float *src, const int32_t *rows, int32_t n,
                          int64_t width, float *dst, struct fp4s_error *err)
{
	cu_link_clear(impl_of(be));
	struct cuda_impl *c = impl_of(be);
	/* a run of consecutive rows in one copy (a decode batch's logits rows: all of them) */
	for (int32_t i = 0, j; i < n; i = j) {
		for (j = i + 1; j < n && rows[j] == rows[j - 1] + 1; j++)
			;
		FP4S_CUDA_TRY(err, cudaMemcpyAsync(dst + (int64_t)i * width, src + (int64_t)rows[i] * width,
		                                   (size_t)(j - i) * (size_t)width * sizeof(float), cudaMemcpyDeviceToDevice,
		                                   c->s));
	}
	return FP4S_OK;
}

static int cu_embed(struct fp4s_backend *be, const struct fp4s_mat *emb, const struct fp4s_batch *b,
                    float *out, struct fp4s_error *err)
{
	cu_link_clear(impl_of(be));
	struct cuda_impl *c = impl_of(be);
	const float ws2 = emb->fmt == FP4S_WF_NVFP4 ? emb->ws2 : 1.0f;
	/* a row over up to 16 blocks: one block's dependent load and store per element took 7.4 us
	 * for a 4096-wide row (the stores may alias the loads, so they do not overlap) */
	const unsigned per = (unsigned)((emb->cols + 255) / 256 < 16 ? (emb->cols + 255) / 256 : 16);
	pdl_launch(embed_kernel, dim3(b->n, per), 256, 0, c->s, (int)emb->fmt, emb->data, emb->scales, ws2, emb->cols,
		c->d_tok, out);
	FP4S_CUDA_TRY(err, cudaGetLastError());
	return FP4S_OK;
}

int cu_matmul(struct fp4s_backend *be, const float *x, int64_t n, const struct fp4s_mat *w, float *y,
              struct fp4s_error *err)
{
	cu_link_clear(impl_of(be));
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

/* The token counts a decode matmul takes the GEMV path for (fewer take the prompt GEMM) */
static int gemv_tokens(const struct fp4s_backend *be, int64_t n)
{
	return n >= 1 && n <= 16 && (be->gemm_min_tokens <= 0 || n < be->gemm_min_tokens);
}

/* The fused decode ops (backend.h): the tensor-core FP4 GEMV with the norm, the SwiGLU or the
 * residual add folded in, for those token counts. */
static int fused_path(const struct fp4s_backend *be, int64_t n, const struct fp4s_mat *w)
{
	return gemv_tokens(be, n) && (w->fmt == FP4S_WF_NVFP4 || w->fmt == FP4S_WF_MXFP4) && fp4s_gemv_mma_allowed();
}

/* Where a dense MLP's decode SwiGLU runs where gate and up are not uploaded as pairs
 * (FP4S_GU_PAIRS=0, cuda_upload.cu; with pairs it is the gate|up epilogue's): 0 (default) its own kernel,
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

/* The staged hand-over (cuda_impl.h's lk, gemv_mma.h's fp4s_gemv_link). FP4S_PRESTAGE=0 turns it
 * off (A/B). */
static int link_on(void)
{
	static int off = -1;
	return !fp4s_env_off("FP4S_PRESTAGE", &off);
}

/* The link for a one-token launch reading x (normalized by nw, zc, where nw is set) over K and
 * writing out_x (K_out elements; times out_nw where set): what the last launch left staged for
 * exactly this, and a buffer for what this one leaves. Returns NULL where there is nothing to
 * hand over either way. */
static struct fp4s_gemv_link *link_for(struct cuda_impl *c, struct fp4s_gemv_link *lk, int64_t n, const float *x,
                                       const float *nw, int zc, int64_t K, int out, const float *out_nw,
                                       int out_zc, int64_t K_out)
{
	const int valid = c->lk.valid;
	c->lk.valid = 0;
	if (n != 1 || !link_on() || !c->lk.buf[0])
		return NULL;
	memset(lk, 0, sizeof *lk);
	if (valid && c->lk.x == x && c->lk.nw == nw && c->lk.K == K && (!nw || c->lk.zc == zc)) {
		lk->in = c->lk.buf[1 - c->lk.next];
		lk->in_ss = c->lk.ss[1 - c->lk.next];
	}
	if (out && K_out <= CU_LINK_KMAX) {
		lk->out = c->lk.buf[c->lk.next];
		lk->out_ss = c->lk.ss[c->lk.next];
		lk->out_nw = out_nw;
		lk->out_zc = out_zc;
	}
	return lk->in || lk->out ? lk : NULL;
}

/* after the launch: what it left staged, for the next op alone */
static void link_done(struct cuda_impl *c, const struct fp4s_gemv_link *lk, const float *out_x, const float *out_nw,
                      int out_zc, int64_t K_out)
{
	if (!lk || !lk->made_out)
		return;
	c->lk.valid = 1;
	c->lk.x = out_x, c->lk.nw = out_nw, c->lk.zc = out_zc, c->lk.K = K_out;
	c->lk.next = 1 - c->lk.next;
}

static void cu_norm_next(struct fp4s_backend *be, const float *h, const float *nw, enum fp4s_norm_kind kind)
{
	struct cuda_impl *c = impl_of(be);
	c->lk.hint_h = nw ? h : NULL;
	c->lk.hint_nw = nw;
	c->lk.hint_zc = kind == FP4S_NORM_ZERO_CENTRED;
}

/* g = SwiGLU of W . rmsnorm(h), W = [gate | up] (fp4s_gemv_mma_norm_swiglu) */
static int cu_norm_matmul_swiglu(struct fp4s_backend *be, const float *h, const float *nw, float eps,
                                 enum fp4s_norm_kind kind, int64_t n, const struct fp4s_mat *w, float *g,
                                 struct fp4s_error *err)
{
	struct cuda_impl *c = impl_of(be);
	const int zc = kind == FP4S_NORM_ZERO_CENTRED;
	if (w->pairs) { /* rows alternate gate, up: the bulk-copy kernel's pair epilogue (gemv_tma.cu) */
		struct fp4s_gemv_link lk0, *lk = link_for(c, &lk0, n, h, nw, zc, w->cols, 1, NULL, 0, w->rows / 2);
		c->lk.hint_h = NULL;
		if (!fused_path(be, n, w))
			return FP4S_EUNSUPPORTED;
		const int rc = fp4s_gemv_mma_norm_pairs_link(w, h, (int32_t)n, g, nw, eps, zc, lk, c->s, err);
		if (!rc)
			link_done(c, lk, g, NULL, 0, w->rows / 2);
		return rc;
	}
	cu_link_clear(c);
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
	struct cuda_impl *c = impl_of(be);
	const int zc = kind == FP4S_NORM_ZERO_CENTRED;
	struct fp4s_gemv_link lk0, *lk = link_for(c, &lk0, n, h, nw, zc, w->cols, 0, NULL, 0, 0);
	c->lk.hint_h = NULL;
	if (fp4s_env_off("FP4S_FUSED_NORM", &off))
		return FP4S_EUNSUPPORTED;
	if (lk && fused_path(be, n, w))
		return fp4s_gemv_mma_fused_link(w, h, (int32_t)n, y, 0, nw, eps, zc, lk, c->s, err);
	if (!fused_path(be, n, w))
		/* dense weights (gpt-oss's BF16 qkv): the norm in gemv_fast's pass over x */
		return gemv_tokens(be, n) ? fp4s_cuda_norm_matmul(w, h, (int32_t)n, y, nw, eps,
		                                                  kind == FP4S_NORM_ZERO_CENTRED, impl_of(be)->s, err)
		                          : FP4S_EUNSUPPORTED;
	return fp4s_gemv_mma_fused(w, h, (int32_t)n, y, 0, 0, nw, eps, kind == FP4S_NORM_ZERO_CENTRED, impl_of(be)->s,
	                           err);
}

static int cu_matmul_add(struct fp4s_backend *be, const float *x, int64_t n, const struct fp4s_mat *w, float *h,
                         struct fp4s_error *err)
{
	static int off = -1;
	struct cuda_impl *c = impl_of(be);
	/* in: x as the launch before left it; out: h for the norm the forward pass said reads it next */
	const float *onw = c->lk.hint_h == h ? c->lk.hint_nw : NULL;
	const int ozc = c->lk.hint_zc;
	const struct fp4s_moe_params *mp = c->mh_h == h ? c->mh_p : NULL; /* (moe_next's hint) */
	c->mh_h = NULL;
	struct fp4s_gemv_link lk0, *lk = link_for(c, &lk0, n, x, NULL, 0, w->cols, onw != NULL, onw, ozc, w->rows);
	c->lk.hint_h = NULL;
	if (lk && fused_path(be, n, w)) {
		const int rc = fp4s_gemv_mma_fused_link(w, x, (int32_t)n, h, 1, NULL, 0.0f, 0, lk, c->s, err);
		if (!rc)
			link_done(c, lk, h, onw, ozc, w->rows);
		return rc;
	}
	if (mp && !fused_path(be, n, w) && n == 1 && !fp4s_env_off("FP4S_FUSED_ADD", &off)) {
		/* the next MoE block's router logits in the same launch, where it routes from them */
		const int rc = cu_moe_matmul_add_route(c, mp, w, x, h, err);
		if (rc != FP4S_EUNSUPPORTED)
			return rc;
	}
	if (!fused_path(be, n, w))
		/* dense weights (gpt-oss's BF16 attention): the add in gemv_fast's store, one launch
		 * a layer fewer; FP4S_EUNSUPPORTED where that kernel does not take them
		 * (FP4S_FUSED_ADD=0: an add kernel of its own) */
		return !fp4s_env_off("FP4S_FUSED_ADD", &off) && gemv_tokens(be, n)
		               ? fp4s_cuda_matmul_add(w, x, (int32_t)n, h, impl_of(be)->s, err)
		               : FP4S_EUNSUPPORTED;
	return fp4s_gemv_mma_fused(w, x, (int32_t)n, h, 1, 0, NULL, 0.0f, 0, impl_of(be)->s, err);
}

static int cu_swiglu_matmul_add(struct fp4s_backend *be, const float *gu, int64_t n, const struct fp4s_mat *w,
                                float *h, struct fp4s_error *err)
{
	cu_link_clear(impl_of(be));
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

void cu_rmsnorm(struct fp4s_backend *be, const float *x, const float *w, int64_t rows, int64_t width, float eps,
                enum fp4s_norm_kind kind, float *y)
{
	cu_link_clear(impl_of(be));
	if (rows > 0)
		pdl_launch(rmsnorm_kernel, dim3((unsigned)rows), norm_threads(width), 0, impl_of(be)->s, x, w, width, eps,
			kind == FP4S_NORM_ZERO_CENTRED, y);
}

static void cu_add(struct fp4s_backend *be, float *x, const float *y, int64_t n)
{
	cu_link_clear(impl_of(be));
	pdl_launch(add_kernel, dim3(grid1(n)), 256, 0, impl_of(be)->s, x, y, n);
}

static void cu_rope(struct fp4s_backend *be, float *q, float *k, const struct fp4s_batch *b, int32_t nh,
                    int32_t nkv, int32_t head_dim, int32_t rot_dim, const float *inv_freq, float mscale)
{
	cu_link_clear(impl_of(be));
	struct cuda_impl *c = impl_of(be);
	pdl_launch(rope_kernel, dim3((unsigned)b->n, (unsigned)(nh + nkv)), 64, 0, c->s,
		q, k, c->d_pos, nh, nkv, head_dim, rot_dim, inv_freq, mscale);
}

static int cu_norm_rope(struct fp4s_backend *be, float *q, float *k, const float *qn, const float *kn, float eps,
                        enum fp4s_norm_kind kind, const struct fp4s_batch *b, int32_t nh, int32_t nkv,
                        int32_t head_dim, int32_t rot_dim, const float *inv_freq, float mscale,
                        struct fp4s_error *err)
{
	cu_link_clear(impl_of(be));
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
	cu_link_clear(impl_of(be));
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
			if (cu_dev_alloc(c, &c->pf_work, (size_t)need, err))
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
	cu_link_clear(impl_of(be));
	struct cuda_impl *c = impl_of(be);
	static int off = -1;
	if (fp4s_env_off("FP4S_FUSED_ATTN", &off) || !kv_ready(c, layer, p) || c->pf_step || !c->one_per_seq ||
	    (c->kv_dtype != FP4S_KV_BF16 && c->kv_dtype != FP4S_KV_FP8) ||
	    (kind != FP4S_NORM_PLAIN && kind != FP4S_NORM_ZERO_CENTRED))
		return FP4S_EUNSUPPORTED;
	static int skip = -1; /* FP4S_DIAG_SKIP_ATTN=1: launch nothing (timing what the rest of a step
	                       * costs; the output is garbage) */
	if (skip < 0) {
		const char *e = getenv("FP4S_DIAG_SKIP_ATTN");
		skip = e && atoi(e) == 1;
	}
	if (skip)
		return FP4S_OK;
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
		if (!c->work1 && cu_dev_alloc(c, (void **)&c->work1, (size_t)need * sizeof(float), err))
			return err->code;
		splits = attn_splits(c, 1, p->n_kv_heads, c->max_ctx);
		work = c->work1;
	} else {
		splits = attn_splits(c, b->n, p->n_kv_heads, c->max_ctx);
		const int64_t need = fp4s_cuda_attention_work_floats(b->n, p->n_heads, p->n_kv_heads, p->head_dim, splits);
		if (need > c->workn_floats) {
			if (cu_graph_before_move(c, "attention", err)) /* decode batches' graphs hold workn */
				return err->code;
			cudaFree(c->workn);
			c->workn = NULL;
			c->workn_floats = 0;
			if (cu_dev_alloc(c, (void **)&c->workn, (size_t)need * sizeof(float), err))
				return err->code;
			c->workn_floats = need;
		}
		work = c->workn;
	}
	*splits_out = splits;
	*work_out = work;
	return FP4S_OK;
}

void cu_swiglu(struct fp4s_backend *be, const float *gate, const float *up, int64_t n, int64_t inter, float *out)
{
	cu_link_clear(impl_of(be));
	pdl_launch(swiglu_kernel, dim3(grid1(n * inter)), 256, 0, impl_of(be)->s, gate, up, n * inter, out);
}

static void cu_swiglu_pairs(struct fp4s_backend *be, const float *gu, int64_t n, int64_t inter, float *out)
{
	cu_link_clear(impl_of(be));
	pdl_launch(swiglu_pairs_kernel, dim3(grid1(n * inter)), 256, 0, impl_of(be)->s,
		reinterpret_cast<const float2 *>(gu), n * inter, out);
}

void cu_graph_reset(struct fp4s_backend *be)
{
	struct cuda_impl *c = impl_of(be);
	for (int32_t i = 0; i < c->n_graphs; i++)
		cudaGraphExecDestroy(c->graphs[i].exec);
	c->n_graphs = 0;
}

int cu_graph_before_move(struct cuda_impl *c, const char *what, struct fp4s_error *err)
{
	cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
	FP4S_CUDA_TRY(err, cudaStreamIsCapturing(c->s, &cap));
	if (cap != cudaStreamCaptureStatusNone)
		return fp4s_error_set(err, FP4S_EINVAL, "%s: a buffer would grow inside a graph capture", what);
	FP4S_CUDA_TRY(err, cudaStreamSynchronize(c->s)); /* in-flight steps still read the old one */
	for (int32_t i = 0; i < c->n_graphs; i++)
		cudaGraphExecDestroy(c->graphs[i].exec);
	c->n_graphs = 0;
	return FP4S_OK;
}

int cu_graph_run(struct fp4s_backend *be, int key, int (*record)(void *ctx, struct fp4s_error *err),
                        void *ctx, struct fp4s_error *err)
{
	cu_link_clear(impl_of(be));
	struct cuda_impl *c = impl_of(be);
	for (int32_t i = 0; i < c->n_graphs; i++)
		if (c->graphs[i].key == key) {
#ifdef FP4S_DIAG_TL
			fp4s_tl_before(c->s);
#endif
			FP4S_CUDA_TRY(err, cudaGraphLaunch(c->graphs[i].exec, c->s));
#ifdef FP4S_DIAG_TL
			fp4s_tl_after(c->s);
#endif
			return FP4S_OK;
		}
	if (c->n_graphs == CU_GRAPHS_MAX)
		return record(ctx, err); /* no room: run uncaptured */
	/* FP4S_GRAPH_LOG=1: each capture's host time on stderr (a first step's latency) */
	static int log = -1;
	if (log < 0) {
		const char *e = getenv("FP4S_GRAPH_LOG");
		log = e && atoi(e) > 0;
	}
	const double t0 = log ? fp4s_now() : 0.0;
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
	if (log)
		fprintf(stderr, "cuda: graph %d captured and instantiated in %.2f ms\n", key, (fp4s_now() - t0) * 1e3);
	FP4S_CUDA_TRY(err, cudaGraphLaunch(exec, c->s));
	return FP4S_OK;
}

static void cu_destroy(struct fp4s_backend *be)
{
	if (!be)
		return;
	struct cuda_impl *c = impl_of(be);
	if (c) {
		cu_mstep_report(c);
		cu_dstep_report(c);
		cu_ostep_report(c);
		for (int32_t i = 0; i < c->n_allocs; i++)
			cudaFree(c->allocs[i]);
		free(c->allocs);
		cudaFree(c->kc), cudaFree(c->vc);
		cu_io_free(c);
		cudaFree(c->d_samp), cudaFreeHost(c->h_samp), cudaFree(c->d_samp_work);
		cu_sample_free(c);
		if (c->s2)
			cudaStreamDestroy(c->s2);
		if (c->sl_fork)
			cudaEventDestroy(c->sl_fork);
		if (c->sl_join)
			cudaEventDestroy(c->sl_join);
		cudaFree(c->work1), cudaFree(c->workn), cudaFree(c->d_table), cudaFree(c->pf_work);
		for (int i = 0; i < 2; i++)
			cudaFree(c->lk.buf[i]), cudaFree(c->lk.ss[i]);
		cu_moe_free(c);
		free(c->ms);
		free(c->ds);
		free(c->os);
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
	/* FP4S_CACHE_CONFIG (diagnostics, A/B): the device's preferred split of L1 and shared
	 * memory for kernels that state none: shared, l1 or equal */
	const char *cc = getenv("FP4S_CACHE_CONFIG");
	if (cc && (!strcmp(cc, "shared") || !strcmp(cc, "l1") || !strcmp(cc, "equal")))
		FP4S_CUDA_TRY(err, cudaDeviceSetCacheConfig(!strcmp(cc, "shared") ? cudaFuncCachePreferShared
		                                             : !strcmp(cc, "l1")   ? cudaFuncCachePreferL1
		                                                                   : cudaFuncCachePreferEqual));
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
	cu_upload_install(be);
	be->begin = cu_begin;
	be->read = cu_read;
	be->gather_rows = cu_gather_rows;
	be->graph_run = cu_graph_run;
	be->graph_reset = cu_graph_reset;
	be->graph_run_argmax = cu_graph_run_argmax;
	be->argmax = cu_argmax;
	be->argmax_launch = cu_argmax_launch;
	be->argmax_wait = cu_argmax_wait;
	be->embed = cu_embed;
	be->matmul = cu_matmul;
	be->rmsnorm = cu_rmsnorm;
	be->add = cu_add;
	be->rope = cu_rope;
	be->attention = cu_attention;
	be->sample = cu_sample;
	be->sample_launch = cu_sample_launch;
	be->graph_run_sample = cu_graph_run_sample;
	be->token_nll = cu_token_nll;
	be->norm_matmul = cu_norm_matmul;
	be->matmul_add = cu_matmul_add;
	be->norm_next = cu_norm_next;
	be->norm_rope = cu_norm_rope;
	be->rope_attention = cu_rope_attention;
	be->norm_matmul_swiglu = cu_norm_matmul_swiglu;
	be->swiglu_matmul_add = cu_swiglu_matmul_add;
	be->swiglu = cu_swiglu;
	be->swiglu_pairs = cu_swiglu_pairs;
	cu_moe_install(be);
	cu_mstep_install(be);
	*out = be;
	return FP4S_OK;
}
