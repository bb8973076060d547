/* test_layout.c - alignment, packed segment layouts and CP-local rows: hand-worked cases and
 * every error these functions return. */
#include <string.h>

#include "testutil.h"

static sph_parallel par(int64_t tp, int64_t cp, sph_fp8 fp8) {
    sph_parallel p = {tp, cp, fp8};
    return p;
}

static void check_align(int64_t tp, int64_t cp, sph_fp8 fp8, int64_t seq, int64_t total,
                        int64_t unpacked) {
    sph_parallel p = par(tp, cp, fp8);
    sph_alignment a = {-7, -7, -7};
    expect_ok(sph_alignment_get(&p, &a));
    if (a.sequence != seq || a.total != total || a.unpacked != unpacked) {
        print_error("alignment(tp=%lld cp=%lld fp8=%d) = {%lld, %lld, %lld}, expected {%lld, "
                    "%lld, %lld}\n", (long long)tp, (long long)cp, (int)fp8,
                    (long long)a.sequence, (long long)a.total, (long long)a.unpacked,
                    (long long)seq, (long long)total, (long long)unpacked);
        fail();
    }
}

static void test_alignment_table(void **state) {
    (void)state;
    /* worked by hand from docs/design.md section 3.2 */
    check_align(1, 1, SPH_FP8_NONE, 1, 1, 1);
    check_align(2, 1, SPH_FP8_NONE, 1, 2, 2);
    check_align(3, 1, SPH_FP8_NONE, 1, 3, 3);
    check_align(2, 2, SPH_FP8_NONE, 8, 8, 0);
    check_align(1, 3, SPH_FP8_NONE, 6, 6, 0);
    check_align(4, 2, SPH_FP8_MXFP8, 16, 256, 0);      /* lcm(16, 32*8) */
    check_align(1, 1, SPH_FP8_MXFP8, 1, 32, 32);
    check_align(3, 1, SPH_FP8_MXFP8, 1, 96, 96);       /* lcm(3, 96) */
    check_align(1, 1, SPH_FP8_BLOCKWISE, 1, 16, 16);   /* T = 1: 16C */
    check_align(1, 2, SPH_FP8_BLOCKWISE, 4, 32, 0);    /* lcm(4, 32) */
    check_align(1, 3, SPH_FP8_BLOCKWISE, 6, 48, 0);    /* lcm(6, 48) */
    check_align(2, 1, SPH_FP8_BLOCKWISE, 1, 256, 256); /* T > 1: 128TC */
    check_align(3, 1, SPH_FP8_BLOCKWISE, 1, 384, 384);
    check_align(2, 3, SPH_FP8_BLOCKWISE, 12, 768, 0);  /* lcm(12, 768) */
    check_align(6, 1, SPH_FP8_MXFP8, 1, 192, 192);
}

static void test_alignment_errors(void **state) {
    (void)state;
    sph_alignment a;
    sph_parallel p = par(0, 1, SPH_FP8_NONE);
    expect_status(sph_alignment_get(NULL, &a), SPH_ERR_INVALID_ARG, "par: is NULL");
    expect_status(sph_alignment_get(&p, &a), SPH_ERR_INVALID_ARG, "par.tp: 0, expected >= 1");
    p = par(1, -2, SPH_FP8_NONE);
    expect_status(sph_alignment_get(&p, &a), SPH_ERR_INVALID_ARG, "par.cp: -2");
    p = par(1, 1, (sph_fp8)9);
    expect_status(sph_alignment_get(&p, &a), SPH_ERR_INVALID_ARG, "par.fp8: 9");
    p = par(1, 1, SPH_FP8_NONE);
    expect_status(sph_alignment_get(&p, NULL), SPH_ERR_INVALID_ARG, "out: is NULL");
    p = par(INT64_MAX / 2, 2, SPH_FP8_NONE);
    expect_status(sph_alignment_get(&p, &a), SPH_ERR_OVERFLOW, "2*tp*cp overflows");
    p = par((int64_t)1 << 40, (int64_t)1 << 20, SPH_FP8_MXFP8);
    expect_status(sph_alignment_get(&p, &a), SPH_ERR_OVERFLOW, "FP8 token alignment");
    /* large but representable sizes pass */
    p = par(3, ((int64_t)1 << 56) + 1, SPH_FP8_NONE);
    expect_ok(sph_alignment_get(&p, &a));
    /* cp = 1 forms no 2*tp*cp: tp = 2^62 has alignments that fit (issue 26 case 17) */
    check_align((int64_t)1 << 62, 1, SPH_FP8_NONE, 1, (int64_t)1 << 62, (int64_t)1 << 62);
}

static void test_layout_cases(void **state) {
    (void)state;
    int64_t len[4] = {1200, 873, 1801, 95}, pad[4], cu[5];
    sph_parallel p = par(2, 2, SPH_FP8_NONE); /* sequence 8, total 8 */
    memset(pad, 0xff, sizeof pad);
    expect_ok(sph_layout_packed(&p, len, 4, pad, cu));
    int64_t want_pad[4] = {1200, 880, 1808, 96}, want_cu[5] = {0, 1200, 2080, 3888, 3984};
    assert_memory_equal(pad, want_pad, sizeof pad);
    assert_memory_equal(cu, want_cu, sizeof cu);
    /* MXFP8: total alignment lcm(8, 128) = 128, so the final segment grows 3984 -> 4096 */
    p = par(2, 2, SPH_FP8_MXFP8);
    expect_ok(sph_layout_packed(&p, len, 4, pad, cu));
    int64_t want_pad2[4] = {1200, 880, 1808, 208}, want_cu2[5] = {0, 1200, 2080, 3888, 4096};
    assert_memory_equal(pad, want_pad2, sizeof pad);
    assert_memory_equal(cu, want_cu2, sizeof cu);
    /* TP2 without CP: no per-sequence padding, total to a multiple of 2 */
    int64_t l2[2] = {3, 4};
    p = par(2, 1, SPH_FP8_NONE);
    expect_ok(sph_layout_packed(&p, l2, 2, pad, cu));
    assert_int_equal(pad[0], 3);
    assert_int_equal(pad[1], 5);
    assert_int_equal(cu[2], 8);
    /* n = 0: just cu[0] = 0 */
    cu[0] = 99;
    expect_ok(sph_layout_packed(&p, NULL, 0, NULL, cu));
    assert_int_equal(cu[0], 0);
}

static void test_layout_errors(void **state) {
    (void)state;
    int64_t len[3] = {5, 0, 3}, pad[3], cu[4];
    sph_parallel p = par(1, 1, SPH_FP8_NONE);
    expect_status(sph_layout_packed(&p, len, 3, pad, cu), SPH_ERR_INVALID_ARG,
                  "lengths[1]: 0, expected >= 1");
    len[1] = -4;
    expect_status(sph_layout_packed(&p, len, 3, pad, cu), SPH_ERR_INVALID_ARG, "lengths[1]: -4");
    expect_status(sph_layout_packed(&p, len, -1, pad, cu), SPH_ERR_INVALID_ARG, "n: -1");
    expect_status(sph_layout_packed(&p, NULL, 3, pad, cu), SPH_ERR_INVALID_ARG, "lengths: is NULL");
    len[1] = 2;
    expect_status(sph_layout_packed(&p, len, 3, NULL, cu), SPH_ERR_INVALID_ARG, "padded: is NULL");
    expect_status(sph_layout_packed(&p, len, 3, pad, NULL), SPH_ERR_INVALID_ARG,
                  "cu_seqlens_padded: is NULL");
    int64_t big[2] = {INT64_MAX - 10, 20};
    expect_status(sph_layout_packed(&p, big, 2, pad, cu), SPH_ERR_OVERFLOW, "lengths[1]");
    p = par(2, 2, SPH_FP8_NONE);
    int64_t big1[1] = {INT64_MAX - 2};
    expect_status(sph_layout_packed(&p, big1, 1, pad, cu), SPH_ERR_OVERFLOW, "overflows");
    /* the sum fits but rounding to the total alignment does not */
    p = par(1, 1, SPH_FP8_MXFP8);
    expect_status(sph_layout_packed(&p, big1, 1, pad, cu), SPH_ERR_OVERFLOW, "total alignment");
    /* nothing written on failure */
    int64_t l3[2] = {4, -1};
    pad[0] = 77;
    cu[0] = 77;
    expect_status(sph_layout_packed(&p, l3, 2, pad, cu), SPH_ERR_INVALID_ARG, "lengths[1]");
    assert_int_equal(pad[0], 77);
    assert_int_equal(cu[0], 77);
}

static void test_cp_rows_cases(void **state) {
    (void)state;
    int64_t rows[8];
    expect_ok(sph_cp_local_rows(8, 2, 0, rows));
    int64_t r0[4] = {0, 1, 6, 7}, r1[4] = {2, 3, 4, 5};
    assert_memory_equal(rows, r0, sizeof r0);
    expect_ok(sph_cp_local_rows(8, 2, 1, rows));
    assert_memory_equal(rows, r1, sizeof r1);
    int64_t q0[4] = {0, 1, 10, 11}, q1[4] = {2, 3, 8, 9}, q2[4] = {4, 5, 6, 7};
    expect_ok(sph_cp_local_rows(12, 3, 0, rows));
    assert_memory_equal(rows, q0, sizeof q0);
    expect_ok(sph_cp_local_rows(12, 3, 1, rows));
    assert_memory_equal(rows, q1, sizeof q1);
    expect_ok(sph_cp_local_rows(12, 3, 2, rows));
    assert_memory_equal(rows, q2, sizeof q2);
    /* C = 1: the whole segment in order, odd lengths allowed */
    expect_ok(sph_cp_local_rows(5, 1, 0, rows));
    for (int i = 0; i < 5; i++) assert_int_equal(rows[i], i);
    expect_ok(sph_cp_local_rows(0, 4, 3, NULL));
}

static void test_cp_rows_errors(void **state) {
    (void)state;
    int64_t rows[16];
    expect_status(sph_cp_local_rows(10, 3, 0, rows), SPH_ERR_INVALID_ARG,
                  "P: 10 is not divisible by 2*cp = 6");
    expect_status(sph_cp_local_rows(12, 3, 3, rows), SPH_ERR_INVALID_ARG,
                  "cp_rank: 3, expected in [0, 3)");
    expect_status(sph_cp_local_rows(12, 3, -1, rows), SPH_ERR_INVALID_ARG, "cp_rank: -1");
    expect_status(sph_cp_local_rows(12, 0, 0, rows), SPH_ERR_INVALID_ARG, "cp: 0");
    expect_status(sph_cp_local_rows(-4, 2, 0, rows), SPH_ERR_INVALID_ARG, "P: -4");
    expect_status(sph_cp_local_rows(8, 2, 0, NULL), SPH_ERR_INVALID_ARG, "rows: is NULL");
    expect_status(sph_cp_local_rows(0, INT64_MAX, 0, rows), SPH_ERR_OVERFLOW, "2*cp overflows");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alignment_table), cmocka_unit_test(test_alignment_errors),
        cmocka_unit_test(test_layout_cases),    cmocka_unit_test(test_layout_errors),
        cmocka_unit_test(test_cp_rows_cases),   cmocka_unit_test(test_cp_rows_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
