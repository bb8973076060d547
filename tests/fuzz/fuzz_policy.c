/*
 * fuzz_policy.c - libFuzzer target for the fused policy loss's inputs (sph_policy_loss). The
 * input chooses a tiny problem and every argument of the call: 16 option bytes (shape, loss,
 * KL, aggregation, the scalars from a table of good and bad values, which tensors are
 * missing, mistyped or misshapen, the mask and target pattern), then raw bytes for the
 * per-row inputs (any float, NaN and inf included) and the sequence ids. Each call runs on the
 * float64 reference and the optimized CPU kernels. Invariants:
 *   - an error has a message, is never SPH_ERR_INTERNAL, and leaves every output as it was
 *     (poisoned before the call, compared byte for byte after);
 *   - both kernels agree on success or failure and on the status;
 *   - on success with finite inputs: finite metrics, the two kernels close, 0 on every row
 *     that carries no loss (logprob, entropy, dhidden);
 *   - aliasing (a trailing byte >= 128): one output placed on an input's bytes (or on another
 *     output's) is refused whenever both regions are non-empty, the input's bytes untouched;
 *   - extreme coefficients (o[11] >> 5 picks the field, o[14] >> 4 the value: subnormal,
 *     beyond float, ...): a value no float rule admits is refused, by both kernels alike.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "spanhead.h"

static const double REALS[16] = {0.0,  0.2,   0.28, 1.0,     3.0,       -1.0,  1.5,  0.05,
                                 1e300, -0.0, 2.0,  HUGE_VAL, -HUGE_VAL, NAN,   1e-8, 0.999};
/* beyond the float rule: 1e-320, 1e39, 1e-40, 3.5e38 (odd slots); admitted: the even slots */
static const double EXTREMES[8] = {1e30, 1e-320, 1e-30, 1e39, FLT_MAX, 1e-40, FLT_MIN, 3.5e38};
static const int64_t COUNTS[8] = {0, 1, 3, 100, -1, 1000000, 7, INT64_MAX};

typedef struct buf {
    const uint8_t *p;
    size_t n;
} buf;

static uint8_t byte_of(buf *b) {
    if (!b->n) return 0;
    b->n--;
    return *b->p++;
}

static float float_of(buf *b) {
    uint8_t k = byte_of(b);
    if (k < 200) return ((float)k - 100.0f) / 25.0f; /* ordinary values */
    if (k < 240) {                                    /* raw bits: anything at all */
        uint32_t u = 0;
        for (int i = 0; i < 4; i++) u = u << 8 | byte_of(b);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return k < 248 ? NAN : (k & 1 ? HUGE_VALF : -HUGE_VALF);
}

typedef struct outs {
    float lp[16], ent[16], stats[48], dh[16 * 8], dw[16 * 8], met[SPH_POLICY_N_METRICS];
} outs;

/* The problem and the call's choices, decoded once from the input. */
typedef struct prob {
    const uint8_t *o; /* the 16 option bytes */
    int64_t N, H, V;
    float h[16 * 8], w[16 * 8], adv[16], old[16], ref[16], isw[16];
    int64_t tgt[16], seq[16];
    uint8_t mask[16];
    int alias_out, alias_in; /* -1: none; else an output slot placed on an input slot's bytes */
    int extreme;             /* 0: none; 1..7 the coefficient set to EXTREMES[o[14] >> 4 & 7] */
} prob;

/* One call on kernel with every output in o. */
static sph_status run(const prob *q, const char *kernel, outs *out) {
    const uint8_t *o = q->o, flags = o[4], bad = o[5];
    const int64_t N = q->N, H = q->H, V = q->V;
    int64_t sh_h[2] = {N, H}, sh_w[2] = {V, H}, sh_n[1] = {N}, sh_bad[1] = {N + 1};
    int64_t sh_s[2] = {N, 3}, sh_m[1] = {SPH_POLICY_N_METRICS}, sh_dh[2] = {N, H},
            sh_dw[2] = {V, H};
    const sph_device cpu = {SPH_DEVICE_CPU, 0};
#define TEN(data, nd, dt, shape) {(void *)(data), cpu, nd, dt, shape, NULL, 0}
    sph_tensor th = TEN(q->h, 2, SPH_F32, sh_h), tw = TEN(q->w, 2, SPH_F32, sh_w);
    sph_tensor tt = TEN(q->tgt, 1, SPH_I64, sh_n), tmk = TEN(q->mask, 1, SPH_U8, sh_n);
    sph_tensor tl = TEN(out->lp, 1, SPH_F32, sh_n), te = TEN(out->ent, 1, SPH_F32, sh_n);
    sph_tensor ts = TEN(out->stats, 2, SPH_F32, sh_s), tdh = TEN(out->dh, 2, SPH_F32, sh_dh);
    sph_tensor tdw = TEN(out->dw, 2, SPH_F32, sh_dw), tmet = TEN(out->met, 1, SPH_F32, sh_m);
    sph_tensor ta = TEN(q->adv, 1, SPH_F32, sh_n), to = TEN(q->old, 1, SPH_F32, sh_n);
    sph_tensor tr = TEN(q->ref, 1, SPH_F32, sh_n), ti = TEN(q->isw, 1, SPH_F32, sh_n);
    sph_tensor tq = TEN(q->seq, 1, SPH_I64, sh_n);
#undef TEN
    /* at most one deliberate defect of a tensor (most inputs have none) */
    if (bad == 1) ta.shape = sh_bad;
    if (bad == 2) to.dtype = SPH_F64;
    if (bad == 3) tq.dtype = SPH_I32;
    if (bad == 4) tmet.shape = sh_n;
    if (bad == 5) tr.device.type = SPH_DEVICE_CUDA;
    if (bad == 6) ti.ndim = 2;
    sph_head_args a = SPH_HEAD_ARGS_INIT;
    a.hidden = &th, a.weight = &tw, a.targets = (flags & 1) ? NULL : &tt;
    a.active_mask = (flags & 2) ? &tmk : NULL;
    a.logprob = (flags & 4) ? NULL : &tl;
    a.entropy = (flags & 8) ? &te : NULL;
    a.stats = (flags & 16) ? &ts : NULL;
    a.dhidden = (flags & 32) ? &tdh : NULL;
    a.dweight = (flags & 64) ? &tdw : NULL;
    a.accumulate_dhidden = (flags & 128) && (o[6] & 1);
    a.temperature = (o[6] & 2) ? 0.7 : 1.0;
    a.softcap = (o[6] & 4) ? 2.5 : 0.0;
    if (bad == 7) a.dlogprob = &ta;
    /* aliasing: output slot alias_out onto the bytes of slot alias_in (inputs first) */
    if (q->alias_out >= 0) {
        sph_tensor *in[7] = {&th, &tw, &tt, &ta, &to, &tmk, &tl};
        sph_tensor *outt[6] = {&tl, &te, &ts, &tdh, &tdw, &tmet};
        if (outt[q->alias_out] != in[q->alias_in]) outt[q->alias_out]->data = in[q->alias_in]->data;
    }
    sph_policy_args p = SPH_POLICY_ARGS_INIT;
    p.loss = (sph_pg_loss)(o[7] % 4); /* 3: invalid */
    p.kl = (sph_kl_kind)(o[8] % 5);   /* 4: invalid */
    p.agg = (sph_loss_agg)(o[9] % 5); /* 4: invalid */
    p.clip_low = REALS[o[10] & 15], p.clip_high = REALS[o[10] >> 4];
    p.clip_ratio_c = (o[11] & 16) ? HUGE_VAL : REALS[o[11] & 15];
    p.kl_coef = REALS[o[12] & 15], p.entropy_coef = REALS[o[12] >> 4];
    p.num_tokens = COUNTS[o[13] & 7], p.num_seqs = COUNTS[(o[13] >> 3) & 7];
    p.norm_length = REALS[o[14] & 15];
    p.advantages = (o[15] & 1) ? NULL : &ta;
    p.old_logprob = &to;
    p.ref_logprob = (o[15] & 2) ? NULL : &tr;
    p.is_weight = (o[15] & 4) ? &ti : NULL;
    p.seq_id = (o[15] & 8) ? NULL : &tq;
    p.metrics = (o[15] & 16) ? NULL : &tmet;
    if (o[15] & 32) p.struct_size = 8;
    const double ex = EXTREMES[(o[14] >> 4) & 7];
    switch (q->extreme) {
    case 1: p.clip_low = ex; break;
    case 2: p.clip_high = ex; break;
    case 3: p.clip_ratio_c = ex; break;
    case 4: p.kl_coef = ex; break;
    case 5: p.entropy_coef = ex; break;
    case 6: p.norm_length = ex; break;
    case 7: p.entropy_coef = 1e30, p.norm_length = 1e-10; break;
    default: break;
    }
    sph_ctx_opts co = SPH_CTX_OPTS_INIT;
    co.force_kernel = kernel;
    co.num_threads = 1;
    sph_ctx_t ctx = NULL;
    sph_status st = sph_ctx_create(&ctx, &co);
    CHECK(st == SPH_OK);
    size_t bytes = 0;
    st = sph_policy_loss_workspace_size(ctx, &a, &p, &bytes);
    if (st == SPH_OK) {
        CHECK(bytes < ((size_t)64 << 20));
        void *ws = malloc(bytes + 1);
        CHECK(ws != NULL);
        memset(ws, 0xa5, bytes + 1);
        st = sph_policy_loss(ctx, &a, &p, ws, bytes);
        free(ws);
    }
    sph_ctx_destroy(ctx);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 16) return 0;
    static prob q;
    buf b = {data + 16, size - 16};
    const uint8_t *o = data;
    q.o = o;
    q.N = o[0] % 17, q.H = 1 + o[1] % 8, q.V = 1 + (o[1] >> 3) % 16;
    const int64_t N = q.N, H = q.H, V = q.V;
    for (int64_t k = 0; k < N * H; k++) q.h[k] = (float)((k * 37 + o[2]) % 23) / 11.0f - 1.0f;
    for (int64_t k = 0; k < V * H; k++) q.w[k] = (float)((k * 53 + o[3]) % 19) / 9.0f - 1.0f;
    for (int64_t i = 0; i < N; i++) {
        uint8_t m = byte_of(&b);
        q.mask[i] = m & 1;
        q.tgt[i] = (m >> 1) % 8 == 7 ? -100 : (int64_t)((m >> 1) % (uint8_t)V);
        if (m == 0xff) q.tgt[i] = V; /* out of range on purpose */
        q.seq[i] = (int64_t)(byte_of(&b) % 5) - 1;
        q.adv[i] = float_of(&b), q.old[i] = float_of(&b), q.ref[i] = float_of(&b);
        q.isw[i] = float_of(&b);
    }
    /* aliasing and extreme coefficients: chosen by bytes older inputs of the corpus lack */
    const uint8_t al = byte_of(&b);
    q.alias_out = al >= 128 ? al % 6 : -1;
    q.alias_in = (al >> 3) % 7;
    q.extreme = o[11] >> 5;
    const int accumulate = (o[4] & 128) && (o[6] & 1), masked = (o[4] & 2) != 0;
    /* the alias only where it is in effect: both tensors passed, both regions non-empty */
    size_t in_bytes = 0;
    void *in_buf = NULL;
    if (q.alias_out >= 0) {
        const uint8_t f = o[4];
        const int out_given[6] = {!(f & 4), (f & 8) != 0, (f & 16) != 0, (f & 32) != 0,
                                  (f & 64) != 0, !(o[15] & 16)};
        const size_t out_b[6] = {(size_t)N * 4, (size_t)N * 4, (size_t)N * 12,
                                 (size_t)(N * H) * 4, (size_t)(V * H) * 4,
                                 SPH_POLICY_N_METRICS * 4};
        const int in_given[7] = {1, 1, !(f & 1), !(o[15] & 1), 1, (f & 2) != 0, !(f & 4)};
        const size_t in_b[7] = {(size_t)(N * H) * 4, (size_t)(V * H) * 4, (size_t)N * 8,
                                (size_t)N * 4, (size_t)N * 4, (size_t)N, (size_t)N * 4};
        void *bufs[7] = {q.h, q.w, q.tgt, q.adv, q.old, q.mask, NULL};
        const int same = q.alias_in == 6 && q.alias_out == 0; /* logprob onto itself */
        if (same || !out_given[q.alias_out] || !in_given[q.alias_in] || !out_b[q.alias_out] ||
            !in_b[q.alias_in])
            q.alias_out = -1;
        in_bytes = in_b[q.alias_in];
        in_buf = bufs[q.alias_in];
    }
    static unsigned char in_before[16 * 8 * 4];
    if (q.alias_out >= 0 && in_buf) memcpy(in_before, in_buf, in_bytes);
    /* a coefficient beyond the float rule (odd EXTREMES slots; 7: -c eta beyond float, with
     * seq-mean-token-sum-norm) must be refused */
    const int must_refuse = q.alias_out >= 0 ||
                            (q.extreme >= 1 && q.extreme <= 6 && ((o[14] >> 4) & 1)) ||
                            (q.extreme == 7 && o[9] % 5 == 3);
    static outs r[2], before;
    sph_status st[2];
    const char *kernels[2] = {"ref", NULL};
    for (int k = 0; k < 2; k++) {
        memset(&r[k], 0x7f, sizeof r[k]); /* poison: a NaN pattern */
        if (accumulate) memset(r[k].dh, 0, sizeof r[k].dh);
        before = r[k];
        st[k] = run(&q, kernels[k], &r[k]);
        if (must_refuse) CHECK(st[k] != SPH_OK);
        if (st[k] != SPH_OK && q.alias_out >= 0 && in_buf)
            CHECK(memcmp(in_before, in_buf, in_bytes) == 0);
        if (st[k] != SPH_OK) {
            CHECK(sph_last_error()[0] != '\0');
            CHECK(st[k] != SPH_ERR_INTERNAL);
            CHECK(memcmp(&before, &r[k], sizeof before) == 0);
        }
    }
    CHECK(st[0] == st[1]);
    if (st[0] != SPH_OK) return 0;
    /* success: rows without loss carry zeros; both kernels close on finite inputs */
    int finite = 1;
    for (int64_t i = 0; i < N; i++) {
        int act = (!masked || q.mask[i]) && q.tgt[i] >= 0;
        if (!act) {
            if (!(o[4] & 4)) CHECK(r[0].lp[i] == 0.0f && r[1].lp[i] == 0.0f);
            if ((o[4] & 32) && !accumulate)
                for (int64_t k = 0; k < H; k++) CHECK(r[1].dh[i * H + k] == 0.0f);
            continue;
        }
        finite &= isfinite(q.adv[i]) && isfinite(q.old[i]);
    }
    if (!finite || (o[15] & 16)) return 0;
    for (int m = 0; m < SPH_POLICY_N_METRICS; m++) {
        float x = r[0].met[m], y = r[1].met[m];
        if (!isfinite(x) || fabsf(x) > 1e30f) return 0; /* huge coefficients may overflow */
        CHECK(isfinite(y));
        CHECK(fabsf(x - y) <= 1e-3f * (1.0f + fabsf(x)));
    }
    return 0;
}
