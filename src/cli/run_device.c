/*
 * run_device.c - the device side of `spanhead run`: a context, device copies of the problem
 * (every buffer through sph_ctx_malloc / sph_ctx_memcpy, so one code path drives the CPU and a
 * CUDA device), the head's arguments, one workspace for both passes, and timed passes.
 */
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "run.h"

static sph_status put(run_device *d, int k, const void *host, size_t bytes, int ndim, int64_t n0,
                      int64_t n1, sph_dtype dt, sph_device dev) {
    d->bytes[k] = bytes;
    sph_status s = sph_ctx_malloc(d->ctx, bytes ? bytes : 1, &d->buf[k]);
    if (s) return s;
    if (host) s = sph_ctx_memcpy(d->ctx, d->buf[k], host, bytes);
    else s = sph_ctx_memset(d->ctx, d->buf[k], 0, bytes);
    d->shape[k][0] = n0, d->shape[k][1] = n1;
    d->t[k] = (sph_tensor){d->buf[k], dev, ndim, dt, d->shape[k], NULL, 0};
    return s;
}

void run_device_free(run_device *d) {
    for (int k = 0; k < T_COUNT; k++) sph_ctx_free(d->ctx, d->buf[k]);
    sph_ctx_free(d->ctx, d->ws);
    sph_ctx_destroy(d->ctx);
    memset(d, 0, sizeof *d);
}

sph_status run_device_setup(run_device *d, const run_problem *p, const run_opts *o, int on_cuda,
                            const char *kernel, int64_t threads) {
    memset(d, 0, sizeof *d);
    sph_ctx_opts co = SPH_CTX_OPTS_INIT;
    co.device.type = on_cuda ? SPH_DEVICE_CUDA : SPH_DEVICE_CPU;
    co.num_threads = (int)threads; /* bounded by the CPU count in cmd_run.c */
    co.force_kernel = kernel;
    /* the SPH_CUDA_* A/B switches of the scripts under scripts/device (not for the reference) */
    sph_status s = kernel && !strcmp(kernel, "ref") ? SPH_OK : sph_ctx_opts_apply_env(&co);
    if (!s) s = sph_ctx_create(&d->ctx, &co);
    if (s) return s;
    sph_device dev = co.device;
    const int64_t N = p->N, H = p->H, V = p->V;
    sph_dtype in = p->bits == 32 ? SPH_F32 : (p->is_bf16 ? SPH_BF16 : SPH_F16);
    size_t es = (size_t)p->bits / 8; /* products below: checked by run_problem.c */
    d->backward = p->grads;
#define PUT(k, host, bytes, nd, n0, n1, dt)                                                    \
    do {                                                                                      \
        if ((s = put(d, k, host, bytes, nd, n0, n1, dt, dev))) return s;                      \
    } while (0)
    PUT(T_H, p->h, (size_t)(N * H) * es, 2, N, H, in);
    PUT(T_W, p->w, (size_t)(V * H) * es, 2, V, H, in);
    PUT(T_TGT, p->tgt, (size_t)N * 8, 1, N, 0, SPH_I64);
    if (p->cand) PUT(T_CAND, p->cand, (size_t)(N * p->K) * 8, 2, N, p->K, SPH_I64);
    if (p->mask) PUT(T_MASK, p->mask, (size_t)N, 1, N, 0, SPH_U8);
    PUT(T_LP, NULL, (size_t)N * 4, 1, N, 0, SPH_F32);
    PUT(T_ENT, NULL, (size_t)N * 4, 1, N, 0, SPH_F32);
    PUT(T_LSE, NULL, (size_t)N * 4, 1, N, 0, SPH_F32);
    PUT(T_LM, NULL, (size_t)N * 4, 1, N, 0, SPH_F32);
    PUT(T_ST, NULL, (size_t)N * 12, 2, N, 3, SPH_F32);
    if (o->sum_p2) PUT(T_SP2, NULL, (size_t)N * 4, 1, N, 0, SPH_F32);
    if (o->topk) {
        PUT(T_TKL, NULL, (size_t)(N * o->topk) * 4, 2, N, o->topk, SPH_F32);
        PUT(T_TKI, NULL, (size_t)(N * o->topk) * 8, 2, N, o->topk, SPH_I64);
    }
    if (p->g) PUT(T_G, p->g, (size_t)N * 4, 1, N, 0, SPH_F32);
    if (p->e) PUT(T_E, p->e, (size_t)N * 4, 1, N, 0, SPH_F32);
    if (p->gl) PUT(T_GL, p->gl, (size_t)N * 4, 1, N, 0, SPH_F32);
    if (p->gm) PUT(T_GM, p->gm, (size_t)N * 4, 1, N, 0, SPH_F32);
    if (p->temp) PUT(T_TEMP, p->temp, (size_t)N * 4, 1, N, 0, SPH_F32);
    if (d->backward) {
        PUT(T_DH, NULL, (size_t)(N * H) * 4, 2, N, H, SPH_F32);
        PUT(T_DW, NULL, (size_t)(V * H) * 4, 2, V, H, SPH_F32);
    }
#undef PUT
    sph_head_args a = SPH_HEAD_ARGS_INIT;
    a.hidden = &d->t[T_H], a.weight = &d->t[T_W], a.targets = &d->t[T_TGT];
    a.candidates = p->cand ? &d->t[T_CAND] : NULL;
    a.vocab_start = p->v0, a.vocab_total = p->V_total;
    a.temperature = o->temperature, a.softcap = o->softcap;
    a.temperature_rows = p->temp ? &d->t[T_TEMP] : NULL;
    a.active_mask = p->mask ? &d->t[T_MASK] : NULL;
    a.spans = p->spans, a.n_spans = p->n_spans;
    a.logprob = &d->t[T_LP];
    a.entropy = (o->entropy || p->e) ? &d->t[T_ENT] : NULL;
    a.lse = &d->t[T_LSE];
    a.logit_mean = p->K ? NULL : &d->t[T_LM];
    a.stats = &d->t[T_ST];
    a.sum_p2 = o->sum_p2 ? &d->t[T_SP2] : NULL;
    if (o->topk) a.topk_logprobs = &d->t[T_TKL], a.topk_ids = &d->t[T_TKI];
    a.dlogprob = p->g ? &d->t[T_G] : NULL;
    a.dentropy = p->e ? &d->t[T_E] : NULL;
    a.dlse = p->gl ? &d->t[T_GL] : NULL;
    a.dlogit_mean = p->gm ? &d->t[T_GM] : NULL; /* with candidates: the library refuses it */
    if (d->backward) a.dhidden = &d->t[T_DH], a.dweight = &d->t[T_DW];
    d->a = a;
    d->one_pass = o->one_pass && d->backward;
    /* workspace: the larger of the two passes, allocated once */
    sph_head_args fa = a;
    if (!d->one_pass) fa.dhidden = fa.dweight = NULL;
    if ((s = sph_head_workspace_size(d->ctx, SPH_HEAD_FORWARD, &fa, &d->ws_bytes[0]))) return s;
    if (d->backward && !d->one_pass &&
        (s = sph_head_workspace_size(d->ctx, SPH_HEAD_BACKWARD, &a, &d->ws_bytes[1])))
        return s;
    size_t wb = d->ws_bytes[0] > d->ws_bytes[1] ? d->ws_bytes[0] : d->ws_bytes[1];
    return sph_ctx_malloc(d->ctx, wb ? wb : 1, &d->ws);
}

sph_status run_device_pass(run_device *d, double *t_fwd, double *t_bwd) {
    sph_head_args fa = d->a;
    if (!d->one_pass) fa.dhidden = fa.dweight = NULL;
    size_t wb = d->ws_bytes[0] > d->ws_bytes[1] ? d->ws_bytes[0] : d->ws_bytes[1];
    double t0 = sph_cli_now_s();
    sph_status s = sph_head_forward(d->ctx, &fa, d->ws, wb);
    if (!s) s = sph_ctx_synchronize(d->ctx);
    double t1 = sph_cli_now_s();
    if (!s && d->backward && !d->one_pass) s = sph_head_backward(d->ctx, &d->a, d->ws, wb);
    if (!s) s = sph_ctx_synchronize(d->ctx);
    double t2 = sph_cli_now_s();
    *t_fwd = t1 - t0, *t_bwd = t2 - t1;
    return s;
}

float *run_device_get(run_device *d, int k) {
    float *h = malloc(d->bytes[k] + 1);
    if (h && sph_ctx_memcpy(d->ctx, h, d->buf[k], d->bytes[k]) != SPH_OK) {
        free(h);
        return NULL;
    }
    return h;
}
