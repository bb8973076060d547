/*
 * head_extras.cu - the forward's optional per-row outputs of issue 25 on CUDA: sum_p2
 * (sum_j p_ij^2) and the top-k of the distribution (topk_ids, topk_logprobs), from the staged
 * fp32 logits of each chunk and split (head.cu runs the cuBLAS / staged path whenever one of
 * them is asked for: sph_cuda_head_layout, describe's "+extras").
 *
 * Per chunk row and split (one block of 256 threads per row, right after the statistics of
 * the same logits, which are still in L2 for narrow splits and in HBM otherwise):
 *   sum_p2: each thread an online (m, q = sum e^(2 (z - m))) over a fixed column stride, a
 *     fixed-order block reduction, merged after the earlier splits' (m, q) of the row;
 *   top-k: a sorted list of the K best (z, id) in shared memory, seeded with the earlier
 *     splits' list of the row; every logit is compared with the list's K-th entry (one compare
 *     per logit: a threshold), the few that beat it are appended to a candidate buffer, and the
 *     list and the buffer are bitonic-sorted together (2048 entries) when the buffer could
 *     overflow and at the end. The order (z descending, ties the lower id first) is total, so
 *     the list does not depend on the order the candidates arrived in (deterministic).
 * Across the TP group: one allgather of the rows' (m, q) (8 bytes) and lists (8 K bytes),
 * then a finalize per row: Q = sum_r q_r e^(2 (m_r - M)) / S^2 with (M, S) merged from the
 * combined records exactly as head_finalize_kernel does, and the ranks' lists merged by rank
 * (each entry's position = the entries of every list that beat it, by binary search), log-prob
 * z - lse with the lse the row's stats hold (the number logprob gives for the same id).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "comm/comm.h"
#include "cuda/head.cuh"
#include "cuda/head_math.cuh"

#define XT 256              /* threads per row */
#define XS 2048             /* sort size: the list (XK) + the candidate buffer */
#define XK SPH_HEAD_TOPK_MAX /* list capacity (K <= 256) */

/* Better: larger z, then the lower id; empty (id < 0) is worst. */
__device__ __forceinline__ bool x_better(float za, int ia, float zb, int ib) {
    if (ib < 0) return ia >= 0;
    if (ia < 0) return false;
    return za > zb || (za == zb && ia < ib);
}

/* Sorts sz/sid[0 .. XS) best first (bitonic, in shared memory). */
__device__ void x_sort(float *sz, int *sid) {
    for (int k = 2; k <= XS; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int t = threadIdx.x; t < XS; t += XT) {
                const int u = t ^ j;
                if (u <= t) continue;
                const bool first = (t & k) == 0; /* this block sorts best first */
                const bool sw = first ? x_better(sz[u], sid[u], sz[t], sid[t])
                                      : x_better(sz[t], sid[t], sz[u], sid[u]);
                if (sw) {
                    const float z = sz[t];
                    const int d = sid[t];
                    sz[t] = sz[u], sid[t] = sid[u];
                    sz[u] = z, sid[u] = d;
                }
            }
            __syncthreads();
        }
}

struct x_args {
    const float *L;
    int64_t ldL, w, r0;
    const int64_t *rowmap; /* chunk row r is global row rowmap[r] or r0 + r */
    const float *trows;    /* per-row temperatures (plan.h temp_rows) or NULL: inv_t */
    int col_g0; /* global id of the split's column 0 */
    float inv_t, cap, inv_cap;
    float2 *mq;   /* (m, q) per chunk row (the chunk's slice), or NULL */
    sph_cuda_xtk *tk; /* K entries per chunk row, or NULL */
    int K, merge;
};

__global__ void __launch_bounds__(XT) head_extras_kernel(x_args a) {
    const int64_t r = blockIdx.x, i = a.rowmap ? a.rowmap[r] : a.r0 + r;
    const float *row = a.L + r * a.ldL;
    const float inv_t = row_inv_t(a.trows, i, a.inv_t); /* the row's 1 / T, as the stats' */
    __shared__ float sz[XS];
    __shared__ int sid[XS];
    __shared__ int ncand;
    __shared__ float red_m[XT / 32], red_q[XT / 32];
    const int K = a.K;
    float thr = 0.f;
    int thr_id = -1; /* the K-th entry; -1: the list is not full (everything enters) */
    if (K) {
        for (int t = threadIdx.x; t < XS; t += XT) {
            const bool seed = a.merge && t < K;
            sz[t] = seed ? a.tk[r * K + t].z : -INFINITY;
            sid[t] = seed ? a.tk[r * K + t].id : -1;
        }
        if (threadIdx.x == 0) ncand = 0;
        __syncthreads();
        thr = sz[K - 1], thr_id = sid[K - 1];
    }
    float m = -INFINITY, q = 0.f;
    const int cap_c = XS - XK; /* candidate slots */
    for (int64_t base = 0; base < a.w; base += 4 * XT) {
        if (K) {
            /* room for a whole tile of candidates, else merge first (every thread reads the
             * count before any adds to it) */
            const int nc = ncand;
            __syncthreads();
            if (nc > cap_c - 4 * XT) {
                x_sort(sz, sid);
                for (int t = K + threadIdx.x; t < XS; t += XT) sz[t] = -INFINITY, sid[t] = -1;
                __syncthreads();
                if (threadIdx.x == 0) ncand = 0;
                thr = sz[K - 1], thr_id = sid[K - 1];
                __syncthreads();
            }
        }
        for (int e = 0; e < 4; e++) {
            const int64_t c = base + e * XT + threadIdx.x; /* coalesced per e */
            if (c >= a.w) break;
            const float z = transform(row[c], inv_t, a.cap, a.inv_cap);
            if (a.mq) { /* online (m, q); NaN makes q NaN (the row is non-finite anyway) */
                if (z > m) {
                    q = q * expf(2.f * (m - z)) + 1.f;
                    m = z;
                } else {
                    q += expf(2.f * (z - m));
                }
            }
            const int id = a.col_g0 + (int)c;
            if (K && z == z && (thr_id < 0 || z > thr || (z == thr && id < thr_id))) {
                const int pos = atomicAdd(&ncand, 1);
                sz[XK + pos] = z, sid[XK + pos] = id;
            }
        }
        if (K) __syncthreads(); /* the tile's candidates, before the room check */
    }
    if (K) {
        if (ncand > 0) x_sort(sz, sid); /* ncand is uniform here (after the barrier) */
        for (int t = threadIdx.x; t < K; t += XT) {
            a.tk[r * K + t].z = sz[t];
            a.tk[r * K + t].id = sid[t];
        }
    }
    if (!a.mq) return;
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const float q2 = __shfl_xor_sync(0xffffffffu, q, o);
        mq_merge(m, q, m2, q2);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) red_m[warp] = m, red_q[warp] = q;
    __syncthreads();
    if (threadIdx.x != 0) return;
    m = red_m[0], q = red_q[0];
    for (int k = 1; k < XT / 32; k++) mq_merge(m, q, red_m[k], red_q[k]);
    if (a.merge) {
        float pm = a.mq[r].x, pq = a.mq[r].y;
        mq_merge(pm, pq, m, q);
        m = pm, q = pq;
    }
    a.mq[r] = make_float2(m, q);
}

/* The ranks' (m, q) and lists of rows [0, rows) (rank r's at + r * rank_stride rows) into the
 * outputs of rows rowmap[k] or r0 + k, after head_finalize_kernel wrote their stats. */
struct xf_args {
    const float *recs; /* the combined records (rank r's at + r * rank_stride * FIELDS) */
    const float2 *mq;
    const sph_cuda_xtk *tk;
    int64_t rank_stride, r0, rows;
    const int64_t *rowmap;
    int comm_size, K;
    const uint8_t *mask;
    const float *stats;
    float *sum_p2;
    int64_t *ids;
    int64_t ld_ti;
    float *lp;
    int64_t ld_tl;
};

__global__ void __launch_bounds__(XT) head_extras_finalize_kernel(xf_args a) {
    const int64_t k = blockIdx.x, i = a.rowmap ? a.rowmap[k] : a.r0 + k;
    const bool active = !a.mask || a.mask[i];
    if (a.sum_p2 && threadIdx.x == 0) {
        float m = -INFINITY, s = 0.f, b = 0.f, Q = 0.f;
        for (int r = 0; r < a.comm_size; r++) {
            const float *rec = a.recs + (r * a.rank_stride + k) * SPH_PARTIAL_FIELDS;
            merge3(m, s, b, rec[0], rec[1], rec[2]); /* as head_finalize_kernel */
        }
        for (int r = 0; r < a.comm_size; r++) {
            const float2 x = a.mq[r * a.rank_stride + k];
            if (x.y != 0.f || x.y != x.y) Q += x.y * expf(2.f * (x.x - m));
        }
        /* a support row with no candidate in any shard (S = 0) is empty: 0, as on the host */
        a.sum_p2[i] = active && !(m == -INFINITY && s == 0.f) ? Q / (s * s) : 0.f;
    }
    if (!a.K) return;
    const int K = a.K;
    int64_t *ids = a.ids + i * a.ld_ti;
    float *lp = a.lp + i * a.ld_tl;
    if (!active) {
        for (int t = threadIdx.x; t < K; t += XT) ids[t] = -1, lp[t] = 0.f;
        return;
    }
    const float lse = a.stats[i * 3 + 1];
    /* entry (r, e): its place is e plus, in every other list, the entries that beat it */
    for (int t = threadIdx.x; t < a.comm_size * K; t += XT) {
        const int r = t / K, e = t % K;
        const sph_cuda_xtk x = a.tk[(r * a.rank_stride + k) * K + e];
        if (x.id < 0) continue;
        int pos = e;
        for (int o = 0; o < a.comm_size && pos < K; o++) {
            if (o == r) continue;
            const sph_cuda_xtk *l = a.tk + (o * a.rank_stride + k) * K;
            int lo = 0, hi = K; /* the first entry of l that x beats */
            while (lo < hi) {
                const int mid = (lo + hi) / 2;
                if (x_better(x.z, x.id, l[mid].z, l[mid].id)) hi = mid;
                else lo = mid + 1;
            }
            pos += lo;
        }
        if (pos < K) ids[pos] = x.id, lp[pos] = x.z - lse;
    }
}

__global__ void head_extras_zero_kernel(int64_t N, int K, float *sum_p2, int64_t *ids,
                                        int64_t ld_ti, float *lp, int64_t ld_tl) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t i = K ? t / K : t, e = K ? t % K : 0;
    if (i >= N) return;
    if (sum_p2 && e == 0) sum_p2[i] = 0.f;
    if (K) ids[i * ld_ti + e] = -1, lp[i * ld_tl + e] = 0.f;
}

// ---- launchers -------------------------------------------------------------------------------

sph_status sph_cuda_extras_zero(const sph_head_plan *p, cudaStream_t stream) {
    const int64_t K = p->topk, n = p->N * (K ? K : 1);
    if (n <= 0) return SPH_OK;
    head_extras_zero_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(
        p->N, (int)K, p->sum_p2, p->topk_ids, p->ld_ti, p->topk_lp, p->ld_tl);
    SPH_LAUNCH_CHECK("head_extras_zero_kernel", stream);
    return SPH_OK;
}

sph_status sph_cuda_extras_split(pass_ctx *c, const float *L, const chunk *ch, int64_t c0,
                                 int64_t w, int merge) {
    const sph_head_plan *p = c->p;
    if (ch->rows <= 0) return SPH_OK;
    x_args a;
    memset(&a, 0, sizeof a);
    a.L = L;
    a.ldL = c->lay->ldL;
    a.w = w;
    a.r0 = ch->r0;
    a.rowmap = ch->rowmap;
    a.trows = p->temp_rows;
    a.col_g0 = (int)(p->v0 + c0);
    a.inv_t = (float)(1.0 / p->temperature);
    a.cap = (float)p->softcap;
    a.inv_cap = p->softcap > 0 ? (float)(1.0 / p->softcap) : 0.f;
    a.mq = p->sum_p2 ? (float2 *)(c->ws + c->lay->off_xmq) + ch->k0 : NULL;
    a.tk = p->topk ? (sph_cuda_xtk *)(c->ws + c->lay->off_xtk) + ch->k0 * p->topk : NULL;
    a.K = (int)p->topk;
    a.merge = merge;
    head_extras_kernel<<<(unsigned)ch->rows, XT, 0, c->stream>>>(a);
    SPH_LAUNCH_CHECK("head_extras_kernel", c->stream);
    return SPH_OK;
}

sph_status sph_cuda_extras_combine(pass_ctx *c, int64_t k0, int64_t rows, const float2 **mq,
                                   const sph_cuda_xtk **tk) {
    const sph_head_plan *p = c->p;
    const sph_cuda_layout *lay = c->lay;
    const int64_t K = p->topk;
    float2 *m0 = (float2 *)(c->ws + lay->off_xmq) + k0;
    sph_cuda_xtk *t0 = (sph_cuda_xtk *)(c->ws + lay->off_xtk) + k0 * K;
    *mq = m0, *tk = t0;
    if (lay->comm_size <= 1 || rows <= 0) return SPH_OK;
    /* rank r's rows at r * rows of the receive buffers */
    if (p->sum_p2) {
        sph_status s = p->comm->ops->allgather(p->comm, m0, c->ws + lay->off_xmq_recv,
                                               (size_t)rows * sizeof(float2), c->stream);
        if (s != SPH_OK) return sph_err_prefix(s, "head: TP combine of sum_p2: ");
        *mq = (const float2 *)(c->ws + lay->off_xmq_recv);
    }
    if (K) {
        sph_status s = p->comm->ops->allgather(p->comm, t0, c->ws + lay->off_xtk_recv,
                                               (size_t)(rows * K) * sizeof(sph_cuda_xtk),
                                               c->stream);
        if (s != SPH_OK) return sph_err_prefix(s, "head: TP combine of topk: ");
        *tk = (const sph_cuda_xtk *)(c->ws + lay->off_xtk_recv);
    }
    return SPH_OK;
}

sph_status sph_cuda_extras_finalize(pass_ctx *c, const float *rec0, const float2 *mq0,
                                    const sph_cuda_xtk *tk0, int64_t rank_stride, int64_t r0,
                                    const int64_t *rowmap, int64_t rows) {
    const sph_head_plan *p = c->p;
    if (rows <= 0) return SPH_OK;
    xf_args a;
    memset(&a, 0, sizeof a);
    a.recs = rec0;
    a.mq = mq0;
    a.tk = tk0;
    a.rank_stride = rank_stride;
    a.r0 = r0;
    a.rows = rows;
    a.rowmap = rowmap;
    a.comm_size = (int)(c->lay->comm_size > 1 ? c->lay->comm_size : 1);
    a.K = (int)p->topk;
    a.mask = p->mask;
    a.stats = p->stats;
    a.sum_p2 = p->sum_p2;
    a.ids = p->topk_ids;
    a.ld_ti = p->ld_ti;
    a.lp = p->topk_lp;
    a.ld_tl = p->ld_tl;
    head_extras_finalize_kernel<<<(unsigned)rows, XT, 0, c->stream>>>(a);
    SPH_LAUNCH_CHECK("head_extras_finalize_kernel", c->stream);
    return SPH_OK;
}
