/* fuzz_encode.c: libFuzzer target for encoding text with the real Llama 3, Qwen3 and gpt-oss
 * (o200k) tokenizer.json files that scripts/fetch-testdata.sh puts in $FP4S_CACHE_DIR/npm (default
 * .cache/npm; scripts/fuzz.sh skips this target without them). Built and run by
 * `FP4S_FUZZ_TARGET=encode scripts/fuzz.sh SECONDS`.
 *
 * The first input byte picks the tokenizer (bits 0-1) and whether special tokens are parsed
 * (bit 2); the rest is the text. What must hold, as test_tok_props.h checks on random text:
 *   - encode never fails and gives ids inside the vocabulary;
 *   - decode(encode(x)) == x byte for byte (invalid UTF-8 and NUL included), and for Qwen3, whose
 *     normalizer is NFC, == NFC(x) when x is valid UTF-8 (nfc_ref.h: utf8proc's, but for U+11A7);
 *   - streaming decode gives valid UTF-8, and for valid x the same text as decode.
 * Anything else aborts and prints the text, the ids and the decoded bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "../nfc_ref.h"
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct {
	const char *name, *pkg;
	int nfc;
	struct fp4s_tokenizer *tok;
} toks[] = {{"llama3", "tokenizer-llama3", 0, NULL}, {"qwen3", "tokenizer-qwen3", 1, NULL},
            {"gpt-oss", "tokenizer-gptoss", 0, NULL}};
#define N_TOK (sizeof toks / sizeof *toks)

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fp4s_log_set_level(FP4S_LOG_ERROR);
	const char *cache = getenv("FP4S_CACHE_DIR");
	for (size_t i = 0; i < N_TOK; i++) {
		char p[1024];
		snprintf(p, sizeof p, "%s/npm/%s/package/models/tokenizer.json", cache && *cache ? cache : ".cache",
		         toks[i].pkg);
		struct fp4s_error err = {0};
		if (fp4s_tok_open(&toks[i].tok, p, &err)) {
			fprintf(stderr, "fuzz_encode: %s: %s (run scripts/fetch-testdata.sh)\n", toks[i].name, err.msg);
			abort();
		}
	}
	return 0;
}

static void fail(const char *what, const char *tok, const uint8_t *x, size_t n, const struct fp4s_tok_ids *ids,
                 const struct fp4s_tok_text *out)
{
	fprintf(stderr, "fuzz_encode: %s: %s\ntext (%zu):", tok, what, n);
	for (size_t i = 0; i < n; i++)
		fprintf(stderr, " %02x", x[i]);
	fprintf(stderr, "\nids (%zu):", ids->n);
	for (size_t i = 0; i < ids->n; i++)
		fprintf(stderr, " %d", ids->v[i]);
	fprintf(stderr, "\ndecoded (%zu):", out ? out->n : 0);
	for (size_t i = 0; out && i < out->n; i++)
		fprintf(stderr, " %02x", (unsigned char)out->s[i]);
	fprintf(stderr, "\n");
	abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	const size_t k = (data[0] & 3) % N_TOK;
	const unsigned flags = data[0] & 4 ? FP4S_TOK_PARSE_SPECIAL : 0;
	const uint8_t *x = data + 1;
	const size_t n = size - 1;
	const struct fp4s_tokenizer *tok = toks[k].tok;
	struct fp4s_tok_ids ids = {0};
	struct fp4s_tok_text out = {0}, st = {0};
	struct fp4s_error err = {0};
	if (fp4s_tok_encode(tok, (const char *)x, n, flags, &ids, &err))
		fail(err.msg, toks[k].name, x, n, &ids, NULL);
	for (size_t i = 0; i < ids.n; i++)
		if (ids.v[i] < 0 || ids.v[i] >= fp4s_tok_n_vocab(tok))
			fail("an id outside the vocabulary", toks[k].name, x, n, &ids, NULL);
	if (fp4s_tok_decode(tok, ids.v, ids.n, 0, &out, &err))
		fail(err.msg, toks[k].name, x, n, &ids, NULL);
	const int valid = fuzz_valid_utf8(x, n);
	if (toks[k].nfc) {
		if (valid && n < 4096) {
			char *z = malloc(n + 1);
			memcpy(z, x, n);
			z[n] = 0;
			/* NUL ends utf8proc's string: compare up to the first one */
			utf8proc_uint8_t *norm = memchr(x, 0, n) ? NULL : t_nfc_ref((const utf8proc_uint8_t *)z);
			if (norm && (strlen((char *)norm) != out.n || memcmp(norm, out.s, out.n)))
				fail("decode(encode(x)) != NFC(x)", toks[k].name, x, n, &ids, &out);
			free(norm);
			free(z);
		}
	} else if (out.n != n || (n && memcmp(out.s, x, n))) {
		fail("decode(encode(x)) != x", toks[k].name, x, n, &ids, &out);
	}
	struct fp4s_tok_stream s;
	fp4s_tok_stream_init(&s, tok, 0);
	for (size_t i = 0; i < ids.n; i++)
		if (fp4s_tok_stream_push(&s, ids.v[i], &st, &err))
			fail(err.msg, toks[k].name, x, n, &ids, &out);
	if (fp4s_tok_stream_flush(&s, &st))
		fail("stream flush failed", toks[k].name, x, n, &ids, &out);
	if (!fuzz_valid_utf8((const uint8_t *)st.s, st.n))
		fail("streamed text is not valid UTF-8", toks[k].name, x, n, &ids, &st);
	if (fuzz_valid_utf8((const uint8_t *)out.s, out.n) && (st.n != out.n || (out.n && memcmp(st.s, out.s, out.n))))
		fail("streamed text differs from decode", toks[k].name, x, n, &ids, &st);
	fp4s_tok_ids_free(&ids);
	fp4s_tok_text_free(&out);
	fp4s_tok_text_free(&st);
	return 0;
}
