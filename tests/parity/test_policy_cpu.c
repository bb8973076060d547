/*
 * test_policy_cpu.c - the CPU backend of the fused policy loss (one-pass sweep with the
 * per-row hook; gspo through forward + rho + backward) against the float64 reference, on
 * fresh random inputs with every output poisoned:
 *   - every loss x KL x aggregation on a shape with several row chunks and a vocabulary one
 *     past a tile (257), f32 and bf16, 1 and 2 threads;
 *   - awkward shapes and masks: N = 0, N = 1, V = 1, an empty mask, one active row, every row
 *     active, spans without a mask, ignored targets;
 *   - accumulate / overwrite, loss-only calls (no gradient outputs), stats in the workspace;
 *   - inactive rows: exact zeros in every per-row output and dhidden row;
 *   - determinism (bitwise, same inputs), TP shards in threads, a sequence group (seq_comm);
 *   - num_tokens / num_seqs set: against the reference and against the scaling they imply;
 *   - the tie rules (clip bounds, dual clip) with the ties built exactly;
 *   - per-row temperatures (issue 25, test_temperature_rows): T_i in [0.25, 4] mixed, every
 *     loss x KL, bf16 and f32, gradients and accumulate.
 */
#include "test_policy_case.h"

typedef struct run_out {
    float *lp, *ent, *dh, *dw, met[SPH_POLICY_N_METRICS];
} run_out;

static void out_free(run_out *o) { free(o->lp), free(o->ent), free(o->dh), free(o->dw); }

/* Runs the wired case on a context, copying the outputs out. */
static void run_case(pcase *c, const char *kernel, int threads, int64_t chunk_rows, run_out *o) {
    sph_ctx_opts opts = SPH_CTX_OPTS_INIT;
    opts.force_kernel = kernel;
    opts.num_threads = threads;
    opts.chunk_rows = chunk_rows;
    sph_ctx_t ctx = NULL;
    expect_ok(sph_ctx_create(&ctx, &opts));
    pc_poison(c);
    sph_status st = pc_run(ctx, c);
    if (st != SPH_OK) fail_msg("policy (%s): %s", kernel ? kernel : "best", sph_last_error());
    const int64_t N = c->h.N, H = c->h.H, V = c->h.V_loc;
    o->lp = hc_alloc((size_t)N * 4), o->ent = hc_alloc((size_t)N * 4);
    o->dh = hc_alloc((size_t)(N * H) * 4), o->dw = hc_alloc((size_t)(V * H) * 4);
    memcpy(o->lp, c->h.lp, (size_t)N * 4), memcpy(o->ent, c->h.ent, (size_t)N * 4);
    memcpy(o->dh, c->h.dh, (size_t)(N * H) * 4), memcpy(o->dw, c->h.dw, (size_t)(V * H) * 4);
    memcpy(o->met, c->metrics, sizeof o->met);
    sph_ctx_destroy(ctx);
}

typedef struct grid_case {
    int64_t N, H, V;
    sph_dtype dt;
    int mask;       /* 0 none, 1 random, 2 empty, 3 one active, 4 all active, 5 spans only */
    int threads;
    int64_t chunk_rows;
    int grads;      /* 0 loss only, 1 dh + dw, 2 dh only, 3 accumulate */
    int place;      /* ratios placed away from kinks */
} grid_case;

/* Per-row temperatures (temperature_rows) in [0.25, 4] for compare()'s cases while set. */
static int g_trows;

static void compare(sph_rng *r, const grid_case *g, sph_pg_loss loss, sph_kl_kind kl,
                    sph_loss_agg agg) {
    pcase c;
    pc_init(&c, r, g->N, g->H, g->V, g->V, 0, g->dt);
    unsigned what = HC_LP | HC_ENT | PC_ISW;
    if (g->mask) {
        hc_mask(&c.h, r, 0.5);
        if (g->mask == 2 || g->mask == 3)
            memset(c.h.mask, 0, (size_t)g->N);
        if (g->mask == 3 && g->N) c.h.mask[g->N / 2] = 1, c.h.tgt[g->N / 2] = 0;
        if (g->mask == 4) memset(c.h.mask, 1, (size_t)g->N);
        what |= g->mask == 5 ? HC_SPANS : HC_MASK;
    }
    if (g->grads == 1 || g->grads == 3) what |= HC_DH | HC_DW;
    if (g->grads == 2) what |= HC_DH;
    pc_wire(&c, what, loss, kl, agg);
    if (g->grads == 3) c.h.a.accumulate_dhidden = c.h.a.accumulate_dweight = 1;
    float *trows = NULL;
    int64_t sh_t[1] = {g->N};
    sph_tensor tt;
    if (g_trows) {
        trows = hc_alloc((size_t)g->N * 4 + 4);
        for (int64_t i = 0; i < g->N; i++) trows[i] = (float)(0.25 * pow(16.0, rng_uniform(r)));
        tt = tensor1(trows, SPH_F32, sh_t, g->N);
        c.h.a.temperature_rows = &tt;
    }
    if (g->place && g->N) {
        double *lp = hc_alloc((size_t)g->N * 8);
        sph_ctx_t ctx = hc_ctx("ref", 1, NULL);
        sph_policy_plan pp;
        expect_ok(sph_policy_plan_make(ctx, &c.h.a, &c.p, &pp));
        expect_ok(sph_policy_ref_f64(&pp, NULL, lp, NULL, NULL, NULL));
        pc_place(&c, lp, loss == SPH_PG_GSPO);
        sph_ctx_destroy(ctx);
        free(lp);
    }
    run_out ref, got, again;
    /* accumulate: both runs start from the same gradient contents */
    const size_t nh = (size_t)(g->N * g->H), nw = (size_t)(g->V * g->H);
    float *dh0 = hc_alloc(nh * 4), *dw0 = hc_alloc(nw * 4);
    for (size_t k = 0; k < nh; k++) dh0[k] = (float)rng_normal(r);
    for (size_t k = 0; k < nw; k++) dw0[k] = (float)rng_normal(r);
    if (g->grads == 3) {
        /* pc_poison would clobber the starting values: run the reference by hand */
        sph_ctx_t ctx = hc_ctx("ref", 1, NULL);
        memcpy(c.h.dh, dh0, nh * 4), memcpy(c.h.dw, dw0, nw * 4);
        poison_f32(c.metrics, SPH_POLICY_N_METRICS);
        expect_ok(pc_run(ctx, &c));
        sph_ctx_destroy(ctx);
        ref.lp = hc_alloc((size_t)g->N * 4 + 4), ref.ent = hc_alloc((size_t)g->N * 4 + 4);
        ref.dh = hc_alloc(nh * 4 + 4), ref.dw = hc_alloc(nw * 4 + 4);
        memcpy(ref.lp, c.h.lp, (size_t)g->N * 4), memcpy(ref.ent, c.h.ent, (size_t)g->N * 4);
        memcpy(ref.dh, c.h.dh, nh * 4), memcpy(ref.dw, c.h.dw, nw * 4);
        memcpy(ref.met, c.metrics, sizeof ref.met);
        ctx = NULL;
        sph_ctx_opts o = SPH_CTX_OPTS_INIT;
        o.num_threads = g->threads, o.chunk_rows = g->chunk_rows;
        expect_ok(sph_ctx_create(&ctx, &o));
        memcpy(c.h.dh, dh0, nh * 4), memcpy(c.h.dw, dw0, nw * 4);
        poison_f32(c.metrics, SPH_POLICY_N_METRICS);
        expect_ok(pc_run(ctx, &c));
        sph_ctx_destroy(ctx);
        got.lp = hc_alloc((size_t)g->N * 4 + 4), got.ent = hc_alloc((size_t)g->N * 4 + 4);
        got.dh = hc_alloc(nh * 4 + 4), got.dw = hc_alloc(nw * 4 + 4);
        memcpy(got.lp, c.h.lp, (size_t)g->N * 4), memcpy(got.ent, c.h.ent, (size_t)g->N * 4);
        memcpy(got.dh, c.h.dh, nh * 4), memcpy(got.dw, c.h.dw, nw * 4);
        memcpy(got.met, c.metrics, sizeof got.met);
        again = got;
        again.lp = NULL, again.ent = again.dh = again.dw = NULL;
    } else {
        run_case(&c, "ref", 1, 0, &ref);
        run_case(&c, NULL, g->threads, g->chunk_rows, &got);
        run_case(&c, NULL, g->threads, g->chunk_rows, &again);
    }
    char cs[240];
    snprintf(cs, sizeof cs,
             "policy_cpu(N=%lld,H=%lld,V=%lld,dtype=%s,mask=%d,threads=%d,chunk=%lld,grads=%d,"
             "loss=%d,kl=%d,agg=%d,trows=%d)",
             (long long)g->N, (long long)g->H, (long long)g->V, sph_dtype_name(g->dt), g->mask,
             g->threads, (long long)g->chunk_rows, g->grads, (int)loss, (int)kl, (int)agg,
             g_trows);
    /* tolerances.h; per-row temperatures down to 0.25 scale every logit (and its f32 error,
     * ~1e-6 absolute in z) by up to 4: the budget of the rows grows with them. The metrics are
     * checked against the ones the written rows imply (pc_metrics_implied): a loss that
     * cancels to -0.02 from terms of 10 amplifies the rows' error past any budget of its own
     * (seed 1883696320348524: 9.4e-6 off at 4e-6 + 8e-5 |m|, its rows within budget) */
    const double tol = g_trows ? 4 * TOL_CPU_F32 : TOL_CPU_F32;
    assert_true(pc_metrics_implied("metrics", cs, &c, got.met, SPH_F32, got.lp, got.ent,
                                   TOL_CPU_F32));
    assert_true(hc_close("logprob", cs, got.lp, SPH_F32, ref.lp, SPH_F32, g->N, tol));
    assert_true(hc_close("entropy", cs, got.ent, SPH_F32, ref.ent, SPH_F32, g->N, tol));
    if (g->grads) {
        assert_true(hc_close("dhidden", cs, got.dh, SPH_F32, ref.dh, SPH_F32, (int64_t)nh, tol));
        if (g->grads != 2)
            assert_true(hc_close("dweight", cs, got.dw, SPH_F32, ref.dw, SPH_F32, (int64_t)nw,
                                 tol));
    }
    /* inactive rows: exact zeros (overwrite) */
    uint8_t *act = hc_alloc((size_t)g->N + 1);
    sph_policy_plan pp;
    sph_ctx_t ctx = hc_ctx("ref", 1, NULL);
    expect_ok(sph_policy_plan_make(ctx, &c.h.a, &c.p, &pp));
    sph_head_active_rows(&pp.head, act);
    sph_ctx_destroy(ctx);
    for (int64_t i = 0; i < g->N; i++) {
        if (act[i] && c.h.tgt[i] >= 0) continue;
        assert_true(got.lp[i] == 0.0f && got.ent[i] == 0.0f);
        if (g->grads == 1 || g->grads == 2)
            for (int64_t k = 0; k < g->H; k++) assert_true(got.dh[i * g->H + k] == 0.0f);
    }
    if (again.lp) {
        assert_memory_equal(again.met, got.met, sizeof got.met);
        assert_memory_equal(again.lp, got.lp, (size_t)g->N * 4);
        if (g->grads) assert_memory_equal(again.dh, got.dh, nh * 4);
        if (g->grads == 1) assert_memory_equal(again.dw, got.dw, nw * 4);
        out_free(&again);
    }
    free(act), free(dh0), free(dw0), free(trows);
    out_free(&ref), out_free(&got);
    pc_free(&c);
}

static void test_temperature_rows(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 25301);
    g_trows = 1;
    grid_case g = {70, 13, 257, SPH_F32, 1, 2, 16, 1, 1};
    for (int loss = 0; loss < 3; loss++)
        for (int kl = 0; kl < 4; kl++) {
            g.dt = (loss + kl) % 2 ? SPH_BF16 : SPH_F32;
            g.grads = kl == 3 ? 3 : 1;
            g.mask = 1 + (loss == 1 && kl == 2) * 4; /* one spans-only case */
            compare(&r, &g, (sph_pg_loss)loss, (sph_kl_kind)kl, (sph_loss_agg)((loss + kl) % 4));
        }
    g_trows = 0;
}

static void test_every_combination(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    grid_case g = {70, 13, 257, SPH_F32, 1, 2, 16, 1, 1};
    for (int loss = 0; loss < 3; loss++)
        for (int kl = 0; kl < 4; kl++)
            for (int agg = 0; agg < 4; agg++) {
                g.dt = (loss + kl + agg) % 3 == 0 ? SPH_BF16 : SPH_F32;
                g.threads = 1 + (kl + agg) % 2;
                g.place = (loss + agg) % 2;
                compare(&r, &g, (sph_pg_loss)loss, (sph_kl_kind)kl, (sph_loss_agg)agg);
            }
}

static void test_awkward(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 1);
    const grid_case cases[] = {
        {0, 4, 6, SPH_F32, 0, 1, 0, 1, 0},    {1, 5, 7, SPH_F32, 0, 1, 0, 1, 1},
        {1, 5, 7, SPH_F32, 4, 2, 0, 1, 0},    {9, 3, 1, SPH_F32, 1, 1, 0, 1, 0},
        {33, 6, 40, SPH_F32, 2, 2, 8, 1, 0},  {33, 6, 40, SPH_F32, 3, 2, 8, 1, 1},
        {40, 7, 256, SPH_F32, 4, 2, 7, 1, 1}, {40, 7, 300, SPH_BF16, 5, 2, 9, 1, 0},
        {25, 5, 30, SPH_F32, 1, 1, 0, 0, 1},  {25, 5, 30, SPH_F32, 1, 2, 4, 2, 0},
        {25, 5, 30, SPH_F32, 1, 2, 4, 3, 1},  {25, 5, 30, SPH_BF16, 0, 1, 5, 3, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int loss = 0; loss < 3; loss++)
            compare(&r, &cases[k], (sph_pg_loss)loss, (sph_kl_kind)((k + loss) % 4),
                    (sph_loss_agg)((k * 3 + loss) % 4));
}

/* stats NULL: the workspace holds them; logprob / entropy NULL: likewise. */
static void test_optional_outputs(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 2);
    pcase c;
    pc_init(&c, &r, 21, 6, 19, 19, 0, SPH_F32);
    hc_mask(&c.h, &r, 0.6);
    pc_wire(&c, HC_LP | HC_ENT | HC_DH | HC_DW | HC_MASK, SPH_PG_PPO, SPH_KL_K3,
            SPH_AGG_SEQ_MEAN_TOKEN_MEAN);
    sph_ctx_t ctx = hc_ctx(NULL, 2, NULL);
    pc_poison(&c);
    expect_ok(pc_run(ctx, &c));
    float met[SPH_POLICY_N_METRICS], *dh = hc_alloc(21 * 6 * 4);
    memcpy(met, c.metrics, sizeof met), memcpy(dh, c.h.dh, 21 * 6 * 4);
    c.h.a.stats = NULL, c.h.a.logprob = NULL, c.h.a.entropy = NULL;
    pc_poison(&c);
    expect_ok(pc_run(ctx, &c));
    assert_memory_equal(met, c.metrics, sizeof met);
    assert_memory_equal(dh, c.h.dh, 21 * 6 * 4);
    sph_ctx_destroy(ctx);
    free(dh);
    pc_free(&c);
}

static void test_tp_and_groups(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 3);
    policy_tp_check(&r, NULL, 2, SPH_PG_PPO, SPH_KL_K3, SPH_AGG_SEQ_MEAN_TOKEN_MEAN);
    policy_tp_check(&r, NULL, 3, SPH_PG_GSPO, SPH_KL_K1, SPH_AGG_SEQ_MEAN_TOKEN_SUM_NORM);
    policy_tp_check(&r, NULL, 2, SPH_PG_CISPO, SPH_KL_K2, SPH_AGG_TOKEN_MEAN);
    policy_seq_check(&r, NULL, 2, SPH_PG_PPO, SPH_AGG_SEQ_MEAN_TOKEN_MEAN);
    policy_seq_check(&r, NULL, 3, SPH_PG_GSPO, SPH_AGG_SEQ_MEAN_TOKEN_MEAN);
}

/* num_tokens / num_seqs (a global batch's T and S) on the CPU backend: against the reference
 * run with the same counts, and against the same backend without them by construction: the
 * aggregation weights are c_i = 1/T (token-mean) or 1/S x (1, 1/T_j, 1/norm_length) (seq-*),
 * so the loss, its parts and both gradients scale by T_act/num_tokens resp. S_act/num_seqs
 * (T_act, S_act: the counts the metrics report), and the per-token metrics (clip fractions,
 * ppo_kl) always by T_act/num_tokens. A backend that ignores either count, or applies one in
 * place of the other, fails one of the two. */
static void test_global_counts(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 4);
    for (int loss = 0; loss < 3; loss++)
        for (int agg = 0; agg < 4; agg++) {
            const int64_t N = 47, H = 9, V = 131;
            pcase c;
            pc_init(&c, &r, N, H, V, V, 0, SPH_F32);
            hc_mask(&c.h, &r, 0.6);
            pc_wire(&c, HC_LP | HC_ENT | HC_DH | HC_DW | HC_MASK | PC_ISW, (sph_pg_loss)loss,
                    (sph_kl_kind)(1 + (loss + agg) % 3), (sph_loss_agg)agg);
            run_out base, got, ref;
            run_case(&c, NULL, 2, 8, &base);
            const double T = base.met[SPH_METRIC_TOKENS], S = base.met[SPH_METRIC_SEQS];
            /* S is counted where it is used (seq-* aggregations, gspo); 0 otherwise */
            if (!(T >= 2 && (agg == SPH_AGG_TOKEN_MEAN || S >= 2)))
                fail_msg("too few active rows / sequences: T=%g S=%g", T, S);
            c.p.num_tokens = (int64_t)T * 3 + 7;
            c.p.num_seqs = (int64_t)S * 2 + 5;
            run_case(&c, NULL, 2, 8, &got);
            run_case(&c, "ref", 1, 0, &ref);
            char cs[160];
            snprintf(cs, sizeof cs, "policy_cpu counts(loss=%d,agg=%d,T=%g->%lld,S=%g->%lld)",
                     loss, agg, T, (long long)c.p.num_tokens, S, (long long)c.p.num_seqs);
            const double tol = TOL_CPU_F32;
            assert_true(pc_metrics_implied("metrics vs its rows", cs, &c, got.met, SPH_F32,
                                           got.lp, got.ent, tol));
            assert_true(hc_close("logprob vs ref", cs, got.lp, SPH_F32, ref.lp, SPH_F32, N, tol));
            assert_true(hc_close("entropy vs ref", cs, got.ent, SPH_F32, ref.ent, SPH_F32, N, tol));
            assert_true(hc_close("dhidden vs ref", cs, got.dh, SPH_F32, ref.dh, SPH_F32, N * H,
                                 tol));
            assert_true(hc_close("dweight vs ref", cs, got.dw, SPH_F32, ref.dw, SPH_F32, V * H,
                                 tol));
            const double ft = T / (double)c.p.num_tokens, fs = S / (double)c.p.num_seqs;
            const double fl = agg == SPH_AGG_TOKEN_MEAN ? ft : fs;
            float want[SPH_POLICY_N_METRICS];
            for (int k = 0; k < SPH_POLICY_N_METRICS; k++) {
                double f = k <= SPH_METRIC_ENTROPY_LOSS ? fl : k <= SPH_METRIC_PPO_KL ? ft : 1.0;
                want[k] = (float)(base.met[k] * f);
            }
            assert_true(pc_metrics_close("metrics vs scaled", cs, got.met, SPH_F32, want,
                                         SPH_F32, tol));
            for (int64_t k = 0; k < N * H; k++) base.dh[k] = (float)(base.dh[k] * fl);
            for (int64_t k = 0; k < V * H; k++) base.dw[k] = (float)(base.dw[k] * fl);
            assert_true(hc_close("dhidden vs scaled", cs, got.dh, SPH_F32, base.dh, SPH_F32,
                                 N * H, tol));
            assert_true(hc_close("dweight vs scaled", cs, got.dw, SPH_F32, base.dw, SPH_F32,
                                 V * H, tol));
            /* the per-row outputs do not depend on the counts */
            assert_memory_equal(got.lp, base.lp, (size_t)N * 4);
            assert_memory_equal(got.ent, base.ent, (size_t)N * 4);
            out_free(&base), out_free(&got), out_free(&ref);
            pc_free(&c);
        }
}

/* The tie rules on the CPU backend, ties built exactly (test_policy_case.h, policy_tie_check):
 * its per-row hook reads its float32 logprob output, so the ratios it forms are known. */
static void test_ties_built(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 5);
    for (int threads = 1; threads <= 2; threads++) {
        sph_ctx_t ctx = hc_ctx(NULL, threads, NULL);
        for (int rep = 0; rep < 3; rep++) policy_tie_check(&r, ctx, "cpu", ptie_logp_output);
        policy_tie_check_unit(&r, ctx, "cpu", ptie_logp_output, NULL);
        sph_ctx_destroy(ctx);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_combination),
        cmocka_unit_test(test_awkward),
        cmocka_unit_test(test_optional_outputs),
        cmocka_unit_test(test_global_counts),
        cmocka_unit_test(test_ties_built),
        cmocka_unit_test(test_tp_and_groups),
        cmocka_unit_test(test_temperature_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
