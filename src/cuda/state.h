/* state.h - per-context CUDA state (hidden): device properties, the cuBLAS handle, the tune
 * table read from the tune cache at context creation, and sph_tune's forced configuration. */
#ifndef SPH_CUDA_STATE_H
#define SPH_CUDA_STATE_H

#include <cuda_runtime.h>
#include "cuda/cublas_shim.h" /* cuBLAS types + the run-time loaded calls */
#include <stdint.h>

#define SPH_TUNE_MAX_ENTRIES 256

/* One tuned configuration: the winner for (GPU name, dtype, H, V_loc, N bucket). */
typedef struct sph_tune_entry {
    char gpu[64];
    char dtype[8];
    int64_t H, V_loc, N_bucket;
    int64_t chunk_rows; /* 0 = automatic */
    int64_t split;      /* vocabulary split width; 0 = whole shard */
    double ms;          /* measured fwd+bwd time of the winner */
} sph_tune_entry;

typedef struct sph_cuda_state {
    struct cudaDeviceProp prop;
    int cc;                 /* compute capability, e.g. 90 */
    cublasHandle_t cublas;
    int n_tune;
    sph_tune_entry tune[SPH_TUNE_MAX_ENTRIES];
    int no_gather;                   /* SPH_CUDA_GATHER=0: chunks never cross spans (A/B) */
    int no_square;                   /* SPH_CUDA_SQUARE=0: backward keeps whole-shard rows */
    int no_fused;                    /* SPH_CUDA_FUSED=0: no sm_90a fused epilogues (A/B) */
    int no_colouter;                 /* SPH_CUDA_COLOUTER=0: gradient sweep row-outer (A/B) */
    int dense_bwd;                   /* SPH_CUDA_BWD_DENSE=1: backward over every row (ablation) */
    int assume_sm90;                 /* layout tests without a GPU: plan as on an sm_90 device */
    int forcing;                     /* 1 while sph_tune times a candidate: */
    int64_t force_rows, force_split; /* its configuration (0 = automatic) */
} sph_cuda_state;

#endif
