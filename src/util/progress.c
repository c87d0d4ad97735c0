#include "util/progress.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

double fp4s_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void fp4s_progress_init(struct fp4s_progress *p, const char *label, uint64_t total)
{
	p->label = label;
	p->total = total;
	p->done = 0;
	p->t0 = fp4s_now();
	p->last_draw = 0;
	p->enabled = isatty(2);
}

static void draw(struct fp4s_progress *p, double now)
{
	uint64_t done = __atomic_load_n(&p->done, __ATOMIC_RELAXED);
	double el = now - p->t0, frac = p->total ? (double)done / (double)p->total : 1.0;
	double gbs = el > 0 ? (double)done / el / 1e9 : 0.0;
	double eta = frac > 0 && frac < 1 ? el / frac - el : 0.0;
	char bar[31];
	int fill = (int)(frac * 30.0);
	for (int i = 0; i < 30; i++)
		bar[i] = i < fill ? '#' : '.';
	bar[30] = 0;
	fprintf(stderr, "\r%s [%s] %5.1f%% %.2f/%.2f GB %.2f GB/s ETA %3.0fs ", p->label, bar,
	        100.0 * frac, (double)done / 1e9, (double)p->total / 1e9, gbs, eta);
	fflush(stderr);
}

void fp4s_progress_add(struct fp4s_progress *p, uint64_t bytes)
{
	__atomic_add_fetch(&p->done, bytes, __ATOMIC_RELAXED);
	if (!p->enabled)
		return;
	double now = fp4s_now();
	/* Several threads may race to draw; a lost or doubled redraw is harmless. */
	if (now - p->last_draw >= 0.1) {
		p->last_draw = now;
#pragma omp critical(fp4s_progress)
		draw(p, now);
	}
}

double fp4s_progress_done(struct fp4s_progress *p)
{
	double now = fp4s_now();
	if (p->enabled) {
		draw(p, now);
		fputc('\n', stderr);
	}
	return now - p->t0;
}
