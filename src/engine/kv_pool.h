/* kv_pool.h: the KV-cache block pool the scheduler owns. The cache is cut into blocks of
 * FP4S_KV_BLOCK token positions; a sequence holds a list of blocks (its block table row), so
 * sequences of any length share one pool and memory is taken as tokens arrive.
 *
 * Prefix caching: a block whose 16 positions hold a prompt's tokens is registered under a hash
 * of those tokens chained with its predecessor's hash. A later request whose prompt starts with
 * the same tokens takes the same blocks (reference counted, read only: a full block is never
 * written again) and skips computing them. Freed cached blocks stay findable until the space is
 * needed (least recently freed reused last). */
#ifndef FP4S_KV_POOL_H
#define FP4S_KV_POOL_H

#include <stdint.h>

#include "backend/backend.h"
#include "util/status.h"

struct fp4s_kv_pool {
	int32_t n_blocks;
	int32_t *ref;        /* [n_blocks] sequences holding the block */
	uint64_t *hash;      /* [n_blocks] prefix hash of a registered block, 0 = none */
	int32_t *tokens;     /* [n_blocks][FP4S_KV_BLOCK] a registered block's tokens (collision check) */
	uint64_t *parent;    /* [n_blocks] the hash its chain continues */
	/* free blocks: a FIFO ring, so recently freed cached blocks are reused last */
	int32_t *ring;
	uint8_t *in_ring;    /* [n_blocks] the block has an entry in the ring (live or stale) */
	int32_t head, count;
	/* hash -> block, open addressing (power of two, at least 2 x n_blocks) */
	int32_t *map;
	uint32_t map_cap;
	int64_t hits, lookups; /* prefix-cache statistics (blocks) */
};

int fp4s_kv_pool_init(struct fp4s_kv_pool *p, int32_t n_blocks, struct fp4s_error *err);
void fp4s_kv_pool_free(struct fp4s_kv_pool *p);
/* Blocks in use (held by a sequence). */
int32_t fp4s_kv_pool_used(const struct fp4s_kv_pool *p);
/* A free block (registered blocks that nobody holds are reused last), or -1 when none is left. */
int32_t fp4s_kv_pool_alloc(struct fp4s_kv_pool *p);
/* Drops one holder of a block; at zero it becomes free (and stays findable if registered). */
void fp4s_kv_pool_release(struct fp4s_kv_pool *p, int32_t block);
/* The chained hash of a block of tokens following parent (0 for the first block). */
uint64_t fp4s_kv_hash(uint64_t parent, const int32_t *tokens);
/* A registered block with these tokens after parent, now held once more; -1 if none. */
int32_t fp4s_kv_pool_lookup(struct fp4s_kv_pool *p, uint64_t parent, const int32_t *tokens);
/* Registers a full block the caller holds (no-op if an equal block is already registered). */
void fp4s_kv_pool_register(struct fp4s_kv_pool *p, int32_t block, uint64_t parent, const int32_t *tokens);

#endif
