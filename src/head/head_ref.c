/*
 * head_ref.c - the float64 reference of the LM head: plain loops, no threads, no SIMD. It is
 * the oracle of every test and the path selected by force_kernel = "ref". Never optimized.
 *
 * Per row i and column j of this shard (global id v0 + j), with u_ij = h_i . w_j:
 *   z_ij  = (c > 0 ? c tanh(u_ij / c) : u_ij) / T
 *   record (m, s, d, zt, sz) over the shard (combine.c), combined over the TP group:
 *   ls = log S,  dm = D / S  (both shifted by the row max M),
 *   lse = M + ls,  mu = M + dm,  logprob = (ZT - M) - ls (0 for ignored targets),
 *   entropy = ls - dm,  logit_mean = SZ / V.
 * Backward, p_ij = exp((z_ij - M_i) - ls_i),  mu_i - z_ij = dm_i - (z_ij - M_i):
 *   dz_ij = g_i (delta(j, t_i) - p_ij) + e_i p_ij (mu_i - z_ij) + gl_i p_ij + gm_i / V
 *   du_ij = dz_ij / T * (c > 0 ? 1 - tanh^2(u_ij / c) : 1)
 *   dhidden_i = sum_j du_ij w_j,  dweight_j = sum_i du_ij h_i   (active rows only)
 * Sample support: j runs over the row's candidates inside this shard; no logit_mean term.
 *
 * Numerics: both passes work shifted by the row max, so that no two numbers of the logits'
 * magnitude are ever subtracted (a low temperature or a large offset makes |z| large: at
 * |z| ~ 2e9, lse and z differ from their float32 roundings by ~100). The forward keeps the
 * shifted record in float64 and hands (M, ls, dm) to a one-pass backward. The two-pass
 * backward has the caller's float32 stats (m, lse, mu): it takes ls = lse - m and
 * dm = mu - m (exact in float64), and as the shift the row's recomputed float64 max when
 * that rounds to the stats' m (the shard holding the row max: the dominant token gets
 * z - M = 0 exactly, as the float32 backends do), else m itself. What remains is the
 * stats' own rounding of log S and mu - m (ulp(|m|)/2, inherent to float32 stats).
 * The reference allocates its float64 scratch with malloc: it is never a hot path.
 *
 * Table (core/backend.h): sph_head_ref_fill puts the reference in every slot of a context's
 * head table, plain for host memory, staged (head_ref_stage.c) for device memory; the CPU and
 * CUDA backends then override the slots they implement, unless the reference is forced.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/backend.h"
#include "head/host.h"

// ---- element access --------------------------------------------------------------------

static double load(const void *base, sph_dtype dt, int64_t k) {
    if (dt.bits == 32) return ((const float *)base)[k];
    uint16_t v = ((const uint16_t *)base)[k];
    return dt.code == SPH_DTYPE_BFLOAT ? sph_bf16_to_f32(v) : sph_f16_to_f32(v);
}

/* Stores v rounded to dt (f32, bf16 or f16; round to nearest even). */
static void store(void *base, sph_dtype dt, int64_t k, double v) {
    if (dt.bits == 32) {
        ((float *)base)[k] = (float)v;
        return;
    }
    uint16_t *b = base;
    b[k] = dt.code == SPH_DTYPE_BFLOAT ? sph_f32_to_bf16((float)v) : sph_f32_to_f16((float)v);
}

/* Raw product u = h_i . w_j (j local). */
static double dot_hw(const sph_head_plan *p, int64_t i, int64_t j) {
    double u = 0;
    for (int64_t k = 0; k < p->H; k++)
        u += load(p->hidden, p->dtype, i * p->ld_h + k) * load(p->weight, p->dtype, j * p->ld_w + k);
    return u;
}

/* Row i's temperature (the scalar, or temperature_rows[i]: plan.h). */
static double row_temperature(const sph_head_plan *p, int64_t i) {
    return sph_plan_row_temperature(p, i);
}

static double z_of_u(const sph_head_plan *p, double u, double T) {
    double c = p->softcap;
    return (c > 0 ? c * tanh(u / c) : u) / T;
}

/* Local columns of row i: the whole shard, or the row's candidates inside it. Returns the
 * count and fills cols (capacity V_loc or K). */
static int64_t row_columns(const sph_head_plan *p, int64_t i, int64_t *cols) {
    int64_t n = 0;
    if (p->K == 0) {
        for (int64_t j = 0; j < p->V_loc; j++) cols[n++] = j;
        return n;
    }
    for (int64_t k = 0; k < p->K; k++) {
        int64_t c = sph_head_id_at(p->cand, p->cand_i64, i * p->ld_c + k);
        if (c >= p->v0 && c < p->v0 + p->V_loc) cols[n++] = c - p->v0;
    }
    return n;
}

static int64_t target_of(const sph_head_plan *p, int64_t i) {
    return p->targets ? sph_head_id_at(p->targets, p->tgt_i64, i) : -1;
}

// ---- forward ---------------------------------------------------------------------------

/* The forward's float64 rows out[N][7] (host.h); when sh is given, the shifted stats
 * sh[N][3] = (M, ls, dm) a one-pass backward takes; when sp2 is given, sum_p2 (N); when tk
 * is given, the merged top-k list of every row tk[N][p->topk] (host.h). */
static sph_status rows_core(const sph_head_plan *p, double *out, double *sh, double *sp2,
                            sph_topk_ent *tk) {
    const int64_t N = p->N, ncols = p->K ? p->K : p->V_loc;
    const int64_t R = SPH_PARTIAL_FIELDS;
    const int64_t ranks = p->comm && p->comm->size > 1 ? p->comm->size : 1;
    uint8_t *active = sph_malloc((size_t)N + 1);
    int64_t *cols = sph_malloc((size_t)ncols * sizeof *cols);
    double *zrow = sph_malloc((size_t)ncols * sizeof *zrow); /* z of the row's columns */
    double *rec = sph_malloc(((size_t)N * R + 1) * sizeof *rec);
    double *gath = ranks > 1 ? sph_malloc((size_t)(ranks * N * R + 1) * sizeof *gath) : NULL;
    double *mq = sp2 ? sph_malloc(((size_t)N * 2 + 1) * sizeof *mq) : NULL; /* (m, q) local */
    const int64_t K = tk ? p->topk : 0;
    sph_topk_ent *tkg = K && ranks > 1 ? sph_malloc(((size_t)(ranks * N + 2) * K) * sizeof *tkg)
                                       : NULL; /* the gathered lists, then 2 K of scratch */
    sph_status st = SPH_OK;
    if (!active || !cols || !zrow || !rec || (ranks > 1 && !gath) || (sp2 && !mq) ||
        (K && ranks > 1 && !tkg)) {
        st = sph_err(SPH_ERR_ALLOC, "head_ref: out of host memory (N = %lld)", (long long)N);
        goto done;
    }
    sph_head_active_rows(p, active);
    for (int64_t i = 0; i < N; i++) {
        double *r = rec + i * R;
        r[0] = -INFINITY;
        r[1] = r[2] = r[3] = r[4] = 0;
        if (mq) mq[i * 2] = -INFINITY, mq[i * 2 + 1] = 0;
        if (K) sph_topk_clear(tk + i * K, K);
        if (!active[i]) continue; /* inactive rows take part in the collective as empty */
        int64_t n = row_columns(p, i, cols), t = target_of(p, i);
        const double T = row_temperature(p, i);
        double m = -INFINITY;
        int any_nan = 0;
        for (int64_t c = 0; c < n; c++) {
            double z = z_of_u(p, dot_hw(p, i, cols[c]), T);
            zrow[c] = z;
            if (isnan(z)) any_nan = 1;
            if (z > m) m = z;
        }
        if (any_nan) m = NAN;
        for (int64_t c = 0; c < n; c++) {
            double z = zrow[c], e = exp(z - m);
            r[1] += e;
            r[2] += e * (z - m); /* shifted (combine.c) */
            r[4] += z;
            if (cols[c] + p->v0 == t) r[3] = z;
            if (mq) mq[i * 2 + 1] += e * e; /* sum_p2: e^(2 (z - m)), shifted likewise */
            if (K) sph_topk_insert(tk + i * K, K, z, cols[c] + p->v0);
        }
        if (n > 0) r[0] = m;
        if (mq && n > 0) mq[i * 2] = m;
    }
    st = sph_head_combine_f64(p->comm, rec, gath, rec, N);
    if (st == SPH_OK && sp2) st = sph_head_combine_sq_f64(p->comm, mq, gath, rec, sp2, N);
    if (st == SPH_OK && K)
        st = sph_head_combine_topk(p->comm, tk, tkg, tkg ? tkg + ranks * N * K : NULL, N, K);
    if (st != SPH_OK) goto done;
    for (int64_t i = 0; i < N; i++) {
        double *o = out + i * 7, *r = rec + i * R;
        for (int f = 0; f < 7; f++) o[f] = 0;
        if (sh) sh[i * 3] = sh[i * 3 + 1] = sh[i * 3 + 2] = 0;
        const double q = sp2 ? sp2[i] : 0;
        if (sp2) sp2[i] = 0;
        /* inactive rows, and support rows with no candidate at all, output zeros */
        if (!active[i] || (r[0] == -INFINITY && r[1] == 0)) continue;
        if (sp2) sp2[i] = q / (r[1] * r[1]);
        const double ls = log(r[1]), dm = r[2] / r[1];
        o[0] = target_of(p, i) >= 0 ? (r[3] - r[0]) - ls : 0;
        o[1] = ls - dm;
        o[2] = r[0] + ls;
        o[3] = p->K ? 0 : r[4] / (double)p->V;
        o[4] = r[0];
        o[5] = r[0] + ls;
        o[6] = r[0] + dm;
        if (sh) sh[i * 3] = r[0], sh[i * 3 + 1] = ls, sh[i * 3 + 2] = dm;
    }
done:
    sph_free(active);
    sph_free(cols);
    sph_free(zrow);
    sph_free(rec);
    sph_free(gath);
    sph_free(mq);
    sph_free(tkg);
    return st;
}

sph_status sph_head_ref_rows_f64(const sph_head_plan *p, double *out) {
    return rows_core(p, out, NULL, NULL, NULL);
}

// ---- backward --------------------------------------------------------------------------

static double upstream(const float *g, int64_t i) { return g ? (double)g[i] : 0.0; }

/* The backward of the active rows from shifted stats st[N][3] = (M, ls, dm) (see the top).
 * rounded_m: M is the float32 rounding of the row max (the caller's stats); the row's own
 * float64 max replaces it where it rounds to M. */
static sph_status backward_core(const sph_head_plan *p, const double *st, int rounded_m,
                                double *dh, double *dw) {
    const int64_t N = p->N, H = p->H, ncols = p->K ? p->K : p->V_loc;
    uint8_t *active = sph_malloc((size_t)N + 1);
    int64_t *cols = sph_malloc((size_t)ncols * sizeof *cols);
    double *urow = sph_malloc((size_t)ncols * 2 * sizeof *urow), *zrow = urow + ncols;
    if (!active || !cols || !urow) {
        sph_free(active);
        sph_free(cols);
        sph_free(urow);
        return sph_err(SPH_ERR_ALLOC, "head_ref: out of host memory (N = %lld)", (long long)N);
    }
    sph_head_active_rows(p, active);
    if (dh) memset(dh, 0, (size_t)N * (size_t)H * sizeof *dh);
    if (dw) memset(dw, 0, (size_t)p->V_loc * (size_t)H * sizeof *dw);
    const double c = p->softcap;
    for (int64_t i = 0; i < N; i++) {
        if (!active[i]) continue;
        const double T = row_temperature(p, i);
        const double ls = st[i * 3 + 1], dm = st[i * 3 + 2];
        const int64_t t = target_of(p, i);
        const double g = t >= 0 ? upstream(p->dlogprob, i) : 0.0; /* ignored: no gradient */
        const double e = upstream(p->dentropy, i), gl = upstream(p->dlse, i);
        const double gm = p->K ? 0.0 : upstream(p->dlogit_mean, i);
        int64_t n = row_columns(p, i, cols);
        double mloc = -INFINITY;
        for (int64_t q = 0; q < n; q++) {
            urow[q] = dot_hw(p, i, cols[q]);
            zrow[q] = z_of_u(p, urow[q], T);
            if (zrow[q] > mloc) mloc = zrow[q];
        }
        double M = st[i * 3];
        if (rounded_m && n > 0 && (float)mloc == (float)M) M = mloc;
        for (int64_t q = 0; q < n; q++) {
            int64_t j = cols[q];
            const double u = urow[q], zm = zrow[q] - M;
            const double pr = exp(zm - ls);
            double dz = g * ((j + p->v0 == t ? 1.0 : 0.0) - pr) + e * pr * (dm - zm) + gl * pr +
                        gm / (double)p->V;
            double du = dz / T;
            if (c > 0) {
                double th = tanh(u / c);
                du *= 1 - th * th;
            }
            for (int64_t k = 0; k < H; k++) {
                if (dh) dh[i * H + k] += du * load(p->weight, p->dtype, j * p->ld_w + k);
                if (dw) dw[j * H + k] += du * load(p->hidden, p->dtype, i * p->ld_h + k);
            }
        }
    }
    sph_free(active);
    sph_free(cols);
    sph_free(urow);
    return SPH_OK;
}

/* (m, lse, mu) -> shifted (m, lse - m, mu - m); rounded_m: m is a float32 rounding. */
static sph_status backward_unshifted(const sph_head_plan *p, const double *st, int rounded_m,
                                     double *dh, double *dw) {
    double *sh = sph_malloc(((size_t)p->N * 3 + 1) * sizeof *sh);
    SPH_CHECK(sh != NULL, SPH_ERR_ALLOC, "head_ref: out of host memory (N = %lld)",
              (long long)p->N);
    for (int64_t i = 0; i < p->N; i++) {
        const double m = st[i * 3];
        sh[i * 3] = m;
        sh[i * 3 + 1] = st[i * 3 + 1] - m;
        sh[i * 3 + 2] = st[i * 3 + 2] - m;
    }
    sph_status s = backward_core(p, sh, rounded_m, dh, dw);
    sph_free(sh);
    return s;
}

sph_status sph_head_ref_backward_f64(const sph_head_plan *p, const double *stats64, double *dh,
                                     double *dw) {
    return backward_unshifted(p, stats64, 0, dh, dw);
}

/* Writes the float64 gradients into the caller's tensors with the accumulate / inactive-row
 * rules of the API, then the optional TP all-reduce of dhidden. Accumulating, an element whose
 * gradient is exactly 0 keeps its start bit for bit (start + 0 is the start: a -0 start would
 * round to +0, and with no active row dweight must stay its start) */
static sph_status store_grads(const sph_head_plan *p, const double *dh, const double *dw) {
    const int64_t N = p->N, H = p->H;
    if (p->dhidden) {
        uint8_t *active = sph_malloc((size_t)N + 1);
        SPH_CHECK(active != NULL, SPH_ERR_ALLOC, "head_ref: out of host memory");
        sph_head_active_rows(p, active);
        for (int64_t i = 0; i < N; i++) {
            if (!active[i] && p->acc_dh) continue; /* rows outside the spans stay as they are */
            for (int64_t k = 0; k < H; k++) {
                int64_t o = i * p->ld_dh + k;
                double v = dh[i * H + k];
                if (p->acc_dh) {
                    if (v == 0) continue;
                    v += load(p->dhidden, p->dh_dtype, o);
                }
                store(p->dhidden, p->dh_dtype, o, v);
            }
        }
        sph_free(active);
        if (p->allreduce_dh && p->comm && p->comm->size > 1 && N > 0) {
            sph_status s = p->comm->ops->allreduce_sum_f32(p->comm, (float *)p->dhidden,
                                                           (size_t)(N * H), NULL);
            if (s != SPH_OK) return sph_err_prefix(s, "head: allreduce of dhidden: ");
        }
    }
    if (p->dweight) {
        for (int64_t j = 0; j < p->V_loc; j++)
            for (int64_t k = 0; k < H; k++) {
                int64_t o = j * p->ld_dw + k;
                double v = dw[j * H + k];
                if (p->acc_dw) {
                    if (v == 0) continue;
                    v += load(p->dweight, p->dw_dtype, o);
                }
                store(p->dweight, p->dw_dtype, o, v);
            }
    }
    return SPH_OK;
}

static sph_status backward_from(const sph_head_plan *p, const double *stats64, int rounded_m) {
    size_t nh = p->dhidden ? (size_t)p->N * (size_t)p->H : 0;
    size_t nw = p->dweight ? (size_t)p->V_loc * (size_t)p->H : 0;
    double *dh = sph_malloc((nh + 1) * sizeof *dh), *dw = sph_malloc((nw + 1) * sizeof *dw);
    sph_status st;
    if (!dh || !dw) {
        st = sph_err(SPH_ERR_ALLOC, "head_ref: out of host memory for float64 gradients");
    } else {
        /* one-pass: the forward's shifted stats; two-pass: the caller's float32 ones */
        st = rounded_m ? backward_unshifted(p, stats64, 1, p->dhidden ? dh : NULL,
                                            p->dweight ? dw : NULL)
                       : backward_core(p, stats64, 0, p->dhidden ? dh : NULL,
                                       p->dweight ? dw : NULL);
        if (st == SPH_OK) st = store_grads(p, dh, dw);
    }
    sph_free(dh);
    sph_free(dw);
    return st;
}

sph_status sph_head_ref_forward(sph_ctx_t ctx, const sph_head_plan *p) {
    const int64_t N = p->N;
    double *o = sph_malloc(((size_t)N * 7 + 1) * sizeof *o);
    double *st64 = sph_malloc(((size_t)N * 3 + 1) * sizeof *st64);
    double *sp2 = p->sum_p2 ? sph_malloc(((size_t)N + 1) * sizeof *sp2) : NULL;
    sph_topk_ent *tk = p->topk ? sph_malloc(((size_t)N * p->topk + 1) * sizeof *tk) : NULL;
    sph_status st = SPH_OK;
    if (!o || !st64 || (p->sum_p2 && !sp2) || (p->topk && !tk)) {
        st = sph_err(SPH_ERR_ALLOC, "head_ref: out of host memory (N = %lld)", (long long)N);
        goto done;
    }
    st = rows_core(p, o, st64, sp2, tk);
    if (st != SPH_OK) goto done;
    /* non-finite policy: every row's statistics are known, nothing is written yet (inactive
     * and empty rows are zeros) */
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < N; i++) {
        const double *r = o + i * 7;
        if (isfinite(r[4]) && isfinite(r[5]) && isfinite(r[6])) continue;
        if (!bad) first = i;
        bad++;
    }
    if (bad) {
        st = sph_head_nonfinite_error(ctx, SPH_HEAD_FORWARD, bad, first, NULL);
        goto done;
    }
    /* one-pass: the gradients first, so that a failure there (host memory) leaves the per-row
     * outputs unwritten too */
    if (p->one_pass) st = backward_from(p, st64, 0);
    if (st != SPH_OK) goto done;
    for (int64_t i = 0; i < N; i++) {
        const double *r = o + i * 7;
        if (p->logprob) p->logprob[i] = (float)r[0];
        if (p->entropy) p->entropy[i] = (float)r[1];
        if (p->lse) p->lse[i] = (float)r[2];
        if (p->logit_mean) p->logit_mean[i] = (float)r[3];
        if (p->sum_p2) p->sum_p2[i] = (float)sp2[i];
        for (int f = 0; f < 3; f++) p->stats[i * 3 + f] = (float)r[4 + f];
        /* st64 holds (M, ls, dm) of active rows, zeros elsewhere */
        if (p->topk)
            sph_head_topk_store(p, i, tk[i * p->topk].id >= 0 ? tk + i * p->topk : NULL,
                                st64[i * 3], st64[i * 3 + 1]);
    }
done:
    sph_free(o);
    sph_free(st64);
    sph_free(sp2);
    sph_free(tk);
    return st;
}

sph_status sph_head_ref_backward(sph_ctx_t ctx, const sph_head_plan *p) {
    int64_t first;
    const int64_t bad = sph_head_scan_backward_inputs(p, &first);
    if (bad) return sph_head_nonfinite_error(ctx, SPH_HEAD_BACKWARD, bad, first, NULL);
    double *st64 = sph_malloc(((size_t)p->N * 3 + 1) * sizeof *st64);
    SPH_CHECK(st64 != NULL, SPH_ERR_ALLOC, "head_ref: out of host memory (N = %lld)",
              (long long)p->N);
    for (int64_t k = 0; k < p->N * 3; k++) st64[k] = p->stats[k];
    sph_status st = backward_from(p, st64, 1);
    sph_free(st64);
    return st;
}

// ---- table entries ---------------------------------------------------------------------

static sph_status ref_workspace(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p,
                                size_t *bytes) {
    (void)ctx, (void)pass, (void)p;
    *bytes = 0; /* the reference allocates its own scratch */
    return SPH_OK;
}

static sph_status ref_forward(sph_ctx_t ctx, const sph_head_plan *p, void *ws, size_t bytes) {
    (void)ws, (void)bytes;
    return sph_head_ref_forward(ctx, p);
}

static sph_status ref_backward(sph_ctx_t ctx, const sph_head_plan *p, void *ws, size_t bytes) {
    (void)ws, (void)bytes;
    return sph_head_ref_backward(ctx, p);
}

static sph_status staged_forward(sph_ctx_t ctx, const sph_head_plan *p, void *ws,
                                 size_t bytes) {
    (void)ws, (void)bytes;
    return sph_head_ref_stage_pass(ctx, SPH_HEAD_FORWARD, p);
}

static sph_status staged_backward(sph_ctx_t ctx, const sph_head_plan *p, void *ws,
                                  size_t bytes) {
    (void)ws, (void)bytes;
    return sph_head_ref_stage_pass(ctx, SPH_HEAD_BACKWARD, p);
}

void sph_head_ref_fill(sph_ctx_t ctx, sph_head_backend *be, int staged) {
    (void)ctx;
    memset(be, 0, sizeof *be);
    be->name = staged ? "ref (staged)" : "ref";
    be->check = staged ? sph_head_ref_stage_check : NULL;
    be->workspace = ref_workspace;
    /* the reference handles sample support in the same loops (row_columns) */
    be->forward = be->support_forward = staged ? staged_forward : ref_forward;
    be->backward = be->support_backward = staged ? staged_backward : ref_backward;
    be->batch_invariant = 1; /* every row is its own float64 loop */
}
