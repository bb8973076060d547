/*
 * internal.h - what every spanhead source shares: error recording, logging, checked integer
 * arithmetic, dtype helpers and tensor validation. Hidden symbols, never in the public header.
 */
#ifndef SPH_CORE_INTERNAL_H
#define SPH_CORE_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "spanhead.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SPH_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define SPH_PRINTF(a, b)
#endif

/* Records this thread's message and returns s, so `return sph_err(SPH_ERR_SHAPE, ...)`. */
sph_status sph_err(sph_status s, const char *fmt, ...) SPH_PRINTF(2, 3);
/* Prefixes the current message with context ("rank 3: ") keeping the status. */
sph_status sph_err_prefix(sph_status s, const char *fmt, ...) SPH_PRINTF(2, 3);
void sph_clear_error(void);

/* level: 0 error, 1 warn, 2 info, 3 debug */
void sph_log(int level, const char *fmt, ...) SPH_PRINTF(2, 3);

#define SPH_CHECK(cond, status, ...)                                                          \
    do {                                                                                      \
        if (!(cond)) return sph_err((status), __VA_ARGS__);                                   \
    } while (0)

#define SPH_TRY(expr)                                                                         \
    do {                                                                                      \
        sph_status sph_try_s_ = (expr);                                                       \
        if (sph_try_s_ != SPH_OK) return sph_try_s_;                                          \
    } while (0)

/* The library's heap (alloc.c). Every host allocation of src/ outside src/cli goes through
 * these, so the torture tests (tests/torture) can fail the k-th one: sph_alloc_fail_at(k)
 * makes the k-th allocation from now return NULL (k = 0: never), sph_alloc_count() counts
 * allocations since the last arming. Disarmed, they are malloc & co. */
void *sph_malloc(size_t bytes);
void *sph_calloc(size_t n, size_t size);
void *sph_realloc(void *p, size_t bytes);
void sph_free(void *p);
void sph_alloc_fail_at(int64_t k);
int64_t sph_alloc_count(void);

/* Checked int64 arithmetic: return false on overflow. */
/* FNV-1a over n bytes, continuing from h (start with SPH_FNV1A_INIT): the hashes of the
 * tensor-parallel consistency records (head_tp.c, policy.c). */
#define SPH_FNV1A_INIT UINT64_C(0xcbf29ce484222325)
static inline uint64_t sph_fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *b = (const unsigned char *)data;
    for (size_t k = 0; k < n; k++) h = (h ^ b[k]) * UINT64_C(0x100000001b3);
    return h;
}
/* The bits of a double as an int64 word (compared exactly: 0.1 + 0.2 is not 0.3). */
static inline int64_t sph_f64_bits(double x) {
    int64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static inline bool sph_add_i64(int64_t a, int64_t b, int64_t *r) {
    return !__builtin_add_overflow(a, b, r);
}
static inline bool sph_mul_i64(int64_t a, int64_t b, int64_t *r) {
    return !__builtin_mul_overflow(a, b, r);
}
static inline bool sph_mul_size(size_t a, size_t b, size_t *r) {
    return !__builtin_mul_overflow(a, b, r);
}
static inline int64_t sph_gcd(int64_t a, int64_t b) {
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* dtypes */
static inline bool sph_dtype_eq(sph_dtype a, sph_dtype b) {
    return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}
static inline size_t sph_dtype_size(sph_dtype d) { return (size_t)d.bits / 8 * d.lanes; }
/* "f32", "bf16", "f16", "i32", "i64", "u8", "bool", "f64" or "dtype(code,bits,lanes)". Uses a
 * thread-local buffer for unknown dtypes. */
const char *sph_dtype_name(sph_dtype d);
bool sph_dtype_is_float_input(sph_dtype d); /* f32, bf16, f16 */

/* bf16 / fp16 <-> fp32 scalar conversion (round to nearest even). */
static inline float sph_bf16_to_f32(uint16_t v) {
    union { uint32_t u; float f; } x;
    x.u = (uint32_t)v << 16;
    return x.f;
}
static inline uint16_t sph_f32_to_bf16(float f) {
    union { uint32_t u; float f; } x;
    x.f = f;
    if ((x.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x.u >> 16) | 0x40); /* NaN */
    uint32_t rounding = 0x7fffu + ((x.u >> 16) & 1u);
    return (uint16_t)((x.u + rounding) >> 16);
}
float sph_f16_to_f32(uint16_t h);
uint16_t sph_f32_to_f16(float f);

/* Tensor views. Validation fills a plain description; kernels never see sph_tensor. */
typedef struct sph_view {
    void *data;          /* data + byte_offset */
    sph_dtype dtype;
    sph_device device;
    int32_t ndim;
    int64_t shape[4];
    int64_t stride[4];   /* elements, always filled */
    size_t bytes;        /* bytes from data to the end of the last element (0: no element); the
                            region the aliasing checks compare */
} sph_view;

/* Checks t (named `name` in messages): non-NULL data unless it has zero elements, ndim equal
 * to ndim, non-negative shape, strides describing rows (inner stride 1, row stride >= the
 * row length, no overlap), the extent (last element's offset, and in bytes) within int64
 * (SPH_ERR_OVERFLOW otherwise), data aligned to its element. Fills v. */
sph_status sph_view_of(const sph_tensor *t, const char *name, int32_t ndim, sph_view *v);
/* Shape check helpers producing messages like "hidden: shape[1] is 7, expected 8 (H)". */
sph_status sph_view_expect_dim(const sph_view *v, const char *name, int dim, int64_t want,
                               const char *what);
bool sph_device_is_host(sph_device d);
/* 1 when the byte regions of a and b (non-empty) overlap. */
static inline bool sph_view_overlap(const sph_view *a, const sph_view *b) {
    if (!a->bytes || !b->bytes) return false;
    const uintptr_t a0 = (uintptr_t)a->data, b0 = (uintptr_t)b->data;
    return a0 < b0 + b->bytes && b0 < a0 + a->bytes;
}

#ifdef __cplusplus
}
#endif
#endif
