/*
 * util.h - the CLI's one toolbox: messages, strict number parsing, checked size arithmetic,
 * the random generator, 16-bit float conversions, timing, machine facts, terminal progress and
 * atomic output files. Every subcommand takes these from here (and nothing from the library
 * beyond include/spanhead.h); nothing here exits or prints except sph_cli_fail and the
 * progress line.
 */
#ifndef SPH_CLI_UTIL_H
#define SPH_CLI_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- messages ---------------------------------------------------------------------------- */

/* "spanhead <cmd>: <message>" on stderr, one line; returns code. */
int sph_cli_fail(const char *cmd, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Formats into err (always NUL-terminated); returns 1 so that `return sph_cli_err(...)` reads
 * as a failure in the readers' convention. */
int sph_cli_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- numbers ----------------------------------------------------------------------------- */

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

/* ---- random numbers: splitmix64 ---------------------------------------------------------- */

/* One stream; the state is public so a caller can reproduce an older seeding exactly. */
typedef struct sph_cli_rng {
    uint64_t s;
} sph_cli_rng;

void sph_cli_rng_seed(sph_cli_rng *r, uint64_t seed); /* s = seed * golden + 1 */
uint64_t sph_cli_rng_u64(sph_cli_rng *r);
double sph_cli_rng_uniform(sph_cli_rng *r);          /* [0, 1) */
double sph_cli_rng_normal(sph_cli_rng *r);           /* N(0, 1), Box-Muller */
int64_t sph_cli_rng_range(sph_cli_rng *r, int64_t lo, int64_t hi); /* [lo, hi] */

/* ---- 16-bit floats: round to nearest even, NaN stays NaN, overflow goes to inf ----------- */

uint16_t sph_cli_f32_to_bf16(float f);
float sph_cli_bf16_to_f32(uint16_t h);
uint16_t sph_cli_f32_to_f16(float f);
float sph_cli_f16_to_f32(uint16_t h);
/* Element k of a buffer of bits-wide floats (32, or 16 with is_bf16) as a float. */
float sph_cli_load_float(const void *x, int64_t k, int bits, int is_bf16);
/* Index of the first non-finite value of n floats of that kind, or -1. */
int64_t sph_cli_first_nonfinite(const void *x, int64_t n, int bits, int is_bf16);

/* ---- time and the machine ---------------------------------------------------------------- */

double sph_cli_now_s(void);                       /* CLOCK_MONOTONIC seconds */
int sph_cli_cmp_double(const void *a, const void *b);
double sph_cli_median(double *v, int n);          /* sorts v */
int64_t sph_cli_cpu_count(void);                  /* online CPUs, >= 1 */
int64_t sph_cli_phys_bytes(void);                 /* physical memory, 0 when unknown */

/* ---- progress on a terminal -------------------------------------------------------------- */

/* One line on stderr, rewritten in place: "what: done/total, elapsed, ETA", at most every
 * 0.2 s and always at the last step. On a terminal (unless SPH_PROGRESS=0) only once the work
 * has taken half a second, so short work prints nothing; SPH_PROGRESS=1 forces it on without
 * that delay, so the last step's line appears however short the work (no race with a timer). */
typedef struct sph_cli_progress {
    const char *what;
    int64_t total;
    double t0, last;
    int on, shown; /* on: 0 off, 1 terminal (half-second delay), 2 forced (none) */
} sph_cli_progress;

void sph_cli_progress_start(sph_cli_progress *p, const char *what, int64_t total);
void sph_cli_progress_step(sph_cli_progress *p, int64_t done);
void sph_cli_progress_end(sph_cli_progress *p); /* erases the line */

/* (atomic output sets: outset.h) */

/* ---- stdout ------------------------------------------------------------------------------ */

/* Flushes stdout and reports a write error on it (a full disk, a closed pipe) as
 * "spanhead <cmd>: writing standard output: <reason>"; returns rc, or 1 when rc was 0 and
 * the output failed. */
int sph_cli_close_stdout(const char *cmd, int rc);

#endif
