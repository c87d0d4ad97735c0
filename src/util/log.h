/* log.h: levelled logging to stderr, one write per line so lines from threads stay whole.
 * Level from FP4S_LOG_LEVEL (error|warn|info|debug) or fp4s_log_set_level; stdout is left to
 * program output (generated text, token ids). */
#ifndef FP4S_LOG_H
#define FP4S_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

enum fp4s_log_level { FP4S_LOG_ERROR = 0, FP4S_LOG_WARN, FP4S_LOG_INFO, FP4S_LOG_DEBUG };

void fp4s_log_set_level(enum fp4s_log_level level);
/* Parses "error"/"warn"/"info"/"debug"; returns 0, or -1 for an unknown name. */
int fp4s_log_parse_level(const char *name, enum fp4s_log_level *out);
void fp4s_log_set_json(int json);
int fp4s_log_enabled(enum fp4s_log_level level);
void fp4s_log(enum fp4s_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define FP4S_ERROR(...) fp4s_log(FP4S_LOG_ERROR, __VA_ARGS__)
#define FP4S_WARN(...) fp4s_log(FP4S_LOG_WARN, __VA_ARGS__)
#define FP4S_INFO(...) fp4s_log(FP4S_LOG_INFO, __VA_ARGS__)
#define FP4S_DEBUG(...) fp4s_log(FP4S_LOG_DEBUG, __VA_ARGS__)

#ifdef __cplusplus
}
#endif

#endif
