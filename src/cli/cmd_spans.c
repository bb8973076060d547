/*
 * cmd_spans.c - `spanhead spans`: active mask and spans of a batch description.
 *   spanhead spans [--tp T --cp C --cp-rank R --fp8 .. --gap G] FILE|-
 * reads {"layout":"packed"|"unpacked","sequence_length":S,"num_actions":A,"loss_mask":[[..]],
 * "attention_mask":[[..]] (optional),"sub_seq_lengths":[[..]] (optional)} and prints
 * {"active_mask":[..],"active_rows":n,"local_rows":n,"local_active_rows":n,"spans":[[s,e],..]}.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "json_util.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: spanhead spans [--tp T] [--cp C] [--cp-rank R] [--fp8 none|blockwise|mxfp8]\n"
            "                      [--gap G] FILE|-\n"
            "\n"
            "Reads a batch description (JSON) from FILE or stdin:\n"
            "  {\"layout\":\"packed\"|\"unpacked\",\"sequence_length\":S,\"num_actions\":A,\n"
            "   \"loss_mask\":[[A values] x B],\"attention_mask\":[[S values] x B] (optional),\n"
            "   \"sub_seq_lengths\":[[lengths] x B] (optional)}\n"
            "and prints the forward active mask of the full layout, the row counts and this CP\n"
            "rank's ordered [start, end) spans over its local rows, as one line of JSON:\n"
            "  {\"active_mask\":[..],\"active_rows\":n,\"local_rows\":n,\"local_active_rows\":n,"
            "\"spans\":[[s,e],..]}\n"
            "\n"
            "  --tp T, --cp C   parallel sizes (default 1)\n"
            "  --cp-rank R      this context-parallel rank, 0 <= R < C (default 0)\n"
            "  --fp8 R          FP8 recipe: none (default), blockwise, mxfp8\n"
            "  --gap G          merge active runs across at most G inactive rows (default 128)\n"
            "See docs/metadata.md for the exact row semantics.\n"
            "Exit status: 0 ok, 1 bad input data, 2 usage error.\n");
}

int sph_cli_spans(int argc, char **argv) {
    sph_spans_opts o = SPH_SPANS_OPTS_INIT;
    const char *path = NULL, *v = NULL;
    char err[512];
    for (int i = 1; i < argc; i++) {
        int matched = 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (sph_cli_par_opt(argc, argv, &i, &o.par, &matched, err, sizeof err))
            return sph_cli_fail("spans", 2, "%s", err);
        if (matched) continue;
        if (sph_cli_opt(argc, argv, &i, "--cp-rank", &v)) {
            if (sph_cli_parse_i64(v, 0, INT64_MAX, &o.cp_rank))
                return sph_cli_fail("spans", 2, "--cp-rank: '%s' is not an integer >= 0", v ? v : "");
        } else if (sph_cli_opt(argc, argv, &i, "--gap", &v)) {
            if (sph_cli_parse_i64(v, 0, INT64_MAX, &o.gap))
                return sph_cli_fail("spans", 2, "--gap: '%s' is not an integer >= 0", v ? v : "");
        } else {
            int rc = sph_cli_file_arg("spans", argv[i], &path);
            if (rc) return rc;
        }
    }
    if (!path) return sph_cli_fail("spans", 2, "expected a batch description FILE or - (see --help)");
    if (o.cp_rank >= o.par.cp)
        return sph_cli_fail("spans", 2, "--cp-rank: %lld, expected < --cp = %lld",
                            (long long)o.cp_rank, (long long)o.par.cp);
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
    sph_status st = sph_spans_build(&bt.desc, &o, &s);
    int rc = 0;
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
