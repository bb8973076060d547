/*
 * head_cpu_avx512.c - AVX-512F versions of the epilogue loops (cpu_kernels.h), 16 lanes.
 *
 * exp: x = n ln2 + r with n = round(x log2 e), |r| <= ln2/2 (ln2 split in two constants so
 * n ln2 is exact), e^r by a degree-7 polynomial (the classic single-precision minimax
 * coefficients, relative error ~1e-7), times 2^n built in the exponent field. x is clamped to
 * [-88, 88] with the input as the second operand of max/min, so a NaN passes through the
 * clamp and poisons the sums (a non-finite row stays non-finite). Below -88 the result is 0
 * (e^-88 ~ 6e-39 is below every sum it would join).
 */
#include <immintrin.h>
#include <math.h>

#include "head/cpu_kernels.h"

static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-88.0f), x);
    x = _mm512_min_ps(_mm512_set1_ps(88.0f), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    e = _mm512_max_epi32(e, _mm512_setzero_si512()); /* n = -127 at the clamp: 2^n -> 0 */
    __m512 pow2 = _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
    return _mm512_mul_ps(y, pow2);
}

void sph_head_tile_stats_avx512(float *x, int64_t n, float inv_t, float out[4]) {
    const __m512 it = _mm512_set1_ps(inv_t);
    __m512 vm = _mm512_set1_ps(-INFINITY), vsz = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 u = _mm512_loadu_ps(x + j);
        vm = _mm512_max_ps(vm, u);
        vsz = _mm512_fmadd_ps(u, it, vsz);
    }
    if (j < n) {
        __mmask16 k = (__mmask16)((1u << (n - j)) - 1);
        __m512 u = _mm512_maskz_loadu_ps(k, x + j);
        vm = _mm512_mask_max_ps(vm, k, vm, u);
        vsz = _mm512_mask3_fmadd_ps(u, it, vsz, k);
    }
    const float m = _mm512_reduce_max_ps(vm);
    /* shifted before scaling, (u - m) / T: exact at any logit magnitude (cpu_kernels.h) */
    const __m512 mm = _mm512_set1_ps(m);
    __m512 vs = _mm512_setzero_ps(), vb = _mm512_setzero_ps();
    for (j = 0; j + 16 <= n; j += 16) {
        __m512 u = _mm512_loadu_ps(x + j), y = _mm512_mul_ps(_mm512_sub_ps(u, mm), it);
        __m512 p = exp512(y);
        vs = _mm512_add_ps(vs, p);
        vb = _mm512_fmadd_ps(p, y, vb);
    }
    if (j < n) {
        __mmask16 k = (__mmask16)((1u << (n - j)) - 1);
        __m512 u = _mm512_maskz_loadu_ps(k, x + j), y = _mm512_mul_ps(_mm512_sub_ps(u, mm), it);
        __m512 p = exp512(y);
        vs = _mm512_mask_add_ps(vs, k, vs, p);
        vb = _mm512_mask3_fmadd_ps(p, y, vb, k); /* lanes outside k keep vb */
    }
    out[0] = m;
    out[1] = _mm512_reduce_add_ps(vs);
    out[2] = _mm512_reduce_add_ps(vb);
    out[3] = _mm512_reduce_add_ps(vsz);
}

void sph_head_tile_grad_avx512(float *x, int64_t n, float xs, float ys, float ls, float A,
                               float e, float dm, float C, float inv_t) {
    const __m512 vl = _mm512_set1_ps(ls), va = _mm512_set1_ps(A), ve = _mm512_set1_ps(e),
                 vc = _mm512_set1_ps(C), it = _mm512_set1_ps(inv_t), vdm = _mm512_set1_ps(dm),
                 vxs = _mm512_set1_ps(xs), vys = _mm512_set1_ps(ys);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 y = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + j), vxs), vys);
        __m512 p = exp512(_mm512_sub_ps(y, vl));
        __m512 d = _mm512_fmadd_ps(p, _mm512_fmadd_ps(ve, _mm512_sub_ps(vdm, y), va), vc);
        _mm512_storeu_ps(x + j, _mm512_mul_ps(d, it));
    }
    if (j < n) {
        __mmask16 k = (__mmask16)((1u << (n - j)) - 1);
        __m512 y = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), vxs), vys);
        __m512 p = exp512(_mm512_sub_ps(y, vl));
        __m512 d = _mm512_fmadd_ps(p, _mm512_fmadd_ps(ve, _mm512_sub_ps(vdm, y), va), vc);
        _mm512_mask_storeu_ps(x + j, k, _mm512_mul_ps(d, it));
    }
}

void sph_head_cvt_avx512(const uint16_t *src, float *dst, int64_t n, int is_bf16) {
    int64_t j = 0;
    if (is_bf16) {
        for (; j + 16 <= n; j += 16) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(src + j));
            __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16);
            _mm512_storeu_ps(dst + j, _mm512_castsi512_ps(w));
        }
        for (; j < n; j++) {
            union { uint32_t u; float f; } c = {(uint32_t)src[j] << 16};
            dst[j] = c.f;
        }
    } else {
        for (; j + 16 <= n; j += 16)
            _mm512_storeu_ps(dst + j,
                             _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + j))));
        for (; j < n; j++) {
            __m128 v = _mm_cvtph_ps(_mm_set1_epi16((short)src[j]));
            dst[j] = _mm_cvtss_f32(v);
        }
    }
}
