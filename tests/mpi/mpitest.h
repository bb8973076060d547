/*
 * mpitest.h - a minimal harness for tests run under mpirun: every rank checks its own
 * results, failures print with the rank, and the verdict is all-reduced so that every rank
 * exits with the same code (0 pass, 1 fail). No cmocka here: its runner is per-process and
 * would let ranks disagree about which test they are in.
 */
#ifndef SPH_MPITEST_H
#define SPH_MPITEST_H

#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "spanhead.h"

static int mt_rank, mt_size, mt_fail;

#define MT_CHECK(cond, ...)                                                                   \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "[rank %d] %s:%d: check failed: %s: ", mt_rank, __FILE__,         \
                    __LINE__, #cond);                                                         \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fputc('\n', stderr);                                                              \
            mt_fail++;                                                                        \
        }                                                                                     \
    } while (0)

/* The call must return status s on this rank, with needle (if any) in the message. */
#define MT_EXPECT(call, s, needle)                                                            \
    do {                                                                                      \
        sph_status mt_st_ = (call);                                                           \
        const char *mt_msg_ = sph_last_error();                                               \
        MT_CHECK(mt_st_ == (s), "%s returned %d (%s), expected %d; message: %s", #call,       \
                 (int)mt_st_, sph_status_str(mt_st_), (int)(s), mt_msg_);                     \
        const char *mt_needle_ = (needle);                                                    \
        if (mt_needle_ && mt_st_ != SPH_OK)                                                   \
            MT_CHECK(strstr(mt_msg_, mt_needle_) != NULL, "message '%s' lacks '%s'", mt_msg_, \
                     mt_needle_);                                                             \
    } while (0)

#define MT_OK(call) MT_EXPECT(call, SPH_OK, (const char *)NULL)

static inline void mt_init(int *argc, char ***argv) {
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &mt_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mt_size);
}

/* All-reduces the failure count; returns the exit code. */
static inline int mt_finish(const char *name) {
    int total = 0;
    MPI_Allreduce(&mt_fail, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (mt_rank == 0)
        printf("%s (%d ranks): %s (%d failed checks)\n", name, mt_size, total ? "FAIL" : "PASS",
               total);
    MPI_Finalize();
    return total ? 1 : 0;
}

#endif
