/* model_test_util.h: helpers for the model tests: temp folders, generating tiny checkpoints,
 * patching bytes of a written checkpoint in place. */
#ifndef FP4S_MODEL_TEST_UTIL_H
#define FP4S_MODEL_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/mwrite.h"
#include "model/st.h"

static inline char *mt_tmpdir(void)
{
	char *d = strdup("/tmp/fp4s-model-XXXXXX");
	if (!mkdtemp(d)) {
		perror("mkdtemp");
		exit(1);
	}
	return d;
}

static inline void mt_rmtree(const char *d)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
	if (system(cmd) != 0)
		fprintf(stderr, "warning: could not remove %s\n", d);
}

static inline char *mt_path(const char *dir, const char *name)
{
	char *p = malloc(strlen(dir) + strlen(name) + 2);
	sprintf(p, "%s/%s", dir, name);
	return p;
}

static inline int mt_gen(const char *preset, const char *dir, enum fp4s_qformat f, uint64_t seed,
                  uint64_t shard_bytes)
{
	struct fp4s_write_opts o = {.format = f, .seed = seed, .shard_bytes = shard_bytes};
	struct fp4s_error err = {0};
	int rc = fp4s_gen(preset, dir, &o, &err);
	if (rc)
		fprintf(stderr, "gen %s: %s\n", preset, err.msg);
	return rc;
}

static inline uint8_t *mt_read(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long sz = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *b = malloc((size_t)sz + 1);
	*n = fread(b, 1, (size_t)sz, f);
	b[*n] = 0;
	fclose(f);
	return b;
}

static inline int mt_write(const char *path, const void *b, size_t n)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return -1;
	size_t k = fwrite(b, 1, n, f);
	fclose(f);
	return k == n ? 0 : -1;
}

/* Replaces the first occurrence of old by new (same length) in the file; 0 on success. */
static inline int mt_patch(const char *path, const char *old, const char *new_)
{
	size_t n, m = strlen(old);
	uint8_t *b = mt_read(path, &n);
	if (!b || strlen(new_) != m)
		return -1;
	for (size_t i = 0; i + m <= n; i++)
		if (!memcmp(b + i, old, m)) {
			memcpy(b + i, new_, m);
			int rc = mt_write(path, b, n);
			free(b);
			return rc;
		}
	free(b);
	return -1;
}

/* Overwrites bytes of one tensor's data in a single-file checkpoint. */
static inline int mt_patch_tensor(const char *path, const char *tensor, uint64_t off, const void *v,
                           size_t len)
{
	size_t n;
	uint8_t *b = mt_read(path, &n);
	struct fp4s_st_header h;
	struct fp4s_error err;
	if (!b || fp4s_st_parse(b, n, path, &h, &err))
		return -1;
	int rc = -1;
	for (int32_t i = 0; i < h.n; i++)
		if (!strcmp(h.tensors[i].name, tensor) && off + len <= h.tensors[i].end - h.tensors[i].begin) {
			memcpy(b + h.data_offset + h.tensors[i].begin + off, v, len);
			rc = mt_write(path, b, n);
		}
	fp4s_st_header_free(&h);
	free(b);
	return rc;
}

/* Feeds every file of $FP4S_SOURCE_DIR/tests/fuzz/<corpus> to a fuzz target's entry point (so CI
 * without libFuzzer still replays the saved inputs, under the sanitizers in the ASan build).
 * Returns the number of files, -1 if the folder is missing; *unreadable counts files that could
 * not be read. */
static inline int mt_replay_corpus(const char *corpus, int (*target)(const uint8_t *, size_t),
                                   int *unreadable)
{
	const char *src = getenv("FP4S_SOURCE_DIR");
	char dir[4096];
	snprintf(dir, sizeof dir, "%s/tests/fuzz/%s", src ? src : ".", corpus);
	DIR *d = opendir(dir);
	if (!d)
		return -1;
	struct dirent *e;
	int n = 0;
	*unreadable = 0;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char *p = mt_path(dir, e->d_name);
		size_t len = 0;
		uint8_t *b = mt_read(p, &len);
		if (b)
			target(b, len);
		else
			(*unreadable)++;
		n++;
		free(b);
		free(p);
	}
	closedir(d);
	return n;
}

#endif
