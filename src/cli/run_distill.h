/*
 * run_distill.h - `spanhead run --distill ...`: the fused distillation loss (sph_distill_loss,
 * docs/distill.md) of the CLI. cmd_run.c dispatches here when --distill is given: to
 * sph_cli_run_distill_main_dist under mpirun or with --tp, else to sph_cli_run_distill.
 *
 *   run_distill.c       options, the .npy inputs, one process on the CPU or a GPU, --check
 *                       against the float64 reference, loss.json and the .npy outputs
 *   dist/run_distill_dist.c  the same under mpirun: --tp T --cp C (vocabulary shards x row
 *                       pieces of one seq_comm group; CPU over MPI or CUDA over NCCL), checked
 *                       against one process
 */
#ifndef SPH_CLI_RUN_DISTILL_H
#define SPH_CLI_RUN_DISTILL_H

#include <stdint.h>
#include <stdio.h>

#include "cli.h"
#include "outset.h"

/* The options of `run --distill` (run_distill.c). */
extern const sph_cli_opt sph_cli_distill_opts[];

/* The command; returns the exit code (0 ok, 1 bad data / failure / failed --check, 2 usage). */
int sph_cli_run_distill(int argc, char **argv);

/* ---- shared by run_distill.c and run_distill_dist.c ----------------------------------------- */

typedef struct dst_opts {
    int device, dtype, kind, red, check, json, dtype_given, temperature_given;
    const char *inputs, *outputs, *kernel;
    int64_t threads, repeats, tp, cp, num_tokens;
    double beta, tt, temperature, softcap;
} dst_opts;

/* The host problem, the whole vocabulary. */
typedef struct dst_problem {
    int64_t N, H, V, HT, K;
    int bits, is_bf16, tbits, dense;
    void *h, *w, *th, *tw; /* input dtype */
    uint8_t *mask;
    int64_t *ids;
    float *lp;
    float *trows;  /* (N) temperature.npy, or NULL (--temperature) */
    float *ttrows; /* (N) teacher_temperature.npy, or NULL (--teacher-temperature) */
} dst_problem;

void dst_problem_free(dst_problem *p);
/* Reads o->inputs; 0 or an exit code (message printed). */
int dst_problem_read(const dst_opts *o, dst_problem *p);

/* Outputs of one run, host copies: loss (1 or N), dhidden (N, H), dweight (the rank's rows). */
typedef struct dst_result {
    float *loss, *dh, *dw;
    double ms;
    size_t ws_bytes;
    char describe[256];
} dst_result;

void dst_result_free(dst_result *r);

/* Where and how one call runs: tp NULL = one process (the whole vocabulary); else the rank's
 * vocabulary rows [v0, v0 + V_loc) and dhidden all-reduced over tp. seq: the CP group
 * (sph_distill_args.seq_comm) or NULL; num_tokens: reduction mean's divisor (0 = counted);
 * dev_id: the CUDA device. */
typedef struct dst_where {
    int on_cuda;
    const char *kernel;
    int64_t threads;
    int reps; /* timed calls after the warm-up */
    sph_comm_t tp;
    int64_t v0, V_loc;
    sph_comm_t seq;
    int64_t num_tokens;
    int dev_id;
} dst_where;

/* One call; 0 or an exit code (message printed). */
int dst_run(const dst_opts *o, const dst_problem *p, const dst_where *w, dst_result *r);
extern const char *const dst_out_files[];
/* Writes loss.json, dhidden.npy, dweight.npy into the begun set and publishes it. */
int dst_write_outputs(sph_cli_outset *os, const dst_opts *o, const dst_problem *p,
                      const dst_result *r);
void dst_report(const dst_opts *o, const dst_problem *p, const dst_result *r, int checked,
                int passed, const double err[3], double tol);
void dst_usage(FILE *f);
/* The defaults of the options. */
void dst_opts_defaults(dst_opts *o);
/* After the parse: the given flags, and the usage errors the table cannot state (no --inputs,
 * an explicit --teacher-temperature 0). 0, or 2 with the message in msg. */
int dst_opts_finish(dst_opts *o, const sph_cli_parsed *pp, char *msg, size_t n);

#endif
