/*
 * nccl_shim.h - the NCCL functions spanhead calls, resolved at run time (core/dynload.h) when
 * the first NCCL communicator is made: libspanhead has no DT_NEEDED on libnccl, so the process's
 * own NCCL (PyTorch's, from its nvidia-nccl wheel, whose ncclComm_t a torch process group
 * hands us) is the one used, and a system NCCL is loaded only where there is none.
 *
 * Include this after <nccl.h> (types, enums and ncclUniqueId come from the header); each nccl*
 * call in nccl.c maps onto the table by a macro. sph_nccl_load() fills it once per process.
 */
#ifndef SPH_COMM_NCCL_SHIM_H
#define SPH_COMM_NCCL_SHIM_H

#include <nccl.h>

#include "spanhead.h"

/* X(field, symbol, return type, parameters) */
#define SPH_NCCL_FUNCS(X)                                                                     \
    X(get_unique_id, "ncclGetUniqueId", ncclResult_t, (ncclUniqueId *))                       \
    X(comm_init_rank, "ncclCommInitRank", ncclResult_t,                                       \
      (ncclComm_t *, int, ncclUniqueId, int))                                                 \
    X(comm_destroy, "ncclCommDestroy", ncclResult_t, (ncclComm_t))                            \
    X(get_error_string, "ncclGetErrorString", const char *, (ncclResult_t))                   \
    X(get_last_error, "ncclGetLastError", const char *, (ncclComm_t))                         \
    X(comm_get_async_error, "ncclCommGetAsyncError", ncclResult_t, (ncclComm_t, ncclResult_t *)) \
    X(comm_count, "ncclCommCount", ncclResult_t, (const ncclComm_t, int *))                   \
    X(comm_cu_device, "ncclCommCuDevice", ncclResult_t, (const ncclComm_t, int *))            \
    X(comm_user_rank, "ncclCommUserRank", ncclResult_t, (const ncclComm_t, int *))            \
    X(all_reduce, "ncclAllReduce", ncclResult_t,                                              \
      (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t))  \
    X(all_gather, "ncclAllGather", ncclResult_t,                                              \
      (const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t))

#define SPH_NCCL_FIELD(field, sym, ret, params) ret(*field) params;
typedef struct sph_nccl_api {
    SPH_NCCL_FUNCS(SPH_NCCL_FIELD)
} sph_nccl_api;
#undef SPH_NCCL_FIELD

extern sph_nccl_api sph_nccl_fn;

/* Loads libnccl.so.<NCCL_MAJOR> once per process (thread-safe, sticky result); `who` (or NULL)
 * prefixes the message of a failure (SPH_ERR_UNSUPPORTED naming every place tried). */
sph_status sph_nccl_load(const char *who);
/* The path of the NCCL in use ("" before a successful load). */
const char *sph_nccl_path(void);

#define ncclGetUniqueId (sph_nccl_fn.get_unique_id)
#define ncclCommInitRank (sph_nccl_fn.comm_init_rank)
#define ncclCommDestroy (sph_nccl_fn.comm_destroy)
#define ncclGetErrorString (sph_nccl_fn.get_error_string)
#define ncclGetLastError (sph_nccl_fn.get_last_error)
#define ncclCommGetAsyncError (sph_nccl_fn.comm_get_async_error)
#define ncclCommCount (sph_nccl_fn.comm_count)
#define ncclCommCuDevice (sph_nccl_fn.comm_cu_device)
#define ncclCommUserRank (sph_nccl_fn.comm_user_rank)
#define ncclAllReduce (sph_nccl_fn.all_reduce)
#define ncclAllGather (sph_nccl_fn.all_gather)

#endif
