/*
 * test_comm_noinit_np1.c - the library never initializes MPI: creating an MPI communicator
 * before MPI_Init or after MPI_Finalize is SPH_ERR_MPI with a message saying so, and nothing
 * crashes. Runs as one plain process (no launcher); singleton MPI_Init starts MPI itself.
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "spanhead.h"

static int fails;

static void expect(sph_status got, sph_status want, const char *needle, const char *what) {
    const char *msg = sph_last_error();
    if (got != want || !strstr(msg, needle)) {
        fprintf(stderr, "%s: status %d (%s), expected %d with '%s'; message: %s\n", what,
                (int)got, sph_status_str(got), (int)want, needle, msg);
        fails++;
    }
}

int main(int argc, char **argv) {
    sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
    cfg.vocab_total = cfg.vocab_local = 10;
    sph_comm_t c = NULL;
    MPI_Comm w = MPI_COMM_WORLD;
    int init = 1;
    expect(sph_comm_create_mpi(&c, &w, &cfg), SPH_ERR_MPI, "MPI is not initialized",
           "create_mpi before MPI_Init");
    expect(sph_comm_create_mpi_world(&c, &cfg, NULL, NULL, NULL), SPH_ERR_MPI,
           "MPI is not initialized", "create_mpi_world before MPI_Init");
    MPI_Initialized(&init);
    if (init) {
        fprintf(stderr, "spanhead initialized MPI behind the caller's back\n");
        fails++;
    }
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
        printf("skipped: singleton MPI_Init failed here\n");
        return 77;
    }
    /* A good communicator in between, to show the same process can use one. */
    w = MPI_COMM_WORLD;
    expect(sph_comm_create_mpi(&c, &w, &cfg), SPH_OK, "", "create_mpi after MPI_Init");
    MPI_Finalize();
    /* Destroying after MPI_Finalize must not call into MPI (erroneous then). */
    sph_comm_destroy(c);
    c = NULL;
    expect(sph_comm_create_mpi(&c, &w, &cfg), SPH_ERR_MPI, "MPI is already finalized",
           "create_mpi after MPI_Finalize");
    printf("test_comm_noinit: %s\n", fails ? "FAIL" : "PASS");
    return fails ? 1 : 0;
}
