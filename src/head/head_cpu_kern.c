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
        m = x[j] > m ? x[j] : m; /* a NaN never wins here; s and d below carry it */
        sz += x[j] * inv_t;
    }
    float s = 0, d = 0;
    for (int64_t j = 0; j < n; j++) {
        float y = (x[j] - m) * inv_t; /* shifted before scaling: exact at any |z| */
        float p = expf(y);
        s += p;
        d += p * y;
    }
    out[0] = m, out[1] = s, out[2] = d, out[3] = sz;
}

void sph_head_tile_grad_generic(float *x, int64_t n, float xs, float ys, float ls, float A,
                                float e, float dm, float C, float inv_t) {
    for (int64_t j = 0; j < n; j++) {
        float y = (x[j] - xs) * ys, p = expf(y - ls);
        x[j] = (p * (A + e * (dm - y)) + C) * inv_t;
    }
}

void sph_head_store_f32(void *base, sph_dtype dt, int64_t k, float v, int acc) {
    if (acc && v == 0) return;
    if (dt.bits == 32) {
        float *f = base;
        f[k] = acc ? f[k] + v : v;
        return;
    }
    uint16_t *b = base;
    const int bf = dt.code == SPH_DTYPE_BFLOAT;
    if (acc) v += bf ? sph_bf16_to_f32(b[k]) : sph_f16_to_f32(b[k]);
    b[k] = bf ? sph_f32_to_bf16(v) : sph_f32_to_f16(v);
}

void sph_head_cvt_generic(const uint16_t *src, float *dst, int64_t n, int is_bf16) {
    if (is_bf16)
        for (int64_t j = 0; j < n; j++) dst[j] = sph_bf16_to_f32(src[j]);
    else
        for (int64_t j = 0; j < n; j++) dst[j] = sph_f16_to_f32(src[j]);
}
