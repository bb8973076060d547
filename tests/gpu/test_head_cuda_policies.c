/*
 * test_head_cuda_policies.c - the policies of spanhead.h on a CUDA context (issue 18):
 *   non-finite rows: the pass returns SPH_OK (no host sync inside it), the rows' outputs are
 *   not finite, the finalize kernel counts them on the device, and sph_ctx_nonfinite (the one
 *   call that synchronizes) reports the count and the first row once, then resets; masked
 *   rows are never counted; full vocabulary, one-pass and sample support, and under CUDA
 *   graph capture; the same rows through force_kernel "ref" (staged) are SPH_ERR_NONFINITE.
 *   aliasing and strides: refused before any launch (dhidden == hidden, a 2^62 row stride).
 *   context validity: a garbage context is refused.
 * Skips (exit 77) without CUDA or without a device.
 */
#ifndef SPH_HAVE_CUDA
#include <stdio.h>
int main(void) {
    printf("test_head_cuda_policies: spanhead was built without CUDA: skipping\n");
    return 77;
}
#else
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../parity/test_head_case.h"

static sph_rng g_rng;

#include "case_mirror.h"

static sph_ctx_t gpu_ctx(const char *kernel, void *stream) {
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    expect_ok(sph_ctx_opts_apply_env(&o));
    o.device = (sph_device){SPH_DEVICE_CUDA, 0};
    o.force_kernel = kernel;
    o.stream = stream;
    o.tune_cache = "/nonexistent/spanhead-test-tune.json";
    sph_ctx_t g = NULL;
    expect_ok(sph_ctx_create(&g, &o));
    return g;
}

static sph_status run_dev(sph_ctx_t g, sph_head_pass pass, const sph_head_args *a) {
    size_t bytes = 0;
    sph_status s = sph_head_workspace_size(g, pass, a, &bytes);
    if (s != SPH_OK) return s;
    void *ws = NULL;
    if (bytes) expect_ok(sph_ctx_malloc(g, bytes, &ws));
    s = pass == SPH_HEAD_FORWARD ? sph_head_forward(g, a, ws, bytes)
                                 : sph_head_backward(g, a, ws, bytes);
    expect_ok(sph_ctx_synchronize(g));
    sph_ctx_free(g, ws);
    return s;
}

/* Rows 3 and 8 of hidden hold NaN / inf; row 8 is masked out when masked. */
static void nonfinite_case(sph_ctx_t g, int64_t K, int one_pass, int masked, sph_dtype dt) {
    hcase c;
    hc_init(&c, &g_rng, 17, 24, 300, 300, 0, K, dt);
    hc_set(c.h, dt, 3 * 24 + 5, NAN);
    hc_set(c.h, dt, 8 * 24 + 1, INFINITY);
    if (masked) {
        c.mask = hc_alloc(17);
        for (int i = 0; i < 17; i++) c.mask[i] = i != 8;
    }
    hc_wire(&c, HC_LP | HC_ENT | HC_LSE | HC_G | (masked ? HC_MASK : 0) |
                    (one_pass ? HC_DH | HC_DW : 0));
    hc_poison(&c);
    mirror m;
    mirror_make(g, &c, &m);
    expect_ok(run_dev(g, SPH_HEAD_FORWARD, &c.a)); /* no sync inside the pass: SPH_OK */
    mirror_back(g, &m);
    assert_false(isfinite(c.lse[3]));
    assert_true(isfinite(c.lse[0]) && isfinite(c.lse[16]));
    int64_t n = -1, first = -1;
    expect_ok(sph_ctx_nonfinite(g, &n, &first));
    assert_int_equal(n, masked ? 1 : 2);
    assert_int_equal(first, 3);
    expect_ok(sph_ctx_nonfinite(g, &n, &first));
    assert_int_equal(n, 0);
    assert_int_equal(first, -1);
    hc_free(&c);
}

static void test_nonfinite_device_flag(void **state) {
    (void)state;
    sph_ctx_t g = gpu_ctx(NULL, NULL);
    const sph_dtype dts[2] = {SPH_BF16, SPH_F32};
    for (int d = 0; d < 2; d++)
        for (int K = 0; K <= 5; K += 5)
            for (int op = 0; op < 2; op++)
                for (int masked = 0; masked < 2; masked++) nonfinite_case(g, K, op, masked, dts[d]);
    sph_ctx_destroy(g);
}

/* The counter is written by a kernel: a captured graph counts at every replay. */
static void test_nonfinite_graph(void **state) {
    (void)state;
    cudaStream_t st;
    assert_int_equal(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    sph_ctx_t g = gpu_ctx(NULL, st);
    hcase c;
    hc_init(&c, &g_rng, 9, 16, 100, 100, 0, 0, SPH_BF16);
    hc_set(c.h, SPH_BF16, 4 * 16, NAN);
    hc_wire(&c, HC_LP | HC_LSE);
    mirror m;
    mirror_make(g, &c, &m);
    size_t bytes = 0;
    expect_ok(sph_head_workspace_size(g, SPH_HEAD_FORWARD, &c.a, &bytes));
    void *ws = NULL;
    expect_ok(sph_ctx_malloc(g, bytes, &ws));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    assert_int_equal(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    expect_ok(sph_head_forward(g, &c.a, ws, bytes));
    assert_int_equal(cudaStreamEndCapture(st, &graph), cudaSuccess);
    assert_int_equal(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int k = 0; k < 3; k++) assert_int_equal(cudaGraphLaunch(exec, st), cudaSuccess);
    int64_t n = 0, first = -1;
    expect_ok(sph_ctx_nonfinite(g, &n, &first));
    assert_int_equal(n, 3);
    assert_int_equal(first, 4);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    sph_ctx_free(g, ws);
    mirror_back(g, &m);
    sph_ctx_destroy(g);
    cudaStreamDestroy(st);
    hc_free(&c);
}

/* force_kernel "ref" on CUDA: the staged reference refuses synchronously, like the CPU. */
static void test_nonfinite_staged(void **state) {
    (void)state;
    sph_ctx_t g = gpu_ctx("ref", NULL);
    hcase c;
    hc_init(&c, &g_rng, 7, 8, 30, 30, 0, 0, SPH_F32);
    hc_set(c.h, SPH_F32, 2 * 8, NAN);
    hc_wire(&c, HC_LP);
    hc_poison(&c);
    mirror m;
    mirror_make(g, &c, &m);
    expect_status(run_dev(g, SPH_HEAD_FORWARD, &c.a), SPH_ERR_NONFINITE, "first row 2");
    mirror_back(g, &m);
    assert_true(isnan(c.lp[0])); /* still the poison: nothing copied back */
    int64_t n = 0, first = -1;
    expect_ok(sph_ctx_nonfinite(g, &n, &first));
    assert_int_equal(n, 1);
    assert_int_equal(first, 2);
    sph_ctx_destroy(g);
    hc_free(&c);
}

static void test_aliasing_strides_ctx(void **state) {
    (void)state;
    sph_ctx_t g = gpu_ctx(NULL, NULL);
    hcase c;
    hc_init(&c, &g_rng, 8, 16, 64, 64, 0, 0, SPH_F32);
    hc_wire(&c, HC_LP | HC_G | HC_DH);
    mirror m;
    mirror_make(g, &c, &m);
    sph_tensor dh = c.th; /* dhidden == hidden, on the device */
    sph_head_args a = c.a;
    a.dhidden = &dh;
    /* a workspace large enough for the call (the validator checks the workspace before the
     * overlap of the regions, the workspace being one of them) */
    const size_t wsb = (size_t)64 << 20;
    void *ws = NULL;
    expect_ok(sph_ctx_malloc(g, wsb, &ws));
    expect_status(sph_head_forward(g, &a, ws, wsb), SPH_ERR_INVALID_ARG, "overlap hidden's");
    sph_ctx_free(g, ws);
    int64_t st[2] = {(int64_t)1 << 62, 1};
    dh = c.tdh;
    dh.strides = st;
    expect_status(sph_head_forward(g, &a, NULL, 0), SPH_ERR_OVERFLOW, "dhidden: stride[0]");
    char junk[512];
    memset(junk, 0x33, sizeof junk);
    expect_status(sph_head_forward((sph_ctx_t)(void *)junk, &c.a, NULL, 0), SPH_ERR_INVALID_ARG,
                  "not a live context");
    mirror_back(g, &m);
    sph_ctx_destroy(g);
    hc_free(&c);
}

int main(void) {
    if (sph_cuda_device_count() == 0) {
        printf("test_head_cuda_policies: no CUDA device: skipping\n");
        return 77;
    }
    rng_seed(&g_rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nonfinite_device_flag),
        cmocka_unit_test(test_nonfinite_graph),
        cmocka_unit_test(test_nonfinite_staged),
        cmocka_unit_test(test_aliasing_strides_ctx),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
