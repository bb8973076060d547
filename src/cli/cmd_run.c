/* cmd_run.c - placeholder until the subcommand lands. */
#include "cli.h"

int sph_cli_run(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return sph_cli_fail("run", 1, "not built yet");
}
