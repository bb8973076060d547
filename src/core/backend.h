/*
 * backend.h - the two tables through which a context reaches its device and its kernels.
 *
 *   sph_device_ops   one per device type, defined by its backend (the host's in
 *                    src/head/host_device.c, CUDA's in src/cuda/runtime.cu) and handed out by
 *                    the registry (registry.c): the context's lifetime on the device, its
 *                    memory helpers, the CUDA-only calls (autotuning, GEMM rates), and the
 *                    functions that fill the head table (the reference's, the device's
 *                    kernels'), so that core names no head function.
 *   sph_head_backend one per context (ctx->head), filled once at creation, BLIS-style: the
 *                    float64 reference first (every slot; staged through host copies when
 *                    the device's memory is not host memory), then, unless the reference is
 *                    forced (force_kernel / SPH_KERNEL "ref"), the device's backend overrides
 *                    the slots it implements.
 *
 * A call from the public API to a kernel:
 *   sph_head_forward (src/head/head.c)
 *     -> sph_head_plan_validate (head.c, feeding the validator of core/validate.h), then
 *        ctx->head.check (backend conditions)
 *     -> ctx->head.workspace, then ctx->head.check_workspace (where the workspace lives)
 *     -> ctx->head.forward | support_forward (sample support: candidates given)
 *          reference: sph_head_ref_forward (head_ref.c), staged: head_ref_stage.c
 *          CPU:       head_cpu.c's forward -> ctx->head.cpu_kern (ISA loops)
 *          CUDA:      sph_head_cuda_forward (src/cuda/head.cu) -> cuBLAS / sm_90a kernels
 * The backward goes the same way through .backward / .support_backward.
 *
 * The losses above the head (src/policy, ...) keep tables of their own: the host ones chosen
 * by the loss from the context (forced reference or not), a device's handed out by the
 * device table's loss_backend slot (opaque here); they reach the head through this table and
 * the plan's row hook (src/head/plan.h). Neither table's type names a loss.
 *
 * SPH_HAVE_CUDA appears in registry.c only: the rest of the library asks the registry.
 */
#ifndef SPH_CORE_BACKEND_H
#define SPH_CORE_BACKEND_H

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- the head table ---------------------------------------------------------------------

/* The head's validated call (src/head/plan.h): core passes it by pointer and never reads it. */
typedef struct sph_head_plan sph_head_plan;
struct sph_head_kern;   /* CPU tile micro-kernels of one ISA (src/head/cpu_kernels.h) */

/* A pass of the head on a validated plan. ws is the caller's workspace (at least the bytes
 * the workspace slot asked for, already checked). */
typedef sph_status (*sph_head_pass_fn)(sph_ctx_t ctx, const sph_head_plan *p, void *ws,
                                       size_t ws_bytes);

typedef struct sph_head_backend {
    const char *name; /* of the backend that filled forward: "ref", "ref (staged)", "cpu",
                         "cuda" */
    /* Conditions of this backend beyond the generic validation (device pointers, alignment
     * of TMA operands, capability, size limits), run by sph_head_plan_make after it, before
     * any output is written. NULL: none. */
    sph_status (*check)(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p);
    /* Exact workspace bytes of the pass (0 is a valid answer). */
    sph_status (*workspace)(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p,
                            size_t *bytes);
    /* Where a non-empty workspace of `bytes` must live and how it must be aligned. NULL: any
     * host memory. */
    sph_status (*check_workspace)(sph_ctx_t ctx, const void *ws, size_t bytes);
    /* How the pass would run (sph_head_describe); info->workspace_bytes is already set.
     * NULL: path = name, nothing else. */
    sph_status (*describe)(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p,
                           sph_head_pass_info *info);
    sph_head_pass_fn forward, backward;                 /* full vocabulary (K = 0) */
    sph_head_pass_fn support_forward, support_backward; /* sample support (K > 0) */
    /* CPU backends: the tile micro-kernels of the context's ISA (picked once at creation). */
    const struct sph_head_kern *cpu_kern;
    /* 1 when the forward/backward slots honour batch_invariant (a row's outputs bitwise
     * independent of the other rows, N, the mask, the row's position); a context asking for it
     * from a backend that does not is SPH_ERR_UNSUPPORTED at creation. */
    int batch_invariant;
} sph_head_backend;

/* SPH_ERR_UNSUPPORTED naming the missing slot and the backend: "<what>: not implemented by
 * the <name> backend of this context". */
sph_status sph_backend_missing(sph_ctx_t ctx, const char *what);

// ---- the device table -------------------------------------------------------------------

/* One tensor of sph_scale_inplace: rows x cols elements, row stride ld (elements). */
typedef struct sph_scale_job {
    void *data;
    int64_t rows, cols, ld;
    sph_dtype dtype;
} sph_scale_job;

/* The host device's scale op (src/core/scale.c): host memory, the scalar read in place. */
sph_status sph_host_scale(sph_ctx_t ctx, const float *scale, const sph_scale_job *jobs, int n);

typedef struct sph_device_ops {
    const char *name;      /* "cpu", "cuda" */
    int host_memory;       /* tensors on this device are host memory (the reference reads them
                              in place) */
    /* Context lifetime on the device: state, handles, ctx->describe. fini is NULL-safe on a
     * context whose init failed. */
    sph_status (*ctx_init)(sph_ctx_t ctx);
    void (*ctx_fini)(sph_ctx_t ctx);
    /* The head table's fill functions, carried by the device so that core names none of
     * them: ref_fill puts the float64 reference in every slot (staged: through host copies,
     * for a device whose memory is not host memory); head_fill then puts this device's
     * kernels over it, slot by slot (skipped when the reference is forced). */
    void (*ref_fill)(sph_ctx_t ctx, sph_head_backend *be, int staged);
    void (*head_fill)(sph_ctx_t ctx, sph_head_backend *be);
    /* This device's backend of a loss above the head, by the loss's name ("policy"): the
     * loss's own table (its type is the loss's), NULL when the device has none. NULL slot:
     * none for any loss (the host device: each loss holds its CPU backends itself). */
    const void *(*loss_backend)(const char *loss);
    /* Memory helpers behind sph_ctx_malloc and friends (memcpy is synchronous). */
    sph_status (*malloc)(sph_ctx_t ctx, size_t bytes, void **ptr);
    void (*free)(sph_ctx_t ctx, void *ptr);
    sph_status (*memcpy)(sph_ctx_t ctx, void *dst, const void *src, size_t bytes);
    sph_status (*memset)(sph_ctx_t ctx, void *dst, int value, size_t bytes);
    sph_status (*synchronize)(sph_ctx_t ctx);
    /* Devices present (never fails); where a pointer lives: 1 this device's memory, 0 host,
     * -1 unknown. NULL on the host device. */
    int (*count)(void);
    int (*pointer_is_device)(const void *p);
    /* sph_ctx_nonfinite on this device: rows found non-finite since the last call (reset),
     * the first of them (-1: none). NULL: the host counters of the context. */
    sph_status (*nonfinite)(sph_ctx_t ctx, int64_t *count, int64_t *first_row);
    /* sph_scale_inplace: each job's elements times *scale (device memory of this device;
     * nothing touched where it is exactly 1), validated by the entry point (src/core/scale.c). */
    sph_status (*scale)(sph_ctx_t ctx, const float *scale, const struct sph_scale_job *jobs,
                        int n);
    /* The CUDA-only public calls (spanhead.h); NULL on other devices. */
    sph_status (*tune)(sph_ctx_t ctx, const sph_tune_opts *opts, const char **result);
    sph_status (*gemm_rate)(sph_ctx_t ctx, sph_dtype dtype, int64_t M, int64_t N, int64_t K,
                            int repeats, double *tflops);
    sph_status (*gemm_rate_sustained)(sph_ctx_t ctx, sph_dtype dtype, int64_t M, int64_t N,
                                      int64_t K, int chain, int repeats, double *tflops);
} sph_device_ops;

/* The device tables the backends define: the host device's (src/head/host_device.c: host
 * memory, the reference and the optimized CPU head) and CUDA's (src/cuda/runtime.cu). */
const sph_device_ops *sph_host_device_ops(void);

/* The registry (registry.c): the table of a device type, NULL when this build has none. */
const sph_device_ops *sph_registry_device(sph_device_type type);
/* 1 when some device backend of this build says p is its device memory (spans, which are
 * read on the host, are checked with it); 0 otherwise. */
int sph_registry_pointer_is_device(const void *p);

#ifdef __cplusplus
}
#endif
#endif
