/* srv_queue.c: the scheduler thread, the only owner of the engine (srv.h), and the per-job event
 * queues it fills.
 *
 * Our own FIFO (`wait`) sits in front of the engine: a job is submitted only when all its n
 * sequences fit in the engine's request table with room to spare, so the engine never refuses
 * for being full and waiting requests are counted where /metrics can see them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/srv.h"
#include "util/log.h"

double srv_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct srv_job *srv_job_new(void)
{
	struct srv_job *j = calloc(1, sizeof *j);
	if (!j)
		return NULL;
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_mutex_init(&j->mu, NULL);
	pthread_cond_init(&j->cv, &ca);
	pthread_condattr_destroy(&ca);
	fp4s_request_defaults(&j->req);
	j->n = 1;
	return j;
}

void srv_job_free(struct srv_job *j)
{
	if (!j)
		return;
	for (struct srv_ev *e = j->head, *nx; e; e = nx) {
		nx = e->next;
		free(e->lp);
		free(e);
	}
	for (int i = 0; i < FP4S_ENGINE_MAX_STOP_STRINGS; i++)
		free(j->stop_buf[i]);
	free(j->prompt);
	pthread_mutex_destroy(&j->mu);
	pthread_cond_destroy(&j->cv);
	free(j);
}

void srv_submit(struct srv *s, struct srv_job *j)
{
	j->t_arrival = j->t_arrival > 0 ? j->t_arrival : srv_now();
	pthread_mutex_lock(&s->mu);
	j->next = NULL;
	if (s->in_tail)
		s->in_tail->next = j;
	else
		s->in_head = j;
	s->in_tail = j;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

void srv_job_cancel(struct srv *s, struct srv_job *j)
{
	atomic_store(&j->cancel, 1);
	pthread_mutex_lock(&s->mu);
	s->poke = 1;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

struct srv_ev *srv_job_wait(struct srv_job *j, double deadline, int *done)
{
	struct srv_ev *e = NULL;
	*done = 0;
	pthread_mutex_lock(&j->mu);
	while (!j->head && !j->done) {
		double d = deadline;
		struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
		if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT)
			break;
	}
	if (j->head) {
		e = j->head;
		j->head = e->next;
		if (!j->head)
			j->tail = NULL;
	} else if (j->done) {
		*done = 1;
	}
	pthread_mutex_unlock(&j->mu);
	return e;
}

/* Hands the job back to its worker: no scheduler access after this. */
static void job_release(struct srv_job *j, int status, const char *msg)
{
	pthread_mutex_lock(&j->mu);
	if (status) {
		j->err_status = status;
		snprintf(j->err_msg, sizeof j->err_msg, "%.500s", msg);
	}
	j->done = 1;
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
}

static void job_push(struct srv_job *j, const struct fp4s_event *ev, int32_t index)
{
	struct srv_ev *e = malloc(sizeof *e + ev->text_len + 1);
	if (!e)
		return; /* the text of one event is lost; the finish event below still counts */
	e->next = NULL;
	e->index = index;
	e->token = ev->token;
	e->finish = ev->finish;
	e->n_prompt = ev->n_prompt;
	e->n_generated = ev->n_generated;
	e->lp = NULL;
	if (j->req.sampling.logprobs && ev->token >= 0 && (e->lp = malloc(sizeof *e->lp)))
		*e->lp = ev->sample;
	e->len = ev->text_len;
	if (ev->text_len)
		memcpy(e->text, ev->text, ev->text_len);
	e->text[ev->text_len] = 0;
	pthread_mutex_lock(&j->mu);
	if (j->tail)
		j->tail->next = e;
	else
		j->head = e;
	j->tail = e;
	pthread_cond_signal(&j->cv);
	pthread_mutex_unlock(&j->mu);
}

struct sched {
	struct srv_job *wait_head, *wait_tail; /* not yet submitted, FIFO */
	struct srv_job **act;                 /* submitted, with live sequences */
	int32_t n_act, cap_act;
	int32_t in_engine;                    /* sequences inside the engine */
};

static void update_gauges(struct srv *s, struct sched *q)
{
	int32_t queued = 0;
	for (struct srv_job *j = q->wait_head; j; j = j->next)
		queued += j->n;
	const int32_t max_seqs = s->o.max_num_seqs;
	const int32_t running = q->in_engine < max_seqs ? q->in_engine : max_seqs;
	pthread_mutex_lock(&s->m.mu);
	s->m.running = running;
	s->m.waiting = queued + (q->in_engine - running);
	/* KV blocks from the engine's pool (this thread owns the engine) */
	int32_t used = 0, total = 0;
	int64_t pre = 0, hits = 0, looks = 0;
	if (s->eng)
		fp4s_engine_kv_usage(s->eng, &used, &total, &pre, &hits, &looks);
	s->m.kv_used = used;
	s->m.kv_total = total;
	s->m.preemptions = pre;
	if (s->eng)
		fp4s_engine_lookahead(s->eng, &s->m.ahead_taken, &s->m.ahead_dropped);
	pthread_mutex_unlock(&s->m.mu);
}

static int submit_job(struct srv *s, struct sched *q, struct srv_job *j)
{
	struct fp4s_error err = {0};
	j->req.prompt = j->prompt;
	j->req.n_prompt = j->n_prompt;
	const uint64_t seed = j->req.sampling.seed;
	for (int32_t i = 0; i < j->n; i++) {
		/* n > 1 with a seed: each choice gets seed + index, else all come out the same */
		if (j->req.sampling.has_seed)
			j->req.sampling.seed = seed + (uint64_t)i;
		if (fp4s_engine_submit(s->eng, &j->req, &j->ids[i], &err)) {
			j->req.sampling.seed = seed;
			for (int32_t k = 0; k < i; k++)
				fp4s_engine_cancel(s->eng, j->ids[k]);
			/* their CANCELLED events arrive later and find no job: harmless */
			q->in_engine += i; /* until those events come */
			j->live = 0;
			job_release(j, 400, err.msg);
			return -1;
		}
		j->t_last[i] = j->t_first[i] = 0;
	}
	j->t_submit = srv_now();
	j->req.sampling.seed = seed;
	j->live = j->n;
	q->in_engine += j->n;
	if (q->n_act == q->cap_act) {
		int32_t nc = q->cap_act ? 2 * q->cap_act : 64;
		struct srv_job **na = realloc(q->act, (size_t)nc * sizeof *na);
		if (!na) {
			for (int32_t i = 0; i < j->n; i++)
				fp4s_engine_cancel(s->eng, j->ids[i]);
			job_release(j, 503, "server out of memory");
			return -1;
		}
		q->act = na, q->cap_act = nc;
	}
	q->act[q->n_act++] = j;
	pthread_mutex_lock(&s->m.mu);
	srv_hist_observe(&s->m.queue, srv_now() - j->t_arrival);
	s->m.prompt_tokens += (uint64_t)j->n_prompt * (uint64_t)j->n;
	pthread_mutex_unlock(&s->m.mu);
	return 0;
}

static void on_event(struct srv *s, struct sched *q, const struct fp4s_event *ev, double now)
{
	if (ev->finish != FP4S_FINISH_NONE)
		q->in_engine--;
	for (int32_t a = 0; a < q->n_act; a++) {
		struct srv_job *j = q->act[a];
		for (int32_t i = 0; i < j->n; i++) {
			if (j->ids[i] != ev->id)
				continue;
			pthread_mutex_lock(&s->m.mu);
			if (ev->token >= 0) {
				if (j->t_last[i] == 0) {
					srv_hist_observe(&s->m.ttft, now - j->t_arrival);
					srv_hist_observe(&s->m.prefill, now - j->t_submit);
					j->t_first[i] = now;
				} else {
					srv_hist_observe(&s->m.itl, now - j->t_last[i]);
				}
				j->t_last[i] = now;
				s->m.gen_tokens++;
			}
			if (ev->finish != FP4S_FINISH_NONE) {
				srv_hist_observe(&s->m.e2e, now - j->t_arrival);
				if (j->t_first[i] > 0)
					srv_hist_observe(&s->m.decode, now - j->t_first[i]);
				s->m.finished[ev->finish]++;
			}
			pthread_mutex_unlock(&s->m.mu);
			job_push(j, ev, i);
			if (ev->finish != FP4S_FINISH_NONE && --j->live == 0) {
				q->act[a] = q->act[--q->n_act];
				job_release(j, 0, NULL);
			}
			return;
		}
	}
}

static void *sched_main(void *arg)
{
	struct srv *s = arg;
	struct sched q = {0};
	/* Leave the engine's request table (4 records per KV slot) half free, so a submit never
	 * fails for room; the rest waits in our FIFO. */
	const int32_t cap = 2 * s->o.max_num_seqs;
	for (;;) {
		pthread_mutex_lock(&s->mu);
		while (!s->stop && !s->in_head && !s->poke && q.in_engine == 0)
			pthread_cond_wait(&s->cv, &s->mu);
		if (s->in_head) {
			if (q.wait_tail)
				q.wait_tail->next = s->in_head;
			else
				q.wait_head = s->in_head;
			q.wait_tail = s->in_tail;
			s->in_head = s->in_tail = NULL;
		}
		s->poke = 0;
		const int stop = s->stop;
		pthread_mutex_unlock(&s->mu);
		/* cancelled before they started */
		for (struct srv_job **pp = &q.wait_head, *j; (j = *pp);) {
			if (atomic_load(&j->cancel) || stop) {
				*pp = j->next;
				if (q.wait_tail == j)
					q.wait_tail = NULL;
				job_release(j, 0, NULL);
				continue;
			}
			pp = &j->next;
		}
		if (!q.wait_head)
			q.wait_tail = NULL;
		else if (!q.wait_tail)
			for (q.wait_tail = q.wait_head; q.wait_tail->next; q.wait_tail = q.wait_tail->next) {
			}
		for (int32_t a = 0; a < q.n_act; a++) {
			struct srv_job *j = q.act[a];
			if ((atomic_load(&j->cancel) || stop) && !j->cancel_sent) {
				for (int32_t i = 0; i < j->n; i++)
					fp4s_engine_cancel(s->eng, j->ids[i]);
				j->cancel_sent = 1;
			}
		}
		if (stop && q.n_act == 0 && q.in_engine <= 0)
			break;
		/* admit in arrival order while all of a job's sequences fit */
		while (q.wait_head && q.in_engine + q.wait_head->n <= cap) {
			struct srv_job *j = q.wait_head;
			q.wait_head = j->next;
			if (!q.wait_head)
				q.wait_tail = NULL;
			j->next = NULL;
			submit_job(s, &q, j);
		}
		if (fp4s_engine_pending(s->eng) > 0) {
			struct fp4s_error err = {0};
			const struct fp4s_event *ev;
			int n = fp4s_engine_step(s->eng, &ev, &err);
			if (n < 0) {
				/* An engine failure is not the client's fault: fail what is running (500),
				 * keep serving. */
				FP4S_ERROR("engine step failed: %s", err.msg);
				for (int32_t a = 0; a < q.n_act; a++) {
					struct srv_job *j = q.act[a];
					pthread_mutex_lock(&j->mu);
					j->err_status = 500;
					snprintf(j->err_msg, sizeof j->err_msg, "engine failure: %.480s", err.msg);
					pthread_mutex_unlock(&j->mu);
					atomic_store(&j->cancel, 1);
				}
				pthread_mutex_lock(&s->mu);
				s->poke = 1;
				pthread_mutex_unlock(&s->mu);
			}
			const double now = srv_now();
			for (int i = 0; i < n; i++)
				on_event(s, &q, &ev[i], now);
		} else {
			q.in_engine = 0; /* events of sequences we dropped (submit failures) are gone */
		}
		update_gauges(s, &q);
	}
	update_gauges(s, &q);
	free(q.act);
	return NULL;
}

int srv_sched_start(struct srv *s)
{
	if (pthread_create(&s->sched, NULL, sched_main, s))
		return -1;
	s->sched_started = 1;
	return 0;
}

void srv_sched_stop(struct srv *s)
{
	if (!s->sched_started)
		return;
	pthread_mutex_lock(&s->mu);
	s->stop = 1;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->sched, NULL);
	s->sched_started = 0;
}
