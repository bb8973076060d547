/*
 * bench_cuda.h - what the CUDA benchmarks share: a CUDA-call check that exits with the call's
 * text and location, and a float comparison for qsort (medians of repeated timings).
 */
#ifndef SPH_BENCH_CUDA_H
#define SPH_BENCH_CUDA_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s failed: %s at %s:%d\n", #x, cudaGetErrorString(e_), __FILE__,   \
                    __LINE__);                                                                 \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static inline int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

#endif
