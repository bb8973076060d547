/*
 * _spanhead.c - the CPython extension behind the `spanhead` package: a thin, C-only layer over
 * the public C API (include/spanhead.h). It
 *   - loads libspanhead at run time (dlopen of the path the Python package chooses; every
 *     symbol is resolved with dlsym, so a library lacking a function gives a clear
 *     UnsupportedError on use instead of an import failure),
 *   - consumes DLPack capsules ("dltensor" and "dltensor_versioned"), turns them into
 *     sph_tensor views (sph_tensor is DLTensor field for field), keeps them alive for the call
 *     and calls their deleters afterwards, as the DLPack protocol asks of a consumer,
 *   - converts status codes into the Python exception classes the package registers.
 * Argument conveniences (defaults, output allocation, frameworks, streams) live in Python; this
 * file only checks what it dereferences. Built against the stable ABI (Py_LIMITED_API), so one
 * binary serves every CPython >= 3.9.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#include "spanhead.h"

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
/* The library, resolved at run time                                                          */
/* ---------------------------------------------------------------------------------------- */

#define SPH_FUNCS(X)                                                                          \
    X(sph_status_str, const char *, (sph_status))                                             \
    X(sph_last_error, const char *, (void))                                                   \
    X(sph_version, const char *, (void))                                                      \
    X(sph_ctx_create, sph_status, (sph_ctx_t *, const sph_ctx_opts *))                        \
    X(sph_ctx_destroy, void, (sph_ctx_t))                                                     \
    X(sph_ctx_describe, const char *, (sph_ctx_t))                                            \
    X(sph_ctx_synchronize, sph_status, (sph_ctx_t))                                           \
    X(sph_cuda_device_count, int, (void))                                                     \
    X(sph_alignment_get, sph_status, (const sph_parallel *, sph_alignment *))                 \
    X(sph_layout_packed, sph_status,                                                          \
      (const sph_parallel *, const int64_t *, int64_t, int64_t *, int64_t *))                 \
    X(sph_cp_local_rows, sph_status, (int64_t, int64_t, int64_t, int64_t *))                  \
    X(sph_spans_build, sph_status,                                                            \
      (const sph_batch_desc *, const sph_spans_opts *, sph_spans **))                         \
    X(sph_spans_free, void, (sph_spans *))                                                    \
    X(sph_spans_from_mask, sph_status,                                                        \
      (const uint8_t *, int64_t, int64_t, int64_t *, int64_t *))                              \
    X(sph_spans_validate, sph_status,                                                         \
      (const int64_t *, int64_t, int64_t, const uint8_t *))                                   \
    X(sph_pack, sph_status,                                                                   \
      (const int64_t *, int64_t, const sph_pack_opts *, sph_pack_result **))                  \
    X(sph_pack_free, void, (sph_pack_result *))                                               \
    X(sph_head_workspace_size, sph_status,                                                    \
      (sph_ctx_t, sph_head_pass, const sph_head_args *, size_t *))                            \
    X(sph_head_forward, sph_status, (sph_ctx_t, const sph_head_args *, void *, size_t))       \
    X(sph_head_backward, sph_status, (sph_ctx_t, const sph_head_args *, void *, size_t))      \
    X(sph_comm_create_none, sph_status, (sph_comm_t *))                                       \
    X(sph_comm_create_mpi, sph_status, (sph_comm_t *, const void *, const sph_comm_config *)) \
    X(sph_comm_create_mpi_world, sph_status,                                                  \
      (sph_comm_t *, const sph_comm_config *, int64_t *, int64_t *, int64_t *))               \
    X(sph_comm_create_nccl, sph_status, (sph_comm_t *, void *, const sph_comm_config *))      \
    X(sph_comm_create_nccl_mpi, sph_status,                                                   \
      (sph_comm_t *, const void *, const sph_comm_config *))                                  \
    X(sph_comm_destroy, void, (sph_comm_t))                                                   \
    X(sph_comm_info, sph_status, (sph_comm_t, sph_comm_backend *, int64_t *, int64_t *))     \
    X(sph_tune, sph_status, (sph_ctx_t, const sph_tune_opts *, const char **))               \
    X(sph_tune_gemm_rate, sph_status,                                                         \
      (sph_ctx_t, sph_dtype, int64_t, int64_t, int64_t, int, double *))                       \
    X(sph_tune_gemm_rate_sustained, sph_status,                                               \
      (sph_ctx_t, sph_dtype, int64_t, int64_t, int64_t, int, int, double *))

#define X_FIELD(name, ret, args) ret(*name) args;
static struct {
    void *handle;
    SPH_FUNCS(X_FIELD)
} lib;
#undef X_FIELD

/* Exception classes by status code, registered by the Python package (set_error_classes). */
#define N_STATUS 32
static PyObject *error_classes[N_STATUS];

/* Resolves a symbol or raises UnsupportedError-ish RuntimeError naming it. */
#define NEED(fn)                                                                              \
    do {                                                                                      \
        if (!lib.handle) {                                                                    \
            PyErr_SetString(PyExc_RuntimeError,                                               \
                            "spanhead: the C library is not loaded (spanhead._spanhead.load)"); \
            return NULL;                                                                      \
        }                                                                                     \
        if (!lib.fn) return raise_missing(#fn);                                               \
    } while (0)

/* Raises the exception class registered for status s with a formatted message; the exception
 * carries the code as `.status`. Always returns NULL. */
static PyObject *raise_fmt(sph_status s, const char *fmt, ...) {
    PyObject *cls = ((int)s >= 0 && (int)s < N_STATUS && error_classes[s]) ? error_classes[s]
                                                                            : PyExc_RuntimeError;
    va_list ap;
    va_start(ap, fmt);
    PyObject *m = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (!m) return NULL;
    PyObject *exc = PyObject_CallFunctionObjArgs(cls, m, NULL);
    Py_DECREF(m);
    if (!exc) return NULL;
    PyObject *code = PyLong_FromLong((long)s);
    if (!code || PyObject_SetAttrString(exc, "status", code) < 0) PyErr_Clear();
    Py_XDECREF(code);
    PyErr_SetObject(cls, exc);
    Py_DECREF(exc);
    return NULL;
}

static PyObject *raise_status(sph_status s, const char *msg) {
    if (msg && *msg) return raise_fmt(s, "%s", msg);
    return raise_fmt(s, "spanhead: %s (status %d)",
                     lib.sph_status_str ? lib.sph_status_str(s) : "error", (int)s);
}

static PyObject *raise_missing(const char *fn) {
    return raise_fmt(SPH_ERR_UNSUPPORTED,
                     "spanhead: the loaded libspanhead does not provide %s (an older or partial "
                     "build)",
                     fn);
}

/* Raises the library's status as an exception carrying the thread's message. */
static PyObject *raise_lib(sph_status s) {
    const char *msg = lib.sph_last_error ? lib.sph_last_error() : "";
    return raise_status(s, msg);
}

static PyObject *py_load(PyObject *self, PyObject *args) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    if (lib.handle) Py_RETURN_NONE; /* first library wins for the life of the process */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        PyErr_Format(PyExc_ImportError, "spanhead: cannot load %s: %s", path, e ? e : "?");
        return NULL;
    }
#define X_LOAD(name, ret, args) *(void **)(&lib.name) = dlsym(h, #name);
    SPH_FUNCS(X_LOAD)
#undef X_LOAD
    if (!lib.sph_last_error || !lib.sph_status_str || !lib.sph_version) {
        dlclose(h);
        memset(&lib, 0, sizeof lib);
        PyErr_Format(PyExc_ImportError, "spanhead: %s is not a spanhead library", path);
        return NULL;
    }
    lib.handle = h;
    Py_RETURN_NONE;
}

/* Names of the functions the loaded library lacks (an empty list for a complete build). */
static PyObject *py_missing(PyObject *self, PyObject *noargs) {
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
#define X_MISSING(name, ret, args)                                                            \
    if (!lib.name) {                                                                          \
        PyObject *s = PyUnicode_FromString(#name);                                            \
        if (!s || PyList_Append(out, s) < 0) {                                                \
            Py_XDECREF(s);                                                                    \
            Py_DECREF(out);                                                                   \
            return NULL;                                                                      \
        }                                                                                     \
        Py_DECREF(s);                                                                         \
    }
    SPH_FUNCS(X_MISSING)
#undef X_MISSING
    return out;
}

static PyObject *py_set_error_classes(PyObject *self, PyObject *args) {
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "O", &seq)) return NULL;
    Py_ssize_t n = PySequence_Size(seq);
    if (n < 0) return NULL;
    if (n > N_STATUS) n = N_STATUS;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *c = PySequence_GetItem(seq, i);
        if (!c) return NULL;
        PyObject *old = error_classes[i];
        error_classes[i] = c;
        Py_XDECREF(old);
    }
    Py_RETURN_NONE;
}

static PyObject *py_version(PyObject *self, PyObject *noargs) {
    NEED(sph_version);
    return PyUnicode_FromString(lib.sph_version());
}

static PyObject *py_status_str(PyObject *self, PyObject *args) {
    int s;
    if (!PyArg_ParseTuple(args, "i", &s)) return NULL;
    NEED(sph_status_str);
    return PyUnicode_FromString(lib.sph_status_str((sph_status)s));
}

static PyObject *py_cuda_device_count(PyObject *self, PyObject *noargs) {
    NEED(sph_cuda_device_count);
    return PyLong_FromLong(lib.sph_cuda_device_count());
}

/* ---------------------------------------------------------------------------------------- */
/* Conversions                                                                                */
/* ---------------------------------------------------------------------------------------- */

/* A Python sequence of ints -> malloc'd int64 array (n may be 0; *out is never NULL on
 * success). */
static int seq_to_i64(PyObject *obj, const char *name, int64_t **out, int64_t *n) {
    PyObject *fast = PySequence_Fast(obj, name);
    if (!fast) return -1;
    Py_ssize_t len = PySequence_Size(fast);
    if (len < 0) {
        Py_DECREF(fast);
        return -1;
    }
    int64_t *a = PyMem_Malloc((size_t)(len ? len : 1) * sizeof *a);
    if (!a) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *it = PySequence_GetItem(fast, i);
        if (!it) goto fail;
        long long v = PyLong_AsLongLong(it);
        Py_DECREF(it);
        if (v == -1 && PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
                PyErr_Clear();
                raise_fmt(SPH_ERR_OVERFLOW, "%s[%zd]: value does not fit in int64", name, i);
            }
            goto fail;
        }
        a[i] = (int64_t)v;
    }
    Py_DECREF(fast);
    *out = a;
    *n = (int64_t)len;
    return 0;
fail:
    Py_DECREF(fast);
    PyMem_Free(a);
    return -1;
}

static PyObject *list_from_i64(const int64_t *a, int64_t n) {
    PyObject *l = PyList_New((Py_ssize_t)n);
    if (!l) return NULL;
    for (int64_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLongLong((long long)a[i]);
        if (!v) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SetItem(l, (Py_ssize_t)i, v);
    }
    return l;
}

static PyObject *pairs_from_i64(const int64_t *a, int64_t n_pairs) {
    PyObject *l = PyList_New((Py_ssize_t)n_pairs);
    if (!l) return NULL;
    for (int64_t i = 0; i < n_pairs; i++) {
        PyObject *p = Py_BuildValue("[LL]", (long long)a[2 * i], (long long)a[2 * i + 1]);
        if (!p) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SetItem(l, (Py_ssize_t)i, p);
    }
    return l;
}

static PyObject *bytes_from_u8(const uint8_t *a, int64_t n) {
    return PyBytes_FromStringAndSize(n ? (const char *)a : "", (Py_ssize_t)n);
}

/* bytes-like (bytes) of 0/1 -> pointer into the object (kept alive by the caller). */
static int bytes_arg(PyObject *obj, const char *name, const uint8_t **p, Py_ssize_t *n) {
    char *buf;
    if (!PyBytes_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: expected bytes", name);
        return -1;
    }
    if (PyBytes_AsStringAndSize(obj, &buf, n) < 0) return -1;
    *p = (const uint8_t *)buf;
    return 0;
}

static int parallel_arg(long long tp, long long cp, int fp8, sph_parallel *par) {
    par->tp = (int64_t)tp;
    par->cp = (int64_t)cp;
    par->fp8 = (sph_fp8)fp8;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Host metadata                                                                              */
/* ---------------------------------------------------------------------------------------- */

static PyObject *py_alignment(PyObject *self, PyObject *args) {
    long long tp, cp;
    int fp8;
    if (!PyArg_ParseTuple(args, "LLi", &tp, &cp, &fp8)) return NULL;
    NEED(sph_alignment_get);
    sph_parallel par;
    parallel_arg(tp, cp, fp8, &par);
    sph_alignment a;
    sph_status s = lib.sph_alignment_get(&par, &a);
    if (s) return raise_lib(s);
    return Py_BuildValue("(LLL)", (long long)a.sequence, (long long)a.total,
                         (long long)a.unpacked);
}

static PyObject *py_layout_packed(PyObject *self, PyObject *args) {
    long long tp, cp;
    int fp8;
    PyObject *lens_obj;
    if (!PyArg_ParseTuple(args, "LLiO", &tp, &cp, &fp8, &lens_obj)) return NULL;
    NEED(sph_layout_packed);
    sph_parallel par;
    parallel_arg(tp, cp, fp8, &par);
    int64_t *lens = NULL, n = 0;
    if (seq_to_i64(lens_obj, "lengths", &lens, &n) < 0) return NULL;
    int64_t *padded = PyMem_Malloc((size_t)(n + 1) * sizeof *padded);
    int64_t *cu = PyMem_Malloc((size_t)(n + 1) * sizeof *cu);
    PyObject *res = NULL;
    if (!padded || !cu) {
        PyErr_NoMemory();
        goto done;
    }
    sph_status s = lib.sph_layout_packed(&par, lens, n, padded, cu);
    if (s) {
        raise_lib(s);
        goto done;
    }
    PyObject *a = list_from_i64(padded, n), *b = a ? list_from_i64(cu, n + 1) : NULL;
    if (a && b) res = PyTuple_Pack(2, a, b);
    Py_XDECREF(a);
    Py_XDECREF(b);
done:
    PyMem_Free(lens);
    PyMem_Free(padded);
    PyMem_Free(cu);
    return res;
}

static PyObject *py_cp_local_rows(PyObject *self, PyObject *args) {
    long long P, cp, rank;
    if (!PyArg_ParseTuple(args, "LLL", &P, &cp, &rank)) return NULL;
    NEED(sph_cp_local_rows);
    if (P < 0 || cp < 1 || P / cp > ((long long)PY_SSIZE_T_MAX / 16))
        return raise_status(SPH_ERR_INVALID_ARG, "cp_local_rows: P must be >= 0 and cp >= 1");
    int64_t n = (int64_t)(P / cp);
    int64_t *rows = PyMem_Malloc((size_t)(n ? n : 1) * sizeof *rows);
    if (!rows) return PyErr_NoMemory();
    sph_status s = lib.sph_cp_local_rows((int64_t)P, (int64_t)cp, (int64_t)rank, rows);
    PyObject *res = s ? raise_lib(s) : list_from_i64(rows, n);
    PyMem_Free(rows);
    return res;
}

/* spans_build(layout, B, S, A, loss_mask: bytes, attention_mask: bytes|None,
 *             sub_seq_lengths: list|None, sub_seq_counts: list|None, tp, cp, fp8, cp_rank, gap)
 * -> dict with every field of sph_spans. */
static PyObject *py_spans_build(PyObject *self, PyObject *args) {
    int layout, fp8;
    long long B, S, A, tp, cp, cp_rank, gap;
    PyObject *lm_obj, *am_obj, *ssl_obj, *ssc_obj;
    if (!PyArg_ParseTuple(args, "iLLLOOOOLLiLL", &layout, &B, &S, &A, &lm_obj, &am_obj,
                          &ssl_obj, &ssc_obj, &tp, &cp, &fp8, &cp_rank, &gap))
        return NULL;
    NEED(sph_spans_build);
    NEED(sph_spans_free);
    sph_batch_desc d = SPH_BATCH_DESC_INIT;
    d.layout = (sph_layout_kind)layout;
    d.batch = (int64_t)B;
    d.seq_len = (int64_t)S;
    d.num_actions = (int64_t)A;
    const uint8_t *lm = NULL, *am = NULL;
    Py_ssize_t lm_n = 0, am_n = 0;
    int64_t *ssl = NULL, *ssc = NULL, n_ssl = 0, n_ssc = 0;
    PyObject *res = NULL;
    sph_spans *sp = NULL;
    if (bytes_arg(lm_obj, "loss_mask", &lm, &lm_n) < 0) return NULL;
    if (am_obj != Py_None && bytes_arg(am_obj, "attention_mask", &am, &am_n) < 0) return NULL;
    /* The C API reads B*A and B*S bytes: check the buffers hold them before it does. */
    if (B < 0 || A < 0 || S < 0 || (A && B > (long long)lm_n / A) ||
        (long long)lm_n != B * A) {
        return raise_status(SPH_ERR_SHAPE, "spans: loss_mask must hold batch * num_actions "
                                           "entries");
    }
    if (am && (S && B > (long long)am_n / (S ? S : 1))) {
        return raise_status(SPH_ERR_SHAPE, "spans: attention_mask must hold batch * "
                                           "sequence_length entries");
    }
    if (am && (long long)am_n != B * S)
        return raise_status(SPH_ERR_SHAPE, "spans: attention_mask must hold batch * "
                                           "sequence_length entries");
    if (ssl_obj != Py_None) {
        if (seq_to_i64(ssl_obj, "sub_seq_lengths", &ssl, &n_ssl) < 0) goto done;
        if (seq_to_i64(ssc_obj, "sub_seq_counts", &ssc, &n_ssc) < 0) goto done;
        int64_t total = 0;
        for (int64_t i = 0; i < n_ssc; i++) {
            if (ssc[i] < 0 || ssc[i] > n_ssl - total) {
                raise_status(SPH_ERR_SHAPE, "spans: sub_seq_lengths rows do not match");
                goto done;
            }
            total += ssc[i];
        }
        if (n_ssc != B || total != n_ssl) {
            raise_status(SPH_ERR_SHAPE,
                         "spans: sub_seq_lengths must have one list per batch row");
            goto done;
        }
        d.sub_seq_lengths = ssl;
        d.sub_seq_counts = ssc;
    }
    d.loss_mask = lm;
    d.attention_mask = am;
    sph_spans_opts o = SPH_SPANS_OPTS_INIT;
    parallel_arg(tp, cp, fp8, &o.par);
    o.cp_rank = (int64_t)cp_rank;
    o.gap = (int64_t)gap;
    sph_status s = lib.sph_spans_build(&d, &o, &sp);
    if (s) {
        raise_lib(s);
        goto done;
    }
    PyObject *am_b = bytes_from_u8(sp->active_mask, sp->global_rows);
    PyObject *lm_b = bytes_from_u8(sp->local_mask, sp->local_rows);
    PyObject *spans = pairs_from_i64(sp->spans, sp->n_spans);
    PyObject *cu = sp->cu_seqlens_padded ? list_from_i64(sp->cu_seqlens_padded,
                                                         sp->n_segments + 1)
                                         : (Py_INCREF(Py_None), Py_None);
    if (am_b && lm_b && spans && cu)
        res = Py_BuildValue("{sLsLsLsLsOsOsOsLsO}", "global_rows", (long long)sp->global_rows,
                            "active_rows", (long long)sp->active_rows, "local_rows",
                            (long long)sp->local_rows, "local_active_rows",
                            (long long)sp->local_active_rows, "active_mask", am_b, "local_mask",
                            lm_b, "spans", spans, "n_segments", (long long)sp->n_segments,
                            "cu_seqlens_padded", cu);
    Py_XDECREF(am_b);
    Py_XDECREF(lm_b);
    Py_XDECREF(spans);
    Py_XDECREF(cu);
done:
    lib.sph_spans_free(sp);
    PyMem_Free(ssl);
    PyMem_Free(ssc);
    return res;
}

static PyObject *py_spans_from_mask(PyObject *self, PyObject *args) {
    PyObject *mobj;
    long long gap;
    if (!PyArg_ParseTuple(args, "OL", &mobj, &gap)) return NULL;
    NEED(sph_spans_from_mask);
    const uint8_t *m;
    Py_ssize_t n;
    if (bytes_arg(mobj, "mask", &m, &n) < 0) return NULL;
    int64_t cap = 2 * ((n + 1) / 2 + 2);
    int64_t *sp = PyMem_Malloc((size_t)cap * sizeof *sp);
    if (!sp) return PyErr_NoMemory();
    int64_t ns = 0;
    sph_status s = lib.sph_spans_from_mask(m, (int64_t)n, (int64_t)gap, sp, &ns);
    PyObject *res = s ? raise_lib(s) : pairs_from_i64(sp, ns);
    PyMem_Free(sp);
    return res;
}

static PyObject *py_spans_validate(PyObject *self, PyObject *args) {
    PyObject *flat_obj, *mobj;
    long long n;
    if (!PyArg_ParseTuple(args, "OLO", &flat_obj, &n, &mobj)) return NULL;
    NEED(sph_spans_validate);
    const uint8_t *m = NULL;
    Py_ssize_t mn = 0;
    if (mobj != Py_None) {
        if (bytes_arg(mobj, "mask", &m, &mn) < 0) return NULL;
        if ((long long)mn != n)
            return raise_status(SPH_ERR_SHAPE, "spans_validate: mask length differs from n");
    }
    int64_t *flat = NULL, nf = 0;
    if (seq_to_i64(flat_obj, "spans", &flat, &nf) < 0) return NULL;
    if (nf % 2) {
        PyMem_Free(flat);
        return raise_status(SPH_ERR_SHAPE, "spans_validate: spans must be [start, end] pairs");
    }
    sph_status s = lib.sph_spans_validate(flat, nf / 2, (int64_t)n, m);
    PyMem_Free(flat);
    if (s) return raise_lib(s);
    Py_RETURN_NONE;
}

static PyObject *py_pack(PyObject *self, PyObject *args) {
    PyObject *lens_obj;
    long long capacity, tp, cp, min_bins, bin_multiple;
    int algo, fp8;
    if (!PyArg_ParseTuple(args, "OLiLLiLL", &lens_obj, &capacity, &algo, &tp, &cp, &fp8,
                          &min_bins, &bin_multiple))
        return NULL;
    NEED(sph_pack);
    NEED(sph_pack_free);
    int64_t *lens = NULL, n = 0;
    if (seq_to_i64(lens_obj, "lengths", &lens, &n) < 0) return NULL;
    sph_pack_opts o = SPH_PACK_OPTS_INIT;
    o.capacity = (int64_t)capacity;
    o.algorithm = (sph_pack_algo)algo;
    parallel_arg(tp, cp, fp8, &o.par);
    o.min_bins = (int64_t)min_bins;
    o.bin_multiple = (int64_t)bin_multiple;
    sph_pack_result *r = NULL;
    PyObject *res = NULL, *bins = NULL, *tok = NULL;
    sph_status s = lib.sph_pack(lens, n, &o, &r);
    if (s) {
        raise_lib(s);
        goto done;
    }
    bins = PyList_New((Py_ssize_t)r->n_bins);
    if (!bins) goto done;
    for (int64_t b = 0; b < r->n_bins; b++) {
        PyObject *l = list_from_i64(r->items + r->bin_offsets[b],
                                    r->bin_offsets[b + 1] - r->bin_offsets[b]);
        if (!l) goto done;
        PyList_SetItem(bins, (Py_ssize_t)b, l);
    }
    tok = list_from_i64(r->bin_tokens, r->n_bins);
    if (!tok) goto done;
    res = Py_BuildValue("(OOd)", bins, tok, r->utilization);
done:
    Py_XDECREF(bins);
    Py_XDECREF(tok);
    lib.sph_pack_free(r);
    PyMem_Free(lens);
    return res;
}

/* ---------------------------------------------------------------------------------------- */
/* Handles: contexts and communicators as capsules                                            */
/* ---------------------------------------------------------------------------------------- */

static const char CTX_NAME[] = "spanhead.ctx";
static const char COMM_NAME[] = "spanhead.comm";

static void ctx_capsule_free(PyObject *cap) {
    sph_ctx_t c = PyCapsule_GetPointer(cap, CTX_NAME);
    if (c && lib.sph_ctx_destroy) lib.sph_ctx_destroy(c);
}

static void comm_capsule_free(PyObject *cap) {
    sph_comm_t c = PyCapsule_GetPointer(cap, COMM_NAME);
    if (c && lib.sph_comm_destroy) lib.sph_comm_destroy(c);
}

static sph_ctx_t ctx_of(PyObject *cap) {
    if (!PyCapsule_IsValid(cap, CTX_NAME)) {
        PyErr_SetString(PyExc_TypeError, "expected a spanhead context handle");
        return NULL;
    }
    return PyCapsule_GetPointer(cap, CTX_NAME);
}

/* ctx_create(dev_type, dev_id, stream, threads, force_kernel|None, allow_tf32,
 *            batch_invariant, chunk_rows, chunk_bytes, comm|None, tune_cache|None) */
static PyObject *py_ctx_create(PyObject *self, PyObject *args) {
    int dev_type, dev_id, threads, tf32, bi;
    unsigned long long stream;
    const char *force = NULL, *tune = NULL;
    long long chunk_rows, chunk_bytes;
    PyObject *comm_obj;
    if (!PyArg_ParseTuple(args, "iiKiziiLLOz", &dev_type, &dev_id, &stream, &threads, &force,
                          &tf32, &bi, &chunk_rows, &chunk_bytes, &comm_obj, &tune))
        return NULL;
    NEED(sph_ctx_create);
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.device.type = (sph_device_type)dev_type;
    o.device.id = dev_id;
    o.stream = (void *)(uintptr_t)stream;
    o.num_threads = threads;
    o.force_kernel = force;
    o.allow_tf32 = tf32;
    o.batch_invariant = bi;
    o.chunk_rows = (int64_t)chunk_rows;
    o.chunk_bytes = (int64_t)chunk_bytes;
    o.tune_cache = tune;
    if (comm_obj != Py_None) {
        if (!PyCapsule_IsValid(comm_obj, COMM_NAME)) {
            PyErr_SetString(PyExc_TypeError, "comm: expected a spanhead communicator handle");
            return NULL;
        }
        o.tp_comm = PyCapsule_GetPointer(comm_obj, COMM_NAME);
    }
    sph_ctx_t c = NULL;
    sph_status s;
    {
        PyThreadState *ts_ = PyEval_SaveThread();
        s = lib.sph_ctx_create(&c, &o);
        PyEval_RestoreThread(ts_);
    }
    if (s) return raise_lib(s);
    PyObject *cap = PyCapsule_New(c, CTX_NAME, ctx_capsule_free);
    if (!cap) lib.sph_ctx_destroy(c);
    return cap;
}

/* Destroys the context now (the capsule becomes inert); idempotent. */
static PyObject *py_ctx_destroy(PyObject *self, PyObject *args) {
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    if (!PyCapsule_IsValid(cap, CTX_NAME)) Py_RETURN_NONE;
    sph_ctx_t c = PyCapsule_GetPointer(cap, CTX_NAME);
    if (PyCapsule_SetDestructor(cap, NULL) < 0) return NULL;
    if (PyCapsule_SetName(cap, "spanhead.ctx.destroyed") < 0) return NULL;
    if (c && lib.sph_ctx_destroy) lib.sph_ctx_destroy(c);
    Py_RETURN_NONE;
}

static PyObject *py_ctx_describe(PyObject *self, PyObject *args) {
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    NEED(sph_ctx_describe);
    sph_ctx_t c = ctx_of(cap);
    if (!c) return NULL;
    const char *d = lib.sph_ctx_describe(c);
    return PyUnicode_FromString(d ? d : "");
}

static PyObject *py_ctx_synchronize(PyObject *self, PyObject *args) {
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    NEED(sph_ctx_synchronize);
    sph_ctx_t c = ctx_of(cap);
    if (!c) return NULL;
    sph_status s;
    {
        PyThreadState *ts_ = PyEval_SaveThread();
        s = lib.sph_ctx_synchronize(c);
        PyEval_RestoreThread(ts_);
    }
    if (s) return raise_lib(s);
    Py_RETURN_NONE;
}

/* cfg tuple: (tp, cp, dp, vocab_total, vocab_start, vocab_local, (code, bits), temperature) */
static int comm_cfg(PyObject *t, sph_comm_config *cfg) {
    long long tp, cp, dp, vt, vs, vl;
    int code, bits;
    double temp;
    if (!PyTuple_Check(t)) {
        PyErr_SetString(PyExc_TypeError, "comm: the configuration must be a tuple");
        return -1;
    }
    if (!PyArg_ParseTuple(t, "LLLLLL(ii)d", &tp, &cp, &dp, &vt, &vs, &vl, &code, &bits, &temp))
        return -1;
    sph_comm_config c = SPH_COMM_CONFIG_INIT;
    c.tp = (int64_t)tp;
    c.cp = (int64_t)cp;
    c.dp = (int64_t)dp;
    c.vocab_total = (int64_t)vt;
    c.vocab_start = (int64_t)vs;
    c.vocab_local = (int64_t)vl;
    c.dtype.code = (uint8_t)code;
    c.dtype.bits = (uint8_t)bits;
    c.dtype.lanes = 1;
    c.temperature = temp;
    *cfg = c;
    return 0;
}

static PyObject *wrap_comm(sph_status s, sph_comm_t c) {
    if (s) return raise_lib(s);
    PyObject *cap = PyCapsule_New(c, COMM_NAME, comm_capsule_free);
    if (!cap) lib.sph_comm_destroy(c);
    return cap;
}

static PyObject *py_comm_create(PyObject *self, PyObject *args) {
    /* comm_create(kind, handle_address, cfg): kind 0 none, 1 mpi, 2 nccl, 3 nccl over mpi,
     * 4 mpi world (handle ignored; returns (comm, tp_rank, cp_rank, dp_rank)). */
    int kind;
    unsigned long long addr;
    PyObject *cfg_obj;
    if (!PyArg_ParseTuple(args, "iKO", &kind, &addr, &cfg_obj)) return NULL;
    NEED(sph_comm_destroy);
    if (kind < 0 || kind > 4)
        return raise_fmt(SPH_ERR_INVALID_ARG, "comm: unknown communicator kind %d", kind);
    sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
    if (kind != 0 && comm_cfg(cfg_obj, &cfg) < 0) return NULL;
    sph_comm_t c = NULL;
    sph_status s;
    void *h = (void *)(uintptr_t)addr;
    if ((kind == 1 || kind == 2 || kind == 3) && !h)
        return raise_status(SPH_ERR_INVALID_ARG, "comm: the communicator handle is NULL");
    switch (kind) {
    case 0:
        NEED(sph_comm_create_none);
        s = lib.sph_comm_create_none(&c);
        return wrap_comm(s, c);
    case 1:
        NEED(sph_comm_create_mpi);
        {
            PyThreadState *ts_ = PyEval_SaveThread();
            s = lib.sph_comm_create_mpi(&c, h, &cfg);
            PyEval_RestoreThread(ts_);
        }
        return wrap_comm(s, c);
    case 2:
        NEED(sph_comm_create_nccl);
        {
            PyThreadState *ts_ = PyEval_SaveThread();
            s = lib.sph_comm_create_nccl(&c, h, &cfg);
            PyEval_RestoreThread(ts_);
        }
        return wrap_comm(s, c);
    case 3:
        NEED(sph_comm_create_nccl_mpi);
        {
            PyThreadState *ts_ = PyEval_SaveThread();
            s = lib.sph_comm_create_nccl_mpi(&c, h, &cfg);
            PyEval_RestoreThread(ts_);
        }
        return wrap_comm(s, c);
    case 4: {
        NEED(sph_comm_create_mpi_world);
        int64_t r[3] = {0, 0, 0};
        {
            PyThreadState *ts_ = PyEval_SaveThread();
            s = lib.sph_comm_create_mpi_world(&c, &cfg, &r[0], &r[1], &r[2]);
            PyEval_RestoreThread(ts_);
        }
        PyObject *cap = wrap_comm(s, c);
        if (!cap) return NULL;
        PyObject *res = Py_BuildValue("(OLLL)", cap, (long long)r[0], (long long)r[1],
                                      (long long)r[2]);
        Py_DECREF(cap);
        return res;
    }
    default:
        return raise_status(SPH_ERR_INVALID_ARG, "comm: unknown communicator kind");
    }
}

/* Destroys the communicator now (the capsule becomes inert); idempotent. */
static PyObject *py_comm_destroy(PyObject *self, PyObject *args) {
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    if (!PyCapsule_IsValid(cap, COMM_NAME)) Py_RETURN_NONE;
    sph_comm_t c = PyCapsule_GetPointer(cap, COMM_NAME);
    if (PyCapsule_SetDestructor(cap, NULL) < 0) return NULL;
    if (PyCapsule_SetName(cap, "spanhead.comm.destroyed") < 0) return NULL;
    if (c && lib.sph_comm_destroy) lib.sph_comm_destroy(c);
    Py_RETURN_NONE;
}

static PyObject *py_comm_info(PyObject *self, PyObject *args) {
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    NEED(sph_comm_info);
    if (!PyCapsule_IsValid(cap, COMM_NAME)) {
        PyErr_SetString(PyExc_TypeError, "expected a spanhead communicator handle");
        return NULL;
    }
    sph_comm_backend b;
    int64_t rank, size;
    sph_status s = lib.sph_comm_info(PyCapsule_GetPointer(cap, COMM_NAME), &b, &rank, &size);
    if (s) return raise_lib(s);
    return Py_BuildValue("(iLL)", (int)b, (long long)rank, (long long)size);
}

/* tune(ctx, code, bits, H, V_loc, N, repeats, verbose) -> description of the winner */
static PyObject *py_tune(PyObject *self, PyObject *args) {
    PyObject *cap;
    int code, bits, repeats, verbose;
    long long H, V_loc, N;
    if (!PyArg_ParseTuple(args, "OiiLLLii", &cap, &code, &bits, &H, &V_loc, &N, &repeats,
                          &verbose))
        return NULL;
    NEED(sph_tune);
    sph_ctx_t c = ctx_of(cap);
    if (!c) return NULL;
    sph_tune_opts o = SPH_TUNE_OPTS_INIT;
    o.dtype.code = (uint8_t)code;
    o.dtype.bits = (uint8_t)bits;
    o.dtype.lanes = 1;
    o.H = (int64_t)H;
    o.V_loc = (int64_t)V_loc;
    o.N = (int64_t)N;
    o.repeats = repeats;
    o.verbose = verbose;
    const char *result = NULL;
    sph_status s;
    {
        PyThreadState *ts_ = PyEval_SaveThread();
        s = lib.sph_tune(c, &o, &result);
        PyEval_RestoreThread(ts_);
    }
    if (s) return raise_lib(s);
    return PyUnicode_FromString(result ? result : "");
}

/* gemm_rate(ctx, code, bits, M, N, K, repeats) -> TFLOP/s of the dense product, one at a time;
 * gemm_rate_sustained(ctx, code, bits, M, N, K, chain, repeats) -> of `chain` products back to
 * back. */
static PyObject *gemm_rate_of(PyObject *args, int sustained) {
    PyObject *cap;
    int code, bits, chain = 1, repeats;
    long long M, N, K;
    if (sustained ? !PyArg_ParseTuple(args, "OiiLLLii", &cap, &code, &bits, &M, &N, &K, &chain,
                                      &repeats)
                  : !PyArg_ParseTuple(args, "OiiLLLi", &cap, &code, &bits, &M, &N, &K, &repeats))
        return NULL;
    if (sustained) NEED(sph_tune_gemm_rate_sustained);
    else NEED(sph_tune_gemm_rate);
    sph_ctx_t c = ctx_of(cap);
    if (!c) return NULL;
    sph_dtype dt = {(uint8_t)code, (uint8_t)bits, 1};
    double tflops = 0.0;
    sph_status s;
    {
        PyThreadState *ts_ = PyEval_SaveThread();
        s = sustained ? lib.sph_tune_gemm_rate_sustained(c, dt, (int64_t)M, (int64_t)N,
                                                         (int64_t)K, chain, repeats, &tflops)
                      : lib.sph_tune_gemm_rate(c, dt, (int64_t)M, (int64_t)N, (int64_t)K,
                                               repeats, &tflops);
        PyEval_RestoreThread(ts_);
    }
    if (s) return raise_lib(s);
    return PyFloat_FromDouble(tflops);
}
static PyObject *py_gemm_rate(PyObject *self, PyObject *args) { return gemm_rate_of(args, 0); }
static PyObject *py_gemm_rate_sustained(PyObject *self, PyObject *args) {
    return gemm_rate_of(args, 1);
}

/* ---------------------------------------------------------------------------------------- */
/* DLPack consumption                                                                         */
/* ---------------------------------------------------------------------------------------- */

/* One consumed tensor: a copy of its DLTensor (possibly with a reinterpreted dtype) and what
 * must be released after the call. */
typedef struct {
    sph_tensor t;
    void *managed;               /* DLManagedTensor(Versioned) whose deleter we owe */
    void (*deleter)(void *self); /* may be NULL (the producer needs no callback) */
    int read_only;
} consumed;

static void release(consumed *c) {
    if (c->managed && c->deleter) c->deleter(c->managed);
    c->managed = NULL;
    c->deleter = NULL;
}

/* Consumes obj: None (-> 0, nothing), a "dltensor"/"dltensor_versioned" capsule, or a tuple
 * (capsule, dtype_code, dtype_bits) that reinterprets the element type (same size). Returns
 * 1 when a tensor was consumed, 0 for None, -1 with an exception set. */
static int consume(PyObject *obj, const char *name, consumed *c) {
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

/* Tensor slots of the head call, in the order the Python layer passes them. */
enum {
    S_HIDDEN, S_WEIGHT, S_TARGETS, S_CAND, S_MASK, S_LOGPROB, S_ENTROPY, S_LSE, S_MEAN, S_STATS,
    S_DLOGPROB, S_DENTROPY, S_DLSE, S_DMEAN, S_DHIDDEN, S_DWEIGHT, S_COUNT
};
static const char *const slot_names[S_COUNT] = {
    "hidden",   "weight",   "targets", "candidates", "active_mask", "logprob",
    "entropy",  "lse",      "logit_mean", "stats",   "dlogprob",    "dentropy",
    "dlse",     "dlogit_mean", "dhidden", "dweight"};
static int slot_is_output(int i) {
    return (i >= S_LOGPROB && i <= S_STATS) || i == S_DHIDDEN || i == S_DWEIGHT;
}

/* head(ctx, pass, tensors: tuple of 16, spans, workspace_alloc, vocab_start, vocab_total,
 *      temperature, softcap, acc_dh, acc_dw, allreduce_dh) -> workspace bytes used
 * The stats slot is an output of the forward and an input of the backward. workspace_alloc is
 * called with the byte count when it is > 0 and returns a capsule of at least that many bytes
 * on the context's device. spans is None or a capsule of a host int64 (n, 2) tensor. */
static PyObject *py_head(PyObject *self, PyObject *args) {
    PyObject *ctx_obj, *tensors, *spans_obj, *alloc;
    int pass, acc_dh, acc_dw, allred;
    long long v0, vt;
    double temp, softcap;
    if (!PyArg_ParseTuple(args, "OiO!OOLLddiii", &ctx_obj, &pass, &PyTuple_Type, &tensors,
                          &spans_obj, &alloc, &v0, &vt, &temp, &softcap, &acc_dh, &acc_dw,
                          &allred))
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
    for (int i = 0; i < S_COUNT; i++) {
        have[i] = consume(PyTuple_GetItem(tensors, i), slot_names[i], &slots[i]);
        if (have[i] < 0) goto done;
        if (have[i] && slot_is_output(i) && !(i == S_STATS && pass == SPH_HEAD_BACKWARD) &&
            slots[i].read_only) {
            raise_fmt(SPH_ERR_INVALID_ARG,
                      "%s: output tensor is read-only", slot_names[i]);
            goto done;
        }
    }
    const int64_t *spans = NULL;
    int64_t n_spans = 0;
    int have_sp = consume(spans_obj, "spans", &sp);
    if (have_sp < 0) goto done;
    if (have_sp) {
        sph_tensor *t = &sp.t;
        int ok = (t->device.type == SPH_DEVICE_CPU || t->device.type == SPH_DEVICE_CUDA_HOST) &&
                 t->ndim == 2 && t->shape[1] == 2 && t->dtype.code == SPH_DTYPE_INT &&
                 t->dtype.bits == 64 && t->dtype.lanes == 1 &&
                 (t->strides == NULL || t->shape[0] <= 1 ||
                  (t->strides[0] == 2 && t->strides[1] == 1)) &&
                 (t->strides == NULL || t->shape[0] != 1 || t->strides[1] == 1);
        if (!ok) {
            raise_status(SPH_ERR_INVALID_ARG, "spans: expected a contiguous host int64 array of "
                                              "shape (n_spans, 2)");
            goto done;
        }
        spans = (const int64_t *)((const char *)t->data + t->byte_offset);
        n_spans = t->shape[0];
    }

    sph_head_args a = SPH_HEAD_ARGS_INIT;
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
#undef T
    a.vocab_start = (int64_t)v0;
    a.vocab_total = (int64_t)vt;
    a.temperature = temp;
    a.softcap = softcap;
    a.spans = spans;
    a.n_spans = n_spans;
    a.accumulate_dhidden = acc_dh;
    a.accumulate_dweight = acc_dw;
    a.allreduce_dhidden = allred;

    size_t bytes = 0;
    sph_status s = lib.sph_head_workspace_size(ctx, (sph_head_pass)pass, &a, &bytes);
    if (s) {
        raise_lib(s);
        goto done;
    }
    void *wptr = NULL;
    size_t wbytes = 0;
    if (bytes > 0) {
        if (alloc == Py_None) {
            raise_status(SPH_ERR_WORKSPACE, "head: the pass needs a workspace and no allocator "
                                            "was given");
            goto done;
        }
        ws_cap = PyObject_CallFunction(alloc, "K", (unsigned long long)bytes);
        if (!ws_cap) goto done;
        int hw = consume(ws_cap, "workspace", &ws);
        if (hw < 0) goto done;
        if (hw == 0 || ws.t.ndim != 1 || ws.t.dtype.bits != 8 || ws.t.dtype.lanes != 1 ||
            ws.t.shape[0] < (int64_t)bytes ||
            (ws.t.strides && ws.t.shape[0] > 1 && ws.t.strides[0] != 1)) {
            raise_status(SPH_ERR_WORKSPACE,
                         "head: the workspace allocator must return a contiguous 1-d byte "
                         "tensor of at least the requested size");
            goto done;
        }
        wptr = (char *)ws.t.data + ws.t.byte_offset;
        wbytes = (size_t)ws.t.shape[0];
    }
    /* The library validates before writing and never calls back into Python: release the GIL
     * for the (possibly long) CPU compute. Errors are thread-local and this OS thread is the
     * one that reads them. */
    {
        PyThreadState *ts_ = PyEval_SaveThread();
        if (pass == SPH_HEAD_FORWARD)
            s = lib.sph_head_forward(ctx, &a, wptr, wbytes);
        else
            s = lib.sph_head_backward(ctx, &a, wptr, wbytes);
        PyEval_RestoreThread(ts_);
    }
    if (s) {
        raise_lib(s);
        goto done;
    }
    res = PyLong_FromUnsignedLongLong((unsigned long long)bytes);
done:
    /* Deleters may run Python code of the producer (e.g. NumPy drops its array reference);
     * the GIL is held here and any pending exception is preserved around them. */
    {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        for (int i = 0; i < S_COUNT; i++) release(&slots[i]);
        release(&sp);
        release(&ws);
        PyErr_Restore(et, ev, tb);
    }
    Py_XDECREF(ws_cap);
    return res;
}

/* tensor_info(capsule) -> (device_type, device_id, ndim, (code, bits, lanes), shape, strides,
 * byte_offset, read_only); consumes the capsule. A debugging and test aid. */
static PyObject *py_tensor_info(PyObject *self, PyObject *args) {
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

/* ---------------------------------------------------------------------------------------- */
/* Module                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"load", py_load, METH_VARARGS, "load(path): dlopen libspanhead (first call wins)."},
    {"missing", py_missing, METH_NOARGS, "Names of API functions the loaded library lacks."},
    {"set_error_classes", py_set_error_classes, METH_VARARGS,
     "Registers the exception class of each status code."},
    {"version", py_version, METH_NOARGS, "Library version string."},
    {"status_str", py_status_str, METH_VARARGS, "Static name of a status code."},
    {"cuda_device_count", py_cuda_device_count, METH_NOARGS, "Visible CUDA devices."},
    {"alignment", py_alignment, METH_VARARGS, "alignment(tp, cp, fp8) -> (seq, total, unpacked)"},
    {"layout_packed", py_layout_packed, METH_VARARGS,
     "layout_packed(tp, cp, fp8, lengths) -> (padded, cu_seqlens_padded)"},
    {"cp_local_rows", py_cp_local_rows, METH_VARARGS, "cp_local_rows(P, cp, rank) -> rows"},
    {"spans_build", py_spans_build, METH_VARARGS, "Masks and spans of a batch description."},
    {"spans_from_mask", py_spans_from_mask, METH_VARARGS, "spans_from_mask(mask, gap)"},
    {"spans_validate", py_spans_validate, METH_VARARGS, "spans_validate(flat, n, mask)"},
    {"pack", py_pack, METH_VARARGS, "Bin packing."},
    {"ctx_create", py_ctx_create, METH_VARARGS, "Creates a context handle."},
    {"ctx_destroy", py_ctx_destroy, METH_VARARGS, "Destroys a context handle now."},
    {"ctx_describe", py_ctx_describe, METH_VARARGS, "Describes a context's kernels."},
    {"ctx_synchronize", py_ctx_synchronize, METH_VARARGS, "Waits for a context's stream."},
    {"comm_create", py_comm_create, METH_VARARGS, "Creates a communicator handle."},
    {"comm_destroy", py_comm_destroy, METH_VARARGS, "Destroys a communicator handle now."},
    {"comm_info", py_comm_info, METH_VARARGS, "(backend, rank, size) of a communicator."},
    {"tune", py_tune, METH_VARARGS, "Autotunes the CUDA head for a shape."},
    {"gemm_rate", py_gemm_rate, METH_VARARGS, "Dense GEMM rate of the context's GPU."},
    {"gemm_rate_sustained", py_gemm_rate_sustained, METH_VARARGS,
     "Sustained dense GEMM rate of the context's GPU (a chain of products)."},
    {"head", py_head, METH_VARARGS, "Runs the LM head forward (0) or backward (1)."},
    {"tensor_info", py_tensor_info, METH_VARARGS, "Consumes a DLPack capsule, describes it."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_spanhead",
                                    "C extension of the spanhead package.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__spanhead(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddIntConstant(m, "HEADER_VERSION_MAJOR", SPH_VERSION_MAJOR) < 0 ||
        PyModule_AddIntConstant(m, "HEADER_VERSION_MINOR", SPH_VERSION_MINOR) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
