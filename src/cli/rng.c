/*
 * rng.c - see rng.h.
 */
#include "rng.h"

#include <math.h>

void sph_cli_rng_seed(sph_cli_rng *r, uint64_t seed) { r->s = seed * 0x9e3779b97f4a7c15ull + 1; }

uint64_t sph_cli_rng_u64(sph_cli_rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double sph_cli_rng_uniform(sph_cli_rng *r) { return (double)(sph_cli_rng_u64(r) >> 11) * 0x1.0p-53; }

double sph_cli_rng_normal(sph_cli_rng *r) {
    double u = sph_cli_rng_uniform(r), v = sph_cli_rng_uniform(r);
    if (u < 1e-300) u = 1e-300; /* log(0) */
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

int64_t sph_cli_rng_range(sph_cli_rng *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)(sph_cli_rng_u64(r) % ((uint64_t)hi - (uint64_t)lo + 1));
}
