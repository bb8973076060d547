/*
 * test_policy_case.h - shared by the policy-loss tests: a head case (test_head_case.h) plus
 * the per-row policy inputs (advantages, old / reference log-probs, importance weights,
 * sequence ids) and the metrics output, the wiring of sph_policy_args, a runner, and a
 * helper that places each row's ratio and KL argument at chosen values away from every kink
 * (so central differences never straddle a clip bound).
 */
#ifndef SPH_TEST_POLICY_CASE_H
#define SPH_TEST_POLICY_CASE_H

#include "head/host.h"
#include "policy/policy.h"
#include "test_head_case.h"

typedef struct pcase {
    hcase h;
    float *adv, *old, *ref, *isw, *metrics;
    int64_t *seq;
    int64_t sh_m[1], sh_n[1];
    sph_tensor tadv, told, tref, tisw, tseq, tmet;
    sph_policy_args p;
} pcase;

/* Random per-row inputs: sequences of 1..5 consecutive rows, advantages ~ N(0, 1), old
 * log-probs a little off (set properly by pc_place), weights in [0.5, 1.5]. */
static inline void pc_init(pcase *c, sph_rng *r, int64_t N, int64_t H, int64_t V_loc, int64_t V,
                           int64_t v0, sph_dtype dt) {
    memset(c, 0, sizeof *c);
    hc_init(&c->h, r, N, H, V_loc, V, v0, 0, dt);
    c->adv = hc_alloc((size_t)N * 4), c->old = hc_alloc((size_t)N * 4);
    c->ref = hc_alloc((size_t)N * 4), c->isw = hc_alloc((size_t)N * 4);
    c->seq = hc_alloc((size_t)N * 8);
    c->metrics = hc_alloc(SPH_POLICY_N_METRICS * 4);
    int64_t s = 100, left = 0;
    for (int64_t i = 0; i < N; i++) {
        if (left == 0) s += rng_range(r, 1, 3), left = rng_range(r, 1, 5);
        left--;
        c->seq[i] = s;
        c->adv[i] = (float)rng_normal(r);
        c->old[i] = (float)(-3.0 + 0.3 * rng_normal(r));
        c->ref[i] = (float)(-3.0 + 0.3 * rng_normal(r));
        c->isw[i] = (float)(0.5 + rng_uniform(r));
    }
}

static inline void pc_free(pcase *c) {
    hc_free(&c->h);
    free(c->adv), free(c->old), free(c->ref), free(c->isw), free(c->seq), free(c->metrics);
}

enum { PC_ISW = 1 << 20, PC_NOSEQ = 1 << 21 };

/* Head wiring as hc_wire (what: HC_* bits; upstream-gradient bits are ignored) plus the
 * policy tensors. The policy scalars are left to the caller (c->p after this call). */
static inline void pc_wire(pcase *c, unsigned what, sph_pg_loss loss, sph_kl_kind kl,
                           sph_loss_agg agg) {
    hc_wire(&c->h, what & ~(unsigned)(HC_G | HC_E | HC_GL | HC_GM));
    const int64_t N = c->h.N;
    c->tadv = tensor1(c->adv, SPH_F32, c->sh_n, N);
    c->told = tensor1(c->old, SPH_F32, c->sh_n, N);
    c->tref = tensor1(c->ref, SPH_F32, c->sh_n, N);
    c->tisw = tensor1(c->isw, SPH_F32, c->sh_n, N);
    c->tseq = tensor1(c->seq, SPH_I64, c->sh_n, N);
    c->tmet = tensor1(c->metrics, SPH_F32, c->sh_m, SPH_POLICY_N_METRICS);
    sph_policy_args p = SPH_POLICY_ARGS_INIT;
    p.loss = loss, p.kl = kl, p.agg = agg;
    p.clip_low = 0.2, p.clip_high = 0.28, p.clip_ratio_c = loss == SPH_PG_CISPO ? HUGE_VAL : 3.0;
    p.kl_coef = kl ? 0.1 : 0.0;
    p.entropy_coef = 0.01;
    p.norm_length = 7.0;
    p.advantages = &c->tadv, p.old_logprob = &c->told;
    p.ref_logprob = kl ? &c->tref : NULL;
    p.is_weight = (what & PC_ISW) ? &c->tisw : NULL;
    p.seq_id = (what & PC_NOSEQ) ? NULL : &c->tseq;
    p.metrics = &c->tmet;
    c->p = p;
}

static inline void pc_poison(pcase *c) {
    hc_poison(&c->h);
    poison_f32(c->metrics, SPH_POLICY_N_METRICS);
}

static inline sph_status pc_run(sph_ctx_t ctx, pcase *c) {
    size_t bytes = 0;
    sph_status s = sph_policy_loss_workspace_size(ctx, &c->h.a, &c->p, &bytes);
    if (s != SPH_OK) return s;
    void *ws = bytes ? hc_alloc(bytes) : NULL;
    if (ws) poison_bytes(ws, bytes);
    s = sph_policy_loss(ctx, &c->h.a, &c->p, ws, bytes);
    free(ws);
    return s;
}

/* Metrics elementwise (they mix counts with losses of very different scales): |got - ref| <=
 * tol (0.05 + |ref|), NaN fails. */
static inline int pc_metrics_close(const char *what, const char *cs, const void *got,
                                   sph_dtype gd, const void *ref, sph_dtype rd, double tol) {
    double g[SPH_POLICY_N_METRICS], r[SPH_POLICY_N_METRICS];
    for (int k = 0; k < SPH_POLICY_N_METRICS; k++) g[k] = hc_get(got, gd, k), r[k] = hc_get(ref, rd, k);
    return check_close_f64(what, cs, g, r, SPH_POLICY_N_METRICS, 0.05 * tol, tol);
}

/* The values of delta = logp - o and x = q - logp each row gets, chosen away from every kink
 * of the losses (clip bounds 0.8 / 1.28 of r, the dual clip at r = 3, k3's clamp at 10 and
 * the +-20 clamps): inside, below, above the clip range, past the dual clip, clamped. */
static const double PC_DELTAS[] = {-0.1, 0.12, -0.5, 0.45, 1.6, -0.03, 0.9, -25.0, 23.0, 0.05};
static const double PC_XS[] = {-0.7, 0.3, 1.2, -3.0, 3.0, 25.0, -0.2, 0.6, -22.0, 0.02};

/* o and q from the float64 log-probs (the reference's) so that delta and x take the values
 * above (gspo: each sequence's mean delta lands on a value of the table). */
static inline void pc_place(pcase *c, const double *logp, int gspo) {
    const int64_t N = c->h.N;
    for (int64_t i = 0; i < N; i++) {
        double d = gspo ? PC_DELTAS[(c->seq[i] * 7) % 10] : PC_DELTAS[i % 10];
        c->old[i] = (float)(logp[i] - d);
        c->ref[i] = (float)(logp[i] + PC_XS[(i * 3) % 10]);
    }
}

// ---- TP shards: every rank the same bits -----------------------------------------------------

typedef struct ptp_job {
    tp_group *g;
    int64_t rank, ranks;
    pcase *full;
    pcase shard;
    const char *kernel;
    sph_status st;
} ptp_job;

static inline void *ptp_main(void *arg) {
    ptp_job *j = arg;
    pcase *f = j->full, *c = &j->shard;
    struct sph_comm comm = tp_comm_of(j->g, j->rank);
    int64_t V = f->h.V, a0 = V * j->rank / j->ranks, a1 = V * (j->rank + 1) / j->ranks;
    *c = *f;
    c->h.V_loc = a1 - a0, c->h.v0 = a0;
    c->h.w = (float *)f->h.w + a0 * f->h.H;
    c->h.lp = hc_alloc((size_t)f->h.N * 4), c->h.ent = hc_alloc((size_t)f->h.N * 4);
    c->h.stats = hc_alloc((size_t)f->h.N * 12);
    c->h.dh = hc_alloc((size_t)(f->h.N * f->h.H) * 4);
    c->h.dw = hc_alloc((size_t)(c->h.V_loc * f->h.H) * 4);
    c->metrics = hc_alloc(SPH_POLICY_N_METRICS * 4);
    sph_policy_args keep = f->p;
    pc_wire(c, HC_LP | HC_ENT | HC_DH | HC_DW | HC_MASK | PC_ISW, keep.loss, keep.kl, keep.agg);
    c->h.a.allreduce_dhidden = 1;
    pc_poison(c);
    sph_ctx_t ctx = NULL;
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.force_kernel = j->kernel;
    o.num_threads = 1;
    o.tp_comm = &comm;
    j->st = sph_ctx_create(&ctx, &o);
    if (j->st == SPH_OK) j->st = pc_run(ctx, c);
    if (j->st != SPH_OK) tp_group_abort(j->g); /* the peers' collectives fail, no wait */
    sph_ctx_destroy(ctx);
    return NULL;
}

/* The full case as `ranks` vocabulary shards in threads vs the unsharded call. */
static inline void policy_tp_check(sph_rng *r, const char *kernel, int64_t ranks, sph_pg_loss loss,
                     sph_kl_kind kl, sph_loss_agg agg) {
    pcase f;
    const int64_t N = 23, H = 9, V = 31;
    pc_init(&f, r, N, H, V, V, 0, SPH_F32);
    hc_mask(&f.h, r, 0.7);
    pc_wire(&f, HC_LP | HC_ENT | HC_DH | HC_DW | HC_MASK | PC_ISW, loss, kl, agg);
    sph_ctx_t ctx = hc_ctx(kernel, 1, NULL);
    pc_poison(&f);
    expect_ok(pc_run(ctx, &f));
    sph_ctx_destroy(ctx);
    tp_group g;
    tp_group_init(&g, ranks);
    ptp_job jobs[8];
    pthread_t th[8];
    for (int64_t k = 0; k < ranks; k++) {
        memset(&jobs[k], 0, sizeof jobs[k]);
        jobs[k].g = &g, jobs[k].rank = k, jobs[k].ranks = ranks, jobs[k].full = &f;
        jobs[k].kernel = kernel;
        pthread_create(&th[k], NULL, ptp_main, &jobs[k]);
    }
    for (int64_t k = 0; k < ranks; k++) pthread_join(th[k], NULL);
    tp_group_destroy(&g);
    char cs[160];
    snprintf(cs, sizeof cs, "policy_tp(kernel=%s,ranks=%lld,loss=%d,kl=%d,agg=%d)",
             kernel ? kernel : "best", (long long)ranks, (int)loss, (int)kl, (int)agg);
    for (int64_t k = 0; k < ranks; k++) {
        pcase *c = &jobs[k].shard;
        if (jobs[k].st != SPH_OK) fail_msg("%s rank %lld: %s", cs, (long long)k, sph_last_error());
        assert_memory_equal(c->metrics, jobs[0].shard.metrics, SPH_POLICY_N_METRICS * 4);
        assert_memory_equal(c->h.lp, jobs[0].shard.h.lp, (size_t)N * 4);
        assert_true(pc_metrics_close("metrics", cs, c->metrics, SPH_F32, f.metrics, SPH_F32,
                                     TOL_CPU_F32));
        assert_true(hc_close("logprob", cs, c->h.lp, SPH_F32, f.h.lp, SPH_F32, N, TOL_CPU_F32));
        assert_true(hc_close("dhidden (all-reduced)", cs, c->h.dh, SPH_F32, f.h.dh, SPH_F32,
                             N * H, TOL_CPU_F32));
        assert_true(hc_close("dweight shard", cs, c->h.dw, SPH_F32, (float *)f.h.dw + c->h.v0 * H,
                             SPH_F32, c->h.V_loc * H, TOL_CPU_F32));
    }
    for (int64_t k = 0; k < ranks; k++) {
        pcase *c = &jobs[k].shard;
        free(c->h.lp), free(c->h.ent), free(c->h.stats), free(c->h.dh), free(c->h.dw);
        free(c->metrics);
    }
    pc_free(&f);
}

// ---- a sequence group: sequences split across ranks -----------------------------------------

typedef struct seq_job {
    tp_group *g;
    int64_t rank, ranks;
    pcase *full;
    pcase part;
    const char *kernel;
    sph_status st;
} seq_job;

/* Rank k holds rows [k N / P, (k + 1) N / P) of the full case, padded to the same count with
 * inactive rows (every rank of the group passes the same N). */
static inline void *seq_main(void *arg) {
    seq_job *j = arg;
    pcase *f = j->full, *c = &j->part;
    const int64_t N = f->h.N, P = j->ranks, n = (N + P - 1) / P, H = f->h.H;
    const int64_t a0 = N * j->rank / P, a1 = N * (j->rank + 1) / P;
    memset(c, 0, sizeof *c);
    sph_rng dummy;
    rng_seed(&dummy, 1);
    pc_init(c, &dummy, n, H, f->h.V_loc, f->h.V, 0, SPH_F32);
    free(c->h.w);
    c->h.w = hc_alloc((size_t)(f->h.V_loc * H) * 4);
    memcpy(c->h.w, f->h.w, (size_t)(f->h.V_loc * H) * 4);
    c->h.mask = hc_alloc((size_t)n);
    for (int64_t i = 0; i < n; i++) {
        int64_t s = a0 + i;
        int in = s < a1;
        c->h.mask[i] = in ? f->h.mask[s] : 0;
        c->h.tgt[i] = in ? f->h.tgt[s] : -1;
        c->seq[i] = in ? f->seq[s] : -5;
        c->adv[i] = in ? f->adv[s] : 0, c->old[i] = in ? f->old[s] : 0;
        c->ref[i] = in ? f->ref[s] : 0, c->isw[i] = in ? f->isw[s] : 1;
        for (int64_t k = 0; k < H; k++)
            ((float *)c->h.h)[i * H + k] = in ? ((float *)f->h.h)[s * H + k] : 0.f;
    }
    pc_wire(c, HC_LP | HC_ENT | HC_DH | HC_DW | HC_MASK | PC_ISW, f->p.loss, f->p.kl, f->p.agg);
    struct sph_comm comm = tp_comm_of(j->g, j->rank);
    c->p.seq_comm = &comm;
    pc_poison(c);
    sph_ctx_t ctx = hc_ctx(j->kernel, 1, NULL);
    j->st = pc_run(ctx, c);
    if (j->st != SPH_OK) tp_group_abort(j->g); /* the peers' collectives fail, no wait */
    sph_ctx_destroy(ctx);
    return NULL;
}

static inline void policy_seq_check(sph_rng *r, const char *kernel, int64_t ranks, sph_pg_loss loss,
                      sph_loss_agg agg) {
    pcase f;
    const int64_t N = 29, H = 6, V = 13;
    pc_init(&f, r, N, H, V, V, 0, SPH_F32);
    hc_mask(&f.h, r, 0.8);
    pc_wire(&f, HC_LP | HC_ENT | HC_DH | HC_DW | HC_MASK | PC_ISW, loss, SPH_KL_K2, agg);
    sph_ctx_t ctx = hc_ctx(kernel, 1, NULL);
    pc_poison(&f);
    expect_ok(pc_run(ctx, &f));
    sph_ctx_destroy(ctx);
    tp_group g;
    tp_group_init(&g, ranks);
    seq_job jobs[8];
    pthread_t th[8];
    for (int64_t k = 0; k < ranks; k++) {
        memset(&jobs[k], 0, sizeof jobs[k]);
        jobs[k].g = &g, jobs[k].rank = k, jobs[k].ranks = ranks, jobs[k].full = &f;
        jobs[k].kernel = kernel;
        pthread_create(&th[k], NULL, seq_main, &jobs[k]);
    }
    for (int64_t k = 0; k < ranks; k++) pthread_join(th[k], NULL);
    tp_group_destroy(&g);
    char cs[160];
    snprintf(cs, sizeof cs, "policy_seq_group(kernel=%s,ranks=%lld,loss=%d,agg=%d)",
             kernel ? kernel : "best", (long long)ranks, (int)loss, (int)agg);
    /* additive metrics sum over the ranks to the single call's; dhidden rows match; dweight
     * sums over the ranks */
    double msum[SPH_POLICY_N_METRICS] = {0}, dw[13 * 6] = {0};
    for (int64_t k = 0; k < ranks; k++) {
        pcase *c = &jobs[k].part;
        if (jobs[k].st != SPH_OK) fail_msg("%s rank %lld: %s", cs, (long long)k, sph_last_error());
        for (int m = 0; m <= SPH_METRIC_PPO_KL; m++) msum[m] += c->metrics[m];
        for (int m = SPH_METRIC_TOKENS; m < SPH_POLICY_N_METRICS; m++)
            assert_true(c->metrics[m] == f.metrics[m]); /* the group's counts on every rank */
        for (int64_t q = 0; q < V * H; q++) dw[q] += ((float *)c->h.dw)[q];
        const int64_t a0 = N * k / ranks, a1 = N * (k + 1) / ranks;
        assert_true(hc_close("dhidden rows", cs, c->h.dh, SPH_F32, (float *)f.h.dh + a0 * H,
                             SPH_F32, (a1 - a0) * H, TOL_CPU_F32));
        assert_true(hc_close("logprob rows", cs, c->h.lp, SPH_F32, f.h.lp + a0, SPH_F32, a1 - a0,
                             TOL_CPU_F32));
    }
    for (int m = SPH_METRIC_TOKENS; m < SPH_POLICY_N_METRICS; m++) msum[m] = f.metrics[m];
    assert_true(pc_metrics_close("metrics summed over the group", cs, msum, SPH_F64, f.metrics,
                                 SPH_F32, TOL_CPU_F32));
    assert_true(hc_close("dweight summed over the group", cs, dw, SPH_F64, f.h.dw, SPH_F32, V * H,
                         TOL_CPU_F32));
    for (int64_t k = 0; k < ranks; k++) pc_free(&jobs[k].part);
    pc_free(&f);
}

#endif
