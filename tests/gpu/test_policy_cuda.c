/*
 * test_policy_cuda.c - the CUDA fused policy loss against the float64 reference on exactly the
 * rounded inputs the GPU sees, through the public API, outputs poisoned before each run:
 *   - every loss x KL x aggregation, f32 and bf16 (one f16), on the staged-chunk one-pass path
 *     (default chunk budget) and on the recomputing path (a small chunk budget: statistics of
 *     every chunk, then the gradient sweep; on sm_90 with bf16 that is the fused kernel);
 *   - awkward shapes and masks: N = 1, V not a multiple of 8, an empty mask, one active row,
 *     spans without a mask (one span and many: the gathered chunks), mask + spans, ignored
 *     targets, accumulate, loss-only calls, stats / logprob / entropy in the workspace;
 *   - inactive rows: exact zeros; metrics in device memory written without a host sync (the
 *     test synchronizes itself); determinism (two runs, bitwise);
 *   - the tie rules with ratio-1 ties built exactly (test_ties_built);
 *   - per-row temperatures (issue 25, test_temperature_rows): T_i in [0.25, 4] mixed, every
 *     loss, f32 and bf16, staged and recomputing paths;
 *   - the head's extras through the loss (issue 25, test_extras): top-k and sum_p2 of the
 *     loss's rows against topk_check.h's float64 oracle, the loss itself still against the
 *     reference, on the +extras paths (staged fp32 chunks, the recomputing sweep).
 * Skips (exit 77) without a CUDA device.
 */
#ifndef SPH_HAVE_CUDA
#include <stdio.h>
int main(void) {
    printf("no CUDA device: skipping (spanhead was built without CUDA)\n");
    return 77;
}
#else
#include "../parity/test_policy_case.h"
#include "../parity/topk_check.h"

static sph_rng g_rng;

// ---- device copies of a case -------------------------------------------------------------

#define NT 18
typedef struct dcase {
    sph_tensor *host[NT], dev[NT];
    int64_t shp[NT][2];
    void *ptr[NT];
    size_t bytes[NT];
    int out[NT];
    sph_head_args a;
    sph_policy_args p;
} dcase;

static size_t t_bytes(const sph_tensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n * (t->dtype.bits / 8);
}

static void one(sph_ctx_t g, dcase *d, int k, const sph_tensor **slot, int is_out) {
    const sph_tensor *t = *slot;
    d->host[k] = (sph_tensor *)t;
    d->out[k] = is_out;
    if (!t) return;
    d->bytes[k] = t_bytes(t);
    expect_ok(sph_ctx_malloc(g, d->bytes[k] ? d->bytes[k] : 4, &d->ptr[k]));
    if (d->bytes[k]) expect_ok(sph_ctx_memcpy(g, d->ptr[k], t->data, d->bytes[k]));
    d->dev[k] = *t;
    d->dev[k].data = d->ptr[k];
    d->dev[k].device.type = SPH_DEVICE_CUDA;
    d->dev[k].device.id = 0;
    for (int q = 0; q < t->ndim; q++) d->shp[k][q] = t->shape[q];
    d->dev[k].shape = d->shp[k];
    d->dev[k].strides = NULL;
    *slot = &d->dev[k];
}

static void dcase_make(sph_ctx_t g, const pcase *c, dcase *d) {
    memset(d, 0, sizeof *d);
    d->a = c->h.a;
    d->p = c->p;
    const sph_tensor **h[9] = {&d->a.hidden, &d->a.weight,  &d->a.targets,
                               &d->a.active_mask, &d->a.logprob, &d->a.entropy,
                               &d->a.stats, &d->a.dhidden, &d->a.dweight};
    const int ho[9] = {0, 0, 0, 0, 1, 1, 1, 1, 1};
    for (int k = 0; k < 9; k++) one(g, d, k, h[k], ho[k]);
    const sph_tensor **p[5] = {&d->p.advantages, &d->p.old_logprob, &d->p.ref_logprob,
                               &d->p.is_weight, &d->p.metrics};
    one(g, d, 9, p[0], 0), one(g, d, 10, p[1], 0), one(g, d, 11, p[2], 0);
    one(g, d, 12, p[3], 0), one(g, d, 13, p[4], 1);
    one(g, d, 14, &d->a.temperature_rows, 0); /* per-row temperatures, when given */
    one(g, d, 15, &d->a.topk_ids, 1), one(g, d, 16, &d->a.topk_logprobs, 1); /* the extras */
    one(g, d, 17, &d->a.sum_p2, 1);
    /* seq_id: one more device buffer, kept in slot-free storage */
}

static void dcase_back(sph_ctx_t g, dcase *d) {
    for (int k = 0; k < NT; k++)
        if (d->ptr[k] && d->out[k] && d->bytes[k])
            expect_ok(sph_ctx_memcpy(g, d->host[k]->data, d->ptr[k], d->bytes[k]));
}

static void dcase_free(sph_ctx_t g, dcase *d) {
    for (int k = 0; k < NT; k++) sph_ctx_free(g, d->ptr[k]);
}

static sph_ctx_t gpu_ctx(int64_t chunk_bytes) {
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    expect_ok(sph_ctx_opts_apply_env(&o)); /* policy_check.sh's SPH_CUDA_FUSED=0 ... reruns */
    o.device.type = SPH_DEVICE_CUDA;
    o.chunk_bytes = chunk_bytes;
    o.tune_cache = "/nonexistent/spanhead-test-tune.json";
    sph_ctx_t ctx = NULL;
    expect_ok(sph_ctx_create(&ctx, &o));
    return ctx;
}

/* The case on the GPU: device copies of every tensor (seq_id too), run, outputs back. */
static void gpu_run(sph_ctx_t g, pcase *c) {
    dcase d;
    dcase_make(g, c, &d);
    sph_tensor seq_dev;
    int64_t seq_shape[1] = {c->h.N};
    void *seq_ptr = NULL;
    if (c->p.seq_id) {
        expect_ok(sph_ctx_malloc(g, (size_t)c->h.N * 8 + 8, &seq_ptr));
        if (c->h.N) expect_ok(sph_ctx_memcpy(g, seq_ptr, c->seq, (size_t)c->h.N * 8));
        seq_dev = *c->p.seq_id;
        seq_dev.data = seq_ptr;
        seq_dev.device.type = SPH_DEVICE_CUDA;
        seq_dev.shape = seq_shape;
        d.p.seq_id = &seq_dev;
    }
    size_t bytes = 0;
    expect_ok(sph_policy_loss_workspace_size(g, &d.a, &d.p, &bytes));
    void *ws = NULL;
    expect_ok(sph_ctx_malloc(g, bytes ? bytes : 256, &ws));
    expect_ok(sph_ctx_memset(g, ws, 0xff, bytes ? bytes : 256)); /* poisoned scratch */
    sph_status st = sph_policy_loss(g, &d.a, &d.p, ws, bytes);
    if (st == SPH_OK) st = sph_ctx_synchronize(g);
    if (st != SPH_OK) fail_msg("policy (cuda): %s", sph_last_error());
    dcase_back(g, &d);
    sph_ctx_free(g, ws);
    sph_ctx_free(g, seq_ptr);
    dcase_free(g, &d);
}

// ---- one configuration ----------------------------------------------------------------------

typedef struct gcfg {
    int64_t N, H, V;
    sph_dtype dt;
    int mask;        /* 0 none, 1 random, 2 empty, 3 one active, 5 spans only, 6 mask + spans */
    int64_t chunk_bytes;
    int grads;       /* 0 loss only, 1 dh + dw, 3 accumulate */
    int opt_outputs; /* stats / logprob / entropy left to the workspace */
} gcfg;

/* Per-row temperatures in [0.25, 4] (temperature_rows) for the runs while set. */
static int g_trows;
/* The head's extras for the runs while set (issue 25): top-k with K = g_topk (0: none) and
 * sum_p2, checked against topk_check.h's float64 oracle on the loss's rows. */
static int64_t g_topk;
static int g_sp2;

static int run_cfg(const gcfg *f, sph_pg_loss loss, sph_kl_kind kl, sph_loss_agg agg) {
    pcase c;
    pc_init(&c, &g_rng, f->N, f->H, f->V, f->V, 0, f->dt);
    unsigned what = HC_LP | HC_ENT | PC_ISW;
    if (f->mask) {
        hc_mask(&c.h, &g_rng, 0.6);
        if (f->mask == 2 || f->mask == 3) memset(c.h.mask, 0, (size_t)f->N);
        if (f->mask == 3 && f->N) c.h.mask[f->N / 2] = 1, c.h.tgt[f->N / 2] = 1;
        what |= f->mask == 5 ? HC_SPANS : f->mask == 6 ? (HC_SPANS | HC_MASK) : HC_MASK;
    }
    if (f->grads) what |= HC_DH | HC_DW;
    pc_wire(&c, what, loss, kl, agg);
    if (f->grads == 3) c.h.a.accumulate_dhidden = c.h.a.accumulate_dweight = 1;
    const int64_t N = f->N, H = f->H, V = f->V;
    float *trows = NULL;
    int64_t sh_t[1] = {N};
    sph_tensor tt;
    if (g_trows) { /* the reference reads them from the host, the GPU from its copy */
        trows = hc_alloc((size_t)N * 4 + 4);
        for (int64_t i = 0; i < N; i++) trows[i] = (float)(0.25 * pow(16.0, rng_uniform(&g_rng)));
        tt = tensor1(trows, SPH_F32, sh_t, N);
        c.h.a.temperature_rows = &tt;
    }
    if (N > 0) {
        /* ratios and KL arguments away from every kink (the GPU's log-probs differ from the
         * reference's in the last bits) */
        double *lp = hc_alloc((size_t)N * 8);
        sph_ctx_t rc = hc_ctx("ref", 1, NULL);
        sph_policy_plan pp;
        expect_ok(sph_policy_plan_make(rc, &c.h.a, &c.p, &pp));
        expect_ok(sph_policy_ref_f64(&pp, NULL, lp, NULL, NULL, NULL));
        pc_place(&c, lp, loss == SPH_PG_GSPO);
        sph_ctx_destroy(rc);
        free(lp);
    }
    const int64_t TK = g_topk;
    int64_t *tki = hc_alloc((size_t)(N * TK + 1) * 8), sh_ti[2], sh_tl[2], sh_sp[1];
    float *tkl = hc_alloc((size_t)(N * TK + 1) * 4), *sp2 = hc_alloc((size_t)N * 4 + 4);
    sph_tensor tti = tensor2(tki, SPH_I64, sh_ti, N, TK), ttl = tensor2(tkl, SPH_F32, sh_tl, N, TK);
    sph_tensor tsp = tensor1(sp2, SPH_F32, sh_sp, N);
    if (TK) c.h.a.topk_ids = &tti, c.h.a.topk_logprobs = &ttl;
    if (g_sp2) c.h.a.sum_p2 = &tsp;
#define X_POISON()                                                                             \
    do {                                                                                       \
        for (int64_t q = 0; q < N * TK; q++) tki[q] = 0x5a5a5a5a5aLL;                          \
        poison_f32(tkl, (size_t)(N * TK)), poison_f32(sp2, (size_t)N);                         \
    } while (0)
    const size_t nh = (size_t)(N * H), nw = (size_t)(V * H);
    /* the reference on the host (float64; gradients from the same starting values) */
    float *dh0 = hc_alloc(nh * 4 + 4), *dw0 = hc_alloc(nw * 4 + 4);
    for (size_t k = 0; k < nh; k++) dh0[k] = f->grads == 3 ? (float)rng_normal(&g_rng) : 0.f;
    for (size_t k = 0; k < nw; k++) dw0[k] = f->grads == 3 ? (float)rng_normal(&g_rng) : 0.f;
    sph_ctx_t ref = hc_ctx("ref", 1, NULL);
    pc_poison(&c);
    if (f->grads == 3) memcpy(c.h.dh, dh0, nh * 4), memcpy(c.h.dw, dw0, nw * 4);
    expect_ok(pc_run(ref, &c));
    sph_ctx_destroy(ref);
    float *rlp = hc_alloc((size_t)N * 4 + 4), *rent = hc_alloc((size_t)N * 4 + 4);
    float *rdh = hc_alloc(nh * 4 + 4), *rdw = hc_alloc(nw * 4 + 4), rmet[SPH_POLICY_N_METRICS];
    memcpy(rlp, c.h.lp, (size_t)N * 4), memcpy(rent, c.h.ent, (size_t)N * 4);
    memcpy(rdh, c.h.dh, nh * 4), memcpy(rdw, c.h.dw, nw * 4);
    memcpy(rmet, c.metrics, sizeof rmet);
    /* the GPU, twice */
    sph_ctx_t g = gpu_ctx(f->chunk_bytes);
    if (f->opt_outputs) c.h.a.stats = NULL;
    float met1[SPH_POLICY_N_METRICS], *dh1 = hc_alloc(nh * 4 + 4);
    int ok = 1;
    for (int rep = 0; rep < 2; rep++) {
        pc_poison(&c);
        X_POISON();
        if (f->grads == 3) memcpy(c.h.dh, dh0, nh * 4), memcpy(c.h.dw, dw0, nw * 4);
        gpu_run(g, &c);
        if (rep == 0) {
            memcpy(met1, c.metrics, sizeof met1), memcpy(dh1, c.h.dh, nh * 4);
        } else {
            ok &= memcmp(met1, c.metrics, sizeof met1) == 0;
            ok &= !f->grads || memcmp(dh1, c.h.dh, nh * 4) == 0;
            if (!ok) print_error("not deterministic\n");
        }
    }
    sph_ctx_destroy(g);
    char cs[240];
    snprintf(cs, sizeof cs,
             "policy_cuda(N=%lld,H=%lld,V=%lld,dtype=%s,mask=%d,chunk=%lld,grads=%d,opt=%d,"
             "loss=%d,kl=%d,agg=%d,trows=%d,topk=%lld,sum_p2=%d)",
             (long long)N, (long long)H, (long long)V, sph_dtype_name(f->dt), f->mask,
             (long long)f->chunk_bytes, f->grads, f->opt_outputs, (int)loss, (int)kl, (int)agg,
             g_trows, (long long)g_topk, g_sp2);
    const int half = f->dt.bits == 16;
    /* tolerances.h: the per-row budgets, and the normwise half-gradient fallback (no A sums) */
    const double ftol = half ? TOL_CUDA_HALF_ROWS : TOL_CUDA_F32;
    const double gtol = half ? TOL_CUDA_HALF_GRAD_NORM(f->dt) : TOL_CUDA_F32;
    /* the metrics against the ones the GPU's own written rows imply (test_policy_case.h) */
    ok &= pc_metrics_implied("metrics", cs, &c, c.metrics, SPH_F32, c.h.lp, c.h.ent, ftol);
    for (int k = SPH_METRIC_TOKENS; k < SPH_POLICY_N_METRICS; k++) /* counts: exact */
        if (c.metrics[k] != rmet[k])
            ok = 0, print_error("%s: metric %d %g, ref %g\n", cs, k, c.metrics[k], rmet[k]);
    ok &= hc_close("logprob", cs, c.h.lp, SPH_F32, rlp, SPH_F32, N, ftol);
    ok &= hc_close("entropy", cs, c.h.ent, SPH_F32, rent, SPH_F32, N, ftol);
    if (f->grads) {
        ok &= hc_close("dhidden", cs, c.h.dh, SPH_F32, rdh, SPH_F32, (int64_t)nh, gtol);
        ok &= hc_close("dweight", cs, c.h.dw, SPH_F32, rdw, SPH_F32, (int64_t)nw, gtol);
    }
    if (TK || g_sp2) { /* the extras of the loss's rows (mask / spans, target >= 0) */
        uint8_t *act = hc_alloc((size_t)N + 1);
        hc_active(&c.h, act);
        for (int64_t i = 0; i < N; i++) act[i] = act[i] && c.h.tgt[i] >= 0;
        const double T = c.h.a.temperature, cap = c.h.a.softcap;
        if (TK) ok &= check_topk_rows(cs, tki, tkl, TK, &c.h, act, T, trows, cap, ftol, 1e-3);
        if (g_sp2) ok &= check_sum_p2_rows(cs, sp2, &c.h, act, T, trows, cap, ftol);
        free(act);
    }
#undef X_POISON
    free(tki), free(tkl), free(sp2);
    for (int64_t i = 0; i < N; i++)
        if (rlp[i] == 0.f && rent[i] == 0.f && (c.h.lp[i] != 0.f || c.h.ent[i] != 0.f)) {
            print_error("%s: row %lld inactive in the reference, not on the GPU\n", cs,
                        (long long)i);
            ok = 0;
        }
    free(dh0), free(dw0), free(rlp), free(rent), free(rdh), free(rdw), free(dh1), free(trows);
    pc_free(&c);
    return ok;
}

static void test_temperature_rows(void **state) {
    (void)state;
    const gcfg cases[] = {
        {700, 64, 1001, SPH_F32, 1, 0, 1, 0},   {700, 64, 1001, SPH_BF16, 1, 0, 1, 0},
        {700, 64, 1001, SPH_BF16, 6, 4 << 20, 1, 0}, {900, 64, 999, SPH_BF16, 5, 0, 3, 1},
    };
    int ok = 1;
    g_trows = 1;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int loss = 0; loss < 3; loss++)
            ok &= run_cfg(&cases[k], (sph_pg_loss)loss, (sph_kl_kind)((k + loss) % 4),
                          (sph_loss_agg)((k + 2 * loss) % 4));
    g_trows = 0;
    assert_true(ok);
}

/* The head's extras through the policy loss (issue 25): top-k and sum_p2 of the loss's rows
 * on the +extras paths (staged fp32 chunks by default, the recomputing sweep with a small
 * budget), every loss, masks and spans, f32 / bf16, K 1 / 64 / 256, with the loss itself
 * still against the reference. */
static void test_extras(void **state) {
    (void)state;
    const gcfg cases[] = {
        {700, 64, 1001, SPH_F32, 1, 0, 1, 0},      {700, 64, 1001, SPH_BF16, 1, 0, 1, 0},
        {700, 64, 1001, SPH_BF16, 6, 4 << 20, 1, 0}, {900, 64, 999, SPH_BF16, 5, 0, 3, 1},
        {300, 32, 257, SPH_F32, 3, 0, 0, 0},       {1, 16, 33, SPH_F32, 0, 0, 1, 0},
    };
    const int64_t Ks[3] = {64, 256, 1};
    int ok = 1;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int loss = 0; loss < 3; loss++) {
            g_topk = cases[k].V >= 256 ? Ks[(k + loss) % 3] : 7;
            g_sp2 = (k + loss) % 4 != 3;
            g_trows = k == 2 && loss == 1;
            ok &= run_cfg(&cases[k], (sph_pg_loss)loss, (sph_kl_kind)((k + loss) % 4),
                          (sph_loss_agg)((k + 2 * loss) % 4));
        }
    g_topk = 0, g_sp2 = 0, g_trows = 0;
    assert_true(ok);
}

static void test_every_combination(void **state) {
    (void)state;
    int ok = 1;
    for (int path = 0; path < 2; path++) {
        gcfg f = {700, 64, 1001, SPH_F32, 1, path ? (4 << 20) : 0, 1, 0};
        for (int loss = 0; loss < 3; loss++)
            for (int kl = 0; kl < 4; kl++)
                for (int agg = 0; agg < 4; agg++) {
                    f.dt = (loss + kl + agg + path) % 2 ? SPH_BF16 : SPH_F32;
                    ok &= run_cfg(&f, (sph_pg_loss)loss, (sph_kl_kind)kl, (sph_loss_agg)agg);
                }
    }
    assert_true(ok);
}

static void test_awkward(void **state) {
    (void)state;
    const gcfg cases[] = {
        {1, 16, 33, SPH_F32, 0, 0, 1, 0},          {1, 16, 33, SPH_BF16, 0, 0, 1, 1},
        {0, 16, 40, SPH_F32, 0, 0, 1, 0},          {300, 32, 257, SPH_F32, 2, 0, 1, 0},
        {300, 32, 257, SPH_BF16, 3, 0, 1, 0},      {900, 64, 999, SPH_BF16, 5, 0, 1, 0},
        {900, 64, 999, SPH_BF16, 5, 4 << 20, 1, 1}, {900, 64, 999, SPH_F32, 6, 4 << 20, 3, 0},
        {600, 48, 512, SPH_F16, 1, 0, 3, 1},       {600, 48, 512, SPH_F32, 1, 0, 0, 1},
        {2500, 128, 3000, SPH_BF16, 1, 0, 1, 0},   {2500, 128, 3000, SPH_BF16, 1, 8 << 20, 1, 0},
    };
    int ok = 1;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int loss = 0; loss < 3; loss++)
            ok &= run_cfg(&cases[k], (sph_pg_loss)loss, (sph_kl_kind)((k + loss) % 4),
                          (sph_loss_agg)((k * 3 + loss) % 4));
    assert_true(ok);
}

/* Bad per-row tensors on the device: host memory where device memory is expected. */
static void test_bad_device(void **state) {
    (void)state;
    pcase c;
    pc_init(&c, &g_rng, 20, 16, 40, 40, 0, SPH_F32);
    pc_wire(&c, HC_LP | HC_DH, SPH_PG_PPO, SPH_KL_NONE, SPH_AGG_TOKEN_MEAN);
    sph_ctx_t g = gpu_ctx(0);
    dcase d;
    dcase_make(g, &c, &d);
    d.p.seq_id = NULL; /* token-mean needs none (dcase_make leaves the host one) */
    d.p.advantages = &c.tadv; /* host tensor */
    size_t bytes = 0;
    expect_status(sph_policy_loss_workspace_size(g, &d.a, &d.p, &bytes), SPH_ERR_DEVICE,
                  "advantages: device");
    d.p.advantages = &d.dev[9];
    sph_tensor hostish = d.dev[10];
    hostish.data = c.old; /* claims cuda, points at host memory */
    d.p.old_logprob = &hostish;
    expect_ok(sph_policy_loss_workspace_size(g, &d.a, &d.p, &bytes));
    void *ws = NULL;
    expect_ok(sph_ctx_malloc(g, bytes, &ws));
    expect_status(sph_policy_loss(g, &d.a, &d.p, ws, bytes), SPH_ERR_DEVICE, "old_logprob");
    sph_ctx_free(g, ws);
    dcase_free(g, &d);
    sph_ctx_destroy(g);
    pc_free(&c);
}

/* A NaN advantage of an active row in device memory: SPH_OK, a NaN loss, and the row counted
 * for sph_ctx_nonfinite (the library's non-finite policy on CUDA). */
static void test_nonfinite_device(void **state) {
    (void)state;
    pcase c;
    pc_init(&c, &g_rng, 40, 16, 50, 50, 0, SPH_F32);
    for (int64_t i = 0; i < 40; i++) c.h.tgt[i] = i % 50;
    c.adv[7] = NAN, c.adv[3] = HUGE_VAL;
    pc_wire(&c, HC_LP | HC_ENT | HC_DH | HC_DW, SPH_PG_PPO, SPH_KL_NONE, SPH_AGG_TOKEN_MEAN);
    sph_ctx_t g = gpu_ctx(0);
    int64_t count = -1, first = -2;
    expect_ok(sph_ctx_nonfinite(g, &count, &first)); /* reset */
    pc_poison(&c);
    gpu_run(g, &c);
    expect_ok(sph_ctx_nonfinite(g, &count, &first));
    assert_int_equal(count, 2);
    assert_int_equal(first, 3);
    assert_true(isnan(c.metrics[SPH_METRIC_LOSS]));
    sph_ctx_destroy(g);
    pc_free(&c);
}

/* The tie rules on the GPU, ties built exactly (test_policy_case.h): the device's exp is not
 * the host's, so the ratio-1 ties of policy_tie_check_unit (old = the GPU's own float32
 * logprob, bitwise; clip range [1, 1]), on the staged path and on the recomputing one (a
 * chunk budget of 1 KiB). */
static void gpu_logp(sph_ctx_t g, pcase *c, double *lp) {
    pc_poison(c);
    gpu_run(g, c);
    for (int64_t i = 0; i < c->h.N; i++) lp[i] = (double)c->h.lp[i];
}

static void test_ties_built(void **state) {
    (void)state;
    for (int path = 0; path < 2; path++) {
        sph_ctx_t g = gpu_ctx(path ? 1024 : 0);
        for (int rep = 0; rep < 3; rep++)
            policy_tie_check_unit(&g_rng, g, path ? "cuda (recompute)" : "cuda", gpu_logp,
                                  gpu_run);
        sph_ctx_destroy(g);
    }
}

int main(void) {
    if (sph_cuda_device_count() == 0) {
        printf("no CUDA device: skipping\n");
        return 77;
    }
    rng_seed(&g_rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_combination),
        cmocka_unit_test(test_awkward),
        cmocka_unit_test(test_bad_device),
        cmocka_unit_test(test_nonfinite_device),
        cmocka_unit_test(test_ties_built),
        cmocka_unit_test(test_temperature_rows),
        cmocka_unit_test(test_extras),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
