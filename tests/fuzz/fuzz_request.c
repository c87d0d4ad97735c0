/* fuzz_request.c: libFuzzer target for what a client sends the server: a completions or chat
 * completions body (srv_api_parse: JSON, every sampling field, stops, logit_bias, messages
 * rendered by the chat formats and tokenized), a /tokenize or /detokenize body, and model text
 * fed to the harmony channel parser.
 * Built and run by `FP4S_FUZZ_TARGET=request scripts/fuzz.sh SECONDS`.
 *
 * The first input byte picks the case: bit 0 chat or text completions, bits 1-2 the tokenizer
 * (generated tiny-llama3, tiny-qwen3, tiny-gpt-oss: Llama 3, ChatML/Qwen3 and harmony chat
 * formats), bit 3 the harmony parser, bit 4 /tokenize (bit 0: /detokenize) instead of the
 * completions parser. The rest is the body.
 *
 * Beyond "no crash, no leak, no UB", an accepted request must be one the engine can run: a prompt
 * of 1 to max_ctx-1 ids inside the vocabulary, max_tokens that fit the context, stops with no NUL;
 * a refused one must carry a 4xx (or 503) and a message. A /tokenize reply must serialize (its
 * strings valid UTF-8). Anything else aborts. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "model/mwrite.h"
#include "server/srv.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define N_TOK 3
static const char *const presets[N_TOK] = {"tiny-llama3", "tiny-qwen3", "tiny-gpt-oss"};
static struct srv servers[N_TOK];

static void die(const char *what, const char *msg)
{
	fprintf(stderr, "fuzz_request: %s: %s\n", what, msg);
	abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fp4s_log_set_level(FP4S_LOG_ERROR);
	const char *tmp = getenv("TMPDIR");
	for (int i = 0; i < N_TOK; i++) {
		char dir[256];
		snprintf(dir, sizeof dir, "%s/fp4s-fuzz-request-XXXXXX", tmp && *tmp ? tmp : "/tmp");
		if (!mkdtemp(dir))
			die("mkdtemp", dir);
		/* gpt-oss publishes its experts in MXFP4 only */
		struct fp4s_write_opts wo = {.format = strstr(presets[i], "gpt-oss") ? FP4S_QF_MXFP4 : FP4S_QF_NVFP4,
		                             .seed = 1};
		struct fp4s_error err = {0};
		if (fp4s_gen(presets[i], dir, &wo, &err))
			die(presets[i], err.msg);
		struct srv *s = &servers[i];
		if (fp4s_tok_open(&s->tok, dir, &err))
			die(presets[i], err.msg);
		/* the generated model folder is only needed for its tokenizer files */
		char cmd[400];
		snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
		if (system(cmd) != 0)
			fprintf(stderr, "fuzz_request: could not remove %s\n", dir);
		s->vocab = fp4s_tok_n_vocab(s->tok);
		s->max_ctx = 256; /* small, so that the context checks are reached */
		s->o.max_num_seqs = 4;
		snprintf(s->model_name, sizeof s->model_name, "%s", presets[i]);
	}
	return 0;
}

static void check_accepted(const struct srv *s, const struct srv_job *j)
{
	if (j->n_prompt < 1 || j->n_prompt >= s->max_ctx || !j->prompt)
		die("accepted", "prompt length outside [1, max_ctx)");
	for (int32_t i = 0; i < j->n_prompt; i++)
		if (j->prompt[i] < 0 || j->prompt[i] >= s->vocab)
			die("accepted", "prompt id outside the vocabulary");
	const struct fp4s_sampling *sp = &j->req.sampling;
	if (sp->max_tokens < 1 || (int64_t)j->n_prompt + sp->max_tokens > s->max_ctx)
		die("accepted", "max_tokens does not fit the context");
	if (j->n < 1 || j->n > 2 * s->o.max_num_seqs)
		die("accepted", "n outside [1, 2 x max_num_seqs]");
	if (j->req.n_stop < 0 || j->req.n_stop > FP4S_ENGINE_MAX_STOP_STRINGS)
		die("accepted", "stop count");
	for (int i = 0; i < j->req.n_stop; i++) {
		const size_t l = strlen(j->req.stop[i]);
		if (l < 1 || l > FP4S_ENGINE_MAX_STOP_LEN)
			die("accepted", "stop length");
	}
	if (sp->n_logit_bias < 0 || sp->n_logit_bias > FP4S_SAMP_MAX_LOGIT_BIAS)
		die("accepted", "logit_bias count");
	for (int i = 0; i < sp->n_logit_bias; i++)
		if (sp->logit_bias[i].token < 0 || sp->logit_bias[i].token >= s->vocab)
			die("accepted", "logit_bias id outside the vocabulary");
}

static void run_request(struct srv *s, int chat, const char *body, size_t len)
{
	struct srv_api_req a = {.chat = chat};
	struct srv_job *j = srv_job_new();
	if (!j)
		return;
	if (srv_api_parse(s, &a, body, len, j) == 0) {
		check_accepted(s, j);
	} else if (!((a.status >= 400 && a.status < 500) || a.status == 503) || !a.status_msg[0]) {
		die("refused", "no 4xx/503 status or no message");
	}
	srv_job_free(j);
}

static void run_tokenize(struct srv *s, int detok, const char *body, size_t len)
{
	struct srv_api_req a = {0};
	json_t *r = srv_api_tokenize_json(s, &a, body, len, detok);
	if (!r) {
		if (!((a.status >= 400 && a.status < 500) || a.status == 503) || !a.status_msg[0])
			die("tokenize refused", "no 4xx/503 status or no message");
		return;
	}
	char *out = json_dumps(r, JSON_COMPACT);
	if (!out)
		die("tokenize", "the reply does not serialize");
	free(out);
	json_decref(r);
}

/* Cuts the text at points taken from its own bytes: a marker split across feeds must parse as
 * one fed whole, so both outputs are compared. */
static void run_harmony(const char *text, size_t len)
{
	struct fp4s_tok_text whole[2] = {{0}}, cut[2] = {{0}};
	struct srv_harmony h;
	srv_harmony_init(&h);
	if (srv_harmony_feed(&h, text, len, 1, &whole[0], &whole[1]))
		goto out;
	srv_harmony_init(&h);
	size_t at = 0;
	while (at < len) {
		size_t step = 1 + (unsigned char)text[at] % 7;
		if (step > len - at)
			step = len - at;
		if (srv_harmony_feed(&h, text + at, step, 0, &cut[0], &cut[1]))
			goto out;
		at += step;
	}
	if (srv_harmony_feed(&h, "", 0, 1, &cut[0], &cut[1]))
		goto out;
	for (int c = 0; c < 2; c++)
		if (whole[c].n != cut[c].n || (whole[c].n && memcmp(whole[c].s, cut[c].s, whole[c].n))) {
			fprintf(stderr, "%s whole: [%.*s]\n%s in pieces: [%.*s]\n", c ? "reasoning" : "content",
			        (int)whole[c].n, whole[c].s ? whole[c].s : "", c ? "reasoning" : "content",
			        (int)cut[c].n, cut[c].s ? cut[c].s : "");
			die("harmony", "text fed in pieces parses differently from the whole");
		}
out:
	for (int c = 0; c < 2; c++)
		fp4s_tok_text_free(&whole[c]), fp4s_tok_text_free(&cut[c]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	const unsigned sel = data[0];
	const char *body = (const char *)data + 1;
	if (sel & 8)
		run_harmony(body, size - 1);
	else if (sel & 16)
		run_tokenize(&servers[((sel >> 1) & 3) % N_TOK], sel & 1, body, size - 1);
	else
		run_request(&servers[((sel >> 1) & 3) % N_TOK], sel & 1, body, size - 1);
	return 0;
}
