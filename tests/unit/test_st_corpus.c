/* test_st_corpus.c: replays the committed fuzz corpus (tests/fuzz/corpus/) through the fuzz
 * target's entry point, so CI without clang/libFuzzer still exercises every saved input (and the
 * sanitizer build checks them under ASan+UBSan). */
#include "model_test_util.h"
#include "test_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
#include "../fuzz/fuzz_safetensors.c"

int main(void)
{
	int unreadable = 0;
	const int n = mt_replay_corpus("corpus", LLVMFuzzerTestOneInput, &unreadable);
	if (n < 0)
		TEST_SKIP("tests/fuzz/corpus not found (FP4S_SOURCE_DIR unset)");
	printf("replayed %d corpus files\n", n);
	CHECK_EQ_INT(unreadable, 0);
	CHECK(n >= 10);
	return TEST_DONE();
}
