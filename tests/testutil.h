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

/* Tolerances by input dtype (tests/tolerances.h numbers). */
#define TOL_F32_RTOL 2e-5
#define TOL_F32_ATOL 2e-5
#define TOL_HALF_RTOL 1e-2
#define TOL_HALF_ATOL 1e-2

#endif
