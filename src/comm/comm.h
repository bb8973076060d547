/*
 * comm.h - the communicator behind sph_comm_t: a table of collective operations filled by
 * each backend (none.c, mpi.c, nccl.c). Its users: the head combines per-row softmax partials
 * in rank order with one allgather per forward (per chunk in one-pass mode; sum_p2 adds one
 * of its own) and sums dhidden with allreduce_sum_f32; a call's consistency check is one
 * allgather of its records (check.h, sph_comm_agree); the policy loss gathers its sequence
 * records over seq_comm.
 */
#ifndef SPH_COMM_COMM_H
#define SPH_COMM_COMM_H

#include "core/internal.h"
#include "core/validate.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sph_comm_ops {
    /* recv[r * bytes .. (r+1) * bytes) receives rank r's send buffer. Host buffers for none
     * and MPI, device buffers (on `stream`) for NCCL. */
    sph_status (*allgather)(sph_comm_t c, const void *send, void *recv, size_t bytes,
                            void *stream);
    /* In-place sum over the group of count floats. */
    sph_status (*allreduce_sum_f32)(sph_comm_t c, float *buf, size_t count, void *stream);
    void (*destroy)(sph_comm_t c);
} sph_comm_ops;

struct sph_comm {
    sph_comm_backend backend;
    int64_t rank, size;
    sph_comm_config cfg;
    const sph_comm_ops *ops;
    int device_buffers; /* 1: collectives take device pointers (NCCL) */
    void *impl;         /* backend state */
};

/* The validator's communicator rule (core/validate.h) for c, named `name` in messages. */
static inline sph_status sph_comm_validate(sph_ctx_t ctx, sph_comm_t c, const char *name) {
    return sph_val_comm(ctx, name, c->ops != NULL, c->rank, c->size, c->device_buffers);
}

#ifdef __cplusplus
}
#endif
#endif
