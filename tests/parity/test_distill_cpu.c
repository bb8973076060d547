/*
 * test_distill_cpu.c - the CPU backend of the distillation losses (and the reference backend,
 * force_kernel "ref") against the float64 oracle on the same rounded inputs:
 *   - every kind (jsd at 0.4 and its special cases), dense and sparse teachers (padding, tail
 *     mass 0, K = V), f32 and bf16, awkward sizes (a shard past one 256-wide vocabulary
 *     tile), masks, every reduction (none with dloss), temperature, softcap, a teacher
 *     temperature, per-row temperatures, 1 and 2 threads, several chunks (chunk_rows 3), accumulate_dweight;
 *   - TP shards in threads (2 and 3 ranks, uneven shards, several chunks: one combine per
 *     chunk), allreduce_dhidden or the partials summed here;
 *   - CP: rows split over 2-3 ranks of a seq_comm group (in threads, with and without TP
 *     shards), or micro-batches given num_tokens: the ranks' losses, dhidden rows and summed
 *     dweight are the one-call mean's; num_tokens alone against the oracle's mean over it;
 *     ranks that disagree fail together with nothing written;
 *   - NaN / inf in an active hidden (or teacher_hidden) row of a later chunk: refused with
 *     nothing written (loss, dhidden plain and accumulated, dweight), one rank and TP;
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
                /* the teacher's per-row temperatures, alone (v 2) and with the student's (v 3) */
                if (dense && v >= 2 && k % 2 == 0) dc_ttrows(&c, &r, 0.4, 2.5);
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
            if (dense && k >= 3) dc_ttrows(&c, &r, 0.4, 2.5); /* with trows at k 1: no */
            ok &= tp_case(&c, 2 + n % 2, n % 2 ? 3 : 4, n % 4 == 0);
            dc_free(&c);
        }
    assert_true(ok);
}

// ---- CP and micro-batches: reduction mean's divisor over a group ---------------------------

/* Rank (cp, tp) of a C x T grid in threads: rows [r0, r1) of the full case (C contiguous
 * pieces), vocabulary shard tp of T; tp groups per cp rank, a seq_comm group per tp rank
 * (gc NULL: no group, num_tokens given instead). */
typedef struct cjob {
    tp_group *gt, *gc;
    int64_t cp, C, tp, T, r0, r1, chunk, num_tokens;
    const char *kernel;
    const dcase *full;
    dcase shard;
    float *snap; /* the poisoned outputs, to compare after a refused call */
    sph_status st;
    char err[256];
} cjob;

static void *cp_main(void *arg) {
    cjob *j = arg;
    const dcase *f = j->full;
    dcase *c = &j->shard;
    struct sph_comm tpc = tp_comm_of(j->gt, j->tp), sqc;
    if (j->gc) sqc = tp_comm_of(j->gc, j->cp);
    const int64_t n = j->r1 - j->r0, es = (int64_t)hc_esize(f->dt);
    *c = *f;
    c->N = n;
    c->h = (char *)f->h + j->r0 * f->H * es;
    if (f->dense) {
        c->th = (char *)f->th + j->r0 * f->HT * es;
    } else {
        c->ids = f->ids + j->r0 * f->K, c->lp = f->lp + j->r0 * f->K;
    }
    c->mask = f->mask ? f->mask + j->r0 : NULL;
    c->trows = f->trows ? f->trows + j->r0 : NULL;
    c->ttrows = f->ttrows ? f->ttrows + j->r0 : NULL;
    c->dloss = f->dloss + j->r0;
    c->v0 = f->V * j->tp / j->T, c->V_loc = f->V * (j->tp + 1) / j->T - c->v0;
    /* (mean / sum write one float even on a rank of no rows) */
    c->loss = hc_alloc((size_t)(n > 0 ? n : 1) * 4), c->dh = hc_alloc((size_t)(n * f->H) * 4);
    c->dw = hc_alloc((size_t)(c->V_loc * f->H) * 4);
    c->num_tokens = j->num_tokens;
    dc_wire(c, DC_DH | DC_DW | DC_DLOSS);
    c->a.allreduce_dhidden = j->T > 1;
    if (j->gc) c->d.seq_comm = &sqc;
    dc_poison(c);
    const size_t nl = c->red == SPH_REDUCTION_NONE ? (size_t)n : 1, nh = (size_t)(n * f->H),
                 nw = (size_t)(c->V_loc * f->H);
    j->snap = hc_alloc((nl + nh + nw) * 4);
    memcpy(j->snap, c->loss, nl * 4), memcpy(j->snap + nl, c->dh, nh * 4);
    memcpy(j->snap + nl + nh, c->dw, nw * 4);
    sph_ctx_t ctx = NULL;
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.num_threads = 1, o.chunk_rows = j->chunk, o.force_kernel = j->kernel;
    o.tp_comm = j->T > 1 ? &tpc : NULL;
    j->st = sph_ctx_create(&ctx, &o);
    if (j->st == SPH_OK) j->st = dc_run(ctx, c);
    if (j->st != SPH_OK) snprintf(j->err, sizeof j->err, "%s", sph_last_error());
    sph_ctx_destroy(ctx);
    return NULL;
}

/* Runs the C x T grid on f (nt1: the num_tokens of rank (cp, tp) = 1 in cp * T + tp order,
 * nt every other rank's). */
static void cp_grid(dcase *f, cjob *jobs, int64_t C, int64_t T, int64_t chunk, int group,
                    int64_t nt, int64_t nt1, const char *kernel) {
    tp_group gt[4], gc[4];
    pthread_t th[8];
    for (int64_t k = 0; k < C; k++) tp_group_init(&gt[k], T);
    for (int64_t k = 0; k < T; k++) tp_group_init(&gc[k], C);
    for (int64_t cp = 0; cp < C; cp++)
        for (int64_t tp = 0; tp < T; tp++) {
            cjob *j = &jobs[cp * T + tp];
            memset(j, 0, sizeof *j);
            *j = (cjob){.gt = &gt[cp], .gc = group ? &gc[tp] : NULL, .cp = cp, .C = C, .tp = tp,
                        .T = T, .r0 = f->N * cp / C, .r1 = f->N * (cp + 1) / C, .chunk = chunk,
                        .num_tokens = cp * T + tp == 1 ? nt1 : nt, .kernel = kernel,
                        .full = f};
            assert_int_equal(pthread_create(&th[cp * T + tp], NULL, cp_main, j), 0);
        }
    for (int64_t k = 0; k < C * T; k++) pthread_join(th[k], NULL);
    for (int64_t k = 0; k < C; k++) tp_group_destroy(&gt[k]);
    for (int64_t k = 0; k < T; k++) tp_group_destroy(&gc[k]);
}

static void cp_free(cjob *jobs, int64_t n) {
    for (int64_t k = 0; k < n; k++)
        free(jobs[k].shard.loss), free(jobs[k].shard.dh), free(jobs[k].shard.dw),
            free(jobs[k].snap);
}

/* The C x T ranks' losses summed (mean / sum) or concatenated (none), their dhidden rows
 * concatenated and their dweight shards summed over C must be the one-call float64 oracle's
 * of all N rows (mean over all the active rows): with the seq_comm group counting them
 * (group), or with num_tokens = all the active rows given to every call (the micro-batches of
 * a global batch, no group). */
static int cp_case(dcase *f, int64_t C, int64_t T, int64_t chunk, int group, const char *kernel) {
    char cs[320], extra[128];
    snprintf(extra, sizeof extra, "cp=%lld,tp=%lld,chunk=%lld,%s,kernel=%s", (long long)C,
             (long long)T, (long long)chunk, group ? "seq_comm" : "num_tokens",
             kernel ? kernel : "cpu");
    dc_case_str(f, extra, cs, sizeof cs);
    dc_wire(f, DC_DH | DC_DW | DC_DLOSS);
    dexp x;
    dc_expect(f, &x);
    cjob jobs[8];
    cp_grid(f, jobs, C, T, chunk, group, group ? 0 : x.n_act, group ? 0 : x.n_act, kernel);
    int ok = 1;
    for (int64_t k = 0; k < C * T; k++)
        if (jobs[k].st != SPH_OK) {
            print_error("%s: rank (cp %lld, tp %lld): %s\n", cs, (long long)jobs[k].cp,
                        (long long)jobs[k].tp, jobs[k].err);
            ok = 0;
        }
    const int none = f->red == SPH_REDUCTION_NONE;
    float *loss = hc_alloc((size_t)f->N * 4), *dh = hc_alloc((size_t)(f->N * f->H) * 4);
    float *dw = hc_alloc((size_t)(f->V * f->H) * 4);
    double tot = 0;
    for (int64_t cp = 0; cp < C && ok; cp++) {
        const cjob *j0 = &jobs[cp * T];
        const size_t n = (size_t)(j0->r1 - j0->r0), nl = none ? n : 1;
        for (int64_t tp = 1; tp < T; tp++)
            if (memcmp(jobs[cp * T + tp].shard.loss, j0->shard.loss, nl * 4)) {
                print_error("%s: cp %lld: tp rank %lld's loss differs from tp 0's (bits)\n", cs,
                            (long long)cp, (long long)tp);
                ok = 0;
            }
        if (none) memcpy(loss + j0->r0, j0->shard.loss, n * 4);
        else tot += j0->shard.loss[0];
        memcpy(dh + j0->r0 * f->H, j0->shard.dh, n * (size_t)f->H * 4);
    }
    for (int64_t tp = 0; tp < T && ok; tp++) {
        const dcase *s0 = &jobs[tp].shard;
        for (int64_t e = 0; e < s0->V_loc * f->H; e++) {
            double a = 0;
            for (int64_t cp = 0; cp < C; cp++) a += jobs[cp * T + tp].shard.dw[e];
            dw[s0->v0 * f->H + e] = (float)a;
        }
    }
    if (ok) {
        const float red = (float)tot;
        ok &= none ? check_close("loss rows", cs, loss, x.rows, (size_t)f->N, 1e-6, 2e-5)
                   : check_close("loss (summed over the ranks)", cs, &red, &x.red, 1, 1e-6, 2e-5);
        ok &= check_grads(cs, dh, x.dh, (size_t)(f->N * f->H), dw, x.dw, (size_t)(f->V * f->H));
    }
    cp_free(jobs, C * T);
    free(loss), free(dh), free(dw);
    dc_expect_free(&x);
    return ok;
}

static void test_cp(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    int ok = 1, n = 0;
    for (int dense = 0; dense <= 1; dense++)
        for (int k = 0; k < 5; k++, n++) {
            dcase c;
            dc_init(&c, &r, 13, 6, 29, 4, 5, n % 3 == 1 ? SPH_BF16 : SPH_F32, dense, DC_PAD);
            c.kind = g_kinds[k], c.beta = g_betas[k];
            c.red = n % 3 == 2 ? SPH_REDUCTION_SUM : SPH_REDUCTION_MEAN; /* mean twice as often */
            if (n == 4) c.red = SPH_REDUCTION_NONE;
            dc_mask(&c, &r, 0.6);
            if (k == 1) dc_trows(&c, &r, 0.5, 2.0);
            const int64_t C = 2 + n % 2, T = n % 4 == 1 ? 2 : 1;
            ok &= cp_case(&c, C, T, n % 2 ? 3 : 0, 1, n == 6 ? "ref" : NULL);
            ok &= cp_case(&c, 2, 1, 0, 0, NULL); /* micro-batches with num_tokens */
            dc_free(&c);
        }
    /* more ranks than rows: a rank of the group with no row at all still counts (0) */
    for (int dense = 0; dense <= 1; dense++) {
        dcase c;
        dc_init(&c, &r, 2, 5, 13, 3, 3, SPH_F32, dense, DC_PAD);
        c.kind = SPH_DISTILL_REVERSE_KL;
        ok &= cp_case(&c, 3, 1, 0, 1, dense ? "ref" : NULL); /* the reference: one TP rank */
        ok &= cp_case(&c, 3, 2, 0, 1, NULL);
        dc_free(&c);
    }
    assert_true(ok);
}

/* num_tokens alone: the mean over num_tokens, not the active rows (the float64 oracle of that
 * mean; the CPU backend and the reference). */
static void test_num_tokens(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    int ok = 1;
    for (int dense = 0; dense <= 1; dense++)
        for (int ref = 0; ref <= 1; ref++) {
            dcase c;
            dc_init(&c, &r, 9, 5, 17, 3, 4, SPH_F32, dense, DC_PAD);
            c.kind = SPH_DISTILL_JSD, c.beta = 0.3;
            dc_mask(&c, &r, 0.7);
            c.num_tokens = 23; /* a global batch's T, larger than this call's rows */
            ok &= one(&c, ref ? "ref" : NULL, 1, 4, 0, &r);
            dc_free(&c);
        }
    assert_true(ok);
}

/* A seq_comm group, or a TP group, whose ranks disagree on num_tokens: SPH_ERR_MISMATCH on
 * every rank, nothing written; num_tokens < 0 refused by name. */
static void test_cp_mismatch(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    dcase c;
    dc_init(&c, &r, 8, 5, 11, 3, 3, SPH_F32, 0, DC_PAD);
    dc_wire(&c, DC_DH | DC_DW);
    cjob jobs[2];
    cp_grid(&c, jobs, 2, 1, 0, 1, 0, 5, NULL);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(jobs[k].st, SPH_ERR_MISMATCH);
        assert_non_null(strstr(jobs[k].err, "num_tokens"));
        const dcase *s = &jobs[k].shard;
        const size_t nh = (size_t)(s->N * s->H), nw = (size_t)(s->V_loc * s->H);
        assert_memory_equal(jobs[k].snap, s->loss, 4);
        assert_memory_equal(jobs[k].snap + 1, s->dh, nh * 4);
        assert_memory_equal(jobs[k].snap + 1 + nh, s->dw, nw * 4);
    }
    cp_free(jobs, 2);
    /* a TP group (T = 2, no CP) whose ranks differ in num_tokens: the TP agreement names it */
    cp_grid(&c, jobs, 1, 2, 0, 0, 0, 5, NULL);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(jobs[k].st, SPH_ERR_MISMATCH);
        assert_non_null(strstr(jobs[k].err, "num_tokens"));
        const dcase *s = &jobs[k].shard;
        const size_t nh = (size_t)(s->N * s->H), nw = (size_t)(s->V_loc * s->H);
        assert_memory_equal(jobs[k].snap, s->loss, 4);
        assert_memory_equal(jobs[k].snap + 1, s->dh, nh * 4);
        assert_memory_equal(jobs[k].snap + 1 + nh, s->dw, nw * 4);
    }
    cp_free(jobs, 2);
    c.num_tokens = -3;
    dc_wire(&c, DC_DH | DC_DW);
    sph_ctx_t ctx = make_ctx(NULL, 1, 0, NULL);
    assert_int_equal(dc_run(ctx, &c), SPH_ERR_INVALID_ARG);
    assert_non_null(strstr(sph_last_error(), "num_tokens: -3"));
    sph_ctx_destroy(ctx);
    dc_free(&c);
}

// ---- non-finite inputs: refused before any output is written ----------------------------

/* NaN / inf in an active row of hidden (or of the dense teacher's hidden) in a chunk after
 * the first (chunk_rows 2): SPH_ERR_NONFINITE with nothing written, loss, dhidden (plain and
 * accumulated onto) and dweight byte for byte as poisoned; the context counts the rows. The
 * same value on an inactive row is never read. CPU and reference backends, f32 and bf16, one
 * rank and a TP group of 2 in threads. */
static int nonfinite_one(sph_rng *r, int dense, sph_dtype dt, int teacher_row, int inf,
                         const char *kernel, int tp) {
    char cs[320];
    dcase c;
    dc_init(&c, r, 11, 6, 17, 4, 3, dt, dense, DC_PAD);
    dc_mask(&c, r, 0.6);
    c.mask[8] = 1, c.mask[9] = 0;
    const double bad = inf ? INFINITY : NAN;
    if (teacher_row) hc_set(c.th, dt, 8 * c.HT + 1, bad);
    else hc_set(c.h, dt, 8 * c.H + 2, bad);
    hc_set(c.h, dt, 9 * c.H, NAN); /* an inactive row: never read */
    snprintf(cs, sizeof cs, "nonfinite(dense=%d,%s,teacher_row=%d,inf=%d,kernel=%s,tp=%d)", dense,
             sph_dtype_name(dt), teacher_row, inf, kernel ? kernel : "cpu", tp);
    int ok = 1;
    if (tp) {
        dc_wire(&c, DC_DH | DC_DW);
        cjob jobs[2];
        cp_grid(&c, jobs, 1, 2, 2, 0, 0, 0, NULL);
        for (int k = 0; k < 2; k++) {
            const dcase *s = &jobs[k].shard;
            const size_t nh = (size_t)(s->N * s->H), nw = (size_t)(s->V_loc * s->H);
            if (jobs[k].st != SPH_ERR_NONFINITE || !strstr(jobs[k].err, "nothing written") ||
                memcmp(jobs[k].snap, s->loss, 4) || memcmp(jobs[k].snap + 1, s->dh, nh * 4) ||
                memcmp(jobs[k].snap + 1 + nh, s->dw, nw * 4)) {
                print_error("%s: rank %d: status %d (%s), outputs %s\n", cs, k, (int)jobs[k].st,
                            jobs[k].err,
                            memcmp(jobs[k].snap + 1, s->dh, nh * 4) ? "written" : "untouched");
                ok = 0;
            }
        }
        cp_free(jobs, 2);
        dc_free(&c);
        return ok;
    }
    for (int acc = 0; acc <= 1; acc++) {
        dc_wire(&c, DC_DH | DC_DW);
        c.a.accumulate_dhidden = acc;
        dc_poison(&c);
        for (int64_t e = 0; acc && e < c.N * c.H; e++) c.dh[e] = (float)rng_normal(r); /* finite */
        float *l0 = hc_dup(c.loss, 4), *h0 = hc_dup(c.dh, (size_t)(c.N * c.H) * 4);
        float *w0 = hc_dup(c.dw, (size_t)(c.V * c.H) * 4);
        sph_ctx_t ctx = make_ctx(kernel, 1, 2, NULL);
        const sph_status st = dc_run(ctx, &c);
        int64_t nf = 0, first = -1;
        expect_ok(sph_ctx_nonfinite(ctx, &nf, &first));
        if (st != SPH_ERR_NONFINITE || !strstr(sph_last_error(), "nothing written") ||
            !strstr(sph_last_error(), teacher_row ? "teacher_hidden[8" : "hidden[8") ||
            nf != 1 || first != 8) {
            print_error("%s: acc_dh=%d: status %d (%s), counted %lld first %lld\n", cs, acc,
                        (int)st, sph_last_error(), (long long)nf, (long long)first);
            ok = 0;
        }
        if (memcmp(l0, c.loss, 4) || memcmp(h0, c.dh, (size_t)(c.N * c.H) * 4) ||
            memcmp(w0, c.dw, (size_t)(c.V * c.H) * 4)) {
            print_error("%s: acc_dh=%d: an output was written\n", cs, acc);
            ok = 0;
        }
        free(l0), free(h0), free(w0);
        sph_ctx_destroy(ctx);
    }
    /* the bad row made inactive: the call succeeds, every output finite */
    c.mask[8] = 0;
    dc_wire(&c, DC_DH | DC_DW);
    dc_poison(&c);
    sph_ctx_t ctx = make_ctx(kernel, 1, 2, NULL);
    if (dc_run(ctx, &c) != SPH_OK || !isfinite(c.loss[0])) {
        print_error("%s: with the row inactive: %s, loss %g\n", cs, sph_last_error(),
                    (double)c.loss[0]);
        ok = 0;
    }
    for (int64_t e = 0; e < c.N * c.H && ok; e++)
        if (!isfinite(c.dh[e])) {
            print_error("%s: with the row inactive: dhidden[%lld] = %g\n", cs, (long long)e,
                        (double)c.dh[e]);
            ok = 0;
        }
    sph_ctx_destroy(ctx);
    dc_free(&c);
    return ok;
}

static void test_nonfinite_nothing_written(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    int ok = 1;
    for (int dense = 0; dense <= 1; dense++)
        for (int v = 0; v < 4; v++)
            ok &= nonfinite_one(&r, dense, v == 1 ? SPH_BF16 : SPH_F32, dense && v == 2, v == 3,
                                v == 2 ? "ref" : NULL, 0);
    ok &= nonfinite_one(&r, 0, SPH_F32, 0, 0, NULL, 1);
    ok &= nonfinite_one(&r, 1, SPH_BF16, 1, 0, NULL, 1);
    assert_true(ok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_tp),
        cmocka_unit_test(test_cp),
        cmocka_unit_test(test_num_tokens),
        cmocka_unit_test(test_cp_mismatch),
        cmocka_unit_test(test_nonfinite_nothing_written),
    };
    return test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
