/*
 * fuzz_npy.c - libFuzzer target for the CLI's .npy reader (src/cli/npy.c). The first byte picks
 * the mode: read the rest as a file of known size (what `spanhead run --inputs` does), as a
 * stream of unknown size, or parse it as a header dict alone. Whatever the bytes, the reader
 * must return cleanly: on success the shape, element count and byte count agree with each
 * other and with the input's size, and the array written back and read again is the same; on
 * failure a one-line message naming the file and nothing allocated.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "npy.h"

static void check_fail(int rc, const npy_array *a, const char *err) {
    CHECK(rc == -1 && a->data == NULL && a->ndim == 0);
    CHECK(err[0] != '\0' && strchr(err, '\n') == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int mode = data[0] % 3;
    data++, size--;
    npy_array a;
    char err[512] = "";
    if (mode == 2) {
        memset(&a, 0, sizeof a);
        int rc = npy_parse_header((const char *)data, size, &a, err, sizeof err);
        if (rc) {
            CHECK(err[0] != '\0' && strchr(err, '\n') == NULL);
            return 0;
        }
        int64_t count = 1;
        for (int d = 0; d < a.ndim; d++) count *= a.shape[d];
        CHECK(a.count == count && a.ndim <= NPY_MAX_NDIM && a.data == NULL);
        CHECK(a.bytes == 1 || a.bytes == 2 || a.bytes == 4 || a.bytes == 8);
        return 0;
    }
    FILE *f = fmemopen((void *)data, size ? size : 1, "rb");
    if (!f) return 0;
    if (!size) fgetc(f); /* an empty stream: fmemopen wants a buffer of at least one byte */
    int rc = npy_read_stream(f, "fuzz.npy", mode == 0 ? (int64_t)size : -1, &a, err, sizeof err);
    fclose(f);
    if (rc) {
        check_fail(rc, &a, err);
        CHECK(!strncmp(err, "fuzz.npy: ", 10));
        return 0;
    }
    int64_t count = 1;
    for (int d = 0; d < a.ndim; d++) count *= a.shape[d];
    CHECK(a.count == count && a.data != NULL);
    const size_t nbytes = (size_t)a.count * (size_t)a.bytes;
    CHECK(nbytes <= size);
    /* magic + version + length + header, then exactly the data */
    const size_t pre = data[6] == 1 ? 10 : 12;
    const size_t hlen = data[6] == 1 ? (size_t)data[8] | (size_t)data[9] << 8
                                     : (size_t)data[8] | (size_t)data[9] << 8 |
                                           (size_t)data[10] << 16 | (size_t)data[11] << 24;
    CHECK(pre + hlen + nbytes == size);
    CHECK(!memcmp(a.data, data + pre + hlen, nbytes));
    /* written back and read again: the same array */
    char *buf = NULL;
    size_t len = 0;
    FILE *w = open_memstream(&buf, &len);
    CHECK(w != NULL);
    CHECK(npy_write_stream(w, a.kind, a.bytes, a.ndim, a.shape, a.data, err, sizeof err) == 0);
    fclose(w);
    FILE *r = fmemopen(buf, len, "rb");
    CHECK(r != NULL);
    npy_array b;
    CHECK(npy_read_stream(r, "again.npy", (int64_t)len, &b, err, sizeof err) == 0);
    fclose(r);
    CHECK(b.kind == a.kind && b.bytes == a.bytes && b.ndim == a.ndim && b.count == a.count);
    for (int d = 0; d < a.ndim; d++) CHECK(b.shape[d] == a.shape[d]);
    CHECK(!memcmp(a.data, b.data, nbytes));
    npy_free(&b);
    npy_free(&a);
    free(buf);
    return 0;
}
