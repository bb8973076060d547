/*
 * host.h - what the host backends of the head (head_ref.c, the float64 reference, and
 * head_cpu.c, the optimized CPU head) share beyond the plan: the exact combine of partial
 * records (combine.c) and the reference's float64 cores (also the tests' oracle).
 * Their table entries are filled through core/backend.h (sph_head_ref_fill, sph_head_cpu_fill).
 */
#ifndef SPH_HEAD_HOST_H
#define SPH_HEAD_HOST_H

#include "core/ctx.h"
#include "head/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* TP combine (combine.c). local[N][SPH_PARTIAL_FIELDS] holds this rank's partial records
 * (m, s, d, zt, sz) in float64, d shifted by the record's max (combine.c); gathered is scratch
 * of comm size * N * SPH_PARTIAL_FIELDS doubles (host memory); out[N][SPH_PARTIAL_FIELDS]
 * receives the combined (M, S, D, ZT, SZ),
 * combined in rank order (deterministic). With comm NULL or of size 1, out = local (gathered
 * unused, may be NULL). local and out may alias. */
sph_status sph_head_combine_f64(sph_comm_t comm, const double *local, double *gathered,
                                double *out, int64_t N);
/* sum_p2 across the TP group: mq[N][2] holds this rank's (m, q) per row, q = sum over its
 * columns of e^(2 (z - m)); rec[N][SPH_PARTIAL_FIELDS] the combined records (their M);
 * Q[i] = sum over ranks of q e^(2 (m - M)), so that sum_p2 = Q / S^2. gathered: comm size * N
 * * 2 doubles (unused without a group). One allgather, ranks merged in rank order. */
sph_status sph_head_combine_sq_f64(sph_comm_t comm, const double *mq, double *gathered,
                                   const double *rec, double *Q, int64_t N);
/* Top-k (issue 25): a row's list is K entries sorted best first, padded at the end with
 * empty entries (id -1, z -inf). Better: larger z, then the lower id; empty is worst. */
typedef struct sph_topk_ent {
    double z;   /* the scaled logit z (after temperature and softcap) */
    int64_t id; /* global vocabulary id, -1 = empty */
} sph_topk_ent;
static inline int sph_topk_better(double za, int64_t ia, double zb, int64_t ib) {
    if (ib < 0) return ia >= 0;
    if (ia < 0) return 0;
    return za > zb || (za == zb && ia < ib);
}
/* l[0 .. K) <- empty. */
void sph_topk_clear(sph_topk_ent *l, int64_t K);
/* Puts (z, id) into the sorted list l (K entries) when it beats the last; NaN is skipped. */
void sph_topk_insert(sph_topk_ent *l, int64_t K, double z, int64_t id);
/* out <- the K best of the sorted lists a and b (out aliases neither). */
void sph_topk_merge2(const sph_topk_ent *a, const sph_topk_ent *b, sph_topk_ent *out,
                     int64_t K);
/* The lists list[n][K] of this rank merged over the TP group in rank order (one allgather of
 * n K entries into gathered, comm size * n * K entries); scratch: 2 K entries. Without a
 * group: nothing to do. */
sph_status sph_head_combine_topk(sph_comm_t comm, sph_topk_ent *list, sph_topk_ent *gathered,
                                 sph_topk_ent *scratch, int64_t n, int64_t K);
/* Row i's topk outputs from its merged list l and shifted statistics (M, ls = log S):
 * log-prob (z - M) - ls; l NULL (inactive row): ids -1, log-probs 0. */
void sph_head_topk_store(const sph_head_plan *p, int64_t i, const sph_topk_ent *l, double M,
                         double ls);

/* Combines the partials of one row across shards or tiles, in the order given:
 * (m, s, d, zt, sz) += (m', s', d', zt', sz'). Exact up to rounding; handles m = -inf. */
void sph_head_partial_merge(double acc[SPH_PARTIAL_FIELDS], const double add[SPH_PARTIAL_FIELDS]);

/* The reference's passes on a host plan (head_ref.c): no workspace, host scratch; ctx takes
 * the non-finite rows they refuse (sph_ctx_nonfinite). */
sph_status sph_head_ref_forward(sph_ctx_t ctx, const sph_head_plan *p);
sph_status sph_head_ref_backward(sph_ctx_t ctx, const sph_head_plan *p);

/* Float64 cores of the reference, for tests (finite differences need float64 end to end).
 * rows_f64 writes per-row (logprob, entropy, lse, logit_mean, m, lse, mu) as out[N][7];
 * backward_f64 reads stats64[N][3] (m, lse, mu) and writes dh[N][H], dw[V_loc][H] (either
 * may be NULL) as this shard's gradients of the active rows (no accumulate, no allreduce).
 * Both allocate host scratch (the reference is never a hot path). */
sph_status sph_head_ref_rows_f64(const sph_head_plan *p, double *out);
sph_status sph_head_ref_backward_f64(const sph_head_plan *p, const double *stats64, double *dh,
                                     double *dw);

/* The staged reference of device contexts (head_ref_stage.c): the plan's device data copied
 * to the host (synchronously, after the work already queued on the context's stream), the
 * data checks and the reference run there, the outputs copied back. */
sph_status sph_head_ref_stage_check(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p);
sph_status sph_head_ref_stage_pass(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p);

#ifdef __cplusplus
}
#endif
#endif
