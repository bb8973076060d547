/*
 * alloc.c - the library's heap: malloc & co. behind one door, so that a test can make the k-th
 * allocation fail (the torture tests of tests/torture, in the tradition of curl's
 * CURLDEBUG memdebug: every allocation site, in turn, must end in a clean status, no leak and
 * no partial output). Disarmed (the default) the only cost is one relaxed atomic load and
 * increment per allocation; allocations never sit on a hot path (STYLE.md).
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "core/internal.h"

static _Atomic int64_t g_count;   /* allocations since the last arming */
static _Atomic int64_t g_fail_at; /* fail the allocation with this count (0: never) */

void sph_alloc_fail_at(int64_t k) {
    atomic_store(&g_count, 0);
    atomic_store(&g_fail_at, k > 0 ? k : 0);
}

int64_t sph_alloc_count(void) { return atomic_load(&g_count); }

/* 1 when this allocation is the one to fail. */
static int fail_now(void) {
    const int64_t n = atomic_fetch_add_explicit(&g_count, 1, memory_order_relaxed) + 1;
    const int64_t k = atomic_load_explicit(&g_fail_at, memory_order_relaxed);
    return k > 0 && n == k;
}

void *sph_malloc(size_t bytes) { return fail_now() ? NULL : malloc(bytes); }

void *sph_calloc(size_t n, size_t size) { return fail_now() ? NULL : calloc(n, size); }

void *sph_realloc(void *p, size_t bytes) { return fail_now() ? NULL : realloc(p, bytes); }

void sph_free(void *p) { free(p); }
