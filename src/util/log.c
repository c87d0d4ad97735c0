#include "util/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_level = -1; /* -1: not yet read from the environment */
static int g_json;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

int fp4s_log_parse_level(const char *name, enum fp4s_log_level *out)
{
	for (int i = 0; i < 4; i++) {
		if (strcmp(name, level_names[i]) == 0) {
			*out = (enum fp4s_log_level)i;
			return 0;
		}
	}
	return -1;
}

void fp4s_log_set_level(enum fp4s_log_level level) { g_level = (int)level; }
void fp4s_log_set_json(int json) { g_json = json; }

int fp4s_log_enabled(enum fp4s_log_level level)
{
	if (g_level < 0) {
		enum fp4s_log_level l = FP4S_LOG_INFO;
		const char *env = getenv("FP4S_LOG_LEVEL");
		if (env)
			fp4s_log_parse_level(env, &l);
		g_level = (int)l;
	}
	return (int)level <= g_level;
}

void fp4s_log(enum fp4s_log_level level, const char *fmt, ...)
{
	char msg[2048], line[2304];
	struct timespec ts;
	struct tm tm;
	va_list ap;
	int n;
	if (!fp4s_log_enabled(level))
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	if (g_json) {
		/* Messages are ours, but may quote user input: escape the JSON specials. */
		char esc[sizeof msg * 2];
		size_t j = 0;
		for (size_t i = 0; msg[i] && j + 7 < sizeof esc; i++) {
			unsigned char c = (unsigned char)msg[i];
			if (c == '"' || c == '\\') {
				esc[j++] = '\\';
				esc[j++] = (char)c;
			} else if (c < 0x20) {
				j += (size_t)snprintf(esc + j, sizeof esc - j, "\\u%04x", c);
			} else {
				esc[j++] = (char)c;
			}
		}
		esc[j] = 0;
		n = snprintf(line, sizeof line,
		             "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"level\":\"%s\",\"msg\":\"%s\"}\n",
		             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
		             ts.tv_nsec / 1000000, level_names[level], esc);
	} else {
		n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03ld %-5s %s\n", tm.tm_hour, tm.tm_min,
		             tm.tm_sec, ts.tv_nsec / 1000000, level_names[level], msg);
	}
	if (n > (int)sizeof line - 1)
		n = (int)sizeof line - 1;
	if (write(2, line, (size_t)n) < 0) {
		/* stderr gone: nothing more to do */
	}
}
