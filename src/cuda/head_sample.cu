/*
 * head_sample.cu - sample-support mode on CUDA: each row's softmax runs over its K candidate
 * ids (global, -1 padded) only; a rank handles the candidates inside its shard
 * [v0, v0 + V_loc). Only K weight rows per token are read, never the whole vocabulary.
 *
 *   forward : z_ik = transform(h_i . w_{c_ik}) by one warp per candidate (lanes over H,
 *             shuffle tree: a fixed order), then the row's partial record (head/plan.h) by one
 *             thread in candidate order, the TP combine and head.cu's finalize; with sum_p2
 *             the same thread's (m, q = sum_k e^(2 (z_k - m))) of the row, which head.cu
 *             hands to head_extras.cu's combine and finalize (Q / S^2 over the support).
 *   backward: du_ik = dz_ik / T * cap', dz = g (delta - q) + e q (mu - z) + gl q;
 *             dH_i = sum_k du_ik w_{c_ik} (k ascending), and dW by a deterministic scatter:
 *             (local id, i*K + k) pairs are radix-sorted by id (CUB, stable, so row order is
 *             kept), then one block per distinct id sums du * h over its run in that order.
 * No floating-point atomics anywhere: results are bitwise reproducible.
 */
#include <cub/device/device_radix_sort.cuh>

#include "comm/comm.h"
#include "cuda/head.cuh"
#include "cuda/head_math.cuh"

#define SAMPLE_THREADS 256

static int kind_of(sph_dtype d) {
    if (d.code == SPH_DTYPE_BFLOAT) return 1;
    if (d.code == SPH_DTYPE_FLOAT && d.bits == 16) return 2;
    return 0;
}

__device__ __forceinline__ int64_t load_cand(const void *c, int i64, int64_t k) {
    return i64 ? ((const int64_t *)c)[k] : (int64_t)((const int32_t *)c)[k];
}

/* u = h_i . w_c by one warp, lanes striding H; result in every lane. */
__device__ __forceinline__ float warp_dot(const void *h, const void *w, int kind, int64_t H,
                                          int lane) {
    float acc = 0.f;
    for (int64_t j = lane; j < H; j += 32) acc += load_kind(h, kind, j) * load_kind(w, kind, j);
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return acc;
}

struct sample_args {
    const void *h, *w;
    int64_t ld_h, ld_w, H, K, ld_c, v0, V_loc, r0;
    int kind;
    const void *cand;
    int cand_i64;
    const void *tgt;
    int tgt_i64;
    const uint8_t *mask;
    const float *trows; /* per-row temperatures or NULL (inv_t) */
    float inv_t, cap, inv_cap;
};

/* Shared layout per row: z[K] floats, th[K] floats, local ids[K] int64 (-1 = not ours). */
__device__ __forceinline__ void sample_logits(const sample_args &a, int64_t i, bool active,
                                              float *z, float *th, int64_t *loc) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const char *hrow = (const char *)a.h + (size_t)i * a.ld_h * (a.kind ? 2 : 4);
    const float it = row_inv_t(a.trows, i, a.inv_t);
    for (int64_t k = warp; k < a.K; k += SAMPLE_THREADS / 32) {
        int64_t c = load_cand(a.cand, a.cand_i64, i * a.ld_c + k), l = c - a.v0;
        bool mine = active && c >= 0 && l >= 0 && l < a.V_loc;
        if (!mine) {
            if (lane == 0) loc[k] = -1, z[k] = 0.f, th[k] = 0.f;
            continue;
        }
        const char *wrow = (const char *)a.w + (size_t)l * a.ld_w * (a.kind ? 2 : 4);
        float u = warp_dot(hrow, wrow, a.kind, a.H, lane);
        if (lane == 0) {
            float t = a.cap > 0.f ? tanhf(u * a.inv_cap) : 0.f;
            loc[k] = l;
            th[k] = t;
            z[k] = (a.cap > 0.f ? a.cap * t : u) * it;
        }
    }
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
    head_sample_fwd_kernel(sample_args a, float *part, float2 *mq) {
    extern __shared__ __align__(16) unsigned char smem[];
    int64_t *loc = (int64_t *)smem;
    float *z = (float *)(loc + a.K), *th = z + a.K;
    const int64_t i = a.r0 + blockIdx.x;
    bool active = !a.mask || a.mask[i];
    sample_logits(a, i, active, z, th, loc);
    __syncthreads(); /* every candidate's logit in shared memory */
    if (threadIdx.x != 0) return;
    float m = -INFINITY, s = 0.f, b = 0.f, sz = 0.f, zt = 0.f;
    int64_t t = load_target(a.tgt, a.tgt_i64, i), tl = t - a.v0;
    for (int64_t k = 0; k < a.K; k++) {
        if (loc[k] < 0) continue;
        stats_update(z[k], m, s, b, sz);
        if (t >= 0 && loc[k] == tl) zt = z[k];
    }
    float *rec = part + i * SPH_PARTIAL_FIELDS;
    rec[0] = m, rec[1] = s, rec[2] = b, rec[3] = zt, rec[4] = 0.f;
    if (!mq) return;
    /* sum_p2's (m, q = sum e^(2 (z - m))) over the same candidates, with the final m (no
     * rescaling); an empty row stays (-inf, 0), a NaN logit makes q NaN */
    float q = 0.f;
    for (int64_t k = 0; k < a.K; k++)
        if (loc[k] >= 0) q += expf(2.f * (z[k] - m));
    mq[i] = make_float2(m, q);
}

struct sample_bwd_args {
    const float *stats, *g, *e, *gl;
    void *dh;
    int64_t ld_dh;
    int dh_kind, acc_dh;
    float *du;         /* (N, K) */
    int32_t *keys;     /* (N, K) local id or V_loc (none) */
};

__global__ void __launch_bounds__(SAMPLE_THREADS)
    head_sample_bwd_kernel(sample_args a, sample_bwd_args o) {
    extern __shared__ __align__(16) unsigned char smem[];
    int64_t *loc = (int64_t *)smem;
    float *z = (float *)(loc + a.K), *th = z + a.K, *du = th + a.K;
    const int64_t i = a.r0 + blockIdx.x;
    bool active = !a.mask || a.mask[i];
    sample_logits(a, i, active, z, th, loc);
    __syncthreads(); /* logits ready */
    float lse = o.stats[i * 3 + 1], mu = o.stats[i * 3 + 2];
    float g = o.g ? o.g[i] : 0.f, e = o.e ? o.e[i] : 0.f, gl = o.gl ? o.gl[i] : 0.f;
    int64_t t = load_target(a.tgt, a.tgt_i64, i), tl = t - a.v0;
    if (t < 0) g = 0.f;
    const float it = row_inv_t(a.trows, i, a.inv_t);
    for (int64_t k = threadIdx.x; k < a.K; k += SAMPLE_THREADS) {
        float d = 0.f;
        if (loc[k] >= 0) {
            float q = expf(z[k] - lse);
            float dz = -g * q + e * q * (mu - z[k]) + gl * q;
            if (loc[k] == tl) dz += g;
            d = dz * it;
            if (a.cap > 0.f) d *= 1.f - th[k] * th[k];
        }
        du[k] = d;
        o.du[i * a.K + k] = d;
        o.keys[i * a.K + k] = loc[k] >= 0 ? (int32_t)loc[k] : (int32_t)a.V_loc;
    }
    __syncthreads(); /* du complete */
    if (!o.dh) return;
    const size_t wes = a.kind ? 2 : 4;
    for (int64_t j = threadIdx.x; j < a.H; j += SAMPLE_THREADS) {
        float acc = 0.f;
        for (int64_t k = 0; k < a.K; k++) {
            if (loc[k] < 0) continue;
            const char *wrow = (const char *)a.w + (size_t)loc[k] * a.ld_w * wes;
            acc += du[k] * load_kind(wrow, a.kind, j);
        }
        store_kind(o.dh, o.dh_kind, i * o.ld_dh + j, acc, o.acc_dh);
    }
}

/* keys to "none", values to their own index: rows outside the spans stay out of the scatter. */
__global__ void head_sample_init_kernel(int32_t *keys, int32_t *vals, int64_t n, int32_t none) {
    int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    keys[k] = none;
    vals[k] = (int32_t)k;
}

/* One block per sorted position; the first position of each id's run sums that run in order
 * (row-major pair index order, kept by the stable sort) and adds it to dW[id]. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
    head_sample_dw_kernel(const int32_t *keys, const int32_t *vals, const float *du, int64_t n,
                          int32_t none, int64_t K, const void *h, int64_t ld_h, int kind,
                          int64_t H, void *dw, int64_t ld_dw, int dw_kind) {
    int64_t p = blockIdx.x;
    int32_t key = keys[p];
    if (key == none || (p > 0 && keys[p - 1] == key)) return;
    const size_t hes = kind ? 2 : 4;
    for (int64_t j = threadIdx.x; j < H; j += SAMPLE_THREADS) {
        float acc = 0.f;
        for (int64_t q = p; q < n && keys[q] == key; q++) {
            int64_t pk = vals[q], row = pk / K;
            const char *hrow = (const char *)h + (size_t)row * ld_h * hes;
            acc += du[pk] * load_kind(hrow, kind, j);
        }
        store_kind(dw, dw_kind, (int64_t)key * ld_dw + j, acc, 1);
    }
}

static sample_args make_args(const sph_head_plan *p) {
    sample_args a;
    a.h = p->hidden;
    a.w = p->weight;
    a.ld_h = p->ld_h;
    a.ld_w = p->ld_w;
    a.H = p->H;
    a.K = p->K;
    a.ld_c = p->ld_c;
    a.v0 = p->v0;
    a.V_loc = p->V_loc;
    a.r0 = 0;
    a.kind = kind_of(p->dtype);
    a.cand = p->cand;
    a.cand_i64 = p->cand_i64;
    a.tgt = p->targets;
    a.tgt_i64 = p->tgt_i64;
    a.mask = p->mask;
    a.trows = p->temp_rows;
    a.inv_t = (float)(1.0 / p->temperature);
    a.cap = (float)p->softcap;
    a.inv_cap = p->softcap > 0 ? (float)(1.0 / p->softcap) : 0.f;
    return a;
}

static int key_bits(int64_t V_loc) {
    int b = 1;
    while (b < 31 && ((int64_t)1 << b) <= V_loc) b++;
    return b;
}

static size_t cub_temp_bytes(int64_t n, int64_t V_loc) {
    size_t t = 0;
    cub::DeviceRadixSort::SortPairs(NULL, t, (const int32_t *)NULL, (int32_t *)NULL,
                                    (const int32_t *)NULL, (int32_t *)NULL, (int)n, 0,
                                    key_bits(V_loc));
    return t;
}

/* Backward scratch: du (n floats), keys/vals in and out (4 x n int32), CUB's temporary. */
size_t sph_cuda_sample_ws(const sph_head_plan *p, int grads) {
    if (!grads || (!p->dweight && !p->dhidden)) return 0;
    int64_t n = p->N * p->K;
    size_t b = sph_ws_round((size_t)n * 4) * 5;
    b += sph_ws_round(cub_temp_bytes(n, p->V_loc));
    return b;
}

static size_t smem_bytes(int64_t K, int bwd) { return (size_t)K * (8 + 4 + 4 + (bwd ? 4 : 0)); }

/* The limits of this path (validation calls it through the CUDA head's check slot). */
sph_status sph_cuda_sample_check(const sph_head_plan *p) {
    SPH_CHECK(smem_bytes(p->K, 1) <= 48 * 1024, SPH_ERR_UNSUPPORTED,
              "candidates: K = %lld, the CUDA sample path supports K <= %d", (long long)p->K,
              48 * 1024 / 20);
    SPH_CHECK(p->N * p->K <= INT32_MAX, SPH_ERR_OVERFLOW,
              "candidates: N * K = %lld exceeds the CUDA sample path's 2^31 - 1",
              (long long)(p->N * p->K));
    return SPH_OK;
}

sph_status sph_cuda_sample_forward(sph_ctx_t ctx, const sph_head_plan *p, char *ws,
                                   float *part, float *recv, float2 *mq, int64_t comm_size) {
    (void)ws;
    cudaStream_t stream = (cudaStream_t)ctx->stream;
    sample_args a = make_args(p);
    int64_t n_spans = p->spans ? p->n_spans : 1;
    for (int64_t s = 0; s < n_spans; s++) {
        int64_t r0 = p->spans ? p->spans[2 * s] : 0, r1 = p->spans ? p->spans[2 * s + 1] : p->N;
        if (r1 <= r0) continue;
        a.r0 = r0;
        head_sample_fwd_kernel<<<(unsigned)(r1 - r0), SAMPLE_THREADS, smem_bytes(p->K, 0),
                                 stream>>>(a, part, mq);
        SPH_LAUNCH_CHECK("head_sample_fwd_kernel", stream);
    }
    const float *recs;
    SPH_TRY(sph_cuda_combine(ctx, p, part, recv, p->N, comm_size, &recs));
    for (int64_t s = 0; s < n_spans; s++) {
        int64_t r0 = p->spans ? p->spans[2 * s] : 0, r1 = p->spans ? p->spans[2 * s + 1] : p->N;
        SPH_TRY(sph_cuda_finalize(p, recs, p->N * SPH_PARTIAL_FIELDS, comm_size, r0, r1 - r0, r0,
                                  ((sph_cuda_state *)ctx->cuda)->nf, stream));
    }
    return SPH_OK;
}

sph_status sph_cuda_sample_backward(sph_ctx_t ctx, const sph_head_plan *p, char *ws,
                                               size_t ws_bytes) {
    cudaStream_t stream = (cudaStream_t)ctx->stream;
    if (!p->dhidden && !p->dweight) return SPH_OK;
    const int64_t n = p->N * p->K;
    const size_t r4 = sph_ws_round((size_t)n * 4);
    SPH_CHECK(ws_bytes >= sph_cuda_sample_ws(p, 1), SPH_ERR_INTERNAL,
              "sample backward: scratch %zu < %zu", ws_bytes, sph_cuda_sample_ws(p, 1));
    float *du = (float *)ws;
    int32_t *keys = (int32_t *)(ws + r4), *vals = (int32_t *)(ws + 2 * r4);
    int32_t *keys2 = (int32_t *)(ws + 3 * r4), *vals2 = (int32_t *)(ws + 4 * r4);
    void *temp = ws + 5 * r4;
    size_t temp_bytes = cub_temp_bytes(n, p->V_loc);
    const int dhk = p->dhidden ? kind_of(p->dh_dtype) : 0;
    const int dwk = p->dweight ? kind_of(p->dw_dtype) : 0;
    const int32_t none = (int32_t)p->V_loc;

    /* dH rows outside the spans, and dW when overwriting, start at 0 */
    if (p->dhidden && !p->acc_dh) {
        size_t es = dhk ? 2 : 4, pitch = (size_t)p->ld_dh * es;
        int64_t prev = 0, ns = p->spans ? p->n_spans : 0;
        for (int64_t k = 0; k <= ns; k++) {
            int64_t a0 = k < ns ? p->spans[2 * k] : (p->spans ? p->N : 0);
            if (a0 > prev)
                SPH_CUDA_RET(cudaMemset2DAsync((char *)p->dhidden + (size_t)prev * pitch, pitch,
                                               0, (size_t)p->H * es, (size_t)(a0 - prev), stream));
            if (k < ns) prev = p->spans[2 * k + 1];
        }
    }
    if (p->dweight && !p->acc_dw && p->V_loc > 0) {
        size_t es = dwk ? 2 : 4, pitch = (size_t)p->ld_dw * es;
        SPH_CUDA_RET(cudaMemset2DAsync(p->dweight, pitch, 0, (size_t)p->H * es,
                                       (size_t)p->V_loc, stream));
    }
    if (n == 0) return SPH_OK;
    head_sample_init_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(keys, vals, n, none);
    SPH_LAUNCH_CHECK("head_sample_init_kernel", stream);

    sample_args a = make_args(p);
    sample_bwd_args o;
    o.stats = p->stats;
    o.g = p->dlogprob;
    o.e = p->dentropy;
    o.gl = p->dlse;
    o.dh = p->dhidden;
    o.ld_dh = p->ld_dh;
    o.dh_kind = dhk;
    o.acc_dh = p->acc_dh;
    o.du = du;
    o.keys = keys;
    int64_t n_spans = p->spans ? p->n_spans : 1;
    for (int64_t s = 0; s < n_spans; s++) {
        int64_t r0 = p->spans ? p->spans[2 * s] : 0, r1 = p->spans ? p->spans[2 * s + 1] : p->N;
        if (r1 <= r0) continue;
        a.r0 = r0;
        head_sample_bwd_kernel<<<(unsigned)(r1 - r0), SAMPLE_THREADS, smem_bytes(p->K, 1),
                                 stream>>>(a, o);
        SPH_LAUNCH_CHECK("head_sample_bwd_kernel", stream);
    }
    if (!p->dweight) return SPH_OK;
    cudaError_t e = cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, keys2, vals, vals2,
                                                    (int)n, 0, key_bits(p->V_loc), stream);
    if (e != cudaSuccess)
        return sph_err(SPH_ERR_CUDA, "cub::DeviceRadixSort::SortPairs: %s",
                       cudaGetErrorString(e));
    SPH_LAUNCH_CHECK("cub::DeviceRadixSort::SortPairs", stream);
    head_sample_dw_kernel<<<(unsigned)n, SAMPLE_THREADS, 0, stream>>>(
        keys2, vals2, du, n, none, p->K, p->hidden, p->ld_h, a.kind, p->H, p->dweight, p->ld_dw,
        dwk);
    SPH_LAUNCH_CHECK("head_sample_dw_kernel", stream);
    return SPH_OK;
}
