/* qscheme.h: which quantization scheme a checkpoint folder uses (formats.md §5, §6.2), read from
 * config.json's quantization_config and/or hf_quant_config.json, and the exclusion list that
 * goes with it. Whether a given layer IS quantized is decided per tensor by model.c from the
 * exclusions plus the presence of its scale tensors (formats.md §1 item 7). */
#ifndef FP4S_QSCHEME_H
#define FP4S_QSCHEME_H

#include <stdint.h>

#include "util/status.h"

enum fp4s_qmethod {
	FP4S_QM_NONE = 0,  /* plain BF16/F16/F32 */
	FP4S_QM_MODELOPT,  /* NVIDIA ModelOpt NVFP4 (quant_algo NVFP4 or W4A16_NVFP4) */
	FP4S_QM_CT,        /* compressed-tensors nvfp4-pack-quantized */
	FP4S_QM_MXFP4,     /* gpt-oss MXFP4 experts */
};

struct fp4s_qscheme {
	enum fp4s_qmethod method;
	char algo[32];        /* ModelOpt quant_algo, CT format, "mxfp4" */
	int32_t weight_only;  /* W4A16 / NVFP4A16: no input scales expected */
	char **exclude;       /* fnmatch patterns (exclude_modules / ignore / modules_to_not_convert) */
	int32_t n_exclude;
	char source[64];      /* which file(s) it came from, for messages */
};

const char *fp4s_qmethod_name(enum fp4s_qmethod m);
int fp4s_qscheme_load(const char *dir, struct fp4s_qscheme *q, struct fp4s_error *err);
void fp4s_qscheme_free(struct fp4s_qscheme *q);
/* Whether a module name (a tensor name without .weight) matches an exclusion. Patterns are
 * fnmatch wildcards; like vLLM and transformers we also accept a pattern that names a parent
 * module ("model.layers.*.self_attn" excludes its q_proj) or, without wildcards, a substring. */
int fp4s_qscheme_excluded(const struct fp4s_qscheme *q, const char *module);

#endif
