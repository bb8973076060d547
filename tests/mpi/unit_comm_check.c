/*
 * unit_comm_check.c - the communicator pieces that need no launcher (label unit, so it also
 * runs under ASan + UBSan): the configuration verdict of check.c on crafted record arrays
 * (every fault kind, the rank and field it names, world vs group layouts, identical verdicts
 * whatever rank evaluates them), the single-process communicator, and the create functions'
 * answers when the build lacks MPI or NCCL.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/check.h"
#include "comm/comm.h"
#include "testutil.h"

static sph_comm_config cfg_of(int64_t tp, int64_t cp, int64_t dp, int64_t V, int64_t t) {
    sph_comm_config c = SPH_COMM_CONFIG_INIT;
    c.tp = tp;
    c.cp = cp;
    c.dp = dp;
    c.vocab_total = V;
    int64_t base = V / tp;
    c.vocab_start = t * base;
    c.vocab_local = t == tp - 1 ? V - t * base : base;
    c.dtype = SPH_BF16;
    c.temperature = 0.6;
    return c;
}

/* n records of a world laid out by (tp, cp, dp), rank w holding tp_rank w % tp. */
static sph_comm_rec *world(int64_t tp, int64_t cp, int64_t dp, int64_t V) {
    int64_t n = tp * cp * dp;
    sph_comm_rec *r = calloc((size_t)n, sizeof *r);
    assert_non_null(r);
    for (int64_t w = 0; w < n; w++) {
        sph_comm_config c = cfg_of(tp, cp, dp, V, w % tp);
        sph_comm_rec_encode(&c, 1, &r[w]);
    }
    return r;
}

static void expect_verdict(sph_comm_rec *r, int64_t n, int w, sph_status s, const char *needle) {
    expect_status(sph_comm_check_records(r, n, w), s, needle);
}

static void test_good(void **state) {
    (void)state;
    sph_rng g;
    rng_seed(&g, test_seed());
    for (int it = 0; it < 50; it++) {
        int64_t tp = rng_range(&g, 1, 8), cp = rng_range(&g, 1, 3), dp = rng_range(&g, 1, 3);
        int64_t V = rng_range(&g, tp, 5000);
        sph_comm_rec *r = world(tp, cp, dp, V);
        expect_ok(sph_comm_check_records(r, tp * cp * dp, 1));
        expect_ok(sph_comm_check_records(r, tp, 0)); /* the first TP group alone */
        /* uneven but tiling shards are fine: move one boundary */
        if (tp > 1 && r[0].w[SPH_REC_VOCAB_LOCAL] > 1) {
            for (int64_t w = 0; w < tp * cp * dp; w += tp) {
                r[w].w[SPH_REC_VOCAB_LOCAL] -= 1;
                r[w + 1].w[SPH_REC_VOCAB_START] -= 1;
                r[w + 1].w[SPH_REC_VOCAB_LOCAL] += 1;
            }
            expect_ok(sph_comm_check_records(r, tp * cp * dp, 1));
        }
        free(r);
    }
}

static void test_faults(void **state) {
    (void)state;
    const int64_t tp = 4, V = 1000;
    sph_comm_rec *r = world(tp, 1, 1, V);
    sph_comm_rec keep[4];
    memcpy(keep, r, sizeof keep);
#define RESET() memcpy(r, keep, sizeof keep)
    /* a different vocab_total on rank 2 */
    r[2].w[SPH_REC_VOCAB_TOTAL] = 1001;
    expect_verdict(r, tp, 0, SPH_ERR_MISMATCH, "rank 2: cfg.vocab_total is 1001, rank 0 has 1000");
    RESET();
    /* a shard gap between ranks 1 and 2 */
    r[2].w[SPH_REC_VOCAB_START] += 3;
    r[2].w[SPH_REC_VOCAB_LOCAL] -= 3;
    expect_verdict(r, tp, 0, SPH_ERR_MISMATCH, "rank 2: shard [503, 750) leaves a gap [500, 503)");
    RESET();
    /* an overlap */
    r[3].w[SPH_REC_VOCAB_START] -= 1;
    r[3].w[SPH_REC_VOCAB_LOCAL] += 1;
    expect_verdict(r, tp, 0, SPH_ERR_MISMATCH, "rank 3: shard [749, 1000) overlaps rank 2's");
    RESET();
    /* a gap at the start and at the end */
    r[0].w[SPH_REC_VOCAB_START] = 1;
    r[0].w[SPH_REC_VOCAB_LOCAL] = 249;
    expect_verdict(r, tp, 0, SPH_ERR_MISMATCH, "at the start of the vocabulary");
    RESET();
    r[3].w[SPH_REC_VOCAB_LOCAL] -= 1;
    expect_verdict(r, tp, 0, SPH_ERR_MISMATCH, "rank 3: the last TP rank's shard ends at 999");
    RESET();
    /* past the end */
    r[3].w[SPH_REC_VOCAB_LOCAL] += 1;
    expect_verdict(r, tp, 0, SPH_ERR_MISMATCH, "runs past vocab_total 1000");
    RESET();
    /* dtype, temperature (one ulp), tp */
    {
        sph_comm_config c = cfg_of(tp, 1, 1, V, 1);
        c.dtype = SPH_F16;
        sph_comm_rec_encode(&c, 1, &r[1]);
        expect_verdict(r, tp, 0, SPH_ERR_MISMATCH, "rank 1: cfg.dtype is f16, rank 0 has bf16");
        c = cfg_of(tp, 1, 1, V, 1);
        c.temperature = nextafter(0.6, 1.0);
        sph_comm_rec_encode(&c, 1, &r[1]);
        expect_verdict(r, tp, 0, SPH_ERR_MISMATCH, "rank 1: cfg.temperature is 0.6000000000000");
        RESET();
    }
    expect_verdict(r, 3, 0, SPH_ERR_MISMATCH, "the communicator has 3 ranks, but cfg.tp is 4");
    expect_verdict(r, tp, 1, SPH_OK, NULL);
    /* value domains: INVALID_ARG naming the rank */
    struct { int idx; int64_t v; const char *needle; } dom[] = {
        {SPH_REC_TP, 0, "rank 1: cfg.tp is 0, expected >= 1"},
        {SPH_REC_CP, -2, "rank 1: cfg.cp is -2"},
        {SPH_REC_DP, 0, "rank 1: cfg.dp is 0"},
        {SPH_REC_VOCAB_TOTAL, 0, "rank 1: cfg.vocab_total is 0"},
        {SPH_REC_VOCAB_LOCAL, 0, "rank 1: cfg.vocab_local is 0"},
        {SPH_REC_VOCAB_START, -1, "rank 1: cfg.vocab_start is -1"}};
    for (size_t k = 0; k < sizeof dom / sizeof dom[0]; k++) {
        r[1].w[dom[k].idx] = dom[k].v;
        expect_verdict(r, tp, 0, SPH_ERR_INVALID_ARG, dom[k].needle);
        RESET();
    }
    {
        sph_comm_config c = cfg_of(tp, 1, 1, V, 2);
        c.temperature = NAN;
        sph_comm_rec_encode(&c, 1, &r[2]);
        expect_verdict(r, tp, 0, SPH_ERR_INVALID_ARG, "rank 2: cfg.temperature is nan");
        c.temperature = 0;
        sph_comm_rec_encode(&c, 1, &r[2]);
        expect_verdict(r, tp, 0, SPH_ERR_INVALID_ARG, "rank 2: cfg.temperature is 0");
        c = cfg_of(tp, 1, 1, V, 2);
        c.dtype = SPH_I64;
        sph_comm_rec_encode(&c, 1, &r[2]);
        expect_verdict(r, tp, 0, SPH_ERR_INVALID_ARG, "rank 2: cfg.dtype is i64");
        c = cfg_of(tp, 1, 1, V, 2);
        c.struct_size = 8;
        sph_comm_rec_encode(&c, 1, &r[2]);
        expect_verdict(r, tp, 0, SPH_ERR_INVALID_ARG, "rank 2: cfg.struct_size is too small");
        sph_comm_rec_encode(NULL, 1, &r[2]);
        expect_verdict(r, tp, 0, SPH_ERR_INVALID_ARG, "rank 2: cfg is NULL");
        c = cfg_of(tp, 1, 1, V, 2);
        sph_comm_rec_encode(&c, 0, &r[2]);
        expect_verdict(r, tp, 0, SPH_ERR_INVALID_ARG, "rank 2: comm: output pointer is NULL");
        sph_comm_rec_encode(&c, 1, &r[2]);
        r[2].w[SPH_REC_FLAGS] |= SPH_REC_F_ALLOC;
        expect_verdict(r, tp, 0, SPH_ERR_ALLOC, "rank 2: out of host memory");
        r[2].w[SPH_REC_FLAGS] = SPH_REC_F_BACKEND;
        expect_verdict(r, tp, 0, SPH_ERR_UNSUPPORTED, "rank 2: could not set up");
        r[2].w[SPH_REC_FLAGS] = 0;
        r[2].w[SPH_REC_MAGIC] = 42;
        expect_verdict(r, tp, 0, SPH_ERR_MISMATCH, "rank 2: config record tag is 0x2a");
        RESET();
    }
    /* the first offending rank is named, whatever comes later */
    r[1].w[SPH_REC_VOCAB_TOTAL] = 7;
    r[3].w[SPH_REC_TP] = 0;
    expect_verdict(r, tp, 0, SPH_ERR_INVALID_ARG, "rank 3: cfg.tp is 0"); /* domains first */
    RESET();
    /* tp * cp * dp overflow */
    r[0].w[SPH_REC_TP] = INT64_MAX / 2;
    r[0].w[SPH_REC_CP] = 3;
    expect_verdict(r, tp, 0, SPH_ERR_OVERFLOW, "rank 0: cfg.tp * cp * dp overflows");
    RESET();
#undef RESET
    free(r);
}

static void test_world_layout(void **state) {
    (void)state;
    /* 2 x 2 x 2: world size, replicas that shard differently */
    sph_comm_rec *r = world(2, 2, 2, 301);
    expect_verdict(r, 8, 1, SPH_OK, NULL);
    expect_verdict(r, 7, 1, SPH_ERR_MISMATCH,
                   "world has 7 ranks, but cfg.tp * cp * dp = 2 * 2 * 2 = 8");
    r[6].w[SPH_REC_VOCAB_LOCAL] += 10; /* world rank 6 = tp_rank 0 of (cp 1, dp 1) */
    r[7].w[SPH_REC_VOCAB_START] += 10;
    r[7].w[SPH_REC_VOCAB_LOCAL] -= 10;
    expect_verdict(r, 8, 1, SPH_ERR_MISMATCH,
                   "rank 6: shard [0, 160) differs from rank 0's [0, 150)");
    /* the verdict is a pure function: the same message twice */
    sph_comm_check_records(r, 8, 1);
    char first[512];
    snprintf(first, sizeof first, "%s", sph_last_error());
    sph_comm_check_records(r, 8, 1);
    assert_string_equal(first, sph_last_error());
    free(r);
    expect_status(sph_comm_check_records(NULL, 2, 0), SPH_ERR_INTERNAL, "records");
}

static void test_none(void **state) {
    (void)state;
    sph_comm_t c = NULL;
    expect_ok(sph_comm_create_none(&c));
    sph_comm_backend b;
    int64_t rank = -1, size = -1;
    expect_ok(sph_comm_info(c, &b, &rank, &size));
    assert_int_equal(b, SPH_COMM_NONE);
    assert_int_equal(rank, 0);
    assert_int_equal(size, 1);
    char src[13] = "hello, world", dst[13];
    memset(dst, 'x', sizeof dst);
    expect_ok(c->ops->allgather(c, src, dst, sizeof src, NULL));
    assert_memory_equal(src, dst, sizeof src);
    float f[3] = {1, 2, 3};
    expect_ok(c->ops->allreduce_sum_f32(c, f, 3, NULL));
    assert_true(f[0] == 1 && f[1] == 2 && f[2] == 3);
    sph_comm_destroy(c);
    expect_status(sph_comm_create_none(NULL), SPH_ERR_INVALID_ARG, "output pointer");
    expect_status(sph_comm_info(NULL, NULL, NULL, NULL), SPH_ERR_INVALID_ARG, "NULL");
    sph_comm_destroy(NULL);
}

static void test_unsupported(void **state) {
    (void)state;
    sph_comm_config cfg = cfg_of(1, 1, 1, 10, 0);
    sph_comm_t c = (sph_comm_t)&cfg;
#ifndef SPH_HAVE_MPI
    expect_status(sph_comm_create_mpi(&c, &cfg, &cfg), SPH_ERR_UNSUPPORTED, "built without MPI");
    assert_null(c);
    expect_status(sph_comm_create_mpi_world(&c, &cfg, NULL, NULL, NULL), SPH_ERR_UNSUPPORTED,
                  "built without MPI");
#endif
#ifndef SPH_HAVE_NCCL
    expect_status(sph_comm_create_nccl(&c, &cfg, &cfg), SPH_ERR_UNSUPPORTED, "without NCCL");
    assert_null(c);
    expect_status(sph_comm_create_nccl_mpi(&c, &cfg, &cfg), SPH_ERR_UNSUPPORTED, "without NCCL");
#else
    expect_status(sph_comm_create_nccl(&c, NULL, &cfg), SPH_ERR_INVALID_ARG, "nccl_comm is NULL");
#endif
    (void)c;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good),        cmocka_unit_test(test_faults),
        cmocka_unit_test(test_world_layout), cmocka_unit_test(test_none),
        cmocka_unit_test(test_unsupported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
