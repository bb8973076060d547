/*
 * run_dist_head.c - one rank's forward + backward in the distributed runner (run_dist.c step
 * 5): each bin of the rank's share staged on its device, the head called through the public
 * API with the TP communicator, per-row outputs and dhidden copied back, dweight accumulated
 * over the bins; and --bench, which times the first bin with and without the collectives.
 */
#ifdef SPH_HAVE_MPI
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

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

int dist_run_head(sph_ctx_t ctx, const dev *d, const batch *b, const int64_t *grow,
                    const int64_t *bin_off, int64_t n_bins, int64_t v0, int64_t V_loc,
                    int64_t gap, int allreduce, int one_pass, sph_ctx_t bench_ctx,
                    int bench_reps, result *out) {
    const int64_t H = b->H, K = b->K;
    const int cuda = d->cuda, nf = K ? NF - 1 : NF; /* logit_mean is undefined with support */
    const size_t esz = b->bf16 ? 2 : 4;
    const sph_dtype in_dt = b->bf16 ? SPH_BF16 : SPH_F32;
    const int64_t n_all = bin_off[n_bins];
    int ok = 0;
    memset(out, 0, sizeof *out);
    void *w_d = NULL, *dw_d = NULL, *ws = NULL;
    size_t ws_bytes = 0;
    /* host staging of one bin, and its device copies */
    void *h_h = NULL;
    int64_t *t_h = NULL, *c_h = NULL, *spans = NULL;
    uint8_t *m_h = NULL;
    float *up_h[NF] = {NULL}, *tp_h = NULL;
    void *h_d = NULL, *t_d = NULL, *c_d = NULL, *m_d = NULL, *st_d = NULL, *dh_d = NULL;
    void *tp_d = NULL;
    void *up_d[NF] = {NULL}, *row_d[NF] = {NULL};

    int all = 1;
    for (int f = 0; f < NF; f++) all &= (out->row[f] = sph_cli_calloc(n_all, sizeof(float))) != 0;
    out->dhidden = sph_cli_calloc(n_all * H, sizeof(float));
    out->dweight = sph_cli_calloc(V_loc * H, sizeof(float));
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
    if (!dput(d, w_h, (size_t)(V_loc * H) * esz, &w_d) ||
        !dput(d, NULL, (size_t)(V_loc * H) * sizeof(float), &dw_d))
        goto done;

    for (int64_t bi = 0; bi < n_bins; bi++) {
        const int64_t r0 = bin_off[bi], n = bin_off[bi + 1] - r0;
        const int64_t *gr = grow + r0;
        h_h = sph_cli_calloc((n * H), esz);
        t_h = sph_cli_calloc(n, sizeof(int64_t));
        c_h = K ? sph_cli_calloc((n * K), sizeof(int64_t)) : NULL;
        m_h = sph_cli_calloc(n, 1);
        spans = sph_cli_calloc((2 * ((n + 1) / 2) + 2), sizeof(int64_t));
        all = 1;
        for (int f = 0; f < nf; f++) all &= (up_h[f] = sph_cli_calloc(n, sizeof(float))) != 0;
        if (b->temp) all &= (tp_h = sph_cli_calloc(n, sizeof(float))) != 0;
        if (!h_h || !t_h || (K && !c_h) || !m_h || !all || !spans) {
            dist_fail("out of host memory for a bin of %lld rows", (long long)n);
            goto done;
        }
        /* Local rows from global rows; padding rows (g < 0) are zero hidden, target -1 and
         * zero upstream gradients, and inactive. */
        for (int64_t i = 0; i < n; i++) {
            int64_t g = gr[i];
            for (int64_t j = 0; j < H; j++) {
                float v = g >= 0 ? b->hidden[(size_t)g * (size_t)H + (size_t)j] : 0.0f;
                if (b->bf16) ((uint16_t *)h_h)[i * H + j] = sph_cli_f32_to_bf16(v);
                else ((float *)h_h)[i * H + j] = v;
            }
            t_h[i] = g >= 0 ? b->targets[g] : -1;
            for (int64_t j = 0; j < K; j++) c_h[i * K + j] = g >= 0 ? b->cand[g * K + j] : -1;
            m_h[i] = g >= 0 ? b->mask[g] : 0;
            for (int f = 0; f < nf; f++) up_h[f][i] = g >= 0 ? b->up[f][g] : 0.0f;
            if (tp_h) tp_h[i] = g >= 0 ? b->temp[g] : 1.0f; /* padding: a valid 1 */
        }
        int64_t n_spans = 0;
        if (b->masked && sph_spans_from_mask(m_h, n, gap, spans, &n_spans)) {
            dist_fail("sph_spans_from_mask: %s", sph_last_error());
            goto done;
        }
        if (!dput(d, h_h, (size_t)(n * H) * esz, &h_d) ||
            !dput(d, t_h, (size_t)n * sizeof(int64_t), &t_d) ||
            (K && !dput(d, c_h, (size_t)(n * K) * sizeof(int64_t), &c_d)) ||
            !dput(d, m_h, (size_t)n, &m_d) ||
            !dput(d, NULL, (size_t)n * 3 * sizeof(float), &st_d) ||
            !dput(d, NULL, (size_t)(n * H) * sizeof(float), &dh_d) ||
            (tp_h && !dput(d, tp_h, (size_t)n * sizeof(float), &tp_d)))
            goto done;
        for (int f = 0; f < nf; f++)
            if (!dput(d, up_h[f], (size_t)n * sizeof(float), &up_d[f]) ||
                !dput(d, NULL, (size_t)n * sizeof(float), &row_d[f]))
                goto done;

        int64_t s_h[2] = {n, H}, s_w[2] = {V_loc, H}, s_n[1] = {n}, s_c[2] = {n, K},
                s_st[2] = {n, 3}, s_dw[2] = {V_loc, H};
        sph_tensor th = tens(h_d, in_dt, 2, s_h, cuda), tw = tens(w_d, in_dt, 2, s_w, cuda),
                   tt = tens(t_d, SPH_I64, 1, s_n, cuda), tc = tens(c_d, SPH_I64, 2, s_c, cuda),
                   tm = tens(m_d, SPH_U8, 1, s_n, cuda), tst = tens(st_d, SPH_F32, 2, s_st, cuda),
                   tdh = tens(dh_d, SPH_F32, 2, s_h, cuda),
                   tdw = tens(dw_d, SPH_F32, 2, s_dw, cuda), tup[NF], trow[NF],
                   ttp = tens(tp_d, SPH_F32, 1, s_n, cuda);
        for (int f = 0; f < nf; f++) {
            tup[f] = tens(up_d[f], SPH_F32, 1, s_n, cuda);
            trow[f] = tens(row_d[f], SPH_F32, 1, s_n, cuda);
        }
        sph_head_args a = SPH_HEAD_ARGS_INIT;
        a.hidden = &th;
        a.weight = &tw;
        a.targets = &tt;
        a.candidates = K ? &tc : NULL;
        a.vocab_start = v0;
        a.vocab_total = b->V;
        a.temperature = b->temperature;
        a.temperature_rows = tp_h ? &ttp : NULL;
        if (b->masked) {
            a.active_mask = &tm;
            a.spans = spans;
            a.n_spans = n_spans;
        }
        a.logprob = &trow[F_LOGPROB];
        a.entropy = &trow[F_ENTROPY];
        a.lse = &trow[F_LSE];
        a.logit_mean = K ? NULL : &trow[F_LOGIT_MEAN];
        a.stats = &tst;
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
        ab.allreduce_dhidden = allreduce;
        /* one-pass: the forward takes the upstream gradients and writes the gradients too */
        sph_status s = sph_head_workspace_size(ctx, SPH_HEAD_FORWARD, one_pass ? &ab : &a, &need);
        if (!s && !one_pass) s = sph_head_workspace_size(ctx, SPH_HEAD_BACKWARD, &ab, &need_b);
        if (s) {
            dist_fail("workspace size: %s", sph_last_error());
            goto done;
        }
        if (need_b > need) need = need_b;
        if (need > ws_bytes) {
            sph_ctx_free(d->io, ws);
            ws = NULL;
            ws_bytes = 0;
            if (!dput(d, NULL, need, &ws)) goto done;
            ws_bytes = need;
        }
        s = sph_head_forward(ctx, one_pass ? &ab : &a, ws, ws_bytes);
        if (s) {
            dist_fail("sph_head_forward (bin %lld, %lld rows): %s", (long long)bi, (long long)n,
                  sph_last_error());
            goto done;
        }
        if (!one_pass) s = sph_head_backward(ctx, &ab, ws, ws_bytes);
        if (s == SPH_OK) s = sph_ctx_synchronize(ctx);
        if (s) {
            dist_fail("sph_head_backward (bin %lld, %lld rows): %s", (long long)bi, (long long)n,
                  sph_last_error());
            goto done;
        }
        for (int f = 0; f < nf; f++)
            if (!dget(d, out->row[f] + r0, row_d[f], (size_t)n * sizeof(float))) goto done;
        if (!dget(d, out->dhidden + (size_t)r0 * (size_t)H, dh_d, (size_t)(n * H) * sizeof(float)))
            goto done;
        if (bench_reps > 0 && bi == 0) {
            void *dwt = NULL;
            if (!dist_agree(dput(d, NULL, (size_t)(V_loc * H) * sizeof(float), &dwt))) {
                sph_ctx_free(d->io, dwt);
                goto done;
            }
            sph_tensor tdwt = tens(dwt, SPH_F32, 2, s_dw, cuda);
            sph_head_args abt = ab;
            abt.dweight = &tdwt;
            int bok = bench_bin(ctx, bench_ctx, &abt, allreduce, ws, ws_bytes, bench_reps, out);
            sph_ctx_free(d->io, dwt);
            if (!bok) goto done;
        }
        void **bufs[] = {&h_d, &t_d, &c_d, &m_d, &st_d, &dh_d, &tp_d};
        for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) {
            sph_ctx_free(d->io, *bufs[k]);
            *bufs[k] = NULL;
        }
        for (int f = 0; f < NF; f++) {
            sph_ctx_free(d->io, up_d[f]);
            sph_ctx_free(d->io, row_d[f]);
            free(up_h[f]);
            up_d[f] = row_d[f] = NULL;
            up_h[f] = NULL;
        }
        free(h_h), free(t_h), free(c_h), free(m_h), free(spans), free(tp_h);
        h_h = NULL, t_h = NULL, c_h = NULL, m_h = NULL, spans = NULL, tp_h = NULL;
    }
    if (!dget(d, out->dweight, dw_d, (size_t)(V_loc * H) * sizeof(float))) goto done;
    ok = 1;
done:
    {
        void *bufs[] = {h_d, t_d, c_d, m_d, st_d, dh_d, w_d, dw_d, ws, tp_d};
        for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) sph_ctx_free(d->io, bufs[k]);
        for (int f = 0; f < NF; f++) {
            sph_ctx_free(d->io, up_d[f]);
            sph_ctx_free(d->io, row_d[f]);
            free(up_h[f]);
        }
    }
    free(w_h);
    free(h_h), free(t_h), free(c_h), free(m_h), free(spans), free(tp_h);
    if (!ok) dist_result_free(out);
    return ok;
}

#else
/* without MPI the file holds nothing; ISO C wants a declaration in every translation unit */
typedef int sph_run_dist_head_no_mpi;
#endif /* SPH_HAVE_MPI */
