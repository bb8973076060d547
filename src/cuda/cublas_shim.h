/*
 * cublas_shim.h - the cuBLAS functions spanhead calls, resolved at run time (core/dynload.h):
 * libspanhead carries no DT_NEEDED on libcublas, so it uses the copy the process already has
 * (PyTorch's, from its wheel) and loads one itself only when there is none.
 *
 * Include this instead of <cublas_v2.h>: the types and enums still come from the toolkit's
 * header; each cublas* call used in src/cuda is mapped by a macro onto the table below, so
 * call sites read as plain cuBLAS. sph_cublas_load() fills the table once per process (CUDA
 * context creation calls it); calling a mapped function before that is a bug.
 * A new cuBLAS call: one line in SPH_CUBLAS_FUNCS (and its #define below).
 */
#ifndef SPH_CUDA_CUBLAS_SHIM_H
#define SPH_CUDA_CUBLAS_SHIM_H

#include <cublas_v2.h>

#include "spanhead.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(field, symbol in libcublas, return type, parameters) */
#define SPH_CUBLAS_FUNCS(X)                                                                   \
    X(create, "cublasCreate_v2", cublasStatus_t, (cublasHandle_t *))                          \
    X(destroy, "cublasDestroy_v2", cublasStatus_t, (cublasHandle_t))                          \
    X(set_stream, "cublasSetStream_v2", cublasStatus_t, (cublasHandle_t, cudaStream_t))       \
    X(set_workspace, "cublasSetWorkspace_v2", cublasStatus_t, (cublasHandle_t, void *, size_t)) \
    X(gemm_ex, "cublasGemmEx", cublasStatus_t,                                                \
      (cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,     \
       const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *, \
       cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t))                            \
    X(gemm_strided_batched_ex, "cublasGemmStridedBatchedEx", cublasStatus_t,                  \
      (cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,     \
       const void *, cudaDataType, int, long long int, const void *, cudaDataType, int,       \
       long long int, const void *, void *, cudaDataType, int, long long int, int,             \
       cublasComputeType_t, cublasGemmAlgo_t))                                                 \
    X(status_string, "cublasGetStatusString", const char *, (cublasStatus_t))

#define SPH_CUBLAS_FIELD(field, sym, ret, params) ret(*field) params;
typedef struct sph_cublas_api {
    SPH_CUBLAS_FUNCS(SPH_CUBLAS_FIELD)
} sph_cublas_api;
#undef SPH_CUBLAS_FIELD

extern sph_cublas_api sph_cublas_fn;

/* Loads libcublas.so.<major of the headers> once per process (thread-safe); the result,
 * success or the error, is sticky. SPH_ERR_UNSUPPORTED with the places tried on failure. */
sph_status sph_cublas_load(void);
/* The path of the cuBLAS in use ("" before a successful load). */
const char *sph_cublas_path(void);

#ifdef __cplusplus
}
#endif

#undef cublasCreate
#undef cublasDestroy
#undef cublasSetStream
#undef cublasSetWorkspace
#define cublasCreate (sph_cublas_fn.create)
#define cublasDestroy (sph_cublas_fn.destroy)
#define cublasSetStream (sph_cublas_fn.set_stream)
#define cublasSetWorkspace (sph_cublas_fn.set_workspace)
#define cublasGemmEx (sph_cublas_fn.gemm_ex)
#undef cublasGemmStridedBatchedEx
#define cublasGemmStridedBatchedEx (sph_cublas_fn.gemm_strided_batched_ex)
#define cublasGetStatusString (sph_cublas_fn.status_string)

#endif
