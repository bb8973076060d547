/*
 * policy.c - the public entry points of the fused RL policy loss (sph_policy_loss_workspace_size,
 * sph_policy_loss): validation of the head's and the policy's argument blocks into a head plan
 * (a one-pass forward whose upstream gradients the loss defines) and a policy plan, then
 * one indirect call through the context's head table (core/backend.h: the policy slots, filled
 * by the reference, the CPU backend and CUDA).
 *
 * Every check runs before any output is written: the head's (sph_head_plan_make), the scalar
 * domains of the loss, the per-row tensors' shapes, dtypes and devices, the arguments each
 * loss / KL / aggregation needs, and, for host memory, the values of the per-row inputs on
 * the active rows (finite). The math is in spanhead.h and policy_math.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "policy/policy.h"

// ---- per-row tensors ---------------------------------------------------------------------

static sph_status check_device(sph_ctx_t ctx, const sph_view *v, const char *name) {
    if (ctx->device.type == SPH_DEVICE_CUDA) {
        SPH_CHECK(v->device.type == SPH_DEVICE_CUDA && v->device.id == ctx->device.id,
                  SPH_ERR_DEVICE,
                  "%s: device is (type %d, id %d), expected cuda:%d (the context's)", name,
                  (int)v->device.type, (int)v->device.id, (int)ctx->device.id);
    } else {
        SPH_CHECK(sph_device_is_host(v->device), SPH_ERR_DEVICE,
                  "%s: device is (type %d, id %d), expected host memory (cpu context)", name,
                  (int)v->device.type, (int)v->device.id);
    }
    return SPH_OK;
}

static sph_status row_tensor(sph_ctx_t ctx, const sph_tensor *t, const char *name, int64_t N,
                             sph_dtype want, void **out) {
    sph_view v;
    SPH_TRY(sph_view_of(t, name, 1, &v));
    SPH_TRY(check_device(ctx, &v, name));
    SPH_CHECK(sph_dtype_eq(v.dtype, want), SPH_ERR_DTYPE, "%s: dtype is %s, expected %s", name,
              sph_dtype_name(v.dtype), sph_dtype_name(want));
    SPH_TRY(sph_view_expect_dim(&v, name, 0, N, "N, rows of hidden"));
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

sph_status sph_policy_plan_make(sph_ctx_t ctx, const sph_head_args *head,
                                const sph_policy_args *pol, sph_policy_plan *pp) {
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
    SPH_CHECK(isfinite(pol->clip_low) && pol->clip_low >= 0 && pol->clip_low <= 1,
              SPH_ERR_INVALID_ARG, "clip_low: %g, expected a value in [0, 1]", pol->clip_low);
    SPH_CHECK(isfinite(pol->clip_high) && pol->clip_high >= 0, SPH_ERR_INVALID_ARG,
              "clip_high: %g, expected finite and >= 0", pol->clip_high);
    SPH_CHECK(!isnan(pol->clip_ratio_c) && pol->clip_ratio_c > 1, SPH_ERR_INVALID_ARG,
              "clip_ratio_c: %g, expected > 1 (INFINITY = no dual clip)", pol->clip_ratio_c);
    SPH_CHECK(isfinite(pol->kl_coef) && pol->kl_coef >= 0, SPH_ERR_INVALID_ARG,
              "kl_coef: %g, expected finite and >= 0", pol->kl_coef);
    SPH_CHECK(isfinite(pol->entropy_coef) && pol->entropy_coef >= 0, SPH_ERR_INVALID_ARG,
              "entropy_coef: %g, expected finite and >= 0", pol->entropy_coef);
    SPH_CHECK(pol->num_tokens >= 0, SPH_ERR_INVALID_ARG,
              "num_tokens: %lld, expected >= 1 (or 0 = count the active rows)",
              (long long)pol->num_tokens);
    SPH_CHECK(pol->num_seqs >= 0, SPH_ERR_INVALID_ARG,
              "num_seqs: %lld, expected >= 1 (or 0 = count the sequences)",
              (long long)pol->num_seqs);
    SPH_CHECK(isfinite(pol->norm_length) && pol->norm_length >= 0, SPH_ERR_INVALID_ARG,
              "norm_length: %g, expected finite and > 0", pol->norm_length);
    SPH_CHECK(pol->agg != SPH_AGG_SEQ_MEAN_TOKEN_SUM_NORM || pol->norm_length > 0,
              SPH_ERR_INVALID_ARG,
              "norm_length: %g, expected > 0 (seq-mean-token-sum-norm divides by it)",
              pol->norm_length);

    // the head's arguments: a forward whose upstream gradients the loss defines
    const char *up = head->dlogprob      ? "dlogprob"
                     : head->dentropy    ? "dentropy"
                     : head->dlse        ? "dlse"
                     : head->dlogit_mean ? "dlogit_mean"
                                         : NULL;
    SPH_CHECK(up == NULL, SPH_ERR_INVALID_ARG,
              "head.%s: given to sph_policy_loss, expected NULL (the policy loss defines the "
              "upstream gradients)", up ? up : "");
    SPH_CHECK(head->candidates == NULL, SPH_ERR_UNSUPPORTED,
              "head.candidates: sample support is not available with the policy loss");
    SPH_CHECK(head->targets != NULL, SPH_ERR_INVALID_ARG,
              "head.targets: NULL, expected the (N) target ids (the loss needs logprob)");
    sph_head_args ha = *head;
    /* stats are optional here: a stand-in passes validation and the workspace holds them */
    int64_t st_shape[2] = {0, 3};
    sph_tensor st_stub = {(void *)&st_shape[0], ctx->device, 2, SPH_F32, st_shape, NULL, 0};
    if (!head->stats && head->hidden && head->hidden->ndim >= 1 && head->hidden->shape) {
        st_shape[0] = head->hidden->shape[0];
        ha.stats = &st_stub;
    }
    /* the generic checks now; the backend's (device pointers) once its buffers are bound */
    SPH_TRY(sph_head_plan_fill(ctx, SPH_HEAD_FORWARD, &ha, hp));
    if (ha.stats == &st_stub) hp->stats = NULL; /* bound to the workspace by the backend */
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
    SPH_TRY(row_tensor(ctx, pol->advantages, "advantages", N, SPH_F32, &d));
    pp->adv = d;
    SPH_CHECK(pol->old_logprob != NULL, SPH_ERR_INVALID_ARG,
              "old_logprob: NULL, expected an f32 (N) tensor");
    SPH_TRY(row_tensor(ctx, pol->old_logprob, "old_logprob", N, SPH_F32, &d));
    pp->old = d;
    if (pol->kl != SPH_KL_NONE) {
        SPH_CHECK(pol->ref_logprob != NULL, SPH_ERR_INVALID_ARG,
                  "ref_logprob: NULL, but kl is k%d (the KL term needs the reference "
                  "log-probs)", (int)pol->kl);
        SPH_TRY(row_tensor(ctx, pol->ref_logprob, "ref_logprob", N, SPH_F32, &d));
        pp->ref = d;
    }
    if (pol->is_weight) {
        SPH_TRY(row_tensor(ctx, pol->is_weight, "is_weight", N, SPH_F32, &d));
        pp->isw = d;
    }
    if (pp->need_seq) {
        SPH_CHECK(pol->seq_id != NULL, SPH_ERR_INVALID_ARG,
                  "seq_id: NULL, but %s needs the sequence of every row (an i64 (N) tensor)",
                  pol->loss == SPH_PG_GSPO ? "gspo" : agg_name(pp->agg));
    }
    if (pol->seq_id) {
        SPH_TRY(row_tensor(ctx, pol->seq_id, "seq_id", N, SPH_I64, &d));
        if (pp->need_seq) pp->seq = d;
    }
    SPH_CHECK(pol->metrics != NULL, SPH_ERR_INVALID_ARG,
              "metrics: NULL, expected an f32 (%d) tensor", (int)SPH_POLICY_N_METRICS);
    {
        sph_view v;
        SPH_TRY(sph_view_of(pol->metrics, "metrics", 1, &v));
        SPH_TRY(check_device(ctx, &v, "metrics"));
        SPH_CHECK(sph_dtype_eq(v.dtype, SPH_F32), SPH_ERR_DTYPE,
                  "metrics: dtype is %s, expected f32", sph_dtype_name(v.dtype));
        SPH_TRY(sph_view_expect_dim(&v, "metrics", 0, SPH_POLICY_N_METRICS,
                                    "SPH_POLICY_N_METRICS"));
        pp->metrics = v.data;
    }

    // the sequence group
    pp->group = 1;
    if (pol->seq_comm) {
        sph_comm_t c = pol->seq_comm;
        SPH_CHECK(c->ops != NULL && c->size >= 1 && c->rank >= 0 && c->rank < c->size,
                  SPH_ERR_INVALID_ARG, "seq_comm: not an initialised communicator");
        const int host = ctx->device.type != SPH_DEVICE_CUDA;
        if (c->size > 1)
            SPH_CHECK((c->device_buffers != 0) == !host, SPH_ERR_DEVICE,
                      "seq_comm: collectives take %s buffers, the context computes on the %s",
                      c->device_buffers ? "device" : "host", host ? "host" : "device");
        pp->seq_comm = c;
        pp->group = c->size;
        pp->rank = c->rank;
        SPH_CHECK(N <= INT64_MAX / (c->size > 0 ? c->size : 1) / 16, SPH_ERR_OVERFLOW,
                  "seq_comm: %lld ranks x %lld rows overflow", (long long)c->size,
                  (long long)N);
    }

    // values of host data
    if (ctx->dev->host_memory) SPH_TRY(check_values(hp, pp));
    return SPH_OK;
}

// ---- dispatch through the context's table ---------------------------------------------------

static sph_status workspace_of(sph_ctx_t ctx, const sph_policy_plan *pp, size_t *bytes) {
    *bytes = 0;
    if (!ctx->head.policy_workspace || !ctx->head.policy)
        return sph_backend_missing(ctx, "policy loss");
    return ctx->head.policy_workspace(ctx, pp, bytes);
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
                                  size_t workspace_bytes) {
    size_t need = 0;
    SPH_TRY(workspace_of(ctx, pp, &need));
    SPH_CHECK(workspace_bytes >= need, SPH_ERR_WORKSPACE,
              "workspace_bytes: %zu, expected >= %zu (sph_policy_loss_workspace_size)",
              workspace_bytes, need);
    SPH_CHECK(need == 0 || workspace != NULL, SPH_ERR_WORKSPACE,
              "workspace: NULL, expected %zu bytes (sph_policy_loss_workspace_size)", need);
    if (need > 0 && ctx->head.check_workspace)
        SPH_TRY(ctx->head.check_workspace(ctx, workspace, need));
    return SPH_OK;
}

// ---- the TP group agrees on the call ------------------------------------------------------

/* The policy's part of the tensor-parallel consistency check (the head's part is
 * sph_head_tp_agree): every rank of a host TP group allgathers a record of the loss's scalars
 * and hashes of its per-row host arrays, and all compare, before any output is written.
 * Different advantages on two ranks would give each its own gradients (and a wrong sum of
 * dhidden) with SPH_OK. Device groups: the caller's duty (spanhead.h, "Policies"). */
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

static uint64_t fnv(uint64_t h, const void *data, size_t n) {
    const unsigned char *b = data;
    for (size_t k = 0; k < n; k++) h = (h ^ b[k]) * UINT64_C(0x100000001b3);
    return h;
}

static int64_t bits_of(double x) {
    int64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static sph_status policy_tp_agree(sph_ctx_t ctx, const sph_policy_plan *pp, sph_status local) {
    sph_comm_t comm = ctx->tp_comm;
    if (!comm || !comm->ops || comm->size <= 1 || comm->rank < 0 || comm->rank >= comm->size ||
        comm->device_buffers)
        return local;
    int64_t mine[PR_WORDS] = {0}, *all = sph_malloc((size_t)comm->size * sizeof mine);
    if (local == SPH_OK) {
        const sph_policy_coef *k = &pp->coef;
        mine[PR_TAG] = PR_VALID, mine[PR_LOSS] = k->loss, mine[PR_KL] = k->kl;
        mine[PR_AGG] = pp->agg, mine[PR_LO] = bits_of(k->lo), mine[PR_HI] = bits_of(k->hi);
        mine[PR_C] = bits_of(k->clip_c), mine[PR_BETA] = bits_of(k->beta);
        mine[PR_ETA] = bits_of(k->eta), mine[PR_TOKENS] = pp->num_tokens;
        mine[PR_SEQS] = pp->num_seqs, mine[PR_NORM] = bits_of(pp->norm_length);
        mine[PR_FLAGS] = (pp->ref != NULL) | (pp->isw != NULL) << 1 | (pp->seq != NULL) << 2 |
                         pp->group << 3;
        const size_t n = (size_t)pp->N;
        uint64_t h = UINT64_C(0xcbf29ce484222325);
        h = fnv(h, pp->adv, n * 4), h = fnv(h, pp->old, n * 4);
        if (pp->ref) h = fnv(h, pp->ref, n * 4);
        if (pp->isw) h = fnv(h, pp->isw, n * 4);
        if (pp->seq) h = fnv(h, pp->seq, n * 8);
        mine[PR_ROWS] = (int64_t)h;
    }
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", sph_last_error());
    if (!all) /* cannot join: fail here, the others fail in their collective */
        return local != SPH_OK ? local
                               : sph_err(SPH_ERR_ALLOC, "tp_comm: no host memory for the policy "
                                                        "loss's consistency records");
    sph_status s = comm->ops->allgather(comm, mine, all, sizeof mine, NULL);
    sph_status verdict = SPH_OK;
    if (s != SPH_OK)
        verdict = sph_err_prefix(s, "policy: tensor-parallel consistency check: ");
    for (int64_t r = 0; r < comm->size && s == SPH_OK && verdict == SPH_OK; r++)
        if (all[r * PR_WORDS + PR_TAG] != PR_VALID)
            verdict = sph_err(SPH_ERR_INVALID_ARG,
                              "tp_comm: rank %lld of the group refused its policy-loss call "
                              "(see that rank's message); every rank fails with it",
                              (long long)r);
    for (int64_t r = 1; r < comm->size && s == SPH_OK && verdict == SPH_OK; r++)
        for (int f = 0; f < PR_WORDS && verdict == SPH_OK; f++)
            if (all[f] != all[r * PR_WORDS + f])
                verdict = sph_err(SPH_ERR_MISMATCH,
                                  "tp_comm: rank %lld's policy loss differs from rank 0's in "
                                  "%s (0x%llx, 0x%llx): every rank of the group must make the "
                                  "same call",
                                  (long long)r, g_pr_field[f],
                                  (unsigned long long)all[r * PR_WORDS + f],
                                  (unsigned long long)all[f]);
    sph_free(all);
    if (local != SPH_OK) return sph_err(local, "%s", saved);
    return verdict;
}

sph_status sph_policy_loss(sph_ctx_t ctx, const sph_head_args *head,
                           const sph_policy_args *policy, void *workspace,
                           size_t workspace_bytes) {
    sph_policy_plan pp;
    sph_status s = sph_policy_plan_make(ctx, head, policy, &pp);
    if (s == SPH_OK) s = check_workspace(ctx, &pp, workspace, workspace_bytes);
    /* a TP group agrees on the call (or on one rank's failure) before any output is written:
     * the head's part, then the loss's */
    if (ctx && ctx->magic == SPH_CTX_MAGIC) {
        s = sph_head_tp_agree(ctx, SPH_HEAD_FORWARD, s == SPH_OK ? &pp.head : NULL, s);
        s = policy_tp_agree(ctx, &pp, s);
    }
    SPH_TRY(s);
    return ctx->head.policy(ctx, &pp, workspace, workspace_bytes);
}

/* policy.h: gspo's forward plan (no gradients, no hook) and its backward plan. */
void sph_policy_gspo_plans(const sph_head_plan *hp, sph_head_plan *fwd, sph_head_plan *bwd) {
    *fwd = *hp;
    fwd->dhidden = fwd->dweight = NULL;
    fwd->one_pass = 0;
    fwd->policy = NULL;
    fwd->dlogprob = fwd->dentropy = NULL;
    fwd->allreduce_dh = 0;
    *bwd = *hp;
    bwd->one_pass = 0;
    bwd->policy = NULL;
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
