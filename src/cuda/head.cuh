/*
 * head.cuh - internals shared by the CUDA LM-head sources:
 *   head.cu          the table's entry points (sph_head_cuda_fill) and the order of a pass:
 *                    chunks, products (cuBLAS, fused sm_90a, fixed tiling), gradient sweeps
 *   head_layout.cu   where the buffers of a pass live and how rows / vocabulary are cut
 *   head_kernels.cu  elementwise kernels (row statistics, finalize, dlogits, conversions,
 *                    gathered rows) and their launchers
 *   head_mma.cu      the fixed-tiling mma.sync logits kernel of the batch-invariant path
 *   head_sample.cu   sample-support forward and backward
 *   head_sm90*.cu    the Hopper wgmma/TMA kernels
 *
 * Nothing here is visible outside src/cuda: the library reaches the CUDA head through the
 * context's head table (core/backend.h), filled by sph_head_cuda_fill.
 */
#ifndef SPH_CUDA_HEAD_CUH
#define SPH_CUDA_HEAD_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "comm/comm.h"
#include "head/plan.h"
#include "cuda/common.cuh"
#include "cuda/state.h"

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
 * chunks, an fp32 dW accumulator (V_loc H 4 bytes); docs/cuda.md has the trade. */
#define SPH_ONEPASS_DEFAULT_BYTES ((int64_t)4 << 30)
/* Batch-invariant mode: the vocabulary split width depends on V_loc alone. */
#define SPH_BI_SPLIT 16384

/* How one pass runs and where every buffer of it lives inside the caller's workspace.
 * Computed by sph_cuda_head_layout from (ctx, plan, pass) alone (head_layout.cu: the path,
 * then the sizes, then the buffers), so the workspace query, sph_head_describe and the pass
 * agree. */
typedef struct sph_cuda_layout {
    sph_cuda_path path; /* the path (state.h), chosen once: head.cu runs it, describe names it */
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
    int fused;         /* the products run the sm_90a kernels with the statistics / dlogits
                        * epilogues (no staged L): FUSED, STAGED_E, RECOMPUTE where they can */
    int64_t n_tiles;   /* fused: 256-column tile records per row of a split */
    int tile_q;        /* fused forward with sum_p2: the epilogue's q per row and tile too */
    int tk_fused;      /* fused forward with top-k: the epilogue's candidates */
    int64_t tk_ks;     /* ... its slots per row (a power of two >= max(K, 8)) */
    int64_t tk_cap;    /* ... its candidates per row before the row overflows */
    int col_outer;     /* gradient sweep vocabulary-outer (fp32 dH of all rows, split dW) */
    int store16;        /* fused epilogues write D / E with 16-byte stores */
    int64_t e_rows;     /* staged E: rows per chunk the budget allows */
    int dw_inplace;     /* staged E, E_TWO_CHUNKS: two chunks, the second accumulating into the
                         * half-precision dW (no fp32 dW accumulator) */
    int64_t dhk;        /* DH_SPLITK: vocabulary splits of each chunk's dH GEMM (>= 2), or 0 */
    size_t off_dhk;     /* DH_SPLITK: the fp32 partials (dhk, R, H) */
    int64_t budget;     /* the workspace budget this layout was cut to (bytes) */
    int64_t M;         /* rows the pass computes (inside the spans, or N) */
    size_t off_L, off_D, off_part, off_recv, off_dh32, off_dw32, off_cublas, off_sample;
    size_t off_T;      /* fused: the tile records (R, n_tiles, 5) */
    size_t off_Tq;     /* fused with sum_p2: the tiles' q (R, n_tiles) */
    size_t off_act, off_hg, off_dhg; /* gathered mode: row map (M), h chunk, fp32 dH chunk */
    size_t sample_bytes;
    /* the forward's extras (issue 25, head_extras.cu): sum_p2's (m, q) per row and the
     * top-k lists (K entries per row), and their TP receive buffers */
    size_t off_xmq, off_xmq_recv, off_xtk, off_xtk_recv;
    /* the fused top-k (head_extras.cu): candidates (R, tk_cap), slots (R, tk_ks), the
     * threshold and the candidate count (R each) */
    size_t off_tkc, off_tks, off_tkt, off_tkn;
    size_t total;
} sph_cuda_layout;

/* A top-k entry on the device: z and the global id (-1: empty). */
typedef struct sph_cuda_xtk {
    float z;
    int id;
} sph_cuda_xtk;

#ifdef __cplusplus
extern "C" {
#endif
/* C linkage: tests/unit/test_cuda_layout.c checks the layouts on a machine without a GPU. */
/* DH_SPLITK (issue 23): how many vocabulary splits the dH GEMM of a chunk of rows takes
 * (rows x H output, w columns of contraction) on a device of sms SMs (0: 132): 1 when its
 * 128 x 256 output tiles already fill the SMs, else enough for ~2 waves, at most 8 and at
 * least 2048 columns each. */
int64_t sph_cuda_dh_splits(int64_t rows, int64_t H, int64_t w, int sms);
/* The pass computes the forward's extras (sum_p2, top-k: head_extras.cu). They ride in the
 * fused statistics epilogue where the pass is fused (the layout's tile_q, tk_fused), else
 * head_extras.cu reads the staged fp32 logits; SPH_CUDA_FLAG_EXTRAS_STAGED forces the staged
 * form (the cuBLAS / staged path, no fused epilogue). */
static inline int sph_cuda_extras(const sph_head_plan *p, sph_head_pass pass) {
    return pass == SPH_HEAD_FORWARD && p->K == 0 && (p->sum_p2 != NULL || p->topk > 0);
}
sph_status sph_cuda_head_layout(sph_ctx_t ctx, const sph_head_plan *p, sph_head_pass pass,
                                sph_cuda_layout *lay);
/* The path's word: "cublas", "fused", "staged-e", "staged-f32", "recompute", "support". */
const char *sph_cuda_path_name(sph_cuda_path path);
/* The CUDA head's slots over the reference (the device table's head_fill), and the
 * full-vocabulary entries it puts there (head.cu; sph_tune times them directly). */
void sph_head_cuda_fill(sph_ctx_t ctx, sph_head_backend *be);
sph_status sph_head_cuda_workspace(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p,
                                   size_t *bytes);
sph_status sph_head_cuda_forward(sph_ctx_t ctx, const sph_head_plan *p, void *ws, size_t bytes);
sph_status sph_head_cuda_backward(sph_ctx_t ctx, const sph_head_plan *p, void *ws, size_t bytes);
/* Where a pointer lives: 1 device (or managed) memory, 0 host, -1 unknown (runtime.cu). */
int sph_cuda_pointer_is_device(const void *p);
#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
// ---- dtype kinds -----------------------------------------------------------------------

enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2, DT_OTHER = 3 };

static inline int dt_kind(sph_dtype d) {
    if (d.lanes != 1) return DT_OTHER;
    if (d.code == SPH_DTYPE_FLOAT && d.bits == 32) return DT_F32;
    if (d.code == SPH_DTYPE_BFLOAT && d.bits == 16) return DT_BF16;
    if (d.code == SPH_DTYPE_FLOAT && d.bits == 16) return DT_F16;
    return DT_OTHER;
}
static inline size_t dt_size(int k) { return k == DT_F32 ? 4 : 2; }
static inline cudaDataType_t dt_cuda(int k) {
    return k == DT_F32 ? CUDA_R_32F : (k == DT_BF16 ? CUDA_R_16BF : CUDA_R_16F);
}

// ---- row ranges of a pass --------------------------------------------------------------

static inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Row ranges the pass computes: the host spans, or [0, N) when there are none. */
static inline void spans_get(const sph_head_plan *p, int64_t k, int64_t *a, int64_t *b) {
    if (p->spans) {
        *a = p->spans[2 * k];
        *b = p->spans[2 * k + 1];
    } else {
        *a = 0;
        *b = p->N;
    }
}
static inline int64_t spans_count(const sph_head_plan *p) { return p->spans ? p->n_spans : 1; }

static inline int64_t comm_size_of(const sph_head_plan *p) { return p->comm ? p->comm->size : 1; }

// ---- one pass --------------------------------------------------------------------------

/* One chunk of rows: global rows [r0, r0 + rows) of one span, or (gathered) the rows
 * rowmap[0 .. rows) taken across spans. k0 indexes the pass's records: the global row, or
 * the position in the gathered row space. */
typedef struct chunk {
    int64_t r0, k0, rows;
    const int64_t *rowmap; /* device; NULL when the chunk is a plain row range */
} chunk;

typedef struct pass_ctx {
    sph_ctx_t ctx;
    const sph_head_plan *p;
    const sph_cuda_layout *lay;
    sph_cuda_state *st;
    cudaStream_t stream;
    char *ws;
    int dk;
    size_t es;
    int64_t it_k, it_pos;  /* chunk iterator: span index, next row */
    int64_t gathered_k0;   /* the chunk whose rows hg holds (-1: none) */
    int tk_seeded;         /* the fused top-k: this split's thresholds came from a sample */
} pass_ctx;

/* Launchers of head_kernels.cu (asynchronous on the pass's stream; a launch error comes back
 * with the kernel's name). */
/* The chunk's hidden rows as a matrix (pointer, row stride): in place for a row range, else
 * gathered into hg (once per chunk). */
sph_status sph_cuda_chunk_h(pass_ctx *c, const chunk *ch, const char **hp, int64_t *ld);
/* Records of the chunk's rows (merged after an earlier split's when merge) from staged L. */
sph_status sph_cuda_launch_stats(pass_ctx *c, const float *L, const chunk *ch, int64_t c0,
                                 int64_t w, int merge);
/* The forward's extras (head_extras.cu): sum_p2 / topk of every row to 0 / (-1, 0); the
 * chunk rows' (m, q) and lists from the staged logits of a split (merged after the earlier
 * splits' when merge); the allgather of rows [k0, k0 + rows) (*mq, *tk: rank r's row k at
 * r * rows + k, or the rows themselves without a group); the outputs of rows rowmap[k] or
 * r0 + k from them and the combined records rec0 (rank_stride rows apart), after the
 * finalize wrote the rows' stats. */
sph_status sph_cuda_extras_zero(const sph_head_plan *p, cudaStream_t stream);
sph_status sph_cuda_extras_split(pass_ctx *c, const float *L, const chunk *ch, int64_t c0,
                                 int64_t w, int merge);
sph_status sph_cuda_extras_combine(pass_ctx *c, int64_t k0, int64_t rows, const float2 **mq,
                                   const sph_cuda_xtk **tk);
sph_status sph_cuda_extras_finalize(pass_ctx *c, const float *rec0, const float2 *mq0,
                                    const sph_cuda_xtk *tk0, int64_t rank_stride, int64_t r0,
                                    const int64_t *rowmap, int64_t rows);
/* The fused top-k (head_extras.cu): the chunk rows' candidate count, threshold and slots
 * emptied before its first split's statistics kernel (columns [c0, c0 + w) of the shard,
 * rows hp of stride ld), the thresholds seeded from a strided sample of the split's columns
 * where the split is wide; after each split's kernel, the candidates (or, for a row that
 * overflowed its buffer or whose seed proved too high, the logits of the tiles that can hold
 * its top K, recomputed from hp and the split's W columns) folded into the rows' lists. */
sph_status sph_cuda_topk_fused_begin(pass_ctx *c, const chunk *ch, const char *hp, int64_t ld,
                                     int64_t c0, int64_t w);
sph_status sph_cuda_topk_fused_merge(pass_ctx *c, const chunk *ch, int64_t c0, int64_t w,
                                     const void *hp, int64_t ld, int merge);
/* Finalize rows [0, rows) whose records start at rec0 (rank r's at rec0 + r * rank_stride);
 * row k is global row rowmap[k] or r0 + k. Non-finite active rows are counted in nf (the
 * context's sph_cuda_state.nf; NULL: not counted). */
sph_status sph_cuda_finalize_rows(const sph_head_plan *p, const float *rec0, int64_t rank_stride,
                                  int64_t comm_size, int64_t r0, const int64_t *rowmap,
                                  int64_t rows, unsigned long long *nf, cudaStream_t stream);
/* Per-row temperatures (plan.h temp_rows) of device memory, rows [0, rows) of a chunk (row k
 * is global row rowmap[k] or r0 + k): each active row whose T_i the host rule refuses is
 * counted in nf (the backward's non-finite policy; the forward counts such rows through their
 * NaN statistics). Nothing to do without temp_rows or nf. */
sph_status sph_cuda_check_trows(const sph_head_plan *p, int64_t r0, const int64_t *rowmap,
                                int64_t rows, unsigned long long *nf, cudaStream_t stream);
/* D (rows, w) = du of the chunk from the logits in L (D may alias L when fp32). */
sph_status sph_cuda_launch_dlogits(pass_ctx *c, const float *L, void *D, const chunk *ch,
                                   int64_t c0, int64_t w);
/* dst (rows, cols; dtype kind) = (acc ? dst : 0) + src (fp32, row stride ld_src). */
sph_status sph_cuda_launch_convert(int kind, void *dst, int64_t ld_dst, const float *src,
                                   int64_t ld_src, int64_t rows, int64_t cols, int acc,
                                   cudaStream_t stream);
/* dH rows of a gathered chunk (or of the whole row space) from its fp32 rows dhg. */
sph_status sph_cuda_launch_scatter(pass_ctx *c, const chunk *ch, const float *dhg);
/* DH_SPLITK (head_splitk.cu): C (rows of ldc, H columns, type ct) = (acc ? C : 0) + the sum
 * of S fp32 partials P[s * stride + r * H + j]. */
sph_status sph_cuda_splitk_sum(const float *P, int64_t S, int64_t stride, int64_t rows,
                               int64_t H, void *C, int64_t ldc, cudaDataType_t ct, int acc,
                               cudaStream_t stream);
/* Gathered mode: the row map (global row of each position of the row space). */
sph_status sph_cuda_build_act_rows(pass_ctx *c);
#endif /* __cplusplus */

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

/* Sample-support mode (head_sample.cu). check: its limits (K, N * K), run by validation. */
sph_status sph_cuda_sample_check(const sph_head_plan *p);
size_t sph_cuda_sample_ws(const sph_head_plan *p, int grads);
/* forward: records into part (recv: the TP group's), and with mq (N, NULL without sum_p2)
 * each computed row's sum_p2 pair (m, q) over its candidates in this shard. */
sph_status sph_cuda_sample_forward(sph_ctx_t ctx, const sph_head_plan *p, char *ws,
                                   float *part, float *recv, float2 *mq, int64_t comm_size);
sph_status sph_cuda_sample_backward(sph_ctx_t ctx, const sph_head_plan *p, char *ws,
                                    size_t ws_bytes);

/* Shared kernel launchers of head.cu used by head_sample.cu. */
sph_status sph_cuda_finalize(const sph_head_plan *p, const float *recv, int64_t rank_stride,
                             int64_t comm_size, int64_t r0, int64_t rows, int64_t recv_row0,
                             unsigned long long *nf, cudaStream_t stream);
sph_status sph_cuda_zero_rows_out(const sph_head_plan *p, cudaStream_t stream);
sph_status sph_cuda_combine(sph_ctx_t ctx, const sph_head_plan *p, float *part, float *recv,
                            int64_t rows, int64_t comm_size, const float **out);

static inline size_t sph_ws_round(size_t x) {
    return (x + SPH_WS_ALIGN - 1) / SPH_WS_ALIGN * SPH_WS_ALIGN;
}

#endif
