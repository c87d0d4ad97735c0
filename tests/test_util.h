/* test_util.h: check macros for test programs. A failed check prints where and why and is
 * counted; TEST_DONE() prints "N passed, N failed" and returns the exit code (77 = skipped). */
#ifndef FP4S_TEST_UTIL_H
#define FP4S_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int t_pass, t_fail;

#define CHECK(cond)                                                                      \
	do {                                                                             \
		if (cond) {                                                              \
			t_pass++;                                                        \
		} else {                                                                 \
			t_fail++;                                                        \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
		}                                                                        \
	} while (0)

#define CHECK_MSG(cond, ...)                                                             \
	do {                                                                             \
		if (cond) {                                                              \
			t_pass++;                                                        \
		} else {                                                                 \
			t_fail++;                                                        \
			fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                                    \
			fputc('\n', stderr);                                             \
		}                                                                        \
	} while (0)

#define CHECK_EQ_INT(a, b)                                                               \
	do {                                                                             \
		long long _a = (long long)(a), _b = (long long)(b);                      \
		CHECK_MSG(_a == _b, "%s = %lld, expected %lld", #a, _a, _b);             \
	} while (0)

#define CHECK_NEAR(a, b, tol)                                                            \
	do {                                                                             \
		double _a = (double)(a), _b = (double)(b);                               \
		CHECK_MSG(fabs(_a - _b) <= (tol), "%s = %.9g, expected %.9g (tol %g)", #a, _a, _b, \
		          (double)(tol));                                                \
	} while (0)

#define CHECK_EQ_STR(a, b)                                                               \
	do {                                                                             \
		const char *_a = (a), *_b = (b);                                         \
		CHECK_MSG(_a && _b && strcmp(_a, _b) == 0, "%s = \"%s\", expected \"%s\"", #a, \
		          _a ? _a : "(null)", _b ? _b : "(null)");                        \
	} while (0)

#define TEST_SKIP(...)                                                                   \
	do {                                                                             \
		fprintf(stderr, "SKIP: ");                                               \
		fprintf(stderr, __VA_ARGS__);                                            \
		fputc('\n', stderr);                                                     \
		return 77;                                                               \
	} while (0)

#define TEST_DONE()                                                                      \
	(printf("%d passed, %d failed\n", t_pass, t_fail), t_fail ? 1 : 0)

/* Deterministic generator for test inputs (splitmix64); seed from FP4S_TEST_SEED or the clock so
 * every run draws fresh inputs, and the seed is printed so a failure can be replayed. */
static unsigned long long t_rng_state;
#define T_RNG_STEP 0x9E3779B97F4A7C15ull
/* The generator on an explicit state. Its n-th value depends only on the start and n (the state
 * advances by T_RNG_STEP a draw), so a parallel loop can draw, in each of its parts, exactly
 * what a sequential loop would: part p starts at t_rng_state + (draws before p) * T_RNG_STEP. */
static inline unsigned long long t_rand_u64_at(unsigned long long *st)
{
	unsigned long long z = (*st += T_RNG_STEP);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}
static inline double t_rand_uniform_at(unsigned long long *st) { return (double)(t_rand_u64_at(st) >> 11) * 0x1.0p-53; }
static inline double t_rand_normal_at(unsigned long long *st) /* two draws */
{
	double u1 = t_rand_uniform_at(st), u2 = t_rand_uniform_at(st);
	if (u1 < 1e-300)
		u1 = 1e-300;
	return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
static inline unsigned long long t_rand_u64(void) { return t_rand_u64_at(&t_rng_state); }
static inline double t_rand_uniform(void) { return t_rand_uniform_at(&t_rng_state); }
static inline double t_rand_normal(void) { return t_rand_normal_at(&t_rng_state); }
static inline void t_seed_from_env(void)
{
	const char *s = getenv("FP4S_TEST_SEED");
	if (s) {
		t_rng_state = strtoull(s, NULL, 0);
	} else {
		struct timespec ts;
		timespec_get(&ts, TIME_UTC);
		t_rng_state = (unsigned long long)ts.tv_sec * 1000000007ull ^ (unsigned long long)ts.tv_nsec;
	}
	fprintf(stderr, "FP4S_TEST_SEED=0x%llx\n", t_rng_state);
}

#endif
