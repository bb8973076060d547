/*
 * npy.c - .npy reading and writing (see npy.h). The header is a Python dict literal, parsed
 * here by a small recursive-descent reader of exactly the grammar NumPy writes:
 *   { 'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }   then spaces and '\n'
 * (keys in any order, single or double quotes, an optional trailing comma, Python 2's 3L).
 */
#include "npy.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "half.h"

static int fail(char *err, size_t n, const char *name, const char *msg) {
    snprintf(err, n, "%s: %s", name, msg);
    return -1;
}

void npy_free(npy_array *a) {
    if (!a) return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

const char *npy_descr(const npy_array *a) { return a->descr; }

double npy_at(const npy_array *a, int64_t i) {
    const char *p = (const char *)a->data + (size_t)i * (size_t)a->bytes;
    switch (a->kind) {
    case 'f':
        if (a->bytes == 4) { float v; memcpy(&v, p, 4); return v; }
        if (a->bytes == 8) { double v; memcpy(&v, p, 8); return v; }
        if (a->bytes == 2) { uint16_t v; memcpy(&v, p, 2); return sph_cli_f16_to_f32(v); }
        break;
    case 'i':
        if (a->bytes == 4) { int32_t v; memcpy(&v, p, 4); return v; }
        if (a->bytes == 8) { int64_t v; memcpy(&v, p, 8); return (double)v; }
        break;
    case 'u':
        if (a->bytes == 1) return (unsigned char)*p;
        if (a->bytes == 2) { uint16_t v; memcpy(&v, p, 2); return v; }
        break;
    case 'b':
        return *p != 0;
    }
    return NAN;
}

// ---- the header dict -------------------------------------------------------------------------

typedef struct cursor {
    const char *p, *end;
} cursor;

static void skip_ws(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int eat(cursor *c, char ch) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* A quoted string of printable characters, without escapes, into out (at most n - 1
 * characters): NumPy's keys and dtypes are such strings, and messages quote them. */
static int string(cursor *c, char *out, size_t n) {
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return 0;
    const char q = *c->p++;
    size_t k = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || *c->p < 0x20 || *c->p > 0x7e || k + 1 >= n) return 0;
        out[k++] = *c->p++;
    }
    if (c->p >= c->end) return 0;
    c->p++;
    out[k] = '\0';
    return 1;
}

static int word(cursor *c, const char *w) {
    skip_ws(c);
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n)) return 0;
    c->p += n;
    return 1;
}

/* A non-negative decimal integer (optional L suffix) <= INT64_MAX. */
static int integer(cursor *c, int64_t *out) {
    skip_ws(c);
    if (c->p >= c->end || *c->p < '0' || *c->p > '9') return 0;
    int64_t v = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        int d = *c->p++ - '0';
        if (v > (INT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
    }
    if (c->p < c->end && *c->p == 'L') c->p++;
    *out = v;
    return 1;
}

int npy_parse_header(const char *text, size_t len, npy_array *a, char *err, size_t err_len) {
    const char *H = "header";
    cursor c = {text, text + len};
    char key[32], descr[32];
    int have_descr = 0, have_fo = 0, have_shape = 0, fortran = 0;
    a->ndim = 0;
    if (memchr(text, '\0', len)) return fail(err, err_len, H, "NUL byte in the header");
    if (!eat(&c, '{')) return fail(err, err_len, H, "does not start with '{'");
    for (;;) {
        if (eat(&c, '}')) break;
        if (!string(&c, key, sizeof key))
            return fail(err, err_len, H, "expected a quoted key or '}'");
        if (!eat(&c, ':')) return fail(err, err_len, H, "expected ':' after a key");
        if (!strcmp(key, "descr")) {
            if (have_descr++) return fail(err, err_len, H, "'descr' given twice");
            if (!string(&c, descr, sizeof descr))
                return fail(err, err_len, H, "'descr' is not a simple dtype string such as '<f4' "
                                             "(structured dtypes are not supported)");
        } else if (!strcmp(key, "fortran_order")) {
            if (have_fo++) return fail(err, err_len, H, "'fortran_order' given twice");
            if (word(&c, "True")) fortran = 1;
            else if (!word(&c, "False"))
                return fail(err, err_len, H, "'fortran_order' is neither True nor False");
        } else if (!strcmp(key, "shape")) {
            if (have_shape++) return fail(err, err_len, H, "'shape' given twice");
            if (!eat(&c, '(')) return fail(err, err_len, H, "'shape' is not a tuple");
            while (!eat(&c, ')')) {
                int64_t v;
                if (a->ndim == NPY_MAX_NDIM)
                    return fail(err, err_len, H, "'shape' has more than 8 dimensions");
                if (!integer(&c, &v))
                    return fail(err, err_len, H, "'shape' holds something other than "
                                                 "non-negative integers below 2^63");
                a->shape[a->ndim++] = v;
                if (!eat(&c, ',')) {
                    if (!eat(&c, ')')) return fail(err, err_len, H, "'shape' is not a tuple");
                    break;
                }
            }
        } else {
            char msg[96];
            snprintf(msg, sizeof msg, "unknown key '%.32s' (expected descr, fortran_order, shape)",
                     key);
            return fail(err, err_len, H, msg);
        }
        if (!eat(&c, ',')) {
            if (!eat(&c, '}')) return fail(err, err_len, H, "expected ',' or '}'");
            break;
        }
    }
    skip_ws(&c);
    if (c.p != c.end) return fail(err, err_len, H, "data after the closing '}'");
    if (!have_descr || !have_fo || !have_shape)
        return fail(err, err_len, H, !have_descr ? "no 'descr'"
                                     : !have_fo  ? "no 'fortran_order'"
                                                 : "no 'shape'");
    /* descr: byte order, kind, size */
    char order = descr[0], kind = order ? descr[1] : 0;
    int bytes = 0, ok = order && kind && descr[2];
    for (const char *d = descr + 2; ok && *d; d++) {
        ok = *d >= '0' && *d <= '9' && bytes < 100;
        bytes = bytes * 10 + (*d - '0');
    }
    char msg[128];
    if (!ok || !strchr("<>|=", order)) {
        snprintf(msg, sizeof msg, "dtype '%.16s' not understood", descr);
        return fail(err, err_len, H, msg);
    }
    if (!((kind == 'f' && (bytes == 2 || bytes == 4 || bytes == 8)) ||
          (kind == 'i' && (bytes == 4 || bytes == 8)) || (kind == 'u' && (bytes == 1 || bytes == 2)) ||
          (kind == 'b' && bytes == 1))) {
        snprintf(msg, sizeof msg, "dtype '%.16s' not supported (f2 f4 f8 i4 i8 u1 u2 b1)", descr);
        return fail(err, err_len, H, msg);
    }
    if (order == '>' && bytes > 1) return fail(err, err_len, H, "big-endian data is not supported");
    if (fortran)
        return fail(err, err_len, H, "Fortran-ordered array (fortran_order True) is not supported: "
                                     "save a C-ordered copy (numpy.ascontiguousarray)");
    int64_t count = 1;
    for (int d = 0; d < a->ndim; d++) {
        if (a->shape[d] && count > INT64_MAX / a->shape[d])
            return fail(err, err_len, H, "'shape' has more than 2^63 elements");
        count *= a->shape[d];
    }
    if ((uint64_t)count > SIZE_MAX / (uint64_t)bytes)
        return fail(err, err_len, H, "'shape' describes more bytes than memory can address");
    a->kind = kind;
    a->bytes = bytes;
    a->count = count;
    snprintf(a->descr, sizeof a->descr, "%c%c%d", bytes == 1 ? '|' : '<', kind, bytes);
    return 0;
}

// ---- reading ---------------------------------------------------------------------------------

int npy_read_stream(FILE *f, const char *name, int64_t file_bytes, npy_array *a, char *err,
                    size_t err_len) {
    memset(a, 0, sizeof *a);
    unsigned char magic[8];
    char *hdr = NULL, e2[256];
    int rc = -1;
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "\x93NUMPY", 6) != 0) {
        fail(err, err_len, name, "not a .npy file (bad magic)");
        goto done;
    }
    size_t hlen, pre;
    if (magic[6] == 1) {
        unsigned char l[2];
        if (fread(l, 1, 2, f) != 2) goto trunc;
        hlen = (size_t)l[0] | (size_t)l[1] << 8;
        pre = 10;
    } else if (magic[6] == 2 || magic[6] == 3) {
        unsigned char l[4];
        if (fread(l, 1, 4, f) != 4) goto trunc;
        hlen = (size_t)l[0] | (size_t)l[1] << 8 | (size_t)l[2] << 16 | (size_t)l[3] << 24;
        pre = 12;
    } else {
        snprintf(e2, sizeof e2, "unsupported .npy format version %u.%u", magic[6], magic[7]);
        fail(err, err_len, name, e2);
        goto done;
    }
    if (hlen > (1u << 20)) {
        fail(err, err_len, name, "header longer than 1 MiB");
        goto done;
    }
    if (file_bytes >= 0 && (int64_t)(pre + hlen) > file_bytes) goto trunc;
    hdr = malloc(hlen + 1);
    if (!hdr) {
        fail(err, err_len, name, "out of memory for the header");
        goto done;
    }
    if (fread(hdr, 1, hlen, f) != hlen) goto trunc;
    hdr[hlen] = 0;
    if (npy_parse_header(hdr, hlen, a, e2, sizeof e2)) {
        fail(err, err_len, name, e2);
        goto done;
    }
    const size_t nbytes = (size_t)a->count * (size_t)a->bytes; /* checked by the parser */
    if (file_bytes >= 0) {
        uint64_t have = (uint64_t)file_bytes - (pre + hlen);
        if (have != nbytes) {
            snprintf(e2, sizeof e2, "%s: the header's shape needs %zu data bytes, the file holds "
                                    "%llu", have < nbytes ? "truncated" : "trailing data",
                     nbytes, (unsigned long long)have);
            fail(err, err_len, name, e2);
            goto done;
        }
    }
    /* A stream of unknown size (a pipe) is read into a buffer that grows with what arrives,
     * so a header that claims more than the stream holds cannot make the reader allocate it
     * (the fuzzer's 11 GB bool array of a 200-byte input); a regular file's size was checked
     * against the header above. */
    const size_t step = (size_t)1 << 26;
    size_t cap = file_bytes < 0 && nbytes > step ? step : nbytes, got = 0;
    a->data = malloc(cap ? cap : 1);
    while (a->data) {
        size_t n = fread((char *)a->data + got, 1, cap - got, f);
        got += n;
        if (got == nbytes || n == 0) break;
        size_t grown = cap > nbytes / 2 ? nbytes : 2 * cap;
        void *q = realloc(a->data, grown);
        if (!q) {
            free(a->data);
            a->data = NULL;
            break;
        }
        a->data = q, cap = grown;
    }
    if (!a->data) {
        snprintf(e2, sizeof e2, "out of memory for %zu data bytes", nbytes);
        fail(err, err_len, name, e2);
        goto done;
    }
    if (got != nbytes) goto trunc;
    if (file_bytes < 0 && fgetc(f) != EOF) {
        fail(err, err_len, name, "trailing data after the array");
        goto done;
    }
    rc = 0;
    goto done;
trunc:
    fail(err, err_len, name, ferror(f) ? "read error" : "truncated file");
done:
    if (rc) npy_free(a);
    free(hdr);
    return rc;
}

int npy_read(const char *path, npy_array *a, char *err, size_t err_len) {
    memset(a, 0, sizeof *a);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    int64_t size = fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) ? (int64_t)st.st_size : -1;
    if (size < 0 && fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        snprintf(err, err_len, "%s: is a directory", path);
        return -1;
    }
    int rc = npy_read_stream(f, path, size, a, err, err_len);
    fclose(f);
    return rc;
}

int npy_read_in(const char *dir, const char *name, npy_array *a, char *err, size_t err_len) {
    char path[4096];
    memset(a, 0, sizeof *a);
    if ((size_t)snprintf(path, sizeof path, "%s/%s.npy", dir, name) >= sizeof path) {
        snprintf(err, err_len, "--inputs %s: path too long", dir);
        return -1;
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT) return 0;
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        return -1;
    }
    return npy_read(path, a, err, err_len) ? -1 : 1;
}

// ---- writing ---------------------------------------------------------------------------------

int npy_write_stream(FILE *f, char kind, int bytes, int ndim, const int64_t *shape,
                     const void *data, char *err, size_t err_len) {
    char dict[256], sh[NPY_MAX_NDIM * 22 + 4] = "";
    size_t count = 1;
    if (ndim < 0 || ndim > NPY_MAX_NDIM) {
        snprintf(err, err_len, "%d dimensions (at most %d)", ndim, NPY_MAX_NDIM);
        return -1;
    }
    for (int d = 0; d < ndim; d++) {
        char t[24];
        snprintf(t, sizeof t, "%lld%s", (long long)shape[d],
                 ndim == 1 ? "," : (d + 1 < ndim ? ", " : ""));
        strncat(sh, t, sizeof sh - strlen(sh) - 1);
        count *= (size_t)shape[d];
    }
    int n = snprintf(dict, sizeof dict,
                     "{'descr': '%c%c%d', 'fortran_order': False, 'shape': (%s), }",
                     bytes == 1 ? '|' : '<', kind, bytes, sh);
    /* magic(6) + version(2) + len(2) + dict + padding + '\n' = multiple of 64 */
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = (size_t)n + pad + 1;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                             (unsigned char)(hlen & 0xff), (unsigned char)(hlen >> 8)};
    errno = 0;
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)n, f) == (size_t)n;
    for (size_t k = 0; k < pad && ok; k++) ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF;
    ok = ok && (count == 0 || fwrite(data, (size_t)bytes, count, f) == count);
    ok = ok && fflush(f) == 0;
    if (!ok) {
        snprintf(err, err_len, "write failed: %s", errno ? strerror(errno) : "I/O error");
        return -1;
    }
    return 0;
}
