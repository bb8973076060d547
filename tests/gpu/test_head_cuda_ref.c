/*
 * test_head_cuda_ref.c - force_kernel "ref" on a CUDA context means the float64 reference:
 * the staged path (src/head/head_ref_stage.c) copies the device tensors to the host, runs the
 * reference and copies the outputs back, so its results are bitwise those of a CPU "ref"
 * context on the same inputs; bad device-resident targets are refused before any output is
 * written; the context's description says what runs (test_backend.c covers the refusal of a
 * TP group on a CPU-only machine).
 * Skips (exit 77) without CUDA or without a device.
 */
#ifndef SPH_HAVE_CUDA
#include <stdio.h>
int main(void) {
    printf("test_head_cuda_ref: spanhead was built without CUDA: skipping\n");
    return 77;
}
#else
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../parity/test_head_case.h"

static sph_rng g_rng;

#include "case_mirror.h"

static sph_ctx_t gpu_ref_ctx(sph_comm_t comm) {
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.device = (sph_device){SPH_DEVICE_CUDA, 0};
    o.force_kernel = "ref";
    o.tp_comm = comm;
    sph_ctx_t g = NULL;
    expect_ok(sph_ctx_create(&g, &o));
    return g;
}

static void test_staged_equals_cpu_reference(void **state) {
    (void)state;
    const unsigned all = HC_LP | HC_ENT | HC_LSE | HC_LM | HC_G | HC_E | HC_GL | HC_GM |
                         HC_DH | HC_DW | HC_MASK;
    sph_ctx_t g = gpu_ref_ctx(NULL);
    assert_non_null(strstr(sph_ctx_describe(g), "float64 reference"));
    sph_ctx_t r = hc_ctx("ref", 1, NULL);
    for (int K = 0; K <= 5; K += 5) {
        hcase c;
        hc_init(&c, &g_rng, 61, 40, 77, 77, 0, K, SPH_BF16);
        hc_mask(&c, &g_rng, 0.5);
        const size_t N = (size_t)c.N, nh = N * (size_t)c.H, nw = (size_t)(c.V_loc * c.H);
        float *want = hc_alloc(N * 4 * 4 + nh * 4 + nw * 4);
        hc_wire(&c, all);
        hc_poison(&c);
        expect_ok(hc_run(r, SPH_HEAD_FORWARD, &c.a)); /* one-pass: gradients too */
        memcpy(want, c.lp, N * 4), memcpy(want + N, c.ent, N * 4);
        memcpy(want + 2 * N, c.lse, N * 4), memcpy(want + 3 * N, c.lm, N * 4);
        memcpy(want + 4 * N, c.dh, nh * 4), memcpy(want + 4 * N + nh, c.dw, nw * 4);
        hc_poison(&c);
        mirror m;
        mirror_make(g, &c, &m);
        expect_ok(hc_run(g, SPH_HEAD_FORWARD, &c.a));
        mirror_back(g, &m);
        assert_memory_equal(c.lp, want, N * 4);
        assert_memory_equal(c.ent, want + N, N * 4);
        assert_memory_equal(c.lse, want + 2 * N, N * 4);
        assert_memory_equal(c.lm, want + 3 * N, N * 4);
        assert_memory_equal(c.dh, want + 4 * N, nh * 4);
        assert_memory_equal(c.dw, want + 4 * N + nh, nw * 4);
        /* a target >= V in device memory: refused on the host copy, outputs untouched */
        c.tgt[2] = c.V;
        hc_poison(&c);
        mirror_make(g, &c, &m);
        expect_status(hc_run(g, SPH_HEAD_FORWARD, &c.a), SPH_ERR_INVALID_ARG, "targets[2]");
        mirror_back(g, &m);
        for (size_t i = 0; i < N; i++) assert_true(isnan(c.lp[i]));
        free(want);
        hc_free(&c);
    }
    sph_ctx_destroy(r);
    sph_ctx_destroy(g);
}

int main(void) {
    if (sph_cuda_device_count() == 0) {
        printf("test_head_cuda_ref: no CUDA device: skipping\n");
        return 77;
    }
    rng_seed(&g_rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_staged_equals_cpu_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
