/* tok_gguf.c: the tokenizer held in a GGUF file's metadata (llama.cpp's vocab-only test files, such
 * as ggml-vocab-gpt-2.gguf and ggml-vocab-llama-spm.gguf). Only the key/value section is read;
 * tensors are ignored. Two tokenizer.ggml.model values are understood:
 *   "gpt2"   byte-level BPE: tokens in the GPT-2 byte alphabet, "a b" merges, the pre-tokenizer
 *            regex named by tokenizer.ggml.pre (gpt-2, llama-bpe/llama3, qwen2)
 *   "llama"  SentencePiece BPE: pieces with U+2581 for space, scores, token types
 * Every count and length is checked against the file's end before use: the file is untrusted. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

enum { GG_U8, GG_I8, GG_U16, GG_I16, GG_U32, GG_I32, GG_F32, GG_BOOL, GG_STR, GG_ARR, GG_U64, GG_I64, GG_F64 };

struct cur {
	const unsigned char *p, *end;
	int bad;
};

static uint64_t rd(struct cur *c, size_t n)
{
	uint64_t v = 0;
	if (c->bad || (size_t)(c->end - c->p) < n) {
		c->bad = 1;
		return 0;
	}
	memcpy(&v, c->p, n); /* GGUF is little-endian, as is every host we build for */
	c->p += n;
	return v;
}

static const char *rd_str(struct cur *c, size_t *len)
{
	uint64_t n = rd(c, 8);
	if (c->bad || n > (uint64_t)(c->end - c->p)) {
		c->bad = 1;
		*len = 0;
		return "";
	}
	const char *s = (const char *)c->p;
	c->p += n;
	*len = (size_t)n;
	return s;
}

static size_t type_size(uint32_t t)
{
	static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
	return t < sizeof sz / sizeof *sz ? sz[t] : 0;
}

static void skip_value(struct cur *c, uint32_t t, int depth)
{
	if (t == GG_STR) {
		size_t l;
		rd_str(c, &l);
	} else if (t == GG_ARR) {
		uint32_t et = (uint32_t)rd(c, 4);
		uint64_t n = rd(c, 8);
		if (depth > 2 || c->bad) {
			c->bad = 1;
			return;
		}
		if (et == GG_STR || et == GG_ARR) {
			for (uint64_t i = 0; i < n && !c->bad; i++)
				skip_value(c, et, depth + 1);
		} else if (type_size(et) == 0 || n > (uint64_t)(c->end - c->p) / type_size(et)) {
			c->bad = 1;
		} else {
			c->p += n * type_size(et);
		}
	} else if (type_size(t)) {
		rd(c, type_size(t));
	} else {
		c->bad = 1;
	}
}

struct gg_arr {
	const unsigned char *p; /* first element */
	uint64_t n;
	uint32_t type;
};

struct gg_meta {
	const char *model, *pre;
	size_t model_len, pre_len;
	struct gg_arr tokens, merges, scores, types;
	int64_t bos, eos;
	int add_bos; /* -1 unset */
};

static int64_t rd_int(struct cur *c, uint32_t t)
{
	switch (t) {
	case GG_U8: return (int64_t)rd(c, 1);
	case GG_I8: return (int8_t)rd(c, 1);
	case GG_U16: return (int64_t)rd(c, 2);
	case GG_I16: return (int16_t)rd(c, 2);
	case GG_U32: return (int64_t)rd(c, 4);
	case GG_I32: return (int32_t)rd(c, 4);
	case GG_U64:
	case GG_I64: return (int64_t)rd(c, 8);
	default: skip_value(c, t, 0); return -1;
	}
}

static int parse(const unsigned char *buf, size_t n, struct gg_meta *m, struct fp4s_error *err)
{
	struct cur c = {buf, buf + n, 0};
	if (rd(&c, 4) != 0x46554747u)
		return fp4s_error_set(err, FP4S_EFORMAT, "not a GGUF file");
	uint32_t version = (uint32_t)rd(&c, 4);
	if (version < 2 || version > 3)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "GGUF version %u", version);
	rd(&c, 8); /* tensor count: tensors are not read */
	uint64_t n_kv = rd(&c, 8);
	if (n_kv > (1u << 20))
		return fp4s_error_set(err, FP4S_EFORMAT, "GGUF claims %llu metadata keys", (unsigned long long)n_kv);
	m->bos = m->eos = -1;
	m->add_bos = -1;
	for (uint64_t i = 0; i < n_kv && !c.bad; i++) {
		size_t kl;
		const char *k = rd_str(&c, &kl);
		uint32_t t = (uint32_t)rd(&c, 4);
#define KEY(s) (kl == sizeof(s) - 1 && !memcmp(k, s, kl))
		if (KEY("tokenizer.ggml.model") && t == GG_STR) {
			m->model = rd_str(&c, &m->model_len);
		} else if (KEY("tokenizer.ggml.pre") && t == GG_STR) {
			m->pre = rd_str(&c, &m->pre_len);
		} else if ((KEY("tokenizer.ggml.tokens") || KEY("tokenizer.ggml.merges") || KEY("tokenizer.ggml.scores") ||
			    KEY("tokenizer.ggml.token_type")) && t == GG_ARR) {
			struct gg_arr *a = KEY("tokenizer.ggml.tokens")   ? &m->tokens
					   : KEY("tokenizer.ggml.merges") ? &m->merges
					   : KEY("tokenizer.ggml.scores") ? &m->scores
									  : &m->types;
			const unsigned char *start = c.p;
			a->type = (uint32_t)rd(&c, 4);
			a->n = rd(&c, 8);
			a->p = c.p;
			c.p = start;
			skip_value(&c, GG_ARR, 0);
		} else if (KEY("tokenizer.ggml.bos_token_id")) {
			m->bos = rd_int(&c, t);
		} else if (KEY("tokenizer.ggml.eos_token_id")) {
			m->eos = rd_int(&c, t);
		} else if (KEY("tokenizer.ggml.add_bos_token") && t == GG_BOOL) {
			m->add_bos = (int)rd(&c, 1);
		} else {
			skip_value(&c, t, 0);
		}
#undef KEY
	}
	if (c.bad)
		return fp4s_error_set(err, FP4S_EFORMAT, "GGUF metadata runs past the end of the file");
	if (!m->model || !m->tokens.p || m->tokens.type != GG_STR)
		return fp4s_error_set(err, FP4S_EFORMAT, "GGUF file has no tokenizer.ggml.model/tokens");
	if (m->tokens.n == 0 || m->tokens.n > TOK_MAX_VOCAB)
		return fp4s_error_set(err, FP4S_EFORMAT, "GGUF vocabulary of %llu tokens", (unsigned long long)m->tokens.n);
	if (m->types.p && (m->types.type != GG_I32 || m->types.n != m->tokens.n))
		return fp4s_error_set(err, FP4S_EFORMAT, "GGUF token_type does not match the tokens");
	if (m->scores.p && (m->scores.type != GG_F32 || m->scores.n != m->tokens.n))
		return fp4s_error_set(err, FP4S_EFORMAT, "GGUF scores do not match the tokens");
	if (m->merges.p && (m->merges.type != GG_STR || m->merges.n > TOK_MAX_MERGES))
		return fp4s_error_set(err, FP4S_EFORMAT, "GGUF merges are not a string array of sane size");
	return 0;
}

static int32_t type_of(const struct gg_meta *m, uint64_t i)
{
	int32_t t = 1;
	if (m->types.p)
		memcpy(&t, m->types.p + 4 * i, 4);
	return t;
}

/* byte-level BPE ("gpt2") */
static int build_bpe(struct fp4s_tokenizer *tok, const struct gg_meta *m, struct fp4s_error *err)
{
	static const char LLAMA3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
				     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
	static const char QWEN2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
				    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
	int rc;
	tok->kind = FP4S_TOK_KIND_BPE_JSON;
	if ((rc = tok_alloc_vocab(tok, (int32_t)m->tokens.n, err)))
		return rc;
	if (tok_strmap_init(&tok->vocab, (size_t)m->tokens.n) || tok_pairmap_init(&tok->merges, m->merges.n))
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	/* token strings were bounds-checked by parse(); walk them again */
	const unsigned char *p = m->tokens.p;
	char buf[TOK_MAX_TOKEN_BYTES];
	for (uint64_t i = 0; i < m->tokens.n; i++) {
		uint64_t len;
		memcpy(&len, p, 8);
		const char *s = (const char *)p + 8;
		p += 8 + len;
		if (len > TOK_MAX_TOKEN_BYTES)
			return fp4s_error_set(err, FP4S_EFORMAT, "token %llu too long", (unsigned long long)i);
		int32_t t = type_of(m, i), id = (int32_t)i;
		if (t == 3 || t == 4) { /* control / user-defined: matched whole, as added tokens */
			if ((rc = tok_set_text(tok, id, s, (size_t)len, err)) ||
			    (len && (rc = tok_added_add(tok, id, s, (size_t)len, t == 3, 0, 0, 0, err))))
				return rc;
			continue;
		}
		int n = tok_unmap_bytes(s, (size_t)len, buf, sizeof buf);
		if (n < 0)
			return fp4s_error_set(err, FP4S_EFORMAT, "token %d too long", id);
		if ((rc = tok_set_text(tok, id, buf, (size_t)n, err)))
			return rc;
		if (n)
			tok_strmap_put(tok, &tok->vocab, id);
	}
	for (int b = 0; b < 256; b++) {
		char ch = (char)b;
		if ((tok->byte_id[b] = tok_strmap_get(tok, &tok->vocab, &ch, 1)) < 0)
			return fp4s_error_set(err, FP4S_EUNSUPPORTED, "vocab lacks the token for byte 0x%02X", b);
	}
	p = m->merges.p;
	for (uint64_t i = 0; p && i < m->merges.n; i++) {
		uint64_t len;
		memcpy(&len, p, 8);
		const char *s = (const char *)p + 8;
		p += 8 + len;
		const char *sp = memchr(s, ' ', (size_t)len);
		if (!sp)
			return fp4s_error_set(err, FP4S_EFORMAT, "merge %llu is not two tokens", (unsigned long long)i);
		if ((rc = tok_merge_add(tok, s, (size_t)(sp - s), sp + 1, (size_t)(s + len - sp - 1), (int32_t)i, err)))
			return rc;
	}
	const char *pat = TOK_GPT2_PATTERN;
	size_t pre_len = m->pre ? m->pre_len : 0;
	if (pre_len == 9 && !memcmp(m->pre, "llama-bpe", 9))
		pat = LLAMA3, tok->ignore_merges = 1;
	else if (pre_len == 5 && !memcmp(m->pre, "qwen2", 5))
		pat = QWEN2;
	else if (pre_len && !(pre_len == 5 && !memcmp(m->pre, "gpt-2", 5)) &&
		 !(pre_len == 7 && !memcmp(m->pre, "default", 7)))
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "GGUF pre-tokenizer '%.*s'", (int)pre_len, m->pre);
	return tok_stage_add(tok, pat, strlen(pat), 0, 0, err);
}

/* SentencePiece BPE ("llama") */
static int build_spm(struct fp4s_tokenizer *tok, const struct gg_meta *m, struct fp4s_error *err)
{
	int rc;
	if (!m->scores.p)
		return fp4s_error_set(err, FP4S_EFORMAT, "SentencePiece GGUF without scores");
	tok->kind = FP4S_TOK_KIND_SPM_LLAMA2C;
	if ((rc = tok_alloc_vocab(tok, (int32_t)m->tokens.n, err)))
		return rc;
	tok->scores = malloc((size_t)m->tokens.n * sizeof *tok->scores);
	if (!tok->scores || tok_strmap_init(&tok->vocab, (size_t)m->tokens.n))
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	for (int b = 0; b < 256; b++)
		tok->byte_id[b] = -1;
	const unsigned char *p = m->tokens.p;
	char buf[TOK_MAX_TOKEN_BYTES];
	for (uint64_t i = 0; i < m->tokens.n; i++) {
		uint64_t len;
		memcpy(&len, p, 8);
		const char *s = (const char *)p + 8;
		p += 8 + len;
		int32_t id = (int32_t)i, t = type_of(m, i);
		memcpy(&tok->scores[id], m->scores.p + 4 * i, 4);
		if (len > TOK_MAX_TOKEN_BYTES)
			return fp4s_error_set(err, FP4S_EFORMAT, "token %d too long", id);
		/* U+2581 (3 bytes) -> one space, so pieces compare with text directly */
		size_t n = 0;
		for (size_t k = 0; k < len;) {
			if (len - k >= 3 && !memcmp(s + k, "\xE2\x96\x81", 3))
				buf[n++] = ' ', k += 3;
			else
				buf[n++] = s[k++];
		}
		if ((rc = tok_set_text(tok, id, buf, n, err)))
			return rc;
		if ((int)n > tok->max_piece_len)
			tok->max_piece_len = (int)n;
		const int v = t == 6 && n == 6 ? tok_byte_piece(buf) : -1;
		if (v >= 0) {
			if (tok->byte_id[v] < 0) {
				tok->byte_id[v] = id;
				tok->tok_flags[id] |= TOKF_BYTE;
			}
		} else if (t == 2 || t == 3) {
			tok->tok_flags[id] |= TOKF_CONTROL | TOKF_SPECIAL;
		} else if (t != 5 && n) {
			tok_strmap_put(tok, &tok->vocab, id);
		}
	}
	tok->add_bos = m->add_bos != 0;
	tok_spm_finish(tok);
	return 0;
}

int tok_load_gguf(struct fp4s_tokenizer *tok, const char *path, struct fp4s_error *err)
{
	char *buf;
	size_t n;
	struct gg_meta m = {0};
	int rc = tok_read_file(path, &buf, &n, TOK_MAX_FILE_BYTES, err);
	if (rc)
		return rc;
	rc = parse((const unsigned char *)buf, n, &m, err);
	if (!rc) {
		if (m.model_len == 4 && !memcmp(m.model, "gpt2", 4))
			rc = build_bpe(tok, &m, err);
		else if (m.model_len == 5 && !memcmp(m.model, "llama", 5))
			rc = build_spm(tok, &m, err);
		else
			rc = fp4s_error_set(err, FP4S_EUNSUPPORTED, "GGUF tokenizer model '%.*s'", (int)m.model_len, m.model);
	}
	if (!rc) {
		tok->bos = m.bos >= 0 && m.bos < tok->n_vocab ? (int32_t)m.bos : -1;
		tok->eos = m.eos >= 0 && m.eos < tok->n_vocab ? (int32_t)m.eos : -1;
		if (tok->kind == FP4S_TOK_KIND_BPE_JSON)
			tok->add_bos = m.add_bos == 1 && tok->bos >= 0;
		else
			tok->add_bos = tok->add_bos && tok->bos >= 0;
	}
	free(buf);
	if (rc)
		return fp4s_error_prefix(err, "%s: ", path);
	return 0;
}
