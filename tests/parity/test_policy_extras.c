/*
 * test_policy_extras.c - the head's extras through the fused policy loss (issue 25: top-k of
 * the policy's own distribution, topk_ids (N, K) i64 + topk_logprobs (N, K) f32, and sum_p2
 * (N) f32), on the float64 reference and the CPU backend, against float64 oracles written
 * here (test_head_topk.c's full sort, topk_check.h; sum_p2 = sum_j e^(2 (z_j - lse)) from
 * every logit of the row): ppo, cispo and gspo (forward, rho, backward), awkward vocabularies
 * (613: three tiles of 256, 137: one narrow tile), K = 1, 7, 64, 256 and K = V, masks (none,
 * random, empty, one active row, every row active, spans only), ignored targets (the loss's
 * inactive rows: ids -1, log-probs 0, sum_p2 0, like every per-row output of the loss), bf16,
 * per-row temperatures and softcap, loss-only and gradient calls, several row chunks; the
 * loss's own outputs bitwise equal to the same call without the extras; tensor parallelism in
 * threads (2 and 3 ranks, several vocabulary tiles per rank, K above a rank's V_loc): every
 * rank the same bits, merged in rank order; strided top-k outputs (row stride K + 3, the
 * columns past K untouched); bad input (K outside [1, 256], K > V, one tensor
 * alone, top-k with candidates: the head's rule, sum_p2 with candidates: the policy's) and
 * gspo's refused backward: an error and nothing written. Outputs poisoned before each run.
 */
#include "test_policy_case.h"

#include "topk_check.h"

/* The extras' buffers of a case (compact (N, K) lists). */
typedef struct xbuf {
    int64_t N, K;
    int64_t *ids;
    float *lp, *sp2;
    int64_t sh_i[2], sh_l[2], sh_s[1];
    sph_tensor ti, tl, ts;
} xbuf;

static void xb_alloc(xbuf *b, int64_t N, int64_t K) {
    memset(b, 0, sizeof *b);
    b->N = N, b->K = K;
    b->ids = hc_alloc((size_t)(N * K + 1) * 8);
    b->lp = hc_alloc((size_t)(N * K + 1) * 4);
    b->sp2 = hc_alloc((size_t)N * 4 + 4);
    b->ti = tensor2(b->ids, SPH_I64, b->sh_i, N, K);
    b->tl = tensor2(b->lp, SPH_F32, b->sh_l, N, K);
    b->ts = tensor1(b->sp2, SPH_F32, b->sh_s, N);
}

static void xb_wire(xbuf *b, sph_head_args *a, int topk, int sp2) {
    a->topk_ids = topk ? &b->ti : NULL;
    a->topk_logprobs = topk ? &b->tl : NULL;
    a->sum_p2 = sp2 ? &b->ts : NULL;
}

static void xb_poison(xbuf *b) {
    for (int64_t k = 0; k < b->N * b->K; k++) b->ids[k] = 0x5a5a5a5a5a5aLL;
    poison_f32(b->lp, (size_t)(b->N * b->K));
    poison_f32(b->sp2, (size_t)b->N);
}

static void xb_free(xbuf *b) { free(b->ids), free(b->lp), free(b->sp2); }

/* The loss's rows: the head's (mask, else spans, else all) with a target >= 0. */
static void loss_rows(const pcase *c, uint8_t *act) {
    hc_active(&c->h, act);
    for (int64_t i = 0; i < c->h.N; i++) act[i] = act[i] && c->h.tgt[i] >= 0;
}

/* The loss's outputs of a run (to compare a run with the extras against one without). */
typedef struct lossout {
    float met[SPH_POLICY_N_METRICS];
    float *lp, *ent, *dh, *dw;
} lossout;

static void lo_take(const pcase *c, int grads, lossout *o) {
    const int64_t N = c->h.N, H = c->h.H, V = c->h.V_loc;
    memcpy(o->met, c->metrics, sizeof o->met);
    o->lp = hc_dup(c->h.lp, (size_t)N * 4), o->ent = hc_dup(c->h.ent, (size_t)N * 4);
    o->dh = grads ? hc_dup(c->h.dh, (size_t)(N * H) * 4) : NULL;
    o->dw = grads ? hc_dup(c->h.dw, (size_t)(V * H) * 4) : NULL;
}

static int lo_same(const char *cs, const lossout *a, const lossout *b, const pcase *c,
                   int grads) {
    const int64_t N = c->h.N, H = c->h.H, V = c->h.V_loc;
    const char *what = memcmp(a->met, b->met, sizeof a->met) ? "metrics"
                       : memcmp(a->lp, b->lp, (size_t)N * 4) ? "logprob"
                       : memcmp(a->ent, b->ent, (size_t)N * 4) ? "entropy"
                       : grads && memcmp(a->dh, b->dh, (size_t)(N * H) * 4) ? "dhidden"
                       : grads && memcmp(a->dw, b->dw, (size_t)(V * H) * 4) ? "dweight"
                                                                          : NULL;
    if (what) fprintf(stderr, "FAIL %s: %s differs with the extras from without them\n", cs, what);
    return what == NULL;
}

static void lo_free(lossout *o) { free(o->lp), free(o->ent), free(o->dh), free(o->dw); }

// ---- one process: reference and CPU kernels ----------------------------------------------------

static void test_policy_extras(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 25201);
    const char *kernels[3] = {"ref", NULL, "generic"};
    const sph_pg_loss losses[3] = {SPH_PG_PPO, SPH_PG_CISPO, SPH_PG_GSPO};
    int ok = 1, runs = 0;
    for (int kk = 0; kk < 3; kk++) {
        sph_ctx_opts o = SPH_CTX_OPTS_INIT;
        o.force_kernel = kernels[kk];
        o.num_threads = 2;
        o.chunk_rows = 7; /* several chunks: one-pass combines (and the hook runs) per chunk */
        sph_ctx_t ctx = NULL;
        if (sph_ctx_create(&ctx, &o) != SPH_OK) continue;
        for (int v = 0; v < 18; v++) {
            const int64_t V = v % 6 == 5 ? 137 : 613;
            const int64_t Ks[6] = {1, 7, 64, 256, 33, 137};
            const int64_t K = Ks[v % 6], N = 23, H = 19;
            const sph_pg_loss loss = losses[v % 3];
            const int mask = v % 6, grads = v % 4 != 3, bf = v % 7 == 2, trows = v % 5 == 1;
            const int topk = v % 8 != 6, sp2 = v % 8 != 5;
            const double cap = v % 4 == 1 ? 2.5 : 0.0, T = trows ? 1.0 : (v % 3 == 1 ? 0.6 : 1.0);
            pcase c;
            pc_init(&c, &r, N, H, V, V, 0, bf ? SPH_BF16 : SPH_F32);
            unsigned what = HC_LP | HC_ENT | PC_ISW | (grads ? HC_DH | HC_DW : 0);
            if (mask) {
                hc_mask(&c.h, &r, 0.6);
                if (mask == 2 || mask == 3) memset(c.h.mask, 0, (size_t)N);
                if (mask == 3) c.h.mask[N / 2] = 1, c.h.tgt[N / 2] = 5;
                if (mask == 4) memset(c.h.mask, 1, (size_t)N);
                what |= mask == 5 ? HC_SPANS : HC_MASK;
            }
            pc_wire(&c, what, loss, v % 2 ? SPH_KL_K3 : SPH_KL_NONE,
                    v % 3 == 2 ? SPH_AGG_SEQ_MEAN_TOKEN_MEAN : SPH_AGG_TOKEN_MEAN);
            c.h.a.softcap = cap, c.h.a.temperature = T;
            float *tr = NULL;
            int64_t sh_t[1];
            sph_tensor tt;
            if (trows) {
                tr = hc_alloc((size_t)N * 4);
                for (int64_t i = 0; i < N; i++) tr[i] = (float)(0.25 * pow(16.0, rng_uniform(&r)));
                tt = tensor1(tr, SPH_F32, sh_t, N);
                c.h.a.temperature_rows = &tt;
            }
            xbuf b;
            xb_alloc(&b, N, K);
            char cs[200];
            snprintf(cs, sizeof cs, "policy extras(kernel=%s,loss=%d,V=%lld,K=%lld,topk=%d,"
                     "sum_p2=%d,mask=%d,grads=%d,%s,T=%g,trows=%d,cap=%g)",
                     kernels[kk] ? kernels[kk] : "best", (int)loss, (long long)V, (long long)K,
                     topk, sp2, mask, grads, bf ? "bf16" : "f32", T, trows, cap);
            /* without the extras first: the loss's outputs the extras must leave as they are */
            lossout plain, with;
            pc_poison(&c);
            sph_status s = pc_run(ctx, &c);
            if (s != SPH_OK) fail_msg("%s (plain): %s", cs, sph_last_error());
            lo_take(&c, grads, &plain);
            xb_wire(&b, &c.h.a, topk, sp2);
            pc_poison(&c);
            xb_poison(&b);
            s = pc_run(ctx, &c);
            if (s != SPH_OK) fail_msg("%s: %s: %s", cs, sph_status_str(s), sph_last_error());
            lo_take(&c, grads, &with);
            ok &= lo_same(cs, &plain, &with, &c, grads);
            uint8_t *act = hc_alloc((size_t)N);
            loss_rows(&c, act);
            /* the reference's lists are exact (ties: the lower id, gap 1e-9), fp32's 1e-4 */
            if (topk)
                ok &= check_topk_rows(cs, b.ids, b.lp, K, &c.h, act, T, tr, cap, TOL_CPU_F32,
                                      kk == 0 ? 1e-9 : 1e-4);
            if (sp2)
                ok &= check_sum_p2_rows(cs, b.sp2, &c.h, act, T, tr, cap, kk == 0 ? 1e-6 : 1e-4);
            if (!topk) /* not asked: never written */
                for (int64_t k = 0; k < N * K && ok; k++) ok &= b.ids[k] == 0x5a5a5a5a5a5aLL;
            /* the log-prob of a listed target is the loss's logprob of the row */
            for (int64_t i = 0; i < N && ok && topk; i++)
                for (int64_t k = 0; k < K; k++)
                    if (act[i] && b.ids[i * K + k] == c.h.tgt[i] &&
                        !(fabs(b.lp[i * K + k] - c.h.lp[i]) <= 1e-6 * (1 + fabs(c.h.lp[i])))) {
                        fprintf(stderr, "FAIL %s: row %lld: the target's listed log-prob %.9g vs "
                                        "logprob %.9g\n",
                                cs, (long long)i, b.lp[i * K + k], c.h.lp[i]);
                        ok = 0;
                    }
            free(act);
            lo_free(&plain), lo_free(&with);
            xb_free(&b);
            free(tr);
            pc_free(&c);
            runs++;
        }
        sph_ctx_destroy(ctx);
    }
    assert_true(runs >= 36);
    assert_true(ok);
}

// ---- tensor parallelism in threads -----------------------------------------------------------

typedef struct xtp_job {
    tp_group *g;
    int64_t rank, ranks, K;
    const char *kernel;
    pcase *full, shard;
    xbuf b;
    sph_status st;
} xtp_job;

static void *xtp_main(void *arg) {
    xtp_job *j = arg;
    pcase *f = j->full, *c = &j->shard;
    const int64_t N = f->h.N, H = f->h.H, V = f->h.V;
    const int64_t a0 = V * j->rank / j->ranks, a1 = V * (j->rank + 1) / j->ranks;
    struct sph_comm comm = tp_comm_of(j->g, j->rank);
    *c = *f;
    c->h.V_loc = a1 - a0, c->h.v0 = a0;
    c->h.w = (float *)f->h.w + a0 * H;
    c->h.lp = hc_alloc((size_t)N * 4), c->h.ent = hc_alloc((size_t)N * 4);
    c->h.stats = hc_alloc((size_t)N * 12);
    c->h.dh = hc_alloc((size_t)(N * H) * 4);
    c->h.dw = hc_alloc((size_t)(c->h.V_loc * H) * 4);
    c->metrics = hc_alloc(SPH_POLICY_N_METRICS * 4);
    sph_policy_args keep = f->p;
    pc_wire(c, HC_LP | HC_ENT | HC_DH | HC_DW | HC_MASK | PC_ISW, keep.loss, keep.kl, keep.agg);
    c->h.a.allreduce_dhidden = 1;
    xb_alloc(&j->b, N, j->K);
    xb_wire(&j->b, &c->h.a, 1, 1);
    pc_poison(c);
    xb_poison(&j->b);
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.force_kernel = j->kernel;
    o.num_threads = 1;
    o.chunk_rows = 5; /* one combine of the lists per chunk */
    o.tp_comm = &comm;
    sph_ctx_t ctx = NULL;
    j->st = sph_ctx_create(&ctx, &o);
    if (j->st == SPH_OK) j->st = pc_run(ctx, c);
    if (j->st != SPH_OK) tp_group_abort(j->g); /* the peers' collectives fail, no wait */
    sph_ctx_destroy(ctx);
    return NULL;
}

static int xtp_check(sph_rng *r, const char *kernel, int64_t ranks, int64_t V, int64_t K,
                     sph_pg_loss loss) {
    const int64_t N = 21, H = 11;
    pcase f;
    pc_init(&f, r, N, H, V, V, 0, SPH_F32);
    hc_mask(&f.h, r, 0.7);
    pc_wire(&f, HC_LP | HC_ENT | HC_DH | HC_DW | HC_MASK | PC_ISW, loss, SPH_KL_K2,
            SPH_AGG_TOKEN_MEAN);
    tp_group g;
    tp_group_init(&g, ranks);
    xtp_job jobs[4];
    pthread_t th[4];
    for (int64_t k = 0; k < ranks; k++) {
        memset(&jobs[k], 0, sizeof jobs[k]);
        jobs[k].g = &g, jobs[k].rank = k, jobs[k].ranks = ranks, jobs[k].full = &f;
        jobs[k].kernel = kernel, jobs[k].K = K;
        pthread_create(&th[k], NULL, xtp_main, &jobs[k]);
    }
    for (int64_t k = 0; k < ranks; k++) pthread_join(th[k], NULL);
    tp_group_destroy(&g);
    char cs[160];
    snprintf(cs, sizeof cs, "policy extras tp(kernel=%s,ranks=%lld,V=%lld,K=%lld,loss=%d)",
             kernel ? kernel : "best", (long long)ranks, (long long)V, (long long)K, (int)loss);
    int ok = 1;
    uint8_t *act = hc_alloc((size_t)N);
    loss_rows(&f, act);
    for (int64_t k = 0; k < ranks && ok; k++) {
        const xbuf *b = &jobs[k].b, *b0 = &jobs[0].b;
        if (jobs[k].st != SPH_OK) {
            fprintf(stderr, "FAIL %s rank %lld: %s\n", cs, (long long)k, sph_last_error());
            ok = 0;
            break;
        }
        /* the merged lists and sum_p2: the same bits on every rank */
        if (memcmp(b->ids, b0->ids, (size_t)(N * K) * 8) ||
            memcmp(b->lp, b0->lp, (size_t)(N * K) * 4) || memcmp(b->sp2, b0->sp2, (size_t)N * 4)) {
            fprintf(stderr, "FAIL %s: rank %lld's extras differ from rank 0's\n", cs,
                    (long long)k);
            ok = 0;
        }
    }
    if (ok) {
        ok &= check_topk(cs, jobs[0].b.ids, jobs[0].b.lp, K, &f.h, act, 1.0, 0.0, TOL_CPU_F32,
                         kernel && !strcmp(kernel, "ref") ? 1e-9 : 1e-4);
        ok &= check_sum_p2_rows(cs, jobs[0].b.sp2, &f.h, act, 1.0, NULL, 0.0, 1e-4);
    }
    for (int64_t k = 0; k < ranks; k++) {
        pcase *c = &jobs[k].shard;
        free(c->h.lp), free(c->h.ent), free(c->h.stats), free(c->h.dh), free(c->h.dw);
        free(c->metrics);
        xb_free(&jobs[k].b);
    }
    free(act);
    pc_free(&f);
    return ok;
}

static void test_policy_extras_tp(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 25202);
    int ok = 1;
    const char *kernels[2] = {NULL, "ref"};
    for (int kk = 0; kk < 2; kk++) {
        /* 2 ranks of 550 (three tiles each), 3 of ~367 (two tiles), K above V_loc = 100 */
        ok &= xtp_check(&r, kernels[kk], 2, 1100, 64, SPH_PG_PPO);
        ok &= xtp_check(&r, kernels[kk], 3, 1100, 256, SPH_PG_GSPO);
        ok &= xtp_check(&r, kernels[kk], 3, 300, 150, SPH_PG_CISPO);
        ok &= xtp_check(&r, kernels[kk], 2, 300, 150, SPH_PG_GSPO);
    }
    assert_true(ok);
}

// ---- strided outputs ------------------------------------------------------------------------

/* topk_ids / topk_logprobs with a row stride of K + 3 (a view of wider buffers): the lists land
 * in the first K columns of every row, the 3 others stay as they were (gspo copies its staged
 * lists into the caller's strides). */
static void test_policy_extras_strided(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 25204);
    const char *kernels[2] = {"ref", NULL};
    const sph_pg_loss losses[2] = {SPH_PG_PPO, SPH_PG_GSPO};
    int ok = 1;
    for (int kk = 0; kk < 2; kk++)
        for (int l = 0; l < 2; l++) {
            sph_ctx_t ctx = hc_ctx(kernels[kk], 2, NULL);
            const int64_t N = 19, H = 7, V = 300, K = 9, LD = K + 3;
            pcase c;
            pc_init(&c, &r, N, H, V, V, 0, SPH_F32);
            hc_mask(&c.h, &r, 0.7);
            pc_wire(&c, HC_LP | HC_ENT | HC_DH | HC_DW | HC_MASK, losses[l], SPH_KL_NONE,
                    SPH_AGG_TOKEN_MEAN);
            int64_t *ids = hc_alloc((size_t)(N * LD) * 8), *cids = hc_alloc((size_t)(N * K) * 8);
            float *lps = hc_alloc((size_t)(N * LD) * 4), *clps = hc_alloc((size_t)(N * K) * 4);
            for (int64_t k = 0; k < N * LD; k++) ids[k] = 0x5a5a5a5a5aLL;
            poison_f32(lps, (size_t)(N * LD));
            int64_t sh[2] = {N, K}, st[2] = {LD, 1};
            sph_tensor ti = {ids, {SPH_DEVICE_CPU, 0}, 2, SPH_I64, sh, st, 0};
            sph_tensor tl = {lps, {SPH_DEVICE_CPU, 0}, 2, SPH_F32, sh, st, 0};
            c.h.a.topk_ids = &ti, c.h.a.topk_logprobs = &tl;
            pc_poison(&c);
            sph_status s = pc_run(ctx, &c);
            if (s != SPH_OK) fail_msg("strided: %s", sph_last_error());
            for (int64_t i = 0; i < N; i++) {
                memcpy(cids + i * K, ids + i * LD, (size_t)K * 8);
                memcpy(clps + i * K, lps + i * LD, (size_t)K * 4);
                for (int64_t k = K; k < LD; k++)
                    if (ids[i * LD + k] != 0x5a5a5a5a5aLL || !isnan(lps[i * LD + k])) {
                        fprintf(stderr, "FAIL strided (kernel=%s,loss=%d): row %lld column %lld "
                                        "past K written\n",
                                kernels[kk] ? kernels[kk] : "best", (int)losses[l],
                                (long long)i, (long long)k);
                        ok = 0;
                    }
            }
            uint8_t *act = hc_alloc((size_t)N);
            loss_rows(&c, act);
            char cs[96];
            snprintf(cs, sizeof cs, "strided(kernel=%s,loss=%d)",
                     kernels[kk] ? kernels[kk] : "best", (int)losses[l]);
            ok &= check_topk(cs, cids, clps, K, &c.h, act, 1.0, 0.0, TOL_CPU_F32,
                             kk == 0 ? 1e-9 : 1e-4);
            free(act), free(ids), free(cids), free(lps), free(clps);
            pc_free(&c);
            sph_ctx_destroy(ctx);
        }
    assert_true(ok);
}

// ---- bad input: an error, nothing written ------------------------------------------------------

/* Runs the wired case expecting status st with needle in the message and every output (the
 * loss's and the extras) untouched. */
static int expect_refused(sph_ctx_t ctx, pcase *c, xbuf *b, sph_status st, const char *needle,
                          const char *what) {
    pc_poison(c);
    xb_poison(b);
    const int64_t N = c->h.N;
    float *lp0 = hc_dup(c->h.lp, (size_t)N * 4), *m0 = hc_dup(c->metrics, SPH_POLICY_N_METRICS * 4);
    int64_t *i0 = hc_dup(b->ids, (size_t)(N * b->K) * 8);
    float *l0 = hc_dup(b->lp, (size_t)(N * b->K) * 4), *s0 = hc_dup(b->sp2, (size_t)N * 4);
    sph_status s = pc_run(ctx, c);
    const int ok = s == st && strstr(sph_last_error(), needle) &&
                   !memcmp(lp0, c->h.lp, (size_t)N * 4) &&
                   !memcmp(m0, c->metrics, SPH_POLICY_N_METRICS * 4) &&
                   !memcmp(i0, b->ids, (size_t)(N * b->K) * 8) &&
                   !memcmp(l0, b->lp, (size_t)(N * b->K) * 4) && !memcmp(s0, b->sp2, (size_t)N * 4);
    if (!ok)
        fprintf(stderr, "FAIL refused %s: %s '%s' (expected %s with '%s', nothing written)\n",
                what, sph_status_str(s), sph_last_error(), sph_status_str(st), needle);
    free(lp0), free(m0), free(i0), free(l0), free(s0);
    return ok;
}

static void test_policy_extras_bad(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 25203);
    int ok = 1;
    const char *kernels[2] = {"ref", NULL};
    for (int kk = 0; kk < 2; kk++) {
        sph_ctx_t ctx = hc_ctx(kernels[kk], 1, NULL);
        const int64_t N = 12, H = 5, V = 300;
        pcase c;
        pc_init(&c, &r, N, H, V, V, 0, SPH_F32);
        hc_mask(&c.h, &r, 0.7);
        c.h.mask[3] = 1, c.h.tgt[3] = 1;
        pc_wire(&c, HC_LP | HC_ENT | HC_DH | HC_DW | HC_MASK | PC_ISW, SPH_PG_PPO, SPH_KL_NONE,
                SPH_AGG_TOKEN_MEAN);
        xbuf b;
        xb_alloc(&b, N, 257);
        xb_wire(&b, &c.h.a, 1, 1);
        /* K outside [1, 256] */
        const int64_t badk[2] = {0, 257};
        for (int q = 0; q < 2; q++) {
            b.ti = tensor2(b.ids, SPH_I64, b.sh_i, N, badk[q]);
            b.tl = tensor2(b.lp, SPH_F32, b.sh_l, N, badk[q]);
            ok &= expect_refused(ctx, &c, &b, SPH_ERR_SHAPE, "topk_ids: shape[1] (K)",
                                 q ? "K 257" : "K 0");
        }
        b.ti = tensor2(b.ids, SPH_I64, b.sh_i, N, 4);
        b.tl = tensor2(b.lp, SPH_F32, b.sh_l, N, 4);
        /* one tensor alone */
        c.h.a.topk_logprobs = NULL;
        ok &= expect_refused(ctx, &c, &b, SPH_ERR_INVALID_ARG, "topk_ids: given without",
                             "ids alone");
        c.h.a.topk_logprobs = &b.tl;
        /* sum_p2 of the wrong shape */
        b.ts = tensor1(b.sp2, SPH_F32, b.sh_s, N - 1);
        ok &= expect_refused(ctx, &c, &b, SPH_ERR_SHAPE, "sum_p2", "sum_p2 (N - 1)");
        b.ts = tensor1(b.sp2, SPH_F32, b.sh_s, N);
        /* a good call on this case, so that the refusals above are the arguments' */
        pc_poison(&c);
        if (pc_run(ctx, &c) != SPH_OK) {
            fprintf(stderr, "FAIL the good call: %s\n", sph_last_error());
            ok = 0;
        }
        pc_free(&c);
        /* K > V */
        pc_init(&c, &r, N, H, 11, 11, 0, SPH_F32);
        pc_wire(&c, HC_LP | HC_ENT, SPH_PG_PPO, SPH_KL_NONE, SPH_AGG_TOKEN_MEAN);
        b.ti = tensor2(b.ids, SPH_I64, b.sh_i, N, 12);
        b.tl = tensor2(b.lp, SPH_F32, b.sh_l, N, 12);
        xb_wire(&b, &c.h.a, 1, 1);
        ok &= expect_refused(ctx, &c, &b, SPH_ERR_SHAPE, "vocab_total", "K 12 > V 11");
        pc_free(&c);
        /* candidates: top-k is not defined there (the head's rule, first); sum_p2 there is
         * the policy's refusal of sample support */
        pc_init(&c, &r, N, H, V, V, 0, SPH_F32);
        hc_free(&c.h);
        hc_init(&c.h, &r, N, H, V, V, 0, 6, SPH_F32);
        pc_wire(&c, HC_LP | HC_ENT, SPH_PG_PPO, SPH_KL_NONE, SPH_AGG_TOKEN_MEAN);
        b.ti = tensor2(b.ids, SPH_I64, b.sh_i, N, 4);
        b.tl = tensor2(b.lp, SPH_F32, b.sh_l, N, 4);
        xb_wire(&b, &c.h.a, 1, 0);
        ok &= expect_refused(ctx, &c, &b, SPH_ERR_INVALID_ARG, "topk_ids: not defined in "
                             "sample-support mode", "top-k with candidates");
        xb_wire(&b, &c.h.a, 0, 1);
        ok &= expect_refused(ctx, &c, &b, SPH_ERR_UNSUPPORTED, "head.candidates",
                             "sum_p2 with candidates");
        pc_free(&c);
        /* gspo whose loss gradient is beyond float: its backward refuses it, and the forward's
         * extras are not written either (they wait for the backward, as logprob does) */
        pc_init(&c, &r, N, H, V, V, 0, SPH_F32);
        hc_mask(&c.h, &r, 0.7);
        c.h.mask[3] = 1, c.h.tgt[3] = 1;
        pc_wire(&c, HC_LP | HC_ENT | HC_DH | HC_DW | HC_MASK | PC_ISW, SPH_PG_GSPO, SPH_KL_NONE,
                SPH_AGG_TOKEN_MEAN);
        c.p.clip_low = 1, c.p.clip_high = 1e30;
        c.adv[3] = 1e30f, c.isw[3] = 1e30f;
        xb_wire(&b, &c.h.a, 1, 1);
        ok &= expect_refused(ctx, &c, &b, SPH_ERR_NONFINITE, "first row 3", "gspo beyond float");
        pc_free(&c);
        xb_free(&b);
        sph_ctx_destroy(ctx);
    }
    assert_true(ok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_policy_extras),
        cmocka_unit_test(test_policy_extras_tp),
        cmocka_unit_test(test_policy_extras_strided),
        cmocka_unit_test(test_policy_extras_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
