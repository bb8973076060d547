/*
 * runtime.cu - the CUDA device table (core/backend.h, reached through registry.c): context
 * state and the memory helpers behind sph_ctx_malloc and friends. The per-context state
 * (device properties, cuBLAS handle) lives here; kernels live in their own files, and the
 * head's slots are filled by sph_head_cuda_fill (head.cu).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/device_ptr.h"
#include "cuda/common.cuh"
#include "cuda/head.cuh"
#include "cuda/head_sm90.cuh"
#include "cuda/state.h"
#include "cuda/tune.cuh"
#include "distill/distill.h"
#include "policy/policy.h"

extern "C" sph_status sph_cuda_scale(sph_ctx_t ctx, const float *scale,
                                     const sph_scale_job *jobs, int n); /* scale.cu */

static int sph_cuda_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    return n;
}

extern "C" int sph_cuda_pointer_is_device(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? 1 : 0;
}

extern "C" sph_status sph_cuda_need_device(const void *ptr, const char *name) {
    if (!ptr) return SPH_OK;
    const int d = sph_cuda_pointer_is_device(ptr);
    SPH_CHECK(d == 1, SPH_ERR_DEVICE, "%s: pointer %p is %s memory, expected CUDA device memory",
              name, ptr, d == 0 ? "host" : "unknown (not CUDA-allocated)");
    return SPH_OK;
}

static sph_status sph_cuda_ctx_init(sph_ctx_t ctx) {
    int n = sph_cuda_count();
    if (n == 0) return sph_err(SPH_ERR_NO_DEVICE, "opts.device: no CUDA device is present");
    if (ctx->device.id >= n)
        return sph_err(SPH_ERR_INVALID_ARG, "opts.device.id is %d, but only %d CUDA device(s)",
                       (int)ctx->device.id, n);
    SPH_CUDA_RET(cudaSetDevice(ctx->device.id));
    sph_cuda_state *st = (sph_cuda_state *)sph_calloc(1, sizeof *st);
    if (!st) return sph_err(SPH_ERR_ALLOC, "cuda context: out of host memory");
    cudaError_t e = cudaGetDeviceProperties(&st->prop, ctx->device.id);
    if (e != cudaSuccess) {
        sph_free(st);
        return sph_err(SPH_ERR_CUDA, "cudaGetDeviceProperties: %s", cudaGetErrorString(e));
    }
    sph_status ls = sph_cublas_load(); /* the process's cuBLAS, else one from the search */
    if (ls != SPH_OK) {
        sph_free(st);
        return ls;
    }
    cublasStatus_t b = cublasCreate(&st->cublas);
    if (b != CUBLAS_STATUS_SUCCESS) {
        sph_free(st);
        return sph_err(SPH_ERR_CUDA, "cublasCreate failed: status %d", (int)b);
    }
    cublasSetStream(st->cublas, (cudaStream_t)ctx->stream);
    st->cc = st->prop.major * 10 + st->prop.minor;
    sph_cuda_tune_load(ctx, st);
    /* the A/B switches (spanhead.h, sph_cuda_flag), validated by sph_ctx_create */
    const uint32_t fl = ctx->opts.cuda_flags;
    st->no_gather = (fl & SPH_CUDA_FLAG_NO_GATHER) != 0;
    st->no_square = (fl & SPH_CUDA_FLAG_NO_SQUARE) != 0;
    st->no_fused = (fl & SPH_CUDA_FLAG_NO_FUSED) != 0;
    st->no_colouter = (fl & SPH_CUDA_FLAG_NO_COLOUTER) != 0;
    st->dense_bwd = (fl & SPH_CUDA_FLAG_DENSE_BACKWARD) != 0;
    st->no_sm90 = (fl & SPH_CUDA_FLAG_NO_SM90) != 0;
    st->schedule = (fl & SPH_CUDA_FLAG_PINGPONG)      ? SPH_SM90_SCHED_PINGPONG
                   : (fl & SPH_CUDA_FLAG_COOPERATIVE) ? SPH_SM90_SCHED_COOPERATIVE
                                                      : SPH_SM90_SCHED_AUTO;
    st->onepass_path = (fl & SPH_CUDA_FLAG_ONEPASS_E)           ? SPH_CUDA_PATH_STAGED_E
                       : (fl & SPH_CUDA_FLAG_ONEPASS_F32)       ? SPH_CUDA_PATH_STAGED_F32
                       : (fl & SPH_CUDA_FLAG_ONEPASS_RECOMPUTE) ? SPH_CUDA_PATH_RECOMPUTE
                                                                : SPH_CUDA_PATH_AUTO;
    st->no_store16 = (fl & SPH_CUDA_FLAG_NO_STORE16) != 0;
    st->e_two_chunks = (fl & SPH_CUDA_FLAG_E_TWO_CHUNKS) != 0;
    st->dh_splitk = (fl & SPH_CUDA_FLAG_DH_SPLITK) != 0;
    st->e2d_overlap = (fl & SPH_CUDA_FLAG_E2D_OVERLAP) != 0;
    st->dw32_beta0 = (fl & SPH_CUDA_FLAG_DW32_BETA0) != 0;
    st->sump2_fused = (fl & SPH_CUDA_FLAG_EXTRAS_STAGED) == 0;
    st->topk_fused = st->sump2_fused;
    {
        /* test hook: a small candidate buffer drives the fused top-k's overflow path */
        const char *cap = getenv("SPH_TEST_TOPK_CAP");
        st->topk_cap = cap && *cap ? strtoll(cap, NULL, 10) : 0;
        if (st->topk_cap < 0 || st->topk_cap > (1 << 30)) st->topk_cap = 0;
        /* test hook: the sampled seed off, or biased up (a seed above the row's K-th largest
         * logit must be caught and the row recomputed) */
        const char *sd = getenv("SPH_TEST_TOPK_SEED");
        st->topk_seed_off = sd && !strcmp(sd, "off");
        st->topk_seed_bias = sd && *sd && !st->topk_seed_off ? strtof(sd, NULL) : 0.f;
        if (!(st->topk_seed_bias >= 0.f)) st->topk_seed_bias = 0.f;
        /* tuning hook of the epilogue's read-back period (bench A/B; 256 from run 31) and
         * the candidate counts' report */
        const char *ev = getenv("SPH_TEST_TOPK_EVERY"), *cn = getenv("SPH_TEST_TOPK_COUNT");
        st->topk_every_log2 = 8;
        for (int k = 4; k <= 10 && ev; k++)
            if (atoi(ev) == 1 << k) st->topk_every_log2 = k;
        st->topk_count = cn && !strcmp(cn, "1");
        /* timing only: which of the epilogue's round trips cost (the lists come out wrong) */
        const char *pr = getenv("SPH_TEST_TOPK_PROBE");
        st->topk_probe = pr ? atoi(pr) & 3 : 0;
        /* A/B only: the epilogue's count, the merge, the seed rank (the lists stay right) */
        const char *va = getenv("SPH_TEST_TOPK_VARIANT");
        st->topk_variant = va ? atoi(va) & 31 : 0;
    }
    /* the non-finite counter of the finalize kernel (count 0, lowest row ~0) */
    e = cudaMalloc((void **)&st->nf, 2 * sizeof(unsigned long long));
    if (e == cudaSuccess) e = cudaMemset(st->nf, 0, sizeof(unsigned long long));
    if (e == cudaSuccess) e = cudaMemset(st->nf + 1, 0xff, sizeof(unsigned long long));
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (st->nf) cudaFree(st->nf);
        cublasDestroy(st->cublas);
        sph_free(st);
        return sph_err(SPH_ERR_CUDA, "cuda context: the non-finite counter (16 bytes): %s",
                       cudaGetErrorString(e));
    }
    ctx->cuda = st;
    /* force_kernel "ref" runs the float64 reference on host copies (head_ref_stage.c) */
    snprintf(ctx->describe, sizeof ctx->describe, "cuda %s sm_%d SMs=%d%s", st->prop.name, st->cc,
             st->prop.multiProcessorCount,
             ctx->use_ref ? " (float64 reference on the host, staged, synchronous)" : "");
    return SPH_OK;
}

static void sph_cuda_ctx_fini(sph_ctx_t ctx) {
    sph_cuda_state *st = (sph_cuda_state *)ctx->cuda;
    if (!st) return;
    if (st->cublas) cublasDestroy(st->cublas);
    if (st->nf) cudaFree(st->nf);
    if (st->side) { /* E2D_OVERLAP's side stream and events (head.cu), made on first use */
        cudaStreamSynchronize(st->side);
        for (int k = 0; k < (int)(sizeof st->ev / sizeof st->ev[0]); k++)
            if (st->ev[k]) cudaEventDestroy(st->ev[k]);
        cudaStreamDestroy(st->side);
    }
    sph_free(st);
    ctx->cuda = NULL;
}

/* sph_ctx_nonfinite: the device's count (after the stream's work), reset, plus what host
 * paths of this context refused (the staged reference). */
static sph_status sph_cuda_nonfinite(sph_ctx_t ctx, int64_t *count, int64_t *first_row) {
    sph_cuda_state *st = (sph_cuda_state *)ctx->cuda;
    cudaStream_t s = (cudaStream_t)ctx->stream;
    unsigned long long h[2] = {0, ~0ull};
    SPH_CUDA_RET(cudaSetDevice(ctx->device.id));
    SPH_CUDA_RET(cudaMemcpyAsync(h, st->nf, sizeof h, cudaMemcpyDeviceToHost, s));
    SPH_CUDA_RET(cudaMemsetAsync(st->nf, 0, sizeof(unsigned long long), s));
    SPH_CUDA_RET(cudaMemsetAsync(st->nf + 1, 0xff, sizeof(unsigned long long), s));
    SPH_CUDA_RET(cudaStreamSynchronize(s));
    int64_t n = (int64_t)h[0], first = h[0] ? (int64_t)h[1] : -1;
    if (ctx->nf_count) {
        if (first < 0 || ctx->nf_first < first) first = ctx->nf_first;
        n += ctx->nf_count;
    }
    ctx->nf_count = 0;
    ctx->nf_first = -1;
    *count = n;
    if (first_row) *first_row = first;
    return SPH_OK;
}

static sph_status sph_cuda_malloc(sph_ctx_t ctx, size_t bytes, void **ptr) {
    SPH_CUDA_RET(cudaSetDevice(ctx->device.id));
    cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *ptr = NULL;
        cudaGetLastError();
        return sph_err(SPH_ERR_ALLOC, "cudaMalloc of %zu bytes failed: %s", bytes,
                       cudaGetErrorString(e));
    }
    return SPH_OK;
}

static void sph_cuda_free(sph_ctx_t ctx, void *ptr) {
    (void)ctx;
    cudaFree(ptr);
}

static sph_status sph_cuda_memcpy(sph_ctx_t ctx, void *dst, const void *src, size_t bytes) {
    SPH_CUDA_RET(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)ctx->stream));
    SPH_CUDA_RET(cudaStreamSynchronize((cudaStream_t)ctx->stream));
    return SPH_OK;
}

static sph_status sph_cuda_memset(sph_ctx_t ctx, void *dst, int value, size_t bytes) {
    SPH_CUDA_RET(cudaMemsetAsync(dst, value, bytes, (cudaStream_t)ctx->stream));
    return SPH_OK;
}

static sph_status sph_cuda_synchronize(sph_ctx_t ctx) {
    SPH_CUDA_RET(cudaStreamSynchronize((cudaStream_t)ctx->stream));
    return SPH_OK;
}

// ---- the device table -----------------------------------------------------------------------

/* The CUDA backends of the losses above the head (core/backend.h, loss_backend): each loss's
 * table, defined beside its kernels. */
extern "C" const sph_policy_backend sph_policy_cuda_backend;   /* policy.cu */
extern "C" const sph_distill_backend sph_distill_cuda_backend; /* distill.cu */

static const void *sph_cuda_loss_backend(const char *loss) {
    if (loss && !strcmp(loss, "policy")) return &sph_policy_cuda_backend; /* policy.cu */
    if (loss && !strcmp(loss, "distill")) return &sph_distill_cuda_backend; /* distill.cu */
    return NULL;
}

static sph_device_ops make_ops(void) {
    sph_device_ops o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.host_memory = 0;
    o.ctx_init = sph_cuda_ctx_init;
    o.ctx_fini = sph_cuda_ctx_fini;
    o.ref_fill = sph_head_ref_fill; /* staged: the reference through host copies */
    o.head_fill = sph_head_cuda_fill;
    o.loss_backend = sph_cuda_loss_backend;
    o.malloc = sph_cuda_malloc;
    o.free = sph_cuda_free;
    o.memcpy = sph_cuda_memcpy;
    o.memset = sph_cuda_memset;
    o.synchronize = sph_cuda_synchronize;
    o.scale = sph_cuda_scale; /* src/cuda/scale.cu */
    o.nonfinite = sph_cuda_nonfinite;
    o.count = sph_cuda_count;
    o.pointer_is_device = sph_cuda_pointer_is_device;
    o.tune = sph_cuda_tune;
    o.gemm_rate = sph_cuda_gemm_rate;
    o.gemm_rate_sustained = sph_cuda_gemm_rate_sustained;
    return o;
}

extern "C" const sph_device_ops *sph_cuda_device_ops(void) {
    static const sph_device_ops ops = make_ops(); /* thread-safe initialization (C++11) */
    return &ops;
}
