/*
 * main.c - entry point of the spanhead program: dispatches to the subcommands, and turns a
 * failed write on standard output (a full disk, a closed pipe) into a failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int sph_cli_parse_or_exit(const char *cmd, const char *synopsis, const char *description,
                          const sph_cli_opt *table, int argc, char **argv, void *dst,
                          sph_cli_parsed *parsed, int *done) {
    char err[512];
    *done = 1;
    int rc = sph_cli_parse(table, argc, argv, dst, parsed, err, sizeof err);
    if (rc == SPH_CLI_HELP) {
        sph_cli_usage(stdout, synopsis, description, table, SPH_CLI_EXIT_STATUS);
        return 0;
    }
    if (rc) return sph_cli_fail(cmd, 2, "%s", err);
    *done = 0;
    return 0;
}

int sph_cli_parse_file_cmd(const char *cmd, const char *synopsis, const char *description,
                           const sph_cli_opt *table, int argc, char **argv, void *dst,
                           const char **path, int *done) {
    const char **pos = malloc(sizeof(char *) * (size_t)(argc + 1));
    *done = 1;
    if (!pos) return sph_cli_fail(cmd, 1, "out of memory");
    sph_cli_parsed p = {.pos = pos};
    int rc = sph_cli_parse_or_exit(cmd, synopsis, description, table, argc, argv, dst, &p, done);
    if (!*done) {
        *done = 1;
        if (p.n_pos == 0)
            rc = sph_cli_fail(cmd, 2, "expected a FILE or - for standard input (see --help)");
        else if (p.n_pos > 1)
            rc = sph_cli_fail(cmd, 2, "extra argument '%s': expected one FILE or -", pos[1]);
        else
            *path = pos[0], *done = 0;
    }
    free(pos);
    return rc;
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
            "spanhead <command> --help for a command's options.\n"
            SPH_CLI_EXIT_STATUS "\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return sph_cli_close_stdout("help", 0);
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("spanhead %s\n", sph_version());
        return sph_cli_close_stdout("version", 0);
    }
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } cmds[] = {{"pack", sph_cli_pack},   {"layout", sph_cli_layout}, {"spans", sph_cli_spans},
                {"run", sph_cli_run},     {"bench", sph_cli_bench},   {"tune", sph_cli_tune}};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(cmd, cmds[i].name))
            return sph_cli_close_stdout(cmd, cmds[i].fn(argc - 1, argv + 1));
    fprintf(stderr, "spanhead: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
