/*
 * fuzz_spans_json.c - libFuzzer target for the batch-description JSON reader and
 * sph_spans_build. Input: 4 option bytes (tp, cp, cp_rank, fp8 + gap) then JSON text. Any input
 * must either be refused with a message or yield output that satisfies the invariants below;
 * anything else (a crash, a sanitizer report, a broken invariant) is a finding.
 */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "json_util.h"
#include "spanhead.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    sph_spans_opts o = SPH_SPANS_OPTS_INIT;
    o.par.tp = 1 + data[0] % 4;
    o.par.cp = 1 + data[1] % 4;
    o.cp_rank = data[2] % 5; /* sometimes out of range on purpose */
    o.par.fp8 = (sph_fp8)(data[3] % 3);
    o.gap = (data[3] / 3) % 40 == 39 ? -1 : (data[3] / 3) % 40;
    char err[512];
    sph_cli_batch bt;
    if (sph_cli_batch_parse((const char *)data + 4, size - 4, &bt, err, sizeof err)) {
        CHECK(err[0] != '\0');
        return 0;
    }
    /* keep each run small: the builder is linear in the rows, the fuzzer wants many runs */
    if (bt.desc.batch > 0 && bt.desc.seq_len > (1 << 20) / bt.desc.batch) {
        sph_cli_batch_free(&bt);
        return 0;
    }
    sph_spans *s = NULL;
    sph_status st = sph_spans_build(&bt.desc, &o, &s);
    if (st != SPH_OK) {
        CHECK(s == NULL);
        CHECK(sph_last_error()[0] != '\0');
        CHECK(st != SPH_ERR_INTERNAL);
    } else {
        CHECK(s->local_rows * o.par.cp == s->global_rows);
        CHECK(s->local_active_rows <= s->active_rows);
        if (o.par.cp == 1) CHECK(s->local_active_rows == s->active_rows);
        CHECK(sph_spans_validate(s->spans, s->n_spans, s->local_rows, s->local_mask) == SPH_OK);
        int64_t na = 0, nl = 0;
        for (int64_t i = 0; i < s->global_rows; i++) na += s->active_mask[i];
        for (int64_t i = 0; i < s->local_rows; i++) nl += s->local_mask[i];
        CHECK(na == s->active_rows && nl == s->local_active_rows);
        int64_t ones = 0;
        for (int64_t i = 0; i < bt.desc.batch * bt.desc.num_actions; i++) ones += bt.loss_mask[i];
        CHECK(ones == s->active_rows); /* every loss-carrying token has exactly one row */
        for (int64_t k = 0; k < s->n_spans; k++) {
            CHECK(s->local_mask[s->spans[2 * k]] && s->local_mask[s->spans[2 * k + 1] - 1]);
            if (k) CHECK(s->spans[2 * k] - s->spans[2 * k - 1] > o.gap);
        }
    }
    sph_spans_free(s);
    sph_cli_batch_free(&bt);
    return 0;
}
