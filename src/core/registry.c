/*
 * registry.c - the device backends of this build and the host device's table. The only file
 * that knows whether spanhead was built with CUDA: everything else asks sph_registry_device.
 * Also the public calls that only a device backend can answer (autotuning, GEMM rates,
 * device count), which say SPH_ERR_UNSUPPORTED when no backend of this build has them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"

#ifdef SPH_HAVE_CUDA
/* src/cuda/runtime.cu */
const sph_device_ops *sph_cuda_device_ops(void);
#define CUDA_OPS() sph_cuda_device_ops()
#else
#define CUDA_OPS() ((const sph_device_ops *)NULL)
#endif

// ---- the host device ----------------------------------------------------------------------

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
    .head_fill = sph_head_cpu_fill,
    .malloc = host_malloc,
    .free = host_free,
    .memcpy = host_memcpy,
    .memset = host_memset,
    .synchronize = host_synchronize,
};

// ---- the registry -------------------------------------------------------------------------

const sph_device_ops *sph_registry_device(sph_device_type type) {
    switch (type) {
    case SPH_DEVICE_CPU:
    case SPH_DEVICE_CUDA_HOST: return &g_host_ops;
    case SPH_DEVICE_CUDA: return CUDA_OPS();
    }
    return NULL;
}

int sph_registry_pointer_is_device(const void *p) {
    const sph_device_ops *cu = CUDA_OPS();
    return p && cu && cu->pointer_is_device && cu->pointer_is_device(p) == 1;
}

sph_status sph_backend_missing(sph_ctx_t ctx, const char *what) {
    return sph_err(SPH_ERR_UNSUPPORTED, "%s: not implemented by the %s backend of this context",
                   what, ctx && ctx->head.name ? ctx->head.name : "(no)");
}

// ---- public calls a device backend answers ------------------------------------------------

int sph_cuda_device_count(void) {
    const sph_device_ops *cu = CUDA_OPS();
    return cu && cu->count ? cu->count() : 0;
}

sph_status sph_tune(sph_ctx_t ctx, const sph_tune_opts *opts, const char **result) {
    const sph_device_ops *cu = CUDA_OPS();
    if (!cu || !cu->tune) {
        if (result) *result = "";
        return sph_err(SPH_ERR_UNSUPPORTED, "tune: this build of spanhead has no CUDA backend");
    }
    if (ctx) SPH_TRY(sph_ctx_check(ctx, "tune")); /* NULL: its own message */
    return cu->tune(ctx, opts, result);
}

sph_status sph_tune_gemm_rate(sph_ctx_t ctx, sph_dtype dtype, int64_t M, int64_t N, int64_t K,
                              int repeats, double *tflops) {
    const sph_device_ops *cu = CUDA_OPS();
    if (!cu || !cu->gemm_rate) {
        if (tflops) *tflops = 0;
        return sph_err(SPH_ERR_UNSUPPORTED,
                       "tune_gemm_rate: this build of spanhead has no CUDA backend");
    }
    if (ctx) SPH_TRY(sph_ctx_check(ctx, "tune_gemm_rate")); /* NULL: its own message */
    return cu->gemm_rate(ctx, dtype, M, N, K, repeats, tflops);
}

sph_status sph_tune_gemm_rate_sustained(sph_ctx_t ctx, sph_dtype dtype, int64_t M, int64_t N,
                                        int64_t K, int chain, int repeats, double *tflops) {
    const sph_device_ops *cu = CUDA_OPS();
    if (!cu || !cu->gemm_rate_sustained) {
        if (tflops) *tflops = 0;
        return sph_err(SPH_ERR_UNSUPPORTED,
                       "tune_gemm_rate_sustained: this build of spanhead has no CUDA backend");
    }
    if (ctx) SPH_TRY(sph_ctx_check(ctx, "tune_gemm_rate_sustained")); /* NULL: its message */
    return cu->gemm_rate_sustained(ctx, dtype, M, N, K, chain, repeats, tflops);
}
