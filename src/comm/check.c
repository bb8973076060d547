/*
 * check.c - the configuration verdict shared by every communicator backend (see check.h).
 *
 * The verdict is a pure function of the gathered records, evaluated identically on every
 * rank: the same status and the same message everywhere, and never a rank that returns early
 * while the others wait in a collective.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "comm/check.h"
#include "comm/comm.h"
#include "core/ctx.h"

static int64_t dtype_pack(sph_dtype d) {
    return (int64_t)d.code | (int64_t)d.bits << 8 | (int64_t)d.lanes << 16;
}

static sph_dtype dtype_unpack(int64_t v) {
    sph_dtype d;
    d.code = (uint8_t)(v & 0xff);
    d.bits = (uint8_t)((v >> 8) & 0xff);
    d.lanes = (uint16_t)((v >> 16) & 0xffff);
    return d;
}

static double temp_of(const sph_comm_rec *r) {
    double t;
    memcpy(&t, &r->w[SPH_REC_TEMPERATURE], sizeof t);
    return t;
}

void sph_comm_rec_encode(const sph_comm_config *cfg, int out_ok, sph_comm_rec *rec) {
    memset(rec, 0, sizeof *rec);
    rec->w[SPH_REC_MAGIC] = SPH_REC_MAGIC_V1;
    if (!out_ok) rec->w[SPH_REC_FLAGS] |= SPH_REC_F_NO_OUT;
    if (!cfg) {
        rec->w[SPH_REC_FLAGS] |= SPH_REC_F_NO_CFG;
        return;
    }
    if (cfg->struct_size < offsetof(sph_comm_config, temperature) + sizeof(double)) {
        rec->w[SPH_REC_FLAGS] |= SPH_REC_F_STRUCT_SIZE;
        return;
    }
    rec->w[SPH_REC_TP] = cfg->tp;
    rec->w[SPH_REC_CP] = cfg->cp;
    rec->w[SPH_REC_DP] = cfg->dp;
    rec->w[SPH_REC_VOCAB_TOTAL] = cfg->vocab_total;
    rec->w[SPH_REC_VOCAB_START] = cfg->vocab_start;
    rec->w[SPH_REC_VOCAB_LOCAL] = cfg->vocab_local;
    rec->w[SPH_REC_DTYPE] = dtype_pack(cfg->dtype);
    memcpy(&rec->w[SPH_REC_TEMPERATURE], &cfg->temperature, sizeof(double));
}

/* Local domain checks of one record. */
static sph_status check_one(const sph_comm_rec *r, int64_t rank) {
    const int64_t *w = r->w;
    if (w[SPH_REC_MAGIC] != SPH_REC_MAGIC_V1)
        return sph_err(SPH_ERR_MISMATCH,
                       "rank %lld: config record tag is 0x%llx, expected 0x%llx (a rank runs a "
                       "different spanhead build or passed a different collective)",
                       (long long)rank, (unsigned long long)w[SPH_REC_MAGIC],
                       (unsigned long long)SPH_REC_MAGIC_V1);
    if (w[SPH_REC_FLAGS] & SPH_REC_F_NO_OUT)
        return sph_err(SPH_ERR_INVALID_ARG, "rank %lld: comm: output pointer is NULL",
                       (long long)rank);
    if (w[SPH_REC_FLAGS] & SPH_REC_F_ALLOC)
        return sph_err(SPH_ERR_ALLOC, "rank %lld: out of host memory creating the communicator",
                       (long long)rank);
    if (w[SPH_REC_FLAGS] & SPH_REC_F_BACKEND)
        return sph_err(SPH_ERR_UNSUPPORTED,
                       "rank %lld: could not set up its side of the communicator (see that "
                       "rank's own message)",
                       (long long)rank);
    if (w[SPH_REC_FLAGS] & SPH_REC_F_NO_CFG)
        return sph_err(SPH_ERR_INVALID_ARG, "rank %lld: cfg is NULL", (long long)rank);
    if (w[SPH_REC_FLAGS] & SPH_REC_F_STRUCT_SIZE)
        return sph_err(SPH_ERR_INVALID_ARG,
                       "rank %lld: cfg.struct_size is too small, expected %zu (use "
                       "SPH_COMM_CONFIG_INIT)",
                       (long long)rank, sizeof(sph_comm_config));
    static const struct { int idx; const char *name; } sizes[] = {
        {SPH_REC_TP, "tp"}, {SPH_REC_CP, "cp"}, {SPH_REC_DP, "dp"},
        {SPH_REC_VOCAB_TOTAL, "vocab_total"}, {SPH_REC_VOCAB_LOCAL, "vocab_local"}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (w[sizes[i].idx] < 1)
            return sph_err(SPH_ERR_INVALID_ARG, "rank %lld: cfg.%s is %lld, expected >= 1",
                           (long long)rank, sizes[i].name, (long long)w[sizes[i].idx]);
    if (w[SPH_REC_VOCAB_START] < 0)
        return sph_err(SPH_ERR_INVALID_ARG, "rank %lld: cfg.vocab_start is %lld, expected >= 0",
                       (long long)rank, (long long)w[SPH_REC_VOCAB_START]);
    sph_dtype d = dtype_unpack(w[SPH_REC_DTYPE]);
    if (!sph_dtype_is_float_input(d))
        return sph_err(SPH_ERR_INVALID_ARG, "rank %lld: cfg.dtype is %s, expected f32, bf16 or f16",
                       (long long)rank, sph_dtype_name(d));
    double t = temp_of(r);
    if (!(isfinite(t) && t > 0))
        return sph_err(SPH_ERR_INVALID_ARG,
                       "rank %lld: cfg.temperature is %g, expected finite and > 0",
                       (long long)rank, t);
    int64_t prod;
    if (!sph_mul_i64(w[SPH_REC_TP], w[SPH_REC_CP], &prod) ||
        !sph_mul_i64(prod, w[SPH_REC_DP], &prod) || prod > INT32_MAX)
        return sph_err(SPH_ERR_OVERFLOW, "rank %lld: cfg.tp * cp * dp overflows (%lld, %lld, %lld)",
                       (long long)rank, (long long)w[SPH_REC_TP], (long long)w[SPH_REC_CP],
                       (long long)w[SPH_REC_DP]);
    return SPH_OK;
}

sph_status sph_comm_check_records(const sph_comm_rec *recs, int64_t n, int world) {
    SPH_CHECK(recs != NULL && n >= 1, SPH_ERR_INTERNAL, "comm check: %lld records at %p",
              (long long)n, (const void *)recs);
    for (int64_t r = 0; r < n; r++) SPH_TRY(check_one(&recs[r], r));

    /* Agreement with rank 0 on everything but the shard. */
    const int64_t *w0 = recs[0].w;
    static const struct { int idx; const char *name; } common[] = {
        {SPH_REC_TP, "tp"}, {SPH_REC_CP, "cp"}, {SPH_REC_DP, "dp"},
        {SPH_REC_VOCAB_TOTAL, "vocab_total"}};
    for (int64_t r = 1; r < n; r++) {
        const int64_t *w = recs[r].w;
        for (size_t i = 0; i < sizeof common / sizeof common[0]; i++)
            if (w[common[i].idx] != w0[common[i].idx])
                return sph_err(SPH_ERR_MISMATCH, "rank %lld: cfg.%s is %lld, rank 0 has %lld",
                               (long long)r, common[i].name, (long long)w[common[i].idx],
                               (long long)w0[common[i].idx]);
        if (w[SPH_REC_DTYPE] != w0[SPH_REC_DTYPE]) {
            char mine[32];
            snprintf(mine, sizeof mine, "%s", sph_dtype_name(dtype_unpack(w[SPH_REC_DTYPE])));
            return sph_err(SPH_ERR_MISMATCH, "rank %lld: cfg.dtype is %s, rank 0 has %s",
                           (long long)r, mine, sph_dtype_name(dtype_unpack(w0[SPH_REC_DTYPE])));
        }
        /* Bitwise: two temperatures that print alike but differ in the last bit still give
         * different softmaxes. */
        if (w[SPH_REC_TEMPERATURE] != w0[SPH_REC_TEMPERATURE])
            return sph_err(SPH_ERR_MISMATCH,
                           "rank %lld: cfg.temperature is %.17g, rank 0 has %.17g",
                           (long long)r, temp_of(&recs[r]), temp_of(&recs[0]));
    }

    const int64_t tp = w0[SPH_REC_TP], cp = w0[SPH_REC_CP], dp = w0[SPH_REC_DP];
    const int64_t V = w0[SPH_REC_VOCAB_TOTAL];
    const int64_t want = world ? tp * cp * dp : tp; /* no overflow: checked <= INT32_MAX */
    if (n != want)
        return world ? sph_err(SPH_ERR_MISMATCH,
                               "world has %lld ranks, but cfg.tp * cp * dp = %lld * %lld * %lld "
                               "= %lld",
                               (long long)n, (long long)tp, (long long)cp, (long long)dp,
                               (long long)want)
                     : sph_err(SPH_ERR_MISMATCH,
                               "the communicator has %lld ranks, but cfg.tp is %lld (it must "
                               "span exactly the TP group)",
                               (long long)n, (long long)tp);

    /* Shards tile [0, V) in rank order inside each TP group, the same in every group. */
    for (int64_t r = 0; r < n; r++) {
        int64_t t = r % tp;
        int64_t s = recs[r].w[SPH_REC_VOCAB_START], l = recs[r].w[SPH_REC_VOCAB_LOCAL], e;
        if (!sph_add_i64(s, l, &e) || e > V)
            return sph_err(SPH_ERR_MISMATCH,
                           "rank %lld: shard [%lld, %lld + %lld) runs past vocab_total %lld",
                           (long long)r, (long long)s, (long long)s, (long long)l, (long long)V);
        int64_t expect = 0;
        if (t > 0)
            expect = recs[r - 1].w[SPH_REC_VOCAB_START] + recs[r - 1].w[SPH_REC_VOCAB_LOCAL];
        if (s > expect)
            return sph_err(SPH_ERR_MISMATCH,
                           "rank %lld: shard [%lld, %lld) leaves a gap [%lld, %lld) %s",
                           (long long)r, (long long)s, (long long)e, (long long)expect,
                           (long long)s, t ? "after the previous TP rank's shard"
                                           : "at the start of the vocabulary");
        if (s < expect)
            return sph_err(SPH_ERR_MISMATCH,
                           "rank %lld: shard [%lld, %lld) overlaps rank %lld's shard, which "
                           "ends at %lld",
                           (long long)r, (long long)s, (long long)e, (long long)(r - 1),
                           (long long)expect);
        if (t == tp - 1 && e != V)
            return sph_err(SPH_ERR_MISMATCH,
                           "rank %lld: the last TP rank's shard ends at %lld, leaving a gap "
                           "[%lld, %lld) before vocab_total",
                           (long long)r, (long long)e, (long long)e, (long long)V);
        if (r >= tp) {
            const int64_t *ref = recs[t].w;
            if (s != ref[SPH_REC_VOCAB_START] || l != ref[SPH_REC_VOCAB_LOCAL])
                return sph_err(SPH_ERR_MISMATCH,
                               "rank %lld: shard [%lld, %lld) differs from rank %lld's [%lld, "
                               "%lld) at the same tp_rank %lld",
                               (long long)r, (long long)s, (long long)e, (long long)t,
                               (long long)ref[SPH_REC_VOCAB_START],
                               (long long)(ref[SPH_REC_VOCAB_START] + ref[SPH_REC_VOCAB_LOCAL]),
                               (long long)t);
        }
    }
    return SPH_OK;
}

// ---- a group's agreement on one call ------------------------------------------------------

/* all[r * words ...] <- every rank's record, in rank order. */
static sph_status exchange(sph_ctx_t ctx, sph_comm_t comm, const int64_t *mine, int64_t *all,
                           size_t words) {
    const size_t rec = words * sizeof(int64_t), n = (size_t)comm->size;
    if (!comm->device_buffers) return comm->ops->allgather(comm, mine, all, rec, NULL);
    /* a device communicator: stage through device memory */
    void *d = NULL;
    SPH_TRY(ctx->dev->malloc(ctx, rec * (n + 1), &d));
    sph_status s = ctx->dev->memcpy(ctx, d, mine, rec);
    if (s == SPH_OK) s = comm->ops->allgather(comm, d, (char *)d + rec, rec, ctx->stream);
    if (s == SPH_OK) s = ctx->dev->memcpy(ctx, all, (char *)d + rec, rec * n);
    ctx->dev->free(ctx, d);
    return s;
}

sph_status sph_comm_agree(sph_ctx_t ctx, sph_comm_t comm, const int64_t *mine, size_t words,
                          sph_status local, const char *who, sph_agree_verdict verdict,
                          void *arg) {
    /* keep this rank's own message when it is the one that failed */
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", sph_last_error());
    int64_t stack[2048], *all = stack;
    const size_t n = (size_t)comm->size;
    if (n * words > sizeof stack / sizeof stack[0]) {
        all = (int64_t *)sph_malloc(n * words * sizeof *all);
        if (!all) /* cannot join the exchange: fail here, the others fail in their collective */
            return local != SPH_OK ? local
                                   : sph_err(SPH_ERR_ALLOC, "tp_comm: no host memory for %lld "
                                             "consistency records", (long long)comm->size);
    }
    sph_status s = exchange(ctx, comm, mine, all, words);
    if (s == SPH_OK && local == SPH_OK) s = verdict(all, (int64_t)n, words, arg);
    else if (s != SPH_OK && local == SPH_OK)
        s = sph_err_prefix(s, "%s: tensor-parallel consistency check: ", who);
    if (all != stack) sph_free(all);
    if (local != SPH_OK) return sph_err(local, "%s", saved);
    return s;
}

int64_t sph_agree_first_tag(const int64_t *all, int64_t n, size_t words, size_t at, int64_t tag) {
    for (int64_t r = 0; r < n; r++)
        if (all[(size_t)r * words + at] != tag) return r;
    return -1;
}

int sph_agree_first_diff(const int64_t *all, int64_t n, size_t words, size_t from, size_t to,
                         int64_t *rank, size_t *word) {
    for (int64_t r = 1; r < n; r++)
        for (size_t f = from; f < to; f++)
            if (all[(size_t)r * words + f] != all[f]) {
                *rank = r, *word = f;
                return 1;
            }
    return 0;
}
