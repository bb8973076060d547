/*
 * bench_policy.c - `spanhead bench --mode policy`: the fused RL policy loss next to what it
 * replaces, in the same run, at every point of the bench grid (shape x N x mask x active):
 *
 *   policy        sph_policy_loss: logprob, entropy, a GRPO-style loss (ppo, clip 0.2 / 0.28,
 *                 dual clip 3, k3 KL 0.001, entropy 0.001, seq-mean-token-mean over 2048-row
 *                 sequences) and dhidden, dweight in one call: the one-pass sweep with the
 *                 per-row gradients computed right after each row's statistics (6 N_a H V)
 *   one-pass      sph_head_forward in one-pass mode with fixed upstream gradients (the
 *                 weighted one-pass loss, the SFT step's cost): the target, policy should be
 *                 within a few % of it (it is the same sweep)
 *   general+loss  the general path with the same loss computed in between, as a trainer does
 *                 with a loss in torch: forward (logprob, entropy), the per-row loss and its
 *                 gradient on the host (the log-probs copied out and the gradients copied in),
 *                 backward (8 N_a H V)
 *   policy+topkK+sum_p2  with --topk K / --sum-p2 (issue 25): the policy row's call also
 *                 writing the head's extras of the loss's rows (on CUDA the +extras path:
 *                 docs/policy.md, "The head's extras"); its mode names them and adds the time
 *                 over the policy row in %
 * Each is timed as bench's other modes are (median of --repeats after --warmup, fenced by
 * sph_ctx_synchronize), the rows' steps interleaved within each repetition (each repetition
 * starting one row later); the extras row's % is the median of the repetitions' own ratios. The table adds the ratio of each row's time to the one-pass row's;
 * --json lines carry mode "policy", "one-pass", "general+loss" (or the extras row's) and
 * "vs_one_pass".
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "clock.h"
#include "json_util.h"
#include "msg.h"
#include "num.h"
#include "rng.h"
#include "synth.h"

#define POL_SEQ 2048 /* rows per sequence (the response mask's) */

typedef struct pbufs {
    void *h, *w, *tgt, *mask, *lp, *ent, *st, *g, *e, *dh, *dw, *adv, *old, *ref, *seq, *met;
    void *tki, *tkl, *sp2; /* --topk / --sum-p2: the extras row's outputs */
    void *ws;
    size_t ws_bytes;
} pbufs;

static void pbufs_free(sph_ctx_t ctx, pbufs *b) {
    void **ps = (void **)b;
    for (size_t k = 0; k < offsetof(pbufs, ws_bytes) / sizeof(void *); k++) sph_ctx_free(ctx, ps[k]);
    memset(b, 0, sizeof *b);
}

static int grow_ws(sph_ctx_t ctx, pbufs *b, size_t need) {
    if (need <= b->ws_bytes) return 0;
    sph_ctx_free(ctx, b->ws);
    b->ws = NULL, b->ws_bytes = 0;
    if (sph_ctx_malloc(ctx, need ? need : 1, &b->ws) != SPH_OK) return 1;
    b->ws_bytes = need;
    return 0;
}

/* The loss of the policy row on the host (the trainer's torch loss): ppo with the dual clip,
 * k3, the entropy bonus, seq-mean-token-mean weights c (precomputed); g, e out. */
static void host_loss(int64_t N, const float *lp, const uint8_t *act, const float *adv,
                      const float *old, const float *ref, const double *c, float *g, float *e) {
    for (int64_t i = 0; i < N; i++) {
        g[i] = e[i] = 0.f;
        if (!act[i]) continue;
        const double A = adv[i], d = (double)lp[i] - old[i];
        const double r = exp(d < -20 ? -20 : d > 20 ? 20 : d), dr = fabs(d) > 20 ? 0 : r;
        const double cr = r < 0.8 ? 0.8 : r > 1.28 ? 1.28 : r;
        const double dcr = (r < 0.8 || r > 1.28) ? 0 : dr;
        double pg1 = -A * r, pg2 = -A * cr, v = pg1 > pg2 ? pg1 : pg2;
        double dv = pg1 > pg2 ? -A * dr : pg2 > pg1 ? -A * dcr : -0.5 * A * (dr + dcr);
        if (A < 0 && v > -3 * A) dv = 0;
        const double x = ref[i] - (double)lp[i], xh = x < -20 ? -20 : x > 20 ? 20 : x;
        const double kv = exp(xh) - xh - 1;
        const double dkl = (fabs(x) > 20 || kv > 10) ? 0 : -(exp(xh) - 1);
        g[i] = (float)(c[i] * (dv + 1e-3 * dkl));
        e[i] = (float)(-c[i] * 1e-3);
    }
}

typedef struct row {
    const char *mode;
    char mode_buf[64];
    int extras;       /* the extras row (JSON: topk, sum_p2, extra_pct as cmd_bench.c's rows) */
    double extra_pct; /* its time over the policy row's, in % */
    double ms, floor_ms;
    double first_ms; /* cold first call: a fresh context + workspace + one step */
    size_t peak;
    char path[56];
} row;

static void emit(FILE *js, const bopts *o, const char *gpu, const char *date, const work *w,
                 const char *mask, double act, int64_t n_active, const row *rw, double one_ms) {
    printf("| %s | %" PRId64 " | %" PRId64 " | %" PRId64 " | %.4f | %s | %s | %.3f | %.3f | "
           "%.3f | %.3f | %.1f | %s | %.1f |\n",
           w->sh.name, w->sh.H, w->sh.V, w->N, act, mask, rw->mode, rw->ms, rw->floor_ms,
           rw->ms / rw->floor_ms, rw->ms / one_ms, rw->peak / 1048576.0, rw->path,
           rw->first_ms);
    fflush(stdout);
    if (!js) return;
    /* strings escaped, non-finite numbers null (json_util.h) */
    fputs("{\"gpu\":", js), sph_cli_json_str(js, gpu);
    fputs(",\"date\":", js), sph_cli_json_str(js, date);
    fputs(",\"commit\":", js), sph_cli_json_str(js, o->commit);
    fputs(",\"shape\":", js), sph_cli_json_str(js, w->sh.name);
    fprintf(js, ",\"H\":%" PRId64 ",\"V_local\":%" PRId64 ",\"N\":%" PRId64 ",\"active\":",
            w->sh.H, w->sh.V, w->N);
    sph_cli_json_num(js, "%.4f", act);
    fputs(",\"mask\":", js), sph_cli_json_str(js, mask);
    fputs(",\"mode\":", js), sph_cli_json_str(js, rw->mode);
    fputs(",\"impl\":\"spanhead\",\"dtype\":", js), sph_cli_json_str(js, o->dt_name);
    fprintf(js, ",\"span_gap\":%" PRId64 ",\"n_active\":%" PRId64 ",\"ms\":", o->gap, n_active);
    sph_cli_json_num(js, "%.4f", rw->ms);
    fputs(",\"floor_ms\":", js), sph_cli_json_num(js, "%.4f", rw->floor_ms);
    fputs(",\"ratio\":", js), sph_cli_json_num(js, "%.4f", rw->ms / rw->floor_ms);
    fputs(",\"vs_one_pass\":", js), sph_cli_json_num(js, "%.4f", rw->ms / one_ms);
    bench_json_run_tail(js, o, rw->extras, rw->extra_pct, rw->peak, rw->path, rw->first_ms);
    fputs(",\"loss\":\"ppo clip 0.2/0.28 c 3, k3 0.001, entropy 0.001, seq-mean-token-mean\"}\n",
          js);
    if (fflush(js) != 0 && !bench_js_errno) bench_js_errno = errno ? errno : EIO;
}

/* What one step of a variant reads (time_variants): the arguments and the host loss's data. */
typedef struct pstep {
    const sph_head_args *pol, *one, *f, *bw, *polx; /* polx: pol with the extras */
    const sph_policy_args *pa;
    const pbufs *b;
    int64_t N;
    const uint8_t *act;
    const float *hadv, *hold, *href;
    const double *c;
    float *hlp, *hg, *he;
} pstep;

/* One step of variant v on context cx with workspace (ws, wsb), synchronized. */
static sph_status step_once(sph_ctx_t cx, int v, void *ws, size_t wsb, const pstep *q) {
    sph_status s;
    if (v == 0 || v == 3) {
        s = sph_policy_loss(cx, v == 3 ? q->polx : q->pol, q->pa, ws, wsb);
    } else if (v == 1) {
        s = sph_head_forward(cx, q->one, ws, wsb);
    } else {
        s = sph_head_forward(cx, q->f, ws, wsb);
        if (!s) s = sph_ctx_memcpy(cx, q->hlp, q->b->lp, (size_t)q->N * 4);
        if (!s) host_loss(q->N, q->hlp, q->act, q->hadv, q->hold, q->href, q->c, q->hg, q->he);
        if (!s) s = sph_ctx_memcpy(cx, q->b->g, q->hg, (size_t)q->N * 4);
        if (!s) s = sph_ctx_memcpy(cx, q->b->e, q->he, (size_t)q->N * 4);
        if (!s) s = sph_head_backward(cx, q->bw, ws, wsb);
    }
    if (!s) s = sph_ctx_synchronize(cx);
    return s;
}

/* The cold first call of variant v (as cmd_bench.c's rows): a fresh context with the
 * benchmark's options, a workspace of wsb bytes, one step; *ms its wall time. */
static int cold_step(int v, size_t wsb, const pstep *q, double *ms) {
    const double t0 = sph_cli_now_s();
    sph_ctx_t c2;
    if (sph_ctx_create(&c2, bench_ctx_opts()) != SPH_OK)
        return sph_cli_fail("bench", 1, "first call: context: %s", sph_last_error());
    void *ws = NULL;
    sph_status s = wsb ? sph_ctx_malloc(c2, wsb, &ws) : SPH_OK;
    if (!s) s = step_once(c2, v, ws, wsb, q);
    *ms = 1e3 * (sph_cli_now_s() - t0);
    int rc = s ? sph_cli_fail("bench", 1, "first call: %s", sph_last_error()) : 0;
    if (ws) sph_ctx_free(c2, ws);
    sph_ctx_destroy(c2);
    return rc;
}

/* One point: the three variants (four with the extras); rows[4] out. */
static int time_variants(sph_ctx_t ctx, const bopts *o, const work *w, pbufs *b,
                         const uint8_t *hm, const int64_t *spans, int64_t ns, int masked,
                         int64_t n_active, const float *hadv, const float *hold,
                         const float *href, const int32_t *htgt, double rate, row rows[4]) {
    const bench_shape *sh = &w->sh;
    const int64_t N = w->N;
    int64_t sh_h[2] = {N, sh->H}, sh_w[2] = {sh->V, sh->H}, sh_n[1] = {N}, sh_s[2] = {N, 3};
    int64_t sh_m[1] = {SPH_POLICY_N_METRICS};
    sph_device d = {o->dev, 0};
    sph_tensor th = {b->h, d, 2, o->dt, sh_h, NULL, 0}, tw = {b->w, d, 2, o->dt, sh_w, NULL, 0};
    sph_tensor tt = {b->tgt, d, 1, SPH_I32, sh_n, NULL, 0};
    sph_tensor tm = {b->mask, d, 1, SPH_U8, sh_n, NULL, 0};
    sph_tensor tlp = {b->lp, d, 1, SPH_F32, sh_n, NULL, 0};
    sph_tensor tent = {b->ent, d, 1, SPH_F32, sh_n, NULL, 0};
    sph_tensor tst = {b->st, d, 2, SPH_F32, sh_s, NULL, 0};
    sph_tensor tg = {b->g, d, 1, SPH_F32, sh_n, NULL, 0}, te = {b->e, d, 1, SPH_F32, sh_n, NULL, 0};
    sph_tensor tdh = {b->dh, d, 2, o->dt, sh_h, NULL, 0}, tdw = {b->dw, d, 2, o->dt, sh_w, NULL, 0};
    sph_tensor ta = {b->adv, d, 1, SPH_F32, sh_n, NULL, 0}, to = {b->old, d, 1, SPH_F32, sh_n, NULL, 0};
    sph_tensor tr = {b->ref, d, 1, SPH_F32, sh_n, NULL, 0}, tq = {b->seq, d, 1, SPH_I64, sh_n, NULL, 0};
    sph_tensor tmet = {b->met, d, 1, SPH_F32, sh_m, NULL, 0};
    sph_head_args f = SPH_HEAD_ARGS_INIT;
    f.hidden = &th, f.weight = &tw, f.targets = &tt, f.stats = &tst;
    f.logprob = &tlp, f.entropy = &tent;
    if (masked) f.active_mask = &tm, f.spans = spans, f.n_spans = ns;
    sph_head_args one = f;
    one.dlogprob = &tg, one.dentropy = &te, one.dhidden = &tdh, one.dweight = &tdw;
    sph_head_args bw = one;
    bw.logprob = bw.entropy = NULL;
    sph_policy_args pa = SPH_POLICY_ARGS_INIT;
    pa.clip_high = 0.28, pa.clip_ratio_c = 3.0, pa.kl = SPH_KL_K3, pa.kl_coef = 1e-3;
    pa.entropy_coef = 1e-3, pa.agg = SPH_AGG_SEQ_MEAN_TOKEN_MEAN;
    pa.advantages = &ta, pa.old_logprob = &to, pa.ref_logprob = &tr, pa.seq_id = &tq;
    pa.metrics = &tmet;
    sph_head_args pol = one;
    pol.dlogprob = pol.dentropy = NULL;
    const int nv = o->topk || o->sum_p2 ? 4 : 3;
    int64_t sh_k[2] = {N, o->topk};
    sph_tensor tki = {b->tki, d, 2, SPH_I64, sh_k, NULL, 0};
    sph_tensor tkl = {b->tkl, d, 2, SPH_F32, sh_k, NULL, 0};
    sph_tensor tsp = {b->sp2, d, 1, SPH_F32, sh_n, NULL, 0};
    sph_head_args polx = pol, onex = one;
    if (o->topk) {
        polx.topk_ids = onex.topk_ids = &tki;
        polx.topk_logprobs = onex.topk_logprobs = &tkl;
    }
    if (o->sum_p2) polx.sum_p2 = onex.sum_p2 = &tsp;
    size_t wp = 0, wo = 0, wf = 0, wb = 0, wx = 0;
    if ((nv == 4 && sph_policy_loss_workspace_size(ctx, &polx, &pa, &wx) != SPH_OK) ||
        sph_policy_loss_workspace_size(ctx, &pol, &pa, &wp) != SPH_OK ||
        sph_head_workspace_size(ctx, SPH_HEAD_FORWARD, &one, &wo) != SPH_OK ||
        sph_head_workspace_size(ctx, SPH_HEAD_FORWARD, &f, &wf) != SPH_OK ||
        sph_head_workspace_size(ctx, SPH_HEAD_BACKWARD, &bw, &wb) != SPH_OK)
        return sph_cli_fail("bench", 1, "workspace size: %s", sph_last_error());
    size_t need = wp > wo ? wp : wo;
    need = need > wf ? need : wf, need = need > wb ? need : wb, need = need > wx ? need : wx;
    if (grow_ws(ctx, b, need)) return sph_cli_fail("bench", 1, "workspace: %s", sph_last_error());
    sph_head_pass_info fi = SPH_HEAD_PASS_INFO_INIT, bi = SPH_HEAD_PASS_INFO_INIT;
    if (sph_head_describe(ctx, SPH_HEAD_FORWARD, &one, &fi) != SPH_OK)
        return sph_cli_fail("bench", 1, "describe: %s", sph_last_error());
    snprintf(rows[0].path, sizeof rows[0].path, "%s", fi.path);
    snprintf(rows[1].path, sizeof rows[1].path, "%s", fi.path);
    if (sph_head_describe(ctx, SPH_HEAD_FORWARD, &f, &fi) != SPH_OK ||
        sph_head_describe(ctx, SPH_HEAD_BACKWARD, &bw, &bi) != SPH_OK)
        return sph_cli_fail("bench", 1, "describe: %s", sph_last_error());
    snprintf(rows[2].path, sizeof rows[2].path, "%s/%s", fi.path, bi.path);
    rows[0].mode = "policy", rows[1].mode = "one-pass", rows[2].mode = "general+loss";
    rows[0].peak = wp, rows[1].peak = wo, rows[2].peak = wf > wb ? wf : wb;
    if (nv == 4) { /* the extras row: the path the one-pass forward takes with them */
        sph_head_pass_info xi = SPH_HEAD_PASS_INFO_INIT;
        if (sph_head_describe(ctx, SPH_HEAD_FORWARD, &onex, &xi) != SPH_OK)
            return sph_cli_fail("bench", 1, "describe: %s", sph_last_error());
        snprintf(rows[3].path, sizeof rows[3].path, "%s", xi.path);
        rows[3].peak = wx;
    }
    /* the host loss's inputs: active rows and the seq-mean-token-mean weights */
    uint8_t *act = sph_cli_alloc(N, 1);
    double *c = sph_cli_alloc(N, 8);
    float *hlp = sph_cli_alloc(N, 4), *hg = sph_cli_alloc(N, 4), *he = sph_cli_alloc(N, 4);
    const size_t nr = (size_t)o->repeats + 1;
    double *t = malloc(sizeof(double) * nr * 5); /* t[v * nr + r]; the extras' ratios at 4 nr */
    int rc = 0;
    if (!act || !c || !hlp || !hg || !he || !t) {
        rc = sph_cli_fail("bench", 1, "out of host memory");
        goto done;
    }
    int64_t S = 0;
    for (int64_t s0 = 0; s0 < N; s0 += POL_SEQ) {
        int64_t n = 0;
        for (int64_t i = s0; i < N && i < s0 + POL_SEQ; i++)
            n += act[i] = (!masked || hm[i]) && htgt[i] >= 0;
        for (int64_t i = s0; i < N && i < s0 + POL_SEQ; i++) c[i] = n ? 1.0 / (double)n : 0;
        S += n > 0;
    }
    for (int64_t i = 0; i < N; i++) c[i] /= S ? (double)S : 1.0;
    const pstep q = {&pol, &one, &f, &bw, &polx, &pa, b, N, act, hadv, hold, href, c, hlp, hg,
                     he};
    for (int v = 0; v < nv && !rc; v++) rc = cold_step(v, rows[v].peak, &q, &rows[v].first_ms);
    /* the variants' steps interleaved, each repetition starting one variant later, so that the
     * card's clock drift over the run weighs on every row alike */
    for (int64_t r = -o->warmup; r < o->repeats && !rc; r++)
        for (int j = 0; j < nv && !rc; j++) {
            const int v = (int)((j + (r + o->warmup)) % nv);
            double t0 = sph_cli_now_s();
            sph_status s = step_once(ctx, v, b->ws, b->ws_bytes, &q);
            if (s) {
                rc = sph_cli_fail("bench", 1, "%s: %s", rows[v].mode, sph_last_error());
                break;
            }
            if (r >= 0) t[(size_t)v * nr + (size_t)r] = 1e3 * (sph_cli_now_s() - t0);
        }
    if (!rc && nv == 4)
        for (int64_t r = 0; r < o->repeats; r++)
            t[4 * nr + (size_t)r] = 100.0 * (t[3 * nr + (size_t)r] / t[(size_t)r] - 1.0);
    for (int v = 0; v < nv && !rc; v++) rows[v].ms = sph_cli_median(t + (size_t)v * nr, (int)o->repeats);
    /* floors: 6 N_active H V for the one-pass sweeps, 8 for the general path */
    const double work6 = 6.0 * (double)n_active * (double)sh->H * (double)sh->V;
    rows[0].floor_ms = rows[1].floor_ms = work6 / (rate * 1e12) * 1e3;
    rows[2].floor_ms = rows[0].floor_ms * 8.0 / 6.0;
    rows[3].floor_ms = rows[0].floor_ms;
    if (nv == 4 && !rc) {
        char k[24] = "";
        if (o->topk) snprintf(k, sizeof k, "+topk%" PRId64, o->topk);
        rows[3].extras = 1;
        rows[3].extra_pct = sph_cli_median(t + 4 * nr, (int)o->repeats); /* per repetition */
        snprintf(rows[3].mode_buf, sizeof rows[3].mode_buf, "policy%s%s (%+.1f %%)", k,
                 o->sum_p2 ? "+sum_p2" : "", rows[3].extra_pct);
        rows[3].mode = rows[3].mode_buf;
    }
done:
    free(act), free(c), free(hlp), free(hg), free(he), free(t);
    return rc;
}

int bench_policy(sph_ctx_t ctx, const bopts *o, const work *ws, int n_work, const char *gpu,
                 const char *date, FILE *js) {
    printf("# mode policy: the fused policy loss (GRPO-style: ppo clip 0.2/0.28, dual clip 3, "
           "k3 0.001, entropy 0.001, seq-mean-token-mean over %d-row sequences) next to the "
           "one-pass weighted loss and the general path with the loss on the host; floor = 6 "
           "(8 for general+loss) N_active H V at the burst GEMM rate\n\n",
           POL_SEQ);
    printf("| shape | H | V_loc | N | active | mask | mode | ms | floor ms | ratio | vs one-pass "
           "| extra MiB | path | first call ms |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    int rc = 0;
    for (int wi = 0; wi < n_work && !rc; wi++) {
        const work *w = &ws[wi];
        const bench_shape *sh = &w->sh;
        const int64_t N = w->N;
        double rate = 0;
        if (o->dev == SPH_DEVICE_CUDA) {
            if (sph_tune_gemm_rate(ctx, o->dt, N, sh->V, sh->H, (int)o->repeats, &rate) != SPH_OK)
                return sph_cli_fail("bench", 1, "gemm rate: %s", sph_last_error());
        } else {
            rate = sph_cli_sgemm_rate(N < 2048 ? N : 2048, sh->V < 4096 ? sh->V : 4096, sh->H, 1,
                                      3) / 1e12;
        }
        pbufs b;
        memset(&b, 0, sizeof b);
        const int bits = o->dt.bits, bf16 = o->dt.code == SPH_DTYPE_BFLOAT;
        const size_t es = (size_t)bits / 8;
        void *hh = sph_cli_alloc(N * sh->H, es), *hw = sph_cli_alloc(sh->V * sh->H, es);
        int32_t *ht = sph_cli_alloc(N, 4);
        float *hadv = sph_cli_alloc(N, 4), *hold = sph_cli_alloc(N, 4), *href = sph_cli_alloc(N, 4);
        int64_t *hseq = sph_cli_alloc(N, 8);
        uint8_t *hm = sph_cli_alloc(N, 1);
        int64_t *spans = sph_cli_alloc(2 * ((N + 1) / 2) + 2, sizeof(int64_t));
        if (!hh || !hw || !ht || !hadv || !hold || !href || !hseq || !hm || !spans) {
            rc = sph_cli_fail("bench", 1, "out of host memory for N = %" PRId64, N);
        } else {
            sph_cli_rng r;
            bench_fill_head(&r, wi, sh, N, bits, bf16, hh, hw);
            /* log-probs of this data sit near -log V: old / ref around there, ratios near 1 */
            const double lv = -log((double)sh->V);
            for (int64_t i = 0; i < N; i++) {
                ht[i] = (int32_t)sph_cli_rng_range(&r, 0, sh->V - 1);
                hadv[i] = (float)sph_cli_rng_normal(&r);
                hold[i] = (float)(lv + 0.2 * sph_cli_rng_normal(&r));
                href[i] = (float)(lv + 0.2 * sph_cli_rng_normal(&r));
                hseq[i] = i / POL_SEQ;
            }
            if (bench_upload(ctx, &b.h, hh, N * sh->H, es) ||
                bench_upload(ctx, &b.w, hw, sh->V * sh->H, es) ||
                bench_upload(ctx, &b.tgt, ht, N, 4) || bench_upload(ctx, &b.adv, hadv, N, 4) ||
                bench_upload(ctx, &b.old, hold, N, 4) || bench_upload(ctx, &b.ref, href, N, 4) ||
                bench_upload(ctx, &b.seq, hseq, N, 8) || bench_upload(ctx, &b.g, hadv, N, 4) ||
                bench_upload(ctx, &b.e, hadv, N, 4) || bench_upload(ctx, &b.mask, NULL, N, 1) ||
                bench_upload(ctx, &b.lp, NULL, N, 4) || bench_upload(ctx, &b.ent, NULL, N, 4) ||
                bench_upload(ctx, &b.st, NULL, N, 12) ||
                bench_upload(ctx, &b.dh, NULL, N * sh->H, es) ||
                bench_upload(ctx, &b.dw, NULL, sh->V * sh->H, es) ||
                bench_upload(ctx, &b.met, NULL, SPH_POLICY_N_METRICS, 4) ||
                (o->topk && (bench_upload(ctx, &b.tki, NULL, N * o->topk, 8) ||
                             bench_upload(ctx, &b.tkl, NULL, N * o->topk, 4))) ||
                (o->sum_p2 && bench_upload(ctx, &b.sp2, NULL, N, 4)))
                rc = sph_cli_fail("bench", 1, "device buffers: %s", sph_last_error());
        }
        /* every mask at every fraction (packed-rl once), and the dense point */
        for (int mi = -1; mi < o->n_masks && !rc; mi++) {
            const char *mask = mi < 0 ? "none" : o->masks[mi];
            const int n_act = mi < 0 || !strcmp(mask, "packed-rl") ? 1 : o->act_list.n;
            for (int ai = 0; ai < n_act && !rc; ai++) {
                double act = mi < 0 ? 1.0 : o->act_list.d[ai];
                int64_t ns = 0, na = N;
                const int masked = mi >= 0;
                if (masked) {
                    if ((rc = bench_point_mask(o, w, mask, &act, hm, spans, &ns, &na))) break;
                    if (sph_ctx_memcpy(ctx, b.mask, hm, (size_t)N) != SPH_OK) {
                        rc = sph_cli_fail("bench", 1, "mask: %s", sph_last_error());
                        break;
                    }
                }
                row rows[4];
                memset(rows, 0, sizeof rows);
                rc = time_variants(ctx, o, w, &b, hm, spans, ns, masked, na, hadv, hold, href,
                                   ht, rate, rows);
                for (int v = 0; v < (o->topk || o->sum_p2 ? 4 : 3) && !rc; v++)
                    emit(js, o, gpu, date, w, mask, act, na, &rows[v], rows[1].ms);
            }
        }
        free(hh), free(hw), free(ht), free(hadv), free(hold), free(href), free(hseq), free(hm);
        free(spans);
        pbufs_free(ctx, &b);
    }
    return rc;
}
