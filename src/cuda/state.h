/* state.h - per-context CUDA state (hidden): device properties, the cuBLAS handle, the tune
 * table read from the tune cache at context creation, and sph_tune's forced configuration. */
#ifndef SPH_CUDA_STATE_H
#define SPH_CUDA_STATE_H

#include <cuda_runtime.h>
#include "cuda/cublas_shim.h" /* cuBLAS types + the run-time loaded calls */
#include <stdint.h>

#define SPH_TUNE_MAX_ENTRIES 256

/* The path of one CUDA pass (head_layout.cu's choose_path decides it once; head.cu runs it,
 * sph_head_describe prints its word, sph_cuda_path_name, and the bench's `path` column shows
 * it). */
typedef enum sph_cuda_path {
    SPH_CUDA_PATH_AUTO = 0,   /* (onepass_path only: no path forced) */
    SPH_CUDA_PATH_CUBLAS,     /* "cublas": cuBLAS logits staged in fp32 + the row kernels (the
                                 batch-invariant mode: its fixed-tiling kernels) */
    SPH_CUDA_PATH_FUSED,      /* "fused": the sm_90a kernels with statistics / dlogits
                                 epilogues, no staged logits */
    SPH_CUDA_PATH_STAGED_E,   /* "staged-e", one-pass: fused statistics | E epilogue, f16 E of
                                 whole-shard rows staged per chunk, D in place of E */
    SPH_CUDA_PATH_STAGED_F32, /* "staged-f32", one-pass: cuBLAS fp32 logits staged per chunk,
                                 the chunk's gradients from them */
    SPH_CUDA_PATH_RECOMPUTE,  /* "recompute", one-pass: every chunk's statistics, then the
                                 backward's sweep recomputing the logits (fused kernels where
                                 they can run) */
    SPH_CUDA_PATH_SUPPORT     /* "support": sample support, per-row candidate kernels */
} sph_cuda_path;

/* One tuned configuration: the winner for (GPU name, dtype, H, V_loc, N bucket). */
typedef struct sph_tune_entry {
    char gpu[64];
    char dtype[8];
    int64_t H, V_loc, N_bucket;
    int64_t chunk_rows; /* 0 = automatic */
    int64_t split;      /* vocabulary split width; 0 = whole shard */
    double ms;          /* measured fwd+bwd time of the winner */
} sph_tune_entry;

typedef struct sph_cuda_state {
    struct cudaDeviceProp prop;
    int cc;                 /* compute capability, e.g. 90 */
    cublasHandle_t cublas;
    int n_tune;
    sph_tune_entry tune[SPH_TUNE_MAX_ENTRIES];
    /* The A/B switches of sph_ctx_opts.cuda_flags (spanhead.h, sph_cuda_flag), read once at
     * context creation. */
    int no_gather;                   /* NO_GATHER: chunks never cross spans */
    int no_square;                   /* NO_SQUARE: backward keeps whole-shard rows */
    int no_fused;                    /* NO_FUSED: no sm_90a fused epilogues */
    int no_colouter;                 /* NO_COLOUTER: gradient sweep row-outer */
    int dense_bwd;                   /* DENSE_BACKWARD: backward over every row (ablation) */
    int no_sm90;                     /* NO_SM90: no sm_90a kernel (fused or batch-invariant) */
    int schedule;                    /* PINGPONG / COOPERATIVE: SPH_SM90_SCHED_* (head_sm90.cuh) */
    sph_cuda_path onepass_path;      /* ONEPASS_*: the one-pass path forced where it can run
                                        (STAGED_E, STAGED_F32, RECOMPUTE), AUTO: the rules */
    int no_store16;                  /* NO_STORE16: 4-byte pair stores in the fused epilogues */
    int e_two_chunks;                /* E_TWO_CHUNKS: staged E in 2 chunks, no fp32 dW acc. */
    int sump2_fused;                 /* sum_p2 in the statistics epilogue (not EXTRAS_STAGED) */
    int topk_fused;                  /* (not EXTRAS_STAGED) top-k there too */
    int64_t topk_cap;                /* tests only (SPH_TEST_TOPK_CAP): the fused top-k's
                                        candidates per row (0: the layout's rule) */
    int topk_seed_off;               /* tests only (SPH_TEST_TOPK_SEED=off): no sampled seed */
    float topk_seed_bias;            /* tests only (SPH_TEST_TOPK_SEED=<x>): added to every
                                        seed (inf: every seed fails, the rows recompute) */
    int topk_every_log2;             /* the epilogue reads a row's slots back every 2^this
                                        candidates (8; SPH_TEST_TOPK_EVERY=16 .. 1024) */
    int topk_probe;                  /* timing only (SPH_TEST_TOPK_PROBE=1..3, wrong lists):
                                        bit 0 the epilogue skips its read-backs, bit 1 its
                                        atomicAdds (every quad writes at the buffer's start) */
    int topk_variant;                /* A/B only (SPH_TEST_TOPK_VARIANT, correct lists):
                                        bit 0 the epilogue's count of both row halves in
                                        one loop (v25) instead of a half at a time (v22),
                                        bit 1 every row through the block merge (no warp
                                        merge), bit 2 the seed at the sample's K-th largest
                                        (v20), bit 3 v25's stage at 6 entries (tests),
                                        bit 4 v31's per-row kernels: the seed's block
                                        select, the warp merge's sort in shared memory
                                        and no compaction */
    int topk_count;                  /* tests only (SPH_TEST_TOPK_COUNT=1): after each
                                        split, the rows' candidate counts to stderr (a host
                                        synchronization) */
    int dh_splitk;                   /* DH_SPLITK: dH of short chunks split over V (fp32) */
    int e2d_overlap;                 /* E2D_OVERLAP: e2d per row block on a side stream */
    cudaStream_t side;               /* E2D_OVERLAP: the side stream (NULL until first use) */
    cudaEvent_t ev[9];               /* E2D_OVERLAP: ev[0] main -> side, ev[1..8] per block */
    int64_t e2d_rows;                /* E2D_OVERLAP, tests only: rows per block (0: the rule) */
    int e2d_blocks_run;              /* E2D_OVERLAP: chunks pipelined so far (tests read it) */
    int dw32_beta0;                  /* DW32_BETA0: the first chunk's dW GEMM writes the fp32
                                        accumulator (beta 0), no memset */
    int dw32_memsets_saved;          /* DW32_BETA0: passes that skipped the memset (tests) */
    unsigned long long *nf;          /* device: [0] non-finite active rows found by the
                                        finalize kernel, [1] the lowest such row (~0: none);
                                        read and reset by sph_ctx_nonfinite */
    int assume_sm90;                 /* layout tests without a GPU: plan as on an sm_90 device */
    int forcing;                     /* 1 while sph_tune times a candidate: */
    int64_t force_rows, force_split; /* its configuration (0 = automatic) */
} sph_cuda_state;

#endif
