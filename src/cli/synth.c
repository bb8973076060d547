/*
 * synth.c - synthetic inputs (see synth.h). splitmix64 keeps every stream reproducible from
 * the seed alone.
 */
#include "synth.h"

#include <math.h>
#include <string.h>

void synth_seed(synth_rng *r, uint64_t seed) { r->s = seed * 0x9e3779b97f4a7c15ull + 1; }

uint64_t synth_u64(synth_rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double synth_uniform(synth_rng *r) { return (double)(synth_u64(r) >> 11) * 0x1.0p-53; }

double synth_normal(synth_rng *r) {
    double u = synth_uniform(r), v = synth_uniform(r);
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

int64_t synth_range(synth_rng *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)(synth_u64(r) % (uint64_t)(hi - lo + 1));
}

int synth_mask(const char *pattern, int64_t N, double frac, synth_rng *r, uint8_t *mask,
               int64_t *n_seq) {
    *n_seq = 0;
    memset(mask, 0, (size_t)N);
    if (!strcmp(pattern, "all")) {
        memset(mask, 1, (size_t)N);
    } else if (!strcmp(pattern, "none")) {
        /* all zero */
    } else if (!strcmp(pattern, "random")) {
        for (int64_t i = 0; i < N; i++) mask[i] = synth_uniform(r) < frac;
    } else if (!strcmp(pattern, "fragmented")) {
        /* runs of 1-4 active rows (mean 2.5), gaps with mean 2.5 (1 - frac) / frac */
        double mean_gap = frac > 0 ? 2.5 * (1 - frac) / frac : (double)N;
        int64_t i = 0;
        while (i < N) {
            int64_t gap = (int64_t)floor(synth_uniform(r) * 2 * mean_gap + 0.5);
            i += gap;
            int64_t run = synth_range(r, 1, 4);
            for (int64_t k = 0; k < run && i < N; k++) mask[i++] = frac > 0;
        }
    } else if (!strcmp(pattern, "response")) {
        /* sequences: prompt 16-96 tokens, response 8-160 tokens; the row predicting token
         * p + 1 carries token p + 1's loss, so rows o + P - 1 .. o + P + R - 2 are active */
        int64_t o = 0;
        while (o < N) {
            int64_t P = synth_range(r, 16, 96), R = synth_range(r, 8, 160);
            if (o + P + R > N) break; /* the rest is padding */
            for (int64_t s = o + P - 1; s <= o + P + R - 2; s++) mask[s] = 1;
            o += P + R;
            (*n_seq)++;
        }
    } else {
        return -1;
    }
    return 0;
}

uint16_t synth_f32_to_bf16(float f) {
    union { float f; uint32_t u; } x = {f};
    if ((x.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x.u >> 16) | 0x40);
    return (uint16_t)((x.u + 0x7fffu + ((x.u >> 16) & 1u)) >> 16);
}

uint16_t synth_f32_to_f16(float f) {
    union { float f; uint32_t u; } x = {f};
    uint32_t sign = (x.u >> 16) & 0x8000, a = x.u & 0x7fffffff;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);
    if (a < 0x38800000u) return (uint16_t)(sign | (uint32_t)lrintf(fabsf(f) * 16777216.0f));
    uint32_t e = (a >> 23) - 112, m = a & 0x7fffff, h = e << 10 | m >> 13, rest = m & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

void synth_fill(void *x, int64_t n, double scale, int dtype_bits, int is_bf16, synth_rng *r) {
    for (int64_t k = 0; k < n; k++) {
        float v = (float)(scale * synth_normal(r));
        if (dtype_bits == 32)
            ((float *)x)[k] = v;
        else
            ((uint16_t *)x)[k] = is_bf16 ? synth_f32_to_bf16(v) : synth_f32_to_f16(v);
    }
}
