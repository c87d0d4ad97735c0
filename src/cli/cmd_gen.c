/* cmd_gen.c: `fp4serve gen --preset NAME [--format F] [--seed N] [--layers N] OUT`. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "model/mwrite.h"
#include "util/progress.h"

static void gen_usage(FILE *f)
{
	int32_t n;
	const char *const *names = fp4s_preset_names(&n);
	fprintf(f, "usage: fp4serve gen --preset NAME [--format bf16|nvfp4|nvfp4-ct|mxfp4] [--seed N]\n"
	           "                    [--shard-mb MB] [--threads N] [--layers N] OUT\n\n"
	           "Writes a random-weight checkpoint with a real model's geometry in Hugging Face layout\n"
	           "(config.json, safetensors shards, tokenizer.json). Default format: mxfp4 for gpt-oss\n"
	           "(its published form), bf16 otherwise. nvfp4 = ModelOpt W4A16_NVFP4 layout, nvfp4-ct =\n"
	           "compressed-tensors. Same seed, same bytes.\n\npresets:");
	for (int32_t i = 0; i < n; i++)
		fprintf(f, " %s", names[i]);
	fprintf(f, "\n");
}

int cmd_gen(int argc, char **argv)
{
	static const struct option opts[] = {
		{"preset", required_argument, NULL, 'p'}, {"format", required_argument, NULL, 'f'},
		{"seed", required_argument, NULL, 's'},   {"shard-mb", required_argument, NULL, 'S'},
		{"threads", required_argument, NULL, 't'}, {"layers", required_argument, NULL, 'L'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0}};
	const char *preset = NULL, *format = NULL;
	struct fp4s_write_opts o = {0};
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "p:f:s:S:t:L:h", opts, NULL)) != -1) {
		switch (c) {
		case 'p': preset = optarg; break;
		case 'f': format = optarg; break;
		case 's': o.seed = strtoull(optarg, NULL, 0); break;
		case 'S': o.shard_bytes = strtoull(optarg, NULL, 0) * 1000000ull; break;
		case 't': o.threads = atoi(optarg); break;
		case 'L':
			o.layers = atoi(optarg);
			if (o.layers < 1) {
				fprintf(stderr, "fp4serve gen: --layers %s (a count >= 1)\n", optarg);
				return 2;
			}
			break;
		case 'h': gen_usage(stdout); return 0;
		default: gen_usage(stderr); return 2;
		}
	}
	if (!preset || optind != argc - 1) {
		gen_usage(stderr);
		return 2;
	}
	struct fp4s_error err = {0};
	struct fp4s_config cfg;
	if (fp4s_preset_config(preset, NULL, &cfg, &err)) {
		fprintf(stderr, "fp4serve gen: %s\n", err.msg);
		return 2;
	}
	o.format = fp4s_preset_default_format(&cfg);
	fp4s_config_free(&cfg);
	if (format && fp4s_qformat_parse(format, &o.format)) {
		fprintf(stderr, "fp4serve gen: unknown --format %s (bf16, nvfp4, nvfp4-ct, mxfp4)\n", format);
		return 2;
	}
	double t0 = fp4s_now();
	if (fp4s_gen(preset, argv[optind], &o, &err)) {
		fprintf(stderr, "fp4serve gen: %s\n", err.msg);
		return 1;
	}
	fprintf(stderr, "gen: wrote %s (%s, %s, seed %llu) in %.2f s\n", argv[optind], preset,
	        fp4s_qformat_name(o.format), (unsigned long long)o.seed, fp4s_now() - t0);
	return 0;
}
