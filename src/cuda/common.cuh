/*
 * common.cuh - error macros shared by the CUDA sources. Each records the expression, the CUDA
 * error string and file:line into this thread's message, sets the status and jumps to the
 * function's single `fail:` label (or returns, for the _RET forms).
 */
#ifndef SPH_CUDA_COMMON_CUH
#define SPH_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include "cuda/cublas_shim.h" /* cuBLAS types + the run-time loaded calls */

#include "core/ctx.h"
#include "core/internal.h"

#define SPH_CUDA_RET(expr)                                                                    \
    do {                                                                                      \
        cudaError_t e_ = (expr);                                                              \
        if (e_ != cudaSuccess)                                                                \
            return sph_err(SPH_ERR_CUDA, "%s failed: %s (%s) at %s:%d", #expr,               \
                           cudaGetErrorName(e_), cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)

#define SPH_CUBLAS_RET(expr)                                                                  \
    do {                                                                                      \
        cublasStatus_t e_ = (expr);                                                           \
        if (e_ != CUBLAS_STATUS_SUCCESS)                                                      \
            return sph_err(SPH_ERR_CUDA, "%s failed: cuBLAS status %d (%s) at %s:%d", #expr, \
                           (int)e_, cublasGetStatusString(e_), __FILE__, __LINE__);          \
    } while (0)

/* After a launch: the launch error, and with SPH_SYNC_CHECK the kernel's own fault. */
#ifdef SPH_SYNC_CHECK
#define SPH_LAUNCH_CHECK(name, stream)                                                        \
    do {                                                                                      \
        cudaError_t e_ = cudaGetLastError();                                                  \
        if (e_ == cudaSuccess) e_ = cudaStreamSynchronize(stream);                            \
        if (e_ != cudaSuccess)                                                                \
            return sph_err(SPH_ERR_CUDA, "kernel %s: %s (%s) at %s:%d", name,                 \
                           cudaGetErrorName(e_), cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)
#else
#define SPH_LAUNCH_CHECK(name, stream)                                                        \
    do {                                                                                      \
        cudaError_t e_ = cudaGetLastError();                                                  \
        if (e_ != cudaSuccess)                                                                \
            return sph_err(SPH_ERR_CUDA, "kernel %s: launch failed: %s (%s) at %s:%d", name,  \
                           cudaGetErrorName(e_), cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)
#endif

#endif
