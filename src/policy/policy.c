/*
 * policy.c - the public entry points of the fused RL policy loss (sph_policy_loss_workspace_size,
 * sph_policy_loss): validation of the head's and the policy's argument blocks into a head plan
 * (a one-pass forward whose upstream gradients the loss defines) and a policy plan, then
 * one indirect call through the loss's own table (policy.h: the reference, the CPU backend,
 * CUDA), chosen here from the context; the backends reach the head through the context's head
 * table and the plan's row hook (src/head/plan.h).
 *
 * Every check runs before any output is written: the head's (sph_head_plan_make), the scalar
 * domains of the loss, the per-row tensors' shapes, dtypes and devices, the arguments each
 * loss / KL / aggregation needs, and, for host memory, the values of the per-row inputs on
 * the active rows (finite). The math is in spanhead.h and policy_math.h.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/check.h"
#include "comm/comm.h"
#include "policy/policy.h"

// ---- per-row tensors ---------------------------------------------------------------------

/* A per-row tensor (N) of the loss: an input, registered with the call's validator. */
static sph_status row_tensor(sph_validator *val, const sph_tensor *t, const char *name, int64_t N,
                             unsigned dtype, void **out) {
    sph_view v;
    SPH_TRY(sph_val_rows(val, t, name, N, SPH_VAL_IN, dtype, &v));
    *out = v.data;
    return SPH_OK;
}

static const char *agg_name(int a) {
    static const char *n[] = {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                              "seq-mean-token-sum-norm"};
    return n[a];
}

/* Host data: every per-row input finite on the active rows (mask / spans and target >= 0). */
static sph_status check_values(const sph_head_plan *hp, const sph_policy_plan *pp) {
    if (hp->N == 0) return SPH_OK;
    uint8_t *act = sph_malloc((size_t)hp->N);
    SPH_CHECK(act != NULL, SPH_ERR_ALLOC, "policy: out of host memory (N = %lld)",
              (long long)hp->N);
    sph_head_active_rows(hp, act);
    const float *arr[4] = {pp->adv, pp->old, pp->ref, pp->isw};
    const char *names[4] = {"advantages", "old_logprob", "ref_logprob", "is_weight"};
    sph_status st = SPH_OK;
    for (int64_t i = 0; i < hp->N && st == SPH_OK; i++) {
        if (!act[i]) continue;
        int64_t t = hp->tgt_i64 ? ((const int64_t *)hp->targets)[i]
                                : (int64_t)((const int32_t *)hp->targets)[i];
        if (t < 0) continue;
        for (int k = 0; k < 4 && st == SPH_OK; k++)
            if (arr[k] && !isfinite(arr[k][i]))
                st = sph_err(SPH_ERR_INVALID_ARG,
                             "%s[%lld]: %g on an active row, expected a finite value", names[k],
                             (long long)i, (double)arr[k][i]);
    }
    sph_free(act);
    return st;
}

// ---- validation --------------------------------------------------------------------------

/* The loss's coefficients (spanhead.h, "Policies", "Float conversions"): each a number whose
 * float is normal (or 0 = off), in its domain; and the products the loss forms from them alone
 * within float: the per-row gradient e = -c eta and the k1 gradient c beta, with c at most 1
 * (1 / L for seq-mean-token-sum-norm: S >= 1 and T >= 1 in every other weight). The terms
 * that also take the data (advantages, is_weight, log-probs) are checked on the rows. */
static sph_status check_coefficients(const sph_policy_args *pol) {
    SPH_TRY(sph_val_float("clip_low", pol->clip_low, SPH_FR_ZERO_OK, 0, 1));
    SPH_TRY(sph_val_float("clip_high", pol->clip_high, SPH_FR_ZERO_OK, 0, FLT_MAX));
    SPH_TRY(sph_val_float("clip_ratio_c", pol->clip_ratio_c, SPH_FR_INF_OK, 1, HUGE_VAL));
    SPH_CHECK(pol->clip_ratio_c > 1, SPH_ERR_INVALID_ARG,
              "clip_ratio_c: %g, expected > 1 (INFINITY = no dual clip)", pol->clip_ratio_c);
    SPH_TRY(sph_val_float("kl_coef", pol->kl_coef, SPH_FR_ZERO_OK, 0, HUGE_VAL));
    SPH_TRY(sph_val_float("entropy_coef", pol->entropy_coef, SPH_FR_ZERO_OK, 0, HUGE_VAL));
    SPH_CHECK(pol->num_tokens >= 0, SPH_ERR_INVALID_ARG,
              "num_tokens: %lld, expected >= 1 (or 0 = count the active rows)",
              (long long)pol->num_tokens);
    SPH_CHECK(pol->num_seqs >= 0, SPH_ERR_INVALID_ARG,
              "num_seqs: %lld, expected >= 1 (or 0 = count the sequences)",
              (long long)pol->num_seqs);
    const int norm = pol->agg == SPH_AGG_SEQ_MEAN_TOKEN_SUM_NORM;
    SPH_TRY(sph_val_float("norm_length", pol->norm_length,
                          SPH_FR_INVERSE | (norm ? 0u : SPH_FR_ZERO_OK), 0, HUGE_VAL));
    SPH_CHECK(!norm || pol->norm_length > 0, SPH_ERR_INVALID_ARG,
              "norm_length: %g, expected > 0 (seq-mean-token-sum-norm divides by it)",
              pol->norm_length);
    const double cmax = norm ? 1.0 / pol->norm_length : 1.0;
    SPH_CHECK(pol->entropy_coef * cmax <= FLT_MAX, SPH_ERR_INVALID_ARG,
              "entropy_coef: %g with norm_length %g gives a per-row entropy gradient of %g, "
              "beyond float (%g)", pol->entropy_coef, pol->norm_length,
              pol->entropy_coef * cmax, (double)FLT_MAX);
    SPH_CHECK(pol->kl == SPH_KL_NONE || pol->kl_coef * cmax <= FLT_MAX, SPH_ERR_INVALID_ARG,
              "kl_coef: %g with norm_length %g gives a per-row KL gradient of %g, beyond float "
              "(%g)", pol->kl_coef, pol->norm_length, pol->kl_coef * cmax, (double)FLT_MAX);
    return SPH_OK;
}

/* The validation of one call into pp, every tensor registered with val (the caller adds the
 * workspace and runs sph_val_finish). */
static sph_status plan_validate(sph_ctx_t ctx, const sph_head_args *head,
                                const sph_policy_args *pol, sph_policy_plan *pp,
                                sph_validator *val) {
    SPH_TRY(sph_ctx_check(ctx, "policy_loss"));
    SPH_CHECK(head != NULL, SPH_ERR_INVALID_ARG, "head: NULL");
    SPH_CHECK(pol != NULL, SPH_ERR_INVALID_ARG, "policy: NULL");
    SPH_CHECK(head->struct_size >= sizeof(sph_head_args), SPH_ERR_INVALID_ARG,
              "head.struct_size: %zu, expected %zu (use SPH_HEAD_ARGS_INIT)", head->struct_size,
              sizeof(sph_head_args));
    SPH_CHECK(pol->struct_size >= sizeof(sph_policy_args), SPH_ERR_INVALID_ARG,
              "policy.struct_size: %zu, expected %zu (use SPH_POLICY_ARGS_INIT)",
              pol->struct_size, sizeof(sph_policy_args));
    SPH_CHECK(pp != NULL, SPH_ERR_INVALID_ARG, "plan: NULL");
    memset(pp, 0, sizeof *pp);
    sph_head_plan *hp = &pp->head;

    // scalars
    SPH_CHECK(pol->loss == SPH_PG_PPO || pol->loss == SPH_PG_CISPO || pol->loss == SPH_PG_GSPO,
              SPH_ERR_INVALID_ARG, "policy.loss: %d, expected SPH_PG_PPO (0), SPH_PG_CISPO (1) "
              "or SPH_PG_GSPO (2)", (int)pol->loss);
    SPH_CHECK(pol->kl >= SPH_KL_NONE && pol->kl <= SPH_KL_K3, SPH_ERR_INVALID_ARG,
              "policy.kl: %d, expected SPH_KL_NONE (0), K1 (1), K2 (2) or K3 (3)", (int)pol->kl);
    SPH_CHECK(pol->agg >= SPH_AGG_TOKEN_MEAN && pol->agg <= SPH_AGG_SEQ_MEAN_TOKEN_SUM_NORM,
              SPH_ERR_INVALID_ARG, "policy.agg: %d, expected 0 (token-mean) .. 3 "
              "(seq-mean-token-sum-norm)", (int)pol->agg);
    SPH_TRY(check_coefficients(pol));

    // the head's arguments: a forward whose upstream gradients the loss defines
    const char *up = head->dlogprob      ? "dlogprob"
                     : head->dentropy    ? "dentropy"
                     : head->dlse        ? "dlse"
                     : head->dlogit_mean ? "dlogit_mean"
                                         : NULL;
    SPH_CHECK(up == NULL, SPH_ERR_INVALID_ARG,
              "head.%s: given to sph_policy_loss, expected NULL (the policy loss defines the "
              "upstream gradients)", up ? up : "");
    SPH_CHECK(head->targets != NULL, SPH_ERR_INVALID_ARG,
              "head.targets: NULL, expected the (N) target ids (the loss needs logprob)");
    /* the generic checks now; the backend's (device pointers) once its buffers are bound;
     * stats are optional here (NULL: the backend binds them to the workspace). The head's
     * extras (sum_p2, topk_ids / topk_logprobs) are the head forward's outputs here too, by
     * its rules (top-k with candidates is the head's error, first) */
    SPH_TRY(sph_head_plan_validate(ctx, SPH_HEAD_FORWARD, head, hp, val, SPH_PLAN_STATS_OPTIONAL));
    SPH_CHECK(head->candidates == NULL, SPH_ERR_UNSUPPORTED,
              "head.candidates: sample support is not available with the policy loss");
    const int64_t N = hp->N;
    pp->N = N;
    pp->device = ctx->device;

    // coefficients
    pp->coef.loss = (int)pol->loss;
    pp->coef.kl = (int)pol->kl;
    pp->coef.lo = 1.0 - pol->clip_low;
    pp->coef.hi = 1.0 + pol->clip_high;
    pp->coef.clip_c = pol->loss == SPH_PG_CISPO ? HUGE_VAL : pol->clip_ratio_c;
    pp->coef.beta = pol->kl == SPH_KL_NONE ? 0.0 : pol->kl_coef;
    pp->coef.eta = pol->entropy_coef;
    pp->agg = (int)pol->agg;
    pp->num_tokens = pol->num_tokens;
    pp->num_seqs = pol->num_seqs;
    pp->norm_length = pol->norm_length;
    pp->need_seq = pol->agg != SPH_AGG_TOKEN_MEAN || pol->loss == SPH_PG_GSPO;

    // per-row inputs
    void *d;
    SPH_CHECK(pol->advantages != NULL, SPH_ERR_INVALID_ARG,
              "advantages: NULL, expected an f32 (N) tensor");
    SPH_TRY(row_tensor(val, pol->advantages, "advantages", N, SPH_DT_F32, &d));
    pp->adv = d;
    SPH_CHECK(pol->old_logprob != NULL, SPH_ERR_INVALID_ARG,
              "old_logprob: NULL, expected an f32 (N) tensor");
    SPH_TRY(row_tensor(val, pol->old_logprob, "old_logprob", N, SPH_DT_F32, &d));
    pp->old = d;
    if (pol->kl != SPH_KL_NONE) {
        SPH_CHECK(pol->ref_logprob != NULL, SPH_ERR_INVALID_ARG,
                  "ref_logprob: NULL, but kl is k%d (the KL term needs the reference "
                  "log-probs)", (int)pol->kl);
        SPH_TRY(row_tensor(val, pol->ref_logprob, "ref_logprob", N, SPH_DT_F32, &d));
        pp->ref = d;
    }
    if (pol->is_weight) {
        SPH_TRY(row_tensor(val, pol->is_weight, "is_weight", N, SPH_DT_F32, &d));
        pp->isw = d;
    }
    if (pp->need_seq) {
        SPH_CHECK(pol->seq_id != NULL, SPH_ERR_INVALID_ARG,
                  "seq_id: NULL, but %s needs the sequence of every row (an i64 (N) tensor)",
                  pol->loss == SPH_PG_GSPO ? "gspo" : agg_name(pp->agg));
    }
    if (pol->seq_id) {
        SPH_TRY(row_tensor(val, pol->seq_id, "seq_id", N, SPH_DT_I64, &d));
        if (pp->need_seq) pp->seq = d;
    }
    SPH_CHECK(pol->metrics != NULL, SPH_ERR_INVALID_ARG,
              "metrics: NULL, expected an f32 (%d) tensor", (int)SPH_POLICY_N_METRICS);
    {
        sph_view v;
        SPH_TRY(sph_val_tensor(val, pol->metrics, "metrics", 1, SPH_VAL_OUT, SPH_DT_F32, &v));
        SPH_TRY(sph_view_expect_dim(&v, "metrics", 0, SPH_POLICY_N_METRICS,
                                    "SPH_POLICY_N_METRICS"));
        pp->metrics = v.data;
    }

    // the sequence group
    pp->group = 1;
    if (pol->seq_comm) {
        sph_comm_t c = pol->seq_comm;
        SPH_TRY(sph_comm_validate(ctx, c, "seq_comm"));
        pp->seq_comm = c;
        pp->group = c->size;
        pp->rank = c->rank;
        SPH_CHECK(N <= INT64_MAX / (c->size > 0 ? c->size : 1) / 16, SPH_ERR_OVERFLOW,
                  "seq_comm: %lld ranks x %lld rows overflow", (long long)c->size,
                  (long long)N);
    }

    return SPH_OK;
}

/* After the regions (sph_val_finish): the contents of host data, the head's and the loss's. */
static sph_status check_data(sph_ctx_t ctx, const sph_policy_plan *pp) {
    if (!ctx->dev->host_memory) return SPH_OK;
    SPH_TRY(sph_head_plan_check_data(&pp->head));
    return check_values(&pp->head, pp);
}

sph_status sph_policy_plan_make(sph_ctx_t ctx, const sph_head_args *head,
                                const sph_policy_args *pol, sph_policy_plan *pp) {
    sph_validator val;
    sph_val_init(&val, ctx);
    SPH_TRY(plan_validate(ctx, head, pol, pp, &val));
    SPH_TRY(sph_val_finish(&val));
    return check_data(ctx, pp);
}

// ---- dispatch through the context's table ---------------------------------------------------

/* policy.h */
const sph_policy_backend *sph_policy_backend_of(sph_ctx_t ctx) {
    if (ctx->use_ref) return ctx->dev->host_memory ? &sph_policy_ref_backend : NULL;
    if (ctx->dev->host_memory) return &sph_policy_cpu_backend;
    /* a device's: handed out by its table (src/cuda/runtime.cu) */
    return ctx->dev->loss_backend ? (const sph_policy_backend *)ctx->dev->loss_backend("policy")
                                  : NULL;
}

static sph_status workspace_of(sph_ctx_t ctx, const sph_policy_plan *pp, size_t *bytes) {
    *bytes = 0;
    const sph_policy_backend *be = sph_policy_backend_of(ctx);
    if (!be) return sph_backend_missing(ctx, "policy loss");
    return be->workspace(ctx, pp, bytes);
}

sph_status sph_policy_loss_workspace_size(sph_ctx_t ctx, const sph_head_args *head,
                                          const sph_policy_args *policy, size_t *bytes) {
    SPH_CHECK(bytes != NULL, SPH_ERR_INVALID_ARG, "bytes: NULL");
    *bytes = 0;
    sph_policy_plan pp;
    SPH_TRY(sph_policy_plan_make(ctx, head, policy, &pp));
    return workspace_of(ctx, &pp, bytes);
}

static sph_status check_workspace(sph_ctx_t ctx, const sph_policy_plan *pp, void *workspace,
                                  size_t workspace_bytes, sph_validator *val) {
    size_t need = 0;
    SPH_TRY(workspace_of(ctx, pp, &need));
    SPH_CHECK(workspace_bytes >= need, SPH_ERR_WORKSPACE,
              "workspace_bytes: %zu, expected >= %zu (sph_policy_loss_workspace_size)",
              workspace_bytes, need);
    SPH_CHECK(need == 0 || workspace != NULL, SPH_ERR_WORKSPACE,
              "workspace: NULL, expected %zu bytes (sph_policy_loss_workspace_size)", need);
    if (need > 0 && ctx->head.check_workspace)
        SPH_TRY(ctx->head.check_workspace(ctx, workspace, need));
    /* the bytes the loss writes are a region of the call like its outputs */
    return sph_val_region(val, workspace, need, 1, ctx->device, "workspace", SPH_VAL_OUT);
}

// ---- the TP group agrees on the call ------------------------------------------------------

/* The tensor-parallel consistency check of the loss (spanhead.h, "Policies"): every rank of a
 * host TP group allgathers, in one exchange (comm/check.h, sph_comm_agree), the head's record
 * of the call (head_tp.c) followed by the loss's: its scalars and hashes of its per-row host
 * arrays; all compare, before any output is written. Different advantages on two ranks would
 * give each its own gradients (and a wrong sum of dhidden) with SPH_OK. Device groups: the
 * head's check only (debug builds); the loss's is the caller's duty (spanhead.h). */
enum {
    PR_TAG, PR_LOSS, PR_KL, PR_AGG, PR_LO, PR_HI, PR_C, PR_BETA, PR_ETA, PR_TOKENS, PR_SEQS,
    PR_NORM, PR_FLAGS, PR_ROWS, PR_WORDS
};
static const char *const g_pr_field[PR_WORDS] = {
    "validation", "loss", "kl", "agg", "clip_low", "clip_high", "clip_ratio_c", "kl_coef",
    "entropy_coef", "num_tokens", "num_seqs", "norm_length",
    "per-row inputs given (ref_logprob, is_weight, seq_id, seq_comm)",
    "per-row inputs (advantages, old_logprob, ref_logprob, is_weight, seq_id)"};
#define PR_VALID INT64_C(0x3130594c4f505053) /* "SPPOLY01" */
#define TP_ALL (SPH_HEAD_TP_WORDS + PR_WORDS)   /* the head's record, then the loss's */

static void policy_record(const sph_policy_plan *pp, sph_status local, int64_t *mine) {
    memset(mine, 0, PR_WORDS * sizeof *mine);
    if (local != SPH_OK) {
        mine[PR_TAG] = SPH_AGREE_INVALID;
        return;
    }
    const sph_policy_coef *k = &pp->coef;
    mine[PR_TAG] = PR_VALID, mine[PR_LOSS] = k->loss, mine[PR_KL] = k->kl;
    mine[PR_AGG] = pp->agg, mine[PR_LO] = sph_f64_bits(k->lo), mine[PR_HI] = sph_f64_bits(k->hi);
    mine[PR_C] = sph_f64_bits(k->clip_c), mine[PR_BETA] = sph_f64_bits(k->beta);
    mine[PR_ETA] = sph_f64_bits(k->eta), mine[PR_TOKENS] = pp->num_tokens;
    mine[PR_SEQS] = pp->num_seqs, mine[PR_NORM] = sph_f64_bits(pp->norm_length);
    mine[PR_FLAGS] = (pp->ref != NULL) | (pp->isw != NULL) << 1 | (pp->seq != NULL) << 2 |
                     pp->group << 3;
    const size_t n = (size_t)pp->N;
    uint64_t h = SPH_FNV1A_INIT;
    h = sph_fnv1a(h, pp->adv, n * 4), h = sph_fnv1a(h, pp->old, n * 4);
    if (pp->ref) h = sph_fnv1a(h, pp->ref, n * 4);
    if (pp->isw) h = sph_fnv1a(h, pp->isw, n * 4);
    if (pp->seq) h = sph_fnv1a(h, pp->seq, n * 8);
    mine[PR_ROWS] = (int64_t)h;
}

/* The head's verdict first (its message wins, as its check ran first before), then the
 * loss's. */
static sph_status policy_verdict(const int64_t *all, int64_t n, size_t words, void *arg) {
    (void)arg;
    SPH_TRY(sph_head_tp_verdict(all, n, words));
    const size_t o = SPH_HEAD_TP_WORDS;
    int64_t r = sph_agree_first_tag(all, n, words, o + PR_TAG, PR_VALID);
    if (r >= 0)
        return sph_err(SPH_ERR_INVALID_ARG,
                       "tp_comm: rank %lld of the group refused its policy-loss call (see that "
                       "rank's message); every rank fails with it",
                       (long long)r);
    size_t f;
    if (!sph_agree_first_diff(all, n, words, o, o + PR_WORDS, &r, &f)) return SPH_OK;
    return sph_err(SPH_ERR_MISMATCH,
                   "tp_comm: rank %lld's policy loss differs from rank 0's in %s (0x%llx, "
                   "0x%llx): every rank of the group must make the same call",
                   (long long)r, g_pr_field[f - o],
                   (unsigned long long)all[(size_t)r * words + f], (unsigned long long)all[f]);
}

static sph_status tp_agree(sph_ctx_t ctx, const sph_policy_plan *pp, sph_status local) {
    sph_comm_t comm = ctx->tp_comm;
    if (!comm || !comm->ops || comm->size <= 1 || comm->rank < 0 || comm->rank >= comm->size)
        return local;
    if (comm->device_buffers)
        return sph_head_tp_agree(ctx, SPH_HEAD_FORWARD, local == SPH_OK ? &pp->head : NULL,
                                 local);
    int64_t mine[TP_ALL];
    sph_head_tp_record(ctx, SPH_HEAD_FORWARD, local == SPH_OK ? &pp->head : NULL, mine);
    policy_record(pp, local, mine + SPH_HEAD_TP_WORDS);
    return sph_comm_agree(ctx, comm, mine, TP_ALL, local, "policy", policy_verdict, NULL);
}

static sph_status policy_loss(sph_ctx_t ctx, const sph_head_args *head,
                              const sph_policy_args *policy, void *workspace,
                              size_t workspace_bytes) {
    sph_policy_plan pp;
    sph_validator val;
    sph_val_init(&val, ctx);
    sph_status s = plan_validate(ctx, head, policy, &pp, &val);
    if (s == SPH_OK) s = check_workspace(ctx, &pp, workspace, workspace_bytes, &val);
    if (s == SPH_OK) s = sph_val_finish(&val);
    if (s == SPH_OK) s = check_data(ctx, &pp);
    /* a TP group agrees on the call (or on one rank's failure) before any output is written:
     * the head's part and the loss's, in one exchange */
    if (ctx && ctx->magic == SPH_CTX_MAGIC) s = tp_agree(ctx, &pp, s);
    SPH_TRY(s);
    return sph_policy_backend_of(ctx)->run(ctx, &pp, workspace, workspace_bytes);
}

sph_status sph_policy_loss(sph_ctx_t ctx, const sph_head_args *head,
                           const sph_policy_args *policy, void *workspace,
                           size_t workspace_bytes) {
    SPH_TRY(sph_ctx_enter(ctx, "policy_loss"));
    return sph_ctx_leave(ctx, policy_loss(ctx, head, policy, workspace, workspace_bytes));
}

/* policy.h: gspo's forward plan (no gradients, no hook) and its backward plan. */
void sph_policy_gspo_plans(const sph_head_plan *hp, sph_head_plan *fwd, sph_head_plan *bwd) {
    *fwd = *hp;
    fwd->dhidden = fwd->dweight = NULL;
    fwd->one_pass = 0;
    memset(&fwd->row_hook, 0, sizeof fwd->row_hook);
    fwd->dlogprob = fwd->dentropy = NULL;
    fwd->allreduce_dh = 0;
    *bwd = *hp;
    bwd->one_pass = 0;
    memset(&bwd->row_hook, 0, sizeof bwd->row_hook);
}

/* policy.h: the head's share of the workspace (gspo: its forward's or backward's, the larger). */
sph_status sph_policy_head_workspace(sph_ctx_t ctx, const sph_policy_plan *pp, size_t *bytes) {
    const sph_head_plan *hp = &pp->head;
    if (pp->coef.loss != SPH_PM_GSPO) return ctx->head.workspace(ctx, SPH_HEAD_FORWARD, hp, bytes);
    sph_head_plan f, b;
    sph_policy_gspo_plans(hp, &f, &b);
    size_t a = 0, c = 0;
    SPH_TRY(ctx->head.workspace(ctx, SPH_HEAD_FORWARD, &f, &a));
    if (hp->one_pass) SPH_TRY(ctx->head.workspace(ctx, SPH_HEAD_BACKWARD, &b, &c));
    *bytes = a > c ? a : c;
    return SPH_OK;
}
