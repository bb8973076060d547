/*
 * head_tp.c - the tensor-parallel consistency check of a head pass (spanhead.h, "Policies":
 * tensor-parallel calls). Every rank of a TP group must make the same call; a rank that
 * differs (another temperature, N, mask, targets, chunking) would otherwise return SPH_OK
 * with different results, or leave the others waiting in a collective they never join.
 *
 * Before any output is written each rank allgathers one record of TP_WORDS int64 words: the
 * call's scalars exactly (N, H, K, vocab_total, dtype, temperature and softcap bits, pass and
 * presence flags, the context's chunking) and FNV-1a hashes of the per-row host arrays
 * (mask and spans, targets, candidates, upstream gradients, per-row temperatures). Every rank compares the same
 * gathered records in the same order, so every rank returns the same verdict and message. A
 * rank whose own validation failed joins with an "invalid" record: the others fail with it
 * instead of hanging, and it keeps its own message.
 *
 * Host communicators (MPI): always (one allgather of 136 bytes per rank, after the MPI
 * layer's size agreement: a few microseconds next to passes of milliseconds). Device
 * communicators (NCCL): a check would need a host sync inside the pass, so it is the caller's
 * duty; debug builds (NDEBUG unset) check the scalars and spans anyway, through a device
 * staging buffer, synchronously.
 */
#include <stdio.h>
#include <string.h>

#include "comm/check.h"
#include "comm/comm.h"
#include "core/ctx.h"
#include "head/plan.h"

enum {
    TP_TAG, TP_FLAGS, TP_N, TP_H, TP_K, TP_V, TP_DTYPE, TP_TEMP, TP_CAP, TP_CHUNK_ROWS,
    TP_CHUNK_BYTES, TP_ROWS, TP_TARGETS, TP_CANDIDATES, TP_UPSTREAM, TP_TEMP_ROWS, TP_CTX,
    TP_WORDS
};
static const char *const g_field[TP_WORDS] = {
    "validation", "pass and requested outputs/gradients", "N (rows of hidden)",
    "H (columns of hidden)", "K (candidates per row)", "vocab_total", "dtype", "temperature",
    "softcap", "chunk_rows (context)", "chunk_bytes (context)", "active_mask / spans",
    "targets", "candidates", "upstream gradients (dlogprob, dentropy, dlse, dlogit_mean)",
    "temperature_rows",
    "batch_invariant / cuda_flags (context)"};

_Static_assert(TP_WORDS == SPH_HEAD_TP_WORDS, "plan.h: SPH_HEAD_TP_WORDS");
#define TP_VALID INT64_C(0x3130504350485053) /* "SPHPTP01" */
#define fnv sph_fnv1a
#define FNV0 SPH_FNV1A_INIT

/* The record of this rank's call; data: the per-row arrays are host memory (hashed). */
static void make_record(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p, int data,
                        int64_t *w) {
    memset(w, 0, TP_WORDS * sizeof *w);
    w[TP_TAG] = TP_VALID;
    const void *present[] = {p->targets, p->cand,     p->mask,    p->spans,      p->logprob,
                             p->entropy, p->lse,      p->logit_mean, p->dlogprob, p->dentropy,
                             p->dlse,    p->dlogit_mean, p->dhidden, p->dweight, p->sum_p2,
                             p->temp_rows, p->topk_ids};
    int64_t f = (int64_t)pass | (int64_t)p->one_pass << 1 | (int64_t)p->acc_dh << 2 |
                (int64_t)p->acc_dw << 3 | (int64_t)p->allreduce_dh << 4 |
                p->topk << 32; /* K of topk (<= 256) */
    for (size_t k = 0; k < sizeof present / sizeof present[0]; k++)
        if (present[k]) f |= (int64_t)1 << (8 + k);
    w[TP_FLAGS] = f;
    w[TP_N] = p->N, w[TP_H] = p->H, w[TP_K] = p->K, w[TP_V] = p->V;
    w[TP_DTYPE] = (int64_t)p->dtype.code | (int64_t)p->dtype.bits << 8;
    w[TP_TEMP] = sph_f64_bits(p->temperature), w[TP_CAP] = sph_f64_bits(p->softcap);
    w[TP_CHUNK_ROWS] = ctx->chunk_rows, w[TP_CHUNK_BYTES] = ctx->chunk_bytes;
    w[TP_CTX] = (int64_t)(ctx->opts.batch_invariant != 0) | (int64_t)ctx->opts.cuda_flags << 1;
    uint64_t h = FNV0;
    if (p->spans) h = fnv(h, p->spans, (size_t)p->n_spans * 2 * sizeof(int64_t));
    if (data && p->mask) h = fnv(h, p->mask, (size_t)p->N);
    w[TP_ROWS] = (int64_t)h;
    if (!data) return;
    if (p->targets) {
        h = FNV0;
        for (int64_t i = 0; i < p->N; i++) {
            int64_t t = sph_head_id_at(p->targets, p->tgt_i64, i);
            h = fnv(h, &t, sizeof t);
        }
        w[TP_TARGETS] = (int64_t)h;
    }
    if (p->cand) {
        h = FNV0;
        for (int64_t i = 0; i < p->N; i++)
            for (int64_t k = 0; k < p->K; k++) {
                int64_t c = sph_head_id_at(p->cand, p->cand_i64, i * p->ld_c + k);
                h = fnv(h, &c, sizeof c);
            }
        w[TP_CANDIDATES] = (int64_t)h;
    }
    const float *up[4] = {p->dlogprob, p->dentropy, p->dlse, p->dlogit_mean};
    h = FNV0;
    for (int k = 0; k < 4; k++)
        if (up[k]) h = fnv(h, up[k], (size_t)p->N * sizeof(float));
    w[TP_UPSTREAM] = (int64_t)h;
    if (p->temp_rows) w[TP_TEMP_ROWS] = (int64_t)fnv(FNV0, p->temp_rows, (size_t)p->N * 4);
}

/* plan.h */
void sph_head_tp_record(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p, int64_t *w) {
    if (p) {
        sph_comm_t comm = ctx->tp_comm;
        make_record(ctx, pass, p, !(comm && comm->device_buffers), w);
    } else {
        memset(w, 0, TP_WORDS * sizeof *w);
        w[TP_TAG] = SPH_AGREE_INVALID;
    }
}

/* plan.h */
sph_status sph_head_tp_verdict(const int64_t *all, int64_t n, size_t words) {
    int64_t r = sph_agree_first_tag(all, n, words, TP_TAG, TP_VALID);
    if (r >= 0)
        return sph_err(SPH_ERR_INVALID_ARG,
                       "tp_comm: rank %lld of the group refused its call (see that rank's "
                       "message); every rank fails with it",
                       (long long)r);
    size_t f;
    if (!sph_agree_first_diff(all, n, words, 0, TP_WORDS, &r, &f)) return SPH_OK;
    const int64_t a = all[f], b = all[(size_t)r * words + f];
    if (f == TP_TEMP || f == TP_CAP) {
        double x, y;
        memcpy(&x, &a, sizeof x), memcpy(&y, &b, sizeof y);
        return sph_err(SPH_ERR_MISMATCH,
                       "tp_comm: rank %lld calls with %s %.17g, rank 0 with %.17g: every rank "
                       "of the group must make the same call",
                       (long long)r, g_field[f], y, x);
    }
    if (f >= TP_ROWS && f <= TP_TEMP_ROWS)
        return sph_err(SPH_ERR_MISMATCH,
                       "tp_comm: rank %lld's %s differ from rank 0's (hashes %016llx, %016llx): "
                       "every rank of the group must make the same call",
                       (long long)r, g_field[f], (unsigned long long)b, (unsigned long long)a);
    return sph_err(SPH_ERR_MISMATCH,
                   "tp_comm: rank %lld calls with %s %lld, rank 0 with %lld (0x%llx, 0x%llx): "
                   "every rank of the group must make the same call",
                   (long long)r, g_field[f], (long long)b, (long long)a, (unsigned long long)b,
                   (unsigned long long)a);
}

static sph_status head_verdict(const int64_t *all, int64_t n, size_t words, void *arg) {
    (void)arg;
    return sph_head_tp_verdict(all, n, words);
}

sph_status sph_head_tp_agree(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p,
                             sph_status local) {
    sph_comm_t comm = ctx->tp_comm;
    if (!comm || !comm->ops || comm->size <= 1 || comm->rank < 0 || comm->rank >= comm->size)
        return local;
#ifdef NDEBUG
    if (comm->device_buffers) return local; /* the caller's duty (spanhead.h) */
#endif
    int64_t mine[TP_WORDS];
    sph_head_tp_record(ctx, pass, local == SPH_OK ? p : NULL, mine);
    return sph_comm_agree(ctx, comm, mine, TP_WORDS, local, "head", head_verdict, NULL);
}
