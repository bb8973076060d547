/*
 * scale.c - sph_scale_inplace (spanhead.h): the tensors times a device scalar, for the
 * backward of a one-pass loss. Validation through the one validator (core/validate.h: views,
 * devices, dtypes, every region against every other), then the device's scale op; the host's
 * is here (sph_host_scale), CUDA's in src/cuda/scale.cu.
 */
#include <string.h>

#include "core/backend.h"
#include "core/ctx.h"
#include "core/validate.h"

static float load(const void *base, sph_dtype dt, int64_t k) {
    if (dt.bits == 32) return ((const float *)base)[k];
    const uint16_t v = ((const uint16_t *)base)[k];
    return dt.code == SPH_DTYPE_BFLOAT ? sph_bf16_to_f32(v) : sph_f16_to_f32(v);
}

static void store(void *base, sph_dtype dt, int64_t k, float x) {
    if (dt.bits == 32) ((float *)base)[k] = x;
    else if (dt.code == SPH_DTYPE_BFLOAT) ((uint16_t *)base)[k] = sph_f32_to_bf16(x);
    else ((uint16_t *)base)[k] = sph_f32_to_f16(x);
}

sph_status sph_host_scale(sph_ctx_t ctx, const float *scale, const sph_scale_job *jobs, int n) {
    (void)ctx;
    const float s = *scale;
    if (s == 1.0f) return SPH_OK; /* exactly 1: nothing read or written */
    for (int j = 0; j < n; j++)
        for (int64_t r = 0; r < jobs[j].rows; r++)
            for (int64_t c = 0; c < jobs[j].cols; c++) {
                const int64_t k = r * jobs[j].ld + c;
                store(jobs[j].data, jobs[j].dtype, k, load(jobs[j].data, jobs[j].dtype, k) * s);
            }
    return SPH_OK;
}

static sph_status scale_checked(sph_ctx_t ctx, const sph_tensor *scale,
                                const sph_tensor *const *tensors, int n) {
    SPH_CHECK(n >= 1 && n <= SPH_SCALE_MAX, SPH_ERR_INVALID_ARG,
              "n: %d, expected 1 .. %d tensors", n, SPH_SCALE_MAX);
    SPH_CHECK(tensors != NULL, SPH_ERR_INVALID_ARG, "tensors: NULL");
    SPH_CHECK(ctx->dev->scale != NULL, SPH_ERR_UNSUPPORTED,
              "scale_inplace: not implemented by the %s device", ctx->dev->name);
    sph_validator val;
    sph_val_init(&val, ctx);
    sph_view sv;
    SPH_CHECK(scale != NULL, SPH_ERR_INVALID_ARG, "scale: NULL");
    SPH_TRY(sph_val_tensor(&val, scale, "scale", scale->ndim, SPH_VAL_IN, SPH_DT_F32, &sv));
    int64_t count = 1;
    for (int32_t d = 0; d < sv.ndim; d++) count *= sv.shape[d];
    SPH_CHECK(count == 1, SPH_ERR_SHAPE, "scale: %lld elements, expected 1 (a scalar)",
              (long long)count);
    sph_scale_job jobs[SPH_SCALE_MAX];
    static const char *const names[SPH_SCALE_MAX] = {
        "tensors[0]", "tensors[1]", "tensors[2]", "tensors[3]",
        "tensors[4]", "tensors[5]", "tensors[6]", "tensors[7]"};
    for (int j = 0; j < n; j++) {
        const sph_tensor *t = tensors[j];
        SPH_CHECK(t != NULL, SPH_ERR_INVALID_ARG, "%s: NULL", names[j]);
        SPH_CHECK(t->ndim == 1 || t->ndim == 2, SPH_ERR_SHAPE,
                  "%s: ndim is %d, expected 1 or 2", names[j], (int)t->ndim);
        sph_view v;
        SPH_TRY(sph_val_tensor(&val, t, names[j], t->ndim, SPH_VAL_OUT, SPH_DT_FLOAT_IN, &v));
        jobs[j].data = v.data;
        jobs[j].dtype = v.dtype;
        jobs[j].rows = v.ndim == 2 ? v.shape[0] : 1;
        jobs[j].cols = v.ndim == 2 ? v.shape[1] : v.shape[0];
        jobs[j].ld = v.ndim == 2 ? v.stride[0] : v.shape[0];
        if (jobs[j].rows == 0 || jobs[j].cols == 0) jobs[j].rows = jobs[j].cols = 0;
    }
    SPH_TRY(sph_val_finish(&val));
    return ctx->dev->scale(ctx, (const float *)sv.data, jobs, n);
}

sph_status sph_scale_inplace(sph_ctx_t ctx, const sph_tensor *scale,
                             const sph_tensor *const *tensors, int n) {
    SPH_TRY(sph_ctx_enter(ctx, "scale_inplace"));
    return sph_ctx_leave(ctx, scale_checked(ctx, scale, tensors, n));
}
