/* st_write.c: planned, parallel safetensors writing. All tensors are declared first; begin()
 * lays them out into shards of at most max_shard_bytes (a tensor larger than that gets a shard
 * of its own), writes each shard's header (padded with spaces to 8 bytes, as the HF writer
 * does, so data stays aligned), sizes the files, and writes model.safetensors.index.json when
 * there is more than one shard. Data then goes in with pwrite at fixed offsets. */
#include "model/st.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

void fp4s_st_writer_init(struct fp4s_st_writer *w, const char *dir, uint64_t max_shard_bytes)
{
	memset(w, 0, sizeof *w);
	w->dir = strdup(dir);
	w->max_shard_bytes = max_shard_bytes ? max_shard_bytes : UINT64_MAX;
}

int fp4s_st_writer_add(struct fp4s_st_writer *w, const char *name, enum fp4s_dtype dt, int32_t ndim,
                       const int64_t *shape, struct fp4s_error *err)
{
	if (ndim < 0 || ndim > FP4S_ST_MAX_DIMS)
		return fp4s_error_set(err, FP4S_EINVAL, "tensor %s: %d dims", name, ndim);
	if (w->n == w->cap) {
		int32_t cap = w->cap ? w->cap * 2 : 256;
		void *p = realloc(w->t, (size_t)cap * sizeof *w->t);
		if (!p)
			return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
		w->t = p;
		w->cap = cap;
	}
	struct fp4s_st_wtensor *t = &w->t[w->n];
	memset(t, 0, sizeof *t);
	t->name = strdup(name);
	if (!t->name)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	t->dtype = dt;
	t->ndim = ndim;
	uint64_t count = 1;
	for (int32_t i = 0; i < ndim; i++) {
		t->shape[i] = shape[i];
		count *= (uint64_t)shape[i];
	}
	t->nbytes = count * fp4s_dtype_size(dt);
	return w->n++;
}

static char *shard_name(int32_t i, int32_t n)
{
	char *s = malloc(64);
	if (!s)
		return NULL;
	if (n == 1)
		snprintf(s, 64, "model.safetensors");
	else
		snprintf(s, 64, "model-%05d-of-%05d.safetensors", i + 1, n);
	return s;
}

static int write_all(int fd, const void *p, size_t n, uint64_t off)
{
	const char *c = p;
	while (n) {
		ssize_t k = pwrite(fd, c, n, (off_t)off);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		c += k;
		n -= (size_t)k;
		off += (uint64_t)k;
	}
	return 0;
}

static int write_index(struct fp4s_st_writer *w, struct fp4s_error *err)
{
	json_t *root = json_object(), *meta = json_object(), *wm = json_object();
	json_object_set_new(meta, "total_size", json_integer((json_int_t)w->total_bytes));
	json_object_set_new(root, "metadata", meta);
	for (int32_t i = 0; i < w->n; i++) {
		char *s = shard_name(w->t[i].shard, w->nshards);
		json_object_set_new(wm, w->t[i].name, json_string(s));
		free(s);
	}
	json_object_set_new(root, "weight_map", wm);
	size_t n = strlen(w->dir) + 64;
	char *p = malloc(n);
	snprintf(p, n, "%s/model.safetensors.index.json", w->dir);
	int rc = json_dump_file(root, p, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(root);
	if (rc) {
		rc = fp4s_error_set(err, FP4S_EIO, "%s: cannot write", p);
		free(p);
		return rc;
	}
	free(p);
	return FP4S_OK;
}

/* The shards are sized with ftruncate (sparse), so a filesystem without room for them fails
 * only once the pwrites reach the end of its space, minutes into a large checkpoint (61 GB for
 * gpt-oss-120b). Checks the room first: free space plus what the shards of the same names hold
 * now (they are truncated). Where statvfs cannot tell, the writes decide. */
static int check_room(const struct fp4s_st_writer *w, struct fp4s_error *err)
{
	struct statvfs fs;
	if (statvfs(w->dir, &fs))
		return FP4S_OK;
	uint64_t room = (uint64_t)fs.f_bavail * (uint64_t)fs.f_frsize;
	for (int32_t s = 0; s < w->nshards; s++) {
		char *name = shard_name(s, w->nshards), path[4200];
		struct stat st;
		if (!name)
			return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
		snprintf(path, sizeof path, "%s/%s", w->dir, name);
		free(name);
		if (!stat(path, &st) && S_ISREG(st.st_mode))
			room += (uint64_t)st.st_blocks * 512u;
	}
	if (w->total_bytes > room)
		return fp4s_error_set(err, FP4S_EIO,
		                      "%s: %.2f GB of tensors to write but only %.2f GB free on its "
		                      "filesystem",
		                      w->dir, (double)w->total_bytes / 1e9, (double)room / 1e9);
	return FP4S_OK;
}

int fp4s_st_writer_begin(struct fp4s_st_writer *w, struct fp4s_error *err)
{
	/* Greedy sharding in declaration order keeps each layer's tensors together. */
	int32_t shard = 0;
	uint64_t used = 0;
	w->total_bytes = 0;
	for (int32_t i = 0; i < w->n; i++) {
		if (used && used + w->t[i].nbytes > w->max_shard_bytes) {
			shard++;
			used = 0;
		}
		w->t[i].shard = shard;
		used += w->t[i].nbytes;
		w->total_bytes += w->t[i].nbytes;
	}
	w->nshards = shard + 1;
	int rc0 = check_room(w, err);
	if (rc0)
		return rc0;
	w->fds = malloc((size_t)w->nshards * sizeof *w->fds);
	if (!w->fds)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	for (int32_t s = 0; s < w->nshards; s++)
		w->fds[s] = -1;
	for (int32_t s = 0; s < w->nshards; s++) {
		json_t *root = json_object();
		uint64_t off = 0;
		for (int32_t i = 0; i < w->n; i++) {
			struct fp4s_st_wtensor *t = &w->t[i];
			if (t->shard != s)
				continue;
			json_t *e = json_object(), *sh = json_array(), *of = json_array();
			json_object_set_new(e, "dtype", json_string(fp4s_dtype_name(t->dtype)));
			for (int32_t d = 0; d < t->ndim; d++)
				json_array_append_new(sh, json_integer(t->shape[d]));
			json_object_set_new(e, "shape", sh);
			json_array_append_new(of, json_integer((json_int_t)off));
			json_array_append_new(of, json_integer((json_int_t)(off + t->nbytes)));
			json_object_set_new(e, "data_offsets", of);
			json_object_set_new(root, t->name, e);
			t->offset = off; /* relative for now */
			off += t->nbytes;
		}
		json_t *meta = json_object();
		json_object_set_new(meta, "format", json_string("pt"));
		json_object_set_new(root, "__metadata__", meta);
		char *hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
		json_decref(root);
		if (!hdr)
			return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
		size_t hl = strlen(hdr), padded = (hl + 7) & ~(size_t)7;
		char *buf = malloc(8 + padded);
		if (!buf) {
			free(hdr);
			return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
		}
		for (int b = 0; b < 8; b++)
			buf[b] = (char)((uint64_t)padded >> (8 * b));
		memcpy(buf + 8, hdr, hl);
		memset(buf + 8 + hl, ' ', padded - hl);
		free(hdr);
		char *name = shard_name(s, w->nshards);
		size_t pn = strlen(w->dir) + strlen(name) + 2;
		char *path = malloc(pn);
		snprintf(path, pn, "%s/%s", w->dir, name);
		free(name);
		int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		int rc = FP4S_OK;
		if (fd < 0 || write_all(fd, buf, 8 + padded, 0) ||
		    ftruncate(fd, (off_t)(8 + padded + off)))
			rc = fp4s_error_set(err, FP4S_EIO, "%s: cannot write: %s", path, strerror(errno));
		free(buf);
		free(path);
		w->fds[s] = fd;
		if (rc)
			return rc;
		for (int32_t i = 0; i < w->n; i++)
			if (w->t[i].shard == s)
				w->t[i].offset += 8 + padded;
	}
	if (w->nshards > 1)
		return write_index(w, err);
	return FP4S_OK;
}

int fp4s_st_write_at(struct fp4s_st_writer *w, int32_t idx, uint64_t off, const void *data,
                     size_t n, struct fp4s_error *err)
{
	struct fp4s_st_wtensor *t = &w->t[idx];
	if (off + n > t->nbytes)
		return fp4s_error_set(err, FP4S_EINVAL, "tensor %s: write [%llu, +%zu) past %llu bytes",
		                      t->name, (unsigned long long)off, n, (unsigned long long)t->nbytes);
	if (write_all(w->fds[t->shard], data, n, t->offset + off))
		return fp4s_error_set(err, FP4S_EIO, "tensor %s: write failed: %s", t->name,
		                      strerror(errno));
	return FP4S_OK;
}

int fp4s_st_writer_finish(struct fp4s_st_writer *w, struct fp4s_error *err)
{
	int rc = FP4S_OK;
	for (int32_t s = 0; s < w->nshards; s++) {
		if (w->fds[s] >= 0 && close(w->fds[s]) && !rc)
			rc = fp4s_error_set(err, FP4S_EIO, "closing shard %d: %s", s, strerror(errno));
		w->fds[s] = -1;
	}
	return rc;
}

void fp4s_st_writer_free(struct fp4s_st_writer *w)
{
	if (w->fds)
		for (int32_t s = 0; s < w->nshards; s++)
			if (w->fds[s] >= 0)
				close(w->fds[s]);
	for (int32_t i = 0; i < w->n; i++)
		free(w->t[i].name);
	free(w->t);
	free(w->fds);
	free(w->dir);
	memset(w, 0, sizeof *w);
}
