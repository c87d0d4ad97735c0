/* model_stats.c: decode-time byte accounting (performance.md §3.1) and the upload walk.
 *
 * Per token at batch 1: every weight the token touches in its stored format including scales;
 * the untied lm_head in full; the embedding as one row (a tied embedding is read in full as the
 * head); of the experts, the expected active fraction k/E of each expert tensor (per-expert
 * tensors and the packed gpt-oss blocks alike); norms, biases, routers in full. */
#include "model/model.h"

#include <sys/mman.h>
#include <unistd.h>

#include "util/progress.h"

static int is_expert(enum fp4s_role r)
{
	return r == FP4S_ROLE_EXPERT_GATE || r == FP4S_ROLE_EXPERT_UP || r == FP4S_ROLE_EXPERT_DOWN ||
	       r == FP4S_ROLE_EXPERTS_GATE_UP || r == FP4S_ROLE_EXPERTS_DOWN ||
	       r == FP4S_ROLE_EXPERTS_BIAS || r == FP4S_ROLE_EXPERTS_GATE_UP_CAT ||
	       r == FP4S_ROLE_EXPERTS_DOWN_CAT;
}

void fp4s_model_stats(const struct fp4s_config *c, const struct fp4s_weight *w, int32_t n,
                      struct fp4s_model_stats *s)
{
	*s = (struct fp4s_model_stats){0};
	double active = c->n_experts ? (double)c->n_experts_per_tok / (double)c->n_experts : 1.0;
	for (int32_t i = 0; i < n; i++) {
		if (!w[i].present)
			continue;
		double bytes = (double)fp4s_weight_bytes(&w[i]);
		double numel = (double)fp4s_weight_numel(&w[i]);
		double frac = 1.0;
		if (is_expert(w[i].spec->role))
			frac = active;
		else if (w[i].spec->role == FP4S_ROLE_EMBED && !c->tie_embeddings)
			frac = 1.0 / (double)c->vocab;
		s->params_total += numel;
		s->bytes_total += bytes;
		s->bytes_by_fmt[w[i].fmt] += bytes;
		s->bytes_per_token += bytes * frac;
		/* active parameters: what the token's compute touches; the embedding row is a lookup */
		if (w[i].spec->role != FP4S_ROLE_EMBED || c->tie_embeddings)
			s->params_active += numel * frac;
	}
	s->kv_bytes_per_ctx_token = fp4s_kv_bytes(c, 1);
}

double fp4s_kv_bytes(const struct fp4s_config *c, int64_t context)
{
	double per_layer_tok = 2.0 * c->n_kv_heads * c->head_dim * 2.0; /* K and V, BF16 */
	double total = 0;
	for (int32_t l = 0; l < c->n_layers; l++) {
		int64_t t = context;
		if (c->layer_kind[l] == FP4S_LAYER_SLIDING && c->sliding_window > 0 &&
		    t > c->sliding_window)
			t = c->sliding_window;
		if (c->layer_kind[l] == FP4S_LAYER_LINEAR)
			t = 0;
		total += per_layer_tok * (double)t;
	}
	return total;
}

int fp4s_model_upload(const struct fp4s_model *m, fp4s_upload_fn fn, void *ctx,
                      struct fp4s_error *err)
{
	uint64_t total = 0;
	for (int32_t i = 0; i < m->n; i++)
		if (m->w[i].present)
			total += m->w[i].data_bytes + m->w[i].scale_bytes;
	struct fp4s_progress p;
	fp4s_progress_init(&p, "upload", total);
	int rc = FP4S_OK;
	const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	for (int32_t i = 0; i < m->n && !rc; i++) {
		if (!m->w[i].present)
			continue;
		/* Cold loads read the mapping front to back: tell the kernel (calm does the same with
		 * posix_fadvise), so readahead is large. Advice failures are harmless. */
		const void *parts[2] = {m->w[i].data, m->w[i].scales};
		uint64_t lens[2] = {m->w[i].data_bytes, m->w[i].scale_bytes};
		for (int k = 0; k < 2; k++)
			if (parts[k] && lens[k] && !m->owned) {
				uintptr_t a = (uintptr_t)parts[k] & ~(page - 1);
				size_t len = (size_t)((uintptr_t)parts[k] + lens[k] - a);
				madvise((void *)a, len, MADV_SEQUENTIAL);
				madvise((void *)a, len, MADV_WILLNEED);
			}
		rc = fn(ctx, &m->w[i], err);
		fp4s_progress_add(&p, m->w[i].data_bytes + m->w[i].scale_bytes);
	}
	fp4s_progress_done(&p);
	return rc;
}
