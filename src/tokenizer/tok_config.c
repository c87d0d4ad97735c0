/* tok_config.c: opening a tokenizer from a model directory or a file, tokenizer_config.json and
 * generation_config.json (BOS/EOS, add-BOS rules, stop ids, chat template), and the vocabulary
 * queries of tokenizer.h. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokenizer/tok_internal.h"
#include "util/log.h"

#define TOK_MAX_CONFIG_BYTES ((size_t)64 << 20)
#define TOK_MAX_STOP 64

int tok_read_file(const char *path, char **buf, size_t *n, size_t max, struct fp4s_error *err)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return fp4s_error_set(err, FP4S_EIO, "cannot open %s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
		fclose(f);
		return fp4s_error_set(err, FP4S_EIO, "%s is not a regular file", path);
	}
	if ((size_t)st.st_size > max) {
		fclose(f);
		return fp4s_error_set(err, FP4S_EFORMAT, "%s is %lld bytes (limit %zu)", path, (long long)st.st_size, max);
	}
	size_t sz = (size_t)st.st_size;
	char *b = malloc(sz + 1);
	if (!b) {
		fclose(f);
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory reading %s", path);
	}
	size_t got = fread(b, 1, sz, f);
	fclose(f);
	if (got != sz) {
		free(b);
		return fp4s_error_set(err, FP4S_EIO, "short read on %s", path);
	}
	b[sz] = 0;
	*buf = b;
	*n = sz;
	return 0;
}

static int is_dir(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* bos_token / eos_token: a string, or an AddedToken object {"content": ...} */
static const char *token_text(json_t *v)
{
	if (json_is_string(v))
		return json_string_value(v);
	if (json_is_object(v))
		return json_string_value(json_object_get(v, "content"));
	return NULL;
}

static void add_stop(struct fp4s_tokenizer *tok, json_int_t id)
{
	/* taken as it is: a cast to int32 first would turn 2^32 + 5 into 5 */
	if (id < 0 || id >= tok->n_vocab || tok->n_stop >= TOK_MAX_STOP)
		return;
	for (size_t i = 0; i < tok->n_stop; i++)
		if (tok->stop[i] == id)
			return;
	tok->stop[tok->n_stop++] = (int32_t)id;
}

static int load_tok_config(struct fp4s_tokenizer *tok, const char *path, struct fp4s_error *err)
{
	char *buf;
	size_t n;
	int rc = tok_read_file(path, &buf, &n, TOK_MAX_CONFIG_BYTES, err);
	if (rc)
		return rc;
	json_error_t je;
	json_t *root = json_loadb(buf, n, JSON_DECODE_INT_AS_REAL, &je);
	free(buf);
	if (!json_is_object(root)) {
		json_decref(root);
		return fp4s_error_set(err, FP4S_EFORMAT, "%s: JSON error at line %d: %s", path, je.line, je.text);
	}
	const char *bos = token_text(json_object_get(root, "bos_token"));
	const char *eos = token_text(json_object_get(root, "eos_token"));
	if (bos) {
		int32_t id = fp4s_tok_find(tok, bos);
		if (id >= 0)
			tok->bos = id;
		else
			FP4S_WARN("tokenizer: bos_token '%s' of %s is not a token", bos, path);
	}
	if (eos) {
		int32_t id = fp4s_tok_find(tok, eos);
		if (id >= 0)
			tok->eos = id;
		else
			FP4S_WARN("tokenizer: eos_token '%s' of %s is not a token", eos, path);
	}
	/* LlamaTokenizer(Fast) style flags override what the post-processor says */
	json_t *ab = json_object_get(root, "add_bos_token"), *ae = json_object_get(root, "add_eos_token");
	if (json_is_boolean(ab))
		tok->add_bos = json_is_true(ab) && tok->bos >= 0;
	if (json_is_boolean(ae))
		tok->add_eos = json_is_true(ae) && tok->eos >= 0;

	json_t *ct = json_object_get(root, "chat_template");
	const char *tmpl = NULL;
	if (json_is_string(ct)) {
		tmpl = json_string_value(ct);
	} else if (json_is_array(ct)) {
		/* a list of named templates: the "default" one, else the first */
		for (size_t i = 0; i < json_array_size(ct); i++) {
			json_t *e = json_array_get(ct, i);
			const char *name = json_string_value(json_object_get(e, "name"));
			const char *t = json_string_value(json_object_get(e, "template"));
			if (t && (!tmpl || (name && !strcmp(name, "default"))))
				tmpl = t;
		}
	}
	if (tmpl && !(tok->chat_template = strdup(tmpl)))
		rc = fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	json_decref(root);
	return rc;
}

static int load_gen_config(struct fp4s_tokenizer *tok, const char *path, struct fp4s_error *err)
{
	char *buf;
	size_t n;
	int rc = tok_read_file(path, &buf, &n, TOK_MAX_CONFIG_BYTES, err);
	if (rc)
		return rc;
	json_error_t je;
	json_t *root = json_loadb(buf, n, 0, &je);
	free(buf);
	if (!json_is_object(root)) {
		json_decref(root);
		return fp4s_error_set(err, FP4S_EFORMAT, "%s: JSON error at line %d: %s", path, je.line, je.text);
	}
	json_t *e = json_object_get(root, "eos_token_id");
	if (json_is_integer(e)) {
		add_stop(tok, json_integer_value(e));
	} else if (json_is_array(e)) {
		for (size_t i = 0; i < json_array_size(e); i++)
			if (json_is_integer(json_array_get(e, i)))
				add_stop(tok, json_integer_value(json_array_get(e, i)));
	}
	json_t *b = json_object_get(root, "bos_token_id");
	if (json_is_integer(b) && tok->bos < 0 && json_integer_value(b) >= 0 && json_integer_value(b) < tok->n_vocab)
		tok->bos = (int32_t)json_integer_value(b);
	json_decref(root);
	return 0;
}

/* 'j' tokenizer.json, 'g' GGUF, 'b' llama2.c .bin (no magic: anything else) */
static int sniff(const char *path)
{
	size_t l = strlen(path);
	if (l >= 5 && !strcmp(path + l - 5, ".json"))
		return 'j';
	FILE *f = fopen(path, "rb");
	unsigned char m[4] = {0};
	int c = ' ';
	if (!f)
		return 'b';
	if (fread(m, 1, 4, f) == 4 && !memcmp(m, "GGUF", 4)) {
		fclose(f);
		return 'g';
	}
	rewind(f);
	while (c == ' ' || c == '\n' || c == '\r' || c == '\t')
		c = fgetc(f);
	fclose(f);
	return c == '{' ? 'j' : 'b';
}

/* The chat format's end-of-turn tokens are stop ids too. */
static void add_format_stops(struct fp4s_tokenizer *tok)
{
	static const char *const names[][3] = {
		[FP4S_CHAT_LLAMA3] = {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"},
		[FP4S_CHAT_LLAMA31] = {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"},
		[FP4S_CHAT_CHATML] = {"<|im_end|>", "<|endoftext|>", NULL},
		[FP4S_CHAT_QWEN3] = {"<|im_end|>", "<|endoftext|>", NULL},
		[FP4S_CHAT_HARMONY] = {"<|return|>", "<|call|>", NULL},
	};
	if (tok->chat.format <= FP4S_CHAT_NONE || tok->chat.format >= FP4S_CHAT_COUNT)
		return;
	for (int i = 0; i < 3; i++)
		if (names[tok->chat.format][i])
			add_stop(tok, fp4s_tok_find(tok, names[tok->chat.format][i]));
}

static void set_chat_bos(struct fp4s_tokenizer *tok)
{
	size_t n = 0;
	const char *s = tok->bos >= 0 ? fp4s_tok_piece(tok, tok->bos, &n) : NULL;
	tok->chat.bos[0] = 0;
	if (s && n < sizeof tok->chat.bos && (tok->tok_flags[tok->bos] & TOKF_ADDED)) {
		memcpy(tok->chat.bos, s, n);
		tok->chat.bos[n] = 0;
	}
}

int fp4s_tok_open(struct fp4s_tokenizer **out, const char *path, struct fp4s_error *err)
{
	*out = NULL;
	struct fp4s_tokenizer *tok = calloc(1, sizeof *tok);
	if (!tok)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	tok->stop = calloc(TOK_MAX_STOP, sizeof *tok->stop);
	if (!tok->stop) {
		free(tok);
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	}
	tok->bos = tok->eos = -1;
	size_t pl = strlen(path);
	char *dir = malloc(pl + 64), *p = malloc(pl + 64);
	int rc = 0;
	if (!dir || !p) {
		rc = fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
		goto out;
	}
	if (is_dir(path)) {
		strcpy(dir, path);
		sprintf(p, "%s/tokenizer.json", dir);
		if (is_file(p)) {
			rc = tok_load_json(tok, p, err);
		} else {
			static const char *const bins[] = {"tokenizer.bin", "tok512.bin"};
			rc = fp4s_error_set(err, FP4S_EIO, "%s has no tokenizer.json or tokenizer.bin", path);
			for (size_t i = 0; i < 2; i++) {
				sprintf(p, "%s/%s", dir, bins[i]);
				if (is_file(p)) {
					rc = tok_load_llama2c(tok, p, err);
					break;
				}
			}
		}
	} else if (is_file(path)) {
		strcpy(dir, path);
		char *slash = strrchr(dir, '/');
		if (slash)
			*slash = 0;
		else
			strcpy(dir, ".");
		int kind = sniff(path);
		rc = kind == 'j'   ? tok_load_json(tok, path, err)
		     : kind == 'g' ? tok_load_gguf(tok, path, err)
				   : tok_load_llama2c(tok, path, err);
		if (kind != 'j')
			dir[0] = 0; /* only a tokenizer.json has config files beside it */
	} else {
		rc = fp4s_error_set(err, FP4S_EIO, "tokenizer path %s: %s", path, strerror(errno));
	}
	if (!rc && dir[0]) {
		sprintf(p, "%s/tokenizer_config.json", dir);
		if (is_file(p))
			rc = load_tok_config(tok, p, err);
		sprintf(p, "%s/generation_config.json", dir);
		if (!rc && is_file(p))
			rc = load_gen_config(tok, p, err);
	}
	if (!rc) {
		add_stop(tok, tok->eos);
		tok->chat.format = fp4s_chat_detect(tok->chat_template, tok, &tok->chat.flags);
		set_chat_bos(tok);
		add_format_stops(tok);
		FP4S_DEBUG("tokenizer: %s: %d tokens, bos %d eos %d add_bos %d, chat format %s", path, tok->n_vocab,
			   tok->bos, tok->eos, tok->add_bos, fp4s_chat_format_name(tok->chat.format));
	}
out:
	free(dir);
	free(p);
	if (rc) {
		fp4s_tok_close(tok);
		return rc;
	}
	*out = tok;
	return 0;
}

void fp4s_tok_close(struct fp4s_tokenizer *tok)
{
	if (!tok)
		return;
	for (int i = 0; i < tok->n_stages; i++)
		if (tok->stages[i].re)
			pcre2_code_free(tok->stages[i].re);
	tok_strmap_free(&tok->vocab);
	tok_pairmap_free(&tok->merges);
	free(tok->arena);
	free(tok->tok_off);
	free(tok->tok_flags);
	free(tok->scores);
	free(tok->added);
	free(tok->trie);
	free(tok->nfc_safe);
	free(tok->stop);
	free(tok->chat_template);
	free(tok);
}

int fp4s_tok_encode(const struct fp4s_tokenizer *tok, const char *text, size_t len, unsigned flags,
		    struct fp4s_tok_ids *ids, struct fp4s_error *err)
{
	if (!tok || (!text && len))
		return fp4s_error_set(err, FP4S_EINVAL, "encode: no tokenizer or text");
	if (tok->kind == FP4S_TOK_KIND_BPE_JSON)
		return tok_bpe_encode(tok, text, len, flags, ids, err);
	if ((flags & FP4S_TOK_ADD_SPECIAL) && tok->add_bos && tok->bos >= 0 && tok_ids_push(ids, tok->bos))
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	int rc = tok_spm_encode(tok, text, len, ids, err);
	if (!rc && (flags & FP4S_TOK_ADD_SPECIAL) && tok->add_eos && tok->eos >= 0 && tok_ids_push(ids, tok->eos))
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	return rc;
}

enum fp4s_tok_kind fp4s_tok_kind(const struct fp4s_tokenizer *tok) { return tok->kind; }
int32_t fp4s_tok_n_vocab(const struct fp4s_tokenizer *tok) { return tok->n_vocab; }
int32_t fp4s_tok_bos(const struct fp4s_tokenizer *tok) { return tok->bos; }
int32_t fp4s_tok_eos(const struct fp4s_tokenizer *tok) { return tok->eos; }
int fp4s_tok_adds_bos(const struct fp4s_tokenizer *tok) { return tok->add_bos; }
const char *fp4s_tok_chat_template(const struct fp4s_tokenizer *tok) { return tok->chat_template; }
const struct fp4s_chat_template *fp4s_tok_chat(const struct fp4s_tokenizer *tok) { return &tok->chat; }

const int32_t *fp4s_tok_stop_ids(const struct fp4s_tokenizer *tok, size_t *n)
{
	*n = tok->n_stop;
	return tok->stop;
}

int fp4s_tok_is_special(const struct fp4s_tokenizer *tok, int32_t id)
{
	return id >= 0 && id < tok->n_vocab && (tok->tok_flags[id] & TOKF_SPECIAL);
}

const char *fp4s_tok_piece(const struct fp4s_tokenizer *tok, int32_t id, size_t *len)
{
	if (id < 0 || id >= tok->n_vocab) {
		*len = 0;
		return NULL;
	}
	return tok_text(tok, id, len);
}

int32_t fp4s_tok_find(const struct fp4s_tokenizer *tok, const char *text)
{
	size_t n = strlen(text);
	if (tok->n_trie) {
		int32_t node = 0;
		for (size_t i = 0; i < n && node >= 0; i++) {
			int32_t ch = tok->trie[node].first_child;
			while (ch >= 0 && tok->trie[ch].byte != (unsigned char)text[i])
				ch = tok->trie[ch].next_sibling;
			node = ch;
		}
		if (n && node >= 0 && tok->trie[node].token >= 0)
			return tok->added[tok->trie[node].token].id;
	}
	int32_t id = tok_strmap_get(tok, &tok->vocab, text, n);
	if (id >= 0)
		return id;
	/* SentencePiece control and byte pieces are not in the map; llama2.c wraps <s> in newlines */
	for (int32_t i = 0; i < tok->n_vocab; i++) {
		if (!(tok->tok_flags[i] & (TOKF_CONTROL | TOKF_BYTE)))
			continue;
		size_t l;
		const char *s = tok_text(tok, i, &l);
		if (l >= 2 && s[0] == '\n' && s[l - 1] == '\n')
			s++, l -= 2;
		if (l == n && !memcmp(s, text, n))
			return i;
	}
	return -1;
}

int fp4s_tok_set_chat_template(struct fp4s_tokenizer *tok, const char *tmpl, struct fp4s_error *err)
{
	unsigned flags;
	enum fp4s_chat_format f = fp4s_chat_detect(tmpl, NULL, &flags);
	if (f == FP4S_CHAT_NONE)
		return fp4s_error_set(err, FP4S_EUNSUPPORTED,
				      "the chat template is of no family the built-in formatters know (llama3, "
				      "llama3.1, chatml, qwen3, harmony); pick one by name");
	tok->chat.format = f;
	tok->chat.flags = flags;
	set_chat_bos(tok);
	add_format_stops(tok);
	return 0;
}

int fp4s_tok_set_chat_format(struct fp4s_tokenizer *tok, const char *name, struct fp4s_error *err)
{
	enum fp4s_chat_format f;
	if (fp4s_chat_format_from_name(name, &f))
		return fp4s_error_set(err, FP4S_EINVAL,
				      "unknown chat format '%s' (llama3, llama3.1, chatml, qwen3, harmony)", name);
	tok->chat.format = f;
	tok->chat.flags = 0;
	set_chat_bos(tok);
	add_format_stops(tok);
	return 0;
}
