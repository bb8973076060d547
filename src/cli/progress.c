/*
 * progress.c - see progress.h.
 */
#define _XOPEN_SOURCE 700 /* isatty */
#include "progress.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"

static void fmt_secs(char *buf, size_t n, double s) {
    if (s < 0 || !isfinite(s)) snprintf(buf, n, "?");
    else if (s < 60) snprintf(buf, n, "%.0fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
}

void sph_cli_progress_start(sph_cli_progress *p, const char *what, int64_t total) {
    memset(p, 0, sizeof *p);
    /* on a terminal: after a half-second delay, so short work prints nothing; forced on
     * (SPH_PROGRESS=1, for logs and tests): from the first step, so that the last step's line
     * (done == total) is always printed however fast the work was */
    const char *env = getenv("SPH_PROGRESS");
    p->on = env ? (strcmp(env, "0") != 0 ? 2 : 0) : isatty(STDERR_FILENO);
    p->what = what;
    p->total = total;
    p->t0 = p->last = sph_cli_now_s();
}

void sph_cli_progress_step(sph_cli_progress *p, int64_t done) {
    if (!p->on) return;
    double t = sph_cli_now_s(), el = t - p->t0;
    const double delay = p->on == 2 ? 0.0 : 0.5;
    if (done < p->total && (el < delay || t - p->last < 0.2)) return;
    if (done >= p->total && el < delay) return;
    p->last = t;
    char e[16], r[16];
    fmt_secs(e, sizeof e, el);
    fmt_secs(r, sizeof r, done > 0 ? el * (double)(p->total - done) / (double)done : -1);
    fprintf(stderr, "\r%s: %lld/%lld done, %s elapsed, ETA %s\033[K", p->what, (long long)done,
            (long long)p->total, e, r);
    fflush(stderr);
    p->shown = 1;
}

void sph_cli_progress_end(sph_cli_progress *p) {
    if (p->shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
    p->shown = 0;
}
