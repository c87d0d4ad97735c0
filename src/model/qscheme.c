/* qscheme.c: quantization scheme detection. */
#include "model/qscheme.h"

#include <fnmatch.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *fp4s_qmethod_name(enum fp4s_qmethod m)
{
	switch (m) {
	case FP4S_QM_NONE: return "none";
	case FP4S_QM_MODELOPT: return "modelopt";
	case FP4S_QM_CT: return "compressed-tensors";
	case FP4S_QM_MXFP4: return "mxfp4";
	}
	return "?";
}

void fp4s_qscheme_free(struct fp4s_qscheme *q)
{
	for (int32_t i = 0; i < q->n_exclude; i++)
		free(q->exclude[i]);
	free(q->exclude);
	q->exclude = NULL;
	q->n_exclude = 0;
}

static int add_excludes(struct fp4s_qscheme *q, json_t *arr, const char *path, const char *key,
                        struct fp4s_error *err)
{
	if (!arr || json_is_null(arr))
		return FP4S_OK;
	if (!json_is_array(arr) || json_array_size(arr) > 100000)
		return fp4s_error_set(err, FP4S_EFORMAT, "%s: \"%s\" must be an array of strings", path,
		                      key);
	size_t n = json_array_size(arr);
	char **p = realloc(q->exclude, (size_t)(q->n_exclude + (int32_t)n + 1) * sizeof *p);
	if (!p)
		return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
	q->exclude = p;
	for (size_t i = 0; i < n; i++) {
		const char *s = json_string_value(json_array_get(arr, i));
		if (!s)
			return fp4s_error_set(err, FP4S_EFORMAT, "%s: %s[%zu] is not a string", path, key, i);
		int dup = 0;
		for (int32_t j = 0; j < q->n_exclude; j++)
			dup |= !strcmp(q->exclude[j], s);
		if (dup)
			continue;
		q->exclude[q->n_exclude] = strdup(s);
		if (!q->exclude[q->n_exclude])
			return fp4s_error_set(err, FP4S_ENOMEM, "out of memory");
		q->n_exclude++;
	}
	return FP4S_OK;
}

/* ModelOpt algos we load: NVFP4 (W4A4) and W4A16_NVFP4 (weight-only). */
static int modelopt_algo(struct fp4s_qscheme *q, const char *algo, const char *path,
                         struct fp4s_error *err)
{
	if (!algo)
		return fp4s_error_set(err, FP4S_EFORMAT, "%s: \"quant_algo\" missing", path);
	if (strcmp(algo, "NVFP4") && strcmp(algo, "W4A16_NVFP4"))
		return fp4s_error_set(err, FP4S_EUNSUPPORTED,
		                      "%s: quant_algo \"%.40s\" is not supported (expected NVFP4 or "
		                      "W4A16_NVFP4)",
		                      path, algo);
	if (q->algo[0] && strcmp(q->algo, algo))
		return fp4s_error_set(err, FP4S_EFORMAT,
		                      "%s: quant_algo \"%s\" disagrees with \"%s\" in %s", path, algo,
		                      q->algo, q->source);
	snprintf(q->algo, sizeof q->algo, "%s", algo);
	q->weight_only = !strcmp(algo, "W4A16_NVFP4");
	return FP4S_OK;
}

static int from_hf_quant_config(const char *dir, struct fp4s_qscheme *q, struct fp4s_error *err)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
	if (access(path, R_OK))
		return FP4S_OK;
	json_error_t jerr;
	json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return fp4s_error_set(err, FP4S_EFORMAT, "%s: invalid JSON at line %d: %s", path,
		                      jerr.line, jerr.text);
	int rc = FP4S_OK;
	json_t *qc = json_object_get(root, "quantization");
	if (!json_is_object(qc)) {
		rc = fp4s_error_set(err, FP4S_EFORMAT, "%s: \"quantization\" object missing", path);
		goto out;
	}
	rc = modelopt_algo(q, json_string_value(json_object_get(qc, "quant_algo")), path, err);
	if (rc)
		goto out;
	/* vLLM requires these keys in hf_quant_config.json; so do we. */
	json_t *gs = json_object_get(qc, "group_size");
	if (!json_is_integer(gs) || json_integer_value(gs) != 16) {
		rc = fp4s_error_set(err, FP4S_EFORMAT, "%s: group_size must be 16 for NVFP4", path);
		goto out;
	}
	if (!json_object_get(qc, "exclude_modules")) {
		rc = fp4s_error_set(err, FP4S_EFORMAT, "%s: \"exclude_modules\" missing", path);
		goto out;
	}
	rc = add_excludes(q, json_object_get(qc, "exclude_modules"), path, "exclude_modules", err);
	q->method = FP4S_QM_MODELOPT;
	snprintf(q->source, sizeof q->source, "hf_quant_config.json");
out:
	json_decref(root);
	return rc;
}

static int from_config(const char *dir, struct fp4s_qscheme *q, struct fp4s_error *err)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/config.json", dir);
	json_error_t jerr;
	json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return fp4s_error_set(err, FP4S_EFORMAT, "%s: invalid JSON at line %d: %s", path,
		                      jerr.line, jerr.text);
	int rc = FP4S_OK;
	json_t *qc = json_object_get(root, "quantization_config");
	if (!qc || json_is_null(qc))
		goto out;
	if (!json_is_object(qc)) {
		rc = fp4s_error_set(err, FP4S_EFORMAT, "%s: quantization_config is not an object", path);
		goto out;
	}
	const char *m = json_string_value(json_object_get(qc, "quant_method"));
	if (!m) {
		rc = fp4s_error_set(err, FP4S_EFORMAT, "%s: quantization_config.quant_method missing",
		                    path);
		goto out;
	}
	if (!strncmp(m, "modelopt", 8)) {
		rc = modelopt_algo(q, json_string_value(json_object_get(qc, "quant_algo")), path, err);
		if (!rc)
			rc = add_excludes(q, json_object_get(qc, "ignore"), path, "ignore", err);
		if (!rc)
			rc = add_excludes(q, json_object_get(qc, "exclude_modules"), path,
			                  "exclude_modules", err);
		q->method = FP4S_QM_MODELOPT;
	} else if (!strcmp(m, "compressed-tensors")) {
		/* The format sits at top level and/or per config group. */
		const char *fmt = json_string_value(json_object_get(qc, "format"));
		json_t *groups = json_object_get(qc, "config_groups");
		const char *k;
		json_t *g;
		int w4a16 = 1;
		if (json_is_object(groups))
			json_object_foreach(groups, k, g) {
				const char *gf = json_string_value(json_object_get(g, "format"));
				if (!fmt && gf)
					fmt = gf;
				json_t *ia = json_object_get(g, "input_activations");
				if (ia && !json_is_null(ia))
					w4a16 = 0;
			}
		if (!fmt || strcmp(fmt, "nvfp4-pack-quantized")) {
			rc = fp4s_error_set(err, FP4S_EUNSUPPORTED,
			                    "%s: compressed-tensors format \"%.40s\" is not supported "
			                    "(expected nvfp4-pack-quantized)",
			                    path, fmt ? fmt : "(missing)");
			goto out;
		}
		snprintf(q->algo, sizeof q->algo, "%s", fmt);
		q->weight_only = w4a16;
		q->method = FP4S_QM_CT;
		rc = add_excludes(q, json_object_get(qc, "ignore"), path, "ignore", err);
	} else if (!strcmp(m, "mxfp4")) {
		snprintf(q->algo, sizeof q->algo, "mxfp4");
		q->weight_only = 1;
		q->method = FP4S_QM_MXFP4;
		rc = add_excludes(q, json_object_get(qc, "modules_to_not_convert"), path,
		                  "modules_to_not_convert", err);
	} else {
		rc = fp4s_error_set(err, FP4S_EUNSUPPORTED,
		                    "%s: quant_method \"%.40s\" is not supported (expected modelopt, "
		                    "compressed-tensors or mxfp4)",
		                    path, m);
		goto out;
	}
	if (!rc) {
		size_t n = strlen(q->source);
		snprintf(q->source + n, sizeof q->source - n, "%sconfig.json", n ? " + " : "");
	}
out:
	json_decref(root);
	return rc;
}

int fp4s_qscheme_load(const char *dir, struct fp4s_qscheme *q, struct fp4s_error *err)
{
	memset(q, 0, sizeof *q);
	int rc = from_hf_quant_config(dir, q, err);
	if (!rc)
		rc = from_config(dir, q, err);
	if (rc)
		fp4s_qscheme_free(q);
	return rc;
}

int fp4s_qscheme_excluded(const struct fp4s_qscheme *q, const char *module)
{
	char buf[600];
	for (int32_t i = 0; i < q->n_exclude; i++) {
		const char *p = q->exclude[i];
		if (!fnmatch(p, module, 0))
			return 1;
		/* a parent module excludes its children */
		snprintf(buf, sizeof buf, "%s.*", p);
		if (!fnmatch(buf, module, 0))
			return 1;
		if (!strpbrk(p, "*?[")) {
			/* substring match on dotted components, as older exports rely on */
			size_t n = strlen(p);
			for (const char *s = strstr(module, p); s; s = strstr(s + 1, p))
				if ((s == module || s[-1] == '.') && (s[n] == 0 || s[n] == '.'))
					return 1;
		}
	}
	return 0;
}
