/*
 * head_layout.cu - where every buffer of one CUDA pass lives inside the caller's workspace and
 * how the rows and the vocabulary are cut (sph_cuda_head_layout): chunk rows R, split width
 * Vs, which kernels (fused sm_90a epilogues or cuBLAS + staged logits, batch-invariant fixed
 * tiling), the gradient sweep's order (row-outer or vocabulary-outer) and its fp32
 * accumulators. Computed from (ctx, plan, pass) alone, so the workspace query and the pass
 * agree; pure host arithmetic (tests/unit/test_cuda_layout.c checks it without a GPU).
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

sph_status sph_cuda_head_layout(sph_ctx_t ctx, const sph_head_plan *p,
                                           sph_head_pass pass, sph_cuda_layout *lay) {
    memset(lay, 0, sizeof *lay);
    sph_cuda_state *st = (sph_cuda_state *)ctx->cuda;
    /* validated (head.c): host spans, an f32/bf16/f16 dtype */
    const int dk = dt_kind(p->dtype);
    lay->grads = pass == SPH_HEAD_BACKWARD || p->one_pass;
    lay->comm_size = comm_size_of(p);
    lay->bi = ctx->opts.batch_invariant ? 1 : 0;
    int64_t max_span = 0, n_spans = spans_count(p);
    for (int64_t k = 0; k < n_spans; k++) {
        int64_t a, b;
        spans_get(p, k, &a, &b);
        if (b - a > max_span) max_span = b - a;
        lay->M += b - a;
    }
    /* several spans: chunks take rows across span boundaries (gathered into a compact
     * buffer) so every GEMM gets the full chunk height whatever the mask looks like */
    lay->gather = p->K == 0 && p->spans && p->n_spans > 1 && !st->no_gather;
    if (lay->gather) max_span = lay->M;
    size_t off = 0;
    lay->off_cublas = off;
    off += SPH_CUBLAS_WS_BYTES;
    if (p->K > 0) {
        /* sample support: per-row records plus the scatter buffers */
        lay->off_part = off;
        off += sph_ws_round((size_t)p->N * SPH_PARTIAL_FIELDS * 4);
        lay->off_recv = off;
        if (lay->comm_size > 1)
            off += sph_ws_round((size_t)lay->comm_size * p->N * SPH_PARTIAL_FIELDS * 4);
        lay->off_sample = off;
        lay->sample_bytes = sph_cuda_sample_ws(p, lay->grads);
        off += sph_ws_round(lay->sample_bytes);
        lay->total = off;
        return SPH_OK;
    }
    /* The budget bounds the whole workspace: what does not scale with the chunk (cuBLAS's
     * slice, the per-row records, the fp32 dW accumulator) comes off the top, and the rest
     * holds the staged logits (+ dlogits, + the fp32 dH chunk). When the fixed part alone
     * exceeds 7/8 of the budget, the chunk keeps an eighth of it and the workspace exceeds
     * chunk_bytes (reported by sph_head_workspace_size and sph_head_describe's
     * SPH_PASS_OVER_BUDGET); when the fixed part exceeds the whole budget (both fp32
     * accumulators over it: E with 64K rows, D with 256K), the chunks keep half of it, since
     * the budget is broken anyway and an eighth of it made 256-row chunks (E 64K general:
     * 709.9 ms, 1.79x the floor, in run 22). */
    const int64_t chunk_bytes = ctx->chunk_bytes > 0 ? ctx->chunk_bytes : ((int64_t)1 << 30);
    const int half_dw = lay->grads && p->dweight && dt_kind(p->dw_dtype) != DT_F32;
    const int half_dh = lay->grads && p->dhidden && dt_kind(p->dh_dtype) != DT_F32;
    /* The sm_90a fused epilogues: the forward keeps no logits (a record per row and 256
     * columns instead), the backward stages only the half-precision dlogits. Decided from the
     * user's tensors, so every chunk of the pass takes the same kernels. */
    lay->fused = !lay->bi && dk != DT_F32 && !st->no_fused && !sph_cuda_extras(p, pass) &&
                 sph_cuda_sm90_operands_ok(p->dtype, p->hidden, p->ld_h, p->weight, p->ld_w,
                                           p->H) &&
                 !st->no_sm90 && (st->assume_sm90 || sph_cuda_sm90_available());
    /* Gradient sweep order. Row-outer (every split of a row chunk, then the next chunk) keeps
     * an fp32 dW accumulator of the whole shard (V_loc x H) when dW is half precision;
     * vocabulary-outer (every row chunk of a split, then the next split) keeps an fp32 dH
     * accumulator of the computed rows (M x H) and a split-sized dW one instead. The smaller
     * fixed part wins: a wide vocabulary (D: 1.24 GB of dW at H 2048) goes vocabulary-outer.
     * Unfused one-pass takes its gradients chunk by chunk from the staged logits: row-outer. */
    const int64_t row_fixed = half_dw ? (int64_t)sph_ws_round((size_t)p->V_loc * p->H * 4) : 0;
    const int64_t col_fixed = lay->grads && p->dhidden && (half_dh || lay->gather)
                                  ? (int64_t)sph_ws_round((size_t)lay->M * p->H * 4)
                                  : 0;
    const int64_t base_fixed = (int64_t)SPH_CUBLAS_WS_BYTES +
                               (lay->gather ? (int64_t)sph_ws_round((size_t)lay->M * 8) : 0) +
                               (int64_t)sph_ws_round((size_t)p->N * SPH_PARTIAL_FIELDS * 4) *
                                   (1 + (lay->comm_size > 1 ? lay->comm_size : 0));
    if (p->one_pass) {
        /* One-pass takes each chunk's gradients from its staged fp32 logits (6 N H V flops)
         * unless the staged chunks of whole-shard rows get thin; then it runs the statistics
         * of every chunk and the backward's sweep, recomputing the logits (8 N H V). Measured
         * in one run (run 10, 16K): staged chunks of ~1000-1800 rows won by 10-23 % at B and
         * C and tied at A (-3 to +8 %) against the fused sweep; ~150-row chunks lost at D
         * (96.9 vs 67.2 ms, and 1.47 GiB of workspace for its fp32 dW accumulator). The
         * batch-invariant mode keeps the staged form. */
        int64_t b = chunk_bytes - base_fixed - row_fixed;
        if (b < chunk_bytes / 8) b = chunk_bytes / 8;
        lay->onepass_chunks =
            lay->bi || b / (round_up(p->V_loc, 8) * 6) >= SPH_ONEPASS_STAGED_ROWS;
        if (st->onepass_mode == 2) lay->onepass_chunks = 1; /* forced: staged fp32 logits */
        if (st->onepass_mode == 3 && !lay->bi) lay->onepass_chunks = 0; /* forced: sweep */
        /* Staged E (issue 19): with the fused kernels, chunks of whole-shard rows keep E in
         * f16 (2 bytes per element instead of 6: fp32 logits + half dlogits), written by the
         * statistics epilogue, and D replaces E in place. Its own budget when the context
         * keeps the default (SPH_ONEPASS_DEFAULT_BYTES): all the rows in one chunk when they
         * fit (no dW accumulator then), else chunks beside the fp32 dW accumulator. */
        if (lay->fused && (st->onepass_mode == 0 || st->onepass_mode == 1) &&
            !(p->dlogit_mean && p->softcap > 0)) {
            const int64_t be = ctx->opts.chunk_bytes > 0 ? chunk_bytes
                                                         : SPH_ONEPASS_DEFAULT_BYTES;
            const int64_t rows_all = lay->gather ? lay->M : max_span;
            const int64_t nt = (p->V_loc + SPH_SM90_TILE_N - 1) / SPH_SM90_TILE_N;
            const int64_t row_e =
                round_up(p->V_loc, 8) * 2 + nt * SPH_PARTIAL_FIELDS * 4 +
                (lay->gather ? p->H * ((int64_t)dt_size(dk) + (p->dhidden ? 4 : 0)) : 0) +
                64; /* per-row share of the 256-byte region rounding */
            int64_t re = rows_all;
            int inplace = 0;
            if (base_fixed + rows_all * row_e > be)
                re = (be - base_fixed - row_fixed) / row_e;
            /* E_TWO_CHUNKS (issue 23, v13): the whole shard misses the budget (E 16K by ~2 %
             * in 4 GiB), but two chunks fit without the fp32 dW accumulator: the second
             * chunk's dW GEMM accumulates into the half-precision dW itself (beta 1, one more
             * rounding), instead of 3 chunks behind 2.1 GB of fp32 dW read and written per
             * chunk. Only where the rows make exactly two chunks (one span or gathered, no
             * user cap on the chunk rows), never when accumulating into dW (the intermediate
             * old dW + first chunk is not bounded by the gradient: run 25a saw 4.9e-2 at a
             * bf16 dW of ~2), and only for a dW of the input's dtype: the extra rounding of
             * the first chunk's partial P1 is then <= u_out |P1| <= u_D A (A = sum |d| |h|),
             * within the budget's margin over u_D A (tests/tolerances.h TOL_CUDA_MARGIN). */
            if (st->e_two_chunks && half_dw && !p->acc_dw && dt_kind(p->dw_dtype) == dk &&
                re < rows_all && (lay->gather || n_spans <= 1) && ctx->chunk_rows <= 0) {
                const int64_t half = (rows_all + 1) / 2;
                /* (and only where the halves still stage E: the rule below) */
                if (base_fixed + half * row_e <= be &&
                    (half >= SPH_ONEPASS_STAGED_ROWS || st->onepass_mode == 1))
                    re = half, inplace = 1;
            }
            if (re >= SPH_ONEPASS_STAGED_ROWS || re >= rows_all || st->onepass_mode == 1) {
                lay->dw_inplace = inplace;
                lay->onepass_e = 1;
                lay->onepass_chunks = 1;
                lay->e_rows = re > 0 ? re : 1;
                lay->budget = be;
            }
        }
        if (lay->onepass_chunks && !lay->onepass_e) lay->fused = 0;
    }
    lay->store16 = lay->fused && !st->no_store16;
    lay->col_outer = lay->grads && !lay->bi && !lay->onepass_chunks &&
                     (lay->gather || n_spans <= 1) && col_fixed < row_fixed && !st->no_colouter;
    int64_t fixed = base_fixed + (lay->col_outer ? col_fixed : row_fixed);
    int64_t budget = chunk_bytes - fixed;
    if (budget < chunk_bytes / 8) budget = fixed > chunk_bytes ? chunk_bytes / 2 : chunk_bytes / 8;
    const int stage_L = !lay->fused;
    const int tile_recs = lay->fused && (!lay->grads || p->one_pass);
    /* bytes per staged element: fp32 logits, half dlogits (fp32 dlogits alias L) */
    const int64_t bpe = (stage_L ? 4 : 0) + (lay->grads && dk != DT_F32 ? 2 : 0);
    /* per chunk row beyond the logits: the fp32 dH row (half dH with split vocabulary, or
     * any dH when gathered), the gathered h row */
    const int64_t dh_row = !lay->col_outer && (half_dh || (lay->gather && lay->grads &&
                                                          p->dhidden))
                               ? p->H * 4
                               : 0;
    const int64_t dh_rowx = dh_row + (lay->gather ? p->H * (int64_t)dt_size(dk) : 0);
    /* vocabulary-outer: the split's fp32 dW accumulator, per column of the split */
    const int64_t dw_col = lay->col_outer && half_dw ? p->H * 4 : 0;
#define ROWS_FOR(vs) ((budget - (vs) * dw_col) / ROW_BYTES(vs))
#define ROW_BYTES(vs)                                                                    \
    (round_up((vs), 8) * bpe + dh_rowx +                                                 \
     (tile_recs ? ((vs) + SPH_SM90_TILE_N - 1) / SPH_SM90_TILE_N * SPH_PARTIAL_FIELDS * 4 \
                : 0))
    int64_t Vs = p->V_loc, R = 0;
    if (!lay->budget) lay->budget = chunk_bytes;
    sph_tune_entry te;
    int tuned = !lay->bi && sph_cuda_tune_lookup(st, p->dtype, p->H, p->V_loc, p->N, &te);
    if (st->forcing) {
        /* sph_tune's candidate under test */
        tuned = 1;
        te.chunk_rows = st->force_rows;
        te.split = st->force_split;
    }
    if (lay->onepass_e) {
        /* whole-shard rows, sized above */
    } else if (lay->bi) {
        /* the split width (and so each row's reduction order) depends on V_loc alone */
        Vs = p->V_loc < SPH_BI_SPLIT ? p->V_loc : SPH_BI_SPLIT;
    } else if (tuned && te.split > 0 && te.split < p->V_loc) {
        Vs = round_up(te.split, 8);
        if (Vs > p->V_loc) Vs = p->V_loc;
    } else if (lay->grads && !lay->onepass_chunks && !st->no_square) {
        /* Two-pass backward. Its fp32 accumulations move (N / R) V_loc H 8 bytes (dW, read
         * and written once per row chunk) plus (V_loc / Vs) N H 8 bytes (dH, staged per chunk
         * over the splits); with R * Vs fixed by the budget the sum is smallest for square
         * chunks. (The forward keeps whole-shard rows: splitting it buys nothing; unfused
         * one-pass keeps them too, since a split forces its logits to be recomputed, while
         * fused one-pass recomputes them anyway.) */
        double S = sqrt((double)budget / (double)bpe);
        if ((double)p->V_loc > S) {
            int64_t vs = (double)max_span <= S
                             ? (budget - (max_span > 0 ? max_span : 1) * dh_rowx) /
                                   ((max_span > 0 ? max_span : 1) * bpe + dw_col)
                             : (int64_t)S;
            vs = vs >= 1024 ? vs / 256 * 256 : vs / 8 * 8;
            if (vs >= 8 && vs < p->V_loc) Vs = vs;
        }
    }
    if (Vs < 1) Vs = 1;
    R = lay->onepass_e ? lay->e_rows : ROWS_FOR(Vs);
    int64_t want_rows = max_span < SPH_MIN_CHUNK_ROWS ? max_span : SPH_MIN_CHUNK_ROWS;
    if (!lay->bi && !lay->onepass_e && R < want_rows) {
        /* even a minimal chunk of rows exceeds the budget: split the vocabulary (a tile
         * record costs 20 bytes per 256 columns: under 0.1 byte per element) */
        Vs = (budget - want_rows * dh_rowx) / (want_rows * (bpe + 1) + dw_col) / 8 * 8;
        if (Vs < 8) Vs = 8;
        if (Vs > p->V_loc) Vs = p->V_loc;
        R = ROWS_FOR(Vs);
    }
#undef ROWS_FOR
#undef ROW_BYTES
    if (R < 1) R = 1;
    int64_t user_rows = ctx->chunk_rows > 0 ? ctx->chunk_rows
                                            : (tuned && !lay->onepass_e && te.chunk_rows > 0
                                                   ? te.chunk_rows
                                                   : 0);
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
        for (int64_t k = 0; k < n_spans; k++) {
            int64_t a, b;
            spans_get(p, k, &a, &b);
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
    lay->dh32 = lay->col_outer ? col_fixed > 0
                               : !lay->gather && half_dh && lay->n_splits > 1;
    if (lay->n_chunks != 2) lay->dw_inplace = 0; /* (guarded above; never more roundings) */
    lay->dw32 = half_dw && lay->n_chunks > 1 && !lay->dw_inplace;
    /* DH_SPLITK (issue 23, v14): each chunk's dH is one GEMM per split of rows x H outputs
     * over the split's columns; when those tiles leave SMs idle (1K rows), the GEMM is cut
     * over the vocabulary into fp32 partials, then summed (a narrow last split: unsplit) */
    if (st->dh_splitk && lay->grads && p->dhidden && !lay->bi) {
        const int64_t k = sph_cuda_dh_splits(R, p->H, Vs, st->prop.multiProcessorCount);
        lay->dhk = k > 1 ? k : 0;
    }

    lay->n_tiles = (Vs + SPH_SM90_TILE_N - 1) / SPH_SM90_TILE_N;
    lay->off_L = off;
    if (stage_L) off += sph_ws_round((size_t)R * lay->ldL * 4);
    lay->off_T = off;
    if (tile_recs) off += sph_ws_round((size_t)R * lay->n_tiles * SPH_PARTIAL_FIELDS * 4);
    lay->off_D = off;
    if (lay->grads && dk != DT_F32) off += sph_ws_round((size_t)R * lay->ldL * 2);
    lay->off_part = off;
    off += sph_ws_round((size_t)p->N * SPH_PARTIAL_FIELDS * 4);
    lay->off_recv = off;
    if (lay->comm_size > 1)
        off += sph_ws_round((size_t)lay->comm_size * p->N * SPH_PARTIAL_FIELDS * 4);
    lay->off_dh32 = off;
    if (lay->dh32) off += sph_ws_round((size_t)(lay->col_outer ? lay->M : R) * p->H * 4);
    lay->off_dw32 = off;
    if (lay->dw32) off += sph_ws_round((size_t)(lay->col_outer ? Vs : p->V_loc) * p->H * 4);
    lay->off_act = off;
    if (lay->gather) off += sph_ws_round((size_t)lay->M * 8);
    lay->off_hg = off;
    if (lay->gather) off += sph_ws_round((size_t)R * p->H * dt_size(dk));
    lay->off_dhg = off;
    if (lay->gather && lay->grads && p->dhidden && !lay->col_outer)
        off += sph_ws_round((size_t)R * p->H * 4);
    /* the forward's extras (head_extras.cu): (m, q) and top-k lists of every row, and what
     * the TP group's allgather brings */
    if (sph_cuda_extras(p, pass)) {
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
    return SPH_OK;
}
