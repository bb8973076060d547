/*
 * test_bi_dhidden.c - batch-invariant mode on the GPU (issue 18, item 14): a row's logprob,
 * entropy AND dhidden are bitwise identical whatever the other rows, N, the mask or the row's
 * position. The same 256 probe rows are placed among 0, 131, 4000 and 9000 other rows at
 * other positions (other rows random, 70 % of them active), in the general path (forward, then
 * backward) and in one-pass mode, for bf16, f16 and f32 inputs and for dhidden in the input
 * dtype and in f32; V = 20000 spans two fixed vocabulary splits. One batch is also checked
 * against the float64 reference (force_kernel "ref" on the host) under tolerances.h's budgets
 * (entropy also against the independent -sum p log p). Public API only; exits 77 with a
 * message without a GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../parity/test_head_case.h" /* tolerances.h budgets, the independent backward */

#define PROBES 256

static sph_rng g_rng;

typedef struct batch {
    int64_t N, at;          /* rows, first probe row */
    void *h;                /* host (N, H) input dtype */
    int64_t *tgt;
    uint8_t *mask;
    float *g, *e;           /* upstream gradients */
    float *lp, *ent, *dh32; /* host results: logprob, entropy, dhidden widened to f32 */
} batch;

static size_t esize(sph_dtype dt) { return dt.bits / 8; }

static uint16_t round16(sph_dtype dt, float v) {
    return dt.code == SPH_DTYPE_BFLOAT ? sph_f32_to_bf16(v) : sph_f32_to_f16(v);
}
static float widen(sph_dtype dt, const void *base, int64_t k) {
    if (dt.bits == 32) return ((const float *)base)[k];
    uint16_t v = ((const uint16_t *)base)[k];
    return dt.code == SPH_DTYPE_BFLOAT ? sph_bf16_to_f32(v) : sph_f16_to_f32(v);
}
static void put(sph_dtype dt, void *base, int64_t k, float v) {
    if (dt.bits == 32) ((float *)base)[k] = v;
    else ((uint16_t *)base)[k] = round16(dt, v);
}

/* The probe rows (hp, tp, gp, ep) at rows [at, at + PROBES) of a batch of N rows. */
static void batch_make(batch *b, sph_dtype dt, int64_t N, int64_t at, int64_t H, int64_t V,
                       const void *hp, const int64_t *tp, const float *gp, const float *ep) {
    memset(b, 0, sizeof *b);
    b->N = N;
    b->at = at;
    b->h = malloc((size_t)(N * H) * esize(dt));
    b->tgt = malloc((size_t)N * 8);
    b->mask = malloc((size_t)N);
    b->g = malloc((size_t)N * 4);
    b->e = malloc((size_t)N * 4);
    b->lp = malloc((size_t)N * 4);
    b->ent = malloc((size_t)N * 4);
    b->dh32 = malloc((size_t)(N * H) * 4);
    assert_non_null(b->h), assert_non_null(b->tgt), assert_non_null(b->mask);
    assert_non_null(b->g), assert_non_null(b->e), assert_non_null(b->lp);
    assert_non_null(b->ent), assert_non_null(b->dh32);
    for (int64_t i = 0; i < N; i++) {
        const int probe = i >= at && i < at + PROBES;
        for (int64_t k = 0; k < H; k++)
            put(dt, b->h, i * H + k, probe ? widen(dt, hp, (i - at) * H + k)
                                           : (float)rng_normal(&g_rng));
        b->tgt[i] = probe ? tp[i - at] : rng_range(&g_rng, 0, V - 1);
        b->mask[i] = probe ? 1 : rng_uniform(&g_rng) < 0.7;
        b->g[i] = probe ? gp[i - at] : (float)rng_normal(&g_rng);
        b->e[i] = probe ? ep[i - at] : (float)rng_normal(&g_rng);
    }
}

static void batch_free(batch *b) {
    free(b->h), free(b->tgt), free(b->mask), free(b->g), free(b->e);
    free(b->lp), free(b->ent), free(b->dh32);
}

static void *dev_copy(sph_ctx_t ctx, const void *src, size_t bytes) {
    void *p = NULL;
    expect_ok(sph_ctx_malloc(ctx, bytes ? bytes : 1, &p));
    if (bytes) expect_ok(sph_ctx_memcpy(ctx, p, src, bytes));
    return p;
}

/* Runs the batch on ctx (CUDA or the host reference), one-pass or forward + backward, with
 * dhidden in dh_dt; fills b->lp, b->ent, b->dh32. */
static void batch_run(sph_ctx_t ctx, int cuda, batch *b, sph_dtype dt, sph_dtype dh_dt,
                      const void *w, int64_t H, int64_t V, int one_pass) {
    const int64_t N = b->N;
    int64_t hs[2] = {N, H}, wsh[2] = {V, H}, ns[1] = {N}, ss[2] = {N, 3};
    const size_t hb = (size_t)(N * H) * esize(dt), wb = (size_t)(V * H) * esize(dt);
    const size_t dhb = (size_t)(N * H) * esize(dh_dt);
    sph_device dev = {cuda ? SPH_DEVICE_CUDA : SPH_DEVICE_CPU, 0};
    void *dh = cuda ? dev_copy(ctx, b->h, hb) : b->h;
    void *dw = cuda ? dev_copy(ctx, w, wb) : (void *)w;
    void *dt_ = cuda ? dev_copy(ctx, b->tgt, (size_t)N * 8) : b->tgt;
    void *dm = cuda ? dev_copy(ctx, b->mask, (size_t)N) : b->mask;
    void *dg = cuda ? dev_copy(ctx, b->g, (size_t)N * 4) : b->g;
    void *de = cuda ? dev_copy(ctx, b->e, (size_t)N * 4) : b->e;
    void *dlp = NULL, *dent = NULL, *dst = NULL, *ddh = NULL;
    expect_ok(sph_ctx_malloc(ctx, (size_t)N * 4 + 4, &dlp));
    expect_ok(sph_ctx_malloc(ctx, (size_t)N * 4 + 4, &dent));
    expect_ok(sph_ctx_malloc(ctx, (size_t)N * 12 + 4, &dst));
    expect_ok(sph_ctx_malloc(ctx, dhb + 4, &ddh));
    expect_ok(sph_ctx_memset(ctx, ddh, 0xff, dhb)); /* poison: NaN in every dtype */
    expect_ok(sph_ctx_memset(ctx, dlp, 0xff, (size_t)N * 4));
    expect_ok(sph_ctx_memset(ctx, dent, 0xff, (size_t)N * 4));
    sph_tensor th = {dh, dev, 2, dt, hs, NULL, 0}, tw = {dw, dev, 2, dt, wsh, NULL, 0};
    sph_tensor tt = {dt_, dev, 1, SPH_I64, ns, NULL, 0}, tm = {dm, dev, 1, SPH_U8, ns, NULL, 0};
    sph_tensor tg = {dg, dev, 1, SPH_F32, ns, NULL, 0}, te = {de, dev, 1, SPH_F32, ns, NULL, 0};
    sph_tensor tlp = {dlp, dev, 1, SPH_F32, ns, NULL, 0};
    sph_tensor tent = {dent, dev, 1, SPH_F32, ns, NULL, 0};
    sph_tensor tst = {dst, dev, 2, SPH_F32, ss, NULL, 0};
    sph_tensor tdh = {ddh, dev, 2, dh_dt, hs, NULL, 0};
    sph_head_args a = SPH_HEAD_ARGS_INIT;
    a.hidden = &th, a.weight = &tw, a.targets = &tt, a.active_mask = &tm;
    a.logprob = &tlp, a.entropy = &tent, a.stats = &tst;
    a.dlogprob = &tg, a.dentropy = &te;
    a.temperature = 0.8;
    if (one_pass) a.dhidden = &tdh;
    size_t bytes = 0;
    expect_ok(sph_head_workspace_size(ctx, SPH_HEAD_FORWARD, &a, &bytes));
    void *ws = NULL;
    expect_ok(sph_ctx_malloc(ctx, bytes ? bytes : 1, &ws));
    expect_ok(sph_head_forward(ctx, &a, ws, bytes));
    sph_ctx_free(ctx, ws);
    if (!one_pass) {
        a.dhidden = &tdh;
        expect_ok(sph_head_workspace_size(ctx, SPH_HEAD_BACKWARD, &a, &bytes));
        expect_ok(sph_ctx_malloc(ctx, bytes ? bytes : 1, &ws));
        expect_ok(sph_head_backward(ctx, &a, ws, bytes));
        sph_ctx_free(ctx, ws);
    }
    expect_ok(sph_ctx_synchronize(ctx));
    void *dhh = malloc(dhb + 4);
    assert_non_null(dhh);
    expect_ok(sph_ctx_memcpy(ctx, b->lp, dlp, (size_t)N * 4));
    expect_ok(sph_ctx_memcpy(ctx, b->ent, dent, (size_t)N * 4));
    expect_ok(sph_ctx_memcpy(ctx, dhh, ddh, dhb));
    for (int64_t k = 0; k < N * H; k++) b->dh32[k] = widen(dh_dt, dhh, k);
    free(dhh);
    if (cuda) {
        sph_ctx_free(ctx, dh), sph_ctx_free(ctx, dw), sph_ctx_free(ctx, dt_);
        sph_ctx_free(ctx, dm), sph_ctx_free(ctx, dg), sph_ctx_free(ctx, de);
    }
    sph_ctx_free(ctx, dlp), sph_ctx_free(ctx, dent), sph_ctx_free(ctx, dst);
    sph_ctx_free(ctx, ddh);
}

/* Probe rows of b and ref bitwise equal (logprob, entropy, dhidden). */
static int same_probes(const char *cs, const batch *b, const batch *ref, int64_t H) {
    for (int64_t k = 0; k < PROBES; k++) {
        const int64_t i = b->at + k, j = ref->at + k;
        if (memcmp(&b->lp[i], &ref->lp[j], 4) || memcmp(&b->ent[i], &ref->ent[j], 4)) {
            print_error("%s: probe %lld: logprob/entropy %.9g/%.9g vs %.9g/%.9g\n", cs,
                        (long long)k, b->lp[i], b->ent[i], ref->lp[j], ref->ent[j]);
            return 0;
        }
        if (memcmp(&b->dh32[i * H], &ref->dh32[j * H], (size_t)H * 4)) {
            int64_t c = 0;
            while (c < H && !memcmp(&b->dh32[i * H + c], &ref->dh32[j * H + c], 4)) c++;
            print_error("%s: probe %lld: dhidden[%lld] %.9g vs %.9g (rows %lld / %lld of %lld "
                        "/ %lld)\n", cs, (long long)k, (long long)c, b->dh32[i * H + c],
                        ref->dh32[j * H + c], (long long)i, (long long)j, (long long)b->N,
                        (long long)ref->N);
            return 0;
        }
    }
    return 1;
}

static void invariance_case(sph_ctx_t gpu, sph_ctx_t ref, sph_dtype dt, sph_dtype dh_dt,
                            int64_t H, int one_pass) {
    const int64_t V = 20000;
    char cs[160];
    snprintf(cs, sizeof cs, "bi_dhidden(H=%lld,V=%lld,dtype=%s,dhidden=%s,%s,seed=%llu)",
             (long long)H, (long long)V, sph_dtype_name(dt), sph_dtype_name(dh_dt),
             one_pass ? "one-pass" : "general", (unsigned long long)test_seed());
    void *w = malloc((size_t)(V * H) * esize(dt)), *hp = malloc((size_t)(PROBES * H) * esize(dt));
    int64_t *tp = malloc(PROBES * 8);
    float gp[PROBES], ep[PROBES];
    assert_non_null(w), assert_non_null(hp), assert_non_null(tp);
    const float ws = (float)(2.0 / sqrt((double)H));
    for (int64_t k = 0; k < V * H; k++) put(dt, w, k, ws * (float)rng_normal(&g_rng));
    for (int64_t k = 0; k < PROBES * H; k++) put(dt, hp, k, (float)rng_normal(&g_rng));
    for (int k = 0; k < PROBES; k++) {
        tp[k] = rng_range(&g_rng, 0, V - 1);
        gp[k] = (float)rng_normal(&g_rng);
        ep[k] = (float)rng_normal(&g_rng);
    }
    static const int64_t others[4] = {0, 131, 4000, 9000};
    batch b0;
    int ok = 1;
    for (int c = 0; c < 4 && ok; c++) {
        const int64_t N = others[c] + PROBES, at = c == 0 ? 0 : rng_range(&g_rng, 1, others[c]);
        batch b;
        batch_make(&b, dt, N, at, H, V, hp, tp, gp, ep);
        batch_run(gpu, 1, &b, dt, dh_dt, w, H, V, one_pass);
        if (c == 0) {
            /* the float64 reference on the same rounded inputs */
            batch r;
            batch_make(&r, dt, N, at, H, V, hp, tp, gp, ep);
            batch_run(ref, 0, &r, dt, SPH_F32, w, H, V, one_pass);
            /* tolerances.h: per-row outputs normwise (TOL_CUDA_F32, TOL_CUDA_HALF_ROWS), and
             * dhidden under the gradient budget, the dlogits' rounding to the input dtype
             * times A = sum_j |du_ij| |w_jk| from the independent float64 backward */
            const double tol = dt.bits == 32 ? TOL_CUDA_F32 : TOL_CUDA_HALF_ROWS;
            const double uD = dt.bits != 16 ? 0 : dt.code == SPH_DTYPE_BFLOAT ? TOL_U_BF16
                                                                              : TOL_U_F16;
            const double etaD = dt.bits == 16 && dt.code == SPH_DTYPE_FLOAT ? TOL_ETA_F16 : 0;
            hcase hv; /* a view of the probe batch (all rows active) for the independent math */
            memset(&hv, 0, sizeof hv);
            hv.N = N, hv.H = H, hv.V_loc = V, hv.V = V, hv.dt = dt, hv.gdt = dh_dt;
            hv.h = r.h, hv.w = w, hv.tgt = r.tgt, hv.g = r.g, hv.e = r.e;
            uint8_t *act = hc_alloc((size_t)N);
            memset(act, 1, (size_t)N);
            double *ind = hc_alloc((size_t)N * HC_IND * 8), *A = hc_alloc((size_t)(N * H) * 8);
            double *Z = hc_alloc((size_t)(N * H) * 8), *rd = hc_alloc((size_t)(N * H) * 8);
            hc_indep_forward(&hv, 0.8, 0.0, act, ind);
            hc_indep_backward(&hv, 0.8, 0.0, act, ind, HC_G | HC_E, NULL, NULL, A, NULL, Z, NULL);
            void *got = hc_alloc((size_t)(N * H) * esize(dh_dt));
            for (int64_t k = 0; k < N * H; k++) {
                rd[k] = r.dh32[k];
                put(dh_dt, got, k, b.dh32[k]); /* exact: b.dh32 holds dh_dt values */
            }
            ok = hc_close("logprob", cs, b.lp, SPH_F32, r.lp, SPH_F32, N, tol);
            ok &= hc_close("entropy", cs, b.ent, SPH_F32, r.ent, SPH_F32, N, tol);
            ok &= hc_close_col("entropy -sum p log p", cs, b.ent, 1, ind, HC_IND, 1, N, tol);
            ok &= hc_check_grad("dhidden", cs, got, dh_dt, rd, rd, A, Z, N * H, TOL_CUDA_F32, uD,
                                etaD, TOL_ACC_CUDA, TOL_CUDA_MARGIN);
            free(act), free(ind), free(A), free(Z), free(rd), free(got);
            batch_free(&r);
            b0 = b;
            continue;
        }
        ok = same_probes(cs, &b, &b0, H);
        batch_free(&b);
    }
    batch_free(&b0);
    free(w), free(hp), free(tp);
    if (!ok) fail();
}

static void test_bi_dhidden(void **state) {
    (void)state;
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    expect_ok(sph_ctx_opts_apply_env(&o)); /* the device scripts' SPH_CUDA_* reruns */
    o.device.type = SPH_DEVICE_CUDA;
    o.batch_invariant = 1;
    sph_ctx_t gpu = NULL, ref = NULL;
    expect_ok(sph_ctx_create(&gpu, &o));
    sph_ctx_opts r = SPH_CTX_OPTS_INIT;
    r.force_kernel = "ref";
    expect_ok(sph_ctx_create(&ref, &r));
    const sph_dtype dts[3] = {SPH_BF16, SPH_F16, SPH_F32};
    for (int d = 0; d < 3; d++)
        for (int op = 0; op < 2; op++) {
            invariance_case(gpu, ref, dts[d], dts[d], 200, op); /* H % 8 != 0: unaligned */
            if (dts[d].bits == 16) invariance_case(gpu, ref, dts[d], SPH_F32, 256, op);
        }
    sph_ctx_destroy(gpu);
    sph_ctx_destroy(ref);
}

int main(void) {
    if (sph_cuda_device_count() == 0) {
        fprintf(stderr, "test_bi_dhidden: SKIP: no CUDA device\n");
        return 77;
    }
    rng_seed(&g_rng, test_seed());
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_bi_dhidden)};
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    tol_report("bi_dhidden");
    return test_exit(failed);
}
