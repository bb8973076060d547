/*
 * tensor.c - dtype names, half-precision conversion and tensor-view validation: the one place
 * that turns a caller's DLPack-style sph_tensor into the plain pointer + sizes + strides the
 * kernels use, with a message naming the argument whenever something is off.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"

const char *sph_dtype_name(sph_dtype d) {
    static _Thread_local char buf[48];
    if (d.lanes == 1) {
        if (d.code == SPH_DTYPE_FLOAT && d.bits == 32) return "f32";
        if (d.code == SPH_DTYPE_FLOAT && d.bits == 16) return "f16";
        if (d.code == SPH_DTYPE_FLOAT && d.bits == 64) return "f64";
        if (d.code == SPH_DTYPE_BFLOAT && d.bits == 16) return "bf16";
        if (d.code == SPH_DTYPE_INT && d.bits == 32) return "i32";
        if (d.code == SPH_DTYPE_INT && d.bits == 64) return "i64";
        if (d.code == SPH_DTYPE_UINT && d.bits == 8) return "u8";
        if (d.code == SPH_DTYPE_BOOL && d.bits == 8) return "bool";
    }
    snprintf(buf, sizeof buf, "dtype(code=%u,bits=%u,lanes=%u)", d.code, d.bits, d.lanes);
    return buf;
}

bool sph_dtype_is_float_input(sph_dtype d) {
    return sph_dtype_eq(d, SPH_F32) || sph_dtype_eq(d, SPH_BF16) || sph_dtype_eq(d, SPH_F16);
}

float sph_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            u = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | man << 13;
    } else {
        u = sign | (exp + 127 - 15) << 23 | man << 13;
    }
    union { uint32_t u; float f; } x = {u};
    return x.f;
}

uint16_t sph_f32_to_f16(float f) {
    union { float f; uint32_t u; } x = {f};
    uint32_t sign = (x.u >> 16) & 0x8000, a = x.u & 0x7fffffff;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00); /* NaN */
    if (a >= 0x477ff000u) {                                 /* rounds to >= 65520: inf */
        return (uint16_t)(sign | 0x7c00);
    }
    if (a < 0x38800000u) { /* subnormal half (or zero) */
        float v = fabsf(f) * 16777216.0f; /* 2^24: half subnormal unit is 2^-24 */
        uint32_t m = (uint32_t)lrintf(v);
        return (uint16_t)(sign | m);
    }
    uint32_t e = (a >> 23) - 127 + 15, m = a & 0x7fffff;
    uint32_t h = e << 10 | m >> 13, rest = m & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

bool sph_device_is_host(sph_device d) {
    return d.type == SPH_DEVICE_CPU || d.type == SPH_DEVICE_CUDA_HOST;
}

sph_status sph_view_of(const sph_tensor *t, const char *name, int32_t ndim, sph_view *v) {
    SPH_CHECK(t != NULL, SPH_ERR_INVALID_ARG, "%s: tensor pointer is NULL", name);
    SPH_CHECK(t->ndim == ndim, SPH_ERR_SHAPE, "%s: ndim is %d, expected %d", name, (int)t->ndim,
              (int)ndim);
    SPH_CHECK(ndim >= 1 && ndim <= 4, SPH_ERR_SHAPE, "%s: ndim %d not supported", name, ndim);
    SPH_CHECK(t->shape != NULL, SPH_ERR_INVALID_ARG, "%s: shape pointer is NULL", name);
    SPH_CHECK(t->dtype.lanes == 1, SPH_ERR_DTYPE, "%s: dtype %s has %u lanes, expected 1", name,
              sph_dtype_name(t->dtype), t->dtype.lanes);
    SPH_CHECK(t->dtype.bits % 8 == 0 && t->dtype.bits > 0, SPH_ERR_DTYPE,
              "%s: dtype with %u bits is not byte-sized", name, t->dtype.bits);
    memset(v, 0, sizeof *v);
    v->dtype = t->dtype;
    v->device = t->device;
    v->ndim = ndim;
    int64_t elems = 1;
    for (int d = 0; d < ndim; d++) {
        SPH_CHECK(t->shape[d] >= 0, SPH_ERR_SHAPE, "%s: shape[%d] is %lld, expected >= 0", name,
                  d, (long long)t->shape[d]);
        v->shape[d] = t->shape[d];
        SPH_CHECK(sph_mul_i64(elems, t->shape[d], &elems), SPH_ERR_OVERFLOW,
                  "%s: element count overflows int64", name);
    }
    /* strides: compact row-major when NULL; otherwise the inner stride must be 1 and every
     * outer stride must step over a whole inner block (rows may be padded, never overlap). */
    /* An empty tensor has no element to address: producers (NumPy among them) report any
     * strides for it, often zeros, so its strides are taken as compact whatever they say. */
    int64_t compact = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        if (t->strides == NULL || elems == 0) {
            v->stride[d] = compact;
        } else {
            int64_t s = t->strides[d];
            if (d == ndim - 1) {
                SPH_CHECK(s == 1 || t->shape[d] <= 1, SPH_ERR_SHAPE,
                          "%s: inner stride is %lld, expected 1 (contiguous rows)", name,
                          (long long)s);
                s = 1;
            } else {
                SPH_CHECK(s >= compact || t->shape[d] <= 1, SPH_ERR_SHAPE,
                          "%s: stride[%d] is %lld, expected >= %lld (rows must not overlap)",
                          name, d, (long long)s, (long long)compact);
                if (t->shape[d] <= 1) s = compact;
            }
            v->stride[d] = s;
        }
        int64_t span;
        SPH_CHECK(sph_mul_i64(v->stride[d], t->shape[d], &span), SPH_ERR_OVERFLOW,
                  "%s: stride[%d] %lld x shape[%d] %lld overflows int64", name, d,
                  (long long)v->stride[d], d, (long long)t->shape[d]);
        compact = span > compact ? span : compact;
    }
    /* The extent: offset of the last element + 1, in elements and in bytes, within int64
     * (kernels index with int64; the aliasing checks compare these byte regions). */
    const size_t es = t->dtype.bits / 8;
    int64_t last = 0, extent_bytes = 0;
    if (elems > 0) {
        for (int d = 0; d < ndim; d++) {
            int64_t o;
            SPH_CHECK(sph_mul_i64(t->shape[d] - 1, v->stride[d], &o) && sph_add_i64(last, o, &last),
                      SPH_ERR_OVERFLOW, "%s: the offset of the last element overflows int64 "
                      "(stride[%d] %lld, shape[%d] %lld)", name, d, (long long)v->stride[d], d,
                      (long long)t->shape[d]);
        }
        SPH_CHECK(sph_add_i64(last, 1, &last) && sph_mul_i64(last, (int64_t)es, &extent_bytes),
                  SPH_ERR_OVERFLOW, "%s: %lld elements of %zu bytes overflow int64", name,
                  (long long)last, es);
    }
    v->bytes = (size_t)extent_bytes;
    SPH_CHECK(elems == 0 || t->data != NULL, SPH_ERR_INVALID_ARG, "%s: data pointer is NULL",
              name);
    SPH_CHECK(!t->data || t->byte_offset <= UINTPTR_MAX - (uintptr_t)t->data, SPH_ERR_OVERFLOW,
              "%s: byte_offset %llu overflows the address space", name,
              (unsigned long long)t->byte_offset);
    v->data = t->data ? (char *)t->data + t->byte_offset : NULL;
    SPH_CHECK(!v->data || v->bytes <= UINTPTR_MAX - (uintptr_t)v->data, SPH_ERR_OVERFLOW,
              "%s: %zu bytes from %p overflow the address space", name, v->bytes, v->data);
    /* every kernel reads whole elements (vector loads, TMA, cuBLAS) */
    SPH_CHECK(v->data == NULL || (uintptr_t)v->data % es == 0, SPH_ERR_INVALID_ARG,
              "%s: pointer %p is misaligned, expected a multiple of %zu bytes (%s elements)",
              name, v->data, es, sph_dtype_name(t->dtype));
    return SPH_OK;
}

sph_status sph_view_expect_dim(const sph_view *v, const char *name, int dim, int64_t want,
                               const char *what) {
    SPH_CHECK(v->shape[dim] == want, SPH_ERR_SHAPE, "%s: shape[%d] is %lld, expected %lld (%s)",
              name, dim, (long long)v->shape[dim], (long long)want, what);
    return SPH_OK;
}
