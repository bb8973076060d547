/*
 * sgemm_rate.c - this machine's dense fp32 GEMM rate, the denominator of the CPU's active
 * floor in `spanhead run` and `spanhead bench`: BLAS sgemm (OpenBLAS, linked by the CLI) on
 * an (m x K) x (K x n) product.
 */
#include <stdlib.h>

#include "cli.h"
#include "clock.h"
#include "num.h"
#include "rng.h"

/* cblas.h's declaration, so the CLI needs no BLAS header (CblasRowMajor 101, NoTrans 111,
 * Trans 112). */
void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                 int lda, const float *b, int ldb, float beta, float *c, int ldc);

double sph_cli_sgemm_rate(int64_t m, int64_t n, int64_t K, int chain, int reps) {
    if (m < 1 || n < 1 || K < 1 || K > (1 << 30) || chain < 1 || reps < 1) return 0;
    float *a = sph_cli_alloc(m * K, 4), *b = sph_cli_alloc(n * K, 4), *c = sph_cli_alloc(m * n, 4);
    double *t = malloc(sizeof(double) * (size_t)reps), rate = 0;
    if (a && b && c && t) {
        sph_cli_rng r;
        sph_cli_rng_seed(&r, 7);
        for (int64_t i = 0; i < m * K; i++) a[i] = (float)(2 * sph_cli_rng_uniform(&r) - 1);
        for (int64_t i = 0; i < n * K; i++) b[i] = (float)(2 * sph_cli_rng_uniform(&r) - 1);
        for (int rep = -1; rep < reps; rep++) { /* rep -1 warms up the threads */
            double t0 = sph_cli_now_s();
            for (int k = 0; k < chain; k++)
                cblas_sgemm(101, 111, 112, (int)m, (int)n, (int)K, 1.f, a, (int)K, b, (int)K,
                            0.f, c, (int)n);
            if (rep >= 0) t[rep] = sph_cli_now_s() - t0;
        }
        double med = sph_cli_median(t, reps);
        rate = med > 0 ? chain * 2.0 * (double)m * (double)n * (double)K / med : 0;
    }
    free(a), free(b), free(c), free(t);
    return rate;
}
