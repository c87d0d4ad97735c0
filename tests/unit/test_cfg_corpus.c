/* test_cfg_corpus.c: replays the committed config.json fuzz corpus (tests/fuzz/corpus-config/) through the fuzz
 * target's entry point, so CI without clang/libFuzzer still exercises every saved input (and the
 * sanitizer build checks them under ASan+UBSan). */
#include <dirent.h>

#include "model_test_util.h"
#include "test_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
#include "../fuzz/fuzz_config.c"

int main(void)
{
	const char *src = getenv("FP4S_SOURCE_DIR");
	char dir[4096];
	snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus-config", src ? src : ".");
	DIR *d = opendir(dir);
	if (!d)
		TEST_SKIP("%s not found (FP4S_SOURCE_DIR unset)", dir);
	struct dirent *e;
	int n = 0;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char *p = mt_path(dir, e->d_name);
		size_t len = 0;
		uint8_t *b = mt_read(p, &len);
		CHECK_MSG(b != NULL, "cannot read %s", p);
		if (b)
			LLVMFuzzerTestOneInput(b, len);
		n++;
		free(b);
		free(p);
	}
	closedir(d);
	printf("replayed %d corpus files\n", n);
	CHECK(n >= 5);
	return TEST_DONE();
}
