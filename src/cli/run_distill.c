/*
 * run_distill.c - `spanhead run --distill forward-kl|reverse-kl|jsd --inputs DIR ...`: the fused
 * distillation loss (sph_distill_loss, docs/distill.md) on the .npy files of DIR, on the CPU
 * or a CUDA device, in one call: the loss, dhidden and dweight. --check runs the float64
 * reference (force_kernel "ref") on the same inputs and exits 1 when a relative error exceeds
 * the tolerance; --outputs writes loss.json, dhidden.npy and dweight.npy, all of them or none
 * (after the check passed), through the staged output set (outset.c).
 *
 * DIR: hidden.npy (N, H), weight.npy (V, H) (f4, f2, or u2 bits with --dtype bf16|f16),
 * mask.npy (N) u1/b1 (optional: all rows), temperature.npy (N) f4 (optional: one temperature
 * per row instead of --temperature), and the teacher: teacher_hidden.npy (N, H_T) +
 * teacher_weight.npy (V, H_T) (the student's dtype rules; teacher_temperature.npy (N) f4,
 * optional: its per-row temperature instead of --teacher-temperature), or teacher_topk_ids.npy (N, K) int +
 * teacher_topk_logprobs.npy (N, K) f4 (f8 converted). Under mpirun (or with --tp),
 * run_distill_dist.c takes over: the world is one TP group of vocabulary shards.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "json_util.h"
#include "msg.h"
#include "npy.h"
#include "num.h"
#include "run_distill.h"
#include "run_loss.h"

#define CMD "run"

static const char *const k_kinds[] = {"forward-kl", "reverse-kl", "jsd", NULL};
static const char *const k_reds[] = {"mean", "sum", "none", NULL};

#define O(f) offsetof(dst_opts, f)
const sph_cli_opt sph_cli_distill_opts[] = {
    {"--inputs", "DIR", SPH_OPT_STR, O(inputs), 0, 0, 0, 0, NULL, 0,
     "hidden weight .npy, mask temperature .npy where present, and teacher_hidden +\n"
     "teacher_weight (+ teacher_temperature) .npy or teacher_topk_ids +\n"
     "teacher_topk_logprobs .npy"},
    {"--outputs", "DIR", SPH_OPT_STR, O(outputs), 0, 0, 0, 0, NULL, 0,
     "write loss.json, dhidden.npy, dweight.npy: all of them after the run\n"
     "(and --check) succeeded, or none"},
    {"--distill", "forward-kl|reverse-kl|jsd", SPH_OPT_CHOICE, O(kind), 0, 0, 0, 0, k_kinds, 0,
     "the divergence of the student from the teacher"},
    {"--beta", "B", SPH_OPT_F64, O(beta), 0, 0, 0, 0, NULL, SPH_OPTF_ANY,
     "jsd's beta in [0, 1] (default 0.5; 0 = forward KL, 1 = reverse KL)"},
    {"--teacher-temperature", "T", SPH_OPT_F64, O(tt), 0, 0, 0, 0, NULL, SPH_OPTF_ANY,
     "dense teacher's temperature (default: the student's; or\n"
     "teacher_temperature.npy, one per row)"},
    {"--reduction", "mean|sum|none", SPH_OPT_CHOICE, O(red), 0, 0, 0, 0, k_reds, 0,
     "over the active rows (default mean); none: loss.json lists every row"},
    RUN_LOSS_HEAD_ROWS(dst_opts),
    {"--num-tokens", "T", SPH_OPT_I64, O(num_tokens), 1, INT64_MAX, 0, 0, NULL, 0,
     "reduction mean's divisor: a global batch's active rows (default: counted)"},
    {"--tp", "T", SPH_OPT_I64, O(tp), 1, 4096, 0, 0, NULL, 0,
     "under mpirun: vocabulary shards (TP groups of T ranks)"},
    {"--cp", "C", SPH_OPT_I64, O(cp), 1, 4096, 0, 0, NULL, 0,
     "under mpirun: the rows cut into C pieces over a seq_comm group (CP)"},
    {NULL}};
#undef O

static const char k_synopsis[] =
    "usage: spanhead run --inputs DIR [--outputs DIR] --distill forward-kl|reverse-kl|jsd "
    "[options]";
static const char k_about[] =
    "The fused distillation loss: forward KL, reverse KL or generalized JSD of the student's\n"
    "distribution against a dense teacher head or the teacher's sparse top-k log-probs, and\n"
    "dhidden, dweight, in one call of the LM head (docs/distill.md).";

void dst_usage(FILE *f) {
    sph_cli_usage(f, k_synopsis, k_about, sph_cli_distill_opts, SPH_CLI_EXIT_STATUS);
}

// ---- inputs ---------------------------------------------------------------------------------

void dst_problem_free(dst_problem *p) {
    free(p->h), free(p->w), free(p->th), free(p->tw), free(p->mask), free(p->ids), free(p->lp);
    free(p->trows), free(p->ttrows);
    memset(p, 0, sizeof *p);
}

/* A float matrix (rows, cols = 0: any) in the problem's input dtype rules: f4, f2, or u2
 * bits (bf16 / f16 per --dtype). Takes a's data. */
static int float_matrix(const dst_opts *o, const char *name, npy_array *a, int64_t rows,
                        int64_t cols, int *bits, int *is_bf16, void **out) {
    if (a->ndim != 2 || (rows && a->shape[0] != rows) || (cols && a->shape[1] != cols))
        return sph_cli_fail(CMD, 1, "%s.npy: shape has %d dims (%lld, %lld), expected (%lld, %s)",
                            name, a->ndim, (long long)a->shape[0],
                            (long long)(a->ndim > 1 ? a->shape[1] : 0), (long long)rows,
                            cols ? "the columns of its pair" : "H");
    if (a->kind == 'f' && a->bytes == 4) {
        *bits = 32, *is_bf16 = 0;
    } else if (a->kind == 'f' && a->bytes == 2) {
        *bits = 16, *is_bf16 = 0;
    } else if (a->kind == 'u' && a->bytes == 2 && o->dtype_given && o->dtype > 0) {
        *bits = 16, *is_bf16 = o->dtype == 1;
    } else {
        return sph_cli_fail(CMD, 1, "%s.npy: dtype %s, expected <f4, <f2, or <u2 with --dtype "
                                    "bf16|f16", name, npy_descr(a));
    }
    *out = a->data;
    a->data = NULL;
    return 0;
}

/* DIR/<name>.npy, when present: one temperature per row ((N) f4, f8 converted), exclusive with
 * its option (given: the option was set). 0 (*out NULL when absent) or 1 (message printed). */
static int temp_rows(const dst_opts *o, const dst_problem *p, const char *name,
                     const char *option, int given, float **out) {
    npy_array t = {0};
    const int r = run_loss_read(o->inputs, name, &t);
    if (r <= 0) return r < 0;
    const int bad = t.kind != 'f' || (t.bytes != 4 && t.bytes != 8) || t.ndim != 1 ||
                    t.shape[0] != p->N;
    int rc = 1;
    if (bad)
        sph_cli_fail(CMD, 1, "%s.npy: %s of %d dims, expected <f4 (or <f8) (N = %lld)", name,
                     npy_descr(&t), t.ndim, (long long)p->N);
    else if (given)
        sph_cli_fail(CMD, 1, "%s.npy and %s: give one (the file holds one temperature per row)",
                     name, option);
    else if (!(*out = sph_cli_alloc(p->N, 4)))
        sph_cli_fail(CMD, 1, "out of memory");
    else {
        for (int64_t i = 0; i < p->N; i++)
            (*out)[i] = t.bytes == 4 ? ((float *)t.data)[i] : (float)((double *)t.data)[i];
        rc = 0;
    }
    npy_free(&t);
    return rc;
}

int dst_problem_read(const dst_opts *o, dst_problem *p) {
    memset(p, 0, sizeof *p);
    npy_array a[6];
    memset(a, 0, sizeof a);
    const char *names[6] = {"hidden", "weight", "teacher_hidden", "teacher_weight",
                            "teacher_topk_ids", "teacher_topk_logprobs"};
    int got[6], rc = 1;
    for (int k = 0; k < 6; k++)
        if ((got[k] = run_loss_read(o->inputs, names[k], &a[k])) < 0) goto done;
    for (int k = 0; k < 2; k++)
        if (!got[k]) {
            sph_cli_fail(CMD, 1, "--inputs %s: %s.npy is missing", o->inputs, names[k]);
            goto done;
        }
    p->dense = got[2] || got[3];
    if (p->dense ? !(got[2] && got[3]) || got[4] || got[5] : !(got[4] && got[5])) {
        sph_cli_fail(CMD, 1, "--inputs %s: expected teacher_hidden.npy + teacher_weight.npy "
                             "(dense) or teacher_topk_ids.npy + teacher_topk_logprobs.npy "
                             "(sparse), exactly one pair", o->inputs);
        goto done;
    }
    int b2, f2;
    if (float_matrix(o, "hidden", &a[0], 0, 0, &p->bits, &p->is_bf16, &p->h)) goto done;
    p->N = a[0].shape[0], p->H = a[0].shape[1];
    if (float_matrix(o, "weight", &a[1], 0, p->H, &b2, &f2, &p->w)) goto done;
    p->V = a[1].shape[0];
    if (b2 != p->bits || f2 != p->is_bf16) {
        sph_cli_fail(CMD, 1, "weight.npy: dtype %s, expected hidden.npy's %s", npy_descr(&a[1]),
                     npy_descr(&a[0]));
        goto done;
    }
    if (p->dense) {
        int tb, tf;
        if (float_matrix(o, "teacher_hidden", &a[2], p->N, 0, &p->tbits, &tf, &p->th)) goto done;
        p->HT = a[2].shape[1];
        if (float_matrix(o, "teacher_weight", &a[3], p->V, p->HT, &tb, &tf, &p->tw)) goto done;
        if (tb != p->tbits || p->tbits != p->bits) {
            sph_cli_fail(CMD, 1, "teacher_hidden.npy / teacher_weight.npy: dtypes %s / %s, "
                                 "expected hidden.npy's %s", npy_descr(&a[2]), npy_descr(&a[3]),
                         npy_descr(&a[0]));
            goto done;
        }
    } else {
        if (a[4].kind != 'i' || (a[4].bytes != 4 && a[4].bytes != 8) || a[4].ndim != 2 ||
            a[4].shape[0] != p->N) {
            sph_cli_fail(CMD, 1, "teacher_topk_ids.npy: %s of %d dims, expected <i8 (or <i4) "
                                 "(N = %lld, K)", npy_descr(&a[4]), a[4].ndim, (long long)p->N);
            goto done;
        }
        p->K = a[4].shape[1];
        if (a[5].kind != 'f' || (a[5].bytes != 4 && a[5].bytes != 8) || a[5].ndim != 2 ||
            a[5].shape[0] != p->N || a[5].shape[1] != p->K) {
            sph_cli_fail(CMD, 1, "teacher_topk_logprobs.npy: %s of %d dims, expected <f4 (or "
                                 "<f8) (%lld, %lld) like teacher_topk_ids.npy",
                         npy_descr(&a[5]), a[5].ndim, (long long)p->N, (long long)p->K);
            goto done;
        }
        if (!(p->ids = sph_cli_alloc(p->N * p->K, 8)) || !(p->lp = sph_cli_alloc(p->N * p->K, 4))) {
            sph_cli_fail(CMD, 1, "out of memory");
            goto done;
        }
        for (int64_t e = 0; e < p->N * p->K; e++) {
            p->ids[e] = a[4].bytes == 8 ? ((int64_t *)a[4].data)[e] : ((int32_t *)a[4].data)[e];
            p->lp[e] = a[5].bytes == 4 ? ((float *)a[5].data)[e] : (float)((double *)a[5].data)[e];
        }
    }
    npy_array m = {0};
    int r = run_loss_read(o->inputs, "mask", &m);
    if (r < 0) goto done;
    if (r > 0) {
        if ((m.kind != 'u' && m.kind != 'b') || m.bytes != 1 || m.ndim != 1 || m.shape[0] != p->N) {
            sph_cli_fail(CMD, 1, "mask.npy: %s of %d dims, expected |u1 or |b1 (N = %lld)",
                         npy_descr(&m), m.ndim, (long long)p->N);
            npy_free(&m);
            goto done;
        }
        p->mask = m.data;
        m.data = NULL;
    }
    /* temperature.npy: one temperature per row instead of --temperature; likewise
     * teacher_temperature.npy (the dense teacher's) instead of --teacher-temperature */
    if (temp_rows(o, p, "temperature", "--temperature", o->temperature_given, &p->trows) ||
        temp_rows(o, p, "teacher_temperature", "--teacher-temperature", o->tt != 0,
                  &p->ttrows))
        goto done;
    rc = 0;
done:
    for (int k = 0; k < 6; k++) npy_free(&a[k]);
    if (rc) dst_problem_free(p);
    return rc;
}

// ---- one run --------------------------------------------------------------------------------

void dst_result_free(dst_result *r) {
    free(r->loss), free(r->dh), free(r->dw);
    memset(r, 0, sizeof *r);
}

enum { B_H, B_W, B_MASK, B_TH, B_TW, B_IDS, B_LP, B_TR, B_TTR, B_LOSS, B_DH, B_DW, B_COUNT };

static sph_status dst_size(const run_loss_call *c, size_t *bytes) {
    return sph_distill_loss_workspace_size(c->ctx, c->head, c->loss, bytes);
}

static sph_status dst_call(const run_loss_call *c, void *ws, size_t bytes) {
    return sph_distill_loss(c->ctx, c->head, c->loss, ws, bytes);
}

int dst_run(const dst_opts *o, const dst_problem *p, const dst_where *wh, dst_result *r) {
    memset(r, 0, sizeof *r);
    sph_ctx_t ctx = NULL;
    sph_device dev;
    run_loss_bufs b;
    memset(&b, 0, sizeof b);
    int rc = 1;
    sph_status s =
        run_loss_ctx(&ctx, &dev, wh->on_cuda, wh->dev_id, wh->threads, wh->kernel, wh->tp);
    if (s) goto fail;
    /* the rank's vocabulary rows [v0, v0 + V) of the problem's (all of them unsharded) */
    const int64_t N = p->N, H = p->H, HT = p->HT, K = p->K, v0 = wh->v0;
    const int64_t V = wh->V_loc ? wh->V_loc : p->V;
    const int64_t NL = o->red == 2 ? N : 1;
    const size_t es = (size_t)p->bits / 8;
    const sph_dtype in = p->bits == 32 ? SPH_F32 : (p->is_bf16 ? SPH_BF16 : SPH_F16);
    const run_loss_buf spec[B_COUNT] = {
        {p->h, (size_t)(N * H) * es, 2, N, H, in, 0},
        {(const char *)p->w + (size_t)(v0 * H) * es, (size_t)(V * H) * es, 2, V, H, in, 0},
        {p->mask, (size_t)N, 1, N, 0, SPH_U8, 0},
        {p->th, (size_t)(N * HT) * es, 2, N, HT, in, 0},
        {p->tw ? (const char *)p->tw + (size_t)(v0 * HT) * es : NULL, (size_t)(V * HT) * es, 2, V,
         HT, in, 0},
        {p->ids, (size_t)(N * K) * 8, 2, N, K, SPH_I64, 0},
        {p->lp, (size_t)(N * K) * 4, 2, N, K, SPH_F32, 0},
        {p->trows, (size_t)N * 4, 1, N, 0, SPH_F32, 0},
        {p->ttrows, (size_t)N * 4, 1, N, 0, SPH_F32, 0},
        {NULL, (size_t)NL * 4, 1, NL, 0, SPH_F32, 1},
        {NULL, (size_t)(N * H) * 4, 2, N, H, SPH_F32, 1},
        {NULL, (size_t)(V * H) * 4, 2, V, H, SPH_F32, 1}};
    if ((s = run_loss_bufs_make(ctx, dev, spec, B_COUNT, &b))) goto fail;
#define T(k) run_loss_tensor(&b, k)
    sph_head_args a = SPH_HEAD_ARGS_INIT;
    a.hidden = T(B_H), a.weight = T(B_W), a.active_mask = T(B_MASK);
    a.temperature = p->trows ? 1.0 : o->temperature, a.softcap = o->softcap;
    a.temperature_rows = T(B_TR);
    a.dhidden = T(B_DH), a.dweight = T(B_DW);
    a.vocab_start = v0, a.vocab_total = wh->tp ? p->V : 0;
    a.allreduce_dhidden = wh->tp != NULL; /* dhidden of the replicated rows: every shard's */
    sph_distill_args d = SPH_DISTILL_ARGS_INIT;
    d.kind = (sph_distill_kind)o->kind, d.beta = o->beta, d.teacher_temperature = o->tt;
    d.reduction = (sph_reduction)o->red;
    d.num_tokens = wh->num_tokens, d.seq_comm = wh->seq;
    d.teacher_hidden = T(B_TH), d.teacher_weight = T(B_TW);
    d.teacher_topk_ids = T(B_IDS), d.teacher_topk_logprobs = T(B_LP), d.loss = T(B_LOSS);
    d.teacher_temperature_rows = T(B_TTR);
#undef T
    const run_loss_call c = {ctx, &a, &d, dst_size, dst_call};
    if ((s = run_loss_timed(&c, wh->reps, &r->ws_bytes, &r->ms))) goto fail;
    int64_t nf = 0, first = -1;
    if ((s = sph_ctx_nonfinite(ctx, &nf, &first))) goto fail;
    if (nf) {
        sph_cli_fail(CMD, 1, "%lld active rows with non-finite statistics, the first row %lld",
                     (long long)nf, (long long)first);
        goto done;
    }
    snprintf(r->describe, sizeof r->describe, "%s", sph_ctx_describe(ctx));
    if (!(r->loss = sph_cli_alloc(NL, 4)) || !(r->dh = sph_cli_alloc(N * H, 4)) ||
        !(r->dw = sph_cli_alloc(V * H, 4))) {
        sph_cli_fail(CMD, 1, "out of memory");
        goto done;
    }
    if ((s = sph_ctx_memcpy(ctx, r->loss, b.buf[B_LOSS], spec[B_LOSS].bytes)) ||
        (s = sph_ctx_memcpy(ctx, r->dh, b.buf[B_DH], spec[B_DH].bytes)) ||
        (s = sph_ctx_memcpy(ctx, r->dw, b.buf[B_DW], spec[B_DW].bytes)))
        goto fail;
    rc = 0;
    goto done;
fail:
    run_loss_fail_status(wh->kernel, s);
done:
    run_loss_bufs_free(ctx, &b);
    sph_ctx_destroy(ctx);
    if (rc) dst_result_free(r);
    return rc;
}

// ---- check, outputs, report -----------------------------------------------------------------

static char *loss_json(const dst_opts *o, const dst_problem *p, const float *loss) {
    char *s = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&s, &len);
    if (!f) return NULL;
    fprintf(f, "{\"kind\": \"%s\", \"reduction\": \"%s\", ", k_kinds[o->kind], k_reds[o->red]);
    if (o->red == 2) {
        fputs("\"loss\": [", f);
        for (int64_t i = 0; i < p->N; i++) {
            if (i) fputs(", ", f);
            sph_cli_json_num(f, "%.9g", (double)loss[i]);
        }
        fputs("]}\n", f);
    } else {
        fputs("\"loss\": ", f);
        sph_cli_json_num(f, "%.9g", (double)loss[0]);
        fputs("}\n", f);
    }
    const int bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) {
        free(s);
        return NULL;
    }
    return s;
}

const char *const dst_out_files[] = {"loss.json", "dhidden.npy", "dweight.npy", NULL};

int dst_write_outputs(sph_cli_outset *os, const dst_opts *o, const dst_problem *p,
                         const dst_result *r) {
    sph_cli_outset s = *os; /* begun before the run; released here either way */
    memset(os, 0, sizeof *os);
    char *json = loss_json(o, p, r->loss);
    const int64_t nh[2] = {p->N, p->H}, vh[2] = {p->V, p->H};
    const int bad = !json || sph_cli_outset_text(&s, "loss.json", json) ||
                    sph_cli_outset_npy(&s, "dhidden", 'f', 4, 2, nh, r->dh) ||
                    sph_cli_outset_npy(&s, "dweight", 'f', 4, 2, vh, r->dw);
    int rc = run_loss_outputs_end(&s, json, bad);
    free(json);
    return rc;
}

void dst_report(const dst_opts *o, const dst_problem *p, const dst_result *r, int checked,
                   int passed, const double err[3], double tol) {
    int64_t act = 0;
    for (int64_t i = 0; i < p->N; i++) act += !p->mask || p->mask[i];
    const char *dt = p->bits == 32 ? "f32" : (p->is_bf16 ? "bf16" : "f16");
    const double shown = o->red == 2 ? NAN : (double)r->loss[0];
    if (o->json) {
        printf("{\"distill\":\"%s\",\"beta\":%.17g,\"reduction\":\"%s\",\"teacher\":\"%s\","
               "\"N\":%lld,\"H\":%lld,\"V\":%lld,\"H_T\":%lld,\"K\":%lld,\"active\":%lld,"
               "\"dtype\":\"%s\",\"device\":\"%s\",\"ms\":", k_kinds[o->kind], o->beta,
               k_reds[o->red], p->dense ? "dense" : "sparse", (long long)p->N, (long long)p->H,
               (long long)p->V, (long long)p->HT, (long long)p->K, (long long)act, dt,
               sph_cli_device_names[o->device]);
        sph_cli_json_num(stdout, "%.6g", r->ms);
        printf(",\"workspace_bytes\":%zu,\"loss\":", r->ws_bytes);
        sph_cli_json_num(stdout, "%.9g", shown);
        if (checked) {
            printf(",\"check\":{\"passed\":%s,\"tol\":%g,\"loss\":", passed ? "true" : "false", tol);
            sph_cli_json_num(stdout, "%.3g", err[0]);
            printf(",\"dhidden\":");
            sph_cli_json_num(stdout, "%.3g", err[1]);
            printf(",\"dweight\":");
            sph_cli_json_num(stdout, "%.3g", err[2]);
            printf("}");
        }
        printf("}\n");
        return;
    }
    printf("run: distill %s (beta %g, reduction %s, %s teacher), N=%lld H=%lld V=%lld active=%lld "
           "%s on %s\n", k_kinds[o->kind], o->beta, k_reds[o->red], p->dense ? "dense" : "sparse",
           (long long)p->N, (long long)p->H, (long long)p->V, (long long)act, dt,
           r->describe[0] ? r->describe : sph_cli_device_names[o->device]);
    printf("  one call: %.3f ms (median of %lld), workspace %.3g MiB\n", r->ms,
           (long long)o->repeats, (double)r->ws_bytes / 1048576.0);
    if (o->red != 2) printf("  loss %.9g\n", shown);
    if (checked)
        printf("  check vs float64 reference: loss %.2e dhidden %.2e dweight %.2e (tol %.0e): %s\n",
               err[0], err[1], err[2], tol, passed ? "PASS" : "FAIL");
}

int dst_opts_finish(dst_opts *o, const sph_cli_parsed *pp, char *msg, size_t n) {
    o->dtype_given = sph_cli_given(sph_cli_distill_opts, pp, "--dtype");
    o->temperature_given = sph_cli_given(sph_cli_distill_opts, pp, "--temperature");
    if (!o->inputs) return 2 * sph_cli_err(msg, n, "--distill needs --inputs DIR (see --help)");
    /* 0 is the library's "unset" (the student's temperature): here that is leaving it out */
    if (sph_cli_given(sph_cli_distill_opts, pp, "--teacher-temperature") && o->tt == 0)
        return 2 * sph_cli_err(msg, n, "--teacher-temperature: 0, expected T > 0 (leave it out "
                                       "for the student's temperature)");
    return 0;
}

void dst_opts_defaults(dst_opts *o) {
    memset(o, 0, sizeof *o);
    o->beta = 0.5, o->temperature = 1.0, o->repeats = 1, o->tp = 1, o->cp = 1;
}

int sph_cli_run_distill(int argc, char **argv) {
    dst_opts o;
    dst_opts_defaults(&o);
    sph_cli_parsed pp = {0};
    int rc;
    int done;
    rc = sph_cli_parse_or_exit(CMD, k_synopsis, k_about, sph_cli_distill_opts, argc, argv, &o,
                               &pp, &done);
    if (done) return rc;
    char msg[480];
    if (dst_opts_finish(&o, &pp, msg, sizeof msg)) return sph_cli_fail(CMD, 2, "%s", msg);
    dst_problem p;
    dst_result r, ref;
    sph_cli_outset os;
    memset(&r, 0, sizeof r), memset(&ref, 0, sizeof ref), memset(&os, 0, sizeof os);
    if ((rc = dst_problem_read(&o, &p))) goto out;
    if (o.outputs && sph_cli_outset_begin(&os, o.outputs, dst_out_files)) {
        rc = sph_cli_fail(CMD, 1, "%s", os.err);
        goto out;
    }
    const int on_cuda = o.device == 1;
    dst_where w = {on_cuda, o.kernel, o.threads, (int)o.repeats, NULL, 0, 0, NULL,
                   o.num_tokens, 0};
    if ((rc = dst_run(&o, &p, &w, &r))) goto out;
    double err[3] = {0}, tol = 0;
    int passed = 1;
    if (o.check) {
        dst_where wr = {0, "ref", 1, 0, NULL, 0, 0, NULL, o.num_tokens, 0};
        if ((rc = dst_run(&o, &p, &wr, &ref))) goto out;
        /* f32: well under 1e-4; bf16 / f16 on the GPU round dlogits to the input dtype */
        tol = p.bits == 32 ? 1e-4 : (on_cuda ? 2e-2 : 1e-4);
        err[0] = run_loss_rel(r.loss, ref.loss, o.red == 2 ? p.N : 1, 1e-6);
        err[1] = run_loss_rel(r.dh, ref.dh, p.N * p.H, 1e-30);
        err[2] = run_loss_rel(r.dw, ref.dw, p.V * p.H, 1e-30);
        passed = err[0] <= tol && err[1] <= tol && err[2] <= tol;
    }
    dst_report(&o, &p, &r, o.check, passed, err, tol);
    rc = passed ? 0 : 1;
    if (!rc && o.outputs) rc = dst_write_outputs(&os, &o, &p, &r);
    if (!rc && !o.json && o.outputs) printf("  outputs written to %s\n", o.outputs);
out:
    sph_cli_outset_abort(&os);
    dst_problem_free(&p);
    dst_result_free(&r), dst_result_free(&ref);
    return sph_cli_close_stdout(CMD, rc);
}
