/*
 * test_head_cuda_tp.c - the CUDA head under tensor parallelism and with a tune cache.
 *
 * TP: two (or three) ranks in threads on one GPU, each with its own context, stream and vocab
 * shard, combine through an in-process communicator on device buffers (the same ops table
 * NCCL fills; allgather by device copies in rank order). Sharded logprob / entropy / lse /
 * logit_mean / stats must match the unsharded float64 reference (entropy also the
 * independent -sum p log p), dW shards its rows, and dH summed by allreduce_dhidden the
 * reference dH (tolerances.h budgets); full vocabulary and sample support, general and
 * one-pass; and with per-row temperatures (issue 25: against the reference alone, gradients
 * normwise). Full-vocabulary cases (scalar and per-row temperatures) also ask for issue 25's
 * extras (top-64 and sum_p2, merged over the ranks by their own allgathers), checked
 * against topk_check.h's float64 oracle and a dense sum p^2; support cases for sum_p2 over
 * the candidates (each rank's (m, q) of its own candidates, merged the same way). A rank
 * that fails makes its peers' collectives fail at once (no wait for the test timeout).
 * Tune cache: a hand-written entry for this GPU changes the chunking (visible in the
 * workspace size) and results stay exact; a malformed file is ignored; sph_tune writes an
 * entry that a new context reads.
 * GEMM rates: sph_tune_gemm_rate and sph_tune_gemm_rate_sustained give positive finite rates.
 */
#ifndef SPH_HAVE_CUDA
/* A build without CUDA: nothing to test here (the CUDA headers may not even exist). */
#include <stdio.h>
int main(void) {
    printf("no CUDA device: skipping (spanhead was built without CUDA)\n");
    return 77;
}
#else
#include <cuda_runtime.h>
#include <unistd.h>

#include "../parity/test_head_case.h"
#include "../parity/topk_check.h"
#include "head/plan.h"
#include "head/host.h"

static sph_rng g_rng;

// ---- in-process communicator on device buffers ----------------------------------------------

typedef struct dgroup {
    int64_t size;
    tp_group sync; /* test_head_case.h's barrier: fails every rank once one rank gives up */
    const void *send[8];
    float *bufs[8];
    cudaStream_t streams[8];
} dgroup;

/* Every rank publishes its buffer after its stream has finished writing it; then each copies
 * the others' in rank order. Synchronous: a test stand-in for NCCL, not capturable. A failed
 * or abandoned collective fails on every rank instead of leaving them in a barrier. */
static sph_status d_allgather(sph_comm_t c, const void *send, void *recv, size_t bytes,
                              void *stream) {
    dgroup *g = c->impl;
    if (cudaStreamSynchronize((cudaStream_t)stream) != cudaSuccess) {
        tp_group_abort(&g->sync);
        return SPH_ERR_CUDA;
    }
    g->send[c->rank] = send;
    if (tp_barrier(&g->sync)) return tp_peer_failed();
    /* on the rank's stream, synchronized before the barrier: a plain cudaMemcpy between device
     * buffers returns before the copy is done (and runs on the legacy stream, which the
     * context's non-blocking stream does not wait for), so a peer could reuse its send buffer
     * under the copy; seen as wrong results only when the GPU was shared (run 26) */
    for (int64_t r = 0; r < g->size; r++)
        if (cudaMemcpyAsync((char *)recv + (size_t)r * bytes, g->send[r], bytes,
                            cudaMemcpyDefault, (cudaStream_t)stream) != cudaSuccess) {
            tp_group_abort(&g->sync);
            return SPH_ERR_CUDA;
        }
    if (cudaStreamSynchronize((cudaStream_t)stream) != cudaSuccess) {
        tp_group_abort(&g->sync);
        return SPH_ERR_CUDA;
    }
    if (tp_barrier(&g->sync)) return tp_peer_failed();
    return SPH_OK;
}

static sph_status d_allreduce(sph_comm_t c, float *buf, size_t count, void *stream) {
    dgroup *g = c->impl;
    if (cudaStreamSynchronize((cudaStream_t)stream) != cudaSuccess) {
        tp_group_abort(&g->sync);
        return SPH_ERR_CUDA;
    }
    float *mine = malloc(count * 4 + 4), *tmp = malloc(count * 4 + 4);
    if (cudaMemcpy(mine, buf, count * 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(mine), free(tmp);
        tp_group_abort(&g->sync);
        return SPH_ERR_CUDA;
    }
    g->bufs[c->rank] = mine;
    sph_status st = SPH_OK;
    if (tp_barrier(&g->sync)) {
        st = tp_peer_failed();
    } else {
        for (size_t k = 0; k < count; k++) tmp[k] = 0;
        for (int64_t r = 0; r < g->size; r++)
            for (size_t k = 0; k < count; k++) tmp[k] += g->bufs[r][k];
        /* a pageable host -> device cudaMemcpy may return before its DMA lands, on the legacy
         * stream: the copy goes on the rank's stream and is waited for before tmp is freed and
         * before the pass's later work on that stream reads buf */
        if (tp_barrier(&g->sync)) st = tp_peer_failed();
        else if (cudaMemcpyAsync(buf, tmp, count * 4, cudaMemcpyHostToDevice,
                                 (cudaStream_t)stream) != cudaSuccess ||
                 cudaStreamSynchronize((cudaStream_t)stream) != cudaSuccess)
            st = SPH_ERR_CUDA;
    }
    free(mine), free(tmp);
    return st;
}

static void d_destroy(sph_comm_t c) { (void)c; }
static const sph_comm_ops d_ops = {d_allgather, d_allreduce, d_destroy};

// ---- one rank ------------------------------------------------------------------------------

/* Per-row temperatures (issue 25) of the current tp_case, host (N), or NULL: the scalar 0.8. */
static float *g_trows;

typedef struct rank_job {
    dgroup *g;
    int64_t rank;
    hcase *full; /* unsharded host case (reference inputs) */
    int64_t v0, V_loc;
    int one_pass;
    /* results, host */
    float *lp, *ent, *lse, *lm, *stats, *dh, *dw;
    int64_t *tki; /* full vocabulary: top-64 ids, log-probs, sum_p2 (issue 25) */
    float *tkl, *sp2;
    int ok;
    char err[256];
} rank_job;

static void *rank_main(void *arg) {
    rank_job *j = arg;
    hcase *c = j->full;
    const int64_t N = c->N, H = c->H, K = c->K;
    struct sph_comm comm;
    memset(&comm, 0, sizeof comm);
    comm.backend = SPH_COMM_NCCL;
    comm.rank = j->rank;
    comm.size = j->g->size;
    comm.ops = &d_ops;
    comm.device_buffers = 1;
    comm.impl = j->g;
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    if (sph_ctx_opts_apply_env(&o) != SPH_OK) { /* the device scripts' SPH_CUDA_* reruns */
        snprintf(j->err, sizeof j->err, "opts: %s", sph_last_error());
        return NULL;
    }
    o.device.type = SPH_DEVICE_CUDA;
    o.stream = st;
    o.tp_comm = &comm;
    o.chunk_bytes = 48 * 1024; /* several chunks and splits per rank */
    o.tune_cache = "/nonexistent/tune.json";
    sph_ctx_t ctx = NULL;
    j->ok = 0;
    if (sph_ctx_create(&ctx, &o) != SPH_OK) {
        snprintf(j->err, sizeof j->err, "ctx: %s", sph_last_error());
        tp_group_abort(&j->g->sync); /* the peers' collectives fail instead of waiting */
        return NULL;
    }
    size_t es = c->dt.bits / 8;
    void *dh_, *dw_, *dt_, *dc = NULL, *dlp, *dent, *dlse, *dlm, *dst, *dg, *de, *dgl, *dgm, *ddh,
                                *ddw;
    sph_ctx_malloc(ctx, (size_t)(N * H) * es, &dh_);
    sph_ctx_malloc(ctx, (size_t)(j->V_loc * H) * es, &dw_);
    sph_ctx_memcpy(ctx, dh_, c->h, (size_t)(N * H) * es);
    sph_ctx_memcpy(ctx, dw_, (char *)c->w + (size_t)(j->v0 * H) * es, (size_t)(j->V_loc * H) * es);
    sph_ctx_malloc(ctx, (size_t)N * 8, &dt_);
    sph_ctx_memcpy(ctx, dt_, c->tgt, (size_t)N * 8);
    if (K) {
        sph_ctx_malloc(ctx, (size_t)(N * K) * 8, &dc);
        sph_ctx_memcpy(ctx, dc, c->cand, (size_t)(N * K) * 8);
    }
    void **outs[] = {&dlp, &dent, &dlse, &dlm, &dg, &de, &dgl, &dgm};
    float *srcs[] = {NULL, NULL, NULL, NULL, c->g, c->e, c->gl, c->gm};
    for (int k = 0; k < 8; k++) {
        sph_ctx_malloc(ctx, (size_t)N * 4, outs[k]);
        if (srcs[k]) sph_ctx_memcpy(ctx, *outs[k], srcs[k], (size_t)N * 4);
        else sph_ctx_memset(ctx, *outs[k], 0xff, (size_t)N * 4);
    }
    sph_ctx_malloc(ctx, (size_t)N * 12, &dst);
    sph_ctx_malloc(ctx, (size_t)(N * H) * 4, &ddh);
    sph_ctx_malloc(ctx, (size_t)(j->V_loc * H) * 4, &ddw);
    sph_ctx_memset(ctx, ddh, 0xff, (size_t)(N * H) * 4);
    sph_ctx_memset(ctx, ddw, 0xff, (size_t)(j->V_loc * H) * 4);
    int64_t sh[8][2] = {{N, H}, {j->V_loc, H}, {N, 0}, {N, 3}, {N, K}};
    sph_device d = {SPH_DEVICE_CUDA, 0};
    sph_tensor th = {dh_, d, 2, c->dt, sh[0], NULL, 0}, tw = {dw_, d, 2, c->dt, sh[1], NULL, 0};
    sph_tensor tt = {dt_, d, 1, SPH_I64, sh[2], NULL, 0}, tc = {dc, d, 2, SPH_I64, sh[4], NULL, 0};
    sph_tensor tlp = {dlp, d, 1, SPH_F32, sh[2], NULL, 0}, tent = {dent, d, 1, SPH_F32, sh[2], NULL, 0};
    sph_tensor tlse = {dlse, d, 1, SPH_F32, sh[2], NULL, 0}, tlm = {dlm, d, 1, SPH_F32, sh[2], NULL, 0};
    sph_tensor tst = {dst, d, 2, SPH_F32, sh[3], NULL, 0};
    sph_tensor tg = {dg, d, 1, SPH_F32, sh[2], NULL, 0}, te = {de, d, 1, SPH_F32, sh[2], NULL, 0};
    sph_tensor tgl = {dgl, d, 1, SPH_F32, sh[2], NULL, 0}, tgm = {dgm, d, 1, SPH_F32, sh[2], NULL, 0};
    sph_tensor tdh = {ddh, d, 2, SPH_F32, sh[0], NULL, 0}, tdw = {ddw, d, 2, SPH_F32, sh[1], NULL, 0};
    void *dtki = NULL, *dtkl = NULL, *dsp2 = NULL;
    int64_t sh_k[2] = {N, 64};
    if (!K) {
        sph_ctx_malloc(ctx, (size_t)(N * 64) * 8, &dtki);
        sph_ctx_malloc(ctx, (size_t)(N * 64) * 4, &dtkl);
        sph_ctx_memset(ctx, dtkl, 0xff, (size_t)(N * 64) * 4);
    }
    sph_ctx_malloc(ctx, (size_t)N * 4, &dsp2); /* sum_p2: full vocabulary and support */
    sph_ctx_memset(ctx, dsp2, 0xff, (size_t)N * 4);
    sph_tensor ttki = {dtki, d, 2, SPH_I64, sh_k, NULL, 0};
    sph_tensor ttkl = {dtkl, d, 2, SPH_F32, sh_k, NULL, 0};
    sph_tensor tsp2 = {dsp2, d, 1, SPH_F32, sh[2], NULL, 0};
    sph_head_args a = SPH_HEAD_ARGS_INIT;
    a.hidden = &th, a.weight = &tw, a.targets = &tt, a.candidates = K ? &tc : NULL;
    a.vocab_start = j->v0, a.vocab_total = c->V;
    a.temperature = 0.8, a.softcap = 6.0;
    void *dtr = NULL;
    sph_tensor ttr = {NULL, d, 1, SPH_F32, sh[2], NULL, 0};
    if (g_trows) { /* every rank the same per-row temperatures */
        sph_ctx_malloc(ctx, (size_t)N * 4, &dtr);
        sph_ctx_memcpy(ctx, dtr, g_trows, (size_t)N * 4);
        ttr.data = dtr;
        a.temperature_rows = &ttr, a.temperature = 1.0;
    }
    a.logprob = &tlp, a.entropy = &tent, a.lse = &tlse, a.logit_mean = K ? NULL : &tlm;
    a.stats = &tst;
    sph_head_args b = a;
    b.logprob = b.entropy = b.lse = b.logit_mean = NULL;
    b.dlogprob = &tg, b.dentropy = &te, b.dlse = &tgl, b.dlogit_mean = K ? NULL : &tgm;
    b.dhidden = &tdh, b.dweight = &tdw, b.allreduce_dhidden = 1;
    if (j->one_pass) {
        sph_head_args f = b;
        f.logprob = a.logprob, f.entropy = a.entropy, f.lse = a.lse, f.logit_mean = a.logit_mean;
        a = f;
    }
    if (!K) a.topk_ids = &ttki, a.topk_logprobs = &ttkl;
    a.sum_p2 = &tsp2;
    size_t w1 = 0, w2 = 0;
    sph_status s = sph_head_workspace_size(ctx, SPH_HEAD_FORWARD, &a, &w1);
    if (s == SPH_OK && !j->one_pass) s = sph_head_workspace_size(ctx, SPH_HEAD_BACKWARD, &b, &w2);
    void *ws = NULL;
    if (s == SPH_OK) s = sph_ctx_malloc(ctx, w1 > w2 ? w1 : w2, &ws);
    if (s == SPH_OK) s = sph_head_forward(ctx, &a, ws, w1 > w2 ? w1 : w2);
    if (s == SPH_OK && !j->one_pass) s = sph_head_backward(ctx, &b, ws, w1 > w2 ? w1 : w2);
    if (s == SPH_OK) s = sph_ctx_synchronize(ctx);
    if (s != SPH_OK) {
        snprintf(j->err, sizeof j->err, "rank %lld: %s", (long long)j->rank, sph_last_error());
        /* the peers' next (or current) collective fails at once instead of waiting for the
         * test timeout */
        tp_group_abort(&j->g->sync);
        sph_ctx_destroy(ctx);
        cudaStreamDestroy(st);
        return NULL;
    }
    sph_ctx_memcpy(ctx, j->lp, dlp, (size_t)N * 4);
    sph_ctx_memcpy(ctx, j->ent, dent, (size_t)N * 4);
    sph_ctx_memcpy(ctx, j->lse, dlse, (size_t)N * 4);
    sph_ctx_memcpy(ctx, j->lm, dlm, (size_t)N * 4);
    sph_ctx_memcpy(ctx, j->stats, dst, (size_t)N * 12);
    sph_ctx_memcpy(ctx, j->dh, ddh, (size_t)(N * H) * 4);
    sph_ctx_memcpy(ctx, j->dw, ddw, (size_t)(j->V_loc * H) * 4);
    if (!K) {
        sph_ctx_memcpy(ctx, j->tki, dtki, (size_t)(N * 64) * 8);
        sph_ctx_memcpy(ctx, j->tkl, dtkl, (size_t)(N * 64) * 4);
    }
    sph_ctx_memcpy(ctx, j->sp2, dsp2, (size_t)N * 4);
    void *ps[] = {dh_, dw_, dt_, dc, dlp, dent, dlse, dlm, dst, dg, de, dgl, dgm, ddh, ddw, ws,
                  dtr, dtki, dtkl, dsp2};
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) sph_ctx_free(ctx, ps[k]);
    sph_ctx_destroy(ctx);
    cudaStreamDestroy(st);
    j->ok = 1;
    return NULL;
}

/* Issue 25's extras of one rank (top-64, sum_p2) against float64 over the whole vocabulary,
 * or (support) sum_p2 over the row's candidates: T 0.8 or the rows' own temperatures,
 * softcap 6. */
static int extras_ok(const char *cs, int64_t r, const rank_job *j, const hcase *c,
                     const uint8_t *act, const float *trows, double ft) {
    const int64_t N = c->N, V = c->K ? c->K : c->V_loc;
    int ok = c->K || check_topk_rows(cs, j->tki, j->tkl, 64, c, act, 0.8, trows, 6.0, ft, 1e-3);
    double md = 0, mr = 0;
    for (int64_t i = 0; i < N; i++) {
        const double T = trows ? (double)trows[i] : 0.8;
        double m = -INFINITY, S = 0, Q = 0;
        /* column v: the vocabulary's, or (support) the row's candidate v (-1: padding) */
#define COL(v) (c->K ? c->cand[i * c->K + (v)] : (v))
        for (int64_t v = 0; v < V; v++) {
            if (COL(v) < 0) continue;
            const double z = 6.0 * tanh(hc_u(c, i, COL(v)) / 6.0) / T;
            if (z > m) m = z;
        }
        for (int64_t v = 0; v < V; v++) {
            if (COL(v) < 0) continue;
            const double e = exp(6.0 * tanh(hc_u(c, i, COL(v)) / 6.0) / T - m);
            S += e, Q += e * e;
        }
#undef COL
        const double ref = Q / (S * S), dd = fabs((double)j->sp2[i] - ref);
        if (!(dd <= md)) md = dd;
        if (ref > mr) mr = ref;
    }
    if (!(md <= ft * mr)) {
        print_error("FAIL %s rank %lld: sum_p2 normwise error %.3e\n", cs, (long long)r, md / mr);
        ok = 0;
    }
    return ok;
}

static int tp_case(int64_t ranks, int64_t K, sph_dtype dt, int one_pass, int trows) {
    const int64_t N = 61, H = 40, V = 1001;
    hcase c;
    hc_init(&c, &g_rng, N, H, V, V, 0, K, dt);
    hc_wire(&c, HC_LP | HC_ENT | HC_LSE | HC_LM | HC_G | HC_E | HC_GL | HC_GM | HC_DH | HC_DW);
    c.a.temperature = 0.8, c.a.softcap = 6.0;
    int64_t sh_t[1] = {N};
    sph_tensor ttr;
    g_trows = NULL;
    if (trows) { /* T_i in [0.25, 4]; the reference reads the host copy */
        g_trows = hc_alloc((size_t)N * 4);
        for (int64_t i = 0; i < N; i++) g_trows[i] = (float)(0.25 * pow(16.0, rng_uniform(&g_rng)));
        ttr = tensor1(g_trows, SPH_F32, sh_t, N);
        c.a.temperature_rows = &ttr, c.a.temperature = 1.0;
    }
    /* reference: unsharded */
    sph_ctx_t rc = hc_ctx("ref", 1, NULL);
    sph_head_plan p;
    expect_ok(sph_head_plan_make(rc, SPH_HEAD_BACKWARD, &c.a, &p));
    double *rows = hc_alloc((size_t)N * 7 * 8), *st = hc_alloc((size_t)N * 24);
    expect_ok(sph_head_ref_rows_f64(&p, rows));
    for (int64_t i = 0; i < N; i++)
        for (int f = 0; f < 3; f++) st[i * 3 + f] = rows[i * 7 + 4 + f];
    double *rdh = hc_alloc((size_t)(N * H) * 8), *rdw = hc_alloc((size_t)(V * H) * 8);
    expect_ok(sph_head_ref_backward_f64(&p, st, rdh, rdw));
    sph_ctx_destroy(rc);

    dgroup g;
    memset(&g, 0, sizeof g);
    g.size = ranks;
    tp_group_init(&g.sync, ranks);
    rank_job jobs[4];
    pthread_t th[4];
    float *dw_all = hc_alloc((size_t)(V * H) * 4);
    for (int64_t r = 0; r < ranks; r++) {
        rank_job *j = &jobs[r];
        memset(j, 0, sizeof *j);
        j->g = &g, j->rank = r, j->full = &c, j->one_pass = one_pass;
        j->v0 = V * r / ranks, j->V_loc = V * (r + 1) / ranks - j->v0;
        j->lp = hc_alloc((size_t)N * 4), j->ent = hc_alloc((size_t)N * 4);
        j->lse = hc_alloc((size_t)N * 4), j->lm = hc_alloc((size_t)N * 4);
        j->stats = hc_alloc((size_t)N * 12), j->dh = hc_alloc((size_t)(N * H) * 4);
        j->dw = dw_all + j->v0 * H;
        j->tki = hc_alloc((size_t)(N * 64) * 8), j->tkl = hc_alloc((size_t)(N * 64) * 4);
        j->sp2 = hc_alloc((size_t)N * 4);
        pthread_create(&th[r], NULL, rank_main, j);
    }
    for (int64_t r = 0; r < ranks; r++) pthread_join(th[r], NULL);
    char cs[128];
    snprintf(cs, sizeof cs, "head_cuda_tp(ranks=%lld,K=%lld,dtype=%s,one_pass=%d,trows=%d)",
             (long long)ranks, (long long)K, sph_dtype_name(dt), one_pass, trows);
    int ok = 1;
    /* tolerances.h: per-row outputs TOL_CUDA_F32 / TOL_CUDA_HALF_ROWS; gradients with the
     * dlogits' rounding u_D times A from the independent backward */
    const double ft = dt.bits == 16 ? TOL_CUDA_HALF_ROWS : TOL_CUDA_F32;
    const double uD = dt.bits != 16 ? 0 : dt.code == SPH_DTYPE_BFLOAT ? TOL_U_BF16 : TOL_U_F16;
    const double etaD = dt.bits == 16 && dt.code == SPH_DTYPE_FLOAT ? TOL_ETA_F16 : 0;
    uint8_t *act = hc_alloc((size_t)N);
    memset(act, 1, (size_t)N);
    double *ind = hc_alloc((size_t)N * HC_IND * 8);
    double *adh = hc_alloc((size_t)(N * H) * 8), *adw = hc_alloc((size_t)(V * H) * 8);
    double *zdh = hc_alloc((size_t)(N * H) * 8), *zdw = hc_alloc((size_t)(V * H) * 8);
    c.a.temperature = 0.8, c.a.softcap = 6.0;
    hc_indep_forward(&c, 0.8, 6.0, act, ind);
    hc_indep_backward(&c, 0.8, 6.0, act, ind, HC_UPS, NULL, NULL, adh, adw, zdh, zdw);
    for (int64_t r = 0; r < ranks; r++) {
        rank_job *j = &jobs[r];
        if (!j->ok) {
            print_error("%s: %s\n", cs, j->err);
            ok = 0;
            continue;
        }
        float *outs[4] = {j->lp, j->ent, j->lse, j->lm};
        const char *names[4] = {"logprob", "entropy", "lse", "logit_mean"};
        for (int f = 0; f < (K ? 3 : 4); f++)
            ok &= hc_close_col(names[f], cs, outs[f], 1, rows, 7, f, N, ft);
        if (trows) { /* the independent sums take one temperature: the reference alone, and
                      * the normwise gradient budget (no A sums) */
            const double gt = dt.bits == 16 ? TOL_CUDA_HALF_GRAD_NORM(dt) : TOL_CUDA_F32;
            ok &= hc_close_col("stats.mu", cs, j->stats + 2, 3, rows, 7, 6, N, ft);
            ok &= hc_close("dhidden (allreduced)", cs, j->dh, SPH_F32, rdh, SPH_F64, N * H, gt);
            ok &= extras_ok(cs, r, j, &c, act, g_trows, ft);
            continue;
        }
        ok &= hc_close_col("entropy -sum p log p", cs, j->ent, 1, ind, HC_IND, 1, N, ft);
        ok &= hc_close_col("stats.m", cs, j->stats, 3, rows, 7, 4, N, ft);
        ok &= hc_close_col("stats.lse", cs, j->stats + 1, 3, rows, 7, 5, N, ft);
        ok &= hc_close_col("stats.mu", cs, j->stats + 2, 3, rows, 7, 6, N, ft);
        ok &= hc_check_grad("dhidden (allreduced)", cs, j->dh, SPH_F32, rdh, rdh, adh, zdh, N * H,
                            TOL_CUDA_F32, uD, etaD, TOL_ACC_CUDA, TOL_CUDA_MARGIN);
        ok &= extras_ok(cs, r, j, &c, act, NULL, ft);
    }
    if (ok && trows)
        ok &= hc_close("dweight (shards)", cs, dw_all, SPH_F32, rdw, SPH_F64, V * H,
                       dt.bits == 16 ? TOL_CUDA_HALF_GRAD_NORM(dt) : TOL_CUDA_F32);
    else if (ok)
        ok &= hc_check_grad("dweight (shards)", cs, dw_all, SPH_F32, rdw, rdw, adw, zdw, V * H,
                            TOL_CUDA_F32, uD, etaD, TOL_ACC_CUDA, TOL_CUDA_MARGIN);
    free(act), free(ind), free(adh), free(adw), free(zdh), free(zdw);
    for (int64_t r = 0; r < ranks; r++) {
        rank_job *j = &jobs[r];
        free(j->lp), free(j->ent), free(j->lse), free(j->lm), free(j->stats), free(j->dh);
        free(j->tki), free(j->tkl), free(j->sp2);
    }
    tp_group_destroy(&g.sync);
    free(rows), free(st), free(rdh), free(rdw), free(dw_all), free(g_trows);
    g_trows = NULL;
    hc_free(&c);
    return ok;
}

static void test_tp(void **state) {
    (void)state;
    int ok = 1;
    ok &= tp_case(2, 0, SPH_BF16, 0, 0);
    ok &= tp_case(3, 0, SPH_F32, 1, 0);
    ok &= tp_case(2, 7, SPH_F16, 0, 0);
    ok &= tp_case(2, 7, SPH_BF16, 1, 0);
    /* per-row temperatures (issue 25): the combine is unchanged, m and mu in each row's units */
    ok &= tp_case(2, 0, SPH_BF16, 0, 1);
    ok &= tp_case(3, 0, SPH_F32, 1, 1);
    ok &= tp_case(2, 7, SPH_BF16, 1, 1);
    assert_true(ok);
}

// ---- tune cache -----------------------------------------------------------------------------

static void test_tune_cache(void **state) {
    (void)state;
    struct cudaDeviceProp prop;
    assert_int_equal(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    char path[256], dir[200];
    snprintf(dir, sizeof dir, "/tmp/sph_tune_test_%d/sub", (int)getpid());
    snprintf(path, sizeof path, "%s/tune.json", dir);
    const int64_t N = 300, H = 64, V = 2000;
    hcase c;
    hc_init(&c, &g_rng, N, H, V, V, 0, 0, SPH_BF16);
    hc_wire(&c, HC_LP | HC_ENT | HC_G | HC_E | HC_DH | HC_DW);
    hc_poison(&c);
    /* a context without a cache, for the default layout */
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.device.type = SPH_DEVICE_CUDA;
    o.tune_cache = path;
    sph_ctx_t g0;
    expect_ok(sph_ctx_create(&g0, &o)); /* file absent: defaults, not an error */
    /* device copies of the case */
    size_t es = 2;
    void *dh_, *dw_, *dt_, *dlp, *dst;
    expect_ok(sph_ctx_malloc(g0, (size_t)(N * H) * es, &dh_));
    expect_ok(sph_ctx_malloc(g0, (size_t)(V * H) * es, &dw_));
    expect_ok(sph_ctx_malloc(g0, (size_t)N * 8, &dt_));
    expect_ok(sph_ctx_malloc(g0, (size_t)N * 4, &dlp));
    expect_ok(sph_ctx_malloc(g0, (size_t)N * 12, &dst));
    expect_ok(sph_ctx_memcpy(g0, dh_, c.h, (size_t)(N * H) * es));
    expect_ok(sph_ctx_memcpy(g0, dw_, c.w, (size_t)(V * H) * es));
    expect_ok(sph_ctx_memcpy(g0, dt_, c.tgt, (size_t)N * 8));
    int64_t sh[3][2] = {{N, H}, {V, H}, {N, 3}}, sn[1] = {N};
    sph_device d = {SPH_DEVICE_CUDA, 0};
    sph_tensor th = {dh_, d, 2, SPH_BF16, sh[0], NULL, 0}, tw = {dw_, d, 2, SPH_BF16, sh[1], NULL, 0};
    sph_tensor tt = {dt_, d, 1, SPH_I64, sn, NULL, 0}, tl = {dlp, d, 1, SPH_F32, sn, NULL, 0};
    sph_tensor ts = {dst, d, 2, SPH_F32, sh[2], NULL, 0};
    sph_head_args a = SPH_HEAD_ARGS_INIT;
    a.hidden = &th, a.weight = &tw, a.targets = &tt, a.logprob = &tl, a.stats = &ts;
    size_t b0 = 0, b1 = 0;
    expect_ok(sph_head_workspace_size(g0, SPH_HEAD_FORWARD, &a, &b0));
    float *lp0 = hc_alloc(N * 4), *lp1 = hc_alloc(N * 4);
    void *ws;
    expect_ok(sph_ctx_malloc(g0, b0, &ws));
    expect_ok(sph_head_forward(g0, &a, ws, b0));
    expect_ok(sph_ctx_memcpy(g0, lp0, dlp, N * 4));
    sph_ctx_free(g0, ws);

    /* a hand-written cache: a malformed line, another GPU, then ours with chunk_rows 32 and
     * split 512 for this shape's bucket (N 300 -> 512) */
    char cmd[512];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    assert_int_equal(system(cmd), 0);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "not json at all\n");
    fprintf(f, "{\"gpu\":\"Other GPU\",\"dtype\":\"bf16\",\"H\":64,\"V_loc\":2000,\"N_bucket\":512,"
               "\"chunk_rows\":16,\"split\":256,\"ms\":1}\n");
    fprintf(f, "{\"gpu\":\"%s\",\"dtype\":\"bf16\",\"H\":64,\"V_loc\":2000,\"N_bucket\":512,"
               "\"chunk_rows\":32,\"split\":512,\"ms\":1}\n", prop.name);
    fclose(f);
    sph_ctx_t g1;
    expect_ok(sph_ctx_create(&g1, &o));
    expect_ok(sph_head_workspace_size(g1, SPH_HEAD_FORWARD, &a, &b1));
    /* 32 rows x 512 columns of logits instead of 300 x 2000: a smaller workspace */
    if (!(b1 < b0)) {
        print_error("tuned workspace %zu not below the default %zu\n", b1, b0);
        fail();
    }
    expect_ok(sph_ctx_malloc(g1, b1, &ws));
    expect_ok(sph_ctx_memset(g1, dlp, 0xff, N * 4));
    expect_ok(sph_head_forward(g1, &a, ws, b1));
    expect_ok(sph_ctx_memcpy(g1, lp1, dlp, N * 4));
    sph_ctx_free(g1, ws);
    /* other chunking, same function: equal up to the split's reassociation */
    double *ref = hc_alloc(N * 8);
    for (int64_t i = 0; i < N; i++) ref[i] = lp0[i];
    assert_true(hc_close("logprob (tuned vs default)", "tune_cache", lp1, SPH_F32, ref, SPH_F64,
                         N, 1e-5));
    sph_ctx_destroy(g1);

    /* sph_tune appends an entry that a new context reads */
    sph_tune_opts to = SPH_TUNE_OPTS_INIT;
    to.dtype = SPH_BF16, to.H = 128, to.V_loc = 4000, to.N = 1000, to.repeats = 2;
    const char *res = NULL;
    expect_ok(sph_tune(g0, &to, &res));
    assert_non_null(res);
    print_message("sph_tune: %s\n", res);
    f = fopen(path, "r");
    assert_non_null(f);
    char line[512];
    int found = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "\"V_loc\":4000") && strstr(line, "\"N_bucket\":1024")) found = 1;
    fclose(f);
    assert_true(found);
    /* bad input */
    to.H = 0;
    expect_status(sph_tune(g0, &to, &res), SPH_ERR_INVALID_ARG, "H");
    sph_ctx_t cpu = hc_ctx("ref", 1, NULL);
    to.H = 128;
    expect_status(sph_tune(cpu, &to, &res), SPH_ERR_UNSUPPORTED, "CUDA");
    sph_ctx_destroy(cpu);
    void *ps[] = {dh_, dw_, dt_, dlp, dst};
    for (int k = 0; k < 5; k++) sph_ctx_free(g0, ps[k]);
    sph_ctx_destroy(g0);
    snprintf(cmd, sizeof cmd, "rm -rf /tmp/sph_tune_test_%d", (int)getpid());
    if (system(cmd) != 0) print_message("could not remove %s\n", dir);
    free(lp0), free(lp1), free(ref);
    hc_free(&c);
}

// ---- dense GEMM rates -----------------------------------------------------------------------

/* The floors' denominators: burst (one product) and sustained (a chain) rates are positive and
 * finite for each dtype, chain 1 and the longest chain run, and a bad chain is refused on a
 * CUDA context too. Speeds are not asserted: they depend on the card and its clocks. */
static void test_gemm_rate(void **state) {
    (void)state;
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.device.type = SPH_DEVICE_CUDA;
    o.tune_cache = "/nonexistent/tune.json";
    sph_ctx_t g;
    expect_ok(sph_ctx_create(&g, &o));
    const sph_dtype dts[3] = {SPH_BF16, SPH_F16, SPH_F32};
    for (int k = 0; k < 3; k++) {
        double burst = 0, s1 = 0, s4 = 0;
        expect_ok(sph_tune_gemm_rate(g, dts[k], 512, 1024, 256, 3, &burst));
        expect_ok(sph_tune_gemm_rate_sustained(g, dts[k], 512, 1024, 256, 1, 3, &s1));
        expect_ok(sph_tune_gemm_rate_sustained(g, dts[k], 512, 1024, 256, 4, 3, &s4));
        print_message("gemm rate %s 512x1024x256: burst %.1f, chain 1 %.1f, chain 4 %.1f "
                      "TFLOP/s\n", sph_dtype_name(dts[k]), burst, s1, s4);
        assert_true(isfinite(burst) && burst > 0);
        assert_true(isfinite(s1) && s1 > 0);
        assert_true(isfinite(s4) && s4 > 0);
    }
    double s64 = 0;
    expect_ok(sph_tune_gemm_rate_sustained(g, SPH_BF16, 256, 256, 256, 64, 0, &s64));
    assert_true(isfinite(s64) && s64 > 0);
    expect_status(sph_tune_gemm_rate_sustained(g, SPH_BF16, 256, 256, 256, 65, 0, &s64),
                  SPH_ERR_INVALID_ARG, "chain 65, expected in [1, 64]");
    expect_status(sph_tune_gemm_rate_sustained(g, SPH_I32, 256, 256, 256, 4, 0, &s64),
                  SPH_ERR_DTYPE, "dtype");
    sph_ctx_destroy(g);
}

int main(void) {
    if (sph_cuda_device_count() == 0) {
        printf("no CUDA device: skipping\n");
        return 77;
    }
    rng_seed(&g_rng, test_seed());
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_tp),
                                       cmocka_unit_test(test_tune_cache),
                                       cmocka_unit_test(test_gemm_rate)};
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    tol_report("head_cuda_tp");
    return test_exit(failed);
}
#endif /* SPH_HAVE_CUDA */
