/* test_pack.c - bin packing: hand-worked cases for each algorithm, alignment-aware costs, the
 * bin-count adjustment, and every error sph_pack returns. */
#include <string.h>

#include "testutil.h"

/* Under AddressSanitizer an impossible allocation must return NULL (as glibc does) so the
 * SPH_ERR_ALLOC path can be tested; ignored without ASan. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* Compares r against bins given as a flat list: {n_items_bin0, idx..., n_items_bin1, ...}. */
static void expect_bins(const sph_pack_result *r, const int64_t *flat, int64_t n_bins,
                        const int64_t *tokens) {
    if (r->n_bins != n_bins) {
        print_error("n_bins %lld, expected %lld\n", (long long)r->n_bins, (long long)n_bins);
        fail();
    }
    int64_t k = 0;
    for (int64_t b = 0; b < n_bins; b++) {
        const int64_t cnt = flat[k++];
        assert_int_equal(r->bin_offsets[b + 1] - r->bin_offsets[b], cnt);
        for (int64_t j = 0; j < cnt; j++) assert_int_equal(r->items[r->bin_offsets[b] + j], flat[k++]);
        assert_int_equal(r->bin_tokens[b], tokens[b]);
    }
}

static sph_pack_opts opts_of(int64_t cap, sph_pack_algo algo) {
    sph_pack_opts o = SPH_PACK_OPTS_INIT;
    o.capacity = cap;
    o.algorithm = algo;
    return o;
}

static void test_ffd(void **state) {
    (void)state;
    /* 6 -> b0, 5 -> b1, 4 -> b0 (full), 3 -> b1, 2 -> b1 (full) */
    const int64_t len[5] = {6, 5, 4, 3, 2};
    sph_pack_opts o = opts_of(10, SPH_PACK_FFD);
    sph_pack_result *r;
    expect_ok(sph_pack(len, 5, &o, &r));
    const int64_t bins[] = {2, 0, 2, 3, 1, 3, 4}, tok[] = {10, 10};
    expect_bins(r, bins, 2, tok);
    assert_int_equal(r->n_items, 5);
    assert_true(r->utilization == 1.0);
    sph_pack_free(r);
    sph_pack_free(NULL);
    /* n = 0: no bins */
    expect_ok(sph_pack(NULL, 0, &o, &r));
    assert_int_equal(r->n_bins, 0);
    assert_true(r->utilization == 0.0);
    sph_pack_free(r);
}

static void test_mffd(void **state) {
    (void)state;
    /* capacity 20: large > 10, medium > 6, small > 3. Step 3 pairs the smallest small item (4,
     * index 3) with the largest small item that fits beside it (5), where FFD takes 5 and 4
     * (index 2) in order. */
    const int64_t len[4] = {11, 5, 4, 4};
    sph_pack_opts o = opts_of(20, SPH_PACK_MFFD);
    sph_pack_result *r;
    expect_ok(sph_pack(len, 4, &o, &r));
    const int64_t bins[] = {3, 0, 1, 3, 1, 2}, tok[] = {20, 4};
    expect_bins(r, bins, 2, tok);
    sph_pack_free(r);
    o.algorithm = SPH_PACK_FFD;
    expect_ok(sph_pack(len, 4, &o, &r));
    const int64_t fbins[] = {3, 0, 1, 2, 1, 3};
    expect_bins(r, fbins, 2, tok);
    sph_pack_free(r);
    /* capacity 12: step 2 adds the medium item 5 to the large 7; step 5 packs the rest */
    const int64_t l2[6] = {2, 7, 3, 5, 3, 1};
    o = opts_of(12, SPH_PACK_MFFD);
    expect_ok(sph_pack(l2, 6, &o, &r));
    const int64_t b2[] = {2, 1, 3, 4, 0, 2, 4, 5}, t2[] = {12, 9};
    expect_bins(r, b2, 2, t2);
    sph_pack_free(r);
}

static void test_balanced(void **state) {
    (void)state;
    /* two bins to start (ceil(20/10)); 6 -> b0, 5 -> b1, 4 -> b1, 3 -> b0, 2 fits neither
     * least-loaded bin (9 + 2 > 10) -> new bin */
    const int64_t len[5] = {6, 5, 4, 3, 2};
    sph_pack_opts o = opts_of(10, SPH_PACK_BALANCED);
    sph_pack_result *r;
    expect_ok(sph_pack(len, 5, &o, &r));
    const int64_t bins[] = {2, 0, 3, 2, 1, 2, 1, 4}, tok[] = {9, 9, 2};
    expect_bins(r, bins, 3, tok);
    sph_pack_free(r);
    /* soft cap: 15 > 10 gets a bin of its own, the rest share one */
    const int64_t l2[3] = {15, 3, 4};
    expect_ok(sph_pack(l2, 3, &o, &r));
    const int64_t b2[] = {1, 0, 2, 1, 2}, t2[] = {15, 7};
    expect_bins(r, b2, 2, t2);
    assert_true(r->utilization > 1.1 - 1e-12 && r->utilization < 1.1 + 1e-12); /* 22/20 */
    sph_pack_free(r);
    /* min_bins spreads the load: four items over four bins */
    const int64_t l3[4] = {4, 4, 4, 4};
    o.min_bins = 4;
    expect_ok(sph_pack(l3, 4, &o, &r));
    const int64_t b3[] = {1, 0, 1, 1, 1, 2, 1, 3}, t3[] = {4, 4, 4, 4};
    expect_bins(r, b3, 4, t3);
    sph_pack_free(r);
}

static void test_alignment_aware(void **state) {
    (void)state;
    /* TP2 CP2: sequence alignment 8, costs 8, 16, 8; capacity 20 -> effective 16 */
    const int64_t len[3] = {5, 9, 3};
    sph_pack_opts o = opts_of(20, SPH_PACK_FFD);
    o.par.tp = 2;
    o.par.cp = 2;
    sph_pack_result *r;
    expect_ok(sph_pack(len, 3, &o, &r));
    const int64_t bins[] = {1, 1, 2, 0, 2}, tok[] = {16, 16};
    expect_bins(r, bins, 2, tok);
    assert_true(r->utilization == 32.0 / 40.0);
    sph_pack_free(r);
    /* without parallelism everything fits one bin */
    o.par.tp = o.par.cp = 1;
    expect_ok(sph_pack(len, 3, &o, &r));
    const int64_t b1[] = {3, 0, 1, 2}, t1[] = {17};
    expect_bins(r, b1, 1, t1);
    sph_pack_free(r);
}

static void test_bin_count_adjustment(void **state) {
    (void)state;
    /* FFD gives {0,2}=10, {1,3,4}=10; min_bins 3: the fullest bin (tie: b0) gives its largest
     * item (6); bin_multiple 2 -> 4 bins: then b1 (10) gives its 5 */
    const int64_t len[5] = {6, 5, 4, 3, 2};
    sph_pack_opts o = opts_of(10, SPH_PACK_FFD);
    o.min_bins = 3;
    sph_pack_result *r;
    expect_ok(sph_pack(len, 5, &o, &r));
    const int64_t b3[] = {1, 2, 3, 1, 3, 4, 1, 0}, t3[] = {4, 10, 6};
    expect_bins(r, b3, 3, t3);
    sph_pack_free(r);
    o.bin_multiple = 2;
    expect_ok(sph_pack(len, 5, &o, &r));
    const int64_t b4[] = {1, 2, 2, 3, 4, 1, 0, 1, 1}, t4[] = {4, 5, 6, 5};
    expect_bins(r, b4, 4, t4);
    sph_pack_free(r);
    /* a multiple already met changes nothing */
    o.min_bins = 0;
    expect_ok(sph_pack(len, 5, &o, &r));
    assert_int_equal(r->n_bins, 2);
    sph_pack_free(r);
    /* every bin stays non-empty: five items into five bins */
    o.min_bins = 5;
    o.bin_multiple = 5;
    o.algorithm = SPH_PACK_MFFD;
    expect_ok(sph_pack(len, 5, &o, &r));
    assert_int_equal(r->n_bins, 5);
    for (int b = 0; b < 5; b++) assert_int_equal(r->bin_offsets[b + 1] - r->bin_offsets[b], 1);
    sph_pack_free(r);
}

static void test_pack_errors(void **state) {
    (void)state;
    int64_t len[3] = {4, 5, 6};
    sph_pack_opts o = opts_of(10, SPH_PACK_FFD);
    sph_pack_result *r = (sph_pack_result *)len;
    expect_status(sph_pack(len, 3, &o, NULL), SPH_ERR_INVALID_ARG, "out: is NULL");
    expect_status(sph_pack(len, 3, NULL, &r), SPH_ERR_INVALID_ARG, "opts: is NULL");
    assert_null(r);
    o.struct_size = 4;
    expect_status(sph_pack(len, 3, &o, &r), SPH_ERR_INVALID_ARG, "opts.struct_size: 4");
    o = opts_of(0, SPH_PACK_FFD);
    expect_status(sph_pack(len, 3, &o, &r), SPH_ERR_INVALID_ARG, "opts.capacity: 0, expected > 0");
    o = opts_of(10, (sph_pack_algo)3);
    expect_status(sph_pack(len, 3, &o, &r), SPH_ERR_INVALID_ARG, "opts.algorithm: 3");
    o = opts_of(10, SPH_PACK_FFD);
    o.min_bins = -1;
    expect_status(sph_pack(len, 3, &o, &r), SPH_ERR_INVALID_ARG, "opts.min_bins: -1");
    o.min_bins = 0;
    o.bin_multiple = -2;
    expect_status(sph_pack(len, 3, &o, &r), SPH_ERR_INVALID_ARG, "opts.bin_multiple: -2");
    o.bin_multiple = 1;
    expect_status(sph_pack(len, -1, &o, &r), SPH_ERR_INVALID_ARG, "n: -1");
    expect_status(sph_pack(NULL, 3, &o, &r), SPH_ERR_INVALID_ARG, "lengths: is NULL");
    o.par.cp = 0;
    expect_status(sph_pack(len, 3, &o, &r), SPH_ERR_INVALID_ARG, "par.cp: 0");
    o.par.cp = 2;
    o.par.tp = 2; /* total alignment 8 */
    o.capacity = 7;
    expect_status(sph_pack(len, 3, &o, &r), SPH_ERR_INVALID_ARG,
                  "opts.capacity: 7 is below the total alignment 8");
    o = opts_of(10, SPH_PACK_FFD);
    len[1] = 0;
    expect_status(sph_pack(len, 3, &o, &r), SPH_ERR_INVALID_ARG, "lengths[1]: 0, expected >= 1");
    len[1] = -7;
    expect_status(sph_pack(len, 3, &o, &r), SPH_ERR_INVALID_ARG, "lengths[1]: -7");
    len[1] = 11;
    expect_status(sph_pack(len, 3, &o, &r), SPH_ERR_INVALID_ARG,
                  "lengths[1]: 11 (padded 11) exceeds the bin capacity 10");
    o.algorithm = SPH_PACK_MFFD;
    expect_status(sph_pack(len, 3, &o, &r), SPH_ERR_INVALID_ARG, "exceeds the bin capacity");
    o.par.tp = o.par.cp = 2; /* 9 pads to 16 > capacity 16? no: 16 fits; 17 pads to 24 */
    o.capacity = 16;
    len[1] = 17;
    expect_status(sph_pack(len, 3, &o, &r), SPH_ERR_INVALID_ARG, "17 (padded 24)");
    o = opts_of(10, SPH_PACK_FFD);
    len[1] = 5;
    o.min_bins = 4;
    expect_status(sph_pack(len, 3, &o, &r), SPH_ERR_INFEASIBLE,
                  "4 non-empty bins needed (min_bins = 4, bin_multiple = 1) but only 3 sequences");
    o.min_bins = 0;
    o.bin_multiple = 4; /* two bins round up to four */
    expect_status(sph_pack(len, 3, &o, &r), SPH_ERR_INFEASIBLE, "only 3 sequences");
    o = opts_of(10, SPH_PACK_BALANCED);
    o.min_bins = 1;
    expect_status(sph_pack(NULL, 0, &o, &r), SPH_ERR_INFEASIBLE, "but only 0 sequences");
    o.min_bins = INT64_MAX;
    o.bin_multiple = 2;
    expect_status(sph_pack(len, 3, &o, &r), SPH_ERR_OVERFLOW, "rounded to bin_multiple 2");
    /* sums beyond int64: the balanced soft cap accepts each item, the sum overflows */
    const int64_t huge[2] = {INT64_MAX / 2 + 1, INT64_MAX / 2 + 1};
    o = opts_of(10, SPH_PACK_BALANCED);
    expect_status(sph_pack(huge, 2, &o, &r), SPH_ERR_OVERFLOW, "padded sum overflows int64");
    o.par.tp = o.par.cp = 2;
    o.capacity = 16;
    const int64_t edge[1] = {INT64_MAX - 1}; /* rounding to 8 overflows */
    expect_status(sph_pack(edge, 1, &o, &r), SPH_ERR_OVERFLOW, "lengths[0]");
}

static void test_pack_alloc_failure(void **state) {
    (void)state;
    /* the working arrays are allocated before any length is read: 2^57 items cannot fit in
     * memory, 2^62 cannot even be addressed */
    const int64_t len[1] = {1};
    sph_pack_opts o = opts_of(10, SPH_PACK_FFD);
    sph_pack_result *r;
    expect_status(sph_pack(len, (int64_t)1 << 57, &o, &r), SPH_ERR_ALLOC, "out of host memory");
    expect_status(sph_pack(len, (int64_t)1 << 62, &o, &r), SPH_ERR_OVERFLOW,
                  "overflow the host address space");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ffd),        cmocka_unit_test(test_mffd),
        cmocka_unit_test(test_balanced),   cmocka_unit_test(test_alignment_aware),
        cmocka_unit_test(test_bin_count_adjustment), cmocka_unit_test(test_pack_errors),
        cmocka_unit_test(test_pack_alloc_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
