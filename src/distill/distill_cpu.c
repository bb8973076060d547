/*
 * distill_cpu.c - the CPU backend of the distillation losses: chunks of R active rows, the
 * whole shard of logits of each chunk staged in fp32 (the student's, and the teacher's when
 * dense), products through OpenBLAS sgemm (threads over vocabulary tiles, as head_cpu.c),
 * row statistics complete per chunk, then dz in place and the gradient products.
 *
 * Per chunk:
 *   1. Hc (R, H) <- the chunk's hidden rows in f32 (HTc (R, H_T) the teacher's);
 *      Zs = Hc W^T, Zt = HTc Wt^T, tile by tile; softcap and 1 / T in place (z, y).
 *   2. Records per row: dense (m, s) of z and of y; sparse (m, s) of z over the tail columns
 *      (the listed ones masked) and z of each listed id (0 on the ranks not owning it).
 *      TP: one allgather, merged in rank order (deterministic).
 *   3. Dense: per row the partial (loss, S = sum_j a_j) over this shard (a_j kept in Zt),
 *      summed over the group in rank order (a second allgather). Sparse: every bin is in the
 *      record, so loss and S are complete.
 *   4. du_j = (a_b(j) e^(lq_j - lq_b) - q_j S) c_i / T (softcap: times 1 - tanh^2) in Zs.
 *   5. dWacc += Zs^T Hc per vocabulary tile (the thread owning the tile owns those rows);
 *      dHc = Zs W (threads over columns of H), scattered into dhidden.
 * Cost: 6 N_active H V (+ 2 N_active H_T V dense); the staged logits are 4 R V_loc bytes (x2
 * dense), R from chunk_rows or chunk_bytes (the group's widest shard: ranks agree on R).
 * Workspace (exact): rows (N), Hc, HTc, Zs, Zt, dHc, saved listed logits (R K), records (R
 * and P R of them), per-row scratch, loss rows (N), the f32 weights when they are bf16 / f16
 * (V_loc H, V_loc H_T: converted once per call), and the f32 dweight accumulator (V_loc H;
 * dweight is written once, at the end).
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "comm/comm.h"
#include "distill/distill.h"
#include "distill/distill_math.h"
#include "head/cpu_kernels.h"

#define VT 256
#define R_MAX 256

typedef struct layout {
    int64_t n_act, R, rw, P, T;
    int half_s, half_t;
    size_t o_rows, o_hc, o_htc, o_zs, o_zt, o_dhc, o_sav, o_rec, o_gath, o_row, o_it, o_lrows, o_ws,
        o_wt, o_dw, total;
} layout;

static size_t take(size_t *off, size_t bytes) {
    size_t o = *off;
    *off += (bytes + 63) & ~(size_t)63;
    return o;
}

static int64_t rec_width(const sph_distill_plan *dp) { return dp->dense ? 4 : 2 + dp->K; }

static void make_layout(sph_ctx_t ctx, const sph_distill_plan *dp, layout *L) {
    const sph_head_plan *hp = &dp->head;
    memset(L, 0, sizeof *L);
    L->n_act = sph_head_count_active(hp);
    L->P = hp->comm ? hp->comm->size : 1;
    L->T = ctx->num_threads;
    const int64_t vper = (hp->V + L->P - 1) / L->P; /* the same on every rank */
    int64_t R = ctx->chunk_rows;
    if (R <= 0) {
        R = ctx->chunk_bytes / (4 * (vper > hp->V_loc ? vper : hp->V_loc) * (dp->dense ? 2 : 1));
        R = R < 1 ? 1 : R > R_MAX ? R_MAX : R;
    }
    L->R = R;
    L->rw = rec_width(dp);
    L->half_s = hp->dtype.bits != 32;
    L->half_t = dp->dense && dp->tdtype.bits != 32;
    const size_t N = (size_t)hp->N, Rz = (size_t)R, V = (size_t)hp->V_loc, H = (size_t)hp->H;
    const size_t HT = (size_t)dp->HT, f = sizeof(float), d = sizeof(double);
    size_t off = 64;
    L->o_rows = take(&off, N * sizeof(int64_t));
    L->o_hc = take(&off, Rz * H * f);
    L->o_htc = take(&off, dp->dense ? Rz * HT * f : 0);
    L->o_zs = take(&off, Rz * V * f);
    L->o_zt = take(&off, dp->dense ? Rz * V * f : 0);
    L->o_dhc = take(&off, hp->dhidden ? Rz * H * f : 0);
    L->o_sav = take(&off, dp->dense ? 0 : Rz * (size_t)dp->K * f);
    L->o_rec = take(&off, Rz * (size_t)L->rw * d);
    L->o_gath = take(&off, L->P > 1 ? (size_t)L->P * Rz * (size_t)L->rw * d : 0);
    L->o_row = take(&off, Rz * 4 * d);
    L->o_it = take(&off, Rz * f);
    L->o_lrows = take(&off, N * d);
    L->o_ws = take(&off, L->half_s ? V * H * f : 0);
    L->o_wt = take(&off, L->half_t ? V * HT * f : 0);
    L->o_dw = take(&off, hp->dweight ? V * H * f : 0);
    L->total = off;
}

sph_status sph_distill_cpu_workspace(sph_ctx_t ctx, const sph_distill_plan *dp, size_t *bytes) {
    layout L;
    make_layout(ctx, dp, &L);
    *bytes = L.total;
    return SPH_OK;
}

typedef struct run {
    const sph_distill_plan *dp;
    const sph_head_plan *hp;
    layout L;
    char *ws;
    sph_head_kern k;
    const int64_t *rows;
    const float *w, *tw; /* f32 weights (the caller's or converted) */
    int64_t ld_w, ld_tw;
    float inv_tt, cap; /* inv_tt 0: the teacher takes the row's student temperature */
} run;

static void *at(const run *r, size_t off) { return r->ws + off; }

static int64_t id_of(const sph_distill_plan *dp, int64_t i, int64_t k) {
    return dp->ids_i64 ? ((const int64_t *)dp->ids)[i * dp->ld_ids + k]
                       : (int64_t)((const int32_t *)dp->ids)[i * dp->ld_ids + k];
}

static void load(const run *r, const void *base, sph_dtype dt, int64_t off, int64_t n,
                 float *dst) {
    if (dt.bits == 32)
        memcpy(dst, (const float *)base + off, (size_t)n * sizeof(float));
    else
        r->k.cvt((const uint16_t *)base + off, dst, n, dt.code == SPH_DTYPE_BFLOAT);
}

/* (m, s) += (m2, s2), exact up to rounding; m = -inf holds s = 0. */
static void merge_ms(double *m, double *s, double m2, double s2) {
    if (m2 == -INFINITY && s2 == 0) return;
    if (*m == -INFINITY && *s == 0) {
        *m = m2, *s = s2;
        return;
    }
    const double M = *m > m2 ? *m : m2;
    *s = *s * exp(*m - M) + s2 * exp(m2 - M);
    *m = M;
}

/* max and sum e^(x - max) of a float row in float64, entries -inf skipped. */
static void row_ms(const float *x, int64_t n, double *m, double *s) {
    float mx = -INFINITY;
    int nan = 0;
    for (int64_t j = 0; j < n; j++) {
        mx = x[j] > mx ? x[j] : mx;
        nan |= x[j] != x[j];
    }
    double acc = 0;
    if (mx != -INFINITY)
        for (int64_t j = 0; j < n; j++) acc += exp((double)x[j] - mx);
    *m = nan ? NAN : mx;
    *s = nan ? NAN : acc;
}

// ---- one chunk ---------------------------------------------------------------------------

/* Steps 1 and 2: the chunk's logits (transformed in place) and its local records. */
static void chunk_logits(const run *r, int64_t c0, int64_t nr) {
    const sph_distill_plan *dp = r->dp;
    const sph_head_plan *hp = r->hp;
    const layout *L = &r->L;
    float *hc = at(r, L->o_hc), *htc = at(r, L->o_htc), *zs = at(r, L->o_zs),
          *zt = at(r, L->o_zt);
    const int64_t V = hp->V_loc, H = hp->H, HT = dp->HT, nvt = (V + VT - 1) / VT;
#pragma omp parallel num_threads(L->T)
    {
#pragma omp for schedule(static)
        for (int64_t q = 0; q < nr; q++) {
            const int64_t i = r->rows[c0 + q];
            load(r, hp->hidden, hp->dtype, i * hp->ld_h, H, hc + q * H);
            if (dp->dense) load(r, dp->th, dp->tdtype, i * dp->ld_th, HT, htc + q * HT);
        }
#pragma omp for schedule(static)
        for (int64_t tv = 0; tv < nvt; tv++) {
            const int64_t v = tv * VT, w = V - v < VT ? V - v : VT;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, (int)w, (int)H, 1.0f,
                        hc, (int)H, r->w + v * r->ld_w, (int)r->ld_w, 0.0f, zs + v, (int)V);
            if (dp->dense)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, (int)w, (int)HT,
                            1.0f, htc, (int)HT, r->tw + v * r->ld_tw, (int)r->ld_tw, 0.0f,
                            zt + v, (int)V);
        }
#pragma omp for schedule(static)
        for (int64_t q = 0; q < nr; q++) {
            const int64_t i = r->rows[c0 + q];
            float *x = zs + q * V;
            double *rec = (double *)at(r, L->o_rec) + q * L->rw;
            const float it = sph_plan_row_inv_t(hp, i); /* the row's 1 / T */
            ((float *)at(r, L->o_it))[q] = it;
            if (r->cap > 0)
                for (int64_t j = 0; j < V; j++) x[j] = r->cap * tanhf(x[j] / r->cap) * it;
            else
                for (int64_t j = 0; j < V; j++) x[j] *= it;
            if (dp->dense) {
                float *y = zt + q * V;
                /* the teacher's 1 / T_T: its row's, its scalar's, or the student's */
                const float itt = dp->tt_rows ? (float)(1.0 / (double)dp->tt_rows[i])
                                  : r->inv_tt > 0 ? r->inv_tt
                                                  : it;
                for (int64_t j = 0; j < V; j++) y[j] *= itt;
                row_ms(x, V, &rec[0], &rec[1]);
                row_ms(y, V, &rec[2], &rec[3]);
                continue;
            }
            float *sav = (float *)at(r, L->o_sav) + q * dp->K;
            for (int64_t k = 0; k < dp->K; k++) { /* mask the listed columns of this shard */
                const int64_t c = id_of(dp, i, k) - hp->v0;
                rec[2 + k] = 0;
                if (c < 0 || c >= V || id_of(dp, i, k) < 0) continue;
                sav[k] = x[c];
                rec[2 + k] = x[c];
                x[c] = -INFINITY;
            }
            row_ms(x, V, &rec[0], &rec[1]);
            for (int64_t k = 0; k < dp->K; k++) {
                const int64_t c = id_of(dp, i, k) - hp->v0;
                if (c >= 0 && c < V && id_of(dp, i, k) >= 0) x[c] = sav[k];
            }
        }
    }
}

/* The group's records: gathered and merged in rank order ((m, s) pairs merge, the rest adds). */
static sph_status combine(const run *r, int64_t nr, int pairs, int64_t width, double *rec) {
    const layout *L = &r->L;
    if (L->P <= 1) return SPH_OK;
    double *g = at(r, L->o_gath);
    sph_comm_t c = r->hp->comm;
    const size_t bytes = (size_t)(nr * width) * sizeof(double); /* every rank: the same nr */
    sph_status st = c->ops->allgather(c, rec, g, bytes, NULL);
    if (st != SPH_OK) return sph_err_prefix(st, "distill: tp_comm: allgather: ");
    for (int64_t q = 0; q < nr; q++) {
        double *o = rec + q * width;
        for (int64_t f = 0; f < width; f++) o[f] = f < 2 * pairs ? (f % 2 ? 0 : -INFINITY) : 0;
        for (int64_t k = 0; k < L->P; k++) {
            const double *a = g + (size_t)k * (size_t)(nr * width) + q * width;
            for (int p = 0; p < pairs; p++) merge_ms(&o[2 * p], &o[2 * p + 1], a[2 * p], a[2 * p + 1]);
            for (int64_t f = 2 * pairs; f < width; f++) o[f] += a[f];
        }
    }
    return SPH_OK;
}

static float cap_factor(const run *r, float z, float inv_t) {
    if (r->cap <= 0) return 1.0f;
    const float t = z / (inv_t * r->cap); /* z = cap tanh(u / cap) / T */
    return 1.0f - t * t;
}

/* Dense step 3: per row (loss, S) over this shard, a_j into Zt. */
static void dense_partials(const run *r, int64_t nr, const double *rec, double *part) {
    const sph_distill_plan *dp = r->dp;
    const int64_t V = r->hp->V_loc;
    float *zs = at(r, r->L.o_zs), *zt = at(r, r->L.o_zt);
#pragma omp parallel for num_threads(r->L.T) schedule(static)
    for (int64_t q = 0; q < nr; q++) {
        const double *o = rec + q * 4;
        const double ls = o[0] + log(o[1]), lt = o[2] + log(o[3]);
        double loss = 0, S = 0, l, a;
        const float *x = zs + q * V;
        float *y = zt + q * V;
        for (int64_t j = 0; j < V; j++) {
            sph_dm_term(dp->kind, dp->beta, x[j] - ls, y[j] - lt, &l, &a);
            loss += l, S += a;
            y[j] = (float)a;
        }
        part[q * 2] = loss, part[q * 2 + 1] = S;
    }
}

/* Step 4, dense: du in Zs from a_j (Zt), S and the row's scale. */
static void dense_du(const run *r, int64_t c0, int64_t nr, const double *rec, const double *sums) {
    const int64_t V = r->hp->V_loc;
    float *zs = at(r, r->L.o_zs), *zt = at(r, r->L.o_zt);
#pragma omp parallel for num_threads(r->L.T) schedule(static)
    for (int64_t q = 0; q < nr; q++) {
        const double ls = rec[q * 4] + log(rec[q * 4 + 1]), S = sums[q * 2 + 1];
        const float it = ((const float *)at(r, r->L.o_it))[q];
        const double c = sph_distill_row_scale(r->dp, r->rows[c0 + q]) * it;
        float *x = zs + q * V;
        const float *a = zt + q * V;
        for (int64_t j = 0; j < V; j++) {
            const double qj = exp((double)x[j] - ls);
            x[j] = (float)((a[j] - qj * S) * c) * cap_factor(r, x[j], it);
        }
    }
}

/* Steps 3 and 4, sparse: the bins from the combined record, loss, and du in Zs. */
static void sparse_rows(const run *r, int64_t c0, int64_t nr, const double *rec, double *lrows,
                        int grads) {
    const sph_distill_plan *dp = r->dp;
    const sph_head_plan *hp = r->hp;
    const int64_t V = hp->V_loc, K = dp->K, w = r->L.rw;
    float *zs = at(r, r->L.o_zs);
#pragma omp parallel for num_threads(r->L.T) schedule(static)
    for (int64_t q = 0; q < nr; q++) {
        const int64_t i = r->rows[c0 + q];
        const double *o = rec + q * w;
        float *sav = (float *)at(r, r->L.o_sav) + q * K; /* becomes a_k */
        double M = o[0], psum = 0;
        int64_t nvalid = 0;
        for (int64_t k = 0; k < K; k++)
            if (id_of(dp, i, k) >= 0) {
                M = o[2 + k] > M ? o[2 + k] : M;
                psum += exp((double)dp->tlp[i * dp->ld_tlp + k]);
                nvalid++;
            }
        double tot = o[1] > 0 ? o[1] * exp(o[0] - M) : 0;
        for (int64_t k = 0; k < K; k++)
            if (id_of(dp, i, k) >= 0) tot += exp(o[2 + k] - M);
        const double lse = M + log(tot);
        const double lqr = nvalid < hp->V && o[1] > 0 ? o[0] + log(o[1]) - lse : -INFINITY;
        const double pr = psum < 1 ? 1 - psum : 0.0;
        const int tail = nvalid < hp->V && !(dp->kind == SPH_DK_REV && pr == 0);
        double loss = 0, S = 0, l, a, ar = 0;
        for (int64_t k = 0; k < K; k++) {
            if (id_of(dp, i, k) < 0) continue;
            sph_dm_term(dp->kind, dp->beta, o[2 + k] - lse, dp->tlp[i * dp->ld_tlp + k], &l, &a);
            loss += l, S += a;
            sav[k] = (float)a;
        }
        if (tail) {
            sph_dm_term(dp->kind, dp->beta, lqr, pr > 0 ? log(pr) : -INFINITY, &l, &ar);
            loss += l, S += ar;
        }
        lrows[i] = loss;
        if (!grads) continue;
        const float it = ((const float *)at(r, r->L.o_it))[q];
        const double c = sph_distill_row_scale(dp, i) * it;
        float *x = zs + q * V;
        for (int64_t j = 0; j < V; j++) {
            const double lq = (double)x[j] - lse;
            const double t = tail ? exp(lq - lqr) * ar : 0.0;
            x[j] = (float)((t - exp(lq) * S) * c) * cap_factor(r, x[j], it);
        }
        for (int64_t k = 0; k < K; k++) {
            const int64_t col = id_of(dp, i, k) - hp->v0;
            if (id_of(dp, i, k) < 0 || col < 0 || col >= V) continue;
            const float z = (float)o[2 + k];
            x[col] = (float)((sav[k] - exp(o[2 + k] - lse) * S) * c) * cap_factor(r, z, it);
        }
    }
}

/* Step 5: dWacc += Zs^T Hc, dHc = Zs W, scattered into dhidden. */
static void chunk_grads(const run *r, int64_t c0, int64_t nr) {
    const sph_head_plan *hp = r->hp;
    const layout *L = &r->L;
    const int64_t V = hp->V_loc, H = hp->H, nvt = (V + VT - 1) / VT, hb = 64,
                  nhb = (H + hb - 1) / hb;
    const float *hc = at(r, L->o_hc), *zs = at(r, L->o_zs);
    float *dwa = at(r, L->o_dw), *dhc = at(r, L->o_dhc);
#pragma omp parallel num_threads(L->T)
    {
        if (hp->dweight) {
#pragma omp for schedule(static)
            for (int64_t tv = 0; tv < nvt; tv++) {
                const int64_t v = tv * VT, w = V - v < VT ? V - v : VT;
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)w, (int)H, (int)nr,
                            1.0f, zs + v, (int)V, hc, (int)H, 1.0f, dwa + v * H, (int)H);
            }
        }
        if (hp->dhidden) {
#pragma omp for schedule(static)
            for (int64_t b = 0; b < nhb; b++) {
                const int64_t h0 = b * hb, n = H - h0 < hb ? H - h0 : hb;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nr, (int)n, (int)V,
                            1.0f, zs, (int)V, r->w + h0, (int)r->ld_w, 0.0f, dhc + h0, (int)H);
            }
#pragma omp for schedule(static)
            for (int64_t q = 0; q < nr; q++) {
                const int64_t i = r->rows[c0 + q];
                for (int64_t k = 0; k < H; k++)
                    sph_head_store_f32(hp->dhidden, hp->dh_dtype, i * hp->ld_dh + k,
                                       dhc[q * H + k], hp->acc_dh);
            }
        }
    }
}

// ---- the pass ----------------------------------------------------------------------------

static int64_t first_nonfinite(const run *r, int64_t c0, int64_t nr, const double *rec,
                               int64_t *count) {
    int64_t first = -1;
    *count = 0;
    for (int64_t q = 0; q < nr; q++) {
        const double *o = rec + q * r->L.rw;
        int bad = !(isfinite(o[0]) || o[0] == -INFINITY) || !isfinite(o[1]);
        if (r->dp->dense) bad |= !isfinite(o[0]) || !isfinite(o[2]) || !isfinite(o[3]);
        for (int64_t f = 2; !r->dp->dense && f < r->L.rw; f++) bad |= !isfinite(o[f]);
        if (bad) {
            (*count)++;
            if (first < 0) first = r->rows[c0 + q];
        }
    }
    return first;
}

static sph_status setup(sph_ctx_t ctx, const sph_distill_plan *dp, void *ws, size_t bytes,
                        run *r) {
    memset(r, 0, sizeof *r);
    r->dp = dp;
    r->hp = &dp->head;
    make_layout(ctx, dp, &r->L);
    SPH_CHECK(bytes >= r->L.total && ws != NULL, SPH_ERR_WORKSPACE,
              "workspace: %zu bytes, expected >= %zu (sph_distill_loss_workspace_size)", bytes,
              r->L.total);
    r->ws = (char *)(((uintptr_t)ws + 63) & ~(uintptr_t)63) - 64;
    r->k = *ctx->head.cpu_kern;
    const sph_head_plan *hp = r->hp;
    r->inv_tt = dp->t_teacher > 0 ? (float)(1.0 / dp->t_teacher) : 0.0f;
    r->cap = (float)hp->softcap;
    int64_t *rows = at(r, r->L.o_rows), n = 0;
    uint8_t *act = (uint8_t *)at(r, r->L.o_lrows); /* scratch before the loss rows are used */
    sph_head_active_rows(hp, act);
    for (int64_t i = 0; i < hp->N; i++)
        if (act[i]) rows[n++] = i;
    r->rows = rows;
    memset(at(r, r->L.o_lrows), 0, (size_t)hp->N * sizeof(double));
    r->w = hp->weight, r->ld_w = hp->ld_w;
    r->tw = dp->tw, r->ld_tw = dp->ld_tw;
    if (r->L.half_s) {
        float *w = at(r, r->L.o_ws);
        for (int64_t j = 0; j < hp->V_loc; j++)
            load(r, hp->weight, hp->dtype, j * hp->ld_w, hp->H, w + j * hp->H);
        r->w = w, r->ld_w = hp->H;
    }
    if (r->L.half_t) {
        float *w = at(r, r->L.o_wt);
        for (int64_t j = 0; j < hp->V_loc; j++)
            load(r, dp->tw, dp->tdtype, j * dp->ld_tw, dp->HT, w + j * dp->HT);
        r->tw = w, r->ld_tw = dp->HT;
    }
    if (hp->dweight) memset(at(r, r->L.o_dw), 0, (size_t)(hp->V_loc * hp->H) * sizeof(float));
    return SPH_OK;
}

static sph_status finish(const run *r) {
    const sph_distill_plan *dp = r->dp;
    const sph_head_plan *hp = r->hp;
    if (hp->dhidden && !hp->acc_dh) { /* inactive rows: exact zeros */
        int64_t q = 0;
        for (int64_t i = 0; i < hp->N; i++) {
            if (q < r->L.n_act && r->rows[q] == i) {
                q++;
                continue;
            }
            for (int64_t k = 0; k < hp->H; k++)
                sph_head_store_f32(hp->dhidden, hp->dh_dtype, i * hp->ld_dh + k, 0, 0);
        }
    }
    if (hp->dweight) {
        const float *a = at(r, r->L.o_dw);
        for (int64_t j = 0; j < hp->V_loc; j++)
            for (int64_t k = 0; k < hp->H; k++)
                sph_head_store_f32(hp->dweight, hp->dw_dtype, j * hp->ld_dw + k, a[j * hp->H + k],
                                   hp->acc_dw);
    }
    if (hp->allreduce_dh && hp->comm && hp->comm->size > 1) {
        sph_status st = hp->comm->ops->allreduce_sum_f32(hp->comm, hp->dhidden,
                                                         (size_t)(hp->N * hp->H), NULL);
        if (st != SPH_OK) return sph_err_prefix(st, "distill: allreduce_dhidden: ");
    }
    const double *lr = at(r, r->L.o_lrows);
    if (dp->reduction == SPH_REDUCTION_NONE) {
        for (int64_t i = 0; i < hp->N; i++) dp->loss[i] = (float)lr[i];
    } else {
        double tot = 0;
        for (int64_t i = 0; i < hp->N; i++) tot += lr[i];
        dp->loss[0] = (float)sph_distill_reduce(dp, tot);
    }
    return SPH_OK;
}

sph_status sph_distill_cpu_run(sph_ctx_t ctx, const sph_distill_plan *dp, void *ws,
                               size_t bytes) {
    run r;
    SPH_TRY(setup(ctx, dp, ws, bytes, &r));
    const sph_head_plan *hp = r.hp;
    const int grads = hp->dhidden || hp->dweight;
    double *rec = at(&r, r.L.o_rec), *part = at(&r, r.L.o_row);
    double *lrows = at(&r, r.L.o_lrows);
    for (int64_t c0 = 0; c0 < r.L.n_act; c0 += r.L.R) {
        const int64_t nr = r.L.n_act - c0 < r.L.R ? r.L.n_act - c0 : r.L.R;
        chunk_logits(&r, c0, nr);
        SPH_TRY(combine(&r, nr, dp->dense ? 2 : 1, r.L.rw, rec));
        int64_t count = 0, first = first_nonfinite(&r, c0, nr, rec, &count);
        if (first >= 0) {
            sph_ctx_note_nonfinite(ctx, count, first);
            /* NaN / inf in an active hidden row was refused before the sweep (distill.c),
             * and a non-finite weight shows in the first chunk: what reaches a later chunk
             * here is finite inputs whose logits overflow float */
            return sph_err(SPH_ERR_NONFINITE,
                           "distill: %lld active rows with non-finite statistics (NaN / inf in "
                           "weight or teacher_weight, or logits beyond float), the first row "
                           "%lld; loss and dweight not written%s", (long long)count,
                           (long long)first,
                           c0 > 0 && hp->dhidden ? ", dhidden rows of the earlier chunks "
                                                   "already written (logits beyond float)"
                                                 : "; nothing written");
        }
        if (dp->dense) {
            dense_partials(&r, nr, rec, part);
            SPH_TRY(combine(&r, nr, 0, 2, part));
            for (int64_t q = 0; q < nr; q++) lrows[r.rows[c0 + q]] = part[q * 2];
            if (grads) dense_du(&r, c0, nr, rec, part);
        } else {
            sparse_rows(&r, c0, nr, rec, lrows, grads);
        }
        if (grads) chunk_grads(&r, c0, nr);
    }
    return finish(&r);
}
