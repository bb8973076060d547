/*
 * ctx.h - the context behind sph_ctx_t: device, stream, threads, the device table and the
 * head table (core/backend.h), backend state and the communicator. Shared by every backend
 * (hidden).
 */
#ifndef SPH_CORE_CTX_H
#define SPH_CORE_CTX_H

#include "core/backend.h"

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
    int use_ref;            /* force_kernel "ref": the head table keeps the reference in every
                               slot (staged through host copies on CUDA) */
    int64_t chunk_rows;
    int64_t chunk_bytes;
    sph_comm_t tp_comm;
    char tune_cache[1024];
    char describe[256];
    void *cuda;             /* backend state owned by src/cuda (cuBLAS handle, props, ...) */
    const sph_device_ops *dev; /* the device's table (registry.c) */
    sph_head_backend head;  /* the head's entry points, filled once at creation */
};

const char *sph_cpu_isa_name(sph_cpu_isa isa);
/* Best ISA this CPU supports (detected once per process). */
sph_cpu_isa sph_cpu_isa_detect(void);

#ifdef __cplusplus
}
#endif
#endif
