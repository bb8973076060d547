/*
 * policy.c - the fused RL policy loss call (sph_policy_loss): the head's tensors and the
 * policy's per-row tensors consumed from DLPack, the scalar configuration converted with
 * spanhead's exceptions, the workspace from the Python allocator, the call without the GIL.
 */
#include "_spanhead.h"

#include <math.h>
#include <string.h>

enum {
    P_HIDDEN, P_WEIGHT, P_TARGETS, P_MASK, P_LOGPROB, P_ENTROPY, P_STATS, P_DHIDDEN, P_DWEIGHT,
    P_ADV, P_OLD, P_REF, P_ISW, P_SEQ, P_METRICS, P_TROWS, P_SUMP2, P_TKI, P_TKL, P_COUNT
};
static const char *const names[P_COUNT] = {
    "hidden",  "weight",     "targets",     "loss_mask",   "logprob",    "entropy",
    "stats",   "dhidden",    "dweight",     "advantages",  "old_logprobs", "ref_logprobs",
    "is_weights", "seq_ids", "metrics", "temperature_rows", "sum_p2", "topk_ids",
    "topk_logprobs"};
static int is_output(int i, int arg) {
    (void)arg;
    return (i >= P_LOGPROB && i <= P_DWEIGHT) || i == P_METRICS || i >= P_SUMP2;
}

/* policy_loss(ctx, tensors: tuple of 19 (the last three the head's extras: sum_p2, topk_ids,
 *             topk_logprobs, or None), spans, workspace_alloc, vocab_start, vocab_total,
 *             temperature, softcap, acc_dh, acc_dw, allreduce_dh,
 *             (loss, clip_low, clip_high, clip_ratio_c, kl, kl_coef, entropy_coef, agg,
 *              num_tokens, num_seqs, norm_length), seq_comm|None) -> workspace bytes used */
PyObject *py_policy_loss(PyObject *self, PyObject *args) {
    PyObject *ctx_obj, *tensors, *spans_obj, *alloc, *v0_obj, *vt_obj, *temp_obj, *cap_obj,
        *cfg, *comm_obj;
    int acc_dh, acc_dw, allred;
    if (!PyArg_ParseTuple(args, "OO!OOOOOOiiiO!O", &ctx_obj, &PyTuple_Type, &tensors,
                          &spans_obj, &alloc, &v0_obj, &vt_obj, &temp_obj, &cap_obj, &acc_dh,
                          &acc_dw, &allred, &PyTuple_Type, &cfg, &comm_obj))
        return NULL;
    sph_policy_args p = SPH_POLICY_ARGS_INIT;
    sph_head_args a = SPH_HEAD_ARGS_INIT;
    int loss, kl, agg;
    if (head_scalars(&a, v0_obj, vt_obj, temp_obj, cap_obj, acc_dh, acc_dw, allred) < 0)
        return NULL;
    if (PyTuple_Size(cfg) != 11) {
        PyErr_SetString(PyExc_TypeError, "policy_loss: expected an 11-tuple configuration");
        return NULL;
    }
    if (arg_int(PyTuple_GetItem(cfg, 0), "loss_type", &loss) < 0 ||
        arg_double(PyTuple_GetItem(cfg, 1), "clip_low", &p.clip_low) < 0 ||
        arg_double(PyTuple_GetItem(cfg, 2), "clip_high", &p.clip_high) < 0 ||
        arg_double(PyTuple_GetItem(cfg, 3), "clip_ratio_c", &p.clip_ratio_c) < 0 ||
        arg_int(PyTuple_GetItem(cfg, 4), "kl_type", &kl) < 0 ||
        arg_double(PyTuple_GetItem(cfg, 5), "kl_coef", &p.kl_coef) < 0 ||
        arg_double(PyTuple_GetItem(cfg, 6), "entropy_coef", &p.entropy_coef) < 0 ||
        arg_int(PyTuple_GetItem(cfg, 7), "agg", &agg) < 0 ||
        arg_i64(PyTuple_GetItem(cfg, 8), "num_tokens", &p.num_tokens) < 0 ||
        arg_i64(PyTuple_GetItem(cfg, 9), "num_seqs", &p.num_seqs) < 0 ||
        arg_double(PyTuple_GetItem(cfg, 10), "norm_length", &p.norm_length) < 0)
        return NULL;
    p.loss = (sph_pg_loss)loss;
    p.kl = (sph_kl_kind)kl;
    p.agg = (sph_loss_agg)agg;
    if (comm_obj != Py_None) {
        p.seq_comm = comm_of(comm_obj);
        if (!p.seq_comm) return NULL;
    }
    NEED(sph_policy_loss_workspace_size);
    NEED(sph_policy_loss);
    sph_ctx_t ctx = ctx_of(ctx_obj);
    if (!ctx) return NULL;
    if (PyTuple_Size(tensors) != P_COUNT) {
        PyErr_Format(PyExc_TypeError, "policy_loss: expected %d tensor slots", (int)P_COUNT);
        return NULL;
    }
    consumed slots[P_COUNT], sp, ws;
    memset(slots, 0, sizeof slots);
    memset(&sp, 0, sizeof sp);
    memset(&ws, 0, sizeof ws);
    PyObject *res = NULL, *ws_cap = NULL;
    int have[P_COUNT];
    if (consume_slots(tensors, P_COUNT, names, is_output, 0, slots, have) < 0) goto done;
    if (consume_spans(spans_obj, &sp, &a.spans, &a.n_spans) < 0) goto done;
#define T(i) (have[i] ? &slots[i].t : NULL)
    a.hidden = T(P_HIDDEN);
    a.weight = T(P_WEIGHT);
    a.targets = T(P_TARGETS);
    a.active_mask = T(P_MASK);
    a.logprob = T(P_LOGPROB);
    a.entropy = T(P_ENTROPY);
    a.stats = T(P_STATS);
    a.dhidden = T(P_DHIDDEN);
    a.dweight = T(P_DWEIGHT);
    a.temperature_rows = T(P_TROWS);
    a.sum_p2 = T(P_SUMP2);
    a.topk_ids = T(P_TKI);
    a.topk_logprobs = T(P_TKL);
    p.advantages = T(P_ADV);
    p.old_logprob = T(P_OLD);
    p.ref_logprob = T(P_REF);
    p.is_weight = T(P_ISW);
    p.seq_id = T(P_SEQ);
    p.metrics = T(P_METRICS);
#undef T
    size_t bytes = 0;
    sph_status s = lib.sph_policy_loss_workspace_size(ctx, &a, &p, &bytes);
    if (s) {
        raise_lib(s);
        goto done;
    }
    void *wptr;
    size_t wbytes;
    if (consume_workspace(alloc, bytes, "policy_loss", &ws_cap, &ws, &wptr, &wbytes) < 0)
        goto done;
    SPH_NOGIL(s = lib.sph_policy_loss(ctx, &a, &p, wptr, wbytes));
    if (s) {
        raise_lib(s);
        goto done;
    }
    res = PyLong_FromUnsignedLongLong((unsigned long long)bytes);
done:
    release_slots(slots, P_COUNT, &sp, &ws);
    Py_XDECREF(ws_cap);
    return res;
}
