/*
 * bench_sm90_logits.c - the two batch-invariant logits kernels side by side:
 * L (N, V) fp32 = h (N, H) . W (V, H)^T, bf16 (or f16) inputs, fp32 accumulation, through
 * variant 0 (head_mma.cu: mma.sync m16n8k16, cp.async, 128x128x32 tiles) and variant 1
 * (head_sm90.cu: TMA + mbarrier ring + wgmma m64n256k16, 128x256x64 tiles).
 *
 * Validates each variant once against float64 dot products on 512 sampled elements, then
 * times reps launches per variant (cudaEvents, after warm-up) and prints median, p10, p90
 * and TFLOP/s = 2 N H V / t. The operands (N H + V H) 2 bytes, 384 MB at the default shape,
 * dwarf the 50 MB L2, so no flush is needed between repetitions.
 *
 * usage: bench_sm90_logits [--N 16384] [--H 4096] [--V 32768] [--reps 10] [--f16]
 * Exits 77 without a CUDA device; variant 1 reports "unavailable" off sm_90.
 */
#include <stdio.h>
#ifndef SPH_HAVE_CUDA
int main(void) {
    printf("bench_sm90_logits: spanhead was built without CUDA: skipping\n");
    return 77;
}
#else
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_cuda.h"
#include "core/internal.h"
#include "cuda/head_sm90.cuh"


static uint64_t g_s = 0x9E3779B97F4A7C15ull;
static double uni(void) { /* xorshift64*, [-1, 1) */
    g_s ^= g_s >> 12, g_s ^= g_s << 25, g_s ^= g_s >> 27;
    return (double)((g_s * 2685821657736338717ull) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

int main(int argc, char **argv) {
    int64_t N = 16384, H = 4096, V = 32768;
    int reps = 10, f16 = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--N") && i + 1 < argc) N = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--H") && i + 1 < argc) H = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--V") && i + 1 < argc) V = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--f16")) f16 = 1;
        else {
            fprintf(stderr, "usage: %s [--N n] [--H h] [--V v] [--reps r] [--f16]\n", argv[0]);
            return 2;
        }
    }
    if (N <= 0 || H <= 0 || V <= 0 || reps < 1) {
        fprintf(stderr, "N, H, V and reps must be positive\n");
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("bench_sm90_logits: no CUDA device: skipping\n");
        return 77;
    }
    struct cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    int drv = 0, rt = 0, clk = 0;
    CK(cudaDriverGetVersion(&drv));
    CK(cudaRuntimeGetVersion(&rt));
    CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0));
    time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    printf("machine: %s sm_%d%d SMs=%d clock=%d MHz driver=%d runtime=%d date=%s\n", pr.name,
           pr.major, pr.minor, pr.multiProcessorCount, clk / 1000, drv, rt, date);
    const sph_dtype dt = f16 ? SPH_F16 : SPH_BF16;
    printf("shape: N=%lld H=%lld V=%lld dtype=%s reps=%d\n", (long long)N, (long long)H,
           (long long)V, f16 ? "f16" : "bf16", reps);

    uint16_t *h = malloc((size_t)(N * H) * 2), *w = malloc((size_t)(V * H) * 2);
    if (!h || !w) {
        fprintf(stderr, "out of host memory\n");
        return 1;
    }
    for (int64_t i = 0; i < N * H; i++)
        h[i] = f16 ? sph_f32_to_f16((float)uni()) : sph_f32_to_bf16((float)uni());
    for (int64_t i = 0; i < V * H; i++)
        w[i] = f16 ? sph_f32_to_f16((float)uni()) : sph_f32_to_bf16((float)uni());
    void *dh, *dw;
    float *dL;
    CK(cudaMalloc(&dh, (size_t)(N * H) * 2));
    CK(cudaMalloc(&dw, (size_t)(V * H) * 2));
    CK(cudaMalloc((void **)&dL, (size_t)(N * V) * 4));
    CK(cudaMemcpy(dh, h, (size_t)(N * H) * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, w, (size_t)(V * H) * 2, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float *ms = malloc(sizeof(float) * (size_t)reps);
    const double flop = 2.0 * (double)N * (double)H * (double)V;
    double med[2] = {0, 0};
    const char *names[2] = {"mma.sync (head_mma.cu)", "wgmma+TMA (head_sm90.cu)"};
    printf("\n| variant | ms median | p10 | p90 | TFLOP/s | max rel err (512 samples) |\n");
    printf("| --- | --- | --- | --- | --- | --- |\n");
    for (int v = 0; v < 2; v++) {
        CK(cudaMemset(dL, 0xff, (size_t)(N * V) * 4)); /* NaN poison */
        sph_status s = sph_cuda_logits_variant(v, dt, dh, H, dw, H, dL, V, N, V, H, NULL);
        if (s != SPH_OK) {
            printf("| %s | unavailable: %s |\n", names[v], sph_last_error());
            continue;
        }
        CK(cudaDeviceSynchronize());
        double worst = 0;
        for (int k = 0; k < 512; k++) { /* validate: sampled elements vs float64 */
            int64_t r = (int64_t)((uni() + 1) / 2 * (double)N);
            int64_t c = (int64_t)((uni() + 1) / 2 * (double)V);
            r = r >= N ? N - 1 : r, c = c >= V ? V - 1 : c;
            double ref = 0, mag = 0;
            for (int64_t q = 0; q < H; q++) {
                double a = f16 ? sph_f16_to_f32(h[r * H + q]) : sph_bf16_to_f32(h[r * H + q]);
                double b = f16 ? sph_f16_to_f32(w[c * H + q]) : sph_bf16_to_f32(w[c * H + q]);
                ref += a * b, mag += fabs(a * b);
            }
            float got;
            CK(cudaMemcpy(&got, dL + r * V + c, 4, cudaMemcpyDeviceToHost));
            double rel = fabs((double)got - ref) / (mag > 0 ? mag : 1);
            if (!(rel <= worst)) worst = rel; /* NaN sticks */
        }
        for (int i = 0; i < 2; i++) /* warm-up */
            if (sph_cuda_logits_variant(v, dt, dh, H, dw, H, dL, V, N, V, H, NULL) != SPH_OK) {
                fprintf(stderr, "%s\n", sph_last_error());
                return 1;
            }
        for (int i = 0; i < reps; i++) {
            CK(cudaEventRecord(e0, NULL));
            if (sph_cuda_logits_variant(v, dt, dh, H, dw, H, dL, V, N, V, H, NULL) != SPH_OK) {
                fprintf(stderr, "%s\n", sph_last_error());
                return 1;
            }
            CK(cudaEventRecord(e1, NULL));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&ms[i], e0, e1));
        }
        qsort(ms, (size_t)reps, sizeof *ms, cmp_f);
        med[v] = ms[reps / 2];
        printf("| %s | %.3f | %.3f | %.3f | %.1f | %.2e%s |\n", names[v], med[v], ms[reps / 10],
               ms[reps - 1 - reps / 10], flop / (med[v] * 1e-3) / 1e12, worst,
               worst <= 1e-4 ? "" : " FAIL");
        if (!(worst <= 1e-4)) return 1;
    }
    if (med[0] > 0 && med[1] > 0) printf("\nspeedup wgmma / mma.sync: %.2fx\n", med[0] / med[1]);
    CK(cudaFree(dh));
    CK(cudaFree(dw));
    CK(cudaFree(dL));
    free(h), free(w), free(ms);
    return 0;
}
#endif
