/*
 * head_mma.cuh - the mma.sync building blocks shared by the fixed-tiling kernels of the
 * batch-invariant mode (head_mma.cu: the logits, head_mma_dh.cu: dHidden): 16-byte cp.async
 * copies with zero fill, their commit / wait, and the m16n8k16 bf16 / f16 MMA with fp32
 * accumulation (row-major A, column-major B fragments).
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

#endif
