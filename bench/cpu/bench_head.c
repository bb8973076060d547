/*
 * bench_head.c - the CPU LM head against its active floor and against the plain dense
 * approach, measured in the same run (issue 3's performance section).
 *
 * For each (N, H, V_loc), dtype (f32, bf16) and active fraction (1.0, 0.5, 0.25; random rows):
 *   fused fwd+bwd latency (median, p10/p90 of --repeats runs), achieved GFLOP/s over the
 *   active work 8 N_active H V_loc, the active floor = that work / this machine's sgemm rate
 *   (measured here on a (2048 x H) x (H x 4096) product, best of 5), the ratio to the floor,
 *   the masked / dense time ratio, and the workspace (the only extra memory).
 * Dense baseline (active 1.0, all rows, as a framework would do it on a CPU): convert to f32,
 *   Z = H W^T through one sgemm (N x V_loc logits), log-softmax and gather, then
 *   dZ = g (onehot - p), dH = dZ W, dW = dZ^T H (two sgemm): speed and peak extra memory.
 * Every configuration is validated once against the float64 reference on a 64-row slice.
 *
 * usage: bench_head [--quick] [--repeats R] [--threads T] [--csv]
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_cpu.h"
#include "spanhead.h"

static uint64_t rng_s = 88172645463325252ull;
static double urand(void) {
    rng_s ^= rng_s << 13, rng_s ^= rng_s >> 7, rng_s ^= rng_s << 17;
    return (double)(rng_s >> 11) * 0x1.0p-53;
}
static float nrand(void) {
    double u = urand() + 1e-300, v = urand();
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}
static uint16_t to_bf16(float f) {
    union { float f; uint32_t u; } x = {f};
    return (uint16_t)((x.u + 0x7fffu + ((x.u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t b) {
    union { uint32_t u; float f; } x = {(uint32_t)b << 16};
    return x.f;
}

#define DIE(...)                                                                              \
    do {                                                                                      \
        fprintf(stderr, "bench_head: " __VA_ARGS__);                                          \
        fprintf(stderr, "\n");                                                                \
        exit(1);                                                                              \
    } while (0)
#define TRY(call)                                                                             \
    do {                                                                                      \
        sph_status s_ = (call);                                                               \
        if (s_) DIE("%s: %s (%s)", #call, sph_status_str(s_), sph_last_error());              \
    } while (0)

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) DIE("out of memory (%zu bytes)", n);
    return p;
}

/* This machine's fp32 GEMM rate on a (2048 x H) x (H x 4096) product. The VMs this runs on
 * change speed by up to 2x over minutes, so a sample is taken right before every timed
 * repetition and each configuration's floor uses the best rate seen during it. */
typedef struct rate_probe {
    float *a, *b, *c;
    int m, n, k;
    double best;
} rate_probe;

static void probe_init(rate_probe *r, int64_t H) {
    r->m = 2048, r->n = 4096, r->k = (int)H, r->best = 0;
    r->a = xmalloc((size_t)r->m * r->k * 4), r->b = xmalloc((size_t)r->n * r->k * 4);
    r->c = xmalloc((size_t)r->m * r->n * 4);
    for (size_t i = 0; i < (size_t)r->m * r->k; i++) r->a[i] = nrand();
    for (size_t i = 0; i < (size_t)r->n * r->k; i++) r->b[i] = nrand();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r->m, r->n, r->k, 1, r->a, r->k, r->b,
                r->k, 0, r->c, r->n); /* warm-up */
}

static double probe_sample(rate_probe *r) {
    double t0 = now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r->m, r->n, r->k, 1, r->a, r->k, r->b,
                r->k, 0, r->c, r->n);
    double rate = 2.0 * r->m * r->n * (double)r->k / (now_s() - t0);
    if (rate > r->best) r->best = rate;
    return rate;
}

static void probe_free(rate_probe *r) { free(r->a), free(r->b), free(r->c); }

typedef struct prob {
    int64_t N, H, V;
    int bf16;
    void *h, *w;
    int64_t *t;
    uint8_t *mask;
    float *g, *lp, *st, *dh, *dw;
    int64_t sh[2], sw[2], sn[1], ss[2];
    sph_tensor th, tw, tt, tm, tg, tlp, tst, tdh, tdw;
} prob;

static void prob_init(prob *p, int64_t N, int64_t H, int64_t V, int bf16) {
    memset(p, 0, sizeof *p);
    p->N = N, p->H = H, p->V = V, p->bf16 = bf16;
    size_t es = bf16 ? 2 : 4;
    p->h = xmalloc((size_t)(N * H) * es), p->w = xmalloc((size_t)(V * H) * es);
    for (int64_t k = 0; k < N * H; k++) {
        float v = nrand();
        if (bf16) ((uint16_t *)p->h)[k] = to_bf16(v);
        else ((float *)p->h)[k] = v;
    }
    float ws = (float)(2.5 / sqrt((double)H));
    for (int64_t k = 0; k < V * H; k++) {
        float v = nrand() * ws;
        if (bf16) ((uint16_t *)p->w)[k] = to_bf16(v);
        else ((float *)p->w)[k] = v;
    }
    p->t = xmalloc((size_t)N * 8), p->mask = xmalloc((size_t)N), p->g = xmalloc((size_t)N * 4);
    for (int64_t i = 0; i < N; i++) p->t[i] = (int64_t)(urand() * (double)V), p->g[i] = nrand();
    p->lp = xmalloc((size_t)N * 4), p->st = xmalloc((size_t)N * 12);
    p->dh = xmalloc((size_t)(N * H) * 4), p->dw = xmalloc((size_t)(V * H) * 4);
    sph_dtype dt = bf16 ? SPH_BF16 : SPH_F32;
    sph_device cpu = {SPH_DEVICE_CPU, 0};
    p->sh[0] = N, p->sh[1] = H, p->sw[0] = V, p->sw[1] = H, p->sn[0] = N, p->ss[0] = N, p->ss[1] = 3;
    p->th = (sph_tensor){p->h, cpu, 2, dt, p->sh, NULL, 0};
    p->tw = (sph_tensor){p->w, cpu, 2, dt, p->sw, NULL, 0};
    p->tt = (sph_tensor){p->t, cpu, 1, SPH_I64, p->sn, NULL, 0};
    p->tm = (sph_tensor){p->mask, cpu, 1, SPH_U8, p->sn, NULL, 0};
    p->tg = (sph_tensor){p->g, cpu, 1, SPH_F32, p->sn, NULL, 0};
    p->tlp = (sph_tensor){p->lp, cpu, 1, SPH_F32, p->sn, NULL, 0};
    p->tst = (sph_tensor){p->st, cpu, 2, SPH_F32, p->ss, NULL, 0};
    p->tdh = (sph_tensor){p->dh, cpu, 2, SPH_F32, p->sh, NULL, 0};
    p->tdw = (sph_tensor){p->dw, cpu, 2, SPH_F32, p->sw, NULL, 0};
}

static void prob_free(prob *p) {
    free(p->h), free(p->w), free(p->t), free(p->mask), free(p->g), free(p->lp), free(p->st),
        free(p->dh), free(p->dw);
}

static void args_of(prob *p, int masked, sph_head_args *fa, sph_head_args *ba) {
    sph_head_args a = SPH_HEAD_ARGS_INIT;
    a.hidden = &p->th, a.weight = &p->tw, a.targets = &p->tt, a.stats = &p->tst;
    a.active_mask = masked ? &p->tm : NULL;
    a.logprob = &p->tlp;
    *fa = a;
    a.logprob = NULL;
    a.dlogprob = &p->tg, a.dhidden = &p->tdh, a.dweight = &p->tdw;
    *ba = a;
}

/* Validates the fused path against the reference on the first 64 rows (same weights). */
static double validate(sph_ctx_t ctx, prob *p) {
    prob s = *p;
    int64_t n = p->N < 64 ? p->N : 64;
    s.sh[0] = n, s.sn[0] = n, s.ss[0] = n;
    s.th.shape = s.sh, s.tt.shape = s.sn, s.tm.shape = s.sn, s.tg.shape = s.sn;
    s.tlp.shape = s.sn, s.tst.shape = s.ss, s.tdh.shape = s.sh;
    sph_head_args fa, ba;
    args_of(&s, 1, &fa, &ba);
    ba.dweight = NULL; /* dW of 64 rows vs the reference would need a second V x H buffer */
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.force_kernel = "ref";
    sph_ctx_t ref;
    TRY(sph_ctx_create(&ref, &o));
    float *lp = xmalloc((size_t)n * 4), *dh = xmalloc((size_t)(n * p->H) * 4);
    size_t b1, b2;
    TRY(sph_head_workspace_size(ctx, SPH_HEAD_FORWARD, &fa, &b1));
    TRY(sph_head_workspace_size(ctx, SPH_HEAD_BACKWARD, &ba, &b2));
    void *ws = xmalloc(b1 > b2 ? b1 : b2);
    TRY(sph_head_forward(ctx, &fa, ws, b1 > b2 ? b1 : b2));
    TRY(sph_head_backward(ctx, &ba, ws, b1 > b2 ? b1 : b2));
    memcpy(lp, p->lp, (size_t)n * 4), memcpy(dh, p->dh, (size_t)(n * p->H) * 4);
    TRY(sph_head_forward(ref, &fa, NULL, 0));
    TRY(sph_head_backward(ref, &ba, NULL, 0));
    /* normwise relative errors of logprob and dhidden; the larger one */
    double md = 0, mr = 0, hd = 0, hr = 0;
    for (int64_t k = 0; k < n; k++) md = fmax(md, fabs(lp[k] - p->lp[k])), mr = fmax(mr, fabs(p->lp[k]));
    for (int64_t k = 0; k < n * p->H; k++)
        hd = fmax(hd, fabs(dh[k] - p->dh[k])), hr = fmax(hr, fabs(p->dh[k]));
    free(lp), free(dh), free(ws);
    sph_ctx_destroy(ref);
    return fmax(md / (mr > 0 ? mr : 1), hd / (hr > 0 ? hr : 1));
}

/* med/p10/p90/min: latency; paired: median over repetitions of latency x the sgemm rate
 * sampled just before it, i.e. the latency in units of "flops at this moment's GEMM speed"
 * (divide by the work to get the ratio to the floor). Robust to the machine changing speed. */
typedef struct timing { double med, p10, p90, fwd, bwd, min, paired; } timing;

/* one_pass: the forward also produces the gradients (upstream known); no backward call. */
static timing fused(sph_ctx_t ctx, prob *p, int masked, int one_pass, int reps,
                    size_t *ws_bytes, rate_probe *rp) {
    sph_head_args fa, ba;
    args_of(p, masked, &fa, &ba);
    if (one_pass) fa = ba, fa.logprob = &p->tlp;
    size_t b1, b2;
    TRY(sph_head_workspace_size(ctx, SPH_HEAD_FORWARD, &fa, &b1));
    TRY(sph_head_workspace_size(ctx, SPH_HEAD_BACKWARD, &ba, &b2));
    size_t b = b1 > b2 ? b1 : b2;
    *ws_bytes = b;
    void *ws = xmalloc(b);
    double tot[32], tf[32], tb[32], pr[32];
    TRY(sph_head_forward(ctx, &fa, ws, b)); /* warm-up */
    if (!one_pass) TRY(sph_head_backward(ctx, &ba, ws, b));
    for (int r = 0; r < reps; r++) {
        double rate = probe_sample(rp);
        double t0 = now_s();
        TRY(sph_head_forward(ctx, &fa, ws, b));
        double t1 = now_s();
        if (!one_pass) TRY(sph_head_backward(ctx, &ba, ws, b));
        double t2 = now_s();
        tf[r] = t1 - t0, tb[r] = t2 - t1, tot[r] = t2 - t0, pr[r] = tot[r] * rate;
    }
    qsort(pr, (size_t)reps, 8, cmp_d);
    free(ws);
    qsort(tot, (size_t)reps, 8, cmp_d), qsort(tf, (size_t)reps, 8, cmp_d), qsort(tb, (size_t)reps, 8, cmp_d);
    timing t = {tot[reps / 2], tot[reps / 10], tot[reps - 1 - reps / 10], tf[reps / 2], tb[reps / 2],
                tot[0], pr[reps / 2]};
    return t;
}

/* The dense approach: full logits through one sgemm, log-softmax, backward via two sgemm. */
static timing dense(prob *p, int reps, size_t *peak, rate_probe *rp) {
    const int64_t N = p->N, H = p->H, V = p->V;
    double tot[32], pr[32];
    *peak = (size_t)(N * V) * 4 + (p->bf16 ? (size_t)((N + V) * H) * 4 : 0);
    for (int r = 0; r < reps; r++) {
        double rate = probe_sample(rp);
        double t0 = now_s();
        const float *h = p->h, *w = p->w;
        float *hf = NULL, *wf = NULL;
        if (p->bf16) {
            hf = xmalloc((size_t)(N * H) * 4), wf = xmalloc((size_t)(V * H) * 4);
#pragma omp parallel for
            for (int64_t k = 0; k < N * H; k++) hf[k] = from_bf16(((uint16_t *)p->h)[k]);
#pragma omp parallel for
            for (int64_t k = 0; k < V * H; k++) wf[k] = from_bf16(((uint16_t *)p->w)[k]);
            h = hf, w = wf;
        }
        float *Z = xmalloc((size_t)(N * V) * 4);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)V, (int)H, 1, h,
                    (int)H, w, (int)H, 0, Z, (int)V);
#pragma omp parallel for
        for (int64_t i = 0; i < N; i++) { /* log-softmax, logprob, then dZ in place */
            float *z = Z + i * V, m = -INFINITY, s = 0;
            for (int64_t j = 0; j < V; j++) m = fmaxf(m, z[j]);
            for (int64_t j = 0; j < V; j++) s += expf(z[j] - m);
            float lse = m + logf(s);
            p->lp[i] = z[p->t[i]] - lse;
            for (int64_t j = 0; j < V; j++) z[j] = -p->g[i] * expf(z[j] - lse);
            z[p->t[i]] += p->g[i];
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)H, (int)V, 1, Z,
                    (int)V, w, (int)H, 0, p->dh, (int)H);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)V, (int)H, (int)N, 1, Z,
                    (int)V, h, (int)H, 0, p->dw, (int)H);
        free(Z), free(hf), free(wf);
        tot[r] = now_s() - t0;
        pr[r] = tot[r] * rate;
    }
    qsort(tot, (size_t)reps, 8, cmp_d);
    qsort(pr, (size_t)reps, 8, cmp_d);
    timing t = {tot[reps / 2], tot[reps / 10], tot[reps - 1 - reps / 10], 0, 0, tot[0], pr[reps / 2]};
    return t;
}

static void prefer_passive_wait(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("SPH_NO_REEXEC")) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 0) || setenv("SPH_NO_REEXEC", "1", 1)) return;
    execv("/proc/self/exe", argv); /* same reason as spanhead run (cmd_run.c) */
}

int main(int argc, char **argv) {
    prefer_passive_wait(argv);
    int quick = 0, reps = 3, threads = 0, csv = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--csv")) csv = 1;
        else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_head [--quick] [--repeats R] [--threads T] [--csv]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 32) DIE("--repeats: %d, expected 1..32", reps);
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.num_threads = threads;
    sph_ctx_t ctx;
    TRY(sph_ctx_create(&ctx, &o));

    char cpu[128] = "unknown", sha[64] = "unknown", line[256]; /* line: also 3 x 64 cells */
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) snprintf(cpu, sizeof cpu, "%s", c + 2);
            cpu[strcspn(cpu, "\n")] = 0;
            break;
        }
    if (f) fclose(f);
    f = popen("git rev-parse --short HEAD 2>/dev/null; git status --porcelain 2>/dev/null | grep -q . && echo dirty", "r");
    if (f) {
        char a[64] = "", b[64] = "";
        if (fgets(a, sizeof a, f)) a[strcspn(a, "\n")] = 0;
        if (fgets(b, sizeof b, f)) b[strcspn(b, "\n")] = 0;
        snprintf(sha, sizeof sha, "%s%s%s", a, *b ? "+" : "", b);
        pclose(f);
    }
    time_t tnow = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&tnow));
    printf("# machine: %s, %ld cores, %s; compiler gcc %s; Release; commit %s; %s; "
           "OMP_WAIT_POLICY=%s\n",
           cpu, sysconf(_SC_NPROCESSORS_ONLN), sph_ctx_describe(ctx), __VERSION__, sha, date,
           getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "(default)");

    const int64_t shapes[2][3] = {{4096, 1024, 32000}, {8192, 2048, 16000}};
    const int64_t qshapes[2][3] = {{1024, 512, 8000}, {2048, 512, 4000}};
    const double fracs[3] = {1.0, 0.5, 0.25};
    if (csv)
        printf("N,H,V_loc,dtype,active,n_active,fused_ms,p10_ms,p90_ms,fwd_ms,bwd_ms,gflops,"
               "floor_ms,x_floor,x_floor_paired,masked_over_dense,masked_over_dense_paired,workspace_mb,dense_ms,dense_peak_mb,"
               "sgemm_gflops,valid_err\n");
    else
        printf("\n| N | H | V_loc | dtype | active | fused ms (p10-p90) | fwd / bwd ms | GFLOP/s | "
               "sgemm GFLOP/s | floor ms | x floor | x floor (paired) | masked/dense | "
               "masked/dense (paired) | workspace MB | dense ms | dense x floor (paired) | "
               "dense peak MB | check |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int s = 0; s < 2; s++) {
        const int64_t *sh = quick ? qshapes[s] : shapes[s];
        rate_probe rp;
        probe_init(&rp, sh[1]);
        for (int bf = 0; bf < 2; bf++) {
            prob p;
            prob_init(&p, sh[0], sh[1], sh[2], bf);
            size_t dpeak;
            rp.best = 0;
            timing dn = dense(&p, reps, &dpeak, &rp);
            double dense_rate = rp.best;
            double t_full = 0, p_full = 0;
            for (int k = 0; k < 3; k++) {
                int64_t na = 0;
                for (int64_t i = 0; i < p.N; i++) {
                    p.mask[i] = fracs[k] >= 1.0 || urand() < fracs[k];
                    na += p.mask[i];
                }
                double err = validate(ctx, &p);
                size_t wsb;
                rp.best = 0;
                timing t = fused(ctx, &p, fracs[k] < 1.0, 0, reps, &wsb, &rp);
                double rate = rp.best;
                if (k == 0) t_full = t.med, p_full = t.paired;
                double work = 8.0 * (double)na * (double)p.H * (double)p.V;
                double floor_s = work / rate;
                if (csv)
                    printf("%lld,%lld,%lld,%s,%.2f,%lld,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%.3f,"
                           "%.3f,%.3f,%.3f,%.1f,%.1f,%.1f,%.1f,%.1e\n",
                           (long long)p.N, (long long)p.H, (long long)p.V, bf ? "bf16" : "f32",
                           fracs[k], (long long)na, t.med * 1e3, t.p10 * 1e3, t.p90 * 1e3,
                           t.fwd * 1e3, t.bwd * 1e3, work / t.med / 1e9, floor_s * 1e3,
                           t.med / floor_s, t.paired / work, t.med / t_full, t.paired / p_full,
                           wsb / 1048576.0,
                           k == 0 ? dn.med * 1e3 : 0.0, k == 0 ? dpeak / 1048576.0 : 0.0,
                           rate / 1e9, err);
                else
                    printf("| %lld | %lld | %lld | %s | %.2f | %.0f (%.0f-%.0f) | %.0f / %.0f | "
                           "%.1f | %.1f | %.0f | %.2f | %.2f | %.2f | %.2f | %.1f | %s | %s | %s | "
                           "%.0e |\n",
                           (long long)p.N, (long long)p.H, (long long)p.V, bf ? "bf16" : "f32",
                           fracs[k], t.med * 1e3, t.p10 * 1e3, t.p90 * 1e3, t.fwd * 1e3,
                           t.bwd * 1e3, work / t.med / 1e9, rate / 1e9, floor_s * 1e3,
                           t.med / floor_s, t.paired / work, t.med / t_full, t.paired / p_full,
                           wsb / 1048576.0,
                           k == 0 ? (snprintf(line, 64, "%.0f", dn.med * 1e3), line) : "-",
                           k == 0 ? (snprintf(line + 64, 64, "%.2f", dn.paired / work), line + 64)
                                  : "-",
                           k == 0 ? (snprintf(line + 128, 64, "%.0f", dpeak / 1048576.0),
                                     line + 128)
                                  : "-",
                           err);
                if (err > 1e-4) DIE("validation failed: relative error %.2e", err);
                fflush(stdout);
            }
            /* one-pass, every row active: 6 N H V flops, the dense approach's count */
            for (int64_t i = 0; i < p.N; i++) p.mask[i] = 1;
            size_t wsb1;
            rp.best = 0;
            timing op = fused(ctx, &p, 0, 1, reps, &wsb1, &rp);
            double work6 = 6.0 * (double)p.N * (double)p.H * (double)p.V;
            if (!csv) {
                printf("| | | | | | dense: %.0f ms, %.1f GFLOP/s at sgemm %.1f GFLOP/s; %.2f x its "
                       "6NHV floor (paired) | | | | | | | | | | | | | |\n",
                       dn.med * 1e3, work6 / dn.med / 1e9, dense_rate / 1e9, dn.paired / work6);
                printf("| | | | | | fused one-pass (active 1.0): %.0f ms (%.0f-%.0f), %.1f GFLOP/s at "
                       "sgemm %.1f GFLOP/s; %.2f x its 6NHV floor (paired); workspace %.1f MB | "
                       "| | | | | | | | | | | | |\n",
                       op.med * 1e3, op.p10 * 1e3, op.p90 * 1e3, work6 / op.med / 1e9,
                       rp.best / 1e9, op.paired / work6, wsb1 / 1048576.0);
            }
            prob_free(&p);
        }
        probe_free(&rp);
    }
    sph_ctx_destroy(ctx);
    return 0;
}
