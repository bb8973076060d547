/*
 * test_head_validate.c - every bad input of the LM head is rejected with a clear message
 * before any output is written (outputs poisoned, checked untouched afterwards).
 */
#include "../parity/test_head_case.h"

/* ref, then the optimized CPU backend once it exists */
#define N_KERNELS 2
static hcase C;
static sph_ctx_t CTX;

static void setup_case(void) {
    sph_rng r;
    rng_seed(&r, test_seed());
    hc_free(&C);
    hc_init(&C, &r, 6, 5, 8, 8, 0, 0, SPH_F32);
    hc_wire(&C, HC_LP | HC_ENT | HC_LSE | HC_LM);
}

/* Expects status and message for both passes' entry points, and every output untouched:
 * logprob, entropy, lse, logit_mean, stats, dhidden and dweight are poisoned with a pattern
 * before the call and must hold it bitwise after (the args of a bad call may point at any
 * of them). */
static void expect_bad(sph_head_pass pass, sph_status s, const char *needle) {
    size_t bytes = 0;
    expect_status(sph_head_workspace_size(CTX, pass, &C.a, &bytes), s, needle);
    void *outs[7] = {C.lp, C.ent, C.lse, C.lm, C.stats, C.dh, C.dw};
    const char *names[7] = {"logprob", "entropy", "lse", "logit_mean", "stats", "dhidden",
                            "dweight"};
    const size_t sz[7] = {(size_t)C.N * 4, (size_t)C.N * 4, (size_t)C.N * 4, (size_t)C.N * 4,
                          (size_t)C.N * 12, (size_t)(C.N * C.H) * 4, (size_t)(C.V_loc * C.H) * 4};
    for (int k = 0; k < 7; k++) poison_bytes(outs[k], sz[k]);
    static char ws[4096] __attribute__((aligned(64)));
    if (pass == SPH_HEAD_FORWARD)
        expect_status(sph_head_forward(CTX, &C.a, ws, sizeof ws), s, needle);
    else
        expect_status(sph_head_backward(CTX, &C.a, ws, sizeof ws), s, needle);
    for (int k = 0; k < 7; k++)
        for (size_t b = 0; b < sz[k]; b++)
            if (((const unsigned char *)outs[k])[b] != 0xff) {
                print_error("%s after a call that failed with '%s': byte %zu written\n",
                            names[k], needle ? needle : "", b);
                fail();
            }
}

static void test_bad_inputs(void **state) {
    (void)state;
    const char *kernels[] = {"ref", NULL};
    for (int kk = 0; kk < N_KERNELS; kk++) {
        sph_ctx_destroy(CTX);
        CTX = hc_ctx(kernels[kk], 1, NULL);
        setup_case();
        size_t bytes;
        expect_ok(sph_head_workspace_size(CTX, SPH_HEAD_FORWARD, &C.a, &bytes));

        C.a.hidden = NULL;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "hidden: tensor pointer is NULL");
        setup_case();
        C.th.data = NULL;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "hidden: data pointer is NULL");
        setup_case();
        C.sh_w[1] = 4;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_SHAPE, "weight: shape[1] is 4, expected 5");
        setup_case();
        C.tw.dtype = SPH_BF16;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_DTYPE, "weight: dtype is bf16, expected f32");
        setup_case();
        C.th.dtype = SPH_F64, C.tw.dtype = SPH_F64;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_DTYPE, "hidden: dtype is f64");
        setup_case();
        int64_t strides[2] = {5, 2};
        C.th.strides = strides;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_SHAPE, "hidden: inner stride is 2");
        setup_case();
        C.th.device.type = SPH_DEVICE_CUDA;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_DEVICE, "hidden: device");
        setup_case();
        C.tlp.device.type = SPH_DEVICE_CUDA;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_DEVICE, "logprob: device");
        setup_case();
        C.a.temperature = 0;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "temperature: 0");
        C.a.temperature = NAN;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "temperature: nan");
        C.a.temperature = 1;
        C.a.softcap = -1;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "softcap: -1");
        C.a.softcap = INFINITY;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "softcap: inf");
        setup_case();
        C.tgt[2] = 8;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "targets[2]: 8, expected < vocab_total");
        setup_case();
        C.a.vocab_total = 10, C.a.vocab_start = 3;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "vocab_start: shard [3, 11)");
        C.a.vocab_start = -1;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "vocab_start");
        setup_case();
        C.a.stats = NULL;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "stats: NULL");
        setup_case();
        C.sh_s[1] = 2;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_SHAPE, "stats: shape[1] is 2");
        setup_case();
        C.sh_n[0] = 5; /* every (N) vector at once: the first one named is logprob? targets */
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_SHAPE, "targets: shape[0] is 5, expected 6");
        setup_case();
        C.a.targets = NULL;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "logprob: requested without targets");

        // spans
        setup_case();
        int64_t sp[6] = {0, 2, 1, 4, 5, 6};
        C.a.spans = sp, C.a.n_spans = 3;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "spans[1]: starts at 1");
        sp[2] = 3, sp[3] = 2;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "spans[1]: [3, 2), expected 0 <= start < end");
        sp[2] = 2, sp[3] = 4, sp[5] = 7;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "spans[2]: [5, 7), expected 0 <= start < end <= n = 6");
        sp[5] = 6;
        C.mask = hc_alloc(6);
        memset(C.mask, 1, 6);
        hc_wire(&C, HC_LP | HC_MASK);
        C.a.spans = sp, C.a.n_spans = 3;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "active row 4");
        C.mask[4] = 0;
        C.a.logprob = NULL;
        expect_ok(hc_run(CTX, SPH_HEAD_FORWARD, &C.a));
        C.mask[4] = 2;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "active_mask[4]: 2");
        free(C.mask), C.mask = NULL;

        // an active_mask of the wrong length (one short, one long, 2-d): refused by name,
        // both passes, one-pass too, nothing written (a mask read past its end or short of
        // the rows would be a silent wrong answer)
        for (int variant = 0; variant < 3; variant++) {
            setup_case();
            C.mask = hc_alloc(8);
            memset(C.mask, 1, 8);
            int64_t msh[2] = {variant == 0 ? 5 : 7, 1};
            int64_t msh2[2] = {6, 2};
            sph_tensor tm = {C.mask, {SPH_DEVICE_CPU, 0}, variant == 2 ? 2 : 1, SPH_U8,
                             variant == 2 ? msh2 : msh, NULL, 0};
            const char *want = variant == 0   ? "active_mask: shape[0] is 5, expected 6"
                               : variant == 1 ? "active_mask: shape[0] is 7, expected 6"
                                              : "active_mask: ndim is 2, expected 1";
            hc_wire(&C, HC_LP | HC_ENT);
            C.a.active_mask = &tm;
            expect_bad(SPH_HEAD_FORWARD, SPH_ERR_SHAPE, want);
            hc_wire(&C, HC_G | HC_DH | HC_DW);
            C.a.active_mask = &tm;
            expect_bad(SPH_HEAD_BACKWARD, SPH_ERR_SHAPE, want);
            hc_wire(&C, HC_OUTS | HC_UPS | HC_DH | HC_DW);
            C.a.active_mask = &tm;
            expect_bad(SPH_HEAD_FORWARD, SPH_ERR_SHAPE, want);
            free(C.mask), C.mask = NULL;
        }

        // candidates
        setup_case();
        int64_t cand[6 * 3];
        for (int64_t i = 0; i < 6; i++) {
            cand[i * 3] = C.tgt[i] < 0 ? 0 : C.tgt[i];
            cand[i * 3 + 1] = (cand[i * 3] + 1) % 8;
            cand[i * 3 + 2] = -1;
        }
        int64_t csh[2] = {6, 3};
        sph_tensor tc = {cand, {SPH_DEVICE_CPU, 0}, 2, SPH_I64, csh, NULL, 0};
        hc_wire(&C, HC_LP | HC_ENT);
        C.a.candidates = &tc;
        expect_ok(hc_run(CTX, SPH_HEAD_FORWARD, &C.a));
        cand[4 * 3 + 2] = cand[4 * 3 + 1];
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "candidates[4, :]: id");
        cand[4 * 3 + 2] = -1;
        cand[0] = (C.tgt[0] + 2) % 8;
        if (C.tgt[0] >= 0)
            expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "is not among candidates[0, :]");
        cand[0] = 9;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "candidates[0, 0]: 9");
        cand[0] = C.tgt[0] < 0 ? 0 : C.tgt[0];
        C.a.logit_mean = &C.tlm;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "logit_mean: not defined");
        C.a.logit_mean = NULL;
        C.a.dlogit_mean = &C.tgm, C.a.dhidden = &C.tdh;
        expect_bad(SPH_HEAD_BACKWARD, SPH_ERR_INVALID_ARG, "dlogit_mean: given in sample-support");

        // backward
        setup_case();
        hc_wire(&C, HC_G);
        expect_bad(SPH_HEAD_BACKWARD, SPH_ERR_INVALID_ARG, "both NULL");
        hc_wire(&C, HC_G | HC_DH);
        C.a.targets = NULL;
        expect_bad(SPH_HEAD_BACKWARD, SPH_ERR_INVALID_ARG, "dlogprob: given without targets");
        hc_wire(&C, HC_G | HC_DH);
        C.tdh.dtype = SPH_F16;
        expect_bad(SPH_HEAD_BACKWARD, SPH_ERR_DTYPE, "dhidden: dtype is f16, expected f32");
        hc_wire(&C, HC_G | HC_DH | HC_DW);
        C.sh_dw[0] = 7;
        expect_bad(SPH_HEAD_BACKWARD, SPH_ERR_SHAPE, "dweight: shape[0] is 7, expected 8");
        hc_wire(&C, HC_GL | HC_DH);
        C.tgl.dtype = SPH_F64;
        expect_bad(SPH_HEAD_BACKWARD, SPH_ERR_DTYPE, "dlse: dtype is f64");
        hc_wire(&C, HC_G | HC_DH);
        C.a.allreduce_dhidden = 1;
        expect_bad(SPH_HEAD_BACKWARD, SPH_ERR_INVALID_ARG, "allreduce_dhidden: set but");

        // one-pass forward: errors found last in validation still leave every output as it was
        setup_case();
        hc_wire(&C, HC_OUTS | HC_UPS | HC_DH | HC_DW);
        C.tgm.dtype = SPH_F64;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_DTYPE, "dlogit_mean: dtype is f64");
        hc_wire(&C, HC_OUTS | HC_UPS | HC_DH | HC_DW);
        C.a.allreduce_dhidden = 1;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "allreduce_dhidden: set but");
        hc_wire(&C, HC_OUTS | HC_UPS | HC_DH | HC_DW);
        C.sh_dw[1] = 4;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_SHAPE, "dweight: shape[1] is 4");
        hc_wire(&C, HC_OUTS | HC_UPS | HC_DH | HC_DW);
        C.a.accumulate_dhidden = C.a.accumulate_dweight = 1;
        C.a.temperature = -2;
        expect_bad(SPH_HEAD_FORWARD, SPH_ERR_INVALID_ARG, "temperature: -2");

        // workspace
        hc_wire(&C, HC_LP | HC_G | HC_DH | HC_DW);
        expect_ok(sph_head_workspace_size(CTX, SPH_HEAD_FORWARD, &C.a, &bytes));
        if (bytes > 0) {
            expect_status(sph_head_forward(CTX, &C.a, NULL, bytes - 1), SPH_ERR_WORKSPACE,
                          "workspace_bytes");
            expect_status(sph_head_forward(CTX, &C.a, NULL, bytes), SPH_ERR_WORKSPACE,
                          "workspace: NULL");
        }
        expect_status(sph_head_workspace_size(CTX, SPH_HEAD_FORWARD, &C.a, NULL),
                      SPH_ERR_INVALID_ARG, "bytes: NULL");
        expect_status(sph_head_forward(NULL, &C.a, NULL, 0), SPH_ERR_INVALID_ARG, "ctx: NULL");
        expect_status(sph_head_forward(CTX, NULL, NULL, 0), SPH_ERR_INVALID_ARG, "args: NULL");
        sph_head_args old = C.a;
        C.a.struct_size = 8;
        expect_status(sph_head_forward(CTX, &C.a, NULL, 0), SPH_ERR_INVALID_ARG,
                      "args.struct_size");
        C.a = old;
    }
    sph_ctx_destroy(CTX);
    CTX = NULL;
    hc_free(&C);
    memset(&C, 0, sizeof C);
}

/* The non-finite policy (spanhead.h, "Policies"): NaN or infinity in hidden makes the rows'
 * statistics non-finite; the forward says so (SPH_ERR_NONFINITE, the count and the first row),
 * writes no output, and sph_ctx_nonfinite reports the rows once. Also through one-pass, sample
 * support and the backward (non-finite upstream gradient of an active row). */
static void test_nonfinite_rows(void **state) {
    (void)state;
    const char *kernels[] = {"ref", NULL};
    for (int kk = 0; kk < N_KERNELS; kk++)
        for (int K = 0; K <= 3; K += 3)
            for (int one_pass = 0; one_pass < 2; one_pass++) {
                sph_ctx_t ctx = hc_ctx(kernels[kk], 2, NULL);
                sph_rng r;
                rng_seed(&r, test_seed() + 9);
                hcase c;
                hc_init(&c, &r, 9, 6, 37, 37, 0, K, SPH_F32);
                ((float *)c.h)[5 * 6 + 3] = NAN;
                ((float *)c.h)[2 * 6 + 1] = INFINITY;
                hc_wire(&c, HC_LP | HC_ENT | HC_LSE | HC_G | (one_pass ? HC_DH | HC_DW : 0));
                hc_poison(&c);
                /* one-pass: refused before the sweep by the scan of the active hidden rows */
                expect_status(hc_run(ctx, SPH_HEAD_FORWARD, &c.a), SPH_ERR_NONFINITE,
                              one_pass ? "2 active rows with non-finite inputs"
                                       : "2 active rows have non-finite statistics");
                assert_non_null(strstr(sph_last_error(), "the first row 2"));
                for (int64_t i = 0; i < 9; i++) { /* nothing written: still poisoned */
                    assert_true(isnan(c.lp[i]) && isnan(c.ent[i]) && isnan(c.stats[3 * i]));
                    if (one_pass) assert_true(isnan(((float *)c.dh)[i * 6]));
                }
                int64_t n = -1, first = -7;
                expect_ok(sph_ctx_nonfinite(ctx, &n, &first));
                assert_int_equal(n, 2);
                assert_int_equal(first, 2);
                expect_ok(sph_ctx_nonfinite(ctx, &n, &first)); /* reset by the query */
                assert_int_equal(n, 0);
                assert_int_equal(first, -1);
                /* masked out, the bad rows are never read */
                c.mask = hc_alloc(9);
                for (int i = 0; i < 9; i++) c.mask[i] = i != 2 && i != 5;
                hc_wire(&c, HC_LP | HC_ENT | HC_LSE | HC_G | HC_MASK |
                                (one_pass ? HC_DH | HC_DW : 0));
                expect_ok(hc_run(ctx, SPH_HEAD_FORWARD, &c.a));
                for (int64_t i = 0; i < 9; i++) assert_true(isfinite(c.lp[i]));
                /* the backward: a NaN upstream gradient of an active row, refused unwritten */
                hc_wire(&c, HC_G | HC_DH | HC_MASK);
                c.g[4] = NAN;
                poison_bytes(c.dh, 9 * 6 * 4);
                expect_status(hc_run(ctx, SPH_HEAD_BACKWARD, &c.a), SPH_ERR_NONFINITE,
                              "first row 4");
                assert_true(isnan(((float *)c.dh)[0]));
                c.g[5] = NAN; /* row 5 is masked out: its gradient is never read */
                c.g[4] = 0.5f;
                expect_ok(hc_run(ctx, SPH_HEAD_BACKWARD, &c.a));
                sph_ctx_destroy(ctx);
                hc_free(&c);
            }
}

/* Host passes with gradients write nothing when an active hidden row is non-finite, even
 * when the row sits in a later chunk than the first (a one-pass sweep used to write the
 * earlier chunks' gradient rows before it found the row): one-pass forward and backward, plain
 * and accumulated gradients, f32 and bf16, the ref and CPU kernels, NaN and inf. A NaN in an
 * inactive row is never read. */
static void test_nonfinite_later_chunk(void **state) {
    (void)state;
    const char *kernels[] = {"ref", NULL};
    const sph_dtype dts[] = {SPH_F32, SPH_BF16};
    for (int kk = 0; kk < N_KERNELS; kk++)
        for (int d = 0; d < 2; d++)
            for (int acc = 0; acc < 2; acc++) {
                sph_ctx_opts o = SPH_CTX_OPTS_INIT;
                o.force_kernel = kernels[kk];
                o.num_threads = 2;
                o.chunk_rows = 16; /* 200 rows: 13 chunks */
                sph_ctx_t ctx = NULL;
                expect_ok(sph_ctx_create(&ctx, &o));
                sph_rng r;
                rng_seed(&r, test_seed() + 31 + kk * 4 + d * 2 + acc);
                hcase c;
                const int64_t N = 200, H = 24, V = 53, bad = 170;
                hc_init(&c, &r, N, H, V, V, 0, 0, dts[d]);
                c.mask = hc_alloc((size_t)N);
                for (int64_t i = 0; i < N; i++) c.mask[i] = i % 7 != 3;
                if (dts[d].bits == 32) ((float *)c.h)[bad * H + 5] = acc ? INFINITY : NAN;
                else ((uint16_t *)c.h)[bad * H + 5] = acc ? 0x7F80 : 0x7FC0;
                for (int pass = 0; pass < 2; pass++) {
                    const int bwd = pass == 1;
                    hc_wire(&c, HC_LP | HC_G | HC_MASK | HC_DH | HC_DW);
                    c.a.accumulate_dhidden = c.a.accumulate_dweight = acc;
                    hc_poison(&c);
                    if (bwd) { /* finite stats from a forward, as if the hidden row changed */
                        for (int64_t i = 0; i < 3 * N; i++) c.stats[i] = 0.5f;
                        c.a.logprob = NULL;
                    }
                    const size_t dhb = (size_t)(N * H) * 4, dwb = (size_t)(V * H) * 4;
                    uint8_t *dh0 = hc_alloc(dhb), *dw0 = hc_alloc(dwb);
                    memcpy(dh0, c.dh, dhb), memcpy(dw0, c.dw, dwb);
                    expect_status(hc_run(ctx, bwd ? SPH_HEAD_BACKWARD : SPH_HEAD_FORWARD, &c.a),
                                  SPH_ERR_NONFINITE, "the first row 170; nothing written");
                    assert_memory_equal(c.dh, dh0, dhb);
                    assert_memory_equal(c.dw, dw0, dwb);
                    if (!bwd)
                        for (int64_t i = 0; i < N; i++) assert_true(isnan(c.lp[i]));
                    int64_t n = -1, first = -1;
                    expect_ok(sph_ctx_nonfinite(ctx, &n, &first));
                    assert_int_equal(n, 1);
                    assert_int_equal(first, bad);
                    free(dh0), free(dw0);
                }
                c.mask[bad] = 0; /* inactive: never read */
                hc_wire(&c, HC_LP | HC_G | HC_MASK | HC_DH | HC_DW);
                expect_ok(hc_run(ctx, SPH_HEAD_FORWARD, &c.a));
                sph_ctx_destroy(ctx);
                hc_free(&c);
            }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_nonfinite_rows),
        cmocka_unit_test(test_nonfinite_later_chunk),
    };
    return test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
