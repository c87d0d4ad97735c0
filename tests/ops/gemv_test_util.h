// gemv_test_util.h: what test_gemv.cu and test_gemv_experts.cu share: a case's shape and
// kernel choices, and its weights made by the real quantizers.
#ifndef FP4S_GEMV_TEST_UTIL_H
#define FP4S_GEMV_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "numerics/numerics.h"
#include "numerics/quant.h"
#include "model/model.h"
#include "test_util.h"

/* model.h has no extern "C" block: its fp4s_wformat_name is not callable from C++. */
struct gcase {
	enum fp4s_wformat fmt;
	int64_t rows, k;
	int m;
	int bias;
	int ksplit;   /* 0 = auto */
	int generic;  /* force the generic kernel */
	int x_off;    /* x pointer offset in floats (1 = misaligned: generic path) */
	int tile;     /* tokens per pass, 0 = default */
	int prefetch; /* L2 prefetch distance, 0 = default, < 0 = none */
	int rpg;      /* rows per group, 0 = default */
	int stages;   /* cp.async stages, 0 = default, 1 = register path */
	int mma;      /* FP4: 1 = tensor-core kernel (must take it), -1 = FP32 kernels, 0 = default */
	int kblocks;  /* tensor-core kernel: blocks along K, 0 = automatic */
	int wild;     /* FP4: scale bytes replaced by random ones over the whole usable range */
	int acc;      /* y += x W^T into a random y (tensor-core kernel, through fp4s_gemv_mma) */
};

/* Host weights in the format, plus device copies. */
struct hw {
	void *data;
	uint8_t *scales;
	size_t data_b, scales_b;
	float ws2;
};

static int make_weights(const struct gcase *c, struct hw *h)
{
	const int64_t n = c->rows * c->k;
	float *w = (float *)malloc((size_t)n * sizeof *w);
	/* the rows in parallel, each from where a sequential loop would be in the generator's
	 * stream (1 + 3 k draws a row): the same weights for a seed as one thread draws, ~1 s less a
	 * 4096 x 4096 matrix on the GPU machine's 16 cores (most of test_gemv's host time) */
	const unsigned long long base = t_rng_state, per_row = 1 + 3 * (unsigned long long)c->k;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
	for (int64_t r = 0; r < c->rows; r++) {
		unsigned long long st = base + (unsigned long long)r * per_row * T_RNG_STEP;
		const double mag = 0.02 * pow(2.0, (double)(t_rand_u64_at(&st) % 9) - 4.0);
		for (int64_t i = 0; i < c->k; i++) {
			double v = t_rand_normal_at(&st) * mag;
			if (t_rand_u64_at(&st) % 97 == 0)
				v *= 8; /* outliers: blocks with a large amax */
			w[r * c->k + i] = (float)v;
		}
	}
	t_rng_state = base + (unsigned long long)c->rows * per_row * T_RNG_STEP;
	struct fp4s_error err = {0};
	int rc = 0;
	h->scales = NULL;
	h->scales_b = 0;
	h->ws2 = 1.0f;
	switch (c->fmt) {
	case FP4S_WF_NVFP4:
		h->data_b = (size_t)n / 2;
		h->scales_b = (size_t)n / 16;
		h->data = malloc(h->data_b);
		h->scales = (uint8_t *)malloc(h->scales_b);
		rc = fp4s_nvfp4_tensor_scale(w, (size_t)n, &h->ws2, &err);
		if (!rc)
			rc = fp4s_nvfp4_quantize(w, c->rows, c->k, h->ws2, (uint8_t *)h->data, h->scales, &err);
		break;
	case FP4S_WF_MXFP4:
		h->data_b = (size_t)n / 2;
		h->scales_b = (size_t)n / 32;
		h->data = malloc(h->data_b);
		h->scales = (uint8_t *)malloc(h->scales_b);
		rc = fp4s_mxfp4_quantize(w, c->rows, c->k, (uint8_t *)h->data, h->scales, &err);
		break;
	case FP4S_WF_BF16:
	case FP4S_WF_F16: {
		h->data_b = (size_t)n * 2;
		uint16_t *d = (uint16_t *)malloc(h->data_b);
		for (int64_t i = 0; i < n; i++)
			d[i] = c->fmt == FP4S_WF_BF16 ? fp4s_f32_to_bf16(w[i]) : fp4s_f32_to_f16(w[i]);
		h->data = d;
		break;
	}
	default:
		h->data_b = (size_t)n * 4;
		h->data = malloc(h->data_b);
		memcpy(h->data, w, h->data_b);
	}
	free(w);
	if (rc)
		fprintf(stderr, "quantize failed: %s\n", err.msg);
	/* every finite E4M3 scale (subnormal to 448, both signs); E8M0 over 60..190, a 130-exponent
	 * spread: the tensor-core kernel must stay exact across BF16's range */
	if (!rc && c->wild && c->fmt == FP4S_WF_NVFP4)
		for (size_t i = 0; i < h->scales_b; i++) {
			uint8_t b = (uint8_t)(t_rand_u64() % 255);
			h->scales[i] = (b & 0x7F) == 0x7F ? 0x7E : b;
		}
	if (!rc && c->wild == 1 && c->fmt == FP4S_WF_MXFP4)
		for (size_t i = 0; i < h->scales_b; i++)
			h->scales[i] = (uint8_t)(60 + t_rand_u64() % 131);
	if (!rc && c->wild == 2 && c->fmt == FP4S_WF_MXFP4) /* 150-exponent spread, but values stay finite */
		for (size_t i = 0; i < h->scales_b; i++)
			h->scales[i] = (uint8_t)(40 + t_rand_u64() % 151);
	return rc;
}

#endif
