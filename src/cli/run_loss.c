/*
 * run_loss.c - what the loss runners share (run_loss.h).
 */
#include "run_loss.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "msg.h"

#define CMD "run"

int run_loss_read(const char *dir, const char *name, npy_array *a) {
    char err[512];
    int r = npy_read_in(dir, name, a, err, sizeof err);
    if (r < 0) sph_cli_fail(CMD, 1, "%s", err);
    return r;
}

double run_loss_rel(const float *got, const float *ref, int64_t n, double floor) {
    double md = 0, mr = floor;
    for (int64_t k = 0; k < n; k++) {
        const double d = fabs((double)got[k] - (double)ref[k]);
        if (isnan(d)) return INFINITY;
        md = d > md ? d : md;
        mr = fabs((double)ref[k]) > mr ? fabs((double)ref[k]) : mr;
    }
    return md / mr;
}

sph_status run_loss_bufs_make(sph_ctx_t ctx, sph_device dev, const run_loss_buf *spec, int n,
                              run_loss_bufs *b) {
    memset(b, 0, sizeof *b);
    if (n > RUN_LOSS_MAX_BUFS) return SPH_ERR_INVALID_ARG;
    b->n = n;
    for (int k = 0; k < n; k++) {
        if (!spec[k].host && !spec[k].out) continue; /* an absent optional input */
        sph_status s = sph_ctx_malloc(ctx, spec[k].bytes ? spec[k].bytes : 1, &b->buf[k]);
        if (!s && spec[k].host) s = sph_ctx_memcpy(ctx, b->buf[k], spec[k].host, spec[k].bytes);
        if (s) return s;
        b->sh[k][0] = spec[k].n0, b->sh[k][1] = spec[k].n1;
        b->t[k] = (sph_tensor){b->buf[k], dev, spec[k].ndim, spec[k].dt, b->sh[k], NULL, 0};
    }
    return SPH_OK;
}

const sph_tensor *run_loss_tensor(const run_loss_bufs *b, int k) {
    return b->buf[k] ? &b->t[k] : NULL;
}

void run_loss_bufs_free(sph_ctx_t ctx, run_loss_bufs *b) {
    for (int k = 0; k < b->n; k++) sph_ctx_free(ctx, b->buf[k]);
    memset(b, 0, sizeof *b);
}

sph_status run_loss_ctx(sph_ctx_t *ctx, sph_device *dev, int on_cuda, int device_id,
                        int64_t threads, const char *kernel, sph_comm_t tp) {
    sph_ctx_opts co = SPH_CTX_OPTS_INIT;
    co.device.type = on_cuda ? SPH_DEVICE_CUDA : SPH_DEVICE_CPU;
    co.device.id = on_cuda ? device_id : 0;
    co.num_threads = (int)threads;
    co.force_kernel = kernel;
    co.tp_comm = tp;
    *dev = co.device;
    return sph_ctx_create(ctx, &co);
}

sph_status run_loss_timed(const run_loss_call *c, int reps, size_t *ws_bytes, double *ms) {
    double times[RUN_LOSS_MAX_REPEATS];
    void *ws = NULL;
    *ms = 0, *ws_bytes = 0;
    if (reps < 0 || reps > RUN_LOSS_MAX_REPEATS) return SPH_ERR_INVALID_ARG;
    sph_status s = c->size(c, ws_bytes);
    if (!s) s = sph_ctx_malloc(c->ctx, *ws_bytes ? *ws_bytes : 1, &ws);
    for (int k = -1; k < reps && !s; k++) {
        const double t0 = sph_cli_now_s();
        if (!(s = c->run(c, ws, *ws_bytes))) s = sph_ctx_synchronize(c->ctx);
        if (k >= 0) times[k] = sph_cli_now_s() - t0;
    }
    if (!s && reps > 0) *ms = 1e3 * sph_cli_median(times, reps);
    sph_ctx_free(c->ctx, ws);
    return s;
}

int run_loss_fail_status(const char *kernel, sph_status s) {
    return sph_cli_fail(CMD, 1, "%s%s: %s", kernel && !strcmp(kernel, "ref") ? "reference: " : "",
                        sph_status_str(s), sph_last_error());
}

int run_loss_outputs_end(sph_cli_outset *os, const char *json, int bad) {
    sph_cli_outset s = *os;
    memset(os, 0, sizeof *os);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", s.dir ? s.dir : "");
    if (bad) {
        if (!json) sph_cli_outset_abort(&s);
        return sph_cli_fail(CMD, 1, "%s (nothing was written to %s)",
                            json ? s.err : "out of memory", dir);
    }
    if (sph_cli_outset_commit(&s)) return sph_cli_fail(CMD, 1, "%s", s.err);
    return 0;
}
