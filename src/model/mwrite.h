/* mwrite.h: writing checkpoints — `gen` (random weights with a preset's geometry) and `quantize`
 * (BF16/F16/F32 checkpoint to NVFP4 or MXFP4) share one streaming, parallel pipeline: plan every
 * output tensor from the architecture's table, lay out the shards, then fill row chunks of each
 * tensor from a source (the counter-based generator, or the input checkpoint), quantize them
 * with the CPU reference quantizer (numerics/quant.h) and pwrite them in place. Nothing holds
 * more than a few chunks in memory.
 *
 * Generated values: v = mean + std * z, z = (b0 + b1 + b2 + b3 - 510) / 147.8 from the four
 * bytes of a 32-bit hash (murmur3 finalizer) of key(seed, tensor name) ^ index*phi: an Irwin-Hall
 * approximation of a normal, bounded at |z| <= 3.45, cheap and vectorizable. Element 0 of each
 * tensor takes z = +3.45, so a tensor's amax is known without a pass and `gen --format nvfp4`
 * computes the same per-tensor scale as
 * `quantize` reading `gen --format bf16`; both round through BF16 first, so the bytes are equal. */
#ifndef FP4S_MWRITE_H
#define FP4S_MWRITE_H

#include <stdint.h>

#include "model/model.h"

enum fp4s_qformat {
	FP4S_QF_BF16 = 0,
	FP4S_QF_NVFP4,     /* ModelOpt layout, W4A16_NVFP4 */
	FP4S_QF_NVFP4_CT,  /* compressed-tensors nvfp4-pack-quantized (NVFP4A16) */
	FP4S_QF_MXFP4,     /* gpt-oss MXFP4 experts */
};

int fp4s_qformat_parse(const char *s, enum fp4s_qformat *f);
const char *fp4s_qformat_name(enum fp4s_qformat f);

/* Presets: llama3-8b, qwen3-8b, qwen3-30b-a3b, gpt-oss-20b, gpt-oss-120b, tiny-llama3,
 * tiny-qwen3, tiny-qwen3-moe, tiny-gpt-oss. */
const char *const *fp4s_preset_names(int32_t *n);
/* The preset's config.json text (malloc'd) and its parsed config. */
int fp4s_preset_config(const char *name, char **json_text, struct fp4s_config *c,
                       struct fp4s_error *err);
/* The format gen uses when none is given: mxfp4 for gpt-oss (its published form), else bf16. */
enum fp4s_qformat fp4s_preset_default_format(const struct fp4s_config *c);

/* Plans the weights of a config in a format (which tensors get quantized, following the default
 * exclusions: lm_head, embeddings, routers, norms, biases). specs/w are malloc'd. */
int fp4s_plan(const struct fp4s_config *c, enum fp4s_qformat f, struct fp4s_tspec **specs,
              struct fp4s_weight **w, int32_t *n, struct fp4s_error *err);

struct fp4s_write_opts {
	enum fp4s_qformat format;
	uint64_t seed;            /* gen */
	uint64_t shard_bytes;     /* 0: 5 GB (the HF default) */
	int32_t threads;          /* 0: OpenMP default */
	int32_t layers;           /* gen: the first this many of the preset's layers (0: all) */
};

/* Writes a random-weight checkpoint of the preset to out_dir (created if needed). */
int fp4s_gen(const char *preset, const char *out_dir, const struct fp4s_write_opts *o,
             struct fp4s_error *err);
/* Quantizes the plain checkpoint in in_dir to out_dir. */
int fp4s_quantize(const char *in_dir, const char *out_dir, const struct fp4s_write_opts *o,
                  struct fp4s_error *err);

/* The generator itself, exposed for tests: the BF16-rounded value of element idx of a tensor. */
float fp4s_gen_value(uint64_t key, uint64_t idx, float mean, float std);
uint64_t fp4s_gen_key(uint64_t seed, const char *name);

/* Writes a byte-level BPE tokenizer.json for the config's family and vocab size (gen.c). */
int fp4s_gen_tokenizer(const char *path, const struct fp4s_config *c, struct fp4s_error *err);

#endif
