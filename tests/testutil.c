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
    double max_abs = 0, max_rel = 0, max_ratio = 0;
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
        double bound = atol + rtol * fabs(r);
        double ratio = fine ? (bound > 0 ? err / bound : 0) : INFINITY;
        if (ratio > max_ratio) max_ratio = ratio;
    }
    tol_track(what, max_ratio);
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

int check_within(const char *what, const char *case_str, const double *got, const double *ref,
                 const double *bound, size_t n) {
    double max_ratio = 0, max_abs = 0;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs(got[i] - ref[i]);
        int fine = !isnan(got[i]) && !isnan(ref[i]) && err <= bound[i];
        if (!fine && bad++ == 0) first = i;
        double ratio = fine ? (bound[i] > 0 ? err / bound[i] : 0) : INFINITY;
        if (ratio > max_ratio) max_ratio = ratio;
        if (!(err <= max_abs)) max_abs = isnan(err) ? INFINITY : err;
    }
    tol_track(what, max_ratio);
    if (bad)
        fprintf(stderr,
                "FAIL %s %s: %zu/%zu outside the elementwise budget; max abs %.3e; first bad [%zu] "
                "got %.9g ref %.9g budget %.3e; seed %llu\n",
                what, case_str, bad, n, max_abs, first, got[first], ref[first], bound[first],
                (unsigned long long)test_seed());
    return bad == 0;
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

// ---- skips --------------------------------------------------------------------------------

static int g_skips;
static char g_skip_log[4096];

void test_note_skip(const char *test, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    g_skips++;
    size_t used = strlen(g_skip_log);
    snprintf(g_skip_log + used, sizeof g_skip_log - used, "  %s: %s\n", test, msg);
    printf("SKIP %s: %s\n", test, msg);
    fflush(stdout);
}

int test_skipped(void) { return g_skips; }

int test_exit(int failed) {
    if (failed) return 1;
    if (g_skips) {
        printf("SKIPPED: %d test(s) did not run what their names say:\n%s", g_skips, g_skip_log);
        fflush(stdout);
        return 77;
    }
    return 0;
}

// ---- error / budget ratios ------------------------------------------------------------------

#define TOL_SLOTS 64
static struct {
    char name[48];
    double worst;
} g_tol[TOL_SLOTS];
static int g_ntol;

void tol_track(const char *what, double ratio) {
    if (!what) return;
    char key[48];
    /* "dhidden (all-reduced)" and "dhidden" share a slot: the first word names the output */
    size_t n = strcspn(what, " (");
    if (n >= sizeof key) n = sizeof key - 1;
    memcpy(key, what, n);
    key[n] = 0;
    for (int i = 0; i < g_ntol; i++)
        if (!strcmp(g_tol[i].name, key)) {
            if (ratio > g_tol[i].worst || isnan(ratio)) g_tol[i].worst = ratio;
            return;
        }
    if (g_ntol == TOL_SLOTS) return;
    snprintf(g_tol[g_ntol].name, sizeof g_tol[g_ntol].name, "%s", key);
    g_tol[g_ntol++].worst = ratio;
}

void tol_report(const char *title) {
    if (!g_ntol) return;
    fprintf(stderr, "%s: largest error / budget:", title);
    for (int i = 0; i < g_ntol; i++) fprintf(stderr, " %s %.3g", g_tol[i].name, g_tol[i].worst);
    fputc('\n', stderr);
}

// ---- kernel sets ----------------------------------------------------------------------------

const char *test_kernel_arg(int argc, char **argv, const char *def) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kernel") && i + 1 < argc) return argv[i + 1];
        if (strncmp(argv[i], "--", 2)) return argv[i];
    }
    const char *e = getenv("SPH_TEST_KERNEL");
    return e && *e ? e : def;
}

int test_kernel_available(const char *kernel, char *why, size_t why_len) {
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.force_kernel = kernel;
    sph_ctx_t ctx = NULL;
    sph_status s = sph_ctx_create(&ctx, &o);
    sph_ctx_destroy(ctx);
    if (s == SPH_OK) return 1;
    snprintf(why, why_len, "kernel set '%s' %s: %s", kernel ? kernel : "best",
             s == SPH_ERR_UNSUPPORTED ? "cannot run on this machine" : "is not a kernel set",
             sph_last_error());
    return s == SPH_ERR_UNSUPPORTED ? 0 : -1;
}
