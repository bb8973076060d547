/*
 * test_distill_cpu.c - the CPU backend of the distillation losses (and the reference backend,
 * force_kernel "ref") against the float64 oracle on the same rounded inputs:
 *   - every kind (jsd at 0.4 and its special cases), dense and sparse teachers (padding, tail
 *     mass 0, K = V), f32 and bf16, awkward sizes (a shard past one 256-wide vocabulary
 *     tile), masks, every reduction (none with dloss), temperature, softcap, a teacher
 *     temperature, per-row temperatures, 1 and 2 threads, several chunks (chunk_rows 3), accumulate_dweight;
 *   - TP shards in threads (2 and 3 ranks, uneven shards, several chunks: one combine per
 *     chunk), allreduce_dhidden or the partials summed here;
 *   - determinism (bitwise, same inputs) and outputs poisoned before every run.
 * Budget (f32 arithmetic on the same inputs; the logits are f32 products of H <= 40 terms,
 * ~1e-6 relative; statistics in float64): normwise 2e-5 of the largest |ref| + 2e-5 |ref|.
 */
#include "parity/test_distill_case.h"

static int check_loss(const dcase *c, const dexp *x, const char *cs) {
    if (c->red == SPH_REDUCTION_NONE)
        return check_close("loss rows", cs, c->loss, x->rows, (size_t)c->N, 1e-6, 2e-5);
    return check_close("loss", cs, c->loss, &x->red, 1, 1e-6, 2e-5);
}

static double maxabs(const double *x, size_t n) {
    double m = 0;
    for (size_t k = 0; k < n; k++) m = fabs(x[k]) > m ? fabs(x[k]) : m;
    return m;
}

static int check_grads(const char *cs, const float *dh, const double *rdh, size_t nh,
                       const float *dw, const double *rdw, size_t nw) {
    int ok = 1;
    if (dh) ok &= check_close("dhidden", cs, dh, rdh, nh, 2e-5 * maxabs(rdh, nh) + 1e-9, 2e-5);
    if (dw) ok &= check_close("dweight", cs, dw, rdw, nw, 2e-5 * maxabs(rdw, nw) + 1e-9, 2e-5);
    return ok;
}

static sph_ctx_t make_ctx(const char *kernel, int threads, int64_t chunk_rows, sph_comm_t comm) {
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.force_kernel = kernel;
    o.num_threads = threads;
    o.chunk_rows = chunk_rows;
    o.tp_comm = comm;
    sph_ctx_t ctx = NULL;
    expect_ok(sph_ctx_create(&ctx, &o));
    return ctx;
}

static const int g_kinds[5] = {SPH_DISTILL_FORWARD_KL, SPH_DISTILL_REVERSE_KL, SPH_DISTILL_JSD,
                               SPH_DISTILL_JSD, SPH_DISTILL_JSD};
static const double g_betas[5] = {0.5, 0.5, 0.4, 0.0, 1.0};

/* One configuration, one rank: c wired, run on kernel, compared; dweight accumulated onto a
 * random start when acc. */
static int one(dcase *c, const char *kernel, int threads, int64_t chunk, int acc, sph_rng *r) {
    char cs[320], extra[96];
    snprintf(extra, sizeof extra, "kernel=%s,threads=%d,chunk=%lld,acc_dw=%d", kernel ? kernel : "cpu",
             threads, (long long)chunk, acc);
    dc_case_str(c, extra, cs, sizeof cs);
    dc_wire(c, DC_DH | DC_DW | DC_DLOSS);
    c->a.accumulate_dweight = acc;
    dc_poison(c);
    float *dw0 = NULL;
    if (acc) {
        dw0 = hc_alloc((size_t)(c->V * c->H) * 4);
        for (int64_t k = 0; k < c->V * c->H; k++) c->dw[k] = dw0[k] = (float)rng_normal(r);
    }
    sph_ctx_t ctx = make_ctx(kernel, threads, chunk, NULL);
    expect_ok(dc_run(ctx, c));
    dexp x;
    dc_expect(c, &x);
    if (acc)
        for (int64_t k = 0; k < c->V * c->H; k++) x.dw[k] += dw0[k];
    /* inactive rows of dhidden are exact zeros */
    int ok = check_loss(c, &x, cs);
    ok &= check_grads(cs, c->dh, x.dh, (size_t)(c->N * c->H), c->dw, x.dw, (size_t)(c->V * c->H));
    for (int64_t i = 0; c->mask && i < c->N; i++)
        for (int64_t k = 0; !c->mask[i] && k < c->H; k++)
            if (c->dh[i * c->H + k] != 0.0f) {
                print_error("%s: dhidden[%lld, %lld] = %g on an inactive row\n", cs, (long long)i,
                            (long long)k, (double)c->dh[i * c->H + k]);
                ok = 0;
            }
    if (!acc && !kernel) { /* determinism: the same bits again */
        float *l1 = hc_dup(c->loss, (size_t)c->N * 4), *h1 = hc_dup(c->dh, (size_t)(c->N * c->H) * 4);
        float *w1 = hc_dup(c->dw, (size_t)(c->V * c->H) * 4);
        dc_poison(c);
        expect_ok(dc_run(ctx, c));
        const size_t nl = c->red == SPH_REDUCTION_NONE ? (size_t)c->N : 1;
        if (memcmp(l1, c->loss, nl * 4) || memcmp(h1, c->dh, (size_t)(c->N * c->H) * 4) ||
            memcmp(w1, c->dw, (size_t)(c->V * c->H) * 4)) {
            print_error("%s: a second run gave other bits\n", cs);
            ok = 0;
        }
        free(l1), free(h1), free(w1);
    }
    sph_ctx_destroy(ctx);
    dc_expect_free(&x);
    free(dw0);
    return ok;
}

static void test_cases(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    int ok = 1, n = 0;
    const unsigned sflags[4] = {DC_PAD, DC_TAIL0 | DC_PAD, DC_ALLV, 0};
    for (int dense = 0; dense <= 1; dense++)
        for (int k = 0; k < 5; k++)
            for (int v = 0; v < 4; v++, n++) {
                dcase c;
                const sph_dtype dt = n % 3 == 2 ? SPH_BF16 : SPH_F32;
                const int64_t V = v == 3 ? 300 : 13 + 2 * v, N = 11 + v;
                dc_init(&c, &r, N, 7 + v, V, 5, v == 3 ? 9 : 4, dt, dense,
                        dense ? (v == 1 ? DC_TIES : 0) : sflags[v]);
                c.kind = g_kinds[k], c.beta = g_betas[k];
                c.red = (k + v) % 3;
                if ((k + v) % 2) dc_mask(&c, &r, 0.6);
                if (v == 1) c.T = 0.6;
                if (v == 2) c.cap = 2.0, c.T = 1.2;
                if (dense && v == 0) c.TT = 1.7;
                if (n % 4 == 3) dc_trows(&c, &r, 0.5, 2.0); /* per-row temperatures */
                const int threads = 1 + n % 2;
                ok &= one(&c, NULL, threads, n % 2 ? 3 : 0, v == 2, &r);
                if (k == 0 || v == 0) ok &= one(&c, "ref", 1, 0, 0, &r);
                dc_free(&c);
            }
    assert_true(ok);
}

// ---- TP in threads ------------------------------------------------------------------------

typedef struct djob {
    tp_group *g;
    int64_t rank, ranks, chunk;
    int allreduce;
    const dcase *full;
    dcase shard;
    sph_status st;
    char err[256];
} djob;

static void *rank_main(void *arg) {
    djob *j = arg;
    const dcase *f = j->full;
    dcase *c = &j->shard;
    struct sph_comm comm = tp_comm_of(j->g, j->rank);
    const int64_t a0 = f->V * j->rank / j->ranks, a1 = f->V * (j->rank + 1) / j->ranks;
    *c = *f;
    c->v0 = a0, c->V_loc = a1 - a0;
    c->loss = hc_alloc((size_t)f->N * 4), c->dh = hc_alloc((size_t)(f->N * f->H) * 4);
    c->dw = hc_alloc((size_t)(c->V_loc * f->H) * 4);
    dc_wire(c, DC_DH | DC_DW | DC_DLOSS);
    c->a.allreduce_dhidden = j->allreduce;
    dc_poison(c);
    sph_ctx_t ctx = NULL;
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.num_threads = 1;
    o.chunk_rows = j->chunk;
    o.tp_comm = &comm;
    j->st = sph_ctx_create(&ctx, &o);
    if (j->st == SPH_OK) j->st = dc_run(ctx, c);
    if (j->st != SPH_OK) {
        snprintf(j->err, sizeof j->err, "%s", sph_last_error());
        tp_group_abort(j->g);
    }
    sph_ctx_destroy(ctx);
    return NULL;
}

static int tp_case(dcase *f, int64_t ranks, int64_t chunk, int allreduce) {
    char cs[320], extra[96];
    snprintf(extra, sizeof extra, "tp=%lld,chunk=%lld,allreduce=%d", (long long)ranks,
             (long long)chunk, allreduce);
    dc_case_str(f, extra, cs, sizeof cs);
    dc_wire(f, DC_DH | DC_DW | DC_DLOSS); /* the full case's d.dloss for the oracle */
    tp_group g;
    tp_group_init(&g, ranks);
    djob jobs[4];
    pthread_t th[4];
    for (int64_t k = 0; k < ranks; k++) {
        memset(&jobs[k], 0, sizeof jobs[k]);
        jobs[k] = (djob){.g = &g, .rank = k, .ranks = ranks, .chunk = chunk,
                         .allreduce = allreduce, .full = f};
        assert_int_equal(pthread_create(&th[k], NULL, rank_main, &jobs[k]), 0);
    }
    for (int64_t k = 0; k < ranks; k++) pthread_join(th[k], NULL);
    tp_group_destroy(&g);
    int ok = 1;
    for (int64_t k = 0; k < ranks; k++)
        if (jobs[k].st != SPH_OK) {
            print_error("%s: rank %lld: %s\n", cs, (long long)k, jobs[k].err);
            ok = 0;
        }
    dexp x;
    dc_expect(f, &x);
    const int64_t NH = f->N * f->H;
    float *dh = hc_alloc((size_t)NH * 4);
    for (int64_t e = 0; e < NH; e++) {
        double s = 0;
        for (int64_t k = 0; k < ranks && ok; k++) s += jobs[k].shard.dh[e];
        dh[e] = (float)(allreduce ? jobs[0].shard.dh[e] : s);
    }
    for (int64_t k = 0; k < ranks && ok; k++) {
        dcase *c = &jobs[k].shard;
        ok &= check_loss(c, &x, cs);
        ok &= check_grads(cs, NULL, NULL, 0, c->dw, x.dw + c->v0 * f->H,
                          (size_t)(c->V_loc * f->H));
        if (allreduce && memcmp(c->dh, jobs[0].shard.dh, (size_t)NH * 4)) {
            print_error("%s: rank %lld's all-reduced dhidden differs from rank 0's\n", cs, (long long)k);
            ok = 0;
        }
        const size_t nl = f->red == SPH_REDUCTION_NONE ? (size_t)f->N : 1;
        if (memcmp(c->loss, jobs[0].shard.loss, nl * 4)) {
            print_error("%s: rank %lld's loss differs from rank 0's (bits)\n", cs, (long long)k);
            ok = 0;
        }
    }
    if (ok) ok &= check_grads(cs, dh, x.dh, (size_t)NH, NULL, NULL, 0);
    for (int64_t k = 0; k < ranks; k++)
        free(jobs[k].shard.loss), free(jobs[k].shard.dh), free(jobs[k].shard.dw);
    free(dh);
    dc_expect_free(&x);
    return ok;
}

static void test_tp(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    int ok = 1, n = 0;
    for (int dense = 0; dense <= 1; dense++)
        for (int k = 0; k < 5; k++, n++) {
            dcase c;
            dc_init(&c, &r, 10, 6, 29, 4, 5, n % 3 == 1 ? SPH_BF16 : SPH_F32, dense,
                    n % 2 ? DC_PAD : DC_TAIL0 | DC_PAD);
            c.kind = g_kinds[k], c.beta = g_betas[k];
            c.red = n % 3;
            if (n % 2) dc_mask(&c, &r, 0.7);
            if (k == 2) c.cap = 3.0;
            if (k == 1) dc_trows(&c, &r, 0.5, 2.0);
            ok &= tp_case(&c, 2 + n % 2, n % 2 ? 3 : 4, n % 4 == 0);
            dc_free(&c);
        }
    assert_true(ok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_tp),
    };
    return test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
