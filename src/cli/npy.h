/*
 * npy.h - a small reader/writer of NumPy .npy files (format versions 1.0 and 2.0, C order,
 * little-endian) for the CLI. dtypes: <f4 <f8 <f2 <u2 <i4 <i8 |u1 |b1. bf16 is not a NumPy
 * dtype: it travels as <u2 (the raw 16 bits), and the caller says what it means (--dtype bf16).
 */
#ifndef SPH_CLI_NPY_H
#define SPH_CLI_NPY_H

#include <stddef.h>
#include <stdint.h>

typedef struct npy_array {
    char kind;        /* 'f' float, 'i' signed, 'u' unsigned, 'b' bool */
    int bytes;        /* element size */
    int ndim;
    int64_t shape[8];
    int64_t count;    /* elements */
    void *data;       /* malloc'ed, count * bytes */
} npy_array;

/* Reads path into *a. Returns 0, or -1 with a message in err. */
int npy_read(const char *path, npy_array *a, char *err, size_t err_len);
/* Writes count elements of the given kind/bytes with the shape; 0 or -1 with err. */
int npy_write(const char *path, char kind, int bytes, int ndim, const int64_t *shape,
              const void *data, char *err, size_t err_len);
void npy_free(npy_array *a);
/* "<f4"-style descr of an array, for messages. */
const char *npy_descr(const npy_array *a);

#endif
