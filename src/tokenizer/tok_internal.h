/* tok_internal.h: the tokenizer's private structures, shared by the tok_*.c files.
 *
 *   tok_util.c    byte-string hash tables, growable buffers, UTF-8 helpers, GPT-2 byte map
 *   tok_json.c    tokenizer.json loading (vocab, merges, added tokens, normalizer, pre-tokenizer)
 *   tok_encode.c  added-token matching, normalization, PCRE2 pre-tokenization, rank BPE
 *   tok_spm.c     llama2.c tokenizer.bin loading and score-ordered SentencePiece BPE
 *   tok_gguf.c    the tokenizer metadata of a GGUF file (gpt2 byte-level BPE, llama SentencePiece)
 *   tok_config.c  open(), tokenizer_config.json / generation_config.json, queries
 *   tok_decode.c  decode and streaming decode
 *   tok_chat.c    chat format detection and the built-in formatters */
#ifndef FP4S_TOK_INTERNAL_H
#define FP4S_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* Bounds on untrusted files: far above any real tokenizer, low enough that a hostile file cannot
 * make us allocate without limit before a check fails. */
#define TOK_MAX_VOCAB (1 << 22)     /* 4M tokens */
#define TOK_MAX_TOKEN_BYTES 4096    /* longest token text */
#define TOK_MAX_MERGES (1 << 23)
#define TOK_MAX_ADDED 65536
#define TOK_MAX_PRETOK_STAGES 8
#define TOK_MAX_FILE_BYTES ((size_t)1 << 30)

/* Open-addressing map from a byte string (stored in the tokenizer's arena) to an id. */
struct tok_strmap {
	uint32_t *slots; /* id + 1; 0 = empty */
	uint32_t mask;
	uint32_t count;
};

/* Open-addressing map from an id pair to (rank, merged id). */
struct tok_pairmap {
	uint64_t *keys; /* (left << 32 | right) + 1; 0 = empty */
	int32_t *rank;
	int32_t *merged;
	uint32_t mask;
	uint32_t count;
};

/* A trie over added-token texts, for leftmost-longest matching before pre-tokenization. */
struct tok_trie_node {
	int32_t first_child, next_sibling;
	int32_t token; /* added-token index ending here, or -1 */
	unsigned char byte;
};

struct tok_added {
	int32_t id;
	uint8_t special, lstrip, rstrip, normalized;
};

enum tok_norm { TOK_NORM_NONE = 0, TOK_NORM_NFC, TOK_NORM_NFKC, TOK_NORM_NFD, TOK_NORM_NFKD };

struct tok_pretok_stage {
	pcre2_code *re; /* Split pattern (Regex, or a String compiled as a literal); NULL: prefix stage */
	int invert;
	/* ByteLevel(add_prefix_space=true): like Hugging Face, every piece reaching this stage that does
	 * not start with a space gets one */
	int prefix_space;
};

struct fp4s_tokenizer {
	enum fp4s_tok_kind kind;
	int32_t n_vocab; /* highest id + 1 */

	/* token texts as the raw bytes they stand for, concatenated in arena */
	char *arena;
	size_t arena_n, arena_cap;
	uint64_t *tok_off; /* [n_vocab] offset << 16 | length; UINT64_MAX = hole */
	uint8_t *tok_flags; /* [n_vocab] TOKF_* */
	float *scores;      /* [n_vocab] SentencePiece scores (SPM only) */
	struct tok_strmap vocab; /* text -> id for mergeable (non-added) tokens */

	/* byte-level BPE */
	int32_t byte_id[256]; /* id of each single-byte token; -1 if missing */
	struct tok_pairmap merges;
	int ignore_merges;
	enum tok_norm norm;
	/* NFC quick check: bit set = the code point is NFC-stable in any context (canonical class 0,
	 * unchanged by NFC, never the second of a composition), so a run of such code points needs no
	 * normalization. Covers U+0000..U+2FFFF; NULL when the normalizer is not NFC. */
	uint8_t *nfc_safe;
	struct tok_pretok_stage stages[TOK_MAX_PRETOK_STAGES];
	int n_stages;

	/* added tokens */
	struct tok_added *added;
	int n_added;
	struct tok_trie_node *trie;
	int n_trie, cap_trie;
	uint8_t added_first[256]; /* bytes that can start an added token */

	/* special ids and rules */
	int32_t bos, eos;
	int add_bos, add_eos;
	int32_t *stop;
	size_t n_stop;
	char *chat_template;
	struct fp4s_chat_template chat;

	/* SentencePiece: the longest piece in bytes bounds the merge search */
	int max_piece_len;
	int spm_split_ok; /* words may be merged separately (see tok_spm_finish) */
};

enum {
	TOKF_SPECIAL = 1, /* skipped by FP4S_TOK_SKIP_SPECIAL */
	TOKF_ADDED = 2,   /* an added token: matched as a whole, never by merges */
	TOKF_BYTE = 4,    /* SentencePiece <0xXX> byte piece */
	TOKF_CONTROL = 8, /* SentencePiece control/unknown piece (<unk>, <s>, </s>) */
};

/* tok_util.c */
uint64_t tok_hash_bytes(const void *p, size_t n);
int tok_strmap_init(struct tok_strmap *m, size_t expected);
void tok_strmap_free(struct tok_strmap *m);
/* returns the id for text, or -1 */
int32_t tok_strmap_get(const struct fp4s_tokenizer *tok, const struct tok_strmap *m, const char *s, size_t n);
/* inserts id (its text is tok_text(id)); returns 0, or 1 if the text was already present */
int tok_strmap_put(const struct fp4s_tokenizer *tok, struct tok_strmap *m, int32_t id);
int tok_pairmap_init(struct tok_pairmap *m, size_t expected);
void tok_pairmap_free(struct tok_pairmap *m);
int tok_pairmap_put(struct tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged);
/* returns the slot index or -1 */
static inline long tok_pairmap_find(const struct tok_pairmap *m, int32_t a, int32_t b)
{
	uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
	uint64_t h = key * 0x9E3779B97F4A7C15ull;
	uint32_t i = (uint32_t)(h >> 32) & m->mask;
	for (;;) {
		uint64_t k = m->keys[i];
		if (k == key)
			return (long)i;
		if (k == 0)
			return -1;
		i = (i + 1) & m->mask;
	}
}

/* token table */
int tok_alloc_vocab(struct fp4s_tokenizer *tok, int32_t n, struct fp4s_error *err);
int tok_set_text(struct fp4s_tokenizer *tok, int32_t id, const char *s, size_t n, struct fp4s_error *err);
static inline const char *tok_text(const struct fp4s_tokenizer *tok, int32_t id, size_t *len)
{
	uint64_t o = tok->tok_off[id];
	if (o == UINT64_MAX) {
		*len = 0;
		return NULL;
	}
	*len = (size_t)(o & 0xFFFF);
	return tok->arena ? tok->arena + (o >> 16) : ""; /* all tokens so far empty: no arena yet */
}

int tok_ids_push(struct fp4s_tok_ids *ids, int32_t id);
int tok_text_append(struct fp4s_tok_text *t, const char *s, size_t n);
int tok_text_appendz(struct fp4s_tok_text *t, const char *s);

/* GPT-2 byte-level alphabet: code point -> byte, or -1 */
int tok_cp_to_byte(uint32_t cp);
/* Length of the valid UTF-8 sequence at s (1..4), or 0 if the bytes there are not valid UTF-8. */
int tok_utf8_valid_len(const unsigned char *s, size_t n);
/* Decodes one valid sequence (s must start one). */
uint32_t tok_utf8_decode(const unsigned char *s, int len);
int tok_utf8_encode(uint32_t cp, char out[4]);

/* tok_json.c */
extern const char TOK_GPT2_PATTERN[];
/* GPT-2 byte alphabet text -> raw bytes; returns the length or -1 if it does not fit */
int tok_unmap_bytes(const char *s, size_t n, char *out, size_t cap);
/* adds merge (l, r) (byte-alphabet texts) with rank; the three tokens must be in the vocab map */
int tok_merge_add(struct fp4s_tokenizer *tok, const char *l, size_t ll, const char *r, size_t rl, int32_t rank,
		  struct fp4s_error *err);
int tok_stage_add(struct fp4s_tokenizer *tok, const char *pat, size_t len, int literal, int invert,
		  struct fp4s_error *err);
int tok_load_json(struct fp4s_tokenizer *tok, const char *path, struct fp4s_error *err);
int tok_added_add(struct fp4s_tokenizer *tok, int32_t id, const char *s, size_t n, int special,
		  int lstrip, int rstrip, int normalized, struct fp4s_error *err);

/* tok_encode.c */
int tok_nfc_table(struct fp4s_tokenizer *tok, struct fp4s_error *err);
int tok_bpe_encode(const struct fp4s_tokenizer *tok, const char *text, size_t len, unsigned flags,
		   struct fp4s_tok_ids *ids, struct fp4s_error *err);

/* tok_spm.c */
int tok_load_llama2c(struct fp4s_tokenizer *tok, const char *path, struct fp4s_error *err);
/* "<0xXX>" (6 bytes, not NUL-terminated) -> XX, else -1: SentencePiece byte tokens */
int tok_byte_piece(const char *s);
int tok_spm_encode(const struct fp4s_tokenizer *tok, const char *text, size_t len, struct fp4s_tok_ids *ids,
		   struct fp4s_error *err);
void tok_spm_finish(struct fp4s_tokenizer *tok);

/* tok_gguf.c */
int tok_load_gguf(struct fp4s_tokenizer *tok, const char *path, struct fp4s_error *err);

/* tok_config.c */
int tok_read_file(const char *path, char **buf, size_t *n, size_t max, struct fp4s_error *err);

#endif
