/*
 * handles.c - contexts and communicators as capsules (destroyed with the capsule, or earlier
 * by ctx_destroy / comm_destroy), CUDA autotuning and the dense GEMM rates.
 */
#include "_spanhead.h"

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

sph_ctx_t ctx_of(PyObject *cap) {
    if (!PyCapsule_IsValid(cap, CTX_NAME)) {
        PyErr_SetString(PyExc_TypeError, "expected a spanhead context handle");
        return NULL;
    }
    return PyCapsule_GetPointer(cap, CTX_NAME);
}

sph_comm_t comm_of(PyObject *cap) {
    if (!PyCapsule_IsValid(cap, COMM_NAME)) {
        PyErr_SetString(PyExc_TypeError, "expected a spanhead communicator handle");
        return NULL;
    }
    return PyCapsule_GetPointer(cap, COMM_NAME);
}

/* ctx_create(dev_type, dev_id, stream, threads, force_kernel|None, allow_tf32,
 *            batch_invariant, chunk_rows, chunk_bytes, comm|None, tune_cache|None) */
PyObject *py_ctx_create(PyObject *self, PyObject *args) {
    int dev_type, tf32, bi;
    PyObject *dev_id_obj, *stream_obj, *threads_obj, *rows_obj, *bytes_obj, *comm_obj;
    const char *force = NULL, *tune = NULL;
    if (!PyArg_ParseTuple(args, "iOOOziiOOOz", &dev_type, &dev_id_obj, &stream_obj,
                          &threads_obj, &force, &tf32, &bi, &rows_obj, &bytes_obj, &comm_obj,
                          &tune))
        return NULL;
    NEED(sph_ctx_create);
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    uintptr_t stream = 0;
    o.device.type = (sph_device_type)dev_type;
    if (arg_int(dev_id_obj, "device", &o.device.id) < 0 ||
        arg_handle(stream_obj, "stream", &stream) < 0 ||
        arg_int(threads_obj, "threads", &o.num_threads) < 0 ||
        arg_i64(rows_obj, "chunk_rows", &o.chunk_rows) < 0 ||
        arg_i64(bytes_obj, "chunk_bytes", &o.chunk_bytes) < 0)
        return NULL;
    o.stream = (void *)stream;
    o.force_kernel = force;
    o.allow_tf32 = tf32;
    o.batch_invariant = bi;
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
    SPH_NOGIL(s = lib.sph_ctx_create(&c, &o));
    if (s) return raise_lib(s);
    PyObject *cap = PyCapsule_New(c, CTX_NAME, ctx_capsule_free);
    if (!cap) lib.sph_ctx_destroy(c);
    return cap;
}

/* Destroys the context now (the capsule becomes inert); idempotent. */
PyObject *py_ctx_destroy(PyObject *self, PyObject *args) {
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    if (!PyCapsule_IsValid(cap, CTX_NAME)) Py_RETURN_NONE;
    sph_ctx_t c = PyCapsule_GetPointer(cap, CTX_NAME);
    if (PyCapsule_SetDestructor(cap, NULL) < 0) return NULL;
    if (PyCapsule_SetName(cap, "spanhead.ctx.destroyed") < 0) return NULL;
    if (c && lib.sph_ctx_destroy) lib.sph_ctx_destroy(c);
    Py_RETURN_NONE;
}

PyObject *py_ctx_describe(PyObject *self, PyObject *args) {
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    NEED(sph_ctx_describe);
    sph_ctx_t c = ctx_of(cap);
    if (!c) return NULL;
    const char *d = lib.sph_ctx_describe(c);
    return PyUnicode_FromString(d ? d : "");
}

/* (count, first_row) of sph_ctx_nonfinite: synchronizes a CUDA context's stream */
PyObject *py_ctx_nonfinite(PyObject *self, PyObject *args) {
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    NEED(sph_ctx_nonfinite);
    sph_ctx_t c = ctx_of(cap);
    if (!c) return NULL;
    int64_t count = 0, first = -1;
    sph_status s;
    {
        PyThreadState *ts_ = PyEval_SaveThread();
        s = lib.sph_ctx_nonfinite(c, &count, &first);
        PyEval_RestoreThread(ts_);
    }
    if (s) return raise_lib(s);
    return Py_BuildValue("(LL)", (long long)count, (long long)first);
}

PyObject *py_ctx_synchronize(PyObject *self, PyObject *args) {
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
    PyObject *tp, *cp, *dp, *vt, *vs, *vl, *temp;
    int code, bits;
    if (!PyTuple_Check(t)) {
        PyErr_SetString(PyExc_TypeError, "comm: the configuration must be a tuple");
        return -1;
    }
    if (!PyArg_ParseTuple(t, "OOOOOO(ii)O", &tp, &cp, &dp, &vt, &vs, &vl, &code, &bits, &temp))
        return -1;
    sph_comm_config c = SPH_COMM_CONFIG_INIT;
    if (arg_i64(tp, "tp", &c.tp) < 0 || arg_i64(cp, "cp", &c.cp) < 0 ||
        arg_i64(dp, "dp", &c.dp) < 0 || arg_i64(vt, "vocab_total", &c.vocab_total) < 0 ||
        arg_i64(vs, "vocab_start", &c.vocab_start) < 0 ||
        arg_i64(vl, "vocab_local", &c.vocab_local) < 0 ||
        arg_double(temp, "temperature", &c.temperature) < 0)
        return -1;
    c.dtype.code = (uint8_t)code;
    c.dtype.bits = (uint8_t)bits;
    c.dtype.lanes = 1;
    *cfg = c;
    return 0;
}

static PyObject *wrap_comm(sph_status s, sph_comm_t c) {
    if (s) return raise_lib(s);
    PyObject *cap = PyCapsule_New(c, COMM_NAME, comm_capsule_free);
    if (!cap) lib.sph_comm_destroy(c);
    return cap;
}

PyObject *py_comm_create(PyObject *self, PyObject *args) {
    /* comm_create(kind, handle_address, cfg): kind 0 none, 1 mpi, 2 nccl, 3 nccl over mpi,
     * 4 mpi world (handle ignored; returns (comm, tp_rank, cp_rank, dp_rank)). */
    int kind;
    uintptr_t addr;
    PyObject *addr_obj, *cfg_obj;
    if (!PyArg_ParseTuple(args, "iOO", &kind, &addr_obj, &cfg_obj)) return NULL;
    if (arg_handle(addr_obj, "comm handle", &addr) < 0) return NULL;
    NEED(sph_comm_destroy);
    if (kind < 0 || kind > 4)
        return raise_fmt(SPH_ERR_INVALID_ARG, "comm: unknown communicator kind %d", kind);
    sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
    if (kind != 0 && comm_cfg(cfg_obj, &cfg) < 0) return NULL;
    sph_comm_t c = NULL;
    sph_status s;
    void *h = (void *)addr;
    if ((kind == 1 || kind == 2 || kind == 3) && !h)
        return raise_status(SPH_ERR_INVALID_ARG, "comm: the communicator handle is NULL");
    switch (kind) {
    case 0:
        NEED(sph_comm_create_none);
        s = lib.sph_comm_create_none(&c);
        return wrap_comm(s, c);
    case 1:
        NEED(sph_comm_create_mpi);
        SPH_NOGIL(s = lib.sph_comm_create_mpi(&c, h, &cfg));
        return wrap_comm(s, c);
    case 2:
        NEED(sph_comm_create_nccl);
        SPH_NOGIL(s = lib.sph_comm_create_nccl(&c, h, &cfg));
        return wrap_comm(s, c);
    case 3:
        NEED(sph_comm_create_nccl_mpi);
        SPH_NOGIL(s = lib.sph_comm_create_nccl_mpi(&c, h, &cfg));
        return wrap_comm(s, c);
    case 4: {
        NEED(sph_comm_create_mpi_world);
        int64_t r[3] = {0, 0, 0};
        SPH_NOGIL(s = lib.sph_comm_create_mpi_world(&c, &cfg, &r[0], &r[1], &r[2]));
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
PyObject *py_comm_destroy(PyObject *self, PyObject *args) {
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    if (!PyCapsule_IsValid(cap, COMM_NAME)) Py_RETURN_NONE;
    sph_comm_t c = PyCapsule_GetPointer(cap, COMM_NAME);
    if (PyCapsule_SetDestructor(cap, NULL) < 0) return NULL;
    if (PyCapsule_SetName(cap, "spanhead.comm.destroyed") < 0) return NULL;
    if (c && lib.sph_comm_destroy) lib.sph_comm_destroy(c);
    Py_RETURN_NONE;
}

PyObject *py_comm_info(PyObject *self, PyObject *args) {
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
PyObject *py_tune(PyObject *self, PyObject *args) {
    PyObject *cap, *H, *V_loc, *N, *repeats;
    int code, bits, verbose;
    if (!PyArg_ParseTuple(args, "OiiOOOOi", &cap, &code, &bits, &H, &V_loc, &N, &repeats,
                          &verbose))
        return NULL;
    NEED(sph_tune);
    sph_ctx_t c = ctx_of(cap);
    if (!c) return NULL;
    sph_tune_opts o = SPH_TUNE_OPTS_INIT;
    o.dtype.code = (uint8_t)code;
    o.dtype.bits = (uint8_t)bits;
    o.dtype.lanes = 1;
    if (arg_i64(H, "H", &o.H) < 0 || arg_i64(V_loc, "V_loc", &o.V_loc) < 0 ||
        arg_i64(N, "N", &o.N) < 0 || arg_int(repeats, "repeats", &o.repeats) < 0)
        return NULL;
    o.verbose = verbose;
    const char *result = NULL;
    sph_status s;
    SPH_NOGIL(s = lib.sph_tune(c, &o, &result));
    if (s) return raise_lib(s);
    return PyUnicode_FromString(result ? result : "");
}

/* gemm_rate(ctx, code, bits, M, N, K, repeats) -> TFLOP/s of the dense product, one at a time;
 * gemm_rate_sustained(ctx, code, bits, M, N, K, chain, repeats) -> of `chain` products back to
 * back. */
static PyObject *gemm_rate_of(PyObject *args, int sustained) {
    PyObject *cap, *M_obj, *N_obj, *K_obj, *chain_obj = NULL, *rep_obj;
    int code, bits, chain = 1, repeats;
    if (sustained ? !PyArg_ParseTuple(args, "OiiOOOOO", &cap, &code, &bits, &M_obj, &N_obj,
                                      &K_obj, &chain_obj, &rep_obj)
                  : !PyArg_ParseTuple(args, "OiiOOOO", &cap, &code, &bits, &M_obj, &N_obj,
                                      &K_obj, &rep_obj))
        return NULL;
    if (sustained) NEED(sph_tune_gemm_rate_sustained);
    else NEED(sph_tune_gemm_rate);
    sph_ctx_t c = ctx_of(cap);
    if (!c) return NULL;
    int64_t M, N, K;
    if (arg_i64(M_obj, "M", &M) < 0 || arg_i64(N_obj, "N", &N) < 0 ||
        arg_i64(K_obj, "K", &K) < 0 || arg_int(rep_obj, "repeats", &repeats) < 0 ||
        (chain_obj && arg_int(chain_obj, "chain", &chain) < 0))
        return NULL;
    sph_dtype dt = {(uint8_t)code, (uint8_t)bits, 1};
    double tflops = 0.0;
    sph_status s;
    SPH_NOGIL(s = sustained ? lib.sph_tune_gemm_rate_sustained(c, dt, M, N, K, chain, repeats,
                                                               &tflops)
                            : lib.sph_tune_gemm_rate(c, dt, M, N, K, repeats, &tflops));
    if (s) return raise_lib(s);
    return PyFloat_FromDouble(tflops);
}
PyObject *py_gemm_rate(PyObject *self, PyObject *args) { return gemm_rate_of(args, 0); }
PyObject *py_gemm_rate_sustained(PyObject *self, PyObject *args) {
    return gemm_rate_of(args, 1);
}
