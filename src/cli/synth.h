/*
 * synth.h - seeded synthetic inputs for `spanhead run` and the benchmarks: a packed RL batch
 * of prompts and responses (the loss mask covers the rows that predict response tokens),
 * other mask patterns and random tensors (spans come from sph_spans_from_mask).
 */
#ifndef SPH_CLI_SYNTH_H
#define SPH_CLI_SYNTH_H

#include <stdint.h>

typedef struct synth_rng { uint64_t s; } synth_rng;

void synth_seed(synth_rng *r, uint64_t seed);
uint64_t synth_u64(synth_rng *r);
double synth_uniform(synth_rng *r); /* [0, 1) */
double synth_normal(synth_rng *r);
int64_t synth_range(synth_rng *r, int64_t lo, int64_t hi); /* [lo, hi] */

/* Fills mask[N] by pattern: "response" (packed RL batch: sequences of a prompt and a response
 * placed back to back, rows predicting response tokens active, the tail padding inactive),
 * "random" (each row active with probability frac), "fragmented" (short active runs of 1-4
 * rows with gaps sized for density frac), "all", "none". *n_seq receives the number of
 * packed sequences (response) or 0. Returns 0, or -1 for an unknown pattern. */
int synth_mask(const char *pattern, int64_t N, double frac, synth_rng *r, uint8_t *mask,
               int64_t *n_seq);

/* x[k] = scale * N(0, 1), as f32 or rounded to bf16/f16 (dtype_bits 16, is_bf16). */
void synth_fill(void *x, int64_t n, double scale, int dtype_bits, int is_bf16, synth_rng *r);

/* Round-to-nearest-even conversions used for 16-bit inputs. */
uint16_t synth_f32_to_bf16(float f);
uint16_t synth_f32_to_f16(float f);

#endif
