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
#include "outset.h"
#include "spanhead.h"

/* offsetof(T, f) where T's field f has type type, else a compile error: a shared row cannot
 * write a value of another type into a loss's options struct. */
#define RUN_LOSS_OFF(T, f, type) \
    (offsetof(T, f) + 0 * sizeof(char[_Generic(((T *)0)->f, type: 1, default: -1)]))

extern const char *const run_loss_devices[]; /* cpu, cuda: the --device choices */
extern const char *const run_loss_dtypes[];  /* f32, bf16, f16: the --dtype choices */

/* The head's options of a loss runner, in its options struct T: int device, dtype, check,
 * json; double temperature, softcap; int64_t threads, repeats; const char *kernel. */
#define RUN_LOSS_HEAD_ROWS(T)                                                                   \
    {"--device", "cpu|cuda", SPH_OPT_CHOICE, RUN_LOSS_OFF(T, device, int), 0, 0, 0, 0,         \
     run_loss_devices, 0, "where to compute (default cpu)"},                                    \
    {"--dtype", "f32|bf16|f16", SPH_OPT_CHOICE, RUN_LOSS_OFF(T, dtype, int), 0, 0, 0, 0,        \
     run_loss_dtypes, 0, "what uint16 hidden / weight bits hold (f4 / f2 files say it themselves)"}, \
    {"--temperature", "T", SPH_OPT_F64, RUN_LOSS_OFF(T, temperature, double), 0, 0, 0, 0, NULL, \
     SPH_OPTF_ANY, "softmax temperature of the head (default 1)"},                              \
    {"--softcap", "C", SPH_OPT_F64, RUN_LOSS_OFF(T, softcap, double), 0, 0, 0, 0, NULL,         \
     SPH_OPTF_ANY, "tanh logit cap of the head (default 0: off)"},                              \
    {"--threads", "N", SPH_OPT_I64, RUN_LOSS_OFF(T, threads, int64_t), 0, INT32_MAX, 0, 0, NULL, \
     0, "CPU threads (default 0: all; the library bounds it)"},                                 \
    {"--kernel", "NAME", SPH_OPT_STR, RUN_LOSS_OFF(T, kernel, const char *), 0, 0, 0, 0, NULL, 0, \
     "force a kernel set: ref, generic, avx2, avx512"},                                         \
    {"--repeats", "R", SPH_OPT_I64, RUN_LOSS_OFF(T, repeats, int64_t), 1, RUN_LOSS_MAX_REPEATS, 0, 0, NULL, 0,  \
     "timed calls after a warm-up, median reported (default 1)"},                               \
    {"--check", NULL, SPH_OPT_FLAG, RUN_LOSS_OFF(T, check, int), 0, 0, 0, 0, NULL, 0,           \
     "compare with the float64 reference; exit 1 if off"},                                      \
    {"--json", NULL, SPH_OPT_FLAG, RUN_LOSS_OFF(T, json, int), 0, 0, 0, 0, NULL, 0,             \
     "print the result and the check as one JSON object"}

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

/* A warm-up call (also the only call of a --check reference) and reps timed ones (at most
 * RUN_LOSS_MAX_REPEATS, the --repeats row's bound), each synchronized; *ms their median (0
 * with reps 0). */
#define RUN_LOSS_MAX_REPEATS 1000
sph_status run_loss_time(sph_ctx_t ctx, sph_status (*call)(void *arg), void *arg, int reps,
                         double *ms);

/* "spanhead run: [reference: ]<status>: <library message>", returns 1. */
int run_loss_fail_status(const char *kernel, sph_status s);

/* The end of an output set begun before the run (os is released either way): bad says a
 * write failed (json NULL: out of memory before any write), else the set is committed.
 * 0, or 1 with the message printed. */
int run_loss_outputs_end(sph_cli_outset *os, const char *json, int bad);

#endif
