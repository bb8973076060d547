/*
 * test_dynload.c - the run-time loading of the libraries spanhead shares with its host process
 * (core/dynload.h; cuBLAS and NCCL through cublas_shim.h / nccl_shim.h): a copy already in the
 * process is taken first, then the environment's path, then the linker's search; a library or
 * symbol that is missing is SPH_ERR_UNSUPPORTED naming what was tried, and the loaders' results
 * are sticky. The cuBLAS / NCCL parts run where the build has them (weak symbols otherwise).
 */
#include <stdlib.h>
#include <string.h>

#include "core/dynload.h"
#include "testutil.h"

/* src/cuda/cublas_shim.c (CUDA builds) and src/comm/nccl_shim.c (every build; without NCCL
 * it says so) */
#ifdef SPH_HAVE_CUDA
sph_status sph_cublas_load(void);
const char *sph_cublas_path(void);
#endif
sph_status sph_nccl_load(const char *who);
const char *sph_nccl_path(void);

static void test_already_loaded_first(void **state) {
    (void)state;
    /* libm is in every test process: found without a search, and its path reported */
    const char *const names[] = {"libspanhead-no-such.so.9", "libm.so.6", NULL};
    void *h = NULL;
    char where[512] = "";
    expect_ok(sph_dynload("libm", "SPH_TEST_DYNLOAD_ENV", names, NULL, &h, where, sizeof where));
    assert_non_null(h);
    assert_non_null(strstr(where, "libm"));
    void *fn[2];
    const char *const syms[] = {"cos", NULL};
    expect_ok(sph_dynsyms(h, "libm", where, syms, fn));
    assert_non_null(fn[0]);
    const char *const bad[] = {"cos", "sph_no_such_symbol", NULL};
    expect_status(sph_dynsyms(h, "libm", where, bad, fn), SPH_ERR_UNSUPPORTED,
                  "has no symbol sph_no_such_symbol");
}

static void test_missing_library_names_the_search(void **state) {
    (void)state;
    const char *const names[] = {"libspanhead-no-such.so.9", NULL};
    void *h = (void *)1;
    assert_int_equal(unsetenv("SPH_TEST_DYNLOAD_ENV"), 0);
    expect_status(sph_dynload("NoSuch", "SPH_TEST_DYNLOAD_ENV", names, "/nonexistent-dir", &h,
                              NULL, 0),
                  SPH_ERR_UNSUPPORTED, "tried libspanhead-no-such.so.9, /nonexistent-dir/");
    assert_null(h);
    expect_status(sph_dynload("NoSuch", "SPH_TEST_DYNLOAD_ENV", names, NULL, &h, NULL, 0),
                  SPH_ERR_UNSUPPORTED, "set SPH_TEST_DYNLOAD_ENV to its path");
    /* an explicit path that does not load is an error naming the variable and the path */
    assert_int_equal(setenv("SPH_TEST_DYNLOAD_ENV", "/nonexistent/libx.so", 1), 0);
    expect_status(sph_dynload("NoSuch", "SPH_TEST_DYNLOAD_ENV", names, NULL, &h, NULL, 0),
                  SPH_ERR_UNSUPPORTED, "SPH_TEST_DYNLOAD_ENV=/nonexistent/libx.so");
    /* and one that does is taken */
    assert_int_equal(setenv("SPH_TEST_DYNLOAD_ENV", "libm.so.6", 1), 0);
    char where[512] = "";
    expect_ok(sph_dynload("NoSuch", "SPH_TEST_DYNLOAD_ENV", names, NULL, &h, where,
                          sizeof where));
    assert_non_null(strstr(where, "libm"));
    assert_int_equal(unsetenv("SPH_TEST_DYNLOAD_ENV"), 0);
}

static void test_cublas_and_nccl_loaders(void **state) {
    (void)state;
#ifdef SPH_HAVE_CUDA
    {
        sph_status s1 = sph_cublas_load(), s2 = sph_cublas_load();
        assert_int_equal(s1, s2); /* sticky */
        if (s1 == SPH_OK) {
            assert_non_null(strstr(sph_cublas_path(), "libcublas.so."));
        } else {
            assert_int_equal(s1, SPH_ERR_UNSUPPORTED);
            assert_non_null(strstr(sph_last_error(), "SPANHEAD_CUBLAS_LIB"));
        }
    }
#endif
    sph_status s1 = sph_nccl_load("test"), s2 = sph_nccl_load(NULL);
    assert_int_equal(s1, s2); /* sticky */
    if (s1 == SPH_OK) {
        assert_non_null(strstr(sph_nccl_path(), "libnccl.so"));
    } else {
        assert_int_equal(s1, SPH_ERR_UNSUPPORTED);
        assert_non_null(strstr(sph_last_error(), "SPANHEAD_NCCL_LIB"));
        assert_string_equal(sph_nccl_path(), "");
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_already_loaded_first),
        cmocka_unit_test(test_missing_library_names_the_search),
        cmocka_unit_test(test_cublas_and_nccl_loaders),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
