/*
 * cmd_run_dist.c - `spanhead run --tp T --cp C --dp D` under `mpirun -np T*C*D`: the LM head
 * split the way a trainer splits it, checked against one process.
 *
 * World rank w = ((dp_rank * C) + cp_rank) * T + tp_rank (sph_comm_create_mpi_world's layout).
 *
 *   1. Rank 0 builds a global batch (or reads it with --inputs DIR): ragged sequences of
 *      lengths L_k concatenated into R rows, hidden (R, H), weight (V, H), targets (R) (row s
 *      of a sequence predicts its token s+1; -100 = ignored), a loss mask (R), upstream
 *      gradients dlogprob, dentropy, dlse, dlogit_mean (R) and, for sample-support runs,
 *      candidates (R, K). The batch is broadcast to every rank.
 *   2. Every rank packs the sequence lengths into bins the same way (sph_pack with the
 *      alignment of (T, C) and bin_multiple = D); DP rank d takes the d-th contiguous block of
 *      n_bins / D bins, each bin one micro-batch.
 *   3. A bin is laid out with the packed segment layout (sph_layout_packed): each sequence
 *      padded to the sequence alignment, the last grown to the total alignment; padding rows
 *      are inactive (target -1, zero hidden, zero upstream gradient).
 *   4. CP rank r keeps, of every segment of padded length P, chunk r and chunk 2C-1-r of
 *      P/(2C) rows (sph_cp_local_rows); its loss mask gives its spans (sph_spans_from_mask).
 *   5. TP rank t holds weight rows [v0, v0 + V_loc) of an even split of V, and runs forward
 *      (logprob, entropy, lse, logit_mean, stats; one allgather per forward combines the
 *      softmax partials) and
 *      backward (dhidden all-reduced over the TP group, dweight accumulated over the bins)
 *      through the public head API with the TP communicator (MPI on the CPU, NCCL with
 *      --device cuda: one GPU per rank, local rank mod the device count).
 *   6. Results are gathered to rank 0: per-row outputs by global row (and every TP rank's
 *      copy must equal TP rank 0's bit for bit: the combine runs in rank order), dhidden
 *      (summed over TP), dweight (concatenated over TP, summed over CP and DP in float64).
 *   7. Rank 0 runs the single-process reference (force_kernel "ref", no communicator) on the
 *      global batch and prints max errors and PASS/FAIL; --outputs DIR writes the gathered
 *      global outputs as a single-process `spanhead run --outputs` does: logprob, entropy,
 *      lse, logit_mean (R; logit_mean not with candidates), dhidden (R, H), dweight (V, H).
 *
 * Every phase ends with an agreement (an all-reduce of "did it work") so that a failure on one
 * rank ends every rank with the same exit code instead of a hang.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "cmd_run_dist.h"
#include "npy.h"

int sph_cli_run_wants_dist(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strncmp(a, "--tp", 4) || !strncmp(a, "--cp", 4) || !strncmp(a, "--dp", 4))
            if (a[4] == '\0' || a[4] == '=') return 1;
    }
    return 0;
}

#ifndef SPH_HAVE_MPI

int sph_cli_run_dist(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return sph_cli_fail("run", 1, "--tp/--cp/--dp need MPI, and this spanhead was built "
                                  "without it (install Open MPI and reconfigure)");
}

#else
#include <mpi.h>

static const char *USAGE =
    "usage: mpirun -np T*C*D spanhead run --tp T --cp C --dp D [options]\n"
    "\n"
    "Splits a global batch the way a trainer does (DP-aligned bins, packed segment layout,\n"
    "CP-local rows, TP vocab shards), runs forward + backward on every rank and compares the\n"
    "gathered results with the single-process float64 reference on rank 0.\n"
    "\n"
    "  --tp T, --cp C, --dp D   parallel sizes (default 1); T*C*D must equal the world size\n"
    "  --device cpu|cuda        cuda: one GPU per rank, NCCL communicator (default cpu)\n"
    "  --inputs DIR             rank 0 reads DIR/{hidden,weight,targets}.npy and optionally\n"
    "                           mask, lengths, dlogprob, dentropy, dlse, dlogit_mean,\n"
    "                           candidates .npy (absent gradients are 0; bf16 data as\n"
    "                           uint16 .npy with --dtype bf16)\n"
    "  --outputs DIR            rank 0 writes logprob, entropy, lse, logit_mean, dhidden,\n"
    "                           dweight .npy, the files of a single-process run\n"
    "  synthetic batch (without --inputs):\n"
    "  --seqs N --min-len A --max-len B   ragged sequence lengths (8, 3, 40)\n"
    "  --hidden H --vocab V      (24, 203)\n"
    "  --mask rl|dense           rl: prompt rows and holes masked out (default); dense: all\n"
    "  --support K               sample-support run with K candidates per row (0 = full vocab)\n"
    "  --seed S                  (default 1)\n"
    "  --dtype f32|bf16          input dtype (default f32)\n"
    "  --temperature t           (default 1)\n"
    "  --capacity N              tokens per bin (default: about two bins per DP rank)\n"
    "  --pack ffd|mffd|balanced  bin packing algorithm (default ffd)\n"
    "  --gap G                   span coalescing gap (default 4)\n"
    "  --kernel NAME             force the per-rank kernel (ref, generic, avx2, ...)\n"
    "  --atol a --rtol r         pass if |got - ref| <= a + r |ref| (1e-4; bf16 on cuda 2e-2)\n"
    "  --dhidden allreduce|partial  allreduce: the head sums dhidden over the TP group\n"
    "                            (allreduce_dhidden, default); partial: each rank keeps its\n"
    "                            shard's partial and rank 0 sums the gathered partials\n"
    "  --reference ref|device    what rank 0 compares with: the float64 reference kernels on\n"
    "                            the CPU (default), or one process on the ranks' device and\n"
    "                            kernels without a communicator (the single-GPU result)\n"
    "  --one-pass                gradients in the forward sweep (one combine per chunk of\n"
    "                            rows) instead of a separate backward\n"
    "  --chunk-rows N            rows per chunk on the ranks (0 = automatic)\n"
    "  --no-check                skip the reference (timing or output only)\n"
    "  --bench R                 time forward and backward of each rank's first bin R times,\n"
    "                            with and without the TP collectives (their share)\n";

/* ---- options ------------------------------------------------------------------------------ */

typedef struct dopts {
    int64_t tp, cp, dp;
    int cuda;
    const char *inputs, *outputs, *kernel;
    int64_t seqs, min_len, max_len, H, V, K, capacity, gap;
    int masked, bf16, check, bench, dh_partial, ref_device, one_pass;
    int64_t chunk_rows;
    double temperature, atol, rtol;
    uint64_t seed;
    sph_pack_algo algo;
} dopts;

static int parse_i64(const char *s, int64_t lo, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || !end || *end || end == s || v < lo) return 0;
    *out = v;
    return 1;
}

static int parse_f64(const char *s, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || !end || *end || end == s || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

/* Returns 0 on success, 2 on a usage error (message printed by rank 0 only), -1 on --help. */
static int parse_opts(int argc, char **argv, dopts *o, int rank) {
    *o = (dopts){1, 1, 1, 0, NULL, NULL, NULL, 8, 3, 40, 24, 203, 0, 0, 4,
                 1, 0, 1, 0, 0, 0, 0, 0, 1.0, -1, -1, 1, SPH_PACK_FFD};
    for (int i = 1; i < argc; i++) {
        char *a = argv[i], *val = NULL;
        char name[64];
        if (strncmp(a, "--", 2)) goto bad_arg;
        const char *eq = strchr(a, '=');
        size_t nl = eq ? (size_t)(eq - a) : strlen(a);
        if (nl >= sizeof name) goto bad_arg;
        memcpy(name, a, nl);
        name[nl] = '\0';
        if (!strcmp(name, "--help") || !strcmp(name, "-h")) {
            if (rank == 0) fputs(USAGE, stdout);
            return -1;
        }
        if (!strcmp(name, "--no-check")) {
            o->check = 0;
            continue;
        }
        if (!strcmp(name, "--one-pass")) {
            o->one_pass = 1;
            continue;
        }
        static const char *const valued[] = {
            "--tp", "--cp", "--dp", "--seqs", "--min-len", "--max-len", "--hidden", "--vocab",
            "--support", "--capacity", "--gap", "--seed", "--temperature", "--atol", "--rtol",
            "--inputs", "--outputs", "--kernel", "--device", "--dtype", "--mask", "--pack",
            "--reference", "--dhidden", "--bench", "--chunk-rows"};
        int known = 0;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            known |= !strcmp(name, valued[k]);
        if (!known) goto bad_arg;
        if (eq) {
            val = (char *)eq + 1;
        } else {
            if (i + 1 >= argc) {
                if (rank == 0) sph_cli_fail("run", 2, "%s: missing value", name);
                return 2;
            }
            val = argv[++i];
        }
        int ok = 1;
        if (!strcmp(name, "--tp")) ok = parse_i64(val, 1, &o->tp);
        else if (!strcmp(name, "--cp")) ok = parse_i64(val, 1, &o->cp);
        else if (!strcmp(name, "--dp")) ok = parse_i64(val, 1, &o->dp);
        else if (!strcmp(name, "--seqs")) ok = parse_i64(val, 1, &o->seqs);
        else if (!strcmp(name, "--min-len")) ok = parse_i64(val, 1, &o->min_len);
        else if (!strcmp(name, "--max-len")) ok = parse_i64(val, 1, &o->max_len);
        else if (!strcmp(name, "--hidden")) ok = parse_i64(val, 1, &o->H);
        else if (!strcmp(name, "--vocab")) ok = parse_i64(val, 1, &o->V);
        else if (!strcmp(name, "--support")) ok = parse_i64(val, 0, &o->K);
        else if (!strcmp(name, "--capacity")) ok = parse_i64(val, 1, &o->capacity);
        else if (!strcmp(name, "--gap")) ok = parse_i64(val, 0, &o->gap);
        else if (!strcmp(name, "--chunk-rows")) ok = parse_i64(val, 1, &o->chunk_rows);
        else if (!strcmp(name, "--reference")) {
            ok = !strcmp(val, "ref") || !strcmp(val, "device");
            o->ref_device = !strcmp(val, "device");
        } else if (!strcmp(name, "--dhidden")) {
            ok = !strcmp(val, "allreduce") || !strcmp(val, "partial");
            o->dh_partial = !strcmp(val, "partial");
        } else if (!strcmp(name, "--bench")) {
            int64_t r = 0;
            ok = parse_i64(val, 1, &r) && r <= 100000;
            o->bench = (int)r;
        }
        else if (!strcmp(name, "--seed")) {
            int64_t s = 0;
            ok = parse_i64(val, 0, &s);
            o->seed = (uint64_t)s;
        } else if (!strcmp(name, "--temperature")) ok = parse_f64(val, &o->temperature) &&
                                                          o->temperature > 0;
        else if (!strcmp(name, "--atol")) ok = parse_f64(val, &o->atol) && o->atol >= 0;
        else if (!strcmp(name, "--rtol")) ok = parse_f64(val, &o->rtol) && o->rtol >= 0;
        else if (!strcmp(name, "--inputs")) o->inputs = val;
        else if (!strcmp(name, "--outputs")) o->outputs = val;
        else if (!strcmp(name, "--kernel")) o->kernel = val;
        else if (!strcmp(name, "--device")) {
            ok = !strcmp(val, "cpu") || !strcmp(val, "cuda");
            o->cuda = !strcmp(val, "cuda");
        } else if (!strcmp(name, "--dtype")) {
            ok = !strcmp(val, "f32") || !strcmp(val, "bf16");
            o->bf16 = !strcmp(val, "bf16");
        } else if (!strcmp(name, "--mask")) {
            ok = !strcmp(val, "rl") || !strcmp(val, "dense");
            o->masked = !strcmp(val, "rl");
        } else if (!strcmp(name, "--pack")) {
            if (!strcmp(val, "ffd")) o->algo = SPH_PACK_FFD;
            else if (!strcmp(val, "mffd")) o->algo = SPH_PACK_MFFD;
            else if (!strcmp(val, "balanced")) o->algo = SPH_PACK_BALANCED;
            else ok = 0;
        } else {
            goto bad_arg;
        }
        if (!ok) {
            if (rank == 0) sph_cli_fail("run", 2, "%s: bad value '%s'", name, val);
            return 2;
        }
        continue;
    bad_arg:
        if (rank == 0) sph_cli_fail("run", 2, "unknown argument '%s' (see --help)", a);
        return 2;
    }
    if (o->max_len < o->min_len) {
        if (rank == 0) sph_cli_fail("run", 2, "--max-len %lld < --min-len %lld",
                                    (long long)o->max_len, (long long)o->min_len);
        return 2;
    }
    /* CPU kernels widen bf16 inputs once and compute in f32 (the single-process check's 1e-4);
     * only the GPU rounds dlogits to bf16 before its products */
    if (o->atol < 0) o->atol = o->bf16 && o->cuda ? 2e-2 : 1e-4;
    if (o->rtol < 0) o->rtol = o->bf16 && o->cuda ? 2e-2 : 1e-4;
    return 0;
}

/* ---- small helpers -------------------------------------------------------------------------- */

static int g_rank, g_size;

/* A failure on this rank: printed with the rank, the phase fails everywhere at agree(). */
static int rfail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int rfail(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "spanhead run [rank %d]: ", g_rank);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 0;
}

/* 1 when every rank's ok is 1. */
static int agree(int ok) {
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all;
}

static void *xcalloc(size_t n, size_t sz) {
    if (n == 0 || sz == 0) return calloc(1, 1);
    if (n > SIZE_MAX / sz) return NULL;
    return calloc(n, sz);
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double unif(uint64_t *s) { return (double)(splitmix(s) >> 11) * 0x1.0p-53; }
static int64_t irange(uint64_t *s, int64_t lo, int64_t hi) {
    return lo + (int64_t)(splitmix(s) % (uint64_t)(hi - lo + 1));
}
static double normal(uint64_t *s) {
    double u = unif(s), v = unif(s);
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* bf16 round to nearest even (the library's internal converter is not public). */
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- .npy (src/cli/npy.h) -------------------------------------------------------------- */

/* Element i of a numeric array as a double (every dtype npy.h reads; bf16 bits as u2 need
 * from_bf16 by the caller). */
static double npy_at(const npy_array *a, int64_t i) {
    const char *p = (const char *)a->data + (size_t)i * (size_t)a->bytes;
    switch (a->kind) {
    case 'f':
        if (a->bytes == 4) { float v; memcpy(&v, p, 4); return v; }
        if (a->bytes == 8) { double v; memcpy(&v, p, 8); return v; }
        break;
    case 'i':
        if (a->bytes == 4) { int32_t v; memcpy(&v, p, 4); return v; }
        if (a->bytes == 8) { int64_t v; memcpy(&v, p, 8); return (double)v; }
        break;
    case 'u':
        if (a->bytes == 1) return (unsigned char)*p;
        if (a->bytes == 2) { uint16_t v; memcpy(&v, p, 2); return v; }
        break;
    case 'b':
        return *p != 0;
    }
    return NAN;
}

static int write_f32(const char *dir, const char *name, const float *x, int ndim,
                     const int64_t *shape) {
    char path[4096], err[256];
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    if (npy_write(path, 'f', 4, ndim, shape, x, err, sizeof err)) return rfail("%s", err);
    return 1;
}

/* ---- the global batch ------------------------------------------------------------------------ */

typedef struct batch {
    int64_t n_seqs, R, H, V, K;
    int masked, bf16;
    double temperature;
    int64_t *lengths;  /* (n_seqs) */
    float *hidden;     /* (R, H), values already rounded to the input dtype */
    float *weight;     /* (V, H) */
    int64_t *targets;  /* (R) */
    int64_t *cand;     /* (R, K) or NULL */
    uint8_t *mask;     /* (R); all ones when dense */
    float *up[4];      /* (R) each: dlogprob, dentropy, dlse, dlogit_mean (0 when absent) */
} batch;

/* Per-row outputs and their upstream gradients, in this order everywhere. */
enum { F_LOGPROB, F_ENTROPY, F_LSE, F_LOGIT_MEAN, NF };
static const char *const F_NAME[NF] = {"logprob", "entropy", "lse", "logit_mean"};

static void batch_free(batch *b) {
    free(b->lengths);
    free(b->hidden);
    free(b->weight);
    free(b->targets);
    free(b->cand);
    free(b->mask);
    for (int f = 0; f < NF; f++) free(b->up[f]);
    memset(b, 0, sizeof *b);
}

static int batch_alloc(batch *b) {
    size_t R = (size_t)b->R, H = (size_t)b->H, V = (size_t)b->V;
    b->lengths = xcalloc((size_t)b->n_seqs, sizeof(int64_t));
    b->hidden = xcalloc(R * H, sizeof(float));
    b->weight = xcalloc(V * H, sizeof(float));
    b->targets = xcalloc(R, sizeof(int64_t));
    b->cand = b->K ? xcalloc(R * (size_t)b->K, sizeof(int64_t)) : NULL;
    b->mask = xcalloc(R, 1);
    int ups = 1;
    for (int f = 0; f < NF; f++) ups &= (b->up[f] = xcalloc(R, sizeof(float))) != NULL;
    if (!b->lengths || !b->hidden || !b->weight || !b->targets || (b->K && !b->cand) ||
        !b->mask || !ups)
        return rfail("out of host memory for the global batch (R=%lld H=%lld V=%lld)",
                     (long long)b->R, (long long)b->H, (long long)b->V);
    return 1;
}

static float round_in(const batch *b, double v) {
    return b->bf16 ? from_bf16(to_bf16((float)v)) : (float)v;
}

static int synth(const dopts *o, batch *b) {
    uint64_t s = o->seed * 0x2545F4914F6CDD1Dull + 17;
    b->n_seqs = o->seqs;
    b->H = o->H;
    b->V = o->V;
    b->K = o->K;
    b->masked = o->masked;
    b->bf16 = o->bf16;
    b->temperature = o->temperature;
    if (o->K > o->V) return rfail("--support %lld exceeds --vocab %lld", (long long)o->K,
                                  (long long)o->V);
    int64_t *len = xcalloc((size_t)o->seqs, sizeof *len);
    if (!len) return rfail("out of host memory");
    b->R = 0;
    for (int64_t k = 0; k < o->seqs; k++) {
        len[k] = irange(&s, o->min_len, o->max_len);
        b->R += len[k];
    }
    if (!batch_alloc(b)) {
        free(len);
        return 0;
    }
    memcpy(b->lengths, len, (size_t)o->seqs * sizeof *len);
    free(len);
    const double ws = 1.5 / sqrt((double)b->H);
    for (int64_t i = 0; i < b->R * b->H; i++) b->hidden[i] = round_in(b, normal(&s));
    for (int64_t i = 0; i < b->V * b->H; i++) b->weight[i] = round_in(b, normal(&s) * ws);
    int64_t row = 0;
    for (int64_t k = 0; k < b->n_seqs; k++) {
        int64_t L = b->lengths[k];
        /* tokens of the sequence; row q predicts token q+1 */
        int64_t prompt = L > 1 ? irange(&s, 1, L - 1) : 1;
        for (int64_t q = 0; q < L; q++, row++) {
            int64_t next = irange(&s, 0, b->V - 1);
            int last = q == L - 1;
            int active;
            if (b->masked)
                active = !last && q + 1 >= prompt && unif(&s) < 0.8; /* response rows, holes */
            else
                active = 1;
            b->mask[row] = (uint8_t)active;
            b->targets[row] = (b->masked && last) ? -100 : next;
            if (active && unif(&s) < 0.05) b->targets[row] = -100; /* an ignored target */
            /* every upstream gradient nonzero on active rows: each path of the backward runs
             * (logit_mean's is not defined with candidates) */
            b->up[F_LOGPROB][row] = active ? (float)normal(&s) : 0.0f;
            b->up[F_ENTROPY][row] = active ? (float)(0.5 * normal(&s)) : 0.0f;
            b->up[F_LSE][row] = active ? (float)(0.2 * normal(&s)) : 0.0f;
            b->up[F_LOGIT_MEAN][row] = active && !b->K ? (float)(0.2 * normal(&s)) : 0.0f;
            if (b->K) {
                int64_t *c = b->cand + row * b->K;
                int64_t n_c = irange(&s, 1, b->K); /* the rest stays -1 padding */
                int64_t have = 0;
                if (b->targets[row] >= 0) c[have++] = b->targets[row];
                while (have < n_c) {
                    int64_t id = irange(&s, 0, b->V - 1), dup = 0;
                    for (int64_t j = 0; j < have; j++) dup |= c[j] == id;
                    if (!dup) c[have++] = id;
                }
                for (int64_t j = have; j < b->K; j++) c[j] = -1;
                /* shuffle the real candidates so the target is not always first */
                for (int64_t j = have - 1; j > 0; j--) {
                    int64_t r = irange(&s, 0, j), t = c[j];
                    c[j] = c[r];
                    c[r] = t;
                }
            }
        }
    }
    return 1;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Reads DIR/name.npy into a: 1 read, 0 absent (optional), -1 error (reported). */
static int load(const char *dir, const char *name, int required, npy_array *a) {
    char path[4096], err[256];
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    memset(a, 0, sizeof *a);
    if (!exists(path)) {
        if (required) rfail("--inputs: %s is required", path);
        return required ? -1 : 0;
    }
    if (npy_read(path, a, err, sizeof err)) {
        rfail("%s", err);
        return -1;
    }
    return 1;
}

/* The .npy files of `spanhead run --inputs` (the single-process runner's names): hidden
 * (R, H) and weight (V, H) as <f4 (rounded to --dtype) or <u2 holding bf16 bits (--dtype
 * bf16), targets (R); optional mask (R), lengths (n) of the sequences (default: one sequence
 * of R rows), dlogprob, dentropy, dlse, dlogit_mean (R; absent = 0, as in one process),
 * candidates (R, K). */
static int read_inputs(const dopts *o, batch *b) {
    enum { I_H, I_W, I_T, I_M, I_L, I_C, I_G0, I_COUNT = I_G0 + NF };
    static const char *names[I_COUNT] = {"hidden", "weight", "targets", "mask", "lengths",
                                         "candidates", "dlogprob", "dentropy", "dlse",
                                         "dlogit_mean"};
    npy_array in[I_COUNT];
    int have[I_COUNT], ok = 0;
    memset(in, 0, sizeof in);
    for (int k = 0; k < I_COUNT; k++) {
        have[k] = load(o->inputs, names[k], k <= I_T, &in[k]);
        if (have[k] < 0) goto done;
    }
    const npy_array *h = &in[I_H], *w = &in[I_W];
    int is_bits = h->kind == 'u' && h->bytes == 2;
    if (!((h->kind == 'f' && h->bytes == 4) || is_bits) || w->kind != h->kind ||
        w->bytes != h->bytes) {
        rfail("hidden.npy %s, weight.npy %s: expected both <f4, or both <u2 (bf16 bits) with "
              "--dtype bf16", npy_descr(h), npy_descr(w));
        goto done;
    }
    if (is_bits && !o->bf16) {
        rfail("hidden.npy holds uint16: say it is bf16 with --dtype bf16");
        goto done;
    }
    if (h->ndim != 2 || w->ndim != 2 || h->shape[1] != w->shape[1] || in[I_T].ndim != 1 ||
        in[I_T].shape[0] != h->shape[0]) {
        rfail("--inputs: need hidden (R, H), weight (V, H), targets (R)");
        goto done;
    }
    b->R = h->shape[0];
    b->H = h->shape[1];
    b->V = w->shape[0];
    b->K = have[I_C] ? (in[I_C].ndim == 2 ? in[I_C].shape[1] : -1) : 0;
    b->masked = have[I_M];
    b->bf16 = o->bf16;
    b->temperature = o->temperature;
    if (b->K < 0 || (have[I_C] && in[I_C].shape[0] != b->R)) {
        rfail("candidates.npy: shape must be (R, K) with R = %lld", (long long)b->R);
        goto done;
    }
    for (int k = I_M; k < I_COUNT; k++)
        if (have[k] && k != I_L && k != I_C && in[k].count != b->R) {
            rfail("%s.npy holds %lld values, expected R = %lld", names[k],
                  (long long)in[k].count, (long long)b->R);
            goto done;
        }
    if (have[I_G0 + F_LOGIT_MEAN] && b->K) {
        rfail("dlogit_mean.npy: logit_mean is not defined with candidates");
        goto done;
    }
    b->n_seqs = have[I_L] ? in[I_L].count : 1;
    if (b->R < 1 || b->V < 1 || b->H < 1 || b->n_seqs < 1) {
        rfail("--inputs %s: empty (R=%lld H=%lld V=%lld)", o->inputs, (long long)b->R,
              (long long)b->H, (long long)b->V);
        goto done;
    }
    if (!batch_alloc(b)) goto done;
    int64_t sum = 0;
    for (int64_t k = 0; k < b->n_seqs; k++) {
        b->lengths[k] = have[I_L] ? (int64_t)npy_at(&in[I_L], k) : b->R;
        if (b->lengths[k] < 1) {
            rfail("lengths.npy[%lld] = %lld, expected >= 1", (long long)k,
                  (long long)b->lengths[k]);
            goto done;
        }
        sum += b->lengths[k];
    }
    if (sum != b->R) {
        rfail("lengths.npy sums to %lld, but hidden has R = %lld rows", (long long)sum,
              (long long)b->R);
        goto done;
    }
    for (int64_t i = 0; i < b->R * b->H; i++)
        b->hidden[i] = is_bits ? from_bf16((uint16_t)npy_at(h, i)) : round_in(b, npy_at(h, i));
    for (int64_t i = 0; i < b->V * b->H; i++)
        b->weight[i] = is_bits ? from_bf16((uint16_t)npy_at(w, i)) : round_in(b, npy_at(w, i));
    for (int64_t i = 0; i < b->R; i++) {
        b->targets[i] = (int64_t)npy_at(&in[I_T], i);
        b->mask[i] = have[I_M] ? npy_at(&in[I_M], i) != 0 : 1;
        for (int f = 0; f < NF; f++)
            b->up[f][i] = have[I_G0 + f] ? (float)npy_at(&in[I_G0 + f], i) : 0.0f;
    }
    for (int64_t i = 0; b->K && i < b->R * b->K; i++) b->cand[i] = (int64_t)npy_at(&in[I_C], i);
    ok = 1;
done:
    for (int k = 0; k < I_COUNT; k++) npy_free(&in[k]);
    return ok;
}

static int bcast(void *p, size_t bytes) {
    char *c = p;
    while (bytes) {
        int k = bytes > ((size_t)1 << 30) ? 1 << 30 : (int)bytes;
        if (MPI_Bcast(c, k, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS) return 0;
        c += k;
        bytes -= (size_t)k;
    }
    return 1;
}

/* Rank 0's batch to everyone (rank 0 has built it; ok says whether it could). */
static int share_batch(batch *b, int ok0) {
    int64_t hdr[8] = {ok0, b->n_seqs, b->R, b->H, b->V, b->K, b->masked, b->bf16};
    double temp = b->temperature;
    if (!bcast(hdr, sizeof hdr) || !bcast(&temp, sizeof temp)) return 0;
    if (!hdr[0]) return 0; /* rank 0 reported why */
    if (g_rank != 0) {
        b->n_seqs = hdr[1];
        b->R = hdr[2];
        b->H = hdr[3];
        b->V = hdr[4];
        b->K = hdr[5];
        b->masked = (int)hdr[6];
        b->bf16 = (int)hdr[7];
        b->temperature = temp;
    }
    int mine = g_rank == 0 || batch_alloc(b);
    if (!agree(mine)) return 0;
    size_t R = (size_t)b->R, H = (size_t)b->H;
    int ok = bcast(b->lengths, (size_t)b->n_seqs * sizeof(int64_t)) &&
             bcast(b->hidden, R * H * sizeof(float)) &&
             bcast(b->weight, (size_t)b->V * H * sizeof(float)) &&
             bcast(b->targets, R * sizeof(int64_t)) &&
             (!b->K || bcast(b->cand, R * (size_t)b->K * sizeof(int64_t))) && bcast(b->mask, R);
    for (int f = 0; ok && f < NF; f++) ok = bcast(b->up[f], R * sizeof(float));
    return ok;
}

/* ---- device buffers ----------------------------------------------------------------------- */

typedef struct dev {
    sph_ctx_t io; /* memory helpers on the rank's device (no communicator) */
    int cuda;
} dev;

/* A device copy of host data (CPU: a host copy, so both paths free the same way). */
static int dput(const dev *d, const void *host, size_t bytes, void **out) {
    *out = NULL;
    sph_status s = sph_ctx_malloc(d->io, bytes ? bytes : 1, out);
    if (s) return rfail("allocating %zu bytes: %s", bytes, sph_last_error());
    if (host && bytes) {
        s = sph_ctx_memcpy(d->io, *out, host, bytes);
        if (s) return rfail("copying %zu bytes: %s", bytes, sph_last_error());
    } else if (bytes) {
        s = sph_ctx_memset(d->io, *out, 0, bytes);
        if (s) return rfail("clearing %zu bytes: %s", bytes, sph_last_error());
    }
    return 1;
}

static int dget(const dev *d, void *host, const void *src, size_t bytes) {
    if (!bytes) return 1;
    sph_status s = sph_ctx_memcpy(d->io, host, src, bytes);
    if (s) return rfail("copying back %zu bytes: %s", bytes, sph_last_error());
    return 1;
}

/* ---- one rank's share ---------------------------------------------------------------------- */

typedef struct share {
    int64_t n;          /* local rows over all bins of this rank */
    int64_t n_bins;     /* bins (micro-batches) of this rank */
    int64_t *bin_off;   /* (n_bins + 1) into the local rows */
    int64_t *grow;      /* (n) global row of each local row, -1 = padding */
} share;

static void share_free(share *s) {
    free(s->bin_off);
    free(s->grow);
    memset(s, 0, sizeof *s);
}

/* Packs, lays out and cuts the batch for (cp_rank, dp_rank); *total_bins for the report. */
static int make_share(const dopts *o, const batch *b, int64_t cp_rank, int64_t dp_rank,
                      share *sh, int64_t *total_bins, int64_t *padded_rows) {
    memset(sh, 0, sizeof *sh);
    int ok = 0;
    sph_pack_result *pr = NULL;
    int64_t *seq_off = xcalloc((size_t)b->n_seqs + 1, sizeof(int64_t));
    int64_t *lens = xcalloc((size_t)b->n_seqs, sizeof(int64_t));
    int64_t *padded = xcalloc((size_t)b->n_seqs, sizeof(int64_t));
    int64_t *cu = xcalloc((size_t)b->n_seqs + 1, sizeof(int64_t));
    int64_t *rows = NULL, rows_cap = 0;
    if (!seq_off || !lens || !padded || !cu) {
        rfail("out of host memory");
        goto done;
    }
    for (int64_t k = 0; k < b->n_seqs; k++) seq_off[k + 1] = seq_off[k] + b->lengths[k];

    sph_parallel par = SPH_PARALLEL_INIT;
    par.tp = o->tp;
    par.cp = o->cp;
    sph_alignment al;
    if (sph_alignment_get(&par, &al)) {
        rfail("alignment: %s", sph_last_error());
        goto done;
    }
    /* Default capacity: about two bins per DP rank, never below the longest padded sequence. */
    int64_t cap = o->capacity, maxp = 0, sum = 0;
    for (int64_t k = 0; k < b->n_seqs; k++) {
        int64_t p = (b->lengths[k] + al.sequence - 1) / al.sequence * al.sequence;
        maxp = p > maxp ? p : maxp;
        sum += p;
    }
    if (cap == 0) {
        cap = sum / (2 * o->dp) + 1;
        if (cap < maxp) cap = maxp;
        cap = (cap + al.total - 1) / al.total * al.total;
    }
    sph_pack_opts po = SPH_PACK_OPTS_INIT;
    po.capacity = cap;
    po.algorithm = o->algo;
    po.par = par;
    po.bin_multiple = o->dp;
    if (sph_pack(b->lengths, b->n_seqs, &po, &pr)) {
        rfail("sph_pack (capacity %lld, dp %lld): %s", (long long)cap, (long long)o->dp,
              sph_last_error());
        goto done;
    }
    if (pr->n_bins % o->dp) {
        rfail("sph_pack returned %lld bins, not a multiple of dp %lld", (long long)pr->n_bins,
              (long long)o->dp);
        goto done;
    }
    *total_bins = pr->n_bins;
    const int64_t per = pr->n_bins / o->dp, b0 = dp_rank * per;
    sh->n_bins = per;
    sh->bin_off = xcalloc((size_t)per + 1, sizeof(int64_t));
    if (!sh->bin_off) {
        rfail("out of host memory");
        goto done;
    }
    /* Two passes over this rank's bins: count, then fill. */
    *padded_rows = 0;
    for (int pass = 0; pass < 2; pass++) {
        int64_t n = 0;
        for (int64_t bi = 0; bi < per; bi++) {
            const int64_t *it = pr->items + pr->bin_offsets[b0 + bi];
            int64_t ni = pr->bin_offsets[b0 + bi + 1] - pr->bin_offsets[b0 + bi];
            for (int64_t k = 0; k < ni; k++) lens[k] = b->lengths[it[k]];
            if (sph_layout_packed(&par, lens, ni, padded, cu)) {
                rfail("sph_layout_packed (bin %lld): %s", (long long)(b0 + bi), sph_last_error());
                goto done;
            }
            if (pass == 0) *padded_rows += cu[ni];
            for (int64_t k = 0; k < ni; k++) {
                int64_t P = padded[k], nl = P / o->cp;
                if (pass == 1) {
                    if (P > rows_cap) {
                        free(rows);
                        rows_cap = P;
                        rows = xcalloc((size_t)P, sizeof(int64_t));
                        if (!rows) {
                            rfail("out of host memory for a segment of %lld rows", (long long)P);
                            goto done;
                        }
                    }
                    if (sph_cp_local_rows(P, o->cp, cp_rank, rows)) {
                        rfail("sph_cp_local_rows (P=%lld): %s", (long long)P, sph_last_error());
                        goto done;
                    }
                    for (int64_t q = 0; q < nl; q++)
                        sh->grow[n + q] = rows[q] < lens[k] ? seq_off[it[k]] + rows[q] : -1;
                }
                n += nl;
            }
            if (pass == 1) sh->bin_off[bi + 1] = n;
        }
        if (pass == 0) {
            sh->n = n;
            sh->grow = xcalloc((size_t)n, sizeof(int64_t));
            if (!sh->grow) {
                rfail("out of host memory for %lld local rows", (long long)n);
                goto done;
            }
        }
    }
    ok = 1;
done:
    sph_pack_free(pr);
    free(seq_off);
    free(lens);
    free(padded);
    free(cu);
    free(rows);
    if (!ok) share_free(sh);
    return ok;
}

/* ---- forward + backward of one rank ------------------------------------------------------ */

typedef struct result {
    float *row[NF];           /* (n) each: logprob, entropy, lse, logit_mean (0 with support) */
    float *dhidden;           /* (n, H), summed over the TP group */
    float *dweight;           /* (V_loc, H), this rank's bins */
    double bench_ms[4];       /* --bench: medians (slowest rank) of forward and backward with
                                 the TP communicator, then without it; rank 0 only */
} result;

static void result_free(result *r) {
    for (int f = 0; f < NF; f++) free(r->row[f]);
    free(r->dhidden);
    free(r->dweight);
    memset(r, 0, sizeof *r);
}

static sph_tensor tens(void *data, sph_dtype dt, int32_t ndim, int64_t *shape, int cuda) {
    sph_tensor t = {data, {cuda ? SPH_DEVICE_CUDA : SPH_DEVICE_CPU, 0}, ndim, dt, shape, NULL, 0};
    return t;
}

/* Runs forward + backward over rows [grow] of the batch with weight rows [v0, v0 + V_loc),
 * one call pair per bin. ctx carries the TP communicator (or none for the reference). */
/* --bench: times forward and backward of the bin already on the device, reps times, with the
 * TP context and with a context without communicator (the same per-rank work, no combine),
 * into out->bench_ms (medians of the slowest rank). Every rank calls it at bin 0. dw_d is a
 * scratch dweight so that the accumulated gradient is not disturbed. */
static int bench_bin(sph_ctx_t ctx, sph_ctx_t local, const sph_head_args *a0, int allreduce,
                     void *ws, size_t ws_bytes, int reps, result *out) {
    double *t = calloc((size_t)reps * 4, sizeof(double));
    int ok = t != NULL;
    if (!agree(ok)) {
        free(t);
        return rfail("out of host memory for %d timings", reps);
    }
    for (int mode = 0; mode < 2 && ok; mode++) {
        sph_ctx_t c = mode == 0 ? ctx : local;
        sph_head_args fa = *a0, ba = *a0;
        fa.dhidden = NULL;
        fa.dweight = NULL;
        fa.dlogprob = fa.dentropy = fa.dlse = fa.dlogit_mean = NULL;
        fa.allreduce_dhidden = 0;
        fa.accumulate_dweight = 0;
        ba.accumulate_dweight = 0;
        ba.allreduce_dhidden = mode == 0 ? allreduce : 0;
        for (int r = -1; r < reps && ok; r++) { /* r = -1: warm-up */
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            sph_status s = sph_head_forward(c, &fa, ws, ws_bytes);
            if (!s) s = sph_ctx_synchronize(c);
            double t1 = MPI_Wtime();
            if (!s) s = sph_head_backward(c, &ba, ws, ws_bytes);
            if (!s) s = sph_ctx_synchronize(c);
            double t2 = MPI_Wtime();
            if (s) ok = rfail("--bench: %s", sph_last_error());
            if (r >= 0) {
                t[(size_t)(2 * mode) * (size_t)reps + (size_t)r] = t1 - t0;
                t[(size_t)(2 * mode + 1) * (size_t)reps + (size_t)r] = t2 - t1;
            }
        }
    }
    if (!agree(ok)) {
        free(t);
        return 0;
    }
    double *mx = calloc((size_t)reps * 4, sizeof(double));
    if (g_rank == 0 && !mx) ok = rfail("out of host memory");
    MPI_Reduce(t, mx, reps * 4, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (g_rank == 0 && mx)
        for (int k = 0; k < 4; k++) {
            qsort(mx + (size_t)k * (size_t)reps, (size_t)reps, sizeof(double), sph_cli_cmp_double);
            out->bench_ms[k] = mx[(size_t)k * (size_t)reps + (size_t)reps / 2] * 1e3;
        }
    free(t);
    free(mx);
    return ok;
}

static int run_head(sph_ctx_t ctx, const dev *d, const batch *b, const int64_t *grow,
                    const int64_t *bin_off, int64_t n_bins, int64_t v0, int64_t V_loc,
                    int64_t gap, int allreduce, int one_pass, sph_ctx_t bench_ctx,
                    int bench_reps, result *out) {
    const int64_t H = b->H, K = b->K;
    const int cuda = d->cuda, nf = K ? NF - 1 : NF; /* logit_mean is undefined with support */
    const size_t esz = b->bf16 ? 2 : 4;
    const sph_dtype in_dt = b->bf16 ? SPH_BF16 : SPH_F32;
    const int64_t n_all = bin_off[n_bins];
    int ok = 0;
    memset(out, 0, sizeof *out);
    void *w_d = NULL, *dw_d = NULL, *ws = NULL;
    size_t ws_bytes = 0;
    /* host staging of one bin, and its device copies */
    void *h_h = NULL;
    int64_t *t_h = NULL, *c_h = NULL, *spans = NULL;
    uint8_t *m_h = NULL;
    float *up_h[NF] = {NULL};
    void *h_d = NULL, *t_d = NULL, *c_d = NULL, *m_d = NULL, *st_d = NULL, *dh_d = NULL;
    void *up_d[NF] = {NULL}, *row_d[NF] = {NULL};

    int all = 1;
    for (int f = 0; f < NF; f++) all &= (out->row[f] = xcalloc((size_t)n_all, sizeof(float))) != 0;
    out->dhidden = xcalloc((size_t)n_all * (size_t)H, sizeof(float));
    out->dweight = xcalloc((size_t)V_loc * (size_t)H, sizeof(float));
    void *w_h = xcalloc((size_t)V_loc * (size_t)H, esz);
    if (!all || !out->dhidden || !out->dweight || !w_h) {
        rfail("out of host memory for %lld rows", (long long)n_all);
        goto done;
    }
    for (int64_t i = 0; i < V_loc * H; i++) {
        float v = b->weight[(size_t)v0 * (size_t)H + (size_t)i];
        if (b->bf16) ((uint16_t *)w_h)[i] = to_bf16(v);
        else ((float *)w_h)[i] = v;
    }
    if (!dput(d, w_h, (size_t)(V_loc * H) * esz, &w_d) ||
        !dput(d, NULL, (size_t)(V_loc * H) * sizeof(float), &dw_d))
        goto done;

    for (int64_t bi = 0; bi < n_bins; bi++) {
        const int64_t r0 = bin_off[bi], n = bin_off[bi + 1] - r0;
        const int64_t *gr = grow + r0;
        h_h = xcalloc((size_t)(n * H), esz);
        t_h = xcalloc((size_t)n, sizeof(int64_t));
        c_h = K ? xcalloc((size_t)(n * K), sizeof(int64_t)) : NULL;
        m_h = xcalloc((size_t)n, 1);
        spans = xcalloc((size_t)(2 * ((n + 1) / 2) + 2), sizeof(int64_t));
        all = 1;
        for (int f = 0; f < nf; f++) all &= (up_h[f] = xcalloc((size_t)n, sizeof(float))) != 0;
        if (!h_h || !t_h || (K && !c_h) || !m_h || !all || !spans) {
            rfail("out of host memory for a bin of %lld rows", (long long)n);
            goto done;
        }
        /* Local rows from global rows; padding rows (g < 0) are zero hidden, target -1 and
         * zero upstream gradients, and inactive. */
        for (int64_t i = 0; i < n; i++) {
            int64_t g = gr[i];
            for (int64_t j = 0; j < H; j++) {
                float v = g >= 0 ? b->hidden[(size_t)g * (size_t)H + (size_t)j] : 0.0f;
                if (b->bf16) ((uint16_t *)h_h)[i * H + j] = to_bf16(v);
                else ((float *)h_h)[i * H + j] = v;
            }
            t_h[i] = g >= 0 ? b->targets[g] : -1;
            for (int64_t j = 0; j < K; j++) c_h[i * K + j] = g >= 0 ? b->cand[g * K + j] : -1;
            m_h[i] = g >= 0 ? b->mask[g] : 0;
            for (int f = 0; f < nf; f++) up_h[f][i] = g >= 0 ? b->up[f][g] : 0.0f;
        }
        int64_t n_spans = 0;
        if (b->masked && sph_spans_from_mask(m_h, n, gap, spans, &n_spans)) {
            rfail("sph_spans_from_mask: %s", sph_last_error());
            goto done;
        }
        if (!dput(d, h_h, (size_t)(n * H) * esz, &h_d) ||
            !dput(d, t_h, (size_t)n * sizeof(int64_t), &t_d) ||
            (K && !dput(d, c_h, (size_t)(n * K) * sizeof(int64_t), &c_d)) ||
            !dput(d, m_h, (size_t)n, &m_d) ||
            !dput(d, NULL, (size_t)n * 3 * sizeof(float), &st_d) ||
            !dput(d, NULL, (size_t)(n * H) * sizeof(float), &dh_d))
            goto done;
        for (int f = 0; f < nf; f++)
            if (!dput(d, up_h[f], (size_t)n * sizeof(float), &up_d[f]) ||
                !dput(d, NULL, (size_t)n * sizeof(float), &row_d[f]))
                goto done;

        int64_t s_h[2] = {n, H}, s_w[2] = {V_loc, H}, s_n[1] = {n}, s_c[2] = {n, K},
                s_st[2] = {n, 3}, s_dw[2] = {V_loc, H};
        sph_tensor th = tens(h_d, in_dt, 2, s_h, cuda), tw = tens(w_d, in_dt, 2, s_w, cuda),
                   tt = tens(t_d, SPH_I64, 1, s_n, cuda), tc = tens(c_d, SPH_I64, 2, s_c, cuda),
                   tm = tens(m_d, SPH_U8, 1, s_n, cuda), tst = tens(st_d, SPH_F32, 2, s_st, cuda),
                   tdh = tens(dh_d, SPH_F32, 2, s_h, cuda),
                   tdw = tens(dw_d, SPH_F32, 2, s_dw, cuda), tup[NF], trow[NF];
        for (int f = 0; f < nf; f++) {
            tup[f] = tens(up_d[f], SPH_F32, 1, s_n, cuda);
            trow[f] = tens(row_d[f], SPH_F32, 1, s_n, cuda);
        }
        sph_head_args a = SPH_HEAD_ARGS_INIT;
        a.hidden = &th;
        a.weight = &tw;
        a.targets = &tt;
        a.candidates = K ? &tc : NULL;
        a.vocab_start = v0;
        a.vocab_total = b->V;
        a.temperature = b->temperature;
        if (b->masked) {
            a.active_mask = &tm;
            a.spans = spans;
            a.n_spans = n_spans;
        }
        a.logprob = &trow[F_LOGPROB];
        a.entropy = &trow[F_ENTROPY];
        a.lse = &trow[F_LSE];
        a.logit_mean = K ? NULL : &trow[F_LOGIT_MEAN];
        a.stats = &tst;
        /* Forward first, in the general (two-pass) mode: no gradient outputs, no upstream. */
        size_t need = 0, need_b = 0;
        sph_head_args ab = a;
        ab.dlogprob = &tup[F_LOGPROB];
        ab.dentropy = &tup[F_ENTROPY];
        ab.dlse = &tup[F_LSE];
        ab.dlogit_mean = K ? NULL : &tup[F_LOGIT_MEAN];
        ab.dhidden = &tdh;
        ab.dweight = &tdw;
        ab.accumulate_dweight = bi > 0;
        ab.allreduce_dhidden = allreduce;
        /* one-pass: the forward takes the upstream gradients and writes the gradients too */
        sph_status s = sph_head_workspace_size(ctx, SPH_HEAD_FORWARD, one_pass ? &ab : &a, &need);
        if (!s && !one_pass) s = sph_head_workspace_size(ctx, SPH_HEAD_BACKWARD, &ab, &need_b);
        if (s) {
            rfail("workspace size: %s", sph_last_error());
            goto done;
        }
        if (need_b > need) need = need_b;
        if (need > ws_bytes) {
            sph_ctx_free(d->io, ws);
            ws = NULL;
            ws_bytes = 0;
            if (!dput(d, NULL, need, &ws)) goto done;
            ws_bytes = need;
        }
        s = sph_head_forward(ctx, one_pass ? &ab : &a, ws, ws_bytes);
        if (s) {
            rfail("sph_head_forward (bin %lld, %lld rows): %s", (long long)bi, (long long)n,
                  sph_last_error());
            goto done;
        }
        if (!one_pass) s = sph_head_backward(ctx, &ab, ws, ws_bytes);
        if (s == SPH_OK) s = sph_ctx_synchronize(ctx);
        if (s) {
            rfail("sph_head_backward (bin %lld, %lld rows): %s", (long long)bi, (long long)n,
                  sph_last_error());
            goto done;
        }
        for (int f = 0; f < nf; f++)
            if (!dget(d, out->row[f] + r0, row_d[f], (size_t)n * sizeof(float))) goto done;
        if (!dget(d, out->dhidden + (size_t)r0 * (size_t)H, dh_d, (size_t)(n * H) * sizeof(float)))
            goto done;
        if (bench_reps > 0 && bi == 0) {
            void *dwt = NULL;
            if (!agree(dput(d, NULL, (size_t)(V_loc * H) * sizeof(float), &dwt))) {
                sph_ctx_free(d->io, dwt);
                goto done;
            }
            sph_tensor tdwt = tens(dwt, SPH_F32, 2, s_dw, cuda);
            sph_head_args abt = ab;
            abt.dweight = &tdwt;
            int bok = bench_bin(ctx, bench_ctx, &abt, allreduce, ws, ws_bytes, bench_reps, out);
            sph_ctx_free(d->io, dwt);
            if (!bok) goto done;
        }
        void **bufs[] = {&h_d, &t_d, &c_d, &m_d, &st_d, &dh_d};
        for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) {
            sph_ctx_free(d->io, *bufs[k]);
            *bufs[k] = NULL;
        }
        for (int f = 0; f < NF; f++) {
            sph_ctx_free(d->io, up_d[f]);
            sph_ctx_free(d->io, row_d[f]);
            free(up_h[f]);
            up_d[f] = row_d[f] = NULL;
            up_h[f] = NULL;
        }
        free(h_h), free(t_h), free(c_h), free(m_h), free(spans);
        h_h = NULL, t_h = NULL, c_h = NULL, m_h = NULL, spans = NULL;
    }
    if (!dget(d, out->dweight, dw_d, (size_t)(V_loc * H) * sizeof(float))) goto done;
    ok = 1;
done:
    {
        void *bufs[] = {h_d, t_d, c_d, m_d, st_d, dh_d, w_d, dw_d, ws};
        for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) sph_ctx_free(d->io, bufs[k]);
        for (int f = 0; f < NF; f++) {
            sph_ctx_free(d->io, up_d[f]);
            sph_ctx_free(d->io, row_d[f]);
            free(up_h[f]);
        }
    }
    free(w_h);
    free(h_h), free(t_h), free(c_h), free(m_h), free(spans);
    if (!ok) result_free(out);
    return ok;
}

/* ---- gather and compare ------------------------------------------------------------------- */

/* Gathers `bytes` from every rank into rank 0's *out (allocated there); counts in bytes. */
static int gatherv(const void *send, size_t bytes, void **out, size_t **counts_out) {
    int ok = 1;
    if (bytes > INT32_MAX) ok = rfail("%zu bytes to gather exceed MPI's int count", bytes);
    if (!agree(ok)) return 0;
    int mine = (int)bytes, *counts = NULL, *displs = NULL;
    if (g_rank == 0) {
        counts = xcalloc((size_t)g_size, sizeof(int));
        displs = xcalloc((size_t)g_size, sizeof(int));
    }
    MPI_Gather(&mine, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD);
    size_t total = 0;
    if (g_rank == 0) {
        for (int r = 0; r < g_size; r++) {
            displs[r] = (int)total;
            total += (size_t)counts[r];
        }
        if (total > INT32_MAX) ok = rfail("%zu gathered bytes exceed MPI's int count", total);
        *out = ok ? xcalloc(total, 1) : NULL;
        if (ok && !*out) ok = rfail("out of host memory for %zu gathered bytes", total);
        *counts_out = xcalloc((size_t)g_size, sizeof(size_t));
        for (int r = 0; *counts_out && r < g_size; r++) (*counts_out)[r] = (size_t)counts[r];
    }
    if (!agree(ok)) {
        free(counts);
        free(displs);
        return 0;
    }
    int e = MPI_Gatherv(send, mine, MPI_BYTE, g_rank == 0 ? *out : NULL, counts, displs, MPI_BYTE,
                        0, MPI_COMM_WORLD);
    free(counts);
    free(displs);
    return e == MPI_SUCCESS;
}

typedef struct errstat {
    double max_abs, max_rel, worst_ratio;
    int64_t worst;
} errstat;

static errstat compare(const float *got, const float *ref, int64_t n, double atol, double rtol) {
    errstat e = {0, 0, 0, -1};
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i], ae = fabs(g - r);
        if (isnan(g) != isnan(r) || (isnan(g) && isnan(r))) ae = INFINITY;
        double re = ae / (fabs(r) > 1e-30 ? fabs(r) : 1e-30);
        double ratio = ae / (atol + rtol * fabs(r));
        if (ae > e.max_abs) e.max_abs = ae;
        if (ae > 0 && re > e.max_rel) e.max_rel = re;
        if (ratio > e.worst_ratio || e.worst < 0) {
            e.worst_ratio = ratio;
            e.worst = i;
        }
    }
    return e;
}

/* ---- the command -------------------------------------------------------------------------- */

int sph_cli_run_dist(int argc, char **argv) {
    int inited = 0, we_init = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init(&argc, &argv) != MPI_SUCCESS)
            return sph_cli_fail("run", 1, "MPI_Init failed");
        we_init = 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    int rc = 1;
    dopts o;
    batch b;
    share sh;
    result res, ref;
    memset(&b, 0, sizeof b);
    memset(&sh, 0, sizeof sh);
    memset(&res, 0, sizeof res);
    memset(&ref, 0, sizeof ref);
    sph_comm_t comm = NULL;
    sph_ctx_t ctx = NULL, ref_ctx = NULL, local_ctx = NULL;
    dev d = {NULL, 0};
    MPI_Comm tpc = MPI_COMM_NULL, shard_comm = MPI_COMM_NULL;
    void *g_rows = NULL, *g_vals = NULL, *g_dh = NULL, *g_dw = NULL;
    size_t *c_rows = NULL, *c_vals = NULL, *c_dh = NULL, *c_dw = NULL;
    double *dw64 = NULL, *dw64_sum = NULL;
    float *G_row[NF] = {NULL}, *G_dh = NULL, *G_dw = NULL;
    int8_t *seen = NULL;
    double *dh64 = NULL;

    int p = parse_opts(argc, argv, &o, g_rank);
    if (p) {
        rc = p < 0 ? 0 : 2;
        goto out;
    }
    if (o.tp * o.cp * o.dp != g_size) {
        if (g_rank == 0)
            sph_cli_fail("run", 2, "--tp %lld --cp %lld --dp %lld needs %lld ranks, but "
                                   "mpirun started %d (mpirun -np %lld ...)",
                         (long long)o.tp, (long long)o.cp, (long long)o.dp,
                         (long long)(o.tp * o.cp * o.dp), g_size,
                         (long long)(o.tp * o.cp * o.dp));
        rc = 2;
        goto out;
    }
    const int64_t tp_rank = g_rank % o.tp, cp_rank = (g_rank / o.tp) % o.cp,
                  dp_rank = g_rank / (o.tp * o.cp);

    /* 1. the global batch */
    int ok0 = 1;
    if (g_rank == 0) ok0 = o.inputs ? read_inputs(&o, &b) : synth(&o, &b);
    if (!share_batch(&b, ok0)) goto out;
    if (o.tp > b.V) { /* every rank has b.V now: the same verdict everywhere */
        if (g_rank == 0) rfail("--tp %lld exceeds the vocabulary %lld", (long long)o.tp,
                               (long long)b.V);
        goto out;
    }

    /* 2-4. bins, layout, CP-local rows */
    int64_t total_bins = 0, padded_rows = 0;
    if (!agree(make_share(&o, &b, cp_rank, dp_rank, &sh, &total_bins, &padded_rows))) goto out;

    /* 5. device, communicator, context */
    const int64_t v_base = b.V / o.tp, v0 = tp_rank * v_base,
                  V_loc = tp_rank == o.tp - 1 ? b.V - v0 : v_base;
    int ok = 1;
    sph_ctx_opts io = SPH_CTX_OPTS_INIT;
    if (o.cuda) {
        MPI_Comm node;
        int local = 0;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &node);
        MPI_Comm_rank(node, &local);
        MPI_Comm_free(&node);
        int n_dev = sph_cuda_device_count();
        if (n_dev < 1) ok = rfail("--device cuda: no CUDA device visible to this rank");
        io.device.type = SPH_DEVICE_CUDA;
        io.device.id = n_dev > 0 ? local % n_dev : 0;
    }
    if (ok && sph_ctx_create(&d.io, &io)) ok = rfail("context: %s", sph_last_error());
    d.cuda = o.cuda;
    if (!agree(ok)) goto out;
    sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
    cfg.tp = o.tp;
    cfg.cp = o.cp;
    cfg.dp = o.dp;
    cfg.vocab_total = b.V;
    cfg.vocab_start = v0;
    cfg.vocab_local = V_loc;
    cfg.dtype = b.bf16 ? SPH_BF16 : SPH_F32;
    cfg.temperature = b.temperature;
    sph_status cs;
    if (o.cuda) {
        /* The TP group's MPI communicator carries the NCCL unique id. */
        MPI_Comm_split(MPI_COMM_WORLD, (int)(g_rank / o.tp), (int)tp_rank, &tpc);
        cs = sph_comm_create_nccl_mpi(&comm, &tpc, &cfg);
    } else {
        int64_t t = -1, c = -1, dd = -1;
        cs = sph_comm_create_mpi_world(&comm, &cfg, &t, &c, &dd);
        if (cs == SPH_OK && (t != tp_rank || c != cp_rank || dd != dp_rank))
            ok = rfail("communicator coordinates (%lld, %lld, %lld) differ from the runner's "
                       "(%lld, %lld, %lld)", (long long)t, (long long)c, (long long)dd,
                       (long long)tp_rank, (long long)cp_rank, (long long)dp_rank);
    }
    if (cs) ok = rfail("communicator: %s", sph_last_error());
    if (!agree(ok)) goto out;
    sph_ctx_opts co = io;
    co.tp_comm = comm;
    co.force_kernel = o.kernel;
    co.chunk_rows = o.chunk_rows;
    if (sph_ctx_create(&ctx, &co)) ok = rfail("context: %s", sph_last_error());
    co.tp_comm = NULL;
    if (ok && o.bench && sph_ctx_create(&local_ctx, &co))
        ok = rfail("context: %s", sph_last_error());
    if (!agree(ok)) goto out;

    if (g_rank == 0) {
        int64_t active = 0;
        for (int64_t i = 0; i < b.R; i++) active += b.mask[i];
        printf("run: tp=%lld cp=%lld dp=%lld device=%s (%s)\n", (long long)o.tp, (long long)o.cp,
               (long long)o.dp, o.cuda ? "cuda" : "cpu", sph_ctx_describe(ctx));
        printf("batch: %lld sequences, R=%lld rows (%lld active, %s), H=%lld V=%lld, dtype=%s, "
               "temperature=%g\n",
               (long long)b.n_seqs, (long long)b.R, (long long)active,
               b.masked ? "masked" : "dense", (long long)b.H, (long long)b.V,
               b.bf16 ? "bf16" : "f32", b.temperature);
        if (b.K) printf("support: K=%lld candidates per row\n", (long long)b.K);
        printf("layout: %lld bins (%lld per DP rank), rank 0 holds %lld local rows, %lld padded "
               "rows in its bins\n",
               (long long)total_bins, (long long)sh.n_bins, (long long)sh.n,
               (long long)padded_rows);
        fflush(stdout);
    }

    /* 5b. forward + backward of every rank */
    double t0 = MPI_Wtime();
    ok = run_head(ctx, &d, &b, sh.grow, sh.bin_off, sh.n_bins, v0, V_loc, o.gap,
                  !o.dh_partial, o.one_pass, local_ctx,
                  o.bench, &res);
    if (!agree(ok)) goto out;
    double t_run = MPI_Wtime() - t0, t_max = 0;
    MPI_Reduce(&t_run, &t_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

    /* 6. gather: row ids, per-row outputs, dhidden; dweight reduced over CP x DP */
    const size_t H = (size_t)b.H, n = (size_t)sh.n;
    float *vals = xcalloc(NF * n, sizeof(float));
    ok = vals != NULL;
    for (size_t i = 0; ok && i < n; i++)
        for (int f = 0; f < NF; f++) vals[NF * i + (size_t)f] = res.row[f][i];
    if (!agree(ok)) {
        free(vals);
        goto out;
    }
    ok = gatherv(sh.grow, n * sizeof(int64_t), &g_rows, &c_rows) &&
         gatherv(vals, n * NF * sizeof(float), &g_vals, &c_vals) &&
         gatherv(res.dhidden, n * H * sizeof(float), &g_dh, &c_dh);
    free(vals);
    if (!agree(ok)) goto out;

    dw64 = xcalloc((size_t)V_loc * H, sizeof(double));
    dw64_sum = xcalloc((size_t)V_loc * H, sizeof(double));
    ok = dw64 && dw64_sum;
    for (size_t i = 0; ok && i < (size_t)V_loc * H; i++) dw64[i] = res.dweight[i];
    if (!agree(ok)) goto out;
    MPI_Comm_split(MPI_COMM_WORLD, (int)tp_rank, g_rank, &shard_comm);
    /* Float64 sum over the CP x DP replicas of this shard, to the replica with cp = dp = 0
     * (world rank tp_rank); chunked for MPI's int count. */
    for (size_t off = 0; off < (size_t)V_loc * H; off += (size_t)1 << 28) {
        size_t cnt = (size_t)V_loc * H - off;
        if (cnt > (size_t)1 << 28) cnt = (size_t)1 << 28;
        MPI_Reduce(dw64 + off, dw64_sum + off, (int)cnt, MPI_DOUBLE, MPI_SUM, 0, shard_comm);
    }
    float *dw_send = xcalloc((size_t)V_loc * H, sizeof(float));
    ok = dw_send != NULL;
    for (size_t i = 0; ok && i < (size_t)V_loc * H; i++) dw_send[i] = (float)dw64_sum[i];
    if (!agree(ok)) {
        free(dw_send);
        goto out;
    }
    ok = gatherv(dw_send, g_rank < o.tp ? (size_t)V_loc * H * sizeof(float) : 0, &g_dw, &c_dw);
    free(dw_send);
    if (!agree(ok)) goto out;

    /* 7. rank 0: assemble, check, write */
    int pass = 1;
    if (g_rank == 0) {
        const size_t R = (size_t)b.R, V = (size_t)b.V;
        int all_rows = 1;
        for (int f = 0; f < NF; f++) all_rows &= (G_row[f] = xcalloc(R, sizeof(float))) != NULL;
        G_dh = xcalloc(R * H, sizeof(float));
        G_dw = (float *)g_dw; /* shards in TP order are the concatenation */
        seen = xcalloc(R, 1);
        if (o.dh_partial) dh64 = xcalloc(R * H, sizeof(double));
        if (!all_rows || !G_dh || !seen || (o.dh_partial && !dh64)) {
            rfail("out of host memory assembling the outputs");
            pass = 0;
        }
        size_t off_r = 0, off_v = 0, off_h = 0;
        int64_t tp_mismatch = 0, pad_nonzero = 0, dup = 0;
        /* Ranks with tp_rank 0 place values; the others must match them bit for bit. */
        for (int pass_tp = 0; pass && pass_tp < 2; pass_tp++) {
            off_r = off_v = off_h = 0;
            for (int r = 0; r < g_size; r++) {
                size_t nr = c_rows[r] / sizeof(int64_t);
                const int64_t *rows = (const int64_t *)((char *)g_rows + off_r);
                const float *v = (const float *)((char *)g_vals + off_v);
                const float *dh = (const float *)((char *)g_dh + off_h);
                int is_t0 = r % o.tp == 0;
                for (size_t i = 0; i < nr; i++) {
                    int64_t gr = rows[i];
                    if (gr < 0) {
                        /* padding rows are inactive when masked: exact zeros */
                        if (pass_tp == 0 && b.masked) {
                            int nz = 0;
                            for (int f = 0; f < NF; f++) nz |= v[NF * i + (size_t)f] != 0;
                            for (size_t j = 0; j < H; j++) nz |= dh[i * H + j] != 0;
                            pad_nonzero += nz;
                        }
                        continue;
                    }
                    if (pass_tp == 0 && dh64) /* partials: the TP sum in float64 */
                        for (size_t j = 0; j < H; j++) dh64[(size_t)gr * H + j] += dh[i * H + j];
                    if (pass_tp == 0 && is_t0) {
                        dup += seen[gr]++ > 0;
                        for (int f = 0; f < NF; f++) G_row[f][gr] = v[NF * i + (size_t)f];
                        if (!dh64) memcpy(G_dh + (size_t)gr * H, dh + i * H, H * sizeof(float));
                    } else if (pass_tp == 1 && !is_t0) {
                        int differ = 0;
                        for (int f = 0; f < NF; f++)
                            differ |= memcmp(&G_row[f][gr], &v[NF * i + (size_t)f], 4) != 0;
                        tp_mismatch += differ;
                    }
                }
                off_r += c_rows[r];
                off_v += c_vals[r];
                off_h += c_dh[r];
            }
        }
        for (size_t k = 0; dh64 && pass && k < R * H; k++) G_dh[k] = (float)dh64[k];
        int64_t missing = 0;
        for (size_t i = 0; i < R; i++) missing += seen && !seen[i];
        size_t dw_total = 0;
        for (int r = 0; r < g_size; r++) dw_total += c_dw[r];
        if (dw_total != V * H * sizeof(float)) {
            printf("dweight: gathered %zu bytes, expected %zu\n", dw_total, V * H * sizeof(float));
            pass = 0;
        }
        printf("coverage: %lld rows missing, %lld computed twice; TP copies differing: %lld; "
               "nonzero padding rows: %lld\n",
               (long long)missing, (long long)dup, (long long)tp_mismatch,
               (long long)pad_nonzero);
        if (missing || dup || tp_mismatch || pad_nonzero) pass = 0;
        printf("time: forward + backward %.3f ms (slowest rank, all bins, host copies included)\n",
               t_max * 1e3);
        if (o.bench) {
            const double *m = res.bench_ms;
            printf("bench: bin 0 of every rank (rank 0: %lld rows), %d reps, median of the "
                   "slowest rank:\n"
                   "  forward  %.3f ms with the TP combine, %.3f ms without (combine share "
                   "%.1f%%)\n"
                   "  backward %.3f ms with the dhidden all-reduce, %.3f ms without (share "
                   "%.1f%%)\n",
                   (long long)(sh.bin_off[1] - sh.bin_off[0]), o.bench, m[0], m[2],
                   m[0] > 0 ? (m[0] - m[2]) / m[0] * 100 : 0.0, m[1], m[3],
                   m[1] > 0 ? (m[1] - m[3]) / m[1] * 100 : 0.0);
        }

        if (pass && o.check) {
            /* --reference ref: the float64 reference kernels on the CPU; device: the ranks'
             * device and kernels in one process, without a communicator (the single-GPU
             * result, for shapes the reference is too slow for). */
            sph_ctx_opts ro = SPH_CTX_OPTS_INIT;
            dev hd = {NULL, 0};
            if (o.ref_device) {
                ro = io;
                ro.force_kernel = o.kernel;
                hd.cuda = o.cuda;
            } else {
                ro.force_kernel = "ref";
            }
            int64_t *all = xcalloc(R, sizeof(int64_t));
            int64_t bo[2] = {0, (int64_t)R};
            int rok = all != NULL;
            for (size_t i = 0; rok && i < R; i++) all[i] = (int64_t)i;
            if (rok && sph_ctx_create(&ref_ctx, &ro))
                rok = rfail("ref context: %s", sph_last_error());
            hd.io = ref_ctx;
            /* One bin of all R rows; spans from the global mask with the same gap. */
            rok = rok && run_head(ref_ctx, &hd, &b, all, bo, 1, 0, b.V, o.gap, 0, 0, NULL, 0,
                                  &ref);
            free(all);
            if (!rok) {
                pass = 0;
            } else {
                typedef struct { const char *name; const float *got, *want; size_t n; } cmp_t;
                cmp_t cmp[NF + 2];
                size_t nc = 0;
                for (int f = 0; f < NF; f++)
                    if (f != F_LOGIT_MEAN || !b.K)
                        cmp[nc++] = (cmp_t){F_NAME[f], G_row[f], ref.row[f], R};
                cmp[nc++] = (cmp_t){"dhidden", G_dh, ref.dhidden, R * H};
                cmp[nc++] = (cmp_t){"dweight", G_dw, ref.dweight, V * H};
                printf("check against the single-process %s (atol %g, rtol %g):\n",
                       o.ref_device ? "run on the same device and kernels" : "reference",
                       o.atol, o.rtol);
                for (size_t k = 0; k < nc; k++) {
                    errstat e = compare(cmp[k].got, cmp[k].want, (int64_t)cmp[k].n, o.atol, o.rtol);
                    int good = e.worst_ratio <= 1.0;
                    printf("  %-10s max abs err %.3e  max rel err %.3e  worst [%lld] got %.9g ref "
                           "%.9g  %s\n",
                           cmp[k].name, e.max_abs, e.max_rel, (long long)e.worst,
                           e.worst >= 0 ? cmp[k].got[e.worst] : 0.0,
                           e.worst >= 0 ? cmp[k].want[e.worst] : 0.0, good ? "ok" : "FAIL");
                    pass &= good;
                }
            }
        }
        if (o.outputs) {
            /* The files `spanhead run --outputs` writes in one process. */
            int64_t sr[1] = {b.R}, srh[2] = {b.R, b.H}, svh[2] = {b.V, b.H};
            int wok = mkdir(o.outputs, 0777) == 0 || errno == EEXIST;
            if (!wok) rfail("--outputs %s: %s", o.outputs, strerror(errno));
            for (int f = 0; wok && f < NF; f++)
                if (f != F_LOGIT_MEAN || !b.K)
                    wok = write_f32(o.outputs, F_NAME[f], G_row[f], 1, sr);
            wok = wok && write_f32(o.outputs, "dhidden", G_dh, 2, srh) &&
                  write_f32(o.outputs, "dweight", G_dw, 2, svh);
            if (wok) printf("outputs: written to %s\n", o.outputs);
            else pass = 0;
        }
        printf("%s\n", !o.check ? (pass ? "DONE (not checked)" : "FAIL") : pass ? "PASS" : "FAIL");
        fflush(stdout);
    }
    MPI_Bcast(&pass, 1, MPI_INT, 0, MPI_COMM_WORLD);
    rc = pass ? 0 : 1;

out:
    result_free(&res);
    result_free(&ref);
    share_free(&sh);
    batch_free(&b);
    free(g_rows);
    free(g_vals);
    free(g_dh);
    free(g_dw);
    free(c_rows);
    free(c_vals);
    free(c_dh);
    free(c_dw);
    free(dw64);
    free(dw64_sum);
    for (int f = 0; f < NF; f++) free(G_row[f]);
    free(G_dh);
    free(seen);
    free(dh64);
    sph_ctx_destroy(ref_ctx);
    sph_ctx_destroy(local_ctx);
    sph_ctx_destroy(ctx);
    sph_comm_destroy(comm);
    sph_ctx_destroy(d.io);
    if (tpc != MPI_COMM_NULL) MPI_Comm_free(&tpc);
    if (shard_comm != MPI_COMM_NULL) MPI_Comm_free(&shard_comm);
    if (we_init) MPI_Finalize();
    return rc;
}

#endif /* SPH_HAVE_MPI */
