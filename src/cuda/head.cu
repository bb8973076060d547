/*
 * head.cu - the CUDA LM head: forward (row statistics), backward (dlogits, dHidden, dWeight)
 * and one-pass mode over row chunks of the active spans, with the vocabulary split when one
 * chunk of staged logits would not fit the budget (docs/design.md sections 2 and 5.3).
 *
 * Per chunk of R rows [r0, r0 + R) and vocabulary split [c0, c0 + w) of this shard:
 *   L (R, w) fp32 = h[r0:r0+R] . W[c0:c0+w]^T       cuBLAS, or head_mma.cu (batch-invariant)
 *   forward : partial record (m, s, b, zt, sz) per row, merged online across splits
 *             (head/plan.h), combined across the TP group by one allgather, then finalized
 *   backward: D (R, w) = du (input dtype, or fp32 in place of L), then
 *             dH[r0:r0+R] (+)= D . W[c0:c0+w]       (R, H)
 *             dW[c0:c0+w] (+)= D^T . h[r0:r0+R]      (w, H), deterministic (beta = 1 chain)
 * No (N, V) buffer exists: the staged logits are (R, w) with R * w * bytes <= chunk_bytes.
 * On sm_90 with TMA-ready bf16/f16 operands the forward's L and statistics, and the
 * backward's L and D, are one fused kernel each (head_sm90.cu): no logits are staged, only D.
 * The gradient sweep runs row-outer or vocabulary-outer, whichever needs the smaller fp32
 * accumulator (sph_cuda_head_layout).
 *
 * Numerics: logits accumulate in fp32 (tensor cores for bf16/f16, exact FP32 for f32 unless
 * opts.allow_tf32). Row statistics use the online max/sum-exp update; each thread owns a
 * fixed column stride and the block reduces in a fixed order, so results are deterministic,
 * and in batch-invariant mode (fixed split width, fixed logits kernel) independent of the
 * other rows. Half-precision gradients accumulate in fp32 workspace whenever more than one
 * product contributes to them (several splits for dH, several row chunks for dW) and are
 * rounded once at the end.
 *
 * This file: the order of a pass (chunks, products, sweeps) and the entry points the context's
 * head table holds (sph_head_cuda_fill, at the end). The elementwise kernels are in
 * head_kernels.cu, the workspace layout in head_layout.cu.
 */
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/trace.h"
#include "comm/comm.h"
#include "cuda/device_ptr.h"
#include "cuda/head.cuh"
#include "cuda/head_sm90.cuh"
#include "cuda/head_math.cuh"
#include "cuda/head_onepass.cuh"
#include "cuda/tune.cuh"

// ---- host: pieces of a pass ------------------------------------------------------------------

static void chunks_reset(pass_ctx *c) {
    c->it_k = 0;
    c->it_pos = 0;
}

static bool chunk_next(pass_ctx *c, chunk *ch) {
    const sph_cuda_layout *lay = c->lay;
    if (lay->gather) {
        if (c->it_pos >= lay->M) return false;
        ch->k0 = c->it_pos;
        ch->rows = lay->M - c->it_pos < lay->R ? lay->M - c->it_pos : lay->R;
        ch->rowmap = (const int64_t *)(c->ws + lay->off_act) + c->it_pos;
        ch->r0 = 0;
        c->it_pos += ch->rows;
        return true;
    }
    const int64_t n_spans = spans_count(c->p);
    while (c->it_k < n_spans) {
        int64_t a, b;
        spans_get(c->p, c->it_k, &a, &b);
        if (c->it_pos < a) c->it_pos = a;
        if (c->it_pos < b) {
            ch->r0 = ch->k0 = c->it_pos;
            ch->rows = b - c->it_pos < lay->R ? b - c->it_pos : lay->R;
            ch->rowmap = NULL;
            c->it_pos += ch->rows;
            return true;
        }
        c->it_k++;
    }
    return false;
}

static sph_status setup_cublas(pass_ctx *c) {
    SPH_CUBLAS_RET(cublasSetStream(c->st->cublas, c->stream));
    SPH_CUBLAS_RET(cublasSetWorkspace(c->st->cublas, c->ws + c->lay->off_cublas,
                                      SPH_CUBLAS_WS_BYTES));
    return SPH_OK;
}

static cublasComputeType_t compute_type(const pass_ctx *c) {
    if (c->dk == DT_F32)
        return c->ctx->opts.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    return CUBLAS_COMPUTE_32F;
}

/* L (rows, w) = hp (rows, H; row stride ld) . W[c0:c0+w]^T, fp32, row stride ldL. */
static sph_status gemm_logits(pass_ctx *c, const char *hp, int64_t ld, int64_t rows, int64_t c0,
                              int64_t w, float *L) {
    const sph_head_plan *p = c->p;
    const char *wp = (const char *)p->weight + (size_t)c0 * p->ld_w * c->es;
    if (c->lay->bi) {
        /* sm_90a wgmma kernel or the mma.sync one: decided from the user's tensors, never
         * the chunk, so a row gets the same kernel (and bits) in every batch */
        if (!c->st->no_sm90 &&
            sph_cuda_logits_sm90_usable(p->dtype, p->hidden, p->ld_h, p->weight, p->ld_w, p->H)) {
            sph_sm90_epi e;
            memset(&e, 0, sizeof e);
            e.mode = SPH_SM90_EPI_L;
            e.schedule = c->st->schedule;
            e.L = L;
            e.ldL = c->lay->ldL;
            return sph_cuda_head_sm90(p->dtype, hp, ld, wp, p->ld_w, rows, w, p->H, &e,
                                      c->stream);
        }
        return sph_cuda_logits_fixed(p->dtype, hp, ld, wp, p->ld_w, L, c->lay->ldL, rows, w,
                                     p->H, c->stream);
    }
    const float one = 1.f, zero = 0.f;
    cudaDataType_t t = dt_cuda(c->dk);
    SPH_CUBLAS_RET(cublasGemmEx(c->st->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w, (int)rows,
                                (int)p->H, &one, wp, t, (int)p->ld_w, hp, t, (int)ld, &zero, L,
                                CUDA_R_32F, (int)c->lay->ldL, compute_type(c),
                                CUBLAS_GEMM_DEFAULT));
    sph_trace_mark("cuda: cublas logits");
    return SPH_OK;
}

/* The TP combine: one allgather of rows records (device buffers, NCCL) in rank order. *out
 * points at the records the finalize kernel reads (part itself when there is no group). */
sph_status sph_cuda_combine(sph_ctx_t ctx, const sph_head_plan *p, float *part, float *recv,
                            int64_t rows, int64_t comm_size, const float **out) {
    if (comm_size <= 1) {
        *out = part;
        return SPH_OK;
    }
    SPH_TRY(p->comm->ops->allgather(p->comm, part, recv,
                                    (size_t)rows * SPH_PARTIAL_FIELDS * sizeof(float),
                                    ctx->stream));
    *out = recv;
    return SPH_OK;
}

/* The sm_90a epilogue arguments shared by the statistics and dlogits variants. */
static sph_sm90_epi fused_args(const pass_ctx *c, const chunk *ch, int64_t c0, int mode) {
    const sph_head_plan *p = c->p;
    sph_sm90_epi e;
    memset(&e, 0, sizeof e);
    e.mode = mode;
    e.schedule = c->st->schedule;
    e.r0 = ch->r0;
    e.rowmap = ch->rowmap;
    e.col_g0 = p->v0 + c0;
    e.tgt = p->targets;
    e.tgt_i64 = p->tgt_i64;
    e.inv_t = (float)(1.0 / p->temperature);
    e.trows = p->temp_rows;
    e.cap = (float)p->softcap;
    e.inv_cap = p->softcap > 0 ? (float)(1.0 / p->softcap) : 0.f;
    e.inv_V = (float)(1.0 / (double)p->V);
    return e;
}

/* Fused forward of one chunk and split: tile records from the logits in registers, folded
 * into the chunk's records (merged after the earlier splits' when merge). */
static sph_status fused_stats(pass_ctx *c, const char *hp, int64_t ld, const chunk *ch,
                              int64_t c0, int64_t w, int merge) {
    const sph_head_plan *p = c->p;
    const int with_e = c->lay->path == SPH_CUDA_PATH_STAGED_E;
    sph_sm90_epi e =
        fused_args(c, ch, c0, with_e ? SPH_SM90_EPI_STATS | SPH_SM90_EPI_E : SPH_SM90_EPI_STATS);
    float *T = (float *)(c->ws + c->lay->off_T);
    e.tile_recs = T;
    /* sum_p2 in the same epilogue: the tiles' q, folded into the extras' (m, q) of each row */
    float *Tq = c->lay->tile_q ? (float *)(c->ws + c->lay->off_Tq) : NULL;
    float2 *mq = Tq ? (float2 *)(c->ws + c->lay->off_xmq) + ch->k0 : NULL;
    e.tile_q = Tq;
    const sph_cuda_layout *lay = c->lay;
    if (lay->tk_fused) {
        /* top-k in the same epilogue: candidates per row, folded in after the kernel */
        if (!merge) SPH_TRY(sph_cuda_topk_fused_begin(c, ch, hp, ld, c0, w));
        e.tk_cand = c->ws + lay->off_tkc;
        e.tk_n = (int *)(c->ws + lay->off_tkn);
        e.tk_tau = (int *)(c->ws + lay->off_tkt);
        e.tk_slots = (int *)(c->ws + lay->off_tks);
        e.tk_cap = (int)lay->tk_cap;
        e.tk_ks = (int)lay->tk_ks;
        e.tk_k = (int)p->topk;
        e.tk_every_log2 = c->st->topk_every_log2;
        e.tk_probe = c->st->topk_probe;
        e.tk_variant = c->st->topk_variant;
    }
    if (with_e) {
        /* staged E of the chunk (whole-shard rows) where its D will be */
        e.E = c->ws + c->lay->off_D;
        e.ldE = c->lay->ldL;
        e.store16 = c->lay->store16;
    }
    const char *wp = (const char *)p->weight + (size_t)c0 * p->ld_w * c->es;
    SPH_TRY(sph_cuda_head_sm90(p->dtype, hp, ld, wp, p->ld_w, ch->rows, w, p->H, &e, c->stream));
    float *recs = (float *)(c->ws + c->lay->off_part) + ch->k0 * SPH_PARTIAL_FIELDS;
    SPH_TRY(sph_cuda_sm90_reduce_tiles(T, Tq, (w + SPH_SM90_TILE_N - 1) / SPH_SM90_TILE_N,
                                       ch->rows, recs, mq, merge, c->stream));
    sph_trace_mark("cuda: reduce tiles");
    if (lay->tk_fused) {
        SPH_TRY(sph_cuda_topk_fused_merge(c, ch, c0, w, hp, ld, merge));
        sph_trace_mark("cuda: top-k merge");
    }
    return SPH_OK;
}

/* Fused backward of one chunk and split: D (input dtype) = du from the recomputed logits in
 * registers; the logits never leave the kernel. */
static sph_status fused_dlogits(pass_ctx *c, const char *hp, int64_t ld, const chunk *ch,
                                int64_t c0, int64_t w, void *D) {
    const sph_head_plan *p = c->p;
    sph_sm90_epi e = fused_args(c, ch, c0, SPH_SM90_EPI_DLOGITS);
    e.D = D;
    e.ldD = c->lay->ldL;
    e.store16 = c->lay->store16;
    e.stats = p->stats;
    e.g = p->dlogprob;
    e.e = p->dentropy;
    e.gl = p->dlse;
    e.gm = p->dlogit_mean;
    e.mask = p->mask;
    const char *wp = (const char *)p->weight + (size_t)c0 * p->ld_w * c->es;
    return sph_cuda_head_sm90(p->dtype, hp, ld, wp, p->ld_w, ch->rows, w, p->H, &e, c->stream);
}

/* Staged E: the chunk's D in place of its E, once the chunk's rows are finalized (stats);
 * rows [b0, b0 + nb) of the chunk on stream s (E2D_OVERLAP: one row block on the side
 * stream), the whole chunk with chunk_e2d. */
static sph_status chunk_e2d_rows(pass_ctx *c, const chunk *ch, int64_t b0, int64_t nb,
                                 cudaStream_t s) {
    const sph_head_plan *p = c->p;
    sph_e2d_args a;
    memset(&a, 0, sizeof a);
    a.E = c->ws + c->lay->off_D + (size_t)b0 * c->lay->ldL * 2;
    a.ldE = c->lay->ldL;
    a.dtype_bf16 = c->dk == DT_BF16;
    a.tile_recs = (const float *)(c->ws + c->lay->off_T) +
                  (size_t)b0 * c->lay->n_tiles * SPH_PARTIAL_FIELDS;
    a.n_tiles = c->lay->n_tiles;
    a.rows = nb;
    a.w = p->V_loc;
    a.r0 = ch->r0 + b0;
    a.rowmap = ch->rowmap ? ch->rowmap + b0 : NULL;
    a.col_g0 = p->v0;
    a.stats = p->stats;
    a.g = p->dlogprob;
    a.e = p->dentropy;
    a.gl = p->dlse;
    a.gm = p->dlogit_mean;
    a.mask = p->mask;
    a.tgt = p->targets;
    a.tgt_i64 = p->tgt_i64;
    a.inv_t = (float)(1.0 / p->temperature);
    a.t_over_cap = p->softcap > 0 ? (float)(p->temperature / p->softcap) : 0.f;
    a.trows = p->temp_rows;
    a.inv_cap = p->softcap > 0 ? (float)(1.0 / p->softcap) : 0.f;
    a.inv_V = (float)(1.0 / (double)p->V);
    return sph_cuda_e2d(&a, s);
}
static sph_status chunk_e2d(pass_ctx *c, const chunk *ch) {
    return chunk_e2d_rows(c, ch, 0, ch->rows, c->stream);
}

/* Where a gradient product goes: C (column-major, leading dimension ldc, type ct), scaled
 * old value beta (0 overwrites). */
typedef struct gemm_out {
    void *C;
    int ldc;
    cudaDataType_t ct;
    float beta;
} gemm_out;

/* Where a chunk's dlogits come from (grad_chunk, chunk_dlogits); D_READY_NODH: D in place
 * and the chunk's dH already done (E2D_OVERLAP). */
enum { D_RECOMPUTE = 0, D_FROM_L = 1, D_READY = 2, D_READY_NODH = 3 };

/* D (rows, w) of a chunk and split: from the logits kept in L (D_FROM_L), already in place
 * (D_READY: staged E turned into D), recomputed by the fused kernel, or recomputed by cuBLAS
 * into L and turned into D. */
static sph_status chunk_dlogits(pass_ctx *c, const chunk *ch, const char *hp, int64_t ld,
                                int64_t c0, int64_t w, float *L, void *D, int src) {
    if (src == D_READY || src == D_READY_NODH) return SPH_OK;
    if (src == D_FROM_L) return sph_cuda_launch_dlogits(c, L, D, ch, c0, w);
    if (c->lay->fused) return fused_dlogits(c, hp, ld, ch, c0, w, D);
    SPH_TRY(gemm_logits(c, hp, ld, ch->rows, c0, w, L));
    return sph_cuda_launch_dlogits(c, L, D, ch, c0, w);
}

/* dH^T (H, rows) (+)= W_split^T (H, w) . D^T (w, rows), column-major terms. Batch-invariant
 * mode: the fixed-tiling kernel (head_mma_dh.cu), so a row's dH does not depend on rows, the
 * chunk or cuBLAS's choice of algorithm for them. */
static sph_status gemm_dh(pass_ctx *c, const char *wp, int64_t rows, int64_t w, const void *D,
                          const gemm_out *o) {
    const sph_head_plan *p = c->p;
    if (c->lay->bi) {
        const int ct = o->ct == CUDA_R_32F ? 0 : (o->ct == CUDA_R_16BF ? 1 : 2);
        return sph_cuda_dh_fixed(p->dtype, D, c->lay->ldL, wp, p->ld_w, o->C, o->ldc, ct,
                                 o->beta != 0.f, rows, w, p->H, c->stream);
    }
    const float one = 1.f;
    const cudaDataType_t t = dt_cuda(c->dk);
    SPH_CUBLAS_RET(cublasGemmEx(c->st->cublas, CUBLAS_OP_N, CUBLAS_OP_N, (int)p->H, (int)rows,
                                (int)w, &one, wp, t, (int)p->ld_w, D, t, (int)c->lay->ldL,
                                &o->beta, o->C, o->ct, o->ldc, compute_type(c),
                                CUBLAS_GEMM_DEFAULT));
    sph_trace_mark("cuda: cublas dH");
    return SPH_OK;
}

/* DH_SPLITK (issue 23, v14): gemm_dh of one chunk cut over the vocabulary into lay->dhk fp32
 * partials at off_dhk (one strided-batched GEMM of equal widths, the remainder columns added
 * into the first partial), summed into o by head_splitk.cu. */
static sph_status gemm_dh_splitk(pass_ctx *c, const char *wp, int64_t rows, int64_t w,
                                 const void *D, const gemm_out *o) {
    const sph_head_plan *p = c->p;
    const sph_cuda_layout *lay = c->lay;
    const int64_t S = lay->dhk, kk = w / S / 8 * 8, rem = w - S * kk;
    if (kk < 1024) return gemm_dh(c, wp, rows, w, D, o); /* a narrow last split */
    SPH_CHECK(S >= 2 && rows <= lay->R, SPH_ERR_INTERNAL,
              "dh split-k: %lld splits of %lld columns for %lld rows (R %lld)", (long long)S,
              (long long)kk, (long long)rows, (long long)lay->R);
    float *P = (float *)(c->ws + lay->off_dhk);
    const long long stride = (long long)lay->R * p->H;
    const float one = 1.f, zero = 0.f;
    const cudaDataType_t t = dt_cuda(c->dk);
    SPH_CUBLAS_RET(cublasGemmStridedBatchedEx(
        c->st->cublas, CUBLAS_OP_N, CUBLAS_OP_N, (int)p->H, (int)rows, (int)kk, &one, wp, t,
        (int)p->ld_w, (long long)kk * p->ld_w, D, t, (int)lay->ldL, (long long)kk, &zero, P,
        CUDA_R_32F, (int)p->H, stride, (int)S, compute_type(c), CUBLAS_GEMM_DEFAULT));
    if (rem > 0)
        SPH_CUBLAS_RET(cublasGemmEx(c->st->cublas, CUBLAS_OP_N, CUBLAS_OP_N, (int)p->H,
                                    (int)rows, (int)rem, &one,
                                    wp + (size_t)(S * kk) * p->ld_w * c->es, t, (int)p->ld_w,
                                    (const char *)D + (size_t)(S * kk) * c->es, t,
                                    (int)lay->ldL, &one, P, CUDA_R_32F, (int)p->H,
                                    compute_type(c), CUBLAS_GEMM_DEFAULT));
    return sph_cuda_splitk_sum(P, S, stride, rows, p->H, o->C, o->ldc, o->ct, o->beta != 0.f,
                               c->stream);
}

/* dW_split^T (H, w) (+)= h^T (H, rows) . D (rows, w). */
static sph_status gemm_dw(pass_ctx *c, const char *hp, int64_t ld, int64_t rows, int64_t w,
                          const void *D, const gemm_out *o) {
    const sph_head_plan *p = c->p;
    const float one = 1.f;
    const cudaDataType_t t = dt_cuda(c->dk);
    SPH_CUBLAS_RET(cublasGemmEx(c->st->cublas, CUBLAS_OP_N, CUBLAS_OP_T, (int)p->H, (int)w,
                                (int)rows, &one, hp, t, (int)ld, D, t, (int)c->lay->ldL,
                                &o->beta, o->C, o->ct, o->ldc, compute_type(c),
                                CUBLAS_GEMM_DEFAULT));
    sph_trace_mark("cuda: cublas dW");
    return SPH_OK;
}

/* A user gradient (rows of ld elements of dtype dt) from row row0, beta 1 when accumulating. */
static gemm_out user_out(void *base, int64_t ld, sph_dtype dt, int64_t row0, int acc) {
    const int k = dt_kind(dt);
    gemm_out o = {(char *)base + (size_t)row0 * ld * dt_size(k), (int)ld, dt_cuda(k),
                  acc ? 1.f : 0.f};
    return o;
}
/* The user's dH rows from row r0 / dW rows from vocabulary column c0. */
static gemm_out user_dh(const pass_ctx *c, int64_t r0, int acc) {
    return user_out(c->p->dhidden, c->p->ld_dh, c->p->dh_dtype, r0, acc);
}
static gemm_out user_dw(const pass_ctx *c, int64_t c0, int acc) {
    return user_out(c->p->dweight, c->p->ld_dw, c->p->dw_dtype, c0, acc);
}
/* An fp32 accumulator with H columns. */
static gemm_out acc32(float *C, int64_t H, int acc) {
    gemm_out o = {C, (int)H, CUDA_R_32F, acc ? 1.f : 0.f};
    return o;
}

/* Gradients of one row chunk from its (recomputed or kept) logits. ci is the chunk's index
 * among the pass's chunks (dW overwrites on the first). src: D_RECOMPUTE, D_FROM_L (L holds
 * the logits of the only split: one-pass, staged fp32) or D_READY (staged E, one split). */
static sph_status grad_chunk(pass_ctx *c, const chunk *ch, int64_t ci, int src) {
    const sph_head_plan *p = c->p;
    const sph_cuda_layout *lay = c->lay;
    float *L = (float *)(c->ws + lay->off_L);
    void *D = c->dk == DT_F32 ? (void *)L : (void *)(c->ws + lay->off_D);
    float *dh32 = (float *)(c->ws + (lay->gather ? lay->off_dhg : lay->off_dh32));
    float *dw32 = (float *)(c->ws + lay->off_dw32);
    const int dh_via32 = lay->dh32 || lay->gather; /* dH of the chunk staged in fp32 */
    const char *hp;
    int64_t ld;
    SPH_TRY(sph_cuda_chunk_h(c, ch, &hp, &ld));
    const int64_t rows = ch->rows;
    for (int64_t s = 0; s < lay->n_splits; s++) {
        int64_t c0 = s * lay->Vs, w = p->V_loc - c0 < lay->Vs ? p->V_loc - c0 : lay->Vs;
        SPH_TRY(chunk_dlogits(c, ch, hp, ld, c0, w, L, D, src));
        const char *wp = (const char *)p->weight + (size_t)c0 * p->ld_w * c->es;
        if (p->dhidden && src != D_READY_NODH) {
            const gemm_out o = dh_via32 ? acc32(dh32, p->H, s > 0)
                                        : user_dh(c, ch->r0, s > 0 || p->acc_dh);
            if (lay->dhk) SPH_TRY(gemm_dh_splitk(c, wp, rows, w, D, &o));
            else SPH_TRY(gemm_dh(c, wp, rows, w, D, &o));
        }
        if (p->dweight) {
            /* the fp32 accumulator holds the whole shard: zeroed by grad_prologue, or
             * (DW32_BETA0) written by the first chunk (every split of it: all V_loc columns) */
            const gemm_out o = lay->dw32
                                   ? acc32(dw32 + (size_t)c0 * p->H, p->H,
                                           !c->st->dw32_beta0 || ci > 0)
                                   : user_dw(c, c0, ci > 0 || p->acc_dw);
            SPH_TRY(gemm_dw(c, hp, ld, rows, w, D, &o));
        }
    }
    const int dhk = p->dhidden ? dt_kind(p->dh_dtype) : DT_F32;
    if (p->dhidden && lay->gather) SPH_TRY(sph_cuda_launch_scatter(c, ch, dh32));
    else if (p->dhidden && lay->dh32)
        SPH_TRY(sph_cuda_launch_convert(
            dhk, (char *)p->dhidden + (size_t)ch->r0 * p->ld_dh * dt_size(dhk), p->ld_dh, dh32,
            p->H, rows, p->H, p->acc_dh, c->stream));
    return SPH_OK;
}

/* E2D_OVERLAP (issue 23, v15): rows per block of the staged-E chunk's e2d / dH pipeline, or 0
 * for no pipeline: blocks whose dH GEMM still has ~2 waves of 128 x 256 tiles, 2 to
 * SPH_E2D_BLOCKS of them. */
#define SPH_E2D_BLOCKS 8
static int64_t e2d_block_rows(int64_t rows, int64_t H, int sms) {
    if (sms <= 0) sms = 132;
    const int64_t tn = (H + 255) / 256;
    const int64_t rb = ((2 * (int64_t)sms + tn - 1) / tn) * 128;
    int64_t nb = rows / rb;
    if (nb > SPH_E2D_BLOCKS) nb = SPH_E2D_BLOCKS;
    if (nb < 2) return 0;
    return round_up((rows + nb - 1) / nb, 8);
}

/* Staged E with E2D_OVERLAP: D made block by block on the side stream while the main stream
 * runs the dH GEMM of the block made before (the pass over E is memory-bound, the GEMM
 * compute-bound), then dW over the whole chunk (grad_chunk, D_READY_NODH). 0 in *done when the
 * chunk is not pipelined (the caller runs chunk_e2d + grad_chunk). */
static sph_status e2d_overlapped(pass_ctx *c, const chunk *ch, int64_t ci, int *done) {
    const sph_head_plan *p = c->p;
    const sph_cuda_layout *lay = c->lay;
    sph_cuda_state *st = c->st;
    *done = 0;
    if (!st->e2d_overlap || !p->dhidden || lay->n_splits != 1 || lay->dhk || lay->bi) return SPH_OK;
    const int64_t rb = st->e2d_rows > 0
                           ? (st->e2d_rows * SPH_E2D_BLOCKS >= ch->rows
                                  ? round_up(st->e2d_rows, 8)
                                  : round_up((ch->rows + SPH_E2D_BLOCKS - 1) / SPH_E2D_BLOCKS, 8))
                           : e2d_block_rows(ch->rows, p->H, st->prop.multiProcessorCount);
    if (rb <= 0 || rb >= ch->rows) return SPH_OK;
    SPH_CHECK((ch->rows + rb - 1) / rb <= SPH_E2D_BLOCKS, SPH_ERR_INTERNAL,
              "e2d overlap: %lld rows in blocks of %lld exceed %d events", (long long)ch->rows,
              (long long)rb, SPH_E2D_BLOCKS);
    if (!st->side) {
        SPH_CUDA_RET(cudaStreamCreateWithFlags(&st->side, cudaStreamNonBlocking));
        for (int k = 0; k <= SPH_E2D_BLOCKS; k++) {
            cudaError_t e = cudaEventCreateWithFlags(&st->ev[k], cudaEventDisableTiming);
            if (e != cudaSuccess) {
                for (int q = 0; q < k; q++) cudaEventDestroy(st->ev[q]), st->ev[q] = NULL;
                cudaStreamDestroy(st->side);
                st->side = NULL;
                return sph_err(SPH_ERR_CUDA, "e2d overlap: event: %s", cudaGetErrorString(e));
            }
        }
    }
    /* the side stream starts after everything on the main stream (the finalized rows) */
    SPH_CUDA_RET(cudaEventRecord(st->ev[0], c->stream));
    SPH_CUDA_RET(cudaStreamWaitEvent(st->side, st->ev[0], 0));
    const int dh_via32 = lay->dh32 || lay->gather;
    float *dh32 = (float *)(c->ws + (lay->gather ? lay->off_dhg : lay->off_dh32));
    const void *D = c->ws + lay->off_D;
    int nb = 0;
    for (int64_t b0 = 0; b0 < ch->rows; b0 += rb, nb++) {
        const int64_t n = ch->rows - b0 < rb ? ch->rows - b0 : rb;
        SPH_TRY(chunk_e2d_rows(c, ch, b0, n, st->side));
        SPH_CUDA_RET(cudaEventRecord(st->ev[1 + nb], st->side));
    }
    nb = 0;
    for (int64_t b0 = 0; b0 < ch->rows; b0 += rb, nb++) {
        const int64_t n = ch->rows - b0 < rb ? ch->rows - b0 : rb;
        SPH_CUDA_RET(cudaStreamWaitEvent(c->stream, st->ev[1 + nb], 0));
        const gemm_out o = dh_via32 ? acc32(dh32 + (size_t)b0 * p->H, p->H, 0)
                                    : user_dh(c, ch->r0 + b0, p->acc_dh);
        SPH_TRY(gemm_dh(c, (const char *)p->weight, n, p->V_loc,
                        (const char *)D + (size_t)b0 * lay->ldL * c->es, &o));
    }
    *done = 1;
    st->e2d_blocks_run++;
    return grad_chunk(c, ch, ci, D_READY_NODH);
}

/* The vocabulary-outer gradient sweep (lay->col_outer): every row chunk of a split, then the
 * next split. dH accumulates in fp32 over the splits at the chunk's position among the
 * computed rows and is written out once at the end; dW of a split accumulates over the row
 * chunks (in fp32 when several chunks and half precision) and is written out when the split
 * is done. Same products, in the same order within each output element, as row-outer. */
static sph_status grad_cols(pass_ctx *c) {
    const sph_head_plan *p = c->p;
    const sph_cuda_layout *lay = c->lay;
    float *L = (float *)(c->ws + lay->off_L);
    void *D = c->dk == DT_F32 ? (void *)L : (void *)(c->ws + lay->off_D);
    float *dh_all = (float *)(c->ws + lay->off_dh32);
    float *dw_s = (float *)(c->ws + lay->off_dw32);
    const int dhk = p->dhidden ? dt_kind(p->dh_dtype) : DT_F32;
    const int dwk = p->dweight ? dt_kind(p->dw_dtype) : DT_F32;
    /* position 0 of dh_all: row space position 0 (gathered) or the first computed row */
    const int64_t base = lay->gather ? 0 : (p->spans && p->n_spans > 0 ? p->spans[0] : 0);
    for (int64_t s = 0; s < lay->n_splits; s++) {
        const int64_t c0 = s * lay->Vs, w = p->V_loc - c0 < lay->Vs ? p->V_loc - c0 : lay->Vs;
        const char *wp = (const char *)p->weight + (size_t)c0 * p->ld_w * c->es;
        chunk ch;
        int64_t ci = 0;
        chunks_reset(c);
        while (chunk_next(c, &ch)) {
            const char *hp;
            int64_t ld;
            SPH_TRY(sph_cuda_chunk_h(c, &ch, &hp, &ld));
            SPH_TRY(chunk_dlogits(c, &ch, hp, ld, c0, w, L, D, D_RECOMPUTE));
            if (p->dhidden) {
                const gemm_out o =
                    lay->dh32 ? acc32(dh_all + (size_t)(ch.k0 - base) * p->H, p->H, s > 0)
                              : user_dh(c, ch.r0, s > 0 || p->acc_dh);
                if (lay->dhk) SPH_TRY(gemm_dh_splitk(c, wp, ch.rows, w, D, &o));
                else SPH_TRY(gemm_dh(c, wp, ch.rows, w, D, &o));
            }
            if (p->dweight) {
                const gemm_out o = lay->dw32 ? acc32(dw_s, p->H, ci > 0)
                                             : user_dw(c, c0, ci > 0 || p->acc_dw);
                SPH_TRY(gemm_dw(c, hp, ld, ch.rows, w, D, &o));
            }
            ci++;
        }
        if (p->dweight && lay->dw32)
            SPH_TRY(sph_cuda_launch_convert(
                dwk, (char *)p->dweight + (size_t)c0 * p->ld_dw * dt_size(dwk), p->ld_dw, dw_s,
                p->H, w, p->H, p->acc_dw, c->stream));
    }
    if (!p->dhidden || !lay->dh32 || lay->M == 0) return SPH_OK;
    if (lay->gather) {
        chunk all;
        all.r0 = all.k0 = 0;
        all.rows = lay->M;
        all.rowmap = (const int64_t *)(c->ws + lay->off_act);
        return sph_cuda_launch_scatter(c, &all, dh_all);
    }
    return sph_cuda_launch_convert(dhk, (char *)p->dhidden + (size_t)base * p->ld_dh * dt_size(dhk),
                                   p->ld_dh, dh_all, p->H, lay->M, p->H, p->acc_dh, c->stream);
}

/* The gradient sweep of a pass whose row statistics are known for every row. */
static sph_status grad_sweep(pass_ctx *c) {
    if (c->lay->col_outer) return grad_cols(c);
    chunk ch;
    int64_t ci = 0;
    chunks_reset(c);
    while (chunk_next(c, &ch)) SPH_TRY(grad_chunk(c, &ch, ci++, D_RECOMPUTE));
    return SPH_OK;
}

/* Before a gradient sweep: dH rows outside every span to 0 (unless accumulating), the fp32
 * dW accumulator to 0 (not with DW32_BETA0: the first chunk's GEMMs overwrite it; dw32 means
 * >= 2 chunks, and chunk 0 covers every column), and dW itself to 0 when no chunk will
 * overwrite it. */
static sph_status grad_prologue(pass_ctx *c) {
    const sph_head_plan *p = c->p;
    const sph_cuda_layout *lay = c->lay;
    if (p->dhidden && !p->acc_dh && p->spans && p->n_spans > SPH_GAP_MEMSETS) {
        /* many gaps: one memset of every row costs less than a launch per gap, and the sweep
         * overwrites every row inside the spans anyway (inactive ones with zeros) */
        size_t es = dt_size(dt_kind(p->dh_dtype)), pitch = (size_t)p->ld_dh * es;
        SPH_CUDA_RET(cudaMemset2DAsync(p->dhidden, pitch, 0, (size_t)p->H * es, (size_t)p->N,
                                       c->stream));
    } else if (p->dhidden && !p->acc_dh && p->spans) {
        size_t es = dt_size(dt_kind(p->dh_dtype)), pitch = (size_t)p->ld_dh * es;
        int64_t prev = 0;
        for (int64_t k = 0; k <= p->n_spans; k++) {
            int64_t a = k < p->n_spans ? p->spans[2 * k] : p->N;
            if (a > prev)
                SPH_CUDA_RET(cudaMemset2DAsync((char *)p->dhidden + (size_t)prev * pitch, pitch,
                                               0, (size_t)p->H * es, (size_t)(a - prev),
                                               c->stream));
            if (k < p->n_spans) prev = p->spans[2 * k + 1];
        }
    }
    if (p->dweight && lay->dw32 && !lay->col_outer) {
        if (c->st->dw32_beta0) c->st->dw32_memsets_saved++;
        else
            SPH_CUDA_RET(cudaMemsetAsync(c->ws + lay->off_dw32, 0,
                                         (size_t)p->V_loc * p->H * sizeof(float), c->stream));
    }
    if (p->dweight && !lay->dw32 && lay->n_chunks == 0 && !p->acc_dw && p->V_loc > 0) {
        size_t es = dt_size(dt_kind(p->dw_dtype)), pitch = (size_t)p->ld_dw * es;
        SPH_CUDA_RET(cudaMemset2DAsync(p->dweight, pitch, 0, (size_t)p->H * es,
                                       (size_t)p->V_loc, c->stream));
    }
    return SPH_OK;
}

static sph_status grad_epilogue(pass_ctx *c) {
    const sph_head_plan *p = c->p;
    const sph_cuda_layout *lay = c->lay;
    if (p->dweight && lay->dw32 && !lay->col_outer)
        SPH_TRY(sph_cuda_launch_convert(dt_kind(p->dw_dtype), p->dweight, p->ld_dw,
                                        (const float *)(c->ws + lay->off_dw32), p->H, p->V_loc,
                                        p->H, p->acc_dw, c->stream));
    if (p->dhidden && p->allreduce_dh && lay->comm_size > 1)
        SPH_TRY(p->comm->ops->allreduce_sum_f32(p->comm, (float *)p->dhidden,
                                                (size_t)p->N * p->H, c->stream));
    return SPH_OK;
}

/* The pass's state. The workspace was checked against the layout by head.c's validation
 * (ctx->head.workspace is this layout's total); the check here only guards the invariant that
 * the layout of the query and of the pass agree. */
static sph_status pass_begin(sph_ctx_t ctx, const sph_head_plan *p, sph_head_pass pass, void *ws,
                             size_t bytes, sph_cuda_layout *lay, pass_ctx *c) {
    SPH_TRY(sph_cuda_head_layout(ctx, p, pass, lay));
    sph_trace_mark("cuda: layout");
    SPH_CHECK(bytes >= lay->total, SPH_ERR_INTERNAL,
              "head (cuda): workspace of %zu bytes, the pass's layout needs %zu", bytes,
              lay->total);
    memset(c, 0, sizeof *c);
    c->ctx = ctx;
    c->p = p;
    c->lay = lay;
    c->st = (sph_cuda_state *)ctx->cuda;
    c->stream = (cudaStream_t)ctx->stream;
    c->ws = (char *)ws;
    c->dk = dt_kind(p->dtype);
    c->es = dt_size(c->dk);
    c->gathered_k0 = -1;
    SPH_CUDA_RET(cudaSetDevice(ctx->device.id));
    sph_trace_mark("cuda: set device");
    SPH_TRY(setup_cublas(c));
    sph_trace_mark("cuda: cublas setup");
    if (lay->gather && p->N > 0) SPH_TRY(sph_cuda_build_act_rows(c));
    sph_trace_mark("cuda: act rows");
    return SPH_OK;
}

/* Ablation (SPH_CUDA_FLAG_DENSE_BACKWARD): the backward ignores the spans and computes every row,
 * the mask zeroing the inactive rows' dlogits: the dense baseline of the seed's same-run A/B of
 * dlogit-tile skipping, span-restricted dHidden and active-row dW (all three come from the
 * backward's row space being the active rows). Results are the same; only the cost differs. */
static const sph_head_plan *backward_plan(sph_ctx_t ctx, const sph_head_plan *p,
                                          sph_head_plan *tmp) {
    const sph_cuda_state *st = (const sph_cuda_state *)ctx->cuda;
    if (!st->dense_bwd || p->K > 0 || !p->spans) return p;
    *tmp = *p;
    tmp->spans = NULL;
    tmp->n_spans = 0;
    return tmp;
}

// ---- entry points ----------------------------------------------------------------------------

extern "C" sph_status sph_head_cuda_workspace(sph_ctx_t ctx, sph_head_pass pass,
                                              const sph_head_plan *p, size_t *bytes) {
    sph_cuda_layout lay;
    sph_head_plan tmp;
    if (pass == SPH_HEAD_BACKWARD) p = backward_plan(ctx, p, &tmp);
    SPH_TRY(sph_cuda_head_layout(ctx, p, pass, &lay));
    *bytes = lay.total;
    return SPH_OK;
}

extern "C" sph_status sph_head_cuda_forward(sph_ctx_t ctx, const sph_head_plan *p, void *ws,
                                            size_t bytes) {
    sph_cuda_layout lay;
    pass_ctx c;
    SPH_TRY(pass_begin(ctx, p, SPH_HEAD_FORWARD, ws, bytes, &lay, &c));
    if (p->N == 0) {
        if (p->one_pass) SPH_TRY(grad_prologue(&c));
        return SPH_OK;
    }
    SPH_TRY(sph_cuda_zero_rows_out(p, c.stream));
    sph_trace_mark("cuda: zero rows out");
    const int extras = sph_cuda_extras(p, SPH_HEAD_FORWARD); /* fused: sum_p2 in fused_stats */
    if (extras) SPH_TRY(sph_cuda_extras_zero(p, c.stream));
    float *part = (float *)(c.ws + lay.off_part), *recv = (float *)(c.ws + lay.off_recv);
    float *L = (float *)(c.ws + lay.off_L);
    if (lay.comm_size > 1)
        SPH_CUDA_RET(cudaMemsetAsync(part, 0, (size_t)p->N * SPH_PARTIAL_FIELDS * 4, c.stream));
    if (p->one_pass) SPH_TRY(grad_prologue(&c));
    sph_trace_mark("cuda: prologue");
    /* One-pass with staged chunks takes each chunk's gradients from its staged logits right
     * after the chunk's statistics. Otherwise every chunk's statistics, one combine and the
     * finalize; one-pass then runs the backward's gradient sweep (logits recomputed). */
    const int per_chunk =
        lay.path == SPH_CUDA_PATH_STAGED_E || lay.path == SPH_CUDA_PATH_STAGED_F32;
    chunk ch;
    int64_t ci = 0;
    chunks_reset(&c);
    while (chunk_next(&c, &ch)) {
        const char *hp;
        int64_t ld;
        SPH_TRY(sph_cuda_chunk_h(&c, &ch, &hp, &ld));
        for (int64_t s = 0; s < lay.n_splits; s++) {
            int64_t c0 = s * lay.Vs, w = p->V_loc - c0 < lay.Vs ? p->V_loc - c0 : lay.Vs;
            if (lay.fused) {
                SPH_TRY(fused_stats(&c, hp, ld, &ch, c0, w, s > 0));
            } else {
                SPH_TRY(gemm_logits(&c, hp, ld, ch.rows, c0, w, L));
                SPH_TRY(sph_cuda_launch_stats(&c, L, &ch, c0, w, s > 0));
                if (extras) SPH_TRY(sph_cuda_extras_split(&c, L, &ch, c0, w, s > 0));
            }
        }
        if (per_chunk) {
            /* per-chunk combine, then gradients from the logits still in L when the
             * vocabulary is not split (otherwise recomputed split by split) */
            const float *recs;
            SPH_TRY(sph_cuda_combine(ctx, p, part + ch.k0 * SPH_PARTIAL_FIELDS, recv, ch.rows,
                                     lay.comm_size, &recs));
            SPH_TRY(sph_cuda_finalize_rows(p, recs, ch.rows * SPH_PARTIAL_FIELDS, lay.comm_size,
                                           ch.r0, ch.rowmap, ch.rows, c.st->nf, c.stream));
            sph_trace_mark("cuda: combine + finalize");
            if (extras) {
                const float2 *xm;
                const sph_cuda_xtk *xt;
                SPH_TRY(sph_cuda_extras_combine(&c, ch.k0, ch.rows, &xm, &xt));
                SPH_TRY(sph_cuda_extras_finalize(&c, recs, xm, xt, ch.rows, ch.r0, ch.rowmap,
                                                 ch.rows));
            }
            if (lay.path == SPH_CUDA_PATH_STAGED_E) {
                int done = 0;
                SPH_TRY(e2d_overlapped(&c, &ch, ci, &done));
                if (!done) {
                    SPH_TRY(chunk_e2d(&c, &ch));
                    sph_trace_mark("cuda: e2d");
                    SPH_TRY(grad_chunk(&c, &ch, ci, D_READY));
                    sph_trace_mark("cuda: grad chunk (dH, dW)");
                }
            } else {
                SPH_TRY(grad_chunk(&c, &ch, ci, lay.n_splits == 1 ? D_FROM_L : D_RECOMPUTE));
            }
        }
        ci++;
    }
    if (per_chunk) {
        SPH_TRY(grad_epilogue(&c));
        sph_trace_mark("cuda: grad epilogue");
        return SPH_OK;
    }
    const float *recs;
    SPH_TRY(sph_cuda_combine(ctx, p, part, recv, p->N, lay.comm_size, &recs));
    const int64_t stride = p->N * SPH_PARTIAL_FIELDS;
    const float2 *xm = NULL;
    const sph_cuda_xtk *xt = NULL;
    if (extras) SPH_TRY(sph_cuda_extras_combine(&c, 0, p->N, &xm, &xt));
    if (lay.gather) {
        const int64_t *act = (const int64_t *)(c.ws + lay.off_act);
        SPH_TRY(sph_cuda_finalize_rows(p, recs, stride, lay.comm_size, 0, act, lay.M, c.st->nf,
                                       c.stream));
        if (extras) SPH_TRY(sph_cuda_extras_finalize(&c, recs, xm, xt, p->N, 0, act, lay.M));
    } else {
        for (int64_t k = 0; k < spans_count(p); k++) {
            int64_t a, b;
            spans_get(p, k, &a, &b);
            SPH_TRY(sph_cuda_finalize_rows(p, recs + a * SPH_PARTIAL_FIELDS, stride, lay.comm_size,
                                           a, NULL, b - a, c.st->nf, c.stream));
            if (extras)
                SPH_TRY(sph_cuda_extras_finalize(&c, recs + a * SPH_PARTIAL_FIELDS, xm + a,
                                                 xt + a * p->topk, p->N, a, NULL, b - a));
        }
    }
    sph_trace_mark("cuda: combine + finalize");
    if (!p->one_pass) return SPH_OK;
    SPH_TRY(grad_sweep(&c));
    sph_trace_mark("cuda: grad sweep");
    SPH_TRY(grad_epilogue(&c));
    sph_trace_mark("cuda: grad epilogue");
    return SPH_OK;
}

extern "C" sph_status sph_head_cuda_backward(sph_ctx_t ctx, const sph_head_plan *p_user,
                                             void *ws, size_t bytes) {
    sph_cuda_layout lay;
    pass_ctx c;
    sph_head_plan tmp;
    const sph_head_plan *p = backward_plan(ctx, p_user, &tmp);
    SPH_TRY(pass_begin(ctx, p, SPH_HEAD_BACKWARD, ws, bytes, &lay, &c));
    if (p->temp_rows) { /* the non-finite policy for device temperatures, chunk by chunk */
        chunk ch;
        chunks_reset(&c);
        while (chunk_next(&c, &ch))
            SPH_TRY(sph_cuda_check_trows(p, ch.r0, ch.rowmap, ch.rows, c.st->nf, c.stream));
    }
    SPH_TRY(grad_prologue(&c));
    SPH_TRY(grad_sweep(&c));
    return grad_epilogue(&c);
}

/* Sample support (candidates given): head_sample.cu's kernels between the same prologue,
 * finalize and epilogue as the full vocabulary. */
static sph_status cuda_support_forward(sph_ctx_t ctx, const sph_head_plan *p, void *ws,
                                       size_t bytes) {
    sph_cuda_layout lay;
    pass_ctx c;
    SPH_TRY(pass_begin(ctx, p, SPH_HEAD_FORWARD, ws, bytes, &lay, &c));
    if (p->N == 0) return p->one_pass ? grad_prologue(&c) : SPH_OK;
    SPH_TRY(sph_cuda_zero_rows_out(p, c.stream));
    float *part = (float *)(c.ws + lay.off_part), *recv = (float *)(c.ws + lay.off_recv);
    float2 *mq = p->sum_p2 ? (float2 *)(c.ws + lay.off_xmq) : NULL;
    if (mq) SPH_TRY(sph_cuda_extras_zero(p, c.stream)); /* rows outside the spans: 0 */
    SPH_TRY(sph_cuda_sample_forward(ctx, p, c.ws + lay.off_sample, part, recv, mq,
                                    lay.comm_size));
    if (mq) { /* sum_p2 over the support: head_extras.cu's combine and finalize, span by span */
        const float2 *xm;
        const sph_cuda_xtk *xt;
        const float *recs = lay.comm_size > 1 ? recv : part; /* sph_cuda_combine's choice */
        SPH_TRY(sph_cuda_extras_combine(&c, 0, p->N, &xm, &xt));
        for (int64_t k = 0; k < spans_count(p); k++) {
            int64_t a, b;
            spans_get(p, k, &a, &b);
            SPH_TRY(sph_cuda_extras_finalize(&c, recs + a * SPH_PARTIAL_FIELDS, xm + a, NULL,
                                             p->N, a, NULL, b - a));
        }
    }
    if (!p->one_pass) return SPH_OK;
    SPH_TRY(sph_cuda_sample_backward(ctx, p, c.ws + lay.off_sample, lay.sample_bytes));
    return grad_epilogue(&c); /* the TP all-reduce of dH */
}

static sph_status cuda_support_backward(sph_ctx_t ctx, const sph_head_plan *p, void *ws,
                                        size_t bytes) {
    sph_cuda_layout lay;
    pass_ctx c;
    SPH_TRY(pass_begin(ctx, p, SPH_HEAD_BACKWARD, ws, bytes, &lay, &c));
    if (p->N == 0) return grad_prologue(&c);
    if (p->temp_rows) /* the non-finite policy for device temperatures */
        for (int64_t k = 0; k < spans_count(p); k++) {
            int64_t a, b;
            spans_get(p, k, &a, &b);
            SPH_TRY(sph_cuda_check_trows(p, a, NULL, b - a, c.st->nf, c.stream));
        }
    SPH_TRY(sph_cuda_sample_backward(ctx, p, c.ws + lay.off_sample, lay.sample_bytes));
    return grad_epilogue(&c);
}

// ---- the table ---------------------------------------------------------------------------


/* The CUDA backend's own conditions, run by head.c's validation after the generic checks
 * (shapes, dtypes, element alignment, devices of the descriptors, communicator) and before
 * anything is written: the device's capability, that every pointer is device memory, the
 * sample path's limits. */
static sph_status cuda_check(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p) {
    (void)pass;
    const sph_cuda_state *st = (const sph_cuda_state *)ctx->cuda;
    SPH_CHECK(st->cc >= 80, SPH_ERR_UNSUPPORTED,
              "device %s: compute capability %d.%d, spanhead's CUDA path needs 8.0 or newer",
              st->prop.name, st->cc / 10, st->cc % 10);
    SPH_TRY(sph_cuda_need_device(p->hidden, "hidden"));
    SPH_TRY(sph_cuda_need_device(p->weight, "weight"));
    SPH_TRY(sph_cuda_need_device(p->targets, "targets"));
    SPH_TRY(sph_cuda_need_device(p->cand, "candidates"));
    SPH_TRY(sph_cuda_need_device(p->mask, "active_mask"));
    SPH_TRY(sph_cuda_need_device(p->temp_rows, "temperature_rows"));
    SPH_TRY(sph_cuda_need_device(p->logprob, "logprob"));
    SPH_TRY(sph_cuda_need_device(p->entropy, "entropy"));
    SPH_TRY(sph_cuda_need_device(p->lse, "lse"));
    SPH_TRY(sph_cuda_need_device(p->logit_mean, "logit_mean"));
    SPH_TRY(sph_cuda_need_device(p->stats, "stats"));
    SPH_TRY(sph_cuda_need_device(p->dlogprob, "dlogprob"));
    SPH_TRY(sph_cuda_need_device(p->dentropy, "dentropy"));
    SPH_TRY(sph_cuda_need_device(p->dlse, "dlse"));
    SPH_TRY(sph_cuda_need_device(p->dlogit_mean, "dlogit_mean"));
    SPH_TRY(sph_cuda_need_device(p->dhidden, "dhidden"));
    SPH_TRY(sph_cuda_need_device(p->dweight, "dweight"));
    SPH_TRY(sph_cuda_need_device(p->sum_p2, "sum_p2"));
    SPH_TRY(sph_cuda_need_device(p->topk_ids, "topk_ids"));
    SPH_TRY(sph_cuda_need_device(p->topk_lp, "topk_logprobs"));
    SPH_CHECK(!p->topk || p->V <= INT32_MAX, SPH_ERR_UNSUPPORTED,
              "topk_ids: vocab_total %lld exceeds the CUDA top-k's int32 ids", (long long)p->V);
    if (p->K > 0) SPH_TRY(sph_cuda_sample_check(p));
    return SPH_OK;
}

static sph_status cuda_check_workspace(sph_ctx_t ctx, const void *ws, size_t bytes) {
    (void)ctx, (void)bytes;
    SPH_TRY(sph_cuda_need_device(ws, "workspace"));
    SPH_CHECK(((uintptr_t)ws % SPH_WS_ALIGN) == 0, SPH_ERR_WORKSPACE,
              "workspace: pointer %p is misaligned, expected %d-byte alignment", ws,
              SPH_WS_ALIGN);
    return SPH_OK;
}

/* sph_head_describe: the layout of the pass, in words. */
static sph_status cuda_describe(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p,
                                sph_head_pass_info *info) {
    if (p->K > 0) return SPH_OK; /* "support": per-row candidate kernels, no chunks */
    sph_cuda_layout lay;
    sph_head_plan tmp;
    if (pass == SPH_HEAD_BACKWARD) p = backward_plan(ctx, p, &tmp);
    SPH_TRY(sph_cuda_head_layout(ctx, p, pass, &lay));
    info->budget_bytes = lay.budget;
    info->chunk_rows = lay.R;
    info->n_chunks = lay.n_chunks;
    info->vocab_split = lay.Vs;
    info->n_splits = lay.n_splits;
    info->flags = (lay.gather ? SPH_PASS_GATHERED : 0u) |
                  (lay.col_outer ? SPH_PASS_VOCAB_OUTER : 0u) |
                  (lay.bi ? SPH_PASS_BATCH_INVARIANT : 0u) |
                  ((int64_t)lay.total > lay.budget ? SPH_PASS_OVER_BUDGET : 0u);
    if (lay.path == SPH_CUDA_PATH_RECOMPUTE) info->flags |= SPH_PASS_RECOMPUTES;
    /* the extras (sum_p2, top-k) read the staged logits: the path plus their kernel */
    snprintf(info->path, sizeof info->path, "%s%s", sph_cuda_path_name(lay.path),
             sph_cuda_extras(p, pass) ? "+extras" : "");
    return SPH_OK;
}

extern "C" void sph_head_cuda_fill(sph_ctx_t ctx, sph_head_backend *be) {
    (void)ctx;
    be->name = "cuda";
    be->check = cuda_check;
    be->describe = cuda_describe;
    be->workspace = sph_head_cuda_workspace;
    be->check_workspace = cuda_check_workspace;
    be->forward = sph_head_cuda_forward;
    be->backward = sph_head_cuda_backward;
    be->support_forward = cuda_support_forward;
    be->support_backward = cuda_support_backward;
    be->batch_invariant = 1; /* fixed tiling and split width (head_layout.cu) */
}
