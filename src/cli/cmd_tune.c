/*
 * cmd_tune.c - `spanhead tune`: times the CUDA head's candidate configurations (rows per
 * staged chunk, vocabulary split width) for one or more shapes and appends the winners to the
 * tune cache (sph_tune; format in include/spanhead.h). Progress goes to stderr, one summary
 * line per shape to stdout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"


static void usage(FILE *f) {
    fprintf(f,
            "usage: spanhead tune [options]\n"
            "  --dtype bf16|f16|f32   (default bf16)\n"
            "  --H N --V N            hidden size and local vocabulary (required)\n"
            "  --N 16K,64K            token counts (one tuned entry per power-of-two bucket)\n"
            "  --repeats N            timed repetitions per candidate (default 5)\n"
            "  --cache PATH           tune cache (default $SPH_TUNE_CACHE, else\n"
            "                         $XDG_CACHE_HOME/spanhead/tune.json or ~/.cache/...)\n"
            "  --device-id N          CUDA device (default 0)\n"
            "  --quiet                no per-candidate timings on stderr\n");
}

int sph_cli_tune(int argc, char **argv) {
    sph_tune_opts to = SPH_TUNE_OPTS_INIT;
    to.dtype = SPH_BF16;
    to.verbose = 1;
    const char *cache = NULL, *Ns = "16K";
    int dev_id = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--quiet")) {
            to.verbose = 0;
            continue;
        }
        const char *v = i + 1 < argc ? argv[++i] : NULL;
        if (!v) return sph_cli_fail("tune", 2, "%s needs a value (--help)", a);
        if (!strcmp(a, "--dtype")) {
            if (!strcmp(v, "bf16")) to.dtype = SPH_BF16;
            else if (!strcmp(v, "f16")) to.dtype = SPH_F16;
            else if (!strcmp(v, "f32")) to.dtype = SPH_F32;
            else return sph_cli_fail("tune", 2, "--dtype %s: expected bf16, f16 or f32", v);
        } else if (!strcmp(a, "--H")) {
            to.H = atoll(v);
        } else if (!strcmp(a, "--V")) {
            to.V_loc = atoll(v);
        } else if (!strcmp(a, "--N")) {
            Ns = v;
        } else if (!strcmp(a, "--repeats")) {
            to.repeats = atoi(v);
        } else if (!strcmp(a, "--cache")) {
            cache = v;
        } else if (!strcmp(a, "--device-id")) {
            dev_id = atoi(v);
        } else {
            return sph_cli_fail("tune", 2, "unknown option %s (--help)", a);
        }
    }
    if (to.H <= 0 || to.V_loc <= 0) return sph_cli_fail("tune", 2, "--H and --V are required");
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.device.type = SPH_DEVICE_CUDA;
    o.device.id = dev_id;
    o.tune_cache = cache;
    sph_ctx_t ctx;
    if (sph_ctx_create(&ctx, &o) != SPH_OK)
        return sph_cli_fail("tune", 1, "context: %s", sph_last_error());
    char buf[256];
    snprintf(buf, sizeof buf, "%s", Ns);
    int rc = 0;
    for (char *t = strtok(buf, ","); t && !rc; t = strtok(NULL, ",")) {
        char *end;
        double n = strtod(t, &end);
        if (*end == 'K' || *end == 'k') n *= 1024, end++;
        if (*end || n < 1) {
            rc = sph_cli_fail("tune", 2, "--N %s: expected counts like 16K,64K", t);
            break;
        }
        to.N = (int64_t)n;
        const char *res = NULL;
        if (sph_tune(ctx, &to, &res) != SPH_OK) {
            rc = sph_cli_fail("tune", 1, "%s", sph_last_error());
            break;
        }
        printf("%s\n", res);
    }
    sph_ctx_destroy(ctx);
    return rc;
}
