/*
 * test_distill_case.h - shared by the distillation tests: a random case (inputs rounded to
 * the input dtype, outputs poisoned), the wiring of sph_head_args + sph_distill_args, a
 * runner, the float64 oracle on exactly the rounded inputs (sph_distill_ref_f64), and an
 * independent float64 loss written here from the formulas (probabilities, not log space), so
 * that the reference's own loss is checked too. The teacher: dense (its own hidden and
 * weight) or sparse (K ids with their true log-probs under a random teacher distribution,
 * -1 padding, optionally renormalized so the tail mass is 0).
 */
#ifndef SPH_TEST_DISTILL_CASE_H
#define SPH_TEST_DISTILL_CASE_H

#include "distill/distill.h"
#include "parity/test_head_case.h"

typedef struct dcase {
    int64_t N, H, V, V_loc, v0, HT, K;
    sph_dtype dt;
    int dense, kind, red;
    double beta, T, cap, TT;
    int64_t num_tokens;    /* reduction mean's divisor (0: the active rows) */
    void *h, *w, *th, *tw; /* (N, H), (V, H) whole vocabulary, (N, HT), (V, HT) */
    int64_t *ids;          /* (N, K) */
    float *lp;             /* (N, K) */
    uint8_t *mask;         /* (N) or NULL */
    float *dloss, *loss;   /* (N), (N) */
    float *trows;          /* (N) per-row temperatures or NULL (T) */
    float *ttrows;         /* (N) the dense teacher's per-row temperatures or NULL (TT) */
    float *dh, *dw;        /* (N, H), (V_loc, H) f32 */
    int64_t sh_h[2], sh_w[2], sh_th[2], sh_tw[2], sh_k[2], sh_n[1], sh_l[1], sh_dh[2], sh_dw[2];
    sph_tensor t_h, t_w, t_th, t_tw, t_ids, t_lp, t_mask, t_dloss, t_loss, t_dh, t_dw, t_tr;
    sph_tensor t_ttr;
    sph_head_args a;
    sph_distill_args d;
} dcase;

/* teacher flags of dc_init */
#define DC_PAD 1u       /* some ids -1 */
#define DC_TAIL0 2u     /* listed probabilities renormalized to sum 1 (+ rounding): P_r = 0 */
#define DC_ALLV 4u      /* K = V ids: the tail holds no column */
#define DC_TIES 8u      /* duplicate weight rows: tied logits */

static inline double dc_getw(const dcase *c, const void *b, int64_t k) { return hc_get(b, c->dt, k); }

static inline void dc_fill(sph_rng *r, void *b, sph_dtype dt, int64_t n, double sd) {
    for (int64_t k = 0; k < n; k++) hc_set(b, dt, k, sd * rng_normal(r));
}

static inline void dc_init(dcase *c, sph_rng *r, int64_t N, int64_t H, int64_t V, int64_t HT,
                           int64_t K, sph_dtype dt, int dense, unsigned flags) {
    memset(c, 0, sizeof *c);
    c->N = N, c->H = H, c->V = V, c->V_loc = V, c->HT = HT, c->K = dense ? 0 : K, c->dt = dt;
    c->dense = dense;
    c->kind = SPH_DISTILL_FORWARD_KL, c->red = SPH_REDUCTION_MEAN, c->beta = 0.5;
    c->T = 1, c->cap = 0, c->TT = 0;
    const size_t es = hc_esize(dt);
    c->h = hc_alloc((size_t)(N * H) * es), c->w = hc_alloc((size_t)(V * H) * es);
    dc_fill(r, c->h, dt, N * H, 1.0);
    dc_fill(r, c->w, dt, V * H, 1.5 / sqrt((double)H));
    if (flags & DC_TIES)
        for (int64_t k = 0; k < H && V >= 3; k++) hc_set(c->w, dt, 2 * H + k, dc_getw(c, c->w, k));
    if (dense) {
        c->th = hc_alloc((size_t)(N * HT) * es), c->tw = hc_alloc((size_t)(V * HT) * es);
        dc_fill(r, c->th, dt, N * HT, 1.0);
        dc_fill(r, c->tw, dt, V * HT, 2.0 / sqrt((double)HT));
    } else {
        if (flags & DC_ALLV) c->K = K = V;
        c->ids = hc_alloc((size_t)(N * K) * 8), c->lp = hc_alloc((size_t)(N * K) * 4);
        double *z = hc_alloc((size_t)V * 8);
        int64_t *perm = hc_alloc((size_t)V * 8);
        for (int64_t i = 0; i < N; i++) {
            double m = -INFINITY, s = 0, ps = 0;
            for (int64_t j = 0; j < V; j++) z[j] = 2.0 * rng_normal(r), m = z[j] > m ? z[j] : m;
            for (int64_t j = 0; j < V; j++) s += exp(z[j] - m);
            for (int64_t j = 0; j < V; j++) perm[j] = j;
            for (int64_t j = V - 1; j > 0; j--) { /* a random subset of ids */
                int64_t t = rng_range(r, 0, j), x = perm[j];
                perm[j] = perm[t], perm[t] = x;
            }
            for (int64_t k = 0; k < K; k++) {
                const int pad = (flags & DC_PAD) && !(flags & DC_ALLV) && k % 3 == 1;
                c->ids[i * K + k] = pad ? -1 : perm[k];
                const double l = z[perm[k]] - m - log(s);
                c->lp[i * K + k] = pad ? 0.5f : (float)l; /* padding's value is never read */
                if (!pad) ps += exp(l);
            }
            if (flags & (DC_TAIL0 | DC_ALLV)) /* renormalize: the listed mass is 1 (+ 2e-6 per id: above 1 after the float rounding, within SPH_DISTILL_MASS_TOL) */
                for (int64_t k = 0; k < K; k++)
                    if (c->ids[i * K + k] >= 0)
                        c->lp[i * K + k] = (float)(c->lp[i * K + k] - log(ps) + 2e-6);
        }
        free(z), free(perm);
    }
    c->dloss = hc_alloc((size_t)N * 4), c->loss = hc_alloc((size_t)N * 4);
    for (int64_t i = 0; i < N; i++) c->dloss[i] = (float)(0.5 + rng_uniform(r));
    c->dh = hc_alloc((size_t)(N * H) * 4), c->dw = hc_alloc((size_t)(V * H) * 4);
}

static inline void dc_mask(dcase *c, sph_rng *r, double frac) {
    c->mask = hc_alloc((size_t)c->N);
    for (int64_t i = 0; i < c->N; i++) c->mask[i] = rng_uniform(r) < frac;
    if (c->N > 0) c->mask[0] = 1;
}

/* Per-row temperatures in [lo, hi] (the scalar T then unused: the head wants 1). */
static inline void dc_trows(dcase *c, sph_rng *r, double lo, double hi) {
    c->trows = hc_alloc((size_t)c->N * 4);
    for (int64_t i = 0; i < c->N; i++) c->trows[i] = (float)(lo + (hi - lo) * rng_uniform(r));
}

static inline double dc_T(const dcase *c, int64_t i) { return c->trows ? (double)c->trows[i] : c->T; }

/* The dense teacher's per-row temperatures in [lo, hi] (teacher_temperature_rows; TT then 0). */
static inline void dc_ttrows(dcase *c, sph_rng *r, double lo, double hi) {
    c->ttrows = hc_alloc((size_t)c->N * 4), c->TT = 0;
    for (int64_t i = 0; i < c->N; i++) c->ttrows[i] = (float)(lo + (hi - lo) * rng_uniform(r));
}

/* Row i's teacher temperature: its row's, the scalar, or the student's. */
static inline double dc_TT(const dcase *c, int64_t i) {
    return c->ttrows ? (double)c->ttrows[i] : c->TT > 0 ? c->TT : dc_T(c, i);
}

static inline void dc_free(dcase *c) {
    free(c->trows), free(c->ttrows), free(c->h), free(c->w), free(c->th), free(c->tw), free(c->ids), free(c->lp), free(c->mask);
    free(c->dloss), free(c->loss), free(c->dh), free(c->dw);
}

#define DC_DH 1u
#define DC_DW 2u
#define DC_DLOSS 4u

/* The arguments of the shard [v0, v0 + V_loc) (set c->v0 / V_loc first; default: all). */
static inline void dc_wire(dcase *c, unsigned what) {
    const sph_device cpu = {SPH_DEVICE_CPU, 0};
    const size_t es = hc_esize(c->dt);
    c->sh_h[0] = c->N, c->sh_h[1] = c->H;
    c->sh_w[0] = c->V_loc, c->sh_w[1] = c->H;
    c->t_h = (sph_tensor){.data = c->h, .device = cpu, .ndim = 2, .dtype = c->dt, .shape = c->sh_h};
    c->t_w = (sph_tensor){.data = (char *)c->w + (size_t)(c->v0 * c->H) * es, .device = cpu,
                          .ndim = 2, .dtype = c->dt, .shape = c->sh_w};
    c->a = (sph_head_args)SPH_HEAD_ARGS_INIT;
    c->a.hidden = &c->t_h, c->a.weight = &c->t_w;
    c->a.vocab_start = c->v0, c->a.vocab_total = c->V;
    c->a.temperature = c->trows ? 1.0 : c->T, c->a.softcap = c->cap;
    if (c->trows) {
        c->sh_n[0] = c->N;
        c->t_tr = (sph_tensor){.data = c->trows, .device = cpu, .ndim = 1, .dtype = SPH_F32,
                               .shape = c->sh_n};
        c->a.temperature_rows = &c->t_tr;
    }
    if (c->mask) {
        c->sh_n[0] = c->N;
        c->t_mask = (sph_tensor){.data = c->mask, .device = cpu, .ndim = 1, .dtype = SPH_U8,
                                 .shape = c->sh_n};
        c->a.active_mask = &c->t_mask;
    }
    c->sh_dh[0] = c->N, c->sh_dh[1] = c->H, c->sh_dw[0] = c->V_loc, c->sh_dw[1] = c->H;
    c->t_dh = (sph_tensor){.data = c->dh, .device = cpu, .ndim = 2, .dtype = SPH_F32, .shape = c->sh_dh};
    c->t_dw = (sph_tensor){.data = c->dw, .device = cpu, .ndim = 2, .dtype = SPH_F32, .shape = c->sh_dw};
    if (what & DC_DH) c->a.dhidden = &c->t_dh;
    if (what & DC_DW) c->a.dweight = &c->t_dw;
    c->d = (sph_distill_args)SPH_DISTILL_ARGS_INIT;
    c->d.kind = (sph_distill_kind)c->kind, c->d.beta = c->beta, c->d.reduction = (sph_reduction)c->red;
    c->d.teacher_temperature = c->TT;
    if (c->ttrows) {
        c->sh_n[0] = c->N;
        c->t_ttr = (sph_tensor){.data = c->ttrows, .device = cpu, .ndim = 1, .dtype = SPH_F32,
                                .shape = c->sh_n};
        c->d.teacher_temperature_rows = &c->t_ttr;
    }
    c->d.num_tokens = c->num_tokens;
    if (c->dense) {
        c->sh_th[0] = c->N, c->sh_th[1] = c->HT, c->sh_tw[0] = c->V_loc, c->sh_tw[1] = c->HT;
        c->t_th = (sph_tensor){.data = c->th, .device = cpu, .ndim = 2, .dtype = c->dt, .shape = c->sh_th};
        c->t_tw = (sph_tensor){.data = (char *)c->tw + (size_t)(c->v0 * c->HT) * es,
                               .device = cpu, .ndim = 2, .dtype = c->dt, .shape = c->sh_tw};
        c->d.teacher_hidden = &c->t_th, c->d.teacher_weight = &c->t_tw;
    } else {
        c->sh_k[0] = c->N, c->sh_k[1] = c->K;
        c->t_ids = (sph_tensor){.data = c->ids, .device = cpu, .ndim = 2, .dtype = SPH_I64, .shape = c->sh_k};
        c->t_lp = (sph_tensor){.data = c->lp, .device = cpu, .ndim = 2, .dtype = SPH_F32, .shape = c->sh_k};
        c->d.teacher_topk_ids = &c->t_ids, c->d.teacher_topk_logprobs = &c->t_lp;
    }
    c->sh_l[0] = c->red == SPH_REDUCTION_NONE ? c->N : 1;
    c->t_loss = (sph_tensor){.data = c->loss, .device = cpu, .ndim = 1, .dtype = SPH_F32, .shape = c->sh_l};
    c->d.loss = &c->t_loss;
    if ((what & DC_DLOSS) && c->red == SPH_REDUCTION_NONE) {
        c->t_dloss = (sph_tensor){.data = c->dloss, .device = cpu, .ndim = 1, .dtype = SPH_F32,
                                  .shape = c->sh_n};
        c->sh_n[0] = c->N;
        c->d.dloss = &c->t_dloss;
    }
}

static inline void dc_poison(dcase *c) {
    poison_f32(c->loss, (size_t)c->N);
    poison_f32(c->dh, (size_t)(c->N * c->H));
    poison_f32(c->dw, (size_t)(c->V_loc * c->H));
}

static inline sph_status dc_run(sph_ctx_t ctx, dcase *c) {
    size_t bytes = 0;
    sph_status s = sph_distill_loss_workspace_size(ctx, &c->a, &c->d, &bytes);
    if (s != SPH_OK) return s;
    void *ws = hc_alloc(bytes + 1);
    s = sph_distill_loss(ctx, &c->a, &c->d, ws, bytes);
    free(ws);
    return s;
}

/* The oracle on the rounded inputs, whole vocabulary: per-row losses (N), the reduced loss,
 * dh (N, H), dw (V, H) of the call's reduction. */
typedef struct dexp {
    double *rows, red, *dh, *dw;
    int64_t n_act;
} dexp;

static inline double *dc_f64(const dcase *c, const void *b, int64_t n) {
    double *o = hc_alloc((size_t)n * 8);
    for (int64_t k = 0; k < n; k++) o[k] = dc_getw(c, b, k);
    return o;
}

static inline void dc_expect(const dcase *c, dexp *x) {
    sph_distill_f64 in = {.N = c->N, .H = c->H, .V = c->V, .HT = c->HT, .K = c->K,
                          .kind = sph_distill_kind_of(c->kind, c->beta), .beta = c->beta,
                          .T = c->T, .cap = c->cap, .T_T = c->TT};
    double *trows = NULL;
    if (c->trows) {
        trows = hc_alloc((size_t)c->N * 8);
        for (int64_t i = 0; i < c->N; i++) trows[i] = c->trows[i];
    }
    in.T_rows = trows;
    double *ttrows = NULL;
    if (c->ttrows) {
        ttrows = hc_alloc((size_t)c->N * 8);
        for (int64_t i = 0; i < c->N; i++) ttrows[i] = c->ttrows[i];
    }
    in.T_T_rows = ttrows;
    if (c->kind != SPH_DISTILL_JSD) in.beta = 0;
    double *h = dc_f64(c, c->h, c->N * c->H), *w = dc_f64(c, c->w, c->V * c->H);
    double *th = c->dense ? dc_f64(c, c->th, c->N * c->HT) : NULL;
    double *tw = c->dense ? dc_f64(c, c->tw, c->V * c->HT) : NULL;
    double *lp = NULL, *scale = hc_alloc((size_t)c->N * 8);
    if (!c->dense) {
        lp = hc_alloc((size_t)(c->N * c->K) * 8);
        for (int64_t k = 0; k < c->N * c->K; k++) lp[k] = c->lp[k];
    }
    x->n_act = 0;
    for (int64_t i = 0; i < c->N; i++) x->n_act += !c->mask || c->mask[i];
    const int64_t div = c->num_tokens > 0 ? c->num_tokens : x->n_act; /* mean's divisor */
    for (int64_t i = 0; i < c->N; i++)
        scale[i] = c->red == SPH_REDUCTION_MEAN ? (div ? 1.0 / (double)div : 0)
                   : c->red == SPH_REDUCTION_SUM ? 1.0
                   : c->d.dloss                  ? (double)c->dloss[i]
                                                 : 1.0;
    in.h = h, in.w = w, in.th = th, in.tw = tw, in.lp = lp, in.ids = c->ids, in.act = c->mask;
    in.scale = scale;
    x->rows = hc_alloc((size_t)c->N * 8);
    x->dh = hc_alloc((size_t)(c->N * c->H) * 8), x->dw = hc_alloc((size_t)(c->V * c->H) * 8);
    expect_ok(sph_distill_ref_f64(&in, x->rows, x->dh, x->dw));
    x->red = 0;
    for (int64_t i = 0; i < c->N; i++) x->red += x->rows[i];
    if (c->red == SPH_REDUCTION_MEAN) x->red = div ? x->red / (double)div : 0;
    free(h), free(w), free(th), free(tw), free(lp), free(scale), free(trows);
    free(ttrows);
}

static inline void dc_expect_free(dexp *x) { free(x->rows), free(x->dh), free(x->dw); }

/* The independent loss of row i from the formulas, in probabilities (not log space; fine for
 * the moderate logits of the random cases). */
static inline double dc_indep_row(const dcase *c, int64_t i) {
    const int64_t V = c->V;
    double *q = hc_alloc((size_t)V * 8), *p = hc_alloc((size_t)V * 8), s = 0, t = 0;
    for (int64_t j = 0; j < V; j++) {
        double u = 0;
        for (int64_t k = 0; k < c->H; k++) u += dc_getw(c, c->h, i * c->H + k) * dc_getw(c, c->w, j * c->H + k);
        if (c->cap > 0) u = c->cap * tanh(u / c->cap);
        q[j] = exp(u / dc_T(c, i)), s += q[j];
        if (c->dense) {
            double y = 0;
            for (int64_t k = 0; k < c->HT; k++)
                y += dc_getw(c, c->th, i * c->HT + k) * dc_getw(c, c->tw, j * c->HT + k);
            p[j] = exp(y / dc_TT(c, i)), t += p[j];
        }
    }
    for (int64_t j = 0; j < V; j++) q[j] /= s, p[j] = c->dense ? p[j] / t : 0;
    /* bins: the columns (dense) or the listed ids + the tail (sparse) */
    int64_t nb = 0;
    double *Q = hc_alloc((size_t)(V + 1) * 8), *P = hc_alloc((size_t)(V + 1) * 8);
    if (c->dense) {
        for (int64_t j = 0; j < V; j++) Q[nb] = q[j], P[nb++] = p[j];
    } else {
        double qs = 0, ps = 0;
        int64_t nv = 0;
        for (int64_t k = 0; k < c->K; k++) {
            const int64_t id = c->ids[i * c->K + k];
            if (id < 0) continue;
            Q[nb] = q[id], P[nb++] = exp((double)c->lp[i * c->K + k]);
            qs += q[id], ps += exp((double)c->lp[i * c->K + k]), nv++;
        }
        const double pr = ps < 1 ? 1 - ps : 0;
        const int rev = c->kind == SPH_DISTILL_REVERSE_KL || (c->kind == SPH_DISTILL_JSD && c->beta == 1);
        if (nv < V && !(rev && pr == 0)) Q[nb] = 1 - qs, P[nb++] = pr;
    }
    double L = 0, b = c->beta;
    for (int64_t k = 0; k < nb; k++) {
        const double Pk = P[k], Qk = Q[k];
        if (c->kind == SPH_DISTILL_FORWARD_KL || (c->kind == SPH_DISTILL_JSD && b == 0)) {
            if (Pk > 0) L += Pk * log(Pk / Qk);
        } else if (c->kind == SPH_DISTILL_REVERSE_KL || b == 1) {
            if (Qk > 0) L += Qk * log(Qk / Pk);
        } else {
            const double M = b * Pk + (1 - b) * Qk;
            if (Pk > 0) L += b * Pk * log(Pk / M);
            if (Qk > 0) L += (1 - b) * Qk * log(Qk / M);
        }
    }
    free(q), free(p), free(Q), free(P);
    return L;
}

static inline const char *dc_kind_name(int k) {
    return k == SPH_DISTILL_FORWARD_KL ? "forward_kl" : k == SPH_DISTILL_REVERSE_KL ? "reverse_kl" : "jsd";
}

static inline void dc_case_str(const dcase *c, const char *extra, char *cs, size_t n) {
    snprintf(cs, n, "distill(N=%lld,H=%lld,V=%lld,HT=%lld,K=%lld,%s,%s,beta=%g,red=%d,T=%g,"
             "cap=%g,TT=%g,mask=%d,trows=%d,ttrows=%d,%s)", (long long)c->N, (long long)c->H,
             (long long)c->V, (long long)c->HT, (long long)c->K, sph_dtype_name(c->dt),
             dc_kind_name(c->kind), c->beta, c->red, c->T, c->cap, c->TT, c->mask != NULL,
             c->trows != NULL, c->ttrows != NULL, extra ? extra : "");
}

#endif
