/* cmd_layout.c - placeholder until the subcommand lands. */
#include "cli.h"

int sph_cli_layout(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return sph_cli_fail("layout", 1, "not built yet");
}
