/*
 * util.c - the CLI toolbox (see util.h).
 */
#define _XOPEN_SOURCE 700 /* realpath */
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


// ---- messages --------------------------------------------------------------------------------

int sph_cli_fail(const char *cmd, int code, const char *fmt, ...) {
    va_list ap;
    fflush(stdout); /* what was printed before the failure comes first */
    fprintf(stderr, "spanhead %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return code;
}

int sph_cli_err(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen) vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return 1;
}

// ---- numbers ---------------------------------------------------------------------------------

int sph_cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s || isspace((unsigned char)*s)) return 1;
    errno = 0;
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return 1;
    *out = (int64_t)v;
    return 0;
}

int sph_cli_parse_count(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s || isspace((unsigned char)*s)) return 1;
    errno = 0;
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s) return 1;
    int64_t mult = 1;
    if (*end == 'K' || *end == 'k') mult = 1024, end++;
    else if (*end == 'M' || *end == 'm') mult = 1048576, end++;
    if (*end) return 1;
    int64_t x;
    if (v < 0 ? v < INT64_MIN / mult : sph_cli_mul(v, mult, &x)) return 1;
    x = (int64_t)v * mult;
    if (x < lo || x > hi) return 1;
    *out = x;
    return 0;
}

int sph_cli_parse_f64(const char *s, double lo, double hi, double *out) {
    if (!s || !*s || isspace((unsigned char)*s)) return 1;
    errno = 0;
    char *end = NULL;
    double v = strtod(s, &end);
    /* ERANGE on underflow still gives a usable (tiny or 0) value; the caller's range decides */
    if ((errno && errno != ERANGE) || end == s || *end || !isfinite(v) || v < lo || v > hi)
        return 1;
    *out = v;
    return 0;
}

int sph_cli_mul(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) return 1;
    if (a && b > INT64_MAX / a) return 1;
    *out = a * b;
    return 0;
}

int sph_cli_add(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0 || a > INT64_MAX - b) return 1;
    *out = a + b;
    return 0;
}

int sph_cli_bytes(int64_t count, size_t elem, size_t *out) {
    if (count < 0 || (uint64_t)count > SIZE_MAX) return 1;
    if (elem && (size_t)count > SIZE_MAX / elem) return 1;
    *out = (size_t)count * elem;
    return 0;
}

void *sph_cli_alloc(int64_t count, size_t elem) {
    size_t b;
    if (sph_cli_bytes(count, elem, &b)) return NULL;
    return malloc(b ? b : 1);
}

void *sph_cli_calloc(int64_t count, size_t elem) {
    size_t b;
    if (sph_cli_bytes(count, elem, &b)) return NULL;
    return calloc(b ? b : 1, 1);
}

// ---- random numbers --------------------------------------------------------------------------

void sph_cli_rng_seed(sph_cli_rng *r, uint64_t seed) { r->s = seed * 0x9e3779b97f4a7c15ull + 1; }

uint64_t sph_cli_rng_u64(sph_cli_rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double sph_cli_rng_uniform(sph_cli_rng *r) { return (double)(sph_cli_rng_u64(r) >> 11) * 0x1.0p-53; }

double sph_cli_rng_normal(sph_cli_rng *r) {
    double u = sph_cli_rng_uniform(r), v = sph_cli_rng_uniform(r);
    if (u < 1e-300) u = 1e-300; /* log(0) */
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

int64_t sph_cli_rng_range(sph_cli_rng *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)(sph_cli_rng_u64(r) % ((uint64_t)hi - (uint64_t)lo + 1));
}

// ---- 16-bit floats ---------------------------------------------------------------------------

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t sph_cli_f32_to_bf16(float f) {
    uint32_t u = bits_of(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float sph_cli_bf16_to_f32(uint16_t h) { return float_of((uint32_t)h << 16); }

uint16_t sph_cli_f32_to_f16(float f) {
    uint32_t u = bits_of(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: inf */
    if (a < 0x38800000u) /* subnormal half: multiples of 2^-24, lrintf rounds to even */
        return (uint16_t)(sign | (uint32_t)lrintf(fabsf(f) * 16777216.0f));
    uint32_t e = (a >> 23) - 112, m = a & 0x7fffffu, h = e << 10 | m >> 13, rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

float sph_cli_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return float_of(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    return float_of(sign | ((e + 112) << 23) | (m << 13));
}

float sph_cli_load_float(const void *x, int64_t k, int bits, int is_bf16) {
    if (bits == 32) return ((const float *)x)[k];
    uint16_t h = ((const uint16_t *)x)[k];
    return is_bf16 ? sph_cli_bf16_to_f32(h) : sph_cli_f16_to_f32(h);
}

int64_t sph_cli_first_nonfinite(const void *x, int64_t n, int bits, int is_bf16) {
    if (bits == 32) {
        const uint32_t *u = x;
        for (int64_t k = 0; k < n; k++)
            if ((u[k] & 0x7f800000u) == 0x7f800000u) return k;
        return -1;
    }
    const uint16_t *h = x, e = is_bf16 ? 0x7f80u : 0x7c00u;
    for (int64_t k = 0; k < n; k++)
        if ((h[k] & e) == e) return k;
    return -1;
}

// ---- time and the machine --------------------------------------------------------------------

double sph_cli_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int sph_cli_cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double sph_cli_median(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, sph_cli_cmp_double);
    return v[n / 2];
}

int64_t sph_cli_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int64_t)n : 1;
}

int64_t sph_cli_phys_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || size <= 0) return 0;
    int64_t b;
    return sph_cli_mul(pages, size, &b) ? INT64_MAX : b;
}

// ---- progress --------------------------------------------------------------------------------

static void fmt_secs(char *buf, size_t n, double s) {
    if (s < 0 || !isfinite(s)) snprintf(buf, n, "?");
    else if (s < 60) snprintf(buf, n, "%.0fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
}

void sph_cli_progress_start(sph_cli_progress *p, const char *what, int64_t total) {
    memset(p, 0, sizeof *p);
    /* on a terminal: after a half-second delay, so short work prints nothing; forced on
     * (SPH_PROGRESS=1, for logs and tests): from the first step, so that the last step's line
     * (done == total) is always printed however fast the work was */
    const char *env = getenv("SPH_PROGRESS");
    p->on = env ? (strcmp(env, "0") != 0 ? 2 : 0) : isatty(STDERR_FILENO);
    p->what = what;
    p->total = total;
    p->t0 = p->last = sph_cli_now_s();
}

void sph_cli_progress_step(sph_cli_progress *p, int64_t done) {
    if (!p->on) return;
    double t = sph_cli_now_s(), el = t - p->t0;
    const double delay = p->on == 2 ? 0.0 : 0.5;
    if (done < p->total && (el < delay || t - p->last < 0.2)) return;
    if (done >= p->total && el < delay) return;
    p->last = t;
    char e[16], r[16];
    fmt_secs(e, sizeof e, el);
    fmt_secs(r, sizeof r, done > 0 ? el * (double)(p->total - done) / (double)done : -1);
    fprintf(stderr, "\r%s: %lld/%lld done, %s elapsed, ETA %s\033[K", p->what, (long long)done,
            (long long)p->total, e, r);
    fflush(stderr);
    p->shown = 1;
}

void sph_cli_progress_end(sph_cli_progress *p) {
    if (p->shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
    p->shown = 0;
}

// ---- stdout ----------------------------------------------------------------------------------

int sph_cli_close_stdout(const char *cmd, int rc) {
    static int reported; /* a runner and main() both close: the error is said once */
    errno = 0;
    int bad = fflush(stdout) != 0 || ferror(stdout);
    if (!bad) return rc;
    int e = errno;
    if (reported++) return rc ? rc : 1;
    fprintf(stderr, "spanhead %s: writing standard output: %s\n", cmd,
            e ? strerror(e) : "write error");
    return rc ? rc : 1;
}
