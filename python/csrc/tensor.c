/*
 * tensor.c - DLPack consumption ("dltensor" and "dltensor_versioned" capsules turned into
 * sph_tensor views, kept alive for the call, their deleters called afterwards as the protocol
 * asks of a consumer) and the head call (forward / backward).
 */
#include "_spanhead.h"

#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* DLPack structures (the protocol's ABI, written from the specification)                    */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    sph_tensor dl_tensor; /* DLTensor */
    void *manager_ctx;
    void (*deleter)(void *self);
} dlpack_managed; /* DLManagedTensor */

typedef struct {
    uint32_t major, minor;
} dlpack_version;

typedef struct {
    dlpack_version version;
    void *manager_ctx;
    void (*deleter)(void *self);
    uint64_t flags;
    sph_tensor dl_tensor;
} dlpack_managed_v1; /* DLManagedTensorVersioned */

#define DLPACK_FLAG_READ_ONLY (UINT64_C(1) << 0)


/* ---------------------------------------------------------------------------------------- */
/* DLPack consumption                                                                         */
/* ---------------------------------------------------------------------------------------- */


void release(consumed *c) {
    if (c->managed && c->deleter) c->deleter(c->managed);
    c->managed = NULL;
    c->deleter = NULL;
}

int consume_slots(PyObject *tensors, int n, const char *const *names,
                  int (*is_out)(int i, int arg), int arg, consumed *slots, int *have) {
    for (int i = 0; i < n; i++) {
        have[i] = consume(PyTuple_GetItem(tensors, i), names[i], &slots[i]);
        if (have[i] < 0) return -1;
        if (have[i] && is_out(i, arg) && slots[i].read_only) {
            raise_fmt(SPH_ERR_INVALID_ARG, "%s: output tensor is read-only", names[i]);
            return -1;
        }
    }
    return 0;
}

void release_slots(consumed *slots, int n, consumed *a, consumed *b) {
    /* deleters may run the producer's Python code (NumPy drops its array reference): the GIL
     * is held here and a pending exception is kept around them */
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    for (int i = 0; i < n; i++) release(&slots[i]);
    if (a) release(a);
    if (b) release(b);
    PyErr_Restore(et, ev, tb);
}

/* Consumes obj: None (-> 0, nothing), a "dltensor"/"dltensor_versioned" capsule, or a tuple
 * (capsule, dtype_code, dtype_bits) that reinterprets the element type (same size). Returns
 * 1 when a tensor was consumed, 0 for None, -1 with an exception set. */
int consume(PyObject *obj, const char *name, consumed *c) {
    memset(c, 0, sizeof *c);
    if (obj == Py_None) return 0;
    PyObject *cap = obj;
    int override = 0, ocode = 0, obits = 0;
    if (PyTuple_Check(obj)) {
        if (!PyArg_ParseTuple(obj, "Oii", &cap, &ocode, &obits)) return -1;
        override = 1;
    }
    if (PyCapsule_IsValid(cap, "dltensor")) {
        dlpack_managed *m = PyCapsule_GetPointer(cap, "dltensor");
        if (!m) return -1;
        if (PyCapsule_SetName(cap, "used_dltensor") < 0) return -1;
        c->t = m->dl_tensor;
        c->managed = m;
        c->deleter = m->deleter;
    } else if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        dlpack_managed_v1 *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (!m) return -1;
        if (m->version.major != 1) {
            raise_fmt(SPH_ERR_UNSUPPORTED,
                      "%s: DLPack major version %u is not supported (expected 1)", name,
                      (unsigned)m->version.major);
            return -1;
        }
        if (PyCapsule_SetName(cap, "used_dltensor_versioned") < 0) return -1;
        c->t = m->dl_tensor;
        c->managed = m;
        c->deleter = m->deleter;
        c->read_only = (m->flags & DLPACK_FLAG_READ_ONLY) != 0;
    } else {
        PyErr_Format(PyExc_TypeError,
                     "%s: expected an unconsumed DLPack capsule (the capsule was already used, "
                     "or this is not a tensor)",
                     name);
        return -1;
    }
    /* A tensor without elements has no meaningful strides (NumPy exports 0 for them): drop
     * them, so an empty batch passes the library's row-stride checks. */
    for (int32_t d = 0; c->t.shape && d < c->t.ndim; d++)
        if (c->t.shape[d] == 0) c->t.strides = NULL;
    if (override) {
        if (c->t.dtype.lanes != 1 || c->t.dtype.bits != obits) {
            release(c);
            raise_fmt(SPH_ERR_DTYPE, "%s: cannot reinterpret %u-bit elements as %d-bit ones", name,
                      (unsigned)c->t.dtype.bits, obits);
            return -1;
        }
        c->t.dtype.code = (uint8_t)ocode;
    }
    return 1;
}

/* The optional host spans argument: None, or a capsule of a contiguous host int64 (n, 2)
 * array. 0 on success (spans / n_spans set, NULL / 0 for None), -1 with an exception set. */
int consume_spans(PyObject *obj, consumed *sp, const int64_t **spans, int64_t *n_spans) {
    *spans = NULL;
    *n_spans = 0;
    int have = consume(obj, "spans", sp);
    if (have <= 0) return have;
    sph_tensor *t = &sp->t;
    int ok = (t->device.type == SPH_DEVICE_CPU || t->device.type == SPH_DEVICE_CUDA_HOST) &&
             t->ndim == 2 && t->shape[1] == 2 && t->dtype.code == SPH_DTYPE_INT &&
             t->dtype.bits == 64 && t->dtype.lanes == 1 &&
             (t->strides == NULL || t->shape[0] <= 1 ||
              (t->strides[0] == 2 && t->strides[1] == 1)) &&
             (t->strides == NULL || t->shape[0] != 1 || t->strides[1] == 1);
    if (!ok) {
        raise_status(SPH_ERR_INVALID_ARG, "spans: expected a contiguous host int64 array of "
                                          "shape (n_spans, 2)");
        return -1;
    }
    *spans = (const int64_t *)((const char *)t->data + t->byte_offset);
    *n_spans = t->shape[0];
    return 0;
}

/* A workspace of `bytes` from the Python allocator (bytes > 0): the allocator's capsule in
 * *cap (a new reference), consumed into ws, its data and size. 0 on success. */
int consume_workspace(PyObject *alloc, size_t bytes, const char *what, PyObject **cap,
                      consumed *ws, void **ptr, size_t *wbytes) {
    *ptr = NULL;
    *wbytes = 0;
    if (bytes == 0) return 0;
    if (alloc == Py_None) {
        raise_fmt(SPH_ERR_WORKSPACE, "%s: the pass needs a workspace and no allocator was given",
                  what);
        return -1;
    }
    *cap = PyObject_CallFunction(alloc, "K", (unsigned long long)bytes);
    if (!*cap) return -1;
    int hw = consume(*cap, "workspace", ws);
    if (hw < 0) return -1;
    if (hw == 0 || ws->t.ndim != 1 || ws->t.dtype.bits != 8 || ws->t.dtype.lanes != 1 ||
        ws->t.shape[0] < (int64_t)bytes ||
        (ws->t.strides && ws->t.shape[0] > 1 && ws->t.strides[0] != 1)) {
        raise_fmt(SPH_ERR_WORKSPACE,
                  "%s: the workspace allocator must return a contiguous 1-d byte tensor of at "
                  "least the requested size", what);
        return -1;
    }
    *ptr = (char *)ws->t.data + ws->t.byte_offset;
    *wbytes = (size_t)ws->t.shape[0];
    return 0;
}

/* Tensor slots of the head call, in the order the Python layer passes them. */
enum {
    S_HIDDEN, S_WEIGHT, S_TARGETS, S_CAND, S_MASK, S_LOGPROB, S_ENTROPY, S_LSE, S_MEAN, S_STATS,
    S_DLOGPROB, S_DENTROPY, S_DLSE, S_DMEAN, S_DHIDDEN, S_DWEIGHT, S_SUMP2, S_TROWS, S_TOPKI,
    S_TOPKL, S_COUNT
};
static const char *const slot_names[S_COUNT] = {
    "hidden",   "weight",   "targets", "candidates", "active_mask", "logprob",
    "entropy",  "lse",      "logit_mean", "stats",   "dlogprob",    "dentropy",
    "dlse",     "dlogit_mean", "dhidden", "dweight", "sum_p2", "temperature_rows", "topk_ids",
    "topk_logprobs"};
static int slot_is_output(int i) {
    return (i >= S_LOGPROB && i <= S_STATS) || i == S_DHIDDEN || i == S_DWEIGHT || i >= S_SUMP2;
}

/* head(ctx, pass, tensors: tuple of 20 (the slots above), spans, workspace_alloc, vocab_start, vocab_total,
 *      temperature, softcap, acc_dh, acc_dw, allreduce_dh) -> workspace bytes used
 * The stats slot is an output of the forward and an input of the backward. workspace_alloc is
 * called with the byte count when it is > 0 and returns a capsule of at least that many bytes
 * on the context's device. spans is None or a capsule of a host int64 (n, 2) tensor. */
/* A slot the pass writes (the backward reads stats). */
static int head_slot_written(int i, int pass) {
    return slot_is_output(i) && !(i == S_STATS && pass == SPH_HEAD_BACKWARD);
}

int head_scalars(sph_head_args *a, PyObject *v0, PyObject *vt, PyObject *temp, PyObject *cap,
                 int acc_dh, int acc_dw, int allred) {
    if (arg_i64(v0, "vocab_start", &a->vocab_start) < 0 ||
        arg_i64(vt, "vocab_total", &a->vocab_total) < 0 ||
        arg_double(temp, "temperature", &a->temperature) < 0 ||
        arg_double(cap, "softcap", &a->softcap) < 0)
        return -1;
    a->accumulate_dhidden = acc_dh;
    a->accumulate_dweight = acc_dw;
    a->allreduce_dhidden = allred;
    return 0;
}

PyObject *py_head(PyObject *self, PyObject *args) {
    PyObject *ctx_obj, *tensors, *spans_obj, *alloc, *v0_obj, *vt_obj, *temp_obj, *cap_obj;
    int pass, acc_dh, acc_dw, allred;
    if (!PyArg_ParseTuple(args, "OiO!OOOOOOiii", &ctx_obj, &pass, &PyTuple_Type, &tensors,
                          &spans_obj, &alloc, &v0_obj, &vt_obj, &temp_obj, &cap_obj, &acc_dh,
                          &acc_dw, &allred))
        return NULL;
    sph_head_args a = SPH_HEAD_ARGS_INIT;
    if (head_scalars(&a, v0_obj, vt_obj, temp_obj, cap_obj, acc_dh, acc_dw, allred) < 0)
        return NULL;
    NEED(sph_head_workspace_size);
    if (pass == SPH_HEAD_FORWARD) NEED(sph_head_forward);
    else NEED(sph_head_backward);
    sph_ctx_t ctx = ctx_of(ctx_obj);
    if (!ctx) return NULL;
    if (PyTuple_Size(tensors) != S_COUNT) {
        PyErr_Format(PyExc_TypeError, "head: expected %d tensor slots", (int)S_COUNT);
        return NULL;
    }
    consumed slots[S_COUNT], sp, ws;
    memset(slots, 0, sizeof slots);
    memset(&sp, 0, sizeof sp);
    memset(&ws, 0, sizeof ws);
    PyObject *res = NULL, *ws_cap = NULL;
    int have[S_COUNT];
    if (consume_slots(tensors, S_COUNT, slot_names, head_slot_written, pass, slots, have) < 0)
        goto done;
    if (consume_spans(spans_obj, &sp, &a.spans, &a.n_spans) < 0) goto done;
#define T(i) (have[i] ? &slots[i].t : NULL)
    a.hidden = T(S_HIDDEN);
    a.weight = T(S_WEIGHT);
    a.targets = T(S_TARGETS);
    a.candidates = T(S_CAND);
    a.active_mask = T(S_MASK);
    a.logprob = T(S_LOGPROB);
    a.entropy = T(S_ENTROPY);
    a.lse = T(S_LSE);
    a.logit_mean = T(S_MEAN);
    a.stats = T(S_STATS);
    a.dlogprob = T(S_DLOGPROB);
    a.dentropy = T(S_DENTROPY);
    a.dlse = T(S_DLSE);
    a.dlogit_mean = T(S_DMEAN);
    a.dhidden = T(S_DHIDDEN);
    a.dweight = T(S_DWEIGHT);
    a.sum_p2 = T(S_SUMP2);
    a.temperature_rows = T(S_TROWS); /* with it, temperature is 1 (the library checks) */
    a.topk_ids = T(S_TOPKI);
    a.topk_logprobs = T(S_TOPKL);
#undef T

    size_t bytes = 0;
    sph_status s = lib.sph_head_workspace_size(ctx, (sph_head_pass)pass, &a, &bytes);
    if (s) {
        raise_lib(s);
        goto done;
    }
    void *wptr = NULL;
    size_t wbytes = 0;
    if (consume_workspace(alloc, bytes, "head", &ws_cap, &ws, &wptr, &wbytes) < 0) goto done;
    /* The library validates before writing and never calls back into Python: release the GIL
     * for the (possibly long) CPU compute. Errors are thread-local and this OS thread is the
     * one that reads them. */
    SPH_NOGIL(s = pass == SPH_HEAD_FORWARD ? lib.sph_head_forward(ctx, &a, wptr, wbytes)
                                           : lib.sph_head_backward(ctx, &a, wptr, wbytes));
    if (s) {
        raise_lib(s);
        goto done;
    }
    res = PyLong_FromUnsignedLongLong((unsigned long long)bytes);
done:
    release_slots(slots, S_COUNT, &sp, &ws);
    Py_XDECREF(ws_cap);
    return res;
}

static int every_slot(int i, int arg) {
    (void)i, (void)arg;
    return 1;
}

/* scale(ctx, scale_capsule, (capsule, ...)): sph_scale_inplace, the tensors times the device
 * scalar (the backward of the one-pass operators: nothing touched when it is exactly 1). */
PyObject *py_scale(PyObject *self, PyObject *args) {
    PyObject *ctx_obj, *scale_obj, *tensors;
    if (!PyArg_ParseTuple(args, "OOO!", &ctx_obj, &scale_obj, &PyTuple_Type, &tensors))
        return NULL;
    NEED(sph_scale_inplace);
    sph_ctx_t ctx = ctx_of(ctx_obj);
    if (!ctx) return NULL;
    const Py_ssize_t n = PyTuple_Size(tensors);
    if (n < 1 || n > SPH_SCALE_MAX) {
        raise_fmt(SPH_ERR_INVALID_ARG, "scale: %d tensors, expected 1 .. %d", (int)n,
                  SPH_SCALE_MAX);
        return NULL;
    }
    consumed sc, ts[SPH_SCALE_MAX];
    memset(&sc, 0, sizeof sc);
    memset(ts, 0, sizeof ts);
    const sph_tensor *tl[SPH_SCALE_MAX] = {NULL};
    PyObject *res = NULL;
    int hs = consume(scale_obj, "scale", &sc);
    if (hs < 0) goto done;
    static const char *const tnames[SPH_SCALE_MAX] = {
        "tensors[0]", "tensors[1]", "tensors[2]", "tensors[3]",
        "tensors[4]", "tensors[5]", "tensors[6]", "tensors[7]"};
    int have[SPH_SCALE_MAX];
    if (consume_slots(tensors, (int)n, tnames, every_slot, 0, ts, have) < 0) goto done;
    for (Py_ssize_t i = 0; i < n; i++) tl[i] = have[i] ? &ts[i].t : NULL;
    sph_status s = lib.sph_scale_inplace(ctx, hs ? &sc.t : NULL, tl, (int)n);
    if (s) {
        raise_lib(s);
        goto done;
    }
    res = Py_None;
    Py_INCREF(res);
done:
    release_slots(ts, SPH_SCALE_MAX, &sc, NULL);
    return res;
}

/* tensor_info(capsule) -> (device_type, device_id, ndim, (code, bits, lanes), shape, strides,
 * byte_offset, read_only); consumes the capsule. A debugging and test aid. */
PyObject *py_tensor_info(PyObject *self, PyObject *args) {
    PyObject *obj;
    if (!PyArg_ParseTuple(args, "O", &obj)) return NULL;
    consumed c;
    int h = consume(obj, "tensor", &c);
    if (h < 0) return NULL;
    if (h == 0) Py_RETURN_NONE;
    PyObject *shape = NULL, *strides = NULL, *res = NULL;
    if (c.t.ndim < 0 || (c.t.ndim > 0 && !c.t.shape)) {
        PyErr_SetString(PyExc_ValueError, "tensor: malformed DLTensor");
        goto done;
    }
    shape = list_from_i64(c.t.shape, c.t.ndim);
    if (!shape) goto done;
    if (c.t.strides) {
        strides = list_from_i64(c.t.strides, c.t.ndim);
        if (!strides) goto done;
    } else {
        strides = Py_None;
        Py_INCREF(strides);
    }
    res = Py_BuildValue("(ii i(iii) OOKi)", (int)c.t.device.type, (int)c.t.device.id,
                        (int)c.t.ndim, (int)c.t.dtype.code, (int)c.t.dtype.bits,
                        (int)c.t.dtype.lanes, shape, strides,
                        (unsigned long long)c.t.byte_offset, c.read_only);
done:
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        release(&c);
        PyErr_Restore(et, ev, tb);
    }
    return res;
}
