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
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "comm/comm.h"
#include "cuda/head.cuh"
#include "cuda/head_math.cuh"
#include "cuda/head_sm90.cuh"

#define XT 256              /* threads per row */
#define XS 2048             /* sort size: the list (K entries) + the candidate buffer */
#define XK SPH_HEAD_TOPK_MAX /* list capacity (K <= 256) */

/* Better: larger z, then the lower id; empty (id < 0) is worst. */
__device__ __forceinline__ bool x_better(float za, int ia, float zb, int ib) {
    if (ib < 0) return ia >= 0;
    if (ia < 0) return false;
    return za > zb || (za == zb && ia < ib);
}

/* Sorts sz/sid[0 .. n) best first (bitonic, in shared memory; n a power of two), by `width`
 * threads of which this is thread t0, sync() between the steps (the block's barrier, or the
 * warp's for a warp's own list). */
template <typename Sync>
__device__ __forceinline__ void x_bitonic(float *sz, int *sid, int n, int t0, int width,
                                          Sync sync) {
    for (int k = 2; k <= n; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int t = t0; t < n; t += width) {
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
            sync();
        }
}
/* n <= XS, by the whole block */
__device__ void x_sort_n(float *sz, int *sid, int n) {
    x_bitonic(sz, sid, n, threadIdx.x, XT, [] { __syncthreads(); });
}
__device__ void x_sort(float *sz, int *sid) { x_sort_n(sz, sid, XS); }

/* A warp's n (32 or 64) entries sorted best first in registers: entry 32 q + lane in z[q] /
 * d[q] (q < n / 32; the other slot is left alone). The bitonic network of x_bitonic: partners
 * j < 32 apart by shuffles, 32 apart within the lane. */
__device__ __forceinline__ void x_bitonic_warp(float (&z)[2], int (&d)[2], int n, int ln) {
    for (int k = 2; k <= n; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            if (j == 32) { /* k = 64: one best-first block, slot 0 the lower entry */
                if (x_better(z[1], d[1], z[0], d[0])) {
                    const float t = z[0];
                    const int u = d[0];
                    z[0] = z[1], d[0] = d[1], z[1] = t, d[1] = u;
                }
                continue;
            }
#pragma unroll
            for (int q = 0; q < 2; q++) {
                if (32 * q >= n) break;
                const int e = 32 * q + ln;
                const float pz = __shfl_xor_sync(0xffffffffu, z[q], j);
                const int pd = __shfl_xor_sync(0xffffffffu, d[q], j);
                /* the lower entry of a best-first block keeps the better, as the upper of the
                 * other kind; the two partners agree (x_better is a strict order on distinct
                 * ids, and both empty entries are alike) */
                const bool keep_better = ((e & j) == 0) == ((e & k) == 0);
                const bool pb = x_better(pz, pd, z[q], d[q]);
                if (keep_better ? pb : !pb) z[q] = pz, d[q] = pd;
            }
        }
}

/* The K-best list of one row in shared memory (sz / sid: the list in [0, K), candidates in
 * [K, XS)), used by every thread of the block: xl_begin, then per batch of at most `need`
 * offers xl_room, the offers, a barrier; xl_end sorts and writes the K entries. */
struct x_list {
    float *sz;
    int *sid;
    int *ncand;
    float thr;
    int thr_id; /* the K-th entry; -1: the list is not full (everything enters) */
    int K;
};

__device__ void xl_begin(x_list &l, const sph_cuda_xtk *seed) {
    for (int t = threadIdx.x; t < XS; t += XT) {
        const bool in = seed && t < l.K;
        l.sz[t] = in ? seed[t].z : -INFINITY;
        l.sid[t] = in ? seed[t].id : -1;
    }
    if (threadIdx.x == 0) *l.ncand = 0;
    __syncthreads();
    l.thr = l.sz[l.K - 1], l.thr_id = l.sid[l.K - 1];
}

/* Room for `need` more candidates, else the list and the candidates merged first (every
 * thread reads the count before any adds to it). */
__device__ void xl_room(x_list &l, int need) {
    const int nc = *l.ncand;
    __syncthreads();
    if (nc > XS - l.K - need) {
        x_sort(l.sz, l.sid);
        for (int t = l.K + threadIdx.x; t < XS; t += XT) l.sz[t] = -INFINITY, l.sid[t] = -1;
        __syncthreads();
        if (threadIdx.x == 0) *l.ncand = 0;
        l.thr = l.sz[l.K - 1], l.thr_id = l.sid[l.K - 1];
        __syncthreads();
    }
}

/* z enters the candidates when it beats the list's K-th entry (NaN never). */
__device__ __forceinline__ void xl_offer(x_list &l, float z, int id) {
    if (z == z && (l.thr_id < 0 || z > l.thr || (z == l.thr && id < l.thr_id))) {
        const int pos = atomicAdd(l.ncand, 1);
        l.sz[l.K + pos] = z, l.sid[l.K + pos] = id;
    }
}

/* After the last batch's barrier: the K best to out (ncand is uniform here). */
__device__ void xl_end(x_list &l, sph_cuda_xtk *out) {
    if (*l.ncand > 0) x_sort(l.sz, l.sid);
    for (int t = threadIdx.x; t < l.K; t += XT) {
        out[t].z = l.sz[t];
        out[t].id = l.sid[t];
    }
}

#define X_LIST_SHARED(l, K_)                                                                  \
    __shared__ float l##_sz[XS];                                                              \
    __shared__ int l##_sid[XS];                                                               \
    __shared__ int l##_n;                                                                     \
    x_list l;                                                                                 \
    l.sz = l##_sz, l.sid = l##_sid, l.ncand = &l##_n, l.K = (K_), l.thr = 0.f, l.thr_id = -1

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
    __shared__ float red_m[XT / 32], red_q[XT / 32];
    const int K = a.K;
    X_LIST_SHARED(l, K ? K : 1);
    if (K) xl_begin(l, a.merge ? a.tk + r * K : NULL);
    float m = -INFINITY, q = 0.f;
    for (int64_t base = 0; base < a.w; base += 4 * XT) {
        if (K) xl_room(l, 4 * XT);
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
            if (K) xl_offer(l, z, a.col_g0 + (int)c);
        }
        if (K) __syncthreads(); /* the batch's candidates, before the room check */
    }
    if (K) xl_end(l, a.tk + r * K);
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

/* ---- the fused top-k (not EXTRAS_STAGED): the sm_90a statistics epilogue's candidates -
 * Per chunk row: the epilogue (head_sm90.cu epi_topk_*) appends every logit z >= the row's
 * threshold to the row's candidate buffer, raises one of the row's slots per thread and tile
 * to its largest candidate (slot (4 tile + quad lane) mod ks; per candidate, slot (split
 * column mod ks), where a thread emits from its registers) and, now and then, the threshold
 * to a value K of the slots reach: each slot holds one column's logit, no two the same
 * column, so at least K of the row's logits are >= it and the threshold never passes the
 * row's K-th largest logit; every logit of the top K is a candidate. Before split 0 the
 * thresholds may be seeded from a sample (below). After each split, head_topk_merge_kernel
 * folds the candidates into the row's list (seeded with the earlier splits' list) exactly as
 * the staged kernel does, empties the buffer and raises the threshold to the list's K-th
 * entry. A row whose candidates overflowed the buffer (count > cap) recomputes instead the
 * logits of the split's tiles whose maximum (the tile record's m) reaches the threshold
 * (every other tile's logits are below the K-th largest), one column per thread, fp32 dot
 * products: slow, and only for rows the threshold could not prune (e.g. logits increasing
 * along the vocabulary), and never reads its buffer (the epilogue clamps an overflowing
 * row's stores to its last entry); a row with fewer than K candidates after a seed (the
 * seed was too high) recomputes every tile. */
__global__ void head_topk_reset_kernel(int64_t rows, int ks, int *n, int *tau, int *slots) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows * ks) return;
    const int ninf = sph_tk_enc(-INFINITY);
    slots[t] = ninf;
    if (t % ks == 0) n[t / ks] = 0, tau[t / ks] = ninf;
}

struct tkm_args {
    const sph_cuda_xtk *cand;
    int *n, *tau;
    const int *slots; /* ks per chunk row (the epilogue's slots, head_sm90.cuh) */
    int ks;
    sph_cuda_xtk *tk; /* K entries per chunk row (the chunk's slice) */
    int K, cap, merge;
    int seeded; /* the split's thresholds were seeded: fewer than K candidates = a seed too high */
    int variant; /* the A/B bits (state.h topk_variant): 16 = v31's warp merge */
    int *diag;   /* tests and tuning (SPH_TEST_TOPK_COUNT=1) or NULL: rows the warps merged
                    without / with a compaction, rows the block merged (a recompute; more
                    entries or ties than a warp holds) */
    int64_t rows; /* the chunk's */
    /* the overflow's recompute: the split's tile records, h rows, W columns */
    const float *tile_recs;
    int64_t n_tiles, w, H, ld_h, ld_w, r0;
    const void *hp, *wp;
    const int64_t *rowmap;
    const float *trows;
    int col_g0;
    float inv_t, cap_s, inv_cap;
};

/* sum of the 8 products of two 16-byte vectors of bf16 / f16 pairs, in fp32 */
__device__ __forceinline__ float2 pair_f32(__nv_bfloat162 x) { return __bfloat1622float2(x); }
__device__ __forceinline__ float2 pair_f32(__half2 x) { return __half22float2(x); }
template <typename T2> __device__ __forceinline__ float dot8(uint4 a, uint4 b) {
    const T2 *x = (const T2 *)&a, *y = (const T2 *)&b;
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 u = pair_f32(x[k]), v = pair_f32(y[k]);
        s = fmaf(u.x, v.x, s);
        s = fmaf(u.y, v.y, s);
    }
    return s;
}

/* The K best of a row's n candidates and its earlier list (seed, K entries, or NULL) into l,
 * by radix selection: the entries whose ordered key reaches thr (a lower bound of the row's
 * K-th largest: no entry of the list's K is below it) are packed into shared memory (key and
 * id: z is the key's inverse), then four 8-bit histogram passes over their keys find the K-th
 * largest z (T); the entries with z >= T (K plus the ties at T, as a rule) are gathered and
 * sorted (a bitonic sort of the next power of two), so the list is the staged kernel's: z
 * descending, equal z the lower id. NaN and empty (id < 0) entries never enter. More than XH
 * entries reach thr: the passes read the buffer instead. More than XS - K entries at T
 * (massive ties): the batched merge of xl_room / xl_offer. Leaves l's list in l.sz / l.sid
 * [0, K) and *l.ncand 0. su: XC words of shared memory. */
#define XC 4096
#define XH (XC / 2) /* packed entries: keys in su[0, XH), ids in su[XH, XC) */
__device__ __forceinline__ unsigned tk_key(float z) {
    return (unsigned)sph_tk_enc(z) ^ 0x80000000u; /* unsigned order = float order */
}
__device__ __forceinline__ float tk_key_z(unsigned u) {
    return sph_tk_dec((int)(u ^ 0x80000000u)); /* tk_key's inverse, bit for bit */
}
__device__ void tk_select(x_list &l, unsigned *su, const sph_cuda_xtk *cand, int n,
                          const sph_cuda_xtk *seed, unsigned thr) {
    __shared__ unsigned hist[256];
    __shared__ int bin_s, need_s, cnt_s, m_s;
    const int K = l.K, m0 = n + (seed ? K : 0);
    /* entry e: a candidate (e < n) or the seed's entry e - n; key 0 = never (NaN, empty,
     * below thr; -inf's key is 0x007fffff > 0) */
    auto load = [&](int e, float &z, int &id) {
        const sph_cuda_xtk x = e < n ? cand[e] : seed[e - n];
        z = x.z, id = x.id;
    };
    auto key0 = [&](int e) -> unsigned {
        float z;
        int id;
        load(e, z, id);
        const unsigned u = id >= 0 && z == z ? tk_key(z) : 0u;
        return u >= thr ? u : 0u;
    };
    /* pack the entries that reach thr (warp-aggregated places; their order is immaterial: the
     * list's order is total) */
    if (threadIdx.x == 0) m_s = 0;
    __syncthreads();
    for (int e0 = 0; e0 < m0; e0 += XT) {
        const int e = e0 + threadIdx.x, ln = threadIdx.x & 31;
        float z = 0.f;
        int id = -1;
        unsigned u = 0;
        if (e < m0) {
            load(e, z, id);
            u = id >= 0 && z == z ? tk_key(z) : 0u;
            if (u < thr) u = 0;
        }
        const unsigned b = __ballot_sync(0xffffffffu, u != 0);
        int base = 0;
        if (ln == 0 && b) base = atomicAdd(&m_s, __popc(b));
        base = __shfl_sync(0xffffffffu, base, 0);
        const int pos = base + __popc(b & ((1u << ln) - 1u));
        if (u && pos < XH) su[pos] = u, su[XH + pos] = (unsigned)id;
    }
    __syncthreads();
    const bool packed = m_s <= XH;
    const int m = packed ? m_s : m0;
    auto key_of = [&](int e) -> unsigned { return packed ? su[e] : key0(e); };
    auto entry = [&](int e, float &z, int &id) {
        if (packed) z = tk_key_z(su[e]), id = (int)su[XH + e];
        else load(e, z, id);
    };
    unsigned prefix = 0, mask = 0;
    int need = K;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += XT) hist[b] = 0;
        __syncthreads();
        /* every thread runs the loop's rounds (the shuffles below take the whole warp) */
        for (int e0 = 0; e0 < m; e0 += XT) {
            const int e = e0 + threadIdx.x;
            const unsigned u = e < m ? key_of(e) : 0u;
            const bool in = u && (u & mask) == prefix;
            /* the keys share their top bits: one atomic per distinct bin and warp, not per key */
            const unsigned bin = in ? (u >> shift) & 255u : 256u;
            const unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (in && (threadIdx.x & 31) == __ffs(peers) - 1)
                atomicAdd(&hist[bin], (unsigned)__popc(peers));
        }
        __syncthreads();
        /* the bin holding the need-th largest key, from the top: warp 0, 8 bins per lane
         * (lane 0 the highest), a scan over the lanes; no bin reaches it (fewer than K
         * entries in all): bin 0 with need > 0 left */
        if (threadIdx.x < 32) {
            const int ln = threadIdx.x;
            int h[8], s8 = 0;
#pragma unroll
            for (int q = 0; q < 8; q++) h[q] = (int)hist[255 - 8 * ln - q], s8 += h[q];
            int inc = s8;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int y = __shfl_up_sync(0xffffffffu, inc, o);
                if (ln >= o) inc += y;
            }
            const unsigned hit = __ballot_sync(0xffffffffu, inc >= need);
            if (!hit) {
                if (ln == 31) bin_s = 0, need_s = need - (inc - h[7]);
            } else if (ln == __ffs(hit) - 1) {
                int acc = inc - s8, q = 0;
                for (; q < 7; q++) {
                    if (acc + h[q] >= need) break;
                    acc += h[q];
                }
                bin_s = 255 - 8 * ln - q, need_s = need - acc;
            }
        }
        __syncthreads();
        prefix |= (unsigned)bin_s << shift, mask |= 0xffu << shift, need = need_s;
        __syncthreads(); /* bin_s / need_s read before the next pass's warp 0 writes them */
    }
    /* T = prefix (or, with fewer than K valid entries, a lower bound of them all) */
    const unsigned T = prefix;
    if (threadIdx.x == 0) cnt_s = 0;
    __syncthreads();
    for (int e = threadIdx.x; e < m; e += XT) {
        const unsigned u = key_of(e);
        if (u && u >= T) atomicAdd(&cnt_s, 1);
    }
    __syncthreads();
    const int c = cnt_s;
    if (c <= XS) {
        if (threadIdx.x == 0) *l.ncand = 0;
        __syncthreads();
        for (int e = threadIdx.x; e < m; e += XT) {
            const unsigned u = key_of(e);
            if (u && u >= T) {
                float z;
                int id;
                entry(e, z, id);
                const int pos = atomicAdd(l.ncand, 1);
                l.sz[pos] = z, l.sid[pos] = id;
            }
        }
        int n2 = 1;
        while (n2 < c || n2 < K) n2 <<= 1;
        __syncthreads();
        for (int t = c + threadIdx.x; t < n2; t += XT) l.sz[t] = -INFINITY, l.sid[t] = -1;
        __syncthreads();
        x_sort_n(l.sz, l.sid, n2);
        if (threadIdx.x == 0) *l.ncand = 0;
        __syncthreads();
        return;
    }
    /* massive ties: the batched merge over every entry that reaches thr */
    for (int base = 0; base < m; base += 4 * XT) {
        xl_room(l, 4 * XT);
        for (int q = 0; q < 4; q++) {
            const int e = base + q * XT + threadIdx.x;
            if (e >= m) break;
            if (!key_of(e)) continue;
            float z;
            int id;
            entry(e, z, id);
            xl_offer(l, z, id);
        }
        __syncthreads();
    }
    if (*l.ncand > 0) x_sort(l.sz, l.sid);
    __syncthreads();
    if (threadIdx.x == 0) *l.ncand = 0;
    __syncthreads();
}

/* One row of the merge by one warp (K <= XW_K, the usual case; run 32: the block per row
 * waited on its barriers, 0.39 ms per 16K rows at A): the entries that reach thr (as in
 * tk_select: the final threshold or the slots' minimum, ~5 K of them) packed into the warp's
 * wb (XW_CAP keys, then XW_CAP ids), the K-th largest key T found bit by bit (each lane holds
 * up to XW_CAP / 32 keys in registers: 32 warp-wide counts), the entries >= T (K plus ties)
 * gathered and bitonic-sorted in place (z descending, equal z the lower id), the K best
 * written: the list tk_select makes from the same entries. False, with nothing written,
 * for a row the block has to merge (head_topk_merge_kernel's second phase): a recompute
 * (overflow, seed too high), more than XW_CAP entries reaching thr, or more than XW_CAP at
 * or above T (ties). */
#define XW_WARPS (XT / 32)
#define XW_CAP 512
#define XW_K 64
static_assert(XW_WARPS * 2 * XW_CAP == 2 * XS + XC, "the warp phase's buffers alias the block's");
/* The largest T that K of the warp's keys v[0 .. nw) (words, warp-uniform nw; 0: no key)
 * reach: their K-th largest; the caller sees that at least K keys are there. It lies in
 * [lo, hi], the keys' least and largest, so the bits above the highest one where lo and hi
 * differ are hi's (the bit-by-bit search from the top sets exactly those: each such bit of hi
 * keeps the trial <= lo, each 0 bit puts it past hi), and the search starts below them: ~12
 * of the 32 counts at A, where the candidates share their sign and exponent. */
/* The warp's keys v[0 .. nw) >= T (T >= 1; words past nw are not read) */
template <int W>
__device__ __forceinline__ int warp_count_ge(const unsigned (&v)[W], int nw, unsigned T) {
    int c = 0;
#pragma unroll
    for (int i = 0; i < W; i++) {
        if (i >= nw) break; /* nw is the warp's: ~K .. 300 keys, 2 .. 10 words */
        c += v[i] >= T;
    }
    return __reduce_add_sync(0xffffffffu, c);
}
template <int W>
__device__ __forceinline__ unsigned warp_kth(const unsigned (&v)[W], int nw, int K) {
    unsigned lo = 0xffffffffu, hi = 0u;
#pragma unroll
    for (int i = 0; i < W; i++)
        if (i < nw && v[i]) lo = min(lo, v[i]), hi = max(hi, v[i]);
    lo = __reduce_min_sync(0xffffffffu, lo);
    hi = __reduce_max_sync(0xffffffffu, hi);
    const unsigned d = lo ^ hi;
    const int p = d ? 31 - __clz((int)d) : -1;
    unsigned T = d ? hi & ~((2u << p) - 1u) : hi; /* p 31: 2u << 31 is 0, no common bit */
    for (int b = p; b >= 0; b--)
        if (warp_count_ge(v, nw, T | (1u << b)) >= K) T |= 1u << b;
    return T;
}

/* The warp's packed entries (keys u[0 .. nw), ids wid) that reach T, kept in order at the
 * front of keys / wid, in place: each place written is one already read (places <= 32 i +
 * lane, round i's ids read before its stores). Z: the keys stored as their z (float bits).
 * Returns their number. */
template <bool Z, int W>
__device__ __forceinline__ int tk_warp_keep(const unsigned (&u)[W], int nw, unsigned T,
                                            unsigned *keys, int *wid, int ln) {
    const unsigned lt = (1u << ln) - 1u;
    int base = 0;
#pragma unroll
    for (int i = 0; i < W; i++) {
        if (i >= nw) break;
        const bool p = u[i] >= T;
        const int id = p ? wid[32 * i + ln] : -1;
        const unsigned b = __ballot_sync(0xffffffffu, p);
        __syncwarp();
        if (p) {
            const int pos = base + __popc(b & lt);
            keys[pos] = Z ? __float_as_uint(tk_key_z(u[i])) : u[i], wid[pos] = id;
        }
        base += __popc(b);
    }
    return base;
}

/* The warp's c (<= 64) entries of sz / wid [0, c), the row's K best and their ties, sorted in
 * registers (entry 32 q + lane in slot q) into out [0, K); the K-th entry's (z, id) returned
 * in zk / dk (v32; run 37: the shared-memory sort was ~1/4 of the merge's instructions). */
__device__ __forceinline__ void tk_warp_sort_out(const float *sz, const int *wid, int c, int n2,
                                                 int K, int ln, sph_cuda_xtk *out, float &zk,
                                                 int &dk) {
    __syncwarp();
    float z[2];
    int d[2];
#pragma unroll
    for (int q = 0; q < 2; q++) {
        const int e = 32 * q + ln;
        z[q] = e < c ? sz[e] : -INFINITY, d[q] = e < c ? wid[e] : -1;
    }
    x_bitonic_warp(z, d, n2, ln);
#pragma unroll
    for (int q = 0; q < 2; q++)
        if (32 * q + ln < K) out[32 * q + ln].z = z[q], out[32 * q + ln].id = d[q];
    const int kq = (K - 1) / 32, kl = (K - 1) & 31;
    zk = __shfl_sync(0xffffffffu, kq ? z[1] : z[0], kl);
    dk = __shfl_sync(0xffffffffu, kq ? d[1] : d[0], kl);
}

__device__ bool tk_merge_warp(const tkm_args &a, unsigned *wb, int64_t r) {
    const int ln = threadIdx.x & 31, K = a.K;
    const unsigned lt = (1u << ln) - 1u;
    const int n = a.n[r];
    if (n > a.cap || (a.seeded && n < K)) {
        if (a.diag && ln == 0) atomicAdd(a.diag + 2, 1);
        return false;
    }
    unsigned *wk = wb;
    int *wid = (int *)(wb + XW_CAP);
    int mn = 0x7fffffff;
    for (int t = ln; t < a.ks; t += 32) mn = min(mn, a.slots[r * a.ks + t]);
    mn = __reduce_min_sync(0xffffffffu, mn);
    unsigned thr = (unsigned)max(a.tau[r], mn) ^ 0x80000000u;
    const sph_cuda_xtk *cand = a.cand + r * a.cap, *seed = a.merge ? a.tk + r * K : NULL;
    const int m0 = n + (seed ? K : 0);
    unsigned u[XW_CAP / 32]; /* packed keys, 0: no entry */
    auto load_u = [&](int cnt) {
#pragma unroll
        for (int i = 0; i < XW_CAP / 32; i++) u[i] = 32 * i + ln < cnt ? wk[32 * i + ln] : 0u;
    };
    /* the K-th largest of the cnt keys in u (fewer than K: 0) */
    auto kth = [&](int cnt) -> unsigned { return cnt < K ? 0u : warp_kth(u, (cnt + 31) / 32, K); };
    int cnt = 0; /* entries reaching thr (uniform) */
    bool compacted = false, full = false;
    /* four loads in flight per lane before their ballots (v32: one at a time before) */
    for (int e0 = 0; e0 < m0; e0 += 128) {
        unsigned u4[4];
        int id4[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int e = e0 + 32 * q + ln;
            u4[q] = 0u, id4[q] = -1;
            if (e < m0) {
                const sph_cuda_xtk x = e < n ? cand[e] : seed[e - n];
                id4[q] = x.id;
                u4[q] = x.id >= 0 && x.z == x.z ? tk_key(x.z) : 0u;
                if (u4[q] < thr) u4[q] = 0u;
            }
        }
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const unsigned b = __ballot_sync(0xffffffffu, u4[q] != 0u);
            const int pos = cnt + __popc(b & lt);
            if (u4[q] && pos < XW_CAP) wk[pos] = u4[q], wid[pos] = id4[q];
            cnt += __popc(b);
        }
        /* v32: before the next 128 could pass the buffer, the threshold raised to the K-th
         * largest packed key (K distinct entries reach it, so the row's K-th largest does:
         * every entry of the K best reaches it) and the buffer compacted in place (run 39:
         * rows past 512 entries went to the block merge). Still more than XW_CAP - 128 (ties
         * at it): the block merges the row. */
        if (cnt > XW_CAP - 128 && e0 + 128 < m0 && !(a.variant & 16)) {
            __syncwarp();
            load_u(cnt);
            const unsigned t2 = kth(cnt);
            if (t2 > thr) {
                thr = t2;
                cnt = tk_warp_keep<false>(u, (cnt + 31) / 32, thr, wk, wid, ln);
                compacted = true;
                __syncwarp();
            }
            if (cnt > XW_CAP - 128) {
                full = true;
                break;
            }
        }
        if (cnt > XW_CAP) break;
    }
    if (full || cnt > XW_CAP) {
        if (a.diag && ln == 0) atomicAdd(a.diag + 3, 1);
        return false;
    }
    __syncwarp();
    load_u(cnt);
    const unsigned T = max(kth(cnt), 1u);
    const int c = warp_count_ge(u, (cnt + 31) / 32, T);
    int n2 = 32;
    while (n2 < c || n2 < K) n2 <<= 1;
    if (n2 > XW_CAP) { /* ties at T */
        if (a.diag && ln == 0) atomicAdd(a.diag + 3, 1);
        return false;
    }
    if (a.diag && ln == 0) atomicAdd(a.diag + (compacted ? 1 : 0), 1);
    /* z (as bits) and id of the keys >= T into [0, c) */
    tk_warp_keep<true>(u, (cnt + 31) / 32, T, wk, wid, ln);
    float *sz = (float *)wk;
    sph_cuda_xtk *out = a.tk + r * K;
    if (n2 <= 64 && !(a.variant & 16)) { /* the usual 32 or 64 entries */
        float zk;
        int dk;
        tk_warp_sort_out(sz, wid, c, n2, K, ln, out, zk, dk);
        if (ln == 0) {
            a.n[r] = 0;
            if (dk >= 0) atomicMax(a.tau + r, sph_tk_enc(zk));
        }
        return true;
    }
    for (int t = c + ln; t < n2; t += 32) sz[t] = -INFINITY, wid[t] = -1;
    __syncwarp();
    x_bitonic(sz, wid, n2, ln, 32, [] { __syncwarp(); });
    for (int t = ln; t < K; t += 32) out[t].z = sz[t], out[t].id = wid[t];
    if (ln == 0) {
        a.n[r] = 0;
        if (wid[K - 1] >= 0) atomicMax(a.tau + r, sph_tk_enc(sz[K - 1]));
    }
    return true;
}

/* One row of the merge by the whole block (sb: the block's 2 XS + XC words). T2: the
 * operands' element pair (__nv_bfloat162, __half2), for the overflow's recompute. */
template <typename T2> __device__ void tk_merge_row(const tkm_args &a, unsigned *sb, int64_t r) {
    const int K = a.K;
    __shared__ int l_n;
    x_list l;
    l.sz = (float *)sb, l.sid = (int *)(sb + XS), l.ncand = &l_n, l.K = K, l.thr = 0.f;
    l.thr_id = -1;
    unsigned *su = sb + 2 * XS;
    const int n = a.n[r];
    /* recompute: the row overflowed its buffer, or its seed was above its K-th largest logit
     * (a threshold that never passes it leaves at least K candidates; the split is wider than
     * K where there is a seed), then from no threshold at all */
    const bool low = a.seeded && n < K, redo = n > a.cap || low;
    xl_begin(l, a.merge && redo ? a.tk + r * K : NULL);
    if (!redo) {
        /* a lower bound of the row's K-th largest logit so far: its final threshold, or the
         * minimum of its slots if higher (ks >= K slots, each one column's logit, no two the
         * same column: at least K logits reach it); every entry of the K best reaches it */
        __shared__ int smin[XT / 32];
        int mn = 0x7fffffff;
        for (int t = threadIdx.x; t < a.ks; t += XT) mn = min(mn, a.slots[r * a.ks + t]);
        mn = __reduce_min_sync(0xffffffffu, mn);
        if ((threadIdx.x & 31) == 0) smin[threadIdx.x / 32] = mn;
        __syncthreads();
        int sm = smin[0];
        for (int w = 1; w < XT / 32; w++) sm = min(sm, smin[w]);
        const int thr = max(a.tau[r], sm);
        tk_select(l, su, a.cand + r * a.cap, n, a.merge ? a.tk + r * K : NULL,
                  (unsigned)thr ^ 0x80000000u);
    } else {
        const int64_t i = a.rowmap ? a.rowmap[r] : a.r0 + r;
        const float it = row_inv_t(a.trows, i, a.inv_t);
        const float tau = low ? -INFINITY : sph_tk_dec(a.tau[r]);
        const uint4 *h = (const uint4 *)((const char *)a.hp + r * a.ld_h * 2);
        for (int64_t t = 0; t < a.n_tiles; t++) {
            const float mx = a.tile_recs[(r * a.n_tiles + t) * SPH_PARTIAL_FIELDS];
            if (!(mx >= tau)) continue; /* block-uniform */
            xl_room(l, XT);
            const int64_t c = t * SPH_SM90_TILE_N + threadIdx.x;
            if (c < a.w) {
                const uint4 *wr = (const uint4 *)((const char *)a.wp + c * a.ld_w * 2);
                float acc = 0.f;
                for (int64_t k = 0; k < a.H / 8; k++) acc += dot8<T2>(__ldg(h + k), __ldg(wr + k));
                xl_offer(l, transform(acc, it, a.cap_s, a.inv_cap), a.col_g0 + (int)c);
            }
            __syncthreads();
        }
    }
    xl_end(l, a.tk + r * K);
    __syncthreads();
    if (threadIdx.x == 0) {
        a.n[r] = 0;
        if (low) a.tau[r] = sph_tk_enc(-INFINITY); /* the seed, too high, goes */
        if (l.sid[K - 1] >= 0) atomicMax(a.tau + r, sph_tk_enc(l.sz[K - 1]));
    }
}

/* ROWS 1: a block per row; ROWS XW_WARPS (K <= XW_K): a warp per row (tk_merge_warp), then
 * the block's rows the warps could not merge, one after the other by the whole block. */
template <typename T2, int ROWS>
__global__ void __launch_bounds__(XT) head_topk_merge_kernel(tkm_args a) {
    __shared__ __align__(16) unsigned sb[2 * XS + XC];
    if (ROWS == 1) {
        tk_merge_row<T2>(a, sb, blockIdx.x);
        return;
    }
    __shared__ int fl_rows[ROWS], fl_n;
    if (threadIdx.x == 0) fl_n = 0;
    __syncthreads();
    const int w = threadIdx.x / 32;
    const int64_t r = (int64_t)blockIdx.x * ROWS + w;
    if (r < a.rows && !tk_merge_warp(a, sb + w * 2 * XW_CAP, r) && (threadIdx.x & 31) == 0)
        fl_rows[atomicAdd(&fl_n, 1)] = w;
    __syncthreads(); /* the warps' buffers are the block path's */
    const int nf = fl_n;
    for (int f = 0; f < nf; f++) {
        tk_merge_row<T2>(a, sb, (int64_t)blockIdx.x * ROWS + fl_rows[f]);
        __syncthreads();
    }
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

/* A warp per row (v32: a block of XT per row before, 22 us per 16K rows at A for ~K entries). */
#define XF_ROWS (XT / 32)
__global__ void __launch_bounds__(XT) head_extras_finalize_kernel(xf_args a) {
    const int ln = threadIdx.x & 31;
    const int64_t k = (int64_t)blockIdx.x * XF_ROWS + threadIdx.x / 32;
    if (k >= a.rows) return; /* warp-uniform; no barriers below */
    const int64_t i = a.rowmap ? a.rowmap[k] : a.r0 + k;
    const bool active = !a.mask || a.mask[i];
    if (a.sum_p2 && ln == 0) {
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
        for (int t = ln; t < K; t += 32) ids[t] = -1, lp[t] = 0.f;
        return;
    }
    const float lse = a.stats[i * 3 + 1];
    /* entry (r, e): its place is e plus, in every other list, the entries that beat it */
    for (int t = ln; t < a.comm_size * K; t += 32) {
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
/* SPH_CUDA_EMU (tests/emu/cuda_emu.h): the kernels above and below compile as host code for the
 * CPU tests of tests/emu; the launchers (CUDA's launch syntax, the runtime) do not. */
#ifndef SPH_CUDA_EMU
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
    head_extras_finalize_kernel<<<(unsigned)((rows + XF_ROWS - 1) / XF_ROWS), XT, 0, c->stream>>>(a);
    SPH_LAUNCH_CHECK("head_extras_finalize_kernel", c->stream);
    return SPH_OK;
}
#endif /* SPH_CUDA_EMU */

/* ---- the fused top-k's seed: before split 0's statistics kernel, the rows' thresholds
 * from a strided sample of m of the split's columns (a thin cuBLAS GEMM into the candidate
 * buffer's memory): per row the K-th largest sample logit, less the rounding both products
 * may differ by, transformed. K of the row's logits are then >= it, so it is a threshold, as
 * long as the margin covers the difference between cuBLAS's and the wgmma kernel's value of
 * the same logit: both are fp32 sums of exact bf16 / f16 products, each within H u
 * sum_k |h_k w_k| <= H u |h| |w| of the exact dot product (u = 2^-24; twice that for the
 * tensor cores' truncating accumulation, and the two sides: 4 H u |h| max_j |w_j|). Nothing
 * rests on it: a row whose seed was too high has fewer than K candidates at the end of the
 * split, which the merge sees and recomputes (head_topk_merge_kernel), so the list is the
 * same with or without the seed. Without it the tiles a row has in flight before any
 * threshold (~2300 columns) emit every logit (run 30); with it ~m / 16 of them. */
#define SEED_T 128 /* threads per row of the seed kernel */
static int64_t topk_seed_cols(int64_t K) {
    int64_t k2 = 8;
    while (k2 < K) k2 *= 2;
    return k2 * 16 > 1024 ? k2 * 16 : 1024; /* K-th of m: the 1/16 quantile; m / 128 <= 32 */
}

/* The seed's rank s among the m samples (v24): the s-th largest sample logit is at most the
 * row's K-th largest unless s of the samples lie among the row's K - 1 largest logits. For a
 * row whose K - 1 largest sit at columns unrelated to the stride w / m, their number in the
 * sample is ~Poisson(lambda = (K - 1) m / w): s is the smallest rank with P(X >= s) <= 2^-30
 * (13 at K = 64, m = 1024, w = 62080, where s = K put the seed at the row's ~3900th largest
 * logit and ~16 candidates per row in each tile before the slots caught up; s = 13: ~800th).
 * Nothing rests on it: a seed above the K-th largest leaves fewer than K candidates, which the
 * merge recomputes (the contract test forces it: SPH_TEST_TOPK_SEED). legacy (the variant's
 * bit 2): s = K, v20's rank. */
static int topk_seed_rank(int64_t K, int64_t m, int64_t w, int legacy) {
    if (legacy) return (int)K;
    const double lam = (double)(K - 1) * (double)m / (double)w;
    double term = exp(-lam), tail = 1.0; /* tail = P(X >= s) */
    int s = 0;
    while (s < K) {
        tail -= term, s++;
        if (tail <= 0x1p-30) break;
        term *= lam / s;
    }
    return s;
}

/* max_j |w_j| over the m sampled columns (W rows at w + j stride ld_w), into *out (the float's
 * bits: non-negative floats order as unsigned ints; NaN, above every finite, poisons it). */
__global__ void head_topk_wnorm_kernel(const void *w, int kind, int64_t stride_ld, int64_t H,
                                       int m, unsigned *out) {
    const int j = (int)(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32), lane = threadIdx.x % 32;
    if (j >= m) return;
    float s = 0.f;
    const char *row = (const char *)w + (size_t)j * stride_ld * 2;
    if (H % 8 == 0 && ((uintptr_t)row & 15) == 0) { /* v32: 16-byte loads (10 us at A 16K) */
        const uint4 *r4 = (const uint4 *)row;
        for (int64_t k = lane; k < H / 8; k += 32) {
            const uint4 v = __ldg(r4 + k);
            s += kind == 1 ? dot8<__nv_bfloat162>(v, v) : dot8<__half2>(v, v);
        }
    } else {
        for (int64_t k = lane; k < H; k += 32) {
            const float x = load_kind(row, kind, k);
            s = fmaf(x, x, s);
        }
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) atomicMax(out, __float_as_uint(sqrtf(s)));
}

struct tks_args {
    const float *S; /* (rows, m) sample logits */
    int m, K, kind;
    int s; /* the seed's rank among the samples (topk_seed_rank) */
    const unsigned *wmax;
    const void *hp;
    int64_t ld_h, H, r0;
    const int64_t *rowmap;
    const float *trows;
    float inv_t, cap, inv_cap, bias;
    int *tau;
};

/* A row's seed from T (the s-th largest sample's ordered key, its top 24 bits; 0: fewer than
 * K ordered samples, no seed) and hh = |h_i|^2: less the margin, transformed, into tau[r].
 * A non-finite seed: none. */
__device__ void seed_store(const tks_args &a, int64_t r, int64_t i, unsigned T, float hh) {
    if (T == 0) return;
    const float zk = sph_tk_dec((int)(T ^ 0x80000000u)); /* <= the s-th largest sample */
    const float margin = 4.f * (float)a.H * 5.9604645e-8f * sqrtf(hh) * __uint_as_float(*a.wmax);
    float seed = transform(zk - margin, row_inv_t(a.trows, i, a.inv_t), a.cap, a.inv_cap);
    seed -= fabsf(seed) * 1e-6f; /* the transform's own rounding (tanhf is not exact) */
    seed += a.bias;               /* tests only (SPH_TEST_TOPK_SEED) */
    if (!(fabsf(zk) < INFINITY) || !(seed > -INFINITY) || seed != seed) return;
    a.tau[r] = sph_tk_enc(seed);
}

/* One row per block: the s-th largest of the row's m sample logits (a bitwise search over
 * their ordered keys, the top 24 bits: a lower bound of it within 2^-15 relative), less the
 * margin, transformed; the row's threshold (reset to -inf) set to it. Fewer than K ordered
 * samples (NaN) or a non-finite seed: no seed. */
/* PER = m / SEED_T samples per thread (8, 16, 32 for m = 1024, 2048, 4096): the 24 counts
 * compare only real samples (run 32 call 3: with 32 slots at every m the kernel was
 * issue-bound, 84 % issue active, three quarters of its compares on padding) */
template <int PER>
__global__ void __launch_bounds__(SEED_T) head_topk_seed_kernel(tks_args a) {
    const int64_t r = blockIdx.x, i = a.rowmap ? a.rowmap[r] : a.r0 + r;
    __shared__ int red[2][SEED_T / 32]; /* alternate buffers: one barrier per count */
    __shared__ float redf[SEED_T / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    unsigned u[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const float z = a.S[r * a.m + k * SEED_T + threadIdx.x];
        u[k] = z == z ? tk_key(z) : 0u;
    }
    /* the block's count of keys >= T (every thread gets it); buffer ph was last read two
     * counts ago, before the previous count's barrier */
    auto count = [&](unsigned T, int ph) -> int {
        int n = 0;
#pragma unroll
        for (int k = 0; k < PER; k++) n += u[k] >= T;
        n = __reduce_add_sync(0xffffffffu, n);
        if (lane == 0) red[ph][warp] = n;
        __syncthreads();
        int t = 0;
        for (int w = 0; w < SEED_T / 32; w++) t += red[ph][w];
        return t;
    };
    unsigned T = 0;
    for (int b = 31; b >= 8; b--)
        if (count(T | (1u << b), b & 1) >= a.s) T |= 1u << b;
    /* |h_i| */
    float hh = 0.f;
    for (int64_t k = threadIdx.x; k < a.H; k += SEED_T) {
        const float x = load_kind(a.hp, a.kind, r * a.ld_h + k);
        hh = fmaf(x, x, hh);
    }
    for (int o = 16; o > 0; o >>= 1) hh += __shfl_xor_sync(0xffffffffu, hh, o);
    if (lane == 0) redf[warp] = hh;
    __syncthreads();
    if (threadIdx.x != 0) return;
    hh = 0.f;
    for (int w = 0; w < SEED_T / 32; w++) hh += redf[w];
    seed_store(a, r, i, T, hh);
}

/* v32: a warp per row for m = 1024 (K <= 64, so s <= 64; 32 samples per lane), no block
 * barriers (run 37: the block kernel above took 84 us per 16K rows at A, issue-bound at
 * ~4600 warp instructions per row, 24 barrier rounds). The same T as the block kernel's, from
 * fewer keys: L, the s-th largest of the lanes' two largest keys (64 keys, s of them >= L, so
 * the row's s-th largest key k_s >= L), prunes the row to the keys >= L (~s .. 2 s of them),
 * which are gathered into the warp's 64 words; the bitwise search over them makes the same
 * decisions as over all m (a trial t <= k_s: the s keys >= k_s are all kept; t > k_s: fewer
 * than s keys reach it anyway), so T = k_s with its low 8 bits cleared, as before. More than
 * 64 keys >= L (ties, NaN rows): the search over all 32 registers. |h_i| with 16-byte loads
 * where the row allows. */
#define SEED_WARPS 4
__global__ void __launch_bounds__(32 * SEED_WARPS) head_topk_seed_warp_kernel(tks_args a,
                                                                                int64_t rows) {
    constexpr int PER = 32;
    __shared__ unsigned gk[SEED_WARPS][64];
    const int warp = threadIdx.x / 32, ln = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * SEED_WARPS + warp;
    if (r >= rows) return; /* warp-uniform: the warps share no barrier */
    const int64_t i = a.rowmap ? a.rowmap[r] : a.r0 + r;
    const float *S = a.S + r * 32 * PER;
    unsigned u[PER], m1 = 0u, m2 = 0u;
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const float z = S[32 * k + ln];
        u[k] = z == z ? tk_key(z) : 0u;
        m2 = max(m2, min(m1, u[k])), m1 = max(m1, u[k]);
    }
    /* |h_i| (its loads issued beside the samples': run 39, 60 us for 128 MB) */
    float hh = 0.f;
    const char *h = (const char *)a.hp + r * a.ld_h * 2;
    if (a.H % 8 == 0 && ((uintptr_t)h & 15) == 0) {
        const uint4 *h4 = (const uint4 *)h;
#pragma unroll 4
        for (int64_t k = ln; k < a.H / 8; k += 32) {
            const uint4 v = __ldg(h4 + k);
            const float s8 = a.kind == 1 ? dot8<__nv_bfloat162>(v, v) : dot8<__half2>(v, v);
            hh += s8;
        }
    } else {
        for (int64_t k = ln; k < a.H; k += 32) {
            const float x = load_kind(h, a.kind, k);
            hh = fmaf(x, x, hh);
        }
    }
    const int s = a.s;
    /* the searches run over bits 31 .. 8 (the block kernel's: T keeps the top 24 bits) */
    unsigned L = 0;
    for (int b = 31; b >= 8; b--) {
        const unsigned t = L | (1u << b);
        if (__reduce_add_sync(0xffffffffu, (int)(m1 >= t) + (int)(m2 >= t)) >= s) L = t;
    }
    int c = 0;
#pragma unroll
    for (int k = 0; k < PER; k++) c += u[k] >= L;
    const int tot = __reduce_add_sync(0xffffffffu, c);
    unsigned T = 0;
    if (L && tot <= 64) {
        const unsigned lt = (1u << ln) - 1u;
        int base = 0;
#pragma unroll
        for (int k = 0; k < PER; k++) {
            const bool p = u[k] >= L;
            const unsigned b = __ballot_sync(0xffffffffu, p);
            if (p) gk[warp][base + __popc(b & lt)] = u[k];
            base += __popc(b);
        }
        __syncwarp();
        const unsigned g0 = ln < tot ? gk[warp][ln] : 0u, g1 = ln + 32 < tot ? gk[warp][ln + 32] : 0u;
        for (int b = 31; b >= 8; b--) {
            const unsigned t = T | (1u << b);
            if (__reduce_add_sync(0xffffffffu, (int)(g0 >= t) + (int)(g1 >= t)) >= s) T = t;
        }
    } else {
        for (int b = 31; b >= 8; b--) {
            const unsigned t = T | (1u << b);
            int n = 0;
#pragma unroll
            for (int k = 0; k < PER; k++) n += u[k] >= t;
            if (__reduce_add_sync(0xffffffffu, n) >= s) T = t;
        }
    }
    for (int o = 16; o > 0; o >>= 1) hh += __shfl_xor_sync(0xffffffffu, hh, o);
    if (ln == 0) seed_store(a, r, i, T, hh);
}

#ifndef SPH_CUDA_EMU
sph_status sph_cuda_topk_fused_begin(pass_ctx *c, const chunk *ch, const char *hp, int64_t ld,
                                     int64_t c0, int64_t w) {
    const sph_cuda_layout *lay = c->lay;
    const sph_head_plan *p = c->p;
    const int64_t n = ch->rows * lay->tk_ks;
    c->tk_seeded = 0;
    if (n <= 0) return SPH_OK;
    head_topk_reset_kernel<<<(unsigned)((n + 255) / 256), 256, 0, c->stream>>>(
        ch->rows, (int)lay->tk_ks, (int *)(c->ws + lay->off_tkn), (int *)(c->ws + lay->off_tkt),
        (int *)(c->ws + lay->off_tks));
    SPH_LAUNCH_CHECK("head_topk_reset_kernel", c->stream);
    /* the seed: where the split is wide (8 x the sample), the sample and one float fit in the
     * candidate buffer, and cuBLAS's leading dimension in an int */
    const int64_t m = topk_seed_cols(p->topk), stride = w / m;
    if (c->st->topk_seed_off || w < 8 * m || m + 4 > 2 * lay->tk_cap ||
        stride * p->ld_w > INT32_MAX || (c->dk != DT_BF16 && c->dk != DT_F16))
        return SPH_OK;
    float *S = (float *)(c->ws + lay->off_tkc);
    unsigned *wmax = (unsigned *)(S + ch->rows * m);
    const int kind = c->dk == DT_BF16 ? 1 : 2;
    const char *wp = (const char *)p->weight + (size_t)c0 * p->ld_w * c->es;
    SPH_CUDA_RET(cudaMemsetAsync(wmax, 0, sizeof *wmax, c->stream));
    head_topk_wnorm_kernel<<<(unsigned)((m + 7) / 8), 256, 0, c->stream>>>(
        wp, kind, stride * p->ld_w, p->H, (int)m, wmax);
    SPH_LAUNCH_CHECK("head_topk_wnorm_kernel", c->stream);
    const float one = 1.f, zero = 0.f;
    const cudaDataType_t t = dt_cuda(c->dk);
    SPH_CUBLAS_RET(cublasGemmEx(c->st->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)ch->rows,
                                (int)p->H, &one, wp, t, (int)(stride * p->ld_w), hp, t, (int)ld,
                                &zero, S, CUDA_R_32F, (int)m, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
    tks_args a;
    memset(&a, 0, sizeof a);
    a.S = S;
    a.m = (int)m;
    a.K = (int)p->topk;
    a.s = topk_seed_rank(p->topk, m, w, c->st->topk_variant & 4);
    a.kind = kind;
    a.wmax = wmax;
    a.hp = hp;
    a.ld_h = ld;
    a.H = p->H;
    a.r0 = ch->r0;
    a.rowmap = ch->rowmap;
    a.trows = p->temp_rows;
    a.inv_t = (float)(1.0 / p->temperature);
    a.cap = (float)p->softcap;
    a.inv_cap = p->softcap > 0 ? (float)(1.0 / p->softcap) : 0.f;
    a.bias = c->st->topk_seed_bias;
    a.tau = (int *)(c->ws + lay->off_tkt);
    const unsigned nb = (unsigned)ch->rows; /* m: 1024, 2048 or 4096 (topk_seed_cols) */
    if (m == 32 * 32 && !(c->st->topk_variant & 16))
        head_topk_seed_warp_kernel<<<(unsigned)((ch->rows + SEED_WARPS - 1) / SEED_WARPS),
                                     32 * SEED_WARPS, 0, c->stream>>>(a, ch->rows);
    else if (m == 8 * SEED_T) head_topk_seed_kernel<8><<<nb, SEED_T, 0, c->stream>>>(a);
    else if (m == 16 * SEED_T) head_topk_seed_kernel<16><<<nb, SEED_T, 0, c->stream>>>(a);
    else head_topk_seed_kernel<32><<<nb, SEED_T, 0, c->stream>>>(a);
    SPH_LAUNCH_CHECK("head_topk_seed_kernel", c->stream);
    c->tk_seeded = 1;
    return SPH_OK;
}

sph_status sph_cuda_topk_fused_merge(pass_ctx *c, const chunk *ch, int64_t c0, int64_t w,
                                     const void *hp, int64_t ld, int merge) {
    const sph_head_plan *p = c->p;
    const sph_cuda_layout *lay = c->lay;
    if (ch->rows <= 0) return SPH_OK;
    if (c->st->topk_count) {
        /* tests and tuning only: the rows' candidate counts of this split (synchronizes) */
        int *h = (int *)malloc((size_t)ch->rows * sizeof(int));
        SPH_CHECK(h, SPH_ERR_ALLOC, "top-k counts: %lld rows", (long long)ch->rows);
        cudaError_t e = cudaMemcpyAsync(h, c->ws + lay->off_tkn, (size_t)ch->rows * sizeof(int),
                                        cudaMemcpyDeviceToHost, c->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
        if (e != cudaSuccess) free(h);
        SPH_CUDA_RET(e);
        long long sum = 0, over = 0, low = 0;
        int mx = 0;
        for (int64_t r = 0; r < ch->rows; r++) {
            sum += h[r], mx = h[r] > mx ? h[r] : mx;
            over += h[r] > lay->tk_cap, low += h[r] < p->topk;
        }
        fprintf(stderr,
                "spanhead top-k: %lld rows, %.1f candidates per row (max %d, cap %lld; over "
                "the cap %lld, below K %lld), seeded %d, split width %lld\n",
                (long long)ch->rows, (double)sum / (double)ch->rows, mx, (long long)lay->tk_cap,
                over, low, c->tk_seeded, (long long)w);
        free(h);
    }
    tkm_args a;
    memset(&a, 0, sizeof a);
    a.cand = (const sph_cuda_xtk *)(c->ws + lay->off_tkc);
    a.n = (int *)(c->ws + lay->off_tkn);
    a.tau = (int *)(c->ws + lay->off_tkt);
    a.slots = (const int *)(c->ws + lay->off_tks);
    a.ks = (int)lay->tk_ks;
    a.tk = (sph_cuda_xtk *)(c->ws + lay->off_xtk) + ch->k0 * p->topk;
    a.K = (int)p->topk;
    a.cap = (int)lay->tk_cap;
    a.merge = merge;
    a.seeded = c->tk_seeded;
    a.variant = c->st->topk_variant;
    c->tk_seeded = 0; /* the seed is split 0's */
    a.tile_recs = (const float *)(c->ws + lay->off_T);
    a.n_tiles = (w + SPH_SM90_TILE_N - 1) / SPH_SM90_TILE_N;
    a.w = w;
    a.H = p->H;
    a.ld_h = ld;
    a.ld_w = p->ld_w;
    a.r0 = ch->r0;
    a.hp = hp;
    a.wp = (const char *)p->weight + (size_t)c0 * p->ld_w * c->es;
    a.rowmap = ch->rowmap;
    a.trows = p->temp_rows;
    a.col_g0 = (int)(p->v0 + c0);
    a.inv_t = (float)(1.0 / p->temperature);
    a.cap_s = (float)p->softcap;
    a.inv_cap = p->softcap > 0 ? (float)(1.0 / p->softcap) : 0.f;
    a.rows = ch->rows;
    int *diag = NULL; /* SPH_TEST_TOPK_COUNT=1: which merge took the rows (synchronizes) */
    if (c->st->topk_count) {
        SPH_CUDA_RET(cudaMalloc((void **)&diag, 4 * sizeof(int)));
        cudaError_t e = cudaMemsetAsync(diag, 0, 4 * sizeof(int), c->stream);
        if (e != cudaSuccess) cudaFree(diag);
        SPH_CUDA_RET(e);
        a.diag = diag;
    }
    /* a warp per row where K allows (SPH_TEST_TOPK_VARIANT bit 1: the block per row, A/B) */
    const bool warp = p->topk <= XW_K && !(c->st->topk_variant & 2);
    const unsigned nb = (unsigned)(warp ? (ch->rows + XW_WARPS - 1) / XW_WARPS : ch->rows);
    if (c->dk == DT_BF16) {
        if (warp) head_topk_merge_kernel<__nv_bfloat162, XW_WARPS><<<nb, XT, 0, c->stream>>>(a);
        else head_topk_merge_kernel<__nv_bfloat162, 1><<<nb, XT, 0, c->stream>>>(a);
    } else {
        if (warp) head_topk_merge_kernel<__half2, XW_WARPS><<<nb, XT, 0, c->stream>>>(a);
        else head_topk_merge_kernel<__half2, 1><<<nb, XT, 0, c->stream>>>(a);
    }
    if (diag) {
        int h[4] = {0, 0, 0, 0};
        cudaError_t e = cudaGetLastError();
        if (e == cudaSuccess) e = cudaMemcpyAsync(h, diag, sizeof h, cudaMemcpyDeviceToHost, c->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
        cudaFree(diag);
        SPH_CUDA_RET(e);
        fprintf(stderr,
                "spanhead top-k merge: %lld rows; warp %d (%d of them compacted), block %d "
                "(recompute %d, more entries or ties than a warp holds %d)\n",
                (long long)ch->rows, h[0] + h[1], h[1], (int)(warp ? h[2] + h[3] : ch->rows),
                h[2], h[3]);
    }
    SPH_LAUNCH_CHECK("head_topk_merge_kernel", c->stream);
    return SPH_OK;
}
#endif /* SPH_CUDA_EMU */
