/*
 * half.h - 16-bit floats (bf16, f16) of the CLI's inputs: conversions that round to nearest even
 * (NaN stays NaN, overflow goes to inf), loading any of the three kinds as a float, and the
 * first non-finite value of a buffer.
 */
#ifndef SPH_CLI_HALF_H
#define SPH_CLI_HALF_H

#include <stdint.h>

uint16_t sph_cli_f32_to_bf16(float f);
float sph_cli_bf16_to_f32(uint16_t h);
uint16_t sph_cli_f32_to_f16(float f);
float sph_cli_f16_to_f32(uint16_t h);
/* Element k of a buffer of bits-wide floats (32, or 16 with is_bf16) as a float. */
float sph_cli_load_float(const void *x, int64_t k, int bits, int is_bf16);
/* Index of the first non-finite value of n floats of that kind, or -1. */
int64_t sph_cli_first_nonfinite(const void *x, int64_t n, int bits, int is_bf16);

#endif
