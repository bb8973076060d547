/* cmd_run.c - placeholder until the subcommand lands. */
#include "cli.h"
#include "cmd_run_dist.h"

int sph_cli_run(int argc, char **argv) {
    if (sph_cli_run_wants_dist(argc, argv)) return sph_cli_run_dist(argc, argv);
    (void)argc;
    (void)argv;
    return sph_cli_fail("run", 1, "not built yet");
}
