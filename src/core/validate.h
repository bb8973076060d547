/*
 * validate.h - the one validator of every entry point (the head, the policy loss, and the next
 * loss): tensors, the byte regions a call reads or writes (the caller's workspace included),
 * devices, dtypes, communicators and float ranges, each rule written once here.
 *
 * Use: one sph_validator per call, one call per tensor, one check at the end.
 *
 *     sph_validator val;
 *     sph_val_init(&val, ctx);
 *     sph_view hv;
 *     SPH_TRY(sph_val_tensor(&val, args->hidden, "hidden", 2, SPH_VAL_IN, SPH_DT_FLOAT_IN, &hv));
 *     SPH_TRY(sph_val_rows(&val, args->logprob, "logprob", N, SPH_VAL_OUT, SPH_DT_F32, &lv));
 *     ...
 *     SPH_TRY(sph_val_region(&val, workspace, need, ctx->device, "workspace", SPH_VAL_OUT));
 *     SPH_TRY(sph_val_finish(&val));   // every output against every other region
 *
 * sph_val_tensor checks the tensor itself (sph_view_of: shape, strides, extent and pointer
 * arithmetic with overflow checks before a pointer is formed, alignment), its device against
 * the context's, its dtype against a set, and registers its byte region. Regions are compared
 * pairwise by sph_val_finish, on the same address space only (host memory is one; each GPU
 * is one): an output may overlap no input and no other output (spanhead.h, "Policies").
 * Inputs may share memory. Messages name the argument and the value.
 */
#ifndef SPH_CORE_VALIDATE_H
#define SPH_CORE_VALIDATE_H

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a call uses a region. */
enum { SPH_VAL_IN = 0, SPH_VAL_OUT = 1 };

/* dtype sets (a bit per dtype) */
#define SPH_DT_F32 (1u << 0)
#define SPH_DT_BF16 (1u << 1)
#define SPH_DT_F16 (1u << 2)
#define SPH_DT_I32 (1u << 3)
#define SPH_DT_I64 (1u << 4)
#define SPH_DT_U8 (1u << 5)
#define SPH_DT_BOOL (1u << 6)
#define SPH_DT_FLOAT_IN (SPH_DT_F32 | SPH_DT_BF16 | SPH_DT_F16)
#define SPH_DT_IDS (SPH_DT_I32 | SPH_DT_I64)
#define SPH_DT_MASK (SPH_DT_U8 | SPH_DT_BOOL)

/* Registered regions of one call: the head's 20 tensors, the policy's 6, spans and the
 * workspace fit with room for the next loss's. */
#define SPH_VAL_MAX_REGIONS 48

typedef struct sph_region {
    uintptr_t lo;     /* first byte */
    size_t bytes;     /* > 0 */
    int space;        /* address space: 0 host, 1 + id for a GPU */
    int out;          /* SPH_VAL_OUT: written by the call */
    const char *name; /* static or the caller's, outlives the check */
} sph_region;

typedef struct sph_validator {
    sph_ctx_t ctx;
    int n;
    sph_region r[SPH_VAL_MAX_REGIONS];
} sph_validator;

void sph_val_init(sph_validator *v, sph_ctx_t ctx);

/* The bit of d in the SPH_DT_* sets (0: none of them). */
unsigned sph_dtype_bit(sph_dtype d);
/* "f32, bf16 or f16" for a set, into buf. */
const char *sph_dtype_set_str(unsigned set, char *buf, size_t n);

/* d in set, else SPH_ERR_DTYPE "name: dtype is X, expected <set>" (+ " (why)" when given). */
sph_status sph_val_dtype(const char *name, sph_dtype d, unsigned set, const char *why);
/* The view lives where the context computes: host memory (CPU or pinned) for a host context,
 * the context's GPU for a CUDA context. SPH_ERR_DEVICE otherwise. */
sph_status sph_val_device(sph_ctx_t ctx, const sph_view *v, const char *name);
/* A communicator the context can use, from its fields (core does not know struct sph_comm:
 * comm/comm.h's sph_comm_validate passes them): initialised (has_ops), rank in [0, size),
 * and (size > 1) taking buffers where the context computes (device_buffers: 1 = GPU).
 * SPH_ERR_INVALID_ARG / SPH_ERR_DEVICE naming `name`. */
sph_status sph_val_comm(sph_ctx_t ctx, const char *name, int has_ops, int64_t rank, int64_t size,
                        int device_buffers);

/* One tensor: sph_view_of(t, name, ndim), the device rule, the dtype set (0 = any), and its
 * region registered with `access`. Fills *out. */
sph_status sph_val_tensor(sph_validator *v, const sph_tensor *t, const char *name, int32_t ndim,
                          int access, unsigned dtypes, sph_view *out);
/* A per-row vector: sph_val_tensor with ndim 1 and shape (N) ("N, rows of hidden"). */
sph_status sph_val_rows(sph_validator *v, const sph_tensor *t, const char *name, int64_t N,
                        int access, unsigned dtypes, sph_view *out);
/* A raw region: `count` elements of `elem` bytes from p on `dev` (host metadata, the
 * workspace); the byte count and the end address are overflow-checked (SPH_ERR_OVERFLOW).
 * count 0 or p NULL registers nothing. */
sph_status sph_val_region(sph_validator *v, const void *p, size_t count, size_t elem,
                          sph_device dev, const char *name, int access);
/* Every output region against every other region of the same address space. */
sph_status sph_val_finish(const sph_validator *v);

/* Float ranges of user doubles (spanhead.h, "Policies", "Float conversions"): the kernels
 * compute in float, so a value must be a number whose float is normal (FLT_MIN <= |x| <=
 * FLT_MAX) or exactly 0 where that means "off".
 *   SPH_FR_ZERO_OK   0 is accepted
 *   SPH_FR_INVERSE   its inverse must be a normal float too (the kernels multiply by 1 / x)
 *   SPH_FR_INF_OK    +infinity is accepted ("none")
 * and x in [lo, hi] (lo < 0 ... any sign; pass -HUGE_VAL / HUGE_VAL for no bound).
 * SPH_ERR_INVALID_ARG naming `name`, the value and the accepted range otherwise. */
#define SPH_FR_ZERO_OK 1u
#define SPH_FR_INVERSE 2u
#define SPH_FR_INF_OK 4u
sph_status sph_val_float(const char *name, double x, unsigned flags, double lo, double hi);
/* The head's form of the rule (temperature, softcap), its messages kept: x must be finite,
 * > 0 (or exactly 0 when zero_ok: "off") and, with its inverse when inverse is set, round to
 * a normal float (FLT_MIN <= |float(x)| <= FLT_MAX): kernels compute in float and multiply by
 * the inverse. SPH_ERR_INVALID_ARG naming `name`, the value and the accepted range otherwise. */
sph_status sph_check_float_scalar(const char *name, double x, int zero_ok, int inverse);
/* A host vector of per-row temperatures (`n` rows, every row, active or not: the rule does not
 * depend on the mask), each checked as sph_check_float_scalar(x, 0, 1); the message names
 * "name[i]" and the value of the first bad row. */
sph_status sph_check_temperature_rows(const char *name, const float *rows, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
