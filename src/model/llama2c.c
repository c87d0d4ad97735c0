/* llama2c.c: the llama2.c legacy checkpoint (stories*.bin): a header of 7 int32 (dim,
 * hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative: untied classifier), seq_len),
 * then fp32 weights in llama2.c's order: token embedding [V, dim], rms_att [L, dim],
 * wq [L, nh*hs, dim], wk [L, nkv*hs, dim], wv [L, nkv*hs, dim], wo [L, dim, nh*hs],
 * rms_ffn [L, dim], w1 [L, hidden, dim], w2 [L, dim, hidden], w3 [L, hidden, dim],
 * rms_final [dim], the unused freq_cis tables (2 x seq_len * hs/2), then wcls [V, dim] if untied.
 * The matrices are already [out, in] (llama2.c's matmul computes W x with W row-major [d, n]),
 * so they map onto the llama table as w1 = gate, w3 = up, w2 = down.
 *
 * RoPE: llama2.c rotates adjacent pairs (x[2i], x[2i+1]) of each head with frequency
 * 10000^(-2i/hs) (interleaved, GPT-J style); our forward pass (and every HF checkpoint) rotates
 * (x[i], x[i + hs/2]) with the same frequency (rotate-half, architectures.md §1.3). Permuting the
 * rows of wq and wk within each head, new row i = old row 2i and new row i + hs/2 = old row 2i+1,
 * turns one into the other: q and k come out in the rotate-half order, the rotation pairs meet
 * the same frequencies, and q.k is unchanged because both are permuted alike. (This is the
 * inverse of the permutation HF's convert_llama_weights_to_hf applies to Meta's checkpoints.)
 * v and wo are untouched. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/model.h"

static void permute_heads(float *dst, const float *src, int32_t heads, int32_t hs, int64_t cols)
{
	for (int32_t h = 0; h < heads; h++)
		for (int32_t i = 0; i < hs / 2; i++) {
			const float *a = src + ((int64_t)h * hs + 2 * i) * cols;
			const float *b = src + ((int64_t)h * hs + 2 * i + 1) * cols;
			memcpy(dst + ((int64_t)h * hs + i) * cols, a, (size_t)cols * sizeof *dst);
			memcpy(dst + ((int64_t)h * hs + i + hs / 2) * cols, b, (size_t)cols * sizeof *dst);
		}
}

int fp4s_llama2c_open(const char *path, struct fp4s_model *m, struct fp4s_error *err)
{
	memset(m, 0, sizeof *m);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return fp4s_error_set(err, FP4S_EIO, "%s: cannot open: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size < 28) {
		close(fd);
		return fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: not a llama2.c checkpoint (expected a 28-byte header)", path);
	}
	size_t size = (size_t)st.st_size;
	void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (map == MAP_FAILED)
		return fp4s_error_set(err, FP4S_EIO, "%s: mmap failed: %s", path, strerror(errno));
	m->owned_map = map;
	m->owned_map_size = size;
	m->dir = strdup(path);
	int32_t h[7];
	memcpy(h, map, sizeof h);
	int32_t dim = h[0], hidden = h[1], L = h[2], nh = h[3], nkv = h[4], seq = h[6];
	int shared = h[5] > 0;
	int64_t V = h[5] > 0 ? h[5] : -(int64_t)h[5];
	int rc = FP4S_OK;
	/* Bounds keep every product below 2^62. */
	if (dim <= 0 || dim > (1 << 16) || hidden <= 0 || hidden > (1 << 18) || L <= 0 || L > 1024 ||
	    nh <= 0 || nh > dim || nkv <= 0 || nkv > nh || V <= 0 || V > (1 << 22) || seq <= 0 ||
	    seq > (1 << 22) || dim % nh || nh % nkv || (dim / nh) % 2) {
		rc = fp4s_error_set(err, FP4S_EFORMAT,
		                    "%s: llama2.c header (dim %d, hidden %d, layers %d, heads %d/%d, vocab "
		                    "%d, seq_len %d) is out of range or inconsistent",
		                    path, dim, hidden, L, nh, nkv, h[5], seq);
		goto fail;
	}
	const int32_t hs = dim / nh;
	const int64_t kvd = (int64_t)nkv * hs;
	const int64_t n_floats = V * dim + (int64_t)L * dim + (int64_t)L * dim * dim +
	                         2 * (int64_t)L * kvd * dim + (int64_t)L * dim * dim + (int64_t)L * dim +
	                         3 * (int64_t)L * dim * hidden + dim + (int64_t)seq * hs +
	                         (shared ? 0 : V * dim);
	if ((uint64_t)n_floats * 4 + 28 > size) {
		rc = fp4s_error_set(err, FP4S_EFORMAT,
		                    "%s: truncated: the header needs %lld bytes of weights, the file has %zu",
		                    path, (long long)n_floats * 4, size - 28);
		goto fail;
	}
	struct fp4s_config *c = &m->cfg;
	c->arch = FP4S_ARCH_LLAMA;
	c->hidden = dim;
	c->n_layers = L;
	c->n_heads = nh;
	c->n_kv_heads = nkv;
	c->head_dim = hs;
	c->intermediate = hidden;
	c->vocab = V;
	c->rms_eps = 1e-5;
	c->max_pos = seq;
	c->rope.theta = 10000.0;
	c->rope.partial_rotary_factor = 1.0;
	c->tie_embeddings = shared;
	c->bos_token_id = 1;
	c->eos_token_ids[0] = 2;
	c->n_eos = 1;
	c->pad_token_id = -1;
	c->layer_kind = calloc((size_t)L, 1);
	c->layer_is_moe = calloc((size_t)L, 1);
	/* wq and wk, permuted (see the top comment), are the only copies. */
	float *own = malloc(((size_t)L * (size_t)(dim + kvd) * (size_t)dim) * sizeof *own);
	m->owned = own;
	if (!c->layer_kind || !c->layer_is_moe || !own) {
		rc = fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
		goto fail;
	}
	if ((rc = fp4s_tensors_expand(c, &m->specs, &m->n, err)))
		goto fail;
	m->w = calloc((size_t)m->n, sizeof *m->w);
	if (!m->w) {
		rc = fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
		goto fail;
	}
	const float *p = (const float *)((const uint8_t *)map + 28);
	const float *emb = p;
	p += V * dim;
	const float *rms_att = p;
	p += (int64_t)L * dim;
	const float *wq = p;
	p += (int64_t)L * dim * dim;
	const float *wk = p;
	p += (int64_t)L * kvd * dim;
	const float *wv = p;
	p += (int64_t)L * kvd * dim;
	const float *wo = p;
	p += (int64_t)L * dim * dim;
	const float *rms_ffn = p;
	p += (int64_t)L * dim;
	const float *w1 = p;
	p += (int64_t)L * dim * hidden;
	const float *w2 = p;
	p += (int64_t)L * dim * hidden;
	const float *w3 = p;
	p += (int64_t)L * dim * hidden;
	const float *rms_final = p;
	p += dim + (int64_t)seq * hs;
	const float *wcls = shared ? emb : p;
	float *qk = own;
	for (int32_t l = 0; l < L; l++) {
		permute_heads(qk, wq + (int64_t)l * dim * dim, nh, hs, dim);
		permute_heads(qk + (int64_t)dim * dim, wk + (int64_t)l * kvd * dim, nkv, hs, dim);
		qk += (int64_t)(dim + kvd) * dim;
	}
	for (int32_t i = 0; i < m->n; i++) {
		struct fp4s_weight *w = &m->w[i];
		const struct fp4s_tspec *s = &m->specs[i];
		int32_t l = s->layer;
		const float *d = NULL;
		float *lq = own + (int64_t)l * (dim + kvd) * dim;
		w->spec = s;
		switch (s->role) {
		case FP4S_ROLE_EMBED: d = emb; break;
		case FP4S_ROLE_LM_HEAD: d = wcls; break;
		case FP4S_ROLE_NORM:
			d = l < 0 ? rms_final
			    : strstr(s->name, "input_layernorm") ? rms_att + (int64_t)l * dim
			                                         : rms_ffn + (int64_t)l * dim;
			break;
		case FP4S_ROLE_ATTN_Q: d = lq; break;
		case FP4S_ROLE_ATTN_K: d = lq + (int64_t)dim * dim; break;
		case FP4S_ROLE_ATTN_V: d = wv + (int64_t)l * kvd * dim; break;
		case FP4S_ROLE_ATTN_O: d = wo + (int64_t)l * dim * dim; break;
		case FP4S_ROLE_MLP_GATE: d = w1 + (int64_t)l * dim * hidden; break;
		case FP4S_ROLE_MLP_UP: d = w3 + (int64_t)l * dim * hidden; break;
		case FP4S_ROLE_MLP_DOWN: d = w2 + (int64_t)l * dim * hidden; break;
		default: break;
		}
		if (!d) {
			rc = fp4s_error_set(err, FP4S_EFORMAT, "%s: no llama2.c weight for %s", path, s->name);
			goto fail;
		}
		w->data = d;
		w->fmt = FP4S_WF_F32;
		w->present = 1;
		w->data_bytes = fp4s_weight_bytes(w);
		w->file = m->dir;
	}
	return FP4S_OK;
fail:
	fp4s_model_close(m);
	return rc;
}
