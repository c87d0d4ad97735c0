/* tok_encode.c: byte-level BPE encoding, in Hugging Face's order:
 *   1. added tokens are found by leftmost-longest match over the raw text (a byte trie);
 *   2. the text between them is normalized (NFC for Qwen) with utf8proc;
 *   3. each Split stage cuts it with its regex (PCRE2, JIT), keeping matches and gaps ("Isolated");
 *   4. each piece is one BPE word: with ignore_merges a piece that is itself a vocab entry is
 *      emitted directly, otherwise adjacent pairs merge lowest rank first (ties: leftmost).
 *
 * Time is linear in the input apart from a log factor: the merge loop keeps candidate pairs in a
 * binary heap over a linked list of symbols (stale heap entries are skipped when popped), so a
 * megabyte without spaces (one huge piece) costs O(n log n), not the O(n^2) of rescanning every
 * pair after each merge. The regexes have no nested quantifiers that backtrack more than the run
 * they end up matching.
 *
 * Invalid UTF-8 (which Hugging Face cannot receive, as Python and Rust strings are valid by
 * construction): each invalid byte becomes a one-byte piece between the valid runs around it, so it
 * round-trips through decode. Runs are cut there, which is the only sensible place. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_internal.h"
#include "util/log.h"

struct bpe_sym {
	int32_t id;
	int32_t prev, next; /* -1 / n at the ends */
};

struct bpe_cand {
	int32_t rank;
	int32_t pos; /* left symbol */
};

/* A per-call cache of BPE results for short words: on long texts the same words recur, and a merge
 * run costs far more than a hash probe. Direct-mapped, so a collision just recomputes. */
#define WC_SLOTS 4096
#define WC_KEY 16
#define WC_IDS 8
struct word_cache_slot {
	uint8_t len, n_ids; /* len 0 = empty */
	char key[WC_KEY];
	int32_t ids[WC_IDS];
};

struct enc_ctx {
	const struct fp4s_tokenizer *tok;
	struct fp4s_tok_ids *ids;
	struct fp4s_error *err;
	pcre2_match_data *md[TOK_MAX_PRETOK_STAGES];
	pcre2_match_context *mctx;
	pcre2_jit_stack *jstack;
	struct bpe_sym *sym;
	size_t cap_sym;
	struct bpe_cand *heap;
	size_t n_heap, cap_heap;
	int oom;
	struct word_cache_slot *wc; /* NULL: no cache (short texts) */
};

static inline int cand_less(struct bpe_cand a, struct bpe_cand b)
{
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(struct enc_ctx *c, int32_t rank, int32_t pos)
{
	if (c->n_heap == c->cap_heap) {
		size_t cap = c->cap_heap ? c->cap_heap * 2 : 64;
		struct bpe_cand *h = realloc(c->heap, cap * sizeof *h);
		if (!h) {
			c->oom = 1;
			return;
		}
		c->heap = h;
		c->cap_heap = cap;
	}
	struct bpe_cand x = {rank, pos};
	size_t i = c->n_heap++;
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!cand_less(x, c->heap[p]))
			break;
		c->heap[i] = c->heap[p];
		i = p;
	}
	c->heap[i] = x;
}

static struct bpe_cand heap_pop(struct enc_ctx *c)
{
	struct bpe_cand top = c->heap[0], x = c->heap[--c->n_heap];
	size_t i = 0, n = c->n_heap;
	for (;;) {
		size_t l = 2 * i + 1, m = i;
		struct bpe_cand best = x;
		if (l < n && cand_less(c->heap[l], best))
			m = l, best = c->heap[l];
		if (l + 1 < n && cand_less(c->heap[l + 1], best))
			m = l + 1;
		if (m == i)
			break;
		c->heap[i] = c->heap[m];
		i = m;
	}
	if (n)
		c->heap[i] = x;
	return top;
}

static void push_pair(struct enc_ctx *c, int32_t left)
{
	struct bpe_sym *s = c->sym;
	int32_t right = s[left].next;
	if (left < 0 || right < 0 || s[right].id < 0)
		return;
	long k = tok_pairmap_find(&c->tok->merges, s[left].id, s[right].id);
	if (k >= 0)
		heap_push(c, c->tok->merges.rank[k], left);
}

static int bpe_merge(struct enc_ctx *c, const unsigned char *p, size_t n);

/* One pre-token through BPE. */
static int bpe_word(struct enc_ctx *c, const unsigned char *p, size_t n)
{
	if (!c->wc || n < 2 || n > WC_KEY)
		return bpe_merge(c, p, n);
	struct word_cache_slot *w = &c->wc[tok_hash_bytes(p, n) & (WC_SLOTS - 1)];
	if (w->len == n && memcmp(w->key, p, n) == 0) {
		for (int i = 0; i < w->n_ids; i++)
			if (tok_ids_push(c->ids, w->ids[i]))
				return FP4S_ENOMEM;
		return 0;
	}
	size_t before = c->ids->n;
	int rc = bpe_merge(c, p, n);
	size_t k = c->ids->n - before;
	if (!rc && k <= WC_IDS) {
		w->len = (uint8_t)n;
		w->n_ids = (uint8_t)k;
		memcpy(w->key, p, n);
		memcpy(w->ids, c->ids->v + before, k * sizeof *w->ids);
	}
	return rc;
}

static int bpe_merge(struct enc_ctx *c, const unsigned char *p, size_t n)
{
	const struct fp4s_tokenizer *tok = c->tok;
	if (n == 0)
		return 0;
	if (n == 1)
		return tok_ids_push(c->ids, tok->byte_id[p[0]]);
	if (tok->ignore_merges) {
		int32_t id = tok_strmap_get(tok, &tok->vocab, (const char *)p, n);
		if (id >= 0)
			return tok_ids_push(c->ids, id);
	}
	if (n > INT32_MAX / 2)
		return fp4s_error_set(c->err, FP4S_EINVAL, "pre-token of %zu bytes is too long", n);
	if (n > c->cap_sym) {
		size_t cap = c->cap_sym ? c->cap_sym : 64;
		while (cap < n)
			cap *= 2;
		struct bpe_sym *s = realloc(c->sym, cap * sizeof *s);
		if (!s)
			return FP4S_ENOMEM;
		c->sym = s;
		c->cap_sym = cap;
	}
	struct bpe_sym *s = c->sym;
	int32_t nn = (int32_t)n;
	for (int32_t i = 0; i < nn; i++)
		s[i] = (struct bpe_sym){tok->byte_id[p[i]], i - 1, i + 1 < nn ? i + 1 : -1};
	c->n_heap = 0;
	for (int32_t i = 0; i + 1 < nn; i++)
		push_pair(c, i);
	while (c->n_heap && !c->oom) {
		struct bpe_cand e = heap_pop(c);
		int32_t l = e.pos, r = s[l].next;
		if (s[l].id < 0 || r < 0)
			continue; /* stale: the left symbol was merged away or is now last */
		long k = tok_pairmap_find(&tok->merges, s[l].id, s[r].id);
		if (k < 0 || tok->merges.rank[k] != e.rank)
			continue; /* stale: a neighbour changed since this pair was queued */
		s[l].id = tok->merges.merged[k];
		s[r].id = -1;
		s[l].next = s[r].next;
		if (s[r].next >= 0)
			s[s[r].next].prev = l;
		if (s[l].prev >= 0)
			push_pair(c, s[l].prev);
		push_pair(c, l);
	}
	if (c->oom)
		return FP4S_ENOMEM;
	for (int32_t i = 0; i >= 0; i = s[i].next)
		if (tok_ids_push(c->ids, s[i].id))
			return FP4S_ENOMEM;
	return 0;
}

static int pretok(struct enc_ctx *c, int stage, const char *s, size_t n)
{
	const struct fp4s_tokenizer *tok = c->tok;
	if (n == 0)
		return 0;
	if (stage == tok->n_stages)
		return bpe_word(c, (const unsigned char *)s, n);
	pcre2_code *re = tok->stages[stage].re;
	pcre2_match_data *md = c->md[stage];
	if (!re) {
		if (s[0] == ' ')
			return pretok(c, stage + 1, s, n);
		char *t = malloc(n + 1);
		if (!t)
			return FP4S_ENOMEM;
		t[0] = ' ';
		memcpy(t + 1, s, n);
		int r = pretok(c, stage + 1, t, n + 1);
		free(t);
		return r;
	}
	size_t gap = 0, pos = 0;
	int rc;
	while (pos < n) {
		int m = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, c->mctx);
		if (m == PCRE2_ERROR_JIT_STACKLIMIT && !c->jstack) {
			/* the JIT's default 32 KiB stack ran out (a very long run): retry with a big one,
			 * made only now so that ordinary calls do not pay for it */
			c->mctx = pcre2_match_context_create(NULL);
			c->jstack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, NULL);
			if (!c->mctx || !c->jstack)
				return FP4S_ENOMEM;
			pcre2_jit_stack_assign(c->mctx, NULL, c->jstack);
			FP4S_DEBUG("tokenizer: PCRE2 JIT stack grown for a %zu-byte run", n);
			continue;
		}
		if (m == PCRE2_ERROR_NOMATCH)
			break;
		if (m < 0) {
			PCRE2_UCHAR msg[256];
			pcre2_get_error_message(m, msg, sizeof msg);
			return fp4s_error_set(c->err, FP4S_EINVAL, "pre-tokenizer regex failed: %s", (char *)msg);
		}
		PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
		size_t ms = ov[0], me = ov[1];
		if (me == ms) {
			/* an empty match splits nothing; step over one character and search on */
			int l = tok_utf8_valid_len((const unsigned char *)s + ms, n - ms);
			pos = ms + (size_t)(l ? l : 1);
			continue;
		}
		if (ms > gap && (rc = pretok(c, stage + 1, s + gap, ms - gap)))
			return rc;
		if ((rc = pretok(c, stage + 1, s + ms, me - ms)))
			return rc;
		gap = pos = me;
	}
	if (gap < n)
		return pretok(c, stage + 1, s + gap, n - gap);
	return 0;
}

#define NFC_TABLE_CPS 0x30000

int tok_nfc_table(struct fp4s_tokenizer *tok, struct fp4s_error *err)
{
	uint8_t *t = malloc(NFC_TABLE_CPS / 8);
	if (!t)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	memset(t, 0xFF, NFC_TABLE_CPS / 8);
	for (int32_t cp = 0; cp < NFC_TABLE_CPS; cp++) {
		const utf8proc_property_t *p = utf8proc_get_property(cp);
		if (p->combining_class != 0)
			t[cp >> 3] &= (uint8_t)~(1u << (cp & 7));
		utf8proc_int32_t d[8];
		int last = 0;
		utf8proc_ssize_t n = utf8proc_decompose_char(cp, d, 8, UTF8PROC_DECOMPOSE, &last);
		if (n <= 1 && (n < 1 || d[0] == cp))
			continue;
		/* anything after the first code point of a canonical decomposition can compose with
		 * what precedes it (combining marks, Hangul V/T jamo, Indic vowel parts) */
		for (utf8proc_ssize_t k = 1; k < n && k < 8; k++)
			if (d[k] >= 0 && d[k] < NFC_TABLE_CPS)
				t[d[k] >> 3] &= (uint8_t)~(1u << (d[k] & 7));
		/* a decomposable code point is safe only if NFC maps it back to itself (precomposed
		 * letters do; singletons and composition exclusions do not) */
		utf8proc_uint8_t one[8], *nfc = NULL;
		utf8proc_ssize_t l = utf8proc_encode_char(cp, one);
		utf8proc_ssize_t r = utf8proc_map(one, l, &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
		if (r != l || memcmp(nfc, one, (size_t)l) != 0)
			t[cp >> 3] &= (uint8_t)~(1u << (cp & 7));
		free(nfc);
	}
	tok->nfc_safe = t;
	return 0;
}

static inline int nfc_safe_at(const struct fp4s_tokenizer *tok, const unsigned char *p, size_t n, int *len)
{
	if (p[0] < 0x80) {
		*len = 1;
		return 1;
	}
	*len = tok_utf8_valid_len(p, n);
	uint32_t cp = tok_utf8_decode(p, *len);
	return cp < NFC_TABLE_CPS && (tok->nfc_safe[cp >> 3] & (1u << (cp & 7)));
}

static int append(char **buf, size_t *n, size_t *cap, const void *s, size_t k)
{
	if (k == 0)
		return 0; /* nothing to copy, and *buf may still be NULL */
	if (*n + k > *cap) {
		size_t c = *cap ? *cap * 2 : 256;
		while (c < *n + k)
			c *= 2;
		char *b = realloc(*buf, c);
		if (!b)
			return FP4S_ENOMEM;
		*buf = b;
		*cap = c;
	}
	memcpy(*buf + *n, s, k);
	*n += k;
	return 0;
}

/* NFC of a valid UTF-8 run, normalizing only the stretches that need it: a stretch starts at the
 * last safe code point before an unsafe one (it may compose with what follows) and ends before
 * the next safe one (which can neither compose with nor reorder across what precedes it). Sets
 * *out to NULL when the run is already NFC. */
static int nfc_run(const struct fp4s_tokenizer *tok, const char *s, size_t n, char **out, size_t *out_n)
{
	const unsigned char *p = (const unsigned char *)s;
	char *buf = NULL;
	size_t bn = 0, cap = 0, copied = 0, last_safe = 0, i = 0;
	int have_safe = 0, l;
	*out = NULL;
	while (i < n) {
		if (nfc_safe_at(tok, p + i, n - i, &l)) {
			last_safe = i;
			have_safe = 1;
			i += (size_t)l;
			continue;
		}
		size_t r = have_safe && last_safe >= copied ? last_safe : copied, j = i + (size_t)l;
		while (j < n && !nfc_safe_at(tok, p + j, n - j, &l))
			j += (size_t)l;
		utf8proc_uint8_t *norm = NULL;
		utf8proc_ssize_t k = utf8proc_map(p + r, (utf8proc_ssize_t)(j - r), &norm, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
		if (k < 0) {
			free(buf);
			return FP4S_EINVAL;
		}
		int rc = append(&buf, &bn, &cap, s + copied, r - copied);
		if (!rc)
			rc = append(&buf, &bn, &cap, norm, (size_t)k);
		free(norm);
		if (rc) {
			free(buf);
			return rc;
		}
		copied = i = j;
		have_safe = 0;
	}
	if (buf && append(&buf, &bn, &cap, s + copied, n - copied)) {
		free(buf);
		return FP4S_ENOMEM;
	}
	*out = buf;
	*out_n = bn;
	return 0;
}

static int is_ascii(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] >= 0x80)
			return 0;
	return 1;
}

/* utf8proc_map for the composing forms, run by run between U+11A7s: utf8proc before 2.11
 * (Debian's is 2.8.0) composes an LV syllable with U+11A7 and drops the jamo, where Unicode
 * keeps it (U+11A7 is T_BASE, not a trailing consonant; fixed upstream in utf8proc pull request
 * 317). U+11A7 composes with nothing on either side, so normalizing the runs between its
 * occurrences and keeping it gives Unicode's result, as Hugging Face's tokenizers give. nfc_run
 * needs none of this: U+11A7 is one of its safe code points, never inside what it normalizes.
 * Returns utf8proc_map's result: the length of *out (malloc'd, NUL-terminated) or an error. */
static utf8proc_ssize_t map_composed(const utf8proc_uint8_t *s, utf8proc_ssize_t n, utf8proc_uint8_t **out,
                                     utf8proc_option_t opt)
{
	static const char tb[] = "\xE1\x86\xA7"; /* U+11A7 */
	const char *p = (const char *)s, *end = p + n;
	if (!memmem(p, (size_t)n, tb, 3))
		return utf8proc_map(s, n, out, opt);
	char *buf = NULL;
	size_t bn = 0, cap = 0;
	for (;;) {
		const char *q = memmem(p, (size_t)(end - p), tb, 3), *stop = q ? q : end;
		utf8proc_uint8_t *piece = NULL;
		const utf8proc_ssize_t k =
			stop > p ? utf8proc_map((const utf8proc_uint8_t *)p, (utf8proc_ssize_t)(stop - p), &piece, opt) : 0;
		const int rc = k < 0 || append(&buf, &bn, &cap, piece, (size_t)k) ||
			       append(&buf, &bn, &cap, q ? tb : "", q ? 3 : 1); /* U+11A7, or the closing NUL */
		free(piece);
		if (rc) {
			free(buf);
			return k < 0 ? k : UTF8PROC_ERROR_NOMEM;
		}
		if (!q)
			break;
		p = q + 3;
	}
	*out = (utf8proc_uint8_t *)buf;
	return (utf8proc_ssize_t)(bn - 1);
}

/* Normalizes a valid UTF-8 run and pre-tokenizes it. */
static int encode_valid(struct enc_ctx *c, const char *s, size_t n)
{
	const struct fp4s_tokenizer *tok = c->tok;
	utf8proc_uint8_t *norm = NULL;
	int rc;
	if (tok->norm == TOK_NORM_NFC && tok->nfc_safe) {
		char *o;
		size_t on;
		if ((rc = nfc_run(tok, s, n, &o, &on)))
			return rc == FP4S_ENOMEM ? rc : fp4s_error_set(c->err, FP4S_EINVAL, "NFC normalization failed");
		if (o) {
			norm = (utf8proc_uint8_t *)o;
			s = o;
			n = on;
		}
	} else if (tok->norm != TOK_NORM_NONE && !is_ascii(s, n)) {
		utf8proc_option_t opt = UTF8PROC_STABLE;
		switch (tok->norm) {
		case TOK_NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
		case TOK_NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
		case TOK_NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
		default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
		}
		if (n > (size_t)PTRDIFF_MAX / 8)
			return fp4s_error_set(c->err, FP4S_EINVAL, "text too long");
		utf8proc_ssize_t r = opt & UTF8PROC_COMPOSE
			? map_composed((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &norm, opt)
			: utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &norm, opt);
		if (r < 0)
			return fp4s_error_set(c->err, FP4S_EINVAL, "normalization failed: %s", utf8proc_errmsg(r));
		s = (const char *)norm;
		n = (size_t)r;
	}
	rc = pretok(c, 0, s, n);
	free(norm);
	return rc;
}

/* Text between added tokens: valid UTF-8 runs go through the regexes, invalid bytes alone. */
static int encode_segment(struct enc_ctx *c, const char *s, size_t n)
{
	size_t i = 0;
	int rc;
	while (i < n) {
		size_t j = i;
		while (j < n) {
			if ((unsigned char)s[j] < 0x80) {
				j++;
				continue;
			}
			int l = tok_utf8_valid_len((const unsigned char *)s + j, n - j);
			if (!l)
				break;
			j += (size_t)l;
		}
		if (j > i && (rc = encode_valid(c, s + i, j - i)))
			return rc;
		if (j < n && (rc = tok_ids_push(c->ids, c->tok->byte_id[(unsigned char)s[j]])))
			return rc;
		i = j + 1;
	}
	return 0;
}

static int is_space(unsigned char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Longest allowed added token starting at s; returns its index and sets *len, or -1. */
static int match_added(const struct fp4s_tokenizer *tok, const char *s, size_t n, unsigned flags, size_t *len)
{
	int32_t node = 0;
	int best = -1;
	for (size_t i = 0; i < n; i++) {
		unsigned char b = (unsigned char)s[i];
		int32_t ch = tok->trie[node].first_child;
		while (ch >= 0 && tok->trie[ch].byte != b)
			ch = tok->trie[ch].next_sibling;
		if (ch < 0)
			break;
		node = ch;
		int t = tok->trie[node].token;
		if (t >= 0 && (!tok->added[t].special || (flags & FP4S_TOK_PARSE_SPECIAL))) {
			best = t;
			*len = i + 1;
		}
	}
	return best;
}

int tok_bpe_encode(const struct fp4s_tokenizer *tok, const char *text, size_t len, unsigned flags,
		   struct fp4s_tok_ids *ids, struct fp4s_error *err)
{
	struct enc_ctx c = {.tok = tok, .ids = ids, .err = err};
	int rc = 0;
	for (int i = 0; i < tok->n_stages; i++)
		if (tok->stages[i].re && !(c.md[i] = pcre2_match_data_create_from_pattern(tok->stages[i].re, NULL)))
			rc = FP4S_ENOMEM;

	if (!rc && len >= 16384)
		c.wc = calloc(WC_SLOTS, sizeof *c.wc); /* on failure encode simply runs uncached */
	if (!rc && (flags & FP4S_TOK_ADD_SPECIAL) && tok->add_bos && tok->bos >= 0)
		rc = tok_ids_push(ids, tok->bos);
	size_t seg = 0, pos = 0;
	while (!rc && pos < len) {
		if (!tok->added_first[(unsigned char)text[pos]]) {
			pos++;
			continue;
		}
		size_t mlen = 0;
		int a = match_added(tok, text + pos, len - pos, flags, &mlen);
		if (a < 0) {
			pos++;
			continue;
		}
		size_t seg_end = pos, next = pos + mlen;
		if (tok->added[a].lstrip)
			while (seg_end > seg && is_space((unsigned char)text[seg_end - 1]))
				seg_end--;
		if (tok->added[a].rstrip)
			while (next < len && is_space((unsigned char)text[next]))
				next++;
		rc = encode_segment(&c, text + seg, seg_end - seg);
		if (!rc)
			rc = tok_ids_push(ids, tok->added[a].id);
		seg = pos = next;
	}
	if (!rc)
		rc = encode_segment(&c, text + seg, len - seg);
	if (!rc && (flags & FP4S_TOK_ADD_SPECIAL) && tok->add_eos && tok->eos >= 0)
		rc = tok_ids_push(ids, tok->eos);

	for (int i = 0; i < tok->n_stages; i++)
		pcre2_match_data_free(c.md[i]);
	pcre2_match_context_free(c.mctx);
	pcre2_jit_stack_free(c.jstack);
	free(c.sym);
	free(c.heap);
	free(c.wc);
	if (rc == FP4S_ENOMEM)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory while encoding %zu bytes", len);
	return rc;
}
