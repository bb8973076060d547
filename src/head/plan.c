/*
 * plan.c - host helpers on a validated plan (head/plan.h), shared by the host backends (the
 * float64 reference and the optimized CPU head): which rows are active, and how many.
 * A row is active when the mask says so, else when it lies inside a span, else always.
 */
#include <math.h>
#include <string.h>

#include "core/ctx.h"
#include "head/plan.h"

void sph_head_active_rows(const sph_head_plan *p, uint8_t *active) {
    if (p->mask) {
        for (int64_t i = 0; i < p->N; i++) active[i] = p->mask[i] != 0;
    } else if (p->spans) {
        memset(active, 0, (size_t)p->N);
        for (int64_t k = 0; k < p->n_spans; k++)
            memset(active + p->spans[2 * k], 1, (size_t)(p->spans[2 * k + 1] - p->spans[2 * k]));
    } else {
        memset(active, 1, (size_t)p->N);
    }
}

int64_t sph_head_count_active(const sph_head_plan *p) {
    if (p->mask) {
        int64_t n = 0;
        for (int64_t i = 0; i < p->N; i++) n += p->mask[i] != 0;
        return n;
    }
    if (p->spans) {
        int64_t n = 0;
        for (int64_t k = 0; k < p->n_spans; k++) n += p->spans[2 * k + 1] - p->spans[2 * k];
        return n;
    }
    return p->N;
}

// ---- non-finite policy (spanhead.h, "Policies") ------------------------------------------

static int finite_or_absent(const float *x, int64_t i) { return !x || isfinite(x[i]); }

int64_t sph_head_scan_backward_inputs(const sph_head_plan *p, int64_t *first) {
    int64_t n = 0, k = 0;
    *first = -1;
    for (int64_t i = 0; i < p->N; i++) {
        if (p->mask) {
            if (!p->mask[i]) continue;
        } else if (p->spans) { /* ordered and disjoint: walk them along i */
            while (k < p->n_spans && p->spans[2 * k + 1] <= i) k++;
            if (k >= p->n_spans || i < p->spans[2 * k]) continue;
        }
        const int ok = isfinite(p->stats[i * 3 + 1]) && isfinite(p->stats[i * 3 + 2]) &&
                       finite_or_absent(p->dlogprob, i) && finite_or_absent(p->dentropy, i) &&
                       finite_or_absent(p->dlse, i) &&
                       (p->K || finite_or_absent(p->dlogit_mean, i));
        if (!ok) {
            if (!n) *first = i;
            n++;
        }
    }
    return n;
}

int sph_row_has_nonfinite(const void *row, sph_dtype dt, int64_t cols) {
    if (dt.bits == 32) {
        const float *x = (const float *)row;
        for (int64_t k = 0; k < cols; k++)
            if (!isfinite(x[k])) return 1;
        return 0;
    }
    const uint16_t *b = (const uint16_t *)row, e = dt.code == SPH_DTYPE_BFLOAT ? 0x7F80 : 0x7C00;
    for (int64_t k = 0; k < cols; k++)
        if ((b[k] & e) == e) return 1; /* all exponent bits: inf or NaN */
    return 0;
}

int64_t sph_head_nonfinite_hidden(const sph_head_plan *p, int64_t *first) {
    const size_t es = (size_t)p->dtype.bits / 8;
    int64_t bad = 0;
    *first = -1;
    const int64_t ns = p->mask || !p->spans ? 1 : p->n_spans;
    for (int64_t k = 0; k < ns; k++) {
        const int64_t a = p->mask || !p->spans ? 0 : p->spans[2 * k];
        const int64_t b = p->mask || !p->spans ? p->N : p->spans[2 * k + 1];
        for (int64_t i = a; i < b; i++) {
            if (p->mask && !p->mask[i]) continue;
            const char *h = (const char *)p->hidden + (size_t)i * (size_t)p->ld_h * es;
            if (!sph_row_has_nonfinite(h, p->dtype, p->H)) continue;
            if (*first < 0) *first = i;
            bad++;
        }
    }
    return bad;
}

sph_status sph_head_refuse_nonfinite_hidden(sph_ctx_t ctx, const sph_head_plan *p,
                                            const char *who) {
    if (!ctx->dev->host_memory || p->N == 0 || !(p->dhidden || p->dweight)) return SPH_OK;
    int64_t first;
    const int64_t bad = sph_head_nonfinite_hidden(p, &first);
    if (!bad) return SPH_OK;
    sph_ctx_note_nonfinite(ctx, bad, first);
    return sph_err(SPH_ERR_NONFINITE,
                   "%s: %lld active rows with non-finite inputs (NaN or inf in hidden), the "
                   "first row %lld; nothing written", who, (long long)bad, (long long)first);
}

sph_status sph_head_nonfinite_error(sph_ctx_t ctx, sph_head_pass pass, int64_t count,
                                    int64_t first, const char *partial) {
    sph_ctx_note_nonfinite(ctx, count, first);
    if (pass == SPH_HEAD_BACKWARD)
        return sph_err(SPH_ERR_NONFINITE,
                       "head backward: %lld active rows have a non-finite stats (lse, mu) or "
                       "upstream gradient, the first row %lld (stats of a forward that failed? "
                       "NaN in dlogprob/dentropy/dlse/dlogit_mean?); nothing written",
                       (long long)count, (long long)first);
    return sph_err(SPH_ERR_NONFINITE,
                   "head forward: %lld active rows have non-finite statistics (row max, lse or "
                   "mean logit), the first row %lld: NaN or infinity in hidden or weight, or "
                   "logits beyond float; %s",
                   (long long)count, (long long)first,
                   partial ? partial : "no output written");
}
