/*
 * bench_points.c - the points `spanhead bench` times (see bench.h): the grid and the seed's
 * matrix, the runs of each point and their masks.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "json_util.h"
#include "msg.h"
#include "num.h"
#include "rng.h"
#include "synth.h"


// ---- response and fragmented masks -----------------------------------------------------------
// response: the last act*2048 rows of each 2048-row sequence; fragmented: runs of 16 active
// rows, evenly spaced.

static int64_t build_mask(uint8_t *mask, int64_t N, double act, const char *pattern) {
    int64_t n_act = 0;
    if (act >= 1.0) {
        memset(mask, 1, (size_t)N);
        return N;
    }
    memset(mask, 0, (size_t)N);
    if (!strcmp(pattern, "response")) {
        const int64_t S = 2048;
        for (int64_t s0 = 0; s0 < N; s0 += S) {
            int64_t len = N - s0 < S ? N - s0 : S, a = (int64_t)llround(act * (double)len);
            for (int64_t i = s0 + len - a; i < s0 + len; i++) mask[i] = 1, n_act++;
        }
    } else { /* fragmented: runs of 16 active rows, evenly spaced */
        const int64_t run = 16, period = (int64_t)llround(16.0 / act);
        for (int64_t s0 = 0; s0 < N; s0 += period)
            for (int64_t i = s0; i < s0 + run && i < N; i++) mask[i] = 1, n_act++;
    }
    return n_act;
}

// ---- packed-rl ------------------------------------------------------------------------------
// A packed RL batch built by the library's own metadata. Sequences are drawn until the batch's
// T tokens are full: prompt lengths log-normal with median 512 and sigma 1 clipped to
// [32, 4096], response lengths log-normal with median 768 and sigma 1 clipped to [16, 8192]
// (RL rollouts: shorter prompts, long-tailed responses; about 60% of the tokens are response
// tokens). Each sequence becomes one segment of sph_spans_build's packed layout, padded to the
// sequence alignment of the point's TP/CP so that padding rows are inactive as in training; the
// last one is truncated to fill T exactly. The loss mask is 1 on response tokens, so the active
// rows are those whose next token is a response token. The bench takes CP rank 0's T / CP rows
// (chunks 0 and 2CP-1 of every segment) and the library's exact spans, coalesced over --gap.
// The draws depend only on (--seed, T): every shape and every TP/CP layout of T tokens lays out
// the same sequences (only the padding differs), and both runs of an A/B comparison agree.

/* median * exp(sigma z), z standard normal by Box-Muller, rounded and clipped to [lo, hi]. */
static int64_t lognormal_len(sph_cli_rng *s, double median, double sigma, int64_t lo, int64_t hi) {
    double u1 = ((double)(sph_cli_rng_u64(s) >> 11) + 1.0) * 0x1p-53; /* (0, 1]: log(u1) is finite */
    double u2 = (double)(sph_cli_rng_u64(s) >> 11) * 0x1p-53;
    double x = median * exp(sigma * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    return x < (double)lo ? lo : x > (double)hi ? hi : (int64_t)llround(x);
}

/* Fills mask[N] and spans of CP rank 0 of w's packed batch; returns 0 or an exit code. */
static int packed_rl_mask(const bopts *o, const work *w, uint8_t *mask, int64_t *spans,
                          int64_t *n_spans, int64_t *n_active) {
    const int64_t T = w->tokens ? w->tokens : w->N;
    sph_parallel par = SPH_PARALLEL_INIT;
    if (w->tp) par.tp = w->tp, par.cp = w->cp;
    sph_alignment al;
    if (sph_alignment_get(&par, &al) != SPH_OK)
        return sph_cli_fail("bench", 1, "packed-rl: %s", sph_last_error());
    if (T % al.total)
        return sph_cli_fail("bench", 2,
                            "packed-rl: %" PRId64 " tokens are not a multiple of the TP%" PRId64
                            "/CP%" PRId64 " token alignment %" PRId64,
                            T, par.tp, par.cp, al.total);
    /* every full sequence has >= 32 + 16 tokens, plus one truncated */
    const int64_t cap = T / 48 + 2;
    int64_t *len = malloc((size_t)cap * sizeof(int64_t));
    int64_t *prompt = malloc((size_t)cap * sizeof(int64_t));
    uint8_t *loss = NULL;
    int64_t n = 0, filled = 0, S = 0;
    sph_cli_rng st = {(uint64_t)o->seed};
    st.s = sph_cli_rng_u64(&st) ^ (uint64_t)T;
    while (len && prompt && filled < T) {
        int64_t p = lognormal_len(&st, 512, 1.0, 32, 4096);
        int64_t l = p + lognormal_len(&st, 768, 1.0, 16, 8192);
        int64_t padded = (l + al.sequence - 1) / al.sequence * al.sequence;
        /* T and every padded length are multiples of the sequence alignment, so is the rest */
        if (padded > T - filled) l = padded = T - filled;
        len[n] = l, prompt[n] = p < l ? p : l, n++;
        filled += padded, S += l;
    }
    if (len && prompt) loss = calloc((size_t)S, 1);
    if (!loss) {
        free(len), free(prompt);
        return sph_cli_fail("bench", 1, "packed-rl: out of host memory for %" PRId64 " tokens",
                            T);
    }
    /* loss column c - 1 is token column c: prompts are >= 1 token, so c - 1 >= 0 */
    for (int64_t k = 0, c0 = 0; k < n; c0 += len[k], k++)
        for (int64_t c = c0 + prompt[k]; c < c0 + len[k]; c++) loss[c - 1] = 1;
    sph_batch_desc d = SPH_BATCH_DESC_INIT;
    d.layout = SPH_LAYOUT_PACKED, d.batch = 1, d.seq_len = S, d.num_actions = S - 1;
    d.loss_mask = loss, d.sub_seq_lengths = len, d.sub_seq_counts = &n;
    sph_spans_opts so = SPH_SPANS_OPTS_INIT;
    so.par = par, so.cp_rank = 0, so.gap = o->gap;
    sph_spans *sp = NULL;
    sph_status s = sph_spans_build(&d, &so, &sp);
    free(len), free(prompt), free(loss);
    if (s != SPH_OK) return sph_cli_fail("bench", 1, "packed-rl: %s", sph_last_error());
    if (sp->local_rows != w->N) {
        int64_t got = sp->local_rows;
        sph_spans_free(sp);
        return sph_cli_fail("bench", 1,
                            "packed-rl: rank 0 holds %" PRId64 " rows, expected N = %" PRId64,
                            got, w->N);
    }
    memcpy(mask, sp->local_mask, (size_t)w->N);
    memcpy(spans, sp->spans, (size_t)sp->n_spans * 2 * sizeof(int64_t));
    *n_spans = sp->n_spans, *n_active = sp->local_active_rows;
    sph_spans_free(sp);
    return 0;
}

// ---- points ----------------------------------------------------------------------------------

static int add_work(work *out, int n, const bench_shape *sh, int64_t tp, int64_t cp, int64_t T) {
    const int64_t V_full = 4 * sh->V;
    int64_t V = V_full / tp;
    if (V_full % tp) V -= V % 8;
    for (int k = 0; k < n; k++)
        if (!strcmp(out[k].sh.name, sh->name) && out[k].tp == tp && out[k].cp == cp &&
            out[k].tokens == T)
            return n;
    out[n] = (work){{sh->name, sh->H, V}, T / cp, tp, cp, T};
    return n + 1;
}

/* The seed's matrix as per-rank work (issue 6: "four model shapes at TP4/CP2 with 16K-256K
 * tokens; every (TP, CP) with TP*CP <= 8 at a representative 16K-token shape"). The seed counts
 * 58 points but does not list them; this is our reading. k_shapes' V are per rank at TP4, so a
 * model's vocabulary is V_full = 4 V and a rank at TP t holds V_full / t rows, rounded down to a
 * multiple of 8 (16-byte bf16 rows) should t not divide V_full; for A-D and t <= 8 it divides.
 *   part 1: each shape at TP4/CP2, T in {16K, 32K, 64K, 128K, 256K} total tokens;
 *   part 2: each shape at every (TP, CP), both powers of two, TP*CP <= 8 (10 layouts), T = 16K;
 * N = T / CP per rank. TP4/CP2/16K is in both: 4 shapes x (5 + 10 - 1) = 56 unique points. */
int bench_seed_matrix(const bopts *o, work *out) {
    int n = 0;
    for (int si = 0; si < o->n_shapes; si++)
        for (int64_t T = 16384; T <= 262144; T *= 2) n = add_work(out, n, &o->shapes[si], 4, 2, T);
    for (int si = 0; si < o->n_shapes; si++)
        for (int64_t tp = 1; tp <= 8; tp *= 2)
            for (int64_t cp = 1; tp * cp <= 8; cp *= 2)
                n = add_work(out, n, &o->shapes[si], tp, cp, 16384);
    return n;
}

int bench_grid(const bopts *o, work *out) {
    int n = 0;
    for (int si = 0; si < o->n_shapes; si++)
        for (int ni = 0; ni < o->N_list.n; ni++) out[n++] = (work){o->shapes[si], o->N_list.i[ni], 0, 0, 0};
    return n;
}

/* The runs of every point, in order: per mode, the dense path, then each mask at each active
 * fraction; packed-rl runs once (its fraction comes from the batch, filled in by point_mask). */
int bench_plan_runs(const bopts *o, run_spec *r) {
    int n = 0;
    for (int mode = 0; mode < 2; mode++) {
        if (!(o->modes & (1 << mode))) continue;
        r[n++] = (run_spec){"none", 1.0, mode};
        for (int mi = 0; mi < o->n_masks; mi++) {
            if (!strcmp(o->masks[mi], "packed-rl")) {
                r[n++] = (run_spec){o->masks[mi], 0.0, mode};
                continue;
            }
            for (int ai = 0; ai < o->act_list.n; ai++)
                r[n++] = (run_spec){o->masks[mi], o->act_list.d[ai], mode};
        }
    }
    return n;
}


int bench_point_mask(const bopts *o, const work *w, const char *mask, double *act,
                     uint8_t *hm, int64_t *spans, int64_t *n_spans, int64_t *n_active) {
    if (strcmp(mask, "packed-rl")) {
        *n_active = build_mask(hm, w->N, *act, mask);
        if (sph_spans_from_mask(hm, w->N, o->gap, spans, n_spans) != SPH_OK)
            return sph_cli_fail("bench", 1, "spans: %s", sph_last_error());
        return 0;
    }
    int rc = packed_rl_mask(o, w, hm, spans, n_spans, n_active);
    if (rc) return rc;
    /* a floor of 0 would make the ratio infinite (and the JSON invalid) */
    if (!*n_active)
        return sph_cli_fail("bench", 2,
                            "--N %" PRId64 ": the packed-rl batch has no response token; "
                            "expected a larger N",
                            w->N);
    *act = (double)*n_active / (double)w->N;
    return 0;
}

// ---- what the table's emitters share (bench.h) ---------------------------------------------

int bench_js_errno;

/* The options of the benchmark's context: the rows' cold first calls make their own contexts
 * with them. */
static sph_ctx_opts g_co;
void bench_set_ctx_opts(const sph_ctx_opts *co) { g_co = *co; }
const sph_ctx_opts *bench_ctx_opts(void) { return &g_co; }

int bench_upload(sph_ctx_t ctx, void **dst, const void *src, int64_t count, size_t elem) {
    size_t bytes;
    if (sph_cli_bytes(count, elem, &bytes)) return 1;
    if (sph_ctx_malloc(ctx, bytes ? bytes : 1, dst) != SPH_OK) return 1;
    if (src && sph_ctx_memcpy(ctx, *dst, src, bytes) != SPH_OK) return 1;
    return 0;
}

void bench_fill_head(sph_cli_rng *r, int64_t wi, const bench_shape *sh, int64_t N, int bits,
                     int bf16, void *hh, void *hw) {
    sph_cli_rng_seed(r, 0x9E3779B97F4A7C15ull + (uint64_t)wi);
    synth_fill_uniform(hh, N * sh->H, 1.0, bits, bf16, r);
    synth_fill_uniform(hw, sh->V * sh->H, 0.05, bits, bf16, r);
}

void bench_json_run_tail(FILE *f, const bopts *o, int extras, double extra_pct, size_t peak,
                         const char *path, double first_ms) {
    if (extras) {
        fprintf(f, ",\"topk\":%" PRId64 ",\"sum_p2\":%s,\"extra_pct\":", o->topk,
                o->sum_p2 ? "true" : "false");
        sph_cli_json_num(f, "%.3f", extra_pct);
    }
    fprintf(f, ",\"peak_extra_bytes\":%zu,\"path\":", peak);
    sph_cli_json_str(f, path);
    fputs(",\"first_call_ms\":", f), sph_cli_json_num(f, "%.3f", first_ms);
}
