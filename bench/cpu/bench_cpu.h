/*
 * bench_cpu.h - what the CPU benchmarks share: a monotonic clock in seconds and a double
 * comparison for qsort (medians of repeated timings).
 */
#ifndef SPH_BENCH_CPU_H
#define SPH_BENCH_CPU_H

#include <time.h>

static inline double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
