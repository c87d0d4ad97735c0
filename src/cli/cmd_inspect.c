/* cmd_inspect.c: `fp4serve inspect -m DIR` (or --preset NAME [--format F] without files):
 * architecture, parameters, bytes by format, bytes read per decode token and the roofline. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_device.h"
#include "cli/cli.h"
#include "model/model.h"
#include "model/mwrite.h"
#include "util/progress.h"

/* Until the CUDA backend measures the device, the default is the copy ceiling measured on our
 * test H100 (performance.md §2). */
#define DEFAULT_BW_GBS 3017.0

static void inspect_usage(FILE *f)
{
	fprintf(f, "usage: fp4serve inspect (-m DIR | --preset NAME [--format F]) [--bandwidth GB/s]\n"
	           "                        [--context N] [--brief]\n\n"
	           "Prints the architecture, parameters (total, active per token), bytes by format,\n"
	           "bytes read per decode token (performance.md §3.1), the roofline tok/s at the given\n"
	           "bandwidth (default: the copy bandwidth measured on GPU 0 when there is one, else\n"
	           "%.0f GB/s, our H100's measured copy ceiling) and the tensor list (omitted with\n"
	           "--brief).\n",
	        DEFAULT_BW_GBS);
}

static void print_summary(const struct fp4s_config *c, const struct fp4s_weight *w, int32_t n,
                          double bw, int64_t ctx, int brief, const char *bw_source)
{
	struct fp4s_model_stats s;
	fp4s_model_stats(c, w, n, &s);
	printf("arch        %s  H=%lld L=%d heads=%d/%d head_dim=%d I=%lld V=%lld", fp4s_arch_name(c->arch),
	       (long long)c->hidden, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim,
	       (long long)c->intermediate, (long long)c->vocab);
	if (c->n_experts)
		printf(" experts=%d top-%d", c->n_experts, c->n_experts_per_tok);
	if (c->moe_intermediate)
		printf(" I_e=%lld", (long long)c->moe_intermediate);
	printf("%s\n", c->tie_embeddings ? " tied" : "");
	/* B for real models, M for the tiny ones */
	double u = s.params_total >= 1e9 ? 1e9 : 1e6;
	printf("params      %.3f %s total, %.3f %s active per token\n", s.params_total / u,
	       u == 1e9 ? "B" : "M", s.params_active / u, u == 1e9 ? "B" : "M");
	printf("bytes       %.3f GB total:", s.bytes_total / 1e9);
	for (int f = 0; f < FP4S_WF_COUNT; f++)
		if (s.bytes_by_fmt[f] > 0)
			printf(" %s %.3f GB", fp4s_wformat_name((enum fp4s_wformat)f), s.bytes_by_fmt[f] / 1e9);
	printf("\n");
	double kv = fp4s_kv_bytes(c, ctx);
	printf("decode      %.3f GB read per token (weights)", s.bytes_per_token / 1e9);
	if (ctx)
		printf(" + %.3f GB KV cache at context %lld", kv / 1e9, (long long)ctx);
	printf("\n");
	printf("roofline    %.0f tok/s at %.0f GB/s (%s)\n", bw * 1e9 / (s.bytes_per_token + kv), bw,
	       bw_source);
	if (brief)
		return;
	printf("tensors     %d\n", n);
	for (int32_t i = 0; i < n; i++) {
		char shape[64];
		int k = snprintf(shape, sizeof shape, "[");
		for (int32_t d = 0; d < w[i].spec->ndim; d++)
			k += snprintf(shape + k, sizeof shape - (size_t)k, "%s%lld", d ? ", " : "",
			              (long long)w[i].spec->shape[d]);
		snprintf(shape + k, sizeof shape - (size_t)k, "]");
		printf("  %-56s %-15s %-6s %-22s %12llu", w[i].spec->name, fp4s_role_name(w[i].spec->role),
		       w[i].present ? fp4s_wformat_name(w[i].fmt) : "absent", shape,
		       (unsigned long long)(w[i].present ? fp4s_weight_bytes(&w[i]) : 0));
		if (w[i].fmt == FP4S_WF_NVFP4 && w[i].ws2 > 0)
			printf("  ws2=%.6g%s", (double)w[i].ws2,
			       w[i].group_scale_shared ? "" : " (per shard)");
		printf("\n");
	}
}

int cmd_inspect(int argc, char **argv)
{
	static const struct option opts[] = {
		{"model", required_argument, NULL, 'm'},  {"preset", required_argument, NULL, 'p'},
		{"format", required_argument, NULL, 'f'}, {"bandwidth", required_argument, NULL, 'b'},
		{"context", required_argument, NULL, 'c'}, {"brief", no_argument, NULL, 'B'},
		{"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0}};
	const char *dir = NULL, *preset = NULL, *format = NULL;
	double bw = DEFAULT_BW_GBS;
	int64_t ctx = 0;
	int brief = 0, bw_given = 0, c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "m:p:f:b:c:Bh", opts, NULL)) != -1) {
		switch (c) {
		case 'm': dir = optarg; break;
		case 'p': preset = optarg; break;
		case 'f': format = optarg; break;
		case 'b': bw = atof(optarg), bw_given = 1; break;
		case 'c': ctx = atoll(optarg); break;
		case 'B': brief = 1; break;
		case 'h': inspect_usage(stdout); return 0;
		default: inspect_usage(stderr); return 2;
		}
	}
	if (!!dir == !!preset || optind != argc || !(bw > 0)) {
		inspect_usage(stderr);
		return 2;
	}
	struct fp4s_error err = {0};
	/* the roofline's bandwidth: given, else measured on the GPU, else our H100's figure */
	static char bw_note[400];
	const char *bw_source = "--bandwidth";
	if (!bw_given) {
		double gbs = 0;
		struct fp4s_error e2 = {0};
		if (fp4s_cuda_device_count(&e2) > 0 && fp4s_cuda_copy_bandwidth(0, &gbs, &e2) == 0 && gbs > 0) {
			struct fp4s_cuda_device_info info;
			bw = gbs;
			const int named = fp4s_cuda_device_query(0, &info, &e2) == 0;
			snprintf(bw_note, sizeof bw_note, "copy bandwidth measured on GPU 0%s%.200s",
			         named ? ", " : "", named ? info.name : "");
			bw_source = bw_note;
		} else {
			bw_source = "no GPU: the copy ceiling measured on our H100";
		}
	}
	if (preset) {
		struct fp4s_config cfg;
		if (fp4s_preset_config(preset, NULL, &cfg, &err)) {
			fprintf(stderr, "fp4serve inspect: %s\n", err.msg);
			return 2;
		}
		enum fp4s_qformat f = fp4s_preset_default_format(&cfg);
		if (format && fp4s_qformat_parse(format, &f)) {
			fprintf(stderr, "fp4serve inspect: unknown --format %s\n", format);
			fp4s_config_free(&cfg);
			return 2;
		}
		struct fp4s_tspec *specs;
		struct fp4s_weight *w;
		int32_t n;
		if (fp4s_plan(&cfg, f, &specs, &w, &n, &err)) {
			fprintf(stderr, "fp4serve inspect: %s\n", err.msg);
			fp4s_config_free(&cfg);
			return 1;
		}
		printf("model       preset %s (%s, planned; no files)\n", preset, fp4s_qformat_name(f));
		print_summary(&cfg, w, n, bw, ctx, brief, bw_source);
		free(specs);
		free(w);
		fp4s_config_free(&cfg);
		return 0;
	}
	struct fp4s_model m;
	double t0 = fp4s_now();
	int rc = fp4s_model_open(dir, &m, &err);
	if (rc == FP4S_EIO || rc == FP4S_EFORMAT) {
		/* a llama2.c .bin file */
		struct fp4s_error e2 = {0};
		if (!fp4s_llama2c_open(dir, &m, &e2))
			rc = 0;
	}
	if (rc) {
		fprintf(stderr, "fp4serve inspect: %s\n", err.msg);
		return 1;
	}
	printf("model       %s (loaded and validated in %.3f s)\n", dir, fp4s_now() - t0);
	if (m.qs.method != FP4S_QM_NONE) {
		printf("quant       %s %s (from %s), excluded:", fp4s_qmethod_name(m.qs.method), m.qs.algo,
		       m.qs.source);
		for (int32_t i = 0; i < m.qs.n_exclude; i++)
			printf(" %s", m.qs.exclude[i]);
		printf("\n");
	} else {
		printf("quant       none\n");
	}
	print_summary(&m.cfg, m.w, m.n, bw, ctx, brief, bw_source);
	fp4s_model_close(&m);
	return 0;
}
