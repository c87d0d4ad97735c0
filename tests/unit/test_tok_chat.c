/* test_tok_chat: the built-in chat formatters against golden strings rendered from the real chat
 * templates (tests/fixtures/chat/,  made by tools/chat_golden.mjs), byte for byte; format
 * detection from each template; name lookup; error cases. Needs only the committed fixtures. */
#include <jansson.h>

#include "test_tok_common.h"
#include "test_util.h"

static const char *str(json_t *o, const char *k)
{
	return json_string_value(json_object_get(o, k));
}

static void run_fixture(const char *name)
{
	char path[1024];
	const char *src = getenv("FP4S_SOURCE_DIR");
	snprintf(path, sizeof path, "%s/tests/fixtures/chat/%s.json", src ? src : ".", name);
	json_error_t je;
	json_t *root = json_load_file(path, 0, &je);
	CHECK_MSG(root != NULL, "%s: %s", path, je.text);
	if (!root)
		return;
	struct fp4s_chat_template t = {0};
	t.format = fp4s_chat_detect(str(root, "template"), NULL, &t.flags);
	CHECK_EQ_STR(fp4s_chat_format_name(t.format), str(root, "format"));
	snprintf(t.bos, sizeof t.bos, "%s", str(root, "bos") ? str(root, "bos") : "");
	json_t *cases = json_object_get(root, "cases");
	int pass = 0;
	for (size_t i = 0; i < json_array_size(cases); i++) {
		json_t *c = json_array_get(cases, i), *ms = json_object_get(c, "messages");
		struct fp4s_chat_msg msgs[16];
		size_t n = json_array_size(ms);
		for (size_t k = 0; k < n && k < 16; k++) {
			json_t *m = json_array_get(ms, k);
			msgs[k].role = str(m, "role");
			msgs[k].content = str(m, "content");
			msgs[k].thinking = str(m, "thinking") ? str(m, "thinking") : str(m, "reasoning_content");
		}
		struct fp4s_chat_opts o = {
			.add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt")),
			.enable_thinking = !json_is_false(json_object_get(c, "enable_thinking")),
			.reasoning_effort = str(c, "reasoning_effort"),
			.model_identity = str(c, "model_identity"),
			.date = str(c, "date"),
		};
		struct fp4s_tok_text out = {0};
		struct fp4s_error err = {0};
		int rc = fp4s_chat_apply(&t, msgs, n, &o, &out, &err);
		const char *want = str(c, "expected");
		int ok = rc == 0 && out.s && !strcmp(out.s, want);
		CHECK_MSG(ok, "%s/%s: rc %d %s\n got: %s\nwant: %s", name, str(c, "name"), rc, err.msg,
			  out.s ? out.s : "", want);
		pass += ok;
		fp4s_tok_text_free(&out);
	}
	printf("%s: %d/%zu golden chat strings match\n", name, pass, json_array_size(cases));
	json_decref(root);
}

int main(void)
{
	static const char *const fixtures[] = {"llama3", "llama3-instruct", "llama3.1", "qwen3", "harmony"};
	for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++)
		run_fixture(fixtures[i]);

	/* names, for --chat-template NAME */
	enum fp4s_chat_format f;
	CHECK(fp4s_chat_format_from_name("qwen3", &f) == 0 && f == FP4S_CHAT_QWEN3);
	CHECK(fp4s_chat_format_from_name("llama3.1", &f) == 0 && f == FP4S_CHAT_LLAMA31);
	CHECK(fp4s_chat_format_from_name("gpt-oss", &f) == 0 && f == FP4S_CHAT_HARMONY);
	CHECK(fp4s_chat_format_from_name("nope", &f) != 0);
	CHECK(fp4s_chat_detect("{{ '[INST]' }}", NULL, NULL) == FP4S_CHAT_NONE);
	CHECK(fp4s_chat_detect(NULL, NULL, NULL) == FP4S_CHAT_NONE);

	/* Llama 3.2's template takes today's date from strftime_now */
	unsigned fl = 0;
	CHECK(fp4s_chat_detect("<|start_header_id|> Cutting Knowledge Date strftime_now(\"%d %b %Y\")", NULL, &fl) ==
	      FP4S_CHAT_LLAMA31);
	CHECK(fl & FP4S_CHAT_F_DATE_NOW);
	{
		struct fp4s_chat_template l32 = {.format = FP4S_CHAT_LLAMA31, .flags = fl};
		struct fp4s_chat_msg u = {"user", "hi", NULL};
		struct fp4s_tok_text o = {0};
		CHECK(fp4s_chat_apply(&l32, &u, 1, NULL, &o, NULL) == 0);
		CHECK(o.s && !strstr(o.s, "26 Jul 2024") && strstr(o.s, "Today Date: "));
		fp4s_tok_text_free(&o);
	}

	/* errors come back as statuses with a message */
	struct fp4s_chat_template none = {0}, harmony = {.format = FP4S_CHAT_HARMONY};
	struct fp4s_chat_msg m[2] = {{"user", "hi", NULL}, {"tool", "{}", NULL}};
	struct fp4s_tok_text out = {0};
	struct fp4s_error err = {0};
	CHECK(fp4s_chat_apply(&none, m, 1, NULL, &out, &err) == FP4S_EUNSUPPORTED);
	CHECK(fp4s_chat_apply(&harmony, m, 2, NULL, &out, &err) == FP4S_EUNSUPPORTED);
	struct fp4s_chat_msg bad = {"assistant", "<|channel|>final<|message|>x", NULL};
	CHECK(fp4s_chat_apply(&harmony, &bad, 1, NULL, &out, &err) == FP4S_EINVAL);
	struct fp4s_chat_msg norole = {NULL, "x", NULL};
	CHECK(fp4s_chat_apply(&harmony, &norole, 1, NULL, &out, &err) == FP4S_EINVAL);
	/* harmony without a date uses today's: the line is there and well formed */
	CHECK(fp4s_chat_apply(&harmony, m, 1, NULL, &out, &err) == 0);
	const char *d = out.s ? strstr(out.s, "Current date: ") : NULL;
	CHECK(d && strlen(d) > 24 && d[18] == '-' && d[21] == '-');
	fp4s_tok_text_free(&out);
	return TEST_DONE();
}
