/*
 * nccl.c - the NCCL communicator: device buffers, collectives enqueued on the caller's stream
 * (the context's stream, passed to each op), one TP group per handle.
 *
 * Two ways in:
 *   sph_comm_create_nccl      wraps an ncclComm_t the caller already has (not owned: destroy
 *                             leaves it alone). The configuration agreement runs over NCCL
 *                             itself: each rank's 80-byte config record goes through one
 *                             ncclAllGather in a small device buffer on a private stream, and
 *                             every rank evaluates the same verdict (check.h).
 *   sph_comm_create_nccl_mpi  builds a new ncclComm_t over an MPI communicator: the agreement
 *                             runs over MPI first (so a bad config never reaches NCCL), rank 0
 *                             calls ncclGetUniqueId, MPI_Bcast spreads it, every rank calls
 *                             ncclCommInitRank on its current CUDA device; an all-reduce of
 *                             the outcome makes a failed init an error on every rank. Owned.
 *
 * NCCL is asynchronous: an op returns once the collective is enqueued, and a fault that
 * happens on the device shows at the next synchronization of the stream. Argument errors and
 * the communicator's asynchronous error state are checked at enqueue time and become
 * SPH_ERR_NCCL with ncclGetErrorString and ncclGetLastError.
 *
 * NCCL itself is opened at the first communicator (nccl_shim.h): the process's own copy when
 * it has one (PyTorch's), so an ncclComm_t from torch is driven by the NCCL that made it.
 *
 * NVLink SHARP / multicast (NVLS) is left to the environment: the scripts and docs set
 * NCCL_NVLS_ENABLE=0 on the lent machines (docs/distributed.md).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/check.h"
#include "comm/comm.h"
#include "comm/mpi_util.h"

#ifdef SPH_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include "comm/nccl_shim.h" /* the nccl* calls below go through the run-time loaded table */

typedef struct nccl_impl {
    ncclComm_t comm;
    int owned;  /* created by sph_comm_create_nccl_mpi: destroyed with the handle */
    int device; /* the CUDA device of the communicator */
} nccl_impl;

static sph_status nccl_error(ncclResult_t r, const char *expr, ncclComm_t comm, int64_t rank,
                             const char *file, int line) {
    const char *last = comm ? ncclGetLastError(comm) : ncclGetLastError(NULL);
    return sph_err(SPH_ERR_NCCL, "rank %lld: %s failed: %s (%d)%s%s at %s:%d", (long long)rank,
                   expr, ncclGetErrorString(r), (int)r, last && *last ? ": " : "",
                   last ? last : "", file, line);
}

static sph_status cuda_error(cudaError_t e, const char *expr, int64_t rank, const char *file,
                             int line) {
    return sph_err(SPH_ERR_CUDA, "rank %lld: %s failed: %s (%s) at %s:%d", (long long)rank, expr,
                   cudaGetErrorName(e), cudaGetErrorString(e), file, line);
}

#define SPH_NCCL_TRY(expr, comm, rank)                                                        \
    do {                                                                                      \
        ncclResult_t sph_nccl_e_ = (expr);                                                    \
        if (sph_nccl_e_ != ncclSuccess) {                                                     \
            st = nccl_error(sph_nccl_e_, #expr, (comm), (rank), __FILE__, __LINE__);          \
            goto fail;                                                                        \
        }                                                                                     \
    } while (0)

#define SPH_CUDA_TRY(expr, rank)                                                              \
    do {                                                                                      \
        cudaError_t sph_cuda_e_ = (expr);                                                     \
        if (sph_cuda_e_ != cudaSuccess) {                                                     \
            st = cuda_error(sph_cuda_e_, #expr, (rank), __FILE__, __LINE__);                  \
            goto fail;                                                                        \
        }                                                                                     \
    } while (0)

/* The communicator's asynchronous error state (a peer failure, a device fault). */
static sph_status async_state(ncclComm_t nc, int64_t rank) {
    sph_status st = SPH_OK;
    ncclResult_t async = ncclSuccess;
    SPH_NCCL_TRY(ncclCommGetAsyncError(nc, &async), nc, rank);
    if (async != ncclSuccess && async != ncclInProgress)
        return nccl_error(async, "the communicator (asynchronous error)", nc, rank, __FILE__,
                          __LINE__);
fail:
    return st;
}

/* ---- ops ---------------------------------------------------------------------------------- */

static sph_status nccl_allgather(sph_comm_t c, const void *send, void *recv, size_t bytes,
                                 void *stream) {
    sph_status st = SPH_OK;
    SPH_CHECK(c && c->impl, SPH_ERR_INVALID_ARG, "comm allgather: handle is NULL");
    nccl_impl *m = c->impl;
    if (bytes == 0) return SPH_OK;
    SPH_CHECK(send && recv, SPH_ERR_INVALID_ARG, "comm allgather: send %p or recv %p is NULL",
              send, recv);
    size_t total;
    SPH_CHECK(sph_mul_size(bytes, (size_t)c->size, &total), SPH_ERR_OVERFLOW,
              "comm allgather: %zu bytes x %lld ranks overflows", bytes, (long long)c->size);
    /* NCCL's in-place form is send == recv + rank * bytes; any other overlap is a caller bug. */
    const char *s = send, *r0 = recv, *mine = r0 + (size_t)c->rank * bytes;
    SPH_CHECK(s == mine || s + bytes <= r0 || s >= r0 + total, SPH_ERR_INVALID_ARG,
              "comm allgather: send buffer overlaps recv but is not this rank's block");
    SPH_TRY(async_state(m->comm, c->rank));
    SPH_NCCL_TRY(ncclAllGather(send, recv, bytes, ncclUint8, m->comm, (cudaStream_t)stream),
                 m->comm, c->rank);
fail:
    return st;
}

static sph_status nccl_allreduce(sph_comm_t c, float *buf, size_t count, void *stream) {
    sph_status st = SPH_OK;
    SPH_CHECK(c && c->impl, SPH_ERR_INVALID_ARG, "comm allreduce: handle is NULL");
    nccl_impl *m = c->impl;
    if (count == 0) return SPH_OK;
    SPH_CHECK(buf != NULL, SPH_ERR_INVALID_ARG, "comm allreduce: buf is NULL");
    SPH_TRY(async_state(m->comm, c->rank));
    SPH_NCCL_TRY(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, m->comm,
                               (cudaStream_t)stream),
                 m->comm, c->rank);
fail:
    return st;
}

static void nccl_destroy(sph_comm_t c) {
    nccl_impl *m = c->impl;
    if (!m) return;
    if (m->owned && m->comm) ncclCommDestroy(m->comm);
    sph_free(m);
    c->impl = NULL;
}

static const sph_comm_ops nccl_ops = {nccl_allgather, nccl_allreduce, nccl_destroy};

static sph_status wrap(sph_comm_t *out, ncclComm_t nc, int owned, int device, int rank,
                       int size, const sph_comm_config *cfg) {
    sph_comm_t c = sph_calloc(1, sizeof *c);
    nccl_impl *m = sph_calloc(1, sizeof *m);
    if (!c || !m) {
        sph_free(c);
        sph_free(m);
        return sph_err(SPH_ERR_ALLOC, "rank %d: out of host memory for the communicator", rank);
    }
    m->comm = nc;
    m->owned = owned;
    m->device = device;
    c->backend = SPH_COMM_NCCL;
    c->rank = rank;
    c->size = size;
    c->cfg = *cfg;
    c->cfg.struct_size = sizeof c->cfg;
    c->ops = &nccl_ops;
    c->device_buffers = 1;
    c->impl = m;
    *out = c;
    return SPH_OK;
}

/* The agreement over NCCL itself: the records travel through a device buffer. */
static sph_status agree_over_nccl(ncclComm_t nc, int rank, int size, int device,
                                  const sph_comm_config *cfg, int out_ok) {
    sph_status st = SPH_OK;
    sph_comm_rec mine, *all = NULL;
    void *d = NULL;
    cudaStream_t s = NULL;
    int prev = -1;
    sph_comm_rec_encode(cfg, out_ok, &mine);
    all = sph_calloc((size_t)size, sizeof *all);
    if (!all) return sph_err(SPH_ERR_ALLOC, "rank %d: out of host memory for %d records", rank,
                             size);
    SPH_CUDA_TRY(cudaGetDevice(&prev), rank);
    SPH_CUDA_TRY(cudaSetDevice(device), rank);
    SPH_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), rank);
    SPH_CUDA_TRY(cudaMalloc(&d, (size_t)size * sizeof mine), rank);
    char *slot = (char *)d + (size_t)rank * sizeof mine;
    SPH_CUDA_TRY(cudaMemcpyAsync(slot, &mine, sizeof mine, cudaMemcpyHostToDevice, s), rank);
    SPH_NCCL_TRY(ncclAllGather(slot, d, sizeof mine, ncclUint8, nc, s), nc, rank);
    SPH_CUDA_TRY(cudaMemcpyAsync(all, d, (size_t)size * sizeof mine, cudaMemcpyDeviceToHost, s),
                 rank);
    SPH_CUDA_TRY(cudaStreamSynchronize(s), rank);
    st = sph_comm_check_records(all, size, 0);
fail:
    if (d) cudaFree(d);
    if (s) cudaStreamDestroy(s);
    if (prev >= 0) cudaSetDevice(prev);
    sph_free(all);
    return st;
}

sph_status sph_comm_create_nccl(sph_comm_t *comm, void *nccl_comm, const sph_comm_config *cfg) {
    static const char *who = "sph_comm_create_nccl";
    sph_status st = SPH_OK;
    if (comm) *comm = NULL;
    SPH_CHECK(nccl_comm != NULL, SPH_ERR_INVALID_ARG,
              "%s: nccl_comm is NULL, expected an ncclComm_t", who);
    SPH_TRY(sph_nccl_load(who));
    ncclComm_t nc = (ncclComm_t)nccl_comm;
    int rank = -1, size = 0, device = -1;
    SPH_NCCL_TRY(ncclCommUserRank(nc, &rank), nc, -1);
    SPH_NCCL_TRY(ncclCommCount(nc, &size), nc, rank);
    SPH_NCCL_TRY(ncclCommCuDevice(nc, &device), nc, rank);
    st = agree_over_nccl(nc, rank, size, device, cfg, comm != NULL);
    if (st == SPH_OK) st = wrap(comm, nc, 0, device, rank, size, cfg);
fail:
    return st == SPH_OK ? st : sph_err_prefix(st, "%s: ", who);
}

#ifdef SPH_HAVE_MPI
sph_status sph_comm_create_nccl_mpi(sph_comm_t *comm, const void *mpi_comm,
                                    const sph_comm_config *cfg) {
    static const char *who = "sph_comm_create_nccl_mpi";
    sph_status st = SPH_OK;
    MPI_Comm dup = MPI_COMM_NULL;
    ncclComm_t nc = NULL;
    int rank = 0, size = 0, device = -1;
    if (comm) *comm = NULL;
    SPH_TRY(sph_mpi_ready(who));
    SPH_CHECK(mpi_comm != NULL, SPH_ERR_INVALID_ARG,
              "%s: mpi_comm is NULL, expected a pointer to an MPI_Comm", who);
    SPH_TRY(sph_mpi_dup(*(const MPI_Comm *)mpi_comm, who, &dup));
    SPH_MPI_TRY(MPI_Comm_rank(dup, &rank), dup);
    SPH_MPI_TRY(MPI_Comm_size(dup, &size), dup);

    /* A rank without a usable CUDA device says so in its record: nobody enters NCCL init. */
    int64_t flags = comm ? 0 : SPH_REC_F_NO_OUT;
    cudaError_t ce = cudaGetDevice(&device);
    sph_status local = SPH_OK;
    if (ce != cudaSuccess) {
        local = cuda_error(ce, "cudaGetDevice(&device)", rank, __FILE__, __LINE__);
        flags |= SPH_REC_F_BACKEND;
    } else if ((local = sph_nccl_load(NULL)) != SPH_OK) {
        local = sph_err_prefix(local, "rank %d: ", rank); /* no NCCL here: nobody enters init */
        flags |= SPH_REC_F_BACKEND;
    }
    char local_msg[512];
    snprintf(local_msg, sizeof local_msg, "%s", sph_last_error());
    st = sph_mpi_agree(dup, cfg, flags, 0);
    if (local != SPH_OK) {
        st = sph_err(local, "%s", local_msg); /* this rank's own cause, not the summary */
        goto fail;
    }
    if (st != SPH_OK) goto fail;

    /* Rank 0 makes the id; a failure there travels with the id so nobody waits in init. */
    struct { int32_t ok; ncclUniqueId id; } msg;
    memset(&msg, 0, sizeof msg);
    if (rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&msg.id);
        msg.ok = r == ncclSuccess;
        if (!msg.ok) local = nccl_error(r, "ncclGetUniqueId(&id)", NULL, 0, __FILE__, __LINE__);
    }
    SPH_MPI_TRY(MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, 0, dup), dup);
    if (!msg.ok) {
        st = rank == 0 ? local
                       : sph_err(SPH_ERR_NCCL, "rank 0: ncclGetUniqueId failed (see rank 0's "
                                               "message)");
        goto fail;
    }
    ncclResult_t ir = ncclCommInitRank(&nc, size, msg.id, rank);
    if (ir != ncclSuccess) {
        local = nccl_error(ir, "ncclCommInitRank(&nc, size, id, rank)", NULL, rank, __FILE__,
                           __LINE__);
        nc = NULL;
    }
    /* Every rank learns whether every init succeeded (lowest failing rank). */
    int bad = ir == ncclSuccess ? INT_MAX : rank, first_bad = INT_MAX;
    snprintf(local_msg, sizeof local_msg, "%s", sph_last_error());
    SPH_MPI_TRY(MPI_Allreduce(&bad, &first_bad, 1, MPI_INT, MPI_MIN, dup), dup);
    if (first_bad != INT_MAX) {
        st = ir != ncclSuccess ? sph_err(local, "%s", local_msg)
                               : sph_err(SPH_ERR_NCCL, "rank %d: ncclCommInitRank failed (see "
                                                       "that rank's message)",
                                         first_bad);
        goto fail;
    }
    st = wrap(comm, nc, 1, device, rank, size, cfg);
    if (st != SPH_OK) goto fail;
    MPI_Comm_free(&dup);
    return SPH_OK;
fail:
    if (nc) ncclCommDestroy(nc);
    if (dup != MPI_COMM_NULL) MPI_Comm_free(&dup);
    return sph_err_prefix(st, "%s: ", who);
}
#else
sph_status sph_comm_create_nccl_mpi(sph_comm_t *comm, const void *mpi_comm,
                                    const sph_comm_config *cfg) {
    (void)mpi_comm;
    (void)cfg;
    if (comm) *comm = NULL;
    return sph_err(SPH_ERR_UNSUPPORTED,
                   "sph_comm_create_nccl_mpi: spanhead was built with NCCL but without MPI; "
                   "create the ncclComm_t yourself and use sph_comm_create_nccl");
}
#endif /* SPH_HAVE_MPI */

#else /* !SPH_HAVE_NCCL */

sph_status sph_comm_create_nccl(sph_comm_t *comm, void *nccl_comm, const sph_comm_config *cfg) {
    (void)nccl_comm;
    (void)cfg;
    if (comm) *comm = NULL;
    return sph_err(SPH_ERR_UNSUPPORTED,
                   "sph_comm_create_nccl: spanhead was built without NCCL (it needs the CUDA "
                   "backend and libnccl; configure with -DSPH_CUDA=ON -DSPH_NCCL=ON)");
}

sph_status sph_comm_create_nccl_mpi(sph_comm_t *comm, const void *mpi_comm,
                                    const sph_comm_config *cfg) {
    (void)mpi_comm;
    (void)cfg;
    if (comm) *comm = NULL;
    return sph_err(SPH_ERR_UNSUPPORTED,
                   "sph_comm_create_nccl_mpi: spanhead was built without NCCL (it needs the "
                   "CUDA backend and libnccl; configure with -DSPH_CUDA=ON -DSPH_NCCL=ON)");
}

#endif /* SPH_HAVE_NCCL */
