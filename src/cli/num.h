/*
 * num.h - strict number parsing (the whole string, within bounds) and checked size
 * arithmetic: products, sums and allocations of int64 counts that refuse to overflow.
 */
#ifndef SPH_CLI_NUM_H
#define SPH_CLI_NUM_H

#include <stddef.h>
#include <stdint.h>

/* Strict decimal integer: the whole string, no sign-only, no spaces, within [lo, hi].
 * Returns 0 and sets *out, or 1 (out untouched). */
int sph_cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
/* The same with an optional K (x1024) or M (x1048576) suffix ("16K"); overflow refused. */
int sph_cli_parse_count(const char *s, int64_t lo, int64_t hi, int64_t *out);
/* A finite decimal number (strtod syntax, the whole string) within [lo, hi]. */
int sph_cli_parse_f64(const char *s, double lo, double hi, double *out);

/* a * b and a + b of non-negative int64 values: 0 and *out, or 1 on overflow. */
int sph_cli_mul(int64_t a, int64_t b, int64_t *out);
int sph_cli_add(int64_t a, int64_t b, int64_t *out);
/* count elements of elem bytes as size_t bytes: 0, or 1 when it does not fit. */
int sph_cli_bytes(int64_t count, size_t elem, size_t *out);
/* malloc of count * elem bytes (at least 1), NULL on overflow or failure. */
void *sph_cli_alloc(int64_t count, size_t elem);
void *sph_cli_calloc(int64_t count, size_t elem);

#endif
