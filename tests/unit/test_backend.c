/*
 * test_backend.c - the context's tables (src/core/backend.h, registry.c): which backend fills
 * which head slot, the registry's answers in this build, a missing slot's status, and the
 * staged reference of device contexts (head_ref_stage.c) driven through a device table whose
 * "device memory" is host memory, so CI (no GPU) runs the whole staged path: copies in, the
 * data checks on the copies, the float64 reference, copies back (gaps between padded rows
 * preserved), bitwise equal to the plain reference. And a small loss written here, outside
 * src/head, plugged into the optimized CPU head's one-pass sweep through the plan's row hook
 * (issue 27: adding a loss touches only its own code).
 */
#include <stdlib.h>
#include <string.h>

#include "../parity/test_head_case.h"
#include "core/ctx.h"
#include "policy/policy.h"

static sph_rng g_rng;

static void test_tables(void **state) {
    (void)state;
    sph_ctx_t cpu = hc_ctx(NULL, 1, NULL), ref = hc_ctx("ref", 1, NULL);
    /* the CPU backend overrides every pass slot of the reference; the policy loss keeps its
     * own table (policy.h), chosen as the head's was */
    assert_string_equal(cpu->head.name, "cpu");
    assert_non_null(cpu->head.cpu_kern);
    assert_non_null(cpu->head.forward);
    assert_non_null(cpu->head.support_backward);
    assert_null(cpu->head.check);
    assert_true(sph_policy_backend_of(cpu) == &sph_policy_cpu_backend);
    assert_true(sph_policy_backend_of(ref) == &sph_policy_ref_backend);
    assert_string_equal(ref->head.name, "ref");
    assert_null(ref->head.cpu_kern);
    assert_true(ref->head.forward == ref->head.support_forward);
    assert_true(ref->head.forward != cpu->head.forward);
    assert_true(cpu->dev == ref->dev && cpu->dev->host_memory);
    expect_status(sph_backend_missing(cpu, "sample support"), SPH_ERR_UNSUPPORTED,
                  "sample support: not implemented by the cpu backend");
    sph_ctx_destroy(cpu);
    sph_ctx_destroy(ref);
}

static void test_registry(void **state) {
    (void)state;
    const sph_device_ops *h = sph_registry_device(SPH_DEVICE_CPU);
    assert_non_null(h);
    assert_string_equal(h->name, "cpu");
    assert_true(sph_registry_device(SPH_DEVICE_CUDA_HOST) == h);
    assert_null(sph_registry_device((sph_device_type)99));
    int64_t x = 0;
    assert_int_equal(sph_registry_pointer_is_device(&x), 0);
    assert_int_equal(sph_registry_pointer_is_device(NULL), 0);
#ifdef SPH_HAVE_CUDA
    assert_non_null(sph_registry_device(SPH_DEVICE_CUDA));
#else
    assert_null(sph_registry_device(SPH_DEVICE_CUDA));
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.device.type = SPH_DEVICE_CUDA;
    sph_ctx_t c = NULL;
    expect_status(sph_ctx_create(&c, &o), SPH_ERR_UNSUPPORTED, "built without CUDA");
    assert_null(c);
    assert_int_equal(sph_cuda_device_count(), 0);
#endif
}

// ---- the staged reference on a pretend device --------------------------------------------

static int g_copies;

static sph_status fake_memcpy(sph_ctx_t ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    g_copies++;
    memmove(dst, src, bytes);
    return SPH_OK;
}

/* A device whose memory is not host memory as far as the library knows: the reference must
 * stage through copies. */
static sph_device_ops g_fake_ops;

static sph_ctx_t fake_device_ctx(void) {
    sph_ctx_t c = hc_ctx("ref", 1, NULL);
    g_fake_ops = *c->dev;
    g_fake_ops.name = "pretend-device";
    g_fake_ops.host_memory = 0;
    g_fake_ops.memcpy = fake_memcpy;
    c->dev = &g_fake_ops;
    c->device = (sph_device){SPH_DEVICE_CUDA, 0};
    sph_head_ref_fill(c, &c->head, 1);
    return c;
}

static void on_device(hcase *c) {
    sph_tensor *ts[] = {&c->th, &c->tw, &c->tt, &c->tc, &c->tm, &c->tlp, &c->tent, &c->tlse,
                        &c->tlm, &c->tst, &c->tg, &c->te, &c->tgl, &c->tgm, &c->tdh, &c->tdw};
    for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++)
        ts[k]->device = (sph_device){SPH_DEVICE_CUDA, 0};
}

static void copy_outputs(const hcase *c, float *out) {
    const size_t N = (size_t)c->N;
    memcpy(out, c->lp, N * 4);
    memcpy(out + N, c->ent, N * 4);
    memcpy(out + 2 * N, c->lse, N * 4);
    memcpy(out + 3 * N, c->lm, N * 4);
    memcpy(out + 4 * N, c->stats, N * 12);
}

static void test_staged_reference(void **state) {
    (void)state;
    const unsigned all = HC_LP | HC_ENT | HC_LSE | HC_LM | HC_G | HC_E | HC_GL | HC_GM |
                         HC_DH | HC_DW | HC_MASK;
    for (int K = 0; K <= 4; K += 4) {
        hcase c;
        hc_init(&c, &g_rng, 37, 24, 51, 51, 0, K, SPH_BF16);
        hc_mask(&c, &g_rng, 0.6);
        const size_t N = (size_t)c.N, nh = N * (size_t)c.H, nw = (size_t)(c.V_loc * c.H);
        float *ref_out = hc_alloc(N * 7 * 4), *got_out = hc_alloc(N * 7 * 4);
        float *ref_dh = hc_alloc(nh * 4), *ref_dw = hc_alloc(nw * 4);
        /* the plain reference, one-pass forward then backward */
        sph_ctx_t r = hc_ctx("ref", 1, NULL);
        hc_wire(&c, all);
        hc_poison(&c);
        expect_ok(hc_run(r, SPH_HEAD_FORWARD, &c.a));
        copy_outputs(&c, ref_out);
        expect_ok(hc_run(r, SPH_HEAD_BACKWARD, &c.a));
        memcpy(ref_dh, c.dh, nh * 4), memcpy(ref_dw, c.dw, nw * 4);
        /* the staged reference: the same bits */
        sph_ctx_t d = fake_device_ctx();
        assert_string_equal(d->head.name, "ref (staged)");
        hc_wire(&c, all);
        on_device(&c);
        hc_poison(&c);
        g_copies = 0;
        expect_ok(hc_run(d, SPH_HEAD_FORWARD, &c.a));
        assert_true(g_copies > 0);
        copy_outputs(&c, got_out);
        assert_memory_equal(got_out, ref_out, N * 7 * 4);
        expect_ok(hc_run(d, SPH_HEAD_BACKWARD, &c.a));
        assert_memory_equal(c.dh, ref_dh, nh * 4);
        assert_memory_equal(c.dw, ref_dw, nw * 4);
        /* bad device data is found on the host copies, before any output is copied back */
        int64_t t0 = c.tgt[0];
        c.tgt[0] = c.V + 5;
        if (c.cand) c.cand[0] = c.V + 5;
        hc_poison(&c);
        expect_status(hc_run(d, SPH_HEAD_FORWARD, &c.a), SPH_ERR_INVALID_ARG, "vocab_total");
        for (size_t i = 0; i < N; i++) assert_true(isnan(c.lp[i]));
        c.tgt[0] = t0;
        uint8_t m0 = c.mask[1];
        c.mask[1] = 7;
        expect_status(hc_run(d, SPH_HEAD_FORWARD, &c.a), SPH_ERR_INVALID_ARG, "active_mask[1]");
        c.mask[1] = m0;
        sph_ctx_destroy(r);
        sph_ctx_destroy(d);
        free(ref_out), free(got_out), free(ref_dh), free(ref_dw);
        hc_free(&c);
    }
}

/* Accumulating into a dhidden whose rows are padded: the staged copy brings the old values
 * and the padding back unchanged. */
static void test_staged_padded_accumulate(void **state) {
    (void)state;
    hcase c;
    hc_init(&c, &g_rng, 9, 8, 13, 13, 0, 0, SPH_F32);
    const int64_t N = c.N, H = c.H, ld = H + 3;
    float *dh = hc_alloc((size_t)(N * ld) * 4), *want = hc_alloc((size_t)(N * ld) * 4);
    for (int64_t k = 0; k < N * ld; k++) dh[k] = (float)(k % 17) - 8.0f;
    memcpy(want, dh, (size_t)(N * ld) * 4);
    int64_t shape[2] = {N, H}, strides[2] = {ld, 1};
    sph_tensor tdh = {dh, {SPH_DEVICE_CPU, 0}, 2, SPH_F32, shape, strides, 0};
    /* expected: the plain reference accumulating into the same padded layout */
    sph_ctx_t r = hc_ctx("ref", 1, NULL);
    hc_wire(&c, HC_G | HC_E);
    sph_head_args a = c.a;
    expect_ok(hc_run(r, SPH_HEAD_FORWARD, &a));
    a.dhidden = &tdh;
    a.accumulate_dhidden = 1;
    tdh.data = want;
    expect_ok(hc_run(r, SPH_HEAD_BACKWARD, &a));
    sph_ctx_t d = fake_device_ctx();
    on_device(&c);
    a = c.a;
    a.dhidden = &tdh;
    a.accumulate_dhidden = 1;
    tdh.data = dh;
    tdh.device = (sph_device){SPH_DEVICE_CUDA, 0};
    expect_ok(hc_run(d, SPH_HEAD_BACKWARD, &a));
    assert_memory_equal(dh, want, (size_t)(N * ld) * 4);
    sph_ctx_destroy(r);
    sph_ctx_destroy(d);
    free(dh), free(want);
    hc_free(&c);
}

static sph_status no_allgather(sph_comm_t c, const void *send, void *recv, size_t bytes,
                               void *stream) {
    (void)c, (void)send, (void)recv, (void)bytes, (void)stream;
    return sph_err(SPH_ERR_INTERNAL, "no collective expected");
}

/* A TP group on device buffers: the staged reference cannot combine on the host: refused. */
static void test_staged_refuses_tp(void **state) {
    (void)state;
    hcase c;
    hc_init(&c, &g_rng, 4, 8, 5, 10, 0, 0, SPH_F32);
    static const sph_comm_ops ops = {no_allgather, NULL, NULL};
    struct sph_comm comm;
    memset(&comm, 0, sizeof comm);
    comm.backend = SPH_COMM_NCCL, comm.rank = 0, comm.size = 2, comm.ops = &ops;
    comm.device_buffers = 1;
    sph_ctx_t d = fake_device_ctx();
    d->tp_comm = &comm;
    hc_wire(&c, HC_LP);
    on_device(&c);
    hc_poison(&c);
    expect_status(hc_run(d, SPH_HEAD_FORWARD, &c.a), SPH_ERR_UNSUPPORTED, "TP group of 2 ranks");
    assert_true(isnan(c.lp[0]));
    sph_ctx_destroy(d);
    hc_free(&c);
}

/* A device context's loss backend comes from its device table (loss_backend), by name; the
 * forced reference of a device (staged) has none. */
static const sph_policy_backend g_dev_policy = {"pretend", NULL, NULL};
static const void *fake_loss_backend(const char *loss) {
    return !strcmp(loss, "policy") ? &g_dev_policy : NULL;
}

static void test_loss_backend_of_device(void **state) {
    (void)state;
    sph_ctx_t c = hc_ctx(NULL, 1, NULL);
    const sph_device_ops *host = c->dev;
    static sph_device_ops ops;
    ops = *host;
    ops.host_memory = 0;
    ops.loss_backend = fake_loss_backend;
    c->dev = &ops;
    assert_true(sph_policy_backend_of(c) == &g_dev_policy);
    ops.loss_backend = NULL;
    assert_null(sph_policy_backend_of(c));
    c->use_ref = 1; /* the staged reference: no policy backend even where the device has one */
    ops.loss_backend = fake_loss_backend;
    assert_null(sph_policy_backend_of(c));
    c->use_ref = 0;
    c->dev = host;
    assert_true(sph_policy_backend_of(c) == &sph_policy_cpu_backend);
    sph_ctx_destroy(c);
}

// ---- a loss of the test's own through the row hook ---------------------------------------

/* The example loss: L = sum_i w_i (logp_i + logp_i^2 / 2) + u_i H_i over the active rows, so
 * dL/dlogp_i = w_i (1 + logp_i) needs the row's final logprob: the hook must run after the
 * row is finalized and before its dlogits. */
typedef struct ex_loss {
    const float *w, *u, *lp;
    float *g, *e;
    const uint8_t *act;
    int64_t calls, rows, bad;
} ex_loss;

static void ex_rows(void *arg, const int64_t *rows, int64_t n) {
    ex_loss *L = arg;
    L->calls++;
    for (int64_t q = 0; q < n; q++) {
        const int64_t i = rows[q];
        L->rows++;
        if (!L->act[i] || isnan(L->lp[i])) L->bad++; /* only final, active rows */
        L->g[i] = L->w[i] * (1.0f + L->lp[i]);
        L->e[i] = L->u[i];
    }
}

static void test_row_hook_example_loss(void **state) {
    (void)state;
    hcase c;
    hc_init(&c, &g_rng, 45, 20, 37, 37, 0, 0, SPH_F32);
    hc_mask_ragged(&c, &g_rng, 0.6);
    const int64_t N = c.N, nh = N * c.H, nw = c.V_loc * c.H;
    float *w = hc_alloc((size_t)N * 4), *u = hc_alloc((size_t)N * 4);
    for (int64_t i = 0; i < N; i++)
        w[i] = (float)rng_normal(&g_rng), u[i] = (float)rng_normal(&g_rng);
    uint8_t *act = hc_alloc((size_t)N);
    int64_t n_act = 0;
    for (int64_t i = 0; i < N; i++) n_act += act[i] = c.mask[i];
    /* expected: the float64 reference's forward, the loss's gradients from its logprob, then
     * the reference's backward */
    sph_ctx_t r = hc_ctx("ref", 1, NULL);
    hc_wire(&c, HC_LP | HC_ENT | HC_MASK);
    hc_poison(&c);
    expect_ok(hc_run(r, SPH_HEAD_FORWARD, &c.a));
    for (int64_t i = 0; i < N; i++) c.g[i] = w[i] * (1.0f + c.lp[i]), c.e[i] = u[i];
    hc_wire(&c, HC_G | HC_E | HC_DH | HC_DW | HC_MASK);
    expect_ok(hc_run(r, SPH_HEAD_BACKWARD, &c.a));
    float *want_dh = hc_dup(c.dh, (size_t)nh * 4), *want_dw = hc_dup(c.dw, (size_t)nw * 4);
    float *want_lp = hc_dup(c.lp, (size_t)N * 4);
    /* the one-pass sweep of the optimized CPU head with the loss bound as its row hook: the
     * plan's upstream gradients are the loss's buffers, poisoned, written by the hook only */
    sph_ctx_t cpu = hc_ctx(NULL, 2, NULL);
    hc_wire(&c, HC_LP | HC_ENT | HC_G | HC_E | HC_DH | HC_DW | HC_MASK);
    hc_poison(&c);
    poison_f32(c.g, (size_t)N), poison_f32(c.e, (size_t)N);
    sph_head_plan p;
    expect_ok(sph_head_plan_make(cpu, SPH_HEAD_FORWARD, &c.a, &p));
    assert_true(p.one_pass);
    ex_loss L = {w, u, c.lp, c.g, c.e, act, 0, 0, 0};
    p.row_hook.host = ex_rows;
    p.row_hook.arg = &L;
    size_t bytes = 0;
    expect_ok(cpu->head.workspace(cpu, SPH_HEAD_FORWARD, &p, &bytes));
    void *ws = bytes ? hc_alloc(bytes) : NULL;
    expect_ok(cpu->head.forward(cpu, &p, ws, bytes));
    assert_true(L.calls >= 1);
    assert_int_equal(L.rows, n_act); /* every active row once, no inactive row */
    assert_int_equal(L.bad, 0);
    assert_true(hc_close("logprob", "hook", c.lp, SPH_F32, want_lp, SPH_F32, N, 1e-5));
    assert_true(hc_close("dhidden", "hook", c.dh, SPH_F32, want_dh, SPH_F32, nh, 1e-4));
    assert_true(hc_close("dweight", "hook", c.dw, SPH_F32, want_dw, SPH_F32, nw, 1e-4));
    /* without the hook the same plan's gradients are the poisoned buffers': NaN (the test
     * cannot pass by construction) */
    memset(&p.row_hook, 0, sizeof p.row_hook);
    poison_f32(c.g, (size_t)N), poison_f32(c.e, (size_t)N);
    sph_status s = cpu->head.forward(cpu, &p, ws, bytes);
    int64_t nan_dh = 0;
    for (int64_t k = 0; k < nh; k++) nan_dh += isnan(((const float *)c.dh)[k]);
    assert_true(s != SPH_OK || nan_dh > 0);
    free(ws);
    sph_ctx_destroy(r);
    sph_ctx_destroy(cpu);
    free(w), free(u), free(act), free(want_dh), free(want_dw), free(want_lp);
    hc_free(&c);
}

int main(void) {
    rng_seed(&g_rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables),
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_staged_reference),
        cmocka_unit_test(test_staged_padded_accumulate),
        cmocka_unit_test(test_staged_refuses_tp),
        cmocka_unit_test(test_row_hook_example_loss),
        cmocka_unit_test(test_loss_backend_of_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
