/*
 * cuda_case.h - the helpers of test_head_cuda.c: device mirrors of a host case (test_head_case.h),
 * the A/B switches and contexts of the tests, one GPU pass, the float64 reference of a case,
 * the column and gradient checks under the budgets of tolerances.h, and a run's configuration
 * (gcfg). Included once, by test_head_cuda.c, after the CUDA headers it needs.
 */
#ifndef SPH_TESTS_GPU_CUDA_CASE_H
#define SPH_TESTS_GPU_CUDA_CASE_H

// ---- device mirrors of a host case ---------------------------------------------------------

#define NF 16
static const size_t k_fields[NF] = {
    offsetof(sph_head_args, hidden),      offsetof(sph_head_args, weight),
    offsetof(sph_head_args, targets),     offsetof(sph_head_args, candidates),
    offsetof(sph_head_args, active_mask), offsetof(sph_head_args, logprob),
    offsetof(sph_head_args, entropy),     offsetof(sph_head_args, lse),
    offsetof(sph_head_args, logit_mean),  offsetof(sph_head_args, stats),
    offsetof(sph_head_args, dlogprob),    offsetof(sph_head_args, dentropy),
    offsetof(sph_head_args, dlse),        offsetof(sph_head_args, dlogit_mean),
    offsetof(sph_head_args, dhidden),     offsetof(sph_head_args, dweight)};
static const int k_is_out[NF] = {0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1};

typedef struct mirror {
    sph_head_args a;
    sph_tensor t[NF];
    int64_t shp[NF][2];
    void *dev[NF];
    const sph_tensor *host[NF];
    size_t bytes[NF];
} mirror;

static size_t t_bytes(const sph_tensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n * (t->dtype.bits / 8);
}

/* Device copies of every tensor of ha (contents included: poisoned outputs stay poisoned,
 * accumulate inputs keep their values). */
static void mirror_make(sph_ctx_t g, const sph_head_args *ha, mirror *m) {
    memset(m, 0, sizeof *m);
    m->a = *ha;
    for (int k = 0; k < NF; k++) {
        const sph_tensor **pf = (const sph_tensor **)((char *)&m->a + k_fields[k]);
        const sph_tensor *t = *pf;
        m->host[k] = t;
        if (!t) continue;
        m->bytes[k] = t_bytes(t);
        expect_ok(sph_ctx_malloc(g, m->bytes[k], &m->dev[k]));
        expect_ok(sph_ctx_memcpy(g, m->dev[k], t->data, m->bytes[k]));
        m->t[k] = *t;
        m->t[k].data = m->dev[k];
        m->t[k].device.type = SPH_DEVICE_CUDA;
        m->t[k].device.id = 0;
        for (int d = 0; d < t->ndim; d++) m->shp[k][d] = t->shape[d];
        m->t[k].shape = m->shp[k];
        m->t[k].strides = NULL;
        *pf = &m->t[k];
    }
}

static void mirror_back(sph_ctx_t g, mirror *m) {
    for (int k = 0; k < NF; k++)
        if (m->dev[k] && k_is_out[k])
            expect_ok(sph_ctx_memcpy(g, m->host[k]->data, m->dev[k], m->bytes[k]));
}

static void mirror_free(sph_ctx_t g, mirror *m) {
    for (int k = 0; k < NF; k++) sph_ctx_free(g, m->dev[k]);
}

/* The A/B switches of the contexts the tests create (sph_cuda_flag): the environment's first
 * (the device scripts run the suite again under SPH_CUDA_*=...; sph_ctx_opts_apply_env), then
 * the tests' own (cuda_switch); g_schedule is what the direct sm_90a kernel calls use. */
static uint32_t g_force_on, g_force_off;
static int g_schedule = SPH_SM90_SCHED_AUTO;

/* flag on (1), off (0), or as the environment says (-1). */
static void cuda_switch(uint32_t flag, int state) {
    g_force_on &= ~flag, g_force_off &= ~flag;
    if (state == 1) g_force_on |= flag;
    if (state == 0) g_force_off |= flag;
}

/* The sm_90a schedule, contexts and direct kernel calls alike: SPH_SM90_SCHED_PINGPONG,
 * _COOPERATIVE, or -1 (the environment's, else by H). */
static void schedule_force(int sched) {
    const uint32_t both = SPH_CUDA_FLAG_PINGPONG | SPH_CUDA_FLAG_COOPERATIVE;
    cuda_switch(both, sched < 0 ? -1 : 0);
    if (sched == SPH_SM90_SCHED_PINGPONG) cuda_switch(SPH_CUDA_FLAG_PINGPONG, 1);
    if (sched == SPH_SM90_SCHED_COOPERATIVE) cuda_switch(SPH_CUDA_FLAG_COOPERATIVE, 1);
    g_schedule = sched < 0 ? SPH_SM90_SCHED_AUTO : sched;
}

static sph_ctx_t gpu_ctx(int64_t chunk_bytes, int bi, void *stream) {
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    expect_ok(sph_ctx_opts_apply_env(&o));
    o.cuda_flags = (o.cuda_flags & ~g_force_off) | g_force_on;
    o.device.type = SPH_DEVICE_CUDA;
    o.chunk_bytes = chunk_bytes;
    o.batch_invariant = bi;
    o.stream = stream;
    o.tune_cache = "/nonexistent/spanhead-test-tune.json";
    sph_ctx_t ctx = NULL;
    expect_ok(sph_ctx_create(&ctx, &o));
    return ctx;
}

/* Workspaces poisoned (0xff bytes: NaN as fp32 and as half) before the pass when set: a
 * region read before it is written (an accumulator not zeroed) shows up in the outputs. */
static int g_poison_ws;

static sph_status gpu_run(sph_ctx_t g, sph_head_pass pass, const sph_head_args *a) {
    size_t bytes = 0;
    sph_status s = sph_head_workspace_size(g, pass, a, &bytes);
    if (s != SPH_OK) return s;
    void *ws = NULL;
    expect_ok(sph_ctx_malloc(g, bytes, &ws));
    if (g_poison_ws) expect_ok(sph_ctx_memset(g, ws, 0xff, bytes));
    s = pass == SPH_HEAD_FORWARD ? sph_head_forward(g, a, ws, bytes)
                                 : sph_head_backward(g, a, ws, bytes);
    if (s == SPH_OK) s = sph_ctx_synchronize(g);
    sph_ctx_free(g, ws);
    return s;
}

// ---- reference ------------------------------------------------------------------------------

typedef struct refout {
    double *rows; /* (N, 7): logprob, entropy, lse, logit_mean, m, lse, mu */
    double *dh, *dw;
} refout;

static void ref_run(hcase *c, sph_head_pass pass, int grads, refout *r) {
    sph_ctx_t ctx = hc_ctx("ref", 1, NULL);
    sph_head_plan p;
    expect_ok(sph_head_plan_make(ctx, pass, &c->a, &p));
    r->rows = hc_alloc((size_t)c->N * 7 * 8);
    expect_ok(sph_head_ref_rows_f64(&p, r->rows));
    r->dh = r->dw = NULL;
    if (grads) {
        double *st = hc_alloc((size_t)c->N * 3 * 8);
        for (int64_t i = 0; i < c->N; i++)
            for (int f = 0; f < 3; f++) st[i * 3 + f] = r->rows[i * 7 + 4 + f];
        r->dh = hc_alloc((size_t)(c->N * c->H) * 8 + 8);
        r->dw = hc_alloc((size_t)(c->V_loc * c->H) * 8 + 8);
        expect_ok(sph_head_ref_backward_f64(&p, st, r->dh, r->dw));
        free(st);
    }
    sph_ctx_destroy(ctx);
}

static void ref_free(refout *r) { free(r->rows), free(r->dh), free(r->dw); }

static int check_col(const char *what, const char *cs, const float *got, const double *rows,
                     int col, int64_t N, int stride, double tol) {
    double *ref = hc_alloc((size_t)N * 8);
    for (int64_t i = 0; i < N; i++) ref[i] = rows[i * 7 + col];
    float *g = hc_alloc((size_t)N * 4);
    for (int64_t i = 0; i < N; i++) g[i] = got[i * stride];
    int ok = hc_close(what, cs, g, SPH_F32, ref, SPH_F64, N, tol);
    free(ref), free(g);
    return ok;
}

/* One GPU run of the case against the reference. what: HC_* wiring; pass: forward (one-pass
 * when grads are wired) or backward (after a GPU forward for the stats). */
typedef struct gcfg {
    sph_dtype dt, gdt;
    int64_t N, H, V_loc, V, v0, K;
    double mask_frac; /* < 0: no mask */
    int use_spans, acc, one_pass, entropy;
    double temp, cap;
    int64_t chunk_bytes;
    int bi; /* batch-invariant context (fixed-tile mma logits) */
} gcfg;

/* The budgets of tolerances.h for a GPU run with input dtype dt: per-row outputs (f32:
 * TOL_CUDA_F32, half: TOL_CUDA_HALF_ROWS) and the gradient terms (the dlogits rounded to the
 * input dtype: u_D, f16 underflow eta_D). */
static double rows_tol(sph_dtype dt) { return dt.bits == 16 ? TOL_CUDA_HALF_ROWS : TOL_CUDA_F32; }
static double grad_uD(sph_dtype dt) {
    return dt.bits != 16 ? 0 : dt.code == SPH_DTYPE_BFLOAT ? TOL_U_BF16 : TOL_U_F16;
}
static double grad_etaD(sph_dtype dt) {
    return dt.bits == 16 && dt.code == SPH_DTYPE_FLOAT ? TOL_ETA_F16 : 0;
}

/* A GPU gradient output against start + the reference's gradient under the gradient budget,
 * with A and Z from the independent backward. */
static int check_grad_gpu(const char *what, const char *cs, const void *got, sph_dtype gdt,
                          const double *start, const double *g, const double *A, const double *Z,
                          int64_t n, sph_dtype dt) {
    double *exp = hc_alloc((size_t)n * 8 + 8);
    for (int64_t k = 0; k < n; k++) exp[k] = start[k] + g[k];
    int ok = hc_check_grad(what, cs, got, gdt, exp, g, A, Z, n, TOL_CUDA_F32, grad_uD(dt),
                           grad_etaD(dt), TOL_ACC_CUDA, TOL_CUDA_MARGIN);
    free(exp);
    return ok;
}

#endif /* SPH_TESTS_GPU_CUDA_CASE_H */
