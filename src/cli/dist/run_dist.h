/*
 * run_dist.h - the distributed form of `spanhead run` (tensor, context and data parallel
 * under mpirun): the MPI verification harness, src/cli/dist/. cmd_run.c enters it (the head's
 * sph_cli_run_dist, the losses' sph_cli_run_policy_main_dist and
 * sph_cli_run_distill_main_dist) when --tp, --cp or --dp is given or an MPI launcher started
 * several ranks; nothing below cmd_run.c names a file of this folder (check_layout.py rule 5).
 *
 * The rest of this header is shared by the runner's files only:
 *   run_dist_main.c   options, the agreement of all ranks on them, the command's phases
 *   run_dist_base.c   what the others share: the ranks, dist_fail,
 *                     dist_agree
 *   run_dist_batch.c  the global batch (synthetic or --inputs), its broadcast, and each
 *                     rank's share: bins, packed layout, CP-local rows
 *   run_dist_head.c   forward + backward of one rank's bins through the public head API,
 *                     and --bench's timing with and without the TP collectives
 *   run_dist_check.c  gathering to rank 0, the comparison with one process, --outputs
 */
#ifndef SPH_CLI_RUN_DIST_H
#define SPH_CLI_RUN_DIST_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cli.h"
#include "outset.h"
#include "run_distill.h"
#include "run_policy.h"

/* `spanhead run --tp T --cp C --dp D [...]` under `mpirun -np T*C*D`. Returns the exit code:
 * 0 PASS (or no check requested), 1 FAIL or runtime error, 2 usage error. Every rank returns
 * the same code. */
int sph_cli_run_dist(int argc, char **argv);

/* The losses under mpirun (run_policy_dist.c, run_distill_dist.c): every rank parses and
 * validates, and every verdict, a usage error or --help included, goes to the ranks'
 * agreement instead of ending this rank alone. */
int sph_cli_run_policy_main_dist(int argc, char **argv);
int sph_cli_run_distill_main_dist(int argc, char **argv);
/* Their distributed forms: o as far as this rank parsed it, rc its verdict (0, 1 or 2 with
 * msg, or SPH_CLI_HELP), which the ranks' agreement judges before anything else. */
int sph_cli_run_policy_dist(const pol_opts *o, int rc, const char *msg, int argc, char **argv);
int sph_cli_run_distill_dist(const dst_opts *o, int rc, const char *msg, int argc, char **argv);

/* Without MPI, what a loss's distributed form does: its --help, its usage error, or the
 * message that `needs` (--tp, --tp/--cp/--dp) needs MPI. Returns the exit code. */
int dist_loss_no_mpi(int rc, const char *msg, void (*usage)(FILE *f), const char *needs);

#ifdef SPH_HAVE_MPI

/* ---- step 0: the ranks agree (dist_agree.c) ---------------------------------------------- */

enum { SPH_CLI_PATH_HEAD = 1, SPH_CLI_PATH_POLICY = 2, SPH_CLI_PATH_DISTILL = 3 };

/* Collective over MPI_COMM_WORLD, the first of every distributed path: this rank's path, its
 * parse result (rc 0, 1 or 2 with msg, or SPH_CLI_HELP) and its parsed options (table, opts)
 * against every other rank's. Returns 0 to go on; SPH_CLI_HELP when every rank asked for
 * help (the caller prints the usage on rank 0); else the exit code every rank returns, its
 * one-line message printed by every rank (hint appended to a usage error). */
int sph_cli_dist_agree(int path, const sph_cli_opt *table, const void *opts, int rc,
                       const char *msg, const char *hint, int argc, char **argv);

/* ---- options ------------------------------------------------------------------------------ */


/* ---- ranks -------------------------------------------------------------------------------- */

extern int dist_rank, dist_size;

/* A failure on this rank: printed with the rank; the phase fails everywhere at dist_agree().
 * Returns 0 (so `ok = dist_fail(...)` reads naturally). */
int dist_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* 1 when every rank's ok is 1 (one all-reduce). */
int dist_agree(int ok);

/* This rank's GPU (--device cuda): its node-local rank modulo the devices it sees, so the
 * ranks of a node spread over its GPUs (two may share one). 1, or 0 after dist_fail when it
 * sees none (*dev_id 0). Collective over MPI_COMM_WORLD (the node split). With hold, also a
 * context on that GPU (*hold; the caller destroys it at the end): it makes the GPU the
 * thread's current device, which NCCL's communicators initialize on
 * (sph_comm_create_nccl_mpi), so it must exist before them. */
int dist_cuda_device(int *dev_id, sph_ctx_t *hold);

/* The start of a loss's distributed form: MPI initialized (unless it is), this rank's place
 * in dist_rank / dist_size, and step 0, the ranks' agreement (sph_cli_dist_agree) on path,
 * verdict and options. Returns -1 to go on; else the exit code every rank returns, after
 * rank 0 printed the usage (every rank asked for --help) and MPI was finalized. */
int dist_loss_begin(int path, const sph_cli_opt *table, const void *opts, int verdict,
                    const char *msg, int argc, char **argv, void (*usage)(FILE *f));

/* ---- the global batch --------------------------------------------------------------------- */

/* Per-row outputs and their upstream gradients, in this order everywhere. */
enum { F_LOGPROB, F_ENTROPY, F_LSE, F_LOGIT_MEAN, NF };
extern const char *const dist_field_names[NF];

typedef struct batch {
    int64_t n_seqs, R, H, V, K;
    int masked, bf16;
    double temperature;
    int64_t *lengths;  /* (n_seqs) */
    float *hidden;     /* (R, H), values already rounded to the input dtype */
    float *weight;     /* (V, H) */
    int64_t *targets;  /* (R) */
    int64_t *cand;     /* (R, K) or NULL */
    uint8_t *mask;     /* (R); all ones when dense */
    float *up[NF];     /* (R) each: dlogprob, dentropy, dlse, dlogit_mean (0 when absent) */
    float *temp;       /* (R) per-row temperatures (temperature.npy) or NULL: temperature */
    int64_t topk;      /* --topk K (every rank sets it from the agreed options), 0 = none */
    int sum_p2;        /* --sum-p2 (likewise) */
} batch;

void dist_batch_free(batch *b);
/* Rank 0: builds the synthetic batch or reads --inputs; 1 ok, 0 failed (reported). */
int dist_batch_synth(const dopts *o, batch *b);
int dist_batch_read(const dopts *o, batch *b);
/* Rank 0's batch to everyone (ok0: whether rank 0 could build it). Collective. */
int dist_batch_share(batch *b, int ok0);

/* ---- one rank's share --------------------------------------------------------------------- */

typedef struct share {
    int64_t n;          /* local rows over all bins of this rank */
    int64_t n_bins;     /* bins (micro-batches) of this rank */
    int64_t *bin_off;   /* (n_bins + 1) into the local rows */
    int64_t *grow;      /* (n) global row of each local row, -1 = padding */
} share;

void dist_share_free(share *s);
/* Packs, lays out and cuts the batch for (cp_rank, dp_rank); 1 ok, 0 failed (reported). */
int dist_share_make(const dopts *o, const batch *b, int64_t cp_rank, int64_t dp_rank, share *sh,
                    int64_t *total_bins, int64_t *padded_rows);

/* ---- forward + backward of one rank ------------------------------------------------------- */

typedef struct dev {
    sph_ctx_t io; /* memory helpers on the rank's device (no communicator) */
    int cuda;
} dev;

typedef struct result {
    float *row[NF];           /* (n) each: logprob, entropy, lse, logit_mean (0 with support) */
    float *dhidden;           /* (n, H), summed over the TP group */
    float *dweight;           /* (V_loc, H), this rank's bins */
    int64_t *topk_ids;        /* (n, topk) with --topk: global ids, merged over the TP group */
    float *topk_lp;           /* (n, topk) their log-probs */
    float *sum_p2;            /* (n) with --sum-p2 */
    double bench_ms[4];       /* --bench: medians (slowest rank) of forward and backward with
                                 the TP communicator, then without it; rank 0 only */
} result;

void dist_result_free(result *r);
/* Forward + backward over rows [grow] of the batch with weight rows [v0, v0 + V_loc), one call
 * pair per bin; ctx carries the TP communicator (or none for the reference). bench_reps > 0:
 * also times bin 0 with ctx and with bench_ctx (collective). 1 ok, 0 failed (reported). */
int dist_run_head(sph_ctx_t ctx, const dev *d, const batch *b, const int64_t *grow,
                  const int64_t *bin_off, int64_t n_bins, int64_t v0, int64_t V_loc, int64_t gap,
                  int allreduce, int one_pass, sph_ctx_t bench_ctx, int bench_reps, result *out);

/* ---- gather, check, outputs --------------------------------------------------------------- */

/* What rank 0 needs besides the options and the batch to judge the run. */
typedef struct dist_run {
    const share *sh;
    const result *res;
    int64_t tp_rank, V_loc, total_bins, padded_rows;
    double t_max;        /* slowest rank's forward + backward, s */
    sph_ctx_opts io;     /* the ranks' device, for --reference device */
    sph_cli_outset *out; /* rank 0 with --outputs: the set begun before any work */
} dist_run;

/* Gathers every rank's results to rank 0, which checks them (coverage, TP copies, padding,
 * the single-process comparison) and writes --outputs; returns the exit code every rank
 * agrees on (collective). */
int dist_gather_check(const dopts *o, const batch *b, const dist_run *run);

#endif /* SPH_HAVE_MPI */
#endif
