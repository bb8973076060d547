/*
 * trace.c - the host-time marks of trace.h: a table of at most SPH_TRACE_LABELS labels, each
 * with its count and summed nanoseconds, under one mutex (only taken when tracing); the
 * thread's previous mark in thread-local storage; the switch read once when the library
 * loads; printed once at exit.
 */
#include "core/trace.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SPH_TRACE_LABELS 96

int sph_trace_on = 0;

typedef struct trace_row {
    const char *label;
    uint64_t n, ns;
} trace_row;

static trace_row g_rows[SPH_TRACE_LABELS];
static int g_n;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local uint64_t t_last;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int by_time(const void *a, const void *b) {
    const trace_row *x = (const trace_row *)a, *y = (const trace_row *)b;
    return x->ns < y->ns ? 1 : x->ns > y->ns ? -1 : 0;
}

static void trace_print(void) {
    pthread_mutex_lock(&g_mu);
    if (g_n == 0) {
        pthread_mutex_unlock(&g_mu);
        return;
    }
    qsort(g_rows, (size_t)g_n, sizeof g_rows[0], by_time);
    fprintf(stderr, "spanhead host trace (SPH_HOST_TRACE): label, calls, us per call, total ms\n");
    for (int k = 0; k < g_n; k++)
        fprintf(stderr, "  %-28s %8llu %10.2f %10.3f\n", g_rows[k].label,
                (unsigned long long)g_rows[k].n, g_rows[k].ns / 1e3 / (double)g_rows[k].n,
                g_rows[k].ns / 1e6);
    pthread_mutex_unlock(&g_mu);
}

__attribute__((constructor)) static void trace_init(void) {
    const char *e = getenv("SPH_HOST_TRACE");
    sph_trace_on = e && *e && strcmp(e, "0") != 0;
    if (sph_trace_on) atexit(trace_print);
}

void sph_trace_begin_(void) { t_last = now_ns(); }

void sph_trace_mark_(const char *label) {
    const uint64_t t = now_ns(), d = t_last ? t - t_last : 0;
    pthread_mutex_lock(&g_mu);
    int k = 0;
    while (k < g_n && g_rows[k].label != label) k++;
    if (k == g_n && g_n < SPH_TRACE_LABELS) g_rows[g_n++].label = label;
    if (k < g_n) g_rows[k].n++, g_rows[k].ns += d;
    pthread_mutex_unlock(&g_mu);
    t_last = now_ns(); /* the table's own time is not charged to the next label */
}
