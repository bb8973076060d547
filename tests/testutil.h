/*
 * testutil.h - helpers shared by the tests: a seeded RNG, poisoning, tolerance checks that
 * print the worst element, and case strings. Tests may abort on setup failure; the library
 * may not.
 */
#ifndef SPH_TESTUTIL_H
#define SPH_TESTUTIL_H

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "spanhead.h"

/* splitmix64-seeded xoshiro256** */
typedef struct sph_rng { uint64_t s[4]; } sph_rng;
void rng_seed(sph_rng *r, uint64_t seed);
uint64_t rng_u64(sph_rng *r);
double rng_uniform(sph_rng *r);              /* [0, 1) */
double rng_normal(sph_rng *r);               /* N(0, 1) */
int64_t rng_range(sph_rng *r, int64_t lo, int64_t hi); /* [lo, hi] */
/* The seed for this run: $SPH_TEST_SEED or a fresh one from the clock; printed once. */
uint64_t test_seed(void);

/* Fill with a NaN pattern so unwritten elements show. */
void poison_f32(float *x, size_t n);
void poison_bytes(void *x, size_t bytes);

/* |got - ref| <= atol + rtol |ref| for all i; NaN in got (or ref) fails. On failure prints
 * the case string, max abs/rel error, the worst index and returns 0. */
int check_close(const char *what, const char *case_str, const float *got, const double *ref,
                size_t n, double atol, double rtol);
/* Same for double-precision got. */
int check_close_f64(const char *what, const char *case_str, const double *got,
                    const double *ref, size_t n, double atol, double rtol);

/* |got - ref| <= bound[i] elementwise (a budget computed per element); NaN fails. */
int check_within(const char *what, const char *case_str, const double *got, const double *ref,
                 const double *bound, size_t n);

/* Expect status s and that sph_last_error() contains needle. */
#define expect_status(call, s, needle)                                                       \
    do {                                                                                     \
        sph_status st_ = (call);                                                             \
        if (st_ != (s)) {                                                                    \
            print_error("%s: got status %d (%s), expected %d; message: %s\n", #call,          \
                        (int)st_, sph_status_str(st_), (int)(s), sph_last_error());          \
            fail();                                                                          \
        }                                                                                    \
        if ((needle) && !strstr(sph_last_error(), (needle))) {                               \
            print_error("%s: message '%s' lacks '%s'\n", #call, sph_last_error(), (needle)); \
            fail();                                                                          \
        }                                                                                    \
    } while (0)

#define expect_ok(call)                                                                      \
    do {                                                                                     \
        sph_status st_ = (call);                                                             \
        if (st_ != SPH_OK) {                                                                 \
            print_error("%s: status %d (%s): %s\n", #call, (int)st_, sph_status_str(st_),      \
                        sph_last_error());                                                   \
            fail();                                                                          \
        }                                                                                    \
    } while (0)

/* Tensor construction on host memory. */
sph_tensor tensor1(void *data, sph_dtype dt, int64_t *shape, int64_t n0);
sph_tensor tensor2(void *data, sph_dtype dt, int64_t *shape, int64_t n0, int64_t n1);

/* Skips are skips. test_skip(reason) skips the current cmocka test and records why;
 * test_exit(failed) turns cmocka_run_group_tests' count into the process status: 1 when
 * anything failed, else 77 (ctest: Skipped) when any test was skipped, with every reason
 * printed, else 0. A test that did not run what its name says never exits 0. */
#define test_skip(...)                                                                      \
    do {                                                                                     \
        test_note_skip(__func__, __VA_ARGS__);                                               \
        skip();                                                                              \
    } while (0)
void test_note_skip(const char *test, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int test_exit(int failed);
int test_skipped(void); /* skips recorded so far */

/* Largest error / budget ratio seen per output name (check_close and friends record it), and
 * a one-line report of them: how much of each tolerance the run used. */
void tol_track(const char *what, double ratio);
void tol_report(const char *title);

/* The kernel set a test was asked to check (argv[1], "--kernel NAME" or "NAME"; def when
 * absent), and whether this machine runs it: 1 yes, 0 not on this CPU, -1 not a kernel set
 * (reason written to why in both cases). */
const char *test_kernel_arg(int argc, char **argv, const char *def);
int test_kernel_available(const char *kernel, char *why, size_t why_len);

#include "tolerances.h"

#endif
