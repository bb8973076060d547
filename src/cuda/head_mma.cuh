/*
 * head_mma.cuh - the mma.sync building blocks shared by the fixed-tiling kernels of the
 * batch-invariant mode (head_mma.cu: the logits, head_mma_dh.cu: dHidden): 16-byte cp.async
 * copies with zero fill, their commit / wait, the m16n8k16 bf16 / f16 MMA with fp32
 * accumulation (row-major A, column-major B fragments), and the kernels' shared main loop.
 */
#ifndef SPH_CUDA_HEAD_MMA_CUH
#define SPH_CUDA_HEAD_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* 16 bytes from gmem to smem; bytes past src_bytes (0..16) are zero-filled. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* D (16 x 8, fp32) += A (16 x 16) . B (16 x 8): one mma.sync.m16n8k16. */
template <typename T> struct mma_op;
template <> struct mma_op<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float *d, const uint32_t *a, const uint32_t *b) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};
template <> struct mma_op<__half> {
    static __device__ __forceinline__ void run(float *d, const uint32_t *a, const uint32_t *b) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

/* The main loop of the fixed-tiling mma.sync kernels (head_mma.cu: the logits, head_mma_dh.cu:
 * dHidden), written once: a 128 x 128 block tile of 8 warps of 64 x 32 (warp w: rows
 * (w / 4) * 64, columns (w % 4) * 32), nk k-tiles of BK double-buffered in shared memory
 * (stages As + s * A_STAGE, Bs + s * B_STAGE; cp.async when AL), and per 16-wide k step the
 * A fragments of the warp's 4 m16 tiles (row-major A, row stride LDA), the B fragments of its
 * 4 n8 tiles (frag_b), then the 16 mma steps in (mt, nt) order. Every accumulator is the sum
 * over k in ascending 16-wide steps whatever the tile: both kernels' batch invariance.
 *   load(s, kt)                 issues the copies of k-tile kt into stage s (no wait)
 *   frag_b(B, ks, nt, bfr[nt])  reads the nt-th B fragment of k step ks from stage B */
template <typename T, int BK, int LDA, int A_STAGE, int B_STAGE, bool AL, typename Load,
          typename FragB>
__device__ __forceinline__ void mma_main_loop(float (&acc)[4][4][4], int64_t nk, T *As, T *Bs,
                                              Load load, FragB frag_b) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp / 4, g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[a][b][c] = 0.f;
    load(0, 0);
    if (AL) cp_async_commit();
    for (int64_t kt = 0; kt < nk; kt++) {
        const int buf = kt & 1;
        if (kt + 1 < nk) {
            load(buf ^ 1, kt + 1);
            if (AL) {
                cp_async_commit();
                cp_async_wait<1>(); /* tile kt has landed, kt + 1 may still be in flight */
            }
        } else if (AL) {
            cp_async_wait<0>();
        }
        __syncthreads(); /* tile kt visible to every warp */
        const T *A = As + buf * A_STAGE, *B = Bs + buf * B_STAGE;
#pragma unroll
        for (int ks = 0; ks < BK; ks += 16) {
            uint32_t af[4][4], bfr[4][2];
#pragma unroll
            for (int mt = 0; mt < 4; mt++) {
                const T *base = A + (wm * 64 + mt * 16 + g) * LDA + ks + tq * 2;
                af[mt][0] = *(const uint32_t *)(base);
                af[mt][1] = *(const uint32_t *)(base + 8 * LDA);
                af[mt][2] = *(const uint32_t *)(base + 8);
                af[mt][3] = *(const uint32_t *)(base + 8 * LDA + 8);
            }
#pragma unroll
            for (int nt = 0; nt < 4; nt++) frag_b(B, ks, nt, bfr[nt]);
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++) mma_op<T>::run(acc[mt][nt], af[mt], bfr[nt]);
        }
        __syncthreads(); /* everyone done reading buf before it is refilled */
    }
}

#endif
