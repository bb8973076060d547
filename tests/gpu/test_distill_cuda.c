/*
 * test_distill_cuda.c - the CUDA distillation losses against the float64 reference on exactly
 * the rounded inputs the GPU sees, through the public API, outputs poisoned before each run:
 * every kind (jsd 0.4 and its special cases), dense and sparse teachers (padding, tail mass
 * 0, K = V), f32 and bf16, masks and spans, every reduction (none with dloss), temperature
 * (scalar and per row),
 * softcap, a teacher temperature (scalar and per row), several chunks (chunk_rows), accumulate_dweight, a shard
 * wider than a few tiles; inactive rows of dhidden exact zeros; determinism (bitwise); NaN
 * in hidden counted by sph_ctx_nonfinite; TP: 2 and 3 ranks in threads on one GPU, each with
 * its own context, stream and shard, combining through an in-process communicator on device
 * buffers (the ops table NCCL fills; allgather by device copies in rank order), against the
 * unsharded reference (dweight the rank's rows, all-reduced dhidden, bitwise equal losses);
 * CP: rows split over 2-3 ranks of a seq_comm group on the same device communicator, the
 * ranks' losses and gradients adding up to the one-call mean's; num_tokens on some cases.
 * Budgets: f32 1e-4 normwise (cuBLAS fp32 products),
 * bf16 2e-2 (dlogits rounded to bf16 for the gradient products, u = 2^-8, summed over V).
 * Skips (exit 77) without a CUDA device.
 */
#ifndef SPH_HAVE_CUDA
#include <stdio.h>
int main(void) {
    printf("no CUDA device: skipping (spanhead was built without CUDA)\n");
    return 77;
}
#else
#include <cuda_runtime.h>

#include "../parity/test_distill_case.h"


#define NT 13
typedef struct dmirror {
    sph_tensor t[NT];
    int64_t shp[NT][2];
    void *dev[NT];
    const sph_tensor *host[NT];
    size_t bytes[NT];
} dmirror;

static size_t t_bytes(const sph_tensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n * (t->dtype.bits / 8);
}

/* Device copies of the case's tensors, rewired into c->a / c->d; outputs copied back by
 * dm_back. */
static const sph_tensor **slot(dcase *c, int k) {
    const sph_tensor **s[NT] = {&c->a.hidden, &c->a.weight, &c->a.active_mask, &c->a.dhidden,
                                &c->a.dweight, &c->d.teacher_hidden, &c->d.teacher_weight,
                                &c->d.teacher_topk_ids, &c->d.teacher_topk_logprobs,
                                &c->d.dloss, &c->d.loss, &c->a.temperature_rows,
                                &c->d.teacher_temperature_rows};
    return s[k];
}
static const int k_out[NT] = {0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0};

static void dm_make(sph_ctx_t g, dcase *c, dmirror *m) {
    memset(m, 0, sizeof *m);
    for (int k = 0; k < NT; k++) {
        const sph_tensor **pf = slot(c, k), *t = *pf;
        m->host[k] = t;
        if (!t) continue;
        m->bytes[k] = t_bytes(t);
        expect_ok(sph_ctx_malloc(g, m->bytes[k] + 1, &m->dev[k]));
        expect_ok(sph_ctx_memcpy(g, m->dev[k], t->data, m->bytes[k]));
        m->t[k] = *t;
        m->t[k].data = m->dev[k];
        m->t[k].device = (sph_device){SPH_DEVICE_CUDA, 0};
        for (int d = 0; d < t->ndim; d++) m->shp[k][d] = t->shape[d];
        m->t[k].shape = m->shp[k];
        *pf = &m->t[k];
    }
}

static void dm_back(sph_ctx_t g, dmirror *m) {
    expect_ok(sph_ctx_synchronize(g));
    for (int k = 0; k < NT; k++)
        if (m->dev[k] && k_out[k])
            expect_ok(sph_ctx_memcpy(g, m->host[k]->data, m->dev[k], m->bytes[k]));
}

static void dm_free(sph_ctx_t g, dmirror *m) {
    for (int k = 0; k < NT; k++) sph_ctx_free(g, m->dev[k]);
}

static sph_ctx_t gctx(int64_t chunk_rows) {
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.device = (sph_device){SPH_DEVICE_CUDA, 0};
    o.chunk_rows = chunk_rows;
    sph_ctx_t ctx = NULL;
    expect_ok(sph_ctx_create(&ctx, &o));
    return ctx;
}

static double maxabs(const double *x, size_t n) {
    double m = 0;
    for (size_t k = 0; k < n; k++) m = fabs(x[k]) > m ? fabs(x[k]) : m;
    return m;
}

/* dc_run on a CUDA context: the workspace in device memory (the library refuses host memory
 * there, naming it). */
static sph_status dc_run_dev(sph_ctx_t g, dcase *c) {
    size_t bytes = 0;
    sph_status s = sph_distill_loss_workspace_size(g, &c->a, &c->d, &bytes);
    if (s != SPH_OK) return s;
    void *ws = NULL;
    if (bytes && (s = sph_ctx_malloc(g, bytes, &ws)) != SPH_OK) return s;
    s = sph_distill_loss(g, &c->a, &c->d, ws, bytes);
    if (ws) sph_ctx_free(g, ws);
    return s;
}

/* One GPU run of c (wired with what), compared with the oracle. */
static int gpu_case(dcase *c, int64_t chunk, int acc, int spans, sph_rng *r) {
    char cs[320], extra[96];
    snprintf(extra, sizeof extra, "cuda,chunk=%lld,acc_dw=%d,spans=%d", (long long)chunk, acc, spans);
    dc_case_str(c, extra, cs, sizeof cs);
    dc_wire(c, DC_DH | DC_DW | DC_DLOSS);
    int64_t *sp = NULL;
    if (spans && c->mask) { /* spans instead of the mask */
        sp = hc_alloc((size_t)(c->N + 1) * 2 * 8);
        int64_t n = 0;
        expect_ok(sph_spans_from_mask(c->mask, c->N, 0, sp, &n));
        c->a.spans = sp, c->a.n_spans = n, c->a.active_mask = NULL;
    }
    c->a.accumulate_dweight = acc;
    dc_poison(c);
    float *dw0 = NULL;
    if (acc) {
        dw0 = hc_alloc((size_t)(c->V * c->H) * 4);
        for (int64_t k = 0; k < c->V * c->H; k++) c->dw[k] = dw0[k] = (float)rng_normal(r);
    }
    sph_ctx_t g = gctx(chunk);
    dmirror m;
    dm_make(g, c, &m);
    expect_ok(dc_run_dev(g, c));
    dm_back(g, &m);
    dexp x;
    dc_expect(c, &x);
    if (acc)
        for (int64_t k = 0; k < c->V * c->H; k++) x.dw[k] += dw0[k];
    const double tol = c->dt.bits == 32 ? 1e-4 : 2e-2;
    const size_t nh = (size_t)(c->N * c->H), nw = (size_t)(c->V * c->H);
    int ok = 1;
    if (c->red == SPH_REDUCTION_NONE)
        ok &= check_close("loss rows", cs, c->loss, x.rows, (size_t)c->N, tol * 0.1, tol);
    else
        ok &= check_close("loss", cs, c->loss, &x.red, 1, 1e-6, tol);
    ok &= check_close("dhidden", cs, c->dh, x.dh, nh, tol * maxabs(x.dh, nh) + 1e-9, tol);
    ok &= check_close("dweight", cs, c->dw, x.dw, nw, tol * maxabs(x.dw, nw) + 1e-9, tol);
    for (int64_t i = 0; c->mask && i < c->N; i++)
        for (int64_t k = 0; !c->mask[i] && k < c->H; k++)
            if (c->dh[i * c->H + k] != 0.0f) {
                print_error("%s: dhidden[%lld, %lld] = %g on an inactive row\n", cs,
                            (long long)i, (long long)k, (double)c->dh[i * c->H + k]);
                ok = 0;
                break;
            }
    if (!acc) { /* determinism */
        float *l1 = hc_dup(c->loss, (size_t)c->N * 4), *h1 = hc_dup(c->dh, nh * 4);
        expect_ok(dc_run_dev(g, c));
        dm_back(g, &m);
        const size_t nl = c->red == SPH_REDUCTION_NONE ? (size_t)c->N : 1;
        if (memcmp(l1, c->loss, nl * 4) || memcmp(h1, c->dh, nh * 4)) {
            print_error("%s: a second run gave other bits\n", cs);
            ok = 0;
        }
        free(l1), free(h1);
    }
    dm_free(g, &m);
    sph_ctx_destroy(g);
    dc_expect_free(&x);
    free(dw0), free(sp);
    return ok;
}

static const int g_kinds[5] = {SPH_DISTILL_FORWARD_KL, SPH_DISTILL_REVERSE_KL, SPH_DISTILL_JSD,
                               SPH_DISTILL_JSD, SPH_DISTILL_JSD};
static const double g_betas[5] = {0.5, 0.5, 0.4, 0.0, 1.0};

static void test_cases(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    const unsigned sflags[4] = {DC_PAD, DC_TAIL0 | DC_PAD, DC_ALLV, 0};
    int ok = 1, n = 0;
    for (int dense = 0; dense <= 1; dense++)
        for (int k = 0; k < 5; k++)
            for (int v = 0; v < 4; v++, n++) {
                dcase c;
                const sph_dtype dt = n % 2 ? SPH_BF16 : SPH_F32;
                const int64_t V = v == 3 ? 1037 : 13 + 2 * v, N = 29 + v;
                dc_init(&c, &r, N, 24 + v, V, 20, v == 3 ? 17 : 4, dt, dense,
                        dense ? (v == 1 ? DC_TIES : 0) : sflags[v]);
                c.kind = g_kinds[k], c.beta = g_betas[k];
                c.red = (k + v) % 3;
                if ((k + v) % 2) dc_mask(&c, &r, 0.6);
                if (v == 1) c.T = 0.6;
                if (v == 2) c.cap = 2.0, c.T = 1.2;
                if (dense && v == 0) c.TT = 1.7;
                if (n % 5 == 2) dc_trows(&c, &r, 0.5, 2.0); /* per-row temperatures */
                /* the teacher's per-row temperatures (with the student's at n 27, 37) */
                if (dense && v >= 2 && k % 2 == 1) dc_ttrows(&c, &r, 0.4, 2.5);
                if (n % 6 == 0) c.num_tokens = 3 * N + 1; /* a global batch's T */
                ok &= gpu_case(&c, n % 3 ? 7 : 0, v == 2, n % 4 == 1, &r);
                dc_free(&c);
            }
    assert_true(ok);
}

static void test_nonfinite(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    dcase c;
    dc_init(&c, &r, 9, 8, 40, 8, 4, SPH_F32, 1, 0);
    hc_set(c.h, SPH_F32, 3 * 8 + 2, NAN);
    dc_wire(&c, DC_DH | DC_DW);
    sph_ctx_t g = gctx(4);
    dmirror m;
    dm_make(g, &c, &m);
    int64_t cnt = -1, first = -1;
    expect_ok(sph_ctx_nonfinite(g, &cnt, &first));
    expect_ok(dc_run_dev(g, &c));
    dm_back(g, &m);
    expect_ok(sph_ctx_nonfinite(g, &cnt, &first));
    assert_int_equal(cnt, 1);
    assert_int_equal(first, 3);
    assert_true(isnan(c.loss[0])); /* the mean over a NaN row (run 38: was finite) */
    dm_free(g, &m);
    dc_free(&c);
    /* a bad teacher temperature of an active row (device memory: not read at validation)
     * makes that row NaN and is counted the same way (run 38 found its loss finite: the
     * terms' 0 log 0 guards dropped the NaN probabilities; now a non-finite record makes the
     * row's loss and du NaN) */
    dc_init(&c, &r, 9, 8, 40, 8, 4, SPH_F32, 1, 0);
    dc_ttrows(&c, &r, 0.5, 2.0);
    c.ttrows[4] = 0.0f;
    c.red = SPH_REDUCTION_NONE;
    dc_wire(&c, DC_DH | DC_DW);
    dm_make(g, &c, &m);
    expect_ok(dc_run_dev(g, &c));
    dm_back(g, &m);
    expect_ok(sph_ctx_nonfinite(g, &cnt, &first));
    assert_int_equal(cnt, 1);
    assert_int_equal(first, 4);
    assert_true(isnan(c.loss[4]) && isfinite(c.loss[3]) && isfinite(c.loss[5]));
    dm_free(g, &m);
    sph_ctx_destroy(g);
    dc_free(&c);
}


/* The loss's own tensors claiming the device but pointing at host memory: SPH_ERR_DEVICE naming
 * the tensor, nothing written (the outputs stay poisoned). */
static void test_bad_device(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    for (int what = 0; what < 3; what++) {
        dcase c;
        dc_init(&c, &r, 9, 8, 40, 8, 4, SPH_F32, what != 2, DC_PAD);
        if (what != 2) dc_ttrows(&c, &r, 0.5, 2.0);
        dc_wire(&c, DC_DH | DC_DW);
        dc_poison(&c); /* before the device copies: the device outputs start poisoned */
        sph_ctx_t g = gctx(4);
        dmirror m;
        dm_make(g, &c, &m);
        /* the slot whose device copy is swapped for the host array */
        const int k = what == 0 ? 5 : what == 1 ? 12 : 8; /* teacher_hidden, _rows, logprobs */
        const char *name = what == 0 ? "teacher_hidden" : what == 1 ? "teacher_temperature_rows"
                                                                    : "teacher_topk_logprobs";
        m.t[k].data = (void *)m.host[k]->data;
        size_t bytes = 0;
        expect_ok(sph_distill_loss_workspace_size(g, &c.a, &c.d, &bytes));
        void *ws = NULL;
        expect_ok(sph_ctx_malloc(g, bytes + 1, &ws));
        const sph_status s = sph_distill_loss(g, &c.a, &c.d, ws, bytes);
        if (s != SPH_ERR_DEVICE || !strstr(sph_last_error(), name)) {
            print_error("bad device %s: status %d: %s\n", name, (int)s, sph_last_error());
            fail();
        }
        sph_ctx_free(g, ws);
        float *loss0 = hc_dup(c.loss, 4);
        dm_back(g, &m); /* the device outputs back over the host copies: still the poison */
        assert_memory_equal(c.loss, loss0, 4);
        free(loss0);
        dm_free(g, &m);
        sph_ctx_destroy(g);
        dc_free(&c);
    }
}

// ---- TP: ranks in threads, an in-process communicator on device buffers ----------------------

typedef struct dgroup {
    int64_t size;
    tp_group sync;
    const void *send[8];
    float *bufs[8];
} dgroup;

static sph_status g_allgather(sph_comm_t c, const void *send, void *recv, size_t bytes,
                              void *stream) {
    dgroup *g = c->impl;
    cudaStream_t st = (cudaStream_t)stream;
    if (cudaStreamSynchronize(st) != cudaSuccess) {
        tp_group_abort(&g->sync);
        return SPH_ERR_CUDA;
    }
    g->send[c->rank] = send;
    if (tp_barrier(&g->sync)) return tp_peer_failed();
    for (int64_t r = 0; r < g->size; r++)
        if (cudaMemcpyAsync((char *)recv + (size_t)r * bytes, g->send[r], bytes,
                            cudaMemcpyDefault, st) != cudaSuccess) {
            tp_group_abort(&g->sync);
            return SPH_ERR_CUDA;
        }
    if (cudaStreamSynchronize(st) != cudaSuccess) {
        tp_group_abort(&g->sync);
        return SPH_ERR_CUDA;
    }
    if (tp_barrier(&g->sync)) return tp_peer_failed();
    return SPH_OK;
}

static sph_status g_allreduce(sph_comm_t c, float *buf, size_t count, void *stream) {
    dgroup *g = c->impl;
    cudaStream_t st = (cudaStream_t)stream;
    float *mine = malloc(count * 4 + 4), *tmp = malloc(count * 4 + 4);
    sph_status s = SPH_OK;
    if (cudaMemcpyAsync(mine, buf, count * 4, cudaMemcpyDeviceToHost, st) != cudaSuccess ||
        cudaStreamSynchronize(st) != cudaSuccess) {
        tp_group_abort(&g->sync);
        free(mine), free(tmp);
        return SPH_ERR_CUDA;
    }
    g->bufs[c->rank] = mine;
    if (tp_barrier(&g->sync)) {
        s = tp_peer_failed();
    } else {
        for (size_t k = 0; k < count; k++) {
            tmp[k] = 0;
            for (int64_t r = 0; r < g->size; r++) tmp[k] += g->bufs[r][k];
        }
        if (tp_barrier(&g->sync))
            s = tp_peer_failed();
        else if (cudaMemcpyAsync(buf, tmp, count * 4, cudaMemcpyHostToDevice, st) != cudaSuccess ||
                 cudaStreamSynchronize(st) != cudaSuccess)
            s = SPH_ERR_CUDA;
    }
    free(mine), free(tmp);
    return s;
}

static void g_destroy(sph_comm_t c) { (void)c; }
static const sph_comm_ops g_ops = {g_allgather, g_allreduce, g_destroy};

typedef struct gjob {
    dgroup *g;
    int64_t rank, ranks;
    const dcase *full;
    dcase shard;
    sph_status st;
    char err[256];
} gjob;

static void *grank(void *arg) {
    gjob *j = arg;
    const dcase *f = j->full;
    dcase *c = &j->shard;
    struct sph_comm comm;
    memset(&comm, 0, sizeof comm);
    comm.backend = SPH_COMM_NCCL, comm.rank = j->rank, comm.size = j->ranks;
    comm.ops = &g_ops, comm.device_buffers = 1, comm.impl = j->g;
    const int64_t a0 = f->V * j->rank / j->ranks, a1 = f->V * (j->rank + 1) / j->ranks;
    *c = *f;
    c->v0 = a0, c->V_loc = a1 - a0;
    c->loss = hc_alloc((size_t)f->N * 4), c->dh = hc_alloc((size_t)(f->N * f->H) * 4);
    c->dw = hc_alloc((size_t)(c->V_loc * f->H) * 4);
    dc_wire(c, DC_DH | DC_DW | DC_DLOSS);
    c->a.allreduce_dhidden = 1;
    dc_poison(c);
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.device = (sph_device){SPH_DEVICE_CUDA, 0};
    o.stream = st, o.tp_comm = &comm, o.chunk_rows = 5;
    sph_ctx_t g = NULL;
    j->st = sph_ctx_create(&g, &o);
    dmirror m;
    memset(&m, 0, sizeof m);
    if (j->st == SPH_OK) {
        dm_make(g, c, &m);
        size_t bytes = 0;
        sph_distill_loss_workspace_size(g, &c->a, &c->d, &bytes);
        void *ws = NULL;
        if (sph_ctx_malloc(g, bytes + 256, &ws) != SPH_OK) ws = NULL;
        j->st = sph_distill_loss(g, &c->a, &c->d, ws, bytes);
        if (j->st == SPH_OK) dm_back(g, &m);
        sph_ctx_free(g, ws);
    }
    if (j->st != SPH_OK) {
        snprintf(j->err, sizeof j->err, "%s", sph_last_error());
        tp_group_abort(&j->g->sync);
    }
    dm_free(g, &m);
    sph_ctx_destroy(g);
    cudaStreamDestroy(st);
    return NULL;
}

static int gpu_tp_case(dcase *f, int64_t ranks) {
    char cs[320], extra[64];
    snprintf(extra, sizeof extra, "cuda,tp=%lld", (long long)ranks);
    dc_case_str(f, extra, cs, sizeof cs);
    dc_wire(f, DC_DH | DC_DW | DC_DLOSS);
    dgroup grp;
    memset(&grp, 0, sizeof grp);
    grp.size = ranks;
    tp_group_init(&grp.sync, ranks);
    gjob jobs[4];
    pthread_t th[4];
    for (int64_t k = 0; k < ranks; k++) {
        memset(&jobs[k], 0, sizeof jobs[k]);
        jobs[k].g = &grp, jobs[k].rank = k, jobs[k].ranks = ranks, jobs[k].full = f;
        assert_int_equal(pthread_create(&th[k], NULL, grank, &jobs[k]), 0);
    }
    for (int64_t k = 0; k < ranks; k++) pthread_join(th[k], NULL);
    tp_group_destroy(&grp.sync);
    int ok = 1;
    for (int64_t k = 0; k < ranks; k++)
        if (jobs[k].st != SPH_OK) {
            print_error("%s: rank %lld: %s\n", cs, (long long)k, jobs[k].err);
            ok = 0;
        }
    dexp x;
    dc_expect(f, &x);
    const double tol = f->dt.bits == 32 ? 1e-4 : 2e-2;
    const size_t NH = (size_t)(f->N * f->H), nl = f->red == SPH_REDUCTION_NONE ? (size_t)f->N : 1;
    for (int64_t k = 0; k < ranks && ok; k++) {
        dcase *c = &jobs[k].shard;
        const size_t nw = (size_t)(c->V_loc * f->H);
        ok &= f->red == SPH_REDUCTION_NONE
                  ? check_close("loss rows", cs, c->loss, x.rows, nl, tol * 0.1, tol)
                  : check_close("loss", cs, c->loss, &x.red, 1, 1e-6, tol);
        ok &= check_close("dhidden", cs, c->dh, x.dh, NH, tol * maxabs(x.dh, NH) + 1e-9, tol);
        ok &= check_close("dweight", cs, c->dw, x.dw + c->v0 * f->H, nw,
                          tol * maxabs(x.dw, (size_t)(f->V * f->H)) + 1e-9, tol);
        if (memcmp(c->loss, jobs[0].shard.loss, nl * 4)) {
            print_error("%s: rank %lld's loss differs from rank 0's (bits)\n", cs, (long long)k);
            ok = 0;
        }
    }
    for (int64_t k = 0; k < ranks; k++)
        free(jobs[k].shard.loss), free(jobs[k].shard.dh), free(jobs[k].shard.dw);
    dc_expect_free(&x);
    return ok;
}

static void test_tp(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    int ok = 1, n = 0;
    for (int dense = 0; dense <= 1; dense++)
        for (int k = 0; k < 5; k++, n++) {
            dcase c;
            dc_init(&c, &r, 23, 16, 211, 12, 7, n % 2 ? SPH_BF16 : SPH_F32, dense,
                    n % 3 ? DC_PAD : DC_TAIL0 | DC_PAD);
            c.kind = g_kinds[k], c.beta = g_betas[k];
            c.red = n % 3;
            if (n % 2) dc_mask(&c, &r, 0.7);
            if (k == 3) dc_trows(&c, &r, 0.5, 2.0);
            if (dense && k >= 3) dc_ttrows(&c, &r, 0.4, 2.5);
            ok &= gpu_tp_case(&c, 2 + n % 2);
            dc_free(&c);
        }
    assert_true(ok);
}

// ---- CP: rows split over a seq_comm group of ranks in threads (device buffers) -------------

typedef struct cpjob {
    dgroup *g;
    int64_t rank, ranks, r0, r1;
    const dcase *full;
    dcase shard;
    sph_status st;
    char err[256];
} cpjob;

static void *cprank(void *arg) {
    cpjob *j = arg;
    const dcase *f = j->full;
    dcase *c = &j->shard;
    struct sph_comm comm;
    memset(&comm, 0, sizeof comm);
    comm.backend = SPH_COMM_NCCL, comm.rank = j->rank, comm.size = j->ranks;
    comm.ops = &g_ops, comm.device_buffers = 1, comm.impl = j->g;
    const int64_t n = j->r1 - j->r0, es = (int64_t)hc_esize(f->dt);
    *c = *f;
    c->N = n, c->h = (char *)f->h + j->r0 * f->H * es;
    if (f->dense) c->th = (char *)f->th + j->r0 * f->HT * es;
    else c->ids = f->ids + j->r0 * f->K, c->lp = f->lp + j->r0 * f->K;
    c->mask = f->mask ? f->mask + j->r0 : NULL, c->dloss = f->dloss + j->r0;
    c->trows = f->trows ? f->trows + j->r0 : NULL;
    c->ttrows = f->ttrows ? f->ttrows + j->r0 : NULL;
    c->loss = hc_alloc((size_t)n * 4), c->dh = hc_alloc((size_t)(n * f->H) * 4);
    c->dw = hc_alloc((size_t)(f->V * f->H) * 4);
    dc_wire(c, DC_DH | DC_DW | DC_DLOSS);
    c->d.seq_comm = &comm;
    dc_poison(c);
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.device = (sph_device){SPH_DEVICE_CUDA, 0};
    o.stream = st, o.chunk_rows = 4;
    sph_ctx_t g = NULL;
    j->st = sph_ctx_create(&g, &o);
    dmirror m;
    memset(&m, 0, sizeof m);
    if (j->st == SPH_OK) {
        dm_make(g, c, &m);
        j->st = dc_run_dev(g, c);
        if (j->st == SPH_OK) dm_back(g, &m);
    }
    if (j->st != SPH_OK) {
        snprintf(j->err, sizeof j->err, "%s", sph_last_error());
        tp_group_abort(&j->g->sync);
    }
    dm_free(g, &m);
    sph_ctx_destroy(g);
    cudaStreamDestroy(st);
    return NULL;
}

/* The group's losses summed (none: concatenated), dhidden rows concatenated and dweight summed
 * against the one-call float64 oracle of all N rows (the mean over all their active rows). */
static int gpu_cp_case(dcase *f, int64_t ranks) {
    char cs[320], extra[64];
    snprintf(extra, sizeof extra, "cuda,cp=%lld", (long long)ranks);
    dc_case_str(f, extra, cs, sizeof cs);
    dc_wire(f, DC_DH | DC_DW | DC_DLOSS);
    dgroup grp;
    memset(&grp, 0, sizeof grp);
    grp.size = ranks;
    tp_group_init(&grp.sync, ranks);
    cpjob jobs[4];
    pthread_t th[4];
    for (int64_t k = 0; k < ranks; k++) {
        memset(&jobs[k], 0, sizeof jobs[k]);
        jobs[k].g = &grp, jobs[k].rank = k, jobs[k].ranks = ranks, jobs[k].full = f;
        jobs[k].r0 = f->N * k / ranks, jobs[k].r1 = f->N * (k + 1) / ranks;
        assert_int_equal(pthread_create(&th[k], NULL, cprank, &jobs[k]), 0);
    }
    for (int64_t k = 0; k < ranks; k++) pthread_join(th[k], NULL);
    tp_group_destroy(&grp.sync);
    int ok = 1;
    for (int64_t k = 0; k < ranks; k++)
        if (jobs[k].st != SPH_OK) {
            print_error("%s: rank %lld: %s\n", cs, (long long)k, jobs[k].err);
            ok = 0;
        }
    dexp x;
    dc_expect(f, &x);
    const double tol = f->dt.bits == 32 ? 1e-4 : 2e-2;
    const size_t NH = (size_t)(f->N * f->H), NW = (size_t)(f->V * f->H);
    float *loss = hc_alloc((size_t)f->N * 4), *dh = hc_alloc(NH * 4), *dw = hc_alloc(NW * 4);
    double tot = 0;
    for (size_t e = 0; e < NW; e++) dw[e] = 0;
    for (int64_t k = 0; k < ranks && ok; k++) {
        const cpjob *j = &jobs[k];
        const size_t n = (size_t)(j->r1 - j->r0);
        if (f->red == SPH_REDUCTION_NONE) memcpy(loss + j->r0, j->shard.loss, n * 4);
        else tot += j->shard.loss[0];
        memcpy(dh + j->r0 * f->H, j->shard.dh, n * (size_t)f->H * 4);
        for (size_t e = 0; e < NW; e++) dw[e] += j->shard.dw[e];
    }
    if (ok) {
        const float red = (float)tot;
        ok &= f->red == SPH_REDUCTION_NONE
                  ? check_close("loss rows", cs, loss, x.rows, (size_t)f->N, tol * 0.1, tol)
                  : check_close("loss (summed over the ranks)", cs, &red, &x.red, 1, 1e-6, tol);
        ok &= check_close("dhidden", cs, dh, x.dh, NH, tol * maxabs(x.dh, NH) + 1e-9, tol);
        ok &= check_close("dweight (summed)", cs, dw, x.dw, NW, tol * maxabs(x.dw, NW) + 1e-9,
                          tol);
    }
    for (int64_t k = 0; k < ranks; k++)
        free(jobs[k].shard.loss), free(jobs[k].shard.dh), free(jobs[k].shard.dw);
    free(loss), free(dh), free(dw);
    dc_expect_free(&x);
    return ok;
}

static void test_cp(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    int ok = 1, n = 0;
    for (int dense = 0; dense <= 1; dense++)
        for (int k = 0; k < 3; k++, n++) {
            dcase c;
            dc_init(&c, &r, 25, 16, 173, 12, 7, n % 2 ? SPH_BF16 : SPH_F32, dense, DC_PAD);
            c.kind = g_kinds[k], c.beta = g_betas[k];
            c.red = k == 2 ? SPH_REDUCTION_SUM : SPH_REDUCTION_MEAN;
            dc_mask(&c, &r, 0.6);
            ok &= gpu_cp_case(&c, 2 + n % 2);
            dc_free(&c);
        }
    assert_true(ok);
}

int main(void) {
    if (sph_cuda_device_count() == 0) {
        printf("no CUDA device: skipping\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_bad_device),
        cmocka_unit_test(test_tp),
        cmocka_unit_test(test_cp),
    };
    return test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
#endif
