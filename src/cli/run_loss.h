/*
 * run_loss.h - what the loss runners of `spanhead run` (run_policy.c: --policy-loss,
 * run_distill.c: --distill) share, so that each holds only its loss: the rows of the options
 * every loss takes from the head (defined once here, placed into each loss's table), the
 * optional .npy input, the device buffers of one call laid out from a table, the timed calls,
 * the normwise error of the check, and the end of the atomic output set.
 */
#ifndef SPH_CLI_RUN_LOSS_H
#define SPH_CLI_RUN_LOSS_H

#include <stddef.h>
#include <stdint.h>

#include "args.h"
#include "npy.h"
#include "opts.h"
#include "outset.h"
#include "spanhead.h"

#define RUN_LOSS_MAX_REPEATS 1000

/* The head's options of a loss runner, in its options struct T: the run tables' concept rows
 * (opts.h: --device --temperature --softcap --threads --kernel --json) and the rows the losses
 * alone share (--dtype --repeats --check): int device, dtype, check, json; double
 * temperature, softcap; int64_t threads, repeats; const char *kernel. */
#define RUN_LOSS_HEAD_ROWS(T)                                                                  \
    SPH_CLI_ROW_DEVICE(T, "where to compute (default cpu)"),                                  \
    {"--dtype", "f32|bf16|f16", SPH_OPT_CHOICE, SPH_CLI_OFF(T, dtype, int), 0, 0, 0, 0,        \
     sph_cli_run_dtype_names, 0,                                                               \
     "what uint16 hidden / weight bits hold (f4 / f2 files say it\n"                           \
     "themselves)"},                                                                           \
    SPH_CLI_ROW_TEMPERATURE(T), SPH_CLI_ROW_SOFTCAP(T), SPH_CLI_ROW_THREADS(T),                \
    SPH_CLI_ROW_KERNEL(T),                                                                     \
    {"--repeats", "R", SPH_OPT_I64, SPH_CLI_OFF(T, repeats, int64_t), 1, RUN_LOSS_MAX_REPEATS,  \
     0, 0, NULL, 0, "timed calls after a warm-up, median reported (default 1)"},              \
    {"--check", NULL, SPH_OPT_FLAG, SPH_CLI_OFF(T, check, int), 0, 0, 0, 0, NULL, 0,           \
     "compare with the float64 reference; exit 1 if off"},                                     \
    SPH_CLI_ROW_JSON(T)

/* DIR/name.npy where present (npy_read_in): 1 read, 0 absent, -1 error (printed). */
int run_loss_read(const char *dir, const char *name, npy_array *a);

/* max |got - ref| / max(max |ref|, floor) (normwise); NaN anywhere gives inf. */
double run_loss_rel(const float *got, const float *ref, int64_t n, double floor);

/* One buffer of a call: host data copied in (NULL: none), or an output (out) the call
 * writes; an input whose host is NULL is an absent optional input (no tensor). */
typedef struct run_loss_buf {
    const void *host;
    size_t bytes;
    int ndim;
    int64_t n0, n1;
    sph_dtype dt;
    int out;
} run_loss_buf;

#define RUN_LOSS_MAX_BUFS 24

/* The device buffers of one call and their tensor views. */
typedef struct run_loss_bufs {
    int n;
    void *buf[RUN_LOSS_MAX_BUFS];
    int64_t sh[RUN_LOSS_MAX_BUFS][2];
    sph_tensor t[RUN_LOSS_MAX_BUFS];
} run_loss_bufs;

/* Allocates spec[0 .. n) on ctx's device dev and copies the inputs in (b zeroed first). */
sph_status run_loss_bufs_make(sph_ctx_t ctx, sph_device dev, const run_loss_buf *spec, int n,
                              run_loss_bufs *b);
/* Buffer k's tensor, or NULL when it is absent. */
const sph_tensor *run_loss_tensor(const run_loss_bufs *b, int k);
void run_loss_bufs_free(sph_ctx_t ctx, run_loss_bufs *b);

/* The context of one call: a CUDA device (device_id) or the CPU, threads, a forced kernel
 * set (NULL: the best), a TP communicator (NULL: none); *dev the device its tensors name. */
sph_status run_loss_ctx(sph_ctx_t *ctx, sph_device *dev, int on_cuda, int device_id,
                        int64_t threads, const char *kernel, sph_comm_t tp);

/* One call of a loss through its two entry points, over its argument block loss (a
 * sph_policy_args, a sph_distill_args): each loss gives the two three-line wrappers. */
typedef struct run_loss_call {
    sph_ctx_t ctx;
    const sph_head_args *head;
    const void *loss;
    sph_status (*size)(const struct run_loss_call *c, size_t *bytes);
    sph_status (*run)(const struct run_loss_call *c, void *ws, size_t bytes);
} run_loss_call;

/* The call's workspace (c->size; allocated on the context, freed before returning), a warm-up
 * call (also the only call of a --check reference) and reps timed ones (at most
 * RUN_LOSS_MAX_REPEATS, the --repeats row's bound), each synchronized: *ws_bytes the
 * workspace, *ms their median (0 with reps 0). */
sph_status run_loss_timed(const run_loss_call *c, int reps, size_t *ws_bytes, double *ms);

/* "spanhead run: [reference: ]<status>: <library message>", returns 1. */
int run_loss_fail_status(const char *kernel, sph_status s);

/* The end of an output set begun before the run (os is released either way): bad says a
 * write failed (json NULL: out of memory before any write), else the set is committed.
 * 0, or 1 with the message printed. */
int run_loss_outputs_end(sph_cli_outset *os, const char *json, int bad);

#endif
