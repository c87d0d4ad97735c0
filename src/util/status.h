/* status.h: error codes and messages. Library functions return 0 or a negative FP4S_E* code and,
 * when given a struct fp4s_error, fill it with a message that names what was wrong (the file, the
 * tensor, the expected and found values). Nothing in the library exits on bad input. */
#ifndef FP4S_STATUS_H
#define FP4S_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

enum fp4s_status {
	FP4S_OK = 0,
	FP4S_EINVAL = -1,      /* bad argument or value */
	FP4S_EIO = -2,         /* a file could not be opened, read, mapped or written */
	FP4S_ENOMEM = -3,      /* an allocation failed */
	FP4S_EFORMAT = -4,     /* malformed input data (checkpoint, JSON, tokenizer) */
	FP4S_EUNSUPPORTED = -5, /* well-formed but not supported (architecture, dtype, scheme) */
	FP4S_ECUDA = -6,       /* a CUDA call failed */
	FP4S_ENODEV = -7,      /* no usable device */
};

struct fp4s_error {
	int code;
	char msg[1024];
};

/* Records code and message in err (if err is non-NULL) and returns code, so a caller can write
 * `return fp4s_error_set(err, FP4S_EINVAL, "K=%lld is not a multiple of 16", k);`. */
int fp4s_error_set(struct fp4s_error *err, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Prepends context ("loading model.safetensors: ") to an existing message. Returns err->code. */
int fp4s_error_prefix(struct fp4s_error *err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

const char *fp4s_status_name(int code);

#ifdef __cplusplus
}
#endif

#endif
