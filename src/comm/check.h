/*
 * check.h - the agreements of a group: the configuration agreement every communicator
 * backend runs at creation, and (sph_comm_agree, below) the agreement on one call that the
 * head's and the losses' tensor-parallel consistency checks run before any output is written.
 *
 * Each rank encodes its sph_comm_config into a fixed-size record of int64 words (no padding,
 * no pointers, so the bytes can travel through any allgather: MPI, NCCL, a file). After the
 * allgather every rank holds the same array of records and runs the same pure verdict over
 * it, so a bad or disagreeing configuration is the same error, with the same message, on
 * every rank: nobody proceeds into a later collective that the others never reach.
 *
 * Ranks are laid out as in sph_comm_create_mpi_world: world rank w = ((dp_rank * cp) +
 * cp_rank) * tp + tp_rank, so TP groups are consecutive blocks of tp ranks. A single TP group
 * (sph_comm_create_mpi, _nccl) is the case n == tp.
 */
#ifndef SPH_COMM_CHECK_H
#define SPH_COMM_CHECK_H

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Word indices of a record. */
enum {
    SPH_REC_MAGIC = 0,       /* protocol tag + version: a rank running another build shows */
    SPH_REC_FLAGS = 1,       /* SPH_REC_F_* bits: local argument faults of that rank */
    SPH_REC_TP = 2,
    SPH_REC_CP = 3,
    SPH_REC_DP = 4,
    SPH_REC_VOCAB_TOTAL = 5,
    SPH_REC_VOCAB_START = 6,
    SPH_REC_VOCAB_LOCAL = 7,
    SPH_REC_DTYPE = 8,       /* code | bits << 8 | lanes << 16 */
    SPH_REC_TEMPERATURE = 9, /* the double's bits */
    SPH_REC_WORDS = 10
};

#define SPH_REC_MAGIC_V1 ((int64_t)0x5350484331LL) /* "SPHC1" */
#define SPH_REC_F_NO_CFG 1      /* cfg was NULL */
#define SPH_REC_F_STRUCT_SIZE 2 /* cfg->struct_size too small */
#define SPH_REC_F_NO_OUT 4      /* the output handle pointer was NULL */
#define SPH_REC_F_ALLOC 8       /* the rank ran out of host memory before the exchange */
#define SPH_REC_F_BACKEND 16    /* the rank failed a backend call before the exchange */

typedef struct sph_comm_rec {
    int64_t w[SPH_REC_WORDS];
} sph_comm_rec;

/* Encodes cfg (may be NULL: flagged, still a valid record to send). out_ok = 0 flags a NULL
 * output pointer so that the other ranks learn about it instead of hanging. */
void sph_comm_rec_encode(const sph_comm_config *cfg, int out_ok, sph_comm_rec *rec);

/* The verdict over n records in world-rank order. world = 0: the records are one TP group
 * (n must equal tp); world = 1: n must equal tp * cp * dp. Checks, in order, for each rank:
 * the protocol tag, local argument faults and value domains (tp, cp, dp >= 1, vocab_total
 * >= 1, vocab_local >= 1, a float input dtype, temperature finite and > 0), then agreement
 * with rank 0 on tp, cp, dp, vocab_total, dtype, temperature, then the group size, then that
 * each TP group's shards tile [0, vocab_total) exactly in rank order and that every TP group
 * holds the same shards. Returns SPH_OK, SPH_ERR_INVALID_ARG (a bad value on some rank) or
 * SPH_ERR_MISMATCH (ranks disagree); the message names the first offending rank and field. */
sph_status sph_comm_check_records(const sph_comm_rec *recs, int64_t n, int world);

// ---- a group's agreement on one call ------------------------------------------------------

/* Word 0 of a call record from a rank whose own validation failed: the others fail with it
 * instead of waiting in a collective it never joins. */
#define SPH_AGREE_INVALID INT64_C(0x4c41564e49505450)

/* A verdict over the gathered call records (n ranks of `words` int64 each, rank-major), run
 * identically on every rank: the same status and message everywhere. */
typedef sph_status (*sph_agree_verdict)(const int64_t *all, int64_t n, size_t words, void *arg);

/* One exchange of call records over comm: this rank's `mine` (words int64; word 0 is
 * SPH_AGREE_INVALID when local failed) allgathered in rank order (host buffers; a device
 * communicator's through a staging buffer in ctx's device memory, synchronously), then
 * verdict(arg) when local is SPH_OK. Returns local with this rank's own message when it
 * failed; the exchange's failure prefixed "<who>: tensor-parallel consistency check: ";
 * else the verdict. A rank without host memory for the records fails at once (the others
 * then fail in their collective). */
sph_status sph_comm_agree(sph_ctx_t ctx, sph_comm_t comm, const int64_t *mine, size_t words,
                          sph_status local, const char *who, sph_agree_verdict verdict,
                          void *arg);

/* Verdict helpers over the gathered records: the first rank whose word `at` is not `tag`
 * (-1: none); the first (rank >= 1, word in [from, to)) in rank-major order where a rank's
 * word differs from rank 0's (1 with *rank and *word set, 0 when all agree). */
int64_t sph_agree_first_tag(const int64_t *all, int64_t n, size_t words, size_t at, int64_t tag);
int sph_agree_first_diff(const int64_t *all, int64_t n, size_t words, size_t from, size_t to,
                         int64_t *rank, size_t *word);

#ifdef __cplusplus
}
#endif
#endif
