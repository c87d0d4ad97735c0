/* cmd_quantize.c: `fp4serve quantize IN OUT --format nvfp4|nvfp4-ct|mxfp4`. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "model/mwrite.h"
#include "util/progress.h"

static void quantize_usage(FILE *f)
{
	fprintf(f, "usage: fp4serve quantize IN OUT [--format nvfp4|nvfp4-ct|mxfp4] [--shard-mb MB]\n"
	           "                         [--threads N]\n\n"
	           "Quantizes a BF16/F16/F32 checkpoint. nvfp4 (default): ModelOpt layout, weight-only\n"
	           "W4A16_NVFP4 (no calibration data, so no input_scale); nvfp4-ct: compressed-tensors\n"
	           "nvfp4-pack-quantized; mxfp4: gpt-oss experts. Fused siblings (q/k/v, gate/up) share\n"
	           "one per-tensor scale. lm_head, embeddings, routers, norms and biases stay as they are.\n");
}

int cmd_quantize(int argc, char **argv)
{
	static const struct option opts[] = {
		{"format", required_argument, NULL, 'f'}, {"shard-mb", required_argument, NULL, 'S'},
		{"threads", required_argument, NULL, 't'}, {"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0}};
	struct fp4s_write_opts o = {.format = FP4S_QF_NVFP4};
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "f:S:t:h", opts, NULL)) != -1) {
		switch (c) {
		case 'f':
			if (fp4s_qformat_parse(optarg, &o.format) || o.format == FP4S_QF_BF16) {
				fprintf(stderr, "fp4serve quantize: --format must be nvfp4, nvfp4-ct or mxfp4\n");
				return 2;
			}
			break;
		case 'S': o.shard_bytes = strtoull(optarg, NULL, 0) * 1000000ull; break;
		case 't': o.threads = atoi(optarg); break;
		case 'h': quantize_usage(stdout); return 0;
		default: quantize_usage(stderr); return 2;
		}
	}
	if (optind != argc - 2) {
		quantize_usage(stderr);
		return 2;
	}
	struct fp4s_error err = {0};
	double t0 = fp4s_now();
	if (fp4s_quantize(argv[optind], argv[optind + 1], &o, &err)) {
		fprintf(stderr, "fp4serve quantize: %s\n", err.msg);
		return 1;
	}
	fprintf(stderr, "quantize: wrote %s (%s) in %.2f s\n", argv[optind + 1],
	        fp4s_qformat_name(o.format), fp4s_now() - t0);
	return 0;
}
