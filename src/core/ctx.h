/*
 * ctx.h - the context behind sph_ctx_t: device, stream, threads, chosen kernels, backend
 * state and the communicator. Shared by every backend (hidden).
 */
#ifndef SPH_CORE_CTX_H
#define SPH_CORE_CTX_H

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sph_cpu_isa {
    SPH_ISA_REF = 0,    /* float64 reference loops */
    SPH_ISA_GENERIC = 1,/* optimized, portable C + OpenBLAS */
    SPH_ISA_AVX2 = 2,
    SPH_ISA_AVX512 = 3,
    SPH_ISA_AVX512BF16 = 4
} sph_cpu_isa;

struct sph_ctx {
    sph_ctx_opts opts;      /* a copy; pointers inside are the caller's */
    sph_device device;
    void *stream;           /* cudaStream_t */
    int num_threads;
    sph_cpu_isa isa;        /* CPU kernel set */
    int use_ref;            /* force the reference path (CPU or, for tests, CUDA) */
    int64_t chunk_rows;
    int64_t chunk_bytes;
    sph_comm_t tp_comm;
    char tune_cache[1024];
    char describe[256];
    void *cuda;             /* backend state owned by src/cuda (cuBLAS handle, props, ...) */
};

const char *sph_cpu_isa_name(sph_cpu_isa isa);
/* Best ISA this CPU supports (detected once per process). */
sph_cpu_isa sph_cpu_isa_detect(void);

/* CUDA backend hooks, implemented in src/cuda when built with CUDA. */
sph_status sph_cuda_ctx_init(sph_ctx_t ctx);
void sph_cuda_ctx_fini(sph_ctx_t ctx);
sph_status sph_cuda_malloc(sph_ctx_t ctx, size_t bytes, void **ptr);
void sph_cuda_free(sph_ctx_t ctx, void *ptr);
sph_status sph_cuda_memcpy(sph_ctx_t ctx, void *dst, const void *src, size_t bytes);
sph_status sph_cuda_memset(sph_ctx_t ctx, void *dst, int value, size_t bytes);
sph_status sph_cuda_synchronize(sph_ctx_t ctx);
int sph_cuda_count(void);
/* Where a pointer lives: 1 device memory, 0 host (pageable or pinned), -1 unknown. */
int sph_cuda_pointer_is_device(const void *p);

#ifdef __cplusplus
}
#endif
#endif
