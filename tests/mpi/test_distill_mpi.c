/*
 * test_distill_mpi.c - the fused distillation loss under mpirun (2 or 4 ranks): the world is
 * one tensor-parallel group (vocabulary shards, MPI communicator), every rank holding the same
 * rows and its shard of weight and teacher_weight. Every rank must get bitwise the same loss,
 * close to the single-process float64 reference of the whole problem; dweight is the rank's
 * rows of the reference's, dhidden (all-reduced) the reference's. Every kind, dense and sparse
 * teachers (listed ids on every rank), masks, reductions (none with dloss), several chunks.
 * Also: ranks that disagree on beta fail together with SPH_ERR_MISMATCH.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mpitest.h"
#include "parity/test_distill_case.h"

static double maxabs(const double *x, size_t n) {
    double m = 0;
    for (size_t k = 0; k < n; k++) m = fabs(x[k]) > m ? fabs(x[k]) : m;
    return m;
}

static int close_all(const float *got, const double *ref, size_t n, double tol) {
    const double s = maxabs(ref, n);
    for (size_t k = 0; k < n; k++)
        if (!(fabs(got[k] - ref[k]) <= tol * (s + fabs(ref[k])) + 1e-9)) return 0;
    return 1;
}

static void check(uint64_t seed, int dense, int kind, double beta, int red, int64_t chunk,
                  double beta_rank1) {
    sph_rng r;
    rng_seed(&r, seed);
    dcase c;
    dc_init(&c, &r, 19, 9, 37, 7, 6, SPH_F32, dense, DC_PAD);
    dc_mask(&c, &r, 0.7);
    c.kind = kind, c.beta = beta, c.red = red;
    dexp x;
    dc_wire(&c, DC_DH | DC_DW | DC_DLOSS); /* the whole problem (its dloss), before the shard */
    dc_expect(&c, &x);
    const int64_t v0 = c.V * mt_rank / mt_size, v1 = c.V * (mt_rank + 1) / mt_size;
    c.v0 = v0, c.V_loc = v1 - v0;
    dc_wire(&c, DC_DH | DC_DW | DC_DLOSS);
    c.a.allreduce_dhidden = 1;
    if (mt_rank == 1 && beta_rank1 >= 0) c.d.beta = beta_rank1;
    dc_poison(&c);
    sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
    cfg.tp = mt_size, cfg.vocab_total = c.V, cfg.vocab_start = v0, cfg.vocab_local = v1 - v0;
    cfg.dtype = SPH_F32;
    sph_comm_t comm = NULL;
    int64_t a, b, d;
    MT_OK(sph_comm_create_mpi_world(&comm, &cfg, &a, &b, &d));
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.num_threads = 1, o.tp_comm = comm, o.chunk_rows = chunk;
    sph_ctx_t ctx = NULL;
    MT_OK(sph_ctx_create(&ctx, &o));
    size_t bytes = 0;
    sph_distill_loss_workspace_size(ctx, &c.a, &c.d, &bytes); /* every rank enters the call */
    void *ws = malloc(bytes + 1);
    const sph_status st = sph_distill_loss(ctx, &c.a, &c.d, ws, bytes);
    free(ws);
    const int nl = red == SPH_REDUCTION_NONE ? (int)c.N : 1;
    if (beta_rank1 >= 0) {
        MT_CHECK(st == SPH_ERR_MISMATCH, "disagreeing ranks: status %d (%s), expected mismatch",
                 (int)st, sph_last_error());
    } else {
        MT_CHECK(st == SPH_OK, "distill_loss: %s", sph_last_error());
        float *all = malloc((size_t)(nl * mt_size) * 4);
        MPI_Allgather(c.loss, nl, MPI_FLOAT, all, nl, MPI_FLOAT, MPI_COMM_WORLD);
        for (int k = 0; k < mt_size; k++)
            MT_CHECK(!memcmp(all + k * nl, c.loss, (size_t)nl * 4),
                     "rank %d's loss differs from this rank's (bits)", k);
        free(all);
        MT_CHECK(close_all(c.loss, red == SPH_REDUCTION_NONE ? x.rows : &x.red, (size_t)nl, 2e-5),
                 "loss vs the reference (kind %d dense %d red %d)", kind, dense, red);
        MT_CHECK(close_all(c.dh, x.dh, (size_t)(c.N * c.H), 2e-5), "dhidden vs the reference");
        MT_CHECK(close_all(c.dw, x.dw + v0 * c.H, (size_t)(c.V_loc * c.H), 2e-5),
                 "dweight vs the reference's rows [%lld, %lld)", (long long)v0, (long long)v1);
    }
    sph_ctx_destroy(ctx);
    sph_comm_destroy(comm);
    dc_expect_free(&x);
    dc_free(&c);
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    uint64_t seed = test_seed();
    MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    const int kinds[5] = {SPH_DISTILL_FORWARD_KL, SPH_DISTILL_REVERSE_KL, SPH_DISTILL_JSD,
                          SPH_DISTILL_JSD, SPH_DISTILL_JSD};
    const double betas[5] = {0.5, 0.5, 0.35, 0.0, 1.0};
    int n = 0;
    for (int dense = 0; dense <= 1; dense++)
        for (int k = 0; k < 5; k++, n++)
            check(seed + (uint64_t)n, dense, kinds[k], betas[k], n % 3, n % 2 ? 4 : 0, -1);
    check(seed, 0, SPH_DISTILL_JSD, 0.5, 0, 0, 0.25);
    return mt_finish("test_distill_mpi");
}
