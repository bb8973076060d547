/*
 * policy.cuh - the one hook of the fused policy loss inside the CUDA head (head.cu calls it
 * right after every launch of its finalize kernel, in the staged-chunk one-pass path, the
 * recomputing one-pass path and the plain forward alike): turns the just-finalized rows'
 * logprob and entropy into the upstream gradients (dlogprob, dentropy) that the rows' dlogits
 * read next on the same stream. A no-op (no launch) when the plan carries no policy loss.
 * Implemented in policy.cu.
 */
#ifndef SPH_CUDA_POLICY_CUH
#define SPH_CUDA_POLICY_CUH

#include <cuda_runtime.h>

#include "head/plan.h"

/* Rows r0 .. r0 + rows of the pass, or rowmap[0 .. rows) (device) when gathered. */
sph_status sph_cuda_policy_rows(const sph_head_plan *p, int64_t r0, const int64_t *rowmap,
                                int64_t rows, cudaStream_t stream);

#endif
