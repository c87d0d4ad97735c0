/* tok_chat.c: built-in chat formats, chosen by sniffing the model's Jinja chat template (the first
 * stage of design in engineering.md §4.3; a Jinja interpreter may come later).
 *
 * Each formatter reproduces, byte for byte, what Hugging Face's apply_chat_template renders with
 * the model's own template for conversations without tools (tests/fixtures/chat/ holds the golden
 * strings, made by tools/chat_golden.mjs):
 *   llama3    Meta-Llama-3 (3.0): BOS, header blocks with trimmed content, <|eot_id|>
 *   llama3.1  Llama 3.1/3.2/3.3: always a system block starting with the knowledge/date lines
 *   chatml    <|im_start|>role\n...<|im_end|>\n
 *   qwen3     ChatML plus Qwen3's <think> handling: reasoning kept only after the last user query,
 *             and an empty think block in the generation prompt when enable_thinking is false
 *   harmony   gpt-oss: system message (identity, dates, reasoning effort, channels), the first
 *             system/developer message as developer "# Instructions", final-channel history
 * Tool calls are not rendered by the built-in formatters: a tool message is refused where the
 * template would need the call that preceded it. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "tokenizer/tok_internal.h"

static const char *const FORMAT_NAMES[FP4S_CHAT_COUNT] = {
	[FP4S_CHAT_NONE] = "none",     [FP4S_CHAT_LLAMA3] = "llama3", [FP4S_CHAT_LLAMA31] = "llama3.1",
	[FP4S_CHAT_CHATML] = "chatml", [FP4S_CHAT_QWEN3] = "qwen3",   [FP4S_CHAT_HARMONY] = "harmony",
};

const char *fp4s_chat_format_name(enum fp4s_chat_format f)
{
	return f >= 0 && f < FP4S_CHAT_COUNT ? FORMAT_NAMES[f] : "?";
}

int fp4s_chat_format_from_name(const char *name, enum fp4s_chat_format *out)
{
	for (int i = 1; i < FP4S_CHAT_COUNT; i++) {
		if (!strcmp(name, FORMAT_NAMES[i])) {
			*out = (enum fp4s_chat_format)i;
			return 0;
		}
	}
	/* common aliases */
	if (!strcmp(name, "llama3.2") || !strcmp(name, "llama3.3") || !strcmp(name, "llama31")) {
		*out = FP4S_CHAT_LLAMA31;
		return 0;
	}
	if (!strcmp(name, "gpt-oss") || !strcmp(name, "qwen2")) {
		*out = !strcmp(name, "gpt-oss") ? FP4S_CHAT_HARMONY : FP4S_CHAT_CHATML;
		return 0;
	}
	return FP4S_EINVAL;
}

enum fp4s_chat_format fp4s_chat_detect(const char *tmpl, const struct fp4s_tokenizer *tok, unsigned *flags)
{
	unsigned f = 0;
	enum fp4s_chat_format r = FP4S_CHAT_NONE;
	if (tmpl) {
		if (strstr(tmpl, "<|channel|>") || strstr(tmpl, "<|start|>assistant"))
			r = FP4S_CHAT_HARMONY;
		else if (strstr(tmpl, "<|im_start|>"))
			r = strstr(tmpl, "<think>") || strstr(tmpl, "enable_thinking") ? FP4S_CHAT_QWEN3 : FP4S_CHAT_CHATML;
		else if (strstr(tmpl, "<|start_header_id|>"))
			r = strstr(tmpl, "Cutting Knowledge Date") ? FP4S_CHAT_LLAMA31 : FP4S_CHAT_LLAMA3;
		/* Meta-Llama-3-8B (base) appends the assistant header unconditionally */
		if (r == FP4S_CHAT_LLAMA3 && !strstr(tmpl, "add_generation_prompt"))
			f |= FP4S_CHAT_F_ALWAYS_GEN_PROMPT;
		if (r == FP4S_CHAT_LLAMA31 && strstr(tmpl, "strftime_now"))
			f |= FP4S_CHAT_F_DATE_NOW;
	}
	if (r == FP4S_CHAT_NONE && tok) {
		/* no template (gpt-oss ships it as a separate chat_template.jinja): go by special tokens */
		if (fp4s_tok_find(tok, "<|channel|>") >= 0 && fp4s_tok_find(tok, "<|start|>") >= 0)
			r = FP4S_CHAT_HARMONY;
		else if (fp4s_tok_find(tok, "<|start_header_id|>") >= 0)
			r = FP4S_CHAT_LLAMA3;
		else if (fp4s_tok_find(tok, "<|im_start|>") >= 0)
			r = fp4s_tok_find(tok, "<think>") >= 0 ? FP4S_CHAT_QWEN3 : FP4S_CHAT_CHATML;
	}
	if (flags)
		*flags = f;
	return r;
}

/* ---- string helpers with Python's semantics ---- */

struct span {
	const char *s;
	size_t n;
};

static struct span sp(const char *s)
{
	return (struct span){s ? s : "", s ? strlen(s) : 0};
}

/* Python str.strip() whitespace: ASCII \t\n\v\f\r, 0x1C-0x1F, space, and the Unicode spaces. */
static size_t space_len(const char *s, size_t n, int backwards)
{
	const unsigned char *p = (const unsigned char *)s;
	if (!n)
		return 0;
	unsigned char c = backwards ? p[n - 1] : p[0];
	if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F))
		return 1;
	if (c < 0x80 && !backwards)
		return 0;
	/* find the character's bounds */
	size_t start = 0, len;
	if (backwards) {
		start = n - 1;
		while (start > 0 && n - start < 4 && (p[start] & 0xC0) == 0x80)
			start--;
	}
	len = (size_t)tok_utf8_valid_len(p + start, n - start);
	if (!len || (backwards && start + len != n))
		return 0;
	uint32_t cp = tok_utf8_decode(p + start, (int)len);
	int ws = cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
		 cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
	return ws ? len : 0;
}

static struct span trim(struct span x)
{
	size_t k;
	while ((k = space_len(x.s, x.n, 0)))
		x.s += k, x.n -= k;
	while ((k = space_len(x.s, x.n, 1)))
		x.n -= k;
	return x;
}

static struct span lstrip_nl(struct span x)
{
	while (x.n && x.s[0] == '\n')
		x.s++, x.n--;
	return x;
}

static struct span rstrip_nl(struct span x)
{
	while (x.n && x.s[x.n - 1] == '\n')
		x.n--;
	return x;
}

static const char *find(struct span x, const char *needle)
{
	size_t m = strlen(needle);
	for (size_t i = 0; i + m <= x.n; i++)
		if (!memcmp(x.s + i, needle, m))
			return x.s + i;
	return NULL;
}

static const char *rfind(struct span x, const char *needle)
{
	size_t m = strlen(needle);
	for (size_t i = x.n; i >= m; i--)
		if (!memcmp(x.s + i - m, needle, m))
			return x.s + i - m;
	return NULL;
}

struct out {
	struct fp4s_tok_text *t;
	int oom;
};

static void put(struct out *o, const char *s)
{
	o->oom |= tok_text_appendz(o->t, s) != 0;
}

static void puts_(struct out *o, struct span x)
{
	o->oom |= tok_text_append(o->t, x.s, x.n) != 0;
}

static int is_role(const struct fp4s_chat_msg *m, const char *role)
{
	return m->role && !strcmp(m->role, role);
}

/* ---- formatters ---- */

static int fmt_llama3(const struct fp4s_chat_template *t, const struct fp4s_chat_msg *m, size_t n,
		      const struct fp4s_chat_opts *o, struct out *out, struct fp4s_error *err)
{
	size_t i = 0;
	if (t->format == FP4S_CHAT_LLAMA31) {
		char today[32];
		const char *date = o->date ? o->date : "26 Jul 2024";
		if (!o->date && (t->flags & FP4S_CHAT_F_DATE_NOW)) {
			time_t now = time(NULL);
			struct tm tm;
			localtime_r(&now, &tm);
			strftime(today, sizeof today, "%d %b %Y", &tm);
			date = today;
		}
		put(out, t->bos);
		put(out, "<|start_header_id|>system<|end_header_id|>\n\n");
		put(out, "Cutting Knowledge Date: December 2023\nToday Date: ");
		put(out, date);
		put(out, "\n\n");
		if (n && is_role(&m[0], "system")) {
			puts_(out, trim(sp(m[0].content)));
			i = 1;
		}
		put(out, "<|eot_id|>");
	}
	for (size_t k = i; k < n; k++) {
		if (k == 0 && t->format == FP4S_CHAT_LLAMA3) /* 3.1 put BOS before its system block */
			put(out, t->bos);
		const char *role = m[k].role ? m[k].role : "user";
		if (t->format == FP4S_CHAT_LLAMA31 && (!strcmp(role, "tool") || !strcmp(role, "ipython")))
			return fp4s_error_set(err, FP4S_EUNSUPPORTED, "llama3.1: tool messages need the Jinja template");
		put(out, "<|start_header_id|>");
		put(out, role);
		put(out, "<|end_header_id|>\n\n");
		puts_(out, trim(sp(m[k].content)));
		put(out, "<|eot_id|>");
	}
	if (o->add_generation_prompt || (t->flags & FP4S_CHAT_F_ALWAYS_GEN_PROMPT))
		put(out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
	return 0;
}

static int fmt_chatml(const struct fp4s_chat_template *t, const struct fp4s_chat_msg *m, size_t n,
		      const struct fp4s_chat_opts *o, struct out *out, struct fp4s_error *err)
{
	(void)t, (void)err;
	for (size_t k = 0; k < n; k++) {
		put(out, "<|im_start|>");
		put(out, m[k].role ? m[k].role : "user");
		put(out, "\n");
		puts_(out, sp(m[k].content));
		put(out, "<|im_end|>\n");
	}
	if (o->add_generation_prompt)
		put(out, "<|im_start|>assistant\n");
	return 0;
}

static int is_tool_response(struct span c)
{
	static const char a[] = "<tool_response>", b[] = "</tool_response>";
	return c.n >= sizeof a - 1 && !memcmp(c.s, a, sizeof a - 1) && c.n >= sizeof b - 1 &&
	       !memcmp(c.s + c.n - (sizeof b - 1), b, sizeof b - 1);
}

static int fmt_qwen3(const struct fp4s_chat_template *t, const struct fp4s_chat_msg *m, size_t n,
		     const struct fp4s_chat_opts *o, struct out *out, struct fp4s_error *err)
{
	(void)t, (void)err;
	if (n && is_role(&m[0], "system")) {
		put(out, "<|im_start|>system\n");
		puts_(out, sp(m[0].content));
		put(out, "<|im_end|>\n");
	}
	/* the last user turn that is not a tool result; reasoning survives only after it */
	size_t last_query = n ? n - 1 : 0;
	for (size_t k = n; k-- > 0;) {
		if (is_role(&m[k], "user") && !is_tool_response(sp(m[k].content))) {
			last_query = k;
			break;
		}
	}
	for (size_t k = 0; k < n; k++) {
		struct span c = sp(m[k].content);
		if (is_role(&m[k], "user") || (is_role(&m[k], "system") && k != 0)) {
			put(out, "<|im_start|>");
			put(out, m[k].role);
			put(out, "\n");
			puts_(out, c);
			put(out, "<|im_end|>\n");
		} else if (is_role(&m[k], "assistant")) {
			struct span content = c, reasoning = {"", 0};
			if (m[k].thinking) {
				reasoning = sp(m[k].thinking);
			} else if (find(c, "</think>")) {
				/* content.split('</think>')[-1].lstrip('\n') and
				 * content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
				const char *last = rfind(c, "</think>"), *first = find(c, "</think>");
				content = lstrip_nl((struct span){last + 8, (size_t)(c.s + c.n - last - 8)});
				struct span before = rstrip_nl((struct span){c.s, (size_t)(first - c.s)});
				const char *open = rfind(before, "<think>");
				if (open)
					before = (struct span){open + 7, (size_t)(before.s + before.n - open - 7)};
				reasoning = lstrip_nl(before);
			}
			put(out, "<|im_start|>assistant\n");
			if (k > last_query && (k == n - 1 || reasoning.n)) {
				put(out, "<think>\n");
				puts_(out, rstrip_nl(lstrip_nl(reasoning)));
				put(out, "\n</think>\n\n");
				puts_(out, lstrip_nl(content));
			} else {
				puts_(out, content);
			}
			put(out, "<|im_end|>\n");
		} else if (is_role(&m[k], "tool")) {
			if (k == 0 || !is_role(&m[k - 1], "tool"))
				put(out, "<|im_start|>user");
			put(out, "\n<tool_response>\n");
			puts_(out, c);
			put(out, "\n</tool_response>");
			if (k == n - 1 || !is_role(&m[k + 1], "tool"))
				put(out, "<|im_end|>\n");
		}
	}
	if (o->add_generation_prompt) {
		put(out, "<|im_start|>assistant\n");
		if (!o->enable_thinking)
			put(out, "<think>\n\n</think>\n\n");
	}
	return 0;
}

static int fmt_harmony(const struct fp4s_chat_template *t, const struct fp4s_chat_msg *m, size_t n,
		       const struct fp4s_chat_opts *o, struct out *out, struct fp4s_error *err)
{
	(void)t;
	char today[32];
	const char *date = o->date;
	if (!date) {
		time_t now = time(NULL);
		struct tm tm;
		localtime_r(&now, &tm); /* strftime_now in the template is local time */
		strftime(today, sizeof today, "%Y-%m-%d", &tm);
		date = today;
	}
	put(out, "<|start|>system<|message|>");
	put(out, o->model_identity ? o->model_identity : "You are ChatGPT, a large language model trained by OpenAI.");
	put(out, "\nKnowledge cutoff: 2024-06\nCurrent date: ");
	put(out, date);
	put(out, "\n\nReasoning: ");
	put(out, o->reasoning_effort ? o->reasoning_effort : "medium");
	put(out, "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.");
	put(out, "<|end|>");
	size_t k = 0;
	if (n && (is_role(&m[0], "developer") || is_role(&m[0], "system"))) {
		if (m[0].content && m[0].content[0]) {
			put(out, "<|start|>developer<|message|># Instructions\n\n");
			put(out, m[0].content);
			put(out, "\n\n<|end|>");
		}
		k = 1;
	}
	for (; k < n; k++) {
		struct span c = sp(m[k].content);
		if (is_role(&m[k], "assistant")) {
			if (find(c, "<|channel|>analysis<|message|>") || find(c, "<|channel|>final<|message|>") ||
			    (m[k].thinking && (find(sp(m[k].thinking), "<|channel|>analysis<|message|>") ||
					       find(sp(m[k].thinking), "<|channel|>final<|message|>"))))
				return fp4s_error_set(err, FP4S_EINVAL,
						      "harmony: message %zu contains <|channel|> tags; pass reasoning in "
						      "'thinking' and the answer in 'content'", k);
			if (k == n - 1 && !o->add_generation_prompt) {
				/* a trailing assistant turn (training only) keeps its CoT and ends with <|return|> */
				if (m[k].thinking) {
					put(out, "<|start|>assistant<|channel|>analysis<|message|>");
					put(out, m[k].thinking);
					put(out, "<|end|>");
				}
				put(out, "<|start|>assistant<|channel|>final<|message|>");
				puts_(out, c);
				put(out, "<|return|>");
			} else {
				put(out, "<|start|>assistant<|channel|>final<|message|>");
				puts_(out, c);
				put(out, "<|end|>");
			}
		} else if (is_role(&m[k], "user")) {
			put(out, "<|start|>user<|message|>");
			puts_(out, c);
			put(out, "<|end|>");
		} else if (is_role(&m[k], "tool")) {
			return fp4s_error_set(err, FP4S_EUNSUPPORTED,
					      "harmony: tool message %zu needs the assistant tool call before it, which "
					      "the built-in formatter does not render", k);
		}
		/* system/developer messages after the first are not rendered by the template */
	}
	if (o->add_generation_prompt)
		put(out, "<|start|>assistant");
	return 0;
}

int fp4s_chat_apply(const struct fp4s_chat_template *t, const struct fp4s_chat_msg *msgs, size_t n,
		    const struct fp4s_chat_opts *opts, struct fp4s_tok_text *text, struct fp4s_error *err)
{
	static const struct fp4s_chat_opts defaults = {.add_generation_prompt = 1, .enable_thinking = 1};
	struct out o = {text, 0};
	int rc;
	if (!opts)
		opts = &defaults;
	text->n = 0;
	put(&o, "");
	for (size_t k = 0; k < n; k++)
		if (!msgs[k].role)
			return fp4s_error_set(err, FP4S_EINVAL, "chat message %zu has no role", k);
	switch (t->format) {
	case FP4S_CHAT_LLAMA3:
	case FP4S_CHAT_LLAMA31: rc = fmt_llama3(t, msgs, n, opts, &o, err); break;
	case FP4S_CHAT_CHATML: rc = fmt_chatml(t, msgs, n, opts, &o, err); break;
	case FP4S_CHAT_QWEN3: rc = fmt_qwen3(t, msgs, n, opts, &o, err); break;
	case FP4S_CHAT_HARMONY: rc = fmt_harmony(t, msgs, n, opts, &o, err); break;
	default:
		return fp4s_error_set(err, FP4S_EUNSUPPORTED,
				      "no chat format for this model; pick one by name (llama3, llama3.1, chatml, "
				      "qwen3, harmony)");
	}
	if (!rc && o.oom)
		rc = fp4s_error_set(err, FP4S_ENOMEM, "out of memory formatting the chat");
	return rc;
}
