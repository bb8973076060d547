/*
 * distill.c - the fused distillation loss call (sph_distill_loss): the head's tensors and the
 * teacher's consumed from DLPack, the scalar configuration converted with spanhead's
 * exceptions, the workspace from the Python allocator, the call without the GIL.
 */
#include "_spanhead.h"

#include <string.h>

enum {
    D_HIDDEN, D_WEIGHT, D_MASK, D_DHIDDEN, D_DWEIGHT, D_TH, D_TW, D_IDS, D_LP, D_DLOSS, D_LOSS,
    D_TROWS, D_TTROWS, D_COUNT
};
static const char *const names[D_COUNT] = {
    "hidden", "weight", "loss_mask", "dhidden", "dweight", "teacher_hidden", "teacher_weight",
    "teacher_topk_ids", "teacher_topk_logprobs", "dloss", "loss", "temperature_rows",
    "teacher_temperature_rows"};
static int is_output(int i, int arg) {
    (void)arg;
    return i == D_DHIDDEN || i == D_DWEIGHT || i == D_LOSS;
}

/* distill_loss(ctx, tensors: tuple of 13, spans, workspace_alloc, vocab_start, vocab_total,
 *              temperature, softcap, acc_dh, acc_dw, allreduce_dh,
 *              (kind, beta, teacher_temperature, reduction, num_tokens), seq_comm|None)
 *              -> workspace bytes used */
PyObject *py_distill_loss(PyObject *self, PyObject *args) {
    PyObject *ctx_obj, *tensors, *spans_obj, *alloc, *v0_obj, *vt_obj, *temp_obj, *cap_obj, *cfg;
    PyObject *comm_obj = Py_None;
    int acc_dh, acc_dw, allred;
    if (!PyArg_ParseTuple(args, "OO!OOOOOOiiiO!|O", &ctx_obj, &PyTuple_Type, &tensors,
                          &spans_obj, &alloc, &v0_obj, &vt_obj, &temp_obj, &cap_obj, &acc_dh,
                          &acc_dw, &allred, &PyTuple_Type, &cfg, &comm_obj))
        return NULL;
    sph_distill_args d = SPH_DISTILL_ARGS_INIT;
    sph_head_args a = SPH_HEAD_ARGS_INIT;
    int kind, red;
    if (head_scalars(&a, v0_obj, vt_obj, temp_obj, cap_obj, acc_dh, acc_dw, allred) < 0)
        return NULL;
    if (PyTuple_Size(cfg) != 5) {
        PyErr_SetString(PyExc_TypeError, "distill_loss: expected a 5-tuple configuration");
        return NULL;
    }
    if (arg_int(PyTuple_GetItem(cfg, 0), "kind", &kind) < 0 ||
        arg_double(PyTuple_GetItem(cfg, 1), "beta", &d.beta) < 0 ||
        arg_double(PyTuple_GetItem(cfg, 2), "teacher_temperature", &d.teacher_temperature) < 0 ||
        arg_int(PyTuple_GetItem(cfg, 3), "reduction", &red) < 0 ||
        arg_i64(PyTuple_GetItem(cfg, 4), "num_tokens", &d.num_tokens) < 0)
        return NULL;
    d.kind = (sph_distill_kind)kind;
    d.reduction = (sph_reduction)red;
    if (comm_obj != Py_None) {
        d.seq_comm = comm_of(comm_obj);
        if (!d.seq_comm) return NULL;
    }
    NEED(sph_distill_loss_workspace_size);
    NEED(sph_distill_loss);
    sph_ctx_t ctx = ctx_of(ctx_obj);
    if (!ctx) return NULL;
    if (PyTuple_Size(tensors) != D_COUNT) {
        PyErr_Format(PyExc_TypeError, "distill_loss: expected %d tensor slots", (int)D_COUNT);
        return NULL;
    }
    consumed slots[D_COUNT], sp, ws;
    memset(slots, 0, sizeof slots);
    memset(&sp, 0, sizeof sp);
    memset(&ws, 0, sizeof ws);
    PyObject *res = NULL, *ws_cap = NULL;
    int have[D_COUNT];
    if (consume_slots(tensors, D_COUNT, names, is_output, 0, slots, have) < 0) goto done;
    if (consume_spans(spans_obj, &sp, &a.spans, &a.n_spans) < 0) goto done;
#define T(i) (have[i] ? &slots[i].t : NULL)
    a.hidden = T(D_HIDDEN);
    a.weight = T(D_WEIGHT);
    a.active_mask = T(D_MASK);
    a.dhidden = T(D_DHIDDEN);
    a.dweight = T(D_DWEIGHT);
    d.teacher_hidden = T(D_TH);
    d.teacher_weight = T(D_TW);
    d.teacher_topk_ids = T(D_IDS);
    d.teacher_topk_logprobs = T(D_LP);
    d.dloss = T(D_DLOSS);
    d.loss = T(D_LOSS);
    a.temperature_rows = T(D_TROWS);
    d.teacher_temperature_rows = T(D_TTROWS);
#undef T
    size_t bytes = 0;
    sph_status s = lib.sph_distill_loss_workspace_size(ctx, &a, &d, &bytes);
    if (s) {
        raise_lib(s);
        goto done;
    }
    void *wptr;
    size_t wbytes;
    if (consume_workspace(alloc, bytes, "distill_loss", &ws_cap, &ws, &wptr, &wbytes) < 0)
        goto done;
    SPH_NOGIL(s = lib.sph_distill_loss(ctx, &a, &d, wptr, wbytes));
    if (s) {
        raise_lib(s);
        goto done;
    }
    res = PyLong_FromUnsignedLongLong((unsigned long long)bytes);
done:
    release_slots(slots, D_COUNT, &sp, &ws);
    Py_XDECREF(ws_cap);
    return res;
}
