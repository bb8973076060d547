/*
 * test_torture.c - allocation-failure torture in the curl tradition (issue 18): every host
 * allocation of the library (they all go through src/core/alloc.c) fails in turn, the k-th of
 * each scenario for k = 1 .. its count, over the calls the unit tests make: context creation
 * (CPU, reference), the head's forward and backward on the reference, the optimized CPU
 * backend and the staged reference (full vocabulary and sample support, masks, spans,
 * one-pass, TP shard, candidates' host checks), bin packing (FFD, MFFD, balanced with bin
 * targets), masks and spans of packed and CP layouts, the none communicator, and the fused
 * policy loss (reference and CPU: PPO with a KL term, GSPO, CISPO with spans, stats kept in
 * the workspace, the loss alone; every output compared byte for byte after a failure).
 *
 * Each failure must give a clean status (SPH_ERR_ALLOC, a message), no partial output (the
 * head's outputs stay poisoned, result pointers stay NULL) and no leak: the ASan build
 * (make test-asan) runs this with LeakSanitizer. The counts are printed (allocation sites
 * failed per scenario) and the last line gives the totals.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../parity/test_policy_case.h"
#include "core/ctx.h"

static sph_rng g_rng;

/* A scenario: runs its calls; returns the first failing status; sets *clean = 0 when an
 * output was written or a result returned although the status is not SPH_OK. */
typedef sph_status (*scenario_fn)(int *clean);

// ---- the head --------------------------------------------------------------------------

/* Poisoned outputs of a case, compared byte for byte after a failed call. */
typedef struct snap {
    void *bytes;
    size_t n;
} snap;

static size_t outputs_bytes(const hcase *c) {
    return (size_t)c->N * 4 * 4 + (size_t)c->N * 12 + (size_t)(c->N * c->H) * 4 +
           (size_t)(c->V_loc * c->H) * 4;
}

static void outputs_copy(const hcase *c, char *dst) {
    const size_t N = (size_t)c->N;
    memcpy(dst, c->lp, N * 4), dst += N * 4;
    memcpy(dst, c->ent, N * 4), dst += N * 4;
    memcpy(dst, c->lse, N * 4), dst += N * 4;
    memcpy(dst, c->lm, N * 4), dst += N * 4;
    memcpy(dst, c->stats, N * 12), dst += N * 12;
    memcpy(dst, c->dh, (size_t)(c->N * c->H) * 4), dst += (size_t)(c->N * c->H) * 4;
    memcpy(dst, c->dw, (size_t)(c->V_loc * c->H) * 4);
}

/* Runs one pass with poisoned outputs; on failure the outputs must still be the poison. The
 * workspace is allocated by the test (not the library) before arming matters. */
static sph_status head_pass(sph_ctx_t ctx, hcase *c, sph_head_pass pass, int *clean) {
    size_t bytes = 0;
    sph_status s = sph_head_workspace_size(ctx, pass, &c->a, &bytes);
    if (s != SPH_OK) return s;
    void *ws = bytes ? malloc(bytes) : NULL;
    if (pass == SPH_HEAD_FORWARD) {
        hc_poison(c);
    } else { /* the backward reads the forward's stats: only its outputs are poisoned */
        poison_bytes(c->dh, (size_t)(c->N * c->H) * 4);
        poison_bytes(c->dw, (size_t)(c->V_loc * c->H) * 4);
    }
    const size_t n = outputs_bytes(c);
    char *before = malloc(n), *after = malloc(n);
    outputs_copy(c, before);
    s = pass == SPH_HEAD_FORWARD ? sph_head_forward(ctx, &c->a, ws, bytes)
                                 : sph_head_backward(ctx, &c->a, ws, bytes);
    outputs_copy(c, after);
    if (s != SPH_OK && memcmp(before, after, n) != 0) *clean = 0;
    free(before), free(after), free(ws);
    return s;
}

/* Forward, then backward, of a case on a context of kernel `kernel` (NULL: best CPU). */
static sph_status head_case(const char *kernel, int64_t K, int masked, int one_pass,
                            int staged, int *clean) {
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.force_kernel = kernel;
    o.num_threads = 2;
    sph_ctx_t ctx = NULL;
    sph_status s = sph_ctx_create(&ctx, &o);
    if (s != SPH_OK) {
        if (ctx) *clean = 0;
        return s;
    }
    static sph_device_ops fake;
    if (staged) { /* the staged reference through a pretend device (test_backend.c) */
        fake = *ctx->dev;
        fake.host_memory = 0;
        ctx->dev = &fake;
        ctx->device = (sph_device){SPH_DEVICE_CUDA, 0};
        sph_head_ref_fill(ctx, &ctx->head, 1);
    }
    hcase c;
    sph_rng r = g_rng; /* the same case at every k */
    hc_init(&c, &r, 23, 12, 19, 40, 7, K, SPH_BF16);
    if (masked) hc_mask(&c, &r, 0.6);
    unsigned what = HC_LP | HC_ENT | HC_LSE | HC_LM | HC_G | HC_E | HC_GL | HC_GM |
                    (masked ? HC_MASK | HC_SPANS : 0);
    if (staged) {
        sph_tensor *ts[] = {&c.th, &c.tw, &c.tt, &c.tc, &c.tm, &c.tlp, &c.tent, &c.tlse,
                            &c.tlm, &c.tst, &c.tg, &c.te, &c.tgl, &c.tgm, &c.tdh, &c.tdw};
        hc_wire(&c, what | HC_DH | HC_DW);
        for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++)
            ts[k]->device = (sph_device){SPH_DEVICE_CUDA, 0};
        if (!one_pass) c.a.dhidden = c.a.dweight = NULL;
    } else {
        hc_wire(&c, what | (one_pass ? HC_DH | HC_DW : 0));
    }
    s = head_pass(ctx, &c, SPH_HEAD_FORWARD, clean);
    if (s == SPH_OK && !one_pass) {
        if (staged) c.a.dhidden = &c.tdh, c.a.dweight = &c.tdw;
        else hc_wire(&c, what | HC_DH | HC_DW);
        s = head_pass(ctx, &c, SPH_HEAD_BACKWARD, clean);
    }
    sph_ctx_destroy(ctx);
    hc_free(&c);
    return s;
}

static sph_status sc_ctx(int *clean) {
    sph_ctx_t a = NULL, b = NULL;
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    sph_status s = sph_ctx_create(&a, &o);
    if (s != SPH_OK && a) *clean = 0;
    o.force_kernel = "ref";
    if (s == SPH_OK) s = sph_ctx_create(&b, &o);
    if (s != SPH_OK && b) *clean = 0;
    void *m = NULL;
    if (s == SPH_OK) s = sph_ctx_malloc(a, 100, &m);
    if (s != SPH_OK && m) *clean = 0;
    sph_ctx_free(a, m);
    sph_ctx_destroy(a);
    sph_ctx_destroy(b);
    return s;
}
static sph_status sc_ref_full(int *clean) { return head_case("ref", 0, 1, 0, 0, clean); }
static sph_status sc_ref_onepass(int *clean) { return head_case("ref", 0, 0, 1, 0, clean); }
static sph_status sc_ref_support(int *clean) { return head_case("ref", 4, 1, 0, 0, clean); }
static sph_status sc_cpu_full(int *clean) { return head_case(NULL, 0, 1, 0, 0, clean); }
static sph_status sc_cpu_onepass(int *clean) { return head_case(NULL, 0, 1, 1, 0, clean); }
static sph_status sc_cpu_support(int *clean) { return head_case(NULL, 4, 0, 1, 0, clean); }
static sph_status sc_staged(int *clean) { return head_case("ref", 0, 1, 0, 1, clean); }
static sph_status sc_staged_support(int *clean) { return head_case("ref", 3, 0, 1, 1, clean); }

// ---- the policy loss --------------------------------------------------------------------

/* Every output of a policy case, byte for byte: the head's per-row outputs, stats and
 * gradients, and the loss's metrics. */
static size_t policy_outputs(const pcase *c, char *dst) {
    const hcase *h = &c->h;
    const size_t N = (size_t)h->N, nh = (size_t)(h->N * h->H) * 4;
    const size_t nw = (size_t)(h->V_loc * h->H) * 4;
    const void *src[6] = {h->lp, h->ent, h->stats, h->dh, h->dw, c->metrics};
    const size_t n[6] = {N * 4, N * 4, N * 12, nh, nw, SPH_POLICY_N_METRICS * 4};
    size_t total = 0;
    for (int k = 0; k < 6; k++) {
        if (dst) memcpy(dst + total, src[k], n[k]);
        total += n[k];
    }
    return total;
}

enum { PV_SPANS = 1, PV_NO_STATS = 2, PV_NO_GRADS = 4 };

static sph_status policy_case(const char *kernel, sph_pg_loss loss, sph_kl_kind kl,
                              sph_loss_agg agg, unsigned variant, int *clean) {
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.force_kernel = kernel;
    o.num_threads = 2;
    sph_ctx_t ctx = NULL;
    sph_status s = sph_ctx_create(&ctx, &o);
    if (s != SPH_OK) {
        if (ctx) *clean = 0;
        return s;
    }
    pcase c;
    sph_rng r = g_rng;
    pc_init(&c, &r, 14, 6, 11, 11, 0, SPH_F32);
    hc_mask(&c.h, &r, 0.7);
    unsigned what = HC_LP | HC_ENT | HC_MASK | PC_ISW;
    if (!(variant & PV_NO_GRADS)) what |= HC_DH | HC_DW;
    if (variant & PV_SPANS) {
        hc_spans_of_mask(&c.h, 1);
        what |= HC_SPANS;
    }
    pc_wire(&c, what, loss, kl, agg);
    if (variant & PV_NO_STATS) c.h.a.stats = NULL; /* kept in the workspace */
    pc_poison(&c);
    const size_t n = policy_outputs(&c, NULL);
    char *before = malloc(n), *after = malloc(n);
    policy_outputs(&c, before);
    s = pc_run(ctx, &c);
    policy_outputs(&c, after);
    if (s != SPH_OK && memcmp(before, after, n)) *clean = 0; /* nothing written on failure */
    free(before), free(after);
    sph_ctx_destroy(ctx);
    pc_free(&c);
    return s;
}
static sph_status sc_policy_ref(int *clean) {
    return policy_case("ref", SPH_PG_PPO, SPH_KL_K3, SPH_AGG_SEQ_MEAN_TOKEN_MEAN, 0, clean);
}
static sph_status sc_policy_cpu(int *clean) {
    return policy_case(NULL, SPH_PG_PPO, SPH_KL_K2, SPH_AGG_SEQ_MEAN_TOKEN_MEAN, 0, clean);
}
static sph_status sc_policy_gspo(int *clean) {
    return policy_case(NULL, SPH_PG_GSPO, SPH_KL_NONE, SPH_AGG_SEQ_MEAN_TOKEN_MEAN, 0, clean);
}
static sph_status sc_policy_ref_gspo(int *clean) {
    return policy_case("ref", SPH_PG_GSPO, SPH_KL_K1, SPH_AGG_SEQ_MEAN_TOKEN_SUM, PV_NO_STATS,
                       clean);
}
static sph_status sc_policy_cpu_cispo(int *clean) {
    return policy_case(NULL, SPH_PG_CISPO, SPH_KL_K3, SPH_AGG_SEQ_MEAN_TOKEN_SUM_NORM,
                       PV_SPANS | PV_NO_STATS, clean);
}
static sph_status sc_policy_cpu_loss_only(int *clean) {
    return policy_case(NULL, SPH_PG_PPO, SPH_KL_NONE, SPH_AGG_TOKEN_MEAN,
                       PV_NO_GRADS | PV_SPANS, clean);
}

// ---- metadata --------------------------------------------------------------------------

static sph_status sc_pack(int *clean) {
    int64_t lens[40];
    for (int k = 0; k < 40; k++) lens[k] = 3 + (k * 37) % 29;
    const sph_pack_algo algos[3] = {SPH_PACK_FFD, SPH_PACK_MFFD, SPH_PACK_BALANCED};
    sph_status s = SPH_OK;
    for (int a = 0; a < 3 && s == SPH_OK; a++) {
        sph_pack_opts o = SPH_PACK_OPTS_INIT;
        o.capacity = 64;
        o.algorithm = algos[a];
        o.min_bins = 12;
        o.bin_multiple = 4;
        o.par.tp = 2;
        sph_pack_result *res = (sph_pack_result *)1;
        s = sph_pack(lens, 40, &o, &res);
        if (s != SPH_OK && res) *clean = 0;
        sph_pack_free(s == SPH_OK ? res : NULL);
    }
    return s;
}

static sph_status sc_spans(int *clean) {
    const int64_t lens[3] = {4, 5, 6}, counts[2] = {2, 1};
    const uint8_t loss[12] = {0, 1, 1, 1, 1, 0, 1, 1, 0, 0, 0, 0};
    sph_batch_desc d = SPH_BATCH_DESC_INIT;
    d.layout = SPH_LAYOUT_PACKED;
    d.batch = 2;
    d.seq_len = 10;
    d.num_actions = 6;
    d.loss_mask = loss;
    d.sub_seq_lengths = lens;
    d.sub_seq_counts = counts;
    sph_status s = SPH_OK;
    for (int cp = 1; cp <= 2 && s == SPH_OK; cp++)
        for (int r = 0; r < cp && s == SPH_OK; r++) {
            sph_spans_opts o = SPH_SPANS_OPTS_INIT;
            o.par.cp = cp, o.par.tp = 2, o.cp_rank = r, o.gap = 1;
            sph_spans *sp = (sph_spans *)1;
            s = sph_spans_build(&d, &o, &sp);
            if (s != SPH_OK && sp) *clean = 0;
            sph_spans_free(s == SPH_OK ? sp : NULL);
        }
    d.layout = SPH_LAYOUT_UNPACKED; /* unpacked, C = 1 */
    d.sub_seq_lengths = NULL, d.sub_seq_counts = NULL;
    d.seq_len = 8;
    if (s == SPH_OK) {
        sph_spans_opts o = SPH_SPANS_OPTS_INIT;
        sph_spans *sp = (sph_spans *)1;
        s = sph_spans_build(&d, &o, &sp);
        if (s != SPH_OK && sp) *clean = 0;
        sph_spans_free(s == SPH_OK ? sp : NULL);
    }
    return s;
}

static sph_status sc_comm_none(int *clean) {
    sph_comm_t c = (sph_comm_t)1;
    sph_status s = sph_comm_create_none(&c);
    if (s != SPH_OK && c) *clean = 0;
    sph_comm_destroy(s == SPH_OK ? c : NULL);
    return s;
}

// ---- the driver --------------------------------------------------------------------------

static void torture(const char *name, scenario_fn fn, int64_t *sites, int64_t *cases) {
    int clean = 1;
    sph_alloc_fail_at(0);
    sph_status s = fn(&clean);
    const int64_t n = sph_alloc_count();
    if (s != SPH_OK) {
        print_error("%s: fails without any injected failure: %s\n", name, sph_last_error());
        fail();
    }
    int bad = 0;
    for (int64_t k = 1; k <= n; k++) {
        clean = 1;
        sph_alloc_fail_at(k);
        sph_clear_error();
        s = fn(&clean);
        const int64_t seen = sph_alloc_count();
        sph_alloc_fail_at(0);
        if (seen < k) continue; /* a path with fewer allocations this time (none did) */
        if (s != SPH_ERR_ALLOC || !*sph_last_error() || !clean) {
            print_error("%s: allocation %lld of %lld failed: status %d (%s), message '%s'%s\n",
                        name, (long long)k, (long long)n, (int)s, sph_status_str(s),
                        sph_last_error(), clean ? "" : ", an output was written");
            bad++;
        }
    }
    printf("torture %-22s %3lld allocation sites failed in turn%s\n", name, (long long)n,
           bad ? " (FAILURES)" : ", each a clean SPH_ERR_ALLOC");
    *sites += n;
    *cases += 1;
    if (bad) fail();
}

static void test_torture(void **state) {
    (void)state;
    static const struct {
        const char *name;
        scenario_fn fn;
    } sc[] = {
        {"ctx", sc_ctx},
        {"head ref", sc_ref_full},
        {"head ref one-pass", sc_ref_onepass},
        {"head ref support", sc_ref_support},
        {"head cpu", sc_cpu_full},
        {"head cpu one-pass", sc_cpu_onepass},
        {"head cpu support", sc_cpu_support},
        {"head staged ref", sc_staged},
        {"head staged support", sc_staged_support},
        {"policy ref ppo+k3", sc_policy_ref},
        {"policy cpu ppo+k2", sc_policy_cpu},
        {"policy cpu gspo", sc_policy_gspo},
        {"policy ref gspo+k1, stats in the workspace", sc_policy_ref_gspo},
        {"policy cpu cispo+k3 sum-norm, spans", sc_policy_cpu_cispo},
        {"policy cpu loss only, spans", sc_policy_cpu_loss_only},
        {"pack", sc_pack},
        {"spans", sc_spans},
        {"comm none", sc_comm_none},
    };
    int64_t sites = 0, cases = 0;
    for (size_t k = 0; k < sizeof sc / sizeof sc[0]; k++)
        torture(sc[k].name, sc[k].fn, &sites, &cases);
    printf("torture: %lld scenarios, %lld allocation failures injected, all clean\n",
           (long long)cases, (long long)sites);
}

int main(void) {
    rng_seed(&g_rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_torture),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
