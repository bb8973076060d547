/*
 * head_math.cuh - device helpers shared by the head kernels: dtype conversion, the logit
 * transform (softcap, temperature) and the online softmax-statistics updates of plan.h's
 * partial record (m, s, b).
 */
#ifndef SPH_CUDA_HEAD_MATH_CUH
#define SPH_CUDA_HEAD_MATH_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half from_f32<__half>(float x) {
    return __float2half_rn(x);
}

__device__ __forceinline__ int64_t load_target(const void *t, int i64, int64_t i) {
    if (!t) return -1;
    return i64 ? ((const int64_t *)t)[i] : (int64_t)((const int32_t *)t)[i];
}

/* A per-row temperature the host rule accepts (sph_check_float_scalar): T and 1 / T normal
 * floats (so T > 0 and finite). */
__device__ __forceinline__ bool row_temp_ok(float T) {
    const float r = __frcp_rn(T);
    return T >= 1.17549435e-38f && T <= 3.40282347e+38f && r >= 1.17549435e-38f &&
           r <= 3.40282347e+38f;
}

/* Row i's 1 / T: inv_t (the scalar temperature's, rounded on the host) or, with per-row
 * temperatures (plan.h temp_rows), 1 / T_i rounded once to float (__frcp_rn: the host's
 * float(1.0 / T_i) exactly, double rounding being innocuous for a quotient of floats). A T_i
 * the host rule refuses gives NaN: the row's statistics and gradients become NaN and the
 * non-finite policy counts the row (docs/head.md), never a silent wrong value. */
__device__ __forceinline__ float row_inv_t(const float *trows, int64_t i, float inv_t) {
    if (!trows) return inv_t;
    const float T = trows[i];
    return row_temp_ok(T) ? __frcp_rn(T) : __int_as_float(0x7fc00000);
}

/* z = (cap > 0 ? cap tanh(u / cap) : u) / T, the logit the softmax sees. */
__device__ __forceinline__ float transform(float u, float inv_t, float cap, float inv_cap) {
    return (cap > 0.f ? cap * tanhf(u * inv_cap) : u) * inv_t;
}

/* Online (m, s, b) merge: s = sum exp(z - m), b = sum exp(z - m) z. An empty side has m =
 * -inf and is skipped, so exp never sees (-inf) - (-inf). */
__device__ __forceinline__ void merge3(float &m, float &s, float &b, float m2, float s2,
                                       float b2) {
    /* An empty record (m = -inf, s = 0) adds nothing. m = -inf with s NaN is a row part whose
     * every logit was NaN or -inf (fmaxf drops NaN from the maxima): it must poison the row,
     * not vanish (a NaN hidden row would come out as an empty row, uncounted). */
    if (m2 == -INFINITY && s2 == 0.f) return;
    if (m == -INFINITY && s == 0.f) {
        m = m2, s = s2, b = b2;
        return;
    }
    float M = fmaxf(m, m2), a1 = expf(m - M), a2 = expf(m2 - M);
    s = s * a1 + s2 * a2;
    b = b * a1 + b2 * a2;
    m = M;
}

/* Online (m, q) merge of sum_p2's partials: q = sum exp(2 (z - m)). An empty side (m = -inf,
 * q = 0) is skipped; NaN propagates. */
__device__ __forceinline__ void mq_merge(float &m, float &q, float m2, float q2) {
    if (m2 == -INFINITY && q2 == 0.f) return;
    if (m == -INFINITY && q == 0.f) {
        m = m2, q = q2;
        return;
    }
    const float M = fmaxf(m, m2);
    q = q * expf(2.f * (m - M)) + q2 * expf(2.f * (m2 - M));
    m = M;
}

/* Writes a row's partial record (m, s, b, zt, sz), merged after the record already there (an
 * earlier vocabulary split: a fixed order) when merge. */
__device__ __forceinline__ void record_store(float *rec, float m, float s, float b, float zt,
                                             float sz, int merge) {
    if (merge) {
        float pm = rec[0], ps = rec[1], pb = rec[2];
        merge3(pm, ps, pb, m, s, b);
        m = pm, s = ps, b = pb;
        zt += rec[3];
        sz += rec[4];
    }
    rec[0] = m, rec[1] = s, rec[2] = b, rec[3] = zt, rec[4] = sz;
}

__device__ __forceinline__ void stats_update(float z, float &m, float &s, float &b, float &sz) {
    sz += z;
    if (z > m) {
        float a = expf(m - z); /* m = -inf on the first element: a = 0 */
        s = s * a + 1.f;
        b = b * a + z;
        m = z;
    } else {
        float e = expf(z - m);
        s += e;
        b += e * z;
    }
}


/* exp(x) through one MUFU.EX2 (relative error ~2^-21 on the |x| < 100 a softmax sees). */
__device__ __forceinline__ float fexp(float x) {
#ifdef SPH_CUDA_EMU /* tests/emu (host C++): the host's exp2f, within MUFU.EX2's error */
    return exp2f(x * 1.4426950408889634f);
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
#endif
}
/* 2^x (x already in log2 units: an epilogue folds log2e into its per-row FFMA, v29) */
#define SPH_LOG2E 1.4426950408889634f
__device__ __forceinline__ float fex2(float x) {
#ifdef SPH_CUDA_EMU
    return exp2f(x);
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#endif
}

/* Two values as one 32-bit word of T (the pair a thread holds for adjacent columns). */
template <typename T> __device__ __forceinline__ uint32_t pack2(float a, float b);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *(uint32_t *)&v;
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
    __half2 v = __floats2half2_rn(a, b);
    return *(uint32_t *)&v;
}

/* Stores v into element k of a buffer of dtype kind (0 f32, 1 bf16, 2 f16), adding the old
 * value first when acc. */
__device__ __forceinline__ void store_kind(void *base, int kind, int64_t k, float v, int acc) {
    if (kind == 0) {
        float *p = (float *)base + k;
        *p = acc ? *p + v : v;
    } else if (kind == 1) {
        __nv_bfloat16 *p = (__nv_bfloat16 *)base + k;
        *p = __float2bfloat16_rn(acc ? __bfloat162float(*p) + v : v);
    } else {
        __half *p = (__half *)base + k;
        *p = __float2half_rn(acc ? __half2float(*p) + v : v);
    }
}
__device__ __forceinline__ float load_kind(const void *base, int kind, int64_t k) {
    if (kind == 0) return ((const float *)base)[k];
    if (kind == 1) return __bfloat162float(((const __nv_bfloat16 *)base)[k]);
    return __half2float(((const __half *)base)[k]);
}

/* The fused top-k's ordered-int encoding of a float: signed int order = float order (-0
 * below +0), so atomicMax keeps the larger value; sph_tk_dec inverts it. */
__device__ __forceinline__ int sph_tk_enc(float f) {
    const int i = __float_as_int(f);
    return i >= 0 ? i : i ^ 0x7fffffff;
}
__device__ __forceinline__ float sph_tk_dec(int i) {
    return __int_as_float(i >= 0 ? i : i ^ 0x7fffffff);
}

#endif
