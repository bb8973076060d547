/*
 * test_head_cuda.c - the CUDA LM head against the float64 reference (src/head/head_ref.c) on
 * exactly the rounded inputs the GPU sees, through the public API: every dtype, the awkward
 * shapes, masks and spans (gaps just under and over the coalescing gap), entropy on/off,
 * temperature != 1, softcap, lse / logit_mean outputs and gradients, accumulate on/off,
 * ignored targets, vocabulary splits with a partial final split, one-pass mode, sample
 * support, outputs poisoned before each run. Then: bad input, determinism (bitwise), batch
 * invariance (the same rows inside different batches and positions, bitwise), the same
 * batch-invariant parity and invariance with the sm_90a wgmma kernel on and off
 * (SPH_CUDA_FLAG_NO_SM90, sm_90 devices only) plus that kernel alone against float64 dot
 * products, the general path's fused sm_90a epilogues on and off (SPH_CUDA_FLAG_NO_FUSED), the
 * kernel's two schedules (ping-pong and cooperative, SPH_CUDA_FLAG_PINGPONG / _COOPERATIVE,
 * bitwise equal), both gradient sweep orders (SPH_CUDA_FLAG_NO_COLOUTER) and the
 * dense-backward ablation (SPH_CUDA_FLAG_DENSE_BACKWARD), issue 23's kernel versions (each
 * forced on: E_TWO_CHUNKS, DH_SPLITK, E2D_OVERLAP, DW32_BETA0; test_issue23). Contexts take the
 * SPH_CUDA_*
 * variables of the environment first (sph_ctx_opts_apply_env: the device scripts rerun the
 * suite under them), then each test's own switches,
 * CUDA graph capture and replay, no active row under accumulate (dhidden / dweight keep their
 * start, +-0 starts among them), and a case with more than 2^32 logits (sampled rows checked).
 * Skips (exit 77) without a CUDA device.
 */
#ifndef SPH_HAVE_CUDA
/* A build without CUDA: nothing to test here (the CUDA headers may not even exist). */
#include <stdio.h>
int main(void) {
    printf("no CUDA device: skipping (spanhead was built without CUDA)\n");
    return 77;
}
#else
#include <cuda_runtime.h>
#include <stddef.h>

#include "../parity/test_head_case.h"
#include "cuda/head_sm90.cuh"
#include "cuda/state.h"
#include "head/plan.h"
#include "head/host.h"

static sph_rng g_rng;
/* issue 23's E2D_OVERLAP: rows per block forced into run_cfg's contexts (0: the rule), and
 * the chunks they pipelined (read back before each context is destroyed) */
static int64_t g_e2d_rows;
static int g_e2d_pipelined;
/* DW32_BETA0: the passes that skipped the fp32 dW accumulator's memset */
static int g_dw32_saved;

#include "cuda_case.h"

static int run_cfg(const gcfg *f) {
    hcase c;
    hc_init(&c, &g_rng, f->N, f->H, f->V_loc, f->V, f->v0, f->K, f->dt);
    hc_edge_targets(&c);
    c.gdt = f->gdt;
    unsigned what = HC_LP | HC_LSE | HC_LM | HC_G | HC_GL | HC_GM | HC_DH | HC_DW;
    if (f->entropy) what |= HC_ENT | HC_E;
    if (f->mask_frac >= 0) {
        hc_mask_ragged(&c, &g_rng, f->mask_frac);
        what |= HC_MASK;
        if (f->use_spans) what |= HC_SPANS;
    }
    char cs[256];
    snprintf(cs, sizeof cs,
             "head_cuda(N=%lld,H=%lld,V_loc=%lld,V=%lld,v0=%lld,K=%lld,dtype=%s,grad=%s,mask=%.2f,"
             "spans=%d,acc=%d,one_pass=%d,ent=%d,T=%.2f,cap=%.1f,chunk=%lld,bi=%d)",
             (long long)f->N, (long long)f->H, (long long)f->V_loc, (long long)f->V,
             (long long)f->v0, (long long)f->K, sph_dtype_name(f->dt), sph_dtype_name(f->gdt),
             f->mask_frac, f->use_spans, f->acc, f->one_pass, f->entropy, f->temp, f->cap,
             (long long)f->chunk_bytes, f->bi);
    hc_wire(&c, what);
    c.a.temperature = f->temp;
    c.a.softcap = f->cap;
    c.a.accumulate_dhidden = c.a.accumulate_dweight = f->acc;
    /* accumulate: start the gradients from random values (kept on the host for the check) */
    size_t dhn = (size_t)(c.N * c.H), dwn = (size_t)(c.V_loc * c.H);
    double *dh0 = hc_alloc(dhn * 8 + 8), *dw0 = hc_alloc(dwn * 8 + 8);
    hc_poison(&c);
    if (f->acc) {
        for (size_t k = 0; k < dhn; k++) hc_set(c.dh, c.gdt, (int64_t)k, rng_normal(&g_rng));
        for (size_t k = 0; k < dwn; k++) hc_set(c.dw, c.gdt, (int64_t)k, rng_normal(&g_rng));
    }
    for (size_t k = 0; k < dhn; k++) dh0[k] = f->acc ? hc_get(c.dh, c.gdt, (int64_t)k) : 0;
    for (size_t k = 0; k < dwn; k++) dw0[k] = f->acc ? hc_get(c.dw, c.gdt, (int64_t)k) : 0;
    void *dh_start = hc_dup(c.dh, dhn * hc_esize(c.gdt));

    sph_ctx_t g = gpu_ctx(f->chunk_bytes, f->bi, NULL);
    ((sph_cuda_state *)g->cuda)->e2d_rows = g_e2d_rows;
    const double ftol = rows_tol(f->dt);
    int ok = 1;
    refout r;
    if (f->one_pass) {
        /* forward with the gradient outputs: one-pass */
        mirror m;
        mirror_make(g, &c.a, &m);
        expect_ok(gpu_run(g, SPH_HEAD_FORWARD, &m.a));
        mirror_back(g, &m);
        mirror_free(g, &m);
        ref_run(&c, SPH_HEAD_FORWARD, 1, &r);
    } else {
        /* forward (outputs and stats), then backward reading the GPU stats */
        sph_head_args fa = c.a;
        fa.dhidden = fa.dweight = NULL;
        mirror m;
        mirror_make(g, &fa, &m);
        expect_ok(gpu_run(g, SPH_HEAD_FORWARD, &m.a));
        mirror_back(g, &m);
        mirror_free(g, &m);
        ref_run(&c, SPH_HEAD_BACKWARD, 1, &r);
        mirror_make(g, &c.a, &m); /* stats now hold the GPU forward's */
        expect_ok(gpu_run(g, SPH_HEAD_BACKWARD, &m.a));
        mirror_back(g, &m);
        mirror_free(g, &m);
    }
    /* the independent float64 forward (entropy as -sum p log p) and backward (A, Z) */
    uint8_t *act = hc_alloc((size_t)c.N + 1);
    hc_active(&c, act);
    double *ind = hc_alloc((size_t)c.N * HC_IND * 8 + 8);
    hc_indep_forward(&c, f->temp, f->cap, act, ind);
    double *adh = hc_alloc(dhn * 8 + 8), *adw = hc_alloc(dwn * 8 + 8);
    double *zdh = hc_alloc(dhn * 8 + 8), *zdw = hc_alloc(dwn * 8 + 8);
    hc_indep_backward(&c, f->temp, f->cap, act, ind, what & HC_UPS, NULL, NULL, adh, adw, zdh,
                      zdw);
    ok &= check_col("logprob", cs, c.lp, r.rows, 0, c.N, 1, ftol);
    if (f->entropy) {
        ok &= check_col("entropy", cs, c.ent, r.rows, 1, c.N, 1, ftol);
        ok &= hc_close_col("entropy -sum p log p", cs, c.ent, 1, ind, HC_IND, 1, c.N, ftol);
    }
    ok &= check_col("lse", cs, c.lse, r.rows, 2, c.N, 1, ftol);
    if (!c.K) ok &= check_col("logit_mean", cs, c.lm, r.rows, 3, c.N, 1, ftol);
    ok &= check_col("stats.m", cs, c.stats, r.rows, 4, c.N, 3, ftol);
    ok &= check_col("stats.lse", cs, c.stats + 1, r.rows, 5, c.N, 3, ftol);
    ok &= check_col("stats.mu", cs, c.stats + 2, r.rows, 6, c.N, 3, ftol);
    /* rows outside the mask: every per-row output and stats exactly 0, dhidden exactly 0
     * (overwrite) or bitwise its start (accumulate) */
    const size_t ge = hc_esize(c.gdt);
    for (int64_t i = 0; i < c.N; i++) {
        if (act[i]) continue;
        int zero = c.lp[i] == 0.f && c.lse[i] == 0.f && c.stats[3 * i] == 0.f &&
                   c.stats[3 * i + 1] == 0.f && c.stats[3 * i + 2] == 0.f &&
                   (!f->entropy || c.ent[i] == 0.f) && (c.K || c.lm[i] == 0.f);
        int64_t bad_k = -1;
        for (int64_t j = 0; j < c.H && bad_k < 0; j++)
            if (f->acc ? memcmp((char *)c.dh + (size_t)(i * c.H + j) * ge,
                                (char *)dh_start + (size_t)(i * c.H + j) * ge, ge) != 0
                       : hc_get(c.dh, c.gdt, i * c.H + j) != 0.0)
                bad_k = j;
        if (!zero || bad_k >= 0) {
            print_error("%s: inactive row %lld: per-row outputs %s, dhidden %s (first bad column "
                        "%lld)\n", cs, (long long)i, zero ? "zero" : "NOT zero",
                        bad_k < 0 ? "as required" : f->acc ? "changed" : "not zero",
                        (long long)bad_k);
            ok = 0;
            break; /* one row is enough; never read past row N - 1 */
        }
    }
    ok &= check_grad_gpu("dhidden", cs, c.dh, c.gdt, dh0, r.dh, adh, zdh, (int64_t)dhn, f->dt);
    ok &= check_grad_gpu("dweight", cs, c.dw, c.gdt, dw0, r.dw, adw, zdw, (int64_t)dwn, f->dt);
    ref_free(&r);
    free(dh0), free(dw0), free(dh_start), free(act), free(ind), free(adh), free(adw), free(zdh),
        free(zdw);
    g_e2d_pipelined += ((sph_cuda_state *)g->cuda)->e2d_blocks_run;
    g_dw32_saved += ((sph_cuda_state *)g->cuda)->dw32_memsets_saved;
    sph_ctx_destroy(g);
    hc_free(&c);
    return ok;
}

/* No active row, accumulating (docs/head.md: inactive rows never touch dweight, and their
 * dhidden rows are left untouched): every per-row output and stats exactly 0, and dhidden /
 * dweight keep their start. The starts hold +0 and -0 among random values: a pass that wrote
 * start + 0 back would be invisible on the others, and turns a -0 into +0. Bitwise where the
 * start is not a zero; a zero start must stay a zero of either sign where cuBLAS accumulates
 * into the caller's buffer (beta 1: -0 + 0 is +0 in IEEE arithmetic, as torch's += gives).
 * how: 0 a mask of zeros (every row computed on the device, none active), 1 an empty span
 * list, 2 a mask of zeros under spans that cover every row. */
static int no_active_case(sph_dtype dt, sph_dtype gdt, int one_pass, int how, int64_t chunk) {
    const int64_t N = 37, H = 72, V = 613;
    hcase c;
    hc_init(&c, &g_rng, N, H, V, V, 0, 0, dt);
    c.gdt = gdt;
    c.mask = hc_alloc((size_t)N + 1);
    memset(c.mask, how == 1 ? 1 : 0, (size_t)N);
    c.spans = hc_alloc(2 * sizeof(int64_t));
    c.spans[0] = 0, c.spans[1] = N;
    c.n_spans = how == 1 ? 0 : 1;
    unsigned what = HC_LP | HC_ENT | HC_LSE | HC_LM | HC_G | HC_E | HC_GL | HC_GM | HC_DH | HC_DW;
    what |= how == 0 ? HC_MASK : how == 1 ? HC_SPANS : HC_MASK | HC_SPANS;
    hc_wire(&c, what);
    c.a.accumulate_dhidden = c.a.accumulate_dweight = 1;
    hc_poison(&c);
    const size_t dhn = (size_t)(N * H), dwn = (size_t)(V * H), ge = hc_esize(gdt);
    for (size_t k = 0; k < dhn; k++)
        hc_set(c.dh, gdt, (int64_t)k, k % 7 == 3 ? -0.0 : k % 11 == 5 ? 0.0 : rng_normal(&g_rng));
    for (size_t k = 0; k < dwn; k++)
        hc_set(c.dw, gdt, (int64_t)k, k % 7 == 2 ? -0.0 : k % 13 == 4 ? 0.0 : rng_normal(&g_rng));
    void *dh0 = hc_dup(c.dh, dhn * ge), *dw0 = hc_dup(c.dw, dwn * ge);
    char cs[160];
    snprintf(cs, sizeof cs, "head_cuda no active row(dtype=%s,grad=%s,one_pass=%d,how=%d,chunk=%lld)",
             sph_dtype_name(dt), sph_dtype_name(gdt), one_pass, how, (long long)chunk);
    sph_ctx_t g = gpu_ctx(chunk, 0, NULL);
    mirror m;
    if (!one_pass) { /* forward (the stats of no row), then the backward on them */
        sph_head_args fa = c.a;
        fa.dhidden = fa.dweight = NULL;
        mirror_make(g, &fa, &m);
        expect_ok(gpu_run(g, SPH_HEAD_FORWARD, &m.a));
        mirror_back(g, &m);
        mirror_free(g, &m);
    }
    mirror_make(g, &c.a, &m);
    expect_ok(gpu_run(g, one_pass ? SPH_HEAD_FORWARD : SPH_HEAD_BACKWARD, &m.a));
    mirror_back(g, &m);
    mirror_free(g, &m);
    sph_ctx_destroy(g);
    int ok = 1;
    for (int64_t i = 0; i < N && ok; i++)
        if (c.lp[i] != 0.f || c.ent[i] != 0.f || c.lse[i] != 0.f || c.lm[i] != 0.f ||
            c.stats[3 * i] != 0.f || c.stats[3 * i + 1] != 0.f || c.stats[3 * i + 2] != 0.f) {
            print_error("%s: row %lld: a per-row output or stats is not 0\n", cs, (long long)i);
            ok = 0;
        }
    const struct { const char *name; const void *got, *start; size_t n; } t[2] = {
        {"dhidden", c.dh, dh0, dhn}, {"dweight", c.dw, dw0, dwn}};
    for (int q = 0; q < 2; q++)
        for (size_t k = 0; k < t[q].n; k++) {
            const double s = hc_get(t[q].start, gdt, (int64_t)k);
            const double v = hc_get(t[q].got, gdt, (int64_t)k);
            const int same = s == 0 ? v == 0 && !isnan(v)
                                    : memcmp((const char *)t[q].got + k * ge,
                                             (const char *)t[q].start + k * ge, ge) == 0;
            if (!same) {
                print_error("%s: %s[%zu] = %.9g, its start was %.9g\n", cs, t[q].name, k, v, s);
                ok = 0;
                break;
            }
        }
    free(dh0), free(dw0);
    hc_free(&c);
    return ok;
}

static void test_no_active_acc(void **state) {
    (void)state;
    /* gradients in the inputs' 16-bit dtype or f32 (the library refuses another 16-bit one:
     * run 37 found this grid's first form asking for bf16 dhidden of f16 inputs) */
    const sph_dtype dts[] = {SPH_F16, SPH_BF16}, gdts[] = {SPH_F16, SPH_BF16, SPH_F32};
    int ok = 1;
    for (int d = 0; d < 2; d++)
        for (int gd = 0; gd < 3; gd++)
            for (int one_pass = 0; one_pass < 2 && (gdts[gd].bits == 32 ||
                                                    gdts[gd].code == dts[d].code);
                 one_pass++)
                for (int how = 0; how < 3; how++) /* default chunks, and rows in many chunks */
                    for (int64_t chunk = 0; chunk <= 1; chunk++)
                        ok &= no_active_case(dts[d], gdts[gd], one_pass, how,
                                             chunk ? 64 << 10 : 0);
    assert_true(ok);
}

static gcfg base(sph_dtype dt, int64_t N, int64_t H, int64_t V) {
    gcfg f;
    memset(&f, 0, sizeof f);
    f.dt = dt, f.gdt = SPH_F32, f.N = N, f.H = H, f.V_loc = V, f.V = V;
    f.mask_frac = -1, f.entropy = 1, f.temp = 1.0;
    return f;
}

/* The batch-invariant path (head_mma.cu logits) against the reference: aligned and
 * unaligned rows (H % 8 != 0), tiny and tile-straddling shapes, splits, one-pass. */
static void test_bi_parity(void **state) {
    (void)state;
    const sph_dtype dts[3] = {SPH_BF16, SPH_F16, SPH_F32};
    int ok = 1;
    for (int d = 0; d < 3; d++) {
        gcfg f = base(dts[d], 3, 7, 13);
        f.bi = 1;
        ok &= run_cfg(&f);
        f = base(dts[d], 131, 72, 300); /* rows straddle 128-row tiles, H % 32 != 0 */
        f.bi = 1, f.temp = 0.8, f.cap = 4.0, f.mask_frac = 0.7, f.use_spans = 1;
        ok &= run_cfg(&f);
        f = base(dts[d], 70, 37, 17000); /* H odd: unaligned loads; V_loc > the split */
        f.bi = 1, f.one_pass = 1, f.gdt = dts[d];
        ok &= run_cfg(&f);
    }
    assert_true(ok);
}

static void test_parity_grid(void **state) {
    (void)state;
    const sph_dtype dts[3] = {SPH_F32, SPH_BF16, SPH_F16};
    int ok = 1;
    for (int d = 0; d < 3; d++) {
        sph_dtype dt = dts[d];
        gcfg f = base(dt, 1, 7, 13); /* N = 1, tiny everything */
        ok &= run_cfg(&f);
        f = base(dt, 37, 72, 1000); /* odd N, H not a multiple of 64 */
        f.temp = 0.7, f.cap = 5.0;
        ok &= run_cfg(&f);
        f = base(dt, 53, 64, 777); /* splits: V_loc not a multiple of the split, partial last */
        f.chunk_bytes = 40 * 1024, f.mask_frac = 0.6, f.use_spans = 1;
        ok &= run_cfg(&f);
        f.entropy = 0, f.acc = 1, f.temp = 1.3;
        ok &= run_cfg(&f);
        f = base(dt, 300, 40, 500); /* mask without spans; several row chunks */
        f.mask_frac = 0.5, f.chunk_bytes = 64 * 1024;
        ok &= run_cfg(&f);
        f = base(dt, 129, 96, 333); /* one-pass, split vocabulary, half gradients */
        f.one_pass = 1, f.chunk_bytes = 24 * 1024, f.gdt = dt, f.cap = 3.0;
        f.mask_frac = 0.7, f.use_spans = 1;
        ok &= run_cfg(&f);
        f.chunk_bytes = 0, f.acc = 1; /* one-pass, whole vocabulary in one split */
        ok &= run_cfg(&f);
        f = base(dt, 64, 48, 300); /* a TP shard: v0 > 0, V > V_loc */
        f.v0 = 200, f.V = 1000;
        ok &= run_cfg(&f);
        f = base(dt, 45, 40, 600); /* sample support, shard, one-pass and two-pass */
        f.K = 9, f.v0 = 100, f.V = 900, f.cap = 4.0, f.temp = 0.9, f.mask_frac = 0.8;
        ok &= run_cfg(&f);
        f.one_pass = 1, f.gdt = dt, f.use_spans = 1;
        ok &= run_cfg(&f);
    }
    assert_true(ok);
}

/* Spans whose inactive gaps sit just under and just over the coalescing gap (128): the gap
 * rows inside a coalesced span are computed and zeroed, the rows between spans never. */
static void test_span_gaps(void **state) {
    (void)state;
    const int64_t G = 128, N = 3 * 150 + 2 * G + 50;
    int ok = 1;
    for (int d = 0; d < 2; d++) {
        hcase c;
        sph_dtype dt = d ? SPH_BF16 : SPH_F32;
        hc_init(&c, &g_rng, N, 64, 257, 257, 0, 0, dt);
        c.mask = hc_alloc((size_t)N);
        c.spans = hc_alloc(8 * sizeof(int64_t));
        memset(c.mask, 0, (size_t)N);
        /* runs: [0,150), gap G-1, [150+G-1, 300+G-1), gap G+1, [.., +150) */
        int64_t a0 = 0, a1 = 150, b0 = a1 + G - 1, b1 = b0 + 150, c0 = b1 + G + 1, c1 = c0 + 150;
        for (int64_t i = a0; i < a1; i++) c.mask[i] = 1;
        for (int64_t i = b0; i < b1; i++) c.mask[i] = 1;
        for (int64_t i = c0; i < c1 && i < N; i++) c.mask[i] = 1;
        /* coalesced with gap G: the first two runs merge, the third stays apart */
        c.spans[0] = a0, c.spans[1] = b1, c.spans[2] = c0, c.spans[3] = c1 < N ? c1 : N;
        c.n_spans = 2;
        hc_wire(&c, HC_LP | HC_ENT | HC_G | HC_E | HC_DH | HC_DW | HC_MASK | HC_SPANS);
        hc_poison(&c);
        sph_ctx_t g = gpu_ctx(96 * 1024, 0, NULL);
        mirror m;
        mirror_make(g, &c.a, &m);
        expect_ok(gpu_run(g, SPH_HEAD_FORWARD, &m.a));
        mirror_back(g, &m);
        mirror_free(g, &m);
        refout r;
        ref_run(&c, SPH_HEAD_FORWARD, 1, &r);
        const char *cs = d ? "span_gaps(bf16)" : "span_gaps(f32)";
        ok &= check_col("logprob", cs, c.lp, r.rows, 0, N, 1, rows_tol(dt));
        ok &= check_col("entropy", cs, c.ent, r.rows, 1, N, 1, rows_tol(dt));
        uint8_t *act = hc_alloc((size_t)N);
        hc_active(&c, act);
        double *ind = hc_alloc((size_t)N * HC_IND * 8), *zero = hc_alloc(257 * 64 * 8 + N * 64 * 8);
        double *A[2] = {hc_alloc(N * 64 * 8), hc_alloc(257 * 64 * 8)};
        double *Z[2] = {hc_alloc(N * 64 * 8), hc_alloc(257 * 64 * 8)};
        memset(zero, 0, 257 * 64 * 8 + N * 64 * 8);
        hc_indep_forward(&c, 1.0, 0.0, act, ind);
        hc_indep_backward(&c, 1.0, 0.0, act, ind, HC_G | HC_E, NULL, NULL, A[0], A[1], Z[0], Z[1]);
        ok &= check_grad_gpu("dhidden", cs, c.dh, c.gdt, zero, r.dh, A[0], Z[0], N * 64, dt);
        ok &= check_grad_gpu("dweight", cs, c.dw, c.gdt, zero, r.dw, A[1], Z[1], 257 * 64, dt);
        free(act), free(ind), free(zero), free(A[0]), free(A[1]), free(Z[0]), free(Z[1]);
        ref_free(&r);
        sph_ctx_destroy(g);
        hc_free(&c);
    }
    assert_true(ok);
}

// ---- bad input --------------------------------------------------------------------------------

static void test_errors(void **state) {
    (void)state;
    hcase c;
    hc_init(&c, &g_rng, 16, 32, 50, 50, 0, 0, SPH_BF16);
    hc_wire(&c, HC_LP | HC_G | HC_DH | HC_DW);
    sph_ctx_t g = gpu_ctx(0, 0, NULL);
    mirror m;
    mirror_make(g, &c.a, &m);
    size_t bytes = 0;
    expect_ok(sph_head_workspace_size(g, SPH_HEAD_FORWARD, &m.a, &bytes));
    void *ws = NULL;
    expect_ok(sph_ctx_malloc(g, bytes, &ws));
    /* host memory where device memory is required */
    sph_tensor th = m.t[0];
    th.data = c.h;
    sph_head_args a = m.a;
    a.hidden = &th;
    expect_status(sph_head_forward(g, &a, ws, bytes), SPH_ERR_DEVICE, "host memory");
    /* misaligned bf16 pointer */
    th = m.t[0];
    th.data = (char *)m.dev[0] + 1;
    expect_status(sph_head_forward(g, &a, ws, bytes), SPH_ERR_INVALID_ARG, "misaligned");
    /* workspace too small, NULL, misaligned */
    expect_status(sph_head_forward(g, &m.a, ws, bytes - 1), SPH_ERR_WORKSPACE, "workspace");
    expect_status(sph_head_forward(g, &m.a, (char *)ws + 8, bytes - 8), SPH_ERR_WORKSPACE,
                  "workspace");
    /* a host workspace */
    void *hws = hc_alloc(bytes);
    expect_status(sph_head_forward(g, &m.a, hws, bytes), SPH_ERR_DEVICE, "workspace");
    free(hws);
    /* device memory behind a tensor that says CPU: the CUDA context rejects the device */
    th = m.t[0];
    th.device.type = SPH_DEVICE_CPU;
    expect_status(sph_head_forward(g, &a, ws, bytes), SPH_ERR_DEVICE, "hidden");
    /* a device older than sm_80: refused before any launch */
    sph_cuda_state *cst = (sph_cuda_state *)g->cuda;
    int cc = cst->cc;
    cst->cc = 75;
    expect_status(sph_head_forward(g, &m.a, ws, bytes), SPH_ERR_UNSUPPORTED, "compute capability");
    cst->cc = cc;
    /* spans in device memory where host memory is required */
    int64_t hsp[2] = {0, 16};
    void *dsp = NULL;
    expect_ok(sph_ctx_malloc(g, sizeof hsp, &dsp));
    expect_ok(sph_ctx_memcpy(g, dsp, hsp, sizeof hsp));
    /* refused by validation (head.c, the one place) before the host reads them */
    {
        sph_head_args da = m.a;
        da.spans = (const int64_t *)dsp;
        da.n_spans = 1;
        expect_status(sph_head_forward(g, &da, ws, bytes), SPH_ERR_DEVICE, "spans: device pointer");
    }
    sph_ctx_free(g, dsp);
    /* and the valid call still works */
    expect_ok(sph_head_forward(g, &m.a, ws, bytes));
    expect_ok(sph_ctx_synchronize(g));
    sph_ctx_free(g, ws);
    mirror_free(g, &m);
    sph_ctx_destroy(g);
    hc_free(&c);
}

// ---- determinism, batch invariance, graphs ------------------------------------------------------

static void test_determinism(void **state) {
    (void)state;
    for (int bi = 0; bi < 2; bi++) {
        hcase c;
        hc_init(&c, &g_rng, 700, 128, 3001, 3001, 0, 0, SPH_BF16);
        hc_mask(&c, &g_rng, 0.7);
        hc_wire(&c, HC_LP | HC_ENT | HC_LSE | HC_G | HC_E | HC_DH | HC_DW | HC_MASK);
        hc_poison(&c);
        sph_ctx_t g = gpu_ctx(2 << 20, bi, NULL);
        float *lp1 = hc_alloc(700 * 4), *dh1 = hc_alloc(700 * 128 * 4),
              *dw1 = hc_alloc(3001 * 128 * 4);
        for (int run = 0; run < 2; run++) {
            mirror m;
            mirror_make(g, &c.a, &m);
            expect_ok(gpu_run(g, SPH_HEAD_FORWARD, &m.a));
            mirror_back(g, &m);
            mirror_free(g, &m);
            if (run == 0) {
                memcpy(lp1, c.lp, 700 * 4), memcpy(dh1, c.dh, 700 * 128 * 4);
                memcpy(dw1, c.dw, 3001 * 128 * 4);
            }
        }
        assert_memory_equal(lp1, c.lp, 700 * 4);
        assert_memory_equal(dh1, c.dh, 700 * 128 * 4);
        assert_memory_equal(dw1, c.dw, 3001 * 128 * 4);
        free(lp1), free(dh1), free(dw1);
        sph_ctx_destroy(g);
        hc_free(&c);
    }
}

/* Rows [s, s + n) of a batch of N, recomputed inside a batch of other random rows at another
 * position, other N and another mask: logprob and entropy must be bitwise equal. */
static void bi_dtype_h(sph_dtype dt, int64_t H) {
    const int64_t N = 1100, V = 20000; /* two vocabulary splits (16384 + rest) */
    hcase c;
    hc_init(&c, &g_rng, N, H, V, V, 0, 0, dt);
    hc_mask(&c, &g_rng, 0.9);
    hc_wire(&c, HC_LP | HC_ENT | HC_MASK);
    hc_poison(&c);
    sph_ctx_t g = gpu_ctx(0, 1, NULL);
    mirror m;
    mirror_make(g, &c.a, &m);
    expect_ok(gpu_run(g, SPH_HEAD_FORWARD, &m.a));
    mirror_back(g, &m);
    mirror_free(g, &m);
    const int64_t s = 301, n = 77, N2 = 150, at = 13;
    hcase d;
    hc_init(&d, &g_rng, N2, H, V, V, 0, 0, dt);
    size_t es = dt.bits / 8;
    memcpy(d.w, c.w, (size_t)(V * H) * es);
    memcpy((char *)d.h + (size_t)(at * H) * es, (char *)c.h + (size_t)(s * H) * es,
           (size_t)(n * H) * es);
    for (int64_t k = 0; k < n; k++) d.tgt[at + k] = c.tgt[s + k];
    d.mask = hc_alloc((size_t)N2);
    for (int64_t i = 0; i < N2; i++) d.mask[i] = (i >= at && i < at + n) ? 1 : (i % 3 != 0);
    hc_wire(&d, HC_LP | HC_ENT | HC_MASK);
    hc_poison(&d);
    mirror_make(g, &d.a, &m);
    expect_ok(gpu_run(g, SPH_HEAD_FORWARD, &m.a));
    mirror_back(g, &m);
    mirror_free(g, &m);
    for (int64_t k = 0; k < n; k++) {
        if (!c.mask[s + k]) continue;
        if (memcmp(&c.lp[s + k], &d.lp[at + k], 4) || memcmp(&c.ent[s + k], &d.ent[at + k], 4)) {
            print_error("batch invariance (%s): row %lld: logprob %.9g vs %.9g, entropy %.9g vs "
                        "%.9g\n", sph_dtype_name(dt), (long long)(s + k), c.lp[s + k],
                        d.lp[at + k], c.ent[s + k], d.ent[at + k]);
            fail();
        }
    }
    sph_ctx_destroy(g);
    hc_free(&c);
    hc_free(&d);
}

static void test_batch_invariance(void **state) {
    (void)state;
    bi_dtype_h(SPH_BF16, 200);
    bi_dtype_h(SPH_F16, 200);
    bi_dtype_h(SPH_F32, 200);
}

// ---- the sm_90a (wgmma + TMA) batch-invariant kernel ---------------------------------------

/* 1 when device 0 is an sm_90 part (the one the sm_90a kernel is built for). */
static int device_is_sm90(void) {
    struct cudaDeviceProp pr;
    return cudaGetDeviceProperties(&pr, 0) == cudaSuccess && pr.major == 9 && pr.minor == 0;
}

/* The kernel alone against a float64 dot product on fresh random rows: R, Vs, H not multiples
 * of the 128 x 256 x 64 tiles (k past H is zero-filled by TMA), ldL > Vs with the padding
 * columns checked untouched (still NaN), odd ldL (scalar stores). Then rows [r0, r0 + n)
 * recomputed alone (another R, another position in the tile) must be bitwise equal. */
/* The sm_90a logits kernel (L = h w^T, fp32) under the schedule g_schedule. */
static sph_status logits_sm90(sph_dtype dt, const void *h, const void *w, float *L,
                              int64_t ldL, int64_t R, int64_t Vs, int64_t H) {
    sph_sm90_epi e;
    memset(&e, 0, sizeof e);
    e.mode = SPH_SM90_EPI_L;
    e.schedule = g_schedule;
    e.L = L;
    e.ldL = ldL;
    return sph_cuda_head_sm90(dt, h, H, w, H, R, Vs, H, &e, NULL);
}

static int sm90_kernel_case(sph_dtype dt, int64_t R, int64_t Vs, int64_t H, int64_t ldL) {
    char cs[128];
    snprintf(cs, sizeof cs, "logits_sm90(R=%lld,Vs=%lld,H=%lld,ldL=%lld,dtype=%s)",
             (long long)R, (long long)Vs, (long long)H, (long long)ldL, sph_dtype_name(dt));
    const int bf = dt.code == SPH_DTYPE_BFLOAT;
    uint16_t *h = malloc((size_t)(R * H) * 2), *w = malloc((size_t)(Vs * H) * 2);
    double *hf = malloc((size_t)(R * H) * 8), *wf = malloc((size_t)(Vs * H) * 8);
    float *L = malloc((size_t)(R * ldL) * 4), *L2 = malloc((size_t)(R * ldL) * 4);
    assert_non_null(h), assert_non_null(w), assert_non_null(hf), assert_non_null(wf);
    assert_non_null(L), assert_non_null(L2);
    for (int64_t i = 0; i < R * H + Vs * H; i++) {
        float v = (float)(2.0 * rng_uniform(&g_rng) - 1.0);
        uint16_t q = bf ? sph_f32_to_bf16(v) : sph_f32_to_f16(v);
        double x = bf ? sph_bf16_to_f32(q) : sph_f16_to_f32(q); /* the rounded input */
        if (i < R * H) h[i] = q, hf[i] = x;
        else w[i - R * H] = q, wf[i - R * H] = x;
    }
    void *dh = NULL, *dw = NULL, *dL = NULL, *dL2 = NULL;
    assert_int_equal(cudaMalloc(&dh, (size_t)(R * H) * 2), cudaSuccess);
    assert_int_equal(cudaMalloc(&dw, (size_t)(Vs * H) * 2), cudaSuccess);
    assert_int_equal(cudaMalloc(&dL, (size_t)(R * ldL) * 4), cudaSuccess);
    assert_int_equal(cudaMalloc(&dL2, (size_t)(R * ldL) * 4), cudaSuccess);
    assert_int_equal(cudaMemcpy(dh, h, (size_t)(R * H) * 2, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(dw, w, (size_t)(Vs * H) * 2, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemset(dL, 0xff, (size_t)(R * ldL) * 4), cudaSuccess); /* NaN poison */
    assert_int_equal(cudaMemset(dL2, 0xff, (size_t)(R * ldL) * 4), cudaSuccess);
    assert_true(sph_cuda_logits_sm90_usable(dt, dh, H, dw, H, H));
    expect_ok(logits_sm90(dt, dh, dw, (float *)dL, ldL, R, Vs, H));
    const int64_t r0 = R / 3, n = R - r0 < 50 ? R - r0 : 50;
    expect_ok(logits_sm90(dt, (const uint16_t *)dh + r0 * H, dw, (float *)dL2, ldL, n, Vs, H));
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaMemcpy(L, dL, (size_t)(R * ldL) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(L2, dL2, (size_t)(n * ldL) * 4, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    int ok = 1;
    double worst = 0;
    int64_t wr = -1, wc = -1;
    for (int64_t r = 0; r < R; r++) {
        for (int64_t c = 0; c < Vs; c++) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < H; k++) {
                ref += hf[r * H + k] * wf[c * H + k];
                mag += fabs(hf[r * H + k] * wf[c * H + k]);
            }
            /* exact products, H / 16 fp32 tensor-core additions of relative error <= 2^-23
             * each: |err| <= 8e-6 sum |products| at H = 1024 */
            double err = fabs((double)L[r * ldL + c] - ref), tol = 4e-5 * mag + 1e-6;
            if (!(err <= tol) && (wr < 0 || !(err <= worst))) worst = err, wr = r, wc = c;
            if (!(err <= tol)) ok = 0;
        }
        for (int64_t c = Vs; c < ldL; c++)
            if (!isnan(L[r * ldL + c])) {
                print_error("%s: wrote padding column %lld of row %lld\n", cs, (long long)c,
                            (long long)r);
                ok = 0;
            }
    }
    if (!ok && wr >= 0)
        print_error("%s: worst abs err %.3g at (%lld, %lld): got %.9g; seed %llu\n", cs, worst,
                    (long long)wr, (long long)wc, L[wr * ldL + wc],
                    (unsigned long long)test_seed());
    for (int64_t k = 0; k < n; k++)
        if (memcmp(&L[(r0 + k) * ldL], &L2[k * ldL], (size_t)Vs * 4)) {
            print_error("%s: row %lld differs when computed in a batch of %lld at row 0\n", cs,
                        (long long)(r0 + k), (long long)n);
            ok = 0;
            break;
        }
    cudaFree(dh), cudaFree(dw), cudaFree(dL), cudaFree(dL2);
    free(h), free(w), free(hf), free(wf), free(L), free(L2);
    return ok;
}

/* The batch-invariant parity and invariance tests with the sm_90a kernel on (default) and off
 * (SPH_CUDA_FLAG_NO_SM90: the mma.sync kernel), each against the float64 reference, on shapes
 * the sm_90a kernel takes (H % 8 == 0, including H % 64 != 0). On an sm_90 device the path
 * must be live (the build holds sm_90a code), or the test fails. */
static void test_bi_sm90(void **state) {
    (void)state;
    if (!device_is_sm90()) {
        test_skip("device 0 is not sm_90: the sm_90a kernel was not exercised");
    }
    const sph_dtype dts[2] = {SPH_BF16, SPH_F16};
    assert_true(sph_cuda_sm90_available());
    int ok = 1;
    for (int m = 0; m < 2; m++) {
        cuda_switch(SPH_CUDA_FLAG_NO_SM90, m == 1); /* m 1: the contexts take mma.sync */
        for (int d = 0; d < 2; d++) {
            if (m == 0) {
                ok &= sm90_kernel_case(dts[d], 300, 600, 328, 601);
                ok &= sm90_kernel_case(dts[d], 5, 257, 8, 260);
                ok &= sm90_kernel_case(dts[d], 129, 512, 1024, 512);
            }
            gcfg f = base(dts[d], 1, 8, 13); /* one row, one k box, one column tile */
            f.bi = 1;
            ok &= run_cfg(&f);
            f = base(dts[d], 131, 72, 300); /* rows straddle 128-row tiles, H % 64 != 0 */
            f.bi = 1, f.temp = 0.8, f.cap = 4.0, f.mask_frac = 0.7, f.use_spans = 1;
            ok &= run_cfg(&f);
            f = base(dts[d], 70, 136, 17000); /* V_loc > the split: partial final split */
            f.bi = 1, f.one_pass = 1, f.gdt = dts[d];
            ok &= run_cfg(&f);
            f = base(dts[d], 300, 512, 2000); /* two-pass gradients, several k boxes */
            f.bi = 1, f.mask_frac = 0.5;
            ok &= run_cfg(&f);
            bi_dtype_h(dts[d], 200);
            bi_dtype_h(dts[d], 256);
        }
    }
    cuda_switch(SPH_CUDA_FLAG_NO_SM90, -1);
    assert_true(ok);
}

static void test_graph_capture(void **state) {
    (void)state;
    cudaStream_t st;
    assert_int_equal(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    hcase c;
    hc_init(&c, &g_rng, 500, 96, 2500, 2500, 0, 0, SPH_BF16);
    hc_mask(&c, &g_rng, 0.6);
    hc_wire(&c, HC_LP | HC_ENT | HC_G | HC_E | HC_DH | HC_DW | HC_MASK | HC_SPANS);
    hc_poison(&c);
    sph_ctx_t g = gpu_ctx(256 * 1024, 0, st);
    mirror m;
    mirror_make(g, &c.a, &m);
    sph_head_args fa = m.a;
    fa.dhidden = fa.dweight = NULL;
    size_t bf = 0, bb = 0;
    expect_ok(sph_head_workspace_size(g, SPH_HEAD_FORWARD, &fa, &bf));
    expect_ok(sph_head_workspace_size(g, SPH_HEAD_BACKWARD, &m.a, &bb));
    size_t bytes = bf > bb ? bf : bb;
    void *ws = NULL;
    expect_ok(sph_ctx_malloc(g, bytes, &ws));
    /* direct run */
    expect_ok(sph_head_forward(g, &fa, ws, bytes));
    expect_ok(sph_head_backward(g, &m.a, ws, bytes));
    expect_ok(sph_ctx_synchronize(g));
    mirror_back(g, &m);
    float *lp = hc_alloc(500 * 4), *dh = hc_alloc(500 * 96 * 4), *dw = hc_alloc(2500 * 96 * 4);
    memcpy(lp, c.lp, 500 * 4), memcpy(dh, c.dh, 500 * 96 * 4), memcpy(dw, c.dw, 2500 * 96 * 4);
    /* poison, capture forward + backward, replay twice */
    expect_ok(sph_ctx_memset(g, m.dev[5], 0xff, m.bytes[5]));
    expect_ok(sph_ctx_memset(g, m.dev[14], 0xff, m.bytes[14]));
    expect_ok(sph_ctx_memset(g, m.dev[15], 0xff, m.bytes[15]));
    expect_ok(sph_ctx_synchronize(g));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    assert_int_equal(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    sph_status s1 = sph_head_forward(g, &fa, ws, bytes);
    sph_status s2 = s1 == SPH_OK ? sph_head_backward(g, &m.a, ws, bytes) : s1;
    cudaError_t ce = cudaStreamEndCapture(st, &graph);
    if (s2 != SPH_OK) print_error("capture: %s\n", sph_last_error());
    assert_int_equal(s2, SPH_OK);
    assert_int_equal(ce, cudaSuccess);
    assert_int_equal(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int k = 0; k < 2; k++) assert_int_equal(cudaGraphLaunch(exec, st), cudaSuccess);
    expect_ok(sph_ctx_synchronize(g));
    mirror_back(g, &m);
    assert_memory_equal(lp, c.lp, 500 * 4);
    assert_memory_equal(dh, c.dh, 500 * 96 * 4);
    assert_memory_equal(dw, c.dw, 2500 * 96 * 4);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    free(lp), free(dh), free(dw);
    sph_ctx_free(g, ws);
    mirror_free(g, &m);
    sph_ctx_destroy(g);
    cudaStreamDestroy(st);
    hc_free(&c);
}

// ---- more than 2^32 logits ----------------------------------------------------------------------

/* N = 70000 rows x V = 65536 (4.6e9 logits, never stored): bf16, forward + backward; sampled
 * rows checked against a float64 computation done here. */
static void test_huge(void **state) {
    (void)state;
    if (getenv("SPH_TEST_SKIP_HUGE"))
        test_skip("SPH_TEST_SKIP_HUGE is set: the 2^32-logit case did not run (select tests "
                  "with SPH_GPU_TESTS=-test_huge instead to leave it out without a skip)");
    const int64_t N = 70000, H = 64, V = 65536;
    uint16_t *h = hc_alloc((size_t)(N * H) * 2), *w = hc_alloc((size_t)(V * H) * 2);
    int32_t *tgt = hc_alloc((size_t)N * 4);
    float *g = hc_alloc((size_t)N * 4);
    for (int64_t k = 0; k < N * H; k++) h[k] = sph_f32_to_bf16((float)rng_normal(&g_rng));
    for (int64_t k = 0; k < V * H; k++) w[k] = sph_f32_to_bf16((float)(rng_normal(&g_rng) * 0.3));
    for (int64_t i = 0; i < N; i++) tgt[i] = (int32_t)rng_range(&g_rng, 0, V - 1), g[i] = 1.f;
    sph_ctx_t ctx = gpu_ctx(0, 0, NULL);
    void *dh_, *dw_, *dt_, *dg, *dlp, *dst, *ddh;
    expect_ok(sph_ctx_malloc(ctx, (size_t)(N * H) * 2, &dh_));
    expect_ok(sph_ctx_malloc(ctx, (size_t)(V * H) * 2, &dw_));
    expect_ok(sph_ctx_malloc(ctx, (size_t)N * 4, &dt_));
    expect_ok(sph_ctx_malloc(ctx, (size_t)N * 4, &dg));
    expect_ok(sph_ctx_malloc(ctx, (size_t)N * 4, &dlp));
    expect_ok(sph_ctx_malloc(ctx, (size_t)N * 12, &dst));
    expect_ok(sph_ctx_malloc(ctx, (size_t)(N * H) * 4, &ddh));
    expect_ok(sph_ctx_memcpy(ctx, dh_, h, (size_t)(N * H) * 2));
    expect_ok(sph_ctx_memcpy(ctx, dw_, w, (size_t)(V * H) * 2));
    expect_ok(sph_ctx_memcpy(ctx, dt_, tgt, (size_t)N * 4));
    expect_ok(sph_ctx_memcpy(ctx, dg, g, (size_t)N * 4));
    expect_ok(sph_ctx_memset(ctx, dlp, 0xff, (size_t)N * 4));
    expect_ok(sph_ctx_memset(ctx, ddh, 0xff, (size_t)(N * H) * 4));
    int64_t sh[6][2] = {{N, H}, {V, H}, {N, 0}, {N, 3}, {N, H}, {N, 0}};
    sph_device dev = {SPH_DEVICE_CUDA, 0};
    sph_tensor th = {dh_, dev, 2, SPH_BF16, sh[0], NULL, 0};
    sph_tensor tw = {dw_, dev, 2, SPH_BF16, sh[1], NULL, 0};
    sph_tensor tt = {dt_, dev, 1, SPH_I32, sh[2], NULL, 0};
    sph_tensor tl = {dlp, dev, 1, SPH_F32, sh[2], NULL, 0};
    sph_tensor ts = {dst, dev, 2, SPH_F32, sh[3], NULL, 0};
    sph_tensor tdh = {ddh, dev, 2, SPH_F32, sh[4], NULL, 0};
    sph_tensor tg = {dg, dev, 1, SPH_F32, sh[5], NULL, 0};
    sph_head_args a = SPH_HEAD_ARGS_INIT;
    a.hidden = &th, a.weight = &tw, a.targets = &tt, a.logprob = &tl, a.stats = &ts;
    expect_ok(gpu_run(ctx, SPH_HEAD_FORWARD, &a));
    a.logprob = NULL, a.dlogprob = &tg, a.dhidden = &tdh;
    expect_ok(gpu_run(ctx, SPH_HEAD_BACKWARD, &a));
    float *lp = hc_alloc((size_t)N * 4), *dh = hc_alloc((size_t)(N * H) * 4);
    expect_ok(sph_ctx_memcpy(ctx, lp, dlp, (size_t)N * 4));
    expect_ok(sph_ctx_memcpy(ctx, dh, ddh, (size_t)(N * H) * 4));
    double *z = hc_alloc((size_t)V * 8);
    int ok = 1;
    const int64_t rows[6] = {0, 1, 33333, 65535, 65536, N - 1};
    for (int q = 0; q < 6; q++) {
        int64_t i = rows[q];
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < V; j++) {
            double u = 0;
            for (int64_t k = 0; k < H; k++)
                u += (double)sph_bf16_to_f32(h[i * H + k]) * sph_bf16_to_f32(w[j * H + k]);
            z[j] = u;
            if (u > m) m = u;
        }
        for (int64_t j = 0; j < V; j++) s += exp(z[j] - m);
        double lse = m + log(s), ref = z[tgt[i]] - lse;
        if (fabs(lp[i] - ref) > TOL_CUDA_HALF_ROWS * (1 + fabs(ref))) {
            print_error("huge: row %lld logprob %.6f, reference %.6f\n", (long long)i, lp[i], ref);
            ok = 0;
        }
        /* dh_i = sum_j (delta - p_j) w_j, against tolerances.h's gradient budget with
         * A_k = sum_j |delta - p_j| |w_jk| (the dlogits are rounded to bf16) */
        double mx = 0, worst = 0, ref_k[64], abs_k[64];
        for (int64_t k = 0; k < H; k++) {
            double acc = 0, aacc = 0;
            for (int64_t j = 0; j < V; j++) {
                double d = (j == tgt[i]) - exp(z[j] - lse), wv = sph_bf16_to_f32(w[j * H + k]);
                acc += d * wv, aacc += fabs(d * wv);
            }
            ref_k[k] = acc, abs_k[k] = aacc;
            if (fabs(acc) > mx) mx = fabs(acc);
        }
        for (int64_t k = 0; k < H; k++) {
            double bound = TOL_CUDA_F32 * (mx + TOL_NORM_FLOOR) + TOL_CUDA_F32 * fabs(ref_k[k]) +
                           (TOL_U_BF16 * TOL_CUDA_MARGIN + TOL_ACC_CUDA) * abs_k[k];
            double e = fabs(dh[i * H + k] - ref_k[k]) / bound;
            if (!(e <= worst)) worst = e;
        }
        tol_track("huge.dhidden", worst);
        if (!(worst <= 1)) {
            print_error("huge: row %lld dhidden error / budget %.3g (max |ref| %.3g)\n",
                        (long long)i, worst, mx);
            ok = 0;
        }
    }
    assert_true(ok);
    void *ps[] = {dh_, dw_, dt_, dg, dlp, dst, ddh};
    for (int k = 0; k < 7; k++) sph_ctx_free(ctx, ps[k]);
    sph_ctx_destroy(ctx);
    free(h), free(w), free(tgt), free(g), free(lp), free(dh), free(z);
}

/* Workspace bytes of a bf16 pass (backward: bf16 gradients) under the current environment
 * switches (read at context creation). */
static size_t ws_bytes_of(sph_head_pass pass, int64_t N, int64_t H, int64_t V,
                          int64_t chunk_bytes) {
    hcase c;
    hc_init(&c, &g_rng, N, H, V, V, 0, 0, SPH_BF16);
    c.gdt = SPH_BF16;
    hc_wire(&c, pass == SPH_HEAD_FORWARD ? HC_LP : HC_G | HC_DH | HC_DW);
    sph_ctx_t g = gpu_ctx(chunk_bytes, 0, NULL);
    mirror m;
    mirror_make(g, &c.a, &m);
    size_t bytes = 0;
    expect_ok(sph_head_workspace_size(g, pass, &m.a, &bytes));
    mirror_free(g, &m);
    sph_ctx_destroy(g);
    hc_free(&c);
    return bytes;
}
static size_t fwd_ws_bytes(int64_t N, int64_t H, int64_t V) {
    return ws_bytes_of(SPH_HEAD_FORWARD, N, H, V, 0);
}

/* The gradient sweep orders against the float64 reference: vocabulary-outer (chosen when the
 * fp32 dH of the computed rows is smaller than an fp32 dW of the shard: half-precision dW,
 * N_active < V_loc) and row-outer (SPH_CUDA_FLAG_NO_COLOUTER), with small budgets so that row
 * chunks and vocabulary splits both number several (split-sized dW accumulator, dH
 * accumulated over splits), gathered spans, no spans, accumulation, one-pass (a small budget:
 * statistics of every chunk, then the sweep; the default budget: staged chunks); and the
 * dense-backward ablation
 * (SPH_CUDA_FLAG_DENSE_BACKWARD) on a masked case. The vocabulary-outer workspace must leave out
 * the shard's fp32 dW accumulator. Any compute capability. */
static void test_sweep(void **state) {
    (void)state;
    cuda_switch(SPH_CUDA_FLAG_DENSE_BACKWARD, 0);
    /* a 48 MiB budget, rows that need two chunks: cuBLAS's 32 MiB slice + a 51 MB fp32 dW
     * accumulator exceed it (row-outer), cuBLAS + a 2 MB fp32 dH accumulator and a split-sized
     * dW one do not (vocabulary-outer) */
    const int64_t budget = (int64_t)48 << 20;
    cuda_switch(SPH_CUDA_FLAG_NO_COLOUTER, 1);
    size_t ws_row = ws_bytes_of(SPH_HEAD_BACKWARD, 4096, 128, 100000, budget);
    cuda_switch(SPH_CUDA_FLAG_NO_COLOUTER, 0);
    size_t ws_col = ws_bytes_of(SPH_HEAD_BACKWARD, 4096, 128, 100000, budget);
    if (!(ws_col <= (size_t)budget + 4096 && ws_row > (size_t)budget + 4096)) { /* + rounding */
        print_error("test_sweep: backward workspace %zu bytes vocabulary-outer, %zu row-outer, "
                    "budget %lld: expected only row-outer over it\n", ws_col, ws_row,
                    (long long)budget);
        fail();
    }
    int ok = 1;
    for (int m = 0; m < 2; m++) {
        cuda_switch(SPH_CUDA_FLAG_NO_COLOUTER, m == 1);
        gcfg f = base(SPH_BF16, 400, 72, 5000); /* gathered spans, chunks x splits */
        f.gdt = SPH_BF16, f.chunk_bytes = 256 * 1024, f.mask_frac = 0.5, f.use_spans = 1;
        f.acc = 1;
        ok &= run_cfg(&f);
        f = base(SPH_F16, 300, 64, 3000); /* no spans: half dH accumulated over splits */
        f.gdt = SPH_F16, f.chunk_bytes = 128 * 1024, f.cap = 4.0;
        ok &= run_cfg(&f);
        f = base(SPH_BF16, 257, 136, 4000); /* one-pass */
        f.gdt = SPH_BF16, f.one_pass = 1, f.mask_frac = 0.7, f.use_spans = 1;
        f.chunk_bytes = 256 * 1024;
        ok &= run_cfg(&f);
        f.chunk_bytes = 0; /* one chunk: dW written directly */
        ok &= run_cfg(&f);
    }
    cuda_switch(SPH_CUDA_FLAG_NO_COLOUTER, 0);
    cuda_switch(SPH_CUDA_FLAG_DENSE_BACKWARD, 1);
    gcfg f = base(SPH_BF16, 300, 72, 2000);
    f.gdt = SPH_BF16, f.mask_frac = 0.4, f.use_spans = 1, f.chunk_bytes = 256 * 1024;
    ok &= run_cfg(&f);
    f.gdt = SPH_F32, f.acc = 1;
    ok &= run_cfg(&f);
    cuda_switch(SPH_CUDA_FLAG_NO_COLOUTER, -1);
    cuda_switch(SPH_CUDA_FLAG_DENSE_BACKWARD, -1);
    assert_true(ok);
}

/* The general path's sm_90a fused epilogues (row statistics from the logits in registers,
 * dlogits written straight from them) against the float64 reference, each case with the
 * fused kernels on (default) and off (SPH_CUDA_FLAG_NO_FUSED: cuBLAS + staged fp32 logits):
 * one row, rows and columns straddling the 128 x 256 tiles, H % 64 != 0, gathered spans with
 * softcap and temperature, one-pass through the recomputing sweep, a TP shard with
 * accumulation, and a small budget that splits the vocabulary in both passes (records
 * merged across splits). On an sm_90 device the fused forward must be live: its workspace
 * holds no staged logits. */
static void test_fused(void **state) {
    (void)state;
    if (!device_is_sm90()) {
        test_skip("device 0 is not sm_90: the fused sm_90a epilogues were not exercised");
    }
    cuda_switch(SPH_CUDA_FLAG_NO_FUSED, 1);
    size_t ws_off = fwd_ws_bytes(2048, 256, 50000);
    cuda_switch(SPH_CUDA_FLAG_NO_FUSED, 0);
    size_t ws_on = fwd_ws_bytes(2048, 256, 50000);
    if (!(ws_on < ws_off / 4)) {
        print_error("test_fused: forward workspace %zu bytes fused vs %zu unfused: the fused "
                    "path is not taken\n", ws_on, ws_off);
        fail();
    }
    int ok = 1;
    for (int m = 0; m < 2; m++) {
        cuda_switch(SPH_CUDA_FLAG_NO_FUSED, m == 1);
        gcfg f = base(SPH_BF16, 1, 8, 13);
        ok &= run_cfg(&f);
        f = base(SPH_BF16, 700, 520, 3000); /* gathered spans, several k boxes and tiles */
        f.mask_frac = 0.6, f.use_spans = 1, f.cap = 5.0, f.temp = 0.8;
        ok &= run_cfg(&f);
        f = base(SPH_F16, 257, 136, 2049); /* one-pass; a small budget: the fused sweep */
        f.one_pass = 1, f.gdt = SPH_F16, f.mask_frac = 0.7, f.use_spans = 1;
        f.chunk_bytes = 256 * 1024;
        ok &= run_cfg(&f);
        f = base(SPH_BF16, 300, 264, 1000); /* TP shard, accumulate, no entropy */
        f.v0 = 300, f.V = 2000, f.acc = 1, f.entropy = 0, f.gdt = SPH_BF16;
        ok &= run_cfg(&f);
        f = base(SPH_BF16, 400, 72, 5000); /* small budget: vocabulary splits in both passes */
        f.chunk_bytes = 256 * 1024, f.mask_frac = 0.5;
        ok &= run_cfg(&f);
        f.one_pass = 1, f.use_spans = 1;
        ok &= run_cfg(&f);
    }
    cuda_switch(SPH_CUDA_FLAG_NO_FUSED, -1);
    assert_true(ok);
}

/* The sm_90a logits of (R x H) . (Vs x H)^T under schedule sched (SPH_SM90_SCHED_PINGPONG or
 * _COOPERATIVE), copied to the host (R x Vs fp32; the caller frees it). */
static float *sm90_logits_under(int sched, sph_dtype dt, const void *dh, const void *dw,
                                int64_t R, int64_t Vs, int64_t H) {
    schedule_force(sched);
    float *L = malloc((size_t)(R * Vs) * 4), *dL = NULL;
    assert_non_null(L);
    assert_int_equal(cudaMalloc((void **)&dL, (size_t)(R * Vs) * 4), cudaSuccess);
    assert_int_equal(cudaMemset(dL, 0xff, (size_t)(R * Vs) * 4), cudaSuccess); /* NaN poison */
    expect_ok(logits_sm90(dt, dh, dw, dL, Vs, R, Vs, H));
    assert_int_equal(cudaMemcpy(L, dL, (size_t)(R * Vs) * 4, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    cudaFree(dL);
    return L;
}

/* The two schedules of the sm_90a kernel, each forced (schedule_force; by default H
 * picks): ping-pong (a 64 x 256 tile per consumer warpgroup, the epilogue of one under the
 * other's main loop) and cooperative (128 x 256 tiles shared by both). Each against
 * the float64 reference (the logits kernel and the fused general path, one-pass included),
 * with tile counts below the SM count (one tile per block, the second warpgroup idle), odd
 * and even per block, and several per warpgroup; and the logits bitwise equal between the
 * schedules (which one runs must not change a value). */
static void test_pingpong(void **state) {
    (void)state;
    if (!device_is_sm90()) {
        test_skip("device 0 is not sm_90: the sm_90a schedules were not exercised");
    }
    const int modes[2] = {SPH_SM90_SCHED_PINGPONG, SPH_SM90_SCHED_COOPERATIVE};
    int ok = 1;
    for (int m = 0; m < 2; m++) {
        schedule_force(modes[m]);
        ok &= sm90_kernel_case(SPH_BF16, 1100, 9000, 136, 9001); /* 648 / 324 tiles */
        ok &= sm90_kernel_case(SPH_F16, 65, 300, 64, 300);       /* 4 / 2 tiles */
        gcfg f = base(SPH_BF16, 1100, 264, 7000); /* gathered spans, ~3 tiles per warpgroup */
        f.mask_frac = 0.6, f.use_spans = 1, f.cap = 5.0, f.temp = 0.8;
        ok &= run_cfg(&f);
        f = base(SPH_F16, 193, 72, 3000); /* one-pass through the recomputing sweep */
        f.one_pass = 1, f.gdt = SPH_F16, f.mask_frac = 0.7, f.use_spans = 1;
        f.chunk_bytes = 256 * 1024;
        ok &= run_cfg(&f);
    }
    /* bitwise: the same operands under both schedules */
    const int64_t R = 777, Vs = 3001, H = 136;
    uint16_t *h = malloc((size_t)((R + Vs) * H) * 2);
    assert_non_null(h);
    for (int64_t i = 0; i < (R + Vs) * H; i++)
        h[i] = sph_f32_to_bf16((float)(2.0 * rng_uniform(&g_rng) - 1.0));
    void *dh = NULL;
    assert_int_equal(cudaMalloc(&dh, (size_t)((R + Vs) * H) * 2), cudaSuccess);
    assert_int_equal(cudaMemcpy(dh, h, (size_t)((R + Vs) * H) * 2, cudaMemcpyHostToDevice),
                     cudaSuccess);
    const void *dw = (const uint16_t *)dh + R * H;
    float *Lp = sm90_logits_under(SPH_SM90_SCHED_PINGPONG, SPH_BF16, dh, dw, R, Vs, H);
    float *Lc = sm90_logits_under(SPH_SM90_SCHED_COOPERATIVE, SPH_BF16, dh, dw, R, Vs, H);
    for (int64_t i = 0; i < R * Vs; i++)
        if (memcmp(&Lp[i], &Lc[i], 4) || Lp[i] != Lp[i]) {
            print_error("test_pingpong: logit (%lld, %lld) is %.9g ping-pong, %.9g cooperative; "
                        "seed %llu\n", (long long)(i / Vs), (long long)(i % Vs), Lp[i], Lc[i],
                        (unsigned long long)test_seed());
            ok = 0;
            break;
        }
    cudaFree(dh), free(h), free(Lp), free(Lc);
    schedule_force(-1);
    assert_true(ok);
}

/* Issue 23's kernel versions, each forced on, against the float64 reference (and the check
 * that the version's path was taken):
 * - E_TWO_CHUNKS: staged E whose whole-shard rows miss the budget by a little: two chunks,
 *   the second accumulating into the half-precision dW (no fp32 dW accumulator: the one-pass
 *   workspace shrinks); plain rows and gathered spans, bf16 and f16, accumulate.
 * - DH_SPLITK: short chunks (300 rows) over a 20001-column shard, one split: dH cut into 8
 *   vocabulary pieces (plus the 33 remainder columns) and summed; one-pass (staged E), general
 *   (vocabulary-outer sweep), fused and unfused, accumulate, f16 / bf16 / fp32 dH (the
 *   workspace grows by the partials).
 * - E2D_OVERLAP: staged E made block by block on the side stream under the dH GEMMs (blocks
 *   forced small); gathered spans, accumulate, temperature, fp32 gradients.
 * - E2D_OVERLAP and DH_SPLITK under CUDA graph capture (captured_equal). */
static size_t onepass_ws(int64_t N, int64_t H, int64_t V, int64_t chunk_bytes, int acc) {
    hcase c;
    hc_init(&c, &g_rng, N, H, V, V, 0, 0, SPH_BF16);
    c.gdt = SPH_BF16;
    hc_wire(&c, HC_LP | HC_G | HC_DH | HC_DW); /* forward with the gradients: one-pass */
    c.a.accumulate_dhidden = c.a.accumulate_dweight = acc;
    sph_ctx_t g = gpu_ctx(chunk_bytes, 0, NULL);
    mirror m;
    mirror_make(g, &c.a, &m);
    size_t bytes = 0;
    expect_ok(sph_head_workspace_size(g, SPH_HEAD_FORWARD, &m.a, &bytes));
    mirror_free(g, &m);
    sph_ctx_destroy(g);
    hc_free(&c);
    return bytes;
}

/* A pass under a switch captured into a CUDA graph (first, so the switch's lazily made state,
 * E2D_OVERLAP's side stream and events, is made during the capture), replayed twice, then run
 * directly: logprob, dhidden, dweight bitwise equal. one_pass: the forward with the
 * gradients; else forward + backward. */
static int captured_equal(uint32_t flag, int64_t N, int64_t H, int64_t V, int one_pass,
                          int64_t e2d_rows) {
    cudaStream_t st;
    assert_int_equal(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    cuda_switch(flag, 1);
    hcase c;
    hc_init(&c, &g_rng, N, H, V, V, 0, 0, SPH_BF16);
    c.gdt = SPH_BF16;
    hc_wire(&c, HC_LP | HC_ENT | HC_G | HC_E | HC_DH | HC_DW);
    hc_poison(&c);
    sph_ctx_t g = gpu_ctx(0, 0, st);
    ((sph_cuda_state *)g->cuda)->e2d_rows = e2d_rows;
    mirror m;
    mirror_make(g, &c.a, &m);
    sph_head_args fa = m.a;
    if (!one_pass) fa.dhidden = fa.dweight = NULL;
    size_t bf = 0, bb = 0;
    expect_ok(sph_head_workspace_size(g, SPH_HEAD_FORWARD, &fa, &bf));
    if (!one_pass) expect_ok(sph_head_workspace_size(g, SPH_HEAD_BACKWARD, &m.a, &bb));
    size_t bytes = bf > bb ? bf : bb;
    void *ws = NULL;
    expect_ok(sph_ctx_malloc(g, bytes, &ws));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    assert_int_equal(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    sph_status s = sph_head_forward(g, &fa, ws, bytes);
    if (s == SPH_OK && !one_pass) s = sph_head_backward(g, &m.a, ws, bytes);
    cudaError_t ce = cudaStreamEndCapture(st, &graph);
    if (s != SPH_OK) print_error("capture (flag 0x%x): %s\n", flag, sph_last_error());
    assert_int_equal(s, SPH_OK);
    assert_int_equal(ce, cudaSuccess);
    assert_int_equal(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int k = 0; k < 2; k++) assert_int_equal(cudaGraphLaunch(exec, st), cudaSuccess);
    expect_ok(sph_ctx_synchronize(g));
    mirror_back(g, &m);
    const size_t nl = (size_t)N * 4, nh = (size_t)(N * H) * 2, nw = (size_t)(V * H) * 2;
    void *lp = hc_dup(c.lp, nl), *dh = hc_dup(c.dh, nh), *dw = hc_dup(c.dw, nw);
    const int pipelined = ((sph_cuda_state *)g->cuda)->e2d_blocks_run;
    /* the direct run after poisoning the outputs */
    expect_ok(sph_ctx_memset(g, m.dev[5], 0xff, m.bytes[5]));
    expect_ok(sph_ctx_memset(g, m.dev[14], 0xff, m.bytes[14]));
    expect_ok(sph_ctx_memset(g, m.dev[15], 0xff, m.bytes[15]));
    expect_ok(sph_head_forward(g, &fa, ws, bytes));
    if (!one_pass) expect_ok(sph_head_backward(g, &m.a, ws, bytes));
    expect_ok(sph_ctx_synchronize(g));
    mirror_back(g, &m);
    int ok = !memcmp(lp, c.lp, nl) && !memcmp(dh, c.dh, nh) && !memcmp(dw, c.dw, nw);
    if (!ok) print_error("captured_equal(flag 0x%x, %lld x %lld x %lld, one_pass %d): the graph's "
                         "outputs differ from the direct run's\n", flag, (long long)N,
                         (long long)H, (long long)V, one_pass);
    if (flag == SPH_CUDA_FLAG_E2D_OVERLAP && pipelined < 1) {
        print_error("captured_equal: E2D_OVERLAP did not pipeline the captured pass\n");
        ok = 0;
    }
    free(lp), free(dh), free(dw);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    sph_ctx_free(g, ws);
    mirror_free(g, &m);
    sph_ctx_destroy(g);
    cudaStreamDestroy(st);
    hc_free(&c);
    cuda_switch(flag, -1);
    return ok;
}

static void test_issue23(void **state) {
    (void)state;
    if (!device_is_sm90()) {
        test_skip("device 0 is not sm_90: the staged-E paths of issue 23 were not exercised");
    }
    /* Sizes: each case's float64 references (ref_run + the independent backward) cost ~5
     * N H V multiply-adds on the host, the whole test ~1.5e9 x 5 (run 25a's 2001 x 72 x 5000
     * and 300 x 136 x 20001 cases made ~1e10 x 5 and ran past 100 s). A failing group ends
     * the test at once (goto out), so a failure never runs into the step's limit. */
    int ok = 1;
    const uint32_t all = SPH_CUDA_FLAG_E_TWO_CHUNKS | SPH_CUDA_FLAG_DH_SPLITK |
                         SPH_CUDA_FLAG_E2D_OVERLAP | SPH_CUDA_FLAG_DW32_BETA0 |
                         SPH_CUDA_FLAG_NO_FUSED | SPH_CUDA_FLAG_NO_GATHER;
    /* E_TWO_CHUNKS: N 1300 x V 2400 (x H 72): the whole shard's E and records 6.6 MB beside
     * cuBLAS's 32 MiB, half of it 3.3 MB; in a 39 MB budget the default takes 2 chunks of 650
     * rows behind a 0.7 MB fp32 dW accumulator, the switch the same chunks without it (the
     * premises: tests/unit/test_cuda_layout.c test_issue23). Accumulating into dW declines
     * it (the same workspace as the default), and is still checked. */
    const int64_t b39 = 39000000;
    cuda_switch(SPH_CUDA_FLAG_E_TWO_CHUNKS, 0);
    const size_t e_off = onepass_ws(1300, 72, 2400, b39, 0);
    cuda_switch(SPH_CUDA_FLAG_E_TWO_CHUNKS, 1);
    const size_t e_on = onepass_ws(1300, 72, 2400, b39, 0);
    const size_t e_acc = onepass_ws(1300, 72, 2400, b39, 1);
    if (!(e_on != e_off && (int64_t)e_on <= b39)) { /* the switch changes nothing else */
        print_error("test_issue23: E_TWO_CHUNKS one-pass workspace %zu vs %zu without: the "
                    "two-chunk layout was not taken\n", e_on, e_off);
        ok = 0;
    }
    if (e_acc != e_off) {
        print_error("test_issue23: E_TWO_CHUNKS with accumulate: workspace %zu, expected the "
                    "default's %zu (declined)\n", e_acc, e_off);
        ok = 0;
    }
    {
        gcfg f = base(SPH_BF16, 1300, 72, 2400);
        f.one_pass = 1, f.gdt = SPH_BF16, f.chunk_bytes = b39;
        ok &= run_cfg(&f);
        f.acc = 1, f.entropy = 0; /* declined: the fp32 accumulator */
        ok &= run_cfg(&f);
        f = base(SPH_F16, 1300, 72, 2400); /* gathered spans */
        f.one_pass = 1, f.gdt = SPH_F16, f.chunk_bytes = b39, f.mask_frac = 0.9, f.use_spans = 1;
        ok &= run_cfg(&f);
    }
    cuda_switch(SPH_CUDA_FLAG_E_TWO_CHUNKS, -1);
    if (!ok) goto out;
    /* DW32_BETA0: the fp32 dW accumulator written by the first chunk (no memset), workspaces
     * poisoned with NaN so a skipped zeroing cannot pass: one-pass staged E in 2 chunks (the
     * shape above, default layout), accumulate; the general path's row-outer sweep over
     * several spans without gathering (a chunk per span) */
    cuda_switch(SPH_CUDA_FLAG_E_TWO_CHUNKS, 0);
    cuda_switch(SPH_CUDA_FLAG_DW32_BETA0, 1);
    g_poison_ws = 1, g_dw32_saved = 0;
    {
        gcfg f = base(SPH_BF16, 1300, 72, 2400);
        f.one_pass = 1, f.gdt = SPH_BF16, f.chunk_bytes = b39, f.acc = 1;
        ok &= run_cfg(&f);
        cuda_switch(SPH_CUDA_FLAG_NO_GATHER, 1);
        f = base(SPH_BF16, 700, 72, 2400); /* general: forward, then the backward */
        f.gdt = SPH_BF16, f.mask_frac = 0.5, f.use_spans = 1;
        ok &= run_cfg(&f);
        cuda_switch(SPH_CUDA_FLAG_NO_GATHER, -1);
    }
    g_poison_ws = 0;
    if (g_dw32_saved < 2) {
        print_error("test_issue23: DW32_BETA0 skipped %d memsets, expected 2: the path was "
                    "not taken\n", g_dw32_saved);
        ok = 0;
    }
    cuda_switch(SPH_CUDA_FLAG_DW32_BETA0, -1);
    cuda_switch(SPH_CUDA_FLAG_E_TWO_CHUNKS, -1);
    if (!ok) goto out;
    /* DH_SPLITK: 200 rows x 6200 columns (x H 72): 3 pieces of 2064 + 8 remainder columns */
    cuda_switch(SPH_CUDA_FLAG_DH_SPLITK, 0);
    const size_t bw_off = ws_bytes_of(SPH_HEAD_BACKWARD, 200, 72, 6200, 0);
    cuda_switch(SPH_CUDA_FLAG_DH_SPLITK, 1);
    const size_t bw_on = ws_bytes_of(SPH_HEAD_BACKWARD, 200, 72, 6200, 0);
    if (!(bw_on >= bw_off + (size_t)3 * 200 * 72 * 4)) {
        print_error("test_issue23: DH_SPLITK backward workspace %zu vs %zu without: the split "
                    "dH was not taken\n", bw_on, bw_off);
        ok = 0;
    }
    for (int m = 0; m < 2; m++) {
        cuda_switch(SPH_CUDA_FLAG_NO_FUSED, m == 1);
        gcfg f = base(SPH_BF16, 200, 72, 6200); /* general, fp32 dH */
        ok &= run_cfg(&f);
        f.gdt = SPH_BF16, f.acc = 1, f.mask_frac = 0.5, f.use_spans = 1;
        ok &= run_cfg(&f);
        f = base(SPH_F16, 200, 72, 6200); /* one-pass (staged E when fused) */
        f.one_pass = 1, f.gdt = SPH_F16;
        ok &= run_cfg(&f);
        f.acc = 1, f.temp = 0.7;
        ok &= run_cfg(&f);
    }
    cuda_switch(SPH_CUDA_FLAG_NO_FUSED, -1);
    cuda_switch(SPH_CUDA_FLAG_DH_SPLITK, -1);
    if (!ok) goto out;
    /* E2D_OVERLAP: blocks of 136 rows (8 blocks of the 1000-row chunk, a short last one) */
    cuda_switch(SPH_CUDA_FLAG_E2D_OVERLAP, 1);
    g_e2d_rows = 136, g_e2d_pipelined = 0;
    {
        gcfg f = base(SPH_BF16, 1000, 72, 2001);
        f.one_pass = 1, f.gdt = SPH_BF16;
        ok &= run_cfg(&f);
        f.acc = 1, f.mask_frac = 0.7, f.use_spans = 1; /* gathered: fp32 dH rows, scattered */
        ok &= run_cfg(&f);
        f = base(SPH_F16, 1000, 72, 2001); /* (a softcap with dlogit_mean declines staged E) */
        f.one_pass = 1, f.gdt = SPH_F32, f.temp = 0.8;
        ok &= run_cfg(&f);
    }
    if (g_e2d_pipelined < 3) {
        print_error("test_issue23: E2D_OVERLAP pipelined %d chunks, expected >= 3: the "
                    "overlapped path was not taken\n", g_e2d_pipelined);
        ok = 0;
    }
    g_e2d_rows = 0;
    cuda_switch(SPH_CUDA_FLAG_E2D_OVERLAP, -1);
    if (!ok) goto out;
    /* under graph capture: the side stream forks and joins inside the graph; split dH */
    ok &= captured_equal(SPH_CUDA_FLAG_E2D_OVERLAP, 1000, 72, 2001, 1, 136);
    ok &= captured_equal(SPH_CUDA_FLAG_DH_SPLITK, 200, 72, 6200, 1, 0);
    ok &= captured_equal(SPH_CUDA_FLAG_DH_SPLITK, 200, 72, 6200, 0, 0);
out:
    cuda_switch(all, -1);
    g_e2d_rows = 0, g_poison_ws = 0;
    assert_true(ok);
}

int main(void) {
    if (sph_cuda_device_count() == 0) {
        printf("no CUDA device: skipping\n");
        return 77;
    }
    rng_seed(&g_rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parity_grid),   cmocka_unit_test(test_bi_parity),
        cmocka_unit_test(test_span_gaps),
        cmocka_unit_test(test_errors),        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_batch_invariance), cmocka_unit_test(test_bi_sm90),
        cmocka_unit_test(test_fused),         cmocka_unit_test(test_sweep),
        cmocka_unit_test(test_pingpong),      cmocka_unit_test(test_issue23),
        cmocka_unit_test(test_graph_capture), cmocka_unit_test(test_no_active_acc),
        cmocka_unit_test(test_huge),
    };
    /* SPH_GPU_TESTS=name1,name2 runs a subset (compute-sanitizer runs use it);
     * SPH_GPU_TESTS=-name1,-name2 runs all but those. A selection is said, not skipped. */
    const char *only = getenv("SPH_GPU_TESTS");
    int failed;
    if (only && *only) {
        struct CMUnitTest sel[sizeof tests / sizeof tests[0]];
        size_t n = 0;
        const int exclude = only[0] == '-';
        for (size_t k = 0; k < sizeof tests / sizeof tests[0]; k++) {
            char key[64];
            snprintf(key, sizeof key, "%s%s", exclude ? "-" : "", tests[k].name);
            int named = 0;
            for (const char *p = strstr(only, key); p && !named; p = strstr(p + 1, key)) {
                char after = p[strlen(key)];
                named = (p == only || p[-1] == ',') && (after == 0 || after == ',');
            }
            if (named != exclude) sel[n++] = tests[k];
        }
        printf("SPH_GPU_TESTS=%s: running %zu of %zu tests\n", only, n,
               sizeof tests / sizeof tests[0]);
        failed = _cmocka_run_group_tests("test_head_cuda(subset)", sel, n, NULL, NULL);
    } else {
        failed = cmocka_run_group_tests(tests, NULL, NULL);
    }
    tol_report("head_cuda");
    return test_exit(failed);
}
#endif /* SPH_HAVE_CUDA */
