/*
 * cpu_kernels.h - the hot epilogue loops of the optimized CPU head, one implementation per
 * ISA (head_cpu_kern.c generic C, head_cpu_avx2.c, head_cpu_avx512.c), picked at run time
 * from ctx->isa. They work on one row of a cache-resident logits tile.
 *
 *   Both work on x = the raw products u (z = u * inv_t) through y = (u - shift) * inv_t: the
 *   logit shifted by the row max before the scaling, so that a low temperature (|z| large)
 *   never turns z - m into a difference of two rounded numbers of the logits' magnitude.
 *   tile_stats: leaves x as it is and returns the tile's partial record out = (xm, s, d, sz):
 *     xm = max u (unscaled: the caller forms m = xm * inv_t, exact in float64), with
 *     y = (u - xm) * inv_t: s = sum e^y, d = sum e^y y (the float64 record keeps d shifted
 *     too, combine.c, so entropy = log s - d/s never cancels), sz = sum u * inv_t. A NaN in
 *     x makes s and d NaN (never dropped by max).
 *   tile_grad: with y = (x - xs) * ys = z - m (xs the row max in units of x: the raw max u
 *     with ys = inv_t when the float64 record gives it exactly; the float32 stats' m with
 *     x = z already scaled and ys = 1 in a two-pass backward, where the max token's z
 *     rounds to m bitwise), ls = log S and dm = mu - m of the row: writes
 *     du = (e^(y - ls) (A + e (dm - y)) + C) * inv_t, the gradient of the row without its
 *     target term (A = gl - g, C = gm / V). dm - y is formed first: for the dominant tokens
 *     of a peaked row it cancels, and e dm - e y would leave the rounding error of e dm.
 *   cvt: bf16 (is_bf16) or f16 -> f32.
 * Softcapping is handled by the generic scalar loops only (tanh per element).
 */
#ifndef SPH_HEAD_CPU_KERNELS_H
#define SPH_HEAD_CPU_KERNELS_H

#include <stdint.h>

#include "spanhead.h" /* sph_dtype */

typedef struct sph_head_kern {
    void (*tile_stats)(float *x, int64_t n, float inv_t, float out[4]);
    void (*tile_grad)(float *x, int64_t n, float xs, float ys, float ls, float A, float e, float dm,
                      float C, float inv_t);
    void (*cvt)(const uint16_t *src, float *dst, int64_t n, int is_bf16);
} sph_head_kern;

void sph_head_tile_stats_generic(float *x, int64_t n, float inv_t, float out[4]);
void sph_head_tile_grad_generic(float *x, int64_t n, float xs, float ys, float ls, float A,
                                float e, float dm, float C, float inv_t);
void sph_head_cvt_generic(const uint16_t *src, float *dst, int64_t n, int is_bf16);
/* base[k] = v, or base[k] += v (acc), in base's dtype (f32, bf16, f16); accumulating, an
 * exactly-zero v keeps the start bit for bit (start + 0 is the start; a -0 start would round
 * to +0: with no active row dweight must stay its start), as the reference does (head_ref.c
 * store_grads). The host paths' stores of dhidden and dweight (head, distillation). */
void sph_head_store_f32(void *base, sph_dtype dt, int64_t k, float v, int acc);

void sph_head_tile_stats_avx2(float *x, int64_t n, float inv_t, float out[4]);
void sph_head_tile_grad_avx2(float *x, int64_t n, float xs, float ys, float ls, float A,
                             float e, float dm, float C, float inv_t);
void sph_head_cvt_avx2(const uint16_t *src, float *dst, int64_t n, int is_bf16);

void sph_head_tile_stats_avx512(float *x, int64_t n, float inv_t, float out[4]);
void sph_head_tile_grad_avx512(float *x, int64_t n, float xs, float ys, float ls, float A,
                               float e, float dm, float C, float inv_t);
void sph_head_cvt_avx512(const uint16_t *src, float *dst, int64_t n, int is_bf16);

#endif
