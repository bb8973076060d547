/*
 * test_policy_ref.c - the float64 reference of the fused policy loss against an independent
 * implementation written here from the formulas (values and every metric), its
 * gradients against central finite differences of that implementation through the head's
 * float64 rows (L as a function of hidden and weight; for cispo and gspo the stop-gradient
 * quantities held at the base point, which is what sg means), for every loss x KL x
 * aggregation; the tie rules; TP shards in threads (every rank the same bits); and a sequence
 * group (seq_comm) splitting sequences across ranks against the single call.
 */
#include "test_policy_case.h"

// ---- the loss written from the text -----------------------------------------------

typedef struct naive {
    const pcase *c;
    const uint8_t *act;   /* active rows */
    const double *logp0;  /* base-point log-probs (stop-gradient values) */
    double clip_c, lo, hi, beta, eta;
} naive;

static double clampd(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

/* L and the metrics for log-probs logp and entropies ent (the base point when logp = logp0). */
static double naive_loss(const naive *n, const double *logp, const double *ent, double *met) {
    const pcase *c = n->c;
    const sph_policy_args *p = &c->p;
    const int64_t N = c->h.N;
    const int need_seq = p->agg != SPH_AGG_TOKEN_MEAN || p->loss == SPH_PG_GSPO;
    int64_t T = 0, S = 0;
    for (int64_t i = 0; i < N; i++) {
        if (!n->act[i]) continue;
        T++;
        int first = 1;
        for (int64_t m = 0; m < i; m++) first &= !(n->act[m] && c->seq[m] == c->seq[i]);
        S += first;
    }
    double Tu = p->num_tokens ? (double)p->num_tokens : (double)T;
    double Su = p->num_seqs ? (double)p->num_seqs : (double)S;
    double L = 0, pgl = 0, kll = 0, entl = 0, clip = 0, lower = 0, nkl = 0;
    for (int64_t i = 0; i < N; i++) {
        if (!n->act[i]) continue;
        int64_t Tj = 0;
        double rho0 = 0;
        for (int64_t m = 0; m < N; m++)
            if (n->act[m] && c->seq[m] == c->seq[i]) Tj++, rho0 += n->logp0[m] - c->old[m];
        rho0 /= (double)Tj;
        double ci = p->agg == SPH_AGG_TOKEN_MEAN            ? 1 / Tu
                    : p->agg == SPH_AGG_SEQ_MEAN_TOKEN_SUM  ? 1 / Su
                    : p->agg == SPH_AGG_SEQ_MEAN_TOKEN_MEAN ? 1 / (Su * (double)Tj)
                                                            : 1 / (Su * p->norm_length);
        double A = c->adv[i], w = p->is_weight ? c->isw[i] : 1.0, d = logp[i] - c->old[i];
        double r, pg;
        if (p->loss == SPH_PG_GSPO) {
            double lr = logp[i] - n->logp0[i] + rho0;
            r = exp(lr > 10 ? 10 : lr); /* clamped: constant (FD never crosses it) */
        } else {
            r = exp(clampd(d, -20, 20));
        }
        double cr = clampd(r, n->lo, n->hi);
        if (p->loss == SPH_PG_CISPO) {
            double r0 = exp(clampd(n->logp0[i] - c->old[i], -20, 20));
            pg = -A * clampd(r0, n->lo, n->hi) * logp[i];
            clip += -A * cr > -A * r;
        } else {
            pg = fmax(-A * r, -A * cr);
            clip += -A * cr > -A * r;
            if (A < 0 && n->clip_c < HUGE_VAL) {
                lower += pg > -A * n->clip_c;
                pg = fmin(pg, -A * n->clip_c);
            }
        }
        double kl = 0, x = (p->ref_logprob ? c->ref[i] : 0) - logp[i];
        if (p->kl == SPH_KL_K1) kl = -x;
        if (p->kl == SPH_KL_K2) kl = x * x / 2;
        if (p->kl == SPH_KL_K3) {
            double xh = clampd(x, -20, 20);
            kl = clampd(exp(xh) - xh - 1, -10, 10);
        }
        L += ci * (w * pg + n->beta * kl - n->eta * ent[i]);
        pgl += ci * w * pg, kll += ci * kl, entl += ci * ent[i];
        nkl += -d;
    }
    if (met) {
        double Tm = p->num_tokens ? (double)p->num_tokens : (double)T;
        met[SPH_METRIC_LOSS] = L, met[SPH_METRIC_PG_LOSS] = pgl, met[SPH_METRIC_KL_LOSS] = kll;
        met[SPH_METRIC_ENTROPY_LOSS] = entl;
        met[SPH_METRIC_PG_CLIPFRAC] = Tm ? clip / Tm : 0;
        met[SPH_METRIC_PG_CLIPFRAC_LOWER] = Tm ? lower / Tm : 0;
        met[SPH_METRIC_PPO_KL] = Tm ? nkl / Tm : 0;
        met[SPH_METRIC_TOKENS] = (double)T, met[SPH_METRIC_SEQS] = need_seq ? (double)S : 0;
    }
    return L;
}

typedef struct naive_arg {
    const naive *n;
    const sph_head_plan *hp;
} naive_arg;

/* The naive loss at the current hidden / weight (float64 head rows). */
static double naive_at(void *arg) {
    const naive *n = ((const naive_arg *)arg)->n;
    const sph_head_plan *hp = ((const naive_arg *)arg)->hp;
    const int64_t N = hp->N;
    double *o = hc_alloc((size_t)N * 7 * 8), *lp = hc_alloc((size_t)N * 8),
           *en = hc_alloc((size_t)N * 8);
    expect_ok(sph_head_ref_rows_f64(hp, o));
    for (int64_t i = 0; i < N; i++) lp[i] = o[i * 7], en[i] = o[i * 7 + 1];
    double L = naive_loss(n, lp, en, NULL);
    free(o), free(lp), free(en);
    return L;
}

// ---- values and finite differences ----------------------------------------------------------

static void fd_case(sph_rng *r, sph_pg_loss loss, sph_kl_kind kl, sph_loss_agg agg, int masked,
                    int isw, int fd) {
    pcase c;
    const int64_t N = 9, H = 4, V = 6;
    pc_init(&c, r, N, H, V, V, 0, SPH_F32);
    if (masked) {
        hc_mask(&c.h, r, 0.75);
        c.h.mask[1] = 0;
        c.h.mask[4] = 1;
    }
    pc_wire(&c, HC_LP | HC_ENT | HC_DH | HC_DW | HC_MASK | (isw ? PC_ISW : 0), loss, kl, agg);
    sph_ctx_t ctx = hc_ctx("ref", 1, NULL);
    sph_policy_plan pp;
    expect_ok(sph_policy_plan_make(ctx, &c.h.a, &c.p, &pp));
    double *lp0 = hc_alloc((size_t)N * 8), *en0 = hc_alloc((size_t)N * 8);
    expect_ok(sph_policy_ref_f64(&pp, NULL, lp0, en0, NULL, NULL));
    pc_place(&c, lp0, loss == SPH_PG_GSPO);
    expect_ok(sph_policy_plan_make(ctx, &c.h.a, &c.p, &pp));
    double met[SPH_POLICY_N_METRICS], dh[9 * 4], dw[6 * 4];
    expect_ok(sph_policy_ref_f64(&pp, met, lp0, en0, dh, dw));
    uint8_t act[9];
    sph_head_active_rows(&pp.head, act);
    for (int64_t i = 0; i < N; i++) act[i] = act[i] && c.h.tgt[i] >= 0;
    naive n = {&c, act, lp0, c.p.clip_ratio_c, 1 - c.p.clip_low, 1 + c.p.clip_high,
               kl ? c.p.kl_coef : 0.0, c.p.entropy_coef};
    double nm[SPH_POLICY_N_METRICS];
    naive_loss(&n, lp0, en0, nm);
    char cs[200];
    snprintf(cs, sizeof cs, "policy_ref(loss=%d,kl=%d,agg=%d,masked=%d,isw=%d)", (int)loss,
             (int)kl, (int)agg, masked, isw);
    assert_true(check_close_f64("metrics vs the issue's formulas", cs, met, nm,
                                SPH_POLICY_N_METRICS, TOL_F64, TOL_F64));
    if (fd) {
        double fdh[9 * 4], fdw[6 * 4];
        for (int which = 0; which < 2; which++) {
            float *x = which ? c.h.w : c.h.h;
            double *f = which ? fdw : fdh;
            int64_t cnt = which ? V * H : N * H;
            naive_arg na = {&n, &pp.head};
            for (int64_t k = 0; k < cnt; k++) f[k] = hc_central_diff(x, k, naive_at, &na);
        }
        assert_true(hc_close("dhidden vs central differences", cs, dh, SPH_F64, fdh, SPH_F64,
                             N * H, TOL_FD));
        assert_true(hc_close("dweight vs central differences", cs, dw, SPH_F64, fdw, SPH_F64,
                             V * H, TOL_FD));
        for (int64_t i = 0; i < N; i++)
            if (!act[i])
                for (int64_t k = 0; k < H; k++) assert_true(dh[i * H + k] == 0.0);
    }
    free(lp0), free(en0);
    sph_ctx_destroy(ctx);
    pc_free(&c);
}

static void test_values_and_fd(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    for (int loss = 0; loss < 3; loss++)
        for (int kl = 0; kl < 4; kl++)
            for (int agg = 0; agg < 4; agg++)
                fd_case(&r, (sph_pg_loss)loss, (sph_kl_kind)kl, (sph_loss_agg)agg, (kl + agg) % 2,
                        agg == 1, 1);
}

/* num_tokens / num_seqs override the counts; ignored targets and inactive rows add nothing. */
static void test_global_counts(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 1);
    for (int agg = 0; agg < 4; agg++) {
        pcase c;
        pc_init(&c, &r, 13, 5, 11, 11, 0, SPH_F32);
        hc_mask(&c.h, &r, 0.6);
        pc_wire(&c, HC_LP | HC_ENT | HC_MASK, SPH_PG_PPO, SPH_KL_K3, (sph_loss_agg)agg);
        c.p.num_tokens = 1000;
        c.p.num_seqs = 77;
        sph_ctx_t ctx = hc_ctx("ref", 1, NULL);
        sph_policy_plan pp;
        expect_ok(sph_policy_plan_make(ctx, &c.h.a, &c.p, &pp));
        double met[SPH_POLICY_N_METRICS], lp[13], en[13], nm[SPH_POLICY_N_METRICS];
        expect_ok(sph_policy_ref_f64(&pp, met, lp, en, NULL, NULL));
        uint8_t act[13];
        sph_head_active_rows(&pp.head, act);
        for (int64_t i = 0; i < 13; i++) act[i] = act[i] && c.h.tgt[i] >= 0;
        naive n = {&c, act, lp, 3.0, 0.8, 1.28, 0.1, 0.01};
        naive_loss(&n, lp, en, nm);
        assert_true(check_close_f64("metrics with num_tokens / num_seqs", "policy_counts", met, nm,
                                    SPH_POLICY_N_METRICS, TOL_F64, TOL_F64));
        sph_ctx_destroy(ctx);
        pc_free(&c);
    }
}

// ---- tie rules -------------------------------------------------------------------------------

static void test_ties(void **state) {
    (void)state;
    double v, dv;
    sph_pm_max(1.0, 2.0, 1.0, 4.0, &v, &dv); /* torch.maximum: half each at a tie */
    assert_true(v == 1.0 && dv == 3.0);
    sph_pm_max(2.0, 2.0, 1.0, 4.0, &v, &dv);
    assert_true(v == 2.0 && dv == 2.0);
    sph_pm_max(NAN, 2.0, 1.0, 4.0, &v, &dv); /* NaN propagates */
    assert_true(isnan(v));
    assert_false(sph_pm_binds(1.28, 0.8, 1.28)); /* closed interval: gradient at the bound */
    assert_true(sph_pm_binds(1.2800001, 0.8, 1.28));
    assert_false(sph_pm_binds(NAN, 0.8, 1.28));
    sph_policy_coef k = {SPH_PM_PPO, SPH_PM_KL_NONE, 0.8, 1.28, HUGE_VAL, 0, 0};
    sph_policy_row o;
    /* delta exactly 20: inside the clamp, gradient kept; just past it: none */
    sph_policy_row_eval(&k, 20.0, -1.0, 0.0, 0.0, 0.0, &o);
    assert_true(o.pg == exp(20.0) && o.dpg == exp(20.0));
    sph_policy_row_eval(&k, 20.5, -1.0, 0.0, 0.0, 0.0, &o);
    assert_true(o.pg == exp(20.0) && o.dpg == 0.0);
    /* inside the clip range: max(pg1, pg2) ties, the halves add up to the full gradient */
    sph_policy_row_eval(&k, 0.1, 2.0, 0.0, 0.0, 0.0, &o);
    assert_true(fabs(o.dpg - (-2.0 * exp(0.1))) < 1e-15 && !o.clipped);
    /* above the range with A > 0: pg = -A 1.28 (> -A r), no gradient, counted clipped */
    sph_policy_row_eval(&k, 0.5, 1.0, 0.0, 0.0, 0.0, &o);
    assert_true(o.pg == -1.28 && o.dpg == 0.0 && o.clipped);
    /* above the range with A < 0: pg = -A r, full gradient, not clipped */
    sph_policy_row_eval(&k, 0.5, -1.0, 0.0, 0.0, 0.0, &o);
    assert_true(o.pg == exp(0.5) && o.dpg == exp(0.5) && !o.clipped);
    /* below the range with A < 0: pg = -A 0.8, no gradient, clipped */
    sph_policy_row_eval(&k, -0.5, -1.0, 0.0, 0.0, 0.0, &o);
    assert_true(o.pg == 0.8 && o.dpg == 0.0 && o.clipped);
    /* dual clip: binds past c, ties at c exactly keep half the gradient (torch.minimum) */
    k.clip_c = 3.0;
    sph_policy_row_eval(&k, 1.5, -1.0, 0.0, 0.0, 0.0, &o);
    assert_true(o.pg == 3.0 && o.dpg == 0.0 && o.lower);
    /* the exact tie built, not hoped for (exp(log(3)) is not 3 on every libm): c set to the
     * ratio the row evaluates to, bitwise */
    const double r3 = exp(log(3.0));
    k.clip_c = r3;
    sph_policy_row_eval(&k, log(3.0), -1.0, 0.0, 0.0, 0.0, &o);
    assert_true(o.pg == r3 && o.dpg == 0.5 * r3 && !o.lower);
    k.clip_c = nextafter(r3, 0.0); /* one ulp inside: binds, no gradient, counted */
    sph_policy_row_eval(&k, log(3.0), -1.0, 0.0, 0.0, 0.0, &o);
    assert_true(o.pg == k.clip_c && o.dpg == 0.0 && o.lower);
    k.clip_c = 3.0;
    /* gspo: rho exactly 10 keeps the gradient, above it none */
    k.loss = SPH_PM_GSPO;
    k.clip_c = HUGE_VAL;
    sph_policy_row_eval(&k, -1.0, -1.0, 0.0, 0.0, 10.0, &o);
    assert_true(o.pg == exp(10.0) && o.dpg == exp(10.0));
    sph_policy_row_eval(&k, -1.0, -1.0, 0.0, 0.0, 10.5, &o);
    assert_true(o.pg == exp(10.0) && o.dpg == 0.0);
    /* k3: the value clamp binds above 10 (no gradient), x clamp at +-20 */
    k.loss = SPH_PM_PPO;
    k.kl = SPH_PM_KL_K3;
    sph_policy_row_eval(&k, 0.0, 1.0, 0.0, 1.0, 0.0, &o);
    assert_true(fabs(o.kl - (exp(1.0) - 2.0)) < 1e-15 && fabs(o.dkl + (exp(1.0) - 1)) < 1e-15);
    sph_policy_row_eval(&k, 0.0, 1.0, 0.0, 3.0, 0.0, &o);
    assert_true(o.kl == 10.0 && o.dkl == 0.0);
    /* NaN log-prob: NaN value and NaN gradient (never a silent 0) */
    sph_policy_row_eval(&k, NAN, 1.0, 0.0, 1.0, 0.0, &o);
    assert_true(isnan(o.pg) && isnan(o.dpg) && isnan(o.kl));
}

/* The same rules through the whole reference backend, the ties built exactly
 * (test_policy_case.h, policy_tie_check). */
static void test_ties_built(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 5);
    sph_ctx_t ctx = hc_ctx("ref", 1, NULL);
    for (int rep = 0; rep < 3; rep++) policy_tie_check(&r, ctx, "ref", ptie_logp_ref);
    sph_ctx_destroy(ctx);
}

static void test_tp(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 2);
    policy_tp_check(&r, "ref", 2, SPH_PG_PPO, SPH_KL_K3, SPH_AGG_SEQ_MEAN_TOKEN_MEAN);
    policy_tp_check(&r, "ref", 3, SPH_PG_GSPO, SPH_KL_K1, SPH_AGG_TOKEN_MEAN);
}

static void test_seq_group(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 3);
    policy_seq_check(&r, "ref", 2, SPH_PG_PPO, SPH_AGG_SEQ_MEAN_TOKEN_MEAN);
    policy_seq_check(&r, "ref", 3, SPH_PG_GSPO, SPH_AGG_SEQ_MEAN_TOKEN_SUM);
    policy_seq_check(&r, "ref", 2, SPH_PG_CISPO, SPH_AGG_TOKEN_MEAN);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values_and_fd), cmocka_unit_test(test_global_counts),
        cmocka_unit_test(test_ties),          cmocka_unit_test(test_ties_built),
        cmocka_unit_test(test_tp),
        cmocka_unit_test(test_seq_group),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
