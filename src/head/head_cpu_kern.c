/*
 * head_cpu_kern.c - portable C versions of the epilogue loops (cpu_kernels.h). Also the
 * fallback for every ISA's tail handling and the definition of what the SIMD versions compute.
 */
#include <math.h>

#include "core/internal.h"
#include "head/cpu_kernels.h"

void sph_head_tile_stats_generic(float *x, int64_t n, float inv_t, float out[4]) {
    float m = -INFINITY, sz = 0;
    for (int64_t j = 0; j < n; j++) {
        float z = x[j] * inv_t;
        x[j] = z;
        m = z > m ? z : m; /* a NaN z never wins here; s and b below carry it */
        sz += z;
    }
    float s = 0, b = 0;
    for (int64_t j = 0; j < n; j++) {
        float p = expf(x[j] - m);
        s += p;
        b += p * (x[j] - m);
    }
    out[0] = m, out[1] = s, out[2] = b, out[3] = sz;
}

void sph_head_tile_grad_generic(float *x, int64_t n, float lse, float A, float e, float mu, float C,
                                float inv_t) {
    for (int64_t j = 0; j < n; j++) {
        float z = x[j], p = expf(z - lse);
        x[j] = (p * (A + e * (mu - z)) + C) * inv_t;
    }
}

void sph_head_cvt_generic(const uint16_t *src, float *dst, int64_t n, int is_bf16) {
    if (is_bf16)
        for (int64_t j = 0; j < n; j++) dst[j] = sph_bf16_to_f32(src[j]);
    else
        for (int64_t j = 0; j < n; j++) dst[j] = sph_f16_to_f32(src[j]);
}
