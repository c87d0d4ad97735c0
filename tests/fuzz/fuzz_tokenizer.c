/* fuzz_tokenizer.c: libFuzzer target for the tokenizer files a model folder brings (fp4s_tok_open
 * on tokenizer.json, GGUF vocabularies and llama2.c tokenizer.bin, told apart by their bytes) and
 * for what is then done with a tokenizer that loads: encoding text with and without special
 * tokens, decoding, streaming decode, and chat rendering. Built and run by
 * `FP4S_FUZZ_TARGET=tokenizer scripts/fuzz.sh SECONDS`; seeds from tests/fuzz/make_tok_seeds.py.
 *
 * An input holding the line "#cfg#" is a model folder instead: the bytes before it are its
 * tokenizer.json, those after it its tokenizer_config.json (BOS/EOS, add-BOS flags, chat
 * template), and those after a second "#cfg#" line its generation_config.json (stop ids).
 *
 * A file that does not load must say why. One that loads must give ids inside its vocabulary and
 * streamed text that is valid UTF-8 (the server sends it as JSON). Anything else aborts. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[256], path[300];

static void die(const char *msg)
{
	fprintf(stderr, "fuzz_tokenizer: %s\n", msg);
	abort();
}

static void cleanup(void);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fp4s_log_set_level(FP4S_LOG_ERROR);
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, sizeof dir, "%s/fp4s-fuzz-tok-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir))
		die("mkdtemp failed");
	snprintf(path, sizeof path, "%s/tokenizer.in", dir);
	atexit(cleanup);
	return 0;
}

static void check_ids(const struct fp4s_tokenizer *tok, const struct fp4s_tok_ids *ids)
{
	const int32_t nv = fp4s_tok_n_vocab(tok);
	for (size_t i = 0; i < ids->n; i++)
		if (ids->v[i] < 0 || ids->v[i] >= nv)
			die("encode gave an id outside the vocabulary");
}

static void stream(const struct fp4s_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags)
{
	struct fp4s_tok_stream st;
	struct fp4s_tok_text out = {0};
	struct fp4s_error err = {0};
	fp4s_tok_stream_init(&st, tok, flags);
	for (size_t i = 0; i < n; i++)
		if (fp4s_tok_stream_push(&st, ids[i], &out, &err))
			die("stream decode of an in-range id failed");
	if (fp4s_tok_stream_flush(&st, &out))
		die("stream flush failed");
	if (!fuzz_valid_utf8((const uint8_t *)out.s, out.n))
		die("streamed text is not valid UTF-8");
	fp4s_tok_text_free(&out);
}

static void use(const struct fp4s_tokenizer *tok, const uint8_t *data, size_t size)
{
	const int32_t nv = fp4s_tok_n_vocab(tok);
	if (nv <= 0)
		die("a loaded tokenizer has no vocabulary");
	static const char sample[] = "Hello world! 123 <|eot_id|><s> the \xC3\xBC\xE2\x96\x81 \xF0\x9F\x99\x82\n\n";
	struct fp4s_error err = {0};
	struct fp4s_tok_text txt = {0};
	for (unsigned flags = 0; flags < 4; flags++) {
		struct fp4s_tok_ids ids = {0};
		/* the sample, then the file's own first bytes as text (invalid UTF-8 included) */
		if (!fp4s_tok_encode(tok, sample, sizeof sample - 1, flags, &ids, &err))
			check_ids(tok, &ids);
		if (!fp4s_tok_encode(tok, (const char *)data, size < 200 ? size : 200, flags, &ids, &err))
			check_ids(tok, &ids);
		if (fp4s_tok_decode(tok, ids.v, ids.n, flags & 1, &txt, &err))
			die("decode of encoded ids failed");
		stream(tok, ids.v, ids.n, flags & 1);
		fp4s_tok_ids_free(&ids);
	}
	/* every id the file defines, a bounded number of them */
	int32_t all[512];
	const size_t n = nv < 512 ? (size_t)nv : 512;
	for (size_t i = 0; i < n; i++)
		all[i] = (int32_t)((uint64_t)i * (uint64_t)nv / n);
	stream(tok, all, n, 0);
	stream(tok, all, n, FP4S_TOK_SKIP_SPECIAL);
	int32_t bad = nv;
	if (!fp4s_tok_decode(tok, &bad, 1, 0, &txt, &err))
		die("decode of an id past the vocabulary succeeded");
	fp4s_tok_text_free(&txt);
	/* the chat format it was detected as, rendered and encoded */
	const struct fp4s_chat_template *t = fp4s_tok_chat(tok);
	if (t && t->format != FP4S_CHAT_NONE) {
		const struct fp4s_chat_msg m[2] = {{.role = "system", .content = "Be brief."},
		                                   {.role = "user", .content = "Hello"}};
		const struct fp4s_chat_opts co = {.add_generation_prompt = 1, .enable_thinking = 1};
		struct fp4s_tok_text prompt = {0};
		struct fp4s_tok_ids ids = {0};
		if (!fp4s_chat_apply(t, m, 2, &co, &prompt, &err) &&
		    !fp4s_tok_encode(tok, prompt.s, prompt.n, FP4S_TOK_PARSE_SPECIAL, &ids, &err))
			check_ids(tok, &ids);
		fp4s_tok_ids_free(&ids);
		fp4s_tok_text_free(&prompt);
	}
}

static void put(const char *name, const uint8_t *data, size_t size)
{
	char p[400];
	snprintf(p, sizeof p, "%s/%s", dir, name);
	FILE *f = fopen(p, "wb");
	if (!f)
		die("cannot write an input file");
	if (size && fwrite(data, 1, size, f) != size)
		die("cannot write an input file");
	fclose(f);
}

static void drop(const char *name)
{
	char p[400];
	snprintf(p, sizeof p, "%s/%s", dir, name);
	remove(p);
}

static void cleanup(void)
{
	static const char *const names[] = {"tokenizer.in", "tokenizer.json", "tokenizer_config.json",
	                                    "generation_config.json"};
	for (size_t i = 0; i < sizeof names / sizeof *names; i++)
		drop(names[i]);
	remove(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char sep[] = "\n#cfg#\n";
	const size_t ls = sizeof sep - 1;
	const uint8_t *cfg = size >= ls ? memmem(data, size, sep, ls) : NULL;
	const char *open_path = path;
	size_t size0 = size;
	if (cfg) {
		/* a folder: tokenizer.json, tokenizer_config.json and maybe generation_config.json */
		size0 = (size_t)(cfg - data);
		const uint8_t *c1 = cfg + ls, *end = data + size;
		const uint8_t *gen = memmem(c1, (size_t)(end - c1), sep, ls);
		put("tokenizer.json", data, size0);
		put("tokenizer_config.json", c1, (size_t)((gen ? gen : end) - c1));
		if (gen)
			put("generation_config.json", gen + ls, (size_t)(end - gen - ls));
		else
			drop("generation_config.json");
		open_path = dir;
	} else {
		/* a JSON file picks up config files beside it: none may be left from a folder input */
		drop("tokenizer_config.json");
		drop("generation_config.json");
		put("tokenizer.in", data, size);
	}
	struct fp4s_tokenizer *tok = NULL;
	struct fp4s_error err = {0};
	if (fp4s_tok_open(&tok, open_path, &err)) {
		if (!err.msg[0])
			die("a tokenizer that does not load says nothing");
		return 0;
	}
	size_t n_stop = 0;
	const int32_t *stop = fp4s_tok_stop_ids(tok, &n_stop);
	for (size_t i = 0; i < n_stop; i++)
		if (stop[i] < 0 || stop[i] >= fp4s_tok_n_vocab(tok))
			die("a stop id outside the vocabulary");
	if (fp4s_tok_bos(tok) >= fp4s_tok_n_vocab(tok) || fp4s_tok_eos(tok) >= fp4s_tok_n_vocab(tok))
		die("BOS or EOS outside the vocabulary");
	use(tok, data, size0);
	fp4s_tok_close(tok);
	return 0;
}
