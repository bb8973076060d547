/*
 * mpi.c - the MPI communicator: host buffers, one TP group per handle.
 *
 * The handle owns a duplicate of the caller's communicator (MPI_Comm_dup), so spanhead's
 * collectives can never match a message of the caller's, and it sets MPI_ERRORS_RETURN on that
 * duplicate only: an MPI fault becomes SPH_ERR_MPI with MPI_Error_string and the rank instead
 * of an abort, while the caller's error handler stays what it was. The library never calls
 * MPI_Init: creating a communicator before MPI_Init (or after MPI_Finalize) is SPH_ERR_MPI.
 *
 * Creation is collective and runs the configuration agreement of check.h: every rank
 * allgathers its encoded sph_comm_config and evaluates the same verdict, so a mismatch (a
 * different vocab_total on one rank, a shard gap or overlap) is SPH_ERR_MISMATCH with the same
 * message on every rank, never a hang.
 *
 * World layout (sph_comm_create_mpi_world): world rank w = ((dp_rank * cp) + cp_rank) * tp +
 * tp_rank; the TP group of w is MPI_Comm_split(world, color = w / tp, key = w % tp).
 *
 * Every collective first all-reduces its size (a few microseconds): ranks that disagree, or a
 * rank with bad arguments, give the same error on every rank instead of a truncation or a hang.
 *
 * Large messages: MPI counts are int. Allgathers beyond INT_MAX bytes use a derived datatype
 * of the whole per-rank block (blocks of 2^30 bytes plus a remainder, resized to the block's
 * extent); all-reduces beyond INT_MAX floats run in chunks (a sum is elementwise).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/check.h"
#include "comm/comm.h"
#include "comm/mpi_util.h"

#ifdef SPH_HAVE_MPI

typedef struct mpi_impl {
    MPI_Comm comm; /* our duplicate, MPI_ERRORS_RETURN */
} mpi_impl;

static int64_t g_max_count = INT_MAX;

void sph_comm_mpi_set_max_count(int64_t n) { g_max_count = n > 0 && n <= INT_MAX ? n : INT_MAX; }

sph_status sph_mpi_error(int code, const char *expr, MPI_Comm c, const char *file, int line) {
    char msg[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS || len <= 0)
        snprintf(msg, sizeof msg, "MPI error code %d", code);
    else
        msg[len < MPI_MAX_ERROR_STRING ? len : MPI_MAX_ERROR_STRING] = '\0';
    int rank = -1, size = 0;
    if (c == MPI_COMM_NULL || MPI_Comm_rank(c, &rank) != MPI_SUCCESS ||
        MPI_Comm_size(c, &size) != MPI_SUCCESS) {
        c = MPI_COMM_WORLD;
        if (MPI_Comm_rank(c, &rank) != MPI_SUCCESS) rank = -1;
        if (MPI_Comm_size(c, &size) != MPI_SUCCESS) size = 0;
    }
    return sph_err(SPH_ERR_MPI, "rank %d of %d: %s failed: %s (code %d) at %s:%d", rank, size,
                   expr, msg, code, file, line);
}

sph_status sph_mpi_ready(const char *who) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    SPH_CHECK(init, SPH_ERR_MPI,
              "%s: MPI is not initialized (call MPI_Init or MPI_Init_thread first; spanhead "
              "never initializes MPI itself)",
              who);
    SPH_CHECK(!fin, SPH_ERR_MPI, "%s: MPI is already finalized", who);
    return SPH_OK;
}

sph_status sph_mpi_dup(MPI_Comm user, const char *who, MPI_Comm *dup) {
    sph_status st = SPH_OK;
    *dup = MPI_COMM_NULL;
    SPH_CHECK(user != MPI_COMM_NULL, SPH_ERR_INVALID_ARG, "%s: mpi_comm is MPI_COMM_NULL", who);
    int inter = 0;
    SPH_MPI_TRY(MPI_Comm_test_inter(user, &inter), MPI_COMM_NULL);
    SPH_CHECK(!inter, SPH_ERR_INVALID_ARG,
              "%s: mpi_comm is an intercommunicator, expected an intracommunicator", who);
    SPH_MPI_TRY(MPI_Comm_dup(user, dup), user);
    SPH_MPI_TRY(MPI_Comm_set_errhandler(*dup, MPI_ERRORS_RETURN), *dup);
    return SPH_OK;
fail:
    if (*dup != MPI_COMM_NULL) MPI_Comm_free(dup);
    return st;
}

sph_status sph_mpi_agree(MPI_Comm c, const sph_comm_config *cfg, int64_t local_flags,
                         int world) {
    sph_status st = SPH_OK;
    sph_comm_rec mine, *all = NULL;
    int size = 0, rank = 0;
    sph_comm_rec_encode(cfg, 1, &mine);
    mine.w[SPH_REC_FLAGS] |= local_flags;
    SPH_MPI_TRY(MPI_Comm_size(c, &size), c);
    SPH_MPI_TRY(MPI_Comm_rank(c, &rank), c);
    all = sph_calloc((size_t)size, sizeof *all);
    /* A rank without room for the records cannot join the allgather; a tiny all-reduce first
     * tells every rank whether the exchange can happen at all (never a hang). */
    int no_mem = all ? INT_MAX : rank, first_no_mem = INT_MAX;
    SPH_MPI_TRY(MPI_Allreduce(&no_mem, &first_no_mem, 1, MPI_INT, MPI_MIN, c), c);
    if (first_no_mem != INT_MAX) {
        st = sph_err(SPH_ERR_ALLOC, "rank %d: out of host memory for %d config records",
                     first_no_mem, size);
        goto fail;
    }
    SPH_MPI_TRY(MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE,
                              c),
                c);
    st = sph_comm_check_records(all, size, world);
fail:
    sph_free(all);
    return st;
}

/* ---- ops ---------------------------------------------------------------------------------- */

/* A datatype covering `bytes` contiguous bytes (bytes may exceed INT_MAX): whole blocks of
 * g_max_count bytes plus a remainder, resized so consecutive elements sit `bytes` apart. */
static sph_status big_bytes_type(MPI_Comm c, size_t bytes, MPI_Datatype *out) {
    sph_status st = SPH_OK;
    MPI_Datatype block = MPI_DATATYPE_NULL, body = MPI_DATATYPE_NULL, whole = MPI_DATATYPE_NULL;
    size_t blk = (size_t)g_max_count, q = bytes / blk, r = bytes % blk;
    *out = MPI_DATATYPE_NULL;
    SPH_CHECK(q <= (size_t)INT_MAX, SPH_ERR_OVERFLOW, "comm allgather: %zu bytes per rank is too "
              "large for MPI", bytes);
    SPH_MPI_TRY(MPI_Type_contiguous((int)blk, MPI_BYTE, &block), c);
    SPH_MPI_TRY(MPI_Type_contiguous((int)q, block, &body), c);
    if (r) {
        int lens[2] = {1, (int)r};
        MPI_Aint disp[2] = {0, (MPI_Aint)(q * blk)};
        MPI_Datatype types[2] = {body, MPI_BYTE};
        SPH_MPI_TRY(MPI_Type_create_struct(2, lens, disp, types, &whole), c);
    } else {
        SPH_MPI_TRY(MPI_Type_dup(body, &whole), c);
    }
    SPH_MPI_TRY(MPI_Type_create_resized(whole, 0, (MPI_Aint)bytes, out), c);
    SPH_MPI_TRY(MPI_Type_commit(out), c);
fail:
    if (block != MPI_DATATYPE_NULL) MPI_Type_free(&block);
    if (body != MPI_DATATYPE_NULL) MPI_Type_free(&body);
    if (whole != MPI_DATATYPE_NULL) MPI_Type_free(&whole);
    if (st != SPH_OK && *out != MPI_DATATYPE_NULL) MPI_Type_free(out);
    return st;
}

/* Every rank must pass the same size to a collective; otherwise MPI truncates, fails on some
 * ranks only, or waits forever. One tiny all-reduce (the largest and the smallest size with
 * the lowest rank holding each) turns that into the same SPH_ERR_MISMATCH on every rank. It
 * costs a few microseconds on shared memory, next to a forward of milliseconds or more. A rank
 * whose own arguments are bad joins with size -1, so the others fail too instead of hanging. */
static sph_status agree_size(MPI_Comm mc, int64_t n, const char *what, const char *unit) {
    sph_status st = SPH_OK;
    int rank = 0;
    SPH_MPI_TRY(MPI_Comm_rank(mc, &rank), mc);
    struct { long v; int r; } in[2] = {{(long)n, rank}, {-(long)n, rank}}, out[2];
    SPH_MPI_TRY(MPI_Allreduce(in, out, 2, MPI_LONG_INT, MPI_MAXLOC, mc), mc);
    long hi = out[0].v, lo = -out[1].v;
    if (lo < 0)
        return sph_err(SPH_ERR_INVALID_ARG, "comm %s: rank %d passed invalid arguments (see that "
                       "rank's message)", what, out[1].r);
    if (hi != lo)
        return sph_err(SPH_ERR_MISMATCH,
                       "comm %s: ranks disagree on the size: rank %d passes %ld %s, rank %d "
                       "passes %ld (different shapes on the ranks of the group?)",
                       what, out[0].r, hi, unit, out[1].r, lo);
fail:
    return st;
}

static sph_status mpi_allgather(sph_comm_t c, const void *send, void *recv, size_t bytes,
                                void *stream) {
    (void)stream;
    sph_status st = SPH_OK;
    MPI_Datatype big = MPI_DATATYPE_NULL;
    SPH_CHECK(c && c->impl, SPH_ERR_INVALID_ARG, "comm allgather: handle is NULL");
    MPI_Comm mc = ((mpi_impl *)c->impl)->comm;
    size_t total = 0;
    const char *s = send, *r0 = recv, *mine = r0 + (size_t)c->rank * bytes;
    int bad = bytes > (size_t)INT64_MAX / 2 || (bytes && (!send || !recv)) ||
              !sph_mul_size(bytes, (size_t)c->size, &total) ||
              (bytes && s != mine && !(s + bytes <= r0 || s >= r0 + total));
    if (bad) {
        /* Join the size agreement as "invalid" so the other ranks fail instead of waiting. */
        agree_size(mc, -1, "allgather", "bytes");
        SPH_CHECK(bytes <= (size_t)INT64_MAX / 2, SPH_ERR_OVERFLOW,
                  "comm allgather: %zu bytes is too large", bytes);
        SPH_CHECK(!bytes || (send && recv), SPH_ERR_INVALID_ARG,
                  "comm allgather: send %p or recv %p is NULL", send, recv);
        SPH_CHECK(sph_mul_size(bytes, (size_t)c->size, &total), SPH_ERR_OVERFLOW,
                  "comm allgather: %zu bytes x %lld ranks overflows", bytes, (long long)c->size);
        return sph_err(SPH_ERR_INVALID_ARG,
                       "comm allgather: send buffer overlaps recv but is not this rank's block");
    }
    SPH_TRY(agree_size(mc, (int64_t)bytes, "allgather", "bytes"));
    if (bytes == 0) return SPH_OK; /* every rank agrees: nothing to exchange */
    const void *src = s == mine ? MPI_IN_PLACE : send;
    if ((int64_t)bytes <= g_max_count) {
        SPH_MPI_TRY(MPI_Allgather(src, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, mc), mc);
    } else {
        SPH_TRY(big_bytes_type(mc, bytes, &big));
        SPH_MPI_TRY(MPI_Allgather(src, 1, big, recv, 1, big, mc), mc);
    }
fail:
    if (big != MPI_DATATYPE_NULL) MPI_Type_free(&big);
    return st;
}

static sph_status mpi_allreduce(sph_comm_t c, float *buf, size_t count, void *stream) {
    (void)stream;
    sph_status st = SPH_OK;
    SPH_CHECK(c && c->impl, SPH_ERR_INVALID_ARG, "comm allreduce: handle is NULL");
    MPI_Comm mc = ((mpi_impl *)c->impl)->comm;
    int bad = (count && !buf) || count > (size_t)INT64_MAX / 2;
    st = agree_size(mc, bad ? -1 : (int64_t)count, "allreduce", "floats");
    SPH_CHECK(!count || buf, SPH_ERR_INVALID_ARG, "comm allreduce: buf is NULL");
    SPH_CHECK(count <= (size_t)INT64_MAX / 2, SPH_ERR_OVERFLOW,
              "comm allreduce: %zu floats is too large", count);
    if (st != SPH_OK || count == 0) return st;
    for (size_t off = 0; off < count; off += (size_t)g_max_count) {
        size_t n = count - off < (size_t)g_max_count ? count - off : (size_t)g_max_count;
        SPH_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, buf + off, (int)n, MPI_FLOAT, MPI_SUM, mc), mc);
    }
fail:
    return st;
}

static void mpi_destroy(sph_comm_t c) {
    mpi_impl *m = c->impl;
    if (!m) return;
    int fin = 0;
    MPI_Finalized(&fin);
    /* After MPI_Finalize every communicator is gone; freeing would be erroneous. */
    if (!fin && m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
    sph_free(m);
    c->impl = NULL;
}

static const sph_comm_ops mpi_ops = {mpi_allgather, mpi_allreduce, mpi_destroy};

/* Wraps an agreed TP communicator (ownership moves into the handle on success). */
static sph_status wrap(sph_comm_t *out, MPI_Comm *tpc, const sph_comm_config *cfg,
                       sph_comm_t pre, mpi_impl *impl) {
    sph_status st = SPH_OK;
    int rank = 0, size = 0;
    SPH_MPI_TRY(MPI_Comm_rank(*tpc, &rank), *tpc);
    SPH_MPI_TRY(MPI_Comm_size(*tpc, &size), *tpc);
    impl->comm = *tpc;
    *tpc = MPI_COMM_NULL;
    pre->backend = SPH_COMM_MPI;
    pre->rank = rank;
    pre->size = size;
    pre->cfg = *cfg;
    pre->cfg.struct_size = sizeof pre->cfg;
    pre->ops = &mpi_ops;
    pre->device_buffers = 0;
    pre->impl = impl;
    *out = pre;
fail:
    return st;
}

sph_status sph_comm_create_mpi(sph_comm_t *comm, const void *mpi_comm,
                               const sph_comm_config *cfg) {
    static const char *who = "sph_comm_create_mpi";
    sph_status st = SPH_OK;
    MPI_Comm dup = MPI_COMM_NULL;
    if (comm) *comm = NULL;
    SPH_TRY(sph_mpi_ready(who));
    SPH_CHECK(mpi_comm != NULL, SPH_ERR_INVALID_ARG,
              "%s: mpi_comm is NULL, expected a pointer to an MPI_Comm", who);
    SPH_TRY(sph_mpi_dup(*(const MPI_Comm *)mpi_comm, who, &dup));
    /* Allocate before the exchange: a rank out of memory says so in its record. */
    sph_comm_t pre = sph_calloc(1, sizeof *pre);
    mpi_impl *impl = sph_calloc(1, sizeof *impl);
    int64_t flags = (comm ? 0 : SPH_REC_F_NO_OUT) | (pre && impl ? 0 : SPH_REC_F_ALLOC);
    st = sph_mpi_agree(dup, cfg, flags, 0);
    if (st == SPH_OK) st = wrap(comm, &dup, cfg, pre, impl);
    if (st != SPH_OK) {
        sph_free(pre);
        sph_free(impl);
        if (dup != MPI_COMM_NULL) MPI_Comm_free(&dup);
        return sph_err_prefix(st, "%s: ", who);
    }
    return SPH_OK;
}

sph_status sph_comm_create_mpi_world(sph_comm_t *comm, const sph_comm_config *cfg,
                                     int64_t *tp_rank, int64_t *cp_rank, int64_t *dp_rank) {
    static const char *who = "sph_comm_create_mpi_world";
    sph_status st = SPH_OK;
    MPI_Comm dup = MPI_COMM_NULL, tpc = MPI_COMM_NULL;
    sph_comm_t pre = NULL;
    mpi_impl *impl = NULL;
    if (comm) *comm = NULL;
    SPH_TRY(sph_mpi_ready(who));
    SPH_TRY(sph_mpi_dup(MPI_COMM_WORLD, who, &dup));
    pre = sph_calloc(1, sizeof *pre);
    impl = sph_calloc(1, sizeof *impl);
    int64_t flags = (comm ? 0 : SPH_REC_F_NO_OUT) | (pre && impl ? 0 : SPH_REC_F_ALLOC);
    st = sph_mpi_agree(dup, cfg, flags, 1);
    if (st != SPH_OK) goto fail;
    /* Agreed: cfg is valid on every rank and the world size is tp * cp * dp. */
    int w = 0;
    SPH_MPI_TRY(MPI_Comm_rank(dup, &w), dup);
    const int64_t tp = cfg->tp, cp = cfg->cp;
    SPH_MPI_TRY(MPI_Comm_split(dup, (int)(w / tp), (int)(w % tp), &tpc), dup);
    SPH_MPI_TRY(MPI_Comm_set_errhandler(tpc, MPI_ERRORS_RETURN), tpc);
    st = wrap(comm, &tpc, cfg, pre, impl);
    if (st != SPH_OK) goto fail;
    MPI_Comm_free(&dup);
    if (tp_rank) *tp_rank = w % tp;
    if (cp_rank) *cp_rank = (w / tp) % cp;
    if (dp_rank) *dp_rank = w / (tp * cp);
    return SPH_OK;
fail:
    if (comm) *comm = NULL;
    sph_free(pre);
    sph_free(impl);
    if (tpc != MPI_COMM_NULL) MPI_Comm_free(&tpc);
    if (dup != MPI_COMM_NULL) MPI_Comm_free(&dup);
    return sph_err_prefix(st, "%s: ", who);
}

#else /* !SPH_HAVE_MPI */

sph_status sph_comm_create_mpi(sph_comm_t *comm, const void *mpi_comm,
                               const sph_comm_config *cfg) {
    (void)mpi_comm;
    (void)cfg;
    if (comm) *comm = NULL;
    return sph_err(SPH_ERR_UNSUPPORTED,
                   "sph_comm_create_mpi: spanhead was built without MPI (configure with "
                   "-DSPH_MPI=ON and an MPI implementation installed)");
}

sph_status sph_comm_create_mpi_world(sph_comm_t *comm, const sph_comm_config *cfg,
                                     int64_t *tp_rank, int64_t *cp_rank, int64_t *dp_rank) {
    (void)cfg;
    (void)tp_rank;
    (void)cp_rank;
    (void)dp_rank;
    if (comm) *comm = NULL;
    return sph_err(SPH_ERR_UNSUPPORTED,
                   "sph_comm_create_mpi_world: spanhead was built without MPI (configure with "
                   "-DSPH_MPI=ON and an MPI implementation installed)");
}

#endif
