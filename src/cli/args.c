/*
 * args.c - option tables (see args.h).
 */
#include "args.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>

#include "msg.h"
#include "num.h"


static void *at(void *dst, const sph_cli_opt *o) { return (char *)dst + o->off; }

/* A user's value as messages show it: at most 64 characters, control characters as '?', so
 * that a message stays one line whatever argv holds. */
typedef struct shown {
    char s[72];
} shown;

static shown show(const char *v) {
    shown r;
    size_t k = 0;
    for (; v[k] && k < 64; k++) r.s[k] = (unsigned char)v[k] < 0x20 || v[k] == 0x7f ? '?' : v[k];
    if (v[k]) r.s[k++] = '.', r.s[k++] = '.', r.s[k++] = '.';
    r.s[k] = '\0';
    return r;
}

/* "f32, bf16 or f16" */
static void choice_list(const sph_cli_opt *o, char *buf, size_t n) {
    buf[0] = '\0';
    int k = 0;
    while (o->choices[k]) k++;
    for (int j = 0; j < k; j++) {
        size_t l = strlen(buf);
        snprintf(buf + l, n - l, "%s%s", j == 0 ? "" : (j == k - 1 ? " or " : ", "), o->choices[j]);
    }
}

static int choice_index(const sph_cli_opt *o, const char *s, size_t len) {
    for (int k = 0; o->choices[k]; k++)
        if (strlen(o->choices[k]) == len && !strncmp(o->choices[k], s, len)) return k;
    return -1;
}

static void range_text(const sph_cli_opt *o, char *buf, size_t n) {
    if (o->kind == SPH_OPT_F64 || o->kind == SPH_OPT_F64S) {
        if (o->fhi >= 1e300) snprintf(buf, n, "%s %g", o->flags & SPH_OPTF_GT ? ">" : ">=", o->flo);
        else snprintf(buf, n, "in %s%g, %g]", o->flags & SPH_OPTF_GT ? "(" : "[", o->flo, o->fhi);
    } else if (o->hi == INT64_MAX) {
        snprintf(buf, n, ">= %lld", (long long)o->lo);
    } else {
        snprintf(buf, n, "in [%lld, %lld]", (long long)o->lo, (long long)o->hi);
    }
}

static int f64_ok(const sph_cli_opt *o, const char *s, double *v) {
    if (o->flags & SPH_OPTF_ANY) { /* the whole string a number, whatever its value */
        char *end = NULL;
        if (!*s || isspace((unsigned char)*s)) return 0;
        errno = 0;
        *v = strtod(s, &end);
        return end != s && *end == '\0';
    }
    if (sph_cli_parse_f64(s, o->flo, o->fhi, v)) return 0;
    return !((o->flags & SPH_OPTF_GT) && *v <= o->flo);
}

/* One value into dst; 0 or 2 with err. */
static int take(const sph_cli_opt *o, const char *v, void *dst, char *err, size_t errlen) {
    char what[160];
    switch (o->kind) {
    case SPH_OPT_FLAG:
        sph_cli_err(err, errlen, "%s takes no value (got '%s')", o->name, show(v).s);
        return 2;
    case SPH_OPT_I64:
    case SPH_OPT_COUNT: {
        int64_t x;
        int bad = o->kind == SPH_OPT_I64 ? sph_cli_parse_i64(v, o->lo, o->hi, &x)
                                         : sph_cli_parse_count(v, o->lo, o->hi, &x);
        if (bad) {
            range_text(o, what, sizeof what);
            sph_cli_err(err, errlen, "%s '%s': expected %s %s", o->name, show(v).s,
                        o->kind == SPH_OPT_I64 ? "an integer" : "a count (like 4096 or 16K)", what);
            return 2;
        }
        *(int64_t *)at(dst, o) = x;
        return 0;
    }
    case SPH_OPT_F64: {
        double x;
        if (!f64_ok(o, v, &x) && (o->flags & SPH_OPTF_ANY)) {
            sph_cli_err(err, errlen, "%s '%s': expected a number", o->name, show(v).s);
            return 2;
        }
        if (!f64_ok(o, v, &x)) {
            range_text(o, what, sizeof what);
            sph_cli_err(err, errlen, "%s '%s': expected a finite number %s", o->name, show(v).s,
                        what);
            return 2;
        }
        *(double *)at(dst, o) = x;
        return 0;
    }
    case SPH_OPT_STR:
        if (!*v) {
            sph_cli_err(err, errlen, "%s '': expected a value", o->name);
            return 2;
        }
        *(const char **)at(dst, o) = v;
        return 0;
    case SPH_OPT_CHOICE: {
        int k = choice_index(o, v, strlen(v));
        if (k < 0) {
            choice_list(o, what, sizeof what);
            sph_cli_err(err, errlen, "%s '%s': expected %s", o->name, show(v).s, what);
            return 2;
        }
        *(int *)at(dst, o) = k;
        return 0;
    }
    case SPH_OPT_COUNTS:
    case SPH_OPT_F64S:
    case SPH_OPT_CHOICES: {
        sph_cli_list l;
        memset(&l, 0, sizeof l);
        const char *p = v;
        for (;;) {
            const char *e = strchr(p, ',');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            char tok[64];
            int ok = len > 0 && len < sizeof tok && l.n < SPH_CLI_LIST_MAX;
            if (ok) {
                memcpy(tok, p, len);
                tok[len] = '\0';
                if (o->kind == SPH_OPT_COUNTS) {
                    ok = !sph_cli_parse_count(tok, o->lo, o->hi, &l.i[l.n]);
                } else if (o->kind == SPH_OPT_F64S) {
                    ok = f64_ok(o, tok, &l.d[l.n]);
                } else {
                    int k = choice_index(o, tok, len);
                    ok = k >= 0;
                    for (int j = 0; ok && j < l.n; j++)
                        if (l.i[j] == k) {
                            sph_cli_err(err, errlen, "%s '%s': %s given twice", o->name,
                                        show(v).s, tok);
                            return 2;
                        }
                    l.i[l.n] = k;
                }
            }
            if (!ok) {
                if (o->kind == SPH_OPT_CHOICES) {
                    choice_list(o, what, sizeof what);
                    sph_cli_err(err, errlen, "%s '%s': expected up to %d of %s, comma-separated",
                                o->name, show(v).s, SPH_CLI_LIST_MAX, what);
                } else {
                    range_text(o, what, sizeof what);
                    sph_cli_err(err, errlen, "%s '%s': expected up to %d comma-separated %s %s",
                                o->name, show(v).s, SPH_CLI_LIST_MAX,
                                o->kind == SPH_OPT_COUNTS ? "counts (like 16K)" : "numbers", what);
                }
                return 2;
            }
            l.n++;
            if (!e) break;
            p = e + 1;
        }
        *(sph_cli_list *)at(dst, o) = l;
        return 0;
    }
    }
    sph_cli_err(err, errlen, "%s: unknown option kind", o->name);
    return 2;
}

/* The walk over argv that sph_cli_parse and sph_cli_scan share: "-" (stdin) and negative
 * numbers ("-3") are positional, "--" ends the options, "--name=value" carries its value. */
static int positional(const char *a) {
    return a[0] != '-' || a[1] == '\0' || (a[1] >= '0' && a[1] <= '9');
}

/* The row of table named by the option a ("--name" or "--name=value"), or the end row. */
static const sph_cli_opt *row_of(const sph_cli_opt *table, const char *a, size_t *nl) {
    const char *eq = strchr(a, '=');
    *nl = eq ? (size_t)(eq - a) : strlen(a);
    int k = 0;
    for (; table[k].name; k++)
        if (strlen(table[k].name) == *nl && !strncmp(table[k].name, a, *nl)) break;
    return &table[k];
}

void sph_cli_scan(const sph_cli_opt *const *tables, int n_tables, int argc, char **argv,
                  const char *const *names, int *given) {
    for (int k = 0; names[k]; k++) given[k] = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) break;
        if (positional(a)) continue;
        size_t nl = 0;
        const sph_cli_opt *o = NULL;
        for (int t = 0; t < n_tables && !(o && o->name); t++) o = row_of(tables[t], a, &nl);
        if (!o) continue;
        for (int k = 0; names[k]; k++)
            if (strlen(names[k]) == nl && !strncmp(names[k], a, nl)) given[k] = 1;
        if (o->name && o->kind != SPH_OPT_FLAG && !strchr(a, '=')) i++; /* its value */
    }
}

int sph_cli_parse(const sph_cli_opt *table, int argc, char **argv, void *dst,
                  sph_cli_parsed *out, char *err, size_t errlen) {
    const char **pos = out->pos;
    memset(out, 0, sizeof *out);
    out->pos = pos;
    if (err && errlen) err[0] = '\0';
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return SPH_CLI_HELP;
        else if (!strcmp(argv[i], "--")) break;
    int options_done = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!options_done && !strcmp(a, "--")) {
            options_done = 1;
            continue;
        }
        if (options_done || positional(a)) {
            if (!pos) {
                sph_cli_err(err, errlen, "unexpected argument '%s' (see --help)", show(a).s);
                return 2;
            }
            pos[out->n_pos++] = a;
            continue;
        }
        const char *eq = strchr(a, '=');
        size_t nl;
        const sph_cli_opt *o = row_of(table, a, &nl);
        const int k = (int)(o - table);
        if (!o->name) {
            char name[80];
            snprintf(name, sizeof name, "%.*s", (int)(nl < 64 ? nl : 64), a);
            sph_cli_err(err, errlen, "unknown option '%s' (see --help)", show(name).s);
            return 2;
        }
        if (k < 64) out->given[k] = 1;
        if (o->kind == SPH_OPT_FLAG) {
            if (eq) return take(o, eq + 1, dst, err, errlen);
            *(int *)at(dst, o) = 1;
            continue;
        }
        const char *v;
        if (eq) {
            v = eq + 1;
        } else if (i + 1 < argc) {
            v = argv[++i];
        } else {
            sph_cli_err(err, errlen, "%s needs a value (see --help)", o->name);
            return 2;
        }
        int rc = take(o, v, dst, err, errlen);
        if (rc) return rc;
    }
    return 0;
}

int sph_cli_given(const sph_cli_opt *table, const sph_cli_parsed *p, const char *name) {
    for (int k = 0; table[k].name && k < 64; k++)
        if (!strcmp(table[k].name, name)) return p->given[k];
    return 0;
}

void sph_cli_usage(FILE *f, const char *synopsis, const char *description,
                   const sph_cli_opt *table, const char *exit_status) {
    enum { COL = 26 };
    fprintf(f, "%s\n", synopsis);
    if (description) fprintf(f, "\n%s\n", description);
    if (table && table[0].name) fputc('\n', f);
    for (int k = 0; table && table[k].name; k++) {
        const sph_cli_opt *o = &table[k];
        char left[96];
        int n = snprintf(left, sizeof left, "  %s%s%s", o->name, o->meta ? " " : "",
                         o->meta ? o->meta : "");
        const char *h = o->help ? o->help : "";
        if (n >= COL - 1) fprintf(f, "%s\n%*s", left, COL, "");
        else fprintf(f, "%-*s", COL, left);
        for (const char *p = h; *p;) {
            const char *e = strchr(p, '\n');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            fprintf(f, "%.*s\n", (int)len, p);
            if (!e) break;
            p = e + 1;
            if (*p) fprintf(f, "%*s", COL, "");
        }
        if (!*h) fputc('\n', f);
    }
    if (exit_status) fprintf(f, "\n%s\n", exit_status);
}

/* args.h: a command's parse, printing its help or usage error itself. */
int sph_cli_parse_or_exit(const char *cmd, const char *synopsis, const char *description,
                          const sph_cli_opt *table, int argc, char **argv, void *dst,
                          sph_cli_parsed *parsed, int *done) {
    char err[512];
    *done = 1;
    int rc = sph_cli_parse(table, argc, argv, dst, parsed, err, sizeof err);
    if (rc == SPH_CLI_HELP) {
        sph_cli_usage(stdout, synopsis, description, table, SPH_CLI_EXIT_STATUS);
        return 0;
    }
    if (rc) return sph_cli_fail(cmd, 2, "%s", err);
    *done = 0;
    return 0;
}

int sph_cli_parse_file_cmd(const char *cmd, const char *synopsis, const char *description,
                           const sph_cli_opt *table, int argc, char **argv, void *dst,
                           const char **path, int *done) {
    const char **pos = malloc(sizeof(char *) * (size_t)(argc + 1));
    *done = 1;
    if (!pos) return sph_cli_fail(cmd, 1, "out of memory");
    sph_cli_parsed p = {.pos = pos};
    int rc = sph_cli_parse_or_exit(cmd, synopsis, description, table, argc, argv, dst, &p, done);
    if (!*done) {
        *done = 1;
        if (p.n_pos == 0)
            rc = sph_cli_fail(cmd, 2, "expected a FILE or - for standard input (see --help)");
        else if (p.n_pos > 1)
            rc = sph_cli_fail(cmd, 2, "extra argument '%s': expected one FILE or -", pos[1]);
        else
            *path = pos[0], *done = 0;
    }
    free(pos);
    return rc;
}
