/*
 * args.h - the CLI's option tables. Each subcommand describes its options as a static table
 * of sph_cli_opt (name, value placeholder, kind, destination offset in the command's options
 * struct, bounds, help text); sph_cli_parse fills the struct from argv and sph_cli_usage
 * prints the help from the same table, so adding an option is adding one row. Values are
 * taken as "--name VALUE" or "--name=VALUE"; every malformed value is a usage error whose
 * message names the option and the value. Nothing here prints or exits.
 */
#ifndef SPH_CLI_ARGS_H
#define SPH_CLI_ARGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum sph_cli_kind {
    SPH_OPT_FLAG,    /* int, set to 1; takes no value */
    SPH_OPT_I64,     /* int64_t in [lo, hi] */
    SPH_OPT_COUNT,   /* int64_t in [lo, hi], K (x1024) or M suffix allowed: 16K */
    SPH_OPT_F64,     /* double in [flo, fhi] (flo excluded with SPH_OPTF_GT) */
    SPH_OPT_STR,     /* const char * (the argv string) */
    SPH_OPT_CHOICE,  /* int: index into choices */
    SPH_OPT_COUNTS,  /* sph_cli_list: comma-separated counts in [lo, hi] */
    SPH_OPT_F64S,    /* sph_cli_list: comma-separated numbers in [flo, fhi] */
    SPH_OPT_CHOICES, /* sph_cli_list: comma-separated distinct choices (indices in .i) */
} sph_cli_kind;

#define SPH_OPTF_GT 1u  /* SPH_OPT_F64(S): the lower bound itself is excluded */
#define SPH_OPTF_ANY 2u /* SPH_OPT_F64: any number strtod reads (inf and nan too), no bounds:
                           a value the library judges (opt_probe.c), not the parser */

#define SPH_CLI_LIST_MAX 16

typedef struct sph_cli_list {
    int n;
    int64_t i[SPH_CLI_LIST_MAX];
    double d[SPH_CLI_LIST_MAX];
} sph_cli_list;

typedef struct sph_cli_opt {
    const char *name;            /* "--tp"; NULL ends a table */
    const char *meta;            /* value placeholder in the help ("T"); NULL for flags */
    sph_cli_kind kind;
    size_t off;                  /* offsetof(options struct, field) */
    int64_t lo, hi;              /* integer bounds */
    double flo, fhi;             /* number bounds */
    const char *const *choices;  /* NULL-terminated, for CHOICE(S) */
    unsigned flags;
    const char *help;            /* lines separated by '\n' */
} sph_cli_opt;

/* offsetof(T, f) where T's field f has type type, else a compile error (a negative array
 * size): a row shared by several tables cannot write a value of another type into one of
 * their options structs. */
#define SPH_CLI_OFF(T, f, type) \
    (offsetof(T, f) + 0 * sizeof(char[_Generic(((T *)0)->f, type: 1, default: -1)]))

/* The row that ends a table. */
#define SPH_CLI_OPT_END {.name = NULL}

/* Result of sph_cli_parse beyond the options struct. */
typedef struct sph_cli_parsed {
    unsigned char given[64]; /* given[k]: table row k appeared (rows past 64 are not tracked) */
    int n_pos;               /* positional arguments, in order */
    const char **pos;        /* caller's array of at least argc entries, or NULL: then a
                                positional argument is a usage error */
} sph_cli_parsed;

#define SPH_CLI_HELP (-1)

/* Parses argv[1 .. argc) (argv[0] is the subcommand) into dst. Returns 0, SPH_CLI_HELP for
 * -h/--help (anywhere), or 2 with a one-line message in err. "--" ends the options. */
int sph_cli_parse(const sph_cli_opt *table, int argc, char **argv, void *dst,
                  sph_cli_parsed *out, char *err, size_t errlen);
/* Walks argv[1 .. argc) as sph_cli_parse does (the same "--", "=" and positional rules) and
 * sets given[k] to 1 for each names[k] (a NULL-terminated list) that appears as an option.
 * Each option's arity comes from the first of tables[0 .. n_tables) that has it (one that
 * none has is taken as a flag), so a value is never taken for an option: the choice of a
 * runner before the runner's own parse. Validates nothing. */
void sph_cli_scan(const sph_cli_opt *const *tables, int n_tables, int argc, char **argv,
                  const char *const *names, int *given);
/* Whether the option called name was given (name must be in the table). */
int sph_cli_given(const sph_cli_opt *table, const sph_cli_parsed *p, const char *name);
/* Prints usage: synopsis, description (may be NULL), the table's rows, the exit status line. */
void sph_cli_usage(FILE *f, const char *synopsis, const char *description,
                   const sph_cli_opt *table, const char *exit_status);

/* The exit-status line of every command. */
#define SPH_CLI_EXIT_STATUS "Exit status: 0 ok, 1 bad input data or runtime failure, 2 usage error."

/* Parses a command's table (sph_cli_parse), printing the help or the usage error itself:
 * returns 0 to go on, else the exit code (0 after --help, 2 on a usage error) with *done set. */
int sph_cli_parse_or_exit(const char *cmd, const char *synopsis, const char *description,
                          const sph_cli_opt *table, int argc, char **argv, void *dst,
                          sph_cli_parsed *parsed, int *done);

/* The same for a command that takes exactly one FILE (or - for stdin): *path receives it; a
 * missing or second file is a usage error. */
int sph_cli_parse_file_cmd(const char *cmd, const char *synopsis, const char *description,
                           const sph_cli_opt *table, int argc, char **argv, void *dst,
                           const char **path, int *done);

#endif
