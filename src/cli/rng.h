/*
 * rng.h - the CLI's random numbers: one splitmix64 stream per use, seeded, reproducible.
 */
#ifndef SPH_CLI_RNG_H
#define SPH_CLI_RNG_H

#include <stdint.h>

/* One stream; the state is public so a caller can reproduce an older seeding exactly. */
typedef struct sph_cli_rng {
    uint64_t s;
} sph_cli_rng;

void sph_cli_rng_seed(sph_cli_rng *r, uint64_t seed); /* s = seed * golden + 1 */
uint64_t sph_cli_rng_u64(sph_cli_rng *r);
double sph_cli_rng_uniform(sph_cli_rng *r);          /* [0, 1) */
double sph_cli_rng_normal(sph_cli_rng *r);           /* N(0, 1), Box-Muller */
int64_t sph_cli_rng_range(sph_cli_rng *r, int64_t lo, int64_t hi); /* [lo, hi] */

#endif
