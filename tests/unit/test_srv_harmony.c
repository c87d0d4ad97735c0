/* test_srv_harmony.c: the server's gpt-oss channel splitter and API-key check (src/server).
 * Harmony output is fed whole and cut at every byte position, so markers split across stream
 * events still land in the right field; text from a model that never writes a header is kept. */
#include "server/srv.h"
#include "test_util.h"

static void run(const char *in, size_t cut1, size_t cut2, struct fp4s_tok_text *c, struct fp4s_tok_text *r)
{
	struct srv_harmony h;
	srv_harmony_init(&h);
	c->n = r->n = 0;
	fp4s_tok_text_append(c, "", 0);
	fp4s_tok_text_append(r, "", 0);
	size_t n = strlen(in);
	CHECK(srv_harmony_feed(&h, in, cut1, 0, c, r) == 0);
	CHECK(srv_harmony_feed(&h, in + cut1, cut2 - cut1, 0, c, r) == 0);
	CHECK(srv_harmony_feed(&h, in + cut2, n - cut2, 1, c, r) == 0);
}

static void expect_split(const char *in, const char *content, const char *reasoning)
{
	struct fp4s_tok_text c = {0}, r = {0};
	const size_t n = strlen(in);
	int bad = 0;
	for (size_t a = 0; a <= n && bad < 3; a++)
		for (size_t b = a; b <= n && bad < 3; b += (n > 200 ? 7 : 1)) {
			run(in, a, b, &c, &r);
			if (strcmp(c.s, content) || strcmp(r.s, reasoning)) {
				bad++;
				fprintf(stderr, "cut %zu/%zu of %s: content '%s' reasoning '%s'\n", a, b, in, c.s, r.s);
			}
		}
	CHECK_MSG(bad == 0, "harmony split of %s", in);
	fp4s_tok_text_free(&c);
	fp4s_tok_text_free(&r);
}

int main(void)
{
	expect_split("<|channel|>analysis<|message|>Let me think.<|end|><|start|>assistant<|channel|>final<|message|>Hello!",
	             "Hello!", "Let me think.");
	expect_split("<|channel|>final<|message|>Just the answer", "Just the answer", "");
	expect_split("<|channel|>analysis<|message|>only thinking", "", "only thinking");
	/* commentary (tool preambles) and a constrained header go to content */
	expect_split("<|channel|>commentary <|constrain|>json<|message|>{\"a\":1}<|end|>", "{\"a\":1}", "");
	/* text that merely looks like a marker start stays text */
	expect_split("<|channel|>final<|message|>a <| b |> c < d", "a <| b |> c < d", "");
	/* a "<|" that cannot begin a marker is text, and a marker right after it still counts, however
	 * the text is cut (the old rule took "<|x<|end|>" whole as one unknown marker, but "<|x" cut
	 * off and held, then grown past its limit, as text followed by <|end|>) */
	expect_split("<|channel|>final<|message|>a<|x<|end|>ignored", "a<|x", "");
	expect_split("<|channel|>final<|message|>a<|cha<|return|>", "a<|cha", "");
	/* names are lower-case letters and '_' of at most 9 bytes: longer ones and other bytes are text */
	expect_split("<|channel|>final<|message|>a<|abcdefghij|>b<|end9|>c<|END|>d",
	             "a<|abcdefghij|>b<|end9|>c<|END|>d", "");
	/* a model that ignores the format (the random demo model): its text is content */
	expect_split("plain text with no header at all", "plain text with no header at all", "");
	/* auth: constant-time comparison semantics */
	CHECK(srv_auth_ok("k3y", "Bearer k3y"));
	CHECK(srv_auth_ok("k3y", "bearer k3y"));
	CHECK(!srv_auth_ok("k3y", "Bearer k3"));
	CHECK(!srv_auth_ok("k3y", "Bearer k3yy"));
	CHECK(!srv_auth_ok("k3y", "Bearer k3z"));
	CHECK(!srv_auth_ok("k3y", "k3y"));
	CHECK(!srv_auth_ok("k3y", NULL));
	CHECK(srv_auth_ok(NULL, NULL)); /* no key configured: open */
	return TEST_DONE();
}
