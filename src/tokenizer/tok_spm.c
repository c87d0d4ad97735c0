/* tok_spm.c: llama2.c's tokenizer.bin (stories260K tok512.bin, Llama 2 tokenizer.bin) and the
 * SentencePiece BPE that goes with it.
 *
 * File: int32 max_token_length, then per token (until end of file; the count is not stored, the
 * model header has it): float32 score, int32 length, length bytes. SentencePiece's U+2581 "▁" was
 * exported as a plain space, control pieces as "<unk>", "\n<s>\n", "\n</s>\n", and byte pieces as
 * "<0xXX>".
 *
 * Encode (as SentencePiece / llama.cpp's SPM tokenizer): prefix one space ("add dummy prefix"),
 * start from one symbol per UTF-8 character, repeatedly merge the adjacent pair whose concatenation
 * is a vocab piece with the highest score (ties: leftmost), then map symbols to pieces and
 * byte-fall-back the rest (<0xXX> per byte). A heap keeps this O(n log n): llama2.c rescans all
 * pairs after each merge, which is quadratic. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

static int hexval(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* "<0xXX>" -> XX, else -1 (s has 6 bytes, not NUL-terminated) */
int tok_byte_piece(const char *s)
{
	if (memcmp(s, "<0x", 3) != 0 || s[5] != '>' || hexval(s[3]) < 0 || hexval(s[4]) < 0)
		return -1;
	return hexval(s[3]) * 16 + hexval(s[4]);
}

int tok_load_llama2c(struct fp4s_tokenizer *tok, const char *path, struct fp4s_error *err)
{
	char *buf;
	size_t n;
	int rc = tok_read_file(path, &buf, &n, (size_t)256 << 20, err);
	if (rc)
		return rc;
	const unsigned char *p = (const unsigned char *)buf, *end = p + n;
	int32_t max_len, count = 0;
	if (n < 4) {
		free(buf);
		return fp4s_error_set(err, FP4S_EFORMAT, "%s: too short for a llama2.c tokenizer", path);
	}
	memcpy(&max_len, p, 4);
	if (max_len <= 0 || max_len > TOK_MAX_TOKEN_BYTES) {
		free(buf);
		return fp4s_error_set(err, FP4S_EFORMAT, "%s: max_token_length %d out of range", path, max_len);
	}
	/* first pass: count and validate entries */
	for (const unsigned char *q = p + 4; q < end; count++) {
		int32_t l;
		if (end - q < 8 || count >= TOK_MAX_VOCAB) {
			free(buf);
			return fp4s_error_set(err, FP4S_EFORMAT, "%s: truncated entry %d", path, count);
		}
		memcpy(&l, q + 4, 4);
		if (l < 0 || l > max_len || end - q - 8 < l) {
			free(buf);
			return fp4s_error_set(err, FP4S_EFORMAT, "%s: token %d has bad length %d (max %d)", path,
					      count, l, max_len);
		}
		q += 8 + l;
	}
	tok->kind = FP4S_TOK_KIND_SPM_LLAMA2C;
	tok->max_piece_len = max_len;
	if ((rc = tok_alloc_vocab(tok, count, err)))
		goto out;
	tok->scores = malloc((size_t)count * sizeof *tok->scores);
	if (!tok->scores || tok_strmap_init(&tok->vocab, (size_t)count)) {
		rc = fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
		goto out;
	}
	for (int b = 0; b < 256; b++)
		tok->byte_id[b] = -1;
	tok->bos = tok->eos = -1;
	const unsigned char *q = p + 4;
	for (int32_t id = 0; id < count; id++) {
		int32_t l;
		memcpy(&tok->scores[id], q, 4);
		memcpy(&l, q + 4, 4);
		const char *s = (const char *)q + 8;
		q += 8 + l;
		if ((rc = tok_set_text(tok, id, s, (size_t)l, err)))
			goto out;
		int hx = l == 6 ? tok_byte_piece(s) : -1;
		if (hx >= 0 && tok->byte_id[hx] < 0) {
			tok->byte_id[hx] = id;
			tok->tok_flags[id] |= TOKF_BYTE;
			continue;
		}
		if ((l == 5 && !memcmp(s, "<unk>", 5)) || (l == 5 && !memcmp(s, "\n<s>\n", 5)) ||
		    (l == 6 && !memcmp(s, "\n</s>\n", 6))) {
			tok->tok_flags[id] |= TOKF_CONTROL | TOKF_SPECIAL;
			if (s[1] == '<' && s[2] == 's')
				tok->bos = id;
			else if (s[1] == '<' && s[2] == '/')
				tok->eos = id;
			continue;
		}
		if (l == 0)
			continue;
		tok_strmap_put(tok, &tok->vocab, id);
	}
	/* llama2.c always prepends BOS (run.c encode(..., bos=1, ...)) */
	tok->add_bos = tok->bos >= 0;
	tok_spm_finish(tok);
out:
	free(buf);
	if (rc)
		return fp4s_error_prefix(err, "%s: ", path);
	return 0;
}

struct spm_sym {
	int32_t start, len;
	int32_t prev, next;
};

struct spm_cand {
	float score;
	int32_t left, len; /* len of the merged text: detects stale entries */
};

static inline int spm_better(struct spm_cand a, struct spm_cand b)
{
	return a.score > b.score || (a.score == b.score && a.left < b.left);
}

struct spm_heap {
	struct spm_cand *v;
	size_t n, cap;
};

static int spm_push(struct spm_heap *h, struct spm_cand x)
{
	if (h->n == h->cap) {
		size_t cap = h->cap ? h->cap * 2 : 64;
		struct spm_cand *v = realloc(h->v, cap * sizeof *v);
		if (!v)
			return FP4S_ENOMEM;
		h->v = v;
		h->cap = cap;
	}
	size_t i = h->n++;
	while (i > 0 && spm_better(x, h->v[(i - 1) / 2])) {
		h->v[i] = h->v[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	h->v[i] = x;
	return 0;
}

static struct spm_cand spm_pop(struct spm_heap *h)
{
	struct spm_cand top = h->v[0], x = h->v[--h->n];
	size_t i = 0;
	for (;;) {
		size_t l = 2 * i + 1, m = i;
		struct spm_cand best = x;
		if (l < h->n && spm_better(h->v[l], best))
			m = l, best = h->v[l];
		if (l + 1 < h->n && spm_better(h->v[l + 1], best))
			m = l + 1;
		if (m == i)
			break;
		h->v[i] = h->v[m];
		i = m;
	}
	if (h->n)
		h->v[i] = x;
	return top;
}

static int spm_try_pair(const struct fp4s_tokenizer *tok, const char *text, struct spm_sym *sym, int32_t l,
			struct spm_heap *h)
{
	if (l < 0 || sym[l].next < 0)
		return 0;
	int32_t r = sym[l].next, len = sym[l].len + sym[r].len;
	if (len > tok->max_piece_len)
		return 0;
	int32_t id = tok_strmap_get(tok, &tok->vocab, text + sym[l].start, (size_t)len);
	if (id < 0)
		return 0;
	return spm_push(h, (struct spm_cand){tok->scores[id], l, len});
}

/* One chunk s[a, b) through score-ordered BPE; sym and h are scratch sized for the chunk. */
static int spm_chunk(const struct fp4s_tokenizer *tok, const char *s, int32_t a, int32_t b, struct spm_sym *sym,
		     struct spm_heap *h, struct fp4s_tok_ids *ids)
{
	int32_t ns = 0;
	int rc = 0;
	h->n = 0;
	for (int32_t i = a; i < b;) {
		int l = tok_utf8_valid_len((const unsigned char *)s + i, (size_t)(b - i));
		if (!l)
			l = 1; /* an invalid byte is its own symbol and will byte-fall-back */
		sym[ns] = (struct spm_sym){i, l, ns - 1, -1};
		if (ns > 0)
			sym[ns - 1].next = ns;
		ns++;
		i += l;
	}
	for (int32_t i = 0; i + 1 < ns && !rc; i++)
		rc = spm_try_pair(tok, s, sym, i, h);
	while (!rc && h->n) {
		struct spm_cand e = spm_pop(h);
		int32_t l = e.left, r = sym[l].next;
		if (sym[l].len == 0 || r < 0 || sym[l].len + sym[r].len != e.len)
			continue; /* stale */
		sym[l].len += sym[r].len;
		sym[r].len = 0;
		sym[l].next = sym[r].next;
		if (sym[r].next >= 0)
			sym[sym[r].next].prev = l;
		rc = spm_try_pair(tok, s, sym, sym[l].prev, h);
		if (!rc)
			rc = spm_try_pair(tok, s, sym, l, h);
	}
	for (int32_t i = 0; ns && i >= 0 && !rc; i = sym[i].next) {
		int32_t id = tok_strmap_get(tok, &tok->vocab, s + sym[i].start, (size_t)sym[i].len);
		if (id >= 0) {
			rc = tok_ids_push(ids, id);
			continue;
		}
		for (int32_t k = 0; k < sym[i].len && !rc; k++) {
			int32_t bid = tok->byte_id[(unsigned char)s[sym[i].start + k]];
			rc = tok_ids_push(ids, bid >= 0 ? bid : 0); /* no byte pieces: <unk> (id 0) */
		}
	}
	return rc;
}

void tok_spm_finish(struct fp4s_tokenizer *tok)
{
	/* If no piece has a space right after a non-space, no merge can join "x" and " y", so text
	 * may be cut before every such space and each word merged on its own: the same result with a
	 * small heap instead of one over the whole text. */
	tok->spm_split_ok = 1;
	for (int32_t id = 0; id < tok->n_vocab && tok->spm_split_ok; id++) {
		if (tok->tok_flags[id] & (TOKF_BYTE | TOKF_CONTROL))
			continue;
		size_t l;
		const char *t = tok_text(tok, id, &l);
		for (size_t k = 1; t && k < l; k++)
			if (t[k] == ' ' && t[k - 1] != ' ')
				tok->spm_split_ok = 0;
	}
}

int tok_spm_encode(const struct fp4s_tokenizer *tok, const char *text, size_t len, struct fp4s_tok_ids *ids,
		   struct fp4s_error *err)
{
	if (len == 0)
		return 0;
	if (len > (size_t)INT32_MAX - 2)
		return fp4s_error_set(err, FP4S_EINVAL, "text of %zu bytes is too long", len);
	char *s = malloc(len + 1);
	struct spm_sym *sym = malloc((len + 1) * sizeof *sym);
	struct spm_heap h = {0};
	int rc = 0;
	if (!s || !sym) {
		rc = FP4S_ENOMEM;
		goto out;
	}
	s[0] = ' ';
	memcpy(s + 1, text, len);
	int32_t n = (int32_t)len + 1, a = 0;
	if (tok->spm_split_ok) {
		for (int32_t i = 1; i < n && !rc; i++) {
			if (s[i] == ' ' && s[i - 1] != ' ') {
				rc = spm_chunk(tok, s, a, i, sym, &h, ids);
				a = i;
			}
		}
	}
	if (!rc)
		rc = spm_chunk(tok, s, a, n, sym, &h, ids);
out:
	free(s);
	free(sym);
	free(h.v);
	if (rc == FP4S_ENOMEM)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory while encoding %zu bytes", len);
	return rc;
}
