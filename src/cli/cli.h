/*
 * cli.h - the subcommands of the spanhead program. The CLI uses nothing but the public header
 * (plus cJSON, and BLAS to measure the CPU's dense GEMM rate) and its toolbox, a header a
 * concern (msg.h: messages; num.h: numbers and checked sizes; rng.h: random numbers; half.h:
 * 16-bit floats; clock.h: time and the machine; progress.h; outset.h: atomic outputs; args.h:
 * option tables), each included where it is used. Each
 * subcommand lives in its own file and returns the process exit code (0 success, 1 bad input
 * data or runtime failure, 2 usage error), printing a one-line message on failure.
 */
#ifndef SPH_CLI_H
#define SPH_CLI_H

#include "args.h"
#include "opts.h"
#include "spanhead.h"

int sph_cli_pack(int argc, char **argv);
int sph_cli_layout(int argc, char **argv);
int sph_cli_spans(int argc, char **argv);
int sph_cli_run(int argc, char **argv);
int sph_cli_bench(int argc, char **argv);
int sph_cli_tune(int argc, char **argv);

/* This machine's fp32 GEMM rate (flop/s) on an (m x K) x (K x n) product, the median of reps
 * chains of `chain` products each timed whole (after one warm-up chain); BLAS sgemm. 0 when
 * the buffers cannot be allocated. */
double sph_cli_sgemm_rate(int64_t m, int64_t n, int64_t K, int chain, int reps);

#endif
