/* test_core.c - status strings, error messages, tensor view validation, half conversions,
 * the dense GEMM rates' argument errors. */
#include <string.h>

#include "core/internal.h"
#include "testutil.h"

static void test_status_strings(void **state) {
    (void)state;
    for (int s = 0; s <= SPH_ERR_INTERNAL; s++) {
        const char *str = sph_status_str((sph_status)s);
        assert_non_null(str);
        assert_true(strlen(str) > 0);
        assert_string_not_equal(str, "unknown status");
    }
    assert_string_equal(sph_status_str((sph_status)999), "unknown status");
}

static void test_error_message(void **state) {
    (void)state;
    sph_status s = sph_err(SPH_ERR_SHAPE, "hidden: shape[1] is %d, expected %d", 7, 8);
    assert_int_equal(s, SPH_ERR_SHAPE);
    assert_string_equal(sph_last_error(), "hidden: shape[1] is 7, expected 8");
}

static void test_view_validation(void **state) {
    (void)state;
    float buf[12];
    int64_t shape[2] = {3, 4}, strides[2] = {4, 1};
    sph_tensor t = {buf, {SPH_DEVICE_CPU, 0}, 2, SPH_F32, shape, NULL, 0};
    sph_view v;
    expect_ok(sph_view_of(&t, "x", 2, &v));
    assert_int_equal(v.stride[0], 4);
    assert_int_equal(v.stride[1], 1);
    t.strides = strides;
    expect_ok(sph_view_of(&t, "x", 2, &v));
    expect_status(sph_view_of(&t, "x", 1, &v), SPH_ERR_SHAPE, "x: ndim is 2, expected 1");
    strides[1] = 2;
    expect_status(sph_view_of(&t, "x", 2, &v), SPH_ERR_SHAPE, "inner stride");
    strides[1] = 1;
    strides[0] = 3;
    expect_status(sph_view_of(&t, "x", 2, &v), SPH_ERR_SHAPE, "must not overlap");
    /* empty tensors: any strides (NumPy exports zeros) and a NULL data pointer are fine */
    int64_t eshape[2] = {0, 4}, estrides[2] = {0, 0};
    sph_tensor e = {NULL, {SPH_DEVICE_CPU, 0}, 2, SPH_F32, eshape, estrides, 0};
    expect_ok(sph_view_of(&e, "e", 2, &v));
    assert_int_equal(v.stride[0], 4);
    assert_int_equal(v.stride[1], 1);
    t.strides = NULL;
    t.data = NULL;
    expect_status(sph_view_of(&t, "x", 2, &v), SPH_ERR_INVALID_ARG, "x: data pointer is NULL");
    shape[0] = -1;
    t.data = buf;
    expect_status(sph_view_of(&t, "x", 2, &v), SPH_ERR_SHAPE, "shape[0] is -1");
    expect_status(sph_view_of(NULL, "y", 2, &v), SPH_ERR_INVALID_ARG, "y: tensor pointer");
}

static void test_half_roundtrip(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    for (int i = 0; i < 10000; i++) {
        float f = (float)(rng_normal(&r) * 100.0);
        float b = sph_bf16_to_f32(sph_f32_to_bf16(f));
        assert_true(fabsf(b - f) <= fabsf(f) * (1.0f / 256));
        float h = sph_f16_to_f32(sph_f32_to_f16(f));
        assert_true(fabsf(h - f) <= fabsf(f) * (1.0f / 2048) + 6e-8f);
    }
    /* every half value survives the round trip exactly */
    for (uint32_t u = 0; u < 65536; u++) {
        uint16_t h = (uint16_t)u;
        float f = sph_f16_to_f32(h);
        if (isnan(f)) continue;
        assert_int_equal(sph_f32_to_f16(f), h);
        assert_int_equal(sph_f32_to_bf16(sph_bf16_to_f32(h)), h);
    }
}

static void test_ctx_cpu(void **state) {
    (void)state;
    sph_ctx_t ctx = NULL;
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    expect_ok(sph_ctx_create(&ctx, &o));
    assert_non_null(strstr(sph_ctx_describe(ctx), "cpu"));
    sph_ctx_destroy(ctx);
    o.force_kernel = "nonsense";
    expect_status(sph_ctx_create(&ctx, &o), SPH_ERR_INVALID_ARG, "force_kernel");
    assert_null(ctx);
    o.force_kernel = NULL;
    o.num_threads = -2;
    expect_status(sph_ctx_create(&ctx, &o), SPH_ERR_INVALID_ARG, "num_threads is -2");
    o.num_threads = 0;
    o.device.type = SPH_DEVICE_CUDA;
    sph_status s = sph_ctx_create(&ctx, &o);
    if (sph_cuda_device_count() == 0) {
        assert_true(s == SPH_ERR_NO_DEVICE || s == SPH_ERR_UNSUPPORTED);
    } else {
        assert_int_equal(s, SPH_OK);
        sph_ctx_destroy(ctx);
    }
    sph_ctx_destroy(NULL);
}

/* The dense GEMM rates' argument errors, reachable without a GPU: in a CUDA build the arguments
 * are checked before the context, so a CPU context shows each message; a build without CUDA
 * answers every call with SPH_ERR_UNSUPPORTED. */
static void test_gemm_rate_args(void **state) {
    (void)state;
    sph_ctx_t cpu = NULL;
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    expect_ok(sph_ctx_create(&cpu, &o));
    double tf = -1;
#ifdef SPH_HAVE_CUDA
    expect_status(sph_tune_gemm_rate_sustained(NULL, SPH_BF16, 64, 64, 64, 4, 1, &tf),
                  SPH_ERR_INVALID_ARG, "gemm_rate_sustained: ctx or tflops is NULL");
    expect_status(sph_tune_gemm_rate_sustained(cpu, SPH_BF16, 64, 64, 64, 4, 1, NULL),
                  SPH_ERR_INVALID_ARG, "ctx or tflops is NULL");
    expect_status(sph_tune_gemm_rate_sustained(cpu, SPH_BF16, 64, 64, 64, 0, 1, &tf),
                  SPH_ERR_INVALID_ARG, "gemm_rate_sustained: chain 0, expected in [1, 64]");
    expect_status(sph_tune_gemm_rate_sustained(cpu, SPH_BF16, 64, 64, 64, 65, 1, &tf),
                  SPH_ERR_INVALID_ARG, "chain 65, expected in [1, 64]");
    expect_status(sph_tune_gemm_rate_sustained(cpu, SPH_BF16, 64, 64, 64, -3, 1, &tf),
                  SPH_ERR_INVALID_ARG, "chain -3");
    expect_status(sph_tune_gemm_rate_sustained(cpu, SPH_I32, 64, 64, 64, 4, 1, &tf),
                  SPH_ERR_DTYPE, "dtype: ");
    expect_status(sph_tune_gemm_rate_sustained(cpu, SPH_BF16, 0, 64, 64, 4, 1, &tf),
                  SPH_ERR_INVALID_ARG, "gemm_rate_sustained: M 0, N 64, K 64");
    expect_status(sph_tune_gemm_rate_sustained(cpu, SPH_BF16, 64, (int64_t)1 << 31, 64, 4, 1,
                                               &tf),
                  SPH_ERR_INVALID_ARG, "N 2147483648");
    expect_status(sph_tune_gemm_rate_sustained(cpu, SPH_BF16, 64, 64, 64, 4, 1, &tf),
                  SPH_ERR_UNSUPPORTED, "gemm_rate_sustained: not a CUDA context");
    /* sph_tune_gemm_rate is the chain of one: the same checks under its own name */
    expect_status(sph_tune_gemm_rate(NULL, SPH_BF16, 64, 64, 64, 1, &tf), SPH_ERR_INVALID_ARG,
                  "gemm_rate: ctx or tflops is NULL");
    expect_status(sph_tune_gemm_rate(cpu, SPH_BF16, 64, -1, 64, 1, &tf), SPH_ERR_INVALID_ARG,
                  "gemm_rate: M 64, N -1, K 64");
    expect_status(sph_tune_gemm_rate(cpu, SPH_BF16, 64, 64, 64, 1, &tf), SPH_ERR_UNSUPPORTED,
                  "gemm_rate: not a CUDA context");
#else
    expect_status(sph_tune_gemm_rate_sustained(cpu, SPH_BF16, 64, 64, 64, 4, 1, &tf),
                  SPH_ERR_UNSUPPORTED, "no CUDA backend");
    assert_true(tf == 0);
    expect_status(sph_tune_gemm_rate(cpu, SPH_BF16, 64, 64, 64, 1, &tf), SPH_ERR_UNSUPPORTED,
                  "no CUDA backend");
#endif
    sph_ctx_destroy(cpu);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_strings), cmocka_unit_test(test_error_message),
        cmocka_unit_test(test_view_validation), cmocka_unit_test(test_half_roundtrip),
        cmocka_unit_test(test_ctx_cpu), cmocka_unit_test(test_gemm_rate_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
