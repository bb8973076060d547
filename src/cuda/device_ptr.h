/*
 * device_ptr.h - the CUDA backends' check that a pointer is device memory (runtime.cu), shared
 * by the head (head.cu), the policy loss (policy.cu) and the distillation loss (distill.cu):
 * a tensor that claims the device but points at host memory is refused, naming it, before
 * anything is enqueued. Kept out of head.cuh so that the sm90 kernels do not depend on it.
 */
#ifndef SPH_CUDA_DEVICE_PTR_H
#define SPH_CUDA_DEVICE_PTR_H

#include "spanhead.h"

#ifdef __cplusplus
extern "C" {
#endif

/* SPH_OK for NULL or device (managed) memory; else SPH_ERR_DEVICE naming `name`. */
sph_status sph_cuda_need_device(const void *ptr, const char *name);

#ifdef __cplusplus
}
#endif
#endif
