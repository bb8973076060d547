/*
 * distill.cu - the CUDA backend of the distillation losses (the CPU backend's design,
 * distill_cpu.c, on the GPU): chunks of R consecutive rows, the shard's logits of each chunk
 * staged in fp32 (the student's Zs, the dense teacher's Zt), cuBLAS products, small kernels
 * for the row records, the bins and dz, the TP combine through the group's device
 * communicator (NCCL: one allgather of the records per chunk, dense a second one of
 * (loss, S)), and the gradient products dW += D^T H, dH = D W per chunk (D in the input
 * dtype for bf16 / f16 products, fp32 otherwise; dW accumulated in fp32).
 *
 * Rows: with spans (host metadata) the chunks cover the spans' rows only, listed on the host
 * and copied up (so a masked batch given its spans costs its active rows); with a device
 * mask alone, R consecutive rows per chunk over all N rows (6 N H V flops whatever the active
 * fraction: the products' heights are host arguments, and the count of a device mask's
 * active rows would need a host sync; docs/distill.md 4), the inactive ones gathered as zeros
 * and discarded. The active flags are a device array (the mask, the spans or all ones).
 * Non-finite statistics of an active row: counted on the device (sph_ctx_nonfinite), the
 * pass returns SPH_OK with NaN in the outputs (spanhead.h, "Policies").
 * Workspace (exact): cuBLAS's 32 MiB, act (N), the chunk's hidden rows Hc (R H, the
 * inactive ones zeroed: their bytes are never read into a product) and the teacher's, Zs, Zt, D (half), records (R and P R), the
 * (loss, S) partials, saved listed logits (R K), dHc (R H), dW fp32 (V_loc H), loss rows (N),
 * a counter and the seq_comm group's counts.
 * Reduction mean divides by num_tokens, or by the active rows counted on the device (k_count),
 * summed over seq_comm's ranks by one 8-byte allgather on the stream when a group is given.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <string.h>

#include "comm/comm.h"
#include "cuda/common.cuh"
#include "cuda/device_ptr.h"
#include "cuda/state.h"
#include "distill/distill.h"

#define DTHREADS 256
#define DR_MAX 4096
#define CUBLAS_WS ((size_t)32 << 20)

typedef struct dlay {
    int64_t R, rw, P;
    int half;
    size_t o_cub, o_act, o_rows, o_hc, o_htc, o_zs, o_zt, o_db, o_rec, o_gath, o_part, o_gath2, o_sav, o_dhc, o_dw,
        o_lrows, o_cnt, o_cntg, total;
} dlay;

static size_t take(size_t *off, size_t bytes) {
    size_t o = *off;
    *off += (bytes + 255) & ~(size_t)255;
    return o;
}

static void make_layout(sph_ctx_t ctx, const sph_distill_plan *dp, dlay *L) {
    const sph_head_plan *hp = &dp->head;
    memset(L, 0, sizeof *L);
    L->P = hp->comm ? hp->comm->size : 1;
    L->rw = dp->dense ? 4 : 2 + dp->K;
    L->half = hp->dtype.bits != 32;
    const int64_t vper = (hp->V + L->P - 1) / L->P, vw = vper > hp->V_loc ? vper : hp->V_loc;
    int64_t R = ctx->chunk_rows;
    if (R <= 0) {
        R = ctx->chunk_bytes / (vw * (4 * (dp->dense ? 2 : 1) + (L->half ? 2 : 0)));
        R = R < 1 ? 1 : R > DR_MAX ? DR_MAX : R;
    }
    if (R > hp->N && hp->N > 0) R = hp->N;
    L->R = R;
    const size_t N = (size_t)hp->N, Rz = (size_t)R, V = (size_t)hp->V_loc, H = (size_t)hp->H;
    size_t off = 256;
    L->o_cub = take(&off, CUBLAS_WS);
    L->o_act = take(&off, N);
    L->o_rows = take(&off, hp->spans ? N * 8 : 0);
    const size_t es = hp->dtype.bits / 8, tes = dp->dense ? dp->tdtype.bits / 8 : 0;
    L->o_hc = take(&off, Rz * H * es);
    L->o_htc = take(&off, Rz * (size_t)dp->HT * tes);
    L->o_zs = take(&off, Rz * V * 4);
    L->o_zt = take(&off, dp->dense ? Rz * V * 4 : 0);
    L->o_db = take(&off, L->half && (hp->dhidden || hp->dweight) ? Rz * V * 2 : 0);
    L->o_rec = take(&off, Rz * (size_t)L->rw * 8);
    L->o_gath = take(&off, L->P > 1 ? (size_t)L->P * Rz * (size_t)L->rw * 8 : 0);
    L->o_part = take(&off, Rz * 2 * 8);
    L->o_gath2 = take(&off, L->P > 1 && dp->dense ? (size_t)L->P * Rz * 2 * 8 : 0);
    L->o_sav = take(&off, dp->dense ? 0 : Rz * (size_t)dp->K * 4);
    L->o_dhc = take(&off, hp->dhidden ? Rz * H * 4 : 0);
    L->o_dw = take(&off, hp->dweight ? V * H * 4 : 0);
    L->o_lrows = take(&off, N * 8);
    L->o_cnt = take(&off, 8);
    L->o_cntg = take(&off, dp->seq_comm ? 8 * (size_t)dp->seq_comm->size : 0);
    L->total = off;
}

static sph_status sph_distill_cuda_workspace(sph_ctx_t ctx, const sph_distill_plan *dp,
                                                 size_t *bytes) {
    dlay L;
    make_layout(ctx, dp, &L);
    *bytes = L.total;
    return SPH_OK;
}

// ---- device math (distill_math.h's twin) ---------------------------------------------------

__device__ __forceinline__ double d_logaddexp(double a, double b) {
    if (a == -INFINITY) return b;
    if (b == -INFINITY) return a;
    const double m = a > b ? a : b;
    return m + log1p(exp(-fabs(a - b)));
}

__device__ __forceinline__ void d_term(int kind, double beta, double lq, double lp, double *l,
                                       double *a) {
    const double q = exp(lq), p = lp == -INFINITY ? 0.0 : exp(lp);
    if (kind == SPH_DK_FWD) {
        *l = p > 0 ? p * (lp - lq) : 0.0;
        *a = -p;
    } else if (kind == SPH_DK_REV) {
        *l = q > 0 ? q * (lq - lp) : 0.0;
        *a = q > 0 ? q * (lq - lp + 1) : 0.0;
    } else {
        const double lm = d_logaddexp(log(beta) + lp, log1p(-beta) + lq);
        const double tq = q > 0 ? (1 - beta) * q * (lq - lm) : 0.0;
        *l = (p > 0 ? beta * p * (lp - lm) : 0.0) + tq;
        *a = tq;
    }
}

/* The per-column form in float (the row sums accumulate in double): lq, lp of one column;
 * fp32 transcendentals keep the elementwise pass off the double-precision units, and their
 * ~1e-7 relative error is far below the 1e-4 budget of an fp32 result. */
__device__ __forceinline__ void d_termf(int kind, float beta, float lbeta, float l1beta,
                                        float lq, float lp, float *l, float *a) {
    const float q = expf(lq), p = expf(lp);
    if (kind == SPH_DK_FWD) {
        *l = p > 0 ? p * (lp - lq) : 0.0f;
        *a = -p;
    } else if (kind == SPH_DK_REV) {
        *l = q > 0 ? q * (lq - lp) : 0.0f;
        *a = q > 0 ? q * (lq - lp + 1) : 0.0f;
    } else {
        const float x = lbeta + lp, y = l1beta + lq, m = fmaxf(x, y);
        const float lm = m + log1pf(expf(-fabsf(x - y)));
        const float tq = q > 0 ? (1 - beta) * q * (lq - lm) : 0.0f;
        *l = (p > 0 ? beta * p * (lp - lm) : 0.0f) + tq;
        *a = tq;
    }
}

/* The call's device view. */
typedef struct ddev {
    int64_t N, H, V, Vtot, v0, K, rw, ld_ids, ld_tlp, ld_dh, ld_dw;
    int kind, red, dense, ids64, half, dh_kind, dw_kind, acc_dh, acc_dw;
    double beta;
    float inv_t, inv_tt, cap; /* inv_tt 0: the teacher takes the row's student temperature */
    const float *trows;       /* (N) per-row temperatures or NULL (inv_t then) */
    const float *ttrows;      /* (N) the dense teacher's per-row temperatures, or NULL */
    const uint8_t *act;
    const int64_t *rows; /* the listed rows (from the host spans), or NULL: row = c0 + q */
    const void *ids;
    const float *tlp, *dloss;
    float *zs, *zt, *sav, *dhc, *dw32, *loss;
    void *db, *dhidden, *dweight;
    double *rec, *part, *lrows;
    unsigned long long *nf;
    long long *cnt;
} ddev;

/* Row i's 1 / T: the scalar's, or 1 / T_i (a T_i outside the scalar's rule makes the row NaN,
 * counted as non-finite: spanhead.h, temperature_rows). */
__device__ __forceinline__ float d_inv_rule(float t) {
    return t > 0 && t <= 3.4e38f && 1.0f / t >= 1.17549435e-38f && 1.0f / t <= 3.4e38f
               ? 1.0f / t
               : NAN;
}
__device__ __forceinline__ float d_inv_t(const ddev &d, int64_t i) {
    return d.trows ? d_inv_rule(d.trows[i]) : d.inv_t;
}
/* The dense teacher's 1 / T_T of row i: its row's (the same rule), its scalar's, or the
 * student's. */
__device__ __forceinline__ float d_inv_tt(const ddev &d, int64_t i, float it) {
    return d.ttrows ? d_inv_rule(d.ttrows[i]) : d.inv_tt > 0 ? d.inv_tt : it;
}

__device__ __forceinline__ int64_t d_row(const ddev &d, int64_t c0, int64_t q) {
    return d.rows ? d.rows[c0 + q] : c0 + q;
}

__device__ __forceinline__ int64_t d_id(const ddev &d, int64_t i, int64_t k) {
    return d.ids64 ? ((const int64_t *)d.ids)[i * d.ld_ids + k]
                   : (int64_t)((const int32_t *)d.ids)[i * d.ld_ids + k];
}

/* kind 0 f32, 1 bf16, 2 f16 */
__device__ __forceinline__ float d_load(const void *b, int kind, int64_t k) {
    if (kind == 0) return ((const float *)b)[k];
    if (kind == 1) return __bfloat162float(((const __nv_bfloat16 *)b)[k]);
    return __half2float(((const __half *)b)[k]);
}

__device__ __forceinline__ void d_store(void *b, int kind, int64_t k, float v, int acc) {
    if (acc) v += d_load(b, kind, k);
    if (kind == 0)
        ((float *)b)[k] = v;
    else if (kind == 1)
        ((__nv_bfloat16 *)b)[k] = __float2bfloat16(v);
    else
        ((__half *)b)[k] = __float2half(v);
}

__device__ __forceinline__ double d_scale(const ddev &d, int64_t i) {
    if (d.red == SPH_REDUCTION_MEAN) return *d.cnt > 0 ? 1.0 / (double)*d.cnt : 0.0;
    if (d.red == SPH_REDUCTION_SUM) return 1.0;
    return d.dloss ? (double)d.dloss[i] : 1.0;
}

/* Block reductions (DTHREADS threads), deterministic tree order. */
__device__ double d_block_sum(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = DTHREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    const double r = sh[0];
    __syncthreads();
    return r;
}

__device__ float d_block_max(float v, float *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = DTHREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            const float a = sh[threadIdx.x], b = sh[threadIdx.x + s];
            sh[threadIdx.x] = (a != a || b != b) ? NAN : fmaxf(a, b);
        }
        __syncthreads();
    }
    const float r = sh[0];
    __syncthreads();
    return r;
}

/* (max, sum e^(x - max)) of a row, -inf entries skipped, NaN propagated. */
__device__ void d_row_ms(const float *x, int64_t n, double *sh, double *m, double *s) {
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += DTHREADS) {
        const float v = x[j];
        mx = (v != v || mx != mx) ? NAN : fmaxf(mx, v);
    }
    mx = d_block_max(mx, (float *)sh);
    double acc = 0;
    if (mx != -INFINITY)
        for (int64_t j = threadIdx.x; j < n; j += DTHREADS) acc += exp((double)x[j] - (double)mx);
    acc = d_block_sum(acc, sh);
    *m = mx, *s = mx != mx ? NAN : acc;
}

// ---- kernels -------------------------------------------------------------------------------

__global__ void k_spans_act(uint8_t *act, int64_t N, const uint8_t *mask) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < N) act[i] = mask ? (mask[i] != 0) : 1;
}

__global__ void k_count(ddev d) {
    __shared__ double sh[DTHREADS];
    double c = 0;
    for (int64_t i = threadIdx.x; i < d.N; i += DTHREADS) c += d.act[i];
    c = d_block_sum(c, sh);
    if (threadIdx.x == 0) *d.cnt = (long long)c;
}

/* Reduction mean's divisor: num_tokens, or the group's counts summed in rank order. */
__global__ void k_set_count(long long *cnt, long long n) { *cnt = n; }

__global__ void k_sum_counts(long long *cnt, const long long *all, int64_t P) {
    long long t = 0;
    for (int64_t r = 0; r < P; r++) t += all[r];
    *cnt = t;
}

/* The chunk's rows [c0, c0 + nr) of src (row stride ld, cols elements of es bytes) into dst
 * (compact), inactive rows as zeros. */
__global__ void k_gather(char *dst, const char *src, int64_t ld, int64_t cols, int es, ddev d,
                         int64_t c0, int64_t nr) {
    const int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (e >= nr * cols) return;
    const int64_t q = e / cols, k = e % cols, i = d_row(d, c0, q);
    const bool a = d.act[i] != 0;
    if (es == 4)
        ((float *)dst)[e] = a ? ((const float *)src)[i * ld + k] : 0.0f;
    else
        ((uint16_t *)dst)[e] = a ? ((const uint16_t *)src)[i * ld + k] : (uint16_t)0;
}

/* dhidden's rows outside the listed ones: exact zeros (not accumulating). */
__global__ void k_dh_zero(ddev d) {
    const int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (e >= d.N * d.H) return;
    d_store(d.dhidden, d.dh_kind, (e / d.H) * d.ld_dh + e % d.H, 0.0f, 0);
}

/* Step 1-2: softcap and 1 / T in place, the row's local record. */
__global__ void __launch_bounds__(DTHREADS) k_stats(ddev d, int64_t c0) {
    __shared__ double sh[DTHREADS];
    const int64_t q = blockIdx.x, i = d_row(d, c0, q), V = d.V;
    float *x = d.zs + q * V;
    double *rec = d.rec + q * d.rw;
    const float it = d_inv_t(d, i), itt = d_inv_tt(d, i, it);
    for (int64_t j = threadIdx.x; j < V; j += DTHREADS)
        x[j] = d.cap > 0 ? d.cap * tanhf(x[j] / d.cap) * it : x[j] * it;
    if (d.dense)
        for (int64_t j = threadIdx.x; j < V; j += DTHREADS) d.zt[q * V + j] *= itt;
    __syncthreads();
    if (!d.act[i]) {
        for (int64_t f = threadIdx.x; f < d.rw; f += DTHREADS)
            rec[f] = (f == 0 || (d.dense && f == 2)) ? -INFINITY : 0.0;
        return;
    }
    double m, s;
    if (d.dense) {
        d_row_ms(x, V, sh, &m, &s);
        if (threadIdx.x == 0) rec[0] = m, rec[1] = s;
        d_row_ms(d.zt + q * V, V, sh, &m, &s);
        if (threadIdx.x == 0) rec[2] = m, rec[3] = s;
        return;
    }
    float *sav = d.sav + q * d.K;
    for (int64_t k = threadIdx.x; k < d.K; k += DTHREADS) {
        const int64_t id = d_id(d, i, k), c = id - d.v0;
        rec[2 + k] = 0;
        if (id >= 0 && c >= 0 && c < V) sav[k] = x[c], rec[2 + k] = x[c];
    }
    __syncthreads();
    for (int64_t k = threadIdx.x; k < d.K; k += DTHREADS) {
        const int64_t id = d_id(d, i, k), c = id - d.v0;
        if (id >= 0 && c >= 0 && c < V) x[c] = -INFINITY;
    }
    __syncthreads();
    d_row_ms(x, V, sh, &m, &s);
    if (threadIdx.x == 0) rec[0] = m, rec[1] = s;
    __syncthreads();
    for (int64_t k = threadIdx.x; k < d.K; k += DTHREADS) {
        const int64_t id = d_id(d, i, k), c = id - d.v0;
        if (id >= 0 && c >= 0 && c < V) x[c] = sav[k];
    }
}

__device__ __forceinline__ void d_merge(double *m, double *s, double m2, double s2) {
    if (m2 == -INFINITY && s2 == 0) return;
    if (*m == -INFINITY && *s == 0) {
        *m = m2, *s = s2;
        return;
    }
    const double M = *m > m2 ? *m : m2;
    *s = *s * exp(*m - M) + s2 * exp(m2 - M);
    *m = M;
}

/* The group's records merged in rank order ((m, s) pairs, the rest adds): thread per row. */
__global__ void k_merge(double *out, const double *g, int64_t nr, int64_t width, int pairs,
                        int64_t P) {
    const int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (q >= nr) return;
    double *o = out + q * width;
    for (int64_t f = 0; f < width; f++) o[f] = f < 2 * pairs ? (f % 2 ? 0.0 : -INFINITY) : 0.0;
    for (int64_t r = 0; r < P; r++) {
        const double *a = g + (r * nr + q) * width;
        for (int p = 0; p < pairs; p++) d_merge(&o[2 * p], &o[2 * p + 1], a[2 * p], a[2 * p + 1]);
        for (int64_t f = 2 * pairs; f < width; f++) o[f] += a[f];
    }
}

/* The combined record of chunk row q is not finite (NaN / inf in its inputs, a bad per-row
 * temperature, logits beyond float). */
__device__ __forceinline__ bool d_rec_bad(const ddev &d, int64_t q) {
    const double *o = d.rec + q * d.rw;
    bool bad = !isfinite(o[1]) || o[0] != o[0] || o[0] == INFINITY;
    if (d.dense) bad |= !isfinite(o[0]) || !isfinite(o[2]) || !isfinite(o[3]);
    for (int64_t f = 2; !d.dense && f < d.rw; f++) bad |= !isfinite(o[f]);
    return bad;
}

/* Non-finite statistics of an active row: counted; its loss and du are then NaN (k_dense_du,
 * k_sparse: the terms' 0 log 0 guards would otherwise drop NaN probabilities and leave a
 * finite loss for the row). */
__global__ void k_check(ddev d, int64_t c0, int64_t nr) {
    const int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (q >= nr || !d.act[d_row(d, c0, q)]) return;
    const bool bad = d_rec_bad(d, q);
    if (bad && d.nf) {
        atomicAdd(&d.nf[0], 1ull);
        atomicMin(&d.nf[1], (unsigned long long)d_row(d, c0, q));
    }
}

/* Dense step 3: (loss, S) of the shard, a_j into Zt. */
__global__ void __launch_bounds__(DTHREADS) k_dense_part(ddev d, int64_t c0) {
    __shared__ double sh[DTHREADS];
    const int64_t q = blockIdx.x, i = d_row(d, c0, q), V = d.V;
    if (!d.act[i]) {
        if (threadIdx.x == 0) d.part[q * 2] = d.part[q * 2 + 1] = 0;
        return;
    }
    const double *o = d.rec + q * 4;
    const float ls = (float)(o[0] + log(o[1])), lt = (float)(o[2] + log(o[3]));
    const float beta = (float)d.beta, lb = (float)log(d.beta), l1b = (float)log1p(-d.beta);
    const float *x = d.zs + q * V;
    float *y = d.zt + q * V;
    double L = 0, S = 0;
    float l, a;
    for (int64_t j = threadIdx.x; j < V; j += DTHREADS) {
        d_termf(d.kind, beta, lb, l1b, x[j] - ls, y[j] - lt, &l, &a);
        L += l, S += a;
        y[j] = a;
    }
    L = d_block_sum(L, sh);
    S = d_block_sum(S, sh);
    if (threadIdx.x == 0) d.part[q * 2] = L, d.part[q * 2 + 1] = S;
}

__device__ __forceinline__ float d_capf(const ddev &d, float z, float inv_t) {
    if (d.cap <= 0) return 1.0f;
    const float t = z / (inv_t * d.cap);
    return 1.0f - t * t;
}

__device__ __forceinline__ void d_put_du(const ddev &d, int64_t q, int64_t j, float du) {
    d.zs[q * d.V + j] = du;
    if (d.db) {
        if (d.half == 1)
            ((__nv_bfloat16 *)d.db)[q * d.V + j] = __float2bfloat16(du);
        else
            ((__half *)d.db)[q * d.V + j] = __float2half(du);
    }
}

/* Dense step 4: du, and the row's loss (NaN for both where the row's record is not finite). */
__global__ void __launch_bounds__(DTHREADS) k_dense_du(ddev d, int64_t c0, int grads) {
    const int64_t q = blockIdx.x, i = d_row(d, c0, q), V = d.V;
    const bool bad = d.act[i] && d_rec_bad(d, q);
    if (threadIdx.x == 0) d.lrows[i] = !d.act[i] ? 0.0 : bad ? (double)NAN : d.part[q * 2];
    if (!grads) return;
    if (!d.act[i] || bad) {
        for (int64_t j = threadIdx.x; j < V; j += DTHREADS) d_put_du(d, q, j, bad ? NAN : 0.0f);
        return;
    }
    const float ls = (float)(d.rec[q * 4] + log(d.rec[q * 4 + 1])), S = (float)d.part[q * 2 + 1];
    const float it = d_inv_t(d, i), c = (float)(d_scale(d, i) * it);
    const float *a = d.zt + q * V;
    for (int64_t j = threadIdx.x; j < V; j += DTHREADS) {
        const float z = d.zs[q * V + j];
        d_put_du(d, q, j, (a[j] - expf(z - ls) * S) * c * d_capf(d, z, it));
    }
}

/* Sparse steps 3-4: the bins from the combined record (thread 0), the loss, du. */
__global__ void __launch_bounds__(DTHREADS) k_sparse(ddev d, int64_t c0, int grads) {
    __shared__ double r[5]; /* lse, lqr, S, ar, tail */
    const int64_t q = blockIdx.x, i = d_row(d, c0, q), V = d.V, K = d.K;
    const double *o = d.rec + q * d.rw;
    float *sav = d.sav + q * K;
    if (!d.act[i] || d_rec_bad(d, q)) { /* inactive: 0; a non-finite record: NaN */
        const float v = d.act[i] ? NAN : 0.0f;
        if (threadIdx.x == 0) d.lrows[i] = v;
        for (int64_t j = threadIdx.x; grads && j < V; j += DTHREADS) d_put_du(d, q, j, v);
        return;
    }
    if (threadIdx.x == 0) {
        double M = o[0], psum = 0;
        int64_t nvalid = 0;
        for (int64_t k = 0; k < K; k++)
            if (d_id(d, i, k) >= 0) {
                M = o[2 + k] > M ? o[2 + k] : M;
                psum += exp((double)d.tlp[i * d.ld_tlp + k]);
                nvalid++;
            }
        double tot = o[1] > 0 ? o[1] * exp(o[0] - M) : 0;
        for (int64_t k = 0; k < K; k++)
            if (d_id(d, i, k) >= 0) tot += exp(o[2 + k] - M);
        const double lse = M + log(tot);
        const double lqr = nvalid < d.Vtot && o[1] > 0 ? o[0] + log(o[1]) - lse : -INFINITY;
        const double pr = psum < 1 ? 1 - psum : 0.0;
        const int tail = nvalid < d.Vtot && !(d.kind == SPH_DK_REV && pr == 0);
        double L = 0, S = 0, l, a, ar = 0;
        for (int64_t k = 0; k < K; k++) {
            if (d_id(d, i, k) < 0) continue;
            d_term(d.kind, d.beta, o[2 + k] - lse, (double)d.tlp[i * d.ld_tlp + k], &l, &a);
            L += l, S += a;
            sav[k] = (float)a;
        }
        if (tail) {
            d_term(d.kind, d.beta, lqr, pr > 0 ? log(pr) : -INFINITY, &l, &ar);
            L += l, S += ar;
        }
        d.lrows[i] = L;
        r[0] = lse, r[1] = lqr, r[2] = S, r[3] = ar, r[4] = tail;
    }
    __syncthreads();
    if (!grads) return;
    const float it = d_inv_t(d, i);
    const double lse = r[0], S = r[2], c = d_scale(d, i) * it;
    const float lsef = (float)lse, lqr = (float)r[1], ar = (float)r[3], Sf = (float)S,
                cf = (float)c;
    const int tail = r[4] != 0;
    for (int64_t j = threadIdx.x; j < V; j += DTHREADS) {
        const float z = d.zs[q * V + j];
        const float lq = z - lsef;
        const float t = tail ? expf(lq - lqr) * ar : 0.0f;
        d_put_du(d, q, j, (t - expf(lq) * Sf) * cf * d_capf(d, z, it));
    }
    __syncthreads();
    for (int64_t k = threadIdx.x; k < K; k += DTHREADS) {
        const int64_t id = d_id(d, i, k), col = id - d.v0;
        if (id < 0 || col < 0 || col >= V) continue;
        const float z = (float)o[2 + k];
        d_put_du(d, q, col, (float)((sav[k] - exp(o[2 + k] - lse) * S) * c) * d_capf(d, z, it));
    }
}

/* dHc (nr, H) f32 into dhidden's rows [c0, c0 + nr). */
__global__ void k_dh_store(ddev d, int64_t c0, int64_t nr) {
    const int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (e >= nr * d.H) return;
    const int64_t q = e / d.H, k = e % d.H;
    d_store(d.dhidden, d.dh_kind, d_row(d, c0, q) * d.ld_dh + k, d.dhc[e], d.acc_dh);
}

__global__ void k_dw_store(ddev d) {
    const int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (e >= d.V * d.H) return;
    const int64_t j = e / d.H, k = e % d.H;
    d_store(d.dweight, d.dw_kind, j * d.ld_dw + k, d.dw32[e], d.acc_dw);
}

__global__ void k_loss(ddev d) {
    __shared__ double sh[DTHREADS];
    if (d.red == SPH_REDUCTION_NONE) {
        for (int64_t i = threadIdx.x; i < d.N; i += DTHREADS) d.loss[i] = (float)d.lrows[i];
        return;
    }
    double s = 0;
    for (int64_t i = threadIdx.x; i < d.N; i += DTHREADS) s += d.lrows[i];
    s = d_block_sum(s, sh);
    if (threadIdx.x == 0) {
        const long long n = *d.cnt;
        d.loss[0] = (float)(d.red == SPH_REDUCTION_MEAN ? (n > 0 ? s / (double)n : 0.0) : s);
    }
}

// ---- the pass ------------------------------------------------------------------------------

static int kind_of(sph_dtype t) { return t.bits == 32 ? 0 : t.code == SPH_DTYPE_BFLOAT ? 1 : 2; }

static cudaDataType cuda_type(sph_dtype t) {
    return t.bits == 32 ? CUDA_R_32F : t.code == SPH_DTYPE_BFLOAT ? CUDA_R_16BF : CUDA_R_16F;
}

typedef struct drun {
    sph_ctx_t ctx;
    const sph_distill_plan *dp;
    dlay L;
    ddev d;
    cublasHandle_t cb;
    cudaStream_t st;
    cublasComputeType_t ct, ctt;
    char *hc, *htc; /* the chunk's rows, compact */
    int64_t n_list;  /* rows the chunks cover: the spans' rows, or N */
} drun;

/* C (nr, V) row-major f32 = X (nr, k; row stride ldx) . W (V, k; row stride ldw)^T. */
static sph_status gemm_logits(const drun *r, const void *x, int64_t ldx, const void *w,
                              int64_t ldw, int64_t k, sph_dtype t, int64_t nr, float *C,
                              cublasComputeType_t ct) {
    const float one = 1, zero = 0;
    const int64_t V = r->dp->head.V_loc;
    SPH_CUBLAS_RET(cublasGemmEx(r->cb, CUBLAS_OP_T, CUBLAS_OP_N, (int)V, (int)nr, (int)k, &one, w,
                                cuda_type(t), (int)ldw, x, cuda_type(t), (int)ldx, &zero, C,
                                CUDA_R_32F, (int)V, ct, CUBLAS_GEMM_DEFAULT));
    return SPH_OK;
}

static sph_status combine(const drun *r, int64_t nr, int pairs, int64_t width, double *rec,
                          double *g) {
    const sph_head_plan *hp = &r->dp->head;
    if (r->L.P <= 1) return SPH_OK;
    const size_t bytes = (size_t)(nr * width) * sizeof(double);
    sph_status s = hp->comm->ops->allgather(hp->comm, rec, g, bytes, r->st);
    if (s != SPH_OK) return sph_err_prefix(s, "distill: tp_comm: allgather: ");
    k_merge<<<(unsigned)((nr + 127) / 128), 128, 0, r->st>>>(rec, g, nr, width, pairs, r->L.P);
    SPH_LAUNCH_CHECK("k_merge", r->st);
    return SPH_OK;
}

static sph_status chunk_grads(const drun *r, int64_t c0, int64_t nr) {
    const sph_head_plan *hp = &r->dp->head;
    const float one = 1, zero = 0;
    const int64_t V = hp->V_loc, H = hp->H;
    const void *D = r->d.db ? r->d.db : (const void *)r->d.zs;
    if (hp->dweight) /* dW (V, H) += D^T Hc: col-major (H, V) = Hc^T (H, nr) . D (nr, V) */
        SPH_CUBLAS_RET(cublasGemmEx(r->cb, CUBLAS_OP_N, CUBLAS_OP_T, (int)H, (int)V, (int)nr, &one,
                                    r->hc, cuda_type(hp->dtype), (int)H, D,
                                    cuda_type(hp->dtype), (int)V, &one, r->d.dw32, CUDA_R_32F,
                                    (int)H, r->ct, CUBLAS_GEMM_DEFAULT));
    if (hp->dhidden) { /* dHc (nr, H) = D W: col-major (H, nr) = W (H, V) . D (V, nr) */
        SPH_CUBLAS_RET(cublasGemmEx(r->cb, CUBLAS_OP_N, CUBLAS_OP_N, (int)H, (int)nr, (int)V, &one,
                                    hp->weight, cuda_type(hp->dtype), (int)hp->ld_w, D,
                                    cuda_type(hp->dtype), (int)V, &zero, r->d.dhc, CUDA_R_32F,
                                    (int)H, r->ct, CUBLAS_GEMM_DEFAULT));
        const int64_t n = nr * H;
        k_dh_store<<<(unsigned)((n + 255) / 256), 256, 0, r->st>>>(r->d, c0, nr);
        SPH_LAUNCH_CHECK("k_dh_store", r->st);
    }
    return SPH_OK;
}

static sph_status setup(sph_ctx_t ctx, const sph_distill_plan *dp, void *ws, size_t bytes,
                        drun *r) {
    const sph_head_plan *hp = &dp->head;
    memset(r, 0, sizeof *r);
    r->ctx = ctx, r->dp = dp;
    SPH_CUDA_RET(cudaSetDevice(ctx->device.id)); /* the context's device, not the caller's */
    make_layout(ctx, dp, &r->L);
    SPH_CHECK(bytes >= r->L.total && ws != NULL, SPH_ERR_WORKSPACE,
              "workspace: %zu bytes, expected >= %zu (sph_distill_loss_workspace_size)", bytes,
              r->L.total);
    char *b = (char *)(((uintptr_t)ws + 255) & ~(uintptr_t)255) - 256;
    sph_cuda_state *cs = (sph_cuda_state *)ctx->cuda;
    r->cb = cs->cublas;
    r->st = (cudaStream_t)ctx->stream;
    SPH_CUBLAS_RET(cublasSetStream(r->cb, r->st));
    SPH_CUBLAS_RET(cublasSetWorkspace(r->cb, b + r->L.o_cub, CUBLAS_WS));
    r->ct = hp->dtype.bits == 32 && ctx->opts.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                         : CUBLAS_COMPUTE_32F;
    r->ctt = dp->dense && dp->tdtype.bits == 32 && ctx->opts.allow_tf32
                 ? CUBLAS_COMPUTE_32F_FAST_TF32
                 : CUBLAS_COMPUTE_32F;
    ddev &d = r->d;
    d.N = hp->N, d.H = hp->H, d.V = hp->V_loc, d.Vtot = hp->V, d.v0 = hp->v0, d.K = dp->K;
    d.rw = r->L.rw, d.ld_ids = dp->ld_ids, d.ld_tlp = dp->ld_tlp, d.ld_dh = hp->ld_dh;
    d.ld_dw = hp->ld_dw, d.kind = dp->kind, d.red = dp->reduction, d.dense = dp->dense;
    d.ids64 = dp->ids_i64, d.half = kind_of(hp->dtype);
    d.dh_kind = hp->dhidden ? kind_of(hp->dh_dtype) : 0;
    d.dw_kind = hp->dweight ? kind_of(hp->dw_dtype) : 0;
    d.acc_dh = hp->acc_dh, d.acc_dw = hp->acc_dw, d.beta = dp->beta;
    d.inv_t = (float)(1.0 / hp->temperature), d.trows = hp->temp_rows;
    d.inv_tt = dp->t_teacher > 0 ? (float)(1.0 / dp->t_teacher) : 0.0f;
    d.ttrows = dp->tt_rows;
    d.cap = (float)hp->softcap;
    d.act = (const uint8_t *)(b + r->L.o_act);
    d.ids = dp->ids, d.tlp = dp->tlp, d.dloss = dp->dloss;
    d.zs = (float *)(b + r->L.o_zs), d.zt = (float *)(b + r->L.o_zt);
    d.sav = (float *)(b + r->L.o_sav), d.dhc = (float *)(b + r->L.o_dhc);
    d.dw32 = (float *)(b + r->L.o_dw), d.loss = dp->loss;
    d.db = r->L.half && (hp->dhidden || hp->dweight) ? (void *)(b + r->L.o_db) : NULL;
    d.dhidden = hp->dhidden, d.dweight = hp->dweight;
    r->hc = b + r->L.o_hc, r->htc = b + r->L.o_htc;
    d.rec = (double *)(b + r->L.o_rec), d.part = (double *)(b + r->L.o_part);
    d.lrows = (double *)(b + r->L.o_lrows);
    d.nf = cs->nf;
    d.cnt = (long long *)(b + r->L.o_cnt);
    /* the rows the chunks cover: with spans (host) only theirs, listed on the host and copied
     * up (pageable: staged before the call returns); else every row */
    r->n_list = hp->N;
    if (hp->spans && hp->N > 0) {
        int64_t *h = (int64_t *)sph_malloc((size_t)hp->N * 8), n = 0;
        SPH_CHECK(h != NULL, SPH_ERR_ALLOC, "distill: out of host memory (N = %lld)",
                  (long long)hp->N);
        for (int64_t s = 0; s < hp->n_spans; s++)
            for (int64_t i = hp->spans[2 * s]; i < hp->spans[2 * s + 1]; i++) h[n++] = i;
        cudaError_t e = cudaSuccess;
        if (n > 0)
            e = cudaMemcpyAsync(b + r->L.o_rows, h, (size_t)n * 8, cudaMemcpyHostToDevice, r->st);
        sph_free(h);
        SPH_CUDA_RET(e);
        r->n_list = n;
        d.rows = (const int64_t *)(b + r->L.o_rows);
    }
    /* the active flags: the mask, the spans (host, copied), or all rows */
    uint8_t *act = (uint8_t *)(b + r->L.o_act);
    if (hp->N > 0) {
        if (!hp->mask && hp->spans) {
            uint8_t *h = (uint8_t *)sph_malloc((size_t)hp->N);
            SPH_CHECK(h != NULL, SPH_ERR_ALLOC, "distill: out of host memory (N = %lld)",
                      (long long)hp->N);
            sph_head_active_rows(hp, h);
            /* from pageable memory: staged before the call returns, so h may go (no sync) */
            cudaError_t e = cudaMemcpyAsync(act, h, (size_t)hp->N, cudaMemcpyHostToDevice, r->st);
            sph_free(h);
            SPH_CUDA_RET(e);
        } else {
            k_spans_act<<<(unsigned)((hp->N + 255) / 256), 256, 0, r->st>>>(act, hp->N, hp->mask);
            SPH_LAUNCH_CHECK("k_spans_act", r->st);
        }
    }
    SPH_CUDA_RET(cudaMemsetAsync(d.lrows, 0, (size_t)hp->N * 8, r->st));
    k_count<<<1, DTHREADS, 0, r->st>>>(d);
    SPH_LAUNCH_CHECK("k_count", r->st);
    if (dp->reduction == SPH_REDUCTION_MEAN && dp->seq_comm && dp->seq_comm->size > 1) {
        /* the group's active rows: one allgather of the 8-byte counts, on the stream (also
         * with num_tokens, so that ranks differing only in it still meet in one collective) */
        long long *all = (long long *)(b + r->L.o_cntg);
        sph_status s = dp->seq_comm->ops->allgather(dp->seq_comm, d.cnt, all, 8, r->st);
        if (s != SPH_OK) return sph_err_prefix(s, "distill: seq_comm: allgather: ");
        k_sum_counts<<<1, 1, 0, r->st>>>(d.cnt, all, dp->seq_comm->size);
        SPH_LAUNCH_CHECK("k_sum_counts", r->st);
    }
    if (dp->reduction == SPH_REDUCTION_MEAN && dp->num_tokens > 0) {
        k_set_count<<<1, 1, 0, r->st>>>(d.cnt, (long long)dp->num_tokens);
        SPH_LAUNCH_CHECK("k_set_count", r->st);
    }
    if (hp->dweight)
        SPH_CUDA_RET(cudaMemsetAsync(d.dw32, 0, (size_t)(hp->V_loc * hp->H) * 4, r->st));
    if (d.rows && hp->dhidden && !hp->acc_dh && hp->N * hp->H > 0) { /* rows outside the list */
        k_dh_zero<<<(unsigned)((hp->N * hp->H + 255) / 256), 256, 0, r->st>>>(d);
        SPH_LAUNCH_CHECK("k_dh_zero", r->st);
    }
    return SPH_OK;
}


static sph_status sph_distill_cuda_run(sph_ctx_t ctx, const sph_distill_plan *dp, void *ws,
                                           size_t bytes) {
    /* the loss's own tensors (the head's pointers: its backend check, at validation), before
     * anything is enqueued: a tensor that claims the device but points at host memory */
    SPH_TRY(sph_cuda_need_device(dp->th, "teacher_hidden"));
    SPH_TRY(sph_cuda_need_device(dp->tw, "teacher_weight"));
    SPH_TRY(sph_cuda_need_device(dp->ids, "teacher_topk_ids"));
    SPH_TRY(sph_cuda_need_device(dp->tlp, "teacher_topk_logprobs"));
    SPH_TRY(sph_cuda_need_device(dp->tt_rows, "teacher_temperature_rows"));
    SPH_TRY(sph_cuda_need_device(dp->dloss, "dloss"));
    SPH_TRY(sph_cuda_need_device(dp->loss, "loss"));
    drun r;
    SPH_TRY(setup(ctx, dp, ws, bytes, &r));
    const sph_head_plan *hp = &dp->head;
    const int grads = hp->dhidden || hp->dweight;
    char *b = (char *)(((uintptr_t)ws + 255) & ~(uintptr_t)255) - 256;
    double *gath = (double *)(b + r.L.o_gath), *gath2 = (double *)(b + r.L.o_gath2);
    const size_t es = hp->dtype.bits / 8, tes = dp->dense ? dp->tdtype.bits / 8 : 0;
    for (int64_t c0 = 0; c0 < r.n_list; c0 += r.L.R) {
        const int64_t nr = r.n_list - c0 < r.L.R ? r.n_list - c0 : r.L.R;
        int64_t n = nr * hp->H;
        k_gather<<<(unsigned)((n + 255) / 256), 256, 0, r.st>>>(
            r.hc, (const char *)hp->hidden, hp->ld_h, hp->H, (int)es, r.d, c0, nr);
        SPH_LAUNCH_CHECK("k_gather", r.st);
        SPH_TRY(gemm_logits(&r, r.hc, hp->H, hp->weight, hp->ld_w, hp->H, hp->dtype, nr, r.d.zs,
                            r.ct));
        if (dp->dense) {
            n = nr * dp->HT;
            k_gather<<<(unsigned)((n + 255) / 256), 256, 0, r.st>>>(
                r.htc, (const char *)dp->th, dp->ld_th, dp->HT, (int)tes, r.d, c0, nr);
            SPH_LAUNCH_CHECK("k_gather", r.st);
            SPH_TRY(gemm_logits(&r, r.htc, dp->HT, dp->tw, dp->ld_tw, dp->HT, dp->tdtype, nr,
                                r.d.zt, r.ctt));
        }
        k_stats<<<(unsigned)nr, DTHREADS, 0, r.st>>>(r.d, c0);
        SPH_LAUNCH_CHECK("k_stats", r.st);
        SPH_TRY(combine(&r, nr, dp->dense ? 2 : 1, r.L.rw, r.d.rec, gath));
        k_check<<<(unsigned)((nr + 127) / 128), 128, 0, r.st>>>(r.d, c0, nr);
        SPH_LAUNCH_CHECK("k_check", r.st);
        if (dp->dense) {
            k_dense_part<<<(unsigned)nr, DTHREADS, 0, r.st>>>(r.d, c0);
            SPH_LAUNCH_CHECK("k_dense_part", r.st);
            SPH_TRY(combine(&r, nr, 0, 2, r.d.part, gath2));
            k_dense_du<<<(unsigned)nr, DTHREADS, 0, r.st>>>(r.d, c0, grads);
            SPH_LAUNCH_CHECK("k_dense_du", r.st);
        } else {
            k_sparse<<<(unsigned)nr, DTHREADS, 0, r.st>>>(r.d, c0, grads);
            SPH_LAUNCH_CHECK("k_sparse", r.st);
        }
        if (grads) SPH_TRY(chunk_grads(&r, c0, nr));
    }
    if (hp->dweight && hp->V_loc * hp->H > 0) {
        const int64_t n = hp->V_loc * hp->H;
        k_dw_store<<<(unsigned)((n + 255) / 256), 256, 0, r.st>>>(r.d);
        SPH_LAUNCH_CHECK("k_dw_store", r.st);
    }
    if (hp->allreduce_dh && hp->comm && hp->comm->size > 1) {
        sph_status s = hp->comm->ops->allreduce_sum_f32(hp->comm, (float *)hp->dhidden,
                                                        (size_t)(hp->N * hp->H), r.st);
        if (s != SPH_OK) return sph_err_prefix(s, "distill: allreduce_dhidden: ");
    }
    k_loss<<<1, DTHREADS, 0, r.st>>>(r.d);
    SPH_LAUNCH_CHECK("k_loss", r.st);
    return SPH_OK;
}

/* The table src/cuda/runtime.cu hands out as loss_backend("distill") (src/distill/distill.c). */
extern "C" const sph_distill_backend sph_distill_cuda_backend = {"cuda", sph_distill_cuda_workspace,
                                                                 sph_distill_cuda_run};
