/*
 * sass_epi.cu - the sm_90a statistics epilogue, one variant per kernel, for counting its SASS
 * instructions on a machine without a GPU (scripts/sass_epi.sh; never launched).
 *
 * The fused statistics kernel (head_sm90.cu) holds every epilogue variant behind run-time
 * branches (softcap, sum_p2, top-k, the A/B variants, partial tiles), so its SASS mixes them.
 * Here each kernel fixes them: no softcap, rows inside the chunk, and the top-k's variant bits
 * as constants, so the compiler keeps one path; the split's width stays a run-time value, as
 * in the kernel (a tile's column tests are part of its cost). The accumulators come
 * from global memory instead of wgmma, with the same __launch_bounds__ (384, 1) register
 * budget; the count is the epilogue's per tile and thread, except its loops over candidates
 * (emission) and slots (read-back), whose bodies the script lists by source line.
 * Run 33 call 2 found the statistics kernel's time following its executed instructions at
 * H 2048 (~4 ms per G at A 16K): this is the static side of that count, per version.
 */
#define SPH_SM90_DEVICE_ONLY
#include "../../src/cuda/head_sm90.cu"

#ifdef SPH_SM90_DEVICE
/* Q2: sum_p2; TK: top-k; VAR: SPH_TEST_TOPK_VARIANT's bits (constant here); FULL: 1 a whole
 * tile only (epi_stats_t's FULL copy), 0 both copies behind the kernel's run-time choice */
template <bool Q2, bool TK, int VAR, bool FULL = false, bool TGT = true>
__device__ __forceinline__ void sass_epi_body(const float *in, sph_sm90_epi ep, int64_t r0,
                                              int64_t Vs) {
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = in[(int64_t)i * 384 + threadIdx.x];
    ep.tk_variant = VAR;
    ep.cap = 0.f;
    epi_row_args ra[2];
    epi_row_load<SPH_SM90_EPI_STATS>(ep, r0, INT64_MAX, ra[0]);
    epi_row_load<SPH_SM90_EPI_STATS>(ep, r0 + 8, INT64_MAX, ra[1]);
    ra[0].tau = epi_row_tau(ep, r0, INT64_MAX);
    ra[1].tau = epi_row_tau(ep, r0 + 8, INT64_MAX);
    const int64_t cb = 2 * (threadIdx.x % 4);
    const uint32_t tks = 4u * (uint32_t)threadIdx.x;
    if (FULL)
        epi_stats_t<false, 0, Q2, TK, true, TGT>(acc, ep, ra, r0, cb, 0, 1, INT64_MAX, Vs, tks);
    else epi_stats_c<0, Q2, TK>(acc, ep, ra, r0, cb, 0, 1, INT64_MAX, Vs, tks);
}

/* the backward's dlogits epilogue (bf16 du, 16-byte stores, no softcap): FULL 1 a whole tile
 * only (v29's copy), 0 the run-time split width's column tests */
template <bool FULL, bool TGT>
__device__ __forceinline__ void sass_dl_body(const float *in, sph_sm90_epi ep, int64_t r0,
                                             int64_t Vs) {
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = in[(int64_t)i * 384 + threadIdx.x];
    ep.cap = 0.f;
    epi_row_args ra[2];
    epi_row_load<SPH_SM90_EPI_DLOGITS>(ep, r0, INT64_MAX, ra[0]);
    epi_row_load<SPH_SM90_EPI_DLOGITS>(ep, r0 + 8, INT64_MAX, ra[1]);
    const int64_t cb = 2 * (threadIdx.x % 4);
    epi_dlogits_t<__nv_bfloat16, false, true, FULL, TGT>(acc, ep, ra, r0, cb, INT64_MAX, Vs, 1);
}
#define SASS_DL(name, FULL, TGT)                                                                  \
    __global__ void __launch_bounds__(SM90_THREADS, 1)                                         \
        name(const float *in, const sph_sm90_epi ep, int64_t r0, int64_t Vs) {                 \
        sass_dl_body<FULL, TGT>(in, ep, r0, Vs);                                                   \
    }

#define SASS_EPI(name, Q2, TK, VAR, FULL, TGT)                                                    \
    __global__ void __launch_bounds__(SM90_THREADS, 1)                                         \
        name(const float *in, const sph_sm90_epi ep, int64_t r0, int64_t Vs) {                 \
        sass_epi_body<Q2, TK, VAR, FULL, TGT>(in, ep, r0, Vs);                                 \
    }
#else
#define SASS_EPI(name, Q2, TK, VAR, FULL, TGT)                                                    \
    __global__ void name(const float *in, const sph_sm90_epi ep, int64_t r0, int64_t Vs) {     \
        (void)in, (void)ep, (void)r0, (void)Vs;                                                \
    }
#define SASS_DL(name, FULL, TGT) SASS_EPI(name, false, false, 0, FULL, TGT)
#endif

SASS_EPI(sass_epi_plain, false, false, 0, false, true)
SASS_EPI(sass_epi_sump2, true, false, 0, false, true)
SASS_EPI(sass_epi_topk, true, true, 0, false, true)    /* the default: v22's count */
SASS_EPI(sass_epi_topk_v1, true, true, 1, false, true) /* SPH_TEST_TOPK_VARIANT=1: v25's count */
/* a whole tile alone (what all but a split's last tile run) */
SASS_EPI(sass_epi_full_plain, false, false, 0, true, true)
SASS_EPI(sass_epi_full_sump2, true, false, 0, true, true)
SASS_EPI(sass_epi_full_topk, true, true, 0, true, true)
/* a whole tile in a warp none of whose 16 rows has its target in it (v29) */
SASS_EPI(sass_epi_fullnt_plain, false, false, 0, true, false)
SASS_EPI(sass_epi_fullnt_topk, true, true, 0, true, false)
/* the backward's dlogits epilogue, a split's last tile and a whole one */
SASS_DL(sass_epi_dlogits, false, true)
SASS_DL(sass_epi_full_dlogits, true, true)
SASS_DL(sass_epi_fullnt_dlogits, true, false)

#ifndef SASS_EPI_QUICK
/* The fused statistics kernel itself in its two top-k schedules' bf16 instantiations (general
 * and one-pass, ping-pong: the schedule at H <= 3072), for its registers and stack: every
 * epilogue variant shares one register allocation, so a variant's pressure can spill the
 * kernel's own loop state (run 33: 128 bytes of stack cost 1.3 ms). */
template __global__ void head_logits_sm90_kernel<__nv_bfloat16, SPH_SM90_EPI_STATS, true>(
    const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap, const sph_sm90_epi,
    int64_t, int64_t, int64_t, int);
template __global__ void
head_logits_sm90_kernel<__nv_bfloat16, SPH_SM90_EPI_STATS | SPH_SM90_EPI_E, true>(
    const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap, const sph_sm90_epi,
    int64_t, int64_t, int64_t, int);
#endif
