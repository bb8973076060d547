/* testutil.c - see testutil.h */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void rng_seed(sph_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_u64(sph_rng *r) {
    uint64_t *s = r->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

double rng_uniform(sph_rng *r) { return (double)(rng_u64(r) >> 11) * 0x1.0p-53; }

double rng_normal(sph_rng *r) {
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int64_t rng_range(sph_rng *r, int64_t lo, int64_t hi) {
    uint64_t span = (uint64_t)(hi - lo) + 1;
    return lo + (int64_t)(span ? rng_u64(r) % span : rng_u64(r));
}

uint64_t test_seed(void) {
    static uint64_t seed;
    static int done;
    if (!done) {
        const char *e = getenv("SPH_TEST_SEED");
        if (e) {
            seed = strtoull(e, NULL, 0);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20);
        }
        fprintf(stderr, "test seed: SPH_TEST_SEED=%llu\n", (unsigned long long)seed);
        done = 1;
    }
    return seed;
}

void poison_f32(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}

void poison_bytes(void *x, size_t bytes) { memset(x, 0xff, bytes); }

static int check_impl(const char *what, const char *case_str, const float *gf, const double *gd,
                      const double *ref, size_t n, double atol, double rtol) {
    double max_abs = 0, max_rel = 0;
    size_t worst = 0, bad = 0;
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        double g = gf ? (double)gf[i] : gd[i], r = ref[i];
        double err = fabs(g - r);
        int fine = !isnan(g) && !isnan(r) && err <= atol + rtol * fabs(r);
        if (isinf(r) && g == r) fine = 1, err = 0;
        if (!fine) {
            if (ok) worst = i;
            ok = 0;
            bad++;
        }
        if (isnan(err) || err > max_abs) {
            max_abs = isnan(err) ? INFINITY : err;
            if (ok) worst = i;
        }
        double rel = err / (fabs(r) > 1e-30 ? fabs(r) : 1e-30);
        if (rel > max_rel && !isnan(rel)) max_rel = rel;
    }
    if (!ok) {
        double g = gf ? (double)gf[worst] : gd[worst];
        fprintf(stderr,
                "FAIL %s %s: %zu/%zu out of tolerance (atol %.1e rtol %.1e); max abs %.3e max "
                "rel %.3e; first bad [%zu] got %.9g ref %.9g; seed %llu\n",
                what, case_str, bad, n, atol, rtol, max_abs, max_rel, worst, g, ref[worst],
                (unsigned long long)test_seed());
    }
    return ok;
}

int check_close(const char *what, const char *case_str, const float *got, const double *ref,
                size_t n, double atol, double rtol) {
    return check_impl(what, case_str, got, NULL, ref, n, atol, rtol);
}

int check_close_f64(const char *what, const char *case_str, const double *got,
                    const double *ref, size_t n, double atol, double rtol) {
    return check_impl(what, case_str, NULL, got, ref, n, atol, rtol);
}

sph_tensor tensor1(void *data, sph_dtype dt, int64_t *shape, int64_t n0) {
    shape[0] = n0;
    sph_tensor t = {data, {SPH_DEVICE_CPU, 0}, 1, dt, shape, NULL, 0};
    return t;
}

sph_tensor tensor2(void *data, sph_dtype dt, int64_t *shape, int64_t n0, int64_t n1) {
    shape[0] = n0;
    shape[1] = n1;
    sph_tensor t = {data, {SPH_DEVICE_CPU, 0}, 2, dt, shape, NULL, 0};
    return t;
}
