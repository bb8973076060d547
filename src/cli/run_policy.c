/*
 * run_policy.c - `spanhead run --inputs DIR --outputs DIR --policy-loss ppo|cispo|gspo ...`:
 * the fused RL policy loss (sph_policy_loss; the math and the decisions are in
 * docs/policy.md) on the .npy files of DIR, on the CPU or a CUDA device, in one call: logprob,
 * entropy, the loss, its metrics, dhidden and dweight. --check runs the float64 reference on
 * the same inputs and exits 1 when a relative error exceeds the tolerance; --outputs writes
 * loss.json (the metrics by name) and logprob, entropy, dhidden, dweight .npy (and with --topk K
 * / --sum-p2 the head's extras of the loss's rows: topk_ids, topk_logprobs, sum_p2 .npy, as
 * `run` writes them), all of them or none (after the check passed). Under mpirun, or with
 * --tp / --cp / --dp, run_policy_dist.c takes over.
 *
 * DIR: hidden.npy (N, H), weight.npy (V, H) (f4, f2, or u2 bits with --dtype bf16|f16),
 * targets.npy (N) int, mask.npy (N) u1/b1 (optional: all rows), advantages.npy and
 * old_logprob.npy (N) float (f8 is converted), seq_id.npy (N) int (required by the seq-*
 * aggregations and gspo), ref_logprob.npy (N) (required with --kl k1|k2|k3), is_weight.npy (N)
 * (optional).
 */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "json_util.h"
#include "msg.h"
#include "npy.h"
#include "num.h"
#include "run.h"
#include "run_loss.h"
#include "run_policy.h"

#define CMD "run"

static const char *const k_losses[] = {"ppo", "cispo", "gspo", NULL};
static const char *const k_kls[] = {"none", "k1", "k2", "k3", NULL};
static const char *const k_aggs[] = {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                     "seq-mean-token-sum-norm", NULL};
const char *const pol_metric_names[SPH_POLICY_N_METRICS] = {
    "loss", "pg_loss", "kl_loss", "entropy_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl",
    "tokens", "seqs"};

#define O(f) offsetof(pol_opts, f)
const sph_cli_opt sph_cli_policy_opts[] = {
    {"--inputs", "DIR", SPH_OPT_STR, O(inputs), 0, 0, 0, 0, NULL, 0,
     "hidden weight targets advantages old_logprob .npy, and mask seq_id\n"
     "ref_logprob is_weight temperature .npy where present (required;\n"
     "temperature.npy: <f4 (N) per-row temperatures, excludes --temperature)"},
    {"--outputs", "DIR", SPH_OPT_STR, O(outputs), 0, 0, 0, 0, NULL, 0,
     "write loss.json, logprob entropy dhidden dweight .npy: all of them\n"
     "after the run (and --check) succeeded, or none"},
    {"--topk", "K", SPH_OPT_I64, O(topk), 1, 256, 0, 0, NULL, 0,
     "also the top-K ids and log-probs of the policy's distribution per\n"
     "loss row (topk_ids.npy, topk_logprobs.npy; -1 / 0 on the others)"},
    {"--sum-p2", NULL, SPH_OPT_FLAG, O(sum_p2), 0, 0, 0, 0, NULL, 0,
     "also sum_j p_j^2 per loss row (sum_p2.npy)"},
    {"--policy-loss", "ppo|cispo|gspo", SPH_OPT_CHOICE, O(loss), 0, 0, 0, 0, k_losses, 0,
     "the policy-gradient term"},
    {"--clip-low", "E", SPH_OPT_F64, O(clip_low), 0, 0, 0, 0, NULL, SPH_OPTF_ANY,
     "eps_low: the ratio's clip range starts at 1 - E (default 0.2)"},
    {"--clip-high", "E", SPH_OPT_F64, O(clip_high), 0, 0, 0, 0, NULL, SPH_OPTF_ANY,
     "eps_high: the clip range ends at 1 + E (default 0.2)"},
    {"--clip-ratio-c", "C", SPH_OPT_F64, O(clip_c), 0, 0, 0, 0, NULL, SPH_OPTF_ANY,
     "dual clip C > 1 for negative advantages (ppo, gspo; default none)"},
    {"--kl", "none|k1|k2|k3", SPH_OPT_CHOICE, O(kl), 0, 0, 0, 0, k_kls, 0,
     "KL estimator to the reference (default none; needs ref_logprob.npy)"},
    {"--kl-coef", "B", SPH_OPT_F64, O(kl_coef), 0, 0, 0, 0, NULL, SPH_OPTF_ANY,
     "KL coefficient (default 0)"},
    {"--entropy-coef", "H", SPH_OPT_F64, O(entropy_coef), 0, 0, 0, 0, NULL, SPH_OPTF_ANY,
     "entropy bonus coefficient, subtracted (default 0)"},
    {"--agg", "MODE", SPH_OPT_CHOICE, O(agg), 0, 0, 0, 0, k_aggs, 0,
     "token-mean|seq-mean-token-sum|seq-mean-token-mean|\n"
     "seq-mean-token-sum-norm (default token-mean; seq-*: seq_id.npy)"},
    {"--norm-length", "L", SPH_OPT_F64, O(norm_length), 0, 0, 0, 0, NULL, SPH_OPTF_ANY,
     "L of seq-mean-token-sum-norm"},
    {"--num-tokens", "T", SPH_OPT_COUNT, O(num_tokens), 1, INT64_MAX, 0, 0, NULL, 0,
     "tokens of the global batch (default: the active rows)"},
    {"--num-seqs", "S", SPH_OPT_COUNT, O(num_seqs), 1, INT64_MAX, 0, 0, NULL, 0,
     "sequences of the global batch (default: those with an active row)"},
    RUN_LOSS_HEAD_ROWS(pol_opts),
    {"--gap", "G", SPH_OPT_I64, O(gap), 0, INT64_MAX, 0, 0, NULL, 0,
     "span coalescing gap of mask.npy (default 0)"},
    {"--tp", "T", SPH_OPT_I64, O(tp), 1, 4096, 0, 0, NULL, 0,
     "under mpirun: vocabulary shards (run_policy_dist.c)"},
    {"--cp", "C", SPH_OPT_I64, O(cp), 1, 4096, 0, 0, NULL, 0,
     "under mpirun: ranks splitting the rows of each sequence"},
    {"--dp", "D", SPH_OPT_I64, O(dp), 1, 4096, 0, 0, NULL, 0,
     "under mpirun: ranks taking whole sequences"},
    {NULL}};
#undef O

static const char k_synopsis[] =
    "usage: spanhead run --inputs DIR [--outputs DIR] --policy-loss ppo|cispo|gspo [options]\n"
    "       mpirun -np T*C*D spanhead run --tp T --cp C --dp D --inputs DIR --policy-loss ...";
static const char k_about[] =
    "The fused RL policy loss: logprob, entropy, the loss (PPO / GRPO / DAPO clipping, CISPO,\n"
    "GSPO, a KL penalty, an entropy bonus), its metrics and dhidden, dweight in one call of\n"
    "the LM head (docs/policy.md).";

void pol_usage(FILE *f) {
    sph_cli_usage(f, k_synopsis, k_about, sph_cli_policy_opts, SPH_CLI_EXIT_STATUS);
}

// ---- inputs ------------------------------------------------------------------------------

void pol_problem_free(pol_problem *p) {
    free(p->h), free(p->w), free(p->tgt), free(p->seq), free(p->mask), free(p->spans);
    free(p->adv), free(p->old), free(p->ref), free(p->isw), free(p->temp);
    memset(p, 0, sizeof *p);
}

/* A per-row float vector (f4, or f8 converted), finite: the library refuses NaN on active
 * rows with its own message; here the file must at least be a float vector of N. */
static int row_f32(const char *dir, const char *name, int64_t N, int required, float **out) {
    npy_array a = {0};
    int r = run_loss_read(dir, name, &a);
    if (r < 0) return 1;
    if (r == 0) {
        if (!required) return 0;
        return sph_cli_fail(CMD, 1, "--inputs %s: %s.npy is missing", dir, name);
    }
    int rc = 1;
    if (a.kind != 'f' || (a.bytes != 4 && a.bytes != 8)) {
        sph_cli_fail(CMD, 1, "%s.npy: dtype %s, expected <f4 (or <f8)", name, npy_descr(&a));
    } else if (a.ndim != 1 || a.shape[0] != N) {
        sph_cli_fail(CMD, 1, "%s.npy: %d-d of %lld elements, expected (%lld,) like targets.npy",
                     name, a.ndim, (long long)a.count, (long long)N);
    } else if (!(*out = sph_cli_alloc(N, 4))) {
        sph_cli_fail(CMD, 1, "%s.npy: out of memory", name);
    } else {
        for (int64_t i = 0; i < N; i++)
            (*out)[i] = a.bytes == 4 ? ((float *)a.data)[i] : (float)((double *)a.data)[i];
        rc = 0;
    }
    npy_free(&a);
    return rc;
}

static int row_i64(const char *dir, const char *name, int64_t N, int64_t **out) {
    npy_array a = {0};
    int r = run_loss_read(dir, name, &a);
    if (r <= 0) return r < 0;
    int rc = 1;
    if (a.kind != 'i' || (a.bytes != 4 && a.bytes != 8)) {
        sph_cli_fail(CMD, 1, "%s.npy: dtype %s, expected <i8 (or <i4)", name, npy_descr(&a));
    } else if (a.ndim != 1 || a.shape[0] != N) {
        sph_cli_fail(CMD, 1, "%s.npy: %d-d of %lld elements, expected (%lld,) like targets.npy",
                     name, a.ndim, (long long)a.count, (long long)N);
    } else if (!(*out = sph_cli_alloc(N, 8))) {
        sph_cli_fail(CMD, 1, "%s.npy: out of memory", name);
    } else {
        for (int64_t i = 0; i < N; i++)
            (*out)[i] = a.bytes == 8 ? ((int64_t *)a.data)[i] : ((int32_t *)a.data)[i];
        rc = 0;
    }
    npy_free(&a);
    return rc;
}

int pol_problem_read(const pol_opts *o, pol_problem *p) {
    memset(p, 0, sizeof *p);
    /* the head's files through run's reader (dtype rules, shapes, finite values, sizes) */
    run_opts ro;
    memset(&ro, 0, sizeof ro);
    ro.inputs = o->inputs, ro.dtype = o->dtype, ro.dtype_given = o->dtype_given;
    ro.mask = -1, ro.gap = o->gap, ro.check = o->check, ro.temperature = 1.0;
    run_problem rp;
    int rc = run_problem_make(&ro, &rp);
    if (rc) {
        run_problem_free(&rp);
        return rc;
    }
    if (rp.K) {
        run_problem_free(&rp);
        return sph_cli_fail(CMD, 1, "--inputs %s: candidates.npy: sample support is not "
                                    "available with --policy-loss", o->inputs);
    }
    p->N = rp.N, p->H = rp.H, p->V = rp.V, p->bits = rp.bits, p->is_bf16 = rp.is_bf16;
    p->h = rp.h, p->w = rp.w, p->tgt = rp.tgt, p->mask = rp.mask;
    p->spans = rp.spans, p->n_spans = rp.n_spans;
    p->temp = rp.temp; /* temperature.npy: one temperature per row */
    rp.h = rp.w = NULL, rp.tgt = NULL, rp.mask = NULL, rp.spans = NULL, rp.temp = NULL;
    run_problem_free(&rp);
    if (p->temp && o->temperature != 1.0)
        return sph_cli_fail(CMD, 2, "--temperature %g: --inputs %s has temperature.npy (one "
                                    "temperature per row, replacing the scalar); drop "
                                    "--temperature", o->temperature, o->inputs);
    const int need_ref = o->kl != 0;
    if (row_f32(o->inputs, "advantages", p->N, 1, &p->adv) ||
        row_f32(o->inputs, "old_logprob", p->N, 1, &p->old) ||
        row_f32(o->inputs, "ref_logprob", p->N, need_ref, &p->ref) ||
        row_f32(o->inputs, "is_weight", p->N, 0, &p->isw) ||
        row_i64(o->inputs, "seq_id", p->N, &p->seq))
        return 1;
    const int need_seq = o->agg != 0 || o->loss == 2;
    if (need_seq && !p->seq)
        return sph_cli_fail(CMD, 1, "--inputs %s: seq_id.npy is missing (--agg %s%s needs the "
                                    "sequence of every row)", o->inputs, k_aggs[o->agg],
                            o->loss == 2 ? " / --policy-loss gspo" : "");
    return 0;
}

// ---- one run -------------------------------------------------------------------------------

void pol_result_free(pol_result *r) {
    free(r->lp), free(r->ent), free(r->dh), free(r->dw), free(r->tki), free(r->tkl), free(r->sp2);
    r->lp = r->ent = r->dh = r->dw = r->tkl = r->sp2 = NULL;
    r->tki = NULL;
}

sph_policy_args pol_args(const pol_opts *o) {
    sph_policy_args a = SPH_POLICY_ARGS_INIT;
    a.loss = (sph_pg_loss)o->loss, a.kl = (sph_kl_kind)o->kl, a.agg = (sph_loss_agg)o->agg;
    a.clip_low = o->clip_low, a.clip_high = o->clip_high, a.clip_ratio_c = o->clip_c;
    a.kl_coef = o->kl_coef, a.entropy_coef = o->entropy_coef;
    a.num_tokens = o->num_tokens, a.num_seqs = o->num_seqs, a.norm_length = o->norm_length;
    return a;
}

enum { B_H, B_W, B_TGT, B_MASK, B_ADV, B_OLD, B_REF, B_ISW, B_SEQ, B_LP, B_ENT, B_DH, B_DW, B_MET,
       B_TEMP, B_TKI, B_TKL, B_SP2, B_COUNT };

static sph_status pol_size(const run_loss_call *c, size_t *bytes) {
    return sph_policy_loss_workspace_size(c->ctx, c->head, c->loss, bytes);
}

static sph_status pol_call(const run_loss_call *c, void *ws, size_t bytes) {
    return sph_policy_loss(c->ctx, c->head, c->loss, ws, bytes);
}

int pol_run(const pol_opts *o, const pol_problem *p, const pol_where *w, pol_result *r) {
    memset(r, 0, sizeof *r);
    sph_ctx_t ctx = NULL;
    sph_device dev;
    run_loss_bufs b;
    memset(&b, 0, sizeof b);
    int rc = 1;
    sph_status s = run_loss_ctx(&ctx, &dev, w->on_cuda, w->device_id, w->threads, w->kernel,
                                w->tp);
    if (s) goto fail;
    const int64_t N = p->N, H = p->H, V = p->V, TK = o->topk;
    const size_t es = (size_t)p->bits / 8;
    const sph_dtype in = p->bits == 32 ? SPH_F32 : (p->is_bf16 ? SPH_BF16 : SPH_F16);
    const run_loss_buf spec[B_COUNT] = {
        {p->h, (size_t)(N * H) * es, 2, N, H, in, 0},
        {p->w, (size_t)(V * H) * es, 2, V, H, in, 0},
        {p->tgt, (size_t)N * 8, 1, N, 0, SPH_I64, 0},
        {p->mask, (size_t)N, 1, N, 0, SPH_U8, 0},
        {p->adv, (size_t)N * 4, 1, N, 0, SPH_F32, 0},
        {p->old, (size_t)N * 4, 1, N, 0, SPH_F32, 0},
        {p->ref, (size_t)N * 4, 1, N, 0, SPH_F32, 0},
        {p->isw, (size_t)N * 4, 1, N, 0, SPH_F32, 0},
        {p->seq, (size_t)N * 8, 1, N, 0, SPH_I64, 0},
        {NULL, (size_t)N * 4, 1, N, 0, SPH_F32, 1},
        {NULL, (size_t)N * 4, 1, N, 0, SPH_F32, 1},
        {NULL, (size_t)(N * H) * 4, 2, N, H, SPH_F32, 1},
        {NULL, (size_t)(V * H) * 4, 2, V, H, SPH_F32, 1},
        {NULL, SPH_POLICY_N_METRICS * 4, 1, SPH_POLICY_N_METRICS, 0, SPH_F32, 1},
        {p->temp, (size_t)N * 4, 1, N, 0, SPH_F32, 0},
        /* the extras, outputs when asked for */
        {NULL, (size_t)(N * TK) * 8, 2, N, TK, SPH_I64, TK > 0},
        {NULL, (size_t)(N * TK) * 4, 2, N, TK, SPH_F32, TK > 0},
        {NULL, (size_t)N * 4, 1, N, 0, SPH_F32, o->sum_p2}};
    if ((s = run_loss_bufs_make(ctx, dev, spec, B_COUNT, &b))) goto fail;
#define T(k) run_loss_tensor(&b, k)
    sph_head_args a = SPH_HEAD_ARGS_INIT;
    a.hidden = T(B_H), a.weight = T(B_W), a.targets = T(B_TGT), a.active_mask = T(B_MASK);
    a.temperature = o->temperature, a.softcap = o->softcap;
    a.temperature_rows = T(B_TEMP);
    a.spans = p->spans, a.n_spans = p->n_spans; /* only the active rows are computed */
    a.vocab_start = w->v0, a.vocab_total = w->V_total;
    a.allreduce_dhidden = w->tp != NULL; /* dhidden of the replicated rows: every shard's */
    a.logprob = T(B_LP), a.entropy = T(B_ENT), a.dhidden = T(B_DH), a.dweight = T(B_DW);
    a.topk_ids = T(B_TKI), a.topk_logprobs = T(B_TKL), a.sum_p2 = T(B_SP2); /* the extras */
    sph_policy_args pa = pol_args(o);
    pa.advantages = T(B_ADV), pa.old_logprob = T(B_OLD), pa.ref_logprob = T(B_REF);
    pa.is_weight = T(B_ISW), pa.seq_id = T(B_SEQ), pa.metrics = T(B_MET);
    pa.seq_comm = w->seq;
    if (w->num_tokens > 0) pa.num_tokens = w->num_tokens;
    if (w->num_seqs > 0) pa.num_seqs = w->num_seqs;
#undef T
    const run_loss_call c = {ctx, &a, &pa, pol_size, pol_call};
    if ((s = run_loss_timed(&c, w->reps, &r->ws_bytes, &r->ms))) goto fail;
    snprintf(r->describe, sizeof r->describe, "%s", sph_ctx_describe(ctx));
    if (!(r->lp = sph_cli_alloc(N, 4)) || !(r->ent = sph_cli_alloc(N, 4)) ||
        !(r->dh = sph_cli_alloc(N * H, 4)) || !(r->dw = sph_cli_alloc(V * H, 4))) {
        sph_cli_fail(CMD, 1, "out of memory");
        goto done;
    }
    if ((s = sph_ctx_memcpy(ctx, r->lp, b.buf[B_LP], spec[B_LP].bytes)) ||
        (s = sph_ctx_memcpy(ctx, r->ent, b.buf[B_ENT], spec[B_ENT].bytes)) ||
        (s = sph_ctx_memcpy(ctx, r->dh, b.buf[B_DH], spec[B_DH].bytes)) ||
        (s = sph_ctx_memcpy(ctx, r->dw, b.buf[B_DW], spec[B_DW].bytes)) ||
        (s = sph_ctx_memcpy(ctx, r->metrics, b.buf[B_MET], spec[B_MET].bytes)))
        goto fail;
    r->topk = TK;
    if ((TK && (!(r->tki = sph_cli_alloc(N * TK, 8)) || !(r->tkl = sph_cli_alloc(N * TK, 4)))) ||
        (o->sum_p2 && !(r->sp2 = sph_cli_alloc(N, 4)))) {
        sph_cli_fail(CMD, 1, "out of memory");
        goto done;
    }
    if ((TK && ((s = sph_ctx_memcpy(ctx, r->tki, b.buf[B_TKI], spec[B_TKI].bytes)) ||
                (s = sph_ctx_memcpy(ctx, r->tkl, b.buf[B_TKL], spec[B_TKL].bytes)))) ||
        (o->sum_p2 && (s = sph_ctx_memcpy(ctx, r->sp2, b.buf[B_SP2], spec[B_SP2].bytes))))
        goto fail;
    rc = 0;
    goto done;
fail:
    run_loss_fail_status(w->kernel, s);
done:
    run_loss_bufs_free(ctx, &b);
    sph_ctx_destroy(ctx);
    if (rc) pol_result_free(r);
    return rc;
}

// ---- check, outputs, report ------------------------------------------------------------------

int pol_compare(const pol_result *got, const pol_result *ref, int64_t N, int64_t H, int64_t V,
                double tol, double err[5]) {
    /* metrics one by one (they mix counts with losses of very different scales), each
     * relative to max(|ref|, 1e-2): a loss near 0 is a sum of O(1) per-token terms of both
     * signs, whose fp32 rounding (~1e-7 each) stays; with a 1e-3 floor a pg_loss of 1.7e-3
     * over 38 tokens failed at 1.8e-4 (mpi_run_policy_io, seed 7957) */
    err[0] = 0;
    for (int k = 0; k < SPH_POLICY_N_METRICS; k++) {
        double e = run_loss_rel(&got->metrics[k], &ref->metrics[k], 1, 1e-2);
        err[0] = e > err[0] ? e : err[0];
    }
    err[1] = run_loss_rel(got->lp, ref->lp, N, 1e-30);
    err[2] = run_loss_rel(got->ent, ref->ent, N, 1e-30);
    err[3] = run_loss_rel(got->dh, ref->dh, N * H, 1e-30);
    err[4] = run_loss_rel(got->dw, ref->dw, V * H, 1e-30);
    int ok = 1;
    for (int k = 0; k < 5; k++) ok &= err[k] <= tol;
    return ok;
}

/* --check of the extras against the reference's (ref ran with K + 1 entries where it could:
 * the K-th entry's gap to the next; K = V has none): ex[0] the top-K log-probs normwise (position by
 * position: robust to the order of near-ties), ex[1] the ids that differ where the
 * reference's log-probs leave a gap above tol to both neighbours, ex[2] sum_p2 normwise. */
int pol_check_extras(const pol_result *got, const pol_result *ref, int64_t N, int64_t V,
                     double tol, double ex[3]) {
    ex[0] = ex[1] = ex[2] = 0;
    const int64_t K = got->topk, KR = ref->topk;
    double md = 0, mr = 1e-30;
    for (int64_t i = 0; i < N && K; i++)
        for (int64_t k = 0; k < K; k++) {
            const double g = got->tkl[i * K + k], r = ref->tkl[i * KR + k], d = fabs(g - r);
            md = isnan(d) ? INFINITY : (d > md ? d : md);
            mr = fabs(r) > mr ? fabs(r) : mr;
            const double gap = tol * (1 + fabs(r));
            const int sep = (k == 0 || ref->tkl[i * KR + k - 1] - r > gap) &&
                            (k + 1 < KR ? r - ref->tkl[i * KR + k + 1] > gap : KR >= V);
            if (sep && got->tki[i * K + k] != ref->tki[i * KR + k]) ex[1]++;
        }
    ex[0] = md / mr;
    if (got->sp2) ex[2] = run_loss_rel(got->sp2, ref->sp2, N, 1e-30);
    return ex[0] <= tol && ex[1] == 0 && ex[2] <= tol;
}

int64_t pol_ref_topk(const pol_opts *o, int64_t V) {
    return o->topk && o->topk < 256 && o->topk < V ? o->topk + 1 : o->topk;
}

char *pol_loss_json(const float *m) {
    char *s = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&s, &len);
    if (!f) return NULL;
    fputc('{', f);
    for (int k = 0; k <= SPH_METRIC_PPO_KL; k++) {
        fprintf(f, "%s\"%s\": ", k ? ", " : "", pol_metric_names[k]);
        sph_cli_json_num(f, "%.9g", (double)m[k]); /* inf / NaN: null */
    }
    fputs("}\n", f);
    int bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) {
        free(s);
        return NULL;
    }
    return s;
}

const char *const pol_out_files[] = {"loss.json",    "logprob.npy",       "entropy.npy",
                                     "dhidden.npy",  "dweight.npy",       "topk_ids.npy",
                                     "topk_logprobs.npy", "sum_p2.npy", NULL};

int pol_outputs_begin(sph_cli_outset *s, const char *dir) {
    if (sph_cli_outset_begin(s, dir, pol_out_files)) return sph_cli_fail(CMD, 1, "%s", s->err);
    return 0;
}

int pol_write_outputs(sph_cli_outset *os, const pol_result *r, int64_t N, int64_t H, int64_t V) {
    sph_cli_outset s = *os; /* begun before the run; released here either way */
    memset(os, 0, sizeof *os);
    char *json = pol_loss_json(r->metrics);
    const int64_t n1[1] = {N}, nh[2] = {N, H}, vh[2] = {V, H}, nk[2] = {N, r->topk};
    int bad = !json || sph_cli_outset_text(&s, "loss.json", json) ||
              sph_cli_outset_npy(&s, "logprob", 'f', 4, 1, n1, r->lp) ||
              sph_cli_outset_npy(&s, "entropy", 'f', 4, 1, n1, r->ent) ||
              sph_cli_outset_npy(&s, "dhidden", 'f', 4, 2, nh, r->dh) ||
              sph_cli_outset_npy(&s, "dweight", 'f', 4, 2, vh, r->dw) ||
              (r->tki && sph_cli_outset_npy(&s, "topk_ids", 'i', 8, 2, nk, r->tki)) ||
              (r->tkl && sph_cli_outset_npy(&s, "topk_logprobs", 'f', 4, 2, nk, r->tkl)) ||
              (r->sp2 && sph_cli_outset_npy(&s, "sum_p2", 'f', 4, 1, n1, r->sp2));
    int rc = run_loss_outputs_end(&s, json, bad);
    free(json);
    return rc;
}

static void report(const pol_opts *o, const pol_problem *p, const pol_result *r, int checked,
                   int passed, const double err[5], const double ex[3], double tol) {
    const int extras = o->topk > 0 || o->sum_p2;
    int64_t act = 0;
    for (int64_t i = 0; i < p->N; i++) act += (!p->mask || p->mask[i]) && p->tgt[i] >= 0;
    const char *dt = p->bits == 32 ? "f32" : (p->is_bf16 ? "bf16" : "f16");
    if (o->json) {
        printf("{\"policy_loss\":\"%s\",\"kl\":\"%s\",\"agg\":\"%s\",\"N\":%lld,\"H\":%lld,"
               "\"V\":%lld,\"active\":%lld,\"dtype\":\"%s\",\"device\":\"%s\",\"ms\":",
               k_losses[o->loss], k_kls[o->kl], k_aggs[o->agg], (long long)p->N, (long long)p->H,
               (long long)p->V, (long long)act, dt, sph_cli_device_names[o->device]);
        /* non-finite numbers as null (json_util.h): a diverged loss still prints valid JSON */
        sph_cli_json_num(stdout, "%.6g", r->ms);
        printf(",\"workspace_bytes\":%zu,\"metrics\":{", r->ws_bytes);
        for (int k = 0; k < SPH_POLICY_N_METRICS; k++) {
            printf("%s\"%s\":", k ? "," : "", pol_metric_names[k]);
            sph_cli_json_num(stdout, "%.9g", (double)r->metrics[k]);
        }
        printf("}");
        if (checked) {
            static const char *const names[5] = {"metrics", "logprob", "entropy", "dhidden",
                                                 "dweight"};
            printf(",\"check\":{\"passed\":%s,\"tol\":%g", passed ? "true" : "false", tol);
            for (int k = 0; k < 5; k++) {
                printf(",\"%s\":", names[k]);
                sph_cli_json_num(stdout, "%.3g", err[k]);
            }
            if (extras) {
                printf(",\"topk_logprobs\":");
                sph_cli_json_num(stdout, "%.3g", ex[0]);
                printf(",\"topk_ids_differing\":%lld,\"sum_p2\":", (long long)ex[1]);
                sph_cli_json_num(stdout, "%.3g", ex[2]);
            }
            printf("}");
        }
        printf("}\n");
        return;
    }
    printf("run: policy loss %s (kl %s, agg %s), N=%lld H=%lld V=%lld active=%lld %s on %s\n",
           k_losses[o->loss], k_kls[o->kl], k_aggs[o->agg], (long long)p->N, (long long)p->H,
           (long long)p->V, (long long)act, dt,
           r->describe[0] ? r->describe : sph_cli_device_names[o->device]);
    printf("  one call: %.3f ms (median of %lld), workspace %.3g MiB\n", r->ms,
           (long long)o->repeats, (double)r->ws_bytes / 1048576.0);
    for (int k = 0; k < SPH_POLICY_N_METRICS; k++)
        printf("  %-18s %.9g\n", pol_metric_names[k], (double)r->metrics[k]);
    if (checked)
        printf("  check vs float64 reference: metrics %.2e logprob %.2e entropy %.2e dhidden %.2e "
               "dweight %.2e (tol %.0e): %s\n",
               err[0], err[1], err[2], err[3], err[4], tol, passed ? "PASS" : "FAIL");
    if (checked && extras)
        printf("  check of the extras: topk_logprobs %.2e, topk_ids differing at separated "
               "ranks %lld, sum_p2 %.2e\n", ex[0], (long long)ex[1], ex[2]);
}

// ---- the command -----------------------------------------------------------------------------

/* run_policy.h */
void pol_opts_defaults(pol_opts *o) {
    memset(o, 0, sizeof *o);
    o->clip_low = o->clip_high = 0.2, o->clip_c = INFINITY, o->temperature = 1.0, o->repeats = 1;
    o->tp = o->cp = o->dp = 1;
}

/* run_policy.h: what the parser cannot judge alone: 0, or an exit code with msg. */
int pol_validate(pol_opts *o, const sph_cli_parsed *pp, char *msg, size_t n) {
    o->dtype_given = sph_cli_given(sph_cli_policy_opts, pp, "--dtype");
    if (!o->inputs) return 2 * sph_cli_err(msg, n, "--policy-loss needs --inputs DIR (see --help)");
    if (o->agg == 3 && !sph_cli_given(sph_cli_policy_opts, pp, "--norm-length"))
        return 2 * sph_cli_err(msg, n, "--agg seq-mean-token-sum-norm needs --norm-length L");
    /* every value the library takes, judged by the library (a usage error with its message) */
    const sph_policy_args pa = pol_args(o);
    return sph_cli_probe_policy(CMD, &pa, o->temperature, o->softcap, o->threads, o->kernel, msg,
                                n);
}

int sph_cli_run_policy(int argc, char **argv) {
    pol_opts o;
    pol_opts_defaults(&o);
    sph_cli_parsed pp = {0};
    char msg[480] = "";
    int done;
    int rc = sph_cli_parse_or_exit(CMD, k_synopsis, k_about, sph_cli_policy_opts, argc, argv, &o,
                                   &pp, &done);
    if (done) return rc;
    if ((rc = pol_validate(&o, &pp, msg, sizeof msg))) return sph_cli_fail(CMD, rc, "%s", msg);
    pol_problem p;
    pol_result r, ref;
    sph_cli_outset os;
    memset(&r, 0, sizeof r), memset(&ref, 0, sizeof ref), memset(&os, 0, sizeof os);
    if ((rc = pol_problem_read(&o, &p))) goto out;
    if (o.outputs && (rc = pol_outputs_begin(&os, o.outputs))) goto out;
    const int on_cuda = o.device == 1;
    pol_where w = {on_cuda, 0, o.kernel, o.threads, (int)o.repeats, NULL, NULL, 0, 0, 0, 0};
    if ((rc = pol_run(&o, &p, &w, &r))) goto out;
    double err[5] = {0}, ex[3] = {0}, tol = 0;
    int passed = 1;
    if (o.check) {
        pol_where wr = {0, 0, "ref", 1, 0, NULL, NULL, 0, 0, 0, 0};
        pol_opts oref = o; /* one more top-k entry where it can: the K-th's gap to the next */
        oref.topk = pol_ref_topk(&o, p.V);
        if ((rc = pol_run(&oref, &p, &wr, &ref))) goto out;
        /* f32: well under 1e-4; bf16 / f16 on the GPU round dlogits to the input dtype */
        tol = p.bits == 32 ? 1e-4 : (on_cuda ? 1e-2 : 1e-4);
        passed = pol_compare(&r, &ref, p.N, p.H, p.V, tol, err);
        if (o.topk || o.sum_p2) passed &= pol_check_extras(&r, &ref, p.N, p.V, tol, ex);
    }
    report(&o, &p, &r, o.check, passed, err, ex, tol);
    rc = passed ? 0 : 1;
    if (!rc && o.outputs) rc = pol_write_outputs(&os, &r, p.N, p.H, p.V);
    if (!rc && !o.json && o.outputs) printf("  outputs written to %s\n", o.outputs);
out:
    sph_cli_outset_abort(&os);
    pol_problem_free(&p);
    pol_result_free(&r), pol_result_free(&ref);
    return sph_cli_close_stdout(CMD, rc);
}
