/*
 * cmd_bench.c - `spanhead bench`: times the LM head against the active floor (DESIGN.md
 * section 5, issue 6) and the dense path, in one run.
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
 *   floor_ms  8 N_active H V / rate (general) or 6 N_active H V / rate (one-pass)
 *   ratio     ms / floor_ms
 *   floor_sustained_ms, ratio_sustained: the same against rate_sustained
 *   peak_extra_bytes: the workspace (the only device memory the head takes beyond inputs,
 *             outputs and stats)
 * plus the dense path (every row, no mask) of the same shape and mode. Masks: "response"
 * (the last active*2048 rows of each 2048-row sequence), "fragmented" (runs of 16 active rows
 * spread evenly), "packed-rl" (a packed RL batch laid out by the library's own metadata, see
 * packed_rl_mask; its active fraction is whatever the batch gives); spans are the exact
 * active runs unless --gap coalesces them.
 * Points: the grid --shape x --N, or with --matrix seed the seed's measurement matrix as
 * per-rank work (seed_matrix). --list prints the points instead of running them.
 * Output: a markdown table on stdout (per (shape, N) a row with both rates, then per point
 * both floors and ratios), JSON lines with --json FILE: issue 6's fields plus
 * floor_sustained_ms, ratio_sustained, rate_tflops and rate_sustained_tflops (the mode's).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "json_util.h"

/* OpenBLAS is linked through libspanhead; declared here so the CLI needs no BLAS header. */
void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                 int lda, const float *b, int ldb, float beta, float *c, int ldc);

typedef struct shape {
    const char *name;
    int64_t H, V; /* V: the per-rank vocabulary V_loc */
} shape;

/* Per rank at TP4 (the seed's layout); seed_matrix derives the other TP sizes from them. */
static const shape k_shapes[] = {
    {"A", 2048, 62080}, {"B", 4096, 37984}, {"C", 5120, 37984}, {"D", 2048, 151936},
    {"E", 4096, 128256}};

/* One (shape, per-rank N) the bench allocates buffers for. tp, cp and tokens (the total
 * tokens over the CP group) are 0 for grid points, which have no parallel layout: the JSON
 * writes them as null rather than inventing TP1/CP1. */
typedef struct work {
    shape sh;
    int64_t N, tp, cp, tokens;
} work;

/* One timed run of a work point: the dense path has mask "none". */
typedef struct run_spec {
    const char *mask;
    double act;
    int one_pass;
} run_spec;

#define MAX_LIST 16
#define MAX_WORK 256
#define MAX_RUNS (2 * (1 + 3 * MAX_LIST))

typedef struct bopts {
    sph_device_type dev;
    sph_dtype dt;
    const char *dt_name;
    shape shapes[MAX_LIST];
    int n_shapes;
    int64_t Ns[MAX_LIST];
    int n_N;
    double act[MAX_LIST];
    int n_act;
    const char *masks[3];
    int n_masks;
    int modes; /* 1 general, 2 one-pass, 3 both */
    int repeats, warmup;
    int matrix, list;
    int64_t chunk_bytes;
    int64_t gap;  /* span coalescing gap */
    int64_t seed; /* packed-rl length draws */
    const char *json;
    const char *commit;
} bopts;

static double now_ms(void) { return 1e3 * sph_cli_now_s(); }

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static inline uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static inline float rnd_f(void) { return (float)((rnd() >> 40) * (1.0 / (1 << 24)) * 2 - 1); }
static inline uint16_t to_half_bits(float f, int bf16) {
    union { float f; uint32_t u; } x = {f};
    if (bf16) return (uint16_t)((x.u + 0x7fffu + ((x.u >> 16) & 1u)) >> 16);
    /* f16 for |f| < 2 (our random data): normal numbers only, round to nearest */
    uint32_t sign = (x.u >> 16) & 0x8000u;
    int e = (int)((x.u >> 23) & 0xff) - 127 + 15;
    if (e <= 0) return (uint16_t)sign;
    uint32_t m = (x.u & 0x7fffffu) + 0x1000u;
    if (m & 0x800000u) m = 0, e++;
    return (uint16_t)(sign | ((uint32_t)e << 10) | (m >> 13));
}

/* Host buffer of n random values in dtype, scaled. */
static void *rand_buf(int64_t n, sph_dtype dt, float scale) {
    size_t es = dt.bits / 8;
    void *p = malloc((size_t)n * es + 1);
    if (!p) return NULL;
    for (int64_t k = 0; k < n; k++) {
        float v = rnd_f() * scale;
        if (es == 4)
            ((float *)p)[k] = v;
        else
            ((uint16_t *)p)[k] = to_half_bits(v, dt.code == SPH_DTYPE_BFLOAT);
    }
    return p;
}

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

static int64_t build_spans(const uint8_t *mask, int64_t N, int64_t gap, int64_t *spans) {
    int64_t n = 0;
    for (int64_t i = 0; i < N;) {
        if (!mask[i]) {
            i++;
            continue;
        }
        int64_t s = i;
        while (i < N && mask[i]) i++;
        if (n > 0 && s - spans[2 * n - 1] <= gap)
            spans[2 * n - 1] = i;
        else
            spans[2 * n] = s, spans[2 * n + 1] = i, n++;
    }
    return n;
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

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* median * exp(sigma z), z standard normal by Box-Muller, rounded and clipped to [lo, hi]. */
static int64_t lognormal_len(uint64_t *s, double median, double sigma, int64_t lo, int64_t hi) {
    double u1 = ((double)(splitmix(s) >> 11) + 1.0) * 0x1p-53; /* (0, 1]: log(u1) is finite */
    double u2 = (double)(splitmix(s) >> 11) * 0x1p-53;
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
    uint64_t st = (uint64_t)o->seed;
    st = splitmix(&st) ^ (uint64_t)T;
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

static int add_work(work *out, int n, const shape *sh, int64_t tp, int64_t cp, int64_t T) {
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
static int seed_matrix(const bopts *o, work *out) {
    int n = 0;
    for (int si = 0; si < o->n_shapes; si++)
        for (int64_t T = 16384; T <= 262144; T *= 2) n = add_work(out, n, &o->shapes[si], 4, 2, T);
    for (int si = 0; si < o->n_shapes; si++)
        for (int64_t tp = 1; tp <= 8; tp *= 2)
            for (int64_t cp = 1; tp * cp <= 8; cp *= 2)
                n = add_work(out, n, &o->shapes[si], tp, cp, 16384);
    return n;
}

static int grid(const bopts *o, work *out) {
    int n = 0;
    for (int si = 0; si < o->n_shapes; si++)
        for (int ni = 0; ni < o->n_N; ni++) out[n++] = (work){o->shapes[si], o->Ns[ni], 0, 0, 0};
    return n;
}

/* The runs of every point, in order: per mode, the dense path, then each mask at each active
 * fraction; packed-rl runs once (its fraction comes from the batch, filled in by point_mask). */
static int plan_runs(const bopts *o, run_spec *r) {
    int n = 0;
    for (int mode = 0; mode < 2; mode++) {
        if (!(o->modes & (1 << mode))) continue;
        r[n++] = (run_spec){"none", 1.0, mode};
        for (int mi = 0; mi < o->n_masks; mi++) {
            if (!strcmp(o->masks[mi], "packed-rl")) {
                r[n++] = (run_spec){o->masks[mi], 0.0, mode};
                continue;
            }
            for (int ai = 0; ai < o->n_act; ai++)
                r[n++] = (run_spec){o->masks[mi], o->act[ai], mode};
        }
    }
    return n;
}

/* Products of 2 N H V flops that each mode runs back to back: general = forward logits,
 * backward logits, dH, dW (8 N H V); one-pass = logits, dH, dW (6 N H V). The sustained rate
 * of a mode is measured over a chain of that many products. */
static const int k_chain[2] = {4, 3}; /* [one_pass] */

/* Dense GEMM rates (TFLOP/s) of one (shape, N): burst, one product at a time; sustained, a
 * chain of k_chain[one_pass] products timed as a whole (0 for a mode that is not run). */
typedef struct rates {
    double burst, sustained[2]; /* sustained[one_pass] */
} rates;

/* Median ms over reps (after one warm-up) of `chain` sgemm calls on the slice, timed whole. */
static double sgemm_chain_ms(const float *a, const float *b, float *c, int64_t m, int64_t n,
                             int64_t K, int chain, int reps) {
    double t[16];
    for (int r = -1; r < reps; r++) {
        double t0 = now_ms();
        for (int k = 0; k < chain; k++)
            cblas_sgemm(101, 111, 112, (int)m, (int)n, (int)K, 1.f, a, (int)K, b, (int)K, 0.f,
                        c, (int)n);
        if (r >= 0) t[r] = now_ms() - t0;
    }
    qsort(t, (size_t)reps, sizeof t[0], sph_cli_cmp_double);
    return t[reps / 2];
}

/* Burst and sustained dense GEMM rates of the context's device at (M, N, K). */
static int gemm_rates(sph_ctx_t ctx, const bopts *o, int64_t M, int64_t N, int64_t K,
                      rates *rt) {
    memset(rt, 0, sizeof *rt);
    if (o->dev == SPH_DEVICE_CUDA) {
        if (sph_tune_gemm_rate(ctx, o->dt, M, N, K, o->repeats, &rt->burst) != SPH_OK)
            return sph_cli_fail("bench", 1, "gemm rate: %s", sph_last_error());
        for (int op = 0; op < 2; op++)
            if ((o->modes & (1 << op)) &&
                sph_tune_gemm_rate_sustained(ctx, o->dt, M, N, K, k_chain[op], o->repeats,
                                             &rt->sustained[op]) != SPH_OK)
                return sph_cli_fail("bench", 1, "sustained gemm rate: %s", sph_last_error());
        return 0;
    }
    /* CPU: sgemm on a bounded slice of the shape (the rate, not the full product) */
    int64_t m = M < 2048 ? M : 2048, n = N < 4096 ? N : 4096;
    float *a = rand_buf(m * K, (sph_dtype){SPH_DTYPE_FLOAT, 32, 1}, 1.f);
    float *b = rand_buf(n * K, (sph_dtype){SPH_DTYPE_FLOAT, 32, 1}, 1.f);
    float *c = malloc((size_t)(m * n) * 4 + 1);
    if (!a || !b || !c) {
        free(a), free(b), free(c);
        return sph_cli_fail("bench", 1, "out of host memory for the sgemm rate");
    }
    const int reps = o->repeats < 16 ? o->repeats : 16;
    const double flops = 2.0 * m * n * K;
    rt->burst = flops / (sgemm_chain_ms(a, b, c, m, n, K, 1, reps) * 1e-3) / 1e12;
    for (int op = 0; op < 2; op++)
        if (o->modes & (1 << op))
            rt->sustained[op] = k_chain[op] * flops /
                                (sgemm_chain_ms(a, b, c, m, n, K, k_chain[op], reps) * 1e-3) /
                                1e12;
    free(a), free(b), free(c);
    return 0;
}

typedef struct dev_bufs {
    void *h, *w, *tgt, *mask, *lp, *ent, *st, *g, *e, *dh, *dw, *ws;
    size_t ws_bytes;
} dev_bufs;

static void bufs_free(sph_ctx_t ctx, dev_bufs *b) {
    void *ps[] = {b->h, b->w, b->tgt, b->mask, b->lp, b->ent, b->st, b->g, b->e, b->dh, b->dw,
                  b->ws};
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) sph_ctx_free(ctx, ps[k]);
    memset(b, 0, sizeof *b);
}

static int upload(sph_ctx_t ctx, void **dst, const void *src, size_t bytes) {
    if (sph_ctx_malloc(ctx, bytes, dst) != SPH_OK) return 1;
    if (src && sph_ctx_memcpy(ctx, *dst, src, bytes) != SPH_OK) return 1;
    return 0;
}

typedef struct point {
    const char *mask;
    double act;
    int one_pass;
    double ms, floor_ms, ratio;
    double floor_sus_ms, ratio_sus; /* against the sustained rate */
    double rate, rate_sus;          /* TFLOP/s, burst and sustained (this mode's chain) */
    size_t peak;
    int64_t n_active;
    char path[56]; /* sph_head_describe's path (forward, then backward for the general path),
                      with "+recompute" when a one-pass forward recomputes its logits */
} point;

/* Times one configuration; returns 0 and fills pt, or an exit code. */
static int time_point(sph_ctx_t ctx, const bopts *o, const shape *sh, int64_t N, dev_bufs *b,
                      const int64_t *spans, int64_t n_spans, int masked, int one_pass,
                      const rates *rt, point *pt) {
    int64_t sh_h[2] = {N, sh->H}, sh_w[2] = {sh->V, sh->H}, sh_n[1] = {N}, sh_s[2] = {N, 3};
    sph_device d = {o->dev, 0};
    sph_tensor th = {b->h, d, 2, o->dt, sh_h, NULL, 0};
    sph_tensor tw = {b->w, d, 2, o->dt, sh_w, NULL, 0};
    sph_tensor tt = {b->tgt, d, 1, SPH_I32, sh_n, NULL, 0};
    sph_tensor tm = {b->mask, d, 1, SPH_U8, sh_n, NULL, 0};
    sph_tensor tlp = {b->lp, d, 1, SPH_F32, sh_n, NULL, 0};
    sph_tensor tent = {b->ent, d, 1, SPH_F32, sh_n, NULL, 0};
    sph_tensor tst = {b->st, d, 2, SPH_F32, sh_s, NULL, 0};
    sph_tensor tg = {b->g, d, 1, SPH_F32, sh_n, NULL, 0};
    sph_tensor te = {b->e, d, 1, SPH_F32, sh_n, NULL, 0};
    sph_tensor tdh = {b->dh, d, 2, o->dt, sh_h, NULL, 0};
    sph_tensor tdw = {b->dw, d, 2, o->dt, sh_w, NULL, 0};
    sph_head_args f = SPH_HEAD_ARGS_INIT;
    f.hidden = &th, f.weight = &tw, f.targets = &tt, f.stats = &tst;
    f.logprob = &tlp, f.entropy = &tent;
    if (masked) f.active_mask = &tm, f.spans = spans, f.n_spans = n_spans;
    sph_head_args bw = f;
    bw.logprob = bw.entropy = NULL;
    bw.dlogprob = &tg, bw.dentropy = &te, bw.dhidden = &tdh, bw.dweight = &tdw;
    if (one_pass) f = bw, f.logprob = &tlp, f.entropy = &tent;
    size_t wf = 0, wb = 0;
    if (sph_head_workspace_size(ctx, SPH_HEAD_FORWARD, &f, &wf) != SPH_OK ||
        (!one_pass && sph_head_workspace_size(ctx, SPH_HEAD_BACKWARD, &bw, &wb) != SPH_OK))
        return sph_cli_fail("bench", 1, "workspace size: %s", sph_last_error());
    size_t need = wf > wb ? wf : wb;
    sph_head_pass_info fi = SPH_HEAD_PASS_INFO_INIT, bi = SPH_HEAD_PASS_INFO_INIT;
    if (sph_head_describe(ctx, SPH_HEAD_FORWARD, &f, &fi) != SPH_OK ||
        (!one_pass && sph_head_describe(ctx, SPH_HEAD_BACKWARD, &bw, &bi) != SPH_OK))
        return sph_cli_fail("bench", 1, "describe: %s", sph_last_error());
    if (one_pass)
        snprintf(pt->path, sizeof pt->path, "%s", fi.path);
    else
        snprintf(pt->path, sizeof pt->path, "%s/%s", fi.path, bi.path);
    if (need > b->ws_bytes) {
        sph_ctx_free(ctx, b->ws);
        b->ws = NULL, b->ws_bytes = 0;
        if (sph_ctx_malloc(ctx, need, &b->ws) != SPH_OK)
            return sph_cli_fail("bench", 1, "workspace: %s", sph_last_error());
        b->ws_bytes = need;
    }
    double *t = malloc(sizeof(double) * (size_t)(o->repeats + 1));
    if (!t) return sph_cli_fail("bench", 1, "out of memory");
    for (int r = -o->warmup; r < o->repeats; r++) {
        double t0 = now_ms();
        sph_status s = sph_head_forward(ctx, &f, b->ws, b->ws_bytes);
        if (s == SPH_OK && !one_pass) s = sph_head_backward(ctx, &bw, b->ws, b->ws_bytes);
        if (s == SPH_OK) s = sph_ctx_synchronize(ctx);
        if (s != SPH_OK) {
            free(t);
            return sph_cli_fail("bench", 1, "head: %s", sph_last_error());
        }
        if (r >= 0) t[r] = now_ms() - t0;
    }
    qsort(t, (size_t)o->repeats, sizeof t[0], sph_cli_cmp_double);
    pt->ms = t[o->repeats / 2];
    free(t);
    double flops = (one_pass ? 6.0 : 8.0) * (double)pt->n_active * sh->H * sh->V;
    pt->rate = rt->burst, pt->rate_sus = rt->sustained[one_pass];
    pt->floor_ms = flops / (pt->rate * 1e12) * 1e3;
    pt->ratio = pt->ms / pt->floor_ms;
    pt->floor_sus_ms = flops / (pt->rate_sus * 1e12) * 1e3;
    pt->ratio_sus = pt->ms / pt->floor_sus_ms;
    pt->peak = need;
    pt->one_pass = one_pass;
    return 0;
}

/* Host mask and spans of a masked run; fills q->n_active and, for packed-rl, q->act. */
static int point_mask(const bopts *o, const work *w, point *q, uint8_t *hm, int64_t *spans,
                      int64_t *n_spans) {
    if (strcmp(q->mask, "packed-rl")) {
        q->n_active = build_mask(hm, w->N, q->act, q->mask);
        *n_spans = build_spans(hm, w->N, o->gap, spans);
        return 0;
    }
    int rc = packed_rl_mask(o, w, hm, spans, n_spans, &q->n_active);
    if (rc) return rc;
    /* a floor of 0 would make the ratio infinite (and the JSON invalid) */
    if (!q->n_active)
        return sph_cli_fail("bench", 2,
                            "--N %" PRId64 ": the packed-rl batch has no response token; "
                            "expected a larger N",
                            w->N);
    q->act = (double)q->n_active / (double)w->N;
    return 0;
}

/* The leading cells of a table row: the point, then its layout under --matrix. */
static void print_where(const bopts *o, const work *w) {
    printf("| %s | %" PRId64 " | %" PRId64 " | %" PRId64 " |", w->sh.name, w->sh.H, w->sh.V,
           w->N);
    if (o->matrix) printf(" %" PRId64 " | %" PRId64 " | %" PRId64 " |", w->tp, w->cp, w->tokens);
}

static void emit(FILE *js, const bopts *o, const char *gpu, const char *date, const work *w,
                 const point *p) {
    const char *mode = p->one_pass ? "one-pass" : "general";
    print_where(o, w);
    printf(" %.4f | %s | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.1f | %s |\n", p->act,
           p->mask, mode, p->ms, p->floor_ms, p->ratio, p->floor_sus_ms, p->ratio_sus,
           p->peak / 1048576.0, p->path);
    fflush(stdout);
    if (!js) return;
    char tp[24] = "null", cp[24] = "null", tokens[24] = "null";
    if (w->tp) {
        snprintf(tp, sizeof tp, "%" PRId64, w->tp);
        snprintf(cp, sizeof cp, "%" PRId64, w->cp);
        snprintf(tokens, sizeof tokens, "%" PRId64, w->tokens);
    }
    fprintf(js,
            "{\"gpu\":\"%s\",\"date\":\"%s\",\"commit\":\"%s\",\"shape\":\"%s\",\"H\":%" PRId64
            ",\"V_local\":%" PRId64 ",\"N\":%" PRId64 ",\"tp\":%s,\"cp\":%s,\"tokens\":%s,"
            "\"active\":%.4f,\"mask\":\"%s\",\"mode\":\"%s\",\"impl\":\"spanhead\","
            "\"dtype\":\"%s\",\"span_gap\":%" PRId64 ",\"n_active\":%" PRId64 ",\"ms\":%.4f,"
            "\"floor_ms\":%.4f,\"ratio\":%.4f,\"floor_sustained_ms\":%.4f,"
            "\"ratio_sustained\":%.4f,\"rate_tflops\":%.6g,\"rate_sustained_tflops\":%.6g,"
            "\"peak_extra_bytes\":%zu,\"path\":\"%s\"}\n",
            gpu, date, o->commit, w->sh.name, w->sh.H, w->sh.V, w->N, tp, cp, tokens, p->act,
            p->mask, mode, o->dt_name, o->gap, p->n_active, p->ms, p->floor_ms, p->ratio,
            p->floor_sus_ms, p->ratio_sus, p->rate, p->rate_sus, p->peak, p->path);
    fflush(js);
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
        printf("| shape | H | V_loc | N |%s active | mask | mode |\n",
               o->matrix ? " tp | cp | tokens |" : "");
        printf("|---|---|---|---|%s---|---|---|\n", o->matrix ? "---|---|---|" : "");
    }
    int rc = 0;
    for (int wi = 0; wi < n_work && !rc; wi++) {
        const work *w = &ws[wi];
        uint8_t *hm = malloc((size_t)w->N);
        int64_t *spans = malloc((size_t)(w->N + 2) * 2 * sizeof(int64_t)), ns = 0;
        if (!hm || !spans)
            rc = sph_cli_fail("bench", 1, "out of host memory for N = %" PRId64, w->N);
        for (int ri = 0; ri < n_runs && !rc; ri++) {
            point q = {.mask = runs[ri].mask, .act = runs[ri].act, .one_pass = runs[ri].one_pass,
                       .n_active = w->N};
            if (!print && strcmp(q.mask, "packed-rl")) continue;
            if (strcmp(q.mask, "none") && (rc = point_mask(o, w, &q, hm, spans, &ns))) break;
            if (!print) continue;
            print_where(o, w);
            printf(" %.4f | %s | %s |\n", q.act, q.mask, q.one_pass ? "one-pass" : "general");
        }
        free(hm), free(spans);
    }
    return rc;
}

/* Comma-separated numbers in [lo, hi] into out (at most max); a K suffix multiplies by 1024
 * when k_suffix, integer asks for whole numbers. Returns the count, or -1 on a bad list. */
static int parse_list(const char *s, double *out, int max, int k_suffix, int integer, double lo,
                      double hi) {
    int n = 0;
    char buf[256];
    if (strlen(s) >= sizeof buf) return -1;
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *end;
        double v = strtod(tok, &end);
        if (k_suffix && (*end == 'K' || *end == 'k')) v *= 1024, end++;
        if (end == tok || *end || !(v >= lo && v <= hi) || (integer && v != floor(v)) ||
            n == max)
            return -1;
        out[n++] = v;
    }
    return n;
}

/* Token counts with an optional K suffix ("16K,64K"): 2^40 rows at most, far past any device,
 * still exact in double and safe in N * H. */
static int parse_list_i(const char *s, int64_t *out, int max) {
    double v[MAX_LIST];
    int n = parse_list(s, v, max < MAX_LIST ? max : MAX_LIST, 1, 1, 1, 0x1p40);
    for (int k = 0; k < n; k++) out[k] = (int64_t)v[k];
    return n;
}

/* Active fractions in (0, 1]. */
static int parse_list_d(const char *s, double *out, int max) {
    int n = parse_list(s, out, max, 0, 0, 0, 1);
    for (int k = 0; k < n; k++)
        if (out[k] <= 0) return -1;
    return n;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: spanhead bench [options]\n"
            "  --device cpu|cuda       (default cuda when a GPU is present, else cpu)\n"
            "  --dtype bf16|f16|f32    (default bf16 on cuda, f32 on cpu)\n"
            "  --shape A,B,C,D,E       model shapes per rank at TP4 (A 2048x62080, B 4096x37984,\n"
            "                          C 5120x37984, D 2048x151936; E 4096x128256, a whole\n"
            "                          128K vocabulary); default A,B (matrix: A-D)\n"
            "  --H N --V N             a custom shape instead\n"
            "  --N 16K,64K             tokens per rank (default 16K,64K)\n"
            "  --matrix seed           instead of the --shape x --N grid, the seed's matrix as\n"
            "                          per-rank work: each shape at TP4/CP2 with 16K..256K total\n"
            "                          tokens T (5 sizes), and at every (TP, CP), powers of two\n"
            "                          with TP*CP <= 8 (10 layouts), with T = 16K; N = T / CP,\n"
            "                          V_loc = 4 V / TP. 56 unique points (the seed says 58 but\n"
            "                          does not list them); JSON gains tp, cp, tokens (null on\n"
            "                          grid points)\n"
            "  --list                  print the runs (point, mask, active, mode), run nothing\n"
            "  --active 1,0.5,0.25     active fractions (default 1,0.5,0.25)\n"
            "  --mask response,fragmented,packed-rl  mask patterns (default response):\n"
            "                          response: the last active*2048 rows of each 2048-row\n"
            "                          sequence; fragmented: runs of 16 active rows, evenly\n"
            "                          spaced; packed-rl: a packed RL batch from the library's\n"
            "                          metadata: prompts log-normal (median 512, sigma 1,\n"
            "                          clipped to [32, 4096] tokens), responses log-normal\n"
            "                          (median 768, sigma 1, [16, 8192]), concatenated until\n"
            "                          the T tokens are full (the last one cut), padded to the\n"
            "                          TP/CP sequence alignment, loss on response tokens, CP\n"
            "                          rank 0's rows; --active does not apply: it runs once\n"
            "                          and reports its own fraction (n_active / N)\n"
            "  --seed N                packed-rl length draws (default 1; same seed, same batch)\n"
            "  --mode general|one-pass|both  (default both)\n"
            "  --repeats N --warmup N  (default 5 and 2)\n"
            "  --chunk-bytes N         workspace budget (default the context's: 1 GiB on CUDA)\n"
            "  --gap N                 coalesce active runs across gaps of <= N rows into one\n"
            "                          span (default 0: exact spans; the CUDA backend gathers\n"
            "                          rows across spans, so coalescing only adds work)\n"
            "  --json FILE             JSON lines, one object per point (appended)\n"
            "  --commit SHA            recorded in the JSON (default $SPH_COMMIT or unknown)\n"
            "Exit status: 0 ok, 1 runtime failure, 2 usage error.\n");
}

/* An integer option value in [lo, hi]; returns 0 or the usage exit code. */
static int opt_i64(const char *opt, const char *v, int64_t lo, int64_t hi, int64_t *out) {
    if (!sph_cli_parse_i64(v, lo, hi, out)) return 0;
    return sph_cli_fail("bench", 2, "%s %s: expected an integer in [%" PRId64 ", %" PRId64 "]",
                        opt, v, lo, hi);
}

int sph_cli_bench(int argc, char **argv) {
    static const char *const k_masks[] = {"response", "fragmented", "packed-rl"};
    bopts o;
    memset(&o, 0, sizeof o);
    o.dev = sph_cuda_device_count() > 0 ? SPH_DEVICE_CUDA : SPH_DEVICE_CPU;
    o.dt_name = NULL;
    o.Ns[0] = 16384, o.Ns[1] = 65536, o.n_N = 2;
    o.act[0] = 1, o.act[1] = 0.5, o.act[2] = 0.25, o.n_act = 3;
    o.masks[0] = "response", o.n_masks = 1;
    o.modes = 3, o.repeats = 5, o.warmup = 2, o.seed = 1;
    o.commit = getenv("SPH_COMMIT") ? getenv("SPH_COMMIT") : "unknown";
    const char *shapes = NULL;
    int64_t cH = 0, cV = 0, x = 0;
    int rc = 0, N_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--list")) {
            o.list = 1;
            continue;
        }
        if (!v) return sph_cli_fail("bench", 2, "%s needs a value (--help)", a);
        i++;
        if (!strcmp(a, "--device")) {
            if (!strcmp(v, "cuda")) o.dev = SPH_DEVICE_CUDA;
            else if (!strcmp(v, "cpu")) o.dev = SPH_DEVICE_CPU;
            else return sph_cli_fail("bench", 2, "--device %s: expected cpu or cuda", v);
        } else if (!strcmp(a, "--dtype")) {
            o.dt_name = v;
        } else if (!strcmp(a, "--shape")) {
            shapes = v;
        } else if (!strcmp(a, "--H")) {
            if ((rc = opt_i64(a, v, 1, INT32_MAX, &cH))) return rc;
        } else if (!strcmp(a, "--V")) {
            if ((rc = opt_i64(a, v, 1, INT32_MAX, &cV))) return rc;
        } else if (!strcmp(a, "--N")) {
            if ((o.n_N = parse_list_i(v, o.Ns, MAX_LIST)) <= 0)
                return sph_cli_fail("bench", 2,
                                    "--N %s: expected up to %d token counts like 16K,64K", v,
                                    MAX_LIST);
            N_given = 1;
        } else if (!strcmp(a, "--matrix")) {
            if (strcmp(v, "seed")) return sph_cli_fail("bench", 2, "--matrix %s: expected seed", v);
            o.matrix = 1;
        } else if (!strcmp(a, "--active")) {
            if ((o.n_act = parse_list_d(v, o.act, MAX_LIST)) <= 0)
                return sph_cli_fail("bench", 2,
                                    "--active %s: expected up to %d fractions in (0, 1]", v,
                                    MAX_LIST);
        } else if (!strcmp(a, "--mask")) {
            char buf[128];
            if (strlen(v) >= sizeof buf)
                return sph_cli_fail("bench", 2, "--mask %s: too long", v);
            snprintf(buf, sizeof buf, "%s", v);
            o.n_masks = 0;
            for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
                const char *m = NULL;
                for (size_t k = 0; k < sizeof k_masks / sizeof k_masks[0]; k++)
                    if (!strcmp(t, k_masks[k])) m = k_masks[k];
                if (!m)
                    return sph_cli_fail("bench", 2,
                                        "--mask %s: expected response, fragmented or packed-rl",
                                        t);
                for (int k = 0; k < o.n_masks; k++)
                    if (o.masks[k] == m)
                        return sph_cli_fail("bench", 2, "--mask %s: %s given twice", v, m);
                o.masks[o.n_masks++] = m;
            }
            if (!o.n_masks)
                return sph_cli_fail("bench", 2, "--mask %s: expected a mask pattern", v);
        } else if (!strcmp(a, "--mode")) {
            o.modes = !strcmp(v, "general")    ? 1
                      : !strcmp(v, "one-pass") ? 2
                      : !strcmp(v, "both")     ? 3
                                               : 0;
            if (!o.modes)
                return sph_cli_fail("bench", 2, "--mode %s: expected general, one-pass or both",
                                    v);
        } else if (!strcmp(a, "--repeats")) {
            if ((rc = opt_i64(a, v, 1, 1000, &x))) return rc;
            o.repeats = (int)x;
        } else if (!strcmp(a, "--warmup")) {
            if ((rc = opt_i64(a, v, 0, 1000, &x))) return rc;
            o.warmup = (int)x;
        } else if (!strcmp(a, "--chunk-bytes")) {
            if ((rc = opt_i64(a, v, 0, INT64_MAX, &o.chunk_bytes))) return rc;
        } else if (!strcmp(a, "--gap")) {
            if ((rc = opt_i64(a, v, 0, INT64_MAX, &o.gap))) return rc;
        } else if (!strcmp(a, "--seed")) {
            if ((rc = opt_i64(a, v, 0, INT64_MAX, &o.seed))) return rc;
        } else if (!strcmp(a, "--json")) {
            o.json = v;
        } else if (!strcmp(a, "--commit")) {
            o.commit = v;
        } else {
            return sph_cli_fail("bench", 2, "unknown option %s (--help)", a);
        }
    }
    if (!o.dt_name) o.dt_name = o.dev == SPH_DEVICE_CUDA ? "bf16" : "f32";
    if (!strcmp(o.dt_name, "bf16")) o.dt = SPH_BF16;
    else if (!strcmp(o.dt_name, "f16")) o.dt = SPH_F16;
    else if (!strcmp(o.dt_name, "f32")) o.dt = SPH_F32;
    else return sph_cli_fail("bench", 2, "--dtype %s: expected bf16, f16 or f32", o.dt_name);
    if (o.matrix && (cH || cV || N_given))
        return sph_cli_fail("bench", 2,
                            "--matrix seed sets the shapes' V and N itself: it takes --shape, "
                            "not --H, --V or --N");
    if (cH || cV) {
        if (!cH || !cV) return sph_cli_fail("bench", 2, "--H and --V go together");
        if (shapes) return sph_cli_fail("bench", 2, "--shape %s: not with --H/--V", shapes);
        o.shapes[0] = (shape){"custom", cH, cV};
        o.n_shapes = 1;
    } else {
        char buf[64];
        if (!shapes) shapes = o.matrix ? "A,B,C,D" : "A,B";
        if (strlen(shapes) >= sizeof buf)
            return sph_cli_fail("bench", 2, "--shape %s: too long", shapes);
        snprintf(buf, sizeof buf, "%s", shapes);
        for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
            int found = 0;
            for (size_t k = 0; k < sizeof k_shapes / sizeof k_shapes[0]; k++)
                if (!strcmp(t, k_shapes[k].name)) found = 1 + (int)k;
            if (!found) return sph_cli_fail("bench", 2, "--shape %s: expected A, B, C, D or E", t);
            for (int k = 0; k < o.n_shapes; k++)
                if (!strcmp(o.shapes[k].name, t))
                    return sph_cli_fail("bench", 2, "--shape %s: %s given twice", shapes, t);
            o.shapes[o.n_shapes++] = k_shapes[found - 1];
        }
        if (!o.n_shapes)
            return sph_cli_fail("bench", 2, "--shape %s: expected A, B, C, D or E", shapes);
    }

    work ws[MAX_WORK];
    run_spec runs[MAX_RUNS];
    const int n_work = o.matrix ? seed_matrix(&o, ws) : grid(&o, ws);
    const int n_runs = plan_runs(&o, runs);
    if ((rc = walk_points(&o, ws, n_work, runs, n_runs, 0))) return rc;
    if (o.list) return walk_points(&o, ws, n_work, runs, n_runs, 1);

    sph_ctx_opts co = SPH_CTX_OPTS_INIT;
    co.device.type = o.dev;
    co.chunk_bytes = o.chunk_bytes;
    /* the SPH_CUDA_* A/B switches the scripts under scripts/device set */
    if (sph_ctx_opts_apply_env(&co) != SPH_OK)
        return sph_cli_fail("bench", 2, "%s", sph_last_error());
    sph_ctx_t ctx;
    if (sph_ctx_create(&ctx, &co) != SPH_OK)
        return sph_cli_fail("bench", 1, "context: %s", sph_last_error());
    FILE *js = NULL;
    if (o.json && !(js = fopen(o.json, "a"))) {
        sph_ctx_destroy(ctx);
        return sph_cli_fail("bench", 1, "--json %s: cannot open for appending", o.json);
    }
    char gpu[128], date[32];
    snprintf(gpu, sizeof gpu, "%s", sph_ctx_describe(ctx));
    time_t tt = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&tt));
    printf("# spanhead bench: %s, %s, dtype %s, commit %s, %s\n", gpu, date, o.dt_name,
           o.commit, sph_version());
    if (o.matrix) printf("# matrix seed: %d unique points\n", n_work);
    printf("\n| shape | H | V_loc | N |%s active | mask | mode | ms | floor ms | ratio | "
           "sustained floor ms | sustained ratio | extra MiB | path |\n"
           "|---|---|---|---|%s---|---|---|---|---|---|---|---|---|---|\n",
           o.matrix ? " tp | cp | tokens |" : "", o.matrix ? "---|---|---|" : "");
    for (int wi = 0; wi < n_work && !rc; wi++) {
        const work *w = &ws[wi];
        const shape *sh = &w->sh;
        const int64_t N = w->N;
        rates rt;
        if ((rc = gemm_rates(ctx, &o, N, sh->V, sh->H, &rt))) break;
        print_where(&o, w);
        printf(" dense GEMM rate, TFLOP/s: burst %.2f, sustained", rt.burst);
        for (int op = 0; op < 2; op++)
            if (o.modes & (1 << op))
                printf("%s %.2f (chain %d, %s)", o.modes == 3 && op ? "," : "",
                       rt.sustained[op], k_chain[op], op ? "one-pass" : "general");
        printf(" | | | | | | | | |\n");
        dev_bufs b;
        memset(&b, 0, sizeof b);
        void *hh = rand_buf(N * sh->H, o.dt, 1.f), *hw = rand_buf(sh->V * sh->H, o.dt, 0.05f);
        int32_t *ht = malloc((size_t)N * 4);
        float *hg = malloc((size_t)N * 4);
        uint8_t *hm = malloc((size_t)N);
        int64_t *spans = malloc((size_t)(N + 2) * 2 * sizeof(int64_t));
        if (!hh || !hw || !ht || !hg || !hm || !spans) {
            rc = sph_cli_fail("bench", 1, "out of host memory for N = %" PRId64, N);
        } else {
            for (int64_t i = 0; i < N; i++) ht[i] = (int32_t)(rnd() % (uint64_t)sh->V);
            for (int64_t i = 0; i < N; i++) hg[i] = rnd_f();
            size_t es = o.dt.bits / 8;
            if (upload(ctx, &b.h, hh, (size_t)(N * sh->H) * es) ||
                upload(ctx, &b.w, hw, (size_t)(sh->V * sh->H) * es) ||
                upload(ctx, &b.tgt, ht, (size_t)N * 4) || upload(ctx, &b.g, hg, (size_t)N * 4) ||
                upload(ctx, &b.e, hg, (size_t)N * 4) || upload(ctx, &b.mask, NULL, (size_t)N) ||
                upload(ctx, &b.lp, NULL, (size_t)N * 4) ||
                upload(ctx, &b.ent, NULL, (size_t)N * 4) ||
                upload(ctx, &b.st, NULL, (size_t)N * 12) ||
                upload(ctx, &b.dh, NULL, (size_t)(N * sh->H) * es) ||
                upload(ctx, &b.dw, NULL, (size_t)(sh->V * sh->H) * es))
                rc = sph_cli_fail("bench", 1, "device buffers: %s", sph_last_error());
        }
        free(hh), free(hw), free(ht), free(hg);
        for (int ri = 0; ri < n_runs && !rc; ri++) {
            point q = {.mask = runs[ri].mask, .act = runs[ri].act, .one_pass = runs[ri].one_pass,
                       .n_active = N};
            int64_t ns = 0;
            const int masked = strcmp(q.mask, "none") != 0;
            if (masked) {
                if ((rc = point_mask(&o, w, &q, hm, spans, &ns))) break;
                if (sph_ctx_memcpy(ctx, b.mask, hm, (size_t)N) != SPH_OK) {
                    rc = sph_cli_fail("bench", 1, "mask: %s", sph_last_error());
                    break;
                }
            }
            rc = time_point(ctx, &o, sh, N, &b, spans, ns, masked, q.one_pass, &rt, &q);
            if (!rc) emit(js, &o, gpu, date, w, &q);
        }
        free(hm), free(spans);
        bufs_free(ctx, &b);
    }
    if (js) fclose(js);
    sph_ctx_destroy(ctx);
    return rc;
}
