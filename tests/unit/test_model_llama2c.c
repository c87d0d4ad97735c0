/* test_model_llama2c.c: the llama2.c legacy loader on stories260K (../shared/realdata), and a
 * numeric proof that the wq/wk row permutation maps llama2.c's interleaved RoPE onto our
 * rotate-half RoPE: attention scores q.k agree for every head pair at several positions. */
#include <math.h>

#include "model/model.h"
#include "model_test_util.h"
#include "test_util.h"

/* RoPE on one head of size hs at position p, base 10000: interleaved (pairs 2i, 2i+1) or
 * rotate-half (pairs i, i+hs/2), both with frequency base^(-2i/hs). */
static void rope(float *x, int hs, int p, int interleaved)
{
	for (int i = 0; i < hs / 2; i++) {
		double f = pow(10000.0, -2.0 * i / hs), c = cos(p * f), s = sin(p * f);
		int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + hs / 2;
		double x0 = x[a], x1 = x[b];
		x[a] = (float)(x0 * c - x1 * s);
		x[b] = (float)(x1 * c + x0 * s);
	}
}

static void matvec(const float *w, const float *x, int rows, int cols, float *y)
{
	for (int r = 0; r < rows; r++) {
		double s = 0;
		for (int c = 0; c < cols; c++)
			s += (double)w[(int64_t)r * cols + c] * x[c];
		y[r] = (float)s;
	}
}

int main(void)
{
	const char *shared = getenv("FP4S_SHARED_DIR");
	char path[4096];
	snprintf(path, sizeof path, "%s/realdata/stories260K/stories260K.bin", shared ? shared : "../shared");
	if (access(path, R_OK))
		TEST_SKIP("%s not found (FP4S_SHARED_DIR unset or ../shared absent)", path);
	struct fp4s_model m;
	struct fp4s_error err = {0};
	int rc = fp4s_llama2c_open(path, &m, &err);
	CHECK_MSG(rc == 0, "%s", err.msg);
	if (rc)
		return TEST_DONE();
	const struct fp4s_config *c = &m.cfg;
	CHECK_EQ_INT(c->arch, FP4S_ARCH_LLAMA);
	CHECK_EQ_INT(c->hidden, 64);
	CHECK_EQ_INT(c->intermediate, 172);
	CHECK_EQ_INT(c->n_layers, 5);
	CHECK_EQ_INT(c->n_heads, 8);
	CHECK_EQ_INT(c->n_kv_heads, 4);
	CHECK_EQ_INT(c->vocab, 512);
	CHECK_EQ_INT(c->max_pos, 512);
	CHECK_EQ_INT(c->tie_embeddings, 1);
	CHECK_EQ_INT(m.n, 2 + 5 * 9);
	for (int32_t i = 0; i < m.n; i++)
		CHECK_MSG(m.w[i].present && m.w[i].fmt == FP4S_WF_F32 && m.w[i].data, "%s",
		          m.specs[i].name);
	/* the embedding is the first weight after the header, norms come out near 1 */
	size_t n;
	uint8_t *raw = mt_read(path, &n);
	const float *emb = (const float *)(raw + 28);
	CHECK(!memcmp(fp4s_model_find(&m, "model.embed_tokens.weight")->data, emb, 512 * 64 * 4));
	const int dim = 64, hs = 8, kvd = 32, L = 5;
	const float *wq_raw = emb + 512 * dim + L * dim; /* after embeddings and rms_att */
	const float *wk_raw = wq_raw + L * dim * dim;
	for (int l = 0; l < L; l += 4) {
		char nq[96], nk[96];
		snprintf(nq, sizeof nq, "model.layers.%d.self_attn.q_proj.weight", l);
		snprintf(nk, sizeof nk, "model.layers.%d.self_attn.k_proj.weight", l);
		const float *wq = fp4s_model_find(&m, nq)->data, *wk = fp4s_model_find(&m, nk)->data;
		const float *rq = wq_raw + (int64_t)l * dim * dim, *rk = wk_raw + (int64_t)l * kvd * dim;
		/* row mapping: new row i = old 2i, new row i + hs/2 = old 2i+1, per head */
		CHECK(!memcmp(wq + (1 * hs + 3) * dim, rq + (1 * hs + 6) * dim, dim * 4));
		CHECK(!memcmp(wq + (1 * hs + 3 + hs / 2) * dim, rq + (1 * hs + 7) * dim, dim * 4));
		/* scores agree */
		float x[64], qa[64], ka[32], qb[64], kb[32];
		for (int i = 0; i < dim; i++)
			x[i] = (float)sin(0.37 * i + l);
		for (int pq = 0; pq < 40; pq += 13)
			for (int pk = 0; pk <= pq; pk += 7) {
				matvec(rq, x, dim, dim, qa), matvec(rk, x, kvd, dim, ka);
				matvec(wq, x, dim, dim, qb), matvec(wk, x, kvd, dim, kb);
				for (int h = 0; h < 8; h++)
					rope(qa + h * hs, hs, pq, 1), rope(qb + h * hs, hs, pq, 0);
				for (int h = 0; h < 4; h++)
					rope(ka + h * hs, hs, pk, 1), rope(kb + h * hs, hs, pk, 0);
				for (int h = 0; h < 8; h++) {
					double sa = 0, sb = 0;
					for (int i = 0; i < hs; i++)
						sa += qa[h * hs + i] * ka[(h / 2) * hs + i],
							sb += qb[h * hs + i] * kb[(h / 2) * hs + i];
					CHECK_NEAR(sa, sb, 1e-4 * (1 + fabs(sa)));
				}
			}
	}
	fp4s_model_close(&m);
	/* a truncated copy is refused with a message */
	char *d = mt_tmpdir();
	char *tp = mt_path(d, "trunc.bin");
	mt_write(tp, raw, 100000);
	rc = fp4s_llama2c_open(tp, &m, &err);
	CHECK_EQ_INT(rc, FP4S_EFORMAT);
	CHECK(strstr(err.msg, "trunc.bin") && strstr(err.msg, "truncated"));
	mt_write(tp, raw, 20);
	CHECK_EQ_INT(fp4s_llama2c_open(tp, &m, &err), FP4S_EFORMAT);
	CHECK(strstr(err.msg, "28-byte header"));
	int32_t bad[7] = {64, 172, 5, 8, 3, 512, 512}; /* 8 heads not a multiple of 3 kv heads */
	mt_write(tp, bad, sizeof bad);
	CHECK_EQ_INT(fp4s_llama2c_open(tp, &m, &err), FP4S_EFORMAT);
	CHECK(strstr(err.msg, "inconsistent"));
	free(raw), free(tp);
	mt_rmtree(d);
	free(d);
	return TEST_DONE();
}
