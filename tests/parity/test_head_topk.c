/*
 * test_head_topk.c - the head's top-k outputs (issue 25 item 2: topk_ids (N, K) i64 and
 * topk_logprobs (N, K) f32, the K most probable ids of every active row, descending, ties the
 * lower id first), on the float64 reference and every CPU kernel set, against a float64
 * full-sort oracle written here (every logit of the row from the inputs, sorted with the id
 * as the tie-break, log-probs z - lse): awkward vocabularies (613, not a multiple of 128;
 * several tiles), K = 1, 7, 64, 256 and K = V, exact ties by construction (equal weight
 * rows, across tiles and shards, scaled up so they land in the top), masks (inactive rows
 * ids -1, log-probs exactly 0), bf16, temperature and softcap, one-pass and forward-only,
 * several chunks; tensor parallelism in threads (2 and 3 ranks, K above a rank's V_loc,
 * one combine per chunk in one-pass mode); and its validation (K = 0, K = 257, K > V, one
 * tensor alone, dtypes, shapes, aliasing, candidates, older struct_size,
 * the backward ignoring them: nothing written). Outputs are poisoned before each run.
 *
 * The check: log-probs position by position against the oracle's sorted log-probs (robust to
 * the order of near-ties), and each returned log-prob against the oracle's log-prob of the id
 * returned (the same number logprob gives for it); ids distinct and in range, and equal to the
 * oracle's wherever the oracle's gap to both neighbours exceeds gap_tol (the reference:
 * 1e-9, so exact ties must come out lower id first; fp32 backends: 1e-4).
 */
#include "test_head_case.h"

#include "topk_check.h"

/* Ties by construction: weight rows copied (after scaling up the source, so that they sit
 * in the top of most rows): inside a tile, across tiles, and across the shards of a TP split. */
static void plant_ties(hcase *c) {
    const int64_t pairs[4][2] = {{5, 6}, {17, 300}, {40, c->V_loc - 1}, {90, c->V_loc / 2}};
    for (int q = 0; q < 4; q++) {
        const int64_t a = pairs[q][0], b = pairs[q][1];
        if (a >= c->V_loc || b >= c->V_loc || a == b) continue;
        for (int64_t k = 0; k < c->H; k++) {
            const double x = hc_get(c->w, c->dt, a * c->H + k) * 2.5;
            hc_set(c->w, c->dt, a * c->H + k, x);
            hc_set(c->w, c->dt, b * c->H + k, hc_get(c->w, c->dt, a * c->H + k));
        }
    }
}

typedef struct tkbuf {
    int64_t *ids;
    float *lp;
    int64_t sh_i[2], sh_l[2];
    sph_tensor ti, tl;
} tkbuf;

static void tk_alloc(tkbuf *b, int64_t N, int64_t K) {
    b->ids = hc_alloc((size_t)(N * K + 1) * 8);
    b->lp = hc_alloc((size_t)(N * K + 1) * 4);
    b->ti = tensor2(b->ids, SPH_I64, b->sh_i, N, K);
    b->tl = tensor2(b->lp, SPH_F32, b->sh_l, N, K);
}

static void tk_poison(tkbuf *b, int64_t N, int64_t K) {
    for (int64_t k = 0; k < N * K; k++) b->ids[k] = 0x5a5a5a5a5a5aLL;
    poison_f32(b->lp, (size_t)(N * K));
}

static void tk_free(tkbuf *b) { free(b->ids), free(b->lp); }

// ---- one process: every kernel set ---------------------------------------------------------------

static void test_topk(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 25101);
    const char *kernels[5] = {"ref", NULL, "generic", "avx2", "avx512"};
    int ok = 1, runs = 0;
    for (int kk = 0; kk < 5; kk++) {
        sph_ctx_opts o = SPH_CTX_OPTS_INIT;
        o.force_kernel = kernels[kk];
        o.num_threads = 2;
        o.chunk_rows = 7; /* several chunks: one-pass combines per chunk */
        sph_ctx_t ctx = NULL;
        if (sph_ctx_create(&ctx, &o) != SPH_OK) continue; /* an ISA this machine lacks */
        for (int v = 0; v < 20; v++) {
            const int64_t V = v % 5 == 4 ? 137 : 613; /* 3 tiles of 256, or one narrow one */
            const int64_t Ks[5] = {1, 7, 64, 256, 137};
            const int64_t K = Ks[v % 5];
            const int masked = v >> 1 & 1, one_pass = v >> 2 & 1, bf = v % 7 == 3;
            const double T = v % 3 ? 0.6 : 1.0, cap = v % 4 == 1 ? 2.5 : 0.0;
            const int64_t N = 23, H = 19;
            hcase c;
            hc_init(&c, &r, N, H, V, V, 0, 0, bf ? SPH_BF16 : SPH_F32);
            plant_ties(&c);
            if (masked) hc_mask_ragged(&c, &r, 0.6);
            hc_wire(&c, HC_OUTS | (masked ? HC_MASK : 0) |
                            (one_pass ? HC_UPS | HC_DH | HC_DW : 0));
            c.a.temperature = T, c.a.softcap = cap;
            tkbuf b;
            tk_alloc(&b, N, K);
            c.a.topk_ids = &b.ti, c.a.topk_logprobs = &b.tl;
            hc_poison(&c);
            tk_poison(&b, N, K);
            char cs[128];
            snprintf(cs, sizeof cs, "(kernel=%s,V=%lld,K=%lld,mask=%d,one_pass=%d,%s,T=%g,cap=%g)",
                     kernels[kk] ? kernels[kk] : "best", (long long)V, (long long)K, masked,
                     one_pass, bf ? "bf16" : "f32", T, cap);
            sph_status s = hc_run(ctx, SPH_HEAD_FORWARD, &c.a);
            if (s != SPH_OK) {
                fprintf(stderr, "FAIL topk %s: %s: %s\n", cs, sph_status_str(s), sph_last_error());
                ok = 0;
            } else {
                uint8_t *act = hc_alloc((size_t)N);
                hc_active(&c, act);
                ok &= check_topk(cs, b.ids, b.lp, K, &c, act, T, cap, TOL_CPU_F32, kk == 0 ? 1e-9 : 1e-4);
                /* the same numbers logprob gives: the target's log-prob where it is listed */
                for (int64_t i = 0; i < N && ok; i++)
                    for (int64_t k = 0; k < K; k++)
                        if (act[i] && b.ids[i * K + k] == c.tgt[i] &&
                            !(fabs(b.lp[i * K + k] - c.lp[i]) <= 1e-6 * (1 + fabs(c.lp[i])))) {
                            fprintf(stderr, "FAIL topk %s: row %lld: the target's log-prob %.9g "
                                            "vs logprob %.9g\n",
                                    cs, (long long)i, b.lp[i * K + k], c.lp[i]);
                            ok = 0;
                        }
                free(act);
            }
            tk_free(&b);
            hc_free(&c);
            runs++;
        }
        sph_ctx_destroy(ctx);
    }
    assert_true(runs >= 40);
    assert_true(ok);
}

/* Per-row temperatures (issue 25 item 1) with top-k: each row's list is that of its own T_i. */
static void test_topk_temp_rows(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 25104);
    const char *kernels[3] = {"ref", NULL, "generic"};
    int ok = 1, runs = 0;
    for (int kk = 0; kk < 3; kk++) {
        sph_ctx_opts o = SPH_CTX_OPTS_INIT;
        o.force_kernel = kernels[kk];
        o.num_threads = 2;
        o.chunk_rows = 7;
        sph_ctx_t ctx = NULL;
        if (sph_ctx_create(&ctx, &o) != SPH_OK) continue;
        for (int v = 0; v < 4; v++) {
            const int64_t N = 23, H = 19, V = 613, K = v & 1 ? 64 : 5;
            const int one_pass = v >> 1 & 1;
            const double cap = v == 1 ? 3.0 : 0.0;
            hcase c;
            hc_init(&c, &r, N, H, V, V, 0, 0, SPH_F32);
            plant_ties(&c);
            hc_mask_ragged(&c, &r, 0.7);
            hc_wire(&c, HC_OUTS | HC_MASK | (one_pass ? HC_UPS | HC_DH | HC_DW : 0));
            c.a.softcap = cap;
            float *tr = hc_alloc((size_t)N * 4);
            for (int64_t i = 0; i < N; i++) tr[i] = (float)(0.25 * pow(16.0, rng_uniform(&r)));
            int64_t sh_t[1];
            sph_tensor tt = tensor1(tr, SPH_F32, sh_t, N);
            c.a.temperature_rows = &tt;
            tkbuf b;
            tk_alloc(&b, N, K);
            c.a.topk_ids = &b.ti, c.a.topk_logprobs = &b.tl;
            hc_poison(&c);
            tk_poison(&b, N, K);
            char cs[128];
            snprintf(cs, sizeof cs, "temp_rows(kernel=%s,K=%lld,one_pass=%d,cap=%g)",
                     kernels[kk] ? kernels[kk] : "best", (long long)K, one_pass, cap);
            sph_status s = hc_run(ctx, SPH_HEAD_FORWARD, &c.a);
            if (s != SPH_OK) {
                fprintf(stderr, "FAIL topk %s: %s: %s\n", cs, sph_status_str(s), sph_last_error());
                ok = 0;
            } else {
                uint8_t *act = hc_alloc((size_t)N);
                hc_active(&c, act);
                ok &= check_topk_rows(cs, b.ids, b.lp, K, &c, act, 1.0, tr, cap, TOL_CPU_F32,
                                      kk == 0 ? 1e-9 : 1e-4);
                free(act);
            }
            tk_free(&b);
            free(tr);
            hc_free(&c);
            runs++;
        }
        sph_ctx_destroy(ctx);
    }
    assert_true(runs >= 8);
    assert_true(ok);
}

// ---- tensor parallelism in threads ---------------------------------------------------------------

typedef struct tk_job {
    tp_group *g;
    int64_t rank, ranks, chunk, K;
    const char *kernel;
    int one_pass;
    double T;
    hcase *full, shard;
    tkbuf b;
    sph_status st;
    char err[256];
} tk_job;

static void *tk_rank(void *arg) {
    tk_job *j = arg;
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
    tk_alloc(&j->b, f->N, j->K);
    tk_poison(&j->b, f->N, j->K);
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.force_kernel = j->kernel;
    o.num_threads = 1;
    o.chunk_rows = j->chunk;
    o.tp_comm = &comm;
    sph_ctx_t ctx = NULL;
    j->st = sph_ctx_create(&ctx, &o);
    if (j->st == SPH_OK) {
        hc_wire(c, HC_OUTS | HC_MASK | HC_SPANS | (j->one_pass ? HC_UPS | HC_DH | HC_DW : 0));
        c->a.temperature = j->T;
        c->a.topk_ids = &j->b.ti, c->a.topk_logprobs = &j->b.tl;
        j->st = hc_run(ctx, SPH_HEAD_FORWARD, &c->a);
    }
    if (j->st != SPH_OK) {
        snprintf(j->err, sizeof j->err, "rank %lld: %s", (long long)j->rank, sph_last_error());
        tp_group_abort(j->g);
    }
    sph_ctx_destroy(ctx);
    return NULL;
}

static void test_topk_tp(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 25102);
    const char *kernels[2] = {"ref", NULL};
    int ok = 1, runs = 0;
    for (int kk = 0; kk < 2; kk++)
        for (int v = 0; v < 8; v++) {
            const int64_t ranks = v & 1 ? 3 : 2, N = 29, H = 13;
            const int64_t V = v & 2 ? 301 : 1601, K = v & 2 ? 150 : 64; /* 150 > V_loc ~100 */
            const int one_pass = v >> 2 & 1;
            const double T = one_pass ? 0.8 : 1.0;
            hcase f;
            hc_init(&f, &r, N, H, V, V, 0, 0, SPH_F32);
            plant_ties(&f);
            hc_mask_ragged(&f, &r, 0.6);
            hc_wire(&f, HC_MASK | HC_SPANS);
            tp_group g;
            tp_group_init(&g, ranks);
            tk_job jobs[3];
            pthread_t th[3];
            for (int64_t k = 0; k < ranks; k++) {
                memset(&jobs[k], 0, sizeof jobs[k]);
                jobs[k].g = &g, jobs[k].rank = k, jobs[k].ranks = ranks, jobs[k].chunk = 5;
                jobs[k].kernel = kernels[kk], jobs[k].one_pass = one_pass, jobs[k].T = T;
                jobs[k].full = &f, jobs[k].K = K;
                assert_int_equal(pthread_create(&th[k], NULL, tk_rank, &jobs[k]), 0);
            }
            for (int64_t k = 0; k < ranks; k++) pthread_join(th[k], NULL);
            tp_group_destroy(&g);
            uint8_t *act = hc_alloc((size_t)N);
            hc_active(&f, act);
            for (int64_t k = 0; k < ranks; k++) {
                char cs[128];
                snprintf(cs, sizeof cs, "tp(kernel=%s,ranks=%lld,rank=%lld,V=%lld,K=%lld,"
                                        "one_pass=%d)",
                         kernels[kk] ? kernels[kk] : "best", (long long)ranks, (long long)k,
                         (long long)V, (long long)K, one_pass);
                if (jobs[k].st != SPH_OK) {
                    fprintf(stderr, "FAIL topk %s: %s\n", cs, jobs[k].err);
                    ok = 0;
                } else {
                    ok &= check_topk(cs, jobs[k].b.ids, jobs[k].b.lp, K, &f, act, T, 0,
                                     TOL_CPU_F32, kk == 0 ? 1e-9 : 1e-4);
                    /* every rank holds the same bits */
                    if (k > 0 && (memcmp(jobs[k].b.ids, jobs[0].b.ids, (size_t)(N * K) * 8) ||
                                  memcmp(jobs[k].b.lp, jobs[0].b.lp, (size_t)(N * K) * 4))) {
                        fprintf(stderr, "FAIL topk %s: differs from rank 0\n", cs);
                        ok = 0;
                    }
                }
            }
            for (int64_t k = 0; k < ranks; k++) {
                hcase *c = &jobs[k].shard;
                free(c->lp), free(c->ent), free(c->lse), free(c->lm), free(c->stats);
                free(c->dh), free(c->dw);
                tk_free(&jobs[k].b);
            }
            free(act);
            hc_free(&f);
            runs++;
        }
    assert_int_equal(runs, 16);
    assert_true(ok);
}

// ---- validation ------------------------------------------------------------------------------------

/* A forward that must fail with want and a message naming name, writing nothing. */
static int expect_refused(sph_ctx_t ctx, hcase *c, tkbuf *b, int64_t K, sph_status want,
                          const char *name, const char *what) {
    hc_poison(c);
    tk_poison(b, c->N, K);
    float *lp0 = hc_dup(c->lp, (size_t)c->N * 4), *st0 = hc_dup(c->stats, (size_t)c->N * 12);
    int64_t *i0 = hc_dup(b->ids, (size_t)(c->N * K) * 8);
    float *l0 = hc_dup(b->lp, (size_t)(c->N * K) * 4);
    sph_status s = hc_run(ctx, SPH_HEAD_FORWARD, &c->a);
    int ok = s == want && strstr(sph_last_error(), name) != NULL;
    ok &= !memcmp(lp0, c->lp, (size_t)c->N * 4) && !memcmp(st0, c->stats, (size_t)c->N * 12);
    ok &= !memcmp(i0, b->ids, (size_t)(c->N * K) * 8) && !memcmp(l0, b->lp, (size_t)(c->N * K) * 4);
    if (!ok)
        fprintf(stderr, "FAIL topk validation (%s): got %s '%s', expected %s naming %s with "
                        "nothing written\n",
                what, sph_status_str(s), sph_last_error(), sph_status_str(want), name);
    free(lp0), free(st0), free(i0), free(l0);
    return ok;
}

static void test_topk_validation(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 25103);
    int ok = 1;
    const char *kernels[2] = {"ref", NULL};
    for (int kk = 0; kk < 2; kk++) {
        sph_ctx_t ctx = hc_ctx(kernels[kk], 1, NULL);
        const int64_t N = 9, H = 5, V = 300;
        hcase c;
        hc_init(&c, &r, N, H, V, V, 0, 0, SPH_F32);
        hc_wire(&c, HC_OUTS);
        tkbuf b;
        tk_alloc(&b, N, 257); /* room for the largest K tried */
        const int64_t K = 4;
        b.ti = tensor2(b.ids, SPH_I64, b.sh_i, N, K);
        b.tl = tensor2(b.lp, SPH_F32, b.sh_l, N, K);
        c.a.topk_ids = &b.ti, c.a.topk_logprobs = &b.tl;
        /* K outside [1, 256], K > V */
        const int64_t badk[2] = {0, 257};
        for (int q = 0; q < 2; q++) {
            b.ti = tensor2(b.ids, SPH_I64, b.sh_i, N, badk[q]);
            b.tl = tensor2(b.lp, SPH_F32, b.sh_l, N, badk[q]);
            ok &= expect_refused(ctx, &c, &b, 4, SPH_ERR_SHAPE, "topk_ids", q ? "K 257" : "K 0");
        }
        {
            hcase s;
            hc_init(&s, &r, N, H, 11, 11, 0, 0, SPH_F32);
            hc_wire(&s, HC_OUTS);
            b.ti = tensor2(b.ids, SPH_I64, b.sh_i, N, 12);
            b.tl = tensor2(b.lp, SPH_F32, b.sh_l, N, 12);
            s.a.topk_ids = &b.ti, s.a.topk_logprobs = &b.tl;
            ok &= expect_refused(ctx, &s, &b, 12, SPH_ERR_SHAPE, "vocab_total", "K 12 > V 11");
            hc_free(&s);
        }
        b.ti = tensor2(b.ids, SPH_I64, b.sh_i, N, K);
        b.tl = tensor2(b.lp, SPH_F32, b.sh_l, N, K);
        /* one of the two alone */
        c.a.topk_logprobs = NULL;
        ok &= expect_refused(ctx, &c, &b, K, SPH_ERR_INVALID_ARG, "topk_logprobs", "ids alone");
        c.a.topk_logprobs = &b.tl, c.a.topk_ids = NULL;
        ok &= expect_refused(ctx, &c, &b, K, SPH_ERR_INVALID_ARG, "topk_ids", "log-probs alone");
        c.a.topk_ids = &b.ti;
        /* dtypes, shapes */
        b.ti = tensor2(b.ids, SPH_I32, b.sh_i, N, K);
        ok &= expect_refused(ctx, &c, &b, K, SPH_ERR_DTYPE, "topk_ids", "i32 ids");
        b.ti = tensor2(b.ids, SPH_I64, b.sh_i, N, K);
        b.tl = tensor2(b.lp, SPH_BF16, b.sh_l, N, K);
        ok &= expect_refused(ctx, &c, &b, K, SPH_ERR_DTYPE, "topk_logprobs", "bf16 log-probs");
        b.tl = tensor2(b.lp, SPH_F32, b.sh_l, N, K + 1);
        ok &= expect_refused(ctx, &c, &b, K, SPH_ERR_SHAPE, "topk_logprobs", "K mismatch");
        b.tl = tensor2(b.lp, SPH_F32, b.sh_l, N - 1, K);
        ok &= expect_refused(ctx, &c, &b, K, SPH_ERR_SHAPE, "topk_logprobs", "rows N - 1");
        b.tl = tensor2(b.lp, SPH_F32, b.sh_l, N, K);
        b.ti = tensor2(b.ids, SPH_I64, b.sh_i, N + 1, K);
        ok &= expect_refused(ctx, &c, &b, K, SPH_ERR_SHAPE, "topk_ids", "rows N + 1");
        b.ti = tensor2(b.ids, SPH_I64, b.sh_i, N, K);
        /* aliasing: the log-probs over lse, the ids over the log-probs */
        {
            int64_t sh[2];
            float *big = hc_alloc((size_t)(N * K + N) * 4);
            free(c.lse);
            c.lse = big; /* lse and the log-probs share memory */
            c.tlse.data = big;
            sph_tensor lv = tensor2(big + 2, SPH_F32, sh, N, K);
            c.a.topk_logprobs = &lv;
            ok &= expect_refused(ctx, &c, &b, K, SPH_ERR_INVALID_ARG, "topk_logprobs",
                                 "over lse");
            int64_t sh2[2];
            sph_tensor iv = tensor2(b.lp, SPH_I64, sh2, N, K / 2); /* ids over the log-probs */
            iv.shape[1] = K;
            c.a.topk_ids = &iv;
            c.a.topk_logprobs = &b.tl;
            ok &= expect_refused(ctx, &c, &b, K, SPH_ERR_INVALID_ARG, "topk_ids",
                                 "ids over log-probs");
            c.a.topk_ids = &b.ti;
        }
        hc_free(&c);
        /* candidates: not defined there */
        hc_init(&c, &r, N, H, V, V, 0, 6, SPH_F32);
        hc_wire(&c, HC_OUTS & ~HC_LM);
        c.a.topk_ids = &b.ti, c.a.topk_logprobs = &b.tl;
        ok &= expect_refused(ctx, &c, &b, K, SPH_ERR_INVALID_ARG, "candidates", "support");
        hc_free(&c);
        /* (the policy loss passes top-k through: tests/parity/test_policy_extras.c) */
        /* an older struct that ends before topk_ids: accepted, the fields never read */
        hc_init(&c, &r, N, H, V, V, 0, 0, SPH_F32);
        hc_wire(&c, HC_OUTS);
        c.a.topk_ids = &b.ti, c.a.topk_logprobs = &b.tl;
        tk_poison(&b, N, K);
        int64_t *i0 = hc_dup(b.ids, (size_t)(N * K) * 8);
        sph_head_args old = c.a;
        old.struct_size = offsetof(sph_head_args, topk_ids);
        sph_status s = hc_run(ctx, SPH_HEAD_FORWARD, &old);
        if (s != SPH_OK || memcmp(i0, b.ids, (size_t)(N * K) * 8)) {
            fprintf(stderr, "FAIL topk older struct_size: %s '%s' or the ids were written\n",
                    sph_status_str(s), sph_last_error());
            ok = 0;
        }
        /* the backward ignores them (forward outputs) */
        expect_ok(hc_run(ctx, SPH_HEAD_FORWARD, &c.a));
        hc_wire(&c, HC_UPS | HC_DH | HC_DW);
        c.a.topk_ids = &b.ti, c.a.topk_logprobs = &b.tl;
        tk_poison(&b, N, K);
        memcpy(i0, b.ids, (size_t)(N * K) * 8);
        expect_ok(hc_run(ctx, SPH_HEAD_BACKWARD, &c.a));
        if (memcmp(i0, b.ids, (size_t)(N * K) * 8)) {
            fprintf(stderr, "FAIL the backward wrote topk_ids\n");
            ok = 0;
        }
        free(i0);
        tk_free(&b);
        hc_free(&c);
        sph_ctx_destroy(ctx);
    }
    assert_true(ok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topk),
        cmocka_unit_test(test_topk_temp_rows),
        cmocka_unit_test(test_topk_tp),
        cmocka_unit_test(test_topk_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
