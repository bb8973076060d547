/*
 * test_head_case.h - shared by the LM-head tests: a random case (inputs rounded to the input
 * dtype, every output poisoned), the wiring of sph_head_args, a runner, normwise comparison
 * and an in-process tensor-parallel communicator (one thread per rank, a barrier per
 * collective) so sharded runs combine through the real comm ops table.
 */
#ifndef SPH_TEST_HEAD_CASE_H
#define SPH_TEST_HEAD_CASE_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/internal.h"
#include "testutil.h"

typedef struct hcase {
    int64_t N, H, V_loc, V, v0, K;
    sph_dtype dt, gdt; /* input dtype, gradient output dtype */
    void *h, *w;       /* (N, H), (V_loc, H) */
    int64_t *tgt, *cand;
    uint8_t *mask;
    int64_t *spans, n_spans;
    float *lp, *ent, *lse, *lm, *stats, *g, *e, *gl, *gm;
    void *dh, *dw;
    int64_t sh_h[2], sh_w[2], sh_n[1], sh_c[2], sh_s[2], sh_dh[2], sh_dw[2];
    sph_tensor th, tw, tt, tc, tm, tlp, tent, tlse, tlm, tst, tg, te, tgl, tgm, tdh, tdw;
    sph_head_args a;
} hcase;

static inline size_t hc_esize(sph_dtype d) { return d.bits / 8; }

static inline double hc_get(const void *b, sph_dtype d, int64_t k) {
    if (d.bits == 32) return ((const float *)b)[k];
    if (d.bits == 64) return ((const double *)b)[k];
    uint16_t v = ((const uint16_t *)b)[k];
    return d.code == SPH_DTYPE_BFLOAT ? sph_bf16_to_f32(v) : sph_f16_to_f32(v);
}

static inline void hc_set(void *b, sph_dtype d, int64_t k, double v) {
    if (d.bits == 32) {
        ((float *)b)[k] = (float)v;
    } else {
        ((uint16_t *)b)[k] =
            d.code == SPH_DTYPE_BFLOAT ? sph_f32_to_bf16((float)v) : sph_f32_to_f16((float)v);
    }
}

static inline void *hc_alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

/* A case with N rows, H hidden, shard [v0, v0 + V_loc) of V, K candidates (0 = full). The
 * logit scale keeps the softmax neither flat nor one-hot. Targets: random in [0, V) (inside
 * the support in candidate mode), every 7th row ignored (-100). No mask, no spans. */
static inline void hc_init(hcase *c, sph_rng *r, int64_t N, int64_t H, int64_t V_loc,
                           int64_t V, int64_t v0, int64_t K, sph_dtype dt) {
    memset(c, 0, sizeof *c);
    c->N = N, c->H = H, c->V_loc = V_loc, c->V = V, c->v0 = v0, c->K = K, c->dt = dt;
    c->gdt = SPH_F32;
    c->h = hc_alloc((size_t)(N * H) * hc_esize(dt));
    c->w = hc_alloc((size_t)(V_loc * H) * hc_esize(dt));
    double ws = 2.5 / sqrt((double)H);
    for (int64_t k = 0; k < N * H; k++) hc_set(c->h, dt, k, rng_normal(r));
    for (int64_t k = 0; k < V_loc * H; k++) hc_set(c->w, dt, k, rng_normal(r) * ws);
    c->tgt = hc_alloc((size_t)N * sizeof(int64_t));
    if (K) {
        c->cand = hc_alloc((size_t)(N * K) * sizeof(int64_t));
        for (int64_t i = 0; i < N; i++) {
            int64_t n = 0;
            while (n < K) { /* distinct ids, some padding */
                int64_t id = rng_range(r, 0, V - 1);
                int dup = 0;
                for (int64_t q = 0; q < n; q++) dup |= c->cand[i * K + q] == id;
                if (dup) continue;
                c->cand[i * K + n++] = id;
                if (n >= 2 && n < K && rng_uniform(r) < 0.15) break;
            }
            int64_t filled = n;
            for (; n < K; n++) c->cand[i * K + n] = -1;
            c->tgt[i] = c->cand[i * K + rng_range(r, 0, filled - 1)];
        }
    } else {
        for (int64_t i = 0; i < N; i++) c->tgt[i] = rng_range(r, 0, V - 1);
    }
    for (int64_t i = 3; i < N; i += 7) c->tgt[i] = -100;
    c->lp = hc_alloc((size_t)N * 4), c->ent = hc_alloc((size_t)N * 4);
    c->lse = hc_alloc((size_t)N * 4), c->lm = hc_alloc((size_t)N * 4);
    c->stats = hc_alloc((size_t)N * 12);
    c->g = hc_alloc((size_t)N * 4), c->e = hc_alloc((size_t)N * 4);
    c->gl = hc_alloc((size_t)N * 4), c->gm = hc_alloc((size_t)N * 4);
    for (int64_t i = 0; i < N; i++) {
        c->g[i] = (float)rng_normal(r);
        c->e[i] = (float)rng_normal(r);
        c->gl[i] = (float)rng_normal(r);
        c->gm[i] = (float)rng_normal(r);
    }
    c->dh = hc_alloc((size_t)(N * H) * 4);
    c->dw = hc_alloc((size_t)(V_loc * H) * 4);
}

static inline void hc_free(hcase *c) {
    free(c->h), free(c->w), free(c->tgt), free(c->cand), free(c->mask), free(c->spans);
    free(c->lp), free(c->ent), free(c->lse), free(c->lm), free(c->stats);
    free(c->g), free(c->e), free(c->gl), free(c->gm), free(c->dh), free(c->dw);
}

/* Which optional pieces are wired into the args. */
enum {
    HC_LP = 1, HC_ENT = 2, HC_LSE = 4, HC_LM = 8, /* outputs */
    HC_G = 16, HC_E = 32, HC_GL = 64, HC_GM = 128, /* upstream gradients */
    HC_DH = 256, HC_DW = 512, HC_MASK = 1024, HC_SPANS = 2048
};

static inline void hc_wire(hcase *c, unsigned what) {
    const int64_t N = c->N;
    c->th = tensor2(c->h, c->dt, c->sh_h, N, c->H);
    c->tw = tensor2(c->w, c->dt, c->sh_w, c->V_loc, c->H);
    c->tt = tensor1(c->tgt, SPH_I64, c->sh_n, N);
    c->tlp = tensor1(c->lp, SPH_F32, c->sh_n, N);
    c->tent = tensor1(c->ent, SPH_F32, c->sh_n, N);
    c->tlse = tensor1(c->lse, SPH_F32, c->sh_n, N);
    c->tlm = tensor1(c->lm, SPH_F32, c->sh_n, N);
    c->tg = tensor1(c->g, SPH_F32, c->sh_n, N);
    c->te = tensor1(c->e, SPH_F32, c->sh_n, N);
    c->tgl = tensor1(c->gl, SPH_F32, c->sh_n, N);
    c->tgm = tensor1(c->gm, SPH_F32, c->sh_n, N);
    c->tst = tensor2(c->stats, SPH_F32, c->sh_s, N, 3);
    c->tdh = tensor2(c->dh, c->gdt, c->sh_dh, N, c->H);
    c->tdw = tensor2(c->dw, c->gdt, c->sh_dw, c->V_loc, c->H);
    c->tm = tensor1(c->mask, SPH_U8, c->sh_n, N);
    if (c->cand) c->tc = tensor2(c->cand, SPH_I64, c->sh_c, N, c->K);
    sph_head_args a = SPH_HEAD_ARGS_INIT;
    a.hidden = &c->th, a.weight = &c->tw, a.targets = &c->tt;
    a.candidates = c->cand ? &c->tc : NULL;
    a.vocab_start = c->v0, a.vocab_total = c->V;
    a.stats = &c->tst;
    if (what & HC_LP) a.logprob = &c->tlp;
    if (what & HC_ENT) a.entropy = &c->tent;
    if (what & HC_LSE) a.lse = &c->tlse;
    if ((what & HC_LM) && !c->cand) a.logit_mean = &c->tlm;
    if (what & HC_G) a.dlogprob = &c->tg;
    if (what & HC_E) a.dentropy = &c->te;
    if (what & HC_GL) a.dlse = &c->tgl;
    if ((what & HC_GM) && !c->cand) a.dlogit_mean = &c->tgm;
    if (what & HC_DH) a.dhidden = &c->tdh;
    if (what & HC_DW) a.dweight = &c->tdw;
    if ((what & HC_MASK) && c->mask) a.active_mask = &c->tm;
    if ((what & HC_SPANS) && c->spans) a.spans = c->spans, a.n_spans = c->n_spans;
    c->a = a;
}

/* Random ragged mask with active fraction frac, plus its coalesced spans (gap 0). */
static inline void hc_mask(hcase *c, sph_rng *r, double frac) {
    free(c->mask), free(c->spans);
    c->mask = hc_alloc((size_t)c->N);
    c->spans = hc_alloc((size_t)(c->N + 1) * 2 * sizeof(int64_t));
    for (int64_t i = 0; i < c->N; i++) c->mask[i] = rng_uniform(r) < frac;
    c->n_spans = 0;
    for (int64_t i = 0; i < c->N;) {
        if (!c->mask[i]) {
            i++;
            continue;
        }
        int64_t s = i;
        while (i < c->N && c->mask[i]) i++;
        c->spans[2 * c->n_spans] = s, c->spans[2 * c->n_spans + 1] = i, c->n_spans++;
    }
}

static inline void hc_poison(hcase *c) {
    poison_f32(c->lp, (size_t)c->N), poison_f32(c->ent, (size_t)c->N);
    poison_f32(c->lse, (size_t)c->N), poison_f32(c->lm, (size_t)c->N);
    poison_f32(c->stats, (size_t)c->N * 3);
    poison_bytes(c->dh, (size_t)(c->N * c->H) * 4);
    poison_bytes(c->dw, (size_t)(c->V_loc * c->H) * 4);
}

static inline sph_ctx_t hc_ctx(const char *kernel, int threads, sph_comm_t comm) {
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.force_kernel = kernel;
    o.num_threads = threads;
    o.tp_comm = comm;
    sph_ctx_t ctx = NULL;
    expect_ok(sph_ctx_create(&ctx, &o));
    return ctx;
}

static inline void *hc_ws(sph_ctx_t ctx, sph_head_pass pass, const sph_head_args *a,
                          size_t *bytes) {
    expect_ok(sph_head_workspace_size(ctx, pass, a, bytes));
    return *bytes ? hc_alloc(*bytes) : NULL;
}

static inline sph_status hc_run(sph_ctx_t ctx, sph_head_pass pass, const sph_head_args *a) {
    size_t bytes = 0;
    sph_status s = sph_head_workspace_size(ctx, pass, a, &bytes);
    if (s != SPH_OK) return s;
    void *ws = bytes ? hc_alloc(bytes) : NULL;
    s = pass == SPH_HEAD_FORWARD ? sph_head_forward(ctx, a, ws, bytes)
                                 : sph_head_backward(ctx, a, ws, bytes);
    free(ws);
    return s;
}

/* Normwise check: |got - ref| <= tol * (max|ref| + 0.5 + |ref|) elementwise, NaN fails.
 * The 0.5 floor covers results that are 0 in exact arithmetic (V = 1: entropy's gradient
 * mu - z), where the reference's float32 statistics leave eps32 |z| |upstream| |w| of noise:
 * seen at 1.5e-6 with |z| ~ 10 (seed 1883208803163134). */
static inline int hc_close(const char *what, const char *cs, const void *got, sph_dtype gd,
                           const void *ref, sph_dtype rd, int64_t n, double tol) {
    double mx = 0;
    for (int64_t k = 0; k < n; k++) {
        double v = fabs(hc_get(ref, rd, k));
        if (v > mx) mx = v;
    }
    double *g = hc_alloc((size_t)n * 8), *rf = hc_alloc((size_t)n * 8);
    for (int64_t k = 0; k < n; k++) g[k] = hc_get(got, gd, k), rf[k] = hc_get(ref, rd, k);
    int ok = check_close_f64(what, cs, g, rf, (size_t)n, tol * (mx + 0.5), tol);
    free(g), free(rf);
    return ok;
}

// ---- in-process TP communicator ---------------------------------------------------------

typedef struct tp_group {
    int64_t size;
    pthread_barrier_t bar;
    const void *send[16];
    float *reduce[16];
} tp_group;

static sph_status tp_allgather(sph_comm_t c, const void *send, void *recv, size_t bytes,
                               void *stream) {
    (void)stream;
    tp_group *g = c->impl;
    g->send[c->rank] = send;
    pthread_barrier_wait(&g->bar);
    for (int64_t r = 0; r < g->size; r++)
        memcpy((char *)recv + (size_t)r * bytes, g->send[r], bytes);
    pthread_barrier_wait(&g->bar);
    return SPH_OK;
}

static sph_status tp_allreduce(sph_comm_t c, float *buf, size_t count, void *stream) {
    (void)stream;
    tp_group *g = c->impl;
    float *mine = malloc(count * sizeof *mine + 1);
    memcpy(mine, buf, count * sizeof *mine);
    g->reduce[c->rank] = mine;
    pthread_barrier_wait(&g->bar);
    for (size_t k = 0; k < count; k++) {
        float s = 0;
        for (int64_t r = 0; r < g->size; r++) s += g->reduce[r][k]; /* rank order */
        buf[k] = s;
    }
    pthread_barrier_wait(&g->bar);
    free(mine);
    return SPH_OK;
}

static void tp_destroy(sph_comm_t c) { (void)c; }

static const sph_comm_ops tp_ops = {tp_allgather, tp_allreduce, tp_destroy};

static inline void tp_group_init(tp_group *g, int64_t size) {
    memset(g, 0, sizeof *g);
    g->size = size;
    pthread_barrier_init(&g->bar, NULL, (unsigned)size);
}

static inline struct sph_comm tp_comm_of(tp_group *g, int64_t rank) {
    struct sph_comm c;
    memset(&c, 0, sizeof c);
    c.backend = SPH_COMM_NONE;
    c.rank = rank;
    c.size = g->size;
    c.ops = &tp_ops;
    c.impl = g;
    return c;
}

// ---- TP runs: shards in threads vs the unsharded run --------------------------------------

typedef struct tp_job {
    tp_group *g;
    int64_t rank, ranks;
    hcase *full; /* unsharded case (inputs only read) */
    hcase shard;
    const char *kernel;
    sph_status st;
} tp_job;

static inline void *tp_rank_main(void *arg) {
    tp_job *j = arg;
    hcase *f = j->full, *c = &j->shard;
    struct sph_comm comm = tp_comm_of(j->g, j->rank);
    int64_t V = f->V, a0 = V * j->rank / j->ranks, a1 = V * (j->rank + 1) / j->ranks;
    /* the shard view of the full case: same rows, weight rows [a0, a1) */
    memset(c, 0, sizeof *c);
    *c = *f;
    c->V_loc = a1 - a0, c->v0 = a0;
    c->w = (char *)f->w + (size_t)(a0 * f->H) * hc_esize(f->dt);
    c->lp = hc_alloc((size_t)f->N * 4), c->ent = hc_alloc((size_t)f->N * 4);
    c->lse = hc_alloc((size_t)f->N * 4), c->lm = hc_alloc((size_t)f->N * 4);
    c->stats = hc_alloc((size_t)f->N * 12);
    c->dh = hc_alloc((size_t)(f->N * f->H) * 4);
    c->dw = hc_alloc((size_t)(c->V_loc * f->H) * 4);
    hc_poison(c);
    sph_ctx_t ctx = NULL;
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.force_kernel = j->kernel;
    o.num_threads = 1;
    o.tp_comm = &comm;
    j->st = sph_ctx_create(&ctx, &o);
    if (j->st != SPH_OK) return NULL;
    hc_wire(c, HC_LP | HC_ENT | HC_LSE | HC_LM | HC_MASK);
    j->st = hc_run(ctx, SPH_HEAD_FORWARD, &c->a);
    if (j->st == SPH_OK) {
        hc_wire(c, HC_G | HC_E | HC_GL | HC_GM | HC_DH | HC_DW | HC_MASK);
        c->a.allreduce_dhidden = 1;
        j->st = hc_run(ctx, SPH_HEAD_BACKWARD, &c->a);
    }
    sph_ctx_destroy(ctx);
    return NULL;
}

/* Runs the full case as `ranks` shards in threads; compares per-row outputs and stats with the
 * unsharded run, the concatenated shard dweight with the unsharded dweight, and the all-reduced
 * dhidden with the unsharded dhidden. Used by the CPU test too (kernel argument). */
static inline void tp_check(sph_rng *r, const char *kernel, int64_t ranks, int64_t K, sph_dtype dt) {
    hcase f;
    const int64_t N = 11, H = 9, V = 29;
    hc_init(&f, r, N, H, V, V, 0, K, dt);
    hc_mask(&f, r, 0.7);
    sph_ctx_t ctx = hc_ctx(kernel, 1, NULL);
    hc_wire(&f, HC_LP | HC_ENT | HC_LSE | HC_LM | HC_MASK);
    hc_poison(&f);
    expect_ok(hc_run(ctx, SPH_HEAD_FORWARD, &f.a));
    hc_wire(&f, HC_G | HC_E | HC_GL | HC_GM | HC_DH | HC_DW | HC_MASK);
    expect_ok(hc_run(ctx, SPH_HEAD_BACKWARD, &f.a));
    sph_ctx_destroy(ctx);

    tp_group g;
    tp_group_init(&g, ranks);
    tp_job jobs[8];
    pthread_t th[8];
    for (int64_t k = 0; k < ranks; k++) {
        jobs[k] = (tp_job){&g, k, ranks, &f, {0}, kernel, SPH_OK};
        pthread_create(&th[k], NULL, tp_rank_main, &jobs[k]);
    }
    for (int64_t k = 0; k < ranks; k++) pthread_join(th[k], NULL);
    pthread_barrier_destroy(&g.bar);
    char cs[160];
    snprintf(cs, sizeof cs, "head_tp(kernel=%s,ranks=%lld,N=%lld,H=%lld,V=%lld,K=%lld,dtype=%s)",
             kernel ? kernel : "best", (long long)ranks, (long long)N, (long long)H, (long long)V, (long long)K,
             sph_dtype_name(dt));
    double tol = 2e-5;
    for (int64_t k = 0; k < ranks; k++) {
        hcase *c = &jobs[k].shard;
        if (jobs[k].st != SPH_OK) fail_msg("%s rank %lld: %s", cs, (long long)k, sph_last_error());
        assert_true(hc_close("logprob", cs, c->lp, SPH_F32, f.lp, SPH_F32, N, tol));
        assert_true(hc_close("entropy", cs, c->ent, SPH_F32, f.ent, SPH_F32, N, tol));
        assert_true(hc_close("lse", cs, c->lse, SPH_F32, f.lse, SPH_F32, N, tol));
        if (!K) assert_true(hc_close("logit_mean", cs, c->lm, SPH_F32, f.lm, SPH_F32, N, tol));
        assert_true(hc_close("stats", cs, c->stats, SPH_F32, f.stats, SPH_F32, 3 * N, tol));
        assert_true(hc_close("dhidden (all-reduced)", cs, c->dh, SPH_F32, f.dh, SPH_F32, N * H,
                             tol));
        assert_true(hc_close("dweight shard", cs, c->dw, SPH_F32,
                             (float *)f.dw + c->v0 * H, SPH_F32, c->V_loc * H, tol));
        free(c->lp), free(c->ent), free(c->lse), free(c->lm), free(c->stats), free(c->dh),
            free(c->dw);
    }
    hc_free(&f);
}

#endif
