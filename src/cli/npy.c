/*
 * npy.c - .npy reading and writing (see npy.h). The header is a Python dict literal; only the
 * three keys NumPy writes are understood: 'descr', 'fortran_order' and 'shape'.
 */
#include "npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *err, size_t n, const char *path, const char *msg) {
    snprintf(err, n, "%s: %s", path, msg);
    return -1;
}

void npy_free(npy_array *a) {
    if (!a) return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

const char *npy_descr(const npy_array *a) {
    static char buf[8];
    snprintf(buf, sizeof buf, "%c%c%d", a->bytes == 1 ? '|' : '<', a->kind, a->bytes);
    return buf;
}

/* Finds 'key': in the header and returns a pointer just after the colon. */
static const char *find_key(const char *hdr, const char *key) {
    char pat[32];
    snprintf(pat, sizeof pat, "'%s'", key);
    const char *p = strstr(hdr, pat);
    if (!p) return NULL;
    p += strlen(pat);
    while (*p == ' ') p++;
    if (*p != ':') return NULL;
    p++;
    while (*p == ' ') p++;
    return p;
}

int npy_read(const char *path, npy_array *a, char *err, size_t err_len) {
    memset(a, 0, sizeof *a);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        return -1;
    }
    unsigned char magic[8];
    char *hdr = NULL;
    int rc = -1;
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "\x93NUMPY", 6) != 0) {
        fail(err, err_len, path, "not a .npy file (bad magic)");
        goto done;
    }
    size_t hlen;
    if (magic[6] == 1) {
        unsigned char l[2];
        if (fread(l, 1, 2, f) != 2) goto trunc;
        hlen = (size_t)l[0] | (size_t)l[1] << 8;
    } else if (magic[6] == 2 || magic[6] == 3) {
        unsigned char l[4];
        if (fread(l, 1, 4, f) != 4) goto trunc;
        hlen = (size_t)l[0] | (size_t)l[1] << 8 | (size_t)l[2] << 16 | (size_t)l[3] << 24;
    } else {
        fail(err, err_len, path, "unsupported .npy format version");
        goto done;
    }
    if (hlen > (1u << 20)) {
        fail(err, err_len, path, "header too large");
        goto done;
    }
    hdr = malloc(hlen + 1);
    if (!hdr || fread(hdr, 1, hlen, f) != hlen) goto trunc;
    hdr[hlen] = 0;
    const char *d = find_key(hdr, "descr");
    if (!d || (*d != '\'' && *d != '"')) {
        fail(err, err_len, path, "header has no 'descr'");
        goto done;
    }
    char endian = d[1], kind = d[2];
    int bytes = atoi(d + 3);
    if (endian == '>' && bytes > 1) {
        fail(err, err_len, path, "big-endian data is not supported");
        goto done;
    }
    if (!((kind == 'f' && (bytes == 2 || bytes == 4 || bytes == 8)) ||
          (kind == 'i' && (bytes == 4 || bytes == 8)) || (kind == 'u' && (bytes == 1 || bytes == 2)) ||
          (kind == 'b' && bytes == 1))) {
        snprintf(err, err_len, "%s: dtype '%c%c%d' not supported (f2 f4 f8 i4 i8 u1 u2 b1)",
                 path, endian, kind, bytes);
        goto done;
    }
    const char *fo = find_key(hdr, "fortran_order");
    if (!fo || strncmp(fo, "False", 5) != 0) {
        fail(err, err_len, path, "only C-ordered arrays are supported (fortran_order False)");
        goto done;
    }
    const char *s = find_key(hdr, "shape");
    if (!s || *s != '(') {
        fail(err, err_len, path, "header has no 'shape'");
        goto done;
    }
    s++;
    int64_t count = 1;
    while (*s && *s != ')') {
        while (*s == ' ' || *s == ',') s++;
        if (*s == ')') break;
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < 0 || a->ndim >= 8) {
            fail(err, err_len, path, "bad shape in header");
            goto done;
        }
        a->shape[a->ndim++] = v;
        if (v && count > INT64_MAX / v) {
            fail(err, err_len, path, "shape overflows");
            goto done;
        }
        count *= v;
        s = end;
    }
    a->kind = kind;
    a->bytes = bytes;
    a->count = count;
    size_t nbytes = (size_t)count * (size_t)bytes;
    a->data = malloc(nbytes ? nbytes : 1);
    if (!a->data) {
        fail(err, err_len, path, "out of memory");
        goto done;
    }
    if (fread(a->data, 1, nbytes, f) != nbytes) goto trunc;
    rc = 0;
    goto done;
trunc:
    fail(err, err_len, path, "truncated file");
done:
    if (rc) npy_free(a);
    free(hdr);
    fclose(f);
    return rc;
}

int npy_write(const char *path, char kind, int bytes, int ndim, const int64_t *shape,
              const void *data, char *err, size_t err_len) {
    char dict[256], sh[160] = "";
    size_t count = 1;
    for (int d = 0; d < ndim; d++) {
        char t[24];
        snprintf(t, sizeof t, "%lld%s", (long long)shape[d], ndim == 1 ? "," : (d + 1 < ndim ? ", " : ""));
        strncat(sh, t, sizeof sh - strlen(sh) - 1);
        count *= (size_t)shape[d];
    }
    int n = snprintf(dict, sizeof dict, "{'descr': '%c%c%d', 'fortran_order': False, 'shape': (%s), }",
                     bytes == 1 ? '|' : '<', kind, bytes, sh);
    /* magic(6) + version(2) + len(2) + dict + padding + '\n' = multiple of 64 */
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        return -1;
    }
    size_t hlen = (size_t)n + pad + 1;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                             (unsigned char)(hlen & 0xff), (unsigned char)(hlen >> 8)};
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)n, f) == (size_t)n;
    for (size_t k = 0; k < pad && ok; k++) ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF;
    ok = ok && fwrite(data, (size_t)bytes, count, f) == count;
    if (fclose(f) != 0) ok = 0;
    if (!ok) {
        snprintf(err, err_len, "%s: write failed: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}
