/*
 * test_head_cpu.c - the optimized CPU head (every ISA variant this CPU runs) against the
 * float64 reference on fresh random inputs over the awkward grid: N = 1, odd N and V_loc,
 * V_loc = 1, H not a multiple of 64, ragged masks, one active row, all inactive, active rows
 * at chunk and tile edges, f32/bf16/f16, gradients in the input dtype or f32, temperature and
 * softcap, each output and upstream gradient alone and together, ignored targets, shards with
 * vocab_start > 0, accumulate, one-pass vs two-pass, sample support, TP through the
 * in-process communicator, dense vs masked, determinism. Outputs poisoned before every run.
 */
#include "test_head_case.h"

typedef struct pcase {
    int64_t N, H, V_loc, V, v0, K;
    sph_dtype dt;
    int half_grads;   /* gradients in the input dtype (else f32) */
    int mask;         /* 0 none, 1 ragged mask, 2 spans only, 3 one active, 4 none active,
                         5 chunk edges */
    unsigned outs;    /* HC_LP | HC_ENT | HC_LSE | HC_LM */
    unsigned ups;     /* HC_G | HC_E | HC_GL | HC_GM */
    double temp, cap;
    int acc, one_pass;
    int64_t chunk_rows;
} pcase;

static const char *KERNELS[] = {"generic", "avx2", "avx512"};

static void case_str(const pcase *c, const char *k, char *s, size_t n) {
    snprintf(s, n,
             "head_cpu(kernel=%s,N=%lld,H=%lld,V_loc=%lld,V=%lld,v0=%lld,K=%lld,dtype=%s,"
             "grads=%s,mask=%d,outs=%u,ups=%u,T=%g,cap=%g,acc=%d,one_pass=%d,chunk=%lld)",
             k, (long long)c->N, (long long)c->H, (long long)c->V_loc, (long long)c->V,
             (long long)c->v0, (long long)c->K, sph_dtype_name(c->dt),
             c->half_grads ? sph_dtype_name(c->dt) : "f32", c->mask, c->outs, c->ups, c->temp,
             c->cap, c->acc, c->one_pass, (long long)c->chunk_rows);
}

static void set_mask(hcase *h, sph_rng *r, int kind, int64_t chunk) {
    if (kind == 0) return;
    hc_mask(h, r, 0.45);
    if (kind == 3 || kind == 4 || kind == 5) {
        memset(h->mask, 0, (size_t)h->N);
        if (kind == 3) h->mask[rng_range(r, 0, h->N - 1)] = 1;
        if (kind == 5) /* the first and last active row of every chunk of active rows */
            for (int64_t i = 0; i < h->N; i++)
                h->mask[i] = (i % 3 == 0) || (i % (chunk + 1) == chunk);
        int64_t n = 0;
        for (int64_t i = 0; i < h->N;) {
            if (!h->mask[i]) {
                i++;
                continue;
            }
            int64_t s = i;
            while (i < h->N && h->mask[i]) i++;
            h->spans[2 * n] = s, h->spans[2 * n + 1] = i, n++;
        }
        h->n_spans = n;
    }
}

/* Runs forward (+ backward or one-pass) with one kernel into h's buffers. */
static void run_one(const pcase *c, hcase *h, const char *kernel, int threads,
                    const void *dh0, const void *dw0) {
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.force_kernel = kernel;
    o.num_threads = threads;
    o.chunk_rows = c->chunk_rows;
    sph_ctx_t ctx = NULL;
    expect_ok(sph_ctx_create(&ctx, &o));
    unsigned m = c->mask == 2 ? HC_SPANS : (c->mask ? HC_MASK | HC_SPANS : 0);
    hc_poison(h);
    size_t gbytes = sph_dtype_size(h->gdt);
    memcpy(h->dh, dh0, (size_t)(h->N * h->H) * gbytes);
    memcpy(h->dw, dw0, (size_t)(h->V_loc * h->H) * gbytes);
    if (!c->acc) { /* overwrite mode must not read them: poison */
        poison_bytes(h->dh, (size_t)(h->N * h->H) * gbytes);
        poison_bytes(h->dw, (size_t)(h->V_loc * h->H) * gbytes);
    }
    unsigned wire = c->outs | m;
    if (c->one_pass) wire |= c->ups | HC_DH | HC_DW;
    hc_wire(h, wire);
    h->a.temperature = c->temp, h->a.softcap = c->cap;
    h->a.accumulate_dhidden = h->a.accumulate_dweight = c->acc;
    expect_ok(hc_run(ctx, SPH_HEAD_FORWARD, &h->a));
    if (!c->one_pass) {
        hc_wire(h, c->ups | HC_DH | HC_DW | m);
        h->a.temperature = c->temp, h->a.softcap = c->cap;
        h->a.accumulate_dhidden = h->a.accumulate_dweight = c->acc;
        expect_ok(hc_run(ctx, SPH_HEAD_BACKWARD, &h->a));
    }
    sph_ctx_destroy(ctx);
}

typedef struct snap {
    float *lp, *ent, *lse, *lm, *stats;
    void *dh, *dw;
} snap;

static void snap_take(const hcase *h, snap *s) {
    size_t N = (size_t)h->N, g = sph_dtype_size(h->gdt);
    s->lp = hc_alloc(N * 4), s->ent = hc_alloc(N * 4), s->lse = hc_alloc(N * 4);
    s->lm = hc_alloc(N * 4), s->stats = hc_alloc(N * 12);
    s->dh = hc_alloc(N * (size_t)h->H * g), s->dw = hc_alloc((size_t)(h->V_loc * h->H) * g);
    memcpy(s->lp, h->lp, N * 4), memcpy(s->ent, h->ent, N * 4), memcpy(s->lse, h->lse, N * 4);
    memcpy(s->lm, h->lm, N * 4), memcpy(s->stats, h->stats, N * 12);
    memcpy(s->dh, h->dh, N * (size_t)h->H * g);
    memcpy(s->dw, h->dw, (size_t)(h->V_loc * h->H) * g);
}

static void snap_free(snap *s) {
    free(s->lp), free(s->ent), free(s->lse), free(s->lm), free(s->stats), free(s->dh),
        free(s->dw);
}

static int same_bits(const snap *a, const snap *b, const hcase *h) {
    size_t N = (size_t)h->N, g = sph_dtype_size(h->gdt);
    return !memcmp(a->lp, b->lp, N * 4) && !memcmp(a->ent, b->ent, N * 4) &&
           !memcmp(a->lse, b->lse, N * 4) && !memcmp(a->lm, b->lm, N * 4) &&
           !memcmp(a->stats, b->stats, N * 12) && !memcmp(a->dh, b->dh, N * (size_t)h->H * g) &&
           !memcmp(a->dw, b->dw, (size_t)(h->V_loc * h->H) * g);
}

static int n_checked;

/* One case: reference, then every available kernel compared with it. */
static void check_case(sph_rng *r, const pcase *c) {
    hcase h;
    hc_init(&h, r, c->N, c->H, c->V_loc, c->V, c->v0, c->K, c->dt);
    if (c->v0 > 0 || c->V > c->V_loc) /* sharded without a comm: targets in the shard */
        for (int64_t i = 0; i < c->N; i++)
            if (h.tgt[i] >= 0 && !c->K) h.tgt[i] = c->v0 + rng_range(r, 0, c->V_loc - 1);
    h.gdt = c->half_grads ? c->dt : SPH_F32;
    set_mask(&h, r, c->mask, c->chunk_rows ? c->chunk_rows : 512);
    size_t g = sph_dtype_size(h.gdt);
    void *dh0 = hc_alloc((size_t)(c->N * c->H) * g), *dw0 = hc_alloc((size_t)(c->V_loc * c->H) * g);
    for (int64_t k = 0; k < c->N * c->H; k++) hc_set(dh0, h.gdt, k, rng_normal(r));
    for (int64_t k = 0; k < c->V_loc * c->H; k++) hc_set(dw0, h.gdt, k, rng_normal(r));
    run_one(c, &h, "ref", 1, dh0, dw0);
    snap ref;
    snap_take(&h, &ref);
    const double tol = 2e-5;
    const double gtol = !c->half_grads || c->dt.bits == 32
                            ? tol
                            : (c->dt.code == SPH_DTYPE_BFLOAT ? 1.6e-2 : 2e-3);
    for (size_t k = 0; k < sizeof KERNELS / sizeof KERNELS[0]; k++) {
        sph_ctx_opts o = SPH_CTX_OPTS_INIT;
        o.force_kernel = KERNELS[k];
        sph_ctx_t probe = NULL;
        if (sph_ctx_create(&probe, &o) != SPH_OK) continue; /* ISA not on this CPU */
        sph_ctx_destroy(probe);
        char cs[400];
        case_str(c, KERNELS[k], cs, sizeof cs);
        run_one(c, &h, KERNELS[k], 2, dh0, dw0);
        int ok = 1;
        const int64_t N = c->N;
        if (c->outs & HC_LP) ok &= hc_close("logprob", cs, h.lp, SPH_F32, ref.lp, SPH_F32, N, tol);
        if (c->outs & HC_ENT)
            ok &= hc_close("entropy", cs, h.ent, SPH_F32, ref.ent, SPH_F32, N, tol);
        if (c->outs & HC_LSE) ok &= hc_close("lse", cs, h.lse, SPH_F32, ref.lse, SPH_F32, N, tol);
        if ((c->outs & HC_LM) && !c->K)
            ok &= hc_close("logit_mean", cs, h.lm, SPH_F32, ref.lm, SPH_F32, N, tol);
        ok &= hc_close("stats", cs, h.stats, SPH_F32, ref.stats, SPH_F32, 3 * N, tol);
        ok &= hc_close("dhidden", cs, h.dh, h.gdt, ref.dh, h.gdt, N * c->H, gtol);
        ok &= hc_close("dweight", cs, h.dw, h.gdt, ref.dw, h.gdt, c->V_loc * c->H, gtol);
        /* inactive rows: exact zeros (or untouched when accumulating) */
        if (h.mask || c->mask == 2) {
            uint8_t *act = hc_alloc((size_t)N);
            memset(act, 0, (size_t)N);
            for (int64_t s = 0; s < h.n_spans; s++)
                for (int64_t i = h.spans[2 * s]; i < h.spans[2 * s + 1]; i++) act[i] = 1;
            if (c->mask != 2)
                for (int64_t i = 0; i < N; i++) act[i] = h.mask[i];
            for (int64_t i = 0; i < N; i++) {
                if (act[i]) continue;
                if (c->outs & HC_LP) ok &= h.lp[i] == 0.0f;
                if (c->outs & HC_ENT) ok &= h.ent[i] == 0.0f;
                for (int64_t x = 0; x < c->H; x++)
                    ok &= hc_get(h.dh, h.gdt, i * c->H + x) ==
                          (c->acc ? hc_get(dh0, h.gdt, i * c->H + x) : 0.0);
            }
            free(act);
            if (!ok) print_error("%s: inactive rows not exactly zero/untouched\n", cs);
        }
        if (!ok) fail_msg("case failed: %s (seed above)", cs);
        n_checked++;
    }
    snap_free(&ref);
    free(dh0), free(dw0);
    hc_free(&h);
}

static void test_grid(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    const int64_t shapes[][4] = {
        /* N, H, V_loc, chunk_rows */
        {1, 5, 1, 0},     {1, 64, 300, 0},   {7, 33, 257, 0}, {37, 65, 513, 8},
        {130, 31, 1000, 16}, {64, 96, 256, 32}, {19, 17, 1, 4}, {50, 128, 777, 0},
    };
    const sph_dtype dts[3] = {SPH_F32, SPH_BF16, SPH_F16};
    const unsigned outs_all = HC_LP | HC_ENT | HC_LSE | HC_LM;
    const unsigned ups_all = HC_G | HC_E | HC_GL | HC_GM;
    int idx = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        for (int variant = 0; variant < 6; variant++, idx++) {
            pcase c = {0};
            c.N = shapes[s][0], c.H = shapes[s][1], c.V_loc = shapes[s][2];
            c.chunk_rows = shapes[s][3];
            c.V = c.V_loc, c.v0 = 0;
            c.dt = dts[idx % 3];
            c.half_grads = (idx / 3) % 2;
            c.mask = idx % 6;
            c.temp = variant % 2 ? 0.7 : 1.0;
            c.cap = variant % 3 == 2 ? 3.0 : 0.0;
            c.acc = variant % 4 == 1;
            c.one_pass = variant % 2 == 0;
            /* outputs and upstream gradients alone (cycling) and all together */
            unsigned single[4] = {HC_LP, HC_ENT, HC_LSE, HC_LM};
            unsigned usingle[4] = {HC_G, HC_E, HC_GL, HC_GM};
            c.outs = variant < 4 ? single[(variant + s) % 4] : outs_all;
            c.ups = variant < 4 ? usingle[(variant + s + 1) % 4] : ups_all;
            if (variant == 5) { /* a shard of a larger vocabulary, no comm: local stats */
                c.v0 = 3 + (int64_t)s;
                c.V = c.V_loc + c.v0 + 11;
            }
            check_case(&r, &c);
        }
    }
}

static void test_support(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 1);
    const int64_t shapes[][3] = {{1, 7, 50}, {23, 40, 301}, {64, 65, 129}};
    int idx = 0;
    for (size_t s = 0; s < 3; s++)
        for (int v = 0; v < 4; v++, idx++) {
            pcase c = {0};
            c.N = shapes[s][0], c.H = shapes[s][1], c.V_loc = shapes[s][2], c.V = c.V_loc;
            c.K = v % 2 ? 5 : 17;
            c.dt = idx % 3 == 0 ? SPH_F32 : (idx % 3 == 1 ? SPH_BF16 : SPH_F16);
            c.half_grads = v == 3;
            c.mask = v;
            c.outs = HC_LP | HC_ENT | HC_LSE;
            c.ups = v == 1 ? HC_G : HC_G | HC_E | HC_GL;
            c.temp = v == 2 ? 1.3 : 1.0;
            c.cap = v == 3 ? 2.0 : 0.0;
            c.acc = v == 2;
            c.one_pass = v % 2;
            check_case(&r, &c);
        }
}

static void test_tp(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 2);
    tp_check(&r, "generic", 2, 0, SPH_F32);
    tp_check(&r, "generic", 3, 0, SPH_BF16);
    tp_check(&r, NULL, 4, 0, SPH_F32);
    tp_check(&r, NULL, 2, 6, SPH_F16);
}

/* Dense run with g = e = gl = gm = 0 on inactive rows equals the masked run's gradients. */
static void test_dense_vs_masked(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 3);
    hcase h;
    const int64_t N = 45, H = 70, V = 600;
    hc_init(&h, &r, N, H, V, V, 0, 0, SPH_F32);
    hc_mask(&h, &r, 0.3);
    sph_ctx_t ctx = hc_ctx(NULL, 2, NULL);
    hc_wire(&h, HC_LP | HC_ENT | HC_MASK);
    hc_poison(&h);
    expect_ok(hc_run(ctx, SPH_HEAD_FORWARD, &h.a));
    hc_wire(&h, HC_G | HC_E | HC_DH | HC_DW | HC_MASK);
    expect_ok(hc_run(ctx, SPH_HEAD_BACKWARD, &h.a));
    snap masked;
    snap_take(&h, &masked);
    /* spans only (no mask) */
    hc_wire(&h, HC_LP | HC_ENT | HC_SPANS);
    hc_poison(&h);
    expect_ok(hc_run(ctx, SPH_HEAD_FORWARD, &h.a));
    hc_wire(&h, HC_G | HC_E | HC_DH | HC_DW | HC_SPANS);
    expect_ok(hc_run(ctx, SPH_HEAD_BACKWARD, &h.a));
    assert_true(hc_close("dhidden spans vs mask", "dense_vs_masked", h.dh, SPH_F32, masked.dh,
                         SPH_F32, N * H, 1e-5));
    assert_true(hc_close("dweight spans vs mask", "dense_vs_masked", h.dw, SPH_F32, masked.dw,
                         SPH_F32, V * H, 1e-5));
    /* dense */
    for (int64_t i = 0; i < N; i++)
        if (!h.mask[i]) h.g[i] = h.e[i] = 0;
    hc_wire(&h, HC_LP | HC_ENT);
    hc_poison(&h);
    expect_ok(hc_run(ctx, SPH_HEAD_FORWARD, &h.a));
    for (int64_t i = 0; i < N; i++)
        if (h.mask[i]) {
            assert_true(fabsf(h.lp[i] - masked.lp[i]) <= 1e-5f * (1 + fabsf(h.lp[i])));
            assert_true(fabsf(h.ent[i] - masked.ent[i]) <= 1e-5f * (1 + fabsf(h.ent[i])));
        }
    hc_wire(&h, HC_G | HC_E | HC_DH | HC_DW);
    expect_ok(hc_run(ctx, SPH_HEAD_BACKWARD, &h.a));
    assert_true(hc_close("dhidden dense vs masked", "dense_vs_masked", h.dh, SPH_F32, masked.dh,
                         SPH_F32, N * H, 1e-5));
    assert_true(hc_close("dweight dense vs masked", "dense_vs_masked", h.dw, SPH_F32, masked.dw,
                         SPH_F32, V * H, 1e-5));
    snap_free(&masked);
    sph_ctx_destroy(ctx);
    hc_free(&h);
}

/* Same inputs, same thread count: bitwise-identical outputs (two- and one-pass, support). */
static void test_determinism(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 4);
    for (int v = 0; v < 3; v++) {
        pcase c = {0};
        c.N = 300, c.H = 72, c.V_loc = 700, c.V = 700, c.K = v == 2 ? 9 : 0;
        c.dt = v == 1 ? SPH_BF16 : SPH_F32;
        c.mask = 1, c.outs = HC_LP | HC_ENT | HC_LSE | HC_LM, c.ups = HC_G | HC_E | HC_GL;
        c.temp = 1, c.one_pass = v == 1, c.chunk_rows = 64;
        hcase h;
        hc_init(&h, &r, c.N, c.H, c.V_loc, c.V, 0, c.K, c.dt);
        set_mask(&h, &r, 1, 64);
        void *z = hc_alloc((size_t)(c.N * c.H) * 4), *zw = hc_alloc((size_t)(c.V_loc * c.H) * 4);
        run_one(&c, &h, NULL, 2, z, zw);
        snap a, b;
        snap_take(&h, &a);
        run_one(&c, &h, NULL, 2, z, zw);
        snap_take(&h, &b);
        assert_true(same_bits(&a, &b, &h));
        snap_free(&a), snap_free(&b), free(z), free(zw);
        hc_free(&h);
    }
}

static void test_empty(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 5);
    hcase h;
    hc_init(&h, &r, 0, 8, 10, 10, 0, 0, SPH_F32);
    sph_ctx_t ctx = hc_ctx(NULL, 2, NULL);
    hc_wire(&h, HC_LP | HC_ENT | HC_G | HC_DH | HC_DW);
    expect_ok(hc_run(ctx, SPH_HEAD_FORWARD, &h.a));
    for (int64_t k = 0; k < 10 * 8; k++) assert_true(((float *)h.dw)[k] == 0.0f);
    sph_ctx_destroy(ctx);
    hc_free(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grid),         cmocka_unit_test(test_support),
        cmocka_unit_test(test_tp),           cmocka_unit_test(test_dense_vs_masked),
        cmocka_unit_test(test_determinism),  cmocka_unit_test(test_empty),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fprintf(stderr, "head_cpu: %d kernel x case comparisons\n", n_checked);
    return rc;
}
