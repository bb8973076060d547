/* cmd_spans.c - placeholder until the subcommand lands. */
#include "cli.h"

int sph_cli_spans(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return sph_cli_fail("spans", 1, "not built yet");
}
