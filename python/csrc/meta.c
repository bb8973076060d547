/*
 * meta.c - the host metadata of the extension: alignment, packed layouts, CP rows, spans and
 * bin packing (the same dictionaries as the CLI's JSON are built in Python from these).
 */
#include "_spanhead.h"

#include <stdio.h>
#include <string.h>

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
        char item[96];
        snprintf(item, sizeof item, "%s[%zd]", name, i);
        int rc = arg_i64(it, item, &a[i]);
        Py_DECREF(it);
        if (rc < 0) goto fail;
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

PyObject *list_from_i64(const int64_t *a, int64_t n) {
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

static int parallel_arg(PyObject *tp, PyObject *cp, int fp8, sph_parallel *par) {
    if (arg_i64(tp, "tp", &par->tp) < 0 || arg_i64(cp, "cp", &par->cp) < 0) return -1;
    par->fp8 = (sph_fp8)fp8;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Host metadata                                                                              */
/* ---------------------------------------------------------------------------------------- */

PyObject *py_alignment(PyObject *self, PyObject *args) {
    PyObject *tp, *cp;
    int fp8;
    if (!PyArg_ParseTuple(args, "OOi", &tp, &cp, &fp8)) return NULL;
    NEED(sph_alignment_get);
    sph_parallel par;
    if (parallel_arg(tp, cp, fp8, &par) < 0) return NULL;
    sph_alignment a;
    sph_status s = lib.sph_alignment_get(&par, &a);
    if (s) return raise_lib(s);
    return Py_BuildValue("(LLL)", (long long)a.sequence, (long long)a.total,
                         (long long)a.unpacked);
}

PyObject *py_layout_packed(PyObject *self, PyObject *args) {
    PyObject *tp, *cp;
    int fp8;
    PyObject *lens_obj;
    if (!PyArg_ParseTuple(args, "OOiO", &tp, &cp, &fp8, &lens_obj)) return NULL;
    NEED(sph_layout_packed);
    sph_parallel par;
    if (parallel_arg(tp, cp, fp8, &par) < 0) return NULL;
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

PyObject *py_cp_local_rows(PyObject *self, PyObject *args) {
    PyObject *P_obj, *cp_obj, *rank_obj;
    if (!PyArg_ParseTuple(args, "OOO", &P_obj, &cp_obj, &rank_obj)) return NULL;
    NEED(sph_cp_local_rows);
    int64_t P, cp, rank;
    if (arg_i64(P_obj, "padded_length", &P) < 0 || arg_i64(cp_obj, "cp", &cp) < 0 ||
        arg_i64(rank_obj, "cp_rank", &rank) < 0)
        return NULL;
    if (P < 0 || cp < 1 || P / cp > ((int64_t)PY_SSIZE_T_MAX / 16))
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
PyObject *py_spans_build(PyObject *self, PyObject *args) {
    int layout, fp8;
    PyObject *B_obj, *S_obj, *A_obj, *tp_obj, *cp_obj, *cp_rank_obj, *gap_obj;
    PyObject *lm_obj, *am_obj, *ssl_obj, *ssc_obj;
    if (!PyArg_ParseTuple(args, "iOOOOOOOOOiOO", &layout, &B_obj, &S_obj, &A_obj, &lm_obj,
                          &am_obj, &ssl_obj, &ssc_obj, &tp_obj, &cp_obj, &fp8, &cp_rank_obj,
                          &gap_obj))
        return NULL;
    NEED(sph_spans_build);
    NEED(sph_spans_free);
    int64_t B, S, A, cp_rank, gap;
    if (arg_i64(B_obj, "batch", &B) < 0 || arg_i64(S_obj, "sequence_length", &S) < 0 ||
        arg_i64(A_obj, "num_actions", &A) < 0 || arg_i64(cp_rank_obj, "cp_rank", &cp_rank) < 0 ||
        arg_i64(gap_obj, "gap", &gap) < 0)
        return NULL;
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
    if (B < 0 || A < 0 || S < 0 || (A && B > (int64_t)lm_n / A) || (int64_t)lm_n != B * A) {
        return raise_status(SPH_ERR_SHAPE, "spans: loss_mask must hold batch * num_actions "
                                           "entries");
    }
    if (am && (S && B > (int64_t)am_n / (S ? S : 1))) {
        return raise_status(SPH_ERR_SHAPE, "spans: attention_mask must hold batch * "
                                           "sequence_length entries");
    }
    if (am && (int64_t)am_n != B * S)
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
    if (parallel_arg(tp_obj, cp_obj, fp8, &o.par) < 0) goto done;
    o.cp_rank = cp_rank;
    o.gap = gap;
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

PyObject *py_spans_from_mask(PyObject *self, PyObject *args) {
    PyObject *mobj, *gap_obj;
    if (!PyArg_ParseTuple(args, "OO", &mobj, &gap_obj)) return NULL;
    NEED(sph_spans_from_mask);
    int64_t gap;
    if (arg_i64(gap_obj, "gap", &gap) < 0) return NULL;
    const uint8_t *m;
    Py_ssize_t n;
    if (bytes_arg(mobj, "mask", &m, &n) < 0) return NULL;
    int64_t cap = 2 * ((n + 1) / 2 + 2);
    int64_t *sp = PyMem_Malloc((size_t)cap * sizeof *sp);
    if (!sp) return PyErr_NoMemory();
    int64_t ns = 0;
    sph_status s = lib.sph_spans_from_mask(m, (int64_t)n, gap, sp, &ns);
    PyObject *res = s ? raise_lib(s) : pairs_from_i64(sp, ns);
    PyMem_Free(sp);
    return res;
}

PyObject *py_spans_validate(PyObject *self, PyObject *args) {
    PyObject *flat_obj, *mobj, *n_obj;
    if (!PyArg_ParseTuple(args, "OOO", &flat_obj, &n_obj, &mobj)) return NULL;
    NEED(sph_spans_validate);
    int64_t n;
    if (arg_i64(n_obj, "n", &n) < 0) return NULL;
    const uint8_t *m = NULL;
    Py_ssize_t mn = 0;
    if (mobj != Py_None) {
        if (bytes_arg(mobj, "mask", &m, &mn) < 0) return NULL;
        if ((int64_t)mn != n)
            return raise_status(SPH_ERR_SHAPE, "spans_validate: mask length differs from n");
    }
    int64_t *flat = NULL, nf = 0;
    if (seq_to_i64(flat_obj, "spans", &flat, &nf) < 0) return NULL;
    if (nf % 2) {
        PyMem_Free(flat);
        return raise_status(SPH_ERR_SHAPE, "spans_validate: spans must be [start, end] pairs");
    }
    sph_status s = lib.sph_spans_validate(flat, nf / 2, n, m);
    PyMem_Free(flat);
    if (s) return raise_lib(s);
    Py_RETURN_NONE;
}

PyObject *py_pack(PyObject *self, PyObject *args) {
    PyObject *lens_obj, *capacity, *tp, *cp, *min_bins, *bin_multiple;
    int algo, fp8;
    if (!PyArg_ParseTuple(args, "OOiOOiOO", &lens_obj, &capacity, &algo, &tp, &cp, &fp8,
                          &min_bins, &bin_multiple))
        return NULL;
    NEED(sph_pack);
    NEED(sph_pack_free);
    sph_pack_opts o = SPH_PACK_OPTS_INIT;
    o.algorithm = (sph_pack_algo)algo;
    if (arg_i64(capacity, "capacity", &o.capacity) < 0 ||
        parallel_arg(tp, cp, fp8, &o.par) < 0 || arg_i64(min_bins, "min_bins", &o.min_bins) < 0 ||
        arg_i64(bin_multiple, "bin_multiple", &o.bin_multiple) < 0)
        return NULL;
    int64_t *lens = NULL, n = 0;
    if (seq_to_i64(lens_obj, "lengths", &lens, &n) < 0) return NULL;
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
