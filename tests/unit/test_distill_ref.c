/*
 * test_distill_ref.c - the float64 reference of the distillation losses (src/distill/
 * distill_ref.c) against finite differences and against an independent loss from the
 * formulas (tests/parity/test_distill_case.h): every kind (forward KL, reverse KL, jsd at
 * beta 0.3 / 0.8 and its special cases 0 and 1), dense and sparse teachers, masks, tied
 * logits, a tail of mass 0, K covering the vocabulary, -1 padding, temperature, softcap,
 * a teacher temperature, per-row temperatures (0.4 .. 2.5 in one call), and per-row scales. Central differences of the scaled loss sum with
 * step 1e-5 in float64 (truncation ~1e-10 relative, cancellation ~1e-11 / 1e-5 = 1e-6 of the
 * loss scale): budget 1e-6 absolute + 1e-5 relative per gradient element.
 */
#include "parity/test_distill_case.h"

typedef struct fdin {
    sph_distill_f64 in;
    double *h, *w, *th, *tw, *lp, *scale, *trows;
} fdin;

static double scaled_sum(const fdin *f, double *rows) {
    expect_ok(sph_distill_ref_f64(&f->in, rows, NULL, NULL));
    double s = 0;
    for (int64_t i = 0; i < f->in.N; i++) s += (f->scale ? f->scale[i] : 1.0) * rows[i];
    return s;
}

static int fd_check(fdin *f, const char *cs) {
    const sph_distill_f64 *in = &f->in;
    const int64_t N = in->N, H = in->H, V = in->V;
    double *rows = hc_alloc((size_t)N * 8), *dh = hc_alloc((size_t)(N * H) * 8);
    double *dw = hc_alloc((size_t)(V * H) * 8);
    expect_ok(sph_distill_ref_f64(in, rows, dh, dw));
    int ok = 1;
    const double eps = 1e-5;
    double *fdh = hc_alloc((size_t)(N * H) * 8), *fdw = hc_alloc((size_t)(V * H) * 8);
    for (int64_t k = 0; k < N * H; k++) {
        const double x = f->h[k];
        f->h[k] = x + eps;
        const double a = scaled_sum(f, rows);
        f->h[k] = x - eps;
        const double b = scaled_sum(f, rows);
        f->h[k] = x;
        fdh[k] = (a - b) / (2 * eps);
    }
    for (int64_t k = 0; k < V * H; k++) {
        const double x = f->w[k];
        f->w[k] = x + eps;
        const double a = scaled_sum(f, rows);
        f->w[k] = x - eps;
        const double b = scaled_sum(f, rows);
        f->w[k] = x;
        fdw[k] = (a - b) / (2 * eps);
    }
    ok &= check_close_f64("dh (finite differences)", cs, dh, fdh, (size_t)(N * H), 1e-6, 1e-5);
    ok &= check_close_f64("dw (finite differences)", cs, dw, fdw, (size_t)(V * H), 1e-6, 1e-5);
    /* the gradient is not zero by construction */
    double mx = 0;
    for (int64_t k = 0; k < N * H; k++) mx = fabs(dh[k]) > mx ? fabs(dh[k]) : mx;
    if (mx < 1e-6) {
        print_error("%s: dh is ~0 (max %g): the check would pass by construction\n", cs, mx);
        ok = 0;
    }
    free(rows), free(dh), free(dw), free(fdh), free(fdw);
    return ok;
}

/* One case: the reference on c's (rounded) inputs in float64, its loss against the
 * independent formula, its gradients against finite differences. */
static int run_case(dcase *c) {
    char cs[256];
    dc_case_str(c, NULL, cs, sizeof cs);
    fdin f;
    memset(&f, 0, sizeof f);
    f.h = dc_f64(c, c->h, c->N * c->H), f.w = dc_f64(c, c->w, c->V * c->H);
    if (c->dense) f.th = dc_f64(c, c->th, c->N * c->HT), f.tw = dc_f64(c, c->tw, c->V * c->HT);
    if (!c->dense) {
        f.lp = hc_alloc((size_t)(c->N * c->K) * 8);
        for (int64_t k = 0; k < c->N * c->K; k++) f.lp[k] = c->lp[k];
    }
    if (c->trows) {
        f.trows = hc_alloc((size_t)c->N * 8);
        for (int64_t i = 0; i < c->N; i++) f.trows[i] = c->trows[i];
    }
    f.scale = hc_alloc((size_t)c->N * 8);
    for (int64_t i = 0; i < c->N; i++) f.scale[i] = c->dloss[i];
    f.in = (sph_distill_f64){.N = c->N, .H = c->H, .V = c->V, .HT = c->HT, .K = c->K,
                             .kind = sph_distill_kind_of(c->kind, c->beta),
                             .beta = c->kind == SPH_DISTILL_JSD ? c->beta : 0, .T = c->T,
                             .cap = c->cap, .T_T = c->TT, .T_rows = f.trows, .h = f.h, .w = f.w,
                             .th = f.th, .tw = f.tw, .lp = f.lp, .ids = c->ids, .act = c->mask,
                             .scale = f.scale};
    double *rows = hc_alloc((size_t)c->N * 8), *ind = hc_alloc((size_t)c->N * 8);
    expect_ok(sph_distill_ref_f64(&f.in, rows, NULL, NULL));
    for (int64_t i = 0; i < c->N; i++) ind[i] = !c->mask || c->mask[i] ? dc_indep_row(c, i) : 0;
    int ok = check_close_f64("loss rows (independent formula)", cs, rows, ind, (size_t)c->N,
                             1e-12, 1e-9);
    double lsum = 0;
    for (int64_t i = 0; i < c->N; i++) lsum += fabs(rows[i]);
    if (!(lsum > 1e-6)) {
        print_error("%s: the losses are ~0 (%g): nothing checked\n", cs, lsum);
        ok = 0;
    }
    ok &= fd_check(&f, cs);
    free(f.h), free(f.w), free(f.th), free(f.tw), free(f.lp), free(f.scale), free(f.trows);
    free(rows), free(ind);
    return ok;
}

static void test_kinds(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    const int kinds[6] = {SPH_DISTILL_FORWARD_KL, SPH_DISTILL_REVERSE_KL, SPH_DISTILL_JSD,
                          SPH_DISTILL_JSD, SPH_DISTILL_JSD, SPH_DISTILL_JSD};
    const double betas[6] = {0.5, 0.5, 0.3, 0.8, 0.0, 1.0};
    const unsigned flags[5] = {0, DC_PAD, DC_TAIL0 | DC_PAD, DC_ALLV, DC_TIES | DC_PAD};
    int ok = 1;
    for (int dense = 0; dense <= 1; dense++)
        for (int k = 0; k < 6; k++)
            for (int fl = 0; fl < (dense ? 2 : 5); fl++) {
                dcase c;
                const unsigned f = dense ? (fl ? DC_TIES : 0) : flags[fl];
                dc_init(&c, &r, 5, 3, 7, 4, 4, SPH_F32, dense, f);
                c.kind = kinds[k], c.beta = betas[k];
                if ((k + fl) % 2) dc_mask(&c, &r, 0.6);
                if (k % 3 == 1) c.T = 0.7;
                if (k % 3 == 2) c.cap = 1.5, c.T = 1.3;
                if (dense && fl) c.TT = 2.0;
                if ((k + fl) % 3 == 0) dc_trows(&c, &r, 0.4, 2.5); /* per-row temperatures */
                ok &= run_case(&c);
                dc_free(&c);
            }
    assert_true(ok);
}

/* The jsd special cases are the KLs: beta 0 is the forward KL, 1 the reverse (Liger). */
static void test_jsd_endpoints(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    for (int dense = 0; dense <= 1; dense++)
        for (int e = 0; e <= 1; e++) {
            dcase c;
            dc_init(&c, &r, 4, 3, 6, 3, 3, SPH_F32, dense, DC_PAD);
            double *a = hc_alloc(4 * 8), *b = hc_alloc(4 * 8);
            c.kind = SPH_DISTILL_JSD, c.beta = e;
            for (int64_t i = 0; i < 4; i++) a[i] = dc_indep_row(&c, i);
            c.kind = e ? SPH_DISTILL_REVERSE_KL : SPH_DISTILL_FORWARD_KL;
            for (int64_t i = 0; i < 4; i++) b[i] = dc_indep_row(&c, i);
            assert_true(check_close_f64("jsd endpoint", "jsd", a, b, 4, 0, 0));
            free(a), free(b);
            dc_free(&c);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kinds),
        cmocka_unit_test(test_jsd_endpoints),
    };
    return test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
