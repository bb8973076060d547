/*
 * clock.c - see clock.h.
 */
#define _XOPEN_SOURCE 700 /* clock_gettime, sysconf (_SC_PHYS_PAGES) */
#include "clock.h"

#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "num.h"

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
