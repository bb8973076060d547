/* head_cpu.c - optimized CPU backend (not yet built: every call reports unsupported). */
#include "head/plan.h"

sph_status sph_head_cpu_workspace(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p,
                                  size_t *bytes) {
    *bytes = 0;
    return SPH_OK;
}
sph_status sph_head_cpu_forward(sph_ctx_t ctx, const sph_head_plan *p, void *ws, size_t bytes) {
    return sph_err(SPH_ERR_UNSUPPORTED, "head: optimized CPU backend not built yet (use ref)");
}
sph_status sph_head_cpu_backward(sph_ctx_t ctx, const sph_head_plan *p, void *ws, size_t bytes) {
    return sph_err(SPH_ERR_UNSUPPORTED, "head: optimized CPU backend not built yet (use ref)");
}
