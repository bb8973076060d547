/*
 * _spanhead.h - what the files of the spanhead CPython extension share (hidden symbols, one
 * shared object): the library resolved at run time, the exception helpers, argument
 * converters that give spanhead's exceptions (never a bare OverflowError), DLPack consumption
 * and the context / communicator handles.
 *
 *   module.c   loading libspanhead, errors, argument converters, the module table
 *   meta.c     host metadata: alignment, layouts, spans, packing
 *   handles.c  contexts, communicators, tuning and GEMM rates
 *   tensor.c   DLPack consumption and the head call
 *   policy.c   the fused policy loss call
 *   distill.c  the fused distillation loss call
 */
#ifndef SPH_PY_EXT_H
#define SPH_PY_EXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "spanhead.h"

#define SPH_PY_HIDDEN __attribute__((visibility("hidden")))

/* ---- the library, resolved at run time ------------------------------------------------- */

#define SPH_FUNCS(X)                                                                          \
    X(sph_status_str, const char *, (sph_status))                                             \
    X(sph_last_error, const char *, (void))                                                   \
    X(sph_version, const char *, (void))                                                      \
    X(sph_ctx_create, sph_status, (sph_ctx_t *, const sph_ctx_opts *))                        \
    X(sph_ctx_destroy, void, (sph_ctx_t))                                                     \
    X(sph_ctx_describe, const char *, (sph_ctx_t))                                            \
    X(sph_ctx_synchronize, sph_status, (sph_ctx_t))                                           \
    X(sph_ctx_nonfinite, sph_status, (sph_ctx_t, int64_t *, int64_t *))                       \
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
    X(sph_policy_loss_workspace_size, sph_status,                                             \
      (sph_ctx_t, const sph_head_args *, const sph_policy_args *, size_t *))                  \
    X(sph_policy_loss, sph_status,                                                            \
      (sph_ctx_t, const sph_head_args *, const sph_policy_args *, void *, size_t))            \
    X(sph_scale_inplace, sph_status,                                                          \
      (sph_ctx_t, const sph_tensor *, const sph_tensor *const *, int))                        \
    X(sph_distill_loss_workspace_size, sph_status,                                            \
      (sph_ctx_t, const sph_head_args *, const sph_distill_args *, size_t *))                 \
    X(sph_distill_loss, sph_status,                                                           \
      (sph_ctx_t, const sph_head_args *, const sph_distill_args *, void *, size_t))           \
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
typedef struct sph_py_lib {
    void *handle;
    SPH_FUNCS(X_FIELD)
} sph_py_lib;
#undef X_FIELD

extern SPH_PY_HIDDEN sph_py_lib lib;

/* ---- exceptions (module.c) ------------------------------------------------------------- */

/* Raises the exception class registered for status s with a formatted message (a
 * PyUnicode_FromFormat format); the exception carries `.status`. Always returns NULL. */
SPH_PY_HIDDEN PyObject *raise_fmt(sph_status s, const char *fmt, ...);
SPH_PY_HIDDEN PyObject *raise_status(sph_status s, const char *msg);
SPH_PY_HIDDEN PyObject *raise_missing(const char *fn);
/* The library's status as an exception carrying this thread's message. */
SPH_PY_HIDDEN PyObject *raise_lib(sph_status s);

/* Resolves a symbol or raises UnsupportedError naming it. */
#define NEED(fn)                                                                              \
    do {                                                                                      \
        if (!lib.handle) {                                                                    \
            PyErr_SetString(PyExc_RuntimeError,                                               \
                            "spanhead: the C library is not loaded (spanhead._spanhead.load)"); \
            return NULL;                                                                      \
        }                                                                                     \
        if (!lib.fn) return raise_missing(#fn);                                               \
    } while (0)

/* Runs a statement with the GIL released. */
#define SPH_NOGIL(stmt)                                                                       \
    do {                                                                                      \
        PyThreadState *ts_ = PyEval_SaveThread();                                             \
        stmt;                                                                                 \
        PyEval_RestoreThread(ts_);                                                            \
    } while (0)

/* ---- argument converters (module.c): 0 on success, -1 with a spanhead exception set ----- */

/* An integer argument (int, bool, numpy integer: anything with __index__) as int64.
 * Not an integer (a float, a string): DTypeError naming `name` and the value; outside int64:
 * SizeOverflowError naming both. */
SPH_PY_HIDDEN int arg_i64(PyObject *o, const char *name, int64_t *out);
/* As arg_i64, for a C int field: outside [INT_MIN, INT_MAX] is InvalidArgumentError. */
SPH_PY_HIDDEN int arg_int(PyObject *o, const char *name, int *out);
/* A real number (int or float) as a double: DTypeError otherwise, InvalidArgumentError for
 * an int too large for a double. */
SPH_PY_HIDDEN int arg_double(PyObject *o, const char *name, double *out);
/* An unsigned handle (a pointer or stream value, >= 0) as uintptr_t. */
SPH_PY_HIDDEN int arg_handle(PyObject *o, const char *name, uintptr_t *out);

/* ---- conversions (meta.c) ------------------------------------------------------------- */

/* A list of Python ints from an int64 array. */
SPH_PY_HIDDEN PyObject *list_from_i64(const int64_t *a, int64_t n);

/* ---- DLPack (tensor.c) ----------------------------------------------------------------- */

/* One consumed tensor: a copy of its DLTensor (possibly with a reinterpreted dtype) and what
 * must be released after the call. */
typedef struct {
    sph_tensor t;
    void *managed;               /* DLManagedTensor(Versioned) whose deleter we owe */
    void (*deleter)(void *self); /* may be NULL (the producer needs no callback) */
    int read_only;
} consumed;

SPH_PY_HIDDEN int consume(PyObject *obj, const char *name, consumed *c);
SPH_PY_HIDDEN void release(consumed *c);
/* The n capsules (or None) of a call's tensor tuple into slots[0..n) (have[i] 1 or 0), each an
 * output where is_out(i, arg) says so and then refused when read-only. 0, or -1 with an
 * exception set (what was consumed stays in slots: release_slots frees it). */
SPH_PY_HIDDEN int consume_slots(PyObject *tensors, int n, const char *const *names,
                                int (*is_out)(int i, int arg), int arg, consumed *slots,
                                int *have);
/* Releases slots[0..n) and the two extras (each may be NULL), a pending exception kept. */
SPH_PY_HIDDEN void release_slots(consumed *slots, int n, consumed *a, consumed *b);
/* The head calls' host spans (None or an (n, 2) int64 capsule) and workspace (a byte tensor of
 * at least `bytes` from the Python allocator); 0 on success, -1 with an exception set. */
SPH_PY_HIDDEN int consume_spans(PyObject *obj, consumed *sp, const int64_t **spans,
                                int64_t *n_spans);
SPH_PY_HIDDEN int consume_workspace(PyObject *alloc, size_t bytes, const char *what,
                                    PyObject **cap, consumed *ws, void **ptr, size_t *wbytes);
/* The head's scalar arguments, passed alike by head, policy_loss and distill_loss: vocab_start,
 * vocab_total, temperature, softcap (Python objects, checked as arg_i64 / arg_double do) and
 * the accumulate / allreduce flags, into a. 0, or -1 with an exception set. */
SPH_PY_HIDDEN int head_scalars(sph_head_args *a, PyObject *v0, PyObject *vt, PyObject *temp,
                               PyObject *cap, int acc_dh, int acc_dw, int allred);

/* ---- handles (handles.c) --------------------------------------------------------------- */

SPH_PY_HIDDEN sph_ctx_t ctx_of(PyObject *cap);
SPH_PY_HIDDEN sph_comm_t comm_of(PyObject *cap); /* NULL with TypeError set */

/* ---- the functions of the module table, by file ---------------------------------------- */

#define SPH_PY_METHOD(name) SPH_PY_HIDDEN PyObject *name(PyObject *self, PyObject *args)
SPH_PY_METHOD(py_alignment);
SPH_PY_METHOD(py_layout_packed);
SPH_PY_METHOD(py_cp_local_rows);
SPH_PY_METHOD(py_spans_build);
SPH_PY_METHOD(py_spans_from_mask);
SPH_PY_METHOD(py_spans_validate);
SPH_PY_METHOD(py_pack);
SPH_PY_METHOD(py_ctx_create);
SPH_PY_METHOD(py_ctx_destroy);
SPH_PY_METHOD(py_ctx_describe);
SPH_PY_METHOD(py_ctx_synchronize);
SPH_PY_METHOD(py_ctx_nonfinite);
SPH_PY_METHOD(py_comm_create);
SPH_PY_METHOD(py_comm_destroy);
SPH_PY_METHOD(py_comm_info);
SPH_PY_METHOD(py_tune);
SPH_PY_METHOD(py_gemm_rate);
SPH_PY_METHOD(py_gemm_rate_sustained);
SPH_PY_METHOD(py_head);
SPH_PY_METHOD(py_scale);
SPH_PY_METHOD(py_policy_loss);
SPH_PY_METHOD(py_distill_loss);
SPH_PY_METHOD(py_tensor_info);
#undef SPH_PY_METHOD

#endif
