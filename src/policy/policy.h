/*
 * policy.h - the validated form of one sph_policy_loss call (policy.c fills it) and the
 * backends that run it: the float64 reference (policy_ref.c), the CPU backend (policy_cpu.c,
 * fused into head_cpu.c's one-pass sweep through the plan's row hook) and CUDA
 * (src/cuda/policy.cu, fused into head.cu's one-pass paths through the same hook).
 * docs/policy.md has the math, the rules and the workspace.
 *
 * Row space. "Group rows" are the rows over which sequences are counted: the call's N rows,
 * or, with a seq_comm of size P, the P * N rows of every rank of the group in rank order
 * (group row r * N + i is rank r's row i). Sequence statistics (T, S, T_j, rho_j) are computed
 * over the group rows identically on every rank, so every rank gets the same weights.
 */
#ifndef SPH_POLICY_POLICY_H
#define SPH_POLICY_POLICY_H

#include "core/backend.h"
#include "core/ctx.h"
#include "head/plan.h"
#include "policy/policy_math.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sph_policy_plan {
    /* the head's plan of the call: a forward (one-pass when dhidden / dweight are given) whose
     * upstream gradients the backend binds to g / e; stats, logprob, entropy may be NULL (the
     * backend binds workspace buffers) */
    sph_head_plan head;
    sph_policy_coef coef;
    int agg;                       /* sph_loss_agg */
    int need_seq;                  /* the weights or rho need the sequence grouping */
    int64_t num_tokens, num_seqs;  /* 0 = counted */
    double norm_length;
    int64_t N;
    sph_device device;
    /* per-row inputs (N), on the head's device */
    const float *adv, *old, *ref, *isw; /* ref / isw may be NULL */
    const int64_t *seq;                 /* NULL unless need_seq */
    float *metrics;                     /* (SPH_POLICY_N_METRICS) */
    sph_comm_t seq_comm;                /* NULL or the group (size >= 1) */
    int64_t group;                      /* ranks of seq_comm (1 without) */
    int64_t rank;                       /* this rank in seq_comm (0 without) */
    /* bound to the workspace by the backend (device memory on CUDA) */
    uint8_t *act;    /* (N) active: head-active and target >= 0; the head's mask */
    double *c;       /* (N) aggregation weights, 0 on inactive rows (CPU; CUDA computes
                      * them where they are used) */
    double *rho;     /* (N) gspo: the row's sequence mean delta */
    float *g, *e;    /* (N) dL/dlogp, dL/dH: the head's dlogprob and dentropy */
    const float *logp, *ent; /* (N) where the head writes logprob and entropy */
    void *dev;       /* backend scratch (CUDA: counters, sort buffers) */
} sph_policy_plan;

/* Validation of the pair of argument blocks into pp: its head plan (every field of a one-pass
 * forward, upstream gradients unset, the backend's check not yet run) and the policy's fields
 * (workspace pointers unset). Nothing is written. */
sph_status sph_policy_plan_make(sph_ctx_t ctx, const sph_head_args *head,
                                const sph_policy_args *pol, sph_policy_plan *pp);

/* gspo's two head plans, from the loss's head plan: fwd (statistics and per-row outputs, no
 * gradients) and bwd (the gradients after rho; not one-pass). CPU and CUDA (policy.c). */
void sph_policy_gspo_plans(const sph_head_plan *hp, sph_head_plan *fwd, sph_head_plan *bwd);
/* The head's bytes of the loss's workspace: the forward's, gspo the larger of its two passes'. */
sph_status sph_policy_head_workspace(sph_ctx_t ctx, const sph_policy_plan *pp, size_t *bytes);

/* Host helpers (policy_cpu.c) shared by the reference and the CPU backend. */
/* The group rows' records: this rank's own when group = 1, else gathered over seq_comm (host
 * buffers: MPI or an in-process communicator), after checking that every rank has N rows. */
sph_status sph_policy_gather_host(const sph_policy_plan *pp, const void *send, void *recv,
                                  size_t bytes_per_rank);

/* The loss's own table (issue 27: the head's table names no loss): one per backend, chosen
 * per call from the context by policy.c (the forced reference or the device). workspace: the
 * exact bytes; run: copies the plan, binds its workspace buffers and its row hook (plan.h)
 * into the copy and runs the head's passes through ctx->head. */
typedef struct sph_policy_backend {
    const char *name;
    sph_status (*workspace)(sph_ctx_t ctx, const sph_policy_plan *pp, size_t *bytes);
    sph_status (*run)(sph_ctx_t ctx, const sph_policy_plan *pp, void *ws, size_t bytes);
} sph_policy_backend;

extern const sph_policy_backend sph_policy_ref_backend;  /* policy_ref.c: host memory */
extern const sph_policy_backend sph_policy_cpu_backend;  /* policy_cpu.c: head_cpu.c's sweep */
/* (CUDA's, src/cuda/policy.cu, is handed out by the CUDA device table's loss_backend.) */
/* The loss's backend on ctx, as its head table was filled (core/ctx.c): the forced reference
 * (host memory only: none on a device context, whose head reference is staged), the CPU
 * backend on host memory, else the device's (its table's loss_backend("policy")). NULL: none
 * (the entry points answer SPH_ERR_UNSUPPORTED). */
const sph_policy_backend *sph_policy_backend_of(sph_ctx_t ctx);

/* The float64 oracle for tests (policy_ref.c): metrics[SPH_POLICY_N_METRICS], logp / ent (N)
 * and the gradients of the active rows dh (N, H), dw (V_loc, H) in float64 (each may be NULL),
 * no accumulate, no allreduce. Host plans only; allocates host scratch. */
sph_status sph_policy_ref_f64(const sph_policy_plan *pp, double *metrics, double *logp,
                              double *ent, double *dh, double *dw);

/* The metrics the call's rows give in float64 when the active rows' log-probs and entropies
 * are logp[i] / ent[i] (f32, N; the values an optimized backend wrote): the check that its
 * metrics are the ones its own rows imply, apart from the error of its log-probs (which the
 * tests bound on their own). scale[SPH_POLICY_N_METRICS] (may be NULL): each metric's sum of
 * |row contribution|, the size of the rounding a float sum of it may carry (0 for the exact
 * counts and clip fractions). Host plans only. */
sph_status sph_policy_ref_metrics_at(const sph_policy_plan *pp, const float *logp,
                                     const float *ent, double *metrics, double *scale);

#ifdef __cplusplus
}
#endif
#endif
