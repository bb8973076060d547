/*
 * topk_check.h - the float64 full-sort oracle of the head's top-k outputs (issue 25 item 2)
 * shared by tests/parity/test_head_topk.c and tests/gpu/test_head_cuda_contract.c: every
 * logit of the row from the case's inputs, sorted with the id as the tie-break, log-probs
 * z - lse. The check: log-probs position by position against the oracle's sorted ones (robust
 * to the order of near-ties) and each returned log-prob against the oracle's log-prob of the
 * returned id, both within lp_tol (1 + |lp|); ids in range and distinct in the row, and equal to
 * the oracle's wherever the oracle's gap to both neighbours exceeds gap_tol (below 1e-6: exact
 * ties too must come out lower id first); inactive rows exactly (-1, 0). check_topk_rows takes
 * per-row temperatures (trows, or NULL: T). check_sum_p2_rows: sum_p2 against the same
 * oracle's sum_j e^(2 (z_j - lse)) (also tests/gpu/test_policy_cuda.c).
 */
#ifndef SPH_TESTS_TOPK_CHECK_H
#define SPH_TESTS_TOPK_CHECK_H

typedef struct zid {
    double z;
    int64_t id;
} zid;

static inline int cmp_zid(const void *a, const void *b) {
    const zid *x = a, *y = b;
    if (x->z != y->z) return x->z > y->z ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Row i of the full case f: every z sorted (best first) into s[V], lse into *lse. */
static inline void oracle_row(const hcase *f, int64_t i, double T, double cap, zid *s,
                              double *lse) {
    double m = -INFINITY, S = 0;
    for (int64_t j = 0; j < f->V_loc; j++) {
        const double u = hc_u(f, i, j);
        s[j].z = (cap > 0 ? cap * tanh(u / cap) : u) / T;
        s[j].id = f->v0 + j;
        if (s[j].z > m) m = s[j].z;
    }
    for (int64_t j = 0; j < f->V_loc; j++) S += exp(s[j].z - m);
    *lse = m + log(S);
    qsort(s, (size_t)f->V_loc, sizeof *s, cmp_zid);
}

/* ids / lp (N, K, compact) against the oracle on the full case f (V_loc = V). */
static inline int check_topk_rows(const char *cs, const int64_t *ids, const float *lp,
                                  int64_t K, const hcase *f, const uint8_t *act, double T,
                                  const float *trows, double cap, double lp_tol,
                                  double gap_tol) {
    const int64_t V = f->V_loc;
    zid *s = hc_alloc((size_t)V * sizeof *s);
    double *lp_of = hc_alloc((size_t)V * sizeof *lp_of); /* by id */
    int ok = 1;
    for (int64_t i = 0; i < f->N && ok; i++) {
        const int64_t *gi = ids + i * K;
        const float *gl = lp + i * K;
        if (!act[i]) {
            for (int64_t k = 0; k < K; k++)
                if (gi[k] != -1 || gl[k] != 0.0f) {
                    fprintf(stderr, "FAIL topk %s: inactive row %lld [%lld] = (%lld, %g), "
                                    "expected (-1, 0); seed %llu\n",
                            cs, (long long)i, (long long)k, (long long)gi[k], gl[k],
                            (unsigned long long)test_seed());
                    ok = 0;
                    break;
                }
            continue;
        }
        double lse;
        oracle_row(f, i, trows ? (double)trows[i] : T, cap, s, &lse);
        for (int64_t j = 0; j < V; j++) lp_of[s[j].id] = s[j].z - lse;
        for (int64_t k = 0; k < K && ok; k++) {
            const double want = s[k].z - lse, tol = lp_tol * (1 + fabs(want));
            const int64_t id = gi[k];
            const char *why = NULL;
            if (!(fabs((double)gl[k] - want) <= tol)) why = "log-prob at this rank";
            else if (id < 0 || id >= V) why = "id out of range";
            else if (!(fabs((double)gl[k] - lp_of[id]) <= tol)) why = "log-prob of the id";
            for (int64_t q = 0; q < k && !why; q++)
                if (gi[q] == id) why = "id repeated";
            const int sep = (k == 0 || s[k - 1].z - s[k].z > gap_tol) &&
                            (k + 1 >= V || s[k].z - s[k + 1].z > gap_tol);
            /* exact ties in the oracle (gap 0) are checked at the reference's gap_tol */
            const int tie = (k > 0 && s[k - 1].z == s[k].z) || (k + 1 < V && s[k].z == s[k + 1].z);
            if (!why && (sep || (tie && gap_tol < 1e-6)) && id != s[k].id) why = "id";
            if (why) {
                fprintf(stderr, "FAIL topk %s: row %lld rank %lld: %s: got (%lld, %.9g), oracle "
                                "(%lld, %.9g); seed %llu\n",
                        cs, (long long)i, (long long)k, why, (long long)id, gl[k],
                        (long long)s[k].id, want, (unsigned long long)test_seed());
                ok = 0;
            }
        }
    }
    free(s), free(lp_of);
    return ok;
}

/* The same with one temperature T for every row. */
static inline int check_topk(const char *cs, const int64_t *ids, const float *lp, int64_t K,
                             const hcase *f, const uint8_t *act, double T, double cap,
                             double lp_tol, double gap_tol) {
    return check_topk_rows(cs, ids, lp, K, f, act, T, NULL, cap, lp_tol, gap_tol);
}

/* sum_p2 against the float64 oracle of the full case f (V_loc = V): sum_j e^(2 (z_j - lse))
 * of every active row within tol relative (NaN fails), exactly 0 on the other rows. */
static inline int check_sum_p2_rows(const char *cs, const float *got, const hcase *f,
                                    const uint8_t *act, double T, const float *trows, double cap,
                                    double tol) {
    zid *s = hc_alloc((size_t)f->V_loc * sizeof *s);
    int ok = 1;
    for (int64_t i = 0; i < f->N && ok; i++) {
        double want = 0;
        if (act[i]) {
            double lse;
            oracle_row(f, i, trows ? (double)trows[i] : T, cap, s, &lse);
            for (int64_t j = 0; j < f->V_loc; j++) want += exp(2 * (s[j].z - lse));
        }
        const int good = act[i] ? fabs((double)got[i] - want) <= tol * want
                                : got[i] == 0.0f && !signbit(got[i]);
        if (!good) {
            fprintf(stderr, "FAIL sum_p2 %s: row %lld (active %d): got %.9g, oracle %.9g; seed "
                            "%llu\n",
                    cs, (long long)i, act[i], got[i], want, (unsigned long long)test_seed());
            ok = 0;
        }
    }
    free(s);
    return ok;
}

#endif /* SPH_TESTS_TOPK_CHECK_H */
