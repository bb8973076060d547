/* cmd_tune.c - placeholder until the subcommand lands. */
#include "cli.h"

int sph_cli_tune(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return sph_cli_fail("tune", 1, "not built yet");
}
