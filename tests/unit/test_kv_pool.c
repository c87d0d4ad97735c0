/* test_kv_pool.c: the KV block pool and its prefix cache against a simple model, through long
 * random sequences of operations (allocate, register, look up, release): every block is held by
 * as many sequences as the model says, free blocks are exactly the unheld ones, a registered block
 * is found by its tokens until its space is reused, and a lookup never returns a block registered
 * under other tokens (the hash map's deletions keep every entry reachable). */
#include <stdlib.h>
#include <string.h>

#include "engine/kv_pool.h"
#include "test_util.h"

#define NB 64
#define TOK_VOCAB 40 /* x 3 parents: about as many contents as the map has room for, so
                     * probe chains collide and deletions must keep them reachable */

struct model {
	int32_t ref[NB];
	int registered[NB];
	uint64_t parent[NB];
	int32_t tokens[NB][FP4S_KV_BLOCK];
};

static void random_block(int32_t *t)
{
	const int32_t v = (int32_t)(t_rand_u64() % TOK_VOCAB);
	for (int i = 0; i < FP4S_KV_BLOCK; i++)
		t[i] = v * 100 + i;
}

int main(void)
{
	t_seed_from_env();
	struct fp4s_kv_pool p;
	struct fp4s_error err = {0};
	struct model m;
	memset(&m, 0, sizeof m);
	CHECK(fp4s_kv_pool_init(&p, NB, &err) == 0);
	CHECK_EQ_INT(fp4s_kv_pool_used(&p), 0);
	int64_t bad_ref = 0, bad_lookup = 0, bad_alloc = 0, hits = 0;
	for (int step = 0; step < 200000; step++) {
		const int op = (int)(t_rand_u64() % 4);
		if (op == 0) { /* allocate */
			int32_t b = fp4s_kv_pool_alloc(&p);
			int free_exists = 0;
			for (int i = 0; i < NB; i++)
				free_exists |= m.ref[i] == 0;
			if (b < 0) {
				bad_alloc += free_exists;
			} else {
				bad_alloc += m.ref[b] != 0;
				m.ref[b] = 1;
				m.registered[b] = 0; /* its space is reused: no longer findable */
			}
		} else if (op == 1) { /* release a held block */
			int32_t b = (int32_t)(t_rand_u64() % NB);
			if (m.ref[b] > 0) {
				fp4s_kv_pool_release(&p, b);
				m.ref[b]--;
			}
		} else if (op == 2) { /* register a held, unregistered block */
			int32_t b = (int32_t)(t_rand_u64() % NB);
			if (m.ref[b] > 0 && !m.registered[b]) {
				int32_t toks[FP4S_KV_BLOCK];
				uint64_t parent = t_rand_u64() % 3;
				random_block(toks);
				/* an equal registered block makes this a no-op in the pool */
				int dup = 0;
				for (int i = 0; i < NB; i++)
					dup |= m.registered[i] && m.parent[i] == parent &&
					       !memcmp(m.tokens[i], toks, sizeof toks);
				fp4s_kv_pool_register(&p, b, parent, toks);
				if (!dup) {
					m.registered[b] = 1;
					m.parent[b] = parent;
					memcpy(m.tokens[b], toks, sizeof toks);
				}
			}
		} else { /* look up */
			int32_t toks[FP4S_KV_BLOCK];
			uint64_t parent = t_rand_u64() % 3;
			random_block(toks);
			int32_t want = -1;
			for (int i = 0; i < NB; i++)
				if (m.registered[i] && m.parent[i] == parent && !memcmp(m.tokens[i], toks, sizeof toks))
					want = i;
			const int32_t got = fp4s_kv_pool_lookup(&p, parent, toks);
			bad_lookup += got != want;
			if (got >= 0) {
				m.ref[got]++;
				hits++;
			}
		}
		for (int i = 0; i < NB; i++)
			bad_ref += p.ref[i] != m.ref[i];
	}
	CHECK_EQ_INT(bad_ref, 0);
	CHECK_EQ_INT(bad_lookup, 0);
	CHECK_EQ_INT(bad_alloc, 0);
	CHECK_MSG(hits > 1000, "only %lld lookups hit: the test exercises too little", (long long)hits);
	/* release everything: the pool is empty again and every block can be allocated once */
	for (int i = 0; i < NB; i++)
		while (m.ref[i] > 0) {
			fp4s_kv_pool_release(&p, i);
			m.ref[i]--;
		}
	CHECK_EQ_INT(fp4s_kv_pool_used(&p), 0);
	int got = 0;
	while (fp4s_kv_pool_alloc(&p) >= 0)
		got++;
	CHECK_EQ_INT(got, NB);
	fp4s_kv_pool_free(&p);
	CHECK_EQ_INT(fp4s_kv_pool_init(&p, 0, &err), FP4S_EINVAL);
	return TEST_DONE();
}
