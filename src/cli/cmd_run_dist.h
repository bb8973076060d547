/*
 * cmd_run_dist.h - the distributed form of `spanhead run` (tensor, context and data parallel
 * under mpirun). cmd_run.c dispatches here with one line:
 *
 *     if (sph_cli_run_wants_dist(argc, argv)) return sph_cli_run_dist(argc, argv);
 */
#ifndef SPH_CLI_CMD_RUN_DIST_H
#define SPH_CLI_CMD_RUN_DIST_H

/* 1 when argv (argv[0] = "run") asks for a distributed run: any of --tp, --cp, --dp. */
int sph_cli_run_wants_dist(int argc, char **argv);

/* `spanhead run --tp T --cp C --dp D [...]` under `mpirun -np T*C*D`. Returns the exit code:
 * 0 PASS (or no check requested), 1 FAIL or runtime error, 2 usage error. Every rank returns
 * the same code. */
int sph_cli_run_dist(int argc, char **argv);

#endif
