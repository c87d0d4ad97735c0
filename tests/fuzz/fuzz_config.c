/* fuzz_config.c: libFuzzer target for config.json parsing (fp4s_config_parse) and the table
 * expansion and byte accounting that follow it, which do arithmetic on the parsed sizes. Built
 * and run by `FP4S_FUZZ_TARGET=config scripts/fuzz.sh SECONDS`. The expansion is capped so the
 * fuzzer does not spend its time allocating huge (valid) tables. */
#include <stdint.h>
#include <stdlib.h>

#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fp4s_config c;
	struct fp4s_error err;
	if (fp4s_config_parse((const char *)data, size, "fuzz/config.json", &c, &err))
		return 0;
	if ((int64_t)c.n_layers * (c.n_experts + 1) < 100000) {
		struct fp4s_tspec *s;
		int32_t n;
		if (!fp4s_tensors_expand(&c, &s, &n, &err)) {
			struct fp4s_weight *w = calloc((size_t)(n ? n : 1), sizeof *w);
			for (int32_t i = 0; w && i < n; i++)
				w[i].spec = &s[i], w[i].present = 1;
			struct fp4s_model_stats st;
			if (w)
				fp4s_model_stats(&c, w, n, &st);
			free(w);
			free(s);
		}
	}
	fp4s_config_free(&c);
	return 0;
}
