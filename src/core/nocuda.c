/*
 * nocuda.c - the CUDA-only entry points of the public API in a build without CUDA: each says
 * so with SPH_ERR_UNSUPPORTED, so every symbol of spanhead.h exists in every build.
 */
#include "core/internal.h"

#ifndef SPH_HAVE_CUDA
sph_status sph_tune(sph_ctx_t ctx, const sph_tune_opts *opts, const char **result) {
    (void)ctx;
    (void)opts;
    if (result) *result = "";
    return sph_err(SPH_ERR_UNSUPPORTED, "tune: this build of spanhead has no CUDA backend");
}

sph_status sph_tune_gemm_rate(sph_ctx_t ctx, sph_dtype dtype, int64_t M, int64_t N, int64_t K,
                              int repeats, double *tflops) {
    (void)ctx;
    (void)dtype;
    (void)M;
    (void)N;
    (void)K;
    (void)repeats;
    if (tflops) *tflops = 0;
    return sph_err(SPH_ERR_UNSUPPORTED,
                   "tune_gemm_rate: this build of spanhead has no CUDA backend");
}

sph_status sph_tune_gemm_rate_sustained(sph_ctx_t ctx, sph_dtype dtype, int64_t M, int64_t N,
                                        int64_t K, int chain, int repeats, double *tflops) {
    (void)ctx;
    (void)dtype;
    (void)M;
    (void)N;
    (void)K;
    (void)chain;
    (void)repeats;
    if (tflops) *tflops = 0;
    return sph_err(SPH_ERR_UNSUPPORTED,
                   "tune_gemm_rate_sustained: this build of spanhead has no CUDA backend");
}
#else
typedef int sph_nocuda_unused; /* ISO C forbids an empty translation unit */
#endif
