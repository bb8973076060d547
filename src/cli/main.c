/*
 * main.c - entry point of the spanhead program: dispatches to the subcommands.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli.h"

int sph_cli_fail(const char *cmd, int code, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "spanhead %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return code;
}

int sph_cli_file_arg(const char *cmd, const char *arg, const char **path) {
    if (arg[0] == '-' && arg[1] != '\0')
        return sph_cli_fail(cmd, 2, "unknown option '%s' (see --help)", arg);
    if (*path) return sph_cli_fail(cmd, 2, "extra argument '%s': expected one FILE or -", arg);
    *path = arg;
    return 0;
}

double sph_cli_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int sph_cli_cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: spanhead <command> [options]\n"
            "\n"
            "commands:\n"
            "  pack     pack sequence lengths into bins (JSON out)\n"
            "  layout   packed segment layout of sequence lengths (JSON out)\n"
            "  spans    active mask and spans of a batch description (JSON in and out)\n"
            "  run      forward + backward of the LM head on synthetic or .npy inputs\n"
            "  bench    time the LM head against the active floor and the dense path\n"
            "  tune     autotune CUDA tile configurations into the tune cache\n"
            "  version  print the library version\n"
            "\n"
            "spanhead <command> --help for a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("spanhead %s\n", sph_version());
        return 0;
    }
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } cmds[] = {{"pack", sph_cli_pack},   {"layout", sph_cli_layout}, {"spans", sph_cli_spans},
                {"run", sph_cli_run},     {"bench", sph_cli_bench},   {"tune", sph_cli_tune}};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(cmd, cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "spanhead: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
