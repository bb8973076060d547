/*
 * test_head_cuda_temp_rows.c - per-row temperature (issue 25 item 1) on CUDA against the
 * float64 reference (which takes the same per-row temperatures from host memory): every path
 * of the CUDA head that multiplies by 1 / T - cuBLAS + the staged statistics and dlogits
 * kernels (f32, NO_FUSED), the sm_90a fused epilogues (bf16), the one-pass forward staged E,
 * staged f32 and recompute, the vocabulary-outer gradient sweep, several chunks and splits,
 * batch-invariant mode, sample support, the staged reference - forward, one-pass and forward
 * then backward, with masks and softcap; T in [0.25, 4] mixed within one call. Then the
 * non-finite policy for device temperatures: a T_i <= 0 / NaN / inf on an active row gives
 * SPH_OK with that row counted by sph_ctx_nonfinite (forward and backward), an inactive row's
 * is never read. Skips (exit 77) without CUDA or without a device.
 */
#ifndef SPH_HAVE_CUDA
#include <stdio.h>
int main(void) {
    printf("test_head_cuda_temp_rows: spanhead was built without CUDA: skipping\n");
    return 77;
}
#else
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../parity/test_head_case.h"

static sph_rng g_rng;

#include "case_mirror.h"

static float *trows_new(int64_t N, double lo, double hi) {
    float *t = hc_alloc((size_t)N * 4 + 4);
    for (int64_t i = 0; i < N; i++) t[i] = (float)(lo * pow(hi / lo, rng_uniform(&g_rng)));
    if (N > 1) t[0] = (float)lo, t[1] = (float)hi;
    return t;
}

static sph_ctx_t cuda_ctx(const char *kernel, uint32_t flags, int64_t chunk_bytes, int bi) {
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.device = (sph_device){SPH_DEVICE_CUDA, 0};
    o.force_kernel = kernel;
    o.cuda_flags = flags;
    o.chunk_bytes = chunk_bytes;
    o.batch_invariant = bi;
    o.tune_cache = "/nonexistent/spanhead-test-tune.json";
    sph_ctx_t g = NULL;
    expect_ok(sph_ctx_create(&g, &o));
    return g;
}

static sph_status dev_run(sph_ctx_t g, sph_head_pass pass, const sph_head_args *a) {
    size_t bytes = 0;
    sph_status s = sph_head_workspace_size(g, pass, a, &bytes);
    if (s != SPH_OK) return s;
    void *ws = NULL;
    expect_ok(sph_ctx_malloc(g, bytes ? bytes : 1, &ws));
    expect_ok(sph_ctx_memset(g, ws, 0xff, bytes)); /* poisoned: reads before writes show */
    s = pass == SPH_HEAD_FORWARD ? sph_head_forward(g, a, ws, bytes)
                                 : sph_head_backward(g, a, ws, bytes);
    if (s == SPH_OK) s = sph_ctx_synchronize(g);
    sph_ctx_free(g, ws);
    return s;
}

typedef struct cfg {
    const char *name, *kernel;
    uint32_t flags;
    int64_t chunk_bytes;
    int bi;
    sph_dtype dt;
    int64_t N, H, V, K;
    int masked, one_pass;
    double cap;
} cfg;

/* One configuration: a GPU run (one-pass, or forward then backward from the GPU's stats)
 * against the reference of the same case with the same per-row temperatures. */
static int run_cfg(const cfg *f) {
    sph_ctx_t g = cuda_ctx(f->kernel, f->flags, f->chunk_bytes, f->bi);
    hcase c;
    hc_init(&c, &g_rng, f->N, f->H, f->V, f->V, 0, f->K, f->dt);
    if (f->masked) hc_mask_ragged(&c, &g_rng, 0.6);
    const unsigned m = f->masked ? HC_MASK : 0;
    float *T = trows_new(f->N, 0.25, 4.0);
    int64_t sht[1];
    sph_tensor th = tensor1(T, SPH_F32, sht, f->N); /* host: the reference's */
    void *dT = NULL;
    expect_ok(sph_ctx_malloc(g, (size_t)f->N * 4, &dT));
    expect_ok(sph_ctx_memcpy(g, dT, T, (size_t)f->N * 4));
    sph_tensor td = th;
    td.data = dT;
    td.device = (sph_device){SPH_DEVICE_CUDA, 0};
    /* the expectation (no dlogit_mean with a softcap: the staged-E path declines that pair,
     * and the softcap configurations are there to exercise it) */
    hc_wire(&c, HC_OUTS | HC_UPS | HC_DH | HC_DW | m);
    c.a.temperature_rows = &th, c.a.softcap = f->cap;
    if (f->cap > 0) c.a.dlogit_mean = NULL;
    sph_ctx_t ref = hc_ctx("ref", 1, NULL);
    hexp x;
    hc_expect(ref, &c.a, &x);
    sph_ctx_destroy(ref);
    /* the GPU run */
    hc_poison(&c);
    hc_wire(&c, HC_OUTS | m | (f->one_pass ? HC_UPS | HC_DH | HC_DW : 0));
    mirror mm;
    mirror_make(g, &c, &mm);
    c.a.temperature_rows = &td, c.a.softcap = f->cap;
    if (f->cap > 0) c.a.dlogit_mean = NULL;
    sph_head_pass_info info = SPH_HEAD_PASS_INFO_INIT;
    sph_status s = sph_head_describe(g, SPH_HEAD_FORWARD, &c.a, &info);
    if (s == SPH_OK) /* the path taken, for the log: the flags force it where the device can */
        printf("  %-34s forward path %-10s chunks %lld splits %lld\n", f->name, info.path,
               (long long)info.n_chunks, (long long)info.n_splits);
    if (s == SPH_OK) s = dev_run(g, SPH_HEAD_FORWARD, &c.a);
    mirror_back(g, &mm);
    if (s == SPH_OK && !f->one_pass) {
        hc_wire(&c, HC_UPS | HC_DH | HC_DW | m);
        mirror_make(g, &c, &mm);
        c.a.temperature_rows = &td, c.a.softcap = f->cap;
        if (f->cap > 0) c.a.dlogit_mean = NULL;
        s = dev_run(g, SPH_HEAD_BACKWARD, &c.a);
        mirror_back(g, &mm);
    }
    int64_t nf = -1, first = -1;
    expect_ok(sph_ctx_nonfinite(g, &nf, &first));
    int ok = 1;
    if (s != SPH_OK || nf != 0) {
        fprintf(stderr, "FAIL %s: %s '%s', %lld non-finite rows\n", f->name, sph_status_str(s),
                sph_last_error(), (long long)nf);
        ok = 0;
    } else {
        const double tol = f->dt.bits == 16 ? TOL_CUDA_HALF_ROWS : TOL_CUDA_F32;
        const float *got[4] = {c.lp, c.ent, c.lse, c.lm};
        const char *names[4] = {"logprob", "entropy", "lse", "logit_mean"};
        for (int k = 0; k < (f->K ? 3 : 4); k++)
            ok &= hc_close_col(names[k], f->name, got[k], 1, x.rows, 7, k, f->N, tol);
        for (int k = 0; k < 3; k++)
            ok &= hc_close_col("stats", f->name, c.stats + k, 3, x.rows, 7, 4 + k, f->N, tol);
        const double gt = f->dt.bits == 16 ? TOL_CUDA_HALF_GRAD_NORM(f->dt) : 1e-4;
        ok &= hc_close("dhidden", f->name, c.dh, SPH_F32, x.dh, SPH_F64, f->N * f->H, gt);
        ok &= hc_close("dweight", f->name, c.dw, SPH_F32, x.dw, SPH_F64, f->V * f->H, gt);
    }
    sph_ctx_free(g, dT);
    free(T);
    hc_expect_free(&x);
    hc_free(&c);
    sph_ctx_destroy(g);
    return ok;
}

static void test_paths(void **state) {
    (void)state;
    const sph_dtype F = SPH_F32, B = SPH_BF16;
    const uint32_t NOF = SPH_CUDA_FLAG_NO_FUSED;
    const cfg cfgs[] = {
        /* name, kernel, flags, chunk_bytes, bi, dt, N, H, V, K, masked, one_pass, cap */
        {"cublas f32 fwd+bwd", NULL, NOF, 0, 0, F, 67, 64, 1000, 0, 1, 0, 0.0},
        {"cublas f32 one-pass softcap", NULL, NOF, 0, 0, F, 67, 64, 1000, 0, 0, 1, 3.0},
        {"cublas f32 splits+chunks", NULL, NOF, 64 << 10, 0, F, 91, 64, 3001, 0, 1, 0, 0.0},
        {"fused bf16 fwd+bwd", NULL, 0, 0, 0, B, 130, 128, 2048, 0, 1, 0, 0.0},
        {"fused bf16 fwd+bwd softcap", NULL, 0, 0, 0, B, 130, 128, 2048, 0, 0, 0, 5.0},
        {"fused bf16 splits+chunks", NULL, 0, 256 << 10, 0, B, 200, 128, 4100, 0, 1, 0, 0.0},
        {"one-pass staged E", NULL, SPH_CUDA_FLAG_ONEPASS_E, 0, 0, B, 130, 128, 2048, 0, 1, 1,
         0.0},
        {"one-pass staged E softcap", NULL, SPH_CUDA_FLAG_ONEPASS_E, 0, 0, B, 130, 128, 2048, 0,
         0, 1, 4.0},
        {"one-pass staged f32", NULL, SPH_CUDA_FLAG_ONEPASS_F32, 0, 0, B, 130, 128, 2048, 0, 1,
         1, 0.0},
        {"one-pass recompute", NULL, SPH_CUDA_FLAG_ONEPASS_RECOMPUTE, 0, 0, B, 130, 128, 2048, 0,
         1, 1, 0.0},
        {"row-outer only", NULL, SPH_CUDA_FLAG_NO_COLOUTER, 128 << 10, 0, B, 150, 128, 3000, 0,
         1, 0, 0.0},
        {"batch-invariant bf16", NULL, 0, 0, 1, B, 130, 128, 2048, 0, 1, 0, 0.0},
        {"no sm90", NULL, SPH_CUDA_FLAG_NO_SM90, 0, 0, B, 130, 128, 2048, 0, 1, 1, 0.0},
        {"sample support fwd+bwd", NULL, 0, 0, 0, B, 77, 64, 900, 9, 1, 0, 0.0},
        {"sample support one-pass softcap", NULL, 0, 0, 0, F, 77, 64, 900, 9, 0, 1, 2.0},
        {"staged reference", "ref", 0, 0, 0, F, 23, 16, 101, 0, 1, 1, 0.0},
    };
    int ok = 1;
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) ok &= run_cfg(&cfgs[k]);
    assert_true(ok);
}

/* A bad device T_i: SPH_OK, the row counted, never silent; inactive rows' never read. */
static void test_bad_device_temperature(void **state) {
    (void)state;
    const float bad[4] = {0.0f, -2.0f, NAN, INFINITY};
    const uint32_t flags[2] = {0, SPH_CUDA_FLAG_NO_FUSED};
    for (int fl = 0; fl < 2; fl++)
        for (int K = 0; K <= 5; K += 5)
            for (int b = 0; b < 4; b++) {
                sph_ctx_t g = cuda_ctx(NULL, flags[fl], 0, 0);
                const int64_t N = 40, H = 64, V = 700;
                hcase c;
                hc_init(&c, &g_rng, N, H, V, V, 0, K, SPH_BF16);
                hc_mask(&c, &g_rng, 1.0);
                c.mask[9] = 0; /* inactive: its bad value is never read */
                float *T = trows_new(N, 0.5, 2.0);
                T[9] = bad[b];
                T[17] = bad[b]; /* active */
                int64_t sht[1];
                void *dT = NULL;
                expect_ok(sph_ctx_malloc(g, (size_t)N * 4, &dT));
                expect_ok(sph_ctx_memcpy(g, dT, T, (size_t)N * 4));
                sph_tensor td = tensor1(dT, SPH_F32, sht, N);
                td.device = (sph_device){SPH_DEVICE_CUDA, 0};
                for (int pass = 0; pass < 2; pass++) {
                    mirror mm;
                    hc_poison(&c);
                    hc_wire(&c, pass ? HC_UPS | HC_DH | HC_DW | HC_MASK : HC_OUTS | HC_MASK);
                    if (pass) /* finite stats from a host-side forward of the good rows */
                        for (int64_t i = 0; i < N; i++)
                            c.stats[3 * i] = 0, c.stats[3 * i + 1] = 5, c.stats[3 * i + 2] = 1;
                    mirror_make(g, &c, &mm);
                    c.a.temperature_rows = &td;
                    expect_ok(dev_run(g, pass ? SPH_HEAD_BACKWARD : SPH_HEAD_FORWARD, &c.a));
                    mirror_back(g, &mm);
                    int64_t nf = -1, first = -1;
                    expect_ok(sph_ctx_nonfinite(g, &nf, &first));
                    if (nf != 1 || first != 17) {
                        fprintf(stderr, "FAIL bad T %g (%s, K=%d, flags %u): %lld rows counted, "
                                        "first %lld; expected row 17 alone\n",
                                bad[b], pass ? "backward" : "forward", K, flags[fl],
                                (long long)nf, (long long)first);
                        fail();
                    }
                    if (!pass) assert_true(isnan(c.lse[17]) && !isnan(c.lse[16]));
                    else assert_true(isnan(((float *)c.dh)[17 * H]));
                }
                sph_ctx_free(g, dT);
                free(T);
                hc_free(&c);
                sph_ctx_destroy(g);
            }
}

/* A host pointer on a CUDA context is refused at validation. */
static void test_host_pointer(void **state) {
    (void)state;
    sph_ctx_t g = cuda_ctx(NULL, 0, 0, 0);
    hcase c;
    hc_init(&c, &g_rng, 9, 16, 50, 50, 0, 0, SPH_F32);
    hc_wire(&c, HC_OUTS);
    mirror mm;
    mirror_make(g, &c, &mm);
    float T[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    int64_t sh[1];
    sph_tensor t = tensor1(T, SPH_F32, sh, 9);
    t.device = (sph_device){SPH_DEVICE_CUDA, 0}; /* claims the device, is host memory */
    c.a.temperature_rows = &t;
    size_t bytes = 0;
    expect_status(sph_head_workspace_size(g, SPH_HEAD_FORWARD, &c.a, &bytes), SPH_ERR_DEVICE,
                  "temperature_rows");
    mirror_back(g, &mm);
    hc_free(&c);
    sph_ctx_destroy(g);
}

int main(void) {
    if (sph_cuda_device_count() == 0) {
        printf("test_head_cuda_temp_rows: no CUDA device: skipping\n");
        return 77;
    }
    rng_seed(&g_rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paths),
        cmocka_unit_test(test_bad_device_temperature),
        cmocka_unit_test(test_host_pointer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
