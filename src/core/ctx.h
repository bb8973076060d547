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

/* A live context's first word; sph_ctx_destroy overwrites it before freeing, so a destroyed
 * or garbage context is refused where the memory can still be read (best effort: a freed
 * block may be reused, and reading it at all is what the sanitizers report). */
#define SPH_CTX_MAGIC UINT64_C(0x3130585443485053) /* "SPHCTX01" */
#define SPH_CTX_DEAD UINT64_C(0x44414544585443)    /* "CTXDEAD" */

struct sph_ctx {
    uint64_t magic;         /* SPH_CTX_MAGIC while alive */
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
    /* Non-finite rows found by host passes since the last sph_ctx_nonfinite (CUDA keeps its
     * own, on the device). */
    int64_t nf_count, nf_first;
    /* The owner word: 1 while a compute call runs on the context (sph_ctx_enter / leave,
     * atomic builtins: the header is also C++). A context serves one thread at a time; a second
     * thread's call while it is taken is refused, never run beside the first. */
    int busy;
};

/* SPH_OK when ctx is a live context; SPH_ERR_INVALID_ARG naming `who` otherwise. */
sph_status sph_ctx_check(sph_ctx_t ctx, const char *who);
/* The owner word around a compute call: sph_ctx_enter checks ctx (sph_ctx_check) and takes
 * it, SPH_ERR_INVALID_ARG naming `who` when another call holds it (another thread, or a call
 * made from inside a call); sph_ctx_leave gives it back and returns s. Every public entry
 * point that computes on the context takes it: sph_head_forward / backward, sph_policy_loss,
 * sph_ctx_nonfinite. */
sph_status sph_ctx_enter(sph_ctx_t ctx, const char *who);
sph_status sph_ctx_leave(sph_ctx_t ctx, sph_status s);
/* Records n non-finite rows, the first of them row `first`, on a host context. */
void sph_ctx_note_nonfinite(sph_ctx_t ctx, int64_t n, int64_t first);

const char *sph_cpu_isa_name(sph_cpu_isa isa);
/* The most threads a context may use on this machine: 4 x the processors, at least 64, within
 * OpenMP's thread limit (spanhead.h, "Policies"). */
int sph_max_threads(void);
/* Best ISA this CPU supports (detected once per process). */
sph_cpu_isa sph_cpu_isa_detect(void);

#ifdef __cplusplus
}
#endif
#endif
