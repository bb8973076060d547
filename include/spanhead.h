/*
 * spanhead.h - the one public header of spanhead.
 *
 * spanhead computes the training signal of a language model's output layer for RL and SFT
 * post-training: per-token log-probabilities of the target tokens, entropy, log-sum-exp and
 * mean logit, forward and backward, without materializing the [tokens x vocab] logits and
 * paying only for the tokens that carry loss (the "active" rows of the loss mask). It also
 * owns the host metadata those kernels need: alignment, packed segment layouts under
 * tensor/context parallelism, CP-local rows, active masks and spans, and bin packing.
 *
 * Conventions
 *   - Every function returns sph_status; SPH_OK is 0. On failure sph_last_error() returns this
 *     thread's message: what failed, which argument, expected vs got. Nothing aborts.
 *   - The caller owns all memory. Compute calls take a workspace whose size is queried with
 *     the same arguments (sph_head_workspace_size). Metadata calls that produce
 *     variable-length output return library-allocated result objects freed by their own
 *     *_free function (NULL-safe); these are host-side planning calls, never hot paths.
 *   - Tensors are DLPack-compatible views (sph_tensor matches DLTensor field for field, so a
 *     DLTensor * passes as is). Strides count elements; NULL strides mean compact row-major.
 *   - Sizes, indices and offsets are int64_t; token ids are int32 or int64.
 *   - GPU calls enqueue on the context's stream and return; faults surface at the next sync.
 *
 * Example (examples/head_forward_backward.c, a program the tests build against an installed
 * prefix and run; N, H, V are its compile-time sizes): the forward gives logp, the backward
 * the gradients of sum_i g_i logp_i.
 *
 *   static int run(float *h, float *w, int64_t *t, float *g, float *logp, float *dh, float *dw) {
 *       sph_ctx_opts o = SPH_CTX_OPTS_INIT; // CPU, all threads
 *       sph_ctx_t ctx;
 *       if (sph_ctx_create(&ctx, &o) != SPH_OK) {
 *           fprintf(stderr, "spanhead: %s\n", sph_last_error());
 *           return 1;
 *       }
 *       int64_t hs[2] = {N, H}, vs[2] = {V, H}, ns[1] = {N}, ss[2] = {N, 3};
 *       float stats[N * 3]; // (max, lse, mu) per row: the forward writes it, the backward reads it
 *       const sph_device cpu = {SPH_DEVICE_CPU, 0};
 *       sph_tensor hid = {.data = h, .device = cpu, .ndim = 2, .dtype = SPH_F32, .shape = hs};
 *       sph_tensor wt = {.data = w, .device = cpu, .ndim = 2, .dtype = SPH_F32, .shape = vs};
 *       sph_tensor tgt = {.data = t, .device = cpu, .ndim = 1, .dtype = SPH_I64, .shape = ns};
 *       sph_tensor lp = {.data = logp, .device = cpu, .ndim = 1, .dtype = SPH_F32, .shape = ns};
 *       sph_tensor st = {.data = stats, .device = cpu, .ndim = 2, .dtype = SPH_F32, .shape = ss};
 *       sph_tensor up = {.data = g, .device = cpu, .ndim = 1, .dtype = SPH_F32, .shape = ns};
 *       sph_tensor dht = {.data = dh, .device = cpu, .ndim = 2, .dtype = SPH_F32, .shape = hs};
 *       sph_tensor dwt = {.data = dw, .device = cpu, .ndim = 2, .dtype = SPH_F32, .shape = vs};
 *
 *       sph_head_args a = SPH_HEAD_ARGS_INIT;
 *       a.hidden = &hid, a.weight = &wt, a.targets = &tgt, a.logprob = &lp, a.stats = &st;
 *       size_t bytes = 0, need = 0; // the caller owns the workspace, sized by the same arguments
 *       void *ws = NULL;
 *       sph_status s = sph_head_workspace_size(ctx, SPH_HEAD_FORWARD, &a, &bytes);
 *       if (s == SPH_OK && !(ws = malloc(bytes ? bytes : 1))) s = SPH_ERR_ALLOC;
 *       if (s == SPH_OK) s = sph_head_forward(ctx, &a, ws, bytes); // logp[i] = log p(t_i | h_i)
 *
 *       a.dlogprob = &up, a.dhidden = &dht, a.dweight = &dwt; // gradients of sum_i g_i logp_i
 *       if (s == SPH_OK) s = sph_head_workspace_size(ctx, SPH_HEAD_BACKWARD, &a, &need);
 *       if (s == SPH_OK && need > bytes) {
 *           free(ws);
 *           if (!(ws = malloc(need))) s = SPH_ERR_ALLOC;
 *           bytes = need;
 *       }
 *       if (s == SPH_OK) s = sph_head_backward(ctx, &a, ws, bytes);
 *       if (s != SPH_OK) fprintf(stderr, "%s: %s\n", sph_status_str(s), sph_last_error());
 *       free(ws);
 *       sph_ctx_destroy(ctx);
 *       return s != SPH_OK;
 *   }
 */
#ifndef SPANHEAD_H
#define SPANHEAD_H

#include <math.h> /* HUGE_VAL in SPH_POLICY_ARGS_INIT */
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define SPH_API
#else
#define SPH_API __attribute__((visibility("default")))
#endif

/* The version, in one place: CMakeLists.txt reads these lines, sph_version() is built from
 * them, the Python package reports sph_version() and its build reads them too. */
#define SPH_VERSION_MAJOR 0
#define SPH_VERSION_MINOR 1
#define SPH_VERSION_PATCH 0

/* ---------------------------------------------------------------------------------------- */
/* Status and errors                                                                         */
/* ---------------------------------------------------------------------------------------- */

/* Codes are only ever appended, never renumbered, reused or removed. */
typedef enum sph_status {
    SPH_OK = 0,
    SPH_ERR_INVALID_ARG = 1,  /* a null pointer, a value out of its domain */
    SPH_ERR_SHAPE = 2,        /* shapes disagree across arguments, bad ndim or strides */
    SPH_ERR_DTYPE = 3,        /* unsupported or mismatched dtype */
    SPH_ERR_DEVICE = 4,       /* wrong device for a tensor, host/device pointer mix-up */
    SPH_ERR_ALLOC = 5,        /* host or device allocation failed */
    SPH_ERR_OVERFLOW = 6,     /* an integer size or sum overflows int64 */
    SPH_ERR_UNSUPPORTED = 7,  /* valid request this build or device cannot serve */
    SPH_ERR_CUDA = 8,         /* a CUDA runtime, driver or cuBLAS error */
    SPH_ERR_MPI = 9,          /* an MPI error */
    SPH_ERR_NCCL = 10,        /* an NCCL error */
    SPH_ERR_PARSE = 11,       /* malformed JSON or text input */
    SPH_ERR_INFEASIBLE = 12,  /* a request no solution satisfies (e.g. impossible bin count) */
    SPH_ERR_IO = 13,          /* a file could not be read or written */
    SPH_ERR_WORKSPACE = 14,   /* workspace missing, too small or misaligned */
    SPH_ERR_MISMATCH = 15,    /* ranks of a communicator disagree on the configuration */
    SPH_ERR_NO_DEVICE = 16,   /* no CUDA device present */
    SPH_ERR_INTERNAL = 17,    /* a broken invariant inside spanhead (a bug: please report) */
    SPH_ERR_NONFINITE = 18,   /* NaN or infinity in the statistics of an active row (see
                                 "Policies": non-finite inputs) */
} sph_status;

/* A static, human name for a status code ("invalid argument"); never NULL. */
SPH_API const char *sph_status_str(sph_status s);
/* This thread's message for the last failed call ("" if none). Valid until the next failing
 * call on this thread. */
SPH_API const char *sph_last_error(void);
/* Library version as "major.minor.patch" (SPH_VERSION_MAJOR . MINOR . PATCH of this header at
 * the library's build). */
SPH_API const char *sph_version(void);

/* ---------------------------------------------------------------------------------------- */
/* Policies (decided once; every entry point follows them)                                   */
/* ---------------------------------------------------------------------------------------- */
/*
 * Validation. Every argument is checked before any output is written; a failure names the
 * argument and the value. Nothing aborts, exits or prints.
 *
 * Non-finite inputs. NaN or infinity in hidden or weight (or logits that overflow float) makes
 * an active row's statistics (row max m, lse, mu) non-finite. The forward finds it in its
 * statistics sweep, no extra pass:
 *   - host contexts (CPU, reference): SPH_ERR_NONFINITE naming the count and the first row;
 *     no per-row output or stats written. A pass with gradients (one-pass, the backward, the
 *     losses) first scans the active rows of hidden (N_active H reads) and refuses NaN / inf
 *     there before anything is written; only finite inputs whose logits overflow float are
 *     left to the one-pass sweep, which may then have written the gradient rows of the chunks
 *     before the row's (the message says so). The backward refuses non-finite stats or
 *     upstream gradients of active rows the same way, before writing.
 *   - CUDA contexts: a host sync is not allowed inside a pass, so the pass returns SPH_OK (its
 *     outputs for such rows are NaN) and the device counts the rows; sph_ctx_nonfinite, the
 *     one call that synchronizes, reports them.
 *   Either way sph_ctx_nonfinite(ctx, &count, &first_row) returns the rows found since its
 *   last call (and resets). Inactive rows are never read for this.
 *
 * Aliasing. An output (per-row outputs and stats in the forward, dhidden, dweight, the policy
 * loss's metrics, the distillation loss's loss, and the bytes of the caller's workspace the
 * call uses) may overlap no input and no other output, byte range against byte range (from
 * shapes and strides; the policy loss's per-row inputs, the distillation loss's teacher
 * tensors and dloss, and spans are inputs too): SPH_ERR_INVALID_ARG naming both, before any
 * byte is written. Inputs may share memory.
 *
 * Strides. Every tensor, input or output, is validated alike: inner stride 1, outer strides
 * covering a whole row (rows never overlap), the offset of the last element and its byte
 * extent within int64 (SPH_ERR_OVERFLOW naming the stride), data aligned to its element.
 *
 * Context validity. A context carries a magic word from sph_ctx_create until
 * sph_ctx_destroy; a call on a garbage or destroyed one is SPH_ERR_INVALID_ARG where the
 * memory can still be read. This is best effort: a use after free reads freed memory (which a
 * sanitizer reports) and may find a new owner's bytes there. sph_ctx_destroy of such a
 * pointer does nothing (a double destroy is harmless where it is detected).
 *
 * Threads. opts.num_threads is at most 4 x the processors (at least 64, within OpenMP's
 * thread limit): beyond, SPH_ERR_INVALID_ARG naming the value and the bound. 0 takes
 * OMP_NUM_THREADS or the processor count, capped at the same bound. A context serves one
 * thread at a time: a compute call (sph_head_forward / backward, sph_policy_loss,
 * sph_ctx_nonfinite) made while another call runs on the same context is refused with
 * SPH_ERR_INVALID_ARG ("in use by another call"), nothing written; use one context per thread.
 *
 * Float conversions. The kernels compute in float: user doubles they take (temperature,
 * softcap, and the policy loss's coefficients) must be finite, > 0 (softcap and the policy's
 * coefficients: or 0 = off; clip_ratio_c: or infinity = none) and, with their inverses where
 * the kernels multiply by them (temperature, softcap, norm_length), normal floats
 * (temperature and a non-zero softcap in about [2.9e-39, 8.5e37]); a product the policy loss
 * forms from its coefficients alone (the per-row entropy and k1 gradients, c eta and c beta,
 * c <= 1 / norm_length or 1) must fit float too; otherwise SPH_ERR_INVALID_ARG naming the
 * value.
 *
 * Tensor-parallel calls. Every rank of a TP group must make the same call: N, H, vocab_total,
 * the dtype, temperature, softcap, candidates K, the mask or spans, the targets, candidates and
 * upstream gradients, which outputs are requested, accumulate/allreduce, and contexts with the
 * same chunk_rows / chunk_bytes. With a host communicator (MPI) every pass checks this first
 * with one allgather of a 136-byte record (exact scalars, hashes of the arrays; measured at
 * a few microseconds): a difference is SPH_ERR_MISMATCH on every rank, naming the field and
 * the ranks, before any output is written. With a device communicator (NCCL) a check would
 * need a host sync: it is the caller's duty there, checked in debug builds (NDEBUG unset).
 */

/* Optional log sink; silent by default. level: 0 error, 1 warn, 2 info, 3 debug. The
 * environment variable SPH_LOG=debug|info|warn|error also logs to stderr when no callback
 * is set. */
typedef void (*sph_log_fn)(int level, const char *msg, void *user);
SPH_API void sph_set_log_callback(sph_log_fn fn, void *user);

/* ---------------------------------------------------------------------------------------- */
/* Tensors (DLPack vocabulary)                                                               */
/* ---------------------------------------------------------------------------------------- */

typedef enum sph_device_type {
    SPH_DEVICE_CPU = 1,      /* kDLCPU */
    SPH_DEVICE_CUDA = 2,     /* kDLCUDA */
    SPH_DEVICE_CUDA_HOST = 3 /* kDLCUDAHost (pinned host memory; treated as CPU memory) */
} sph_device_type;

typedef struct sph_device {
    sph_device_type type;
    int32_t id;
} sph_device;

typedef enum sph_dtype_code {
    SPH_DTYPE_INT = 0,   /* kDLInt */
    SPH_DTYPE_UINT = 1,  /* kDLUInt */
    SPH_DTYPE_FLOAT = 2, /* kDLFloat */
    SPH_DTYPE_BFLOAT = 4,/* kDLBfloat */
    SPH_DTYPE_BOOL = 6   /* kDLBool */
} sph_dtype_code;

typedef struct sph_dtype {
    uint8_t code;  /* sph_dtype_code */
    uint8_t bits;
    uint16_t lanes;
} sph_dtype;

#define SPH_F32 ((sph_dtype){SPH_DTYPE_FLOAT, 32, 1})
#define SPH_F16 ((sph_dtype){SPH_DTYPE_FLOAT, 16, 1})
#define SPH_BF16 ((sph_dtype){SPH_DTYPE_BFLOAT, 16, 1})
#define SPH_F64 ((sph_dtype){SPH_DTYPE_FLOAT, 64, 1})
#define SPH_I32 ((sph_dtype){SPH_DTYPE_INT, 32, 1})
#define SPH_I64 ((sph_dtype){SPH_DTYPE_INT, 64, 1})
#define SPH_U8 ((sph_dtype){SPH_DTYPE_UINT, 8, 1})
#define SPH_BOOL ((sph_dtype){SPH_DTYPE_BOOL, 8, 1})

/* Field for field a DLTensor. shape/strides point at caller memory of ndim entries. */
typedef struct sph_tensor {
    void *data;
    sph_device device;
    int32_t ndim;
    sph_dtype dtype;
    int64_t *shape;
    int64_t *strides; /* elements; NULL = compact row-major */
    uint64_t byte_offset;
} sph_tensor;

/* ---------------------------------------------------------------------------------------- */
/* Context                                                                                   */
/* ---------------------------------------------------------------------------------------- */

typedef struct sph_ctx *sph_ctx_t;
typedef struct sph_comm *sph_comm_t;

/* A/B switches of the CUDA head (sph_ctx_opts.cuda_flags, or'd). The defaults are the measured
 * best (notes/cuda-notes.md); each switch turns one choice off to measure what it buys. All of
 * them keep the results within the parity tolerances (the reductions' order may change, so
 * bits may too). CPU contexts ignore them. The library never reads the environment for them:
 * sph_ctx_opts_apply_env maps the SPH_CUDA_* variables of the benchmark scripts onto them for
 * callers that want that (the CLI, the benchmarks and the GPU tests do). */
typedef enum sph_cuda_flag {
    SPH_CUDA_FLAG_NO_GATHER = 1u << 0,      /* chunks never cross spans (SPH_CUDA_GATHER=0) */
    SPH_CUDA_FLAG_NO_SQUARE = 1u << 1,      /* the backward keeps whole-shard rows instead of
                                               square chunk x split tiles (SPH_CUDA_SQUARE=0) */
    SPH_CUDA_FLAG_NO_FUSED = 1u << 2,       /* no sm_90a fused epilogues: cuBLAS + staged fp32
                                               logits (SPH_CUDA_FUSED=0) */
    SPH_CUDA_FLAG_NO_COLOUTER = 1u << 3,    /* the gradient sweep is always row-outer
                                               (SPH_CUDA_COLOUTER=0) */
    SPH_CUDA_FLAG_DENSE_BACKWARD = 1u << 4, /* the backward computes every row, the mask zeroing
                                               the inactive ones: the dense baseline of the
                                               active-row savings (SPH_CUDA_BWD_DENSE=1) */
    SPH_CUDA_FLAG_NO_SM90 = 1u << 5,        /* no sm_90a wgmma/TMA kernel at all: the fused
                                               epilogues and the batch-invariant logits take the
                                               portable paths (SPH_CUDA_SM90=0) */
    SPH_CUDA_FLAG_PINGPONG = 1u << 6,       /* the sm_90a kernel's ping-pong schedule whatever H
                                               (SPH_CUDA_PINGPONG=1); default: H picks */
    SPH_CUDA_FLAG_COOPERATIVE = 1u << 7,    /* its cooperative schedule whatever H
                                               (SPH_CUDA_PINGPONG=0); exclusive with PINGPONG */
    SPH_CUDA_FLAG_NO_STORE16 = 1u << 8,     /* the fused epilogues store half-precision pairs (4
                                               bytes) instead of 16-byte words
                                               (SPH_CUDA_STORE16=0) */
    /* One-pass forward, forced (default: the layout picks; at most one of the three): */
    SPH_CUDA_FLAG_ONEPASS_E = 1u << 9,      /* staged E: the fused statistics epilogue keeps
                                               exp(z - m_tile) in f16, turned into dlogits in
                                               place (SPH_CUDA_ONEPASS=e) */
    SPH_CUDA_FLAG_ONEPASS_F32 = 1u << 10,   /* staged fp32 logits, unfused kernels
                                               (SPH_CUDA_ONEPASS=f32) */
    SPH_CUDA_FLAG_ONEPASS_RECOMPUTE = 1u << 11, /* statistics of every chunk, then the
                                               backward's sweep recomputing the logits
                                               (SPH_CUDA_ONEPASS=recompute) */
    /* Kernel versions under test (issue 23), off by default until a device A/B shows them
     * correct and faster; each turns one on: */
    SPH_CUDA_FLAG_E_TWO_CHUNKS = 1u << 12, /* staged E: when the whole shard's rows miss the
                                               budget, two chunks accumulating half-precision dW
                                               in place of the fp32 dW accumulator
                                               (SPH_CUDA_E2CHUNK=1) */
    SPH_CUDA_FLAG_DH_SPLITK = 1u << 13,    /* dH of short chunks split over the vocabulary into
                                               fp32 partials (one batched GEMM), then summed
                                               (SPH_CUDA_DHSPLITK=1) */
    SPH_CUDA_FLAG_E2D_OVERLAP = 1u << 14,  /* staged E: D made per row block on a second stream,
                                               each block's dH GEMM after it, so the pass over
                                               E overlaps the GEMMs (SPH_CUDA_E2DOVL=1) */
    SPH_CUDA_FLAG_DW32_BETA0 = 1u << 15,   /* the fp32 dW accumulator written by the first
                                               chunk's dW GEMM (beta 0) instead of zeroed first
                                               by a memset (SPH_CUDA_DW32BZ=1) */
    SPH_CUDA_FLAG_EXTRAS_STAGED = 1u << 16  /* issue 25's extras (sum_p2, top-k) from staged
                                               fp32 logits (the cuBLAS path and one more
                                               kernel) instead of inside the fused sm_90a
                                               statistics epilogue (SPH_CUDA_EXTRAS=staged) */
} sph_cuda_flag;

typedef struct sph_ctx_opts {
    size_t struct_size;       /* sizeof(sph_ctx_opts); set by SPH_CTX_OPTS_INIT. Fields are only
                                 appended: an older, shorter struct_size leaves the new ones 0 */
    sph_device device;        /* CPU or CUDA device to run on */
    void *stream;             /* cudaStream_t for CUDA contexts; NULL = default stream */
    int num_threads;          /* CPU threads; 0 = all available (OMP_NUM_THREADS honoured) */
    const char *force_kernel; /* "ref", "avx2", "avx512", "cuda", ...; NULL = best (env
                                 SPH_KERNEL overrides when NULL). "ref" on a CUDA context runs
                                 the float64 reference on host copies of the tensors (staged,
                                 synchronous, no TP group): a path for tests and debugging */
    int allow_tf32;           /* CUDA fp32 inputs may use TF32 tensor cores */
    int batch_invariant;      /* CUDA: a row's outputs do not depend on other rows, N, mask */
    int64_t chunk_rows;       /* rows per chunk of staged logits; 0 = automatic */
    int64_t chunk_bytes;      /* cap on staged-logit bytes per chunk; 0 = default (1 GiB on
                                 CUDA, 64 MiB on CPU) */
    sph_comm_t tp_comm;       /* tensor-parallel group (vocab shards); NULL = none. Not owned */
    const char *tune_cache;   /* path of the autotuning cache; NULL = default
                                 ($SPH_TUNE_CACHE, else $XDG_CACHE_HOME/spanhead/tune.json) */
    uint32_t cuda_flags;      /* sph_cuda_flag switches, or'd; 0 = the defaults. Unknown bits,
                                 PINGPONG with COOPERATIVE, or two ONEPASS flags are
                                 SPH_ERR_INVALID_ARG */
} sph_ctx_opts;

#define SPH_CTX_OPTS_INIT { .struct_size = sizeof(sph_ctx_opts), .device = {SPH_DEVICE_CPU, 0} }

/* Sets opts->cuda_flags from the environment variables of the benchmark scripts, for callers
 * that want them honoured (the library itself never reads them): SPH_CUDA_GATHER,
 * SPH_CUDA_SQUARE, SPH_CUDA_FUSED, SPH_CUDA_COLOUTER and SPH_CUDA_SM90 ("0" sets the switch
 * that turns the choice off, "1" clears it), SPH_CUDA_BWD_DENSE ("1" sets DENSE_BACKWARD, "0"
 * clears it), SPH_CUDA_PINGPONG ("1" ping-pong, "0" cooperative), SPH_CUDA_STORE16 ("0" sets
 * NO_STORE16), SPH_CUDA_ONEPASS ("e", "f32", "recompute", or "auto" for none of them). A
 * variable that is unset or empty leaves its switch as it is. Errors: SPH_ERR_INVALID_ARG
 * (opts NULL or too short, a value other than those, naming the variable and the value; opts
 * unchanged then). */
SPH_API sph_status sph_ctx_opts_apply_env(sph_ctx_opts *opts);

/* Creates a context: picks the kernel set (CPU ISA or GPU capability), creates library
 * handles (cuBLAS) on CUDA. Errors: SPH_ERR_NO_DEVICE, SPH_ERR_UNSUPPORTED (CUDA requested
 * in a build without it), SPH_ERR_INVALID_ARG. Thread safety: a context is used by one thread
 * at a time. */
SPH_API sph_status sph_ctx_create(sph_ctx_t *ctx, const sph_ctx_opts *opts);
SPH_API void sph_ctx_destroy(sph_ctx_t ctx); /* NULL-safe */
/* A one-line description of the chosen kernels ("cpu avx512 threads=2 openblas"). */
SPH_API const char *sph_ctx_describe(sph_ctx_t ctx);
/* Memory helpers for callers without a framework (CLI, tests); never used on hot paths.
 * sph_ctx_malloc allocates on the context's device (plain cudaMalloc on CUDA), sph_ctx_memcpy
 * copies between any host/device pointers (synchronous), sph_ctx_synchronize waits for the
 * context's stream and returns any pending device error. */
SPH_API sph_status sph_ctx_malloc(sph_ctx_t ctx, size_t bytes, void **ptr);
SPH_API void sph_ctx_free(sph_ctx_t ctx, void *ptr);
SPH_API sph_status sph_ctx_memcpy(sph_ctx_t ctx, void *dst, const void *src, size_t bytes);
SPH_API sph_status sph_ctx_memset(sph_ctx_t ctx, void *dst, int value, size_t bytes);
SPH_API sph_status sph_ctx_synchronize(sph_ctx_t ctx);
/* The active rows whose statistics were non-finite in the passes on ctx since the last call
 * (or the context's creation), and the first (lowest) such row, -1 when none; resets both.
 * Host contexts: the rows their passes refused with SPH_ERR_NONFINITE. CUDA contexts: counted on
 * the device by the passes (which returned SPH_OK); this call synchronizes the context's
 * stream to read them (the only one that does). first_row may be NULL. Errors:
 * SPH_ERR_INVALID_ARG (ctx not live, count NULL), SPH_ERR_CUDA. */
SPH_API sph_status sph_ctx_nonfinite(sph_ctx_t ctx, int64_t *count, int64_t *first_row);
/* Number of CUDA devices visible (0 without CUDA or without a device); never fails. */
SPH_API int sph_cuda_device_count(void);

/* ---------------------------------------------------------------------------------------- */
/* Host metadata: alignment, packed layouts, CP-local rows (docs/design.md section 3)        */
/* ---------------------------------------------------------------------------------------- */

typedef enum sph_fp8 {
    SPH_FP8_NONE = 0,
    SPH_FP8_BLOCKWISE = 1,
    SPH_FP8_MXFP8 = 2
} sph_fp8;

typedef struct sph_parallel {
    int64_t tp;    /* tensor-parallel size T >= 1 */
    int64_t cp;    /* context-parallel size C >= 1 */
    sph_fp8 fp8;   /* FP8 recipe, changes the token alignment */
} sph_parallel;

#define SPH_PARALLEL_INIT { .tp = 1, .cp = 1, .fp8 = SPH_FP8_NONE }

/* Alignment: sequence = 2TC if C > 1 else 1; total = 2TC if C > 1 else T, lcm'd with the FP8
 * token alignment (MXFP8 32TC; blockwise 128TC if T > 1 else 16C); unpacked (C = 1 only) =
 * T or lcm(T, FP8 alignment). */
typedef struct sph_alignment {
    int64_t sequence;
    int64_t total;
    int64_t unpacked; /* 0 when C > 1 (unpacked layouts do not exist under CP) */
} sph_alignment;

SPH_API sph_status sph_alignment_get(const sph_parallel *par, sph_alignment *out);
/* Errors (all metadata calls): SPH_ERR_INVALID_ARG for tp < 1, cp < 1, an unknown fp8 recipe or
 * a NULL pointer; SPH_ERR_OVERFLOW when an alignment does not fit in int64. */

/* Packed segment layout: each length padded to the sequence alignment, then the final
 * segment grows so the total is a multiple of the total alignment. padded[n],
 * cu_seqlens_padded[n + 1] are caller arrays. The single source of truth for every user.
 * Lengths must be >= 1 (SPH_ERR_INVALID_ARG); a padded sum beyond int64 is SPH_ERR_OVERFLOW.
 * n = 0 writes cu_seqlens_padded[0] = 0 only. Nothing is written on failure. */
SPH_API sph_status sph_layout_packed(const sph_parallel *par, const int64_t *lengths, int64_t n,
                                     int64_t *padded, int64_t *cu_seqlens_padded);

/* CP-local rows of a padded segment of length P (P % 2C == 0): rank r holds chunk r then
 * chunk 2C-1-r of P/(2C) rows. Writes P/C global row offsets (relative to the segment
 * start) into rows[]. With cp = 1 the rank holds the whole segment in order (any P >= 0).
 * Errors: SPH_ERR_INVALID_ARG for P not divisible by 2C, cp_rank outside [0, cp), P < 0. */
SPH_API sph_status sph_cp_local_rows(int64_t P, int64_t cp, int64_t cp_rank, int64_t *rows);

/* ---------------------------------------------------------------------------------------- */
/* Active masks and spans                                                                    */
/* ---------------------------------------------------------------------------------------- */

typedef enum sph_layout_kind {
    SPH_LAYOUT_UNPACKED = 0, /* B rows of length S, flattened [B*S] */
    SPH_LAYOUT_PACKED = 1    /* sequences placed at padded offsets, CP-local */
} sph_layout_kind;

/* Description of one micro-batch's token layout and loss mask (host arrays, row-major).
 * loss_mask is [B, A] over the last A token positions of each length-S row. Prediction row s
 * of a sequence predicts its token s+1, so the row predicting token position p carries the
 * loss-mask column p - (S - A); the final row of every sequence never predicts.
 *   unpacked: row b occupies flattened rows [b*S, (b+1)*S); rows S-1-A .. S-2 carry the mask.
 *   packed, sub_seq_lengths: row b's first sum(l) columns hold sub-sequences of lengths
 *     sub_seq_lengths[...] (sub_seq_counts[b] of them, flattened over b); every sub-sequence
 *     of every row becomes one segment of the packed segment layout (sph_layout_packed);
 *     a token at column p, offset q >= 1 inside its sub-sequence, is predicted by segment row
 *     q - 1. Columns past sum(l) are padding and carry no loss.
 *   packed, attention_mask [B, S]: one sequence per row made of its attended columns in
 *     order; the token at attended column p with index q >= 1 is predicted by row q - 1.
 *     A row without attended columns contributes no segment.
 *   packed with neither: each row is one sequence of length S.
 * Then the full packed layout is cut into CP-local rows (chunk r, chunk 2C-1-r per segment).
 * Segments are numbered row by row, sub-sequence by sub-sequence. attention_mask and
 * sub_seq_lengths are exclusive; unpacked layouts ignore attention_mask (positions do not
 * depend on it) and refuse sub_seq_lengths. A loss_mask 1 on a token that no row predicts
 * (padding, an unattended column, the first token of a sequence) is SPH_ERR_INVALID_ARG:
 * dropping it silently would zero a real gradient. See docs/metadata.md. */
typedef struct sph_batch_desc {
    size_t struct_size;
    sph_layout_kind layout;
    int64_t batch;              /* B */
    int64_t seq_len;            /* S */
    int64_t num_actions;        /* A, 0 <= A <= S-1 */
    const uint8_t *loss_mask;   /* [B, A] 0/1 */
    const uint8_t *attention_mask; /* [B, S] 0/1, optional (packed) */
    const int64_t *sub_seq_lengths; /* flattened per-row lists, optional (packed) */
    const int64_t *sub_seq_counts;  /* [B]: how many sub-sequences each row has */
} sph_batch_desc;

#define SPH_BATCH_DESC_INIT                                                                   \
    { .struct_size = sizeof(sph_batch_desc), .layout = SPH_LAYOUT_UNPACKED }

typedef struct sph_spans_opts {
    size_t struct_size;
    sph_parallel par;
    int64_t cp_rank;  /* 0 <= cp_rank < par.cp */
    int64_t gap;      /* coalesce active runs across inactive gaps of at most gap rows; default
                         0: exact spans, which alone say which rows are active. A gap > 0 gives
                         fewer spans that cover inactive rows too: pass the mask beside them */
} sph_spans_opts;

#define SPH_SPANS_OPTS_INIT                                                                   \
    { .struct_size = sizeof(sph_spans_opts), .par = SPH_PARALLEL_INIT, .cp_rank = 0, .gap = 0 }

/* Result of sph_spans_build; freed by sph_spans_free. */
typedef struct sph_spans {
    int64_t global_rows;        /* rows of the full (pre-CP) layout */
    int64_t active_rows;        /* active rows of the full layout */
    int64_t local_rows;         /* rows held by this CP rank */
    int64_t local_active_rows;  /* active rows among them */
    uint8_t *active_mask;       /* [global_rows] forward mask of the full layout */
    uint8_t *local_mask;        /* [local_rows] this CP rank's rows */
    int64_t n_spans;
    int64_t *spans;             /* [n_spans, 2] ordered [start, end) over local rows */
    int64_t n_segments;         /* packed: segments in the layout; unpacked: B */
    int64_t *cu_seqlens_padded; /* [n_segments + 1] (packed); NULL for unpacked */
} sph_spans;

/* Builds masks and spans from a batch description. Validates: spans cover every active local
 * row; local active count <= forward count, equal when C = 1 (a failure there is
 * SPH_ERR_INTERNAL, never wrong output). Unpacked spans require an unpadded C = 1 layout (S a
 * multiple of the unpacked alignment): anything else is SPH_ERR_INVALID_ARG. Other errors:
 * SPH_ERR_INVALID_ARG (bad sizes, mask values other than 0/1, cp_rank, gap < 0, struct_size),
 * SPH_ERR_SHAPE (a row's sub-sequences longer than S), SPH_ERR_OVERFLOW (B*S or the padded
 * layout beyond int64), SPH_ERR_ALLOC. *out is NULL on failure. Thread-safe (no shared state
 * besides the thread-local error message). */
SPH_API sph_status sph_spans_build(const sph_batch_desc *desc, const sph_spans_opts *opts,
                                   sph_spans **out);
SPH_API void sph_spans_free(sph_spans *s);

/* Coalesced ordered spans of the nonzero entries of mask[n], merging runs separated by at
 * most gap (>= 0) zeros. There are at most (n + 1) / 2 spans, so spans must have room for
 * 2 * ((n + 1) / 2) int64 entries (n = 0: may be NULL); *n_spans receives the count. */
SPH_API sph_status sph_spans_from_mask(const uint8_t *mask, int64_t n, int64_t gap,
                                       int64_t *spans, int64_t *n_spans);
/* Checks spans are non-empty, ordered, non-overlapping, inside [0, n) and cover every nonzero
 * entry of mask (mask may be NULL: then only order and range are checked). Errors:
 * SPH_ERR_INVALID_ARG naming the first offending span or uncovered row. */
SPH_API sph_status sph_spans_validate(const int64_t *spans, int64_t n_spans, int64_t n,
                                      const uint8_t *mask);

/* ---------------------------------------------------------------------------------------- */
/* Bin packing                                                                               */
/* ---------------------------------------------------------------------------------------- */

typedef enum sph_pack_algo {
    SPH_PACK_FFD = 0,      /* first-fit decreasing */
    SPH_PACK_MFFD = 1,     /* modified first-fit decreasing (Johnson & Garey) */
    SPH_PACK_BALANCED = 2  /* least-loaded, soft capacity */
} sph_pack_algo;

/* Bin packing (docs/design.md section 3.7; details and the balanced soft cap in docs/metadata.md).
 * A sequence costs its length padded to the sequence alignment of par; bins hold at most
 * capacity rounded down to the total alignment, so every bin's packed layout fits capacity.
 *   FFD: first-fit decreasing. MFFD: Johnson & Garey's modified FFD. BALANCED: by decreasing
 *   cost into the least-loaded bin if it fits there, else a new bin, starting from
 *   max(ceil(sum / capacity), min_bins) bins rounded up to bin_multiple; a sequence longer
 *   than the capacity gets a bin of its own (the only bin allowed over capacity).
 * Then bins are added until there are at least min_bins and a multiple of bin_multiple: each
 * new bin takes the largest sequence of the fullest bin holding two or more. Deterministic
 * (fixed tie-breaks); O(n log n). Bins keep creation order; items inside a bin are listed by
 * increasing index. */
typedef struct sph_pack_opts {
    size_t struct_size;
    int64_t capacity;      /* tokens per bin (> 0) */
    sph_pack_algo algorithm;
    sph_parallel par;      /* a sequence costs its padded length under par */
    int64_t min_bins;      /* at least this many bins (0 = no minimum) */
    int64_t bin_multiple;  /* bin count a multiple of this (DP size; 0 or 1 = any) */
} sph_pack_opts;

#define SPH_PACK_OPTS_INIT                                                                    \
    {                                                                                         \
        .struct_size = sizeof(sph_pack_opts), .capacity = 0, .algorithm = SPH_PACK_FFD,         \
        .par = SPH_PARALLEL_INIT, .min_bins = 0, .bin_multiple = 1                             \
    }

typedef struct sph_pack_result {
    int64_t n_bins;
    int64_t n_items;
    int64_t *bin_offsets;   /* [n_bins + 1] into items */
    int64_t *items;         /* [n_items] sequence indices, bin by bin */
    int64_t *bin_tokens;    /* [n_bins] sum of the bin's padded lengths (before the final
                               segment's growth to the total alignment) */
    double utilization;     /* sum of padded lengths / (n_bins * capacity); 0 without bins */
} sph_pack_result;

/* Errors: SPH_ERR_INVALID_ARG (lengths < 1, capacity < 1 or below the total alignment, a
 * sequence longer than the capacity under FFD/MFFD, bad options), SPH_ERR_INFEASIBLE (the bin
 * count target exceeds the number of sequences: bins are never empty), SPH_ERR_OVERFLOW (padded
 * sums or the bin target beyond int64), SPH_ERR_ALLOC. *out is NULL on failure. */
SPH_API sph_status sph_pack(const int64_t *lengths, int64_t n, const sph_pack_opts *opts,
                            sph_pack_result **out);
SPH_API void sph_pack_free(sph_pack_result *r);

/* ---------------------------------------------------------------------------------------- */
/* The LM head (docs/design.md section 2)                                                     */
/* ---------------------------------------------------------------------------------------- */
/*
 * One TP rank holds weight rows [vocab_start, vocab_start + V_loc) of vocab_total.
 *   u_ij = h_i . w_j;  z_ij = (softcap > 0 ? softcap * tanh(u_ij / softcap) : u_ij) / T
 *   lse_i = log sum_j exp(z_ij);   p_ij = exp(z_ij - lse_i)
 *   logprob_i = z_{i,t_i} - lse_i (0 when t_i < 0: ignored)
 *   mu_i = sum_j p_ij z_ij;  entropy_i = lse_i - mu_i;  logit_mean_i = (1/V) sum_j z_ij
 * Backward with upstream g (logprob), e (entropy), gl (lse), gm (logit_mean):
 *   dz_ij = g_i (delta(j,t_i) - p_ij) + e_i p_ij (mu_i - z_ij) + gl_i p_ij + gm_i / V
 *   du_ij = dz_ij / T * (softcap > 0 ? 1 - tanh^2(u_ij / softcap) : 1)
 *   dhidden_i = sum_j du_ij w_j  (this shard's partial);  dweight_j = sum_i du_ij h_i
 * Inactive rows (mask 0 / outside the spans) produce 0 in every per-row output and pass no
 * gradient whatever the upstream values say.
 *
 * Sample support (candidates given, [N, K] global ids, -1 padded): the softmax runs over the
 * row's candidates only; logprob, entropy and lse are over that set; touches K weight rows
 * per row. Each rank handles the candidates inside its shard. logit_mean is not defined there.
 *
 * sum_p2_i = sum_j p_ij^2 (optional forward output, no gradient): in the sweep, shifted by the
 * row max as every statistic is (sum_j e^(2 (z_ij - m_i)) / S_i^2); under TP one more small
 * allgather (N x 2 doubles per rank) combines it.
 *
 * top-k (optional forward outputs topk_ids (N, K) i64, topk_logprobs (N, K) f32, no
 * gradient): per active row the K ids of largest z_ij (descending; equal z: the lower id
 * first) and their log-probs z_ij - lse_i. In the sweep: a per-row running list of the K best
 * (a threshold compare per logit, the list touched only by a logit above its K-th value),
 * merged over tiles and, under TP, over ranks (one allgather of N x K (z, id) pairs).
 *
 * Per-row outputs are fp32 [N] (logit_mean, lse, logprob, entropy, sum_p2), stats is fp32 [N, 3]
 * (row max m, lse, mu) written by the forward (global over the TP group) and read by the
 * backward. Gradient outputs are [N, H] and [V_loc, H] in the input dtype or fp32.
 *
 * Rules (docs/head.md has the rest):
 *   - A row is active when active_mask says so, else when it lies inside a span, else always.
 *     Inactive rows get 0 in every per-row output and in stats.
 *   - A negative target is ignored: logprob 0, no gradient through dlogprob.
 *   - Without a TP communicator (tp_comm NULL or of size 1) a sharded call (vocab_total >
 *     V_loc) uses the statistics of its shard alone.
 *   - dlogprob needs targets; dlogit_mean is rejected in sample-support mode; a backward needs
 *     dhidden or dweight. A forward without gradient outputs ignores upstream gradients.
 *   - The CPU reference (force_kernel "ref") needs no workspace and allocates host scratch.
 *   - Deterministic: the same inputs and thread count give bitwise-identical outputs.
 */

typedef enum sph_head_pass {
    SPH_HEAD_FORWARD = 0,
    SPH_HEAD_BACKWARD = 1
} sph_head_pass;

typedef struct sph_head_args {
    size_t struct_size;               /* sizeof(sph_head_args); set by SPH_HEAD_ARGS_INIT */
    /* inputs */
    const sph_tensor *hidden;         /* (N, H) f32|bf16|f16 */
    const sph_tensor *weight;         /* (V_loc, H) same dtype as hidden */
    const sph_tensor *targets;        /* (N) i32|i64 global ids; <0 ignored; NULL = none */
    const sph_tensor *candidates;     /* (N, K) i32|i64 global ids, -1 padded; NULL = full vocab */
    int64_t vocab_start;              /* first global id of this shard */
    int64_t vocab_total;              /* V; 0 = V_loc (unsharded) */
    double temperature;               /* > 0 and finite; 1 by default */
    double softcap;                   /* >= 0 and finite; 0 = off */
    const sph_tensor *active_mask;    /* (N) u8|bool on the data's device; NULL = all active */
    const int64_t *spans;             /* host [n_spans, 2] ordered [start, end); optional */
    int64_t n_spans;
    /* per-row outputs, fp32 (N); each optional */
    const sph_tensor *logprob;
    const sph_tensor *entropy;
    const sph_tensor *lse;
    const sph_tensor *logit_mean;
    const sph_tensor *stats;          /* fp32 (N, 3): forward writes, backward reads; required */
    /* upstream gradients, fp32 (N); each optional (absent = 0) */
    const sph_tensor *dlogprob;
    const sph_tensor *dentropy;
    const sph_tensor *dlse;
    const sph_tensor *dlogit_mean;
    /* gradient outputs: backward, or forward in one-pass mode; each optional */
    const sph_tensor *dhidden;        /* (N, H) input dtype or f32 */
    const sph_tensor *dweight;        /* (V_loc, H) input dtype or f32 */
    int accumulate_dhidden;           /* 1: dhidden += ..., 0: overwrite */
    int accumulate_dweight;           /* 1: dweight += ..., 0: overwrite */
    int allreduce_dhidden;            /* 1: sum dhidden over the TP group (comm required) */
    /* appended fields: a struct_size that ends before one leaves it NULL / 0 */
    const sph_tensor *sum_p2;         /* forward: fp32 (N), sum_j p_ij^2 of each active row (0
                                         on inactive rows; over the support with candidates);
                                         no gradient. CUDA computes it on the cuBLAS / staged
                                         path (describe: "+extras"); with candidates in the
                                         support kernel's row pass (8 bytes per row more, one
                                         allgather of them under TP) */
    const sph_tensor *temperature_rows; /* f32 (N) on the data's device: row i's temperature
                                         T_i, used for row i exactly as `temperature` is
                                         (z = u * float(1 / T_i) after softcap; both passes,
                                         one-pass, support, policy loss, TP); NULL = the
                                         scalar. `temperature` must then be 1. Each T_i
                                         follows the scalar's rule ("Float conversions"):
                                         host memory is checked at validation, every row
                                         (SPH_ERR_INVALID_ARG naming temperature_rows[i],
                                         nothing written); CUDA (device memory): a bad T_i of
                                         an active row makes the row NaN and is counted by
                                         sph_ctx_nonfinite ("Policies"); inactive rows'
                                         values never reach an output there */
    const sph_tensor *topk_ids;       /* forward: i64 (N, K), 1 <= K <= SPH_HEAD_TOPK_MAX and
                                         K <= vocab_total: the K most probable global ids of
                                         each active row's distribution (after temperature and
                                         softcap), descending probability, ties lower id first;
                                         -1 on inactive rows; no gradient. Both topk tensors or
                                         neither; not with candidates (SPH_ERR_INVALID_ARG).
                                         sph_policy_loss fills them (and sum_p2) for its loss
                                         rows in the same sweep. Computed
                                         in the statistics sweep; under TP each rank's K best
                                         are allgathered (N x K pairs: 16 bytes on the host, 8
                                         on CUDA) and merged in rank order. CUDA: the staged
                                         path, as sum_p2, and vocab_total <= INT32_MAX */
    const sph_tensor *topk_logprobs;  /* forward: f32 (N, K), their log-probs z - lse (the
                                         numbers logprob gives for those ids; 0 on inactive) */
} sph_head_args;

/* The largest K of sph_head_args.topk_ids. */
#define SPH_HEAD_TOPK_MAX 256

/* Every field not named is 0 / NULL: no optional tensor, unsharded, softcap off. */
#define SPH_HEAD_ARGS_INIT { .struct_size = sizeof(sph_head_args), .temperature = 1.0 }

/* Workspace bytes the pass needs for these arguments (the same args later passed to the
 * pass). Always succeeds for valid args; 0 is a valid answer. */
SPH_API sph_status sph_head_workspace_size(sph_ctx_t ctx, sph_head_pass pass,
                                           const sph_head_args *args, size_t *bytes);

/* Forward: writes stats and every requested per-row output. One-pass mode: when dhidden or
 * dweight is given, the upstream gradients are taken as known and the gradients are
 * computed in the same sweep (each chunk of logits computed once). Everything is validated
 * before any output is written ("Policies" above). Errors: SPH_ERR_INVALID_ARG, _SHAPE,
 * _DTYPE, _DEVICE, _OVERFLOW, _WORKSPACE (the arguments), SPH_ERR_UNSUPPORTED (this backend),
 * SPH_ERR_MISMATCH (the ranks of a TP group make different calls), SPH_ERR_NONFINITE (host
 * contexts: non-finite statistics of an active row), SPH_ERR_ALLOC (the reference's scratch),
 * SPH_ERR_MPI / _NCCL / _CUDA. */
SPH_API sph_status sph_head_forward(sph_ctx_t ctx, const sph_head_args *args, void *workspace,
                                    size_t workspace_bytes);

/* Backward: reads stats (from the forward) and the upstream gradients; writes dhidden and/or
 * dweight. Errors as the forward's (SPH_ERR_NONFINITE: non-finite stats or upstream
 * gradients of an active row, host contexts). Masked mode (active_mask or spans): skips every
 * chunk/tile without an active row; dhidden rows outside the spans are written as exact zeros
 * (or left as they are when accumulating). */
SPH_API sph_status sph_head_backward(sph_ctx_t ctx, const sph_head_args *args, void *workspace,
                                     size_t workspace_bytes);

/* How a pass would run for these arguments: the workspace, how the rows and the vocabulary
 * are cut, and the path taken, so that a benchmark row or a log can say when a budget forced
 * the slower path (a one-pass forward that recomputes its logits does 8 N H V flops instead
 * of 6). Same validation and answer as sph_head_workspace_size; host-only, no device work.
 * path, one word:
 *   "reference"   the float64 reference (force_kernel "ref")
 *   "cpu"         the optimized CPU backend
 *   "cublas"      CUDA: cuBLAS logits + elementwise kernels (logits staged in fp32)
 *   "fused"       CUDA sm_90a: statistics / dlogits epilogues on the logits in registers
 *   "staged-e"    CUDA one-pass: E = exp(z - m_tile) staged in f16, gradients per chunk
 *   "staged-f32"  CUDA one-pass: fp32 logits staged, gradients per chunk
 *   "recompute"   CUDA one-pass: statistics first, then the backward's sweep (8 N H V)
 *   "support"     sample support (candidates given)
 * flags: SPH_PASS_* below. */
#define SPH_PASS_GATHERED 1u       /* chunks take rows across spans */
#define SPH_PASS_VOCAB_OUTER 2u    /* gradient sweep vocabulary-outer */
#define SPH_PASS_RECOMPUTES 4u     /* one-pass whose logits are computed twice (8 N H V) */
#define SPH_PASS_OVER_BUDGET 8u    /* the workspace exceeds the budget (fixed accumulators) */
#define SPH_PASS_BATCH_INVARIANT 16u

typedef struct sph_head_pass_info {
    size_t struct_size;       /* sizeof(sph_head_pass_info); set by SPH_HEAD_PASS_INFO_INIT */
    size_t workspace_bytes;   /* = sph_head_workspace_size */
    int64_t budget_bytes;     /* the budget the layout was cut to (0: not budgeted) */
    int64_t chunk_rows;       /* rows per chunk (0: the backend does not chunk) */
    int64_t n_chunks;
    int64_t vocab_split;      /* columns per vocabulary split (V_loc: none) */
    int64_t n_splits;
    uint32_t flags;           /* SPH_PASS_* */
    char path[24];            /* NUL-terminated */
} sph_head_pass_info;

#define SPH_HEAD_PASS_INFO_INIT {sizeof(sph_head_pass_info), 0, 0, 0, 0, 0, 0, 0, {0}}

SPH_API sph_status sph_head_describe(sph_ctx_t ctx, sph_head_pass pass,
                                     const sph_head_args *args, sph_head_pass_info *info);

/* ---------------------------------------------------------------------------------------- */
/* RL policy losses fused into the head (docs/policy.md)                                     */
/* ---------------------------------------------------------------------------------------- */
/*
 * One call computes logprob and entropy of the target tokens, a PPO-family policy loss of
 * them, its metrics and (with dhidden / dweight) its gradients. A row i is active when the
 * head's mask / spans say so AND targets[i] >= 0; other rows contribute nothing, get 0 in
 * every per-row output and pass no gradient. Per active row, with advantage A_i, old log-prob
 * o_i, reference log-prob q_i, importance weight w_i (default 1) and sequence id s_i:
 *   delta_i = logp_i - o_i
 *   ppo, cispo: r_i = exp(clamp(delta_i, -20, 20))
 *   gspo:       log r_i = logp_i - sg(logp_i) + sg(rho_j), clamped above at 10 (no gradient
 *               where clamped), rho_j = mean of delta over the active rows of i's sequence
 *   ppo, gspo:  pg_i = max(-A_i r_i, -A_i clip(r_i, 1 - eps_low, 1 + eps_high)); with a dual
 *               clip c (finite) and A_i < 0: pg_i = min(pg_i, -A_i c)
 *   cispo:      pg_i = -A_i sg(clip(r_i, 1 - eps_low, 1 + eps_high)) logp_i
 *   KL (x_i = q_i - logp_i): k1 = -x_i; k2 = x_i^2 / 2; k3 = clamp(e^x^ - x^ - 1, -10, 10),
 *               x^ = clamp(x_i, -20, 20) (no gradient where a clamp binds)
 *   l_i = w_i pg_i + kl_coef KL_i - entropy_coef H_i;   loss = sum_i c_i l_i
 * with the aggregation weights c_i fixed before the pass from T (active rows, or num_tokens),
 * S (sequences with an active row, or num_seqs), T_j (active rows of sequence j):
 *   token-mean c_i = 1/T;  seq-mean-token-sum 1/S;  seq-mean-token-mean 1/(S T_j);
 *   seq-mean-token-sum-norm 1/(S norm_length).
 * Gradients flow through logp_i and H_i only (sg = stop-gradient; A, o, q, w are constants);
 * ties follow PyTorch's autograd of the same formulas (torch.clamp passes the gradient on the
 * closed interval, torch.maximum / minimum halve it at a tie).
 *
 * Cost: ppo and cispo compute each row's dL/dlogp and dL/dH right after its statistics are
 * final, inside the head's one-pass sweep (6 N_active H V flops, the cost of the one-pass
 * weighted loss). gspo needs every row of a sequence first: it runs the forward, the
 * per-sequence rho and the backward sweep inside the same call (8 N_active H V flops).
 *
 * Metrics (f32, SPH_POLICY_N_METRICS entries, indices sph_policy_metric): loss; pg_loss =
 * sum c_i w_i pg_i; kl_loss = sum c_i KL_i; entropy_loss = sum c_i H_i; pg_clipfrac = (rows with
 * -A clip(r) > -A r) / T; pg_clipfrac_lower = (rows where the dual clip binds) / T; ppo_kl =
 * sum(-delta_i) / T; tokens (active rows counted: of the call, or of the seq_comm group);
 * seqs (sequences counted; 0 when the call groups none: token-mean ppo / cispo). Every metric
 * but the counts is a sum over this call's rows with weights fixed before the pass, so with
 * num_tokens / num_seqs of a global batch the metrics of its micro-batches (and of the ranks of
 * seq_comm) add up to the global batch's. Options a loss or aggregation does not use are
 * validated and ignored (clip_ratio_c with cispo, norm_length with another aggregation, ...).
 */

typedef enum sph_pg_loss {
    SPH_PG_PPO = 0,   /* clipped ratio (PPO, GRPO, DAPO, Dr. GRPO), optional dual clip */
    SPH_PG_CISPO = 1, /* clipped ratio as a stop-gradient weight of logp */
    SPH_PG_GSPO = 2   /* sequence-level ratio (general path: forward, rho, backward) */
} sph_pg_loss;

typedef enum sph_kl_kind {
    SPH_KL_NONE = 0,
    SPH_KL_K1 = 1, /* logp - q */
    SPH_KL_K2 = 2, /* (q - logp)^2 / 2 */
    SPH_KL_K3 = 3  /* e^x - x - 1 of x = q - logp, clamped (low-variance estimator) */
} sph_kl_kind;

typedef enum sph_loss_agg {
    SPH_AGG_TOKEN_MEAN = 0,
    SPH_AGG_SEQ_MEAN_TOKEN_SUM = 1,
    SPH_AGG_SEQ_MEAN_TOKEN_MEAN = 2,
    SPH_AGG_SEQ_MEAN_TOKEN_SUM_NORM = 3
} sph_loss_agg;

/* Indices into the metrics tensor. Appended only. */
typedef enum sph_policy_metric {
    SPH_METRIC_LOSS = 0,
    SPH_METRIC_PG_LOSS = 1,
    SPH_METRIC_KL_LOSS = 2,
    SPH_METRIC_ENTROPY_LOSS = 3,
    SPH_METRIC_PG_CLIPFRAC = 4,
    SPH_METRIC_PG_CLIPFRAC_LOWER = 5,
    SPH_METRIC_PPO_KL = 6,
    SPH_METRIC_TOKENS = 7, /* active rows counted (before num_tokens overrides T) */
    SPH_METRIC_SEQS = 8,   /* sequences counted (before num_seqs overrides S) */
    SPH_POLICY_N_METRICS = 9
} sph_policy_metric;

typedef struct sph_policy_args {
    size_t struct_size;          /* sizeof(sph_policy_args); set by SPH_POLICY_ARGS_INIT */
    sph_pg_loss loss;            /* default SPH_PG_PPO */
    double clip_low, clip_high;  /* eps_low in [0, 1], eps_high >= 0 (0.2, 0.2); each 0 or a
                                    normal float ("Policies", float conversions) */
    double clip_ratio_c;         /* dual clip c > 1; INFINITY (default) = none; ppo / gspo */
    sph_kl_kind kl;              /* default SPH_KL_NONE */
    double kl_coef;              /* beta >= 0, 0 or a normal float */
    double entropy_coef;         /* eta >= 0, 0 or a normal float (the loss subtracts eta H) */
    sph_loss_agg agg;            /* default SPH_AGG_TOKEN_MEAN */
    int64_t num_tokens;          /* T of a global batch (>= 1); 0 = the active rows counted */
    int64_t num_seqs;            /* S of a global batch (>= 1); 0 = the sequences counted */
    double norm_length;          /* L > 0 of seq-mean-token-sum-norm (required there); L and
                                    1 / L normal floats */
    /* per-row inputs on the head's device, (N) each */
    const sph_tensor *advantages;  /* f32, required */
    const sph_tensor *old_logprob; /* f32, required */
    const sph_tensor *ref_logprob; /* f32, required with a KL term, else ignored */
    const sph_tensor *is_weight;   /* f32, optional (NULL = 1) */
    const sph_tensor *seq_id;      /* i64, required by the seq-* aggregations and gspo */
    /* output */
    const sph_tensor *metrics;     /* f32 (SPH_POLICY_N_METRICS) on the head's device */
    /* optional: the group of ranks holding the other rows of the same sequences (context
     * parallelism). T, S, T_j and rho_j are then those of the rows of the whole group (each
     * rank's (seq_id, active, delta) gathered over it; every rank passes the same N). NULL =
     * the call's rows are whole sequences. Not owned. */
    sph_comm_t seq_comm;
} sph_policy_args;

#define SPH_POLICY_ARGS_INIT                                                                  \
    {                                                                                         \
        .struct_size = sizeof(sph_policy_args), .loss = SPH_PG_PPO, .clip_low = 0.2,          \
        .clip_high = 0.2, .clip_ratio_c = HUGE_VAL, .kl = SPH_KL_NONE, .kl_coef = 0.0,        \
        .entropy_coef = 0.0, .agg = SPH_AGG_TOKEN_MEAN, .num_tokens = 0, .num_seqs = 0,       \
        .norm_length = 0.0, .advantages = NULL, .old_logprob = NULL, .ref_logprob = NULL,     \
        .is_weight = NULL, .seq_id = NULL, .metrics = NULL, .seq_comm = NULL                  \
    }

/* Workspace bytes of sph_policy_loss for these arguments (the same ones later passed). */
SPH_API sph_status sph_policy_loss_workspace_size(sph_ctx_t ctx, const sph_head_args *head,
                                                  const sph_policy_args *policy, size_t *bytes);

/* The policy loss above in one call. head: hidden, weight, targets (required), active_mask /
 * spans, vocab shard, temperature, softcap, the optional per-row outputs logprob, entropy,
 * lse, logit_mean, stats (optional here: NULL = kept in the workspace), dhidden / dweight
 * with accumulate / allreduce as in sph_head_forward (neither: loss and metrics only), and
 * the head's extras sum_p2 and topk_ids + topk_logprobs (issue 25; the head's rules: K in
 * [1, SPH_HEAD_TOPK_MAX], K <= vocab_total, both topk tensors or neither, no gradient): the
 * policy's own distribution (after temperature and softcap) of every loss row, computed in
 * the loss's sweep and merged over the TP group in rank order exactly as sph_head_forward
 * does; rows outside the loss (inactive, or target < 0) get sum_p2 0, ids -1, log-probs 0,
 * like logprob. Cost: no extra pass over the vocabulary on the CPU and the reference; on CUDA
 * the extras read the staged fp32 logits, so the sweep takes the staged-f32 (or recompute)
 * path instead of the fused sm_90a kernels (docs/policy.md, "The head's extras"); gspo
 * writes them after its backward took the gradients. The head's upstream gradients
 * (dlogprob, dentropy, dlse, dlogit_mean) and candidates are refused: the loss defines the
 * upstream gradients. policy: as documented in
 * sph_policy_args; metrics are written on the head's device (CUDA: enqueued, no host sync).
 * TP: every rank of tp_comm gets the same loss and metrics (bitwise: the statistics combine
 * in rank order); dweight is the rank's shard, dhidden its partial unless allreduce_dhidden.
 * Errors (nothing is written): SPH_ERR_INVALID_ARG for a missing ref_logprob with a KL, a
 * missing seq_id with a seq-* aggregation or gspo, negative or non-finite coefficients or
 * ones that are not normal floats ("Policies", float conversions), clip_low outside [0, 1],
 * clip_ratio_c <= 1, num_tokens / num_seqs < 0, norm_length <= 0 with
 * seq-mean-token-sum-norm, any output overlapping an input or another output (the head's
 * tensors, the per-row inputs, metrics, the workspace: "Policies", aliasing), a context in
 * use by another thread, NaN / inf in advantages, old_logprob, ref_logprob or is_weight
 * on an active row (host memory: checked here; device memory, the non-finite policy: the pass
 * returns SPH_OK with a NaN loss and metrics and the rows are counted for sph_ctx_nonfinite),
 * upstream gradients given; SPH_ERR_MISMATCH when the ranks of a host TP group make different
 * calls (the head's and the loss's arguments are compared before any output is written); SPH_ERR_SHAPE / SPH_ERR_DTYPE /
 * SPH_ERR_DEVICE for per-row tensors not (N) f32 (seq_id i64) on the head's device; plus
 * every error of sph_head_forward. */
SPH_API sph_status sph_policy_loss(sph_ctx_t ctx, const sph_head_args *head,
                                   const sph_policy_args *policy, void *workspace,
                                   size_t workspace_bytes);

/* ---------------------------------------------------------------------------------------- */
/* Scaling gradients by a device scalar (the backward of a one-pass loss)                     */
/* ---------------------------------------------------------------------------------------- */
/*
 * A one-pass loss computes its gradients in the forward; its backward multiplies them by the
 * upstream gradient of the loss, a scalar that lives on the device and is almost always
 * exactly 1. sph_scale_inplace multiplies each of the n tensors (1 <= n <= SPH_SCALE_MAX) in
 * place by the float32 in `scale` (one element), in one pass on the context's stream and
 * without a host synchronization: the device reads the scalar, and where it is exactly 1 no
 * tensor element is read or written. Each product is computed in float32 and rounded once to
 * the tensor's dtype. Tensors: f32, bf16 or f16, 1-D or 2-D rows (spanhead.h's view rules), on
 * the context's device; no tensor may overlap another or the scalar. Empty tensors are
 * accepted. Errors (nothing is written): SPH_ERR_INVALID_ARG (n, NULL tensors, overlaps, a
 * context in use), SPH_ERR_SHAPE (scale not one element), SPH_ERR_DTYPE, SPH_ERR_DEVICE,
 * SPH_ERR_OVERFLOW, SPH_ERR_CUDA. Host contexts: NaN or inf in `scale` is applied as given
 * (the non-finite policy is the caller's, as in the torch backward it serves). */
#define SPH_SCALE_MAX 8
SPH_API sph_status sph_scale_inplace(sph_ctx_t ctx, const sph_tensor *scale,
                                     const sph_tensor *const *tensors, int n);

/* ---------------------------------------------------------------------------------------- */
/* Distillation losses fused into the head (docs/distill.md)                                 */
/* ---------------------------------------------------------------------------------------- */
/*
 * One call computes a distillation loss of the student's distribution Q against a teacher's P
 * and (with dhidden / dweight) its gradients to the student's hidden and weight, without
 * materializing logits (chunks of R active rows, whole V_loc staged in fp32). Per active row i
 * (the head's mask / spans):
 *   Q = softmax(z), z = the head's logits (softcap, then / temperature; spanhead.h "The LM
 *       head");
 *   dense teacher (teacher_hidden (N, H_T), teacher_weight (V_loc, H_T), the student's
 *       vocabulary shard): P = softmax(teacher_hidden . teacher_weight^T / T_T), T_T =
 *       teacher_temperature_rows[i], teacher_temperature or the row's student temperature;
 *       no softcap on the teacher;
 *   sparse teacher (teacher_topk_ids (N, K) global ids, -1 = padding; teacher_topk_logprobs
 *       (N, K) = log P on those ids): the bins are the K ids and one tail bin of the rest of
 *       the vocabulary, P_r = max(0, 1 - sum_k P_k), Q_r = sum of q over the tail columns.
 *       The tail bin is dropped (contributes 0, passes no gradient) when it holds no column
 *       (the valid ids cover the vocabulary) or, for the reverse KL, when P_r = 0 (its term
 *       would be +inf). 0 log 0 = 0 everywhere.
 *   kind forward_kl: KL(P||Q) = sum P (log P - log Q); reverse_kl: KL(Q||P);
 *   jsd: beta KL(P||M) + (1 - beta) KL(Q||M), M = beta P + (1 - beta) Q, beta in [0, 1]; as in
 *       Liger's generalized JSD, beta = 0 is the forward KL and beta = 1 the reverse KL
 *       (special cases: the formula itself is 0 there).
 *   loss: reduction mean (over the active rows, or num_tokens / the seq_comm group's active
 *       rows: below; 0 with none), sum, or none ((N), 0 on inactive rows). No T^2 factor
 *       (multiply by T^2 yourself if your recipe wants one).
 * Gradients flow to hidden and weight only (the teacher's tensors get none): the gradient of
 * the reduced loss, or with reduction none of sum_i dloss_i loss_i (dloss NULL = 1).
 * Cost: one sweep, 6 N_active H V flops (sparse teacher); the dense teacher adds its logits
 * product, 2 N_active H_T V, never a teacher gradient product. CUDA pays N_active with spans
 * (host metadata); a device active_mask without spans costs all N rows (6 N H V: the active
 * rows' count would need a host sync; as the head, docs/distill.md 4).
 */

typedef enum sph_distill_kind {
    SPH_DISTILL_FORWARD_KL = 0,
    SPH_DISTILL_REVERSE_KL = 1,
    SPH_DISTILL_JSD = 2
} sph_distill_kind;

typedef enum sph_reduction {
    SPH_REDUCTION_MEAN = 0, /* over the active rows */
    SPH_REDUCTION_SUM = 1,
    SPH_REDUCTION_NONE = 2  /* per row, (N) */
} sph_reduction;

/* The teacher's listed probabilities may exceed 1 by rounding up to this much: a log-prob
 * above it, or sum_k exp(log-prob) above 1 + it, is an error. */
#define SPH_DISTILL_MASS_TOL 1e-4

typedef struct sph_distill_args {
    size_t struct_size;           /* sizeof(sph_distill_args); set by SPH_DISTILL_ARGS_INIT */
    sph_distill_kind kind;        /* default SPH_DISTILL_FORWARD_KL */
    double beta;                  /* jsd: in [0, 1] (0.5); ignored by the KLs */
    double teacher_temperature;   /* dense teacher: T_T > 0; 0 = the student's temperature
                                     (or teacher_temperature_rows, below) */
    sph_reduction reduction;      /* default SPH_REDUCTION_MEAN */
    /* the teacher: dense (both) or sparse (both), on the head's device */
    const sph_tensor *teacher_hidden;        /* (N, H_T) f32|bf16|f16 */
    const sph_tensor *teacher_weight;        /* (V_loc, H_T), teacher_hidden's dtype */
    const sph_tensor *teacher_topk_ids;      /* (N, K) i32|i64, global ids or -1 */
    const sph_tensor *teacher_topk_logprobs; /* (N, K) f32, finite, <= 0 */
    const sph_tensor *dloss;      /* reduction none only: f32 (N) upstream gradient of each
                                     row's loss; NULL = 1 */
    /* output: f32 (1) for mean / sum, (N) for none, on the head's device */
    const sph_tensor *loss;
    /* reduction mean's divisor T (the policy loss's num_tokens / seq_comm): num_tokens >= 1
     * is T of a global batch; 0 = the active rows counted, of this call, or with seq_comm of
     * every rank of that group. The call's loss is then sum over its own active rows / T and
     * its gradients those of that share, so the micro-batches of a global batch (num_tokens)
     * or the context-parallel ranks of a split sequence batch (seq_comm) add up, losses and
     * gradients, to the one-call mean of all their rows. Ignored by sum / none (seq_comm
     * still compares the group's calls on host memory). */
    int64_t num_tokens;
    /* optional: the group of ranks holding the other rows (context parallelism: every rank
     * of one tensor-parallel shard position; ranks may hold different N). Host memory: an
     * MPI / none communicator, one small allgather of (reduction, num_tokens, rows counted)
     * per call, and ranks that disagree fail with SPH_ERR_MISMATCH; CUDA: an NCCL one, one
     * allgather of the 8-byte count on the stream (no host sync; the calls' agreement is the
     * caller's, as for a device tp_comm). NULL = the call's rows are the whole batch. Not
     * owned. */
    sph_comm_t seq_comm;
    /* optional, appended (read when struct_size covers it): the dense teacher's per-row
     * temperature, f32 (N) on the head's device: row i's T_T used for row i exactly as
     * teacher_temperature is (the teacher's logits * float(1 / T_T,i)); NULL =
     * teacher_temperature (or the student's). teacher_temperature must then be 0. Each value
     * follows the scalar's rule ("Float conversions"): host memory is checked at validation,
     * every row (SPH_ERR_INVALID_ARG naming teacher_temperature_rows[i], nothing written);
     * CUDA (device memory): a bad value of an active row makes the row NaN and is counted by
     * sph_ctx_nonfinite ("Policies"). A sparse teacher takes neither temperature (its
     * log-probs are used as given: SPH_ERR_INVALID_ARG). */
    const sph_tensor *teacher_temperature_rows;
} sph_distill_args;

#define SPH_DISTILL_ARGS_INIT                                                                 \
    {                                                                                         \
        .struct_size = sizeof(sph_distill_args), .kind = SPH_DISTILL_FORWARD_KL, .beta = 0.5, \
        .teacher_temperature = 0.0, .reduction = SPH_REDUCTION_MEAN, .num_tokens = 0,         \
        .seq_comm = NULL, .teacher_temperature_rows = NULL                                    \
    }

/* Workspace bytes of sph_distill_loss for these arguments (the same ones later passed). */
SPH_API sph_status sph_distill_loss_workspace_size(sph_ctx_t ctx, const sph_head_args *head,
                                                   const sph_distill_args *distill,
                                                   size_t *bytes);

/* The distillation loss above in one call. head: hidden, weight, active_mask / spans, vocab
 * shard, temperature or temperature_rows (row i's student temperature; the dense teacher's
 * too unless teacher_temperature or teacher_temperature_rows is given), softcap, dhidden / dweight with accumulate /
 * allreduce as in sph_head_forward (neither: the loss only); targets, candidates, the per-row
 * outputs, stats, sum_p2, top-k, upstream gradients are refused (SPH_ERR_INVALID_ARG). TP: every rank of tp_comm passes its vocabulary shard of
 * weight and teacher_weight (the same shard) and the same rows; every rank gets the same
 * loss; dweight is the rank's shard, dhidden its partial unless allreduce_dhidden. Errors
 * (nothing is written): SPH_ERR_INVALID_ARG for a kind, reduction or beta out of its domain,
 * no teacher or both kinds of teacher, a bad teacher_temperature or
 * teacher_temperature_rows value, both of them, either with a sparse teacher ("Policies", float
 * conversions), dloss without reduction none, ids outside [0, vocab_total) other than -1,
 * an id twice in a row, log-probs non-finite, above SPH_DISTILL_MASS_TOL or summing (as
 * probabilities) above 1 + SPH_DISTILL_MASS_TOL on an active row (host memory: checked here;
 * device memory: the caller's duty), non-finite dloss on an active row, any output
 * overlapping an input or another output; SPH_ERR_SHAPE for teacher rows != N, teacher_weight
 * rows != V_loc (the student's sharding), K = 0, loss not (1) / (N); SPH_ERR_DTYPE;
 * SPH_ERR_DEVICE; SPH_ERR_MISMATCH when the ranks of a host TP group make different calls
 * or those of a host seq_comm group differ in reduction or num_tokens; SPH_ERR_INVALID_ARG for
 * num_tokens < 0 or a seq_comm that does not take the context's buffers;
 * SPH_ERR_NONFINITE (host contexts) for NaN / inf in an active row of hidden or teacher_hidden
 * (nothing written) or non-finite statistics otherwise (NaN / inf in the weights: nothing
 * written; finite inputs whose logits overflow float: dhidden rows of earlier chunks may
 * already be written, the message says so); plus every error of sph_head_forward. CUDA:
 * enqueued on the context's stream, no host sync. */
SPH_API sph_status sph_distill_loss(sph_ctx_t ctx, const sph_head_args *head,
                                    const sph_distill_args *distill, void *workspace,
                                    size_t workspace_bytes);

/* ---------------------------------------------------------------------------------------- */
/* Communicator (tensor parallel statistics combine)                                          */
/* ---------------------------------------------------------------------------------------- */

typedef enum sph_comm_backend {
    SPH_COMM_NONE = 0,
    SPH_COMM_MPI = 1,
    SPH_COMM_NCCL = 2
} sph_comm_backend;

/* The configuration every rank of a group must agree on. */
typedef struct sph_comm_config {
    size_t struct_size;
    int64_t tp, cp, dp;       /* sizes; tp*cp*dp ranks in the world communicator */
    int64_t vocab_total;
    int64_t vocab_start;      /* this rank's shard */
    int64_t vocab_local;
    sph_dtype dtype;
    double temperature;
} sph_comm_config;

#define SPH_COMM_CONFIG_INIT                                                                  \
    {                                                                                         \
        .struct_size = sizeof(sph_comm_config), .tp = 1, .cp = 1, .dp = 1,                     \
        .dtype = {SPH_DTYPE_FLOAT, 32, 1}, .temperature = 1.0                                  \
    }

/* A single-process communicator (tp = 1). */
SPH_API sph_status sph_comm_create_none(sph_comm_t *comm);
/* From an existing MPI_Comm (passed as a pointer to it) spanning exactly the TP group.
 * Collective: every rank checks the others' config; a mismatch is SPH_ERR_MISMATCH on every
 * rank. Requires a build with MPI (SPH_ERR_UNSUPPORTED otherwise). */
SPH_API sph_status sph_comm_create_mpi(sph_comm_t *comm, const void *mpi_comm,
                                       const sph_comm_config *cfg);
/* Splits MPI_COMM_WORLD by rank = ((dp_rank * cp) + cp_rank) * tp + tp_rank and returns the
 * TP group of the calling rank; tp/cp/dp_rank are written when non-NULL. */
SPH_API sph_status sph_comm_create_mpi_world(sph_comm_t *comm, const sph_comm_config *cfg,
                                             int64_t *tp_rank, int64_t *cp_rank,
                                             int64_t *dp_rank);
/* From an existing ncclComm_t (passed as the pointer value) of the TP group; the stream of
 * the context is used for collectives. */
SPH_API sph_status sph_comm_create_nccl(sph_comm_t *comm, void *nccl_comm,
                                        const sph_comm_config *cfg);
/* Creates an NCCL communicator over an MPI_Comm (unique id broadcast over MPI). */
SPH_API sph_status sph_comm_create_nccl_mpi(sph_comm_t *comm, const void *mpi_comm,
                                            const sph_comm_config *cfg);
SPH_API void sph_comm_destroy(sph_comm_t comm); /* NULL-safe; never frees the caller's comm */
SPH_API sph_status sph_comm_info(sph_comm_t comm, sph_comm_backend *backend, int64_t *rank,
                                 int64_t *size);

/* ---------------------------------------------------------------------------------------- */
/* Autotuning (CUDA)                                                                          */
/* ---------------------------------------------------------------------------------------- */

typedef struct sph_tune_opts {
    size_t struct_size;
    sph_dtype dtype;
    int64_t H, V_loc, N;      /* the shape to tune for (N picks the bucket) */
    int repeats;              /* timed repetitions per candidate; 0 = default */
    int verbose;              /* print each candidate's time to stderr */
} sph_tune_opts;

#define SPH_TUNE_OPTS_INIT                                                                    \
    { .struct_size = sizeof(sph_tune_opts), .dtype = {SPH_DTYPE_BFLOAT, 16, 1} }

/* Times candidate configurations (rows per staged chunk, vocabulary split width) of the
 * forward + backward for the shape on ctx's GPU (random data, every row active, median of
 * `repeats` after a warm-up) and appends the winner to the context's tune cache file
 * (opts.tune_cache, else $SPH_TUNE_CACHE, else $XDG_CACHE_HOME/spanhead/tune.json or
 * ~/.cache/spanhead/tune.json; directories are created). File format: one JSON object per
 * line, {"gpu","dtype","H","V_loc","N_bucket","chunk_rows","split","ms"}, N_bucket = N
 * rounded up to a power of two; later lines win. Contexts read the file at creation and use
 * an entry matching (GPU name, dtype, H, V_loc, N bucket); without one they use defaults.
 * chunk_bytes stays a hard cap on the staged logits whatever the cache says.
 * Allocates its own device buffers (not a hot path); synchronous. *result (optional)
 * receives a thread-local description of the winner. Errors: SPH_ERR_UNSUPPORTED (not a
 * CUDA context or a build without CUDA), SPH_ERR_DTYPE, SPH_ERR_INVALID_ARG, SPH_ERR_ALLOC,
 * SPH_ERR_IO (the cache cannot be written). */
SPH_API sph_status sph_tune(sph_ctx_t ctx, const sph_tune_opts *opts, const char **result);

/* Dense matrix-product rate of ctx's GPU, the denominator of the active floor:
 * C (M, N) = A (M, K) . B (N, K)^T with A, B in dtype (bf16, f16, or f32 through exact FP32 or
 * TF32 per opts.allow_tf32), fp32 accumulation, C in dtype, through cuBLAS; median of
 * `repeats` (0 = 5) timed products after a warm-up, in TFLOP/s (2 M N K flops per product).
 * Allocates and frees its own buffers (a benchmark helper, synchronous). CUDA contexts only:
 * SPH_ERR_UNSUPPORTED otherwise; a build without CUDA answers every call with
 * SPH_ERR_UNSUPPORTED. */
SPH_API sph_status sph_tune_gemm_rate(sph_ctx_t ctx, sph_dtype dtype, int64_t M, int64_t N,
                                      int64_t K, int repeats, double *tflops);

/* Sustained dense matrix-product rate of ctx's GPU, the denominator of the sustained floor:
 * `chain` products of sph_tune_gemm_rate's kind (C (M, N) = A (M, K) . B (N, K)^T, same
 * dtypes and cuBLAS settings) issued back to back on ctx's stream with no synchronization
 * between them, the whole chain timed with events; median of `repeats` (0 = 5) chains after
 * one warm-up chain, in TFLOP/s (chain * 2 M N K flops per chain). Why: a power-limited GPU
 * runs one product of a few ms at boost clocks, but the head runs its products back to back
 * (4 of 2 N H V for forward + backward, 3 for the one-pass forward) and its clocks drop; a
 * chain as long as the head's sees the clocks the head sees. chain = 1 is sph_tune_gemm_rate.
 * Allocates and frees its own buffers (a benchmark helper, synchronous; like every call on
 * ctx, one thread at a time). Errors: SPH_ERR_INVALID_ARG (ctx or tflops NULL, chain outside
 * [1, 64], M, N or K outside [1, 2^31)), SPH_ERR_DTYPE, SPH_ERR_UNSUPPORTED (not a CUDA
 * context), SPH_ERR_ALLOC, SPH_ERR_CUDA; the arguments are checked before the context, so a
 * CPU context reports a bad chain as SPH_ERR_INVALID_ARG. A build without CUDA answers every
 * call with SPH_ERR_UNSUPPORTED. */
SPH_API sph_status sph_tune_gemm_rate_sustained(sph_ctx_t ctx, sph_dtype dtype, int64_t M,
                                                int64_t N, int64_t K, int chain, int repeats,
                                                double *tflops);

#ifdef __cplusplus
}
#endif
#endif /* SPANHEAD_H */
