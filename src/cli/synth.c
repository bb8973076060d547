/*
 * synth.c - synthetic inputs (see synth.h).
 */
#include "synth.h"

#include <math.h>
#include <string.h>

#include "half.h"
#include "rng.h"

const char *const synth_mask_names[] = {"response", "random", "fragmented", "all", "none", NULL};

void synth_mask(int pattern, int64_t N, double frac, sph_cli_rng *r, uint8_t *mask,
                int64_t *n_seq) {
    *n_seq = 0;
    memset(mask, pattern == SYNTH_ALL, (size_t)N);
    if (pattern == SYNTH_RANDOM) {
        for (int64_t i = 0; i < N; i++) mask[i] = sph_cli_rng_uniform(r) < frac;
    } else if (pattern == SYNTH_FRAGMENTED) {
        /* runs of 1-4 active rows (mean 2.5), gaps with mean 2.5 (1 - frac) / frac */
        double mean_gap = frac > 0 ? 2.5 * (1 - frac) / frac : (double)N;
        int64_t i = 0;
        while (i < N) {
            i += (int64_t)floor(sph_cli_rng_uniform(r) * 2 * mean_gap + 0.5);
            int64_t run = sph_cli_rng_range(r, 1, 4);
            for (int64_t k = 0; k < run && i < N; k++) mask[i++] = frac > 0;
        }
    } else if (pattern == SYNTH_RESPONSE) {
        /* sequences: prompt 16-96 tokens, response 8-160 tokens; the row predicting token
         * p + 1 carries token p + 1's loss, so rows o + P - 1 .. o + P + R - 2 are active */
        int64_t o = 0;
        while (o < N) {
            int64_t P = sph_cli_rng_range(r, 16, 96), R = sph_cli_rng_range(r, 8, 160);
            if (o + P + R > N) break; /* the rest is padding */
            for (int64_t s = o + P - 1; s <= o + P + R - 2; s++) mask[s] = 1;
            o += P + R;
            (*n_seq)++;
        }
    }
}

static void store(void *x, int64_t k, float v, int dtype_bits, int is_bf16) {
    if (dtype_bits == 32)
        ((float *)x)[k] = v;
    else
        ((uint16_t *)x)[k] = is_bf16 ? sph_cli_f32_to_bf16(v) : sph_cli_f32_to_f16(v);
}

void synth_fill(void *x, int64_t n, double scale, int dtype_bits, int is_bf16, sph_cli_rng *r) {
    for (int64_t k = 0; k < n; k++)
        store(x, k, (float)(scale * sph_cli_rng_normal(r)), dtype_bits, is_bf16);
}

void synth_fill_uniform(void *x, int64_t n, double scale, int dtype_bits, int is_bf16,
                        sph_cli_rng *r) {
    for (int64_t k = 0; k < n; k++)
        store(x, k, (float)(scale * (2 * sph_cli_rng_uniform(r) - 1)), dtype_bits, is_bf16);
}
