/*
 * cmd_run.c - `spanhead run`: forward + backward of the LM head on synthetic inputs (seeded;
 * by default a packed RL batch of prompts and responses) or on .npy inputs, on the CPU or a
 * CUDA device (all buffers through sph_ctx_malloc / sph_ctx_memcpy, so one code path drives
 * both). Prints a table: rows, active rows, forward and backward latency, achieved GFLOP/s,
 * the ratio to the active floor (8 N_active H V_loc flops, 6 in one-pass mode, at the sgemm
 * rate measured in this run), and the workspace (the only extra memory the library uses).
 * --check recomputes everything with the float64 reference and exits 1 when a relative
 * error exceeds the tolerance. --outputs writes .npy files.
 *
 * Uses the public header only, plus cblas to measure this machine's sgemm rate.
 */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cmd_run_dist.h"
#include "npy.h"
#include "synth.h"

#define CMD "run"

typedef struct opts {
    const char *device, *dtype, *mask, *kernel, *inputs, *outputs;
    int64_t N, H, V, V_total, v0, K, threads, repeats, gap;
    double active, softcap, temperature;
    uint64_t seed;
    int entropy, one_pass, check, shape_given, quiet;
} opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: spanhead run [options]\n"
            "Forward + backward of the LM head (logprob, entropy, lse, logit_mean; dhidden,\n"
            "dweight). Default: a packed RL batch of prompts and responses with an entropy\n"
            "bonus (N=1024 H=256 V=4096), small enough to --check in seconds.\n"
            "\n"
            "  --device cpu|cuda       where to compute (default cpu)\n"
            "  --N --H --V ROWS        shape: tokens, hidden, local vocab rows (V_loc)\n"
            "  --vocab-total V         full vocabulary (default V_loc); --vocab-start v0\n"
            "  --dtype f32|bf16|f16    input dtype (default f32); gradients are written in f32\n"
            "  --mask response|random|fragmented|all|none   active rows (default: response\n"
            "                          without shape flags, else all); --active FRAC for\n"
            "                          random/fragmented (default 0.5)\n"
            "  --entropy               also compute entropy and backpropagate an entropy bonus\n"
            "  --softcap C             tanh logit cap (0 = off); --temperature T (default 1)\n"
            "  --one-pass              gradients from the forward sweep (no recompute)\n"
            "  --support K             sample-support mode with K candidates per row\n"
            "  --seed S  --threads N  --repeats R (timed runs, median; default 3)\n"
            "  --kernel ref|generic|avx2|avx512   force a CPU kernel set\n"
            "  --check                 compare with the float64 reference; exit 1 if off\n"
            "  --inputs DIR            read hidden.npy weight.npy targets.npy and optional\n"
            "                          mask.npy dlogprob.npy dentropy.npy dlse.npy\n"
            "                          dlogit_mean.npy candidates.npy (bf16 data: uint16 .npy\n"
            "                          plus --dtype bf16)\n"
            "  --outputs DIR           write logprob entropy lse logit_mean dhidden dweight .npy\n");
}


/* ---- host-side problem ------------------------------------------------------------------ */

typedef struct problem {
    int64_t N, H, V, V_total, v0, K, n_act;
    int bits, is_bf16; /* input dtype */
    void *h, *w;       /* host (N, H), (V, H) */
    int64_t *tgt, *cand;
    uint8_t *mask;     /* NULL = all active */
    int64_t *spans, n_spans;
    float *g, *e, *gl, *gm; /* upstream, each optional */
    int64_t n_seq;
} problem;

static void problem_free(problem *p) {
    free(p->h), free(p->w), free(p->tgt), free(p->cand), free(p->mask), free(p->spans);
    free(p->g), free(p->e), free(p->gl), free(p->gm);
}

static int parse_dtype(const char *s, int *bits, int *is_bf16) {
    if (!strcmp(s, "f32")) *bits = 32, *is_bf16 = 0;
    else if (!strcmp(s, "bf16")) *bits = 16, *is_bf16 = 1;
    else if (!strcmp(s, "f16")) *bits = 16, *is_bf16 = 0;
    else return -1;
    return 0;
}

static int synth_problem(const opts *o, problem *p) {
    synth_rng r;
    synth_seed(&r, o->seed);
    p->N = o->N, p->H = o->H, p->V = o->V;
    p->V_total = o->V_total ? o->V_total : o->V;
    p->v0 = o->v0, p->K = o->K;
    size_t es = (size_t)p->bits / 8;
    p->h = malloc((size_t)(p->N * p->H) * es + 1);
    p->w = malloc((size_t)(p->V * p->H) * es + 1);
    p->tgt = malloc((size_t)p->N * 8 + 1);
    p->mask = malloc((size_t)p->N + 1);
    p->g = malloc((size_t)p->N * 4 + 1);
    if (!p->h || !p->w || !p->tgt || !p->mask || !p->g)
        return sph_cli_fail(CMD, 1, "out of memory for N=%lld H=%lld V=%lld", (long long)p->N,
                            (long long)p->H, (long long)p->V);
    synth_fill(p->h, p->N * p->H, 1.0, p->bits, p->is_bf16, &r);
    synth_fill(p->w, p->V * p->H, 2.5 / sqrt((double)p->H), p->bits, p->is_bf16, &r);
    if (synth_mask(o->mask, p->N, o->active, &r, p->mask, &p->n_seq))
        return sph_cli_fail(CMD, 2, "--mask: '%s' is not response, random, fragmented, all or none",
                            o->mask);
    /* targets inside this shard half of the time when sharded, like a real TP rank */
    for (int64_t i = 0; i < p->N; i++) {
        p->tgt[i] = synth_range(&r, 0, p->V_total - 1);
        if (p->V_total > p->V && synth_uniform(&r) < 0.5) p->tgt[i] = p->v0 + synth_range(&r, 0, p->V - 1);
        p->g[i] = (float)synth_normal(&r); /* RL advantages */
    }
    if (p->K) {
        p->cand = malloc((size_t)(p->N * p->K) * 8 + 1);
        if (!p->cand) return sph_cli_fail(CMD, 1, "out of memory for candidates");
        for (int64_t i = 0; i < p->N; i++) {
            int64_t *c = p->cand + i * p->K, n = 0;
            c[n++] = p->tgt[i];
            while (n < p->K) {
                int64_t id = synth_range(&r, 0, p->V_total - 1), dup = 0;
                for (int64_t q = 0; q < n; q++) dup |= c[q] == id;
                if (!dup) c[n++] = id;
            }
            for (int64_t q = p->K - 1; q > 0; q--) { /* shuffle so the target moves */
                int64_t s = synth_range(&r, 0, q), t = c[q];
                c[q] = c[s], c[s] = t;
            }
        }
    }
    if (o->entropy) {
        p->e = malloc((size_t)p->N * 4 + 1);
        if (!p->e) return sph_cli_fail(CMD, 1, "out of memory");
        for (int64_t i = 0; i < p->N; i++) p->e[i] = (float)(-0.01 * (1 + synth_uniform(&r)));
    }
    if (!strcmp(o->mask, "all")) free(p->mask), p->mask = NULL;
    return 0;
}

/* Reads DIR/name.npy when present: 1 read, 0 absent, -1 error (message printed). */
static int read_opt(const char *dir, const char *name, npy_array *a) {
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    if (npy_read(path, a, err, sizeof err)) {
        sph_cli_fail(CMD, 1, "%s", err);
        return -1;
    }
    return 1;
}

static int expect_shape(const char *name, const npy_array *a, int ndim, const int64_t *shape) {
    int ok = a->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = a->shape[d] == shape[d];
    if (ok) return 0;
    char got[128] = "", want[128] = "";
    for (int d = 0; d < a->ndim; d++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? "," : "",
                 (long long)a->shape[d]);
    for (int d = 0; d < ndim; d++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? "," : "",
                 (long long)shape[d]);
    return sph_cli_fail(CMD, 1, "%s.npy: shape (%s), expected (%s)", name, got, want);
}

/* Moves an f4 [N] vector out of a into *dst. */
static int take_f32(const char *name, npy_array *a, int64_t N, float **dst) {
    if (a->kind != 'f' || a->bytes != 4)
        return sph_cli_fail(CMD, 1, "%s.npy: dtype %s, expected <f4", name, npy_descr(a));
    if (expect_shape(name, a, 1, &N)) return 1;
    *dst = a->data;
    a->data = NULL;
    return 0;
}

static int load_ids(const char *name, npy_array *a, int64_t **dst) {
    if (a->kind != 'i' && !(a->kind == 'u' && a->bytes == 1))
        return sph_cli_fail(CMD, 1, "%s.npy: dtype %s, expected <i4 or <i8", name, npy_descr(a));
    int64_t *v = malloc((size_t)a->count * 8 + 1);
    if (!v) return sph_cli_fail(CMD, 1, "out of memory");
    for (int64_t k = 0; k < a->count; k++)
        v[k] = a->bytes == 8 ? ((int64_t *)a->data)[k]
                             : (a->bytes == 4 ? ((int32_t *)a->data)[k] : ((uint8_t *)a->data)[k]);
    *dst = v;
    return 0;
}

static int npy_problem(const opts *o, int dtype_given, problem *p) {
    npy_array hid = {0}, wt = {0}, tg = {0}, a = {0};
    int rc = 1;
    const char *dir = o->inputs;
    if (read_opt(dir, "hidden", &hid) != 1 || read_opt(dir, "weight", &wt) != 1 ||
        read_opt(dir, "targets", &tg) != 1) {
        if (!hid.data || !wt.data || !tg.data)
            sph_cli_fail(CMD, 1, "--inputs %s: hidden.npy, weight.npy and targets.npy are required",
                         dir);
        goto done;
    }
    if (hid.ndim != 2 || wt.ndim != 2) {
        sph_cli_fail(CMD, 1, "hidden.npy and weight.npy must be 2-d (got %d-d and %d-d)", hid.ndim,
                     wt.ndim);
        goto done;
    }
    /* dtype: f4 -> f32, f2 -> f16, u2 -> bf16 or f16 as --dtype says */
    if (hid.kind == 'f' && hid.bytes == 4) {
        p->bits = 32, p->is_bf16 = 0;
    } else if (hid.kind == 'f' && hid.bytes == 2) {
        p->bits = 16, p->is_bf16 = 0;
    } else if (hid.kind == 'u' && hid.bytes == 2) {
        if (!dtype_given || p->bits != 16) {
            rc = sph_cli_fail(CMD, 2, "hidden.npy holds uint16: say what it is with --dtype "
                                      "bf16|f16");
            goto done;
        }
    } else {
        sph_cli_fail(CMD, 1, "hidden.npy: dtype %s, expected <f4, <f2 or <u2 (bf16 bits)",
                     npy_descr(&hid));
        goto done;
    }
    if (wt.kind != hid.kind || wt.bytes != hid.bytes) {
        sph_cli_fail(CMD, 1, "weight.npy: dtype %s differs from hidden.npy's", npy_descr(&wt));
        goto done;
    }
    p->N = hid.shape[0], p->H = hid.shape[1], p->V = wt.shape[0];
    p->V_total = o->V_total ? o->V_total : p->V;
    p->v0 = o->v0;
    int64_t wsh[2] = {p->V, p->H}, n1 = p->N;
    if (expect_shape("weight", &wt, 2, wsh) || expect_shape("targets", &tg, 1, &n1)) goto done;
    p->h = hid.data, hid.data = NULL;
    p->w = wt.data, wt.data = NULL;
    if (load_ids("targets", &tg, &p->tgt)) goto done;
    int r;
    if ((r = read_opt(dir, "mask", &a)) < 0) goto done;
    if (r) {
        if (a.bytes != 1 || expect_shape("mask", &a, 1, &n1)) {
            if (a.bytes != 1) sph_cli_fail(CMD, 1, "mask.npy: dtype %s, expected |u1 or |b1",
                                           npy_descr(&a));
            goto done;
        }
        p->mask = a.data, a.data = NULL;
    }
    npy_free(&a);
    const char *ups[4] = {"dlogprob", "dentropy", "dlse", "dlogit_mean"};
    float **dst[4] = {&p->g, &p->e, &p->gl, &p->gm};
    for (int k = 0; k < 4; k++) {
        if ((r = read_opt(dir, ups[k], &a)) < 0) goto done;
        if (r && take_f32(ups[k], &a, p->N, dst[k])) goto done;
        npy_free(&a);
    }
    if ((r = read_opt(dir, "candidates", &a)) < 0) goto done;
    if (r) {
        if (a.ndim != 2 || a.shape[0] != p->N) {
            sph_cli_fail(CMD, 1, "candidates.npy: expected shape (%lld, K)", (long long)p->N);
            goto done;
        }
        p->K = a.shape[1];
        if (load_ids("candidates", &a, &p->cand)) goto done;
    }
    rc = 0;
done:
    npy_free(&hid), npy_free(&wt), npy_free(&tg), npy_free(&a);
    return rc;
}

/* ---- device run --------------------------------------------------------------------------- */

enum { T_H, T_W, T_TGT, T_CAND, T_MASK, T_LP, T_ENT, T_LSE, T_LM, T_ST, T_G, T_E, T_GL, T_GM,
       T_DH, T_DW, T_COUNT };

typedef struct devrun {
    sph_ctx_t ctx;
    void *buf[T_COUNT];
    size_t bytes[T_COUNT];
    int64_t shape[T_COUNT][2];
    sph_tensor t[T_COUNT];
    sph_head_args a;
    void *ws;
    size_t ws_bytes[2];
    int one_pass;
} devrun;

static sph_status dev_put(devrun *d, int k, const void *host, size_t bytes, int ndim,
                          int64_t n0, int64_t n1, sph_dtype dt, sph_device dev) {
    d->bytes[k] = bytes;
    sph_status s = sph_ctx_malloc(d->ctx, bytes ? bytes : 1, &d->buf[k]);
    if (s) return s;
    if (host) s = sph_ctx_memcpy(d->ctx, d->buf[k], host, bytes);
    else s = sph_ctx_memset(d->ctx, d->buf[k], 0, bytes);
    d->shape[k][0] = n0, d->shape[k][1] = n1;
    d->t[k] = (sph_tensor){d->buf[k], dev, ndim, dt, d->shape[k], NULL, 0};
    return s;
}

static void dev_free(devrun *d) {
    for (int k = 0; k < T_COUNT; k++) sph_ctx_free(d->ctx, d->buf[k]);
    sph_ctx_free(d->ctx, d->ws);
    sph_ctx_destroy(d->ctx);
    memset(d, 0, sizeof *d);
}

/* Sets up a context and device copies of the problem. want_*: which outputs to request. */
static sph_status dev_setup(devrun *d, const problem *p, const opts *o, int on_cuda,
                            const char *kernel, int threads) {
    memset(d, 0, sizeof *d);
    sph_ctx_opts co = SPH_CTX_OPTS_INIT;
    co.device.type = on_cuda ? SPH_DEVICE_CUDA : SPH_DEVICE_CPU;
    co.num_threads = threads;
    co.force_kernel = kernel;
    sph_status s = sph_ctx_create(&d->ctx, &co);
    if (s) return s;
    sph_device dev = co.device;
    const int64_t N = p->N, H = p->H, V = p->V;
    sph_dtype in = p->bits == 32 ? SPH_F32 : (p->is_bf16 ? SPH_BF16 : SPH_F16);
    size_t es = (size_t)p->bits / 8;
#define PUT(k, host, bytes, nd, n0, n1, dt)                                                     \
    do {                                                                                     \
        if ((s = dev_put(d, k, host, bytes, nd, n0, n1, dt, dev))) return s;                  \
    } while (0)
    PUT(T_H, p->h, (size_t)(N * H) * es, 2, N, H, in);
    PUT(T_W, p->w, (size_t)(V * H) * es, 2, V, H, in);
    PUT(T_TGT, p->tgt, (size_t)N * 8, 1, N, 0, SPH_I64);
    if (p->cand) PUT(T_CAND, p->cand, (size_t)(N * p->K) * 8, 2, N, p->K, SPH_I64);
    if (p->mask) PUT(T_MASK, p->mask, (size_t)N, 1, N, 0, SPH_U8);
    PUT(T_LP, NULL, (size_t)N * 4, 1, N, 0, SPH_F32);
    PUT(T_ENT, NULL, (size_t)N * 4, 1, N, 0, SPH_F32);
    PUT(T_LSE, NULL, (size_t)N * 4, 1, N, 0, SPH_F32);
    PUT(T_LM, NULL, (size_t)N * 4, 1, N, 0, SPH_F32);
    PUT(T_ST, NULL, (size_t)N * 12, 2, N, 3, SPH_F32);
    if (p->g) PUT(T_G, p->g, (size_t)N * 4, 1, N, 0, SPH_F32);
    if (p->e) PUT(T_E, p->e, (size_t)N * 4, 1, N, 0, SPH_F32);
    if (p->gl) PUT(T_GL, p->gl, (size_t)N * 4, 1, N, 0, SPH_F32);
    if (p->gm) PUT(T_GM, p->gm, (size_t)N * 4, 1, N, 0, SPH_F32);
    PUT(T_DH, NULL, (size_t)(N * H) * 4, 2, N, H, SPH_F32);
    PUT(T_DW, NULL, (size_t)(V * H) * 4, 2, V, H, SPH_F32);
#undef PUT
    sph_head_args a = SPH_HEAD_ARGS_INIT;
    a.hidden = &d->t[T_H], a.weight = &d->t[T_W], a.targets = &d->t[T_TGT];
    a.candidates = p->cand ? &d->t[T_CAND] : NULL;
    a.vocab_start = p->v0, a.vocab_total = p->V_total;
    a.temperature = o->temperature, a.softcap = o->softcap;
    a.active_mask = p->mask ? &d->t[T_MASK] : NULL;
    a.spans = p->spans, a.n_spans = p->n_spans;
    a.logprob = &d->t[T_LP];
    a.entropy = (o->entropy || p->e) ? &d->t[T_ENT] : NULL;
    a.lse = &d->t[T_LSE];
    a.logit_mean = p->K ? NULL : &d->t[T_LM];
    a.stats = &d->t[T_ST];
    a.dlogprob = p->g ? &d->t[T_G] : NULL;
    a.dentropy = p->e ? &d->t[T_E] : NULL;
    a.dlse = p->gl ? &d->t[T_GL] : NULL;
    a.dlogit_mean = p->gm && !p->K ? &d->t[T_GM] : NULL;
    a.dhidden = &d->t[T_DH], a.dweight = &d->t[T_DW];
    d->a = a;
    d->one_pass = o->one_pass;
    /* workspace: the larger of the two passes, allocated once */
    sph_head_args fa = a;
    if (!d->one_pass) fa.dhidden = fa.dweight = NULL;
    if ((s = sph_head_workspace_size(d->ctx, SPH_HEAD_FORWARD, &fa, &d->ws_bytes[0]))) return s;
    if (!d->one_pass &&
        (s = sph_head_workspace_size(d->ctx, SPH_HEAD_BACKWARD, &a, &d->ws_bytes[1])))
        return s;
    size_t wb = d->ws_bytes[0] > d->ws_bytes[1] ? d->ws_bytes[0] : d->ws_bytes[1];
    return sph_ctx_malloc(d->ctx, wb ? wb : 1, &d->ws);
}

/* One forward (+ backward); times in seconds. */
static sph_status dev_pass(devrun *d, double *t_fwd, double *t_bwd) {
    sph_head_args fa = d->a;
    if (!d->one_pass) fa.dhidden = fa.dweight = NULL;
    size_t wb = d->ws_bytes[0] > d->ws_bytes[1] ? d->ws_bytes[0] : d->ws_bytes[1];
    double t0 = sph_cli_now_s();
    sph_status s = sph_head_forward(d->ctx, &fa, d->ws, wb);
    if (!s) s = sph_ctx_synchronize(d->ctx);
    double t1 = sph_cli_now_s();
    if (!s && !d->one_pass) s = sph_head_backward(d->ctx, &d->a, d->ws, wb);
    if (!s) s = sph_ctx_synchronize(d->ctx);
    double t2 = sph_cli_now_s();
    *t_fwd = t1 - t0, *t_bwd = t2 - t1;
    return s;
}

static float *dev_get(devrun *d, int k) {
    float *h = malloc(d->bytes[k] + 1);
    if (h && sph_ctx_memcpy(d->ctx, h, d->buf[k], d->bytes[k]) != SPH_OK) {
        free(h);
        return NULL;
    }
    return h;
}

/* ---- sgemm rate ------------------------------------------------------------------------- */

/* This machine's fp32 GEMM rate (flop/s) on an (m x H) x (H x n) product, best of 3. */
static double sgemm_rate(int64_t H, int64_t N, int64_t V) {
    int m = (int)(N < 1024 ? (N < 64 ? 64 : N) : 1024), n = (int)(V < 4096 ? (V < 64 ? 64 : V) : 4096);
    int k = (int)H;
    float *a = malloc((size_t)m * k * 4), *b = malloc((size_t)n * k * 4), *c = malloc((size_t)m * n * 4);
    double best = 0;
    if (a && b && c) {
        for (size_t i = 0; i < (size_t)m * k; i++) a[i] = (float)(i % 13) * 1e-2f;
        for (size_t i = 0; i < (size_t)n * k; i++) b[i] = (float)(i % 7) * 1e-2f;
        for (int rep = 0; rep < 4; rep++) {
            double t0 = sph_cli_now_s();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, 0.0f, c,
                        n);
            double dt = sph_cli_now_s() - t0, r = 2.0 * m * n * (double)k / dt;
            if (rep > 0 && r > best) best = r; /* rep 0 warms up the threads */
        }
    }
    free(a), free(b), free(c);
    return best;
}

/* ---- check and outputs -------------------------------------------------------------------- */

/* max |got - ref| / max |ref| (normwise), NaN -> inf. */
static double rel_err(const float *got, const float *ref, int64_t n) {
    double md = 0, mr = 0;
    for (int64_t k = 0; k < n; k++) {
        double dd = fabs((double)got[k] - (double)ref[k]);
        if (isnan(dd)) return INFINITY;
        if (dd > md) md = dd;
        if (fabs((double)ref[k]) > mr) mr = fabs((double)ref[k]);
    }
    return md / (mr > 0 ? mr : 1.0);
}

static int write_out(const char *dir, const char *name, const float *x, int ndim, int64_t n0,
                     int64_t n1) {
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    int64_t sh[2] = {n0, n1};
    if (npy_write(path, 'f', 4, ndim, sh, x, err, sizeof err))
        return sph_cli_fail(CMD, 1, "%s", err);
    return 0;
}

/* ---- main --------------------------------------------------------------------------------- */

static int need(int argc, char **argv, int *i, const char **val) {
    const char *arg = argv[*i], *eq = strchr(arg, '=');
    if (eq) {
        *val = eq + 1;
        return 0;
    }
    if (*i + 1 >= argc) return sph_cli_fail(CMD, 2, "%s needs a value", arg);
    *val = argv[++*i];
    return 0;
}

static int to_i64(const char *name, const char *v, int64_t lo, int64_t *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo)
        return sph_cli_fail(CMD, 2, "%s: '%s' is not an integer >= %lld", name, v, (long long)lo);
    *out = x;
    return 0;
}

static int to_f64(const char *name, const char *v, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x))
        return sph_cli_fail(CMD, 2, "%s: '%s' is not a finite number", name, v);
    *out = x;
    return 0;
}

static int opt_is(const char *arg, const char *name) {
    size_t n = strlen(name);
    return !strncmp(arg, name, n) && (arg[n] == 0 || arg[n] == '=');
}

/* OpenMP workers that spin while the master runs serial code take half of an SMT core from
 * it (and from OpenBLAS); on this project's 2-vCPU machines that cost 2-4x on small shapes.
 * Unless the user chose a policy, re-run ourselves once with OMP_WAIT_POLICY=passive (libgomp
 * reads it at load time, so setting it now would be too late). */
static void prefer_passive_wait(int argc, char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("SPH_NO_REEXEC")) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 0) || setenv("SPH_NO_REEXEC", "1", 1)) return;
    char **nargv = calloc((size_t)argc + 2, sizeof *nargv);
    if (!nargv) return;
    nargv[0] = "/proc/self/exe";
    nargv[1] = "run";
    for (int i = 1; i < argc; i++) nargv[i + 1] = argv[i];
    fflush(stdout);
    execv("/proc/self/exe", nargv); /* returns only on failure: carry on as we are */
    free(nargv);
}

int sph_cli_run(int argc, char **argv) {
    if (sph_cli_run_wants_dist(argc, argv)) return sph_cli_run_dist(argc, argv);
    prefer_passive_wait(argc, argv);
    opts o = {.device = "cpu", .dtype = "f32", .mask = NULL, .N = 0, .H = 0, .V = 0,
              .repeats = 3, .gap = 128, .active = 0.5, .temperature = 1.0, .seed = 1};
    int dtype_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int64_t x = 0;
#define NEED() \
    if (need(argc, argv, &i, &v)) return 2
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (opt_is(a, "--device")) {
            NEED();
            o.device = v;
        } else if (opt_is(a, "--N") || opt_is(a, "--H") || opt_is(a, "--V")) {
            NEED();
            if (to_i64(a, v, 1, &x)) return 2;
            if (a[2] == 'N') o.N = x;
            else if (a[2] == 'H') o.H = x;
            else o.V = x;
            o.shape_given = 1;
        } else if (opt_is(a, "--vocab-total")) {
            NEED();
            if (to_i64(a, v, 1, &o.V_total)) return 2;
        } else if (opt_is(a, "--vocab-start")) {
            NEED();
            if (to_i64(a, v, 0, &o.v0)) return 2;
        } else if (opt_is(a, "--dtype")) {
            NEED();
            o.dtype = v, dtype_given = 1;
        } else if (opt_is(a, "--active")) {
            NEED();
            if (to_f64(a, v, &o.active)) return 2;
            if (o.active < 0 || o.active > 1)
                return sph_cli_fail(CMD, 2, "--active: %g, expected a fraction in [0, 1]", o.active);
        } else if (opt_is(a, "--mask")) {
            NEED();
            o.mask = v;
        } else if (!strcmp(a, "--entropy")) {
            o.entropy = 1;
        } else if (opt_is(a, "--softcap")) {
            NEED();
            if (to_f64(a, v, &o.softcap)) return 2;
        } else if (opt_is(a, "--temperature")) {
            NEED();
            if (to_f64(a, v, &o.temperature)) return 2;
        } else if (!strcmp(a, "--one-pass")) {
            o.one_pass = 1;
        } else if (opt_is(a, "--support")) {
            NEED();
            if (to_i64(a, v, 1, &o.K)) return 2;
        } else if (opt_is(a, "--seed")) {
            NEED();
            if (to_i64(a, v, 0, &x)) return 2;
            o.seed = (uint64_t)x;
        } else if (opt_is(a, "--threads")) {
            NEED();
            if (to_i64(a, v, 0, &o.threads)) return 2;
        } else if (opt_is(a, "--repeats")) {
            NEED();
            if (to_i64(a, v, 1, &o.repeats)) return 2;
        } else if (opt_is(a, "--kernel")) {
            NEED();
            o.kernel = v;
        } else if (!strcmp(a, "--check")) {
            o.check = 1;
        } else if (opt_is(a, "--inputs")) {
            NEED();
            o.inputs = v;
        } else if (opt_is(a, "--outputs")) {
            NEED();
            o.outputs = v;
        } else {
            usage(stderr);
            return sph_cli_fail(CMD, 2, "unknown option '%s'", a);
        }
#undef NEED
    }
    int on_cuda = !strcmp(o.device, "cuda");
    if (!on_cuda && strcmp(o.device, "cpu"))
        return sph_cli_fail(CMD, 2, "--device: '%s', expected cpu or cuda", o.device);
    problem p = {0};
    if (parse_dtype(o.dtype, &p.bits, &p.is_bf16))
        return sph_cli_fail(CMD, 2, "--dtype: '%s', expected f32, bf16 or f16", o.dtype);
    if (o.inputs && o.shape_given)
        return sph_cli_fail(CMD, 2, "--inputs takes its shapes from the files: drop --N/--H/--V");
    int default_batch = !o.inputs && !o.shape_given;
    if (default_batch) o.N = 1024, o.H = 256, o.V = 4096, o.entropy = 1; /* RL: entropy bonus */
    if (!o.inputs && (!o.N || !o.H || !o.V))
        return sph_cli_fail(CMD, 2, "--N, --H and --V go together (or none: the default batch)");
    if (!o.mask) o.mask = default_batch ? "response" : "all";
    int rc = 1;
    if (o.inputs) {
        if ((rc = npy_problem(&o, dtype_given, &p)) != 0) goto out;
    } else if ((rc = synth_problem(&o, &p)) != 0) {
        goto out;
    }
    rc = 1;
    p.n_act = p.N;
    if (p.mask) {
        p.spans = malloc((size_t)((p.N + 1) / 2 + 1) * 2 * sizeof(int64_t));
        if (!p.spans) {
            sph_cli_fail(CMD, 1, "out of memory");
            goto out;
        }
        sph_status ss = sph_spans_from_mask(p.mask, p.N, o.gap, p.spans, &p.n_spans);
        if (ss) {
            sph_cli_fail(CMD, 1, "spans: %s", sph_last_error());
            goto out;
        }
        p.n_act = 0;
        for (int64_t i = 0; i < p.N; i++) p.n_act += p.mask[i] != 0;
    }

    devrun d;
    sph_status s = dev_setup(&d, &p, &o, on_cuda, o.kernel, (int)o.threads);
    if (s) {
        sph_cli_fail(CMD, 1, "%s: %s", sph_status_str(s), sph_last_error());
        dev_free(&d);
        goto out;
    }
    const char *dt = p.bits == 32 ? "f32" : (p.is_bf16 ? "bf16" : "f16");
    printf("spanhead run: %s | %s\n", sph_ctx_describe(d.ctx),
           o.inputs ? o.inputs : (default_batch ? "default packed RL batch" : "synthetic"));
    printf("  N=%lld H=%lld V_loc=%lld vocab=[%lld, %lld) of %lld dtype=%s mask=%s T=%g "
           "softcap=%g%s%s\n",
           (long long)p.N, (long long)p.H, (long long)p.V, (long long)p.v0,
           (long long)(p.v0 + p.V), (long long)p.V_total, dt,
           o.inputs ? (p.mask ? "mask.npy" : "all") : o.mask, o.temperature, o.softcap,
           p.K ? " support-K" : "", o.one_pass ? " one-pass" : "");
    if (p.n_seq) printf("  packed sequences: %lld, spans: %lld\n", (long long)p.n_seq, (long long)p.n_spans);
    double tf[64], tb[64];
    int reps = (int)(o.repeats < 64 ? o.repeats : 64);
    for (int k = -1; k < reps && s == SPH_OK; k++) { /* k = -1: warm-up */
        double a_, b_;
        s = dev_pass(&d, &a_, &b_);
        if (k >= 0) tf[k] = a_, tb[k] = b_;
    }
    if (s) {
        sph_cli_fail(CMD, 1, "%s: %s", sph_status_str(s), sph_last_error());
        dev_free(&d);
        goto out;
    }
    qsort(tf, (size_t)reps, sizeof(double), sph_cli_cmp_double);
    qsort(tb, (size_t)reps, sizeof(double), sph_cli_cmp_double);
    double fwd = tf[reps / 2], bwd = tb[reps / 2];
    const double Hd = (double)p.H, Vd = (double)p.V, Na = (double)p.n_act;
    double work = p.K ? (o.one_pass ? 6.0 : 8.0) * Na * Hd * (double)p.K
                      : (o.one_pass ? 6.0 : 8.0) * Na * Hd * Vd;
    double rate = on_cuda ? 0 : sgemm_rate(p.H, p.N, p.V);
    double floor_s = rate > 0 ? work / rate : 0;
    size_t wsb = d.ws_bytes[0] > d.ws_bytes[1] ? d.ws_bytes[0] : d.ws_bytes[1];
    printf("\n  %8s %8s %10s %10s %10s %12s %12s %14s\n", "rows", "active", "fwd ms", "bwd ms",
           "GFLOP/s", "floor ms", "x floor", "workspace");
    char fl[32] = "-", ra[32] = "-";
    if (floor_s > 0) {
        snprintf(fl, sizeof fl, "%.2f", floor_s * 1e3);
        snprintf(ra, sizeof ra, "%.2f", (fwd + bwd) / floor_s);
    }
    printf("  %8lld %8lld %10.2f %10.2f %10.1f %12s %12s %11.1f MB\n", (long long)p.N,
           (long long)p.n_act, fwd * 1e3, bwd * 1e3, work / (fwd + bwd) / 1e9, fl, ra,
           (double)wsb / (1 << 20));
    if (rate > 0)
        printf("  floor = %s N_active H V_loc flops at this machine's sgemm rate %.1f GFLOP/s "
               "(measured now)%s\n",
               o.one_pass ? "6" : "8", rate / 1e9, o.one_pass ? "; one-pass" : "");
    printf("  median of %d timed runs after a warm-up; dense logits would be %.1f MB\n", reps,
           (double)p.N * (double)p.V * 4.0 / (1 << 20));

    float *out[6] = {dev_get(&d, T_LP), dev_get(&d, T_ENT), dev_get(&d, T_LSE),
                     dev_get(&d, T_LM), dev_get(&d, T_DH),  dev_get(&d, T_DW)};
    const char *names[6] = {"logprob", "entropy", "lse", "logit_mean", "dhidden", "dweight"};
    const int have[6] = {1, d.a.entropy != NULL, 1, d.a.logit_mean != NULL, 1, 1};
    const int64_t cnt[6] = {p.N, p.N, p.N, p.N, p.N * p.H, p.V * p.H};
    for (int k = 0; k < 6; k++)
        if (!out[k]) {
            sph_cli_fail(CMD, 1, "copying %s back: %s", names[k], sph_last_error());
            goto free_out;
        }
    rc = 0;
    if (o.outputs) {
        if (mkdir(o.outputs, 0777) != 0 && errno != EEXIST) {
            rc = sph_cli_fail(CMD, 1, "--outputs %s: %s", o.outputs, strerror(errno));
            goto free_out;
        }
        for (int k = 0; k < 6 && !rc; k++)
            if (have[k])
                rc = write_out(o.outputs, names[k], out[k], k < 4 ? 1 : 2, k < 4 ? p.N : (k == 4 ? p.N : p.V),
                               p.H);
        if (!rc) printf("  outputs written to %s\n", o.outputs);
    }
    if (o.check && !rc) {
        devrun ref;
        double t0 = sph_cli_now_s(), a_, b_;
        s = dev_setup(&ref, &p, &o, 0, "ref", 1);
        if (!s) s = dev_pass(&ref, &a_, &b_);
        if (s) {
            rc = sph_cli_fail(CMD, 1, "reference: %s: %s", sph_status_str(s), sph_last_error());
            dev_free(&ref);
            goto free_out;
        }
        /* f32: well under 1e-4 everywhere. Half inputs on the GPU round dlogits to the input
         * dtype before the tensor-core products (2^-9 relative for bf16), so their budget is
         * the 1e-2 of bf16 arithmetic; on the CPU half inputs are widened once and everything
         * after runs in f32. */
        const double tol = p.bits == 32 ? 1e-4 : (on_cuda ? 1e-2 : 1e-4);
        printf("\n  check against the float64 reference (%.1f s), normwise max|got - ref| / "
               "max|ref|, tolerance %.0e:\n",
               sph_cli_now_s() - t0, tol);
        int ok = 1;
        for (int k = 0; k < 6; k++) {
            if (!have[k]) continue;
            float *r = dev_get(&ref, k == 0 ? T_LP : k == 1 ? T_ENT : k == 2 ? T_LSE : k == 3 ? T_LM
                                                         : k == 4 ? T_DH : T_DW);
            double e = r ? rel_err(out[k], r, cnt[k]) : INFINITY;
            int pass = e <= tol;
            ok &= pass;
            printf("    %-11s %10.2e  %s\n", names[k], e, pass ? "ok" : "OUT OF TOLERANCE");
            free(r);
        }
        dev_free(&ref);
        if (!ok) rc = sph_cli_fail(CMD, 1, "check failed: results differ from the reference");
        else printf("  check passed\n");
    }
free_out:
    for (int k = 0; k < 6; k++) free(out[k]);
    dev_free(&d);
out:
    problem_free(&p);
    return rc;
}
