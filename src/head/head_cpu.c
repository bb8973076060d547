/*
 * head_cpu.c - the optimized CPU backend of the LM head: row chunks x vocab tiles, tile
 * products through OpenBLAS sgemm, the softmax and gradient epilogues fused on the tiles
 * while they are in cache, OpenMP threads over vocab tiles (no atomics), ISA-dispatched
 * epilogue loops (cpu_kernels.h). Same math as head_ref.c (see there and spanhead.h).
 *
 * Rows. Only active rows are ever computed: their indices are gathered into a list, and a
 * chunk is R consecutive entries of that list, its hidden rows packed into Hc (R, H) f32
 * (bf16/f16 converted once per chunk). Masked cost is therefore proportional to the active
 * rows, whatever their pattern.
 *
 * Forward (per chunk): every thread owns whole vocab tiles of width vt; it forms the tile
 *   L = Hc W_tile^T (sgemm; a bf16/f16 weight tile is converted once per tile per chunk),
 *   reduces each row to a partial record (m, s, d, zt, sz) of that tile (cpu_kernels.h).
 *   Records merge per row in tile order (deterministic, independent of the thread count),
 *   then across the TP group in rank order (combine.c, one allgather per forward).
 * Backward (per chunk): D (R, V_loc) is the chunk buffer. Per tile: recompute L into D's
 *   columns, turn it into dlogits in place, dW_tile += D_tile^T Hc (the thread owning the
 *   tile owns those dW rows). Then dHc = D W, split over H columns among threads.
 * One-pass (forward with dhidden/dweight): each chunk's logits are computed once into D,
 *   reduced to records, combined (one allgather per chunk: ranks agree on the chunking
 *   because R depends only on N_active, V and the context options), and turned into
 *   dlogits in place: 6 N_active H V flops instead of 8.
 * Sample support (candidates): per row gather the K candidate weight rows of this shard,
 *   K dots, softmax over the set. dH per row; dW scatter-added by per-thread ownership of
 *   vocab ranges, each range visiting rows in order (deterministic for any thread count).
 *
 * Workspace (exact, queried): the active-row list (N), per-row records (N x
 *   SPH_PARTIAL_FIELDS doubles, and x TP size for the gather), Hc and dHc (R x H),
 *   D (R x V_loc, backward / one-pass),
 *   per thread one logits tile (R x vt) and one converted weight tile (vt x H), and, when
 *   dweight is bf16/f16, an f32 accumulator of dweight's shape (rounded once at the end).
 *   Never O(N x V).
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "comm/comm.h"
#include "head/cpu_kernels.h"
#include "head/host.h"

#define VT_DEFAULT 256
#define R_DEFAULT 512
#define COL_BLOCK 64

/* A row's gradient coefficients. The shift: y = (x - xs) ys = z - m with xs the row max in
 * units of the tile values x (row_shift), ls = log S, dm = mu - m; p = e^(y - ls),
 * mu - z = dm - y. */
typedef struct coef {
    float xs, ys, ls, A, e, dm, C, g; /* A = gl - g */
    float it; /* the row's 1 / T (row_it) */
    int64_t t; /* target as a local column, or -1 when ignored / in another shard */
} coef;

/* A thread's top-k entry: a tile value (u, or z when softcapped: ordered as z) and its local
 * column, col -1 = empty; sorted best first (larger x, then the lower column). */
typedef struct topk_tent {
    float x;
    int32_t col;
} topk_tent;

typedef struct layout {
    int64_t n_act, R, vt, n_vt, T, ranks;
    int half, need_D, dw_buf;
    size_t o_rows, o_rec, o_crec, o_gath, o_hc, o_dhc, o_d, o_tile, o_wt, o_part, o_coef, o_du, o_dw;
    size_t o_part2, o_mq, o_cmq, o_q; /* sum_p2 only: tile q, (m, q) by row and by chunk row, Q */
    size_t o_tkt, o_tkm, o_ctk, o_tk, o_tkg; /* topk only: thread lists, merge scratch, chunk
                                                lists, row lists, the gathered ones */
    size_t tile_floats, wt_floats; /* per thread */
    size_t total;
} layout;

/* Bytes per thread of the tile area: the logits tile, then (64-byte aligned) the converted
 * weight tile. */
static size_t thread_stride(const layout *L) {
    size_t tile = ((L->tile_floats * sizeof(float)) + 63) & ~(size_t)63;
    return (tile + L->wt_floats * sizeof(float) + 63) & ~(size_t)63;
}

static size_t take(size_t *off, size_t bytes) {
    size_t o = *off;
    *off += (bytes + 63) & ~(size_t)63;
    return o;
}

static sph_status make_layout(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p,
                              layout *L) {
    memset(L, 0, sizeof *L);
    /* cblas takes int sizes and leading dimensions */
    SPH_CHECK(p->H <= INT32_MAX && p->V_loc <= INT32_MAX && p->ld_h <= INT32_MAX &&
                  p->ld_w <= INT32_MAX && p->ld_dw <= INT32_MAX,
              SPH_ERR_UNSUPPORTED,
              "head: H = %lld, V_loc = %lld or a row stride exceeds the int range of BLAS",
              (long long)p->H, (long long)p->V_loc);
    const int grads = pass == SPH_HEAD_BACKWARD || p->one_pass;
    L->n_act = sph_head_count_active(p);
    L->T = ctx->num_threads > 0 ? ctx->num_threads : 1;
    L->ranks = p->comm && p->comm->size > 1 ? p->comm->size : 1;
    L->half = p->dtype.bits == 16;
    L->vt = p->V_loc < VT_DEFAULT ? p->V_loc : VT_DEFAULT;
    L->n_vt = (p->V_loc + L->vt - 1) / L->vt;
    L->need_D = grads && p->K == 0;
    L->dw_buf = grads && p->dweight && !sph_dtype_eq(p->dw_dtype, SPH_F32);
    /* chunk rows: the caller's choice, else R_DEFAULT; the chunk buffer D stays within
     * chunk_bytes. Vref makes every rank of a TP group pick the same R. */
    int64_t R = ctx->chunk_rows > 0 ? ctx->chunk_rows : R_DEFAULT;
    int64_t Vref = L->ranks > 1 ? (p->V + L->ranks - 1) / L->ranks : p->V_loc;
    if (L->need_D) {
        int64_t cap = ctx->chunk_bytes / (4 * (Vref > 0 ? Vref : 1));
        if (R > cap) R = cap;
    }
    if (p->K) R = L->n_act; /* support mode works on whole rows, no chunks */
    if (R > L->n_act) R = L->n_act;
    if (R < 1) R = 1;
    L->R = R;
    size_t off = 64, t, n;
    bool ok = true;
    const size_t f4 = sizeof(float), d8 = sizeof(double);
    size_t Nz = (size_t)p->N, H = (size_t)p->H, Rz = (size_t)R, Vl = (size_t)p->V_loc;
    L->o_rows = take(&off, Nz * sizeof(int64_t));
    L->o_rec = take(&off, (Nz > 8 ? Nz : 8) * SPH_PARTIAL_FIELDS * d8);
    L->o_crec = take(&off, Rz * SPH_PARTIAL_FIELDS * d8);
    ok &= sph_mul_size(Nz > Rz ? Nz : Rz, SPH_PARTIAL_FIELDS * d8 * (size_t)L->ranks, &n);
    L->o_gath = take(&off, L->ranks > 1 ? n : 0);
    L->o_coef = take(&off, Rz * sizeof(coef));
    /* sum_p2 (forward): (m, q) of every row and of the chunk's rows, the combined Q by row */
    const int sp2 = pass == SPH_HEAD_FORWARD && p->sum_p2;
    L->o_mq = take(&off, sp2 ? (Nz + 1) * 2 * d8 : 0);
    L->o_cmq = take(&off, sp2 ? Rz * 2 * d8 : 0);
    L->o_q = take(&off, sp2 ? (Nz > Rz ? Nz : Rz) * d8 : 0);
    if (p->K == 0) {
        ok &= sph_mul_size(Rz, H * f4, &n);
        L->o_hc = take(&off, n);
        L->o_dhc = take(&off, grads && p->dhidden ? n : 0);
        ok &= sph_mul_size(Rz, Vl * f4, &n);
        L->o_d = take(&off, L->need_D ? n : 0);
        L->tile_floats = pass == SPH_HEAD_FORWARD && !p->one_pass ? Rz * (size_t)L->vt : 0;
        L->wt_floats = L->half ? (size_t)L->vt * H : 0;
        ok &= sph_mul_size(Rz * (size_t)L->n_vt, SPH_PARTIAL_FIELDS * f4, &n);
        L->o_part = take(&off, pass == SPH_HEAD_FORWARD ? n : 0);
        ok &= sph_mul_size(Rz, (size_t)L->n_vt * f4, &n);
        L->o_part2 = take(&off, sp2 ? n : 0);
        /* topk (forward): per thread and chunk row a list of the K best (tile value, column),
         * per thread 2 K of merge scratch, the chunk rows' merged lists, every row's (two-pass
         * forward), the gathered lists of the group (+ 2 K of scratch) */
        const size_t Kz = pass == SPH_HEAD_FORWARD ? (size_t)p->topk : 0;
        const size_t e16 = sizeof(sph_topk_ent);
        ok &= sph_mul_size((size_t)L->T * Rz, Kz * sizeof(topk_tent), &n);
        L->o_tkt = take(&off, n);
        L->o_tkm = take(&off, (size_t)L->T * 2 * Kz * e16);
        ok &= sph_mul_size(Rz, Kz * e16, &n);
        L->o_ctk = take(&off, n);
        ok &= sph_mul_size(Nz, Kz * e16, &n);
        L->o_tk = take(&off, p->one_pass ? 0 : n);
        ok &= sph_mul_size((size_t)L->ranks * (Nz > Rz ? Nz : Rz) + 2, Kz * e16, &n);
        L->o_tkg = take(&off, L->ranks > 1 ? n : 0);
    } else {
        L->tile_floats = 3 * (size_t)p->K + 1; /* z of the candidates + their int64 columns */
        L->wt_floats = 2 * H;          /* converted hidden row + weight row */
        ok &= sph_mul_size(Nz, (size_t)p->K * f4, &n);
        L->o_du = take(&off, grads ? n : 0);
    }
    ok &= sph_mul_size((size_t)L->T, thread_stride(L), &t);
    L->o_tile = take(&off, t);
    ok &= sph_mul_size(Vl, H * f4, &n);
    L->o_dw = take(&off, L->dw_buf ? n : 0);
    SPH_CHECK(ok, SPH_ERR_OVERFLOW, "head: workspace size overflows size_t (N = %lld, V_loc = %lld)",
              (long long)p->N, (long long)p->V_loc);
    L->total = off;
    return SPH_OK;
}

sph_status sph_head_cpu_workspace(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p,
                                  size_t *bytes) {
    layout L;
    SPH_TRY(make_layout(ctx, pass, p, &L));
    *bytes = L.total;
    return SPH_OK;
}

// ---- shared pieces -----------------------------------------------------------------------

typedef struct run {
    sph_ctx_t ctx;
    const sph_head_plan *p;
    layout L;
    sph_head_kern k;
    char *ws; /* 64-byte aligned base */
    int64_t *rows;
    float inv_t, cap; /* inv_t: the scalar temperature's; per-row ones through row_it */
} run;

/* Layout offsets start at 64 (the slack that absorbs aligning the caller's pointer). */
static void *at(const run *r, size_t off) { return r->ws + (off - 64); }

static float *thread_tile(const run *r, int tid) {
    return (float *)((char *)at(r, r->L.o_tile) + (size_t)tid * thread_stride(&r->L));
}

static float *thread_wt(const run *r, int tid) {
    return thread_tile(r, tid) + ((r->L.tile_floats + 15) & ~(size_t)15); /* 64-byte step */
}

static int64_t target_of(const sph_head_plan *p, int64_t i) {
    return p->targets ? sph_head_id_at(p->targets, p->tgt_i64, i) : -1;
}

static void load_row(const run *r, const void *base, int64_t off, int64_t n, float *dst) {
    if (!r->L.half) {
        memcpy(dst, (const float *)base + off, (size_t)n * sizeof(float));
    } else {
        r->k.cvt((const uint16_t *)base + off, dst, n, r->p->dtype.code == SPH_DTYPE_BFLOAT);
    }
}

/* The softcapped transform and its derivative factor, scalar (softcap is the rare case). */
static void softcap_rows(float *x, int64_t n, float cap, float inv_t) {
    for (int64_t j = 0; j < n; j++) x[j] = cap * tanhf(x[j] / cap) * inv_t;
}

/* Row i's 1 / T: the scalar's, or float(1 / temperature_rows[i]) (plan.h). */
static float row_it(const run *r, int64_t i) {
    return r->p->temp_rows ? sph_plan_row_inv_t(r->p, i) : r->inv_t;
}

static float cap_factor(const run *r, float it, float z) {
    if (r->cap <= 0) return 1.0f;
    float th = z / (it * r->cap); /* z = cap tanh(u / cap) / T */
    return 1.0f - th * th;
}

/* What turns a tile value x into z: 1 / T for the raw products u, 1 for softcapped z. */
static float x_scale(const run *r, float it) { return r->cap <= 0 ? it : 1.0f; }

/* x (u, or z when softcapped) -> du in place, without the target term. */
static void grad_row(const run *r, float *x, int64_t n, const coef *c) {
    if (r->cap <= 0) {
        r->k.tile_grad(x, n, c->xs, c->ys, c->ls, c->A, c->e, c->dm, c->C, c->it);
        return;
    }
    for (int64_t j = 0; j < n; j++) {
        float z = x[j], y = (z - c->xs) * c->ys, p = expf(y - c->ls);
        x[j] = (p * (c->A + c->e * (c->dm - y)) + c->C) * c->it * cap_factor(r, c->it, z);
    }
}

/* Row stats of a tile row: (xm, s, d, sz) with xm the row max of the tile values x (tile_z
 * turns it into z). Without softcap x stays the raw product u: z - m = (u - u_max) / T is
 * formed before the scaling, never as a difference of two rounded z of the logits'
 * magnitude (a low temperature). Softcapped, x becomes z in place (bounded by c / T). */
static void stats_row(const run *r, float it, float *x, int64_t n, float out[4]) {
    if (r->cap <= 0) {
        r->k.tile_stats(x, n, it, out);
        return;
    }
    softcap_rows(x, n, r->cap, it);
    sph_head_tile_stats_generic(x, n, 1.0f, out);
}

/* z in float64 of a tile value x (the max, the target): the product of two floats, exact in
 * float64. */
static double tile_z(const run *r, float it, float v) {
    return r->cap <= 0 ? (double)v * (double)it : (double)v;
}

/* Final per-row outputs from a combined record (same rules as the reference). */
static void finalize_row(const run *r, int64_t i, const double *rec, int active) {
    const sph_head_plan *p = r->p;
    double lp = 0, ent = 0, lse = 0, lm = 0, m = 0, mu = 0;
    if (active && !(rec[0] == -INFINITY && rec[1] == 0)) {
        /* shifted record (combine.c): no lse - mu cancellation at any logit magnitude */
        const double ls = log(rec[1]), dm = rec[2] / rec[1];
        lse = rec[0] + ls;
        mu = rec[0] + dm;
        lp = target_of(p, i) >= 0 ? (rec[3] - rec[0]) - ls : 0;
        ent = ls - dm;
        lm = p->K ? 0 : rec[4] / (double)p->V;
        m = rec[0];
    }
    if (p->logprob) p->logprob[i] = (float)lp;
    if (p->entropy) p->entropy[i] = (float)ent;
    if (p->lse) p->lse[i] = (float)lse;
    if (p->logit_mean) p->logit_mean[i] = (float)lm;
    if (p->sum_p2) p->sum_p2[i] = 0; /* active rows: write_sum_p2 after the combine */
    if (p->topk && !active) sph_head_topk_store(p, i, NULL, 0, 0); /* active: write_topk */
    p->stats[i * 3] = (float)m;
    p->stats[i * 3 + 1] = (float)lse;
    p->stats[i * 3 + 2] = (float)mu;
}

/* sum_p2 of the rows rows[0 .. n) from their combined records rec and Q (by row when
 * by_row, else by position q): Q / S^2, both shifted by the same M. */
static void write_sum_p2(const run *r, const int64_t *rows, int64_t n, const double *rec,
                         const double *Q, int by_row) {
    const sph_head_plan *p = r->p;
    if (!p->sum_p2) return;
    for (int64_t q = 0; q < n; q++) {
        const int64_t i = rows[q], k = by_row ? i : q;
        const double *o = rec + k * SPH_PARTIAL_FIELDS;
        p->sum_p2[i] = o[0] == -INFINITY && o[1] == 0 ? 0.0f : (float)(Q[k] / (o[1] * o[1]));
    }
}

/* topk of the rows rows[0 .. n) from their combined records rec and merged lists tk (by row
 * when by_row, else by position q). */
static void write_topk(const run *r, const int64_t *rows, int64_t n, const double *rec,
                       const sph_topk_ent *tk, int by_row) {
    const sph_head_plan *p = r->p;
    if (!p->topk) return;
    for (int64_t q = 0; q < n; q++) {
        const int64_t i = rows[q], k = by_row ? i : q;
        const double *o = rec + k * SPH_PARTIAL_FIELDS;
        sph_head_topk_store(p, i, tk + k * p->topk, o[0], log(o[1]));
    }
}

/* Non-finite policy: the rows (rows[0 .. n), records rec[q] or rec[rows[q]] when by_row) whose
 * combined statistics are not finite. Empty records (a support row with no candidate in any
 * shard) are finite: they give zeros. */
static int64_t nonfinite_rows(const double *rec, const int64_t *rows, int64_t n, int by_row,
                              int64_t *first) {
    int64_t bad = 0;
    *first = -1;
    for (int64_t q = 0; q < n; q++) {
        const double *o = rec + (by_row ? rows[q] : q) * SPH_PARTIAL_FIELDS;
        if (o[0] == -INFINITY && o[1] == 0) continue;
        const double lse = o[0] + log(o[1]), mu = o[0] + o[2] / o[1];
        if (isfinite(o[0]) && isfinite(lse) && isfinite(mu)) continue;
        if (!bad || rows[q] < *first) *first = rows[q];
        bad++;
    }
    return bad;
}

static void make_coef(const run *r, int64_t i, const float sh[4], coef *c) {
    const sph_head_plan *p = r->p;
    int64_t t = target_of(p, i);
    float g = t >= 0 && p->dlogprob ? p->dlogprob[i] : 0.0f;
    float e = p->dentropy ? p->dentropy[i] : 0.0f, gl = p->dlse ? p->dlse[i] : 0.0f;
    float gm = p->K == 0 && p->dlogit_mean ? p->dlogit_mean[i] : 0.0f;
    c->xs = sh[0], c->ys = sh[1], c->ls = sh[2], c->dm = sh[3];
    c->A = gl - g;
    c->e = e;
    c->C = (float)(gm / (double)p->V);
    c->g = g;
    c->it = row_it(r, i);
    c->t = t >= p->v0 && t < p->v0 + p->V_loc ? t - p->v0 : -1;
}

static void clear_outputs(const run *r) {
    const sph_head_plan *p = r->p;
    for (int64_t i = 0; i < p->N; i++) {
        static const double empty[SPH_PARTIAL_FIELDS] = {-INFINITY, 0, 0, 0, 0};
        finalize_row(r, i, empty, 0);
    }
}

/* dhidden rows of inactive rows: zero (overwrite mode) or untouched (accumulate). Active
 * rows are written by the chunks. */
static void clear_dhidden(const run *r) {
    const sph_head_plan *p = r->p;
    if (!p->dhidden || p->acc_dh) return;
    size_t es = sph_dtype_size(p->dh_dtype);
    for (int64_t i = 0; i < p->N; i++)
        memset((char *)p->dhidden + (size_t)(i * p->ld_dh) * es, 0, (size_t)p->H * es);
}

/* The f32 dW target: dweight itself (f32) or the accumulator, zeroed or preloaded. */
static float *dw_begin(const run *r, int64_t *ld) {
    const sph_head_plan *p = r->p;
    if (!p->dweight) return NULL;
    if (!r->L.dw_buf) {
        *ld = p->ld_dw;
        if (!p->acc_dw)
            for (int64_t j = 0; j < p->V_loc; j++)
                memset((float *)p->dweight + j * p->ld_dw, 0, (size_t)p->H * sizeof(float));
        return p->dweight;
    }
    float *acc = at(r, r->L.o_dw);
    *ld = p->H;
    int bf = p->dw_dtype.code == SPH_DTYPE_BFLOAT;
    for (int64_t j = 0; j < p->V_loc; j++) {
        if (p->acc_dw)
            r->k.cvt((const uint16_t *)p->dweight + j * p->ld_dw, acc + j * p->H, p->H, bf);
        else
            memset(acc + j * p->H, 0, (size_t)p->H * sizeof(float));
    }
    return acc;
}

static void dw_end(const run *r) {
    const sph_head_plan *p = r->p;
    if (!p->dweight || !r->L.dw_buf) return;
    const float *acc = at(r, r->L.o_dw);
    for (int64_t j = 0; j < p->V_loc; j++)
        for (int64_t k = 0; k < p->H; k++)
            sph_head_store_f32(p->dweight, p->dw_dtype, j * p->ld_dw + k, acc[j * p->H + k], 0);
}

static sph_status allreduce_dh(const run *r) {
    const sph_head_plan *p = r->p;
    if (!p->allreduce_dh || !p->comm || p->comm->size <= 1 || p->N == 0) return SPH_OK;
    sph_status s = p->comm->ops->allreduce_sum_f32(p->comm, (float *)p->dhidden,
                                                   (size_t)(p->N * p->H), NULL);
    if (s != SPH_OK) return sph_err_prefix(s, "head: allreduce of dhidden: ");
    return SPH_OK;
}

static sph_status setup(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p, void *ws,
                        size_t bytes, run *r) {
    memset(r, 0, sizeof *r);
    r->ctx = ctx;
    r->p = p;
    /* head.c checked the workspace against this layout's total */
    SPH_TRY(make_layout(ctx, pass, p, &r->L));
    r->ws = (char *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
    r->rows = at(r, r->L.o_rows);
    uint8_t *act = (uint8_t *)at(r, r->L.o_rec); /* scratch before the records are used */
    sph_head_active_rows(p, act);
    int64_t n = 0;
    for (int64_t i = 0; i < p->N; i++)
        if (act[i]) r->rows[n++] = i;
    SPH_CHECK(n == r->L.n_act, SPH_ERR_INTERNAL, "head: %lld active rows, counted %lld",
              (long long)n, (long long)r->L.n_act);
    r->k = *ctx->head.cpu_kern; /* the ISA's tile loops, picked at context creation */
    r->inv_t = (float)(1.0 / p->temperature);
    r->cap = (float)p->softcap;
    return SPH_OK;
}

// ---- full vocabulary ---------------------------------------------------------------------

/* Hc <- the chunk's hidden rows in f32. */
static void gather_chunk(const run *r, int64_t c0, int64_t nr) {
    const sph_head_plan *p = r->p;
    float *hc = at(r, r->L.o_hc);
#pragma omp parallel for num_threads(r->L.T) schedule(static)
    for (int64_t q = 0; q < nr; q++)
        load_row(r, p->hidden, r->rows[c0 + q] * p->ld_h, p->H, hc + q * p->H);
}

/* The weight tile [v, v + w) as an f32 matrix: in place for f32, converted otherwise. */
static const float *weight_tile(const run *r, int tid, int64_t v, int64_t w, int64_t *ld) {
    const sph_head_plan *p = r->p;
    if (!r->L.half) {
        *ld = p->ld_w;
        return (const float *)p->weight + v * p->ld_w;
    }
    float *wt = thread_wt(r, tid);
    for (int64_t j = 0; j < w; j++) load_row(r, p->weight, (v + j) * p->ld_w, p->H, wt + j * p->H);
    *ld = p->H;
    return wt;
}

/* Thread tid's top-k list of chunk row q (K entries). */
static topk_tent *thread_topk(const run *r, int tid, int64_t q) {
    return (topk_tent *)at(r, r->L.o_tkt) + ((size_t)tid * (size_t)r->L.R + (size_t)q) *
                                                (size_t)r->p->topk;
}

/* A tile row x[0 .. w) (columns v ..) into the sorted list l: one compare per value against
 * the K-th best; a thread visits its tiles and their columns in ascending order (static
 * schedule), so a value equal to the K-th (a higher column) never enters a full list. */
static void topk_tile(topk_tent *l, int64_t K, const float *x, int64_t w, int64_t v) {
    float thr = l[K - 1].x;
    int full = l[K - 1].col >= 0;
    for (int64_t j = 0; j < w; j++) {
        const float xj = x[j];
        if (full && !(xj > thr)) continue;
        if (isnan(xj)) continue; /* a non-finite row fails the call anyway */
        const int32_t c = (int32_t)(v + j);
        int64_t lo = 0, hi = K - 1; /* the first entry (xj, c) beats */
        while (lo < hi) {
            const int64_t mid = (lo + hi) / 2;
            const topk_tent *e = &l[mid];
            if (e->col < 0 || xj > e->x || (xj == e->x && c < e->col)) hi = mid;
            else lo = mid + 1;
        }
        memmove(l + lo + 1, l + lo, (size_t)(K - 1 - lo) * sizeof *l);
        l[lo].x = xj, l[lo].col = c;
        thr = l[K - 1].x;
        full = l[K - 1].col >= 0;
    }
}

/* A thread list of a row of 1 / T = it as global (z, id) entries. */
static void topk_lift(const run *r, float it, const topk_tent *l, sph_topk_ent *out) {
    for (int64_t k = 0; k < r->p->topk; k++) {
        out[k].z = l[k].col >= 0 ? tile_z(r, it, l[k].x) : -INFINITY;
        out[k].id = l[k].col >= 0 ? r->p->v0 + l[k].col : -1;
    }
}

/* Forward over one chunk: partial records per (row, tile), merged per row into rec[q]. The
 * logits go to D (one-pass) or to the thread's tile buffer. With topk, every thread keeps a
 * list per chunk row over its tiles; the lists merge per row into the chunk's (o_ctk). */
static void chunk_forward(const run *r, int64_t c0, int64_t nr, double *rec) {
    const sph_head_plan *p = r->p;
    const layout *L = &r->L;
    const float *hc = at(r, L->o_hc);
    float *D = L->need_D ? (float *)at(r, L->o_d) : NULL;
    float *part = at(r, L->o_part);
    const int64_t K = p->topk;
#pragma omp parallel num_threads(L->T)
    {
        int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        if (K)
            for (int64_t q = 0; q < nr; q++) {
                topk_tent *l = thread_topk(r, tid, q);
                for (int64_t k = 0; k < K; k++) l[k].x = -INFINITY, l[k].col = -1;
            }
#pragma omp for schedule(static)
        for (int64_t tv = 0; tv < L->n_vt; tv++) {
            int64_t v = tv * L->vt, w = p->V_loc - v < L->vt ? p->V_loc - v : L->vt, ldw, ldl;
            const float *wt = weight_tile(r, tid, v, w, &ldw);
            float *lt = D ? D + v : thread_tile(r, tid);
            ldl = D ? p->V_loc : w;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, (int)w, (int)p->H,
                        1.0f, hc, (int)p->H, wt, (int)ldw, 0.0f, lt, (int)ldl);
            for (int64_t q = 0; q < nr; q++) {
                float *x = lt + q * ldl, *o = part + (q * L->n_vt + tv) * SPH_PARTIAL_FIELDS;
                const int64_t t = target_of(p, r->rows[c0 + q]) - p->v0 - v;
                const float it = row_it(r, r->rows[c0 + q]);
                stats_row(r, it, x, w, o);
                o[4] = t >= 0 && t < w ? x[t] : 0.0f; /* a tile value, like the max (tile_z) */
                if (p->sum_p2) { /* sum e^(2 y), shifted like s (a second look at the tile) */
                    const float sc = x_scale(r, it), xm = o[0];
                    float qs = 0;
                    for (int64_t j = 0; j < w; j++) qs += expf(2 * (x[j] - xm) * sc);
                    ((float *)at(r, L->o_part2))[q * L->n_vt + tv] = qs;
                }
                if (K) topk_tile(thread_topk(r, tid, q), K, x, w, v); /* x is u or z now */
            }
        }
#pragma omp for schedule(static)
        for (int64_t q = 0; q < nr; q++) {
            const float it = row_it(r, r->rows[c0 + q]);
            double acc[SPH_PARTIAL_FIELDS] = {-INFINITY, 0, 0, 0, 0};
            for (int64_t tv = 0; tv < L->n_vt; tv++) {
                const float *o = part + (q * L->n_vt + tv) * SPH_PARTIAL_FIELDS;
                /* (m, s, d, zt, sz): m and zt in float64 from the unscaled products (exact:
                 * a float times a float), s and d already shifted (cpu_kernels.h) */
                double add[SPH_PARTIAL_FIELDS] = {tile_z(r, it, o[0]), o[1], o[2],
                                                 tile_z(r, it, o[4]), o[3]};
                sph_head_partial_merge(acc, add);
            }
            memcpy(rec + q * SPH_PARTIAL_FIELDS, acc, sizeof acc);
            if (p->sum_p2) { /* (m, q) of the chunk row on this shard, q shifted by its m */
                const float *q2 = (const float *)at(r, L->o_part2) + q * L->n_vt;
                double qq = 0;
                for (int64_t tv = 0; tv < L->n_vt; tv++) {
                    const double mt =
                        tile_z(r, it, part[(q * L->n_vt + tv) * SPH_PARTIAL_FIELDS]);
                    if (q2[tv] != 0 || isnan(q2[tv])) qq += q2[tv] * exp(2 * (mt - acc[0]));
                }
                double *mq = (double *)at(r, L->o_cmq) + q * 2;
                mq[0] = acc[0], mq[1] = qq;
            }
            if (K) { /* the threads' lists of the row, merged (a total order: any order) */
                sph_topk_ent *out = (sph_topk_ent *)at(r, L->o_ctk) + q * K;
                sph_topk_ent *a = (sph_topk_ent *)at(r, L->o_tkm) + (size_t)tid * 2 * K, *b = a + K;
                topk_lift(r, it, thread_topk(r, 0, q), out);
                for (int t = 1; t < nt; t++) {
                    topk_lift(r, it, thread_topk(r, t, q), a);
                    sph_topk_merge2(out, a, b, K);
                    memcpy(out, b, (size_t)K * sizeof *out);
                }
            }
        }
    }
}

/* Backward over one chunk given its coefficients: dlogits in D (recomputing the logits
 * unless have_z), dW += D^T Hc per tile, dHc = D W and its scatter into dhidden. */
static void chunk_backward(const run *r, int64_t c0, int64_t nr, int have_z, float *dw,
                           int64_t ld_dw) {
    const sph_head_plan *p = r->p;
    const layout *L = &r->L;
    const float *hc = at(r, L->o_hc);
    float *D = at(r, L->o_d);
    const coef *cf = at(r, L->o_coef);
#pragma omp parallel num_threads(L->T)
    {
        int tid = omp_get_thread_num();
#pragma omp for schedule(static)
        for (int64_t tv = 0; tv < L->n_vt; tv++) {
            int64_t v = tv * L->vt, w = p->V_loc - v < L->vt ? p->V_loc - v : L->vt;
            if (!have_z) {
                int64_t ldw;
                const float *wt = weight_tile(r, tid, v, w, &ldw);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, (int)w, (int)p->H,
                            1.0f, hc, (int)p->H, wt, (int)ldw, 0.0f, D + v, (int)p->V_loc);
            }
            for (int64_t q = 0; q < nr; q++) {
                float *x = D + q * p->V_loc + v;
                /* recomputed from the float32 stats: to z, as the stats' m was rounded */
                const float it = cf[q].it;
                if (!have_z) {
                    if (r->cap > 0) softcap_rows(x, w, r->cap, it);
                    else
                        for (int64_t j = 0; j < w; j++) x[j] *= it;
                }
                int64_t t = cf[q].t - v;
                float zt = t >= 0 && t < w ? x[t] : 0.0f;
                grad_row(r, x, w, &cf[q]);
                if (t >= 0 && t < w) x[t] += cf[q].g * it * cap_factor(r, it, zt);
            }
            if (dw)
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)w, (int)p->H, (int)nr,
                            1.0f, D + v, (int)p->V_loc, hc, (int)p->H, 1.0f, dw + v * ld_dw,
                            (int)ld_dw);
        }
    }
    if (!p->dhidden) return;
    float *dhc = at(r, L->o_dhc);
    const int64_t nb = (p->H + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel num_threads(L->T)
    {
        int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t b0 = nb * tid / nt, b1 = nb * (tid + 1) / nt;
        int64_t k0 = b0 * COL_BLOCK, k1 = b1 * COL_BLOCK < p->H ? b1 * COL_BLOCK : p->H;
        if (k1 > k0) {
            int64_t cw = k1 - k0;
            if (!L->half) {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nr, (int)cw,
                            (int)p->V_loc, 1.0f, D, (int)p->V_loc,
                            (const float *)p->weight + k0, (int)p->ld_w, 0.0f, dhc + k0,
                            (int)p->H);
            } else {
                float *wt = thread_wt(r, tid);
                for (int64_t v = 0; v < p->V_loc; v += L->vt) {
                    int64_t w = p->V_loc - v < L->vt ? p->V_loc - v : L->vt;
                    for (int64_t j = 0; j < w; j++)
                        load_row(r, p->weight, (v + j) * p->ld_w + k0, cw, wt + j * cw);
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nr, (int)cw,
                                (int)w, 1.0f, D + v, (int)p->V_loc, wt, (int)cw,
                                v == 0 ? 0.0f : 1.0f, dhc + k0, (int)p->H);
                }
            }
        }
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t q = 0; q < nr; q++) {
            int64_t i = r->rows[c0 + q];
            for (int64_t k = 0; k < p->H; k++)
                sph_head_store_f32(p->dhidden, p->dh_dtype, i * p->ld_dh + k,
                                   dhc[q * p->H + k], p->acc_dh);
        }
    }
}

/* The shift (xs, ys, ls, dm) of row i (see coef). From a merged record (m, s, d, ...) when o
 * is given (an empty record, m = -inf and s = 0, gives zeros): m is the exact float64
 * product of a tile value and x_scale, so xs = m / x_scale is that tile value exactly and
 * y = (x - xs) x_scale never subtracts two numbers of the logits' magnitude. From the saved
 * float32 stats (m, lse, mu), the caller has scaled the tile to z (float32, rounded as m
 * was: the max token gives y = 0 bitwise) and y = z - m; ls and dm carry the stats' own
 * rounding (ulp(|m|), docs/design.md 2.3). */
static void row_shift(const run *r, int64_t i, const double *o, float sh[4]) {
    if (!o) {
        const float *st = r->p->stats + i * 3;
        sh[0] = st[0], sh[1] = 1.0f;
        sh[2] = (float)((double)st[1] - st[0]);
        sh[3] = (float)((double)st[2] - st[0]);
        return;
    }
    if (o[0] == -INFINITY && o[1] == 0) {
        sh[0] = sh[2] = sh[3] = 0.0f, sh[1] = 1.0f;
        return;
    }
    const double xsc = x_scale(r, row_it(r, i));
    sh[0] = (float)(o[0] / xsc), sh[1] = (float)xsc;
    sh[2] = (float)log(o[1]);
    sh[3] = (float)(o[2] / o[1]);
}

static void chunk_coefs(const run *r, int64_t c0, int64_t nr, const double *crec) {
    coef *cf = at(r, r->L.o_coef);
    for (int64_t q = 0; q < nr; q++) {
        int64_t i = r->rows[c0 + q];
        float sh[4];
        row_shift(r, i, crec ? crec + q * SPH_PARTIAL_FIELDS : NULL, sh);
        make_coef(r, i, sh, &cf[q]);
    }
}

static sph_status full_forward(const run *r) {
    const sph_head_plan *p = r->p;
    const layout *L = &r->L;
    double *rec = at(r, L->o_rec), *crec = at(r, L->o_crec), *gath = at(r, L->o_gath);
    const int64_t K = p->topk;
    sph_topk_ent *tk = at(r, L->o_tk), *ctk = at(r, L->o_ctk), *tkg = at(r, L->o_tkg);
    int64_t first;
    if (!p->one_pass) {
        /* records of every row (inactive rows: empty), one combine for the whole forward */
        for (int64_t i = 0; i < p->N; i++) {
            double *o = rec + i * SPH_PARTIAL_FIELDS;
            o[0] = -INFINITY, o[1] = o[2] = o[3] = o[4] = 0;
        }
        if (K) sph_topk_clear(tk, p->N * K);
        for (int64_t c0 = 0; c0 < L->n_act; c0 += L->R) {
            int64_t nr = L->n_act - c0 < L->R ? L->n_act - c0 : L->R;
            gather_chunk(r, c0, nr);
            chunk_forward(r, c0, nr, crec);
            for (int64_t q = 0; q < nr; q++)
                memcpy(rec + r->rows[c0 + q] * SPH_PARTIAL_FIELDS, crec + q * SPH_PARTIAL_FIELDS,
                       SPH_PARTIAL_FIELDS * sizeof(double));
            if (p->sum_p2)
                for (int64_t q = 0; q < nr; q++)
                    memcpy((double *)at(r, L->o_mq) + r->rows[c0 + q] * 2,
                           (const double *)at(r, L->o_cmq) + q * 2, 2 * sizeof(double));
            for (int64_t q = 0; q < nr && K; q++)
                memcpy(tk + r->rows[c0 + q] * K, ctk + q * K, (size_t)K * sizeof *tk);
        }
        SPH_TRY(sph_head_combine_f64(p->comm, rec, gath, rec, p->N));
        if (p->sum_p2)
            SPH_TRY(sph_head_combine_sq_f64(p->comm, at(r, L->o_mq), gath, rec, at(r, L->o_q),
                                            p->N));
        if (K) SPH_TRY(sph_head_combine_topk(p->comm, tk, tkg, tkg + L->ranks * p->N * K, p->N, K));
        /* the statistics of every row are known: refuse non-finite ones before writing */
        const int64_t bad = nonfinite_rows(rec, r->rows, L->n_act, 1, &first);
        if (bad) return sph_head_nonfinite_error(r->ctx, SPH_HEAD_FORWARD, bad, first, NULL);
        clear_outputs(r);
        for (int64_t q = 0; q < L->n_act; q++)
            finalize_row(r, r->rows[q], rec + r->rows[q] * SPH_PARTIAL_FIELDS, 1);
        write_sum_p2(r, r->rows, L->n_act, rec, at(r, L->o_q), 1);
        write_topk(r, r->rows, L->n_act, rec, tk, 1);
        return SPH_OK;
    }
    /* one-pass: logits once per chunk into D, combine per chunk, dlogits in place. The outputs
     * are first written after the first chunk's statistics are known to be finite. */
    int64_t ld_dw = 0;
    float *dw = NULL;
    int started = 0;
    for (int64_t c0 = 0; c0 < L->n_act || !started; c0 += L->R) {
        if (c0 >= L->n_act) { /* no active row: the outputs' zeros only */
            clear_outputs(r);
            dw = dw_begin(r, &ld_dw);
            clear_dhidden(r);
            break;
        }
        int64_t nr = L->n_act - c0 < L->R ? L->n_act - c0 : L->R;
        gather_chunk(r, c0, nr);
        chunk_forward(r, c0, nr, crec);
        SPH_TRY(sph_head_combine_f64(p->comm, crec, gath, crec, nr));
        if (p->sum_p2)
            SPH_TRY(sph_head_combine_sq_f64(p->comm, at(r, L->o_cmq), gath, crec, at(r, L->o_q),
                                            nr));
        if (K) SPH_TRY(sph_head_combine_topk(p->comm, ctk, tkg, tkg + L->ranks * nr * K, nr, K));
        /* every rank holds the same combined records: the same verdict on every rank */
        const int64_t bad = nonfinite_rows(crec, r->rows + c0, nr, 0, &first);
        if (bad)
            return sph_head_nonfinite_error(
                r->ctx, SPH_HEAD_FORWARD, bad, first,
                started ? "one-pass: the chunks before the row's are already written" : NULL);
        if (!started) {
            clear_outputs(r);
            dw = dw_begin(r, &ld_dw);
            clear_dhidden(r);
            started = 1;
        }
        for (int64_t q = 0; q < nr; q++)
            finalize_row(r, r->rows[c0 + q], crec + q * SPH_PARTIAL_FIELDS, 1);
        write_sum_p2(r, r->rows + c0, nr, crec, at(r, L->o_q), 0);
        write_topk(r, r->rows + c0, nr, crec, ctk, 0);
        /* the plan's row hook (a loss) turns the rows' final logprob / entropy into
         * dlogprob / dentropy before the chunk's dlogits read them (plan.h) */
        if (p->row_hook.host) p->row_hook.host(p->row_hook.arg, r->rows + c0, nr);
        chunk_coefs(r, c0, nr, crec);
        chunk_backward(r, c0, nr, 1, dw, ld_dw);
    }
    dw_end(r);
    return allreduce_dh(r);
}

/* Non-finite policy of the backward: the stats and upstream gradients of the active rows,
 * checked before anything is written. */
static sph_status check_backward_inputs(const run *r) {
    int64_t first;
    const int64_t bad = sph_head_scan_backward_inputs(r->p, &first);
    return bad ? sph_head_nonfinite_error(r->ctx, SPH_HEAD_BACKWARD, bad, first, NULL) : SPH_OK;
}

static sph_status full_backward(const run *r) {
    SPH_TRY(check_backward_inputs(r));
    const layout *L = &r->L;
    int64_t ld_dw = 0;
    float *dw = dw_begin(r, &ld_dw);
    clear_dhidden(r);
    for (int64_t c0 = 0; c0 < L->n_act; c0 += L->R) {
        int64_t nr = L->n_act - c0 < L->R ? L->n_act - c0 : L->R;
        gather_chunk(r, c0, nr);
        chunk_coefs(r, c0, nr, NULL);
        chunk_backward(r, c0, nr, 0, dw, ld_dw);
    }
    dw_end(r);
    return allreduce_dh(r);
}

// ---- sample support ----------------------------------------------------------------------

static float dotf(const float *a, const float *b, int64_t n) {
    return cblas_sdot((int)n, a, 1, b, 1);
}

/* z of row i's candidates inside this shard into z[k] (NAN-free marker: cols[k] = -1 for
 * padding or other shards). h is the converted hidden row, wbuf scratch of H floats. */
static void support_logits(const run *r, int64_t i, const float *h, float *wbuf, float *z,
                           int64_t *cols) {
    const sph_head_plan *p = r->p;
    const float it = row_it(r, i);
    for (int64_t k = 0; k < p->K; k++) {
        int64_t c = sph_head_id_at(p->cand, p->cand_i64, i * p->ld_c + k);
        cols[k] = c >= p->v0 && c < p->v0 + p->V_loc ? c - p->v0 : -1;
        if (cols[k] < 0) continue;
        const float *w;
        if (!r->L.half) {
            w = (const float *)p->weight + cols[k] * p->ld_w;
        } else {
            load_row(r, p->weight, cols[k] * p->ld_w, p->H, wbuf);
            w = wbuf;
        }
        float u = dotf(h, w, p->H); /* tile values: u, or z when softcapped (x_scale) */
        z[k] = r->cap > 0 ? r->cap * tanhf(u / r->cap) * it : u;
    }
}

static sph_status support_forward_rows(const run *r) {
    const sph_head_plan *p = r->p;
    const layout *L = &r->L;
    double *rec = at(r, L->o_rec), *gath = at(r, L->o_gath);
    double *mq = p->sum_p2 ? at(r, L->o_mq) : NULL;
    for (int64_t i = 0; i < p->N; i++) {
        double *o = rec + i * SPH_PARTIAL_FIELDS;
        o[0] = -INFINITY, o[1] = o[2] = o[3] = o[4] = 0;
        if (mq) mq[i * 2] = -INFINITY, mq[i * 2 + 1] = 0;
    }
#pragma omp parallel num_threads(L->T)
    {
        int tid = omp_get_thread_num();
        float *z = thread_tile(r, tid), *h = thread_wt(r, tid), *wb = h + p->H;
        int64_t *cols = (int64_t *)(void *)(z + ((p->K + 1) & ~(int64_t)1));
#pragma omp for schedule(static)
        for (int64_t q = 0; q < L->n_act; q++) {
            int64_t i = r->rows[q], t = target_of(p, i);
            load_row(r, p->hidden, i * p->ld_h, p->H, h);
            support_logits(r, i, h, wb, z, cols);
            double m = -INFINITY, s = 0, d = 0, zt = 0, q2 = 0;
            int n = 0, nan = 0;
            for (int64_t k = 0; k < p->K; k++)
                if (cols[k] >= 0) {
                    n++;
                    if (isnan(z[k])) nan = 1;
                    if (z[k] > m) m = z[k];
                }
            if (nan) m = NAN;
            const float it = row_it(r, i);
            const double xsc = x_scale(r, it); /* z = x xsc, shifted before the scaling */
            for (int64_t k = 0; k < p->K; k++)
                if (cols[k] >= 0) {
                    double y = ((double)z[k] - m) * xsc, e = exp(y);
                    s += e;
                    d += e * y;
                    q2 += e * e;
                    if (cols[k] + p->v0 == t) zt = tile_z(r, it, z[k]);
                }
            double *o = rec + i * SPH_PARTIAL_FIELDS;
            if (n) o[0] = tile_z(r, it, (float)m), o[1] = s, o[2] = d, o[3] = zt;
            if (n && mq) mq[i * 2] = o[0], mq[i * 2 + 1] = q2;
        }
    }
    SPH_TRY(sph_head_combine_f64(p->comm, rec, gath, rec, p->N));
    if (mq) SPH_TRY(sph_head_combine_sq_f64(p->comm, mq, gath, rec, at(r, L->o_q), p->N));
    return SPH_OK;
}

static sph_status support_backward(const run *r, int from_rec) {
    const sph_head_plan *p = r->p;
    const layout *L = &r->L;
    if (!from_rec) SPH_TRY(check_backward_inputs(r));
    const double *rec = at(r, L->o_rec);
    float *du = at(r, L->o_du);
    int64_t ld_dw = 0;
    float *dw = dw_begin(r, &ld_dw);
    clear_dhidden(r);
#pragma omp parallel num_threads(L->T)
    {
        int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        float *z = thread_tile(r, tid), *h = thread_wt(r, tid), *wb = h + p->H;
        int64_t *cols = (int64_t *)(void *)(z + ((p->K + 1) & ~(int64_t)1));
#pragma omp for schedule(static)
        for (int64_t q = 0; q < L->n_act; q++) {
            int64_t i = r->rows[q];
            float sh[4];
            row_shift(r, i, from_rec ? rec + i * SPH_PARTIAL_FIELDS : NULL, sh);
            coef c;
            make_coef(r, i, sh, &c);
            load_row(r, p->hidden, i * p->ld_h, p->H, h);
            support_logits(r, i, h, wb, z, cols);
            float *d = du + q * p->K;
            for (int64_t k = 0; k < p->K; k++) {
                if (cols[k] < 0) {
                    d[k] = 0;
                    continue;
                }
                /* from the stats: z in float32 first, as in chunk_backward */
                float xv = !from_rec && r->cap <= 0 ? z[k] * c.it : z[k];
                float y = (xv - c.xs) * c.ys, pr = expf(y - c.ls);
                float dz = pr * (c.A + c.e * (c.dm - y)) + (cols[k] == c.t ? c.g : 0.0f);
                d[k] = dz * c.it * cap_factor(r, c.it, z[k]);
            }
            if (p->dhidden) {
                float *acc = h; /* the hidden row is no longer needed: reuse as dH_i */
                memset(acc, 0, (size_t)p->H * sizeof(float));
                for (int64_t k = 0; k < p->K; k++) {
                    if (cols[k] < 0) continue;
                    const float *w;
                    if (!L->half) {
                        w = (const float *)p->weight + cols[k] * p->ld_w;
                    } else {
                        load_row(r, p->weight, cols[k] * p->ld_w, p->H, wb);
                        w = wb;
                    }
                    for (int64_t x = 0; x < p->H; x++) acc[x] += d[k] * w[x];
                }
                for (int64_t x = 0; x < p->H; x++)
                    sph_head_store_f32(p->dhidden, p->dh_dtype, i * p->ld_dh + x, acc[x],
                                       p->acc_dh);
            }
        }
        /* dW: thread tid owns local vocab rows [j0, j1) and visits rows in order */
        if (dw) {
            int64_t j0 = p->V_loc * tid / nt, j1 = p->V_loc * (tid + 1) / nt;
            for (int64_t q = 0; q < L->n_act; q++) {
                int64_t i = r->rows[q];
                int loaded = 0;
                for (int64_t k = 0; k < p->K; k++) {
                    int64_t c = sph_head_id_at(p->cand, p->cand_i64, i * p->ld_c + k) - p->v0;
                    float dk = du[q * p->K + k];
                    if (c < j0 || c >= j1 || dk == 0.0f) continue;
                    if (!loaded) load_row(r, p->hidden, i * p->ld_h, p->H, h), loaded = 1;
                    float *dst = dw + c * ld_dw;
                    for (int64_t x = 0; x < p->H; x++) dst[x] += dk * h[x];
                }
            }
        }
    }
    dw_end(r);
    return allreduce_dh(r);
}

static sph_status support_forward(const run *r) {
    const sph_head_plan *p = r->p;
    SPH_TRY(support_forward_rows(r));
    const double *rec = at(r, r->L.o_rec);
    int64_t first;
    const int64_t bad = nonfinite_rows(rec, r->rows, r->L.n_act, 1, &first);
    if (bad) return sph_head_nonfinite_error(r->ctx, SPH_HEAD_FORWARD, bad, first, NULL);
    clear_outputs(r);
    for (int64_t q = 0; q < r->L.n_act; q++)
        finalize_row(r, r->rows[q], rec + r->rows[q] * SPH_PARTIAL_FIELDS, 1);
    write_sum_p2(r, r->rows, r->L.n_act, rec, at(r, r->L.o_q), 1);
    if (!p->one_pass) return SPH_OK;
    return support_backward(r, 1);
}

// ---- entry points ------------------------------------------------------------------------

static sph_status cpu_workspace(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p,
                                size_t *bytes) {
    layout L;
    SPH_TRY(make_layout(ctx, pass, p, &L));
    *bytes = L.total;
    return SPH_OK;
}

static sph_status cpu_forward(sph_ctx_t ctx, const sph_head_plan *p, void *ws, size_t bytes) {
    run r;
    SPH_TRY(setup(ctx, SPH_HEAD_FORWARD, p, ws, bytes, &r));
    return full_forward(&r);
}

static sph_status cpu_backward(sph_ctx_t ctx, const sph_head_plan *p, void *ws, size_t bytes) {
    run r;
    SPH_TRY(setup(ctx, SPH_HEAD_BACKWARD, p, ws, bytes, &r));
    return full_backward(&r);
}

static sph_status cpu_support_forward(sph_ctx_t ctx, const sph_head_plan *p, void *ws,
                                      size_t bytes) {
    run r;
    SPH_TRY(setup(ctx, SPH_HEAD_FORWARD, p, ws, bytes, &r));
    return support_forward(&r);
}

static sph_status cpu_support_backward(sph_ctx_t ctx, const sph_head_plan *p, void *ws,
                                       size_t bytes) {
    run r;
    SPH_TRY(setup(ctx, SPH_HEAD_BACKWARD, p, ws, bytes, &r));
    return support_backward(&r, 0);
}

/* The tile loops of each ISA (cpu_kernels.h); AVX-512 BF16 parts run the AVX-512 loops. */
static const sph_head_kern g_kern_generic = {sph_head_tile_stats_generic,
                                             sph_head_tile_grad_generic, sph_head_cvt_generic};
static const sph_head_kern g_kern_avx2 = {sph_head_tile_stats_avx2, sph_head_tile_grad_avx2,
                                          sph_head_cvt_avx2};
static const sph_head_kern g_kern_avx512 = {sph_head_tile_stats_avx512,
                                            sph_head_tile_grad_avx512, sph_head_cvt_avx512};

void sph_head_cpu_fill(sph_ctx_t ctx, sph_head_backend *be) {
    be->name = "cpu";
    be->workspace = cpu_workspace;
    be->forward = cpu_forward;
    be->backward = cpu_backward;
    be->support_forward = cpu_support_forward;
    be->support_backward = cpu_support_backward;
    /* Not row-invariant: a row's sgemm results may depend on its chunk (OpenBLAS blocking and
     * edge kernels) and its dH on the chunk's split; refused at creation rather than not
     * honoured (issue 18 item 14). */
    be->batch_invariant = 0;
    switch (ctx->isa) {
    case SPH_ISA_AVX512:
    case SPH_ISA_AVX512BF16: be->cpu_kern = &g_kern_avx512; break;
    case SPH_ISA_AVX2: be->cpu_kern = &g_kern_avx2; break;
    default: be->cpu_kern = &g_kern_generic;
    }
}
