/*
 * policy_ref.c - the float64 reference of the fused policy loss: the head's float64 rows
 * (head_ref.c), the aggregation weights and the sequence statistics by plain quadratic loops
 * over the group rows (no sorting: it reads like the definitions in spanhead.h), the per-row
 * function of policy_math.h, and the head's float64 backward with the resulting upstream
 * gradients. The oracle of every policy test; selected by force_kernel = "ref" on a CPU
 * context. Allocates its scratch with malloc (never a hot path).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "head/host.h"
#include "policy/policy.h"

static int64_t target_of(const sph_head_plan *p, int64_t i) {
    return p->tgt_i64 ? ((const int64_t *)p->targets)[i]
                      : (int64_t)((const int32_t *)p->targets)[i];
}

/* Group-row records exchanged over seq_comm: sequence id, active flag, delta. */
typedef struct grow {
    int64_t seq;
    int64_t act;
    double delta;
} grow;

typedef struct core_out {
    uint8_t *act;              /* (N) */
    double *logp, *ent;        /* (N) */
    double *stats;             /* (N, 3) m, lse, mu */
    double *g, *e;             /* (N) */
    double metrics[SPH_POLICY_N_METRICS];
} core_out;

static void core_free(core_out *o) {
    sph_free(o->act);
    sph_free(o->logp);
    sph_free(o->ent);
    sph_free(o->stats);
    sph_free(o->g);
    sph_free(o->e);
    memset(o, 0, sizeof *o);
}

/* Rows, weights, sequence statistics, per-row gradients and metrics, all in float64. at_lp /
 * at_ent (each may be NULL): the active rows' log-probs / entropies taken from there instead
 * of the head's float64 rows. scale (may be NULL): each metric's sum of |row contribution|. */
static sph_status ref_core(const sph_policy_plan *pp, const float *at_lp, const float *at_ent,
                           core_out *o, double *scale) {
    const sph_head_plan *hp = &pp->head;
    const int64_t N = hp->N, P = pp->group, G = P * N;
    memset(o, 0, sizeof *o);
    sph_status st = SPH_OK;
    double *rows = sph_malloc(((size_t)N * 7 + 1) * sizeof *rows);
    grow *mine = sph_malloc(((size_t)N + 1) * sizeof *mine);
    grow *all = P > 1 ? sph_malloc(((size_t)G + 1) * sizeof *all) : mine;
    int64_t *tj = sph_malloc(((size_t)N + 1) * sizeof *tj);
    o->act = sph_malloc((size_t)N + 1);
    o->logp = sph_calloc((size_t)N + 1, sizeof(double));
    o->ent = sph_calloc((size_t)N + 1, sizeof(double));
    o->stats = sph_calloc((size_t)N * 3 + 1, sizeof(double));
    o->g = sph_calloc((size_t)N + 1, sizeof(double));
    o->e = sph_calloc((size_t)N + 1, sizeof(double));
    if (!rows || !mine || !all || !tj || !o->act || !o->logp || !o->ent || !o->stats || !o->g ||
        !o->e) {
        st = sph_err(SPH_ERR_ALLOC, "policy_ref: out of host memory (N = %lld)", (long long)N);
        goto done;
    }
    // rows: the head's float64 statistics
    sph_head_active_rows(hp, o->act);
    for (int64_t i = 0; i < N; i++) o->act[i] = o->act[i] && target_of(hp, i) >= 0;
    st = sph_head_ref_rows_f64(hp, rows);
    if (st != SPH_OK) goto done;
    for (int64_t i = 0; i < N; i++) {
        if (!o->act[i]) continue;
        o->logp[i] = at_lp ? (double)at_lp[i] : rows[i * 7 + 0];
        o->ent[i] = at_ent ? (double)at_ent[i] : rows[i * 7 + 1];
        for (int f = 0; f < 3; f++) o->stats[i * 3 + f] = rows[i * 7 + 4 + f];
    }
    // the group rows
    for (int64_t i = 0; i < N; i++) {
        mine[i].seq = pp->seq ? pp->seq[i] : 0;
        mine[i].act = o->act[i];
        mine[i].delta = o->act[i] ? o->logp[i] - pp->old[i] : 0.0;
    }
    if (P > 1) {
        st = sph_policy_gather_host(pp, mine, all, (size_t)N * sizeof *mine);
        if (st != SPH_OK) goto done;
    }
    const grow *me = all + pp->rank * N; /* this rank's rows among the group rows */
    // T, S, T_j
    int64_t T = 0, S = 0;
    for (int64_t k = 0; k < G; k++) {
        if (!all[k].act) continue;
        T++;
        int first = 1; /* the first active group row of its sequence counts it */
        for (int64_t m = 0; m < k && first && pp->seq; m++)
            if (all[m].act && all[m].seq == all[k].seq) first = 0;
        S += first && pp->seq;
    }
    for (int64_t i = 0; i < N; i++) {
        tj[i] = 0;
        if (!me[i].act || !pp->seq) continue;
        for (int64_t k = 0; k < G; k++) tj[i] += all[k].act && all[k].seq == me[i].seq;
    }
    const double Tu = pp->num_tokens > 0 ? (double)pp->num_tokens : (double)T;
    const double Su = pp->num_seqs > 0 ? (double)pp->num_seqs : (double)S;
    double acc[SPH_PM_N_ACC] = {0}, row[SPH_PM_N_ACC], mag[SPH_PM_N_ACC] = {0};
    for (int64_t i = 0; i < N; i++) {
        if (!o->act[i]) continue;
        double c = 0;
        switch (pp->agg) {
        case SPH_AGG_TOKEN_MEAN: c = 1.0 / Tu; break;
        case SPH_AGG_SEQ_MEAN_TOKEN_SUM: c = 1.0 / Su; break;
        case SPH_AGG_SEQ_MEAN_TOKEN_MEAN: c = 1.0 / (Su * (double)tj[i]); break;
        default: c = 1.0 / (Su * pp->norm_length); break;
        }
        double rho = 0;
        if (pp->coef.loss == SPH_PM_GSPO) {
            /* mean delta over the active group rows of the sequence, in group-row order */
            for (int64_t k = 0; k < G; k++)
                if (all[k].act && all[k].seq == me[i].seq) rho += all[k].delta;
            rho /= (double)tj[i];
        }
        const double w = pp->isw ? pp->isw[i] : 1.0;
        const double q = pp->ref ? pp->ref[i] : 0.0;
        sph_policy_row_full(&pp->coef, c, w, o->logp[i], o->ent[i], pp->adv[i], pp->old[i], q,
                            rho, &o->g[i], &o->e[i], row);
        for (int f = 0; f < SPH_PM_N_ACC; f++) acc[f] += row[f], mag[f] += fabs(row[f]);
    }
    const double Tm = pp->num_tokens > 0 ? (double)pp->num_tokens : (double)T;
    double *m = o->metrics;
    m[SPH_METRIC_LOSS] = acc[SPH_PM_ACC_LOSS];
    m[SPH_METRIC_PG_LOSS] = acc[SPH_PM_ACC_PG];
    m[SPH_METRIC_KL_LOSS] = acc[SPH_PM_ACC_KL];
    m[SPH_METRIC_ENTROPY_LOSS] = acc[SPH_PM_ACC_ENT];
    m[SPH_METRIC_PG_CLIPFRAC] = Tm > 0 ? acc[SPH_PM_ACC_CLIP] / Tm : 0.0;
    m[SPH_METRIC_PG_CLIPFRAC_LOWER] = Tm > 0 ? acc[SPH_PM_ACC_LOWER] / Tm : 0.0;
    m[SPH_METRIC_PPO_KL] = Tm > 0 ? acc[SPH_PM_ACC_NKL] / Tm : 0.0;
    m[SPH_METRIC_TOKENS] = (double)T;
    m[SPH_METRIC_SEQS] = (double)S;
    if (scale) {
        /* the sums of magnitudes; the counts and the clip fractions are exact */
        for (int k = 0; k < SPH_POLICY_N_METRICS; k++) scale[k] = 0.0;
        scale[SPH_METRIC_LOSS] = mag[SPH_PM_ACC_LOSS];
        scale[SPH_METRIC_PG_LOSS] = mag[SPH_PM_ACC_PG];
        scale[SPH_METRIC_KL_LOSS] = mag[SPH_PM_ACC_KL];
        scale[SPH_METRIC_ENTROPY_LOSS] = mag[SPH_PM_ACC_ENT];
        scale[SPH_METRIC_PPO_KL] = Tm > 0 ? mag[SPH_PM_ACC_NKL] / Tm : 0.0;
    }
done:
    sph_free(rows);
    if (all != mine) sph_free(all);
    sph_free(mine);
    sph_free(tj);
    if (st != SPH_OK) core_free(o);
    return st;
}

sph_status sph_policy_ref_f64(const sph_policy_plan *pp, double *metrics, double *logp,
                              double *ent, double *dh, double *dw) {
    const sph_head_plan *hp = &pp->head;
    core_out o;
    SPH_TRY(ref_core(pp, NULL, NULL, &o, NULL));
    const int64_t N = hp->N;
    if (metrics) memcpy(metrics, o.metrics, sizeof o.metrics);
    if (logp) memcpy(logp, o.logp, (size_t)N * sizeof *logp);
    if (ent) memcpy(ent, o.ent, (size_t)N * sizeof *ent);
    sph_status st = SPH_OK;
    if (dh || dw) {
        float *g = sph_malloc(((size_t)N + 1) * sizeof *g), *e = sph_malloc(((size_t)N + 1) * sizeof *e);
        if (!g || !e) {
            st = sph_err(SPH_ERR_ALLOC, "policy_ref: out of host memory (N = %lld)", (long long)N);
        } else {
            for (int64_t i = 0; i < N; i++) g[i] = (float)o.g[i], e[i] = (float)o.e[i];
            sph_head_plan b = *hp;
            b.mask = o.act;
            b.dlogprob = g;
            b.dentropy = e;
            b.dlse = b.dlogit_mean = NULL;
            st = sph_head_ref_backward_f64(&b, o.stats, dh, dw);
        }
        sph_free(g);
        sph_free(e);
    }
    core_free(&o);
    return st;
}

sph_status sph_policy_ref_metrics_at(const sph_policy_plan *pp, const float *logp,
                                     const float *ent, double *metrics, double *scale) {
    core_out o;
    SPH_TRY(ref_core(pp, logp, ent, &o, scale));
    memcpy(metrics, o.metrics, sizeof o.metrics);
    core_free(&o);
    return SPH_OK;
}

static sph_status ref_workspace(sph_ctx_t ctx, const sph_policy_plan *pp, size_t *bytes) {
    (void)ctx, (void)pp;
    *bytes = 0; /* the reference allocates its own scratch */
    return SPH_OK;
}

static sph_status ref_run(sph_ctx_t ctx, const sph_policy_plan *pp, void *ws, size_t bytes) {
    (void)ws, (void)bytes;
    const sph_head_plan *hp = &pp->head;
    core_out o;
    SPH_TRY(ref_core(pp, NULL, NULL, &o, NULL));
    const int64_t N = hp->N;
    float *g = sph_malloc(((size_t)N + 1) * sizeof *g), *e = sph_malloc(((size_t)N + 1) * sizeof *e);
    float *stats = hp->stats ? NULL : sph_malloc(((size_t)N * 3 + 1) * sizeof *stats);
    sph_status st = SPH_OK;
    if (!g || !e || (!hp->stats && !stats)) {
        st = sph_err(SPH_ERR_ALLOC, "policy_ref: out of host memory (N = %lld)", (long long)N);
        goto done;
    }
    for (int64_t i = 0; i < N; i++) g[i] = (float)o.g[i], e[i] = (float)o.e[i];
    if (pp->coef.loss == SPH_PM_GSPO && hp->one_pass) {
        /* gspo's gradients come from a backward after the forward, and a backward refuses
         * upstream gradients that are not finite (as the optimized backends' do): a loss
         * gradient beyond float (advantages or weights near FLT_MAX) is refused, not written */
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < N; i++)
            if (o.act[i] && !(isfinite(g[i]) && isfinite(e[i]))) bad++, first = first < 0 ? i : first;
        if (bad) {
            st = sph_err(SPH_ERR_NONFINITE,
                         "policy (gspo): %lld active rows have a loss gradient beyond float "
                         "range, the first row %lld (advantages or is_weight near FLT_MAX?); "
                         "nothing written", (long long)bad, (long long)first);
            goto done;
        }
    }
    /* the head's reference writes the per-row outputs, stats and gradients with its rules
     * (inactive rows 0, accumulate, all-reduce); the loss's rows are its active rows */
    sph_head_plan b = *hp;
    b.mask = o.act;
    if (!b.stats) b.stats = stats;
    b.dlogprob = g;
    b.dentropy = pp->coef.eta != 0 ? e : NULL;
    b.dlse = b.dlogit_mean = NULL;
    st = sph_head_ref_forward(ctx, &b);
    if (st != SPH_OK) goto done;
    for (int k = 0; k < SPH_POLICY_N_METRICS; k++) pp->metrics[k] = (float)o.metrics[k];
done:
    sph_free(g);
    sph_free(e);
    sph_free(stats);
    core_free(&o);
    return st;
}

const sph_policy_backend sph_policy_ref_backend = {"ref", ref_workspace, ref_run};
