/*
 * head_splitk.cu - DH_SPLITK (issue 23, v14): the dH GEMM of a short chunk cut over the
 * vocabulary. A chunk of R rows has R x H outputs and a contraction over the whole shard
 * (V_loc columns): at 1K rows and H 2048 that is 64 output tiles of 128 x 256 for 132 SMs, each
 * running a 62K-long k loop. Here the contraction is split into S pieces (one strided-batched
 * cuBLAS GEMM, fp32 partials P (S, R, H); the few columns the equal split leaves go into P[0]
 * by one more GEMM), and this file's kernel sums the partials into the destination (fp32
 * accumulator or the user's half-precision dH, overwritten or accumulated).
 * Cost: S R H 4 bytes written and read once (1K x 4096 x 3 splits: 50 MB, ~15 us) for S times
 * the CTAs in the GEMM. The order of the sum over the vocabulary changes (so may the bits); the
 * result stays within the parity tolerances.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda/head.cuh"
#include "cuda/head_math.cuh"

/* C[r * ldc + j] = (acc ? C : 0) + sum_s P[s * stride + r * H + j] for r < rows, j < H. */
template <typename T>
__global__ void __launch_bounds__(256)
    head_splitk_sum_kernel(const float *__restrict__ P, int64_t S, int64_t stride, int64_t rows,
                           int64_t H, T *C, int64_t ldc, int acc) {
    const int64_t n = rows * H;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = k / H, j = k % H;
        float v = 0.f;
        for (int64_t s = 0; s < S; s++) v += P[s * stride + k];
        T *dst = C + r * ldc + j;
        if (acc) v += to_f32(*dst);
        *dst = from_f32<T>(v);
    }
}

sph_status sph_cuda_splitk_sum(const float *P, int64_t S, int64_t stride, int64_t rows,
                               int64_t H, void *C, int64_t ldc, cudaDataType_t ct, int acc,
                               cudaStream_t stream) {
    if (rows <= 0 || H <= 0) return SPH_OK;
    SPH_CHECK(S >= 1 && stride >= rows * H && ldc >= H, SPH_ERR_INTERNAL,
              "splitk sum: %lld splits of stride %lld for %lld x %lld (ldc %lld)", (long long)S,
              (long long)stride, (long long)rows, (long long)H, (long long)ldc);
    int64_t blocks = (rows * H + 255) / 256;
    if (blocks > 8 * 1024) blocks = 8 * 1024; /* grid-stride beyond */
    if (ct == CUDA_R_32F)
        head_splitk_sum_kernel<float><<<(unsigned)blocks, 256, 0, stream>>>(
            P, S, stride, rows, H, (float *)C, ldc, acc);
    else if (ct == CUDA_R_16BF)
        head_splitk_sum_kernel<__nv_bfloat16><<<(unsigned)blocks, 256, 0, stream>>>(
            P, S, stride, rows, H, (__nv_bfloat16 *)C, ldc, acc);
    else
        head_splitk_sum_kernel<__half><<<(unsigned)blocks, 256, 0, stream>>>(
            P, S, stride, rows, H, (__half *)C, ldc, acc);
    SPH_LAUNCH_CHECK("head_splitk_sum_kernel", stream);
    return SPH_OK;
}
