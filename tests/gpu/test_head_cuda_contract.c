/*
 * test_head_cuda_contract.c - the appended head outputs of issue 25 on CUDA: sum_p2
 * (sum_j p_ij^2) and the top-k of the distribution (topk_ids, topk_logprobs), from the CUDA
 * backend (the cuBLAS / staged path plus head_extras.cu, describe's "+extras") and from the
 * staged reference, against float64 computations written in the tests (an independent dense
 * sum p^2; topk_check.h's full-sort oracle): bf16 and f32, awkward vocabularies (613, 1601),
 * several vocabulary splits and row chunks (small chunk_bytes), masks with several spans
 * (gathered chunks), temperature and softcap, K = 1, 64, 256, one-pass (staged fp32 chunks and
 * the recomputing sweep), the batch-invariant mode; sum_p2 alone on the plain pass's path by
 * default (the fused statistics epilogue on sm_90a: staged E, the sweep, several splits,
 * N = 1) and staged under SPH_CUDA_FLAG_EXTRAS_STAGED; top-k by default on the plain pass's
 * path too (its candidates in the same epilogue: K = 1, 7, 64, 256, splits,
 * spans, staged E, the sweep, rows at tile edges, and the overflow's recompute through a
 * candidate buffer shrunk by SPH_TEST_TOPK_CAP; the thresholds seeded from a sample, off, and
 * biased so that seeds fail and their rows recompute: SPH_TEST_TOPK_SEED; exact ties at the
 * seed value); inactive rows exactly 0 / (-1, 0); the
 * buffers poisoned before each run. Also sum_p2 with candidates (the support's softmax,
 * head_sample.cu + head_extras.cu's finalize) against a float64 support oracle, masked and
 * one-pass (test_sum_p2_support). Skips (exit 77) without CUDA or without a device.
 */
#ifndef SPH_HAVE_CUDA
#include <stdio.h>
int main(void) {
    printf("test_head_cuda_contract: spanhead was built without CUDA: skipping\n");
    return 77;
}
#else
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../parity/test_head_case.h"
#include "../parity/topk_check.h"

static sph_rng g_rng;

#include "case_mirror.h"

/* sum_j p_ij^2 of row i over the whole case, float64, no shifted record. */
static double indep_sum_p2(const hcase *c, int64_t i, double T, double cap) {
    double *z = hc_alloc((size_t)c->V_loc * 8), m = -INFINITY, S = 0, Q = 0;
    for (int64_t j = 0; j < c->V_loc; j++) {
        const double u = hc_u(c, i, j);
        z[j] = (cap > 0 ? cap * tanh(u / cap) : u) / T;
        if (z[j] > m) m = z[j];
    }
    for (int64_t j = 0; j < c->V_loc; j++) S += exp(z[j] - m);
    for (int64_t j = 0; j < c->V_loc; j++) {
        const double p = exp(z[j] - m) / S;
        Q += p * p;
    }
    free(z);
    return Q;
}

typedef struct xcase {
    const char *kernel;
    sph_dtype dt;
    int64_t N, H, V, K;
    int sp2, masked, one_pass, bi;
    uint32_t flags;
    int64_t chunk_bytes;
    double T, cap;
    int64_t tk_cap; /* > 0: SPH_TEST_TOPK_CAP for this context (the fused top-k's overflow) */
    int ties;       /* > 0: weight row j a copy of row j % ties, so each row's logits take
                       `ties` values, repeated (1: all equal, the fused top-k's massive ties:
                       the lowest K ids, every candidate at T; more: exact ties at the seed) */
    const char *seed; /* SPH_TEST_TOPK_SEED for this context: "off" (no sampled seed), or a
                         bias added to every seed ("inf": every row's seed fails) */
} xcase;

static void *dev_copy(sph_ctx_t g, const void *h, size_t bytes) {
    void *d = NULL;
    expect_ok(sph_ctx_malloc(g, bytes ? bytes : 1, &d));
    if (bytes) expect_ok(sph_ctx_memcpy(g, d, h, bytes));
    return d;
}

/* SPH_TEST_TOPK_VARIANT for the contexts run_case creates (NULL: unset): the fused top-k's
 * v25 count (1), block merge (2), K-th seed (4), v25's stage at 6 entries (8) and v31's
 * per-row kernels (16), which must give the same lists */
static const char *g_variant;

static int run_case(const xcase *x) {
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.device = (sph_device){SPH_DEVICE_CUDA, 0};
    o.force_kernel = x->kernel;
    o.chunk_bytes = x->chunk_bytes;
    o.batch_invariant = x->bi;
    o.cuda_flags = x->flags;
    sph_ctx_t g = NULL;
    char capv[32];
    snprintf(capv, sizeof capv, "%lld", (long long)x->tk_cap);
    if (x->tk_cap > 0) setenv("SPH_TEST_TOPK_CAP", capv, 1);
    if (x->seed) setenv("SPH_TEST_TOPK_SEED", x->seed, 1);
    if (g_variant) setenv("SPH_TEST_TOPK_VARIANT", g_variant, 1);
    expect_ok(sph_ctx_create(&g, &o));
    unsetenv("SPH_TEST_TOPK_CAP");
    unsetenv("SPH_TEST_TOPK_SEED");
    unsetenv("SPH_TEST_TOPK_VARIANT");
    hcase c;
    hc_init(&c, &g_rng, x->N, x->H, x->V, x->V, 0, 0, x->dt);
    if (x->ties)
        for (int64_t j = 1; j < c.V_loc; j++)
            for (int64_t k = 0; k < c.H; k++)
                hc_set(c.w, x->dt, j * c.H + k, hc_get(c.w, x->dt, (j % x->ties) * c.H + k));
    if (x->masked) hc_mask_ragged(&c, &g_rng, 0.6);
    hc_wire(&c, HC_OUTS | (x->masked ? HC_MASK | HC_SPANS : 0) |
                    (x->one_pass ? HC_UPS | HC_DH | HC_DW : 0));
    c.a.temperature = x->T, c.a.softcap = x->cap;
    hc_poison(&c);
    const int64_t N = c.N, K = x->K;
    float *sp2 = hc_alloc((size_t)N * 4), *lp = hc_alloc((size_t)(N * K + 1) * 4);
    int64_t *ids = hc_alloc((size_t)(N * K + 1) * 8);
    poison_f32(sp2, (size_t)N);
    poison_f32(lp, (size_t)(N * K));
    for (int64_t k = 0; k < N * K; k++) ids[k] = 0x5a5a5a5a5aLL;
    void *dsp2 = dev_copy(g, sp2, (size_t)N * 4), *dlp = dev_copy(g, lp, (size_t)(N * K) * 4);
    void *dids = dev_copy(g, ids, (size_t)(N * K) * 8);
    int64_t sh1[1], shi[2], shl[2];
    sph_tensor ts = tensor1(dsp2, SPH_F32, sh1, N), ti = tensor2(dids, SPH_I64, shi, N, K),
               tl = tensor2(dlp, SPH_F32, shl, N, K);
    ts.device = ti.device = tl.device = (sph_device){SPH_DEVICE_CUDA, 0};
    mirror m;
    mirror_make(g, &c, &m);
    c.a.sum_p2 = x->sp2 ? &ts : NULL;
    if (K) c.a.topk_ids = &ti, c.a.topk_logprobs = &tl;
    /* the plain pass's path (the same call without the extras) */
    const sph_tensor *keep_sp2 = c.a.sum_p2, *keep_ti = c.a.topk_ids, *keep_tl = c.a.topk_logprobs;
    c.a.sum_p2 = c.a.topk_ids = c.a.topk_logprobs = NULL;
    sph_head_pass_info plain = SPH_HEAD_PASS_INFO_INIT;
    expect_ok(sph_head_describe(g, SPH_HEAD_FORWARD, &c.a, &plain));
    c.a.sum_p2 = keep_sp2, c.a.topk_ids = keep_ti, c.a.topk_logprobs = keep_tl;
    size_t bytes = 0;
    expect_ok(sph_head_workspace_size(g, SPH_HEAD_FORWARD, &c.a, &bytes));
    sph_head_pass_info info = SPH_HEAD_PASS_INFO_INIT;
    expect_ok(sph_head_describe(g, SPH_HEAD_FORWARD, &c.a, &info));
    void *dws = NULL;
    expect_ok(sph_ctx_malloc(g, bytes ? bytes : 1, &dws));
    expect_ok(sph_head_forward(g, &c.a, dws, bytes));
    expect_ok(sph_ctx_synchronize(g));
    sph_ctx_free(g, dws);
    mirror_back(g, &m);
    expect_ok(sph_ctx_memcpy(g, sp2, dsp2, (size_t)N * 4));
    expect_ok(sph_ctx_memcpy(g, lp, dlp, (size_t)(N * K) * 4));
    expect_ok(sph_ctx_memcpy(g, ids, dids, (size_t)(N * K) * 8));
    char cs[240];
    snprintf(cs, sizeof cs, "cuda(kernel=%s,path=%s,%s,N=%lld,V=%lld,K=%lld,sp2=%d,mask=%d,"
                            "one_pass=%d,bi=%d,flags=%u,chunk=%lld,T=%g,cap=%g,tk_cap=%lld,"
                            "ties=%d,seed=%s,variant=%s)",
             x->kernel ? x->kernel : "cuda", info.path, sph_dtype_name(x->dt), (long long)N,
             (long long)x->V, (long long)K, x->sp2, x->masked, x->one_pass, x->bi, x->flags,
             (long long)x->chunk_bytes, x->T, x->cap, (long long)x->tk_cap, x->ties,
             x->seed ? x->seed : "-", g_variant ? g_variant : "-");
    int ok = 1;
    if (!x->kernel && !strstr(info.path, "+extras")) {
        fprintf(stderr, "FAIL %s: describe's path does not name the extras\n", cs);
        ok = 0;
    }
    /* the extras ride in the plain pass's kernels (the fused statistics epilogue where the
     * plain pass is fused) unless EXTRAS_STAGED: the same path word, plus the extras */
    char want[sizeof plain.path + 8];
    snprintf(want, sizeof want, "%s+extras", plain.path);
    if (!x->kernel && !(x->flags & SPH_CUDA_FLAG_EXTRAS_STAGED) && strcmp(info.path, want)) {
        fprintf(stderr, "FAIL %s: the extras took path %s, the plain pass %s\n", cs, info.path,
                plain.path);
        ok = 0;
    }
    const double tol = x->dt.bits == 32 ? TOL_CUDA_F32 : TOL_CUDA_HALF_ROWS;
    uint8_t *act = hc_alloc((size_t)N);
    hc_active(&c, act);
    if (x->sp2) {
        double md = 0, mr = 0;
        int64_t worst = -1;
        for (int64_t i = 0; i < N; i++) {
            const double ref = act[i] ? indep_sum_p2(&c, i, x->T, x->cap) : 0;
            if (!act[i] && sp2[i] != 0.0f) ok = 0, worst = i;
            const double d = fabs((double)sp2[i] - ref);
            if (!(d <= md)) md = d, worst = i;
            if (fabs(ref) > mr) mr = fabs(ref);
        }
        if (!(md <= tol * (mr > 0 ? mr : 1)) || !ok) {
            fprintf(stderr, "FAIL sum_p2 %s: normwise error %.3e (row %lld: %.9g); seed %llu\n", cs,
                    md / (mr > 0 ? mr : 1), (long long)worst, worst >= 0 ? sp2[worst] : 0.0,
                    (unsigned long long)test_seed());
            ok = 0;
        }
    }
    if (K) ok &= check_topk(cs, ids, lp, K, &c, act, x->T, x->cap, tol, 1e-3);
    free(act), free(sp2), free(lp), free(ids);
    sph_ctx_free(g, dsp2), sph_ctx_free(g, dlp), sph_ctx_free(g, dids);
    hc_free(&c);
    sph_ctx_destroy(g);
    return ok;
}

static void test_extras_cuda(void **state) {
    (void)state;
    const uint32_t F32S = SPH_CUDA_FLAG_ONEPASS_F32, RECOMP = SPH_CUDA_FLAG_ONEPASS_RECOMPUTE,
                   ES = SPH_CUDA_FLAG_EXTRAS_STAGED, E = SPH_CUDA_FLAG_ONEPASS_E;
    const xcase cases[] = {
        /* kernel, dtype, N, H, V, K, sp2, mask, one_pass, bi, flags, chunk_bytes, T, cap,
         * tk_cap, ties, seed */
        /* top-k and sum_p2 staged (EXTRAS_STAGED) */
        {NULL, SPH_BF16, 300, 64, 1601, 64, 1, 0, 0, 0, ES, 0, 1.0, 0.0, 0, 0, NULL},
        {NULL, SPH_BF16, 300, 64, 1601, 256, 1, 1, 0, 0, ES, 96 * 1024, 0.7, 0.0, 0, 0, NULL},
        {NULL, SPH_F32, 77, 40, 613, 1, 1, 1, 0, 0, ES, 40 * 1024, 1.0, 3.0, 0, 0, NULL},
        {NULL, SPH_F32, 77, 40, 613, 200, 0, 0, 0, 0, ES, 0, 0.6, 0.0, 0, 0, NULL},
        {NULL, SPH_BF16, 130, 64, 613, 7, 1, 1, 1, 0, F32S | ES, 64 * 1024, 1.0, 0.0, 0, 0, NULL},
        {NULL, SPH_BF16, 130, 64, 613, 64, 1, 1, 1, 0, RECOMP | ES, 0, 0.8, 2.5, 0, 0, NULL},
        {NULL, SPH_F16, 130, 64, 1601, 64, 1, 0, 1, 0, ES, 0, 1.0, 0.0, 0, 0, NULL},
        {NULL, SPH_BF16, 97, 64, 1601, 64, 1, 1, 0, 1, ES, 0, 1.0, 0.0, 0, 0, NULL},
        /* sum_p2 alone: the fused statistics epilogue (sm_90a) or the plain pass's kernels by
         * default: several splits (small budget), gathered spans, staged E, the sweep, N = 1,
         * the batch-invariant mode; staged under EXTRAS_STAGED */
        {NULL, SPH_BF16, 300, 64, 1601, 0, 1, 1, 0, 0, ES, 0, 0.9, 0.0, 0, 0, NULL},
        {NULL, SPH_BF16, 300, 64, 1601, 0, 1, 0, 0, 0, 0, 0, 1.0, 0.0, 0, 0, NULL},
        {NULL, SPH_BF16, 300, 72, 1601, 0, 1, 1, 0, 0, 0, 96 * 1024, 0.7, 0.0, 0, 0, NULL},
        {NULL, SPH_F16, 257, 64, 613, 0, 1, 1, 0, 0, 0, 0, 1.3, 3.0, 0, 0, NULL},
        {NULL, SPH_BF16, 130, 64, 1601, 0, 1, 1, 1, 0, 0, 0, 0.8, 0.0, 0, 0, NULL},
        {NULL, SPH_BF16, 130, 64, 613, 0, 1, 0, 1, 0, RECOMP, 0, 1.0, 2.5, 0, 0, NULL},
        {NULL, SPH_BF16, 1, 64, 1601, 0, 1, 0, 0, 0, 0, 0, 1.0, 0.0, 0, 0, NULL},
        {NULL, SPH_BF16, 97, 64, 1601, 0, 1, 1, 0, 1, 0, 0, 1.0, 0.0, 0, 0, NULL},
        /* top-k by default: the candidates of the fused statistics epilogue; K 1 .. 256,
         * with and without sum_p2, splits (small budget), spans, temperature and softcap,
         * staged E and the sweep, 129 / 257 rows (a row past a 128-row tile), N = 1; a wide
         * vocabulary (more tiles than the first wave); the overflow's recompute (tk_cap
         * 1, 100: every row, or most, overflow); all logits of a row equal (massive ties) */
        {NULL, SPH_BF16, 300, 64, 1601, 64, 1, 0, 0, 0, 0, 0, 1.0, 0.0, 0, 0, NULL},
        {NULL, SPH_BF16, 129, 64, 1601, 256, 0, 1, 0, 0, 0, 96 * 1024, 0.7, 0.0, 0, 0, NULL},
        {NULL, SPH_F16, 257, 72, 613, 1, 1, 1, 0, 0, 0, 0, 1.3, 3.0, 0, 0, NULL},
        {NULL, SPH_BF16, 130, 64, 613, 7, 1, 1, 1, 0, E, 0, 1.0, 0.0, 0, 0, NULL},
        {NULL, SPH_BF16, 130, 64, 1601, 64, 1, 0, 1, 0, RECOMP, 0, 0.8, 2.5, 0, 0, NULL},
        {NULL, SPH_BF16, 1, 64, 1601, 9, 0, 0, 0, 0, 0, 0, 1.0, 0.0, 0, 0, NULL},
        {NULL, SPH_BF16, 200, 128, 40000, 64, 1, 1, 0, 0, 0, 0, 1.0, 0.0, 0, 0, NULL},
        {NULL, SPH_BF16, 200, 64, 9000, 64, 0, 1, 0, 0, 0, 0, 0.9, 0.0, 100, 0, NULL},
        {NULL, SPH_F16, 65, 64, 1601, 33, 1, 0, 1, 0, E, 200 * 1024, 1.0, 0.0, 1, 0, NULL},
        {NULL, SPH_BF16, 300, 64, 1601, 64, 1, 0, 0, 0, ES, 0, 1.0, 0.0, 0, 0, NULL},
        {NULL, SPH_BF16, 70, 64, 5000, 64, 0, 1, 0, 0, 0, 0, 1.0, 0.0, 0, 1, NULL},
        {NULL, SPH_BF16, 70, 64, 5000, 256, 1, 0, 1, 0, E, 0, 0.8, 0.0, 0, 1, NULL},
        /* the sampled seed (splits of >= 8 x its columns: 1024 up to K = 128, 16 K above):
         * seeded by default; off; biased so that every row's seed fails (inf) or some do
         * (their merge recomputes the split); K = 256 (4096 samples); softcap and a
         * temperature; a small budget (several splits: only split 0 is seeded); exact ties at
         * the seed value (50 distinct logits per row, each repeated ~400 times) and every
         * logit equal */
        {NULL, SPH_BF16, 200, 128, 40000, 64, 0, 0, 0, 0, 0, 0, 1.0, 0.0, 0, 0, "off"},
        {NULL, SPH_BF16, 200, 128, 40000, 64, 1, 1, 0, 0, 0, 0, 1.0, 0.0, 0, 0, "inf"},
        {NULL, SPH_BF16, 200, 72, 20000, 32, 0, 0, 0, 0, 0, 0, 1.0, 0.0, 0, 0, "0.001"},
        {NULL, SPH_F16, 130, 64, 40000, 256, 1, 1, 1, 0, E, 0, 0.8, 0.0, 0, 0, NULL},
        {NULL, SPH_BF16, 129, 64, 30000, 64, 0, 0, 0, 0, 0, 0, 0.7, 3.0, 0, 0, NULL},
        {NULL, SPH_BF16, 129, 64, 30000, 64, 1, 0, 0, 0, 0, 2 << 20, 1.0, 0.0, 0, 0, NULL},
        {NULL, SPH_BF16, 70, 64, 20000, 64, 0, 0, 0, 0, 0, 0, 1.0, 0.0, 0, 50, NULL},
        {NULL, SPH_BF16, 70, 64, 20000, 16, 1, 0, 0, 0, 0, 0, 1.0, 0.0, 0, 1, NULL},
        /* the epilogue's stage (v22: 24 logits per thread and row half) overflowing in a
         * row's first tiles without a seed, in the one-pass kernel (its z overwritten by p:
         * those threads emit before the statistics loop) and the general one with ties */
        {NULL, SPH_BF16, 200, 128, 40000, 64, 1, 1, 1, 0, E, 0, 1.0, 0.0, 0, 0, "off"},
        {NULL, SPH_F16, 129, 64, 30000, 128, 0, 0, 1, 0, E, 0, 0.8, 2.0, 0, 0, "off"},
        {NULL, SPH_BF16, 70, 64, 20000, 64, 1, 0, 0, 0, 0, 0, 1.0, 0.0, 0, 7, "off"},
        /* the seed's select at each sample size: 2048 samples (K = 128; 1024 and 4096 above) */
        {NULL, SPH_BF16, 129, 64, 30000, 128, 1, 0, 0, 0, 0, 0, 1.0, 0.0, 0, 0, NULL},
        {"ref", SPH_BF16, 33, 32, 613, 64, 1, 1, 0, 0, 0, 0, 0.7, 0.0, 0, 0, NULL},
        {"ref", SPH_F32, 33, 32, 613, 9, 1, 0, 1, 0, 0, 0, 1.0, 2.0, 0, 0, NULL},
        /* v32's warp kernels at K below 64: the merge's register sort of 64 entries with K =
         * 40 (the K-th in the second slot) and of 32 with K = 20, the seed's warp select */
        {NULL, SPH_BF16, 97, 64, 12000, 40, 1, 1, 0, 0, 0, 0, 1.0, 0.0, 0, 0, NULL},
        {NULL, SPH_F16, 66, 72, 9000, 20, 0, 0, 1, 0, E, 0, 0.9, 0.0, 0, 0, NULL},
    };
    int ok = 1;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) ok &= run_case(&cases[k]);
    /* the A/B variants (SPH_TEST_TOPK_VARIANT) on fused cases at K = 64 (cases[16 ..]): 1601
     * and 40000 columns, several splits (the merge with the earlier list), the warp merge's
     * fallbacks (ties at the seed, ~400 at T; 7 values without a seed: more than its 512
     * entries), the one-pass kernel's stage overflow, a buffer of 100 (the emission's
     * room, the recompute): 1 v25's count, 2 the block merge, 4 the K-th seed, 7 all three;
     * 9 v25's stage at 6 entries (a half's overflow, both halves', their sum's: every
     * overflowing thread emits from its registers before the statistics loops), 13 with
     * the K-th seed's extra candidates. Besides the cases above: massive ties (cases[26]:
     * every logit equal), the general kernel's stage overflow without a seed (cases[28]),
     * softcap (cases[32]), every logit equal at K 16 with the seed (cases[35]) and the seed
     * at K 128 (cases[39]: 2048 samples); 16 v31's per-row kernels (the seed's block
     * select, the merge's sort in shared memory), also at K 40 and 20 (cases[42], [43]) */
    static const char *variants[] = {"1", "2", "4", "7", "9", "13", "16"};
    static const size_t again[] = {16, 22, 23, 26, 28, 32, 33, 34, 35, 36, 38, 39, 42, 43};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        g_variant = variants[v];
        for (size_t k = 0; k < sizeof again / sizeof again[0]; k++) ok &= run_case(&cases[again[k]]);
    }
    g_variant = NULL;
    assert_true(ok);
}

/* sum_j p_ij^2 of row i over its candidates (the support's softmax), float64. */
static double indep_support_sum_p2(const hcase *c, int64_t i, double T, double cap) {
    double m = -INFINITY, S = 0, Q = 0, *z = hc_alloc((size_t)c->K * 8);
    int64_t n = 0;
    for (int64_t k = 0; k < c->K; k++) {
        const int64_t id = c->cand[i * c->K + k];
        if (id < 0) continue;
        const double u = hc_u(c, i, id - c->v0);
        z[n] = (cap > 0 ? cap * tanh(u / cap) : u) / T;
        if (z[n] > m) m = z[n];
        n++;
    }
    for (int64_t k = 0; k < n; k++) S += exp(z[k] - m);
    for (int64_t k = 0; k < n; k++) Q += exp(z[k] - m) / S * exp(z[k] - m) / S;
    free(z);
    return Q;
}

/* sum_p2 with candidates (sample support) on CUDA: against the float64 support oracle and
 * the staged reference, forward-only and one-pass, masked (spans) or not, inactive rows
 * exactly 0, sum_p2 poisoned before the run. */
static int support_case(int64_t N, int64_t V, int64_t K, sph_dtype dt, int masked, int one_pass,
                        double T, double cap, const char *kernel) {
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.device = (sph_device){SPH_DEVICE_CUDA, 0};
    o.force_kernel = kernel;
    sph_ctx_t g = NULL;
    expect_ok(sph_ctx_create(&g, &o));
    hcase c;
    hc_init(&c, &g_rng, N, 32, V, V, 0, K, dt);
    if (masked) hc_mask_ragged(&c, &g_rng, 0.6);
    hc_wire(&c, HC_LP | HC_ENT | HC_LSE | (masked ? HC_MASK | HC_SPANS : 0) |
                    (one_pass ? HC_G | HC_E | HC_DH | HC_DW : 0));
    c.a.temperature = T, c.a.softcap = cap;
    hc_poison(&c);
    float *sp2 = hc_alloc((size_t)N * 4);
    poison_f32(sp2, (size_t)N);
    void *dsp2 = dev_copy(g, sp2, (size_t)N * 4);
    int64_t sh[1];
    sph_tensor ts = tensor1(dsp2, SPH_F32, sh, N);
    ts.device = (sph_device){SPH_DEVICE_CUDA, 0};
    mirror m;
    mirror_make(g, &c, &m);
    c.a.sum_p2 = &ts;
    size_t bytes = 0;
    expect_ok(sph_head_workspace_size(g, SPH_HEAD_FORWARD, &c.a, &bytes));
    void *dws = NULL;
    expect_ok(sph_ctx_malloc(g, bytes ? bytes : 1, &dws));
    expect_ok(sph_ctx_memset(g, dws, 0xff, bytes ? bytes : 1)); /* poisoned scratch */
    expect_ok(sph_head_forward(g, &c.a, dws, bytes));
    expect_ok(sph_ctx_synchronize(g));
    sph_ctx_free(g, dws);
    mirror_back(g, &m);
    expect_ok(sph_ctx_memcpy(g, sp2, dsp2, (size_t)N * 4));
    char cs[160];
    snprintf(cs, sizeof cs, "cuda support sum_p2(kernel=%s,%s,N=%lld,V=%lld,K=%lld,mask=%d,"
             "one_pass=%d,T=%g,cap=%g)", kernel ? kernel : "cuda", sph_dtype_name(dt),
             (long long)N, (long long)V, (long long)K, masked, one_pass, T, cap);
    const double tol = dt.bits == 32 ? TOL_CUDA_F32 : TOL_CUDA_HALF_ROWS;
    uint8_t *act = hc_alloc((size_t)N);
    hc_active(&c, act);
    int ok = 1;
    for (int64_t i = 0; i < N && ok; i++) {
        const double want = act[i] ? indep_support_sum_p2(&c, i, T, cap) : 0;
        const int good = act[i] ? fabs((double)sp2[i] - want) <= tol * want
                                : sp2[i] == 0.0f && !signbit(sp2[i]);
        if (!good) {
            fprintf(stderr, "FAIL %s: row %lld (active %d): %.9g, oracle %.9g; seed %llu\n", cs,
                    (long long)i, act[i], sp2[i], want, (unsigned long long)test_seed());
            ok = 0;
        }
    }
    free(act), free(sp2);
    sph_ctx_free(g, dsp2);
    hc_free(&c);
    sph_ctx_destroy(g);
    return ok;
}

static void test_sum_p2_support(void **state) {
    (void)state;
    int ok = 1;
    ok &= support_case(33, 96, 6, SPH_BF16, 0, 0, 1.0, 0.0, NULL);
    ok &= support_case(77, 613, 17, SPH_F32, 1, 0, 0.7, 0.0, NULL);
    ok &= support_case(77, 613, 9, SPH_F32, 1, 1, 1.0, 3.0, NULL);
    ok &= support_case(130, 1601, 64, SPH_BF16, 1, 1, 1.3, 0.0, NULL);
    ok &= support_case(40, 300, 12, SPH_F32, 1, 0, 0.8, 0.0, "ref");
    assert_true(ok);
}

int main(void) {
    if (sph_cuda_device_count() == 0) {
        printf("test_head_cuda_contract: no CUDA device: skipping\n");
        return 77;
    }
    rng_seed(&g_rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_extras_cuda),
        cmocka_unit_test(test_sum_p2_support),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
