/*
 * num.c - see num.h.
 */
#include "num.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>

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
