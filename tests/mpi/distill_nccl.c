/*
 * distill_nccl.c - the fused distillation loss over real NCCL communicators, two GPUs of one
 * process (labels gpu; exits 77 without NCCL in the build or with fewer than 2 CUDA devices).
 * No MPI: the communicators come from ncclCommInitAll, one rank thread per GPU, each with its
 * own context and stream (sph_comm_create_nccl's agreement runs over NCCL itself). What the
 * distributed CLI (`mpirun ... run --tp 2 | --cp 2 --distill --device cuda`) does, without
 * the MPI the lent GPU machine lacks:
 *   - TP 2: vocabulary shards, the records combined by NCCL allgathers, dhidden all-reduced;
 *     every rank's loss bitwise the same, dweight the rank's rows of the float64 reference's;
 *   - CP 2: the rows split over a seq_comm group, reduction mean over the whole batch's
 *     active rows (the 8-byte NCCL allgather of the counts on the stream); the ranks' losses
 *     summed, dhidden rows concatenated and dweight summed against the one-call reference;
 *   - with 4 devices also TP 2 x CP 2 (two TP communicators and two sequence groups).
 * Every kind, dense and sparse teachers, f32 and bf16, masks, mean / sum / none. Budgets as
 * test_distill_cuda.c: f32 1e-4 normwise, bf16 2e-2.
 */
#include <stdio.h>

#ifndef SPH_HAVE_NCCL
int main(void) {
    printf("skipping: spanhead was built without NCCL\n");
    return 77;
}
#else
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdlib.h>

#include "comm/comm.h"
#include "parity/test_distill_case.h"

enum { NT = 13 };
static const int k_out[NT] = {0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0};

static const sph_tensor **slot(dcase *c, int k) {
    const sph_tensor **s[NT] = {&c->a.hidden, &c->a.weight, &c->a.active_mask, &c->a.dhidden,
                                &c->a.dweight, &c->d.teacher_hidden, &c->d.teacher_weight,
                                &c->d.teacher_topk_ids, &c->d.teacher_topk_logprobs,
                                &c->d.dloss, &c->d.loss, &c->a.temperature_rows,
                                &c->d.teacher_temperature_rows};
    return s[k];
}

/* One rank: (cp, tp) of a C x T grid on GPU dev; its TP and sequence-group ncclComm_t. */
typedef struct njob {
    ncclComm_t tpn, cpn;
    int dev;
    int64_t cp, C, tp, T, r0, r1;
    const dcase *full;
    dcase shard;
    sph_status st;
    char err[256];
} njob;

static void *nrank(void *arg) {
    njob *j = arg;
    const dcase *f = j->full;
    dcase *c = &j->shard;
    sph_comm_t tpc = NULL, sqc = NULL;
    sph_ctx_t g = NULL;
    void *dev[NT] = {0}, *ws = NULL;
    sph_tensor t[NT];
    int64_t shp[NT][2];
    const sph_tensor *host[NT];
    size_t bytes[NT] = {0};
    cudaStream_t st = NULL;
    j->st = cudaSetDevice(j->dev) == cudaSuccess ? SPH_OK : SPH_ERR_CUDA;
    const int64_t n = j->r1 - j->r0, es = (int64_t)hc_esize(f->dt);
    *c = *f;
    c->N = n, c->h = (char *)f->h + j->r0 * f->H * es;
    if (f->dense) c->th = (char *)f->th + j->r0 * f->HT * es;
    else c->ids = f->ids + j->r0 * f->K, c->lp = f->lp + j->r0 * f->K;
    c->mask = f->mask ? f->mask + j->r0 : NULL, c->dloss = f->dloss + j->r0;
    c->trows = f->trows ? f->trows + j->r0 : NULL;
    c->ttrows = f->ttrows ? f->ttrows + j->r0 : NULL;
    c->v0 = f->V * j->tp / j->T, c->V_loc = f->V * (j->tp + 1) / j->T - c->v0;
    c->loss = hc_alloc((size_t)n * 4), c->dh = hc_alloc((size_t)(n * f->H) * 4);
    c->dw = hc_alloc((size_t)(c->V_loc * f->H) * 4);
    dc_wire(c, DC_DH | DC_DW | DC_DLOSS);
    dc_poison(c);
    if (j->st == SPH_OK && j->T > 1) {
        sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
        cfg.tp = j->T, cfg.vocab_total = f->V, cfg.vocab_start = c->v0, cfg.vocab_local = c->V_loc;
        cfg.dtype = f->dt, cfg.temperature = c->a.temperature;
        j->st = sph_comm_create_nccl(&tpc, j->tpn, &cfg);
    }
    if (j->st == SPH_OK && j->C > 1) { /* the sequence group: a placeholder configuration */
        sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
        cfg.tp = j->C, cfg.vocab_total = j->C, cfg.vocab_start = j->cp, cfg.vocab_local = 1;
        j->st = sph_comm_create_nccl(&sqc, j->cpn, &cfg);
    }
    c->a.allreduce_dhidden = j->T > 1;
    c->d.seq_comm = sqc;
    if (j->st == SPH_OK && cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess)
        j->st = SPH_ERR_CUDA;
    if (j->st == SPH_OK) {
        sph_ctx_opts o = SPH_CTX_OPTS_INIT;
        o.device = (sph_device){SPH_DEVICE_CUDA, j->dev};
        o.stream = st, o.tp_comm = tpc, o.chunk_rows = 5;
        j->st = sph_ctx_create(&g, &o);
    }
    for (int k = 0; k < NT && j->st == SPH_OK; k++) { /* device copies, rewired */
        const sph_tensor **pf = slot(c, k), *h = *pf;
        host[k] = h;
        if (!h) continue;
        bytes[k] = (size_t)(h->dtype.bits / 8);
        for (int d = 0; d < h->ndim; d++) bytes[k] *= (size_t)h->shape[d], shp[k][d] = h->shape[d];
        j->st = sph_ctx_malloc(g, bytes[k] + 1, &dev[k]);
        if (j->st == SPH_OK) j->st = sph_ctx_memcpy(g, dev[k], h->data, bytes[k]);
        t[k] = *h;
        t[k].data = dev[k], t[k].device = (sph_device){SPH_DEVICE_CUDA, j->dev}, t[k].shape = shp[k];
        *pf = &t[k];
    }
    size_t wsb = 0;
    if (j->st == SPH_OK) j->st = sph_distill_loss_workspace_size(g, &c->a, &c->d, &wsb);
    if (j->st == SPH_OK) j->st = sph_ctx_malloc(g, wsb + 1, &ws);
    if (j->st == SPH_OK) j->st = sph_distill_loss(g, &c->a, &c->d, ws, wsb);
    if (j->st == SPH_OK) j->st = sph_ctx_synchronize(g);
    for (int k = 0; k < NT && j->st == SPH_OK; k++)
        if (dev[k] && k_out[k]) j->st = sph_ctx_memcpy(g, host[k]->data, dev[k], bytes[k]);
    if (j->st != SPH_OK) snprintf(j->err, sizeof j->err, "%s", sph_last_error());
    for (int k = 0; k < NT; k++) sph_ctx_free(g, dev[k]);
    sph_ctx_free(g, ws);
    sph_ctx_destroy(g);
    sph_comm_destroy(tpc), sph_comm_destroy(sqc);
    if (st) cudaStreamDestroy(st);
    return NULL;
}

static double maxabs(const double *x, size_t n) {
    double m = 0;
    for (size_t k = 0; k < n; k++) m = fabs(x[k]) > m ? fabs(x[k]) : m;
    return m;
}

/* ncclCommInitAll over the devices devs[0 .. n) into out. */
static int init_all(ncclComm_t *out, int n, const int *devs) {
    ncclResult_t r = ncclCommInitAll(out, n, devs);
    if (r != ncclSuccess) print_error("ncclCommInitAll: %s\n", ncclGetErrorString(r));
    return r == ncclSuccess;
}

/* The C x T grid (C * T <= 4 GPUs: rank (cp, tp) on device cp * T + tp) against the one-call
 * float64 reference of f. */
static int nccl_case(dcase *f, int64_t C, int64_t T) {
    char cs[320], extra[64];
    snprintf(extra, sizeof extra, "nccl,cp=%lld,tp=%lld", (long long)C, (long long)T);
    dc_case_str(f, extra, cs, sizeof cs);
    dc_wire(f, DC_DH | DC_DW | DC_DLOSS);
    ncclComm_t tpn[4][2] = {{0}}, cpn[2][4] = {{0}};
    int ok = 1;
    for (int64_t cp = 0; cp < C && ok && T > 1; cp++) { /* a TP communicator per cp */
        int devs[2] = {(int)(cp * T), (int)(cp * T + 1)};
        ok = init_all(tpn[cp], 2, devs);
    }
    for (int64_t tp = 0; tp < T && ok && C > 1; tp++) { /* a sequence group per tp */
        int devs[4];
        for (int64_t cp = 0; cp < C; cp++) devs[cp] = (int)(cp * T + tp);
        ok = init_all(cpn[tp], (int)C, devs);
    }
    njob jobs[4];
    pthread_t th[4];
    memset(jobs, 0, sizeof jobs);
    for (int64_t cp = 0; cp < C && ok; cp++)
        for (int64_t tp = 0; tp < T; tp++) {
            njob *j = &jobs[cp * T + tp];
            *j = (njob){.tpn = tpn[cp][tp], .cpn = cpn[tp][cp], .dev = (int)(cp * T + tp),
                        .cp = cp, .C = C, .tp = tp, .T = T, .r0 = f->N * cp / C,
                        .r1 = f->N * (cp + 1) / C, .full = f};
            assert_int_equal(pthread_create(&th[cp * T + tp], NULL, nrank, j), 0);
        }
    for (int64_t k = 0; k < C * T && ok; k++) pthread_join(th[k], NULL);
    for (int64_t k = 0; k < C * T && ok; k++)
        if (jobs[k].st != SPH_OK) {
            print_error("%s: rank %lld: %s\n", cs, (long long)k, jobs[k].err);
            ok = 0;
        }
    dexp x;
    dc_expect(f, &x);
    const double tol = f->dt.bits == 32 ? 1e-4 : 2e-2;
    const int none = f->red == SPH_REDUCTION_NONE;
    const size_t NH = (size_t)(f->N * f->H), NW = (size_t)(f->V * f->H);
    float *loss = hc_alloc((size_t)f->N * 4), *dh = hc_alloc(NH * 4), *dw = hc_alloc(NW * 4);
    double tot = 0;
    for (size_t e = 0; e < NW; e++) dw[e] = 0;
    for (int64_t cp = 0; cp < C && ok; cp++) {
        const njob *j0 = &jobs[cp * T];
        const size_t n = (size_t)(j0->r1 - j0->r0), nl = none ? n : 1;
        for (int64_t tp = 1; tp < T; tp++)
            if (memcmp(jobs[cp * T + tp].shard.loss, j0->shard.loss, nl * 4)) {
                print_error("%s: cp %lld: tp rank %lld's loss differs from tp 0's (bits)\n", cs,
                            (long long)cp, (long long)tp);
                ok = 0;
            }
        if (none) memcpy(loss + j0->r0, j0->shard.loss, n * 4);
        else tot += j0->shard.loss[0];
        memcpy(dh + j0->r0 * f->H, j0->shard.dh, n * (size_t)f->H * 4);
        for (int64_t tp = 0; tp < T; tp++) {
            const dcase *s = &jobs[cp * T + tp].shard;
            for (int64_t e = 0; e < s->V_loc * f->H; e++) dw[s->v0 * f->H + e] += s->dw[e];
        }
    }
    if (ok) {
        const float red = (float)tot;
        ok &= none ? check_close("loss rows", cs, loss, x.rows, (size_t)f->N, tol * 0.1, tol)
                   : check_close("loss (summed over cp)", cs, &red, &x.red, 1, 1e-6, tol);
        ok &= check_close("dhidden", cs, dh, x.dh, NH, tol * maxabs(x.dh, NH) + 1e-9, tol);
        ok &= check_close("dweight", cs, dw, x.dw, NW, tol * maxabs(x.dw, NW) + 1e-9, tol);
    }
    for (int64_t k = 0; k < C * T; k++)
        free(jobs[k].shard.loss), free(jobs[k].shard.dh), free(jobs[k].shard.dw);
    free(loss), free(dh), free(dw);
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 2; b++) {
            if (tpn[a][b]) ncclCommDestroy(tpn[a][b]);
            if (cpn[b][a]) ncclCommDestroy(cpn[b][a]);
        }
    dc_expect_free(&x);
    return ok;
}

static int g_devices;

static void test_nccl(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    static const int kinds[5] = {SPH_DISTILL_FORWARD_KL, SPH_DISTILL_REVERSE_KL, SPH_DISTILL_JSD,
                                 SPH_DISTILL_JSD, SPH_DISTILL_JSD};
    static const double betas[5] = {0.5, 0.5, 0.4, 0.0, 1.0};
    int ok = 1, n = 0;
    for (int dense = 0; dense <= 1; dense++)
        for (int k = 0; k < 5; k++, n++) {
            dcase c;
            dc_init(&c, &r, 27, 16, 211, 12, 7, n % 2 ? SPH_BF16 : SPH_F32, dense, DC_PAD);
            c.kind = kinds[k], c.beta = betas[k];
            c.red = n % 3;
            dc_mask(&c, &r, 0.7);
            if (dense && k >= 3) dc_ttrows(&c, &r, 0.4, 2.5); /* the teacher's, per row */
            ok &= nccl_case(&c, 1, 2);                     /* TP 2 */
            ok &= nccl_case(&c, 2, 1);                     /* CP 2 */
            if (g_devices >= 4) ok &= nccl_case(&c, 2, 2); /* TP 2 x CP 2 */
            dc_free(&c);
        }
    assert_true(ok);
}

int main(void) {
    setenv("NCCL_NVLS_ENABLE", "0", 1); /* multicast stays off on the lent machines */
    if (cudaGetDeviceCount(&g_devices) != cudaSuccess) g_devices = 0;
    if (g_devices < 2) {
        printf("skipping: %d CUDA device(s); NCCL needs one GPU per rank (2 for TP 2 / CP 2, "
               "4 for both)\n", g_devices);
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_nccl)};
    return test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
#endif
