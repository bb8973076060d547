/*
 * head.cuh - internals shared by the CUDA LM-head sources (head.cu: driver, row-statistics,
 * dlogit and finalize kernels; head_mma.cu: the fixed-tiling mma.sync logits kernel of the
 * batch-invariant / sm_80 path; head_sample.cu: sample-support forward and backward).
 *
 * Nothing here is visible outside src/cuda; the entry points are the extern "C" functions of
 * src/head/plan.h (sph_head_cuda_workspace / _forward / _backward).
 */
#ifndef SPH_CUDA_HEAD_CUH
#define SPH_CUDA_HEAD_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/common.cuh"
#include "cuda/state.h"
#include "head/plan.h"

/* Workspace regions are aligned to this many bytes (cudaMalloc gives 256). */
#define SPH_WS_ALIGN 256
/* cuBLAS gets its own workspace slice so a captured graph never allocates. */
#define SPH_CUBLAS_WS_BYTES ((size_t)32 << 20)
/* Fewest rows a chunk may have before the vocabulary is split instead. */
#define SPH_MIN_CHUNK_ROWS 256
/* More spans than this: the gradient prologue clears all of dH in one memset, not per gap. */
#define SPH_GAP_MEMSETS 16
/* One-pass recomputes its logits unless staged chunks would have this many rows. */
#define SPH_ONEPASS_STAGED_ROWS 512
/* One-pass workspace budget when the context leaves chunk_bytes at its default (0): the
 * staged-E one-pass keeps every column of a chunk's rows (2 bytes each) and, over several
 * chunks, an fp32 dW accumulator (V_loc H 4 bytes); see docs/cuda.md for the measured trade. */
#define SPH_ONEPASS_DEFAULT_BYTES ((int64_t)4 << 30)
/* Batch-invariant mode: the vocabulary split width depends on V_loc alone. */
#define SPH_BI_SPLIT 16384

/* Where every buffer of one pass lives inside the caller's workspace, and how the rows and
 * vocabulary are cut. Computed by sph_cuda_head_layout from (ctx, plan, pass) alone, so the
 * workspace query and the pass agree. */
typedef struct sph_cuda_layout {
    int64_t R;         /* rows per chunk (upper bound) */
    int64_t Vs;        /* vocabulary split width (last split may be narrower) */
    int64_t ldL;       /* row stride of the staged logits (Vs rounded up to 4) */
    int64_t n_splits;
    int64_t n_chunks;  /* row chunks over the spans */
    int64_t comm_size;
    int grads;         /* this pass computes gradients */
    int bi;            /* batch-invariant logits kernel */
    int dw32, dh32;    /* fp32 accumulators for half-precision dW / dH */
    int gather;        /* chunks of rows gathered across spans (several spans given) */
    int fused;         /* sm_90a kernel with the statistics / dlogits epilogues (no staged L
                        * unless one-pass keeps it) */
    int64_t n_tiles;   /* fused: 256-column tile records per row of a split */
    int col_outer;     /* gradient sweep vocabulary-outer (fp32 dH of all rows, split dW) */
    int onepass_chunks; /* one-pass: gradients per chunk from staged logits (else: sweep) */
    int onepass_e;      /* one-pass: the staged chunks hold f16 E (fused STATS | E epilogue,
                         * head_onepass.cu), not fp32 logits; D replaces E in place */
    int store16;        /* fused epilogues write D / E with 16-byte stores */
    int64_t e_rows;     /* staged E: rows per chunk the budget allows */
    int64_t budget;     /* the workspace budget this layout was cut to (bytes) */
    int64_t M;         /* rows the pass computes (inside the spans, or N) */
    size_t off_L, off_D, off_part, off_recv, off_dh32, off_dw32, off_cublas, off_sample;
    size_t off_T;      /* fused: the tile records (R, n_tiles, 5) */
    size_t off_act, off_hg, off_dhg; /* gathered mode: row map (M), h chunk, fp32 dH chunk */
    size_t sample_bytes;
    size_t total;
} sph_cuda_layout;

#ifdef __cplusplus
extern "C" {
#endif
/* C linkage: tests/unit/test_cuda_layout.c checks the layouts on a machine without a GPU. */
sph_status sph_cuda_head_layout(sph_ctx_t ctx, const sph_head_plan *p, sph_head_pass pass,
                                sph_cuda_layout *lay);
#ifdef __cplusplus
}
#endif

/* Batch-invariant logits: L[r, c] = sum_k h[r, k] w[c, k] for r < R, c < Vs, fp32 out with
 * row stride ldL. Fixed tiling, no split-K: an element's value depends on its two input rows
 * only. dtype: bf16/f16 (mma.sync) or f32 (exact fp32 FMA). */
sph_status sph_cuda_logits_fixed(sph_dtype dt, const void *h, int64_t ld_h, const void *w,
                                 int64_t ld_w, float *L, int64_t ldL, int64_t R, int64_t Vs,
                                 int64_t H, cudaStream_t stream);

/* Batch-invariant dH (head_mma_dh.cu): C (R, H) (+)= D (R, Vs) . W (Vs, H) with D row stride
 * ldD, W row stride ld_w, C row stride ldc of kind ct (0 f32, 1 bf16, 2 f16), acc_out: C = old
 * + sum (rounded once). Fixed tiling, k ascending: an element depends on its D row and W only.
 * dtype: bf16/f16 (mma.sync) or f32 (exact fp32 FMA). */
sph_status sph_cuda_dh_fixed(sph_dtype dt, const void *D, int64_t ldD, const void *W,
                             int64_t ld_w, void *C, int64_t ldc, int ct, int acc_out, int64_t R,
                             int64_t Vs, int64_t H, cudaStream_t stream);

/* Sample-support mode (head_sample.cu). */
size_t sph_cuda_sample_ws(const sph_head_plan *p, int grads);
sph_status sph_cuda_sample_forward(sph_ctx_t ctx, const sph_head_plan *p, char *ws,
                                   float *part, float *recv, int64_t comm_size);
sph_status sph_cuda_sample_backward(sph_ctx_t ctx, const sph_head_plan *p, char *ws,
                                    size_t ws_bytes);

/* Shared kernel launchers of head.cu used by head_sample.cu. */
sph_status sph_cuda_finalize(const sph_head_plan *p, const float *recv, int64_t rank_stride,
                             int64_t comm_size, int64_t r0, int64_t rows, int64_t recv_row0,
                             cudaStream_t stream);
sph_status sph_cuda_zero_rows_out(const sph_head_plan *p, cudaStream_t stream);
sph_status sph_cuda_combine(sph_ctx_t ctx, const sph_head_plan *p, float *part, float *recv,
                            int64_t rows, int64_t comm_size, const float **out);

static inline size_t sph_ws_round(size_t x) {
    return (x + SPH_WS_ALIGN - 1) / SPH_WS_ALIGN * SPH_WS_ALIGN;
}

#endif
