/* cmd_tokenize.c: `fp4serve tokenize` (text -> ids on one line) and `fp4serve detokenize`
 * (ids -> text). Stdout carries only the result, so scripts can compare it; messages go to stderr.
 * `tokenize --bench-mb N` measures single-threaded encode throughput on N MB of generated mixed
 * text (prose, code, numbers, accented/CJK/emoji words) and prints MB/s. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "tokenizer/tokenizer.h"

static int read_all(FILE *f, struct fp4s_tok_text *t)
{
	char buf[65536];
	size_t n;
	t->n = 0;
	if (fp4s_tok_text_append(t, "", 0))
		return -1;
	while ((n = fread(buf, 1, sizeof buf, f)) > 0)
		if (fp4s_tok_text_append(t, buf, n))
			return -1;
	return ferror(f) ? -1 : 0;
}

static int open_tok(const char *tok_path, const char *model_dir, const char *chat, struct fp4s_tokenizer **tok)
{
	struct fp4s_error err = {0};
	const char *p = tok_path ? tok_path : model_dir;
	if (!p) {
		fprintf(stderr, "error: give --tokenizer FILE or -m DIR\n");
		return 2;
	}
	if (fp4s_tok_open(tok, p, &err)) {
		fprintf(stderr, "error: %s\n", err.msg);
		return 1;
	}
	if (chat && fp4s_tok_set_chat_format(*tok, chat, &err)) {
		fprintf(stderr, "error: %s\n", err.msg);
		fp4s_tok_close(*tok);
		return 2;
	}
	return 0;
}

/* Deterministic mixed text: the bench must measure the same input on every run. */
static void gen_text(struct fp4s_tok_text *t, size_t bytes)
{
	static const char *const words[] = {
		"the", "of", "and", "to", "in", "is", "that", "for", "it", "with", "as", "was", "on",
		"tokenizer", "throughput", "inference", "quantized", "Transformer", "attention", "CamelCaseName",
		"don't", "we'll", "it's", "I'M", "HTTP/1.1", "https://example.com/a/b?c=d", "2024-06-01",
		"3.14159", "1234567", "42", "0x7fff", "int32_t", "x->next", "i++", "{", "}", "();", "==",
		"naïve", "café", "über", "Straße", "résumé", "日本語", "の", "中文字符", "한국어", "Ελληνικά",
		"русский", "العربية", "हिन्दी", "🙂", "🚀🚀", "—", "…", "«quote»", "\t", "    ",
	};
	static const char *const seps[] = {" ", " ", " ", " ", " ", ", ", ". ", "\n", "\n\n", "  ", ": ", "; "};
	unsigned long long s = 0x1234567ull;
	t->n = 0;
	while (t->n < bytes) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		unsigned r = (unsigned)(s >> 33);
		fp4s_tok_text_append(t, words[r % (sizeof words / sizeof *words)],
				       strlen(words[r % (sizeof words / sizeof *words)]));
		const char *sep = seps[(r >> 8) % (sizeof seps / sizeof *seps)];
		fp4s_tok_text_append(t, sep, strlen(sep));
	}
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int bench(struct fp4s_tokenizer *tok, const struct fp4s_tok_text *input, double mb)
{
	struct fp4s_tok_text t = {0};
	struct fp4s_tok_ids ids = {0};
	struct fp4s_error err = {0};
	const char *p;
	size_t n;
	if (input) {
		p = input->s, n = input->n;
	} else {
		gen_text(&t, (size_t)(mb * 1e6));
		p = t.s, n = t.n;
	}
	/* warm-up on a slice, then the best of three full passes */
	fp4s_tok_encode(tok, p, n < 100000 ? n : 100000, 0, &ids, &err);
	double best = 1e30;
	for (int rep = 0; rep < 3; rep++) {
		ids.n = 0;
		double t0 = now_s();
		if (fp4s_tok_encode(tok, p, n, FP4S_TOK_PARSE_SPECIAL, &ids, &err)) {
			fprintf(stderr, "error: %s\n", err.msg);
			return 1;
		}
		double dt = now_s() - t0;
		if (dt < best)
			best = dt;
	}
	printf("bytes %zu tokens %zu bytes/token %.2f time %.3f s throughput %.2f MB/s\n", n, ids.n,
	       (double)n / (double)(ids.n ? ids.n : 1), best, (double)n / best / 1e6);
	fp4s_tok_text_free(&t);
	fp4s_tok_ids_free(&ids);
	return 0;
}

int cmd_tokenize(int argc, char **argv)
{
	static const struct option opts[] = {
		{"tokenizer", required_argument, 0, 't'}, {"model", required_argument, 0, 'm'},
		{"file", required_argument, 0, 'f'},      {"add-special", no_argument, 0, 'a'},
		{"no-parse-special", no_argument, 0, 'N'}, {"bench-mb", required_argument, 0, 'b'},
		{"help", no_argument, 0, 'h'},            {0, 0, 0, 0},
	};
	const char *tok_path = NULL, *model = NULL, *file = NULL;
	unsigned flags = FP4S_TOK_PARSE_SPECIAL;
	double bench_mb = 0;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "t:m:f:h", opts, NULL)) != -1) {
		switch (c) {
		case 't': tok_path = optarg; break;
		case 'm': model = optarg; break;
		case 'f': file = optarg; break;
		case 'a': flags |= FP4S_TOK_ADD_SPECIAL; break;
		case 'N': flags &= ~(unsigned)FP4S_TOK_PARSE_SPECIAL; break;
		case 'b': bench_mb = atof(optarg); break;
		case 'h':
			printf("usage: fp4serve tokenize (--tokenizer FILE | -m DIR) [--add-special] [--no-parse-special]\n"
			       "                         [-f FILE | TEXT...]\n"
			       "       fp4serve tokenize (--tokenizer FILE | -m DIR) --bench-mb N [-f FILE]\n"
			       "  Prints the token ids of TEXT (or FILE, or stdin) on one line.\n"
			       "  --add-special       add BOS/EOS as the tokenizer's rules say\n"
			       "  --no-parse-special  treat special-token text (<|eot_id|>...) as plain text\n"
			       "  --bench-mb N        encode N MB of mixed text (or FILE) on one thread, print MB/s\n");
			return 0;
		default: return 2;
		}
	}
	struct fp4s_tokenizer *tok;
	int rc = open_tok(tok_path, model, NULL, &tok);
	if (rc)
		return rc;
	struct fp4s_tok_text text = {0};
	if (file) {
		FILE *f = fopen(file, "rb");
		if (!f || read_all(f, &text)) {
			fprintf(stderr, "error: cannot read %s\n", file);
			if (f)
				fclose(f);
			fp4s_tok_close(tok);
			return 1;
		}
		fclose(f);
	} else if (optind < argc) {
		fp4s_tok_text_append(&text, "", 0);
		for (int i = optind; i < argc; i++) {
			if (i > optind)
				fp4s_tok_text_append(&text, " ", 1);
			fp4s_tok_text_append(&text, argv[i], strlen(argv[i]));
		}
	} else if (bench_mb <= 0 && read_all(stdin, &text)) {
		fprintf(stderr, "error: cannot read stdin\n");
		fp4s_tok_close(tok);
		return 1;
	}
	if (bench_mb > 0) {
		rc = bench(tok, file ? &text : NULL, bench_mb);
	} else {
		struct fp4s_tok_ids ids = {0};
		struct fp4s_error err = {0};
		if (fp4s_tok_encode(tok, text.s ? text.s : "", text.n, flags, &ids, &err)) {
			fprintf(stderr, "error: %s\n", err.msg);
			rc = 1;
		} else {
			for (size_t i = 0; i < ids.n; i++)
				printf(i ? " %d" : "%d", ids.v[i]);
			printf("\n");
		}
		fp4s_tok_ids_free(&ids);
	}
	fp4s_tok_text_free(&text);
	fp4s_tok_close(tok);
	return rc;
}

static int parse_ids(const char *s, struct fp4s_tok_ids *ids, int32_t n_vocab)
{
	while (*s) {
		char *end;
		while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r' || *s == ',')
			s++;
		if (!*s)
			break;
		long v = strtol(s, &end, 10);
		if (end == s || v < 0 || v >= n_vocab) {
			fprintf(stderr, "error: bad token id '%.20s' (vocab %d)\n", s, n_vocab);
			return -1;
		}
		if (ids->n == ids->cap) {
			size_t cap = ids->cap ? ids->cap * 2 : 64;
			int32_t *v2 = realloc(ids->v, cap * sizeof *v2);
			if (!v2)
				return -1;
			ids->v = v2;
			ids->cap = cap;
		}
		ids->v[ids->n++] = (int32_t)v;
		s = end;
	}
	return 0;
}

int cmd_detokenize(int argc, char **argv)
{
	static const struct option opts[] = {
		{"tokenizer", required_argument, 0, 't'}, {"model", required_argument, 0, 'm'},
		{"skip-special", no_argument, 0, 's'},    {"help", no_argument, 0, 'h'},
		{0, 0, 0, 0},
	};
	const char *tok_path = NULL, *model = NULL;
	unsigned flags = 0;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "t:m:h", opts, NULL)) != -1) {
		switch (c) {
		case 't': tok_path = optarg; break;
		case 'm': model = optarg; break;
		case 's': flags |= FP4S_TOK_SKIP_SPECIAL; break;
		case 'h':
			printf("usage: fp4serve detokenize (--tokenizer FILE | -m DIR) [--skip-special] [ID...]\n"
			       "  Writes the text of the ids (arguments, or whitespace-separated on stdin) to stdout,\n"
			       "  byte for byte, with no newline added.\n");
			return 0;
		default: return 2;
		}
	}
	struct fp4s_tokenizer *tok;
	int rc = open_tok(tok_path, model, NULL, &tok);
	if (rc)
		return rc;
	struct fp4s_tok_ids ids = {0};
	struct fp4s_tok_text in = {0}, out = {0};
	struct fp4s_error err = {0};
	if (optind < argc) {
		for (int i = optind; i < argc && !rc; i++)
			if (parse_ids(argv[i], &ids, fp4s_tok_n_vocab(tok)))
				rc = 2;
	} else if (read_all(stdin, &in) || parse_ids(in.s, &ids, fp4s_tok_n_vocab(tok))) {
		rc = 2;
	}
	if (!rc && fp4s_tok_decode(tok, ids.v, ids.n, flags, &out, &err)) {
		fprintf(stderr, "error: %s\n", err.msg);
		rc = 1;
	}
	if (!rc)
		fwrite(out.s, 1, out.n, stdout);
	fp4s_tok_ids_free(&ids);
	fp4s_tok_text_free(&in);
	fp4s_tok_text_free(&out);
	fp4s_tok_close(tok);
	return rc;
}
