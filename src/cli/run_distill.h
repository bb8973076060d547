/*
 * run_distill.h - `spanhead run --distill ...`: the fused distillation loss (sph_distill_loss,
 * docs/distill.md) of the CLI, run_distill.c. cmd_run.c dispatches here with one line:
 *
 *     if (sph_cli_run_wants_distill(argc, argv)) return sph_cli_run_distill(argc, argv);
 */
#ifndef SPH_CLI_RUN_DISTILL_H
#define SPH_CLI_RUN_DISTILL_H

/* 1 when argv (argv[0] = "run") has --distill. */
int sph_cli_run_wants_distill(int argc, char **argv);
/* The command; returns the exit code (0 ok, 1 bad data / failure / failed --check, 2 usage). */
int sph_cli_run_distill(int argc, char **argv);

#endif
