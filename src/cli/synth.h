/*
 * synth.h - seeded synthetic inputs for `spanhead run` and the benchmarks: loss-mask patterns
 * (a packed RL batch of prompts and responses, random, fragmented, all, none) and random
 * tensors in the input dtype. Random numbers come from the toolbox's splitmix64 (rng.h), so
 * every stream is reproducible from its seed alone.
 */
#ifndef SPH_CLI_SYNTH_H
#define SPH_CLI_SYNTH_H

#include <stdint.h>

#include "rng.h"


/* The mask patterns of synth_mask, in order (for option tables). */
extern const char *const synth_mask_names[];
enum { SYNTH_RESPONSE, SYNTH_RANDOM, SYNTH_FRAGMENTED, SYNTH_ALL, SYNTH_NONE };

/* Fills mask[N] by pattern: SYNTH_RESPONSE (packed RL batch: sequences of a prompt and a
 * response placed back to back, rows predicting response tokens active, the tail padding
 * inactive), SYNTH_RANDOM (each row active with probability frac), SYNTH_FRAGMENTED (short
 * active runs of 1-4 rows with gaps sized for density frac), SYNTH_ALL, SYNTH_NONE. *n_seq
 * receives the number of packed sequences (response) or 0. */
void synth_mask(int pattern, int64_t N, double frac, sph_cli_rng *r, uint8_t *mask,
                int64_t *n_seq);

/* x[k] = scale * N(0, 1), as f32 or rounded to bf16/f16 (dtype_bits 16, is_bf16). */
void synth_fill(void *x, int64_t n, double scale, int dtype_bits, int is_bf16, sph_cli_rng *r);
/* x[k] = scale * U(-1, 1), the same dtypes (benchmark data: cheap to draw). */
void synth_fill_uniform(void *x, int64_t n, double scale, int dtype_bits, int is_bf16,
                        sph_cli_rng *r);

#endif
