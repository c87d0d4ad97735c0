/* srv_http.c: civetweb set-up (engineering.md §4.4) and routing. Every request goes through
 * begin_request, which checks readiness and the API key before dispatching; errors civetweb
 * raises itself (a malformed request line, headers that arrive too slowly) are rewritten by the
 * http_error callback into OpenAI's error shape. */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <civetweb.h>

#include "server/srv.h"
#include "util/log.h"

static int route(struct mg_connection *c, struct srv *s)
{
	const struct mg_request_info *ri = mg_get_request_info(c);
	const char *u = ri->local_uri ? ri->local_uri : "";
	const int get = !strcmp(ri->request_method, "GET"), post = !strcmp(ri->request_method, "POST");
	const int ready = atomic_load(&s->ready);
	if (!strcmp(u, "/health")) {
		if (!get)
			goto method;
		if (!ready || atomic_load(&s->draining)) {
			srv_send_error(c, s, 503, "unavailable_error", ready ? "Shutting down" : "Loading model");
			return 1;
		}
		srv_send_json(c, 200, "{\"status\":\"ok\"}", 15);
		return 1;
	}
	if (!strcmp(u, "/metrics") && !s->o.disable_metrics) {
		if (!get)
			goto method;
		size_t n;
		char *body = srv_metrics_render(s, &n);
		if (!body) {
			srv_send_error(c, s, 500, NULL, "out of memory");
			return 1;
		}
		srv_response_start(c, 200);
		mg_response_header_add(c, "Content-Type", "text/plain; version=0.0.4; charset=utf-8", -1);
		char cl[32];
		snprintf(cl, sizeof cl, "%zu", n);
		mg_response_header_add(c, "Content-Length", cl, -1);
		mg_response_header_send(c);
		mg_write(c, body, n);
		free(body);
		return 1;
	}
	/* everything else needs the key (§5.7) */
	if (!srv_auth_ok(s->o.api_key, mg_get_header(c, "Authorization"))) {
		srv_send_error(c, s, 401, "authentication_error", "Incorrect API key provided. Send it as "
		               "'Authorization: Bearer <key>'.");
		return 1;
	}
	if (!strcmp(u, "/version")) {
		if (!get)
			goto method;
		json_t *v = json_pack("{s:s,s:s}", "version", FP4S_VERSION, "commit", FP4S_GIT_COMMIT);
		char *body = v ? json_dumps(v, JSON_COMPACT) : NULL;
		if (body)
			srv_send_json(c, 200, body, strlen(body));
		free(body);
		json_decref(v);
		return 1;
	}
	static const char *const known[] = {"/v1/models", "/v1/completions", "/v1/chat/completions",
	                                    "/completions", "/chat/completions", "/tokenize",
	                                    "/detokenize", NULL};
	int k = 0;
	while (known[k] && strcmp(known[k], u))
		k++;
	if (!known[k]) {
		srv_send_error(c, s, 404, "not_found_error", "no such endpoint: %s %.200s", ri->request_method, u);
		return 1;
	}
	if (!ready) {
		srv_send_error(c, s, 503, "unavailable_error", "Loading model");
		return 1;
	}
	if (!strcmp(u, "/v1/models"))
		return get ? srv_api_models(c, s) : (srv_send_error(c, s, 405, NULL, "use GET"), 1);
	if (!post)
		goto method;
	if (!strcmp(u, "/tokenize") || !strcmp(u, "/detokenize"))
		return srv_api_tokenize(c, s, u[1] == 'd');
	atomic_fetch_add(&s->in_flight, 1);
	int r = srv_api_completions(c, s, strstr(u, "chat") != NULL);
	atomic_fetch_sub(&s->in_flight, 1);
	return r;
method:
	srv_send_error(c, s, 405, NULL, "method %s is not allowed on %.200s", ri->request_method, u);
	return 1;
}

void srv_response_start(struct mg_connection *c, int status)
{
	char date[64]; /* mg_response_header_add copies it */
	/* RFC 9110's IMF-fixdate; names spelled out here, as strftime's follow the locale */
	static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
	static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
	                                   "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
	const time_t now = time(NULL);
	struct tm tm;
	if (gmtime_r(&now, &tm) && tm.tm_wday >= 0 && tm.tm_wday < 7 && tm.tm_mon >= 0 && tm.tm_mon < 12)
		snprintf(date, sizeof date, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[tm.tm_wday], tm.tm_mday,
		         months[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
	else
		snprintf(date, sizeof date, "Thu, 01 Jan 1970 00:00:00 GMT");
	mg_response_header_start(c, status);
	mg_response_header_add(c, "Date", date, -1);
}

/* civetweb reads and discards the rest of a request body after the handler returns, however
 * slowly it comes, so a client trickling the body it promised would keep the worker after our
 * 408/413. civetweb does not expose the socket: find it by its peer address and shut it down;
 * reads then end at once and the reply already queued is still delivered before the FIN. Only
 * on these error paths, so the scan over descriptors costs nothing on normal requests. */
void srv_http_drop(struct mg_connection *c)
{
	const struct mg_request_info *ri = mg_get_request_info(c);
	struct rlimit rl;
	int max = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 65536 ? (int)rl.rlim_cur : 65536;
	for (int fd = 3; fd < max; fd++) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof ss;
		char addr[INET6_ADDRSTRLEN];
		int port;
		if (getpeername(fd, (struct sockaddr *)&ss, &sl))
			continue;
		if (ss.ss_family == AF_INET) {
			const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
			inet_ntop(AF_INET, &a->sin_addr, addr, sizeof addr);
			port = ntohs(a->sin_port);
		} else if (ss.ss_family == AF_INET6) {
			const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
			inet_ntop(AF_INET6, &a->sin6_addr, addr, sizeof addr);
			port = ntohs(a->sin6_port);
		} else {
			continue;
		}
		if (port == ri->remote_port && !strcmp(addr, ri->remote_addr)) {
			shutdown(fd, SHUT_RDWR);
			return;
		}
	}
}

static int begin_request(struct mg_connection *c)
{
	struct srv *s = mg_get_user_data(mg_get_context(c));
	return route(c, s);
}

static int http_error(struct mg_connection *c, int status, const char *msg)
{
	struct srv *s = mg_get_user_data(mg_get_context(c));
	srv_send_error(c, s, status, NULL, "%s", msg && *msg ? msg : "bad request");
	return 0;
}

static int log_message(const struct mg_connection *c, const char *msg)
{
	FP4S_DEBUG("civetweb: %s", msg);
	return 1;
}

int srv_http_start(struct srv *s, char *msg, size_t msg_len)
{
	char ports[300], threads[16], rto[32], kato[32];
	/* IPv6 literals need brackets in civetweb's listening_ports */
	if (strchr(s->o.host, ':'))
		snprintf(ports, sizeof ports, "[%s]:%d", s->o.host, s->o.port);
	else
		snprintf(ports, sizeof ports, "%s:%d", s->o.host, s->o.port);
	snprintf(threads, sizeof threads, "%d", s->o.threads_http);
	snprintf(rto, sizeof rto, "%.0f", s->o.read_timeout_s * 1000);
	snprintf(kato, sizeof kato, "%d", 5000);
	/* keep-alive is off by default in civetweb; request_timeout_ms bounds header reading and
	 * every single read/write (a stalled reader of a stream is dropped after it) */
	const char *opts[] = {"listening_ports", ports, "num_threads", threads, "request_timeout_ms", rto,
	                      "enable_keep_alive", "yes", "keep_alive_timeout_ms", kato,
	                      "listen_backlog", "1024", "connection_queue", "1024", NULL};
	struct mg_callbacks cb = {0};
	cb.begin_request = begin_request;
	cb.http_error = http_error;
	cb.log_message = log_message;
	mg_init_library(0);
	s->mg = mg_start(&cb, s, opts);
	if (!s->mg) {
		snprintf(msg, msg_len, "cannot listen on %s (port in use, or a bad --host?)", ports);
		mg_exit_library();
		return -1;
	}
	/* --port 0: the kernel picked one (tests run servers side by side); report it */
	struct mg_server_port sp[2];
	if (mg_get_server_ports(s->mg, 2, sp) > 0)
		s->o.port = sp[0].port;
	return 0;
}

void srv_http_stop(struct srv *s)
{
	if (s->mg) {
		mg_stop(s->mg);
		s->mg = NULL;
		mg_exit_library();
	}
}
