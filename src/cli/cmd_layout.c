/*
 * cmd_layout.c - `spanhead layout`: the packed segment layout of sequence lengths.
 *   spanhead layout --tp T --cp C [--fp8 none|blockwise|mxfp8] L1 L2 ...
 * prints {"sequence_align":..,"total_align":..,"padded_lengths":[..],"cu_seqlens_padded":[..]}.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "json_util.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: spanhead layout [--tp T] [--cp C] [--fp8 none|blockwise|mxfp8] L1 L2 ...\n"
            "\n"
            "Pads each sequence length to the sequence alignment (2*T*C under CP, else 1), grows\n"
            "the final segment so the total is a multiple of the total alignment (T or 2*T*C,\n"
            "lcm'd with the FP8 token alignment) and prints, as one line of JSON:\n"
            "  {\"sequence_align\":..,\"total_align\":..,\"padded_lengths\":[..],"
            "\"cu_seqlens_padded\":[..]}\n"
            "\n"
            "  --tp T    tensor-parallel size (default 1)\n"
            "  --cp C    context-parallel size (default 1)\n"
            "  --fp8 R   FP8 recipe: none (default), blockwise, mxfp8\n"
            "Exit status: 0 ok, 1 bad lengths, 2 usage error.\n");
}

int sph_cli_layout(int argc, char **argv) {
    sph_parallel par = SPH_PARALLEL_INIT;
    int64_t *len = malloc(sizeof(int64_t) * (size_t)(argc + 1));
    int64_t n = 0;
    char err[512];
    int rc = 0;
    if (!len) return sph_cli_fail("layout", 1, "out of memory");
    for (int i = 1; i < argc; i++) {
        int matched = 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            free(len);
            return 0;
        }
        if (sph_cli_par_opt(argc, argv, &i, &par, &matched, err, sizeof err)) {
            rc = sph_cli_fail("layout", 2, "%s", err);
            goto done;
        }
        if (matched) continue;
        if (argv[i][0] == '-' && argv[i][1] == '-') {
            rc = sph_cli_fail("layout", 2, "unknown option '%s' (see --help)", argv[i]);
            goto done;
        }
        if (sph_cli_parse_i64(argv[i], INT64_MIN, INT64_MAX, &len[n])) {
            rc = sph_cli_fail("layout", 2, "length '%s' is not an integer", argv[i]);
            goto done;
        }
        n++;
    }
    if (n == 0) {
        rc = sph_cli_fail("layout", 2, "expected at least one sequence length (see --help)");
        goto done;
    }
    sph_alignment al;
    int64_t *pad = malloc(sizeof(int64_t) * (size_t)n), *cu = malloc(sizeof(int64_t) * (size_t)(n + 1));
    sph_status st = pad && cu ? sph_alignment_get(&par, &al) : SPH_ERR_ALLOC;
    if (st == SPH_OK) st = sph_layout_packed(&par, len, n, pad, cu);
    if (st != SPH_OK) {
        rc = sph_cli_fail("layout", 1, "%s", st == SPH_ERR_ALLOC && !(pad && cu) ? "out of memory"
                                                                               : sph_last_error());
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
done:
    free(len);
    return rc;
}
