/*
 * validate.c - the one validator of every entry point (core/validate.h): tensors and their
 * byte regions, devices, dtypes, communicators and float ranges.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/ctx.h"
#include "core/validate.h"

void sph_val_init(sph_validator *v, sph_ctx_t ctx) {
    v->ctx = ctx;
    v->n = 0;
}

static const struct {
    unsigned bit;
    sph_dtype d;
} g_dtypes[] = {
    {SPH_DT_F32, {SPH_DTYPE_FLOAT, 32, 1}}, {SPH_DT_BF16, {SPH_DTYPE_BFLOAT, 16, 1}},
    {SPH_DT_F16, {SPH_DTYPE_FLOAT, 16, 1}}, {SPH_DT_I32, {SPH_DTYPE_INT, 32, 1}},
    {SPH_DT_I64, {SPH_DTYPE_INT, 64, 1}},   {SPH_DT_U8, {SPH_DTYPE_UINT, 8, 1}},
    {SPH_DT_BOOL, {SPH_DTYPE_BOOL, 8, 1}},
};
#define N_DTYPES (sizeof g_dtypes / sizeof g_dtypes[0])

unsigned sph_dtype_bit(sph_dtype d) {
    for (size_t k = 0; k < N_DTYPES; k++)
        if (sph_dtype_eq(d, g_dtypes[k].d)) return g_dtypes[k].bit;
    return 0;
}

const char *sph_dtype_set_str(unsigned set, char *buf, size_t n) {
    size_t count = 0, seen = 0, len = 0;
    for (size_t k = 0; k < N_DTYPES; k++) count += (set & g_dtypes[k].bit) != 0;
    buf[0] = 0;
    for (size_t k = 0; k < N_DTYPES && len < n; k++) {
        if (!(set & g_dtypes[k].bit)) continue;
        const char *sep = seen == 0 ? "" : (seen + 1 == count ? " or " : ", ");
        int w = snprintf(buf + len, n - len, "%s%s", sep, sph_dtype_name(g_dtypes[k].d));
        if (w < 0) break;
        len += (size_t)w;
        seen++;
    }
    return buf;
}

sph_status sph_val_dtype(const char *name, sph_dtype d, unsigned set, const char *why) {
    if (sph_dtype_bit(d) & set) return SPH_OK;
    char b[96];
    return sph_err(SPH_ERR_DTYPE, "%s: dtype is %s, expected %s%s%s%s", name, sph_dtype_name(d),
                   sph_dtype_set_str(set, b, sizeof b), why ? " (" : "", why ? why : "",
                   why ? ")" : "");
}

sph_status sph_val_device(sph_ctx_t ctx, const sph_view *v, const char *name) {
    if (ctx->device.type == SPH_DEVICE_CUDA) {
        SPH_CHECK(v->device.type == SPH_DEVICE_CUDA && v->device.id == ctx->device.id,
                  SPH_ERR_DEVICE,
                  "%s: device is (type %d, id %d), expected cuda:%d (the context's)", name,
                  (int)v->device.type, (int)v->device.id, (int)ctx->device.id);
    } else {
        SPH_CHECK(sph_device_is_host(v->device), SPH_ERR_DEVICE,
                  "%s: device is (type %d, id %d), expected host memory (cpu context)", name,
                  (int)v->device.type, (int)v->device.id);
    }
    return SPH_OK;
}

sph_status sph_val_comm(sph_ctx_t ctx, const char *name, int has_ops, int64_t rank, int64_t size,
                        int device_buffers) {
    SPH_CHECK(has_ops && size >= 1 && rank >= 0 && rank < size, SPH_ERR_INVALID_ARG,
              "%s: not an initialised communicator (rank %lld of %lld)", name, (long long)rank,
              (long long)size);
    const int host = ctx->dev->host_memory;
    if (size > 1)
        SPH_CHECK((device_buffers != 0) == !host, SPH_ERR_DEVICE,
                  "%s: collectives take %s buffers, the context computes on the %s", name,
                  device_buffers ? "device" : "host", host ? "host" : "device");
    return SPH_OK;
}

/* host memory (CPU or pinned) is one address space; each GPU is its own */
static int space_of(sph_device d) {
    return sph_device_is_host(d) ? 0 : 1 + (int)(d.id >= 0 ? d.id : 0);
}

static void add(sph_validator *v, uintptr_t lo, size_t bytes, sph_device dev, const char *name,
                int access) {
    if (!bytes) return;
    /* more regions than any entry point registers is a bug of that entry point: the
     * assertion in sph_val_finish reports it rather than skipping a check */
    if (v->n < SPH_VAL_MAX_REGIONS) {
        sph_region *r = &v->r[v->n];
        r->lo = lo, r->bytes = bytes, r->space = space_of(dev), r->out = access == SPH_VAL_OUT;
        r->name = name;
    }
    v->n++;
}

sph_status sph_val_tensor(sph_validator *v, const sph_tensor *t, const char *name, int32_t ndim,
                          int access, unsigned dtypes, sph_view *out) {
    sph_view w;
    SPH_TRY(sph_view_of(t, name, ndim, &w)); /* extents overflow-checked before data + offset */
    SPH_TRY(sph_val_device(v->ctx, &w, name));
    if (dtypes) SPH_TRY(sph_val_dtype(name, w.dtype, dtypes, NULL));
    add(v, (uintptr_t)w.data, w.bytes, w.device, name, access);
    *out = w;
    return SPH_OK;
}

sph_status sph_val_rows(sph_validator *v, const sph_tensor *t, const char *name, int64_t N,
                        int access, unsigned dtypes, sph_view *out) {
    SPH_TRY(sph_val_tensor(v, t, name, 1, access, dtypes, out));
    return sph_view_expect_dim(out, name, 0, N, "N, rows of hidden");
}

sph_status sph_val_region(sph_validator *v, const void *p, size_t count, size_t elem,
                          sph_device dev, const char *name, int access) {
    if (!p || !count) return SPH_OK;
    size_t bytes;
    SPH_CHECK(sph_mul_size(count, elem, &bytes), SPH_ERR_OVERFLOW,
              "%s: %zu elements of %zu bytes overflow size_t", name, count, elem);
    SPH_CHECK(bytes <= UINTPTR_MAX - (uintptr_t)p, SPH_ERR_OVERFLOW,
              "%s: %zu bytes from %p overflow the address space", name, bytes, p);
    add(v, (uintptr_t)p, bytes, dev, name, access);
    return SPH_OK;
}

sph_status sph_val_finish(const sph_validator *v) {
    SPH_CHECK(v->n <= SPH_VAL_MAX_REGIONS, SPH_ERR_INTERNAL,
              "validator: %d regions registered, room for %d (raise SPH_VAL_MAX_REGIONS)", v->n,
              SPH_VAL_MAX_REGIONS);
    for (int i = 0; i < v->n; i++) {
        const sph_region *a = &v->r[i];
        if (!a->out) continue;
        for (int j = 0; j < v->n; j++) {
            const sph_region *b = &v->r[j];
            /* each pair once: an output against every input, and outputs among themselves */
            if (i == j || (b->out && j < i) || a->space != b->space) continue;
            SPH_CHECK(!(a->lo < b->lo + b->bytes && b->lo < a->lo + a->bytes), SPH_ERR_INVALID_ARG,
                      "%s: bytes [%p, %p) overlap %s's [%p, %p): an output must not alias an "
                      "input or another output",
                      a->name, (void *)a->lo, (void *)(a->lo + a->bytes), b->name, (void *)b->lo,
                      (void *)(b->lo + b->bytes));
        }
    }
    return SPH_OK;
}

/* the float's class of x, and of 1 / x when asked */
static int normal_float(double x) {
    const float f = (float)x;
    return isfinite(x) && isnormal(f);
}

sph_status sph_val_float(const char *name, double x, unsigned flags, double lo, double hi) {
    if ((flags & SPH_FR_ZERO_OK) && x == 0 && lo <= 0 && 0 <= hi) return SPH_OK;
    if ((flags & SPH_FR_INF_OK) && x == HUGE_VAL && hi == HUGE_VAL) return SPH_OK;
    const int inv = (flags & SPH_FR_INVERSE) != 0;
    const int ok = !isnan(x) && x >= lo && x <= hi && normal_float(x) &&
                   (!inv || normal_float(1.0 / x));
    if (ok) return SPH_OK;
    char range[160];
    if (lo == -HUGE_VAL && hi == HUGE_VAL) snprintf(range, sizeof range, "a number");
    else if (hi == HUGE_VAL) snprintf(range, sizeof range, "a number >= %g", lo);
    else if (lo == -HUGE_VAL) snprintf(range, sizeof range, "a number <= %g", hi);
    else snprintf(range, sizeof range, "a number in [%g, %g]", lo, hi);
    return sph_err(SPH_ERR_INVALID_ARG,
                   "%s: %g, expected %s%s%s whose float%s %s a normal float (%.3g <= |%s| <= "
                   "%.3g): the kernels compute in float",
                   name, x, range, (flags & SPH_FR_ZERO_OK) ? " (or 0 = off)" : "",
                   (flags & SPH_FR_INF_OK) ? " (or inf = none)" : "",
                   inv ? " and its inverse's" : "", inv ? "are" : "is",
                   inv ? 1.0 / FLT_MAX : (double)FLT_MIN, name,
                   inv ? 1.0 / FLT_MIN : (double)FLT_MAX);
}

sph_status sph_check_float_scalar(const char *name, double x, int zero_ok, int inverse) {
    if (zero_ok && x == 0) return SPH_OK;
    /* the largest and smallest doubles whose float (and inverse's float) is a normal float */
    const double hi = inverse ? 1.0 / FLT_MIN : FLT_MAX, lo = inverse ? 1.0 / FLT_MAX : FLT_MIN;
    const float xf = (float)x, inv = inverse ? (float)(1.0 / x) : 1.0f;
    SPH_CHECK(isfinite(x) && x > 0 && isnormal(xf) && isnormal(inv), SPH_ERR_INVALID_ARG,
              "%s: %g, expected finite and > 0%s, with %s a normal float (about %.3g <= %s <= "
              "%.3g): the kernels compute in float",
              name, x, zero_ok ? " (or 0 = off)" : "", inverse ? "it and its inverse" : "it", lo,
              name, hi);
    return SPH_OK;
}

sph_status sph_check_temperature_rows(const char *name, const float *rows, int64_t n) {
    for (int64_t i = 0; rows && i < n; i++) {
        char row[80];
        snprintf(row, sizeof row, "%s[%lld]", name, (long long)i);
        SPH_TRY(sph_check_float_scalar(row, rows[i], 0, 1));
    }
    return SPH_OK;
}
