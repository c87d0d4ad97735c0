/* tokenizer.h: text <-> token ids for the model families fp4serve serves, and their chat formats.
 *
 * Two tokenizer kinds sit behind one struct (a GGUF file's tokenizer metadata loads into either):
 *   - Hugging Face tokenizer.json byte-level BPE (Llama 3, Qwen2/Qwen3, gpt-oss o200k): added tokens
 *     matched first, optional NFC normalizer, PCRE2 (JIT) Split pre-tokenizers, rank-ordered merges.
 *   - llama2.c's tokenizer.bin (stories260K tok512.bin, Llama 2): SentencePiece-style BPE by piece
 *     scores with a dummy space prefix and <0xXX> byte fallback.
 * Loaded files are untrusted: every size is bounded and a malformed file gives an error, never a
 * crash. A loaded tokenizer is read-only, so one may be shared by threads; each call allocates its
 * own scratch.
 *
 * Behaviour on inputs Hugging Face cannot even represent (documented choice, see tok_encode.c):
 * invalid UTF-8 bytes are not rejected. In byte-level BPE each invalid byte becomes its own
 * pre-token (so decode(encode(x)) == x holds for any bytes); the SentencePiece path byte-falls-back.
 * NUL bytes are ordinary characters (the text is length-delimited). */
#ifndef FP4S_TOKENIZER_H
#define FP4S_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "util/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct fp4s_tokenizer;

/* A growable id array that encode appends to; reuse it across calls to avoid reallocation. */
struct fp4s_tok_ids {
	int32_t *v;
	size_t n, cap;
};

/* A growable byte string (always NUL-terminated after a successful call; n excludes the NUL). */
struct fp4s_tok_text {
	char *s;
	size_t n, cap;
};

enum fp4s_tok_kind { FP4S_TOK_KIND_BPE_JSON = 1, FP4S_TOK_KIND_SPM_LLAMA2C = 2 };

/* encode flags */
enum {
	/* add BOS/EOS as the tokenizer's rules say (post_processor / add_bos_token; llama2.c: BOS) */
	FP4S_TOK_ADD_SPECIAL = 1u << 0,
	/* match added tokens marked "special" in the text (Hugging Face does by default). Non-special
	 * added tokens (e.g. Qwen's <tool_call>) are always matched, as in Hugging Face. */
	FP4S_TOK_PARSE_SPECIAL = 1u << 1,
};

/* decode flags */
enum {
	FP4S_TOK_SKIP_SPECIAL = 1u << 0, /* leave out special tokens (BOS, <|eot_id|>, ...) */
};

/* Opens a tokenizer from a model directory (tokenizer.json, else tokenizer.bin / tok512.bin; plus
 * tokenizer_config.json and generation_config.json when present) or from a single file
 * (tokenizer.json, a llama2.c .bin, or a GGUF file). A tokenizer.json file also picks up the
 * config files that sit next to it. */
int fp4s_tok_open(struct fp4s_tokenizer **out, const char *path, struct fp4s_error *err);
void fp4s_tok_close(struct fp4s_tokenizer *tok);

/* Appends the ids of text[0..len) to ids. */
int fp4s_tok_encode(const struct fp4s_tokenizer *tok, const char *text, size_t len, unsigned flags,
		    struct fp4s_tok_ids *ids, struct fp4s_error *err);
void fp4s_tok_ids_free(struct fp4s_tok_ids *ids);

/* Decodes ids into raw bytes (replacing out's contents). The bytes are exactly what the tokens
 * stand for, so a sequence cut in the middle of a character gives a partial UTF-8 sequence; use the
 * stream decoder for text that must be valid UTF-8. Out-of-range ids are an error. */
int fp4s_tok_decode(const struct fp4s_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags,
		    struct fp4s_tok_text *out, struct fp4s_error *err);
void fp4s_tok_text_free(struct fp4s_tok_text *t);
int fp4s_tok_text_append(struct fp4s_tok_text *t, const char *s, size_t n); /* 0 or FP4S_ENOMEM */

/* Streaming decode for generated tokens: push ids one at a time; each push appends to out only
 * complete, valid UTF-8 (an incomplete sequence waits for the next token; bytes that can never
 * form a valid sequence come out as U+FFFD, as Hugging Face's lossy decode does). flush emits what
 * is left (an unfinished sequence becomes U+FFFD). */
struct fp4s_tok_stream {
	const struct fp4s_tokenizer *tok;
	unsigned flags;      /* decode flags */
	/* a token has been seen: SentencePiece drops the leading space of the first piece (the dummy
	 * prefix); set started = 1 after init when streaming a continuation of earlier text */
	int started;
	int n_pend;          /* bytes of an unfinished UTF-8 sequence held back */
	unsigned char pend[4];
};
void fp4s_tok_stream_init(struct fp4s_tok_stream *s, const struct fp4s_tokenizer *tok, unsigned flags);
int fp4s_tok_stream_push(struct fp4s_tok_stream *s, int32_t id, struct fp4s_tok_text *out,
			 struct fp4s_error *err);
int fp4s_tok_stream_flush(struct fp4s_tok_stream *s, struct fp4s_tok_text *out);

/* Vocabulary queries. */
enum fp4s_tok_kind fp4s_tok_kind(const struct fp4s_tokenizer *tok);
int32_t fp4s_tok_n_vocab(const struct fp4s_tokenizer *tok);
/* The bytes a token stands for (not NUL-terminated); NULL for an out-of-range id. */
const char *fp4s_tok_piece(const struct fp4s_tokenizer *tok, int32_t id, size_t *len);
/* The id of a token given by its exact text (added/special tokens, or a vocab entry); -1 if none. */
int32_t fp4s_tok_find(const struct fp4s_tokenizer *tok, const char *text);
int fp4s_tok_is_special(const struct fp4s_tokenizer *tok, int32_t id);
int32_t fp4s_tok_bos(const struct fp4s_tokenizer *tok); /* -1 if none */
int32_t fp4s_tok_eos(const struct fp4s_tokenizer *tok); /* -1 if none */
int fp4s_tok_adds_bos(const struct fp4s_tokenizer *tok);
/* Ids that end generation: generation_config eos_token_id(s), the config's eos_token and the
 * chat format's end-of-turn tokens. */
const int32_t *fp4s_tok_stop_ids(const struct fp4s_tokenizer *tok, size_t *n);
/* The chat_template string from tokenizer_config.json (the default one), or NULL. */
const char *fp4s_tok_chat_template(const struct fp4s_tokenizer *tok);

/* ---- chat formats ---- */

enum fp4s_chat_format {
	FP4S_CHAT_NONE = 0,
	FP4S_CHAT_LLAMA3,   /* Llama 3.0 header-id format */
	FP4S_CHAT_LLAMA31,  /* Llama 3.1/3.2/3.3: always a system block with the date lines */
	FP4S_CHAT_CHATML,   /* plain ChatML (Qwen2/2.5 style, no default system message) */
	FP4S_CHAT_QWEN3,    /* ChatML with Qwen3 <think> handling and enable_thinking */
	FP4S_CHAT_HARMONY,  /* gpt-oss harmony */
	FP4S_CHAT_COUNT
};

/* format flags (found by detection, or set by the caller) */
enum {
	/* the template appends the generation prompt even when add_generation_prompt is false
	 * (Meta-Llama-3-8B base's template does) */
	FP4S_CHAT_F_ALWAYS_GEN_PROMPT = 1u << 0,
	/* Llama 3.2/3.3: the default date is today (the template calls strftime_now), not 26 Jul 2024 */
	FP4S_CHAT_F_DATE_NOW = 1u << 1,
};

struct fp4s_chat_msg {
	const char *role;     /* system, developer, user, assistant, tool */
	const char *content;  /* may be NULL (treated as "") */
	const char *thinking; /* assistant reasoning (Qwen3 reasoning_content, harmony analysis); NULL if none */
};

struct fp4s_chat_opts {
	int add_generation_prompt;
	int enable_thinking;          /* Qwen3; 1 = template default (thinking on) */
	const char *reasoning_effort; /* harmony: low|medium|high; NULL = "medium" */
	const char *model_identity;   /* harmony; NULL = the template's default */
	const char *date;             /* harmony "YYYY-MM-DD" / Llama 3.1 "26 Jul 2024"; NULL = default */
};

struct fp4s_chat_template {
	enum fp4s_chat_format format;
	unsigned flags;
	char bos[64]; /* the BOS text the format starts with (Llama 3); "" if none */
};

const char *fp4s_chat_format_name(enum fp4s_chat_format f);
/* By name: llama3, llama3.1, chatml, qwen3, harmony (the --chat-template NAME values). */
int fp4s_chat_format_from_name(const char *name, enum fp4s_chat_format *out);
/* Detects the family from a Jinja chat template string (may be NULL) and, when that is not enough,
 * from the tokenizer's special tokens (tok may be NULL). Returns FP4S_CHAT_NONE if unknown. */
enum fp4s_chat_format fp4s_chat_detect(const char *tmpl, const struct fp4s_tokenizer *tok, unsigned *flags);
/* The tokenizer's chat format: detected at open time, or the one forced with set. */
const struct fp4s_chat_template *fp4s_tok_chat(const struct fp4s_tokenizer *tok);
int fp4s_tok_set_chat_format(struct fp4s_tokenizer *tok, const char *name, struct fp4s_error *err);
/* Picks the format from a Jinja template's text (--chat-template FILE); FP4S_EUNSUPPORTED if the
 * template is of no family the built-in formatters know. */
int fp4s_tok_set_chat_template(struct fp4s_tokenizer *tok, const char *tmpl, struct fp4s_error *err);

/* Renders messages as the prompt string (replacing out's contents). */
int fp4s_chat_apply(const struct fp4s_chat_template *t, const struct fp4s_chat_msg *msgs, size_t n,
		    const struct fp4s_chat_opts *opts, struct fp4s_tok_text *out, struct fp4s_error *err);

#ifdef __cplusplus
}
#endif

#endif
