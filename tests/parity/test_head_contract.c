/*
 * test_head_contract.c - the head's appended outputs of issue 25 (sum_p2 = sum_j p_ij^2 of
 * every active row), on the float64 reference and every CPU kernel set, against an
 * independent float64 dense computation written here (the logits from the inputs, softmax,
 * squares summed; no shifted record): full vocabulary and sample support, softcap, two
 * temperatures, a ragged mask (inactive rows exactly 0), bf16 inputs, one-pass and forward-only,
 * several tiles and chunks; tensor parallelism in threads (2 and 3 ranks, several tiles per
 * rank, one combine per chunk in one-pass mode); and its validation (dtype, shape, overlap,
 * the older struct_size that ends before the field: nothing written, the field ignored).
 * Outputs are poisoned before each run. Budget: TOL_CPU_F32 normwise.
 */
#include "test_head_case.h"

// ---- the independent float64 sum_p2 ----------------------------------------------------------

/* sum_j p_ij^2 over row i's columns of the whole case (act[i] = 0: 0). */
static double indep_sum_p2(const hcase *c, int64_t i, double T, double cap) {
    const int64_t nc = c->K ? c->K : c->V_loc;
    int64_t *cols = hc_alloc((size_t)nc * 8);
    double *z = hc_alloc((size_t)nc * 8);
    const int64_t n = hc_cols(c, i, cols);
    double m = -INFINITY, S = 0, Q = 0;
    for (int64_t k = 0; k < n; k++) {
        double u = hc_u(c, i, cols[k]);
        z[k] = (cap > 0 ? cap * tanh(u / cap) : u) / T;
        if (z[k] > m) m = z[k];
    }
    for (int64_t k = 0; k < n; k++) S += exp(z[k] - m);
    for (int64_t k = 0; k < n; k++) {
        double p = exp(z[k] - m) / S;
        Q += p * p;
    }
    free(cols), free(z);
    return n ? Q : 0;
}

/* got (N) against the independent values of the full case f; inactive rows exactly 0. */
static int check_sp2(const char *cs, const float *got, const hcase *f, const uint8_t *act,
                     double T, double cap) {
    double md = 0, mr = 0;
    int64_t worst = -1;
    for (int64_t i = 0; i < f->N; i++) {
        const double ref = act[i] ? indep_sum_p2(f, i, T, cap) : 0;
        if (!act[i] && got[i] != 0.0f) {
            fprintf(stderr, "FAIL sum_p2 %s: inactive row %lld is %g, expected 0; seed %llu\n", cs,
                    (long long)i, got[i], (unsigned long long)test_seed());
            return 0;
        }
        const double d = fabs((double)got[i] - ref);
        if (!(d <= md)) md = d, worst = i; /* NaN lands here and stays */
        if (fabs(ref) > mr) mr = fabs(ref);
    }
    if (md <= TOL_CPU_F32 * (mr > 0 ? mr : 1)) return 1;
    fprintf(stderr, "FAIL sum_p2 %s: normwise error %.3e (row %lld: got %.9g); seed %llu\n", cs,
            md / (mr > 0 ? mr : 1), (long long)worst, worst >= 0 ? got[worst] : 0.0,
            (unsigned long long)test_seed());
    return 0;
}

static sph_tensor sp2_tensor(float *buf, int64_t *shape, int64_t N) {
    return tensor1(buf, SPH_F32, shape, N);
}

// ---- one process: every kernel set --------------------------------------------------------------

static void test_sum_p2(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 25003);
    const char *kernels[5] = {"ref", NULL, "generic", "avx2", "avx512"};
    int ok = 1, runs = 0;
    for (int kk = 0; kk < 5; kk++) {
        sph_ctx_opts o = SPH_CTX_OPTS_INIT;
        o.force_kernel = kernels[kk];
        o.num_threads = 2;
        o.chunk_rows = 7; /* several chunks: one-pass combines per chunk */
        sph_ctx_t ctx = NULL;
        if (sph_ctx_create(&ctx, &o) != SPH_OK) continue; /* an ISA this machine lacks */
        for (int v = 0; v < 16; v++) {
            const int K = v & 1 ? 6 : 0, masked = v >> 1 & 1, one_pass = v >> 2 & 1;
            const int bf = v >> 3 & 1;
            const double T = v % 3 ? 0.6 : 1.0, cap = v % 5 == 1 ? 2.5 : 0.0;
            const int64_t N = 37, H = 19, V = 613; /* 3 vocabulary tiles of 256 */
            hcase c;
            hc_init(&c, &r, N, H, V, V, 0, K, bf ? SPH_BF16 : SPH_F32);
            if (masked) hc_mask_ragged(&c, &r, 0.6);
            hc_wire(&c, HC_OUTS | (masked ? HC_MASK : 0) |
                            (one_pass ? HC_UPS | HC_DH | HC_DW : 0));
            c.a.temperature = T, c.a.softcap = cap;
            float *sp2 = hc_alloc((size_t)N * 4);
            int64_t sh[1];
            sph_tensor ts = sp2_tensor(sp2, sh, N);
            c.a.sum_p2 = &ts;
            hc_poison(&c);
            poison_f32(sp2, (size_t)N);
            char cs[128];
            snprintf(cs, sizeof cs, "(kernel=%s,K=%d,mask=%d,one_pass=%d,%s,T=%g,cap=%g)",
                     kernels[kk] ? kernels[kk] : "best", K, masked, one_pass, bf ? "bf16" : "f32",
                     T, cap);
            sph_status s = hc_run(ctx, SPH_HEAD_FORWARD, &c.a);
            if (s != SPH_OK) {
                fprintf(stderr, "FAIL sum_p2 %s: %s: %s\n", cs, sph_status_str(s), sph_last_error());
                ok = 0;
            } else {
                uint8_t *act = hc_alloc((size_t)N);
                hc_active(&c, act);
                ok &= check_sp2(cs, sp2, &c, act, T, cap);
                free(act);
            }
            free(sp2);
            hc_free(&c);
            runs++;
        }
        sph_ctx_destroy(ctx);
    }
    assert_true(runs >= 32);
    assert_true(ok);
}

// ---- tensor parallelism in threads ---------------------------------------------------------------

typedef struct sp2_job {
    tp_group *g;
    int64_t rank, ranks, chunk;
    const char *kernel;
    int one_pass;
    double T;
    hcase *full, shard;
    float *sp2;
    sph_status st;
    char err[256];
} sp2_job;

static void *sp2_rank(void *arg) {
    sp2_job *j = arg;
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
    j->sp2 = hc_alloc((size_t)f->N * 4);
    poison_f32(j->sp2, (size_t)f->N);
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.force_kernel = j->kernel;
    o.num_threads = 1;
    o.chunk_rows = j->chunk;
    o.tp_comm = &comm;
    sph_ctx_t ctx = NULL;
    j->st = sph_ctx_create(&ctx, &o);
    int64_t sh[1];
    sph_tensor ts = sp2_tensor(j->sp2, sh, f->N);
    if (j->st == SPH_OK) {
        hc_wire(c, HC_OUTS | HC_MASK | HC_SPANS | (j->one_pass ? HC_UPS | HC_DH | HC_DW : 0));
        c->a.temperature = j->T;
        c->a.sum_p2 = &ts;
        j->st = hc_run(ctx, SPH_HEAD_FORWARD, &c->a);
    }
    if (j->st != SPH_OK) {
        snprintf(j->err, sizeof j->err, "rank %lld: %s", (long long)j->rank, sph_last_error());
        tp_group_abort(j->g);
    }
    sph_ctx_destroy(ctx);
    return NULL;
}

static void test_sum_p2_tp(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 25004);
    const char *kernels[2] = {"ref", NULL};
    int ok = 1, runs = 0;
    for (int kk = 0; kk < 2; kk++)
        for (int v = 0; v < 8; v++) {
            const int64_t ranks = v & 1 ? 3 : 2, K = v & 2 ? 5 : 0, N = 29, H = 13, V = 1601;
            const int one_pass = v >> 2 & 1;
            const double T = one_pass ? 0.8 : 1.0;
            hcase f;
            hc_init(&f, &r, N, H, V, V, 0, K, SPH_F32);
            hc_mask_ragged(&f, &r, 0.6);
            hc_wire(&f, HC_MASK | HC_SPANS);
            tp_group g;
            tp_group_init(&g, ranks);
            sp2_job jobs[3];
            pthread_t th[3];
            for (int64_t k = 0; k < ranks; k++) {
                memset(&jobs[k], 0, sizeof jobs[k]);
                jobs[k].g = &g, jobs[k].rank = k, jobs[k].ranks = ranks, jobs[k].chunk = 5;
                jobs[k].kernel = kernels[kk], jobs[k].one_pass = one_pass, jobs[k].T = T;
                jobs[k].full = &f;
                assert_int_equal(pthread_create(&th[k], NULL, sp2_rank, &jobs[k]), 0);
            }
            for (int64_t k = 0; k < ranks; k++) pthread_join(th[k], NULL);
            tp_group_destroy(&g);
            uint8_t *act = hc_alloc((size_t)N);
            hc_active(&f, act);
            for (int64_t k = 0; k < ranks; k++) {
                char cs[128];
                snprintf(cs, sizeof cs, "tp(kernel=%s,ranks=%lld,rank=%lld,K=%lld,one_pass=%d)",
                         kernels[kk] ? kernels[kk] : "best", (long long)ranks, (long long)k,
                         (long long)K, one_pass);
                if (jobs[k].st != SPH_OK) {
                    fprintf(stderr, "FAIL sum_p2 %s: %s\n", cs, jobs[k].err);
                    ok = 0;
                } else {
                    ok &= check_sp2(cs, jobs[k].sp2, &f, act, T, 0);
                }
                hcase *c = &jobs[k].shard;
                free(c->lp), free(c->ent), free(c->lse), free(c->lm), free(c->stats);
                free(c->dh), free(c->dw), free(jobs[k].sp2);
            }
            free(act);
            hc_free(&f);
            runs++;
        }
    assert_int_equal(runs, 16);
    assert_true(ok);
}

// ---- validation ------------------------------------------------------------------------------------

/* A forward that must fail with code and a message naming sum_p2, writing nothing. */
static int expect_refused(sph_ctx_t ctx, hcase *c, sph_status want, const char *what) {
    hc_poison(c);
    float *lp0 = hc_dup(c->lp, (size_t)c->N * 4), *st0 = hc_dup(c->stats, (size_t)c->N * 12);
    sph_status s = hc_run(ctx, SPH_HEAD_FORWARD, &c->a);
    int ok = s == want && strstr(sph_last_error(), "sum_p2") != NULL;
    ok &= !memcmp(lp0, c->lp, (size_t)c->N * 4) && !memcmp(st0, c->stats, (size_t)c->N * 12);
    if (!ok)
        fprintf(stderr, "FAIL sum_p2 validation (%s): got %s '%s', expected %s naming sum_p2 "
                        "with nothing written\n",
                what, sph_status_str(s), sph_last_error(), sph_status_str(want));
    free(lp0), free(st0);
    return ok;
}

static void test_sum_p2_validation(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 25005);
    int ok = 1;
    const char *kernels[2] = {"ref", NULL};
    for (int kk = 0; kk < 2; kk++) {
        sph_ctx_t ctx = hc_ctx(kernels[kk], 1, NULL);
        const int64_t N = 9, H = 5, V = 11;
        hcase c;
        hc_init(&c, &r, N, H, V, V, 0, 0, SPH_F32);
        hc_wire(&c, HC_OUTS);
        float *buf = hc_alloc((size_t)(N + 1) * 8);
        int64_t sh[1];
        sph_tensor t = tensor1(buf, SPH_I32, sh, N); /* wrong dtype */
        c.a.sum_p2 = &t;
        ok &= expect_refused(ctx, &c, SPH_ERR_DTYPE, "i32 dtype");
        t = tensor1(buf, SPH_F32, sh, N + 1); /* wrong shape */
        ok &= expect_refused(ctx, &c, SPH_ERR_SHAPE, "shape N + 1");
        t = tensor1(c.lse, SPH_F32, sh, N); /* the same memory as lse */
        c.a.sum_p2 = &t;
        hc_poison(&c);
        sph_status s = hc_run(ctx, SPH_HEAD_FORWARD, &c.a);
        if (s == SPH_OK || !strstr(sph_last_error(), "sum_p2")) {
            fprintf(stderr, "FAIL sum_p2 overlapping lse: %s '%s'\n", sph_status_str(s),
                    sph_last_error());
            ok = 0;
        }
        /* an older struct that ends before sum_p2: accepted, the field never read */
        t = tensor1(buf, SPH_F32, sh, N);
        c.a.sum_p2 = &t;
        poison_f32(buf, (size_t)N);
        float *b0 = hc_dup(buf, (size_t)N * 4);
        sph_head_args old = c.a;
        old.struct_size = offsetof(sph_head_args, sum_p2);
        s = hc_run(ctx, SPH_HEAD_FORWARD, &old);
        if (s != SPH_OK || memcmp(b0, buf, (size_t)N * 4)) {
            fprintf(stderr, "FAIL sum_p2 older struct_size: %s '%s' or the buffer was written\n",
                    sph_status_str(s), sph_last_error());
            ok = 0;
        }
        old.struct_size = offsetof(sph_head_args, sum_p2) - 1; /* shorter still: refused */
        if (hc_run(ctx, SPH_HEAD_FORWARD, &old) != SPH_ERR_INVALID_ARG) {
            fprintf(stderr, "FAIL a struct_size that cuts allreduce_dhidden was accepted\n");
            ok = 0;
        }
        /* the backward ignores it (a forward output) */
        hc_wire(&c, HC_UPS | HC_DH | HC_DW);
        c.a.sum_p2 = &t;
        poison_f32(buf, (size_t)N);
        memcpy(b0, buf, (size_t)N * 4);
        expect_ok(hc_run(ctx, SPH_HEAD_BACKWARD, &c.a));
        if (memcmp(b0, buf, (size_t)N * 4)) {
            fprintf(stderr, "FAIL the backward wrote sum_p2\n");
            ok = 0;
        }
        free(b0), free(buf);
        hc_free(&c);
        sph_ctx_destroy(ctx);
    }
    assert_true(ok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sum_p2),
        cmocka_unit_test(test_sum_p2_tp),
        cmocka_unit_test(test_sum_p2_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
