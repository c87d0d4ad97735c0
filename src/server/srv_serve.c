/* srv_serve.c: `fp4serve serve`: options, start-up, SIGTERM drain.
 *
 * Every flag comes from one X-macro table (engineering.md §5.2) that generates the getopt_long
 * table, --help and the environment fallback FP4SERVE_<FLAG> (dashes as underscores, upper case:
 * --api-key -> FP4SERVE_API_KEY); a flag on the command line wins over its variable.
 *
 * Start-up order: listen first, so /health answers 503 while the model loads (llama.cpp's
 * semantics), then load (or generate the --demo model), then mark ready. Signals are blocked in
 * every thread and taken by the main thread with sigwait, so no handler runs inside civetweb or
 * the engine. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "model/cfg.h"
#include "model/mwrite.h"
#include "server/srv.h"
#include "util/log.h"

/* X(long name, short, argument, id, help); argument: 1 required, 0 none */
#define SERVE_OPTIONS(X) \
	X("model", 'm', 1, 'm', "DIR|FILE  model folder or llama2.c .bin (or the first positional argument)") \
	X("tokenizer", 0, 1, 256, "FILE     tokenizer (default: the model's)") \
	X("host", 0, 1, 257, "ADDR          bind address (default 127.0.0.1)") \
	X("port", 0, 1, 258, "N             port (default 8000)") \
	X("served-model-name", 0, 1, 259, "NAME  model id in the API (default: the model folder's name)") \
	X("alias", 'a', 1, 259, "NAME         same as --served-model-name") \
	X("max-model-len", 'c', 1, 260, "N   context length (default: the model's, at most 4096; demo 1024)") \
	X("ctx-size", 0, 1, 260, "N          same as --max-model-len") \
	X("max-num-seqs", 0, 1, 261, "N      sequences decoded together = KV slots (default 64)") \
	X("np", 0, 1, 261, "N                same as --max-num-seqs") \
	X("max-num-batched-tokens", 0, 1, 262, "N  tokens per forward pass (default 512)") \
	X("gpu-memory-utilization", 0, 1, 263, "F  GPU memory share for weights + KV (CUDA backend; ignored on CPU)") \
	X("kv-cache-dtype", 0, 1, 264, "T  KV-cache type: auto (BF16 on the GPU, FP32 on the CPU), fp32, bf16, fp8 (= fp8_e4m3: scale 1.0, saturating)") \
	X("api-key", 0, 1, 265, "KEY        require 'Authorization: Bearer KEY' (all but /health, /metrics)") \
	X("api-key-file", 0, 1, 266, "FILE  read the key from the file's first line") \
	X("chat-template", 0, 1, 267, "FILE|NAME  chat format: a Jinja file, or llama3, llama3.1, chatml, qwen3, harmony") \
	X("timeout", 0, 1, 268, "S          per-request time limit, arrival to last token (default 600)") \
	X("read-timeout", 0, 1, 269, "S     time to receive a request's headers and body (default 30)") \
	X("threads-http", 0, 1, 270, "N     HTTP worker threads = concurrent connections (default 4*max-num-seqs+16)") \
	X("log-format", 0, 1, 271, "text|json  log line format (default text)") \
	X("log-level", 0, 1, 272, "L       error, warn, info (default), debug") \
	X("disable-metrics", 0, 0, 273, "   no /metrics endpoint") \
	X("demo", 0, 0, 274, "              no model: generate and serve a tiny random-weight model") \
	X("demo-preset", 0, 1, 275, "NAME  preset for --demo (default tiny-llama3)") \
	X("backend", 0, 1, 276, "auto|cuda|cpu  compute backend (default: the engine's choice)") \
	X("drain-timeout", 0, 1, 277, "S    on SIGTERM, how long in-flight requests may finish (default 30)") \
	X("logprobs-mode", 0, 1, 278, "M    raw_logprobs (default: of the model's logits) or processed_logprobs (of the distribution sampled from)") \
	X("help", 'h', 0, 'h', "             this text")

static const struct option serve_long[] = {
#define X(name, sh, arg, id, help) {name, arg ? required_argument : no_argument, NULL, id},
	SERVE_OPTIONS(X)
#undef X
	{NULL, 0, NULL, 0}};

static void serve_usage(FILE *f)
{
	fprintf(f, "usage: fp4serve serve [-m] MODEL [options] | fp4serve serve --demo [options]\n\n"
	           "OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, /v1/models,\n"
	           "/tokenize, /detokenize, /health, /metrics, /version. Options (env FP4SERVE_<FLAG>):\n");
#define X(name, sh, arg, id, help) \
	if (sh) \
		fprintf(f, "  -%c, --%s %s\n", sh, name, help); \
	else \
		fprintf(f, "      --%s %s\n", name, help);
	SERVE_OPTIONS(X)
#undef X
}

static int num_arg(const char *flag, const char *v, double lo, double hi, double *out)
{
	char *end;
	errno = 0;
	double d = strtod(v, &end);
	if (errno || end == v || *end || !(d >= lo && d <= hi)) {
		fprintf(stderr, "fp4serve serve: --%s must be a number in [%g, %g], got '%s'\n", flag, lo, hi, v);
		return -1;
	}
	*out = d;
	return 0;
}

static char *g_key_owned; /* --api-key-file's key, freed at exit */

static int apply(struct srv_opts *o, int id, const char *name, const char *v, int *help)
{
	double d;
	switch (id) {
	case 'm': o->model = v; break;
	case 256: o->tokenizer = v; break;
	case 257: o->host = v; break;
	case 258: if (num_arg(name, v, 0, 65535, &d)) return -1; o->port = (int32_t)d; break;
	case 259: o->served_name = v; break;
	case 260: if (num_arg(name, v, 2, 1 << 24, &d)) return -1; o->max_model_len = (int32_t)d; break;
	case 261: if (num_arg(name, v, 1, 4096, &d)) return -1; o->max_num_seqs = (int32_t)d; break;
	case 262: if (num_arg(name, v, 1, 1 << 20, &d)) return -1; o->max_batch_tokens = (int32_t)d; break;
	case 263: if (num_arg(name, v, 0.01, 1, &d)) return -1; o->gpu_mem_util = d; break;
	case 264: o->kv_cache_dtype = v; break;
	case 265: o->api_key = v; break;
	case 266: {
		char *key, msg[512];
		if (srv_auth_load_key(v, &key, msg, sizeof msg)) {
			fprintf(stderr, "fp4serve serve: %s\n", msg);
			return -1;
		}
		free(g_key_owned);
		o->api_key = g_key_owned = key;
		break;
	}
	case 267: o->chat_template = v; break;
	case 268: if (num_arg(name, v, 0.001, 1e7, &d)) return -1; o->timeout_s = d; break;
	case 269: if (num_arg(name, v, 0.1, 3600, &d)) return -1; o->read_timeout_s = d; break;
	case 270: if (num_arg(name, v, 1, 8192, &d)) return -1; o->threads_http = (int32_t)d; break;
	case 271:
		if (strcmp(v, "text") && strcmp(v, "json")) {
			fprintf(stderr, "fp4serve serve: --log-format is text or json\n");
			return -1;
		}
		fp4s_log_set_json(!strcmp(v, "json"));
		break;
	case 272: {
		enum fp4s_log_level l;
		if (fp4s_log_parse_level(v, &l)) {
			fprintf(stderr, "fp4serve serve: --log-level is error, warn, info or debug\n");
			return -1;
		}
		fp4s_log_set_level(l);
		break;
	}
	case 273: o->disable_metrics = !v || strcmp(v, "0"); break;
	case 274: o->demo = !v || strcmp(v, "0"); break;
	case 275: o->demo_preset = v; break;
	case 276: o->backend = v; break;
	case 277: if (num_arg(name, v, 0, 3600, &d)) return -1; o->drain_s = d; break;
	case 278:
		if (strcmp(v, "raw_logprobs") && strcmp(v, "processed_logprobs")) {
			fprintf(stderr, "fp4serve serve: --logprobs-mode is raw_logprobs or processed_logprobs\n");
			return -1;
		}
		o->logprobs_processed = !strcmp(v, "processed_logprobs");
		break;
	case 'h': *help = 1; break;
	default: return -1;
	}
	return 0;
}

static int parse(int argc, char **argv, struct srv_opts *o)
{
	memset(o, 0, sizeof *o);
	o->host = "127.0.0.1", o->port = 8000, o->max_num_seqs = 64, o->timeout_s = 600;
	o->read_timeout_s = 30, o->drain_s = 30, o->demo_preset = "tiny-llama3", o->gpu_mem_util = 0.9;
	int help = 0;
	/* environment first, so the command line overrides it */
	{
#define X(name, sh, arg, id, hlp) \
	{ \
		char env[64] = "FP4SERVE_"; \
		size_t k = 9; \
		for (const char *p = name; *p && k + 1 < sizeof env; p++) \
			env[k++] = *p == '-' ? '_' : (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p); \
		env[k] = 0; \
		const char *ev = id != 'h' ? getenv(env) : NULL; \
		if (ev && *ev && apply(o, id, name, arg ? ev : (strcmp(ev, "0") ? NULL : "0"), &help)) \
			return 2; \
	}
		SERVE_OPTIONS(X)
#undef X
	}
	char shorts[64];
	size_t k = 0;
#define X(name, sh, arg, id, hlp) \
	if (sh && !strchr(shorts, sh) && k + 3 < sizeof shorts) { \
		shorts[k++] = (char)sh; \
		if (arg) \
			shorts[k++] = ':'; \
	} \
	shorts[k] = 0;
	shorts[0] = 0;
	SERVE_OPTIONS(X)
#undef X
	int c, li = -1;
	optind = 1;
	while ((c = getopt_long(argc, argv, shorts, serve_long, &li)) != -1) {
		if (c == '?') {
			serve_usage(stderr);
			return 2;
		}
		const char *name = li >= 0 ? serve_long[li].name : "option";
		if (apply(o, c, name, optarg, &help))
			return 2;
		li = -1;
	}
	if (help) {
		serve_usage(stdout);
		return 1;
	}
	if (optind < argc && !o->model)
		o->model = argv[optind++];
	if (optind < argc) {
		fprintf(stderr, "fp4serve serve: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (!o->model && !o->demo) {
		fprintf(stderr, "fp4serve serve: give a model (-m DIR) or --demo\n");
		serve_usage(stderr);
		return 2;
	}
	if (o->model && o->demo) {
		/* a model was given: serve it; --demo only fills in for a missing one */
		o->demo = 0;
	}
	if (!o->api_key) {
		const char *e = getenv("FP4SERVE_API_KEY");
		if (e && *e)
			o->api_key = e;
	}
	if (!o->threads_http)
		o->threads_http = 4 * o->max_num_seqs + 16 > 1024 ? 1024 : 4 * o->max_num_seqs + 16;
	return 0;
}

static void rm_tree(const char *dir)
{
	/* the demo folder holds only the files gen wrote, no subfolders */
	DIR *d = opendir(dir);
	struct dirent *de;
	char p[512];
	while (d && (de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
		unlink(p);
	}
	if (d)
		closedir(d);
	if (rmdir(dir))
		FP4S_WARN("could not remove the demo model folder %s", dir);
}

static int load(struct srv *s, char *demo_dir)
{
	struct fp4s_error err = {0};
	if (s->o.demo && !s->o.model) {
		const char *tmp = getenv("TMPDIR");
		snprintf(demo_dir, 256, "%s/fp4serve-demo-XXXXXX", tmp && *tmp ? tmp : "/tmp");
		if (!mkdtemp(demo_dir)) {
			FP4S_ERROR("cannot create a folder for the demo model: %s", strerror(errno));
			demo_dir[0] = 0;
			return -1;
		}
		struct fp4s_config cfg;
		char *cj = NULL;
		struct fp4s_write_opts wo = {.format = FP4S_QF_NVFP4, .seed = 1};
		if (fp4s_preset_config(s->o.demo_preset, &cj, &cfg, &err)) {
			FP4S_ERROR("--demo-preset: %s", err.msg);
			return -1;
		}
		free(cj);
		/* the FP4 format the preset publishes in: MXFP4 for gpt-oss, NVFP4 otherwise */
		if (fp4s_preset_default_format(&cfg) == FP4S_QF_MXFP4)
			wo.format = FP4S_QF_MXFP4;
		fp4s_config_free(&cfg);
		FP4S_INFO("--demo: generating a random-weight %s model in %s", s->o.demo_preset, demo_dir);
		if (fp4s_gen(s->o.demo_preset, demo_dir, &wo, &err)) {
			FP4S_ERROR("--demo: %s", err.msg);
			return -1;
		}
		s->o.model = demo_dir;
		if (!s->o.max_model_len)
			s->o.max_model_len = 1024;
	}
	struct fp4s_engine_opts eo = {.model = s->o.model, .tokenizer = s->o.tokenizer,
	                              .backend = s->o.backend, .max_seqs = s->o.max_num_seqs,
	                              .max_ctx = s->o.max_model_len,
	                              .max_batch_tokens = s->o.max_batch_tokens,
	                              .kv_cache_dtype = s->o.kv_cache_dtype};
	const double t0 = srv_now();
	if (fp4s_engine_open(&eo, &s->eng, &err)) {
		FP4S_ERROR("%s", err.msg);
		return -1;
	}
	s->tok = fp4s_engine_tokenizer(s->eng);
	if (s->o.chat_template) {
		FILE *f = fopen(s->o.chat_template, "rb");
		int rc;
		if (f) {
			char *t = calloc(1, 1 << 20);
			size_t n = t ? fread(t, 1, (1 << 20) - 1, f) : 0;
			(void)n;
			fclose(f);
			rc = t ? fp4s_tok_set_chat_template(s->tok, t, &err) : FP4S_ENOMEM;
			free(t);
		} else {
			rc = fp4s_tok_set_chat_format(s->tok, s->o.chat_template, &err);
		}
		if (rc) {
			FP4S_ERROR("--chat-template: %s", err.msg);
			return -1;
		}
	}
	s->max_ctx = fp4s_engine_max_ctx(s->eng);
	s->vocab = (int32_t)fp4s_engine_model(s->eng)->cfg.vocab;
	if (fp4s_tok_n_vocab(s->tok) < s->vocab)
		s->vocab = fp4s_tok_n_vocab(s->tok); /* padded rows have no text */
	FP4S_INFO("model loaded in %.2f s: context %d, %d KV slots, chat format %s", srv_now() - t0,
	          s->max_ctx, s->o.max_num_seqs, fp4s_chat_format_name(fp4s_tok_chat(s->tok)->format));
	return 0;
}

int cmd_serve(int argc, char **argv)
{
	struct srv *s = calloc(1, sizeof *s);
	if (!s)
		return 1;
	int rc = parse(argc, argv, &s->o);
	if (rc) {
		free(s);
		return rc == 1 ? 0 : rc;
	}
	if (s->o.served_name) {
		snprintf(s->model_name, sizeof s->model_name, "%s", s->o.served_name);
	} else if (s->o.model) {
		const char *m = s->o.model;
		size_t n = strlen(m);
		while (n > 1 && m[n - 1] == '/')
			n--;
		const char *b = m + n;
		while (b > m && b[-1] != '/')
			b--;
		snprintf(s->model_name, sizeof s->model_name, "%.*s", (int)(m + n - b), b);
	} else {
		snprintf(s->model_name, sizeof s->model_name, "fp4serve-demo-%s", s->o.demo_preset);
	}
	s->created = (int64_t)time(NULL);
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	srv_metrics_init(&s->m);
	/* every thread inherits this mask: only sigwait below sees SIGTERM/SIGINT */
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	char msg[512], demo_dir[256] = "";
	rc = 1;
	if (srv_http_start(s, msg, sizeof msg)) {
		FP4S_ERROR("%s", msg);
		goto out;
	}
	FP4S_INFO("listening on http://%s:%d (%d HTTP threads)%s", s->o.host, s->o.port,
	          s->o.threads_http, s->o.api_key ? ", API key required" : "");
	if (load(s, demo_dir) || srv_sched_start(s)) {
		srv_http_stop(s);
		goto out;
	}
	atomic_store(&s->ready, 1);
	FP4S_INFO("ready: model '%s'%s", s->model_name, s->o.demo ? " (random-weight demo: output is random text)" : "");
	int sig = 0;
	sigwait(&set, &sig);
	/* drain: refuse new work, let in-flight requests finish, then cancel what is left; each
	 * worker then ends its response properly (a final SSE event, [DONE]) */
	FP4S_INFO("signal %d: draining %d in-flight requests (at most %g s)", sig,
	          atomic_load(&s->in_flight), s->o.drain_s);
	atomic_store(&s->draining, 1);
	const double t_end = srv_now() + s->o.drain_s;
	while (atomic_load(&s->in_flight) > 0 && srv_now() < t_end)
		nanosleep(&(struct timespec){0, 20000000}, NULL);
	atomic_store(&s->abort_all, 1);
	const double t_hard = srv_now() + 10;
	while (atomic_load(&s->in_flight) > 0 && srv_now() < t_hard)
		nanosleep(&(struct timespec){0, 20000000}, NULL);
	srv_http_stop(s);
	srv_sched_stop(s);
	FP4S_INFO("stopped");
	rc = 0;
out:
	if (s->eng)
		fp4s_engine_close(s->eng);
	if (demo_dir[0])
		rm_tree(demo_dir);
	srv_metrics_free(&s->m);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	free(s);
	free(g_key_owned);
	g_key_owned = NULL;
	return rc;
}
