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

static const char *const k_dtypes[] = {"bf16", "f16", "f32", NULL};

typedef struct tune_opts {
    int dtype, quiet;
    int64_t H, V, repeats, device_id;
    sph_cli_list N;
    const char *cache;
} tune_opts;

#define O(f) offsetof(tune_opts, f)
static const sph_cli_opt k_opts[] = {
    {"--dtype", "bf16|f16|f32", SPH_OPT_CHOICE, O(dtype), 0, 0, 0, 0, k_dtypes, 0, "(default bf16)"},
    {"--H", "N", SPH_OPT_COUNT, O(H), 1, INT32_MAX, 0, 0, NULL, 0, "hidden size (required)"},
    {"--V", "N", SPH_OPT_COUNT, O(V), 1, INT32_MAX, 0, 0, NULL, 0,
     "local vocabulary V_loc (required)"},
    {"--N", "16K,64K", SPH_OPT_COUNTS, O(N), 1, (int64_t)1 << 40, 0, 0, NULL, 0,
     "token counts, one tuned entry per power-of-two bucket\n(default 16K)"},
    {"--repeats", "N", SPH_OPT_I64, O(repeats), 1, 1000, 0, 0, NULL, 0,
     "timed repetitions per candidate (default 5)"},
    {"--cache", "PATH", SPH_OPT_STR, O(cache), 0, 0, 0, 0, NULL, 0,
     "tune cache (default $SPH_TUNE_CACHE, else\n"
     "$XDG_CACHE_HOME/spanhead/tune.json or ~/.cache/...)"},
    {"--device-id", "N", SPH_OPT_I64, O(device_id), 0, 1 << 16, 0, 0, NULL, 0,
     "CUDA device (default 0)"},
    {"--quiet", NULL, SPH_OPT_FLAG, O(quiet), 0, 0, 0, 0, NULL, 0,
     "no per-candidate timings on stderr"},
    {NULL}};
#undef O

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
        k_opts, argc, argv, &o, &pp, &done);
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
