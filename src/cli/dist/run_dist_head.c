/*
 * run_dist_head.c - one rank's forward + backward in the distributed runner (run_dist_main.c step
 * 5): each bin of the rank's share staged on its device, the head called through the public
 * API with the TP communicator, per-row outputs and dhidden copied back, dweight accumulated
 * over the bins; and --bench, which times the first bin with and without the collectives.
 */
#ifdef SPH_HAVE_MPI
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "half.h"
#include "num.h"
#include "run_dist.h"
/* A device copy of host data (CPU: a host copy, so both paths free the same way). */
static int dput(const dev *d, const void *host, size_t bytes, void **out) {
    *out = NULL;
    sph_status s = sph_ctx_malloc(d->io, bytes ? bytes : 1, out);
    if (s) return dist_fail("allocating %zu bytes: %s", bytes, sph_last_error());
    if (host && bytes) {
        s = sph_ctx_memcpy(d->io, *out, host, bytes);
        if (s) return dist_fail("copying %zu bytes: %s", bytes, sph_last_error());
    } else if (bytes) {
        s = sph_ctx_memset(d->io, *out, 0, bytes);
        if (s) return dist_fail("clearing %zu bytes: %s", bytes, sph_last_error());
    }
    return 1;
}

static int dget(const dev *d, void *host, const void *src, size_t bytes) {
    if (!bytes) return 1;
    sph_status s = sph_ctx_memcpy(d->io, host, src, bytes);
    if (s) return dist_fail("copying back %zu bytes: %s", bytes, sph_last_error());
    return 1;
}

void dist_result_free(result *r) {
    for (int f = 0; f < NF; f++) free(r->row[f]);
    free(r->dhidden);
    free(r->dweight);
    free(r->topk_ids);
    free(r->topk_lp);
    free(r->sum_p2);
    memset(r, 0, sizeof *r);
}

static sph_tensor tens(void *data, sph_dtype dt, int32_t ndim, int64_t *shape, int cuda) {
    sph_tensor t = {data, {cuda ? SPH_DEVICE_CUDA : SPH_DEVICE_CPU, 0}, ndim, dt, shape, NULL, 0};
    return t;
}

/* Runs forward + backward over rows [grow] of the batch with weight rows [v0, v0 + V_loc),
 * one call pair per bin. ctx carries the TP communicator (or none for the reference). */
/* --bench: times forward and backward of the bin already on the device, reps times, with the
 * TP context and with a context without communicator (the same per-rank work, no combine),
 * into out->bench_ms (medians of the slowest rank). Every rank calls it at bin 0. dw_d is a
 * scratch dweight so that the accumulated gradient is not disturbed. */
static int bench_bin(sph_ctx_t ctx, sph_ctx_t local, const sph_head_args *a0, int allreduce,
                     void *ws, size_t ws_bytes, int reps, result *out) {
    double *t = calloc((size_t)reps * 4, sizeof(double));
    int ok = t != NULL;
    if (!dist_agree(ok)) {
        free(t);
        return dist_fail("out of host memory for %d timings", reps);
    }
    for (int mode = 0; mode < 2 && ok; mode++) {
        sph_ctx_t c = mode == 0 ? ctx : local;
        sph_head_args fa = *a0, ba = *a0;
        fa.dhidden = NULL;
        fa.dweight = NULL;
        fa.dlogprob = fa.dentropy = fa.dlse = fa.dlogit_mean = NULL;
        fa.allreduce_dhidden = 0;
        fa.accumulate_dweight = 0;
        ba.accumulate_dweight = 0;
        ba.allreduce_dhidden = mode == 0 ? allreduce : 0;
        for (int r = -1; r < reps && ok; r++) { /* r = -1: warm-up */
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            sph_status s = sph_head_forward(c, &fa, ws, ws_bytes);
            if (!s) s = sph_ctx_synchronize(c);
            double t1 = MPI_Wtime();
            if (!s) s = sph_head_backward(c, &ba, ws, ws_bytes);
            if (!s) s = sph_ctx_synchronize(c);
            double t2 = MPI_Wtime();
            if (s) ok = dist_fail("--bench: %s", sph_last_error());
            if (r >= 0) {
                t[(size_t)(2 * mode) * (size_t)reps + (size_t)r] = t1 - t0;
                t[(size_t)(2 * mode + 1) * (size_t)reps + (size_t)r] = t2 - t1;
            }
        }
    }
    if (!dist_agree(ok)) {
        free(t);
        return 0;
    }
    double *mx = calloc((size_t)reps * 4, sizeof(double));
    if (dist_rank == 0 && !mx) ok = dist_fail("out of host memory");
    MPI_Reduce(t, mx, reps * 4, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (dist_rank == 0 && mx)
        for (int k = 0; k < 4; k++) {
            qsort(mx + (size_t)k * (size_t)reps, (size_t)reps, sizeof(double), sph_cli_cmp_double);
            out->bench_ms[k] = mx[(size_t)k * (size_t)reps + (size_t)reps / 2] * 1e3;
        }
    free(t);
    free(mx);
    return ok;
}

/* One bin's host staging and its device copies. */
typedef struct bin_buf {
    void *h_h;
    int64_t *t_h, *c_h, *spans, n_spans;
    uint8_t *m_h;
    float *up_h[NF], *tp_h; /* tp_h: the rows' temperatures (temperature.npy) or NULL */
    void *h_d, *t_d, *c_d, *m_d, *st_d, *dh_d, *tp_d;
    void *tki_d, *tkl_d, *sp_d; /* --topk's (n, K) ids and log-probs, --sum-p2's (n) */
    void *up_d[NF], *row_d[NF];
} bin_buf;

static void bin_free(const dev *d, bin_buf *x) {
    void *bufs[] = {x->h_d,  x->t_d,   x->c_d,   x->m_d, x->st_d,
                    x->dh_d, x->tki_d, x->tkl_d, x->tp_d, x->sp_d};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) sph_ctx_free(d->io, bufs[k]);
    for (int f = 0; f < NF; f++) {
        sph_ctx_free(d->io, x->up_d[f]);
        sph_ctx_free(d->io, x->row_d[f]);
        free(x->up_h[f]);
    }
    free(x->h_h), free(x->t_h), free(x->c_h), free(x->m_h), free(x->spans), free(x->tp_h);
    memset(x, 0, sizeof *x);
}

/* Rows gr[0 .. n) of the batch staged on the device. Local rows from global rows; padding
 * rows (g < 0) are zero hidden, target -1 and zero upstream gradients, and inactive. */
static int stage_bin(const dev *d, const batch *b, const int64_t *gr, int64_t n, int64_t gap,
                     bin_buf *x) {
    const int64_t H = b->H, K = b->K, TK = b->topk;
    const int nf = K ? NF - 1 : NF; /* logit_mean is undefined with support */
    const size_t esz = b->bf16 ? 2 : 4;
    x->h_h = sph_cli_calloc((n * H), esz);
    x->t_h = sph_cli_calloc(n, sizeof(int64_t));
    x->c_h = K ? sph_cli_calloc((n * K), sizeof(int64_t)) : NULL;
    x->m_h = sph_cli_calloc(n, 1);
    x->spans = sph_cli_calloc((2 * ((n + 1) / 2) + 2), sizeof(int64_t));
    int all = 1;
    for (int f = 0; f < nf; f++) all &= (x->up_h[f] = sph_cli_calloc(n, sizeof(float))) != 0;
    if (b->temp) all &= (x->tp_h = sph_cli_calloc(n, sizeof(float))) != 0;
    if (!x->h_h || !x->t_h || (K && !x->c_h) || !x->m_h || !all || !x->spans)
        return dist_fail("out of host memory for a bin of %lld rows", (long long)n);
    for (int64_t i = 0; i < n; i++) {
        int64_t g = gr[i];
        for (int64_t j = 0; j < H; j++) {
            float v = g >= 0 ? b->hidden[(size_t)g * (size_t)H + (size_t)j] : 0.0f;
            if (b->bf16) ((uint16_t *)x->h_h)[i * H + j] = sph_cli_f32_to_bf16(v);
            else ((float *)x->h_h)[i * H + j] = v;
        }
        x->t_h[i] = g >= 0 ? b->targets[g] : -1;
        for (int64_t j = 0; j < K; j++) x->c_h[i * K + j] = g >= 0 ? b->cand[g * K + j] : -1;
        x->m_h[i] = g >= 0 ? b->mask[g] : 0;
        for (int f = 0; f < nf; f++) x->up_h[f][i] = g >= 0 ? b->up[f][g] : 0.0f;
        if (x->tp_h) x->tp_h[i] = g >= 0 ? b->temp[g] : 1.0f; /* padding: a valid 1 */
    }
    x->n_spans = 0;
    if (b->masked && sph_spans_from_mask(x->m_h, n, gap, x->spans, &x->n_spans))
        return dist_fail("sph_spans_from_mask: %s", sph_last_error());
    if (!dput(d, x->h_h, (size_t)(n * H) * esz, &x->h_d) ||
        !dput(d, x->t_h, (size_t)n * sizeof(int64_t), &x->t_d) ||
        (K && !dput(d, x->c_h, (size_t)(n * K) * sizeof(int64_t), &x->c_d)) ||
        !dput(d, x->m_h, (size_t)n, &x->m_d) ||
        !dput(d, NULL, (size_t)n * 3 * sizeof(float), &x->st_d) ||
        !dput(d, NULL, (size_t)(n * H) * sizeof(float), &x->dh_d) ||
        (TK && (!dput(d, NULL, (size_t)(n * TK) * sizeof(int64_t), &x->tki_d) ||
                !dput(d, NULL, (size_t)(n * TK) * sizeof(float), &x->tkl_d))) ||
        (b->sum_p2 && !dput(d, NULL, (size_t)n * sizeof(float), &x->sp_d)) ||
        (x->tp_h && !dput(d, x->tp_h, (size_t)n * sizeof(float), &x->tp_d)))
        return 0;
    for (int f = 0; f < nf; f++)
        if (!dput(d, x->up_h[f], (size_t)n * sizeof(float), &x->up_d[f]) ||
            !dput(d, NULL, (size_t)n * sizeof(float), &x->row_d[f]))
            return 0;
    return 1;
}

/* What every bin of dist_run_head shares. */
typedef struct head_job {
    sph_ctx_t ctx, bench_ctx;
    const dev *d;
    const batch *b;
    int64_t v0, V_loc;
    int allreduce, one_pass, bench_reps;
    void *w_d, *dw_d; /* the shard's weight rows and the dweight accumulated over the bins */
    void *ws;         /* the workspace, grown to the largest bin's */
    size_t ws_bytes;
} head_job;

/* The forward and backward of bin bi (rows [r0, r0 + n), staged in x), its outputs copied
 * into out; dweight accumulates after the first bin; --bench times bin 0. */
static int run_bin(head_job *j, bin_buf *x, int64_t bi, int64_t r0, int64_t n, result *out) {
    const dev *d = j->d;
    const batch *b = j->b;
    const int64_t H = b->H, K = b->K, V_loc = j->V_loc, TK = b->topk;
    const int cuda = d->cuda, nf = K ? NF - 1 : NF, one_pass = j->one_pass;
    const sph_dtype in_dt = b->bf16 ? SPH_BF16 : SPH_F32;
    int64_t s_h[2] = {n, H}, s_w[2] = {V_loc, H}, s_n[1] = {n}, s_c[2] = {n, K},
            s_st[2] = {n, 3}, s_dw[2] = {V_loc, H}, s_k[2] = {n, TK};
    sph_tensor th = tens(x->h_d, in_dt, 2, s_h, cuda), tw = tens(j->w_d, in_dt, 2, s_w, cuda),
               tt = tens(x->t_d, SPH_I64, 1, s_n, cuda), tc = tens(x->c_d, SPH_I64, 2, s_c, cuda),
               tm = tens(x->m_d, SPH_U8, 1, s_n, cuda),
               tst = tens(x->st_d, SPH_F32, 2, s_st, cuda),
               tdh = tens(x->dh_d, SPH_F32, 2, s_h, cuda),
               tdw = tens(j->dw_d, SPH_F32, 2, s_dw, cuda), tup[NF], trow[NF],
               tki = tens(x->tki_d, SPH_I64, 2, s_k, cuda),
               tkl = tens(x->tkl_d, SPH_F32, 2, s_k, cuda),
               ttp = tens(x->tp_d, SPH_F32, 1, s_n, cuda),
               tsp = tens(x->sp_d, SPH_F32, 1, s_n, cuda);
    for (int f = 0; f < nf; f++) {
        tup[f] = tens(x->up_d[f], SPH_F32, 1, s_n, cuda);
        trow[f] = tens(x->row_d[f], SPH_F32, 1, s_n, cuda);
    }
    sph_head_args a = SPH_HEAD_ARGS_INIT;
    a.hidden = &th;
    a.weight = &tw;
    a.targets = &tt;
    a.candidates = K ? &tc : NULL;
    a.vocab_start = j->v0;
    a.vocab_total = b->V;
    a.temperature = b->temperature;
    a.temperature_rows = x->tp_h ? &ttp : NULL;
    if (b->masked) {
        a.active_mask = &tm;
        a.spans = x->spans;
        a.n_spans = x->n_spans;
    }
    a.logprob = &trow[F_LOGPROB];
    a.entropy = &trow[F_ENTROPY];
    a.lse = &trow[F_LSE];
    a.logit_mean = K ? NULL : &trow[F_LOGIT_MEAN];
    a.stats = &tst;
    if (TK) a.topk_ids = &tki, a.topk_logprobs = &tkl; /* forward outputs only */
    if (b->sum_p2) a.sum_p2 = &tsp;
    /* Forward first, in the general (two-pass) mode: no gradient outputs, no upstream. */
    size_t need = 0, need_b = 0;
    sph_head_args ab = a;
    ab.dlogprob = &tup[F_LOGPROB];
    ab.dentropy = &tup[F_ENTROPY];
    ab.dlse = &tup[F_LSE];
    ab.dlogit_mean = K ? NULL : &tup[F_LOGIT_MEAN];
    ab.dhidden = &tdh;
    ab.dweight = &tdw;
    ab.accumulate_dweight = bi > 0;
    ab.allreduce_dhidden = j->allreduce;
    /* one-pass: the forward takes the upstream gradients and writes the gradients too */
    sph_status s = sph_head_workspace_size(j->ctx, SPH_HEAD_FORWARD, one_pass ? &ab : &a, &need);
    if (!s && !one_pass) s = sph_head_workspace_size(j->ctx, SPH_HEAD_BACKWARD, &ab, &need_b);
    if (s) return dist_fail("workspace size: %s", sph_last_error());
    if (need_b > need) need = need_b;
    if (need > j->ws_bytes) {
        sph_ctx_free(d->io, j->ws);
        j->ws = NULL;
        j->ws_bytes = 0;
        if (!dput(d, NULL, need, &j->ws)) return 0;
        j->ws_bytes = need;
    }
    s = sph_head_forward(j->ctx, one_pass ? &ab : &a, j->ws, j->ws_bytes);
    if (s)
        return dist_fail("sph_head_forward (bin %lld, %lld rows): %s", (long long)bi,
                         (long long)n, sph_last_error());
    if (!one_pass) s = sph_head_backward(j->ctx, &ab, j->ws, j->ws_bytes);
    if (s == SPH_OK) s = sph_ctx_synchronize(j->ctx);
    if (s)
        return dist_fail("sph_head_backward (bin %lld, %lld rows): %s", (long long)bi,
                         (long long)n, sph_last_error());
    for (int f = 0; f < nf; f++)
        if (!dget(d, out->row[f] + r0, x->row_d[f], (size_t)n * sizeof(float))) return 0;
    if (!dget(d, out->dhidden + (size_t)r0 * (size_t)H, x->dh_d, (size_t)(n * H) * sizeof(float)))
        return 0;
    if (TK && (!dget(d, out->topk_ids + r0 * TK, x->tki_d, (size_t)(n * TK) * sizeof(int64_t)) ||
               !dget(d, out->topk_lp + r0 * TK, x->tkl_d, (size_t)(n * TK) * sizeof(float))))
        return 0;
    if (b->sum_p2 && !dget(d, out->sum_p2 + r0, x->sp_d, (size_t)n * sizeof(float))) return 0;
    if (j->bench_reps > 0 && bi == 0) {
        void *dwt = NULL;
        if (!dist_agree(dput(d, NULL, (size_t)(V_loc * H) * sizeof(float), &dwt))) {
            sph_ctx_free(d->io, dwt);
            return 0;
        }
        sph_tensor tdwt = tens(dwt, SPH_F32, 2, s_dw, cuda);
        sph_head_args abt = ab;
        abt.dweight = &tdwt;
        int bok = bench_bin(j->ctx, j->bench_ctx, &abt, j->allreduce, j->ws, j->ws_bytes,
                            j->bench_reps, out);
        sph_ctx_free(d->io, dwt);
        if (!bok) return 0;
    }
    return 1;
}

int dist_run_head(sph_ctx_t ctx, const dev *d, const batch *b, const int64_t *grow,
                    const int64_t *bin_off, int64_t n_bins, int64_t v0, int64_t V_loc,
                    int64_t gap, int allreduce, int one_pass, sph_ctx_t bench_ctx,
                    int bench_reps, result *out) {
    const int64_t H = b->H, TK = b->topk;
    const size_t esz = b->bf16 ? 2 : 4;
    const int64_t n_all = bin_off[n_bins];
    int ok = 0;
    memset(out, 0, sizeof *out);
    head_job j = {ctx, bench_ctx, d, b, v0, V_loc, allreduce, one_pass, bench_reps,
                  NULL, NULL, NULL, 0};
    bin_buf x;
    memset(&x, 0, sizeof x);

    int all = 1;
    for (int f = 0; f < NF; f++) all &= (out->row[f] = sph_cli_calloc(n_all, sizeof(float))) != 0;
    out->dhidden = sph_cli_calloc(n_all * H, sizeof(float));
    out->dweight = sph_cli_calloc(V_loc * H, sizeof(float));
    if (TK) {
        out->topk_ids = sph_cli_calloc(n_all * TK, sizeof(int64_t));
        out->topk_lp = sph_cli_calloc(n_all * TK, sizeof(float));
        all &= out->topk_ids && out->topk_lp;
    }
    if (b->sum_p2) all &= (out->sum_p2 = sph_cli_calloc(n_all, sizeof(float))) != NULL;
    void *w_h = sph_cli_calloc(V_loc * H, esz);
    if (!all || !out->dhidden || !out->dweight || !w_h) {
        dist_fail("out of host memory for %lld rows", (long long)n_all);
        goto done;
    }
    for (int64_t i = 0; i < V_loc * H; i++) {
        float v = b->weight[(size_t)v0 * (size_t)H + (size_t)i];
        if (b->bf16) ((uint16_t *)w_h)[i] = sph_cli_f32_to_bf16(v);
        else ((float *)w_h)[i] = v;
    }
    if (!dput(d, w_h, (size_t)(V_loc * H) * esz, &j.w_d) ||
        !dput(d, NULL, (size_t)(V_loc * H) * sizeof(float), &j.dw_d))
        goto done;

    for (int64_t bi = 0; bi < n_bins; bi++) {
        const int64_t r0 = bin_off[bi], n = bin_off[bi + 1] - r0;
        if (!stage_bin(d, b, grow + r0, n, gap, &x) || !run_bin(&j, &x, bi, r0, n, out))
            goto done;
        bin_free(d, &x);
    }
    if (!dget(d, out->dweight, j.dw_d, (size_t)(V_loc * H) * sizeof(float))) goto done;
    ok = 1;
done:
    bin_free(d, &x);
    sph_ctx_free(d->io, j.w_d);
    sph_ctx_free(d->io, j.dw_d);
    sph_ctx_free(d->io, j.ws);
    free(w_h);
    if (!ok) dist_result_free(out);
    return ok;
}

#else
/* without MPI the file holds nothing; ISO C wants a declaration in every translation unit */
typedef int sph_run_dist_head_no_mpi;
#endif /* SPH_HAVE_MPI */
