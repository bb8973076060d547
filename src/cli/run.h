/*
 * run.h - what the files of the single-process `spanhead run` share: its options, the host
 * problem (synthetic or read from .npy files), the device run and the report.
 *
 *   cmd_run.c      the option table, validation and the flow of the command
 *   run_problem.c  the host problem: a seeded synthetic batch or the .npy files of a directory, with size and
 *                  non-finite checks
 *   run_device.c   device buffers, the head calls and their timing
 *   run_report.c   the float64 check, the text and JSON reports and the atomic outputs
 *
 * The distributed form (--tp/--cp/--dp under mpirun) lives in run_dist*.c (run_dist.h).
 */
#ifndef SPH_CLI_RUN_H
#define SPH_CLI_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "cli.h"
#include "outset.h"

#define RUN_CMD "run"



/* ---- the host problem --------------------------------------------------------------------- */

typedef struct run_problem {
    int64_t N, H, V, V_total, v0, K, n_act;
    int bits, is_bf16;  /* input dtype */
    void *h, *w;        /* host (N, H), (V, H) */
    int64_t *tgt, *cand;
    uint8_t *mask;      /* NULL = all active */
    int64_t *spans, n_spans;
    float *g, *e, *gl, *gm; /* upstream gradients, each optional */
    float *temp;            /* per-row temperatures (temperature.npy) or NULL: --temperature */
    int64_t n_seq;          /* packed sequences of the synthetic RL batch */
    int grads;              /* some upstream gradient is given: the backward runs */
    const char *source;     /* "default packed RL batch", "synthetic" or the inputs dir */
    const char *mask_name;
} run_problem;

void run_problem_free(run_problem *p);
/* Builds the problem from o; 0 or an exit code (message printed). */
int run_problem_make(const run_opts *o, run_problem *p);

/* ---- the device run ----------------------------------------------------------------------- */

enum { T_H, T_W, T_TGT, T_CAND, T_MASK, T_LP, T_ENT, T_LSE, T_LM, T_ST, T_G, T_E, T_GL, T_GM,
       T_DH, T_DW, T_SP2, T_TEMP, T_TKL, T_TKI, T_COUNT };

typedef struct run_device {
    sph_ctx_t ctx;
    void *buf[T_COUNT];
    size_t bytes[T_COUNT];
    int64_t shape[T_COUNT][2];
    sph_tensor t[T_COUNT];
    sph_head_args a;
    void *ws;
    size_t ws_bytes[2];
    int one_pass, backward;
} run_device;

/* A context (device, threads, kernel) and device copies of the problem. */
sph_status run_device_setup(run_device *d, const run_problem *p, const run_opts *o, int on_cuda,
                            const char *kernel, int64_t threads);
/* One forward (+ backward); seconds of each. */
sph_status run_device_pass(run_device *d, double *t_fwd, double *t_bwd);
/* A host copy of buffer k (malloc'ed), NULL on failure. */
float *run_device_get(run_device *d, int k);
void run_device_free(run_device *d);

/* ---- outputs and report ------------------------------------------------------------------- */

#define RUN_N_OUT 9
/* logprob entropy lse logit_mean dhidden dweight sum_p2 (opt-in, --sum-p2) topk_logprobs
 * topk_ids (opt-in, --topk K: (N, K), the ids int64) */
extern const char *const run_out_names[RUN_N_OUT];
extern const char *const run_out_files[RUN_N_OUT + 1]; /* the same .npy names, NULL-ended */
/* output k is per row, (N) */
#define RUN_OUT_PER_ROW(k) ((k) < 4 || (k) == 6)
/* output k is listed as "not computed" when absent (sum_p2 is only ever opt-in) */
#define RUN_OUT_LISTED(k) ((k) == 1 || (k) == 3 || (k) == 4 || (k) == 5)
/* output k is (N, K) of --topk; RUN_OUT_IDS: the int64 ids */
#define RUN_OUT_TOPK(k) ((k) == 7 || (k) == 8)
#define RUN_OUT_IDS 8
extern const int run_out_buf[RUN_N_OUT];           /* their T_* buffers */

typedef struct run_result {
    const char *describe;
    double fwd_s, bwd_s, rate, floor_s, work;
    int reps;
    size_t ws_bytes;
    float *out[RUN_N_OUT];
    int have[RUN_N_OUT];      /* requested and computed */
    int64_t count[RUN_N_OUT];
    /* check */
    int checked, passed;
    double check_s, tol, err[RUN_N_OUT];
    /* the fp32 logits' budget (run_report.c logit_budget): max zeta_i of the active rows, the
     * entropy's per-row budget's max relative to max|ref|, each output's tolerance */
    double zeta, ent_budget, tol_k[RUN_N_OUT];
    const char *outputs_written;
} run_result;

/* The float64 reference on the same inputs; fills r->err, r->passed. 0 or an exit code. */
int run_check(const run_problem *p, const run_opts *o, int on_cuda, run_result *r);
/* Writes the requested outputs atomically; 0 or an exit code (message printed). */
/* The library's verdict on option values before any work (opt_probe.c): 0, or 2 with the
 * library's message, printed as "spanhead CMD: ..." when msg is NULL, else put in msg. */
int sph_cli_probe_head(const char *cmd, double temperature, double softcap, int64_t threads,
                       const char *kernel, char *msg, size_t n);
/* The same for the policy loss's arguments pol (pol_args of the options; its counts are
 * judged against the real batch, not here). */
int sph_cli_probe_policy(const char *cmd, const sph_policy_args *pol, double temperature,
                         double softcap, int64_t threads, const char *kernel, char *msg,
                         size_t n);
int run_write_outputs(const run_problem *p, const run_opts *o, run_result *r, sph_cli_outset *os);
void run_report_text(const run_problem *p, const run_opts *o, const run_result *r);
void run_report_json(const run_problem *p, const run_opts *o, const run_result *r);

#endif
