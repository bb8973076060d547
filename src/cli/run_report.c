/*
 * run_report.c - what `spanhead run` says about a run: the check against the float64
 * reference (only what was computed: without an upstream gradient there is no backward, and
 * the check says so instead of comparing zeros), the outputs (written atomically, and only
 * after the check passed), and the report as a table or as one JSON object (--json).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "half.h"
#include "json_util.h"
#include "msg.h"
#include "run.h"

const char *const run_out_names[RUN_N_OUT] = {"logprob", "entropy", "lse", "logit_mean",
                                              "dhidden", "dweight", "sum_p2",
                                              "topk_logprobs", "topk_ids"};
const char *const run_out_files[RUN_N_OUT + 1] = {"logprob.npy", "entropy.npy", "lse.npy",
                                                 "logit_mean.npy", "dhidden.npy", "dweight.npy",
                                                 "sum_p2.npy", "topk_logprobs.npy",
                                                 "topk_ids.npy", NULL};
const int run_out_buf[RUN_N_OUT] = {T_LP, T_ENT, T_LSE, T_LM, T_DH, T_DW, T_SP2, T_TKL, T_TKI};

/* max |got - ref| / max |ref| (normwise), NaN -> inf. */
static double rel_err(const float *got, const float *ref, int64_t n) {
    double md = 0, mr = 0;
    for (int64_t k = 0; k < n; k++) {
        double dd = fabs((double)got[k] - (double)ref[k]);
        if (isnan(dd)) return INFINITY;
        if (dd > md) md = dd;
        if (fabs((double)ref[k]) > mr) mr = fabs((double)ref[k]);
    }
    return md / (mr > 0 ? mr : 1.0);
}

/* topk (--topk K) against the reference's K' = min(K + 1, V) best: the log-probs normwise
 * into err[7]; into err[8] the ids that differ where the reference's log-probs leave a gap
 * above the tolerance to both neighbours (near-ties may come out in either order), a count. */
static void check_topk(const run_result *r, const float *rl, const int64_t *ri, int64_t N,
                       int64_t K, int64_t Kr, double *err_lp, double *err_ids) {
    const float *gl = r->out[7];
    const int64_t *gi = (const int64_t *)r->out[RUN_OUT_IDS];
    double md = 0, mr = 0, bad = 0;
    for (int64_t i = 0; i < N; i++)
        for (int64_t k = 0; k < K; k++) {
            const double ref = rl[i * Kr + k], d = fabs((double)gl[i * K + k] - ref);
            if (isnan(d)) md = INFINITY;
            else if (d > md) md = d;
            if (fabs(ref) > mr) mr = fabs(ref);
            const double gap = r->tol * (1 + fabs(ref));
            const int sep = (k == 0 || rl[i * Kr + k - 1] - ref > gap) &&
                            (k + 1 >= Kr || ref - rl[i * Kr + k + 1] > gap);
            if (sep && gi[i * K + k] != ri[i * Kr + k]) bad++;
        }
    *err_lp = md / (mr > 0 ? mr : 1.0);
    *err_ids = bad;
}

/* The budget of fp32 logits (issue 26 case 9). The kernels' logits carry the rounding of an
 * fp32 product: |dz_ij| ~ zeta_i = 2^-24 * 2 |h_i| max_j |w_j| / T (T_i with per-row
 * temperatures; the scaling by 1 / T of
 * |u_ij| <= |h_i| |w_j|, plus the product's accumulation, a random walk of about the same
 * size; softcap's tanh' <= 1 only shrinks it). What moves with the logits:
 *   - the entropy, dH_i = -sum_j p_ij (z_ij - mu_i) dz_ij, so |dH_i| <= 2 (m_i - mu_i) zeta_i
 *     <= 2 H_i zeta_i (z <= m and m <= lse): at T = 1 far below the tolerance, at T = 0.01
 *     what fp32 logits allow (the float64 entropy of correctly rounded fp32 logits is that far
 *     from the reference's); each row's error beyond its budget counts, normwise as the
 *     others: max_i max(0, |d_i| - 2 H_i zeta_i) / max|ref|;
 *   - the gradients, through p_ij (1 + dz_ij): relative to their norm about max_i zeta_i,
 *     added to the tolerance.
 * logprob and lse move by zeta_i against |lse_i| ~ |z|: inside the tolerance at any T. */
static void logit_budget(const run_problem *p, const run_opts *o, double *zeta_row) {
    double wmax = 0;
    for (int64_t j = 0; j < p->V; j++) {
        double s = 0;
        for (int64_t k = 0; k < p->H; k++) {
            double x = sph_cli_load_float(p->w, j * p->H + k, p->bits, p->is_bf16);
            s += x * x;
        }
        if (s > wmax) wmax = s;
    }
    const double c = ldexp(1.0, -23) * sqrt(wmax);
    for (int64_t i = 0; i < p->N; i++) {
        double hn = 0;
        for (int64_t k = 0; k < p->H; k++) {
            double x = sph_cli_load_float(p->h, i * p->H + k, p->bits, p->is_bf16);
            hn += x * x;
        }
        /* the row's own temperature with temperature.npy (validated by the run itself) */
        const double T = p->temp ? (double)p->temp[i] : o->temperature;
        zeta_row[i] = c * sqrt(hn) / T;
    }
}

static double entropy_err(const run_problem *p, const double *zeta, const float *got,
                          const float *ref, double *budget) {
    double mr = 0, md = 0, bmax = 0;
    for (int64_t i = 0; i < p->N; i++)
        if (fabs((double)ref[i]) > mr) mr = fabs((double)ref[i]);
    for (int64_t i = 0; i < p->N; i++) {
        double dd = fabs((double)got[i] - (double)ref[i]);
        if (isnan(dd)) return INFINITY;
        double b = 2.0 * fabs((double)ref[i]) * zeta[i];
        if (b > bmax) bmax = b;
        if (dd - b > md) md = dd - b;
    }
    *budget = bmax / (mr > 0 ? mr : 1.0);
    return md / (mr > 0 ? mr : 1.0);
}

/* An output's note: the part of its budget the fp32 logits' rounding added (logit_budget). */
static const char *budget_note(const run_result *r, int k) {
    static char buf[112];
    buf[0] = 0;
    if (k == 1 && r->ent_budget > 0)
        snprintf(buf, sizeof buf, "  (beyond each row's fp32-logit budget 2 H_i zeta_i, up to "
                 "%.1e)", r->ent_budget);
    else if ((k == 4 || k == 5) && r->tol_k[k] > r->tol)
        snprintf(buf, sizeof buf, "  (tolerance + zeta %.1e = %.1e)", r->zeta, r->tol_k[k]);
    return buf;
}

int run_check(const run_problem *p, const run_opts *o, int on_cuda, run_result *r) {
    run_device ref;
    double t0 = sph_cli_now_s(), a_, b_;
    run_opts ro = *o; /* top-k: one more entry, the neighbour of the K-th */
    if (o->topk && o->topk < p->V_total && o->topk < 256) ro.topk = o->topk + 1;
    sph_status s = run_device_setup(&ref, p, &ro, 0, "ref", 1);
    if (!s) s = run_device_pass(&ref, &a_, &b_);
    if (s) {
        int rc = sph_cli_fail(RUN_CMD, 1, "reference: %s: %s", sph_status_str(s), sph_last_error());
        run_device_free(&ref);
        return rc;
    }
    /* f32: well under 1e-4 everywhere. Half inputs on the GPU round dlogits to the input
     * dtype before the tensor-core products (2^-9 relative for bf16), so their budget is the
     * 1e-2 of bf16 arithmetic; on the CPU half inputs are widened once and everything after
     * runs in f32. */
    r->tol = p->bits == 32 ? 1e-4 : (on_cuda ? 1e-2 : 1e-4);
    r->checked = 1;
    r->passed = 1;
    double *zeta = (double *)calloc(p->N > 0 ? (size_t)p->N : 1, sizeof *zeta);
    if (!zeta) {
        run_device_free(&ref);
        return sph_cli_fail(RUN_CMD, 1, "check: out of host memory");
    }
    logit_budget(p, o, zeta);
    r->zeta = 0;
    for (int64_t i = 0; i < p->N; i++)
        if ((!p->mask || p->mask[i]) && zeta[i] > r->zeta) r->zeta = zeta[i];
    for (int k = 0; k < RUN_N_OUT; k++) {
        if (!r->have[k] || RUN_OUT_TOPK(k)) continue;
        float *x = run_device_get(&ref, run_out_buf[k]);
        double tol = r->tol;
        if (x && k == 1 && r->count[k] == p->N) {
            r->err[k] = entropy_err(p, zeta, r->out[k], x, &r->ent_budget);
        } else {
            r->err[k] = x ? rel_err(r->out[k], x, r->count[k]) : INFINITY;
            if (k == 4 || k == 5) tol += r->zeta; /* dhidden, dweight */
        }
        r->tol_k[k] = tol;
        r->passed &= r->err[k] <= tol;
        free(x);
    }
    if (o->topk) {
        float *rl = run_device_get(&ref, T_TKL), *ri = run_device_get(&ref, T_TKI);
        r->err[7] = r->err[RUN_OUT_IDS] = INFINITY;
        r->tol_k[7] = r->tol, r->tol_k[RUN_OUT_IDS] = 0; /* (ids: a count, 0 to pass) */
        if (rl && ri)
            check_topk(r, rl, (const int64_t *)ri, p->N, o->topk, ro.topk, &r->err[7],
                       &r->err[RUN_OUT_IDS]);
        r->passed &= r->err[7] <= r->tol && r->err[RUN_OUT_IDS] == 0;
        free(rl), free(ri);
    }
    free(zeta);
    r->check_s = sph_cli_now_s() - t0;
    run_device_free(&ref);
    return 0;
}

int run_write_outputs(const run_problem *p, const run_opts *o, run_result *r, sph_cli_outset *os) {
    sph_cli_outset s = *os; /* the set begun before the run; released here either way */
    memset(os, 0, sizeof *os);
    for (int k = 0; k < RUN_N_OUT; k++) {
        if (!r->have[k]) continue;
        int64_t sh[2] = {RUN_OUT_PER_ROW(k) || k == 4 || RUN_OUT_TOPK(k) ? p->N : p->V,
                         RUN_OUT_TOPK(k) ? o->topk : p->H};
        const int ids = k == RUN_OUT_IDS;
        if (sph_cli_outset_npy(&s, run_out_names[k], ids ? 'i' : 'f', ids ? 8 : 4,
                               RUN_OUT_PER_ROW(k) ? 1 : 2, sh, r->out[k]))
            return sph_cli_fail(RUN_CMD, 1, "%s (nothing was written to %s)", s.err, o->outputs);
    }
    if (sph_cli_outset_commit(&s)) return sph_cli_fail(RUN_CMD, 1, "%s", s.err);
    r->outputs_written = o->outputs;
    return 0;
}

static const char *dtype_name(const run_problem *p) {
    return p->bits == 32 ? "f32" : (p->is_bf16 ? "bf16" : "f16");
}

static void list_missing(char *buf, size_t n, const run_result *r) {
    buf[0] = '\0';
    for (int k = 0; k < RUN_N_OUT; k++)
        if (!r->have[k] && RUN_OUT_LISTED(k)) {
            size_t l = strlen(buf);
            snprintf(buf + l, n - l, "%s%s", l ? ", " : "", run_out_names[k]);
        }
}

void run_report_text(const run_problem *p, const run_opts *o, const run_result *r) {
    printf("spanhead run: %s | %s\n", r->describe, p->source);
    char tbuf[32];
    if (p->temp) snprintf(tbuf, sizeof tbuf, "per-row");
    else snprintf(tbuf, sizeof tbuf, "%g", o->temperature);
    printf("  N=%lld H=%lld V_loc=%lld vocab=[%lld, %lld) of %lld dtype=%s mask=%s T=%s "
           "softcap=%g%s%s\n",
           (long long)p->N, (long long)p->H, (long long)p->V, (long long)p->v0,
           (long long)(p->v0 + p->V), (long long)p->V_total, dtype_name(p), p->mask_name,
           tbuf, o->softcap, p->K ? " support-K" : "",
           o->one_pass && p->grads ? " one-pass" : "");
    if (p->n_seq)
        printf("  packed sequences: %lld, spans: %lld\n", (long long)p->n_seq, (long long)p->n_spans);
    if (!p->grads)
        printf("  no upstream gradient given (dlogprob, dentropy, dlse, dlogit_mean): forward "
               "only, no dhidden or dweight\n");
    printf("\n  %8s %8s %10s %10s %10s %12s %12s %14s\n", "rows", "active", "fwd ms", "bwd ms",
           "GFLOP/s", "floor ms", "x floor", "workspace");
    char fl[32] = "-", ra[32] = "-", bw[32] = "-";
    if (r->floor_s > 0) {
        snprintf(fl, sizeof fl, "%.2f", r->floor_s * 1e3);
        snprintf(ra, sizeof ra, "%.2f", (r->fwd_s + r->bwd_s) / r->floor_s);
    }
    if (p->grads && !o->one_pass) snprintf(bw, sizeof bw, "%.2f", r->bwd_s * 1e3);
    printf("  %8lld %8lld %10.2f %10s %10.1f %12s %12s %11.1f MB\n", (long long)p->N,
           (long long)p->n_act, r->fwd_s * 1e3, bw, r->work / (r->fwd_s + r->bwd_s) / 1e9, fl, ra,
           (double)r->ws_bytes / (1 << 20));
    if (r->rate > 0)
        printf("  floor = %s N_active H V_loc flops at this machine's sgemm rate %.1f GFLOP/s "
               "(measured now)%s\n",
               !p->grads ? "2" : o->one_pass ? "6" : "8", r->rate / 1e9,
               o->one_pass && p->grads ? "; one-pass" : "");
    printf("  median of %d timed runs after a warm-up; dense logits would be %.1f MB\n", r->reps,
           (double)p->N * (double)p->V * 4.0 / (1 << 20));
    if (r->outputs_written) printf("  outputs written to %s\n", r->outputs_written);
    if (!r->checked) return;
    printf("\n  check against the float64 reference (%.1f s), normwise max|got - ref| / "
           "max|ref|, tolerance %.0e:\n",
           r->check_s, r->tol);
    for (int k = 0; k < RUN_N_OUT; k++)
        if (r->have[k] && k == RUN_OUT_IDS)
            printf("    %-13s %8.0f  %s\n", run_out_names[k], r->err[k],
                   r->err[k] == 0 ? "ids differ where the reference's gaps exceed the "
                                    "tolerance: ok"
                                  : "ids differ where the reference's gaps exceed the "
                                    "tolerance: FAILED");
        else if (r->have[k])
            printf("    %-13s %8.2e  %s%s\n", run_out_names[k], r->err[k],
                   r->err[k] <= r->tol_k[k] ? "ok" : "OUT OF TOLERANCE", budget_note(r, k));
    char miss[128];
    list_missing(miss, sizeof miss, r);
    if (miss[0]) printf("    not computed, not checked: %s\n", miss);
    if (r->passed) printf("  check passed\n");
}

static void json_str(const char *s) { sph_cli_json_str(stdout, s); }
static void json_num(double x) { sph_cli_json_num(stdout, "%.6g", x); }

void run_report_json(const run_problem *p, const run_opts *o, const run_result *r) {
    printf("{\"command\":\"run\",\"context\":");
    json_str(r->describe);
    printf(",\"source\":");
    json_str(p->source);
    printf(",\"N\":%lld,\"H\":%lld,\"V_loc\":%lld,\"vocab_start\":%lld,\"vocab_total\":%lld,"
           "\"dtype\":\"%s\",\"mask\":",
           (long long)p->N, (long long)p->H, (long long)p->V, (long long)p->v0,
           (long long)p->V_total, dtype_name(p));
    json_str(p->mask_name);
    printf(",\"active_rows\":%lld,\"spans\":%lld,\"packed_sequences\":%lld,\"support\":%lld,"
           "\"temperature\":",
           (long long)p->n_act, (long long)p->n_spans, (long long)p->n_seq, (long long)p->K);
    if (p->temp) json_str("per-row");
    else json_num(o->temperature);
    printf(",\"softcap\":");
    json_num(o->softcap);
    printf(",\"one_pass\":%s,\"backward\":%s,\"repeats\":%d,\"forward_ms\":",
           o->one_pass && p->grads ? "true" : "false", p->grads ? "true" : "false", r->reps);
    json_num(r->fwd_s * 1e3);
    printf(",\"backward_ms\":");
    if (p->grads && !o->one_pass) json_num(r->bwd_s * 1e3);
    else printf("null");
    printf(",\"floor_flops\":");
    json_num(r->work);
    printf(",\"gemm_rate_gflops\":");
    if (r->rate > 0) json_num(r->rate / 1e9);
    else printf("null");
    printf(",\"floor_ms\":");
    if (r->floor_s > 0) json_num(r->floor_s * 1e3);
    else printf("null");
    printf(",\"ratio\":");
    if (r->floor_s > 0) json_num((r->fwd_s + r->bwd_s) / r->floor_s);
    else printf("null");
    printf(",\"workspace_bytes\":%zu,\"dense_logits_bytes\":%.0f,\"outputs\":", r->ws_bytes,
           (double)p->N * (double)p->V * 4.0);
    if (r->outputs_written) json_str(r->outputs_written);
    else printf("null");
    printf(",\"computed\":[");
    for (int k = 0, first = 1; k < RUN_N_OUT; k++)
        if (r->have[k]) printf("%s\"%s\"", first ? "" : ",", run_out_names[k]), first = 0;
    printf("],\"check\":");
    if (!r->checked) {
        printf("null}\n");
        return;
    }
    printf("{\"reference\":\"float64\",\"seconds\":");
    json_num(r->check_s);
    printf(",\"tolerance\":");
    json_num(r->tol);
    printf(",\"errors\":{");
    for (int k = 0, first = 1; k < RUN_N_OUT; k++)
        if (r->have[k]) {
            printf("%s\"%s\":", first ? "" : ",", run_out_names[k]);
            json_num(r->err[k]);
            first = 0;
        }
    printf("},\"tolerances\":{");
    for (int k = 0, first = 1; k < RUN_N_OUT; k++)
        if (r->have[k]) {
            printf("%s\"%s\":", first ? "" : ",", run_out_names[k]);
            json_num(r->tol_k[k]);
            first = 0;
        }
    printf("},\"logit_zeta\":");
    json_num(r->zeta);
    printf(",\"not_computed\":[");
    for (int k = 0, first = 1; k < RUN_N_OUT; k++)
        if (!r->have[k] && RUN_OUT_LISTED(k))
            printf("%s\"%s\"", first ? "" : ",", run_out_names[k]), first = 0;
    printf("],\"passed\":%s}}\n", r->passed ? "true" : "false");
}
