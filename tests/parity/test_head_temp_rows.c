/*
 * test_head_temp_rows.c - per-row temperature (issue 25 item 1: sph_head_args.temperature_rows,
 * one f32 temperature per row, each used for its row exactly as the scalar temperature is).
 *
 *   - the float64 reference with per-row T against itself with the scalar T = T_i, one call per
 *     row with only that row active (T_i from 1e-3 to 1e2 mixed within one call): every per-row
 *     output, stats, the row's dhidden and the sum of the rows' dweight (float64, TOL_F64);
 *   - finite differences of the reference's gradient with per-row T (softcap on/off, support);
 *   - every CPU kernel set (and the reference's two-pass backward) against the float64
 *     reference, T in [0.25, 4] mixed: fp32 and bf16, masks, sample support, softcap, one-pass
 *     and forward then backward, several chunks and tiles (TOL_CPU_F32);
 *   - the extreme range 1e-3 .. 1e2 mixed within one call on the CPU backend against the same
 *     backend with the scalar T_i on each row alone (dyadic data: the products are exact, so
 *     the difference is the per-row plumbing only);
 *   - tensor parallelism in threads (2 and 3 ranks, several tiles per rank, one-pass);
 *   - bad input: T_i <= 0, NaN, inf, subnormal, too large; wrong shape, dtype; overlap with an
 *     output; a scalar temperature other than 1 alongside; the backward too; nothing written.
 * Outputs are poisoned before each run.
 */
#include "test_head_case.h"

/* Log-uniform temperatures in [lo, hi]; the two ends on the first two rows. */
static float *trows_new(sph_rng *r, int64_t N, double lo, double hi) {
    float *t = hc_alloc((size_t)N * 4 + 4);
    for (int64_t i = 0; i < N; i++) t[i] = (float)(lo * pow(hi / lo, rng_uniform(r)));
    if (N > 0) t[0] = (float)lo;
    if (N > 1) t[1] = (float)hi;
    return t;
}

// ---- the reference against itself, row by row ---------------------------------------------------

static void test_ref_rowwise(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 25101);
    sph_ctx_t ref = hc_ctx("ref", 1, NULL);
    int ok = 1, runs = 0;
    for (int v = 0; v < 8; v++) {
        const int64_t K = v & 1 ? 5 : 0, N = 13, H = 9, V = 41;
        const int masked = v >> 1 & 1;
        const double cap = v >> 2 & 1 ? 2.5 : 0.0;
        hcase c;
        hc_init(&c, &r, N, H, V, V, 0, K, SPH_F32);
        if (masked) hc_mask_ragged(&c, &r, 0.7);
        hc_wire(&c, HC_OUTS | HC_UPS | HC_DH | HC_DW | (masked ? HC_MASK : 0));
        float *T = trows_new(&r, N, 1e-3, 1e2);
        int64_t sht[1], shm[1];
        sph_tensor tt = tensor1(T, SPH_F32, sht, N);
        c.a.temperature_rows = &tt;
        c.a.softcap = cap;
        hexp x;
        hc_expect(ref, &c.a, &x);
        uint8_t *m1 = hc_alloc((size_t)N);
        sph_tensor tm1 = tensor1(m1, SPH_U8, shm, N);
        double *dw = calloc((size_t)(V * H), 8);
        assert_non_null(dw);
        char cs[96];
        snprintf(cs, sizeof cs, "ref_rowwise(K=%lld,mask=%d,cap=%g)", (long long)K, masked, cap);
        int differ = 0; /* the check must be able to fail: T_i must matter */
        for (int64_t i = 0; i < N; i++) {
            if (!x.active[i]) {
                for (int f = 0; f < 7; f++) ok &= x.rows[i * 7 + f] == 0.0;
                continue;
            }
            sph_head_args b = c.a;
            b.temperature_rows = NULL;
            b.temperature = T[i];
            memset(m1, 0, (size_t)N);
            m1[i] = 1;
            b.active_mask = &tm1;
            b.spans = NULL, b.n_spans = 0;
            hexp y;
            hc_expect(ref, &b, &y);
            for (int f = 0; f < 7; f++) {
                const double a0 = x.rows[i * 7 + f], b0 = y.rows[i * 7 + f];
                if (!(fabs(a0 - b0) <= TOL_F64 * (1 + fabs(b0)))) {
                    fprintf(stderr, "FAIL %s: row %lld (T %g) field %d: per-row %.17g, scalar "
                                    "%.17g; seed %llu\n",
                            cs, (long long)i, T[i], f, a0, b0, (unsigned long long)test_seed());
                    ok = 0;
                }
            }
            ok &= hc_close("dhidden row", cs, x.dh + i * H, SPH_F64, y.dh + i * H, SPH_F64, H,
                           TOL_F64);
            for (int64_t k = 0; k < V * H; k++) dw[k] += y.dw[k];
            /* the same row at the scalar 1 differs (entropy, lse): T_i is really used */
            b.temperature = 1.0;
            hexp z;
            hc_expect(ref, &b, &z);
            if (T[i] != 1.0f && fabs(z.rows[i * 7 + 2] - x.rows[i * 7 + 2]) > 1e-9) differ++;
            hc_expect_free(&z);
            hc_expect_free(&y);
        }
        ok &= hc_close("dweight (sum of rows)", cs, x.dw, SPH_F64, dw, SPH_F64, V * H, TOL_F64);
        if (!differ) {
            fprintf(stderr, "FAIL %s: no row's lse depends on its temperature\n", cs);
            ok = 0;
        }
        free(dw), free(m1), free(T);
        hc_expect_free(&x);
        hc_free(&c);
        runs++;
    }
    sph_ctx_destroy(ref);
    assert_int_equal(runs, 8);
    assert_true(ok);
}

// ---- finite differences -----------------------------------------------------------------------

static void fd_case(sph_rng *r, int64_t K, double cap, int masked) {
    hcase c;
    const int64_t N = 5, H = 4, V = 7;
    hc_init(&c, r, N, H, V, V, 0, K, SPH_F32);
    if (masked) {
        hc_mask(&c, r, 1.0);
        c.mask[2] = 0;
    }
    hc_wire(&c, HC_OUTS | HC_UPS | HC_DH | HC_DW | HC_MASK);
    float T[5] = {0.5f, 1.7f, 0.8f, 1.25f, 0.65f};
    int64_t sht[1];
    sph_tensor tt = tensor1(T, SPH_F32, sht, N);
    c.a.temperature_rows = &tt;
    c.a.softcap = cap;
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
    char cs[96];
    snprintf(cs, sizeof cs, "temp_rows_fd(K=%lld,cap=%g,masked=%d)", (long long)K, cap, masked);
    assert_true(hc_close("dhidden vs central differences", cs, dh, SPH_F64, fdh, SPH_F64, N * H,
                         TOL_FD));
    assert_true(hc_close("dweight vs central differences", cs, dw, SPH_F64, fdw, SPH_F64, V * H,
                         TOL_FD));
    free(o), free(st), free(dh), free(dw), free(fdh), free(fdw);
    sph_ctx_destroy(ctx);
    hc_free(&c);
}

static void test_fd(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 25102);
    fd_case(&r, 0, 0.0, 0);
    fd_case(&r, 0, 1.5, 1);
    fd_case(&r, 4, 0.0, 1);
    fd_case(&r, 4, 2.0, 0);
}

// ---- every CPU kernel set against the float64 reference --------------------------------------

/* One backend run of c (per-row T given in c->a) compared with the reference expectation x:
 * one-pass, or a forward and then the backward from its own stats. */
static int run_and_check(sph_ctx_t ctx, hcase *c, const hexp *x, int one_pass, unsigned base,
                         const char *cs) {
    int ok = 1;
    const sph_tensor *tr = c->a.temperature_rows;
    const double cap = c->a.softcap;
    hc_poison(c);
    hc_wire(c, base | (one_pass ? HC_UPS | HC_DH | HC_DW : 0));
    c->a.temperature_rows = tr, c->a.softcap = cap;
    sph_status s = hc_run(ctx, SPH_HEAD_FORWARD, &c->a);
    if (s == SPH_OK && !one_pass) {
        hc_wire(c, HC_UPS | HC_DH | HC_DW | (base & HC_MASK));
        c->a.temperature_rows = tr, c->a.softcap = cap;
        s = hc_run(ctx, SPH_HEAD_BACKWARD, &c->a);
    }
    if (s != SPH_OK) {
        fprintf(stderr, "FAIL %s: %s: %s\n", cs, sph_status_str(s), sph_last_error());
        return 0;
    }
    const float *got[4] = {c->lp, c->ent, c->lse, c->lm};
    const char *names[4] = {"logprob", "entropy", "lse", "logit_mean"};
    for (int f = 0; f < (c->K ? 3 : 4); f++)
        ok &= hc_close_col(names[f], cs, got[f], 1, x->rows, 7, f, c->N, TOL_CPU_F32);
    for (int f = 0; f < 3; f++)
        ok &= hc_close_col("stats", cs, c->stats + f, 3, x->rows, 7, 4 + f, c->N, TOL_CPU_F32);
    ok &= hc_check_grad("dhidden", cs, c->dh, SPH_F32, x->dh, x->dh, NULL, NULL, c->N * c->H,
                        TOL_CPU_F32, 0, 0, 0, 1);
    ok &= hc_check_grad("dweight", cs, c->dw, SPH_F32, x->dw, x->dw, NULL, NULL, c->V_loc * c->H,
                        TOL_CPU_F32, 0, 0, 0, 1);
    return ok;
}

static void test_cpu_vs_ref(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 25103);
    const char *kernels[5] = {"ref", NULL, "generic", "avx2", "avx512"};
    sph_ctx_t ref = hc_ctx("ref", 1, NULL);
    int ok = 1, runs = 0;
    for (int kk = 0; kk < 5; kk++) {
        sph_ctx_opts o = SPH_CTX_OPTS_INIT;
        o.force_kernel = kernels[kk];
        o.num_threads = 2;
        o.chunk_rows = 7; /* several chunks */
        sph_ctx_t ctx = NULL;
        if (sph_ctx_create(&ctx, &o) != SPH_OK) continue; /* an ISA this machine lacks */
        for (int v = 0; v < 16; v++) {
            const int K = v & 1 ? 6 : 0, masked = v >> 1 & 1, one_pass = v >> 2 & 1;
            const int bf = v >> 3 & 1;
            const double cap = (v + kk) % 3 == 1 ? 2.5 : 0.0;
            const int64_t N = 37, H = 19, V = 613; /* 3 vocabulary tiles of 256 */
            hcase c;
            hc_init(&c, &r, N, H, V, V, 0, K, bf ? SPH_BF16 : SPH_F32);
            if (masked) hc_mask_ragged(&c, &r, 0.6);
            const unsigned base = HC_OUTS | (masked ? HC_MASK : 0);
            float *T = trows_new(&r, N, 0.25, 4.0);
            int64_t sht[1];
            sph_tensor tt = tensor1(T, SPH_F32, sht, N);
            hc_wire(&c, base | HC_UPS | HC_DH | HC_DW);
            c.a.temperature_rows = &tt, c.a.softcap = cap;
            hexp x;
            hc_expect(ref, &c.a, &x);
            char cs[128];
            snprintf(cs, sizeof cs, "cpu_vs_ref(kernel=%s,K=%d,mask=%d,one_pass=%d,%s,cap=%g)",
                     kernels[kk] ? kernels[kk] : "best", K, masked, one_pass, bf ? "bf16" : "f32",
                     cap);
            ok &= run_and_check(ctx, &c, &x, one_pass, base, cs);
            free(T);
            hc_expect_free(&x);
            hc_free(&c);
            runs++;
        }
        sph_ctx_destroy(ctx);
    }
    sph_ctx_destroy(ref);
    assert_true(runs >= 32);
    assert_true(ok);
}

// ---- the extreme range on the CPU backend against its own scalar path ---------------------------

/* One-pass, or a forward (outputs only) then the backward from its stats; tr: per-row T or
 * NULL (then T), mask: wired when given. */
static sph_status run_rows(sph_ctx_t ctx, hcase *c, int one_pass, const sph_tensor *tr,
                           double T, double cap, const sph_tensor *mask) {
    hc_poison(c);
    hc_wire(c, HC_OUTS | (one_pass ? HC_UPS | HC_DH | HC_DW : 0));
    c->a.temperature_rows = tr, c->a.temperature = T, c->a.softcap = cap;
    c->a.active_mask = mask;
    sph_status s = hc_run(ctx, SPH_HEAD_FORWARD, &c->a);
    if (s != SPH_OK || one_pass) return s;
    hc_wire(c, HC_UPS | HC_DH | HC_DW);
    c->a.temperature_rows = tr, c->a.temperature = T, c->a.softcap = cap;
    c->a.active_mask = mask;
    return hc_run(ctx, SPH_HEAD_BACKWARD, &c->a);
}

/* Dyadic data: h in {-4..4}/4, w in {-4..4}/16, so every product and sum over H <= 64 terms
 * is exact in float32 and bf16 (the logits do not depend on the summation order). */
static void dyadic(hcase *c, sph_rng *r) {
    for (int64_t k = 0; k < c->N * c->H; k++)
        hc_set(c->h, c->dt, k, (double)rng_range(r, -4, 4) / 4);
    for (int64_t k = 0; k < c->V_loc * c->H; k++)
        hc_set(c->w, c->dt, k, (double)rng_range(r, -4, 4) / 16);
}

static void test_cpu_extreme_rowwise(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 25104);
    const char *kernels[4] = {NULL, "generic", "avx2", "avx512"};
    int ok = 1, runs = 0;
    for (int kk = 0; kk < 4; kk++) {
        sph_ctx_opts o = SPH_CTX_OPTS_INIT;
        o.force_kernel = kernels[kk];
        o.num_threads = 2;
        o.chunk_rows = 5;
        sph_ctx_t ctx = NULL;
        if (sph_ctx_create(&ctx, &o) != SPH_OK) continue;
        for (int v = 0; v < 8; v++) {
            const int K = v & 1 ? 7 : 0, one_pass = v >> 1 & 1, bf = v >> 2 & 1;
            const double cap = v == 3 || v == 6 ? 3.0 : 0.0;
            const int64_t N = 17, H = 24, V = 300;
            hcase c;
            hc_init(&c, &r, N, H, V, V, 0, K, bf ? SPH_BF16 : SPH_F32);
            dyadic(&c, &r);
            float *T = trows_new(&r, N, 1e-3, 1e2);
            int64_t sht[1], shm[1];
            sph_tensor tt = tensor1(T, SPH_F32, sht, N);
            char cs[128];
            snprintf(cs, sizeof cs, "cpu_extreme(kernel=%s,K=%d,one_pass=%d,%s,cap=%g)",
                     kernels[kk] ? kernels[kk] : "best", K, one_pass, bf ? "bf16" : "f32", cap);
            /* the per-row call: its results become the expectation's "got" */
            hcase g = c;
            g.lp = hc_alloc((size_t)N * 4), g.ent = hc_alloc((size_t)N * 4);
            g.lse = hc_alloc((size_t)N * 4), g.lm = hc_alloc((size_t)N * 4);
            g.stats = hc_alloc((size_t)N * 12);
            g.dh = hc_alloc((size_t)(N * H) * 4), g.dw = hc_alloc((size_t)(V * H) * 4);
            sph_status s = run_rows(ctx, &g, one_pass, &tt, 1.0, cap, NULL);
            if (s != SPH_OK) {
                fprintf(stderr, "FAIL %s: %s: %s\n", cs, sph_status_str(s), sph_last_error());
                ok = 0;
            }
            /* row by row at the scalar T_i, the other rows masked off */
            uint8_t *m1 = hc_alloc((size_t)N);
            sph_tensor tm1 = tensor1(m1, SPH_U8, shm, N);
            double *dw = calloc((size_t)(V * H), 8), *rows = hc_alloc((size_t)N * 7 * 8);
            double *dh = hc_alloc((size_t)(N * H) * 8);
            assert_non_null(dw);
            for (int64_t i = 0; i < N && s == SPH_OK; i++) {
                memset(m1, 0, (size_t)N);
                m1[i] = 1;
                s = run_rows(ctx, &c, one_pass, NULL, T[i], cap, &tm1);
                if (s != SPH_OK) {
                    fprintf(stderr, "FAIL %s: row %lld alone: %s\n", cs, (long long)i,
                            sph_last_error());
                    ok = 0;
                    break;
                }
                const float *f7[7] = {c.lp, c.ent, c.lse, c.lm, c.stats, c.stats + 1,
                                      c.stats + 2};
                for (int f = 0; f < 7; f++) rows[i * 7 + f] = f7[f][f >= 4 ? i * 3 : i];
                for (int64_t k = 0; k < H; k++) dh[i * H + k] = ((float *)c.dh)[i * H + k];
                for (int64_t k = 0; k < V * H; k++) dw[k] += ((float *)c.dw)[k];
            }
            if (s == SPH_OK) {
                /* per-row outputs: the row's own scale (|z| up to 8 / 1e-3) */
                for (int64_t i = 0; i < N; i++)
                    for (int f = 0; f < (K ? 3 : 4); f++) {
                        const float *gf[4] = {g.lp, g.ent, g.lse, g.lm};
                        const double want = rows[i * 7 + f], got = gf[f][i];
                        const double scale = 1 + 8.0 / T[i];
                        if (!(fabs(got - want) <= 1e-6 * scale)) {
                            fprintf(stderr, "FAIL %s: row %lld (T %g) output %d: per-row %.9g, "
                                            "scalar %.9g; seed %llu\n",
                                    cs, (long long)i, T[i], f, got, want,
                                    (unsigned long long)test_seed());
                            ok = 0;
                        }
                    }
                for (int64_t i = 0; i < N; i++)
                    ok &= hc_close("dhidden row", cs, (float *)g.dh + i * H, SPH_F32,
                                   dh + i * H, SPH_F64, H, TOL_CPU_F32);
                ok &= hc_close("dweight", cs, g.dw, SPH_F32, dw, SPH_F64, V * H, TOL_CPU_F32);
            }
            free(m1), free(dw), free(rows), free(dh), free(T);
            free(g.lp), free(g.ent), free(g.lse), free(g.lm), free(g.stats), free(g.dh),
                free(g.dw);
            hc_free(&c);
            runs++;
        }
        sph_ctx_destroy(ctx);
    }
    assert_true(runs >= 16);
    assert_true(ok);
}

// ---- tensor parallelism in threads ------------------------------------------------------------

typedef struct tr_job {
    tp_group *g;
    int64_t rank, ranks;
    const char *kernel;
    int one_pass;
    hcase *full, shard;
    sph_tensor *trows;
    sph_status st;
    char err[256];
} tr_job;

static void *tr_rank(void *arg) {
    tr_job *j = arg;
    hcase *f = j->full, *c = &j->shard;
    struct sph_comm comm = tp_comm_of(j->g, j->rank);
    const int64_t V = f->V, a0 = V * j->rank / j->ranks, a1 = V * (j->rank + 1) / j->ranks;
    *c = *f;
    c->V_loc = a1 - a0, c->v0 = a0;
    c->w = (char *)f->w + (size_t)(a0 * f->H) * hc_esize(f->dt);
    c->lp = hc_alloc((size_t)f->N * 4), c->ent = hc_alloc((size_t)f->N * 4);
    c->lse = hc_alloc((size_t)f->N * 4), c->lm = hc_alloc((size_t)f->N * 4);
    c->stats = hc_alloc((size_t)f->N * 12);
    c->dh = hc_alloc((size_t)(f->N * f->H) * 4), c->dw = hc_alloc((size_t)(c->V_loc * f->H) * 4);
    hc_poison(c);
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.force_kernel = j->kernel;
    o.num_threads = 1;
    o.chunk_rows = 5;
    o.tp_comm = &comm;
    sph_ctx_t ctx = NULL;
    j->st = sph_ctx_create(&ctx, &o);
    if (j->st == SPH_OK) {
        hc_wire(c, HC_OUTS | HC_MASK | (j->one_pass ? HC_UPS | HC_DH | HC_DW : 0));
        c->a.temperature_rows = j->trows;
        j->st = hc_run(ctx, SPH_HEAD_FORWARD, &c->a);
        if (j->st == SPH_OK && !j->one_pass) {
            hc_wire(c, HC_UPS | HC_DH | HC_DW | HC_MASK);
            c->a.temperature_rows = j->trows;
            j->st = hc_run(ctx, SPH_HEAD_BACKWARD, &c->a);
        }
    }
    if (j->st != SPH_OK) {
        snprintf(j->err, sizeof j->err, "rank %lld: %s", (long long)j->rank, sph_last_error());
        tp_group_abort(j->g);
    }
    sph_ctx_destroy(ctx);
    return NULL;
}

static void test_tp_threads(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 25105);
    const char *kernels[2] = {"ref", NULL};
    sph_ctx_t ref = hc_ctx("ref", 1, NULL);
    int ok = 1, runs = 0;
    for (int kk = 0; kk < 2; kk++)
        for (int v = 0; v < 8; v++) {
            const int64_t ranks = v & 1 ? 3 : 2, K = v & 2 ? 5 : 0, N = 29, H = 13, V = 1601;
            const int one_pass = v >> 2 & 1;
            hcase f;
            hc_init(&f, &r, N, H, V, V, 0, K, SPH_F32);
            hc_mask_ragged(&f, &r, 0.6);
            float *T = trows_new(&r, N, 0.3, 3.0);
            int64_t sht[1];
            sph_tensor tt = tensor1(T, SPH_F32, sht, N);
            hc_wire(&f, HC_OUTS | HC_MASK | HC_UPS | HC_DH | HC_DW);
            f.a.temperature_rows = &tt;
            hexp x;
            hc_expect(ref, &f.a, &x);
            tp_group g;
            tp_group_init(&g, ranks);
            tr_job jobs[3];
            pthread_t th[3];
            for (int64_t k = 0; k < ranks; k++) {
                memset(&jobs[k], 0, sizeof jobs[k]);
                jobs[k].g = &g, jobs[k].rank = k, jobs[k].ranks = ranks;
                jobs[k].kernel = kernels[kk], jobs[k].one_pass = one_pass;
                jobs[k].full = &f, jobs[k].trows = &tt;
                assert_int_equal(pthread_create(&th[k], NULL, tr_rank, &jobs[k]), 0);
            }
            for (int64_t k = 0; k < ranks; k++) pthread_join(th[k], NULL);
            tp_group_destroy(&g);
            double *dh = calloc((size_t)(N * H), 8);
            assert_non_null(dh);
            for (int64_t k = 0; k < ranks; k++) {
                char cs[128];
                snprintf(cs, sizeof cs, "tp(kernel=%s,ranks=%lld,rank=%lld,K=%lld,one_pass=%d)",
                         kernels[kk] ? kernels[kk] : "best", (long long)ranks, (long long)k,
                         (long long)K, one_pass);
                hcase *c = &jobs[k].shard;
                if (jobs[k].st != SPH_OK) {
                    fprintf(stderr, "FAIL %s: %s\n", cs, jobs[k].err);
                    ok = 0;
                } else {
                    ok &= hc_close_col("logprob", cs, c->lp, 1, x.rows, 7, 0, N, TOL_CPU_F32);
                    ok &= hc_close_col("entropy", cs, c->ent, 1, x.rows, 7, 1, N, TOL_CPU_F32);
                    ok &= hc_close_col("lse", cs, c->lse, 1, x.rows, 7, 2, N, TOL_CPU_F32);
                    ok &= hc_close_col("stats.mu", cs, c->stats + 2, 3, x.rows, 7, 6, N,
                                       TOL_CPU_F32);
                    /* this shard's dweight rows */
                    ok &= hc_close("dweight shard", cs, c->dw, SPH_F32, x.dw + c->v0 * H,
                                   SPH_F64, c->V_loc * H, TOL_CPU_F32);
                    for (int64_t q = 0; q < N * H; q++) dh[q] += ((float *)c->dh)[q];
                }
                free(c->lp), free(c->ent), free(c->lse), free(c->lm), free(c->stats);
                free(c->dh), free(c->dw);
            }
            /* the ranks' dhidden sum to the whole gradient */
            ok &= hc_close("dhidden (sum over ranks)", "tp", dh, SPH_F64, x.dh, SPH_F64, N * H,
                           TOL_CPU_F32);
            free(dh), free(T);
            hc_expect_free(&x);
            hc_free(&f);
            runs++;
        }
    sph_ctx_destroy(ref);
    assert_int_equal(runs, 16);
    assert_true(ok);
}

// ---- bad input -------------------------------------------------------------------------------

/* A pass that must fail with want and a message holding `needle`, writing nothing. */
static int expect_refused(sph_ctx_t ctx, hcase *c, sph_head_pass pass, sph_status want,
                          const char *needle, const char *what) {
    hc_poison(c);
    float *lp0 = hc_dup(c->lp, (size_t)c->N * 4), *st0 = hc_dup(c->stats, (size_t)c->N * 12);
    void *dh0 = hc_dup(c->dh, (size_t)(c->N * c->H) * 4);
    sph_status s = hc_run(ctx, pass, &c->a);
    int ok = s == want && strstr(sph_last_error(), needle) != NULL;
    if (pass == SPH_HEAD_FORWARD)
        ok &= !memcmp(lp0, c->lp, (size_t)c->N * 4) && !memcmp(st0, c->stats, (size_t)c->N * 12);
    ok &= !memcmp(dh0, c->dh, (size_t)(c->N * c->H) * 4);
    if (!ok)
        fprintf(stderr, "FAIL temperature_rows validation (%s): got %s '%s', expected %s naming "
                        "'%s' with nothing written\n",
                what, sph_status_str(s), sph_last_error(), sph_status_str(want), needle);
    free(lp0), free(st0), free(dh0);
    return ok;
}

static void test_validation(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 25106);
    int ok = 1;
    const char *kernels[2] = {"ref", NULL};
    for (int kk = 0; kk < 2; kk++) {
        sph_ctx_t ctx = hc_ctx(kernels[kk], 1, NULL);
        const int64_t N = 9, H = 5, V = 11;
        hcase c;
        hc_init(&c, &r, N, H, V, V, 0, 0, SPH_F32);
        float *T = hc_alloc((size_t)(N + 1) * 8);
        int64_t sh[1];
        sph_tensor t;
        const float bad[6] = {0.0f, -1.0f, NAN, INFINITY, 1e-40f /* subnormal */,
                              1e38f /* 1/T subnormal */};
        for (int pass = 0; pass < 2; pass++) {
            const sph_head_pass hp = pass ? SPH_HEAD_BACKWARD : SPH_HEAD_FORWARD;
            hc_wire(&c, pass ? HC_UPS | HC_DH | HC_DW : HC_OUTS);
            for (int b = 0; b < 6; b++) {
                for (int64_t i = 0; i <= N; i++) T[i] = 0.9f;
                T[4] = bad[b];
                t = tensor1(T, SPH_F32, sh, N);
                c.a.temperature_rows = &t;
                char what[48];
                snprintf(what, sizeof what, "T[4] = %g, %s", bad[b], pass ? "backward" : "forward");
                ok &= expect_refused(ctx, &c, hp, SPH_ERR_INVALID_ARG, "temperature_rows[4]", what);
            }
            for (int64_t i = 0; i <= N; i++) T[i] = 0.9f;
            t = tensor1(T, SPH_I32, sh, N);
            ok &= expect_refused(ctx, &c, hp, SPH_ERR_DTYPE, "temperature_rows", "i32 dtype");
            t = tensor1(T, SPH_F64, sh, N);
            ok &= expect_refused(ctx, &c, hp, SPH_ERR_DTYPE, "temperature_rows", "f64 dtype");
            t = tensor1(T, SPH_F32, sh, N + 1);
            ok &= expect_refused(ctx, &c, hp, SPH_ERR_SHAPE, "temperature_rows", "shape N + 1");
            t = tensor1(T, SPH_F32, sh, N);
            c.a.temperature = 0.7; /* two temperatures in one call */
            ok &= expect_refused(ctx, &c, hp, SPH_ERR_INVALID_ARG, "temperature", "scalar 0.7");
            c.a.temperature = 1.0;
        }
        /* the same memory as an output (lse in the forward, dhidden in the backward) */
        hc_wire(&c, HC_OUTS);
        for (int64_t i = 0; i < N; i++) c.lse[i] = 1.0f;
        t = tensor1(c.lse, SPH_F32, sh, N);
        c.a.temperature_rows = &t;
        sph_status s = hc_run(ctx, SPH_HEAD_FORWARD, &c.a);
        if (s != SPH_ERR_INVALID_ARG || !strstr(sph_last_error(), "temperature_rows")) {
            fprintf(stderr, "FAIL temperature_rows overlapping lse: %s '%s'\n", sph_status_str(s),
                    sph_last_error());
            ok = 0;
        }
        hc_wire(&c, HC_UPS | HC_DH | HC_DW);
        for (int64_t i = 0; i < N; i++) ((float *)c.dh)[i] = 1.0f;
        t = tensor1(c.dh, SPH_F32, sh, N);
        c.a.temperature_rows = &t;
        s = hc_run(ctx, SPH_HEAD_BACKWARD, &c.a);
        if (s != SPH_ERR_INVALID_ARG || !strstr(sph_last_error(), "temperature_rows")) {
            fprintf(stderr, "FAIL temperature_rows overlapping dhidden: %s '%s'\n",
                    sph_status_str(s), sph_last_error());
            ok = 0;
        }
        /* an inactive row's temperature is checked too (host memory: the whole vector) */
        hc_mask(&c, &r, 1.0);
        c.mask[4] = 0;
        hc_wire(&c, HC_OUTS | HC_MASK);
        for (int64_t i = 0; i < N; i++) T[i] = 1.1f;
        T[4] = 0.0f;
        t = tensor1(T, SPH_F32, sh, N);
        c.a.temperature_rows = &t;
        ok &= expect_refused(ctx, &c, SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG,
                             "temperature_rows[4]", "inactive row");
        /* an older struct that ends before the field: never read */
        T[4] = 1.1f;
        sph_head_args old = c.a;
        old.struct_size = offsetof(sph_head_args, temperature_rows);
        t = tensor1(T, SPH_I32, sh, N); /* would be refused if read */
        expect_ok(hc_run(ctx, SPH_HEAD_FORWARD, &old));
        free(T);
        hc_free(&c);
        sph_ctx_destroy(ctx);
    }
    assert_true(ok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_rowwise),      cmocka_unit_test(test_fd),
        cmocka_unit_test(test_cpu_vs_ref),       cmocka_unit_test(test_cpu_extreme_rowwise),
        cmocka_unit_test(test_tp_threads),       cmocka_unit_test(test_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
