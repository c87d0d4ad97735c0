#include "util/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int fp4s_error_set(struct fp4s_error *err, int code, const char *fmt, ...)
{
	va_list ap;
	if (!err)
		return code;
	err->code = code;
	va_start(ap, fmt);
	vsnprintf(err->msg, sizeof err->msg, fmt, ap);
	va_end(ap);
	return code;
}

int fp4s_error_prefix(struct fp4s_error *err, const char *fmt, ...)
{
	char prefix[512], old[sizeof err->msg];
	va_list ap;
	if (!err)
		return FP4S_EINVAL;
	va_start(ap, fmt);
	vsnprintf(prefix, sizeof prefix, fmt, ap);
	va_end(ap);
	size_t n = strlen(prefix);
	memcpy(old, err->msg, sizeof old);
	if (n >= sizeof err->msg)
		n = sizeof err->msg - 1;
	memcpy(err->msg, prefix, n);
	/* the message keeps as much of the old text as fits after the prefix */
	size_t m = strnlen(old, sizeof old - 1);
	if (m > sizeof err->msg - 1 - n)
		m = sizeof err->msg - 1 - n;
	memcpy(err->msg + n, old, m);
	err->msg[n + m] = 0;
	return err->code;
}

const char *fp4s_status_name(int code)
{
	switch (code) {
	case FP4S_OK: return "ok";
	case FP4S_EINVAL: return "invalid argument";
	case FP4S_EIO: return "i/o error";
	case FP4S_ENOMEM: return "out of memory";
	case FP4S_EFORMAT: return "malformed input";
	case FP4S_EUNSUPPORTED: return "unsupported";
	case FP4S_ECUDA: return "cuda error";
	case FP4S_ENODEV: return "no device";
	default: return "unknown error";
	}
}
