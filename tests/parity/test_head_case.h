/*
 * test_head_case.h - shared by the LM-head tests: a random case (inputs rounded to the input
 * dtype, every output poisoned), the wiring of sph_head_args, a runner, the expected results
 * (the float64 reference's cores, and an independent float64 forward/backward written here
 * from the formulas: entropy as -sum p log p, the gradient with the absolute sums the half
 * precision budgets need), the checks of tests/tolerances.h, and an in-process
 * tensor-parallel communicator (one thread per rank) whose collectives fail on every rank as
 * soon as one rank gives up, so a failing rank never leaves its peers waiting.
 */
#ifndef SPH_TEST_HEAD_CASE_H
#define SPH_TEST_HEAD_CASE_H

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "core/internal.h"
#include "head/plan.h"
#include "head/host.h"
#include "testutil.h"

typedef struct hcase {
    int64_t N, H, V_loc, V, v0, K;
    sph_dtype dt, gdt; /* input dtype, gradient output dtype */
    void *h, *w;       /* (N, H), (V_loc, H) */
    int64_t *tgt, *cand;
    uint8_t *mask;
    int64_t *spans, n_spans;
    float *lp, *ent, *lse, *lm, *stats, *g, *e, *gl, *gm;
    void *dh, *dw;
    int64_t sh_h[2], sh_w[2], sh_n[1], sh_c[2], sh_s[2], sh_dh[2], sh_dw[2];
    sph_tensor th, tw, tt, tc, tm, tlp, tent, tlse, tlm, tst, tg, te, tgl, tgm, tdh, tdw;
    sph_head_args a;
} hcase;

static inline size_t hc_esize(sph_dtype d) { return d.bits / 8; }

static inline double hc_get(const void *b, sph_dtype d, int64_t k) {
    if (d.bits == 32) return ((const float *)b)[k];
    if (d.bits == 64) return ((const double *)b)[k];
    uint16_t v = ((const uint16_t *)b)[k];
    return d.code == SPH_DTYPE_BFLOAT ? sph_bf16_to_f32(v) : sph_f16_to_f32(v);
}

static inline void hc_set(void *b, sph_dtype d, int64_t k, double v) {
    if (d.bits == 32) {
        ((float *)b)[k] = (float)v;
    } else {
        ((uint16_t *)b)[k] =
            d.code == SPH_DTYPE_BFLOAT ? sph_f32_to_bf16((float)v) : sph_f32_to_f16((float)v);
    }
}

/* Unit roundoff of a gradient output dtype (0 for f32: the f32 budget covers it). */
static inline double hc_u_out(sph_dtype d) {
    if (d.bits != 16) return 0;
    return d.code == SPH_DTYPE_BFLOAT ? TOL_U_BF16 : TOL_U_F16;
}

static inline void *hc_alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

static inline void *hc_dup(const void *src, size_t bytes) {
    void *p = hc_alloc(bytes);
    if (bytes) memcpy(p, src, bytes);
    return p;
}

/* A case with N rows, H hidden, shard [v0, v0 + V_loc) of V, K candidates (0 = full). The
 * logit scale keeps the softmax neither flat nor one-hot. Targets: random in [0, V) (inside
 * the support in candidate mode), every 7th row ignored (-100). No mask, no spans. */
static inline void hc_init(hcase *c, sph_rng *r, int64_t N, int64_t H, int64_t V_loc,
                           int64_t V, int64_t v0, int64_t K, sph_dtype dt) {
    memset(c, 0, sizeof *c);
    c->N = N, c->H = H, c->V_loc = V_loc, c->V = V, c->v0 = v0, c->K = K, c->dt = dt;
    c->gdt = SPH_F32;
    c->h = hc_alloc((size_t)(N * H) * hc_esize(dt));
    c->w = hc_alloc((size_t)(V_loc * H) * hc_esize(dt));
    double ws = 2.5 / sqrt((double)H);
    for (int64_t k = 0; k < N * H; k++) hc_set(c->h, dt, k, rng_normal(r));
    for (int64_t k = 0; k < V_loc * H; k++) hc_set(c->w, dt, k, rng_normal(r) * ws);
    c->tgt = hc_alloc((size_t)N * sizeof(int64_t));
    if (K) {
        c->cand = hc_alloc((size_t)(N * K) * sizeof(int64_t));
        for (int64_t i = 0; i < N; i++) {
            int64_t n = 0;
            while (n < K) { /* distinct ids, some padding */
                int64_t id = rng_range(r, 0, V - 1);
                int dup = 0;
                for (int64_t q = 0; q < n; q++) dup |= c->cand[i * K + q] == id;
                if (dup) continue;
                c->cand[i * K + n++] = id;
                if (n >= 2 && n < K && rng_uniform(r) < 0.15) break;
            }
            int64_t filled = n;
            for (; n < K; n++) c->cand[i * K + n] = -1;
            c->tgt[i] = c->cand[i * K + rng_range(r, 0, filled - 1)];
        }
    } else {
        for (int64_t i = 0; i < N; i++) c->tgt[i] = rng_range(r, 0, V - 1);
    }
    for (int64_t i = 3; i < N; i += 7) c->tgt[i] = -100;
    c->lp = hc_alloc((size_t)N * 4), c->ent = hc_alloc((size_t)N * 4);
    c->lse = hc_alloc((size_t)N * 4), c->lm = hc_alloc((size_t)N * 4);
    c->stats = hc_alloc((size_t)N * 12);
    c->g = hc_alloc((size_t)N * 4), c->e = hc_alloc((size_t)N * 4);
    c->gl = hc_alloc((size_t)N * 4), c->gm = hc_alloc((size_t)N * 4);
    for (int64_t i = 0; i < N; i++) {
        c->g[i] = (float)rng_normal(r);
        c->e[i] = (float)rng_normal(r);
        c->gl[i] = (float)rng_normal(r);
        c->gm[i] = (float)rng_normal(r);
    }
    c->dh = hc_alloc((size_t)(N * H) * 4);
    c->dw = hc_alloc((size_t)(V_loc * H) * 4);
}

/* Targets on the shard's edges: the first row predicts the shard's first id, the last row
 * its last id (full-vocabulary cases; ignored rows stay ignored). An off-by-one at either end
 * of the vocabulary, or a test of "t > 0" for "t >= 0", then changes a result. */
static inline void hc_edge_targets(hcase *c) {
    if (c->K || c->N == 0) return;
    if (c->tgt[0] >= 0) c->tgt[0] = c->v0;
    if (c->N > 1 && c->tgt[c->N - 1] >= 0) c->tgt[c->N - 1] = c->v0 + c->V_loc - 1;
}

static inline void hc_free(hcase *c) {
    free(c->h), free(c->w), free(c->tgt), free(c->cand), free(c->mask), free(c->spans);
    free(c->lp), free(c->ent), free(c->lse), free(c->lm), free(c->stats);
    free(c->g), free(c->e), free(c->gl), free(c->gm), free(c->dh), free(c->dw);
}

/* Which optional pieces are wired into the args. */
enum {
    HC_LP = 1, HC_ENT = 2, HC_LSE = 4, HC_LM = 8, /* outputs */
    HC_G = 16, HC_E = 32, HC_GL = 64, HC_GM = 128, /* upstream gradients */
    HC_DH = 256, HC_DW = 512, HC_MASK = 1024, HC_SPANS = 2048
};
#define HC_OUTS (HC_LP | HC_ENT | HC_LSE | HC_LM)
#define HC_UPS (HC_G | HC_E | HC_GL | HC_GM)

static inline void hc_wire(hcase *c, unsigned what) {
    const int64_t N = c->N;
    c->th = tensor2(c->h, c->dt, c->sh_h, N, c->H);
    c->tw = tensor2(c->w, c->dt, c->sh_w, c->V_loc, c->H);
    c->tt = tensor1(c->tgt, SPH_I64, c->sh_n, N);
    c->tlp = tensor1(c->lp, SPH_F32, c->sh_n, N);
    c->tent = tensor1(c->ent, SPH_F32, c->sh_n, N);
    c->tlse = tensor1(c->lse, SPH_F32, c->sh_n, N);
    c->tlm = tensor1(c->lm, SPH_F32, c->sh_n, N);
    c->tg = tensor1(c->g, SPH_F32, c->sh_n, N);
    c->te = tensor1(c->e, SPH_F32, c->sh_n, N);
    c->tgl = tensor1(c->gl, SPH_F32, c->sh_n, N);
    c->tgm = tensor1(c->gm, SPH_F32, c->sh_n, N);
    c->tst = tensor2(c->stats, SPH_F32, c->sh_s, N, 3);
    c->tdh = tensor2(c->dh, c->gdt, c->sh_dh, N, c->H);
    c->tdw = tensor2(c->dw, c->gdt, c->sh_dw, c->V_loc, c->H);
    c->tm = tensor1(c->mask, SPH_U8, c->sh_n, N);
    if (c->cand) c->tc = tensor2(c->cand, SPH_I64, c->sh_c, N, c->K);
    sph_head_args a = SPH_HEAD_ARGS_INIT;
    a.hidden = &c->th, a.weight = &c->tw, a.targets = &c->tt;
    a.candidates = c->cand ? &c->tc : NULL;
    a.vocab_start = c->v0, a.vocab_total = c->V;
    a.stats = &c->tst;
    if (what & HC_LP) a.logprob = &c->tlp;
    if (what & HC_ENT) a.entropy = &c->tent;
    if (what & HC_LSE) a.lse = &c->tlse;
    if ((what & HC_LM) && !c->cand) a.logit_mean = &c->tlm;
    if (what & HC_G) a.dlogprob = &c->tg;
    if (what & HC_E) a.dentropy = &c->te;
    if (what & HC_GL) a.dlse = &c->tgl;
    if ((what & HC_GM) && !c->cand) a.dlogit_mean = &c->tgm;
    if (what & HC_DH) a.dhidden = &c->tdh;
    if (what & HC_DW) a.dweight = &c->tdw;
    if ((what & HC_MASK) && c->mask) a.active_mask = &c->tm;
    if ((what & HC_SPANS) && c->spans) a.spans = c->spans, a.n_spans = c->n_spans;
    c->a = a;
}

/* Spans of c->mask: maximal runs of active rows, runs separated by <= gap inactive rows
 * merged (gap 0: exact runs). Written here, not with sph_spans_from_mask. */
static inline void hc_spans_of_mask(hcase *c, int64_t gap) {
    free(c->spans);
    c->spans = hc_alloc((size_t)(c->N + 1) * 2 * sizeof(int64_t));
    c->n_spans = 0;
    for (int64_t i = 0; i < c->N;) {
        if (!c->mask[i]) {
            i++;
            continue;
        }
        int64_t s = i;
        while (i < c->N && c->mask[i]) i++;
        if (c->n_spans > 0 && s - c->spans[2 * c->n_spans - 1] <= gap) {
            c->spans[2 * c->n_spans - 1] = i;
        } else {
            c->spans[2 * c->n_spans] = s, c->spans[2 * c->n_spans + 1] = i, c->n_spans++;
        }
    }
}

/* Random ragged mask with active fraction frac, plus its exact spans (gap 0). */
static inline void hc_mask(hcase *c, sph_rng *r, double frac) {
    free(c->mask);
    c->mask = hc_alloc((size_t)c->N + 1);
    for (int64_t i = 0; i < c->N; i++) c->mask[i] = rng_uniform(r) < frac;
    hc_spans_of_mask(c, 0);
}

/* A ragged mask that has at least one active row, and one inactive row when N >= 2. */
static inline void hc_mask_ragged(hcase *c, sph_rng *r, double frac) {
    hc_mask(c, r, frac);
    if (c->N == 0) return;
    int64_t n = 0;
    for (int64_t i = 0; i < c->N; i++) n += c->mask[i];
    if (n == 0) c->mask[rng_range(r, 0, c->N - 1)] = 1;
    if (n == c->N && c->N >= 2) c->mask[rng_range(r, 0, c->N - 1)] = 0;
    hc_spans_of_mask(c, 0);
}

/* Row i is active under the args' rule (mask, else spans, else all), from the args alone. */
static inline void hc_active_of(const sph_head_args *a, int64_t N, uint8_t *act) {
    if (a->active_mask) {
        const uint8_t *m = a->active_mask->data;
        for (int64_t i = 0; i < N; i++) act[i] = m[i] != 0;
    } else if (a->spans) {
        memset(act, 0, (size_t)N);
        for (int64_t s = 0; s < a->n_spans; s++)
            for (int64_t i = a->spans[2 * s]; i < a->spans[2 * s + 1]; i++) act[i] = 1;
    } else {
        memset(act, 1, (size_t)N);
    }
}

static inline void hc_active(const hcase *c, uint8_t *act) { hc_active_of(&c->a, c->N, act); }

static inline void hc_poison(hcase *c) {
    poison_f32(c->lp, (size_t)c->N), poison_f32(c->ent, (size_t)c->N);
    poison_f32(c->lse, (size_t)c->N), poison_f32(c->lm, (size_t)c->N);
    poison_f32(c->stats, (size_t)c->N * 3);
    poison_bytes(c->dh, (size_t)(c->N * c->H) * 4);
    poison_bytes(c->dw, (size_t)(c->V_loc * c->H) * 4);
}

/* d loss(arg) / d x[k] by central differences, Richardson-extrapolated over the half-steps
 * 2^-10 and 2^-11. The h^2 term of the truncation error cancels, leaving O(h^4): step 1e-3
 * alone once left 3e-5 relative (a GSPO loss: exp(rho) times the cube of a row's log-prob
 * derivative), past TOL_FD. Powers of two keep x0 +- h exact in float for 2^-13 < |x0| <
 * 2^13, so the steps are symmetric (a rounded step of 1e-3 is off by up to an ulp of x0 on one
 * side, an error of f'' ulp / 2 ~ 6e-8 relative). Cancellation: eps64 |L| / 2^-11 ~ 5e-13.
 * x[k] is restored. */
static inline double hc_central_diff(float *x, int64_t k, double (*loss)(void *), void *arg) {
    const float x0 = x[k];
    double d[2], a2[2];
    for (int s = 0; s < 2; s++) {
        const double h = s ? 0x1p-11 : 0x1p-10;
        const float xp = (float)(x0 + h), xm = (float)(x0 - h);
        x[k] = xp;
        const double Lp = loss(arg);
        x[k] = xm;
        const double Lm = loss(arg);
        const double a = ((double)xp - (double)xm) / 2; /* the half-step taken */
        d[s] = (Lp - Lm) / (2 * a), a2[s] = a * a;
    }
    x[k] = x0;
    return (a2[0] * d[1] - a2[1] * d[0]) / (a2[0] - a2[1]);
}

typedef struct hc_fd_arg {
    const sph_head_plan *p;
    const hcase *c;
} hc_fd_arg;

/* L = sum_i g lp + e ent + gl lse + gm lm over the float64 rows of the reference (the loss
 * whose gradients the head's backward takes, c's upstream gradients as weights). */
static inline double hc_rows_loss_f64(void *arg) {
    const hc_fd_arg *f = arg;
    const hcase *c = f->c;
    double *o = hc_alloc((size_t)f->p->N * 7 * 8), L = 0;
    expect_ok(sph_head_ref_rows_f64(f->p, o));
    for (int64_t i = 0; i < f->p->N; i++)
        L += c->g[i] * o[i * 7] + c->e[i] * o[i * 7 + 1] + c->gl[i] * o[i * 7 + 2] +
             (c->K ? 0 : c->gm[i] * o[i * 7 + 3]);
    free(o);
    return L;
}

/* hc_rows_loss_f64's gradients in hidden (N, H) and weight (V_loc, H) by hc_central_diff, for
 * a plan p made from c's tensors (float32). */
static inline void hc_fd_grads(const sph_head_plan *p, hcase *c, double *fdh, double *fdw) {
    hc_fd_arg f = {p, c};
    for (int64_t k = 0; k < c->N * c->H; k++)
        fdh[k] = hc_central_diff((float *)c->h, k, hc_rows_loss_f64, &f);
    for (int64_t k = 0; k < c->V_loc * c->H; k++)
        fdw[k] = hc_central_diff((float *)c->w, k, hc_rows_loss_f64, &f);
}

static inline sph_ctx_t hc_ctx(const char *kernel, int threads, sph_comm_t comm) {
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.force_kernel = kernel;
    o.num_threads = threads;
    o.tp_comm = comm;
    sph_ctx_t ctx = NULL;
    expect_ok(sph_ctx_create(&ctx, &o));
    return ctx;
}

static inline void *hc_ws(sph_ctx_t ctx, sph_head_pass pass, const sph_head_args *a,
                          size_t *bytes) {
    expect_ok(sph_head_workspace_size(ctx, pass, a, bytes));
    return *bytes ? hc_alloc(*bytes) : NULL;
}

static inline sph_status hc_run(sph_ctx_t ctx, sph_head_pass pass, const sph_head_args *a) {
    size_t bytes = 0;
    sph_status s = sph_head_workspace_size(ctx, pass, a, &bytes);
    if (s != SPH_OK) return s;
    void *ws = bytes ? hc_alloc(bytes) : NULL;
    s = pass == SPH_HEAD_FORWARD ? sph_head_forward(ctx, a, ws, bytes)
                                 : sph_head_backward(ctx, a, ws, bytes);
    free(ws);
    return s;
}

/* Normwise check (tolerances.h): |got - ref| <= tol (max|ref| + TOL_NORM_FLOOR) + tol |ref|
 * elementwise, NaN fails. */
static inline int hc_close(const char *what, const char *cs, const void *got, sph_dtype gd,
                           const void *ref, sph_dtype rd, int64_t n, double tol) {
    double mx = 0;
    for (int64_t k = 0; k < n; k++) {
        double v = fabs(hc_get(ref, rd, k));
        if (v > mx) mx = v;
    }
    double *g = hc_alloc((size_t)n * 8), *rf = hc_alloc((size_t)n * 8);
    for (int64_t k = 0; k < n; k++) g[k] = hc_get(got, gd, k), rf[k] = hc_get(ref, rd, k);
    int ok = check_close_f64(what, cs, g, rf, (size_t)n, tol * (mx + TOL_NORM_FLOOR), tol);
    free(g), free(rf);
    return ok;
}

/* Column col of an (N, stride) float64 table against got[i * gstride] (f32), normwise. */
static inline int hc_close_col(const char *what, const char *cs, const float *got, int gstride,
                               const double *tab, int stride, int col, int64_t N, double tol) {
    double *ref = hc_alloc((size_t)N * 8);
    float *g = hc_alloc((size_t)N * 4);
    for (int64_t i = 0; i < N; i++) ref[i] = tab[i * stride + col], g[i] = got[i * gstride];
    int ok = hc_close(what, cs, g, SPH_F32, ref, SPH_F64, N, tol);
    free(ref), free(g);
    return ok;
}

/* A gradient output against its float64 expectation exp (the start value when accumulating
 * plus the gradient g) under tolerances.h's gradient budget: tol (max|g| + floor) + (tol +
 * u_out(gd)) |exp| + (uD * margin + acc) A + etaD * margin Z. A and Z may be NULL (no
 * product-error terms: the CPU's f32 dlogits). */
static inline int hc_check_grad(const char *what, const char *cs, const void *got, sph_dtype gd,
                                const double *exp, const double *g, const double *A,
                                const double *Z, int64_t n, double tol, double uD, double etaD,
                                double acc, double margin) {
    double gmax = 0;
    for (int64_t k = 0; k < n; k++)
        if (fabs(g[k]) > gmax) gmax = fabs(g[k]);
    double *gv = hc_alloc((size_t)n * 8 + 8), *bd = hc_alloc((size_t)n * 8 + 8);
    const double uo = hc_u_out(gd);
    char name[64]; /* the budget's use is reported per output dtype: dhidden.bf16 */
    snprintf(name, sizeof name, "%s.%s", what, sph_dtype_name(gd));
    for (int64_t k = 0; k < n; k++) {
        gv[k] = hc_get(got, gd, k);
        bd[k] = tol * (gmax + TOL_NORM_FLOOR) + (tol + uo) * fabs(exp[k]);
        if (A) bd[k] += (uD * margin + acc) * A[k];
        if (Z) bd[k] += etaD * margin * Z[k];
    }
    int ok = check_within(name, cs, gv, exp, bd, (size_t)n);
    free(gv), free(bd);
    return ok;
}

/* Bytes that must be bitwise as they were (an output not requested, an input). */
static inline int hc_untouched(const char *what, const char *cs, const void *now,
                               const void *before, size_t bytes) {
    if (!bytes || !memcmp(now, before, bytes)) return 1;
    size_t k = 0;
    while (((const unsigned char *)now)[k] == ((const unsigned char *)before)[k]) k++;
    fprintf(stderr, "FAIL %s %s: must be untouched, byte %zu of %zu changed; seed %llu\n", what,
            cs, k, bytes, (unsigned long long)test_seed());
    return 0;
}

// ---- expected results: the reference's float64 cores ---------------------------------------

/* rows (N, 7): logprob, entropy, lse, logit_mean, m, lse, mu of the reference (float64, on
 * this shard with its own communicator); dh (N, H) and dw (V_loc, H): this shard's float64
 * gradient of the active rows (no accumulate, no all-reduce), when the args carry gradient
 * outputs; active (N). */
typedef struct hexp {
    double *rows, *dh, *dw;
    uint8_t *active;
    int64_t n_active;
    int active_mismatch; /* sph_head_active_rows disagreed with the rule (also fail()ed) */
} hexp;

static inline void hc_expect(sph_ctx_t ref_ctx, const sph_head_args *a, hexp *x) {
    sph_head_plan p;
    expect_ok(sph_head_plan_make(ref_ctx, SPH_HEAD_FORWARD, a, &p));
    const int64_t N = p.N, H = p.H;
    x->rows = hc_alloc((size_t)N * 7 * 8 + 8);
    x->active = hc_alloc((size_t)N + 1);
    expect_ok(sph_head_ref_rows_f64(&p, x->rows));
    /* the active rows by the rule of spanhead.h, computed here (hc_active), must be the ones
     * the library derives (sph_head_active_rows): the expectation never trusts the latter */
    uint8_t *lib = hc_alloc((size_t)N + 1);
    sph_head_active_rows(&p, lib);
    hc_active_of(a, N, x->active);
    x->n_active = 0;
    x->active_mismatch = 0;
    for (int64_t i = 0; i < N; i++) {
        x->n_active += x->active[i];
        if (lib[i] != x->active[i] && !x->active_mismatch++) {
            fprintf(stderr, "FAIL sph_head_active_rows: row %lld is %s by the library, %s by the "
                            "rule (mask, else spans, else all); seed %llu\n",
                    (long long)i, lib[i] ? "active" : "inactive",
                    x->active[i] ? "active" : "inactive", (unsigned long long)test_seed());
            fail();
        }
    }
    free(lib);
    x->dh = x->dw = NULL;
    if (p.one_pass) {
        double *st = hc_alloc((size_t)N * 24 + 8);
        for (int64_t i = 0; i < N; i++)
            for (int f = 0; f < 3; f++) st[i * 3 + f] = x->rows[i * 7 + 4 + f];
        x->dh = hc_alloc((size_t)(N * H) * 8 + 8);
        x->dw = hc_alloc((size_t)(p.V_loc * H) * 8 + 8);
        expect_ok(sph_head_ref_backward_f64(&p, st, x->dh, x->dw));
        free(st);
    }
}

static inline void hc_expect_free(hexp *x) {
    free(x->rows), free(x->dh), free(x->dw), free(x->active);
    memset(x, 0, sizeof *x);
}

// ---- an independent float64 forward and backward ----------------------------------------

/* Local columns of row i (whole shard, or its candidates inside the shard); count. */
static inline int64_t hc_cols(const hcase *c, int64_t i, int64_t *cols) {
    int64_t n = 0;
    if (!c->K) {
        for (int64_t j = 0; j < c->V_loc; j++) cols[n++] = j;
        return n;
    }
    for (int64_t k = 0; k < c->K; k++) {
        int64_t id = c->cand[i * c->K + k];
        if (id >= c->v0 && id < c->v0 + c->V_loc) cols[n++] = id - c->v0;
    }
    return n;
}

static inline double hc_u(const hcase *c, int64_t i, int64_t j) {
    double u = 0;
    for (int64_t k = 0; k < c->H; k++)
        u += hc_get(c->h, c->dt, i * c->H + k) * hc_get(c->w, c->dt, j * c->H + k);
    return u;
}

#define HC_IND 6 /* per row: logprob, entropy (-sum p log p), lse, logit_mean, mu, max z */

/* Straight from spanhead.h's formulas, sharing no code with head_ref.c: the logits z, the
 * probabilities p = exp(z - max) / sum, entropy -sum p log p (log of the probability itself,
 * not lse - mu), logprob z_t - lse, logit_mean sum z / V. Inactive rows (act[i] = 0) and rows
 * without a column give 0. out is (N, HC_IND). */
static inline void hc_indep_forward(const hcase *c, double T, double cap, const uint8_t *act,
                                    double *out) {
    const int64_t nc = c->K ? c->K : c->V_loc;
    int64_t *cols = hc_alloc((size_t)nc * 8);
    double *z = hc_alloc((size_t)nc * 8);
    for (int64_t i = 0; i < c->N; i++) {
        double *o = out + i * HC_IND;
        for (int f = 0; f < HC_IND; f++) o[f] = 0;
        int64_t n = act[i] ? hc_cols(c, i, cols) : 0;
        if (!n) continue;
        double mx = -INFINITY, s = 0, sz = 0, zt = 0;
        for (int64_t q = 0; q < n; q++) {
            double u = hc_u(c, i, cols[q]);
            z[q] = (cap > 0 ? cap * tanh(u / cap) : u) / T;
            if (z[q] > mx) mx = z[q];
            sz += z[q];
            if (cols[q] + c->v0 == c->tgt[i]) zt = z[q];
        }
        for (int64_t q = 0; q < n; q++) s += exp(z[q] - mx);
        double lse = mx + log(s), ent = 0, mu = 0;
        for (int64_t q = 0; q < n; q++) {
            double p = exp(z[q] - mx) / s;
            if (p > 0) ent -= p * log(p);
            mu += p * z[q];
        }
        o[0] = c->tgt[i] >= 0 ? zt - lse : 0;
        o[1] = ent, o[2] = lse, o[3] = c->K ? 0 : sz / (double)c->V, o[4] = mu, o[5] = mx;
    }
    free(cols), free(z);
}

/* The gradient of L = sum_i g lp + e ent + gl lse + gm lm (the upstreams in `ups`) from the
 * independent forward fw, with dz_j = g (delta - p_j) - e p_j (log p_j + ent) + gl p_j + gm / V
 * and du = dz / T * (1 - tanh^2(u / cap)). dh (N, H), dw (V_loc, H); adh/adw the sums of
 * |du| |operand| over each product, zdh/zdw the sums of |operand| (tolerances.h's A and Z).
 * Any output may be NULL. OpenMP over rows, then over vocabulary rows (the device tests'
 * hosts have many cores; results do not depend on the thread count). */
static inline void hc_indep_backward(const hcase *c, double T, double cap, const uint8_t *act,
                                     const double *fw, unsigned ups, double *dh, double *dw,
                                     double *adh, double *adw, double *zdh, double *zdw) {
    const int64_t N = c->N, H = c->H, VL = c->V_loc, nc = c->K ? c->K : c->V_loc;
    double *outs[6] = {dh, dw, adh, adw, zdh, zdw};
    for (int k = 0; k < 6; k++)
        if (outs[k]) memset(outs[k], 0, (size_t)((k % 2 ? VL : N) * H) * 8);
    /* du (N, nc) with its local columns (N, nc; -1 past the row's count) */
    double *du = hc_alloc((size_t)(N * nc) * 8 + 8);
    int64_t *col = hc_alloc((size_t)(N * nc) * 8 + 8);
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t i = 0; i < N; i++) {
        int64_t *cols = col + i * nc;
        int64_t n = act[i] ? hc_cols(c, i, cols) : 0;
        for (int64_t q = n; q < nc; q++) cols[q] = -1;
        const double *o = fw + i * HC_IND;
        const double lse = o[2], ent = o[1];
        const double g = (ups & HC_G) && c->tgt[i] >= 0 ? c->g[i] : 0;
        const double e = (ups & HC_E) ? c->e[i] : 0, gl = (ups & HC_GL) ? c->gl[i] : 0;
        const double gm = (ups & HC_GM) && !c->K ? c->gm[i] : 0;
        for (int64_t q = 0; q < n; q++) {
            const int64_t j = cols[q];
            double u = hc_u(c, i, j), z = (cap > 0 ? cap * tanh(u / cap) : u) / T;
            double p = exp(z - lse), lp = z - lse;
            double dz = g * ((j + c->v0 == c->tgt[i]) - p) - e * p * (lp + ent) + gl * p +
                        gm / (double)c->V;
            double d = dz / T;
            if (cap > 0) d *= 1 - tanh(u / cap) * tanh(u / cap);
            du[i * nc + q] = d;
        }
        if (dh || adh || zdh)
            for (int64_t q = 0; q < n; q++)
                for (int64_t k = 0; k < H; k++) {
                    double wv = hc_get(c->w, c->dt, cols[q] * H + k), d = du[i * nc + q];
                    if (dh) dh[i * H + k] += d * wv;
                    if (adh) adh[i * H + k] += fabs(d * wv);
                    if (zdh) zdh[i * H + k] += fabs(wv);
                }
    }
    if (dw || adw || zdw) {
        /* each vocabulary row j sums over the (row, column) pairs that hit it, rows in order:
         * for the full vocabulary the column is j itself, for support any of the K */
#pragma omp parallel for schedule(dynamic, 8)
        for (int64_t j = 0; j < VL; j++)
            for (int64_t i = 0; i < N; i++)
                for (int64_t q = c->K ? 0 : j; q < (c->K ? nc : j + 1); q++) {
                    if (col[i * nc + q] != j) continue;
                    double d = du[i * nc + q];
                    for (int64_t k = 0; k < H; k++) {
                        double hv = hc_get(c->h, c->dt, i * H + k);
                        if (dw) dw[j * H + k] += d * hv;
                        if (adw) adw[j * H + k] += fabs(d * hv);
                        if (zdw) zdw[j * H + k] += fabs(hv);
                    }
                }
    }
    free(du), free(col);
}

// ---- in-process TP communicator ---------------------------------------------------------

/* A barrier that fails instead of waiting forever: tp_group_abort (a rank giving up) or a
 * 60 s wait fails every rank's current and later collectives. */
typedef struct tp_group {
    int64_t size;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t arrived;
    uint64_t gen;
    int failed;
    const void *send[16];
    float *reduce[16];
} tp_group;

static inline void tp_group_init(tp_group *g, int64_t size) {
    memset(g, 0, sizeof *g);
    g->size = size;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
}

static inline void tp_group_destroy(tp_group *g) {
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
}

static inline void tp_group_abort(tp_group *g) {
    pthread_mutex_lock(&g->mu);
    g->failed = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* 0 when every rank arrived, -1 when the group failed first. */
static inline int tp_barrier(tp_group *g) {
    pthread_mutex_lock(&g->mu);
    int ok = !g->failed;
    if (ok) {
        uint64_t gen = g->gen;
        if (++g->arrived == g->size) {
            g->arrived = 0;
            g->gen++;
            pthread_cond_broadcast(&g->cv);
        } else {
            struct timespec dl;
            clock_gettime(CLOCK_REALTIME, &dl);
            dl.tv_sec += 60;
            while (gen == g->gen && !g->failed)
                if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) == ETIMEDOUT) {
                    fprintf(stderr, "in-process TP group: a collective waited 60 s\n");
                    g->failed = 1;
                    pthread_cond_broadcast(&g->cv);
                }
            ok = gen != g->gen;
        }
    }
    pthread_mutex_unlock(&g->mu);
    return ok ? 0 : -1;
}

static inline sph_status tp_peer_failed(void) {
    return sph_err(SPH_ERR_INTERNAL, "in-process TP group: a peer rank failed (collective "
                                     "abandoned)");
}

static sph_status tp_allgather(sph_comm_t c, const void *send, void *recv, size_t bytes,
                               void *stream) {
    (void)stream;
    tp_group *g = c->impl;
    g->send[c->rank] = send;
    if (tp_barrier(g)) return tp_peer_failed();
    for (int64_t r = 0; r < g->size; r++)
        memcpy((char *)recv + (size_t)r * bytes, g->send[r], bytes);
    if (tp_barrier(g)) return tp_peer_failed();
    return SPH_OK;
}

static sph_status tp_allreduce(sph_comm_t c, float *buf, size_t count, void *stream) {
    (void)stream;
    tp_group *g = c->impl;
    float *mine = malloc(count * sizeof *mine + 1);
    if (!mine) {
        tp_group_abort(g);
        return sph_err(SPH_ERR_ALLOC, "in-process TP group: out of memory");
    }
    memcpy(mine, buf, count * sizeof *mine);
    g->reduce[c->rank] = mine;
    if (tp_barrier(g)) {
        free(mine);
        return tp_peer_failed();
    }
    for (size_t k = 0; k < count; k++) {
        float s = 0;
        for (int64_t r = 0; r < g->size; r++) s += g->reduce[r][k]; /* rank order */
        buf[k] = s;
    }
    int bad = tp_barrier(g);
    free(mine);
    return bad ? tp_peer_failed() : SPH_OK;
}

static void tp_destroy(sph_comm_t c) { (void)c; }

static const sph_comm_ops tp_ops = {tp_allgather, tp_allreduce, tp_destroy};

static inline struct sph_comm tp_comm_of(tp_group *g, int64_t rank) {
    struct sph_comm c;
    memset(&c, 0, sizeof c);
    c.backend = SPH_COMM_NONE;
    c.rank = rank;
    c.size = g->size;
    c.ops = &tp_ops;
    c.impl = g;
    return c;
}

// ---- TP runs: shards in threads against the unsharded float64 reference -------------------

/* One TP configuration: ranks shards of V (rank r holds [V r / ranks, V (r + 1) / ranks)),
 * chunk_rows per chunk on every rank (several chunks: one combine per chunk in one-pass mode),
 * a ragged mask or none, and the gradient either all-reduced (allreduce_dhidden) or left as
 * each rank's partial (summed here), dweight accumulated onto a random start or not. */
typedef struct tpcfg {
    int64_t ranks, N, H, V, K, chunk_rows;
    sph_dtype dt;
    int one_pass, masked, allreduce, acc_dw;
    double T, cap;
} tpcfg;

typedef struct tp_job {
    tp_group *g;
    int64_t rank;
    const tpcfg *cfg;
    hcase *full; /* unsharded case (inputs only read) */
    hcase shard;
    const char *kernel;
    const float *dw0; /* start of dweight when accumulating (full V x H), or NULL */
    sph_status st;
    char err[256];
} tp_job;

static inline void *tp_rank_main(void *arg) {
    tp_job *j = arg;
    const tpcfg *t = j->cfg;
    hcase *f = j->full, *c = &j->shard;
    struct sph_comm comm = tp_comm_of(j->g, j->rank);
    int64_t a0 = t->V * j->rank / t->ranks, a1 = t->V * (j->rank + 1) / t->ranks;
    /* the shard view of the full case: same rows, weight rows [a0, a1) */
    *c = *f;
    c->V_loc = a1 - a0, c->v0 = a0;
    c->w = (char *)f->w + (size_t)(a0 * f->H) * hc_esize(f->dt);
    c->lp = hc_alloc((size_t)f->N * 4), c->ent = hc_alloc((size_t)f->N * 4);
    c->lse = hc_alloc((size_t)f->N * 4), c->lm = hc_alloc((size_t)f->N * 4);
    c->stats = hc_alloc((size_t)f->N * 12);
    c->dh = hc_alloc((size_t)(f->N * f->H) * 4);
    c->dw = hc_alloc((size_t)(c->V_loc * f->H) * 4);
    hc_poison(c);
    if (j->dw0) memcpy(c->dw, j->dw0 + a0 * f->H, (size_t)(c->V_loc * f->H) * 4);
    sph_ctx_t ctx = NULL;
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.force_kernel = j->kernel;
    o.num_threads = 1;
    o.chunk_rows = t->chunk_rows;
    o.tp_comm = &comm;
    j->st = sph_ctx_create(&ctx, &o);
    unsigned m = t->masked ? HC_MASK | HC_SPANS : 0;
    if (j->st == SPH_OK) {
        hc_wire(c, HC_OUTS | m | (t->one_pass ? HC_UPS | HC_DH | HC_DW : 0));
        c->a.temperature = t->T, c->a.softcap = t->cap;
        c->a.allreduce_dhidden = t->one_pass && t->allreduce;
        c->a.accumulate_dweight = t->acc_dw;
        j->st = hc_run(ctx, SPH_HEAD_FORWARD, &c->a);
    }
    if (j->st == SPH_OK && !t->one_pass) {
        hc_wire(c, HC_UPS | HC_DH | HC_DW | m);
        c->a.temperature = t->T, c->a.softcap = t->cap;
        c->a.allreduce_dhidden = t->allreduce;
        c->a.accumulate_dweight = t->acc_dw;
        j->st = hc_run(ctx, SPH_HEAD_BACKWARD, &c->a);
    }
    if (j->st != SPH_OK) {
        snprintf(j->err, sizeof j->err, "rank %lld: %s", (long long)j->rank, sph_last_error());
        tp_group_abort(j->g); /* the peers' collectives fail now instead of waiting */
    }
    sph_ctx_destroy(ctx);
    return NULL;
}

static inline void tp_case_str(const tpcfg *t, const char *kernel, char *cs, size_t n) {
    snprintf(cs, n,
             "head_tp(kernel=%s,ranks=%lld,N=%lld,H=%lld,V=%lld,K=%lld,dtype=%s,one_pass=%d,"
             "masked=%d,allreduce=%d,acc_dw=%d,T=%g,cap=%g,chunk=%lld)",
             kernel ? kernel : "best", (long long)t->ranks, (long long)t->N, (long long)t->H,
             (long long)t->V, (long long)t->K, sph_dtype_name(t->dt), t->one_pass, t->masked,
             t->allreduce, t->acc_dw, t->T, t->cap, (long long)t->chunk_rows);
}

/* Runs the configuration as `ranks` shards in threads with `kernel`, and compares every
 * rank's per-row outputs and stats with the unsharded float64 reference (entropy also with
 * the independent -sum p log p), the concatenated dweight shards with the reference's dweight
 * (plus the start when accumulating), and dhidden (all-reduced, or the ranks' partials summed)
 * with the reference's dhidden. Inactive rows: exact zeros everywhere. Returns 1 if all pass. */
static inline int tp_check_cfg(sph_rng *r, const char *kernel, const tpcfg *t) {
    hcase f;
    const int64_t N = t->N, H = t->H, V = t->V;
    hc_init(&f, r, N, H, V, V, 0, t->K, t->dt);
    hc_edge_targets(&f);
    if (t->masked) hc_mask_ragged(&f, r, 0.6);
    float *dw0 = NULL;
    if (t->acc_dw) {
        dw0 = hc_alloc((size_t)(V * H) * 4);
        for (int64_t k = 0; k < V * H; k++) dw0[k] = (float)rng_normal(r);
    }
    char cs[256];
    tp_case_str(t, kernel, cs, sizeof cs);
    /* expected: the unsharded float64 reference */
    hc_wire(&f, HC_OUTS | HC_UPS | HC_DH | HC_DW | (t->masked ? HC_MASK | HC_SPANS : 0));
    f.a.temperature = t->T, f.a.softcap = t->cap;
    sph_ctx_t rc = hc_ctx("ref", 1, NULL);
    hexp x;
    hc_expect(rc, &f.a, &x);
    sph_ctx_destroy(rc);
    double *ind = hc_alloc((size_t)N * HC_IND * 8 + 8);
    hc_indep_forward(&f, t->T, t->cap, x.active, ind);

    tp_group g;
    tp_group_init(&g, t->ranks);
    tp_job jobs[16];
    pthread_t th[16];
    assert_true(t->ranks <= 16);
    for (int64_t k = 0; k < t->ranks; k++) {
        memset(&jobs[k], 0, sizeof jobs[k]);
        jobs[k].g = &g, jobs[k].rank = k, jobs[k].cfg = t, jobs[k].full = &f;
        jobs[k].kernel = kernel, jobs[k].dw0 = dw0;
        assert_int_equal(pthread_create(&th[k], NULL, tp_rank_main, &jobs[k]), 0);
    }
    for (int64_t k = 0; k < t->ranks; k++) pthread_join(th[k], NULL);
    tp_group_destroy(&g);

    int ok = 1;
    double *dh_sum = hc_alloc((size_t)(N * H) * 8 + 8), *dw_all = hc_alloc((size_t)(V * H) * 8 + 8);
    double *dw_exp = hc_alloc((size_t)(V * H) * 8 + 8);
    memset(dh_sum, 0, (size_t)(N * H) * 8);
    for (int64_t k = 0; k < t->ranks; k++) {
        hcase *c = &jobs[k].shard;
        if (jobs[k].st != SPH_OK) {
            fprintf(stderr, "FAIL %s: %s\n", cs, jobs[k].err);
            ok = 0;
            continue;
        }
        ok &= hc_close_col("logprob", cs, c->lp, 1, x.rows, 7, 0, N, TOL_CPU_F32);
        ok &= hc_close_col("entropy", cs, c->ent, 1, x.rows, 7, 1, N, TOL_CPU_F32);
        ok &= hc_close_col("entropy -sum p log p", cs, c->ent, 1, ind, HC_IND, 1, N, TOL_CPU_F32);
        ok &= hc_close_col("lse", cs, c->lse, 1, x.rows, 7, 2, N, TOL_CPU_F32);
        if (!t->K) ok &= hc_close_col("logit_mean", cs, c->lm, 1, x.rows, 7, 3, N, TOL_CPU_F32);
        for (int s = 0; s < 3; s++)
            ok &= hc_close_col(s == 0 ? "stats.m" : s == 1 ? "stats.lse" : "stats.mu", cs,
                               c->stats + s, 3, x.rows, 7, 4 + s, N, TOL_CPU_F32);
        for (int64_t i = 0; i < N; i++)
            if (!x.active[i]) {
                int z = c->lp[i] == 0 && c->ent[i] == 0 && c->lse[i] == 0 &&
                        (t->K || c->lm[i] == 0) && c->stats[3 * i] == 0 &&
                        c->stats[3 * i + 1] == 0 && c->stats[3 * i + 2] == 0;
                for (int64_t q = 0; q < H; q++) z &= ((float *)c->dh)[i * H + q] == 0.0f;
                if (!z) {
                    fprintf(stderr, "FAIL %s rank %lld: inactive row %lld not all zeros\n", cs,
                            (long long)k, (long long)i);
                    ok = 0;
                    break;
                }
            }
        for (int64_t q = 0; q < N * H; q++) {
            float v = ((float *)c->dh)[q];
            if (t->allreduce) {
                if (k == 0) dh_sum[q] = v;
                else if (memcmp(&v, &((float *)jobs[0].shard.dh)[q], 4)) {
                    fprintf(stderr, "FAIL %s: all-reduced dhidden differs between ranks 0 and "
                                    "%lld at %lld\n", cs, (long long)k, (long long)q);
                    ok = 0;
                    break;
                }
            } else {
                dh_sum[q] += v;
            }
        }
        for (int64_t q = 0; q < c->V_loc * H; q++) dw_all[c->v0 * H + q] = ((float *)c->dw)[q];
    }
    if (ok) {
        for (int64_t q = 0; q < V * H; q++) dw_exp[q] = (dw0 ? dw0[q] : 0) + x.dw[q];
        ok &= hc_check_grad("dhidden", cs, dh_sum, SPH_F64, x.dh, x.dh, NULL, NULL, N * H,
                            TOL_CPU_F32, 0, 0, 0, 1);
        ok &= hc_check_grad("dweight", cs, dw_all, SPH_F64, dw_exp, x.dw, NULL, NULL, V * H,
                            TOL_CPU_F32, 0, 0, 0, 1);
    }
    for (int64_t k = 0; k < t->ranks; k++) {
        hcase *c = &jobs[k].shard;
        free(c->lp), free(c->ent), free(c->lse), free(c->lm), free(c->stats), free(c->dh),
            free(c->dw);
    }
    free(dh_sum), free(dw_all), free(dw_exp), free(ind), free(dw0);
    hc_expect_free(&x);
    hc_free(&f);
    return ok;
}

/* The TP configurations every kernel set runs: several vocabulary tiles per rank (the CPU
 * tiles are 256 wide) with a partial last tile (V = 1601: 800/801, 533/534, 400 per rank),
 * several row chunks, one-pass (one combine per chunk) and two-pass, every dtype, sample
 * support, the all-reduced and the partial dhidden, accumulated dweight. */
static const tpcfg TP_CFGS[] = {
    /* ranks N   H   V     K  chunk dtype     1p mask ar acc  T    cap */
    {2, 41, 24, 1601, 0, 7, {2, 32, 1}, 0, 1, 1, 0, 0.8, 0.0},
    {3, 37, 20, 1601, 0, 5, {4, 16, 1}, 1, 1, 1, 1, 1.0, 5.0},
    {4, 29, 17, 1601, 0, 0, {2, 16, 1}, 0, 0, 0, 1, 1.3, 0.0},
    {3, 23, 16, 1601, 0, 3, {2, 32, 1}, 1, 0, 0, 0, 1.0, 0.0},
    {2, 31, 21, 1601, 9, 0, {2, 32, 1}, 1, 1, 1, 0, 0.9, 0.0},
    {2, 27, 19, 1601, 5, 0, {4, 16, 1}, 0, 1, 0, 1, 1.0, 3.0},
};
#define N_TP_CFGS ((int)(sizeof TP_CFGS / sizeof TP_CFGS[0]))

#endif
