/*
 * cmd_bench.c - `spanhead bench`: times the LM head against the active floor (DESIGN.md
 * section 5, issue 6) and the dense path, in one run.
 *
 * Per point (shape, N, active fraction, mask pattern, mode):
 *   rate      dense GEMM rate at the shape (cuBLAS on CUDA through sph_tune_gemm_rate; BLAS
 *             sgemm on CPU), measured once per shape in the same run
 *   ms        median over --repeats of forward + backward (general) or the one-pass forward,
 *             after --warmup runs; each repetition is fenced by sph_ctx_synchronize and timed
 *             with CLOCK_MONOTONIC (ms-scale work: the fence costs microseconds)
 *   floor_ms  8 N_active H V / rate (general) or 6 N_active H V / rate (one-pass)
 *   ratio     ms / floor_ms;  peak_extra_bytes: the workspace (the only device memory the
 *             head takes beyond inputs, outputs and stats)
 * plus the dense path (every row, no mask) of the same shape and mode. Masks: "response"
 * (the last active*2048 rows of each 2048-row sequence), "fragmented" (runs of 16 active rows
 * spread evenly); spans are the exact active runs unless --gap coalesces them.
 * Output: a markdown table on stdout, JSON lines (issue 6's fields) with --json FILE.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"


/* OpenBLAS is linked through libspanhead; declared here so the CLI needs no BLAS header. */
void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                 int lda, const float *b, int ldb, float beta, float *c, int ldc);

typedef struct shape {
    const char *name;
    int64_t H, V;
} shape;

static const shape k_shapes[] = {
    {"A", 2048, 62080}, {"B", 4096, 37984}, {"C", 5120, 37984}, {"D", 2048, 151936}};

typedef struct bopts {
    sph_device_type dev;
    sph_dtype dt;
    const char *dt_name;
    shape shapes[16];
    int n_shapes;
    int64_t Ns[16];
    int n_N;
    double act[16];
    int n_act;
    const char *masks[4];
    int n_masks;
    int modes; /* 1 general, 2 one-pass, 3 both */
    int repeats, warmup;
    int64_t chunk_bytes;
    int64_t gap; /* span coalescing gap */
    const char *json;
    const char *commit;
} bopts;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

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
    if (!strcmp(pattern, "none") || act >= 1.0) {
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

/* Dense GEMM rate (TFLOP/s) of the context's device at (M, N, K). */
static int gemm_rate(sph_ctx_t ctx, const bopts *o, int64_t M, int64_t N, int64_t K,
                     double *tf) {
    if (o->dev == SPH_DEVICE_CUDA) {
        if (sph_tune_gemm_rate(ctx, o->dt, M, N, K, o->repeats, tf) != SPH_OK)
            return sph_cli_fail("bench", 1, "gemm rate: %s", sph_last_error());
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
    double t[16];
    int reps = o->repeats < 16 ? o->repeats : 16;
    for (int r = -1; r < reps; r++) {
        double t0 = now_ms();
        cblas_sgemm(101, 111, 112, (int)m, (int)n, (int)K, 1.f, a, (int)K, b, (int)K, 0.f, c,
                    (int)n);
        if (r >= 0) t[r] = now_ms() - t0;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_d);
    *tf = 2.0 * m * n * K / (t[reps / 2] * 1e-3) / 1e12;
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
    size_t peak;
    int64_t n_active;
} point;

/* Times one configuration; returns 0 and fills pt, or an exit code. */
static int time_point(sph_ctx_t ctx, const bopts *o, const shape *sh, int64_t N, dev_bufs *b,
                      const uint8_t *hmask, const int64_t *spans, int64_t n_spans, int masked,
                      int one_pass, double rate, point *pt) {
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
    if (need > b->ws_bytes) {
        sph_ctx_free(ctx, b->ws);
        b->ws = NULL, b->ws_bytes = 0;
        if (sph_ctx_malloc(ctx, need, &b->ws) != SPH_OK)
            return sph_cli_fail("bench", 1, "workspace: %s", sph_last_error());
        b->ws_bytes = need;
    }
    (void)hmask;
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
    qsort(t, (size_t)o->repeats, sizeof t[0], cmp_d);
    pt->ms = t[o->repeats / 2];
    free(t);
    double flops = (one_pass ? 6.0 : 8.0) * (double)pt->n_active * sh->H * sh->V;
    pt->floor_ms = flops / (rate * 1e12) * 1e3;
    pt->ratio = pt->ms / pt->floor_ms;
    pt->peak = need;
    pt->one_pass = one_pass;
    return 0;
}

static void emit(FILE *js, const bopts *o, const char *gpu, const char *date, const shape *sh,
                 int64_t N, const point *p) {
    const char *mode = p->one_pass ? "one-pass" : "general";
    printf("| %s | %lld | %lld | %lld | %.2f | %s | %s | %.3f | %.3f | %.3f | %.1f |\n", sh->name,
           (long long)sh->H, (long long)sh->V, (long long)N, p->act, p->mask, mode, p->ms,
           p->floor_ms, p->ratio, p->peak / 1048576.0);
    fflush(stdout);
    if (!js) return;
    fprintf(js,
            "{\"gpu\":\"%s\",\"date\":\"%s\",\"commit\":\"%s\",\"shape\":\"%s\",\"H\":%lld,"
            "\"V_local\":%lld,\"N\":%lld,\"active\":%.4f,\"mask\":\"%s\",\"mode\":\"%s\","
            "\"impl\":\"spanhead\",\"dtype\":\"%s\",\"span_gap\":%lld,\"n_active\":%lld,"
            "\"ms\":%.4f,\"floor_ms\":%.4f,\"ratio\":%.4f,\"peak_extra_bytes\":%zu}\n",
            gpu, date, o->commit, sh->name, (long long)sh->H, (long long)sh->V, (long long)N,
            p->act, p->mask, mode, o->dt_name, (long long)o->gap, (long long)p->n_active, p->ms,
            p->floor_ms, p->ratio, p->peak);
    fflush(js);
}

static int parse_list_i(const char *s, int64_t *out, int max) {
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok && n < max; tok = strtok(NULL, ",")) {
        char *end;
        double v = strtod(tok, &end);
        if (*end == 'K' || *end == 'k') v *= 1024, end++;
        if (*end || v < 1) return -1;
        out[n++] = (int64_t)v;
    }
    return n;
}

static int parse_list_d(const char *s, double *out, int max) {
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok && n < max; tok = strtok(NULL, ",")) {
        char *end;
        double v = strtod(tok, &end);
        if (*end || !(v > 0 && v <= 1)) return -1;
        out[n++] = v;
    }
    return n;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: spanhead bench [options]\n"
            "  --device cpu|cuda       (default cuda when a GPU is present, else cpu)\n"
            "  --dtype bf16|f16|f32    (default bf16 on cuda, f32 on cpu)\n"
            "  --shape A,B,C,D         model shapes per rank (A 2048x62080, B 4096x37984,\n"
            "                          C 5120x37984, D 2048x151936); default A,B\n"
            "  --H N --V N             a custom shape instead\n"
            "  --N 16K,64K             tokens per rank (default 16K,64K)\n"
            "  --active 1,0.5,0.25     active fractions (default 1,0.5,0.25)\n"
            "  --mask response,fragmented  mask patterns (default response)\n"
            "  --mode general|one-pass|both  (default both)\n"
            "  --repeats N --warmup N  (default 5 and 2)\n"
            "  --chunk-bytes N         workspace budget (default the context's: 1 GiB on CUDA)\n"
            "  --gap N                 coalesce active runs across gaps of <= N rows into one\n"
            "                          span (default 0: exact spans; the CUDA backend gathers\n"
            "                          rows across spans, so coalescing only adds work)\n"
            "  --json FILE             JSON lines, one object per point\n"
            "  --commit SHA            recorded in the JSON (default $SPH_COMMIT or unknown)\n");
}

int sph_cli_bench(int argc, char **argv) {
    bopts o;
    memset(&o, 0, sizeof o);
    o.dev = sph_cuda_device_count() > 0 ? SPH_DEVICE_CUDA : SPH_DEVICE_CPU;
    o.dt_name = NULL;
    o.Ns[0] = 16384, o.Ns[1] = 65536, o.n_N = 2;
    o.act[0] = 1, o.act[1] = 0.5, o.act[2] = 0.25, o.n_act = 3;
    o.masks[0] = "response", o.n_masks = 1;
    o.modes = 3, o.repeats = 5, o.warmup = 2;
    o.commit = getenv("SPH_COMMIT") ? getenv("SPH_COMMIT") : "unknown";
    const char *shapes = "A,B";
    int64_t cH = 0, cV = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
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
            cH = atoll(v);
        } else if (!strcmp(a, "--V")) {
            cV = atoll(v);
        } else if (!strcmp(a, "--N")) {
            if ((o.n_N = parse_list_i(v, o.Ns, 16)) <= 0)
                return sph_cli_fail("bench", 2, "--N %s: expected a list like 16K,64K", v);
        } else if (!strcmp(a, "--active")) {
            if ((o.n_act = parse_list_d(v, o.act, 16)) <= 0)
                return sph_cli_fail("bench", 2, "--active %s: expected fractions in (0, 1]", v);
        } else if (!strcmp(a, "--mask")) {
            o.n_masks = 0;
            static char mbuf[128];
            snprintf(mbuf, sizeof mbuf, "%s", v);
            for (char *t = strtok(mbuf, ","); t && o.n_masks < 4; t = strtok(NULL, ",")) {
                if (strcmp(t, "response") && strcmp(t, "fragmented"))
                    return sph_cli_fail("bench", 2, "--mask %s: expected response or fragmented",
                                        t);
                o.masks[o.n_masks++] = t;
            }
        } else if (!strcmp(a, "--mode")) {
            o.modes = !strcmp(v, "general") ? 1 : !strcmp(v, "one-pass") ? 2 : !strcmp(v, "both") ? 3 : 0;
            if (!o.modes) return sph_cli_fail("bench", 2, "--mode %s: expected general, one-pass or both", v);
        } else if (!strcmp(a, "--repeats")) {
            o.repeats = atoi(v);
        } else if (!strcmp(a, "--warmup")) {
            o.warmup = atoi(v);
        } else if (!strcmp(a, "--chunk-bytes")) {
            o.chunk_bytes = atoll(v);
        } else if (!strcmp(a, "--gap")) {
            o.gap = atoll(v);
            if (o.gap < 0) return sph_cli_fail("bench", 2, "--gap %s: expected >= 0", v);
        } else if (!strcmp(a, "--json")) {
            o.json = v;
        } else if (!strcmp(a, "--commit")) {
            o.commit = v;
        } else {
            return sph_cli_fail("bench", 2, "unknown option %s (--help)", a);
        }
    }
    if (o.repeats < 1 || o.repeats > 1000 || o.warmup < 0)
        return sph_cli_fail("bench", 2, "--repeats must be in [1, 1000], --warmup >= 0");
    if (!o.dt_name) o.dt_name = o.dev == SPH_DEVICE_CUDA ? "bf16" : "f32";
    if (!strcmp(o.dt_name, "bf16")) o.dt = SPH_BF16;
    else if (!strcmp(o.dt_name, "f16")) o.dt = SPH_F16;
    else if (!strcmp(o.dt_name, "f32")) o.dt = SPH_F32;
    else return sph_cli_fail("bench", 2, "--dtype %s: expected bf16, f16 or f32", o.dt_name);
    if (cH > 0 || cV > 0) {
        if (cH <= 0 || cV <= 0) return sph_cli_fail("bench", 2, "--H and --V go together");
        o.shapes[0] = (shape){"custom", cH, cV};
        o.n_shapes = 1;
    } else {
        char buf[64];
        snprintf(buf, sizeof buf, "%s", shapes);
        for (char *t = strtok(buf, ","); t && o.n_shapes < 16; t = strtok(NULL, ",")) {
            int found = 0;
            for (size_t k = 0; k < sizeof k_shapes / sizeof k_shapes[0]; k++)
                if (!strcmp(t, k_shapes[k].name)) o.shapes[o.n_shapes++] = k_shapes[k], found = 1;
            if (!found) return sph_cli_fail("bench", 2, "--shape %s: expected A, B, C or D", t);
        }
    }

    sph_ctx_opts co = SPH_CTX_OPTS_INIT;
    co.device.type = o.dev;
    co.chunk_bytes = o.chunk_bytes;
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
    printf("# spanhead bench: %s, %s, dtype %s, commit %s, %s\n\n", gpu, date, o.dt_name,
           o.commit, sph_version());
    printf("| shape | H | V_loc | N | active | mask | mode | ms | floor ms | ratio | extra MiB |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|\n");
    int rc = 0;
    for (int si = 0; si < o.n_shapes && !rc; si++) {
        const shape *sh = &o.shapes[si];
        for (int ni = 0; ni < o.n_N && !rc; ni++) {
            int64_t N = o.Ns[ni];
            double rate = 0;
            if ((rc = gemm_rate(ctx, &o, N, sh->V, sh->H, &rate))) break;
            printf("| %s | %lld | %lld | %lld | dense GEMM rate %.2f TFLOP/s | | | | | | |\n",
                   sh->name, (long long)sh->H, (long long)sh->V, (long long)N, rate);
            dev_bufs b;
            memset(&b, 0, sizeof b);
            void *hh = rand_buf(N * sh->H, o.dt, 1.f), *hw = rand_buf(sh->V * sh->H, o.dt, 0.05f);
            int32_t *ht = malloc((size_t)N * 4);
            float *hg = malloc((size_t)N * 4);
            uint8_t *hm = malloc((size_t)N);
            int64_t *spans = malloc((size_t)(N + 2) * 2 * sizeof(int64_t));
            if (!hh || !hw || !ht || !hg || !hm || !spans) {
                rc = sph_cli_fail("bench", 1, "out of host memory for N = %lld", (long long)N);
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
            for (int mode = 0; mode < 2 && !rc; mode++) {
                if (!(o.modes & (1 << mode))) continue;
                /* the dense path first: every row, no mask */
                point p = {"none", 1.0, mode, 0, 0, 0, 0, N};
                if ((rc = time_point(ctx, &o, sh, N, &b, hm, NULL, 0, 0, mode, rate, &p))) break;
                emit(js, &o, gpu, date, sh, N, &p);
                for (int mi = 0; mi < o.n_masks && !rc; mi++)
                    for (int ai = 0; ai < o.n_act && !rc; ai++) {
                        point q = {o.masks[mi], o.act[ai], mode, 0, 0, 0, 0, 0};
                        q.n_active = build_mask(hm, N, o.act[ai], o.masks[mi]);
                        int64_t ns = build_spans(hm, N, o.gap, spans);
                        if (sph_ctx_memcpy(ctx, b.mask, hm, (size_t)N) != SPH_OK) {
                            rc = sph_cli_fail("bench", 1, "mask: %s", sph_last_error());
                            break;
                        }
                        rc = time_point(ctx, &o, sh, N, &b, hm, spans, ns, 1, mode, rate, &q);
                        if (!rc) emit(js, &o, gpu, date, sh, N, &q);
                    }
            }
            free(hm), free(spans);
            bufs_free(ctx, &b);
        }
    }
    if (js) fclose(js);
    sph_ctx_destroy(ctx);
    return rc;
}
