/*
 * tune.cuh - the autotuning cache of the CUDA head (tune.cu).
 *
 * File format (one JSON object per line, written and read by hand, no JSON library):
 *   {"gpu":"NVIDIA H200","dtype":"bf16","H":4096,"V_loc":37984,"N_bucket":65536,
 *    "chunk_rows":4096,"split":0,"ms":12.5}
 * Later lines win over earlier ones for the same key; unknown or malformed lines are skipped
 * (logged at debug level). N_bucket is N rounded up to a power of two.
 */
#ifndef SPH_CUDA_TUNE_CUH
#define SPH_CUDA_TUNE_CUH

#include "core/ctx.h"
#include "cuda/state.h"

#ifdef __cplusplus
extern "C" {
#endif

int64_t sph_tune_bucket(int64_t N);
/* Reads ctx->tune_cache into st (missing file: no entries, not an error). */
void sph_cuda_tune_load(sph_ctx_t ctx, sph_cuda_state *st);
/* 1 and *e filled when the table has an entry for this GPU and shape. */
int sph_cuda_tune_lookup(const sph_cuda_state *st, sph_dtype dt, int64_t H, int64_t V_loc,
                         int64_t N, sph_tune_entry *e);
/* sph_tune, sph_tune_gemm_rate, sph_tune_gemm_rate_sustained of spanhead.h (the CUDA device
 * table's slots). */
sph_status sph_cuda_tune(sph_ctx_t ctx, const sph_tune_opts *opts, const char **result);
sph_status sph_cuda_gemm_rate(sph_ctx_t ctx, sph_dtype dtype, int64_t M, int64_t N, int64_t K,
                              int repeats, double *tflops);
sph_status sph_cuda_gemm_rate_sustained(sph_ctx_t ctx, sph_dtype dtype, int64_t M, int64_t N,
                                        int64_t K, int chain, int repeats, double *tflops);

#ifdef __cplusplus
}
#endif
#endif
