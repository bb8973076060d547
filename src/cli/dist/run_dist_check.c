/*
 * run_dist_check.c - the end of the distributed runner (run_dist_main.c steps 6-7): every rank's
 * results gathered to rank 0, which checks coverage (every row computed once), that the TP
 * copies of every per-row output agree bit for bit and that padding rows are exact zeros,
 * compares with the single-process reference, and writes --outputs (all files or none, and
 * only when the checks passed).
 */
#ifdef SPH_HAVE_MPI
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "num.h"
#include "run_dist.h"

static void *xcalloc(size_t n, size_t sz) {
    return n > (size_t)INT64_MAX ? NULL : sph_cli_calloc((int64_t)n, sz);
}

/* ---- gather and compare ------------------------------------------------------------------- */

/* Gathers `bytes` from every rank into rank 0's *out (allocated there); counts in bytes. */
static int gatherv(const void *send, size_t bytes, void **out, size_t **counts_out) {
    int ok = 1;
    if (bytes > INT32_MAX) ok = dist_fail("%zu bytes to gather exceed MPI's int count", bytes);
    if (!dist_agree(ok)) return 0;
    int mine = (int)bytes, *counts = NULL, *displs = NULL;
    if (dist_rank == 0) {
        counts = xcalloc((size_t)dist_size, sizeof(int));
        displs = xcalloc((size_t)dist_size, sizeof(int));
    }
    MPI_Gather(&mine, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD);
    size_t total = 0;
    if (dist_rank == 0) {
        for (int r = 0; r < dist_size; r++) {
            displs[r] = (int)total;
            total += (size_t)counts[r];
        }
        if (total > INT32_MAX) ok = dist_fail("%zu gathered bytes exceed MPI's int count", total);
        *out = ok ? xcalloc(total, 1) : NULL;
        if (ok && !*out) ok = dist_fail("out of host memory for %zu gathered bytes", total);
        *counts_out = xcalloc((size_t)dist_size, sizeof(size_t));
        for (int r = 0; *counts_out && r < dist_size; r++) (*counts_out)[r] = (size_t)counts[r];
    }
    if (!dist_agree(ok)) {
        free(counts);
        free(displs);
        return 0;
    }
    int e = MPI_Gatherv(send, mine, MPI_BYTE, dist_rank == 0 ? *out : NULL, counts, displs, MPI_BYTE,
                        0, MPI_COMM_WORLD);
    free(counts);
    free(displs);
    return e == MPI_SUCCESS;
}

typedef struct errstat {
    double max_abs, max_rel, worst_ratio;
    int64_t worst;
} errstat;

static errstat compare(const float *got, const float *ref, int64_t n, double atol, double rtol) {
    errstat e = {0, 0, 0, -1};
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i], ae = fabs(g - r);
        if (isnan(g) != isnan(r) || (isnan(g) && isnan(r))) ae = INFINITY;
        double re = ae / (fabs(r) > 1e-30 ? fabs(r) : 1e-30);
        double ratio = ae / (atol + rtol * fabs(r));
        if (ae > e.max_abs) e.max_abs = ae;
        if (ae > 0 && re > e.max_rel) e.max_rel = re;
        if (ratio > e.worst_ratio || e.worst < 0) {
            e.worst_ratio = ratio;
            e.worst = i;
        }
    }
    return e;
}

/* --topk against the reference's Kr (K + 1 when there is one) best of every row: log-probs
 * within atol + rtol |ref|; ids equal wherever the reference's log-probs leave a gap above
 * that tolerance to both neighbours (near-ties may come out in either order). */
static int check_topk(const dopts *o, const int64_t *ids, const float *lp, const result *ref,
                      size_t R, size_t K, size_t Kr) {
    double worst = 0;
    int64_t bad_ids = 0, worst_at = -1;
    for (size_t i = 0; i < R; i++)
        for (size_t k = 0; k < K; k++) {
            const double want = ref->topk_lp[i * Kr + k], got = lp[i * K + k];
            const double tol = o->atol + o->rtol * fabs(want), ae = fabs(got - want);
            const double ratio = isnan(ae) ? INFINITY : ae / tol;
            if (ratio > worst || worst_at < 0) worst = ratio, worst_at = (int64_t)(i * K + k);
            const int sep = (k == 0 || ref->topk_lp[i * Kr + k - 1] - want > tol) &&
                            (k + 1 >= Kr || want - ref->topk_lp[i * Kr + k + 1] > tol);
            if (sep && ids[i * K + k] != ref->topk_ids[i * Kr + k]) bad_ids++;
        }
    const int good = worst <= 1.0 && bad_ids == 0;
    printf("  %-10s worst |got - ref| / (atol + rtol |ref|) %.3f at [%lld]; ids differing where "
           "the reference's gaps exceed the tolerance: %lld  %s\n",
           "topk", worst, (long long)worst_at, (long long)bad_ids, good ? "ok" : "FAIL");
    return good;
}

/* Every rank's pieces of the run, gathered to rank 0 (step 6). */
typedef struct gathered {
    void *rows, *vals, *dh, *dw;            /* rank 0: every rank's, in rank order */
    size_t *c_rows, *c_vals, *c_dh, *c_dw;  /* rank 0: bytes from each rank */
    void *tki, *tkl, *sp;                   /* --topk (n, K) ids / log-probs, --sum-p2 (n) */
    size_t *c_tki, *c_tkl, *c_sp;
    double *dw64, *dw64_sum;                /* this shard's dweight, its CP x DP sum */
    MPI_Comm shard_comm;
} gathered;

/* The global outputs assembled on rank 0 (step 7). */
typedef struct assembled {
    float *row[NF], *dh;
    const float *dw; /* the gathered shards (in TP order they are the concatenation) */
    int8_t *seen;
    double *dh64;    /* --dh-partial: the TP sum in float64 */
    int64_t *tki;    /* --topk: (R, K) */
    float *tkl, *sp; /* --topk's log-probs (R, K); --sum-p2: (R) */
} assembled;

/* 6. gather: row ids, per-row outputs, dhidden, --topk's lists, --sum-p2; dweight reduced over
 * CP x DP. 0 when a rank
 * failed (every rank agrees). */
static int gather_outputs(const dopts *o, const batch *b, const dist_run *run, gathered *g) {
    const share *sh = run->sh;
    const result *res = run->res;
    const int64_t V_loc = run->V_loc;
    const size_t H = (size_t)b->H, n = (size_t)sh->n;
    float *vals = xcalloc(NF * n, sizeof(float));
    int ok = vals != NULL;
    for (size_t i = 0; ok && i < n; i++)
        for (int f = 0; f < NF; f++) vals[NF * i + (size_t)f] = res->row[f][i];
    if (!dist_agree(ok)) {
        free(vals);
        return 0;
    }
    const size_t TK = (size_t)b->topk;
    ok = gatherv(sh->grow, n * sizeof(int64_t), &g->rows, &g->c_rows) &&
         gatherv(vals, n * NF * sizeof(float), &g->vals, &g->c_vals) &&
         gatherv(res->dhidden, n * H * sizeof(float), &g->dh, &g->c_dh) &&
         (!TK || (gatherv(res->topk_ids, n * TK * sizeof(int64_t), &g->tki, &g->c_tki) &&
                  gatherv(res->topk_lp, n * TK * sizeof(float), &g->tkl, &g->c_tkl))) &&
         (!b->sum_p2 || gatherv(res->sum_p2, n * sizeof(float), &g->sp, &g->c_sp));
    free(vals);
    if (!dist_agree(ok)) return 0;

    g->dw64 = xcalloc((size_t)V_loc * H, sizeof(double));
    g->dw64_sum = xcalloc((size_t)V_loc * H, sizeof(double));
    ok = g->dw64 && g->dw64_sum;
    for (size_t i = 0; ok && i < (size_t)V_loc * H; i++) g->dw64[i] = res->dweight[i];
    if (!dist_agree(ok)) return 0;
    MPI_Comm_split(MPI_COMM_WORLD, (int)run->tp_rank, dist_rank, &g->shard_comm);
    /* Float64 sum over the CP x DP replicas of this shard, to the replica with cp = dp = 0
     * (world rank tp_rank); chunked for MPI's int count. */
    for (size_t off = 0; off < (size_t)V_loc * H; off += (size_t)1 << 28) {
        size_t cnt = (size_t)V_loc * H - off;
        if (cnt > (size_t)1 << 28) cnt = (size_t)1 << 28;
        MPI_Reduce(g->dw64 + off, g->dw64_sum + off, (int)cnt, MPI_DOUBLE, MPI_SUM, 0,
                   g->shard_comm);
    }
    float *dw_send = xcalloc((size_t)V_loc * H, sizeof(float));
    ok = dw_send != NULL;
    for (size_t i = 0; ok && i < (size_t)V_loc * H; i++) dw_send[i] = (float)g->dw64_sum[i];
    if (!dist_agree(ok)) {
        free(dw_send);
        return 0;
    }
    ok = gatherv(dw_send, dist_rank < o->tp ? (size_t)V_loc * H * sizeof(float) : 0, &g->dw,
                 &g->c_dw);
    free(dw_send);
    return dist_agree(ok);
}

/* 7a. rank 0: the global outputs from the gathered pieces, checking coverage (every row once),
 * that the TP copies agree bit for bit and that padding rows are exact zeros. Returns pass. */
static int assemble(const dopts *o, const batch *b, const gathered *g, assembled *a) {
    const size_t R = (size_t)b->R, V = (size_t)b->V, H = (size_t)b->H, TK = (size_t)b->topk;
    int pass = 1, all_rows = 1;
    for (int f = 0; f < NF; f++) all_rows &= (a->row[f] = xcalloc(R, sizeof(float))) != NULL;
    a->dh = xcalloc(R * H, sizeof(float));
    a->dw = (const float *)g->dw; /* shards in TP order are the concatenation */
    a->seen = xcalloc(R, 1);
    if (o->dh_partial) a->dh64 = xcalloc(R * H, sizeof(double));
    if (TK) {
        a->tki = xcalloc(R * TK, sizeof(int64_t));
        a->tkl = xcalloc(R * TK, sizeof(float));
        all_rows &= a->tki && a->tkl;
    }
    if (b->sum_p2) all_rows &= (a->sp = xcalloc(R, sizeof(float))) != NULL;
    if (!all_rows || !a->dh || !a->seen || (o->dh_partial && !a->dh64)) {
        dist_fail("out of host memory assembling the outputs");
        pass = 0;
    }
    size_t off_r = 0, off_v = 0, off_h = 0, off_k = 0;
    int64_t tp_mismatch = 0, pad_nonzero = 0, dup = 0;
    /* Ranks with tp_rank 0 place values; the others must match them bit for bit. */
    for (int pass_tp = 0; pass && pass_tp < 2; pass_tp++) {
        off_r = off_v = off_h = off_k = 0;
        for (int r = 0; r < dist_size; r++) {
            size_t nr = g->c_rows[r] / sizeof(int64_t);
            const int64_t *rows = (const int64_t *)((char *)g->rows + off_r);
            const float *v = (const float *)((char *)g->vals + off_v);
            const float *dh = (const float *)((char *)g->dh + off_h);
            const int64_t *ki = TK ? (const int64_t *)g->tki + off_k : NULL;
            const float *kl = TK ? (const float *)g->tkl + off_k : NULL;
            const float *sp = b->sum_p2 ? (const float *)g->sp + off_r / sizeof(int64_t) : NULL;
            int is_t0 = r % o->tp == 0;
            for (size_t i = 0; i < nr; i++) {
                int64_t gr = rows[i];
                if (gr < 0) {
                    /* padding rows are inactive when masked: exact zeros */
                    if (pass_tp == 0 && b->masked) {
                        int nz = 0;
                        for (int f = 0; f < NF; f++) nz |= v[NF * i + (size_t)f] != 0;
                        for (size_t j = 0; j < H; j++) nz |= dh[i * H + j] != 0;
                        for (size_t j = 0; j < TK; j++)
                            nz |= ki[i * TK + j] != -1 || kl[i * TK + j] != 0;
                        if (sp) nz |= sp[i] != 0;
                        pad_nonzero += nz;
                    }
                    continue;
                }
                if (pass_tp == 0 && a->dh64) /* partials: the TP sum in float64 */
                    for (size_t j = 0; j < H; j++) a->dh64[(size_t)gr * H + j] += dh[i * H + j];
                if (pass_tp == 0 && is_t0) {
                    dup += a->seen[gr]++ > 0;
                    for (int f = 0; f < NF; f++) a->row[f][gr] = v[NF * i + (size_t)f];
                    if (!a->dh64) memcpy(a->dh + (size_t)gr * H, dh + i * H, H * sizeof(float));
                    if (TK) {
                        memcpy(a->tki + (size_t)gr * TK, ki + i * TK, TK * sizeof(int64_t));
                        memcpy(a->tkl + (size_t)gr * TK, kl + i * TK, TK * sizeof(float));
                    }
                    if (sp) a->sp[gr] = sp[i];
                } else if (pass_tp == 1 && !is_t0) {
                    int differ = 0;
                    for (int f = 0; f < NF; f++)
                        differ |= memcmp(&a->row[f][gr], &v[NF * i + (size_t)f], 4) != 0;
                    if (TK) /* every TP rank holds the merged lists: the same bits */
                        differ |= memcmp(a->tki + (size_t)gr * TK, ki + i * TK,
                                         TK * sizeof(int64_t)) != 0 ||
                                  memcmp(a->tkl + (size_t)gr * TK, kl + i * TK,
                                         TK * sizeof(float)) != 0;
                    if (sp) differ |= memcmp(&a->sp[gr], &sp[i], 4) != 0;
                    tp_mismatch += differ;
                }
            }
            off_r += g->c_rows[r];
            off_v += g->c_vals[r];
            off_h += g->c_dh[r];
            off_k += nr * TK;
        }
    }
    for (size_t k = 0; a->dh64 && pass && k < R * H; k++) a->dh[k] = (float)a->dh64[k];
    int64_t missing = 0;
    for (size_t i = 0; i < R; i++) missing += a->seen && !a->seen[i];
    size_t dw_total = 0;
    for (int r = 0; r < dist_size; r++) dw_total += g->c_dw[r];
    if (dw_total != V * H * sizeof(float)) {
        printf("dweight: gathered %zu bytes, expected %zu\n", dw_total, V * H * sizeof(float));
        pass = 0;
    }
    printf("coverage: %lld rows missing, %lld computed twice; TP copies differing: %lld; "
           "nonzero padding rows: %lld\n",
           (long long)missing, (long long)dup, (long long)tp_mismatch, (long long)pad_nonzero);
    if (missing || dup || tp_mismatch || pad_nonzero) pass = 0;
    return pass;
}

/* 7b. rank 0: the run's time, and --bench's split of bin 0. */
static void print_times(const dopts *o, const dist_run *run) {
    printf("time: forward + backward %.3f ms (slowest rank, all bins, host copies included)\n",
           run->t_max * 1e3);
    if (!o->bench) return;
    const double *m = run->res->bench_ms;
    printf("bench: bin 0 of every rank (rank 0: %lld rows), %d reps, median of the "
           "slowest rank:\n"
           "  forward  %.3f ms with the TP combine, %.3f ms without (combine share "
           "%.1f%%)\n"
           "  backward %.3f ms with the dhidden all-reduce, %.3f ms without (share "
           "%.1f%%)\n",
           (long long)(run->sh->bin_off[1] - run->sh->bin_off[0]), (int)o->bench, m[0], m[2],
           m[0] > 0 ? (m[0] - m[2]) / m[0] * 100 : 0.0, m[1], m[3],
           m[1] > 0 ? (m[1] - m[3]) / m[1] * 100 : 0.0);
}

/* 7c. rank 0: the assembled outputs against the single-process run (ref and ref_ctx: the
 * caller frees them). Returns pass. */
static int check_reference(const dopts *o, const batch *b, const dist_run *run,
                           const assembled *a, result *ref, sph_ctx_t *ref_ctx) {
    const size_t R = (size_t)b->R, V = (size_t)b->V, H = (size_t)b->H;
    /* --reference ref: the float64 reference kernels on the CPU; device: the ranks' device and
     * kernels in one process, without a communicator (the single-GPU result, for shapes the
     * reference is too slow for). */
    sph_ctx_opts ro = SPH_CTX_OPTS_INIT;
    dev hd = {NULL, 0};
    if (o->ref_device) {
        ro = run->io;
        ro.force_kernel = o->kernel;
        hd.cuda = o->cuda;
    } else {
        ro.force_kernel = "ref";
    }
    int64_t *all = xcalloc(R, sizeof(int64_t));
    int64_t bo[2] = {0, (int64_t)R};
    int rok = all != NULL;
    for (size_t i = 0; rok && i < R; i++) all[i] = (int64_t)i;
    if (rok && sph_ctx_create(ref_ctx, &ro)) rok = dist_fail("ref context: %s", sph_last_error());
    hd.io = *ref_ctx;
    /* --topk: one more entry from the reference, the K-th's neighbour (run_report.c) */
    const size_t TK = (size_t)b->topk;
    batch rb = *b;
    if (TK && rb.topk < rb.V && rb.topk < 256) rb.topk++;
    /* One bin of all R rows; spans from the global mask with the same gap. */
    rok = rok && dist_run_head(*ref_ctx, &hd, &rb, all, bo, 1, 0, b->V, o->gap, 0, 0, NULL, 0,
                               ref);
    free(all);
    if (!rok) return 0;
    typedef struct { const char *name; const float *got, *want; size_t n; } cmp_t;
    cmp_t cmp[NF + 3];
    size_t nc = 0;
    for (int f = 0; f < NF; f++)
        if (f != F_LOGIT_MEAN || !b->K)
            cmp[nc++] = (cmp_t){dist_field_names[f], a->row[f], ref->row[f], R};
    cmp[nc++] = (cmp_t){"dhidden", a->dh, ref->dhidden, R * H};
    cmp[nc++] = (cmp_t){"dweight", a->dw, ref->dweight, V * H};
    if (b->sum_p2) cmp[nc++] = (cmp_t){"sum_p2", a->sp, ref->sum_p2, R};
    printf("check against the single-process %s (atol %g, rtol %g):\n",
           o->ref_device ? "run on the same device and kernels" : "reference", o->atol, o->rtol);
    int pass = 1;
    for (size_t k = 0; k < nc; k++) {
        errstat e = compare(cmp[k].got, cmp[k].want, (int64_t)cmp[k].n, o->atol, o->rtol);
        int good = e.worst_ratio <= 1.0;
        printf("  %-10s max abs err %.3e  max rel err %.3e  worst [%lld] got %.9g ref "
               "%.9g  %s\n",
               cmp[k].name, e.max_abs, e.max_rel, (long long)e.worst,
               e.worst >= 0 ? cmp[k].got[e.worst] : 0.0,
               e.worst >= 0 ? cmp[k].want[e.worst] : 0.0, good ? "ok" : "FAIL");
        pass &= good;
    }
    if (TK) pass &= check_topk(o, a->tki, a->tkl, ref, R, TK, (size_t)rb.topk);
    return pass;
}

/* 7d. rank 0: the files `spanhead run --outputs` writes in one process, all or none. Returns
 * 0 when they could not be written. */
static int write_outputs(const dopts *o, const batch *b, const dist_run *run,
                         const assembled *a) {
    int64_t sr[1] = {b->R}, srh[2] = {b->R, b->H}, svh[2] = {b->V, b->H};
    sph_cli_outset os = *run->out; /* begun before the run; released here */
    memset(run->out, 0, sizeof *run->out);
    int wok = 1;
    for (int f = 0; wok && f < NF; f++)
        if (f != F_LOGIT_MEAN || !b->K)
            wok = !sph_cli_outset_npy(&os, dist_field_names[f], 'f', 4, 1, sr, a->row[f]);
    wok = wok && !sph_cli_outset_npy(&os, "dhidden", 'f', 4, 2, srh, a->dh) &&
          !sph_cli_outset_npy(&os, "dweight", 'f', 4, 2, svh, a->dw);
    int64_t srk[2] = {b->R, b->topk};
    if (wok && b->topk)
        wok = !sph_cli_outset_npy(&os, "topk_ids", 'i', 8, 2, srk, a->tki) &&
              !sph_cli_outset_npy(&os, "topk_logprobs", 'f', 4, 2, srk, a->tkl);
    if (wok && b->sum_p2) wok = !sph_cli_outset_npy(&os, "sum_p2", 'f', 4, 1, sr, a->sp);
    wok = wok && !sph_cli_outset_commit(&os);
    if (wok) {
        printf("outputs: written to %s\n", o->outputs);
        return 1;
    }
    dist_fail("%s (nothing was written to %s)", os.err, o->outputs);
    return 0;
}

int dist_gather_check(const dopts *o, const batch *b, const dist_run *run) {
    int rc = 1;
    gathered g;
    memset(&g, 0, sizeof g);
    g.shard_comm = MPI_COMM_NULL;
    assembled a;
    memset(&a, 0, sizeof a);
    result ref;
    memset(&ref, 0, sizeof ref);
    sph_ctx_t ref_ctx = NULL;

    if (!gather_outputs(o, b, run, &g)) goto out;
    /* 7. rank 0: assemble, check, write */
    int pass = 1;
    if (dist_rank == 0) {
        pass = assemble(o, b, &g, &a);
        print_times(o, run);
        if (pass && o->check) pass = check_reference(o, b, run, &a, &ref, &ref_ctx);
        if (o->outputs && !pass) {
            printf("outputs: not written (the run failed)\n");
        } else if (o->outputs) {
            pass = write_outputs(o, b, run, &a);
        }
        printf("%s\n", !o->check ? (pass ? "DONE (not checked)" : "FAIL") : pass ? "PASS" : "FAIL");
        fflush(stdout);
    }
    MPI_Bcast(&pass, 1, MPI_INT, 0, MPI_COMM_WORLD);
    rc = pass ? 0 : 1;
out:
    dist_result_free(&ref);
    free(g.rows);
    free(g.vals);
    free(g.dh);
    free(g.dw);
    free(g.c_rows);
    free(g.c_vals);
    free(g.c_dh);
    free(g.c_dw);
    free(g.dw64);
    free(g.dw64_sum);
    free(g.tki), free(g.tkl), free(g.sp), free(g.c_tki), free(g.c_tkl), free(g.c_sp);
    for (int f = 0; f < NF; f++) free(a.row[f]);
    free(a.dh);
    free(a.seen);
    free(a.dh64);
    free(a.tki), free(a.tkl), free(a.sp);
    sph_ctx_destroy(ref_ctx);
    if (g.shard_comm != MPI_COMM_NULL) MPI_Comm_free(&g.shard_comm);
    return rc;
}
#else
/* without MPI the file holds nothing; ISO C wants a declaration in every translation unit */
typedef int sph_run_dist_check_no_mpi;
#endif /* SPH_HAVE_MPI */
