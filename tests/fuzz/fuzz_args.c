/*
 * fuzz_args.c - libFuzzer target for the CLI's argument parser (src/cli/args.c) over the option
 * table of every subcommand (src/cli/opts.c). Input: one byte choosing the table, then the
 * arguments separated by NUL bytes. Whatever argv holds, the parser must return 0, --help or
 * a usage error (2) whose message is one line that names the offending option (a table name,
 * or the argument itself for an unknown one); a parsed value lies inside its row's bounds.
 * The walk that picks `run`'s runner (sph_cli_scan) sees, on any argv the table parses, exactly
 * the options the parse saw, and walks any argv over all the tables without a fault.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "fuzz.h"
#include "opts.h"

static const sph_cli_opt *const k_tables[] = {sph_cli_layout_opts, sph_cli_pack_opts,
                                             sph_cli_spans_opts,  sph_cli_tune_opts,
                                             sph_cli_run_opts,    sph_cli_dist_opts,
                                             sph_cli_bench_opts};

/* Every value the table put in dst lies within its row's bounds. */
static void check_values(const sph_cli_opt *t, const sph_cli_parsed *p, const void *dst) {
    for (int k = 0; t[k].name && k < 64; k++) {
        if (!p->given[k]) continue;
        const char *at = (const char *)dst + t[k].off;
        int64_t i;
        double d;
        int c;
        switch (t[k].kind) {
        case SPH_OPT_I64:
        case SPH_OPT_COUNT:
            memcpy(&i, at, sizeof i);
            CHECK(i >= t[k].lo && i <= t[k].hi);
            break;
        case SPH_OPT_F64:
            memcpy(&d, at, sizeof d);
            /* SPH_OPTF_ANY rows take any number strtod reads (the library judges the value,
             * issue 26 case 16): no bounds of the table's to hold */
            if (t[k].flags & SPH_OPTF_ANY) break;
            CHECK(d >= t[k].flo && d <= t[k].fhi);
            CHECK(!(t[k].flags & SPH_OPTF_GT) || d > t[k].flo);
            break;
        case SPH_OPT_CHOICE: {
            memcpy(&c, at, sizeof c);
            int n = 0;
            while (t[k].choices[n]) n++;
            CHECK(c >= 0 && c < n);
            break;
        }
        case SPH_OPT_COUNTS:
        case SPH_OPT_F64S:
        case SPH_OPT_CHOICES: {
            sph_cli_list l;
            memcpy(&l, at, sizeof l);
            CHECK(l.n >= 1 && l.n <= SPH_CLI_LIST_MAX);
            for (int j = 0; j < l.n; j++)
                if (t[k].kind == SPH_OPT_COUNTS) CHECK(l.i[j] >= t[k].lo && l.i[j] <= t[k].hi);
                else if (t[k].kind == SPH_OPT_F64S) CHECK(l.d[j] >= t[k].flo && l.d[j] <= t[k].fhi);
            break;
        }
        default:
            break;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 4096) return 0;
    const sph_cli_opt *t = k_tables[data[0] % (sizeof k_tables / sizeof k_tables[0])];
    char *buf = malloc(size + 1);
    CHECK(buf != NULL);
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = '\0';
    char *argv[66];
    int argc = 0;
    argv[argc++] = "cmd";
    for (size_t p = 0; p < size - 1 && argc < 65;) {
        argv[argc++] = buf + p;
        p += strlen(buf + p) + 1;
    }
    argv[argc] = NULL;
    static union {
        layout_opts a;
        pack_opts b;
        spans_opts c;
        tune_opts d;
        run_opts e;
        dopts f;
        bopts g;
    } dst;
    memset(&dst, 0, sizeof dst);
    const char *pos[66];
    sph_cli_parsed p = {.pos = (data[0] & 0x80) ? pos : NULL};
    char err[512] = "";
    int rc = sph_cli_parse(t, argc, argv, &dst, &p, err, sizeof err);
    CHECK(rc == 0 || rc == 2 || rc == SPH_CLI_HELP);
    if (rc == 2) {
        CHECK(err[0] != '\0' && strchr(err, '\n') == NULL && strlen(err) < sizeof err - 1);
        int named = 0; /* a table option's name, or the start of some argument */
        for (int k = 0; t[k].name && !named; k++) named = strstr(err, t[k].name) != NULL;
        for (int i = 1; i < argc && !named; i++) {
            char head[12];
            size_t n = 0;
            /* as messages show it: up to '=' (the option's name) unless that is all of it */
            for (; argv[i][n] && n < sizeof head - 1 && (argv[i][n] != '=' || n == 0); n++)
                head[n] = (unsigned char)argv[i][n] < 0x20 || argv[i][n] == 0x7f ? '?' : argv[i][n];
            head[n] = '\0';
            named = strstr(err, n ? head : "''") != NULL;
        }
        CHECK(named);
    } else if (rc == 0) {
        check_values(t, &p, &dst);
        CHECK(p.n_pos == 0 || p.pos != NULL);
        /* the runner's choice and the runner's parse read argv the same way */
        const char *names[65];
        int n = 0, seen[64];
        for (; t[n].name && n < 64; n++) names[n] = t[n].name;
        names[n] = NULL;
        sph_cli_scan(&t, 1, argc, argv, names, seen);
        for (int k = 0; k < n; k++) CHECK(seen[k] == p.given[k]);
    }
    {
        static const char *const sel[] = {"--policy-loss", "--distill", "--tp", "--cp", "--dp", NULL};
        int seen[5];
        sph_cli_scan(k_tables, (int)(sizeof k_tables / sizeof k_tables[0]), argc, argv, sel, seen);
        for (int k = 0; k < 5; k++) CHECK(seen[k] == 0 || seen[k] == 1);
    }
    if (data[0] & 0x40) { /* the help text of the table */
        FILE *devnull = fopen("/dev/null", "w");
        if (devnull) {
            sph_cli_usage(devnull, "usage: fuzz", "about", t, SPH_CLI_EXIT_STATUS);
            fclose(devnull);
        }
    }
    free(buf);
    return 0;
}
