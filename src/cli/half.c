/*
 * half.c - see half.h.
 */
#include "half.h"

#include <math.h>
#include <string.h>

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t sph_cli_f32_to_bf16(float f) {
    uint32_t u = bits_of(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float sph_cli_bf16_to_f32(uint16_t h) { return float_of((uint32_t)h << 16); }

uint16_t sph_cli_f32_to_f16(float f) {
    uint32_t u = bits_of(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: inf */
    if (a < 0x38800000u) /* subnormal half: multiples of 2^-24, lrintf rounds to even */
        return (uint16_t)(sign | (uint32_t)lrintf(fabsf(f) * 16777216.0f));
    uint32_t e = (a >> 23) - 112, m = a & 0x7fffffu, h = e << 10 | m >> 13, rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

float sph_cli_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return float_of(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    return float_of(sign | ((e + 112) << 23) | (m << 13));
}

float sph_cli_load_float(const void *x, int64_t k, int bits, int is_bf16) {
    if (bits == 32) return ((const float *)x)[k];
    uint16_t h = ((const uint16_t *)x)[k];
    return is_bf16 ? sph_cli_bf16_to_f32(h) : sph_cli_f16_to_f32(h);
}

int64_t sph_cli_first_nonfinite(const void *x, int64_t n, int bits, int is_bf16) {
    if (bits == 32) {
        const uint32_t *u = x;
        for (int64_t k = 0; k < n; k++)
            if ((u[k] & 0x7f800000u) == 0x7f800000u) return k;
        return -1;
    }
    const uint16_t *h = x, e = is_bf16 ? 0x7f80u : 0x7c00u;
    for (int64_t k = 0; k < n; k++)
        if ((h[k] & e) == e) return k;
    return -1;
}
