/*
 * combine.c - the exact combine of per-row softmax partials (head/plan.h's record), across
 * vocab tiles inside a backend and across the ranks of a tensor-parallel group.
 *
 * A record over a set J of columns is (m, s, d, zt, sz):
 *   m = max_J z,  s = sum_J e^(z - m),  d = sum_J e^(z - m) (z - m),  zt = z_target or 0,
 *   sz = sum_J z.
 * d is kept shifted by the record's own max (not b = sum e^(z - m) z): the row's outputs are
 * then entropy = log S - D/S and mu = M + D/S, with no cancellation of two numbers of the
 * logits' magnitude (lse - mu), however large |z| is (a low temperature, a large offset).
 * Two records over disjoint sets merge into the record of the union:
 *   M = max(m, m'),  s e^(m - M) + s' e^(m' - M),
 *   D = (d + (m - M) s) e^(m - M) + (d' + (m' - M) s') e^(m' - M);  zt and sz add.
 * A record over an empty set has m = -inf, s = b = 0; the merge keeps it neutral (the
 * e^(-inf - M) factor is 0, and -inf - (-inf) never happens because M = -inf only when both
 * are empty, handled first). Ranks are merged in rank order so every rank computes the same
 * bits (deterministic, independent of timing).
 */
#include <math.h>
#include <string.h>

#include "comm/comm.h"
#include "head/host.h"

void sph_head_partial_merge(double acc[SPH_PARTIAL_FIELDS],
                            const double add[SPH_PARTIAL_FIELDS]) {
    if (add[0] == -INFINITY && add[1] == 0) { /* empty set: only the sums can carry */
        acc[3] += add[3];
        acc[4] += add[4];
        return;
    }
    if (acc[0] == -INFINITY && acc[1] == 0) {
        double zt = acc[3] + add[3], sz = acc[4] + add[4];
        acc[0] = add[0];
        acc[1] = add[1];
        acc[2] = add[2];
        acc[3] = zt;
        acc[4] = sz;
        return;
    }
    /* NaN in either max must reach the sums (a non-finite row stays non-finite). */
    double M = acc[0] >= add[0] ? acc[0] : add[0];
    if (isnan(acc[0]) || isnan(add[0])) M = NAN;
    double fa = exp(acc[0] - M), fb = exp(add[0] - M);
    if (isinf(M) && M > 0) { /* an +inf logit: the row is not finite; keep it visible */
        fa = fb = NAN;
    }
    /* a factor that underflows to 0 drops its whole term: (m - M) s may be huge (|m - M| up to
     * the logits' range), and huge * 0 would be fine but inf * 0 would not */
    double da = fa == 0 ? 0 : (acc[2] + (acc[0] - M) * acc[1]) * fa;
    double db = fb == 0 ? 0 : (add[2] + (add[0] - M) * add[1]) * fb;
    acc[1] = acc[1] * fa + add[1] * fb;
    acc[2] = da + db;
    acc[0] = M;
    acc[3] += add[3];
    acc[4] += add[4];
}

void sph_topk_clear(sph_topk_ent *l, int64_t K) {
    for (int64_t k = 0; k < K; k++) l[k].z = -INFINITY, l[k].id = -1;
}

void sph_topk_insert(sph_topk_ent *l, int64_t K, double z, int64_t id) {
    if (isnan(z) || !sph_topk_better(z, id, l[K - 1].z, l[K - 1].id)) return;
    int64_t lo = 0, hi = K - 1; /* the first entry that (z, id) beats */
    while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (sph_topk_better(z, id, l[mid].z, l[mid].id)) hi = mid;
        else lo = mid + 1;
    }
    memmove(l + lo + 1, l + lo, (size_t)(K - 1 - lo) * sizeof *l);
    l[lo].z = z, l[lo].id = id;
}

void sph_topk_merge2(const sph_topk_ent *a, const sph_topk_ent *b, sph_topk_ent *out,
                     int64_t K) {
    int64_t i = 0, j = 0;
    for (int64_t k = 0; k < K; k++) {
        /* a and b never hold the same id (disjoint columns): no duplicates */
        if (sph_topk_better(b[j].z, b[j].id, a[i].z, a[i].id)) out[k] = b[j++];
        else out[k] = a[i++];
    }
}

sph_status sph_head_combine_topk(sph_comm_t comm, sph_topk_ent *list, sph_topk_ent *gathered,
                                 sph_topk_ent *scratch, int64_t n, int64_t K) {
    if (!comm || comm->size <= 1 || n == 0) return SPH_OK;
    SPH_CHECK(gathered != NULL && scratch != NULL, SPH_ERR_INTERNAL, "combine: no topk buffer");
    size_t bytes;
    SPH_CHECK(sph_mul_size((size_t)n * (size_t)K, sizeof *list, &bytes), SPH_ERR_OVERFLOW,
              "combine: topk lists of %lld rows overflow size_t", (long long)n);
    sph_status s = comm->ops->allgather(comm, list, gathered, bytes, NULL);
    if (s != SPH_OK)
        return sph_err_prefix(s, "head: TP combine of topk (allgather of %zu bytes): ", bytes);
    for (int64_t i = 0; i < n; i++) {
        const sph_topk_ent *cur = gathered + (size_t)i * (size_t)K;
        for (int64_t r = 1; r < comm->size; r++) { /* rank order (a total order anyway) */
            sph_topk_ent *o = scratch + (r & 1) * K;
            sph_topk_merge2(cur, gathered + ((size_t)r * (size_t)n + (size_t)i) * (size_t)K, o,
                            K);
            cur = o;
        }
        memcpy(list + (size_t)i * (size_t)K, cur, (size_t)K * sizeof *list);
    }
    return SPH_OK;
}

void sph_head_topk_store(const sph_head_plan *p, int64_t i, const sph_topk_ent *l, double M,
                         double ls) {
    int64_t *ids = p->topk_ids + i * p->ld_ti;
    float *lp = p->topk_lp + i * p->ld_tl;
    for (int64_t k = 0; k < p->topk; k++) {
        ids[k] = l ? l[k].id : -1;
        lp[k] = l ? (float)((l[k].z - M) - ls) : 0.0f;
    }
}

sph_status sph_head_combine_sq_f64(sph_comm_t comm, const double *mq, double *gathered,
                                   const double *rec, double *Q, int64_t N) {
    const size_t R = (size_t)SPH_PARTIAL_FIELDS;
    const int64_t ranks = comm && comm->size > 1 ? comm->size : 1;
    const double *all = mq;
    if (ranks > 1) {
        SPH_CHECK(gathered != NULL, SPH_ERR_INTERNAL, "combine: no gather buffer");
        const size_t bytes = (size_t)N * 2 * sizeof(double);
        if (N > 0) {
            sph_status s = comm->ops->allgather(comm, mq, gathered, bytes, NULL);
            if (s != SPH_OK)
                return sph_err_prefix(s, "head: TP combine of sum_p2 (allgather of %zu bytes): ",
                                      bytes);
        }
        all = gathered;
    }
    for (int64_t i = 0; i < N; i++) {
        const double M = rec[(size_t)i * R];
        double q = 0;
        for (int64_t r = 0; r < ranks; r++) { /* rank order: the same bits on every rank */
            const double *x = all + ((size_t)r * (size_t)N + (size_t)i) * 2;
            if (x[1] != 0 || isnan(x[1])) q += x[1] * exp(2 * (x[0] - M));
        }
        Q[i] = q;
    }
    return SPH_OK;
}

sph_status sph_head_combine_f64(sph_comm_t comm, const double *local, double *gathered,
                                double *out, int64_t N) {
    SPH_CHECK(N >= 0, SPH_ERR_INVALID_ARG, "combine: N = %lld, expected >= 0", (long long)N);
    const size_t rec = (size_t)SPH_PARTIAL_FIELDS;
    if (comm == NULL || comm->size <= 1) {
        if (out != local)
            for (size_t k = 0; k < (size_t)N * rec; k++) out[k] = local[k];
        return SPH_OK;
    }
    SPH_CHECK(gathered != NULL, SPH_ERR_INTERNAL, "combine: no gather buffer");
    SPH_CHECK(comm->ops && comm->ops->allgather, SPH_ERR_INVALID_ARG,
              "tp_comm: communicator has no allgather");
    size_t bytes;
    SPH_CHECK(sph_mul_size((size_t)N, rec * sizeof(double), &bytes), SPH_ERR_OVERFLOW,
              "combine: N = %lld records overflow size_t", (long long)N);
    if (N == 0) return SPH_OK;
    sph_status s = comm->ops->allgather(comm, local, gathered, bytes, NULL);
    if (s != SPH_OK) return sph_err_prefix(s, "head: TP combine (allgather of %zu bytes): ", bytes);
    for (int64_t i = 0; i < N; i++) {
        double acc[SPH_PARTIAL_FIELDS] = {-INFINITY, 0, 0, 0, 0};
        for (int64_t r = 0; r < comm->size; r++)
            sph_head_partial_merge(acc, gathered + ((size_t)r * (size_t)N + (size_t)i) * rec);
        for (size_t f = 0; f < rec; f++) out[(size_t)i * rec + f] = acc[f];
    }
    return SPH_OK;
}
