/* cmd_bench.c: `fp4serve bench`: prefill and decode throughput of a model, the bytes a decode
 * step must read (performance.md §3.1: weights incl. scales, the lm_head, the KV cache at the
 * current depth), the achieved GB/s and its share of the measured copy ceiling. Like llama-bench:
 * pp = a prompt of N tokens in one forward; tg = N tokens decoded one at a time after the prompt
 * (and after --ctx tokens of context when asked). Medians over --reps runs after a warm-up.
 * --batch B (like llama-batched-bench's parallel sequences): B sequences, each prefilled with
 * its own prompt, then decoded together, one token each per forward; the tg figure is then the
 * aggregate (B tokens per step), the decode steps of a server with B streams. --temp T (with
 * --top-p, --top-k) samples each token as a request with those settings would instead of taking
 * the argmax: on the device where the backend samples (FP4S_DEVICE_SAMPLE=0: logits to the host
 * and sampler.c, the path requests with processed logprobs take). --logprobs N adds each token's
 * raw logprob and its N best alternatives, as a request with logprobs and top_logprobs N. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda_device.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "engine/forward.h"
#include "engine/sampler.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_d);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Host memory copy bandwidth, bytes read + written: the CPU backend's roofline ceiling. */
static double host_copy_gbs(void)
{
	const size_t bytes = (size_t)512 << 20;
	char *a = malloc(bytes), *b = malloc(bytes);
	double t[5];
	if (!a || !b) {
		free(a), free(b);
		return 0;
	}
	memset(a, 1, bytes);
	memset(b, 2, bytes);
	for (int i = 0; i < 6; i++) {
		double t0 = now_s();
		memcpy(b, a, bytes);
		if (i > 0)
			t[i - 1] = now_s() - t0;
	}
	free(a), free(b);
	return 2.0 * (double)bytes / median(t, 5) / 1e9;
}

/* One decode step launched (its tokens read later by fp4s_fwd_collect): the argmax, or with
 * samplers (smp) each row planned from its sampler and drawn on the device. */
static int bench_launch(struct fp4s_fwd *f, const struct fp4s_batch *b, const int32_t *rows, int32_t nb,
                        struct fp4s_sampler *smp, struct fp4s_samp_row *srow, struct fp4s_samp_edit *sedit,
                        struct fp4s_error *err)
{
	if (!smp)
		return fp4s_fwd_launch_argmax(f, b, rows, nb, err);
	for (int32_t q = 0; q < nb; q++) {
		int32_t ne = 0;
		int rc = fp4s_samp_plan(&smp[q], &srow[q], sedit, 1, &ne, err); /* no edits: no bias or penalty */
		if (rc)
			return rc;
		srow[q].edit0 = 0;
	}
	return fp4s_fwd_launch_sample(f, b, rows, nb, srow, sedit, 0, err);
}

int cmd_bench(int argc, char **argv)
{
	static const struct option opts[] = {
		{"model", required_argument, 0, 'm'},   {"prompt", required_argument, 0, 'p'},
		{"gen", required_argument, 0, 'n'},     {"ctx", required_argument, 0, 'c'},
		{"reps", required_argument, 0, 'r'},    {"backend", required_argument, 0, 'b'},
		{"json", no_argument, 0, 'j'},          {"help", no_argument, 0, 'h'},
		{"kv-cache-dtype", required_argument, 0, 'k'}, {"batch", required_argument, 0, 'B'},
		{"temp", required_argument, 0, 'T'},    {"top-p", required_argument, 0, 'P'},
		{"top-k", required_argument, 0, 'K'},   {"logprobs", required_argument, 0, 'L'},
		{0, 0, 0, 0}};
	static const char usage[] =
		"usage: fp4serve bench -m PATH [-p N] [-n N] [--ctx N] [--reps R] [--backend auto|cuda|cpu] [--json]\n"
		"                      [--kv-cache-dtype auto|fp32|bf16|fp8] [--batch B] [--temp T [--top-p P] [--top-k K]]\n"
		"                      [--logprobs N]\n"
		"  -p N      prompt tokens for the prefill figure (default 512; 0 skips)\n"
		"  -n N      tokens decoded one at a time (default 128; 0 skips)\n"
		"  --ctx N   context already in the cache before decoding (default 0)\n"
		"  --reps R  repetitions, median reported (default 3)\n"
		"  --batch B sequences decoded together (default 1): tg is then B tokens a step\n"
		"  --temp T  sample each token at temperature T (with --top-p, --top-k) instead of the argmax\n"
		"  --logprobs N  return each token's logprob and its N (0-20) best alternatives\n";
	struct fp4s_engine_opts eo = {0};
	int32_t pp = 512, tg = 128, ctx = 0, reps = 3, json = 0, nb = 1, c;
	struct fp4s_sampling sp;
	fp4s_samp_defaults(&sp);
	sp.temperature = 0.0f;
	optind = 1;
	while ((c = getopt_long(argc, argv, "m:p:n:c:r:b:k:B:jh", opts, NULL)) != -1) {
		switch (c) {
		case 'm': eo.model = optarg; break;
		case 'p': pp = atoi(optarg); break;
		case 'n': tg = atoi(optarg); break;
		case 'c': ctx = atoi(optarg); break;
		case 'r': reps = atoi(optarg); break;
		case 'b': eo.backend = optarg; break;
		case 'k': eo.kv_cache_dtype = optarg; break;
		case 'B': nb = atoi(optarg); break;
		case 'T': sp.temperature = strtof(optarg, NULL); break;
		case 'P': sp.top_p = strtof(optarg, NULL); break;
		case 'K': sp.top_k = atoi(optarg); break;
		case 'L': sp.logprobs = true, sp.top_logprobs = atoi(optarg); break;
		case 'j': json = 1; break;
		case 'h': printf("%s", usage); return 0;
		default: fprintf(stderr, "%s", usage); return 2;
		}
	}
	if (!eo.model || pp < 0 || tg < 0 || ctx < 0 || reps < 1 || reps > 100 || pp > 65536 ||
	    tg > 65536 || ctx > 1 << 20 || nb < 1 || nb > 1024) {
		fprintf(stderr, "%s", usage);
		return 2;
	}
	struct fp4s_error err = {0};
	if (fp4s_samp_validate(&sp, 0, &err)) {
		fprintf(stderr, "fp4serve bench: %s\n", err.msg);
		return 2;
	}
	const int32_t prompt_len = pp > ctx ? pp : ctx;
	eo.max_seqs = nb;
	eo.max_ctx = prompt_len + tg + 1;
	eo.max_batch_tokens = prompt_len > nb ? prompt_len : nb;
	struct fp4s_engine *e;
	double t0 = now_s();
	if (fp4s_engine_open(&eo, &e, &err)) {
		fprintf(stderr, "fp4serve bench: %s\n", err.msg);
		return 1;
	}
	const double load_s = now_s() - t0;
	const struct fp4s_model *m = fp4s_engine_model(e);
	struct fp4s_model_stats st;
	fp4s_model_stats(&m->cfg, m->w, m->n, &st);
	double ceiling = 0;
	if (strcmp(fp4s_engine_backend_name(e), "cpu")) {
		if (fp4s_cuda_copy_bandwidth(0, &ceiling, &err))
			fprintf(stderr, "fp4serve bench: %s\n", err.msg);
	} else {
		ceiling = host_copy_gbs();
	}
	struct fp4s_fwd *f = fp4s_engine_fwd(e);
	int rc = 0;
	const int32_t V = (int32_t)m->cfg.vocab;
	/* positions 0..max_ctx-1 of every sequence's tokens, then the decode step's B-token batch */
	int32_t *tok = malloc((size_t)eo.max_ctx * sizeof *tok), *pos = malloc((size_t)eo.max_ctx * sizeof *pos);
	int32_t *seq = calloc((size_t)eo.max_ctx, sizeof *seq);
	int32_t *btok = malloc((size_t)nb * sizeof *btok), *bpos = malloc((size_t)nb * sizeof *bpos);
	int32_t *bseq = malloc((size_t)nb * sizeof *bseq), *brow = malloc((size_t)nb * sizeof *brow);
	int32_t *bnext = malloc((size_t)nb * sizeof *bnext);
	float *logits = malloc((size_t)V * (size_t)nb * sizeof *logits);
	/* --temp: a sampler a sequence (seeded), their device rows */
	const int sampling = sp.temperature >= FP4S_SAMP_GREEDY_EPS || sp.logprobs;
	const int dev_sample = sampling && fp4s_fwd_can_sample(f);
	/* steps enqueued ahead as the engine runs them: greedy, or sampled on the device without
	 * logprobs (nb <= 1024 rows) */
	const int ahead = fp4s_engine_lookahead(e, NULL, NULL) &&
	                  (!sampling || (dev_sample && !sp.logprobs && fp4s_fwd_can_launch_sample(f)));
	struct fp4s_sampler *smp = sampling ? calloc((size_t)nb, sizeof *smp) : NULL;
	struct fp4s_samp_row *srow = sampling ? malloc((size_t)nb * sizeof *srow) : NULL;
	struct fp4s_samp_result *slp = sampling ? malloc((size_t)nb * sizeof *slp) : NULL;
	struct fp4s_samp_edit sedit[1];
	double *t_pp = calloc((size_t)reps, sizeof *t_pp), *t_tg = calloc((size_t)reps * (size_t)(tg + 1), sizeof *t_tg);
	if (!tok || !pos || !seq || !logits || !t_pp || !t_tg || !btok || !bpos || !bseq || !brow || !bnext ||
	    (sampling && (!smp || !srow || !slp))) {
		fprintf(stderr, "fp4serve bench: out of memory\n");
		rc = 1;
		goto done;
	}
	for (int32_t q = 0; smp && q < nb; q++) {
		sp.has_seed = true;
		sp.seed = 1000 + (uint64_t)q;
		if (fp4s_samp_init(&smp[q], &sp, V, NULL, 0, NULL, 0, &err)) {
			fprintf(stderr, "fp4serve bench: %s\n", err.msg);
			rc = 1;
			goto done;
		}
	}
	srand(1234);
	for (int32_t i = 0; i < eo.max_ctx; i++) {
		tok[i] = rand() % V;
		pos[i] = i;
	}
	/* warm-up + reps; the prompts fill the cache the decode then reads (the pp figure is sequence
	 * 0's prompt alone; the others are prefilled the same way, untimed) */
	int32_t ntg = 0;
	double t_last = 0;
	for (int r = -1; r < reps; r++) {
		for (int32_t q = 0; prompt_len > 0 && q < nb; q++) {
			int32_t row = prompt_len - 1;
			for (int32_t i = 0; i < prompt_len; i++)
				seq[i] = q;
			struct fp4s_batch b = {prompt_len, tok, pos, seq, NULL, 0};
			double a = now_s();
			if (fp4s_fwd_run(f, &b, &row, 1, logits, &err)) {
				fprintf(stderr, "fp4serve bench: %s\n", err.msg);
				rc = 1;
				goto done;
			}
			if (r >= 0 && q == 0)
				t_pp[r] = now_s() - a;
		}
		/* Decode as the engine runs it (engine_opts' lookahead): step i + 1 is enqueued before
		 * step i's tokens are read, each token fed to the next step where it was found (the
		 * argmax, or --temp's draw); a token's time runs from one read to the next.
		 * FP4S_LOOKAHEAD=0: one step at a time. */
		for (int32_t i = 0; ahead && i < tg; i++) {
			int src = 0;
			if (i == 0) {
				for (int32_t q = 0; q < nb; q++)
					btok[q] = tok[(prompt_len + 7 * q) % eo.max_ctx], bpos[q] = prompt_len, bseq[q] = q, brow[q] = q;
				const struct fp4s_batch b0 = {nb, btok, bpos, bseq, NULL, 0};
				t_last = now_s();
				src = bench_launch(f, &b0, brow, nb, sampling ? smp : NULL, srow, sedit, &err);
			}
			if (!src && i + 1 < tg) {
				for (int32_t q = 0; q < nb; q++)
					bpos[q] = prompt_len + i + 1;
				const struct fp4s_batch bn = {nb, NULL, bpos, bseq, NULL, 0};
				src = bench_launch(f, &bn, brow, nb, sampling ? smp : NULL, srow, sedit, &err);
			}
			if (!src)
				src = fp4s_fwd_collect(f, bnext, &err);
			if (src) {
				fprintf(stderr, "fp4serve bench: %s\n", err.msg);
				rc = 1;
				goto done;
			}
			const double t = now_s();
			if (r >= 0)
				t_tg[ntg++] = t - t_last;
			t_last = t;
		}
		for (int32_t i = 0; !ahead && i < tg; i++) {
			for (int32_t q = 0; q < nb; q++) {
				btok[q] = tok[(prompt_len + i + 7 * q) % eo.max_ctx];
				bpos[q] = prompt_len + i;
				bseq[q] = q;
				brow[q] = q;
			}
			struct fp4s_batch b = {nb, btok, bpos, bseq, NULL, 0};
			double a = now_s();
			/* greedy decode: the argmax is taken where the logits are (on the GPU); --temp:
			 * sampled there, or on the host */
			int src = 0;
			if (!sampling) {
				src = fp4s_fwd_run_argmax(f, &b, brow, nb, bnext, &err);
			} else if (dev_sample) {
				int32_t ne = 0;
				for (int32_t q = 0; q < nb && !src; q++) {
					src = fp4s_samp_plan(&smp[q], &srow[q], sedit, 1, &ne, &err);
					srow[q].edit0 = 0;
				}
				if (!src)
					src = fp4s_fwd_run_sample(f, &b, brow, nb, srow, sedit, 0, bnext, slp, &err);
			} else {
				src = fp4s_fwd_run(f, &b, brow, nb, logits, &err);
				for (int32_t q = 0; q < nb && !src; q++) {
					struct fp4s_samp_result res;
					src = fp4s_samp_sample(&smp[q], logits + (size_t)q * V, V, &res, &err);
					bnext[q] = res.token;
				}
			}
			if (src) {
				fprintf(stderr, "fp4serve bench: %s\n", err.msg);
				rc = 1;
				goto done;
			}
			if (r >= 0)
				t_tg[ntg++] = now_s() - a;
		}
	}
	{
		const double pp_s = prompt_len > 0 && pp > 0 ? median(t_pp, reps) : 0;
		const double tg_s = tg > 0 ? median(t_tg, ntg) : 0;
		/* bytes per decode step at the mean depth of the timed steps (fp4s_kv_bytes counts BF16) */
		const double kv = fp4s_kv_bytes(&m->cfg, prompt_len + tg / 2) *
		                  fp4s_kv_dtype_bytes(fp4s_engine_kv_dtype(e)) / 2.0;
		const double bytes = st.bytes_per_token + kv;
		/* batches: B tokens a step; the bytes a step reads are not modelled (B KV caches, and for
		 * MoE the union of the experts the B tokens route to), so no GB/s is claimed */
		const double gbs = tg_s > 0 && nb == 1 ? bytes / tg_s / 1e9 : 0;
		const double tg_tps = tg_s > 0 ? nb / tg_s : 0;
		const char *be = fp4s_engine_backend_name(e);
		/* one-token steps through the backend's whole-step kernel (backend.h step_prepare) */
		const int whole = fp4s_engine_fwd(e)->step_ok;
		if (json) {
			printf("{\"model\":\"%s\",\"backend\":\"%s\",\"arch\":\"%s\",\"load_s\":%.3f,"
			       "\"prompt_tokens\":%d,\"pp_tok_s\":%.2f,\"ctx\":%d,\"gen_tokens\":%d,\"batch\":%d,"
			       "\"tg_tok_s\":%.3f,\"tg_ms_median\":%.3f,\"bytes_per_token\":%.0f,"
			       "\"gb_s\":%.2f,\"copy_ceiling_gb_s\":%.1f,\"pct_of_ceiling\":%.1f,"
			       "\"roofline_tok_s\":%.2f,\"reps\":%d,\"whole_step\":%s,\"lookahead\":%s}\n",
			       eo.model, be, fp4s_arch_name(m->cfg.arch), load_s, prompt_len,
			       pp_s > 0 ? prompt_len / pp_s : 0, ctx, tg, nb, tg_tps, tg_s * 1e3,
			       bytes, gbs, ceiling, ceiling > 0 ? 100 * gbs / ceiling : 0,
			       ceiling > 0 && nb == 1 ? ceiling * 1e9 / bytes : 0, reps, whole ? "true" : "false",
			       ahead ? "true" : "false");
		} else {
			printf("model      %s (%s, %s backend, loaded in %.2f s)\n", eo.model,
			       fp4s_arch_name(m->cfg.arch), be, load_s);
			printf("ceiling    %.1f GB/s (%s copy, bytes read + written)\n", ceiling,
			       strcmp(be, "cpu") ? "device" : "host memcpy");
			if (sampling)
				printf("sampling   temperature %g, top_p %g, top_k %d, logprobs %s (top %d), on the %s\n",
				       (double)sp.temperature, (double)sp.top_p, sp.top_k, sp.logprobs ? "yes" : "no",
				       sp.top_logprobs, dev_sample ? "device" : "host");
			printf("decode     %.3f GB read per token (weights %.3f GB + KV %.3f MB at depth %d)%s%s\n",
			       bytes / 1e9, st.bytes_per_token / 1e9, kv / 1e6, prompt_len + tg / 2,
			       whole ? "; one launch a token (whole-step kernel)" : "",
			       ahead ? "; the next step enqueued before a token is read" : "");
			printf("%-10s %10s %12s %12s %10s %8s\n", "test", "tokens", "tok/s", nb > 1 ? "ms/step" : "ms/token", "GB/s",
			       "% ceil");
			if (pp > 0)
				printf("%-10s %10d %12.2f %12.3f %10s %8s\n", "pp", prompt_len, prompt_len / pp_s,
				       1e3 * pp_s / prompt_len, "-", "-");
			if (tg > 0 && nb == 1)
				printf("%-10s %10d %12.3f %12.3f %10.2f %7.1f%%\n", ctx ? "tg@ctx" : "tg", tg,
				       1 / tg_s, 1e3 * tg_s, gbs, ceiling > 0 ? 100 * gbs / ceiling : 0);
			if (tg > 0 && nb > 1) {
				/* "tg x64": 64 sequences, tok/s summed over them, ms per step */
				char name[32];
				snprintf(name, sizeof name, "%s x%d", ctx ? "tg@ctx" : "tg", nb);
				printf("%-10s %10d %12.3f %12.3f %10s %8s\n", name, tg, tg_tps, 1e3 * tg_s, "-", "-");
			}
			if (tg > 0 && ceiling > 0 && nb == 1)
				printf("roofline   %.2f tok/s at the ceiling\n", ceiling * 1e9 / bytes);
		}
	}
done:
	free(tok), free(pos), free(seq), free(logits), free(t_pp), free(t_tg);
	free(btok), free(bpos), free(bseq), free(brow), free(bnext);
	for (int32_t q = 0; smp && q < nb; q++)
		fp4s_samp_free(&smp[q]);
	free(smp), free(srow), free(slp);
	fp4s_engine_close(e);
	return rc;
}
