/*
 * host_device.c - the host device's table (core/backend.h, sph_device_ops): host memory, the
 * float64 reference and the optimized CPU head as the fill functions of the head table. The
 * registry (core/registry.c) hands it out for CPU and pinned-host contexts.
 */
#include <stdio.h>
#include <string.h>

#include "core/ctx.h"
#include "head/plan.h"

static sph_status host_ctx_init(sph_ctx_t ctx) {
    snprintf(ctx->describe, sizeof ctx->describe, "cpu %s threads=%d openblas",
             sph_cpu_isa_name(ctx->isa), ctx->num_threads);
    return SPH_OK;
}

static sph_status host_malloc(sph_ctx_t ctx, size_t bytes, void **ptr) {
    (void)ctx;
    *ptr = sph_malloc(bytes ? bytes : 1);
    SPH_CHECK(*ptr != NULL, SPH_ERR_ALLOC, "ctx_malloc: %zu bytes of host memory", bytes);
    return SPH_OK;
}

static void host_free(sph_ctx_t ctx, void *ptr) {
    (void)ctx;
    sph_free(ptr);
}

static sph_status host_memcpy(sph_ctx_t ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    memmove(dst, src, bytes);
    return SPH_OK;
}

static sph_status host_memset(sph_ctx_t ctx, void *dst, int value, size_t bytes) {
    (void)ctx;
    memset(dst, value, bytes);
    return SPH_OK;
}

static sph_status host_synchronize(sph_ctx_t ctx) {
    (void)ctx;
    return SPH_OK;
}

static const sph_device_ops g_host_ops = {
    .name = "cpu",
    .host_memory = 1,
    .ctx_init = host_ctx_init,
    .ref_fill = sph_head_ref_fill,
    .head_fill = sph_head_cpu_fill,
    .malloc = host_malloc,
    .free = host_free,
    .memcpy = host_memcpy,
    .memset = host_memset,
    .synchronize = host_synchronize,
    .scale = sph_host_scale, /* src/core/scale.c */
};

const sph_device_ops *sph_host_device_ops(void) { return &g_host_ops; }
