/* fuzz_util.h: what more than one fuzz target checks. */
#ifndef FP4S_FUZZ_UTIL_H
#define FP4S_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <utf8proc.h>

/* Well-formed UTF-8 by utf8proc, not by our tokenizer's own helpers: the oracle stays independent. */
static inline int fuzz_valid_utf8(const uint8_t *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		utf8proc_int32_t cp;
		utf8proc_ssize_t l = utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &cp);
		if (l <= 0)
			return 0;
		i += (size_t)l;
	}
	return 1;
}

#endif
