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

/* The metrics an optimized backend wrote (met, f32) against the float64 metrics its own
 * written rows imply (lp / ent: its f32 log-probs and entropies, sph_policy_ref_metrics_at):
 * |got - implied| <= tol (sum |row contribution| + |implied|), NaN fails. The error of the
 * log-probs themselves is the caller's hc_close against the reference; checked this way a
 * metric that is a small difference of large terms (a pg_loss of -0.02 from terms of 10, at
 * T = 0.25) carries no budget for that error, which it may amplify by the terms' size. */
static inline int pc_metrics_implied(const char *what, const char *cs, pcase *c, const void *met,
                                     sph_dtype md, const float *lp, const float *ent,
                                     double tol) {
    sph_ctx_t ctx = hc_ctx("ref", 1, NULL);
    sph_policy_plan pp;
    expect_ok(sph_policy_plan_make(ctx, &c->h.a, &c->p, &pp));
    double want[SPH_POLICY_N_METRICS], scale[SPH_POLICY_N_METRICS], g[SPH_POLICY_N_METRICS],
        bound[SPH_POLICY_N_METRICS];
    expect_ok(sph_policy_ref_metrics_at(&pp, lp, ent, want, scale));
    sph_ctx_destroy(ctx);
    for (int k = 0; k < SPH_POLICY_N_METRICS; k++)
        g[k] = hc_get(met, md, k), bound[k] = tol * (scale[k] + fabs(want[k]));
    return check_within(what, cs, g, want, bound, SPH_POLICY_N_METRICS);
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
        assert_true(pc_metrics_implied("metrics", cs, &f, c->metrics, SPH_F32, c->h.lp, c->h.ent,
                                       TOL_CPU_F32));
        assert_true(hc_close("logprob", cs, c->h.lp, SPH_F32, f.h.lp, SPH_F32, N, TOL_CPU_F32));
        assert_true(hc_close("entropy", cs, c->h.ent, SPH_F32, f.h.ent, SPH_F32, N, TOL_CPU_F32));
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
    float lp[29], ent[29]; /* the group's rows as the ranks wrote them */
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
        memcpy(lp + a0, c->h.lp, (size_t)(a1 - a0) * 4);
        memcpy(ent + a0, c->h.ent, (size_t)(a1 - a0) * 4);
    }
    for (int m = SPH_METRIC_TOKENS; m < SPH_POLICY_N_METRICS; m++) msum[m] = f.metrics[m];
    assert_true(pc_metrics_implied("metrics summed over the group", cs, &f, msum, SPH_F64, lp, ent,
                                   TOL_CPU_F32));
    assert_true(hc_close("entropy rows", cs, ent, SPH_F32, f.h.ent, SPH_F32, N, TOL_CPU_F32));
    assert_true(hc_close("dweight summed over the group", cs, dw, SPH_F64, f.h.dw, SPH_F32, V * H,
                         TOL_CPU_F32));
    for (int64_t k = 0; k < ranks; k++) pc_free(&jobs[k].part);
    pc_free(&f);
}

// ---- exact ties, built (issue 28) ------------------------------------------------------------

/* One run of a tie case: the metrics and dhidden. */
typedef struct ptie_run {
    float met[SPH_POLICY_N_METRICS];
    float *dh;
} ptie_run;

typedef void (*ptie_runner)(sph_ctx_t, pcase *); /* runs the wired case, outputs back on the host */

static inline void ptie_host_run(sph_ctx_t ctx, pcase *c) {
    sph_status st = pc_run(ctx, c);
    if (st != SPH_OK) fail_msg("policy ties: %s", sph_last_error());
}

static inline void ptie_run_case(sph_ctx_t ctx, pcase *c, ptie_run *o, ptie_runner run) {
    pc_poison(c);
    (run ? run : ptie_host_run)(ctx, c);
    memcpy(o->met, c->metrics, sizeof o->met);
    o->dh = hc_alloc((size_t)(c->h.N * c->h.H) * 4);
    memcpy(o->dh, c->h.dh, (size_t)(c->h.N * c->h.H) * 4);
}

/* max |a - s b| over row i of dhidden, relative to max |s b| (s: the expected scale). */
static inline double ptie_row_err(const float *a, const float *b, double s, int64_t i, int64_t H,
                                  double *scale) {
    double e = 0, m = 0;
    for (int64_t k = 0; k < H; k++) {
        double x = a[i * H + k], y = s * b[i * H + k];
        e = fmax(e, isnan(x - y) ? INFINITY : fabs(x - y));
        m = fmax(m, fabs(y));
    }
    if (scale) *scale = m;
    return m > 0 ? e / m : e;
}

/* The tie rules of docs/policy.md on a whole problem, the ties built exactly: the ratio
 * r_i = exp(logp_i - old_i) the backend computes is known bitwise (logp is the backend's own:
 * `own_logp` fills it - the reference's float64 log-probs, the CPU / CUDA backends' float32
 * logprob output, which their per-row hook reads - and exp is the same libm function), so
 *   - clip_high = r_u - 1 puts row u exactly on the upper bound (r_u in (1, 2): exact),
 *   - clip_low = 1 - r_l puts row l exactly on the lower bound (r_l in (0.5, 1): exact),
 *   - clip_ratio_c = r_k puts row k (A < 0, r_k > 1 + clip_high) exactly on the dual clip.
 * Then, against the same problem with each bound moved by 1e-12 or well past the row:
 *   - a ratio on a clip bound keeps its full gradient (closed interval: the row's dhidden
 *     equals the one of a run with the row strictly inside) and is not counted clipped (one
 *     fewer than with the bound 1e-12 inside, where the row's gradient is exactly 0);
 *   - at the dual clip's tie the row keeps half its gradient (torch.minimum: half the
 *     dhidden of the run without a dual clip) and is not counted in pg_clipfrac_lower.
 * Entropy and KL off, so a row's dhidden is its policy gradient alone. */
static inline void policy_tie_check(sph_rng *r, sph_ctx_t ctx, const char *what,
                                    void (*own_logp)(sph_ctx_t, pcase *, double *)) {
    const int64_t N = 29, H = 7, V = 37, iu = 3, il = 5, ik = 8;
    pcase c;
    pc_init(&c, r, N, H, V, V, 0, SPH_F32);
    pc_wire(&c, HC_LP | HC_ENT | HC_DH, SPH_PG_PPO, SPH_KL_NONE, SPH_AGG_TOKEN_MEAN);
    c.p.entropy_coef = 0.0;
    c.h.tgt[iu] = 11, c.h.tgt[il] = 2, c.h.tgt[ik] = 30; /* active rows (hc_init ignores some) */
    double *lp = hc_alloc((size_t)N * 8);
    own_logp(ctx, &c, lp);
    for (int64_t i = 0; i < N; i++) c.old[i] = (float)(lp[i] - 0.05 * rng_normal(r));
    c.adv[iu] = 0.8f, c.old[iu] = (float)(lp[iu] - 0.15);
    c.adv[il] = -0.6f, c.old[il] = (float)(lp[il] + 0.3);
    c.adv[ik] = -1.1f, c.old[ik] = (float)(lp[ik] - 1.2);
    const double ru = exp(lp[iu] - (double)c.old[iu]), rl = exp(lp[il] - (double)c.old[il]);
    const double rk = exp(lp[ik] - (double)c.old[ik]);
    assert_true(ru > 1 && ru < 2 && rl > 0.5 && rl < 1 && rk > 2);
    const double hi = ru - 1.0, lo = 1.0 - rl;
    assert_true(1.0 + hi == ru && 1.0 - lo == rl); /* the bounds the backend forms, exactly */
    c.p.clip_high = hi, c.p.clip_low = lo, c.p.clip_ratio_c = rk;
    ptie_run tie, up_in, up_out, lo_in, lo_out, dual_off, dual_out;
    ptie_run_case(ctx, &c, &tie, NULL);
    c.p.clip_high = hi + 0.3, ptie_run_case(ctx, &c, &up_in, NULL);
    c.p.clip_high = hi - 1e-12, ptie_run_case(ctx, &c, &up_out, NULL);
    c.p.clip_high = hi;
    c.p.clip_low = lo + 0.1, ptie_run_case(ctx, &c, &lo_in, NULL);
    c.p.clip_low = lo - 1e-12, ptie_run_case(ctx, &c, &lo_out, NULL);
    c.p.clip_low = lo;
    c.p.clip_ratio_c = HUGE_VAL, ptie_run_case(ctx, &c, &dual_off, NULL);
    c.p.clip_ratio_c = rk - 1e-12, ptie_run_case(ctx, &c, &dual_out, NULL);
    const double T = tie.met[SPH_METRIC_TOKENS];
    assert_true(T >= 3);
#define PT_COUNT(run, m) lround((double)(run).met[m] * T)
    long clip = PT_COUNT(tie, SPH_METRIC_PG_CLIPFRAC);
    char cs[160];
    snprintf(cs, sizeof cs, "%s ties (r_u=%.17g r_l=%.17g r_k=%.17g)", what, ru, rl, rk);
    if (PT_COUNT(up_out, SPH_METRIC_PG_CLIPFRAC) != clip + 1 ||
        PT_COUNT(lo_out, SPH_METRIC_PG_CLIPFRAC) != clip + 1 ||
        PT_COUNT(tie, SPH_METRIC_PG_CLIPFRAC_LOWER) != 0 ||
        PT_COUNT(dual_out, SPH_METRIC_PG_CLIPFRAC_LOWER) != 1)
        fail_msg("%s: clip counts at the ties %ld / lower %ld; bound 1e-12 inside: upper %ld, "
                 "lower %ld, dual %ld (expected %ld, %ld, 1 and 0 at the dual tie)", cs, clip,
                 PT_COUNT(tie, SPH_METRIC_PG_CLIPFRAC_LOWER),
                 PT_COUNT(up_out, SPH_METRIC_PG_CLIPFRAC), PT_COUNT(lo_out, SPH_METRIC_PG_CLIPFRAC),
                 PT_COUNT(dual_out, SPH_METRIC_PG_CLIPFRAC_LOWER), clip + 1, clip + 1);
#undef PT_COUNT
    const struct {
        const char *name;
        int64_t row;
        const ptie_run *other;
        double s;
    } chk[] = {{"upper bound: full gradient (= strictly inside)", iu, &up_in, 1.0},
               {"upper bound 1e-12 inside: no gradient", iu, &up_out, 0.0},
               {"lower bound: full gradient (= strictly inside)", il, &lo_in, 1.0},
               {"lower bound 1e-12 inside: no gradient", il, &lo_out, 0.0},
               {"dual clip tie: half the gradient", ik, &dual_off, 0.5},
               {"dual clip 1e-12 inside: no gradient", ik, &dual_out, 0.0}};
    for (size_t q = 0; q < sizeof chk / sizeof chk[0]; q++) {
        double scale = 0, err;
        if (chk[q].s == 0.0) { /* the other run's row is 0, the tie's is not */
            err = ptie_row_err(chk[q].other->dh, tie.dh, 0.0, chk[q].row, H, NULL);
            ptie_row_err(tie.dh, tie.dh, 1.0, chk[q].row, H, &scale);
            if (!(err == 0.0 && scale > 0))
                fail_msg("%s: %s: row %lld's dhidden max %g there, %g at the tie", cs,
                         chk[q].name, (long long)chk[q].row, err, scale);
        } else {
            err = ptie_row_err(tie.dh, chk[q].other->dh, chk[q].s, chk[q].row, H, &scale);
            if (!(err <= 1e-6 && scale > 0))
                fail_msg("%s: %s: row %lld's dhidden off by %.3g (relative)", cs, chk[q].name,
                         (long long)chk[q].row, err);
        }
    }
    free(tie.dh), free(up_in.dh), free(up_out.dh), free(lo_in.dh), free(lo_out.dh);
    free(dual_off.dh), free(dual_out.dh), free(lp);
    pc_free(&c);
}

/* The closed clip interval where the ratio is exactly 1 on every libm (host or device exp):
 * rows with old = logp bitwise (delta = 0, r = exp(0) = 1) and clip_low = clip_high = 0, so
 * the clip range is [1, 1] and those rows sit on both bounds at once. They keep the full
 * gradient (their dhidden equals the one of a run with the range [0.8, 1.3], where they are
 * strictly inside) and are not counted clipped: pg_clipfrac counts exactly the rows with
 * A (r - 1) > 0, i.e. A delta > 0, delta known exactly on the host. For a backend whose exp
 * is not the host's (CUDA), where the bounds of policy_tie_check cannot be built; the backend's
 * loss must read its float32 logprob output (CPU, CUDA; not the float64 reference). */
static inline void policy_tie_check_unit(sph_rng *r, sph_ctx_t ctx, const char *what,
                                         void (*own_logp)(sph_ctx_t, pcase *, double *),
                                         ptie_runner run) {
    const int64_t N = 31, H = 6, V = 43;
    pcase c;
    pc_init(&c, r, N, H, V, V, 0, SPH_F32);
    pc_wire(&c, HC_LP | HC_ENT | HC_DH, SPH_PG_PPO, SPH_KL_NONE, SPH_AGG_TOKEN_MEAN);
    c.p.entropy_coef = 0.0;
    c.p.clip_ratio_c = HUGE_VAL;
    for (int64_t i = 1; i < N; i += 3) c.h.tgt[i] = i % V; /* the tie rows: active */
    double *lp = hc_alloc((size_t)N * 8);
    own_logp(ctx, &c, lp);
    long want = 0;
    int64_t n_tie = 0;
    for (int64_t i = 0; i < N; i++) {
        const int tie = i % 3 == 1;
        c.old[i] = tie ? (float)lp[i] : (float)(lp[i] - 0.2 * rng_normal(r));
        if (tie) {
            /* the backend's logp is a float (its logprob output): delta = 0 exactly */
            assert_true((double)c.old[i] == lp[i]);
            n_tie++;
        }
        if (c.h.tgt[i] >= 0 && c.adv[i] * (lp[i] - (double)c.old[i]) > 0) want++;
    }
    c.p.clip_low = 0.0, c.p.clip_high = 0.0;
    ptie_run tie, in;
    ptie_run_case(ctx, &c, &tie, run);
    c.p.clip_low = 0.2, c.p.clip_high = 0.3;
    ptie_run_case(ctx, &c, &in, run);
    const double T = tie.met[SPH_METRIC_TOKENS];
    const long got = lround((double)tie.met[SPH_METRIC_PG_CLIPFRAC] * T);
    if (got != want)
        fail_msg("%s unit-ratio ties: pg_clipfrac counts %ld rows, expected %ld (the rows with "
                 "A delta > 0; the %lld rows at r = 1 on both bounds are not clipped)", what,
                 got, want, (long long)n_tie);
    for (int64_t i = 1; i < N; i += 3) {
        double scale = 0;
        const double err = ptie_row_err(tie.dh, in.dh, 1.0, i, H, &scale);
        if (!(err <= 1e-6 && scale > 0))
            fail_msg("%s unit-ratio ties: row %lld (r = 1 on both bounds) dhidden off by %.3g "
                     "(relative) from strictly inside (expected the full gradient)", what,
                     (long long)i, err);
    }
    free(tie.dh), free(in.dh), free(lp);
    pc_free(&c);
}

/* own_logp of the float64 reference: its log-probs, as its loss sees them. */
static inline void ptie_logp_ref(sph_ctx_t ctx, pcase *c, double *lp) {
    sph_policy_plan pp;
    expect_ok(sph_policy_plan_make(ctx, &c->h.a, &c->p, &pp));
    expect_ok(sph_policy_ref_f64(&pp, NULL, lp, NULL, NULL, NULL));
}

/* own_logp of a backend whose per-row hook reads its float32 logprob output. */
static inline void ptie_logp_output(sph_ctx_t ctx, pcase *c, double *lp) {
    pc_poison(c);
    expect_ok(pc_run(ctx, c));
    for (int64_t i = 0; i < c->h.N; i++) lp[i] = (double)c->h.lp[i];
}

#endif
