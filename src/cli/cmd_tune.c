/*
 * cmd_tune.c - `spanhead tune`: times the CUDA head's candidate configurations (rows per
 * staged chunk, vocabulary split width) for one or more shapes and appends the winners to the
 * tune cache (sph_tune; format in include/spanhead.h). One summary line per token count to
 * stdout; per-candidate timings (unless --quiet) and, on a terminal, progress to stderr.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "msg.h"
#include "progress.h"



/* options: sph_cli_tune_opts (opts.c) */

int sph_cli_tune(int argc, char **argv) {
    tune_opts o;
    memset(&o, 0, sizeof o);
    o.repeats = 5;
    sph_cli_parsed pp = {0};
    int done, rc = sph_cli_parse_or_exit(
        "tune", "usage: spanhead tune --H N --V N [options]",
        "Autotunes the CUDA head for a shape (needs a GPU): each candidate configuration is\n"
        "timed on random data and the winner appended to the tune cache, which contexts read\n"
        "at creation.",
        sph_cli_tune_opts, argc, argv, &o, &pp, &done);
    if (done) return rc;
    if (!o.H || !o.V) return sph_cli_fail("tune", 2, "--H and --V are required (see --help)");
    if (!o.N.n) o.N = (sph_cli_list){.n = 1, .i = {16384}};
    static const sph_dtype dts[3] = {{SPH_DTYPE_BFLOAT, 16, 1}, {SPH_DTYPE_FLOAT, 16, 1},
                                     {SPH_DTYPE_FLOAT, 32, 1}};
    sph_tune_opts to = SPH_TUNE_OPTS_INIT;
    to.dtype = dts[o.dtype];
    to.H = o.H;
    to.V_loc = o.V;
    to.repeats = (int)o.repeats;
    to.verbose = !o.quiet;
    sph_ctx_opts co = SPH_CTX_OPTS_INIT;
    co.device.type = SPH_DEVICE_CUDA;
    co.device.id = (int32_t)o.device_id;
    co.tune_cache = o.cache;
    sph_ctx_t ctx;
    if (sph_ctx_create(&ctx, &co) != SPH_OK)
        return sph_cli_fail("tune", 1, "context: %s", sph_last_error());
    sph_cli_progress pr;
    sph_cli_progress_start(&pr, "spanhead tune: token counts", o.N.n);
    for (int k = 0; k < o.N.n && !rc; k++) {
        to.N = o.N.i[k];
        const char *res = NULL;
        sph_status s = sph_tune(ctx, &to, &res);
        sph_cli_progress_end(&pr);
        if (s != SPH_OK) {
            rc = sph_cli_fail("tune", 1, "--N %lld: %s", (long long)to.N, sph_last_error());
            break;
        }
        printf("%s\n", res ? res : "");
        fflush(stdout);
        sph_cli_progress_step(&pr, k + 1);
    }
    sph_cli_progress_end(&pr);
    sph_ctx_destroy(ctx);
    return rc;
}
