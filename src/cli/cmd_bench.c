/* cmd_bench.c - placeholder until the subcommand lands. */
#include "cli.h"

int sph_cli_bench(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return sph_cli_fail("bench", 1, "not built yet");
}
