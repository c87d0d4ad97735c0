/* st.h: safetensors reading (single file or sharded with model.safetensors.index.json) and
 * writing. Files are mmapped read-only; a tensor is a name, a dtype, a shape and a pointer into
 * the mapping. Headers are untrusted input: every size is bounded and checked before use, and
 * every failure comes back as an FP4S_E* code with a message naming the file and the tensor. */
#ifndef FP4S_ST_H
#define FP4S_ST_H

#include <stddef.h>
#include <stdint.h>

#include "util/status.h"

enum fp4s_dtype {
	FP4S_DT_BF16 = 0,
	FP4S_DT_F16,
	FP4S_DT_F32,
	FP4S_DT_F8_E4M3,
	FP4S_DT_U8,
	FP4S_DT_I8,
	FP4S_DT_I32,
	FP4S_DT_I64,
	FP4S_DT_BOOL,
	FP4S_DT_COUNT
};

enum {
	FP4S_ST_MAX_DIMS = 8,
	FP4S_ST_MAX_NAME = 512,
};
/* The largest header we accept; HF headers for 100k-tensor checkpoints are a few MB. */
#define FP4S_ST_MAX_HEADER (100ull << 20)
/* Upper bounds that keep the header parser's allocations and products small. */
#define FP4S_ST_MAX_TENSORS (1 << 20)
#define FP4S_ST_MAX_DIM (1ll << 40)

const char *fp4s_dtype_name(enum fp4s_dtype dt);
/* Bytes per element (BOOL counts as 1). */
size_t fp4s_dtype_size(enum fp4s_dtype dt);
/* Parses a safetensors dtype string ("BF16", "F8_E4M3", ...); returns -1 if unknown. */
int fp4s_dtype_parse(const char *s, enum fp4s_dtype *dt);

struct fp4s_st_tensor {
	char *name;
	enum fp4s_dtype dtype;
	int32_t ndim;
	int64_t shape[FP4S_ST_MAX_DIMS];
	uint64_t begin, end;   /* byte offsets relative to the data section */
	const uint8_t *data;   /* begin resolved against the mapping */
	int32_t file;          /* index into the set's files */
};

/* One parsed header. tensors are sorted by data offset after a successful parse. */
struct fp4s_st_header {
	struct fp4s_st_tensor *tensors;
	int32_t n;
	uint64_t data_offset; /* 8 + header length */
};

/* Parses and checks the header of a safetensors file held in buf[0..len) (the whole file).
 * fname only names the file in messages. On success the tensor data pointers point into buf. */
int fp4s_st_parse(const uint8_t *buf, size_t len, const char *fname, struct fp4s_st_header *h,
                  struct fp4s_error *err);
void fp4s_st_header_free(struct fp4s_st_header *h);

struct fp4s_st_file {
	char *path;
	const uint8_t *map;
	size_t size;
	struct fp4s_st_header hdr;
};

/* All tensors of a checkpoint folder, looked up by name. */
struct fp4s_st_set {
	struct fp4s_st_file *files;
	int32_t nfiles;
	const struct fp4s_st_tensor **by_name; /* sorted by name */
	int32_t n;
};

/* Opens DIR/model.safetensors.index.json and its shards, or else DIR/model.safetensors, or a
 * single .safetensors file when path names one. */
int fp4s_st_open(const char *path, struct fp4s_st_set *set, struct fp4s_error *err);
void fp4s_st_close(struct fp4s_st_set *set);
const struct fp4s_st_tensor *fp4s_st_find(const struct fp4s_st_set *set, const char *name);
const char *fp4s_st_file_of(const struct fp4s_st_set *set, const struct fp4s_st_tensor *t);

/* ---- writing ----
 * A writer is planned first (every tensor's name, dtype and shape, in file order), which fixes
 * every offset; then data is written with fp4s_st_write_at from any thread, in any order. That is
 * what lets gen/quantize stream a model in parallel without holding it in memory. */
struct fp4s_st_wtensor {
	char *name;
	enum fp4s_dtype dtype;
	int32_t ndim;
	int64_t shape[FP4S_ST_MAX_DIMS];
	uint64_t nbytes;
	int32_t shard;
	uint64_t offset; /* absolute file offset of the data */
};

struct fp4s_st_writer {
	char *dir;
	struct fp4s_st_wtensor *t;
	int32_t n, cap;
	int32_t nshards;
	int *fds;
	uint64_t max_shard_bytes;
	uint64_t total_bytes;
};

void fp4s_st_writer_init(struct fp4s_st_writer *w, const char *dir, uint64_t max_shard_bytes);
/* Adds a tensor; returns its index or a negative code. */
int fp4s_st_writer_add(struct fp4s_st_writer *w, const char *name, enum fp4s_dtype dt, int32_t ndim,
                       const int64_t *shape, struct fp4s_error *err);
/* Assigns shards, writes headers (and the index when sharded), sizes the files. */
int fp4s_st_writer_begin(struct fp4s_st_writer *w, struct fp4s_error *err);
int fp4s_st_write_at(struct fp4s_st_writer *w, int32_t idx, uint64_t off, const void *data,
                     size_t n, struct fp4s_error *err);
int fp4s_st_writer_finish(struct fp4s_st_writer *w, struct fp4s_error *err);
void fp4s_st_writer_free(struct fp4s_st_writer *w);

#endif
