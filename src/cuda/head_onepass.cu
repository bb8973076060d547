/*
 * head_onepass.cu - the staged-E one-pass forward's elementwise step (issue 19): turns the
 * chunk's staged E into the dlogits D in place, once the rows' statistics are final.
 *
 * The one-pass forward of a chunk of R rows (every column of the shard, no vocabulary split):
 *   1. the sm_90a kernel with the STATS | E epilogue (head_sm90.cu): per row and 256-column
 *      tile the record (m_t, s, b, zt, sz) and E_ij = exp(z_ij - m_t) in f16 (2 bytes per
 *      element: E is in [0, 1], so f16 keeps 11 bits where it matters, for the entries that
 *      carry the softmax mass; an entry 2^-24 below its tile's max flushes to 0);
 *   2. the records folded per row, combined over the TP group, finalized (lse, mu, logprob...);
 *   3. this kernel: D_ij = du_ij from E_ij, the tile's m_t and the row's statistics, in place
 *      (D in the input dtype, the same 2 bytes per element):
 *        p  = E exp(m_t - lse)                 (no exp per element: one per row and tile)
 *        z  = m_t + log E                      (only for the entropy and softcap terms; at the
 *                                               target z is the record's exact zt)
 *        dz = p (gl - g + e (mu - z)) + gm / V (+ g at the target)
 *        du = dz / T (1 - (z T / cap)^2 with a softcap)
 *      An entry with E = 0 has p = 0 to the precision of f16, and its dz is gm / V (+ g at the
 *      target). The only term that then needs the lost z is the softcap factor of gm / V:
 *      the layout declines this path when dlogit_mean and a softcap come together.
 *   4. dH (+)= D W and dW (+)= D^T h through cuBLAS, as for any staged chunk.
 * Cost against the fused recompute (head.cu's sweep): 6 N H V flops instead of 8, plus E
 * written once (2 B) and read + written once here (4 B) per element.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda/head.cuh"
#include "cuda/head_math.cuh"
#include "cuda/head_onepass.cuh"

#define E2D_TILE 256 /* columns per tile record (SPH_SM90_TILE_N) */

/* One warp per (row, tile): lane l takes columns 8 l .. 8 l + 7 of the tile, one 16-byte load
 * of E and one 16-byte store of D. Rows x tiles warps, 8 warps per block. NEEDZ: the entropy
 * or softcap term needs z per element. */
template <typename T, bool CAP, bool NEEDZ>
__global__ void __launch_bounds__(256) head_e2d_kernel(sph_e2d_args a) {
    const int64_t wid = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (wid >= a.rows * a.n_tiles) return; /* warp-uniform */
    const int64_t r = wid / a.n_tiles, k = wid % a.n_tiles;
    const int64_t col0 = k * E2D_TILE + 8 * lane;
    if (col0 >= a.w) return; /* no shuffles below: lanes may leave */
    const int64_t i = a.rowmap ? a.rowmap[r] : a.r0 + r;
    const float *rec = a.tile_recs + (r * a.n_tiles + k) * SPH_PARTIAL_FIELDS;
    const float mt = rec[0], zt = rec[3];
    uint4 *ptr = (uint4 *)((uint16_t *)a.E + r * a.ldE + col0);
    const bool active = !a.mask || a.mask[i];
    uint32_t out[4] = {0u, 0u, 0u, 0u};
    if (active) {
        /* the row's 1 / T and T / cap (per-row temperatures: row_inv_t) */
        const float it = row_inv_t(a.trows, i, a.inv_t);
        const float toc = a.trows ? a.trows[i] * a.inv_cap : a.t_over_cap;
        const int64_t t = load_target(a.tgt, a.tgt_i64, i);
        const float lse = a.stats[i * 3 + 1], mu = a.stats[i * 3 + 2];
        const float g = a.g && t >= 0 ? a.g[i] : 0.f;
        const float eg = a.e ? a.e[i] : 0.f, gl = a.gl ? a.gl[i] : 0.f;
        const float gmV = a.gm ? a.gm[i] * a.inv_V : 0.f;
        const float scale = fexp(mt - lse); /* p = E scale */
        const float cp = gl - g + eg * mu;
        const int64_t tl = t >= 0 ? t - a.col_g0 - col0 : -1; /* target's offset in the 8 */
        const uint4 raw = *ptr;
        const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const __half2 e2 = *(const __half2 *)&words[q];
            const float ev[2] = {__low2float(e2), __high2float(e2)};
            float du[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int c = 2 * q + h;
                const bool at_t = tl == c;
                float dz = gmV + (at_t ? g : 0.f);
                float z = at_t ? zt : 0.f;
                if (ev[h] != 0.f) { /* NaN included: a non-finite row stays non-finite */
                    const float p = ev[h] * scale;
                    if (NEEDZ && !at_t) z = mt + __logf(ev[h]);
                    dz = fmaf(p, NEEDZ ? fmaf(-eg, z, cp) : cp, dz);
                }
                float d = dz * it;
                if (CAP && (ev[h] != 0.f || at_t)) {
                    const float th = z * toc;
                    d *= 1.f - th * th;
                }
                du[h] = col0 + c < a.w ? d : 0.f;
            }
            out[q] = pack2<T>(du[0], du[1]);
        }
    }
    *ptr = make_uint4(out[0], out[1], out[2], out[3]);
}

template <typename T>
static void launch_t(const sph_e2d_args &a, unsigned blocks, cudaStream_t s) {
    const bool cap = a.t_over_cap > 0.f, needz = cap || a.e;
    if (cap)
        head_e2d_kernel<T, true, true><<<blocks, 256, 0, s>>>(a);
    else if (needz)
        head_e2d_kernel<T, false, true><<<blocks, 256, 0, s>>>(a);
    else
        head_e2d_kernel<T, false, false><<<blocks, 256, 0, s>>>(a);
}

sph_status sph_cuda_e2d(const sph_e2d_args *a, cudaStream_t stream) {
    if (a->rows <= 0 || a->w <= 0) return SPH_OK;
    SPH_CHECK((uintptr_t)a->E % 16 == 0 && a->ldE % 8 == 0 && a->ldE >= a->w &&
                  a->n_tiles == (a->w + E2D_TILE - 1) / E2D_TILE,
              SPH_ERR_INTERNAL, "e2d: E %p, ldE %lld, n_tiles %lld for %lld columns", a->E,
              (long long)a->ldE, (long long)a->n_tiles, (long long)a->w);
    SPH_CHECK(!(a->gm && a->t_over_cap > 0.f), SPH_ERR_INTERNAL,
              "e2d: dlogit_mean with a softcap needs every z (the layout declines this path)");
    const int64_t warps = a->rows * a->n_tiles, blocks = (warps + 7) / 8;
    SPH_CHECK(blocks <= INT32_MAX, SPH_ERR_INTERNAL, "e2d: %lld rows x %lld tiles",
              (long long)a->rows, (long long)a->n_tiles);
    if (a->dtype_bf16)
        launch_t<__nv_bfloat16>(*a, (unsigned)blocks, stream);
    else
        launch_t<__half>(*a, (unsigned)blocks, stream);
    SPH_LAUNCH_CHECK("head_e2d_kernel", stream);
    return SPH_OK;
}
