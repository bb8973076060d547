/*
 * none.c - the single-process communicator: a group of one, where every collective is a copy.
 */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

static sph_status none_allgather(sph_comm_t c, const void *send, void *recv, size_t bytes,
                                 void *stream) {
    (void)c;
    (void)stream;
    if (send != recv && bytes) memmove(recv, send, bytes);
    return SPH_OK;
}

static sph_status none_allreduce(sph_comm_t c, float *buf, size_t count, void *stream) {
    (void)c;
    (void)buf;
    (void)count;
    (void)stream;
    return SPH_OK;
}

static void none_destroy(sph_comm_t c) { (void)c; }

static const sph_comm_ops none_ops = {none_allgather, none_allreduce, none_destroy};

sph_status sph_comm_create_none(sph_comm_t *comm) {
    SPH_CHECK(comm != NULL, SPH_ERR_INVALID_ARG, "comm: output pointer is NULL");
    *comm = NULL; /* on failure too (the torture tests found it left as it was) */
    sph_comm_t c = sph_calloc(1, sizeof *c);
    SPH_CHECK(c != NULL, SPH_ERR_ALLOC, "comm: out of host memory");
    sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
    c->backend = SPH_COMM_NONE;
    c->rank = 0;
    c->size = 1;
    c->cfg = cfg;
    c->ops = &none_ops;
    *comm = c;
    return SPH_OK;
}

void sph_comm_destroy(sph_comm_t comm) {
    if (!comm) return;
    if (comm->ops && comm->ops->destroy) comm->ops->destroy(comm);
    sph_free(comm);
}

sph_status sph_comm_info(sph_comm_t comm, sph_comm_backend *backend, int64_t *rank,
                         int64_t *size) {
    SPH_CHECK(comm != NULL, SPH_ERR_INVALID_ARG, "comm: handle is NULL");
    if (backend) *backend = comm->backend;
    if (rank) *rank = comm->rank;
    if (size) *size = comm->size;
    return SPH_OK;
}
