/* nfc_ref.h: the tests' NFC reference: utf8proc_NFC, except around the Hangul jamo U+11A7.
 *
 * utf8proc before 2.11 (Debian ships 2.8.0) composes an LV syllable with U+11A7 and drops the
 * jamo: NFC(U+1100 U+1161 U+11A7) comes out U+AC00, where Unicode gives U+AC00 U+11A7. U+11A7
 * is T_BASE, not a trailing consonant (those are U+11A8..U+11C2), so it composes with nothing
 * (fixed upstream in utf8proc pull request 317). It is a starter with no composition on either
 * side, so NFC of a text is the NFC of the runs between its U+11A7s, joined by them; that is
 * what t_nfc_ref computes (utf8proc_NFC's options, run by run). The tokenizer's own NFC never
 * hands U+11A7 to utf8proc (it is one of its safe code points, tok_nfc_table), so it gives
 * Unicode's answer, as Hugging Face's tokenizers do; the fuzzer found the reference wrong, not
 * the encoder.
 * s: valid UTF-8, NUL-terminated. Returns malloc'd NUL-terminated text, NULL on failure. */
#ifndef FP4S_TEST_NFC_REF_H
#define FP4S_TEST_NFC_REF_H

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static inline utf8proc_uint8_t *t_nfc_ref(const utf8proc_uint8_t *s)
{
	static const char tb[] = "\xE1\x86\xA7"; /* U+11A7 */
	const char *p = (const char *)s;
	char *out = NULL;
	size_t on = 0;
	for (;;) {
		const char *q = strstr(p, tb);
		const size_t len = q ? (size_t)(q - p) : strlen(p);
		/* utf8proc_NFC's options, on the run in place (no NUL needed) */
		utf8proc_uint8_t *np = NULL;
		const utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)p, (utf8proc_ssize_t)len, &np,
		                                        UTF8PROC_STABLE | UTF8PROC_COMPOSE);
		char *grown = k >= 0 ? realloc(out, on + (size_t)k + 4) : NULL;
		if (!grown) {
			free(np);
			break;
		}
		out = grown;
		memcpy(out + on, np, (size_t)k);
		on += (size_t)k;
		free(np);
		if (!q) {
			out[on] = 0;
			return (utf8proc_uint8_t *)out;
		}
		memcpy(out + on, tb, 3);
		on += 3;
		p = q + 3;
	}
	free(out);
	return NULL;
}

#endif
