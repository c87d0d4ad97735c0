/* test_model_roundtrip.c: gen BF16 -> quantize -> load, for every tiny preset and format:
 * - every tensor of the table loads and validates (sharded checkpoints with an index);
 * - the loaded NVFP4/MXFP4 codes and scales equal what the CPU reference quantizer
 *   (numerics/quant.h) produces from the BF16 weights, with fused siblings sharing the max amax;
 * - `gen --format F` writes exactly the files of `gen --format bf16` + `quantize --format F`;
 * - unquantized tensors are copied byte for byte; the upload walk visits every weight. */
#include <dirent.h>
#include <math.h>

#include "model/model.h"
#include "model_test_util.h"
#include "numerics/numerics.h"
#include "numerics/quant.h"
#include "test_util.h"

static float *to_float(const struct fp4s_weight *w)
{
	int64_t n = fp4s_weight_numel(w);
	float *x = malloc((size_t)n * sizeof *x);
	for (int64_t i = 0; i < n; i++)
		x[i] = w->fmt == FP4S_WF_BF16 ? fp4s_bf16_to_f32(((const uint16_t *)w->data)[i])
		                              : ((const float *)w->data)[i];
	return x;
}

/* The BF16 model's expert tensor [E, in, out] as logical [E*out, in] floats. */
static float *experts_logical(const struct fp4s_weight *w)
{
	int64_t E = w->spec->shape[0], out = w->spec->shape[1], in = w->spec->shape[2];
	float *x = malloc((size_t)(E * out * in) * sizeof *x);
	const uint16_t *d = w->data;
	for (int64_t e = 0; e < E; e++)
		for (int64_t c = 0; c < in; c++)
			for (int64_t o = 0; o < out; o++)
				x[(e * out + o) * in + c] = fp4s_bf16_to_f32(d[(e * in + c) * out + o]);
	return x;
}

static float amax_of(const struct fp4s_weight *w)
{
	float *x = to_float(w), a = 0;
	for (int64_t i = 0; i < fp4s_weight_numel(w); i++)
		a = fmaxf(a, fabsf(x[i]));
	free(x);
	return a;
}

/* The per-tensor scale the reference rule gives: max amax over the fused group. */
static float group_ws2(const struct fp4s_model *a, const struct fp4s_weight *w)
{
	int g = fp4s_role_fuse_group(w->spec->role);
	float am = amax_of(w);
	for (int32_t j = 0; g && j < a->n; j++) {
		const struct fp4s_weight *o = &a->w[j];
		if (o->present && fp4s_role_fuse_group(o->spec->role) == g &&
		    o->spec->layer == w->spec->layer && o->spec->expert == w->spec->expert)
			am = fmaxf(am, amax_of(o));
	}
	float ws2;
	struct fp4s_error err;
	CHECK_EQ_INT(fp4s_nvfp4_tensor_scale(&am, 1, &ws2, &err), 0);
	return ws2;
}

static int64_t g_visited;
static uint64_t g_bytes;
static int count_cb(void *ctx, const struct fp4s_weight *w, struct fp4s_error *err)
{
	(void)ctx, (void)err;
	g_visited++;
	g_bytes += w->data_bytes + w->scale_bytes;
	return 0;
}

static void compare_dirs(const char *x, const char *y)
{
	DIR *d = opendir(y);
	struct dirent *e;
	int files = 0;
	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char *a = mt_path(x, e->d_name), *b = mt_path(y, e->d_name);
		size_t na = 0, nb = 0;
		uint8_t *ba = mt_read(a, &na), *bb = mt_read(b, &nb);
		CHECK_MSG(ba && bb && na == nb && !memcmp(ba, bb, na), "%s differs from %s", a, b);
		files++;
		free(ba), free(bb), free(a), free(b);
	}
	if (d)
		closedir(d);
	CHECK(files >= 3);
}

static void roundtrip(const char *root, const char *preset, enum fp4s_qformat f)
{
	char name[128];
	fprintf(stderr, "%s %s\n", preset, fp4s_qformat_name(f));
	snprintf(name, sizeof name, "%s-bf16", preset);
	char *a_dir = mt_path(root, name);
	snprintf(name, sizeof name, "%s-q-%s", preset, fp4s_qformat_name(f));
	char *q_dir = mt_path(root, name);
	snprintf(name, sizeof name, "%s-g-%s", preset, fp4s_qformat_name(f));
	char *g_dir = mt_path(root, name);
	const uint64_t shard = 1000000; /* ~1 MB shards: exercises the index */
	struct fp4s_error err = {0};
	if (access(a_dir, F_OK))
		CHECK_EQ_INT(mt_gen(preset, a_dir, FP4S_QF_BF16, 42, shard), 0);
	struct fp4s_write_opts o = {.format = f, .shard_bytes = shard};
	int rc = fp4s_quantize(a_dir, q_dir, &o, &err);
	CHECK_MSG(rc == 0, "quantize: %s", err.msg);
	CHECK_EQ_INT(mt_gen(preset, g_dir, f, 42, shard), 0);
	compare_dirs(q_dir, g_dir);

	struct fp4s_model a, q;
	rc = fp4s_model_open(a_dir, &a, &err);
	CHECK_MSG(rc == 0, "open bf16: %s", err.msg);
	if (rc)
		return;
	rc = fp4s_model_open(q_dir, &q, &err);
	CHECK_MSG(rc == 0, "open quantized: %s", err.msg);
	if (rc) {
		fp4s_model_close(&a);
		return;
	}
	CHECK(a.st.nfiles > 1 && q.st.nfiles > 1);
	CHECK_EQ_INT(q.n_unused, 0);
	CHECK_EQ_INT(a.n, q.n);
	int nq = 0;
	for (int32_t i = 0; i < q.n; i++) {
		const struct fp4s_weight *wa = &a.w[i], *wq = &q.w[i];
		CHECK_MSG(wq->present == wa->present, "%s presence", wq->spec->name);
		if (!wq->present)
			continue;
		if (wq->fmt == FP4S_WF_NVFP4) {
			nq++;
			int64_t R = wq->spec->shape[0], K = wq->spec->shape[1];
			float ws2 = group_ws2(&a, wa);
			float *x = to_float(wa);
			uint8_t *qq = malloc((size_t)(R * K / 2)), *sf = malloc((size_t)(R * K / 16));
			CHECK_EQ_INT(fp4s_nvfp4_quantize(x, R, K, ws2, qq, sf, &err), 0);
			CHECK_MSG(!memcmp(qq, wq->data, (size_t)(R * K / 2)), "%s codes", wq->spec->name);
			CHECK_MSG(!memcmp(sf, wq->scales, (size_t)(R * K / 16)), "%s scales", wq->spec->name);
			if (f == FP4S_QF_NVFP4)
				CHECK_MSG(wq->ws2 == ws2, "%s ws2 %g vs %g", wq->spec->name, (double)wq->ws2,
				          (double)ws2);
			else /* CT stores 1/ws2; the loader inverts it back */
				CHECK_MSG(wq->ws2 == 1.0f / (1.0f / ws2), "%s ws2", wq->spec->name);
			CHECK_MSG(wq->group_scale_shared, "%s not shared", wq->spec->name);
			CHECK(wq->input_scale == 0.0f); /* weight-only: no input_scale */
			/* and it dequantizes close to the original */
			float *y = malloc((size_t)(R * K) * sizeof *y);
			CHECK_EQ_INT(fp4s_nvfp4_dequantize(wq->data, wq->scales, wq->ws2, R, K, y, &err), 0);
			double num = 0, den = 0;
			for (int64_t j = 0; j < R * K; j++)
				num += (y[j] - x[j]) * (y[j] - x[j]), den += x[j] * x[j];
			CHECK_MSG(sqrt(num / den) < 0.15, "%s rel err %g", wq->spec->name, sqrt(num / den));
			free(x), free(qq), free(sf), free(y);
		} else if (wq->fmt == FP4S_WF_MXFP4) {
			nq++;
			int64_t R = wq->spec->shape[0] * wq->spec->shape[1], K = wq->spec->shape[2];
			CHECK(wa->transposed && wa->fmt == FP4S_WF_BF16);
			float *x = experts_logical(wa);
			uint8_t *qq = malloc((size_t)(R * K / 2)), *sf = malloc((size_t)(R * K / 32));
			CHECK_EQ_INT(fp4s_mxfp4_quantize(x, R, K, qq, sf, &err), 0);
			CHECK_MSG(!memcmp(qq, wq->data, (size_t)(R * K / 2)), "%s blocks", wq->spec->name);
			CHECK_MSG(!memcmp(sf, wq->scales, (size_t)(R * K / 32)), "%s scales", wq->spec->name);
			free(x), free(qq), free(sf);
		} else {
			CHECK_MSG(wq->data_bytes == wa->data_bytes &&
			                  !memcmp(wq->data, wa->data, wa->data_bytes),
			          "%s copied", wq->spec->name);
			/* excluded by default: lm_head, routers, embeddings, norms, biases */
			enum fp4s_role r = wq->spec->role;
			if (f != FP4S_QF_MXFP4)
				CHECK_MSG(r == FP4S_ROLE_LM_HEAD || r == FP4S_ROLE_ROUTER ||
				                  r == FP4S_ROLE_SHARED_EXPERT_GATE || r == FP4S_ROLE_MTP ||
				                  wq->spec->cls == FP4S_TC_FLOAT,
				          "%s left unquantized", wq->spec->name);
		}
	}
	CHECK(nq > 0);
	g_visited = 0, g_bytes = 0;
	CHECK_EQ_INT(fp4s_model_upload(&q, count_cb, NULL, &err), 0);
	int64_t present = 0;
	uint64_t bytes = 0;
	for (int32_t i = 0; i < q.n; i++)
		if (q.w[i].present)
			present++, bytes += q.w[i].data_bytes + q.w[i].scale_bytes;
	CHECK_EQ_INT(g_visited, present);
	CHECK_EQ_INT(g_bytes, bytes);
	fp4s_model_close(&a);
	fp4s_model_close(&q);
	free(a_dir), free(q_dir), free(g_dir);
}

static void test_generator(const char *root)
{
	/* deterministic per seed, different across seeds, realistic scale */
	uint64_t k1 = fp4s_gen_key(1, "x"), k2 = fp4s_gen_key(2, "x");
	CHECK(fp4s_gen_value(k1, 5, 0, 0.02f) == fp4s_gen_value(k1, 5, 0, 0.02f));
	CHECK(fp4s_gen_value(k1, 5, 0, 0.02f) != fp4s_gen_value(k2, 5, 0, 0.02f));
	double s = 0, s2 = 0;
	const int n = 1 << 16;
	for (int i = 1; i <= n; i++) {
		double v = fp4s_gen_value(k1, (uint64_t)i, 0, 0.02f);
		s += v, s2 += v * v;
	}
	CHECK_NEAR(s / n, 0.0, 5e-4);
	CHECK_NEAR(sqrt(s2 / n), 0.02, 1e-3);
	/* another seed writes another checkpoint */
	char *d1 = mt_path(root, "s1"), *d2 = mt_path(root, "s2");
	CHECK_EQ_INT(mt_gen("tiny-llama3", d1, FP4S_QF_BF16, 1, 0), 0);
	CHECK_EQ_INT(mt_gen("tiny-llama3", d2, FP4S_QF_BF16, 2, 0), 0);
	char *a = mt_path(d1, "model.safetensors"), *b = mt_path(d2, "model.safetensors");
	size_t na, nb;
	uint8_t *ba = mt_read(a, &na), *bb = mt_read(b, &nb);
	CHECK(na == nb && memcmp(ba, bb, na));
	free(ba), free(bb), free(a), free(b), free(d1), free(d2);
}

/* Fused siblings with different per-tensor scales keep one each (never the max). */
static void test_per_shard_scales(const char *root)
{
	char *d = mt_path(root, "shards");
	CHECK_EQ_INT(mt_gen("tiny-llama3", d, FP4S_QF_NVFP4, 9, 0), 0);
	char *st = mt_path(d, "model.safetensors");
	float v = 1.5e-5f;
	CHECK(!mt_patch_tensor(st, "model.layers.1.self_attn.k_proj.weight_scale_2", 0, &v, 4));
	struct fp4s_model m;
	struct fp4s_error err = {0};
	CHECK_EQ_INT(fp4s_model_open(d, &m, &err), 0);
	const struct fp4s_weight *q = fp4s_model_find(&m, "model.layers.1.self_attn.q_proj.weight"),
	                         *k = fp4s_model_find(&m, "model.layers.1.self_attn.k_proj.weight"),
	                         *o = fp4s_model_find(&m, "model.layers.1.self_attn.o_proj.weight"),
	                         *q0 = fp4s_model_find(&m, "model.layers.0.self_attn.q_proj.weight");
	CHECK(q && k && o && q0);
	if (q && k && o && q0) {
		CHECK(k->ws2 == v && q->ws2 != v);
		CHECK(!q->group_scale_shared && !k->group_scale_shared);
		CHECK(o->group_scale_shared && q0->group_scale_shared);
	}
	fp4s_model_close(&m);
	free(st), free(d);
}

/* An F32 input quantizes to the same codes as the BF16 one holding the same values, and its
 * unquantized tensors are copied in F32. */
static void test_f32_input(const char *root)
{
	char *a = mt_path(root, "f32-src"), *f = mt_path(root, "f32"), *qa = mt_path(root, "f32-qa"),
	     *qf = mt_path(root, "f32-qf");
	CHECK_EQ_INT(mt_gen("tiny-qwen3-moe", a, FP4S_QF_BF16, 11, 0), 0);
	struct fp4s_model m;
	struct fp4s_error err = {0};
	CHECK_EQ_INT(fp4s_model_open(a, &m, &err), 0);
	CHECK(mkdir(f, 0755) == 0);
	struct fp4s_st_writer w;
	fp4s_st_writer_init(&w, f, 0);
	for (int32_t i = 0; i < m.n; i++)
		fp4s_st_writer_add(&w, m.w[i].spec->name, FP4S_DT_F32, m.w[i].spec->ndim, m.w[i].spec->shape,
		                   &err);
	CHECK_EQ_INT(fp4s_st_writer_begin(&w, &err), 0);
	for (int32_t i = 0; i < m.n; i++) {
		float *x = to_float(&m.w[i]);
		fp4s_st_write_at(&w, i, 0, x, (size_t)fp4s_weight_numel(&m.w[i]) * 4, &err);
		free(x);
	}
	CHECK_EQ_INT(fp4s_st_writer_finish(&w, &err), 0);
	fp4s_st_writer_free(&w);
	fp4s_model_close(&m);
	char *c1 = mt_path(a, "config.json"), *c2 = mt_path(f, "config.json");
	size_t n;
	uint8_t *cfg = mt_read(c1, &n);
	mt_write(c2, cfg, n);
	free(cfg), free(c1), free(c2);
	struct fp4s_write_opts o = {.format = FP4S_QF_NVFP4};
	CHECK_EQ_INT(fp4s_quantize(a, qa, &o, &err), 0);
	CHECK_EQ_INT(fp4s_quantize(f, qf, &o, &err), 0);
	struct fp4s_model x, y;
	CHECK_EQ_INT(fp4s_model_open(qa, &x, &err), 0);
	CHECK_EQ_INT(fp4s_model_open(qf, &y, &err), 0);
	int nq = 0;
	for (int32_t i = 0; i < x.n; i++) {
		const struct fp4s_weight *u = &x.w[i], *v = &y.w[i];
		CHECK_EQ_INT(u->fmt == FP4S_WF_NVFP4, v->fmt == FP4S_WF_NVFP4);
		if (u->fmt == FP4S_WF_NVFP4) {
			nq++;
			CHECK_MSG(u->ws2 == v->ws2 && u->data_bytes == v->data_bytes &&
			                  !memcmp(u->data, v->data, u->data_bytes) &&
			                  !memcmp(u->scales, v->scales, u->scale_bytes),
			          "%s: F32 input quantized differently", u->spec->name);
		} else {
			CHECK_MSG(u->fmt == FP4S_WF_BF16 && v->fmt == FP4S_WF_F32, "%s dtype kept",
			          u->spec->name);
		}
	}
	CHECK(nq > 0);
	fp4s_model_close(&x);
	fp4s_model_close(&y);
	free(a), free(f), free(qa), free(qf);
}

int main(void)
{
	char *root = mt_tmpdir();
	test_generator(root);
	static const char *const nv[] = {"tiny-llama3", "tiny-qwen3", "tiny-qwen3-moe", "tiny-qwen3-next"};
	for (int i = 0; i < 4; i++) {
		roundtrip(root, nv[i], FP4S_QF_NVFP4);
		roundtrip(root, nv[i], FP4S_QF_NVFP4_CT);
	}
	roundtrip(root, "tiny-gpt-oss", FP4S_QF_MXFP4);
	test_per_shard_scales(root);
	test_f32_input(root);
	/* formats that do not apply are refused with a message */
	struct fp4s_write_opts o = {.format = FP4S_QF_MXFP4};
	struct fp4s_error err = {0};
	char *x = mt_path(root, "x");
	CHECK(fp4s_gen("tiny-llama3", x, &o, &err) == FP4S_EUNSUPPORTED && strstr(err.msg, "gpt_oss"));
	free(x);
	mt_rmtree(root);
	free(root);
	return TEST_DONE();
}
