/*
 * head_ref_stage.c - the float64 reference on a device context (force_kernel / SPH_KERNEL
 * "ref" on CUDA): what "ref" means there, for real. Every tensor of the plan is copied to
 * host memory, the host data checks run on the copies (targets, candidates and the mask of
 * device memory cannot be read at validation), the reference computes there, and the outputs
 * are copied back.
 *
 * Synchronous: every copy goes through the context's device table (ctx->dev->memcpy, which
 * waits for the work already queued on the context's stream), and the call returns when the
 * outputs are on the device. It costs a host copy of every operand and the reference's
 * O(N H V) float64 loops: a path for tests and for debugging a kernel, never a fast one.
 * A TP group of more than one rank is refused (SPH_ERR_UNSUPPORTED): the reference combines on
 * host buffers and the group's communicator takes device buffers.
 *
 * Output regions are copied in before the pass as well as out after it: accumulating
 * gradients read them, and the bytes between padded rows come back unchanged.
 */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "head/host.h"

#define MAX_STAGED 24

typedef struct staged {
    void *dev;   /* the caller's device region */
    void *host;  /* its host copy */
    size_t bytes;
    int out;     /* copied back after the pass */
} staged;

typedef struct stage_set {
    sph_ctx_t ctx;
    staged s[MAX_STAGED];
    int n;
} stage_set;

/* Bytes from the first element of a (rows, cols) region with row stride ld to its last;
 * SIZE_MAX when that does not fit (the allocation then fails cleanly). */
static size_t extent(int64_t rows, int64_t cols, int64_t ld, size_t es) {
    if (rows <= 0 || cols <= 0) return 0;
    size_t n;
    if (!sph_mul_size((size_t)(rows - 1), (size_t)ld, &n) || n > SIZE_MAX - (size_t)cols ||
        !sph_mul_size(n + (size_t)cols, es, &n))
        return SIZE_MAX;
    return n;
}

/* A host copy of the device region [dev, dev + bytes); *host = NULL when dev is NULL. */
static sph_status stage(stage_set *ss, const void *dev, size_t bytes, int out, const char *name,
                        void **host) {
    *host = NULL;
    if (!dev) return SPH_OK;
    SPH_CHECK(ss->n < MAX_STAGED, SPH_ERR_INTERNAL, "head (staged reference): too many regions");
    void *h = bytes < SIZE_MAX ? sph_malloc(bytes ? bytes : 1) : NULL;
    SPH_CHECK(h != NULL, SPH_ERR_ALLOC, "%s: no host copy of %zu bytes for the staged reference",
              name, bytes);
    ss->s[ss->n++] = (staged){(void *)dev, h, bytes, out};
    *host = h;
    if (bytes == 0) return SPH_OK;
    sph_status s = ss->ctx->dev->memcpy(ss->ctx, h, dev, bytes);
    if (s != SPH_OK) return sph_err_prefix(s, "%s: copy to the host (staged reference): ", name);
    return SPH_OK;
}

static void stage_free(stage_set *ss) {
    for (int k = 0; k < ss->n; k++) sph_free(ss->s[k].host);
    ss->n = 0;
}

sph_status sph_head_ref_stage_check(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p) {
    (void)ctx, (void)pass;
    SPH_CHECK(!p->comm || p->comm->size <= 1, SPH_ERR_UNSUPPORTED,
              "force_kernel 'ref' on a %s context: a TP group of %lld ranks is not supported (the "
              "reference combines host buffers, the group's communicator takes device buffers)",
              ctx->dev->name, (long long)p->comm->size);
    return SPH_OK;
}

static sph_status stage_plan(stage_set *ss, sph_head_pass pass, const sph_head_plan *p,
                             sph_head_plan *h) {
    const size_t es = sph_dtype_size(p->dtype);
    const int grads = pass == SPH_HEAD_BACKWARD || p->one_pass, fwd = pass == SPH_HEAD_FORWARD;
    void *v;
    *h = *p;
#define STAGE(field, bytes, out)                                                              \
    do {                                                                                      \
        SPH_TRY(stage(ss, p->field, (bytes), (out), #field, &v));                             \
        h->field = v;                                                                         \
    } while (0)
    STAGE(hidden, extent(p->N, p->H, p->ld_h, es), 0);
    STAGE(weight, extent(p->V_loc, p->H, p->ld_w, es), 0);
    STAGE(targets, extent(p->N, 1, 1, p->tgt_i64 ? 8 : 4), 0);
    STAGE(cand, extent(p->N, p->K, p->ld_c, p->cand_i64 ? 8 : 4), 0);
    STAGE(mask, extent(p->N, 1, 1, 1), 0);
    STAGE(temp_rows, extent(p->N, 1, 1, 4), 0);
    STAGE(logprob, extent(p->N, 1, 1, 4), fwd);
    STAGE(entropy, extent(p->N, 1, 1, 4), fwd);
    STAGE(lse, extent(p->N, 1, 1, 4), fwd);
    STAGE(logit_mean, extent(p->N, 1, 1, 4), fwd);
    STAGE(stats, extent(p->N, 3, 3, 4), fwd);
    STAGE(dlogprob, extent(p->N, 1, 1, 4), 0);
    STAGE(dentropy, extent(p->N, 1, 1, 4), 0);
    STAGE(dlse, extent(p->N, 1, 1, 4), 0);
    STAGE(dlogit_mean, extent(p->N, 1, 1, 4), 0);
    STAGE(dhidden, extent(p->N, p->H, p->ld_dh, sph_dtype_size(p->dh_dtype)), grads);
    STAGE(dweight, extent(p->V_loc, p->H, p->ld_dw, sph_dtype_size(p->dw_dtype)), grads);
#undef STAGE
    h->device = (sph_device){SPH_DEVICE_CPU, 0};
    return SPH_OK;
}

sph_status sph_head_ref_stage_pass(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p) {
    stage_set ss;
    memset(&ss, 0, sizeof ss);
    ss.ctx = ctx;
    sph_head_plan h;
    sph_status s = stage_plan(&ss, pass, p, &h);
    /* the checks validation could not run on device data, before any output is written */
    if (s == SPH_OK) s = sph_head_plan_check_data(&h);
    if (s == SPH_OK) s = pass == SPH_HEAD_FORWARD ? sph_head_ref_forward(ctx, &h)
                                                  : sph_head_ref_backward(ctx, &h);
    for (int k = 0; k < ss.n && s == SPH_OK; k++) {
        const staged *r = &ss.s[k];
        if (!r->out || r->bytes == 0) continue;
        s = ctx->dev->memcpy(ctx, r->dev, r->host, r->bytes);
        if (s != SPH_OK) s = sph_err_prefix(s, "head (staged reference): copy back: ");
    }
    stage_free(&ss);
    return s;
}
