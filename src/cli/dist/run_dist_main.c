/*
 * run_dist_main.c - `spanhead run --tp T --cp C --dp D` under `mpirun -np T*C*D`: the LM head
 * split the way a trainer splits it, checked against one process.
 *
 * World rank w = ((dp_rank * C) + cp_rank) * T + tp_rank (sph_comm_create_mpi_world's layout).
 *
 *   0. Every rank parses its own arguments; the ranks' agreement (dist_agree.c, the first
 *      collective of the policy runner too) compares every rank's path, verdict and a hash of
 *      each parsed option, so a usage error on any rank, or ranks started with different
 *      arguments (an MPMD command line, --help on one rank, --policy-loss on some ranks only)
 *      ends every rank with the same message, naming the option, and exit code before any
 *      work; nothing can leave a rank waiting.
 *   1. Rank 0 builds a global batch (or reads it with --inputs DIR): ragged sequences of
 *      lengths L_k concatenated into R rows, hidden (R, H), weight (V, H), targets (R) (row s
 *      of a sequence predicts its token s+1; -100 = ignored), a loss mask (R), upstream
 *      gradients dlogprob, dentropy, dlse, dlogit_mean (R) and, for sample-support runs,
 *      candidates (R, K). The batch is broadcast to every rank (run_dist_batch.c).
 *   2. Every rank packs the sequence lengths into bins the same way (sph_pack with the
 *      alignment of (T, C) and bin_multiple = D); DP rank d takes the d-th contiguous block of
 *      n_bins / D bins, each bin one micro-batch.
 *   3. A bin is laid out with the packed segment layout (sph_layout_packed): each sequence
 *      padded to the sequence alignment, the last grown to the total alignment; padding rows
 *      are inactive (target -1, zero hidden, zero upstream gradient).
 *   4. CP rank r keeps, of every segment of padded length P, chunk r and chunk 2C-1-r of
 *      P/(2C) rows (sph_cp_local_rows); its loss mask gives its spans (sph_spans_from_mask).
 *   5. TP rank t holds weight rows [v0, v0 + V_loc) of an even split of V, and runs forward
 *      (logprob, entropy, lse, logit_mean, stats; one allgather per forward combines the
 *      softmax partials) and backward (dhidden all-reduced over the TP group, dweight
 *      accumulated over the bins) through the public head API with the TP communicator (MPI
 *      on the CPU, NCCL with --device cuda: one GPU per rank, local rank mod the device
 *      count) (run_dist_head.c).
 *   6. Results are gathered to rank 0: per-row outputs by global row (and every TP rank's
 *      copy must equal TP rank 0's bit for bit: the combine runs in rank order), dhidden
 *      (summed over TP), dweight (concatenated over TP, summed over CP and DP in float64).
 *   7. Rank 0 runs the single-process reference (force_kernel "ref", no communicator) on the
 *      global batch and prints max errors and PASS/FAIL; --outputs DIR writes the gathered
 *      global outputs as a single-process `spanhead run --outputs` does: logprob, entropy,
 *      lse, logit_mean (R; logit_mean not with candidates), dhidden (R, H), dweight (V, H),
 *      all of them or none, and only when the check passed (run_dist_check.c).
 *
 * Every phase ends with an agreement (an all-reduce of "did it work") so that a failure on one
 * rank ends every rank with the same exit code instead of a hang.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msg.h"
#include "run.h"
#include "run_dist.h"

#ifndef SPH_HAVE_MPI

int sph_cli_run_dist(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return sph_cli_fail("run", 1, "--tp/--cp/--dp (or a run under mpirun with several ranks) "
                                  "need MPI, and this spanhead was built without it (install "
                                  "Open MPI and reconfigure)");
}

#else
#include <mpi.h>


/* options: sph_cli_dist_opts (opts.c) */

static const char k_synopsis[] =
    "usage: mpirun -np T*C*D spanhead run --tp T --cp C --dp D [options]";
static const char k_about[] =
    "Splits a global batch the way a trainer does (DP-aligned bins, packed segment layout,\n"
    "CP-local rows, TP vocab shards), runs forward + backward on every rank and compares the\n"
    "gathered results with the single-process float64 reference on rank 0. Every rank must\n"
    "be given the same arguments: a usage error or a difference on any rank ends every rank\n"
    "with the same message before any work.";

/* ---- step 0: every rank parses, all ranks agree ------------------------------------------ */

/* Parses this rank's arguments and agrees with every other rank (dist_agree.c). Returns -1
 * to go on, else the exit code every rank returns (the message printed by every rank). */
static int parse_and_agree(int argc, char **argv, dopts *o) {
    char msg[480] = "";
    sph_cli_parsed pp = {0};
    int rc = sph_cli_parse(sph_cli_dist_opts, argc, argv, o, &pp, msg, sizeof msg);
    if (rc == 0 && o->max_len < o->min_len) {
        snprintf(msg, sizeof msg, "--max-len %lld: shorter than --min-len %lld",
                 (long long)o->max_len, (long long)o->min_len);
        rc = 2;
    }
    if (rc == 0) /* temperature, kernel: the library's verdict (opt_probe.c) */
        rc = sph_cli_probe_head("run", o->temperature, 0, 0, o->kernel, msg, sizeof msg);
    /* `spanhead run` without --tp/--cp/--dp under a multi-rank launch lands here too */
    static const char *const dist_names[] = {"--tp", "--cp", "--dp", NULL};
    const sph_cli_opt *const table[] = {sph_cli_dist_opts};
    int given[3];
    sph_cli_scan(table, 1, argc, argv, dist_names, given);
    const char *hint = given[0] || given[1] || given[2] ? NULL : " (started by mpirun with several ranks, this is the "
                                          "distributed runner: spanhead run --tp 1 --help)";
    int v = sph_cli_dist_agree(SPH_CLI_PATH_HEAD, sph_cli_dist_opts, o, rc, msg, hint, argc, argv);
    if (v == SPH_CLI_HELP) {
        if (dist_rank == 0) sph_cli_usage(stdout, k_synopsis, k_about, sph_cli_dist_opts, SPH_CLI_EXIT_STATUS);
        return 0;
    }
    if (v) return v;
    o->cuda = o->device == 1;
    o->bf16 = o->dtype == 1;
    o->masked = o->mask == DIST_MASK_RL;
    o->algo = (sph_pack_algo)o->pack;
    o->ref_device = o->reference == 1;
    o->dh_partial = o->dhidden == 1;
    o->check = !o->no_check;
    /* CPU kernels widen bf16 inputs once and compute in f32 (the single-process check's 1e-4);
     * only the GPU rounds dlogits to bf16 before its products */
    if (o->atol < 0) o->atol = o->bf16 && o->cuda ? 2e-2 : 1e-4;
    if (o->rtol < 0) o->rtol = o->bf16 && o->cuda ? 2e-2 : 1e-4;
    return -1;
}

/* ---- the command -------------------------------------------------------------------------- */

/* The TP communicator of this rank (MPI on the CPU, NCCL over the TP group's MPI communicator
 * *tpc with --device cuda), checked against the runner's coordinates. Returns ok. */
static int make_comm(const dopts *o, const batch *b, int64_t v0, int64_t V_loc, int64_t tp_rank,
                     int64_t cp_rank, int64_t dp_rank, sph_comm_t *comm, MPI_Comm *tpc) {
    int ok = 1;
    sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
    cfg.tp = o->tp;
    cfg.cp = o->cp;
    cfg.dp = o->dp;
    cfg.vocab_total = b->V;
    cfg.vocab_start = v0;
    cfg.vocab_local = V_loc;
    cfg.dtype = b->bf16 ? SPH_BF16 : SPH_F32;
    cfg.temperature = b->temperature;
    sph_status cs;
    if (o->cuda) {
        /* The TP group's MPI communicator carries the NCCL unique id. */
        MPI_Comm_split(MPI_COMM_WORLD, (int)(dist_rank / o->tp), (int)tp_rank, tpc);
        cs = sph_comm_create_nccl_mpi(comm, tpc, &cfg);
    } else {
        int64_t t = -1, c = -1, dd = -1;
        cs = sph_comm_create_mpi_world(comm, &cfg, &t, &c, &dd);
        if (cs == SPH_OK && (t != tp_rank || c != cp_rank || dd != dp_rank))
            ok = dist_fail("communicator coordinates (%lld, %lld, %lld) differ from the runner's "
                           "(%lld, %lld, %lld)", (long long)t, (long long)c, (long long)dd,
                           (long long)tp_rank, (long long)cp_rank, (long long)dp_rank);
    }
    if (cs) ok = dist_fail("communicator: %s", sph_last_error());
    return ok;
}

/* Rank 0: the run, the batch and the layout, before the work. */
static void print_run(const dopts *o, const batch *b, const share *sh, sph_ctx_t ctx,
                      int64_t total_bins, int64_t padded_rows) {
    int64_t active = 0;
    for (int64_t i = 0; i < b->R; i++) active += b->mask[i];
    printf("run: tp=%lld cp=%lld dp=%lld device=%s (%s)\n", (long long)o->tp, (long long)o->cp,
           (long long)o->dp, o->cuda ? "cuda" : "cpu", sph_ctx_describe(ctx));
    printf("batch: %lld sequences, R=%lld rows (%lld active, %s), H=%lld V=%lld, dtype=%s, "
           "temperature=%g\n",
           (long long)b->n_seqs, (long long)b->R, (long long)active,
           b->masked ? "masked" : "dense", (long long)b->H, (long long)b->V,
           b->bf16 ? "bf16" : "f32", b->temperature);
    if (b->K) printf("support: K=%lld candidates per row\n", (long long)b->K);
    printf("layout: %lld bins (%lld per DP rank), rank 0 holds %lld local rows, %lld padded "
           "rows in its bins\n",
           (long long)total_bins, (long long)sh->n_bins, (long long)sh->n,
           (long long)padded_rows);
    fflush(stdout);
}

int sph_cli_run_dist(int argc, char **argv) {
    int inited = 0, we_init = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init(&argc, &argv) != MPI_SUCCESS)
            return sph_cli_fail("run", 1, "MPI_Init failed");
        we_init = 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &dist_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &dist_size);
    int rc = 1;
    dopts o = {.tp = 1, .cp = 1, .dp = 1, .seqs = 8, .min_len = 3, .max_len = 40, .H = 24,
               .V = 203, .temperature = 1.0, .atol = -1, .rtol = -1, .seed = 1};
    batch b;
    share sh;
    result res;
    memset(&b, 0, sizeof b);
    memset(&sh, 0, sizeof sh);
    memset(&res, 0, sizeof res);
    sph_comm_t comm = NULL;
    sph_ctx_t ctx = NULL, local_ctx = NULL;
    dev d = {NULL, 0};
    MPI_Comm tpc = MPI_COMM_NULL;
    sph_cli_outset os;
    memset(&os, 0, sizeof os);

    int p = parse_and_agree(argc, argv, &o);
    if (p >= 0) {
        rc = p;
        goto out;
    }
    if (o.tp * o.cp * o.dp != dist_size) { /* the same arguments on every rank: same verdict */
        if (dist_rank == 0)
            sph_cli_fail("run", 2, "--tp %lld --cp %lld --dp %lld needs %lld ranks, but "
                                   "mpirun started %d (mpirun -np %lld ...)",
                         (long long)o.tp, (long long)o.cp, (long long)o.dp,
                         (long long)(o.tp * o.cp * o.dp), dist_size,
                         (long long)(o.tp * o.cp * o.dp));
        rc = 2;
        goto out;
    }
    const int64_t tp_rank = dist_rank % o.tp, cp_rank = (dist_rank / o.tp) % o.cp,
                  dp_rank = dist_rank / (o.tp * o.cp);

    /* 1. the global batch */
    int ok0 = 1;
    if (dist_rank == 0) ok0 = o.inputs ? dist_batch_read(&o, &b) : dist_batch_synth(&o, &b);
    /* rank 0's output set (the lock, the names, the staging) before any work */
    static const char *const out_files[] = {"logprob.npy",    "entropy.npy",       "lse.npy",
                                            "logit_mean.npy", "dhidden.npy",       "dweight.npy",
                                            "topk_ids.npy",   "topk_logprobs.npy", "sum_p2.npy",
                                            NULL};
    if (dist_rank == 0 && ok0 && o.outputs && sph_cli_outset_begin(&os, o.outputs, out_files))
        ok0 = dist_fail("%s", os.err);
    if (!dist_batch_share(&b, ok0)) goto out;
    if (o.tp > b.V) { /* every rank has b.V now: the same verdict everywhere */
        if (dist_rank == 0)
            dist_fail("--tp %lld: more than the vocabulary's %lld rows", (long long)o.tp,
                      (long long)b.V);
        goto out;
    }
    b.topk = o.topk, b.sum_p2 = o.sum_p2; /* every rank: the agreed options */
    if (o.topk > b.V || (o.topk && b.K)) {
        if (dist_rank == 0)
            dist_fail(o.topk > b.V ? "--topk %lld: more than the vocabulary's %lld ids"
                                   : "--topk %lld: not with --support (%lld candidates)",
                      (long long)o.topk, (long long)(o.topk > b.V ? b.V : b.K));
        goto out;
    }

    /* 2-4. bins, layout, CP-local rows */
    int64_t total_bins = 0, padded_rows = 0;
    if (!dist_agree(dist_share_make(&o, &b, cp_rank, dp_rank, &sh, &total_bins, &padded_rows)))
        goto out;

    /* 5. device, communicator, context */
    const int64_t v_base = b.V / o.tp, v0 = tp_rank * v_base,
                  V_loc = tp_rank == o.tp - 1 ? b.V - v0 : v_base;
    int ok = 1;
    sph_ctx_opts io = SPH_CTX_OPTS_INIT;
    if (o.cuda) {
        ok = dist_cuda_device(&io.device.id, NULL);
        io.device.type = SPH_DEVICE_CUDA;
    }
    /* the SPH_CUDA_* A/B switches of the scripts under scripts/device */
    if (ok && sph_ctx_opts_apply_env(&io)) ok = dist_fail("%s", sph_last_error());
    if (ok && sph_ctx_create(&d.io, &io)) ok = dist_fail("context: %s", sph_last_error());
    d.cuda = o.cuda;
    if (!dist_agree(ok)) goto out;
    if (!dist_agree(make_comm(&o, &b, v0, V_loc, tp_rank, cp_rank, dp_rank, &comm, &tpc)))
        goto out;
    sph_ctx_opts co = io;
    co.tp_comm = comm;
    co.force_kernel = o.kernel;
    co.chunk_rows = o.chunk_rows;
    if (sph_ctx_create(&ctx, &co)) ok = dist_fail("context: %s", sph_last_error());
    co.tp_comm = NULL;
    if (ok && o.bench && sph_ctx_create(&local_ctx, &co))
        ok = dist_fail("context: %s", sph_last_error());
    if (!dist_agree(ok)) goto out;

    if (dist_rank == 0) print_run(&o, &b, &sh, ctx, total_bins, padded_rows);

    /* 5b. forward + backward of every rank */
    double t0 = MPI_Wtime();
    ok = dist_run_head(ctx, &d, &b, sh.grow, sh.bin_off, sh.n_bins, v0, V_loc, o.gap,
                       !o.dh_partial, o.one_pass, local_ctx, (int)o.bench, &res);
    if (!dist_agree(ok)) goto out;
    double t_run = MPI_Wtime() - t0, t_max = 0;
    MPI_Reduce(&t_run, &t_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

    /* 6-7. gather, check, write */
    dist_run run = {&sh, &res, tp_rank, V_loc, total_bins, padded_rows, t_max, io, &os};
    rc = dist_gather_check(&o, &b, &run);

out:
    sph_cli_outset_abort(&os);
    dist_result_free(&res);
    dist_share_free(&sh);
    dist_batch_free(&b);
    sph_ctx_destroy(local_ctx);
    sph_ctx_destroy(ctx);
    sph_comm_destroy(comm);
    sph_ctx_destroy(d.io);
    if (tpc != MPI_COMM_NULL) MPI_Comm_free(&tpc);
    if (we_init) MPI_Finalize();
    return rc;
}

#endif /* SPH_HAVE_MPI */
