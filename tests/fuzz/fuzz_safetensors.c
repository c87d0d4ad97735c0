/* fuzz_safetensors.c: libFuzzer target for the safetensors header parser (fp4s_st_parse), the
 * first thing that touches an untrusted checkpoint. Built by scripts/fuzz.sh with
 * clang -fsanitize=fuzzer,address,undefined; tests/unit/test_st_corpus.c replays the committed
 * corpus (tests/fuzz/corpus/) through the same entry point in the normal build.
 *
 * Besides "no crash", it checks the parser's promises on every accepted input: tensors sorted,
 * inside the buffer, not overlapping, and byte lengths equal dtype size x shape product. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/st.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* A private copy, so reads past the end are caught by ASan at the exact byte. */
	uint8_t *buf = malloc(size ? size : 1);
	if (!buf)
		return 0;
	memcpy(buf, data, size);
	struct fp4s_st_header h;
	struct fp4s_error err;
	if (fp4s_st_parse(buf, size, "fuzz.safetensors", &h, &err) == 0) {
		uint64_t prev_end = 0;
		for (int32_t i = 0; i < h.n; i++) {
			const struct fp4s_st_tensor *t = &h.tensors[i];
			uint64_t n = fp4s_dtype_size(t->dtype);
			for (int32_t d = 0; d < t->ndim; d++)
				n *= (uint64_t)t->shape[d];
			if (t->end - t->begin != n || h.data_offset + t->end > size ||
			    (t->end > t->begin && t->begin < prev_end))
				abort();
			if (t->end > t->begin)
				prev_end = t->end;
			/* touch the first and last byte of each tensor */
			if (t->end > t->begin) {
				volatile uint8_t x = t->data[0];
				x ^= t->data[t->end - t->begin - 1];
				(void)x;
			}
		}
		fp4s_st_header_free(&h);
	}
	free(buf);
	return 0;
}
