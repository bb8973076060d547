/*
 * tune.cu - autotuning of the CUDA head (sph_tune) and its persistent cache.
 *
 * A configuration is (chunk_rows, split): rows per staged chunk of logits and the vocabulary
 * split width. sph_tune times each candidate's forward + backward (bf16/f16/f32 random data,
 * every row active, median of `repeats` after one warm-up, cudaEvents) for one shape and
 * appends the winner to the cache file (format in tune.cuh). Contexts read the file once at
 * creation; the layout (head_layout.cu) uses an entry whose (GPU, dtype, H, V_loc, N bucket) matches
 * and falls back to its defaults otherwise. Only the staging budget (chunk_bytes) is never
 * exceeded: a tuned chunk_rows is an upper bound.
 * Also the dense cuBLAS rates the benchmark floors divide by: sph_tune_gemm_rate (one product,
 * the burst rate) and sph_tune_gemm_rate_sustained (a chain of products back to back).
 * The public calls reach these through the CUDA device table (runtime.cu, registry.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/head.cuh"
#include "cuda/tune.cuh"

static const char *dtype_short(sph_dtype d) {
    if (d.code == SPH_DTYPE_BFLOAT && d.bits == 16) return "bf16";
    if (d.code == SPH_DTYPE_FLOAT && d.bits == 16) return "f16";
    if (d.code == SPH_DTYPE_FLOAT && d.bits == 32) return "f32";
    return "?";
}

extern "C" int64_t sph_tune_bucket(int64_t N) {
    int64_t b = 1;
    while (b < N && b < ((int64_t)1 << 40)) b <<= 1;
    return b;
}

/* Pulls "key":value out of one line; string values are copied without quotes. */
static int json_field(const char *line, const char *key, char *out, size_t n) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(line, pat);
    if (!p) return 0;
    p += strlen(pat);
    while (*p == ' ' || *p == ':') p++;
    size_t k = 0;
    if (*p == '"') {
        p++;
        while (*p && *p != '"' && k + 1 < n) out[k++] = *p++;
    } else {
        while (*p && *p != ',' && *p != '}' && k + 1 < n) out[k++] = *p++;
    }
    out[k] = 0;
    return k > 0;
}

static int parse_line(const char *line, sph_tune_entry *e) {
    char v[8][80];
    const char *keys[8] = {"gpu", "dtype", "H", "V_loc", "N_bucket", "chunk_rows", "split", "ms"};
    for (int k = 0; k < 8; k++)
        if (!json_field(line, keys[k], v[k], sizeof v[k])) return 0;
    memset(e, 0, sizeof *e);
    snprintf(e->gpu, sizeof e->gpu, "%s", v[0]);
    snprintf(e->dtype, sizeof e->dtype, "%s", v[1]);
    char *end;
    int64_t *ints[5] = {&e->H, &e->V_loc, &e->N_bucket, &e->chunk_rows, &e->split};
    for (int k = 0; k < 5; k++) {
        errno = 0;
        long long x = strtoll(v[2 + k], &end, 10);
        if (errno || *end || x < 0) return 0;
        *ints[k] = x;
    }
    e->ms = strtod(v[7], &end);
    return *end == 0;
}

static void table_put(sph_cuda_state *st, const sph_tune_entry *e) {
    for (int k = 0; k < st->n_tune; k++) {
        sph_tune_entry *t = &st->tune[k];
        if (!strcmp(t->gpu, e->gpu) && !strcmp(t->dtype, e->dtype) && t->H == e->H &&
            t->V_loc == e->V_loc && t->N_bucket == e->N_bucket) {
            *t = *e; /* later lines win */
            return;
        }
    }
    if (st->n_tune < SPH_TUNE_MAX_ENTRIES) st->tune[st->n_tune++] = *e;
}

extern "C" void sph_cuda_tune_load(sph_ctx_t ctx, sph_cuda_state *st) {
    st->n_tune = 0;
    if (!ctx->tune_cache[0]) return;
    FILE *f = fopen(ctx->tune_cache, "r");
    if (!f) {
        sph_log(3, "tune cache %s: not readable (%s); using defaults", ctx->tune_cache,
                strerror(errno));
        return;
    }
    char line[1024];
    int bad = 0;
    while (fgets(line, sizeof line, f)) {
        sph_tune_entry e;
        if (parse_line(line, &e))
            table_put(st, &e);
        else if (line[0] != '\n')
            bad++;
    }
    fclose(f);
    sph_log(3, "tune cache %s: %d entries, %d unreadable lines skipped", ctx->tune_cache,
            st->n_tune, bad);
}

extern "C" int sph_cuda_tune_lookup(const sph_cuda_state *st, sph_dtype dt, int64_t H,
                                    int64_t V_loc, int64_t N, sph_tune_entry *e) {
    int64_t b = sph_tune_bucket(N);
    const char *d = dtype_short(dt);
    for (int k = 0; k < st->n_tune; k++) {
        const sph_tune_entry *t = &st->tune[k];
        if (t->H == H && t->V_loc == V_loc && t->N_bucket == b && !strcmp(t->dtype, d) &&
            !strcmp(t->gpu, st->prop.name)) {
            *e = *t;
            return 1;
        }
    }
    return 0;
}

// ---- sph_tune ------------------------------------------------------------------------------

/* Deterministic pseudo-random values in [-scale, scale) (a hash of the index). */
__global__ void tune_fill_kernel(void *p, int kind, int64_t n, uint64_t seed, float scale) {
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (int64_t)gridDim.x * blockDim.x) {
        uint64_t x = (uint64_t)k * 0x9E3779B97F4A7C15ull + seed;
        x ^= x >> 31;
        x *= 0xBF58476D1CE4E5B9ull;
        x ^= x >> 29;
        float v = ((float)(x >> 40) / (float)(1ull << 24) * 2.f - 1.f) * scale;
        if (kind == 0)
            ((float *)p)[k] = v;
        else if (kind == 1)
            ((__nv_bfloat16 *)p)[k] = __float2bfloat16_rn(v);
        else if (kind == 2)
            ((__half *)p)[k] = __float2half_rn(v);
        else
            ((int32_t *)p)[k] = (int32_t)(x % (uint64_t)scale);
    }
}

static sph_status fill(void *p, int kind, int64_t n, uint64_t seed, float scale) {
    if (n <= 0) return SPH_OK;
    tune_fill_kernel<<<1024, 256>>>(p, kind, n, seed, scale);
    SPH_LAUNCH_CHECK("tune_fill_kernel", 0);
    return SPH_OK;
}

static sph_status mkdirs_for(const char *path) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return sph_err(SPH_ERR_IO, "tune cache: cannot create directory %s: %s", buf,
                           strerror(errno));
        *p = '/';
    }
    return SPH_OK;
}

typedef struct tune_bufs {
    void *h, *w, *dh, *dw, *ws;
    int32_t *tgt;
    float *lp, *stats, *g;
} tune_bufs;

static void bufs_free(tune_bufs *b) {
    void *ps[] = {b->h, b->w, b->dh, b->dw, b->ws, b->tgt, b->lp, b->stats, b->g};
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) cudaFree(ps[k]);
    memset(b, 0, sizeof *b);
}

static sph_status time_config(sph_ctx_t ctx, sph_head_plan *fw, sph_head_plan *bw,
                              tune_bufs *b, size_t *ws_cap, int repeats, double *ms) {
    size_t need_f, need_b;
    SPH_TRY(sph_head_cuda_workspace(ctx, SPH_HEAD_FORWARD, fw, &need_f));
    SPH_TRY(sph_head_cuda_workspace(ctx, SPH_HEAD_BACKWARD, bw, &need_b));
    size_t need = need_f > need_b ? need_f : need_b;
    if (need > *ws_cap) {
        cudaFree(b->ws);
        b->ws = NULL;
        *ws_cap = 0;
        cudaError_t e = cudaMalloc(&b->ws, need);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return sph_err(SPH_ERR_ALLOC, "tune: workspace of %zu bytes: %s", need,
                           cudaGetErrorString(e));
        }
        *ws_cap = need;
    }
    cudaStream_t s = (cudaStream_t)ctx->stream;
    float times[64];
    if (repeats > 64) repeats = 64;
    cudaEvent_t e0, e1;
    SPH_CUDA_RET(cudaEventCreate(&e0));
    SPH_CUDA_RET(cudaEventCreate(&e1));
    sph_status st = SPH_OK;
    for (int r = -1; r < repeats && st == SPH_OK; r++) {
        cudaEventRecord(e0, s);
        st = sph_head_cuda_forward(ctx, fw, b->ws, *ws_cap);
        if (st == SPH_OK) st = sph_head_cuda_backward(ctx, bw, b->ws, *ws_cap);
        cudaEventRecord(e1, s);
        cudaError_t ce = cudaEventSynchronize(e1);
        if (st == SPH_OK && ce != cudaSuccess)
            st = sph_err(SPH_ERR_CUDA, "tune: %s", cudaGetErrorString(ce));
        if (r >= 0) cudaEventElapsedTime(&times[r], e0, e1);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (st != SPH_OK) return st;
    for (int i = 1; i < repeats; i++)
        for (int j = i; j > 0 && times[j] < times[j - 1]; j--) {
            float t = times[j];
            times[j] = times[j - 1];
            times[j - 1] = t;
        }
    *ms = times[repeats / 2];
    return SPH_OK;
}

extern "C" sph_status sph_cuda_tune(sph_ctx_t ctx, const sph_tune_opts *opts,
                                    const char **result) {
    static thread_local char desc[256];
    SPH_CHECK(ctx && opts, SPH_ERR_INVALID_ARG, "tune: ctx or opts is NULL");
    SPH_CHECK(opts->struct_size >= sizeof(sph_tune_opts), SPH_ERR_INVALID_ARG,
              "opts.struct_size is %zu, expected %zu (use SPH_TUNE_OPTS_INIT)",
              opts->struct_size, sizeof(sph_tune_opts));
    SPH_CHECK(ctx->device.type == SPH_DEVICE_CUDA && ctx->cuda, SPH_ERR_UNSUPPORTED,
              "tune: the context is not a CUDA context (autotuning is for the CUDA head)");
    const char *dn = dtype_short(opts->dtype);
    SPH_CHECK(opts->dtype.lanes == 1 && strcmp(dn, "?"), SPH_ERR_DTYPE,
              "opts.dtype: %s, expected bf16, f16 or f32", sph_dtype_name(opts->dtype));
    SPH_CHECK(opts->H > 0 && opts->V_loc > 0 && opts->N > 0, SPH_ERR_INVALID_ARG,
              "opts: H %lld, V_loc %lld, N %lld, expected all > 0", (long long)opts->H,
              (long long)opts->V_loc, (long long)opts->N);
    SPH_CHECK(ctx->tune_cache[0], SPH_ERR_IO,
              "tune: no cache path (set opts.tune_cache, $SPH_TUNE_CACHE or $HOME)");
    int repeats = opts->repeats > 0 ? opts->repeats : 5;
    sph_cuda_state *st = (sph_cuda_state *)ctx->cuda;
    const int64_t N = opts->N, H = opts->H, V = opts->V_loc;
    int kind = !strcmp(dn, "f32") ? 0 : (!strcmp(dn, "bf16") ? 1 : 2);
    size_t es = kind ? 2 : 4;
    tune_bufs b;
    memset(&b, 0, sizeof b);
    size_t ws_cap = 0;
    sph_status s = SPH_OK;
#define TUNE_ALLOC(ptr, bytes)                                                                 \
    do {                                                                                       \
        if (s == SPH_OK && cudaMalloc((void **)&(ptr), (bytes)) != cudaSuccess) {             \
            cudaGetLastError();                                                                \
            s = sph_err(SPH_ERR_ALLOC, "tune: cannot allocate %zu bytes for " #ptr,            \
                        (size_t)(bytes));                                                      \
        }                                                                                      \
    } while (0)
    TUNE_ALLOC(b.h, (size_t)N * H * es);
    TUNE_ALLOC(b.w, (size_t)V * H * es);
    TUNE_ALLOC(b.dh, (size_t)N * H * es);
    TUNE_ALLOC(b.dw, (size_t)V * H * es);
    TUNE_ALLOC(b.tgt, (size_t)N * 4);
    TUNE_ALLOC(b.lp, (size_t)N * 4);
    TUNE_ALLOC(b.g, (size_t)N * 4);
    TUNE_ALLOC(b.stats, (size_t)N * 12);
#undef TUNE_ALLOC
    if (s == SPH_OK) s = fill(b.h, kind, N * H, 1, 1.f);
    if (s == SPH_OK) s = fill(b.w, kind, V * H, 2, 0.05f);
    if (s == SPH_OK) s = fill(b.tgt, 3, N, 3, (float)V);
    if (s == SPH_OK) s = fill(b.g, 0, N, 4, 1.f);
    if (s == SPH_OK && cudaDeviceSynchronize() != cudaSuccess)
        s = sph_err(SPH_ERR_CUDA, "tune: filling inputs: %s", cudaGetErrorString(cudaGetLastError()));
    if (s != SPH_OK) {
        bufs_free(&b);
        return s;
    }
    sph_head_plan fw;
    memset(&fw, 0, sizeof fw);
    fw.N = N, fw.H = H, fw.V_loc = V, fw.V = V, fw.v0 = 0, fw.K = 0;
    fw.dtype = opts->dtype;
    fw.device = ctx->device;
    fw.hidden = b.h, fw.ld_h = H, fw.weight = b.w, fw.ld_w = H;
    fw.targets = b.tgt, fw.tgt_i64 = 0;
    fw.temperature = 1.0;
    fw.logprob = b.lp, fw.stats = b.stats;
    sph_head_plan bw = fw;
    bw.logprob = NULL;
    bw.dlogprob = b.g;
    bw.dhidden = b.dh, bw.ld_dh = H, bw.dh_dtype = opts->dtype;
    bw.dweight = b.dw, bw.ld_dw = H, bw.dw_dtype = opts->dtype;

    static const int64_t rows_c[] = {0, 1024, 2048, 4096, 8192, 16384};
    static const int64_t split_c[] = {0, 8192, 16384, 32768};
    double best = 1e30;
    int64_t best_rows = 0, best_split = 0;
    for (size_t i = 0; i < sizeof rows_c / sizeof rows_c[0] && s == SPH_OK; i++) {
        if (rows_c[i] > N) continue;
        for (size_t j = 0; j < sizeof split_c / sizeof split_c[0] && s == SPH_OK; j++) {
            if (split_c[j] >= V) continue;
            st->forcing = 1;
            st->force_rows = rows_c[i];
            st->force_split = split_c[j];
            double ms = 0;
            sph_status r = time_config(ctx, &fw, &bw, &b, &ws_cap, repeats, &ms);
            st->forcing = 0;
            if (r == SPH_ERR_ALLOC) continue; /* too large for this card: not a candidate */
            if (r != SPH_OK) {
                s = r;
                break;
            }
            if (opts->verbose)
                fprintf(stderr, "tune %s H=%lld V_loc=%lld N=%lld chunk_rows=%lld split=%lld: "
                                "%.3f ms\n",
                        dn, (long long)H, (long long)V, (long long)N, (long long)rows_c[i],
                        (long long)split_c[j], ms);
            if (ms < best) best = ms, best_rows = rows_c[i], best_split = split_c[j];
        }
    }
    st->forcing = 0;
    bufs_free(&b);
    if (s != SPH_OK) return s;
    SPH_CHECK(best < 1e30, SPH_ERR_ALLOC, "tune: no candidate configuration fitted the device");

    sph_tune_entry e;
    memset(&e, 0, sizeof e);
    snprintf(e.gpu, sizeof e.gpu, "%s", st->prop.name);
    snprintf(e.dtype, sizeof e.dtype, "%s", dn);
    e.H = H, e.V_loc = V, e.N_bucket = sph_tune_bucket(N);
    e.chunk_rows = best_rows, e.split = best_split, e.ms = best;
    SPH_TRY(mkdirs_for(ctx->tune_cache));
    FILE *f = fopen(ctx->tune_cache, "a");
    SPH_CHECK(f != NULL, SPH_ERR_IO, "tune cache %s: cannot open for appending: %s",
              ctx->tune_cache, strerror(errno));
    fprintf(f,
            "{\"gpu\":\"%s\",\"dtype\":\"%s\",\"H\":%lld,\"V_loc\":%lld,\"N_bucket\":%lld,"
            "\"chunk_rows\":%lld,\"split\":%lld,\"ms\":%.4f}\n",
            e.gpu, e.dtype, (long long)e.H, (long long)e.V_loc, (long long)e.N_bucket,
            (long long)e.chunk_rows, (long long)e.split, e.ms);
    int bad = fclose(f) != 0;
    SPH_CHECK(!bad, SPH_ERR_IO, "tune cache %s: write failed: %s", ctx->tune_cache,
              strerror(errno));
    table_put(st, &e);
    snprintf(desc, sizeof desc, "%s %s H=%lld V_loc=%lld N_bucket=%lld: chunk_rows=%lld split=%lld"
             " (%.3f ms fwd+bwd)", e.gpu, dn, (long long)H, (long long)V,
             (long long)e.N_bucket, (long long)best_rows, (long long)best_split, best);
    if (result) *result = desc;
    return SPH_OK;
}

// ---- dense GEMM rate -----------------------------------------------------------------------
// `chain` products C (M, N) = A (M, K) . B (N, K)^T issued back to back on the context's
// stream, the whole chain timed between two events; median over `repeats` chains after one
// warm-up chain. chain 1 is the burst rate (sph_tune_gemm_rate): on a power-limited card
// (the H200 at 700 W) one product of a few ms runs at boost clocks, while the head issues its
// products back to back for tens of ms and the clocks drop; a chain as long as the head's
// (sph_tune_gemm_rate_sustained) sees the clocks the head sees. Every product of a chain
// reuses A, B and C: the operands of the shapes that matter are far larger than L2, and the
// chain's products are ordered by the stream alone (no host synchronization inside a chain).

#define SPH_GEMM_CHAIN_MAX 64

static sph_status gemm_rate_chain(sph_ctx_t ctx, const char *who, sph_dtype dtype, int64_t M,
                                  int64_t N, int64_t K, int chain, int repeats,
                                  double *tflops) {
    SPH_CHECK(ctx && tflops, SPH_ERR_INVALID_ARG, "%s: ctx or tflops is NULL", who);
    /* the arguments before the context, so that every message can be seen without a GPU */
    SPH_CHECK(chain >= 1 && chain <= SPH_GEMM_CHAIN_MAX, SPH_ERR_INVALID_ARG,
              "%s: chain %d, expected in [1, %d]", who, chain, SPH_GEMM_CHAIN_MAX);
    const char *dn = dtype_short(dtype);
    SPH_CHECK(dtype.lanes == 1 && strcmp(dn, "?"), SPH_ERR_DTYPE,
              "dtype: %s, expected bf16, f16 or f32", sph_dtype_name(dtype));
    SPH_CHECK(M > 0 && N > 0 && K > 0 && M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX,
              SPH_ERR_INVALID_ARG, "%s: M %lld, N %lld, K %lld, expected in [1, 2^31)", who,
              (long long)M, (long long)N, (long long)K);
    SPH_CHECK(ctx->device.type == SPH_DEVICE_CUDA && ctx->cuda, SPH_ERR_UNSUPPORTED,
              "%s: not a CUDA context", who);
    if (repeats <= 0) repeats = 5;
    if (repeats > 64) repeats = 64;
    sph_cuda_state *st = (sph_cuda_state *)ctx->cuda;
    int kind = !strcmp(dn, "f32") ? 0 : (!strcmp(dn, "bf16") ? 1 : 2);
    size_t es = kind ? 2 : 4;
    void *A = NULL, *B = NULL, *C = NULL, *W = NULL;
    sph_status s = SPH_OK;
    if (cudaMalloc(&W, SPH_CUBLAS_WS_BYTES) != cudaSuccess ||
        cudaMalloc(&A, (size_t)M * K * es) != cudaSuccess ||
        cudaMalloc(&B, (size_t)N * K * es) != cudaSuccess ||
        cudaMalloc(&C, (size_t)M * N * es) != cudaSuccess) {
        cudaGetLastError();
        s = sph_err(SPH_ERR_ALLOC, "%s: cannot allocate the %lld x %lld x %lld operands", who,
                    (long long)M, (long long)N, (long long)K);
    }
    if (s == SPH_OK) s = fill(A, kind, M * K, 11, 1.f);
    if (s == SPH_OK) s = fill(B, kind, N * K, 12, 1.f);
    if (s == SPH_OK && cudaDeviceSynchronize() != cudaSuccess)
        s = sph_err(SPH_ERR_CUDA, "%s: %s", who, cudaGetErrorString(cudaGetLastError()));
    cudaStream_t stream = (cudaStream_t)ctx->stream;
    cudaDataType_t t = kind == 0 ? CUDA_R_32F : (kind == 1 ? CUDA_R_16BF : CUDA_R_16F);
    cublasComputeType_t ct = kind == 0 && ctx->opts.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                               : CUBLAS_COMPUTE_32F;
    float times[64];
    cudaEvent_t e0 = NULL, e1 = NULL;
    if (s == SPH_OK && (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess))
        s = sph_err(SPH_ERR_CUDA, "%s: cudaEventCreate failed", who);
    if (s == SPH_OK) {
        cublasSetStream(st->cublas, stream);
        /* the same workspace size the head gives cuBLAS, so the floor is measured alike */
        cublasSetWorkspace(st->cublas, W, SPH_CUBLAS_WS_BYTES);
    }
    const float one = 1.f, zero = 0.f;
    for (int r = -1; r < repeats && s == SPH_OK; r++) {
        cudaEventRecord(e0, stream);
        for (int c = 0; c < chain && s == SPH_OK; c++) {
            cublasStatus_t b = cublasGemmEx(st->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M,
                                            (int)K, &one, B, t, (int)K, A, t, (int)K, &zero, C,
                                            t, (int)N, ct, CUBLAS_GEMM_DEFAULT);
            if (b != CUBLAS_STATUS_SUCCESS)
                s = sph_err(SPH_ERR_CUDA, "%s: cublasGemmEx: %s", who,
                            cublasGetStatusString(b));
        }
        if (s != SPH_OK) break;
        cudaEventRecord(e1, stream);
        if (cudaEventSynchronize(e1) != cudaSuccess) {
            s = sph_err(SPH_ERR_CUDA, "%s: %s", who, cudaGetErrorString(cudaGetLastError()));
            break;
        }
        if (r >= 0) cudaEventElapsedTime(&times[r], e0, e1);
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(A), cudaFree(B), cudaFree(C), cudaFree(W);
    if (s != SPH_OK) return s;
    for (int i = 1; i < repeats; i++)
        for (int j = i; j > 0 && times[j] < times[j - 1]; j--) {
            float x = times[j];
            times[j] = times[j - 1];
            times[j - 1] = x;
        }
    double ms = times[repeats / 2];
    *tflops = chain * 2.0 * (double)M * (double)N * (double)K / (ms * 1e-3) / 1e12;
    return SPH_OK;
}

extern "C" sph_status sph_cuda_gemm_rate(sph_ctx_t ctx, sph_dtype dtype, int64_t M, int64_t N,
                                         int64_t K, int repeats, double *tflops) {
    return gemm_rate_chain(ctx, "gemm_rate", dtype, M, N, K, 1, repeats, tflops);
}

extern "C" sph_status sph_cuda_gemm_rate_sustained(sph_ctx_t ctx, sph_dtype dtype, int64_t M,
                                                   int64_t N, int64_t K, int chain,
                                                   int repeats, double *tflops) {
    return gemm_rate_chain(ctx, "gemm_rate_sustained", dtype, M, N, K, chain, repeats, tflops);
}
