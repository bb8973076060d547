/*
 * dist_agree.c - step 0 of every distributed CLI path (the head runner run_dist_main.c and the
 * policy runner run_policy_dist.c): before any work, all ranks agree on which path they run
 * and on every argument, in one all-gather that every path enters first, so no pair of ranks
 * can wait in different collectives whatever each was given.
 *
 * Each rank sends a fixed-size verdict: its path, its parse status (0, a usage error 2 / a
 * data error 1 with its message, or --help), its arguments as text for the messages, and one
 * hash per option of the union of the paths' option tables, over the parsed value (so
 * `--clip-low=0.2` and `--clip-low 0.20` agree; --inputs and --outputs are compared as given).
 * Every rank then judges the same gathered verdicts the same way and prints the same line:
 *   - a different path ("--policy-loss" on some ranks only), --help on some ranks only, or a
 *     different value of any option: "ranks were given different arguments: rank 0 '...',
 *     rank R '...' (--clip-low differs; every rank needs the same)", usage exit code 2;
 *   - else a rank's own error: "rank R '...': <its message>" with its exit code;
 *   - --help on every rank: the caller prints the usage once.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run_dist.h"
#include "run_distill.h"
#include "run_policy.h"

#ifdef SPH_HAVE_MPI
#include <mpi.h>

#define AGREE_SLOTS 64

typedef struct verdict {
    int32_t rc;   /* 0 ok, 1 or 2 an error (msg), SPH_CLI_HELP */
    int32_t path; /* SPH_CLI_PATH_* */
    uint64_t field[AGREE_SLOTS];
    char args[160];
    char msg[480];
} verdict;

/* The union of the paths' option names, in one order on every rank (the same binary). */
static int slot_names(const char **names) {
    const sph_cli_opt *tables[3] = {sph_cli_dist_opts, sph_cli_policy_opts,
                                    sph_cli_distill_opts};
    int n = 0;
    for (int t = 0; t < 3; t++)
        for (const sph_cli_opt *o = tables[t]; o->name; o++) {
            int k = 0;
            while (k < n && strcmp(names[k], o->name)) k++;
            if (k == n && n < AGREE_SLOTS) names[n++] = o->name;
        }
    return n;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t k = 0; k < n; k++) h = (h ^ c[k]) * 1099511628211ull;
    return h;
}

/* The parsed value of one option as a hash (never 0: 0 marks "not an option of this path"). */
static uint64_t value_hash(const sph_cli_opt *o, const void *opts) {
    const char *at = (const char *)opts + o->off;
    uint64_t h = fnv(1469598103934665603ull, &o->kind, sizeof o->kind);
    switch (o->kind) {
    case SPH_OPT_FLAG:
    case SPH_OPT_CHOICE: h = fnv(h, at, sizeof(int)); break;
    case SPH_OPT_I64:
    case SPH_OPT_COUNT: h = fnv(h, at, sizeof(int64_t)); break;
    case SPH_OPT_F64: {
        double v = *(const double *)at;
        if (v == 0) v = 0; /* -0 == 0 */
        h = fnv(h, &v, sizeof v);
        break;
    }
    case SPH_OPT_STR: {
        const char *s = *(const char *const *)at;
        h = s ? fnv(h, s, strlen(s) + 1) : fnv(h, "\xff", 1);
        break;
    }
    default: { /* lists: the count and the used entries */
        const sph_cli_list *l = (const sph_cli_list *)at;
        h = fnv(h, &l->n, sizeof l->n);
        h = fnv(h, l->i, sizeof(int64_t) * (size_t)l->n);
        h = fnv(h, l->d, sizeof(double) * (size_t)l->n);
    }
    }
    return h ? h : 1;
}

static const char *path_name(int path) {
    return path == SPH_CLI_PATH_POLICY    ? "the policy loss (--policy-loss)"
           : path == SPH_CLI_PATH_DISTILL ? "the distillation loss (--distill)"
                                          : "the head run";
}

int sph_cli_dist_agree(int path, const sph_cli_opt *table, const void *opts, int rc,
                       const char *msg, const char *hint, int argc, char **argv) {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    static verdict mine; /* static: a verdict is 1 KiB, the gathered ones size times that */
    memset(&mine, 0, sizeof mine);
    mine.rc = rc, mine.path = path;
    if (msg) snprintf(mine.msg, sizeof mine.msg, "%s", msg);
    const char *names[AGREE_SLOTS];
    const int n_slots = slot_names(names);
    if (rc == 0)
        for (const sph_cli_opt *o = table; o->name; o++)
            for (int k = 0; k < n_slots; k++)
                if (!strcmp(names[k], o->name)) mine.field[k] = value_hash(o, opts);
    for (int i = 1, n = 0; i < argc && n + 4 < (int)sizeof mine.args; i++) {
        int w = snprintf(mine.args + n, sizeof mine.args - (size_t)n, "%s%s", i > 1 ? " " : "",
                         argv[i]);
        if (w < 0 || n + w >= (int)sizeof mine.args - 4) {
            snprintf(mine.args + n, sizeof mine.args - (size_t)n, " ...");
            break;
        }
        n += w;
    }
    verdict *all = calloc((size_t)size, sizeof *all);
    /* the one collective every path enters first; a rank that could not allocate the
     * gathered verdicts still takes part (MPI_IN_PLACE is not needed: its own counts) */
    int ok = all != NULL, ok_all = 0;
    MPI_Allreduce(&ok, &ok_all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!ok_all) {
        free(all);
        fprintf(stderr, "spanhead run [rank %d]: out of memory for the ranks' agreement\n", rank);
        return 1;
    }
    MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE,
                  MPI_COMM_WORLD);
    int all_help = 1, out = -1, culprit = -1;
    char diff[200] = "", line[1200] = "";
    for (int r = 0; r < size; r++) all_help &= all[r].rc == SPH_CLI_HELP;
    for (int r = 1; r < size && !all_help && culprit < 0; r++) {
        const verdict *a = &all[0], *b = &all[r];
        if (a->path != b->path) {
            snprintf(diff, sizeof diff, "--policy-loss differs: rank 0 runs %s, rank %d %s",
                     path_name(a->path), r, path_name(b->path));
        } else if ((a->rc == SPH_CLI_HELP) != (b->rc == SPH_CLI_HELP)) {
            snprintf(diff, sizeof diff, "--help differs");
        } else if (a->rc == 0 && b->rc == 0) {
            size_t l = 0;
            int nd = 0;
            for (int k = 0; k < n_slots; k++) {
                if (a->field[k] == b->field[k]) continue;
                if (nd < 4)
                    l += (size_t)snprintf(diff + l, sizeof diff - l, "%s%s", nd ? ", " : "",
                                          names[k]);
                nd++;
            }
            if (nd > 4) snprintf(diff + l, sizeof diff - l, " and %d more", nd - 4);
            if (nd) snprintf(diff + strlen(diff), sizeof diff - strlen(diff), " %s",
                             nd > 1 ? "differ" : "differs");
        }
        if (diff[0]) {
            culprit = r;
            snprintf(line, sizeof line, "ranks were given different arguments: rank 0 '%s', "
                     "rank %d '%s' (%s; every rank needs the same)", a->args, r, b->args, diff);
            out = 2;
        }
    }
    for (int r = 0; r < size && out < 0 && !all_help; r++)
        if (all[r].rc == 1 || all[r].rc == 2) {
            snprintf(line, sizeof line, "rank %d '%s': %s%s", r, all[r].args, all[r].msg,
                     all[r].rc == 2 && hint ? hint : "");
            out = all[r].rc;
        }
    free(all);
    if (all_help) return SPH_CLI_HELP;
    if (out < 0) return 0;
    fflush(stdout);
    fprintf(stderr, "spanhead run [rank %d]: %s\n", rank, line);
    return out;
}

#else
typedef int sph_cli_dist_agree_needs_mpi; /* no MPI: nothing here (ISO C: not an empty file) */
#endif /* SPH_HAVE_MPI */
