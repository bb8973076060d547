/*
 * test_head_cpu.c - one CPU kernel set (argv[1]: ref, generic, avx2 or avx512; ctest runs one
 * entry per set, and a set this CPU lacks exits 77, a visible skip) against the float64
 * reference and an independent float64 entropy (-sum p log p), on fresh random inputs.
 *
 * The grid crosses every dimension independently: input x gradient dtype (f32/f32, bf16/f32,
 * bf16/bf16, f16/f32, f16/f16) x mask kind (7) x accumulate x one-pass x softcap x
 * temperature = 560 configurations; the shape (7 awkward ones: N = 1, V_loc = 1, V_loc not a
 * multiple of the 256-column tile, several row chunks, shards of a larger vocabulary, rows
 * padded in hidden, weight and both gradients with the gaps checked untouched) and the
 * outputs + upstream gradients wanted (5 sets: each output alone, each upstream alone, all)
 * are assigned by a seed-offset rotation that meets every value of every other dimension
 * (asserted). Sample support runs the same 560-configuration cross on its own shapes. Every
 * output is poisoned: requested outputs must hold the reference's values (exact zeros on
 * inactive rows), outputs not requested, inputs, the forward's outputs during the backward and
 * the gradients during a two-pass forward must stay bitwise untouched. Then TP through the
 * in-process communicator (test_head_case.h), dense vs masked, determinism, N = 0. The number
 * of configurations checked is asserted; the worst error / budget ratio per output is printed.
 */
#include "test_head_case.h"

static const char *g_kernel; /* the kernel set under test */

typedef struct shape {
    int64_t N, H, V_loc, V, v0, K, chunk;
    int64_t pad; /* > 0: hidden, weight, dhidden, dweight rows padded by pad elements */
} shape;

/* full vocabulary: tiles are 256 columns; 257 = 256 + 1, 513 = 2 x 256 + 1, 777 = 3 x 256 + 9,
 * 1000 = 3 x 256 + 232; chunk = rows per chunk (0 = automatic, one chunk here) */
static const shape SHAPES[] = {
    {1, 5, 1, 1, 0, 0, 0, 0},        {7, 33, 257, 257, 0, 0, 0, 0},
    {37, 65, 513, 513, 0, 0, 8, 3},  {19, 17, 1, 5, 2, 0, 4, 0},
    {50, 31, 777, 800, 5, 0, 16, 0}, {64, 24, 300, 300, 0, 0, 32, 5},
    {23, 48, 1000, 1500, 300, 0, 0, 0},
};
/* sample support: K candidates per row (some padding), a shard of a larger vocabulary where
 * rows have candidates outside the shard or none inside */
static const shape SUPPORT_SHAPES[] = {
    {1, 7, 50, 50, 0, 17, 0, 0},    {23, 40, 301, 301, 0, 5, 0, 2}, {64, 65, 129, 129, 0, 17, 0, 0},
    {9, 16, 40, 100, 10, 5, 0, 0},  {33, 24, 257, 257, 0, 9, 0, 0}, {5, 3, 7, 7, 0, 4, 0, 1},
    {40, 48, 600, 600, 0, 33, 0, 0},
};
#define N_SHAPES 7

/* input / gradient dtypes */
static const sph_dtype DT_IN[5] = {{2, 32, 1}, {4, 16, 1}, {4, 16, 1}, {2, 16, 1}, {2, 16, 1}};
static const sph_dtype DT_GRAD[5] = {{2, 32, 1}, {2, 32, 1}, {4, 16, 1}, {2, 32, 1}, {2, 16, 1}};
#define N_DTG 5

/* mask kinds */
enum { MK_NONE, MK_MASK_SUPERSPANS, MK_SPANS, MK_ONE, MK_NONE_ACTIVE, MK_CHUNK_EDGES, MK_MASK };
#define N_MASKS 7
static const char *MASK_NAME[N_MASKS] = {"none",       "mask+gap-spans", "spans", "one",
                                         "none-active", "chunk-edges",   "mask"};

/* outputs + upstream gradients wanted */
#define N_WANTED 5
static const unsigned WANT_OUT[N_WANTED] = {HC_LP, HC_ENT, HC_LSE, HC_LM, HC_OUTS};
static const unsigned WANT_UP[N_WANTED] = {HC_GL, HC_G, HC_GM, HC_E, HC_UPS};
static const unsigned SWANT_OUT[N_WANTED] = {HC_LP, HC_ENT, HC_LSE, HC_LP | HC_ENT,
                                             HC_LP | HC_ENT | HC_LSE};
static const unsigned SWANT_UP[N_WANTED] = {HC_GL, HC_G, HC_E, HC_G | HC_E, HC_G | HC_E | HC_GL};

typedef struct pcase {
    int support, shape, dtg, mask, acc, one_pass, cap, temp, wanted;
    uint64_t draw; /* the seed offsets that placed shape and wanted (recorded) */
} pcase;

#define N_CONFIGS (N_DTG * N_MASKS * 16)

static void case_str(const pcase *p, char *s, size_t n) {
    const shape *S = p->support ? &SUPPORT_SHAPES[p->shape] : &SHAPES[p->shape];
    snprintf(s, n,
             "head_cpu(kernel=%s,%s,shape=%d:N=%lld,H=%lld,V_loc=%lld,V=%lld,v0=%lld,K=%lld,"
             "chunk=%lld,pad=%lld,dtype=%s,grads=%s,mask=%s,acc=%d,one_pass=%d,cap=%g,T=%g,"
             "outs=%u,ups=%u,draw=%llu)",
             g_kernel ? g_kernel : "best", p->support ? "support" : "full", p->shape,
             (long long)S->N, (long long)S->H, (long long)S->V_loc, (long long)S->V,
             (long long)S->v0, (long long)S->K, (long long)S->chunk, (long long)S->pad,
             sph_dtype_name(DT_IN[p->dtg]), sph_dtype_name(DT_GRAD[p->dtg]),
             MASK_NAME[p->mask], p->acc, p->one_pass, p->cap ? 3.0 : 0.0, p->temp ? 0.7 : 1.0,
             (p->support ? SWANT_OUT : WANT_OUT)[p->wanted],
             (p->support ? SWANT_UP : WANT_UP)[p->wanted], (unsigned long long)p->draw);
}

static void set_mask(hcase *h, sph_rng *r, int kind, int64_t chunk) {
    if (kind == MK_NONE) return;
    hc_mask_ragged(h, r, 0.45);
    if (kind == MK_MASK_SUPERSPANS) hc_spans_of_mask(h, 3); /* spans also hold gap rows */
    if (kind == MK_ONE || kind == MK_NONE_ACTIVE || kind == MK_CHUNK_EDGES) {
        memset(h->mask, 0, (size_t)h->N);
        if (kind == MK_ONE) h->mask[rng_range(r, 0, h->N - 1)] = 1;
        if (kind == MK_CHUNK_EDGES) /* the first and last active row of every chunk */
            for (int64_t i = 0; i < h->N; i++)
                h->mask[i] = (i % 3 == 0) || (i % (chunk + 1) == chunk);
        hc_spans_of_mask(h, 0);
    }
}

static unsigned mask_wiring(int kind) {
    if (kind == MK_NONE) return 0;
    if (kind == MK_SPANS) return HC_SPANS;
    if (kind == MK_MASK) return HC_MASK;
    return HC_MASK | HC_SPANS;
}

typedef struct bufs { /* copies for the untouched checks */
    void *h, *w, *tgt, *cand, *mask, *spans, *g, *e, *gl, *gm;
} bufs;

static void bufs_take(const hcase *c, bufs *b) {
    size_t es = hc_esize(c->dt), N = (size_t)c->N;
    b->h = hc_dup(c->h, N * (size_t)c->H * es);
    b->w = hc_dup(c->w, (size_t)(c->V_loc * c->H) * es);
    b->tgt = hc_dup(c->tgt, N * 8);
    b->cand = c->cand ? hc_dup(c->cand, N * (size_t)c->K * 8) : NULL;
    b->mask = c->mask ? hc_dup(c->mask, N) : NULL;
    b->spans = c->spans ? hc_dup(c->spans, (size_t)c->n_spans * 16) : NULL;
    b->g = hc_dup(c->g, N * 4), b->e = hc_dup(c->e, N * 4);
    b->gl = hc_dup(c->gl, N * 4), b->gm = hc_dup(c->gm, N * 4);
}

static int bufs_same(const hcase *c, const bufs *b, const char *cs) {
    size_t es = hc_esize(c->dt), N = (size_t)c->N;
    int ok = hc_untouched("input hidden", cs, c->h, b->h, N * (size_t)c->H * es);
    ok &= hc_untouched("input weight", cs, c->w, b->w, (size_t)(c->V_loc * c->H) * es);
    ok &= hc_untouched("input targets", cs, c->tgt, b->tgt, N * 8);
    if (c->cand) ok &= hc_untouched("input candidates", cs, c->cand, b->cand, N * (size_t)c->K * 8);
    if (c->mask) ok &= hc_untouched("input mask", cs, c->mask, b->mask, N);
    if (c->spans) ok &= hc_untouched("input spans", cs, c->spans, b->spans, (size_t)c->n_spans * 16);
    ok &= hc_untouched("input dlogprob", cs, c->g, b->g, N * 4);
    ok &= hc_untouched("input dentropy", cs, c->e, b->e, N * 4);
    ok &= hc_untouched("input dlse", cs, c->gl, b->gl, N * 4);
    ok &= hc_untouched("input dlogit_mean", cs, c->gm, b->gm, N * 4);
    return ok;
}

static void bufs_free(bufs *b) {
    free(b->h), free(b->w), free(b->tgt), free(b->cand), free(b->mask), free(b->spans);
    free(b->g), free(b->e), free(b->gl), free(b->gm);
}

/* Padded rows: the kernel sees hidden, weight, dhidden and dweight with row stride H + pad
 * (copies of the case's compact data, the gaps filled with 0xff bytes: NaN if read); after
 * the run the gradients come back into the compact buffers and every gap must still hold
 * the 0xff bytes (dhidden, dweight) or be unchanged (hidden, weight). */
typedef struct padded {
    int64_t pad, ld;
    void *h, *w, *dh, *dw;
    int64_t st_h[2], st_w[2], st_dh[2], st_dw[2];
} padded;

static void *pad_copy(const void *src, int64_t rows, int64_t H, int64_t ld, size_t es) {
    char *d = hc_alloc((size_t)(rows * ld) * es);
    memset(d, 0xff, (size_t)(rows * ld) * es);
    for (int64_t i = 0; i < rows; i++)
        memcpy(d + (size_t)(i * ld) * es, (const char *)src + (size_t)(i * H) * es, (size_t)H * es);
    return d;
}

static void pad_unpack(void *dst, const void *src, int64_t rows, int64_t H, int64_t ld, size_t es) {
    for (int64_t i = 0; i < rows; i++)
        memcpy((char *)dst + (size_t)(i * H) * es, (const char *)src + (size_t)(i * ld) * es,
               (size_t)H * es);
}

static int pad_gaps_ff(const char *what, const char *cs, const void *buf, int64_t rows,
                       int64_t H, int64_t ld, size_t es) {
    for (int64_t i = 0; i < rows; i++)
        for (size_t b = (size_t)H * es; b < (size_t)ld * es; b++)
            if (((const unsigned char *)buf)[(size_t)(i * ld) * es + b] != 0xff) {
                fprintf(stderr, "FAIL %s %s: row %lld's padding written\n", what, cs,
                        (long long)i);
                return 0;
            }
    return 1;
}

static void pad_make(const hcase *c, int64_t pad, padded *P) {
    memset(P, 0, sizeof *P);
    P->pad = pad, P->ld = c->H + pad;
    if (!pad) return;
    size_t es = hc_esize(c->dt), gs = hc_esize(c->gdt);
    P->h = pad_copy(c->h, c->N, c->H, P->ld, es);
    P->w = pad_copy(c->w, c->V_loc, c->H, P->ld, es);
    P->dh = pad_copy(c->dh, c->N, c->H, P->ld, gs); /* the start values (or poison) */
    P->dw = pad_copy(c->dw, c->V_loc, c->H, P->ld, gs);
}

/* After hc_wire: hidden, weight, dhidden, dweight point at the padded copies. */
static void pad_wire(hcase *c, padded *P) {
    if (!P->pad) return;
    P->st_h[0] = P->st_w[0] = P->st_dh[0] = P->st_dw[0] = P->ld;
    P->st_h[1] = P->st_w[1] = P->st_dh[1] = P->st_dw[1] = 1;
    c->th.data = P->h, c->th.strides = P->st_h;
    c->tw.data = P->w, c->tw.strides = P->st_w;
    c->tdh.data = P->dh, c->tdh.strides = P->st_dh;
    c->tdw.data = P->dw, c->tdw.strides = P->st_dw;
}

/* The gradients back into c's compact buffers; the gaps checked. */
static int pad_finish(hcase *c, padded *P, const char *cs) {
    if (!P->pad) return 1;
    size_t es = hc_esize(c->dt), gs = hc_esize(c->gdt);
    pad_unpack(c->dh, P->dh, c->N, c->H, P->ld, gs);
    pad_unpack(c->dw, P->dw, c->V_loc, c->H, P->ld, gs);
    int ok = pad_gaps_ff("dhidden", cs, P->dh, c->N, c->H, P->ld, gs);
    ok &= pad_gaps_ff("dweight", cs, P->dw, c->V_loc, c->H, P->ld, gs);
    ok &= pad_gaps_ff("hidden", cs, P->h, c->N, c->H, P->ld, es);
    ok &= pad_gaps_ff("weight", cs, P->w, c->V_loc, c->H, P->ld, es);
    void *hh = hc_alloc((size_t)(c->N * c->H) * es), *ww = hc_alloc((size_t)(c->V_loc * c->H) * es);
    pad_unpack(hh, P->h, c->N, c->H, P->ld, es);
    pad_unpack(ww, P->w, c->V_loc, c->H, P->ld, es);
    ok &= hc_untouched("input hidden (padded rows)", cs, hh, c->h, (size_t)(c->N * c->H) * es);
    ok &= hc_untouched("input weight (padded rows)", cs, ww, c->w, (size_t)(c->V_loc * c->H) * es);
    free(hh), free(ww);
    free(P->h), free(P->w), free(P->dh), free(P->dw);
    return ok;
}

static int g_configs[2];  /* configurations checked: full, support */
static int64_t g_active_cases[2]; /* of them with active rows */
static int g_cover[2][8][8][N_SHAPES], g_cover_w[2][8][8][N_WANTED];

/* One configuration: the expected results, then the kernel set under test. Returns 1 if it
 * passes (every failure is printed with the case string and the seed). */
static int check_case(sph_rng *r, const pcase *p) {
    const shape *S = p->support ? &SUPPORT_SHAPES[p->shape] : &SHAPES[p->shape];
    const sph_dtype dt = DT_IN[p->dtg], gdt = DT_GRAD[p->dtg];
    const double T = p->temp ? 0.7 : 1.0, cap = p->cap ? 3.0 : 0.0;
    const unsigned outs = (p->support ? SWANT_OUT : WANT_OUT)[p->wanted];
    const unsigned ups = (p->support ? SWANT_UP : WANT_UP)[p->wanted];
    const unsigned m = mask_wiring(p->mask);
    char cs[512];
    case_str(p, cs, sizeof cs);
    hcase h;
    hc_init(&h, r, S->N, S->H, S->V_loc, S->V, S->v0, S->K, dt);
    h.gdt = gdt;
    if (!S->K && (S->v0 > 0 || S->V > S->V_loc)) /* sharded without a comm: targets inside */
        for (int64_t i = 0; i < S->N; i++)
            if (h.tgt[i] >= 0) h.tgt[i] = S->v0 + rng_range(r, 0, S->V_loc - 1);
    hc_edge_targets(&h);
    set_mask(&h, r, p->mask, S->chunk ? S->chunk : 512);
    const int64_t N = S->N, H = S->H, VL = S->V_loc;
    const size_t gb = sph_dtype_size(gdt), nh = (size_t)(N * H), nw = (size_t)(VL * H);
    void *dh0 = hc_alloc(nh * gb), *dw0 = hc_alloc(nw * gb);
    for (size_t k = 0; k < nh; k++) hc_set(dh0, gdt, (int64_t)k, rng_normal(r));
    for (size_t k = 0; k < nw; k++) hc_set(dw0, gdt, (int64_t)k, rng_normal(r));

    /* expected: every output and the case's upstreams, through the reference's float64 cores */
    hc_wire(&h, HC_OUTS | ups | HC_DH | HC_DW | m);
    h.a.temperature = T, h.a.softcap = cap;
    sph_ctx_t rc = hc_ctx("ref", 1, NULL);
    hexp x;
    hc_expect(rc, &h.a, &x);
    sph_ctx_destroy(rc);
    double *ind = hc_alloc((size_t)N * HC_IND * 8 + 8);
    hc_indep_forward(&h, T, cap, x.active, ind);
    int expect_active = p->mask != MK_NONE_ACTIVE;
    int ok = 1;
    if ((x.n_active > 0) != expect_active) {
        fprintf(stderr, "FAIL %s: %lld active rows\n", cs, (long long)x.n_active);
        ok = 0;
    }

    /* the run: outputs poisoned, gradients poisoned (overwrite) or the start (accumulate) */
    bufs in;
    bufs_take(&h, &in);
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.force_kernel = g_kernel;
    o.num_threads = 2;
    o.chunk_rows = S->chunk;
    sph_ctx_t ctx = NULL;
    expect_ok(sph_ctx_create(&ctx, &o));
    hc_poison(&h);
    if (p->acc) memcpy(h.dh, dh0, nh * gb), memcpy(h.dw, dw0, nw * gb);
    void *dh_before = hc_dup(h.dh, nh * gb), *dw_before = hc_dup(h.dw, nw * gb);
    float *poisoned = hc_alloc((size_t)N * 4 + 4);
    poison_f32(poisoned, (size_t)N);
    padded P;
    pad_make(&h, S->pad, &P);
    hc_wire(&h, outs | m | (p->one_pass ? ups | HC_DH | HC_DW : 0));
    pad_wire(&h, &P);
    h.a.temperature = T, h.a.softcap = cap;
    h.a.accumulate_dhidden = h.a.accumulate_dweight = p->acc;
    sph_status st = hc_run(ctx, SPH_HEAD_FORWARD, &h.a);
    if (st != SPH_OK) {
        fprintf(stderr, "FAIL %s: forward: %s\n", cs, sph_last_error());
        ok = 0;
    }
    if (!p->one_pass && st == SPH_OK) {
        if (P.pad) { /* compare the logical elements: the gaps are checked at the end */
            pad_unpack(h.dh, P.dh, N, H, P.ld, gb);
            pad_unpack(h.dw, P.dw, VL, H, P.ld, gb);
        }
        ok &= hc_untouched("dhidden during the forward", cs, h.dh, dh_before, nh * gb);
        ok &= hc_untouched("dweight during the forward", cs, h.dw, dw_before, nw * gb);
        float *keep[5] = {hc_dup(h.lp, (size_t)N * 4), hc_dup(h.ent, (size_t)N * 4),
                          hc_dup(h.lse, (size_t)N * 4), hc_dup(h.lm, (size_t)N * 4),
                          hc_dup(h.stats, (size_t)N * 12)};
        hc_wire(&h, ups | HC_DH | HC_DW | m);
        pad_wire(&h, &P);
        h.a.temperature = T, h.a.softcap = cap;
        h.a.accumulate_dhidden = h.a.accumulate_dweight = p->acc;
        st = hc_run(ctx, SPH_HEAD_BACKWARD, &h.a);
        if (st != SPH_OK) {
            fprintf(stderr, "FAIL %s: backward: %s\n", cs, sph_last_error());
            ok = 0;
        }
        const float *now[5] = {h.lp, h.ent, h.lse, h.lm, h.stats};
        for (int k = 0; k < 5; k++) {
            ok &= hc_untouched("forward outputs during the backward", cs, now[k], keep[k],
                               (size_t)N * (k == 4 ? 12 : 4));
            free(keep[k]);
        }
    }
    sph_ctx_destroy(ctx);
    ok &= pad_finish(&h, &P, cs);
    ok &= bufs_same(&h, &in, cs);

    /* per-row outputs: requested ones hold the reference's values, the others the poison */
    const float *got[4] = {h.lp, h.ent, h.lse, h.lm};
    const char *names[4] = {"logprob", "entropy", "lse", "logit_mean"};
    const unsigned bit[4] = {HC_LP, HC_ENT, HC_LSE, HC_LM};
    for (int f = 0; f < 4; f++) {
        if (!(outs & bit[f]) || (f == 3 && S->K)) {
            ok &= hc_untouched(names[f], cs, got[f], poisoned, (size_t)N * 4);
            continue;
        }
        ok &= hc_close_col(names[f], cs, got[f], 1, x.rows, 7, f, N, TOL_CPU_F32);
        if (f == 1) ok &= hc_close_col("entropy -sum p log p", cs, got[f], 1, ind, HC_IND, 1, N,
                                       TOL_CPU_F32);
        for (int64_t i = 0; i < N; i++)
            if (!x.active[i] && got[f][i] != 0.0f) {
                fprintf(stderr, "FAIL %s: %s[%lld] of an inactive row is %g\n", cs, names[f],
                        (long long)i, got[f][i]);
                ok = 0;
                break;
            }
    }
    for (int s = 0; s < 3; s++)
        ok &= hc_close_col(s == 0 ? "stats.m" : s == 1 ? "stats.lse" : "stats.mu", cs,
                           h.stats + s, 3, x.rows, 7, 4 + s, N, TOL_CPU_F32);
    for (int64_t i = 0; i < N; i++)
        if (!x.active[i] && (h.stats[3 * i] != 0 || h.stats[3 * i + 1] != 0 ||
                             h.stats[3 * i + 2] != 0)) {
            fprintf(stderr, "FAIL %s: stats of inactive row %lld not zero\n", cs, (long long)i);
            ok = 0;
            break;
        }

    /* gradients: start (accumulate) + the reference's gradient of the active rows */
    double *exp_h = hc_alloc(nh * 8 + 8), *exp_w = hc_alloc(nw * 8 + 8);
    for (size_t k = 0; k < nh; k++) exp_h[k] = (p->acc ? hc_get(dh0, gdt, (int64_t)k) : 0) + x.dh[k];
    for (size_t k = 0; k < nw; k++) exp_w[k] = (p->acc ? hc_get(dw0, gdt, (int64_t)k) : 0) + x.dw[k];
    ok &= hc_check_grad("dhidden", cs, h.dh, gdt, exp_h, x.dh, NULL, NULL, (int64_t)nh,
                        TOL_CPU_F32, 0, 0, 0, 1);
    ok &= hc_check_grad("dweight", cs, h.dw, gdt, exp_w, x.dw, NULL, NULL, (int64_t)nw,
                        TOL_CPU_F32, 0, 0, 0, 1);
    /* rows outside the mask: exact zeros, or bitwise the start when accumulating */
    for (int64_t i = 0; i < N; i++) {
        if (x.active[i]) continue;
        const char *row = (const char *)h.dh + (size_t)(i * H) * gb;
        const char *row0 = (const char *)dh0 + (size_t)(i * H) * gb;
        int fine = 1;
        if (p->acc) fine = !memcmp(row, row0, (size_t)H * gb);
        else
            for (int64_t k = 0; k < H; k++) fine &= hc_get(h.dh, gdt, i * H + k) == 0.0;
        if (!fine) {
            fprintf(stderr, "FAIL %s: dhidden row %lld (inactive) is not %s\n", cs, (long long)i,
                    p->acc ? "bitwise its start" : "exact zeros");
            ok = 0;
            break;
        }
    }
    /* no active row: dweight is exactly its start (or zeros) */
    if (x.n_active == 0) {
        int fine = 1;
        if (p->acc) fine = !memcmp(h.dw, dw0, nw * gb);
        else
            for (size_t k = 0; k < nw; k++) fine &= hc_get(h.dw, gdt, (int64_t)k) == 0.0;
        if (!fine) {
            fprintf(stderr, "FAIL %s: dweight with no active row is not %s\n", cs,
                    p->acc ? "bitwise its start" : "exact zeros");
            ok = 0;
        }
    }
    g_configs[p->support]++;
    g_active_cases[p->support] += x.n_active > 0;
    free(exp_h), free(exp_w), free(dh0), free(dw0), free(dh_before), free(dw_before);
    free(poisoned), free(ind);
    bufs_free(&in);
    hc_expect_free(&x);
    hc_free(&h);
    return ok;
}

/* The whole cross of one mode. shape and wanted rotate with seed offsets so that, whatever
 * the seed, each meets every value of every other dimension (asserted below). */
static void run_grid(int support, uint64_t seed) {
    sph_rng r;
    rng_seed(&r, seed);
    const uint64_t off_s = rng_u64(&r) % N_SHAPES, off_w = rng_u64(&r) % N_WANTED;
    int idx = 0, failed = 0;
    for (int dtg = 0; dtg < N_DTG; dtg++)
        for (int mk = 0; mk < N_MASKS; mk++)
            for (int b = 0; b < 16; b++, idx++) {
                pcase p = {0};
                p.support = support, p.dtg = dtg, p.mask = mk;
                p.acc = b >> 3 & 1, p.one_pass = b >> 2 & 1, p.cap = b >> 1 & 1, p.temp = b & 1;
                p.shape = (int)((idx + off_s) % N_SHAPES);
                p.wanted = (int)((dtg + mk + p.acc + p.one_pass + p.cap + p.temp + off_w) %
                                 N_WANTED);
                p.draw = off_s * 10 + off_w;
                const int dims[6] = {dtg, mk, p.acc, p.one_pass, p.cap, p.temp};
                for (int d = 0; d < 6; d++) {
                    g_cover[support][d][dims[d]][p.shape]++;
                    g_cover_w[support][d][dims[d]][p.wanted]++;
                }
                if (!check_case(&r, &p)) failed++;
            }
    const int vals[6] = {N_DTG, N_MASKS, 2, 2, 2, 2};
    for (int d = 0; d < 6; d++)
        for (int v = 0; v < vals[d]; v++) {
            for (int s = 0; s < N_SHAPES; s++)
                if (!g_cover[support][d][v][s]) fail_msg("dimension %d value %d never meets shape %d", d, v, s);
            for (int w = 0; w < N_WANTED; w++)
                if (!g_cover_w[support][d][v][w]) fail_msg("dimension %d value %d never meets outputs %d", d, v, w);
        }
    if (failed) fail_msg("%d of %d %s configurations failed (seed %llu)", failed, N_CONFIGS,
                         support ? "support" : "full-vocabulary", (unsigned long long)test_seed());
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void test_grid(void **state) {
    (void)state;
    double t0 = now_s();
    run_grid(0, test_seed());
    fprintf(stderr, "grid: %d configurations in %.1f s\n", N_CONFIGS, now_s() - t0);
    assert_int_equal(g_configs[0], N_CONFIGS);
}

static void test_support(void **state) {
    (void)state;
    double t0 = now_s();
    run_grid(1, test_seed() + 1);
    fprintf(stderr, "support: %d configurations in %.1f s\n", N_CONFIGS, now_s() - t0);
    assert_int_equal(g_configs[1], N_CONFIGS);
}

static int g_tp_checked;

static void test_tp(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 2);
    int ok = 1;
    double t0 = now_s();
    for (int k = 0; k < N_TP_CFGS; k++, g_tp_checked++) ok &= tp_check_cfg(&r, g_kernel, &TP_CFGS[k]);
    fprintf(stderr, "tp: %d configurations in %.1f s\n", N_TP_CFGS, now_s() - t0);
    assert_int_equal(g_tp_checked, N_TP_CFGS);
    assert_true(ok);
}

/* Dense run with g = e = 0 on inactive rows equals the masked run's gradients; spans alone
 * equal the mask. */
static void test_dense_vs_masked(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 3);
    hcase h;
    const int64_t N = 45, H = 70, V = 600;
    hc_init(&h, &r, N, H, V, V, 0, 0, SPH_F32);
    hc_mask_ragged(&h, &r, 0.3);
    sph_ctx_t ctx = hc_ctx(g_kernel, 2, NULL);
    hc_wire(&h, HC_LP | HC_ENT | HC_MASK);
    hc_poison(&h);
    expect_ok(hc_run(ctx, SPH_HEAD_FORWARD, &h.a));
    hc_wire(&h, HC_G | HC_E | HC_DH | HC_DW | HC_MASK);
    expect_ok(hc_run(ctx, SPH_HEAD_BACKWARD, &h.a));
    float *mlp = hc_dup(h.lp, N * 4), *ment = hc_dup(h.ent, N * 4);
    float *mdh = hc_dup(h.dh, N * H * 4), *mdw = hc_dup(h.dw, V * H * 4);
    hc_wire(&h, HC_LP | HC_ENT | HC_SPANS);
    hc_poison(&h);
    expect_ok(hc_run(ctx, SPH_HEAD_FORWARD, &h.a));
    hc_wire(&h, HC_G | HC_E | HC_DH | HC_DW | HC_SPANS);
    expect_ok(hc_run(ctx, SPH_HEAD_BACKWARD, &h.a));
    assert_true(hc_close("dhidden spans vs mask", "dense_vs_masked", h.dh, SPH_F32, mdh,
                         SPH_F32, N * H, TOL_CPU_F32));
    assert_true(hc_close("dweight spans vs mask", "dense_vs_masked", h.dw, SPH_F32, mdw,
                         SPH_F32, V * H, TOL_CPU_F32));
    for (int64_t i = 0; i < N; i++)
        if (!h.mask[i]) h.g[i] = h.e[i] = 0;
    hc_wire(&h, HC_LP | HC_ENT);
    hc_poison(&h);
    expect_ok(hc_run(ctx, SPH_HEAD_FORWARD, &h.a));
    for (int64_t i = 0; i < N; i++)
        if (h.mask[i]) {
            assert_true(fabsf(h.lp[i] - mlp[i]) <= TOL_CPU_F32 * (1 + fabsf(h.lp[i])));
            assert_true(fabsf(h.ent[i] - ment[i]) <= TOL_CPU_F32 * (1 + fabsf(h.ent[i])));
        }
    hc_wire(&h, HC_G | HC_E | HC_DH | HC_DW);
    expect_ok(hc_run(ctx, SPH_HEAD_BACKWARD, &h.a));
    assert_true(hc_close("dhidden dense vs masked", "dense_vs_masked", h.dh, SPH_F32, mdh,
                         SPH_F32, N * H, TOL_CPU_F32));
    assert_true(hc_close("dweight dense vs masked", "dense_vs_masked", h.dw, SPH_F32, mdw,
                         SPH_F32, V * H, TOL_CPU_F32));
    free(mlp), free(ment), free(mdh), free(mdw);
    sph_ctx_destroy(ctx);
    hc_free(&h);
}

/* Same inputs, same thread count: bitwise-identical outputs (two- and one-pass, support). */
static void test_determinism(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 4);
    for (int v = 0; v < 3; v++) {
        const int64_t N = 300, H = 72, V = 700, K = v == 2 ? 9 : 0;
        hcase h;
        hc_init(&h, &r, N, H, V, V, 0, K, v == 1 ? SPH_BF16 : SPH_F32);
        hc_mask_ragged(&h, &r, 0.45);
        sph_ctx_opts o = SPH_CTX_OPTS_INIT;
        o.force_kernel = g_kernel, o.num_threads = 2, o.chunk_rows = 64;
        sph_ctx_t ctx = NULL;
        expect_ok(sph_ctx_create(&ctx, &o));
        void *out[2][7];
        for (int run = 0; run < 2; run++) {
            hc_poison(&h);
            unsigned w = HC_OUTS | HC_MASK | HC_SPANS;
            if (v == 1) w |= HC_G | HC_E | HC_GL | HC_DH | HC_DW; /* one-pass */
            hc_wire(&h, w);
            expect_ok(hc_run(ctx, SPH_HEAD_FORWARD, &h.a));
            if (v != 1) {
                hc_wire(&h, HC_G | HC_E | HC_GL | HC_DH | HC_DW | HC_MASK | HC_SPANS);
                expect_ok(hc_run(ctx, SPH_HEAD_BACKWARD, &h.a));
            }
            void *src[7] = {h.lp, h.ent, h.lse, h.lm, h.stats, h.dh, h.dw};
            size_t sz[7] = {N * 4, N * 4, N * 4, N * 4, N * 12, N * H * 4, V * H * 4};
            for (int k = 0; k < 7; k++) out[run][k] = hc_dup(src[k], sz[k]);
            if (run == 1)
                for (int k = 0; k < 7; k++) {
                    assert_memory_equal(out[0][k], out[1][k], sz[k]);
                    free(out[0][k]), free(out[1][k]);
                }
        }
        sph_ctx_destroy(ctx);
        hc_free(&h);
    }
}

/* N = 0: nothing to compute, but dweight is still an output: overwritten with zeros, or left
 * as it was when accumulating; poisoned first so memory that happens to be zero cannot pass. */
static void test_empty(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 5);
    for (int acc = 0; acc < 2; acc++)
        for (int one_pass = 0; one_pass < 2; one_pass++) {
            hcase h;
            hc_init(&h, &r, 0, 8, 10, 10, 0, 0, SPH_F32);
            sph_ctx_t ctx = hc_ctx(g_kernel, 2, NULL);
            poison_f32(h.dw, 80);
            float *start = hc_alloc(80 * 4);
            for (int k = 0; k < 80; k++) start[k] = (float)rng_normal(&r);
            if (acc) memcpy(h.dw, start, 80 * 4);
            hc_wire(&h, HC_LP | HC_ENT | HC_G | HC_DH | HC_DW);
            h.a.accumulate_dweight = acc;
            expect_ok(hc_run(ctx, one_pass ? SPH_HEAD_FORWARD : SPH_HEAD_BACKWARD, &h.a));
            for (int64_t k = 0; k < 80; k++)
                assert_true(acc ? ((float *)h.dw)[k] == start[k] : ((float *)h.dw)[k] == 0.0f);
            free(start);
            sph_ctx_destroy(ctx);
            hc_free(&h);
        }
}

int main(int argc, char **argv) {
    g_kernel = test_kernel_arg(argc, argv, NULL);
    char why[512];
    int avail = test_kernel_available(g_kernel, why, sizeof why);
    if (avail <= 0) {
        printf("%s: %s\n", avail == 0 ? "SKIP" : "FAIL", why);
        return avail == 0 ? 77 : 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grid),         cmocka_unit_test(test_support),
        cmocka_unit_test(test_tp),           cmocka_unit_test(test_dense_vs_masked),
        cmocka_unit_test(test_determinism),  cmocka_unit_test(test_empty),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    fprintf(stderr,
            "head_cpu[%s]: %d full-vocabulary + %d support configurations checked (%lld + %lld "
            "with active rows; expected %d each), %d TP configurations\n",
            g_kernel ? g_kernel : "best", g_configs[0], g_configs[1],
            (long long)g_active_cases[0], (long long)g_active_cases[1], N_CONFIGS, g_tp_checked);
    tol_report(g_kernel ? g_kernel : "best");
    return test_exit(failed);
}
