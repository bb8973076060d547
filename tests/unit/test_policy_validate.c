/*
 * test_policy_validate.c - every bad input of sph_policy_loss fails with its status and a
 * message naming the argument and the value, and leaves every output untouched (poisoned
 * before, compared byte for byte after). Reference and optimized CPU kernels.
 */
#include <pthread.h>
#include <threads.h>

#include "parity/test_policy_case.h"

typedef struct snap {
    unsigned char *b;
    size_t n;
} snap;

/* Copies of every output buffer of the case. */
static void take(const pcase *c, snap s[6]) {
    const void *p[6] = {c->h.lp, c->h.ent, c->h.stats, c->h.dh, c->h.dw, c->metrics};
    size_t n[6] = {(size_t)c->h.N * 4, (size_t)c->h.N * 4, (size_t)c->h.N * 12,
                   (size_t)(c->h.N * c->h.H) * 4, (size_t)(c->h.V_loc * c->h.H) * 4,
                   SPH_POLICY_N_METRICS * 4};
    for (int k = 0; k < 6; k++) {
        s[k].n = n[k];
        s[k].b = hc_alloc(n[k]);
        memcpy(s[k].b, p[k], n[k]);
    }
}

static void untouched(const pcase *c, snap s[6]) {
    const void *p[6] = {c->h.lp, c->h.ent, c->h.stats, c->h.dh, c->h.dw, c->metrics};
    for (int k = 0; k < 6; k++) {
        assert_memory_equal(p[k], s[k].b, s[k].n);
        free(s[k].b);
    }
}

#define N_ 12
#define H_ 5
#define V_ 9

static void setup(pcase *c, sph_rng *r, sph_pg_loss loss, sph_kl_kind kl, sph_loss_agg agg) {
    pc_init(c, r, N_, H_, V_, V_, 0, SPH_F32);
    hc_mask(&c->h, r, 0.7);
    c->h.mask[3] = 1, c->h.tgt[3] = 1;
    c->h.mask[5] = 0;
    pc_wire(c, HC_LP | HC_ENT | HC_DH | HC_DW | HC_MASK | PC_ISW, loss, kl, agg);
    pc_poison(c);
}

/* Runs the case expecting status s with needle in the message, outputs untouched. */
static void expect_bad(sph_ctx_t ctx, pcase *c, sph_status s, const char *needle) {
    snap sn[6];
    take(c, sn);
    size_t bytes = 0;
    sph_status st = sph_policy_loss_workspace_size(ctx, &c->h.a, &c->p, &bytes);
    if (st == SPH_OK) {
        void *ws = hc_alloc(bytes + 1);
        st = sph_policy_loss(ctx, &c->h.a, &c->p, ws, bytes);
        free(ws);
    }
    if (st != s || !strstr(sph_last_error(), needle))
        fail_msg("expected status %d with '%s', got %d: %s", (int)s, needle, (int)st,
                 sph_last_error());
    untouched(c, sn);
}

static void bad_inputs(const char *kernel) {
    sph_rng r;
    rng_seed(&r, test_seed());
    sph_ctx_t ctx = hc_ctx(kernel, 1, NULL);
    pcase c;
    float f64buf[N_ * 2];
    int64_t sh[1] = {N_};
    int32_t i32buf[N_] = {0};

#define CASE(loss, kl, agg, edit, status, needle)                                              \
    do {                                                                                       \
        setup(&c, &r, loss, kl, agg);                                                          \
        edit;                                                                                  \
        expect_bad(ctx, &c, status, needle);                                                   \
        pc_free(&c);                                                                           \
    } while (0)

    const sph_pg_loss P = SPH_PG_PPO;
    const sph_kl_kind K0 = SPH_KL_NONE, K3 = SPH_KL_K3;
    const sph_loss_agg TM = SPH_AGG_TOKEN_MEAN, SMM = SPH_AGG_SEQ_MEAN_TOKEN_MEAN;
    // arguments a loss / KL / aggregation needs
    CASE(P, SPH_KL_K1, TM, c.p.ref_logprob = NULL, SPH_ERR_INVALID_ARG, "ref_logprob: NULL");
    CASE(P, K0, SMM, c.p.seq_id = NULL, SPH_ERR_INVALID_ARG, "seq_id: NULL");
    CASE(SPH_PG_GSPO, K0, TM, c.p.seq_id = NULL, SPH_ERR_INVALID_ARG, "gspo");
    CASE(P, K0, TM, c.p.advantages = NULL, SPH_ERR_INVALID_ARG, "advantages: NULL");
    CASE(P, K0, TM, c.p.old_logprob = NULL, SPH_ERR_INVALID_ARG, "old_logprob: NULL");
    CASE(P, K0, TM, c.p.metrics = NULL, SPH_ERR_INVALID_ARG, "metrics: NULL");
    CASE(P, K0, TM, c.h.a.targets = NULL, SPH_ERR_INVALID_ARG, "targets");
    CASE(P, K0, SPH_AGG_SEQ_MEAN_TOKEN_SUM_NORM, c.p.norm_length = 0, SPH_ERR_INVALID_ARG,
         "norm_length: 0");
    // scalar domains
    CASE(P, K3, TM, c.p.kl_coef = -1, SPH_ERR_INVALID_ARG, "kl_coef: -1");
    CASE(P, K3, TM, c.p.kl_coef = NAN, SPH_ERR_INVALID_ARG, "kl_coef: nan");
    CASE(P, K0, TM, c.p.entropy_coef = HUGE_VAL, SPH_ERR_INVALID_ARG, "entropy_coef: inf");
    CASE(P, K0, TM, c.p.entropy_coef = -0.5, SPH_ERR_INVALID_ARG, "entropy_coef: -0.5");
    CASE(P, K0, TM, c.p.clip_low = 1.5, SPH_ERR_INVALID_ARG, "clip_low: 1.5");
    CASE(P, K0, TM, c.p.clip_low = -0.1, SPH_ERR_INVALID_ARG, "clip_low: -0.1");
    CASE(P, K0, TM, c.p.clip_high = NAN, SPH_ERR_INVALID_ARG, "clip_high: nan");
    CASE(P, K0, TM, c.p.clip_ratio_c = 1.0, SPH_ERR_INVALID_ARG, "clip_ratio_c: 1");
    CASE(P, K0, TM, c.p.clip_ratio_c = 0.0, SPH_ERR_INVALID_ARG, "clip_ratio_c: 0");
    CASE(P, K0, TM, c.p.clip_ratio_c = NAN, SPH_ERR_INVALID_ARG, "clip_ratio_c: nan");
    CASE(P, K0, TM, c.p.num_tokens = -3, SPH_ERR_INVALID_ARG, "num_tokens: -3");
    CASE(P, K0, SMM, c.p.num_seqs = -1, SPH_ERR_INVALID_ARG, "num_seqs: -1");
    CASE(P, K0, TM, c.p.norm_length = -2, SPH_ERR_INVALID_ARG, "norm_length: -2");
    CASE(P, K0, TM, c.p.loss = (sph_pg_loss)7, SPH_ERR_INVALID_ARG, "policy.loss: 7");
    CASE(P, K0, TM, c.p.kl = (sph_kl_kind)9, SPH_ERR_INVALID_ARG, "policy.kl: 9");
    CASE(P, K0, TM, c.p.agg = (sph_loss_agg)4, SPH_ERR_INVALID_ARG, "policy.agg: 4");
    CASE(P, K0, TM, c.p.struct_size = 8, SPH_ERR_INVALID_ARG, "policy.struct_size");
    // values on active rows (host memory)
    CASE(P, K0, TM, c.adv[3] = NAN, SPH_ERR_INVALID_ARG, "advantages[3]: nan");
    CASE(P, K0, TM, c.old[3] = -HUGE_VAL, SPH_ERR_INVALID_ARG, "old_logprob[3]: -inf");
    CASE(P, SPH_KL_K2, TM, c.ref[3] = NAN, SPH_ERR_INVALID_ARG, "ref_logprob[3]: nan");
    CASE(P, K0, TM, c.isw[3] = HUGE_VAL, SPH_ERR_INVALID_ARG, "is_weight[3]: inf");
    // shapes, dtypes, devices
    CASE(P, K0, TM, c.tadv.shape = sh; sh[0] = N_ - 1, SPH_ERR_SHAPE, "advantages: shape[0]");
    sh[0] = N_;
    CASE(P, K0, TM, c.told.dtype = SPH_F64; c.told.data = f64buf, SPH_ERR_DTYPE,
         "old_logprob: dtype is f64");
    CASE(P, K0, SMM, c.tseq.dtype = SPH_I32; c.tseq.data = i32buf, SPH_ERR_DTYPE,
         "seq_id: dtype is i32");
    CASE(P, K0, TM, c.tmet.shape = sh, SPH_ERR_SHAPE, "metrics: shape[0]");
    CASE(P, K0, TM, c.tisw.device.type = SPH_DEVICE_CUDA, SPH_ERR_DEVICE, "is_weight: device");
    CASE(P, K0, TM, c.tadv.ndim = 2, SPH_ERR_SHAPE, "advantages: ndim");
    // head arguments the policy call refuses
    CASE(P, K0, TM, c.h.a.dlogprob = &c.h.tg, SPH_ERR_INVALID_ARG, "head.dlogprob");
    CASE(P, K0, TM, c.h.a.dentropy = &c.h.te, SPH_ERR_INVALID_ARG, "head.dentropy");
    CASE(P, K0, TM, c.h.a.dlse = &c.h.tgl, SPH_ERR_INVALID_ARG, "head.dlse");
    // the head's own validation still runs
    CASE(P, K0, TM, c.h.a.temperature = 0, SPH_ERR_INVALID_ARG, "temperature: 0");
    CASE(P, K0, TM, c.h.tgt[2] = V_, SPH_ERR_INVALID_ARG, "targets[2]");
    // a finite loss gradient beyond float (gspo: its backward refuses it): nothing written,
    // the reference and the CPU alike (fuzz_policy found the CPU writing the forward's rows)
    CASE(SPH_PG_GSPO, K0, TM, c.p.clip_low = 1; c.p.clip_high = 1e30; c.adv[3] = 1e30f;
         c.isw[3] = 1e30f, SPH_ERR_NONFINITE, "first row 3");
    // NaN in an active hidden row: refused before the sweep, which would have written the
    // gradient rows of the chunks before the row's (sph_head_refuse_nonfinite_hidden)
    CASE(P, K0, TM, ((float *)c.h.h)[3 * H_ + 2] = NAN, SPH_ERR_NONFINITE,
         "policy: 1 active rows with non-finite inputs");
    // coefficients beyond float (issue 26 case 2): each refused up front, naming the value
    const sph_loss_agg NORM = SPH_AGG_SEQ_MEAN_TOKEN_SUM_NORM;
    CASE(P, K0, NORM, c.p.norm_length = 1e-320, SPH_ERR_INVALID_ARG, "norm_length: 9.99989e-321");
    CASE(P, K0, NORM, c.p.norm_length = 1e-39, SPH_ERR_INVALID_ARG, "norm_length: 1e-39");
    CASE(P, K0, NORM, c.p.norm_length = 1e39, SPH_ERR_INVALID_ARG, "norm_length: 1e+39");
    CASE(P, K0, NORM, c.p.norm_length = 1e38, SPH_ERR_INVALID_ARG, "inverse");
    CASE(P, K0, TM, c.p.norm_length = 1e-320, SPH_ERR_INVALID_ARG, "norm_length: 9.99989e-321");
    CASE(P, SPH_KL_K1, TM, c.p.kl_coef = 1e300, SPH_ERR_INVALID_ARG, "kl_coef: 1e+300");
    CASE(P, SPH_KL_K1, TM, c.p.kl_coef = 1e-40, SPH_ERR_INVALID_ARG, "kl_coef: 1e-40");
    CASE(P, K0, TM, c.p.entropy_coef = 1e39, SPH_ERR_INVALID_ARG, "entropy_coef: 1e+39");
    CASE(P, K0, TM, c.p.entropy_coef = 1e-45, SPH_ERR_INVALID_ARG, "entropy_coef: 1e-45");
    CASE(P, K0, TM, c.p.clip_high = 1e39, SPH_ERR_INVALID_ARG, "clip_high: 1e+39");
    CASE(P, K0, TM, c.p.clip_high = HUGE_VAL, SPH_ERR_INVALID_ARG, "clip_high: inf");
    CASE(P, K0, TM, c.p.clip_low = 1e-310, SPH_ERR_INVALID_ARG, "clip_low: 1e-310");
    CASE(P, K0, TM, c.p.clip_ratio_c = 1e39, SPH_ERR_INVALID_ARG, "clip_ratio_c: 1e+39");
    CASE(P, K0, TM, c.p.clip_ratio_c = -HUGE_VAL, SPH_ERR_INVALID_ARG, "clip_ratio_c: -inf");
    // products the loss forms from the coefficients alone: -c eta and c beta, c <= 1 / L
    CASE(P, K0, NORM, c.p.entropy_coef = 1e30; c.p.norm_length = 1e-10, SPH_ERR_INVALID_ARG,
         "entropy gradient");
    CASE(P, SPH_KL_K1, NORM, c.p.kl_coef = 1e30; c.p.norm_length = 1e-10, SPH_ERR_INVALID_ARG,
         "KL gradient");
#undef CASE
    /* bad values on inactive rows or ignored targets are fine */
    setup(&c, &r, P, K3, TM);
    c.adv[5] = NAN, c.old[5] = HUGE_VAL, c.ref[5] = NAN;
    c.h.tgt[3] = -100, c.adv[3] = NAN;
    expect_ok(pc_run(ctx, &c));
    for (int m = 0; m < SPH_POLICY_N_METRICS; m++) assert_true(isfinite(c.metrics[m]));
    pc_free(&c);
    /* a workspace too small */
    setup(&c, &r, P, K0, TM);
    size_t bytes = 0;
    expect_ok(sph_policy_loss_workspace_size(ctx, &c.h.a, &c.p, &bytes));
    if (bytes > 0) {
        snap sn[6];
        take(&c, sn);
        void *ws = hc_alloc(bytes);
        expect_status(sph_policy_loss(ctx, &c.h.a, &c.p, ws, bytes - 1), SPH_ERR_WORKSPACE,
                      "workspace");
        free(ws);
        untouched(&c, sn);
    }
    pc_free(&c);
    sph_ctx_destroy(ctx);
}

/* Aliasing (issue 26 case 1): every pair of the call's regions where one is written (the
 * head's outputs, the loss's metrics, the workspace) against every other (the head's and the
 * loss's inputs and outputs), made to overlap by pointing the smaller at the larger's bytes:
 * SPH_ERR_INVALID_ARG naming the overlap, nothing written. Two inputs may share memory. */
typedef struct slot {
    const char *name;
    sph_tensor *t;
    size_t bytes;
    int out;
} slot;

static int slots_of(pcase *c, slot *s) {
    const int64_t N = c->h.N, H = c->h.H, V = c->h.V_loc;
    const size_t es = hc_esize(c->h.dt), gs = hc_esize(c->h.gdt);
    int n = 0;
#define SLOT(nm, tt, b, o) s[n++] = (slot){nm, &c->tt, (size_t)(b), o}
    SLOT("hidden", h.th, N * H * (int64_t)es, 0);
    SLOT("weight", h.tw, V * H * (int64_t)es, 0);
    SLOT("targets", h.tt, N * 8, 0);
    SLOT("active_mask", h.tm, N, 0);
    SLOT("advantages", tadv, N * 4, 0);
    SLOT("old_logprob", told, N * 4, 0);
    SLOT("ref_logprob", tref, N * 4, 0);
    SLOT("is_weight", tisw, N * 4, 0);
    SLOT("seq_id", tseq, N * 8, 0);
    SLOT("logprob", h.tlp, N * 4, 1);
    SLOT("entropy", h.tent, N * 4, 1);
    SLOT("stats", h.tst, N * 12, 1);
    SLOT("dhidden", h.tdh, N * H * (int64_t)gs, 1);
    SLOT("dweight", h.tdw, V * H * (int64_t)gs, 1);
    SLOT("metrics", tmet, SPH_POLICY_N_METRICS * 4, 1);
#undef SLOT
    return n;
}

static void alias_setup(pcase *c, sph_rng *r) {
    /* every tensor read: k3 reads ref_logprob, seq-mean-token-mean reads seq_id */
    setup(c, r, SPH_PG_PPO, SPH_KL_K3, SPH_AGG_SEQ_MEAN_TOKEN_MEAN);
}

static void aliasing(const char *kernel) {
    sph_rng r;
    rng_seed(&r, test_seed());
    sph_ctx_t ctx = hc_ctx(kernel, 1, NULL);
    pcase c;
    slot sl[16];
    alias_setup(&c, &r);
    const int n = slots_of(&c, sl);
    pc_free(&c);
    int pairs = 0;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            if (!sl[i].out && !sl[j].out) continue;
            alias_setup(&c, &r);
            slot s[16];
            slots_of(&c, s);
            /* the smaller one moves onto the larger's first bytes (nothing beyond a buffer
             * is touched even by a call that wrongly runs) */
            slot *small = s[i].bytes <= s[j].bytes ? &s[i] : &s[j];
            slot *large = small == &s[i] ? &s[j] : &s[i];
            small->t->data = large->t->data;
            char needle[96];
            snprintf(needle, sizeof needle, "overlap");
            expect_bad(ctx, &c, SPH_ERR_INVALID_ARG, needle);
            const char *m = sph_last_error();
            if (!strstr(m, s[i].name) || !strstr(m, s[j].name))
                fail_msg("%s / %s: the message names neither or one: %s", s[i].name, s[j].name, m);
            pc_free(&c);
            pairs++;
        }
    assert_true(pairs >= 60);
    /* the workspace against every region (optimized kernels: the reference asks for none) */
    int ws_pairs = 0;
    for (int i = 0; i < n; i++) {
        alias_setup(&c, &r);
        size_t need = 0;
        expect_ok(sph_policy_loss_workspace_size(ctx, &c.h.a, &c.p, &need));
        if (need == 0) {
            pc_free(&c);
            continue;
        }
        ws_pairs++;
        slot s[16];
        slots_of(&c, s);
        snap sn[6];
        take(&c, sn);
        void *ws = hc_alloc(need > s[i].bytes ? need : s[i].bytes);
        void *keep = s[i].t->data;
        if (need > s[i].bytes) {
            memcpy(ws, keep, s[i].bytes); /* the tensor's values, moved into the workspace */
            s[i].t->data = ws;
        } else {
            free(ws);
            ws = keep;
        }
        sph_status st = sph_policy_loss(ctx, &c.h.a, &c.p, ws, need);
        if (st != SPH_ERR_INVALID_ARG || !strstr(sph_last_error(), "workspace") ||
            !strstr(sph_last_error(), s[i].name))
            fail_msg("workspace over %s: status %d: %s", s[i].name, (int)st, sph_last_error());
        if (ws != keep) free(ws);
        s[i].t->data = keep;
        untouched(&c, sn);
        pc_free(&c);
    }
    if (kernel == NULL) assert_int_equal(ws_pairs, n); /* the CPU backend has a workspace */
    /* inputs may share memory: advantages and old_logprob on the same bytes run */
    alias_setup(&c, &r);
    c.tadv.data = c.old;
    expect_ok(pc_run(ctx, &c));
    pc_free(&c);
    sph_ctx_destroy(ctx);
}

static void test_aliasing_ref(void **state) {
    (void)state;
    aliasing("ref");
}

static void test_aliasing_cpu(void **state) {
    (void)state;
    aliasing(NULL);
}

/* One context used by two threads at once (issue 26 case 10): a call made while another is
 * running on the context is refused, never run beside it. Two threads call sph_policy_loss
 * on their own cases through one context until refusals are seen; every call that ran
 * returns the single-threaded answer bit for bit, every refusal names the cause. */
typedef struct busy_job {
    sph_ctx_t ctx;
    pcase *c;
    volatile int stop;
    int refused, ran, wrong;
    float want[SPH_POLICY_N_METRICS];
} busy_job;

static void *busy_main(void *arg) {
    busy_job *j = arg;
    while (!j->stop) {
        sph_status st = pc_run(j->ctx, j->c);
        if (st == SPH_OK) {
            j->ran++;
            if (memcmp(j->c->metrics, j->want, sizeof j->want)) j->wrong++;
        } else {
            if (!strstr(sph_last_error(), "in use by another call")) j->wrong++;
            j->refused++;
        }
    }
    return NULL;
}

static void test_one_thread_at_a_time(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    sph_ctx_t ctx = hc_ctx(NULL, 1, NULL);
    pcase a, b;
    pc_init(&a, &r, 64, 32, 300, 300, 0, SPH_F32);
    pc_wire(&a, HC_LP | HC_DH | HC_DW, SPH_PG_PPO, SPH_KL_NONE, SPH_AGG_TOKEN_MEAN);
    pc_init(&b, &r, 64, 32, 300, 300, 0, SPH_F32);
    pc_wire(&b, HC_LP | HC_DH | HC_DW, SPH_PG_PPO, SPH_KL_NONE, SPH_AGG_TOKEN_MEAN);
    busy_job ja = {ctx, &a, 0, 0, 0, 0, {0}}, jb = {ctx, &b, 0, 0, 0, 0, {0}};
    expect_ok(pc_run(ctx, &a));
    memcpy(ja.want, a.metrics, sizeof ja.want);
    expect_ok(pc_run(ctx, &b));
    memcpy(jb.want, b.metrics, sizeof jb.want);
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, busy_main, &ja), 0);
    assert_int_equal(pthread_create(&tb, NULL, busy_main, &jb), 0);
    const struct timespec ms = {.tv_nsec = 1000000};
    for (int k = 0; k < 2000 && ja.refused + jb.refused < 3; k++) thrd_sleep(&ms, NULL);
    ja.stop = jb.stop = 1;
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    print_message("one context, two threads: %d + %d calls ran, %d + %d refused\n", ja.ran,
                  jb.ran, ja.refused, jb.refused);
    assert_true(ja.refused + jb.refused >= 1);
    assert_int_equal(ja.wrong + jb.wrong, 0);
    /* the word is given back: the context serves the next call */
    expect_ok(pc_run(ctx, &a));
    pc_free(&a);
    pc_free(&b);
    sph_ctx_destroy(ctx);
}

static void test_bad_inputs_ref(void **state) {
    (void)state;
    bad_inputs("ref");
}

static void test_bad_inputs_cpu(void **state) {
    (void)state;
    bad_inputs(NULL);
}

/* A sequence group whose ranks disagree on N: SPH_ERR_MISMATCH on every rank, no hang. */
typedef struct mm_job {
    tp_group *g;
    int64_t rank, N;
    sph_status st;
    char msg[256];
} mm_job;

static void *mm_main(void *arg) {
    mm_job *j = arg;
    sph_rng r;
    rng_seed(&r, 5);
    pcase c;
    pc_init(&c, &r, j->N, 4, 7, 7, 0, SPH_F32);
    pc_wire(&c, HC_LP | HC_DH, SPH_PG_PPO, SPH_KL_NONE, SPH_AGG_SEQ_MEAN_TOKEN_MEAN);
    struct sph_comm comm = tp_comm_of(j->g, j->rank);
    c.p.seq_comm = &comm;
    sph_ctx_t ctx = hc_ctx(NULL, 1, NULL);
    j->st = pc_run(ctx, &c);
    snprintf(j->msg, sizeof j->msg, "%s", sph_last_error());
    sph_ctx_destroy(ctx);
    pc_free(&c);
    return NULL;
}

static void test_group_mismatch(void **state) {
    (void)state;
    tp_group g;
    tp_group_init(&g, 2);
    mm_job jobs[2] = {{&g, 0, 10, SPH_OK, ""}, {&g, 1, 11, SPH_OK, ""}};
    pthread_t th[2];
    for (int k = 0; k < 2; k++) pthread_create(&th[k], NULL, mm_main, &jobs[k]);
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    tp_group_destroy(&g);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(jobs[k].st, SPH_ERR_MISMATCH);
        assert_non_null(strstr(jobs[k].msg, "seq_comm"));
    }
}

/* TP ranks whose policy arguments differ: SPH_ERR_MISMATCH on every rank, nothing written. */
typedef struct tpm_job {
    tp_group *g;
    int64_t rank;
    int what; /* 0: advantages differ, 1: clip_high differs, 2: rank 1 refuses its call */
    sph_status st;
    char msg[256];
    int untouched;
} tpm_job;

static void *tpm_main(void *arg) {
    tpm_job *j = arg;
    sph_rng r;
    rng_seed(&r, 77);
    pcase c;
    pc_init(&c, &r, 10, 4, 6, 12, 6 * j->rank, SPH_F32);
    pc_wire(&c, HC_LP | HC_DH | HC_DW, SPH_PG_PPO, SPH_KL_NONE, SPH_AGG_TOKEN_MEAN);
    if (j->rank == 1 && j->what == 0) c.adv[2] += 1.0f;
    if (j->rank == 1 && j->what == 1) c.p.clip_high = 0.3;
    if (j->rank == 1 && j->what == 2) c.p.kl_coef = -1, c.p.kl = SPH_KL_K1;
    pc_poison(&c);
    float lp0 = c.h.lp[0];
    struct sph_comm comm = tp_comm_of(j->g, j->rank);
    sph_ctx_t ctx = hc_ctx(NULL, 1, &comm);
    /* the pass itself even when this rank's workspace query fails: every rank must reach the
     * group's agreement (a caller that stops after a failed query leaves the others waiting,
     * as with any collective) */
    size_t bytes = 0;
    void *ws = NULL;
    if (sph_policy_loss_workspace_size(ctx, &c.h.a, &c.p, &bytes) == SPH_OK) ws = hc_alloc(bytes);
    j->st = sph_policy_loss(ctx, &c.h.a, &c.p, ws, bytes);
    free(ws);
    snprintf(j->msg, sizeof j->msg, "%s", sph_last_error());
    j->untouched = memcmp(&lp0, &c.h.lp[0], 4) == 0;
    sph_ctx_destroy(ctx);
    pc_free(&c);
    return NULL;
}

static void test_tp_mismatch(void **state) {
    (void)state;
    for (int what = 0; what < 3; what++) {
        tp_group g;
        tp_group_init(&g, 2);
        tpm_job jobs[2];
        memset(jobs, 0, sizeof jobs);
        pthread_t th[2];
        for (int k = 0; k < 2; k++) {
            jobs[k].g = &g, jobs[k].rank = k, jobs[k].what = what;
            pthread_create(&th[k], NULL, tpm_main, &jobs[k]);
        }
        for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
        tp_group_destroy(&g);
        for (int k = 0; k < 2; k++) {
            assert_true(jobs[k].untouched);
            if (what == 2) {
                /* the refusing rank keeps its message, the other is told */
                assert_int_equal(jobs[k].st, SPH_ERR_INVALID_ARG);
                assert_non_null(strstr(jobs[k].msg, k == 1 ? "kl_coef: -1" : "refused"));
            } else {
                assert_int_equal(jobs[k].st, SPH_ERR_MISMATCH);
                assert_non_null(strstr(jobs[k].msg, what == 0 ? "per-row inputs" : "clip_high"));
            }
        }
    }
}

/* One exchange of consistency records per policy call (issue 27): the head's record and the
 * loss's travel in one allgather, not two. The in-process group's allgather is wrapped to
 * count the exchanges that carry a record (its first word a record tag: the head's
 * "SPHPTP01", the loss's "SPPOLY01"). */
static int g_agree_calls[2];
static sph_status counting_allgather(sph_comm_t c, const void *send, void *recv, size_t bytes,
                                     void *stream) {
    int64_t w0 = 0;
    if (bytes >= sizeof w0) memcpy(&w0, send, sizeof w0);
    if (w0 == INT64_C(0x3130504350485053) || w0 == INT64_C(0x3130594c4f505053))
        g_agree_calls[c->rank]++;
    return tp_allgather(c, send, recv, bytes, stream);
}
static const sph_comm_ops counting_ops = {counting_allgather, tp_allreduce, tp_destroy};

typedef struct one_job {
    tp_group *g;
    int64_t rank;
    sph_status st;
} one_job;

static void *one_main(void *arg) {
    one_job *j = arg;
    sph_rng r;
    rng_seed(&r, 78);
    pcase c;
    pc_init(&c, &r, 10, 4, 6, 12, 6 * j->rank, SPH_F32);
    pc_wire(&c, HC_LP | HC_DH | HC_DW, SPH_PG_PPO, SPH_KL_NONE, SPH_AGG_TOKEN_MEAN);
    struct sph_comm comm = tp_comm_of(j->g, j->rank);
    comm.ops = &counting_ops;
    sph_ctx_t ctx = hc_ctx(NULL, 1, &comm);
    size_t bytes = 0;
    void *ws = NULL;
    if (sph_policy_loss_workspace_size(ctx, &c.h.a, &c.p, &bytes) == SPH_OK) ws = hc_alloc(bytes);
    j->st = sph_policy_loss(ctx, &c.h.a, &c.p, ws, bytes);
    free(ws);
    sph_ctx_destroy(ctx);
    pc_free(&c);
    return NULL;
}

static void test_tp_one_exchange(void **state) {
    (void)state;
    tp_group g;
    tp_group_init(&g, 2);
    one_job jobs[2];
    memset(jobs, 0, sizeof jobs);
    memset(g_agree_calls, 0, sizeof g_agree_calls);
    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
        jobs[k].g = &g, jobs[k].rank = k;
        pthread_create(&th[k], NULL, one_main, &jobs[k]);
    }
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    tp_group_destroy(&g);
    for (int k = 0; k < 2; k++) {
        expect_ok(jobs[k].st);
        assert_int_equal(g_agree_calls[k], 1);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_inputs_ref),
        cmocka_unit_test(test_bad_inputs_cpu),
        cmocka_unit_test(test_aliasing_ref),
        cmocka_unit_test(test_aliasing_cpu),
        cmocka_unit_test(test_one_thread_at_a_time),
        cmocka_unit_test(test_group_mismatch),
        cmocka_unit_test(test_tp_mismatch),
        cmocka_unit_test(test_tp_one_exchange),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
