/*
 * case_mirror.h - device copies of a host case (test_head_case.h's hcase) for the GPU tests
 * that run a case on a CUDA context: mirror_make copies every tensor of the case to the device
 * and points the case at the copies, mirror_back copies them back and points it at the host.
 */
#ifndef SPH_TESTS_GPU_CASE_MIRROR_H
#define SPH_TESTS_GPU_CASE_MIRROR_H

static size_t tensor_bytes(const sph_tensor *t) {
    size_t n = t->dtype.bits / 8;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

/* Device copies of every tensor of the case (16 at most), wired into c->a's tensors. */
typedef struct mirror {
    sph_tensor *t[16];
    void *host[16], *dev[16];
    int n;
} mirror;

static void mirror_make(sph_ctx_t g, hcase *c, mirror *m) {
    sph_tensor *ts[] = {&c->th, &c->tw, &c->tt, &c->tc, &c->tm, &c->tlp, &c->tent, &c->tlse,
                        &c->tlm, &c->tst, &c->tg, &c->te, &c->tgl, &c->tgm, &c->tdh, &c->tdw};
    memset(m, 0, sizeof *m);
    for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
        sph_tensor *t = ts[k];
        if (!t->data || !t->shape) continue;
        size_t b = tensor_bytes(t);
        void *d = NULL;
        expect_ok(sph_ctx_malloc(g, b, &d));
        expect_ok(sph_ctx_memcpy(g, d, t->data, b));
        m->t[m->n] = t, m->host[m->n] = t->data, m->dev[m->n] = d, m->n++;
        t->data = d;
        t->device = (sph_device){SPH_DEVICE_CUDA, 0};
    }
}

/* Device results back into the host arrays, tensors pointing at the host again. */
static void mirror_back(sph_ctx_t g, mirror *m) {
    for (int k = 0; k < m->n; k++) {
        expect_ok(sph_ctx_memcpy(g, m->host[k], m->dev[k], tensor_bytes(m->t[k])));
        m->t[k]->data = m->host[k];
        m->t[k]->device = (sph_device){SPH_DEVICE_CPU, 0};
        sph_ctx_free(g, m->dev[k]);
    }
    m->n = 0;
}

#endif /* SPH_TESTS_GPU_CASE_MIRROR_H */
