/*
 * head_layout.cu - how one CUDA pass runs (sph_cuda_head_layout), in three steps:
 *   1. choose_path   the path (head.cuh, sph_cuda_path: the word sph_head_describe prints
 *                    and the bench's `path` column shows): which kernels (fused sm_90a
 *                    epilogues or cuBLAS + staged logits, batch-invariant fixed tiling) and,
 *                    for a one-pass forward, where its gradients come from;
 *   2. size_pass     the gradient sweep's order (row-outer or vocabulary-outer), chunk rows R,
 *                    split width Vs and the fp32 accumulators;
 *   3. place_buffers where every buffer lives inside the caller's workspace.
 * Computed from (ctx, plan, pass) alone, so the workspace query, sph_head_describe and the
 * pass agree; pure host arithmetic (tests/unit/test_cuda_layout.c checks it without a GPU).
 * The measurements behind the rules are in notes/cuda-notes.md ("The layout's rules").
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuda/head.cuh"
#include "cuda/head_sm90.cuh"
#include "cuda/tune.cuh"

// ---- host: layout --------------------------------------------------------------------------

int64_t sph_cuda_dh_splits(int64_t rows, int64_t H, int64_t w, int sms) {
    if (sms <= 0) sms = 132;
    if (rows <= 0 || H <= 0 || w <= 0) return 1;
    const int64_t tiles = ((rows + 127) / 128) * ((H + 255) / 256);
    if (tiles >= sms) return 1;
    int64_t s = (2 * (int64_t)sms + tiles - 1) / tiles;
    if (s > 8) s = 8;
    if (s > w / 2048) s = w / 2048;
    return s >= 2 ? s : 1;
}

const char *sph_cuda_path_name(sph_cuda_path path) {
    switch (path) {
    case SPH_CUDA_PATH_CUBLAS: return "cublas";
    case SPH_CUDA_PATH_FUSED: return "fused";
    case SPH_CUDA_PATH_STAGED_E: return "staged-e";
    case SPH_CUDA_PATH_STAGED_F32: return "staged-f32";
    case SPH_CUDA_PATH_RECOMPUTE: return "recompute";
    case SPH_CUDA_PATH_SUPPORT: return "support";
    case SPH_CUDA_PATH_AUTO: break;
    }
    return "auto";
}

/* What the three steps read of a pass beyond the plan. */
typedef struct pass_facts {
    int dk;               /* the inputs' dtype kind */
    int half_dw, half_dh; /* half-precision gradient outputs (fp32 accumulators) */
    int can_fuse;         /* the sm_90a fused kernels can run this pass's operands */
    int extras;           /* the forward's extras (sum_p2, top-k) */
    int extras_staged;    /* ... that read staged logits (EXTRAS_STAGED) */
    int64_t tk_row;       /* the fused top-k's bytes per chunk row (0: none) */
    int64_t max_span;     /* the longest row range a chunk walks (M when gathered) */
    int64_t n_spans;
    int64_t chunk_bytes;  /* the context's budget (1 GiB by default) */
    int64_t row_fixed;    /* row-outer sweep: the fp32 dW accumulator of the whole shard */
    int64_t col_fixed;    /* vocabulary-outer sweep: the fp32 dH of every computed row */
    int64_t base_fixed;   /* cuBLAS's slice, the row map, the per-row records */
} pass_facts;

/* Staged E's cut (choose_path decides it, size_pass takes it). */
typedef struct staged_e {
    int64_t rows;   /* rows per chunk */
    int inplace;    /* E_TWO_CHUNKS: two chunks, no fp32 dW accumulator */
    int64_t budget; /* its own budget */
} staged_e;

/* The fused top-k (head_extras.cu): slots per row, the power of two >= max(K, 8), and
 * candidates per row before it overflows: the columns of the tiles a row has in flight before
 * the epilogue raised its threshold (~264 tiles of 64 rows x 256 columns run at once on 132
 * SMs, over at most 32 row tiles of the raster group: ~2300 columns from 2048 rows up, more
 * below; the seed from a sample, when there is one, cuts that to ~1/16, but it may fail), plus
 * ~2 ks ln(ks) per doubling of the columns seen after that, with room to spare; never more
 * than the shard's columns (then no row can overflow). Tests set it small
 * (SPH_TEST_TOPK_CAP). */
static int64_t topk_pow2(int64_t K) {
    int64_t k2 = 8;
    while (k2 < K) k2 *= 2;
    return k2;
}
static int64_t topk_cap(const sph_cuda_state *st, const sph_head_plan *p, int64_t M) {
    if (st->topk_cap > 0) return st->topk_cap;
    int64_t row_tiles = (M + 63) / 64;
    if (row_tiles < 1) row_tiles = 1;
    if (row_tiles > 32) row_tiles = 32;
    const int64_t first = 256 * ((264 + row_tiles - 1) / row_tiles);
    const int64_t cap = first + 2048 + 32 * topk_pow2(p->topk), all = round_up(p->V_loc, 8);
    return cap < all ? cap : all;
}
static int64_t topk_row_bytes(const sph_cuda_state *st, const sph_head_plan *p, int64_t M) {
    return topk_cap(st, p, M) * (int64_t)sizeof(sph_cuda_xtk) + topk_pow2(p->topk) * 4 + 8;
}

static void pass_facts_of(sph_ctx_t ctx, const sph_head_plan *p, sph_head_pass pass,
                          sph_cuda_layout *lay, pass_facts *f) {
    const sph_cuda_state *st = (const sph_cuda_state *)ctx->cuda;
    memset(f, 0, sizeof *f);
    /* validated (head.c): host spans, an f32/bf16/f16 dtype */
    f->dk = dt_kind(p->dtype);
    lay->grads = pass == SPH_HEAD_BACKWARD || p->one_pass;
    lay->comm_size = comm_size_of(p);
    lay->bi = ctx->opts.batch_invariant ? 1 : 0;
    f->n_spans = spans_count(p);
    for (int64_t k = 0; k < f->n_spans; k++) {
        int64_t a, b;
        spans_get(p, k, &a, &b);
        if (b - a > f->max_span) f->max_span = b - a;
        lay->M += b - a;
    }
    /* several spans: chunks take rows across span boundaries (gathered into a compact
     * buffer) so every GEMM gets the full chunk height whatever the mask looks like */
    lay->gather = p->K == 0 && p->spans && p->n_spans > 1 && !st->no_gather;
    if (lay->gather) f->max_span = lay->M;
    /* The budget bounds the whole workspace: what does not scale with the chunk (cuBLAS's
     * slice, the per-row records, the fp32 dW accumulator) comes off the top, and the rest
     * holds the staged logits (+ dlogits, + the fp32 dH chunk). */
    f->chunk_bytes = ctx->chunk_bytes > 0 ? ctx->chunk_bytes : ((int64_t)1 << 30);
    f->half_dw = lay->grads && p->dweight && dt_kind(p->dw_dtype) != DT_F32;
    f->half_dh = lay->grads && p->dhidden && dt_kind(p->dh_dtype) != DT_F32;
    /* The sm_90a fused epilogues: the forward keeps no logits (a record per row and 256
     * columns instead), the backward stages only the half-precision dlogits. Decided from the
     * user's tensors, so every chunk of the pass takes the same kernels. The extras ride in
     * the fused statistics epilogue (sum_p2's q, top-k's candidates), unless EXTRAS_STAGED
     * asks for them from staged fp32 logits: then no fused epilogue beside them. */
    f->extras = sph_cuda_extras(p, pass);
    f->extras_staged = f->extras && ((p->topk > 0 && !st->topk_fused) ||
                                     (p->sum_p2 && !st->sump2_fused));
    f->tk_row = f->extras && p->topk > 0 && !f->extras_staged ? topk_row_bytes(st, p, lay->M)
                                                               : 0;
    f->can_fuse = !lay->bi && f->dk != DT_F32 && !st->no_fused && !f->extras_staged &&
                  sph_cuda_sm90_operands_ok(p->dtype, p->hidden, p->ld_h, p->weight, p->ld_w,
                                            p->H) &&
                  !st->no_sm90 && (st->assume_sm90 || sph_cuda_sm90_available());
    /* Gradient sweep order (size_pass). Row-outer (every split of a row chunk, then the next
     * chunk) keeps an fp32 dW accumulator of the whole shard (V_loc x H) when dW is half
     * precision; vocabulary-outer (every row chunk of a split, then the next split) keeps an
     * fp32 dH accumulator of the computed rows (M x H) and a split-sized dW one instead. */
    f->row_fixed = f->half_dw ? (int64_t)sph_ws_round((size_t)p->V_loc * p->H * 4) : 0;
    f->col_fixed = lay->grads && p->dhidden && (f->half_dh || lay->gather)
                       ? (int64_t)sph_ws_round((size_t)lay->M * p->H * 4)
                       : 0;
    f->base_fixed = (int64_t)SPH_CUBLAS_WS_BYTES +
                    (lay->gather ? (int64_t)sph_ws_round((size_t)lay->M * 8) : 0) +
                    (int64_t)sph_ws_round((size_t)p->N * SPH_PARTIAL_FIELDS * 4) *
                        (1 + (lay->comm_size > 1 ? lay->comm_size : 0));
    if (f->extras) {
        /* the extras' rows (place_buffers): (m, q) and the K-entry lists of every row, and
         * the TP group's copies */
        const int64_t g = 1 + (lay->comm_size > 1 ? lay->comm_size : 0);
        if (p->sum_p2) f->base_fixed += g * (int64_t)sph_ws_round((size_t)p->N * 8);
        f->base_fixed +=
            g * (int64_t)sph_ws_round((size_t)p->N * p->topk * sizeof(sph_cuda_xtk));
    }
}

// ---- step 1: the path --------------------------------------------------------------------

/* Staged E (issue 19): with the fused kernels, chunks of whole-shard rows keep E in f16 (2
 * bytes per element instead of 6: fp32 logits + half dlogits), written by the statistics
 * epilogue, and D replaces E in place. Its own budget when the context keeps the default
 * (SPH_ONEPASS_DEFAULT_BYTES): all the rows in one chunk when they fit (no dW accumulator
 * then), else chunks beside the fp32 dW accumulator. 1 when the chunks are tall enough (or
 * forced), with the cut in *e. */
static int staged_e_fits(sph_ctx_t ctx, const sph_head_plan *p, const sph_cuda_layout *lay,
                         const pass_facts *f, int forced, staged_e *e) {
    const sph_cuda_state *st = (const sph_cuda_state *)ctx->cuda;
    const int64_t be = ctx->opts.chunk_bytes > 0 ? f->chunk_bytes : SPH_ONEPASS_DEFAULT_BYTES;
    const int64_t rows_all = lay->gather ? lay->M : f->max_span;
    const int64_t nt = (p->V_loc + SPH_SM90_TILE_N - 1) / SPH_SM90_TILE_N;
    const int64_t row_e = round_up(p->V_loc, 8) * 2 +
                          nt * (SPH_PARTIAL_FIELDS + (p->sum_p2 ? 1 : 0)) * 4 +
                          (lay->gather ? p->H * ((int64_t)dt_size(f->dk) + (p->dhidden ? 4 : 0))
                                       : 0) +
                          f->tk_row + 64; /* per-row share of the 256-byte region rounding */
    int64_t re = rows_all;
    int inplace = 0;
    if (f->base_fixed + rows_all * row_e > be) re = (be - f->base_fixed - f->row_fixed) / row_e;
    /* E_TWO_CHUNKS (issue 23, v13): the whole shard misses the budget, but two chunks fit
     * without the fp32 dW accumulator: the second chunk's dW GEMM accumulates into the
     * half-precision dW itself (beta 1, one more rounding). Only where the rows make exactly
     * two chunks (one span or gathered, no user cap on the chunk rows), never when
     * accumulating into dW (the intermediate old dW + first chunk is not bounded by the
     * gradient), and only for a dW of the input's dtype: the extra rounding of the first
     * chunk's partial P1 is then <= u_out |P1| <= u_D A (A = sum |d| |h|), within the
     * budget's margin over u_D A (tests/tolerances.h TOL_CUDA_MARGIN). */
    if (st->e_two_chunks && f->half_dw && !p->acc_dw && dt_kind(p->dw_dtype) == f->dk &&
        re < rows_all && (lay->gather || f->n_spans <= 1) && ctx->chunk_rows <= 0) {
        const int64_t half = (rows_all + 1) / 2;
        /* (and only where the halves still stage E: the rule below) */
        if (f->base_fixed + half * row_e <= be && (half >= SPH_ONEPASS_STAGED_ROWS || forced))
            re = half, inplace = 1;
    }
    if (!(re >= SPH_ONEPASS_STAGED_ROWS || re >= rows_all || forced)) return 0;
    e->rows = re > 0 ? re : 1;
    e->inplace = inplace;
    e->budget = be;
    return 1;
}

/* The path of the pass. Without one-pass: the fused kernels where they can run, else cuBLAS
 * (the batch-invariant mode: its fixed tiling, shown as "cublas" with the flag). One-pass
 * takes each chunk's gradients from its staged fp32 logits (6 N H V flops) unless the staged
 * chunks of whole-shard rows get thin; then it runs the statistics of every chunk and the
 * backward's sweep, recomputing the logits (8 N H V); with the fused kernels it stages E when
 * the chunks allow. The batch-invariant mode keeps the staged form. The context's ONEPASS_*
 * switch (state.onepass_path) forces a one-pass path where it can run. */
static sph_cuda_path choose_path(sph_ctx_t ctx, const sph_head_plan *p,
                                 const sph_cuda_layout *lay, const pass_facts *f,
                                 staged_e *e) {
    const sph_cuda_state *st = (const sph_cuda_state *)ctx->cuda;
    if (!p->one_pass) return f->can_fuse ? SPH_CUDA_PATH_FUSED : SPH_CUDA_PATH_CUBLAS;
    const sph_cuda_path forced = st->onepass_path;
    int64_t b = f->chunk_bytes - f->base_fixed - f->row_fixed;
    if (b < f->chunk_bytes / 8) b = f->chunk_bytes / 8;
    int chunks = lay->bi || b / (round_up(p->V_loc, 8) * 6) >= SPH_ONEPASS_STAGED_ROWS;
    if (forced == SPH_CUDA_PATH_STAGED_F32) chunks = 1;
    if (forced == SPH_CUDA_PATH_RECOMPUTE && !lay->bi) chunks = 0;
    if (f->can_fuse && (forced == SPH_CUDA_PATH_AUTO || forced == SPH_CUDA_PATH_STAGED_E) &&
        !(p->dlogit_mean && p->softcap > 0) &&
        staged_e_fits(ctx, p, lay, f, forced == SPH_CUDA_PATH_STAGED_E, e))
        return SPH_CUDA_PATH_STAGED_E;
    return chunks ? SPH_CUDA_PATH_STAGED_F32 : SPH_CUDA_PATH_RECOMPUTE;
}

// ---- step 2: sizing ----------------------------------------------------------------------

/* Bytes of one chunk row and of one split column beside the budget (size_pass). */
typedef struct row_cost {
    int64_t budget;  /* what the chunk may take */
    int64_t bpe;     /* per staged element: fp32 logits, half dlogits (fp32 ones alias L) */
    int64_t dh_rowx; /* per chunk row beyond the logits: the fp32 dH row, the gathered h row */
    int64_t dw_col;  /* vocabulary-outer: the split's fp32 dW accumulator, per column */
    int tile_recs;   /* fused statistics: floats per 256 columns (a record, + sum_p2's q) */
    int64_t tk_row;  /* fused statistics with top-k: its buffers' bytes per row */
} row_cost;

static int64_t row_bytes(const row_cost *k, int64_t vs) {
    return round_up(vs, 8) * k->bpe + k->dh_rowx +
           (vs + SPH_SM90_TILE_N - 1) / SPH_SM90_TILE_N * k->tile_recs * 4 + k->tk_row;
}
static int64_t rows_for(const row_cost *k, int64_t vs) {
    return (k->budget - vs * k->dw_col) / row_bytes(k, vs);
}

/* The split width Vs before the row count: batch-invariant (V_loc alone), tuned, or the
 * two-pass backward's square chunks. */
static int64_t split_width(sph_ctx_t ctx, const sph_head_plan *p, const sph_cuda_layout *lay,
                           const pass_facts *f, const row_cost *k, int tuned,
                           const sph_tune_entry *te) {
    const sph_cuda_state *st = (const sph_cuda_state *)ctx->cuda;
    const int staged = lay->path == SPH_CUDA_PATH_STAGED_F32 || lay->path == SPH_CUDA_PATH_STAGED_E;
    int64_t Vs = p->V_loc;
    if (lay->path == SPH_CUDA_PATH_STAGED_E) {
        /* whole-shard rows, sized by choose_path */
    } else if (lay->bi) {
        /* the split width (and so each row's reduction order) depends on V_loc alone */
        Vs = p->V_loc < SPH_BI_SPLIT ? p->V_loc : SPH_BI_SPLIT;
    } else if (tuned && te->split > 0 && te->split < p->V_loc) {
        Vs = round_up(te->split, 8);
        if (Vs > p->V_loc) Vs = p->V_loc;
    } else if (lay->grads && !staged && !st->no_square) {
        /* Two-pass backward. Its fp32 accumulations move (N / R) V_loc H 8 bytes (dW, read
         * and written once per row chunk) plus (V_loc / Vs) N H 8 bytes (dH, staged per chunk
         * over the splits); with R * Vs fixed by the budget the sum is smallest for square
         * chunks. (The forward keeps whole-shard rows: splitting it buys nothing; unfused
         * one-pass keeps them too, since a split forces its logits to be recomputed, while
         * fused one-pass recomputes them anyway.) */
        const int64_t ms = f->max_span > 0 ? f->max_span : 1;
        double S = sqrt((double)k->budget / (double)k->bpe);
        if ((double)p->V_loc > S) {
            int64_t vs = (double)f->max_span <= S
                             ? (k->budget - ms * k->dh_rowx) / (ms * k->bpe + k->dw_col)
                             : (int64_t)S;
            vs = vs >= 1024 ? vs / 256 * 256 : vs / 8 * 8;
            if (vs >= 8 && vs < p->V_loc) Vs = vs;
        }
    }
    return Vs < 1 ? 1 : Vs;
}

static sph_status size_pass(sph_ctx_t ctx, const sph_head_plan *p, const pass_facts *f,
                            const staged_e *e, sph_cuda_layout *lay) {
    const sph_cuda_state *st = (const sph_cuda_state *)ctx->cuda;
    const int stage_e = lay->path == SPH_CUDA_PATH_STAGED_E;
    const int staged = stage_e || lay->path == SPH_CUDA_PATH_STAGED_F32;
    lay->fused = f->can_fuse && lay->path != SPH_CUDA_PATH_CUBLAS &&
                 lay->path != SPH_CUDA_PATH_STAGED_F32;
    if (stage_e) lay->dw_inplace = e->inplace, lay->e_rows = e->rows, lay->budget = e->budget;
    lay->store16 = lay->fused && !st->no_store16;
    /* the smaller fixed part wins: a wide vocabulary goes vocabulary-outer; one-pass from
     * staged chunks takes its gradients chunk by chunk: row-outer */
    lay->col_outer = lay->grads && !lay->bi && !staged && (lay->gather || f->n_spans <= 1) &&
                     f->col_fixed < f->row_fixed && !st->no_colouter;
    const int64_t chunk_bytes = f->chunk_bytes;
    int64_t fixed = f->base_fixed + (lay->col_outer ? f->col_fixed : f->row_fixed);
    row_cost k;
    /* When the fixed part alone exceeds 7/8 of the budget, the chunk keeps an eighth of it and
     * the workspace exceeds chunk_bytes (reported by sph_head_workspace_size and
     * sph_head_describe's SPH_PASS_OVER_BUDGET); when the fixed part exceeds the whole budget
     * (both fp32 accumulators over it), the chunks keep half of it, since the budget is broken
     * anyway and an eighth of it made chunks too short. */
    k.budget = chunk_bytes - fixed;
    if (k.budget < chunk_bytes / 8)
        k.budget = fixed > chunk_bytes ? chunk_bytes / 2 : chunk_bytes / 8;
    lay->tile_q = lay->fused && f->extras && p->sum_p2;
    lay->tk_fused = lay->fused && f->tk_row > 0;
    if (lay->tk_fused) lay->tk_ks = topk_pow2(p->topk), lay->tk_cap = topk_cap(st, p, lay->M);
    k.tk_row = lay->tk_fused ? f->tk_row : 0;
    k.tile_recs = lay->fused && (!lay->grads || p->one_pass)
                      ? SPH_PARTIAL_FIELDS + (lay->tile_q ? 1 : 0)
                      : 0;
    k.bpe = (!lay->fused ? 4 : 0) + (lay->grads && f->dk != DT_F32 ? 2 : 0);
    /* the fp32 dH row (half dH with split vocabulary, or any dH when gathered) */
    const int64_t dh_row =
        !lay->col_outer && (f->half_dh || (lay->gather && lay->grads && p->dhidden)) ? p->H * 4
                                                                                     : 0;
    k.dh_rowx = dh_row + (lay->gather ? p->H * (int64_t)dt_size(f->dk) : 0);
    k.dw_col = lay->col_outer && f->half_dw ? p->H * 4 : 0;
    if (!lay->budget) lay->budget = chunk_bytes;
    sph_tune_entry te;
    int tuned = !lay->bi && sph_cuda_tune_lookup(st, p->dtype, p->H, p->V_loc, p->N, &te);
    if (st->forcing) {
        /* sph_tune's candidate under test */
        tuned = 1;
        te.chunk_rows = st->force_rows;
        te.split = st->force_split;
    }
    int64_t Vs = split_width(ctx, p, lay, f, &k, tuned, &te);
    int64_t R = stage_e ? lay->e_rows : rows_for(&k, Vs);
    const int64_t max_span = f->max_span;
    int64_t want_rows = max_span < SPH_MIN_CHUNK_ROWS ? max_span : SPH_MIN_CHUNK_ROWS;
    if (!lay->bi && !stage_e && R < want_rows) {
        /* even a minimal chunk of rows exceeds the budget: split the vocabulary (a tile
         * record costs 20 bytes per 256 columns: under 0.1 byte per element) */
        Vs = (k.budget - want_rows * k.dh_rowx) / (want_rows * (k.bpe + 1) + k.dw_col) / 8 * 8;
        if (Vs < 8) Vs = 8;
        if (Vs > p->V_loc) Vs = p->V_loc;
        R = rows_for(&k, Vs);
    }
    if (R < 1) R = 1;
    int64_t user_rows = ctx->chunk_rows > 0
                            ? ctx->chunk_rows
                            : (tuned && !stage_e && te.chunk_rows > 0 ? te.chunk_rows : 0);
    if (user_rows > 0 && user_rows < R) R = user_rows;
    if (R > max_span) R = max_span > 0 ? max_span : 1;
    if (R < max_span) {
        /* equal chunks: 8190 + 2 rows would cost a second dW accumulation for 2 rows */
        const int64_t n = (max_span + R - 1) / R;
        R = (max_span + n - 1) / n;
    }
    /* grid.y limit of the dlogits kernel, with margin (the fused passes launch none) */
    const int64_t max_rows = lay->fused ? ((int64_t)1 << 22) : 32768;
    if (R > max_rows) R = max_rows;
    lay->R = R;
    lay->Vs = Vs;
    lay->ldL = round_up(Vs, 8);
    lay->n_splits = p->V_loc > 0 ? (p->V_loc + Vs - 1) / Vs : 0;
    if (lay->gather) {
        lay->n_chunks = (lay->M + R - 1) / R;
    } else {
        for (int64_t q = 0; q < f->n_spans; q++) {
            int64_t a, b;
            spans_get(p, q, &a, &b);
            lay->n_chunks += (b - a + R - 1) / R;
        }
    }
    SPH_CHECK(p->H <= INT32_MAX && p->ld_h <= INT32_MAX && p->ld_w <= INT32_MAX &&
                  p->V_loc <= INT32_MAX && lay->ldL <= INT32_MAX,
              SPH_ERR_OVERFLOW, "head: H %lld / V_loc %lld / row strides exceed cuBLAS's int",
              (long long)p->H, (long long)p->V_loc);
    /* row-outer: the chunk's fp32 dH (R x H) when a half dH takes several splits (gathered
     * chunks stage theirs in dhg); vocabulary-outer: the fp32 dH of every computed row
     * (M x H) when dH is half or the rows are gathered */
    lay->dh32 = lay->col_outer ? f->col_fixed > 0
                               : !lay->gather && f->half_dh && lay->n_splits > 1;
    if (lay->n_chunks != 2) lay->dw_inplace = 0; /* (guarded above; never more roundings) */
    lay->dw32 = f->half_dw && lay->n_chunks > 1 && !lay->dw_inplace;
    /* DH_SPLITK (issue 23, v14): each chunk's dH is one GEMM per split of rows x H outputs
     * over the split's columns; when those tiles leave SMs idle (1K rows), the GEMM is cut
     * over the vocabulary into fp32 partials, then summed (a narrow last split: unsplit) */
    if (st->dh_splitk && lay->grads && p->dhidden && !lay->bi) {
        const int64_t q = sph_cuda_dh_splits(R, p->H, Vs, st->prop.multiProcessorCount);
        lay->dhk = q > 1 ? q : 0;
    }
    lay->n_tiles = (Vs + SPH_SM90_TILE_N - 1) / SPH_SM90_TILE_N;
    return SPH_OK;
}

// ---- step 3: buffer placement ------------------------------------------------------------

/* Sample support: per-row records plus the scatter buffers, after cuBLAS's slice. */
static void place_sample(const sph_head_plan *p, sph_cuda_layout *lay) {
    size_t off = 0;
    lay->off_cublas = off;
    off += SPH_CUBLAS_WS_BYTES;
    lay->off_part = off;
    off += sph_ws_round((size_t)p->N * SPH_PARTIAL_FIELDS * 4);
    lay->off_recv = off;
    if (lay->comm_size > 1)
        off += sph_ws_round((size_t)lay->comm_size * p->N * SPH_PARTIAL_FIELDS * 4);
    lay->off_sample = off;
    lay->sample_bytes = sph_cuda_sample_ws(p, lay->grads);
    off += sph_ws_round(lay->sample_bytes);
    /* the forward's sum_p2 over the candidates: (m, q) per row and the group's (extras) */
    const int sp2 = p->sum_p2 && (!lay->grads || p->one_pass);
    lay->off_xmq = off;
    if (sp2) off += sph_ws_round((size_t)p->N * 8);
    lay->off_xmq_recv = off;
    if (sp2 && lay->comm_size > 1) off += sph_ws_round((size_t)lay->comm_size * p->N * 8);
    lay->off_xtk = lay->off_xtk_recv = off;
    lay->total = off;
}

static void place_buffers(const sph_head_plan *p, const pass_facts *f, sph_cuda_layout *lay) {
    const int64_t R = lay->R;
    const int stage_L = !lay->fused;
    const int tile_recs = lay->fused && (!lay->grads || p->one_pass);
    size_t off = 0;
    lay->off_cublas = off;
    off += SPH_CUBLAS_WS_BYTES;
    lay->off_L = off;
    if (stage_L) off += sph_ws_round((size_t)R * lay->ldL * 4);
    lay->off_T = off;
    if (tile_recs) off += sph_ws_round((size_t)R * lay->n_tiles * SPH_PARTIAL_FIELDS * 4);
    lay->off_Tq = off;
    if (tile_recs && lay->tile_q) off += sph_ws_round((size_t)R * lay->n_tiles * 4);
    lay->off_tkc = off;
    if (lay->tk_fused) off += sph_ws_round((size_t)R * lay->tk_cap * sizeof(sph_cuda_xtk));
    lay->off_tks = off;
    if (lay->tk_fused) off += sph_ws_round((size_t)R * lay->tk_ks * 4);
    lay->off_tkt = off;
    if (lay->tk_fused) off += sph_ws_round((size_t)R * 4);
    lay->off_tkn = off;
    if (lay->tk_fused) off += sph_ws_round((size_t)R * 4);
    lay->off_D = off;
    if (lay->grads && f->dk != DT_F32) off += sph_ws_round((size_t)R * lay->ldL * 2);
    lay->off_part = off;
    off += sph_ws_round((size_t)p->N * SPH_PARTIAL_FIELDS * 4);
    lay->off_recv = off;
    if (lay->comm_size > 1)
        off += sph_ws_round((size_t)lay->comm_size * p->N * SPH_PARTIAL_FIELDS * 4);
    lay->off_dh32 = off;
    if (lay->dh32) off += sph_ws_round((size_t)(lay->col_outer ? lay->M : R) * p->H * 4);
    lay->off_dw32 = off;
    if (lay->dw32) off += sph_ws_round((size_t)(lay->col_outer ? lay->Vs : p->V_loc) * p->H * 4);
    lay->off_act = off;
    if (lay->gather) off += sph_ws_round((size_t)lay->M * 8);
    lay->off_hg = off;
    if (lay->gather) off += sph_ws_round((size_t)R * p->H * dt_size(f->dk));
    lay->off_dhg = off;
    if (lay->gather && lay->grads && p->dhidden && !lay->col_outer)
        off += sph_ws_round((size_t)R * p->H * 4);
    /* the forward's extras (head_extras.cu): (m, q) and top-k lists of every row, and what
     * the TP group's allgather brings */
    if (f->extras) {
        const size_t n = (size_t)p->N, g = lay->comm_size > 1 ? (size_t)lay->comm_size : 0;
        const size_t xk = (size_t)p->topk * sizeof(sph_cuda_xtk);
        lay->off_xmq = off;
        if (p->sum_p2) off += sph_ws_round(n * 8);
        lay->off_xmq_recv = off;
        if (p->sum_p2) off += sph_ws_round(g * n * 8);
        lay->off_xtk = off;
        off += sph_ws_round(n * xk);
        lay->off_xtk_recv = off;
        off += sph_ws_round(g * n * xk);
    }
    /* DH_SPLITK's partials last, and only when they fit the budget beside the rest */
    lay->off_dhk = off;
    if (lay->dhk) {
        const size_t part = sph_ws_round((size_t)lay->dhk * R * p->H * 4);
        if ((int64_t)(off + part) <= lay->budget) off += part;
        else lay->dhk = 0;
    }
    lay->total = off;
}

// ---- the layout --------------------------------------------------------------------------

sph_status sph_cuda_head_layout(sph_ctx_t ctx, const sph_head_plan *p, sph_head_pass pass,
                                sph_cuda_layout *lay) {
    memset(lay, 0, sizeof *lay);
    pass_facts f;
    pass_facts_of(ctx, p, pass, lay, &f);
    if (p->K > 0) {
        lay->path = SPH_CUDA_PATH_SUPPORT;
        place_sample(p, lay);
        return SPH_OK;
    }
    staged_e e;
    memset(&e, 0, sizeof e);
    lay->path = choose_path(ctx, p, lay, &f, &e);
    SPH_TRY(size_pass(ctx, p, &f, &e, lay));
    place_buffers(p, &f, lay);
    return SPH_OK;
}
