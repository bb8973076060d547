/*
 * test_head_ref.c - the float64 reference of the LM head against independent computations:
 * an independent float64 forward and backward (test_head_case.h: entropy as -sum p log p,
 * the gradient from the formulas) over every dtype x support x softcap x temperature x shard x
 * mask, central finite differences of its own forward (both gradients, every upstream,
 * softcap on and off, sample support), z-loss and label-smoothed cross-entropy written from
 * scratch, masking rules, and TP sharding of the reference through the in-process
 * communicator against the unsharded reference. Budgets: tolerances.h (TOL_F64, TOL_FD).
 */
#include "test_head_case.h"

// ---- the float64 cores against the independent float64 forward and backward ----------------

static int g_indep_cases;

static void test_independent(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 7);
    const sph_dtype dts[3] = {SPH_F32, SPH_BF16, SPH_F16};
    int ok = 1;
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < 2; k++)
            for (int cp = 0; cp < 2; cp++)
                for (int tt = 0; tt < 2; tt++)
                    for (int sh = 0; sh < 2; sh++)
                        for (int mk = 0; mk < 2; mk++) {
                            const int64_t N = 13, H = 11, VL = 37, V = sh ? 60 : 37,
                                          v0 = sh ? 9 : 0, K = k ? 6 : 0;
                            const double T = tt ? 0.6 : 1.0, cap = cp ? 2.5 : 0.0;
                            hcase c;
                            hc_init(&c, &r, N, H, VL, V, v0, K, dts[d]);
                            hc_edge_targets(&c);
                            if (mk) hc_mask_ragged(&c, &r, 0.6);
                            hc_wire(&c, HC_OUTS | HC_UPS | HC_DH | HC_DW | (mk ? HC_MASK : 0));
                            c.a.temperature = T, c.a.softcap = cap;
                            char cs[160];
                            snprintf(cs, sizeof cs,
                                     "head_ref_indep(dtype=%s,K=%lld,cap=%g,T=%g,shard=%d,mask=%d)",
                                     sph_dtype_name(dts[d]), (long long)K, cap, T, sh, mk);
                            sph_ctx_t rc = hc_ctx("ref", 1, NULL);
                            hexp x;
                            hc_expect(rc, &c.a, &x);
                            sph_ctx_destroy(rc);
                            double *ind = hc_alloc(N * HC_IND * 8);
                            double *dh = hc_alloc(N * H * 8), *dw = hc_alloc(VL * H * 8);
                            hc_indep_forward(&c, T, cap, x.active, ind);
                            hc_indep_backward(&c, T, cap, x.active, ind, HC_UPS, dh, dw, NULL,
                                              NULL, NULL, NULL);
                            /* rows: logprob, entropy, lse, logit_mean; stats m, lse, mu */
                            const int rc7[7] = {0, 1, 2, 3, 4, 5, 6};
                            const int ic[7] = {0, 1, 2, 3, 5, 2, 4};
                            const char *nm[7] = {"logprob", "entropy", "lse", "logit_mean",
                                                 "m", "stats.lse", "mu"};
                            for (int f = 0; f < 7; f++) {
                                double *a = hc_alloc(N * 8), *b = hc_alloc(N * 8);
                                for (int64_t i = 0; i < N; i++)
                                    a[i] = x.rows[i * 7 + rc7[f]], b[i] = ind[i * HC_IND + ic[f]];
                                ok &= hc_close(nm[f], cs, a, SPH_F64, b, SPH_F64, N, TOL_F64);
                                free(a), free(b);
                            }
                            ok &= hc_close("dhidden", cs, x.dh, SPH_F64, dh, SPH_F64, N * H,
                                           TOL_F64);
                            ok &= hc_close("dweight", cs, x.dw, SPH_F64, dw, SPH_F64, VL * H,
                                           TOL_F64);
                            free(ind), free(dh), free(dw);
                            hc_expect_free(&x);
                            hc_free(&c);
                            g_indep_cases++;
                        }
    assert_int_equal(g_indep_cases, 96);
    assert_true(ok);
}

// ---- finite differences -------------------------------------------------------------------

static void fd_case(sph_rng *r, int64_t K, double softcap, double temp, int masked) {
    hcase c;
    const int64_t N = 4, H = 5, V = 7;
    hc_init(&c, r, N, H, V, V, 0, K, SPH_F32);
    c.tgt[1] = -100;
    if (masked) {
        hc_mask(&c, r, 1.0);
        c.mask[2] = 0;
    }
    hc_wire(&c, HC_LP | HC_ENT | HC_LSE | HC_LM | HC_G | HC_E | HC_GL | HC_GM | HC_DH |
                    HC_DW | HC_MASK);
    c.a.temperature = temp;
    c.a.softcap = softcap;
    sph_ctx_t ctx = hc_ctx("ref", 1, NULL);
    sph_head_plan p;
    expect_ok(sph_head_plan_make(ctx, SPH_HEAD_BACKWARD, &c.a, &p));
    double *o = hc_alloc((size_t)N * 7 * 8), *st = hc_alloc((size_t)N * 3 * 8);
    expect_ok(sph_head_ref_rows_f64(&p, o));
    for (int64_t i = 0; i < N; i++)
        for (int f = 0; f < 3; f++) st[i * 3 + f] = o[i * 7 + 4 + f];
    double *dh = hc_alloc((size_t)(N * H) * 8), *dw = hc_alloc((size_t)(V * H) * 8);
    expect_ok(sph_head_ref_backward_f64(&p, st, dh, dw));
    double *fdh = hc_alloc((size_t)(N * H) * 8), *fdw = hc_alloc((size_t)(V * H) * 8);
    hc_fd_grads(&p, &c, fdh, fdw);
    char cs[160];
    snprintf(cs, sizeof cs, "head_ref_fd(K=%lld,softcap=%g,T=%g,masked=%d)", (long long)K,
             softcap, temp, masked);
    assert_true(hc_close("dhidden vs central differences", cs, dh, SPH_F64, fdh, SPH_F64, N * H,
                         TOL_FD));
    assert_true(hc_close("dweight vs central differences", cs, dw, SPH_F64, fdw, SPH_F64, V * H,
                         TOL_FD));
    if (masked)
        for (int64_t k = 0; k < H; k++) assert_true(dh[2 * H + k] == 0.0);
    free(o), free(st), free(dh), free(dw), free(fdh), free(fdw);
    sph_ctx_destroy(ctx);
    hc_free(&c);
}

static void test_fd(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    fd_case(&r, 0, 0.0, 1.0, 0);
    fd_case(&r, 0, 0.0, 0.7, 1);
    fd_case(&r, 0, 1.5, 1.3, 0);
    fd_case(&r, 0, 2.0, 0.8, 1);
    fd_case(&r, 4, 0.0, 1.0, 0);
    fd_case(&r, 5, 1.5, 0.9, 1);
}

// ---- z-loss and label smoothing from the outputs vs direct float64 --------------------------

static void test_zloss_label_smoothing(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 1);
    const int64_t N = 9, H = 13, V = 31;
    const double T = 0.9, eps = 0.1, zc = 1e-2;
    hcase c;
    hc_init(&c, &r, N, H, V, V, 0, 0, SPH_F32);
    sph_ctx_t ctx = hc_ctx("ref", 1, NULL);
    hc_wire(&c, HC_LP | HC_LSE | HC_LM);
    c.a.temperature = T;
    hc_poison(&c);
    expect_ok(hc_run(ctx, SPH_HEAD_FORWARD, &c.a));
    /* losses from the outputs: z-loss zc * lse^2; label-smoothed CE
     * -(1 - eps) logp_t - eps * mean_j logp_j with mean_j logp_j = logit_mean - lse */
    double Lz = 0, Ls = 0, Lz_ref = 0, Ls_ref = 0;
    double *dh_ref = hc_alloc((size_t)(N * H) * 8), *dw_ref = hc_alloc((size_t)(V * H) * 8);
    memset(dh_ref, 0, (size_t)(N * H) * 8), memset(dw_ref, 0, (size_t)(V * H) * 8);
    const float *h = c.h, *w = c.w;
    for (int64_t i = 0; i < N; i++) {
        int ign = c.tgt[i] < 0;
        Lz += zc * (double)c.lse[i] * c.lse[i];
        if (!ign) Ls += -(1 - eps) * c.lp[i] - eps * ((double)c.lm[i] - c.lse[i]);
        /* direct: logits, log-softmax, both losses and dL/dz for the two losses summed */
        double z[31], mx = -INFINITY, s = 0;
        for (int64_t j = 0; j < V; j++) {
            double u = 0;
            for (int64_t k = 0; k < H; k++) u += (double)h[i * H + k] * w[j * H + k];
            z[j] = u / T;
            mx = fmax(mx, z[j]);
        }
        for (int64_t j = 0; j < V; j++) s += exp(z[j] - mx);
        double lse = mx + log(s);
        Lz_ref += zc * lse * lse;
        double meanlogp = 0;
        for (int64_t j = 0; j < V; j++) meanlogp += (z[j] - lse) / V;
        if (!ign) Ls_ref += -(1 - eps) * (z[c.tgt[i]] - lse) - eps * meanlogp;
        for (int64_t j = 0; j < V; j++) {
            double p = exp(z[j] - lse);
            double dz = 2 * zc * lse * p; /* z-loss */
            if (!ign) dz += p - (1 - eps) * (j == c.tgt[i]) - eps / V;
            double du = dz / T;
            for (int64_t k = 0; k < H; k++) {
                dh_ref[i * H + k] += du * w[j * H + k];
                dw_ref[j * H + k] += du * h[i * H + k];
            }
        }
    }
    assert_true(fabs(Lz - Lz_ref) <= TOL_CPU_F32 * fabs(Lz_ref) + 1e-7);
    assert_true(fabs(Ls - Ls_ref) <= TOL_CPU_F32 * fabs(Ls_ref) + 1e-7);
    /* the gradients of both losses through the upstream slots */
    for (int64_t i = 0; i < N; i++) {
        int ign = c.tgt[i] < 0;
        c.gl[i] = (float)(2 * zc * c.lse[i] + (ign ? 0 : eps));
        c.g[i] = (float)(ign ? 0 : -(1 - eps));
        c.gm[i] = (float)(ign ? 0 : -eps);
    }
    hc_wire(&c, HC_G | HC_GL | HC_GM | HC_DH | HC_DW);
    c.a.temperature = T;
    expect_ok(hc_run(ctx, SPH_HEAD_BACKWARD, &c.a));
    assert_true(hc_close("dhidden (z-loss + label smoothing)", "head_ref_zloss_ls", c.dh, SPH_F32,
                         dh_ref, SPH_F64, N * H, TOL_CPU_F32));
    assert_true(hc_close("dweight (z-loss + label smoothing)", "head_ref_zloss_ls", c.dw, SPH_F32,
                         dw_ref, SPH_F64, V * H, TOL_CPU_F32));
    free(dh_ref), free(dw_ref);
    sph_ctx_destroy(ctx);
    hc_free(&c);
}

// ---- masking rules and properties ---------------------------------------------------------

static void test_mask_rules(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 2);
    const int64_t N = 12, H = 7, V = 19;
    hcase c;
    hc_init(&c, &r, N, H, V, V, 0, 0, SPH_F32);
    hc_mask(&c, &r, 1.0);
    for (int64_t i = 0; i < N; i++) c.mask[i] = (i % 3) != 1;
    sph_ctx_t ctx = hc_ctx("ref", 1, NULL);
    hc_wire(&c, HC_LP | HC_ENT | HC_LSE | HC_LM | HC_MASK);
    hc_poison(&c);
    expect_ok(hc_run(ctx, SPH_HEAD_FORWARD, &c.a));
    for (int64_t i = 0; i < N; i++) {
        if (!c.mask[i]) {
            assert_true(c.lp[i] == 0 && c.ent[i] == 0 && c.lse[i] == 0 && c.lm[i] == 0);
            continue;
        }
        assert_true(c.ent[i] >= -1e-6 && c.ent[i] <= log((double)V) + 1e-5);
        assert_true(c.tgt[i] < 0 ? c.lp[i] == 0 : c.lp[i] <= 0);
    }
    /* dhidden: inactive rows exact zeros; accumulate leaves them as they were */
    hc_wire(&c, HC_G | HC_E | HC_DH | HC_DW | HC_MASK);
    hc_poison(&c);
    expect_ok(hc_run(ctx, SPH_HEAD_FORWARD, &c.a)); /* one-pass */
    float *dh = c.dh;
    for (int64_t i = 0; i < N; i++)
        for (int64_t k = 0; k < H; k++)
            if (!c.mask[i]) assert_true(dh[i * H + k] == 0.0f);
            else assert_false(isnan(dh[i * H + k]));
    for (int64_t k = 0; k < N * H; k++) dh[k] = 7.0f;
    c.a.accumulate_dhidden = 1;
    expect_ok(hc_run(ctx, SPH_HEAD_BACKWARD, &c.a));
    for (int64_t i = 0; i < N; i++)
        if (!c.mask[i])
            for (int64_t k = 0; k < H; k++) assert_true(dh[i * H + k] == 7.0f);
    sph_ctx_destroy(ctx);
    hc_free(&c);
}

// ---- tensor parallel: shards through the in-process communicator (test_head_case.h) ------

static void test_tp_ref(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 3);
    int ok = 1;
    for (int k = 0; k < N_TP_CFGS; k++) ok &= tp_check_cfg(&r, "ref", &TP_CFGS[k]);
    assert_true(ok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_independent),
        cmocka_unit_test(test_fd),
        cmocka_unit_test(test_zloss_label_smoothing),
        cmocka_unit_test(test_mask_rules),
        cmocka_unit_test(test_tp_ref),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    tol_report("head_ref");
    return test_exit(failed);
}
