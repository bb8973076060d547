/*
 * run_dist_base.c - what every file of the MPI harness shares (run_dist.h): this rank's
 * place, its failure message, the ranks' agreement on a verdict, its GPU, and the start of a
 * loss's distributed form (with MPI; without it, the losses' stub). Kept apart from the head's
 * runner (run_dist_main.c) so that its steps (run_dist_batch.c, run_dist_head.c,
 * run_dist_check.c) and the losses' runners use them without a circle through the runner.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msg.h"
#include "run.h"
#include "run_dist.h"

int dist_loss_no_mpi(int rc, const char *msg, void (*usage)(FILE *f), const char *needs) {
    if (rc == SPH_CLI_HELP) {
        usage(stdout);
        return 0;
    }
    if (rc) return sph_cli_fail("run", rc, "%s", msg);
    return sph_cli_fail("run", 1, "%s needs MPI, and this spanhead was built without it "
                                  "(install Open MPI and reconfigure)", needs);
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

int dist_loss_begin(int path, const sph_cli_opt *table, const void *opts, int verdict,
                    const char *msg, int argc, char **argv, void (*usage)(FILE *f)) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited && MPI_Init(NULL, NULL) != MPI_SUCCESS)
        return sph_cli_fail("run", 1, "MPI_Init failed");
    MPI_Comm_rank(MPI_COMM_WORLD, &dist_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &dist_size);
    /* step 0, the same first collective as the head runner's: path, verdicts, arguments */
    const int v = sph_cli_dist_agree(path, table, opts, verdict, msg, NULL, argc, argv);
    if (!v) return -1;
    if (v == SPH_CLI_HELP && !dist_rank) usage(stdout);
    MPI_Finalize();
    return v == SPH_CLI_HELP ? 0 : v;
}

int dist_cuda_device(int *dev_id, sph_ctx_t *hold) {
    MPI_Comm node;
    int local = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, dist_rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    const int n_dev = sph_cuda_device_count();
    *dev_id = n_dev > 0 ? local % n_dev : 0;
    if (n_dev <= 0) return dist_fail("--device cuda: no CUDA device visible to this rank");
    if (!hold) return 1;
    sph_ctx_opts co = SPH_CTX_OPTS_INIT;
    co.device = (sph_device){SPH_DEVICE_CUDA, *dev_id};
    if (sph_ctx_create(hold, &co))
        return dist_fail("--device cuda: device %d: %s", *dev_id, sph_last_error());
    return 1;
}

const char *const dist_field_names[NF] = {"logprob", "entropy", "lse", "logit_mean"};

#else
/* without MPI the file holds nothing; ISO C wants a declaration in every translation unit */
typedef int sph_run_dist_base_no_mpi;
#endif /* SPH_HAVE_MPI */
