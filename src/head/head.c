/*
 * head.c - the public entry points of the LM head (sph_head_workspace_size, sph_head_forward,
 * sph_head_backward): validation of sph_head_args into a sph_head_plan, then one indirect call
 * through the context's head table (core/backend.h), which holds the reference, the
 * optimized CPU backend or CUDA, slot by slot.
 *
 * Validation happens here, once: every check runs before any output is written: shapes,
 * dtypes, strides, element alignment, devices, scalar domains (temperature, softcap, vocab
 * shard), the communicator, and, when the data lives in host memory, the contents of targets
 * (< vocab_total), candidates (no duplicates, target inside the support) and spans (ordered,
 * non-overlapping, in range, covering every active row of the mask). Then the backend's own
 * conditions (ctx->head.check: device pointers, capability, kernel limits), the workspace
 * (ctx->head.workspace, ctx->head.check_workspace), and the pass.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/trace.h"
#include "comm/comm.h"
#include "core/ctx.h"
#include "head/plan.h"

// ---- small helpers ---------------------------------------------------------------------

/* "a + b" for a message: the sum, or both terms when it overflows (never printed wrapped). */
static const char *sum_str(char *buf, size_t n, int64_t a, int64_t b) {
    int64_t r;
    if (sph_add_i64(a, b, &r)) snprintf(buf, n, "%lld", (long long)r);
    else snprintf(buf, n, "%lld + %lld (beyond int64)", (long long)a, (long long)b);
    return buf;
}

/* A per-row f32 vector (N). */
static sph_status row_vector(sph_validator *val, int access, const sph_tensor *t,
                             const char *name, int64_t N, float **out) {
    sph_view v;
    SPH_TRY(sph_val_rows(val, t, name, N, access, SPH_DT_F32, &v));
    *out = (float *)v.data;
    return SPH_OK;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

// ---- validation ------------------------------------------------------------------------

/* The appended fields of issue 25, read only when args.struct_size covers them: the per-row
 * temperature (an input of both passes), sum_p2 and topk_ids + topk_logprobs (forward outputs
 * like logprob: output regions, so any overlap with another tensor of the call is refused;
 * ignored by the backward). */
static sph_status contract_outputs(sph_validator *val, sph_head_pass pass,
                                   const sph_head_args *a, sph_head_plan *p) {
#define SPH_HAS_FIELD(f) (a->struct_size >= offsetof(sph_head_args, f) + sizeof a->f && a->f)
    if (SPH_HAS_FIELD(temperature_rows)) {
        /* per-row temperature (issue 25): the scalar stays at its default, so that a call
         * never carries two temperatures; the values are a data check (host plans) */
        SPH_CHECK(a->temperature == 1.0, SPH_ERR_INVALID_ARG,
                  "temperature: %g given together with temperature_rows, expected 1 (the "
                  "default: the per-row values replace it)", a->temperature);
        sph_view tv;
        SPH_TRY(sph_val_rows(val, a->temperature_rows, "temperature_rows", p->N, SPH_VAL_IN,
                             SPH_DT_F32, &tv));
        p->temp_rows = (const float *)tv.data;
    }
    const int has = SPH_HAS_FIELD(sum_p2);
    const int has_ti = SPH_HAS_FIELD(topk_ids), has_tl = SPH_HAS_FIELD(topk_logprobs);
#undef SPH_HAS_FIELD
    if (pass != SPH_HEAD_FORWARD) return SPH_OK;
    if (has) SPH_TRY(row_vector(val, SPH_VAL_OUT, a->sum_p2, "sum_p2", p->N, &p->sum_p2));
    if (!has_ti && !has_tl) return SPH_OK;
    SPH_CHECK(has_ti && has_tl, SPH_ERR_INVALID_ARG,
              "%s: given without %s (top-k takes both tensors or neither)",
              has_ti ? "topk_ids" : "topk_logprobs", has_ti ? "topk_logprobs" : "topk_ids");
    SPH_CHECK(p->K == 0, SPH_ERR_INVALID_ARG,
              "topk_ids: not defined in sample-support mode (candidates given)");
    sph_view iv, lv;
    SPH_TRY(sph_val_tensor(val, a->topk_ids, "topk_ids", 2, SPH_VAL_OUT, SPH_DT_I64, &iv));
    SPH_TRY(sph_view_expect_dim(&iv, "topk_ids", 0, p->N, "N, rows of hidden"));
    const int64_t K = iv.shape[1];
    SPH_CHECK(K >= 1 && K <= SPH_HEAD_TOPK_MAX, SPH_ERR_SHAPE,
              "topk_ids: shape[1] (K) is %lld, expected 1 <= K <= %d", (long long)K,
              SPH_HEAD_TOPK_MAX);
    SPH_CHECK(K <= p->V, SPH_ERR_SHAPE,
              "topk_ids: shape[1] (K) is %lld, expected <= vocab_total = %lld", (long long)K,
              (long long)p->V);
    SPH_TRY(sph_val_tensor(val, a->topk_logprobs, "topk_logprobs", 2, SPH_VAL_OUT, SPH_DT_F32,
                           &lv));
    SPH_TRY(sph_view_expect_dim(&lv, "topk_logprobs", 0, p->N, "N, rows of hidden"));
    SPH_TRY(sph_view_expect_dim(&lv, "topk_logprobs", 1, K, "K, columns of topk_ids"));
    p->topk = K;
    p->topk_ids = (int64_t *)iv.data;
    p->ld_ti = iv.stride[0];
    p->topk_lp = (float *)lv.data;
    p->ld_tl = lv.stride[0];
    return SPH_OK;
}

/* A gradient output (rows x H) in the input dtype or f32; absent (NULL) leaves it unset. */
static sph_status grad_output(sph_validator *val, const sph_tensor *t, const char *name,
                              int64_t rows, const char *rows_what, sph_dtype in, int64_t H,
                              void **data, int64_t *ld, sph_dtype *dtype) {
    if (!t) return SPH_OK;
    sph_view v;
    SPH_TRY(sph_val_tensor(val, t, name, 2, SPH_VAL_OUT, sph_dtype_bit(in) | SPH_DT_F32, &v));
    SPH_TRY(sph_view_expect_dim(&v, name, 0, rows, rows_what));
    SPH_TRY(sph_view_expect_dim(&v, name, 1, H, "H, columns of hidden"));
    *data = v.data;
    *ld = v.stride[0];
    *dtype = v.dtype;
    return SPH_OK;
}

/* The upstream gradients: read by the backward and by a one-pass forward. */
static sph_status upstream_gradients(sph_validator *val, sph_head_pass pass,
                                     const sph_head_args *a, sph_head_plan *p) {
    if (pass != SPH_HEAD_BACKWARD && !p->one_pass) return SPH_OK;
    if (a->dlogprob) {
        SPH_TRY(row_vector(val, SPH_VAL_IN, a->dlogprob, "dlogprob", p->N,
                           (float **)&p->dlogprob));
        SPH_CHECK(a->targets != NULL, SPH_ERR_INVALID_ARG,
                  "dlogprob: given without targets (logprob is not computed)");
    }
    if (a->dentropy)
        SPH_TRY(row_vector(val, SPH_VAL_IN, a->dentropy, "dentropy", p->N,
                           (float **)&p->dentropy));
    if (a->dlse) SPH_TRY(row_vector(val, SPH_VAL_IN, a->dlse, "dlse", p->N, (float **)&p->dlse));
    if (a->dlogit_mean) {
        SPH_CHECK(p->K == 0, SPH_ERR_INVALID_ARG,
                  "dlogit_mean: given in sample-support mode, where logit_mean is not defined");
        SPH_TRY(row_vector(val, SPH_VAL_IN, a->dlogit_mean, "dlogit_mean", p->N,
                           (float **)&p->dlogit_mean));
    }
    return SPH_OK;
}

/* The context's TP group: valid, created for this shard, and what allreduce_dhidden needs. */
static sph_status validate_comm(sph_ctx_t ctx, const sph_head_args *a, sph_head_plan *p) {
    char b1[64], b2[64];
    // communicator
    p->comm = ctx->tp_comm;
    if (p->comm) {
        SPH_TRY(sph_comm_validate(ctx, p->comm, "tp_comm"));
    }
    const int64_t tp = p->comm ? p->comm->size : 1;
    /* A sharded call must be the shard its communicator was created for (the creation checked
     * that the group's shards tile the vocabulary). Without a group, a shard's statistics are
     * its own (documented in spanhead.h). */
    if (tp > 1 && p->comm->cfg.vocab_total > 0) {
        const sph_comm_config *c = &p->comm->cfg;
        SPH_CHECK(p->V == c->vocab_total && p->v0 == c->vocab_start && p->V_loc == c->vocab_local,
                  SPH_ERR_MISMATCH,
                  "vocab shard: [%lld, %s) of %lld, but tp_comm was created for [%lld, %s) of "
                  "%lld", (long long)p->v0, sum_str(b1, sizeof b1, p->v0, p->V_loc),
                  (long long)p->V, (long long)c->vocab_start,
                  sum_str(b2, sizeof b2, c->vocab_start, c->vocab_local),
                  (long long)c->vocab_total);
    }
    if (p->allreduce_dh) {
        SPH_CHECK(a->dhidden != NULL, SPH_ERR_INVALID_ARG,
                  "allreduce_dhidden: set without dhidden");
        SPH_CHECK(p->comm != NULL, SPH_ERR_INVALID_ARG,
                  "allreduce_dhidden: set but the context has no tp_comm");
        if (p->comm->size > 1) {
            SPH_CHECK(sph_dtype_eq(p->dh_dtype, SPH_F32) && p->ld_dh == p->H, SPH_ERR_UNSUPPORTED,
                      "allreduce_dhidden: needs a compact f32 dhidden (got %s, row stride %lld)",
                      sph_dtype_name(p->dh_dtype), (long long)p->ld_dh);
            SPH_CHECK(!p->acc_dh, SPH_ERR_UNSUPPORTED,
                      "allreduce_dhidden: cannot be combined with accumulate_dhidden over a "
                      "group of %lld ranks (the accumulated values would be summed too)",
                      (long long)p->comm->size);
        }
    }
    return SPH_OK;
}

sph_status sph_head_plan_validate(sph_ctx_t ctx, sph_head_pass pass, const sph_head_args *a,
                                  sph_head_plan *p, sph_validator *val, unsigned flags) {
    SPH_TRY(sph_ctx_check(ctx, "head"));
    SPH_CHECK(a != NULL, SPH_ERR_INVALID_ARG, "args: NULL");
    SPH_CHECK(p != NULL, SPH_ERR_INVALID_ARG, "plan: NULL");
    /* fields are only appended: a struct that ends before sum_p2 is an older caller's */
    SPH_CHECK(a->struct_size >= offsetof(sph_head_args, sum_p2), SPH_ERR_INVALID_ARG,
              "args.struct_size: %zu, expected >= %zu (use SPH_HEAD_ARGS_INIT)", a->struct_size,
              offsetof(sph_head_args, sum_p2));
    SPH_CHECK(pass == SPH_HEAD_FORWARD || pass == SPH_HEAD_BACKWARD, SPH_ERR_INVALID_ARG,
              "pass: %d, expected SPH_HEAD_FORWARD (0) or SPH_HEAD_BACKWARD (1)", (int)pass);
    memset(p, 0, sizeof *p);
    p->device = ctx->device;
    char b1[64];
    const int host = ctx->dev->host_memory; /* data readable here (content checks) */

    // hidden and weight
    sph_view hv, wv;
    SPH_TRY(sph_val_tensor(val, a->hidden, "hidden", 2, SPH_VAL_IN, SPH_DT_FLOAT_IN, &hv));
    SPH_TRY(sph_val_tensor(val, a->weight, "weight", 2, SPH_VAL_IN, 0, &wv));
    SPH_TRY(sph_val_dtype("weight", wv.dtype, sph_dtype_bit(hv.dtype), "hidden's"));
    p->N = hv.shape[0];
    p->H = hv.shape[1];
    p->V_loc = wv.shape[0];
    SPH_TRY(sph_view_expect_dim(&wv, "weight", 1, p->H, "H, columns of hidden"));
    SPH_CHECK(p->V_loc >= 1, SPH_ERR_SHAPE, "weight: shape[0] (V_loc) is 0, expected >= 1");
    SPH_CHECK(p->H >= 1, SPH_ERR_SHAPE, "hidden: shape[1] (H) is 0, expected >= 1");
    p->dtype = hv.dtype;
    p->hidden = hv.data;
    p->ld_h = hv.stride[0];
    p->weight = wv.data;
    p->ld_w = wv.stride[0];
    int64_t nh, nv;
    SPH_CHECK(sph_mul_i64(p->N, p->ld_h, &nh) && sph_mul_i64(p->V_loc, p->ld_w, &nv),
              SPH_ERR_OVERFLOW, "hidden/weight: element count overflows int64");

    // vocabulary shard
    p->V = a->vocab_total ? a->vocab_total : p->V_loc;
    p->v0 = a->vocab_start;
    SPH_CHECK(p->V > 0, SPH_ERR_INVALID_ARG, "vocab_total: %lld, expected > 0 (or 0 = V_loc)",
              (long long)a->vocab_total);
    SPH_CHECK(p->v0 >= 0 && p->v0 <= p->V - p->V_loc, SPH_ERR_INVALID_ARG,
              "vocab_start: shard [%lld, %s) lies outside [0, vocab_total = %lld)",
              (long long)p->v0, sum_str(b1, sizeof b1, p->v0, p->V_loc), (long long)p->V);

    // scalars
    p->temperature = a->temperature;
    p->softcap = a->softcap;
    /* the kernels compute z = u / T as u * float(1 / T), tanh(u / c) as u * float(1 / c) */
    SPH_TRY(sph_check_float_scalar("temperature", a->temperature, 0, 1));
    SPH_TRY(sph_check_float_scalar("softcap", a->softcap, 1, 1));

    // active mask
    if (a->active_mask) {
        sph_view mv;
        SPH_TRY(sph_val_rows(val, a->active_mask, "active_mask", p->N, SPH_VAL_IN, SPH_DT_MASK,
                             &mv));
        p->mask = (const uint8_t *)mv.data;
    }
    // spans (host memory always)
    if (a->spans || a->n_spans) {
        /* spans are read here, on the host: device memory would fault, so say so instead */
        SPH_CHECK(!sph_registry_pointer_is_device(a->spans), SPH_ERR_DEVICE,
                  "spans: device pointer %p, expected host memory (spans are host metadata)",
                  (const void *)a->spans);
        /* ordered, disjoint, inside [0, N); covering every active row of a host mask is a
         * data check (sph_head_plan_check_data) */
        if (!host) SPH_TRY(sph_spans_validate(a->spans, a->n_spans, p->N, NULL));
        p->spans = a->spans;
        p->n_spans = a->n_spans;
        /* valid spans are disjoint and non-empty inside [0, N): n_spans <= N (bad ones fail
         * their validation; they are no region here) */
        if (a->spans && a->n_spans > 0 && a->n_spans <= p->N)
            SPH_TRY(sph_val_region(val, a->spans, (size_t)a->n_spans, 2 * sizeof(int64_t),
                                   (sph_device){SPH_DEVICE_CPU, 0}, "spans", SPH_VAL_IN));
    }

    // targets
    if (a->targets) {
        sph_view tv;
        SPH_TRY(sph_val_rows(val, a->targets, "targets", p->N, SPH_VAL_IN, SPH_DT_IDS, &tv));
        p->targets = tv.data;
        p->tgt_i64 = tv.dtype.bits == 64;
    }

    // candidates (sample support)
    if (a->candidates) {
        sph_view cv;
        SPH_TRY(sph_val_tensor(val, a->candidates, "candidates", 2, SPH_VAL_IN, SPH_DT_IDS, &cv));
        SPH_TRY(sph_view_expect_dim(&cv, "candidates", 0, p->N, "N, rows of hidden"));
        SPH_CHECK(cv.shape[1] >= 1, SPH_ERR_SHAPE, "candidates: shape[1] (K) is 0, expected >= 1");
        p->K = cv.shape[1];
        p->cand = cv.data;
        p->cand_i64 = cv.dtype.bits == 64;
        p->ld_c = cv.stride[0];
    }

    // per-row outputs and stats
    /* the backward leaves the per-row outputs alone: they are regions of the call only when
     * the forward writes them */
    const int fwd = pass == SPH_HEAD_FORWARD;
    if (a->logprob)
        SPH_TRY(row_vector(val, fwd, a->logprob, "logprob", p->N, &p->logprob));
    if (a->entropy)
        SPH_TRY(row_vector(val, fwd, a->entropy, "entropy", p->N, &p->entropy));
    if (a->lse) SPH_TRY(row_vector(val, fwd, a->lse, "lse", p->N, &p->lse));
    if (a->logit_mean)
        SPH_TRY(row_vector(val, fwd, a->logit_mean, "logit_mean", p->N,
                           &p->logit_mean));
    SPH_TRY(contract_outputs(val, pass, a, p));
    SPH_CHECK(a->logprob == NULL || a->targets != NULL, SPH_ERR_INVALID_ARG,
              "logprob: requested without targets");
    SPH_CHECK(a->logit_mean == NULL || p->K == 0, SPH_ERR_INVALID_ARG,
              "logit_mean: not defined in sample-support mode (candidates given)");
    SPH_CHECK(a->stats != NULL || (flags & SPH_PLAN_STATS_OPTIONAL), SPH_ERR_INVALID_ARG,
              "stats: NULL, expected an f32 (N, 3) tensor (forward writes it, backward reads it)");
    if (a->stats) {
        sph_view sv;
        /* the forward writes it, the backward reads it */
        SPH_TRY(sph_val_tensor(val, a->stats, "stats", 2, fwd, SPH_DT_F32, &sv));
        SPH_TRY(sph_view_expect_dim(&sv, "stats", 0, p->N, "N, rows of hidden"));
        SPH_TRY(sph_view_expect_dim(&sv, "stats", 1, 3, "m, lse, mu"));
        SPH_CHECK(sv.stride[0] == 3 || p->N <= 1, SPH_ERR_SHAPE,
                  "stats: row stride is %lld, expected 3 (compact rows)", (long long)sv.stride[0]);
        p->stats = (float *)sv.data;
    }

    // gradient outputs
    SPH_TRY(grad_output(val, a->dhidden, "dhidden", p->N, "N, rows of hidden", p->dtype, p->H,
                        &p->dhidden, &p->ld_dh, &p->dh_dtype));
    SPH_TRY(grad_output(val, a->dweight, "dweight", p->V_loc, "V_loc, rows of weight",
                        p->dtype, p->H, &p->dweight, &p->ld_dw, &p->dw_dtype));
    p->acc_dh = a->accumulate_dhidden != 0;
    p->acc_dw = a->accumulate_dweight != 0;
    p->allreduce_dh = a->allreduce_dhidden != 0;
    const int grads = a->dhidden || a->dweight;
    if (pass == SPH_HEAD_BACKWARD)
        SPH_CHECK(grads, SPH_ERR_INVALID_ARG,
                  "dhidden, dweight: both NULL, the backward has nothing to compute");
    p->one_pass = pass == SPH_HEAD_FORWARD && grads;

    SPH_TRY(upstream_gradients(val, pass, a, p));
    return validate_comm(ctx, a, p);
}

/* After the regions: the contents of host data (an input that aliases an output is refused
 * as such, not for the output's bytes it would read). */
static sph_status check_data(sph_ctx_t ctx, const sph_head_plan *p) {
    return ctx->dev->host_memory ? sph_head_plan_check_data(p) : SPH_OK;
}

sph_status sph_head_plan_fill(sph_ctx_t ctx, sph_head_pass pass, const sph_head_args *a,
                              sph_head_plan *p) {
    sph_validator val;
    sph_val_init(&val, ctx);
    SPH_TRY(sph_head_plan_validate(ctx, pass, a, p, &val, 0));
    SPH_TRY(sph_val_finish(&val));
    return check_data(ctx, p);
}

sph_status sph_head_plan_make(sph_ctx_t ctx, sph_head_pass pass, const sph_head_args *a,
                              sph_head_plan *p) {
    SPH_TRY(sph_head_plan_fill(ctx, pass, a, p));
    /* the backend's own conditions, after the generic ones */
    if (ctx->head.check) SPH_TRY(ctx->head.check(ctx, pass, p));
    return SPH_OK;
}

sph_status sph_head_plan_check_data(const sph_head_plan *p) {
    if (p->mask)
        for (int64_t i = 0; i < p->N; i++)
            SPH_CHECK(p->mask[i] <= 1, SPH_ERR_INVALID_ARG,
                      "active_mask[%lld]: %u, expected 0 or 1", (long long)i, p->mask[i]);
    /* ordered, disjoint, inside [0, N), covering every active row of the mask */
    if (p->spans || p->n_spans)
        SPH_TRY(sph_spans_validate(p->spans, p->n_spans, p->N, p->mask));
    /* every row's temperature, active or not (inactive rows' values are never used) */
    SPH_TRY(sph_check_temperature_rows("temperature_rows", p->temp_rows, p->N));
    if (p->targets)
        for (int64_t i = 0; i < p->N; i++) {
            int64_t t = sph_head_id_at(p->targets, p->tgt_i64, i);
            SPH_CHECK(t < p->V, SPH_ERR_INVALID_ARG,
                      "targets[%lld]: %lld, expected < vocab_total = %lld (negative = ignored)",
                      (long long)i, (long long)t, (long long)p->V);
        }
    if (p->cand && p->N > 0) {
        int64_t *row = sph_malloc((size_t)p->K * sizeof *row);
        SPH_CHECK(row != NULL, SPH_ERR_ALLOC, "candidates: out of host memory (K = %lld)",
                  (long long)p->K);
        sph_status st = SPH_OK;
        for (int64_t i = 0; i < p->N && st == SPH_OK; i++) {
            int64_t n = 0;
            for (int64_t k = 0; k < p->K && st == SPH_OK; k++) {
                int64_t c = sph_head_id_at(p->cand, p->cand_i64, i * p->ld_c + k);
                if (c >= p->V)
                    st = sph_err(SPH_ERR_INVALID_ARG,
                                 "candidates[%lld, %lld]: %lld, expected < vocab_total = "
                                 "%lld (negative = padding)",
                                 (long long)i, (long long)k, (long long)c, (long long)p->V);
                if (c >= 0) row[n++] = c;
            }
            if (st != SPH_OK) break;
            qsort(row, (size_t)n, sizeof *row, cmp_i64);
            for (int64_t k = 1; k < n && st == SPH_OK; k++)
                if (row[k] == row[k - 1])
                    st = sph_err(SPH_ERR_INVALID_ARG,
                                 "candidates[%lld, :]: id %lld appears twice", (long long)i,
                                 (long long)row[k]);
            if (st == SPH_OK && p->targets) {
                int64_t t = sph_head_id_at(p->targets, p->tgt_i64, i);
                if (t >= 0 && !bsearch(&t, row, (size_t)n, sizeof *row, cmp_i64))
                    st = sph_err(SPH_ERR_INVALID_ARG,
                                 "targets[%lld]: %lld is not among candidates[%lld, :] (the "
                                 "target must be in its support)",
                                 (long long)i, (long long)t, (long long)i);
            }
        }
        sph_free(row);
        SPH_TRY(st);
    }
    return SPH_OK;
}

// ---- public entry points ---------------------------------------------------------------

/* The pass's slot of the table: full vocabulary or sample support (candidates given). */
static sph_head_pass_fn pass_slot(const sph_head_backend *be, sph_head_pass pass,
                                  const sph_head_plan *p) {
    if (pass == SPH_HEAD_FORWARD) return p->K ? be->support_forward : be->forward;
    return p->K ? be->support_backward : be->backward;
}

sph_status sph_head_workspace_size(sph_ctx_t ctx, sph_head_pass pass, const sph_head_args *args,
                                   size_t *bytes) {
    SPH_CHECK(bytes != NULL, SPH_ERR_INVALID_ARG, "bytes: NULL");
    *bytes = 0;
    sph_head_plan p;
    SPH_TRY(sph_head_plan_make(ctx, pass, args, &p));
    return ctx->head.workspace(ctx, pass, &p, bytes);
}

sph_status sph_head_describe(sph_ctx_t ctx, sph_head_pass pass, const sph_head_args *args,
                             sph_head_pass_info *info) {
    SPH_CHECK(info != NULL, SPH_ERR_INVALID_ARG, "info: NULL");
    SPH_CHECK(info->struct_size >= sizeof *info, SPH_ERR_INVALID_ARG,
              "info.struct_size: %zu, expected %zu (use SPH_HEAD_PASS_INFO_INIT)",
              info->struct_size, sizeof *info);
    sph_head_plan p;
    SPH_TRY(sph_head_plan_make(ctx, pass, args, &p));
    sph_head_pass_info out;
    memset(&out, 0, sizeof out);
    out.struct_size = sizeof out;
    SPH_TRY(ctx->head.workspace(ctx, pass, &p, &out.workspace_bytes));
    const char *nm = ctx->head.name ? ctx->head.name : "?";
    snprintf(out.path, sizeof out.path, "%s",
             p.K > 0 ? "support" : (!strncmp(nm, "ref", 3) ? "reference" : nm));
    if (ctx->head.describe) SPH_TRY(ctx->head.describe(ctx, pass, &p, &out));
    *info = out; /* nothing written on failure */
    return SPH_OK;
}

/* The workspace the caller gives against the one the pass's slot asks for. */
static sph_status check_workspace(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p,
                                  void *ws, size_t ws_bytes, sph_validator *val) {
    const sph_head_backend *be = &ctx->head;
    size_t need = 0;
    SPH_TRY(be->workspace(ctx, pass, p, &need));
    SPH_CHECK(ws_bytes >= need, SPH_ERR_WORKSPACE,
              "workspace_bytes: %zu, expected >= %zu (sph_head_workspace_size)", ws_bytes, need);
    SPH_CHECK(need == 0 || ws != NULL, SPH_ERR_WORKSPACE,
              "workspace: NULL, expected %zu bytes (sph_head_workspace_size)", need);
    if (need > 0 && be->check_workspace) SPH_TRY(be->check_workspace(ctx, ws, need));
    /* the bytes the pass writes are a region of the call like its outputs */
    SPH_TRY(sph_val_region(val, ws, need, 1, ctx->device, "workspace", SPH_VAL_OUT));
    SPH_CHECK(pass_slot(be, pass, p) != NULL, SPH_ERR_UNSUPPORTED,
              "%s: not implemented by the %s backend of this context",
              p->K ? "head (sample support)" : "head", be->name ? be->name : "(no)");
    return SPH_OK;
}

static sph_status run_pass(sph_ctx_t ctx, sph_head_pass pass, const sph_head_args *args,
                           void *ws, size_t ws_bytes) {
    sph_head_plan p;
    sph_validator val;
    sph_val_init(&val, ctx);
    sph_status s = sph_head_plan_validate(ctx, pass, args, &p, &val, 0);
    sph_trace_mark("head: validate");
    /* the backend's own conditions, after the generic ones */
    if (s == SPH_OK && ctx->head.check) s = ctx->head.check(ctx, pass, &p);
    sph_trace_mark("head: backend check");
    if (s == SPH_OK) s = check_workspace(ctx, pass, &p, ws, ws_bytes, &val);
    sph_trace_mark("head: workspace check");
    if (s == SPH_OK) s = sph_val_finish(&val);
    sph_trace_mark("head: aliasing");
    if (s == SPH_OK) s = check_data(ctx, &p);
    if (s == SPH_OK)
        s = sph_head_refuse_nonfinite_hidden(ctx, &p, pass == SPH_HEAD_BACKWARD ? "head backward"
                                                                              : "head one-pass");
    sph_trace_mark("head: check data");
    /* a TP group agrees on the call (or on one rank's failure) before any output is written */
    if (ctx && ctx->magic == SPH_CTX_MAGIC) s = sph_head_tp_agree(ctx, pass, &p, s);
    sph_trace_mark("head: tp agree");
    SPH_TRY(s);
    s = pass_slot(&ctx->head, pass, &p)(ctx, &p, ws, ws_bytes);
    sph_trace_mark("head: pass (rest)");
    return s;
}

sph_status sph_head_forward(sph_ctx_t ctx, const sph_head_args *args, void *workspace,
                            size_t workspace_bytes) {
    sph_trace_begin();
    SPH_TRY(sph_ctx_enter(ctx, "head_forward"));
    sph_trace_mark("head: ctx enter");
    const sph_status s = run_pass(ctx, SPH_HEAD_FORWARD, args, workspace, workspace_bytes);
    const sph_status r = sph_ctx_leave(ctx, s);
    sph_trace_mark("head: ctx leave");
    return r;
}

sph_status sph_head_backward(sph_ctx_t ctx, const sph_head_args *args, void *workspace,
                             size_t workspace_bytes) {
    sph_trace_begin();
    SPH_TRY(sph_ctx_enter(ctx, "head_backward"));
    sph_trace_mark("head: ctx enter");
    const sph_status s = run_pass(ctx, SPH_HEAD_BACKWARD, args, workspace, workspace_bytes);
    const sph_status r = sph_ctx_leave(ctx, s);
    sph_trace_mark("head: ctx leave");
    return r;
}
