/* srv_sse.c: runs one completion job and answers with a JSON body or an SSE stream
 * (engineering.md §5.5): `data: {...}` chunks of chat.completion.chunk / text_completion,
 * finish_reason on each choice's last chunk, the usage chunk when stream_options.include_usage,
 * then `data: [DONE]`. Stream headers go out with the first event, so a failure before it is
 * still an HTTP error; a failure after it is an `error` event (llama.cpp's convention) followed
 * by [DONE]. A write that returns <= 0 means the client left: the job is cancelled, which frees
 * its KV slots. */
#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <civetweb.h>

#include "server/srv.h"
#include "util/log.h"

/* ---- generation ---- */

struct choice {
	struct fp4s_tok_text text, reasoning;
	struct srv_harmony hz;
	enum fp4s_finish finish;
	int32_t n_gen;
	int sent_role;
	json_t *lp; /* non-stream: chat logprobs.content array / completions logprobs object */
};

static const char *finish_name(enum fp4s_finish f)
{
	return f == FP4S_FINISH_STOP ? "stop" : f == FP4S_FINISH_LENGTH ? "length" : NULL;
}

static json_t *lp_entry_chat(struct srv *s, const struct fp4s_samp_result *r, int top)
{
	size_t n;
	const char *pc = fp4s_tok_piece(s->tok, r->token, &n);
	json_t *bytes = json_array();
	for (size_t i = 0; pc && i < n; i++)
		json_array_append_new(bytes, json_integer((unsigned char)pc[i]));
	json_t *e = json_pack("{s:o,s:f,s:o,s:[]}", "token", srv_jstr(pc ? pc : "", pc ? n : 0), "logprob",
	                      (double)r->logprob, "bytes", bytes, "top_logprobs");
	for (int32_t k = 0; e && k < r->n_top && k < top; k++) {
		const char *tp = fp4s_tok_piece(s->tok, r->top[k].token, &n);
		json_t *tb = json_array();
		for (size_t i = 0; tp && i < n; i++)
			json_array_append_new(tb, json_integer((unsigned char)tp[i]));
		json_array_append_new(json_object_get(e, "top_logprobs"),
		                      json_pack("{s:o,s:f,s:o}", "token", srv_jstr(tp ? tp : "", tp ? n : 0),
		                                "logprob", (double)r->top[k].logprob, "bytes", tb));
	}
	return e;
}

/* completions: {"tokens":[],"token_logprobs":[],"top_logprobs":[{tok:lp}],"text_offset":[]} */
static void lp_add_completion(struct srv *s, json_t *o, const struct fp4s_samp_result *r, int top,
                              size_t offset)
{
	size_t n;
	const char *pc = fp4s_tok_piece(s->tok, r->token, &n);
	json_array_append_new(json_object_get(o, "tokens"), srv_jstr(pc ? pc : "", pc ? n : 0));
	json_array_append_new(json_object_get(o, "token_logprobs"), json_real(r->logprob));
	json_t *t = json_object();
	for (int32_t k = 0; k < r->n_top && k < top; k++) {
		const char *tp = fp4s_tok_piece(s->tok, r->top[k].token, &n);
		json_t *key = srv_jstr(tp ? tp : "", tp ? n : 0);
		if (key)
			json_object_set_new(t, json_string_value(key), json_real(r->top[k].logprob));
		json_decref(key);
	}
	json_array_append_new(json_object_get(o, "top_logprobs"), t);
	json_array_append_new(json_object_get(o, "text_offset"), json_integer((json_int_t)offset));
}

static json_t *lp_new_completion(void)
{
	return json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

/* Splits an event's text into content / reasoning deltas for its choice. */
static int route_text(struct srv_api_req *a, struct choice *ch, const struct srv_ev *e,
                      struct fp4s_tok_text *content, struct fp4s_tok_text *reasoning)
{
	content->n = reasoning->n = 0;
	if (fp4s_tok_text_append(content, "", 0) || fp4s_tok_text_append(reasoning, "", 0))
		return -1;
	if (!a->harmony)
		return fp4s_tok_text_append(content, e->text, e->len);
	return srv_harmony_feed(&ch->hz, e->text, e->len, e->finish != FP4S_FINISH_NONE, content, reasoning);
}

static int sse_send(struct mg_connection *c, json_t *j)
{
	char *body = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	if (!body)
		return 0; /* nothing we can send; not the client's fault */
	size_t n = strlen(body);
	char *msg = malloc(n + 9);
	if (!msg) {
		free(body);
		return 0;
	}
	memcpy(msg, "data: ", 6);
	memcpy(msg + 6, body, n);
	memcpy(msg + 6 + n, "\n\n", 2);
	int r = mg_send_chunk(c, msg, (unsigned)(n + 8));
	free(msg);
	free(body);
	return r > 0 ? 0 : -1; /* <= 0: the peer has closed (civetweb docs/api/mg_send_chunk.md) */
}

static json_t *usage_json(int32_t n_prompt, int32_t n_gen)
{
	return json_pack("{s:i,s:i,s:i}", "prompt_tokens", n_prompt, "completion_tokens", n_gen,
	                 "total_tokens", n_prompt + n_gen);
}

static atomic_ullong req_counter;

void srv_run_job(struct mg_connection *c, struct srv *s, struct srv_api_req *a, struct srv_job *j)
{
	char id[64];
	snprintf(id, sizeof id, "%s-%016llx%04llx", a->chat ? "chatcmpl" : "cmpl",
	         (unsigned long long)time(NULL) * 2654435761ull, atomic_fetch_add(&req_counter, 1) & 0xffff);
	const json_int_t created = (json_int_t)time(NULL);
	const char *obj = a->chat ? (a->stream ? "chat.completion.chunk" : "chat.completion")
	                          : "text_completion";
	struct choice ch[SRV_MAX_N];
	memset(ch, 0, sizeof ch);
	for (int32_t i = 0; i < j->n; i++) {
		srv_harmony_init(&ch[i].hz);
		if (a->logprobs && !a->stream)
			ch[i].lp = a->chat ? json_array() : lp_new_completion();
	}
	struct fp4s_tok_text dc = {0}, dr = {0};
	const double deadline = j->t_arrival + s->o.timeout_s;
	int headers_sent = 0, gone = 0, cancelled = 0, timed_out = 0;
	int32_t n_gen_total = 0;
	srv_submit(s, j);
	for (;;) {
		int done;
		struct srv_ev *e = srv_job_wait(j, srv_now() + 0.25, &done);
		if (!e && done)
			break;
		/* the deadline and the drain, checked whether or not tokens flow */
		if (!cancelled && (srv_now() > deadline || atomic_load(&s->abort_all))) {
			timed_out = srv_now() > deadline;
			srv_job_cancel(s, j);
			cancelled = 1;
		}
		if (!e)
			continue;
		struct choice *cc = &ch[e->index];
		if (e->finish != FP4S_FINISH_NONE) {
			cc->finish = e->finish;
			cc->n_gen = e->n_generated;
			n_gen_total += e->n_generated;
		}
		if (gone || e->finish == FP4S_FINISH_CANCELLED) {
			free(e->lp), free(e);
			continue;
		}
		if (route_text(a, cc, e, &dc, &dr)) {
			free(e->lp), free(e);
			continue;
		}
		if (!a->stream) {
			fp4s_tok_text_append(&cc->text, dc.s, dc.n);
			fp4s_tok_text_append(&cc->reasoning, dr.s, dr.n);
			if (e->lp && cc->lp) {
				if (a->chat)
					json_array_append_new(cc->lp, lp_entry_chat(s, e->lp, a->top_logprobs));
				else
					lp_add_completion(s, cc->lp, e->lp, a->top_logprobs, cc->text.n - dc.n);
			}
			free(e->lp), free(e);
			continue;
		}
		/* streaming: headers go out with the first event, so that errors before it (a failed
		 * submit) still get a proper status */
		if (!headers_sent) {
			srv_response_start(c, 200);
			mg_response_header_add(c, "Content-Type", "text/event-stream", -1);
			mg_response_header_add(c, "Cache-Control", "no-cache", -1);
			mg_response_header_add(c, "Transfer-Encoding", "chunked", -1);
			mg_response_header_send(c);
			headers_sent = 1;
		}
		json_t *choice;
		const char *fin = finish_name(e->finish);
		/* a token that produced no visible text (held back, a marker) sends nothing */
		const int send = (a->chat && !cc->sent_role) || dc.n || dr.n || fin || e->lp;
		if (a->chat) {
			json_t *delta = json_object();
			if (!cc->sent_role) {
				json_object_set_new(delta, "role", json_string("assistant"));
				if (!dc.n && !dr.n)
					json_object_set_new(delta, "content", json_string(""));
				cc->sent_role = 1;
			}
			if (dc.n)
				json_object_set_new(delta, "content", srv_jstr(dc.s, dc.n));
			if (dr.n)
				json_object_set_new(delta, "reasoning_content", srv_jstr(dr.s, dr.n));
			json_t *lp = json_null();
			if (e->lp) {
				lp = json_pack("{s:[o]}", "content", lp_entry_chat(s, e->lp, a->top_logprobs));
			}
			choice = json_pack("{s:i,s:o,s:o,s:o}", "index", e->index, "delta", delta, "logprobs", lp,
			                   "finish_reason", fin ? json_string(fin) : json_null());
		} else {
			json_t *lp = json_null();
			if (e->lp) {
				lp = lp_new_completion();
				lp_add_completion(s, lp, e->lp, a->top_logprobs, 0);
			}
			choice = json_pack("{s:i,s:o,s:o,s:o}", "index", e->index, "text", srv_jstr(dc.s, dc.n),
			                   "logprobs", lp, "finish_reason", fin ? json_string(fin) : json_null());
		}
		json_t *chunk = json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", id, "object", obj, "created", created,
		                          "model", s->model_name, "choices", choice);
		if (a->continuous_usage && a->include_usage && chunk)
			json_object_set_new(chunk, "usage", usage_json(j->n_prompt, e->n_generated));
		free(e->lp), free(e);
		if (!send) {
			json_decref(chunk);
			continue;
		}
		if (sse_send(c, chunk)) {
			gone = 1;
			srv_job_cancel(s, j);
			cancelled = 1;
			FP4S_INFO("%s: client went away; sequence cancelled", id);
		}
	}
	fp4s_tok_text_free(&dc), fp4s_tok_text_free(&dr);
	if (j->err_status && !headers_sent) {
		srv_send_error(c, s, j->err_status, NULL, "%s", j->err_msg);
	} else if (!a->stream) {
		if (cancelled && timed_out)
			srv_send_error(c, s, 503, NULL, "the request timed out after %g s (--timeout)", s->o.timeout_s);
		else if (cancelled)
			srv_send_error(c, s, 503, NULL, "the server is shutting down");
		else {
			json_t *choices = json_array();
			for (int32_t i = 0; i < j->n; i++) {
				const char *fin = finish_name(ch[i].finish);
				json_t *cj;
				if (a->chat) {
					json_t *msg = json_pack("{s:s,s:o}", "role", "assistant", "content",
					                        srv_jstr(ch[i].text.s ? ch[i].text.s : "", ch[i].text.n));
					if (a->harmony)
						json_object_set_new(msg, "reasoning_content", ch[i].reasoning.n
						                    ? srv_jstr(ch[i].reasoning.s, ch[i].reasoning.n) : json_null());
					cj = json_pack("{s:i,s:o,s:o,s:o}", "index", i, "message", msg, "logprobs",
					               ch[i].lp ? json_pack("{s:O}", "content", ch[i].lp) : json_null(),
					               "finish_reason", fin ? json_string(fin) : json_null());
				} else {
					cj = json_pack("{s:i,s:o,s:O?,s:o}", "index", i, "text",
					               srv_jstr(ch[i].text.s ? ch[i].text.s : "", ch[i].text.n), "logprobs",
					               ch[i].lp, "finish_reason", fin ? json_string(fin) : json_null());
				}
				json_array_append_new(choices, cj);
			}
			json_t *resp = json_pack("{s:s,s:s,s:I,s:s,s:o,s:o}", "id", id, "object", obj, "created",
			                         created, "model", s->model_name, "choices", choices, "usage",
			                         usage_json(j->n_prompt, n_gen_total));
			char *body = resp ? json_dumps(resp, JSON_COMPACT) : NULL;
			if (body)
				srv_send_json(c, 200, body, strlen(body));
			else
				srv_send_error(c, s, 500, NULL, "could not build the response");
			free(body);
			json_decref(resp);
		}
	} else if (!gone) {
		if (!headers_sent) {
			srv_response_start(c, 200);
			mg_response_header_add(c, "Content-Type", "text/event-stream", -1);
			mg_response_header_add(c, "Cache-Control", "no-cache", -1);
			mg_response_header_add(c, "Transfer-Encoding", "chunked", -1);
			mg_response_header_send(c);
		}
		int ok = 0;
		if (cancelled || j->err_status) {
			/* llama.cpp's way to end a stream that failed: an error event, then [DONE] */
			char m[600];
			snprintf(m, sizeof m, "%s", j->err_status ? j->err_msg : timed_out ? "the request timed out (--timeout)"
			                                                                  : "the server is shutting down");
			const int st = j->err_status ? j->err_status : 503;
			ok = sse_send(c, json_pack("{s:{s:s,s:s,s:i}}", "error", "message", m, "type",
			                           st == 503 ? "unavailable_error" : st >= 500 ? "server_error"
			                           : "invalid_request_error", "code", st));
		} else if (a->include_usage) {
			ok = sse_send(c, json_pack("{s:s,s:s,s:I,s:s,s:[],s:o}", "id", id, "object", obj, "created",
			                           created, "model", s->model_name, "choices", "usage",
			                           usage_json(j->n_prompt, n_gen_total)));
		}
		if (!ok)
			ok = mg_send_chunk(c, "data: [DONE]\n\n", 14) > 0 ? 0 : -1;
		if (!ok)
			mg_send_chunk(c, "", 0); /* the chunked body's terminator */
	}
	for (int32_t i = 0; i < j->n; i++) {
		fp4s_tok_text_free(&ch[i].text), fp4s_tok_text_free(&ch[i].reasoning);
		json_decref(ch[i].lp);
	}
}

