/*
 * cmd_pack.c - `spanhead pack`: bin packing of sequence lengths.
 *   spanhead pack --capacity N [--algorithm ffd|mffd|balanced] [--tp T --cp C --fp8 ..]
 *                 [--min-bins K] [--bin-multiple D] FILE|-
 * reads a JSON array of lengths (or one length per line) and prints
 * {"bins":[[index,..],..],"bin_lengths":[[length,..],..],"bin_tokens":[..],"utilization":x}.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "json_util.h"
#include "msg.h"



/* options: sph_cli_pack_opts (opts.c) */

static const char k_synopsis[] =
    "usage: spanhead pack --capacity N [--algorithm ffd|mffd|balanced]\n"
    "                     [--tp T] [--cp C] [--fp8 none|blockwise|mxfp8]\n"
    "                     [--min-bins K] [--bin-multiple D] FILE|-";
static const char k_about[] =
    "Packs sequence lengths (a JSON array, or one integer per line, from FILE or stdin)\n"
    "into bins of at most N tokens. A sequence costs its length padded to the sequence\n"
    "alignment of T, C; N is rounded down to the total alignment so each bin's packed\n"
    "layout fits. Prints one line of JSON:\n"
    "  {\"bins\":[[index,..],..],\"bin_lengths\":[[length,..],..],\"bin_tokens\":[..],\n"
    "   \"utilization\":x}\n"
    "with sequence indices by increasing index inside each bin, their lengths, padded tokens\n"
    "per bin and sum(tokens) / (bins * N).";

int sph_cli_pack(int argc, char **argv) {
    pack_opts o = {0, 1, 1, 0, 1, 0, 0};
    const char *path = NULL;
    char err[512];
    int done = 0, rc = sph_cli_parse_file_cmd("pack", k_synopsis, k_about, sph_cli_pack_opts, argc, argv,
                                              &o, &path, &done);
    if (done) return rc;
    if (!o.capacity) return sph_cli_fail("pack", 2, "--capacity is required (see --help)");
    sph_pack_opts po = SPH_PACK_OPTS_INIT;
    po.capacity = o.capacity;
    po.algorithm = (sph_pack_algo)o.algorithm;
    po.par = (sph_parallel){o.tp, o.cp, (sph_fp8)o.fp8};
    po.min_bins = o.min_bins;
    po.bin_multiple = o.bin_multiple;
    char *text = NULL;
    size_t len = 0;
    if (sph_cli_read_file(path, &text, &len, err, sizeof err)) return sph_cli_fail("pack", 1, "%s", err);
    int64_t *lengths = NULL, n = 0;
    rc = sph_cli_lengths_parse(text, len, &lengths, &n, err, sizeof err);
    free(text);
    if (rc) return sph_cli_fail("pack", 1, "%s: %s", path, err);
    sph_pack_result *r = NULL;
    sph_status st = sph_pack(lengths, n, &po, &r);
    if (st != SPH_OK) {
        rc = sph_cli_fail("pack", 1, "%s: %s", path, sph_last_error());
    } else {
        printf("{\"bins\":[");
        for (int64_t b = 0; b < r->n_bins; b++) {
            if (b) putchar(',');
            sph_cli_write_i64_array(stdout, r->items + r->bin_offsets[b],
                                    r->bin_offsets[b + 1] - r->bin_offsets[b]);
        }
        printf("],\"bin_lengths\":[");
        for (int64_t b = 0; b < r->n_bins; b++) {
            printf(b ? ",[" : "[");
            for (int64_t k = r->bin_offsets[b]; k < r->bin_offsets[b + 1]; k++)
                printf(k > r->bin_offsets[b] ? ",%lld" : "%lld", (long long)lengths[r->items[k]]);
            putchar(']');
        }
        printf("],\"bin_tokens\":");
        sph_cli_write_i64_array(stdout, r->bin_tokens, r->n_bins);
        /* %.9g: a tiny utilization (5.4e-19) stays a number, not 0.000000 */
        printf(",\"utilization\":%.9g}\n", r->utilization);
    }
    sph_pack_free(r);
    free(lengths);
    return rc;
}
