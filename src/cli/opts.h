/*
 * opts.h - the options of every subcommand: one struct per command, filled by sph_cli_parse
 * from the command's table in opts.c (name, kind, destination, bounds, help). A new option is
 * a field here and a row there; the command then reads the field. Kept apart from the
 * commands so that the argument fuzzer (tests/fuzz/fuzz_args.c) parses every table without
 * linking the library.
 */
#ifndef SPH_CLI_OPTS_H
#define SPH_CLI_OPTS_H

#include <stdint.h>

#include "args.h"
#include "spanhead.h"

/* The FP8 recipes in sph_fp8 order. */
extern const char *const sph_cli_fp8_names[];

// ---- layout, pack, spans, tune ---------------------------------------------------------------

typedef struct layout_opts {
    int64_t tp, cp;
    int fp8;
} layout_opts;

typedef struct pack_opts {
    int64_t capacity, tp, cp, min_bins, bin_multiple;
    int algorithm, fp8;
} pack_opts;

typedef struct spans_opts {
    int64_t tp, cp, cp_rank, gap;
    int fp8;
} spans_opts;

typedef struct tune_opts {
    int dtype, quiet;
    int64_t H, V, repeats, device_id;
    sph_cli_list N;
    const char *cache;
} tune_opts;

// ---- run (one process) -----------------------------------------------------------------------

enum { RUN_F32, RUN_BF16, RUN_F16 };     /* --dtype, in the order of its choices */
enum { RUN_CPU, RUN_CUDA };              /* --device */

typedef struct run_opts {
    int device, dtype, mask; /* mask: a synth pattern, -1 = the default for the input */
    const char *kernel, *inputs, *outputs;
    int64_t N, H, V, V_total, v0, K, threads, repeats, gap, seed;
    double active, softcap, temperature;
    int entropy, one_pass, check, json;
    int sum_p2; /* --sum-p2 */
    int64_t topk; /* --topk K, 0 = none */
    /* derived */
    int dtype_given, shape_given, default_batch;
} run_opts;

// ---- run --tp/--cp/--dp (under mpirun) -------------------------------------------------------

enum { DIST_MASK_RL, DIST_MASK_DENSE };

typedef struct dopts {
    int64_t tp, cp, dp;
    int device, dtype, mask, pack, reference, dhidden; /* choice indices */
    const char *inputs, *outputs, *kernel;
    int64_t seqs, min_len, max_len, H, V, K, capacity, gap, chunk_rows, bench, seed;
    int64_t topk; /* --topk K: the top-K ids and log-probs too (issue 25), 0 = none */
    int sum_p2;   /* --sum-p2: sum_j p_ij^2 too (issue 25) */
    int no_check, one_pass;
    double temperature, atol, rtol;
    /* derived */
    int cuda, bf16, masked, check, dh_partial, ref_device;
    sph_pack_algo algo;
} dopts;

// ---- bench -----------------------------------------------------------------------------------

typedef struct bench_shape {
    const char *name;
    int64_t H, V; /* V: the per-rank vocabulary V_loc */
} bench_shape;

/* Per rank at TP4 (the seed's layout): A 2048x62080, B 4096x37984, C 5120x37984, D 2048x151936;
 * E 4096x128256 (a whole 128K vocabulary). The seed's matrix uses A-D. */
extern const bench_shape bench_shapes[5];
extern const char *const bench_shape_names[]; /* "A".."E" */
extern const char *const bench_mask_names[];  /* response, fragmented, packed-rl */
extern const char *const bench_dtype_names[]; /* bf16, f16, f32: the --dtype choices */

#define MAX_LIST SPH_CLI_LIST_MAX
#define MAX_WORK 256
#define MAX_RUNS (2 * (1 + 3 * MAX_LIST))

typedef struct bopts {
    /* options as parsed */
    int device, dtype_opt, matrix, mode, list, temp_rows;
    sph_cli_list shape_list, N_list, act_list, mask_list;
    int64_t H, V, repeats, warmup, chunk_bytes, gap, seed;
    int64_t topk; /* --topk K: each point also timed with the top-k outputs (issue 25) */
    int sum_p2;   /* --sum-p2: ... and / or sum_p2 */
    const char *json, *commit, *plot, *peers;
    /* derived */
    sph_device_type dev;
    sph_dtype dt;
    const char *dt_name;
    bench_shape shapes[MAX_LIST];
    int n_shapes;
    const char *masks[3];
    int n_masks;
    int modes; /* 1 general, 2 one-pass, 3 both (4: policy, bench_policy.c) */
} bopts;

// ---- rows shared by the run tables, one per concept ------------------------------------------

/* The head's options as every runner of `spanhead run` takes them (the head alone, its MPI
 * form, each loss), defined once: a table places the row with its options struct T, whose
 * field of that name has the row's type (SPH_CLI_OFF). */
extern const char *const sph_cli_device_names[];    /* cpu, cuda */
extern const char *const sph_cli_run_dtype_names[]; /* f32, bf16, f16 (RUN_F32 ...) */

#define SPH_CLI_ROW_DEVICE(T, help)                                                            \
    {"--device", "cpu|cuda", SPH_OPT_CHOICE, SPH_CLI_OFF(T, device, int), 0, 0, 0, 0,           \
     sph_cli_device_names, 0, help}
#define SPH_CLI_ROW_TEMPERATURE(T)                                                             \
    {"--temperature", "T", SPH_OPT_F64, SPH_CLI_OFF(T, temperature, double), 0, 0, 0, 0, NULL,  \
     SPH_OPTF_ANY, "softmax temperature, > 0 (default 1)"}
#define SPH_CLI_ROW_SOFTCAP(T)                                                                 \
    {"--softcap", "C", SPH_OPT_F64, SPH_CLI_OFF(T, softcap, double), 0, 0, 0, 0, NULL,          \
     SPH_OPTF_ANY, "tanh logit cap (default 0: off)"}
#define SPH_CLI_ROW_THREADS(T)                                                                 \
    {"--threads", "N", SPH_OPT_I64, SPH_CLI_OFF(T, threads, int64_t), 0, INT32_MAX, 0, 0, NULL, \
     0, "CPU threads (default 0: all; the library bounds it)"}
#define SPH_CLI_ROW_KERNEL(T)                                                                  \
    {"--kernel", "NAME", SPH_OPT_STR, SPH_CLI_OFF(T, kernel, const char *), 0, 0, 0, 0, NULL,   \
     0, "force a kernel set: ref, generic, avx2, avx512 (each rank's\n"                        \
        "under mpirun)"}
#define SPH_CLI_ROW_JSON(T)                                                                    \
    {"--json", NULL, SPH_OPT_FLAG, SPH_CLI_OFF(T, json, int), 0, 0, 0, 0, NULL, 0,              \
     "print the result and the check as one JSON object"}

// ---- the tables ------------------------------------------------------------------------------

extern const sph_cli_opt sph_cli_layout_opts[], sph_cli_pack_opts[], sph_cli_spans_opts[],
    sph_cli_tune_opts[], sph_cli_run_opts[], sph_cli_dist_opts[], sph_cli_bench_opts[];

#endif
