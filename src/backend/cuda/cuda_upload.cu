/* cuda_upload.cu: weights to the device (backend.h upload_mat, upload_f32, upload_fused,
 * upload_gate_up). Weights stay packed (FP4 codes and scales); two things change: the bits of
 * each word of FP4 codes are permuted (e2m1_device.h), and where rows sit: fused projections
 * share one allocation, and a dense MLP's gate and up rows can alternate so that the decode
 * matmul's epilogue sees each (gate, up) pair in one tile. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_impl.h"
#include "backend/cuda/e2m1_device.h"
#include "backend/cuda/gemv_mma.h"
#include "numerics/numerics.h"

static __global__ void e2m1_permute_kernel(uint32_t *w, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		w[i] = fp4s_e2m1_permute_word(w[i]);
}

extern "C" cudaError_t fp4s_cuda_e2m1_permute(void *codes, size_t bytes, cudaStream_t s)
{
	if (bytes % 4 || (uintptr_t)codes % 4)
		return cudaErrorInvalidValue;
	const size_t n = bytes / 4;
	if (!n)
		return cudaSuccess;
	const size_t blocks = (n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096;
	e2m1_permute_kernel<<<(unsigned)blocks, 256, 0, s>>>((uint32_t *)codes, n);
	return cudaGetLastError();
}

int cu_permute_codes(const struct fp4s_mat *m, void *d, size_t bytes, cudaStream_t s, struct fp4s_error *err)
{
	/* The codes came by cudaMemcpy from pageable host memory, which may return before its DMA has
	 * landed, on the legacy stream, which s (non-blocking) does not wait for: the permute kernel
	 * then raced the copy's tail and left the last part of a matrix unpermuted (seen on the H100:
	 * rows 404-1023 of a 1024 x 2048 NVFP4 matrix, test_moe_router UPLOAD). */
	FP4S_CUDA_TRY(err, cudaStreamSynchronize(cudaStreamLegacy));
	if (m->fmt != FP4S_WF_NVFP4 && m->fmt != FP4S_WF_MXFP4)
		return FP4S_OK;
	if (m->cols % 8) /* rows must be whole words */
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "cuda: FP4 rows of %lld codes (a multiple of 8 is needed)",
		                      (long long)m->cols);
	FP4S_CUDA_TRY(err, fp4s_cuda_e2m1_permute(d, bytes, s));
	FP4S_CUDA_TRY(err, cudaStreamSynchronize(s));
	return FP4S_OK;
}

static int upload(struct cuda_impl *c, const void *host, size_t bytes, void **dev, struct fp4s_error *err)
{
	int rc = cu_dev_alloc(c, dev, bytes, err);
	if (rc || (rc = cu_track(c, *dev, err)))
		return rc;
	FP4S_CUDA_TRY(err, cudaMemcpy(*dev, host, bytes, cudaMemcpyHostToDevice));
	/* landed before anything on the backend's stream reads it (cu_permute_codes says why) */
	FP4S_CUDA_TRY(err, cudaStreamSynchronize(cudaStreamLegacy));
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
	if ((rc = upload(c, m->data, data_b, &d, err)) || (rc = cu_permute_codes(m, d, data_b, c->s, err)))
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

size_t cu_mat_data_bytes(const struct fp4s_mat *m, size_t *scale_b)
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
	size_t sb0, db0 = cu_mat_data_bytes(parts[0], &sb0);
	if (!db0)
		return FP4S_EUNSUPPORTED;
	const size_t per_row_d = db0 / (size_t)parts[0]->rows, per_row_s = sb0 / (size_t)parts[0]->rows;
	uint8_t *d = NULL, *sc = NULL;
	float *bias = NULL;
	int rc;
	if ((rc = cu_dev_alloc(c, (void **)&d, per_row_d * (size_t)rows, err)) || (rc = cu_track(c, d, err)))
		return rc;
	if (per_row_s && ((rc = cu_dev_alloc(c, (void **)&sc, per_row_s * (size_t)rows, err)) || (rc = cu_track(c, sc, err))))
		return rc;
	if (any_bias && ((rc = cu_dev_alloc(c, (void **)&bias, sizeof(float) * (size_t)rows, err)) ||
	                 (rc = cu_track(c, bias, err))))
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
	if ((rc = cu_permute_codes(fused, d, per_row_d * (size_t)rows, c->s, err)))
		return rc;
	for (int i = 0; i < n; i++)
		if ((rc = fp4s_cuda_mx_scale_range(parts[i], c->s, err)))
			return rc;
	return fp4s_cuda_mx_scale_range(fused, c->s, err);
}

/* Rows of a and b (one shape: codes rd, scales rs bytes a row) to alternating rows from d / sc /
 * bias on (row 2i: a's row i, 2i + 1: b's), each part copied to the device buffer tmp (>= a part's
 * codes and R floats) and from there to every other row by one strided device copy. sc or bias
 * NULL: none; a part without a bias adds zeros. */
cudaError_t cu_put_pairs(const struct fp4s_mat *a, const struct fp4s_mat *b, size_t rd, size_t rs, uint8_t *d,
                         uint8_t *sc, float *bias, void *tmp)
{
	const size_t R = (size_t)a->rows;
	const struct fp4s_mat *parts[2] = {a, b};
	cudaError_t e = cudaSuccess;
	for (int i = 0; i < 2 && e == cudaSuccess; i++) {
		const void *src[3] = {parts[i]->data, parts[i]->scales, parts[i]->bias};
		uint8_t *dst[3] = {d + i * rd, sc ? sc + i * rs : NULL, bias ? (uint8_t *)(bias + i) : NULL};
		const size_t w[3] = {rd, rs, sizeof(float)};
		for (int k = 0; k < 3 && e == cudaSuccess; k++) {
			if (!dst[k])
				continue;
			e = src[k] ? cudaMemcpy(tmp, src[k], w[k] * R, cudaMemcpyHostToDevice) : cudaMemset(tmp, 0, w[k] * R);
			if (e == cudaSuccess)
				e = cudaMemcpy2D(dst[k], 2 * w[k], tmp, w[k], w[k], R, cudaMemcpyDeviceToDevice);
		}
	}
	return e;
}

/* gate and up with their rows alternating (backend.h upload_gate_up): the decode matmul's
 * epilogue then writes silu(gate) * up from neighbouring lanes (gemv_tma.cu pairact), so the
 * SwiGLU kernel between gate|up and down goes, and the down projection stages plain x.
 * (Gate then up in one allocation, fused in the epilogue, measured slower: a block then walked
 * gate and up tiles 29 MB apart; bench/results/2026-11-22-h100-session4.md.) FP4 weights only,
 * where that epilogue exists. FP4S_GU_PAIRS=0: gate then up (upload_fused). Each part goes
 * through one device buffer, and a strided device copy puts its rows at every other row. */
static int cu_upload_gate_up(struct fp4s_backend *be, struct fp4s_mat *gate, struct fp4s_mat *up,
                             struct fp4s_mat *fused, struct fp4s_error *err)
{
	static int off = -1;
	struct cuda_impl *c = impl_of(be);
	if (fp4s_env_off("FP4S_GU_PAIRS", &off) || !gate->data || !up->data ||
	    (gate->fmt != FP4S_WF_NVFP4 && gate->fmt != FP4S_WF_MXFP4) || up->fmt != gate->fmt ||
	    up->cols != gate->cols || up->rows != gate->rows || gate->rows % 8 ||
	    (gate->fmt == FP4S_WF_NVFP4 && up->ws2 != gate->ws2))
		return FP4S_EUNSUPPORTED;
	size_t sb, db = cu_mat_data_bytes(gate, &sb);
	if (!db || !sb)
		return FP4S_EUNSUPPORTED;
	const size_t R = (size_t)gate->rows, rd = db / R, rs = sb / R;
	const int any_bias = gate->bias || up->bias;
	uint8_t *d = NULL, *sc = NULL, *tmp = NULL;
	float *bias = NULL;
	int rc;
	if ((rc = cu_dev_alloc(c, (void **)&d, 2 * db, err)) || (rc = cu_track(c, d, err)) ||
	    (rc = cu_dev_alloc(c, (void **)&sc, 2 * sb, err)) || (rc = cu_track(c, sc, err)))
		return rc;
	if (any_bias && ((rc = cu_dev_alloc(c, (void **)&bias, 2 * R * sizeof(float), err)) ||
	                 (rc = cu_track(c, bias, err))))
		return rc;
	if ((rc = cu_dev_alloc(c, (void **)&tmp, db > R * sizeof(float) ? db : R * sizeof(float), err)))
		return rc;
	const cudaError_t e = cu_put_pairs(gate, up, rd, rs, d, sc, bias, tmp);
	cudaFree(tmp);
	FP4S_CUDA_TRY(err, e);
	if ((rc = cu_permute_codes(gate, d, 2 * db, c->s, err)))
		return rc;
	*fused = *gate;
	fused->rows = 2 * gate->rows;
	fused->data = d, fused->scales = sc, fused->bias = bias;
	fused->pairs = 1;
	/* no device view of either part is left */
	gate->data = up->data = NULL, gate->scales = up->scales = NULL, gate->bias = up->bias = NULL;
	return fp4s_cuda_mx_scale_range(fused, c->s, err);
}

void cu_upload_install(struct fp4s_backend *be)
{
	be->upload_mat = cu_upload_mat;
	be->upload_f32 = cu_upload_f32;
	be->upload_fused = cu_upload_fused;
	be->upload_gate_up = cu_upload_gate_up;
}
