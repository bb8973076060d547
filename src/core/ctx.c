/*
 * ctx.c - context lifetime, kernel selection and the memory helpers of the public API.
 * CPU kernels are picked once per process from the CPU's features (SPH_KERNEL or
 * opts.force_kernel override). The device's table (registry.c) sets the context up on its
 * device; the head table is filled once here: the reference first, then the device's kernels
 * slot by slot unless the reference is forced (core/backend.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>
#include <omp.h>

#include "core/ctx.h"

const char *sph_cpu_isa_name(sph_cpu_isa isa) {
    switch (isa) {
    case SPH_ISA_REF: return "ref";
    case SPH_ISA_GENERIC: return "generic";
    case SPH_ISA_AVX2: return "avx2";
    case SPH_ISA_AVX512: return "avx512";
    case SPH_ISA_AVX512BF16: return "avx512bf16";
    }
    return "?";
}

static sph_cpu_isa g_isa;
static once_flag g_isa_once = ONCE_FLAG_INIT;

static void detect_isa(void) {
    __builtin_cpu_init();
    g_isa = SPH_ISA_GENERIC;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) g_isa = SPH_ISA_AVX2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        g_isa = SPH_ISA_AVX512;
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
    if (g_isa == SPH_ISA_AVX512 && __builtin_cpu_supports("avx512bf16")) g_isa = SPH_ISA_AVX512BF16;
#endif
}

sph_cpu_isa sph_cpu_isa_detect(void) {
    call_once(&g_isa_once, detect_isa);
    return g_isa;
}

#define SPH_CUDA_FLAGS_ONEPASS                                                                \
    ((uint32_t)(SPH_CUDA_FLAG_ONEPASS_E | SPH_CUDA_FLAG_ONEPASS_F32 |                           \
                SPH_CUDA_FLAG_ONEPASS_RECOMPUTE))
#define SPH_CUDA_FLAGS_ALL                                                                    \
    ((uint32_t)(SPH_CUDA_FLAG_NO_GATHER | SPH_CUDA_FLAG_NO_SQUARE | SPH_CUDA_FLAG_NO_FUSED |     \
                SPH_CUDA_FLAG_NO_COLOUTER | SPH_CUDA_FLAG_DENSE_BACKWARD | SPH_CUDA_FLAG_NO_SM90 | \
                SPH_CUDA_FLAG_PINGPONG | SPH_CUDA_FLAG_COOPERATIVE | SPH_CUDA_FLAG_NO_STORE16 |    \
                SPH_CUDA_FLAGS_ONEPASS | SPH_CUDA_FLAG_E_TWO_CHUNKS | SPH_CUDA_FLAG_DH_SPLITK |    \
                SPH_CUDA_FLAG_E2D_OVERLAP | SPH_CUDA_FLAG_DW32_BETA0 |                       \
                SPH_CUDA_FLAG_EXTRAS_STAGED))

/* The SPH_CUDA_* variables of the benchmark scripts, the values each takes and the switches
 * each value sets; a value clears the switches of the variable's other values. */
#define ENV_VALUES 4
static const struct env_switch {
    const char *name;
    const char *value[ENV_VALUES]; /* NULL-terminated */
    uint32_t sets[ENV_VALUES];
} g_env_switches[] = {
    {"SPH_CUDA_GATHER", {"0", "1"}, {SPH_CUDA_FLAG_NO_GATHER, 0}},
    {"SPH_CUDA_SQUARE", {"0", "1"}, {SPH_CUDA_FLAG_NO_SQUARE, 0}},
    {"SPH_CUDA_FUSED", {"0", "1"}, {SPH_CUDA_FLAG_NO_FUSED, 0}},
    {"SPH_CUDA_COLOUTER", {"0", "1"}, {SPH_CUDA_FLAG_NO_COLOUTER, 0}},
    {"SPH_CUDA_SM90", {"0", "1"}, {SPH_CUDA_FLAG_NO_SM90, 0}},
    {"SPH_CUDA_BWD_DENSE", {"0", "1"}, {0, SPH_CUDA_FLAG_DENSE_BACKWARD}},
    {"SPH_CUDA_PINGPONG", {"0", "1"}, {SPH_CUDA_FLAG_COOPERATIVE, SPH_CUDA_FLAG_PINGPONG}},
    {"SPH_CUDA_STORE16", {"0", "1"}, {SPH_CUDA_FLAG_NO_STORE16, 0}},
    {"SPH_CUDA_E2CHUNK", {"0", "1"}, {0, SPH_CUDA_FLAG_E_TWO_CHUNKS}},
    {"SPH_CUDA_DHSPLITK", {"0", "1"}, {0, SPH_CUDA_FLAG_DH_SPLITK}},
    {"SPH_CUDA_E2DOVL", {"0", "1"}, {0, SPH_CUDA_FLAG_E2D_OVERLAP}},
    {"SPH_CUDA_DW32BZ", {"0", "1"}, {0, SPH_CUDA_FLAG_DW32_BETA0}},
    {"SPH_CUDA_EXTRAS", {"staged", "fused"}, {SPH_CUDA_FLAG_EXTRAS_STAGED, 0}},
    {"SPH_CUDA_ONEPASS",
     {"e", "f32", "recompute", "auto"},
     {SPH_CUDA_FLAG_ONEPASS_E, SPH_CUDA_FLAG_ONEPASS_F32, SPH_CUDA_FLAG_ONEPASS_RECOMPUTE, 0}},
};

sph_status sph_ctx_opts_apply_env(sph_ctx_opts *opts) {
    SPH_CHECK(opts != NULL, SPH_ERR_INVALID_ARG, "opts: NULL");
    SPH_CHECK(opts->struct_size >= offsetof(sph_ctx_opts, cuda_flags) + sizeof(opts->cuda_flags),
              SPH_ERR_INVALID_ARG,
              "opts.struct_size is %zu, expected >= %zu (a struct with cuda_flags; use "
              "SPH_CTX_OPTS_INIT)", opts->struct_size,
              offsetof(sph_ctx_opts, cuda_flags) + sizeof(opts->cuda_flags));
    uint32_t f = opts->cuda_flags;
    for (size_t k = 0; k < sizeof g_env_switches / sizeof g_env_switches[0]; k++) {
        const struct env_switch *w = &g_env_switches[k];
        const char *v = getenv(w->name);
        if (!v || !*v) continue;
        uint32_t all = 0;
        int hit = -1;
        char expected[64] = "";
        for (int q = 0; q < ENV_VALUES && w->value[q]; q++) {
            all |= w->sets[q];
            if (!strcmp(v, w->value[q])) hit = q;
            snprintf(expected + strlen(expected), sizeof expected - strlen(expected), "%s%s",
                     q ? (q + 1 < ENV_VALUES && w->value[q + 1] ? ", " : " or ") : "",
                     w->value[q]);
        }
        SPH_CHECK(hit >= 0, SPH_ERR_INVALID_ARG, "%s: '%.32s', expected %s", w->name, v,
                  expected);
        f = (f & ~all) | w->sets[hit];
    }
    opts->cuda_flags = f;
    return SPH_OK;
}

/* k: opts.force_kernel, or the SPH_KERNEL variable when that is NULL; who names the source
 * in the messages, so a bad variable is not blamed on an option nobody set. */
static sph_status parse_kernel(const char *k, const char *who, sph_ctx_t ctx) {
    sph_cpu_isa best = sph_cpu_isa_detect();
    if (!strcmp(k, "ref")) {
        ctx->use_ref = 1;
        ctx->isa = SPH_ISA_REF;
        return SPH_OK;
    }
    static const struct { const char *name; sph_cpu_isa isa; } names[] = {
        {"generic", SPH_ISA_GENERIC}, {"avx2", SPH_ISA_AVX2}, {"avx512", SPH_ISA_AVX512},
        {"avx512bf16", SPH_ISA_AVX512BF16}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!strcmp(k, names[i].name)) {
            SPH_CHECK(names[i].isa <= best, SPH_ERR_UNSUPPORTED,
                      "%s: '%s' is not supported by this CPU (best: %s)", who, k,
                      sph_cpu_isa_name(best));
            ctx->isa = names[i].isa;
            return SPH_OK;
        }
    }
    if (!strcmp(k, "cuda") || !strcmp(k, "best") || !strcmp(k, "")) return SPH_OK;
    return sph_err(SPH_ERR_INVALID_ARG,
                   "%s: '%s' is unknown (expected ref, generic, avx2, avx512, "
                   "avx512bf16, cuda or best)", who, k);
}

sph_status sph_ctx_create(sph_ctx_t *out, const sph_ctx_opts *opts) {
    SPH_CHECK(out != NULL, SPH_ERR_INVALID_ARG, "ctx: output pointer is NULL");
    *out = NULL;
    sph_ctx_opts def = SPH_CTX_OPTS_INIT;
    if (!opts) opts = &def;
    SPH_CHECK(opts->struct_size >= offsetof(sph_ctx_opts, tune_cache) + sizeof(char *),
              SPH_ERR_INVALID_ARG, "opts.struct_size is %zu, expected %zu (use SPH_CTX_OPTS_INIT)",
              opts->struct_size, sizeof(sph_ctx_opts));
    /* libgomp dies when thread creation fails (100000 threads): bounded by the machine */
    const int max_threads = sph_max_threads();
    SPH_CHECK(opts->num_threads >= 0 && opts->num_threads <= max_threads, SPH_ERR_INVALID_ARG,
              "opts.num_threads is %d, expected 0 (all processors) to %d (4 x the %d processors "
              "of this machine, at least 64)",
              opts->num_threads, max_threads, omp_get_num_procs());
    SPH_CHECK(opts->chunk_rows >= 0, SPH_ERR_INVALID_ARG, "opts.chunk_rows is %lld, expected >= 0",
              (long long)opts->chunk_rows);
    SPH_CHECK(opts->chunk_bytes >= 0, SPH_ERR_INVALID_ARG,
              "opts.chunk_bytes is %lld, expected >= 0", (long long)opts->chunk_bytes);
    sph_device_type dt = opts->device.type;
    SPH_CHECK(dt == SPH_DEVICE_CPU || dt == SPH_DEVICE_CUDA, SPH_ERR_INVALID_ARG,
              "opts.device.type is %d, expected %d (cpu) or %d (cuda)", (int)dt, SPH_DEVICE_CPU,
              SPH_DEVICE_CUDA);
    SPH_CHECK(opts->device.id >= 0, SPH_ERR_INVALID_ARG, "opts.device.id is %d, expected >= 0",
              (int)opts->device.id);
    /* fields appended after tune_cache: read only when the caller's struct has them */
    const uint32_t flags = opts->struct_size >= offsetof(sph_ctx_opts, cuda_flags) +
                                                    sizeof(opts->cuda_flags)
                               ? opts->cuda_flags
                               : 0;
    SPH_CHECK((flags & ~SPH_CUDA_FLAGS_ALL) == 0, SPH_ERR_INVALID_ARG,
              "opts.cuda_flags is 0x%x: bits 0x%x are not sph_cuda_flag switches", flags,
              flags & ~SPH_CUDA_FLAGS_ALL);
    SPH_CHECK(!((flags & SPH_CUDA_FLAG_PINGPONG) && (flags & SPH_CUDA_FLAG_COOPERATIVE)),
              SPH_ERR_INVALID_ARG,
              "opts.cuda_flags is 0x%x: SPH_CUDA_FLAG_PINGPONG and SPH_CUDA_FLAG_COOPERATIVE "
              "exclude each other", flags);
    const uint32_t op = flags & SPH_CUDA_FLAGS_ONEPASS;
    SPH_CHECK((op & (op - 1)) == 0, SPH_ERR_INVALID_ARG,
              "opts.cuda_flags is 0x%x: the SPH_CUDA_FLAG_ONEPASS_* switches exclude each other",
              flags);

    sph_ctx_t ctx = sph_calloc(1, sizeof *ctx);
    SPH_CHECK(ctx != NULL, SPH_ERR_ALLOC, "ctx: out of host memory");
    memcpy(&ctx->opts, opts, sizeof *opts < opts->struct_size ? sizeof *opts : opts->struct_size);
    ctx->opts.struct_size = sizeof ctx->opts;
    ctx->opts.cuda_flags = flags;
    ctx->device = opts->device;
    ctx->stream = opts->stream;
    ctx->num_threads = opts->num_threads > 0 ? opts->num_threads : omp_get_max_threads();
    if (ctx->num_threads > max_threads) { /* OMP_NUM_THREADS beyond the bound */
        sph_log(1, "context: %d threads (OMP_NUM_THREADS) capped at %d", ctx->num_threads,
                max_threads);
        ctx->num_threads = max_threads;
    }
    if (ctx->num_threads < 1) ctx->num_threads = 1;
    ctx->nf_first = -1;
    ctx->isa = sph_cpu_isa_detect();
    ctx->chunk_rows = opts->chunk_rows;
    ctx->chunk_bytes = opts->chunk_bytes
                           ? opts->chunk_bytes
                           : (dt == SPH_DEVICE_CUDA ? (int64_t)1 << 30 : (int64_t)64 << 20);
    ctx->tp_comm = opts->tp_comm;

    const char *tc = opts->tune_cache ? opts->tune_cache : getenv("SPH_TUNE_CACHE");
    if (tc) {
        snprintf(ctx->tune_cache, sizeof ctx->tune_cache, "%s", tc);
    } else {
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (xdg && *xdg)
            snprintf(ctx->tune_cache, sizeof ctx->tune_cache, "%s/spanhead/tune.json", xdg);
        else if (home && *home)
            snprintf(ctx->tune_cache, sizeof ctx->tune_cache, "%s/.cache/spanhead/tune.json", home);
    }

    const char *k = opts->force_kernel ? opts->force_kernel : getenv("SPH_KERNEL");
    sph_status s = SPH_OK;
    if (k) s = parse_kernel(k, opts->force_kernel ? "force_kernel" : "SPH_KERNEL (environment)",
                            ctx);
    ctx->dev = sph_registry_device(dt);
    if (s == SPH_OK && !ctx->dev)
        s = sph_err(SPH_ERR_UNSUPPORTED, "opts.device: CUDA requested but spanhead was built "
                                         "without CUDA");
    if (s == SPH_OK && ctx->dev->ctx_init) s = ctx->dev->ctx_init(ctx);
    if (s != SPH_OK) {
        if (ctx->dev && ctx->dev->ctx_fini) ctx->dev->ctx_fini(ctx);
        sph_free(ctx);
        return s;
    }
    /* the head table: the reference in every slot (staged when the device's memory is not
     * host memory), then the device's kernels over it unless the reference is forced */
    if (ctx->dev->ref_fill) ctx->dev->ref_fill(ctx, &ctx->head, !ctx->dev->host_memory);
    if (!ctx->use_ref && ctx->dev->head_fill) ctx->dev->head_fill(ctx, &ctx->head);
    if (ctx->opts.batch_invariant && !ctx->head.batch_invariant) {
        s = sph_err(SPH_ERR_UNSUPPORTED,
                    "opts.batch_invariant: the %s backend does not keep a row's outputs "
                    "independent of the other rows (force_kernel \"ref\" does, by "
                    "construction; so does a CUDA context)",
                    ctx->head.name);
        if (ctx->dev->ctx_fini) ctx->dev->ctx_fini(ctx);
        sph_free(ctx);
        return s;
    }
    sph_log(3, "context: %s (head: %s)", ctx->describe, ctx->head.name);
    ctx->magic = SPH_CTX_MAGIC;
    *out = ctx;
    return SPH_OK;
}

int sph_max_threads(void) {
    int procs = omp_get_num_procs(), limit = omp_get_thread_limit();
    int bound = 4 * procs > 64 ? 4 * procs : 64;
    if (limit > 0 && bound > limit) bound = limit;
    return bound > 0 ? bound : 1;
}

sph_status sph_ctx_check(sph_ctx_t ctx, const char *who) {
    SPH_CHECK(ctx != NULL, SPH_ERR_INVALID_ARG, "ctx: NULL (%s)", who);
    SPH_CHECK(ctx->magic == SPH_CTX_MAGIC, SPH_ERR_INVALID_ARG,
              "ctx: %p is not a live context (%s: destroyed, or not made by sph_ctx_create)",
              (void *)ctx, who);
    return SPH_OK;
}

sph_status sph_ctx_enter(sph_ctx_t ctx, const char *who) {
    SPH_TRY(sph_ctx_check(ctx, who));
    int idle = 0;
    SPH_CHECK(__atomic_compare_exchange_n(&ctx->busy, &idle, 1, 0, __ATOMIC_ACQUIRE,
                                          __ATOMIC_RELAXED),
              SPH_ERR_INVALID_ARG,
              "ctx: %p is in use by another call (%s refused, nothing written): a context "
              "serves one thread at a time; give each thread its own context", (void *)ctx, who);
    return SPH_OK;
}

sph_status sph_ctx_leave(sph_ctx_t ctx, sph_status s) {
    __atomic_store_n(&ctx->busy, 0, __ATOMIC_RELEASE);
    return s;
}

void sph_ctx_note_nonfinite(sph_ctx_t ctx, int64_t n, int64_t first) {
    if (n <= 0) return;
    if (ctx->nf_count == 0 || first < ctx->nf_first) ctx->nf_first = first;
    ctx->nf_count += n;
}

void sph_ctx_destroy(sph_ctx_t ctx) {
    /* NULL, a destroyed (best effort) or foreign pointer: nothing to free */
    if (!ctx || ctx->magic != SPH_CTX_MAGIC) return;
    if (ctx->dev && ctx->dev->ctx_fini) ctx->dev->ctx_fini(ctx);
    ctx->magic = SPH_CTX_DEAD;
    sph_free(ctx);
}

const char *sph_ctx_describe(sph_ctx_t ctx) {
    if (!ctx) return "(null context)";
    return ctx->magic == SPH_CTX_MAGIC ? ctx->describe : "(not a live context)";
}

sph_status sph_ctx_nonfinite(sph_ctx_t ctx, int64_t *count, int64_t *first_row) {
    SPH_TRY(sph_ctx_check(ctx, "ctx_nonfinite"));
    SPH_CHECK(count != NULL, SPH_ERR_INVALID_ARG, "ctx_nonfinite: count is NULL");
    SPH_TRY(sph_ctx_enter(ctx, "ctx_nonfinite"));
    if (ctx->dev->nonfinite) return sph_ctx_leave(ctx, ctx->dev->nonfinite(ctx, count, first_row));
    *count = ctx->nf_count;
    if (first_row) *first_row = ctx->nf_count ? ctx->nf_first : -1;
    ctx->nf_count = 0;
    ctx->nf_first = -1;
    return sph_ctx_leave(ctx, SPH_OK);
}

sph_status sph_ctx_malloc(sph_ctx_t ctx, size_t bytes, void **ptr) {
    SPH_CHECK(ptr != NULL, SPH_ERR_INVALID_ARG, "ctx_malloc: ptr is NULL");
    *ptr = NULL;
    SPH_TRY(sph_ctx_check(ctx, "ctx_malloc"));
    return ctx->dev->malloc(ctx, bytes, ptr);
}

void sph_ctx_free(sph_ctx_t ctx, void *ptr) {
    if (!ctx || !ptr || ctx->magic != SPH_CTX_MAGIC) return;
    ctx->dev->free(ctx, ptr);
}

sph_status sph_ctx_memcpy(sph_ctx_t ctx, void *dst, const void *src, size_t bytes) {
    SPH_TRY(sph_ctx_check(ctx, "ctx_memcpy"));
    if (bytes == 0) return SPH_OK;
    SPH_CHECK(dst && src, SPH_ERR_INVALID_ARG, "ctx_memcpy: dst or src is NULL");
    return ctx->dev->memcpy(ctx, dst, src, bytes);
}

sph_status sph_ctx_memset(sph_ctx_t ctx, void *dst, int value, size_t bytes) {
    SPH_TRY(sph_ctx_check(ctx, "ctx_memset"));
    if (bytes == 0) return SPH_OK;
    SPH_CHECK(dst != NULL, SPH_ERR_INVALID_ARG, "ctx_memset: dst is NULL");
    return ctx->dev->memset(ctx, dst, value, bytes);
}

sph_status sph_ctx_synchronize(sph_ctx_t ctx) {
    SPH_TRY(sph_ctx_check(ctx, "ctx_synchronize"));
    return ctx->dev->synchronize(ctx);
}
