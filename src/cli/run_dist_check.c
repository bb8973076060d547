/*
 * run_dist_check.c - the end of the distributed runner (run_dist.c steps 6-7): every rank's
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

int dist_gather_check(const dopts *o, const batch *b, const dist_run *run) {
    const share *sh = run->sh;
    const result *res = run->res;
    const int64_t tp_rank = run->tp_rank, V_loc = run->V_loc;
    int rc = 1, ok;
    void *g_rows = NULL, *g_vals = NULL, *g_dh = NULL, *g_dw = NULL, *g_tki = NULL, *g_tkl = NULL;
    size_t *c_rows = NULL, *c_vals = NULL, *c_dh = NULL, *c_dw = NULL, *c_tki = NULL,
           *c_tkl = NULL;
    int64_t *G_tki = NULL; /* --topk: (R, K) assembled on rank 0 */
    float *G_tkl = NULL, *G_sp = NULL; /* --sum-p2: (R) */
    void *g_sp = NULL;
    size_t *c_sp = NULL;
    double *dw64 = NULL, *dw64_sum = NULL;
    float *G_row[NF] = {NULL}, *G_dh = NULL, *G_dw = NULL;
    int8_t *seen = NULL;
    double *dh64 = NULL;
    result ref;
    memset(&ref, 0, sizeof ref);
    sph_ctx_t ref_ctx = NULL;
    MPI_Comm shard_comm = MPI_COMM_NULL;

    /* 6. gather: row ids, per-row outputs, dhidden; dweight reduced over CP x DP */
    const size_t H = (size_t)b->H, n = (size_t)sh->n;
    float *vals = xcalloc(NF * n, sizeof(float));
    ok = vals != NULL;
    for (size_t i = 0; ok && i < n; i++)
        for (int f = 0; f < NF; f++) vals[NF * i + (size_t)f] = res->row[f][i];
    if (!dist_agree(ok)) {
        free(vals);
        goto out;
    }
    const size_t TK = (size_t)b->topk;
    ok = gatherv(sh->grow, n * sizeof(int64_t), &g_rows, &c_rows) &&
         gatherv(vals, n * NF * sizeof(float), &g_vals, &c_vals) &&
         gatherv(res->dhidden, n * H * sizeof(float), &g_dh, &c_dh) &&
         (!TK || (gatherv(res->topk_ids, n * TK * sizeof(int64_t), &g_tki, &c_tki) &&
                  gatherv(res->topk_lp, n * TK * sizeof(float), &g_tkl, &c_tkl))) &&
         (!b->sum_p2 || gatherv(res->sum_p2, n * sizeof(float), &g_sp, &c_sp));
    free(vals);
    if (!dist_agree(ok)) goto out;

    dw64 = xcalloc((size_t)V_loc * H, sizeof(double));
    dw64_sum = xcalloc((size_t)V_loc * H, sizeof(double));
    ok = dw64 && dw64_sum;
    for (size_t i = 0; ok && i < (size_t)V_loc * H; i++) dw64[i] = res->dweight[i];
    if (!dist_agree(ok)) goto out;
    MPI_Comm_split(MPI_COMM_WORLD, (int)tp_rank, dist_rank, &shard_comm);
    /* Float64 sum over the CP x DP replicas of this shard, to the replica with cp = dp = 0
     * (world rank tp_rank); chunked for MPI's int count. */
    for (size_t off = 0; off < (size_t)V_loc * H; off += (size_t)1 << 28) {
        size_t cnt = (size_t)V_loc * H - off;
        if (cnt > (size_t)1 << 28) cnt = (size_t)1 << 28;
        MPI_Reduce(dw64 + off, dw64_sum + off, (int)cnt, MPI_DOUBLE, MPI_SUM, 0, shard_comm);
    }
    float *dw_send = xcalloc((size_t)V_loc * H, sizeof(float));
    ok = dw_send != NULL;
    for (size_t i = 0; ok && i < (size_t)V_loc * H; i++) dw_send[i] = (float)dw64_sum[i];
    if (!dist_agree(ok)) {
        free(dw_send);
        goto out;
    }
    ok = gatherv(dw_send, dist_rank < o->tp ? (size_t)V_loc * H * sizeof(float) : 0, &g_dw, &c_dw);
    free(dw_send);
    if (!dist_agree(ok)) goto out;

    /* 7. rank 0: assemble, check, write */
    int pass = 1;
    if (dist_rank == 0) {
        const size_t R = (size_t)b->R, V = (size_t)b->V;
        int all_rows = 1;
        for (int f = 0; f < NF; f++) all_rows &= (G_row[f] = xcalloc(R, sizeof(float))) != NULL;
        G_dh = xcalloc(R * H, sizeof(float));
        G_dw = (float *)g_dw; /* shards in TP order are the concatenation */
        seen = xcalloc(R, 1);
        if (o->dh_partial) dh64 = xcalloc(R * H, sizeof(double));
        if (TK) {
            G_tki = xcalloc(R * TK, sizeof(int64_t));
            G_tkl = xcalloc(R * TK, sizeof(float));
            all_rows &= G_tki && G_tkl;
        }
        if (b->sum_p2) all_rows &= (G_sp = xcalloc(R, sizeof(float))) != NULL;
        if (!all_rows || !G_dh || !seen || (o->dh_partial && !dh64)) {
            dist_fail("out of host memory assembling the outputs");
            pass = 0;
        }
        size_t off_r = 0, off_v = 0, off_h = 0, off_k = 0;
        int64_t tp_mismatch = 0, pad_nonzero = 0, dup = 0;
        /* Ranks with tp_rank 0 place values; the others must match them bit for bit. */
        for (int pass_tp = 0; pass && pass_tp < 2; pass_tp++) {
            off_r = off_v = off_h = off_k = 0;
            for (int r = 0; r < dist_size; r++) {
                size_t nr = c_rows[r] / sizeof(int64_t);
                const int64_t *rows = (const int64_t *)((char *)g_rows + off_r);
                const float *v = (const float *)((char *)g_vals + off_v);
                const float *dh = (const float *)((char *)g_dh + off_h);
                const int64_t *ki = TK ? (const int64_t *)g_tki + off_k : NULL;
                const float *kl = TK ? (const float *)g_tkl + off_k : NULL;
                const float *sp =
                    b->sum_p2 ? (const float *)g_sp + off_r / sizeof(int64_t) : NULL;
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
                    if (pass_tp == 0 && dh64) /* partials: the TP sum in float64 */
                        for (size_t j = 0; j < H; j++) dh64[(size_t)gr * H + j] += dh[i * H + j];
                    if (pass_tp == 0 && is_t0) {
                        dup += seen[gr]++ > 0;
                        for (int f = 0; f < NF; f++) G_row[f][gr] = v[NF * i + (size_t)f];
                        if (!dh64) memcpy(G_dh + (size_t)gr * H, dh + i * H, H * sizeof(float));
                        if (TK) {
                            memcpy(G_tki + (size_t)gr * TK, ki + i * TK, TK * sizeof(int64_t));
                            memcpy(G_tkl + (size_t)gr * TK, kl + i * TK, TK * sizeof(float));
                        }
                        if (sp) G_sp[gr] = sp[i];
                    } else if (pass_tp == 1 && !is_t0) {
                        int differ = 0;
                        for (int f = 0; f < NF; f++)
                            differ |= memcmp(&G_row[f][gr], &v[NF * i + (size_t)f], 4) != 0;
                        if (TK) /* every TP rank holds the merged lists: the same bits */
                            differ |= memcmp(G_tki + (size_t)gr * TK, ki + i * TK,
                                             TK * sizeof(int64_t)) != 0 ||
                                      memcmp(G_tkl + (size_t)gr * TK, kl + i * TK,
                                             TK * sizeof(float)) != 0;
                        if (sp) differ |= memcmp(&G_sp[gr], &sp[i], 4) != 0;
                        tp_mismatch += differ;
                    }
                }
                off_r += c_rows[r];
                off_v += c_vals[r];
                off_h += c_dh[r];
                off_k += nr * TK;
            }
        }
        for (size_t k = 0; dh64 && pass && k < R * H; k++) G_dh[k] = (float)dh64[k];
        int64_t missing = 0;
        for (size_t i = 0; i < R; i++) missing += seen && !seen[i];
        size_t dw_total = 0;
        for (int r = 0; r < dist_size; r++) dw_total += c_dw[r];
        if (dw_total != V * H * sizeof(float)) {
            printf("dweight: gathered %zu bytes, expected %zu\n", dw_total, V * H * sizeof(float));
            pass = 0;
        }
        printf("coverage: %lld rows missing, %lld computed twice; TP copies differing: %lld; "
               "nonzero padding rows: %lld\n",
               (long long)missing, (long long)dup, (long long)tp_mismatch,
               (long long)pad_nonzero);
        if (missing || dup || tp_mismatch || pad_nonzero) pass = 0;
        printf("time: forward + backward %.3f ms (slowest rank, all bins, host copies included)\n",
               run->t_max * 1e3);
        if (o->bench) {
            const double *m = res->bench_ms;
            printf("bench: bin 0 of every rank (rank 0: %lld rows), %d reps, median of the "
                   "slowest rank:\n"
                   "  forward  %.3f ms with the TP combine, %.3f ms without (combine share "
                   "%.1f%%)\n"
                   "  backward %.3f ms with the dhidden all-reduce, %.3f ms without (share "
                   "%.1f%%)\n",
                   (long long)(sh->bin_off[1] - sh->bin_off[0]), (int)o->bench, m[0], m[2],
                   m[0] > 0 ? (m[0] - m[2]) / m[0] * 100 : 0.0, m[1], m[3],
                   m[1] > 0 ? (m[1] - m[3]) / m[1] * 100 : 0.0);
        }

        if (pass && o->check) {
            /* --reference ref: the float64 reference kernels on the CPU; device: the ranks'
             * device and kernels in one process, without a communicator (the single-GPU
             * result, for shapes the reference is too slow for). */
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
            if (rok && sph_ctx_create(&ref_ctx, &ro))
                rok = dist_fail("ref context: %s", sph_last_error());
            hd.io = ref_ctx;
            /* --topk: one more entry from the reference, the K-th's neighbour (run_report.c) */
            batch rb = *b;
            if (TK && rb.topk < rb.V && rb.topk < 256) rb.topk++;
            /* One bin of all R rows; spans from the global mask with the same gap. */
            rok = rok && dist_run_head(ref_ctx, &hd, &rb, all, bo, 1, 0, b->V, o->gap, 0, 0, NULL,
                                       0, &ref);
            free(all);
            if (!rok) {
                pass = 0;
            } else {
                typedef struct { const char *name; const float *got, *want; size_t n; } cmp_t;
                cmp_t cmp[NF + 3];
                size_t nc = 0;
                for (int f = 0; f < NF; f++)
                    if (f != F_LOGIT_MEAN || !b->K)
                        cmp[nc++] = (cmp_t){dist_field_names[f], G_row[f], ref.row[f], R};
                cmp[nc++] = (cmp_t){"dhidden", G_dh, ref.dhidden, R * H};
                cmp[nc++] = (cmp_t){"dweight", G_dw, ref.dweight, V * H};
                if (b->sum_p2) cmp[nc++] = (cmp_t){"sum_p2", G_sp, ref.sum_p2, R};
                printf("check against the single-process %s (atol %g, rtol %g):\n",
                       o->ref_device ? "run on the same device and kernels" : "reference",
                       o->atol, o->rtol);
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
                if (TK) pass &= check_topk(o, G_tki, G_tkl, &ref, R, TK, (size_t)rb.topk);
            }
        }
        if (o->outputs && !pass) {
            printf("outputs: not written (the run failed)\n");
        } else if (o->outputs) {
            /* The files `spanhead run --outputs` writes in one process, all or none. */
            int64_t sr[1] = {b->R}, srh[2] = {b->R, b->H}, svh[2] = {b->V, b->H};
            sph_cli_outset os = *run->out; /* begun before the run; released here */
            memset(run->out, 0, sizeof *run->out);
            int wok = 1;
            for (int f = 0; wok && f < NF; f++)
                if (f != F_LOGIT_MEAN || !b->K)
                    wok = !sph_cli_outset_npy(&os, dist_field_names[f], 'f', 4, 1, sr, G_row[f]);
            wok = wok && !sph_cli_outset_npy(&os, "dhidden", 'f', 4, 2, srh, G_dh) &&
                  !sph_cli_outset_npy(&os, "dweight", 'f', 4, 2, svh, G_dw);
            int64_t srk[2] = {b->R, b->topk};
            if (wok && TK)
                wok = !sph_cli_outset_npy(&os, "topk_ids", 'i', 8, 2, srk, G_tki) &&
                      !sph_cli_outset_npy(&os, "topk_logprobs", 'f', 4, 2, srk, G_tkl);
            if (wok && b->sum_p2) wok = !sph_cli_outset_npy(&os, "sum_p2", 'f', 4, 1, sr, G_sp);
            wok = wok && !sph_cli_outset_commit(&os);
            if (wok) {
                printf("outputs: written to %s\n", o->outputs);
            } else {
                dist_fail("%s (nothing was written to %s)", os.err, o->outputs);
                pass = 0;
            }
        }
        printf("%s\n", !o->check ? (pass ? "DONE (not checked)" : "FAIL") : pass ? "PASS" : "FAIL");
        fflush(stdout);
    }
    MPI_Bcast(&pass, 1, MPI_INT, 0, MPI_COMM_WORLD);
    rc = pass ? 0 : 1;
out:
    dist_result_free(&ref);
    free(g_rows);
    free(g_vals);
    free(g_dh);
    free(g_dw);
    free(g_tki), free(g_tkl), free(c_tki), free(c_tkl), free(G_tki), free(G_tkl);
    free(g_sp), free(c_sp), free(G_sp);
    free(c_rows);
    free(c_vals);
    free(c_dh);
    free(c_dw);
    free(dw64);
    free(dw64_sum);
    for (int f = 0; f < NF; f++) free(G_row[f]);
    free(G_dh);
    free(seen);
    free(dh64);
    sph_ctx_destroy(ref_ctx);
    if (shard_comm != MPI_COMM_NULL) MPI_Comm_free(&shard_comm);
    return rc;
}
#else
/* without MPI the file holds nothing; ISO C wants a declaration in every translation unit */
typedef int sph_run_dist_check_no_mpi;
#endif /* SPH_HAVE_MPI */
