/*
 * fuzz_pack.c - libFuzzer target for the length-list reader and sph_pack. Input: 8 option bytes
 * (capacity, algorithm, tp, cp, fp8, min_bins, bin_multiple, input mode) then either text (a
 * JSON array or one length per line, through the CLI's reader) or raw little-endian uint16
 * lengths. A successful packing must place every sequence once, keep every bin non-empty and
 * within capacity (balanced: except a lone oversized sequence) and meet the bin-count targets.
 */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "json_util.h"
#include "spanhead.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 8) return 0;
    sph_pack_opts o = SPH_PACK_OPTS_INIT;
    o.capacity = (int64_t)(data[0] | (data[1] << 8)) - 16; /* non-positive values included */
    o.algorithm = (sph_pack_algo)(data[2] % 4);            /* 3 is invalid on purpose */
    o.par.tp = 1 + data[3] % 4;
    o.par.cp = 1 + (data[3] / 4) % 4;
    o.par.fp8 = (sph_fp8)((data[3] / 16) % 3);
    o.min_bins = data[4] % 64;
    o.bin_multiple = data[5] % 9;
    const int raw = data[6] & 1;
    data += 8;
    size -= 8;
    int64_t *len = NULL, n = 0;
    if (raw) {
        n = (int64_t)(size / 2);
        len = malloc(sizeof(int64_t) * (size_t)(n + 1));
        if (!len) return 0;
        for (int64_t i = 0; i < n; i++) len[i] = (int64_t)(data[2 * i] | (data[2 * i + 1] << 8)) - 8;
    } else {
        char err[512];
        if (sph_cli_lengths_parse((const char *)data, size, &len, &n, err, sizeof err)) {
            CHECK(err[0] != '\0' && len == NULL);
            return 0;
        }
    }
    if (n > 200000) {
        free(len);
        return 0;
    }
    sph_pack_result *r = NULL;
    sph_status st = sph_pack(len, n, &o, &r);
    if (st != SPH_OK) {
        CHECK(r == NULL && sph_last_error()[0] != '\0' && st != SPH_ERR_INTERNAL);
        free(len);
        return 0;
    }
    sph_alignment al;
    CHECK(sph_alignment_get(&o.par, &al) == SPH_OK);
    const int64_t cap = o.capacity / al.total * al.total;
    char *seen = calloc((size_t)n + 1, 1);
    CHECK(seen != NULL);
    CHECK(r->n_items == n && r->bin_offsets[0] == 0 && r->bin_offsets[r->n_bins] == n);
    CHECK(r->n_bins >= o.min_bins && r->n_bins % (o.bin_multiple > 1 ? o.bin_multiple : 1) == 0);
    for (int64_t b = 0; b < r->n_bins; b++) {
        const int64_t s = r->bin_offsets[b], e = r->bin_offsets[b + 1];
        CHECK(e > s);
        int64_t tok = 0;
        for (int64_t j = s; j < e; j++) {
            const int64_t i = r->items[j];
            CHECK(i >= 0 && i < n && !seen[i]);
            seen[i] = 1;
            tok += (len[i] + al.sequence - 1) / al.sequence * al.sequence;
        }
        CHECK(tok == r->bin_tokens[b]);
        CHECK(tok <= cap || (o.algorithm == SPH_PACK_BALANCED && e - s == 1));
    }
    free(seen);
    sph_pack_free(r);
    free(len);
    return 0;
}
