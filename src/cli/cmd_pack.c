/*
 * cmd_pack.c - `spanhead pack`: bin packing of sequence lengths.
 *   spanhead pack --capacity N [--algorithm ffd|mffd|balanced] [--tp T --cp C --fp8 ..]
 *                 [--min-bins K] [--bin-multiple D] FILE|-
 * reads a JSON array of lengths (or one length per line) and prints
 * {"bins":[[index,..],..],"bin_tokens":[..],"utilization":x}.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "json_util.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: spanhead pack --capacity N [--algorithm ffd|mffd|balanced]\n"
            "                     [--tp T] [--cp C] [--fp8 none|blockwise|mxfp8]\n"
            "                     [--min-bins K] [--bin-multiple D] FILE|-\n"
            "\n"
            "Packs sequence lengths (a JSON array, or one integer per line, from FILE or stdin)\n"
            "into bins of at most N tokens. A sequence costs its length padded to the sequence\n"
            "alignment of T, C; N is rounded down to the total alignment so each bin's packed\n"
            "layout fits. Prints one line of JSON:\n"
            "  {\"bins\":[[index,..],..],\"bin_tokens\":[..],\"utilization\":x}\n"
            "with sequence indices by increasing index inside each bin, padded tokens per bin and\n"
            "sum(tokens) / (bins * N).\n"
            "\n"
            "  --capacity N      tokens per bin (required)\n"
            "  --algorithm A     ffd (default): first-fit decreasing; mffd: Johnson & Garey's\n"
            "                    modified FFD; balanced: least-loaded, a sequence longer than N\n"
            "                    gets a bin of its own\n"
            "  --tp T, --cp C    parallel sizes (default 1); --fp8 R: none, blockwise, mxfp8\n"
            "  --min-bins K      at least K bins\n"
            "  --bin-multiple D  a multiple of D bins (the data-parallel size)\n"
            "Exit status: 0 ok, 1 bad input data or infeasible request, 2 usage error.\n");
}

int sph_cli_pack(int argc, char **argv) {
    sph_pack_opts o = SPH_PACK_OPTS_INIT;
    const char *path = NULL, *v = NULL;
    char err[512];
    int have_cap = 0;
    for (int i = 1; i < argc; i++) {
        int matched = 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (sph_cli_par_opt(argc, argv, &i, &o.par, &matched, err, sizeof err))
            return sph_cli_fail("pack", 2, "%s", err);
        if (matched) continue;
        if (sph_cli_opt(argc, argv, &i, "--capacity", &v)) {
            if (sph_cli_parse_i64(v, 1, INT64_MAX, &o.capacity))
                return sph_cli_fail("pack", 2, "--capacity: '%s' is not an integer >= 1", v ? v : "");
            have_cap = 1;
        } else if (sph_cli_opt(argc, argv, &i, "--algorithm", &v)) {
            if (v && !strcmp(v, "ffd")) o.algorithm = SPH_PACK_FFD;
            else if (v && !strcmp(v, "mffd")) o.algorithm = SPH_PACK_MFFD;
            else if (v && !strcmp(v, "balanced")) o.algorithm = SPH_PACK_BALANCED;
            else return sph_cli_fail("pack", 2, "--algorithm: '%s', expected ffd, mffd or balanced", v ? v : "");
        } else if (sph_cli_opt(argc, argv, &i, "--min-bins", &v)) {
            if (sph_cli_parse_i64(v, 0, INT64_MAX, &o.min_bins))
                return sph_cli_fail("pack", 2, "--min-bins: '%s' is not an integer >= 0", v ? v : "");
        } else if (sph_cli_opt(argc, argv, &i, "--bin-multiple", &v)) {
            if (sph_cli_parse_i64(v, 1, INT64_MAX, &o.bin_multiple))
                return sph_cli_fail("pack", 2, "--bin-multiple: '%s' is not an integer >= 1", v ? v : "");
        } else {
            int rc = sph_cli_file_arg("pack", argv[i], &path);
            if (rc) return rc;
        }
    }
    if (!have_cap) return sph_cli_fail("pack", 2, "--capacity is required (see --help)");
    if (!path) return sph_cli_fail("pack", 2, "expected a FILE of lengths or - (see --help)");
    char *text = NULL;
    size_t len = 0;
    if (sph_cli_read_file(path, &text, &len, err, sizeof err)) return sph_cli_fail("pack", 1, "%s", err);
    int64_t *lengths = NULL, n = 0;
    int rc = sph_cli_lengths_parse(text, len, &lengths, &n, err, sizeof err);
    free(text);
    if (rc) return sph_cli_fail("pack", 1, "%s: %s", path, err);
    sph_pack_result *r = NULL;
    sph_status st = sph_pack(lengths, n, &o, &r);
    if (st != SPH_OK) {
        rc = sph_cli_fail("pack", 1, "%s: %s", path, sph_last_error());
    } else {
        printf("{\"bins\":[");
        for (int64_t b = 0; b < r->n_bins; b++) {
            if (b) putchar(',');
            sph_cli_write_i64_array(stdout, r->items + r->bin_offsets[b],
                                    r->bin_offsets[b + 1] - r->bin_offsets[b]);
        }
        printf("],\"bin_tokens\":");
        sph_cli_write_i64_array(stdout, r->bin_tokens, r->n_bins);
        printf(",\"utilization\":%.6f}\n", r->utilization);
    }
    sph_pack_free(r);
    free(lengths);
    return rc;
}
