/*
 * cmd_layout.c - `spanhead layout`: the packed segment layout of sequence lengths.
 *   spanhead layout --tp T --cp C [--fp8 none|blockwise|mxfp8] L1 L2 ...
 * prints {"sequence_align":..,"total_align":..,"padded_lengths":[..],"cu_seqlens_padded":[..]}.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "json_util.h"
#include "msg.h"
#include "num.h"


/* options: sph_cli_layout_opts (opts.c) */

static const char k_synopsis[] =
    "usage: spanhead layout [--tp T] [--cp C] [--fp8 none|blockwise|mxfp8] L1 L2 ...";
static const char k_about[] =
    "Pads each sequence length to the sequence alignment (2*T*C under CP, else 1), grows\n"
    "the final segment so the total is a multiple of the total alignment (T or 2*T*C,\n"
    "lcm'd with the FP8 token alignment) and prints, as one line of JSON:\n"
    "  {\"sequence_align\":..,\"total_align\":..,\"padded_lengths\":[..],"
    "\"cu_seqlens_padded\":[..]}";

int sph_cli_layout(int argc, char **argv) {
    layout_opts o = {1, 1, 0};
    const char **pos = malloc(sizeof(char *) * (size_t)(argc + 1));
    int64_t *len = malloc(sizeof(int64_t) * (size_t)(argc + 1));
    int done = 0, rc = 0;
    if (!pos || !len) {
        free(pos), free(len);
        return sph_cli_fail("layout", 1, "out of memory");
    }
    sph_cli_parsed p = {.pos = pos};
    rc = sph_cli_parse_or_exit("layout", k_synopsis, k_about, sph_cli_layout_opts, argc, argv, &o, &p, &done);
    if (done) goto out;
    int64_t n = p.n_pos;
    for (int64_t k = 0; k < n; k++)
        if (sph_cli_parse_i64(pos[k], INT64_MIN, INT64_MAX, &len[k])) {
            rc = sph_cli_fail("layout", 2, "length '%s' is not an integer", pos[k]);
            goto out;
        }
    if (n == 0) {
        rc = sph_cli_fail("layout", 2, "expected at least one sequence length (see --help)");
        goto out;
    }
    sph_parallel par = {o.tp, o.cp, (sph_fp8)o.fp8};
    sph_alignment al;
    int64_t *pad = malloc(sizeof(int64_t) * (size_t)n), *cu = malloc(sizeof(int64_t) * (size_t)(n + 1));
    sph_status st = pad && cu ? sph_alignment_get(&par, &al) : SPH_ERR_ALLOC;
    if (st == SPH_OK) st = sph_layout_packed(&par, len, n, pad, cu);
    if (st != SPH_OK) {
        rc = sph_cli_fail("layout", 1, "%s", !(pad && cu) ? "out of memory" : sph_last_error());
    } else {
        printf("{\"sequence_align\":%lld,\"total_align\":%lld,\"padded_lengths\":",
               (long long)al.sequence, (long long)al.total);
        sph_cli_write_i64_array(stdout, pad, n);
        printf(",\"cu_seqlens_padded\":");
        sph_cli_write_i64_array(stdout, cu, n + 1);
        printf("}\n");
    }
    free(pad);
    free(cu);
out:
    free(pos);
    free(len);
    return rc;
}
