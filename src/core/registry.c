/*
 * registry.c - the device backends of this build (the host device's table is src/head's, CUDA's
 * src/cuda's). The only file that knows whether spanhead was built with CUDA: everything else
 * asks sph_registry_device.
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

// ---- the registry -------------------------------------------------------------------------

const sph_device_ops *sph_registry_device(sph_device_type type) {
    switch (type) {
    case SPH_DEVICE_CPU:
    case SPH_DEVICE_CUDA_HOST: return sph_host_device_ops();
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
