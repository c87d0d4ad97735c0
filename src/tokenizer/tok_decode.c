/* tok_decode.c: ids -> bytes, whole or streamed.
 *
 * Byte-level BPE tokens already hold their raw bytes, so decoding is concatenation. SentencePiece
 * (llama2.c) pieces need three rules: <0xXX> pieces are one byte; control pieces print as "<s>",
 * "</s>", "<unk>" (llama2.c stores them wrapped in newlines); and the first piece of a sequence, or
 * the first after BOS, loses one leading space, which is the dummy prefix encode added (llama2.c's
 * decode and SentencePiece do the same). */
#include <string.h>

#include "tokenizer/tok_internal.h"

static int hexval(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c - 'a' + 10;
}

/* The bytes id stands for in context; sets *skip for a token left out. */
static const char *piece(const struct fp4s_tokenizer *tok, int32_t id, unsigned flags, int *started, size_t *len,
			 int *skip)
{
	uint8_t f = tok->tok_flags[id];
	*skip = (flags & FP4S_TOK_SKIP_SPECIAL) && (f & TOKF_SPECIAL);
	const char *s = tok_text(tok, id, len);
	if (!s) {
		*len = 0;
		return "";
	}
	if (tok->kind != FP4S_TOK_KIND_SPM_LLAMA2C || *skip)
		return s;
	if (f & TOKF_BYTE) {
		static const char bytes[256] = {
#define B8(x) x, x + 1, x + 2, x + 3, x + 4, x + 5, x + 6, x + 7
#define B64(x) B8(x), B8(x + 8), B8(x + 16), B8(x + 24), B8(x + 32), B8(x + 40), B8(x + 48), B8(x + 56)
			B64(0), B64(64), B64(-128), B64(-64)
#undef B64
#undef B8
		};
		int b = ((hexval(s[3]) << 4) | hexval(s[4])) & 0xFF; /* "<0xXX>", checked at load */
		*len = 1;
		*started = 1;
		return &bytes[b];
	}
	if (f & TOKF_CONTROL) {
		if (*len >= 2 && s[0] == '\n' && s[*len - 1] == '\n')
			s++, *len -= 2;
		/* a space after BOS is still the dummy prefix */
		*started = id == tok->bos ? 0 : 1;
		return s;
	}
	if (!*started && *len && s[0] == ' ')
		s++, (*len)--;
	*started = 1;
	return s;
}

int fp4s_tok_decode(const struct fp4s_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags,
		    struct fp4s_tok_text *out, struct fp4s_error *err)
{
	int started = 0;
	out->n = 0;
	if (tok_text_append(out, "", 0))
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		if (ids[i] < 0 || ids[i] >= tok->n_vocab)
			return fp4s_error_set(err, FP4S_EINVAL, "token id %d out of range (vocab %d)", ids[i],
					      tok->n_vocab);
		size_t l;
		int skip;
		const char *s = piece(tok, ids[i], flags, &started, &l, &skip);
		if (skip)
			continue;
		if (tok_text_append(out, s, l))
			return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	}
	return 0;
}

void fp4s_tok_stream_init(struct fp4s_tok_stream *s, const struct fp4s_tokenizer *tok, unsigned flags)
{
	memset(s, 0, sizeof *s);
	s->tok = tok;
	s->flags = flags;
}

/* Total length of the UTF-8 sequence a lead byte starts (0: not a lead byte). */
static int lead_len(unsigned char c)
{
	return c < 0x80 ? 1 : c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
}

/* Whether c may follow the lead byte as the second byte (excludes overlongs and surrogates). */
static int second_ok(unsigned char lead, unsigned char c)
{
	if ((c & 0xC0) != 0x80)
		return 0;
	if (lead == 0xE0)
		return c >= 0xA0;
	if (lead == 0xED)
		return c < 0xA0;
	if (lead == 0xF0)
		return c >= 0x90;
	if (lead == 0xF4)
		return c < 0x90;
	return 1;
}

static const char REPLACEMENT[] = "\xEF\xBF\xBD";

static int stream_bytes(struct fp4s_tok_stream *s, const unsigned char *p, size_t n, struct fp4s_tok_text *out)
{
	for (size_t i = 0; i < n;) {
		unsigned char c = p[i];
		if (s->n_pend == 0) {
			size_t j = i;
			while (j < n && p[j] < 0x80)
				j++;
			if (j > i) {
				if (tok_text_append(out, (const char *)p + i, j - i))
					return FP4S_ENOMEM;
				i = j;
				continue;
			}
			if (lead_len(c) == 0) {
				if (tok_text_append(out, REPLACEMENT, 3))
					return FP4S_ENOMEM;
			} else {
				s->pend[s->n_pend++] = c;
			}
			i++;
			continue;
		}
		int ok = s->n_pend == 1 ? second_ok(s->pend[0], c) : (c & 0xC0) == 0x80;
		if (!ok) {
			/* the held bytes can never complete: one U+FFFD for them, then look at c afresh */
			s->n_pend = 0;
			if (tok_text_append(out, REPLACEMENT, 3))
				return FP4S_ENOMEM;
			continue;
		}
		s->pend[s->n_pend++] = c;
		i++;
		if (s->n_pend == lead_len(s->pend[0])) {
			if (tok_text_append(out, (const char *)s->pend, (size_t)s->n_pend))
				return FP4S_ENOMEM;
			s->n_pend = 0;
		}
	}
	return 0;
}

int fp4s_tok_stream_push(struct fp4s_tok_stream *s, int32_t id, struct fp4s_tok_text *out, struct fp4s_error *err)
{
	const struct fp4s_tokenizer *tok = s->tok;
	if (id < 0 || id >= tok->n_vocab)
		return fp4s_error_set(err, FP4S_EINVAL, "token id %d out of range (vocab %d)", id, tok->n_vocab);
	size_t l;
	int skip;
	const char *p = piece(tok, id, s->flags, &s->started, &l, &skip);
	if (tok_text_append(out, "", 0))
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	if (skip)
		return 0;
	if (stream_bytes(s, (const unsigned char *)p, l, out))
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	return 0;
}

int fp4s_tok_stream_flush(struct fp4s_tok_stream *s, struct fp4s_tok_text *out)
{
	int rc = tok_text_append(out, "", 0);
	if (!rc && s->n_pend)
		rc = tok_text_append(out, REPLACEMENT, 3);
	s->n_pend = 0;
	return rc ? FP4S_ENOMEM : 0;
}
