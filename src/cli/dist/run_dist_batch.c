/*
 * run_dist_batch.c - the global batch of the distributed runner (built or read on rank 0 and
 * broadcast) and one rank's share of it: DP-aligned bins from sph_pack, the packed segment
 * layout of each bin and the CP-local rows of each segment (see run_dist_main.c, steps 1-4).
 */
#ifdef SPH_HAVE_MPI
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "clock.h"
#include "half.h"
#include "npy.h"
#include "num.h"
#include "rng.h"
#include "run_dist.h"

void dist_batch_free(batch *b) {
    free(b->lengths);
    free(b->hidden);
    free(b->weight);
    free(b->targets);
    free(b->cand);
    free(b->mask);
    for (int f = 0; f < NF; f++) free(b->up[f]);
    free(b->temp);
    memset(b, 0, sizeof *b);
}

/* R*H, V*H, R*K and the host memory of the batch (every rank holds it) must fit. */
static int check_sizes(const batch *b) {
    int64_t rh, vh, rk = 0;
    if (sph_cli_mul(b->R, b->H, &rh) || sph_cli_mul(b->V, b->H, &vh) ||
        sph_cli_mul(b->R, b->K, &rk))
        return dist_fail("the batch's sizes overflow int64 (R=%lld H=%lld V=%lld K=%lld)",
                         (long long)b->R, (long long)b->H, (long long)b->V, (long long)b->K);
    /* the batch, one rank's staging and device copies, the gathered results on rank 0 */
    double need = 12.0 * ((double)rh + (double)vh) + 16.0 * (double)rk + 48.0 * (double)b->R;
    int64_t phys = sph_cli_phys_bytes();
    if (phys > 0 && need * dist_size > (double)phys)
        return dist_fail("the batch (R=%lld H=%lld V=%lld) needs about %.3g GiB on each of %d "
                         "ranks, this machine has %.3g GiB",
                         (long long)b->R, (long long)b->H, (long long)b->V, need / 1073741824.0,
                         dist_size, (double)phys / 1073741824.0);
    return 1;
}

static int batch_alloc(batch *b) {
    const int64_t R = b->R, H = b->H, V = b->V;
    b->lengths = sph_cli_calloc(b->n_seqs, sizeof(int64_t));
    b->hidden = sph_cli_calloc(R * H, sizeof(float));
    b->weight = sph_cli_calloc(V * H, sizeof(float));
    b->targets = sph_cli_calloc(R, sizeof(int64_t));
    b->cand = b->K ? sph_cli_calloc(R * b->K, sizeof(int64_t)) : NULL;
    b->mask = sph_cli_calloc(R, 1);
    int ups = 1;
    for (int f = 0; f < NF; f++) ups &= (b->up[f] = sph_cli_calloc(R, sizeof(float))) != NULL;
    if (!b->lengths || !b->hidden || !b->weight || !b->targets || (b->K && !b->cand) ||
        !b->mask || !ups)
        return dist_fail("out of host memory for the global batch (R=%lld H=%lld V=%lld)",
                         (long long)b->R, (long long)b->H, (long long)b->V);
    return 1;
}

static float round_in(const batch *b, double v) {
    return b->bf16 ? sph_cli_bf16_to_f32(sph_cli_f32_to_bf16((float)v)) : (float)v;
}

int dist_batch_synth(const dopts *o, batch *b) {
    sph_cli_rng s = {o->seed * 0x2545F4914F6CDD1Dull + 17};
    b->n_seqs = o->seqs;
    b->H = o->H;
    b->V = o->V;
    b->K = o->K;
    b->masked = o->masked;
    b->bf16 = o->bf16;
    b->temperature = o->temperature;
    if (o->K > o->V)
        return dist_fail("--support %lld: more candidates than --vocab %lld", (long long)o->K,
                         (long long)o->V);
    int64_t *len = sph_cli_calloc(o->seqs, sizeof *len);
    if (!len) return dist_fail("out of host memory");
    b->R = 0;
    for (int64_t k = 0; k < o->seqs; k++) {
        len[k] = sph_cli_rng_range(&s, o->min_len, o->max_len);
        b->R += len[k]; /* at most 2^24 * 2^24 */
    }
    if (!check_sizes(b) || !batch_alloc(b)) {
        free(len);
        return 0;
    }
    memcpy(b->lengths, len, (size_t)o->seqs * sizeof *len);
    free(len);
    const double ws = 1.5 / sqrt((double)b->H);
    for (int64_t i = 0; i < b->R * b->H; i++) b->hidden[i] = round_in(b, sph_cli_rng_normal(&s));
    for (int64_t i = 0; i < b->V * b->H; i++) b->weight[i] = round_in(b, sph_cli_rng_normal(&s) * ws);
    int64_t row = 0;
    for (int64_t k = 0; k < b->n_seqs; k++) {
        int64_t L = b->lengths[k];
        /* tokens of the sequence; row q predicts token q+1 */
        int64_t prompt = L > 1 ? sph_cli_rng_range(&s, 1, L - 1) : 1;
        for (int64_t q = 0; q < L; q++, row++) {
            int64_t next = sph_cli_rng_range(&s, 0, b->V - 1);
            int last = q == L - 1;
            int active;
            if (b->masked) /* response rows, with holes */
                active = !last && q + 1 >= prompt && sph_cli_rng_uniform(&s) < 0.8;
            else
                active = 1;
            b->mask[row] = (uint8_t)active;
            b->targets[row] = (b->masked && last) ? -100 : next;
            if (active && sph_cli_rng_uniform(&s) < 0.05) b->targets[row] = -100; /* ignored */
            /* every upstream gradient nonzero on active rows: each path of the backward runs
             * (logit_mean's is not defined with candidates) */
            b->up[F_LOGPROB][row] = active ? (float)sph_cli_rng_normal(&s) : 0.0f;
            b->up[F_ENTROPY][row] = active ? (float)(0.5 * sph_cli_rng_normal(&s)) : 0.0f;
            b->up[F_LSE][row] = active ? (float)(0.2 * sph_cli_rng_normal(&s)) : 0.0f;
            b->up[F_LOGIT_MEAN][row] = active && !b->K ? (float)(0.2 * sph_cli_rng_normal(&s)) : 0.0f;
            if (b->K) {
                int64_t *c = b->cand + row * b->K;
                int64_t n_c = sph_cli_rng_range(&s, 1, b->K); /* the rest stays -1 padding */
                int64_t have = 0;
                if (b->targets[row] >= 0) c[have++] = b->targets[row];
                while (have < n_c) {
                    int64_t id = sph_cli_rng_range(&s, 0, b->V - 1), dup = 0;
                    for (int64_t j = 0; j < have; j++) dup |= c[j] == id;
                    if (!dup) c[have++] = id;
                }
                for (int64_t j = have; j < b->K; j++) c[j] = -1;
                /* shuffle the real candidates so the target is not always first */
                for (int64_t j = have - 1; j > 0; j--) {
                    int64_t r = sph_cli_rng_range(&s, 0, j), t = c[j];
                    c[j] = c[r];
                    c[r] = t;
                }
            }
        }
    }
    return 1;
}

/* Reads DIR/name.npy into a: 1 read, 0 absent (optional), -1 error (reported). */
static int load(const char *dir, const char *name, int required, npy_array *a) {
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    memset(a, 0, sizeof *a);
    struct stat st;
    if (stat(path, &st) != 0) {
        if (required) dist_fail("--inputs: %s is required", path);
        return required ? -1 : 0;
    }
    if (npy_read(path, a, err, sizeof err)) {
        dist_fail("%s", err);
        return -1;
    }
    return 1;
}

/* The .npy files of `spanhead run --inputs` (the single-process runner's names): hidden
 * (R, H) and weight (V, H) as <f4 (rounded to --dtype) or <u2 holding bf16 bits (--dtype
 * bf16), targets (R); optional mask (R), lengths (n) of the sequences (default: one sequence
 * of R rows), dlogprob, dentropy, dlse, dlogit_mean (R; absent = 0, as in one process),
 * candidates (R, K), temperature (R: per-row temperatures, excluding --temperature).
 * Non-finite hidden or weight values are refused. */
int dist_batch_read(const dopts *o, batch *b) {
    enum { I_H, I_W, I_T, I_M, I_L, I_C, I_G0, I_TMP = I_G0 + NF, I_COUNT };
    static const char *names[I_COUNT] = {"hidden", "weight", "targets", "mask", "lengths",
                                         "candidates", "dlogprob", "dentropy", "dlse",
                                         "dlogit_mean", "temperature"};
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
        dist_fail("hidden.npy %s, weight.npy %s: expected both <f4, or both <u2 (bf16 bits) with "
                  "--dtype bf16", npy_descr(h), npy_descr(w));
        goto done;
    }
    if (is_bits && !o->bf16) {
        dist_fail("hidden.npy holds uint16: say it is bf16 with --dtype bf16");
        goto done;
    }
    if (h->ndim != 2 || w->ndim != 2 || h->shape[1] != w->shape[1] || in[I_T].ndim != 1 ||
        in[I_T].shape[0] != h->shape[0]) {
        dist_fail("--inputs: need hidden (R, H), weight (V, H), targets (R)");
        goto done;
    }
    for (int k = I_H; k <= I_W; k++) {
        int64_t bad = sph_cli_first_nonfinite(in[k].data, in[k].count, is_bits ? 16 : 32, 1);
        if (bad >= 0) {
            dist_fail("%s.npy: non-finite value at [%lld, %lld]: the head needs finite inputs",
                      names[k], (long long)(bad / in[k].shape[1]),
                      (long long)(bad % in[k].shape[1]));
            goto done;
        }
    }
    b->R = h->shape[0];
    b->H = h->shape[1];
    b->V = w->shape[0];
    b->K = have[I_C] ? (in[I_C].ndim == 2 ? in[I_C].shape[1] : -1) : 0;
    b->masked = have[I_M];
    b->bf16 = o->bf16;
    b->temperature = o->temperature;
    if (b->K < 0 || (have[I_C] && in[I_C].shape[0] != b->R)) {
        dist_fail("candidates.npy: shape must be (R, K) with R = %lld", (long long)b->R);
        goto done;
    }
    for (int k = I_M; k < I_COUNT; k++)
        if (have[k] && k != I_L && k != I_C && in[k].count != b->R) {
            dist_fail("%s.npy holds %lld values, expected R = %lld", names[k],
                      (long long)in[k].count, (long long)b->R);
            goto done;
        }
    if (have[I_TMP] && (in[I_TMP].kind != 'f' || in[I_TMP].bytes != 4)) {
        dist_fail("temperature.npy: dtype %s, expected <f4", npy_descr(&in[I_TMP]));
        goto done;
    }
    if (have[I_TMP] && o->temperature != 1.0) {
        dist_fail("--temperature %g: --inputs %s has temperature.npy (one temperature per row, "
                  "replacing the scalar); drop --temperature", o->temperature, o->inputs);
        goto done;
    }
    if (have[I_G0 + F_LOGIT_MEAN] && b->K) {
        dist_fail("dlogit_mean.npy: logit_mean is not defined with candidates");
        goto done;
    }
    b->n_seqs = have[I_L] ? in[I_L].count : 1;
    if (b->R < 1 || b->V < 1 || b->H < 1 || b->n_seqs < 1) {
        dist_fail("--inputs %s: empty (R=%lld H=%lld V=%lld)", o->inputs, (long long)b->R,
                  (long long)b->H, (long long)b->V);
        goto done;
    }
    if (!check_sizes(b) || !batch_alloc(b)) goto done;
    if (have[I_TMP]) {
        if (!(b->temp = sph_cli_calloc(b->R, sizeof(float)))) {
            dist_fail("out of host memory for temperature.npy");
            goto done;
        }
        memcpy(b->temp, in[I_TMP].data, (size_t)b->R * sizeof(float));
    }
    int64_t sum = 0;
    for (int64_t k = 0; k < b->n_seqs; k++) {
        double l = have[I_L] ? npy_at(&in[I_L], k) : (double)b->R;
        if (!(l >= 1 && l <= (double)b->R) || l != floor(l)) {
            dist_fail("lengths.npy[%lld] = %g, expected an integer in [1, R = %lld]", (long long)k,
                      l, (long long)b->R);
            goto done;
        }
        b->lengths[k] = (int64_t)l;
        /* the whole sum, for the message (each <= R: saturated, never wrapped) */
        if (sph_cli_add(sum, b->lengths[k], &sum)) sum = INT64_MAX;
    }
    if (sum != b->R) {
        dist_fail("lengths.npy sums to %s%lld, but hidden has R = %lld rows",
                  sum == INT64_MAX ? "more than " : "", (long long)sum, (long long)b->R);
        goto done;
    }
    for (int64_t i = 0; i < b->R * b->H; i++)
        b->hidden[i] = is_bits ? sph_cli_bf16_to_f32((uint16_t)npy_at(h, i)) : round_in(b, npy_at(h, i));
    for (int64_t i = 0; i < b->V * b->H; i++)
        b->weight[i] = is_bits ? sph_cli_bf16_to_f32((uint16_t)npy_at(w, i)) : round_in(b, npy_at(w, i));
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

int dist_batch_share(batch *b, int ok0) {
    int64_t hdr[9] = {ok0, b->n_seqs, b->R, b->H, b->V, b->K, b->masked, b->bf16, !!b->temp};
    double temp = b->temperature;
    if (!bcast(hdr, sizeof hdr) || !bcast(&temp, sizeof temp)) return 0;
    if (!hdr[0]) return 0; /* rank 0 reported why */
    if (dist_rank != 0) {
        b->n_seqs = hdr[1];
        b->R = hdr[2];
        b->H = hdr[3];
        b->V = hdr[4];
        b->K = hdr[5];
        b->masked = (int)hdr[6];
        b->bf16 = (int)hdr[7];
        b->temperature = temp;
    }
    int mine = dist_rank == 0 || batch_alloc(b);
    if (mine && dist_rank != 0 && hdr[8])
        mine = (b->temp = sph_cli_calloc(b->R, sizeof(float))) != NULL ||
               dist_fail("out of host memory for the per-row temperatures");
    if (!dist_agree(mine)) return 0;
    size_t R = (size_t)b->R, H = (size_t)b->H;
    int ok = bcast(b->lengths, (size_t)b->n_seqs * sizeof(int64_t)) &&
             bcast(b->hidden, R * H * sizeof(float)) &&
             bcast(b->weight, (size_t)b->V * H * sizeof(float)) &&
             bcast(b->targets, R * sizeof(int64_t)) &&
             (!b->K || bcast(b->cand, R * (size_t)b->K * sizeof(int64_t))) && bcast(b->mask, R);
    for (int f = 0; ok && f < NF; f++) ok = bcast(b->up[f], R * sizeof(float));
    if (ok && b->temp) ok = bcast(b->temp, R * sizeof(float)); /* every rank the same rows */
    return ok;
}

// ---- one rank's share ------------------------------------------------------------------------

void dist_share_free(share *s) {
    free(s->bin_off);
    free(s->grow);
    memset(s, 0, sizeof *s);
}

int dist_share_make(const dopts *o, const batch *b, int64_t cp_rank, int64_t dp_rank, share *sh,
                    int64_t *total_bins, int64_t *padded_rows) {
    memset(sh, 0, sizeof *sh);
    int ok = 0;
    sph_pack_result *pr = NULL;
    int64_t *seq_off = sph_cli_calloc(b->n_seqs + 1, sizeof(int64_t));
    int64_t *lens = sph_cli_calloc(b->n_seqs, sizeof(int64_t));
    int64_t *padded = sph_cli_calloc(b->n_seqs, sizeof(int64_t));
    int64_t *cu = sph_cli_calloc(b->n_seqs + 1, sizeof(int64_t));
    int64_t *rows = NULL, rows_cap = 0;
    if (!seq_off || !lens || !padded || !cu) {
        dist_fail("out of host memory");
        goto done;
    }
    for (int64_t k = 0; k < b->n_seqs; k++) seq_off[k + 1] = seq_off[k] + b->lengths[k];

    sph_parallel par = SPH_PARALLEL_INIT;
    par.tp = o->tp;
    par.cp = o->cp;
    sph_alignment al;
    if (sph_alignment_get(&par, &al)) {
        dist_fail("alignment: %s", sph_last_error());
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
        dist_fail("sph_pack (capacity %lld, dp %lld): %s", (long long)cap, (long long)o->dp,
                  sph_last_error());
        goto done;
    }
    if (pr->n_bins % o->dp) {
        dist_fail("sph_pack returned %lld bins, not a multiple of dp %lld", (long long)pr->n_bins,
                  (long long)o->dp);
        goto done;
    }
    *total_bins = pr->n_bins;
    const int64_t per = pr->n_bins / o->dp, b0 = dp_rank * per;
    sh->n_bins = per;
    sh->bin_off = sph_cli_calloc(per + 1, sizeof(int64_t));
    if (!sh->bin_off) {
        dist_fail("out of host memory");
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
                dist_fail("sph_layout_packed (bin %lld): %s", (long long)(b0 + bi),
                          sph_last_error());
                goto done;
            }
            if (pass == 0) *padded_rows += cu[ni];
            for (int64_t k = 0; k < ni; k++) {
                int64_t P = padded[k], nl = P / o->cp;
                if (pass == 1) {
                    if (P > rows_cap) {
                        free(rows);
                        rows_cap = P;
                        rows = sph_cli_calloc(P, sizeof(int64_t));
                        if (!rows) {
                            dist_fail("out of host memory for a segment of %lld rows", (long long)P);
                            goto done;
                        }
                    }
                    if (sph_cp_local_rows(P, o->cp, cp_rank, rows)) {
                        dist_fail("sph_cp_local_rows (P=%lld): %s", (long long)P, sph_last_error());
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
            sh->grow = sph_cli_calloc(n, sizeof(int64_t));
            if (!sh->grow) {
                dist_fail("out of host memory for %lld local rows", (long long)n);
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
    if (!ok) dist_share_free(sh);
    return ok;
}
#else
/* without MPI the file holds nothing; ISO C wants a declaration in every translation unit */
typedef int sph_run_dist_batch_no_mpi;
#endif /* SPH_HAVE_MPI */
