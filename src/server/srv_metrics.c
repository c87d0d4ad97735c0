/* srv_metrics.c: GET /metrics in Prometheus text format 0.0.4, with vLLM's metric set and
 * meanings under our prefix (engineering.md §5.8). The scheduler thread updates counters and
 * histograms under m->mu; the /metrics handler renders a consistent copy. */
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/srv.h"

/* vLLM's bucket bounds (vllm/v1/metrics/loggers.py), in seconds */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                     0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
                                     640.0, 2560.0};
static const double itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
static const double e2e_bounds[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0,
                                    7680.0};

#define NB(a) ((int32_t)(sizeof a / sizeof a[0]))
_Static_assert(sizeof ttft_bounds / sizeof ttft_bounds[0] < 32, "histogram counts[] too small");
_Static_assert(sizeof e2e_bounds / sizeof e2e_bounds[0] < 32, "histogram counts[] too small");

void srv_metrics_init(struct srv_metrics *m)
{
	memset(m, 0, sizeof *m);
	pthread_mutex_init(&m->mu, NULL);
	m->ttft.bounds = ttft_bounds, m->ttft.n_bounds = NB(ttft_bounds);
	m->itl.bounds = itl_bounds, m->itl.n_bounds = NB(itl_bounds);
	m->e2e.bounds = e2e_bounds, m->e2e.n_bounds = NB(e2e_bounds);
	m->queue.bounds = e2e_bounds, m->queue.n_bounds = NB(e2e_bounds);
	m->prefill.bounds = e2e_bounds, m->prefill.n_bounds = NB(e2e_bounds);
	m->decode.bounds = e2e_bounds, m->decode.n_bounds = NB(e2e_bounds);
}

void srv_metrics_free(struct srv_metrics *m) { pthread_mutex_destroy(&m->mu); }

void srv_hist_observe(struct srv_hist *h, double v)
{
	int32_t i = 0;
	while (i < h->n_bounds && v > h->bounds[i])
		i++;
	h->counts[i]++;
	h->sum += v;
	h->count++;
}

void srv_metrics_http_error(struct srv_metrics *m, int status)
{
	int k = status == 400 ? 0 : status == 401 ? 1 : status == 404 ? 2
	      : (status == 408 || status == 413) ? 3 : status >= 500 ? 4 : 5;
	pthread_mutex_lock(&m->mu);
	m->http_errors[k]++;
	pthread_mutex_unlock(&m->mu);
}

struct buf {
	char *s;
	size_t n, cap;
	int oom;
};

static void put(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct buf *b, const char *fmt, ...)
{
	for (int tries = 0; tries < 2 && !b->oom; tries++) {
		va_list ap;
		va_start(ap, fmt);
		int k = vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
		va_end(ap);
		if (k < 0) {
			b->oom = 1;
			return;
		}
		if ((size_t)k < b->cap - b->n) {
			b->n += (size_t)k;
			return;
		}
		size_t nc = 2 * b->cap + (size_t)k + 1;
		char *ns = realloc(b->s, nc);
		if (!ns) {
			b->oom = 1;
			return;
		}
		b->s = ns, b->cap = nc;
	}
}

static void put_hist(struct buf *b, const char *name, const char *help, const char *label,
                     const struct srv_hist *h)
{
	put(b, "# HELP fp4serve:%s %s\n# TYPE fp4serve:%s histogram\n", name, help, name);
	uint64_t cum = 0;
	for (int32_t i = 0; i < h->n_bounds; i++) {
		cum += h->counts[i];
		put(b, "fp4serve:%s_bucket{%s,le=\"%g\"} %llu\n", name, label, h->bounds[i],
		    (unsigned long long)cum);
	}
	cum += h->counts[h->n_bounds];
	put(b, "fp4serve:%s_bucket{%s,le=\"+Inf\"} %llu\n", name, label, (unsigned long long)cum);
	put(b, "fp4serve:%s_sum{%s} %.6f\nfp4serve:%s_count{%s} %llu\n", name, label, h->sum, name,
	    label, (unsigned long long)h->count);
}

char *srv_metrics_render(struct srv *s, size_t *len)
{
	struct srv_metrics c;
	pthread_mutex_lock(&s->m.mu);
	c = s->m; /* a consistent snapshot; the mutex inside the copy is never used */
	pthread_mutex_unlock(&s->m.mu);
	struct buf b = {malloc(16384), 0, 16384, 0};
	if (!b.s)
		return NULL;
	char label[320];
	/* the served name is ours (a flag), but escape the label specials anyway */
	size_t k = 0;
	k += (size_t)snprintf(label, sizeof label, "model_name=\"");
	for (const char *p = s->model_name; *p && k + 4 < sizeof label; p++) {
		if (*p == '"' || *p == '\\')
			label[k++] = '\\';
		label[k++] = *p == '\n' ? ' ' : *p;
	}
	label[k++] = '"', label[k] = 0;
	put(&b, "# HELP fp4serve:num_requests_running Sequences in the engine's running batch.\n"
	        "# TYPE fp4serve:num_requests_running gauge\nfp4serve:num_requests_running{%s} %lld\n",
	    label, (long long)c.running);
	put(&b, "# HELP fp4serve:num_requests_waiting Sequences waiting for a KV slot.\n"
	        "# TYPE fp4serve:num_requests_waiting gauge\nfp4serve:num_requests_waiting{%s} %lld\n",
	    label, (long long)c.waiting);
	put(&b, "# HELP fp4serve:kv_cache_usage_perc KV-cache usage (1 = full).\n"
	        "# TYPE fp4serve:kv_cache_usage_perc gauge\nfp4serve:kv_cache_usage_perc{%s} %g\n",
	    label, c.kv_total ? (double)c.kv_used / (double)c.kv_total : 0.0);
	put(&b, "# HELP fp4serve:kv_cache_used_blocks KV-cache blocks (16 positions each) held by "
	        "sequences.\n# TYPE fp4serve:kv_cache_used_blocks gauge\n"
	        "fp4serve:kv_cache_used_blocks{%s} %lld\n", label, (long long)c.kv_used);
	put(&b, "# HELP fp4serve:num_preemptions_total Sequences preempted (their KV blocks freed, "
	        "recomputed when readmitted).\n# TYPE fp4serve:num_preemptions_total counter\n"
	        "fp4serve:num_preemptions_total{%s} %lld\n", label, (long long)c.preemptions);
	put(&b, "# HELP fp4serve:decode_steps_ahead_total Decode steps enqueued before the last step's "
	        "tokens were read, by whether the next step took them.\n"
	        "# TYPE fp4serve:decode_steps_ahead_total counter\n"
	        "fp4serve:decode_steps_ahead_total{%s,outcome=\"taken\"} %lld\n"
	        "fp4serve:decode_steps_ahead_total{%s,outcome=\"dropped\"} %lld\n",
	    label, (long long)c.ahead_taken, label, (long long)c.ahead_dropped);
	put(&b, "# HELP fp4serve:prompt_tokens_total Prefill tokens processed.\n"
	        "# TYPE fp4serve:prompt_tokens_total counter\nfp4serve:prompt_tokens_total{%s} %llu\n",
	    label, (unsigned long long)c.prompt_tokens);
	put(&b, "# HELP fp4serve:generation_tokens_total Tokens generated.\n"
	        "# TYPE fp4serve:generation_tokens_total counter\n"
	        "fp4serve:generation_tokens_total{%s} %llu\n", label, (unsigned long long)c.gen_tokens);
	static const char *const why[] = {"", "stop", "length", "abort"};
	put(&b, "# HELP fp4serve:request_success_total Finished sequences by finish reason.\n"
	        "# TYPE fp4serve:request_success_total counter\n");
	for (int i = 1; i < 4; i++)
		put(&b, "fp4serve:request_success_total{%s,finished_reason=\"%s\"} %llu\n", label, why[i],
		    (unsigned long long)c.finished[i]);
	static const char *const codes[] = {"400", "401", "404", "408_413", "5xx", "other"};
	put(&b, "# HELP fp4serve:http_errors_total Error responses by status.\n"
	        "# TYPE fp4serve:http_errors_total counter\n");
	for (int i = 0; i < 6; i++)
		put(&b, "fp4serve:http_errors_total{%s,status=\"%s\"} %llu\n", label, codes[i],
		    (unsigned long long)c.http_errors[i]);
	/* bytes malloc has handed out and not got back (arenas + mmapped chunks): the leak signal
	 * the load test watches, unlike RSS, which also grows as KV pages are first touched */
	struct mallinfo2 mi = mallinfo2();
	put(&b, "# HELP fp4serve:process_heap_bytes Bytes allocated with malloc and not freed.\n"
	        "# TYPE fp4serve:process_heap_bytes gauge\nfp4serve:process_heap_bytes %zu\n",
	    mi.uordblks + mi.hblkhd);
	put_hist(&b, "time_to_first_token_seconds", "Time from arrival to the first token.", label, &c.ttft);
	put_hist(&b, "inter_token_latency_seconds", "Time between two tokens of a sequence.", label, &c.itl);
	put_hist(&b, "e2e_request_latency_seconds", "Time from arrival to the last token.", label, &c.e2e);
	put_hist(&b, "request_queue_time_seconds", "Time waiting before the engine took it.", label, &c.queue);
	put_hist(&b, "request_prefill_time_seconds", "From entering the engine to the first token.", label, &c.prefill);
	put_hist(&b, "request_decode_time_seconds", "From the first token to the last.", label, &c.decode);
	if (b.oom) {
		free(b.s);
		return NULL;
	}
	*len = b.n;
	return b.s;
}
