/* test_scale.c - sph_scale_inplace on the host (spanhead.h): the products rounded once per
 * dtype against float arithmetic done here, rows with a stride (the gap untouched), a scale of
 * exactly 1 that reads and writes nothing (the tensor on a read-only page: a write faults),
 * every error naming its argument with nothing written. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/internal.h"
#include "testutil.h"

static sph_ctx_t cpu_ctx(void) {
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.num_threads = 1;
    sph_ctx_t c = NULL;
    expect_ok(sph_ctx_create(&c, &o));
    return c;
}

static float rnd(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return ((float)((*s >> 8) & 0xffff) / 65536.0f - 0.5f) * 7.0f;
}

/* One dtype: a (5, 7) view of rows with stride 9 and a 1-D tensor of 13, both scaled by s; the
 * two columns past each row keep their poison. */
static void check_dtype(sph_ctx_t c, sph_dtype dt, float s) {
    unsigned seed = 7u + (unsigned)dt.bits + (unsigned)dt.code * 3u;
    const int es = dt.bits / 8;
    unsigned char a[5 * 9 * 4], b[13 * 4], a0[sizeof a], b0[sizeof b];
    for (int k = 0; k < 5 * 9; k++) {
        float x = (k % 9) >= 7 ? NAN : rnd(&seed);
        if (es == 4) memcpy(a + 4 * k, &x, 4);
        else {
            uint16_t h = dt.code == SPH_DTYPE_BFLOAT ? sph_f32_to_bf16(x) : sph_f32_to_f16(x);
            memcpy(a + 2 * k, &h, 2);
        }
    }
    for (int k = 0; k < 13; k++) {
        float x = rnd(&seed);
        if (es == 4) memcpy(b + 4 * k, &x, 4);
        else {
            uint16_t h = dt.code == SPH_DTYPE_BFLOAT ? sph_f32_to_bf16(x) : sph_f32_to_f16(x);
            memcpy(b + 2 * k, &h, 2);
        }
    }
    memcpy(a0, a, sizeof a);
    memcpy(b0, b, sizeof b);
    int64_t sha[2] = {5, 7}, sta[2] = {9, 1}, shb[1] = {13}, one[1] = {1};
    sph_tensor ta = {a, {SPH_DEVICE_CPU, 0}, 2, dt, sha, sta, 0};
    sph_tensor tb = {b, {SPH_DEVICE_CPU, 0}, 1, dt, shb, NULL, 0};
    sph_tensor ts = {&s, {SPH_DEVICE_CPU, 0}, 1, SPH_F32, one, NULL, 0};
    const sph_tensor *ts2[2] = {&ta, &tb};
    expect_ok(sph_scale_inplace(c, &ts, ts2, 2));
    for (int k = 0; k < 5 * 9 + 13; k++) {
        const int in_a = k < 45;
        const unsigned char *got = in_a ? a + es * k : b + es * (k - 45);
        const unsigned char *was = in_a ? a0 + es * k : b0 + es * (k - 45);
        if (in_a && (k % 9) >= 7) { /* the gap between rows: untouched */
            assert_memory_equal(got, was, (size_t)es);
            continue;
        }
        float x, want;
        if (es == 4) {
            memcpy(&x, was, 4);
            want = x * s;
            float g;
            memcpy(&g, got, 4);
            assert_true(g == want);
        } else {
            uint16_t h, gh;
            memcpy(&h, was, 2);
            memcpy(&gh, got, 2);
            x = dt.code == SPH_DTYPE_BFLOAT ? sph_bf16_to_f32(h) : sph_f16_to_f32(h);
            uint16_t wh = dt.code == SPH_DTYPE_BFLOAT ? sph_f32_to_bf16(x * s)
                                                      : sph_f32_to_f16(x * s);
            assert_int_equal(gh, wh);
        }
    }
}

static void test_products(void **state) {
    (void)state;
    sph_ctx_t c = cpu_ctx();
    const float scales[] = {2.5f, -0.375f, 0.0f, 1.0f + 0x1p-23f};
    const sph_dtype dts[] = {SPH_F32, SPH_BF16, SPH_F16};
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < 4; k++) check_dtype(c, dts[d], scales[k]);
    sph_ctx_destroy(c);
}

/* A scale of exactly 1 reads and writes nothing: the tensor lives on a read-only page (a
 * write faults), and -0.0f / NaN bits would not survive a multiplication unchanged anyway. */
static void test_one_touches_nothing(void **state) {
    (void)state;
    sph_ctx_t c = cpu_ctx();
    const long pg = sysconf(_SC_PAGESIZE);
    float *page = (float *)mmap(NULL, (size_t)pg, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(page != MAP_FAILED);
    for (int k = 0; k < 64; k++) page[k] = (float)k - 3.5f;
    assert_int_equal(mprotect(page, (size_t)pg, PROT_READ), 0);
    float s = 1.0f;
    int64_t sh[2] = {8, 8}, one[1] = {1};
    sph_tensor t = {page, {SPH_DEVICE_CPU, 0}, 2, SPH_F32, sh, NULL, 0};
    sph_tensor ts = {&s, {SPH_DEVICE_CPU, 0}, 1, SPH_F32, one, NULL, 0};
    const sph_tensor *tl[1] = {&t};
    expect_ok(sph_scale_inplace(c, &ts, tl, 1));
    for (int k = 0; k < 64; k++) assert_true(page[k] == (float)k - 3.5f);
    munmap(page, (size_t)pg);
    sph_ctx_destroy(c);
}

static void test_errors(void **state) {
    (void)state;
    sph_ctx_t c = cpu_ctx();
    float x[16], s2[2] = {2.0f, 2.0f}, s = 3.0f;
    for (int k = 0; k < 16; k++) x[k] = (float)k;
    int64_t sh[1] = {8}, sh3[3] = {2, 2, 2}, one[1] = {1}, two[1] = {2};
    int32_t ix[8] = {0};
    sph_tensor a = {x, {SPH_DEVICE_CPU, 0}, 1, SPH_F32, sh, NULL, 0};
    sph_tensor b = {x + 4, {SPH_DEVICE_CPU, 0}, 1, SPH_F32, sh, NULL, 0}; /* overlaps a */
    sph_tensor d3 = {x, {SPH_DEVICE_CPU, 0}, 3, SPH_F32, sh3, NULL, 0};
    sph_tensor ti = {ix, {SPH_DEVICE_CPU, 0}, 1, SPH_I32, sh, NULL, 0};
    sph_tensor ts = {&s, {SPH_DEVICE_CPU, 0}, 1, SPH_F32, one, NULL, 0};
    sph_tensor tsx = {x + 2, {SPH_DEVICE_CPU, 0}, 1, SPH_F32, one, NULL, 0}; /* inside a */
    sph_tensor ts2 = {s2, {SPH_DEVICE_CPU, 0}, 1, SPH_F32, two, NULL, 0};
    sph_tensor tsi = {ix, {SPH_DEVICE_CPU, 0}, 1, SPH_I32, one, NULL, 0};
    sph_tensor tgpu = {x, {SPH_DEVICE_CUDA, 0}, 1, SPH_F32, sh, NULL, 0};
    const sph_tensor *l1[1] = {&a}, *lab[2] = {&a, &b}, *l3[1] = {&d3}, *li[1] = {&ti},
                     *lnull[2] = {&a, NULL}, *lg[1] = {&tgpu};
    const sph_tensor *l9[9] = {&a, &a, &a, &a, &a, &a, &a, &a, &a};
    expect_status(sph_scale_inplace(c, &ts, l1, 0), SPH_ERR_INVALID_ARG, "n: 0, expected 1 .. 8");
    expect_status(sph_scale_inplace(c, &ts, l9, 9), SPH_ERR_INVALID_ARG, "n: 9");
    expect_status(sph_scale_inplace(c, &ts, NULL, 1), SPH_ERR_INVALID_ARG, "tensors: NULL");
    expect_status(sph_scale_inplace(c, NULL, l1, 1), SPH_ERR_INVALID_ARG, "scale: NULL");
    expect_status(sph_scale_inplace(c, &ts2, l1, 1), SPH_ERR_SHAPE, "scale: 2 elements");
    expect_status(sph_scale_inplace(c, &tsi, l1, 1), SPH_ERR_DTYPE, "scale: dtype");
    expect_status(sph_scale_inplace(c, &ts, lnull, 2), SPH_ERR_INVALID_ARG, "tensors[1]: NULL");
    expect_status(sph_scale_inplace(c, &ts, l3, 1), SPH_ERR_SHAPE, "tensors[0]: ndim is 3");
    expect_status(sph_scale_inplace(c, &ts, li, 1), SPH_ERR_DTYPE, "tensors[0]: dtype");
    expect_status(sph_scale_inplace(c, &ts, lab, 2), SPH_ERR_INVALID_ARG, "tensors[1]");
    expect_status(sph_scale_inplace(c, &tsx, l1, 1), SPH_ERR_INVALID_ARG, "scale");
    expect_status(sph_scale_inplace(c, &ts, lg, 1), SPH_ERR_DEVICE, "tensors[0]");
    for (int k = 0; k < 16; k++) assert_true(x[k] == (float)k); /* nothing written */
    expect_status(sph_scale_inplace(NULL, &ts, l1, 1), SPH_ERR_INVALID_ARG, "ctx");
    sph_ctx_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_products),
        cmocka_unit_test(test_one_touches_nothing),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
