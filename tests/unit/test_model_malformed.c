/* test_model_malformed.c: one test per malformed input. Each checks that loading fails (no crash)
 * and that the message names the file, the tensor and what was expected. Run under ASan+UBSan in
 * the sanitizer build. */
#include <math.h>

#include "model/model.h"
#include "model_test_util.h"
#include "test_util.h"

static int has(const char *msg, const char *s)
{
	if (strstr(msg, s))
		return 1;
	fprintf(stderr, "  message \"%s\" lacks \"%s\"\n", msg, s);
	return 0;
}

/* Builds a safetensors buffer from a header text and a data section of data_len bytes. */
static uint8_t *st_buf(const char *hdr, size_t data_len, size_t *len)
{
	size_t hl = strlen(hdr);
	*len = 8 + hl + data_len;
	uint8_t *b = calloc(*len + 1, 1);
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
	memcpy(b + 8, hdr, hl);
	return b;
}

static void expect_parse_fail(const char *what, const char *hdr, size_t data_len, int code,
                              const char *s1, const char *s2)
{
	size_t len;
	uint8_t *b = st_buf(hdr, data_len, &len);
	struct fp4s_st_header h;
	struct fp4s_error err = {0};
	int rc = fp4s_st_parse(b, len, "bad.safetensors", &h, &err);
	CHECK_MSG(rc == code, "%s: rc %d, expected %d (%s)", what, rc, code, err.msg);
	CHECK(has(err.msg, "bad.safetensors"));
	if (s1)
		CHECK(has(err.msg, s1));
	if (s2)
		CHECK(has(err.msg, s2));
	free(b);
}

static void test_header_level(void)
{
	struct fp4s_st_header h;
	struct fp4s_error err = {0};
	/* truncated: fewer than 8 bytes */
	uint8_t tiny[5] = {1, 0, 0, 0, 0};
	CHECK_EQ_INT(fp4s_st_parse(tiny, sizeof tiny, "bad.safetensors", &h, &err), FP4S_EFORMAT);
	CHECK(has(err.msg, "bad.safetensors") && has(err.msg, "truncated") && has(err.msg, "at least 8"));
	/* header length past EOF */
	uint8_t past[16] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
	CHECK_EQ_INT(fp4s_st_parse(past, sizeof past, "bad.safetensors", &h, &err), FP4S_EFORMAT);
	CHECK(has(err.msg, "header length 200 runs past the end"));
	/* header length over the cap */
	uint8_t huge[16] = {0, 0, 0, 0, 0, 0, 0, 1, '{', '}'};
	CHECK_EQ_INT(fp4s_st_parse(huge, sizeof huge, "bad.safetensors", &h, &err), FP4S_EFORMAT);
	CHECK(has(err.msg, "exceeds"));
	expect_parse_fail("invalid JSON", "{\"a\": {\"dtype\": \"F32\",", 0, FP4S_EFORMAT,
	                  "invalid JSON", NULL);
	expect_parse_fail("duplicate key",
	                  "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
	                  "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
	                  2, FP4S_EFORMAT, "invalid JSON", "duplicate");
	expect_parse_fail("not an object", "[1, 2, 3]", 0, FP4S_EFORMAT, "JSON object", NULL);
	expect_parse_fail("offsets out of range",
	                  "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
	                  FP4S_EFORMAT, "tensor w", "outside the data section of 8 bytes");
	expect_parse_fail("negative offset",
	                  "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[-4,0]}}", 8,
	                  FP4S_EFORMAT, "tensor w", "begin <= end");
	expect_parse_fail("overlap",
	                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
	                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
	                  16, FP4S_EFORMAT, "tensors a", "overlap");
	expect_parse_fail("overlap across an empty tensor",
	                  "{\"c\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
	                  "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
	                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
	                  16, FP4S_EFORMAT, "tensors c", "overlap");
	expect_parse_fail("dtype x shape != bytes",
	                  "{\"w\":{\"dtype\":\"BF16\",\"shape\":[3,4],\"data_offsets\":[0,12]}}", 12,
	                  FP4S_EFORMAT, "tensor w", "needs 24 bytes but data_offsets span 12");
	expect_parse_fail("unknown dtype",
	                  "{\"w\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1,
	                  FP4S_EUNSUPPORTED, "tensor w", "dtype \"F4\" is not supported");
	expect_parse_fail("negative dim",
	                  "{\"w\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1,
	                  FP4S_EFORMAT, "tensor w", "shape[0]");
	expect_parse_fail("shape overflow",
	                  "{\"w\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],"
	                  "\"data_offsets\":[0,1]}}",
	                  1, FP4S_EFORMAT, "tensor w", "overflows");
	expect_parse_fail("too many dims",
	                  "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
	                  1, FP4S_EFORMAT, "tensor w", "at most 8 dims");
	expect_parse_fail("missing offsets", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1,
	                  FP4S_EFORMAT, "tensor w", "data_offsets");
	/* a well-formed one parses, including metadata and an empty tensor */
	size_t len;
	uint8_t *b = st_buf("{\"__metadata__\":{\"format\":\"pt\"},\"e\":{\"dtype\":\"F32\",\"shape\":[0],"
	                    "\"data_offsets\":[0,0]},\"w\":{\"dtype\":\"BF16\",\"shape\":[2,2],"
	                    "\"data_offsets\":[0,8]}}  ",
	                    8, &len);
	CHECK_EQ_INT(fp4s_st_parse(b, len, "ok.safetensors", &h, &err), 0);
	CHECK_EQ_INT(h.n, 2);
	fp4s_st_header_free(&h);
	free(b);
}

/* Opens dir and expects failure with all the given substrings in the message. */
static void expect_open_fail(const char *what, const char *dir, const char *s1, const char *s2,
                             const char *s3)
{
	struct fp4s_model m;
	struct fp4s_error err = {0};
	int rc = fp4s_model_open(dir, &m, &err);
	CHECK_MSG(rc != 0, "%s: loaded a malformed checkpoint", what);
	if (!rc) {
		fp4s_model_close(&m);
		return;
	}
	fprintf(stderr, "  %s -> %s\n", what, err.msg);
	if (s1)
		CHECK(has(err.msg, s1));
	if (s2)
		CHECK(has(err.msg, s2));
	if (s3)
		CHECK(has(err.msg, s3));
}

static char *fresh(const char *root, const char *name, const char *preset, enum fp4s_qformat f,
                   uint64_t shard)
{
	char *d = mt_path(root, name);
	CHECK_EQ_INT(mt_gen(preset, d, f, 1, shard), 0);
	return d;
}

static void test_model_level(const char *root)
{
	/* truncated file: the data section ends early, so the last tensor runs past it */
	char *d = fresh(root, "trunc", "tiny-llama3", FP4S_QF_BF16, 0);
	char *st = mt_path(d, "model.safetensors");
	CHECK(truncate(st, 1000000) == 0);
	expect_open_fail("truncated file", d, "model.safetensors", "tensor ", "outside the data section");
	free(st), free(d);

	/* missing tensor */
	d = fresh(root, "missing", "tiny-llama3", FP4S_QF_NVFP4, 0);
	st = mt_path(d, "model.safetensors");
	CHECK(!mt_patch(st, "\"model.layers.1.mlp.down_proj.weight_scale_2\"",
	                "\"model.layers.1.mlp.down_proj.weight_scale_X\""));
	expect_open_fail("missing tensor", d, d, "model.layers.1.mlp.down_proj.weight_scale_2",
	                 "missing");
	free(st), free(d);

	/* dtype mismatch (U8 codes declared I8) */
	d = fresh(root, "dtype", "tiny-llama3", FP4S_QF_NVFP4, 0);
	st = mt_path(d, "model.safetensors");
	CHECK(!mt_patch(st, "\"model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"U8\"",
	                "\"model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"I8\""));
	expect_open_fail("dtype mismatch", d, "model.safetensors", "model.layers.0.self_attn.q_proj.weight",
	                 "dtype I8, expected U8");
	free(st), free(d);

	/* shape mismatch with the right byte count ([256,128] declared [128,256]) */
	d = fresh(root, "shape", "tiny-llama3", FP4S_QF_NVFP4, 0);
	st = mt_path(d, "model.safetensors");
	CHECK(!mt_patch(st, "\"model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"U8\",\"shape\":[256,128]",
	                "\"model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"U8\",\"shape\":[128,256]"));
	expect_open_fail("shape mismatch", d, "model.safetensors", "model.layers.0.self_attn.q_proj.weight",
	                 "shape [128, 256], expected [256, 128]");
	free(st), free(d);

	/* byte-length mismatch inside a real file */
	d = fresh(root, "bytelen", "tiny-llama3", FP4S_QF_BF16, 0);
	st = mt_path(d, "model.safetensors");
	CHECK(!mt_patch(st, "\"model.norm.weight\":{\"dtype\":\"BF16\",\"shape\":[256]",
	                "\"model.norm.weight\":{\"dtype\":\"BF16\",\"shape\":[255]"));
	expect_open_fail("byte length", d, "model.safetensors", "model.norm.weight",
	                 "needs 510 bytes but data_offsets span 512");
	free(st), free(d);

	/* unknown architecture */
	d = fresh(root, "arch", "tiny-llama3", FP4S_QF_BF16, 0);
	char *cj = mt_path(d, "config.json");
	CHECK(!mt_patch(cj, "\"model_type\": \"llama\"", "\"model_type\": \"lxama\""));
	expect_open_fail("unknown architecture", d, "config.json", "model_type \"lxama\"",
	                 "expected llama, qwen3");
	free(cj), free(d);

	/* E8M0 scale 0xFF (NaN) */
	d = fresh(root, "e8m0", "tiny-gpt-oss", FP4S_QF_MXFP4, 0);
	st = mt_path(d, "model.safetensors");
	uint8_t ff = 0xFF;
	CHECK(!mt_patch_tensor(st, "model.layers.1.mlp.experts.down_proj_scales", 77, &ff, 1));
	expect_open_fail("E8M0 0xFF", d, "model.safetensors", "model.layers.1.mlp.experts.down_proj_scales",
	                 "byte 0xFF at index 77");
	free(st), free(d);

	/* NaN per-tensor scale */
	d = fresh(root, "nan2", "tiny-qwen3", FP4S_QF_NVFP4, 0);
	st = mt_path(d, "model.safetensors");
	float nan = NAN;
	CHECK(!mt_patch_tensor(st, "model.layers.1.self_attn.k_proj.weight_scale_2", 0, &nan, 4));
	expect_open_fail("NaN weight_scale_2", d, "model.safetensors",
	                 "model.layers.1.self_attn.k_proj.weight_scale_2", "expected a positive finite scale");
	free(st), free(d);

	/* NaN E4M3 block scale */
	d = fresh(root, "nan4", "tiny-qwen3", FP4S_QF_NVFP4, 0);
	st = mt_path(d, "model.safetensors");
	uint8_t n7f = 0x7F;
	CHECK(!mt_patch_tensor(st, "model.layers.0.mlp.up_proj.weight_scale", 33, &n7f, 1));
	expect_open_fail("NaN E4M3 scale", d, "model.safetensors", "model.layers.0.mlp.up_proj.weight_scale",
	                 "0x7F at index 33 (row 2, block 1) is NaN");
	free(st), free(d);

	/* wrong quant_algo */
	d = fresh(root, "algo", "tiny-llama3", FP4S_QF_NVFP4, 0);
	char *hq = mt_path(d, "hf_quant_config.json");
	CHECK(!mt_patch(hq, "\"W4A16_NVFP4\"", "\"W8A8_FP8___\""));
	expect_open_fail("wrong quant_algo", d, "hf_quant_config.json", "quant_algo \"W8A8_FP8___\"",
	                 "expected NVFP4 or W4A16_NVFP4");
	free(hq), free(d);

	/* quant_method unknown */
	d = fresh(root, "method", "tiny-llama3", FP4S_QF_NVFP4_CT, 0);
	cj = mt_path(d, "config.json");
	CHECK(!mt_patch(cj, "\"compressed-tensors\"", "\"compressed-tensorz\""));
	expect_open_fail("unknown quant_method", d, "config.json", "quant_method \"compressed-tensorz\"",
	                 "expected modelopt");
	free(cj), free(d);

	/* sharded: the index names a tensor no shard holds, or a shard outside the folder */
	d = fresh(root, "index", "tiny-llama3", FP4S_QF_BF16, 1000000);
	char *ix = mt_path(d, "model.safetensors.index.json");
	CHECK(!mt_patch(ix, "\"model.norm.weight\"", "\"model.norm.weighX\""));
	expect_open_fail("index lists a missing tensor", d, "model.safetensors.index.json",
	                 "model.norm.weighX", "missing from every shard");
	free(ix), free(d);
	d = fresh(root, "index2", "tiny-llama3", FP4S_QF_BF16, 1000000);
	ix = mt_path(d, "model.safetensors.index.json");
	CHECK(!mt_patch(ix, "\"model-00001-of-", "\"/odel-00001-of-"));
	expect_open_fail("shard outside the folder", d, "model.safetensors.index.json", "weight_map[",
	                 "file name in the same folder");
	free(ix), free(d);

	/* block scales present although the module is excluded */
	d = fresh(root, "excl", "tiny-llama3", FP4S_QF_NVFP4, 0);
	hq = mt_path(d, "hf_quant_config.json");
	CHECK(!mt_patch(hq, "\"lm_head\"", "\"*.q_pr*\""));
	cj = mt_path(d, "config.json");
	CHECK(!mt_patch(cj, "\"lm_head\"", "\"*.q_pr*\""));
	expect_open_fail("excluded but quantized", d, "model.layers.0.self_attn.q_proj.weight_scale",
	                 "excluded from quantization", NULL);
	free(hq), free(cj), free(d);

	/* truncated config.json (invalid JSON) */
	d = fresh(root, "cfgjson", "tiny-qwen3", FP4S_QF_BF16, 0);
	cj = mt_path(d, "config.json");
	CHECK(truncate(cj, 40) == 0);
	expect_open_fail("invalid config.json", d, "config.json", "invalid JSON", NULL);
	free(cj), free(d);
}

int main(void)
{
	test_header_level();
	char *root = mt_tmpdir();
	test_model_level(root);
	mt_rmtree(root);
	free(root);
	return TEST_DONE();
}
