/*
 * run_dist_base.c - what every file of the distributed runner shares (run_dist.h): whether a
 * `spanhead run` is a distributed one (sph_cli_run_wants_dist), and, with MPI, this rank's
 * place, its failure message and the ranks' agreement on a verdict. Kept apart from the runner
 * (run_dist_main.c) so that its steps (run_dist_batch.c, run_dist_head.c, run_dist_check.c) and the
 * policy runner use them without a circle through the runner.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"
#include "run_dist.h"

int sph_cli_run_wants_dist(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) break;
        if (!strncmp(a, "--tp", 4) || !strncmp(a, "--cp", 4) || !strncmp(a, "--dp", 4))
            if (a[4] == '\0' || a[4] == '=') return 1;
    }
    /* started by mpirun / mpiexec with several ranks */
    static const char *const env[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", NULL};
    for (int k = 0; env[k]; k++) {
        const char *v = getenv(env[k]);
        if (v && atoi(v) > 1) return 1;
    }
    return 0;
}

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

#endif /* SPH_HAVE_MPI */
