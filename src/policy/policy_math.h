/*
 * policy_math.h - the per-row function of the RL policy losses (issue 14), one copy for every
 * backend: the float64 reference, the CPU backend and the CUDA kernels (host + device inline,
 * double precision; a row costs a few dozen flops, nothing next to its 6 H V of the sweep).
 *
 * Row i (active: mask 1 and target >= 0) with log-prob logp, advantage A, old log-prob o,
 * reference log-prob q, importance weight w and, for GSPO, its sequence's rho:
 *   delta = logp - o
 *   ppo / cispo: log r = clamp(delta, -20, 20)        gspo: log r = min(rho, 10) (rho = sg)
 *   pg1 = -A r,  pg2 = -A clip(r, 1 - eps_low, 1 + eps_high)
 *   ppo / gspo:  pg = max(pg1, pg2); dual clip (c finite, A < 0): pg = min(pg, -A c)
 *   cispo:       pg = -A sg(clip(r, 1 - eps_low, 1 + eps_high)) logp
 *   KL, x = q - logp:  k1 = -x;  k2 = x^2 / 2;  k3 = clamp(e^xh - xh - 1, -10, 10), xh =
 *                      clamp(x, -20, 20)
 *   l = w pg + beta KL - eta H;   L = sum_i c_i l_i
 * The gradients dL/dlogp_i = c_i (w dpg + beta dKL) and dL/dH_i = -c_i eta are what the head's
 * one-pass dlogits take as its upstream dlogprob and dentropy.
 *
 * Ties follow PyTorch's autograd of verl's formulation exactly (docs/policy.md):
 *   - clamp passes the gradient on the closed interval [lo, hi] (torch.clamp: grad where
 *     lo <= x <= hi), so a ratio exactly at a clip bound, delta exactly at +-20 or rho exactly
 *     at 10 keep their gradient;
 *   - max(a, b) and min(a, b) of two tensors give each side half the gradient when a == b
 *     (torch.maximum / torch.minimum). For max(pg1, pg2) a tie with A != 0 means r lies inside
 *     the clip range, where both sides carry the same gradient, so the sum is the full one;
 *     the dual clip's min(pg, -A c) against a constant keeps half at an exact tie.
 *   - "where a clamp binds" is strict: the value lies outside the closed interval.
 * NaN propagates: a NaN log-prob gives a NaN value and a NaN gradient (range tests are written
 * so NaN counts as inside), so a bad row never turns into a silent zero.
 */
#ifndef SPH_POLICY_MATH_H
#define SPH_POLICY_MATH_H

#include <math.h>

#if defined(__CUDACC__)
#define SPH_PHD __host__ __device__ static inline
#else
#define SPH_PHD static inline
#endif

/* Mirrors of the public enums (spanhead.h), kept as ints so device code needs no header. */
enum { SPH_PM_PPO = 0, SPH_PM_CISPO = 1, SPH_PM_GSPO = 2 };
enum { SPH_PM_KL_NONE = 0, SPH_PM_KL_K1 = 1, SPH_PM_KL_K2 = 2, SPH_PM_KL_K3 = 3 };

/* The scalar configuration of one call (validated by policy.c). */
typedef struct sph_policy_coef {
    int loss, kl;
    double lo, hi;     /* 1 - eps_low, 1 + eps_high */
    double clip_c;     /* dual clip ratio, +inf = none */
    double beta, eta;  /* KL and entropy coefficients */
} sph_policy_coef;

/* One row's terms. */
typedef struct sph_policy_row {
    double pg, dpg;    /* policy-gradient term and d pg / d logp */
    double kl, dkl;    /* KL term and d KL / d logp (0 with kl none) */
    int clipped;       /* -A clip(r) > -A r */
    int lower;         /* the dual clip binds: max(pg1, pg2) > -A c with A < 0 */
} sph_policy_row;

/* clamp that lets NaN through (x < lo and x > hi are both false for NaN) */
SPH_PHD double sph_pm_clamp(double x, double lo, double hi) {
    return x < lo ? lo : (x > hi ? hi : x);
}
/* the clamp binds: x strictly outside [lo, hi] (never for NaN) */
SPH_PHD int sph_pm_binds(double x, double lo, double hi) { return x < lo || x > hi; }

/* max(a, b) with torch.maximum's gradient: (value, d value) from (a, da), (b, db). */
SPH_PHD void sph_pm_max(double a, double da, double b, double db, double *v, double *dv) {
    if (a > b) {
        *v = a, *dv = da;
    } else if (b > a) {
        *v = b, *dv = db;
    } else { /* tie (or NaN: a NaN a or b propagates through the value and the gradient) */
        *v = a == a ? (b == b ? a : b) : a;
        *dv = 0.5 * da + 0.5 * db;
    }
}

/* The row's terms. rho: the sequence's mean delta (GSPO only, else ignored). */
SPH_PHD void sph_policy_row_eval(const sph_policy_coef *k, double logp, double A, double o,
                                 double q, double rho, sph_policy_row *out) {
    const double delta = logp - o;
    double lr, dlr; /* log r and d log r / d logp */
    if (k->loss == SPH_PM_GSPO) {
        /* log r = logp - sg(logp) + sg(rho): value rho, gradient 1; clamped above at 10 */
        lr = rho > 10.0 ? 10.0 : rho;
        dlr = rho > 10.0 ? 0.0 : 1.0;
    } else {
        lr = sph_pm_clamp(delta, -20.0, 20.0);
        dlr = sph_pm_binds(delta, -20.0, 20.0) ? 0.0 : 1.0;
    }
    const double r = exp(lr), dr = r * dlr;
    const double cr = sph_pm_clamp(r, k->lo, k->hi);
    const double dcr = sph_pm_binds(r, k->lo, k->hi) ? 0.0 : dr;
    const double pg1 = -A * r, pg2 = -A * cr;
    out->clipped = pg2 > pg1;
    out->lower = 0;
    if (k->loss == SPH_PM_CISPO) {
        out->pg = -A * cr * logp; /* the clipped ratio is a constant (stop-gradient) */
        out->dpg = -A * cr;
    } else {
        double v, dv;
        sph_pm_max(pg1, -A * dr, pg2, -A * dcr, &v, &dv);
        if (A < 0 && k->clip_c < INFINITY) {
            const double pg3 = -A * k->clip_c; /* a constant */
            out->lower = v > pg3;
            if (v > pg3) {
                v = pg3;
                dv = 0.0;
            } else if (!(v < pg3) && v == v) {
                dv = 0.5 * dv; /* torch.minimum at a tie */
            }
        }
        out->pg = v;
        out->dpg = dv;
    }
    out->kl = out->dkl = 0.0;
    if (k->kl != SPH_PM_KL_NONE) {
        const double x = q - logp; /* dx / dlogp = -1 */
        if (k->kl == SPH_PM_KL_K1) {
            out->kl = -x;
            out->dkl = 1.0;
        } else if (k->kl == SPH_PM_KL_K2) {
            out->kl = 0.5 * x * x;
            out->dkl = -x;
        } else {
            const double xh = sph_pm_clamp(x, -20.0, 20.0), ex = exp(xh);
            const double v = ex - xh - 1.0;
            out->kl = sph_pm_clamp(v, -10.0, 10.0);
            out->dkl = sph_pm_binds(x, -20.0, 20.0) || sph_pm_binds(v, -10.0, 10.0)
                           ? 0.0
                           : -(ex - 1.0);
        }
    }
}

/* Metric accumulators (float64 sums over the active rows of a call, in row order). */
enum {
    SPH_PM_ACC_LOSS = 0,   /* sum c l */
    SPH_PM_ACC_PG,         /* sum c w pg */
    SPH_PM_ACC_KL,         /* sum c KL */
    SPH_PM_ACC_ENT,        /* sum c H */
    SPH_PM_ACC_CLIP,       /* rows clipped */
    SPH_PM_ACC_LOWER,      /* rows where the dual clip binds */
    SPH_PM_ACC_NKL,        /* sum -delta */
    SPH_PM_N_ACC
};

/* One active row: its gradients (g = dL/dlogp, e = dL/dH) and its metric contributions. */
SPH_PHD void sph_policy_row_full(const sph_policy_coef *k, double c, double w, double logp,
                                 double H, double A, double o, double q, double rho,
                                 double *g, double *e, double acc[SPH_PM_N_ACC]) {
    sph_policy_row r;
    sph_policy_row_eval(k, logp, A, o, q, rho, &r);
    *g = c * (w * r.dpg + k->beta * r.dkl);
    *e = -c * k->eta;
    if (acc) {
        acc[SPH_PM_ACC_LOSS] = c * (w * r.pg + k->beta * r.kl - k->eta * H);
        acc[SPH_PM_ACC_PG] = c * w * r.pg;
        acc[SPH_PM_ACC_KL] = c * r.kl;
        acc[SPH_PM_ACC_ENT] = c * H;
        acc[SPH_PM_ACC_CLIP] = r.clipped;
        acc[SPH_PM_ACC_LOWER] = r.lower;
        acc[SPH_PM_ACC_NKL] = -(logp - o);
    }
}

#endif
