/*
 * cli.h - the subcommands of the spanhead program. The CLI uses nothing but the public header
 * (plus cJSON); each subcommand lives in its own file and returns the process exit code
 * (0 success, 1 runtime failure, 2 usage error), printing a one-line message on failure.
 */
#ifndef SPH_CLI_H
#define SPH_CLI_H

#include "spanhead.h"

int sph_cli_pack(int argc, char **argv);
int sph_cli_layout(int argc, char **argv);
int sph_cli_spans(int argc, char **argv);
int sph_cli_run(int argc, char **argv);
int sph_cli_bench(int argc, char **argv);
int sph_cli_tune(int argc, char **argv);

/* "spanhead <cmd>: <message>" on stderr; returns code. */
int sph_cli_fail(const char *cmd, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The non-option argument arg of cmd, which takes one FILE (or -): an unknown option or a
 * second file is a usage error (returns 2 after the message), else *path = arg, returns 0. */
int sph_cli_file_arg(const char *cmd, const char *arg, const char **path);

/* Seconds on CLOCK_MONOTONIC (wall-clock timings of the run and bench subcommands). */
double sph_cli_now_s(void);
/* qsort comparator for doubles, ascending (medians of repeated timings). */
int sph_cli_cmp_double(const void *a, const void *b);

#endif
