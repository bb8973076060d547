/*
 * head_mma.cu - the fixed-tiling logits kernel of the batch-invariant mode and the portable
 * sm_80 path: L (R, Vs) fp32 = h (R, H) . W (Vs, H)^T.
 *
 * bf16/f16: tensor cores through mma.sync.m16n8k16 (fp32 accumulate), 128x128x32 block tiles,
 * 8 warps of 64x32, cp.async double buffering (16-byte copies with zero fill at the edges when
 * rows are 16-byte aligned, plain loads otherwise). f32: exact FP32 FMA, 64x64x16 tiles.
 *
 * Why a kernel of our own: cuBLAS picks its algorithm (tiling, split-K) from the problem
 * shape, so the same row's logits can round differently when N changes. Here every output
 * element is the sum over k in one fixed order (16-wide mma steps, k ascending), whatever the
 * tile it falls in, the chunk size or the row's position: the logits - and so a row's
 * statistics - depend on the row's own inputs only.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda/head.cuh"
#include "cuda/head_mma.cuh"

#define MMA_BM 128
#define MMA_BN 128
#define MMA_BK 32
#define MMA_PAD 8 /* halves: row stride 40 halves = 20 words, conflict-free fragment loads */
#define MMA_LDS (MMA_BK + MMA_PAD)

/* Loads a (128 x 32) tile of rows [row0, row0+128) x cols [k0, k0+32) of a row-major matrix
 * with nrows rows, K columns and row stride ld into smem (128 x MMA_LDS). Out-of-range
 * elements become 0, so they add nothing to the sums. */
template <typename T, bool ALIGNED>
__device__ __forceinline__ void load_tile(T *smem, const T *g, int64_t ld, int64_t nrows,
                                          int64_t K, int64_t row0, int64_t k0) {
#pragma unroll
    for (int it = 0; it < 2; it++) {
        int chunk = threadIdx.x + it * 256; /* 512 chunks of 8 halves */
        int r = chunk / 4, kc = (chunk % 4) * 8;
        int64_t gr = row0 + r, gk = k0 + kc;
        T *dst = smem + r * MMA_LDS + kc;
        if (ALIGNED) {
            int64_t valid = gr < nrows ? K - gk : 0;
            int bytes = valid <= 0 ? 0 : (valid >= 8 ? 16 : (int)valid * 2);
            /* a zero-byte copy still needs a valid address: use the matrix base */
            const T *src = bytes ? g + gr * ld + gk : g;
            cp_async16(dst, src, bytes);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) {
                T v = T(0.f);
                if (gr < nrows && gk + e < K) v = g[gr * ld + gk + e];
                dst[e] = v;
            }
        }
    }
}

template <typename T, bool ALIGNED>
__global__ void __launch_bounds__(256)
    head_logits_mma_kernel(const T *__restrict__ h, int64_t ld_h, const T *__restrict__ w,
                           int64_t ld_w, float *__restrict__ L, int64_t ldL, int64_t R,
                           int64_t Vs, int64_t H) {
    __shared__ __align__(16) T As[2][MMA_BM * MMA_LDS];
    __shared__ __align__(16) T Bs[2][MMA_BN * MMA_LDS];
    const int64_t row0 = (int64_t)blockIdx.y * MMA_BM, col0 = (int64_t)blockIdx.x * MMA_BN;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp / 4, wn = warp % 4, g = lane >> 2, tq = lane & 3;
    float acc[4][4][4];
    const int64_t nk = (H + MMA_BK - 1) / MMA_BK;
    /* stage s <- k-tile kt of h's rows and W's rows (both K-major) */
    auto load = [&](int s, int64_t kt) {
        load_tile<T, ALIGNED>(As[s], h, ld_h, R, H, row0, kt * MMA_BK);
        load_tile<T, ALIGNED>(Bs[s], w, ld_w, Vs, H, col0, kt * MMA_BK);
    };
    /* B (W) is K-major like A: the (k, k + 1) pair of column n is one 32-bit word */
    auto frag_b = [&](const T *B, int ks, int nt, uint32_t *bf) {
        const T *base = B + (wn * 32 + nt * 8 + g) * MMA_LDS + ks + tq * 2;
        bf[0] = *(const uint32_t *)(base);
        bf[1] = *(const uint32_t *)(base + 8);
    };
    mma_main_loop<T, MMA_BK, MMA_LDS, MMA_BM * MMA_LDS, MMA_BN * MMA_LDS, ALIGNED>(
        acc, nk, &As[0][0], &Bs[0][0], load, frag_b);
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            int64_t r = row0 + wm * 64 + mt * 16 + g;
            int64_t c = col0 + wn * 32 + nt * 8 + tq * 2;
#pragma unroll
            for (int hlf = 0; hlf < 2; hlf++) {
                int64_t rr = r + hlf * 8;
                if (rr >= R) continue;
                if (c < Vs) L[rr * ldL + c] = acc[mt][nt][hlf * 2];
                if (c + 1 < Vs) L[rr * ldL + c + 1] = acc[mt][nt][hlf * 2 + 1];
            }
        }
}

/* Exact fp32: 64x64 tile, 256 threads of 4x4 outputs, k ascending one FMA at a time. */
__global__ void __launch_bounds__(256)
    head_logits_f32_kernel(const float *__restrict__ h, int64_t ld_h,
                           const float *__restrict__ w, int64_t ld_w, float *__restrict__ L,
                           int64_t ldL, int64_t R, int64_t Vs, int64_t H) {
    __shared__ float As[16][64 + 1], Bs[16][64 + 1];
    const int64_t row0 = (int64_t)blockIdx.y * 64, col0 = (int64_t)blockIdx.x * 64;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < H; k0 += 16) {
        for (int e = threadIdx.x; e < 16 * 64; e += 256) {
            int r = e / 16, k = e % 16;
            int64_t gk = k0 + k;
            As[k][r] = (row0 + r < R && gk < H) ? h[(row0 + r) * ld_h + gk] : 0.f;
            Bs[k][r] = (col0 + r < Vs && gk < H) ? w[(col0 + r) * ld_w + gk] : 0.f;
        }
        __syncthreads(); /* tiles complete */
#pragma unroll
        for (int k = 0; k < 16; k++)
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] = fmaf(As[k][ty * 4 + i], Bs[k][tx * 4 + j], acc[i][j]);
        __syncthreads(); /* reads done before the next fill */
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            int64_t r = row0 + ty * 4 + i, c = col0 + tx * 4 + j;
            if (r < R && c < Vs) L[r * ldL + c] = acc[i][j];
        }
}

template <typename T>
static sph_status launch_mma(const void *h, int64_t ld_h, const void *w, int64_t ld_w, float *L,
                             int64_t ldL, int64_t R, int64_t Vs, int64_t H, cudaStream_t stream) {
    dim3 grid((unsigned)((Vs + MMA_BN - 1) / MMA_BN), (unsigned)((R + MMA_BM - 1) / MMA_BM));
    bool aligned = ((uintptr_t)h % 16 == 0) && ((uintptr_t)w % 16 == 0) && (ld_h % 8 == 0) &&
                   (ld_w % 8 == 0);
    if (aligned)
        head_logits_mma_kernel<T, true><<<grid, 256, 0, stream>>>(
            (const T *)h, ld_h, (const T *)w, ld_w, L, ldL, R, Vs, H);
    else
        head_logits_mma_kernel<T, false><<<grid, 256, 0, stream>>>(
            (const T *)h, ld_h, (const T *)w, ld_w, L, ldL, R, Vs, H);
    SPH_LAUNCH_CHECK("head_logits_mma_kernel", stream);
    return SPH_OK;
}

sph_status sph_cuda_logits_fixed(sph_dtype dt, const void *h, int64_t ld_h,
                                            const void *w, int64_t ld_w, float *L, int64_t ldL,
                                            int64_t R, int64_t Vs, int64_t H,
                                            cudaStream_t stream) {
    if (R <= 0 || Vs <= 0) return SPH_OK;
    SPH_CHECK((R + MMA_BM - 1) / MMA_BM <= 65535, SPH_ERR_INTERNAL,
              "logits_fixed: %lld rows exceed the grid", (long long)R);
    if (dt.code == SPH_DTYPE_BFLOAT && dt.bits == 16)
        return launch_mma<__nv_bfloat16>(h, ld_h, w, ld_w, L, ldL, R, Vs, H, stream);
    if (dt.code == SPH_DTYPE_FLOAT && dt.bits == 16)
        return launch_mma<__half>(h, ld_h, w, ld_w, L, ldL, R, Vs, H, stream);
    dim3 grid((unsigned)((Vs + 63) / 64), (unsigned)((R + 63) / 64));
    head_logits_f32_kernel<<<grid, 256, 0, stream>>>((const float *)h, ld_h, (const float *)w,
                                                      ld_w, L, ldL, R, Vs, H);
    SPH_LAUNCH_CHECK("head_logits_f32_kernel", stream);
    return SPH_OK;
}
