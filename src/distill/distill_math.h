/*
 * distill_math.h - the per-bin math of the distillation losses (docs/distill.md), in
 * float64, shared by the reference and the CPU backend (CUDA has its twin in
 * src/cuda/distill.cu).
 *
 * A bin b has the student's log-mass lq = log Q_b and the teacher's lp = log P_b (-inf: P_b
 * = 0). sph_dm_term gives its loss term l_b and a_b = Q_b g_b, g_b = dL/dQ_b exactly (a
 * constant added to every g_b would cancel in dz only when the bins cover every column; a
 * sparse row whose tail bin is dropped has columns in no bin). With S = sum_b a_b over the row's bins,
 * a column j of bin b with log-prob lq_j has
 *     dL/dz_j = q_j (g_b - S) = e^(lq_j - lq_b) a_b - q_j S
 * (a one-column bin: a_b - q_j S). 0 log 0 = 0: a bin of P_b = 0 contributes its Q side only.
 *   forward KL  l = P (lp - lq),                       a = -P
 *   reverse KL  l = Q (lq - lp),                       a = Q (lq - lp + 1)
 *   jsd         lm = log(beta P + (1 - beta) Q) (log space),
 *               l = beta P (lp - lm) + (1 - beta) Q (lq - lm),   a = (1 - beta) Q (lq - lm)
 */
#ifndef SPH_DISTILL_MATH_H
#define SPH_DISTILL_MATH_H

#include <math.h>

static inline double sph_dm_logaddexp(double a, double b) {
    if (a == -INFINITY) return b;
    if (b == -INFINITY) return a;
    double m = a > b ? a : b;
    return m + log1p(exp(-fabs(a - b)));
}

static inline void sph_dm_term(int kind, double beta, double lq, double lp, double *l,
                               double *a) {
    const double q = exp(lq), p = lp == -INFINITY ? 0.0 : exp(lp);
    if (kind == 0) { /* forward KL */
        *l = p > 0 ? p * (lp - lq) : 0.0;
        *a = -p;
    } else if (kind == 1) { /* reverse KL */
        *l = q > 0 ? q * (lq - lp) : 0.0;
        *a = q > 0 ? q * (lq - lp + 1) : 0.0;
    } else {
        const double lm = sph_dm_logaddexp(log(beta) + lp, log1p(-beta) + lq);
        const double tq = q > 0 ? (1 - beta) * q * (lq - lm) : 0.0;
        *l = (p > 0 ? beta * p * (lp - lm) : 0.0) + tq;
        *a = tq;
    }
}

#endif
