/* srv_harmony.c: splits gpt-oss "harmony" output into reasoning_content and content.
 *
 * After the generation prompt `<|start|>assistant` the model writes messages such as
 *   <|channel|>analysis<|message|>...thinking...<|end|><|start|>assistant<|channel|>final<|message|>...answer
 * ending in <|return|> (an EOS id, so it never reaches us). The analysis channel maps to
 * reasoning_content, final and commentary to content; headers and markers are dropped. The
 * engine streams special tokens as their text (the request asks not to skip them), and a marker
 * may arrive cut by stop-string hold-back, so a possible marker prefix at the end of a feed is
 * held until the next one. A model that never writes a header (a random demo model) would lose
 * everything, so a header that grows past its buffer, or is all there is at the end, is content. */
#include <string.h>

#include "server/srv.h"

enum { SRV_HARMONY_HEADER = 0, SRV_HARMONY_MESSAGE, SRV_HARMONY_IDLE };

void srv_harmony_init(struct srv_harmony *h)
{
	memset(h, 0, sizeof *h);
	h->state = SRV_HARMONY_HEADER; /* the prompt ended with <|start|>assistant */
}

static int emit(struct srv_harmony *h, const char *s, size_t n, struct fp4s_tok_text *content,
                struct fp4s_tok_text *reasoning)
{
	if (!n)
		return 0;
	return fp4s_tok_text_append(h->channel ? reasoning : content, s, n);
}

static int hdr_add(struct srv_harmony *h, const char *s, size_t n, struct fp4s_tok_text *content)
{
	if (h->n_hdr + n > sizeof h->hdr) {
		/* no header is this long: this is plain text from a model that ignores the format */
		int rc = fp4s_tok_text_append(content, h->hdr, h->n_hdr);
		h->n_hdr = 0;
		h->state = SRV_HARMONY_MESSAGE;
		h->channel = 0;
		return rc ? rc : fp4s_tok_text_append(content, s, n);
	}
	memcpy(h->hdr + h->n_hdr, s, n);
	h->n_hdr += n;
	return 0;
}

static int text(struct srv_harmony *h, const char *s, size_t n, struct fp4s_tok_text *content,
                struct fp4s_tok_text *reasoning)
{
	if (h->state == SRV_HARMONY_MESSAGE)
		return emit(h, s, n, content, reasoning);
	if (h->state == SRV_HARMONY_HEADER)
		return hdr_add(h, s, n, content);
	return 0; /* between messages: nothing a client should see */
}

static int marker(struct srv_harmony *h, const char *m, size_t n, struct fp4s_tok_text *content,
                  struct fp4s_tok_text *reasoning)
{
#define IS(lit) (n == sizeof lit - 1 && memcmp(m, lit, n) == 0)
	if (IS("<|end|>") || IS("<|return|>") || IS("<|call|>")) {
		h->state = SRV_HARMONY_IDLE;
		h->n_hdr = 0;
		return 0;
	}
	if (IS("<|start|>")) {
		h->state = SRV_HARMONY_HEADER;
		h->n_hdr = 0;
		return 0;
	}
	if (IS("<|message|>") && h->state == SRV_HARMONY_HEADER) {
		/* the channel name follows <|channel|> in the header */
		h->channel = 0;
		for (size_t i = 0; i + 8 <= h->n_hdr; i++)
			if (memcmp(h->hdr + i, "analysis", 8) == 0)
				h->channel = 1;
		h->n_hdr = 0;
		h->state = SRV_HARMONY_MESSAGE;
		return 0;
	}
	if ((IS("<|channel|>") || IS("<|constrain|>")) && h->state != SRV_HARMONY_MESSAGE) {
		if (h->state == SRV_HARMONY_IDLE)
			h->state = SRV_HARMONY_HEADER, h->n_hdr = 0;
		return hdr_add(h, m, n, content);
	}
#undef IS
	return text(h, m, n, content, reasoning); /* not a harmony marker: ordinary text */
}

/* A marker is "<|", a name of 1 to MARKER_NAME_MAX lower-case letters or '_', and "|>", so the
 * decision at each "<|" needs only the bytes up to its end. Returns the marker's length, 1 if the
 * bytes at s cannot be one, or 0 if the n bytes there are all a prefix of one (more may come).
 * Whether text is cut into feeds therefore never changes how it parses: in "<|x<|end|>" the
 * first "<|" is text and <|end|> a marker, whole or fed byte by byte. */
#define MARKER_NAME_MAX 9 /* "constrain" */
static size_t marker_len(const char *s, size_t n)
{
	size_t i = 2;
	while (i < n && i - 2 < MARKER_NAME_MAX && ((s[i] >= 'a' && s[i] <= 'z') || s[i] == '_'))
		i++;
	if (i == n)
		return 0; /* "<|name" so far */
	if (i == 2 || s[i] != '|')
		return 1;
	if (i + 1 == n)
		return 0; /* "<|name|" so far */
	return s[i + 1] == '>' ? i + 2 : 1;
}

int srv_harmony_feed(struct srv_harmony *h, const char *in, size_t len, int final,
                     struct fp4s_tok_text *content, struct fp4s_tok_text *reasoning)
{
	/* a held partial marker goes in front of the new text */
	struct fp4s_tok_text joined = {0};
	if (h->n_part) {
		if (fp4s_tok_text_append(&joined, h->part, h->n_part) ||
		    fp4s_tok_text_append(&joined, in, len)) {
			fp4s_tok_text_free(&joined);
			return FP4S_ENOMEM;
		}
		in = joined.s, len = joined.n;
		h->n_part = 0;
	}
	int rc = 0;
	const char *p = in, *end = in + len;
	while (p < end && !rc) {
		const char *lt = memmem(p, (size_t)(end - p), "<|", 2);
		if (!lt) {
			/* a lone '<' at the very end may start a marker */
			const int hold = !final && end[-1] == '<';
			rc = text(h, p, (size_t)(end - p) - (size_t)hold, content, reasoning);
			if (hold)
				h->part[0] = '<', h->n_part = 1;
			break;
		}
		rc = text(h, p, (size_t)(lt - p), content, reasoning);
		const size_t m = marker_len(lt, (size_t)(end - lt));
		if (m == 0 && !final) {
			memcpy(h->part, lt, (size_t)(end - lt)); /* may still become a marker */
			h->n_part = (size_t)(end - lt);
			break;
		}
		if (m > 1) {
			rc = rc ? rc : marker(h, lt, m, content, reasoning);
			p = lt + m;
		} else {
			rc = rc ? rc : text(h, lt, 2, content, reasoning);
			p = lt + 2;
		}
	}
	if (final && !rc) {
		/* a header that never got its <|message|> was never a header */
		if (h->state == SRV_HARMONY_HEADER && h->n_hdr)
			rc = fp4s_tok_text_append(content, h->hdr, h->n_hdr);
		h->n_hdr = 0;
	}
	fp4s_tok_text_free(&joined);
	return rc;
}
