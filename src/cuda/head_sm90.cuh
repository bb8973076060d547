/*
 * head_sm90.cuh - the Hopper (sm_90a: TMA + mbarrier pipeline + wgmma) variant of the
 * batch-invariant logits kernel (head_sm90.cu). Same contract as sph_cuda_logits_fixed:
 * L[r, c] = sum_k h[r, k] w[c, k] for r < R, c < Vs, fp32 out with row stride ldL, every
 * element summed in one fixed k order whatever R, the tile or the row's position.
 *
 * C-callable (the GPU tests ask sph_cuda_sm90_available whether the path is live).
 */
#ifndef SPH_CUDA_HEAD_SM90_CUH
#define SPH_CUDA_HEAD_SM90_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "spanhead.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the current device is sm_90, the library holds the sm_90a kernels, the driver has
 * the tensor-map encoder, and SPH_CUDA_SM90 is not "0" (A/B switch, read at every call). */
int sph_cuda_sm90_available(void);

/* 1 when the sm_90a kernel takes logits of these operands: bf16/f16, H % 8 == 0, row strides
 * multiples of 8 elements, 16-byte aligned bases, and sph_cuda_sm90_available(). Ask it with
 * the user's tensors (not a chunk's), so every chunk of every batch gets the same kernel. */
int sph_cuda_logits_sm90_usable(sph_dtype dt, const void *h, int64_t ld_h, const void *w,
                                int64_t ld_w, int64_t H);

/* Launches the kernel on stream (asynchronous). Operands must satisfy the conditions above
 * (SPH_ERR_INTERNAL otherwise); a launch error comes back with the kernel's name. */
sph_status sph_cuda_logits_sm90(sph_dtype dt, const void *h, int64_t ld_h, const void *w,
                                int64_t ld_w, float *L, int64_t ldL, int64_t R, int64_t Vs,
                                int64_t H, cudaStream_t stream);

/* Benchmarks and tests: the batch-invariant logits through one named kernel, variant 0 the
 * mma.sync kernel (sph_cuda_logits_fixed), 1 the sm_90a kernel (SPH_ERR_UNSUPPORTED when
 * it cannot take these operands here). */
sph_status sph_cuda_logits_variant(int variant, sph_dtype dt, const void *h, int64_t ld_h,
                                   const void *w, int64_t ld_w, float *L, int64_t ldL, int64_t R,
                                   int64_t Vs, int64_t H, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
