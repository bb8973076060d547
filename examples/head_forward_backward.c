/*
 * head_forward_backward.c - the LM head on the CPU, forward and backward, through the public
 * API alone: the example quoted at the top of include/spanhead.h (the region between the
 * [example] markers; tests/cli/install.sh keeps the quote equal to it).
 *
 * run() computes, for N tokens with hidden states h (N, H), a weight w (V, H) and targets t,
 *   logp_i = log softmax(h_i . w^T)_{t_i}
 * and the gradients of L = sum_i g_i logp_i: dhidden (N, H) and dweight (V, H). main() checks
 * them against a float64 loop over the same formulas and exits 0 when they agree.
 *
 * Build against an installed spanhead (the tests do both):
 *   cc head_forward_backward.c $(pkg-config --cflags --libs spanhead) -lm
 *   cmake -S examples -B build-ex -DCMAKE_PREFIX_PATH=PREFIX   (find_package(spanhead))
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "spanhead.h"

enum { N = 6, H = 8, V = 32 };

// [example]
static int run(float *h, float *w, int64_t *t, float *g, float *logp, float *dh, float *dw) {
    sph_ctx_opts o = SPH_CTX_OPTS_INIT; // CPU, all threads
    sph_ctx_t ctx;
    if (sph_ctx_create(&ctx, &o) != SPH_OK) {
        fprintf(stderr, "spanhead: %s\n", sph_last_error());
        return 1;
    }
    int64_t hs[2] = {N, H}, vs[2] = {V, H}, ns[1] = {N}, ss[2] = {N, 3};
    float stats[N * 3]; // (max, lse, mu) per row: the forward writes it, the backward reads it
    const sph_device cpu = {SPH_DEVICE_CPU, 0};
    sph_tensor hid = {.data = h, .device = cpu, .ndim = 2, .dtype = SPH_F32, .shape = hs};
    sph_tensor wt = {.data = w, .device = cpu, .ndim = 2, .dtype = SPH_F32, .shape = vs};
    sph_tensor tgt = {.data = t, .device = cpu, .ndim = 1, .dtype = SPH_I64, .shape = ns};
    sph_tensor lp = {.data = logp, .device = cpu, .ndim = 1, .dtype = SPH_F32, .shape = ns};
    sph_tensor st = {.data = stats, .device = cpu, .ndim = 2, .dtype = SPH_F32, .shape = ss};
    sph_tensor up = {.data = g, .device = cpu, .ndim = 1, .dtype = SPH_F32, .shape = ns};
    sph_tensor dht = {.data = dh, .device = cpu, .ndim = 2, .dtype = SPH_F32, .shape = hs};
    sph_tensor dwt = {.data = dw, .device = cpu, .ndim = 2, .dtype = SPH_F32, .shape = vs};

    sph_head_args a = SPH_HEAD_ARGS_INIT;
    a.hidden = &hid, a.weight = &wt, a.targets = &tgt, a.logprob = &lp, a.stats = &st;
    size_t bytes = 0, need = 0; // the caller owns the workspace, sized by the same arguments
    void *ws = NULL;
    sph_status s = sph_head_workspace_size(ctx, SPH_HEAD_FORWARD, &a, &bytes);
    if (s == SPH_OK && !(ws = malloc(bytes ? bytes : 1))) s = SPH_ERR_ALLOC;
    if (s == SPH_OK) s = sph_head_forward(ctx, &a, ws, bytes); // logp[i] = log p(t_i | h_i)

    a.dlogprob = &up, a.dhidden = &dht, a.dweight = &dwt; // gradients of sum_i g_i logp_i
    if (s == SPH_OK) s = sph_head_workspace_size(ctx, SPH_HEAD_BACKWARD, &a, &need);
    if (s == SPH_OK && need > bytes) {
        free(ws);
        if (!(ws = malloc(need))) s = SPH_ERR_ALLOC;
        bytes = need;
    }
    if (s == SPH_OK) s = sph_head_backward(ctx, &a, ws, bytes);
    if (s != SPH_OK) fprintf(stderr, "%s: %s\n", sph_status_str(s), sph_last_error());
    free(ws);
    sph_ctx_destroy(ctx);
    return s != SPH_OK;
}
// [example end]

/* A float64 loop over the formulas (include/spanhead.h, "The LM head"). */
static double check(const float *h, const float *w, const int64_t *t, const float *g,
                    const float *logp, const float *dh, const float *dw) {
    double err = 0, dwr[V][H] = {{0}};
    for (int i = 0; i < N; i++) {
        double z[V], m = -INFINITY, s = 0, dhr[H] = {0};
        for (int j = 0; j < V; j++) {
            z[j] = 0;
            for (int k = 0; k < H; k++) z[j] += (double)h[i * H + k] * w[j * H + k];
            m = z[j] > m ? z[j] : m;
        }
        for (int j = 0; j < V; j++) s += exp(z[j] - m);
        const double lse = m + log(s);
        err = fmax(err, fabs(logp[i] - (z[t[i]] - lse)));
        for (int j = 0; j < V; j++) {
            const double dz = g[i] * ((j == t[i]) - exp(z[j] - lse));
            for (int k = 0; k < H; k++) {
                dhr[k] += dz * w[j * H + k];
                dwr[j][k] += dz * h[i * H + k];
            }
        }
        for (int k = 0; k < H; k++) err = fmax(err, fabs(dh[i * H + k] - dhr[k]));
    }
    for (int j = 0; j < V; j++)
        for (int k = 0; k < H; k++) err = fmax(err, fabs(dw[j * H + k] - dwr[j][k]));
    return err;
}

int main(void) {
    float h[N * H], w[V * H], g[N], logp[N], dh[N * H], dw[V * H];
    int64_t t[N];
    unsigned long long x = 88172645463325252ull; /* xorshift: any inputs will do */
#define RAND() ((x ^= x << 13, x ^= x >> 7, x ^= x << 17), (double)(x >> 11) * 0x1p-53 * 2 - 1)
    for (int k = 0; k < N * H; k++) h[k] = (float)RAND();
    for (int k = 0; k < V * H; k++) w[k] = (float)(0.5 * RAND());
    for (int i = 0; i < N; i++) t[i] = (int64_t)(x % V), g[i] = (float)RAND();
    if (run(h, w, t, g, logp, dh, dw)) return 1;
    const double err = check(h, w, t, g, logp, dh, dw);
    printf("spanhead %s: N=%d H=%d V=%d, logprob[0] = %.6f, max |error| against float64 = %.2e\n",
           sph_version(), N, H, V, logp[0], err);
    if (!(err <= 1e-4)) {
        fprintf(stderr, "head_forward_backward: error %.2e exceeds 1e-4\n", err);
        return 1;
    }
    return 0;
}
