/* progress.h: a one-line progress bar on stderr ("\r" redraws) for long loads and writes: bytes
 * done of total, GB/s and ETA. It draws only when stderr is a terminal, so logs and CI output stay
 * clean; it is safe to call from several threads (updates are atomic, drawing is throttled). */
#ifndef FP4S_PROGRESS_H
#define FP4S_PROGRESS_H

#include <stdint.h>

struct fp4s_progress {
	const char *label;
	uint64_t total;
	uint64_t done;     /* updated atomically */
	double t0, last_draw;
	int enabled;
};

void fp4s_progress_init(struct fp4s_progress *p, const char *label, uint64_t total);
void fp4s_progress_add(struct fp4s_progress *p, uint64_t bytes);
/* Draws the final state and a newline; returns the elapsed seconds. */
double fp4s_progress_done(struct fp4s_progress *p);
double fp4s_now(void);

#endif
