/*
 * run_policy.h - `spanhead run --policy-loss ...`: the fused RL policy loss (sph_policy_loss,
 * docs/policy.md) of the CLI. cmd_run.c dispatches here when --policy-loss is given: to
 * sph_cli_run_policy_main_dist under mpirun or with --tp/--cp/--dp, else to
 * sph_cli_run_policy.
 *
 *   run_policy.c       options, the .npy inputs, one process on the CPU or a GPU, --check
 *                      against the float64 reference, loss.json and the .npy outputs
 *   dist/run_policy_dist.c  the same under mpirun: --tp (vocabulary shards), --cp (rows of the
 *                      sequences split across ranks: the library's sequence group), --dp
 *                      (whole sequences per rank, the global num_tokens / num_seqs)
 */
#ifndef SPH_CLI_RUN_POLICY_H
#define SPH_CLI_RUN_POLICY_H

#include <stdint.h>
#include <stdio.h>

#include "cli.h"
#include "outset.h"

/* The options of `run --policy-loss` (run_policy.c). */
extern const sph_cli_opt sph_cli_policy_opts[];

/* The command; returns the exit code (0 ok, 1 bad data / failure / failed --check, 2 usage). */
int sph_cli_run_policy(int argc, char **argv);

/* ---- shared by run_policy.c and run_policy_dist.c ---------------------------------------- */

typedef struct pol_opts {
    int device, dtype, loss, kl, agg, check, json;
    const char *inputs, *outputs, *kernel;
    int64_t threads, repeats, num_tokens, num_seqs, tp, cp, dp, gap;
    int64_t topk; /* --topk K: the policy's top-K ids and log-probs (0: none) */
    int sum_p2;   /* --sum-p2 */
    double clip_low, clip_high, clip_c, kl_coef, entropy_coef, norm_length, temperature,
        softcap;
    int dtype_given;
} pol_opts;

/* The host problem: the head's inputs and the per-row policy inputs. */
typedef struct pol_problem {
    int64_t N, H, V;
    int bits, is_bf16;
    void *h, *w;             /* (N, H), (V, H) in the input dtype */
    int64_t *tgt, *seq;      /* (N); seq NULL when seq_id.npy is absent */
    uint8_t *mask;           /* (N) or NULL */
    int64_t *spans, n_spans; /* host spans of the mask (--gap), NULL without a mask */
    float *adv, *old, *ref, *isw; /* (N); ref / isw NULL when absent */
    float *temp;                  /* (N) per-row temperatures (temperature.npy) or NULL */
} pol_problem;

void pol_problem_free(pol_problem *p);
/* Reads o->inputs; 0 or an exit code (message printed). */
int pol_problem_read(const pol_opts *o, pol_problem *p);

/* Outputs of one run, host copies. */
typedef struct pol_result {
    float metrics[SPH_POLICY_N_METRICS];
    float *lp, *ent, *dh, *dw;   /* (N), (N), (N, H), (V, H) */
    int64_t topk;                /* K of tki / tkl (0: none) */
    int64_t *tki;                /* (N, K) --topk's ids, or NULL */
    float *tkl, *sp2;            /* (N, K) their log-probs, (N) --sum-p2's; or NULL */
    double ms;                   /* median time of one call */
    size_t ws_bytes;
    char describe[256];          /* the context's sph_ctx_describe line */
} pol_result;

void pol_result_free(pol_result *r);

/* Where and how one call runs. */
typedef struct pol_where {
    int on_cuda, device_id;
    const char *kernel;
    int64_t threads;
    int reps;                 /* timed calls after the warm-up (0: the warm-up only) */
    sph_comm_t tp, seq;       /* TP group (vocabulary shards) and sequence group, or NULL */
    int64_t v0, V_total;      /* this rank's shard of the vocabulary (0, 0: unsharded) */
    int64_t num_tokens, num_seqs; /* > 0: override the options' (a global batch) */
} pol_where;

/* One call on p (the rank's rows and vocabulary rows) where w says; the outputs copied back.
 * 0 or an exit code (message printed). */
int pol_run(const pol_opts *o, const pol_problem *p, const pol_where *w, pol_result *r);
/* sph_policy_args of o (tensors unset). */
sph_policy_args pol_args(const pol_opts *o);
/* The metrics' names, in sph_policy_metric order. */
extern const char *const pol_metric_names[SPH_POLICY_N_METRICS];
/* loss.json text of the metrics (the first 7: loss .. ppo_kl), malloc'ed. */
char *pol_loss_json(const float *metrics);
/* --check of the extras (--topk / --sum-p2) against the reference's, run with
 * pol_ref_topk(o, V) entries (one more where it can: the K-th entry's gap to the next): ex[0]
 * the top-K log-probs normwise, ex[1] the ids that differ where the reference separates them,
 * ex[2] sum_p2 normwise; 1 when within tol. */
int pol_check_extras(const pol_result *got, const pol_result *ref, int64_t N, int64_t V,
                     double tol, double ex[3]);
int64_t pol_ref_topk(const pol_opts *o, int64_t V);
/* The comparison of a run with the reference's: max relative errors, 1 when within tol. */
int pol_compare(const pol_result *got, const pol_result *ref, int64_t N, int64_t H, int64_t V,
                double tol, double err[5]);
/* The options' defaults, and what the parser cannot judge alone (0, or an exit code with
 * msg), run_policy.c. */
void pol_opts_defaults(pol_opts *o);
int pol_validate(pol_opts *o, const sph_cli_parsed *pp, char *msg, size_t n);
/* The usage of `run --policy-loss` on f. */
void pol_usage(FILE *f);
/* The output set of dir begun (before any work: outset.h); 0 or an exit code (printed). */
int pol_outputs_begin(sph_cli_outset *s, const char *dir);
/* Writes loss.json and the .npy outputs into the set and publishes it; 0 or an exit code. */
int pol_write_outputs(sph_cli_outset *s, const pol_result *r, int64_t N, int64_t H, int64_t V);

#endif
