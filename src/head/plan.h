/*
 * plan.h - the validated, normalized form of sph_head_args that every head backend (CPU
 * reference, CPU optimized, CUDA) receives. Validation (head.c) fills it once at the API
 * boundary; kernels get plain pointers, int64 sizes and row strides, nothing else.
 *
 * TP combine record: every backend reduces its shard to one partial per row,
 *   m  = max_j z_ij over the shard (-inf if the shard holds no candidate of the row)
 *   s  = sum_j exp(z_ij - m)
 *   b  = sum_j exp(z_ij - m) z_ij
 *   zt = z_{i,t_i} if the target lives in this shard, else 0 (exactly one shard owns it)
 *   sz = sum_j z_ij (for logit_mean)
 * and partials of the TP group combine exactly, in rank order (deterministic):
 *   M = max m_r, S = sum s_r e^(m_r - M), B = sum b_r e^(m_r - M), ZT = sum zt_r, SZ = sum sz_r
 *   lse = M + log S, mu = B / S.
 */
#ifndef SPH_HEAD_PLAN_H
#define SPH_HEAD_PLAN_H

#include "core/ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SPH_PARTIAL_FIELDS 5 /* m, s, b, zt, sz: floats per row per shard */

typedef struct sph_head_plan {
    int64_t N, H, V_loc, V, v0; /* rows, hidden, shard width, vocab_total, vocab_start */
    int64_t K;                  /* candidates per row (support mode), 0 = full vocabulary */
    sph_dtype dtype;            /* hidden/weight dtype: f32, bf16 or f16 */
    sph_device device;
    const void *hidden;  int64_t ld_h;   /* (N, H) row stride ld_h elements */
    const void *weight;  int64_t ld_w;   /* (V_loc, H) */
    const void *targets; int tgt_i64;    /* (N) or NULL */
    const void *cand;    int cand_i64; int64_t ld_c; /* (N, K) or NULL */
    double temperature, softcap;
    const uint8_t *mask;                 /* (N) or NULL = every row active */
    const int64_t *spans; int64_t n_spans; /* host, validated: ordered, in range, cover mask;
                                              NULL = derive from mask or dense */
    float *logprob, *entropy, *lse, *logit_mean; /* (N) each or NULL */
    float *stats;                        /* (N, 3): m, lse, mu; row stride 3 */
    const float *dlogprob, *dentropy, *dlse, *dlogit_mean; /* (N) each or NULL */
    void *dhidden; int64_t ld_dh; sph_dtype dh_dtype;
    void *dweight; int64_t ld_dw; sph_dtype dw_dtype;
    int acc_dh, acc_dw, allreduce_dh;
    int one_pass;                        /* forward also produces the gradients */
    sph_comm_t comm;                     /* TP group or NULL */
    /* policy loss of the call (src/policy/policy.h) or NULL: the one-pass sweeps compute
     * dlogprob / dentropy of each row from it right after the row is finalized */
    const struct sph_policy_plan *policy;
} sph_head_plan;

/* Validates args for the pass on ctx and fills plan. Checks everything that can be checked
 * without touching device data; host-resident targets/candidates/masks are also checked for
 * range, duplicates and support membership. */
sph_status sph_head_plan_make(sph_ctx_t ctx, sph_head_pass pass, const sph_head_args *args,
                              sph_head_plan *plan);

/* Backends. Each returns SPH_OK or a recorded error; workspace sizes are exact upper bounds. */
sph_status sph_head_ref_forward(const sph_head_plan *p);
sph_status sph_head_ref_backward(const sph_head_plan *p);

sph_status sph_head_cpu_workspace(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p,
                                  size_t *bytes);
sph_status sph_head_cpu_forward(sph_ctx_t ctx, const sph_head_plan *p, void *ws, size_t bytes);
sph_status sph_head_cpu_backward(sph_ctx_t ctx, const sph_head_plan *p, void *ws, size_t bytes);

/* TP combine (combine.c). local[N][5] holds this rank's partial records (m, s, b, zt, sz) in
 * float64; gathered is scratch of comm size * N * 5 doubles (host memory); out[N][5] receives
 * the combined (M, S, B, ZT, SZ), combined in rank order (deterministic). With comm NULL or of
 * size 1, out = local (gathered unused, may be NULL). local and out may alias. */
sph_status sph_head_combine_f64(sph_comm_t comm, const double *local, double *gathered,
                                double *out, int64_t N);
/* Combines the partials of one row across shards or tiles, in the order given:
 * (m, s, b, zt, sz) += (m', s', b', zt', sz'). Exact up to rounding; handles m = -inf. */
void sph_head_partial_merge(double acc[5], const double add[5]);
/* Host-only helper: active[i] = 1 if row i is active (mask, else spans, else all). */
void sph_head_active_rows(const sph_head_plan *p, uint8_t *active);

/* Float64 cores of the reference, for tests (finite differences need float64 end to end).
 * rows_f64 writes per-row (logprob, entropy, lse, logit_mean, m, lse, mu) as out[N][7];
 * backward_f64 reads stats64[N][3] (m, lse, mu) and writes dh[N][H], dw[V_loc][H] (either
 * may be NULL) as this shard's gradients of the active rows (no accumulate, no allreduce).
 * Both allocate host scratch (the reference is never a hot path). */
sph_status sph_head_ref_rows_f64(const sph_head_plan *p, double *out);
sph_status sph_head_ref_backward_f64(const sph_head_plan *p, const double *stats64, double *dh,
                                     double *dw);

sph_status sph_head_cuda_workspace(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p,
                                   size_t *bytes);
sph_status sph_head_cuda_forward(sph_ctx_t ctx, const sph_head_plan *p, void *ws, size_t bytes);
sph_status sph_head_cuda_backward(sph_ctx_t ctx, const sph_head_plan *p, void *ws, size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
