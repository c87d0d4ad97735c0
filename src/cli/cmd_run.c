/* cmd_run.c: `fp4serve run` (one generation), `chat` (interactive, the model's chat format) and
 * `perplexity` (quantization quality). Generated text goes to stdout; logs and timings to
 * stderr. All three drive the engine API in-process. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/engine.h"
#include "util/log.h"

struct gen_opts {
	struct fp4s_engine_opts eng;
	struct fp4s_request req;
	const char *prompt, *prompt_file, *system;
	int32_t n_stop;
	const char *stop[FP4S_ENGINE_MAX_STOP_STRINGS];
	int32_t ctx;     /* perplexity chunk */
	int verbose;
};

enum {
	OPT_TOKENIZER = 256, OPT_TEMP, OPT_TOP_P, OPT_TOP_K, OPT_MIN_P, OPT_SEED, OPT_REP, OPT_PRES,
	OPT_FREQ, OPT_BACKEND, OPT_CTX, OPT_STOP, OPT_SYSTEM, OPT_IGNORE_EOS, OPT_BATCH, OPT_KV,
};

static const struct option gen_options[] = {
	{"model", required_argument, 0, 'm'},        {"tokenizer", required_argument, 0, OPT_TOKENIZER},
	{"prompt", required_argument, 0, 'p'},       {"file", required_argument, 0, 'f'},
	{"max-tokens", required_argument, 0, 'n'},   {"temperature", required_argument, 0, OPT_TEMP},
	{"top-p", required_argument, 0, OPT_TOP_P},  {"top-k", required_argument, 0, OPT_TOP_K},
	{"min-p", required_argument, 0, OPT_MIN_P},  {"seed", required_argument, 0, OPT_SEED},
	{"repetition-penalty", required_argument, 0, OPT_REP},
	{"presence-penalty", required_argument, 0, OPT_PRES},
	{"frequency-penalty", required_argument, 0, OPT_FREQ},
	{"backend", required_argument, 0, OPT_BACKEND}, {"ctx", required_argument, 0, OPT_CTX},
	{"stop", required_argument, 0, OPT_STOP},    {"system", required_argument, 0, OPT_SYSTEM},
	{"ignore-eos", no_argument, 0, OPT_IGNORE_EOS},
	{"max-num-batched-tokens", required_argument, 0, OPT_BATCH},
	{"kv-cache-dtype", required_argument, 0, OPT_KV},
	{"verbose", no_argument, 0, 'v'},            {"help", no_argument, 0, 'h'},
	{0, 0, 0, 0},
};

static const char *const gen_help =
	"  -m, --model PATH          Hugging Face folder or llama2.c .bin (required)\n"
	"      --tokenizer FILE      tokenizer.json / tokenizer.bin (default: the model folder)\n"
	"  -p, --prompt TEXT         prompt (run); -f, --file FILE reads it (run) or the text (perplexity)\n"
	"  -n, --max-tokens N        tokens to generate (default 256)\n"
	"      --temperature T       0 = greedy (default 1.0); --top-p P, --top-k K, --min-p P\n"
	"      --seed S              reproducible sampling\n"
	"      --repetition-penalty R, --presence-penalty P, --frequency-penalty F\n"
	"      --stop TEXT           stop string (repeatable, up to 8); --ignore-eos\n"
	"      --system TEXT         system message (chat)\n"
	"      --ctx N               context length (default: the model's, at most 4096); perplexity chunk\n"
	"      --backend auto|cuda|cpu  (default auto: the GPU when there is one)\n"
	"      --kv-cache-dtype auto|bf16|fp32|fp8  (default auto: BF16 on the GPU, FP32 on the CPU;\n"
	"                            fp8 = fp8_e4m3: E4M3, scale 1.0, saturating at +-448)\n"
	"  -v, --verbose             log timings per stage\n";

static int num(const char *s, double lo, double hi, const char *name, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || *end || end == s || !(v >= lo && v <= hi)) {
		fprintf(stderr, "fp4serve: --%s must be a number in [%g, %g], got '%s'\n", name, lo, hi, s);
		return -1;
	}
	*out = v;
	return 0;
}

/* Parses the shared generation options; returns 0, 1 for --help, 2 on a usage error. */
static int parse_gen(int argc, char **argv, const char *usage, struct gen_opts *g)
{
	int c;
	double v;
	memset(g, 0, sizeof *g);
	fp4s_request_defaults(&g->req);
	g->req.sampling.max_tokens = 256;
	optind = 1;
	while ((c = getopt_long(argc, argv, "m:p:f:n:vh", gen_options, NULL)) != -1) {
		switch (c) {
		case 'm': g->eng.model = optarg; break;
		case OPT_TOKENIZER: g->eng.tokenizer = optarg; break;
		case 'p': g->prompt = optarg; break;
		case 'f': g->prompt_file = optarg; break;
		case 'n':
			if (num(optarg, 1, 1e7, "max-tokens", &v)) return 2;
			g->req.sampling.max_tokens = (int32_t)v;
			break;
		case OPT_TEMP:
			if (num(optarg, 0, 100, "temperature", &v)) return 2;
			g->req.sampling.temperature = (float)v;
			break;
		case OPT_TOP_P:
			if (num(optarg, 1e-9, 1, "top-p", &v)) return 2;
			g->req.sampling.top_p = (float)v;
			break;
		case OPT_TOP_K:
			if (num(optarg, -1, 1e9, "top-k", &v)) return 2;
			g->req.sampling.top_k = (int32_t)v;
			break;
		case OPT_MIN_P:
			if (num(optarg, 0, 1, "min-p", &v)) return 2;
			g->req.sampling.min_p = (float)v;
			break;
		case OPT_SEED:
			if (num(optarg, 0, 1.8e19, "seed", &v)) return 2;
			g->req.sampling.seed = (uint64_t)v;
			g->req.sampling.has_seed = true;
			break;
		case OPT_REP:
			if (num(optarg, 1e-6, 100, "repetition-penalty", &v)) return 2;
			g->req.sampling.repetition_penalty = (float)v;
			break;
		case OPT_PRES:
			if (num(optarg, -2, 2, "presence-penalty", &v)) return 2;
			g->req.sampling.presence_penalty = (float)v;
			break;
		case OPT_FREQ:
			if (num(optarg, -2, 2, "frequency-penalty", &v)) return 2;
			g->req.sampling.frequency_penalty = (float)v;
			break;
		case OPT_BACKEND: g->eng.backend = optarg; break;
		case OPT_KV: g->eng.kv_cache_dtype = optarg; break;
		case OPT_CTX:
			if (num(optarg, 2, 1 << 20, "ctx", &v)) return 2;
			g->ctx = g->eng.max_ctx = (int32_t)v;
			break;
		case OPT_BATCH:
			if (num(optarg, 1, 1 << 20, "max-num-batched-tokens", &v)) return 2;
			g->eng.max_batch_tokens = (int32_t)v;
			break;
		case OPT_STOP:
			if (g->n_stop == FP4S_ENGINE_MAX_STOP_STRINGS) {
				fprintf(stderr, "fp4serve: at most %d --stop strings\n", FP4S_ENGINE_MAX_STOP_STRINGS);
				return 2;
			}
			g->stop[g->n_stop++] = optarg;
			break;
		case OPT_SYSTEM: g->system = optarg; break;
		case OPT_IGNORE_EOS: g->req.sampling.ignore_eos = true; break;
		case 'v': g->verbose = 1; break;
		case 'h': printf("%s\n%s", usage, gen_help); return 1;
		default: fprintf(stderr, "%s\n", usage); return 2;
		}
	}
	if (!g->eng.model) {
		fprintf(stderr, "fp4serve: -m/--model is required\n%s\n", usage);
		return 2;
	}
	g->req.n_stop = g->n_stop;
	for (int32_t i = 0; i < g->n_stop; i++)
		g->req.stop[i] = g->stop[i];
	return 0;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap + 1);
	size_t r;
	while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
		n += r;
		if (n == cap) {
			char *nb = cap < ((size_t)1 << 30) ? realloc(buf, 2 * cap + 1) : NULL;
			if (!nb) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = nb, cap *= 2;
		}
	}
	fclose(f);
	if (buf)
		buf[n] = 0;
	*len = n;
	return buf;
}

/* Submits one request and streams its text to stdout (and into collect when given); returns 0
 * or an exit code. */
static int generate(struct fp4s_engine *e, struct fp4s_request *req, int verbose,
                    struct fp4s_tok_text *collect)
{
	struct fp4s_error err = {0};
	int64_t id;
	if (fp4s_engine_submit(e, req, &id, &err)) {
		fprintf(stderr, "fp4serve: %s\n", err.msg);
		return 1;
	}
	double t0 = now_s(), t_first = 0;
	int32_t n_gen = 0;
	for (int done = 0; !done;) {
		const struct fp4s_event *ev;
		int n = fp4s_engine_step(e, &ev, &err);
		if (n < 0) {
			fprintf(stderr, "\nfp4serve: %s\n", err.msg);
			return 1;
		}
		for (int i = 0; i < n; i++) {
			if (ev[i].id != id)
				continue;
			if (ev[i].token >= 0 && !t_first)
				t_first = now_s();
			fwrite(ev[i].text, 1, ev[i].text_len, stdout);
			fflush(stdout);
			if (collect && fp4s_tok_text_append(collect, ev[i].text, ev[i].text_len)) {
				fprintf(stderr, "\nfp4serve: out of memory\n");
				return 1;
			}
			n_gen = ev[i].n_generated;
			done |= ev[i].finish != FP4S_FINISH_NONE;
		}
	}
	double t1 = now_s();
	if (verbose || isatty(2))
		fprintf(stderr, "\n[prompt %d tokens: %.1f tok/s; generated %d tokens: %.1f tok/s]\n",
		        req->n_prompt, req->n_prompt / (t_first - t0 > 0 ? t_first - t0 : 1e-9), n_gen,
		        n_gen > 1 ? (n_gen - 1) / (t1 - t_first) : 0.0);
	return 0;
}

static int open_engine(struct gen_opts *g, struct fp4s_engine **e)
{
	struct fp4s_error err = {0};
	double t0 = now_s();
	if (fp4s_engine_open(&g->eng, e, &err)) {
		fprintf(stderr, "fp4serve: %s\n", err.msg);
		return 1;
	}
	if (g->verbose)
		FP4S_INFO("model loaded in %.2f s", now_s() - t0);
	return 0;
}

int cmd_run(int argc, char **argv)
{
	static const char usage[] = "usage: fp4serve run -m PATH [-p TEXT | -f FILE] [-n N] [--temperature T] [options]";
	struct gen_opts g;
	int rc = parse_gen(argc, argv, usage, &g);
	if (rc)
		return rc == 1 ? 0 : rc;
	struct fp4s_engine *e;
	if ((rc = open_engine(&g, &e)))
		return rc;
	struct fp4s_error err = {0};
	size_t len = 0;
	char *text = NULL;
	if (g.prompt_file && !(text = read_file(g.prompt_file, &len))) {
		fprintf(stderr, "fp4serve: cannot read %s: %s\n", g.prompt_file, strerror(errno));
		fp4s_engine_close(e);
		return 1;
	}
	const char *p = text ? text : g.prompt ? g.prompt : "";
	struct fp4s_tok_ids ids = {0};
	struct fp4s_tokenizer *tok = fp4s_engine_tokenizer(e);
	if (fp4s_tok_encode(tok, p, strlen(p), FP4S_TOK_ADD_SPECIAL, &ids, &err)) {
		fprintf(stderr, "fp4serve: %s\n", err.msg);
		rc = 1;
	} else {
		int32_t bos = fp4s_tok_bos(tok);
		/* an empty prompt starts from BOS, as llama2.c does */
		int32_t *prompt = ids.n ? ids.v : &bos;
		if (!ids.n && bos < 0) {
			fprintf(stderr, "fp4serve: empty prompt and the tokenizer has no BOS token\n");
			rc = 2;
		} else {
			g.req.prompt = prompt;
			g.req.n_prompt = ids.n ? (int32_t)ids.n : 1;
			rc = generate(e, &g.req, g.verbose, NULL);
			printf("\n");
		}
	}
	fp4s_tok_ids_free(&ids);
	free(text);
	fp4s_engine_close(e);
	return rc;
}

int cmd_chat(int argc, char **argv)
{
	static const char usage[] = "usage: fp4serve chat -m DIR [--system TEXT] [options]";
	struct gen_opts g;
	int rc = parse_gen(argc, argv, usage, &g);
	if (rc)
		return rc == 1 ? 0 : rc;
	struct fp4s_engine *e;
	if ((rc = open_engine(&g, &e)))
		return rc;
	struct fp4s_tokenizer *tok = fp4s_engine_tokenizer(e);
	const struct fp4s_chat_template *tmpl = fp4s_tok_chat(tok);
	struct fp4s_chat_msg msgs[256];
	char *owned[256] = {0};
	size_t nm = 0;
	if (g.system)
		msgs[nm++] = (struct fp4s_chat_msg){.role = "system", .content = g.system};
	char line[8192];
	fprintf(stderr, "chat with %s (empty line or Ctrl-D ends)\n", g.eng.model);
	while (nm + 2 < 256) {
		fprintf(stderr, "> ");
		if (!fgets(line, sizeof line, stdin) || line[0] == '\n')
			break;
		line[strcspn(line, "\n")] = 0;
		owned[nm] = strdup(line);
		msgs[nm] = (struct fp4s_chat_msg){.role = "user", .content = owned[nm]};
		nm++;
		struct fp4s_chat_opts co = {.add_generation_prompt = 1, .enable_thinking = 1};
		struct fp4s_tok_text prompt = {0};
		struct fp4s_tok_ids ids = {0};
		struct fp4s_error err = {0};
		if (!tmpl || fp4s_chat_apply(tmpl, msgs, nm, &co, &prompt, &err) ||
		    fp4s_tok_encode(tok, prompt.s, prompt.n, FP4S_TOK_PARSE_SPECIAL, &ids, &err)) {
			fprintf(stderr, "fp4serve: %s\n", tmpl ? err.msg : "this model has no chat format");
			fp4s_tok_text_free(&prompt);
			rc = 1;
			break;
		}
		/* the reply stays in the conversation */
		g.req.prompt = ids.v;
		g.req.n_prompt = (int32_t)ids.n;
		struct fp4s_tok_text reply = {0};
		rc = generate(e, &g.req, g.verbose, &reply);
		printf("\n");
		owned[nm] = reply.s ? reply.s : strdup("");
		msgs[nm] = (struct fp4s_chat_msg){.role = "assistant", .content = owned[nm]};
		nm++;
		fp4s_tok_text_free(&prompt);
		fp4s_tok_ids_free(&ids);
	}
	for (size_t i = 0; i < nm; i++)
		free(owned[i]);
	fp4s_engine_close(e);
	return rc;
}

int cmd_perplexity(int argc, char **argv)
{
	static const char usage[] = "usage: fp4serve perplexity -m PATH -f FILE [--ctx N]";
	struct gen_opts g;
	int rc = parse_gen(argc, argv, usage, &g);
	if (rc)
		return rc == 1 ? 0 : rc;
	if (!g.prompt_file && optind < argc)
		g.prompt_file = argv[optind];
	if (!g.prompt_file) {
		fprintf(stderr, "fp4serve: perplexity needs a text file (-f FILE)\n%s\n", usage);
		return 2;
	}
	size_t len;
	char *text = read_file(g.prompt_file, &len);
	if (!text) {
		fprintf(stderr, "fp4serve: cannot read %s: %s\n", g.prompt_file, strerror(errno));
		return 1;
	}
	if (!g.eng.max_batch_tokens)
		g.eng.max_batch_tokens = g.ctx > 0 ? g.ctx : 512;
	g.eng.max_seqs = 1;
	struct fp4s_engine *e;
	if ((rc = open_engine(&g, &e))) {
		free(text);
		return rc;
	}
	struct fp4s_error err = {0};
	struct fp4s_tok_ids ids = {0};
	double nll = 0, nll2 = 0, t0 = now_s();
	int64_t n = 0;
	const int32_t ctx = g.ctx > 0 ? g.ctx : fp4s_engine_max_ctx(e);
	if (fp4s_tok_encode(fp4s_engine_tokenizer(e), text, len, FP4S_TOK_ADD_SPECIAL, &ids, &err) ||
	    fp4s_engine_score(e, ids.v, (int64_t)ids.n, ctx, &nll, &nll2, &n, &err)) {
		fprintf(stderr, "fp4serve: %s\n", err.msg);
		rc = 1;
	} else if (n == 0) {
		fprintf(stderr, "fp4serve: the text has fewer than 2 tokens\n");
		rc = 1;
	} else {
		const double mean = nll / (double)n, var = nll2 / (double)n - mean * mean;
		const double ppl = exp(mean), se = ppl * sqrt(var > 0 ? var / (double)n : 0);
		printf("perplexity: %.4f +/- %.4f\n", ppl, se);
		fprintf(stderr, "%lld tokens scored in chunks of %d, %.1f tok/s\n", (long long)n, ctx,
		        (double)n / (now_s() - t0));
	}
	fp4s_tok_ids_free(&ids);
	free(text);
	fp4s_engine_close(e);
	return rc;
}
