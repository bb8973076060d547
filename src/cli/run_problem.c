/*
 * run_problem.c - the host problem of `spanhead run`: a seeded synthetic batch (by default a
 * packed RL batch of prompts and responses with RL advantages as dlogprob and an entropy
 * bonus) or the .npy files of --inputs DIR. Before anything is allocated the sizes are checked
 * (every product of N, H, V, K fits int64 and the host memory the run needs fits this machine),
 * and before anything is computed the float inputs are checked for NaN and inf.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "clock.h"
#include "half.h"
#include "msg.h"
#include "npy.h"
#include "num.h"
#include "rng.h"
#include "run.h"
#include "synth.h"

void run_problem_free(run_problem *p) {
    free(p->h), free(p->w), free(p->tgt), free(p->cand), free(p->mask), free(p->spans);
    free(p->g), free(p->e), free(p->gl), free(p->gm), free(p->temp);
    memset(p, 0, sizeof *p);
}

/* Every size the run derives from N, H, V, K: 0, or 1 after a message naming the options.
 * what: "--N %lld --H %lld" style prefix of the message (the options or the files). */
static int check_sizes(const run_problem *p, const char *what, int check) {
    int64_t nh, vh, nk = 0, t;
    const size_t es = (size_t)p->bits / 8;
    if (sph_cli_mul(p->N, p->H, &nh))
        return sph_cli_fail(RUN_CMD, 1, "%s: N*H = %lld x %lld overflows int64", what,
                            (long long)p->N, (long long)p->H);
    if (sph_cli_mul(p->V, p->H, &vh))
        return sph_cli_fail(RUN_CMD, 1, "%s: V_loc*H = %lld x %lld overflows int64", what,
                            (long long)p->V, (long long)p->H);
    if (p->K && sph_cli_mul(p->N, p->K, &nk))
        return sph_cli_fail(RUN_CMD, 1, "%s: N*K = %lld x %lld overflows int64", what,
                            (long long)p->N, (long long)p->K);
    /* host bytes: inputs (and their device copies), f32 gradients (device and host copies),
     * per-row vectors; the check holds a second set */
    double need = 2.0 * ((double)nh + (double)vh) * (double)es + 4.0 * ((double)nh + (double)vh) +
                  16.0 * (double)nk + 80.0 * (double)p->N;
    if (check) need *= 2;
    int64_t phys = sph_cli_phys_bytes();
    if (sph_cli_mul(nh, 4, &t) || sph_cli_mul(vh, 4, &t) || (double)need > 9e18 ||
        (phys > 0 && need > (double)phys))
        return sph_cli_fail(RUN_CMD, 1, "%s: the run needs about %.3g GiB of host memory, this "
                                        "machine has %.3g GiB",
                            what, need / 1073741824.0, (double)phys / 1073741824.0);
    return 0;
}

/* vocab_start + V_loc <= vocab_total, said without overflowed arithmetic. */
static int check_vocab(const run_problem *p) {
    if (p->V > p->V_total)
        return sph_cli_fail(RUN_CMD, 1, "--vocab-total %lld: smaller than the local vocabulary "
                                        "V_loc = %lld", (long long)p->V_total, (long long)p->V);
    if (p->v0 > p->V_total - p->V)
        return sph_cli_fail(RUN_CMD, 1, "--vocab-start %lld: the shard of V_loc = %lld rows "
                                        "starting there ends past --vocab-total %lld (the "
                                        "largest start is %lld)",
                            (long long)p->v0, (long long)p->V, (long long)p->V_total,
                            (long long)(p->V_total - p->V));
    if (p->K > p->V_total)
        return sph_cli_fail(RUN_CMD, 1, "--support %lld: more candidates than the vocabulary "
                                        "(%lld ids)", (long long)p->K, (long long)p->V_total);
    return 0;
}

/* NaN or inf in a float input: exit 1 naming the file (or the synthetic tensor) and index. */
static int check_finite(const char *name, const void *x, int64_t n, int64_t cols, int bits,
                        int is_bf16) {
    int64_t k = sph_cli_first_nonfinite(x, n, bits, is_bf16);
    if (k < 0) return 0;
    float v = sph_cli_load_float(x, k, bits, is_bf16);
    if (cols > 1)
        return sph_cli_fail(RUN_CMD, 1, "%s: non-finite value %g at [%lld, %lld]: the head needs "
                                        "finite inputs", name, (double)v, (long long)(k / cols),
                            (long long)(k % cols));
    return sph_cli_fail(RUN_CMD, 1, "%s: non-finite value %g at [%lld]: the head needs finite "
                                    "inputs", name, (double)v, (long long)k);
}

// ---- synthetic -------------------------------------------------------------------------------

static int synth_problem(const run_opts *o, run_problem *p) {
    sph_cli_rng r;
    sph_cli_rng_seed(&r, (uint64_t)o->seed);
    p->N = o->N, p->H = o->H, p->V = o->V;
    p->V_total = o->V_total ? o->V_total : o->V;
    p->v0 = o->v0, p->K = o->K;
    char what[160];
    snprintf(what, sizeof what, "--N %lld --H %lld --V %lld%s", (long long)p->N, (long long)p->H,
             (long long)p->V, p->K ? " --support" : "");
    if (check_vocab(p) || check_sizes(p, what, o->check)) return 1;
    const size_t es = (size_t)p->bits / 8;
    p->h = sph_cli_alloc(p->N * p->H, es);
    p->w = sph_cli_alloc(p->V * p->H, es);
    p->tgt = sph_cli_alloc(p->N, 8);
    p->mask = sph_cli_alloc(p->N, 1);
    p->g = sph_cli_alloc(p->N, 4);
    if (!p->h || !p->w || !p->tgt || !p->mask || !p->g)
        return sph_cli_fail(RUN_CMD, 1, "out of memory for N=%lld H=%lld V=%lld", (long long)p->N,
                            (long long)p->H, (long long)p->V);
    synth_fill(p->h, p->N * p->H, 1.0, p->bits, p->is_bf16, &r);
    synth_fill(p->w, p->V * p->H, 2.5 / sqrt((double)p->H), p->bits, p->is_bf16, &r);
    synth_mask(o->mask, p->N, o->active, &r, p->mask, &p->n_seq);
    /* targets inside this shard half of the time when sharded, like a real TP rank */
    for (int64_t i = 0; i < p->N; i++) {
        p->tgt[i] = sph_cli_rng_range(&r, 0, p->V_total - 1);
        if (p->V_total > p->V && sph_cli_rng_uniform(&r) < 0.5)
            p->tgt[i] = p->v0 + sph_cli_rng_range(&r, 0, p->V - 1);
        p->g[i] = (float)sph_cli_rng_normal(&r); /* RL advantages */
    }
    if (p->K) {
        p->cand = sph_cli_alloc(p->N * p->K, 8);
        if (!p->cand) return sph_cli_fail(RUN_CMD, 1, "out of memory for candidates");
        /* K distinct ids per row, the target among them: rejection sampling while K is at
         * most half the vocabulary, else a partial shuffle of all ids (K <= V_total holds) */
        int64_t *all = NULL;
        if (2 * p->K > p->V_total) {
            all = sph_cli_alloc(p->V_total, 8);
            if (!all) return sph_cli_fail(RUN_CMD, 1, "out of memory for candidates");
        }
        for (int64_t i = 0; i < p->N; i++) {
            int64_t *c = p->cand + i * p->K, n = 0;
            c[n++] = p->tgt[i];
            if (all) {
                for (int64_t v = 0; v < p->V_total; v++) all[v] = v;
                all[p->tgt[i]] = 0, all[0] = p->tgt[i]; /* the target first, then the rest */
                for (; n < p->K; n++) {
                    int64_t s = sph_cli_rng_range(&r, n, p->V_total - 1), t = all[n];
                    all[n] = all[s], all[s] = t;
                    c[n] = all[n];
                }
            }
            while (n < p->K) {
                int64_t id = sph_cli_rng_range(&r, 0, p->V_total - 1), dup = 0;
                for (int64_t q = 0; q < n; q++) dup |= c[q] == id;
                if (!dup) c[n++] = id;
            }
            for (int64_t q = p->K - 1; q > 0; q--) { /* shuffle so the target moves */
                int64_t s = sph_cli_rng_range(&r, 0, q), t = c[q];
                c[q] = c[s], c[s] = t;
            }
        }
        free(all);
    }
    if (o->entropy) {
        p->e = sph_cli_alloc(p->N, 4);
        if (!p->e) return sph_cli_fail(RUN_CMD, 1, "out of memory");
        for (int64_t i = 0; i < p->N; i++) p->e[i] = (float)(-0.01 * (1 + sph_cli_rng_uniform(&r)));
    }
    if (o->mask == SYNTH_ALL) free(p->mask), p->mask = NULL;
    p->mask_name = synth_mask_names[o->mask];
    return 0;
}

// ---- .npy inputs -----------------------------------------------------------------------------

/* Reads DIR/name.npy when present: 1 read, 0 absent, -1 error (message printed). */
static int read_opt(const char *dir, const char *name, npy_array *a) {
    char err[512];
    const int r = npy_read_in(dir, name, a, err, sizeof err);
    if (r < 0) sph_cli_fail(RUN_CMD, 1, "%s", err);
    return r;
}

static int expect_shape(const char *name, const npy_array *a, int ndim, const int64_t *shape) {
    int ok = a->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = a->shape[d] == shape[d];
    if (ok) return 0;
    char got[192] = "", want[192] = "";
    for (int d = 0; d < a->ndim; d++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
                 (long long)a->shape[d]);
    for (int d = 0; d < ndim; d++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? ", " : "",
                 (long long)shape[d]);
    return sph_cli_fail(RUN_CMD, 1, "%s.npy: shape (%s), expected (%s)", name, got, want);
}

/* Moves an f4 [N] vector out of a into *dst. */
static int take_f32(const char *name, npy_array *a, int64_t N, float **dst) {
    if (a->kind != 'f' || a->bytes != 4)
        return sph_cli_fail(RUN_CMD, 1, "%s.npy: dtype %s, expected <f4", name, npy_descr(a));
    if (expect_shape(name, a, 1, &N)) return 1;
    char what[64];
    snprintf(what, sizeof what, "%s.npy", name);
    if (check_finite(what, a->data, N, 1, 32, 0)) return 1;
    *dst = a->data;
    a->data = NULL;
    return 0;
}

static int load_ids(const char *name, npy_array *a, int64_t **dst) {
    if (a->kind != 'i' && !(a->kind == 'u' && a->bytes == 1))
        return sph_cli_fail(RUN_CMD, 1, "%s.npy: dtype %s, expected <i4 or <i8", name, npy_descr(a));
    int64_t *v = sph_cli_alloc(a->count, 8);
    if (!v) return sph_cli_fail(RUN_CMD, 1, "%s.npy: out of memory", name);
    for (int64_t k = 0; k < a->count; k++)
        v[k] = a->bytes == 8 ? ((int64_t *)a->data)[k]
                             : (a->bytes == 4 ? ((int32_t *)a->data)[k] : ((uint8_t *)a->data)[k]);
    *dst = v;
    return 0;
}

static int npy_problem(const run_opts *o, run_problem *p) {
    npy_array hid = {0}, wt = {0}, tg = {0}, a = {0};
    int rc = 1, r;
    const char *dir = o->inputs;
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        sph_cli_fail(RUN_CMD, 1, "--inputs %s: %s", dir,
                     errno && stat(dir, &st) != 0 ? strerror(errno) : "not a directory");
        return 1;
    }
    const char *req[3] = {"hidden", "weight", "targets"};
    npy_array *dst[3] = {&hid, &wt, &tg};
    for (int k = 0; k < 3; k++) {
        if ((r = read_opt(dir, req[k], dst[k])) < 0) goto done;
        if (r == 0) {
            sph_cli_fail(RUN_CMD, 1, "--inputs %s: %s.npy is missing (hidden.npy, weight.npy and "
                                     "targets.npy are required)", dir, req[k]);
            goto done;
        }
    }
    if (hid.ndim != 2 || wt.ndim != 2) {
        sph_cli_fail(RUN_CMD, 1, "hidden.npy and weight.npy must be 2-d (got %d-d and %d-d)",
                     hid.ndim, wt.ndim);
        goto done;
    }
    /* dtype: f4 -> f32, f2 -> f16, u2 -> bf16 or f16 as --dtype says */
    if (hid.kind == 'f' && hid.bytes == 4) {
        p->bits = 32, p->is_bf16 = 0;
    } else if (hid.kind == 'f' && hid.bytes == 2) {
        p->bits = 16, p->is_bf16 = 0;
    } else if (hid.kind == 'u' && hid.bytes == 2) {
        if (!o->dtype_given || p->bits != 16) {
            rc = sph_cli_fail(RUN_CMD, 2, "hidden.npy holds uint16: say what it is with --dtype "
                                          "bf16|f16");
            goto done;
        }
    } else {
        sph_cli_fail(RUN_CMD, 1, "hidden.npy: dtype %s, expected <f4, <f2 or <u2 (bf16 bits)",
                     npy_descr(&hid));
        goto done;
    }
    if (wt.kind != hid.kind || wt.bytes != hid.bytes) {
        sph_cli_fail(RUN_CMD, 1, "weight.npy: dtype %s differs from hidden.npy's %s",
                     npy_descr(&wt), npy_descr(&hid));
        goto done;
    }
    p->N = hid.shape[0], p->H = hid.shape[1], p->V = wt.shape[0];
    p->V_total = o->V_total ? o->V_total : p->V;
    p->v0 = o->v0;
    int64_t wsh[2] = {p->V, p->H}, n1 = p->N;
    if (expect_shape("weight", &wt, 2, wsh) || expect_shape("targets", &tg, 1, &n1)) goto done;
    if (p->N < 1 || p->H < 1 || p->V < 1) {
        sph_cli_fail(RUN_CMD, 1, "--inputs %s: empty arrays (N=%lld H=%lld V=%lld)", dir,
                     (long long)p->N, (long long)p->H, (long long)p->V);
        goto done;
    }
    if (check_finite("hidden.npy", hid.data, hid.count, p->H, p->bits, p->is_bf16) ||
        check_finite("weight.npy", wt.data, wt.count, p->H, p->bits, p->is_bf16))
        goto done;
    p->h = hid.data, hid.data = NULL;
    p->w = wt.data, wt.data = NULL;
    if (load_ids("targets", &tg, &p->tgt)) goto done;
    if ((r = read_opt(dir, "mask", &a)) < 0) goto done;
    if (r) {
        if (a.bytes != 1) {
            sph_cli_fail(RUN_CMD, 1, "mask.npy: dtype %s, expected |u1 or |b1", npy_descr(&a));
            goto done;
        }
        if (expect_shape("mask", &a, 1, &n1)) goto done;
        p->mask = a.data, a.data = NULL;
    }
    npy_free(&a);
    const char *ups[4] = {"dlogprob", "dentropy", "dlse", "dlogit_mean"};
    float **dstf[4] = {&p->g, &p->e, &p->gl, &p->gm};
    for (int k = 0; k < 4; k++) {
        if ((r = read_opt(dir, ups[k], &a)) < 0) goto done;
        if (r && take_f32(ups[k], &a, p->N, dstf[k])) goto done;
        npy_free(&a);
    }
    /* per-row temperatures: they replace --temperature (the library takes one or the other) */
    if ((r = read_opt(dir, "temperature", &a)) < 0) goto done;
    if (r && o->temperature != 1.0) {
        rc = sph_cli_fail(RUN_CMD, 2, "--temperature %g: --inputs %s has temperature.npy (one "
                                      "temperature per row, replacing the scalar); drop "
                                      "--temperature", o->temperature, dir);
        goto done;
    }
    if (r && take_f32("temperature", &a, p->N, &p->temp)) goto done;
    npy_free(&a);
    if ((r = read_opt(dir, "candidates", &a)) < 0) goto done;
    if (r) {
        if (a.ndim != 2 || a.shape[0] != p->N) {
            sph_cli_fail(RUN_CMD, 1, "candidates.npy: expected shape (%lld, K)", (long long)p->N);
            goto done;
        }
        p->K = a.shape[1];
        if (load_ids("candidates", &a, &p->cand)) goto done;
    }
    char what[4200];
    snprintf(what, sizeof what, "--inputs %s", dir);
    if (check_vocab(p) || check_sizes(p, what, o->check)) goto done;
    p->mask_name = p->mask ? "mask.npy" : "all";
    rc = 0;
done:
    npy_free(&hid), npy_free(&wt), npy_free(&tg), npy_free(&a);
    return rc;
}

int run_problem_make(const run_opts *o, run_problem *p) {
    memset(p, 0, sizeof *p);
    p->bits = o->dtype == RUN_F32 ? 32 : 16;
    p->is_bf16 = o->dtype == RUN_BF16;
    int rc = o->inputs ? npy_problem(o, p) : synth_problem(o, p);
    if (rc) return rc;
    p->source = o->inputs ? o->inputs : (o->default_batch ? "default packed RL batch" : "synthetic");
    p->grads = p->g || p->e || p->gl || p->gm;
    p->n_act = p->N;
    if (p->mask) {
        p->spans = sph_cli_alloc(2 * ((p->N + 1) / 2) + 2, sizeof(int64_t));
        if (!p->spans) return sph_cli_fail(RUN_CMD, 1, "out of memory for spans");
        if (sph_spans_from_mask(p->mask, p->N, o->gap, p->spans, &p->n_spans))
            return sph_cli_fail(RUN_CMD, 1, "spans: %s", sph_last_error());
        p->n_act = 0;
        for (int64_t i = 0; i < p->N; i++) p->n_act += p->mask[i] != 0;
    }
    return 0;
}
