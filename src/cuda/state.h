/* state.h - per-context CUDA state (hidden). */
#ifndef SPH_CUDA_STATE_H
#define SPH_CUDA_STATE_H

#include <cuda_runtime.h>
#include <cublas_v2.h>

typedef struct sph_cuda_state {
    cudaDeviceProp prop;
    int cc;                 /* compute capability, e.g. 90 */
    cublasHandle_t cublas;
} sph_cuda_state;

#endif
