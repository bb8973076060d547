/*
 * main.c - entry point of the spanhead program: dispatches to the subcommands, and turns a
 * failed write on standard output (a full disk, a closed pipe) into a failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "msg.h"

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
