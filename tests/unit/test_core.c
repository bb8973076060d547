/* test_core.c - status strings, error messages, tensor view validation, half conversions
 * (all 65536 patterns of bf16 and f16; float32 rounding against an independent round to nearest
 * even: ties, overflow, subnormals, infinities, NaNs),
 * the dense GEMM rates' argument errors. */
#include <stdio.h>
#include <stdlib.h>
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

// ---- half / bfloat conversions against an independent decoding and rounding ----------------

/* The value of a 16-bit pattern, decoded here from the format's definition (sign, 8 or 5
 * exponent bits, 7 or 10 mantissa bits, subnormals); NaN for NaN patterns. */
static double half_value(int bf, uint16_t u) {
    const int mb = bf ? 7 : 10, eb = bf ? 8 : 5, bias = bf ? 127 : 15;
    const int e = (u >> mb) & ((1 << eb) - 1), m = u & ((1 << mb) - 1);
    const double s = u & 0x8000 ? -1 : 1;
    if (e == (1 << eb) - 1) return m ? NAN : s * INFINITY;
    if (e == 0) return s * ldexp(m, 1 - bias - mb);
    return s * ldexp((1 << mb) + m, e - bias - mb);
}

/* Round to nearest even of x into the format, by search over the format's values: the two
 * neighbours of |x|, the nearer one, on a tie the one with an even pattern. Past the largest
 * finite value the next step (the infinity pattern, worth 2^16 or 2^128, even) takes part in
 * the comparison, so overflow follows the same rule. */
static uint16_t half_round_ref(int bf, double x) {
    const uint16_t inf = bf ? 0x7f80 : 0x7c00;
    const double top = bf ? ldexp(1, 128) : ldexp(1, 16);
    if (isnan(x)) return 0;
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double ax = fabs(x);
    if (ax >= top) return sign | inf;
    uint16_t lo = 0, hi = inf; /* val(lo) <= ax < val(hi) */
    while (hi - lo > 1) {
        uint16_t mid = (uint16_t)(lo + (hi - lo) / 2);
        if (half_value(bf, mid) <= ax) lo = mid;
        else hi = mid;
    }
    double vl = half_value(bf, lo), vh = hi == inf ? top : half_value(bf, hi);
    if (ax == vl) return sign | lo;
    double dl = ax - vl, dh = vh - ax; /* exact: neighbouring float32 values */
    uint16_t r = dl < dh ? lo : dh < dl ? hi : (lo & 1 ? hi : lo);
    return sign | r;
}

static uint16_t to_half(int bf, float f) { return bf ? sph_f32_to_bf16(f) : sph_f32_to_f16(f); }
static float from_half(int bf, uint16_t u) { return bf ? sph_bf16_to_f32(u) : sph_f16_to_f32(u); }
static int half_is_nan(int bf, uint16_t u) {
    return bf ? (u & 0x7f80) == 0x7f80 && (u & 0x7f) : (u & 0x7c00) == 0x7c00 && (u & 0x3ff);
}

/* Checks f32 -> 16 bits of one value against the reference; counts failures. */
static int64_t g_conv_bad, g_conv_checked;
static unsigned bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (unsigned)u;
}
static void check_round(int bf, float f) {
    uint16_t got = to_half(bf, f);
    g_conv_checked++;
    if (isnan(f)) {
        if (!half_is_nan(bf, got) || (got & 0x8000) != (signbit(f) ? 0x8000 : 0)) {
            if (g_conv_bad++ < 10)
                print_error("%s(NaN %08x) = %04x: not a NaN of the same sign\n",
                            bf ? "f32_to_bf16" : "f32_to_f16", bits_of(f), got);
        }
        return;
    }
    uint16_t want = half_round_ref(bf, (double)f);
    if (got != want && g_conv_bad++ < 10)
        print_error("%s(%.9g = %08x) = %04x, round to nearest even gives %04x\n",
                    bf ? "f32_to_bf16" : "f32_to_f16", (double)f, bits_of(f), got, want);
}

/* Every one of the 65536 patterns of each format: it decodes to the value the format defines
 * (NaN patterns to a NaN of the same sign), and the value encodes back to the same pattern
 * (a NaN to a NaN of the same sign). No pattern is filtered out. */
static void test_half_patterns(void **state) {
    (void)state;
    int64_t bad = 0;
    for (int bf = 0; bf < 2; bf++)
        for (uint32_t u = 0; u < 65536; u++) {
            uint16_t h = (uint16_t)u;
            float f = from_half(bf, h);
            double want = half_value(bf, h);
            uint16_t back = to_half(bf, f);
            int good;
            if (isnan(want))
                good = isnan(f) && !!signbit(f) == !!(h & 0x8000) && half_is_nan(bf, back) &&
                       (back & 0x8000) == (h & 0x8000);
            else
                good = (double)f == want && !!signbit(f) == !!(h & 0x8000) && back == h;
            if (!good && bad++ < 10)
                print_error("%s pattern %04x: decodes to %.9g (want %.9g), encodes back to %04x\n",
                            bf ? "bf16" : "f16", h, (double)f, want, back);
        }
    assert_int_equal(bad, 0);
}

/* float32 -> bf16 / f16 rounding: for every finite pattern a and its successor b, the values
 * a, b's midpoint (the ties), one float32 ulp either side of a and of the midpoint, and a
 * random value in between, both signs; float32 subnormals, the overflow threshold and beyond,
 * infinities, NaNs; then 2^21 random float32 bit patterns. Against half_round_ref. */
static void test_half_rounding(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    g_conv_bad = g_conv_checked = 0;
    for (int bf = 0; bf < 2; bf++) {
        const uint16_t inf = bf ? 0x7f80 : 0x7c00;
        for (uint16_t a = 0; a < inf; a++) {
            double va = half_value(bf, a);
            double vb = a + 1 == inf ? (bf ? ldexp(1, 128) : ldexp(1, 16)) : half_value(bf, a + 1);
            float mid = (float)((va + vb) / 2); /* exact: one more bit than the format */
            float pts[7] = {(float)va, mid, nextafterf(mid, 0), nextafterf(mid, INFINITY),
                            nextafterf((float)va, 0), nextafterf((float)va, INFINITY),
                            (float)(va + rng_uniform(&r) * (vb - va))};
            for (int k = 0; k < 7; k++) {
                if (!isfinite(pts[k])) continue;
                check_round(bf, pts[k]);
                check_round(bf, -pts[k]);
            }
        }
        const float special[] = {INFINITY, -INFINITY, NAN, -NAN, 0x1p-149f, 0x1p-126f,
                                 0x1.fffffcp-127f, 65504.0f, 65519.99f, 65520.0f, 65536.0f,
                                 3.3895314e38f, 3.4028235e38f, 0x1p-24f, 0x1p-25f, 0x1.000002p-25f,
                                 0x1.8p-25f, 0x1p-26f, 0x1.ffcp-15f, 0x1.ffep-15f, 0x1.ffdp-15f};
        for (size_t k = 0; k < sizeof special / sizeof special[0]; k++) {
            check_round(bf, special[k]);
            check_round(bf, -special[k]);
        }
        union { uint32_t u; float f; } x;
        for (uint32_t k = 0; k < 4096; k++) { /* NaN payloads: signalling and quiet */
            x.u = 0x7f800001u + k * 997u % 0x7fffffu;
            check_round(bf, x.f);
            x.u |= 0x80000000u;
            check_round(bf, x.f);
        }
        for (int k = 0; k < (1 << 21); k++) {
            x.u = (uint32_t)rng_u64(&r);
            check_round(bf, x.f);
        }
    }
    print_message("conversions: %lld float32 values checked, %lld wrong\n",
                  (long long)g_conv_checked, (long long)g_conv_bad);
    assert_int_equal(g_conv_bad, 0);
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
    /* a bad SPH_KERNEL is blamed on the variable, not on force_kernel (issue 26 case 17) */
    const char *had = getenv("SPH_KERNEL");
    char keep[64] = "";
    if (had) snprintf(keep, sizeof keep, "%s", had);
    setenv("SPH_KERNEL", "bogus", 1);
    expect_status(sph_ctx_create(&ctx, &o), SPH_ERR_INVALID_ARG,
                  "SPH_KERNEL (environment): 'bogus' is unknown");
    assert_null(ctx);
    if (had) setenv("SPH_KERNEL", keep, 1);
    else unsetenv("SPH_KERNEL");
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
        cmocka_unit_test(test_view_validation), cmocka_unit_test(test_half_patterns),
        cmocka_unit_test(test_half_rounding),
        cmocka_unit_test(test_ctx_cpu), cmocka_unit_test(test_gemm_rate_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
