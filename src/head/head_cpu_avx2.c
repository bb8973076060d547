/*
 * head_cpu_avx2.c - AVX2 + FMA + F16C versions of the epilogue loops (cpu_kernels.h), 8 lanes.
 * Same exp as head_cpu_avx512.c (see there for the numerics); tails go through the generic
 * scalar code so every element is computed by one definition or the other, never twice.
 */
#include <immintrin.h>
#include <math.h>

#include "core/internal.h"
#include "head/cpu_kernels.h"

static inline __m256 exp256(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-88.0f), x); /* NaN (second operand) passes through */
    x = _mm256_min_ps(_mm256_set1_ps(88.0f), x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    e = _mm256_max_epi32(e, _mm256_setzero_si256());
    return _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
}

static inline float hmax256(__m256 v) {
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    a = _mm_max_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

static inline float hsum256(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

void sph_head_tile_stats_avx2(float *x, int64_t n, float inv_t, float out[4]) {
    const __m256 it = _mm256_set1_ps(inv_t);
    __m256 vm = _mm256_set1_ps(-INFINITY), vsz = _mm256_setzero_ps();
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t j = 0; j < n8; j += 8) {
        __m256 u = _mm256_loadu_ps(x + j);
        vm = _mm256_max_ps(vm, u);
        vsz = _mm256_fmadd_ps(u, it, vsz);
    }
    float m = hmax256(vm), sz = hsum256(vsz);
    for (int64_t j = n8; j < n; j++) {
        m = x[j] > m ? x[j] : m;
        sz += x[j] * inv_t;
    }
    /* shifted before scaling, (u - m) / T: exact at any logit magnitude (cpu_kernels.h) */
    const __m256 mm = _mm256_set1_ps(m);
    __m256 vs = _mm256_setzero_ps(), vb = _mm256_setzero_ps();
    for (int64_t j = 0; j < n8; j += 8) {
        __m256 u = _mm256_loadu_ps(x + j), y = _mm256_mul_ps(_mm256_sub_ps(u, mm), it);
        __m256 p = exp256(y);
        vs = _mm256_add_ps(vs, p);
        vb = _mm256_fmadd_ps(p, y, vb);
    }
    float s = hsum256(vs), b = hsum256(vb);
    for (int64_t j = n8; j < n; j++) {
        float y = (x[j] - m) * inv_t, p = expf(y);
        s += p;
        b += p * y;
    }
    out[0] = m, out[1] = s, out[2] = b, out[3] = sz;
}

void sph_head_tile_grad_avx2(float *x, int64_t n, float xs, float ys, float ls, float A, float e,
                             float dm, float C, float inv_t) {
    const __m256 vl = _mm256_set1_ps(ls), va = _mm256_set1_ps(A), ve = _mm256_set1_ps(e),
                 vc = _mm256_set1_ps(C), it = _mm256_set1_ps(inv_t), vdm = _mm256_set1_ps(dm),
                 vxs = _mm256_set1_ps(xs), vys = _mm256_set1_ps(ys);
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t j = 0; j < n8; j += 8) {
        __m256 y = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), vxs), vys);
        __m256 p = exp256(_mm256_sub_ps(y, vl));
        __m256 d = _mm256_fmadd_ps(p, _mm256_fmadd_ps(ve, _mm256_sub_ps(vdm, y), va), vc);
        _mm256_storeu_ps(x + j, _mm256_mul_ps(d, it));
    }
    sph_head_tile_grad_generic(x + n8, n - n8, xs, ys, ls, A, e, dm, C, inv_t);
}

void sph_head_cvt_avx2(const uint16_t *src, float *dst, int64_t n, int is_bf16) {
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t j = 0; j < n8; j += 8) {
        __m128i v = _mm_loadu_si128((const __m128i *)(src + j));
        __m256 f = is_bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16))
                           : _mm256_cvtph_ps(v);
        _mm256_storeu_ps(dst + j, f);
    }
    sph_head_cvt_generic(src + n8, dst + n8, n - n8, is_bf16);
}
