/*
 * pack_internal.h - helpers shared by the host-metadata sources (src/pack, src/spans).
 */
#ifndef SPH_PACK_INTERNAL_H
#define SPH_PACK_INTERNAL_H

#include "core/internal.h"

/* Validates a sph_parallel (tp, cp >= 1, known fp8 recipe); `name` prefixes messages. */
sph_status sph_parallel_check(const sph_parallel *par, const char *name);
/* *r = x rounded up to a multiple of a (x >= 0, a >= 1). Returns SPH_ERR_OVERFLOW without a
 * message when it does not fit in int64, SPH_OK otherwise. */
sph_status sph_round_up(int64_t x, int64_t a, int64_t *r);

#endif
