/* srv_api.c: the OpenAI-compatible endpoints: request parsing and validation (engineering.md
 * §5.4), responses and SSE streams (§5.5), errors in OpenAI's shape (§5.6).
 *
 * Unknown fields are ignored, as vLLM does (clients send `user`, `metadata`, `store`, ...), and
 * logged at debug level. Known fields whose meaning we cannot honour are rejected with 400 so a
 * client never silently gets something else: tools, a response_format other than text, echo,
 * suffix, best_of > n, non-text content parts. Every value is type-checked (a wrong type is
 * 400 naming the field) and range-checked before anything is queued. */
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <civetweb.h>

#include "server/srv.h"
#include "util/log.h"

/* ---- responses ---- */

void srv_send_json(struct mg_connection *c, int status, const char *body, size_t len)
{
	char cl[32];
	snprintf(cl, sizeof cl, "%zu", len);
	srv_response_start(c, status);
	/* a body we did not read (too large, too slow) must not be parsed as the next request */
	if (status == 408 || status == 413)
		mg_response_header_add(c, "Connection", "close", -1);
	mg_response_header_add(c, "Content-Type", "application/json", -1);
	mg_response_header_add(c, "Content-Length", cl, -1);
	mg_response_header_send(c);
	mg_write(c, body, len);
}

static const char *type_for(int status)
{
	return status == 401 ? "authentication_error" : status == 404 ? "not_found_error"
	     : status == 503 ? "unavailable_error" : status >= 500 ? "server_error"
	     : "invalid_request_error";
}

void srv_send_error(struct mg_connection *c, struct srv *s, int status, const char *type,
                    const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	json_t *e = json_pack("{s:{s:s?,s:s,s:i}}", "error", "message", msg, "type",
	                      type ? type : type_for(status), "code", status);
	char *body = e ? json_dumps(e, JSON_COMPACT) : NULL;
	if (!body) /* a message that is not valid UTF-8 (it quoted user input) */
		body = strdup("{\"error\":{\"message\":\"invalid request\",\"type\":\"invalid_request_error\",\"code\":400}}");
	if (body)
		srv_send_json(c, status, body, strlen(body));
	free(body);
	json_decref(e);
	if (s)
		srv_metrics_http_error(&s->m, status);
}

/* civetweb's mg_read keeps reading until it has every byte asked for, waiting up to
 * request_timeout_ms for each piece, so one large read would let a client that trickles a byte
 * a second hold this worker for as many seconds as it promised bytes. We ask for small pieces
 * while data comes slowly (1 byte, checking the deadline after each) and double the size while
 * it comes fast, so a normal body still arrives in a few large reads. Returns bytes read (into
 * buf when non-NULL, else discarded); *complete tells whether the body ended before the
 * deadline. TODO: a client that sends fast and then stalls can still hold one read of up to
 * SRV_READ_MAX bytes for SRV_READ_MAX * request_timeout. */
static size_t read_bounded(struct mg_connection *c, char *buf, size_t cap, double deadline,
                           int *complete)
{
	char sink[SRV_READ_MAX];
	size_t n = 0, piece = 1;
	*complete = 0;
	while (n < cap) {
		const double t = srv_now();
		size_t want = cap - n < piece ? cap - n : piece;
		int r = mg_read(c, buf ? buf + n : sink, want);
		if (r <= 0) {
			*complete = 1;
			break;
		}
		n += (size_t)r;
		const double now = srv_now();
		piece = now - t < 0.01 ? (piece < SRV_READ_MAX ? 2 * piece : piece) : 1;
		if (now > deadline)
			break;
	}
	if (n == cap)
		*complete = 1;
	return n;
}

/* An error reply for a body we will not use: discard what is left of it within the read
 * timeout, so that a fast client sees the reply; if it is still coming, shut the socket (civetweb
 * would otherwise keep reading it after we return, however slowly it trickles). */
static void refuse_body(struct mg_connection *c, struct srv *s, int status, double deadline,
                        const char *msg)
{
	int complete = 0;
	read_bounded(c, NULL, (size_t)-1 / 2, deadline, &complete);
	srv_send_error(c, s, status, NULL, "%s", msg);
	if (!complete)
		srv_http_drop(c);
}

char *srv_read_body(struct mg_connection *c, struct srv *s, size_t *len)
{
	const struct mg_request_info *ri = mg_get_request_info(c);
	const long long cl = ri->content_length;
	const double deadline = srv_now() + s->o.read_timeout_s;
	char msg[256];
	if (cl > (long long)SRV_MAX_BODY) {
		snprintf(msg, sizeof msg, "the request body has %lld bytes; the limit is %u", cl, SRV_MAX_BODY);
		refuse_body(c, s, 413, deadline, msg);
		return NULL;
	}
	/* without Content-Length (chunked), read up to one byte past the limit */
	const size_t cap = cl >= 0 ? (size_t)cl : SRV_MAX_BODY + 1;
	char *buf = malloc(cap + 1);
	if (!buf) {
		srv_send_error(c, s, 503, NULL, "out of memory");
		return NULL;
	}
	int complete;
	size_t n = read_bounded(c, buf, cap, deadline, &complete);
	if (n > SRV_MAX_BODY) {
		free(buf);
		snprintf(msg, sizeof msg, "the request body exceeds the limit of %u bytes", SRV_MAX_BODY);
		refuse_body(c, s, 413, deadline, msg);
		return NULL;
	}
	if (!complete) {
		free(buf);
		srv_send_error(c, s, 408, NULL, "the request body did not arrive within %g s", s->o.read_timeout_s);
		srv_http_drop(c);
		return NULL;
	}
	if (cl >= 0 && n < (size_t)cl) {
		free(buf);
		srv_send_error(c, s, 400, NULL, "the request body ended after %zu of %lld bytes", n, cl);
		return NULL;
	}
	buf[n] = 0;
	*len = n;
	return buf;
}

/* A JSON string from bytes that may not be valid UTF-8 (a token piece can be half a
 * character): invalid bytes become U+FFFD, as Hugging Face's lossy decode does. */
json_t *srv_jstr(const char *p, size_t n)
{
	json_t *j = json_stringn(p, n);
	if (j)
		return j;
	struct fp4s_tok_text t = {0};
	for (size_t i = 0; i < n;) {
		const unsigned char b = (unsigned char)p[i];
		const size_t k = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
		json_t *one = k && i + k <= n ? json_stringn(p + i, k) : NULL; /* jansson validates */
		if (one) {
			fp4s_tok_text_append(&t, p + i, k);
			json_decref(one);
			i += k;
		} else {
			fp4s_tok_text_append(&t, "\xEF\xBF\xBD", 3);
			i++;
		}
	}
	j = json_stringn(t.s ? t.s : "", t.n);
	fp4s_tok_text_free(&t);
	return j;
}

/* ---- request parsing ---- */


static int fail(struct srv_api_req *a, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct srv_api_req *a, int status, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(a->status_msg, sizeof a->status_msg, fmt, ap);
	va_end(ap);
	a->status = status;
	return -1;
}
#define FAIL(st, ...) fail(a, st, __VA_ARGS__)

/* Optional fields: null counts as absent (clients send explicit nulls). 1 = present. */
static int opt_num(struct srv_api_req *a, json_t *o, const char *k, double *out)
{
	json_t *v = json_object_get(o, k);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_number(v))
		return FAIL(400, "'%s' must be a number", k);
	*out = json_number_value(v);
	return 1;
}

static int opt_int(struct srv_api_req *a, json_t *o, const char *k, long long lo, long long hi,
                   long long *out)
{
	json_t *v = json_object_get(o, k);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_integer(v))
		return FAIL(400, "'%s' must be an integer", k);
	long long x = json_integer_value(v);
	if (x < lo || x > hi)
		return FAIL(400, "'%s' must be in [%lld, %lld], got %lld", k, lo, hi, x);
	*out = x;
	return 1;
}

static int opt_bool(struct srv_api_req *a, json_t *o, const char *k, int *out)
{
	json_t *v = json_object_get(o, k);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_boolean(v))
		return FAIL(400, "'%s' must be a boolean", k);
	*out = json_is_true(v);
	return 1;
}

static int opt_str(struct srv_api_req *a, json_t *o, const char *k, const char **out)
{
	json_t *v = json_object_get(o, k);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_string(v))
		return FAIL(400, "'%s' must be a string", k);
	*out = json_string_value(v);
	return 1;
}

static int set_f(struct srv_api_req *a, json_t *o, const char *k, float *dst)
{
	double d = 0;
	int r = opt_num(a, o, k, &d);
	if (r > 0) {
		/* out-of-range values are reported by fp4s_samp_validate; keep them finite here */
		if (d > 1e6 || d < -1e6)
			return FAIL(400, "'%s' is out of range: %g", k, d);
		*dst = (float)d;
	}
	return r < 0 ? -1 : 0;
}

/* Collects a message's text: a string, or an array of {"type":"text","text":...} parts. */
static int content_text(struct srv_api_req *a, json_t *v, int idx, struct fp4s_tok_text *out)
{
	out->n = 0;
	if (fp4s_tok_text_append(out, "", 0))
		return FAIL(503, "out of memory");
	if (!v || json_is_null(v))
		return 0;
	if (json_is_string(v))
		return fp4s_tok_text_append(out, json_string_value(v), json_string_length(v)) ? FAIL(503, "out of memory") : 0;
	if (!json_is_array(v))
		return FAIL(400, "'messages[%d].content' must be a string or an array of content parts", idx);
	size_t i;
	json_t *p;
	json_array_foreach(v, i, p) {
		json_t *t = json_object_get(p, "type"), *tx = json_object_get(p, "text");
		if (!json_is_object(p) || !json_is_string(t))
			return FAIL(400, "'messages[%d].content[%zu]' must be an object with a 'type'", idx, i);
		if (strcmp(json_string_value(t), "text") != 0)
			return FAIL(400, "content parts of type '%s' are not supported (text only)", json_string_value(t));
		if (!json_is_string(tx))
			return FAIL(400, "'messages[%d].content[%zu].text' must be a string", idx, i);
		if (fp4s_tok_text_append(out, json_string_value(tx), json_string_length(tx)))
			return FAIL(503, "out of memory");
	}
	return 0;
}

static int parse_prompt_chat(struct srv *s, struct srv_api_req *a, json_t *root, struct srv_job *j)
{
	json_t *msgs = json_object_get(root, "messages");
	if (!msgs || !json_is_array(msgs) || json_array_size(msgs) == 0)
		return FAIL(400, "'messages' must be a non-empty array");
	if (json_array_size(msgs) > SRV_MAX_MESSAGES)
		return FAIL(400, "at most %d messages", SRV_MAX_MESSAGES);
	const struct fp4s_chat_template *t = fp4s_tok_chat(s->tok);
	if (!t || t->format == FP4S_CHAT_NONE)
		return FAIL(400, "this model has no chat template; use /v1/completions");
	const size_t n = json_array_size(msgs);
	struct fp4s_chat_msg *cm = calloc(n, sizeof *cm);
	struct fp4s_tok_text *texts = calloc(n, sizeof *texts), *thinks = calloc(n, sizeof *thinks);
	struct fp4s_tok_text prompt = {0};
	struct fp4s_tok_ids ids = {0};
	struct fp4s_error err = {0};
	int rc = 0;
	if (!cm || !texts || !thinks) {
		rc = FAIL(503, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < n && !rc; i++) {
		json_t *m = json_array_get(msgs, i), *role = json_object_get(m, "role");
		if (!json_is_object(m) || !json_is_string(role)) {
			rc = FAIL(400, "'messages[%zu]' must be an object with a string 'role'", i);
			break;
		}
		const char *r = json_string_value(role);
		if (strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "user") &&
		    strcmp(r, "assistant") && strcmp(r, "tool")) {
			rc = FAIL(400, "'messages[%zu].role' must be system, developer, user, assistant or tool, got '%.64s'", i, r);
			break;
		}
		if ((rc = content_text(a, json_object_get(m, "content"), (int)i, &texts[i])))
			break;
		cm[i].role = r;
		cm[i].content = texts[i].s;
		json_t *rsn = json_object_get(m, "reasoning_content");
		if (rsn && json_is_string(rsn) && !fp4s_tok_text_append(&thinks[i], json_string_value(rsn), json_string_length(rsn)))
			cm[i].thinking = thinks[i].s;
	}
	if (rc)
		goto out;
	struct fp4s_chat_opts co = {.add_generation_prompt = 1, .enable_thinking = 1};
	json_t *kw = json_object_get(root, "chat_template_kwargs");
	if (kw && !json_is_null(kw)) {
		if (!json_is_object(kw)) {
			rc = FAIL(400, "'chat_template_kwargs' must be an object");
			goto out;
		}
		int et = 1;
		if ((rc = opt_bool(a, kw, "enable_thinking", &et)) < 0)
			goto out;
		if (rc > 0)
			co.enable_thinking = et;
		const char *re = NULL;
		if ((rc = opt_str(a, kw, "reasoning_effort", &re)) < 0)
			goto out;
		if (re)
			co.reasoning_effort = re;
		rc = 0;
	}
	const char *re = NULL;
	if ((rc = opt_str(a, root, "reasoning_effort", &re)) < 0)
		goto out;
	rc = 0;
	if (re)
		co.reasoning_effort = re;
	if (co.reasoning_effort && strcmp(co.reasoning_effort, "low") && strcmp(co.reasoning_effort, "medium") &&
	    strcmp(co.reasoning_effort, "high")) {
		rc = FAIL(400, "'reasoning_effort' must be low, medium or high");
		goto out;
	}
	if (fp4s_chat_apply(t, cm, n, &co, &prompt, &err) ||
	    fp4s_tok_encode(s->tok, prompt.s, prompt.n, FP4S_TOK_PARSE_SPECIAL, &ids, &err)) {
		rc = FAIL(400, "%s", err.msg);
		goto out;
	}
	j->prompt = ids.v, j->n_prompt = (int32_t)ids.n;
	ids.v = NULL;
	a->harmony = t->format == FP4S_CHAT_HARMONY;
out:
	for (size_t i = 0; texts && thinks && i < n; i++)
		fp4s_tok_text_free(&texts[i]), fp4s_tok_text_free(&thinks[i]);
	free(cm), free(texts), free(thinks);
	fp4s_tok_text_free(&prompt);
	fp4s_tok_ids_free(&ids);
	return rc;
}

static int parse_prompt_text(struct srv *s, struct srv_api_req *a, json_t *root, struct srv_job *j)
{
	json_t *p = json_object_get(root, "prompt");
	if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
		p = json_array_get(p, 0);
	struct fp4s_tok_ids ids = {0};
	struct fp4s_error err = {0};
	if (json_is_string(p)) {
		if (fp4s_tok_encode(s->tok, json_string_value(p), json_string_length(p),
		                    FP4S_TOK_ADD_SPECIAL, &ids, &err)) {
			fp4s_tok_ids_free(&ids);
			return FAIL(400, "%s", err.msg);
		}
	} else if (json_is_array(p) && json_array_size(p) > 0 && json_is_integer(json_array_get(p, 0))) {
		const size_t n = json_array_size(p);
		if (n >= (size_t)s->max_ctx)
			return FAIL(400, "This model's maximum context length is %d tokens. However, your prompt has %zu tokens.",
			            s->max_ctx, n);
		ids.v = malloc(n * sizeof *ids.v);
		if (!ids.v)
			return FAIL(503, "out of memory");
		for (size_t i = 0; i < n; i++) {
			json_t *t = json_array_get(p, i);
			long long v = json_is_integer(t) ? json_integer_value(t) : -1;
			if (v < 0 || v >= s->vocab) {
				free(ids.v);
				return FAIL(400, "'prompt[%zu]' must be a token id in [0, %d)", i, s->vocab);
			}
			ids.v[i] = (int32_t)v;
		}
		ids.n = n;
	} else if (json_is_array(p) && json_array_size(p) > 1) {
		return FAIL(400, "a list of several prompts is not supported; send one request per prompt");
	} else {
		return FAIL(400, "'prompt' must be a string or an array of token ids");
	}
	if (ids.n == 0) {
		/* an empty prompt starts from BOS, as llama2.c does */
		int32_t bos = fp4s_tok_bos(s->tok);
		if (bos < 0) {
			fp4s_tok_ids_free(&ids);
			return FAIL(400, "the prompt is empty");
		}
		fp4s_tok_ids_free(&ids);
		ids.v = malloc(sizeof *ids.v);
		if (!ids.v)
			return FAIL(503, "out of memory");
		ids.v[0] = bos, ids.n = 1;
	}
	j->prompt = ids.v, j->n_prompt = (int32_t)ids.n;
	return 0;
}

static int parse_request(struct srv *s, struct srv_api_req *a, json_t *root, struct srv_job *j)
{
	const char *model = NULL;
	if (opt_str(a, root, "model", &model) < 0)
		return -1;
	if (model && strcmp(model, s->model_name) != 0)
		return FAIL(404, "The model `%.200s` does not exist.", model);
	/* known fields we cannot honour */
	json_t *v;
	if ((v = json_object_get(root, "tools")) && json_is_array(v) && json_array_size(v))
		return FAIL(400, "'tools' is not supported by this server");
	if ((v = json_object_get(root, "functions")) && !json_is_null(v))
		return FAIL(400, "'functions' is not supported by this server");
	if ((v = json_object_get(root, "response_format")) && !json_is_null(v)) {
		json_t *t = json_object_get(v, "type");
		if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0)
			return FAIL(400, "'response_format' other than {\"type\":\"text\"} is not supported");
	}
	if ((v = json_object_get(root, "echo")) && json_is_true(v))
		return FAIL(400, "'echo' is not supported");
	if ((v = json_object_get(root, "suffix")) && !json_is_null(v) &&
	    !(json_is_string(v) && json_string_length(v) == 0))
		return FAIL(400, "'suffix' is not supported");
	int b = 0;
	if (opt_bool(a, root, "stream", &b) < 0)
		return -1;
	a->stream = opt_bool(a, root, "stream", &b) > 0 && b;
	if ((v = json_object_get(root, "stream_options")) && !json_is_null(v)) {
		if (!json_is_object(v))
			return FAIL(400, "'stream_options' must be an object");
		if (opt_bool(a, v, "include_usage", &a->include_usage) < 0 ||
		    opt_bool(a, v, "continuous_usage_stats", &a->continuous_usage) < 0)
			return -1;
	}
	/* sampling */
	struct fp4s_sampling *sp = &j->req.sampling;
	if (set_f(a, root, "temperature", &sp->temperature) || set_f(a, root, "top_p", &sp->top_p) ||
	    set_f(a, root, "min_p", &sp->min_p) || set_f(a, root, "presence_penalty", &sp->presence_penalty) ||
	    set_f(a, root, "frequency_penalty", &sp->frequency_penalty) ||
	    set_f(a, root, "repetition_penalty", &sp->repetition_penalty))
		return -1;
	long long x = 0;
	int r;
	if ((r = opt_int(a, root, "top_k", -1, INT32_MAX, &x)) < 0)
		return -1;
	if (r)
		sp->top_k = (int32_t)x;
	if ((r = opt_int(a, root, "min_tokens", 0, INT32_MAX, &x)) < 0)
		return -1;
	if (r)
		sp->min_tokens = (int32_t)x;
	if ((r = opt_int(a, root, "n", 1, SRV_MAX_N, &x)) < 0)
		return -1;
	j->n = r ? (int32_t)x : 1;
	/* the scheduler admits a job only when all its sequences fit at once (srv_queue.c) */
	if (j->n > 2 * s->o.max_num_seqs)
		return FAIL(400, "'n' is %d; this server runs at most %d sequences per request (2 x --max-num-seqs)",
		            j->n, 2 * s->o.max_num_seqs);
	if ((r = opt_int(a, root, "best_of", 1, SRV_MAX_N, &x)) < 0)
		return -1;
	if (r && x > j->n)
		return FAIL(400, "'best_of' greater than 'n' is not supported");
	if ((r = opt_int(a, root, "seed", INT64_MIN, INT64_MAX, &x)) < 0)
		return -1;
	if (r)
		sp->seed = (uint64_t)x, sp->has_seed = true;
	if (opt_bool(a, root, "ignore_eos", &b) < 0)
		return -1;
	if (opt_bool(a, root, "ignore_eos", &b) > 0)
		sp->ignore_eos = b;
	if (opt_bool(a, root, "skip_special_tokens", &b) < 0)
		return -1;
	if (opt_bool(a, root, "skip_special_tokens", &b) > 0 && !b)
		j->req.detok_flags = 0;
	/* max_tokens: vLLM's rule is >= 1; the context check comes after tokenizing */
	const char *mk = json_object_get(root, "max_completion_tokens") &&
	                 !json_is_null(json_object_get(root, "max_completion_tokens")) ? "max_completion_tokens" : "max_tokens";
	if ((v = json_object_get(root, mk)) && !json_is_null(v)) {
		if (!json_is_integer(v))
			return FAIL(400, "'%s' must be an integer", mk);
		long long m = json_integer_value(v);
		if (m < 1)
			return FAIL(400, "'%s' must be at least 1, got %lld", mk, m);
		if (m > s->max_ctx)
			return FAIL(400, "'%s' is %lld; this model's maximum context length is %d tokens", mk, m, s->max_ctx);
		a->max_tokens = (int32_t)m;
	}
	/* logprobs: chat takes a bool plus top_logprobs, completions an int */
	if (a->chat) {
		if (opt_bool(a, root, "logprobs", &a->logprobs) < 0)
			return -1;
		if ((r = opt_int(a, root, "top_logprobs", 0, FP4S_SAMP_MAX_TOP_LOGPROBS, &x)) < 0)
			return -1;
		if (r && x > 0 && !a->logprobs)
			return FAIL(400, "'top_logprobs' needs 'logprobs': true");
		a->top_logprobs = r ? (int)x : 0;
	} else {
		if ((r = opt_int(a, root, "logprobs", 0, FP4S_SAMP_MAX_TOP_LOGPROBS, &x)) < 0)
			return -1;
		if (r) {
			a->logprobs = 1;
			a->top_logprobs = (int)x;
		}
	}
	sp->logprobs = a->logprobs;
	sp->top_logprobs = a->top_logprobs;
	sp->logprobs_mode = s->o.logprobs_processed ? FP4S_SAMP_LOGPROBS_PROCESSED : FP4S_SAMP_LOGPROBS_RAW;
	/* logit_bias: {"token id": bias} */
	if ((v = json_object_get(root, "logit_bias")) && !json_is_null(v)) {
		if (!json_is_object(v))
			return FAIL(400, "'logit_bias' must be an object of token id -> bias");
		if (json_object_size(v) > FP4S_SAMP_MAX_LOGIT_BIAS)
			return FAIL(400, "'logit_bias' has more than %d entries", FP4S_SAMP_MAX_LOGIT_BIAS);
		const char *key;
		json_t *bv;
		json_object_foreach(v, key, bv) {
			char *end;
			long id = strtol(key, &end, 10);
			if (!*key || *end || id < 0 || id >= s->vocab)
				return FAIL(400, "'logit_bias' key '%.32s' is not a token id in [0, %d)", key, s->vocab);
			if (!json_is_number(bv))
				return FAIL(400, "'logit_bias[%.32s]' must be a number", key);
			double bias = json_number_value(bv);
			if (!(bias >= -100 && bias <= 100))
				return FAIL(400, "'logit_bias[%.32s]' must be in [-100, 100]", key);
			sp->logit_bias[sp->n_logit_bias++] = (struct fp4s_samp_bias){(int32_t)id, (float)bias};
		}
	}
	/* stop: a string or up to FP4S_ENGINE_MAX_STOP_STRINGS strings */
	if ((v = json_object_get(root, "stop")) && !json_is_null(v)) {
		json_t *one = json_is_string(v) ? v : NULL;
		size_t n = one ? 1 : json_is_array(v) ? json_array_size(v) : (size_t)-1;
		if (n == (size_t)-1)
			return FAIL(400, "'stop' must be a string or an array of strings");
		if (n > FP4S_ENGINE_MAX_STOP_STRINGS)
			return FAIL(400, "'stop' has more than %d strings", FP4S_ENGINE_MAX_STOP_STRINGS);
		for (size_t i = 0; i < n; i++) {
			json_t *e = one ? one : json_array_get(v, i);
			if (!json_is_string(e))
				return FAIL(400, "'stop[%zu]' must be a string", i);
			size_t l = json_string_length(e);
			if (l == 0)
				continue; /* an empty stop string would match everywhere: ignore it */
			if (l > FP4S_ENGINE_MAX_STOP_LEN || memchr(json_string_value(e), 0, l))
				return FAIL(400, "'stop[%zu]' must have 1 to %d bytes and no NUL", i, FP4S_ENGINE_MAX_STOP_LEN);
			if (!(j->stop_buf[j->req.n_stop] = strdup(json_string_value(e))))
				return FAIL(503, "out of memory");
			j->req.stop[j->req.n_stop] = j->stop_buf[j->req.n_stop];
			j->req.n_stop++;
		}
	}
	/* the prompt */
	if (a->chat ? parse_prompt_chat(s, a, root, j) : parse_prompt_text(s, a, root, j))
		return -1;
	if (j->n_prompt >= s->max_ctx)
		return FAIL(400, "This model's maximum context length is %d tokens. However, your prompt has %d tokens.",
		            s->max_ctx, j->n_prompt);
	if (a->max_tokens && (int64_t)j->n_prompt + a->max_tokens > s->max_ctx)
		return FAIL(400, "This model's maximum context length is %d tokens. However, you requested "
		            "%lld tokens (%d in the prompt, %d in the completion). Please reduce the prompt or max_tokens.",
		            s->max_ctx, (long long)j->n_prompt + a->max_tokens, j->n_prompt, a->max_tokens);
	sp->max_tokens = a->max_tokens ? a->max_tokens : s->max_ctx - j->n_prompt;
	if (a->harmony)
		j->req.detok_flags = 0; /* the channel markers are special tokens: we parse them */
	struct fp4s_error err = {0};
	if (fp4s_samp_validate(sp, s->vocab, &err))
		return FAIL(400, "%s", err.msg);
	/* fields we do not know are ignored (vLLM's choice); say so in the debug log */
	if (fp4s_log_enabled(FP4S_LOG_DEBUG)) {
		static const char *const known[] = {
			"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature",
			"top_p", "top_k", "min_p", "n", "stop", "seed", "presence_penalty", "frequency_penalty",
			"repetition_penalty", "logit_bias", "logprobs", "top_logprobs", "ignore_eos", "min_tokens",
			"chat_template_kwargs", "reasoning_effort", "stream", "stream_options", "skip_special_tokens",
			"best_of", "echo", "suffix", "tools", "functions", "response_format", NULL};
		const char *key;
		json_t *kv;
		json_object_foreach(root, key, kv) {
			int k = 0;
			while (known[k] && strcmp(known[k], key))
				k++;
			if (!known[k])
				FP4S_DEBUG("request field '%.64s' ignored", key);
		}
	}
	return 0;
}

/* A JSON object body or a 400. Bodies are bounded by srv_read_body (--max-body). */
static json_t *parse_body(struct srv_api_req *a, const char *body, size_t len)
{
	json_error_t je;
	json_t *root = json_loadb(body, len, 0, &je);
	if (!root) {
		fail(a, 400, "invalid JSON at line %d, column %d: %s", je.line, je.column, je.text);
		return NULL;
	}
	if (!json_is_object(root)) {
		json_decref(root);
		fail(a, 400, "the request body must be a JSON object");
		return NULL;
	}
	return root;
}

int srv_api_parse(struct srv *s, struct srv_api_req *a, const char *body, size_t len, struct srv_job *j)
{
	json_t *root = parse_body(a, body, len);
	if (!root)
		return -1;
	const int rc = parse_request(s, a, root, j);
	json_decref(root);
	return rc;
}

int srv_api_completions(struct mg_connection *c, struct srv *s, int chat)
{
	const double t0 = srv_now();
	size_t len;
	char *body = srv_read_body(c, s, &len);
	if (!body)
		return 1;
	struct srv_api_req a = {.chat = chat};
	struct srv_job *j = srv_job_new();
	if (!j) {
		free(body);
		srv_send_error(c, s, 503, NULL, "out of memory");
		return 1;
	}
	j->t_arrival = t0;
	const int rc = srv_api_parse(s, &a, body, len, j);
	free(body);
	if (rc) {
		srv_send_error(c, s, a.status, NULL, "%s", a.status_msg);
	} else if (atomic_load(&s->draining)) {
		srv_send_error(c, s, 503, NULL, "the server is shutting down");
	} else {
		srv_run_job(c, s, &a, j);
	}
	srv_job_free(j);
	return 1;
}

json_t *srv_api_tokenize_json(struct srv *s, struct srv_api_req *a, const char *text, size_t len, int detok)
{
	json_t *root = parse_body(a, text, len);
	if (!root)
		return NULL;
	const char *model = NULL;
	json_t *resp = NULL;
	if (opt_str(a, root, "model", &model) < 0) {
	} else if (model && strcmp(model, s->model_name) != 0) {
		FAIL(404, "The model `%.200s` does not exist.", model);
	} else if (detok) {
		json_t *t = json_object_get(root, "tokens");
		size_t n = json_is_array(t) ? json_array_size(t) : 0;
		int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
		if (!json_is_array(t))
			FAIL(400, "'tokens' must be an array of token ids");
		for (size_t i = 0; ids && i < n && !a->status; i++) {
			json_t *v = json_array_get(t, i);
			long long x = json_is_integer(v) ? json_integer_value(v) : -1;
			if (x < 0 || x >= fp4s_tok_n_vocab(s->tok))
				FAIL(400, "'tokens[%zu]' must be a token id in [0, %d)", i, fp4s_tok_n_vocab(s->tok));
			else
				ids[i] = (int32_t)x;
		}
		struct fp4s_tok_text out = {0};
		struct fp4s_error err = {0};
		if (!ids)
			FAIL(503, "out of memory");
		else if (!a->status && fp4s_tok_decode(s->tok, ids, n, 0, &out, &err))
			FAIL(400, "%s", err.msg);
		else if (!a->status)
			resp = json_pack("{s:o}", "prompt", srv_jstr(out.s ? out.s : "", out.n));
		fp4s_tok_text_free(&out);
		free(ids);
	} else {
		struct srv_job *j = srv_job_new();
		int add_special = 1;
		if (!j) {
			FAIL(503, "out of memory");
		} else if (opt_bool(a, root, "add_special_tokens", &add_special) >= 0) {
			int rc;
			if (json_object_get(root, "messages")) {
				a->chat = 1;
				rc = parse_prompt_chat(s, a, root, j);
			} else if (add_special) {
				rc = parse_prompt_text(s, a, root, j);
			} else {
				json_t *p = json_object_get(root, "prompt");
				struct fp4s_tok_ids ids = {0};
				struct fp4s_error err = {0};
				rc = !json_is_string(p) ? FAIL(400, "'prompt' must be a string")
				     : fp4s_tok_encode(s->tok, json_string_value(p), json_string_length(p), 0, &ids, &err)
				     ? FAIL(400, "%s", err.msg) : 0;
				j->prompt = ids.v, j->n_prompt = (int32_t)ids.n;
			}
			if (!rc) {
				json_t *arr = json_array();
				for (int32_t i = 0; i < j->n_prompt; i++)
					json_array_append_new(arr, json_integer(j->prompt[i]));
				resp = json_pack("{s:i,s:i,s:o}", "count", j->n_prompt, "max_model_len", s->max_ctx,
				                 "tokens", arr);
			}
		}
		srv_job_free(j);
	}
	json_decref(root);
	if (a->status) {
		json_decref(resp);
		return NULL;
	}
	if (!resp)
		fail(a, 500, "internal error");
	return resp;
}

int srv_api_tokenize(struct mg_connection *c, struct srv *s, int detok)
{
	size_t len;
	char *text = srv_read_body(c, s, &len);
	if (!text)
		return 1;
	struct srv_api_req a = {0};
	json_t *resp = srv_api_tokenize_json(s, &a, text, len, detok);
	free(text);
	if (!resp) {
		srv_send_error(c, s, a.status, NULL, "%s", a.status_msg);
	} else {
		char *body = json_dumps(resp, JSON_COMPACT);
		if (body)
			srv_send_json(c, 200, body, strlen(body));
		else
			srv_send_error(c, s, 503, NULL, "out of memory");
		free(body);
	}
	json_decref(resp);
	return 1;
}

int srv_api_models(struct mg_connection *c, struct srv *s)
{
	json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:i,s:s}", "id", s->model_name, "object", "model",
	                      "created", (json_int_t)s->created, "owned_by", "fp4serve", "max_model_len",
	                      s->max_ctx, "root", s->o.model ? s->o.model : "");
	if (m && s->o.demo) {
		json_object_set_new(m, "demo", json_true());
		json_object_set_new(m, "description",
		                    json_string("random-weight demo model (fp4serve serve --demo): its output "
		                                "is random text"));
	}
	json_t *r = json_pack("{s:s,s:[o]}", "object", "list", "data", m);
	char *body = r ? json_dumps(r, JSON_COMPACT) : NULL;
	if (body)
		srv_send_json(c, 200, body, strlen(body));
	else
		srv_send_error(c, s, 500, NULL, "could not build the response");
	free(body);
	json_decref(r);
	return 1;
}
