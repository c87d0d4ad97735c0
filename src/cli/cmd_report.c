/* cmd_report.c: `fp4serve report`: what this build contains and which FP4 path each GPU gets. */
#include <getopt.h>
#include <stdio.h>

#include "backend/cuda/cuda_device.h"
#include "cli/cli.h"

int cmd_report(int argc, char **argv)
{
	static const struct option opts[] = {{"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if (c == 'h') {
			printf("usage: fp4serve report\n  Prints the build (version, backends, CUDA "
			       "architectures) and each GPU with the FP4 path it will use.\n");
			return 0;
		}
		return 2;
	}
	printf("fp4serve %s (commit %s)\n", FP4S_VERSION, FP4S_GIT_COMMIT);
	printf("backends: cpu%s\n", fp4s_cuda_built() ? ", cuda" : "");
	printf("cpu: %s E2M1 encoder (bit-exact with the CUDA reference)\n", "software");
	if (!fp4s_cuda_built()) {
		printf("cuda: not built (nvcc was not found at configure time)\n");
		return 0;
	}
	printf("cuda architectures compiled: %s\n", fp4s_cuda_archs());
	struct fp4s_error err = {0};
	int n = fp4s_cuda_device_count(&err);
	if (n == 0) {
		printf("gpus: none (%s)\n", err.msg[0] ? err.msg : "no device");
		return 0;
	}
	for (int d = 0; d < n; d++) {
		struct fp4s_cuda_device_info info;
		if (fp4s_cuda_device_query(d, &info, &err)) {
			printf("gpu %d: query failed: %s\n", d, err.msg);
			continue;
		}
		printf("gpu %d: %s, compute capability %d.%d, %d SMs, %.1f GiB (%.1f free), L2 %.0f MB, "
		       "%d-bit bus\n",
		       d, info.name, info.cc_major, info.cc_minor, info.sm_count,
		       (double)info.mem_total / (1 << 30), (double)info.mem_free / (1 << 30),
		       (double)info.l2_bytes / 1e6, info.mem_bus_bits);
		if (!info.has_kernel_image) {
			printf("  fp4 path: none: this binary has no kernel image for compute capability "
			       "%d.%d; rebuild with -DCMAKE_CUDA_ARCHITECTURES=%d%da (or add it to the list)\n",
			       info.cc_major, info.cc_minor, info.cc_major, info.cc_minor);
			continue;
		}
		enum fp4s_fp4_path path = info.fp4_path;
		if (path != FP4S_FP4_SOFTWARE && !info.native_fp4_compiled) {
			printf("  fp4 path: %s\n  note: the GPU has FP4 hardware but this binary lacks the "
			       "family-specific %d%da cubin; rebuild with it to use the native path\n",
			       fp4s_fp4_path_name(FP4S_FP4_SOFTWARE), info.cc_major, info.cc_minor);
			continue;
		}
		printf("  fp4 path: %s\n", fp4s_fp4_path_name(path));
	}
	return 0;
}
