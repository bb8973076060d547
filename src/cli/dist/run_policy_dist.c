/*
 * run_policy_dist.c - `mpirun -np T*C*D spanhead run --tp T --cp C --dp D --policy-loss ...`:
 * the fused policy loss split the way a trainer splits it, checked against one process.
 *
 * World rank w = ((dp_rank * C) + cp_rank) * T + tp_rank.
 *   0. The ranks' agreement (dist_agree.c), the same first collective as the head runner's:
 *      a rank on the other path, a usage error, or any option that differs (--clip-low,
 *      --outputs, ...) ends every rank before any work, each printing the option's name.
 *   1. Rank 0 reads --inputs (run_policy.c) and broadcasts the problem; every rank agrees on
 *      every phase (one all-reduce), so a failure anywhere ends every rank with its code.
 *   2. DP: whole sequences per rank: the rows are cut into D contiguous blocks at sequence
 *      boundaries (the rows of a sequence must be contiguous, checked), so each DP rank's call
 *      is a micro-batch of the global batch; num_tokens / num_seqs are the global batch's
 *      (the options' when given, else counted on rank 0), so the micro-batches' losses and
 *      metrics add up to the global loss.
 *   3. CP: the rows of a DP block are cut into C contiguous chunks (padded with inactive rows
 *      to one length), so sequences cross CP ranks; the CP group is the library's sequence
 *      group (seq_comm): T_j and gspo's rho are the whole sequences'.
 *   4. TP: rank t holds weight rows [V t / T, V (t + 1) / T); the statistics combine over the
 *      TP group (MPI on the CPU, NCCL with --device cuda: one GPU per rank, the local rank mod
 *      the device count) and dhidden is all-reduced over it.
 *   5. Rank 0 gathers: every TP rank must hold bitwise the same metrics and logprob (checked);
 *      the metrics of the CP and DP ranks are summed; per-row outputs and dhidden by global
 *      row; dweight shards concatenated over TP, summed over CP and DP. --check compares with
 *      the single-process float64 reference; --outputs writes what one process writes.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msg.h"
#include "num.h"
#include "run_dist.h"
#include "run_policy.h"

#define CMD "run"

/* run_policy.h */
int sph_cli_run_policy_main_dist(int argc, char **argv) {
    pol_opts o;
    pol_opts_defaults(&o);
    sph_cli_parsed pp = {0};
    char msg[480] = "";
    int rc = sph_cli_parse(sph_cli_policy_opts, argc, argv, &o, &pp, msg, sizeof msg);
    if (rc == 0) rc = pol_validate(&o, &pp, msg, sizeof msg);
    return sph_cli_run_policy_dist(&o, rc, msg, argc, argv);
}

#ifndef SPH_HAVE_MPI

int sph_cli_run_policy_dist(const pol_opts *o, int rc, const char *msg, int argc, char **argv) {
    (void)o, (void)argc, (void)argv;
    return dist_loss_no_mpi(rc, msg, pol_usage, "--tp/--cp/--dp");
}

#else
#include <mpi.h>

/* Broadcasts n bytes from rank 0 in pieces below INT_MAX. */
static void bcast(void *p, size_t n) {
    for (size_t off = 0; off < n;) {
        size_t k = n - off > ((size_t)1 << 30) ? ((size_t)1 << 30) : n - off;
        MPI_Bcast((char *)p + off, (int)k, MPI_BYTE, 0, MPI_COMM_WORLD);
        off += k;
    }
}

/* Rank 0's problem to every rank (the others allocate it). 1 ok. */
static int share_problem(pol_problem *p, int ok0) {
    int64_t hdr[12] = {p->N, p->H, p->V, p->bits, p->is_bf16, !!p->mask, !!p->seq, !!p->ref,
                       !!p->isw, p->n_spans, ok0, !!p->temp};
    MPI_Bcast(hdr, 12, MPI_INT64_T, 0, MPI_COMM_WORLD);
    if (!hdr[10]) return 0;
    if (dist_rank) {
        memset(p, 0, sizeof *p);
        p->N = hdr[0], p->H = hdr[1], p->V = hdr[2], p->bits = (int)hdr[3];
        p->is_bf16 = (int)hdr[4], p->n_spans = hdr[9];
        const size_t es = (size_t)p->bits / 8;
        p->h = sph_cli_alloc(p->N * p->H, es), p->w = sph_cli_alloc(p->V * p->H, es);
        p->tgt = sph_cli_alloc(p->N, 8), p->adv = sph_cli_alloc(p->N, 4);
        p->old = sph_cli_alloc(p->N, 4);
        if (hdr[5]) p->mask = sph_cli_alloc(p->N, 1), p->spans = sph_cli_alloc(2 * p->n_spans + 2, 8);
        if (hdr[6]) p->seq = sph_cli_alloc(p->N, 8);
        if (hdr[7]) p->ref = sph_cli_alloc(p->N, 4);
        if (hdr[8]) p->isw = sph_cli_alloc(p->N, 4);
        if (hdr[11]) p->temp = sph_cli_alloc(p->N, 4);
    }
    int ok = p->h && p->w && p->tgt && p->adv && p->old && (!hdr[5] || (p->mask && p->spans)) &&
             (!hdr[6] || p->seq) && (!hdr[7] || p->ref) && (!hdr[8] || p->isw) &&
             (!hdr[11] || p->temp);
    if (!dist_agree(ok || dist_fail("out of memory for the problem"))) return 0;
    const size_t es = (size_t)p->bits / 8;
    bcast(p->h, (size_t)(p->N * p->H) * es), bcast(p->w, (size_t)(p->V * p->H) * es);
    bcast(p->tgt, (size_t)p->N * 8), bcast(p->adv, (size_t)p->N * 4);
    bcast(p->old, (size_t)p->N * 4);
    if (p->mask) bcast(p->mask, (size_t)p->N), bcast(p->spans, (size_t)p->n_spans * 16);
    if (p->seq) bcast(p->seq, (size_t)p->N * 8);
    if (p->ref) bcast(p->ref, (size_t)p->N * 4);
    if (p->isw) bcast(p->isw, (size_t)p->N * 4);
    if (p->temp) bcast(p->temp, (size_t)p->N * 4);
    return 1;
}

static int active(const pol_problem *p, int64_t i) {
    return (!p->mask || p->mask[i]) && p->tgt[i] >= 0;
}

/* Row i of p into row k of q (NULL source: an inactive padding row). */
static void copy_row(const pol_problem *p, int64_t i, pol_problem *q, int64_t k) {
    const size_t es = (size_t)p->bits / 8, rb = (size_t)p->H * es;
    if (i < 0) {
        memset((char *)q->h + (size_t)k * rb, 0, rb);
        q->tgt[k] = -1, q->adv[k] = 0, q->old[k] = 0;
        if (q->mask) q->mask[k] = 0;
        if (q->seq) q->seq[k] = INT64_MIN;
        if (q->ref) q->ref[k] = 0;
        if (q->isw) q->isw[k] = 1;
        if (q->temp) q->temp[k] = 1; /* a valid temperature of an inactive row */
        return;
    }
    memcpy((char *)q->h + (size_t)k * rb, (const char *)p->h + (size_t)i * rb, rb);
    q->tgt[k] = p->tgt[i], q->adv[k] = p->adv[i], q->old[k] = p->old[i];
    if (q->mask) q->mask[k] = p->mask[i];
    if (q->seq) q->seq[k] = p->seq[i];
    if (q->ref) q->ref[k] = p->ref[i];
    if (q->isw) q->isw[k] = p->isw[i];
    if (q->temp) q->temp[k] = p->temp[i];
}

/* Rows [a, b) of p (padded to n rows) and vocabulary rows [v0, v1): the rank's problem. */
static int local_problem(const pol_problem *p, int64_t a, int64_t b, int64_t n, int64_t v0,
                         int64_t v1, pol_problem *q) {
    memset(q, 0, sizeof *q);
    q->N = n, q->H = p->H, q->V = v1 - v0, q->bits = p->bits, q->is_bf16 = p->is_bf16;
    const size_t es = (size_t)p->bits / 8;
    q->h = sph_cli_alloc(n * p->H, es), q->w = sph_cli_alloc(q->V * p->H, es);
    q->tgt = sph_cli_alloc(n, 8), q->adv = sph_cli_alloc(n, 4), q->old = sph_cli_alloc(n, 4);
    if (p->mask) q->mask = sph_cli_alloc(n, 1);
    if (p->seq) q->seq = sph_cli_alloc(n, 8);
    if (p->ref) q->ref = sph_cli_alloc(n, 4);
    if (p->isw) q->isw = sph_cli_alloc(n, 4);
    if (p->temp) q->temp = sph_cli_alloc(n, 4);
    if (!q->h || !q->w || !q->tgt || !q->adv || !q->old || (p->mask && !q->mask) ||
        (p->seq && !q->seq) || (p->ref && !q->ref) || (p->isw && !q->isw) ||
        (p->temp && !q->temp))
        return dist_fail("out of memory for the local problem");
    if (q->V > 0) memcpy(q->w, (const char *)p->w + (size_t)(v0 * p->H) * es,
                         (size_t)(q->V * p->H) * es);
    for (int64_t k = 0; k < n; k++) copy_row(p, a + k < b ? a + k : -1, q, k);
    if (q->mask) {
        q->spans = sph_cli_alloc(n + 2, 16);
        if (!q->spans || sph_spans_from_mask(q->mask, n, 0, q->spans, &q->n_spans))
            return dist_fail("spans of the local rows: %s", sph_last_error());
    }
    return 1;
}

/* DP blocks: D contiguous blocks of rows cut at sequence boundaries near k N / D. */
static int dp_blocks(const pol_problem *p, int64_t D, int64_t *cut) {
    cut[0] = 0, cut[D] = p->N;
    for (int64_t k = 1; k < D; k++) {
        int64_t c = p->N * k / D;
        if (p->seq) /* move to the start of the sequence that holds row c */
            while (c > cut[k - 1] && c < p->N && p->seq[c] == p->seq[c - 1]) c--;
        cut[k] = c < cut[k - 1] ? cut[k - 1] : c;
    }
    if (!p->seq || D == 1) return 1;
    /* every sequence within one block: a sequence's rows contiguous */
    for (int64_t i = 1; i < p->N; i++) {
        if (p->seq[i] == p->seq[i - 1]) continue;
        for (int64_t j = 0; j < i - 1; j++)
            if (p->seq[j] == p->seq[i])
                return dist_fail("--dp %lld: the rows of sequence %lld are not contiguous (rows %lld "
                            "and %lld): data parallelism gives whole sequences to ranks",
                            (long long)D, (long long)p->seq[i], (long long)j, (long long)i);
    }
    return 1;
}

/* T and S of the global batch (S: 0 without seq_id). */
static void global_counts(const pol_problem *p, int64_t *T, int64_t *S) {
    *T = *S = 0;
    for (int64_t i = 0; i < p->N; i++) {
        if (!active(p, i)) continue;
        (*T)++;
        if (!p->seq) continue;
        int first = 1;
        for (int64_t j = 0; j < i && first; j++) first = !(active(p, j) && p->seq[j] == p->seq[i]);
        *S += first;
    }
}

/* One rank's place in the run and its groups. */
typedef struct pol_dist {
    int64_t T, C, D, tp_rank, cp_rank, dp_rank;
    int64_t r0, r1, v0, v1; /* this rank's rows [r0, r1) and vocabulary rows [v0, v1) */
    int64_t Tg, Sg;         /* tokens and sequences of the global batch */
    int cuda, dev_id;
    sph_ctx_t hold; /* --device cuda: a context on the rank's GPU before NCCL (its device) */
    MPI_Comm tp_mpi, cp_mpi, shard_mpi;
    sph_comm_t tpc, sqc;
} pol_dist;

/* 4. the groups: TP (ranks of one (dp, cp)), sequence group (ranks of one (dp, tp)), the
 * ranks of one shard; with --device cuda the rank's GPU. Returns ok (for agree). */
static int make_groups(const pol_opts *o, const pol_problem *p, pol_dist *d) {
    const int64_t T = d->T, C = d->C;
    int ok = 1;
    MPI_Comm_split(MPI_COMM_WORLD, (int)(d->dp_rank * C + d->cp_rank), (int)d->tp_rank,
                   &d->tp_mpi);
    MPI_Comm_split(MPI_COMM_WORLD, (int)(d->dp_rank * T + d->tp_rank), (int)d->cp_rank,
                   &d->cp_mpi);
    MPI_Comm_split(MPI_COMM_WORLD, (int)d->tp_rank, dist_rank, &d->shard_mpi); /* same shard */
    d->cuda = o->device == 1;
    if (d->cuda) ok = dist_cuda_device(&d->dev_id, &d->hold);
    sph_status s = SPH_OK;
    if (ok && T > 1) {
        sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
        cfg.tp = T, cfg.vocab_total = p->V, cfg.vocab_start = d->v0,
        cfg.vocab_local = d->v1 - d->v0;
        cfg.dtype = p->bits == 32 ? SPH_F32 : (p->is_bf16 ? SPH_BF16 : SPH_F16);
        cfg.temperature = o->temperature;
        s = d->cuda ? sph_comm_create_nccl_mpi(&d->tpc, &d->tp_mpi, &cfg)
                    : sph_comm_create_mpi(&d->tpc, &d->tp_mpi, &cfg);
        if (s) ok = dist_fail("TP communicator: %s", sph_last_error());
    }
    if (ok && C > 1) {
        /* a sequence group needs no configuration of its own: a placeholder one (each rank a
         * one-id "shard" of a vocabulary of C) passes the communicator's checks */
        sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
        cfg.tp = C, cfg.vocab_total = C, cfg.vocab_start = d->cp_rank, cfg.vocab_local = 1;
        s = d->cuda ? sph_comm_create_nccl_mpi(&d->sqc, &d->cp_mpi, &cfg)
                    : sph_comm_create_mpi(&d->sqc, &d->cp_mpi, &cfg);
        if (s) ok = dist_fail("sequence-group communicator: %s", sph_last_error());
    }
    return ok;
}

/* 5a. the TP copies: bitwise the same metrics and logprob in every TP group. *mets: rank 0,
 * every rank's metrics (the caller frees). Returns ok. */
static int check_tp_copies(const pol_dist *d, const pol_problem *q, const pol_result *r,
                           float **mets_out) {
    const int64_t T = d->T;
    float *mets = dist_rank ? NULL : sph_cli_alloc((int64_t)dist_size * SPH_POLICY_N_METRICS, 4);
    *mets_out = mets;
    MPI_Gather(r->metrics, SPH_POLICY_N_METRICS, MPI_FLOAT, mets, SPH_POLICY_N_METRICS,
               MPI_FLOAT, 0, MPI_COMM_WORLD);
    float *lp0 = sph_cli_alloc(q->N, 4);
    if (lp0) memcpy(lp0, r->lp, (size_t)q->N * 4);
    MPI_Bcast(lp0, (int)q->N, MPI_FLOAT, 0, d->tp_mpi);
    int ok = memcmp(lp0, r->lp, (size_t)q->N * 4) == 0 ||
             dist_fail("logprob differs from TP rank 0's (the statistics combine in rank order: "
                  "every rank must hold the same bits)");
    free(lp0);
    int same = 1;
    if (!dist_rank)
        for (int k = 0; k < dist_size; k++)
            same &= !memcmp(mets + k * SPH_POLICY_N_METRICS,
                            mets + (k - k % T) * SPH_POLICY_N_METRICS, SPH_POLICY_N_METRICS * 4);
    MPI_Bcast(&same, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!same && !dist_rank) dist_fail("the metrics of the TP ranks of a group differ");
    return ok & same;
}

/* 5b. rank 0: the global result's metrics (summed over CP and DP: TP rank 0 of each group)
 * and its buffers. Returns ok. */
static int global_result(const pol_opts *o, const pol_problem *p, const pol_dist *d,
                         const pol_result *r, const float *mets, pol_result *g) {
    double sum[SPH_POLICY_N_METRICS] = {0};
    for (int k = 0; k < dist_size; k += (int)d->T)
        for (int m = 0; m <= SPH_METRIC_PPO_KL; m++) sum[m] += mets[k * SPH_POLICY_N_METRICS + m];
    for (int m = 0; m <= SPH_METRIC_PPO_KL; m++) g->metrics[m] = (float)sum[m];
    /* the counts of the whole batch (seqs: 0 where the call groups no sequences) */
    g->metrics[SPH_METRIC_TOKENS] = (float)d->Tg;
    g->metrics[SPH_METRIC_SEQS] = o->agg != 0 || o->loss == 2 ? (float)d->Sg : 0.0f;
    g->ms = r->ms, g->ws_bytes = r->ws_bytes;
    memcpy(g->describe, r->describe, sizeof g->describe);
    g->lp = sph_cli_calloc(p->N, 4), g->ent = sph_cli_calloc(p->N, 4);
    g->dh = sph_cli_calloc(p->N * p->H, 4), g->dw = sph_cli_calloc(p->V * p->H, 4);
    /* the head's extras of the loss's rows (every TP rank of a group holds the same, merged) */
    g->topk = o->topk;
    const int tk_ok = !o->topk || ((g->tki = sph_cli_calloc(p->N * o->topk, 8)) &&
                                   (g->tkl = sph_cli_calloc(p->N * o->topk, 4)));
    const int sp_ok = !o->sum_p2 || (g->sp2 = sph_cli_calloc(p->N, 4));
    return (g->lp && g->ent && g->dh && g->dw && tk_ok && sp_ok) ||
           dist_fail("out of memory for the gathered outputs");
}

/* 5c. per-row outputs and dhidden (every rank with tp_rank 0 sends its real rows), dweight
 * (each shard summed over its CP x DP ranks, then the shards) to rank 0's g. Returns ok. */
static int gather_outputs(const pol_problem *p, const pol_problem *q, const pol_dist *d,
                          const pol_result *r, pol_result *g) {
    const int64_t T = d->T, r0 = d->r0, K = r->topk;
    const int64_t real = d->r1 > r0 ? d->r1 - r0 : 0;
    for (int src = 1; src < dist_size; src++) {
        if (src % T) continue;
        if (dist_rank == src) {
            int64_t hdr[2] = {r0, real};
            MPI_Send(hdr, 2, MPI_INT64_T, 0, 1, MPI_COMM_WORLD);
            MPI_Send(r->lp, (int)real, MPI_FLOAT, 0, 2, MPI_COMM_WORLD);
            MPI_Send(r->ent, (int)real, MPI_FLOAT, 0, 3, MPI_COMM_WORLD);
            MPI_Send(r->dh, (int)(real * p->H), MPI_FLOAT, 0, 4, MPI_COMM_WORLD);
            if (r->tki) MPI_Send(r->tki, (int)(real * K), MPI_INT64_T, 0, 6, MPI_COMM_WORLD);
            if (r->tkl) MPI_Send(r->tkl, (int)(real * K), MPI_FLOAT, 0, 7, MPI_COMM_WORLD);
            if (r->sp2) MPI_Send(r->sp2, (int)real, MPI_FLOAT, 0, 8, MPI_COMM_WORLD);
        } else if (!dist_rank) {
            int64_t hdr[2];
            MPI_Recv(hdr, 2, MPI_INT64_T, src, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Recv(g->lp + hdr[0], (int)hdr[1], MPI_FLOAT, src, 2, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
            MPI_Recv(g->ent + hdr[0], (int)hdr[1], MPI_FLOAT, src, 3, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
            MPI_Recv(g->dh + hdr[0] * p->H, (int)(hdr[1] * p->H), MPI_FLOAT, src, 4,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (g->tki)
                MPI_Recv(g->tki + hdr[0] * K, (int)(hdr[1] * K), MPI_INT64_T, src, 6,
                         MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (g->tkl)
                MPI_Recv(g->tkl + hdr[0] * K, (int)(hdr[1] * K), MPI_FLOAT, src, 7,
                         MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (g->sp2)
                MPI_Recv(g->sp2 + hdr[0], (int)hdr[1], MPI_FLOAT, src, 8, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
        }
    }
    if (!dist_rank) {
        memcpy(g->lp + r0, r->lp, (size_t)real * 4), memcpy(g->ent + r0, r->ent, (size_t)real * 4);
        memcpy(g->dh + r0 * p->H, r->dh, (size_t)(real * p->H) * 4);
        if (g->tki) memcpy(g->tki + r0 * K, r->tki, (size_t)(real * K) * 8);
        if (g->tkl) memcpy(g->tkl + r0 * K, r->tkl, (size_t)(real * K) * 4);
        if (g->sp2) memcpy(g->sp2 + r0, r->sp2, (size_t)real * 4);
    }
    float *dw = sph_cli_alloc(q->V * p->H, 4);
    int ok = dw != NULL || dist_fail("out of memory");
    int shard_rank = 0;
    MPI_Comm_rank(d->shard_mpi, &shard_rank);
    MPI_Reduce(r->dw, dw, (int)(q->V * p->H), MPI_FLOAT, MPI_SUM, 0, d->shard_mpi);
    if (shard_rank == 0) { /* world rank tp_rank: cp = dp = 0 */
        if (dist_rank) {
            MPI_Send(dw, (int)(q->V * p->H), MPI_FLOAT, 0, 5, MPI_COMM_WORLD);
        } else {
            memcpy(g->dw, dw, (size_t)(q->V * p->H) * 4);
            for (int t = 1; t < T; t++) {
                const int64_t s0 = p->V * t / T, s1 = p->V * (t + 1) / T;
                MPI_Recv(g->dw + s0 * p->H, (int)((s1 - s0) * p->H), MPI_FLOAT, t, 5,
                         MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            }
        }
    }
    free(dw);
    return ok;
}

/* 5d. rank 0: the check, the report, the outputs; returns the exit code. */
static int report(const pol_opts *o, const pol_problem *p, const pol_dist *d,
                  const pol_result *g, pol_result *ref, sph_cli_outset *os) {
    int code = 0;
    printf("run: tp=%lld cp=%lld dp=%lld device=%s\n", (long long)d->T, (long long)d->C,
           (long long)d->D, d->cuda ? "cuda" : "cpu");
    for (int m = 0; m < SPH_POLICY_N_METRICS; m++)
        printf("  %-18s %.9g\n", pol_metric_names[m], (double)g->metrics[m]);
    if (o->check) {
        pol_where wr = {0, 0, "ref", 1, 0, NULL, NULL, 0, 0, 0, 0};
        pol_opts oref = *o; /* one more top-k entry where it can (pol_check_extras) */
        oref.topk = pol_ref_topk(o, p->V);
        double err[5], ex[3] = {0};
        if (pol_run(&oref, p, &wr, ref)) {
            code = 1;
        } else {
            const double tol = p->bits == 32 ? 1e-4 : (d->cuda ? 1e-2 : 1e-4);
            int pass = pol_compare(g, ref, p->N, p->H, p->V, tol, err);
            printf("  check vs one process (float64 reference): metrics %.2e logprob %.2e "
                   "entropy %.2e dhidden %.2e dweight %.2e (tol %.0e): %s\n",
                   err[0], err[1], err[2], err[3], err[4], tol, pass ? "PASS" : "FAIL");
            if (o->topk || o->sum_p2) {
                const int xp = pol_check_extras(g, ref, p->N, p->V, tol, ex);
                printf("  check of the extras: topk_logprobs %.2e, topk_ids differing at "
                       "separated ranks %lld, sum_p2 %.2e: %s\n", ex[0], (long long)ex[1], ex[2],
                       xp ? "PASS" : "FAIL");
                pass &= xp;
            }
            code = !pass;
        }
    }
    if (!code && o->outputs) {
        code = pol_write_outputs(os, g, p->N, p->H, p->V);
        if (!code) printf("  outputs written to %s\n", o->outputs);
    }
    return sph_cli_close_stdout(CMD, code);
}

int sph_cli_run_policy_dist(const pol_opts *o, int verdict, const char *msg, int argc,
                            char **argv) {
    int v = dist_loss_begin(SPH_CLI_PATH_POLICY, sph_cli_policy_opts, o, verdict, msg, argc,
                            argv, pol_usage);
    if (v >= 0) return v;
    pol_dist d;
    memset(&d, 0, sizeof d);
    d.T = o->tp, d.C = o->cp, d.D = o->dp;
    d.tp_mpi = d.cp_mpi = d.shard_mpi = MPI_COMM_NULL;
    const int64_t T = d.T, C = d.C, D = d.D;
    int rc = 1, ok = 1;
    pol_problem p, q;
    pol_result r, ref, g;
    memset(&p, 0, sizeof p), memset(&q, 0, sizeof q), memset(&r, 0, sizeof r);
    memset(&ref, 0, sizeof ref), memset(&g, 0, sizeof g);
    sph_cli_outset os;
    memset(&os, 0, sizeof os);
    if (T * C * D != dist_size) {
        if (!dist_rank)
            sph_cli_fail(CMD, 2, "--tp %lld --cp %lld --dp %lld needs %lld ranks, but mpirun "
                                 "started %d (mpirun -np %lld)",
                         (long long)T, (long long)C, (long long)D, (long long)(T * C * D), dist_size,
                         (long long)(T * C * D));
        rc = 2;
        goto out;
    }
    d.tp_rank = dist_rank % T, d.cp_rank = (dist_rank / T) % C, d.dp_rank = dist_rank / (T * C);
    /* 1. the problem */
    if (!dist_rank) /* the outputs' set (lock, names, staging) before any work */
        ok = pol_problem_read(o, &p) == 0 && (!o->outputs || !pol_outputs_begin(&os, o->outputs));
    if (!share_problem(&p, ok)) goto out;
    /* 2-3. this rank's rows and vocabulary rows */
    int64_t *cut = sph_cli_alloc(D + 1, 8);
    ok = cut != NULL && dp_blocks(&p, D, cut);
    if (!dist_agree(ok)) {
        free(cut);
        goto out;
    }
    global_counts(&p, &d.Tg, &d.Sg);
    const int64_t a = cut[d.dp_rank], b = cut[d.dp_rank + 1], blk = b - a;
    const int64_t n = (blk + C - 1) / C;
    d.r0 = a + n * d.cp_rank;
    d.r1 = d.r0 + n < b ? d.r0 + n : b;
    free(cut);
    /* every CP rank of a DP block passes the same row count; DP blocks may differ */
    d.v0 = p.V * d.tp_rank / T, d.v1 = p.V * (d.tp_rank + 1) / T;
    if (!dist_agree(local_problem(&p, d.r0, d.r1 > d.r0 ? d.r1 : d.r0, n, d.v0, d.v1, &q))) goto out;
    if (!dist_agree(make_groups(o, &p, &d))) goto out;
    /* the rank's call */
    pol_where w = {d.cuda, d.dev_id, o->kernel, o->threads, (int)o->repeats, d.tpc, d.sqc, d.v0,
                   p.V, D > 1 ? (o->num_tokens ? o->num_tokens : d.Tg) : 0,
                   D > 1 ? (o->num_seqs ? o->num_seqs : d.Sg) : 0};
    if (!dist_agree(pol_run(o, &q, &w, &r) == 0)) goto out;
    /* 5. the TP copies, then the global result on rank 0 */
    float *mets = NULL;
    ok = check_tp_copies(&d, &q, &r, &mets);
    if (!dist_rank) ok &= global_result(o, &p, &d, &r, mets, &g);
    free(mets);
    if (!dist_agree(ok)) goto out;
    if (!dist_agree(gather_outputs(&p, &q, &d, &r, &g))) goto out;
    /* rank 0: the check, the report, the outputs */
    int code = dist_rank ? 0 : report(o, &p, &d, &g, &ref, &os);
    MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);
    rc = code;
out:
    pol_result_free(&g);
    sph_cli_outset_abort(&os);
    sph_comm_destroy(d.tpc);
    sph_comm_destroy(d.sqc);
    sph_ctx_destroy(d.hold);
    if (d.tp_mpi != MPI_COMM_NULL) MPI_Comm_free(&d.tp_mpi);
    if (d.cp_mpi != MPI_COMM_NULL) MPI_Comm_free(&d.cp_mpi);
    if (d.shard_mpi != MPI_COMM_NULL) MPI_Comm_free(&d.shard_mpi);
    pol_problem_free(&p), pol_problem_free(&q);
    pol_result_free(&r), pol_result_free(&ref);
    MPI_Finalize();
    return rc;
}

#endif
