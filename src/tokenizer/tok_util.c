/* tok_util.c: hash tables keyed by token text and by id pairs, growable buffers, UTF-8 helpers and
 * the GPT-2 byte-level alphabet. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* 64-bit FNV-1a folded with a multiply: token texts are short, so a simple byte loop is fast
 * enough and has no alignment concerns. */
uint64_t tok_hash_bytes(const void *p, size_t n)
{
	const unsigned char *s = p;
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ s[i]) * 0x100000001b3ull;
	return h ^ (h >> 29);
}

static uint32_t pow2_at_least(size_t n)
{
	uint32_t c = 16;
	while (c < n * 2 && c < (1u << 30))
		c <<= 1;
	return c;
}

int tok_strmap_init(struct tok_strmap *m, size_t expected)
{
	uint32_t cap = pow2_at_least(expected);
	m->slots = calloc(cap, sizeof *m->slots);
	if (!m->slots)
		return FP4S_ENOMEM;
	m->mask = cap - 1;
	m->count = 0;
	return 0;
}

void tok_strmap_free(struct tok_strmap *m)
{
	free(m->slots);
	m->slots = NULL;
}

int32_t tok_strmap_get(const struct fp4s_tokenizer *tok, const struct tok_strmap *m, const char *s, size_t n)
{
	if (!m->slots)
		return -1;
	uint32_t i = (uint32_t)tok_hash_bytes(s, n) & m->mask;
	for (;;) {
		uint32_t v = m->slots[i];
		if (!v)
			return -1;
		size_t len;
		const char *t = tok_text(tok, (int32_t)(v - 1), &len);
		if (len == n && memcmp(t, s, n) == 0)
			return (int32_t)(v - 1);
		i = (i + 1) & m->mask;
	}
}

static int strmap_grow(const struct fp4s_tokenizer *tok, struct tok_strmap *m)
{
	struct tok_strmap n;
	if (tok_strmap_init(&n, (size_t)(m->mask + 1)))
		return FP4S_ENOMEM;
	for (uint32_t i = 0; i <= m->mask; i++) {
		uint32_t v = m->slots[i];
		if (!v)
			continue;
		size_t len;
		const char *t = tok_text(tok, (int32_t)(v - 1), &len);
		uint32_t j = (uint32_t)tok_hash_bytes(t, len) & n.mask;
		while (n.slots[j])
			j = (j + 1) & n.mask;
		n.slots[j] = v;
		n.count++;
	}
	free(m->slots);
	*m = n;
	return 0;
}

int tok_strmap_put(const struct fp4s_tokenizer *tok, struct tok_strmap *m, int32_t id)
{
	if ((m->count + 1) * 2 > m->mask + 1 && strmap_grow(tok, m))
		return FP4S_ENOMEM;
	size_t n;
	const char *s = tok_text(tok, id, &n);
	uint32_t i = (uint32_t)tok_hash_bytes(s, n) & m->mask;
	for (;;) {
		uint32_t v = m->slots[i];
		if (!v)
			break;
		size_t len;
		const char *t = tok_text(tok, (int32_t)(v - 1), &len);
		if (len == n && memcmp(t, s, n) == 0)
			return 1;
		i = (i + 1) & m->mask;
	}
	m->slots[i] = (uint32_t)id + 1;
	m->count++;
	return 0;
}

int tok_pairmap_init(struct tok_pairmap *m, size_t expected)
{
	uint32_t cap = pow2_at_least(expected);
	m->keys = calloc(cap, sizeof *m->keys);
	m->rank = malloc(cap * sizeof *m->rank);
	m->merged = malloc(cap * sizeof *m->merged);
	if (!m->keys || !m->rank || !m->merged) {
		tok_pairmap_free(m);
		return FP4S_ENOMEM;
	}
	m->mask = cap - 1;
	m->count = 0;
	return 0;
}

void tok_pairmap_free(struct tok_pairmap *m)
{
	free(m->keys);
	free(m->rank);
	free(m->merged);
	m->keys = NULL;
	m->rank = m->merged = NULL;
}

/* The first occurrence of a pair keeps its rank, as in Hugging Face (a later duplicate merge line
 * can never fire because the earlier one always wins). Returns 1 for a duplicate. */
int tok_pairmap_put(struct tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged)
{
	if ((m->count + 1) * 2 > m->mask + 1)
		return FP4S_ENOMEM; /* sized up front from the merge count */
	uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
	uint64_t h = key * 0x9E3779B97F4A7C15ull;
	uint32_t i = (uint32_t)(h >> 32) & m->mask;
	while (m->keys[i]) {
		if (m->keys[i] == key)
			return 1;
		i = (i + 1) & m->mask;
	}
	m->keys[i] = key;
	m->rank[i] = rank;
	m->merged[i] = merged;
	m->count++;
	return 0;
}

int tok_alloc_vocab(struct fp4s_tokenizer *tok, int32_t n, struct fp4s_error *err)
{
	if (n <= 0 || n > TOK_MAX_VOCAB)
		return fp4s_error_set(err, FP4S_EFORMAT, "vocabulary size %d out of range (1..%d)", n,
				      TOK_MAX_VOCAB);
	tok->n_vocab = n;
	tok->tok_off = malloc((size_t)n * sizeof *tok->tok_off);
	tok->tok_flags = calloc((size_t)n, 1);
	if (!tok->tok_off || !tok->tok_flags)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory for %d tokens", n);
	memset(tok->tok_off, 0xFF, (size_t)n * sizeof *tok->tok_off);
	return 0;
}

int tok_set_text(struct fp4s_tokenizer *tok, int32_t id, const char *s, size_t n, struct fp4s_error *err)
{
	if (id < 0 || id >= tok->n_vocab)
		return fp4s_error_set(err, FP4S_EFORMAT, "token id %d out of range (vocab %d)", id, tok->n_vocab);
	if (n > TOK_MAX_TOKEN_BYTES)
		return fp4s_error_set(err, FP4S_EFORMAT, "token %d is %zu bytes long (limit %d)", id, n,
				      TOK_MAX_TOKEN_BYTES);
	if (tok->arena_n + n > tok->arena_cap) {
		size_t cap = tok->arena_cap ? tok->arena_cap * 2 : 1 << 16;
		while (cap < tok->arena_n + n)
			cap *= 2;
		char *a = realloc(tok->arena, cap);
		if (!a)
			return fp4s_error_set(err, FP4S_ENOMEM, "out of memory for token texts");
		tok->arena = a;
		tok->arena_cap = cap;
	}
	if (n) /* an empty first token leaves the arena NULL, and NULL + 0 is undefined */
		memcpy(tok->arena + tok->arena_n, s, n);
	tok->tok_off[id] = ((uint64_t)tok->arena_n << 16) | n;
	tok->arena_n += n;
	return 0;
}

int tok_ids_push(struct fp4s_tok_ids *ids, int32_t id)
{
	if (ids->n == ids->cap) {
		size_t cap = ids->cap ? ids->cap * 2 : 64;
		int32_t *v = realloc(ids->v, cap * sizeof *v);
		if (!v)
			return FP4S_ENOMEM;
		ids->v = v;
		ids->cap = cap;
	}
	ids->v[ids->n++] = id;
	return 0;
}

void fp4s_tok_ids_free(struct fp4s_tok_ids *ids)
{
	free(ids->v);
	ids->v = NULL;
	ids->n = ids->cap = 0;
}

int tok_text_append(struct fp4s_tok_text *t, const char *s, size_t n)
{
	if (t->n + n + 1 > t->cap) {
		size_t cap = t->cap ? t->cap : 64;
		while (cap < t->n + n + 1)
			cap *= 2;
		char *p = realloc(t->s, cap);
		if (!p)
			return FP4S_ENOMEM;
		t->s = p;
		t->cap = cap;
	}
	if (n)
		memcpy(t->s + t->n, s, n);
	t->n += n;
	t->s[t->n] = 0;
	return 0;
}

int tok_text_appendz(struct fp4s_tok_text *t, const char *s)
{
	return tok_text_append(t, s, strlen(s));
}

int fp4s_tok_text_append(struct fp4s_tok_text *t, const char *s, size_t n)
{
	return tok_text_append(t, s, n);
}

void fp4s_tok_text_free(struct fp4s_tok_text *t)
{
	free(t->s);
	t->s = NULL;
	t->n = t->cap = 0;
}

/* GPT-2 bytes_to_unicode, inverted: printable bytes (0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF) keep their
 * code point; the 68 others map in order to U+0100..U+0143, so every byte has a visible, non-space
 * character in vocab files. Returns the byte for cp, or -1 if cp is not in the alphabet. */
int tok_cp_to_byte(uint32_t cp)
{
	if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
		return (int)cp;
	if (cp >= 0x100 && cp <= 0x120)
		return (int)(cp - 0x100);
	if (cp >= 0x121 && cp <= 0x142)
		return (int)(cp - 0x121 + 0x7F);
	if (cp == 0x143)
		return 0xAD;
	return -1;
}

int tok_utf8_valid_len(const unsigned char *s, size_t n)
{
	unsigned c = s[0];
	if (c < 0x80)
		return 1;
	if (c < 0xC2)
		return 0;
	if (c < 0xE0) {
		if (n < 2 || (s[1] & 0xC0) != 0x80)
			return 0;
		return 2;
	}
	if (c < 0xF0) {
		if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80)
			return 0;
		if (c == 0xE0 && s[1] < 0xA0)
			return 0; /* overlong */
		if (c == 0xED && s[1] >= 0xA0)
			return 0; /* surrogate */
		return 3;
	}
	if (c < 0xF5) {
		if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
			return 0;
		if (c == 0xF0 && s[1] < 0x90)
			return 0;
		if (c == 0xF4 && s[1] >= 0x90)
			return 0;
		return 4;
	}
	return 0;
}

uint32_t tok_utf8_decode(const unsigned char *s, int len)
{
	switch (len) {
	case 1: return s[0];
	case 2: return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
	case 3: return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
	default:
		return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
		       ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
	}
}

int tok_utf8_encode(uint32_t cp, char out[4])
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xC0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (char)(0xE0 | (cp >> 12));
		out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
		out[2] = (char)(0x80 | (cp & 0x3F));
		return 3;
	}
	out[0] = (char)(0xF0 | (cp >> 18));
	out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
	out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
	out[3] = (char)(0x80 | (cp & 0x3F));
	return 4;
}
