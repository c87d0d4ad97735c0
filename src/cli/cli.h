/* cli.h: the subcommands of the fp4serve binary. Each takes its own argv (argv[0] = command
 * name), parses it with getopt_long from one option table, prints results on stdout and logs on
 * stderr, and returns the process exit code (0 ok, 1 failure, 2 usage error). */
#ifndef FP4S_CLI_H
#define FP4S_CLI_H

int cmd_report(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_gen(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_tokenize(int argc, char **argv), cmd_detokenize(int argc, char **argv);
int cmd_serve(int argc, char **argv); /* src/server/srv_serve.c */

#endif
