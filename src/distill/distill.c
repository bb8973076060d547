/*
 * distill.c - the public entry points of the fused distillation losses
 * (sph_distill_loss_workspace_size, sph_distill_loss): validation of the head's and the
 * loss's argument blocks into a plan, the TP group's agreement, then the backend of the
 * context's device: the reference and the CPU from this folder's table, a device's from its
 * device table (loss_backend("distill"): src/cuda/distill.cu).
 *
 * Every check runs before any output is written: the head's (sph_head_plan_validate, with
 * every region registered in one validator with the loss's tensors and the workspace), the
 * loss's scalars, the teacher's shapes, dtypes and devices, and, for host memory, the values
 * of the teacher's top-k and of dloss on the active rows.
 */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "distill/distill.h"

// ---- validation --------------------------------------------------------------------------

/* The head's fields the loss does not take: each refused by name. */
static sph_status refuse_head_fields(const sph_head_args *a) {
#define HAS(f) (a->struct_size >= offsetof(sph_head_args, f) + sizeof a->f && a->f)
    const char *n = a->targets        ? "targets"
                    : a->candidates   ? "candidates"
                    : a->logprob      ? "logprob"
                    : a->entropy      ? "entropy"
                    : a->lse          ? "lse"
                    : a->logit_mean   ? "logit_mean"
                    : a->stats        ? "stats"
                    : a->dlogprob     ? "dlogprob"
                    : a->dentropy     ? "dentropy"
                    : a->dlse         ? "dlse"
                    : a->dlogit_mean  ? "dlogit_mean"
                    : HAS(sum_p2)     ? "sum_p2"
                    : HAS(topk_ids)   ? "topk_ids"
                    : HAS(topk_logprobs) ? "topk_logprobs"
                                         : NULL;
#undef HAS
    SPH_CHECK(n == NULL, SPH_ERR_INVALID_ARG,
              "head.%s: given to sph_distill_loss, expected NULL (the distillation loss takes "
              "hidden, weight, the mask / spans, the shard, temperature, softcap and the "
              "gradient outputs)", n ? n : "");
    return SPH_OK;
}

static sph_status scalars(const sph_distill_args *d, sph_distill_plan *dp) {
    SPH_CHECK(d->kind == SPH_DISTILL_FORWARD_KL || d->kind == SPH_DISTILL_REVERSE_KL ||
                  d->kind == SPH_DISTILL_JSD, SPH_ERR_INVALID_ARG,
              "distill.kind: %d, expected SPH_DISTILL_FORWARD_KL (0), _REVERSE_KL (1) or "
              "_JSD (2)", (int)d->kind);
    SPH_CHECK(d->reduction == SPH_REDUCTION_MEAN || d->reduction == SPH_REDUCTION_SUM ||
                  d->reduction == SPH_REDUCTION_NONE, SPH_ERR_INVALID_ARG,
              "distill.reduction: %d, expected SPH_REDUCTION_MEAN (0), _SUM (1) or _NONE (2)",
              (int)d->reduction);
    if (d->kind == SPH_DISTILL_JSD)
        SPH_CHECK(d->beta >= 0 && d->beta <= 1, SPH_ERR_INVALID_ARG,
                  "distill.beta: %g, expected in [0, 1] for jsd", d->beta);
    dp->kind = sph_distill_kind_of((int)d->kind, d->beta);
    dp->beta = d->kind == SPH_DISTILL_JSD ? d->beta : 0.0;
    dp->reduction = (int)d->reduction;
    SPH_CHECK(d->teacher_temperature == 0 || isfinite(d->teacher_temperature),
              SPH_ERR_INVALID_ARG, "distill.teacher_temperature: %g, expected > 0 and finite "
              "(or 0 = the student's temperature)", d->teacher_temperature);
    if (d->teacher_temperature != 0)
        SPH_TRY(sph_check_float_scalar("distill.teacher_temperature", d->teacher_temperature, 0,
                                       1));
    dp->t_teacher = d->teacher_temperature; /* 0: the student's, row by row */
    return SPH_OK;
}

static sph_status teacher(sph_validator *val, const sph_distill_args *d, sph_distill_plan *dp) {
    const sph_head_plan *hp = &dp->head;
    const int dense = d->teacher_hidden || d->teacher_weight;
    const int sparse = d->teacher_topk_ids || d->teacher_topk_logprobs;
    SPH_CHECK(dense || sparse, SPH_ERR_INVALID_ARG,
              "teacher: none given, expected teacher_hidden + teacher_weight (dense) or "
              "teacher_topk_ids + teacher_topk_logprobs (sparse)");
    SPH_CHECK(!(dense && sparse), SPH_ERR_INVALID_ARG,
              "teacher: both a dense (teacher_hidden / teacher_weight) and a sparse "
              "(teacher_topk_ids / teacher_topk_logprobs) teacher given, expected one");
    dp->dense = dense;
    sph_view v, w;
    if (dense) {
        SPH_CHECK(d->teacher_hidden && d->teacher_weight, SPH_ERR_INVALID_ARG,
                  "%s: NULL, the dense teacher needs teacher_hidden (N, H_T) and "
                  "teacher_weight (V_loc, H_T)",
                  d->teacher_hidden ? "teacher_weight" : "teacher_hidden");
        SPH_TRY(sph_val_tensor(val, d->teacher_hidden, "teacher_hidden", 2, SPH_VAL_IN,
                               SPH_DT_FLOAT_IN, &v));
        SPH_TRY(sph_val_tensor(val, d->teacher_weight, "teacher_weight", 2, SPH_VAL_IN, 0, &w));
        SPH_TRY(sph_val_dtype("teacher_weight", w.dtype, sph_dtype_bit(v.dtype),
                              "teacher_hidden's"));
        SPH_TRY(sph_view_expect_dim(&v, "teacher_hidden", 0, hp->N, "N, rows of hidden"));
        SPH_CHECK(v.shape[1] >= 1, SPH_ERR_SHAPE,
                  "teacher_hidden: shape[1] (H_T) is 0, expected >= 1");
        SPH_TRY(sph_view_expect_dim(&w, "teacher_weight", 0, hp->V_loc,
                                    "V_loc, rows of weight (the student's vocabulary shard)"));
        SPH_TRY(sph_view_expect_dim(&w, "teacher_weight", 1, v.shape[1],
                                    "H_T, columns of teacher_hidden"));
        dp->th = v.data, dp->ld_th = v.stride[0], dp->HT = v.shape[1], dp->tdtype = v.dtype;
        dp->tw = w.data, dp->ld_tw = w.stride[0];
        return SPH_OK;
    }
    SPH_CHECK(d->teacher_topk_ids && d->teacher_topk_logprobs, SPH_ERR_INVALID_ARG,
              "%s: NULL, the sparse teacher needs teacher_topk_ids (N, K) and "
              "teacher_topk_logprobs (N, K)",
              d->teacher_topk_ids ? "teacher_topk_logprobs" : "teacher_topk_ids");
    SPH_TRY(sph_val_tensor(val, d->teacher_topk_ids, "teacher_topk_ids", 2, SPH_VAL_IN,
                           SPH_DT_IDS, &v));
    SPH_TRY(sph_val_tensor(val, d->teacher_topk_logprobs, "teacher_topk_logprobs", 2,
                           SPH_VAL_IN, SPH_DT_F32, &w));
    SPH_TRY(sph_view_expect_dim(&v, "teacher_topk_ids", 0, hp->N, "N, rows of hidden"));
    SPH_CHECK(v.shape[1] >= 1, SPH_ERR_SHAPE, "teacher_topk_ids: shape[1] (K) is 0, expected >= 1");
    SPH_TRY(sph_view_expect_dim(&w, "teacher_topk_logprobs", 0, hp->N, "N, rows of hidden"));
    SPH_TRY(sph_view_expect_dim(&w, "teacher_topk_logprobs", 1, v.shape[1],
                                "K, columns of teacher_topk_ids"));
    dp->ids = v.data, dp->ids_i64 = v.dtype.bits == 64, dp->ld_ids = v.stride[0];
    dp->K = v.shape[1];
    dp->tlp = w.data, dp->ld_tlp = w.stride[0];
    return SPH_OK;
}

/* The teacher's temperature beyond the scalar (scalars()): the appended per-row field, read
 * when struct_size covers it; the dense teacher's only (a sparse teacher's log-probs are used
 * as given, so a temperature there would be silently ignored: refused). */
static sph_status teacher_temps(sph_validator *val, const sph_distill_args *d,
                                sph_distill_plan *dp) {
    const int rows = d->struct_size >= offsetof(sph_distill_args, teacher_temperature_rows) +
                                           sizeof d->teacher_temperature_rows &&
                     d->teacher_temperature_rows;
    if (!dp->dense) {
        SPH_CHECK(!rows && d->teacher_temperature == 0, SPH_ERR_INVALID_ARG,
                  "%s: given with a sparse teacher (teacher_topk_ids / teacher_topk_logprobs), "
                  "expected %s: the sparse teacher's log-probs are used as given",
                  rows ? "teacher_temperature_rows" : "teacher_temperature",
                  rows ? "NULL" : "0 (unset)");
        return SPH_OK;
    }
    if (!rows) return SPH_OK;
    SPH_CHECK(d->teacher_temperature == 0, SPH_ERR_INVALID_ARG,
              "teacher_temperature: %g given together with teacher_temperature_rows, expected "
              "0 (the per-row values replace it)", d->teacher_temperature);
    sph_view v;
    SPH_TRY(sph_val_rows(val, d->teacher_temperature_rows, "teacher_temperature_rows", dp->N,
                         SPH_VAL_IN, SPH_DT_F32, &v));
    dp->tt_rows = (const float *)v.data;
    return SPH_OK;
}

static sph_status plan_validate(sph_ctx_t ctx, const sph_head_args *head,
                                const sph_distill_args *d, sph_distill_plan *dp,
                                sph_validator *val) {
    SPH_TRY(sph_ctx_check(ctx, "distill_loss"));
    SPH_CHECK(head != NULL, SPH_ERR_INVALID_ARG, "head: NULL");
    SPH_CHECK(d != NULL, SPH_ERR_INVALID_ARG, "distill: NULL");
    SPH_CHECK(head->struct_size >= offsetof(sph_head_args, sum_p2), SPH_ERR_INVALID_ARG,
              "head.struct_size: %zu, expected %zu (use SPH_HEAD_ARGS_INIT)", head->struct_size,
              sizeof(sph_head_args));
    /* the layout before the appended teacher_temperature_rows is accepted */
    SPH_CHECK(d->struct_size >= offsetof(sph_distill_args, teacher_temperature_rows),
              SPH_ERR_INVALID_ARG,
              "distill.struct_size: %zu, expected %zu (use SPH_DISTILL_ARGS_INIT)",
              d->struct_size, sizeof(sph_distill_args));
    memset(dp, 0, sizeof *dp);
    SPH_TRY(refuse_head_fields(head));
    sph_head_plan *hp = &dp->head;
    SPH_TRY(sph_head_plan_validate(ctx, SPH_HEAD_FORWARD, head, hp, val,
                                   SPH_PLAN_STATS_OPTIONAL));
    dp->N = hp->N;
    const int64_t tp = hp->comm ? hp->comm->size : 1;
    SPH_CHECK(hp->V == hp->V_loc || tp > 1, SPH_ERR_INVALID_ARG,
              "vocab_total: %lld with a shard of %lld rows but no tensor-parallel group "
              "(tp_comm of size > 1): a shard alone is not the distribution to distill",
              (long long)hp->V, (long long)hp->V_loc);
    SPH_TRY(scalars(d, dp));
    SPH_TRY(teacher(val, d, dp));
    SPH_TRY(teacher_temps(val, d, dp));
    if (d->dloss) {
        SPH_CHECK(d->reduction == SPH_REDUCTION_NONE, SPH_ERR_INVALID_ARG,
                  "dloss: given with reduction %s, expected NULL (dloss is the upstream "
                  "gradient of reduction none's per-row losses)",
                  d->reduction == SPH_REDUCTION_MEAN ? "mean (0)" : "sum (1)");
        sph_view v;
        SPH_TRY(sph_val_rows(val, d->dloss, "dloss", hp->N, SPH_VAL_IN, SPH_DT_F32, &v));
        dp->dloss = v.data;
    }
    SPH_CHECK(d->loss != NULL, SPH_ERR_INVALID_ARG, "loss: NULL, expected an f32 %s tensor",
              d->reduction == SPH_REDUCTION_NONE ? "(N)" : "(1)");
    sph_view lv;
    SPH_TRY(sph_val_tensor(val, d->loss, "loss", 1, SPH_VAL_OUT, SPH_DT_F32, &lv));
    if (d->reduction == SPH_REDUCTION_NONE)
        SPH_TRY(sph_view_expect_dim(&lv, "loss", 0, hp->N, "N, reduction none"));
    else
        SPH_TRY(sph_view_expect_dim(&lv, "loss", 0, 1, "1, reduction mean / sum"));
    dp->loss = lv.data;
    SPH_CHECK(d->num_tokens >= 0, SPH_ERR_INVALID_ARG,
              "distill.num_tokens: %lld, expected >= 1 (or 0 = count the active rows)",
              (long long)d->num_tokens);
    dp->num_tokens = d->num_tokens;
    if (d->seq_comm) {
        SPH_TRY(sph_comm_validate(ctx, d->seq_comm, "distill.seq_comm"));
        dp->seq_comm = d->seq_comm;
    }
    return SPH_OK;
}

/* Host data: the teacher's per-row temperatures (every row, as the head's temperature_rows),
 * the top-k ids and log-probs, dloss, on the active rows. */
static sph_status check_values(const sph_distill_plan *dp) {
    const sph_head_plan *hp = &dp->head;
    SPH_TRY(sph_check_temperature_rows("teacher_temperature_rows", dp->tt_rows, hp->N));
    if (hp->N == 0 || (dp->dense && !dp->dloss)) return SPH_OK;
    uint8_t *act = sph_malloc((size_t)hp->N);
    int64_t *row = dp->dense ? NULL : sph_malloc((size_t)dp->K * sizeof *row);
    if (!act || (!dp->dense && !row)) {
        sph_free(act), sph_free(row);
        return sph_err(SPH_ERR_ALLOC, "distill: out of host memory (N = %lld)", (long long)hp->N);
    }
    sph_head_active_rows(hp, act);
    sph_status st = SPH_OK;
    for (int64_t i = 0; i < hp->N && st == SPH_OK; i++) {
        if (!act[i]) continue;
        if (dp->dloss && !isfinite(dp->dloss[i])) {
            st = sph_err(SPH_ERR_INVALID_ARG, "dloss[%lld]: %g on an active row, expected a "
                         "finite value", (long long)i, (double)dp->dloss[i]);
            break;
        }
        if (dp->dense) continue;
        int64_t n = 0;
        double mass = 0;
        for (int64_t k = 0; k < dp->K && st == SPH_OK; k++) {
            const int64_t id = dp->ids_i64 ? ((const int64_t *)dp->ids)[i * dp->ld_ids + k]
                                           : ((const int32_t *)dp->ids)[i * dp->ld_ids + k];
            const float lp = dp->tlp[i * dp->ld_tlp + k];
            if (id == -1) continue;
            if (id < 0 || id >= hp->V) {
                st = sph_err(SPH_ERR_INVALID_ARG, "teacher_topk_ids[%lld, %lld]: %lld, "
                             "expected in [0, vocab_total = %lld) or -1 (padding)",
                             (long long)i, (long long)k, (long long)id, (long long)hp->V);
                break;
            }
            if (!isfinite(lp) || lp > SPH_DISTILL_MASS_TOL) {
                st = sph_err(SPH_ERR_INVALID_ARG, "teacher_topk_logprobs[%lld, %lld]: %g, "
                             "expected a finite log-probability <= 0 (up to %g of rounding)",
                             (long long)i, (long long)k, (double)lp, SPH_DISTILL_MASS_TOL);
                break;
            }
            for (int64_t q = 0; q < n; q++)
                if (row[q] == id) {
                    st = sph_err(SPH_ERR_INVALID_ARG, "teacher_topk_ids[%lld, :]: id %lld "
                                 "appears twice", (long long)i, (long long)id);
                    break;
                }
            row[n++] = id;
            mass += exp((double)lp);
        }
        if (st == SPH_OK && mass > 1 + SPH_DISTILL_MASS_TOL)
            st = sph_err(SPH_ERR_INVALID_ARG, "teacher_topk_logprobs[%lld, :]: the listed "
                         "probabilities sum to %.9g, expected <= 1 (up to %g of rounding)",
                         (long long)i, mass, SPH_DISTILL_MASS_TOL);
    }
    sph_free(act), sph_free(row);
    return st;
}

// ---- the backends' table ------------------------------------------------------------------

static sph_status ref_workspace(sph_ctx_t ctx, const sph_distill_plan *dp, size_t *bytes) {
    (void)ctx, (void)dp;
    *bytes = 0;
    return SPH_OK;
}

static sph_status ref_run(sph_ctx_t ctx, const sph_distill_plan *dp, void *ws, size_t bytes) {
    (void)ws, (void)bytes;
    return sph_distill_ref_run(ctx, dp);
}


static const sph_distill_backend distill_ref_backend = {"ref", ref_workspace, ref_run};
static const sph_distill_backend distill_cpu_backend = {"cpu", sph_distill_cpu_workspace,
                                                        sph_distill_cpu_run};

/* By device: host memory runs the CPU backend (the reference when forced), a device the
 * backend its table hands out (loss_backend("distill"): src/cuda/distill.cu, through
 * src/cuda/runtime.cu), so that this folder names no device code. NULL: none (the entry
 * points answer SPH_ERR_UNSUPPORTED). */
static const sph_distill_backend *backend_of(sph_ctx_t ctx) {
    if (ctx->dev->host_memory)
        return ctx->use_ref ? &distill_ref_backend : &distill_cpu_backend;
    return ctx->dev->loss_backend
               ? (const sph_distill_backend *)ctx->dev->loss_backend("distill")
               : NULL;
}

static sph_status check_data(sph_ctx_t ctx, const sph_distill_plan *dp) {
    if (!ctx->dev->host_memory) return SPH_OK;
    SPH_TRY(sph_head_plan_check_data(&dp->head));
    return check_values(dp);
}

/* Host contexts, before anything is written: NaN / inf in an active row of hidden (or of the
 * dense teacher's hidden) makes that row's statistics non-finite, which the sweep would find
 * only at the row's chunk, after the dhidden rows of the earlier chunks were written. So such
 * rows are refused here (N_active (H + H_T) reads, next to the sweep's 6 N_active H V flops).
 * A non-finite weight needs no scan: every active row's statistics show it in the first
 * chunk, before any write. What remains for the sweep: finite inputs whose logits overflow
 * float (|h . w| / T beyond FLT_MAX), documented. */
static sph_status check_finite_rows(sph_ctx_t ctx, const sph_distill_plan *dp) {
    const sph_head_plan *hp = &dp->head;
    if (!ctx->dev->host_memory || hp->N == 0) return SPH_OK;
    uint8_t *act = sph_malloc((size_t)hp->N);
    if (!act) return sph_err(SPH_ERR_ALLOC, "distill: out of host memory (N = %lld)", (long long)hp->N);
    sph_head_active_rows(hp, act);
    const size_t es = (size_t)hp->dtype.bits / 8, tes = dp->dense ? (size_t)dp->tdtype.bits / 8 : 0;
    int64_t bad = 0, first = -1, first_t = -1;
    for (int64_t i = 0; i < hp->N; i++) {
        if (!act[i]) continue;
        const char *h = (const char *)hp->hidden + (size_t)(i * hp->ld_h) * es;
        const int b = sph_row_has_nonfinite(h, hp->dtype, hp->H);
        const int bt = dp->dense && sph_row_has_nonfinite((const char *)dp->th +
                                                              (size_t)(i * dp->ld_th) * tes,
                                                          dp->tdtype, dp->HT);
        if (b || bt) {
            if (first < 0) first = i, first_t = bt && !b;
            bad++;
        }
    }
    sph_free(act);
    if (!bad) return SPH_OK;
    sph_ctx_note_nonfinite(ctx, bad, first);
    return sph_err(SPH_ERR_NONFINITE,
                   "distill: %lld active rows with non-finite inputs (NaN or inf), the first "
                   "row %lld (in %s[%lld, :]); nothing written", (long long)bad, (long long)first,
                   first_t ? "teacher_hidden" : "hidden", (long long)first);
}

static sph_status plan_make(sph_ctx_t ctx, const sph_head_args *head, const sph_distill_args *d,
                            sph_distill_plan *dp) {
    sph_validator val;
    sph_val_init(&val, ctx);
    SPH_TRY(plan_validate(ctx, head, d, dp, &val));
    SPH_TRY(sph_val_finish(&val));
    return check_data(ctx, dp);
}

sph_status sph_distill_loss_workspace_size(sph_ctx_t ctx, const sph_head_args *head,
                                           const sph_distill_args *distill, size_t *bytes) {
    SPH_CHECK(bytes != NULL, SPH_ERR_INVALID_ARG, "bytes: NULL");
    *bytes = 0;
    sph_distill_plan dp;
    SPH_TRY(plan_make(ctx, head, distill, &dp));
    const sph_distill_backend *be = backend_of(ctx);
    if (!be) return sph_backend_missing(ctx, "distillation loss");
    return be->workspace(ctx, &dp, bytes);
}

// ---- the TP group agrees on the call ------------------------------------------------------

enum { DR_TAG, DR_KIND, DR_BETA, DR_TT, DR_RED, DR_DENSE, DR_HT, DR_K, DR_TOKENS, DR_ROWS,
       DR_WORDS };
static const char *const g_dr_field[DR_WORDS] = {
    "validation", "kind", "beta", "teacher_temperature (0: the student's)", "reduction",
    "teacher (dense or sparse, dloss given, seq_comm given, teacher_temperature_rows given)",
    "H_T", "K", "num_tokens",
    "per-row inputs (teacher_topk_ids, teacher_topk_logprobs, dloss, "
    "teacher_temperature_rows)"};
#define DR_VALID INT64_C(0x3130545349445053) /* "SPDIST01" */

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

static sph_status distill_tp_agree(sph_ctx_t ctx, const sph_distill_plan *dp, sph_status local) {
    sph_comm_t comm = ctx->tp_comm;
    if (!comm || !comm->ops || comm->size <= 1 || comm->rank < 0 || comm->rank >= comm->size ||
        comm->device_buffers)
        return local;
    int64_t mine[DR_WORDS] = {0}, *all = sph_malloc((size_t)comm->size * sizeof mine);
    if (local == SPH_OK) {
        mine[DR_TAG] = DR_VALID, mine[DR_KIND] = dp->kind, mine[DR_BETA] = bits_of(dp->beta);
        mine[DR_TT] = bits_of(dp->t_teacher), mine[DR_RED] = dp->reduction;
        mine[DR_DENSE] = dp->dense | (dp->dloss != NULL) << 1 | (dp->seq_comm != NULL) << 2 |
                         (dp->tt_rows != NULL) << 3;
        mine[DR_HT] = dp->HT, mine[DR_K] = dp->K, mine[DR_TOKENS] = dp->num_tokens;
        uint64_t h = UINT64_C(0xcbf29ce484222325);
        for (int64_t i = 0; !dp->dense && i < dp->N; i++) {
            h = fnv(h, (const char *)dp->ids + (size_t)(i * dp->ld_ids) * (dp->ids_i64 ? 8 : 4),
                    (size_t)dp->K * (dp->ids_i64 ? 8 : 4));
            h = fnv(h, dp->tlp + i * dp->ld_tlp, (size_t)dp->K * 4);
        }
        if (dp->dloss) h = fnv(h, dp->dloss, (size_t)dp->N * 4);
        if (dp->tt_rows) h = fnv(h, dp->tt_rows, (size_t)dp->N * 4);
        mine[DR_ROWS] = (int64_t)h;
    }
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", sph_last_error());
    if (!all)
        return local != SPH_OK ? local
                               : sph_err(SPH_ERR_ALLOC, "tp_comm: no host memory for the "
                                                        "distillation loss's records");
    sph_status s = comm->ops->allgather(comm, mine, all, sizeof mine, NULL);
    sph_status verdict = SPH_OK;
    if (s != SPH_OK) verdict = sph_err_prefix(s, "distill: tensor-parallel consistency check: ");
    for (int64_t r = 0; r < comm->size && s == SPH_OK && verdict == SPH_OK; r++)
        if (all[r * DR_WORDS + DR_TAG] != DR_VALID)
            verdict = sph_err(SPH_ERR_INVALID_ARG,
                              "tp_comm: rank %lld of the group refused its distillation call "
                              "(see that rank's message); every rank fails with it",
                              (long long)r);
    for (int64_t r = 1; r < comm->size && s == SPH_OK && verdict == SPH_OK; r++)
        for (int f = 0; f < DR_WORDS && verdict == SPH_OK; f++)
            if (all[f] != all[r * DR_WORDS + f])
                verdict = sph_err(SPH_ERR_MISMATCH,
                                  "tp_comm: rank %lld's distillation loss differs from rank "
                                  "0's in %s (0x%llx, 0x%llx): every rank of the group must "
                                  "make the same call", (long long)r, g_dr_field[f],
                                  (unsigned long long)all[r * DR_WORDS + f],
                                  (unsigned long long)all[f]);
    sph_free(all);
    if (local != SPH_OK) return sph_err(local, "%s", saved);
    return verdict;
}

// ---- reduction mean's divisor over the seq_comm group ---------------------------------------

enum { DG_TAG, DG_RED, DG_TOKENS, DG_COUNT, DG_WORDS };
#define DG_VALID INT64_C(0x3130514553445053) /* "SPDSEQ01" */

/* Host contexts: dp->n_mean, the divisor of reduction mean: num_tokens, or the active rows of
 * this call, or with a host seq_comm of every rank of the group (one allgather of
 * (validity, reduction, num_tokens, rows counted), entered by every rank whose call names
 * the group, even one that failed, so that the group fails together). A CUDA context counts
 * on the device (src/cuda/distill.cu). */
static sph_status distill_seq_count(sph_ctx_t ctx, const sph_distill_args *d,
                                    sph_distill_plan *dp, sph_status local) {
    if (!ctx->dev->host_memory) return local;
    if (local == SPH_OK)
        dp->n_mean = dp->num_tokens > 0 ? dp->num_tokens : sph_head_count_active(&dp->head);
    sph_comm_t c = d && d->struct_size >= offsetof(sph_distill_args, teacher_temperature_rows)
                       ? d->seq_comm
                       : NULL;
    if (!c || !c->ops || c->size <= 1 || c->rank < 0 || c->rank >= c->size || c->device_buffers)
        return local;
    int64_t mine[DG_WORDS] = {0}, *all = sph_malloc((size_t)c->size * sizeof mine);
    if (local == SPH_OK) {
        mine[DG_TAG] = DG_VALID, mine[DG_RED] = dp->reduction, mine[DG_TOKENS] = dp->num_tokens;
        mine[DG_COUNT] = sph_head_count_active(&dp->head);
    }
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", sph_last_error());
    if (!all)
        return local != SPH_OK ? local
                               : sph_err(SPH_ERR_ALLOC, "distill.seq_comm: no host memory for "
                                                        "the group's records");
    sph_status s = c->ops->allgather(c, mine, all, sizeof mine, NULL);
    sph_status verdict = SPH_OK;
    if (s != SPH_OK) verdict = sph_err_prefix(s, "distill.seq_comm: allgather: ");
    int64_t total = 0;
    for (int64_t r = 0; r < c->size && s == SPH_OK && verdict == SPH_OK; r++) {
        const int64_t *a = all + r * DG_WORDS;
        if (a[DG_TAG] != DG_VALID)
            verdict = sph_err(SPH_ERR_INVALID_ARG,
                              "distill.seq_comm: rank %lld of the group refused its "
                              "distillation call (see that rank's message); every rank fails "
                              "with it", (long long)r);
        else if (a[DG_RED] != all[DG_RED] || a[DG_TOKENS] != all[DG_TOKENS])
            verdict = sph_err(SPH_ERR_MISMATCH,
                              "distill.seq_comm: rank %lld's call has %s %lld, rank 0's %lld: "
                              "every rank of the group must pass the same reduction and "
                              "num_tokens", (long long)r,
                              a[DG_RED] != all[DG_RED] ? "reduction" : "num_tokens",
                              (long long)(a[DG_RED] != all[DG_RED] ? a[DG_RED] : a[DG_TOKENS]),
                              (long long)(a[DG_RED] != all[DG_RED] ? all[DG_RED]
                                                                   : all[DG_TOKENS]));
        else
            total += a[DG_COUNT];
    }
    sph_free(all);
    if (local != SPH_OK) return sph_err(local, "%s", saved);
    if (verdict == SPH_OK && dp->num_tokens == 0) dp->n_mean = total;
    return verdict;
}

// ---- the call -------------------------------------------------------------------------------

static sph_status check_workspace(sph_ctx_t ctx, const sph_distill_backend *be,
                                  const sph_distill_plan *dp, void *ws, size_t ws_bytes,
                                  sph_validator *val) {
    size_t need = 0;
    SPH_TRY(be->workspace(ctx, dp, &need));
    SPH_CHECK(ws_bytes >= need, SPH_ERR_WORKSPACE,
              "workspace_bytes: %zu, expected >= %zu (sph_distill_loss_workspace_size)",
              ws_bytes, need);
    SPH_CHECK(need == 0 || ws != NULL, SPH_ERR_WORKSPACE,
              "workspace: NULL, expected %zu bytes (sph_distill_loss_workspace_size)", need);
    if (need > 0 && ctx->head.check_workspace) SPH_TRY(ctx->head.check_workspace(ctx, ws, need));
    return sph_val_region(val, ws, need, 1, ctx->device, "workspace", SPH_VAL_OUT);
}

static sph_status distill_loss(sph_ctx_t ctx, const sph_head_args *head,
                               const sph_distill_args *d, void *ws, size_t ws_bytes) {
    sph_distill_plan dp;
    sph_validator val;
    sph_val_init(&val, ctx);
    const sph_distill_backend *be = backend_of(ctx);
    if (!be) return sph_backend_missing(ctx, "distillation loss");
    sph_status s = plan_validate(ctx, head, d, &dp, &val);
    if (s == SPH_OK) s = check_workspace(ctx, be, &dp, ws, ws_bytes, &val);
    if (s == SPH_OK) s = sph_val_finish(&val);
    if (s == SPH_OK) s = check_data(ctx, &dp);
    if (s == SPH_OK) s = check_finite_rows(ctx, &dp);
    s = sph_head_tp_agree(ctx, SPH_HEAD_FORWARD, s == SPH_OK ? &dp.head : NULL, s);
    s = distill_tp_agree(ctx, &dp, s);
    s = distill_seq_count(ctx, d, &dp, s);
    SPH_TRY(s);
    return be->run(ctx, &dp, ws, ws_bytes);
}

sph_status sph_distill_loss(sph_ctx_t ctx, const sph_head_args *head,
                            const sph_distill_args *distill, void *workspace,
                            size_t workspace_bytes) {
    SPH_TRY(sph_ctx_enter(ctx, "distill_loss"));
    return sph_ctx_leave(ctx, distill_loss(ctx, head, distill, workspace, workspace_bytes));
}
