/*
 * head.cu - the CUDA LM head: forward (row statistics), backward (dlogits, dHidden, dWeight)
 * and one-pass mode over row chunks of the active spans, with the vocabulary split when one
 * chunk of staged logits would not fit the budget (DESIGN.md sections 1 and 4).
 *
 * Per chunk of R rows [r0, r0 + R) and vocabulary split [c0, c0 + w) of this shard:
 *   L (R, w) fp32 = h[r0:r0+R] . W[c0:c0+w]^T       cuBLAS, or head_mma.cu (batch-invariant)
 *   forward : partial record (m, s, b, zt, sz) per row, merged online across splits
 *             (plan.h), combined across the TP group by one allgather, then finalized
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
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "comm/comm.h"
#include "cuda/head.cuh"
#include "cuda/head_sm90.cuh"
#include "cuda/head_math.cuh"
#include "cuda/head_onepass.cuh"
#include "cuda/tune.cuh"

// ---- dtype helpers -------------------------------------------------------------------------

enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2, DT_OTHER = 3 };

static int dt_kind(sph_dtype d) {
    if (d.lanes != 1) return DT_OTHER;
    if (d.code == SPH_DTYPE_FLOAT && d.bits == 32) return DT_F32;
    if (d.code == SPH_DTYPE_BFLOAT && d.bits == 16) return DT_BF16;
    if (d.code == SPH_DTYPE_FLOAT && d.bits == 16) return DT_F16;
    return DT_OTHER;
}
static size_t dt_size(int k) { return k == DT_F32 ? 4 : 2; }
static cudaDataType_t dt_cuda(int k) {
    return k == DT_F32 ? CUDA_R_32F : (k == DT_BF16 ? CUDA_R_16BF : CUDA_R_16F);
}

// ---- kernels: row statistics ---------------------------------------------------------------

#define STATS_THREADS 256

/* One block per row of the chunk. Each thread owns columns q*4.. (q = tid, tid + 256, ...),
 * then a fixed-order tree over warps: the result depends on the row's logits and w only. */
__global__ void __launch_bounds__(STATS_THREADS)
    head_stats_kernel(const float *__restrict__ L, int64_t ldL, int64_t r0,
                      const int64_t *__restrict__ rowmap, int64_t w, int64_t col_g0,
                      const void *__restrict__ tgt, int tgt_i64, float inv_t, float cap,
                      float inv_cap, float *__restrict__ recs, int merge) {
    /* chunk row r is global row rowmap[r] (gathered chunks) or r0 + r; its record is
     * recs[r] (the chunk's slice of the pass's records) */
    const int64_t r = blockIdx.x, i = rowmap ? rowmap[r] : r0 + r;
    const float *row = L + r * ldL;
    float m = -INFINITY, s = 0.f, b = 0.f, sz = 0.f;
    const int64_t nv4 = w / 4;
    /* ldL is a multiple of 8 floats and L is 256-byte aligned: float4 loads are aligned */
    for (int64_t q = threadIdx.x; q < nv4; q += STATS_THREADS) {
        float4 x = reinterpret_cast<const float4 *>(row)[q];
        stats_update(transform(x.x, inv_t, cap, inv_cap), m, s, b, sz);
        stats_update(transform(x.y, inv_t, cap, inv_cap), m, s, b, sz);
        stats_update(transform(x.z, inv_t, cap, inv_cap), m, s, b, sz);
        stats_update(transform(x.w, inv_t, cap, inv_cap), m, s, b, sz);
    }
    for (int64_t c = nv4 * 4 + threadIdx.x; c < w; c += STATS_THREADS)
        stats_update(transform(row[c], inv_t, cap, inv_cap), m, s, b, sz);

    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        float b2 = __shfl_xor_sync(0xffffffffu, b, o);
        sz += __shfl_xor_sync(0xffffffffu, sz, o);
        merge3(m, s, b, m2, s2, b2);
    }
    __shared__ float sh[4][STATS_THREADS / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) sh[0][warp] = m, sh[1][warp] = s, sh[2][warp] = b, sh[3][warp] = sz;
    __syncthreads(); /* all warps' partials visible to thread 0 */
    if (threadIdx.x != 0) return;
    m = sh[0][0], s = sh[1][0], b = sh[2][0], sz = sh[3][0];
    for (int k = 1; k < STATS_THREADS / 32; k++) {
        merge3(m, s, b, sh[0][k], sh[1][k], sh[2][k]);
        sz += sh[3][k];
    }
    float zt = 0.f;
    int64_t t = load_target(tgt, tgt_i64, i);
    if (t >= col_g0 && t < col_g0 + w) zt = transform(row[t - col_g0], inv_t, cap, inv_cap);
    record_store(recs + r * SPH_PARTIAL_FIELDS, m, s, b, zt, sz, merge);
}

/* Combines the ranks' records in rank order and writes the per-row outputs and stats. */
__global__ void head_finalize_kernel(const float *__restrict__ recv, int64_t rank_stride,
                                     int comm_size, int64_t r0, const int64_t *rowmap,
                                     int64_t rows, const uint8_t *__restrict__ mask, const void *tgt,
                                     int tgt_i64, int64_t V, int sample, float *logprob,
                                     float *entropy, float *lse_out, float *logit_mean,
                                     float *stats) {
    int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= rows) return;
    int64_t i = rowmap ? rowmap[k] : r0 + k;
    bool active = !mask || mask[i];
    float m = -INFINITY, s = 0.f, b = 0.f, zt = 0.f, sz = 0.f;
    for (int r = 0; r < comm_size; r++) {
        const float *rec = recv + r * rank_stride + k * SPH_PARTIAL_FIELDS;
        merge3(m, s, b, rec[0], rec[1], rec[2]);
        zt += rec[3];
        sz += rec[4];
    }
    float lse = m + logf(s), mu = b / s;
    int64_t t = load_target(tgt, tgt_i64, i);
    /* device-resident targets are not range-checked on the host: >= V shows as NaN */
    float lp = t < 0 ? 0.f : (t >= V ? NAN : zt - lse);
    /* inactive rows, and support rows with no candidate in any shard, output zeros */
    if (!active || (m == -INFINITY && s == 0.f)) {
        active = false;
        m = lse = mu = lp = sz = 0.f;
    }
    if (logprob) logprob[i] = lp;
    if (entropy) entropy[i] = active ? lse - mu : 0.f;
    if (lse_out) lse_out[i] = lse;
    if (logit_mean) logit_mean[i] = sample ? 0.f : sz / (float)V;
    stats[i * 3 + 0] = m;
    stats[i * 3 + 1] = lse;
    stats[i * 3 + 2] = mu;
}

/* Every per-row output and the stats of all N rows to 0: rows outside the spans keep it. */
__global__ void head_zero_out_kernel(int64_t N, float *logprob, float *entropy, float *lse,
                                     float *logit_mean, float *stats) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    if (logprob) logprob[i] = 0.f;
    if (entropy) entropy[i] = 0.f;
    if (lse) lse[i] = 0.f;
    if (logit_mean) logit_mean[i] = 0.f;
    stats[i * 3] = stats[i * 3 + 1] = stats[i * 3 + 2] = 0.f;
}

// ---- kernels: dlogits ----------------------------------------------------------------------

struct dl_args {
    const float *L;
    int64_t ldL, r0, w, col_g0;
    const int64_t *rowmap; /* gathered chunk: global row of each chunk row */
    const float *stats, *g, *e, *gl, *gm;
    const uint8_t *mask;
    const void *tgt;
    int tgt_i64;
    float inv_t, cap, inv_cap, inv_V;
};

/* du = dz / T * (1 - tanh^2(u / cap)), dz = g (delta - p) + e p (mu - z) + gl p + gm / V.
 * grid.y = row of the chunk; each thread does 4 consecutive columns. D may alias L (fp32). */
template <typename OT>
__global__ void head_dlogits_kernel(dl_args a, OT *D) {
    const int64_t r = blockIdx.y, i = a.rowmap ? a.rowmap[r] : a.r0 + r;
    const float *row = a.L + r * a.ldL;
    OT *out = D + r * a.ldL;
    bool active = !a.mask || a.mask[i];
    float lse = a.stats[i * 3 + 1], mu = a.stats[i * 3 + 2];
    float g = a.g ? a.g[i] : 0.f, e = a.e ? a.e[i] : 0.f;
    float gl = a.gl ? a.gl[i] : 0.f, gmV = a.gm ? a.gm[i] * a.inv_V : 0.f;
    int64_t t = load_target(a.tgt, a.tgt_i64, i);
    if (t < 0) g = 0.f; /* ignored target: no gradient through the log-prob */
    int64_t tl = t - a.col_g0;
    const int64_t n4 = (a.w + 3) / 4;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < n4;
         q += (int64_t)gridDim.x * blockDim.x) {
        float4 u4 = reinterpret_cast<const float4 *>(row)[q];
        float u[4] = {u4.x, u4.y, u4.z, u4.w}, o[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float th = a.cap > 0.f ? tanhf(u[k] * a.inv_cap) : 0.f;
            float z = (a.cap > 0.f ? a.cap * th : u[k]) * a.inv_t;
            float p = expf(z - lse);
            float dz = -g * p + e * p * (mu - z) + gl * p + gmV;
            if (q * 4 + k == tl) dz += g;
            float du = dz * a.inv_t;
            if (a.cap > 0.f) du *= 1.f - th * th;
            o[k] = active ? du : 0.f;
        }
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (q * 4 + k < a.w) out[q * 4 + k] = from_f32<OT>(o[k]);
    }
}

/* dst (rows, cols; ld_dst, dtype OT) = (acc ? dst : 0) + src (fp32, ld_src). */
template <typename OT>
__global__ void head_convert_kernel(OT *dst, int64_t ld_dst, const float *src, int64_t ld_src,
                                    int64_t rows, int64_t cols, int acc) {
    int64_t n = rows * cols;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = k / cols, c = k % cols;
        float v = src[r * ld_src + c];
        if (acc) v += to_f32(dst[r * ld_dst + c]);
        dst[r * ld_dst + c] = from_f32<OT>(v);
    }
}

/* Gathered chunks: hg (rows, H) = h[rowmap[r]] (16-byte copies when rows allow). */
__global__ void head_gather_kernel(const char *__restrict__ h, int64_t ld_bytes,
                                   const int64_t *__restrict__ rowmap, char *__restrict__ hg,
                                   int64_t row_bytes, int vec16) {
    const int64_t r = blockIdx.x;
    const char *src = h + rowmap[r] * ld_bytes;
    char *dst = hg + r * row_bytes;
    if (vec16) {
        for (int64_t k = threadIdx.x; k < row_bytes / 16; k += blockDim.x)
            reinterpret_cast<uint4 *>(dst)[k] = reinterpret_cast<const uint4 *>(src)[k];
    } else {
        for (int64_t k = threadIdx.x; k < row_bytes / 2; k += blockDim.x)
            reinterpret_cast<uint16_t *>(dst)[k] = reinterpret_cast<const uint16_t *>(src)[k];
    }
}

/* dH[rowmap[r]] = (acc ? dH : 0) + dhg[r] for the rows of a gathered chunk. */
template <typename OT>
__global__ void head_scatter_kernel(OT *dh, int64_t ld_dh, const float *__restrict__ dhg,
                                    const int64_t *__restrict__ rowmap, int64_t H, int acc) {
    const int64_t r = blockIdx.x;
    OT *dst = dh + rowmap[r] * ld_dh;
    const float *src = dhg + r * H;
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
        float v = src[j];
        if (acc) v += to_f32(dst[j]);
        dst[j] = from_f32<OT>(v);
    }
}

/* The rows of up to 128 spans, in order, into act_rows[base ...] (the gathered row space). */
#define ACT_BATCH 128
struct span_batch {
    int64_t start[ACT_BATCH];
    int64_t prefix[ACT_BATCH + 1]; /* rows before each span within the batch */
    int n;
    int64_t base;
};

__global__ void head_act_rows_kernel(span_batch sb, int64_t *act_rows) {
    const int64_t total = sb.prefix[sb.n];
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < total;
         k += (int64_t)gridDim.x * blockDim.x) {
        int lo = 0, hi = sb.n - 1; /* last span with prefix <= k */
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (sb.prefix[mid] <= k) lo = mid;
            else hi = mid - 1;
        }
        act_rows[sb.base + k] = sb.start[lo] + (k - sb.prefix[lo]);
    }
}

// ---- host: layout --------------------------------------------------------------------------

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Row ranges the pass computes: the host spans, or [0, N) when there are none. */
typedef struct span_iter {
    const sph_head_plan *p;
    int64_t k, n, a, b;
} span_iter;

static void spans_get(const sph_head_plan *p, int64_t k, int64_t *a, int64_t *b) {
    if (p->spans) {
        *a = p->spans[2 * k];
        *b = p->spans[2 * k + 1];
    } else {
        *a = 0;
        *b = p->N;
    }
}
static int64_t spans_count(const sph_head_plan *p) { return p->spans ? p->n_spans : 1; }

static int64_t comm_size_of(const sph_head_plan *p) {
    return p->comm ? p->comm->size : 1;
}

sph_status sph_cuda_head_layout(sph_ctx_t ctx, const sph_head_plan *p,
                                           sph_head_pass pass, sph_cuda_layout *lay) {
    memset(lay, 0, sizeof *lay);
    sph_cuda_state *st = (sph_cuda_state *)ctx->cuda;
    /* spans are read here on the host: device memory would fault */
    SPH_CHECK(!p->spans || sph_cuda_pointer_is_device(p->spans) != 1, SPH_ERR_DEVICE,
              "spans: pointer %p is CUDA device memory, expected host memory", (void *)p->spans);
    int dk = dt_kind(p->dtype);
    SPH_CHECK(dk != DT_OTHER, SPH_ERR_DTYPE, "hidden: dtype %s, expected f32, bf16 or f16",
              sph_dtype_name(p->dtype));
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
     * chunk_bytes (reported by sph_head_workspace_size). */
    const int64_t chunk_bytes = ctx->chunk_bytes > 0 ? ctx->chunk_bytes : ((int64_t)1 << 30);
    const int half_dw = lay->grads && p->dweight && dt_kind(p->dw_dtype) != DT_F32;
    const int half_dh = lay->grads && p->dhidden && dt_kind(p->dh_dtype) != DT_F32;
    /* The sm_90a fused epilogues: the forward keeps no logits (a record per row and 256
     * columns instead), the backward stages only the half-precision dlogits. Decided from the
     * user's tensors, so every chunk of the pass takes the same kernels. */
    lay->fused = !lay->bi && dk != DT_F32 && !st->no_fused &&
                 sph_cuda_sm90_operands_ok(p->dtype, p->hidden, p->ld_h, p->weight, p->ld_w,
                                           p->H) &&
                 (st->assume_sm90 || sph_cuda_sm90_available());
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
            if (base_fixed + rows_all * row_e > be)
                re = (be - base_fixed - row_fixed) / row_e;
            if (re >= SPH_ONEPASS_STAGED_ROWS || re >= rows_all || st->onepass_mode == 1) {
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
    if (budget < chunk_bytes / 8) budget = chunk_bytes / 8;
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
    lay->dw32 = half_dw && lay->n_chunks > 1;

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
    lay->total = off;
    return SPH_OK;
}

// ---- host: validation ----------------------------------------------------------------------

static sph_status need_device(const void *ptr, const char *name) {
    if (!ptr) return SPH_OK;
    int d = sph_cuda_pointer_is_device(ptr);
    SPH_CHECK(d == 1, SPH_ERR_DEVICE,
              "%s: pointer %p is %s memory, expected CUDA device memory", name, ptr,
              d == 0 ? "host" : "unknown (not CUDA-allocated)");
    return SPH_OK;
}

static sph_status need_align(const void *ptr, size_t a, const char *name) {
    SPH_CHECK(((uintptr_t)ptr % a) == 0, SPH_ERR_INVALID_ARG,
              "%s: pointer %p is misaligned, expected a multiple of %zu bytes", name, ptr, a);
    return SPH_OK;
}

/* Everything the device path needs beyond plan validation: capability, where each pointer
 * lives, alignment, workspace. Runs before any launch. */
static sph_status check_device_plan(sph_ctx_t ctx, const sph_head_plan *p, void *ws,
                                    size_t bytes, const sph_cuda_layout *lay) {
    sph_cuda_state *st = (sph_cuda_state *)ctx->cuda;
    SPH_CHECK(st != NULL && ctx->device.type == SPH_DEVICE_CUDA, SPH_ERR_DEVICE,
              "ctx: not a CUDA context");
    SPH_CHECK(st->cc >= 80, SPH_ERR_UNSUPPORTED,
              "device %s: compute capability %d.%d, spanhead's CUDA path needs 8.0 or newer",
              st->prop.name, st->cc / 10, st->cc % 10);
    SPH_CHECK(p->device.type == SPH_DEVICE_CUDA && p->device.id == ctx->device.id,
              SPH_ERR_DEVICE, "tensors: device (%d, %d), expected the context's CUDA device %d",
              (int)p->device.type, (int)p->device.id, (int)ctx->device.id);
    size_t es = dt_size(dt_kind(p->dtype));
    SPH_TRY(need_device(p->hidden, "hidden"));
    SPH_TRY(need_device(p->weight, "weight"));
    SPH_TRY(need_device(p->targets, "targets"));
    SPH_TRY(need_device(p->cand, "candidates"));
    SPH_TRY(need_device(p->mask, "active_mask"));
    SPH_TRY(need_device(p->logprob, "logprob"));
    SPH_TRY(need_device(p->entropy, "entropy"));
    SPH_TRY(need_device(p->lse, "lse"));
    SPH_TRY(need_device(p->logit_mean, "logit_mean"));
    SPH_TRY(need_device(p->stats, "stats"));
    SPH_TRY(need_device(p->dlogprob, "dlogprob"));
    SPH_TRY(need_device(p->dentropy, "dentropy"));
    SPH_TRY(need_device(p->dlse, "dlse"));
    SPH_TRY(need_device(p->dlogit_mean, "dlogit_mean"));
    SPH_TRY(need_device(p->dhidden, "dhidden"));
    SPH_TRY(need_device(p->dweight, "dweight"));
    SPH_TRY(need_align(p->hidden, es, "hidden"));
    SPH_TRY(need_align(p->weight, es, "weight"));
    SPH_TRY(need_align(p->targets, p->tgt_i64 ? 8 : 4, "targets"));
    SPH_TRY(need_align(p->cand, p->cand_i64 ? 8 : 4, "candidates"));
    SPH_TRY(need_align(p->logprob, 4, "logprob"));
    SPH_TRY(need_align(p->entropy, 4, "entropy"));
    SPH_TRY(need_align(p->lse, 4, "lse"));
    SPH_TRY(need_align(p->logit_mean, 4, "logit_mean"));
    SPH_TRY(need_align(p->stats, 4, "stats"));
    SPH_TRY(need_align(p->dlogprob, 4, "dlogprob"));
    SPH_TRY(need_align(p->dentropy, 4, "dentropy"));
    SPH_TRY(need_align(p->dlse, 4, "dlse"));
    SPH_TRY(need_align(p->dlogit_mean, 4, "dlogit_mean"));
    if (p->dhidden) SPH_TRY(need_align(p->dhidden, dt_size(dt_kind(p->dh_dtype)), "dhidden"));
    if (p->dweight) SPH_TRY(need_align(p->dweight, dt_size(dt_kind(p->dw_dtype)), "dweight"));
    SPH_CHECK(p->stats != NULL, SPH_ERR_INVALID_ARG, "stats: NULL, expected an (N, 3) tensor");
    if (lay->grads) {
        int ok = (!p->dhidden || dt_kind(p->dh_dtype) == DT_F32 ||
                  sph_dtype_eq(p->dh_dtype, p->dtype)) &&
                 (!p->dweight || dt_kind(p->dw_dtype) == DT_F32 ||
                  sph_dtype_eq(p->dw_dtype, p->dtype));
        SPH_CHECK(ok, SPH_ERR_DTYPE, "dhidden/dweight: dtype must be the input dtype %s or f32",
                  sph_dtype_name(p->dtype));
        if (p->allreduce_dh && p->dhidden && lay->comm_size > 1)
            SPH_CHECK(dt_kind(p->dh_dtype) == DT_F32 && p->ld_dh == p->H, SPH_ERR_UNSUPPORTED,
                      "allreduce_dhidden on CUDA needs a compact f32 dhidden");
    }
    if (lay->comm_size > 1)
        SPH_CHECK(p->comm->device_buffers, SPH_ERR_UNSUPPORTED,
                  "tp_comm: a CUDA context needs a communicator on device buffers (NCCL); "
                  "this one (backend %d) works on host buffers", (int)p->comm->backend);
    SPH_CHECK(bytes >= lay->total, SPH_ERR_WORKSPACE,
              "workspace: %zu bytes, expected at least %zu (sph_head_workspace_size)", bytes,
              lay->total);
    SPH_CHECK(ws != NULL, SPH_ERR_WORKSPACE, "workspace: NULL, expected %zu bytes", lay->total);
    SPH_TRY(need_device(ws, "workspace"));
    SPH_CHECK(((uintptr_t)ws % SPH_WS_ALIGN) == 0, SPH_ERR_WORKSPACE,
              "workspace: pointer %p is misaligned, expected %d-byte alignment", ws,
              SPH_WS_ALIGN);
    return SPH_OK;
}

// ---- host: pieces of a pass ------------------------------------------------------------------

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
} pass_ctx;

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

/* The chunk's hidden rows as a matrix (pointer, row stride): in place for a row range, else
 * gathered into hg (once per chunk). */
static sph_status chunk_h(pass_ctx *c, const chunk *ch, const char **hp, int64_t *ld) {
    const sph_head_plan *p = c->p;
    if (!ch->rowmap) {
        *hp = (const char *)p->hidden + (size_t)ch->r0 * p->ld_h * c->es;
        *ld = p->ld_h;
        return SPH_OK;
    }
    char *hg = c->ws + c->lay->off_hg;
    if (c->gathered_k0 != ch->k0) {
        size_t row_bytes = (size_t)p->H * c->es, ld_bytes = (size_t)p->ld_h * c->es;
        int vec16 = ((uintptr_t)p->hidden % 16 == 0) && (ld_bytes % 16 == 0) &&
                    (row_bytes % 16 == 0);
        head_gather_kernel<<<(unsigned)ch->rows, 128, 0, c->stream>>>(
            (const char *)p->hidden, (int64_t)ld_bytes, ch->rowmap, hg, (int64_t)row_bytes,
            vec16);
        SPH_LAUNCH_CHECK("head_gather_kernel", c->stream);
        c->gathered_k0 = ch->k0;
    }
    *hp = hg;
    *ld = p->H;
    return SPH_OK;
}

/* L (rows, w) = hp (rows, H; row stride ld) . W[c0:c0+w]^T, fp32, row stride ldL. */
static sph_status gemm_logits(pass_ctx *c, const char *hp, int64_t ld, int64_t rows, int64_t c0,
                              int64_t w, float *L) {
    const sph_head_plan *p = c->p;
    const char *wp = (const char *)p->weight + (size_t)c0 * p->ld_w * c->es;
    if (c->lay->bi) {
        /* sm_90a wgmma kernel or the mma.sync one: decided from the user's tensors, never
         * the chunk, so a row gets the same kernel (and bits) in every batch */
        if (sph_cuda_logits_sm90_usable(p->dtype, p->hidden, p->ld_h, p->weight, p->ld_w, p->H))
            return sph_cuda_logits_sm90(p->dtype, hp, ld, wp, p->ld_w, L, c->lay->ldL, rows, w,
                                        p->H, c->stream);
        return sph_cuda_logits_fixed(p->dtype, hp, ld, wp, p->ld_w, L, c->lay->ldL, rows, w,
                                     p->H, c->stream);
    }
    const float one = 1.f, zero = 0.f;
    cudaDataType_t t = dt_cuda(c->dk);
    SPH_CUBLAS_RET(cublasGemmEx(c->st->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w, (int)rows,
                                (int)p->H, &one, wp, t, (int)p->ld_w, hp, t, (int)ld, &zero, L,
                                CUDA_R_32F, (int)c->lay->ldL, compute_type(c),
                                CUBLAS_GEMM_DEFAULT));
    return SPH_OK;
}

static sph_status launch_stats(pass_ctx *c, const float *L, const chunk *ch, int64_t c0,
                               int64_t w, int merge) {
    const sph_head_plan *p = c->p;
    float inv_t = (float)(1.0 / p->temperature), cap = (float)p->softcap;
    float inv_cap = cap > 0.f ? (float)(1.0 / p->softcap) : 0.f;
    float *recs = (float *)(c->ws + c->lay->off_part) + ch->k0 * SPH_PARTIAL_FIELDS;
    head_stats_kernel<<<(unsigned)ch->rows, STATS_THREADS, 0, c->stream>>>(
        L, c->lay->ldL, ch->r0, ch->rowmap, w, p->v0 + c0, p->targets, p->tgt_i64, inv_t, cap,
        inv_cap, recs, merge);
    SPH_LAUNCH_CHECK("head_stats_kernel", c->stream);
    return SPH_OK;
}

/* Finalize rows [0, rows) whose records start at rec0 (rank r's at rec0 + r * rank_stride);
 * row k is global row rowmap[k] or r0 + k. */
static sph_status finalize_rows(const sph_head_plan *p, const float *rec0, int64_t rank_stride,
                                int64_t comm_size, int64_t r0, const int64_t *rowmap,
                                int64_t rows, cudaStream_t stream) {
    if (rows <= 0) return SPH_OK;
    unsigned blocks = (unsigned)((rows + 255) / 256);
    head_finalize_kernel<<<blocks, 256, 0, stream>>>(
        rec0, rank_stride, (int)comm_size, r0, rowmap, rows, p->mask, p->targets, p->tgt_i64,
        p->V, p->K > 0, p->logprob, p->entropy, p->lse, p->logit_mean, p->stats);
    SPH_LAUNCH_CHECK("head_finalize_kernel", stream);
    return SPH_OK;
}

sph_status sph_cuda_finalize(const sph_head_plan *p, const float *recv, int64_t rank_stride,
                             int64_t comm_size, int64_t r0, int64_t rows, int64_t recv_row0,
                             cudaStream_t stream) {
    return finalize_rows(p, recv + recv_row0 * SPH_PARTIAL_FIELDS, rank_stride, comm_size, r0,
                         NULL, rows, stream);
}

sph_status sph_cuda_zero_rows_out(const sph_head_plan *p, cudaStream_t stream) {
    if (p->N <= 0) return SPH_OK;
    head_zero_out_kernel<<<(unsigned)((p->N + 255) / 256), 256, 0, stream>>>(
        p->N, p->logprob, p->entropy, p->lse, p->logit_mean, p->stats);
    SPH_LAUNCH_CHECK("head_zero_out_kernel", stream);
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

static sph_status launch_dlogits(pass_ctx *c, const float *L, void *D, const chunk *ch,
                                 int64_t c0, int64_t w) {
    const sph_head_plan *p = c->p;
    dl_args a;
    a.L = L;
    a.ldL = c->lay->ldL;
    a.r0 = ch->r0;
    a.rowmap = ch->rowmap;
    a.w = w;
    a.col_g0 = p->v0 + c0;
    a.stats = p->stats;
    a.g = p->dlogprob;
    a.e = p->dentropy;
    a.gl = p->dlse;
    a.gm = p->dlogit_mean;
    a.mask = p->mask;
    a.tgt = p->targets;
    a.tgt_i64 = p->tgt_i64;
    a.inv_t = (float)(1.0 / p->temperature);
    a.cap = (float)p->softcap;
    a.inv_cap = p->softcap > 0 ? (float)(1.0 / p->softcap) : 0.f;
    a.inv_V = (float)(1.0 / (double)p->V);
    int64_t n4 = (w + 3) / 4;
    int64_t bx = (n4 + 255) / 256;
    if (bx > 64) bx = 64;
    dim3 grid((unsigned)bx, (unsigned)ch->rows);
    if (c->dk == DT_F32)
        head_dlogits_kernel<float><<<grid, 256, 0, c->stream>>>(a, (float *)D);
    else if (c->dk == DT_BF16)
        head_dlogits_kernel<__nv_bfloat16><<<grid, 256, 0, c->stream>>>(a, (__nv_bfloat16 *)D);
    else
        head_dlogits_kernel<__half><<<grid, 256, 0, c->stream>>>(a, (__half *)D);
    SPH_LAUNCH_CHECK("head_dlogits_kernel", c->stream);
    return SPH_OK;
}

/* The sm_90a epilogue arguments shared by the statistics and dlogits variants. */
static sph_sm90_epi fused_args(const pass_ctx *c, const chunk *ch, int64_t c0, int mode) {
    const sph_head_plan *p = c->p;
    sph_sm90_epi e;
    memset(&e, 0, sizeof e);
    e.mode = mode;
    e.r0 = ch->r0;
    e.rowmap = ch->rowmap;
    e.col_g0 = p->v0 + c0;
    e.tgt = p->targets;
    e.tgt_i64 = p->tgt_i64;
    e.inv_t = (float)(1.0 / p->temperature);
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
    const int with_e = c->lay->onepass_e;
    sph_sm90_epi e =
        fused_args(c, ch, c0, with_e ? SPH_SM90_EPI_STATS | SPH_SM90_EPI_E : SPH_SM90_EPI_STATS);
    float *T = (float *)(c->ws + c->lay->off_T);
    e.tile_recs = T;
    if (with_e) {
        /* staged E of the chunk (whole-shard rows) where its D will be */
        e.E = c->ws + c->lay->off_D;
        e.ldE = c->lay->ldL;
        e.store16 = c->lay->store16;
    }
    const char *wp = (const char *)p->weight + (size_t)c0 * p->ld_w * c->es;
    SPH_TRY(sph_cuda_head_sm90(p->dtype, hp, ld, wp, p->ld_w, ch->rows, w, p->H, &e, c->stream));
    float *recs = (float *)(c->ws + c->lay->off_part) + ch->k0 * SPH_PARTIAL_FIELDS;
    return sph_cuda_sm90_reduce_tiles(T, (w + SPH_SM90_TILE_N - 1) / SPH_SM90_TILE_N, ch->rows,
                                      recs, merge, c->stream);
}

/* Staged E: the chunk's D in place of its E, once the chunk's rows are finalized (stats). */
static sph_status chunk_e2d(pass_ctx *c, const chunk *ch) {
    const sph_head_plan *p = c->p;
    sph_e2d_args a;
    memset(&a, 0, sizeof a);
    a.E = c->ws + c->lay->off_D;
    a.ldE = c->lay->ldL;
    a.dtype_bf16 = c->dk == DT_BF16;
    a.tile_recs = (const float *)(c->ws + c->lay->off_T);
    a.n_tiles = c->lay->n_tiles;
    a.rows = ch->rows;
    a.w = p->V_loc;
    a.r0 = ch->r0;
    a.rowmap = ch->rowmap;
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
    a.inv_V = (float)(1.0 / (double)p->V);
    return sph_cuda_e2d(&a, c->stream);
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

static sph_status launch_convert(int kind, void *dst, int64_t ld_dst, const float *src,
                                 int64_t ld_src, int64_t rows, int64_t cols, int acc,
                                 cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return SPH_OK;
    int64_t n = rows * cols, blocks = (n + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    if (kind == DT_BF16)
        head_convert_kernel<__nv_bfloat16><<<(unsigned)blocks, 256, 0, stream>>>(
            (__nv_bfloat16 *)dst, ld_dst, src, ld_src, rows, cols, acc);
    else if (kind == DT_F16)
        head_convert_kernel<__half><<<(unsigned)blocks, 256, 0, stream>>>(
            (__half *)dst, ld_dst, src, ld_src, rows, cols, acc);
    else
        head_convert_kernel<float><<<(unsigned)blocks, 256, 0, stream>>>(
            (float *)dst, ld_dst, src, ld_src, rows, cols, acc);
    SPH_LAUNCH_CHECK("head_convert_kernel", stream);
    return SPH_OK;
}

static sph_status launch_scatter(pass_ctx *c, const chunk *ch, const float *dhg) {
    const sph_head_plan *p = c->p;
    int kind = dt_kind(p->dh_dtype);
    unsigned rows = (unsigned)ch->rows;
    if (kind == DT_BF16)
        head_scatter_kernel<__nv_bfloat16><<<rows, 256, 0, c->stream>>>(
            (__nv_bfloat16 *)p->dhidden, p->ld_dh, dhg, ch->rowmap, p->H, p->acc_dh);
    else if (kind == DT_F16)
        head_scatter_kernel<__half><<<rows, 256, 0, c->stream>>>(
            (__half *)p->dhidden, p->ld_dh, dhg, ch->rowmap, p->H, p->acc_dh);
    else
        head_scatter_kernel<float><<<rows, 256, 0, c->stream>>>(
            (float *)p->dhidden, p->ld_dh, dhg, ch->rowmap, p->H, p->acc_dh);
    SPH_LAUNCH_CHECK("head_scatter_kernel", c->stream);
    return SPH_OK;
}

/* Where a gradient product goes: C (column-major, leading dimension ldc, type ct), scaled
 * old value beta (0 overwrites). */
typedef struct gemm_out {
    void *C;
    int ldc;
    cudaDataType_t ct;
    float beta;
} gemm_out;

/* Where a chunk's dlogits come from (grad_chunk, chunk_dlogits). */
enum { D_RECOMPUTE = 0, D_FROM_L = 1, D_READY = 2 };

/* D (rows, w) of a chunk and split: from the logits kept in L (D_FROM_L), already in place
 * (D_READY: staged E turned into D), recomputed by the fused kernel, or recomputed by cuBLAS
 * into L and turned into D. */
static sph_status chunk_dlogits(pass_ctx *c, const chunk *ch, const char *hp, int64_t ld,
                                int64_t c0, int64_t w, float *L, void *D, int src) {
    if (src == D_READY) return SPH_OK;
    if (src == D_FROM_L) return launch_dlogits(c, L, D, ch, c0, w);
    if (c->lay->fused) return fused_dlogits(c, hp, ld, ch, c0, w, D);
    SPH_TRY(gemm_logits(c, hp, ld, ch->rows, c0, w, L));
    return launch_dlogits(c, L, D, ch, c0, w);
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
    return SPH_OK;
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
    SPH_TRY(chunk_h(c, ch, &hp, &ld));
    const int64_t rows = ch->rows;
    for (int64_t s = 0; s < lay->n_splits; s++) {
        int64_t c0 = s * lay->Vs, w = p->V_loc - c0 < lay->Vs ? p->V_loc - c0 : lay->Vs;
        SPH_TRY(chunk_dlogits(c, ch, hp, ld, c0, w, L, D, src));
        const char *wp = (const char *)p->weight + (size_t)c0 * p->ld_w * c->es;
        if (p->dhidden) {
            const gemm_out o = dh_via32 ? acc32(dh32, p->H, s > 0)
                                        : user_dh(c, ch->r0, s > 0 || p->acc_dh);
            SPH_TRY(gemm_dh(c, wp, rows, w, D, &o));
        }
        if (p->dweight) {
            /* the fp32 accumulator holds the whole shard: zeroed by grad_prologue */
            const gemm_out o = lay->dw32 ? acc32(dw32 + (size_t)c0 * p->H, p->H, 1)
                                         : user_dw(c, c0, ci > 0 || p->acc_dw);
            SPH_TRY(gemm_dw(c, hp, ld, rows, w, D, &o));
        }
    }
    const int dhk = p->dhidden ? dt_kind(p->dh_dtype) : DT_F32;
    if (p->dhidden && lay->gather) SPH_TRY(launch_scatter(c, ch, dh32));
    else if (p->dhidden && lay->dh32)
        SPH_TRY(launch_convert(dhk, (char *)p->dhidden + (size_t)ch->r0 * p->ld_dh * dt_size(dhk),
                               p->ld_dh, dh32, p->H, rows, p->H, p->acc_dh, c->stream));
    return SPH_OK;
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
            SPH_TRY(chunk_h(c, &ch, &hp, &ld));
            SPH_TRY(chunk_dlogits(c, &ch, hp, ld, c0, w, L, D, 0));
            if (p->dhidden) {
                const gemm_out o =
                    lay->dh32 ? acc32(dh_all + (size_t)(ch.k0 - base) * p->H, p->H, s > 0)
                              : user_dh(c, ch.r0, s > 0 || p->acc_dh);
                SPH_TRY(gemm_dh(c, wp, ch.rows, w, D, &o));
            }
            if (p->dweight) {
                const gemm_out o = lay->dw32 ? acc32(dw_s, p->H, ci > 0)
                                             : user_dw(c, c0, ci > 0 || p->acc_dw);
                SPH_TRY(gemm_dw(c, hp, ld, ch.rows, w, D, &o));
            }
            ci++;
        }
        if (p->dweight && lay->dw32)
            SPH_TRY(launch_convert(dwk, (char *)p->dweight + (size_t)c0 * p->ld_dw * dt_size(dwk),
                                   p->ld_dw, dw_s, p->H, w, p->H, p->acc_dw, c->stream));
    }
    if (!p->dhidden || !lay->dh32 || lay->M == 0) return SPH_OK;
    if (lay->gather) {
        chunk all;
        all.r0 = all.k0 = 0;
        all.rows = lay->M;
        all.rowmap = (const int64_t *)(c->ws + lay->off_act);
        return launch_scatter(c, &all, dh_all);
    }
    return launch_convert(dhk, (char *)p->dhidden + (size_t)base * p->ld_dh * dt_size(dhk),
                          p->ld_dh, dh_all, p->H, lay->M, p->H, p->acc_dh, c->stream);
}

/* The gradient sweep of a pass whose row statistics are known for every row. */
static sph_status grad_sweep(pass_ctx *c) {
    if (c->lay->col_outer) return grad_cols(c);
    chunk ch;
    int64_t ci = 0;
    chunks_reset(c);
    while (chunk_next(c, &ch)) SPH_TRY(grad_chunk(c, &ch, ci++, 0));
    return SPH_OK;
}

/* Before a gradient sweep: dH rows outside every span to 0 (unless accumulating), the fp32
 * dW accumulator to 0, and dW itself to 0 when no chunk will overwrite it. */
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
    if (p->dweight && lay->dw32 && !lay->col_outer)
        SPH_CUDA_RET(cudaMemsetAsync(c->ws + lay->off_dw32, 0,
                                     (size_t)p->V_loc * p->H * sizeof(float), c->stream));
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
        SPH_TRY(launch_convert(dt_kind(p->dw_dtype), p->dweight, p->ld_dw,
                               (const float *)(c->ws + lay->off_dw32), p->H, p->V_loc, p->H,
                               p->acc_dw, c->stream));
    if (p->dhidden && p->allreduce_dh && lay->comm_size > 1)
        SPH_TRY(p->comm->ops->allreduce_sum_f32(p->comm, (float *)p->dhidden,
                                                (size_t)p->N * p->H, c->stream));
    return SPH_OK;
}

/* Gathered mode: the global row of every position of the row space, span by span, with the
 * span list passed by value (ACT_BATCH spans per launch: no host-to-device copy, so the pass
 * stays capturable). */
static sph_status build_act_rows(pass_ctx *c) {
    const sph_head_plan *p = c->p;
    int64_t *act = (int64_t *)(c->ws + c->lay->off_act), base = 0;
    for (int64_t k0 = 0; k0 < p->n_spans; k0 += ACT_BATCH) {
        span_batch sb;
        memset(&sb, 0, sizeof sb);
        sb.base = base;
        sb.prefix[0] = 0;
        for (int64_t k = k0; k < p->n_spans && sb.n < ACT_BATCH; k++, sb.n++) {
            sb.start[sb.n] = p->spans[2 * k];
            sb.prefix[sb.n + 1] = sb.prefix[sb.n] + (p->spans[2 * k + 1] - p->spans[2 * k]);
        }
        int64_t total = sb.prefix[sb.n];
        if (total > 0) {
            int64_t blocks = (total + 255) / 256;
            if (blocks > 1024) blocks = 1024;
            head_act_rows_kernel<<<(unsigned)blocks, 256, 0, c->stream>>>(sb, act);
            SPH_LAUNCH_CHECK("head_act_rows_kernel", c->stream);
        }
        base += total;
    }
    return SPH_OK;
}

static sph_status pass_begin(sph_ctx_t ctx, const sph_head_plan *p, sph_head_pass pass, void *ws,
                             size_t bytes, sph_cuda_layout *lay, pass_ctx *c) {
    SPH_CHECK(ctx && p, SPH_ERR_INVALID_ARG, "head (cuda): ctx or plan is NULL");
    SPH_CHECK(ctx->cuda != NULL, SPH_ERR_DEVICE, "ctx: not a CUDA context");
    SPH_TRY(sph_cuda_head_layout(ctx, p, pass, lay));
    SPH_TRY(check_device_plan(ctx, p, ws, bytes, lay));
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
    SPH_TRY(setup_cublas(c));
    if (lay->gather && p->N > 0) SPH_TRY(build_act_rows(c));
    return SPH_OK;
}

/* Ablation (SPH_CUDA_BWD_DENSE=1): the backward ignores the spans and computes every row, the
 * mask zeroing the inactive rows' dlogits: the dense baseline of the seed's same-run A/B of
 * dlogit-tile skipping, span-restricted dHidden and active-row dW (all three come from the
 * backward's row space being the active rows). Results are the same; only the cost differs. */
static const sph_head_plan *backward_plan(sph_ctx_t ctx, const sph_head_plan *p,
                                          sph_head_plan *tmp) {
    const sph_cuda_state *st = (const sph_cuda_state *)ctx->cuda;
    if (!st || !st->dense_bwd || p->K > 0 || !p->spans) return p;
    *tmp = *p;
    tmp->spans = NULL;
    tmp->n_spans = 0;
    return tmp;
}

// ---- entry points ----------------------------------------------------------------------------

extern "C" sph_status sph_head_cuda_workspace(sph_ctx_t ctx, sph_head_pass pass,
                                              const sph_head_plan *p, size_t *bytes) {
    SPH_CHECK(ctx && p && bytes, SPH_ERR_INVALID_ARG, "head (cuda): NULL argument");
    SPH_CHECK(ctx->cuda != NULL, SPH_ERR_DEVICE, "ctx: not a CUDA context");
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
    float *part = (float *)(c.ws + lay.off_part), *recv = (float *)(c.ws + lay.off_recv);
    if (p->K > 0) {
        SPH_TRY(sph_cuda_sample_forward(ctx, p, c.ws + lay.off_sample, part, recv,
                                        lay.comm_size));
        if (!p->one_pass) return SPH_OK;
        SPH_TRY(sph_cuda_sample_backward(ctx, p, c.ws + lay.off_sample, lay.sample_bytes));
        return grad_epilogue(&c); /* the TP all-reduce of dH */
    }
    float *L = (float *)(c.ws + lay.off_L);
    if (lay.comm_size > 1)
        SPH_CUDA_RET(cudaMemsetAsync(part, 0, (size_t)p->N * SPH_PARTIAL_FIELDS * 4, c.stream));
    if (p->one_pass) SPH_TRY(grad_prologue(&c));
    /* One-pass with staged chunks takes each chunk's gradients from its staged logits right
     * after the chunk's statistics. Otherwise every chunk's statistics, one combine and the
     * finalize; one-pass then runs the backward's gradient sweep (logits recomputed). */
    const int per_chunk = p->one_pass && lay.onepass_chunks;
    chunk ch;
    int64_t ci = 0;
    chunks_reset(&c);
    while (chunk_next(&c, &ch)) {
        const char *hp;
        int64_t ld;
        SPH_TRY(chunk_h(&c, &ch, &hp, &ld));
        for (int64_t s = 0; s < lay.n_splits; s++) {
            int64_t c0 = s * lay.Vs, w = p->V_loc - c0 < lay.Vs ? p->V_loc - c0 : lay.Vs;
            if (lay.fused) {
                SPH_TRY(fused_stats(&c, hp, ld, &ch, c0, w, s > 0));
            } else {
                SPH_TRY(gemm_logits(&c, hp, ld, ch.rows, c0, w, L));
                SPH_TRY(launch_stats(&c, L, &ch, c0, w, s > 0));
            }
        }
        if (per_chunk) {
            /* per-chunk combine, then gradients from the logits still in L when the
             * vocabulary is not split (otherwise recomputed split by split) */
            const float *recs;
            SPH_TRY(sph_cuda_combine(ctx, p, part + ch.k0 * SPH_PARTIAL_FIELDS, recv, ch.rows,
                                     lay.comm_size, &recs));
            SPH_TRY(finalize_rows(p, recs, ch.rows * SPH_PARTIAL_FIELDS, lay.comm_size, ch.r0,
                                  ch.rowmap, ch.rows, c.stream));
            if (lay.onepass_e) {
                SPH_TRY(chunk_e2d(&c, &ch));
                SPH_TRY(grad_chunk(&c, &ch, ci, D_READY));
            } else {
                SPH_TRY(grad_chunk(&c, &ch, ci, lay.n_splits == 1 ? D_FROM_L : D_RECOMPUTE));
            }
        }
        ci++;
    }
    if (per_chunk) return grad_epilogue(&c);
    const float *recs;
    SPH_TRY(sph_cuda_combine(ctx, p, part, recv, p->N, lay.comm_size, &recs));
    const int64_t stride = p->N * SPH_PARTIAL_FIELDS;
    if (lay.gather) {
        SPH_TRY(finalize_rows(p, recs, stride, lay.comm_size, 0,
                              (const int64_t *)(c.ws + lay.off_act), lay.M, c.stream));
    } else {
        for (int64_t k = 0; k < spans_count(p); k++) {
            int64_t a, b;
            spans_get(p, k, &a, &b);
            SPH_TRY(finalize_rows(p, recs + a * SPH_PARTIAL_FIELDS, stride, lay.comm_size, a,
                                  NULL, b - a, c.stream));
        }
    }
    if (!p->one_pass) return SPH_OK;
    SPH_TRY(grad_sweep(&c));
    return grad_epilogue(&c);
}

extern "C" sph_status sph_head_cuda_backward(sph_ctx_t ctx, const sph_head_plan *p_user,
                                             void *ws, size_t bytes) {
    sph_cuda_layout lay;
    pass_ctx c;
    sph_head_plan tmp;
    const sph_head_plan *p = ctx ? backward_plan(ctx, p_user, &tmp) : p_user;
    SPH_TRY(pass_begin(ctx, p, SPH_HEAD_BACKWARD, ws, bytes, &lay, &c));
    if (p->K > 0) {
        if (p->N == 0) return grad_prologue(&c);
        SPH_TRY(sph_cuda_sample_backward(ctx, p, c.ws + lay.off_sample, lay.sample_bytes));
        return grad_epilogue(&c);
    }
    SPH_TRY(grad_prologue(&c));
    SPH_TRY(grad_sweep(&c));
    return grad_epilogue(&c);
}
