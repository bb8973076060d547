/*
 * head_onepass.cuh - the staged-E one-pass step of head_onepass.cu: D (input dtype, in place
 * of the f16 E) of one chunk of rows from E, its tile records and the rows' statistics.
 */
#ifndef SPH_CUDA_HEAD_ONEPASS_CUH
#define SPH_CUDA_HEAD_ONEPASS_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "spanhead.h"

typedef struct sph_e2d_args {
    void *E;                  /* (rows, ldE) f16 E in, D (bf16 or f16) out */
    int64_t ldE;              /* multiple of 8, >= w; E 16-byte aligned */
    int dtype_bf16;           /* D dtype: 1 bf16, 0 f16 */
    const float *tile_recs;   /* (rows, n_tiles, 5) the STATS | E epilogue's records */
    int64_t n_tiles;          /* ceil(w / 256) */
    int64_t rows, w;          /* chunk rows, columns (the whole shard) */
    int64_t r0;               /* chunk row r is global row rowmap[r] or r0 + r */
    const int64_t *rowmap;
    int64_t col_g0;           /* global id of column 0 (vocab_start) */
    const float *stats;       /* (N, 3): m, lse, mu of the finalized rows */
    const float *g, *e, *gl, *gm; /* upstream gradients (N) or NULL */
    const uint8_t *mask;
    const void *tgt;
    int tgt_i64;
    float inv_t, t_over_cap, inv_V; /* 1/T, T/cap (0: no softcap), 1/V */
    const float *trows;       /* per-row temperatures (N) or NULL (inv_t, t_over_cap) */
    float inv_cap;            /* 1/cap (0: no softcap): T_i/cap = T_i inv_cap per row */
} sph_e2d_args;

sph_status sph_cuda_e2d(const sph_e2d_args *a, cudaStream_t stream);

#endif
