/*
 * distill_ref.c - the float64 reference of the distillation losses: the oracle the tests and
 * `spanhead run --check` compare against (sph_distill_ref_f64, float64 inputs, so finite
 * differences run in float64 end to end), and the reference backend of host contexts
 * (force_kernel "ref": the plan's inputs converted to float64, one group of ranks only).
 * Row by row, the whole vocabulary at once; the math is distill_math.h's.
 */
#include <math.h>
#include <string.h>

#include "comm/comm.h"
#include "distill/distill.h"
#include "distill/distill_math.h"

int sph_distill_kind_of(int kind, double beta) {
    if (kind == SPH_DK_JSD && beta == 0.0) return SPH_DK_FWD;
    if (kind == SPH_DK_JSD && beta == 1.0) return SPH_DK_REV;
    return kind;
}

static double dot(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t k = 0; k < n; k++) s += a[k] * b[k];
    return s;
}

/* log-softmax of x (n) into out, shifted by the max (never the log of an underflowed exp). */
static void log_softmax(const double *x, int64_t n, double *out) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < n; j++) m = x[j] > m ? x[j] : m;
    for (int64_t j = 0; j < n; j++) s += exp(x[j] - m);
    const double lse = m + log(s);
    for (int64_t j = 0; j < n; j++) out[j] = x[j] - lse;
}

/* One row: loss, and dz (V) of the row's loss. lq (V) the student's log-probs; the teacher's
 * lp (V, dense) or the row's ids / log-probs (sparse); mark (V) scratch. */
static double row_dense(const sph_distill_f64 *in, const double *lq, const double *lp,
                        double *dz) {
    double loss = 0, S = 0, l, a;
    for (int64_t j = 0; j < in->V; j++) {
        sph_dm_term(in->kind, in->beta, lq[j], lp[j], &l, &a);
        loss += l, S += a, dz[j] = a;
    }
    for (int64_t j = 0; j < in->V; j++) dz[j] -= exp(lq[j]) * S;
    return loss;
}

static double row_sparse(const sph_distill_f64 *in, const double *lq, const int64_t *ids,
                         const double *lp, int64_t *mark, double *dz) {
    const int64_t V = in->V;
    for (int64_t j = 0; j < V; j++) mark[j] = -1;
    double psum = 0;
    int64_t nvalid = 0;
    for (int64_t k = 0; k < in->K; k++)
        if (ids[k] >= 0) mark[ids[k]] = k, psum += exp(lp[k]), nvalid++;
    double lqr = -INFINITY; /* log Q_r over the tail columns, shifted by their max */
    {
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < V; j++)
            if (mark[j] < 0) m = lq[j] > m ? lq[j] : m;
        for (int64_t j = 0; j < V; j++)
            if (mark[j] < 0) s += exp(lq[j] - m);
        if (nvalid < V) lqr = m + log(s);
    }
    const double pr = psum < 1 ? 1 - psum : 0.0;
    const int tail = nvalid < V && !(in->kind == SPH_DK_REV && pr == 0);
    double loss = 0, S = 0, l, a, ar = 0;
    for (int64_t k = 0; k < in->K; k++) {
        if (ids[k] < 0) continue;
        sph_dm_term(in->kind, in->beta, lq[ids[k]], lp[k], &l, &a);
        loss += l, S += a, dz[ids[k]] = a;
    }
    if (tail) {
        sph_dm_term(in->kind, in->beta, lqr, pr > 0 ? log(pr) : -INFINITY, &l, &ar);
        loss += l, S += ar;
    }
    for (int64_t j = 0; j < V; j++) {
        const double q = exp(lq[j]);
        if (mark[j] >= 0)
            dz[j] -= q * S;
        else
            dz[j] = (tail ? exp(lq[j] - lqr) * ar : 0.0) - q * S;
    }
    return loss;
}

sph_status sph_distill_ref_f64(const sph_distill_f64 *in, double *loss_rows, double *dh,
                               double *dw) {
    const int64_t N = in->N, H = in->H, V = in->V;
    double *u = sph_malloc((size_t)V * 5 * sizeof(double));
    int64_t *mark = sph_malloc((size_t)V * sizeof(int64_t));
    if (!u || !mark) {
        sph_free(u), sph_free(mark);
        return sph_err(SPH_ERR_ALLOC, "distill reference: out of host memory (V = %lld)",
                       (long long)V);
    }
    double *z = u + V, *lq = z + V, *lp = lq + V, *dz = lp + V;
    if (dh) memset(dh, 0, (size_t)(N * H) * sizeof(double));
    if (dw) memset(dw, 0, (size_t)(V * H) * sizeof(double));
    for (int64_t i = 0; i < N; i++) {
        loss_rows[i] = 0;
        if (in->act && !in->act[i]) continue;
        const double T = in->T_rows ? in->T_rows[i] : in->T;
        const double TT = in->T_T_rows ? in->T_T_rows[i] : in->T_T > 0 ? in->T_T : T;
        for (int64_t j = 0; j < V; j++) {
            u[j] = dot(in->h + i * H, in->w + j * H, H);
            z[j] = (in->cap > 0 ? in->cap * tanh(u[j] / in->cap) : u[j]) / T;
        }
        log_softmax(z, V, lq);
        if (in->th) {
            for (int64_t j = 0; j < V; j++)
                z[j] = dot(in->th + i * in->HT, in->tw + j * in->HT, in->HT) / TT;
            log_softmax(z, V, lp);
            loss_rows[i] = row_dense(in, lq, lp, dz);
        } else {
            loss_rows[i] = row_sparse(in, lq, in->ids + i * in->K, in->lp + i * in->K, mark, dz);
        }
        const double sc = in->scale ? in->scale[i] : 1.0;
        for (int64_t j = 0; j < V; j++) {
            double f = 1;
            if (in->cap > 0) {
                const double t = tanh(u[j] / in->cap);
                f = 1 - t * t;
            }
            const double du = dz[j] / T * f * sc;
            if (du == 0) continue;
            for (int64_t k = 0; k < H; k++) {
                if (dh) dh[i * H + k] += du * in->w[j * H + k];
                if (dw) dw[j * H + k] += du * in->h[i * H + k];
            }
        }
    }
    sph_free(u), sph_free(mark);
    return SPH_OK;
}

// ---- the reference backend (host contexts, force_kernel "ref") ----------------------------

static double elem(const void *base, sph_dtype dt, int64_t k) {
    if (dt.bits == 32) return ((const float *)base)[k];
    const uint16_t v = ((const uint16_t *)base)[k];
    return dt.code == SPH_DTYPE_BFLOAT ? sph_bf16_to_f32(v) : sph_f16_to_f32(v);
}

static double *to_f64(const void *base, sph_dtype dt, int64_t rows, int64_t cols, int64_t ld) {
    double *out = sph_malloc((size_t)(rows * cols) * sizeof(double) + 1);
    if (!out) return NULL;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) out[r * cols + c] = elem(base, dt, r * ld + c);
    return out;
}

static void store(void *base, sph_dtype dt, int64_t k, double v, int acc) {
    if (dt.bits == 32) {
        float *f = base;
        f[k] = (float)(acc ? f[k] + v : v);
        return;
    }
    uint16_t *b = base;
    const int bf = dt.code == SPH_DTYPE_BFLOAT;
    if (acc) v += bf ? sph_bf16_to_f32(b[k]) : sph_f16_to_f32(b[k]);
    b[k] = bf ? sph_f32_to_bf16((float)v) : sph_f32_to_f16((float)v);
}

sph_status sph_distill_ref_run(sph_ctx_t ctx, const sph_distill_plan *dp) {
    const sph_head_plan *hp = &dp->head;
    SPH_CHECK(!hp->comm || hp->comm->size <= 1, SPH_ERR_UNSUPPORTED,
              "distill: the reference backend (force_kernel \"ref\") runs one rank only "
              "(tp_comm of %lld ranks)", (long long)hp->comm->size);
    const int64_t N = hp->N, H = hp->H, V = hp->V_loc, K = dp->K;
    sph_distill_f64 in = {.N = N, .H = H, .V = V, .HT = dp->HT, .K = K, .kind = dp->kind,
                          .beta = dp->beta, .T = hp->temperature, .cap = hp->softcap,
                          .T_T = dp->t_teacher};
    double *trows = hp->temp_rows ? sph_malloc((size_t)N * sizeof(double) + 1) : NULL;
    for (int64_t i = 0; trows && i < N; i++) trows[i] = hp->temp_rows[i];
    in.T_rows = trows;
    double *ttrows = dp->tt_rows ? sph_malloc((size_t)N * sizeof(double) + 1) : NULL;
    for (int64_t i = 0; ttrows && i < N; i++) ttrows[i] = dp->tt_rows[i];
    in.T_T_rows = ttrows;
    double *h = to_f64(hp->hidden, hp->dtype, N, H, hp->ld_h);
    double *w = to_f64(hp->weight, hp->dtype, V, H, hp->ld_w);
    double *th = dp->dense ? to_f64(dp->th, dp->tdtype, N, dp->HT, dp->ld_th) : NULL;
    double *tw = dp->dense ? to_f64(dp->tw, dp->tdtype, V, dp->HT, dp->ld_tw) : NULL;
    double *lp = !dp->dense ? sph_malloc((size_t)(N * K) * sizeof(double) + 1) : NULL;
    int64_t *ids = !dp->dense ? sph_malloc((size_t)(N * K) * sizeof(int64_t) + 1) : NULL;
    uint8_t *act = sph_malloc((size_t)N + 1);
    double *scale = sph_malloc((size_t)N * sizeof(double) + 1);
    double *rows = sph_malloc((size_t)N * sizeof(double) + 1);
    double *dh = hp->dhidden ? sph_malloc((size_t)(N * H) * sizeof(double) + 1) : NULL;
    double *dw = hp->dweight ? sph_malloc((size_t)(V * H) * sizeof(double) + 1) : NULL;
    sph_status st = SPH_OK;
    if ((hp->temp_rows && !trows) || (dp->tt_rows && !ttrows) || !h || !w || (dp->dense && (!th || !tw)) || (!dp->dense && (!lp || !ids)) || !act ||
        !scale || !rows || (hp->dhidden && !dh) || (hp->dweight && !dw))
        st = sph_err(SPH_ERR_ALLOC, "distill reference: out of host memory");
    if (st == SPH_OK) {
        sph_head_active_rows(hp, act);
        for (int64_t i = 0; i < N; i++) scale[i] = sph_distill_row_scale(dp, i);
        for (int64_t i = 0; !dp->dense && i < N; i++)
            for (int64_t k = 0; k < K; k++) {
                const int64_t id = dp->ids_i64 ? ((const int64_t *)dp->ids)[i * dp->ld_ids + k]
                                               : ((const int32_t *)dp->ids)[i * dp->ld_ids + k];
                ids[i * K + k] = id < 0 ? -1 : id - hp->v0;
                lp[i * K + k] = dp->tlp[i * dp->ld_tlp + k];
            }
        in.h = h, in.w = w, in.th = th, in.tw = tw, in.lp = lp, in.ids = ids, in.act = act;
        in.scale = scale;
        st = sph_distill_ref_f64(&in, rows, dh, dw);
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; st == SPH_OK && i < N; i++)
            if (act[i] && !isfinite(rows[i])) bad++, first = first < 0 ? i : first;
        if (st == SPH_OK && bad) {
            sph_ctx_note_nonfinite(ctx, bad, first);
            st = sph_err(SPH_ERR_NONFINITE,
                         "distill: %lld active rows with a non-finite loss, the first row %lld "
                         "(NaN / inf in the inputs); nothing written",
                         (long long)bad, (long long)first);
        }
        if (st == SPH_OK) {
            double tot = 0;
            for (int64_t i = 0; i < N; i++) tot += rows[i];
            if (dp->reduction == SPH_REDUCTION_NONE)
                for (int64_t i = 0; i < N; i++) dp->loss[i] = (float)rows[i];
            else
                dp->loss[0] = (float)sph_distill_reduce(dp, tot);
            for (int64_t i = 0; dh && i < N; i++)
                for (int64_t k = 0; k < H; k++)
                    if (act[i] || !hp->acc_dh)
                        store(hp->dhidden, hp->dh_dtype, i * hp->ld_dh + k, dh[i * H + k],
                              hp->acc_dh);
            for (int64_t j = 0; dw && j < V; j++)
                for (int64_t k = 0; k < H; k++)
                    store(hp->dweight, hp->dw_dtype, j * hp->ld_dw + k, dw[j * H + k],
                          hp->acc_dw);
        }
    }
    sph_free(h), sph_free(w), sph_free(th), sph_free(tw), sph_free(lp), sph_free(ids);
    sph_free(act), sph_free(scale), sph_free(rows), sph_free(dh), sph_free(dw), sph_free(trows);
    sph_free(ttrows);
    return st;
}
