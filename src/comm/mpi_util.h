/*
 * mpi_util.h - MPI helpers shared by the MPI and NCCL communicators (mpi.c implements them).
 * Only meaningful in a build with MPI (SPH_HAVE_MPI); the library never calls MPI_Init.
 */
#ifndef SPH_COMM_MPI_UTIL_H
#define SPH_COMM_MPI_UTIL_H

#include "core/internal.h"

#ifdef SPH_HAVE_MPI
#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

/* SPH_ERR_MPI with MPI_Error_string(code), the calling rank of c (world rank if c is not
 * usable), the failed expression and file:line. */
sph_status sph_mpi_error(int code, const char *expr, MPI_Comm c, const char *file, int line);

/* For functions with a `sph_status st` and a single `fail:` label. */
#define SPH_MPI_TRY(expr, comm)                                                               \
    do {                                                                                      \
        int sph_mpi_e_ = (expr);                                                              \
        if (sph_mpi_e_ != MPI_SUCCESS) {                                                      \
            st = sph_mpi_error(sph_mpi_e_, #expr, (comm), __FILE__, __LINE__);                \
            goto fail;                                                                        \
        }                                                                                     \
    } while (0)

/* SPH_OK when MPI is initialized and not finalized; else SPH_ERR_MPI naming `who`. */
sph_status sph_mpi_ready(const char *who);

/* Validates the caller's intracommunicator (not MPI_COMM_NULL, not an intercommunicator),
 * duplicates it (collective over `user`) and sets MPI_ERRORS_RETURN on the duplicate, so that
 * the caller's communicator and error handler are never touched. */
sph_status sph_mpi_dup(MPI_Comm user, const char *who, MPI_Comm *dup);

/* Collective over c: allgathers every rank's encoded cfg and runs sph_comm_check_records
 * (world = 1: c is the world laid out by (tp, cp, dp); 0: c is one TP group). local_flags are
 * SPH_REC_F_* faults of this rank that the others must learn about. Same verdict on every
 * rank. */
sph_status sph_mpi_agree(MPI_Comm c, const sph_comm_config *cfg, int64_t local_flags,
                         int world);

/* Test hook: the largest element count passed to one MPI call (default INT_MAX); smaller
 * values exercise the large-message paths with small buffers. 0 restores the default. */
void sph_comm_mpi_set_max_count(int64_t n);

#ifdef __cplusplus
}
#endif
#endif /* SPH_HAVE_MPI */
#endif
