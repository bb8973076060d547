/*
 * test_distill_validate.c - every bad input of sph_distill_loss fails with its status and a
 * message naming the argument (and the value), and leaves every output untouched (poisoned
 * before, compared byte for byte after); the same values on inactive rows are accepted.
 * Reference and CPU backends. Also: the ranks of a TP group that disagree fail together (in a
 * scalar, the kind, the dense teacher's per-row temperatures, or one rank refusing).
 */
#include <float.h>

#include "parity/test_distill_case.h"

typedef struct snap {
    unsigned char *loss, *dh, *dw;
} snap;

static void expect_bad(const char *kernel, dcase *c, sph_status s, const char *needle) {
    snap sn = {hc_dup(c->loss, (size_t)c->N * 4), hc_dup(c->dh, (size_t)(c->N * c->H) * 4),
               hc_dup(c->dw, (size_t)(c->V_loc * c->H) * 4)};
    sph_ctx_t ctx = hc_ctx(kernel, 1, NULL);
    size_t bytes = 0;
    sph_status st = sph_distill_loss_workspace_size(ctx, &c->a, &c->d, &bytes);
    if (st == SPH_OK) {
        void *ws = hc_alloc(bytes + 1);
        st = sph_distill_loss(ctx, &c->a, &c->d, ws, bytes);
        free(ws);
    }
    if (st != s || !strstr(sph_last_error(), needle)) {
        print_error("[%s] expected status %d with '%s', got %d: %s\n", kernel ? kernel : "cpu",
                    (int)s, needle, (int)st, sph_last_error());
        fail();
    }
    assert_memory_equal(c->loss, sn.loss, (size_t)c->N * 4);
    assert_memory_equal(c->dh, sn.dh, (size_t)(c->N * c->H) * 4);
    assert_memory_equal(c->dw, sn.dw, (size_t)(c->V_loc * c->H) * 4);
    free(sn.loss), free(sn.dh), free(sn.dw);
    sph_ctx_destroy(ctx);
}

static void expect_good(const char *kernel, dcase *c) {
    sph_ctx_t ctx = hc_ctx(kernel, 1, NULL);
    expect_ok(dc_run(ctx, c));
    sph_ctx_destroy(ctx);
}

#define N_ 6
#define H_ 4
#define V_ 9
#define K_ 3

static void fresh(dcase *c, sph_rng *r, int dense) {
    dc_init(c, r, N_, H_, V_, 3, K_, SPH_F32, dense, DC_PAD);
    dc_mask(c, r, 0.5);
    c->mask[0] = 1, c->mask[1] = 0;
    c->kind = SPH_DISTILL_JSD, c->beta = 0.3;
    dc_wire(c, DC_DH | DC_DW);
    dc_poison(c);
}

static void bad_inputs(const char *kernel) {
    sph_rng r;
    rng_seed(&r, test_seed());
    dcase c;
    int64_t bad_shape[2];
    sph_tensor t;
#define CASE(dense, setup, status, needle)                                                    \
    do {                                                                                      \
        fresh(&c, &r, dense);                                                                 \
        setup;                                                                                \
        expect_bad(kernel, &c, status, needle);                                               \
        dc_free(&c);                                                                          \
    } while (0)
    CASE(0, c.d.kind = (sph_distill_kind)7, SPH_ERR_INVALID_ARG, "distill.kind: 7");
    CASE(0, c.d.reduction = (sph_reduction)9, SPH_ERR_INVALID_ARG, "distill.reduction: 9");
    CASE(0, c.d.beta = -0.1, SPH_ERR_INVALID_ARG, "distill.beta: -0.1");
    CASE(0, c.d.beta = 1.5, SPH_ERR_INVALID_ARG, "distill.beta: 1.5");
    CASE(0, c.d.beta = NAN, SPH_ERR_INVALID_ARG, "distill.beta: nan");
    CASE(1, c.d.teacher_temperature = -1, SPH_ERR_INVALID_ARG, "teacher_temperature");
    CASE(1, c.d.teacher_temperature = NAN, SPH_ERR_INVALID_ARG, "teacher_temperature");
    CASE(1, c.d.teacher_temperature = INFINITY, SPH_ERR_INVALID_ARG, "teacher_temperature");
    CASE(0, c.a.temperature = 0, SPH_ERR_INVALID_ARG, "temperature");
    CASE(0, c.d.teacher_topk_ids = NULL; c.d.teacher_topk_logprobs = NULL, SPH_ERR_INVALID_ARG,
         "teacher: none given");
    CASE(1, c.d.teacher_weight = NULL, SPH_ERR_INVALID_ARG, "teacher_weight: NULL");
    CASE(0, c.d.teacher_topk_logprobs = NULL, SPH_ERR_INVALID_ARG, "teacher_topk_logprobs: NULL");
    CASE(1, c.d.teacher_topk_ids = &c.t_h, SPH_ERR_INVALID_ARG, "both a dense");
    /* shapes: teacher rows, the student's sharding, K, loss */
    CASE(1, bad_shape[0] = N_ - 1; bad_shape[1] = 3; t = c.t_th; t.shape = bad_shape;
         c.d.teacher_hidden = &t, SPH_ERR_SHAPE, "teacher_hidden");
    CASE(1, bad_shape[0] = V_ - 1; bad_shape[1] = 3; t = c.t_tw; t.shape = bad_shape;
         c.d.teacher_weight = &t, SPH_ERR_SHAPE, "teacher_weight");
    CASE(1, bad_shape[0] = V_; bad_shape[1] = 2; t = c.t_tw; t.shape = bad_shape;
         c.d.teacher_weight = &t, SPH_ERR_SHAPE, "teacher_weight");
    CASE(1, t = c.t_tw; t.dtype = SPH_BF16; c.d.teacher_weight = &t, SPH_ERR_DTYPE, "teacher_weight");
    CASE(0, bad_shape[0] = N_ + 1; bad_shape[1] = K_; t = c.t_lp; t.shape = bad_shape;
         c.d.teacher_topk_logprobs = &t, SPH_ERR_SHAPE, "teacher_topk_logprobs");
    CASE(0, bad_shape[0] = N_; bad_shape[1] = K_ - 1; t = c.t_lp; t.shape = bad_shape;
         c.d.teacher_topk_logprobs = &t, SPH_ERR_SHAPE, "teacher_topk_logprobs");
    CASE(0, bad_shape[0] = N_; bad_shape[1] = 0; t = c.t_ids; t.shape = bad_shape;
         c.d.teacher_topk_ids = &t; t.data = c.ids, SPH_ERR_SHAPE, "teacher_topk_ids");
    CASE(0, t = c.t_lp; t.dtype = SPH_F64; c.d.teacher_topk_logprobs = &t, SPH_ERR_DTYPE,
         "teacher_topk_logprobs");
    CASE(0, bad_shape[0] = 2; t = c.t_loss; t.shape = bad_shape; c.d.loss = &t, SPH_ERR_SHAPE, "loss");
    CASE(0, c.d.loss = NULL, SPH_ERR_INVALID_ARG, "loss: NULL");
    /* values on an active row (row 0) */
    CASE(0, c.ids[0] = V_, SPH_ERR_INVALID_ARG, "teacher_topk_ids[0, 0]: 9");
    CASE(0, c.ids[0] = -2, SPH_ERR_INVALID_ARG, "teacher_topk_ids[0, 0]: -2");
    CASE(0, c.ids[2] = c.ids[0], SPH_ERR_INVALID_ARG, "appears twice");
    CASE(0, c.lp[0] = 0.01f, SPH_ERR_INVALID_ARG, "teacher_topk_logprobs[0, 0]");
    CASE(0, c.lp[0] = NAN, SPH_ERR_INVALID_ARG, "teacher_topk_logprobs[0, 0]");
    CASE(0, c.lp[0] = -INFINITY, SPH_ERR_INVALID_ARG, "teacher_topk_logprobs[0, 0]");
    CASE(0, c.lp[0] = -0.1f; c.lp[2] = -0.5f, SPH_ERR_INVALID_ARG, "sum to");
    CASE(0, c.d.dloss = &c.t_loss, SPH_ERR_INVALID_ARG, "dloss: given with reduction mean (0)");
    /* the head's fields the loss does not take */
    CASE(0, c.a.targets = &c.t_loss, SPH_ERR_INVALID_ARG, "head.targets");
    CASE(0, c.a.logprob = &c.t_loss, SPH_ERR_INVALID_ARG, "head.logprob");
    CASE(0, c.a.stats = &c.t_loss, SPH_ERR_INVALID_ARG, "head.stats");
    CASE(0, dc_trows(&c, &r, 0.5, 1.5); c.trows[0] = -1.0f; dc_wire(&c, DC_DH | DC_DW);
         dc_poison(&c), SPH_ERR_INVALID_ARG, "temperature_rows[0]");
    CASE(0, dc_trows(&c, &r, 0.5, 1.5); dc_wire(&c, DC_DH | DC_DW); c.a.temperature = 2.0;
         dc_poison(&c), SPH_ERR_INVALID_ARG, "temperature");
    CASE(0, c.a.vocab_total = 2 * V_, SPH_ERR_INVALID_ARG, "no tensor-parallel group");
    /* the teacher's temperature: per row (every row checked, an inactive one too), not with the
     * scalar, and neither with a sparse teacher */
    CASE(1, dc_ttrows(&c, &r, 0.5, 1.5); c.ttrows[1] = 0.0f; dc_wire(&c, DC_DH | DC_DW);
         dc_poison(&c), SPH_ERR_INVALID_ARG, "teacher_temperature_rows[1]: 0");
    CASE(1, dc_ttrows(&c, &r, 0.5, 1.5); c.ttrows[3] = NAN; dc_wire(&c, DC_DH | DC_DW);
         dc_poison(&c), SPH_ERR_INVALID_ARG, "teacher_temperature_rows[3]: nan");
    CASE(1, dc_ttrows(&c, &r, 0.5, 1.5); c.ttrows[0] = -INFINITY; dc_wire(&c, DC_DH | DC_DW);
         dc_poison(&c), SPH_ERR_INVALID_ARG, "teacher_temperature_rows[0]: -inf");
    CASE(1, dc_ttrows(&c, &r, 0.5, 1.5); c.ttrows[2] = 1e-39f; dc_wire(&c, DC_DH | DC_DW);
         dc_poison(&c), SPH_ERR_INVALID_ARG, "teacher_temperature_rows[2]");
    CASE(1, dc_ttrows(&c, &r, 0.5, 1.5); dc_wire(&c, DC_DH | DC_DW); c.d.teacher_temperature = 2;
         dc_poison(&c), SPH_ERR_INVALID_ARG, "teacher_temperature: 2 given together with "
         "teacher_temperature_rows");
    CASE(1, dc_ttrows(&c, &r, 0.5, 1.5); dc_wire(&c, DC_DH | DC_DW); bad_shape[0] = N_ - 1;
         t = c.t_ttr; t.shape = bad_shape; c.d.teacher_temperature_rows = &t, SPH_ERR_SHAPE,
         "teacher_temperature_rows");
    CASE(1, dc_ttrows(&c, &r, 0.5, 1.5); dc_wire(&c, DC_DH | DC_DW); t = c.t_ttr;
         t.dtype = SPH_F64; c.d.teacher_temperature_rows = &t, SPH_ERR_DTYPE,
         "teacher_temperature_rows");
    CASE(0, dc_ttrows(&c, &r, 0.5, 1.5); dc_wire(&c, DC_DH | DC_DW); dc_poison(&c),
         SPH_ERR_INVALID_ARG, "teacher_temperature_rows: given with a sparse teacher");
    CASE(0, c.d.teacher_temperature = 1.5, SPH_ERR_INVALID_ARG,
         "teacher_temperature: given with a sparse teacher");
    /* aliasing: outputs against inputs and outputs */
    CASE(0, c.t_loss.data = c.h, SPH_ERR_INVALID_ARG, "loss");
    CASE(1, c.t_dh.data = c.th, SPH_ERR_INVALID_ARG, "teacher_hidden");
    CASE(0, c.t_dh.data = c.lp, SPH_ERR_INVALID_ARG, "teacher_topk_logprobs");
    CASE(0, c.t_loss.data = c.dw, SPH_ERR_INVALID_ARG, "dweight");
    CASE(1, dc_ttrows(&c, &r, 0.5, 1.5); dc_wire(&c, DC_DH | DC_DW); c.t_loss.data = c.ttrows;
         dc_poison(&c), SPH_ERR_INVALID_ARG, "teacher_temperature_rows");
#undef CASE
    /* dloss non-finite on an active row (reduction none) */
    fresh(&c, &r, 0);
    c.red = SPH_REDUCTION_NONE;
    dc_wire(&c, DC_DH | DC_DW | DC_DLOSS);
    c.dloss[0] = NAN;
    expect_bad(kernel, &c, SPH_ERR_INVALID_ARG, "dloss[0]: nan");
    /* ... and every bad value on an inactive row (row 1) is never read */
    c.dloss[0] = 1, c.dloss[1] = NAN;
    c.ids[K_] = V_ + 5, c.lp[K_ + 1] = 3.0f, c.ids[K_ + 2] = c.ids[K_];
    expect_good(kernel, &c);
    dc_free(&c);
    /* the argument block's layout before teacher_temperature_rows: accepted, the field not
     * read (a NaN there would be refused); one byte shorter: refused */
    fresh(&c, &r, 1);
    dc_ttrows(&c, &r, 0.5, 1.5);
    c.ttrows[0] = NAN;
    dc_wire(&c, DC_DH | DC_DW);
    dc_poison(&c);
    c.d.struct_size = offsetof(sph_distill_args, teacher_temperature_rows);
    expect_good(kernel, &c);
    c.d.struct_size -= 1;
    expect_bad(kernel, &c, SPH_ERR_INVALID_ARG, "distill.struct_size");
    dc_free(&c);
    /* NaN in hidden on an active row: SPH_ERR_NONFINITE, loss and dweight untouched */
    fresh(&c, &r, 1);
    hc_set(c.h, SPH_F32, 1, NAN);
    c.a.dhidden = NULL;
    expect_bad(kernel, &c, SPH_ERR_NONFINITE, "non-finite");
    dc_free(&c);
}

static void test_bad_inputs_cpu(void **state) {
    (void)state;
    bad_inputs(NULL);
}

static void test_bad_inputs_ref(void **state) {
    (void)state;
    bad_inputs("ref");
}

// ---- a TP group that disagrees -----------------------------------------------------------

typedef struct mjob {
    tp_group *g;
    int64_t rank;
    dcase c;
    sph_status st;
} mjob;

static void *mrank(void *arg) {
    mjob *j = arg;
    struct sph_comm comm = tp_comm_of(j->g, j->rank);
    sph_ctx_t ctx = NULL;
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.num_threads = 1;
    o.tp_comm = &comm;
    j->st = sph_ctx_create(&ctx, &o);
    if (j->st == SPH_OK) {
        /* the call itself even when this rank's workspace query fails: the group's agreement
         * is inside sph_distill_loss, which every rank must enter */
        size_t bytes = 0;
        sph_distill_loss_workspace_size(ctx, &j->c.a, &j->c.d, &bytes);
        void *ws = hc_alloc(bytes + 1);
        j->st = sph_distill_loss(ctx, &j->c.a, &j->c.d, ws, bytes);
        free(ws);
    }
    sph_ctx_destroy(ctx);
    return NULL;
}

static void test_tp_mismatch(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    for (int what = 0; what < 4; what++) {
        dcase full;
        dc_init(&full, &r, 5, 3, 8, 3, 3, SPH_F32, what == 3, DC_PAD);
        full.kind = SPH_DISTILL_JSD;
        float *tt1 = NULL; /* what 3: rank 1's own teacher temperatures, one of them other */
        if (what == 3) {
            dc_ttrows(&full, &r, 0.5, 1.5);
            tt1 = hc_dup(full.ttrows, 5 * 4);
            tt1[4] *= 1.5f;
        }
        tp_group g;
        tp_group_init(&g, 2);
        mjob j[2];
        pthread_t th[2];
        for (int k = 0; k < 2; k++) {
            memset(&j[k], 0, sizeof j[k]);
            j[k].g = &g, j[k].rank = k, j[k].c = full;
            j[k].c.v0 = 4 * k, j[k].c.V_loc = 4;
            if (k == 1 && tt1) j[k].c.ttrows = tt1;
            j[k].c.loss = hc_alloc(5 * 4), j[k].c.dh = hc_alloc(5 * 3 * 4), j[k].c.dw = hc_alloc(4 * 3 * 4);
            dc_wire(&j[k].c, DC_DH | DC_DW);
            dc_poison(&j[k].c);
        }
        if (what == 0) j[1].c.d.beta = 0.25;                    /* a scalar */
        if (what == 1) j[1].c.d.kind = SPH_DISTILL_FORWARD_KL;  /* the kind */
        if (what == 2) j[1].c.d.beta = 7;                       /* one rank refuses */
        /* what 3: the dense teacher's per-row temperatures differ in row 4 */
        float *lsnap = hc_dup(j[0].c.loss, 5 * 4);
        for (int k = 0; k < 2; k++) assert_int_equal(pthread_create(&th[k], NULL, mrank, &j[k]), 0);
        for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
        tp_group_destroy(&g);
        for (int k = 0; k < 2; k++) {
            const sph_status want = what == 2 ? SPH_ERR_INVALID_ARG : SPH_ERR_MISMATCH;
            if (j[k].st != want) {
                print_error("mismatch %d: rank %d got %d, expected %d\n", what, k, (int)j[k].st,
                            (int)want);
                fail();
            }
        }
        assert_memory_equal(j[0].c.loss, lsnap, 5 * 4);
        free(lsnap);
        for (int k = 0; k < 2; k++) free(j[k].c.loss), free(j[k].c.dh), free(j[k].c.dw);
        free(tt1);
        dc_free(&full);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_inputs_cpu),
        cmocka_unit_test(test_bad_inputs_ref),
        cmocka_unit_test(test_tp_mismatch),
    };
    return test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
