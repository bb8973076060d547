/* cmd_pack.c - placeholder until the subcommand lands. */
#include "cli.h"

int sph_cli_pack(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return sph_cli_fail("pack", 1, "not built yet");
}
