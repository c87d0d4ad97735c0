/* model.h: a loaded checkpoint. Opening a folder parses config.json, detects the quantization
 * scheme, maps the safetensors, expands the architecture's tensor table and validates every
 * tensor against it (presence, dtype, shape, scales). The result is an array of typed weight
 * descriptors pointing into the read-only mappings; nothing is copied or converted. A backend
 * later walks them with fp4s_model_upload.
 *
 * Fused siblings (q/k/v, gate/up) keep one per-tensor scale each (ws2 per shard): formats.md
 * §5.1 explains why taking the max over the group would be wrong when the block scales were
 * computed with different ones. */
#ifndef FP4S_MODEL_H
#define FP4S_MODEL_H

#include <stdint.h>

#include "model/cfg.h"
#include "model/qscheme.h"
#include "model/st.h"
#include "model/tensors.h"

#ifdef __cplusplus
extern "C" {
#endif

enum fp4s_wformat {
	FP4S_WF_BF16 = 0,
	FP4S_WF_F16,
	FP4S_WF_F32,
	FP4S_WF_NVFP4,
	FP4S_WF_MXFP4,
	FP4S_WF_COUNT
};

struct fp4s_weight {
	const struct fp4s_tspec *spec; /* name, role, class, layer, expert, logical shape */
	enum fp4s_wformat fmt;
	int32_t present;       /* 0 for an optional tensor the checkpoint lacks */
	int32_t transposed;    /* BF16 gpt-oss experts: stored [E, in, out] */
	/* Stored data: the plain tensor, the packed E2M1 codes (NVFP4 weight / weight_packed, MXFP4
	 * _blocks), and the block scales (E4M3 or E8M0), linear row-major. */
	const void *data;
	uint64_t data_bytes;
	const uint8_t *scales;
	uint64_t scale_bytes;
	float ws2;             /* NVFP4 per-tensor scale, dequant direction (CT: 1/weight_global_scale) */
	float input_scale;     /* NVFP4 activation scale (dequant direction); 0 when absent */
	int32_t group_scale_shared; /* 1 when this tensor's fused siblings carry the same ws2 */
	const char *file;      /* shard holding the data, for messages */
};

struct fp4s_model {
	char *dir;
	struct fp4s_config cfg;
	struct fp4s_qscheme qs;
	struct fp4s_st_set st;
	struct fp4s_tspec *specs;
	struct fp4s_weight *w;
	int32_t n;
	int32_t n_unused;      /* checkpoint tensors no table entry claimed */
	void *owned;           /* buffers the model owns (llama2.c permuted weights) */
	uint8_t *owned_map;    /* llama2.c: its own mapping */
	uint64_t owned_map_size;
};

const char *fp4s_wformat_name(enum fp4s_wformat f);
int fp4s_model_open(const char *dir, struct fp4s_model *m, struct fp4s_error *err);
void fp4s_model_close(struct fp4s_model *m);
const struct fp4s_weight *fp4s_model_find(const struct fp4s_model *m, const char *name);
/* Total stored bytes of one weight (codes + scales + per-tensor scalars). */
uint64_t fp4s_weight_bytes(const struct fp4s_weight *w);
int64_t fp4s_weight_numel(const struct fp4s_weight *w);

/* Hands every present weight to fn in file order, with a progress bar on stderr (bytes, GB/s,
 * ETA) when it is a terminal. fn returns 0 to go on or an error code to stop. This is the hook
 * the backend's weight upload plugs into. */
typedef int (*fp4s_upload_fn)(void *ctx, const struct fp4s_weight *w, struct fp4s_error *err);
int fp4s_model_upload(const struct fp4s_model *m, fp4s_upload_fn fn, void *ctx,
                      struct fp4s_error *err);

/* Decode-time accounting (performance.md §3.1): what one token at batch 1 reads. */
struct fp4s_model_stats {
	double params_total, params_active;
	double bytes_total;
	double bytes_by_fmt[FP4S_WF_COUNT];
	double bytes_per_token;          /* weights only */
	double kv_bytes_per_ctx_token;   /* BF16 KV cache bytes per token of context, full layers */
};
/* Works on any weight array (a loaded model or a planned one), using only spec, fmt, present. */
void fp4s_model_stats(const struct fp4s_config *c, const struct fp4s_weight *w, int32_t n,
                      struct fp4s_model_stats *s);
/* KV-cache bytes read per decode token at a given context (sliding layers capped at the window). */
double fp4s_kv_bytes(const struct fp4s_config *c, int64_t context);

/* llama2.c legacy checkpoint (model.bin): see llama2c.c. */
int fp4s_llama2c_open(const char *path, struct fp4s_model *m, struct fp4s_error *err);

#ifdef __cplusplus
}
#endif

#endif
