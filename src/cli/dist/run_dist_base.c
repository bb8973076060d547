/*
 * run_dist_base.c - what every file of the distributed runner shares (run_dist.h), with MPI:
 * this rank's place, its failure message and the ranks' agreement on a verdict. Kept apart from the runner
 * (run_dist_main.c) so that its steps (run_dist_batch.c, run_dist_head.c, run_dist_check.c) and the
 * policy runner use them without a circle through the runner.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"
#include "run_dist.h"

#ifdef SPH_HAVE_MPI
#include <mpi.h>

/* ---- ranks -------------------------------------------------------------------------------- */

int dist_rank, dist_size;

int dist_fail(const char *fmt, ...) {
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "spanhead run [rank %d]: ", dist_rank);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 0;
}

int dist_agree(int ok) {
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all;
}

const char *const dist_field_names[NF] = {"logprob", "entropy", "lse", "logit_mean"};

#else
/* without MPI the file holds nothing; ISO C wants a declaration in every translation unit */
typedef int sph_run_dist_base_no_mpi;
#endif /* SPH_HAVE_MPI */
