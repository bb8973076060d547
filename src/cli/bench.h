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

typedef struct shape {
    const char *name;
    int64_t H, V; /* V: the per-rank vocabulary V_loc */
} shape;

/* Per rank at TP4 (the seed's layout): A 2048x62080, B 4096x37984, C 5120x37984, D 2048x151936;
 * E 4096x128256 (a whole 128K vocabulary). The seed's matrix uses A-D. */
extern const shape bench_shapes[5];
extern const char *const bench_shape_names[];  /* "A".."E", for option tables */
extern const char *const bench_mask_names[];   /* response, fragmented, packed-rl */

/* One (shape, per-rank N) the bench allocates buffers for. tp, cp and tokens (the total
 * tokens over the CP group) are 0 for grid points, which have no parallel layout: the JSON
 * writes them as null rather than inventing TP1/CP1. */
typedef struct work {
    shape sh;
    int64_t N, tp, cp, tokens;
} work;

/* One timed run of a work point: the dense path has mask "none". */
typedef struct run_spec {
    const char *mask;
    double act;
    int one_pass;
} run_spec;

#define MAX_LIST SPH_CLI_LIST_MAX
#define MAX_WORK 256
#define MAX_RUNS (2 * (1 + 3 * MAX_LIST))

typedef struct bopts {
    /* options as parsed */
    int device, dtype_opt, matrix, mode, list;
    sph_cli_list shape_list, N_list, act_list, mask_list;
    int64_t H, V, repeats, warmup, chunk_bytes, gap, seed;
    const char *json, *commit, *plot, *peers;
    /* derived */
    sph_device_type dev;
    sph_dtype dt;
    const char *dt_name;
    shape shapes[MAX_LIST];
    int n_shapes;
    const char *masks[3];
    int n_masks;
    int modes; /* 1 general, 2 one-pass, 3 both (4: policy, bench_policy.c) */
} bopts;

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

/* --mode policy (bench_policy.c): the fused policy loss, the one-pass weighted loss and the
 * general path + the loss on the host at every point, the table on stdout, JSON lines to js
 * (or NULL). 0 or an exit code. */
int bench_policy(sph_ctx_t ctx, const bopts *o, const work *ws, int n_work, const char *gpu,
                 const char *date, FILE *js);

#endif
