/* tok_json.c: loads a Hugging Face tokenizer.json holding a byte-level BPE model (Llama 3, Qwen2/3,
 * gpt-oss, GPT-2). Token texts are stored as the raw bytes they stand for (the GPT-2 byte alphabet
 * is undone at load), so encode works on bytes and decode is concatenation.
 *
 * Supported: model BPE (merges as "a b" strings or ["a","b"] pairs, ignore_merges), added_tokens
 * (special, lstrip, rstrip), normalizer null/NFC/NFKC/NFD/NFKD (or a Sequence of one), pre_tokenizer
 * Split(Regex|String, Isolated)/ByteLevel/Sequence, decoder ByteLevel, post_processor
 * TemplateProcessing (for BOS/EOS). Anything else is refused with FP4S_EUNSUPPORTED rather than
 * silently tokenizing differently from Hugging Face. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "util/log.h"

/* GPT-2's ByteLevel(use_regex=true) pattern. */
const char TOK_GPT2_PATTERN[] =
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Undoes the GPT-2 byte alphabet: each code point of s becomes one byte. A code point outside the
 * alphabet (never produced by byte-level pre-tokenization) is kept as its UTF-8, so such a token
 * simply never matches. Returns the byte count, or -1 if s is too long. */
int tok_unmap_bytes(const char *s, size_t n, char *out, size_t cap)
{
	size_t o = 0;
	for (size_t i = 0; i < n;) {
		int l = tok_utf8_valid_len((const unsigned char *)s + i, n - i);
		if (l == 0)
			l = 1; /* jansson validated UTF-8; defensive only */
		int b = tok_cp_to_byte(tok_utf8_decode((const unsigned char *)s + i, l));
		if (b >= 0) {
			if (o + 1 > cap)
				return -1;
			out[o++] = (char)b;
		} else {
			if (o + (size_t)l > cap)
				return -1;
			memcpy(out + o, s + i, (size_t)l);
			o += (size_t)l;
		}
		i += (size_t)l;
	}
	return (int)o;
}

int tok_added_add(struct fp4s_tokenizer *tok, int32_t id, const char *s, size_t n, int special,
		  int lstrip, int rstrip, int normalized, struct fp4s_error *err)
{
	if (n == 0)
		return fp4s_error_set(err, FP4S_EFORMAT, "added token %d has empty content", id);
	if (n > TOK_MAX_TOKEN_BYTES)
		return fp4s_error_set(err, FP4S_EFORMAT, "added token %d is too long", id);
	if (tok->n_added >= TOK_MAX_ADDED)
		return fp4s_error_set(err, FP4S_EFORMAT, "more than %d added tokens", TOK_MAX_ADDED);
	if (tok->n_trie == 0) {
		tok->cap_trie = 1024;
		tok->trie = malloc((size_t)tok->cap_trie * sizeof *tok->trie);
		if (!tok->trie)
			return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
		tok->trie[0] = (struct tok_trie_node){-1, -1, -1, 0};
		tok->n_trie = 1;
	}
	struct tok_added *a = realloc(tok->added, (size_t)(tok->n_added + 1) * sizeof *a);
	if (!a)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	tok->added = a;
	int32_t node = 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		int32_t ch = tok->trie[node].first_child;
		while (ch >= 0 && tok->trie[ch].byte != c)
			ch = tok->trie[ch].next_sibling;
		if (ch < 0) {
			if (tok->n_trie == tok->cap_trie) {
				struct tok_trie_node *t = realloc(tok->trie, (size_t)tok->cap_trie * 2 * sizeof *t);
				if (!t)
					return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
				tok->trie = t;
				tok->cap_trie *= 2;
			}
			ch = tok->n_trie++;
			tok->trie[ch] = (struct tok_trie_node){-1, tok->trie[node].first_child, -1, c};
			tok->trie[node].first_child = ch;
		}
		node = ch;
	}
	if (tok->trie[node].token >= 0) {
		/* same content twice: Hugging Face keeps the first; so do we */
		FP4S_DEBUG("tokenizer: added token %d duplicates the content of an earlier one", id);
		return 0;
	}
	tok->trie[node].token = tok->n_added;
	tok->added[tok->n_added++] = (struct tok_added){id, (uint8_t)!!special, (uint8_t)!!lstrip,
							(uint8_t)!!rstrip, (uint8_t)!!normalized};
	tok->added_first[(unsigned char)s[0]] = 1;
	tok->tok_flags[id] |= TOKF_ADDED | (special ? TOKF_SPECIAL : 0);
	return 0;
}

int tok_stage_add(struct fp4s_tokenizer *tok, const char *pat, size_t len, int literal, int invert,
		  struct fp4s_error *err)
{
	if (tok->n_stages >= TOK_MAX_PRETOK_STAGES)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "more than %d pre-tokenizer stages",
				      TOK_MAX_PRETOK_STAGES);
	int ec;
	PCRE2_SIZE eo;
	/* PCRE2_LITERAL admits no UCP; a literal needs no character properties anyway */
	uint32_t opt = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
	pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opt, &ec, &eo, NULL);
	if (!re) {
		PCRE2_UCHAR msg[256];
		pcre2_get_error_message(ec, msg, sizeof msg);
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "pre-tokenizer regex does not compile at offset %zu: %s",
				      (size_t)eo, (char *)msg);
	}
	/* JIT is ~20x faster; the interpreter gives the same splits, so a JIT failure is not fatal */
	if (pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) != 0)
		FP4S_WARN("tokenizer: PCRE2 JIT unavailable, using the interpreter (slower)");
	tok->stages[tok->n_stages++] = (struct tok_pretok_stage){re, invert, 0};
	return 0;
}

static int load_pretok(struct fp4s_tokenizer *tok, json_t *pt, int depth, int *byte_level, struct fp4s_error *err)
{
	if (!pt || json_is_null(pt))
		return 0;
	if (depth > 4)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "pre_tokenizer nested too deeply");
	const char *type = json_string_value(json_object_get(pt, "type"));
	if (!type)
		return fp4s_error_set(err, FP4S_EFORMAT, "pre_tokenizer without a type");
	if (!strcmp(type, "Sequence")) {
		json_t *arr = json_object_get(pt, "pretokenizers");
		if (!json_is_array(arr))
			return fp4s_error_set(err, FP4S_EFORMAT, "Sequence pre_tokenizer without pretokenizers");
		for (size_t i = 0; i < json_array_size(arr); i++) {
			int rc = load_pretok(tok, json_array_get(arr, i), depth + 1, byte_level, err);
			if (rc)
				return rc;
		}
		return 0;
	}
	if (!strcmp(type, "ByteLevel")) {
		*byte_level = 1;
		if (json_is_true(json_object_get(pt, "add_prefix_space"))) {
			if (tok->n_stages >= TOK_MAX_PRETOK_STAGES)
				return fp4s_error_set(err, FP4S_EUNSUPPORTED, "too many pre-tokenizer stages");
			tok->stages[tok->n_stages++] = (struct tok_pretok_stage){NULL, 0, 1};
		}
		if (json_is_true(json_object_get(pt, "use_regex")))
			return tok_stage_add(tok, TOK_GPT2_PATTERN, sizeof TOK_GPT2_PATTERN - 1, 0, 0, err);
		return 0;
	}
	if (!strcmp(type, "Split")) {
		json_t *p = json_object_get(pt, "pattern");
		const char *behavior = json_string_value(json_object_get(pt, "behavior"));
		int invert = json_is_true(json_object_get(pt, "invert"));
		if (!behavior || strcmp(behavior, "Isolated") != 0)
			return fp4s_error_set(err, FP4S_EUNSUPPORTED, "Split pre_tokenizer behavior '%s' (only Isolated)",
					      behavior ? behavior : "(none)");
		if (invert)
			return fp4s_error_set(err, FP4S_EUNSUPPORTED, "Split pre_tokenizer with invert=true");
		json_t *rx = json_object_get(p, "Regex"), *st = json_object_get(p, "String");
		if (json_is_string(rx))
			return tok_stage_add(tok, json_string_value(rx), json_string_length(rx), 0, invert, err);
		if (json_is_string(st))
			return tok_stage_add(tok, json_string_value(st), json_string_length(st), 1, invert, err);
		return fp4s_error_set(err, FP4S_EFORMAT, "Split pre_tokenizer without a Regex or String pattern");
	}
	return fp4s_error_set(err, FP4S_EUNSUPPORTED, "pre_tokenizer type '%s'", type);
}

static int load_normalizer(struct fp4s_tokenizer *tok, json_t *n, int depth, struct fp4s_error *err)
{
	if (!n || json_is_null(n))
		return 0;
	const char *type = json_string_value(json_object_get(n, "type"));
	if (!type)
		return fp4s_error_set(err, FP4S_EFORMAT, "normalizer without a type");
	if (!strcmp(type, "Sequence") && depth == 0) {
		json_t *arr = json_object_get(n, "normalizers");
		for (size_t i = 0; i < json_array_size(arr); i++) {
			int rc = load_normalizer(tok, json_array_get(arr, i), 1, err);
			if (rc)
				return rc;
		}
		return 0;
	}
	enum tok_norm k = !strcmp(type, "NFC")    ? TOK_NORM_NFC
			  : !strcmp(type, "NFKC") ? TOK_NORM_NFKC
			  : !strcmp(type, "NFD")  ? TOK_NORM_NFD
			  : !strcmp(type, "NFKD") ? TOK_NORM_NFKD
						  : TOK_NORM_NONE;
	if (k == TOK_NORM_NONE)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "normalizer type '%s'", type);
	if (tok->norm != TOK_NORM_NONE && tok->norm != k)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "two different Unicode normalizers in sequence");
	tok->norm = k;
	return 0;
}

static int check_decoder(json_t *d, int depth, struct fp4s_error *err)
{
	if (!d || json_is_null(d))
		return 0;
	const char *type = json_string_value(json_object_get(d, "type"));
	if (!type)
		return fp4s_error_set(err, FP4S_EFORMAT, "decoder without a type");
	if (!strcmp(type, "ByteLevel"))
		return 0;
	if (!strcmp(type, "Sequence") && depth == 0) {
		json_t *arr = json_object_get(d, "decoders");
		for (size_t i = 0; i < json_array_size(arr); i++) {
			int rc = check_decoder(json_array_get(arr, i), 1, err);
			if (rc)
				return rc;
		}
		return 0;
	}
	return fp4s_error_set(err, FP4S_EUNSUPPORTED, "decoder type '%s' (byte-level BPE expects ByteLevel)", type);
}

/* TemplateProcessing "single": [SpecialToken bos?, Sequence A, SpecialToken eos?] tells whether
 * add_special_tokens adds BOS/EOS. Other processors (ByteLevel) add nothing. */
static void load_post(struct fp4s_tokenizer *tok, json_t *pp, int depth)
{
	const char *type = json_string_value(json_object_get(pp, "type"));
	if (!type)
		return;
	if (!strcmp(type, "Sequence") && depth == 0) {
		json_t *arr = json_object_get(pp, "processors");
		for (size_t i = 0; i < json_array_size(arr); i++)
			load_post(tok, json_array_get(arr, i), 1);
		return;
	}
	if (strcmp(type, "TemplateProcessing") != 0)
		return;
	json_t *single = json_object_get(pp, "single");
	int seen_seq = 0;
	for (size_t i = 0; i < json_array_size(single); i++) {
		json_t *it = json_array_get(single, i);
		json_t *sp = json_object_get(it, "SpecialToken");
		if (json_object_get(it, "Sequence")) {
			seen_seq = 1;
			continue;
		}
		const char *name = json_string_value(json_object_get(sp, "id"));
		if (!name)
			continue;
		int32_t id = fp4s_tok_find(tok, name);
		if (id < 0)
			continue;
		if (!seen_seq) {
			tok->add_bos = 1;
			tok->bos = id;
		} else {
			tok->add_eos = 1;
			tok->eos = id;
		}
	}
}

int tok_merge_add(struct fp4s_tokenizer *tok, const char *l, size_t ll, const char *r, size_t rl, int32_t rank,
		  struct fp4s_error *err)
{
	char lb[TOK_MAX_TOKEN_BYTES], rb[TOK_MAX_TOKEN_BYTES];
	int nl = tok_unmap_bytes(l, ll, lb, sizeof lb), nr = tok_unmap_bytes(r, rl, rb, sizeof rb);
	if (nl <= 0 || nr <= 0 || nl + nr > TOK_MAX_TOKEN_BYTES)
		return fp4s_error_set(err, FP4S_EFORMAT, "merge %d has an empty or too long side", rank);
	int32_t a = tok_strmap_get(tok, &tok->vocab, lb, (size_t)nl);
	int32_t b = tok_strmap_get(tok, &tok->vocab, rb, (size_t)nr);
	memcpy(lb + nl, rb, (size_t)nr);
	int32_t ab = tok_strmap_get(tok, &tok->vocab, lb, (size_t)(nl + nr));
	if (a < 0 || b < 0 || ab < 0)
		return fp4s_error_set(err, FP4S_EFORMAT, "merge %d ('%.*s' + '%.*s') uses a token not in the vocab", rank,
				      (int)(ll < 64 ? ll : 64), l, (int)(rl < 64 ? rl : 64), r);
	if (tok_pairmap_put(&tok->merges, a, b, rank, ab) < 0)
		return fp4s_error_set(err, FP4S_ENOMEM, "merge table full");
	return 0;
}

static int load_model(struct fp4s_tokenizer *tok, json_t *root, struct fp4s_error *err)
{
	json_t *model = json_object_get(root, "model");
	json_t *vocab = json_object_get(model, "vocab");
	json_t *merges = json_object_get(model, "merges");
	json_t *added = json_object_get(root, "added_tokens");
	const char *type = json_string_value(json_object_get(model, "type"));
	if (!json_is_object(model))
		return fp4s_error_set(err, FP4S_EFORMAT, "no \"model\" object");
	if (type && strcmp(type, "BPE") != 0)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "model type '%s' (only BPE)", type);
	if (!json_is_object(vocab) || !json_is_array(merges))
		return fp4s_error_set(err, FP4S_EFORMAT, "BPE model without a vocab object and a merges array");
	if (json_is_true(json_object_get(model, "byte_fallback")))
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "BPE with byte_fallback");
	const char *csp = json_string_value(json_object_get(model, "continuing_subword_prefix"));
	const char *eow = json_string_value(json_object_get(model, "end_of_word_suffix"));
	if ((csp && *csp) || (eow && *eow))
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "BPE with a subword prefix/suffix");
	json_t *dropout = json_object_get(model, "dropout");
	if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0.0)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED, "BPE dropout");
	tok->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));

	/* the id space covers the vocab and the added tokens */
	json_int_t max_id = -1;
	const char *key;
	json_t *val;
	json_object_foreach(vocab, key, val) {
		if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= TOK_MAX_VOCAB)
			return fp4s_error_set(err, FP4S_EFORMAT, "vocab entry '%.64s' has a bad id", key);
		if (json_integer_value(val) > max_id)
			max_id = json_integer_value(val);
	}
	if (added && !json_is_array(added))
		return fp4s_error_set(err, FP4S_EFORMAT, "added_tokens is not an array");
	if (json_array_size(added) > TOK_MAX_ADDED)
		return fp4s_error_set(err, FP4S_EFORMAT, "too many added tokens");
	for (size_t i = 0; i < json_array_size(added); i++) {
		json_t *id = json_object_get(json_array_get(added, i), "id");
		if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= TOK_MAX_VOCAB)
			return fp4s_error_set(err, FP4S_EFORMAT, "added token %zu has a bad id", i);
		if (json_integer_value(id) > max_id)
			max_id = json_integer_value(id);
	}
	int rc = tok_alloc_vocab(tok, (int32_t)(max_id + 1), err);
	if (rc)
		return rc;
	if (tok_strmap_init(&tok->vocab, json_object_size(vocab)))
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");

	char buf[TOK_MAX_TOKEN_BYTES];
	json_object_foreach(vocab, key, val) {
		int32_t id = (int32_t)json_integer_value(val);
		int n = tok_unmap_bytes(key, strlen(key), buf, sizeof buf);
		if (n < 0)
			return fp4s_error_set(err, FP4S_EFORMAT, "vocab entry %d is too long", id);
		if (tok->tok_off[id] != UINT64_MAX)
			return fp4s_error_set(err, FP4S_EFORMAT, "vocab id %d appears twice", id);
		if ((rc = tok_set_text(tok, id, buf, (size_t)n, err)))
			return rc;
		if (tok_strmap_put(tok, &tok->vocab, id) == 1)
			FP4S_DEBUG("tokenizer: vocab id %d repeats the text of another token", id);
	}
	for (int b = 0; b < 256; b++) {
		char c = (char)b;
		tok->byte_id[b] = tok_strmap_get(tok, &tok->vocab, &c, 1);
		if (tok->byte_id[b] < 0)
			return fp4s_error_set(err, FP4S_EUNSUPPORTED,
					      "byte-level BPE vocab lacks the token for byte 0x%02X", b);
	}

	size_t nm = json_array_size(merges);
	if (nm > TOK_MAX_MERGES)
		return fp4s_error_set(err, FP4S_EFORMAT, "%zu merges (limit %d)", nm, TOK_MAX_MERGES);
	if (tok_pairmap_init(&tok->merges, nm))
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory for %zu merges", nm);
	for (size_t i = 0; i < nm; i++) {
		json_t *m = json_array_get(merges, i);
		const char *l, *r;
		size_t ll, rl;
		if (json_is_string(m)) {
			/* "a b": the byte alphabet has no plain space, so the first space separates */
			const char *s = json_string_value(m), *sp = strchr(s, ' ');
			if (!sp || strchr(sp + 1, ' '))
				return fp4s_error_set(err, FP4S_EFORMAT, "merge %zu ('%.64s') is not two tokens", i, s);
			l = s, ll = (size_t)(sp - s), r = sp + 1, rl = strlen(sp + 1);
		} else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
			   json_is_string(json_array_get(m, 1))) {
			l = json_string_value(json_array_get(m, 0)), ll = json_string_length(json_array_get(m, 0));
			r = json_string_value(json_array_get(m, 1)), rl = json_string_length(json_array_get(m, 1));
		} else {
			return fp4s_error_set(err, FP4S_EFORMAT, "merge %zu is neither \"a b\" nor [\"a\", \"b\"]", i);
		}
		if ((rc = tok_merge_add(tok, l, ll, r, rl, (int32_t)i, err)))
			return rc;
	}

	for (size_t i = 0; i < json_array_size(added); i++) {
		json_t *a = json_array_get(added, i);
		json_t *content = json_object_get(a, "content");
		int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
		if (!json_is_string(content))
			return fp4s_error_set(err, FP4S_EFORMAT, "added token %d without content", id);
		const char *s = json_string_value(content);
		size_t n = json_string_length(content);
		size_t have_n;
		const char *have = tok_text(tok, id, &have_n);
		if (!have) {
			if ((rc = tok_set_text(tok, id, s, n, err)))
				return rc;
		} else if (have_n != n || memcmp(have, s, n) != 0) {
			/* an added token given an id the vocab uses for other text: the added content wins */
			FP4S_DEBUG("tokenizer: added token %d overrides a vocab entry", id);
			if ((rc = tok_set_text(tok, id, s, n, err)))
				return rc;
		}
		if (json_is_true(json_object_get(a, "single_word")))
			FP4S_DEBUG("tokenizer: added token %d has single_word=true, which is not implemented", id);
		rc = tok_added_add(tok, id, s, n, json_is_true(json_object_get(a, "special")),
				   json_is_true(json_object_get(a, "lstrip")), json_is_true(json_object_get(a, "rstrip")),
				   json_is_true(json_object_get(a, "normalized")), err);
		if (rc)
			return rc;
	}
	return 0;
}

int tok_load_json(struct fp4s_tokenizer *tok, const char *path, struct fp4s_error *err)
{
	char *buf;
	size_t n;
	int rc = tok_read_file(path, &buf, &n, TOK_MAX_FILE_BYTES, err);
	if (rc)
		return rc;
	json_error_t je;
	json_t *root = json_loadb(buf, n, JSON_REJECT_DUPLICATES, &je);
	free(buf);
	if (!root)
		return fp4s_error_set(err, FP4S_EFORMAT, "%s: JSON error at line %d column %d: %s", path, je.line,
				      je.column, je.text);
	tok->kind = FP4S_TOK_KIND_BPE_JSON;
	tok->bos = tok->eos = -1;
	int byte_level = 0;
	rc = load_model(tok, root, err);
	if (!rc)
		rc = load_normalizer(tok, json_object_get(root, "normalizer"), 0, err);
	if (!rc && tok->norm == TOK_NORM_NFC)
		rc = tok_nfc_table(tok, err);
	if (!rc)
		rc = load_pretok(tok, json_object_get(root, "pre_tokenizer"), 0, &byte_level, err);
	if (!rc)
		rc = check_decoder(json_object_get(root, "decoder"), 0, err);
	if (!rc && !byte_level)
		rc = fp4s_error_set(err, FP4S_EUNSUPPORTED,
				    "not a byte-level BPE tokenizer (no ByteLevel pre_tokenizer)");
	if (!rc)
		load_post(tok, json_object_get(root, "post_processor"), 0);
	json_decref(root);
	if (rc)
		return fp4s_error_prefix(err, "%s: ", path);
	return 0;
}
