/*
 * bench_sm90_epi.c - where the fused sm_90a kernels lose time against cuBLAS: the main loop
 * alone and with each epilogue, under both schedules, next to cuBLAS doing the same product.
 *
 * Shape: L (N, V) = h (N, H) . W (V, H)^T, bf16 inputs, fp32 accumulation, random data (the
 * operands, (N + V) H 2 bytes, dwarf the 50 MB L2). Rows:
 *   cublas          cublasGemmEx, bf16 out (sph_tune_gemm_rate / _sustained)
 *   none            head_sm90 main loop, no epilogue (SPH_SM90_EPI_NONE)
 *   stats           + the forward's per-row tile records (SPH_SM90_EPI_STATS)
 *   dlogits         + du in bf16 from the recomputed logits (SPH_SM90_EPI_DLOGITS)
 *   logits          + L in fp32 (SPH_SM90_EPI_L: the one-pass staging and batch-invariant path)
 * each for the ping-pong and the cooperative schedule (epi.schedule). Two timings
 * per row: "burst", one launch per event pair and synchronized (median of reps, after 2
 * warm-up launches), and "chain", 4 launches back to back timed as a whole (median of reps):
 * the H200 is power-limited, and the head issues its products back to back.
 * Timing only: the kernels' results are tested in tests/gpu (test_fused, test_pingpong).
 *
 * usage: bench_sm90_epi [--N 16384] [--H 2048] [--V 62080] [--reps 7]
 * Exits 77 without a CUDA device or off sm_90.
 */
#include <stdio.h>
#ifndef SPH_HAVE_CUDA
int main(void) {
    printf("bench_sm90_epi: spanhead was built without CUDA: skipping\n");
    return 77;
}
#else
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cuda.h"
#include "core/internal.h"
#include "cuda/head_sm90.cuh"
#include "head/plan.h"

#define CHAIN 4

/* Fills n bf16 values (uniform in [-s, s)) on the device through a host buffer. */
static void fill_bf16(void *d, int64_t n, float s, uint64_t seed) {
    uint16_t *h = malloc((size_t)n * 2);
    if (!h) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) {
        seed ^= seed >> 12, seed ^= seed << 25, seed ^= seed >> 27;
        const double u = (double)((seed * 2685821657736338717ull) >> 11) / 9007199254740992.0;
        h[i] = sph_f32_to_bf16((float)((2 * u - 1) * s));
    }
    CK(cudaMemcpy(d, h, (size_t)n * 2, cudaMemcpyHostToDevice));
    free(h);
}

typedef struct op {
    const void *h, *w;
    int64_t N, V, H;
    sph_sm90_epi ep;
} op;

static void launch(const op *o) {
    if (sph_cuda_head_sm90(SPH_BF16, o->h, o->H, o->w, o->H, o->N, o->V, o->H, &o->ep, NULL) !=
        SPH_OK) {
        fprintf(stderr, "%s\n", sph_last_error());
        exit(1);
    }
}

/* Median ms of one launch (burst) and of a chain of CHAIN launches divided by CHAIN. */
static void time_op(const op *o, int reps, float *burst, float *chain) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float *t = malloc(sizeof(float) * (size_t)reps);
    if (!t) exit(1);
    for (int i = 0; i < 2; i++) launch(o);
    CK(cudaDeviceSynchronize());
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(e0, NULL));
        launch(o);
        CK(cudaEventRecord(e1, NULL));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t[i], e0, e1));
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_f);
    *burst = t[reps / 2];
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(e0, NULL));
        for (int k = 0; k < CHAIN; k++) launch(o);
        CK(cudaEventRecord(e1, NULL));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t[i], e0, e1));
        t[i] /= CHAIN;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_f);
    *chain = t[reps / 2];
    free(t);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
}

int main(int argc, char **argv) {
    int64_t N = 16384, H = 2048, V = 62080;
    int reps = 7;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--N") && i + 1 < argc) N = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--H") && i + 1 < argc) H = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--V") && i + 1 < argc) V = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--N n] [--H h] [--V v] [--reps r]\n", argv[0]);
            return 2;
        }
    }
    if (N <= 0 || H <= 0 || H % 8 || V <= 0 || reps < 1) {
        fprintf(stderr, "N, V and reps must be positive, H a positive multiple of 8\n");
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0 || !sph_cuda_sm90_available()) {
        printf("bench_sm90_epi: no sm_90 device with the sm_90a kernels: skipping\n");
        return 77;
    }
    sph_ctx_opts co = SPH_CTX_OPTS_INIT;
    co.device.type = SPH_DEVICE_CUDA;
    sph_ctx_t ctx;
    if (sph_ctx_create(&ctx, &co) != SPH_OK) {
        fprintf(stderr, "context: %s\n", sph_last_error());
        return 1;
    }
    const double flop = 2.0 * (double)N * (double)H * (double)V;
    double burst_tf = 0, chain_tf = 0;
    if (sph_tune_gemm_rate(ctx, SPH_BF16, N, V, H, reps, &burst_tf) != SPH_OK ||
        sph_tune_gemm_rate_sustained(ctx, SPH_BF16, N, V, H, CHAIN, reps, &chain_tf) != SPH_OK) {
        fprintf(stderr, "cuBLAS rate: %s\n", sph_last_error());
        return 1;
    }
    const float cb_burst = (float)(flop / (burst_tf * 1e12) * 1e3);
    const float cb_chain = (float)(flop / (chain_tf * 1e12) * 1e3);
    printf("shape: N=%lld H=%lld V=%lld bf16, reps %d, chain %d\n\n", (long long)N, (long long)H,
           (long long)V, reps, CHAIN);
    printf("| kernel | schedule | burst ms | x cuBLAS | chain ms | x cuBLAS | chain TFLOP/s |\n");
    printf("|---|---|---|---|---|---|---|\n");
    printf("| cublas | - | %.3f | 1.000 | %.3f | 1.000 | %.1f |\n", cb_burst, cb_chain, chain_tf);

    void *dh, *dw, *dD, *dtgt;
    float *dL, *drec, *dst, *dg;
    const int64_t n_n = (V + SPH_SM90_TILE_N - 1) / SPH_SM90_TILE_N;
    CK(cudaMalloc(&dh, (size_t)(N * H) * 2));
    CK(cudaMalloc(&dw, (size_t)(V * H) * 2));
    CK(cudaMalloc((void **)&dL, (size_t)(N * V) * 4));
    CK(cudaMalloc(&dD, (size_t)(N * V) * 2));
    CK(cudaMalloc((void **)&drec, (size_t)(N * n_n) * SPH_PARTIAL_FIELDS * 4));
    CK(cudaMalloc((void **)&dst, (size_t)N * 3 * 4));
    CK(cudaMalloc((void **)&dg, (size_t)N * 4));
    CK(cudaMalloc(&dtgt, (size_t)N * 4));
    fill_bf16(dh, N * H, 1.f, 0x9E3779B97F4A7C15ull);
    fill_bf16(dw, V * H, 0.05f, 0xD1B54A32D192ED03ull);
    { /* statistics that keep p in range, targets spread over the vocabulary, g = -1 */
        float *st = malloc((size_t)N * 3 * 4), *g = malloc((size_t)N * 4);
        int32_t *tg = malloc((size_t)N * 4);
        if (!st || !g || !tg) return 1;
        for (int64_t i = 0; i < N; i++) {
            st[3 * i] = 0.f, st[3 * i + 1] = 12.f, st[3 * i + 2] = 0.f;
            g[i] = -1.f, tg[i] = (int32_t)((i * 7919) % V);
        }
        CK(cudaMemcpy(dst, st, (size_t)N * 3 * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dg, g, (size_t)N * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dtgt, tg, (size_t)N * 4, cudaMemcpyHostToDevice));
        free(st), free(g), free(tg);
    }
    const struct {
        const char *name;
        int mode;
    } ks[4] = {{"none", SPH_SM90_EPI_NONE},
               {"stats", SPH_SM90_EPI_STATS},
               {"dlogits", SPH_SM90_EPI_DLOGITS},
               {"logits", SPH_SM90_EPI_L}};
    const int sched[2] = {SPH_SM90_SCHED_PINGPONG, SPH_SM90_SCHED_COOPERATIVE};
    const char *sched_name[2] = {"ping-pong", "cooperative"};
    for (int k = 0; k < 4; k++)
        for (int s = 0; s < 2; s++) {
            op o;
            memset(&o, 0, sizeof o);
            o.h = dh, o.w = dw, o.N = N, o.V = V, o.H = H;
            o.ep.mode = ks[k].mode;
            o.ep.schedule = sched[s];
            o.ep.L = dL, o.ep.ldL = V, o.ep.tile_recs = drec, o.ep.D = dD, o.ep.ldD = V;
            o.ep.tgt = dtgt, o.ep.inv_t = 1.f, o.ep.inv_V = 1.f / (float)V;
            o.ep.stats = dst, o.ep.g = dg;
            float b = 0, c = 0;
            time_op(&o, reps, &b, &c);
            printf("| %s | %s | %.3f | %.3f | %.3f | %.3f | %.1f |\n", ks[k].name, sched_name[s], b,
                   b / cb_burst, c, c / cb_chain, flop / (c * 1e-3) / 1e12);
            fflush(stdout);
        }
    CK(cudaFree(dh));
    CK(cudaFree(dw));
    CK(cudaFree(dL));
    CK(cudaFree(dD));
    CK(cudaFree(drec));
    CK(cudaFree(dst));
    CK(cudaFree(dg));
    CK(cudaFree(dtgt));
    sph_ctx_destroy(ctx);
    return 0;
}
#endif
