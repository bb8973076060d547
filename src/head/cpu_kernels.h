/*
 * cpu_kernels.h - the hot epilogue loops of the optimized CPU head, one implementation per
 * ISA (head_cpu_kern.c generic C, head_cpu_avx2.c, head_cpu_avx512.c), picked at run time
 * from ctx->isa. They work on one row of a cache-resident logits tile.
 *
 *   tile_stats: x[0..n) holds raw products u; writes z = u * inv_t back and returns the tile's
 *     partial record out = (m, s, d, sz): m = max z, s = sum e^(z - m),
 *     d = sum e^(z - m) (z - m) (shifted so the dominant terms are ~0: b = d + m s is formed
 *     in float64 by the caller, which keeps entropy = lse - b/s accurate for peaked rows),
 *     sz = sum z. A NaN in x makes s and d NaN (never dropped by max).
 *   tile_grad: x holds z; writes du = (e^(z - lse) (A + e (mu - z)) + C) * inv_t, the
 *     gradient of the row without its target term (A = gl - g, C = gm / V). mu - z is formed
 *     first: for the dominant tokens of a peaked row it cancels, and e mu - e z would leave
 *     the rounding error of e mu behind.
 *   cvt: bf16 (is_bf16) or f16 -> f32.
 * Softcapping is handled by the generic scalar loops only (tanh per element).
 */
#ifndef SPH_HEAD_CPU_KERNELS_H
#define SPH_HEAD_CPU_KERNELS_H

#include <stdint.h>

typedef struct sph_head_kern {
    void (*tile_stats)(float *x, int64_t n, float inv_t, float out[4]);
    void (*tile_grad)(float *x, int64_t n, float lse, float A, float e, float mu, float C, float inv_t);
    void (*cvt)(const uint16_t *src, float *dst, int64_t n, int is_bf16);
} sph_head_kern;

void sph_head_tile_stats_generic(float *x, int64_t n, float inv_t, float out[4]);
void sph_head_tile_grad_generic(float *x, int64_t n, float lse, float A, float e, float mu, float C,
                                float inv_t);
void sph_head_cvt_generic(const uint16_t *src, float *dst, int64_t n, int is_bf16);

void sph_head_tile_stats_avx2(float *x, int64_t n, float inv_t, float out[4]);
void sph_head_tile_grad_avx2(float *x, int64_t n, float lse, float A, float e, float mu, float C,
                             float inv_t);
void sph_head_cvt_avx2(const uint16_t *src, float *dst, int64_t n, int is_bf16);

void sph_head_tile_stats_avx512(float *x, int64_t n, float inv_t, float out[4]);
void sph_head_tile_grad_avx512(float *x, int64_t n, float lse, float A, float e, float mu, float C,
                               float inv_t);
void sph_head_cvt_avx512(const uint16_t *src, float *dst, int64_t n, int is_bf16);

#endif
