/*
 * head_mma_dh.cu - the fixed-tiling dHidden product of the batch-invariant mode (issue 18,
 * item 14): C (R, H) (+)= D (R, Vs) . W (Vs, H), D the chunk's dlogits, W the split's weight
 * rows, fp32 accumulation.
 *
 * Why: cuBLAS picks its algorithm from (R, H, Vs), so the same row's dhidden rounded
 * differently when the batch around it changed (notes/cuda-notes.md has the size). Here
 * every output element is acc = 0, then acc += one 16-wide mma.sync step for k = 0, 16, 32, ...
 * ascending, whatever the tile, the row's position, R or the chunk: a row's dhidden depends on
 * its own dlogits row, W and Vs only (the splits are added in a fixed order by the caller).
 *
 * bf16/f16: mma.sync.m16n8k16 (fp32 accumulate), 128 x 128 x 32 block tiles, 8 warps of
 * 64 x 32 as in head_mma.cu; A (D) K-major as there; B (W) is N-major (row k holds H
 * contiguous columns), staged as [k][n] and read with ldmatrix .trans, which hands each thread
 * the (k, k + 1) pairs of one column that the mma's col-major B fragment wants. f32: exact FP32
 * FMA, 64 x 64 x 16 tiles. Output fp32 or the input dtype, overwritten or accumulated (old
 * value + sum, rounded once).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda/head.cuh"
#include "cuda/head_math.cuh"
#include "cuda/head_mma.cuh"

#define DH_BM 128
#define DH_BN 128
#define DH_BK 32
#define DH_LDA (DH_BK + 8)  /* halves: A rows of 40 (conflict-free fragment loads) */
#define DH_LDB (DH_BN + 8)  /* halves: B rows of 136 = 272 bytes (ldmatrix rows 16-aligned,
                               8 consecutive k rows on distinct 4-bank groups) */

/* A tile: rows [row0, row0 + 128) x k [k0, k0 + 32) of D (row stride ldD, K = Vs columns). */
template <typename T, bool AL>
__device__ __forceinline__ void dh_load_a(T *s, const T *D, int64_t ldD, int64_t R, int64_t Vs,
                                          int64_t row0, int64_t k0) {
#pragma unroll
    for (int it = 0; it < 2; it++) {
        const int chunk = threadIdx.x + it * 256; /* 512 chunks of 8 halves */
        const int r = chunk / 4, kc = (chunk % 4) * 8;
        const int64_t gr = row0 + r, gk = k0 + kc;
        T *dst = s + r * DH_LDA + kc;
        if (AL) {
            const int64_t valid = gr < R ? Vs - gk : 0;
            const int bytes = valid <= 0 ? 0 : (valid >= 8 ? 16 : (int)valid * 2);
            cp_async16(dst, bytes ? D + gr * ldD + gk : D, bytes); /* 0 bytes: zero fill */
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)
                dst[e] = gr < R && gk + e < Vs ? D[gr * ldD + gk + e] : T(0.f);
        }
    }
}

/* B tile: k rows [k0, k0 + 32) x columns [col0, col0 + 128) of W (row stride ld_w, H columns). */
template <typename T, bool AL>
__device__ __forceinline__ void dh_load_b(T *s, const T *W, int64_t ld_w, int64_t Vs, int64_t H,
                                          int64_t k0, int64_t col0) {
#pragma unroll
    for (int it = 0; it < 2; it++) {
        const int chunk = threadIdx.x + it * 256; /* 32 rows x 16 chunks of 8 halves */
        const int k = chunk / 16, nc = (chunk % 16) * 8;
        const int64_t gk = k0 + k, gn = col0 + nc;
        T *dst = s + k * DH_LDB + nc;
        if (AL) {
            const int64_t valid = gk < Vs ? H - gn : 0;
            const int bytes = valid <= 0 ? 0 : (valid >= 8 ? 16 : (int)valid * 2);
            cp_async16(dst, bytes ? W + gk * ld_w + gn : W, bytes);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)
                dst[e] = gk < Vs && gn + e < H ? W[gk * ld_w + gn + e] : T(0.f);
        }
    }
}

/* ct: 0 fp32, 1 bf16, 2 f16 output (store_kind's codes); acc: C = old + sum. */
template <typename T, bool AL>
__global__ void __launch_bounds__(256)
    head_dh_mma_kernel(const T *__restrict__ D, int64_t ldD, const T *__restrict__ W,
                       int64_t ld_w, void *C, int64_t ldc, int ct, int acc_out, int64_t R,
                       int64_t Vs, int64_t H) {
    __shared__ __align__(16) T As[2][DH_BM * DH_LDA];
    __shared__ __align__(16) T Bs[2][DH_BK * DH_LDB];
    const int64_t row0 = (int64_t)blockIdx.y * DH_BM, col0 = (int64_t)blockIdx.x * DH_BN;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp / 4, wn = warp % 4, g = lane >> 2, tq = lane & 3;
    float acc[4][4][4];
    const int64_t nk = (Vs + DH_BK - 1) / DH_BK;
    /* stage s <- k-tile kt of D's rows (K-major) and W's k rows (N-major) */
    auto load = [&](int s, int64_t kt) {
        dh_load_a<T, AL>(As[s], D, ldD, R, Vs, row0, kt * DH_BK);
        dh_load_b<T, AL>(Bs[s], W, ld_w, Vs, H, kt * DH_BK, col0);
    };
    auto frag_b = [&](const T *B, int ks, int nt, uint32_t *bf) {
        /* lanes 0-15 give the addresses of k rows ks .. ks + 15 at column n0; the two 8 x 8
         * matrices come back transposed: (k 2tq, 2tq + 1; n g) and k + 8 */
        const T *rowp = B + (ks + (lane & 15)) * DH_LDB + wn * 32 + nt * 8;
        const unsigned sa = (unsigned)__cvta_generic_to_shared(rowp);
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(bf[0]), "=r"(bf[1])
                     : "r"(sa));
    };
    mma_main_loop<T, DH_BK, DH_LDA, DH_BM * DH_LDA, DH_BK * DH_LDB, AL>(acc, nk, &As[0][0],
                                                                      &Bs[0][0], load, frag_b);
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            const int64_t r = row0 + wm * 64 + mt * 16 + g;
            const int64_t c = col0 + wn * 32 + nt * 8 + tq * 2;
#pragma unroll
            for (int hlf = 0; hlf < 2; hlf++) {
                const int64_t rr = r + hlf * 8;
                if (rr >= R) continue;
                if (c < H) store_kind(C, ct, rr * ldc + c, acc[mt][nt][hlf * 2], acc_out);
                if (c + 1 < H) store_kind(C, ct, rr * ldc + c + 1, acc[mt][nt][hlf * 2 + 1], acc_out);
            }
        }
}

/* Exact fp32: 64 x 64 tile, 256 threads of 4 x 4 outputs, k ascending one FMA at a time. */
__global__ void __launch_bounds__(256)
    head_dh_f32_kernel(const float *__restrict__ D, int64_t ldD, const float *__restrict__ W,
                       int64_t ld_w, void *C, int64_t ldc, int ct, int acc_out, int64_t R,
                       int64_t Vs, int64_t H) {
    __shared__ float As[16][64 + 1], Bs[16][64 + 1];
    const int64_t row0 = (int64_t)blockIdx.y * 64, col0 = (int64_t)blockIdx.x * 64;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < Vs; k0 += 16) {
        for (int e = threadIdx.x; e < 16 * 64; e += 256) {
            const int r = e / 16, k = e % 16; /* A: row r, k */
            const int kb = e / 64, n = e % 64; /* B: k row kb, column n (coalesced over n) */
            As[k][r] = row0 + r < R && k0 + k < Vs ? D[(row0 + r) * ldD + k0 + k] : 0.f;
            Bs[kb][n] = k0 + kb < Vs && col0 + n < H ? W[(k0 + kb) * ld_w + col0 + n] : 0.f;
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
            const int64_t r = row0 + ty * 4 + i, c = col0 + tx * 4 + j;
            if (r < R && c < H) store_kind(C, ct, r * ldc + c, acc[i][j], acc_out);
        }
}

sph_status sph_cuda_dh_fixed(sph_dtype dt, const void *D, int64_t ldD, const void *W,
                             int64_t ld_w, void *C, int64_t ldc, int ct, int acc_out, int64_t R,
                             int64_t Vs, int64_t H, cudaStream_t stream) {
    if (R <= 0 || H <= 0) return SPH_OK;
    SPH_CHECK(ct >= 0 && ct <= 2, SPH_ERR_INTERNAL, "dh_fixed: output kind %d", ct);
    const int is16 = dt.bits == 16;
    const int64_t bm = is16 ? DH_BM : 64, bn = is16 ? DH_BN : 64;
    SPH_CHECK((R + bm - 1) / bm <= 65535 && (H + bn - 1) / bn <= INT32_MAX, SPH_ERR_INTERNAL,
              "dh_fixed: %lld x %lld exceeds the grid", (long long)R, (long long)H);
    dim3 grid((unsigned)((H + bn - 1) / bn), (unsigned)((R + bm - 1) / bm));
    if (Vs <= 0) {
        /* no columns: the product is 0 (an overwrite still writes it) */
        if (acc_out) return SPH_OK;
    }
    if (!is16) {
        head_dh_f32_kernel<<<grid, 256, 0, stream>>>((const float *)D, ldD, (const float *)W,
                                                     ld_w, C, ldc, ct, acc_out, R, Vs, H);
        SPH_LAUNCH_CHECK("head_dh_f32_kernel", stream);
        return SPH_OK;
    }
    const bool al = (uintptr_t)D % 16 == 0 && (uintptr_t)W % 16 == 0 && ldD % 8 == 0 &&
                    ld_w % 8 == 0;
#define DH_LAUNCH(T)                                                                           \
    do {                                                                                       \
        if (al)                                                                                \
            head_dh_mma_kernel<T, true><<<grid, 256, 0, stream>>>(                             \
                (const T *)D, ldD, (const T *)W, ld_w, C, ldc, ct, acc_out, R, Vs, H);         \
        else                                                                                   \
            head_dh_mma_kernel<T, false><<<grid, 256, 0, stream>>>(                            \
                (const T *)D, ldD, (const T *)W, ld_w, C, ldc, ct, acc_out, R, Vs, H);         \
    } while (0)
    if (dt.code == SPH_DTYPE_BFLOAT) DH_LAUNCH(__nv_bfloat16);
    else DH_LAUNCH(__half);
#undef DH_LAUNCH
    SPH_LAUNCH_CHECK("head_dh_mma_kernel", stream);
    return SPH_OK;
}
