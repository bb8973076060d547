/*
 * head_kernels.cu - the elementwise kernels of the CUDA LM head and their launchers: row
 * statistics of staged logits (the online max/sum-exp record of head/plan.h), the TP finalize
 * (records of the ranks merged in rank order into the per-row outputs and stats), dlogits,
 * fp32-accumulator conversion, the gathered-chunk row copies (h in, dH out) and the row map
 * of the gathered row space. The products around them and the order of a pass are head.cu's;
 * where the buffers live is head_layout.cu's.
 *
 * Numerics: each statistics thread owns a fixed column stride and the block reduces in a fixed
 * order, so a row's record depends on its logits only (deterministic, and batch-invariant
 * given a fixed split width). Half-precision outputs are rounded once, from fp32.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/head.cuh"
#include "cuda/head_math.cuh"

// ---- kernels: row statistics ---------------------------------------------------------------

#define STATS_THREADS 256

/* One block per row of the chunk. Each thread owns columns q*4.. (q = tid, tid + 256, ...),
 * then a fixed-order tree over warps: the result depends on the row's logits and w only. */
__global__ void __launch_bounds__(STATS_THREADS)
    head_stats_kernel(const float *__restrict__ L, int64_t ldL, int64_t r0,
                      const int64_t *__restrict__ rowmap, int64_t w, int64_t col_g0,
                      const void *__restrict__ tgt, int tgt_i64, float inv_t_all,
                      const float *__restrict__ trows, float cap, float inv_cap,
                      float *__restrict__ recs, int merge) {
    /* chunk row r is global row rowmap[r] (gathered chunks) or r0 + r; its record is
     * recs[r] (the chunk's slice of the pass's records) */
    const int64_t r = blockIdx.x, i = rowmap ? rowmap[r] : r0 + r;
    const float inv_t = row_inv_t(trows, i, inv_t_all); /* the row's 1 / T, once */
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

/* Combines the ranks' records in rank order and writes the per-row outputs and stats. An
 * active row whose statistics are not finite is counted in nf (nf[0] += 1, nf[1] = min row):
 * the non-finite policy's device flag, read by sph_ctx_nonfinite (integer atomics: the count
 * does not depend on the order). */
__global__ void head_finalize_kernel(const float *__restrict__ recv, int64_t rank_stride,
                                     int comm_size, int64_t r0, const int64_t *rowmap,
                                     int64_t rows, const uint8_t *__restrict__ mask, const void *tgt,
                                     int tgt_i64, int64_t V, int sample, float *logprob,
                                     float *entropy, float *lse_out, float *logit_mean,
                                     float *stats, unsigned long long *nf) {
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
    /* Inactive rows, and support rows with no candidate in any shard, output zeros. A
     * full-vocabulary row always has columns, so an empty-looking record there means every
     * logit was NaN or -inf (fmaxf drops NaN from the maxima, merge3 skips m = -inf records):
     * non-finite, like a NaN sum of the logits (sz), not an empty row. */
    const bool empty = m == -INFINITY && s == 0.f;
    if (!active || (sample && empty)) {
        active = false;
        m = lse = mu = lp = sz = 0.f;
    } else if (nf && (empty || !(isfinite(m) && isfinite(lse) && isfinite(mu)) ||
                      (!sample && !isfinite(sz)))) {
        atomicAdd(&nf[0], 1ull);
        atomicMin(&nf[1], (unsigned long long)i);
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
    const float *trows; /* per-row temperatures or NULL (inv_t) */
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
    const float inv_t = row_inv_t(a.trows, i, a.inv_t);
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
            float z = (a.cap > 0.f ? a.cap * th : u[k]) * inv_t;
            float p = expf(z - lse);
            float dz = -g * p + e * p * (mu - z) + gl * p + gmV;
            if (q * 4 + k == tl) dz += g;
            float du = dz * inv_t;
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

/* The non-finite policy for per-row temperatures a backward reads from device memory: an
 * active row of the chunk whose T_i the host rule refuses (its gradients are NaN, row_inv_t)
 * is counted in nf like a non-finite statistic. */
__global__ void head_trows_check_kernel(const float *__restrict__ trows, int64_t r0,
                                        const int64_t *__restrict__ rowmap, int64_t rows,
                                        const uint8_t *__restrict__ mask,
                                        unsigned long long *nf) {
    const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= rows) return;
    const int64_t i = rowmap ? rowmap[k] : r0 + k;
    if ((mask && !mask[i]) || row_temp_ok(trows[i])) return;
    atomicAdd(&nf[0], 1ull);
    atomicMin(&nf[1], (unsigned long long)i);
}

// ---- launchers -----------------------------------------------------------------------------

sph_status sph_cuda_check_trows(const sph_head_plan *p, int64_t r0, const int64_t *rowmap,
                                int64_t rows, unsigned long long *nf, cudaStream_t stream) {
    if (!p->temp_rows || !nf || rows <= 0) return SPH_OK;
    head_trows_check_kernel<<<(unsigned)((rows + 255) / 256), 256, 0, stream>>>(
        p->temp_rows, r0, rowmap, rows, p->mask, nf);
    SPH_LAUNCH_CHECK("head_trows_check_kernel", stream);
    return SPH_OK;
}

/* The chunk's hidden rows as a matrix (pointer, row stride): in place for a row range, else
 * gathered into hg (once per chunk). */
sph_status sph_cuda_chunk_h(pass_ctx *c, const chunk *ch, const char **hp, int64_t *ld) {
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

sph_status sph_cuda_launch_stats(pass_ctx *c, const float *L, const chunk *ch, int64_t c0,
                                 int64_t w, int merge) {
    const sph_head_plan *p = c->p;
    float inv_t = (float)(1.0 / p->temperature), cap = (float)p->softcap;
    float inv_cap = cap > 0.f ? (float)(1.0 / p->softcap) : 0.f;
    float *recs = (float *)(c->ws + c->lay->off_part) + ch->k0 * SPH_PARTIAL_FIELDS;
    head_stats_kernel<<<(unsigned)ch->rows, STATS_THREADS, 0, c->stream>>>(
        L, c->lay->ldL, ch->r0, ch->rowmap, w, p->v0 + c0, p->targets, p->tgt_i64, inv_t,
        p->temp_rows, cap, inv_cap, recs, merge);
    SPH_LAUNCH_CHECK("head_stats_kernel", c->stream);
    return SPH_OK;
}

/* Finalize rows [0, rows) whose records start at rec0 (rank r's at rec0 + r * rank_stride);
 * row k is global row rowmap[k] or r0 + k. */
sph_status sph_cuda_finalize_rows(const sph_head_plan *p, const float *rec0, int64_t rank_stride,
                                  int64_t comm_size, int64_t r0, const int64_t *rowmap,
                                  int64_t rows, unsigned long long *nf, cudaStream_t stream) {
    if (rows <= 0) return SPH_OK;
    unsigned blocks = (unsigned)((rows + 255) / 256);
    head_finalize_kernel<<<blocks, 256, 0, stream>>>(
        rec0, rank_stride, (int)comm_size, r0, rowmap, rows, p->mask, p->targets, p->tgt_i64,
        p->V, p->K > 0, p->logprob, p->entropy, p->lse, p->logit_mean, p->stats, nf);
    SPH_LAUNCH_CHECK("head_finalize_kernel", stream);
    /* the plan's row hook (a loss): these rows' dlogprob / dentropy from their final
     * statistics, enqueued on the same stream (plan.h) */
    if (p->row_hook.device)
        SPH_TRY(p->row_hook.device(p->row_hook.arg, r0, rowmap, rows, stream));
    return SPH_OK;
}

sph_status sph_cuda_finalize(const sph_head_plan *p, const float *recv, int64_t rank_stride,
                             int64_t comm_size, int64_t r0, int64_t rows, int64_t recv_row0,
                             unsigned long long *nf, cudaStream_t stream) {
    return sph_cuda_finalize_rows(p, recv + recv_row0 * SPH_PARTIAL_FIELDS, rank_stride, comm_size,
                                  r0, NULL, rows, nf, stream);
}

sph_status sph_cuda_zero_rows_out(const sph_head_plan *p, cudaStream_t stream) {
    if (p->N <= 0) return SPH_OK;
    head_zero_out_kernel<<<(unsigned)((p->N + 255) / 256), 256, 0, stream>>>(
        p->N, p->logprob, p->entropy, p->lse, p->logit_mean, p->stats);
    SPH_LAUNCH_CHECK("head_zero_out_kernel", stream);
    return SPH_OK;
}

sph_status sph_cuda_launch_dlogits(pass_ctx *c, const float *L, void *D, const chunk *ch,
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
    a.trows = p->temp_rows;
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

sph_status sph_cuda_launch_convert(int kind, void *dst, int64_t ld_dst, const float *src,
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

sph_status sph_cuda_launch_scatter(pass_ctx *c, const chunk *ch, const float *dhg) {
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

/* Gathered mode: the global row of every position of the row space, span by span, with the
 * span list passed by value (ACT_BATCH spans per launch: no host-to-device copy, so the pass
 * stays capturable). */
sph_status sph_cuda_build_act_rows(pass_ctx *c) {
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
