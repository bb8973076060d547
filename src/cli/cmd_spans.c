/*
 * cmd_spans.c - `spanhead spans`: active mask and spans of a batch description.
 *   spanhead spans [--tp T --cp C --cp-rank R --fp8 .. --gap G] FILE|-
 * reads {"layout":"packed"|"unpacked","sequence_length":S,"num_actions":A,"loss_mask":[[..]],
 * "attention_mask":[[..]] (optional),"sub_seq_lengths":[[..]] (optional)} and prints
 * {"active_mask":[..],"active_rows":n,"local_rows":n,"local_active_rows":n,"spans":[[s,e],..]}.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "json_util.h"
#include "msg.h"


/* options: sph_cli_spans_opts (opts.c) */

static const char k_synopsis[] =
    "usage: spanhead spans [--tp T] [--cp C] [--cp-rank R] [--fp8 none|blockwise|mxfp8]\n"
    "                      [--gap G] FILE|-";
static const char k_about[] =
    "Reads a batch description (JSON) from FILE or stdin:\n"
    "  {\"layout\":\"packed\"|\"unpacked\",\"sequence_length\":S,\"num_actions\":A,\n"
    "   \"loss_mask\":[[A values] x B],\"attention_mask\":[[S values] x B] (optional),\n"
    "   \"sub_seq_lengths\":[[lengths] x B] (optional)}\n"
    "and prints the forward active mask of the full layout, the row counts and this CP\n"
    "rank's ordered [start, end) spans over its local rows, as one line of JSON:\n"
    "  {\"active_mask\":[..],\"active_rows\":n,\"local_rows\":n,\"local_active_rows\":n,"
    "\"spans\":[[s,e],..]}\n"
    "See docs/metadata.md for the exact row semantics.";

int sph_cli_spans(int argc, char **argv) {
    sph_spans_opts so = SPH_SPANS_OPTS_INIT;
    spans_opts o = {1, 1, 0, so.gap, 0};
    const char *path = NULL;
    char err[512];
    int done = 0, rc = sph_cli_parse_file_cmd("spans", k_synopsis, k_about, sph_cli_spans_opts, argc, argv,
                                              &o, &path, &done);
    if (done) return rc;
    if (o.cp_rank >= o.cp)
        return sph_cli_fail("spans", 2, "--cp-rank %lld: expected < --cp = %lld",
                            (long long)o.cp_rank, (long long)o.cp);
    so.par = (sph_parallel){o.tp, o.cp, (sph_fp8)o.fp8};
    so.cp_rank = o.cp_rank;
    so.gap = o.gap;
    char *text = NULL;
    size_t len = 0;
    if (sph_cli_read_file(path, &text, &len, err, sizeof err)) return sph_cli_fail("spans", 1, "%s", err);
    sph_cli_batch bt;
    if (sph_cli_batch_parse(text, len, &bt, err, sizeof err)) {
        free(text);
        return sph_cli_fail("spans", 1, "%s: %s", path, err);
    }
    free(text);
    sph_spans *s = NULL;
    sph_status st = sph_spans_build(&bt.desc, &so, &s);
    if (st != SPH_OK) {
        rc = sph_cli_fail("spans", 1, "%s: %s", path, sph_last_error());
    } else {
        printf("{\"active_mask\":");
        sph_cli_write_u8_array(stdout, s->active_mask, s->global_rows);
        printf(",\"active_rows\":%lld,\"local_rows\":%lld,\"local_active_rows\":%lld,\"spans\":[",
               (long long)s->active_rows, (long long)s->local_rows, (long long)s->local_active_rows);
        for (int64_t k = 0; k < s->n_spans; k++)
            printf(k ? ",[%lld,%lld]" : "[%lld,%lld]", (long long)s->spans[2 * k],
                   (long long)s->spans[2 * k + 1]);
        printf("]}\n");
    }
    sph_spans_free(s);
    sph_cli_batch_free(&bt);
    return rc;
}
