/*
 * plan.c - host helpers on a validated plan (core/plan.h), shared by the host backends (the
 * float64 reference and the optimized CPU head): which rows are active, and how many.
 * A row is active when the mask says so, else when it lies inside a span, else always.
 */
#include <string.h>

#include "core/plan.h"

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
