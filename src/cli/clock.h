/*
 * clock.h - time and the machine: a monotonic clock, the median of timings, the online CPUs and
 * the physical memory.
 */
#ifndef SPH_CLI_CLOCK_H
#define SPH_CLI_CLOCK_H

#include <stdint.h>

double sph_cli_now_s(void);                       /* CLOCK_MONOTONIC seconds */
int sph_cli_cmp_double(const void *a, const void *b);
double sph_cli_median(double *v, int n);          /* sorts v */
int64_t sph_cli_cpu_count(void);                  /* online CPUs, >= 1 */
int64_t sph_cli_phys_bytes(void);                 /* physical memory, 0 when unknown */

#endif
