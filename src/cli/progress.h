/*
 * progress.h - a progress line on a terminal.
 */
#ifndef SPH_CLI_PROGRESS_H
#define SPH_CLI_PROGRESS_H

#include <stdint.h>

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

#endif
