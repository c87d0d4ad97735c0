/* main.c: the fp4serve binary dispatches its first argument to a subcommand (cli.h). With no
 * argument it prints the build/device report. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

struct command {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *help;
};

static const struct command commands[] = {
	{"report", cmd_report, "build and device report: backends, GPUs, FP4 path"},
	{"run", cmd_run, "generate text from a prompt (stdout: the text only)"},
	{"chat", cmd_chat, "interactive chat in the model's chat format"},
	{"perplexity", cmd_perplexity, "perplexity +/- standard error of a text file"},
	{"bench", cmd_bench, "prefill/decode tok/s, GB/s and % of the bandwidth roofline"},
	{"inspect", cmd_inspect, "architecture, tensors, formats, bytes per decode token, roofline"},
	{"gen", cmd_gen, "write a random-weight checkpoint with a real model's geometry"},
	{"quantize", cmd_quantize, "BF16 checkpoint to NVFP4 (ModelOpt / compressed-tensors) or MXFP4"},
	{"tokenize", cmd_tokenize, "text -> token ids (--bench-mb N: encode throughput)"},
	{"detokenize", cmd_detokenize, "token ids -> text"},
	{"serve", cmd_serve, "OpenAI-compatible HTTP server (--demo: a tiny random model)"},
};

static void usage(FILE *f)
{
	fprintf(f, "usage: fp4serve <command> [options]\n\ncommands:\n");
	for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
		fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
	fprintf(f, "\n`fp4serve <command> --help` describes a command's options.\n");
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return cmd_report(1, (char *[]){"report", NULL});
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("fp4serve %s (commit %s)\n", FP4S_VERSION, FP4S_GIT_COMMIT);
		return 0;
	}
	for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
		if (!strcmp(argv[1], commands[i].name))
			return commands[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "fp4serve: unknown command '%s'\n\n", argv[1]);
	usage(stderr);
	return 2;
}
