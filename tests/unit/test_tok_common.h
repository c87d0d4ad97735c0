/* test_tok_common.h: helpers shared by the tokenizer tests: locating test data, reading files, and
 * running llama.cpp's tokenizer test pairs (.inp = strings joined by "\n__ggml_vocab_test__\n",
 * .out = one line of space-separated ids per string, no BOS, no special-token parsing). */
#ifndef TEST_TOK_COMMON_H
#define TEST_TOK_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

/* $FP4S_CACHE_DIR/npm/<pkg>/package/models/<file>, filled by scripts/fetch-testdata.sh */
static inline const char *tt_cache_path(char *buf, size_t n, const char *pkg, const char *file)
{
	const char *c = getenv("FP4S_CACHE_DIR");
	snprintf(buf, n, "%s/npm/%s/package/models/%s", c ? c : ".cache", pkg, file);
	return buf;
}

static inline const char *tt_shared_path(char *buf, size_t n, const char *rel)
{
	const char *s = getenv("FP4S_SHARED_DIR");
	snprintf(buf, n, "%s/%s", s ? s : "../shared", rel);
	return buf;
}

static inline int tt_exists(const char *p)
{
	FILE *f = fopen(p, "rb");
	if (f)
		fclose(f);
	return f != NULL;
}

static inline char *tt_read(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long sz = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = malloc((size_t)sz + 1);
	if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
		free(b);
		b = NULL;
	}
	fclose(f);
	if (b) {
		b[sz] = 0;
		if (n)
			*n = (size_t)sz;
	}
	return b;
}

/* Runs one .inp/.out pair; returns the number of cases that matched and sets *total. Mismatches
 * are printed with both id lists. */
static inline int tt_run_pair(const struct fp4s_tokenizer *tok, const char *inp_path, const char *out_path,
			      int *total)
{
	static const char SEP[] = "\n__ggml_vocab_test__\n";
	char *inp = tt_read(inp_path, NULL), *out = tt_read(out_path, NULL);
	int pass = 0, n = 0;
	*total = 0;
	if (!inp || !out) {
		free(inp);
		free(out);
		return -1;
	}
	char *s = inp, *o = out;
	struct fp4s_tok_ids ids = {0};
	for (;;) {
		char *e = strstr(s, SEP);
		char *ol = strchr(o, '\n');
		if (!ol)
			break;
		*ol = 0;
		size_t len = e ? (size_t)(e - s) : strlen(s);
		ids.n = 0;
		struct fp4s_error err = {0};
		char got[16384] = "", want[16384];
		int ok = fp4s_tok_encode(tok, s, len, 0, &ids, &err) == 0;
		size_t gl = 0;
		for (size_t i = 0; ok && i < ids.n && gl + 16 < sizeof got; i++)
			gl += (size_t)snprintf(got + gl, sizeof got - gl, " %d", ids.v[i]);
		snprintf(want, sizeof want, "%s", o);
		/* .out lines start with a space before each id; an empty case is an empty line */
		if (ok && strcmp(got, want) == 0) {
			pass++;
		} else {
			fprintf(stderr, "case %d %.*s\n  want:%s\n  got: %s%s\n", n, (int)(len < 60 ? len : 60), s, want,
				got, ok ? "" : err.msg);
		}
		n++;
		o = ol + 1;
		if (!e)
			break;
		s = e + sizeof SEP - 1;
	}
	fp4s_tok_ids_free(&ids);
	free(inp);
	free(out);
	*total = n;
	return pass;
}

/* Opens tok_path and checks llama.cpp's pair ggml-vocab-<name>.gguf.{inp,out}: every case must match.
 * Data that is missing is reported and not counted in *ran. */
static inline int tt_vocab_pair(const char *name, const char *tok_path, int *ran)
{
	char inp[1024], out[1024];
	char rel[256];
	snprintf(rel, sizeof rel, "realdata/tokenizer-tests/ggml-vocab-%s.gguf.inp", name);
	tt_shared_path(inp, sizeof inp, rel);
	snprintf(rel, sizeof rel, "realdata/tokenizer-tests/ggml-vocab-%s.gguf.out", name);
	tt_shared_path(out, sizeof out, rel);
	if (!tt_exists(tok_path) || !tt_exists(inp)) {
		fprintf(stderr, "%s: data missing (%s or %s); not run\n", name, tok_path, inp);
		return 0;
	}
	struct fp4s_tokenizer *tok;
	struct fp4s_error err = {0};
	if (fp4s_tok_open(&tok, tok_path, &err)) {
		CHECK_MSG(0, "open %s: %s", tok_path, err.msg);
		return 0;
	}
	int total, pass = tt_run_pair(tok, inp, out, &total);
	printf("%s (%s): %d/%d cases pass\n", name, strrchr(tok_path, '/') ? strrchr(tok_path, '/') + 1 : tok_path,
	       pass, total);
	CHECK_EQ_INT(pass, total);
	CHECK_EQ_INT(total, 46); /* 46 strings, each followed by the separator */
	fp4s_tok_close(tok);
	(*ran)++;
	return 0;
}

#endif
