/* srv_auth.c: API keys (engineering.md §5.7). The key comes from --api-key, --api-key-file or
 * FP4SERVE_API_KEY; requests carry `Authorization: Bearer <key>`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/srv.h"

/* Constant time in the expected key's length: every byte of it is compared whatever the input,
 * and a length difference is folded into the result instead of returning early. */
int srv_auth_ok(const char *expected, const char *header)
{
	if (!expected || !*expected)
		return 1;
	if (!header || strncasecmp(header, "Bearer ", 7) != 0)
		return 0;
	const char *got = header + 7;
	while (*got == ' ')
		got++;
	const size_t n = strlen(expected), m = strnlen(got, 4096);
	volatile unsigned char diff = (unsigned char)(n != m);
	for (size_t i = 0; i < n; i++) {
		const unsigned char g = i < m ? (unsigned char)got[i] : 0;
		diff |= (unsigned char)(g ^ (unsigned char)expected[i]);
	}
	return diff == 0;
}

int srv_auth_load_key(const char *file, char **key, char *msg, size_t msg_len)
{
	FILE *f = fopen(file, "rb");
	if (!f) {
		snprintf(msg, msg_len, "cannot read --api-key-file %s", file);
		return -1;
	}
	char buf[4097];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	/* the first line, without surrounding white space */
	buf[strcspn(buf, "\r\n")] = 0;
	char *p = buf;
	while (*p == ' ' || *p == '\t')
		p++;
	size_t l = strlen(p);
	while (l && (p[l - 1] == ' ' || p[l - 1] == '\t'))
		p[--l] = 0;
	if (!l) {
		snprintf(msg, msg_len, "--api-key-file %s holds no key", file);
		return -1;
	}
	*key = strdup(p);
	return *key ? 0 : -1;
}
