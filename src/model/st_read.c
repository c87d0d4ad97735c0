/* st_read.c: safetensors header parsing and checkpoint opening (mmap, sharded index).
 *
 * Checks, in order: the 8-byte length fits in the file and under FP4S_ST_MAX_HEADER; the header
 * is one JSON object without duplicate keys; every entry has a known dtype, at most
 * FP4S_ST_MAX_DIMS non-negative dims, and data_offsets [begin, end] with begin <= end inside
 * the data section; shape product x element size (overflow-checked) equals end - begin; and no
 * two tensors overlap. Gaps between tensors are accepted (the format does not forbid padding). */
#include "model/st.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct {
	const char *name;
	size_t size;
} dtype_traits[] = {
	[FP4S_DT_BF16] = {"BF16", 2}, [FP4S_DT_F16] = {"F16", 2},     [FP4S_DT_F32] = {"F32", 4},
	[FP4S_DT_F8_E4M3] = {"F8_E4M3", 1}, [FP4S_DT_U8] = {"U8", 1}, [FP4S_DT_I8] = {"I8", 1},
	[FP4S_DT_I32] = {"I32", 4}, [FP4S_DT_I64] = {"I64", 8},       [FP4S_DT_BOOL] = {"BOOL", 1},
};
_Static_assert(sizeof dtype_traits / sizeof dtype_traits[0] == FP4S_DT_COUNT,
               "one trait per dtype");

const char *fp4s_dtype_name(enum fp4s_dtype dt)
{
	return (unsigned)dt < FP4S_DT_COUNT ? dtype_traits[dt].name : "?";
}

size_t fp4s_dtype_size(enum fp4s_dtype dt)
{
	return (unsigned)dt < FP4S_DT_COUNT ? dtype_traits[dt].size : 0;
}

int fp4s_dtype_parse(const char *s, enum fp4s_dtype *dt)
{
	for (int i = 0; i < FP4S_DT_COUNT; i++)
		if (!strcmp(s, dtype_traits[i].name)) {
			*dt = (enum fp4s_dtype)i;
			return 0;
		}
	return -1;
}

void fp4s_st_header_free(struct fp4s_st_header *h)
{
	if (!h)
		return;
	for (int32_t i = 0; i < h->n; i++)
		free(h->tensors[i].name);
	free(h->tensors);
	h->tensors = NULL;
	h->n = 0;
}

static int cmp_begin(const void *a, const void *b)
{
	const struct fp4s_st_tensor *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return x->end < y->end ? -1 : x->end > y->end;
}

static int parse_entry(const char *fname, const char *key, json_t *v, uint64_t data_len,
                       struct fp4s_st_tensor *t, struct fp4s_error *err)
{
	if (strlen(key) >= FP4S_ST_MAX_NAME)
		return fp4s_error_set(err, FP4S_EFORMAT, "%s: tensor name of %zu bytes, expected < %d",
		                      fname, strlen(key), FP4S_ST_MAX_NAME);
	if (!json_is_object(v))
		return fp4s_error_set(err, FP4S_EFORMAT, "%s: tensor %s: entry is not a JSON object",
		                      fname, key);
	json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
	       *jo = json_object_get(v, "data_offsets");
	if (!json_is_string(jd))
		return fp4s_error_set(err, FP4S_EFORMAT, "%s: tensor %s: \"dtype\" missing or not a string",
		                      fname, key);
	if (fp4s_dtype_parse(json_string_value(jd), &t->dtype))
		return fp4s_error_set(err, FP4S_EUNSUPPORTED,
		                      "%s: tensor %s: dtype \"%.32s\" is not supported (expected one of "
		                      "BF16 F16 F32 F8_E4M3 U8 I8 I32 I64 BOOL)",
		                      fname, key, json_string_value(jd));
	if (!json_is_array(js) || json_array_size(js) > FP4S_ST_MAX_DIMS)
		return fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: tensor %s: \"shape\" must be an array of at most %d dims",
		                      fname, key, FP4S_ST_MAX_DIMS);
	t->ndim = (int32_t)json_array_size(js);
	/* The element count is computed with an overflow check; any dim past 2^40 is nonsense. */
	uint64_t count = 1;
	int overflow = 0;
	for (int32_t d = 0; d < t->ndim; d++) {
		json_t *x = json_array_get(js, (size_t)d);
		if (!json_is_integer(x) || json_integer_value(x) < 0 ||
		    json_integer_value(x) > FP4S_ST_MAX_DIM)
			return fp4s_error_set(err, FP4S_EFORMAT,
			                      "%s: tensor %s: shape[%d] must be an integer in [0, 2^40]",
			                      fname, key, d);
		t->shape[d] = json_integer_value(x);
		if (__builtin_mul_overflow(count, (uint64_t)t->shape[d], &count))
			overflow = 1;
	}
	uint64_t nbytes;
	if (overflow || __builtin_mul_overflow(count, (uint64_t)fp4s_dtype_size(t->dtype), &nbytes))
		return fp4s_error_set(err, FP4S_EFORMAT, "%s: tensor %s: shape size overflows 64 bits",
		                      fname, key);
	if (!json_is_array(jo) || json_array_size(jo) != 2 ||
	    !json_is_integer(json_array_get(jo, 0)) || !json_is_integer(json_array_get(jo, 1)))
		return fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: tensor %s: \"data_offsets\" must be [begin, end] integers",
		                      fname, key);
	json_int_t b = json_integer_value(json_array_get(jo, 0)),
	           e = json_integer_value(json_array_get(jo, 1));
	if (b < 0 || e < b || (uint64_t)e > data_len)
		return fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: tensor %s: data_offsets [%lld, %lld] outside the data section "
		                      "of %llu bytes (expected 0 <= begin <= end <= %llu)",
		                      fname, key, (long long)b, (long long)e,
		                      (unsigned long long)data_len, (unsigned long long)data_len);
	t->begin = (uint64_t)b;
	t->end = (uint64_t)e;
	if (t->end - t->begin != nbytes)
		return fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: tensor %s: %s shape needs %llu bytes but data_offsets span "
		                      "%llu bytes",
		                      fname, key, fp4s_dtype_name(t->dtype), (unsigned long long)nbytes,
		                      (unsigned long long)(t->end - t->begin));
	t->name = strdup(key);
	if (!t->name)
		return fp4s_error_set(err, FP4S_ENOMEM, "%s: out of memory", fname);
	return FP4S_OK;
}

int fp4s_st_parse(const uint8_t *buf, size_t len, const char *fname, struct fp4s_st_header *h,
                  struct fp4s_error *err)
{
	memset(h, 0, sizeof *h);
	if (len < 8)
		return fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: truncated: %zu bytes, expected at least 8 (the header length)",
		                      fname, len);
	uint64_t hlen = 0;
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | buf[i];
	if (hlen > FP4S_ST_MAX_HEADER)
		return fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: header length %llu exceeds the %llu-byte limit", fname,
		                      (unsigned long long)hlen, (unsigned long long)FP4S_ST_MAX_HEADER);
	if (hlen > len - 8)
		return fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: truncated: header length %llu runs past the end of the "
		                      "%zu-byte file",
		                      fname, (unsigned long long)hlen, len);
	if (hlen < 2 || buf[8] != '{')
		return fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: the header must be a JSON object starting with '{'", fname);
	json_error_t jerr;
	json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return fp4s_error_set(err, FP4S_EFORMAT, "%s: invalid JSON header at byte %d: %s", fname,
		                      jerr.position, jerr.text);
	int rc = FP4S_OK;
	if (!json_is_object(root)) {
		rc = fp4s_error_set(err, FP4S_EFORMAT, "%s: the header is not a JSON object", fname);
		goto out;
	}
	size_t n = json_object_size(root);
	if (n > FP4S_ST_MAX_TENSORS) {
		rc = fp4s_error_set(err, FP4S_EFORMAT, "%s: %zu header entries, limit %d", fname, n,
		                    FP4S_ST_MAX_TENSORS);
		goto out;
	}
	h->tensors = calloc(n ? n : 1, sizeof *h->tensors);
	if (!h->tensors) {
		rc = fp4s_error_set(err, FP4S_ENOMEM, "%s: out of memory", fname);
		goto out;
	}
	h->data_offset = 8 + hlen;
	const uint64_t data_len = len - h->data_offset;
	const char *key;
	json_t *v;
	json_object_foreach(root, key, v) {
		if (!strcmp(key, "__metadata__")) {
			if (!json_is_object(v)) {
				rc = fp4s_error_set(err, FP4S_EFORMAT, "%s: __metadata__ is not an object",
				                    fname);
				goto out;
			}
			continue;
		}
		struct fp4s_st_tensor *t = &h->tensors[h->n];
		rc = parse_entry(fname, key, v, data_len, t, err);
		if (rc)
			goto out;
		t->data = buf + h->data_offset + t->begin;
		h->n++;
	}
	qsort(h->tensors, (size_t)h->n, sizeof *h->tensors, cmp_begin);
	/* Sorted by begin, a tensor overlaps an earlier one iff it starts before the furthest end
	 * seen so far. Empty tensors occupy no bytes: they neither overlap nor extend that end. */
	const struct fp4s_st_tensor *a = NULL;
	for (int32_t i = 0; i < h->n; i++) {
		const struct fp4s_st_tensor *b = &h->tensors[i];
		if (b->end == b->begin)
			continue;
		if (a && b->begin < a->end) {
			rc = fp4s_error_set(err, FP4S_EFORMAT,
			                    "%s: tensors %s [%llu, %llu) and %s [%llu, %llu) overlap", fname,
			                    a->name, (unsigned long long)a->begin,
			                    (unsigned long long)a->end, b->name,
			                    (unsigned long long)b->begin, (unsigned long long)b->end);
			goto out;
		}
		if (!a || b->end > a->end)
			a = b;
	}
out:
	json_decref(root);
	if (rc)
		fp4s_st_header_free(h);
	return rc;
}

/* ---- opening files and folders ---- */

static int map_file(const char *path, struct fp4s_st_file *f, struct fp4s_error *err)
{
	memset(f, 0, sizeof *f);
	f->path = strdup(path);
	if (!f->path)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return fp4s_error_set(err, FP4S_EIO, "%s: cannot open: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		close(fd);
		return fp4s_error_set(err, FP4S_EIO, "%s: not a regular file", path);
	}
	f->size = (size_t)st.st_size;
	if (f->size) {
		void *m = mmap(NULL, f->size, PROT_READ, MAP_SHARED, fd, 0);
		if (m == MAP_FAILED) {
			close(fd);
			return fp4s_error_set(err, FP4S_EIO, "%s: mmap failed: %s", path, strerror(errno));
		}
		f->map = m;
	}
	close(fd);
	return fp4s_st_parse(f->map, f->size, path, &f->hdr, err);
}

static void unmap_file(struct fp4s_st_file *f)
{
	fp4s_st_header_free(&f->hdr);
	if (f->map)
		munmap((void *)f->map, f->size);
	free(f->path);
	memset(f, 0, sizeof *f);
}

static int cmp_name(const void *a, const void *b)
{
	const struct fp4s_st_tensor *const *x = a, *const *y = b;
	return strcmp((*x)->name, (*y)->name);
}

const struct fp4s_st_tensor *fp4s_st_find(const struct fp4s_st_set *set, const char *name)
{
	int32_t lo = 0, hi = set->n - 1;
	while (lo <= hi) {
		int32_t mid = lo + (hi - lo) / 2;
		int c = strcmp(set->by_name[mid]->name, name);
		if (!c)
			return set->by_name[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return NULL;
}

const char *fp4s_st_file_of(const struct fp4s_st_set *set, const struct fp4s_st_tensor *t)
{
	return t && t->file >= 0 && t->file < set->nfiles ? set->files[t->file].path : "?";
}

void fp4s_st_close(struct fp4s_st_set *set)
{
	for (int32_t i = 0; i < set->nfiles; i++)
		unmap_file(&set->files[i]);
	free(set->files);
	free(set->by_name);
	memset(set, 0, sizeof *set);
}

static char *path_join(const char *dir, const char *name)
{
	size_t n = strlen(dir) + strlen(name) + 2;
	char *p = malloc(n);
	if (p)
		snprintf(p, n, "%s/%s", dir, name);
	return p;
}

/* Builds the sorted name index over all files and rejects a name present in two shards. */
static int build_index(struct fp4s_st_set *set, struct fp4s_error *err)
{
	int64_t total = 0;
	for (int32_t i = 0; i < set->nfiles; i++)
		total += set->files[i].hdr.n;
	set->by_name = malloc((size_t)(total ? total : 1) * sizeof *set->by_name);
	if (!set->by_name)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	set->n = 0;
	for (int32_t i = 0; i < set->nfiles; i++)
		for (int32_t j = 0; j < set->files[i].hdr.n; j++) {
			set->files[i].hdr.tensors[j].file = i;
			set->by_name[set->n++] = &set->files[i].hdr.tensors[j];
		}
	qsort(set->by_name, (size_t)set->n, sizeof *set->by_name, cmp_name);
	for (int32_t i = 1; i < set->n; i++)
		if (!strcmp(set->by_name[i - 1]->name, set->by_name[i]->name))
			return fp4s_error_set(err, FP4S_EFORMAT, "tensor %s appears in both %s and %s",
			                      set->by_name[i]->name, fp4s_st_file_of(set, set->by_name[i - 1]),
			                      fp4s_st_file_of(set, set->by_name[i]));
	return FP4S_OK;
}

/* A shard name from the index must be a plain file name: no directories, no "..". */
static int shard_name_ok(const char *s)
{
	return s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 256;
}

static int open_index(const char *dir, const char *ipath, struct fp4s_st_set *set,
                      struct fp4s_error *err)
{
	json_error_t jerr;
	json_t *root = json_load_file(ipath, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return fp4s_error_set(err, FP4S_EFORMAT, "%s: invalid JSON at line %d: %s", ipath,
		                      jerr.line, jerr.text);
	int rc = FP4S_OK;
	json_t *wm = json_object_get(root, "weight_map");
	if (!json_is_object(wm)) {
		rc = fp4s_error_set(err, FP4S_EFORMAT, "%s: \"weight_map\" missing or not an object",
		                    ipath);
		goto out;
	}
	/* Distinct shard names, in first-seen order. */
	size_t nmap = json_object_size(wm);
	const char **names = calloc(nmap ? nmap : 1, sizeof *names);
	set->files = calloc(nmap ? nmap : 1, sizeof *set->files);
	if (!names || !set->files) {
		free(names);
		rc = fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
		goto out;
	}
	int32_t nn = 0;
	const char *key;
	json_t *v;
	json_object_foreach(wm, key, v) {
		if (!json_is_string(v) || !shard_name_ok(json_string_value(v))) {
			free(names);
			rc = fp4s_error_set(err, FP4S_EFORMAT,
			                    "%s: weight_map[%s] must be a file name in the same folder",
			                    ipath, key);
			goto out;
		}
		const char *s = json_string_value(v);
		int32_t k = 0;
		for (; k < nn; k++)
			if (!strcmp(names[k], s))
				break;
		if (k == nn) {
			/* The dedupe is quadratic in shards; real checkpoints have at most a few hundred. */
			if (nn == 4096) {
				free(names);
				rc = fp4s_error_set(err, FP4S_EFORMAT, "%s: more than 4096 shard files", ipath);
				goto out;
			}
			names[nn++] = s;
		}
	}
	for (int32_t k = 0; k < nn && !rc; k++) {
		char *p = path_join(dir, names[k]);
		if (!p) {
			rc = fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
			break;
		}
		rc = map_file(p, &set->files[set->nfiles++], err);
		free(p);
	}
	free(names);
	if (!rc)
		rc = build_index(set, err);
	if (rc)
		goto out;
	/* Every tensor the index promises must be in the shard it names. */
	json_object_foreach(wm, key, v) {
		const struct fp4s_st_tensor *t = fp4s_st_find(set, key);
		const char *want = json_string_value(v);
		if (!t) {
			rc = fp4s_error_set(err, FP4S_EFORMAT,
			                    "%s: tensor %s is listed in the index (shard %s) but missing "
			                    "from every shard",
			                    ipath, key, want);
			goto out;
		}
		const char *got = fp4s_st_file_of(set, t);
		const char *base = strrchr(got, '/');
		base = base ? base + 1 : got;
		if (strcmp(base, want)) {
			rc = fp4s_error_set(err, FP4S_EFORMAT,
			                    "%s: tensor %s is listed in shard %s but found in %s", ipath, key,
			                    want, got);
			goto out;
		}
	}
out:
	json_decref(root);
	return rc;
}

int fp4s_st_open(const char *path, struct fp4s_st_set *set, struct fp4s_error *err)
{
	memset(set, 0, sizeof *set);
	struct stat st;
	if (stat(path, &st))
		return fp4s_error_set(err, FP4S_EIO, "%s: %s", path, strerror(errno));
	int rc;
	if (S_ISREG(st.st_mode)) {
		set->files = calloc(1, sizeof *set->files);
		if (!set->files)
			return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
		set->nfiles = 1;
		rc = map_file(path, &set->files[0], err);
		if (!rc)
			rc = build_index(set, err);
	} else {
		char *ip = path_join(path, "model.safetensors.index.json");
		char *sp = path_join(path, "model.safetensors");
		if (!ip || !sp) {
			free(ip);
			free(sp);
			return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
		}
		if (access(ip, R_OK) == 0) {
			rc = open_index(path, ip, set, err);
		} else if (access(sp, R_OK) == 0) {
			set->files = calloc(1, sizeof *set->files);
			rc = set->files ? FP4S_OK : fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
			if (!rc) {
				set->nfiles = 1;
				rc = map_file(sp, &set->files[0], err);
			}
			if (!rc)
				rc = build_index(set, err);
		} else {
			rc = fp4s_error_set(err, FP4S_EIO,
			                    "%s: no model.safetensors.index.json or model.safetensors", path);
		}
		free(ip);
		free(sp);
	}
	if (rc)
		fp4s_st_close(set);
	return rc;
}
