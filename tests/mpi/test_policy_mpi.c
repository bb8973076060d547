/*
 * test_policy_mpi.c - the fused policy loss under mpirun (2 or 4 ranks), against the
 * single-process float64 reference of the whole problem on every rank:
 *   - TP: the world is one tensor-parallel group (vocabulary shards, MPI communicator);
 *     every rank must get bitwise the same loss, metrics and logprob, close to the reference;
 *     dweight is the rank's rows of the reference's, dhidden (all-reduced) the reference's;
 *   - sequence group (context parallel): the world holds one problem split by rows with
 *     sequences crossing ranks (seq_comm over MPI); the ranks' metrics add up to the
 *     reference's, each rank's dhidden rows match, dweight sums to the reference's;
 *   - with 4 ranks, both at once: 2 TP ranks x 2 sequence-group ranks.
 * Every loss (ppo, cispo, gspo) with a KL and the sequence-level aggregations; reference and
 * optimized kernels on the ranks. Every call also asks for the head's extras (issue 25: the
 * top-12 ids and log-probs, K above a rank's V_loc with 4 TP ranks, and sum_p2): the same bits
 * on every TP rank, and the reference's of the rank's rows.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mpitest.h"
#include "testutil.h"

typedef struct prob {
    int64_t N, H, V;
    float *h, *w, *adv, *old, *ref;
    int64_t *tgt, *seq;
    uint8_t *mask;
} prob;

static void prob_make(prob *p, uint64_t seed, int64_t N, int64_t H, int64_t V) {
    sph_rng r;
    rng_seed(&r, seed);
    p->N = N, p->H = H, p->V = V;
    p->h = malloc((size_t)(N * H) * 4), p->w = malloc((size_t)(V * H) * 4);
    p->adv = malloc((size_t)N * 4), p->old = malloc((size_t)N * 4), p->ref = malloc((size_t)N * 4);
    p->tgt = malloc((size_t)N * 8), p->seq = malloc((size_t)N * 8), p->mask = malloc((size_t)N);
    for (int64_t k = 0; k < N * H; k++) p->h[k] = (float)rng_normal(&r);
    for (int64_t k = 0; k < V * H; k++) p->w[k] = (float)(rng_normal(&r) * 2.0 / sqrt((double)H));
    int64_t s = 0, left = 0;
    for (int64_t i = 0; i < N; i++) {
        if (!left) s++, left = rng_range(&r, 1, 7);
        left--;
        p->seq[i] = s;
        p->tgt[i] = i % 9 == 4 ? -100 : rng_range(&r, 0, V - 1);
        p->mask[i] = rng_uniform(&r) < 0.8;
        p->adv[i] = (float)rng_normal(&r);
        p->old[i] = (float)(-3.5 + 0.5 * rng_normal(&r));
        p->ref[i] = (float)(-3.5 + 0.5 * rng_normal(&r));
    }
}

static void prob_free(prob *p) {
    free(p->h), free(p->w), free(p->adv), free(p->old), free(p->ref), free(p->tgt), free(p->seq);
    free(p->mask);
}

typedef struct outs {
    float *lp, *dh, *dw, met[SPH_POLICY_N_METRICS];
    int64_t *tki; /* (n_pad, XK) the extras */
    float *tkl, *sp2;
} outs;

#define XK 12 /* top-k of every call: above V_loc = 10 with 4 TP ranks of V = 41 */

/* One policy call on rows [r0, r0 + n) (padded to n_pad rows with inactive ones) and vocabulary
 * rows [v0, v0 + V_loc) of p. */
static sph_status run(const prob *p, const char *kernel, sph_comm_t tp, sph_comm_t seq,
                      int64_t r0, int64_t n, int64_t n_pad, int64_t v0, int64_t V_loc,
                      sph_pg_loss loss, sph_loss_agg agg, outs *o) {
    const int64_t H = p->H;
    float *h = calloc((size_t)(n_pad * H) + 1, 4), *adv = calloc((size_t)n_pad + 1, 4);
    float *old = calloc((size_t)n_pad + 1, 4), *ref = calloc((size_t)n_pad + 1, 4);
    int64_t *tgt = malloc((size_t)n_pad * 8 + 8), *sq = malloc((size_t)n_pad * 8 + 8);
    uint8_t *mask = calloc((size_t)n_pad + 1, 1);
    for (int64_t i = 0; i < n_pad; i++) {
        int in = i < n;
        tgt[i] = in ? p->tgt[r0 + i] : -1;
        sq[i] = in ? p->seq[r0 + i] : -7;
        if (!in) continue;
        mask[i] = p->mask[r0 + i], adv[i] = p->adv[r0 + i], old[i] = p->old[r0 + i];
        ref[i] = p->ref[r0 + i];
        memcpy(h + i * H, p->h + (r0 + i) * H, (size_t)H * 4);
    }
    o->lp = malloc((size_t)n_pad * 4 + 4);
    o->dh = malloc((size_t)(n_pad * H) * 4 + 4);
    o->dw = malloc((size_t)(V_loc * H) * 4 + 4);
    poison_f32(o->lp, (size_t)n_pad), poison_f32(o->dh, (size_t)(n_pad * H));
    poison_f32(o->dw, (size_t)(V_loc * H)), poison_f32(o->met, SPH_POLICY_N_METRICS);
    o->tki = malloc((size_t)(n_pad * XK) * 8 + 8), o->tkl = malloc((size_t)(n_pad * XK) * 4 + 4);
    o->sp2 = malloc((size_t)n_pad * 4 + 4);
    for (int64_t k = 0; k < n_pad * XK; k++) o->tki[k] = 0x5a5a5a5a5aLL;
    poison_f32(o->tkl, (size_t)(n_pad * XK)), poison_f32(o->sp2, (size_t)n_pad);

    int64_t sh_h[2], sh_w[2], sh_n[1], sh_m[1], sh_dh[2], sh_dw[2];
    sph_tensor th = tensor2(h, SPH_F32, sh_h, n_pad, H);
    sph_tensor tw = tensor2(p->w + v0 * H, SPH_F32, sh_w, V_loc, H);
    sph_tensor tt = tensor1(tgt, SPH_I64, sh_n, n_pad), tm = tensor1(mask, SPH_U8, sh_n, n_pad);
    sph_tensor tl = tensor1(o->lp, SPH_F32, sh_n, n_pad);
    sph_tensor ta = tensor1(adv, SPH_F32, sh_n, n_pad), to = tensor1(old, SPH_F32, sh_n, n_pad);
    sph_tensor tr = tensor1(ref, SPH_F32, sh_n, n_pad), ts = tensor1(sq, SPH_I64, sh_n, n_pad);
    sph_tensor tmet = tensor1(o->met, SPH_F32, sh_m, SPH_POLICY_N_METRICS);
    sph_tensor tdh = tensor2(o->dh, SPH_F32, sh_dh, n_pad, H);
    sph_tensor tdw = tensor2(o->dw, SPH_F32, sh_dw, V_loc, H);
    int64_t sh_ti[2], sh_tl[2];
    sph_tensor tti = tensor2(o->tki, SPH_I64, sh_ti, n_pad, XK);
    sph_tensor ttl = tensor2(o->tkl, SPH_F32, sh_tl, n_pad, XK);
    sph_tensor tsp = tensor1(o->sp2, SPH_F32, sh_n, n_pad);
    sph_head_args a = SPH_HEAD_ARGS_INIT;
    a.hidden = &th, a.weight = &tw, a.targets = &tt, a.active_mask = &tm, a.logprob = &tl;
    a.vocab_start = v0, a.vocab_total = p->V;
    a.dhidden = &tdh, a.dweight = &tdw, a.allreduce_dhidden = tp != NULL;
    a.topk_ids = &tti, a.topk_logprobs = &ttl, a.sum_p2 = &tsp;
    sph_policy_args pa = SPH_POLICY_ARGS_INIT;
    pa.loss = loss, pa.agg = agg, pa.kl = SPH_KL_K3, pa.kl_coef = 0.05, pa.entropy_coef = 0.02;
    pa.clip_high = 0.28, pa.clip_ratio_c = loss == SPH_PG_CISPO ? HUGE_VAL : 3.0;
    pa.norm_length = 9.0;
    pa.advantages = &ta, pa.old_logprob = &to, pa.ref_logprob = &tr, pa.seq_id = &ts;
    pa.metrics = &tmet, pa.seq_comm = seq;
    sph_ctx_opts co = SPH_CTX_OPTS_INIT;
    co.force_kernel = kernel, co.num_threads = 1, co.tp_comm = tp;
    sph_ctx_t ctx = NULL;
    sph_status st = sph_ctx_create(&ctx, &co);
    size_t bytes = 0;
    void *ws = NULL;
    if (st == SPH_OK) st = sph_policy_loss_workspace_size(ctx, &a, &pa, &bytes);
    if (st == SPH_OK) ws = malloc(bytes + 1), st = sph_policy_loss(ctx, &a, &pa, ws, bytes);
    free(ws);
    sph_ctx_destroy(ctx);
    free(h), free(adv), free(old), free(ref), free(tgt), free(sq), free(mask);
    return st;
}

static void outs_free(outs *o) {
    free(o->lp), free(o->dh), free(o->dw), free(o->tki), free(o->tkl), free(o->sp2);
}

/* The extras of rows [0, n) against the reference's rows [r0, r0 + n): log-probs by position,
 * ids where the reference's log-probs leave a gap above 1e-4 to both neighbours inside the
 * list, rows without loss exactly (-1, 0). */
static int extras_close(const outs *o, const outs *ref, int64_t r0, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < XK; k++) {
            const float g = o->tkl[i * XK + k], *rl = ref->tkl + (r0 + i) * XK;
            const int64_t id = o->tki[i * XK + k], rid = ref->tki[(r0 + i) * XK + k];
            if (!(fabs((double)g - rl[k]) <= TOL_CPU_F32 * (1 + fabs(rl[k])))) return 0;
            if (rid < 0 && (id != -1 || g != 0.0f)) return 0;
            const int sep = rid >= 0 && (k == 0 || rl[k - 1] - rl[k] > 1e-4) && k + 1 < XK &&
                            rl[k] - rl[k + 1] > 1e-4;
            if (sep && id != rid) return 0;
        }
    return 1;
}

static int close_to(const float *got, const float *ref, int64_t n, double tol) {
    double mx = 0;
    for (int64_t k = 0; k < n; k++) mx = fmax(mx, fabs(ref[k]));
    for (int64_t k = 0; k < n; k++)
        if (!(fabs((double)got[k] - ref[k]) <= tol * (mx + 0.5))) return 0;
    return 1;
}

static int metrics_close(const double *got, const float *ref, double tol) {
    for (int k = 0; k < SPH_POLICY_N_METRICS; k++)
        if (!(fabs(got[k] - ref[k]) <= tol * (0.05 + fabs(ref[k])))) return 0;
    return 1;
}

/* tp x cp = world: TP groups of consecutive ranks, sequence groups across them. */
static void check(const prob *p, const char *kernel, int tp, sph_pg_loss loss,
                  sph_loss_agg agg) {
    const int cp = mt_size / tp, tp_rank = mt_rank % tp, cp_rank = mt_rank / tp;
    outs ref;
    MT_OK(run(p, "ref", NULL, NULL, 0, p->N, p->N, 0, p->V, loss, agg, &ref));
    /* the TP group */
    sph_comm_t tpc = NULL, sqc = NULL;
    const int64_t v0 = p->V * tp_rank / tp, v1 = p->V * (tp_rank + 1) / tp;
    if (tp > 1) {
        sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
        cfg.tp = tp, cfg.cp = cp, cfg.vocab_total = p->V, cfg.vocab_start = v0;
        cfg.vocab_local = v1 - v0, cfg.dtype = SPH_F32;
        int64_t a, b, c;
        MT_OK(sph_comm_create_mpi_world(&tpc, &cfg, &a, &b, &c));
    }
    /* the sequence group: ranks with the same tp_rank (a placeholder configuration: each rank
     * one id of a vocabulary of cp, as sph_policy_args.seq_comm asks nothing else of it) */
    MPI_Comm cpw;
    MPI_Comm_split(MPI_COMM_WORLD, tp_rank, cp_rank, &cpw);
    if (cp > 1) {
        sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
        cfg.tp = cp, cfg.vocab_total = cp, cfg.vocab_start = cp_rank, cfg.vocab_local = 1;
        MT_OK(sph_comm_create_mpi(&sqc, &cpw, &cfg));
    }
    const int64_t n_pad = (p->N + cp - 1) / cp, r0 = p->N * cp_rank / cp;
    const int64_t n = p->N * (cp_rank + 1) / cp - r0;
    outs o;
    MT_OK(run(p, kernel, tpc, sqc, r0, n, n_pad, v0, v1 - v0, loss, agg, &o));
    char cs[160];
    snprintf(cs, sizeof cs, "policy_mpi(kernel=%s,tp=%d,cp=%d,loss=%d,agg=%d)",
             kernel ? kernel : "best", tp, cp, (int)loss, (int)agg);
    /* every TP rank: the same bits */
    float *all = malloc((size_t)mt_size * SPH_POLICY_N_METRICS * 4);
    MPI_Allgather(o.met, SPH_POLICY_N_METRICS, MPI_FLOAT, all, SPH_POLICY_N_METRICS, MPI_FLOAT,
                  MPI_COMM_WORLD);
    const int base = cp_rank * tp;
    for (int t = 0; t < tp; t++)
        MT_CHECK(!memcmp(all + (base + t) * SPH_POLICY_N_METRICS, o.met,
                         SPH_POLICY_N_METRICS * 4),
                 "%s: metrics of TP rank %d differ from rank %d's", cs, t, tp_rank);
    free(all);
    /* the sequence group's metrics add up to the reference's (counts: the group's) */
    double sum[SPH_POLICY_N_METRICS], mine[SPH_POLICY_N_METRICS];
    for (int k = 0; k < SPH_POLICY_N_METRICS; k++) mine[k] = o.met[k];
    MPI_Allreduce(mine, sum, SPH_POLICY_N_METRICS, MPI_DOUBLE, MPI_SUM, cpw);
    sum[SPH_METRIC_TOKENS] = o.met[SPH_METRIC_TOKENS];
    sum[SPH_METRIC_SEQS] = o.met[SPH_METRIC_SEQS];
    MT_CHECK(metrics_close(sum, ref.met, TOL_CPU_F32), "%s: metrics (loss %g vs %g)", cs,
             sum[SPH_METRIC_LOSS], (double)ref.met[SPH_METRIC_LOSS]);
    MT_CHECK(close_to(o.lp, ref.lp + r0, n, TOL_CPU_F32), "%s: logprob", cs);
    MT_CHECK(close_to(o.dh, ref.dh + r0 * p->H, n * p->H, TOL_CPU_F32), "%s: dhidden", cs);
    MT_CHECK(extras_close(&o, &ref, r0, n), "%s: top-k", cs);
    MT_CHECK(close_to(o.sp2, ref.sp2 + r0, n, TOL_CPU_F32), "%s: sum_p2", cs);
    {   /* the extras: the same bits on every TP rank (a hash of them, gathered) */
        uint64_t hx = 1469598103934665603ull, *hs = malloc((size_t)mt_size * 8);
        const unsigned char *bufs[3] = {(const void *)o.tki, (const void *)o.tkl,
                                        (const void *)o.sp2};
        const size_t lens[3] = {(size_t)(n * XK) * 8, (size_t)(n * XK) * 4, (size_t)n * 4};
        for (int b = 0; b < 3; b++)
            for (size_t q = 0; q < lens[b]; q++) hx = (hx ^ bufs[b][q]) * 1099511628211ull;
        MPI_Allgather(&hx, 1, MPI_UINT64_T, hs, 1, MPI_UINT64_T, MPI_COMM_WORLD);
        for (int t = 0; t < tp; t++)
            MT_CHECK(hs[cp_rank * tp + t] == hx, "%s: extras of TP rank %d differ from rank %d's",
                     cs, t, tp_rank);
        free(hs);
    }
    float *dw = malloc((size_t)((v1 - v0) * p->H) * 4 + 4);
    MPI_Allreduce(o.dw, dw, (int)((v1 - v0) * p->H), MPI_FLOAT, MPI_SUM, cpw);
    MT_CHECK(close_to(dw, ref.dw + v0 * p->H, (v1 - v0) * p->H, TOL_CPU_F32), "%s: dweight", cs);
    free(dw);
    outs_free(&o), outs_free(&ref);
    sph_comm_destroy(tpc);
    sph_comm_destroy(sqc);
    MPI_Comm_free(&cpw);
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    uint64_t seed = test_seed();
    MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    prob p;
    prob_make(&p, seed, 53, 12, 41);
    const char *kernels[2] = {"ref", NULL};
    for (int k = 0; k < 2; k++) {
        check(&p, kernels[k], mt_size, SPH_PG_PPO, SPH_AGG_SEQ_MEAN_TOKEN_MEAN);   /* TP */
        check(&p, kernels[k], mt_size, SPH_PG_GSPO, SPH_AGG_TOKEN_MEAN);
        check(&p, kernels[k], 1, SPH_PG_GSPO, SPH_AGG_SEQ_MEAN_TOKEN_MEAN);      /* groups */
        check(&p, kernels[k], 1, SPH_PG_CISPO, SPH_AGG_SEQ_MEAN_TOKEN_SUM_NORM);
        if (mt_size == 4) {
            check(&p, kernels[k], 2, SPH_PG_PPO, SPH_AGG_SEQ_MEAN_TOKEN_SUM);     /* both */
            check(&p, kernels[k], 2, SPH_PG_GSPO, SPH_AGG_SEQ_MEAN_TOKEN_MEAN);
        }
    }
    prob_free(&p);
    return mt_finish("test_policy_mpi");
}
