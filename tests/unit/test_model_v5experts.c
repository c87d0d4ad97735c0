/* test_model_v5experts.c: a Qwen3-MoE checkpoint re-saved by transformers v5, with routed experts
 * fused per layer (mlp.experts.gate_up_proj [E, 2 I_e, H], gate half first; mlp.experts.down_proj
 * [E, H, I_e]), loads as well as the hub's per-expert layout (architectures.md §4.2, §14 #10).
 * The fused file is built here from a generated per-expert checkpoint. */
#include "model/model.h"
#include "model_test_util.h"
#include "test_util.h"

int main(void)
{
	char *root = mt_tmpdir();
	char *hub = mt_path(root, "hub"), *v5 = mt_path(root, "v5");
	CHECK_EQ_INT(mt_gen("tiny-qwen3-moe", hub, FP4S_QF_BF16, 4, 0), 0);
	struct fp4s_model a;
	struct fp4s_error err = {0};
	CHECK_EQ_INT(fp4s_model_open(hub, &a, &err), 0);
	CHECK_EQ_INT(a.cfg.experts_fused, 0);
	const int64_t E = a.cfg.n_experts, I = a.cfg.moe_intermediate, H = a.cfg.hidden;
	CHECK(mkdir(v5, 0755) == 0);
	struct fp4s_st_writer w;
	fp4s_st_writer_init(&w, v5, 0);
	/* plan: every non-expert tensor, then per layer the two fused tensors */
	for (int32_t i = 0; i < a.n; i++) {
		const struct fp4s_tspec *s = a.w[i].spec;
		if (s->expert >= 0)
			continue;
		CHECK(fp4s_st_writer_add(&w, s->name, FP4S_DT_BF16, s->ndim, s->shape, &err) >= 0);
	}
	for (int32_t l = 0; l < a.cfg.n_layers; l++) {
		char nm[128];
		snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.gate_up_proj", l);
		CHECK(fp4s_st_writer_add(&w, nm, FP4S_DT_BF16, 3, (int64_t[]){E, 2 * I, H}, &err) >= 0);
		snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.down_proj", l);
		CHECK(fp4s_st_writer_add(&w, nm, FP4S_DT_BF16, 3, (int64_t[]){E, H, I}, &err) >= 0);
	}
	CHECK_EQ_INT(fp4s_st_writer_begin(&w, &err), 0);
	int32_t k = 0;
	for (int32_t i = 0; i < a.n; i++)
		if (a.w[i].spec->expert < 0) {
			CHECK_EQ_INT(fp4s_st_write_at(&w, k, 0, a.w[i].data, a.w[i].data_bytes, &err), 0);
			k++;
		}
	for (int32_t l = 0; l < a.cfg.n_layers; l++, k += 2)
		for (int64_t e = 0; e < E; e++) {
			char nm[128];
			const size_t mat = (size_t)(I * H * 2);
			snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%lld.gate_proj.weight", l, (long long)e);
			const struct fp4s_weight *g = fp4s_model_find(&a, nm);
			snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%lld.up_proj.weight", l, (long long)e);
			const struct fp4s_weight *u = fp4s_model_find(&a, nm);
			snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%lld.down_proj.weight", l, (long long)e);
			const struct fp4s_weight *d = fp4s_model_find(&a, nm);
			CHECK(g && u && d);
			fp4s_st_write_at(&w, k, (uint64_t)e * 2 * mat, g->data, mat, &err);
			fp4s_st_write_at(&w, k, (uint64_t)e * 2 * mat + mat, u->data, mat, &err);
			fp4s_st_write_at(&w, k + 1, (uint64_t)e * mat, d->data, mat, &err);
		}
	CHECK_EQ_INT(fp4s_st_writer_finish(&w, &err), 0);
	fp4s_st_writer_free(&w);
	char *c1 = mt_path(hub, "config.json"), *c2 = mt_path(v5, "config.json");
	size_t n;
	uint8_t *cfg = mt_read(c1, &n);
	mt_write(c2, cfg, n);
	free(cfg);

	struct fp4s_model b;
	int rc = fp4s_model_open(v5, &b, &err);
	CHECK_MSG(rc == 0, "%s", err.msg);
	if (!rc) {
		CHECK_EQ_INT(b.cfg.experts_fused, 1);
		CHECK_EQ_INT(b.n_unused, 0);
		const struct fp4s_weight *gu = fp4s_model_find(&b, "model.layers.1.mlp.experts.gate_up_proj");
		const struct fp4s_weight *up3 = fp4s_model_find(&a, "model.layers.1.mlp.experts.3.up_proj.weight");
		CHECK(gu && gu->present && gu->spec->role == FP4S_ROLE_EXPERTS_GATE_UP_CAT);
		if (gu && up3) /* expert 3's up half sits after its gate half */
			CHECK(!memcmp((const uint8_t *)gu->data + (3 * 2 * I + I) * H * 2, up3->data,
			              (size_t)(I * H * 2)));
		/* same bytes per decode token either way */
		struct fp4s_model_stats sa, sb;
		fp4s_model_stats(&a.cfg, a.w, a.n, &sa);
		fp4s_model_stats(&b.cfg, b.w, b.n, &sb);
		CHECK_NEAR(sa.bytes_per_token, sb.bytes_per_token, 1.0);
		CHECK_NEAR(sa.params_total, sb.params_total, 0.5);
		fp4s_model_close(&b);
	}
	/* a wrong fused shape is named */
	char *st = mt_path(v5, "model.safetensors");
	char old[128], new_[128];
	snprintf(old, sizeof old, "\"model.layers.0.mlp.experts.down_proj\":{\"dtype\":\"BF16\",\"shape\":[%lld,%lld,%lld]",
	         (long long)E, (long long)H, (long long)I);
	snprintf(new_, sizeof new_, "\"model.layers.0.mlp.experts.down_proj\":{\"dtype\":\"BF16\",\"shape\":[%lld,%lld,%lld]",
	         (long long)E, (long long)I, (long long)H);
	CHECK(!mt_patch(st, old, new_));
	CHECK(fp4s_model_open(v5, &b, &err) != 0);
	CHECK(strstr(err.msg, "model.layers.0.mlp.experts.down_proj") && strstr(err.msg, "expected [8, 256, 128]"));
	free(st);
	fp4s_model_close(&a);
	free(c1), free(c2), free(hub), free(v5);
	mt_rmtree(root);
	free(root);
	return TEST_DONE();
}
