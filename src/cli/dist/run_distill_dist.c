/*
 * run_distill_dist.c - `mpirun -np T spanhead run --tp T --distill ... --inputs DIR`: the fused
 * distillation loss over a tensor-parallel group, checked against one process.
 *
 *   0. The ranks' agreement (dist_agree.c), the first collective of every distributed path:
 *      a rank on another path, a usage error or any option that differs ends every rank
 *      before any work, each printing the option's name.
 *   1. Every rank reads --inputs itself (the same files); the ranks agree on every phase (one
 *      all-reduce), so a failure anywhere ends every rank with its code.
 *   2. TP: the world is one group; rank t holds weight and teacher_weight rows
 *      [V t / T, V (t + 1) / T) (MPI communicator; CPU only); dhidden is all-reduced.
 *   3. Rank 0 gathers: every rank's loss must be bitwise the same (checked), dweight shards
 *      concatenated; --check compares with the single-process float64 reference; --outputs
 *      writes what one process writes.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msg.h"
#include "num.h"
#include "run_dist.h"
#include "run_distill.h"
#include "run_loss.h"

#define CMD "run"

/* Under mpirun (or with --tp; cmd_run.c): every verdict, a usage error or --help included,
 * goes to the ranks' agreement instead of ending this rank alone. */
int sph_cli_run_distill_main_dist(int argc, char **argv) {
    dst_opts o;
    dst_opts_defaults(&o);
    sph_cli_parsed pp = {0};
    char msg[480] = "";
    int rc = sph_cli_parse(sph_cli_distill_opts, argc, argv, &o, &pp, msg, sizeof msg);
    if (rc == 0) {
        o.dtype_given = sph_cli_given(sph_cli_distill_opts, &pp, "--dtype");
        o.temperature_given = sph_cli_given(sph_cli_distill_opts, &pp, "--temperature");
        if (!o.inputs) rc = 2 * sph_cli_err(msg, sizeof msg, "--distill needs --inputs DIR");
    }
    return sph_cli_run_distill_dist(&o, rc, msg, argc, argv);
}

#ifndef SPH_HAVE_MPI

int sph_cli_run_distill_dist(const dst_opts *o, int rc, const char *msg, int argc, char **argv) {
    (void)o, (void)argc, (void)argv;
    return dist_loss_no_mpi(rc, msg, dst_usage, "--tp");
}

#else
#include <mpi.h>

int sph_cli_run_distill_dist(const dst_opts *o, int verdict, const char *msg, int argc,
                             char **argv) {
    int v = dist_loss_begin(SPH_CLI_PATH_DISTILL, sph_cli_distill_opts, o, verdict, msg, argc,
                            argv, dst_usage);
    if (v >= 0) return v;
    const int64_t T = o->tp;
    int rc = 1, ok = 1;
    dst_problem p;
    dst_result r, ref;
    memset(&p, 0, sizeof p), memset(&r, 0, sizeof r), memset(&ref, 0, sizeof ref);
    sph_cli_outset os;
    memset(&os, 0, sizeof os);
    sph_comm_t tpc = NULL;
    float *dw = NULL, *losses = NULL;
    int *counts = NULL, *displs = NULL;
    if (T != dist_size || o->device == 1) {
        if (!dist_rank) {
            if (o->device == 1)
                sph_cli_fail(CMD, 2, "--distill with --tp: the CLI's TP runner is CPU only "
                                     "(--device cuda takes one process; the library's CUDA "
                                     "backend takes an NCCL tp_comm)");
            else
                sph_cli_fail(CMD, 2, "--tp %lld needs %lld ranks, but mpirun started %d (mpirun "
                                     "-np %lld)", (long long)T, (long long)T, dist_size, (long long)T);
        }
        rc = 2;
        goto out;
    }
    /* 1. the problem: every rank reads it; rank 0 begins the output set before any work */
    ok = dst_problem_read(o, &p) == 0;
    if (ok && !dist_rank && o->outputs && sph_cli_outset_begin(&os, o->outputs, dst_out_files))
        ok = dist_fail("%s", os.err);
    if (!dist_agree(ok)) goto out;
    /* 2. the group and the rank's call */
    const int64_t v0 = p.V * dist_rank / T, v1 = p.V * (dist_rank + 1) / T;
    if (T > 1) {
        sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
        cfg.tp = T, cfg.vocab_total = p.V, cfg.vocab_start = v0, cfg.vocab_local = v1 - v0;
        cfg.dtype = p.bits == 32 ? SPH_F32 : (p.is_bf16 ? SPH_BF16 : SPH_F16);
        cfg.temperature = o->temperature;
        MPI_Comm world = MPI_COMM_WORLD;
        if (sph_comm_create_mpi(&tpc, &world, &cfg))
            ok = dist_fail("TP communicator: %s", sph_last_error());
    }
    if (!dist_agree(ok)) goto out;
    dst_where w = {0, o->kernel, o->threads, (int)o->repeats, tpc, v0, v1 - v0};
    if (!dist_agree(dst_run(o, &p, &w, &r) == 0)) goto out;
    /* 3. every rank's loss the same bits; dweight's shards to rank 0 */
    const int nl = o->red == 2 ? (int)p.N : 1;
    losses = dist_rank ? NULL : sph_cli_alloc((int64_t)dist_size * (nl ? nl : 1), 4);
    MPI_Gather(r.loss, nl, MPI_FLOAT, losses, nl, MPI_FLOAT, 0, MPI_COMM_WORLD);
    if (!dist_rank) {
        counts = sph_cli_alloc(dist_size, sizeof(int)), displs = sph_cli_alloc(dist_size, sizeof(int));
        dw = sph_cli_alloc(p.V * p.H, 4);
        for (int k = 0; counts && displs && k < dist_size; k++) {
            const int64_t a = p.V * k / T, b = p.V * (k + 1) / T;
            counts[k] = (int)((b - a) * p.H), displs[k] = (int)(a * p.H);
        }
        ok = losses && counts && displs && dw;
        for (int k = 1; ok && k < dist_size; k++)
            if (memcmp(losses + (size_t)k * nl, losses, (size_t)nl * 4))
                ok = dist_fail("rank %d's loss differs from rank 0's (every rank of the TP group must "
                          "hold the same bits)", k);
    }
    MPI_Gatherv(r.dw, (int)((v1 - v0) * p.H), MPI_FLOAT, dw, counts, displs, MPI_FLOAT, 0,
                MPI_COMM_WORLD);
    if (!dist_agree(ok)) goto out;
    int passed = 1;
    if (!dist_rank) {
        free(r.dw);
        r.dw = dw, dw = NULL; /* the whole vocabulary's rows from here on */
        double err[3] = {0}, tol = 0;
        if (o->check) {
            dst_where wr = {0, "ref", 1, 0, NULL, 0, 0};
            ok = dst_run(o, &p, &wr, &ref) == 0;
            if (ok) {
                tol = p.bits == 32 ? 1e-4 : 1e-4;
                err[0] = run_loss_rel(r.loss, ref.loss, nl, 1e-6);
                err[1] = run_loss_rel(r.dh, ref.dh, p.N * p.H, 1e-30);
                err[2] = run_loss_rel(r.dw, ref.dw, p.V * p.H, 1e-30);
                passed = err[0] <= tol && err[1] <= tol && err[2] <= tol;
            }
        }
        if (ok) {
            dst_report(o, &p, &r, o->check, passed, err, tol);
            if (!o->json) printf("  tensor parallel: %lld ranks (vocabulary shards), the same loss "
                                 "bits on every rank\n", (long long)T);
            if (passed && o->outputs) ok = dst_write_outputs(&os, o, &p, &r) == 0;
        }
    }
    int res[2] = {ok, passed};
    MPI_Bcast(res, 2, MPI_INT, 0, MPI_COMM_WORLD);
    rc = !res[0] ? 1 : (res[1] ? 0 : 1);
out:
    sph_cli_outset_abort(&os);
    sph_comm_destroy(tpc);
    dst_problem_free(&p);
    dst_result_free(&r), dst_result_free(&ref);
    free(dw), free(losses), free(counts), free(displs);
    MPI_Finalize();
    return sph_cli_close_stdout(CMD, rc);
}

#endif
