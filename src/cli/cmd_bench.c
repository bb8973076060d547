/*
 * cmd_bench.c - `spanhead bench`: times the LM head against the active floor and the dense
 * path, in one run (docs/design.md says how performance is counted).
 *
 * Per point (shape, N, active fraction, mask pattern, mode):
 *   rate      burst dense GEMM rate at the shape: one product (M = N, N = V_loc, K = H) at a
 *             time, synchronized after each (cuBLAS on CUDA through sph_tune_gemm_rate; BLAS
 *             sgemm on CPU), measured once per (shape, N) in the same run
 *   rate_sustained  the same products issued back to back, as many as the mode runs (chain 4
 *             general: forward logits, backward logits, dH, dW; chain 3 one-pass), the chain
 *             timed as a whole (sph_tune_gemm_rate_sustained; on CPU a chain of sgemm calls on
 *             the same slice). Why both: the H200 is power-limited, so one product of a few ms
 *             runs at boost clocks while the head's products, back to back for tens of ms, run
 *             at the lower clocks the card settles at: against the burst floor the head is
 *             also charged for the clock drop
 *   ms        median over --repeats of forward + backward (general) or the one-pass forward,
 *             after --warmup runs; each repetition is fenced by sph_ctx_synchronize and timed
 *             with CLOCK_MONOTONIC (ms-scale work: the fence costs microseconds)
 *   extra_pct (--topk / --sum-p2: a second row per point) the extras' time over the plain
 *             one's, in %: the two configurations' steps alternate within each repetition
 *             (ABBA order) and extra_pct is the median of the repetitions' own ratios, so the
 *             card's clock drift over a run does not enter it
 *   floor_ms  8 N_active H V / rate (general) or 6 N_active H V / rate (one-pass)
 *   ratio     ms / floor_ms
 *   floor_sustained_ms, ratio_sustained: the same against rate_sustained
 *   peak_extra_bytes: the workspace (the only device memory the head takes beyond inputs,
 *             outputs and stats)
 * plus the dense path (every row, no mask) of the same shape and mode. Masks and points:
 * bench_points.c. Output: one markdown table on stdout, a row per run with both rates, both
 * floors and both ratios; JSON lines with --json FILE (issue 6's fields plus
 * floor_sustained_ms, ratio_sustained, rate_tflops and rate_sustained_tflops); with --plot
 * FILE.png the time-vs-active-fraction picture of bench/plot_bench.py (floors and, with
 * --peers, the peers). A terminal sees progress on stderr (runs done/total, elapsed, ETA).
 *
 * Defaults serve the device: on a GPU the model shapes A,B at 4K, 16K and 64K tokens; on the CPU
 * (no GPU, or --device cpu) one small shape, H 256 x V_loc 4096 at N = 1K with 3 repeats,
 * which finishes in seconds on 2 cores.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "clock.h"
#include "json_util.h"
#include "msg.h"
#include "num.h"
#include "progress.h"
#include "rng.h"
#include "synth.h"


/* options: sph_cli_bench_opts (opts.c) */

// ---- rates -----------------------------------------------------------------------------------

/* Products of 2 N H V flops that each mode runs back to back: general = forward logits,
 * backward logits, dH, dW (8 N H V); one-pass = logits, dH, dW (6 N H V). The sustained rate
 * of a mode is measured over a chain of that many products. */
static const int k_chain[2] = {4, 3}; /* [one_pass] */

/* Dense GEMM rates (TFLOP/s) of one (shape, N): burst, one product at a time; sustained, a
 * chain of k_chain[one_pass] products timed as a whole (0 for a mode that is not run). */
typedef struct rates {
    double burst, sustained[2]; /* sustained[one_pass] */
} rates;

static int gemm_rates(sph_ctx_t ctx, const bopts *o, int64_t M, int64_t N, int64_t K,
                      rates *rt) {
    memset(rt, 0, sizeof *rt);
    if (o->dev == SPH_DEVICE_CUDA) {
        if (sph_tune_gemm_rate(ctx, o->dt, M, N, K, (int)o->repeats, &rt->burst) != SPH_OK)
            return sph_cli_fail("bench", 1, "gemm rate: %s", sph_last_error());
        for (int op = 0; op < 2; op++)
            if ((o->modes & (1 << op)) &&
                sph_tune_gemm_rate_sustained(ctx, o->dt, M, N, K, k_chain[op], (int)o->repeats,
                                             &rt->sustained[op]) != SPH_OK)
                return sph_cli_fail("bench", 1, "sustained gemm rate: %s", sph_last_error());
        return 0;
    }
    /* CPU: sgemm on a bounded slice of the shape (the rate, not the full product) */
    const int64_t m = M < 2048 ? M : 2048, n = N < 4096 ? N : 4096;
    const int reps = o->repeats < 16 ? (int)o->repeats : 16;
    rt->burst = sph_cli_sgemm_rate(m, n, K, 1, reps) / 1e12;
    for (int op = 0; op < 2; op++)
        if (o->modes & (1 << op)) rt->sustained[op] = sph_cli_sgemm_rate(m, n, K, k_chain[op], reps) / 1e12;
    if (!(rt->burst > 0)) return sph_cli_fail("bench", 1, "out of host memory for the sgemm rate");
    return 0;
}

// ---- device buffers and timing ---------------------------------------------------------------

typedef struct dev_bufs {
    void *h, *w, *tgt, *mask, *lp, *ent, *st, *g, *e, *dh, *dw, *ws;
    void *tki, *tkl, *sp2; /* --topk / --sum-p2 outputs */
    void *temp;            /* --temperature-rows: (N) f32, else NULL */
    size_t ws_bytes;
} dev_bufs;

static void bufs_free(sph_ctx_t ctx, dev_bufs *b) {
    void *ps[] = {b->h, b->w, b->tgt, b->mask, b->lp, b->ent, b->st, b->g, b->e, b->dh, b->dw,
                  b->ws, b->tki, b->tkl, b->sp2, b->temp};
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) sph_ctx_free(ctx, ps[k]);
    memset(b, 0, sizeof *b);
}

typedef struct point {
    const char *mask;
    double act;
    int one_pass;
    double ms, floor_ms, ratio;
    double floor_sus_ms, ratio_sus; /* against the sustained rate */
    double rate, rate_sus;          /* TFLOP/s, burst and sustained (this mode's chain) */
    size_t peak;
    double first_ms; /* cold first call: fresh context + workspace + one step, synchronized */
    int64_t n_active;
    int extras;       /* timed with --topk / --sum-p2's outputs */
    double extra_pct; /* extras: ms over the same point's plain run, in % */
    char path[56]; /* sph_head_describe's path (forward, then backward for the general path),
                      with "+recompute" when a one-pass forward recomputes its logits */
} point;


/* The cold first call of one configuration, as a user's first step pays it: a fresh context
 * (cuBLAS handle, tune-cache load), the workspace query, its allocation, the first forward
 * (+ backward) and the synchronization; the context and workspace freed after (not timed).
 * The process's own CUDA initialization is not in it: the benchmark's context paid it before
 * the first row (printed once in the header). 0 and *ms, or an exit code. */
static int cold_call(const sph_head_args *f, const sph_head_args *bw, int one_pass, double *ms) {
    const double t0 = sph_cli_now_s();
    sph_ctx_t c2;
    if (sph_ctx_create(&c2, bench_ctx_opts()) != SPH_OK)
        return sph_cli_fail("bench", 1, "first call: context: %s", sph_last_error());
    size_t wf = 0, wb = 0;
    void *ws = NULL;
    sph_status s = sph_head_workspace_size(c2, SPH_HEAD_FORWARD, f, &wf);
    if (s == SPH_OK && !one_pass) s = sph_head_workspace_size(c2, SPH_HEAD_BACKWARD, bw, &wb);
    const size_t need = wf > wb ? wf : wb;
    if (s == SPH_OK && need) s = sph_ctx_malloc(c2, need, &ws);
    if (s == SPH_OK) s = sph_head_forward(c2, f, ws, need);
    if (s == SPH_OK && !one_pass) s = sph_head_backward(c2, bw, ws, need);
    if (s == SPH_OK) s = sph_ctx_synchronize(c2);
    *ms = 1e3 * (sph_cli_now_s() - t0);
    if (s != SPH_OK) {
        int rc = sph_cli_fail("bench", 1, "first call: %s", sph_last_error());
        if (ws) sph_ctx_free(c2, ws);
        sph_ctx_destroy(c2);
        return rc;
    }
    if (ws) sph_ctx_free(c2, ws);
    sph_ctx_destroy(c2);
    return 0;
}

/* One configuration's argument structs and the tensors they point at (kept together so the
 * pointers stay valid while the configuration is timed). */
typedef struct run_cfg {
    int64_t sh_h[2], sh_w[2], sh_n[1], sh_s[2], sh_k[2];
    sph_tensor th, tw, tt, tm, tlp, tent, tst, tg, te, tdh, tdw, ttr, tki, tkl, tsp;
    sph_head_args f, bw; /* the forward (the one-pass call when one_pass) and the backward */
    int one_pass;
    size_t need; /* workspace bytes */
} run_cfg;

static void cfg_build(run_cfg *c, const bopts *o, const bench_shape *sh, int64_t N,
                      const dev_bufs *b, const int64_t *spans, int64_t n_spans, int masked,
                      int one_pass, int extras) {
    memset(c, 0, sizeof *c);
    c->sh_h[0] = N, c->sh_h[1] = sh->H, c->sh_w[0] = sh->V, c->sh_w[1] = sh->H;
    c->sh_n[0] = N, c->sh_s[0] = N, c->sh_s[1] = 3, c->sh_k[0] = N, c->sh_k[1] = o->topk;
    const sph_device d = {o->dev, 0};
#define CFG_T(t, ptr, rank, dt, shape) c->t = (sph_tensor){ptr, d, rank, dt, shape, NULL, 0}
    CFG_T(th, b->h, 2, o->dt, c->sh_h);
    CFG_T(tw, b->w, 2, o->dt, c->sh_w);
    CFG_T(tt, b->tgt, 1, SPH_I32, c->sh_n);
    CFG_T(tm, b->mask, 1, SPH_U8, c->sh_n);
    CFG_T(tlp, b->lp, 1, SPH_F32, c->sh_n);
    CFG_T(tent, b->ent, 1, SPH_F32, c->sh_n);
    CFG_T(tst, b->st, 2, SPH_F32, c->sh_s);
    CFG_T(tg, b->g, 1, SPH_F32, c->sh_n);
    CFG_T(te, b->e, 1, SPH_F32, c->sh_n);
    CFG_T(tdh, b->dh, 2, o->dt, c->sh_h);
    CFG_T(tdw, b->dw, 2, o->dt, c->sh_w);
    CFG_T(ttr, b->temp, 1, SPH_F32, c->sh_n);
    CFG_T(tki, b->tki, 2, SPH_I64, c->sh_k);
    CFG_T(tkl, b->tkl, 2, SPH_F32, c->sh_k);
    CFG_T(tsp, b->sp2, 1, SPH_F32, c->sh_n);
#undef CFG_T
    sph_head_args f = SPH_HEAD_ARGS_INIT;
    f.hidden = &c->th, f.weight = &c->tw, f.targets = &c->tt, f.stats = &c->tst;
    if (b->temp) f.temperature_rows = &c->ttr; /* --temperature-rows */
    f.logprob = &c->tlp, f.entropy = &c->tent;
    if (masked) f.active_mask = &c->tm, f.spans = spans, f.n_spans = n_spans;
    sph_head_args bw = f;
    bw.logprob = bw.entropy = NULL;
    bw.dlogprob = &c->tg, bw.dentropy = &c->te, bw.dhidden = &c->tdh, bw.dweight = &c->tdw;
    if (one_pass) f = bw, f.logprob = &c->tlp, f.entropy = &c->tent;
    /* issue 25's extras in the forward only (the backward never computes them) */
    if (extras && o->topk) f.topk_ids = &c->tki, f.topk_logprobs = &c->tkl;
    if (extras && o->sum_p2) f.sum_p2 = &c->tsp;
    c->f = f, c->bw = bw, c->one_pass = one_pass;
}

/* A configuration's workspace size, path (sph_head_describe) and cold first call. */
static int cfg_prepare(sph_ctx_t ctx, run_cfg *c, point *pt) {
    size_t wf = 0, wb = 0;
    if (sph_head_workspace_size(ctx, SPH_HEAD_FORWARD, &c->f, &wf) != SPH_OK ||
        (!c->one_pass && sph_head_workspace_size(ctx, SPH_HEAD_BACKWARD, &c->bw, &wb) != SPH_OK))
        return sph_cli_fail("bench", 1, "workspace size: %s", sph_last_error());
    c->need = wf > wb ? wf : wb;
    /* the cold first call before the timed ones (and before this context's workspace grows,
     * so the two workspaces are never held at once) */
    int crc = cold_call(&c->f, &c->bw, c->one_pass, &pt->first_ms);
    if (crc) return crc;
    sph_head_pass_info fi = SPH_HEAD_PASS_INFO_INIT, bi = SPH_HEAD_PASS_INFO_INIT;
    if (sph_head_describe(ctx, SPH_HEAD_FORWARD, &c->f, &fi) != SPH_OK ||
        (!c->one_pass && sph_head_describe(ctx, SPH_HEAD_BACKWARD, &c->bw, &bi) != SPH_OK))
        return sph_cli_fail("bench", 1, "describe: %s", sph_last_error());
    if (c->one_pass)
        snprintf(pt->path, sizeof pt->path, "%s", fi.path);
    else
        snprintf(pt->path, sizeof pt->path, "%s/%s", fi.path, bi.path);
    pt->peak = c->need;
    pt->one_pass = c->one_pass;
    return 0;
}

/* One timed step of a configuration (forward, the backward unless one-pass, synchronized):
 * 0 and its ms, or an exit code. */
static int cfg_step(sph_ctx_t ctx, const run_cfg *c, dev_bufs *b, double *ms) {
    const double t0 = sph_cli_now_s();
    sph_status s = sph_head_forward(ctx, &c->f, b->ws, b->ws_bytes);
    if (s == SPH_OK && !c->one_pass) s = sph_head_backward(ctx, &c->bw, b->ws, b->ws_bytes);
    if (s == SPH_OK) s = sph_ctx_synchronize(ctx);
    if (s != SPH_OK) return sph_cli_fail("bench", 1, "head: %s", sph_last_error());
    *ms = 1e3 * (sph_cli_now_s() - t0);
    return 0;
}

static void point_rates(const bench_shape *sh, const rates *rt, point *pt) {
    double flops = (pt->one_pass ? 6.0 : 8.0) * (double)pt->n_active * sh->H * sh->V;
    pt->rate = rt->burst, pt->rate_sus = rt->sustained[pt->one_pass];
    pt->floor_ms = flops / (pt->rate * 1e12) * 1e3;
    pt->ratio = pt->ms / pt->floor_ms;
    pt->floor_sus_ms = flops / (pt->rate_sus * 1e12) * 1e3;
    pt->ratio_sus = pt->ms / pt->floor_sus_ms;
}

/* Times one configuration (pt) or, with x, the same point plain (pt) and with the extras (x)
 * together: their steps alternate within every repetition, in ABBA order (plain first in even
 * repetitions, the extras first in odd ones), so that the card's clocks, which drift over a run
 * on the power-limited H200, weigh on both alike; x->extra_pct is the median of the
 * repetitions' own ratios. Returns 0 and fills pt (and x), or an exit code. */
static int time_point(sph_ctx_t ctx, const bopts *o, const bench_shape *sh, int64_t N, dev_bufs *b,
                      const int64_t *spans, int64_t n_spans, int masked, int one_pass,
                      const rates *rt, point *pt, point *x) {
    const int nc = x ? 2 : 1;
    run_cfg c[2];
    point *pts[2] = {pt, x};
    size_t need = 0;
    for (int k = 0; k < nc; k++) {
        cfg_build(&c[k], o, sh, N, b, spans, n_spans, masked, one_pass, k == 1);
        int rc = cfg_prepare(ctx, &c[k], pts[k]);
        if (rc) return rc;
        if (c[k].need > need) need = c[k].need;
    }
    if (need > b->ws_bytes) {
        sph_ctx_free(ctx, b->ws);
        b->ws = NULL, b->ws_bytes = 0;
        if (sph_ctx_malloc(ctx, need, &b->ws) != SPH_OK)
            return sph_cli_fail("bench", 1, "workspace: %s", sph_last_error());
        b->ws_bytes = need;
    }
    const size_t nr = (size_t)o->repeats + 1;
    double *t = malloc(sizeof(double) * nr * 3); /* t[k * nr + r]; the ratios at 2 nr */
    if (!t) return sph_cli_fail("bench", 1, "out of memory");
    int rc = 0;
    for (int64_t r = -o->warmup; r < o->repeats && !rc; r++)
        for (int j = 0; j < nc && !rc; j++) {
            const int k = nc == 2 ? j ^ (int)(r & 1) : 0; /* ABBA */
            double ms = 0;
            rc = cfg_step(ctx, &c[k], b, &ms);
            if (!rc && r >= 0) t[(size_t)k * nr + (size_t)r] = ms;
        }
    if (!rc && x)
        for (int64_t r = 0; r < o->repeats; r++)
            t[2 * nr + (size_t)r] = 100.0 * (t[nr + (size_t)r] / t[(size_t)r] - 1.0);
    for (int k = 0; k < nc && !rc; k++) {
        pts[k]->ms = sph_cli_median(t + (size_t)k * nr, (int)o->repeats);
        point_rates(sh, rt, pts[k]);
    }
    if (!rc && x) x->extra_pct = sph_cli_median(t + 2 * nr, (int)o->repeats);
    free(t);
    return rc;
}

// ---- output ----------------------------------------------------------------------------------

/* The leading cells of a table row: the point, then its layout under --matrix. */
static void print_where(const bopts *o, const work *w) {
    printf("| %s | %" PRId64 " | %" PRId64 " | %" PRId64 " |", w->sh.name, w->sh.H, w->sh.V,
           w->N);
    if (o->matrix) printf(" %" PRId64 " | %" PRId64 " | %" PRId64 " |", w->tp, w->cp, w->tokens);
}

static void table_head(const bopts *o, int timed) {
    printf("| shape | H | V_loc | N |%s active | mask | mode |", o->matrix ? " tp | cp | tokens |" : "");
    if (timed)
        printf(" ms | GEMM TFLOP/s | floor ms | ratio | sustained TFLOP/s | sustained floor ms | "
               "sustained ratio | extra MiB | path | first call ms |");
    printf("\n|---|---|---|---|%s---|---|---|%s\n", o->matrix ? "---|---|---|" : "",
           timed ? "---|---|---|---|---|---|---|---|---|---|" : "");
}

static void emit(FILE *const js[2], const bopts *o, const char *gpu, const char *date, const work *w,
                 const point *p) {
    char mode[64];
    snprintf(mode, sizeof mode, "%s", p->one_pass ? "one-pass" : "general");
    if (p->extras) {
        char k[16] = "";
        if (o->topk) snprintf(k, sizeof k, "+topk%" PRId64, o->topk);
        snprintf(mode + strlen(mode), sizeof mode - strlen(mode), "%s%s (%+.1f %%)", k,
                 o->sum_p2 ? "+sum_p2" : "", p->extra_pct);
    }
    print_where(o, w);
    printf(" %.4f | %s | %s | %.3f | %.4g | %.3f | %.3f | %.4g | %.3f | %.3f | %.1f | %s | %.1f |\n",
           p->act, p->mask, mode, p->ms, p->rate, p->floor_ms, p->ratio, p->rate_sus,
           p->floor_sus_ms, p->ratio_sus, p->peak / 1048576.0, p->path, p->first_ms);
    fflush(stdout);
    char tp[24] = "null", cp[24] = "null", tokens[24] = "null";
    if (w->tp) {
        snprintf(tp, sizeof tp, "%" PRId64, w->tp);
        snprintf(cp, sizeof cp, "%" PRId64, w->cp);
        snprintf(tokens, sizeof tokens, "%" PRId64, w->tokens);
    }
    for (int k = 0; k < 2; k++) {
        FILE *f = js[k];
        if (!f) continue;
        /* strings escaped (a --commit or $SPH_COMMIT with a quote), non-finite numbers null */
        fputs("{\"gpu\":", f), sph_cli_json_str(f, gpu);
        fputs(",\"date\":", f), sph_cli_json_str(f, date);
        fputs(",\"commit\":", f), sph_cli_json_str(f, o->commit);
        fputs(",\"shape\":", f), sph_cli_json_str(f, w->sh.name);
        fprintf(f, ",\"H\":%" PRId64 ",\"V_local\":%" PRId64 ",\"N\":%" PRId64
                   ",\"tp\":%s,\"cp\":%s,\"tokens\":%s,\"active\":",
                w->sh.H, w->sh.V, w->N, tp, cp, tokens);
        sph_cli_json_num(f, "%.4f", p->act);
        fputs(",\"mask\":", f), sph_cli_json_str(f, p->mask);
        fputs(",\"mode\":", f), sph_cli_json_str(f, mode);
        fputs(",\"impl\":\"spanhead\",\"dtype\":", f), sph_cli_json_str(f, o->dt_name);
        fprintf(f, ",\"span_gap\":%" PRId64 ",\"n_active\":%" PRId64 ",\"temperature_rows\":%s",
                o->gap, p->n_active, o->temp_rows ? "true" : "false");
        const struct {
            const char *name, *fmt;
            double v;
        } nums[] = {{"ms", "%.4f", p->ms},
                    {"floor_ms", "%.4f", p->floor_ms},
                    {"ratio", "%.4f", p->ratio},
                    {"floor_sustained_ms", "%.4f", p->floor_sus_ms},
                    {"ratio_sustained", "%.4f", p->ratio_sus},
                    {"rate_tflops", "%.6g", p->rate},
                    {"rate_sustained_tflops", "%.6g", p->rate_sus}};
        for (size_t j = 0; j < sizeof nums / sizeof nums[0]; j++) {
            fprintf(f, ",\"%s\":", nums[j].name);
            sph_cli_json_num(f, nums[j].fmt, nums[j].v);
        }
        bench_json_run_tail(f, o, p->extras, p->extra_pct, p->peak, p->path, p->first_ms);
        fputs("}\n", f);
        if (fflush(f) != 0 && !bench_js_errno) bench_js_errno = errno ? errno : EIO;
    }
}

/* Builds every packed-rl mask (host metadata only, milliseconds) and with print set lists every
 * run that would be timed (--list). Run first without printing, so that a batch too small to
 * hold a response token is a usage error before any output, not a failure halfway through. */
static int walk_points(const bopts *o, const work *ws, int n_work, const run_spec *runs,
                       int n_runs, int print) {
    if (print) {
        if (o->matrix)
            printf("# matrix seed: %d unique points (shape x TP/CP x tokens), %d runs each\n\n",
                   n_work, n_runs);
        else
            printf("# grid: %d points (shape x N), %d runs each\n\n", n_work, n_runs);
        table_head(o, 0);
    }
    int rc = 0;
    for (int wi = 0; wi < n_work && !rc; wi++) {
        const work *w = &ws[wi];
        uint8_t *hm = sph_cli_alloc(w->N, 1);
        int64_t *spans = sph_cli_alloc(2 * ((w->N + 1) / 2) + 2, sizeof(int64_t)), ns = 0, na = 0;
        if (!hm || !spans)
            rc = sph_cli_fail("bench", 1, "out of host memory for N = %" PRId64, w->N);
        for (int ri = 0; ri < n_runs && !rc; ri++) {
            double act = runs[ri].act;
            if (!print && strcmp(runs[ri].mask, "packed-rl")) continue;
            if (strcmp(runs[ri].mask, "none") &&
                (rc = bench_point_mask(o, w, runs[ri].mask, &act, hm, spans, &ns, &na)))
                break;
            if (!print) continue;
            print_where(o, w);
            printf(" %.4f | %s | %s |\n", act, runs[ri].mask,
                   runs[ri].one_pass ? "one-pass" : "general");
        }
        free(hm), free(spans);
    }
    return rc;
}

// ---- --plot ----------------------------------------------------------------------------------

#ifndef SPH_SOURCE_DIR
#define SPH_SOURCE_DIR "."
#endif

/* bench/plot_bench.py: $SPH_PLOT_SCRIPT, beside an installed program (../share/spanhead), or
 * in the source tree this program was built from. NULL when none exists. */
static const char *plot_script(char *buf, size_t n) {
    const char *env = getenv("SPH_PLOT_SCRIPT");
    struct stat st;
    if (env) { /* into buf: the caller runs buf */
        snprintf(buf, n, "%s", env);
        return stat(buf, &st) == 0 ? buf : NULL;
    }
    char exe[4096];
    ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (l > 0) {
        exe[l] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(buf, n, "%s/../share/spanhead/plot_bench.py", exe);
            if (stat(buf, &st) == 0) return buf;
        }
    }
    snprintf(buf, n, "%s/bench/plot_bench.py", SPH_SOURCE_DIR);
    return stat(buf, &st) == 0 ? buf : NULL;
}

/* Runs argv (argv[0] looked up on PATH) with stdout sent to stderr; its exit status, or -1. */
static int run_program(char *const argv[], int quiet) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(STDERR_FILENO, STDOUT_FILENO);
        if (quiet) {
            FILE *null = fopen("/dev/null", "w");
            if (null) dup2(fileno(null), STDERR_FILENO), dup2(fileno(null), STDOUT_FILENO);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *python(void) { return getenv("PYTHON") ? getenv("PYTHON") : "python3"; }

/* Before any work: can the plot be drawn? 1 yes; 0 no (*why says, the run goes on). */
static int plot_possible(const char **why, char *script, size_t n) {
    if (!plot_script(script, n)) {
        *why = "bench/plot_bench.py was not found (set SPH_PLOT_SCRIPT)";
        return 0;
    }
    char *const probe[] = {(char *)python(), "-c", "import matplotlib", NULL};
    int rc = run_program(probe, 1);
    if (rc == 127 || rc < 0) {
        *why = "python3 was not found";
        return 0;
    }
    if (rc != 0) {
        *why = "matplotlib is not installed (scripts/setup.sh or pip install matplotlib "
               "installs it)";
        return 0;
    }
    return 1;
}

// ---- the command -----------------------------------------------------------------------------

static const char k_synopsis[] = "usage: spanhead bench [options]";
static const char k_about[] =
    "Times the LM head's forward + backward (general) and one-pass forward against the\n"
    "active floor (8 or 6 N_active H V flops at the dense GEMM rate measured in the same run)\n"
    "and the dense path, over a grid of shapes, token counts, mask patterns and active\n"
    "fractions. Defaults: on a GPU shapes A,B at 16K and 64K tokens; on the CPU one small\n"
    "shape (H 256, V_loc 4096, N 1K), seconds on 2 cores.";

/* Fills the derived fields; 0 or the usage exit code. */
static int settle(bopts *o, const sph_cli_parsed *pp) {
    const int cuda_present = sph_cuda_device_count() > 0;
    const int given_dev = sph_cli_given(sph_cli_bench_opts, pp, "--device");
    o->dev = given_dev ? (o->device ? SPH_DEVICE_CUDA : SPH_DEVICE_CPU)
                       : (cuda_present ? SPH_DEVICE_CUDA : SPH_DEVICE_CPU);
    const int cpu = o->dev == SPH_DEVICE_CPU;
    if (!sph_cli_given(sph_cli_bench_opts, pp, "--dtype")) o->dtype_opt = cpu ? 2 : 0;
    static const sph_dtype dts[3] = {{SPH_DTYPE_BFLOAT, 16, 1}, {SPH_DTYPE_FLOAT, 16, 1},
                                     {SPH_DTYPE_FLOAT, 32, 1}};
    o->dt = dts[o->dtype_opt];
    o->dt_name = bench_dtype_names[o->dtype_opt];
    o->matrix = sph_cli_given(sph_cli_bench_opts, pp, "--matrix");
    o->modes = o->mode + 1;
    if (!sph_cli_given(sph_cli_bench_opts, pp, "--repeats")) o->repeats = cpu ? 3 : 5;
    if (!sph_cli_given(sph_cli_bench_opts, pp, "--warmup")) o->warmup = cpu ? 1 : 2;
    if (!o->commit) o->commit = getenv("SPH_COMMIT") ? getenv("SPH_COMMIT") : "unknown";
    const int N_given = sph_cli_given(sph_cli_bench_opts, pp, "--N"), shape_given = o->shape_list.n > 0;
    if (o->matrix && (o->H || o->V || N_given))
        return sph_cli_fail("bench", 2, "--matrix seed sets the shapes' V and N itself: it takes "
                                        "--shape, not --H, --V or --N");
    if (o->peers && !o->plot) return sph_cli_fail("bench", 2, "--peers %s: goes with --plot", o->peers);
    if (o->temp_rows && o->mode == 3)
        return sph_cli_fail("bench", 2, "--temperature-rows: the general and one-pass modes "
                                        "only (not --mode policy)");
    if (o->H || o->V) {
        if (!o->H || !o->V) return sph_cli_fail("bench", 2, "--H and --V go together");
        if (shape_given) return sph_cli_fail("bench", 2, "--shape: not with --H/--V");
        o->shapes[0] = (bench_shape){"custom", o->H, o->V};
        o->n_shapes = 1;
    } else if (cpu && !shape_given && !o->matrix) {
        o->shapes[0] = (bench_shape){"custom", 256, 4096}; /* seconds on 2 cores */
        o->n_shapes = 1;
        if (!N_given) o->N_list = (sph_cli_list){.n = 1, .i = {1024}};
    } else {
        if (!shape_given) {
            o->shape_list.n = o->matrix ? 4 : 2;
            for (int k = 0; k < o->shape_list.n; k++) o->shape_list.i[k] = k;
        }
        for (int k = 0; k < o->shape_list.n; k++) o->shapes[k] = bench_shapes[o->shape_list.i[k]];
        o->n_shapes = o->shape_list.n;
    }
    if (!o->N_list.n) o->N_list = (sph_cli_list){.n = 3, .i = {4096, 16384, 65536}};
    if (!o->act_list.n) o->act_list = (sph_cli_list){.n = 3, .d = {1, 0.5, 0.25}};
    o->n_masks = o->mask_list.n ? o->mask_list.n : 1;
    for (int k = 0; k < o->n_masks; k++)
        o->masks[k] = bench_mask_names[o->mask_list.n ? o->mask_list.i[k] : 0];
    return 0;
}

/* Work point wi's inputs, random from its index, on the device (b); *hm and *spans: host
 * scratch for its masks (the caller frees them, and b). Returns 0 or the exit code. */
static int stage_work(sph_ctx_t ctx, const bopts *o, const work *w, int wi, dev_bufs *b,
                      uint8_t **hm, int64_t **spans) {
    const bench_shape *sh = &w->sh;
    const int64_t N = w->N;
    int rc = 0;
    const int bits = o->dt.bits, bf16 = o->dt.code == SPH_DTYPE_BFLOAT;
    const size_t es = (size_t)bits / 8;
    void *hh = sph_cli_alloc(N * sh->H, es), *hw = sph_cli_alloc(sh->V * sh->H, es);
    int32_t *ht = sph_cli_alloc(N, 4);
    float *hg = sph_cli_alloc(N, 4), *htr = o->temp_rows ? sph_cli_alloc(N, 4) : NULL;
    *hm = sph_cli_alloc(N, 1);
    *spans = sph_cli_alloc(2 * ((N + 1) / 2) + 2, sizeof(int64_t));
    if (!hh || !hw || !ht || !hg || !*hm || !*spans || (o->temp_rows && !htr)) {
        rc = sph_cli_fail("bench", 1, "out of host memory for N = %" PRId64, N);
    } else {
        sph_cli_rng r;
        bench_fill_head(&r, wi, sh, N, bits, bf16, hh, hw);
        for (int64_t i = 0; i < N; i++) ht[i] = (int32_t)sph_cli_rng_range(&r, 0, sh->V - 1);
        synth_fill_uniform(hg, N, 1.0, 32, 0, &r);
        for (int64_t i = 0; htr && i < N; i++) htr[i] = (float)(0.5 + sph_cli_rng_uniform(&r));
        if ((htr && bench_upload(ctx, &b->temp, htr, N, 4)) ||
            bench_upload(ctx, &b->h, hh, N * sh->H, es) || bench_upload(ctx, &b->w, hw, sh->V * sh->H, es) ||
            bench_upload(ctx, &b->tgt, ht, N, 4) || bench_upload(ctx, &b->g, hg, N, 4) ||
            bench_upload(ctx, &b->e, hg, N, 4) || bench_upload(ctx, &b->mask, NULL, N, 1) ||
            bench_upload(ctx, &b->lp, NULL, N, 4) || bench_upload(ctx, &b->ent, NULL, N, 4) ||
            bench_upload(ctx, &b->st, NULL, N, 12) || bench_upload(ctx, &b->dh, NULL, N * sh->H, es) ||
            bench_upload(ctx, &b->dw, NULL, sh->V * sh->H, es) ||
            (o->topk && (bench_upload(ctx, &b->tki, NULL, N * o->topk, 8) ||
                         bench_upload(ctx, &b->tkl, NULL, N * o->topk, 4))) ||
            (o->sum_p2 && bench_upload(ctx, &b->sp2, NULL, N, 4)))
            rc = sph_cli_fail("bench", 1, "device buffers: %s", sph_last_error());
    }
    free(hh), free(hw), free(ht), free(hg), free(htr);
    return rc;
}

int sph_cli_bench(int argc, char **argv) {
    bopts o;
    memset(&o, 0, sizeof o);
    o.mode = 2, o.seed = 1;
    sph_cli_parsed pp = {0};
    int done, rc = sph_cli_parse_or_exit("bench", k_synopsis, k_about, sph_cli_bench_opts, argc, argv, &o,
                                         &pp, &done);
    if (done) return rc;
    if ((rc = settle(&o, &pp))) return rc;

    static work ws[MAX_WORK];
    run_spec runs[MAX_RUNS];
    const int n_work = o.matrix ? bench_seed_matrix(&o, ws) : bench_grid(&o, ws);
    const int n_runs = bench_plan_runs(&o, runs);
    if ((rc = walk_points(&o, ws, n_work, runs, n_runs, 0))) return rc;
    if (o.list) return walk_points(&o, ws, n_work, runs, n_runs, 1);

    char script[4200];
    const char *why = NULL;
    int can_plot = o.plot && plot_possible(&why, script, sizeof script);
    if (o.plot && !can_plot)
        fprintf(stderr, "spanhead bench: --plot %s: %s; the plot will be skipped\n", o.plot, why);

    sph_ctx_opts co = SPH_CTX_OPTS_INIT;
    co.device.type = o.dev;
    co.chunk_bytes = o.chunk_bytes;
    /* the SPH_CUDA_* A/B switches the scripts under scripts/device set */
    if (sph_ctx_opts_apply_env(&co) != SPH_OK)
        return sph_cli_fail("bench", 2, "%s", sph_last_error());
    bench_set_ctx_opts(&co);
    sph_ctx_t ctx;
    const double tc0 = sph_cli_now_s();
    if (sph_ctx_create(&ctx, &co) != SPH_OK)
        return sph_cli_fail("bench", 1, "context: %s", sph_last_error());
    const double first_ctx_ms = 1e3 * (sph_cli_now_s() - tc0);
    FILE *js[2] = {NULL, NULL}; /* --json FILE, and the plot's own records */
    char tmp_json[] = "/tmp/spanhead-bench-XXXXXX";
    int tmp_fd = -1;
    if (o.json && !(js[0] = fopen(o.json, "a"))) {
        sph_ctx_destroy(ctx);
        return sph_cli_fail("bench", 1, "--json %s: cannot open for appending: %s", o.json,
                            strerror(errno));
    }
    if (can_plot && ((tmp_fd = mkstemp(tmp_json)) < 0 || !(js[1] = fdopen(tmp_fd, "w")))) {
        if (tmp_fd >= 0) unlink(tmp_json);
        if (js[0]) fclose(js[0]);
        sph_ctx_destroy(ctx);
        return sph_cli_fail("bench", 1, "--plot: temporary file: %s", strerror(errno));
    }
    char gpu[128], date[32];
    snprintf(gpu, sizeof gpu, "%s", sph_ctx_describe(ctx));
    time_t tt = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&tt));
    printf("# spanhead bench: %s, %s, dtype %s, commit %s, %s\n", gpu, date, o.dt_name,
           o.commit, sph_version());
    printf("# first context of the process (device runtime initialization included): %.1f ms; "
           "each row's first call ms: a fresh context + workspace + the first step, cold\n",
           first_ctx_ms);
    if (o.matrix) printf("# matrix seed: %d unique points\n", n_work);
    if (o.temp_rows) printf("# per-row temperatures: uniform in [0.5, 1.5] (--temperature-rows)\n");
    if (o.mode == 3) { /* --mode policy: its own table (bench_policy.c) */
        rc = bench_policy(ctx, &o, ws, n_work, gpu, date, js[0]);
        goto finish;
    }
    printf("# rates: dense GEMM TFLOP/s at the point's shape, burst (one product) and sustained "
           "(a chain of %s products); floor = %s N_active H V at that rate\n\n",
           o.modes == 1 ? "4" : o.modes == 2 ? "3" : "4 general / 3 one-pass",
           o.modes == 1 ? "8" : o.modes == 2 ? "6" : "8 (general) or 6 (one-pass)");
    table_head(&o, 1);
    sph_cli_progress pr;
    sph_cli_progress_start(&pr, "spanhead bench: runs", (int64_t)n_work * n_runs);
    for (int wi = 0; wi < n_work && !rc; wi++) {
        const work *w = &ws[wi];
        const bench_shape *sh = &w->sh;
        const int64_t N = w->N;
        rates rt;
        if ((rc = gemm_rates(ctx, &o, N, sh->V, sh->H, &rt))) break;
        dev_bufs b;
        memset(&b, 0, sizeof b);
        uint8_t *hm = NULL;
        int64_t *spans = NULL;
        rc = stage_work(ctx, &o, w, wi, &b, &hm, &spans);
        for (int ri = 0; ri < n_runs && !rc; ri++) {
            point q = {.mask = runs[ri].mask, .act = runs[ri].act, .one_pass = runs[ri].one_pass,
                       .n_active = N};
            int64_t ns = 0;
            const int masked = strcmp(q.mask, "none") != 0;
            if (masked) {
                if ((rc = bench_point_mask(&o, w, q.mask, &q.act, hm, spans, &ns, &q.n_active)))
                    break;
                if (sph_ctx_memcpy(ctx, b.mask, hm, (size_t)N) != SPH_OK) {
                    rc = sph_cli_fail("bench", 1, "mask: %s", sph_last_error());
                    break;
                }
            }
            /* with --topk / --sum-p2, the same point with the extras too (the next row),
             * timed alternately with it */
            const int ex = o.topk || o.sum_p2;
            point x = q;
            x.extras = 1;
            rc = time_point(ctx, &o, sh, N, &b, spans, ns, masked, q.one_pass, &rt, &q,
                            ex ? &x : NULL);
            sph_cli_progress_end(&pr);
            if (!rc) emit(js, &o, gpu, date, w, &q);
            if (!rc && ex) emit(js, &o, gpu, date, w, &x);
            sph_cli_progress_step(&pr, (int64_t)wi * n_runs + ri + 1);
        }
        free(hm), free(spans);
        bufs_free(ctx, &b);
    }
    sph_cli_progress_end(&pr);
finish:
    /* every write checked: an error flag from any line (a full disk, /dev/full), or the
     * final flush; ferror first, since a failed flush may leave fclose nothing to fail on */
    for (int k = 0; k < 2; k++) {
        if (!js[k]) continue;
        int bad = ferror(js[k]) != 0, e = bench_js_errno;
        errno = 0;
        if (fclose(js[k]) != 0) bad = 1, e = e ? e : errno;
        if (bad && !rc)
            rc = k == 0 ? sph_cli_fail("bench", 1, "--json %s: write failed: %s", o.json,
                                       e ? strerror(e) : "I/O error")
                        : sph_cli_fail("bench", 1, "--plot: %s: write failed: %s", tmp_json,
                                       e ? strerror(e) : "I/O error");
    }
    sph_ctx_destroy(ctx);
    if (o.plot && !rc) {
        if (!can_plot) {
            fprintf(stderr, "spanhead bench: --plot %s: skipped: %s\n", o.plot, why);
        } else {
            char *pargv[8] = {(char *)python(), script, tmp_json,
                              (char *)o.plot, NULL, NULL, NULL, NULL};
            if (o.peers) pargv[4] = "--peers", pargv[5] = (char *)o.peers;
            int prc = run_program(pargv, 0);
            if (prc != 0)
                rc = sph_cli_fail("bench", 1, "--plot %s: bench/plot_bench.py failed (exit %d)",
                                  o.plot, prc);
        }
    }
    if (tmp_fd >= 0) unlink(tmp_json);
    return rc;
}
