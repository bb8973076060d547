/* test_spans.c - active masks and spans: hand-worked cases for every layout variant and every
 * error sph_spans_* returns. */
#include <string.h>

#include "testutil.h"

/* Under AddressSanitizer an impossible allocation must return NULL (as glibc does) so the
 * SPH_ERR_ALLOC path can be tested; ignored without ASan. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

static void expect_spans(const int64_t *got, int64_t n_got, const int64_t *want, int64_t n_want) {
    if (n_got != n_want) {
        print_error("n_spans %lld, expected %lld\n", (long long)n_got, (long long)n_want);
        fail();
    }
    if (n_want) assert_memory_equal(got, want, sizeof(int64_t) * 2 * (size_t)n_want);
}

static void test_from_mask(void **state) {
    (void)state;
    const uint8_t m[16] = {0, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1};
    int64_t sp[16], ns = -1;
    expect_ok(sph_spans_from_mask(m, 16, 0, sp, &ns));
    int64_t w0[6] = {1, 3, 6, 8, 15, 16};
    expect_spans(sp, ns, w0, 3);
    expect_ok(sph_spans_from_mask(m, 16, 2, sp, &ns)); /* gap 6-3 = 3 > 2 */
    expect_spans(sp, ns, w0, 3);
    expect_ok(sph_spans_from_mask(m, 16, 3, sp, &ns));
    int64_t w3[4] = {1, 8, 15, 16};
    expect_spans(sp, ns, w3, 2);
    expect_ok(sph_spans_from_mask(m, 16, 7, sp, &ns));
    int64_t w7[2] = {1, 16};
    expect_spans(sp, ns, w7, 1);
    /* worst case count: alternating, (n + 1) / 2 spans */
    const uint8_t alt[5] = {1, 0, 1, 0, 2}; /* any nonzero byte is active */
    expect_ok(sph_spans_from_mask(alt, 5, 0, sp, &ns));
    int64_t wa[6] = {0, 1, 2, 3, 4, 5};
    expect_spans(sp, ns, wa, 3);
    const uint8_t none[3] = {0, 0, 0};
    expect_ok(sph_spans_from_mask(none, 3, 128, sp, &ns));
    assert_int_equal(ns, 0);
    expect_ok(sph_spans_from_mask(NULL, 0, 128, NULL, &ns));
    assert_int_equal(ns, 0);
}

static void test_from_mask_errors(void **state) {
    (void)state;
    const uint8_t m[2] = {1, 0};
    int64_t sp[4], ns;
    expect_status(sph_spans_from_mask(m, -1, 0, sp, &ns), SPH_ERR_INVALID_ARG, "n: -1");
    expect_status(sph_spans_from_mask(m, 2, -3, sp, &ns), SPH_ERR_INVALID_ARG, "gap: -3");
    expect_status(sph_spans_from_mask(NULL, 2, 0, sp, &ns), SPH_ERR_INVALID_ARG, "mask: is NULL");
    expect_status(sph_spans_from_mask(m, 2, 0, NULL, &ns), SPH_ERR_INVALID_ARG, "spans: is NULL");
    expect_status(sph_spans_from_mask(m, 2, 0, sp, NULL), SPH_ERR_INVALID_ARG, "n_spans: is NULL");
}

static void test_validate(void **state) {
    (void)state;
    const uint8_t m[8] = {0, 1, 1, 0, 0, 1, 0, 0};
    int64_t ok[4] = {1, 3, 4, 6};
    expect_ok(sph_spans_validate(ok, 2, 8, m));
    expect_ok(sph_spans_validate(ok, 2, 8, NULL));
    int64_t miss[2] = {1, 3};
    expect_status(sph_spans_validate(miss, 1, 8, m), SPH_ERR_INVALID_ARG,
                  "active row 5 lies outside every span");
    int64_t miss0[2] = {2, 6};
    expect_status(sph_spans_validate(miss0, 1, 8, m), SPH_ERR_INVALID_ARG, "active row 1");
    int64_t unordered[4] = {4, 6, 1, 3};
    expect_status(sph_spans_validate(unordered, 2, 8, NULL), SPH_ERR_INVALID_ARG,
                  "spans[1]: starts at 1 before the previous span's end 6");
    int64_t overlap[4] = {1, 5, 4, 6};
    expect_status(sph_spans_validate(overlap, 2, 8, NULL), SPH_ERR_INVALID_ARG, "ordered and disjoint");
    int64_t empty[2] = {3, 3};
    expect_status(sph_spans_validate(empty, 1, 8, NULL), SPH_ERR_INVALID_ARG,
                  "spans[0]: [3, 3), expected 0 <= start < end <= n = 8");
    int64_t out[2] = {6, 9};
    expect_status(sph_spans_validate(out, 1, 8, NULL), SPH_ERR_INVALID_ARG, "[6, 9)");
    expect_status(sph_spans_validate(ok, -1, 8, NULL), SPH_ERR_INVALID_ARG, "n_spans: -1");
    expect_status(sph_spans_validate(ok, 1, -8, NULL), SPH_ERR_INVALID_ARG, "n: -8");
    expect_status(sph_spans_validate(NULL, 1, 8, NULL), SPH_ERR_INVALID_ARG, "spans: is NULL");
}

/* B=2, S=6, A=3, loss [[1,0,1],[0,1,1]]: rows S-1-A .. S-2 = 2..4 of each row carry the mask */
static const uint8_t LOSS_A[6] = {1, 0, 1, 0, 1, 1};

static sph_batch_desc desc_a(sph_layout_kind kind) {
    sph_batch_desc d = SPH_BATCH_DESC_INIT;
    d.layout = kind;
    d.batch = 2;
    d.seq_len = 6;
    d.num_actions = 3;
    d.loss_mask = LOSS_A;
    return d;
}

static void test_unpacked(void **state) {
    (void)state;
    sph_batch_desc d = desc_a(SPH_LAYOUT_UNPACKED);
    sph_spans_opts o = SPH_SPANS_OPTS_INIT;
    o.gap = 0;
    sph_spans *s = NULL;
    expect_ok(sph_spans_build(&d, &o, &s));
    const uint8_t want[12] = {0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 1, 0};
    assert_int_equal(s->global_rows, 12);
    assert_int_equal(s->local_rows, 12);
    assert_memory_equal(s->active_mask, want, 12);
    assert_memory_equal(s->local_mask, want, 12);
    assert_int_equal(s->active_rows, 4);
    assert_int_equal(s->local_active_rows, 4);
    assert_int_equal(s->n_segments, 2);
    assert_null(s->cu_seqlens_padded);
    int64_t w0[6] = {2, 3, 4, 5, 9, 11};
    expect_spans(s->spans, s->n_spans, w0, 3);
    sph_spans_free(s);
    o.gap = 1;
    expect_ok(sph_spans_build(&d, &o, &s));
    int64_t w1[4] = {2, 5, 9, 11};
    expect_spans(s->spans, s->n_spans, w1, 2);
    sph_spans_free(s);
    o.gap = 4; /* 9 - 5 = 4 inactive rows */
    expect_ok(sph_spans_build(&d, &o, &s));
    int64_t w4[2] = {2, 11};
    expect_spans(s->spans, s->n_spans, w4, 1);
    sph_spans_free(s);
    /* TP2: S = 6 is a multiple of the unpacked alignment 2 */
    o.par.tp = 2;
    expect_ok(sph_spans_build(&d, &o, &s));
    sph_spans_free(s);
    sph_spans_free(NULL);
}

static void test_unpacked_rejected(void **state) {
    (void)state;
    sph_batch_desc d = desc_a(SPH_LAYOUT_UNPACKED);
    sph_spans_opts o = SPH_SPANS_OPTS_INIT;
    sph_spans *s = (sph_spans *)&d;
    o.par.tp = 4; /* S = 6 needs padding to 8 */
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG,
                  "seq_len 6 is not a multiple of the unpacked alignment 4");
    assert_null(s);
    o.par.tp = 1;
    o.par.fp8 = SPH_FP8_MXFP8; /* unpacked alignment 32 */
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG, "unpacked alignment 32");
    o.par.fp8 = SPH_FP8_NONE;
    o.par.cp = 2;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG, "unpacked spans: cp = 2");
}

static void test_packed_rows(void **state) {
    (void)state;
    /* packed with neither sub-sequences nor attention mask, T=C=1: same rows as unpacked */
    sph_batch_desc d = desc_a(SPH_LAYOUT_PACKED);
    sph_spans_opts o = SPH_SPANS_OPTS_INIT;
    o.gap = 0;
    sph_spans *s;
    expect_ok(sph_spans_build(&d, &o, &s));
    const uint8_t want[12] = {0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 1, 0};
    assert_memory_equal(s->active_mask, want, 12);
    int64_t cu[3] = {0, 6, 12};
    assert_memory_equal(s->cu_seqlens_padded, cu, sizeof cu);
    sph_spans_free(s);
    /* T=2, C=2: each row padded to 8; global active rows 2, 4 and 8+3, 8+4 */
    o.par.tp = 2;
    o.par.cp = 2;
    o.cp_rank = 0; /* segment rows 0,1,6,7: nothing active */
    expect_ok(sph_spans_build(&d, &o, &s));
    assert_int_equal(s->global_rows, 16);
    assert_int_equal(s->active_rows, 4);
    const uint8_t g[16] = {0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0};
    assert_memory_equal(s->active_mask, g, 16);
    assert_int_equal(s->local_rows, 8);
    const uint8_t l0[8] = {0};
    assert_memory_equal(s->local_mask, l0, 8);
    assert_int_equal(s->local_active_rows, 0);
    assert_int_equal(s->n_spans, 0);
    sph_spans_free(s);
    o.cp_rank = 1; /* segment rows 2,3,4,5 */
    expect_ok(sph_spans_build(&d, &o, &s));
    const uint8_t l1[8] = {1, 0, 1, 0, 0, 1, 1, 0};
    assert_memory_equal(s->local_mask, l1, 8);
    assert_int_equal(s->local_active_rows, 4);
    int64_t w1[6] = {0, 1, 2, 3, 5, 7};
    expect_spans(s->spans, s->n_spans, w1, 3);
    sph_spans_free(s);
    o.gap = 1;
    expect_ok(sph_spans_build(&d, &o, &s));
    int64_t w1g[4] = {0, 3, 5, 7};
    expect_spans(s->spans, s->n_spans, w1g, 2);
    sph_spans_free(s);
    o.gap = 2;
    expect_ok(sph_spans_build(&d, &o, &s));
    int64_t w2g[2] = {0, 7};
    expect_spans(s->spans, s->n_spans, w2g, 1);
    sph_spans_free(s);
}

static void test_packed_subseq(void **state) {
    (void)state;
    /* S=10, A=6 (columns 4..9), sub-sequences of 4 and 5 tokens, column 9 is padding */
    const int64_t lens[2] = {4, 5}, counts[1] = {2};
    const uint8_t loss[6] = {0, 1, 1, 1, 1, 0};
    sph_batch_desc d = SPH_BATCH_DESC_INIT;
    d.layout = SPH_LAYOUT_PACKED;
    d.batch = 1;
    d.seq_len = 10;
    d.num_actions = 6;
    d.loss_mask = loss;
    d.sub_seq_lengths = lens;
    d.sub_seq_counts = counts;
    sph_spans_opts o = SPH_SPANS_OPTS_INIT;
    o.gap = 0;
    sph_spans *s;
    expect_ok(sph_spans_build(&d, &o, &s));
    /* columns 5..8 are offsets 1..4 of the second sequence: its rows 0..3 = global 4..7 */
    const uint8_t want[9] = {0, 0, 0, 0, 1, 1, 1, 1, 0};
    assert_int_equal(s->global_rows, 9);
    assert_memory_equal(s->active_mask, want, 9);
    int64_t w[2] = {4, 8};
    expect_spans(s->spans, s->n_spans, w, 1);
    assert_int_equal(s->n_segments, 2);
    sph_spans_free(s);
    /* T=1, C=2: sequence alignment 4; padded [4, 8], cu [0, 4, 12] */
    o.par.cp = 2;
    for (int r = 0; r < 2; r++) {
        o.cp_rank = r;
        expect_ok(sph_spans_build(&d, &o, &s));
        int64_t cu[3] = {0, 4, 12};
        assert_memory_equal(s->cu_seqlens_padded, cu, sizeof cu);
        /* rank 0 holds seg0 rows {0,3}, seg1 rows {0,1,6,7} -> global 4,5 active;
         * rank 1 holds seg0 rows {1,2}, seg1 rows {2,3,4,5} -> global 6,7 active */
        const uint8_t lm[6] = {0, 0, 1, 1, 0, 0};
        assert_int_equal(s->local_rows, 6);
        assert_memory_equal(s->local_mask, lm, 6);
        assert_int_equal(s->local_active_rows, 2);
        sph_spans_free(s);
    }
    /* a loss on the first token of a sequence, or on padding, is an error */
    const uint8_t bad1[6] = {1, 0, 0, 0, 0, 0};
    d.loss_mask = bad1;
    o.par.cp = 1;
    o.cp_rank = 0;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG,
                  "loss_mask[0][0]: is 1 on column 4, the first token of its sequence");
    const uint8_t bad2[6] = {0, 0, 0, 0, 0, 1};
    d.loss_mask = bad2;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG,
                  "loss_mask[0][5]: is 1 but column 9 of row 0 is padding");
}

static void test_packed_attention(void **state) {
    (void)state;
    /* row 0: attended columns 2..6 (left pad 2, right pad 1); row 1: nothing attended */
    const uint8_t att[16] = {0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    const uint8_t loss[8] = {1, 1, 0, 0, 0, 0, 0, 0};
    sph_batch_desc d = SPH_BATCH_DESC_INIT;
    d.layout = SPH_LAYOUT_PACKED;
    d.batch = 2;
    d.seq_len = 8;
    d.num_actions = 4;
    d.loss_mask = loss;
    d.attention_mask = att;
    sph_spans_opts o = SPH_SPANS_OPTS_INIT;
    sph_spans *s;
    expect_ok(sph_spans_build(&d, &o, &s));
    /* column 4 is the sequence's token 2 (row 1), column 5 its token 3 (row 2) */
    const uint8_t want[5] = {0, 1, 1, 0, 0};
    assert_int_equal(s->n_segments, 1);
    assert_int_equal(s->global_rows, 5);
    assert_memory_equal(s->active_mask, want, 5);
    sph_spans_free(s);
    const uint8_t bad[8] = {0, 0, 0, 1, 0, 0, 0, 0};
    d.loss_mask = bad;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG,
                  "loss_mask[0][3]: is 1 but column 7 of row 0 is not attended");
}

static void test_build_errors(void **state) {
    (void)state;
    sph_batch_desc d = desc_a(SPH_LAYOUT_PACKED);
    sph_spans_opts o = SPH_SPANS_OPTS_INIT;
    sph_spans *s;
    expect_status(sph_spans_build(&d, &o, NULL), SPH_ERR_INVALID_ARG, "out: is NULL");
    expect_status(sph_spans_build(NULL, &o, &s), SPH_ERR_INVALID_ARG, "desc: is NULL");
    expect_status(sph_spans_build(&d, NULL, &s), SPH_ERR_INVALID_ARG, "opts: is NULL");
    d.struct_size = 8;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG, "desc.struct_size: 8");
    d = desc_a(SPH_LAYOUT_PACKED);
    o.struct_size = 0;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG, "opts.struct_size: 0");
    o.struct_size = sizeof o;
    o.cp_rank = 1;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG,
                  "opts.cp_rank: 1, expected in [0, 1)");
    o.cp_rank = 0;
    o.gap = -1;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG, "opts.gap: -1");
    o.gap = 128;
    o.par.tp = 0;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG, "opts.par.tp: 0");
    o.par.tp = 1;
    d.layout = (sph_layout_kind)5;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG, "desc.layout: 5");
    d = desc_a(SPH_LAYOUT_PACKED);
    d.batch = -1;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG, "desc.batch: -1");
    d = desc_a(SPH_LAYOUT_PACKED);
    d.seq_len = 0;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG, "desc.seq_len: 0");
    d = desc_a(SPH_LAYOUT_PACKED);
    d.num_actions = 6;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG,
                  "desc.num_actions: 6, expected 0 <= A <= seq_len - 1 = 5");
    d.num_actions = -2;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG, "desc.num_actions: -2");
    d = desc_a(SPH_LAYOUT_PACKED);
    d.loss_mask = NULL;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG, "desc.loss_mask: is NULL");
    const uint8_t two[6] = {0, 2, 0, 0, 0, 0};
    d.loss_mask = two;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG,
                  "loss_mask[0][1]: 2, expected 0 or 1");
    d = desc_a(SPH_LAYOUT_PACKED);
    uint8_t att[12] = {1, 1, 1, 1, 1, 1, 1, 1, 3, 1, 1, 1};
    d.attention_mask = att;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG, "attention_mask[1][2]: 3");
    const int64_t lens[2] = {3, 3}, counts[2] = {1, 1};
    att[8] = 1;
    d.sub_seq_lengths = lens;
    d.sub_seq_counts = counts;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG,
                  "both attention_mask and sub_seq_lengths");
    d.attention_mask = NULL;
    d.layout = SPH_LAYOUT_UNPACKED;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG,
                  "sub_seq_lengths: given with the unpacked layout");
    d.layout = SPH_LAYOUT_PACKED;
    d.sub_seq_counts = NULL;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG, "sub_seq_counts: is NULL");
    const int64_t neg_counts[2] = {1, -1};
    d.sub_seq_counts = neg_counts;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG, "sub_seq_counts[1]: -1");
    d.sub_seq_counts = counts;
    d.sub_seq_lengths = NULL;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG, "sub_seq_lengths: is NULL");
    const int64_t zero[2] = {3, 0};
    d.sub_seq_lengths = zero;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_INVALID_ARG,
                  "sub_seq_lengths[1][0]: 0, expected 1 <= length <= seq_len = 6");
    const int64_t longer[3] = {4, 3, 2}, c2[2] = {2, 1};
    d.sub_seq_lengths = longer;
    d.sub_seq_counts = c2;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_SHAPE,
                  "sub_seq_lengths[0]: sum of lengths exceeds seq_len = 6");
    /* sizes beyond int64 */
    d = desc_a(SPH_LAYOUT_PACKED);
    d.batch = INT64_MAX / 4;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_OVERFLOW, "batch * seq_len overflows");
    d = desc_a(SPH_LAYOUT_PACKED);
    d.batch = 1;
    d.seq_len = INT64_MAX - 1;
    d.num_actions = 0;
    o.par.cp = 2; /* sequence alignment 4: the padded row overflows */
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_OVERFLOW, "overflows int64");
}

static void test_build_alloc_failure(void **state) {
    (void)state;
    /* 2^62 rows: the sizes are representable, the memory is not */
    sph_batch_desc d = SPH_BATCH_DESC_INIT;
    d.batch = 1;
    d.seq_len = (int64_t)1 << 62;
    sph_spans_opts o = SPH_SPANS_OPTS_INIT;
    sph_spans *s = (sph_spans *)&d;
    expect_status(sph_spans_build(&d, &o, &s), SPH_ERR_ALLOC, "out of host memory");
    assert_null(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_from_mask),     cmocka_unit_test(test_from_mask_errors),
        cmocka_unit_test(test_validate),      cmocka_unit_test(test_unpacked),
        cmocka_unit_test(test_unpacked_rejected), cmocka_unit_test(test_packed_rows),
        cmocka_unit_test(test_packed_subseq), cmocka_unit_test(test_packed_attention),
        cmocka_unit_test(test_build_errors), cmocka_unit_test(test_build_alloc_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
