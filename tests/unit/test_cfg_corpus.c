/* test_cfg_corpus.c: replays the committed config.json fuzz corpus (tests/fuzz/corpus-config/) through the fuzz
 * target's entry point, so CI without clang/libFuzzer still exercises every saved input (and the
 * sanitizer build checks them under ASan+UBSan). */
#include "model_test_util.h"
#include "test_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
#include "../fuzz/fuzz_config.c"

int main(void)
{
	int unreadable = 0;
	const int n = mt_replay_corpus("corpus-config", LLVMFuzzerTestOneInput, &unreadable);
	if (n < 0)
		TEST_SKIP("tests/fuzz/corpus-config not found (FP4S_SOURCE_DIR unset)");
	printf("replayed %d corpus files\n", n);
	CHECK_EQ_INT(unreadable, 0);
	CHECK(n >= 5);
	return TEST_DONE();
}
