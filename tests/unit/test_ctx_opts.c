/*
 * test_ctx_opts.c - context options that are not kernels: the CUDA A/B switches
 * (sph_ctx_opts.cuda_flags: validation, the struct_size growth rule, the environment mapping
 * of sph_ctx_opts_apply_env), the designated INIT macros' defaults, and the version's single
 * source (sph_version() is the header's SPH_VERSION_*).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "testutil.h"

static const char *g_vars[] = {"SPH_CUDA_GATHER",    "SPH_CUDA_SQUARE",   "SPH_CUDA_FUSED",
                               "SPH_CUDA_COLOUTER",  "SPH_CUDA_SM90",     "SPH_CUDA_BWD_DENSE",
                               "SPH_CUDA_PINGPONG",  "SPH_CUDA_STORE16",  "SPH_CUDA_ONEPASS",
                               "SPH_CUDA_E2CHUNK",   "SPH_CUDA_DHSPLITK", "SPH_CUDA_E2DOVL",
                               "SPH_CUDA_DW32BZ",    "SPH_CUDA_EXTRAS"};
#define N_VARS (sizeof g_vars / sizeof g_vars[0])

static void clear_env(void) {
    for (size_t k = 0; k < N_VARS; k++) assert_int_equal(unsetenv(g_vars[k]), 0);
}

static void test_flags_validated(void **state) {
    (void)state;
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    sph_ctx_t c = NULL;
    o.cuda_flags = SPH_CUDA_FLAG_NO_FUSED | SPH_CUDA_FLAG_PINGPONG; /* CPU contexts ignore them */
    expect_ok(sph_ctx_create(&c, &o));
    assert_int_equal(c->opts.cuda_flags, SPH_CUDA_FLAG_NO_FUSED | SPH_CUDA_FLAG_PINGPONG);
    sph_ctx_destroy(c);
    o.cuda_flags = 1u << 20;
    expect_status(sph_ctx_create(&c, &o), SPH_ERR_INVALID_ARG,
                  "opts.cuda_flags is 0x100000: bits 0x100000 are not sph_cuda_flag switches");
    assert_null(c);
    o.cuda_flags = SPH_CUDA_FLAG_PINGPONG | SPH_CUDA_FLAG_COOPERATIVE;
    expect_status(sph_ctx_create(&c, &o), SPH_ERR_INVALID_ARG, "exclude each other");
    o.cuda_flags = SPH_CUDA_FLAG_ONEPASS_E | SPH_CUDA_FLAG_ONEPASS_F32;
    expect_status(sph_ctx_create(&c, &o), SPH_ERR_INVALID_ARG, "ONEPASS_* switches exclude");
    o.cuda_flags = SPH_CUDA_FLAG_ONEPASS_F32 | SPH_CUDA_FLAG_NO_STORE16;
    expect_ok(sph_ctx_create(&c, &o));
    sph_ctx_destroy(c);
}

/* A caller compiled against the header before cuda_flags existed: its struct ends at
 * tune_cache, and whatever follows in its memory is not read. */
static void test_struct_size_growth(void **state) {
    (void)state;
    struct {
        sph_ctx_opts o;
        char pad[64];
    } buf;
    memset(&buf, 0xff, sizeof buf);
    sph_ctx_opts d = SPH_CTX_OPTS_INIT;
    memcpy(&buf.o, &d, offsetof(sph_ctx_opts, cuda_flags));
    buf.o.struct_size = offsetof(sph_ctx_opts, tune_cache) + sizeof(char *);
    sph_ctx_t c = NULL;
    expect_ok(sph_ctx_create(&c, &buf.o));
    assert_int_equal(c->opts.cuda_flags, 0);
    sph_ctx_destroy(c);
    expect_status(sph_ctx_opts_apply_env(&buf.o), SPH_ERR_INVALID_ARG, "opts.struct_size");
    buf.o.struct_size = 8;
    expect_status(sph_ctx_create(&c, &buf.o), SPH_ERR_INVALID_ARG, "opts.struct_size is 8");
}

static void test_apply_env(void **state) {
    (void)state;
    clear_env();
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    expect_ok(sph_ctx_opts_apply_env(&o));
    assert_int_equal(o.cuda_flags, 0);
    static const struct {
        const char *var, *val;
        uint32_t want;
    } cases[] = {
        {"SPH_CUDA_GATHER", "0", SPH_CUDA_FLAG_NO_GATHER},
        {"SPH_CUDA_SQUARE", "0", SPH_CUDA_FLAG_NO_SQUARE},
        {"SPH_CUDA_FUSED", "0", SPH_CUDA_FLAG_NO_FUSED},
        {"SPH_CUDA_COLOUTER", "0", SPH_CUDA_FLAG_NO_COLOUTER},
        {"SPH_CUDA_SM90", "0", SPH_CUDA_FLAG_NO_SM90},
        {"SPH_CUDA_BWD_DENSE", "1", SPH_CUDA_FLAG_DENSE_BACKWARD},
        {"SPH_CUDA_PINGPONG", "1", SPH_CUDA_FLAG_PINGPONG},
        {"SPH_CUDA_PINGPONG", "0", SPH_CUDA_FLAG_COOPERATIVE},
        {"SPH_CUDA_STORE16", "0", SPH_CUDA_FLAG_NO_STORE16},
        {"SPH_CUDA_ONEPASS", "e", SPH_CUDA_FLAG_ONEPASS_E},
        {"SPH_CUDA_ONEPASS", "f32", SPH_CUDA_FLAG_ONEPASS_F32},
        {"SPH_CUDA_ONEPASS", "recompute", SPH_CUDA_FLAG_ONEPASS_RECOMPUTE},
        {"SPH_CUDA_ONEPASS", "auto", 0},
        {"SPH_CUDA_E2CHUNK", "1", SPH_CUDA_FLAG_E_TWO_CHUNKS},
        {"SPH_CUDA_DHSPLITK", "1", SPH_CUDA_FLAG_DH_SPLITK},
        {"SPH_CUDA_E2DOVL", "1", SPH_CUDA_FLAG_E2D_OVERLAP},
        {"SPH_CUDA_E2DOVL", "0", 0},
        {"SPH_CUDA_DW32BZ", "1", SPH_CUDA_FLAG_DW32_BETA0},
        {"SPH_CUDA_DW32BZ", "0", 0},
        {"SPH_CUDA_EXTRAS", "staged", SPH_CUDA_FLAG_EXTRAS_STAGED},
        {"SPH_CUDA_EXTRAS", "fused", 0},
        {"SPH_CUDA_FUSED", "1", 0},
        {"SPH_CUDA_BWD_DENSE", "0", 0},
        {"SPH_CUDA_GATHER", "", 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        clear_env();
        assert_int_equal(setenv(cases[k].var, cases[k].val, 1), 0);
        o.cuda_flags = 0;
        expect_ok(sph_ctx_opts_apply_env(&o));
        if (o.cuda_flags != cases[k].want) {
            print_error("%s=%s: cuda_flags 0x%x, expected 0x%x\n", cases[k].var, cases[k].val,
                        o.cuda_flags, cases[k].want);
            fail();
        }
    }
    /* a set variable overrides its switch either way; an unset one leaves it */
    clear_env();
    assert_int_equal(setenv("SPH_CUDA_FUSED", "1", 1), 0);
    assert_int_equal(setenv("SPH_CUDA_PINGPONG", "0", 1), 0);
    o.cuda_flags = SPH_CUDA_FLAG_NO_FUSED | SPH_CUDA_FLAG_PINGPONG | SPH_CUDA_FLAG_NO_GATHER;
    expect_ok(sph_ctx_opts_apply_env(&o));
    assert_int_equal(o.cuda_flags, SPH_CUDA_FLAG_COOPERATIVE | SPH_CUDA_FLAG_NO_GATHER);
    /* a value other than 0 or 1: refused, naming the variable, opts unchanged */
    assert_int_equal(setenv("SPH_CUDA_SQUARE", "off", 1), 0);
    o.cuda_flags = SPH_CUDA_FLAG_NO_SM90;
    expect_status(sph_ctx_opts_apply_env(&o), SPH_ERR_INVALID_ARG,
                  "SPH_CUDA_SQUARE: 'off', expected 0 or 1");
    assert_int_equal(o.cuda_flags, SPH_CUDA_FLAG_NO_SM90);
    clear_env();
    assert_int_equal(setenv("SPH_CUDA_ONEPASS", "fast", 1), 0);
    expect_status(sph_ctx_opts_apply_env(&o), SPH_ERR_INVALID_ARG,
                  "SPH_CUDA_ONEPASS: 'fast', expected e, f32, recompute or auto");
    assert_int_equal(setenv("SPH_CUDA_ONEPASS", "recompute", 1), 0); /* replaces e */
    o.cuda_flags = SPH_CUDA_FLAG_ONEPASS_E;
    expect_ok(sph_ctx_opts_apply_env(&o));
    assert_int_equal(o.cuda_flags, SPH_CUDA_FLAG_ONEPASS_RECOMPUTE);
    expect_status(sph_ctx_opts_apply_env(NULL), SPH_ERR_INVALID_ARG, "opts: NULL");
    clear_env();
    /* the library itself never reads them: a context made without apply_env has none */
    assert_int_equal(setenv("SPH_CUDA_FUSED", "0", 1), 0);
    sph_ctx_opts d = SPH_CTX_OPTS_INIT;
    sph_ctx_t c = NULL;
    expect_ok(sph_ctx_create(&c, &d));
    assert_int_equal(c->opts.cuda_flags, 0);
    sph_ctx_destroy(c);
    clear_env();
}

static void test_init_defaults(void **state) {
    (void)state;
    sph_head_args a = SPH_HEAD_ARGS_INIT;
    assert_int_equal(a.struct_size, sizeof a);
    assert_true(a.temperature == 1.0 && a.softcap == 0.0);
    assert_null(a.hidden), assert_null(a.stats), assert_null(a.spans);
    assert_int_equal(a.vocab_total, 0), assert_int_equal(a.allreduce_dhidden, 0);
    sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
    assert_true(sph_dtype_eq(cfg.dtype, SPH_F32) && cfg.tp == 1 && cfg.dp == 1 &&
                cfg.temperature == 1.0);
    sph_tune_opts t = SPH_TUNE_OPTS_INIT;
    assert_true(sph_dtype_eq(t.dtype, SPH_BF16) && t.struct_size == sizeof t);
    sph_pack_opts p = SPH_PACK_OPTS_INIT;
    assert_true(p.par.tp == 1 && p.par.cp == 1 && p.bin_multiple == 1 &&
                p.algorithm == SPH_PACK_FFD);
    sph_spans_opts s = SPH_SPANS_OPTS_INIT;
    assert_true(s.gap == 0 && s.par.tp == 1 && s.cp_rank == 0); /* exact spans */
    sph_batch_desc b = SPH_BATCH_DESC_INIT;
    assert_true(b.struct_size == sizeof b && b.layout == SPH_LAYOUT_UNPACKED);
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    assert_true(o.device.type == SPH_DEVICE_CPU && o.cuda_flags == 0 && o.struct_size == sizeof o);
}

static void test_version(void **state) {
    (void)state;
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", SPH_VERSION_MAJOR, SPH_VERSION_MINOR,
             SPH_VERSION_PATCH);
    assert_string_equal(sph_version(), want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flags_validated), cmocka_unit_test(test_struct_size_growth),
        cmocka_unit_test(test_apply_env),       cmocka_unit_test(test_init_defaults),
        cmocka_unit_test(test_version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
