/* srv.h: the OpenAI-compatible HTTP server (`fp4serve serve`), engineering.md §5.
 *
 * Threads (§5.1): civetweb's worker threads each own one HTTP request. A worker parses and
 * validates the body (srv_api.c), tokenizes the prompt (the tokenizer is read-only and shared),
 * and hands a struct srv_job to the scheduler thread through srv->in (mutex + condvar). The
 * scheduler thread (srv_queue.c) is the only thread that touches the engine: it submits jobs
 * while the engine has room, steps it, and appends each event to its job's own queue (job->mu +
 * job->cv). The worker blocks on that queue and writes the JSON response or SSE chunks. A write
 * that fails means the client is gone: the worker sets job->cancel and the scheduler cancels the
 * job's sequences, which frees their KV slots.
 *
 * Job lifetime: the worker allocates a job and frees it; the scheduler holds it from srv_submit
 * until it sets job->done (all its sequences have ended), and never touches it afterwards. */
#ifndef FP4S_SRV_H
#define FP4S_SRV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

#define SRV_MAX_BODY (8u << 20) /* request bodies above this get 413 */
#define SRV_READ_MAX (16u << 10) /* largest single body read (srv_read_body) */
#define SRV_MAX_N 16            /* choices per request */
#define SRV_MAX_MESSAGES 4096   /* chat messages per request */

struct srv_opts {
	const char *model, *tokenizer, *backend;
	const char *host;
	int32_t port;
	const char *served_name;
	int32_t max_model_len, max_num_seqs, max_batch_tokens;
	double gpu_mem_util;
	const char *kv_cache_dtype;
	const char *api_key;       /* resolved from --api-key, --api-key-file or the env var */
	const char *chat_template; /* FILE or NAME */
	double timeout_s;          /* per request, from arrival to the last token */
	double read_timeout_s;     /* reading a request's headers and body; each network write */
	int32_t threads_http;
	int disable_metrics;
	int demo;                  /* the model is a random-weight demo (mwrite.h) */
	const char *demo_preset;
	double drain_s;            /* SIGTERM: how long in-flight requests may run before cancel */
	int logprobs_processed;    /* --logprobs-mode processed_logprobs (vLLM's flag): logprobs of the
	                            * distribution sampled from; else raw_logprobs, of the logits */
};

/* One event of one sequence, copied out of the engine (its text is only valid until the next
 * step). */
struct srv_ev {
	struct srv_ev *next;
	int32_t index; /* choice */
	int32_t token; /* -1: finish-only */
	enum fp4s_finish finish;
	int32_t n_prompt, n_generated;
	struct fp4s_samp_result *lp; /* when the request asked for logprobs */
	size_t len;
	char text[]; /* len bytes + NUL */
};

struct srv_job {
	/* set by the worker before srv_submit, read-only afterwards */
	struct fp4s_request req; /* req.prompt -> prompt; req.stop -> stop_buf strings */
	int32_t *prompt;
	int32_t n_prompt;
	char *stop_buf[FP4S_ENGINE_MAX_STOP_STRINGS];
	int32_t n;              /* choices, each its own sequence */
	double t_arrival;       /* monotonic seconds */
	/* scheduler-only */
	struct srv_job *next;   /* in srv->in / the scheduler's lists */
	int64_t ids[SRV_MAX_N];
	int32_t live;           /* sequences submitted and not yet finished */
	double t_last[SRV_MAX_N], t_first[SRV_MAX_N];
	double t_submit;        /* entered the engine */
	int cancel_sent;
	/* shared, under mu */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct srv_ev *head, *tail;
	int done;               /* the scheduler has let go of the job */
	int err_status;         /* submit failed: HTTP status and message */
	char err_msg[512];
	atomic_int cancel;      /* worker -> scheduler: client gone, timeout or drain */
};

/* Prometheus histogram with fixed upper bounds (vLLM's buckets). */
struct srv_hist {
	const double *bounds;
	int32_t n_bounds;
	uint64_t counts[32]; /* per bound, not cumulative; [n_bounds] = +Inf */
	double sum;
	uint64_t count;
};

struct srv_metrics {
	pthread_mutex_t mu;
	int64_t running, waiting, kv_used, kv_total;
	int64_t preemptions, ahead_taken, ahead_dropped; /* the engine's counts (fp4s_engine_lookahead) */
	uint64_t prompt_tokens, gen_tokens;
	uint64_t finished[4]; /* by enum fp4s_finish: stop, length, abort */
	uint64_t http_errors[6]; /* 400 401 404 408/413 5xx other */
	struct srv_hist ttft, itl, e2e, queue, prefill, decode;
};

struct srv {
	struct srv_opts o;
	struct fp4s_engine *eng;
	struct fp4s_tokenizer *tok; /* read-only after load; shared by workers */
	int32_t max_ctx, vocab;
	char model_name[256];
	int64_t created;
	atomic_int ready;     /* model loaded: requests are served */
	atomic_int draining;  /* SIGTERM: new requests get 503 */
	atomic_int abort_all; /* drain time is over: workers cancel */
	atomic_int in_flight; /* generation requests inside a worker */
	/* worker -> scheduler hand-off */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct srv_job *in_head, *in_tail;
	int poke;             /* a job was cancelled: the scheduler should look */
	int stop;
	pthread_t sched;
	int sched_started;
	struct srv_metrics m;
	struct mg_context *mg;
};

double srv_now(void);

/* srv_queue.c: the scheduler thread and the job queues */
int srv_sched_start(struct srv *s);
void srv_sched_stop(struct srv *s);
struct srv_job *srv_job_new(void);
void srv_job_free(struct srv_job *j);
void srv_submit(struct srv *s, struct srv_job *j);
void srv_job_cancel(struct srv *s, struct srv_job *j);
/* Waits for the job's next event until `deadline` (monotonic s). Returns the event (caller
 * frees it), or NULL with *done set when the job is over and its queue empty, or NULL on
 * timeout. */
struct srv_ev *srv_job_wait(struct srv_job *j, double deadline, int *done);

/* srv_metrics.c */
void srv_metrics_init(struct srv_metrics *m);
void srv_metrics_free(struct srv_metrics *m);
void srv_hist_observe(struct srv_hist *h, double v); /* caller holds m->mu */
char *srv_metrics_render(struct srv *s, size_t *len);  /* malloc'd Prometheus text */
void srv_metrics_http_error(struct srv_metrics *m, int status);

/* srv_auth.c */
int srv_auth_ok(const char *expected, const char *header); /* constant time in the key */
int srv_auth_load_key(const char *file, char **key, char *msg, size_t msg_len);

/* srv_harmony.c: gpt-oss output channels -> reasoning_content / content, streaming-safe. */
struct srv_harmony {
	int state;       /* SRV_HARMONY_* */
	int channel;     /* 0 final/commentary -> content, 1 analysis -> reasoning */
	char hdr[96];    /* header text between <|start|>/<|channel|> and <|message|> */
	size_t n_hdr;
	char part[16];   /* a possible marker cut at the end of the last feed */
	size_t n_part;
};
void srv_harmony_init(struct srv_harmony *h);
/* Feeds generated text (special tokens included); appends what belongs to each channel. Text
 * that might be the start of a marker is held back until the next call or final. */
int srv_harmony_feed(struct srv_harmony *h, const char *text, size_t len, int final,
                     struct fp4s_tok_text *content, struct fp4s_tok_text *reasoning);

/* srv_http.c: civetweb glue */
struct mg_connection;
int srv_http_start(struct srv *s, char *msg, size_t msg_len);
void srv_http_stop(struct srv *s);
void srv_http_drop(struct mg_connection *c); /* shut the socket after an error reply */
/* mg_response_header_start, plus a Date header of our own: civetweb 1.15 formats its Date with
 * gmtime(), whose one static result worker threads overwrite under each other (ThreadSanitizer
 * reports the race), and adds none when the reply has one. */
void srv_response_start(struct mg_connection *c, int status);

/* srv_api.c: the endpoints (struct mg_connection is civetweb's) */
/* What a parsed completion request asks for beyond the job itself. */
struct srv_api_req {
	int chat, stream, include_usage, continuous_usage;
	int logprobs;     /* chat: bool; completions: the int (0..20) */
	int top_logprobs; /* chat */
	int harmony;      /* split analysis/final channels */
	int32_t max_tokens; /* 0: not given */
	char status_msg[1100];
	int status;
};


struct mg_connection;
int srv_api_completions(struct mg_connection *c, struct srv *s, int chat);
/* Parses a completions body (a->chat: chat/completions) into j: its prompt, sampling and stops.
 * 0, or -1 with a->status (4xx, or 503 out of memory) and a->status_msg; j is srv_job_free'd by
 * the caller either way. No connection is touched: tests/fuzz/fuzz_request.c drives it. */
int srv_api_parse(struct srv *s, struct srv_api_req *a, const char *body, size_t len, struct srv_job *j);
/* The /tokenize (detok 0) or /detokenize (1) reply for a body, or NULL with a->status/status_msg. */
struct json_t *srv_api_tokenize_json(struct srv *s, struct srv_api_req *a, const char *body, size_t len, int detok);
int srv_api_tokenize(struct mg_connection *c, struct srv *s, int detok);
int srv_api_models(struct mg_connection *c, struct srv *s);
void srv_send_json(struct mg_connection *c, int status, const char *body, size_t len);
void srv_send_error(struct mg_connection *c, struct srv *s, int status, const char *type,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Reads the whole body (at most SRV_MAX_BODY, within the read timeout). Returns the malloc'd
 * body or NULL after sending the error response. */
char *srv_read_body(struct mg_connection *c, struct srv *s, size_t *len);

/* A JSON string from bytes that may be invalid UTF-8 (U+FFFD for bad bytes); json_t is jansson's. */
struct json_t;
struct json_t *srv_jstr(const char *p, size_t n);

/* srv_sse.c: runs a parsed job and writes the JSON response or the SSE stream (§5.5). */
void srv_run_job(struct mg_connection *c, struct srv *s, struct srv_api_req *a, struct srv_job *j);

/* srv_serve.c: `fp4serve serve` */
int srv_serve_main(int argc, char **argv);

#endif
