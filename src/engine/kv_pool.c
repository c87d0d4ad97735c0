/* kv_pool.c: block pool and prefix cache (see kv_pool.h). */
#include "engine/kv_pool.h"

#include <stdlib.h>
#include <string.h>

int fp4s_kv_pool_init(struct fp4s_kv_pool *p, int32_t n_blocks, struct fp4s_error *err)
{
	memset(p, 0, sizeof *p);
	if (n_blocks <= 0 || n_blocks > (1 << 26))
		return fp4s_error_set(err, FP4S_EINVAL, "kv pool: %d blocks", n_blocks);
	p->n_blocks = n_blocks;
	p->map_cap = 1;
	while (p->map_cap < 2u * (uint32_t)n_blocks)
		p->map_cap <<= 1;
	p->ref = calloc((size_t)n_blocks, sizeof *p->ref);
	p->hash = calloc((size_t)n_blocks, sizeof *p->hash);
	p->parent = calloc((size_t)n_blocks, sizeof *p->parent);
	p->tokens = malloc((size_t)n_blocks * FP4S_KV_BLOCK * sizeof *p->tokens);
	p->ring = malloc((size_t)n_blocks * sizeof *p->ring);
	p->in_ring = malloc((size_t)n_blocks);
	p->map = malloc((size_t)p->map_cap * sizeof *p->map);
	if (!p->ref || !p->hash || !p->parent || !p->tokens || !p->ring || !p->in_ring || !p->map) {
		fp4s_kv_pool_free(p);
		return fp4s_error_set(err, FP4S_ENOMEM, "kv pool: out of memory for %d blocks", n_blocks);
	}
	for (int32_t i = 0; i < n_blocks; i++)
		p->ring[i] = i;
	memset(p->in_ring, 1, (size_t)n_blocks);
	p->count = n_blocks;
	for (uint32_t i = 0; i < p->map_cap; i++)
		p->map[i] = -1;
	return FP4S_OK;
}

void fp4s_kv_pool_free(struct fp4s_kv_pool *p)
{
	free(p->ref), free(p->hash), free(p->parent), free(p->tokens), free(p->ring), free(p->in_ring),
		free(p->map);
	memset(p, 0, sizeof *p);
}

int32_t fp4s_kv_pool_used(const struct fp4s_kv_pool *p)
{
	int32_t n = 0;
	for (int32_t i = 0; i < p->n_blocks; i++)
		n += p->ref[i] > 0;
	return n;
}

uint64_t fp4s_kv_hash(uint64_t parent, const int32_t *tokens)
{
	/* FNV-1a over the parent hash and the tokens, then a finalizer; never 0 (0 = unregistered) */
	uint64_t h = 0xcbf29ce484222325ull ^ parent;
	for (int i = 0; i < FP4S_KV_BLOCK; i++) {
		h ^= (uint32_t)tokens[i];
		h *= 0x100000001b3ull;
	}
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	return h ? h : 1;
}

static uint32_t slot_of(const struct fp4s_kv_pool *p, uint64_t h) { return (uint32_t)h & (p->map_cap - 1); }

/* Removes a block's registration (it is about to hold other tokens). Backward-shift deletion
 * keeps every other entry reachable from its home slot. */
static void unregister(struct fp4s_kv_pool *p, int32_t b)
{
	if (!p->hash[b])
		return;
	uint32_t i = slot_of(p, p->hash[b]);
	while (p->map[i] != b) {
		if (p->map[i] < 0)
			goto done; /* not found: nothing to remove */
		i = (i + 1) & (p->map_cap - 1);
	}
	for (uint32_t j = (i + 1) & (p->map_cap - 1);; j = (j + 1) & (p->map_cap - 1)) {
		if (p->map[j] < 0)
			break;
		const uint32_t home = slot_of(p, p->hash[p->map[j]]);
		/* move j back to i if its home does not lie cyclically in (i, j] */
		if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
			p->map[i] = p->map[j];
			i = j;
		}
	}
	p->map[i] = -1;
done:
	p->hash[b] = 0;
}

int32_t fp4s_kv_pool_alloc(struct fp4s_kv_pool *p)
{
	/* the ring may hold stale entries (blocks taken back by a prefix hit): skip those */
	while (p->count > 0) {
		const int32_t b = p->ring[p->head];
		p->head = (p->head + 1) % p->n_blocks;
		p->count--;
		p->in_ring[b] = 0;
		if (p->ref[b] == 0) {
			unregister(p, b);
			p->ref[b] = 1;
			return b;
		}
	}
	return -1;
}

void fp4s_kv_pool_release(struct fp4s_kv_pool *p, int32_t b)
{
	if (b < 0 || b >= p->n_blocks || p->ref[b] <= 0)
		return;
	/* a block with a (stale) ring entry already is free again through that entry: at most one
	 * entry per block keeps the ring within n_blocks */
	if (--p->ref[b] == 0 && !p->in_ring[b]) {
		p->ring[(p->head + p->count) % p->n_blocks] = b;
		p->count++;
		p->in_ring[b] = 1;
	}
}

int32_t fp4s_kv_pool_lookup(struct fp4s_kv_pool *p, uint64_t parent, const int32_t *tokens)
{
	const uint64_t h = fp4s_kv_hash(parent, tokens);
	p->lookups++;
	for (uint32_t i = slot_of(p, h); p->map[i] >= 0; i = (i + 1) & (p->map_cap - 1)) {
		const int32_t b = p->map[i];
		if (p->hash[b] == h && p->parent[b] == parent &&
		    !memcmp(p->tokens + (size_t)b * FP4S_KV_BLOCK, tokens, FP4S_KV_BLOCK * sizeof *tokens)) {
			/* a free cached block leaves the free ring lazily (alloc skips held blocks); if it
			 * was counted there, its ring entry is now stale and skipped */
			p->ref[b]++;
			p->hits++;
			return b;
		}
	}
	return -1;
}

void fp4s_kv_pool_register(struct fp4s_kv_pool *p, int32_t b, uint64_t parent, const int32_t *tokens)
{
	const uint64_t h = fp4s_kv_hash(parent, tokens);
	if (p->hash[b])
		return;
	for (uint32_t i = slot_of(p, h); p->map[i] >= 0; i = (i + 1) & (p->map_cap - 1)) {
		const int32_t o = p->map[i];
		if (p->hash[o] == h && p->parent[o] == parent &&
		    !memcmp(p->tokens + (size_t)o * FP4S_KV_BLOCK, tokens, FP4S_KV_BLOCK * sizeof *tokens))
			return; /* an equal block is registered already */
	}
	uint32_t i = slot_of(p, h);
	while (p->map[i] >= 0)
		i = (i + 1) & (p->map_cap - 1);
	p->map[i] = b;
	p->hash[b] = h;
	p->parent[b] = parent;
	memcpy(p->tokens + (size_t)b * FP4S_KV_BLOCK, tokens, FP4S_KV_BLOCK * sizeof *tokens);
}
