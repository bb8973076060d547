/*
 * policy_cpu.c - the CPU backend of the fused policy loss, on top of head_cpu.c.
 *
 *   1. Pre-pass (host, O(N log N)): the active rows (the head's mask / spans and target >= 0,
 *      which become the head's mask), the group rows (gathered over seq_comm when given),
 *      their sequences by a sort of (seq_id, group row) over the active group rows (ties
 *      impossible: deterministic), T, S, T_j, and the weights c_i.
 *   2. ppo / cispo: the head's one-pass forward with this plan's row hook bound; right after
 *      each chunk's rows are finalized, head_cpu.c calls the hook (cpu_rows), which turns their
 *      logprob and entropy into the upstream gradients g_i, e_i the chunk's dlogits use
 *      (6 N_active H V flops; no second logits pass).
 *      gspo: the head's forward, rho_j per sequence (sums over the sorted group rows, in that
 *      order), g and e of every row, then the head's backward (8 N_active H V flops).
 *   3. Metrics: the per-row function once more over the active rows, float64 sums in row
 *      order (every TP rank holds the same rows and statistics: the same bits).
 *
 * The head's passes run through the context's table (ctx->head: the optimized CPU head).
 * Workspace: the head's (forward, or max of forward and backward for gspo) first, then
 * (64-byte aligned) act (N), c and rho (N doubles), g, e (N floats), logprob / entropy / stats
 * when the caller gave none (gspo: always, and its sum_p2 and top-k lists too, so that a
 * refused backward leaves every output unwritten), the group records (P N + N) and, with
 * sequences, the sorted keys (P N pairs) and per-group-row counts and sums (P N each).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "policy/policy.h"

typedef struct grow {
    int64_t seq;
    int64_t act;
    double delta;
} grow;

typedef struct key {
    int64_t seq, k; /* sequence id, group row */
} key;

static int cmp_key(const void *a, const void *b) {
    const key *x = a, *y = b;
    if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
    return (x->k > y->k) - (x->k < y->k);
}

static int64_t target_of(const sph_head_plan *p, int64_t i) {
    return p->tgt_i64 ? ((const int64_t *)p->targets)[i]
                      : (int64_t)((const int32_t *)p->targets)[i];
}

// ---- the group --------------------------------------------------------------------------

sph_status sph_policy_gather_host(const sph_policy_plan *pp, const void *send, void *recv,
                                  size_t bytes_per_rank) {
    sph_comm_t c = pp->seq_comm;
    if (!c || c->size <= 1) {
        if (recv != send) memcpy(recv, send, bytes_per_rank);
        return SPH_OK;
    }
    /* every rank must hold the same number of rows: check first (one small allgather),
     * so a mismatch is an error on every rank rather than a wrong-sized collective */
    int64_t n = pp->N, *ns = sph_malloc((size_t)c->size * sizeof *ns);
    SPH_CHECK(ns != NULL, SPH_ERR_ALLOC, "policy: out of host memory");
    sph_status st = c->ops->allgather(c, &n, ns, sizeof n, NULL);
    for (int64_t r = 0; st == SPH_OK && r < c->size; r++)
        if (ns[r] != n)
            st = sph_err(SPH_ERR_MISMATCH,
                         "seq_comm: rank %lld has N = %lld rows, rank %lld has %lld (every rank "
                         "of the sequence group passes the same N)",
                         (long long)c->rank, (long long)n, (long long)r, (long long)ns[r]);
    sph_free(ns);
    if (st != SPH_OK) return st == SPH_ERR_MISMATCH ? st : sph_err_prefix(st, "seq_comm: ");
    st = c->ops->allgather(c, send, recv, bytes_per_rank, NULL);
    return st == SPH_OK ? st : sph_err_prefix(st, "seq_comm: allgather: ");
}

// ---- workspace ------------------------------------------------------------------------

typedef struct cpu_layout {
    size_t head, o_act, o_c, o_rho, o_g, o_e, o_lp, o_ent, o_st, o_lse, o_lm, o_sp2, o_tki,
        o_tkl, o_mine, o_all, o_keys, o_cnt, o_sum, total;
} cpu_layout;

static size_t take(size_t *off, size_t bytes) {
    size_t o = *off;
    *off += (bytes + 63) & ~(size_t)63;
    return o;
}

static sph_status layout_of(sph_ctx_t ctx, const sph_policy_plan *pp, cpu_layout *L) {
    const sph_head_plan *hp = &pp->head;
    memset(L, 0, sizeof *L);
    SPH_TRY(sph_policy_head_workspace(ctx, pp, &L->head));
    const size_t N = (size_t)pp->N, G = (size_t)pp->group * N;
    size_t off = 0; /* offsets inside the policy area */
    L->o_act = take(&off, N);
    L->o_c = take(&off, N * sizeof(double));
    L->o_rho = take(&off, pp->coef.loss == SPH_PM_GSPO ? N * sizeof(double) : 0);
    L->o_g = take(&off, N * sizeof(float));
    L->o_e = take(&off, N * sizeof(float));
    /* gspo: its forward writes here, the caller's buffers get a copy once the backward took
     * the gradients (a refused backward leaves them untouched) */
    const int own = pp->coef.loss == SPH_PM_GSPO;
    L->o_lp = take(&off, hp->logprob && !own ? 0 : N * sizeof(float));
    L->o_ent = take(&off, hp->entropy && !own ? 0 : N * sizeof(float));
    L->o_st = take(&off, hp->stats && !own ? 0 : 3 * N * sizeof(float));
    L->o_lse = take(&off, own && hp->lse ? N * sizeof(float) : 0);
    L->o_lm = take(&off, own && hp->logit_mean ? N * sizeof(float) : 0);
    /* gspo's extras likewise (compact (N, K) lists, copied into the caller's strides) */
    const size_t K = (size_t)hp->topk;
    L->o_sp2 = take(&off, own && hp->sum_p2 ? N * sizeof(float) : 0);
    L->o_tki = take(&off, own ? N * K * sizeof(int64_t) : 0);
    L->o_tkl = take(&off, own ? N * K * sizeof(float) : 0);
    L->o_mine = take(&off, N * sizeof(grow));
    L->o_all = take(&off, pp->group > 1 ? G * sizeof(grow) : 0);
    L->o_keys = take(&off, pp->need_seq ? G * sizeof(key) : 0);
    L->o_cnt = take(&off, pp->need_seq ? G * sizeof(int64_t) : 0);
    L->o_sum = take(&off, pp->coef.loss == SPH_PM_GSPO ? G * sizeof(double) : 0);
    /* the area starts after the head's, aligned inside 64 bytes of slack */
    L->total = ((L->head + 63) & ~(size_t)63) + 64 + off;
    return SPH_OK;
}

static sph_status cpu_workspace(sph_ctx_t ctx, const sph_policy_plan *pp, size_t *bytes) {
    cpu_layout L;
    SPH_TRY(layout_of(ctx, pp, &L));
    *bytes = L.total;
    return SPH_OK;
}

// ---- per-row pieces ---------------------------------------------------------------------

/* The row hook (plan.h): g and e of the listed rows, whose logprob and entropy are final. */
static void cpu_rows(void *arg, const int64_t *rows, int64_t n) {
    const sph_policy_plan *pp = arg;
    for (int64_t q = 0; q < n; q++) {
        const int64_t i = rows[q];
        double g = 0, e = 0;
        if (pp->act[i])
            sph_policy_row_full(&pp->coef, pp->c[i], pp->isw ? pp->isw[i] : 1.0, pp->logp[i],
                                pp->ent[i], pp->adv[i], pp->old[i], pp->ref ? pp->ref[i] : 0.0,
                                pp->rho ? pp->rho[i] : 0.0, &g, &e, NULL);
        pp->g[i] = (float)g;
        pp->e[i] = (float)e;
    }
}

typedef struct cpu_run {
    grow *mine, *all;
    key *keys;
    int64_t *cnt;  /* (G) active rows of the group row's sequence */
    double *sum;   /* (G) gspo: sum of delta over the group row's sequence */
    int64_t n_keys, T, S;
} cpu_run;

/* Sorted active group rows -> per-sequence counts (and, with sums, delta sums), S. */
static void sequences(cpu_run *r, int with_delta) {
    r->S = 0;
    for (int64_t a = 0; a < r->n_keys;) {
        int64_t b = a, cnt = 0;
        double s = 0;
        while (b < r->n_keys && r->keys[b].seq == r->keys[a].seq) {
            cnt++;
            if (with_delta) s += r->all[r->keys[b].k].delta; /* group-row order */
            b++;
        }
        for (int64_t m = a; m < b; m++) {
            r->cnt[r->keys[m].k] = cnt;
            if (with_delta) r->sum[r->keys[m].k] = s;
        }
        r->S++;
        a = b;
    }
}

static sph_status prepass(const sph_head_plan *hp, sph_policy_plan *pp, cpu_run *r) {
    const int64_t N = pp->N, P = pp->group, G = P * N;
    sph_head_active_rows(hp, pp->act);
    for (int64_t i = 0; i < N; i++) {
        pp->act[i] = pp->act[i] && target_of(hp, i) >= 0;
        r->mine[i].seq = pp->seq ? pp->seq[i] : 0;
        r->mine[i].act = pp->act[i];
        r->mine[i].delta = 0;
        pp->g[i] = pp->e[i] = 0.0f;
        pp->c[i] = 0.0;
    }
    if (P > 1) SPH_TRY(sph_policy_gather_host(pp, r->mine, r->all, (size_t)N * sizeof(grow)));
    r->T = 0;
    r->n_keys = 0;
    for (int64_t k = 0; k < G; k++) {
        if (!r->all[k].act) continue;
        r->T++;
        if (pp->seq) r->keys[r->n_keys++] = (key){r->all[k].seq, k};
    }
    r->S = 0;
    if (pp->seq) {
        qsort(r->keys, (size_t)r->n_keys, sizeof *r->keys, cmp_key);
        sequences(r, 0);
    }
    const double Tu = pp->num_tokens > 0 ? (double)pp->num_tokens : (double)r->T;
    const double Su = pp->num_seqs > 0 ? (double)pp->num_seqs : (double)r->S;
    for (int64_t i = 0; i < N; i++) {
        if (!pp->act[i]) continue;
        const int64_t tj = pp->seq ? r->cnt[pp->rank * N + i] : 0;
        switch (pp->agg) {
        case SPH_AGG_TOKEN_MEAN: pp->c[i] = 1.0 / Tu; break;
        case SPH_AGG_SEQ_MEAN_TOKEN_SUM: pp->c[i] = 1.0 / Su; break;
        case SPH_AGG_SEQ_MEAN_TOKEN_MEAN: pp->c[i] = 1.0 / (Su * (double)tj); break;
        default: pp->c[i] = 1.0 / (Su * pp->norm_length); break;
        }
    }
    return SPH_OK;
}

/* gspo: rho of every active row from the finished forward's logprob. */
static sph_status gspo_rho(sph_policy_plan *pp, cpu_run *r) {
    const int64_t N = pp->N;
    for (int64_t i = 0; i < N; i++)
        r->mine[i].delta = pp->act[i] ? (double)pp->logp[i] - (double)pp->old[i] : 0.0;
    if (pp->group > 1)
        SPH_TRY(sph_policy_gather_host(pp, r->mine, r->all, (size_t)N * sizeof(grow)));
    sequences(r, 1);
    for (int64_t i = 0; i < N; i++) {
        const int64_t k = pp->rank * N + i;
        pp->rho[i] = pp->act[i] ? r->sum[k] / (double)r->cnt[k] : 0.0;
    }
    return SPH_OK;
}

static void write_metrics(const sph_policy_plan *pp, const cpu_run *r) {
    double acc[SPH_PM_N_ACC] = {0}, row[SPH_PM_N_ACC], g, e;
    for (int64_t i = 0; i < pp->N; i++) {
        if (!pp->act[i]) continue;
        sph_policy_row_full(&pp->coef, pp->c[i], pp->isw ? pp->isw[i] : 1.0, pp->logp[i],
                            pp->ent[i], pp->adv[i], pp->old[i], pp->ref ? pp->ref[i] : 0.0,
                            pp->rho ? pp->rho[i] : 0.0, &g, &e, row);
        for (int f = 0; f < SPH_PM_N_ACC; f++) acc[f] += row[f];
    }
    const double Tm = pp->num_tokens > 0 ? (double)pp->num_tokens : (double)r->T;
    float *m = pp->metrics;
    m[SPH_METRIC_LOSS] = (float)acc[SPH_PM_ACC_LOSS];
    m[SPH_METRIC_PG_LOSS] = (float)acc[SPH_PM_ACC_PG];
    m[SPH_METRIC_KL_LOSS] = (float)acc[SPH_PM_ACC_KL];
    m[SPH_METRIC_ENTROPY_LOSS] = (float)acc[SPH_PM_ACC_ENT];
    m[SPH_METRIC_PG_CLIPFRAC] = Tm > 0 ? (float)(acc[SPH_PM_ACC_CLIP] / Tm) : 0.0f;
    m[SPH_METRIC_PG_CLIPFRAC_LOWER] = Tm > 0 ? (float)(acc[SPH_PM_ACC_LOWER] / Tm) : 0.0f;
    m[SPH_METRIC_PPO_KL] = Tm > 0 ? (float)(acc[SPH_PM_ACC_NKL] / Tm) : 0.0f;
    m[SPH_METRIC_TOKENS] = (float)r->T;
    m[SPH_METRIC_SEQS] = (float)r->S;
}

// ---- the pass ---------------------------------------------------------------------------

static sph_status cpu_pass(sph_ctx_t ctx, const sph_policy_plan *plan, void *ws, size_t bytes) {
    /* a copy of the plan holds the workspace buffers (and is what the hook sees) */
    sph_policy_plan P = *plan, *pp = &P;
    sph_head_plan *hp = &P.head;
    cpu_layout L;
    SPH_TRY(layout_of(ctx, pp, &L));
    SPH_CHECK(bytes >= L.total && ws != NULL, SPH_ERR_WORKSPACE,
              "workspace: %zu bytes, expected >= %zu (sph_policy_loss_workspace_size)", bytes,
              L.total);
    /* the policy area starts after the head's, 64-byte aligned inside the slack */
    char *base = (char *)ws + ((L.head + 63) & ~(size_t)63);
    base = (char *)(((uintptr_t)base + 63) & ~(uintptr_t)63);
#define AT(off) ((void *)(base + (off)))
    pp->act = AT(L.o_act);
    pp->c = AT(L.o_c);
    pp->rho = pp->coef.loss == SPH_PM_GSPO ? AT(L.o_rho) : NULL;
    pp->g = AT(L.o_g);
    pp->e = AT(L.o_e);
    float *const out_lp = hp->logprob, *const out_ent = hp->entropy, *const out_st = hp->stats;
    float *const out_lse = hp->lse, *const out_lm = hp->logit_mean, *const out_sp2 = hp->sum_p2;
    int64_t *const out_tki = hp->topk_ids;
    float *const out_tkl = hp->topk_lp;
    const int64_t ld_ti = hp->ld_ti, ld_tl = hp->ld_tl, K = hp->topk;
    const int own = pp->coef.loss == SPH_PM_GSPO;
    if (!hp->logprob || own) hp->logprob = AT(L.o_lp);
    if (!hp->entropy || own) hp->entropy = AT(L.o_ent);
    if (!hp->stats || own) hp->stats = AT(L.o_st);
    if (own && hp->lse) hp->lse = AT(L.o_lse);
    if (own && hp->logit_mean) hp->logit_mean = AT(L.o_lm);
    if (own && hp->sum_p2) hp->sum_p2 = AT(L.o_sp2);
    if (own && K) hp->topk_ids = AT(L.o_tki), hp->topk_lp = AT(L.o_tkl), hp->ld_ti = hp->ld_tl = K;
    pp->logp = hp->logprob;
    pp->ent = hp->entropy;
    cpu_run r;
    memset(&r, 0, sizeof r);
    r.mine = AT(L.o_mine);
    r.all = pp->group > 1 ? AT(L.o_all) : r.mine;
    r.keys = AT(L.o_keys);
    r.cnt = AT(L.o_cnt);
    r.sum = AT(L.o_sum);
#undef AT
    SPH_TRY(prepass(hp, pp, &r));
    /* the loss's rows are the head's rows: inactive and ignored-target rows cost nothing */
    hp->mask = pp->act;
    hp->dlogprob = pp->g;
    hp->dentropy = pp->coef.eta != 0 ? pp->e : NULL;
    hp->dlse = hp->dlogit_mean = NULL;
    if (pp->coef.loss != SPH_PM_GSPO) {
        hp->row_hook.host = cpu_rows; /* head_cpu.c's one-pass sweep calls it per chunk */
        hp->row_hook.arg = pp;
        if (ctx->head.check) SPH_TRY(ctx->head.check(ctx, SPH_HEAD_FORWARD, hp));
        SPH_TRY(ctx->head.forward(ctx, hp, ws, L.head));
    } else {
        sph_head_plan f, b;
        sph_policy_gspo_plans(hp, &f, &b);
        if (ctx->head.check) SPH_TRY(ctx->head.check(ctx, SPH_HEAD_FORWARD, &f));
        SPH_TRY(ctx->head.forward(ctx, &f, ws, L.head));
        SPH_TRY(gspo_rho(pp, &r));
        for (int64_t i = 0; i < pp->N; i++) cpu_rows(pp, &i, 1);
        if (hp->one_pass) SPH_TRY(ctx->head.backward(ctx, &b, ws, L.head));
        const size_t nb = (size_t)pp->N * sizeof(float);
        if (out_lp && nb) memcpy(out_lp, hp->logprob, nb);
        if (out_ent && nb) memcpy(out_ent, hp->entropy, nb);
        if (out_st && nb) memcpy(out_st, hp->stats, 3 * nb);
        if (out_lse && nb) memcpy(out_lse, hp->lse, nb);
        if (out_lm && nb) memcpy(out_lm, hp->logit_mean, nb);
        if (out_sp2 && nb) memcpy(out_sp2, hp->sum_p2, nb);
        for (int64_t i = 0; i < pp->N && K; i++) {
            memcpy(out_tki + i * ld_ti, hp->topk_ids + i * K, (size_t)K * sizeof(int64_t));
            memcpy(out_tkl + i * ld_tl, hp->topk_lp + i * K, (size_t)K * sizeof(float));
        }
    }
    write_metrics(pp, &r);
    return SPH_OK;
}

const sph_policy_backend sph_policy_cpu_backend = {"cpu", cpu_workspace, cpu_pass};
