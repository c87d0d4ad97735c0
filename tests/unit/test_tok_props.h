/* test_tok_props.h: property checks shared by test_tok_props_npm.c (Llama 3, Qwen3, gpt-oss from the
 * npm cache) and test_tok_props_real.c (stories260K and Llama 2 from ../shared/realdata):
 *   - decode(encode(x)) == x on random Unicode text (Qwen3: == NFC(x), its normalizer's output);
 *   - the same for invalid UTF-8 and NUL bytes (documented choice: bytes pass through; see
 *     tokenizer.h), with special-token parsing on and off;
 *   - streaming decode emits only valid UTF-8 and, for valid input, the same text as decode;
 *   - 1 MB without spaces (letters, CJK, digits, punctuation, one repeated byte) and 100k
 *     special-token look-alikes finish (the CTest timeout bounds them; the BPE is O(n log n)) and
 *     round-trip;
 *   - known ids, BOS/EOS rules and stop ids of each family;
 *   - SentencePiece: ids equal to a quadratic llama2.c-style reference on random word sequences.
 * Inputs are random (seed printed; FP4S_TEST_SEED replays). */
#ifndef TEST_TOK_PROPS_H
#define TEST_TOK_PROPS_H

#include <utf8proc.h>

#include "nfc_ref.h"

#include "test_tok_common.h"
#include "test_util.h"

struct named_tok {
	const char *name;
	struct fp4s_tokenizer *tok;
	int nfc;
};

static inline int tok_utf8_len_ref(const unsigned char *s, int n)
{
	int l = *s < 0x80 ? 1 : *s < 0xE0 ? 2 : *s < 0xF0 ? 3 : 4;
	return l <= n ? l : 1;
}

static inline int valid_utf8(const char *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s + i;
		utf8proc_int32_t cp;
		utf8proc_ssize_t l = utf8proc_iterate(p, (utf8proc_ssize_t)(n - i), &cp);
		if (l <= 0)
			return 0;
		i += (size_t)l;
	}
	return 1;
}

/* Random text from character classes the pre-tokenizers treat differently. */
static inline size_t rand_text(char *buf, size_t cap)
{
	static const uint32_t pool[] = {
		'a', 'Z', 'q', ' ', ' ', ' ', '\n', '\t', '\r', '0', '7', '\'', '.', ',', '!', '/', '-', '<', '|', '>',
		0xE9, 0xFC, 0xDF, 0x301 /* combining acute */, 0x308, 0x3B1, 0x416, 0x5D0, 0x627, 0x915, 0x93F,
		0x4E2D, 0x65E5, 0x672C, 0x3042, 0xAC00, 0x1F600, 0x1F680, 0x200D, 0xFE0F, 0xA0, 0x2009, 0x3000,
		0x10FFFF, 0xE000, 0x2028,
		/* NFC: composing seconds with class 0 (Hangul V/T jamo, kana voicing, Indic vowel parts),
		 * singletons and exclusions that NFC replaces, and their partners */
		0x1100, 0x1161, 0x11A8, 0xAC00, 0x304B, 0x3099, 0x0B47, 0x0B3E, 0x212B, 0x2126, 0x0958, 0x0915, 0x093C,
		0x0344, 0x1F80, 0x1F00, 0x0345, 0xF900, 0x2F800,
	};
	size_t n = 0, len = t_rand_u64() % 120;
	for (size_t i = 0; i < len; i++) {
		uint32_t cp = t_rand_u64() % 4 ? pool[t_rand_u64() % (sizeof pool / sizeof *pool)]
						: (uint32_t)(0x20 + t_rand_u64() % 0x2FFE0);
		if (cp >= 0xD800 && cp < 0xE000)
			cp = 'x';
		if (n + 4 >= cap)
			break;
		n += (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)buf + n);
	}
	buf[n] = 0;
	return n;
}

static inline size_t rand_bytes(char *buf, size_t cap)
{
	size_t len = t_rand_u64() % 64;
	if (len >= cap)
		len = cap - 1;
	for (size_t i = 0; i < len; i++) {
		unsigned r = (unsigned)t_rand_u64();
		buf[i] = r % 3 ? (char)((r >> 8) & 0xFF) : "ab \n\0\x80\xC3\xE2\xF0\xFF"[(r >> 8) % 10];
	}
	return len;
}

/* x -> ids -> bytes; compares with want (x or its normal form). Also streams the ids. */
static inline int roundtrip(struct named_tok *nt, const char *x, size_t n, const char *want, size_t wn, unsigned flags)
{
	struct fp4s_tok_ids ids = {0};
	struct fp4s_tok_text out = {0}, st = {0};
	struct fp4s_error err = {0};
	int ok = fp4s_tok_encode(nt->tok, x, n, flags, &ids, &err) == 0;
	CHECK_MSG(ok, "%s: encode failed: %s", nt->name, err.msg);
	ok = ok && fp4s_tok_decode(nt->tok, ids.v, ids.n, 0, &out, &err) == 0;
	ok = ok && out.n == wn && memcmp(out.s, want, wn) == 0;
	if (!ok) {
		fprintf(stderr, "%s: round trip differs for (%zu bytes):", nt->name, n);
		for (size_t i = 0; i < n && i < 80; i++)
			fprintf(stderr, " %02x", (unsigned char)x[i]);
		fprintf(stderr, "\n  got %zu bytes:", out.n);
		for (size_t i = 0; i < out.n && i < 80; i++)
			fprintf(stderr, " %02x", (unsigned char)out.s[i]);
		fprintf(stderr, "\n");
	}
	CHECK(ok);
	/* streaming: each push appends only whole, valid UTF-8 */
	struct fp4s_tok_stream s;
	fp4s_tok_stream_init(&s, nt->tok, 0);
	int stream_ok = 1;
	for (size_t i = 0; i < ids.n; i++) {
		size_t before = st.n;
		if (fp4s_tok_stream_push(&s, ids.v[i], &st, &err) != 0 || !valid_utf8(st.s + before, st.n - before))
			stream_ok = 0;
	}
	fp4s_tok_stream_flush(&s, &st);
	if (valid_utf8(want, wn))
		stream_ok = stream_ok && st.n == wn && (wn == 0 || memcmp(st.s, want, wn) == 0);
	else
		stream_ok = stream_ok && (st.n == 0 || valid_utf8(st.s, st.n));
	CHECK_MSG(stream_ok, "%s: stream decode differs or emitted invalid UTF-8", nt->name);
	fp4s_tok_ids_free(&ids);
	fp4s_tok_text_free(&out);
	fp4s_tok_text_free(&st);
	return ok;
}

static inline void random_props(struct named_tok *nt, int iters)
{
	char buf[1024];
	int fails = 0;
	for (int it = 0; it < iters && fails < 5; it++) {
		size_t n = rand_text(buf, sizeof buf);
		unsigned flags = it % 2 ? FP4S_TOK_PARSE_SPECIAL : 0;
		if (nt->nfc) {
			utf8proc_uint8_t *norm = t_nfc_ref((const utf8proc_uint8_t *)buf);
			fails += !roundtrip(nt, buf, n, (const char *)norm, strlen((char *)norm), flags);
			free(norm);
		} else {
			fails += !roundtrip(nt, buf, n, buf, n, flags);
		}
		/* invalid UTF-8 and NUL bytes: kept byte for byte (NFC leaves ASCII and lone bytes alone,
		 * but may change a valid run; compare only where no normalizer applies) */
		n = rand_bytes(buf, sizeof buf);
		if (!nt->nfc)
			fails += !roundtrip(nt, buf, n, buf, n, flags);
		else {
			struct fp4s_tok_ids ids = {0};
			struct fp4s_error err = {0};
			CHECK(fp4s_tok_encode(nt->tok, buf, n, flags, &ids, &err) == 0);
			fp4s_tok_ids_free(&ids);
		}
	}
}

static inline void big_inputs(struct named_tok *nt)
{
	const size_t MB = 1 << 20;
	char *b = malloc(MB + 8);
	static const char *const units[] = {"a", "Zq", "日本", "7", "#", "\xF0\x9F\x98\x80", "x\xCC\x81", " ", "\r\n", " \t", "'s"};
	for (size_t u = 0; u < sizeof units / sizeof *units; u++) {
		size_t ul = strlen(units[u]), n = 0;
		while (n + ul <= MB)
			memcpy(b + n, units[u], ul), n += ul;
		if (nt->nfc && u == 6)
			continue; /* NFC composes x + U+0301; covered by the random test */
		roundtrip(nt, b, n, b, n, 0);
	}
	/* random letters, one megabyte, no spaces */
	for (size_t i = 0; i < MB; i++)
		b[i] = (char)('a' + t_rand_u64() % 26);
	roundtrip(nt, b, MB, b, MB, 0);
	free(b);
}

static inline void lookalikes(struct named_tok *nt, const char *special, const char *partial)
{
	int32_t sid = fp4s_tok_find(nt->tok, special);
	size_t sl = strlen(special), pl = strlen(partial), N = 100000;
	char *b = malloc(N * (sl > pl ? sl : pl) + 1);
	/* 100k truncated specials: no special id, round trip */
	for (size_t i = 0; i < N; i++)
		memcpy(b + i * pl, partial, pl);
	roundtrip(nt, b, N * pl, b, N * pl, FP4S_TOK_PARSE_SPECIAL);
	/* 100k real specials: exactly 100k ids when parsed, none when not */
	for (size_t i = 0; i < N; i++)
		memcpy(b + i * sl, special, sl);
	struct fp4s_tok_ids ids = {0};
	struct fp4s_error err = {0};
	CHECK(fp4s_tok_encode(nt->tok, b, N * sl, FP4S_TOK_PARSE_SPECIAL, &ids, &err) == 0);
	CHECK_EQ_INT(ids.n, N);
	CHECK(ids.n > 0 && ids.v[0] == sid && ids.v[ids.n - 1] == sid);
	ids.n = 0;
	CHECK(fp4s_tok_encode(nt->tok, b, N * sl, 0, &ids, &err) == 0);
	int any = 0;
	for (size_t i = 0; i < ids.n; i++)
		any |= ids.v[i] == sid;
	CHECK_MSG(!any, "%s: special token matched with parsing off", nt->name);
	fp4s_tok_ids_free(&ids);
	free(b);
}

static inline void expect_ids(struct named_tok *nt, const char *text, unsigned flags, const int32_t *want, size_t n)
{
	struct fp4s_tok_ids ids = {0};
	struct fp4s_error err = {0};
	CHECK(fp4s_tok_encode(nt->tok, text, strlen(text), flags, &ids, &err) == 0);
	int ok = ids.n == n;
	for (size_t i = 0; ok && i < n; i++)
		ok = ids.v[i] == want[i];
	CHECK_MSG(ok, "%s: ids of \"%s\" differ (got %zu ids, first %d)", nt->name, text, ids.n, ids.n ? ids.v[0] : -1);
	fp4s_tok_ids_free(&ids);
}

static inline int has_stop(struct named_tok *nt, int32_t id)
{
	size_t n;
	const int32_t *s = fp4s_tok_stop_ids(nt->tok, &n);
	for (size_t i = 0; i < n; i++)
		if (s[i] == id)
			return 1;
	return 0;
}

static inline void skip_special(struct named_tok *nt, const char *text, const char *want_skipped)
{
	struct fp4s_tok_ids ids = {0};
	struct fp4s_tok_text out = {0};
	struct fp4s_error err = {0};
	CHECK(fp4s_tok_encode(nt->tok, text, strlen(text), FP4S_TOK_PARSE_SPECIAL, &ids, &err) == 0);
	CHECK(fp4s_tok_decode(nt->tok, ids.v, ids.n, FP4S_TOK_SKIP_SPECIAL, &out, &err) == 0);
	CHECK_EQ_STR(out.s, want_skipped);
	fp4s_tok_ids_free(&ids);
	fp4s_tok_text_free(&out);
}

/* A reference SentencePiece BPE straight from llama2.c's algorithm (rescan every pair, merge the
 * best score, leftmost on ties; quadratic, fine for short texts), reading the .bin on its own. */
struct ref_vocab {
	int n;
	char **text;
	int *len;
	float *score;
};

static inline int ref_load(struct ref_vocab *v, const char *path)
{
	size_t sz;
	char *b = tt_read(path, &sz);
	if (!b)
		return -1;
	v->n = 0;
	v->text = NULL, v->len = NULL, v->score = NULL;
	for (size_t o = 4; o + 8 <= sz;) {
		int32_t l;
		memcpy(&l, b + o + 4, 4);
		v->text = realloc(v->text, (size_t)(v->n + 1) * sizeof *v->text);
		v->len = realloc(v->len, (size_t)(v->n + 1) * sizeof *v->len);
		v->score = realloc(v->score, (size_t)(v->n + 1) * sizeof *v->score);
		memcpy(&v->score[v->n], b + o, 4);
		v->text[v->n] = malloc((size_t)l + 1);
		memcpy(v->text[v->n], b + o + 8, (size_t)l);
		v->text[v->n][l] = 0;
		v->len[v->n++] = l;
		o += 8 + (size_t)l;
	}
	free(b);
	return 0;
}

static inline int ref_find(const struct ref_vocab *v, const char *s, int n)
{
	for (int i = 3; i < v->n; i++) /* skip <unk>, <s>, </s>; byte pieces never equal real text here */
		if (v->len[i] == n && !memcmp(v->text[i], s, (size_t)n) && !(n == 6 && !memcmp(s, "<0x", 3)))
			return i;
	return -1;
}

static inline size_t ref_encode(const struct ref_vocab *v, const char *text, int32_t *out)
{
	char s[1024];
	int starts[1024], lens[1024], ns = 0, n = (int)strlen(text) + 1;
	s[0] = ' ';
	memcpy(s + 1, text, (size_t)n);
	for (int i = 0; i < n;) {
		int l = tok_utf8_len_ref((const unsigned char *)s + i, n - i);
		starts[ns] = i, lens[ns++] = l;
		i += l;
	}
	for (;;) {
		float best = -1e30f;
		int bi = -1;
		for (int i = 0; i + 1 < ns; i++) {
			int id = ref_find(v, s + starts[i], lens[i] + lens[i + 1]);
			if (id >= 0 && v->score[id] > best)
				best = v->score[id], bi = i;
		}
		if (bi < 0)
			break;
		lens[bi] += lens[bi + 1];
		memmove(starts + bi + 1, starts + bi + 2, (size_t)(ns - bi - 2) * sizeof *starts);
		memmove(lens + bi + 1, lens + bi + 2, (size_t)(ns - bi - 2) * sizeof *lens);
		ns--;
	}
	size_t k = 0;
	for (int i = 0; i < ns; i++) {
		int id = ref_find(v, s + starts[i], lens[i]);
		if (id >= 0)
			out[k++] = id;
		else
			for (int j = 0; j < lens[i]; j++)
				out[k++] = (unsigned char)s[starts[i] + j] + 3;
	}
	return k;
}

static inline void spm_reference(struct named_tok *nt, const char *path, int iters)
{
	struct ref_vocab v;
	if (ref_load(&v, path))
		return;
	static const char *const words[] = {"the", " ", "  ", "Once", "upon", "a", "time", ",", ".", "\n", "Lily",
					    "don't", "123", "\xC3\xA9t\xC3\xA9", "\xE6\x97\xA5", "xyzzy", "!!"};
	int fails = 0;
	for (int it = 0; it < iters && fails < 3; it++) {
		char text[512] = "";
		size_t tl = 0;
		int nw = (int)(t_rand_u64() % 24);
		for (int w = 0; w < nw; w++) {
			const char *x = words[t_rand_u64() % (sizeof words / sizeof *words)];
			if (tl + strlen(x) + 1 >= sizeof text)
				break;
			memcpy(text + tl, x, strlen(x) + 1);
			tl += strlen(x);
		}
		if (!tl)
			continue;
		int32_t want[1024];
		size_t wn = ref_encode(&v, text, want);
		struct fp4s_tok_ids ids = {0};
		struct fp4s_error err = {0};
		CHECK(fp4s_tok_encode(nt->tok, text, tl, 0, &ids, &err) == 0);
		int ok = ids.n == wn && !memcmp(ids.v, want, wn * sizeof *want);
		CHECK_MSG(ok, "%s: \"%s\" differs from the llama2.c reference (%zu vs %zu ids)", nt->name, text, ids.n, wn);
		fails += !ok;
		fp4s_tok_ids_free(&ids);
	}
	for (int i = 0; i < v.n; i++)
		free(v.text[i]);
	free(v.text);
	free(v.len);
	free(v.score);
}

static inline int open_named(struct named_tok *nt, const char *name, const char *path, int nfc)
{
	struct fp4s_error err = {0};
	nt->name = name;
	nt->nfc = nfc;
	nt->tok = NULL;
	if (!tt_exists(path)) {
		fprintf(stderr, "%s: %s missing, not tested (scripts/fetch-testdata.sh fills the cache)\n", name, path);
		return 0;
	}
	CHECK_MSG(fp4s_tok_open(&nt->tok, path, &err) == 0, "%s: %s", name, err.msg);
	return nt->tok != NULL;
}

#endif
