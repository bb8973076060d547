/*
 * opt_probe.c - the library judges the CLI's option values (issue 26 case 16): rather than
 * re-check temperatures, softcaps, thread counts, kernels and the policy coefficients with its
 * own bounds (which drifted from the library's: hidden 1e300 caps, "finite number >=
 * -1e+308"), the CLI asks the library, before any work, on a one-row problem whose data is
 * valid by construction, so that any refusal is about an option: a usage error (exit 2) with
 * the library's message, which names the argument and the value. The real call validates
 * the same values again with the real data; the probe only moves the verdict up front and
 * gives it the usage exit code.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "msg.h"
#include "run.h"

/* One CPU context of the run's threads and kernel (the options a context judges). */
static sph_status probe_ctx(int64_t threads, const char *kernel, sph_ctx_t *ctx) {
    sph_ctx_opts co = SPH_CTX_OPTS_INIT;
    co.num_threads = (int)threads; /* the parsers bound --threads to int */
    co.force_kernel = kernel;
    return sph_ctx_create(ctx, &co);
}

typedef struct probe_bufs {
    float h[1], w[1], lp[1], ent[1], adv[1], old[1], ref[1], isw[1], dh[1], dw[1];
    float st[3], met[SPH_POLICY_N_METRICS];
    int64_t tgt[1], seq[1];
    int64_t s1[1], s11[2], s3[2], sm[1];
    sph_tensor t_h, t_w, t_tgt, t_lp, t_ent, t_st, t_dh, t_dw, t_adv, t_old, t_ref, t_isw, t_seq,
        t_met;
} probe_bufs;

static void probe_fill(probe_bufs *b, sph_head_args *a) {
    memset(b, 0, sizeof *b);
    b->h[0] = 0.5f, b->w[0] = 0.25f, b->isw[0] = 1.0f, b->old[0] = -0.5f, b->ref[0] = -0.5f;
    b->s1[0] = 1, b->s11[0] = 1, b->s11[1] = 1, b->s3[0] = 1, b->s3[1] = 3;
    b->sm[0] = SPH_POLICY_N_METRICS;
    const sph_device cpu = {SPH_DEVICE_CPU, 0};
#define TEN(name, ptr, nd, shp, dt) b->name = (sph_tensor){ptr, cpu, nd, dt, shp, NULL, 0}
    TEN(t_h, b->h, 2, b->s11, SPH_F32);
    TEN(t_w, b->w, 2, b->s11, SPH_F32);
    TEN(t_tgt, b->tgt, 1, b->s1, SPH_I64);
    TEN(t_lp, b->lp, 1, b->s1, SPH_F32);
    TEN(t_ent, b->ent, 1, b->s1, SPH_F32);
    TEN(t_st, b->st, 2, b->s3, SPH_F32);
    TEN(t_dh, b->dh, 2, b->s11, SPH_F32);
    TEN(t_dw, b->dw, 2, b->s11, SPH_F32);
    TEN(t_adv, b->adv, 1, b->s1, SPH_F32);
    TEN(t_old, b->old, 1, b->s1, SPH_F32);
    TEN(t_ref, b->ref, 1, b->s1, SPH_F32);
    TEN(t_isw, b->isw, 1, b->s1, SPH_F32);
    TEN(t_seq, b->seq, 1, b->s1, SPH_I64);
    TEN(t_met, b->met, 1, b->sm, SPH_F32);
#undef TEN
    *a = (sph_head_args)SPH_HEAD_ARGS_INIT;
    a->hidden = &b->t_h, a->weight = &b->t_w, a->targets = &b->t_tgt;
    a->logprob = &b->t_lp, a->stats = &b->t_st;
}

/* The context of the run's threads and kernel, and the one-row problem with its temperature
 * and softcap: what every probe starts from. */
static sph_status probe_start(int64_t threads, const char *kernel, double temperature,
                              double softcap, sph_ctx_t *ctx, probe_bufs *b, sph_head_args *a) {
    probe_fill(b, a);
    a->temperature = temperature, a->softcap = softcap;
    return probe_ctx(threads, kernel, ctx);
}

/* The option behind the library's argument name, which its message starts with. */
static const char *option_of(const char *m) {
    static const char *const map[][2] = {
        {"temperature:", "--temperature"},   {"softcap:", "--softcap"},
        {"clip_low:", "--clip-low"},         {"clip_high:", "--clip-high"},
        {"clip_ratio_c:", "--clip-ratio-c"}, {"kl_coef:", "--kl-coef"},
        {"entropy_coef:", "--entropy-coef"}, {"norm_length:", "--norm-length"},
        {"opts.num_threads", "--threads"},   {"force_kernel:", "--kernel"}};
    for (size_t k = 0; k < sizeof map / sizeof map[0]; k++)
        if (!strncmp(m, map[k][0], strlen(map[k][0]))) return map[k][1];
    return NULL;
}

/* "--temperature: invalid argument: temperature: 0, expected ..." (the option, then the
 * library's status and message). */
static int refused(const char *cmd, sph_status s, char *msg, size_t n) {
    const char *m = sph_last_error(), *opt = option_of(m);
    char line[700];
    snprintf(line, sizeof line, "%s%s%s: %s", opt ? opt : "", opt ? ": " : "", sph_status_str(s), m);
    if (msg) return 2 * sph_cli_err(msg, n, "%s", line);
    return sph_cli_fail(cmd, 2, "%s", line);
}

int sph_cli_probe_head(const char *cmd, double temperature, double softcap, int64_t threads,
                       const char *kernel, char *msg, size_t n) {
    sph_ctx_t ctx = NULL;
    probe_bufs b;
    sph_head_args a;
    sph_status s = probe_start(threads, kernel, temperature, softcap, &ctx, &b, &a);
    if (s) return refused(cmd, s, msg, n);
    size_t bytes = 0;
    s = sph_head_workspace_size(ctx, SPH_HEAD_FORWARD, &a, &bytes);
    sph_ctx_destroy(ctx);
    return s ? refused(cmd, s, msg, n) : 0;
}

int sph_cli_probe_policy(const char *cmd, const sph_policy_args *pol, double temperature,
                         double softcap, int64_t threads, const char *kernel, char *msg,
                         size_t n) {
    sph_ctx_t ctx = NULL;
    probe_bufs b;
    sph_head_args a;
    sph_status s = probe_start(threads, kernel, temperature, softcap, &ctx, &b, &a);
    if (s) return refused(cmd, s, msg, n);
    a.entropy = &b.t_ent, a.dhidden = &b.t_dh, a.dweight = &b.t_dw;
    sph_policy_args pa = *pol;
    pa.num_tokens = pa.num_seqs = 0; /* counts: judged against the real batch */
    pa.advantages = &b.t_adv, pa.old_logprob = &b.t_old, pa.ref_logprob = &b.t_ref;
    pa.is_weight = &b.t_isw, pa.seq_id = &b.t_seq, pa.metrics = &b.t_met;
    size_t bytes = 0;
    s = sph_policy_loss_workspace_size(ctx, &a, &pa, &bytes);
    sph_ctx_destroy(ctx);
    return s ? refused(cmd, s, msg, n) : 0;
}
