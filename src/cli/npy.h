/*
 * npy.h - a reader/writer of NumPy .npy files (format versions 1.0, 2.0 and 3.0, C order,
 * little-endian) for the CLI. dtypes: <f4 <f8 <f2 <u2 <i4 <i8 |u1 |b1. bf16 is not a NumPy
 * dtype: it travels as <u2 (the raw 16 bits), and the caller says what it means (--dtype bf16).
 *
 * The reader trusts nothing in the file: the header must be exactly the dict NumPy writes
 * ('descr', 'fortran_order', 'shape', each once, nothing else), the element count and byte
 * count must fit in int64 and size_t, and the file must hold exactly that many data bytes
 * (checked before anything is allocated). Every failure is one message naming the file.
 */
#ifndef SPH_CLI_NPY_H
#define SPH_CLI_NPY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define NPY_MAX_NDIM 8

typedef struct npy_array {
    char kind;        /* 'f' float, 'i' signed, 'u' unsigned, 'b' bool */
    int bytes;        /* element size */
    int ndim;
    int64_t shape[NPY_MAX_NDIM];
    int64_t count;    /* elements */
    void *data;       /* malloc'ed, count * bytes */
    char descr[8];    /* "<f4" as read, for messages */
} npy_array;

/* Parses the header dict text (len bytes, not necessarily NUL-terminated) into a's kind,
 * bytes, ndim, shape and count (data stays NULL). 0, or -1 with a message in err. */
int npy_parse_header(const char *text, size_t len, npy_array *a, char *err, size_t err_len);
/* Reads an .npy stream; name is used in messages; file_bytes is the stream's size
 * (header included) when known (a regular file), else -1. 0, or -1 with err. */
int npy_read_stream(FILE *f, const char *name, int64_t file_bytes, npy_array *a, char *err,
                    size_t err_len);
/* Reads path into *a. Returns 0, or -1 with a message in err. */
int npy_read(const char *path, npy_array *a, char *err, size_t err_len);
/* DIR/name.npy of an --inputs folder, where present: 1 read into *a, 0 absent (no such
 * file), -1 with a message in err (a path too long, a file that cannot be read or parsed). */
int npy_read_in(const char *dir, const char *name, npy_array *a, char *err, size_t err_len);
/* Writes the array (ndim <= NPY_MAX_NDIM) of the given kind/bytes; 0 or -1 with err. The
 * stream is not closed. */
int npy_write_stream(FILE *f, char kind, int bytes, int ndim, const int64_t *shape,
                     const void *data, char *err, size_t err_len);
void npy_free(npy_array *a);
/* Element i of a numeric array as a double (any dtype above; bf16 bits read as u2 are the
 * caller's to convert). */
double npy_at(const npy_array *a, int64_t i);
/* "<f4"-style descr of an array, for messages (stored in a: two in one message are fine). */
const char *npy_descr(const npy_array *a);

#endif
