/* test_tok_load: tokenizer.json features and failure modes on small synthetic files, so it needs no
 * downloaded data: merges as strings and as pairs, merge ranks and leftmost ties, ignore_merges,
 * added tokens (special or not, lstrip/rstrip, leftmost-longest), NFC, String Split patterns,
 * TemplateProcessing BOS, tokenizer_config/generation_config rules, streaming decode of split
 * UTF-8, and malformed or hostile files (tokenizer.json, llama2.c .bin), including random byte
 * mutations: every one must load or fail with a message, never crash. */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utf8proc.h>

#include "test_tok_common.h"
#include "nfc_ref.h"
#include "test_util.h"

static char dir[512];

static const char *path_of(const char *name)
{
	static char p[1024];
	snprintf(p, sizeof p, "%s/%s", dir, name);
	return p;
}

static void write_file(const char *name, const char *s, size_t n)
{
	FILE *f = fopen(path_of(name), "wb");
	if (!f) {
		perror(path_of(name));
		exit(1);
	}
	fwrite(s, 1, n, f);
	fclose(f);
}

/* GPT-2 byte alphabet, computed the way bytes_to_unicode defines it (independent of the library's table) */
static uint32_t byte_cp(int b)
{
	if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
		return (uint32_t)b;
	int k = 0;
	for (int c = 0; c < b; c++)
		if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF)))
			k++;
	return 0x100u + (uint32_t)k;
}

/* A token given as raw bytes, written as a JSON string in the byte alphabet. */
static void json_tok(char *out, const char *raw)
{
	size_t o = 0;
	out[o++] = '"';
	for (const unsigned char *p = (const unsigned char *)raw; *p; p++) {
		uint32_t cp = byte_cp(*p);
		if (cp == '"' || cp == '\\')
			o += (size_t)sprintf(out + o, "\\%c", (char)cp);
		else
			o += (size_t)sprintf(out + o, "\\u%04x", cp);
	}
	out[o++] = '"';
	out[o] = 0;
}

struct extra {
	const char *merges_style; /* "str" or "pair" */
	const char *ignore_merges;
	const char *normalizer;
	const char *pre;
	const char *post;
	const char *added;
};

/* vocab: 256 bytes (ids 0..255) then these merged tokens */
static const char *const MERGED[] = {"he", "ll", "hell", "hello", " w", "aa", "abc", "lo"};
static const char *const MERGES[][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}, {"a", "a"}, {"l", "o"}};

static size_t build_json(char *buf, size_t cap, const struct extra *x)
{
	size_t n = 0;
	char t[64], u[64];
	n += (size_t)snprintf(buf + n, cap - n, "{\"version\":\"1.0\",\"added_tokens\":[%s],\"normalizer\":%s,"
			      "\"pre_tokenizer\":%s,\"post_processor\":%s,\"decoder\":{\"type\":\"ByteLevel\"},"
			      "\"model\":{\"type\":\"BPE\",\"ignore_merges\":%s,\"vocab\":{",
			      x->added ? x->added : "", x->normalizer ? x->normalizer : "null",
			      x->pre ? x->pre
				     : "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
				       "\" ?\\\\p{L}+|\\\\p{N}|\\\\s+|[^\\\\s\\\\p{L}\\\\p{N}]+\"},\"behavior\":\"Isolated\","
				       "\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}",
			      x->post ? x->post : "null", x->ignore_merges ? x->ignore_merges : "false");
	for (int b = 0; b < 256; b++) {
		char raw[2] = {(char)b, 0};
		if (b == 0)
			snprintf(t, sizeof t, "\"\\u%04x\"", byte_cp(0));
		else
			json_tok(t, raw);
		n += (size_t)snprintf(buf + n, cap - n, "%s%s:%d", b ? "," : "", t, b);
	}
	for (size_t i = 0; i < sizeof MERGED / sizeof *MERGED; i++) {
		json_tok(t, MERGED[i]);
		n += (size_t)snprintf(buf + n, cap - n, ",%s:%zu", t, 256 + i);
	}
	n += (size_t)snprintf(buf + n, cap - n, "},\"merges\":[");
	for (size_t i = 0; i < sizeof MERGES / sizeof *MERGES; i++) {
		json_tok(t, MERGES[i][0]);
		json_tok(u, MERGES[i][1]);
		t[strlen(t) - 1] = 0; /* drop the closing quote of the left side */
		if (x->merges_style && !strcmp(x->merges_style, "pair"))
			n += (size_t)snprintf(buf + n, cap - n, "%s[%s\",%s]", i ? "," : "", t, u);
		else
			n += (size_t)snprintf(buf + n, cap - n, "%s%s %s", i ? "," : "", t, u + 1);
	}
	n += (size_t)snprintf(buf + n, cap - n, "]}}");
	return n;
}

static struct fp4s_tokenizer *load(const struct extra *x, const char *file)
{
	static char buf[1 << 16];
	size_t n = build_json(buf, sizeof buf, x);
	write_file(file, buf, n);
	struct fp4s_tokenizer *tok = NULL;
	struct fp4s_error err = {0};
	CHECK_MSG(fp4s_tok_open(&tok, path_of(file), &err) == 0, "%s", err.msg);
	return tok;
}

static void expect(struct fp4s_tokenizer *tok, const char *text, unsigned flags, const int32_t *want, size_t n)
{
	struct fp4s_tok_ids ids = {0};
	struct fp4s_error err = {0};
	if (!tok)
		return;
	CHECK(fp4s_tok_encode(tok, text, strlen(text), flags, &ids, &err) == 0);
	int ok = ids.n == n;
	for (size_t i = 0; ok && i < n; i++)
		ok = ids.v[i] == want[i];
	if (!ok) {
		fprintf(stderr, "ids of \"%s\":", text);
		for (size_t i = 0; i < ids.n; i++)
			fprintf(stderr, " %d", ids.v[i]);
		fprintf(stderr, "\n");
	}
	CHECK(ok);
	fp4s_tok_ids_free(&ids);
}

static void expect_fail(const char *what, const char *json)
{
	struct fp4s_tokenizer *tok = NULL;
	struct fp4s_error err = {0};
	write_file("bad.json", json, strlen(json));
	int rc = fp4s_tok_open(&tok, path_of("bad.json"), &err);
	CHECK_MSG(rc != 0 && tok == NULL && err.msg[0], "%s: expected an error", what);
	fp4s_tok_close(tok);
}

static void features(void)
{
	enum { HE = 256, LL, HELL, HELLO, SW, AA, ABC, LO };
	struct extra x = {0};
	struct fp4s_tokenizer *a = load(&x, "tokenizer.json");
	x.merges_style = "pair";
	struct fp4s_tokenizer *b = load(&x, "pairs.json");
	for (int k = 0; k < 2; k++) {
		struct fp4s_tokenizer *t = k ? b : a;
		expect(t, "hello", 0, (int32_t[]){HELLO}, 1);
		expect(t, " world", 0, (int32_t[]){SW, 'o', 'r', 'l', 'd'}, 5);
		expect(t, "aaa", 0, (int32_t[]){AA, 'a'}, 2);      /* leftmost of equal ranks */
		expect(t, "hellolo", 0, (int32_t[]){HELLO, LO}, 2); /* rank order, not length */
		expect(t, "abc", 0, (int32_t[]){'a', 'b', 'c'}, 3); /* no merge path to "abc" */
		expect(t, "12", 0, (int32_t[]){'1', '2'}, 2);       /* \p{N} splits digits */
		expect(t, "", 0, NULL, 0);
	}
	fp4s_tok_close(b);
	x.merges_style = NULL;
	x.ignore_merges = "true";
	b = load(&x, "ignore.json");
	expect(b, "abc", 0, (int32_t[]){ABC}, 1); /* a whole vocab entry wins with ignore_merges */
	fp4s_tok_close(b);
	fp4s_tok_close(a);

	/* added tokens: id 300 special, 301 not special with lstrip/rstrip, 302 a longer special */
	x = (struct extra){0};
	x.added = "{\"id\":300,\"content\":\"<|x|>\",\"special\":true},"
		  "{\"id\":301,\"content\":\"<y>\",\"special\":false,\"lstrip\":true,\"rstrip\":true},"
		  "{\"id\":302,\"content\":\"<|x|>!\",\"special\":true}";
	x.post = "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<|x|>\",\"type_id\":0}},"
		 "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}]}";
	a = load(&x, "added.json");
	expect(a, "he<|x|>he", FP4S_TOK_PARSE_SPECIAL, (int32_t[]){HE, 300, HE}, 3);
	expect(a, "<|x|>!", FP4S_TOK_PARSE_SPECIAL, (int32_t[]){302}, 1); /* longest */
	expect(a, "he  <y>  he", 0, (int32_t[]){HE, 301, HE}, 3);         /* strips, non-special always */
	expect(a, "<|x", FP4S_TOK_PARSE_SPECIAL, (int32_t[]){'<', '|', 'x'}, 3);
	expect(a, "he", FP4S_TOK_ADD_SPECIAL, (int32_t[]){300, HE}, 2); /* TemplateProcessing BOS */
	if (a) {
		CHECK_EQ_INT(fp4s_tok_find(a, "<y>"), 301);
		CHECK(fp4s_tok_is_special(a, 300) && !fp4s_tok_is_special(a, 301));
		/* decode: special skipped on request, out-of-range id refused */
		struct fp4s_tok_text out = {0};
		struct fp4s_error err = {0};
		CHECK(fp4s_tok_decode(a, (int32_t[]){300, HE, 301}, 3, FP4S_TOK_SKIP_SPECIAL, &out, &err) == 0);
		CHECK_EQ_STR(out.s, "he<y>");
		CHECK(fp4s_tok_decode(a, (int32_t[]){HE, 99999}, 2, 0, &out, &err) == FP4S_EINVAL);
		CHECK(fp4s_tok_decode(a, (int32_t[]){-1}, 1, 0, &out, &err) == FP4S_EINVAL);
		/* streaming: a 4-byte emoji as 4 byte tokens comes out whole; bad bytes become U+FFFD */
		struct fp4s_tok_stream s;
		fp4s_tok_stream_init(&s, a, 0);
		static const unsigned char emoji[] = {0xF0, 0x9F, 0x99, 0x82};
		size_t lens[4];
		for (int i = 0; i < 4; i++) {
			CHECK(fp4s_tok_stream_push(&s, emoji[i], &out, &err) == 0);
			lens[i] = out.n;
		}
		CHECK(lens[0] == 0 && lens[1] == 0 && lens[2] == 0 && lens[3] == 4);
		out.n = 0;
		fp4s_tok_stream_push(&s, 0xFF, &out, &err);
		fp4s_tok_stream_push(&s, 0xE2, &out, &err);
		fp4s_tok_stream_push(&s, 'a', &out, &err);
		fp4s_tok_stream_push(&s, 0xC3, &out, &err);
		fp4s_tok_stream_flush(&s, &out);
		CHECK_EQ_STR(out.s, "\xEF\xBF\xBD\xEF\xBF\xBD" "a\xEF\xBF\xBD");
		CHECK(fp4s_tok_stream_push(&s, 123456, &out, &err) == FP4S_EINVAL);
		fp4s_tok_text_free(&out);
	}

	/* tokenizer_config / generation_config beside the file */
	static const char cfg[] = "{\"add_bos_token\": false, \"eos_token\": {\"content\": \"<|x|>!\"},"
				  "\"model_max_length\": 1000000000000000019884624838656,"
				  "\"chat_template\": \"{{ '<|im_start|>' }}\"}";
	write_file("tokenizer_config.json", cfg, sizeof cfg - 1);
	static const char gen[] = "{\"eos_token_id\": [301, 300], \"bos_token_id\": 300}";
	write_file("generation_config.json", gen, sizeof gen - 1);
	fp4s_tok_close(a);
	a = load(&x, "added.json");
	expect(a, "he", FP4S_TOK_ADD_SPECIAL, (int32_t[]){HE}, 1); /* add_bos_token false wins */
	if (a) {
		size_t n;
		const int32_t *st = fp4s_tok_stop_ids(a, &n);
		CHECK(n == 3 && st[0] == 301 && st[1] == 300 && st[2] == 302);
		CHECK_EQ_INT(fp4s_tok_eos(a), 302);
		CHECK_EQ_STR(fp4s_chat_format_name(fp4s_tok_chat(a)->format), "chatml");
		struct fp4s_error err = {0};
		CHECK(fp4s_tok_set_chat_format(a, "harmony", &err) == 0);
		CHECK_EQ_STR(fp4s_chat_format_name(fp4s_tok_chat(a)->format), "harmony");
		CHECK(fp4s_tok_set_chat_format(a, "jinja-magic", &err) == FP4S_EINVAL);
		CHECK_EQ_STR(fp4s_tok_chat_template(a), "{{ '<|im_start|>' }}");
	}
	fp4s_tok_close(a);
	unlink(path_of("tokenizer_config.json"));
	unlink(path_of("generation_config.json"));

	/* NFC normalizer and a String Split pattern */
	x = (struct extra){0};
	x.normalizer = "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"}]}";
	x.pre = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"String\":\"l\"},"
		"\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"use_regex\":false}]}";
	a = load(&x, "nfc.json");
	expect(a, "e\xCC\x81", 0, (int32_t[]){0xC3, 0xA9}, 2); /* e + U+0301 -> U+00E9 */
	/* U+1100 U+1161 U+11A7 -> U+AC00 U+11A7: U+11A7 is no trailing consonant and stays, which
	 * utf8proc_NFC gets wrong and the tests' reference corrects (nfc_ref.h; found by fuzz_encode) */
	expect(a, "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA7", 0, (int32_t[]){0xEA, 0xB0, 0x80, 0xE1, 0x86, 0xA7}, 6);
	{
		utf8proc_uint8_t *ref = t_nfc_ref((const utf8proc_uint8_t *)"a\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA7"
		                                                             "e\xCC\x81\xE1\x86\xA7\xE1\x86\xA7");
		CHECK(ref && !strcmp((char *)ref, "a\xEA\xB0\x80\xE1\x86\xA7\xC3\xA9\xE1\x86\xA7\xE1\x86\xA7"));
		free(ref);
	}
	expect(a, "hello", 0, (int32_t[]){HE, 'l', 'l', 'o'}, 4);
	/* every BMP code point (and a sample beyond) between composing neighbours: the encoder's NFC
	 * shortcut (only stretches around unsafe code points are normalized) must equal utf8proc_NFC */
	int nfc_bad = 0;
	for (int32_t cp = 1; a && cp < 0x30000 && nfc_bad < 5; cp += cp < 0x10000 ? 1 : 7) {
		if (cp >= 0xD800 && cp < 0xE000)
			continue;
		utf8proc_uint8_t in[64];
		size_t n = 0;
		const int32_t seq[] = {'e', cp, 0x301, cp, 0x1161, 0x1100, cp, 0x11A8, 'x'};
		for (size_t k = 0; k < sizeof seq / sizeof *seq; k++)
			n += (size_t)utf8proc_encode_char(seq[k], in + n);
		in[n] = 0;
		utf8proc_uint8_t *want = utf8proc_NFC(in);
		struct fp4s_tok_ids ids = {0};
		struct fp4s_tok_text out = {0};
		struct fp4s_error err = {0};
		int ok = fp4s_tok_encode(a, (const char *)in, n, 0, &ids, &err) == 0 &&
			 fp4s_tok_decode(a, ids.v, ids.n, 0, &out, &err) == 0 && want && out.n == strlen((char *)want) &&
			 !memcmp(out.s, want, out.n);
		if (!ok) {
			nfc_bad++;
			fprintf(stderr, "NFC differs around U+%04X\n", (unsigned)cp);
		}
		free(want);
		fp4s_tok_ids_free(&ids);
		fp4s_tok_text_free(&out);
	}
	CHECK_EQ_INT(nfc_bad, 0);
	fp4s_tok_close(a);

	/* NFKC (utf8proc on the whole run): compatibility forms fold, and U+11A7 after an LV
	 * syllable stays (map_composed) */
	x.normalizer = "{\"type\":\"NFKC\"}";
	a = load(&x, "nfkc.json");
	expect(a, "\xEF\xAC\x81" "e\xCC\x81", 0, (int32_t[]){'f', 'i', 0xC3, 0xA9}, 4); /* U+FB01, e + U+0301 */
	expect(a, "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA7", 0, (int32_t[]){0xEA, 0xB0, 0x80, 0xE1, 0x86, 0xA7}, 6);
	expect(a, "\xE1\x86\xA7\xEA\xB0\x80\xE1\x86\xA7\xE1\x86\xA7x\xE1\x84\x80\xE1\x85\xA1", 0,
	       (int32_t[]){0xE1, 0x86, 0xA7, 0xEA, 0xB0, 0x80, 0xE1, 0x86, 0xA7, 0xE1, 0x86, 0xA7, 'x', 0xEA, 0xB0, 0x80}, 16);
	fp4s_tok_close(a);

	/* ByteLevel add_prefix_space applies to every piece that reaches it, as in Hugging Face */
	x = (struct extra){0};
	x.pre = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
		"\"\\\\p{L}+|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},"
		"{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":false}]}";
	a = load(&x, "prefix.json");
	expect(a, "he he", 0, (int32_t[]){' ', HE, ' ', ' ', HE}, 5);
	fp4s_tok_close(a);
	x.pre = "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true}"; /* GPT-2 style */
	a = load(&x, "prefix.json");
	expect(a, "hello world", 0, (int32_t[]){' ', HELLO, SW, 'o', 'r', 'l', 'd'}, 7);
	fp4s_tok_close(a);
	unlink(path_of("prefix.json"));
}

static void malformed(void)
{
	expect_fail("not JSON", "this is not json");
	expect_fail("truncated", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0");
	expect_fail("empty object", "{}");
	expect_fail("WordPiece", "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}");
	expect_fail("vocab types", "{\"model\":{\"type\":\"BPE\",\"vocab\":[],\"merges\":[]}}");
	expect_fail("negative id", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}");
	expect_fail("huge id", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":2000000000},\"merges\":[]}}");
	expect_fail("string id", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"0\"},\"merges\":[]}}");
	expect_fail("missing bytes", "{\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\","
				     "\"vocab\":{\"a\":0},\"merges\":[]}}");
	/* mutate a valid file: a merge naming a missing token, a bad regex, unsupported pieces */
	static char buf[1 << 16];
	struct extra x = {0};
	size_t n = build_json(buf, sizeof buf, &x);
	char *m = strstr(buf, "\"merges\":[");
	static char bad[1 << 16];
	snprintf(bad, sizeof bad, "%.*s\"merges\":[\"zz qq\"]}}", (int)(m - buf), buf);
	expect_fail("merge out of vocab", bad);
	snprintf(bad, sizeof bad, "%.*s\"merges\":[\"a\"]}}", (int)(m - buf), buf);
	expect_fail("merge with one side", bad);
	snprintf(bad, sizeof bad, "%.*s\"merges\":[[\"a\"]]}}", (int)(m - buf), buf);
	expect_fail("merge pair of one", bad);
	x.pre = "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"}";
	build_json(bad, sizeof bad, &x);
	expect_fail("bad regex", bad);
	x.pre = "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Removed\"}";
	build_json(bad, sizeof bad, &x);
	expect_fail("Split Removed", bad);
	x.pre = NULL;
	x.normalizer = "{\"type\":\"Lowercase\"}";
	build_json(bad, sizeof bad, &x);
	expect_fail("Lowercase normalizer", bad);
	x.normalizer = NULL;
	x.added = "{\"id\":5}";
	build_json(bad, sizeof bad, &x);
	expect_fail("added token without content", bad);
	x.added = "{\"id\":300,\"content\":\"\"}";
	build_json(bad, sizeof bad, &x);
	expect_fail("empty added token", bad);

	/* random byte mutations of a valid file: load or fail cleanly; if it loads, it encodes */
	for (int it = 0; it < 150; it++) {
		memcpy(bad, buf, n);
		int k = 1 + (int)(t_rand_u64() % 4);
		for (int j = 0; j < k; j++)
			bad[t_rand_u64() % n] = (char)t_rand_u64();
		write_file("mut.json", bad, n);
		struct fp4s_tokenizer *tok = NULL;
		struct fp4s_error err = {0};
		if (fp4s_tok_open(&tok, path_of("mut.json"), &err) == 0) {
			struct fp4s_tok_ids ids = {0};
			CHECK(fp4s_tok_encode(tok, "hello world 123 \xF0\x9F\x99\x82", 19, 3, &ids, &err) == 0);
			fp4s_tok_ids_free(&ids);
			fp4s_tok_close(tok);
		} else {
			CHECK(err.msg[0] != 0);
		}
	}

	/* llama2.c .bin: empty, bad max length, truncated entry, bad lengths */
	struct {
		const char *what;
		const char *data;
		size_t n;
	} bins[] = {
		{"empty", "", 0},
		{"max_len 0", "\0\0\0\0", 4},
		{"truncated entry", "\x10\0\0\0\0\0\0\0\x05\0\0\0ab", 14},
		{"negative length", "\x10\0\0\0\0\0\0\0\xff\xff\xff\xff", 12},
		{"length over max", "\x02\0\0\0\0\0\0\0\x05\0\0\0hello", 17},
	};
	for (size_t i = 0; i < sizeof bins / sizeof *bins; i++) {
		write_file("tok.bin", bins[i].data, bins[i].n);
		struct fp4s_tokenizer *tok = NULL;
		struct fp4s_error err = {0};
		CHECK_MSG(fp4s_tok_open(&tok, path_of("tok.bin"), &err) != 0 && err.msg[0], "%s", bins[i].what);
		fp4s_tok_close(tok);
	}
	/* a minimal valid one: no byte pieces, so unknown text falls back to <unk> */
	static const char ok_bin[] = "\x06\0\0\0" "\0\0\0\0\x05\0\0\0<unk>" "\0\0\0\0\x05\0\0\0\n<s>\n"
				     "\0\0\0\0\x06\0\0\0\n</s>\n" "\0\0\x80\x3f\x02\0\0\0 a";
	write_file("tok.bin", ok_bin, sizeof ok_bin - 1);
	struct fp4s_tokenizer *tok = NULL;
	struct fp4s_error err = {0};
	CHECK(fp4s_tok_open(&tok, path_of("tok.bin"), &err) == 0);
	expect(tok, "a", FP4S_TOK_ADD_SPECIAL, (int32_t[]){1, 3}, 2);
	expect(tok, "b", 0, (int32_t[]){0, 0}, 2); /* " " and "b" unknown */
	fp4s_tok_close(tok);

	/* GGUF: truncations and mutations of the real gpt-2 vocab file must fail cleanly or load */
	char gp[1024];
	size_t gn;
	char *g = tt_read(tt_shared_path(gp, sizeof gp, "realdata/tokenizer-tests/ggml-vocab-gpt-2.gguf"), &gn);
	for (int it = 0; g && it < 24; it++) {
		size_t len = gn;
		char *mut = malloc(gn);
		memcpy(mut, g, gn);
		if (it % 2)
			len = (size_t)(t_rand_u64() % gn);
		else
			for (int j = 0; j < 3; j++)
				mut[t_rand_u64() % (gn < 65536 ? gn : 65536)] = (char)t_rand_u64();
		write_file("mut.gguf", mut, len);
		free(mut);
		tok = NULL;
		if (fp4s_tok_open(&tok, path_of("mut.gguf"), &err) == 0) {
			struct fp4s_tok_ids ids = {0};
			CHECK(fp4s_tok_encode(tok, "hello world", 11, 3, &ids, &err) == 0);
			fp4s_tok_ids_free(&ids);
			fp4s_tok_close(tok);
		} else {
			CHECK(err.msg[0] != 0);
		}
	}
	free(g);
	unlink(path_of("mut.gguf"));

	CHECK(fp4s_tok_open(&tok, path_of("does-not-exist"), &err) == FP4S_EIO);
	mkdir(path_of("empty"), 0755);
	CHECK(fp4s_tok_open(&tok, path_of("empty"), &err) == FP4S_EIO); /* a directory without a tokenizer */
	rmdir(path_of("empty"));
}

int main(void)
{
	t_seed_from_env();
	const char *c = getenv("FP4S_CACHE_DIR");
	snprintf(dir, sizeof dir, "%s/tok-test-XXXXXX", c ? c : "/tmp");
	mkdir(c ? c : "/tmp", 0755);
	if (!mkdtemp(dir)) {
		snprintf(dir, sizeof dir, "/tmp/tok-test-XXXXXX");
		if (!mkdtemp(dir))
			TEST_SKIP("cannot create a temporary directory");
	}
	features();
	malformed();
	static const char *const files[] = {"tokenizer.json", "pairs.json", "ignore.json", "added.json", "nfc.json",
					    "nfkc.json", "bad.json", "mut.json", "tok.bin"};
	for (size_t i = 0; i < sizeof files / sizeof *files; i++)
		unlink(path_of(files[i]));
	rmdir(dir);
	return TEST_DONE();
}
