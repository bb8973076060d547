/*
 * bench.h - what the two files of `spanhead bench` share:
 *   cmd_bench.c     options, the GEMM rates, timing, the table, JSON lines, --plot
 *   bench_points.c  the points: model shapes, the --shape x --N grid, the seed's matrix, the
 *                   runs of a point, and their masks (response, fragmented, packed-rl)
 *   bench_policy.c  --mode policy: the fused RL policy loss against the one-pass weighted loss
 *                   and the general path + the loss on the host
 */
#ifndef SPH_CLI_BENCH_H
#define SPH_CLI_BENCH_H

#include <stdint.h>
#include <stdio.h>

#include "cli.h"
#include "rng.h"



/* One (shape, per-rank N) the bench allocates buffers for. tp, cp and tokens (the total
 * tokens over the CP group) are 0 for grid points, which have no parallel layout: the JSON
 * writes them as null rather than inventing TP1/CP1. */
typedef struct work {
    bench_shape sh;
    int64_t N, tp, cp, tokens;
} work;

/* One timed run of a work point: the dense path has mask "none". */
typedef struct run_spec {
    const char *mask;
    double act;
    int one_pass;
} run_spec;


/* The work points: the --shape x --N grid, or the seed's matrix (--matrix seed). */
int bench_grid(const bopts *o, work *out);
int bench_seed_matrix(const bopts *o, work *out);
/* The runs of every point, in order: per mode, the dense path, then each mask at each active
 * fraction; packed-rl runs once (its fraction comes from the batch). */
int bench_plan_runs(const bopts *o, run_spec *r);

/* Host mask and spans (room for 2 * ((N + 1) / 2) entries) of a masked run at a point; sets
 * *n_active and, for packed-rl, *act. 0 or an exit code (message printed). */
int bench_point_mask(const bopts *o, const work *w, const char *mask, double *act,
                     uint8_t *hm, int64_t *spans, int64_t *n_spans, int64_t *n_active);

/* The options of the benchmark's context (bench_points.c; cmd_bench.c sets them once): the
 * rows' cold first calls make fresh contexts with them. */
void bench_set_ctx_opts(const sph_ctx_opts *co);
const sph_ctx_opts *bench_ctx_opts(void);

/* count elements of elem bytes on ctx's device into *dst, copied from src unless it is NULL
 * (bench_points.c): 0, or 1 when the size overflows or the library refuses. */
int bench_upload(sph_ctx_t ctx, void **dst, const void *src, int64_t count, size_t elem);

/* Point wi's hidden (N, H) and weight (V, H) in the input dtype (bench_points.c): the stream
 * r seeded from wi, so every mode of a point sees the same data; r goes on for the point's
 * other draws. */
void bench_fill_head(sph_cli_rng *r, int64_t wi, const bench_shape *sh, int64_t N, int bits,
                     int bf16, void *hh, void *hw);

/* The end of a result row's JSON object, as every mode writes it (bench_points.c): with
 * extras the --topk / --sum-p2 fields and the extra time in %, then peak_extra_bytes, path
 * and first_call_ms (the caller closes the object). */
void bench_json_run_tail(FILE *f, const bopts *o, int extras, double extra_pct, size_t peak,
                         const char *path, double first_ms);

/* --mode policy (bench_policy.c): the fused policy loss, the one-pass weighted loss and the
 * general path + the loss on the host at every point, the table on stdout, JSON lines to js
 * (or NULL). 0 or an exit code. */
int bench_policy(sph_ctx_t ctx, const bopts *o, const work *ws, int n_work, const char *gpu,
                 const char *date, FILE *js);

/* The first failed write of the --json lines (errno), 0 while none failed: both emitters set
 * it at the failing flush, cmd_bench.c reports it when the files are closed. */
extern int bench_js_errno;

#endif
