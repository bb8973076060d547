/*
 * head_sm90.cuh - the Hopper (sm_90a: TMA + mbarrier pipeline + wgmma) variant of the
 * batch-invariant logits kernel (head_sm90.cu). Same contract as sph_cuda_logits_fixed:
 * L[r, c] = sum_k h[r, k] w[c, k] for r < R, c < Vs, fp32 out with row stride ldL, every
 * element summed in one fixed k order whatever R, the tile or the row's position.
 *
 * C-callable (the GPU tests ask sph_cuda_sm90_available whether the path is live).
 */
#ifndef SPH_CUDA_HEAD_SM90_CUH
#define SPH_CUDA_HEAD_SM90_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "spanhead.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the current device is sm_90, the library holds the sm_90a kernels and the driver has
 * the tensor-map encoder. (A context's SPH_CUDA_FLAG_NO_SM90 is its callers' to apply.) */
int sph_cuda_sm90_available(void);

/* 1 when these operands suit the sm_90a kernel's TMA maps (the conditions below, without
 * asking the device). */
int sph_cuda_sm90_operands_ok(sph_dtype dt, const void *h, int64_t ld_h, const void *w,
                              int64_t ld_w, int64_t H);

/* 1 when the sm_90a kernel takes logits of these operands: bf16/f16, H % 8 == 0, row strides
 * multiples of 8 elements, 16-byte aligned bases, and sph_cuda_sm90_available(). Ask it with
 * the user's tensors (not a chunk's), so every chunk of every batch gets the same kernel. */
int sph_cuda_logits_sm90_usable(sph_dtype dt, const void *h, int64_t ld_h, const void *w,
                                int64_t ld_w, int64_t H);

/* Launches the kernel on stream (asynchronous), schedule by H. Operands must satisfy the
 * conditions above (SPH_ERR_INTERNAL otherwise); a launch error comes back with the kernel's
 * name. */
sph_status sph_cuda_logits_sm90(sph_dtype dt, const void *h, int64_t ld_h, const void *w,
                                int64_t ld_w, float *L, int64_t ldL, int64_t R, int64_t Vs,
                                int64_t H, cudaStream_t stream);

/* The fused epilogues (general path, sm_90a): the same main loop, then, instead of (or as well
 * as) storing the fp32 logits, work on the tile of logits (64 or 128 rows x 256 columns) while
 * it is in registers.
 *   SPH_SM90_EPI_L       store L (fp32, row stride ldL)                 (the logits kernel)
 *   SPH_SM90_EPI_STATS   per row and 256-column tile, the record (m, s, b, zt, sz) of the
 *                        transformed logits z: tile_recs[(r * n_tiles + tile) * 5 + f],
 *                        n_tiles = ceil(Vs / 256); zt is z at the target when the tile holds
 *                        it, else 0. sph_cuda_sm90_reduce_tiles folds them per row.
 *                        With tile_q, also sum_p2's q = sum exp(2 (z - m)) of the tile (one
 *                        more FMA per logit, 4 bytes per 256 columns).
 *   SPH_SM90_EPI_DLOGITS D (input dtype, row stride ldD) = du of head.cu's dlogits kernel,
 *                        from the row statistics (stats) and upstream gradients.
 *   SPH_SM90_EPI_STATS | SPH_SM90_EPI_E
 *                        the records, and E = exp(z - m_tile) as f16 (row stride ldE), m_tile
 *                        the row's max over the tile (the record's m): the one-pass forward
 *                        stages E instead of the logits (2 bytes per element; p = E
 *                        exp(m_tile - lse) once lse is known, z = m_tile + log E).
 *   SPH_SM90_EPI_NONE    nothing: the main loop alone (bench_sm90_epi's probe of its rate).
 * One mode per launch. store16: the half-precision stores of D and E go out as 16-byte
 * stores after a transpose inside each quad of threads (4x fewer store instructions, whole
 * 32-byte sectors) instead of 4-byte pairs. Chunk row r is
 * global row rowmap[r] (gathered chunks) or r0 + r; columns are offset by col_g0 in the
 * vocabulary (targets are global indices). */
enum {
    SPH_SM90_EPI_NONE = 0,
    SPH_SM90_EPI_L = 1,
    SPH_SM90_EPI_STATS = 2,
    SPH_SM90_EPI_DLOGITS = 4,
    SPH_SM90_EPI_E = 8
};

/* Schedules of the sm_90a kernel (sph_sm90_epi.schedule): by H (ping-pong up to
 * SM90_PINGPONG_MAX_H, cooperative above), or forced (a context's SPH_CUDA_FLAG_PINGPONG /
 * _COOPERATIVE). Both give bitwise equal logits. */
enum { SPH_SM90_SCHED_AUTO = 0, SPH_SM90_SCHED_PINGPONG = 1, SPH_SM90_SCHED_COOPERATIVE = 2 };

typedef struct sph_sm90_epi {
    int mode;
    int schedule; /* SPH_SM90_SCHED_*; 0 = by H */
    float *L;
    int64_t ldL;
    float *tile_recs;
    float *tile_q; /* SPH_SM90_EPI_STATS: sum_p2's q = sum exp(2 (z - m)) per row and tile
                      (tile_q[r * n_tiles + tile], m the record's), or NULL: not computed */
    /* SPH_SM90_EPI_STATS with top-k (head_extras.cu's fused top-k), or tk_cand NULL: per chunk
     * row r, the logits z >= the row's threshold dec(tk_tau[r]) (read after the tile's main
     * loop was issued; seeded from a sample before split 0) go to
     * tk_cand[r * tk_cap + atomicAdd(tk_n[r])] as (z, global id) while the count allows, and
     * each thread raises one slot of the row (tk_slots[r * tk_ks + .]) to the largest of its
     * candidates: slot (4 tile + quad lane) & (tk_ks - 1), or per candidate slot (split column
     * & (tk_ks - 1)) where it emits from its registers (every column feeds at most one slot);
     * a quad whose candidates took the row's count across a multiple of 2^tk_every_log2 reads
     * the row's slots back and raises the threshold to their minimum (tk_ks elements of the
     * row are >= it, so the row's K-th largest is too, K = tk_k <= tk_ks). Ordered-int
     * encoding (sph_tk_enc). */
    void *tk_cand;
    int *tk_n, *tk_tau, *tk_slots;
    int tk_cap, tk_ks, tk_k;
    int tk_every_log2; /* the read-back's period (state.h topk_every_log2) */
    int tk_probe;      /* timing only (state.h topk_probe): 1 no read-backs, 2 no atomicAdd */
    int tk_variant;    /* A/B only (state.h topk_variant): bit 0 v25's count, 3 its stage at 6
                          entries */
    void *D;
    int64_t ldD;
    void *E; /* f16 (R, ldE) */
    int64_t ldE;
    int store16; /* 16-byte stores of D / E (ldD, ldE multiples of 8, bases 16-byte aligned) */
    int64_t r0, col_g0;
    const int64_t *rowmap;
    const void *tgt;
    int tgt_i64;
    float inv_t, cap, inv_cap, inv_V;
    const float *trows; /* per-row temperatures (N) or NULL: inv_t for every row */
    const float *stats, *g, *e, *gl, *gm;
    const uint8_t *mask;
} sph_sm90_epi;

/* Columns per tile record of SPH_SM90_EPI_STATS. */
#define SPH_SM90_TILE_N 256

/* Launches the kernel with the epilogue epi (asynchronous); same operand conditions as
 * sph_cuda_logits_sm90. */
sph_status sph_cuda_head_sm90(sph_dtype dt, const void *h, int64_t ld_h, const void *w,
                              int64_t ld_w, int64_t R, int64_t Vs, int64_t H,
                              const sph_sm90_epi *epi, cudaStream_t stream);

/* recs[r] (5 floats, m s b zt sz) = the fixed-order merge of tile_recs[r, 0 .. n_tiles) for
 * r < R, merged after recs[r]'s own value when merge (an earlier vocabulary split). With
 * tile_q (the epilogue's sum_p2 partials), mq[r] (m, q = sum exp(2 (z - m))) likewise. */
sph_status sph_cuda_sm90_reduce_tiles(const float *tile_recs, const float *tile_q,
                                      int64_t n_tiles, int64_t R, float *recs, float2 *mq,
                                      int merge, cudaStream_t stream);

/* Benchmarks and tests: the batch-invariant logits through one named kernel, variant 0 the
 * mma.sync kernel (sph_cuda_logits_fixed), 1 the sm_90a kernel (SPH_ERR_UNSUPPORTED when
 * it cannot take these operands here). */
sph_status sph_cuda_logits_variant(int variant, sph_dtype dt, const void *h, int64_t ld_h,
                                   const void *w, int64_t ld_w, float *L, int64_t ldL, int64_t R,
                                   int64_t Vs, int64_t H, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
