/*
 * module.c - the CPython extension behind the `spanhead` package: a thin, C-only layer over
 * the public C API (include/spanhead.h). This file
 *   - loads libspanhead at run time (dlopen of the path the Python package chooses; every
 *     symbol is resolved with dlsym, so a library lacking a function gives a clear
 *     UnsupportedError on use instead of an import failure),
 *   - converts status codes into the Python exception classes the package registers, and
 *     Python arguments into C ones with the same exceptions (an integer that does not fit is
 *     a SizeOverflowError naming the argument, never a bare OverflowError),
 *   - holds the module table. The other files: see _spanhead.h.
 * Argument conveniences (defaults, output allocation, frameworks, streams) live in Python; the
 * extension only checks what it dereferences. Built against the stable ABI (Py_LIMITED_API),
 * so one binary serves every CPython >= 3.9.
 */
#include "_spanhead.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdarg.h>
#include <string.h>

/* Exception classes by status code, registered by the Python package (set_error_classes). */
#define N_STATUS 32
static PyObject *error_classes[N_STATUS];

sph_py_lib lib;

/* Raises the exception class registered for status s with a formatted message; the exception
 * carries the code as `.status`. Always returns NULL. */
PyObject *raise_fmt(sph_status s, const char *fmt, ...) {
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

PyObject *raise_status(sph_status s, const char *msg) {
    if (msg && *msg) return raise_fmt(s, "%s", msg);
    return raise_fmt(s, "spanhead: %s (status %d)",
                     lib.sph_status_str ? lib.sph_status_str(s) : "error", (int)s);
}

PyObject *raise_missing(const char *fn) {
    return raise_fmt(SPH_ERR_UNSUPPORTED,
                     "spanhead: the loaded libspanhead does not provide %s (an older or partial "
                     "build)",
                     fn);
}

/* Raises the library's status as an exception carrying the thread's message. */
PyObject *raise_lib(sph_status s) {
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
/* Argument converters                                                                        */
/* ---------------------------------------------------------------------------------------- */

int arg_i64(PyObject *o, const char *name, int64_t *out) {
    PyObject *idx = PyNumber_Index(o);
    if (!idx) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
        PyErr_Clear();
        PyObject *tn = PyObject_GetAttrString((PyObject *)Py_TYPE(o), "__name__");
        raise_fmt(SPH_ERR_DTYPE, "%s: expected an integer, got %S (%S)", name, o,
                  tn ? tn : Py_None);
        Py_XDECREF(tn);
        return -1;
    }
    long long v = PyLong_AsLongLong(idx);
    if (v == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            raise_fmt(SPH_ERR_OVERFLOW, "%s: %S does not fit in a signed 64-bit integer", name,
                      idx);
        }
        Py_DECREF(idx);
        return -1;
    }
    Py_DECREF(idx);
    *out = (int64_t)v;
    return 0;
}

int arg_int(PyObject *o, const char *name, int *out) {
    int64_t v;
    if (arg_i64(o, name, &v) < 0) return -1;
    if (v < INT_MIN || v > INT_MAX) {
        raise_fmt(SPH_ERR_INVALID_ARG, "%s: %S is out of range (a C int: %d to %d)", name, o,
                  INT_MIN, INT_MAX);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int arg_double(PyObject *o, const char *name, double *out) {
    if (!PyFloat_Check(o) && !PyLong_Check(o) && !PyIndex_Check(o) &&
        !PyObject_HasAttrString(o, "__float__")) {
        raise_fmt(SPH_ERR_DTYPE, "%s: expected a real number, got %S", name, o);
        return -1;
    }
    double d = PyFloat_AsDouble(o);
    if (d == -1.0 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            raise_fmt(SPH_ERR_INVALID_ARG, "%s: %S is too large for a double", name, o);
        } else if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            raise_fmt(SPH_ERR_DTYPE, "%s: expected a real number, got %S", name, o);
        }
        return -1;
    }
    *out = d;
    return 0;
}

int arg_handle(PyObject *o, const char *name, uintptr_t *out) {
    PyObject *idx = PyNumber_Index(o);
    if (!idx) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
        PyErr_Clear();
        raise_fmt(SPH_ERR_INVALID_ARG, "%s: expected an integer handle, got %S", name, o);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(idx);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        raise_fmt(SPH_ERR_INVALID_ARG, "%s: %S is not a handle (0 to 2**64 - 1)", name, idx);
        Py_DECREF(idx);
        return -1;
    }
    Py_DECREF(idx);
    *out = (uintptr_t)v;
    return 0;
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
    {"ctx_nonfinite", py_ctx_nonfinite, METH_VARARGS,
     "Non-finite active rows since the last call: (count, first_row)."},
    {"ctx_synchronize", py_ctx_synchronize, METH_VARARGS, "Waits for a context's stream."},
    {"comm_create", py_comm_create, METH_VARARGS, "Creates a communicator handle."},
    {"comm_destroy", py_comm_destroy, METH_VARARGS, "Destroys a communicator handle now."},
    {"comm_info", py_comm_info, METH_VARARGS, "(backend, rank, size) of a communicator."},
    {"tune", py_tune, METH_VARARGS, "Autotunes the CUDA head for a shape."},
    {"gemm_rate", py_gemm_rate, METH_VARARGS, "Dense GEMM rate of the context's GPU."},
    {"gemm_rate_sustained", py_gemm_rate_sustained, METH_VARARGS,
     "Sustained dense GEMM rate of the context's GPU (a chain of products)."},
    {"head", py_head, METH_VARARGS, "Runs the LM head forward (0) or backward (1)."},
    {"scale", py_scale, METH_VARARGS,
     "Scales tensors in place by a device scalar (sph_scale_inplace)."},
    {"policy_loss", py_policy_loss, METH_VARARGS, "Runs the fused RL policy loss."},
    {"distill_loss", py_distill_loss, METH_VARARGS, "Runs the fused distillation loss."},
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
