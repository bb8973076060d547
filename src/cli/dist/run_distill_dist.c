/*
 * run_distill_dist.c - `mpirun -np T*C spanhead run --tp T --cp C --distill ... --inputs DIR`:
 * the fused distillation loss over tensor-parallel groups and a context-parallel sequence
 * group, on the CPU or CUDA, checked against one process.
 *
 *   0. The ranks' agreement (dist_agree.c), the first collective of every distributed path:
 *      a rank on another path, a usage error or any option that differs ends every rank
 *      before any work, each printing the option's name.
 *   1. Every rank reads --inputs itself (the same files); the ranks agree on every phase (one
 *      all-reduce), so a failure anywhere ends every rank with its code.
 *   2. World rank w = cp * T + tp. TP: rank tp of a TP group holds weight and
 *      teacher_weight rows [V tp / T, V (tp + 1) / T); dhidden is all-reduced over it. CP:
 *      rank cp holds rows [N cp / C, N (cp + 1) / C) (uneven pieces are fine: the ranks of a
 *      sequence group may hold different N), and the ranks of one tp form the call's
 *      seq_comm, so reduction mean divides by the active rows of all N rows (or by
 *      --num-tokens). CPU: MPI communicators; --device cuda: NCCL ones, one GPU per rank
 *      (the node-local rank mod the device count).
 *   3. Rank 0 gathers: every TP rank of a CP rank must hold bitwise the same loss (checked);
 *      the CP ranks' losses are summed (none: their rows placed), dhidden rows placed,
 *      dweight shards concatenated over TP and summed over CP; --check compares with the
 *      single-process float64 reference; --outputs writes what one process writes.
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
    if (rc == 0) rc = dst_opts_finish(&o, &pp, msg, sizeof msg);
    return sph_cli_run_distill_dist(&o, rc, msg, argc, argv);
}

#ifndef SPH_HAVE_MPI

int sph_cli_run_distill_dist(const dst_opts *o, int rc, const char *msg, int argc, char **argv) {
    (void)o, (void)argc, (void)argv;
    return dist_loss_no_mpi(rc, msg, dst_usage, "--tp/--cp");
}

#else
#include <mpi.h>

/* Rank (cp, tp)'s view of the problem: rows [r0, r1) of p (pointers into p's arrays; the
 * weights whole, the call takes its shard). */
static dst_problem rows_of(const dst_problem *p, int64_t r0, int64_t r1) {
    dst_problem q = *p;
    const size_t es = (size_t)p->bits / 8;
    q.N = r1 - r0;
    q.h = (char *)p->h + (size_t)(r0 * p->H) * es;
    if (p->th) q.th = (char *)p->th + (size_t)(r0 * p->HT) * es;
    if (p->ids) q.ids = p->ids + r0 * p->K, q.lp = p->lp + r0 * p->K;
    if (p->mask) q.mask = p->mask + r0;
    if (p->trows) q.trows = p->trows + r0;
    if (p->ttrows) q.ttrows = p->ttrows + r0;
    return q;
}

/* The groups of rank (cp, tp): TP (the ranks of one cp), the CP sequence group (the ranks of
 * one tp); MPI on the CPU, NCCL with --device cuda (one GPU per rank: the node-local rank mod
 * the device count). Returns ok (for agree). */
static int make_groups(const dst_opts *o, const dst_problem *p, int64_t T, int64_t C,
                       int64_t cp, int64_t tp, int64_t v0, int64_t v1, MPI_Comm *tpm,
                       MPI_Comm *cpm, sph_comm_t *tpc, sph_comm_t *sqc, int *dev_id,
                       sph_ctx_t *devctx) {
    const int cuda = o->device == 1;
    int ok = 1;
    MPI_Comm_split(MPI_COMM_WORLD, (int)cp, (int)tp, tpm);
    MPI_Comm_split(MPI_COMM_WORLD, (int)tp, (int)cp, cpm);
    if (cuda) {
        ok = dist_cuda_device(dev_id, devctx); /* held to the end: NCCL's current device */
    }
    if (ok && T > 1) {
        sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
        cfg.tp = T, cfg.vocab_total = p->V, cfg.vocab_start = v0, cfg.vocab_local = v1 - v0;
        cfg.dtype = p->bits == 32 ? SPH_F32 : (p->is_bf16 ? SPH_BF16 : SPH_F16);
        cfg.temperature = o->temperature;
        sph_status s = cuda ? sph_comm_create_nccl_mpi(tpc, tpm, &cfg)
                            : sph_comm_create_mpi(tpc, tpm, &cfg);
        if (s) ok = dist_fail("TP communicator: %s", sph_last_error());
    }
    if (ok && C > 1) {
        /* the sequence group needs no configuration of its own: a placeholder one (each rank
         * a one-id "shard" of a vocabulary of C) passes the communicator's checks */
        sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
        cfg.tp = C, cfg.vocab_total = C, cfg.vocab_start = cp, cfg.vocab_local = 1;
        sph_status s = cuda ? sph_comm_create_nccl_mpi(sqc, cpm, &cfg)
                            : sph_comm_create_mpi(sqc, cpm, &cfg);
        if (s) ok = dist_fail("CP (sequence-group) communicator: %s", sph_last_error());
    }
    return ok;
}

/* The ranks' results to rank 0 as one process's: the loss summed over the CP ranks (none:
 * their rows placed), dhidden rows placed, dweight shards placed and summed over CP (float64
 * sums; every rank's TP copies are checked bitwise first). g: rank 0's, whole problem. */
static int gather(const dst_opts *o, const dst_problem *p, int64_t T, int64_t cp, int64_t tp,
                  int64_t r0, int64_t r1, int64_t v0, int64_t v1, MPI_Comm tpm,
                  const dst_result *r, dst_result *g) {
    (void)cp;
    const int none = o->red == 2;
    const int64_t n = r1 - r0, nl = none ? n : 1;
    /* every TP rank of a CP rank holds the same loss bits (the combine is in rank order) */
    float *l0 = sph_cli_alloc(nl ? nl : 1, 4);
    int ok = l0 != NULL || dist_fail("out of memory");
    if (ok) memcpy(l0, r->loss, (size_t)nl * 4);
    if (T > 1 && ok) MPI_Bcast(l0, (int)nl, MPI_FLOAT, 0, tpm);
    ok = ok && (!memcmp(l0, r->loss, (size_t)nl * 4) ||
                dist_fail("the loss differs from TP rank 0's (every rank of the TP group must hold "
                     "the same bits)"));
    free(l0);
    if (!dist_agree(ok)) return 0;
    const int64_t NL = none ? p->N : 1, NH = p->N * p->H, NW = p->V * p->H;
    double *buf = sph_cli_calloc(NL + NH + NW, 8), *sum = dist_rank ? NULL : sph_cli_calloc(NL + NH + NW, 8);
    ok = (buf && (dist_rank || sum)) || dist_fail("out of memory for the gathered outputs");
    if (!dist_agree(ok)) {
        free(buf), free(sum);
        return 0;
    }
    if (tp == 0) { /* the loss and dhidden rows once per CP rank */
        for (int64_t i = 0; i < nl; i++) buf[(none ? r0 : 0) + i] += r->loss[i];
        for (int64_t e = 0; e < n * p->H; e++) buf[NL + r0 * p->H + e] = r->dh[e];
    }
    for (int64_t e = 0; e < (v1 - v0) * p->H; e++) buf[NL + NH + v0 * p->H + e] = r->dw[e];
    for (int64_t off = 0, tot = NL + NH + NW; off < tot;) {
        const int64_t k = tot - off < (1 << 27) ? tot - off : (1 << 27);
        MPI_Reduce(buf + off, sum ? sum + off : NULL, (int)k, MPI_DOUBLE, MPI_SUM, 0,
                   MPI_COMM_WORLD);
        off += k;
    }
    free(buf);
    if (!dist_rank) {
        g->loss = sph_cli_alloc(NL, 4), g->dh = sph_cli_alloc(NH, 4), g->dw = sph_cli_alloc(NW, 4);
        ok = (g->loss && g->dh && g->dw) || dist_fail("out of memory for the gathered outputs");
        for (int64_t k = 0; ok && k < NL; k++) g->loss[k] = (float)sum[k];
        for (int64_t k = 0; ok && k < NH; k++) g->dh[k] = (float)sum[NL + k];
        for (int64_t k = 0; ok && k < NW; k++) g->dw[k] = (float)sum[NL + NH + k];
        g->ms = r->ms, g->ws_bytes = r->ws_bytes;
        memcpy(g->describe, r->describe, sizeof g->describe);
    }
    free(sum);
    return dist_agree(ok);
}

int sph_cli_run_distill_dist(const dst_opts *o, int verdict, const char *msg, int argc,
                             char **argv) {
    int v = dist_loss_begin(SPH_CLI_PATH_DISTILL, sph_cli_distill_opts, o, verdict, msg, argc,
                            argv, dst_usage);
    if (v >= 0) return v;
    const int64_t T = o->tp, C = o->cp;
    int rc = 1, ok = 1;
    dst_problem p;
    dst_result r, ref, g;
    memset(&p, 0, sizeof p), memset(&r, 0, sizeof r), memset(&ref, 0, sizeof ref);
    memset(&g, 0, sizeof g);
    sph_cli_outset os;
    memset(&os, 0, sizeof os);
    sph_comm_t tpc = NULL, sqc = NULL;
    sph_ctx_t devctx = NULL;
    MPI_Comm tpm = MPI_COMM_NULL, cpm = MPI_COMM_NULL;
    if (T * C != dist_size) {
        if (!dist_rank)
            sph_cli_fail(CMD, 2, "--tp %lld --cp %lld needs %lld ranks, but mpirun started %d "
                                 "(mpirun -np %lld)", (long long)T, (long long)C,
                         (long long)(T * C), dist_size, (long long)(T * C));
        rc = 2;
        goto out;
    }
    const int64_t tp = dist_rank % T, cp = dist_rank / T;
    /* 1. the problem: every rank reads it; rank 0 begins the output set before any work */
    ok = dst_problem_read(o, &p) == 0;
    if (ok && !dist_rank && o->outputs && sph_cli_outset_begin(&os, o->outputs, dst_out_files))
        ok = dist_fail("%s", os.err);
    if (!dist_agree(ok)) goto out;
    /* 2. this rank's rows and vocabulary rows, its groups and its call */
    const int64_t r0 = p.N * cp / C, r1 = p.N * (cp + 1) / C;
    const int64_t v0 = p.V * tp / T, v1 = p.V * (tp + 1) / T;
    int dev_id = 0;
    if (!dist_agree(make_groups(o, &p, T, C, cp, tp, v0, v1, &tpm, &cpm, &tpc, &sqc, &dev_id,
                           &devctx)))
        goto out;
    const dst_problem q = rows_of(&p, r0, r1);
    dst_where w = {o->device == 1, o->kernel, o->threads, (int)o->repeats, tpc, v0, v1 - v0,
                   sqc, o->num_tokens, dev_id};
    if (!dist_agree(dst_run(o, &q, &w, &r) == 0)) goto out;
    /* 3. the TP copies checked, the results gathered to rank 0 as one process's */
    if (!gather(o, &p, T, cp, tp, r0, r1, v0, v1, tpm, &r, &g)) goto out;
    int passed = 1;
    if (!dist_rank) {
        double err[3] = {0}, tol = 0;
        const int nl = o->red == 2 ? (int)p.N : 1;
        if (o->check) {
            dst_where wr = {0, "ref", 1, 0, NULL, 0, 0, NULL, o->num_tokens, 0};
            ok = dst_run(o, &p, &wr, &ref) == 0;
            if (ok) {
                /* f32 well under 1e-4; bf16 / f16 on the GPU round dlogits to the input dtype */
                tol = p.bits == 32 ? 1e-4 : (o->device == 1 ? 2e-2 : 1e-4);
                err[0] = run_loss_rel(g.loss, ref.loss, nl, 1e-6);
                err[1] = run_loss_rel(g.dh, ref.dh, p.N * p.H, 1e-30);
                err[2] = run_loss_rel(g.dw, ref.dw, p.V * p.H, 1e-30);
                passed = err[0] <= tol && err[1] <= tol && err[2] <= tol;
            }
        }
        if (ok) {
            dst_report(o, &p, &g, o->check, passed, err, tol);
            if (!o->json)
                printf("  distributed: tp=%lld (vocabulary shards, the same loss bits on every "
                       "TP rank) cp=%lld (row pieces, one seq_comm group) on %s\n", (long long)T,
                       (long long)C, o->device == 1 ? "cuda (NCCL)" : "cpu (MPI)");
            if (passed && o->outputs) ok = dst_write_outputs(&os, o, &p, &g) == 0;
        }
    }
    int res[2] = {ok, passed};
    MPI_Bcast(res, 2, MPI_INT, 0, MPI_COMM_WORLD);
    rc = !res[0] ? 1 : (res[1] ? 0 : 1);
out:
    sph_cli_outset_abort(&os);
    sph_comm_destroy(tpc), sph_comm_destroy(sqc);
    sph_ctx_destroy(devctx);
    if (tpm != MPI_COMM_NULL) MPI_Comm_free(&tpm);
    if (cpm != MPI_COMM_NULL) MPI_Comm_free(&cpm);
    dst_problem_free(&p);
    dst_result_free(&r), dst_result_free(&ref), dst_result_free(&g);
    MPI_Finalize();
    return sph_cli_close_stdout(CMD, rc);
}

#endif
