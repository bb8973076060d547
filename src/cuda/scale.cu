/*
 * scale.cu - sph_scale_inplace on CUDA (src/core/scale.c validates): one launch for every
 * tensor of the call, grid-stride over each; every block reads the scalar first and returns
 * when it is exactly 1, so the usual backward of a one-pass loss (upstream gradient 1) costs
 * one launch and no memory traffic, with no host synchronization.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/backend.h"
#include "cuda/common.cuh"
#include "cuda/state.h"

namespace {

struct scale_jobs {
    void *data[SPH_SCALE_MAX];
    long long rows[SPH_SCALE_MAX], cols[SPH_SCALE_MAX], ld[SPH_SCALE_MAX];
    int kind[SPH_SCALE_MAX]; /* 0 f32, 1 bf16, 2 f16 */
    int n;
};

__device__ inline void scale_one(void *base, int kind, long long k, float s) {
    if (kind == 0) {
        float *p = (float *)base;
        p[k] = p[k] * s;
    } else if (kind == 1) {
        __nv_bfloat16 *p = (__nv_bfloat16 *)base;
        p[k] = __float2bfloat16_rn(__bfloat162float(p[k]) * s);
    } else {
        __half *p = (__half *)base;
        p[k] = __float2half_rn(__half2float(p[k]) * s);
    }
}

__global__ void scale_kernel(const float *scale, scale_jobs j) {
    const float s = *scale;
    if (s == 1.0f) return; /* exactly 1: nothing read or written */
    const long long step = (long long)gridDim.x * blockDim.x;
    for (int t = 0; t < j.n; t++) {
        const long long total = j.rows[t] * j.cols[t];
        for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
             e += step) {
            const long long r = e / j.cols[t], c = e - r * j.cols[t];
            scale_one(j.data[t], j.kind[t], r * j.ld[t] + c, s);
        }
    }
}

} // namespace

extern "C" sph_status sph_cuda_scale(sph_ctx_t ctx, const float *scale,
                                     const sph_scale_job *jobs, int n) {
    scale_jobs j;
    memset(&j, 0, sizeof j);
    long long most = 0;
    for (int t = 0; t < n; t++) {
        j.data[t] = jobs[t].data;
        j.rows[t] = jobs[t].rows;
        j.cols[t] = jobs[t].cols;
        j.ld[t] = jobs[t].ld;
        j.kind[t] = jobs[t].dtype.bits == 32 ? 0 : (jobs[t].dtype.code == SPH_DTYPE_BFLOAT ? 1 : 2);
        if (jobs[t].rows * jobs[t].cols > most) most = jobs[t].rows * jobs[t].cols;
    }
    j.n = n;
    if (most == 0) return SPH_OK;
    SPH_CUDA_RET(cudaSetDevice(ctx->device.id));
    const sph_cuda_state *st = (const sph_cuda_state *)ctx->cuda;
    const int threads = 256;
    long long blocks = (most + threads - 1) / threads;
    const long long cap = (long long)(st ? st->prop.multiProcessorCount : 132) * 8;
    if (blocks > cap) blocks = cap;
    scale_kernel<<<(unsigned)blocks, threads, 0, (cudaStream_t)ctx->stream>>>(scale, j);
    SPH_CUDA_RET(cudaGetLastError());
    return SPH_OK;
}
