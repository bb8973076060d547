/*
 * test_head_extreme.c - the head at extreme logit magnitudes (issue 26, cases 8 and 9), against
 * an independent long double computation written here from the formulas of docs/design.md 2.2
 * and 2.4 (not the library's shifted record: plain max, sum of exponentials, then the
 * derivatives). Poisoned outputs, fresh random data every seed.
 *
 *   - the float64 reference (kernel "ref") at |z| from 1e2 to 1e30 (temperature 1 and 1e-4):
 *     forward, the two-pass backward from its own float32 stats, and one-pass; rows whose top
 *     tokens tie exactly (duplicated weight rows: p = 1/2 each at any magnitude) in the
 *     forward and one-pass;
 *   - the optimized CPU backend at low temperature (1e-2 .. 1e-4) with a large common logit
 *     offset and products that are exact in float32 (dyadic data), so that any error left is
 *     the backend's own arithmetic, not the float32 products: forward and one-pass outputs and
 *     dweight (dhidden has the offset direction, whose gradient is an exact cancellation
 *     to 0, so it is checked normwise over the rest of its columns only).
 * Budgets: 2e-6 normwise for the reference (float32 rounding of its outputs), 2e-5 for the CPU
 * backend (float32 sums).
 */
#include "test_head_case.h"

// ---- the independent long double oracle ------------------------------------------------------

typedef struct oracle {
    long double *lp, *ent, *lse, *dh, *dw;
    long double *dhb, *dwb; /* the gradients' bounds from float32 stats (stats_bound) */
    long double *M, *ls, *dm; /* per row: the max, log S, mu - M */
} oracle;

/* What float32 stats cost the two-pass backward (docs/design.md 2.3, src/head/head_ref.c):
 * it forms p_j = exp((z_j - M) - ls) and dm from the forward's float32 (m, lse, mu) as
 * ls = lse - m, dm = mu - m (M the row's float64 max, which rounds to m). Against the exact
 * log S and mu - M, the exponent is off by eta = |ls - log S| and dm by dmu = |dm - (mu - M)|:
 * about ulp(|lse|) / 2 on a spread row, and on a peaked row 0 or a whole ulp(|m|) (when m + log
 * S rounds to the float above m: seed 205 at |z| ~ 100). Both come from the stats the forward
 * wrote, once those are checked to be float32 roundings of the exact (m, lse, mu); then
 * |d dz_j| <= (|g| + |e| (|dm - (z_j - M)| + dmu)) p_j (e^eta - 1) + |e| p_j dmu, carried
 * through |w| and |h| into a bound per element of dhidden and dweight (stats_bound). */
#define STATS_SLACK 0x1p-50L /* the float64 arithmetic on the shifted stats, relative */
#define Z_SLACK 0x1p-48L     /* the float64 dot product's rounding of z - M, relative (H = 7) */

/* Full vocabulary, no softcap, every row active; upstream g, e (dlse, dlogit_mean off). */
static void oracle_run(const hcase *c, double T, oracle *o) {
    const int64_t N = c->N, H = c->H, V = c->V_loc;
    o->lp = calloc((size_t)N, sizeof(long double));
    o->ent = calloc((size_t)N, sizeof(long double));
    o->lse = calloc((size_t)N, sizeof(long double));
    o->dh = calloc((size_t)(N * H), sizeof(long double));
    o->dw = calloc((size_t)(V * H), sizeof(long double));
    o->dhb = calloc((size_t)(N * H), sizeof(long double));
    o->dwb = calloc((size_t)(V * H), sizeof(long double));
    o->M = calloc((size_t)N * 3, sizeof(long double));
    o->ls = o->M + N, o->dm = o->M + 2 * N;
    long double *z = calloc((size_t)V, sizeof(long double));
    assert_true(o->lp && o->ent && o->lse && o->dh && o->dw && o->dhb && o->dwb && o->M && z);
    const float *h = c->h, *w = c->w;
    for (int64_t i = 0; i < N; i++) {
        long double M = -INFINITY, S = 0, B = 0;
        for (int64_t j = 0; j < V; j++) {
            long double u = 0;
            for (int64_t k = 0; k < H; k++) u += (long double)h[i * H + k] * w[j * H + k];
            z[j] = u / T;
            if (z[j] > M) M = z[j];
        }
        for (int64_t j = 0; j < V; j++) S += expl(z[j] - M);
        for (int64_t j = 0; j < V; j++) B += expl(z[j] - M) / S * (z[j] - M); /* mu - M */
        const int64_t t = c->tgt[i];
        o->M[i] = M, o->ls[i] = logl(S), o->dm[i] = B;
        o->lse[i] = M + logl(S);
        o->lp[i] = t >= 0 ? (z[t] - M) - logl(S) : 0;
        o->ent[i] = 0;
        for (int64_t j = 0; j < V; j++) {
            long double p = expl(z[j] - M) / S;
            if (p > 0) o->ent[i] -= p * logl(p);
        }
        const long double g = t >= 0 ? c->g[i] : 0, e = c->e[i];
        for (int64_t j = 0; j < V; j++) {
            long double p = expl(z[j] - M) / S;
            long double dz = g * ((j == t) - p) + e * p * (B - (z[j] - M));
            long double du = dz / T;
            for (int64_t k = 0; k < H; k++) {
                o->dh[i * H + k] += du * w[j * H + k];
                o->dw[j * H + k] += du * h[i * H + k];
            }
        }
    }
    free(z);
}

static void oracle_free(oracle *o) {
    free(o->lp), free(o->ent), free(o->lse), free(o->dh), free(o->dw);
    free(o->dhb), free(o->dwb), free(o->M);
}

/* |stat - exact| within half an ulp of float32 (and the float64 slack) */
static int stat_rounded(const char *what, const char *cs, int64_t i, float got, long double ex) {
    const long double d = fabsl((long double)got - ex);
    if (d <= 0x1p-24L * fabsl(ex) * (1 + 0x1p-20L) + STATS_SLACK * fabsl(ex) + 1e-300L) return 1;
    fprintf(stderr, "FAIL stats.%s %s: row %lld %.9g is not the float32 rounding of %.12Lg; "
            "seed %llu\n", what, cs, (long long)i, (double)got, ex,
            (unsigned long long)test_seed());
    return 0;
}

/* o->dhb, o->dwb for the two-pass backward of c (the comment at STATS_SLACK), from the stats
 * its forward wrote; 0 where those are not float32 roundings of the exact ones (reported). */
static int stats_bound(const hcase *c, const char *cs, double T, oracle *o) {
    const int64_t N = c->N, H = c->H, V = c->V_loc;
    const float *h = c->h, *w = c->w;
    int ok = 1;
    for (int64_t i = 0; i < N; i++) {
        const float *st = c->stats + 3 * i;
        const long double M = o->M[i];
        const int r = stat_rounded("m", cs, i, st[0], M) &
                      stat_rounded("lse", cs, i, st[1], o->lse[i]) &
                      stat_rounded("mu", cs, i, st[2], M + o->dm[i]);
        ok &= r;
        if (!r) continue;
        /* the shifted quantities' own slack only: |M| does not enter (the row's max token has
         * z - M = 0 exactly on both sides, so at |z| ~ 1e30 a peaked row stays checked to tol) */
        const long double eta0 =
            fabsl(((long double)st[1] - st[0]) - o->ls[i]) + STATS_SLACK * (fabsl(o->ls[i]) + 1);
        const long double dmu =
            fabsl(((long double)st[2] - st[0]) - o->dm[i]) + STATS_SLACK * (fabsl(o->dm[i]) + 1);
        const int64_t t = c->tgt[i];
        const long double g = t >= 0 ? c->g[i] : 0, e = c->e[i];
        for (int64_t j = 0; j < V; j++) {
            long double u = 0;
            for (int64_t k = 0; k < H; k++) u += (long double)h[i * H + k] * w[j * H + k];
            const long double zm = u / T - M, p = expl(zm - o->ls[i]);
            if (!(p > 0)) continue; /* below the range: no term, no 0 x inf */
            /* capped: past e^50 any value is within the bound anyway */
            const long double eta = fminl(eta0 + Z_SLACK * fabsl(zm), 50.0L);
            const long double db =
                ((fabsl(g) + fabsl(e) * (fabsl(o->dm[i] - zm) + dmu)) * p * expm1l(eta) +
                 fabsl(e) * p * dmu) / T;
            for (int64_t k = 0; k < H; k++) {
                o->dhb[i * H + k] += db * fabsl((long double)w[j * H + k]);
                o->dwb[j * H + k] += db * fabsl((long double)h[i * H + k]);
            }
        }
    }
    return ok;
}

/* max |got - ref| / max(max |ref|, 1e-30) over the values of columns c0 .. c1 of each row
 * (row stride ld); NaN or inf in got fails. The floor: a peaked row's entropy (e^-2e4) is
 * below float32's range and is rightly written as 0. */
/* The normwise error's denominator is max(max|ref|, floor): 1e-30 (relative everywhere) except
 * for the entropy, whose rows at |z| >> 1 and T = 1 are ~1e-16 nats, below what a float64
 * log-sum-exp resolves (log S of S = 1 + 1e-16): there the bound is 1e-6 nats x tol. */
static long double g_nw_floor = 1e-30L;

/* bound (or NULL): a further allowance per element, subtracted from its difference first */
static int close_nw_b(const char *what, const char *cs, const float *got, const long double *ref,
                      const long double *bound, int64_t rows, int64_t ld, int64_t c0, int64_t c1,
                      double tol) {
    long double md = 0, mr = 0;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t k = c0; k < c1; k++) {
            long double g = got[i * ld + k], r = ref[i * ld + k];
            if (!isfinite((double)g)) {
                fprintf(stderr, "FAIL %s %s: [%lld] = %g is not finite; seed %llu\n", what, cs,
                        (long long)(i * ld + k), (double)g, (unsigned long long)test_seed());
                return 0;
            }
            const long double bd = bound ? bound[i * ld + k] : 0;
            if (!(bd >= 0 && bd < INFINITY)) { /* a bound must never switch the check off */
                fprintf(stderr, "FAIL %s %s: [%lld] has the bound %Lg; seed %llu\n", what, cs,
                        (long long)(i * ld + k), bd, (unsigned long long)test_seed());
                return 0;
            }
            long double d = fabsl(g - r) - bd;
            if (d > md) md = d;
            if (fabsl(r) > mr) mr = fabsl(r);
        }
    double err = (double)(md / (mr > g_nw_floor ? mr : g_nw_floor));
    if (err <= tol) return 1;
    fprintf(stderr, "FAIL %s %s: normwise error %.3e > %.1e (max|ref| %.3Le%s); seed %llu\n",
            what, cs, err, tol, mr, bound ? ", past the float32 stats' bound" : "",
            (unsigned long long)test_seed());
    return 0;
}
static int close_nw(const char *what, const char *cs, const float *got, const long double *ref,
                    int64_t rows, int64_t ld, int64_t c0, int64_t c1, double tol) {
    return close_nw_b(what, cs, got, ref, NULL, rows, ld, c0, c1, tol);
}

/* Runs ctx on c (forward, then the two-pass backward unless one_pass), outputs poisoned. */
static void run_case(sph_ctx_t ctx, hcase *c, double T, int one_pass) {
    hc_wire(c, HC_LP | HC_ENT | HC_LSE | HC_G | HC_E | HC_DH | HC_DW);
    c->a.temperature = T;
    hc_poison(c);
    if (one_pass) {
        expect_ok(hc_run(ctx, SPH_HEAD_FORWARD, &c->a));
        return;
    }
    sph_head_args f = c->a;
    f.dhidden = f.dweight = NULL;
    expect_ok(hc_run(ctx, SPH_HEAD_FORWARD, &f));
    expect_ok(hc_run(ctx, SPH_HEAD_BACKWARD, &c->a));
}

// ---- the reference at |z| up to 1e30 ---------------------------------------------------------

/* Gaussian data scaled so that |z| ~ zmag at temperature T; ties: weight row 1 = row 0 (the
 * longest) and every hidden row points along it, so tokens 0 and 1 tie for the max
 * (p = 1/2 each, entropy log 2, at any magnitude). */
static void scaled_case(hcase *c, sph_rng *r, double zmag, double T, int ties) {
    const int64_t N = 9, H = 7, V = 23;
    hc_init(c, r, N, H, V, V, 0, 0, SPH_F32);
    float *h = c->h, *w = c->w;
    const double s = sqrt(zmag * T / sqrt((double)H)); /* |u| = |h||w| ~ sqrt(H) s^2 */
    for (int64_t k = 0; k < N * H; k++) h[k] = (float)(rng_normal(r) * s);
    for (int64_t k = 0; k < V * H; k++) w[k] = (float)(rng_normal(r) * s);
    if (ties) { /* w_0 the longest row, so that h ~ w_0 makes tokens 0 and 1 the max */
        for (int64_t k = 0; k < H; k++) w[k] *= 3, w[H + k] = w[k];
        for (int64_t i = 0; i < N; i++)
            for (int64_t k = 0; k < H; k++) h[i * H + k] = (float)(w[k] * 4 + h[i * H + k] * 0.1);
    }
    for (int64_t i = 0; i < N; i++) c->tgt[i] = i % 3 == 2 ? -100 : rng_range(r, 0, V - 1);
    if (ties) c->tgt[0] = 0, c->tgt[1] = 1;
}

/* grads: 0 none, 1 at tol, 2 from float32 stats (the two-pass backward): tol plus, per
 * element, the bound of what the stats' own rounding moves it (oracle.dhb, .dwb). */
static int check_case(const hcase *c, const oracle *o, const char *cs, int grads, double tol) {
    int ok = close_nw("logprob", cs, c->lp, o->lp, c->N, 1, 0, 1, tol);
    g_nw_floor = 1e-6L;
    ok &= close_nw("entropy", cs, c->ent, o->ent, c->N, 1, 0, 1, tol);
    g_nw_floor = 1e-30L;
    ok &= close_nw("lse", cs, c->lse, o->lse, c->N, 1, 0, 1, tol);
    if (grads) {
        ok &= close_nw_b("dhidden", cs, c->dh, o->dh, grads == 2 ? o->dhb : NULL, c->N, c->H, 0,
                         c->H, tol);
        ok &= close_nw_b("dweight", cs, c->dw, o->dw, grads == 2 ? o->dwb : NULL, c->V_loc, c->H,
                         0, c->H, tol);
    }
    return ok;
}

static void test_ref_magnitudes(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 26008);
    sph_ctx_t ctx = hc_ctx("ref", 1, NULL);
    const double zm[4] = {1e2, 2e4, 2e9, 1e30}, Ts[2] = {1.0, 1e-4};
    int ok = 1, n = 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 2; b++)
            for (int ties = 0; ties < 2; ties++)
                for (int one_pass = 0; one_pass < 2; one_pass++) {
                    hcase c;
                    scaled_case(&c, &r, zm[a], Ts[b], ties);
                    char cs[128];
                    snprintf(cs, sizeof cs, "ref(|z|~%g,T=%g,ties=%d,one_pass=%d)", zm[a], Ts[b],
                             ties, one_pass);
                    run_case(ctx, &c, Ts[b], one_pass);
                    oracle o;
                    oracle_run(&c, Ts[b], &o);
                    /* the two-pass backward reads float32 stats: log S of a tied row at |z|
                     * >> 2^24 is below their resolution (docs/design.md 2.3), so ties are
                     * checked through the forward and one-pass only */
                    const int grads = one_pass ? 1 : ties ? 0 : 2;
                    if (grads == 2) ok &= stats_bound(&c, cs, Ts[b], &o);
                    ok &= check_case(&c, &o, cs, grads, 2e-6);
                    oracle_free(&o);
                    hc_free(&c);
                    n++;
                }
    sph_ctx_destroy(ctx);
    assert_int_equal(n, 32);
    assert_true(ok);
}

// ---- the CPU backend at low temperature ------------------------------------------------------

/* u = 12 + sum_k (a/8)(b g) with integer a, b and g = 2^floor(log2(T/4)): every product and
 * partial sum is exact in float32 (< 24 bits), |z| ~ 12 / T, and the rows are far from
 * peaked (their logits spread over a few T). */
static void dyadic_case(hcase *c, sph_rng *r, double T) {
    const int64_t N = 21, H = 17, V = 300;
    hc_init(c, r, N, H, V, V, 0, 0, SPH_F32);
    float *h = c->h, *w = c->w;
    const double g = ldexp(1.0, (int)floor(log2(T / 4)));
    for (int64_t i = 0; i < N; i++) {
        h[i * H] = 1;
        for (int64_t k = 1; k < H; k++) h[i * H + k] = (float)(rng_range(r, -8, 8) / 8.0);
    }
    for (int64_t j = 0; j < V; j++) {
        w[j * H] = 12;
        for (int64_t k = 1; k < H; k++) w[j * H + k] = (float)(rng_range(r, -4, 4) * g);
    }
    for (int64_t i = 0; i < N; i++) c->tgt[i] = i % 5 == 4 ? -100 : rng_range(r, 0, V - 1);
}

static void test_cpu_low_temperature(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 26009);
    const char *kernels[4] = {NULL, "generic", "avx2", "avx512"};
    const double Ts[3] = {1e-2, 1e-3, 1e-4};
    int ok = 1, n = 0;
    for (int kk = 0; kk < 4; kk++) {
        sph_ctx_opts opt = SPH_CTX_OPTS_INIT;
        opt.force_kernel = kernels[kk];
        opt.num_threads = 2;
        sph_ctx_t ctx = NULL;
        if (sph_ctx_create(&ctx, &opt) != SPH_OK) continue; /* an ISA this machine lacks */
        for (int b = 0; b < 3; b++)
            for (int one_pass = 0; one_pass < 2; one_pass++) {
                hcase c;
                dyadic_case(&c, &r, Ts[b]);
                char cs[128];
                snprintf(cs, sizeof cs, "cpu(kernel=%s,T=%g,one_pass=%d,|z|~%g)",
                         kernels[kk] ? kernels[kk] : "default", Ts[b], one_pass, 12 / Ts[b]);
                run_case(ctx, &c, Ts[b], one_pass);
                oracle o;
                oracle_run(&c, Ts[b], &o);
                ok &= check_case(&c, &o, cs, 0, 2e-5);
                if (one_pass) {
                    ok &= close_nw("dweight", cs, c.dw, o.dw, c.V_loc, c.H, 0, c.H, 2e-5);
                    ok &= close_nw("dhidden[:, 1:]", cs, c.dh, o.dh, c.N, c.H, 1, c.H, 2e-5);
                }
                oracle_free(&o);
                hc_free(&c);
                n++;
            }
        sph_ctx_destroy(ctx);
    }
    assert_true(n >= 6);
    assert_true(ok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_magnitudes),
        cmocka_unit_test(test_cpu_low_temperature),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
