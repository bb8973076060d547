/*
 * test_distill_mpi.c - the fused distillation loss under mpirun (2 or 4 ranks): the world is
 * one tensor-parallel group (vocabulary shards, MPI communicator), every rank holding the same
 * rows and its shard of weight and teacher_weight. Every rank must get bitwise the same loss,
 * close to the single-process float64 reference of the whole problem; dweight is the rank's
 * rows of the reference's, dhidden (all-reduced) the reference's. Every kind, dense and sparse
 * teachers (listed ids on every rank), masks, reductions (none with dloss), several chunks.
 * Also: ranks that disagree on beta fail together with SPH_ERR_MISMATCH; and CP (check_cp):
 * the rows split over a seq_comm group of 2 ranks (x TP 2 with 4 ranks), the ranks' losses
 * and gradients adding up to the one-process mean's.
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
    if (dense && kind == SPH_DISTILL_JSD) dc_ttrows(&c, &r, 0.4, 2.5); /* the teacher's, per row */
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

/* CP under MPI: the world as C = 2 sequence-group ranks x T = size / 2 vocabulary shards
 * (world rank = cp * T + tp). Rank (cp, tp) holds rows [N cp / 2, N (cp + 1) / 2) and shard tp;
 * its seq_comm is the ranks of its tp (MPI), so reduction mean divides by the active rows of
 * all N rows: the cp ranks' losses summed, dhidden rows concatenated and dweight summed must
 * be the one-process float64 reference's. */
static void check_cp(uint64_t seed, int dense, int kind, int red) {
    if (mt_size % 2) return;
    const int64_t C = 2, T = mt_size / 2, cp = mt_rank / T, tp = mt_rank % T;
    sph_rng r;
    rng_seed(&r, seed);
    dcase f;
    dc_init(&f, &r, 17, 7, 31, 5, 6, SPH_F32, dense, DC_PAD);
    dc_mask(&f, &r, 0.6);
    f.kind = kind, f.beta = 0.4, f.red = red;
    if (dense && kind != SPH_DISTILL_FORWARD_KL) dc_ttrows(&f, &r, 0.4, 2.5);
    dexp x;
    dc_wire(&f, DC_DH | DC_DW | DC_DLOSS);
    dc_expect(&f, &x);
    const int64_t r0 = f.N * cp / C, r1 = f.N * (cp + 1) / C, n = r1 - r0;
    dcase c = f;
    c.N = n, c.h = (float *)f.h + r0 * f.H;
    if (dense) c.th = (float *)f.th + r0 * f.HT;
    else c.ids = f.ids + r0 * f.K, c.lp = f.lp + r0 * f.K;
    c.mask = f.mask + r0, c.dloss = f.dloss + r0;
    c.ttrows = f.ttrows ? f.ttrows + r0 : NULL;
    c.v0 = f.V * tp / T, c.V_loc = f.V * (tp + 1) / T - c.v0;
    c.loss = malloc((size_t)n * 4), c.dh = malloc((size_t)(n * f.H) * 4);
    c.dw = malloc((size_t)(c.V_loc * f.H) * 4);
    dc_wire(&c, DC_DH | DC_DW | DC_DLOSS);
    c.a.allreduce_dhidden = T > 1;
    dc_poison(&c);
    MPI_Comm tpm, cpm;
    MPI_Comm_split(MPI_COMM_WORLD, (int)cp, (int)tp, &tpm);
    MPI_Comm_split(MPI_COMM_WORLD, (int)tp, (int)cp, &cpm);
    sph_comm_t tpc = NULL, sqc = NULL;
    sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
    cfg.tp = T, cfg.vocab_total = f.V, cfg.vocab_start = c.v0, cfg.vocab_local = c.V_loc;
    if (T > 1) MT_OK(sph_comm_create_mpi(&tpc, &tpm, &cfg));
    /* the sequence group's own configuration: a placeholder one-id "shard" per rank */
    sph_comm_config sc = SPH_COMM_CONFIG_INIT;
    sc.tp = C, sc.vocab_total = C, sc.vocab_start = cp, sc.vocab_local = 1;
    MT_OK(sph_comm_create_mpi(&sqc, &cpm, &sc));
    c.d.seq_comm = sqc;
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.num_threads = 1, o.tp_comm = tpc, o.chunk_rows = 3;
    sph_ctx_t ctx = NULL;
    MT_OK(sph_ctx_create(&ctx, &o));
    size_t bytes = 0;
    sph_distill_loss_workspace_size(ctx, &c.a, &c.d, &bytes);
    void *ws = malloc(bytes + 1);
    const sph_status st = sph_distill_loss(ctx, &c.a, &c.d, ws, bytes);
    free(ws);
    MT_CHECK(st == SPH_OK, "cp distill_loss: %s", sph_last_error());
    /* every rank: the group's results at tp 0 of each cp, summed / placed in float64 */
    const int none = red == SPH_REDUCTION_NONE;
    double *loss = calloc((size_t)f.N, 8), *dh = calloc((size_t)(f.N * f.H), 8);
    double *dw = calloc((size_t)(f.V * f.H), 8), mine = none ? 0 : c.loss[0], tot = 0;
    for (int64_t i = 0; none && i < n; i++) loss[r0 + i] = c.loss[i];
    for (int64_t e = 0; tp == 0 && e < n * f.H; e++) dh[r0 * f.H + e] = c.dh[e];
    for (int64_t e = 0; e < c.V_loc * f.H; e++) dw[c.v0 * f.H + e] = c.dw[e];
    if (tp) mine = 0;
    if (tp) memset(loss, 0, (size_t)f.N * 8);
    MPI_Allreduce(MPI_IN_PLACE, loss, (int)f.N, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, dh, (int)(f.N * f.H), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, dw, (int)(f.V * f.H), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &tot, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    float *lf = malloc((size_t)f.N * 4), *hf = malloc((size_t)(f.N * f.H) * 4);
    float *wf = malloc((size_t)(f.V * f.H) * 4), tf = (float)tot;
    for (int64_t i = 0; i < f.N; i++) lf[i] = (float)loss[i];
    for (int64_t e = 0; e < f.N * f.H; e++) hf[e] = (float)dh[e];
    for (int64_t e = 0; e < f.V * f.H; e++) wf[e] = (float)dw[e];
    MT_CHECK(none ? close_all(lf, x.rows, (size_t)f.N, 2e-5) : close_all(&tf, &x.red, 1, 2e-5),
             "cp: the ranks' losses vs the one-process reference (kind %d dense %d red %d)",
             kind, dense, red);
    MT_CHECK(close_all(hf, x.dh, (size_t)(f.N * f.H), 2e-5), "cp: dhidden vs the reference");
    MT_CHECK(close_all(wf, x.dw, (size_t)(f.V * f.H), 2e-5),
             "cp: dweight summed over the cp ranks vs the reference");
    free(loss), free(dh), free(dw), free(lf), free(hf), free(wf);
    sph_ctx_destroy(ctx);
    sph_comm_destroy(tpc), sph_comm_destroy(sqc);
    MPI_Comm_free(&tpm), MPI_Comm_free(&cpm);
    free(c.loss), free(c.dh), free(c.dw);
    dc_expect_free(&x);
    dc_free(&f);
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
    for (int dense = 0; dense <= 1; dense++)
        for (int k = 0; k < 3; k++)
            check_cp(seed + 100 + (uint64_t)(3 * dense + k), dense, kinds[k],
                     k == 2 ? SPH_REDUCTION_NONE : k == 1 ? SPH_REDUCTION_SUM : SPH_REDUCTION_MEAN);
    check_cp(seed + 200, 0, SPH_DISTILL_JSD, SPH_REDUCTION_MEAN);
    return mt_finish("test_distill_mpi");
}
